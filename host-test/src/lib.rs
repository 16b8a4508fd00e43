// host-test: a proxy-wasm host on wasmtime, faithful to Envoy. Its manual,
// the crate docs, is README.md (written once, there).
#![doc = include_str!("../README.md")]

mod abi;
mod callout;
mod envoy;
mod error;
mod grpc;
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

/// The simulated Envoy's earlier name, kept for one release so tests written against
/// it still build (with a warning that names the new one). See CHANGELOG.md.
#[deprecated(
    since = "0.1.0",
    note = "renamed `SimEnvoy` (the test kit's real Envoy process is `EnvoyProcess`)"
)]
pub type Envoy = SimEnvoy;
pub use error::Error;
pub use grpc::{grpc_status, GrpcReply, GrpcRequest, GrpcServer};
pub use http::{Headers, Reply, Request, Response, StreamId, UpstreamRequest};
pub use origin::{code_details, response_flags};
pub use shared::{Faults, LogLine, Metric};
pub use state::HostCalls;
pub use value::Value;
pub use vm::module_imports;

// The test kit's one HTTP/2 (host-test/h2), under the name the modules use.
use loopback_h2 as h2;
use std::path::PathBuf;

/// Path of a module in the workspace's `dist/` (where `make wasm` puts them).
pub fn dist(file: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist")).join(file)
}
