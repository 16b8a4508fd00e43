//! Shared-data CAS rules, as observed in Envoy 1.40 (see the project notes).

use crate::*;
use host_test::{Faults, Request, Status};
use serde_json::Value;

fn run(envoy: &mut host_test::SimEnvoy, worker: usize, probe: &str, key: &str) -> Vec<Value> {
    let resp = envoy
        .request(
            worker,
            Request::get("/sd")
                .header("x-probe", probe)
                .header("x-key", key),
        )
        .unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert!(!resp.upstream_called);
    json(&resp)["results"].as_array().unwrap().clone()
}

/// The probe's `sd` script `ops` (`set k v cas; get k; ...`) on `worker`: its results.
fn ops(envoy: &mut host_test::SimEnvoy, worker: usize, ops: &str) -> Vec<Value> {
    let j = ask(envoy, worker, get_probe("sd", &[("x-ops", ops)]));
    j["results"].as_array().unwrap().clone()
}

fn statuses(results: &[Value]) -> Vec<String> {
    results
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn absent_key_ignores_cas_max() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "cas-absent-max", "t1");
    assert_eq!(statuses(&r), ["Ok", "Ok"]);
    assert_eq!(r[1]["value"], "a");
}

#[test]
fn absent_key_ignores_any_cas() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "absent-stale-cas", "t1");
    assert_eq!(statuses(&r), ["Ok", "Ok"]);
}

#[test]
fn present_key_with_cas_max_is_a_mismatch() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "cas-present-max", "t1");
    assert_eq!(statuses(&r), ["Ok", "CasMismatch", "Ok"]);
    assert_eq!(r[2]["value"], "a", "the mismatched write must not land");
}

#[test]
fn remove_leaves_a_tombstone_that_still_exists() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "remove", "t1");
    assert_eq!(statuses(&r), ["Ok", "Ok", "Ok"]);
    assert_eq!(r[2]["value"], Value::Null, "empty value reads as None");
    assert!(
        r[2]["cas"].as_u64().unwrap() > 0,
        "but with a cas: {:?}",
        r[2]
    );
    assert_eq!(envoy.shared_data_len(), 1);
    assert_eq!(envoy.shared_data("t1/remove").unwrap().0, b"");

    let r = run(&mut envoy, 0, "tombstone-max", "t2");
    assert_eq!(statuses(&r), ["Ok", "Ok", "CasMismatch", "Ok"]);
}

#[test]
fn cas_zero_overwrites_and_stale_cas_is_rejected() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "cas-zero-overwrites", "t1");
    assert_eq!(statuses(&r), ["Ok", "Ok", "Ok"]);
    assert_eq!(r[2]["value"], "b");

    let r = run(&mut envoy, 0, "stale-cas", "t2");
    assert_eq!(statuses(&r), ["Ok", "Ok", "Ok", "CasMismatch", "Ok"]);
    assert_eq!(r[4]["value"], "b");

    let r = run(&mut envoy, 0, "fresh-cas", "t3");
    assert_eq!(statuses(&r), ["Ok", "Ok", "Ok", "Ok"]);
    assert_eq!(r[3]["value"], "b");
}

#[test]
fn missing_key_is_not_found() {
    let mut envoy = probe(1);
    let r = run(&mut envoy, 0, "absent-get", "t1");
    assert_eq!(statuses(&r), ["NotFound"]);
    assert_eq!(r[0]["cas"], Value::Null);
}

#[test]
fn one_cas_counter_for_all_keys_and_workers() {
    let mut envoy = probe(2);
    let script = "set a 1 0; get a; set b 1 0; get b; set a 2 0; get a";
    let r = ops(&mut envoy, 0, script);
    let cas = |i: usize| r[i]["cas"].as_u64().unwrap();
    assert!(cas(1) < cas(3) && cas(3) < cas(5), "{r:?}");
    assert_eq!(cas(3), cas(1) + 1, "one counter across keys");

    // The other worker sees the same store and the same counter.
    let r2 = ops(&mut envoy, 1, "get a; set c 1 0; get c");
    assert_eq!(r2[0]["value"], "2");
    assert_eq!(r2[0]["cas"].as_u64().unwrap(), cas(5));
    assert_eq!(r2[2]["cas"].as_u64().unwrap(), cas(5) + 1);
}

#[test]
fn stores_are_scoped_by_vm_id() {
    let mut a = probe_builder().vm_id("a").build().unwrap();
    ops(&mut a, 0, "set k v 0");
    assert_eq!(a.shared_data_len(), 1);
    assert_eq!(a.shared_data_len_for("a"), 1);
    assert_eq!(a.shared_data_len_for("b"), 0);
    // A second Envoy is another process: nothing shared.
    let mut b = probe_builder().vm_id("a").build().unwrap();
    let r = run(&mut b, 0, "absent-get", "k");
    assert_eq!(statuses(&r), ["NotFound"]);
}

#[test]
fn fault_switch_fails_get_and_set() {
    let mut envoy = probe(1);
    envoy.put_shared_data("k", b"v");
    envoy.set_faults(Faults::shared_data(Status::InternalFailure));
    let r = ops(&mut envoy, 0, "get k; set k w 0");
    assert_eq!(statuses(&r), ["InternalFailure", "InternalFailure"]);
    assert_eq!(r[0]["status_code"], 10);

    envoy.set_faults(Faults {
        shared_data_set: Some(Status::InternalFailure),
        ..Faults::default()
    });
    let r = ops(&mut envoy, 0, "get k; set k w 0");
    assert_eq!(statuses(&r), ["Ok", "InternalFailure"]);

    envoy.set_faults(Faults::default());
    assert_eq!(envoy.shared_data("k").unwrap().0, b"v");
}
