//! Shared by the end-to-end tests: one real Envoy (2 workers) with the dedup
//! filter in front of an in-process demo upstream, on free loopback ports.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, Envoy, EnvoyConfig, Request, Response};
use serde_json::Value;
use std::time::{Duration, Instant};

pub struct Stack {
    // Envoy first: it is stopped before its upstream goes away.
    pub envoy: Envoy,
    pub upstream: DemoUpstream,
}

impl Stack {
    /// Envoy with `dist/dedup_filter.wasm` and `filter_config`. Panics (fails
    /// the test) with "run `make wasm`" when the module was not built.
    pub fn start(name: &str, filter_config: &str) -> Stack {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let config = EnvoyConfig::single_node(upstream.port(), &wasm, filter_config).unwrap();
        let envoy = Envoy::start(name, config).unwrap_or_else(|e| panic!("starting Envoy: {e}"));
        Stack { envoy, upstream }
    }

    pub fn send(&self, req: &Request) -> Response {
        self.envoy
            .send(req)
            .unwrap_or_else(|e| panic!("{} {}: {e}", req.method, req.path))
    }

    pub fn executions(&self, path: &str) -> u64 {
        self.upstream.executions_for_path(path)
    }

    /// Wait until the upstream has executed `n` requests to `path`.
    pub fn wait_executions(&self, path: &str, n: u64, limit: Duration) {
        let end = Instant::now() + limit;
        while self.executions(path) < n {
            assert!(
                Instant::now() < end,
                "upstream saw {} executions of {path}, waited for {n}",
                self.executions(path)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn counter(&self, short: &str) -> u64 {
        self.envoy
            .dedup_counter(short)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A JSON POST with an idempotency key.
pub fn post(path: &str, key: &str, body: &Value) -> Request {
    Request::post(path).key(key).json(body)
}

pub fn json(r: &Response) -> Value {
    r.json().unwrap_or_else(|e| panic!("{e}"))
}

/// Assert `r` is an RFC 9457 problem with this status and slug.
pub fn assert_problem(r: &Response, status: u16, slug: &str) {
    assert_eq!(
        r.status,
        status,
        "expected {status} {slug}, got {}",
        r.summary()
    );
    let ct = r.header("content-type").unwrap_or("");
    assert!(
        ct.starts_with("application/problem+json"),
        "problem content-type, got {ct:?}: {}",
        r.summary()
    );
    let p = json(r);
    assert_eq!(
        p["type"],
        format!("urn:proxy-dedup:problem:{slug}"),
        "problem type: {}",
        r.summary()
    );
    assert_eq!(p["status"], status, "problem status field: {}", r.summary());
    assert!(p["title"].is_string(), "problem title: {}", r.summary());
}

pub fn is_replayed(r: &Response) -> bool {
    r.header("idempotent-replayed") == Some("true")
}

pub fn assert_executed(r: &Response) {
    assert_eq!(r.status, 200, "expected an execution, got {}", r.summary());
    assert!(
        !is_replayed(r),
        "expected a fresh execution, got a replay: {}",
        r.summary()
    );
}

pub fn assert_replay_of(r: &Response, first: &Response) {
    assert_eq!(r.status, first.status, "replay status: {}", r.summary());
    assert!(
        is_replayed(r),
        "expected idempotent-replayed: true, got {}",
        r.summary()
    );
    assert_eq!(
        r.body, first.body,
        "replayed body differs from the first response"
    );
    assert_eq!(
        r.header("x-order-id"),
        first.header("x-order-id"),
        "replay keeps the upstream's headers"
    );
}
