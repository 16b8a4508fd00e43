//! What a filter reads of a response's origin (`response.code_details`,
//! `response.flags`, `response.code`, `upstream.address`) at request
//! headers, response headers, response body and in `on_log`: each case
//! holds the values seen in real Envoy 1.40 with the same probe
//! (`host-test/probes/envoy_origin.py`, table in `host-test/PROBES.md`).

use crate::*;
use host_test::{code_details, response_flags, Reply, Request, Response, SimEnvoy, StreamId};
use std::collections::HashMap;
use std::time::Duration;

const NOT_FOUND: &str = "status1";
const ADDRESS: &str = "127.0.0.1:8080";
const DISCONNECT: &str = "downstream_remote_disconnect";

/// `response.flags` as a value and its names.
type Flags = (u64, &'static str);
const NO_FLAGS: Flags = (0, "");
const UT: Flags = (4, "UT");
const DC: Flags = (16384, "DC");

/// The probe's `probe origin at=<at>` log lines, parsed into maps.
fn origins(envoy: &SimEnvoy, at: &str) -> Vec<HashMap<String, String>> {
    let marker = format!("probe origin at={at} ");
    envoy
        .logs()
        .iter()
        .filter(|l| l.message.starts_with(&marker))
        .map(|l| {
            l.message
                .split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn one(envoy: &SimEnvoy, at: &str) -> HashMap<String, String> {
    let mut lines = origins(envoy, at);
    assert_eq!(lines.len(), 1, "one 'at={at}' line expected: {lines:?}");
    lines.remove(0)
}

/// Little-endian bytes in hex, as the probe prints raw property values.
fn hex(bytes: [u8; 8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the probe should print of an origin, each value as it prints it.
struct Origin {
    details: &'static str,
    flags: String,
    code: String,
    address: &'static str,
}

impl Origin {
    /// `details` and `flags` from the upstream's host, with `status` as `response.code`.
    fn upstream(details: &'static str, (value, names): Flags, status: u16) -> Origin {
        let names = if names.is_empty() { "-" } else { names };
        Origin {
            details,
            flags: format!("{value}:{names}:hex{}", hex(value.to_le_bytes())),
            code: format!("{status}:hex{}", hex(i64::from(status).to_le_bytes())),
            address: ADDRESS,
        }
    }

    /// The same without an upstream host (`upstream.address` not found).
    fn hostless(details: &'static str, flags: Flags, status: u16) -> Origin {
        Origin {
            address: NOT_FOUND,
            ..Origin::upstream(details, flags, status)
        }
    }

    /// Without a response code (`response.code` not found).
    fn without_code(self) -> Origin {
        Origin {
            code: NOT_FOUND.to_string(),
            ..self
        }
    }
}

#[track_caller]
fn seen(line: &HashMap<String, String>, want: &Origin) {
    let got = |k: &str| line.get(k).map(String::as_str).unwrap_or("<missing>");
    assert_eq!(
        (
            got("response.code_details"),
            got("response.flags"),
            got("response.code"),
            got("upstream.address"),
        ),
        (
            want.details,
            want.flags.as_str(),
            want.code.as_str(),
            want.address
        ),
        "{line:?}"
    );
}

fn run(reply: Reply) -> (SimEnvoy, Response) {
    let mut envoy = answering(reply);
    let resp = envoy.request(0, Request::get("/up")).unwrap();
    (envoy, resp)
}

/// `run`, and the client got `status` and `body`.
#[track_caller]
fn answered(reply: Reply, status: u16, body: &str) -> (SimEnvoy, Response) {
    let (envoy, resp) = run(reply);
    assert_eq!((resp.status, resp.body_str().as_str()), (status, body));
    (envoy, resp)
}

/// The body of Envoy's local reply when the upstream reset before its headers.
fn reset_before_headers(reason: &str) -> String {
    format!("upstream connect error or disconnect/reset before headers. reset reason: {reason}")
}

/// A whole answer: the same values at response headers, each body
/// callback and on_log.
#[track_caller]
fn seen_throughout(envoy: &SimEnvoy, want: &Origin) {
    seen(&one(envoy, "headers"), want);
    for body in origins(envoy, "body") {
        seen(&body, want);
    }
    seen(&one(envoy, "log"), want);
}

/// `run` on an answer cut after its headers and 10 body bytes: the client sees
/// them and a reset; the filter saw the headers via the upstream and one body
/// callback without the end of the stream.
#[track_caller]
fn cut_mid_body(reply: Reply) -> (SimEnvoy, Response) {
    let (envoy, resp) = run(reply);
    assert_eq!(
        (resp.status, resp.body_str().as_str(), resp.reset),
        (200, "0123456789", true)
    );
    let via_upstream = Origin::upstream("via_upstream", NO_FLAGS, 200);
    seen(&one(&envoy, "headers"), &via_upstream);
    let body = one(&envoy, "body");
    assert_eq!(
        (body["size"].as_str(), body["eos"].as_str()),
        ("10", "false")
    );
    (envoy, resp)
}

/// A one-worker probe with a GET forwarded upstream and not yet answered.
fn forwarded() -> (SimEnvoy, StreamId) {
    let mut envoy = probe(1);
    let id = envoy.start(0, Request::get("/up")).unwrap();
    envoy.send_request(id).unwrap();
    (envoy, id)
}

#[test]
fn before_any_response_only_the_flags_exist() {
    let (envoy, _) = run(Reply::ok());
    let origin = Origin::hostless(NOT_FOUND, NO_FLAGS, 0).without_code();
    seen(&one(&envoy, "request"), &origin);
}

#[test]
fn upstream_answers_are_via_upstream_whatever_the_status() {
    for status in [200, 503, 429] {
        let (envoy, resp) = answered(Reply::new(status).body("ok"), status, "ok");
        seen_throughout(&envoy, &Origin::upstream("via_upstream", NO_FLAGS, status));
        assert_eq!(resp.code_details.as_deref(), Some("via_upstream"));
        assert_eq!(resp.response_flags, 0);
        assert_eq!(resp.upstream_address.as_deref(), Some(ADDRESS));
    }
}

#[test]
fn response_code_is_readable_in_the_body_callback() {
    // Envoy serves response.code from stream info, not from the header map
    // (which is gone once the headers were continued).
    let (envoy, _) = run(Reply::new(201).body("made"));
    let body = origins(&envoy, "body");
    assert!(!body.is_empty());
    assert_eq!(body[0]["response.code"], "201:hexc900000000000000");
}

#[test]
fn upstream_address_is_configurable() {
    let mut envoy = probe_builder()
        .upstream_address("10.0.0.7:9000")
        .build()
        .unwrap();
    let resp = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(one(&envoy, "log")["upstream.address"], "10.0.0.7:9000");
    assert_eq!(resp.upstream_address.as_deref(), Some("10.0.0.7:9000"));
}

#[test]
fn connection_refused_is_uf_with_the_host_tried() {
    let refused = reset_before_headers("remote connection failure");
    let (envoy, resp) = answered(Reply::connect_failure(), 503, &refused);
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    seen_throughout(
        &envoy,
        &Origin::upstream(
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            (32, "UF"),
            503,
        ),
    );
    assert_eq!(resp.response_flags, response_flags::UF);
}

#[test]
fn connect_failure_retries_exhausted_add_urx() {
    let (envoy, _) = run(Reply::connect_failure().with_flags(response_flags::URX));
    let origin = Origin::upstream(code_details::CONNECT_FAILURE, (32800, "UF,URX"), 503);
    seen(&one(&envoy, "log"), &origin);
}

#[test]
fn upstream_5xx_with_retries_exhausted_is_via_upstream_with_urx() {
    let reply = Reply::new(503).body("ok").with_flags(response_flags::URX);
    let (envoy, _) = answered(reply, 503, "ok");
    seen_throughout(
        &envoy,
        &Origin::upstream("via_upstream", (32768, "URX"), 503),
    );
}

#[test]
fn route_timeout_is_ut_504() {
    let (envoy, _) = answered(Reply::no_answer(), 504, "upstream request timeout");
    seen_throughout(&envoy, &Origin::upstream("response_timeout", UT, 504));
}

#[test]
fn route_timeout_after_the_headers_resets_mid_body() {
    let (envoy, _) = cut_mid_body(Reply::no_answer_after_headers(200, "0123456789"));
    seen(
        &one(&envoy, "body"),
        &Origin::upstream("via_upstream", NO_FLAGS, 200),
    );
    seen(
        &one(&envoy, "log"),
        &Origin::upstream("response_timeout", UT, 200),
    );
}

#[test]
fn upstream_closing_before_the_response_is_uc() {
    let closed = reset_before_headers("connection termination");
    let (envoy, _) = answered(Reply::reset(), 503, &closed);
    let details = "upstream_reset_before_response_started{connection_termination}";
    seen_throughout(&envoy, &Origin::upstream(details, (64, "UC"), 503));
}

#[test]
fn upstream_closing_mid_body_is_upe_after_response_started() {
    let (envoy, resp) = cut_mid_body(Reply::reset_after_headers(200, "0123456789"));
    assert_eq!(
        resp.header("content-length"),
        Some("110"),
        "announced more than sent"
    );
    let details = "upstream_reset_after_response_started{protocol_error}";
    seen(
        &one(&envoy, "log"),
        &Origin::upstream(details, (8388608, "UPE"), 200),
    );
}

#[test]
fn client_gone_while_the_upstream_works_is_dc_without_response() {
    let (mut envoy, id) = forwarded();
    assert!(envoy.upstream_request(id).is_some());
    envoy.reset_client(id).unwrap();
    assert!(
        origins(&envoy, "headers").is_empty(),
        "no response callbacks"
    );
    let origin = Origin::upstream(DISCONNECT, DC, 0).without_code();
    seen(&one(&envoy, "log"), &origin);
    let resp = envoy.response(id).unwrap();
    assert_eq!(resp.code_details.as_deref(), Some(DISCONNECT));
    assert_eq!(resp.response_flags, response_flags::DC);
}

#[test]
fn client_gone_mid_body_keeps_the_code_and_turns_dc() {
    let (mut envoy, id) = forwarded();
    let reply = Reply::no_answer_after_headers(200, "0123456789");
    envoy.respond(id, reply).unwrap();
    envoy.reset_client(id).unwrap();
    seen(
        &one(&envoy, "headers"),
        &Origin::upstream("via_upstream", NO_FLAGS, 200),
    );
    seen(&one(&envoy, "log"), &Origin::upstream(DISCONNECT, DC, 200));
    // The route timeout no longer fires for a finished stream.
    envoy.advance(Duration::from_secs(20));
    assert_eq!(origins(&envoy, "log").len(), 1);
}

#[test]
fn client_gone_while_the_filter_holds_the_request_has_no_upstream() {
    // Pause at headers without allow_on_headers_stop_iteration: the request
    // never reaches the router.
    let mut envoy = probe(1);
    let held = Request::post("/up").header("x-probe", "body");
    let id = envoy.start(0, held.chunks(["01234", "56789"])).unwrap();
    envoy.send_headers(id).unwrap();
    envoy.send_chunk(id).unwrap();
    envoy.reset_client(id).unwrap();
    let origin = Origin::hostless(DISCONNECT, DC, 0).without_code();
    seen(&one(&envoy, "log"), &origin);
}

#[test]
fn no_healthy_upstream_is_uh_without_a_host() {
    let (envoy, resp) = answered(Reply::no_healthy_upstream(), 503, "no healthy upstream");
    seen_throughout(
        &envoy,
        &Origin::hostless("no_healthy_upstream", (2, "UH"), 503),
    );
    assert_eq!(resp.upstream_address, None);
}

#[test]
fn circuit_breaker_overflow_is_uo_without_a_host() {
    let (envoy, _) = answered(Reply::overflow(), 503, &reset_before_headers("overflow"));
    let details = "upstream_reset_before_response_started{overflow}";
    seen_throughout(&envoy, &Origin::hostless(details, (128, "UO"), 503));
}

#[test]
fn local_rate_limit_after_the_filter_is_rl_429() {
    let (envoy, resp) = answered(Reply::rate_limited(), 429, "local_rate_limited");
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    assert!(resp.local_reply);
    seen_throughout(
        &envoy,
        &Origin::hostless("local_rate_limited", (2048, "RL"), 429),
    );
}

#[test]
fn direct_response_route() {
    let (envoy, _) = answered(Reply::direct_response(200, "direct"), 200, "direct");
    seen_throughout(&envoy, &Origin::hostless("direct_response", NO_FLAGS, 200));
}

#[test]
fn router_local_replies_without_a_route_or_cluster() {
    let no_route = Reply::local(404, code_details::ROUTE_NOT_FOUND, response_flags::NR);
    let (envoy, _) = answered(no_route, 404, "");
    seen_throughout(
        &envoy,
        &Origin::hostless("route_not_found", (256, "NR"), 404),
    );
    let no_cluster = Reply::local(503, code_details::CLUSTER_NOT_FOUND, response_flags::NC);
    let (envoy, _) = run(no_cluster);
    let origin = Origin::hostless("cluster_not_found", (16777216, "NC"), 503);
    seen_throughout(&envoy, &origin);
}

#[test]
fn filter_local_reply_carries_the_filters_details() {
    let mut envoy = probe(1);
    // The SDK's send_http_response passes no details: an empty string
    // (status Ok, no bytes), not NotFound.
    envoy
        .request(0, Request::get("/up").header("x-probe", "cas-absent-max"))
        .unwrap();
    seen_throughout(&envoy, &Origin::hostless("", NO_FLAGS, 200));

    for (details, recorded) in [
        ("dedup_in_flight", "dedup_in_flight"),
        ("two words", "two_words"),
    ] {
        envoy.clear_logs();
        let resp = envoy
            .request(
                0,
                Request::get("/up")
                    .header("x-probe", "local-details")
                    .header("x-details", details)
                    .header("x-reply-status", "409"),
            )
            .unwrap();
        assert_eq!(
            (resp.status, resp.body_str().as_str()),
            (409, "local with details")
        );
        seen_throughout(&envoy, &Origin::hostless(recorded, NO_FLAGS, 409));
        assert_eq!(resp.code_details.as_deref(), Some(recorded));
    }
}

#[test]
fn buffer_overflow_413_after_the_headers_went_upstream() {
    let mut envoy = probe_builder().buffer_limit(16).build().unwrap();
    let resp = envoy
        .request(
            0,
            Request::post("/up")
                .header("x-probe", "body")
                .header("x-headers-action", "continue")
                .chunks(["0123456789", "0123456789"]),
        )
        .unwrap();
    assert_eq!(resp.status, 413);
    let origin = Origin::upstream("request_payload_too_large", NO_FLAGS, 413);
    seen_throughout(&envoy, &origin);
}

#[test]
fn failed_vm_reply_is_wasm_fail_stream() {
    let resp = probe(1).request(0, get_probe("trap", &[])).unwrap();
    assert_eq!(resp.status, 503);
    assert_eq!(resp.code_details.as_deref(), Some("wasm_fail_stream"));
}

#[test]
fn origin_values_in_callouts() {
    let mut envoy = probe_builder()
        .cluster("refused", |_| Reply::connect_failure())
        .cluster("unhealthy", |_| Reply::no_healthy_upstream())
        .cluster("cut", |_| Reply::reset_after_headers(200, "01234"))
        .cluster("stalled", |_| Reply::no_answer_after_headers(200, "01234"))
        .cluster("limited", |_| Reply::rate_limited())
        .build()
        .unwrap();
    let call = |envoy: &mut SimEnvoy, cluster: &str| {
        let req = Request::post("/")
            .header("x-probe", "http-call")
            .header("x-cluster", cluster)
            .header("x-timeout-ms", "500");
        json(&envoy.request(0, req).unwrap())
    };
    assert_eq!(call(&mut envoy, "refused")["status"], "503");
    let j = call(&mut envoy, "unhealthy");
    assert_eq!(
        (j["status"].as_str(), j["body"].as_str()),
        (Some("503"), Some("no healthy upstream"))
    );
    assert_eq!(call(&mut envoy, "cut")["num_headers"], 0);
    let before = envoy.now();
    assert_eq!(call(&mut envoy, "stalled")["num_headers"], 0);
    assert_eq!(
        envoy.now().duration_since(before).unwrap(),
        Duration::from_millis(500),
        "reset at the call's timeout"
    );
    assert_eq!(call(&mut envoy, "limited")["status"], "429");
}
