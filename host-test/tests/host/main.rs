//! Probe tests of host-test's own semantics: each runs a probe module and
//! checks the host answers as Envoy 1.40 does. One binary, a module per area.

mod basics;
mod bodies;
mod grpc;
mod origin;
mod replies;
mod runtime;
mod shared_data;

use host_test::{EnvoyBuilder, Reply, Request, Response, SimEnvoy};
use serde_json::Value;

pub fn probe_builder() -> EnvoyBuilder {
    SimEnvoy::builder(host_test::dist("shared_data_probe.wasm")).vm_id("probe")
}

pub fn probe(workers: usize) -> SimEnvoy {
    probe_builder().workers(workers).build().unwrap()
}

pub fn json(resp: &Response) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("probe reply is not JSON ({e}): {}", resp.body_str()))
}

/// A one-worker probe whose upstream answers every request with `reply`.
pub fn answering(reply: Reply) -> SimEnvoy {
    probe_builder()
        .upstream(move |_| reply.clone())
        .build()
        .unwrap()
}

/// `req` with `headers` added.
pub fn with_headers(req: Request, headers: &[(&str, &str)]) -> Request {
    headers.iter().fold(req, |req, (k, v)| req.header(k, v))
}

/// GET / naming its probe in `x-probe`, with `headers` besides.
pub fn get_probe(probe: &str, headers: &[(&str, &str)]) -> Request {
    with_headers(Request::get("/").header("x-probe", probe), headers)
}

/// `request` on `worker`, the probe's reply as JSON.
pub fn ask(envoy: &mut SimEnvoy, worker: usize, request: Request) -> Value {
    json(&envoy.request(worker, request).unwrap())
}

/// The error `builder` is refused with.
pub fn build_error(builder: EnvoyBuilder) -> host_test::Error {
    match builder.build() {
        Ok(_) => panic!("expected the build to fail"),
        Err(e) => e,
    }
}
