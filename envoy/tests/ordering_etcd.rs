//! The ordering guard on many proxies: two real Envoys (2 workers each) on the etcd
//! store (`envoy/configs/multi-proxy-etcd.yaml`, a real 3-member etcd) in front of
//! one recording demo upstream, so every execution, its entity, version and timing, is
//! seen in one place. Loopback only; bounded counts and times.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::assert_problem;
use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, EnvoyProcess, Request, Response};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Ordered by headers `x-entity` / `x-version`, keys required, on the etcd store.
fn config(on_stale: &str) -> String {
    json!({
        "key": {"required": true},
        "store": {"kind": "etcd", "cluster": "etcd"},
        "ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"},
                     "on_stale": on_stale},
    })
    .to_string()
}

struct Two {
    proxies: Vec<EnvoyProcess>,
    upstream: DemoUpstream,
    _etcd: EtcdCluster,
}

impl Two {
    fn start(name: &str, filter_config: &str) -> Two {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let etcd = EtcdCluster::start(&format!("{name}-etcd"), 3)
            .unwrap_or_else(|e| panic!("starting etcd: {e}"));
        let upstream = DemoUpstream::start_recording().expect("demo upstream");
        let proxies: Vec<EnvoyProcess> = ["a", "b"]
            .iter()
            .map(|p| {
                let cfg = multi_proxy_config(&etcd, upstream.port(), &wasm, filter_config)
                    .unwrap_or_else(|e| panic!("{e}"));
                EnvoyProcess::start(&format!("{name}-proxy-{p}"), cfg)
                    .unwrap_or_else(|e| panic!("starting Envoy: {e}"))
            })
            .collect();
        for p in &proxies {
            wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e}\nEnvoy log {}", p.log_path.display()));
        }
        Two {
            proxies,
            upstream,
            _etcd: etcd,
        }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(|p| p.addr()).collect()
    }

    fn send(&self, proxy: usize, req: &Request) -> Response {
        self.proxies[proxy]
            .send(req)
            .unwrap_or_else(|e| panic!("proxy {proxy}: {e}"))
    }
}

/// A delivery of `version` of `entity`, its own key unless given.
fn delivery(entity: &str, version: u64, key: &str) -> Request {
    Request::post("/hooks")
        .host("hooks.example")
        .key(key)
        .header("x-entity", entity)
        .header("x-version", &version.to_string())
        .json(&json!({"entity": entity, "version": version}))
        .timeout(Duration::from_secs(20))
}

/// Versions 1..=N of two entities, shuffled, each sent twice (the second a duplicate
/// with the same key), from four clients alternating between the proxies: the upstream
/// gets, per entity, strictly increasing versions only, each at most once, never two at
/// once; every other answer is a replay, `409 stale-version` or `409 in-flight`.
#[test]
fn shuffled_versions_with_duplicates_reach_the_upstream_in_order_once_each() {
    let two = Two::start("order-etcd-shuffle", &config("reject"));
    const N: u64 = 16;
    let mut work: Vec<(String, u64)> = Vec::new();
    for e in ["cus_1", "cus_2"] {
        for v in 1..=N {
            work.push((e.to_string(), v));
            work.push((e.to_string(), v));
        }
    }
    // A fixed shuffle (xorshift), so a failure reproduces.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..work.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        work.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let addrs = two.addrs();
    let chunks: Vec<Vec<(String, u64)>> = (0..4)
        .map(|c| work.iter().skip(c).step_by(4).cloned().collect())
        .collect();
    let answers: Vec<(String, u64, Response)> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(c, chunk)| {
                let addr = addrs[c % addrs.len()];
                s.spawn(move || {
                    let mut out = Vec::new();
                    for (e, v) in chunk {
                        let req =
                            delivery(&e, v, &format!("{e}-v{v}")).header("x-demo-delay-ms", "30");
                        let r = dedup_envoy::client::send(addr, &req).unwrap();
                        out.push((e, v, r));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for (e, v, r) in &answers {
        let ok = r.status == 200
            || (r.status == 409
                && ["stale-version", "in-flight"]
                    .iter()
                    .any(|slug| r.text().contains(&format!("problem:{slug}"))));
        assert!(ok, "{e} v{v}: {}", r.summary());
    }
    let mut by_entity: BTreeMap<
        String,
        Vec<(u64, std::time::Instant, Option<std::time::Instant>)>,
    > = BTreeMap::new();
    for ex in two.upstream.executions() {
        let e = ex
            .header_values("x-entity")
            .first()
            .map(|s| s.to_string())
            .unwrap();
        let v: u64 = ex
            .header_values("x-version")
            .first()
            .unwrap()
            .parse()
            .unwrap();
        by_entity
            .entry(e)
            .or_default()
            .push((v, ex.arrived, ex.head_sent));
    }
    let mut executed = 0;
    for (e, mut runs) in by_entity {
        runs.sort_by_key(|r| r.1);
        for pair in runs.windows(2) {
            let ((v0, _, done0), (v1, start1, _)) = (pair[0], pair[1]);
            assert!(v1 > v0, "{e}: version {v1} ran after {v0}: {runs:?}");
            let done0 = done0.expect("every execution answered");
            assert!(start1 >= done0, "{e}: versions {v0} and {v1} ran at once");
        }
        executed += runs.len();
    }
    assert!(
        executed >= 2,
        "at least the first version of each entity ran"
    );
    // Every 200 that was not a replay is an execution, and nothing ran that no client
    // saw executed.
    let fresh = answers
        .iter()
        .filter(|(_, _, r)| r.status == 200 && r.header("idempotent-replayed").is_none())
        .count();
    assert_eq!(
        fresh, executed,
        "executions seen by clients and by the upstream"
    );
}

/// A 5xx of version k releases it: k runs on retry (on the other proxy), k−1 is
/// refused after k completed, and the acknowledgement mode answers stale deliveries
/// with a 2xx.
#[test]
fn a_released_version_may_be_retried_and_stale_ones_are_acknowledged() {
    let two = Two::start("order-etcd-release", &config("acknowledge"));
    assert_eq!(two.send(0, &delivery("o", 3, "k3")).status, 200);
    let failed = two.send(0, &delivery("o", 5, "k5").header("x-demo-status", "503"));
    assert_eq!(failed.status, 503, "{}", failed.summary());
    // 4 is not stale: 5 never completed.
    assert_eq!(two.send(1, &delivery("o", 4, "k4")).status, 200);
    let retried = two.send(1, &delivery("o", 5, "k5"));
    assert_eq!(retried.status, 200, "{}", retried.summary());
    assert!(
        retried.header("idempotent-replayed").is_none(),
        "5 ran again"
    );
    // Stale on both proxies: acknowledged, not forwarded.
    for proxy in [0, 1] {
        let ack = two.send(proxy, &delivery("o", 4, "k4-again"));
        assert_eq!(ack.status, 200, "{}", ack.summary());
        assert_eq!(ack.header("idempotent-stale"), Some("true"));
        assert_eq!(ack.header("idempotent-applied-version"), Some("5"));
    }
    // The same delivery of 5 again: a replay, not stale.
    let dup = two.send(0, &delivery("o", 5, "k5"));
    assert_eq!(
        dup.header("idempotent-replayed"),
        Some("true"),
        "{}",
        dup.summary()
    );
    let versions: Vec<String> = two
        .upstream
        .executions()
        .iter()
        .map(|e| e.header_values("x-version").join(","))
        .collect();
    assert_eq!(versions, ["3", "5", "4", "5"], "what reached the upstream");
    // A missing version is a 400 before anything is claimed.
    let bad = two.send(
        1,
        &Request::post("/hooks")
            .key("kx")
            .header("x-entity", "o")
            .json(&json!({})),
    );
    assert_problem(&bad, 400, "missing-version");
}
