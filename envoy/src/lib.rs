//! proxy-dedup in real Envoy: harness for the end-to-end tests, the demo and the load benchmark.
//!
//! Everything listens and connects on 127.0.0.1 only. Child processes (Envoy,
//! wrk) are killed on drop and, should the harness itself die, by the kernel
//! (`PR_SET_PDEATHSIG`).

pub mod accept;
pub mod bench;
pub mod chaos;
pub mod chart;
pub mod config;
pub mod envoy;
pub mod etcd;
pub mod etcd_grpc;
pub mod files;
pub mod paths;
pub mod ports;
pub mod process;
pub mod regions;
pub mod registry;
pub mod relay;
pub mod signals;
pub mod upstream;

// Shared with the user-facing tools (envoy/tools, `dedup-tools`): the loopback
// HTTP/1.1 client and its framing, the error type, the filter's Envoy block and the
// OCI image, under the paths the test kit has always used.
pub use dedup_tools::{client, envoy_filter, error, fail, http, oci};

pub use client::{problem_type, Request, Response};
pub use config::EnvoyConfig;
pub use dedup_tools::{Error, Result};
pub use envoy::EnvoyProcess;
pub use upstream::DemoUpstream;
