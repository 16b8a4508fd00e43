//! Exact identity (issue 21) in a real Envoy with the demo upstream: the canonical
//! JSON payload check compares numbers beyond f64's precision and lone surrogates
//! exactly, treats `1.0` and `1` as one number, refuses a body naming a member twice
//! (400 `ambiguous-payload`), and a JSON key's string is used exactly (not unquoted).
//!
//! One Envoy: the top-level policy ignores `/deliveryAttempt` in the payload check
//! (key in the `idempotency-key` header); the rule `messages` (paths under
//! `/messages`) takes the key from the body's `/id`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::Request;
use serde_json::json;
use std::sync::OnceLock;

fn stack() -> &'static Stack {
    static S: OnceLock<Stack> = OnceLock::new();
    S.get_or_init(|| {
        let config = json!({
            "payload": {"ignore_json_pointers": ["/deliveryAttempt"]},
            "rules": [{
                "name": "messages",
                "match": {"path_prefix": "/messages"},
                "key": {"json_pointer": "/id", "required": true},
            }],
        });
        Stack::start("identity", &config.to_string())
    })
}

/// A keyed POST of `body` exactly as written (not re-serialised).
fn raw(path: &str, key: &str, body: &str) -> Request {
    Request::post(path)
        .key(key)
        .header("content-type", "application/json")
        .body(body.as_bytes().to_vec())
}

#[test]
fn numbers_beyond_f64_precision_are_other_payloads() {
    let s = stack();
    for (i, (a, b)) in [
        ("12345678901234567890123", "12345678901234567890124"),
        ("1.000000000000000001", "1.000000000000000002"),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/identity/big/{i}");
        let key = format!("big-{i}");
        let body =
            |n: &str, attempt: u32| format!(r#"{{"amount": {n}, "deliveryAttempt": {attempt}}}"#);
        let first = s.send(&raw(&path, &key, &body(a, 1)));
        assert_executed(&first);
        // Before: one f64, and the second got the first's response.
        assert_problem(
            &s.send(&raw(&path, &key, &body(b, 2))),
            422,
            "payload-mismatch",
        );
        assert_replay_of(&s.send(&raw(&path, &key, &body(a, 3))), &first);
        assert_eq!(s.executions(&path), 1);
    }
}

#[test]
fn one_number_in_another_spelling_is_the_same_payload() {
    let s = stack();
    let path = "/identity/spelling";
    let first = s.send(&raw(
        path,
        "spell-1",
        r#"{"qty": 1.0, "deliveryAttempt": 1}"#,
    ));
    assert_executed(&first);
    for qty in ["1", "1e0", "10e-1"] {
        let again = format!(r#"{{"deliveryAttempt": 2, "qty": {qty}}}"#);
        assert_replay_of(&s.send(&raw(path, "spell-1", &again)), &first);
    }
    assert_eq!(s.executions(path), 1);
}

#[test]
fn a_member_named_twice_gets_400_ambiguous_payload() {
    let s = stack();
    let path = "/identity/dup";
    let first = s.send(&raw(path, "dup-1", r#"{"amount": 5}"#));
    assert_executed(&first);
    let bad_before = s.counter("bad_key");
    for body in [
        r#"{"amount": 5000, "amount": 5}"#,
        r#"{"amount": 5, "\u0061mount": 5}"#,
        r#"{"lines": [{"qty": 1, "qty": 100}], "amount": 5}"#,
    ] {
        let r = s.send(&raw(path, "dup-1", body));
        assert!(!is_replayed(&r), "{body}: {}", r.summary());
        assert_problem(&r, 400, "ambiguous-payload");
        // A fresh key does not reach the upstream either.
        assert_problem(&s.send(&raw(path, "dup-2", body)), 400, "ambiguous-payload");
    }
    assert_eq!(s.executions(path), 1);
    assert!(s.counter("bad_key") >= bad_before + 6);
}

#[test]
fn a_lone_surrogate_redelivered_with_a_new_attempt_is_replayed() {
    let s = stack();
    let path = "/identity/surrogate";
    let body = |attempt: u32| format!(r#"{{"text": "a\ud800b", "deliveryAttempt": {attempt}}}"#);
    let first = s.send(&raw(path, "sur-1", &body(1)));
    assert_executed(&first);
    // Before: serde_json refused the body, the raw body counted, and this got 422.
    assert_replay_of(&s.send(&raw(path, "sur-1", &body(2))), &first);
    let other = r#"{"text": "a\ud801b", "deliveryAttempt": 3}"#;
    assert_problem(&s.send(&raw(path, "sur-1", other)), 422, "payload-mismatch");
    assert_eq!(s.executions(path), 1);
}

#[test]
fn a_quoted_json_key_is_its_own_key() {
    let s = stack();
    let path = "/messages/quoted";
    let send = |id: &str| {
        s.send(
            &Request::post(path)
                .header("content-type", "application/json")
                .body(format!(r#"{{"id": {id}, "text": "hi"}}"#).into_bytes()),
        )
    };
    let plain = send(r#""abc-21""#);
    assert_executed(&plain);
    // Before: unquoted to abc-21, and replayed `plain`.
    let quoted = send(r#""\"abc-21\"""#);
    assert_executed(&quoted);
    assert_ne!(json(&quoted)["order_id"], json(&plain)["order_id"]);
    assert_replay_of(&send(r#""\"abc-21\"""#), &quoted);
    assert_replay_of(&send(r#""abc-21""#), &plain);
    assert_eq!(s.executions(path), 2);
}
