//! The host as `dedup_core`'s worker sees it (`AbiHost`: shared data, clock, logs,
//! metrics, randomness, tick, queues), and the store calls a stream asks for, sent
//! through Envoy the way their route says (`dispatch`) and read back
//! (`read_call_answer`).

use crate::abi;
use dedup_core::shared_data::{HostFault, SetError, SharedData};
use dedup_core::stream::{CallAnswer, StoreCall, Transport};
use dedup_core::worker::{Host, Level};
use std::time::Duration;

/// The host as `dedup_core`'s worker sees it: every method one host call (or none).
pub(crate) struct AbiHost;

impl SharedData for AbiHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        abi::HostSharedData.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        abi::HostSharedData.set(key, value, cas)
    }
}

impl Host for AbiHost {
    fn now_ms(&self) -> u64 {
        abi::now_ms()
    }

    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Debug => abi::LOG_DEBUG,
            Level::Info => abi::LOG_INFO,
            Level::Warn => abi::LOG_WARN,
            Level::Error => abi::LOG_ERROR,
        };
        abi::log(level, message);
    }

    fn debug_enabled(&self) -> bool {
        abi::log_level() <= abi::LOG_DEBUG
    }

    fn define_counter(&self, name: &str) -> Result<u32, u32> {
        abi::define_counter(name)
    }

    fn define_histogram(&self, name: &str) -> Result<u32, u32> {
        abi::define_histogram(name)
    }

    fn increment(&self, metric: u32) {
        abi::increment(metric);
    }

    fn add(&self, metric: u32, n: u64) {
        abi::add(metric, n);
    }

    fn record(&self, metric: u32, value: u64) {
        abi::record(metric, value);
    }

    fn random_bytes(&self) -> Result<[u8; 32], u16> {
        abi::random_bytes::<32>()
    }

    /// A random seed from WASI `random_get` (std's RandomState draws its keys from it).
    fn random_seed(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(abi::now_ms());
        h.finish()
    }

    fn set_tick_period(&self, period_ms: u32) -> Result<(), u32> {
        abi::set_tick_period(period_ms)
    }

    fn register_queue(&self, name: &str) -> Result<u32, u32> {
        abi::register_shared_queue(name)
    }

    fn enqueue(&self, queue: u32, item: &[u8]) -> Result<(), u32> {
        abi::enqueue_shared_queue(queue, item)
    }

    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32> {
        abi::dequeue_shared_queue(queue)
    }

    fn dispatch(&self, call: &StoreCall) -> Result<u32, CallAnswer> {
        dispatch(call)
    }
}

/// A call that got no answer (not dispatched, reset): the stream treats it as a
/// transport failure.
pub(crate) fn no_answer() -> CallAnswer {
    CallAnswer {
        status: 0,
        body: Vec::new(),
        ..Default::default()
    }
}

/// Sends a store call the way its route says: a unary gRPC call of the method its path
/// names (`/service/method`), or an HTTP POST. `Err` carries the answer to give the
/// stream when the call could not even be dispatched.
pub(crate) fn dispatch(call: &StoreCall) -> Result<u32, CallAnswer> {
    let timeout = Duration::from_millis(call.timeout_ms);
    let cluster = &call.route.cluster;
    match &call.route.transport {
        Transport::Grpc { upstream } => {
            let Some((service, method)) = call.grpc_method() else {
                return Err(no_answer());
            };
            crate::context::dispatched(abi::dispatch_grpc_call(
                upstream, service, method, &call.body, timeout,
            ))
            .map_err(|status| {
                abi::log(
                    abi::LOG_WARN,
                    &format!(
                        "proxy-dedup: cannot call cluster `{cluster}` over gRPC: status {status}"
                    ),
                );
                no_answer()
            })
        }
        Transport::Http { authority } => {
            let headers = [
                (":method", "POST"),
                (":path", call.path),
                (":authority", authority.as_str()),
                ("content-type", "application/json"),
            ];
            crate::context::dispatched(abi::dispatch_http_call(
                cluster,
                &headers,
                Some(&call.body),
                &[],
                timeout,
            ))
            .map_err(|status| {
                abi::log(
                    abi::LOG_WARN,
                    &format!("proxy-dedup: cannot call cluster `{cluster}`: status {status}"),
                );
                no_answer()
            })
        }
    }
}
