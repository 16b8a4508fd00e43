//! # host-test: a proxy-wasm host on wasmtime, faithful to Envoy
//!
//! Runs a compiled proxy-wasm HTTP filter (`wasm32-wasip1`, ABI 0.2.1, as
//! built with the Rust SDK 0.2.5) the way Envoy 1.40 runs it, so filter
//! behaviour can be tested without Envoy: N worker VMs sharing one
//! shared-data store and one set of metrics, the HTTP filter chain
//! (filter -> router -> upstream) with Envoy's buffering and pause rules,
//! local replies through the response callbacks, callouts to in-process or
//! loopback clusters, tick timers on a virtual clock, traps failing the VM.
//!
//! ```
//! use host_test::{SimEnvoy, Reply, Request};
//! use std::cell::Cell;
//! use std::rc::Rc;
//!
//! # fn main() -> Result<(), host_test::Error> {
//! let calls = Rc::new(Cell::new(0));
//! let seen = calls.clone();
//! let mut envoy = SimEnvoy::builder(host_test::dist("dedup_filter.wasm"))
//!     .workers(2)
//!     .plugin_config(r#"{"key": {"required": true}, "ttl_seconds": 60}"#)
//!     .vm_id("dedup")
//!     .allow_on_headers_stop_iteration(true)
//!     .upstream(move |req| {
//!         seen.set(seen.get() + 1);
//!         Reply::new(201).header("content-type", "application/json").body(req.body.clone())
//!     })
//!     .build()?;
//!
//! // Whole requests.
//! let first = envoy.request(0, Request::post("/orders").header("idempotency-key", "k1").body("{}"))?;
//! assert_eq!(first.status, 201);
//! assert!(first.upstream_called);
//!
//! // A race, step by step: the first request is held at the upstream while
//! // a duplicate arrives on the other worker.
//! let a = envoy.start(0, Request::post("/pay").header("idempotency-key", "k2").body("x"))?;
//! envoy.send_request(a)?;
//! assert!(envoy.upstream_request(a).is_some());
//! let dup = envoy.request(1, Request::post("/pay").header("idempotency-key", "k2").body("x"))?;
//! assert_eq!(dup.status, 409);
//! envoy.respond(a, Reply::new(200).body("paid"))?;
//! assert_eq!(envoy.response(a).map(|r| r.status), Some(200));
//!
//! // The next duplicate, on either worker, gets the stored answer.
//! let again = envoy.request(1, Request::post("/pay").header("idempotency-key", "k2").body("x"))?;
//! assert_eq!((again.status, again.body_str()), (200, "paid".to_string()));
//! assert!(!again.upstream_called);
//! assert_eq!(envoy.counter("proxy_dedup_replayed"), Some(1));
//! assert_eq!(calls.get(), 1); // k1; `a` was answered by hand
//!
//! // Time: ticks and timeouts fire as the virtual clock moves; past its TTL
//! // (here 60 s) the key is free again.
//! envoy.advance(std::time::Duration::from_secs(61));
//! let later = envoy.request(0, Request::post("/pay").header("idempotency-key", "k2").body("x"))?;
//! assert!(later.upstream_called);
//! # Ok(()) }
//! ```
//!
//! Fidelity notes (what Envoy does, and host-test with it):
//! - Pause from `on_request_headers` becomes StopAllIteration unless
//!   `allow_on_headers_stop_iteration(true)`: body callbacks are then
//!   withheld until the filter resumes; if it never does, driving the
//!   stream reports [`Error::Stalled`].
//! - Pause from a body callback buffers: the next callback sees the whole
//!   buffer; Continue forwards it. The upstream handler runs only once the
//!   whole request (headers, body, end of stream) has passed the filter.
//! - After Continue at headers, or after `proxy_continue_stream`, the
//!   request header map is gone: getters and setters return BadArgument
//!   (the SDK panics on it, the VM traps, the stream gets 503).
//! - A trap fails the worker's VM: its streams get 503 (or pass through
//!   with [`SimEnvoyBuilder::fail_open`]), other workers are unaffected.
//! - Shared data follows cpp-host exactly (see [`SimEnvoy::shared_data`]).
//! - Besides the workers, a main-thread VM (start, configure, ticks, no
//!   streams) and a short-lived copy configured before serving, as Envoy
//!   ([`SimEnvoyBuilder::main_thread_vm`], [`SimEnvoyBuilder::config_check`]).
//! - gRPC calls and streams against in-process handlers
//!   ([`SimEnvoyBuilder::grpc_cluster`]) or real HTTP/2 servers on loopback
//!   ([`SimEnvoyBuilder::grpc_cluster_addr`], [`GrpcServer`]), delivered on the
//!   root context with Envoy's statuses, messages, metadata and tokens;
//!   gRPC-aware local replies; header replace as remove + append; callouts
//!   outliving their stream; route, cluster and metadata properties
//!   ([`Value`]). Each is checked against real Envoy by
//!   `envoy/tests/probe_differential.rs` with the ABI probe.
//!
//! Known differences from Envoy (deliberate simplifications):
//! - Header values are strings (non-UTF-8 bytes are converted lossily).
//! - An upstream answers only once the whole request reached it; its body
//!   arrives in the chunks the [`Reply`] gives (default one chunk), the last
//!   one with end of stream. (Envoy 1.40 with an HTTP/1.1 upstream was seen
//!   to deliver the body without end of stream, then an empty end-of-stream
//!   call; local replies come in one end-of-stream call, as here.) Response
//!   trailers from the upstream are not modelled.
//! - Only the request buffer limit is modelled (413); the response buffer
//!   limit and watermark flow control (data held during StopAllIteration)
//!   are not.
//! - Envoy's router and codec headers on the main stream (`x-envoy-*`,
//!   `date`, `server`) are not added (callouts do carry Envoy's);
//!   requests carry `x-forwarded-proto` and a deterministic `x-request-id`. Local replies carry `:status`, the filter's headers,
//!   and for a non-empty body `content-length` and `content-type: text/plain`.
//! - Properties: `request.{path,url_path,query,method,host,scheme,id,protocol,headers}`,
//!   `response.{code,code_details,flags,headers}`, `upstream.address`,
//!   `source.{address,port}`, `destination.address`, `plugin_name`,
//!   `plugin_root_id`, `plugin_vm_id` and values set with
//!   `proxy_set_property`; anything else is NotFound.
//! - Envoy answers "no healthy upstream", "overflow" or a later filter's
//!   local reply as soon as the request headers pass the filter; host-test
//!   asks the upstream handler (whose [`Reply`] decides) only once the
//!   whole request passed the filter. For a filter that holds the request
//!   until its end (as the dedup filter does) the two are the same.
//! - Foreign functions answer NotFound; `random_get` is deterministic per
//!   worker.
//! - Callouts to in-process clusters answer on the next event-loop turn and
//!   time out on the virtual clock; callouts over TCP block and time out in
//!   real time.
//! - A failed VM stays failed (no FAIL_RELOAD); root contexts get no
//!   `on_done` at shutdown.
//!
//! ## Response origin
//!
//! What a filter reads of where a response came from, at response headers,
//! in the body callbacks and in `on_log`, as Envoy 1.40 serves it (observed
//! with the probe filter in real Envoy, `host-test/probes/envoy_origin.py`;
//! full table with the raw values in `host-test/PROBES.md`).
//! `response.flags` is an `i64` (8 little-endian bytes): Envoy's legacy
//! response-flag bitmask, bit i = `CoreResponseFlag` i ([`response_flags`]);
//! it is readable in every stream callback (0 until set).
//! `response.code` is an `i64` too; `response.code_details` and
//! `upstream.address` are strings. "-" below: NotFound.
//!
//! | Case (host-test) | status | `response.code_details` | flags | `upstream.address` |
//! |---|---|---|---|---|
//! | request headers, before any response | - | - | 0 | - |
//! | upstream answer, any status ([`Reply::new`]) | its own | `via_upstream` | 0 | host |
//! | 5xx with router retries exhausted (`Reply::new(503).with_flags(URX)`) | 503 | `via_upstream` | URX (32768) | host |
//! | connection refused ([`Reply::connect_failure`]) | 503 | `upstream_reset_before_response_started{remote_connection_failure\|delayed_connect_error:_Connection_refused}` | UF (32) | host |
//! | same after connect-failure retries (`.with_flags(URX)`) | 503 | same | UF,URX (32800) | host |
//! | route timeout ([`Reply::no_answer`]) | 504 | `response_timeout` | UT (4) | host |
//! | route timeout after the headers ([`Reply::no_answer_after_headers`]) | its own, then reset | headers/body: `via_upstream`; on_log: `response_timeout` | on_log: UT (4) | host |
//! | upstream closes/resets before any response ([`Reply::reset`]) | 503 | `upstream_reset_before_response_started{connection_termination}` | UC (64) | host |
//! | upstream closes/resets mid-body ([`Reply::reset_after_headers`]) | its own, then reset | headers/body: `via_upstream`; on_log: `upstream_reset_after_response_started{protocol_error}` | on_log: UPE (8388608) | host |
//! | client gone while the upstream works ([`SimEnvoy::reset_client`]) | no response callbacks | on_log: `downstream_remote_disconnect` | DC (16384) | host |
//! | client gone mid-body | as sent | on_log: `downstream_remote_disconnect` | DC (16384) | host |
//! | client gone while the filter holds the request | - | on_log: `downstream_remote_disconnect` | DC (16384) | - |
//! | no healthy upstream ([`Reply::no_healthy_upstream`]) | 503 | `no_healthy_upstream` | UH (2) | - |
//! | circuit breaker open ([`Reply::overflow`]) | 503 | `upstream_reset_before_response_started{overflow}` | UO (128) | - |
//! | local rate limit after the filter ([`Reply::rate_limited`]) | 429 | `local_rate_limited` | RL (2048) | - |
//! | `direct_response` route ([`Reply::direct_response`]) | its own | `direct_response` | 0 | - |
//! | no route (`Reply::local(404, "route_not_found", NR)`) | 404 | `route_not_found` | NR (256) | - |
//! | unknown cluster (`Reply::local(503, "cluster_not_found", NC)`) | 503 | `cluster_not_found` | NC (16777216) | - |
//! | request over the buffer limit while the filter buffers (after Continue at headers) | 413 | `request_payload_too_large` | 0 | host |
//! | the filter's own local reply | its own | the details it passed (whitespace -> `_`; the SDK's `send_http_response` passes none: empty string) | 0 | - (or host if already picked) |
//!
//! `response.code` is the status Envoy recorded (the upstream's, or the
//! local reply's), also readable in body callbacks and kept in `on_log`
//! after a reset mid-body; NotFound when no response started. The values
//! at the end of a stream are also in [`Response::code_details`],
//! [`Response::response_flags`] and [`Response::upstream_address`].

mod abi;
mod callout;
mod envoy;
mod error;
mod grpc;
mod h2;
mod hostcalls;
mod http;
mod origin;
mod shared;
mod state;
mod value;
mod vm;

pub use abi::{LogLevel, MetricKind, Status};
pub use callout::Handler;
pub use envoy::{EnvoyBuilder, SimEnvoy, StreamState};
pub use error::Error;
pub use grpc::{grpc_status, GrpcReply, GrpcRequest, GrpcServer};
pub use http::{Headers, Reply, Request, Response, StreamId, UpstreamRequest};
pub use origin::{code_details, response_flags};
pub use shared::{Faults, LogLine, Metric};
pub use state::HostCalls;
pub use value::Value;
pub use vm::module_imports;

use std::path::PathBuf;

/// Path of a module in the workspace's `dist/` (where `make wasm` puts them).
pub fn dist(file: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist")).join(file)
}
