//! A proxy-wasm probe without the SDK: it exports the ABI 0.2.1 callbacks
//! itself and logs each one with its raw arguments (`abi <event> ctx=..`), so
//! a host's context ids, tokens, statuses and callback order can be compared
//! line by line between real Envoy and host-test. Each request names a case in
//! `x-abi`:
//!
//! - `grpc-call`, `grpc-stream`, `http-call`: a callout (cluster, service,
//!   method, message, timeout, metadata from `x-*` headers); the stream waits
//!   (or, with `x-then: continue`, goes on to the upstream) and is answered
//!   with what came back if it is still alive.
//! - `local`: `proxy_send_local_response` with `x-status`, `x-body`,
//!   `x-details`, `x-grpc-status` and `x-reply-headers`.
//! - `headers`: edits of the request header map (`x-ops`), answered with the
//!   map as the host then holds it, in order.
//! - `props`: properties named in `x-props` (`/`-separated segments).
//! - `trap`: an unreachable instruction.
//!
//! The root context logs `vm_start`, `configure` and `tick` with its context
//! id, so how many VMs start, configure and tick shows in the log.

use std::cell::RefCell;
use std::collections::HashMap;

#[path = "../../common/abi.rs"]
mod abi;
#[path = "../../common/exports.rs"]
mod exports;
mod host;

use host::*;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    Http,
    Grpc,
}

struct Stream {
    case: String,
    /// The callout's events so far (the answer sent to the client).
    events: Vec<String>,
    alive: bool,
    waiting: bool,
}

#[derive(Default)]
struct State {
    streams: HashMap<u32, Stream>,
    /// Callout token -> the stream that dispatched it.
    owners: HashMap<(Kind, u32), u32>,
    /// gRPC tokens of streams (the others are unary calls).
    grpc_streams: Vec<u32>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .filter_map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn show_pairs(pairs: &[(String, String)]) -> String {
    let items: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("[{}]", items.join(","))
}

fn req(name: &str) -> Option<String> {
    header(MAP_REQUEST_HEADERS, name).1
}

/// `k=v;k2=v2` -> pairs.
fn parse_pairs(text: &str) -> Vec<(String, String)> {
    text.split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(ctx: u32, parent: u32) {
    if parent == 0 {
        log(&format!("abi create_root ctx={ctx}"));
        return;
    }
    with(|s| {
        s.streams.insert(
            ctx,
            Stream {
                case: String::new(),
                events: Vec::new(),
                alive: true,
                waiting: false,
            },
        )
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(ctx: u32, size: u32) -> u32 {
    log(&format!("abi vm_start ctx={ctx} vm_config_size={size}"));
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(ctx: u32, size: u32) -> u32 {
    let (status, config) = buffer(BUF_PLUGIN_CONFIG, size as usize);
    let config = String::from_utf8_lossy(&config).into_owned();
    log(&format!(
        "abi configure ctx={ctx} status={status} config={config}"
    ));
    if let Some(ms) = config
        .split("tick_ms=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
    {
        set_tick_period(ms);
    }
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(ctx: u32) {
    log(&format!("abi tick ctx={ctx}"));
}

#[no_mangle]
pub extern "C" fn proxy_on_done(ctx: u32) -> u32 {
    if with(|s| s.streams.get(&ctx).is_some_and(|st| !st.case.is_empty())) {
        log(&format!("abi stream_done ctx={ctx}"));
    } else if !with(|s| s.streams.contains_key(&ctx)) {
        log(&format!("abi root_done ctx={ctx}"));
    }
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(ctx: u32) {
    if with(|s| s.streams.get(&ctx).is_some_and(|st| !st.case.is_empty())) {
        log(&format!("abi stream_log ctx={ctx}"));
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(ctx: u32) {
    let verbose = with(|s| match s.streams.get_mut(&ctx) {
        Some(st) => {
            st.alive = false;
            Some(!st.case.is_empty())
        }
        None => None,
    });
    match verbose {
        Some(true) => log(&format!("abi stream_delete ctx={ctx}")),
        Some(false) => {}
        None => log(&format!("abi root_delete ctx={ctx}")),
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(ctx: u32, _n: u32, _eos: u32) -> u32 {
    let case = req("x-abi").unwrap_or_default();
    with(|s| {
        if let Some(st) = s.streams.get_mut(&ctx) {
            st.case = case.clone();
        }
    });
    match case.as_str() {
        "" => 0,
        "grpc-call" => grpc_call_case(ctx),
        "grpc-stream" => grpc_stream_case(ctx),
        "http-call" => http_call_case(ctx),
        "local" => local_case(),
        "headers" => headers_case(),
        "props" => props_case(),
        "trap" => {
            log("abi trapping");
            std::process::abort()
        }
        other => {
            reply(400, &format!("unknown case {other}\n"));
            1
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_ctx: u32, _size: u32, _eos: u32) -> u32 {
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(ctx: u32, n: u32, eos: u32) -> u32 {
    if with(|s| s.streams.get(&ctx).is_some_and(|st| !st.case.is_empty())) {
        let (_, p) = pairs(MAP_RESPONSE_HEADERS);
        log(&format!(
            "abi response_headers ctx={ctx} n={n} eos={eos} {}",
            show_pairs(&p)
        ));
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(ctx: u32, size: u32, eos: u32) -> u32 {
    if with(|s| s.streams.get(&ctx).is_some_and(|st| !st.case.is_empty())) {
        log(&format!(
            "abi response_body ctx={ctx} size={size} eos={eos}"
        ));
    }
    0
}

/// A local reply with a plain-text body (what the probe found).
fn reply(status: u32, body: &str) {
    let headers = vec![("content-type".to_string(), "text/plain".to_string())];
    let r = local_response(status, "", body.as_bytes(), &headers, -1);
    if r != 0 {
        log(&format!("abi local_response_failed status={r}"));
    }
}

fn timeout() -> u32 {
    req("x-timeout-ms")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1000)
}

/// The `service` argument of the gRPC calls: the cluster name (as the Rust
/// SDK passes it), or with `x-service-proto: 1` a serialized `GrpcService`
/// whose `envoy_grpc.cluster_name` is the cluster.
fn grpc_service(cluster: &str) -> Vec<u8> {
    if req("x-service-proto").is_some() {
        let mut inner = vec![0x0a, cluster.len() as u8];
        inner.extend_from_slice(cluster.as_bytes());
        let mut outer = vec![0x0a, inner.len() as u8];
        outer.extend_from_slice(&inner);
        outer
    } else {
        cluster.as_bytes().to_vec()
    }
}

fn message() -> Vec<u8> {
    match req("x-message-hex") {
        Some(h) => unhex(&h),
        None => req("x-message").unwrap_or_default().into_bytes(),
    }
}

fn own(ctx: u32, kind: Kind, token: u32) {
    with(|s| {
        s.owners.insert((kind, token), ctx);
        if let Some(st) = s.streams.get_mut(&ctx) {
            st.waiting = true;
        }
    });
}

/// Pause while the callout runs, or (`x-then: continue`) let the request go on.
fn then() -> u32 {
    if req("x-then").as_deref() == Some("continue") {
        0
    } else {
        1
    }
}

fn grpc_call_case(ctx: u32) -> u32 {
    let cluster = req("x-cluster").unwrap_or_default();
    let service = req("x-service").unwrap_or_else(|| "probe.Echo".into());
    let method = req("x-method").unwrap_or_else(|| "Unary".into());
    let meta = parse_pairs(&req("x-meta").unwrap_or_default());
    let call = grpc_call(
        &grpc_service(&cluster),
        &service,
        &method,
        &meta,
        &message(),
        timeout(),
    );
    if dispatched(ctx, "grpc_call", Kind::Grpc, call).is_none() {
        return 1;
    }
    then()
}

/// Logs a call or stream just dispatched (`abi <what> ctx= status= token=`)
/// and owns its token; one the host refused answers `dispatch=<status>`.
fn dispatched(ctx: u32, what: &str, kind: Kind, (status, token): (u32, u32)) -> Option<u32> {
    log(&format!(
        "abi {what} ctx={ctx} status={status} token={token}"
    ));
    if status != 0 {
        reply(200, &format!("dispatch={status}\n"));
        return None;
    }
    own(ctx, kind, token);
    Some(token)
}

fn grpc_stream_case(ctx: u32) -> u32 {
    let cluster = req("x-cluster").unwrap_or_default();
    let service = req("x-service").unwrap_or_else(|| "probe.Echo".into());
    let method = req("x-method").unwrap_or_else(|| "Stream".into());
    let meta = parse_pairs(&req("x-meta").unwrap_or_default());
    let Some(token) = dispatched(
        ctx,
        "grpc_stream",
        Kind::Grpc,
        grpc_stream(&grpc_service(&cluster), &service, &method, &meta),
    ) else {
        return 1;
    };
    with(|s| s.grpc_streams.push(token));
    let messages = req("x-messages").unwrap_or_default();
    for m in messages.split(',').filter(|m| !m.is_empty()) {
        let s = grpc_send(token, m.as_bytes(), false);
        log(&format!("abi grpc_send token={token} status={s}"));
    }
    match req("x-end").as_deref() {
        Some("close") => log(&format!(
            "abi grpc_close token={token} status={}",
            grpc_close(token)
        )),
        Some("cancel") => {
            log(&format!(
                "abi grpc_cancel token={token} status={}",
                grpc_cancel(token)
            ));
            log(&format!(
                "abi grpc_cancel_again token={token} status={}",
                grpc_cancel(token)
            ));
            reply(200, "cancelled\n");
        }
        Some("send-end") => log(&format!(
            "abi grpc_send_end token={token} status={}",
            grpc_send(token, b"last", true)
        )),
        _ => {}
    }
    1
}

fn http_call_case(ctx: u32) -> u32 {
    let cluster = req("x-cluster").unwrap_or_default();
    let path = req("x-path").unwrap_or_else(|| "/callout".into());
    let mut headers = vec![
        (":method".to_string(), "POST".to_string()),
        (":path".to_string(), path),
        (":authority".to_string(), "probe.local".to_string()),
    ];
    headers.extend(parse_pairs(&req("x-meta").unwrap_or_default()));
    let body = req("x-body").unwrap_or_default();
    let call = http_call(&cluster, &headers, body.as_bytes(), timeout());
    if dispatched(ctx, "http_call", Kind::Http, call).is_none() {
        return 1;
    }
    then()
}

fn local_case() -> u32 {
    let status = req("x-status").and_then(|s| s.parse().ok()).unwrap_or(403);
    let grpc = req("x-grpc-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1);
    let body = req("x-body").unwrap_or_default();
    let details = req("x-details").unwrap_or_default();
    let headers = parse_pairs(&req("x-reply-headers").unwrap_or_default());
    let r = local_response(status, &details, body.as_bytes(), &headers, grpc);
    log(&format!("abi local_response status={r}"));
    1
}

/// `x-ops`: `replace NAME VALUE; add NAME VALUE; remove NAME`, applied to the
/// request headers in order; the answer lists the map afterwards.
fn headers_case() -> u32 {
    let ops = req("x-ops").unwrap_or_default();
    let mut out = String::new();
    for op in ops.split(';').map(str::trim).filter(|o| !o.is_empty()) {
        let parts: Vec<&str> = op.splitn(3, ' ').collect();
        let status = match parts.as_slice() {
            ["replace", k, v] => replace(MAP_REQUEST_HEADERS, k, v),
            ["add", k, v] => add(MAP_REQUEST_HEADERS, k, v),
            ["remove", k] => remove(MAP_REQUEST_HEADERS, k),
            _ => 99,
        };
        out.push_str(&format!("op {op} -> {status}\n"));
    }
    for (k, v) in pairs(MAP_REQUEST_HEADERS).1 {
        out.push_str(&format!("{k}: {v}\n"));
    }
    reply(200, &out);
    1
}

fn props_case() -> u32 {
    let mut out = String::new();
    for path in req("x-props").unwrap_or_default().split(',') {
        let path = path.trim();
        if path.is_empty() {
            continue;
        }
        let segments: Vec<&str> = path.split('/').collect();
        let (status, value) = property(&segments);
        out.push_str(&format!("{path} status={status} hex={}\n", hex(&value)));
    }
    reply(200, &out);
    1
}

/// A callout event: logged with the context it was delivered to; recorded
/// for the stream that dispatched the call; the stream is answered when the
/// call is over and the stream still lives.
fn callout_event(ctx: u32, kind: Kind, token: u32, event: String, over: bool) {
    let owner = with(|s| s.owners.get(&(kind, token)).copied());
    let alive = owner.is_some_and(|o| with(|s| s.streams.get(&o).is_some_and(|st| st.alive)));
    log(&format!(
        "abi {event} ctx={ctx} token={token} owner={} owner_alive={alive}",
        owner.map_or("-".to_string(), |o| o.to_string())
    ));
    let Some(owner) = owner else { return };
    let body = with(|s| {
        let st = s.streams.get_mut(&owner)?;
        st.events.push(event);
        if over && st.alive && st.waiting {
            st.waiting = false;
            Some(st.events.join("\n") + "\n")
        } else {
            None
        }
    });
    if over {
        with(|s| s.owners.remove(&(kind, token)));
    }
    if let Some(body) = body {
        if set_effective_context(owner) == 0 {
            reply(200, &body);
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(ctx: u32, token: u32, nh: u32, nb: u32, nt: u32) {
    let (_, headers) = pairs(MAP_CALL_HEADERS);
    let (_, body) = buffer(BUF_CALL_BODY, nb as usize);
    let mut event = format!(
        "http_call_response headers={nh} body={nb} trailers={nt} status={} body_text={}",
        headers
            .iter()
            .find(|(k, _)| k == ":status")
            .map_or("-", |(_, v)| v.as_str()),
        String::from_utf8_lossy(&body)
            .replace('\n', "\\n")
            .replace('\r', "\\r")
    );
    if nh == 0 {
        let (s, code, msg) = status();
        event.push_str(&format!(" get_status={s}/{code}/{msg}"));
    }
    callout_event(ctx, Kind::Http, token, event, true);
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_initial_metadata(ctx: u32, token: u32, n: u32) {
    grpc_metadata(ctx, token, n, MAP_GRPC_INITIAL, "initial");
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive(ctx: u32, token: u32, size: u32) {
    let (s, message) = buffer(BUF_GRPC_RECEIVE, size as usize);
    let event = format!(
        "grpc_receive size={size} buffer_status={s} message={}",
        hex(&message)
    );
    // A unary call is over with its message (Envoy sends no close for it).
    let unary = !with(|s| s.grpc_streams.contains(&token));
    callout_event(ctx, Kind::Grpc, token, event, unary);
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_trailing_metadata(ctx: u32, token: u32, n: u32) {
    grpc_metadata(ctx, token, n, MAP_GRPC_TRAILING, "trailing");
}

/// Initial or trailing gRPC metadata: the count and the map's pairs.
fn grpc_metadata(ctx: u32, token: u32, n: u32, map: u32, which: &str) {
    let (_, p) = pairs(map);
    let event = format!("grpc_{which}_metadata n={n} {}", show_pairs(&p));
    callout_event(ctx, Kind::Grpc, token, event, false);
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(ctx: u32, token: u32, status_code: u32) {
    let (s, code, msg) = status();
    let event = format!("grpc_close status={status_code} get_status={s}/{code}/{msg}");
    callout_event(ctx, Kind::Grpc, token, event, true);
}
