//! The operator API in real Envoy: the data plane and an admin listener share one
//! `vm_id` (envoy/configs/admin-api.yaml); records are looked up, removed (then the key
//! runs again), claims removed only with force; the admin role refuses data-plane
//! traffic and the data plane never answers admin paths. `dedupctl` is run for real.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::paths::config_file;
use dedup_envoy::{EnvoyConfig, Request, Response};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

const DATA: &str = r#"{"scope": {"headers": ["x-tenant"]}}"#;
const ADMIN: &str = r#"{"role": "admin", "scope": {"headers": ["x-tenant"]}}"#;
const HOST: &str = "orders.example";

fn stack(name: &str) -> (Stack, SocketAddr) {
    stack_with(name, DATA)
}

fn stack_with(name: &str, data: &str) -> (Stack, SocketAddr) {
    let s = Stack::start_with(name, |port, wasm| {
        EnvoyConfig::from_template(&config_file("admin-api.yaml"), port, wasm, data)
            .unwrap()
            .with_port("ADMIN_API_PORT")
            .unwrap()
            .with_var("ADMIN_FILTER_CONFIG", ADMIN)
    });
    let port = s.envoy.config.port("ADMIN_API_PORT").unwrap();
    (s, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn order(key: &str, tenant: &str) -> Request {
    post("/orders/admin", key, &json!({"item": "lamp"}))
        .host(HOST)
        .header("x-tenant", tenant)
}

fn api(addr: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let r: Response = dedup_envoy::client::send(addr, &Request::new(method, path)).unwrap();
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

fn records(key: &str, tenant: &str) -> String {
    format!("/records?key={key}&authority={HOST}&scope.x-tenant={tenant}")
}

#[test]
fn records_are_looked_up_purged_and_then_run_again() {
    let (s, admin) = stack("admin-purge");
    let first = s.send(&order("a-1", "acme"));
    assert_executed(&first);
    let (status, v) = api(admin, "GET", &records("a-1", "acme"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "completed");
    assert_eq!(v["status"], first.status);
    assert_eq!(v["body_bytes"], first.body.len());
    // Another tenant, another record.
    assert_eq!(api(admin, "GET", &records("a-1", "globex")).0, 404);
    let (status, v) = api(admin, "DELETE", &records("a-1", "acme"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["removed"]["state"], "completed");
    assert_eq!(api(admin, "GET", &records("a-1", "acme")).0, 404);
    // Purged: the retry executes again.
    assert_executed(&s.send(&order("a-1", "acme")));
    assert_eq!(s.executions("/orders/admin"), 2);
    let (status, v) = api(admin, "GET", "/stats");
    assert_eq!(status, 200);
    assert_eq!(v["completed"], 1, "{v}");
    // The one stored response, within the default budget: 128 MiB, in which every one
    // of the 6,250 buckets can keep one 16 KiB response with 4 KiB of headers.
    let stored = v["stored_bytes"].as_u64().unwrap();
    assert!(stored > first.body.len() as u64, "{v}");
    assert_eq!(v["max_store_bytes"], 128 << 20, "{v}");
}

#[test]
fn a_claim_is_removed_only_with_force() {
    let (s, admin) = stack("admin-force");
    let slow = order("f-1", "acme").header("x-demo-delay-ms", "1500");
    std::thread::scope(|scope| {
        let held = scope.spawn(|| s.send(&slow));
        s.wait_executions("/orders/admin", 1, Duration::from_secs(5));
        let (status, v) = api(admin, "GET", &records("f-1", "acme"));
        assert_eq!(
            (status, v["state"].as_str()),
            (200, Some("in_flight")),
            "{v}"
        );
        let (status, v) = api(admin, "DELETE", &records("f-1", "acme"));
        assert_eq!(status, 409);
        assert_eq!(v["type"], "urn:proxy-dedup:problem:record-is-claim");
        let (status, _) = api(
            admin,
            "DELETE",
            &format!("{}&force=true", records("f-1", "acme")),
        );
        assert_eq!(status, 200);
        // The operator said so: the key runs again, even while the first still runs.
        assert_executed(&s.send(&order("f-1", "acme")));
        held.join().unwrap();
    });
    assert_eq!(s.executions("/orders/admin"), 2);
}

/// Router mode, defaults: the upstream executes, then its answer is lost (the client
/// hangs up, so Envoy resets the upstream request). The record is kept as an unknown
/// outcome: retries during and well after `in_flight_timeout_seconds` get `409
/// outcome-unknown` and never execute; the operator purges it (with `force`, having
/// checked the operation) and the key then runs.
#[test]
fn an_unknown_outcome_is_kept_past_the_in_flight_timeout_until_an_operator_purges_it() {
    let data = r#"{"scope": {"headers": ["x-tenant"]}, "in_flight_timeout_seconds": 2}"#;
    let (s, admin) = stack_with("admin-unknown", data);
    let req = order("u-1", "acme");
    s.hang_up(
        &req.clone().header("x-demo-delay-ms", "1200"),
        Duration::from_millis(300),
    );
    s.wait_executions("/orders/admin", 1, Duration::from_secs(5));
    // Until Envoy ends the first stream its record is in flight (409 in-flight);
    // from then on it is an unknown outcome.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let first_unknown = loop {
        let r = s.send(&req);
        assert_eq!(r.status, 409, "{}", r.summary());
        if String::from_utf8_lossy(&r.body).contains("outcome-unknown")
            || std::time::Instant::now() > deadline
        {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_problem(&first_unknown, 409, "outcome-unknown");
    assert!(first_unknown.header("retry-after").is_none());
    // Past the in-flight timeout (2 s) and past the first's upstream time: still kept.
    std::thread::sleep(Duration::from_millis(3000));
    for _ in 0..3 {
        assert_problem(&s.send(&req), 409, "outcome-unknown");
    }
    assert_eq!(s.executions("/orders/admin"), 1, "a retry ran again");
    let counters = s.envoy.dedup_counters().unwrap();
    assert!(counters["outcome_unknown"] >= 1, "{counters:?}");
    assert!(counters["rejected_outcome_unknown"] >= 4, "{counters:?}");
    let (status, v) = api(admin, "GET", &records("u-1", "acme"));
    assert_eq!((status, v["state"].as_str()), (200, Some("held")), "{v}");
    // It may have run: removing it needs force, as for any claim.
    let (status, v) = api(admin, "DELETE", &records("u-1", "acme"));
    assert_eq!(status, 409, "{v}");
    let forced = format!("{}&force=true", records("u-1", "acme"));
    assert_eq!(api(admin, "DELETE", &forced).0, 200);
    assert_executed(&s.send(&req));
    assert_eq!(s.executions("/orders/admin"), 2);
}

#[test]
fn the_admin_role_refuses_data_plane_traffic_and_the_data_plane_never_answers_admin_paths() {
    let (s, admin) = stack("admin-roles");
    let r = dedup_envoy::client::send(admin, &order("r-1", "acme")).unwrap();
    assert_problem(&r, 404, "not-admin-path");
    assert_eq!(s.executions("/orders/admin"), 0);
    assert_executed(&s.send(&order("r-1", "acme")));
    // On the data plane, /records is an ordinary path: it goes to the service.
    let r = s.send(&Request::get(&records("r-1", "acme")).host(HOST));
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    assert!(
        v.get("state").is_none(),
        "the data plane answered an admin path: {v}"
    );
    assert_eq!(
        r.header("content-type").map(|c| c.contains("problem")),
        Some(false)
    );
    // Bad admin requests name what is wrong.
    let (status, v) = api(admin, "GET", "/records?key=x");
    assert_eq!(status, 400);
    assert!(v["detail"].as_str().unwrap().contains("authority"), "{v}");
}

#[test]
fn dedupctl_gets_and_purges() {
    let (s, admin) = stack("admin-ctl");
    assert_executed(&s.send(&order("c-1", "acme")));
    let ctl = |args: &[&str]| dedupctl(admin, args);
    let target = [
        "--key",
        "c-1",
        "--authority",
        HOST,
        "--scope",
        "x-tenant=acme",
    ];
    let (code, out) = ctl(&[&["get"][..], &target].concat());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("completed") && out.contains("stored response 200"),
        "{out}"
    );
    let (code, out) = ctl(&[&["--json", "get"][..], &target].concat());
    assert_eq!(code, Some(0));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["state"],
        "completed"
    );
    let (code, out) = ctl(&[&["purge"][..], &target].concat());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("removed record"), "{out}");
    let (code, out) = ctl(&[&["purge"][..], &target].concat());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("No such record"), "{out}");
    let (code, out) = ctl(&["stats"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("completed: 0"), "{out}");
}
