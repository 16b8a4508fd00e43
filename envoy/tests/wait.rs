//! Wait mode (`on_in_flight: "wait"`) in a real Envoy with 2 workers on the shared-data
//! store: concurrent duplicates get the first's answer, one waiter executes after a 5xx,
//! a wait that times out gets 409, and the access log says `waited`; a waiter whose
//! client hangs up leaves no trace (its place is freed, it never executes), above
//! `max_waiters` a duplicate gets 409 at once (one worker), and a rule waits while the
//! top level rejects, a waiter of a held claim gets 409 with the hold's time left, and
//! the route timeout does not count the wait.
//! (The etcd store and a waiter on another proxy: `wait_etcd.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::client::Connection;
use dedup_envoy::paths::{dedup_wasm, workspace_root};
use dedup_envoy::{EnvoyConfig, EnvoyProcess, Request};
use serde_json::json;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

/// A filter config that requires a key and waits for the first, with `more` fields.
fn waiting(more: &str) -> String {
    format!(r#"{{"key": {{"required": true}}, "on_in_flight": "wait", {more}}}"#)
}

/// A stack of its own on `waiting(more)`.
fn waiting_stack(name: &str, more: &str) -> Stack {
    Stack::start(name, &waiting(more))
}

/// A stack of its own on `waiting(more)` with one worker, so every waiter shares its
/// `max_waiters` places.
fn one_worker_stack(name: &str, more: &str) -> Stack {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = dedup_envoy::DemoUpstream::start(0, false).unwrap();
    let config = EnvoyConfig::single_node(upstream.port(), &wasm, &waiting(more))
        .unwrap()
        .with_workers(1, None);
    Stack {
        envoy: EnvoyProcess::start(name, config).unwrap(),
        upstream,
    }
}

fn wait_stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        let config = waiting(r#""wait_timeout_ms": 8000, "in_flight_timeout_seconds": 20"#);
        Stack::start("wait-main", &config)
    })
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
    assert_one_fresh_answer(&answers);
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
    let first = s.send_in_background(failing, 1);
    let dup = post(path, "release-1", &body)
        .header("x-demo-delay-ms", "700")
        .timeout(Duration::from_secs(20));
    let answers = burst(10, &dup);
    assert_eq!(first.join().unwrap().status, 503);
    assert_eq!(s.executions(path), 2, "the 503, then exactly one waiter");
    assert_one_fresh_answer(&answers);
}

#[test]
fn a_wait_longer_than_wait_timeout_ms_gets_409() {
    let s = waiting_stack(
        "wait-timeout",
        r#""wait_timeout_ms": 800, "retry_after_seconds": 3"#,
    );
    let path = "/wait/timeout";
    let req = post(path, "timeout-1", &json!({"a": 1}));
    let slow = req.clone().header("x-demo-delay-ms", "3000");
    let first = s.send_in_background(slow, 1);
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
    let first = s.send_in_background(slow, 2);
    assert!(is_replayed(&s.send(&waiter)));
    first.join().unwrap();
    s.access_log_with(&["dedup=waited"]);
}

/// Polls until filter counter `short` reaches `n` (a duplicate was taken in to wait).
fn wait_counter(s: &Stack, short: &str, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while s.counter(short) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "counter {short} is {}, waited for {n}",
            s.counter(short)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls until Envoy has `n` requests active on the listener (a reset stream is gone).
fn wait_active_requests(s: &Stack, n: u64) {
    let stat = "http.ingress_http.downstream_rq_active";
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    loop {
        let now = s.envoy.stat(stat).unwrap();
        if now == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{stat} is {now}, waited for {n}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The access log line of a request to `path` with `dedup=<decision>`, polled for.
fn log_line(s: &Stack, path: &str, decision: &str) -> String {
    s.poll_access_log(&format!("`{path}` line with `dedup={decision}`"), |log| {
        log.lines()
            .find(|l| {
                l.contains(&format!(" {path}\"")) && l.contains(&format!("dedup={decision} "))
            })
            .map(str::to_string)
    })
}

#[test]
fn a_waiter_whose_client_hangs_up_leaves_nothing_behind() {
    // One place per worker (2 workers): a waiter that stayed registered after its client
    // left would take that worker's only place, and the next duplicate there would get
    // 409 at once. Four waiters leave one after the other, so at least two of them
    // share a worker.
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = dedup_envoy::DemoUpstream::start_recording().unwrap();
    let config = EnvoyConfig::single_node(
        upstream.port(),
        &wasm,
        &waiting(r#""wait_timeout_ms": 15000, "max_waiters": 1, "in_flight_timeout_seconds": 25"#),
    )
    .unwrap();
    let s = Stack {
        envoy: EnvoyProcess::start("wait-hangup", config).unwrap(),
        upstream,
    };
    let path = "/wait/hangup";
    let body = json!({"amount": 7});
    // The first runs long and then fails: its claim is released while waiters exist.
    let first = post(path, "hangup-1", &body)
        .header("x-demo-delay-ms", "4000")
        .header("x-demo-status", "503")
        .header("x-client", "first")
        .timeout(Duration::from_secs(20));
    let addr = s.envoy.addr();
    let first = s.send_in_background(first, 1);
    for i in 0..4 {
        let gone = post(path, "hangup-1", &body)
            .header("x-client", &format!("gone-{i}"))
            .timeout(Duration::from_secs(20));
        let mut conn = Connection::open(addr, Duration::from_secs(5)).unwrap();
        conn.write_request(&gone).unwrap();
        // Taken in to wait, or refused at once (above max_waiters): a waiter that left
        // still holds its worker's place.
        let deadline = std::time::Instant::now() + Duration::from_secs(8);
        while s.counter("waited") < i + 1 {
            assert_eq!(
                s.counter("rejected_in_flight"),
                0,
                "waiter {i} was refused: a waiter that left still holds a place"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "waiter {i} never waited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        conn.reset().unwrap();
        wait_active_requests(&s, 1);
    }
    println!(
        "connections per worker: {:?}",
        s.envoy.connections_per_worker().unwrap()
    );
    // A duplicate that stays: it waits, then executes after the first's 503 (no waiter
    // that left is woken to run instead of it).
    let stays = post(path, "hangup-1", &body)
        .header("x-client", "stays")
        .header("x-demo-delay-ms", "200")
        .timeout(Duration::from_secs(20));
    let stays = std::thread::spawn(move || dedup_envoy::client::send(addr, &stays).unwrap());
    wait_counter(&s, "waited", 5);
    assert_eq!(first.join().unwrap().status, 503);
    let stays = stays.join().unwrap();
    assert_executed(&stays);
    // Its answer is what everyone after it gets.
    let later = post(path, "hangup-1", &body).header("x-client", "later");
    assert_replay_of(&s.send(&later), &stays);
    let clients: Vec<String> = s
        .upstream
        .executions()
        .iter()
        .filter(|e| e.target == path)
        .flat_map(|e| e.header_values("x-client").into_iter().map(String::from))
        .collect();
    assert_eq!(
        clients,
        ["first", "stays"],
        "no client that left was executed"
    );
    assert_eq!(s.counter("rejected_in_flight"), 0);
    assert_eq!(s.counter("wait_timeout"), 0);
    assert_eq!(s.counter("waited"), 5);
    // A waiter that left got no decision: its access log line says so.
    let gone = log_line(&s, path, "-");
    assert!(
        gone.contains(" DC ") && gone.contains(" record=- rule=- "),
        "{gone}"
    );
}

#[test]
fn above_max_waiters_a_duplicate_gets_409_at_once() {
    // One worker, two places: the third duplicate of a running request is refused.
    let s = one_worker_stack(
        "wait-max-waiters",
        r#""wait_timeout_ms": 15000, "max_waiters": 2, "max_waiters_per_scope": 2, "retry_after_seconds": 2, "in_flight_timeout_seconds": 25"#,
    );
    let addr = s.envoy.addr();
    for (round, delay) in [(1u64, "4000"), (2, "2500")] {
        let path = format!("/wait/max/{round}");
        let req = post(&path, &format!("max-{round}"), &json!({"n": round}))
            .timeout(Duration::from_secs(20));
        let slow = req.clone().header("x-demo-delay-ms", delay);
        let first = s.send_in_background(slow, 1);
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let req = req.clone();
                std::thread::spawn(move || dedup_envoy::client::send(addr, &req).unwrap())
            })
            .collect();
        wait_counter(&s, "waited", 2 * round);
        if round == 1 {
            // The third is answered while the first still runs, not after a wait.
            let refused = s.send(&req);
            assert_problem(&refused, 409, "in-flight");
            assert_eq!(refused.header("retry-after"), Some("2"));
            assert_eq!(s.upstream.running(), 1, "the first is still running");
            assert_eq!(s.counter("rejected_in_flight"), 1);
            assert_eq!(s.counter("wait_timeout"), 0, "refused, not timed out");
            assert_eq!(s.counter("waited"), 2, "the refused one never waited");
        }
        let first = first.join().unwrap();
        assert_executed(&first);
        for w in waiters {
            assert_replay_of(&w.join().unwrap(), &first);
        }
        assert_eq!(s.executions(&path), 1);
    }
    // The second round found both places free again.
    assert_eq!(s.counter("rejected_in_flight"), 1);
    assert_eq!(s.counter("wait_replayed"), 4);
    log_line(&s, "/wait/max/1", "in_flight");
}

/// A pool of two with no per-scope setting: one tenant's waiter takes half of it, so
/// its second duplicate gets `409` at once while another tenant's duplicate still
/// waits (before, the default let one tenant take both places).
#[test]
fn a_small_pool_leaves_another_tenant_a_place_by_default() {
    let s = one_worker_stack(
        "wait-pool-shared",
        r#""wait_timeout_ms": 15000, "max_waiters": 2, "in_flight_timeout_seconds": 25, "scope": {"headers": ["x-tenant"]}"#,
    );
    let addr = s.envoy.addr();
    let of = |tenant: &str| {
        post(
            &format!("/wait/pool/{tenant}"),
            "pool-1",
            &json!({"t": tenant}),
        )
        .header("x-tenant", tenant)
        .timeout(Duration::from_secs(20))
    };
    let wait_for = |req: &dedup_envoy::Request| {
        let req = req.clone();
        std::thread::spawn(move || dedup_envoy::client::send(addr, &req).unwrap())
    };
    let noisy_first = s.send_in_background(of("noisy").header("x-demo-delay-ms", "4000"), 1);
    let noisy_waiter = wait_for(&of("noisy"));
    wait_counter(&s, "waited", 1);
    let refused = s.send(&of("noisy"));
    assert_problem(&refused, 409, "in-flight");
    assert_eq!(
        s.counter("waited"),
        1,
        "the noisy tenant's second never waited"
    );
    let victim_first = s.send_in_background(of("victim").header("x-demo-delay-ms", "1500"), 1);
    let victim_waiter = wait_for(&of("victim"));
    wait_counter(&s, "waited", 2);
    let victim_first = victim_first.join().unwrap();
    assert_executed(&victim_first);
    assert_replay_of(&victim_waiter.join().unwrap(), &victim_first);
    let noisy_first = noisy_first.join().unwrap();
    assert_replay_of(&noisy_waiter.join().unwrap(), &noisy_first);
    assert_eq!(s.executions("/wait/pool/victim"), 1);
    assert_eq!(s.executions("/wait/pool/noisy"), 1);
}

#[test]
fn a_rule_waits_while_the_top_level_rejects() {
    let s = Stack::start(
        "wait-per-rule",
        r#"{"key": {"required": true}, "rules": [{"name": "waits", "match": {"path_prefix": "/waits"}, "on_in_flight": "wait", "wait_timeout_ms": 8000}]}"#,
    );
    let addr = s.envoy.addr();
    let run_slow = |req: &dedup_envoy::Request| {
        let slow = req.clone().header("x-demo-delay-ms", "2500");
        std::thread::spawn(move || dedup_envoy::client::send(addr, &slow).unwrap())
    };
    // The rule's route: the duplicate waits and gets the first's answer.
    let waits = post("/waits/pay", "rule-1", &json!({"a": 1})).timeout(Duration::from_secs(20));
    let first = run_slow(&waits);
    s.wait_executions("/waits/pay", 1, Duration::from_secs(5));
    let dup = s.send(&waits);
    let first = first.join().unwrap();
    assert_executed(&first);
    assert_replay_of(&dup, &first);
    // Another route, same key: the top level's `reject`, 409 while the first runs.
    let rejects = post("/orders", "rule-1", &json!({"a": 1}));
    let first = run_slow(&rejects);
    s.wait_executions("/orders", 1, Duration::from_secs(5));
    let dup = s.send(&rejects);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(
        s.upstream.running(),
        1,
        "answered while the first still runs"
    );
    assert_executed(&first.join().unwrap());
    assert_eq!(s.executions("/waits/pay"), 1);
    assert_eq!(s.executions("/orders"), 1);
    assert_eq!(s.counter("waited"), 1);
    assert_eq!(s.counter("wait_replayed"), 1);
    assert_eq!(s.counter("rejected_in_flight"), 1);
    // The access log tells the two apart.
    assert!(log_line(&s, "/waits/pay", "waited").contains(" rule=waits "));
    assert!(log_line(&s, "/orders", "in_flight").contains(" rule=- "));
}

#[test]
fn under_hold_a_waiter_of_a_held_claim_waits_out_its_time_then_gets_409_with_the_hold_left() {
    // The first client hangs up while the upstream runs: the outcome is unknown and,
    // under "hold", the claim is held for the in-flight timeout; a waiter is never
    // released onto the upstream meanwhile.
    let s = waiting_stack(
        "wait-held",
        r#""wait_timeout_ms": 1500, "in_flight_timeout_seconds": 12, "on_unknown_outcome": "hold""#,
    );
    let path = "/wait/held";
    let req = post(path, "held-1", &json!({"h": 1})).timeout(Duration::from_secs(20));
    hang_up_while_it_runs(&s, path, &req);
    let dup = s.send(&req);
    assert_problem(&dup, 409, "in-flight");
    let left: u64 = dup.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (2..=12).contains(&left),
        "retry-after is the hold's time left, not retry_after_seconds: {left}"
    );
    assert_eq!(s.counter("waited"), 1);
    assert_eq!(s.counter("wait_timeout"), 1);
    assert_eq!(s.executions(path), 1, "the held key never ran again");
    log_line(&s, path, "in_flight");
}

/// The first client of `req` hangs up while the upstream runs it (2 s): once Envoy has
/// ended its stream, its outcome is unknown.
fn hang_up_while_it_runs(s: &Stack, path: &str, req: &Request) {
    s.hang_up(
        &req.clone().header("x-demo-delay-ms", "2000"),
        Duration::from_millis(300),
    );
    s.wait_executions(path, 1, Duration::from_secs(5));
    s.envoy
        .wait_stat_at_least(
            "wasmcustom.proxy_dedup_outcome_unknown",
            1,
            Duration::from_secs(8),
        )
        .unwrap();
}

#[test]
fn by_default_a_duplicate_of_an_unknown_outcome_is_answered_at_once_not_made_to_wait() {
    let s = waiting_stack(
        "wait-unknown",
        r#""wait_timeout_ms": 5000, "in_flight_timeout_seconds": 12"#,
    );
    let path = "/wait/unknown";
    let req = post(path, "unknown-1", &json!({"u": 1})).timeout(Duration::from_secs(20));
    hang_up_while_it_runs(&s, path, &req);
    let t = std::time::Instant::now();
    let dup = s.send(&req);
    assert_problem(&dup, 409, "outcome-unknown");
    assert!(
        t.elapsed() < Duration::from_millis(2000),
        "answered after {:?}: waiting on a record kept until its TTL changes nothing",
        t.elapsed()
    );
    assert_eq!(s.counter("waited"), 0);
    std::thread::sleep(Duration::from_millis(2000));
    assert_problem(&s.send(&req), 409, "outcome-unknown");
    assert_eq!(s.executions(path), 1, "the key never ran again");
    log_line(&s, path, "rejected_outcome_unknown");
}

#[test]
fn the_route_timeout_does_not_count_the_time_a_duplicate_waits() {
    // hardening.yaml: `x-route: short-timeout` picks a route with a 1 s timeout (the
    // header is not part of the payload). The router only sees a waiter once the
    // filter lets it go, so a wait longer than the route timeout still gets the answer.
    let s = Stack::start_with("wait-route-timeout", |upstream_port, wasm| {
        let template = workspace_root().join("envoy/tests/templates/hardening.yaml");
        EnvoyConfig::from_template(
            &template,
            upstream_port,
            wasm,
            &waiting(r#""wait_timeout_ms": 8000"#),
        )
        .and_then(|c| c.with_port("RL_LISTEN_PORT"))
        .and_then(|c| c.with_port("DEAD_PORT"))
        .unwrap()
    });
    let path = "/wait/route-timeout";
    let req = post(path, "route-1", &json!({"r": 1})).timeout(Duration::from_secs(20));
    let slow = req.clone().header("x-demo-delay-ms", "2500");
    let first = s.send_in_background(slow, 1);
    let dup = s.send(&req.clone().header("x-route", "short-timeout"));
    let first = first.join().unwrap();
    assert_executed(&first);
    assert_replay_of(&dup, &first);
    assert_eq!(s.counter("waited"), 1, "it waited (past its route's 1 s)");
    assert_eq!(s.executions(path), 1);
}

#[test]
fn one_tenants_waiters_never_take_another_tenants_place() {
    // One worker, four places, two per tenant: the noisy tenant's third duplicate is
    // refused at once, the victim's duplicate still waits and gets the replay.
    let s = one_worker_stack(
        "wait-per-scope",
        r#""scope": {"headers": ["x-tenant"]}, "wait_timeout_ms": 15000, "max_waiters": 4,
           "max_waiters_per_scope": 2, "in_flight_timeout_seconds": 25"#,
    );
    let addr = s.envoy.addr();
    let of = |tenant: &str, key: &str| {
        post("/wait/scope", key, &json!({"t": tenant}))
            .header("x-tenant", tenant)
            .timeout(Duration::from_secs(20))
    };
    let noisy = of("noisy", "n-1");
    let victim = of("victim", "v-1");
    let firsts = [
        s.send_in_background(noisy.clone().header("x-demo-delay-ms", "3000"), 1),
        s.send_in_background(victim.clone().header("x-demo-delay-ms", "3000"), 1),
    ];
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let req = noisy.clone();
            std::thread::spawn(move || dedup_envoy::client::send(addr, &req).unwrap())
        })
        .collect();
    wait_counter(&s, "waited", 2);
    let refused = s.send(&noisy);
    assert_problem(&refused, 409, "in-flight");
    assert_eq!(
        s.counter("waited"),
        2,
        "the noisy tenant's third never waited"
    );
    // The victim's duplicate waits for its first and gets its answer.
    let victim_dup = s.send(&victim);
    assert!(is_replayed(&victim_dup), "{}", victim_dup.summary());
    assert_eq!(s.counter("waited"), 3);
    for f in firsts {
        assert_executed(&f.join().unwrap());
    }
    for w in waiters {
        assert!(is_replayed(&w.join().unwrap()));
    }
    assert_eq!(s.executions("/wait/scope"), 2, "each tenant's key ran once");
}
