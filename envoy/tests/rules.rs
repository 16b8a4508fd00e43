//! Per-route policies (`rules`) in real Envoy: three routes with different policies
//! (payments: header key required, 24 h; webhooks: key from a JSON pointer, 7 days;
//! search: bypassed), the rule in access logs and in the operator API (`dedupctl
//! --rule`), bad rules refused with the rule's index named, and on etcd: two proxies
//! whose rules are in another order share each rule's records, and each rule's TTL
//! reaches etcd as its own lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::{config_file, dedup_wasm};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request};
use serde_json::json;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

const HOST: &str = "shop.example";

/// The README's example, as one line for the template.
fn example(extra: &str) -> String {
    format!(
        r#"{{{extra}"rules": [
          {{"name": "payments", "match": {{"path_prefix": "/payments"}},
           "key": {{"required": true}}, "ttl_seconds": 86400}},
          {{"name": "webhooks", "match": {{"path_prefix": "/webhooks", "methods": ["POST"]}},
           "key": {{"json_pointer": "/message/messageId", "required": true}},
           "payload": {{"ignore_json_pointers": ["/deliveryAttempt"]}},
           "ttl_seconds": 604800, "store_statuses": ["2xx"]}},
          {{"name": "search", "match": {{"path_prefix": "/search"}}, "bypass": true}}
        ]}}"#
    )
    .replace('\n', " ")
}

fn push(attempt: u32, data: &str) -> Request {
    Request::post("/webhooks/pubsub").host(HOST).json(&json!({
        "message": {"messageId": "msg-1", "data": data},
        "deliveryAttempt": attempt,
    }))
}

/// A keyed purchase of amount 5 from the shop.
fn purchase(path: &str, key: &str) -> Request {
    keyed(HOST, path, key, &json!({"amount": 5}))
}

#[test]
fn three_routes_follow_their_own_policies() {
    let data = example("");
    let admin_cfg = example(r#""role": "admin", "#);
    let s = Stack::start_with("rules-three-routes", |port, wasm| {
        EnvoyConfig::from_template(&config_file("admin-api.yaml"), port, wasm, &data)
            .unwrap()
            .with_port("ADMIN_API_PORT")
            .unwrap()
            .with_var("ADMIN_FILTER_CONFIG", &admin_cfg)
    });
    let admin = SocketAddr::from((
        [127, 0, 0, 1],
        s.envoy.config.port("ADMIN_API_PORT").unwrap(),
    ));
    // payments: a key is required; the key runs once.
    let no_key = s.send(&Request::post("/payments/charge").host(HOST).body("{}"));
    assert_problem(&no_key, 400, "missing-key");
    let paid = s.send(&purchase("/payments/charge", "k-1"));
    assert_executed(&paid);
    assert_replay_of(&s.send(&purchase("/payments/charge", "k-1")), &paid);
    // The same key on a route no rule matches: the top-level records, not payments'.
    let order = s.send(&purchase("/orders", "k-1"));
    assert_executed(&order);
    assert_eq!(s.executions("/payments/charge"), 1);
    // webhooks: the message id from the body; a redelivery is replayed, a changed
    // message is refused.
    let first = s.send(&push(1, "eyJhIjoxfQ=="));
    assert_executed(&first);
    assert_replay_of(&s.send(&push(2, "eyJhIjoxfQ==")), &first);
    assert_problem(&s.send(&push(3, "eyJhIjoyfQ==")), 422, "payload-mismatch");
    assert_eq!(s.executions("/webhooks/pubsub"), 1);
    // search: never deduplicated, even with a key.
    for _ in 0..2 {
        assert_eq!(s.send(&purchase("/search", "k-1")).status, 200);
    }
    assert_eq!(s.executions("/search"), 2);
    assert!(s.counter("bypassed") >= 2);
    // The operator addresses a rule's records by its name.
    let ctl = |args: &[&str]| dedupctl(admin, args);
    let target = ["--key", "k-1", "--authority", HOST, "--rule", "payments"];
    let (code, out) = ctl(&[&["get"][..], &target].concat());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("completed") && out.contains("(rule payments)"),
        "{out}"
    );
    let (code, out) = ctl(&["get", "--key", "k-1", "--authority", HOST, "--rule", "nope"]);
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = ctl(&[&["purge"][..], &target].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_executed(&s.send(&purchase("/payments/charge", "k-1")));
    assert_replay_of(&s.send(&purchase("/orders", "k-1")), &order);
    // Access log lines name the rule that chose each request's policy.
    let wanted = [
        "dedup=executed record=",
        "rule=payments",
        "rule=webhooks",
        "dedup=bypassed record=- rule=search",
    ];
    let log = s.access_log_with(&wanted);
    let orders = log
        .lines()
        .find(|l| l.contains("/orders") && l.contains("dedup=executed"))
        .unwrap_or_else(|| panic!("no /orders line:\n{log}"));
    assert!(orders.contains(" rule=- "), "{orders}");
}

#[test]
fn envoy_refuses_bad_rules_naming_the_rule_index_and_the_field() {
    assert_refused_naming_the_field(
        "rules-bad-config",
        &[
            (
                r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}}, {"name": "b", "match": {}}]}"#,
                "rules[1].match",
            ),
            (
                r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}}, {"name": "a", "match": {"path_prefix": "/b"}}]}"#,
                "rules[1].name",
            ),
            (
                r#"{"rules": [{"name": "s", "match": {"path_prefix": "/s"}, "bypass": true, "ttl_seconds": 5}]}"#,
                "rules[0].bypass",
            ),
        ],
    );
}

#[test]
fn on_etcd_reordered_rules_share_records_and_each_ttl_gets_its_own_lease() {
    let store = r#""store": {"kind": "etcd", "cluster": "etcd"}, "#;
    let a_cfg = format!(
        r#"{{{store}"rules": [
          {{"name": "payments", "match": {{"path_prefix": "/payments"}}, "key": {{"required": true}}}},
          {{"name": "short", "match": {{"path_prefix": "/short"}}, "ttl_seconds": 60}}
        ]}}"#
    )
    .replace('\n', " ");
    // Proxy B got a push that inserted a rule in front and swapped the others.
    let b_cfg = format!(
        r#"{{{store}"rules": [
          {{"name": "new", "match": {{"path_prefix": "/new"}}}},
          {{"name": "short", "match": {{"path_prefix": "/short"}}, "ttl_seconds": 60}},
          {{"name": "payments", "match": {{"path_prefix": "/payments"}}, "key": {{"required": true}}}}
        ]}}"#
    )
    .replace('\n', " ");
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let etcd = EtcdCluster::start("rules-etcd", 3).unwrap_or_else(|e| panic!("etcd: {e}"));
    let upstream = DemoUpstream::start(0, false).expect("demo upstream");
    let proxies: Vec<EnvoyProcess> = [("a", &a_cfg), ("b", &b_cfg)]
        .iter()
        .map(|(label, cfg)| {
            let config = multi_proxy_config(&etcd, upstream.port(), &wasm, cfg).unwrap();
            EnvoyProcess::start(&format!("rules-etcd-{label}"), config)
                .unwrap_or_else(|e| panic!("starting Envoy: {e}"))
        })
        .collect();
    for p in &proxies {
        wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10)).unwrap();
    }
    let send = |i: usize, r: &Request| proxies[i].send(r).unwrap();
    for path in ["/payments/charge", "/short/thing", "/orders"] {
        let first = send(0, &purchase(path, "e-1"));
        assert_executed(&first);
        let again = send(1, &purchase(path, "e-1"));
        assert_replay_of(&again, &first);
        assert_eq!(upstream.executions_for_path(path), 1, "{path}");
    }
    // Three records, one per rule and one of the top level; the short rule's lease is
    // its own (about its 60 s TTL plus slack), the others' cover a day.
    let keys = etcd.keys("proxy-dedup/").unwrap();
    assert_eq!(keys.len(), 3, "{}", keys.len());
    let granted: BTreeSet<i64> = keys
        .iter()
        .map(|k| {
            etcd.lease_ttl(k.lease)
                .unwrap()
                .expect("lease alive")
                .granted_seconds
        })
        .collect();
    let (low, high) = (*granted.first().unwrap(), *granted.last().unwrap());
    assert!(low > 60 && low < 600, "{granted:?}");
    assert!(high > 86_400, "{granted:?}");
}
