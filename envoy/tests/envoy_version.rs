//! The Envoy the suites run is the one asked for: `make test-compat` points
//! `ENVOY_BIN` at an older Envoy and sets `ENVOY_EXPECT_VERSION`; a compat
//! run that silently ran the newest Envoy would prove nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::envoy::{envoy_binary, parse_version, version};
use serde_json::json;

/// The oldest Envoy release line the README lists as supported.
const OLDEST_SUPPORTED: (u32, u32) = (1, 36);

fn major_minor(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

#[test]
fn the_running_envoy_is_the_one_asked_for_and_serves_the_filter() {
    let s = Stack::start("envoy-version", "{}");
    let info = json(&s.envoy.admin("/server_info").unwrap());
    let running = parse_version(info["version"].as_str().unwrap())
        .unwrap_or_else(|| panic!("no version in /server_info: {}", info["version"]));
    assert_eq!(
        running,
        version().unwrap(),
        "the running Envoy is not {} (ENVOY_BIN)",
        envoy_binary()
    );
    match std::env::var("ENVOY_EXPECT_VERSION") {
        Ok(want) => assert_eq!(running, want, "ENVOY_BIN={}", envoy_binary()),
        Err(_) => assert!(
            major_minor(&running) >= OLDEST_SUPPORTED,
            "Envoy {running} is older than the oldest supported 1.36"
        ),
    }
    // And the filter works in it.
    let req = post("/orders/version", "version-1", &json!({"v": 1}));
    let first = s.send(&req);
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    assert_eq!(s.executions("/orders/version"), 1);
    eprintln!("Envoy {running} from {}", envoy_binary());
}
