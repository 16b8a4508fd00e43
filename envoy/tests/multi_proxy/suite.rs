//! Many proxies, one truth: two real Envoys (2 workers each) with the dedup
//! filter on the etcd store (`envoy/configs/multi-proxy-etcd.yaml`), a real
//! 3-member etcd cluster and one shared demo upstream, so an execution count
//! is global. Each test has its own cluster and proxies; everything listens
//! on 127.0.0.1 and is killed when the test ends (or the test binary dies).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    assert_executed, assert_problem, assert_replay_of, burst, counter_of, is_replayed, json, keyed,
};
use dedup_envoy::etcd::{
    multi_proxy_config, multi_proxy_json_config, wait_etcd_hosts_healthy, EtcdCluster,
};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{client, DemoUpstream, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The filter's default etcd key prefix.
const PREFIX: &str = "proxy-dedup/";

/// The filter configuration of the tests: keys required, the etcd store on the
/// template's `etcd` cluster, plus `extra` (top-level fields, merged; a
/// `store` object is merged into the store).
fn etcd_filter_config(extra: Value) -> String {
    let mut cfg = json!({
        "key": {"required": true},
        "store": {"kind": "etcd", "cluster": "etcd"},
    });
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            match (k.as_str(), v) {
                ("store", Value::Object(store)) => {
                    for (sk, sv) in store {
                        cfg["store"][sk] = sv;
                    }
                }
                (_, v) => cfg[k] = v,
            }
        }
    }
    cfg.to_string()
}

/// Two proxies, one upstream, one etcd. Dropped in this order: proxies, upstream, etcd.
struct Multi {
    proxies: Vec<EnvoyProcess>,
    upstream: DemoUpstream,
    etcd: EtcdCluster,
}

impl Multi {
    /// Proxy A with `configs[0]`, proxy B with `configs[1]`, on etcd's gRPC API.
    fn start(name: &str, configs: [&str; 2]) -> Multi {
        Multi::start_on(name, configs, false)
    }

    /// `start`, on etcd's JSON gateway (an HTTP/1.1 cluster) when `json`.
    fn start_on(name: &str, configs: [&str; 2], json: bool) -> Multi {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let etcd = EtcdCluster::start(&format!("{name}-etcd"), 3)
            .unwrap_or_else(|e| panic!("starting etcd: {e}"));
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let proxies = std::thread::scope(|s| {
            let handles: Vec<_> = configs
                .iter()
                .enumerate()
                .map(|(i, cfg)| {
                    let config = if json {
                        multi_proxy_json_config(&etcd, upstream.port(), &wasm, cfg)
                    } else {
                        multi_proxy_config(&etcd, upstream.port(), &wasm, cfg)
                    }
                    .unwrap_or_else(|e| panic!("{e}"));
                    let label = format!("{name}-proxy-{}", ["a", "b"][i]);
                    s.spawn(move || EnvoyProcess::start(&label, config))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("starting Envoy: {e}"))
                })
                .collect::<Vec<_>>()
        });
        let multi = Multi {
            proxies,
            upstream,
            etcd,
        };
        for p in &multi.proxies {
            wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e}\nEnvoy log {}", p.log_path.display()));
        }
        multi
    }

    fn send(&self, proxy: usize, req: &Request) -> Response {
        self.proxies[proxy]
            .send(req)
            .unwrap_or_else(|e| panic!("proxy {proxy}: {} {}: {e}", req.method, req.path))
    }

    /// A filter counter of one proxy; a counter not (yet) in /stats is 0.
    fn counter(&self, proxy: usize, short: &str) -> u64 {
        counter_of(&self.proxies[proxy], short)
    }

    fn counters(&self) -> String {
        self.proxies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let c: BTreeMap<String, u64> = p
                    .dedup_counters()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, v)| *v > 0)
                    .collect();
                format!("proxy {}: {c:?}", ["A", "B"][i])
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Counters, Envoy log tails and etcd logs for assertion messages.
    fn diagnostics(&self) -> String {
        let mut s = self.counters();
        for p in &self.proxies {
            let log = p.log();
            let wasm_lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("][wasm]") || l.contains("][critical]"))
                .collect();
            s.push_str(&format!(
                "\n--- {} (wasm lines, last 15):\n{}",
                p.log_path.display(),
                wasm_lines[wasm_lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        // Records by their second byte: the filter's record state (1 in
        // flight, 2 completed, 3 completed without the response; its own
        // format, read here only to explain a failure).
        let keys = match self.etcd.keys(PREFIX) {
            Ok(keys) => {
                let mut by_state = BTreeMap::new();
                for k in &keys {
                    *by_state.entry(k.value.get(1).copied()).or_insert(0) += 1;
                }
                format!("{} (by state byte: {by_state:?})", keys.len())
            }
            Err(e) => format!("unknown ({e})"),
        };
        s.push_str(&format!(
            "\n--- etcd: {keys} keys under {PREFIX:?}; logs in {}",
            self.etcd.dir.display()
        ));
        s
    }
}

/// The service's host name, as the clients send it to every proxy.
const HOST: &str = "orders.example";

#[test]
fn harness_etcd_cluster_and_envoy_health_checks() {
    // The infrastructure alone: the template's etcd cluster, its health
    // checks, and the harness's kill/pause/resume and key reads. The filter
    // here keeps the default (shared-data) store, so this runs with any build.
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let mut etcd = EtcdCluster::start("harness-etcd", 3).unwrap();
    let upstream = DemoUpstream::start(0, false).unwrap();
    let config = multi_proxy_config(
        &etcd,
        upstream.port(),
        &wasm,
        r#"{"key": {"required": true}}"#,
    )
    .unwrap();
    let envoy = EnvoyProcess::start("harness-proxy", config).unwrap();
    wait_etcd_hosts_healthy(&envoy, 3, Duration::from_secs(10)).unwrap();

    // Keys and leases through the JSON gateway.
    let lease = etcd.call("/v3/lease/grant", &json!({"TTL": 2})).unwrap()["ID"]
        .as_str()
        .unwrap()
        .parse::<i64>()
        .unwrap();
    let put = |k: &str| {
        etcd.call(
            "/v3/kv/put",
            &json!({
                "key": dedup_envoy::etcd::base64_encode(k.as_bytes()),
                "value": dedup_envoy::etcd::base64_encode(b"v"),
                "lease": lease.to_string(),
            }),
        )
        .unwrap();
    };
    put("harness/a");
    put("harness/b");
    put("harnesz");
    assert_eq!(etcd.count_keys("harness/").unwrap(), 2);
    let keys = etcd.keys("harness/").unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].key, b"harness/a");
    assert_eq!(keys[0].value, b"v");
    assert_eq!(keys[0].lease, lease);
    let ttl = etcd.lease_ttl(lease).unwrap().expect("lease alive");
    assert_eq!(ttl.granted_seconds, 2);
    let gone = etcd
        .wait_no_keys("harness/", Duration::from_secs(10))
        .unwrap();
    assert!(etcd.lease_ttl(lease).unwrap().is_none());
    eprintln!("keys with a 2 s lease gone after {gone:?} more");

    // Envoy's active health checks follow the members.
    let follower = (etcd.leader().unwrap() + 1) % 3;
    etcd.pause(follower);
    let t = Instant::now();
    wait_etcd_hosts_healthy(&envoy, 2, Duration::from_secs(5)).unwrap();
    eprintln!("paused member marked unhealthy after {:?}", t.elapsed());
    etcd.resume(follower);
    wait_etcd_hosts_healthy(&envoy, 3, Duration::from_secs(10)).unwrap();
    etcd.kill(follower);
    let t = Instant::now();
    wait_etcd_hosts_healthy(&envoy, 2, Duration::from_secs(5)).unwrap();
    eprintln!("killed member marked unhealthy after {:?}", t.elapsed());
    // Two of three keep a quorum.
    etcd.wait_healthy(Duration::from_secs(5)).unwrap();
    assert_eq!(etcd.count_keys("harness/").unwrap(), 0);
    // The listener still serves through the filter.
    let r = envoy
        .send(&keyed(HOST, "/orders/harness", "h-1", &json!({"a": 1})))
        .unwrap();
    assert_executed(&r);
    etcd.pause_all();
    wait_etcd_hosts_healthy(&envoy, 0, Duration::from_secs(5)).unwrap();
    etcd.resume_all();
    etcd.kill_all();
}

#[test]
fn concurrent_identical_requests_over_two_proxies_execute_once() {
    let cfg = etcd_filter_config(json!({}));
    let m = Multi::start("mp-burst", [&cfg, &cfg]);
    const N: usize = 20;
    let path = "/orders/burst";
    let body = json!({"item": "book", "qty": 2});
    // The upstream takes a while, so most duplicates meet the first in flight.
    let req = keyed(HOST, path, "burst-1", &body).header("x-demo-delay-ms", "300");
    let addrs: Vec<_> = m.proxies.iter().map(EnvoyProcess::addr).collect();
    let results = burst(&addrs, N, &req);
    let summary: Vec<String> = results
        .iter()
        .map(|(p, r)| format!("proxy {p}: {}", r.summary()))
        .collect();
    let executed: Vec<&Response> = results
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.status == 200 && !is_replayed(r))
        .collect();
    assert_eq!(
        executed.len(),
        1,
        "exactly one response is a fresh execution:\n{}\n{}",
        summary.join("\n"),
        m.diagnostics()
    );
    let first = executed[0].clone();
    let (mut in_flight, mut replays) = (0, 0);
    for (_, r) in &results {
        if r.status == 200 && !is_replayed(r) {
            continue;
        }
        if r.status == 409 {
            assert_problem(r, 409, "in-flight");
            in_flight += 1;
        } else {
            assert_replay_of(r, &first);
            replays += 1;
        }
    }
    assert_eq!(
        m.upstream.executions_for_path(path),
        1,
        "the upstream ran a duplicate:\n{}\n{}",
        summary.join("\n"),
        m.diagnostics()
    );
    eprintln!("{N} concurrent: 1 executed, {in_flight} in-flight 409, {replays} replays");
    // Once completed, both proxies replay it.
    for p in 0..2 {
        assert_replay_of(&m.send(p, &keyed(HOST, path, "burst-1", &body)), &first);
    }
    assert_eq!(m.upstream.executions_for_path(path), 1);
    for p in 0..2 {
        assert_eq!(m.counter(p, "store_errors"), 0, "{}", m.diagnostics());
    }
}

#[test]
fn replay_comes_from_the_proxy_that_did_not_execute() {
    replay_from_the_other_proxy(false);
}

#[test]
fn replay_comes_from_the_proxy_that_did_not_execute_over_the_json_gateway() {
    replay_from_the_other_proxy(true);
}

fn replay_from_the_other_proxy(over_json: bool) {
    let cfg = if over_json {
        etcd_filter_config(json!({"store": {"protocol": "json"}}))
    } else {
        // An authority other than the cluster name: the filter then names the cluster
        // in a serialized GrpcService (the other tests pass the cluster name).
        etcd_filter_config(json!({"store": {"authority": "etcd.internal"}}))
    };
    let name = if over_json {
        "mp-replay-json"
    } else {
        "mp-replay"
    };
    let m = Multi::start_on(name, [&cfg, &cfg], over_json);
    // The client has the first response, so the first request has completed:
    // a duplicate sent right then, to either proxy, is a replay (README:
    // "same key, same payload, first one completed"), never a 409.
    const PAIRS: usize = 10;
    let mut outcomes = Vec::new();
    for i in 0..PAIRS {
        let (a, b) = (i % 2, 1 - i % 2);
        let key = format!("right-after-{i}");
        let body = json!({"n": i});
        let first = m.send(a, &keyed(HOST, "/orders/right-after", &key, &body));
        assert_executed(&first);
        let dup = m.send(b, &keyed(HOST, "/orders/right-after", &key, &body));
        let replayed = dup.status == first.status && is_replayed(&dup) && dup.body == first.body;
        outcomes.push((key, replayed, dup.summary()));
    }
    let not_replayed: Vec<String> = outcomes
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(k, _, s)| format!("{k}: {s}"))
        .collect();
    assert!(
        not_replayed.is_empty(),
        "{} of {PAIRS} duplicates sent to the other proxy right after the first response were not replays:\n{}\n{}",
        not_replayed.len(),
        not_replayed.join("\n"),
        m.diagnostics()
    );
    assert_eq!(
        m.upstream.executions_for_path("/orders/right-after"),
        PAIRS as u64
    );

    let path = "/orders/cross";
    let body = json!({"item": "lamp", "qty": 1});
    let first = m.send(0, &keyed(HOST, path, "cross-1", &body));
    assert_executed(&first);
    assert_eq!(json(&first)["executions"], 1);
    let dup = m.send(1, &keyed(HOST, path, "cross-1", &body));
    assert_replay_of(&dup, &first);
    assert_eq!(
        m.upstream.executions_for_key("cross-1"),
        1,
        "{}",
        m.diagnostics()
    );
    // Another payload with the key is caught on either proxy.
    let other = m.send(
        1,
        &keyed(HOST, path, "cross-1", &json!({"item": "lamp", "qty": 9})),
    );
    assert_problem(&other, 422, "payload-mismatch");
    // And the other way round.
    let second = m.send(1, &keyed(HOST, path, "cross-2", &body));
    assert_executed(&second);
    assert_replay_of(&m.send(0, &keyed(HOST, path, "cross-2", &body)), &second);
    assert_eq!(m.upstream.executions_for_path(path), 2);
    assert!(
        m.etcd.count_keys(PREFIX).unwrap() >= 2,
        "records under {PREFIX:?} in etcd"
    );
    for p in 0..2 {
        assert_eq!(m.counter(p, "store_errors"), 0, "{}", m.diagnostics());
        // The calls went the configured way: gRPC streams over HTTP/2, or the JSON
        // gateway over HTTP/1.1 (the health checks are HTTP/1.1 either way).
        let h2 = m.proxies[p]
            .stat("cluster.etcd.upstream_cx_http2_total")
            .unwrap_or(0);
        assert_eq!(
            h2 > 0,
            !over_json,
            "proxy {p}: {h2} HTTP/2 connections to etcd"
        );
    }
}

#[test]
fn grpc_over_an_http1_cluster_is_a_store_error_handled_by_failure_mode() {
    // The README: the cluster must speak HTTP/2 for store.protocol "grpc". Without its
    // protocol options (the JSON gateway's cluster), every call fails and the request
    // gets what failure_mode says, here closed: 503, never forwarded.
    let cfg = etcd_filter_config(json!({"failure_mode": "closed", "store": {"timeout_ms": 600}}));
    let m = Multi::start_on("mp-h1-grpc", [&cfg, &cfg], true);
    let r = m.send(0, &keyed(HOST, "/orders/h1", "h1-1", &json!({"n": 1})));
    assert_problem(&r, 503, "store-unavailable");
    assert_eq!(m.upstream.executions_for_path("/orders/h1"), 0);
    assert_eq!(m.counter(0, "store_errors"), 1, "{}", m.diagnostics());
}

#[derive(Clone, Copy, Debug)]
enum Victim {
    Follower,
    Leader,
}

#[test]
fn one_etcd_follower_killed_mid_run_causes_no_errors() {
    // A dead follower refuses connections: the filter retries on another
    // member at once, well within the default budget.
    one_member_killed_mid_run(Victim::Follower);
}

#[test]
fn etcd_leader_killed_mid_run_causes_no_errors() {
    // The leader is a member too. Its death also stops writes until a new
    // one is elected (about 0.5-1 s with --election-timeout 500), and a write
    // forwarded to it before that hangs in etcd for ~6 s, then fails 503
    // ("request timed out"): the filter must give up on that attempt and
    // retry within its budget (default 3000 ms).
    one_member_killed_mid_run(Victim::Leader);
}

/// A stream of distinct keyed requests, each followed by its duplicate on the
/// other proxy, from 4 client threads; one etcd member is SIGKILLed once a
/// third of them went through. No 5xx, no store error, nothing executed
/// twice, every duplicate replayed.
fn one_member_killed_mid_run(which: Victim) {
    let cfg = etcd_filter_config(json!({}));
    let mut m = Multi::start(&format!("mp-kill-{which:?}"), [&cfg, &cfg]);
    const THREADS: usize = 4;
    const KEYS_PER_THREAD: usize = 60;
    let path = "/orders/stream";
    let addrs: Vec<SocketAddr> = m.proxies.iter().map(EnvoyProcess::addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (addrs, stop) = (addrs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for j in 0..KEYS_PER_THREAD {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let key = format!("stream-{t}-{j}");
                    let body = json!({"thread": t, "n": j});
                    let a = (t + j) % 2;
                    let start = Instant::now();
                    let first = client::send(addrs[a], &keyed(HOST, path, &key, &body));
                    let dup = client::send(addrs[1 - a], &keyed(HOST, path, &key, &body));
                    out.push((key, first, dup, start.elapsed()));
                }
                out
            })
        })
        .collect();
    // Kill once a third of the keys went through.
    let end = Instant::now() + Duration::from_secs(60);
    while m.upstream.total_executions() < (THREADS * KEYS_PER_THREAD / 3) as u64 {
        if Instant::now() > end {
            stop.store(true, Ordering::SeqCst);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let leader = m.etcd.leader().unwrap();
    let victim = match which {
        Victim::Follower => (leader + 1) % 3,
        Victim::Leader => leader,
    };
    let killed_at = m.upstream.total_executions();
    m.etcd.kill(victim);
    let mut results = Vec::new();
    for h in handles {
        results.extend(h.join().unwrap());
    }
    let mut failures = Vec::new();
    let (mut replays, mut in_flight) = (0, 0);
    let mut slowest = Duration::ZERO;
    for (key, first, dup, took) in &results {
        slowest = slowest.max(*took);
        match first {
            Ok(r) if r.status == 200 && !is_replayed(r) => {}
            Ok(r) => failures.push(format!("{key} first: {}", r.summary())),
            Err(e) => failures.push(format!("{key} first: {e}")),
        }
        // The duplicate is sent after the first response arrived: the
        // first request has completed, so it is a replay, never a 409.
        match dup {
            Ok(r) if r.status == 200 && is_replayed(r) => replays += 1,
            Ok(r) => {
                if r.status == 409 {
                    in_flight += 1;
                }
                failures.push(format!("{key} duplicate: {}", r.summary()))
            }
            Err(e) => failures.push(format!("{key} duplicate: {e}")),
        }
        let n = m.upstream.executions_for_key(key);
        if n != 1 {
            failures.push(format!("{key} executed {n} times"));
        }
    }
    let errors = [m.counter(0, "store_errors"), m.counter(1, "store_errors")];
    let failed_open = [m.counter(0, "failed_open"), m.counter(1, "failed_open")];
    eprintln!(
        "{which:?}: {} keys, member {victim} killed after {killed_at} executions; {replays} replays, {in_flight} in-flight 409; slowest pair {slowest:?}; store_errors {errors:?}",
        results.len()
    );
    assert!(
        results.len() >= THREADS * KEYS_PER_THREAD / 2,
        "too few requests ran: {}",
        results.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures after killing etcd member {victim} (of 3, the {which:?}):\n{}\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n"),
        m.diagnostics()
    );
    assert_eq!(
        errors,
        [0, 0],
        "store_errors per proxy\n{}",
        m.diagnostics()
    );
    assert_eq!(
        failed_open,
        [0, 0],
        "failed_open per proxy\n{}",
        m.diagnostics()
    );
}

#[test]
fn all_of_etcd_down_applies_failure_mode_open_and_closed() {
    // An explicit budget, so the time bounds below do not follow the default.
    let open = etcd_filter_config(json!({"failure_mode": "open", "store": {"timeout_ms": 1000}}));
    let closed =
        etcd_filter_config(json!({"failure_mode": "closed", "store": {"timeout_ms": 1000}}));
    let mut m = Multi::start("mp-down", [&open, &closed]);
    let path = "/orders/down";
    // Working store first.
    for p in 0..2 {
        assert_executed(&m.send(p, &keyed(HOST, path, &format!("up-{p}"), &json!({"p": p}))));
    }
    m.etcd.kill_all();
    const N: usize = 5;
    for i in 0..N {
        let key = format!("open-{i}");
        let t = Instant::now();
        let r = m.send(0, &keyed(HOST, path, &key, &json!({"i": i})));
        let took = t.elapsed();
        assert_executed(&r);
        assert_eq!(m.upstream.executions_for_key(&key), 1);
        assert!(
            took < Duration::from_millis(2500),
            "fail-open took {took:?} (timeout_ms 1000)"
        );
    }
    let failed_open = m.counter(0, "failed_open");
    assert!(
        failed_open >= N as u64,
        "failed_open on the open proxy: {failed_open}, want >= {N}\n{}",
        m.diagnostics()
    );
    assert!(
        m.counter(0, "store_errors") >= N as u64,
        "{}",
        m.diagnostics()
    );
    for i in 0..N {
        let key = format!("closed-{i}");
        let t = Instant::now();
        let r = m.send(1, &keyed(HOST, path, &key, &json!({"i": i})));
        let took = t.elapsed();
        assert_problem(&r, 503, "store-unavailable");
        assert_eq!(
            m.upstream.executions_for_key(&key),
            0,
            "fail-closed reached the upstream"
        );
        assert!(
            took < Duration::from_millis(2500),
            "fail-closed took {took:?} (timeout_ms 1000)"
        );
    }
    assert!(
        m.counter(1, "store_errors") >= N as u64,
        "{}",
        m.diagnostics()
    );
    assert_eq!(m.counter(1, "failed_open"), 0);
}

#[test]
fn etcd_slower_than_the_timeout_applies_failure_mode_in_bounded_time() {
    const TIMEOUT_MS: u64 = 300;
    let open =
        etcd_filter_config(json!({"failure_mode": "open", "store": {"timeout_ms": TIMEOUT_MS}}));
    let closed =
        etcd_filter_config(json!({"failure_mode": "closed", "store": {"timeout_ms": TIMEOUT_MS}}));
    let mut m = Multi::start("mp-slow", [&open, &closed]);
    let path = "/orders/slow";
    for p in 0..2 {
        assert_executed(&m.send(
            p,
            &keyed(HOST, path, &format!("before-{p}"), &json!({"p": p})),
        ));
    }
    // Frozen members accept connections (the kernel does) but never answer.
    m.etcd.pause_all();
    // Generous against scheduling noise on 2 cores, far below Envoy's own
    // 30 s route timeout: the filter gives up after about one store timeout.
    let bound = Duration::from_millis(3 * TIMEOUT_MS + 600);
    let mut took_open = Vec::new();
    let mut took_closed = Vec::new();
    for i in 0..4 {
        let key = format!("slow-open-{i}");
        let t = Instant::now();
        let r = m.send(0, &keyed(HOST, path, &key, &json!({"i": i})));
        took_open.push(t.elapsed());
        assert_executed(&r);
        let key = format!("slow-closed-{i}");
        let t = Instant::now();
        let r = m.send(1, &keyed(HOST, path, &key, &json!({"i": i})));
        took_closed.push(t.elapsed());
        assert_problem(&r, 503, "store-unavailable");
        assert_eq!(m.upstream.executions_for_key(&key), 0);
    }
    eprintln!("etcd frozen, timeout_ms {TIMEOUT_MS}: open took {took_open:?}, closed took {took_closed:?}");
    for t in took_open.iter().chain(&took_closed) {
        assert!(
            *t < bound,
            "failure mode took {t:?}, bound {bound:?}\n{}",
            m.diagnostics()
        );
    }
    assert!(m.counter(0, "failed_open") >= 4, "{}", m.diagnostics());
    assert!(m.counter(0, "store_errors") >= 4, "{}", m.diagnostics());
    assert!(m.counter(1, "store_errors") >= 4, "{}", m.diagnostics());
    // Thawed, the store works again.
    m.etcd.resume_all();
    m.etcd.wait_healthy(Duration::from_secs(10)).unwrap();
    for p in &m.proxies {
        wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10)).unwrap();
    }
    let body = json!({"after": true});
    let first = m.send(0, &keyed(HOST, path, "after-1", &body));
    assert_executed(&first);
    assert_replay_of(&m.send(1, &keyed(HOST, path, "after-1", &body)), &first);
}

#[test]
fn completed_records_vanish_from_etcd_when_their_lease_ends() {
    const TTL: i64 = 2;
    const IN_FLIGHT: i64 = 2;
    const TIMEOUT_S: i64 = 1;
    let cfg = etcd_filter_config(
        json!({"ttl_seconds": TTL, "in_flight_timeout_seconds": IN_FLIGHT,
        "store": {"timeout_ms": TIMEOUT_S * 1000}}),
    );
    let m = Multi::start("mp-ttl", [&cfg, &cfg]);
    let path = "/orders/ttl";
    let body = json!({"item": "tea"});
    assert_eq!(m.etcd.count_keys(PREFIX).unwrap(), 0);
    let first = m.send(0, &keyed(HOST, path, "ttl-1", &body));
    let answered = Instant::now();
    assert_executed(&first);
    let keys = m.etcd.keys(PREFIX).unwrap();
    assert!(
        !keys.is_empty(),
        "no record under {PREFIX:?} after a completed request\n{}",
        m.diagnostics()
    );
    for k in &keys {
        assert_ne!(
            k.lease,
            0,
            "record {:?} without a lease",
            String::from_utf8_lossy(&k.key)
        );
        // A record's lease is taken when it is claimed, so it covers the
        // in-flight lease (in-flight time, its 1 s window, the store budget
        // and a second of rounding), then ttl_seconds, plus the window in
        // which one lease is shared (1/8 of the life, at least 1 s).
        if let Some(ttl) = m.etcd.lease_ttl(k.lease).unwrap() {
            eprintln!(
                "record {} lease {:x}: granted {} s, {} s left",
                String::from_utf8_lossy(&k.key),
                k.lease,
                ttl.granted_seconds,
                ttl.remaining_seconds
            );
            assert!(
                ttl.granted_seconds <= TTL + IN_FLIGHT + 1 + TIMEOUT_S + 1 + 1,
                "lease granted {} s for ttl_seconds {TTL}, in_flight_timeout_seconds {IN_FLIGHT}",
                ttl.granted_seconds
            );
        }
    }
    assert_replay_of(&m.send(1, &keyed(HOST, path, "ttl-1", &body)), &first);
    let gone = m
        .etcd
        .wait_no_keys(PREFIX, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", m.diagnostics()));
    eprintln!(
        "records gone from etcd {gone:?} after the replay, {:?} after the first response",
        answered.elapsed()
    );
    // Expired: the key runs again.
    let again = m.send(1, &keyed(HOST, path, "ttl-1", &body));
    assert_executed(&again);
    assert_eq!(m.upstream.executions_for_key("ttl-1"), 2);
}

/// The states of the records under `PREFIX` (the second byte of each value:
/// 1 in flight, 2 completed, 3 completed without the response).
fn record_states(m: &Multi) -> Vec<u8> {
    m.etcd
        .keys(PREFIX)
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k.value.get(1).copied())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn client_reset_while_its_response_waits_for_etcd_still_completes_the_record() {
    // The response to a first request is held until etcd has the completed
    // record. Here etcd is frozen right after the upstream got the request,
    // so the filter's completion call waits; the upstream answers, the
    // client resets its connection while the response is held, and etcd is
    // thawed within store.timeout_ms. The upstream did execute, so the
    // record must end completed: a duplicate on the other proxy is a replay
    // (not a 409 for the in-flight timeout, not a second execution).
    const TIMEOUT_MS: u64 = 4000;
    let cfg = etcd_filter_config(json!({"store": {"timeout_ms": TIMEOUT_MS}}));
    let mut m = Multi::start("mp-reset-held", [&cfg, &cfg]);
    let path = "/orders/reset-held";
    let key = "reset-held-1";
    let body = json!({"item": "held"});
    let mut conn = client::Connection::open(m.proxies[0].addr(), Duration::from_secs(5)).unwrap();
    conn.write_request(&keyed(HOST, path, key, &body).header("x-demo-delay-ms", "700"))
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while m.upstream.executions_for_key(key) == 0 {
        assert!(
            Instant::now() < end,
            "the request never reached the upstream\n{}",
            m.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The claim is in etcd; freeze it before the upstream answers.
    m.etcd.pause_all();
    let frozen = Instant::now();
    // The upstream answers after 700 ms; the filter holds the end of the
    // response (the head may pass) until etcd confirms the completion.
    let partial = conn.read_response(&Request::post(path).timeout(Duration::from_millis(1500)));
    if let Ok(r) = &partial {
        panic!(
            "the whole response reached the client while etcd was frozen (it is held until etcd confirms the completion): {}\n{}",
            r.summary(),
            m.diagnostics()
        );
    }
    conn.reset().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    m.etcd.resume_all();
    let thawed_after = frozen.elapsed();
    assert!(
        thawed_after < Duration::from_millis(TIMEOUT_MS - 1000),
        "etcd thawed only after {thawed_after:?} (store.timeout_ms {TIMEOUT_MS})"
    );
    m.etcd.wait_healthy(Duration::from_secs(10)).unwrap();
    // Wait until the record is no longer in flight (bounded: the filter's
    // budget runs out TIMEOUT_MS after the completion started).
    let end = frozen + Duration::from_millis(TIMEOUT_MS + 3000);
    let mut states = record_states(&m);
    while states.contains(&1) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        states = record_states(&m);
    }
    eprintln!(
        "etcd thawed {thawed_after:?} after freezing; record states {states:?} after {:?}",
        frozen.elapsed()
    );
    for p in &m.proxies {
        wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10)).unwrap();
    }
    let dup = m.send(1, &keyed(HOST, path, key, &body));
    assert!(
        dup.status == 200 && is_replayed(&dup),
        "the duplicate on the other proxy after a client reset during the held completion: {} (record states {states:?})\n{}",
        dup.summary(),
        m.diagnostics()
    );
    assert_eq!(json(&dup)["key"], key);
    assert_eq!(json(&dup)["executions"], 1);
    assert_replay_of(&m.send(0, &keyed(HOST, path, key, &body)), &dup);
    assert_eq!(m.upstream.executions_for_key(key), 1, "{}", m.diagnostics());
}

/// Detached execution on etcd: a client of proxy A times out (1 s) while the upstream
/// takes 3 s; A's call goes on and completes the record in etcd; the client's retries,
/// sent to proxy B, get `409 in-flight` and then the replay of the one execution.
#[test]
fn detached_a_client_that_times_out_on_a_gets_the_one_execution_from_b() {
    let cfg = etcd_filter_config(json!({
        "in_flight_timeout_seconds": 8,
        "upstream": {"detached": true, "cluster": "service", "timeout_ms": 6000},
    }));
    let m = Multi::start("mp-detached", [&cfg, &cfg]);
    let path = "/orders/detached";
    let req = keyed(
        "orders.example",
        path,
        "detached-1",
        &json!({"amount": 5000}),
    );
    let gone = client::send_or_give_up(
        m.proxies[0].addr(),
        &req.clone().header("x-demo-delay-ms", "3000"),
        Duration::from_secs(1),
        client::Leave::Close,
    )
    .unwrap();
    assert!(matches!(gone, client::GiveUp::GaveUp), "{gone:?}");
    let end = Instant::now() + Duration::from_secs(10);
    let mut wait = Duration::from_millis(500);
    let replay = loop {
        std::thread::sleep(wait);
        let r = m.send(1, &req);
        if r.status != 409 || Instant::now() > end {
            break r;
        }
        assert_problem(&r, 409, "in-flight");
        wait = (wait * 2).min(Duration::from_secs(2));
    };
    assert!(
        is_replayed(&replay),
        "{}\n{}",
        replay.summary(),
        m.counters()
    );
    assert_eq!(m.upstream.executions_for_path(path), 1, "{}", m.counters());
    assert_eq!(m.counter(0, "detached_client_gone"), 1, "{}", m.counters());
    // And on A too.
    let again = m.send(0, &req);
    assert!(is_replayed(&again));
    assert_eq!(again.body, replay.body);
}

/// Expiry advertised on etcd: proxy A (the default) tells a client when the record it
/// found stops answering, a claim's in-flight end or a completed record's TTL end,
/// within a second of the wall clock, and no age (etcd values keep no completion
/// time); proxy B (`advertise_expiry: false`) tells neither.
#[test]
fn etcd_replays_and_409s_say_when_the_record_stops_answering() {
    let on = etcd_filter_config(json!({"ttl_seconds": 600, "in_flight_timeout_seconds": 20}));
    let off = etcd_filter_config(json!({
        "ttl_seconds": 600, "in_flight_timeout_seconds": 20, "advertise_expiry": false
    }));
    let m = Multi::start("mp-expiry", [&on, &off]);
    let path = "/orders/expiry";
    let body = json!({"item": "clock"});
    let req = keyed(HOST, path, "expiry-1", &body);
    let claimed_at = common::unix_now();
    let first = {
        let (addr, slow) = (
            m.proxies[1].addr(),
            req.clone().header("x-demo-delay-ms", "2000"),
        );
        std::thread::spawn(move || client::send(addr, &slow).unwrap())
    };
    let end = Instant::now() + Duration::from_secs(5);
    while m.upstream.executions_for_key("expiry-1") == 0 {
        assert!(Instant::now() < end, "the first never reached the upstream");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The claim was made before the upstream saw the request.
    let reached_at = common::unix_now();
    let dup = m.send(0, &req);
    assert_problem(&dup, 409, "in-flight");
    common::assert_expires_within(
        &dup,
        claimed_at + 20.0,
        reached_at + 20.0,
        "409 in-flight on A",
    );
    let dup = m.send(1, &req);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(
        dup.header("idempotency-expires"),
        None,
        "B: {}",
        dup.summary()
    );
    let first = first.join().unwrap();
    let completed_at = common::unix_now();
    assert_executed(&first);
    let replay = m.send(0, &req);
    assert_replay_of(&replay, &first);
    // Completed after the upstream's 2 s, before the client had the answer.
    let (lo, hi) = (claimed_at + 2.0 + 600.0, completed_at + 600.0);
    common::assert_expires_within(&replay, lo, hi, "replay on A");
    assert_eq!(replay.header("age"), None, "etcd keeps no completion time");
    // Answered again from A's worker tier: still the record's expiry.
    let again = m.send(0, &req);
    common::assert_expires_within(&again, lo, hi, "second replay on A");
    let other = m.send(0, &keyed(HOST, path, "expiry-1", &json!({"item": "other"})));
    assert_problem(&other, 422, "payload-mismatch");
    common::assert_expires_within(&other, lo, hi, "422 on A");
    let replay = m.send(1, &req);
    assert_replay_of(&replay, &first);
    assert_eq!(replay.header("idempotency-expires"), None);
    assert_eq!(replay.header("age"), None);
    assert_eq!(
        m.upstream.executions_for_path(path),
        1,
        "{}",
        m.diagnostics()
    );
}
