//! `store.max_store_bytes` in a real Envoy: with 60 KB responses and an 8 MiB budget,
//! Envoy's memory stops growing once the budget is reached, while the same traffic
//! under a budget large enough never to be reached keeps growing with every stored
//! response. Memory is what Envoy's allocator holds (`allocated` of admin `/memory`,
//! the live value of the `server.memory_allocated` gauge); VmRSS from /proc is printed
//! alongside (it never shrinks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::Request;
use serde_json::json;

const PAD: usize = 60_000;
const BUDGET: u64 = 8 << 20;
/// Past the budget: 8 MiB over 128 buckets (`capacity` 2048) holds one 60 KB response
/// per bucket, about 128 in all.
const WARM: usize = 250;
/// Requests after the warm-up; unbounded, they would add about 15 MB.
const MORE: usize = 250;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// tcmalloc's allocated bytes, read now (admin `/memory`; the `server.memory_allocated`
/// gauge is only refreshed at each stats flush).
fn allocated(s: &Stack) -> u64 {
    let v = json(&s.envoy.admin("/memory").unwrap());
    v["allocated"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .or_else(|| v["allocated"].as_u64())
        .unwrap_or_else(|| panic!("/memory: {v}"))
}

/// Sends unique keys `from..to` with 60 KB responses; all must execute.
fn unique(s: &Stack, from: usize, to: usize) {
    for i in from..to {
        let r = s.send(
            &Request::post("/budget")
                .key(&format!("budget-{i}"))
                .header("x-demo-pad-bytes", &PAD.to_string())
                .json(&json!({"i": i})),
        );
        assert_eq!(r.status, 200, "budget-{i}");
        assert!(r.body.len() > PAD);
    }
}

/// Memory (allocated bytes) at start, after `WARM` and after `WARM + MORE` unique keys.
fn grow(name: &str, config: &str) -> (Stack, [u64; 3]) {
    let s = Stack::start(name, config);
    unique(&s, 0, 20);
    let base = allocated(&s);
    unique(&s, 20, WARM);
    let warm = allocated(&s);
    unique(&s, WARM, WARM + MORE);
    let end = allocated(&s);
    eprintln!(
        "{name}: allocated {base} -> {warm} -> {end} bytes; VmRSS {} KiB",
        rss_kib(s.envoy.pid())
    );
    (s, [base, warm, end])
}

#[test]
fn envoy_memory_stays_within_the_budget_plus_a_fixed_overhead() {
    let config = |budget: u64| {
        json!({"capacity": 2048, "max_replay_body_bytes": 65536, "store": {"max_store_bytes": budget}}).to_string()
    };
    let (s, [base, warm, end]) = grow("budget-8m", &config(BUDGET));
    // Past the budget, more responses cost (almost) nothing: each new one replaces an
    // old one in its bucket (unbounded, they would add about 15 MB). The slack covers
    // new keys of slots and the allocator's noise (measured: about 1.4 MB).
    assert!(
        end <= warm + (4 << 20),
        "{MORE} more 60 KB responses grew Envoy from {warm} to {end} bytes"
    );
    // Everything stored stays within the budget plus a fixed overhead (records,
    // keys, one response in flight per worker).
    assert!(
        end <= base + BUDGET + (4 << 20),
        "Envoy grew from {base} to {end} bytes with an {BUDGET}-byte budget"
    );
    let dropped = s.counter("bodies_dropped");
    assert!(dropped as usize >= WARM + MORE - 200, "dropped {dropped}");
    // The newest key replays; a dropped one answers 409 and does not run again.
    let last = WARM + MORE - 1;
    let again = |i: usize| {
        s.send(
            &Request::post("/budget")
                .key(&format!("budget-{i}"))
                .header("x-demo-pad-bytes", &PAD.to_string())
                .json(&json!({"i": i})),
        )
    };
    assert!(is_replayed(&again(last)));
    let executed = s.executions("/budget");
    let mut not_stored = 0;
    for i in 20..40 {
        let r = again(i);
        if r.status == 409 {
            assert_problem(&r, 409, "response-not-stored");
            not_stored += 1;
        }
    }
    assert!(not_stored > 0);
    assert_eq!(
        s.executions("/budget"),
        executed,
        "a key whose body was dropped never runs again"
    );
    drop(s);

    // The same traffic under a budget it never reaches keeps every response: the
    // measurement above can see growth.
    let (_big, [_, warm, end]) = grow("budget-1g", &config(1 << 30));
    assert!(
        end >= warm + (MORE * PAD / 2) as u64,
        "without a reachable budget Envoy grew only from {warm} to {end} bytes"
    );
}

/// With every default, the stored responses fit 128 MiB: `max_replay_body_bytes` is
/// 16 KiB, so 60 KB responses are not kept (Envoy's memory does not grow with them)
/// and their duplicates get `409 response-not-stored` without running again, while a
/// response within the limit is replayed.
#[test]
fn by_default_large_responses_are_not_kept_and_never_run_twice() {
    let s = Stack::start("budget-defaults", "{}");
    unique(&s, 0, 20);
    let base = allocated(&s);
    unique(&s, 20, 20 + MORE);
    let end = allocated(&s);
    eprintln!("defaults: allocated {base} -> {end} bytes after {MORE} unique 60 KB responses");
    assert!(
        end <= base + (4 << 20),
        "{MORE} unkept 60 KB responses grew Envoy from {base} to {end} bytes"
    );
    assert!(s.counter("response_not_stored") as usize >= MORE);
    let executed = s.executions("/budget");
    let again = s.send(
        &Request::post("/budget")
            .key("budget-30")
            .header("x-demo-pad-bytes", &PAD.to_string())
            .json(&json!({"i": 30})),
    );
    assert_problem(&again, 409, "response-not-stored");
    assert_eq!(s.executions("/budget"), executed, "the key ran again");
    // 16 KiB and below: stored and replayed.
    let small = Request::post("/budget")
        .key("budget-small")
        .header("x-demo-pad-bytes", "15000")
        .json(&json!({"i": "small"}));
    assert_eq!(s.send(&small).status, 200);
    assert!(is_replayed(&s.send(&small)));
}

/// A JSON array of `n` numbers: about 8 bytes each.
fn json_array(n: usize, salt: usize) -> String {
    let items: Vec<String> = (0..n)
        .map(|i| format!("{}.{}", i * 7 + salt, i % 97))
        .collect();
    format!(
        r#"{{"id": "m-{salt}", "deliveryAttempt": 1, "values": [{}]}}"#,
        items.join(",")
    )
}

/// The canonical payload check's memory in Envoy: the Wasm VM's footprint (VmRSS) after
/// canonicalising bodies of about 1 MB, against the raw check of the same bodies.
#[test]
fn the_canonical_json_check_costs_envoy_a_small_multiple_of_the_body() {
    let body_len = json_array(100_000, 0).len();
    let growth = |name: &str, config: &str| {
        let s = Stack::start(name, config);
        // Warm the VM (first request, allocator) before the baseline.
        let warm = Request::post("/json")
            .key("warm")
            .body(json_array(1_000, 9));
        assert_eq!(s.send(&warm).status, 200);
        let before = rss_kib(s.envoy.pid());
        for i in 0..3 {
            let r = s.send(
                &Request::post("/json")
                    .key(&format!("big-{i}"))
                    .header("content-type", "application/json")
                    .body(json_array(100_000, i)),
            );
            assert_eq!(r.status, 200, "{}", r.summary());
        }
        let after = rss_kib(s.envoy.pid());
        (after.saturating_sub(before)) * 1024
    };
    let raw = growth("json-raw", "{}");
    let canonical = growth(
        "json-canonical",
        r#"{"payload": {"ignore_json_pointers": ["/deliveryAttempt"]}}"#,
    );
    eprintln!(
        "body {body_len} bytes: Envoy VmRSS grew {raw} bytes with the raw check, {canonical} with the canonical one ({:.2}x the body)",
        canonical as f64 / body_len as f64
    );
    // Before the hand-written canonical form, serde_json's tree took about 26x the body.
    assert!(
        canonical <= 8 * body_len as u64 + raw,
        "the canonical check grew Envoy by {canonical} bytes for a {body_len}-byte body (raw: {raw})"
    );
}
