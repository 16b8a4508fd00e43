//! Many proxies, one truth: two real Envoys (2 workers each) with the dedup
//! filter on the etcd store (`envoy/configs/multi-proxy-etcd.yaml`), real
//! 3-member etcd clusters and one shared demo upstream, so an execution count
//! is global. Each test has its own clusters and proxies; everything listens
//! on 127.0.0.1 and is killed when the test ends (or the test binary dies).
//!
//! The suite runs twice, as two test binaries that include this file: on one etcd
//! cluster (`tests/multi_proxy.rs`, the template's own `etcd` cluster and
//! `store.cluster`) and on two shards (`tests/multi_proxy_shards.rs`: `store.shards`
//! over `etcd_a` and `etcd_b`, each its own 3-member cluster). Each binary's root sets
//! `SHARDS`. A fault on "a member" hits the first shard; a fault on "etcd" (all of
//! it frozen or killed) hits every shard; what a test reads from etcd it reads from
//! every shard.
// Each binary uses a part of the harness (the shards binary the LDS and admin fronts).
#![allow(dead_code)]

use crate::common::{
    assert_executed, assert_problem, assert_replay_of, burst, counter_of, is_replayed, json, keyed,
};
use crate::SHARDS;
use dedup_envoy::etcd::{
    multi_proxy_config, multi_proxy_json_config, sharded_bootstrap_config, sharded_proxy_config,
    sharded_proxy_json_config, sharded_proxy_lds_config, wait_cluster_hosts_healthy, EtcdCluster,
    EtcdKey,
};
use dedup_envoy::paths::{config_file, dedup_wasm};
use dedup_envoy::{client, DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The filter's default etcd key prefix.
pub const PREFIX: &str = "proxy-dedup/";

/// The service's host name, as the clients send it to every proxy.
pub const HOST: &str = "orders.example";

/// Members of each shard's etcd cluster (the template lists three).
const MEMBERS: usize = 3;

/// The Envoy clusters of `n` shards: the template's own `etcd` for one (the filter's
/// `store.cluster`), else `etcd_a`, `etcd_b`, ... (its `store.shards`).
pub fn shard_clusters(n: usize) -> Vec<String> {
    if n == 1 {
        return vec!["etcd".to_string()];
    }
    (0..n)
        .map(|i| format!("etcd_{}", char::from(b'a' + i as u8)))
        .collect()
}

/// A `store.shards` list naming these Envoy clusters (each shard named after its
/// cluster, the default).
pub fn shard_map(clusters: &[&str]) -> Value {
    Value::Array(clusters.iter().map(|c| json!({"cluster": c})).collect())
}

/// The filter configuration of the tests: keys required, the etcd store on this
/// binary's `SHARDS` (`shard_clusters`), plus `extra` (top-level fields, merged; a
/// `store` object is merged into the store; with shards, its `authority` goes to
/// every shard).
pub fn etcd_filter_config(extra: Value) -> String {
    let clusters = shard_clusters(SHARDS);
    let store = match clusters.as_slice() {
        [one] => json!({"kind": "etcd", "cluster": one}),
        many => {
            let names: Vec<&str> = many.iter().map(String::as_str).collect();
            json!({"kind": "etcd", "shards": shard_map(&names)})
        }
    };
    let mut cfg = json!({"key": {"required": true}, "store": store});
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            match (k.as_str(), v) {
                ("store", Value::Object(store)) => {
                    for (sk, sv) in store {
                        match cfg["store"]["shards"].as_array_mut() {
                            Some(shards) if sk == "authority" => {
                                for s in shards {
                                    s["authority"] = sv.clone();
                                }
                            }
                            _ => cfg["store"][sk] = sv,
                        }
                    }
                }
                (_, v) => cfg[k] = v,
            }
        }
    }
    cfg.to_string()
}

/// How the proxies are configured around the filter.
#[derive(Clone, Debug)]
pub enum Front {
    /// `multi-proxy-etcd.yaml` (etcd's gRPC API over HTTP/2).
    Grpc,
    /// The same on HTTP/1.1 clusters, for etcd's JSON gateway.
    Json,
    /// The listener by LDS, so a test can push another filter configuration.
    Lds,
    /// `admin-api.yaml`: the data plane plus an operator API listener
    /// (`ADMIN_API_PORT`) with this admin-role configuration.
    AdminApi(String),
}

/// One shard: its Envoy cluster's name and its etcd cluster.
pub struct Shard {
    pub cluster: String,
    pub etcd: EtcdCluster,
}

/// Proxies, one upstream, one etcd cluster per shard. Dropped in this order:
/// proxies, upstream, etcd.
pub struct Multi {
    pub proxies: Vec<EnvoyProcess>,
    pub upstream: DemoUpstream,
    pub shards: Vec<Shard>,
}

impl Multi {
    /// Proxy A with `configs[0]`, proxy B with `configs[1]`, on etcd's gRPC API.
    pub fn start(name: &str, configs: [&str; 2]) -> Multi {
        Multi::start_on(name, configs, false)
    }

    /// `start`, on etcd's JSON gateway (HTTP/1.1 clusters) when `json`.
    pub fn start_on(name: &str, configs: [&str; 2], json: bool) -> Multi {
        let front = if json { Front::Json } else { Front::Grpc };
        Multi::start_with(name, SHARDS, front, &configs)
    }

    /// One proxy per config in `configs`, on `shards` etcd clusters (`shard_clusters`),
    /// configured as `front` says. Every proxy sees every member of every shard
    /// healthy before this returns.
    pub fn start_with(name: &str, shards: usize, front: Front, configs: &[&str]) -> Multi {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let clusters = shard_clusters(shards);
        // The clusters form in parallel (each takes about a second to elect a leader).
        let shards: Vec<Shard> = std::thread::scope(|s| {
            let handles: Vec<_> = clusters
                .iter()
                .map(|cluster| {
                    let label = match cluster.strip_prefix("etcd_") {
                        Some(shard) => format!("{name}-etcd-{shard}"),
                        None => format!("{name}-etcd"),
                    };
                    s.spawn(move || {
                        let etcd = EtcdCluster::start(&label, MEMBERS)
                            .unwrap_or_else(|e| panic!("starting etcd {label}: {e}"));
                        Shard {
                            cluster: cluster.clone(),
                            etcd,
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let proxies = std::thread::scope(|s| {
            let handles: Vec<_> = configs
                .iter()
                .enumerate()
                .map(|(i, cfg)| {
                    let config = proxy_config(&shards, &front, upstream.port(), &wasm, cfg);
                    let label = format!("{name}-proxy-{}", char::from(b'a' + i as u8));
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
            shards,
        };
        multi.wait_hosts_healthy(MEMBERS);
        multi
    }

    pub fn send(&self, proxy: usize, req: &Request) -> Response {
        self.proxies[proxy]
            .send(req)
            .unwrap_or_else(|e| panic!("proxy {proxy}: {} {}: {e}", req.method, req.path))
    }

    /// A filter counter of one proxy; a counter not (yet) in /stats is 0.
    pub fn counter(&self, proxy: usize, short: &str) -> u64 {
        counter_of(&self.proxies[proxy], short)
    }

    /// Wait until every proxy sees `want` healthy hosts in every shard's cluster.
    pub fn wait_hosts_healthy(&self, want: usize) {
        for p in &self.proxies {
            for s in &self.shards {
                wait_cluster_hosts_healthy(p, &s.cluster, want, Duration::from_secs(10))
                    .unwrap_or_else(|e| {
                        panic!("{}: {e}\nEnvoy log {}", s.cluster, p.log_path.display())
                    });
            }
        }
    }

    /// Every shard's keys under `prefix`, each with the index of its shard.
    pub fn keys(&self, prefix: &str) -> Vec<(usize, EtcdKey)> {
        let mut out = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            let keys = s
                .etcd
                .keys(prefix)
                .unwrap_or_else(|e| panic!("reading {}: {e}", s.cluster));
            out.extend(keys.into_iter().map(|k| (i, k)));
        }
        out
    }

    /// Keys under `prefix` on all shards.
    pub fn count_keys(&self, prefix: &str) -> u64 {
        self.shards
            .iter()
            .map(|s| s.etcd.count_keys(prefix).unwrap())
            .sum()
    }

    /// Wait until no shard has a key under `prefix`; how long that took.
    pub fn wait_no_keys(&self, prefix: &str, limit: Duration) -> Duration {
        let t = Instant::now();
        for s in &self.shards {
            let left = limit.saturating_sub(t.elapsed());
            s.etcd
                .wait_no_keys(prefix, left)
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", s.cluster, self.diagnostics()));
        }
        t.elapsed()
    }

    /// Every member of every shard: SIGSTOP.
    pub fn pause_all(&mut self) {
        for s in &mut self.shards {
            s.etcd.pause_all();
        }
    }

    /// Every member of every shard: SIGCONT.
    pub fn resume_all(&mut self) {
        for s in &mut self.shards {
            s.etcd.resume_all();
        }
    }

    pub fn kill_all(&mut self) {
        for s in &mut self.shards {
            s.etcd.kill_all();
        }
    }

    /// Wait until every running member of every shard is healthy.
    pub fn wait_etcd_healthy(&self) {
        for s in &self.shards {
            s.etcd
                .wait_healthy(Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{}: {e}", s.cluster));
        }
    }

    pub fn counters(&self) -> String {
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
                format!("proxy {}: {c:?}", char::from(b'A' + i as u8))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Counters, Envoy log tails and etcd logs for assertion messages.
    pub fn diagnostics(&self) -> String {
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
        for shard in &self.shards {
            let keys = match shard.etcd.keys(PREFIX) {
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
                "\n--- etcd {}: {keys} keys under {PREFIX:?}; logs in {}",
                shard.cluster,
                shard.etcd.dir.display()
            ));
        }
        s
    }
}

/// The config of one proxy in front of `shards`: with one shard the copyable
/// templates as they are (`multi_proxy_config`), else their `etcd` cluster once per
/// shard.
fn proxy_config(
    shards: &[Shard],
    front: &Front,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> EnvoyConfig {
    let named: Vec<(&str, &EtcdCluster)> = shards
        .iter()
        .map(|s| (s.cluster.as_str(), &s.etcd))
        .collect();
    let config = match (front, named.as_slice()) {
        (Front::Grpc, [(_, one)]) => multi_proxy_config(one, upstream_port, wasm, filter_config),
        (Front::Json, [(_, one)]) => {
            multi_proxy_json_config(one, upstream_port, wasm, filter_config)
        }
        (Front::Grpc, _) => sharded_proxy_config(&named, upstream_port, wasm, filter_config),
        (Front::Json, _) => sharded_proxy_json_config(&named, upstream_port, wasm, filter_config),
        (Front::Lds, _) => sharded_proxy_lds_config(&named, upstream_port, wasm, filter_config),
        (Front::AdminApi(admin), _) => sharded_bootstrap_config(
            &config_file("admin-api.yaml"),
            &named,
            upstream_port,
            wasm,
            filter_config,
        )
        .and_then(|c| c.with_port("ADMIN_API_PORT"))
        .map(|c| c.with_var("ADMIN_FILTER_CONFIG", admin)),
    };
    config.unwrap_or_else(|e| panic!("{e}"))
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
        m.count_keys(PREFIX) >= 2,
        "records under {PREFIX:?} in etcd"
    );
    // On shards, the 12 keys (fixed names) are spread over all of them.
    for s in &m.shards {
        assert!(
            s.etcd.count_keys(PREFIX).unwrap() > 0,
            "no record on {}\n{}",
            s.cluster,
            m.diagnostics()
        );
    }
    for p in 0..2 {
        assert_eq!(m.counter(p, "store_errors"), 0, "{}", m.diagnostics());
        // The calls went the configured way: gRPC streams over HTTP/2, or the JSON
        // gateway over HTTP/1.1 (the health checks are HTTP/1.1 either way), on
        // every shard's cluster.
        for s in &m.shards {
            let h2 = m.proxies[p]
                .stat(&format!("cluster.{}.upstream_cx_http2_total", s.cluster))
                .unwrap_or(0);
            assert_eq!(
                h2 > 0,
                !over_json,
                "proxy {p}: {h2} HTTP/2 connections to {}",
                s.cluster
            );
        }
    }
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
    // On shards, the member is one of the first shard's.
    let etcd = &mut m.shards[0].etcd;
    let leader = etcd.leader().unwrap();
    let victim = match which {
        Victim::Follower => (leader + 1) % 3,
        Victim::Leader => leader,
    };
    let killed_at = m.upstream.total_executions();
    etcd.kill(victim);
    let shard = m.shards[0].cluster.clone();
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
        "{which:?}: {} keys, member {victim} of {shard} killed after {killed_at} executions; {replays} replays, {in_flight} in-flight 409; slowest pair {slowest:?}; store_errors {errors:?}",
        results.len()
    );
    assert!(
        results.len() >= THREADS * KEYS_PER_THREAD / 2,
        "too few requests ran: {}",
        results.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures after killing etcd member {victim} of {shard} (of 3, the {which:?}):\n{}\n{}",
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
    m.kill_all();
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

/// Every default (only the key's header is required and the store named): two of
/// three members stopped loses etcd's quorum; the POSTs through proxy A during the
/// outage are refused (`503 store-unavailable`, `retry-after`), never forwarded
/// unrecorded; after the members come back the clients' retries through proxy B run
/// each key once. Before `failure_mode` defaulted to closed, every key here ran twice.
#[test]
fn two_of_three_members_stopped_with_every_default_runs_no_key_twice() {
    let cfg = etcd_filter_config(json!({}));
    let mut m = Multi::start("mp-quorum-lost", [&cfg, &cfg]);
    let path = "/orders/quorum";
    assert_executed(&m.send(0, &keyed(HOST, path, "before", &json!({"n": 0}))));
    // On every shard: two members of three, the leader kept.
    let mut stopped = Vec::new();
    for s in &mut m.shards {
        let leader = s.etcd.leader().unwrap();
        let two = [(leader + 1) % MEMBERS, (leader + 2) % MEMBERS];
        for i in two {
            s.etcd.kill(i);
        }
        stopped.push(two);
    }
    // Five clients at once, each waiting out the store's budget.
    const N: usize = 5;
    let a = m.proxies[0].addr();
    let during: Vec<(String, Response)> = (0..N)
        .map(|i| {
            let key = format!("outage-{i}");
            let req = keyed(HOST, path, &key, &json!({"n": i}));
            std::thread::spawn(move || (key, client::send(a, &req).unwrap()))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let mut refused = 0;
    for (key, r) in &during {
        if r.status == 503 {
            assert_problem(r, 503, "store-unavailable");
            assert!(r.header("retry-after").is_some(), "{}", r.summary());
            refused += 1;
        } else {
            // A claim etcd took before the quorum went (the leader still held it):
            // it ran once, recorded.
            assert_executed(r);
        }
        assert!(m.upstream.executions_for_key(key) <= 1, "{key}");
    }
    assert!(
        refused >= N - 1,
        "refused {refused} of {N}\n{}",
        m.diagnostics()
    );
    assert_eq!(m.counter(0, "failed_open"), 0);
    assert!(m.counter(0, "store_unavailable") >= refused as u64);
    for (s, two) in m.shards.iter_mut().zip(&stopped) {
        for &i in two {
            s.etcd.restart(i).unwrap();
        }
    }
    m.wait_etcd_healthy();
    m.wait_hosts_healthy(MEMBERS);
    // A refused claim may still be applied by etcd once the members are back (the
    // leader kept it in its log): then the retry finds a claim nobody settled and gets
    // 409 until its record ends. Either way, no key runs twice.
    let mut ran = 0;
    for (key, _) in &during {
        let i: usize = key.trim_start_matches("outage-").parse().unwrap();
        let r = m.send(1, &keyed(HOST, path, key, &json!({"n": i})));
        match r.status {
            200 => ran += 1,
            409 => {
                let slug = json(&r)["type"].as_str().unwrap_or("").to_string();
                assert!(
                    slug.ends_with(":in-flight") || slug.ends_with(":outcome-unknown"),
                    "{key}: {}",
                    r.summary()
                );
            }
            _ => panic!("{key}: {}\n{}", r.summary(), m.diagnostics()),
        }
        assert!(
            m.upstream.executions_for_key(key) <= 1,
            "{key} ran more than once\n{}",
            m.diagnostics()
        );
    }
    eprintln!("quorum lost with every default: {refused} of {N} refused, {ran} ran after");
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
    m.pause_all();
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
    m.resume_all();
    m.wait_etcd_healthy();
    m.wait_hosts_healthy(MEMBERS);
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
    assert_eq!(m.count_keys(PREFIX), 0);
    let first = m.send(0, &keyed(HOST, path, "ttl-1", &body));
    let answered = Instant::now();
    assert_executed(&first);
    let keys = m.keys(PREFIX);
    assert!(
        !keys.is_empty(),
        "no record under {PREFIX:?} after a completed request\n{}",
        m.diagnostics()
    );
    for (shard, k) in &keys {
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
        // A lease is its own cluster's: asked of the record's shard.
        if let Some(ttl) = m.shards[*shard].etcd.lease_ttl(k.lease).unwrap() {
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
    let gone = m.wait_no_keys(PREFIX, Duration::from_secs(10));
    eprintln!(
        "records gone from etcd {gone:?} after the replay, {:?} after the first response",
        answered.elapsed()
    );
    // Expired: the key runs again.
    let again = m.send(1, &keyed(HOST, path, "ttl-1", &body));
    assert_executed(&again);
    assert_eq!(m.upstream.executions_for_key("ttl-1"), 2);
}

/// The states of the records under `PREFIX` on every shard (the second byte of
/// each value: 1 in flight, 2 completed, 3 completed without the response); a
/// shard that cannot be read adds none.
fn record_states(m: &Multi) -> Vec<u8> {
    m.shards
        .iter()
        .filter_map(|s| s.etcd.keys(PREFIX).ok())
        .flatten()
        .filter_map(|k| k.value.get(1).copied())
        .collect()
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
    m.pause_all();
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
    m.resume_all();
    let thawed_after = frozen.elapsed();
    assert!(
        thawed_after < Duration::from_millis(TIMEOUT_MS - 1000),
        "etcd thawed only after {thawed_after:?} (store.timeout_ms {TIMEOUT_MS})"
    );
    m.wait_etcd_healthy();
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
    m.wait_hosts_healthy(MEMBERS);
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
    let claimed_at = crate::common::unix_now();
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
    let reached_at = crate::common::unix_now();
    let dup = m.send(0, &req);
    assert_problem(&dup, 409, "in-flight");
    crate::common::assert_expires_within(
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
    let completed_at = crate::common::unix_now();
    assert_executed(&first);
    let replay = m.send(0, &req);
    assert_replay_of(&replay, &first);
    // Completed after the upstream's 2 s, before the client had the answer.
    let (lo, hi) = (claimed_at + 2.0 + 600.0, completed_at + 600.0);
    crate::common::assert_expires_within(&replay, lo, hi, "replay on A");
    assert_eq!(replay.header("age"), None, "etcd keeps no completion time");
    // Answered again from A's worker tier: still the record's expiry.
    let again = m.send(0, &req);
    crate::common::assert_expires_within(&again, lo, hi, "second replay on A");
    let other = m.send(0, &keyed(HOST, path, "expiry-1", &json!({"item": "other"})));
    assert_problem(&other, 422, "payload-mismatch");
    crate::common::assert_expires_within(&other, lo, hi, "422 on A");
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
