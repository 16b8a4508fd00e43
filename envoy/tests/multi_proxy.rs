//! The multi-proxy etcd suite (`multi_proxy/suite.rs`) on one etcd cluster: the
//! template's own `etcd` cluster and `store.cluster`, as a user copies it. Also the
//! tests of one cluster's plumbing that shards add nothing to: the harness itself, and
//! a gRPC store on an HTTP/1.1 cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "multi_proxy/suite.rs"]
mod suite;

/// The suite's shard count: the one `etcd` cluster.
const SHARDS: usize = 1;

use common::{assert_executed, assert_problem, keyed};
use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, EnvoyProcess};
use serde_json::json;
use std::time::{Duration, Instant};
use suite::{etcd_filter_config, Multi, HOST};

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
// One cluster's Envoy config: every shard's cluster is a copy of it, so shards add
// nothing here.
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
