//! proxy-dedup in real Envoy: harness for the end-to-end tests, the demo and the load benchmark.
//!
//! Everything listens and connects on 127.0.0.1 only. Child processes (Envoy,
//! wrk) are killed on drop and, should the harness itself die, by the kernel
//! (`PR_SET_PDEATHSIG`).

pub mod accept;
pub mod bench;
pub mod chaos;
pub mod chart;
pub mod client;
pub mod config;
pub mod envoy;
pub mod envoy_filter;
pub mod error;
pub mod etcd;
pub mod etcd_grpc;
pub mod files;
pub mod http;
pub mod oci;
pub mod paths;
pub mod ports;
pub mod process;
pub mod registry;
pub mod relay;
pub mod signals;
pub mod upstream;

pub use client::{problem_type, Request, Response};
pub use config::EnvoyConfig;
pub use envoy::EnvoyProcess;
pub use error::{Error, Result};
pub use upstream::DemoUpstream;
