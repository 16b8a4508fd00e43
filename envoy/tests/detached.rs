//! Detached execution (`upstream.detached`) in a real Envoy with 2 workers: the filter
//! sends a key's first execution itself, so a client that times out before the
//! upstream answers still has its one execution recorded, and its retry gets the
//! replay. Calls that never reached the upstream release the key; a reset after the
//! request was sent keeps it as an unknown outcome. Rules pick the cluster
//! (envoy/tests/templates/hardening.yaml: `service`, and `refused`, where nothing
//! listens).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::paths::workspace_root;
use dedup_envoy::{EnvoyConfig, Request, Response};
use serde_json::json;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const IN_FLIGHT_SECS: u64 = 6;

fn detached() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        let config = json!({
            "in_flight_timeout_seconds": IN_FLIGHT_SECS,
            "upstream": {"detached": true, "cluster": "service", "timeout_ms": 5000},
            "rules": [{"name": "refused", "match": {"path_prefix": "/refused/"},
                       "upstream": {"detached": true, "cluster": "refused", "timeout_ms": 3000}},
                      {"name": "deadline", "match": {"path_prefix": "/deadline/"},
                       "upstream": {"detached": true, "cluster": "service", "timeout_ms": 5000,
                                    "client_timeout_ms": 1000}}],
        })
        .to_string();
        Stack::start_with("detached", |upstream_port, wasm| {
            let template = workspace_root().join("envoy/tests/templates/hardening.yaml");
            EnvoyConfig::from_template(&template, upstream_port, wasm, &config)
                .and_then(|c| c.with_port("RL_LISTEN_PORT"))
                .and_then(|c| c.with_port("DEAD_PORT"))
                .unwrap_or_else(|e| panic!("{e}"))
        })
    })
}

fn charge(path: &str, key: &str) -> Request {
    post(path, key, &json!({"amount": 5000, "currency": "eur"}))
}

/// Retries `req` with the SDK-like backoff (0.5 s doubling, at most 2 s) until it gets
/// something other than `409 in-flight`, or `limit` passes.
fn retry_until_answered(s: &Stack, req: &Request, limit: Duration) -> (Response, u32) {
    let end = Instant::now() + limit;
    let mut wait = Duration::from_millis(500);
    let mut tries = 0;
    loop {
        std::thread::sleep(wait);
        tries += 1;
        let r = s.send(req);
        let in_flight = r.status == 409 && String::from_utf8_lossy(&r.body).contains("in-flight");
        if !in_flight || Instant::now() > end {
            return (r, tries);
        }
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// The `order_id` the demo upstream gives each execution.
fn order_id(r: &Response) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v["order_id"].as_u64()
}

#[test]
fn a_client_that_times_out_gets_the_one_execution_on_retry() {
    let s = detached();
    let path = "/charges/timeout";
    let req = charge(path, "ch-timeout-1");
    // The upstream takes 3 s; the client gives up after 1 s.
    s.hang_up(
        &req.clone().header("x-demo-delay-ms", "3000"),
        Duration::from_secs(1),
    );
    let (replay, tries) = retry_until_answered(s, &req, Duration::from_secs(8));
    assert!(
        is_replayed(&replay),
        "after {tries} tries: {}",
        replay.summary()
    );
    assert_eq!(s.executions(path), 1, "one execution");
    // The one execution's answer: its status, headers and body, the same every time.
    assert_eq!(replay.status, 200, "{}", replay.summary());
    assert_eq!(replay.header("content-type"), Some("application/json"));
    let again = s.send(&req);
    assert!(is_replayed(&again));
    assert_eq!((again.status, &again.body), (replay.status, &replay.body));
    assert!(order_id(&replay).is_some(), "{}", replay.summary());
    assert!(s.counter("detached") >= 1);
    assert!(s.counter("detached_client_gone") >= 1);
}

#[test]
fn a_client_that_hangs_up_and_comes_back_20_s_later_gets_the_replay() {
    let s = detached();
    let path = "/charges/later";
    let req = charge(path, "ch-later-1");
    s.hang_up(
        &req.clone().header("x-demo-delay-ms", "1500"),
        Duration::from_millis(300),
    );
    // 20 s later: long past the call and the in-flight timeout.
    std::thread::sleep(Duration::from_secs(20));
    let replay = s.send(&req);
    assert!(is_replayed(&replay), "{}", replay.summary());
    assert_eq!(s.executions(path), 1);
}

#[test]
fn a_client_that_waits_is_answered_with_the_calls_answer_not_marked_replayed() {
    let s = detached();
    let path = "/charges/waits";
    let req = charge(path, "ch-waits-1");
    let first = s.send(&req.clone().header("x-demo-status", "201"));
    assert_eq!(first.status, 201, "{}", first.summary());
    assert!(!is_replayed(&first));
    assert_eq!(
        first.header("content-type"),
        Some("application/json"),
        "{}",
        first.summary()
    );
    let again = s.send(&req);
    assert!(is_replayed(&again));
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(s.executions(path), 1);
}

#[test]
fn a_refused_upstream_releases_the_key_and_a_reset_after_sending_keeps_it() {
    let s = detached();
    // Nothing listens behind `refused`: Envoy's 503 says the connection failed.
    let req = charge("/refused/charge", "ch-refused-1");
    let first = s.send(&req);
    assert_eq!(first.status, 503, "{}", first.summary());
    let released = s.counter("released");
    let second = s.send(&req);
    assert_eq!(
        second.status,
        503,
        "the retry ran again: {}",
        second.summary()
    );
    assert!(s.counter("released") > released, "{released}");
    // The upstream executes, then resets its connection: it may have run.
    let path = "/charges/reset";
    let req = charge(path, "ch-reset-1");
    let first = s.send(&req.clone().header("x-demo-fault", "reset"));
    assert_problem(&first, 502, "upstream-failed");
    for _ in 0..2 {
        assert_problem(&s.send(&req), 409, "outcome-unknown");
    }
    std::thread::sleep(Duration::from_secs(IN_FLIGHT_SECS + 1));
    assert_problem(&s.send(&req), 409, "outcome-unknown");
    assert_eq!(s.executions(path), 1, "an unknown outcome never runs again");
}

#[test]
fn at_the_client_deadline_the_client_gets_504_still_running_and_its_retry_the_answer() {
    let s = detached();
    let path = "/deadline/charge";
    let req = charge(path, "ch-deadline-1");
    let t0 = Instant::now();
    let first = s.send(&req.clone().header("x-demo-delay-ms", "2500"));
    assert_problem(&first, 504, "still-running");
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "answered after {:?}, not at the 1 s deadline",
        t0.elapsed()
    );
    let (replay, tries) = retry_until_answered(s, &req, Duration::from_secs(8));
    assert!(
        is_replayed(&replay),
        "after {tries} tries: {}",
        replay.summary()
    );
    assert_eq!(replay.status, 200);
    assert_eq!(s.executions(path), 1);
}
