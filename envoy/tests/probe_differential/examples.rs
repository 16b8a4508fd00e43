//! host-test's acceptance suite: the seven example filters of
//! `host-test/examples/` (our own, doing what the proxy-wasm Rust SDK's
//! examples do, built against the registry's `proxy-wasm` 0.2.5 as a third
//! party's filter is) run the same cases in real Envoy 1.40 and in host-test.
//! What the client gets (status, headers in order, body, a reset), what the
//! upstream and the callout servers get, and the lines the filter logs (with
//! Envoy's own line about a trap), level included, must agree. hello_world
//! runs as the SDK ships it, a bootstrap singleton service, and once more as
//! an HTTP filter: its VMs' starts and its ticks, in order and by thread.

use super::{cluster, grpc_calls, host, normalize, RealEnvoy};
use dedup_envoy::client::{Body, Request};
use dedup_envoy::http::{read_body, read_head};
use dedup_envoy::paths::dist_wasm;
use dedup_envoy::ports::free_port;
use host_test::{GrpcReply, GrpcRequest, GrpcServer, LogLevel, Reply, SimEnvoy, UpstreamRequest};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------- the upstream both hosts reach ----------

/// What the loopback upstream answers and has seen; the test sets the
/// answers before each case.
#[derive(Default)]
struct Upstream {
    /// The byte `GET /bytes/1` answers (httpbin's random byte).
    coin: u8,
    /// The requests that reached it, in order ([`request_line`]).
    seen: Vec<String>,
}

type Shared = Arc<Mutex<Upstream>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Upstream> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request as an upstream read it: request line, headers in order (the
/// request id blanked), body.
fn request_line(method: &str, path: &str, headers: &[(String, String)], body: &[u8]) -> String {
    let headers: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    normalize(&format!(
        "{method} {path} [{}] {:?}",
        headers.join(", "),
        String::from_utf8_lossy(body)
    ))
}

/// The upstream service, one answer per path: `/bytes/1` (the callout of
/// http_auth_random: one byte), `/secret` and `/binary` (http_body: a body
/// to redact, one that is not UTF-8), a gRPC request (OK, trailers only),
/// and "upstream ok" for anything else. Headers as it writes them.
fn answer(path: &str, grpc: bool, coin: u8) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let (content_type, body): (&str, Vec<u8>) = match path {
        "/bytes/1" => ("application/octet-stream", vec![coin]),
        "/secret" => ("text/plain", b"the secret is 42".to_vec()),
        "/binary" => ("application/octet-stream", b"\xff\xfe secret".to_vec()),
        _ if grpc => ("application/grpc", Vec::new()),
        _ => ("text/plain", b"upstream ok".to_vec()),
    };
    let mut headers = vec![("content-type".to_string(), content_type.to_string())];
    if grpc {
        headers.push(("grpc-status".into(), "0".into()));
    }
    headers.push(("content-length".into(), body.len().to_string()));
    (200, headers, body)
}

/// [`answer`] on loopback, for real Envoy (its route and its `httpbin`
/// cluster) and host-test's callouts alike.
fn serve(shared: Shared) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let shared = shared.clone();
            std::thread::spawn(move || serve_connection(conn, shared));
        }
    });
    addr
}

fn serve_connection(mut conn: TcpStream, shared: Shared) {
    let Ok(read) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read);
    while let Ok(Some(head)) = read_head(&mut reader) {
        let Ok(body) = read_body(&mut reader, &head, false) else {
            return;
        };
        let mut start = head.start.split(' ');
        let (method, path) = (start.next().unwrap_or(""), start.next().unwrap_or(""));
        let grpc = head
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/grpc"));
        let coin = {
            let mut up = lock(&shared);
            up.seen
                .push(request_line(method, path, &head.headers, &body));
            up.coin
        };
        let (status, headers, body) = answer(path, grpc, coin);
        let mut out = format!("HTTP/1.1 {status} OK\r\n");
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        out.extend_from_slice(&body);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

/// The `grpcbin` service: `RandomError` answers the status the case set.
fn grpcbin(status: Arc<Mutex<u32>>) -> GrpcServer {
    GrpcServer::start(move |_req: &GrpcRequest| {
        match *status.lock().unwrap_or_else(|p| p.into_inner()) {
            0 => GrpcReply::ok(b""),
            code => GrpcReply::status(code, "random error"),
        }
    })
    .unwrap()
}

// ---------- the examples and their cases ----------

/// One example filter: its module, the name it runs under (listener, plugin
/// name, vm_id), its plugin configuration, and whether its router adds no
/// `x-envoy-*` header (`suppress_envoy_headers`).
#[derive(Clone, Copy)]
struct Example {
    name: &'static str,
    wasm: &'static str,
    config: &'static str,
    suppress: bool,
}

const HEADERS: Example = Example {
    name: "http_headers",
    wasm: "example_http_headers.wasm",
    config: "",
    suppress: false,
};
const BODY: Example = Example {
    name: "http_body",
    wasm: "example_http_body.wasm",
    config: "",
    suppress: false,
};
const CONFIG: Example = Example {
    name: "http_config",
    wasm: "example_http_config.wasm",
    config: "The secret to life is meaningless unless you discover it yourself",
    suppress: false,
};
const HTTP_AUTH: Example = Example {
    name: "http_auth_random",
    wasm: "example_http_auth_random.wasm",
    config: "",
    suppress: false,
};
const GRPC_AUTH: Example = Example {
    name: "grpc_auth_random",
    wasm: "example_grpc_auth_random.wasm",
    config: "",
    suppress: false,
};
const METADATA: Example = Example {
    name: "envoy_filter_metadata",
    wasm: "example_envoy_filter_metadata.wasm",
    config: "",
    suppress: false,
};
/// http_headers behind a router told to add no `x-envoy-*` header.
const HEADERS_QUIET: Example = Example {
    name: "http_headers_quiet",
    suppress: true,
    ..HEADERS
};
/// hello_world loaded as an HTTP filter (it has no HTTP context; no request
/// is sent to it): a main-thread VM and a worker's, both ticking.
const HELLO_FILTER: Example = Example {
    name: "hello_filter",
    wasm: "example_hello_world.wasm",
    config: "",
    suppress: false,
};
/// hello_world as the SDK ships it: a bootstrap singleton service.
const HELLO_SINGLETON: &str = "hello_singleton";

const FILTERS: [Example; 8] = [
    HEADERS,
    HEADERS_QUIET,
    BODY,
    CONFIG,
    HTTP_AUTH,
    GRPC_AUTH,
    METADATA,
    HELLO_FILTER,
];

struct Case {
    name: &'static str,
    example: Example,
    request: Request,
    /// The byte httpbin's `/bytes/1` answers (http_auth_random lets even ones through).
    coin: u8,
    /// The status grpcbin's `RandomError` answers (grpc_auth_random lets even ones through).
    grpc_status: u32,
}

fn case(name: &'static str, example: Example, request: Request) -> Case {
    Case {
        name,
        example,
        request: request.host("example.test").timeout(Duration::from_secs(5)),
        coin: 0,
        grpc_status: 0,
    }
}

fn grpc(path: &str) -> Request {
    Request::post(path)
        .header("content-type", "application/grpc")
        .body(&b"\0\0\0\0\0"[..])
}

/// Every case, in the order both hosts run them (the filters number their
/// streams: the order matters).
fn cases() -> Vec<Case> {
    let coin = |mut c: Case, byte: u8| {
        c.coin = byte;
        c
    };
    let status = |mut c: Case, code: u32| {
        c.grpc_status = code;
        c
    };
    vec![
        case("headers-hello", HEADERS, Request::get("/hello")),
        case("headers-routed", HEADERS, Request::get("/index.html")),
        case(
            "headers-direct",
            HEADERS,
            Request::get("/direct").header("x-tenant", "t1"),
        ),
        case("quiet-routed", HEADERS_QUIET, Request::get("/index.html")),
        case("body-secret", BODY, Request::get("/secret")),
        case("body-plain", BODY, Request::get("/plain")),
        // Not UTF-8: the filter panics at the end of the body (the response
        // headers already went out: the client sees them, then a reset).
        case("body-binary-traps", BODY, Request::get("/binary")),
        case("body-failed-vm", BODY, Request::get("/plain")),
        case("config-routed", CONFIG, Request::get("/")),
        case("config-direct", CONFIG, Request::get("/direct")),
        coin(
            case("auth-even-byte", HTTP_AUTH, Request::get("/anything")),
            2,
        ),
        coin(
            case("auth-odd-byte", HTTP_AUTH, Request::get("/anything")),
            7,
        ),
        case("grpc-not-grpc", GRPC_AUTH, Request::get("/")),
        case(
            "grpc-reflection",
            GRPC_AUTH,
            grpc("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
        ),
        status(
            case(
                "grpc-even-status",
                GRPC_AUTH,
                grpc("/grpcbin.GRPCBin/Index"),
            ),
            0,
        ),
        status(
            case("grpc-odd-status", GRPC_AUTH, grpc("/grpcbin.GRPCBin/Index")),
            3,
        ),
        status(
            case("grpc-even-error", GRPC_AUTH, grpc("/grpcbin.GRPCBin/Index")),
            4,
        ),
        case(
            "metadata-set",
            METADATA,
            Request::get("/").header("x-custom-metadata", "Proxy-Wasm"),
        ),
        case("metadata-unset", METADATA, Request::get("/direct")),
    ]
}

/// What is compared for one case.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    /// As the client got them, in order, but for what the connection manager
    /// and the codec add (`date`, `server`, `transfer-encoding`, and
    /// `content-length: 0` on an empty body: among the differences from
    /// Envoy that host-test's manual lists).
    headers: Vec<(String, String)>,
    body: String,
    /// The stream was reset after the response headers.
    reset: bool,
    /// The filter's lines (and Envoy's line about a trap): `level message`.
    log: Vec<String>,
    /// What reached the loopback upstream (the route, `httpbin`), in order.
    upstream: Vec<String>,
    /// The calls at the gRPC server.
    grpc: Vec<String>,
}

fn client_headers(headers: Vec<(String, String)>, body: &[u8]) -> Vec<(String, String)> {
    headers
        .into_iter()
        .filter(|(k, v)| {
            let codec = matches!(k.as_str(), "date" | "server" | "transfer-encoding");
            let empty_length = k == "content-length" && v == "0" && body.is_empty();
            !(codec || empty_length)
        })
        .map(|(k, v)| (k, normalize(&v)))
        .map(|(k, v)| match k.as_str() {
            "x-envoy-upstream-service-time" => (k, "*".to_string()),
            _ => (k, v),
        })
        .collect()
}

/// A log line in both hosts' words: Envoy's level name, the message with
/// what differs per run (request ids, times, random numbers) blanked.
fn log_line(level: &str, message: &str) -> String {
    // hello_world's tick: the wall clock and a random byte.
    let message = if message.starts_with("It's ") && message.contains("your lucky number is") {
        "It's *, your lucky number is *.".to_string()
    } else {
        normalize(message)
    };
    format!("{level} {message}")
}

fn level_name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Trace => "trace",
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warning",
        LogLevel::Error => "error",
        LogLevel::Critical => "critical",
    }
}

// ---------- real Envoy ----------

/// One entry of Envoy's log (a multi-line message joined).
#[derive(Debug, Clone)]
struct Entry {
    /// Milliseconds since the epoch of the log's (local) clock.
    at_ms: u64,
    thread: u32,
    level: String,
    logger: String,
    text: String,
}

impl Entry {
    fn parse_start(line: &str) -> Option<Entry> {
        // [2026-12-07 04:07:59.939][17976][info][wasm] [source/...cc:1151] text
        let rest = line.strip_prefix('[')?;
        let (time, rest) = rest.split_once("][")?;
        let (thread, rest) = rest.split_once("][")?;
        let (level, rest) = rest.split_once("][")?;
        let (logger, rest) = rest.split_once("] ")?;
        let text = rest.split_once("] ").map_or(rest, |(_, t)| t);
        let mut parts = time
            .split(['-', ' ', ':', '.'])
            .map(|p| p.parse::<i64>().ok());
        let mut next = || parts.next().flatten();
        let (y, mo, d) = (next()?, next()?, next()?);
        let (h, mi, sec, ms) = (next()?, next()?, next()?, next()?);
        let secs = days_from_civil(y, mo, d) * 86_400 + (h * 60 + mi) * 60 + sec;
        Some(Entry {
            at_ms: (secs * 1000 + ms) as u64,
            thread: thread.parse().ok()?,
            level: level.to_string(),
            logger: logger.to_string(),
            text: text.to_string(),
        })
    }

    /// A plugin's line: (the first word of its log prefix, e.g. its name or
    /// vm_id, the message); `None` for Envoy's own lines.
    fn plugin_line(&self) -> Option<(&str, &str)> {
        let rest = self.text.strip_prefix("wasm log")?;
        let (prefix, message) = rest.split_once(": ")?;
        Some((prefix.split_whitespace().next().unwrap_or(""), message))
    }

    /// Envoy's line about a trap, without the in-VM backtrace it appends
    /// (host-test logs wasmtime's at debug level).
    fn trap_line(&self) -> Option<&str> {
        if self.logger != "wasm" || !self.text.starts_with("Function: ") {
            return None;
        }
        Some(
            self.text
                .split("\nProxy-Wasm plugin in-VM backtrace:")
                .next()
                .unwrap_or(""),
        )
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

impl RealEnvoy {
    fn entries(&self) -> Vec<Entry> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let mut out: Vec<Entry> = Vec::new();
        for line in text.lines() {
            match Entry::parse_start(line) {
                Some(e) => out.push(e),
                None => {
                    if let Some(last) = out.last_mut() {
                        last.text.push('\n');
                        last.text.push_str(line);
                    }
                }
            }
        }
        out
    }

    /// The lines of `plugin`, and Envoy's lines about a trap, among `entries`.
    fn case_log(entries: &[Entry], plugin: &str) -> Vec<String> {
        entries
            .iter()
            .filter_map(|e| match (e.plugin_line(), e.trap_line()) {
                (Some((p, message)), _) if p == plugin => Some(log_line(&e.level, message)),
                (_, Some(trap)) => Some(log_line(&e.level, trap)),
                _ => None,
            })
            .collect()
    }
}

/// One listener per example filter, the route to the loopback upstream
/// (`/direct`: a `direct_response`), and hello_world as a bootstrap singleton.
fn envoy_yaml(admin: u16, ports: &[u16], upstream: u16, grpcbin: u16) -> String {
    let mut listeners = String::new();
    for (example, port) in FILTERS.iter().zip(ports) {
        let wasm = dist_wasm(example.wasm).unwrap_or_else(|e| panic!("{e}"));
        // The SDK's example sets this metadata with a Lua filter before its own.
        let lua = if example.name == METADATA.name {
            r#"
          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(handle)
                    local value = handle:headers():get("x-custom-metadata")
                    if value then
                      handle:streamInfo():dynamicMetadata():set("envoy.filters.http.lua", "uppercased-custom-metadata", string.upper(value))
                    end
                  end"#
        } else {
            ""
        };
        listeners.push_str(&format!(
            r#"
  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/direct" }}
                direct_response: {{ status: 200, body: {{ inline_string: "direct body\n" }} }}
              - match: {{ prefix: "/" }}
                route: {{ cluster: upstream, timeout: 5s }}
          http_filters:{lua}
          - name: {name}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: {name}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: "{config}"
                vm_config:
                  vm_id: {name}
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {wasm} }} }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: {suppress}"#,
            name = example.name,
            suppress = example.suppress,
            config = example.config,
            wasm = wasm.display(),
        ));
    }
    let hello = dist_wasm("example_hello_world.wasm").unwrap_or_else(|e| panic!("{e}"));
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
bootstrap_extensions:
- name: envoy.bootstrap.wasm
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.wasm.v3.WasmService
    singleton: true
    config:
      name: {HELLO_SINGLETON}
      vm_config:
        vm_id: {HELLO_SINGLETON}
        runtime: envoy.wasm.runtime.v8
        code: {{ local: {{ filename: {} }} }}
static_resources:
  listeners:{listeners}
  clusters:{}{}{}
"#,
        hello.display(),
        cluster("upstream", upstream, false),
        cluster("httpbin", upstream, false),
        cluster("grpcbin", grpcbin, true),
    )
}

/// The request on a fresh connection; the answer as the client read it
/// (a body cut by a reset: empty, `reset`).
fn fetch(addr: SocketAddr, req: &Request) -> (u16, Vec<(String, String)>, Vec<u8>, bool) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(req.timeout)).unwrap();
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        req.method,
        req.path,
        req.host.as_deref().unwrap_or("")
    );
    for (k, v) in &req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = match &req.body {
        Body::Fixed(b) => b.clone(),
        _ => Vec::new(),
    };
    if !body.is_empty() {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    conn.write_all(&[head.into_bytes(), body].concat()).unwrap();
    let mut reader = BufReader::new(conn);
    let head = read_head(&mut reader).unwrap().expect("a response head");
    let status = head
        .start
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    match read_body(&mut reader, &head, true) {
        Ok(body) => (status, head.headers, body, false),
        Err(_) => (status, head.headers, Vec::new(), true),
    }
}

// ---------- host-test ----------

/// The example filter in host-test, reaching the same upstream and servers.
fn host_envoy(
    example: Example,
    shared: &Shared,
    upstream: SocketAddr,
    grpcbin: SocketAddr,
) -> SimEnvoy {
    let wasm = dist_wasm(example.wasm).unwrap_or_else(|e| panic!("{e}"));
    let seen = shared.clone();
    SimEnvoy::builder(wasm)
        .plugin_name(example.name)
        .vm_id(example.name)
        .plugin_config(example.config)
        .route_timeout(Duration::from_secs(5))
        .suppress_envoy_headers(example.suppress)
        .upstream(move |req: &UpstreamRequest| routed(req, &seen))
        .cluster_addr("httpbin", &upstream.to_string())
        .grpc_cluster_addr("grpcbin", &grpcbin.to_string())
        .build()
        .unwrap_or_else(|e| panic!("host-test: {e}"))
}

/// The route in host-test: `/direct` is the route's own answer; anything
/// else is what the loopback upstream would read (HTTP/1.1 puts
/// `:authority` as `host` where it stands) and answer.
fn routed(req: &UpstreamRequest, shared: &Shared) -> Reply {
    if req.path().starts_with("/direct") {
        return Reply::direct_response(200, "direct body\n");
    }
    let wire: Vec<(String, String)> = req
        .headers
        .iter()
        .filter_map(|(k, v)| match k.as_str() {
            ":authority" => Some(("host".to_string(), v.clone())),
            _ if k.starts_with(':') => None,
            _ => Some((k.clone(), v.clone())),
        })
        .collect();
    let grpc = req
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/grpc"));
    let coin = {
        let mut up = lock(shared);
        up.seen
            .push(request_line(req.method(), req.path(), &wire, &req.body));
        up.coin
    };
    let (status, headers, body) = answer(req.path(), grpc, coin);
    let mut reply = Reply::new(status);
    for (k, v) in &headers {
        reply = reply.header(k, v);
    }
    if body.is_empty() {
        reply
    } else {
        reply.body(body)
    }
}

/// The client's request in host-test; for envoy_filter_metadata, with the
/// dynamic metadata the Lua filter before it sets in Envoy.
fn host_request(c: &Case) -> host_test::Request {
    let request = host::request(&c.request);
    let custom = c
        .request
        .headers
        .iter()
        .find(|(k, _)| k == "x-custom-metadata")
        .map(|(_, v)| v.to_uppercase());
    match custom {
        Some(value) if c.example.name == METADATA.name => request.filter_metadata(
            "envoy.filters.http.lua",
            host_test::Value::object([(
                "uppercased-custom-metadata",
                host_test::Value::from(value.as_str()),
            )]),
        ),
        _ => request,
    }
}

/// The log lines of a host-test process: `level message` (by thread: see
/// [`thread_of_host`]).
fn host_lines(e: &SimEnvoy, from: usize) -> Vec<(String, String)> {
    e.logs()[from..]
        .iter()
        .map(|l| {
            (
                thread_of_host(e, l.worker),
                log_line(level_name(l.level), &l.message),
            )
        })
        .collect()
}

/// host-test's VMs by Envoy's threads: the workers' own, the main thread's
/// (and the short-lived copy configured there before serving).
fn thread_of_host(e: &SimEnvoy, worker: usize) -> String {
    if worker >= e.workers() {
        "main".into()
    } else {
        format!("worker {worker}")
    }
}

// ---------- the test ----------

/// hello_world's lines in the first 10.5 s after its first: two 5 s periods.
const TICK_WINDOW: Duration = Duration::from_millis(10_500);

#[test]
fn envoy_and_host_test_agree_on_the_sdk_examples() {
    let shared: Shared = Default::default();
    let upstream = serve(shared.clone());
    let grpc_status = Arc::new(Mutex::new(0));
    let server = grpcbin(grpc_status.clone());
    let ports: Vec<u16> = FILTERS.iter().map(|_| free_port().unwrap()).collect();
    let admin = free_port().unwrap();
    let yaml = envoy_yaml(admin, &ports, upstream.port(), server.addr().port());
    let envoy = RealEnvoy::launch("examples", 1, &yaml, ports[0], admin);
    // Both hello_worlds have started by now (their first lines are older).
    let hello_seen = Instant::now();
    let started = |plugin: &str| {
        envoy
            .entries()
            .iter()
            .any(|e| e.plugin_line().is_some_and(|(p, _)| p == plugin))
    };
    let wait = Instant::now() + Duration::from_secs(5);
    while !(started(HELLO_SINGLETON) && started(HELLO_FILTER.name)) {
        assert!(Instant::now() < wait, "hello_world never logged its start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let port_of = |example: Example| {
        let at = FILTERS.iter().position(|f| f.name == example.name).unwrap();
        SocketAddr::from(([127, 0, 0, 1], ports[at]))
    };
    let set = |c: &Case| {
        lock(&shared).coin = c.coin;
        *grpc_status.lock().unwrap() = c.grpc_status;
    };
    let mut real = Vec::new();
    for c in cases() {
        set(&c);
        let (log_from, seen_from, calls_from) = (
            envoy.entries().len(),
            lock(&shared).seen.len(),
            server.calls().len(),
        );
        let (status, headers, body, reset) = fetch(port_of(c.example), &c.request);
        // Envoy flushes its log every 20 ms.
        std::thread::sleep(Duration::from_millis(150));
        let entries = envoy.entries();
        real.push(Seen {
            status,
            headers: client_headers(headers, &body),
            body: String::from_utf8_lossy(&body).into_owned(),
            reset,
            log: RealEnvoy::case_log(&entries[log_from..], c.example.name),
            upstream: lock(&shared).seen[seen_from..].to_vec(),
            grpc: grpc_calls(&server.calls()[calls_from..]),
        });
    }
    // hello_world's starts and two periods of ticks, by thread: its lines up
    // to TICK_WINDOW after its first, once Envoy has certainly written them.
    let end = hello_seen + TICK_WINDOW + Duration::from_millis(300);
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    let entries = envoy.entries();
    let hello_in_envoy = |plugin: &str| -> Vec<(String, String)> {
        let mine = |e: &&Entry| e.plugin_line().is_some_and(|(p, _)| p == plugin);
        let start = entries
            .iter()
            .find(mine)
            .expect("hello_world logged at start")
            .at_ms;
        entries
            .iter()
            .filter(mine)
            .filter(|e| e.at_ms <= start + TICK_WINDOW.as_millis() as u64)
            .map(|e| {
                let thread = if e.thread == envoy.child.id() {
                    "main".to_string()
                } else {
                    "worker 0".to_string()
                };
                let message = e.plugin_line().map_or("", |(_, m)| m);
                (thread, log_line(&e.level, message))
            })
            .collect()
    };
    let real_singleton = hello_in_envoy(HELLO_SINGLETON);
    let real_hello_filter = hello_in_envoy(HELLO_FILTER.name);
    drop(envoy);

    let mut differences = Vec::new();
    let mut hosts: Vec<(&str, SimEnvoy)> = Vec::new();
    for (c, r) in cases().iter().zip(&real) {
        set(c);
        if !hosts.iter().any(|(n, _)| *n == c.example.name) {
            let e = host_envoy(c.example, &shared, upstream, server.addr());
            hosts.push((c.example.name, e));
        }
        let e = &mut hosts
            .iter_mut()
            .find(|(n, _)| *n == c.example.name)
            .unwrap()
            .1;
        let (log_from, seen_from, calls_from) = (
            e.logs().len(),
            lock(&shared).seen.len(),
            server.calls().len(),
        );
        let response = e
            .request(0, host_request(c))
            .unwrap_or_else(|err| panic!("{}: {err}", c.name));
        let m = Seen {
            status: response.status,
            headers: client_headers(response.headers.clone(), &response.body),
            body: response.body_str(),
            reset: response.reset,
            log: host_lines(e, log_from)
                .into_iter()
                .map(|(_, l)| l)
                .collect(),
            upstream: lock(&shared).seen[seen_from..].to_vec(),
            grpc: grpc_calls(&server.calls()[calls_from..]),
        };
        if *r == m {
            eprintln!("{}: {r:?}", c.name);
        } else {
            differences.push(format!(
                "{}:\n  envoy:     {r:?}\n  host-test: {m:?}",
                c.name
            ));
        }
    }
    let hello_in_host = |singleton: bool, name: &str| {
        let wasm = dist_wasm("example_hello_world.wasm").unwrap_or_else(|e| panic!("{e}"));
        let mut e = SimEnvoy::builder(wasm)
            .bootstrap_singleton(singleton)
            .plugin_name(name)
            .vm_id(name)
            .build()
            .unwrap_or_else(|err| panic!("host-test: {err}"));
        e.advance(TICK_WINDOW);
        host_lines(&e, 0)
    };
    for (name, real, host) in [
        (
            HELLO_SINGLETON,
            real_singleton,
            hello_in_host(true, HELLO_SINGLETON),
        ),
        (
            HELLO_FILTER.name,
            real_hello_filter,
            hello_in_host(false, HELLO_FILTER.name),
        ),
    ] {
        if real == host {
            eprintln!("{name}: {real:?}");
        } else {
            differences.push(format!(
                "{name}:\n  envoy:     {real:?}\n  host-test: {host:?}"
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "Envoy and host-test differ:\n{}",
        differences.join("\n")
    );
}
