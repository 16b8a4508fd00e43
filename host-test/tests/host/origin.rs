//! What a filter reads of a response's origin (`response.code_details`,
//! `response.flags`, `response.code`, `upstream.address`) at request
//! headers, response headers, response body and in `on_log`: each case
//! holds the values seen in real Envoy 1.40 with the same probe
//! (`host-test/probes/envoy_origin.py`, table in `host-test/PROBES.md`).

use crate::*;
use host_test::{code_details, response_flags, Envoy, Reply, Request};
use std::collections::HashMap;
use std::time::Duration;

const NOT_FOUND: &str = "status1";
const ADDRESS: &str = "127.0.0.1:8080";

/// The probe's `probe origin at=<at>` log lines, parsed into maps.
fn origins(envoy: &Envoy, at: &str) -> Vec<HashMap<String, String>> {
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

fn one(envoy: &Envoy, at: &str) -> HashMap<String, String> {
    let mut lines = origins(envoy, at);
    assert_eq!(lines.len(), 1, "one 'at={at}' line expected: {lines:?}");
    lines.remove(0)
}

/// `response.flags` as the probe prints it: value, names, the 8 raw bytes.
fn flags(value: u64, names: &str) -> String {
    let hex: String = value
        .to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let names = if names.is_empty() { "-" } else { names };
    format!("{value}:{names}:hex{hex}")
}

/// `response.code` as the probe prints it.
fn code(status: u16) -> String {
    let hex: String = i64::from(status)
        .to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{status}:hex{hex}")
}

#[track_caller]
fn seen(line: &HashMap<String, String>, details: &str, flag: &str, code: &str, address: &str) {
    let got = |k: &str| line.get(k).map(String::as_str).unwrap_or("<missing>");
    assert_eq!(
        (
            got("response.code_details"),
            got("response.flags"),
            got("response.code"),
            got("upstream.address"),
        ),
        (details, flag, code, address),
        "{line:?}"
    );
}

fn run(reply: Reply) -> (Envoy, host_test::Response) {
    let mut envoy = probe_builder()
        .upstream(move |_| reply.clone())
        .build()
        .unwrap();
    let resp = envoy.request(0, Request::get("/up")).unwrap();
    (envoy, resp)
}

/// A whole answer: the same values at response headers, each body
/// callback and on_log.
#[track_caller]
fn seen_throughout(envoy: &Envoy, details: &str, flag: &str, code: &str, address: &str) {
    seen(&one(envoy, "headers"), details, flag, code, address);
    for body in origins(envoy, "body") {
        seen(&body, details, flag, code, address);
    }
    seen(&one(envoy, "log"), details, flag, code, address);
}

#[test]
fn before_any_response_only_the_flags_exist() {
    let (envoy, _) = run(Reply::ok());
    seen(
        &one(&envoy, "request"),
        NOT_FOUND,
        &flags(0, ""),
        NOT_FOUND,
        NOT_FOUND,
    );
}

#[test]
fn upstream_answers_are_via_upstream_whatever_the_status() {
    for status in [200, 503, 429] {
        let (envoy, resp) = run(Reply::new(status).body("ok"));
        assert_eq!(resp.status, status);
        seen_throughout(
            &envoy,
            "via_upstream",
            &flags(0, ""),
            &code(status),
            ADDRESS,
        );
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
    assert_eq!(body[0]["response.code"], code(201));
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
    let (envoy, resp) = run(Reply::connect_failure());
    assert_eq!(resp.status, 503);
    assert_eq!(
        resp.body_str(),
        "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
    );
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    seen_throughout(
        &envoy,
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
        &flags(32, "UF"),
        &code(503),
        ADDRESS,
    );
    assert_eq!(resp.response_flags, response_flags::UF);
}

#[test]
fn connect_failure_retries_exhausted_add_urx() {
    let (envoy, _) = run(Reply::connect_failure().with_flags(response_flags::URX));
    seen(
        &one(&envoy, "log"),
        code_details::CONNECT_FAILURE,
        &flags(32800, "UF,URX"),
        &code(503),
        ADDRESS,
    );
}

#[test]
fn upstream_5xx_with_retries_exhausted_is_via_upstream_with_urx() {
    let (envoy, resp) = run(Reply::new(503).body("ok").with_flags(response_flags::URX));
    assert_eq!(resp.body_str(), "ok");
    seen_throughout(
        &envoy,
        "via_upstream",
        &flags(32768, "URX"),
        &code(503),
        ADDRESS,
    );
}

#[test]
fn route_timeout_is_ut_504() {
    let (envoy, resp) = run(Reply::no_answer());
    assert_eq!(
        (resp.status, resp.body_str().as_str()),
        (504, "upstream request timeout")
    );
    seen_throughout(
        &envoy,
        "response_timeout",
        &flags(4, "UT"),
        &code(504),
        ADDRESS,
    );
}

#[test]
fn route_timeout_after_the_headers_resets_mid_body() {
    let (envoy, resp) = run(Reply::no_answer_after_headers(200, "0123456789"));
    assert_eq!(
        (resp.status, resp.body_str().as_str(), resp.reset),
        (200, "0123456789", true)
    );
    seen(
        &one(&envoy, "headers"),
        "via_upstream",
        &flags(0, ""),
        &code(200),
        ADDRESS,
    );
    let body = one(&envoy, "body");
    assert_eq!(
        (body["size"].as_str(), body["eos"].as_str()),
        ("10", "false")
    );
    seen(&body, "via_upstream", &flags(0, ""), &code(200), ADDRESS);
    seen(
        &one(&envoy, "log"),
        "response_timeout",
        &flags(4, "UT"),
        &code(200),
        ADDRESS,
    );
}

#[test]
fn upstream_closing_before_the_response_is_uc() {
    let (envoy, resp) = run(Reply::reset());
    assert_eq!(resp.status, 503);
    assert_eq!(
        resp.body_str(),
        "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
    );
    seen_throughout(
        &envoy,
        "upstream_reset_before_response_started{connection_termination}",
        &flags(64, "UC"),
        &code(503),
        ADDRESS,
    );
}

#[test]
fn upstream_closing_mid_body_is_upe_after_response_started() {
    let (envoy, resp) = run(Reply::reset_after_headers(200, "0123456789"));
    assert_eq!(
        (resp.status, resp.body_str().as_str(), resp.reset),
        (200, "0123456789", true)
    );
    assert_eq!(
        resp.header("content-length"),
        Some("110"),
        "announced more than sent"
    );
    seen(
        &one(&envoy, "headers"),
        "via_upstream",
        &flags(0, ""),
        &code(200),
        ADDRESS,
    );
    let body = one(&envoy, "body");
    assert_eq!(
        (body["size"].as_str(), body["eos"].as_str()),
        ("10", "false")
    );
    seen(
        &one(&envoy, "log"),
        "upstream_reset_after_response_started{protocol_error}",
        &flags(8388608, "UPE"),
        &code(200),
        ADDRESS,
    );
}

#[test]
fn client_gone_while_the_upstream_works_is_dc_without_response() {
    let mut envoy = probe(1);
    let id = envoy.start(0, Request::get("/up")).unwrap();
    envoy.send_request(id).unwrap();
    assert!(envoy.upstream_request(id).is_some());
    envoy.reset_client(id).unwrap();
    assert!(
        origins(&envoy, "headers").is_empty(),
        "no response callbacks"
    );
    seen(
        &one(&envoy, "log"),
        "downstream_remote_disconnect",
        &flags(16384, "DC"),
        NOT_FOUND,
        ADDRESS,
    );
    let resp = envoy.response(id).unwrap();
    assert_eq!(
        resp.code_details.as_deref(),
        Some("downstream_remote_disconnect")
    );
    assert_eq!(resp.response_flags, response_flags::DC);
}

#[test]
fn client_gone_mid_body_keeps_the_code_and_turns_dc() {
    let mut envoy = probe(1);
    let id = envoy.start(0, Request::get("/up")).unwrap();
    envoy.send_request(id).unwrap();
    envoy
        .respond(id, Reply::no_answer_after_headers(200, "0123456789"))
        .unwrap();
    envoy.reset_client(id).unwrap();
    seen(
        &one(&envoy, "headers"),
        "via_upstream",
        &flags(0, ""),
        &code(200),
        ADDRESS,
    );
    seen(
        &one(&envoy, "log"),
        "downstream_remote_disconnect",
        &flags(16384, "DC"),
        &code(200),
        ADDRESS,
    );
    // The route timeout no longer fires for a finished stream.
    envoy.advance(Duration::from_secs(20));
    assert_eq!(origins(&envoy, "log").len(), 1);
}

#[test]
fn client_gone_while_the_filter_holds_the_request_has_no_upstream() {
    // Pause at headers without allow_on_headers_stop_iteration: the request
    // never reaches the router.
    let mut envoy = probe(1);
    let id = envoy
        .start(
            0,
            Request::post("/up")
                .header("x-probe", "body")
                .chunks(["01234", "56789"]),
        )
        .unwrap();
    envoy.send_headers(id).unwrap();
    envoy.send_chunk(id).unwrap();
    envoy.reset_client(id).unwrap();
    seen(
        &one(&envoy, "log"),
        "downstream_remote_disconnect",
        &flags(16384, "DC"),
        NOT_FOUND,
        NOT_FOUND,
    );
}

#[test]
fn no_healthy_upstream_is_uh_without_a_host() {
    let (envoy, resp) = run(Reply::no_healthy_upstream());
    assert_eq!(
        (resp.status, resp.body_str().as_str()),
        (503, "no healthy upstream")
    );
    seen_throughout(
        &envoy,
        "no_healthy_upstream",
        &flags(2, "UH"),
        &code(503),
        NOT_FOUND,
    );
    assert_eq!(resp.upstream_address, None);
}

#[test]
fn circuit_breaker_overflow_is_uo_without_a_host() {
    let (envoy, resp) = run(Reply::overflow());
    assert_eq!(
        (resp.status, resp.body_str().as_str()),
        (
            503,
            "upstream connect error or disconnect/reset before headers. reset reason: overflow"
        )
    );
    seen_throughout(
        &envoy,
        "upstream_reset_before_response_started{overflow}",
        &flags(128, "UO"),
        &code(503),
        NOT_FOUND,
    );
}

#[test]
fn local_rate_limit_after_the_filter_is_rl_429() {
    let (envoy, resp) = run(Reply::rate_limited());
    assert_eq!(
        (resp.status, resp.body_str().as_str()),
        (429, "local_rate_limited")
    );
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    assert!(resp.local_reply);
    seen_throughout(
        &envoy,
        "local_rate_limited",
        &flags(2048, "RL"),
        &code(429),
        NOT_FOUND,
    );
}

#[test]
fn direct_response_route() {
    let (envoy, resp) = run(Reply::direct_response(200, "direct"));
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "direct"));
    seen_throughout(
        &envoy,
        "direct_response",
        &flags(0, ""),
        &code(200),
        NOT_FOUND,
    );
}

#[test]
fn router_local_replies_without_a_route_or_cluster() {
    let (envoy, resp) = run(Reply::local(
        404,
        code_details::ROUTE_NOT_FOUND,
        response_flags::NR,
    ));
    assert_eq!((resp.status, resp.body.len()), (404, 0));
    seen_throughout(
        &envoy,
        "route_not_found",
        &flags(256, "NR"),
        &code(404),
        NOT_FOUND,
    );
    let (envoy, _) = run(Reply::local(
        503,
        code_details::CLUSTER_NOT_FOUND,
        response_flags::NC,
    ));
    seen_throughout(
        &envoy,
        "cluster_not_found",
        &flags(16777216, "NC"),
        &code(503),
        NOT_FOUND,
    );
}

#[test]
fn filter_local_reply_carries_the_filters_details() {
    let mut envoy = probe(1);
    // The SDK's send_http_response passes no details: an empty string
    // (status Ok, no bytes), not NotFound.
    envoy
        .request(0, Request::get("/up").header("x-probe", "cas-absent-max"))
        .unwrap();
    seen_throughout(&envoy, "", &flags(0, ""), &code(200), NOT_FOUND);

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
        seen_throughout(&envoy, recorded, &flags(0, ""), &code(409), NOT_FOUND);
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
    seen_throughout(
        &envoy,
        "request_payload_too_large",
        &flags(0, ""),
        &code(413),
        ADDRESS,
    );
}

#[test]
fn failed_vm_reply_is_wasm_fail_stream() {
    let mut envoy = probe(1);
    let resp = envoy
        .request(0, Request::get("/").header("x-probe", "trap"))
        .unwrap();
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
    let call = |envoy: &mut Envoy, cluster: &str| {
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
