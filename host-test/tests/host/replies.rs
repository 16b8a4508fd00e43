//! Local replies, resets, properties, logs, configuration, queues.

use crate::*;
use host_test::{Error, LogLevel, Reply, Request, SimEnvoy};

#[test]
fn local_reply_passes_through_the_response_callbacks() {
    let mut envoy = probe(1);
    let resp = envoy.request(0, get_probe("cas-absent-max", &[])).unwrap();
    assert!(resp.local_reply);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(
        resp.header("x-probe-response-seen"),
        Some("200"),
        "on_response_headers saw it"
    );
    assert_eq!(
        resp.header("content-length").map(str::to_string),
        Some(resp.body.len().to_string())
    );
    assert!(envoy.log_contains("probe log: probe=cas-absent-max status=200"));
}

#[test]
fn client_reset_runs_on_log_without_a_response() {
    let mut envoy = probe_builder()
        .allow_on_headers_stop_iteration(true)
        .build()
        .unwrap();
    let id = envoy
        .start(
            0,
            Request::post("/")
                .header("x-probe", "body")
                .chunks(["a", "b"]),
        )
        .unwrap();
    envoy.send_headers(id).unwrap();
    envoy.send_chunk(id).unwrap();
    envoy.reset_client(id).unwrap();
    let resp = envoy.response(id).unwrap();
    assert!(resp.reset);
    assert_eq!(resp.status, 0);
    assert!(envoy.log_contains("probe log: probe=body status=none"));
}

#[test]
fn upstream_reset_becomes_a_503_through_the_filter() {
    let resp = answering(Reply::reset())
        .request(0, Request::get("/"))
        .unwrap();
    assert_eq!(resp.status, 503);
    assert!(resp.body_str().starts_with("upstream connect error"));
    assert_eq!(resp.header("x-probe-response-seen"), Some("503"));
    assert!(resp.upstream_called);
}

#[test]
fn upstream_silence_becomes_a_504_at_the_route_timeout() {
    let mut envoy = answering(Reply::no_answer());
    let before = envoy.now();
    let resp = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(resp.status, 504);
    assert_eq!(resp.body_str(), "upstream request timeout");
    let waited = envoy.now().duration_since(before).unwrap();
    assert_eq!(waited.as_secs(), 15);
}

#[test]
fn properties_as_envoy_serves_them() {
    let mut envoy = probe_builder()
        .plugin_name("dedup")
        .root_id("root1")
        .build()
        .unwrap();
    let req = Request::post("/p?q=1")
        .header("x-probe", "props")
        .header("x-multi", "a")
        .header("x-multi", "b")
        .source_address("10.1.2.3:4567");
    let j = json(&envoy.request(0, req).unwrap());
    assert_eq!(j["request.path"], "/p?q=1");
    assert_eq!(j["request.method"], "POST");
    assert_eq!(j["request.host"], "localhost");
    assert_eq!(j["source.address"], "10.1.2.3:4567");
    assert_eq!(j["plugin_name"], "dedup");
    assert_eq!(j["plugin_root_id"], "root1");
    assert_eq!(j["plugin_vm_id"], "probe");
    assert_eq!(j["request.headers"]["x-multi"], "a,b");
    assert_eq!(j["request.headers"][":method"], "POST");
    assert_eq!(j["request.headers.x-probe"], "props");
}

#[test]
fn logs_are_captured_with_levels() {
    let mut envoy = probe_builder().log_level(LogLevel::Debug).build().unwrap();
    envoy.request(0, get_probe("log", &[])).unwrap();
    assert!(
        !envoy.log_contains("probe trace line"),
        "below the Envoy log level"
    );
    assert_eq!(
        envoy.log_lines(LogLevel::Debug, "probe debug line").len(),
        1
    );
    assert_eq!(
        envoy.log_lines(LogLevel::Warn, "probe warn line")[0].level,
        LogLevel::Warn
    );
    // stdout and stderr (WASI fd_write) become info and error lines.
    assert_eq!(
        envoy.log_lines(LogLevel::Info, "probe stdout line")[0].level,
        LogLevel::Info
    );
    assert_eq!(
        envoy.log_lines(LogLevel::Error, "probe stderr line")[0].level,
        LogLevel::Error
    );

    let mut quiet = probe(1);
    quiet.request(0, get_probe("log", &[])).unwrap();
    assert!(
        !quiet.log_contains("probe debug line"),
        "Envoy's default level is info"
    );
}

#[test]
fn rejected_configuration_carries_the_vm_log() {
    let err = build_error(probe_builder().plugin_config(r#"{"reject": true}"#));
    let Error::ConfigRejected { logs, .. } = &err else {
        panic!("expected ConfigRejected, got {err}");
    };
    assert!(logs
        .iter()
        .any(|l| l.message.contains("configuration rejected")));
    assert!(err.to_string().contains("configuration rejected"), "{err}");
}

#[test]
fn plugin_configuration_reaches_on_configure() {
    let envoy = probe_builder()
        .plugin_config(r#"{"x": 1}"#)
        .build()
        .unwrap();
    assert!(envoy.log_contains(r#"probe configured: {"x": 1}"#));
}

#[test]
fn shared_queue_notifies_the_registering_root_context() {
    let mut envoy = probe(2);
    let j = ask(&mut envoy, 0, get_probe("enqueue", &[("x-value", "hello")]));
    assert_eq!(j["resolve"], "Ok");
    assert_eq!(j["enqueue"], "Ok");
    assert_eq!(j["resolve_missing"], "NotFound");
    let lines = envoy.log_lines(LogLevel::Info, "probe dequeued: hello");
    assert_eq!(lines.len(), 1);
    // The last worker to register (worker 1) owns the notification.
    assert_eq!(lines[0].worker, 1);
    assert_eq!(envoy.counter("probe_queue_ready"), Some(1));
}

#[test]
fn empty_filter_module_needs_no_configuration() {
    let mut envoy = SimEnvoy::builder(host_test::dist("empty_filter.wasm"))
        .workers(3)
        .build()
        .unwrap();
    for w in 0..3 {
        assert_eq!(envoy.request(w, Request::get("/")).unwrap().status, 200);
    }
    assert_eq!(envoy.upstream_calls(), 3);
}

/// http_headers (host-test/examples), which logs every header it sees.
fn header_logger(suppress: bool) -> SimEnvoy {
    SimEnvoy::builder(host_test::dist("example_http_headers.wasm"))
        .suppress_envoy_headers(suppress)
        .build()
        .unwrap()
}

#[test]
fn the_router_times_an_upstream_answer_where_the_filter_sees_it() {
    let mut envoy = header_logger(false);
    let id = envoy.start(0, Request::get("/orders")).unwrap();
    envoy.send_request(id).unwrap();
    // The router tells the upstream how long it waits (the route timeout).
    let sent = envoy.upstream_request(id).unwrap();
    assert_eq!(
        sent.headers.last(),
        Some(&("x-envoy-expected-rq-timeout-ms".into(), "15000".into()))
    );
    envoy.advance(std::time::Duration::from_millis(250));
    let reply = Reply::ok().header("content-type", "text/plain").body("ok");
    envoy.respond(id, reply).unwrap();
    let resp = envoy.response(id).unwrap();
    let names: Vec<&str> = resp.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "content-type",
            "content-length",
            "x-envoy-upstream-service-time"
        ],
        "appended after the upstream's own headers"
    );
    assert_eq!(resp.header("x-envoy-upstream-service-time"), Some("250"));
    assert!(envoy.log_contains("#2 <- x-envoy-upstream-service-time: 250"));
    // Not on what Envoy answers itself.
    envoy.set_upstream(|_| Reply::connect_failure());
    let refused = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(refused.header("x-envoy-upstream-service-time"), None);
}

#[test]
fn suppress_envoy_headers_drops_the_router_s_headers() {
    let mut envoy = header_logger(true);
    let id = envoy.start(0, Request::get("/orders")).unwrap();
    envoy.send_request(id).unwrap();
    let sent = envoy.upstream_request(id).unwrap();
    assert!(sent.header("x-envoy-expected-rq-timeout-ms").is_none());
    envoy.respond(id, Reply::ok()).unwrap();
    let resp = envoy.response(id).unwrap();
    assert_eq!(resp.header("x-envoy-upstream-service-time"), None);
    assert!(!envoy.log_contains("x-envoy-upstream-service-time"));
}
