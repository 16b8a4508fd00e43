//! Probe tests of host-test's own semantics: each runs a probe module and
//! checks the host answers as Envoy 1.40 does. One binary, a module per area.

mod basics;
mod bodies;
mod grpc;
mod origin;
mod replies;
mod runtime;
mod shared_data;

use host_test::{Envoy, EnvoyBuilder, Response};
use serde_json::Value;

pub fn probe_builder() -> EnvoyBuilder {
    Envoy::builder(host_test::dist("shared_data_probe.wasm")).vm_id("probe")
}

pub fn probe(workers: usize) -> Envoy {
    probe_builder().workers(workers).build().unwrap()
}

pub fn json(resp: &Response) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("probe reply is not JSON ({e}): {}", resp.body_str()))
}
