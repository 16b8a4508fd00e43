//! At most once across regions (issue 34), in real Envoy and real etcd, under the
//! simulation of `dedup_envoy::regions`: each region its own etcd cluster and its own
//! proxy, every cross-region path delayed by the same 40 ms each way, a region cut off
//! by stopping every link into and out of it. Records are homed by the trusted header
//! `x-home-region` (one of `scope.headers`), `a` when it is absent; one demo upstream
//! serves every region, so an execution count is global.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    assert_executed, assert_problem, assert_replay_of, burst, counter_of, is_replayed, keyed,
};
use dedup_envoy::client::{send_or_give_up, GiveUp, Leave};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::regions::{cluster_of, Regions};
use dedup_envoy::{DemoUpstream, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ONE_WAY: Duration = Duration::from_millis(40);
const HOST: &str = "orders.example";
const HOME: &str = "x-home-region";

/// Regions, one proxy in each (in the order named), one upstream.
struct World {
    regions: Regions,
    upstream: DemoUpstream,
    proxies: Vec<EnvoyProcess>,
    names: Vec<String>,
}

/// The filter configuration of a proxy in `from`: keys required, `failure_mode:
/// "closed"`, the home header in the scope, homed by `home`, plus `extra` (top-level
/// fields; a `store` object is merged into the store).
fn filter_config(regions: &Regions, from: &str, home: &Value, extra: &Value) -> String {
    let mut store = regions.store(from, home.clone());
    store["timeout_ms"] = json!(2000);
    let mut cfg = json!({
        "key": {"required": true},
        "failure_mode": "closed",
        "scope": {"headers": [HOME]},
    });
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            match (k.as_str(), v) {
                ("store", Value::Object(more)) => {
                    for (sk, sv) in more {
                        store[sk] = sv.clone();
                    }
                }
                _ => cfg[k] = v.clone(),
            }
        }
    }
    cfg["store"] = store;
    cfg.to_string()
}

/// Homed by the header, in `a` when it is absent or names no region.
fn by_header() -> Value {
    json!({"header": HOME, "default": "a"})
}

impl World {
    /// One proxy per region of `names` (`workers` Envoy workers each), records homed by
    /// `home`, `extra` fields; with `lds`, each proxy takes filter configurations by LDS.
    fn start(
        label: &str,
        names: &[&str],
        home: Value,
        extra: Value,
        lds: bool,
        workers: u32,
    ) -> World {
        let wasm = dedup_wasm().unwrap();
        let regions = Regions::start(label, names, 1, ONE_WAY).unwrap();
        let upstream = DemoUpstream::start(0, false).unwrap();
        let proxies = std::thread::scope(|s| {
            let handles: Vec<_> = names
                .iter()
                .map(|from| {
                    let cfg = filter_config(&regions, from, &home, &extra);
                    let mut config = regions
                        .proxy_config(from, upstream.port(), &wasm, &cfg, lds)
                        .unwrap();
                    config.workers = workers;
                    let name = format!("{label}-proxy-{from}");
                    s.spawn(move || EnvoyProcess::start(&name, config))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
                .collect::<Vec<_>>()
        });
        World {
            regions,
            upstream,
            proxies,
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn proxy(&self, region: &str) -> &EnvoyProcess {
        let i = self.names.iter().position(|n| n == region).unwrap();
        &self.proxies[i]
    }

    fn send(&self, region: &str, req: &Request) -> Response {
        self.proxy(region)
            .send(req)
            .unwrap_or_else(|e| panic!("{region}: {} {}: {e}", req.method, req.path))
    }

    /// Calls this region's proxy sent to `to`'s etcd so far (Envoy's own count of the
    /// requests on that cluster).
    fn calls(&self, from: &str, to: &str) -> u64 {
        let name = format!("cluster.{}.upstream_rq_total", cluster_of(to));
        self.proxy(from).stat(&name).unwrap_or(0)
    }

    /// Every region's calls to every other region's etcd, by (from, to).
    fn cross_calls(&self) -> Vec<((String, String), u64)> {
        let mut out = Vec::new();
        for from in &self.names {
            for to in self.names.iter().filter(|t| *t != from) {
                out.push(((from.clone(), to.clone()), self.calls(from, to)));
            }
        }
        out
    }

    fn remote(&self, from: &str, what: &str, to: &str) -> u64 {
        counter_of(self.proxy(from), &format!("remote_{what}.{to}"))
    }

    fn diagnostics(&self) -> String {
        let mut out = format!("cross-region calls: {:?}\n", self.cross_calls());
        for (n, p) in self.names.iter().zip(&self.proxies) {
            let c: Vec<(String, u64)> = p
                .dedup_counters()
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, v)| *v > 0)
                .collect();
            out.push_str(&format!("proxy {n}: {c:?}\n"));
        }
        out
    }
}

/// A POST of `key` homed in `home` (no header: the default).
fn order(key: &str, home: Option<&str>) -> Request {
    let r = keyed(HOST, "/orders", key, &json!({"amount": 100}));
    match home {
        Some(h) => r.header(HOME, h),
        None => r,
    }
}

/// The filter's record prefix (its default `store.prefix`).
const PREFIX: &str = "proxy-dedup/";

/// A key homed in `a`: first sent in `a`, its retry in `b` is replayed and costs `b` one
/// cross-region call; a key homed in `b` first sent in `a` costs exactly its claim and
/// completion across; a key homed where it lands costs nothing across. Counted by
/// Envoy (requests on each region's etcd cluster) and by the filter's remote counters.
/// One worker per proxy, so leases taken once are reused and every count is exact.
#[test]
fn a_retry_in_another_region_runs_once_and_only_remote_homes_cross_regions() {
    let w = World::start(
        "regions-calls",
        &["a", "b"],
        by_header(),
        json!({}),
        false,
        1,
    );
    // Each proxy takes its leases on the other region's etcd once (a grant per
    // purpose per remote shard per worker, the page's "spread over many requests").
    assert_executed(&w.send("a", &order("warm-a", Some("b"))));
    assert_executed(&w.send("b", &order("warm-b", Some("a"))));
    let before = w.cross_calls();
    let snapshot = |w: &World| BTreeMap::from_iter(w.cross_calls());
    let delta = |w: &World, start: &BTreeMap<(String, String), u64>| {
        let now = snapshot(w);
        now.iter()
            .map(|(k, v)| (k.clone(), v - start[k]))
            .collect::<BTreeMap<_, _>>()
    };
    let start = BTreeMap::from_iter(before);
    let path = |from: &str, to: &str| (from.to_string(), to.to_string());

    // Homed where it lands: no cross-region call in either direction.
    let local = w.send("a", &order("local-1", Some("a")));
    assert_executed(&local);
    let local_b = w.send("b", &order("local-2", Some("b")));
    assert_executed(&local_b);
    assert!(
        delta(&w, &start).values().all(|n| *n == 0),
        "{}",
        w.diagnostics()
    );
    assert_eq!(w.remote("a", "claims", "b"), 1, "only the warm-up");

    // Homed in a, first in a, retried in b: one execution, b replays with one call to a.
    let start = snapshot(&w);
    let first = w.send("a", &order("pay-1", Some("a")));
    assert_executed(&first);
    let retry = w.send("b", &order("pay-1", Some("a")));
    assert_replay_of(&retry, &first);
    assert_eq!(w.upstream.executions_for_key("pay-1"), 1);
    let d = delta(&w, &start);
    assert_eq!(
        d[&path("b", "a")],
        1,
        "a duplicate from another region: one call\n{}",
        w.diagnostics()
    );
    assert_eq!(d[&path("a", "b")], 0);

    // Homed in b, first sent in a: the claim and the completion cross, nothing else.
    let start = snapshot(&w);
    let claims = w.remote("a", "claims", "b");
    let completions = w.remote("a", "completions", "b");
    let first = w.send("a", &order("pay-2", Some("b")));
    assert_executed(&first);
    let d = delta(&w, &start);
    assert_eq!(
        d[&path("a", "b")],
        2,
        "claim + completion\n{}",
        w.diagnostics()
    );
    assert_eq!(w.remote("a", "claims", "b"), claims + 1);
    assert_eq!(w.remote("a", "completions", "b"), completions + 1);
    // Its retry in b, its home: replayed from b's own etcd, nothing crosses.
    let retry = w.send("b", &order("pay-2", Some("b")));
    assert_replay_of(&retry, &first);
    let d = delta(&w, &start);
    assert_eq!((d[&path("a", "b")], d[&path("b", "a")]), (2, 0));
    assert_eq!(w.upstream.executions_for_key("pay-2"), 1);
    // The record is in b's etcd only; a's holds none of it.
    let in_a = w
        .regions
        .region("a")
        .unwrap()
        .etcd
        .count_keys(PREFIX)
        .unwrap();
    let in_b = w
        .regions
        .region("b")
        .unwrap()
        .etcd
        .count_keys(PREFIX)
        .unwrap();
    // a: warm-b, local-1, pay-1; b: warm-a, local-2, pay-2.
    assert_eq!((in_a, in_b), (3, 3), "{}", w.diagnostics());
    // b completed in a only the warm-up's key (its duplicate of pay-1 completed nothing).
    assert_eq!(w.remote("b", "completions", "a"), 1, "warm-b only");
    // In Prometheus' text, as the metrics page says.
    let prom = w.proxy("a").prometheus().unwrap();
    let line = prom
        .lines()
        .find(|l| l.starts_with("proxy_dedup_remote_claims_b"))
        .unwrap_or_else(|| panic!("no remote claims in:\n{prom}"));
    assert!(line.ends_with(" 2"), "warm-a and pay-2: {line}");
    assert_eq!(
        counter_of(w.proxy("a"), "executed") + counter_of(w.proxy("b"), "executed"),
        6
    );
}

/// The client of the first attempt hangs up in `a` (detached execution keeps the call
/// going, `upstream.detached`): its retry in `b` gets `409` while the one execution
/// runs, then the replay of its answer.
#[test]
fn a_first_attempt_abandoned_in_one_region_is_409_then_replayed_in_another() {
    let extra = json!({"upstream": {"detached": true, "cluster": "service", "timeout_ms": 5000}});
    let w = World::start("regions-hangup", &["a", "b"], by_header(), extra, false, 2);
    let req = order("hung-1", Some("a"));
    let gone = send_or_give_up(
        w.proxy("a").addr(),
        &req.clone().header("x-demo-delay-ms", "2000"),
        Duration::from_millis(400),
        Leave::Close,
    )
    .unwrap();
    assert!(matches!(gone, GiveUp::GaveUp), "{gone:?}");
    let during = w.send("b", &req);
    assert_problem(&during, 409, "in-flight");
    assert!(
        during.header("retry-after").is_some(),
        "{}",
        during.summary()
    );
    let end = Instant::now() + Duration::from_secs(10);
    let replay = loop {
        let r = w.send("b", &req);
        if r.status != 409 || Instant::now() > end {
            break r;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        is_replayed(&replay),
        "{}\n{}",
        replay.summary(),
        w.diagnostics()
    );
    assert_eq!(replay.status, 200);
    assert_eq!(w.upstream.executions_for_key("hung-1"), 1);
    // And in a, where it ran.
    let again = w.send("a", &req);
    assert_replay_of(&again, &replay);
}

/// Region `a` cut off from `b` (both ways): keys homed in `a` fail in `b` as
/// `failure_mode: "closed"` says (`503`, nothing forwarded); keys homed in `b` carry
/// on in `b`, keys homed in `a` carry on in `a`; after healing, nothing ran twice.
#[test]
fn a_cut_off_region_fails_only_its_keys_elsewhere_and_nothing_runs_twice() {
    let w = World::start("regions-cut", &["a", "b"], by_header(), json!({}), false, 2);
    // Before: every path works.
    for (i, (at, home)) in [("a", "b"), ("b", "a")].iter().enumerate() {
        assert_executed(&w.send(at, &order(&format!("pre-{i}"), Some(home))));
    }
    w.regions.cut("a").unwrap();
    let t = Instant::now();
    let mut sent = Vec::new();
    for i in 0..3 {
        // Homed in the cut-off region, sent elsewhere: refused, not run.
        let k = format!("cut-a-{i}");
        let r = w.send("b", &order(&k, Some("a")));
        assert_problem(&r, 503, "store-unavailable");
        sent.push((k, Some("a")));
        // Homed in b, in b: runs and replays, as if nothing happened.
        let k = format!("cut-b-{i}");
        let first = w.send("b", &order(&k, Some("b")));
        assert_executed(&first);
        assert_replay_of(&w.send("b", &order(&k, Some("b"))), &first);
        sent.push((k, Some("b")));
        // Homed in a, in a: a's own etcd still answers.
        let k = format!("own-a-{i}");
        let first = w.send("a", &order(&k, None));
        assert_executed(&first);
        assert_replay_of(&w.send("a", &order(&k, None)), &first);
        sent.push((k, None));
        // Homed in b, sent to a: refused too.
        let k = format!("cut-ab-{i}");
        assert_problem(
            &w.send("a", &order(&k, Some("b"))),
            503,
            "store-unavailable",
        );
        sent.push((k, Some("b")));
    }
    eprintln!("cut for {:?}", t.elapsed());
    assert!(
        counter_of(w.proxy("b"), "store_unavailable") >= 3,
        "{}",
        w.diagnostics()
    );
    w.regions.heal("a").unwrap();
    // Healed: every key, retried anywhere, runs at most once. A claim whose answer was
    // lost in the cut may hold its key in flight until its lease ends (409): never a
    // second execution.
    // (The home header is part of the scope: each key is retried as it was sent.)
    for (k, home) in &sent {
        for at in ["a", "b"] {
            let r = w.send(at, &order(k, *home));
            assert!(
                r.status == 200 || r.status == 409,
                "{k} in {at}: {}",
                r.summary()
            );
        }
        assert!(
            w.upstream.executions_for_key(k) <= 1,
            "{k} ran {} times\n{}",
            w.upstream.executions_for_key(k),
            w.diagnostics()
        );
    }
}

/// Ordering entities are scoped like records, so an entity lives in its records' home:
/// an ordered delivery homed in `b` and sent in `a` leaves its entity in `b`'s etcd,
/// and an older version retried in `b` is stale there.
#[test]
fn an_ordering_entity_lives_in_its_records_home() {
    let extra =
        json!({"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}});
    let w = World::start("regions-order", &["a", "b"], by_header(), extra, false, 2);
    let delivery = |key: &str, version: &str| {
        order(key, Some("b"))
            .header("x-entity", "order-7")
            .header("x-version", version)
    };
    assert_executed(&w.send("a", &delivery("v2", "2")));
    let entities = |region: &str| {
        let keys = w.regions.region(region).unwrap().etcd.keys(PREFIX).unwrap();
        keys.iter()
            .filter(|k| k.key.starts_with(format!("{PREFIX}o/").as_bytes()))
            .count()
    };
    assert_eq!(
        (entities("a"), entities("b")),
        (0, 1),
        "{}",
        w.diagnostics()
    );
    // An older version, another key, in the entity's home region: stale.
    let stale = w.send("b", &delivery("v1", "1"));
    assert_problem(&stale, 409, "stale-version");
    assert_eq!(w.upstream.executions_for_key("v1"), 0);
    // A newer one from a: applied, still in b.
    assert_executed(&w.send("a", &delivery("v3", "3")));
    assert_eq!((entities("a"), entities("b")), (0, 1));
}

/// One key of the re-homing traffic: who answered what.
struct Run {
    key: String,
    phase: usize,
    problems: Vec<String>,
}

/// Re-homing tenant `acme` from `a` to `b` under traffic, by the documented steps
/// (`store.next_home` on every proxy, then `store.home` changed with
/// `store.previous_home`), the proxies pushed one at a time so that some traffic meets
/// two steps at once. Clients send each key to one region, then retry it in the other,
/// or send it to both at once; no key runs twice.
#[test]
fn re_homing_a_tenant_under_traffic_by_the_two_steps_runs_nothing_twice() {
    let home =
        |acme: &str| json!({"header": HOME, "map": {"acme": acme, "globex": "b"}, "default": "a"});
    let w = World::start("regions-rehome", &["a", "b"], home("a"), json!({}), true, 2);
    let mut w = w;
    let addrs = [w.proxies[0].addr(), w.proxies[1].addr()];
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::<Run>::new()));
    let clients: Vec<_> = (0..2)
        .map(|t| {
            let (phase, stop, done) = (phase.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let key = format!("t{t}-{n}");
                    let tenant = if n % 4 == 0 { "globex" } else { "acme" };
                    let req = order(&key, Some(tenant));
                    let started = phase.load(Ordering::SeqCst);
                    let mut problems = Vec::new();
                    let first = (t + n) % 2;
                    let answers: Vec<Response> = if n % 3 == 0 {
                        burst(&addrs, 2, &req).into_iter().map(|(_, r)| r).collect()
                    } else {
                        let r = dedup_envoy::client::send(addrs[first], &req).unwrap();
                        vec![r]
                    };
                    // Then its retry in the other region, until it is answered.
                    let end = Instant::now() + Duration::from_secs(20);
                    let last = loop {
                        let r = dedup_envoy::client::send(addrs[1 - first], &req).unwrap();
                        if r.status != 409 || Instant::now() > end {
                            break r;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    };
                    let executed = answers
                        .iter()
                        .filter(|r| r.status == 200 && !is_replayed(r))
                        .count();
                    for r in answers.iter().chain([&last]) {
                        if r.status != 200 && r.status != 409 {
                            problems.push(format!("answered {}", r.summary()));
                        }
                    }
                    if executed > 1 {
                        problems.push("two executions answered".into());
                    }
                    if !(last.status == 200 && (is_replayed(&last) || executed == 0)) {
                        problems.push(format!("the retry got {}", last.summary()));
                    }
                    done.lock().unwrap().push(Run {
                        key,
                        phase: started,
                        problems,
                    });
                }
            })
        })
        .collect();
    let wait_keys = |n: usize| {
        let now = phase.load(Ordering::SeqCst);
        let end = Instant::now() + Duration::from_secs(60);
        while done
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.phase == now)
            .count()
            < n
        {
            assert!(Instant::now() < end, "the clients stalled in phase {now}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_keys(6);
    let step1 = json!({"store": {"next_home": home("b")}});
    let step2 = json!({"store": {"home": home("b"), "previous_home": home("a")}});
    for step in [step1, step2] {
        for p in 0..2 {
            let from = w.names[p].clone();
            let cfg = filter_config(&w.regions, &from, &home("a"), &step);
            w.proxies[p]
                .apply_filter_config(&cfg, Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("proxy {from}: {e}"));
            phase.fetch_add(1, Ordering::SeqCst);
            wait_keys(6);
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let runs = std::mem::take(&mut *done.lock().unwrap());
    let mut failures: Vec<String> = Vec::new();
    for r in &runs {
        failures.extend(
            r.problems
                .iter()
                .map(|p| format!("{} (phase {}): {p}", r.key, r.phase)),
        );
        let n = w.upstream.executions_for_key(&r.key);
        if n != 1 {
            failures.push(format!("{}: executed {n} times", r.key));
        }
    }
    let by_phase = runs.iter().fold(BTreeMap::new(), |mut acc, r| {
        *acc.entry(r.phase).or_insert(0) += 1;
        acc
    });
    eprintln!(
        "re-homing: {} keys by phase {by_phase:?}\n{}",
        runs.len(),
        w.diagnostics()
    );
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures[..failures.len().min(30)].join("\n"),
        w.diagnostics()
    );
    // The moved tenant's keys were checked in their other home, and some yielded.
    let checks: u64 = ["a", "b"]
        .iter()
        .map(|r| counter_of(w.proxy(r), "reshard_checks"))
        .sum();
    let yielded: u64 = ["a", "b"]
        .iter()
        .map(|r| counter_of(w.proxy(r), "reshard_yielded"))
        .sum();
    assert!(
        checks > 0 && yielded > 0,
        "{checks} checks, {yielded} yielded\n{}",
        w.diagnostics()
    );
}
