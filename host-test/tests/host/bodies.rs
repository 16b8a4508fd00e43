//! Envoy's body buffering and the header pause, for both settings of
//! allow_on_headers_stop_iteration.

use crate::*;
use host_test::{Error, Reply, Request, SimEnvoy, StreamState};

fn body_probe(end: &str) -> Request {
    Request::post("/upload")
        .header("x-probe", "body")
        .header("x-body-end", end)
        .chunks(["abc", "defg", "hi"])
}

/// A body probe that continues its headers at once, then does `end` at the
/// end of the body.
fn continued(path: &str, end: &str) -> Request {
    let req = Request::post(path).header("x-probe", "body");
    with_headers(
        req,
        &[("x-headers-action", "continue"), ("x-body-end", end)],
    )
}

/// A one-worker probe with allow_on_headers_stop_iteration.
fn buffering() -> SimEnvoy {
    probe_builder()
        .allow_on_headers_stop_iteration(true)
        .build()
        .unwrap()
}

#[test]
fn pause_accumulates_and_end_of_stream_sees_the_whole_body() {
    let mut envoy = buffering();
    let resp = envoy.request(0, body_probe("reply")).unwrap();
    let j = json(&resp);
    assert_eq!(j["sizes"], "3,7,9", "each callback sees the whole buffer");
    assert_eq!(j["body"], "abcdefghi");
    assert!(!resp.upstream_called);
    assert!(!resp.upstream_headers_sent);
}

#[test]
fn continue_forwards_the_buffered_body_with_edited_headers() {
    let mut envoy = buffering();
    let resp = envoy.request(0, body_probe("continue")).unwrap();
    assert_eq!(resp.status, 200);
    let up = resp.upstream_request.unwrap();
    assert_eq!(up.body_str(), "abcdefghi");
    assert_eq!(up.header("x-probe-body-sizes"), Some("3,7,9"));
}

#[test]
fn body_rewrite_reaches_the_upstream() {
    let mut envoy = buffering();
    let resp = envoy.request(0, body_probe("rewrite")).unwrap();
    assert_eq!(
        resp.upstream_request.unwrap().body_str(),
        "rewritten by probe"
    );
}

#[test]
fn continue_per_chunk_forwards_each_chunk_alone() {
    let mut envoy = buffering();
    let req = continued("/u", "chunks").chunks(["abc", "defg", "hi"]);
    let resp = envoy.request(0, req).unwrap();
    let j = json(&resp);
    assert_eq!(
        j["sizes"], "3,4,2",
        "not buffering: each callback sees its chunk"
    );
    assert_eq!(j["body"], "hi");
    // The first chunks went upstream before the local reply; the request
    // never completed there.
    assert!(resp.upstream_headers_sent);
    assert!(!resp.upstream_called);
}

#[test]
fn without_allow_flag_pause_at_headers_stalls_the_stream() {
    let mut envoy = probe_builder().build().unwrap();
    let err = envoy.request(0, body_probe("reply")).unwrap_err();
    let Error::Stalled { stream, waiting } = err else {
        panic!("expected a stall, got {err}");
    };
    assert!(waiting.contains("StopAllIteration"), "{waiting}");
    assert_eq!(envoy.state(stream).unwrap(), StreamState::Open);
    assert_eq!(envoy.upstream_calls(), 0);
}

#[test]
fn without_allow_flag_resume_delivers_the_held_body_to_the_filter() {
    // Pause at headers, resume from a callout response: the body that
    // arrived meanwhile is handed to the filter, then forwarded.
    let mut envoy = probe_builder()
        .cluster("auth", |_| Reply::ok())
        .build()
        .unwrap();
    let req = Request::post("/r")
        .header("x-probe", "resume-after-call")
        .header("x-cluster", "auth")
        .body("payload");
    let resp = envoy.request(0, req).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.upstream_request.unwrap().body_str(), "payload");
}

#[test]
fn request_headers_are_gone_after_continue() {
    let mut envoy = buffering();
    let req = continued("/h", "header-status").body("x");
    let j = json(&envoy.request(0, req).unwrap());
    assert_eq!(j["replace"], "BadArgument");
    assert_eq!(j["get"], "BadArgument");
    assert_eq!(
        j["request.path"], "Ok(None)",
        "request.* properties are gone too"
    );
}

#[test]
fn setting_a_header_after_continue_traps_through_the_sdk() {
    // x-headers-action continue + x-body-end continue: the SDK setter
    // panics on BadArgument -> trap -> 503, as seen in Envoy.
    let mut envoy = buffering();
    let req = continued("/h", "continue").body("x");
    let resp = envoy.request(0, req).unwrap();
    assert_eq!(resp.status, 503);
    assert!(envoy.worker_failed(0));
    assert!(envoy.log_contains("unexpected status: 2"));
}

#[test]
fn step_by_step_body_chunks() {
    let mut envoy = buffering();
    let id = envoy.start(0, body_probe("continue")).unwrap();
    envoy.send_headers(id).unwrap();
    assert!(envoy.send_chunk(id).unwrap());
    assert!(envoy.send_chunk(id).unwrap());
    assert_eq!(envoy.upstream_request(id), None, "still buffering");
    assert!(!envoy.send_chunk(id).unwrap());
    let up = envoy.upstream_request(id).unwrap();
    assert_eq!(up.body_str(), "abcdefghi");
    envoy.respond(id, Reply::new(201).body("made")).unwrap();
    let resp = envoy.response(id).unwrap();
    assert_eq!((resp.status, resp.body_str().as_str()), (201, "made"));
}

#[test]
fn response_body_pause_buffers_and_can_be_replaced() {
    let mut envoy = answering(Reply::ok().chunks(["12345", "678"]));
    let resp = envoy.request(0, get_probe("resp-body", &[])).unwrap();
    assert_eq!(resp.body_str(), "response body seen: 8 bytes");
}

#[test]
fn buffering_beyond_the_buffer_limit_gets_envoys_413() {
    let mut envoy = probe_builder()
        .allow_on_headers_stop_iteration(true)
        .buffer_limit(8)
        .build()
        .unwrap();
    let resp = envoy.request(0, body_probe("reply")).unwrap();
    assert_eq!(resp.status, 413);
    assert_eq!(resp.body_str(), "Payload Too Large");
    assert_eq!(resp.header("x-probe-response-seen"), Some("413"));
}
