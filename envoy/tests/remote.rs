//! Envoy loads the module over HTTP (`vm_config.code.remote`,
//! envoy/configs/remote-module.yaml) from a file server on loopback, checks
//! its SHA-256, and serves the filter; a module whose hash differs is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::config::REMOTE_MODULE;
use dedup_envoy::files::FileServer;
use dedup_envoy::oci::sha256_hex;
use dedup_envoy::paths::{config_file, dedup_wasm, empty_wasm, scratch_dir};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request};
use serde_json::json;
use std::time::{Duration, Instant};

const MODULE_PATH: &str = "/dedup_filter.wasm";
const CONFIG: &str = r#"{"key": {"required": true}}"#;

fn read(path: std::path::PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dedup_module() -> Vec<u8> {
    read(dedup_wasm().unwrap_or_else(|e| panic!("{e}")))
}

/// Wait until Envoy's log has `needle` (the fetch runs while the listener
/// initialises; its outcome is logged by then, but give it a moment).
fn wait_log(envoy: &EnvoyProcess, needle: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while !envoy.log().contains(needle) {
        assert!(
            Instant::now() < end,
            "no {needle:?} in Envoy's log:\n{}",
            envoy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn envoy_fetches_the_module_checks_its_sha256_and_deduplicates() {
    let module = dedup_module();
    let sha = sha256_hex(&module);
    let files = FileServer::start([(MODULE_PATH.to_string(), module)]).unwrap();
    let s = Stack::start_with("remote-ok", |port, _| {
        EnvoyConfig::remote_module(port, files.port(), &sha, CONFIG).unwrap()
    });
    // Fetched once, while the listener initialised (before /ready said LIVE).
    assert_eq!(files.gets(MODULE_PATH), 1);
    let path = "/orders/remote";
    let req = post(path, "remote-1", &json!({"item": "book"}));
    let first = s.send(&req);
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    assert_problem(
        &s.send(&Request::post(path).json(&json!({}))),
        400,
        "missing-key",
    );
    assert_eq!(s.executions(path), 1);
    assert_eq!(s.counter("replayed"), 1);
    // Two workers, and still one fetch: the code is shared by hash.
    assert_eq!(files.gets(MODULE_PATH), 1);
}

/// Another module at the URL (here the do-nothing filter, as a tampered or
/// stale file would be): Envoy fetches it 1 + `num_retries` (2) times, logs
/// that the plugin failed to load, and, as `failure_policy: FAIL_CLOSED`
/// says, answers every request 503 without reaching the service.
#[test]
fn a_module_whose_sha256_differs_is_refused_and_requests_fail_closed() {
    let sha = sha256_hex(&dedup_module());
    let other = read(empty_wasm().unwrap_or_else(|e| panic!("{e}")));
    assert_ne!(sha256_hex(&other), sha);
    let files = FileServer::start([(MODULE_PATH.to_string(), other)]).unwrap();
    let s = Stack::start_with("remote-bad-hash", |port, _| {
        EnvoyConfig::remote_module(port, files.port(), &sha, CONFIG).unwrap()
    });
    wait_log(&s.envoy, "Plugin proxy_dedup failed to load");
    assert_eq!(files.gets(MODULE_PATH), 3, "1 fetch + num_retries: 2");
    let path = "/orders/remote-refused";
    for i in 0..3 {
        let r = s.send(&post(path, "refused", &json!({"i": i})));
        assert_eq!(r.status, 503, "{}", r.summary());
    }
    assert_eq!(s.executions(path), 0, "a request passed the refused filter");
    assert!(
        s.envoy.dedup_counters().unwrap().is_empty(),
        "filter metrics exist: the module ran"
    );
}

/// A server that answers 404 is refused the same way; under
/// `failure_policy: FAIL_OPEN` Envoy then serves every request without the
/// filter, so duplicates reach the service. This is why the template says
/// FAIL_CLOSED (docs/src/deployment/remote.md).
#[test]
fn with_fail_open_a_module_not_found_lets_duplicates_through() {
    let sha = sha256_hex(&dedup_module());
    let files = FileServer::start(Vec::new()).unwrap();
    let template = std::fs::read_to_string(config_file(REMOTE_MODULE)).unwrap();
    let policy = "failure_policy: FAIL_CLOSED";
    assert!(template.contains(policy));
    let dir = scratch_dir("remote-fail-open-template").unwrap();
    let open_template = dir.join(REMOTE_MODULE);
    std::fs::write(
        &open_template,
        template.replace(policy, "failure_policy: FAIL_OPEN"),
    )
    .unwrap();
    let upstream = DemoUpstream::start(0, false).unwrap();
    let mut cfg = EnvoyConfig::remote_module(upstream.port(), files.port(), &sha, CONFIG).unwrap();
    cfg.template = open_template;
    let envoy = EnvoyProcess::start("remote-fail-open", cfg).unwrap();
    wait_log(&envoy, "Plugin proxy_dedup failed to load");
    assert_eq!(files.gets(MODULE_PATH), 3, "1 fetch + num_retries: 2");
    let path = "/orders/remote-open";
    let req = post(path, "open-1", &json!({"x": 1}));
    for _ in 0..2 {
        let r = envoy.send(&req).unwrap();
        assert_eq!(r.status, 200, "{}", r.summary());
    }
    assert_eq!(upstream.executions_for_path(path), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
