//! The ordering guard (`ordering`) in a real Envoy with 2 workers on the shared-data
//! store, in front of the recording demo upstream (it keeps when each execution began
//! and when its answer's head was written):
//! - versions 1..30 of a few entities, shuffled with duplicates, from several clients:
//!   the upstream receives per entity strictly increasing versions, one at a time, each
//!   at most once; every stale delivery gets `409 stale-version` (or, under `on_stale:
//!   "acknowledge"`, `204` with `idempotent-stale: true`) naming a version that had
//!   completed; a duplicate of an executed delivery gets its replay;
//! - a burst of versions while one runs: `409 in-flight` (reject), or they wait and run
//!   one at a time (wait mode);
//! - a 5xx of version k: k runs when retried, k−1 stays refused;
//! - a full entity bucket (`store.max_entities: 16`) evicts the entity whose applied
//!   version expires first (counted), never one in flight (`503 store-full`);
//! - timestamps compare as instants whatever their offsets, strings byte by byte,
//!   integers as numbers, JSON-pointer entities and versions; missing or malformed ones
//!   get `400` with their problem type and `dedup=bad_version` in the access log.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::upstream::Execution;
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The guard on header `x-entity`, integer versions in header `x-version`, with `more`
/// fields of `ordering`.
fn by_headers(more: Value) -> Value {
    let mut o = json!({"entity": {"header": "x-entity"}, "version": {"header": "x-version"}});
    if let (Some(o), Some(more)) = (o.as_object_mut(), more.as_object()) {
        o.extend(more.clone());
    }
    o
}

/// Envoy (2 workers) with `filter_config` in front of a recording demo upstream.
fn ordered_stack(name: &str, filter_config: &Value) -> Stack {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start_recording().expect("demo upstream");
    let config =
        EnvoyConfig::single_node(upstream.port(), &wasm, &filter_config.to_string()).unwrap();
    let envoy = EnvoyProcess::start(name, config).unwrap_or_else(|e| panic!("starting Envoy: {e}"));
    Stack { envoy, upstream }
}

/// One delivery of version `version` of `entity`, keyed `key`, as headers (and the same
/// in its JSON body).
fn delivery(path: &str, entity: &str, version: &str, key: &str) -> Request {
    post(path, key, &json!({"entity": entity, "version": version}))
        .header("x-entity", entity)
        .header("x-version", version)
        .timeout(Duration::from_secs(20))
}

/// The upstream's executions of `entity` (header `x-entity`), in the order they began.
fn executions_of(s: &Stack, entity: &str) -> Vec<Execution> {
    let mut e: Vec<Execution> = s
        .upstream
        .executions()
        .into_iter()
        .filter(|e| e.header_values("x-entity") == [entity])
        .collect();
    e.sort_by_key(|e| e.arrived);
    e
}

fn version_of(e: &Execution) -> String {
    e.header_values("x-version")
        .first()
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// `entity`'s executions began one after the other's answer: none overlaps another.
fn assert_one_at_a_time(entity: &str, execs: &[Execution]) {
    for w in execs.windows(2) {
        let end = w[0]
            .head_sent
            .unwrap_or_else(|| panic!("{entity}: an execution without an answer: {:?}", w[0]));
        assert!(
            w[1].arrived > end,
            "{entity}: version {} began {:?} before version {} was answered: two versions \
             of one entity executed concurrently",
            version_of(&w[1]),
            end - w[1].arrived.min(end),
            version_of(&w[0]),
        );
    }
}

/// The integer versions `entity`'s executions carried, in the order they began; fails
/// unless they strictly increase (each at most once) and none overlaps another.
fn assert_increasing_one_at_a_time(entity: &str, execs: &[Execution]) -> Vec<i64> {
    assert_one_at_a_time(entity, execs);
    let versions: Vec<i64> = execs
        .iter()
        .map(|e| version_of(e).parse().unwrap())
        .collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "{entity}: the upstream received versions {versions:?}: not strictly increasing"
    );
    versions
}

fn header_is(r: &Response, name: &str, value: &str) -> bool {
    r.header(name) == Some(value)
}

// --- shuffled deliveries from several clients ----------------------------------------

/// A small deterministic generator (xorshift64*), so a failing shuffle can be rerun
/// (`ORDERING_SEED`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    std::env::var("ORDERING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0bad_5eed_1234_5677)
}

/// One delivery of a plan: version `version` of `entity` under `key`.
#[derive(Debug, Clone)]
struct Delivery {
    entity: String,
    version: i64,
    key: String,
}

impl Delivery {
    fn request(&self, path: &str) -> Request {
        delivery(path, &self.entity, &self.version.to_string(), &self.key)
            // Long enough that a second version, were it let through, would overlap.
            .header("x-demo-delay-ms", "25")
    }
}

/// Versions 1..=`n` of each of `entities`, every third sent twice and every seventh a
/// third time (same key: the same delivery again), shuffled the way a broker redelivers:
/// each copy moved up to a few versions later, the second copies further, the third at
/// the end.
fn shuffled_plan(prefix: &str, entities: &[&str], n: i64, rng: &mut Rng) -> Vec<Delivery> {
    let mut plan: Vec<(u64, Delivery)> = Vec::new();
    for e in entities {
        for v in 1..=n {
            let d = Delivery {
                entity: format!("{prefix}-{e}"),
                version: v,
                key: format!("{prefix}-{e}-v{v}"),
            };
            let at = v as u64 * 8;
            plan.push((at + rng.below(24), d.clone()));
            if v % 3 == 0 {
                plan.push((at + rng.below(48), d.clone()));
            }
            if v % 7 == 0 {
                plan.push(((n as u64 + 8) * 8 + rng.below(16), d));
            }
        }
    }
    // Ties broken at random too (the sort is stable: shuffle first).
    for i in (1..plan.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        plan.swap(i, j);
    }
    plan.sort_by_key(|(at, _)| *at);
    plan.into_iter().map(|(_, d)| d).collect()
}

/// A delivery's final answer, and when it was sent and answered.
struct Answered {
    delivery: Delivery,
    response: Response,
    answered: Instant,
}

/// `plan` sent to `addr` by `clients` threads taking the next delivery in turn, each
/// request on a new connection (so both workers serve them). A `409 in-flight` (a wait
/// that timed out) puts the delivery back at the end of the queue, as a broker
/// redelivers; at most `plan.len() * 10` requests in all. Returns every final answer and
/// how many were bounced.
fn deliver(
    addr: SocketAddr,
    path: &str,
    plan: &[Delivery],
    clients: usize,
) -> (Vec<Answered>, u64) {
    let queue = Mutex::new(plan.iter().cloned().collect::<VecDeque<_>>());
    let answers = Mutex::new(Vec::new());
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let bounced = std::sync::atomic::AtomicU64::new(0);
    let cap = plan.len() * 10;
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| loop {
                let Some(d) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                let n = sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert!(
                    n < cap,
                    "more than {cap} requests for {} deliveries",
                    plan.len()
                );
                let req = d.request(path);
                let response = dedup_envoy::client::send(addr, &req)
                    .unwrap_or_else(|e| panic!("{} v{} ({}): {e}", d.entity, d.version, d.key));
                let answered = Instant::now();
                if response.status == 409
                    && dedup_envoy::problem_type(&response.body)
                        == "urn:proxy-dedup:problem:in-flight"
                {
                    bounced.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    queue.lock().unwrap().push_back(d);
                    continue;
                }
                answers.lock().unwrap().push(Answered {
                    delivery: d,
                    response,
                    answered,
                });
            });
        }
    });
    (answers.into_inner().unwrap(), bounced.into_inner())
}

/// How a stale delivery is answered under the stack's config.
#[derive(Debug, Clone, Copy)]
enum StaleAnswer {
    /// `409` problem `stale-version`.
    Reject,
    /// `204` with `idempotent-stale: true`, no body.
    Acknowledge204,
}

/// The applied version a stale answer names, after checking it is `how`'s answer.
fn stale_answer(how: StaleAnswer, r: &Response) -> Option<i64> {
    let is_stale = match how {
        StaleAnswer::Reject => {
            r.status == 409
                && dedup_envoy::problem_type(&r.body) == "urn:proxy-dedup:problem:stale-version"
        }
        StaleAnswer::Acknowledge204 => header_is(r, "idempotent-stale", "true"),
    };
    if !is_stale {
        return None;
    }
    match how {
        StaleAnswer::Reject => assert_problem(r, 409, "stale-version"),
        StaleAnswer::Acknowledge204 => {
            assert_eq!(r.status, 204, "acknowledged stale: {}", r.summary());
            assert!(r.body.is_empty(), "a 204 has no body: {}", r.summary());
            assert!(!is_replayed(r), "{}", r.summary());
        }
    }
    let applied = r.header("idempotent-applied-version").unwrap_or_else(|| {
        panic!(
            "a stale answer without idempotent-applied-version: {}",
            r.summary()
        )
    });
    Some(
        applied
            .parse()
            .unwrap_or_else(|e| panic!("applied version {applied:?}: {e}")),
    )
}

/// Sends `shuffled_plan(prefix, entities, 30)` through `s` and checks everything the
/// guard promises of it (see the file's doc); `stale_counter`: `proxy_dedup_stale`
/// counts this run only (the stack is the test's own).
fn shuffled_run(s: &Stack, prefix: &str, entities: &[&str], how: StaleAnswer) {
    let seed = seed();
    let mut rng = Rng(seed);
    let plan = shuffled_plan(prefix, entities, 30, &mut rng);
    let started = Instant::now();
    let (answers, bounced) = deliver(s.envoy.addr(), "/events", &plan, 6);
    let took = started.elapsed();
    let ctx = format!("seed {seed} (rerun with ORDERING_SEED={seed})");
    assert_eq!(
        answers.len(),
        plan.len(),
        "{ctx}: every delivery answered once"
    );

    // The upstream: per entity strictly increasing versions, one at a time.
    let mut executed: BTreeMap<String, BTreeMap<i64, Execution>> = BTreeMap::new();
    for e in entities {
        let entity = format!("{prefix}-{e}");
        let execs = executions_of(s, &entity);
        let versions = assert_increasing_one_at_a_time(&entity, &execs);
        assert_eq!(
            versions.last(),
            Some(&30),
            "{ctx}: {entity}: the highest version is never stale, it must have run: {versions:?}"
        );
        for x in &execs {
            assert_eq!(x.status, 200, "{ctx}: {entity}");
            let key = x.header_values("idempotency-key");
            let v: i64 = version_of(x).parse().unwrap();
            assert_eq!(key, [format!("{entity}-v{v}")], "{ctx}");
            assert_eq!(
                s.upstream.executions_for_key(key[0]),
                1,
                "{ctx}: {}",
                key[0]
            );
        }
        println!("{entity}: executed {versions:?}");
        executed.insert(
            entity,
            execs
                .into_iter()
                .map(|x| (version_of(&x).parse().unwrap(), x))
                .collect(),
        );
    }

    // Every answer: the execution, its replay, or the configured stale answer.
    let mut stale = 0u64;
    let mut replays = 0u64;
    let mut fresh_of: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for a in &answers {
        let (d, r) = (&a.delivery, &a.response);
        let ran = executed[&d.entity].get(&d.version);
        if let Some(applied) = stale_answer(how, r) {
            stale += 1;
            assert!(
                ran.is_none(),
                "{ctx}: {} v{} ran, yet a copy of it got a stale answer (it should be replayed): {}",
                d.entity,
                d.version,
                r.summary()
            );
            assert!(
                applied >= d.version,
                "{ctx}: {} v{} refused as stale below applied version {applied}",
                d.entity,
                d.version
            );
            let by = executed[&d.entity].get(&applied).unwrap_or_else(|| {
                panic!(
                    "{ctx}: {} v{} refused naming applied version {applied}, which never ran",
                    d.entity, d.version
                )
            });
            assert!(
                by.head_sent.is_some_and(|t| t < a.answered),
                "{ctx}: {} v{} refused naming version {applied} before that one had answered",
                d.entity,
                d.version
            );
            continue;
        }
        let ran = ran.unwrap_or_else(|| {
            panic!(
                "{ctx}: {} v{} never ran and was not refused as stale: {}",
                d.entity,
                d.version,
                r.summary()
            )
        });
        assert_eq!(r.status, 200, "{ctx}: {}", r.summary());
        assert_eq!(
            r.body, ran.response_body,
            "{ctx}: {} v{}: the answer is not its execution's (or its replay)",
            d.entity, d.version
        );
        if is_replayed(r) {
            replays += 1;
        } else {
            assert!(
                fresh_of.insert(d.key.clone(), r.body.clone()).is_none(),
                "{ctx}: {} answered fresh twice",
                d.key
            );
        }
    }
    for (entity, runs) in &executed {
        for (v, x) in runs {
            let key = format!("{entity}-v{v}");
            assert!(
                fresh_of.contains_key(&key),
                "{ctx}: {key} ran (order {}) but no client got its fresh answer",
                x.order_id
            );
        }
    }
    let runs: usize = executed.values().map(BTreeMap::len).sum();
    println!(
        "{} deliveries in {took:?}: {runs} executed, {replays} replayed, {stale} stale, \
         {bounced} bounced (409 in-flight, redelivered); {ctx}",
        plan.len()
    );
    assert!(
        replays > 0,
        "{ctx}: the plan's duplicates should have met completed deliveries"
    );
    assert!(
        stale > 0,
        "{ctx}: the shuffle should have made some deliveries stale"
    );
    assert_eq!(
        s.counter("stale"),
        stale,
        "proxy_dedup_stale: one per stale answer"
    );
    assert_eq!(s.counter("executed"), runs as u64, "proxy_dedup_executed");
    // One access-log line per stale answer, decision `stale`.
    s.poll_access_log("every stale decision", |log| {
        (log.matches("dedup=stale ").count() as u64 == stale).then_some(())
    });
}

#[test]
fn shuffled_versions_with_duplicates_reach_the_upstream_in_order_once_and_stale_ones_get_409() {
    let config = json!({
        "key": {"required": true},
        "on_in_flight": "wait",
        "wait_timeout_ms": 10000,
        "in_flight_timeout_seconds": 20,
        "ordering": by_headers(json!({})),
    });
    let s = ordered_stack("ordering-shuffled-reject", &config);
    shuffled_run(&s, "rej", &["a", "b", "c", "d"], StaleAnswer::Reject);
}

#[test]
fn shuffled_versions_with_duplicates_under_acknowledge_get_204_stale() {
    // Short waits: some time out (409 in-flight), and the client redelivers them later.
    let config = json!({
        "key": {"required": true},
        "on_in_flight": "wait",
        "wait_timeout_ms": 40,
        "retry_after_seconds": 0,
        "ordering": by_headers(json!({"on_stale": "acknowledge", "acknowledge_status": 204})),
    });
    let s = ordered_stack("ordering-shuffled-ack", &config);
    shuffled_run(&s, "ack", &["a", "b", "c"], StaleAnswer::Acknowledge204);
}

// --- one version at a time ------------------------------------------------------------

/// Reject mode (the top level), integer header versions, and rules for the other
/// version types, JSON pointers and the default acknowledgement. Shared by the tests
/// below, each on entities of its own; none of them counts on a counter's exact value.
fn misc_stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        let rule = |name: &str, ordering: Value| {
            json!({"name": name, "match": {"path_prefix": format!("/{name}/")}, "ordering": ordering})
        };
        let typed = |t: &str| {
            json!({"entity": {"header": "x-entity"}, "version": {"header": "x-version", "type": t}})
        };
        let config = json!({
            "key": {"required": true},
            "retry_after_seconds": 2,
            "ordering": by_headers(json!({})),
            "rules": [
                rule("ts", typed("timestamp")),
                rule("str", typed("string")),
                rule("json", json!({"entity": {"json_pointer": "/data/id"},
                                    "version": {"json_pointer": "/data/version"}})),
                rule("ack", by_headers(json!({"on_stale": "acknowledge"}))),
            ],
        });
        ordered_stack("ordering-misc", &config)
    })
}

/// A wait-mode stack of its own.
fn waiting_stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        let config = json!({
            "key": {"required": true},
            "on_in_flight": "wait",
            "wait_timeout_ms": 10000,
            "in_flight_timeout_seconds": 20,
            "ordering": by_headers(json!({})),
        });
        ordered_stack("ordering-wait", &config)
    })
}

/// `versions` of `entity` (each keyed `<entity>-v<version>`) released together, each
/// on a connection of its own opened beforehand, each with `delay_ms` upstream.
fn version_burst(
    s: &Stack,
    path: &str,
    entity: &str,
    versions: std::ops::RangeInclusive<i64>,
    delay_ms: u64,
) -> Vec<(i64, Response)> {
    let n = versions.clone().count();
    let barrier = Arc::new(Barrier::new(n));
    let addr = s.envoy.addr();
    let handles: Vec<_> = versions
        .map(|v| {
            let req = delivery(path, entity, &v.to_string(), &format!("{entity}-v{v}"))
                .header("x-demo-delay-ms", &delay_ms.to_string());
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut conn =
                    dedup_envoy::client::Connection::open(addr, Duration::from_secs(20)).unwrap();
                barrier.wait();
                (v, conn.send(&req).unwrap())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn versions_sent_while_another_runs_get_409_in_flight_and_never_reach_the_upstream() {
    let s = misc_stack();
    let (path, entity) = ("/busy", "busy-1");
    let slow = delivery(path, entity, "1", "busy-1-v1").header("x-demo-delay-ms", "3000");
    let first = s.send_in_background(slow, 1);
    for (v, r) in version_burst(s, path, entity, 2..=7, 0) {
        assert_problem(&r, 409, "in-flight");
        assert_eq!(r.header("retry-after"), Some("2"), "v{v}: {}", r.summary());
        let detail = json(&r)["detail"].as_str().unwrap_or_default().to_string();
        assert!(
            detail.contains("version 1 of this entity is in flight"),
            "v{v}: {detail}"
        );
    }
    assert_eq!(s.executions(path), 1, "only version 1 reached the upstream");
    assert_executed(&first.join().unwrap());
    // Their keys were released: 7 runs now, 2 is stale.
    assert_executed(&s.send(&delivery(path, entity, "7", "busy-1-v7")));
    let stale = s.send(&delivery(path, entity, "2", "busy-1-v2"));
    assert_problem(&stale, 409, "stale-version");
    assert_eq!(stale.header("idempotent-applied-version"), Some("7"));
    let versions = assert_increasing_one_at_a_time(entity, &executions_of(s, entity));
    assert_eq!(versions, [1, 7]);
}

#[test]
fn in_wait_mode_concurrent_versions_of_an_entity_run_one_at_a_time_in_order() {
    let s = waiting_stack();
    let (path, entity) = ("/burst", "burst-1");
    let slow = delivery(path, entity, "1", "burst-1-v1").header("x-demo-delay-ms", "800");
    let first = s.send_in_background(slow, 1);
    let answers = version_burst(s, path, entity, 2..=9, 100);
    assert_executed(&first.join().unwrap());
    let execs = executions_of(s, entity);
    let versions = assert_increasing_one_at_a_time(entity, &execs);
    println!("executed, in this order: {versions:?}");
    assert_eq!(versions.first(), Some(&1));
    assert_eq!(
        versions.last(),
        Some(&9),
        "the highest version is never stale"
    );
    for (v, r) in &answers {
        if versions.contains(v) {
            assert_executed(r);
        } else {
            assert_problem(r, 409, "stale-version");
            let applied: i64 = r
                .header("idempotent-applied-version")
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                applied > *v && versions.contains(&applied),
                "v{v}: {}",
                r.summary()
            );
        }
    }
}

#[test]
fn a_5xx_of_version_k_lets_k_run_again_and_never_lets_k_minus_1_through() {
    let s = misc_stack();
    let path = "/fail";
    // k−1 applied, k fails: k−1 stays refused; k runs when retried; then k−1 is refused
    // naming k.
    let e = "fail-a";
    let v1 = delivery(path, e, "1", "fail-a-v1");
    let v1_first = s.send(&v1);
    assert_executed(&v1_first);
    let v2 = delivery(path, e, "2", "fail-a-v2");
    let failed = s.send(&v2.clone().header("x-demo-status", "503"));
    assert_eq!(failed.status, 503, "{}", failed.summary());
    let refused = s.send(&delivery(path, e, "1", "fail-a-v1-again"));
    assert_problem(&refused, 409, "stale-version");
    assert_eq!(
        refused.header("idempotent-applied-version"),
        Some("1"),
        "the 5xx left the applied version at 1"
    );
    assert_replay_of(&s.send(&v1), &v1_first);
    let retried = s.send(&v2);
    assert_executed(&retried);
    for (v, key) in [("1", "fail-a-v1-late"), ("2", "fail-a-v2-other")] {
        let r = s.send(&delivery(path, e, v, key));
        assert_problem(&r, 409, "stale-version");
        assert_eq!(r.header("idempotent-applied-version"), Some("2"), "v{v}");
    }
    assert_replay_of(&s.send(&v2), &retried);
    let execs = executions_of(s, e);
    assert_one_at_a_time(e, &execs);
    let seen: Vec<(String, u16)> = execs.iter().map(|x| (version_of(x), x.status)).collect();
    assert_eq!(
        seen,
        [("1".into(), 200), ("2".into(), 503), ("2".into(), 200)]
    );

    // A released version raises nothing: with 1 applied and 3 failed, 2 may still run
    // (it never did); then 3 runs when retried, and 2 is refused.
    let e = "fail-b";
    assert_executed(&s.send(&delivery(path, e, "1", "fail-b-v1")));
    let v3 = delivery(path, e, "3", "fail-b-v3");
    assert_eq!(
        s.send(&v3.clone().header("x-demo-status", "502")).status,
        502
    );
    assert_executed(&s.send(&delivery(path, e, "2", "fail-b-v2")));
    assert_executed(&s.send(&v3));
    let r = s.send(&delivery(path, e, "2", "fail-b-v2-again"));
    assert_problem(&r, 409, "stale-version");
    assert_eq!(r.header("idempotent-applied-version"), Some("3"));
    let seen: Vec<(String, u16)> = executions_of(s, e)
        .iter()
        .map(|x| (version_of(x), x.status))
        .collect();
    assert_eq!(
        seen,
        [
            ("1".into(), 200),
            ("3".into(), 502),
            ("2".into(), 200),
            ("3".into(), 200)
        ]
    );
}

#[test]
fn a_full_entity_bucket_evicts_the_oldest_applied_version_and_never_a_running_one() {
    // One entity bucket of 16 (`store.max_entities: 16`).
    let config = json!({
        "key": {"required": true},
        "store": {"max_entities": 16},
        "retry_after_seconds": 3,
        "ordering": by_headers(json!({})),
    });
    let s = ordered_stack("ordering-evict", &config);
    let path = "/evict";
    for i in 0..16 {
        let (e, key) = (format!("ev-{i}"), format!("ev-{i}-v5"));
        assert_executed(&s.send(&delivery(path, &e, "5", &key)));
    }
    assert_eq!(counter_of(&s.envoy, "entities_evicted"), 0);
    // A 17th entity takes the slot of the one whose applied version expires first.
    assert_executed(&s.send(&delivery(path, "ev-16", "1", "ev-16-v1")));
    assert_eq!(counter_of(&s.envoy, "entities_evicted"), 1);
    // ev-0's history went with it: an older version of it runs (as documented), taking
    // ev-1's slot; ev-15 kept its own.
    assert_executed(&s.send(&delivery(path, "ev-0", "1", "ev-0-v1")));
    assert_eq!(counter_of(&s.envoy, "entities_evicted"), 2);
    let r = s.send(&delivery(path, "ev-15", "4", "ev-15-v4"));
    assert_problem(&r, 409, "stale-version");
    assert_eq!(r.header("idempotent-applied-version"), Some("5"));
    // Sixteen entities in flight fill the bucket: a new one finds no slot and gets 503
    // store-full, nothing evicted.
    let running: Vec<_> = (0..16)
        .map(|i| {
            let req = delivery(
                &format!("{path}/busy-{i}"),
                &format!("busy-{i}"),
                "1",
                &format!("busy-{i}-v1"),
            )
            .header("x-demo-delay-ms", "3000");
            s.send_in_background(req, 1)
        })
        .collect();
    let evicted = counter_of(&s.envoy, "entities_evicted");
    let full = s.send(&delivery(path, "ev-17", "1", "ev-17-v1"));
    assert_problem(&full, 503, "store-full");
    // The answer's detail is the records' one; Envoy's log says it was the entities'.
    let deadline = Instant::now() + Duration::from_secs(8);
    while !s.envoy.log().contains("store full: entity ") {
        assert!(
            Instant::now() < deadline,
            "no `store full: entity` warning in Envoy's log:\n{}",
            s.envoy.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(full.header("retry-after"), Some("3"));
    assert_eq!(counter_of(&s.envoy, "entities_evicted"), evicted);
    for r in running {
        assert_executed(&r.join().unwrap());
    }
    assert_eq!(executions_of(&s, "ev-17").len(), 0);
    // Its key was released: it runs now.
    assert_executed(&s.send(&delivery(path, "ev-17", "1", "ev-17-v1")));
}

// --- how versions compare -------------------------------------------------------------

/// Sends `(version, expected)` in turn as deliveries of `entity` to `path`, each with a
/// key of its own: `Ok(())` it runs, `Err(applied)` it is refused as stale naming
/// `applied`.
fn in_turn(s: &Stack, path: &str, entity: &str, steps: &[(&str, Result<(), &str>)]) {
    for (i, (version, expected)) in steps.iter().enumerate() {
        let r = s.send(&delivery(path, entity, version, &format!("{entity}-{i}")));
        match expected {
            Ok(()) => {
                assert_executed(&r);
                assert_eq!(json(&r)["executions"], 1, "{version}");
            }
            Err(applied) => {
                assert_problem(&r, 409, "stale-version");
                assert_eq!(
                    r.header("idempotent-applied-version"),
                    Some(*applied),
                    "{entity} {version}: {}",
                    r.summary()
                );
            }
        }
    }
}

#[test]
fn timestamps_compare_as_the_instants_they_name_whatever_their_offset() {
    let s = misc_stack();
    in_turn(
        s,
        "/ts/hook",
        "ts-1",
        &[
            ("2026-12-02T10:00:00+01:00", Ok(())),
            // 09:30Z is after 10:00+01:00 (09:00Z), though it reads smaller.
            ("2026-12-02T09:30:00Z", Ok(())),
            // 10:29:59.5+01:00 is 09:29:59.5Z: before.
            ("2026-12-02T10:29:59.5+01:00", Err("2026-12-02T09:30:00Z")),
            // The same instant in another offset: at the applied version, stale.
            ("2026-12-02T04:30:00-05:00", Err("2026-12-02T09:30:00Z")),
            // A nanosecond later runs; lower case `t` and `z` are RFC 3339 too.
            ("2026-12-02t09:30:00.000000001z", Ok(())),
            (
                "2026-12-02T09:30:00.000000001+00:00",
                Err("2026-12-02T09:30:00.000000001Z"),
            ),
            // Offsets that cross a day: 2026-12-03T00:30+14:00 is 2026-12-02T10:30Z,
            // 2026-12-01T23:59-12:00 is 2026-12-02T11:59Z.
            ("2026-12-03T00:30:00+14:00", Ok(())),
            ("2026-12-02T10:29:59Z", Err("2026-12-02T10:30:00Z")),
            ("2026-12-01T23:59:00-12:00", Ok(())),
            ("2026-12-02T11:58:59.999Z", Err("2026-12-02T11:59:00Z")),
        ],
    );
    // A leap second counts as the next second.
    in_turn(
        s,
        "/ts/hook",
        "ts-2",
        &[
            ("2016-12-31T23:59:60Z", Ok(())),
            ("2017-01-01T00:00:00Z", Err("2017-01-01T00:00:00Z")),
            ("2017-01-01T00:00:00.1Z", Ok(())),
        ],
    );
    for bad in [
        "2026-12-02T10:00:00",
        "2026-12-02",
        "2026-02-30T10:00:00Z",
        "2026-12-02T24:00:00Z",
        "1764669600",
    ] {
        let r = s.send(&delivery("/ts/hook", "ts-3", bad, "ts-3-bad"));
        assert_problem(&r, 400, "invalid-version");
    }
    assert_eq!(executions_of(s, "ts-3").len(), 0);
}

#[test]
fn strings_compare_byte_by_byte() {
    let s = misc_stack();
    in_turn(
        s,
        "/str/hook",
        "str-1",
        &[
            ("b", Ok(())),
            ("a9", Err("b")),
            ("ba", Ok(())),
            ("B", Err("ba")),
            // UTF-8 code point order: "é" (C3 A9) above every ASCII byte.
            ("é", Ok(())),
            ("zzz", Err("é")),
        ],
    );
    // Digits too: "10" < "9", and "09" < "9".
    in_turn(
        s,
        "/str/hook",
        "str-3",
        &[
            ("9", Ok(())),
            ("10", Err("9")),
            ("09", Err("9")),
            ("90", Ok(())),
        ],
    );
    let r = s.send(&delivery(
        "/str/hook",
        "str-2",
        &"v".repeat(129),
        "str-2-long",
    ));
    assert_problem(&r, 400, "invalid-version");
}

#[test]
fn integers_compare_as_numbers() {
    let s = misc_stack();
    in_turn(
        s,
        "/int",
        "int-1",
        &[
            ("-5", Ok(())),
            ("-6", Err("-5")),
            ("0", Ok(())),
            ("9", Ok(())),
            ("10", Ok(())),
            // Leading zeros: the same number.
            ("0010", Err("10")),
            ("9223372036854775807", Ok(())),
        ],
    );
}

#[test]
fn entity_and_version_from_json_pointers() {
    let s = misc_stack();
    let event = |key: &str, data: Value| {
        post("/json/hook", key, &json!({"id": key, "data": data})).timeout(Duration::from_secs(20))
    };
    let first = s.send(&event("evt-1", json!({"id": 123, "version": 5})));
    assert_executed(&first);
    // 123 and "123" are one entity; a version may be a JSON integer or a string of one.
    let r = s.send(&event("evt-2", json!({"id": "123", "version": "5"})));
    assert_problem(&r, 409, "stale-version");
    assert_eq!(r.header("idempotent-applied-version"), Some("5"));
    assert_executed(&s.send(&event("evt-3", json!({"id": "123", "version": "6"}))));
    assert_executed(&s.send(&event("evt-4", json!({"id": 124, "version": 1}))));
    assert_replay_of(
        &s.send(&event("evt-1", json!({"id": 123, "version": 5}))),
        &first,
    );
}

#[test]
fn stale_requests_are_acknowledged_with_200_under_acknowledge() {
    let s = misc_stack();
    let path = "/ack/hook";
    assert_executed(&s.send(&delivery(path, "ack-1", "2", "ack-1-v2")));
    let ack = s.send(&delivery(path, "ack-1", "1", "ack-1-v1"));
    assert_eq!(ack.status, 200, "{}", ack.summary());
    assert!(
        header_is(&ack, "idempotent-stale", "true"),
        "{}",
        ack.summary()
    );
    assert!(!is_replayed(&ack), "{}", ack.summary());
    assert_eq!(ack.header("idempotent-applied-version"), Some("2"));
    assert_eq!(
        json(&ack),
        json!({"stale": true, "version": "1", "applied_version": "2"})
    );
    // Acknowledged again when sent again (the stale request's key was not kept).
    let again = s.send(&delivery(path, "ack-1", "1", "ack-1-v1"));
    assert!(
        header_is(&again, "idempotent-stale", "true"),
        "{}",
        again.summary()
    );
    assert_eq!(executions_of(s, "ack-1").len(), 1);
    s.poll_access_log("the acknowledged stale decision", |log| {
        log.lines()
            .any(|l| {
                l.contains("POST /ack/hook") && l.contains(" 200 ") && l.contains("dedup=stale ")
            })
            .then_some(())
    });
}

// --- bad entities and versions ----------------------------------------------------------

#[test]
fn missing_or_malformed_entities_and_versions_get_400() {
    let s = misc_stack();
    let keyed = |path: &str, key: &str| {
        post(path, key, &json!({"n": key})).timeout(Duration::from_secs(20))
    };
    let cases: Vec<(Request, &str)> = vec![
        (
            keyed("/bad/1", "b1").header("x-version", "1"),
            "missing-entity",
        ),
        (
            keyed("/bad/2", "b2").header("x-entity", "bad-e"),
            "missing-version",
        ),
        (
            keyed("/bad/3", "b3")
                .header("x-entity", "bad-e")
                .header("x-entity", "bad-f")
                .header("x-version", "1"),
            "invalid-entity",
        ),
        (
            keyed("/bad/4", "b4")
                .header("x-entity", "bad-e")
                .header("x-version", "1")
                .header("x-version", "2"),
            "invalid-version",
        ),
        (delivery("/bad/5", "bad-e", "1.5", "b5"), "invalid-version"),
        (delivery("/bad/6", "bad-e", "+1", "b6"), "invalid-version"),
        (delivery("/bad/7", "bad-e", "1e3", "b7"), "invalid-version"),
        (
            delivery("/bad/8", "bad-e", "9223372036854775808", "b8"),
            "invalid-version",
        ),
        (delivery("/bad/9", "bad-e", "", "b9"), "invalid-version"),
        (
            delivery("/bad/10", &"e".repeat(256), "1", "b10"),
            "invalid-entity",
        ),
        // JSON pointers (rule `json`).
        (
            post("/json/bad/11", "b11", &json!({"data": {"version": 1}})),
            "missing-entity",
        ),
        (
            post("/json/bad/12", "b12", &json!({"data": {"id": "bad-j"}})),
            "missing-version",
        ),
        (
            post(
                "/json/bad/13",
                "b13",
                &json!({"data": {"id": true, "version": 1}}),
            ),
            "invalid-entity",
        ),
        (
            post(
                "/json/bad/14",
                "b14",
                &json!({"data": {"id": "bad-j", "version": {"v": 1}}}),
            ),
            "invalid-version",
        ),
        (
            post(
                "/json/bad/15",
                "b15",
                &json!({"data": {"id": "bad-j", "version": 1.5}}),
            ),
            "invalid-version",
        ),
        (
            Request::post("/json/bad/16")
                .key("b16")
                .header("content-type", "application/json")
                .body(r#"{"data": {"id": "bad-j", "version": 1, "version": 2}}"#),
            "invalid-version",
        ),
        (
            Request::post("/json/bad/17").key("b17").body("not json"),
            "missing-entity",
        ),
    ];
    for (req, slug) in &cases {
        let r = s.send(req);
        assert_problem(&r, 400, slug);
        assert_eq!(
            s.executions(&req.path),
            0,
            "{} reached the upstream",
            req.path
        );
    }
    let log = s.poll_access_log("every bad version", |log| {
        cases
            .iter()
            .all(|(req, _)| {
                log.lines().any(|l| {
                    l.contains(&format!("\"POST {}\" 400 ", req.path))
                        && l.contains("dedup=bad_version ")
                })
            })
            .then(|| log.to_string())
    });
    assert!(!log.is_empty());
    // The key is still checked first: no key, no ordering.
    let r = s.send(
        &Request::post("/bad/nokey")
            .header("x-entity", "bad-e")
            .header("x-version", "1"),
    );
    assert_problem(&r, 400, "missing-key");
}
