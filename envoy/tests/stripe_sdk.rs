//! Errors in the API's own shape, in real Envoy. Stripe's own Python SDK (`pip install
//! stripe`) charges through the proxy (`errors.format: "stripe"`), against an upstream
//! that answers like Stripe's charges endpoint: for a retry while the charge runs, a
//! retry of a charge whose outcome is unknown and a key reused for another amount, the
//! SDK raises its typed `IdempotencyError` with the filter's detail as its message,
//! where with problem+json it raised `APIError: Invalid response object from API`. The
//! app is `tests/clients/stripe_charges.py`; this test reads what it saw. Also a
//! template's answer as a client gets it, and a template Envoy must refuse.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::Request;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Command;

/// Whether `python3` can import Stripe's SDK; the test fails with the install line if not.
fn stripe_sdk() -> String {
    let out = Command::new("python3")
        .args(["-c", "import stripe; print(stripe.VERSION)"])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "Stripe's Python SDK is missing: `pip install stripe` (.ci/install-deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs the Stripe app against `s`: its JSON lines, by step.
fn run_app(s: &Stack) -> BTreeMap<String, Vec<Value>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/stripe_charges.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{}", s.envoy.addr()))
        .arg(format!("http://{}", s.upstream.addr()))
        // Loopback only, whatever proxy the environment names.
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Stripe app failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut steps: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        steps
            .entry(v["step"].as_str().unwrap().to_string())
            .or_default()
            .push(v);
    }
    eprintln!("stripe {}:\n{stdout}", stripe_sdk());
    steps
}

/// The one (or last) line of `step`.
fn step<'a>(steps: &'a BTreeMap<String, Vec<Value>>, name: &str) -> &'a Value {
    steps
        .get(name)
        .and_then(|v| v.last())
        .unwrap_or_else(|| panic!("no step {name}: {steps:?}"))
}

/// The SDK raised its `IdempotencyError` with this code, the filter's detail as the
/// message the app shows.
fn assert_idempotency_error(v: &Value, code: &str, detail_says: &str) {
    assert_eq!(v["raised"], "IdempotencyError", "{v}");
    assert_eq!(v["idempotency_error"], true, "{v}");
    assert_eq!(
        (v["http_status"].clone(), v["type"].clone()),
        (json!(400), json!("idempotency_error")),
        "{v}"
    );
    assert_eq!(v["code"], code, "{v}");
    let message = v["message"].as_str().unwrap_or("");
    assert!(message.contains(detail_says), "{v}");
}

#[test]
fn stripes_sdk_raises_its_idempotency_error_for_in_flight_unknown_outcome_and_mismatch() {
    stripe_sdk();
    let s = Stack::start(
        "stripe-sdk",
        r#"{"errors": {"format": "stripe"}, "in_flight_timeout_seconds": 10}"#,
    );
    let steps = run_app(&s);
    // A charge, and its replay: the same charge.
    let first = step(&steps, "first");
    assert!(
        first["charge"].as_str().unwrap().starts_with("ch_"),
        "{first}"
    );
    let replay = step(&steps, "replay");
    assert_eq!(
        (replay["charge"].clone(), replay["replayed"].clone()),
        (first["charge"].clone(), json!("true"))
    );
    // The key reused for another amount (the filter's `422 payload-mismatch`).
    let mismatch = step(&steps, "mismatch");
    assert_idempotency_error(
        mismatch,
        "payload_mismatch",
        "different method, path or body",
    );
    assert!(
        mismatch["expires"].is_string(),
        "idempotency-expires is kept: {mismatch}"
    );
    // A retry while the first runs (`409 in-flight`): retry-after, as ever.
    let in_flight = step(&steps, "in_flight");
    assert_idempotency_error(in_flight, "idempotency_key_in_use", "not been answered yet");
    assert!(in_flight["retry_after"].is_string(), "{in_flight}");
    let slow = step(&steps, "slow_first");
    assert!(
        slow["charge"].is_string(),
        "the first charge completes: {slow}"
    );
    // Envoy's own 503 for the reset is no error of ours; the retry's is
    // (`409 outcome-unknown`), without retry-after.
    assert_eq!(step(&steps, "reset")["http_status"], 503);
    let unknown = step(&steps, "unknown");
    assert_idempotency_error(unknown, "outcome_unknown", "may have run");
    assert!(unknown["retry_after"].is_null(), "{unknown}");
    // The SDK's own retry of that 503 meets the kept record.
    assert_idempotency_error(step(&steps, "sdk_retry"), "outcome_unknown", "may have run");
    // Each key ran once, whatever the retries.
    for key in ["order-1", "order-2", "order-3", "order-4"] {
        assert_eq!(s.upstream.executions_for_key(key), 1, "{key}");
    }
}

#[test]
fn a_template_answers_as_written_with_the_filters_status_and_headers() {
    let s = Stack::start(
        "errors-template",
        r#"{"in_flight_timeout_seconds": 10, "rules": [{"name": "api", "match": {"path_prefix": "/api"},
            "errors": {"format": "template", "content_type": "application/vnd.err+json",
                       "body": "{\"code\": \"{{type}}\", \"msg\": {{detail_json}}, \"retry_in\": {{retry_after_json}}}"}}]}"#,
    );
    let slow = post("/api/orders", "t-1", &json!({"n": 1})).header("x-demo-delay-ms", "2000");
    let first = s.send_in_background(slow.clone(), 1);
    let r = s.send(&post("/api/orders", "t-1", &json!({"n": 1})));
    assert_eq!(r.status, 409, "{}", r.summary());
    assert_eq!(r.header("content-type"), Some("application/vnd.err+json"));
    assert!(r.header("idempotency-expires").is_some(), "{}", r.summary());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(
        json(&r),
        json!({"code": "in-flight", "msg": "the first request with this key has not been answered yet; retry later", "retry_in": retry})
    );
    assert_executed(&first.join().unwrap());
    // Outside the rule: problem+json, as ever.
    let r = s.send(
        &Request::post("/orders")
            .header("idempotency-key", "")
            .json(&json!({})),
    );
    assert_problem(&r, 400, "invalid-key");
}

#[test]
fn envoy_refuses_a_template_naming_the_field() {
    assert_refused_naming_the_field(
        "errors-refused",
        &[
            (
                r#"{"errors": {"format": "template", "body": "{\"msg\": {{detail}}}"}}"#,
                "errors.body",
            ),
            (
                r#"{"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "errors": {"format": "template", "body": "{{code}}"}}]}"#,
                "rules[0].errors.body",
            ),
        ],
    );
}
