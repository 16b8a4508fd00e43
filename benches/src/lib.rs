//! Benchmark cases: a module in `dist/`, its plugin configuration and the
//! request stream to send. `benches/per_request.rs` runs each in host-test
//! and reports its cost as a ratio to the empty filter.

use host_test::{EnvoyBuilder, Error, HostCalls, LogLevel, Reply, Request, SimEnvoy};
use std::path::PathBuf;

/// One benchmark case.
pub struct Case {
    pub name: &'static str,
    /// What the case measures, for the table and chart in BENCHMARKS.md.
    pub about: &'static str,
    /// File in `dist/`.
    pub wasm: &'static str,
    pub plugin_config: &'static str,
    pub allow_on_headers_stop_iteration: bool,
    /// The i-th request of the run.
    pub request: fn(u64) -> Request,
}

impl Case {
    pub fn path(&self) -> PathBuf {
        host_test::dist(self.wasm)
    }

    /// One worker, logging at warn (a per-request info line would grow the
    /// captured log without bound), upstream answering 201 with a small body.
    pub fn envoy(&self) -> Result<SimEnvoy, Error> {
        self.builder().build()
    }

    /// The builder [`Case::envoy`] builds.
    pub fn builder(&self) -> EnvoyBuilder {
        SimEnvoy::builder(self.path())
            .plugin_config(self.plugin_config)
            .vm_id(self.name)
            .allow_on_headers_stop_iteration(self.allow_on_headers_stop_iteration)
            .log_level(LogLevel::Warn)
            .upstream(|_| {
                Reply::new(201)
                    .header("content-type", "application/json")
                    .body(r#"{"id":"ord_1","status":"created"}"#)
            })
    }
}

fn order(i: u64) -> String {
    format!(r#"{{"order":{i},"sku":"A-1","qty":1}}"#)
}

/// A body of `size` bytes, distinct per `i` (so each is a first execution).
fn sized_body(i: u64, size: usize) -> Vec<u8> {
    let mut body = format!("{i:016}").into_bytes();
    body.resize(size, b'x');
    body
}

/// The baseline every ratio is computed against.
pub const BASELINE: Case = Case {
    name: "empty_filter",
    about: "empty filter (baseline), small JSON body",
    wasm: "empty_filter.wasm",
    plugin_config: "",
    allow_on_headers_stop_iteration: false,
    request: |i| {
        Request::post("/orders")
            .header("idempotency-key", &format!("k{i}"))
            .body(order(i))
    },
};

/// Host cost of a large body with a filter that does nothing: separates
/// host-test's own copying from the dedup filter's work at 64 KiB.
pub const BASELINE_64K: Case = Case {
    name: "empty_filter_64k",
    about: "empty filter, 64 KiB body (host cost of moving the body)",
    wasm: "empty_filter.wasm",
    plugin_config: "",
    allow_on_headers_stop_iteration: false,
    request: |i| Request::post("/events").body(sized_body(i, 64 * 1024)),
};

/// The dedup filter's cases; skipped when `dist/dedup_filter.wasm` is absent.
pub const DEDUP: &[Case] = &[
    Case {
        name: "dedup_first_execution",
        about: "dedup, first execution (claim, store the response)",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000}"#,
        allow_on_headers_stop_iteration: true,
        request: |i| {
            Request::post("/orders")
                .header("idempotency-key", &format!("k{i}"))
                .body(order(i))
        },
    },
    Case {
        name: "dedup_replay",
        about: "dedup, replay (one stored response)",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000}"#,
        allow_on_headers_stop_iteration: true,
        request: |_| {
            Request::post("/orders")
                .header("idempotency-key", "same-key")
                .body(order(0))
        },
    },
    Case {
        name: "dedup_bypassed_get",
        about: "dedup, a GET it does not deduplicate (bypassed)",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000}"#,
        allow_on_headers_stop_iteration: true,
        request: |i| Request::get(&format!("/orders/{i}")),
    },
    Case {
        name: "dedup_post_without_key",
        about: "dedup, a POST without a key (passes through)",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000}"#,
        allow_on_headers_stop_iteration: true,
        request: |i| Request::post("/orders").body(order(i)),
    },
    Case {
        name: "keyless_fingerprint_1k",
        about: "dedup keyless fingerprint, 1 KiB body",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000, "key": {"fingerprint": ["method", "path", "body"]}}"#,
        allow_on_headers_stop_iteration: true,
        request: |i| Request::post("/events").body(sized_body(i, 1024)),
    },
    Case {
        name: "keyless_fingerprint_64k",
        about: "dedup keyless fingerprint, 64 KiB body",
        wasm: "dedup_filter.wasm",
        plugin_config: r#"{"capacity": 10000000, "key": {"fingerprint": ["method", "path", "body"]}}"#,
        allow_on_headers_stop_iteration: true,
        request: |i| Request::post("/events").body(sized_body(i, 64 * 1024)),
    },
];

/// The host calls of `requests` requests of `case`, every import counted, after a first
/// request that is not counted (it loads the module's lazily built state and, for the
/// replay case, stores the response).
pub fn host_calls_of(case: &Case, requests: u64) -> Result<HostCalls, String> {
    let mut envoy: SimEnvoy = case
        .builder()
        .count_host_calls(true)
        .build()
        .map_err(|e| e.to_string())?;
    let first = envoy
        .request(0, (case.request)(u64::MAX))
        .map_err(|e| e.to_string())?;
    if first.status >= 500 {
        return Err(format!("first request answered {}", first.status));
    }
    envoy.reset_host_calls();
    for i in 0..requests {
        let r = envoy
            .request(0, (case.request)(i))
            .map_err(|e| e.to_string())?;
        if r.status >= 500 {
            return Err(format!("request {i} answered {}", r.status));
        }
    }
    Ok(envoy.host_calls())
}
