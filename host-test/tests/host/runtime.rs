//! Metrics, timers and the clock, callouts, traps.

use crate::*;
use host_test::{LogLevel, Reply, Request};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

#[test]
fn counters_reject_increments_of_zero_or_less() {
    let mut envoy = probe(2);
    let j = ask(&mut envoy, 0, get_probe("metrics", &[]));
    assert_eq!(j["counter_inc_1"], "Ok");
    assert_eq!(j["counter_inc_0"], "BadArgument");
    assert_eq!(j["counter_inc_neg"], "BadArgument");
    assert_eq!(j["counter_record_5"], "Ok");
    assert_eq!(j["counter_value"], 6);
    assert_eq!(j["gauge_inc_neg3"], "Ok");
    assert_eq!(j["gauge_value"], 7);
    assert_eq!(j["histogram_record"], "Ok");
    assert_eq!(j["histogram_inc"], "BadArgument");
    assert_eq!(j["histogram_get"], "BadArgument");
    assert_eq!(j["unknown_inc"], "NotFound");
    // Metrics are process-wide: the other worker adds to the same counter.
    envoy.request(1, get_probe("metrics", &[])).unwrap();
    assert_eq!(envoy.counter("probe_counter"), Some(12));
    assert_eq!(
        envoy.metric("probe_histogram").unwrap().samples,
        vec![42, 42]
    );
}

#[test]
fn ticks_follow_the_virtual_clock_per_worker() {
    let mut envoy = probe_builder()
        .workers(2)
        .plugin_config(r#"{"tick_ms": 100}"#)
        .build()
        .unwrap();
    assert_eq!(envoy.counter("probe_ticks"), Some(0));
    envoy.advance(Duration::from_millis(99));
    assert_eq!(envoy.counter("probe_ticks"), Some(0));
    envoy.advance(Duration::from_millis(1));
    assert_eq!(
        envoy.counter("probe_ticks"),
        Some(3),
        "one per worker, one on the main thread"
    );
    envoy.advance(Duration::from_secs(1));
    assert_eq!(envoy.counter("probe_ticks"), Some(33));
}

#[test]
fn ticks_only_on_workers_without_the_main_thread_vm() {
    let mut envoy = probe_builder()
        .workers(2)
        .main_thread_vm(false)
        .plugin_config(r#"{"tick_ms": 100}"#)
        .build()
        .unwrap();
    envoy.advance(Duration::from_millis(100));
    assert_eq!(envoy.counter("probe_ticks"), Some(2), "one per worker");
}

#[test]
fn ticks_fire_on_the_main_thread_vm_first_then_the_workers() {
    let mut envoy = probe_builder()
        .workers(2)
        .log_level(LogLevel::Debug)
        .plugin_config(r#"{"tick_ms": 100}"#)
        .build()
        .unwrap();
    envoy.advance(Duration::from_millis(200));
    let order: Vec<usize> = envoy
        .logs()
        .iter()
        .filter(|l| l.message.starts_with("probe tick at"))
        .map(|l| l.worker)
        .collect();
    // The main thread's VM is `workers()` (2): Envoy starts it first, so in
    // each period its timer fires before the workers'.
    assert_eq!(order, vec![2, 0, 1, 2, 0, 1]);
}

/// hello_world (host-test/examples) as the SDK ships it, a bootstrap singleton.
fn hello_singleton() -> SimEnvoy {
    SimEnvoy::builder(host_test::dist("example_hello_world.wasm"))
        .bootstrap_singleton(true)
        .build()
        .unwrap()
}

#[test]
fn a_bootstrap_singleton_starts_twice_and_ticks_once_per_period() {
    let mut envoy = hello_singleton();
    assert_eq!(envoy.workers(), 0);
    let lines = |e: &SimEnvoy, text: &str| -> Vec<usize> {
        e.logs()
            .iter()
            .filter(|l| l.message.contains(text))
            .map(|l| l.worker)
            .collect()
    };
    // The copy Envoy configures first, then the main thread's VM: both on the
    // main thread (the VM after the workers, of which there are none).
    assert_eq!(lines(&envoy, "Hello, World!").len(), 2);
    envoy.advance(Duration::from_millis(4_999));
    assert!(lines(&envoy, "lucky number").is_empty());
    envoy.advance(Duration::from_millis(1));
    assert_eq!(lines(&envoy, "lucky number"), vec![0]);
    envoy.advance(Duration::from_secs(10));
    assert_eq!(lines(&envoy, "lucky number"), vec![0, 0, 0]);
    assert!(matches!(
        envoy.start(0, Request::get("/")),
        Err(host_test::Error::Usage(_))
    ));
}

#[test]
fn the_same_module_as_an_http_filter_starts_three_times_and_ticks_twice() {
    let mut envoy = SimEnvoy::builder(host_test::dist("example_hello_world.wasm"))
        .build()
        .unwrap();
    let count =
        |e: &SimEnvoy, text: &str| e.logs().iter().filter(|l| l.message.contains(text)).count();
    assert_eq!(count(&envoy, "Hello, World!"), 3);
    envoy.advance(Duration::from_secs(5));
    assert_eq!(count(&envoy, "lucky number"), 2);
}

#[test]
fn time_comes_from_the_virtual_clock() {
    let mut envoy = probe(1);
    let t0 = ask(&mut envoy, 0, get_probe("time", &[]));
    envoy.advance(Duration::from_secs(60));
    let t1 = ask(&mut envoy, 0, get_probe("time", &[]));
    let d = t1["proxy_time_ns"].as_u64().unwrap() - t0["proxy_time_ns"].as_u64().unwrap();
    assert_eq!(d, 60_000_000_000);
    assert_eq!(
        t1["proxy_time_ns"], t1["wasi_time_ns"],
        "WASI realtime is the same clock"
    );
}

fn call(
    envoy: &mut host_test::SimEnvoy,
    cluster: &str,
    extra: &[(&str, &str)],
) -> serde_json::Value {
    let req = Request::post("/")
        .header("x-probe", "http-call")
        .header("x-cluster", cluster);
    ask(envoy, 0, with_headers(req, extra))
}

#[test]
fn http_call_to_in_process_clusters() {
    let mut envoy = probe_builder()
        .cluster("ok", |req| {
            assert_eq!(req.header(":authority"), Some("probe.local"));
            assert_eq!(req.body_str(), "callout body");
            Reply::new(201).header("x-from", "cluster").body("pong")
        })
        .cluster("reset", |_| Reply::reset())
        .cluster("silent", |_| Reply::no_answer())
        .build()
        .unwrap();
    let j = call(&mut envoy, "ok", &[]);
    assert_eq!(j["status"], "201");
    assert_eq!(j["headers"]["x-from"], "cluster");
    assert_eq!(j["body"], "pong");

    let j = call(&mut envoy, "reset", &[]);
    assert_eq!(j["num_headers"], 0);
    assert_eq!(j["status"], serde_json::Value::Null);

    let before = envoy.now();
    let j = call(&mut envoy, "silent", &[("x-timeout-ms", "250")]);
    assert_eq!(j["status"], "504");
    assert_eq!(j["body"], "upstream request timeout");
    assert_eq!(
        envoy.now().duration_since(before).unwrap(),
        Duration::from_millis(250)
    );

    let j = call(&mut envoy, "nope", &[]);
    assert_eq!(j["dispatch"], "BadArgument");
    let j = call(&mut envoy, "ok", &[("x-omit-authority", "1")]);
    assert_eq!(j["dispatch"], "BadArgument");
}

/// A one-shot HTTP/1.1 server on loopback: answers each connection with
/// `reply` after `delay`. Stops after `max` connections.
fn serve(reply: &'static str, delay: Duration, max: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(max) {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(12).any(|w| w == b"callout body") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            std::thread::sleep(delay);
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    addr
}

#[test]
fn http_call_over_loopback_tcp() {
    let addr = serve(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello",
        Duration::ZERO,
        1,
    );
    let slow = serve(
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        Duration::from_millis(600),
        1,
    );
    // A port nobody listens on: bind, read the port, close.
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut envoy = probe_builder()
        .cluster_addr("real", &addr)
        .cluster_addr("slow", &slow)
        .cluster_addr("refused", &refused)
        .build()
        .unwrap();
    let j = call(&mut envoy, "real", &[]);
    assert_eq!(j["status"], "200");
    assert_eq!(j["body"], "hello");
    assert_eq!(j["headers"]["content-type"], "text/plain");

    let j = call(&mut envoy, "slow", &[("x-timeout-ms", "100")]);
    assert_eq!(j["status"], "504");
    assert_eq!(j["body"], "upstream request timeout");

    let j = call(&mut envoy, "refused", &[]);
    assert_eq!(j["status"], "503");
}

#[test]
fn trap_fails_the_stream_and_the_worker_only() {
    let mut envoy = probe(2);
    let resp = envoy.request(0, get_probe("trap", &[])).unwrap();
    assert_eq!(resp.status, 503);
    assert!(!resp.upstream_called);
    assert!(envoy.worker_failed(0));
    assert!(!envoy.worker_failed(1));
    assert!(
        envoy.log_contains("probe: trap requested"),
        "the SDK panic hook logs first"
    );
    // Envoy's words and level for the trap (V8: a Rust panic ends in
    // `unreachable`); wasmtime's backtrace is not at this level.
    let trap = envoy.log_lines(LogLevel::Trace, "Function: proxy_on_request_headers failed");
    assert_eq!(trap.len(), 1, "{trap:?}");
    assert_eq!(trap[0].level, LogLevel::Error);
    assert_eq!(
        trap[0].message,
        "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable"
    );

    // Later streams on the failed worker: 503 at once, upstream untouched.
    let resp = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(resp.status, 503);
    assert_eq!(resp.header("x-probe-response-seen"), None);
    assert_eq!(envoy.upstream_calls(), 0);
    // The other worker is fine.
    let resp = envoy.request(1, Request::get("/")).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-probe-response-seen"), Some("200"));
}

#[test]
fn a_trap_s_wasmtime_backtrace_is_logged_at_debug_level() {
    let mut envoy = probe_builder().log_level(LogLevel::Debug).build().unwrap();
    envoy.request(0, get_probe("trap", &[])).unwrap();
    let debug: Vec<_> = envoy
        .logs()
        .into_iter()
        .filter(|l| {
            l.message
                .starts_with("Function: proxy_on_request_headers failed")
        })
        .map(|l| (l.level, l.message))
        .collect();
    assert_eq!(debug.len(), 2, "{debug:?}");
    assert_eq!(debug[0].0, LogLevel::Error);
    assert_eq!(debug[1].0, LogLevel::Debug);
    assert!(debug[1].1.contains("wasm backtrace"), "{}", debug[1].1);
}

#[test]
fn trap_in_the_body_callback_after_headers_went_upstream() {
    let mut envoy = probe(1);
    let resp = envoy
        .request(
            0,
            Request::post("/")
                .header("x-probe", "continue-then-trap")
                .body("x"),
        )
        .unwrap();
    assert_eq!(resp.status, 503);
    assert!(resp.upstream_headers_sent);
    assert!(!resp.upstream_called);
}

#[test]
fn fail_open_passes_streams_through_a_failed_vm() {
    let mut envoy = probe_builder().fail_open(true).build().unwrap();
    let resp = envoy.request(0, get_probe("trap", &[])).unwrap();
    assert_eq!(resp.status, 200);
    assert!(resp.upstream_called);
    assert!(envoy.worker_failed(0));
    let resp = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-probe-response-seen"), None, "filter skipped");
}

#[test]
fn held_callouts_keep_the_stream_waiting_until_released() {
    let mut envoy = probe_builder()
        .cluster("auth", |_| Reply::new(204))
        .build()
        .unwrap();
    envoy.hold_callouts(true);
    let id = envoy
        .start(
            0,
            Request::get("/")
                .header("x-probe", "http-call")
                .header("x-cluster", "auth"),
        )
        .unwrap();
    envoy.send_request(id).unwrap();
    assert_eq!(envoy.held_callouts(), 1);
    assert_eq!(envoy.response(id), None);
    envoy.release_callouts();
    let j = json(&envoy.response(id).unwrap());
    assert_eq!(j["status"], "204");
}
