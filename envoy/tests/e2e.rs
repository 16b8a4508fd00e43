//! The filter's contract (README) in a real Envoy with 2 workers: one shared
//! Envoy for the default-like configuration, one Envoy each for TTL, scopes,
//! JSON-pointer keys and keyless fingerprints, and refused configurations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::Request;
use serde_json::json;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

const MAIN_CONFIG: &str =
    r#"{"key": {"required": true}, "max_body_bytes": 65536, "retry_after_seconds": 2}"#;

/// Shared by the tests below; each uses its own paths and keys. A static is
/// never dropped: Envoy dies with the test process (PR_SET_PDEATHSIG).
fn main_stack() -> &'static Stack {
    static MAIN: OnceLock<Stack> = OnceLock::new();
    MAIN.get_or_init(|| Stack::start("e2e-main", MAIN_CONFIG))
}

#[test]
fn first_request_executes_and_a_repeat_is_replayed() {
    let s = main_stack();
    let path = "/orders/replay";
    let req = post(path, "replay-1", &json!({"item": "book", "qty": 1}));
    let first = s.send(&req);
    assert_executed(&first);
    assert_eq!(json(&first)["executions"], 1);
    let second = s.send(&req);
    assert_replay_of(&second, &first);
    let third = s.send(&req);
    assert_replay_of(&third, &first);
    assert_eq!(s.executions(path), 1, "the upstream ran a duplicate");
}

#[test]
fn duplicate_while_in_flight_gets_409_with_retry_after() {
    let s = main_stack();
    let path = "/orders/in-flight";
    let req = post(path, "in-flight-1", &json!({"item": "slow"}));
    let slow = req.clone().header("x-demo-delay-ms", "3000");
    let first = s.send_in_background(slow, 1);
    let dup = s.send(&req);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(
        dup.header("retry-after"),
        Some("2"),
        "retry-after from retry_after_seconds"
    );
    let first = first.join().unwrap();
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    assert_eq!(s.executions(path), 1);
}

#[test]
fn same_key_with_another_payload_gets_422() {
    let s = main_stack();
    let path = "/orders/mismatch";
    let first = s.send(&post(path, "mismatch-1", &json!({"amount": 10})));
    assert_executed(&first);
    let other_body = s.send(&post(path, "mismatch-1", &json!({"amount": 11})));
    assert_problem(&other_body, 422, "payload-mismatch");
    let other_path = s.send(&post(
        "/orders/mismatch-other",
        "mismatch-1",
        &json!({"amount": 10}),
    ));
    assert_problem(&other_path, 422, "payload-mismatch");
    let other_method = s.send(
        &Request::new("PATCH", path)
            .key("mismatch-1")
            .json(&json!({"amount": 10})),
    );
    assert_problem(&other_method, 422, "payload-mismatch");
    assert_eq!(s.executions(path), 1);
    assert_eq!(s.executions("/orders/mismatch-other"), 0);
}

#[test]
fn missing_key_gets_400_when_required() {
    let s = main_stack();
    let path = "/orders/no-key";
    let r = s.send(&Request::post(path).json(&json!({"a": 1})));
    assert_problem(&r, 400, "missing-key");
    assert_eq!(s.executions(path), 0);
}

#[test]
fn too_long_or_control_character_keys_get_400() {
    let s = main_stack();
    let path = "/orders/bad-key";
    let long = "k".repeat(256);
    assert_problem(&s.send(&post(path, &long, &json!({}))), 400, "invalid-key");
    assert_problem(
        &s.send(&post(path, "tab\there", &json!({}))),
        400,
        "invalid-key",
    );
    assert_eq!(s.executions(path), 0);
    // The limit itself is fine.
    let ok = s.send(&post(path, &"k".repeat(255), &json!({})));
    assert_executed(&ok);
    assert_eq!(s.executions(path), 1);
}

#[test]
fn get_and_other_methods_pass_untouched() {
    let s = main_stack();
    let path = "/orders/get";
    for _ in 0..2 {
        let r = s.send(&Request::get(path).key("get-1"));
        assert_executed(&r);
        // key.required applies only to deduplicated methods.
        let r = s.send(&Request::get(path));
        assert_executed(&r);
        let r = s.send(&Request::new("PUT", path).key("get-1").body("x"));
        assert_executed(&r);
    }
    assert_eq!(s.executions(path), 6);
}

#[test]
fn upstream_5xx_releases_the_claim_and_a_retry_executes() {
    let s = main_stack();
    let path = "/orders/flaky";
    let req = post(path, "flaky-1", &json!({"charge": 5}));
    let failed = s.send(&req.clone().header("x-demo-status", "503"));
    assert_eq!(
        failed.status,
        503,
        "the upstream's 503 passes through: {}",
        failed.summary()
    );
    assert!(!is_replayed(&failed));
    assert_runs_again_then_replays(s, &req);
    assert_eq!(s.executions(path), 2);
}

#[test]
fn chunked_bodies_are_decided_at_the_end_of_the_body() {
    let s = main_stack();
    let path = "/orders/chunked";
    let parts = |b: &str| -> Vec<Vec<u8>> { b.as_bytes().chunks(7).map(<[u8]>::to_vec).collect() };
    let body = r#"{"item": "chunked", "qty": 3, "note": "sent in pieces"}"#;
    let chunked = Request::post(path)
        .key("chunked-1")
        .header("content-type", "application/json")
        .chunked(parts(body), Duration::from_millis(20));
    let first = s.send(&chunked);
    assert_executed(&first);
    assert_replay_of(&s.send(&chunked), &first);
    // The same body with content-length is the same payload.
    assert_replay_of(
        &s.send(&Request::post(path).key("chunked-1").body(body)),
        &first,
    );
    let changed = Request::post(path)
        .key("chunked-1")
        .chunked(parts(&body.replace('3', "4")), Duration::ZERO);
    assert_problem(&s.send(&changed), 422, "payload-mismatch");
    assert_eq!(s.executions(path), 1);

    // A slow chunked request does not claim its key at the headers: a
    // duplicate whose body completes first executes, and the slow one, once
    // its body is complete, is answered by the filter; the upstream never
    // sees it.
    let path = "/orders/chunked-race";
    let slow = Request::post(path)
        .key("chunked-race-1")
        .chunked(parts(body), Duration::from_millis(300));
    let slow = std::thread::spawn(move || main_stack().send(&slow));
    std::thread::sleep(Duration::from_millis(250));
    let fast = s.send(&Request::post(path).key("chunked-race-1").body(body));
    assert_executed(&fast);
    let slow = slow.join().unwrap();
    assert_replay_of(&slow, &fast);
    assert_eq!(s.executions(path), 1, "the upstream saw a duplicate");
}

#[test]
fn a_burst_over_40_connections_executes_once() {
    let s = main_stack();
    let path = "/orders/burst";
    const N: usize = 40;
    let before_workers = s.envoy.connections_per_worker().unwrap();
    let burst = |delay: &str| {
        let barrier = Arc::new(Barrier::new(N));
        let req = post(path, "burst-1", &json!({"item": "burst", "qty": 40}))
            .header("x-demo-delay-ms", delay);
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let (barrier, req) = (barrier.clone(), req.clone());
                std::thread::spawn(move || {
                    let conn = dedup_envoy::client::Connection::open(
                        main_stack().envoy.addr(),
                        Duration::from_secs(5),
                    );
                    // Wait even if the connect failed, or the others hang.
                    barrier.wait();
                    conn.and_then(|mut c| c.send(&req)).unwrap()
                })
            })
            .collect::<Vec<_>>();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    };
    // Note: the payload excludes headers, so every request is the same payload.
    let answers = burst("300");
    let executed: Vec<_> = answers
        .iter()
        .filter(|r| r.status == 200 && !is_replayed(r))
        .collect();
    assert_eq!(
        executed.len(),
        1,
        "exactly one execution, got {:?}",
        answers.iter().map(|r| r.summary()).collect::<Vec<_>>()
    );
    for r in &answers {
        if r.status == 409 {
            assert_problem(r, 409, "in-flight");
        } else {
            assert_eq!(r.status, 200, "{}", r.summary());
            if is_replayed(r) {
                assert_replay_of(r, executed[0]);
            }
        }
    }
    assert_eq!(s.executions(path), 1, "the upstream ran a duplicate");
    // After completion every duplicate is a replay.
    let again = burst("0");
    for r in &again {
        assert_replay_of(r, executed[0]);
    }
    assert_eq!(s.executions(path), 1);
    let after_workers = s.envoy.connections_per_worker().unwrap();
    assert_eq!(after_workers.len(), 2, "two workers: {after_workers:?}");
    for (b, a) in before_workers.iter().zip(&after_workers) {
        assert!(a > b, "every worker took part of the burst: before {before_workers:?} after {after_workers:?}");
    }
}

#[test]
fn body_above_max_body_bytes_gets_413() {
    let s = main_stack();
    let path = "/orders/big";
    let r = s.send(&Request::post(path).key("big-1").body(vec![b'a'; 100_000]));
    assert_problem(&r, 413, "body-too-large");
    assert_eq!(s.executions(path), 0);
}

#[test]
fn filter_metrics_are_in_stats_and_prometheus() {
    let s = main_stack();
    let before = s.envoy.dedup_counters().unwrap();
    let path = "/orders/metrics";
    let req = post(path, "metrics-1", &json!({"m": 1}));
    assert_executed(&s.send(&req));
    assert!(is_replayed(&s.send(&req)));
    assert_problem(
        &s.send(&post(path, "metrics-1", &json!({"m": 2}))),
        422,
        "payload-mismatch",
    );
    assert_problem(&s.send(&Request::post(path).body("{}")), 400, "missing-key");
    let after = s.envoy.dedup_counters().unwrap();
    let names = [
        "requests",
        "executed",
        "replayed",
        "rejected_in_flight",
        "rejected_completed",
        "payload_mismatch",
        "bad_key",
        "bypassed",
        "store_errors",
        "failed_open",
        "evictions_unexpired",
        "released",
        "body_too_large",
        "response_not_stored",
    ];
    for n in names {
        assert!(
            after.contains_key(n),
            "wasmcustom.proxy_dedup_{n} missing from /stats: {after:?}"
        );
    }
    let grew = |n: &str, by: u64| {
        let (b, a) = (before.get(n).copied().unwrap_or(0), after[n]);
        assert!(a >= b + by, "proxy_dedup_{n}: {b} -> {a}, expected +{by}");
    };
    grew("requests", 4);
    grew("executed", 1);
    grew("replayed", 1);
    grew("payload_mismatch", 1);
    grew("bad_key", 1);
    let prom = s.envoy.prometheus().unwrap();
    for n in names {
        assert!(
            prom.lines()
                .any(|l| !l.starts_with('#') && l.contains(&format!("proxy_dedup_{n}"))),
            "proxy_dedup_{n} missing from /stats/prometheus"
        );
    }
}

#[test]
fn ttl_expiry_lets_the_key_execute_again() {
    let s = Stack::start("e2e-ttl", r#"{"ttl_seconds": 2}"#);
    let path = "/orders/ttl";
    let req = post(path, "ttl-1", &json!({"t": 1}));
    let first = s.send(&req);
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    std::thread::sleep(Duration::from_millis(3200));
    let later = s.send(&req);
    assert_executed(&later);
    assert_ne!(json(&later)["order_id"], json(&first)["order_id"]);
    assert_eq!(s.executions(path), 2);
}

#[test]
fn scopes_isolate_tenants_and_envoy_buffer_limit_gives_413() {
    let s = Stack::start(
        "e2e-scope",
        r#"{"scope": {"headers": ["x-tenant"]}, "max_body_bytes": 4194304}"#,
    );
    let path = "/orders/scoped";
    let req = post(path, "shared-key", &json!({"same": "body"}));
    let a = s.send(&req.clone().header("x-tenant", "alpha"));
    assert_executed(&a);
    assert_eq!(json(&a)["tenant"], "alpha");
    let b = s.send(&req.clone().header("x-tenant", "beta"));
    assert_executed(&b);
    assert_eq!(
        json(&b)["tenant"],
        "beta",
        "tenant beta got another tenant's response"
    );
    // No scope header is the empty scope: a third namespace.
    let none = s.send(&req);
    assert_executed(&none);
    assert_replay_of(&s.send(&req.clone().header("x-tenant", "alpha")), &a);
    assert_replay_of(&s.send(&req.clone().header("x-tenant", "beta")), &b);
    assert_eq!(s.executions(path), 3);

    // The filter may read up to 4 MiB, but the listener buffers at most 1 MiB:
    // Envoy itself answers 413 and the upstream is never contacted.
    let path = "/orders/huge";
    let r = s.send(
        &Request::post(path)
            .key("huge-1")
            .body(vec![b'x'; 2 * 1024 * 1024])
            .timeout(Duration::from_secs(10)),
    );
    assert_eq!(r.status, 413, "{}", r.summary());
    assert_eq!(s.executions(path), 0);
}

#[test]
fn json_pointer_keys() {
    let s = Stack::start("e2e-pointer", r#"{"key": {"json_pointer": "/msgId"}}"#);
    let path = "/messages";
    let msg = json!({"msgId": "m-1", "text": "hello"});
    let first = s.send(&Request::post(path).json(&msg));
    assert_executed(&first);
    assert_replay_of(&s.send(&Request::post(path).json(&msg)), &first);
    let changed = json!({"msgId": "m-1", "text": "changed"});
    assert_problem(
        &s.send(&Request::post(path).json(&changed)),
        422,
        "payload-mismatch",
    );
    assert_eq!(s.executions(path), 1);

    let int = json!({"msgId": 42, "text": "integer id"});
    let first_int = s.send(&Request::post(path).json(&int));
    assert_executed(&first_int);
    assert_replay_of(&s.send(&Request::post(path).json(&int)), &first_int);
    assert_eq!(s.executions(path), 2);

    let obj = json!({"msgId": {"nested": true}});
    assert_problem(&s.send(&Request::post(path).json(&obj)), 400, "invalid-key");

    // A header key wins over the pointer.
    let with_header = s.send(&Request::post(path).key("header-key").json(&msg));
    assert_executed(&with_header);
    assert_eq!(s.executions(path), 3);

    // No key anywhere and not required: passed through, every time.
    let keyless = json!({"text": "no id"});
    assert_executed(&s.send(&Request::post(path).json(&keyless)));
    assert_executed(&s.send(&Request::post(path).json(&keyless)));
    assert_eq!(s.executions(path), 5);
}

#[test]
fn keyless_fingerprint_mode() {
    let s = Stack::start(
        "e2e-fingerprint",
        r#"{"key": {"fingerprint": ["method", "path", "body"]}}"#,
    );
    let path = "/webhooks/push";
    let event = json!({"event": "paid", "invoice": 7});
    let first = s.send(&Request::post(path).json(&event));
    assert_executed(&first);
    assert_replay_of(&s.send(&Request::post(path).json(&event)), &first);
    // Another body is another fingerprint: it executes.
    let other = s.send(&Request::post(path).json(&json!({"event": "paid", "invoice": 8})));
    assert_executed(&other);
    // Another path too.
    assert_executed(&s.send(&Request::post("/webhooks/other").json(&event)));
    assert_eq!(s.executions(path), 2);
    assert_eq!(s.executions("/webhooks/other"), 1);
}

#[test]
fn envoy_refuses_a_bad_filter_config_naming_the_field() {
    assert_refused_naming_the_field(
        "e2e-bad-config",
        &[
            (r#"{"ttl_seconds": "x"}"#, "ttl_seconds"),
            (r#"{"no_such_field": 1}"#, "no_such_field"),
            (r#"{"capacity": 1}"#, "capacity"),
        ],
    );
}

#[test]
fn access_log_lines_show_each_decision_and_the_record() {
    let s = Stack::start("e2e-access-log", r#"{"in_flight_timeout_seconds": 10}"#);
    let path = "/orders/logged";
    let body = json!({"item": "pen"});
    let first = s.send(&post(path, "log-1", &body));
    assert_executed(&first);
    assert!(is_replayed(&s.send(&post(path, "log-1", &body))));
    assert_eq!(
        s.send(&post(path, "log-1", &json!({"item": "ink"}))).status,
        422
    );
    // A GET skips the filter in Envoy (the template's matcher: no policy
    // deduplicates GET); a POST without a key enters it and is bypassed.
    assert_eq!(s.send(&Request::get(path)).status, 200);
    assert_eq!(s.send(&Request::post(path).body("{}")).status, 200);
    let twice = post(path, "log-2", &body).header("idempotency-key", "log-3");
    assert_eq!(s.send(&twice).status, 400);
    // A client that gives up while the upstream works: the outcome is unknown.
    let slow = post(path, "log-4", &body).header("x-demo-delay-ms", "1500");
    s.hang_up(&slow, Duration::from_millis(300));
    // Its duplicate gets `in-flight` until Envoy ends the first stream, then
    // `outcome-unknown` (the record is kept until its TTL).
    let held = s.send(&post(path, "log-4", &body));
    let dup = if String::from_utf8_lossy(&held.body).contains("outcome-unknown") {
        assert_problem(&held, 409, "outcome-unknown");
        "rejected_outcome_unknown"
    } else {
        assert_problem(&held, 409, "in-flight");
        "in_flight"
    };
    let dup_decision = format!("dedup={dup}");
    let wanted = [
        "dedup=executed",
        "dedup=replayed",
        "dedup=mismatch",
        "dedup=bypassed",
        "dedup=bad_key",
        dup_decision.as_str(),
    ];
    let log = s.access_log_with(&wanted);
    // The executed request and its replay name the same record.
    let record_of = |decision: &str| {
        log.lines()
            .find(|l| l.contains(&format!("dedup={decision} ")))
            .and_then(|l| l.split("record=").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string)
            .unwrap_or_default()
    };
    let executed = record_of("executed");
    assert_eq!(executed.len(), 12, "{log}");
    assert_eq!(record_of("replayed"), executed);
    assert!(log.contains("dedup=bypassed record=-"), "{log}");
    let get = log
        .lines()
        .find(|l| l.contains(&format!("\"GET {path}\"")))
        .unwrap_or_default();
    assert!(get.contains("dedup=- record=- rule=-"), "{log}");
}

#[test]
fn a_push_redelivery_with_a_new_attempt_is_replayed_and_a_changed_message_is_422() {
    let config = r#"{"key": {"json_pointer": "/message/messageId", "required": true},
        "payload": {"ignore_json_pointers": ["/deliveryAttempt"]}, "store_statuses": ["2xx"]}"#;
    let s = Stack::start("e2e-push", &config.replace('\n', " "));
    let path = "/push/orders";
    let push = |attempt: u32, data: &str| {
        Request::post(path).json(&json!({
            "message": {"messageId": "msg-7", "data": data, "attributes": {"kind": "order"}},
            "deliveryAttempt": attempt,
            "subscription": "projects/p/subscriptions/orders"
        }))
    };
    let first = s.send(&push(1, "eyJpZCI6MX0="));
    assert_executed(&first);
    let again = s.send(&push(2, "eyJpZCI6MX0="));
    assert_replay_of(&again, &first);
    let changed = s.send(&push(3, "eyJpZCI6Mn0="));
    assert_problem(&changed, 422, "payload-mismatch");
    assert_eq!(s.executions(path), 1);
}

/// The filter asks Envoy for its log level once per request (not per debug line):
/// a level changed at runtime on Envoy's admin port applies from the next request on.
#[test]
fn a_log_level_changed_at_runtime_applies_to_the_next_request() {
    let s = Stack::start("e2e-log-level", "{}");
    let path = "/orders/log-level";
    let body = json!({"item": "pen"});
    assert_executed(&s.send(&post(path, "level-1", &body)));
    assert!(
        !s.envoy.log().contains("claimed; forwarding"),
        "a debug line at info level:\n{}",
        s.envoy.log()
    );
    let r = dedup_envoy::client::send(s.envoy.admin_addr(), &Request::post("/logging?wasm=debug"))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_executed(&s.send(&post(path, "level-2", &body)));
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    let log = loop {
        let log = s.envoy.log();
        if log.contains("claimed; forwarding") || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        log.contains("claimed; forwarding"),
        "no debug line after the level changed:\n{log}"
    );
}

/// Expiry advertised (shared data): a 409 in flight names the claim's in-flight end, a
/// replay its record's expiry (TTL after completion) and its age, each against the wall
/// clock within a second; `advertise_expiry: false` sends neither.
#[test]
fn replays_and_409s_say_when_the_record_stops_answering() {
    let s = main_stack();
    let path = "/orders/expiry";
    let req = post(path, "expiry-1", &json!({"item": "clock"}));
    let slow = req.clone().header("x-demo-delay-ms", "2000");
    let claimed_at = unix_now();
    let first = s.send_in_background(slow, 1);
    let dup = s.send(&req);
    let seen_claimed = unix_now();
    assert_problem(&dup, 409, "in-flight");
    // The default in_flight_timeout_seconds: 30, from the claim (made between the two
    // readings).
    assert_expires_within(
        &dup,
        claimed_at + 30.0,
        seen_claimed + 30.0,
        "409 in-flight",
    );
    assert_eq!(dup.header("age"), None, "a 409 has no age");
    assert_eq!(dup.header("retry-after"), Some("2"));
    let first = first.join().unwrap();
    let completed_at = unix_now();
    assert_executed(&first);
    assert_eq!(
        first.header("idempotency-expires"),
        None,
        "not on an execution"
    );
    std::thread::sleep(Duration::from_millis(2100));
    let replay = s.send(&req);
    assert_replay_of(&replay, &first);
    // The default ttl_seconds: 86400, from the completion (after the upstream's 2 s,
    // before the client had the answer).
    let day = 86_400.0;
    assert_expires_within(
        &replay,
        claimed_at + 2.0 + day,
        completed_at + day,
        "replay",
    );
    let age: f64 = replay
        .header("age")
        .expect("age on a replay")
        .parse()
        .unwrap();
    // Whole seconds since the completion, which came between the two readings.
    let (now, elapsed) = (unix_now(), unix_now() - completed_at);
    let most = now - claimed_at - 2.0;
    assert!(
        age >= elapsed.floor() && age <= most.ceil(),
        "age {age} s, {elapsed:.2} to {most:.2} s after the completion"
    );
    let other = s.send(&post(path, "expiry-1", &json!({"item": "other"})));
    assert_problem(&other, 422, "payload-mismatch");
    assert_expires_within(&other, claimed_at + 2.0 + day, completed_at + day, "422");
    assert_eq!(s.executions(path), 1);

    let quiet = Stack::start("e2e-no-expiry", r#"{"advertise_expiry": false}"#);
    let first = quiet.send_in_background(slow_copy(&req), 1);
    let dup = quiet.send(&req);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(dup.header("idempotency-expires"), None);
    assert!(dup.header("retry-after").is_some());
    let first = first.join().unwrap();
    let replay = quiet.send(&req);
    assert_replay_of(&replay, &first);
    assert_eq!(replay.header("idempotency-expires"), None);
    assert_eq!(replay.header("age"), None);
}

fn slow_copy(req: &Request) -> Request {
    req.clone().header("x-demo-delay-ms", "2000")
}
