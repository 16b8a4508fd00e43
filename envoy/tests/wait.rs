//! Wait mode (`on_in_flight: "wait"`) in a real Envoy with 2 workers on the shared-data
//! store: concurrent duplicates get the first's answer, one waiter executes after a 5xx,
//! a wait that times out gets 409, and the access log says `waited`. (The etcd store and
//! a waiter on another proxy: `multi_proxy.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

const WAIT_CONFIG: &str = r#"{"key": {"required": true}, "on_in_flight": "wait",
    "wait_timeout_ms": 8000, "in_flight_timeout_seconds": 20}"#;

fn wait_stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| Stack::start("wait-main", &WAIT_CONFIG.replace('\n', " ")))
}

/// Sends `n` copies of `req` at once, each on its own connection.
fn burst(n: usize, req: &dedup_envoy::Request) -> Vec<dedup_envoy::Response> {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let barrier = barrier.clone();
            let req = req.clone();
            std::thread::spawn(move || {
                barrier.wait();
                wait_stack().send(&req)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn forty_concurrent_duplicates_execute_once_and_all_get_the_answer() {
    let s = wait_stack();
    let path = "/wait/forty";
    let req = post(path, "forty-1", &json!({"amount": 40}))
        .header("x-demo-delay-ms", "1500")
        .timeout(Duration::from_secs(20));
    let answers = burst(40, &req);
    assert_eq!(s.executions(path), 1, "exactly one upstream execution");
    let fresh: Vec<_> = answers.iter().filter(|r| !is_replayed(r)).collect();
    assert_eq!(fresh.len(), 1, "one fresh answer, 39 replays");
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.body, fresh[0].body, "every client gets the same answer");
    }
    assert!(s.counter("waited") >= 39);
    assert!(s.counter("wait_replayed") >= 39);
}

#[test]
fn after_a_5xx_exactly_one_waiter_executes_and_the_others_get_its_answer() {
    let s = wait_stack();
    let path = "/wait/release";
    let body = json!({"amount": 5});
    // The first fails slowly; the duplicates (same payload, other demo headers) wait.
    let failing = post(path, "release-1", &body)
        .header("x-demo-delay-ms", "1000")
        .header("x-demo-status", "503");
    let first = std::thread::spawn(move || wait_stack().send(&failing));
    s.wait_executions(path, 1, Duration::from_secs(5));
    let dup = post(path, "release-1", &body)
        .header("x-demo-delay-ms", "700")
        .timeout(Duration::from_secs(20));
    let answers = burst(10, &dup);
    assert_eq!(first.join().unwrap().status, 503);
    assert_eq!(s.executions(path), 2, "the 503, then exactly one waiter");
    let fresh: Vec<_> = answers.iter().filter(|r| !is_replayed(r)).collect();
    assert_eq!(fresh.len(), 1);
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.body, fresh[0].body);
    }
}

#[test]
fn a_wait_longer_than_wait_timeout_ms_gets_409() {
    let s = Stack::start(
        "wait-timeout",
        r#"{"key": {"required": true}, "on_in_flight": "wait", "wait_timeout_ms": 800, "retry_after_seconds": 3}"#,
    );
    let path = "/wait/timeout";
    let req = post(path, "timeout-1", &json!({"a": 1}));
    let slow = req.clone().header("x-demo-delay-ms", "3000");
    let addr = s.envoy.addr();
    let first = std::thread::spawn(move || dedup_envoy::client::send(addr, &slow).unwrap());
    s.wait_executions(path, 1, Duration::from_secs(5));
    let started = std::time::Instant::now();
    let dup = s.send(&req);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(dup.header("retry-after"), Some("3"));
    // Printed, not asserted (no timed assertions): about wait_timeout_ms.
    println!("the waiter was answered after {:?}", started.elapsed());
    assert_eq!(s.counter("wait_timeout"), 1);
    let first = first.join().unwrap();
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    assert_eq!(s.executions(path), 1);
    // The access log names the replay after waiting.
    let waiter = post(path, "timeout-2", &json!({"a": 2}));
    let slow = waiter.clone().header("x-demo-delay-ms", "300");
    let first = std::thread::spawn(move || dedup_envoy::client::send(addr, &slow).unwrap());
    s.wait_executions(path, 2, Duration::from_secs(5));
    assert!(is_replayed(&s.send(&waiter)));
    first.join().unwrap();
    let log_path = s.envoy.dir.join("stdout.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("dedup=waited") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no `dedup=waited` in the access log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
