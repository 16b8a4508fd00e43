//! Tests of configuration parsing: documented defaults, bounds at both ends, and errors that
//! name the field.

use super::{integral_numbers, whole_number};
use crate::config::{Config, FailureMode, OnDuplicate, OnInFlight, PrincipalSource};
use crate::stream::Plugin;
use crate::testing::*;

#[test]
fn empty_config_gives_documented_defaults() {
    let c = Config::parse(b"").unwrap();
    assert_eq!(c, Config::default());
    let c2 = Config::parse(b"{}").unwrap();
    assert_eq!(c2, c);
    assert_eq!(c.policy.key_headers, vec!["idempotency-key"]);
    assert_eq!(c.policy.methods, vec!["POST", "PATCH"]);
    assert_eq!(
        (c.policy.ttl_ms, c.policy.in_flight_timeout_ms, c.capacity),
        (86_400_000, 30_000, 100_000)
    );
    assert_eq!(
        (
            c.policy.max_body_bytes,
            c.policy.max_replay_body_bytes,
            c.policy.key_max_length
        ),
        (1_048_576, 16_384, 255)
    );
    assert_eq!(
        (c.policy.on_duplicate, c.failure_mode),
        (OnDuplicate::Replay, FailureMode::Closed)
    );
    assert_eq!(
        c.policy.principal,
        PrincipalSource::Header("authorization".into()),
        "records belong to their caller by default"
    );
    assert!(!c.request_id_preserved);
    assert!(c.stores_status(200) && c.stores_status(404) && c.stores_status(302));
    assert!(!c.stores_status(500) && !c.stores_status(503) && !c.stores_status(101));
}

#[test]
fn full_config_parses() {
    let c = Config::parse(
        br#"{"key": {"headers": ["X-Request-Id", "idempotency-key"], "json_pointer": "/msg~1id", "fingerprint": ["method", "path", "query", "body", "header:X-Tenant"], "required": true, "max_length": 64},
            "scope": {"headers": ["x-tenant"]}, "methods": ["POST", "PUT"], "on_duplicate": "reject", "ttl_seconds": 60,
            "in_flight_timeout_seconds": 5, "retry_after_seconds": 2, "capacity": 1024, "max_body_bytes": 4096,
            "max_replay_body_bytes": 1024, "store_statuses": ["2xx", "409"], "replayed_header": "X-Replayed",
            "failure_mode": "closed", "request_id_preserved": true, "store": {"kind": "shared_data", "namespace": "orders"}}"#,
    )
    .unwrap();
    assert_eq!(
        c.policy.key_headers,
        vec!["x-request-id", "idempotency-key"]
    );
    assert_eq!(c.policy.json_pointer.as_deref(), Some("/msg~1id"));
    assert_eq!(c.policy.fingerprint.len(), 5);
    assert!(c.policy.key_required);
    assert_eq!(c.policy.on_duplicate, OnDuplicate::Reject);
    assert_eq!(c.failure_mode, FailureMode::Closed);
    assert!(c.stores_status(201) && c.stores_status(409) && !c.stores_status(404));
    assert_eq!(c.replayed_header, "x-replayed");
    assert_eq!(c.namespace(), "orders");
}

/// The catalogue of refused configurations, shared with `dedupctl check-config`'s test
/// (envoy/tests/check_config.rs): `(field, reason, configuration)` per line.
fn refused_configs() -> Vec<(&'static str, &'static str, &'static str)> {
    include_str!("../../testdata/refused-configs.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.splitn(3, '|').map(str::trim);
            let mut next = || {
                parts
                    .next()
                    .unwrap_or_else(|| panic!("not `field | reason | config`: {l}"))
            };
            (next(), next(), next())
        })
        .collect()
}

#[test]
fn every_catalogued_bad_config_is_refused_naming_its_field() {
    let cases = refused_configs();
    assert!(cases.len() > 100, "{}", cases.len());
    for (field, reason, json) in cases {
        let (f, r) = cfg_err(json);
        assert_eq!(f, field, "field for {json}: {r}");
        assert!(
            r.contains(reason),
            "reason for {json}: {r:?} should mention {reason:?}"
        );
    }
}

#[test]
fn config_errors_name_the_field() {
    let e = Config::parse(&[0xff, 0xfe]).unwrap_err();
    assert_eq!(e.field, "(root)");
    let shown = Config::parse(br#"{"capacity": 1}"#)
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains("`capacity`") && shown.contains("out of range"),
        "{shown}"
    );
}

#[test]
fn etcd_config() {
    let c = Config::parse(br#"{"store": {"kind": "etcd", "cluster": "etcd-c"}}"#).unwrap();
    match c.store {
        crate::config::StoreConfig::Etcd(e) => {
            assert_eq!(
                (
                    e.shards[0].cluster.as_str(),
                    e.shards[0].authority.as_str(),
                    e.prefix.as_str(),
                    e.timeout_ms
                ),
                ("etcd-c", "etcd-c", "proxy-dedup/", 8000)
            );
            assert_eq!(
                e.protocol,
                crate::stores::etcd::wire::Protocol::Grpc,
                "gRPC by default"
            );
        }
        other => panic!("{other:?}"),
    }
    for (name, want) in [
        ("grpc", crate::stores::etcd::wire::Protocol::Grpc),
        ("json", crate::stores::etcd::wire::Protocol::Json),
    ] {
        let c = Config::parse(
            format!(r#"{{"store": {{"kind": "etcd", "cluster": "e", "protocol": "{name}"}}}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert!(matches!(c.store, crate::config::StoreConfig::Etcd(e) if e.protocol == want));
    }
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "protocol": "http"}}"#).0,
        "store.protocol"
    );
    assert_eq!(
        cfg_err(r#"{"store": {"protocol": "grpc"}}"#).0,
        "store.protocol",
        "only for etcd"
    );
    assert_eq!(cfg_err(r#"{"store": {"kind": "etcd"}}"#).0, "store.cluster");
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "timeout_ms": 1}}"#).0,
        "store.timeout_ms"
    );
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "namespace": "x"}}"#).0,
        "store.namespace"
    );
    assert_eq!(cfg_err(r#"{"store": {"cluster": "e"}}"#).0, "store.cluster");
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "prefix": ""}}"#).0,
        "store.prefix"
    );
}

#[test]
fn every_documented_range_includes_its_ends() {
    let ok = |json: &str| {
        Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
    };
    let refused = |json: &str, field: &str| {
        assert_eq!(cfg_err(json).0, field, "{json}");
    };
    for (field, low, high) in [
        ("ttl_seconds", 1u64, 31_536_000u64),
        ("in_flight_timeout_seconds", 1, 86_400),
        ("retry_after_seconds", 0, 3600),
        ("capacity", 16, 10_000_000),
        ("max_body_bytes", 0, 64 << 20),
        ("max_replay_body_bytes", 0, 16 << 20),
    ] {
        ok(&format!(r#"{{"{field}": {low}}}"#));
        ok(&format!(r#"{{"{field}": {high}}}"#));
        refused(&format!(r#"{{"{field}": {}}}"#, high + 1), field);
        if low > 0 {
            refused(&format!(r#"{{"{field}": {}}}"#, low - 1), field);
        }
    }
    let c = Config::parse(br#"{"ttl_seconds": 31536000, "capacity": 16}"#).unwrap();
    assert_eq!((c.policy.ttl_ms, c.capacity), (31_536_000_000, 16));
    ok(r#"{"key": {"max_length": 4096}}"#);
    refused(r#"{"key": {"max_length": 4097}}"#, "key.max_length");
    let etcd = |extra: &str| format!(r#"{{"store": {{"kind": "etcd", "cluster": "e"{extra}}}}}"#);
    ok(&etcd(r#", "timeout_ms": 10"#));
    ok(&etcd(r#", "timeout_ms": 60000"#));
    refused(&etcd(r#", "timeout_ms": 60001"#), "store.timeout_ms");
    ok(&etcd(r#", "max_record_bytes": 67108864"#));
    refused(
        &etcd(r#", "max_record_bytes": 4095"#),
        "store.max_record_bytes",
    );
}

#[test]
fn header_lists_hold_up_to_16_names() {
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("\"x-h{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for field in ["key", "scope"] {
        let json = |n| format!(r#"{{"{field}": {{"headers": [{}]}}}}"#, names(n));
        Config::parse(json(16).as_bytes()).unwrap();
        assert_eq!(cfg_err(&json(17)).0, format!("{field}.headers"));
    }
}

#[test]
fn the_etcd_record_limit_defaults_to_1_mib_and_must_fit_the_replay_cap() {
    let c = Config::parse(br#"{"store": {"kind": "etcd", "cluster": "e"}}"#).unwrap();
    let crate::config::StoreConfig::Etcd(ec) = &c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(ec.max_record_bytes, 1 << 20);
    // The replay cap may use all the room the record's own 16384 bytes leave, not one more.
    let room = 4096 * 4 + 100 - 16_384;
    let json = |cap: usize| {
        format!(
            r#"{{"max_replay_body_bytes": {cap}, "store": {{"kind": "etcd", "cluster": "e", "max_record_bytes": {}}}}}"#,
            4096 * 4 + 100
        )
    };
    Config::parse(json(room).as_bytes()).unwrap();
    assert_eq!(cfg_err(&json(room + 1)).0, "max_replay_body_bytes");
}

#[test]
fn store_names_are_checked_at_both_ends() {
    let ns = |n: &str| format!(r#"{{"store": {{"namespace": "{n}"}}}}"#);
    Config::parse(ns(&"n".repeat(64)).as_bytes()).unwrap();
    for bad in ["".to_string(), "n".repeat(65), "a/b".into(), "a b".into()] {
        assert_eq!(cfg_err(&ns(&bad)).0, "store.namespace", "{bad:?}");
    }
    let etcd = |extra: &str| format!(r#"{{"store": {{"kind": "etcd"{extra}}}}}"#);
    assert_eq!(cfg_err(&etcd(r#", "cluster": """#)).0, "store.cluster");
    Config::parse(etcd(r#", "cluster": "c", "authority": "etcd.local""#).as_bytes()).unwrap();
    for bad in ["", "a b", "a\\u0001"] {
        let json = etcd(&format!(r#", "cluster": "c", "authority": "{bad}""#));
        assert_eq!(cfg_err(&json).0, "store.authority", "{bad:?}");
    }
    let prefix = |p: &str| etcd(&format!(r#", "cluster": "c", "prefix": "{p}""#));
    Config::parse(prefix(&"p".repeat(128)).as_bytes()).unwrap();
    for bad in ["".to_string(), "p".repeat(129), "a\\u0007".into()] {
        assert_eq!(cfg_err(&prefix(&bad)).0, "store.prefix", "{bad:?}");
    }
}

#[test]
fn payload_pointer_lists_hold_1_to_32() {
    let json = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("\"/f{i}\"")).collect();
        format!(
            r#"{{"payload": {{"json_pointers": [{}]}}}}"#,
            list.join(", ")
        )
    };
    Config::parse(json(1).as_bytes()).unwrap();
    Config::parse(json(32).as_bytes()).unwrap();
    assert_eq!(cfg_err(&json(33)).0, "payload.json_pointers");
    assert_eq!(cfg_err(&json(0)).0, "payload.json_pointers");
}

#[test]
fn max_store_bytes_defaults_and_bounds() {
    // By default every bucket's share holds one response of max_replay_body_bytes with
    // 4 KiB of headers: 6,250 buckets × 20 KiB with the defaults, within 128 MiB.
    let d = Config::parse(b"{}").unwrap();
    assert_eq!(d.max_store_bytes().unwrap(), 128 << 20);
    // 64 KiB responses raise it to 6,250 × 68 KiB.
    let big = Config::parse(br#"{"max_replay_body_bytes": 65536}"#).unwrap();
    assert_eq!(big.max_store_bytes().unwrap(), 6_250 * (65_536 + 4_096));
    assert_eq!(
        d.max_store_bytes().unwrap(),
        Config::default().max_store_bytes().unwrap()
    );
    // The largest of every policy's max_replay_body_bytes counts.
    let rules = Config::parse(
        br#"{"capacity": 16000, "rules": [{"name": "big", "match": {"path_prefix": "/b"},
            "max_replay_body_bytes": 1048576}]}"#,
    )
    .unwrap();
    assert_eq!(
        rules.max_store_bytes().unwrap(),
        1_000 * (1_048_576 + 4_096)
    );
    // 128 MiB at the least, whenever that is more.
    let small = Config::parse(br#"{"capacity": 1600, "max_replay_body_bytes": 1024}"#).unwrap();
    assert_eq!(small.max_store_bytes().unwrap(), 128 << 20);
    // Very large capacities with small responses still get at least 4 KiB per bucket.
    let big = Config::parse(br#"{"capacity": 10000000, "max_replay_body_bytes": 0}"#).unwrap();
    assert_eq!(big.max_store_bytes().unwrap(), 10_000_000 / 16 * 4096);
    let c = Config::parse(br#"{"capacity": 1024, "store": {"max_store_bytes": 8388608}}"#).unwrap();
    assert_eq!(c.max_store_bytes().unwrap(), 8 << 20);
    assert_eq!(
        Plugin::new(c).layout().unwrap().bucket_budget,
        (8 << 20) / 64
    );
    // Its refused values: testdata/refused-configs.txt.
    let ok = Config::parse(br#"{"store": {"max_store_bytes": 25600000}}"#).unwrap();
    assert_eq!(ok.max_store_bytes().unwrap(), 25_600_000);
}

#[test]
fn wait_config_defaults_and_errors_name_the_field() {
    let c = Config::parse(b"{}").unwrap();
    assert_eq!(c.policy.on_in_flight, OnInFlight::Reject);
    assert_eq!(c.policy.wait_timeout_ms, 10_000);
    assert_eq!(c.max_waiters, 1024);
    let c = Config::parse(br#"{"in_flight_timeout_seconds": 4}"#).unwrap();
    assert_eq!(
        c.policy.wait_timeout_ms, 4_000,
        "the default follows a shorter in-flight timeout"
    );
    let c =
        Config::parse(br#"{"on_in_flight": "wait", "wait_timeout_ms": 30000, "max_waiters": 7}"#)
            .unwrap();
    assert_eq!(
        (
            c.policy.on_in_flight,
            c.policy.wait_timeout_ms,
            c.max_waiters
        ),
        (OnInFlight::Wait, 30_000, 7)
    );
    assert_eq!(cfg_err(r#"{"wait_timeout_ms": 0}"#).0, "wait_timeout_ms");
    let (field, reason) = cfg_err(r#"{"in_flight_timeout_seconds": 5, "wait_timeout_ms": 5001}"#);
    assert_eq!(field, "wait_timeout_ms");
    assert!(reason.contains("in_flight_timeout_seconds"), "{reason}");
    assert_eq!(cfg_err(r#"{"max_waiters": 0}"#).0, "max_waiters");
    assert_eq!(cfg_err(r#"{"on_in_flight": "queue"}"#).0, "on_in_flight");
}

#[test]
fn each_store_carries_only_its_own_settings() {
    let shared = Config::parse(br#"{"store": {"namespace": "orders"}}"#).unwrap();
    assert!(matches!(
        &shared.store,
        crate::config::StoreConfig::SharedData { namespace, .. } if namespace == "orders"
    ));
    assert_eq!(shared.namespace(), "orders");
    assert!(shared.max_store_bytes().is_some());
    // etcd has no namespace nor byte budget of its own; the wake-up board of wait mode
    // (in shared data whatever the store) uses the default namespace.
    let etcd = Config::parse(br#"{"store": {"kind": "etcd", "cluster": "e"}}"#).unwrap();
    assert_eq!(etcd.namespace(), Config::default().namespace());
    assert_eq!(etcd.max_store_bytes(), None);
}

#[test]
fn grpc_defaults_to_bypass_and_a_rule_overrides_it() {
    use crate::config::GrpcPolicy;
    let c = Config::parse(b"{}").unwrap();
    assert_eq!(c.policy.grpc, GrpcPolicy::Bypass);
    let c = Config::parse(
        br#"{"grpc": "deduplicate", "rules": [
            {"name": "a", "match": {"path_prefix": "/a"}},
            {"name": "b", "match": {"path_prefix": "/b"}, "grpc": "bypass"}
        ]}"#,
    )
    .unwrap();
    assert_eq!(c.policy.grpc, GrpcPolicy::Deduplicate);
    assert_eq!(c.rules[0].policy.grpc, GrpcPolicy::Deduplicate, "inherited");
    assert_eq!(c.rules[1].policy.grpc, GrpcPolicy::Bypass);
    assert_eq!(cfg_err(r#"{"grpc": "skip"}"#).0, "grpc");
    assert_eq!(
        cfg_err(r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}, "grpc": true}]}"#).0,
        "rules[0].grpc"
    );
    let (field, reason) = cfg_err(
        r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}, "bypass": true, "grpc": "deduplicate"}]}"#,
    );
    assert_eq!(field, "rules[0].bypass");
    assert!(reason.contains("grpc"), "{reason}");
}

#[test]
fn advertise_expiry_defaults_on_and_a_rule_inherits_or_overrides_it() {
    let c = Config::parse(b"{}").unwrap();
    assert!(c.policy.advertise_expiry);
    let c = Config::parse(
        br#"{"advertise_expiry": false, "rules": [
            {"name": "a", "match": {"path_prefix": "/a"}},
            {"name": "b", "match": {"path_prefix": "/b"}, "advertise_expiry": true}
        ]}"#,
    )
    .unwrap();
    assert!(!c.policy.advertise_expiry);
    assert!(!c.rules[0].policy.advertise_expiry, "inherited");
    assert!(c.rules[1].policy.advertise_expiry);
    assert_eq!(
        cfg_err(r#"{"advertise_expiry": "yes"}"#).0,
        "advertise_expiry"
    );
    assert_eq!(
        cfg_err(
            r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}, "advertise_expiry": 1}]}"#
        )
        .0,
        "rules[0].advertise_expiry"
    );
}

#[test]
fn shard_maps() {
    let etcd = |store: &str| {
        let c = Config::parse(format!(r#"{{"store": {{"kind": "etcd", {store}}}}}"#).as_bytes())
            .unwrap();
        match c.store {
            crate::config::StoreConfig::Etcd(e) => e,
            other => panic!("{other:?}"),
        }
    };
    // One cluster is a map of one shard named after it.
    let one = etcd(r#""cluster": "etcd""#);
    assert_eq!(
        (
            one.shards.len(),
            one.shards[0].name.as_str(),
            one.check.is_none()
        ),
        (1, "etcd", true)
    );
    let two = etcd(
        r#""shards": [{"name": "a", "cluster": "etcd_a"}, {"cluster": "etcd_b", "authority": "b.internal"}]"#,
    );
    let names: Vec<(&str, &str, &str)> = two
        .shards
        .iter()
        .map(|s| (s.name.as_str(), s.cluster.as_str(), s.authority.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("a", "etcd_a", "etcd_a"),
            ("etcd_b", "etcd_b", "b.internal")
        ]
    );
    let moving = etcd(
        r#""shards": [{"name": "a", "cluster": "etcd_a"}, {"name": "b", "cluster": "etcd_b"}],
           "previous_shards": [{"name": "a", "cluster": "etcd_a"}]"#,
    );
    let check = moving.check.unwrap();
    assert_eq!(
        (check.role, check.shards.len()),
        (crate::config::CheckRole::Previous, 1)
    );
    let next = etcd(
        r#""cluster": "etcd_a", "next_shards": [{"name": "etcd_a", "cluster": "etcd_a"}, {"cluster": "etcd_b"}]"#,
    );
    assert_eq!(next.check.unwrap().role, crate::config::CheckRole::Next);

    // Each mistake is named.
    for (store, field) in [
        (
            r#""cluster": "e", "shards": [{"cluster": "a"}]"#,
            "store.shards",
        ),
        (r#""shards": []"#, "store.shards"),
        (r#""shards": [{"name": "a"}]"#, "store.shards[0].cluster"),
        (r#""shards": [{"cluster": ""}]"#, "store.shards[0].cluster"),
        (
            r#""shards": [{"cluster": "a", "name": ""}]"#,
            "store.shards[0].name",
        ),
        (
            r#""shards": [{"cluster": "a", "name": "a b"}]"#,
            "store.shards[0].name",
        ),
        (
            r#""shards": [{"cluster": "a", "name": "x"}, {"cluster": "b", "name": "x"}]"#,
            "store.shards[1].name",
        ),
        (
            r#""shards": [{"cluster": "a", "name": "x"}, {"cluster": "a", "name": "y"}]"#,
            "store.shards[1].cluster",
        ),
        (
            r#""shards": [{"cluster": "a", "port": 1}]"#,
            "store.shards[0].port",
        ),
        (
            r#""shards": [{"cluster": "a"}], "authority": "x""#,
            "store.authority",
        ),
        (
            r#""cluster": "a", "previous_shards": [{"cluster": "b"}], "next_shards": [{"cluster": "b"}]"#,
            "store.next_shards",
        ),
        // A shard in both maps is one cluster, and a cluster keeps its name.
        (
            r#""shards": [{"name": "a", "cluster": "etcd_a"}], "previous_shards": [{"name": "a", "cluster": "etcd_x"}]"#,
            "store.previous_shards[0].cluster",
        ),
        (
            r#""shards": [{"name": "a", "cluster": "etcd_a"}], "next_shards": [{"name": "b", "cluster": "etcd_a"}]"#,
            "store.next_shards[0].name",
        ),
        (
            r#""cluster": "a", "previous_shards": []"#,
            "store.previous_shards",
        ),
    ] {
        let doc = format!(r#"{{"store": {{"kind": "etcd", {store}}}}}"#);
        assert_eq!(cfg_err(&doc).0, field, "{doc}");
    }
    // Sixteen shards at most.
    let sixteen: Vec<String> = (0..16)
        .map(|i| format!(r#"{{"cluster": "c{i}"}}"#))
        .collect();
    let doc = format!(
        r#"{{"store": {{"kind": "etcd", "shards": [{}]}}}}"#,
        sixteen.join(",")
    );
    assert!(Config::parse(doc.as_bytes()).is_ok(), "{doc}");
    // A shard in both maps with another authority is another way to its cluster: refused.
    assert_eq!(
        cfg_err(
            r#"{"store": {"kind": "etcd", "shards": [{"name": "a", "cluster": "etcd_a"}], "previous_shards": [{"name": "a", "cluster": "etcd_a", "authority": "x"}]}}"#
        )
        .0,
        "store.previous_shards[0].cluster"
    );
    let many: Vec<String> = (0..17)
        .map(|i| format!(r#"{{"cluster": "c{i}"}}"#))
        .collect();
    let doc = format!(
        r#"{{"store": {{"kind": "etcd", "shards": [{}]}}}}"#,
        many.join(",")
    );
    assert_eq!(cfg_err(&doc).0, "store.shards");
    // Shards are etcd's.
    assert_eq!(
        cfg_err(r#"{"store": {"shards": [{"cluster": "a"}]}}"#).0,
        "store.shards"
    );
}

#[test]
fn a_principal_comes_from_one_source() {
    let p = |json: &str| Config::parse(json.as_bytes()).unwrap().policy.principal;
    assert_eq!(
        p(r#"{"principal": {"header": "X-Api-Key"}}"#),
        PrincipalSource::Header("x-api-key".into())
    );
    assert_eq!(
        p(r#"{"principal": {"cookie": "session"}}"#),
        PrincipalSource::Cookie("session".into())
    );
    assert_eq!(p(r#"{"principal": {"none": true}}"#), PrincipalSource::None);
    let PrincipalSource::Metadata { path, property } =
        p(r#"{"principal": {"metadata": ["envoy.filters.http.jwt_authn", "jwt_payload", "sub"]}}"#)
    else {
        panic!("metadata")
    };
    assert_eq!(path.len(), 3);
    assert_eq!(
        property,
        "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0sub"
    );
    // A rule's own principal, and the glue is told which property to read, once.
    let c = Config::parse(
        br#"{"principal": {"metadata": ["jwt", "sub"]},
             "rules": [{"name": "a", "match": {"path_prefix": "/a"}, "principal": {"metadata": ["jwt", "sub"]}},
                       {"name": "b", "match": {"path_prefix": "/b"}, "principal": {"cookie": "sid"}}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.metadata_properties.to_vec(),
        vec!["metadata\0filter_metadata\0jwt\0sub"]
    );
    assert_eq!(
        c.rules[1].policy.principal,
        PrincipalSource::Cookie("sid".into())
    );
}

#[test]
fn x_request_id_is_a_key_only_once_envoy_is_said_to_keep_the_clients() {
    for json in [
        r#"{"key": {"headers": ["x-request-id"], "required": true}}"#,
        r#"{"scope": {"headers": ["x-request-id"]}}"#,
        r#"{"key": {"fingerprint": ["body", "header:x-request-id"]}}"#,
        r#"{"principal": {"header": "x-request-id"}}"#,
        r#"{"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "key": {"headers": ["X-Request-ID"]}}]}"#,
    ] {
        let e = Config::parse(json.as_bytes()).unwrap_err();
        for needed in [
            "preserve_external_request_id",
            "generate_request_id",
            "request_id_preserved",
        ] {
            assert!(e.reason.contains(needed), "{json}: {e}");
        }
        let with = json.replacen('{', r#"{"request_id_preserved": true, "#, 1);
        Config::parse(with.as_bytes()).unwrap_or_else(|e| panic!("{with}: {e}"));
    }
    let e = Config::parse(br#"{"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "key": {"headers": ["x-request-id"]}}]}"#).unwrap_err();
    assert_eq!(e.field, "rules[0].key.headers");
    // Headers Envoy always sets are never a key, whatever is said.
    let e = Config::parse(
        br#"{"request_id_preserved": true, "key": {"headers": ["x-forwarded-for"]}}"#,
    )
    .unwrap_err();
    assert_eq!(e.field, "key.headers");
    assert!(e.reason.contains("appends the peer's address"), "{e}");
}

#[test]
fn a_small_waiter_pool_leaves_room_for_another_scope() {
    let per_scope = |pool: u64| {
        Config::parse(format!(r#"{{"max_waiters": {pool}}}"#).as_bytes())
            .unwrap()
            .max_waiters_per_scope
    };
    assert_eq!(per_scope(1), 1);
    assert_eq!(per_scope(2), 1);
    assert_eq!(per_scope(3), 1);
    assert_eq!(per_scope(10), 5);
    assert_eq!(per_scope(512), 256);
    assert_eq!(per_scope(100_000), 256);
    assert_eq!(Config::parse(b"{}").unwrap().max_waiters_per_scope, 256);
}

/// An integer field takes a whole number in any JSON notation (JSON Schema's
/// `integer`), a number with a fraction is refused naming the field, and strings and
/// out-of-range numbers are left as they were.
#[test]
fn a_whole_number_in_any_notation_is_an_integer() {
    for (written, want) in [
        ("60.0", 60),
        ("6e1", 60),
        ("6.0E+1", 60),
        ("1.5e3", 1500),
        ("600e-1", 60),
    ] {
        let c = Config::parse(format!(r#"{{"ttl_seconds": {written}}}"#).as_bytes()).unwrap();
        assert_eq!(c.policy.ttl_ms, want * 1000, "{written}");
    }
    for written in ["60.5", "6.05e1", "1e30", "-60.0", "01.0"] {
        let e = Config::parse(format!(r#"{{"ttl_seconds": {written}}}"#).as_bytes()).unwrap_err();
        assert_eq!(e.field, "ttl_seconds", "{written}: {e}");
    }
    assert_eq!(
        integral_numbers(r#"{"a": "1.0e3", "b": [2.50e1, 7]}"#),
        r#"{"a": "1.0e3", "b": [25, 7]}"#
    );
    assert_eq!(whole_number("-0.0").as_deref(), Some("0"));
    assert_eq!(whole_number("12"), None);
    assert_eq!(whole_number("1."), None);
}

/// Regions: `store.region`, each shard's `region`, `store.home` and the home rules of a
/// re-homing, each mistake refused with its field named.
#[test]
fn regions_are_read_and_every_mistake_is_named() {
    const SHARDS: &str = r#""shards": [{"name": "a", "cluster": "etcd_a", "region": "eu"},
        {"name": "c", "cluster": "etcd_c", "region": "us"}]"#;
    const HOME: &str = r#""home": {"header": "x-region", "default": "us"}"#;
    let doc = |store: &str, top: &str| {
        let sep = if top.is_empty() { "" } else { ", " };
        format!(
            r#"{{"scope": {{"headers": ["x-region", "x-tenant"]}}, "store": {{"kind": "etcd", {store}}}{sep}{top}}}"#
        )
    };
    let ok =
        Config::parse(doc(&format!(r#"{SHARDS}, "region": "eu", {HOME}"#), "").as_bytes()).unwrap();
    let crate::config::StoreConfig::Etcd(ec) = &ok.store else {
        panic!("etcd")
    };
    let r = ec.regions.as_ref().unwrap();
    assert_eq!(r.local, "eu");
    assert_eq!(r.home.regions, ["eu", "us"]);
    assert_eq!((r.home.header.as_str(), r.home.default), ("x-region", 1));
    assert_eq!(ec.shards[0].region.as_deref(), Some("eu"));
    // The home header's case is folded like any header name.
    let folded = doc(
        &format!(r#"{SHARDS}, "region": "eu", "home": {{"header": "X-Region", "default": "eu"}}"#),
        "",
    );
    assert!(Config::parse(folded.as_bytes()).is_ok(), "{folded}");
    for (store, top, field) in [
        // The home header must be in every policy's scope.
        (
            format!(r#"{SHARDS}, "region": "eu", "home": {{"header": "x-home", "default": "us"}}"#),
            "",
            "store.home.header",
        ),
        (
            format!(r#"{SHARDS}, "region": "eu", {HOME}"#),
            r#""rules": [{"name": "x", "match": {"path_prefix": "/x"}, "scope": {"headers": ["x-tenant"]}}]"#,
            "store.home.header",
        ),
        // Every region named has a shard.
        (
            format!(
                r#"{SHARDS}, "region": "eu", "home": {{"header": "x-region", "default": "ap"}}"#
            ),
            "",
            "store.home.default",
        ),
        (
            format!(
                r#"{SHARDS}, "region": "eu", "home": {{"header": "x-tenant", "map": {{"acme": "ap"}}, "default": "eu"}}"#
            ),
            "",
            "store.home.map.acme",
        ),
        (
            format!(
                r#"{SHARDS}, "region": "eu", "home": {{"header": "x-tenant", "map": {{}}, "default": "eu"}}"#
            ),
            "",
            "store.home.map",
        ),
        (
            format!(r#"{SHARDS}, "region": "ap", {HOME}"#),
            "",
            "store.region",
        ),
        (format!(r#"{SHARDS}, {HOME}"#), "", "store.region"),
        (
            format!(r#"{SHARDS}, "region": "eu", "home": {{"default": "us"}}"#),
            "",
            "store.home.header",
        ),
        (
            format!(r#"{SHARDS}, "region": "eu", "home": {{"header": "x-region"}}"#),
            "",
            "store.home.default",
        ),
        (
            format!(
                r#"{SHARDS}, "region": "eu", "home": {{"header": "x region", "default": "us"}}"#
            ),
            "",
            "store.home.header",
        ),
        // Regions need a home rule, and a home rule needs regions on every shard.
        (SHARDS.to_string(), "", "store.shards[0].region"),
        (
            r#""cluster": "etcd", "region": "eu""#.to_string(),
            "",
            "store.region",
        ),
        (
            format!(r#""cluster": "etcd", "region": "eu", {HOME}"#),
            "",
            "store.home",
        ),
        (
            format!(
                r#""shards": [{{"cluster": "etcd_a", "region": "eu"}}, {{"cluster": "etcd_c"}}], "region": "eu", {HOME}"#
            ),
            "",
            "store.shards[1].region",
        ),
        // A map with regions needs a home rule that names only its regions.
        (
            format!(
                r#"{SHARDS}, "region": "eu", {HOME}, "next_shards": [{{"name": "a", "cluster": "etcd_a", "region": "eu"}}]"#
            ),
            "",
            "store.home.default",
        ),
        (
            r#""shards": [{"name": "a", "cluster": "etcd_a"}], "next_shards": [{"name": "a", "cluster": "etcd_a", "region": "eu"}]"#.to_string(),
            "",
            "store.next_shards[0].region",
        ),
        (
            r#""shards": [{"name": "a", "cluster": "etcd_a"}], "next_shards": [{"name": "a", "cluster": "etcd_a", "region": "eu"}, {"name": "c", "cluster": "etcd_c"}], "next_home": {"header": "x-region", "default": "eu"}"#.to_string(),
            "",
            "store.next_shards[1].region",
        ),
        // One move at a time, and a next home rule is checked like the current one.
        (
            format!(
                r#"{SHARDS}, "region": "eu", {HOME}, "previous_home": {HOME_EU}, "next_shards": {MAP}"#,
                HOME_EU = r#"{"header": "x-region", "default": "eu"}"#,
                MAP = r#"[{"name": "a", "cluster": "etcd_a", "region": "eu"}]"#
            ),
            "",
            "store.next_shards",
        ),
        (
            format!(
                r#"{SHARDS}, "region": "eu", {HOME}, "next_home": {{"header": "x-region", "default": "ap"}}"#
            ),
            "",
            "store.next_home.default",
        ),
        (
            format!(
                r#"{SHARDS}, "region": "eu", {HOME}, "next_home": {{"header": "x-other", "default": "eu"}}"#
            ),
            "",
            "store.next_home.header",
        ),
        (
            r#""cluster": "etcd", "next_home": {"header": "x-region", "default": "eu"}"#
                .to_string(),
            "",
            "store.next_home",
        ),
        (
            r#""cluster": "etcd", "next_home": {"header": "x-other", "default": "eu"}, "next_shards": [{"cluster": "etcd", "region": "eu"}]"#.to_string(),
            "",
            "store.next_home.header",
        ),
    ] {
        let d = doc(&store, top);
        assert_eq!(cfg_err(&d).0, field, "{d}");
    }
    // Adopting regions, and dropping them, by the two steps: a map without regions
    // beside one with.
    for (store, role) in [
        (
            r#""shards": [{"name": "a", "cluster": "etcd_a"}], "next_shards": [{"name": "a", "cluster": "etcd_a", "region": "eu"}, {"name": "c", "cluster": "etcd_c", "region": "us"}], "next_home": {"header": "x-region", "default": "eu"}"#.to_string(),
            crate::config::CheckRole::Next,
        ),
        (
            format!(r#"{SHARDS}, "region": "eu", {HOME}, "previous_shards": [{{"name": "a", "cluster": "etcd_a"}}]"#),
            crate::config::CheckRole::Previous,
        ),
    ] {
        let c = Config::parse(doc(&store, "").as_bytes()).unwrap();
        let crate::config::StoreConfig::Etcd(ec) = &c.store else {
            panic!("etcd")
        };
        let check = ec.check.as_ref().unwrap();
        assert_eq!(check.role, role);
        assert_eq!(check.home.is_some(), role == crate::config::CheckRole::Next);
        assert_eq!(ec.regions.is_some(), role == crate::config::CheckRole::Previous);
    }
    // A region's name is a shard name's: 1-64 visible ASCII characters.
    let long = "r".repeat(65);
    for bad in ["", "a b", "é", long.as_str()] {
        let d = doc(
            &format!(
                r#""shards": [{{"cluster": "etcd_a", "region": "{bad}"}}], "region": "{bad}", "home": {{"header": "x-region", "default": "{bad}"}}"#
            ),
            "",
        );
        assert_eq!(cfg_err(&d).0, "store.shards[0].region", "{d}");
    }
    let longest = "r".repeat(64);
    let d = doc(
        &format!(
            r#""shards": [{{"cluster": "etcd_a", "region": "{longest}"}}], "region": "{longest}", "home": {{"header": "x-region", "default": "{longest}"}}"#
        ),
        "",
    );
    assert!(Config::parse(d.as_bytes()).is_ok(), "{d}");
    // A next map with regions and no rule of its own takes the current rule, map and all.
    for home in [
        HOME,
        r#""home": {"header": "x-tenant", "map": {"acme": "us"}, "default": "eu"}"#,
    ] {
        let d = doc(
            &format!(
                r#"{SHARDS}, "region": "eu", {home}, "next_shards": [{{"name": "a", "cluster": "etcd_a", "region": "eu"}},
                   {{"name": "b", "cluster": "etcd_b", "region": "eu"}}, {{"name": "c", "cluster": "etcd_c", "region": "us"}}]"#
            ),
            "",
        );
        let c = Config::parse(d.as_bytes()).unwrap_or_else(|e| panic!("{d}: {e}"));
        let crate::config::StoreConfig::Etcd(ec) = &c.store else {
            panic!("etcd")
        };
        let (now, next) = (
            &ec.regions.as_ref().unwrap().home,
            ec.check.as_ref().unwrap().home.as_ref().unwrap(),
        );
        assert_eq!(
            (&next.header, &next.map, next.default),
            (&now.header, &now.map, now.default)
        );
    }
    // A home rule's header is a header name; its map is bounded, and so are its values.
    let (field, reason) = cfg_err(&doc(
        &format!(r#"{SHARDS}, "region": "eu", "home": {{"header": "x region", "default": "us"}}"#),
        "",
    ));
    assert_eq!(field, "store.home.header");
    assert!(reason.contains("not a valid header name"), "{reason}");
    let map_of = |n: usize, value: &dyn Fn(usize) -> String| {
        let entries: Vec<String> = (0..n).map(|i| format!(r#""{}": "eu""#, value(i))).collect();
        doc(
            &format!(
                r#"{SHARDS}, "region": "eu", "home": {{"header": "x-tenant", "map": {{{}}}, "default": "eu"}}"#,
                entries.join(", ")
            ),
            "",
        )
    };
    let most = crate::config::fields::MAX_HOME_MAP;
    assert!(Config::parse(map_of(most, &|i| format!("t{i}")).as_bytes()).is_ok());
    assert_eq!(
        cfg_err(&map_of(most + 1, &|i| format!("t{i}"))).0,
        "store.home.map"
    );
    let longest = crate::config::fields::MAX_HOME_VALUE_BYTES;
    assert!(Config::parse(map_of(1, &|_| "v".repeat(longest)).as_bytes()).is_ok());
    for bad in ["v".repeat(longest + 1), String::new()] {
        assert_eq!(cfg_err(&map_of(1, &|_| bad.clone())).0, "store.home.map");
    }
    // A shard's name is bounded too.
    let named = |n: usize| {
        format!(
            r#"{{"store": {{"kind": "etcd", "shards": [{{"cluster": "a", "name": "{}"}}]}}}}"#,
            "x".repeat(n)
        )
    };
    assert!(Config::parse(named(64).as_bytes()).is_ok());
    assert_eq!(cfg_err(&named(65)).0, "store.shards[0].name");
    // Shared data has no regions.
    assert_eq!(cfg_err(r#"{"store": {"region": "eu"}}"#).0, "store.region");
    // A re-homing's next rule, resolved against the same shards.
    let moving = Config::parse(
        doc(
            &format!(
                r#"{SHARDS}, "region": "eu", {HOME}, "next_home": {{"header": "x-region", "default": "eu"}}"#
            ),
            "",
        )
        .as_bytes(),
    )
    .unwrap();
    let crate::config::StoreConfig::Etcd(ec) = &moving.store else {
        panic!("etcd")
    };
    let check = ec.check.as_ref().unwrap();
    assert_eq!(check.role, crate::config::CheckRole::Next);
    assert_eq!(check.shards.len(), 2);
    assert_eq!(check.home.as_ref().unwrap().default, 0);
}
