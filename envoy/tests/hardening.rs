//! The hardening contract (issue 8) in a real Envoy with 2 workers and the
//! demo upstream: clients that give up, route timeouts, several hosts behind
//! one listener, 429s from the upstream and from a later filter, smuggled
//! scope and key headers, refused and missing upstreams, gRPC, the
//! `outcome_unknown` counter, a config push by LDS under traffic, and the
//! scope taken from a verified JWT claim.
//!
//! Most tests share one Envoy (`envoy/tests/templates/hardening.yaml`: extra
//! routes chosen by an `x-route` header, which is not part of the payload
//! hash, and a second listener with a local rate limiter after the dedup
//! filter); each uses its own paths and keys. The LDS and JWT tests start
//! their own Envoy from the templates in `envoy/configs/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::client;
use dedup_envoy::paths::{config_file, workspace_root};
use dedup_envoy::{EnvoyConfig, Request, Response};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// `in_flight_timeout_seconds` of the shared Envoy: short, so that the tests
/// can see a held claim expire, long enough to retry within it reliably.
const IN_FLIGHT_SECS: u64 = 4;

/// Default configuration plus a tenant scope and the short in-flight timeout.
fn hardening_config() -> String {
    json!({
        "scope": {"headers": ["x-tenant"]},
        "in_flight_timeout_seconds": IN_FLIGHT_SECS,
        // Paths under /hold/ keep the old hold-until-the-in-flight-timeout.
        "rules": [{"name": "hold", "match": {"path_prefix": "/hold/"}, "on_unknown_outcome": "hold"}],
    })
    .to_string()
}

/// The shared Envoy; never dropped (it dies with the test process).
fn hard() -> &'static Stack {
    static HARD: OnceLock<Stack> = OnceLock::new();
    HARD.get_or_init(|| {
        Stack::start_with("hardening", |upstream_port, wasm| {
            let template = workspace_root().join("envoy/tests/templates/hardening.yaml");
            EnvoyConfig::from_template(&template, upstream_port, wasm, &hardening_config())
                .and_then(|c| c.with_port("RL_LISTEN_PORT"))
                .and_then(|c| c.with_port("DEAD_PORT"))
                .unwrap_or_else(|e| panic!("{e}"))
        })
    })
}

/// The listener whose local rate limiter sits after the dedup filter.
fn rate_limited_addr(s: &Stack) -> SocketAddr {
    let port = s
        .envoy
        .config
        .port("RL_LISTEN_PORT")
        .expect("RL_LISTEN_PORT");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A filter counter; one not (yet) defined by the build counts as 0.
fn counter(s: &Stack, short: &str) -> u64 {
    s.envoy
        .dedup_counters()
        .unwrap_or_else(|e| panic!("{e}"))
        .get(short)
        .copied()
        .unwrap_or(0)
}

/// The filter counters that are not 0, for assertion messages.
/// The claim of `key` is held with its outcome unknown: the upstream ran it
/// once (not `what` too), and `outcome_unknown` grew from `unknown_before`.
fn assert_held(s: &Stack, key: &str, unknown_before: u64, what: &str) {
    assert_eq!(
        s.upstream.executions_for_key(key),
        1,
        "the upstream ran {what}"
    );
    let unknown = counter(s, "outcome_unknown");
    assert!(
        unknown > unknown_before,
        "wasmcustom.proxy_dedup_outcome_unknown did not grow ({unknown_before} -> {unknown}): {}",
        counters(s)
    );
}

fn counters(s: &Stack) -> String {
    let c: BTreeMap<String, u64> = s
        .envoy
        .dedup_counters()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .collect();
    format!("{c:?}")
}

/// `retry-after` as whole seconds (the filter writes delta-seconds).
fn retry_after(r: &Response) -> u64 {
    let v = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("no retry-after header: {}", r.summary()));
    v.trim()
        .parse()
        .unwrap_or_else(|_| panic!("retry-after {v:?} is not delta-seconds: {}", r.summary()))
}

/// A 409 in-flight with a `retry-after` of at least 1 s; returns it.
fn assert_in_flight(r: &Response) -> u64 {
    assert_problem(r, 409, "in-flight");
    assert!(!is_replayed(r), "{}", r.summary());
    let secs = retry_after(r);
    assert!(
        (1..=IN_FLIGHT_SECS).contains(&secs),
        "retry-after {secs} on the in-flight 409, expected 1..={IN_FLIGHT_SECS}: {}",
        r.summary()
    );
    secs
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// Under `on_unknown_outcome: "hold"` (a rule), the claim of a request whose
/// client went away is held: retries within `in_flight_timeout_seconds` get
/// 409 with the remaining time in `retry-after` (also once the first has
/// finished upstream), the upstream ran it once, the outcome counts as
/// unknown; after the timeout the key may run again.
#[test]
fn under_hold_client_gives_up_then_retries_get_409_until_the_in_flight_timeout() {
    let s = hard();
    let path = "/hold/orders/give-up";
    let key = "give-up-1";
    let req = post(path, key, &json!({"charge": 42})).header("x-tenant", "acme");
    let unknown_before = counter(s, "outcome_unknown");

    let t0 = Instant::now();
    let slow = req.clone().header("x-demo-delay-ms", "2500");
    s.hang_up(&slow, Duration::from_millis(500));
    s.wait_executions(path, 1, Duration::from_secs(2));

    // Right after giving up (the first still runs upstream). Until Envoy has
    // ended the first stream (on_log), its record is an ordinary in-flight
    // claim (retry-after: retry_after_seconds, 1); once marked held, the
    // retry-after is the rest of the in-flight timeout.
    let early = s.send(&req);
    let early_secs = assert_in_flight(&early);
    sleep_until(t0 + Duration::from_millis(1500));
    let mut mid_secs = assert_in_flight(&s.send(&req));
    if mid_secs == 1 {
        // A loaded machine may end the first stream late: look once more.
        std::thread::sleep(Duration::from_millis(300));
        mid_secs = assert_in_flight(&s.send(&req));
    }
    assert!(
        mid_secs >= 2,
        "retry-after {mid_secs} at {:?} after the claim (early: {early_secs}): it should be the remaining in-flight time (~{IN_FLIGHT_SECS} s - 1.5 s)",
        t0.elapsed()
    );
    // The first has finished upstream (its answer went nowhere); the claim
    // is still held until the in-flight timeout.
    sleep_until(t0 + Duration::from_millis(2700));
    assert_eq!(s.upstream.executions_for_key(key), 1);
    let late = s.send(&req);
    assert!(
        t0.elapsed() < Duration::from_secs(IN_FLIGHT_SECS),
        "too slow to test within the in-flight timeout"
    );
    let late_secs = assert_in_flight(&late);
    assert!(
        mid_secs >= late_secs,
        "retry-after counts down: {early_secs}, {mid_secs}, {late_secs}"
    );
    assert_held(s, key, unknown_before, "a retry");

    // After the in-flight timeout the key may run again.
    sleep_until(t0 + Duration::from_millis(IN_FLIGHT_SECS * 1000 + 600));
    assert_runs_again_then_replays(s, &req);
    assert_eq!(s.upstream.executions_for_key(key), 2);
}

/// `on_unknown_outcome: "release"` keeps the old behaviour: the claim of a
/// client that went away is released at the end of its stream, and the
/// retry executes again (at-most-once traded for availability).
#[test]
fn on_unknown_outcome_release_lets_the_retry_run() {
    let s = Stack::start(
        "hardening-release",
        r#"{"on_unknown_outcome": "release", "in_flight_timeout_seconds": 30}"#,
    );
    let path = "/orders/release";
    let key = "release-1";
    let req = post(path, key, &json!({"charge": 7}));
    s.hang_up(
        &req.clone().header("x-demo-delay-ms", "1500"),
        Duration::from_millis(300),
    );
    s.wait_executions(path, 1, Duration::from_secs(2));
    // Envoy notices the closed connection and ends the stream; the claim is
    // released then (give it a moment).
    let end = Instant::now() + Duration::from_secs(3);
    let retry = loop {
        let r = s.send(&req);
        if r.status != 409 || Instant::now() > end {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_executed(&retry);
    assert_eq!(s.upstream.executions_for_key(key), 2);
    assert_replay_of(&s.send(&req), &retry);
}

/// A 409 for a retry of a request whose outcome is unknown: `in-flight` while
/// Envoy has not yet ended the first stream, `outcome-unknown` from then on.
fn assert_in_flight_or_unknown(r: &Response) {
    if String::from_utf8_lossy(&r.body).contains("outcome-unknown") {
        assert_problem(r, 409, "outcome-unknown");
    } else {
        assert_in_flight(r);
    }
}

/// A route timeout answers 504 from Envoy while the upstream still runs: the
/// outcome is unknown, the record is kept (the default, `"keep"`): retries
/// get 409 `outcome-unknown`, during the in-flight timeout and after it, and
/// the upstream ran it once.
#[test]
fn route_timeout_504_then_retries_get_outcome_unknown_past_the_in_flight_timeout() {
    let s = hard();
    let path = "/orders/route-timeout";
    let key = "route-timeout-1";
    let req = post(path, key, &json!({"item": "slow"}));
    let unknown_before = counter(s, "outcome_unknown");
    let t0 = Instant::now();
    let first = s.send(
        &req.clone()
            .header("x-route", "short-timeout")
            .header("x-demo-delay-ms", "2500"),
    );
    assert_eq!(first.status, 504, "route timeout 1 s: {}", first.summary());
    assert!(!is_replayed(&first));
    assert!(
        t0.elapsed() < Duration::from_millis(2300),
        "the 504 came after {:?}",
        t0.elapsed()
    );
    assert_eq!(s.upstream.executions_for_key(key), 1);

    assert_in_flight_or_unknown(&s.send(&req));
    sleep_until(t0 + Duration::from_millis(2700));
    assert_problem(&s.send(&req), 409, "outcome-unknown");
    // Past the in-flight timeout: the key still never runs again.
    sleep_until(t0 + Duration::from_millis(IN_FLIGHT_SECS * 1000 + 600));
    let late = s.send(&req);
    assert_problem(&late, 409, "outcome-unknown");
    assert!(late.header("retry-after").is_none(), "{}", late.summary());
    assert_held(s, key, unknown_before, "a retry after a route timeout");
}

/// Two hosts behind one listener (virtual host domains "*") never see each
/// other's records: the same key, path and body executes once per host,
/// and each host's retry replays its own response. Host names are compared
/// lower-cased.
#[test]
fn two_hosts_behind_one_listener_have_their_own_records() {
    let s = hard();
    let path = "/orders/hosts";
    let key = "hosts-1";
    let req = post(path, key, &json!({"item": "anvil", "qty": 1}));
    let acme = s.send(&req.clone().host("acme.example"));
    assert_executed(&acme);
    let globex = s.send(&req.clone().host("globex.example"));
    assert_executed(&globex);
    assert_ne!(
        json(&acme)["order_id"],
        json(&globex)["order_id"],
        "globex got acme's response"
    );
    assert_eq!(s.upstream.executions_for_key(key), 2);
    assert_replay_of(&s.send(&req.clone().host("acme.example")), &acme);
    assert_replay_of(&s.send(&req.clone().host("globex.example")), &globex);
    assert_replay_of(&s.send(&req.clone().host("ACME.Example")), &acme);
    assert_eq!(s.upstream.executions_for_key(key), 2);
}

/// An upstream 429 (with `retry-after`) is not stored: the claim is
/// released and the retry executes.
#[test]
fn upstream_429_is_not_stored_and_the_retry_executes() {
    let s = hard();
    let path = "/orders/too-many";
    let key = "too-many-1";
    let req = post(path, key, &json!({"item": "popular"}));
    let first = s.send(
        &req.clone()
            .header("x-demo-status", "429")
            .header("x-demo-retry-after", "1"),
    );
    assert_eq!(first.status, 429, "{}", first.summary());
    assert_eq!(
        first.header("retry-after"),
        Some("1"),
        "{}",
        first.summary()
    );
    assert!(!is_replayed(&first));
    assert_runs_again_then_replays(s, &req);
    assert_eq!(s.upstream.executions_for_key(key), 2);
}

/// A local rate limiter after the dedup filter answers 429 itself: never
/// stored, the claim released; once the limiter lets the key through it
/// executes (once), and a duplicate is then replayed by the dedup filter
/// before the limiter.
#[test]
fn local_rate_limit_429_after_the_filter_is_never_stored() {
    let s = hard();
    let addr = rate_limited_addr(s);
    let path = "/orders/rate-limited";
    // One token per 2 s: of a few requests in a row, one is refused.
    let mut limited = None;
    for i in 0..6 {
        let key = format!("rl-{i}");
        let req = post(path, &key, &json!({"n": i}));
        let r = client::send(addr, &req).unwrap();
        if r.status == 429 {
            limited = Some((key, req, r));
            break;
        }
        assert_executed(&r);
    }
    let (key, req, refused) = limited.expect("the local rate limiter never answered 429");
    assert!(
        refused.text().contains("local_rate_limited"),
        "the 429 is the limiter's: {}",
        refused.summary()
    );
    assert!(!is_replayed(&refused));
    assert_eq!(s.upstream.executions_for_key(&key), 0);

    let end = Instant::now() + Duration::from_secs(8);
    let mut refusals = 1;
    let through = loop {
        let r = client::send(addr, &req).unwrap();
        if r.status != 429 {
            break r;
        }
        assert!(
            !is_replayed(&r),
            "the limiter's 429 was stored and replayed: {}",
            r.summary()
        );
        assert!(r.text().contains("local_rate_limited"), "{}", r.summary());
        refusals += 1;
        assert!(Instant::now() < end, "still refused after {refusals} tries");
        std::thread::sleep(Duration::from_millis(200));
    };
    // The dedup filter answers before the limiter: no token needed.
    assert_once_then_replayed(s, &key, &through, || client::send(addr, &req).unwrap());
}

/// A scope header sent twice is ambiguous: 400 `ambiguous-scope`, never the
/// response stored for one of the values. A key header sent twice: 400
/// `ambiguous-key`.
#[test]
fn repeated_scope_or_key_header_lines_get_400() {
    let s = hard();
    let path = "/orders/smuggle";
    let key = "smuggle-1";
    let body = json!({"transfer": 1000});
    let req = post(path, key, &body);
    let victim = s.send(&req.clone().header("x-tenant", "victim"));
    assert_executed(&victim);
    let victim_order = json(&victim)["order_id"].to_string();
    let bad_key_before = counter(s, "bad_key");
    // Never a stored response (the victim's least of all): 400 with `slug`.
    let refused = |r: Response, what: String, slug: &str| {
        assert!(
            !is_replayed(&r) && !r.text().contains(&victim_order),
            "{what} got a stored response: {}",
            r.summary()
        );
        assert_problem(&r, 400, slug);
    };
    for (a, b) in [
        ("victim", "attacker"),
        ("attacker", "victim"),
        ("victim", "victim"),
    ] {
        let r = s.send(&req.clone().header("x-tenant", a).header("x-tenant", b));
        refused(
            r,
            format!("x-tenant: {a} + x-tenant: {b}"),
            "ambiguous-scope",
        );
    }
    assert_eq!(s.executions(path), 1);
    // One line with a comma is one value: a scope of its own.
    let joined = s.send(&req.clone().header("x-tenant", "victim, attacker"));
    assert_executed(&joined);
    assert_eq!(s.executions(path), 2);

    for (a, b) in [(key, "smuggle-2"), ("smuggle-2", key), (key, key)] {
        let r = s.send(
            &Request::post(path)
                .header("idempotency-key", a)
                .header("idempotency-key", b)
                .header("x-tenant", "victim")
                .json(&body),
        );
        refused(r, format!("idempotency-key: {a} + {b}"), "ambiguous-key");
    }
    assert_eq!(s.executions(path), 2);
    let bad_key = counter(s, "bad_key");
    assert!(
        bad_key >= bad_key_before + 6,
        "proxy_dedup_bad_key {bad_key_before} -> {bad_key}, expected +6"
    );
    assert_replay_of(&s.send(&req.clone().header("x-tenant", "victim")), &victim);
}

/// Envoy's own 503s that prove the request never reached an upstream
/// (connection refused: UF; no endpoints: UH) release the claim: the same
/// request fails again with 503 (not 409), and the retry on a working route
/// executes once.
#[test]
fn refused_or_missing_upstream_releases_the_claim() {
    let s = hard();
    let path = "/orders/dead-upstream";
    for route in ["refused", "no-endpoints"] {
        let key = format!("dead-{route}");
        let req = post(path, &key, &json!({"route": route}));
        for attempt in 0..2 {
            let r = s.send(&req.clone().header("x-route", route));
            assert_eq!(
                r.status,
                503,
                "{route} attempt {attempt}: Envoy's 503 expected, got {}",
                r.summary()
            );
            assert!(!is_replayed(&r), "{route}: {}", r.summary());
            assert!(
                !r.header("content-type")
                    .unwrap_or("")
                    .starts_with("application/problem+json"),
                "{route} attempt {attempt}: answered by the filter: {}",
                r.summary()
            );
        }
        assert_eq!(s.upstream.executions_for_key(&key), 0);
        let retry = s.send(&req);
        assert_once_then_replayed(s, &key, &retry, || s.send(&req));
    }
}

/// Real gRPC requests (HTTP/2, a gRPC content type) pass through untouched even with a
/// key: every one runs, counted in `proxy_dedup_bypassed` (`grpc` defaults to
/// `"bypass"`). Over HTTP/1.1 a gRPC content type bypasses nothing (envoy/tests/identity.rs).
#[test]
fn grpc_requests_pass_through_untouched() {
    let s = hard();
    let path = "/orders.v1.Orders/Create";
    let key = "grpc-1";
    let bypassed_before = counter(s, "bypassed");
    // A gRPC frame: uncompressed, 5 bytes.
    let frame = b"\x00\x00\x00\x00\x05hello".to_vec();
    let mut orders = Vec::new();
    for ct in [
        "application/grpc",
        "application/grpc",
        "application/grpc+proto",
    ] {
        let r = h2_post(
            s.envoy.addr(),
            path,
            &[
                ("idempotency-key", key),
                ("content-type", ct),
                ("te", "trailers"),
            ],
            &frame,
        );
        assert_eq!(r.status, 200, "{ct}: {}", r.summary());
        assert!(!is_replayed(&r), "{ct}: a gRPC request was deduplicated");
        orders.push(json(&r)["order_id"].clone());
    }
    assert_eq!(s.upstream.executions_for_key(key), 3, "orders {orders:?}");
    let bypassed = counter(s, "bypassed");
    assert!(
        bypassed >= bypassed_before + 3,
        "proxy_dedup_bypassed {bypassed_before} -> {bypassed}, expected +3: {}",
        counters(s)
    );
}

/// A pushed listener (LDS from a file, replaced by rename) with another
/// `capacity` and `ttl_seconds`, under keyed traffic: no key runs twice
/// across the push, and keys completed before it still replay after it.
#[test]
fn config_push_by_lds_keeps_records_under_traffic() {
    let config = |capacity: u64, ttl: u64| {
        json!({"key": {"required": true}, "capacity": capacity, "ttl_seconds": ttl}).to_string()
    };
    let mut s = Stack::start_with("hardening-lds", |upstream_port, wasm| {
        EnvoyConfig::single_node_lds(upstream_port, wasm, &config(2048, 600))
            .unwrap_or_else(|e| panic!("{e}"))
    });
    let addr = s.envoy.addr();
    let path = "/orders/push";
    let keyed = |key: &str| post(path, key, &json!({"key": key})).timeout(Duration::from_secs(10));

    // Completed before the push.
    const PRE: usize = 60;
    let pre: Vec<(String, Response)> = (0..PRE)
        .map(|i| {
            let key = format!("pre-{i}");
            let r = client::send(addr, &keyed(&key)).unwrap();
            assert_executed(&r);
            (key, r)
        })
        .collect();

    // Traffic across the push: 4 threads, new keys, each sent 2-3 times,
    // every third key twice at once and then again.
    const THREADS: usize = 4;
    const MAX_KEYS: usize = 60;
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut out: Vec<(String, Instant, Vec<dedup_envoy::Result<Response>>)> =
                    Vec::new();
                for j in 0..MAX_KEYS {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let key = format!("mid-{t}-{j}");
                    let req =
                        post(path, &key, &json!({"key": key})).timeout(Duration::from_secs(10));
                    let started = Instant::now();
                    let mut answers = Vec::new();
                    if j % 3 == 0 {
                        let (a, b) = std::thread::scope(|sc| {
                            let a = sc.spawn(|| client::send(addr, &req));
                            let b = sc.spawn(|| client::send(addr, &req));
                            (a.join().unwrap(), b.join().unwrap())
                        });
                        answers.push(a);
                        answers.push(b);
                    } else {
                        answers.push(client::send(addr, &req));
                    }
                    answers.push(client::send(addr, &req));
                    out.push((key, started, answers));
                    std::thread::sleep(Duration::from_millis(30));
                }
                out
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(700));
    let lds_before = s.envoy.stat("listener_manager.lds.update_success").unwrap();
    let pushed_at = Instant::now();
    s.envoy.push_filter_config(&config(4096, 900)).unwrap();
    let lds_after = s
        .envoy
        .wait_stat_at_least(
            "listener_manager.lds.update_success",
            lds_before + 1,
            Duration::from_secs(15),
        )
        .unwrap_or_else(|e| panic!("{e}\nEnvoy log {}", s.envoy.log_path.display()));
    // The new listener is active (not warming) and carries the new config.
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let (active, warming) = listener_states(&s);
        if active.contains(r#"capacity\":4096"#) && warming.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "the pushed config is not active after 15 s: active {active}, warming {warming}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let took = pushed_at.elapsed();
    assert_eq!(
        s.envoy
            .stat("listener_manager.lds.update_rejected")
            .unwrap_or(0),
        0
    );
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::SeqCst);
    let mut mid = Vec::new();
    for h in handles {
        mid.extend(h.join().unwrap());
    }

    let mut failures = Vec::new();
    let mut sent = PRE;
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    for (key, _, answers) in &mid {
        for a in answers {
            sent += 1;
            match a {
                Ok(r) if r.status == 200 && is_replayed(r) => replayed += 1,
                Ok(r) if r.status == 200 => executed += 1,
                Ok(r) if r.status == 409 => in_flight += 1,
                Ok(r) => failures.push(format!("{key}: {}", r.summary())),
                Err(e) => failures.push(format!("{key}: {e}")),
            }
        }
    }
    // After the push: everything completed replays.
    for (key, first) in &pre {
        let r = client::send(addr, &keyed(key)).unwrap();
        sent += 1;
        if !(is_replayed(&r) && r.body == first.body) {
            failures.push(format!(
                "{key} (completed before the push) after it: {}",
                r.summary()
            ));
        }
    }
    for (key, _, _) in &mid {
        let r = client::send(addr, &keyed(key)).unwrap();
        sent += 1;
        if !(r.status == 200 && is_replayed(&r)) {
            failures.push(format!("{key} after the push: {}", r.summary()));
        }
    }
    let by_key = s.upstream.executions_json()["by_key"].clone();
    let mut twice = Vec::new();
    for (key, n) in by_key.as_object().unwrap() {
        if n.as_u64().unwrap_or(0) > 1 {
            twice.push(format!("{key}: {n}"));
        }
    }
    eprintln!(
        "LDS push: update_success {lds_before} -> {lds_after}, active after {took:?}; {sent} requests, {} keys during the traffic ({} started before the push, {} after it took effect): {executed} executed, {replayed} replayed, {in_flight} in-flight 409; counters {}",
        mid.len(),
        mid.iter().filter(|(_, t, _)| *t < pushed_at).count(),
        mid.iter().filter(|(_, t, _)| *t >= pushed_at + took).count(),
        counters(&s)
    );
    let (before_push, after_push) = (
        mid.iter().filter(|(_, t, _)| *t < pushed_at).count(),
        mid.iter()
            .filter(|(_, t, _)| *t >= pushed_at + took)
            .count(),
    );
    assert!(
        before_push >= 20 && after_push >= 20 && sent >= 300,
        "too little traffic around the push: {before_push} keys started before it, {after_push} after it took effect, {sent} requests"
    );
    if !twice.is_empty() {
        // What the clients saw for the first few of them.
        let seen: Vec<String> = mid
            .iter()
            .filter(|(k, _, _)| twice.iter().any(|t| t.starts_with(&format!("{k}:"))))
            .take(5)
            .map(|(k, _, answers)| {
                let a: Vec<String> = answers
                    .iter()
                    .map(|a| match a {
                        Ok(r) => r.summary(),
                        Err(e) => e.to_string(),
                    })
                    .collect();
                format!("{k}: {a:?}")
            })
            .collect();
        panic!(
            "{} keys executed more than once across the config push: {twice:?}\nduring the push they got:\n{}\ncounters {}",
            twice.len(),
            seen.join("\n"),
            counters(&s)
        );
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    assert_eq!(
        s.upstream.total_executions(),
        (PRE + mid.len()) as u64,
        "every key ran exactly once"
    );
    s.envoy.stop();
}

/// The `ingress` listener in admin `/config_dump`: its active and warming
/// states as JSON text ("" when absent).
fn listener_states(s: &Stack) -> (String, String) {
    let dump = s
        .envoy
        .admin("/config_dump?resource=dynamic_listeners")
        .unwrap()
        .json()
        .unwrap();
    let mut active = String::new();
    let mut warming = String::new();
    for l in dump["configs"].as_array().into_iter().flatten() {
        if l["name"] == "ingress" {
            if !l["active_state"].is_null() {
                active = l["active_state"].to_string();
            }
            if !l["warming_state"].is_null() {
                warming = l["warming_state"].to_string();
            }
        }
    }
    (active, warming)
}

// --- JWT scope ---------------------------------------------------------------

#[test]
fn hmac_sha256_matches_rfc_4231() {
    let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    let long_key = [0xaa_u8; 131];
    let mac = hmac_sha256(
        &long_key,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
    );
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

/// `envoy/configs/jwt-scope.yaml`: the scope is the verified `tenant` claim.
/// Tenant B never gets tenant A's stored response for the same key, a
/// client-sent `x-tenant` never overrides the claim, a token without the
/// claim is refused before the dedup filter. Then the same without the
/// template's header_mutation filter, to pin down what Envoy's jwt_authn
/// does by itself with a client-sent x-tenant (observed in 1.40: it is
/// dropped and the claim's value set).
#[test]
fn jwt_claim_scopes_records_and_a_client_header_cannot_override_it() {
    let template_path = config_file("jwt-scope.yaml");
    let template = std::fs::read_to_string(&template_path).unwrap();
    let (key, kid) = example_jwt_key();
    let token_a = example_jwt(Some("tenant-a"));
    let token_b = example_jwt(Some("tenant-b"));
    let token_none = example_jwt(None);
    let forged = jwt_hs256(b"not the key", &kid, &example_jwt_claims(Some("tenant-a")));
    assert_ne!(key.as_slice(), b"not the key");
    let bearer = |t: &str| format!("Bearer {t}");

    let run = |name: &str, template_path: &std::path::Path, key_prefix: &str| {
        let s = Stack::start_with(name, |upstream_port, wasm| {
            EnvoyConfig::from_template(template_path, upstream_port, wasm, &jwt_recipe())
                .unwrap_or_else(|e| panic!("{e}"))
        });
        let path = "/orders/jwt";
        let k = format!("{key_prefix}-1");
        let req = post(path, &k, &json!({"item": "same body"}));
        let as_a = req.clone().header("authorization", &bearer(&token_a));
        let as_b = req.clone().header("authorization", &bearer(&token_b));

        let a = s.send(&as_a);
        assert_executed(&a);
        assert_eq!(json(&a)["tenant"], "tenant-a", "{}", a.summary());
        let b = s.send(&as_b);
        assert!(
            !is_replayed(&b) && b.body != a.body,
            "tenant B got tenant A's stored response: {}",
            b.summary()
        );
        assert_executed(&b);
        assert_eq!(json(&b)["tenant"], "tenant-b");
        assert_replay_of(&s.send(&as_a), &a);
        assert_replay_of(&s.send(&as_b), &b);
        // A client-sent x-tenant does not override the claim: B asking as
        // "tenant-a" gets B's own response, never A's.
        let b_claims_a = s.send(&as_b.clone().header("x-tenant", "tenant-a"));
        assert!(
            b_claims_a.body != a.body,
            "tenant B with x-tenant: tenant-a got tenant A's response: {}",
            b_claims_a.summary()
        );
        assert_replay_of(&b_claims_a, &b);
        // Without the claim: refused (rbac), not A's response.
        let no_claim = s.send(
            &req.clone()
                .header("authorization", &bearer(&token_none))
                .header("x-tenant", "tenant-a"),
        );
        assert_eq!(no_claim.status, 403, "{}", no_claim.summary());
        assert!(no_claim.body != a.body);
        // No token, or a forged one: 401 from jwt_authn.
        assert_eq!(
            s.send(&req.clone().header("x-tenant", "tenant-a")).status,
            401
        );
        let f = s.send(&req.clone().header("authorization", &bearer(&forged)));
        assert_eq!(f.status, 401, "{}", f.summary());
        assert_eq!(s.upstream.executions_for_key(&k), 2);
    };

    run("hardening-jwt", &template_path, "jwt");

    // The same without the header_mutation filter (test-only variant).
    // Between the header_mutation block's marker and the jwt_authn block's.
    let (start, end) = markers(&template, "          # 1. ", "          # 2. ");
    assert!(template[start..end].contains("envoy.filters.http.header_mutation"));
    let variant = format!("{}{}", &template[..start], &template[end..]);
    let dir = dedup_envoy::paths::scratch_dir("jwt-variant").unwrap();
    let variant_path = dir.join("jwt-scope-without-header-mutation.yaml");
    std::fs::write(&variant_path, variant).unwrap();
    run("hardening-jwt-bare", &variant_path, "jwt-bare");
    let _ = std::fs::remove_dir_all(&dir);
}
