//! Tenant isolation in a real Envoy (2 workers, shared data, one bucket: `capacity: 16`):
//! another tenant's flood of keys, or its clients that hang up, may make a request fail
//! (`503 store-full`), never make the victim's key run twice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::paths::config_file;
use dedup_envoy::{EnvoyConfig, Request};
use serde_json::json;
use std::time::Duration;

const ONE_BUCKET: &str = r#"{"scope": {"headers": ["x-tenant"]}, "capacity": 16}"#;

fn of(tenant: &str, path: &str, key: &str) -> Request {
    post(path, key, &json!({"amount": 5000})).header("x-tenant", tenant)
}

#[test]
fn another_tenants_flood_never_makes_the_victims_key_run_again() {
    let s = Stack::start("tenants-flood", ONE_BUCKET);
    let victim = of("victim", "/pay/victim", "pay-1");
    let first = s.send(&victim);
    assert_executed(&first);
    // Forty new keys of another tenant in the one bucket: they evict the flooder's own
    // records, never the victim's.
    for i in 0..40 {
        let r = s.send(&of("flood", "/pay/flood", &format!("f{i}")));
        assert_eq!(r.status, 200, "flood {i}: {}", r.summary());
    }
    assert!(
        s.counter("evictions_unexpired") > 0,
        "the flood evicted its own records"
    );
    assert_replay_of(&s.send(&victim), &first);
    assert_eq!(s.executions("/pay/victim"), 1, "the victim's key ran again");
}

#[test]
fn another_tenants_hung_up_claims_never_fill_the_victims_bucket() {
    let s = Stack::start("tenants-hang-ups", ONE_BUCKET);
    // Eight requests of the noisy tenant whose clients hang up while the upstream
    // works: kept as unknown outcomes, live claims of that tenant.
    for i in 0..8 {
        let slow = of("noisy", "/pay/noisy", &format!("h{i}")).header("x-demo-delay-ms", "1500");
        s.hang_up(&slow, Duration::from_millis(150));
    }
    s.wait_executions("/pay/noisy", 8, Duration::from_secs(5));
    s.envoy
        .wait_stat_at_least(
            "wasmcustom.proxy_dedup_outcome_unknown",
            8,
            Duration::from_secs(8),
        )
        .unwrap();
    // The noisy tenant's ninth claim in the bucket is refused: nothing runs unrecorded.
    let ninth = s.send(&of("noisy", "/pay/noisy", "h8"));
    assert_problem(&ninth, 503, "store-full");
    assert!(ninth.header("retry-after").is_some());
    assert_eq!(s.counter("failed_open"), 0);
    // The victim still claims, runs once, and its retry is a replay.
    let victim = of("victim", "/pay/victim", "pay-2");
    let first = s.send(&victim);
    assert_executed(&first);
    assert_replay_of(&s.send(&victim), &first);
    assert_eq!(s.executions("/pay/victim"), 1);
    assert_eq!(
        s.executions("/pay/noisy"),
        8,
        "the ninth never reached the upstream"
    );
}

/// The shipped template with a per-tenant rate limit in front of the filter: a tenant
/// that floods keys gets 429 from Envoy before it claims anything; another tenant is
/// untouched and its retry replays.
#[test]
fn the_per_tenant_rate_limit_template_stops_a_flood_before_the_store() {
    let s = Stack::start_with("tenants-ratelimit", |port, wasm| {
        let config = r#"{"scope": {"headers": ["x-tenant"]}, "capacity": 2048}"#;
        EnvoyConfig::from_template(&config_file("tenant-ratelimit.yaml"), port, wasm, config)
            .unwrap()
    });
    let mut limited = 0;
    for i in 0..80 {
        let r = s.send(&of("flood", "/pay/flood", &format!("f{i}")));
        match r.status {
            200 => {}
            429 => limited += 1,
            other => panic!("flood {i}: {other} {}", r.summary()),
        }
    }
    assert!(limited > 0, "the flood was never rate limited");
    assert!(
        s.executions("/pay/flood") <= 80 - limited,
        "a rate-limited request reached the upstream"
    );
    let victim = of("victim", "/pay/victim", "pay-3");
    let first = s.send(&victim);
    assert_executed(&first);
    assert_replay_of(&s.send(&victim), &first);
}
