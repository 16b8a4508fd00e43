//! The host as `dedup_core` sees it (`WasmEnv`: shared data, clock, counters, logs, the
//! per-VM lease cache, tier and waiters), and the store calls a stream asks for, sent
//! through Envoy (`dispatch`) and read back (`read_call_answer`).

use crate::abi;
use crate::WorkerState;
use dedup_core::etcd::LeaseCache;
use dedup_core::etcdpb;
use dedup_core::local::LocalTier;
use dedup_core::store::{HostFault, SetError, SharedData};
use dedup_core::stream::{CallAnswer, StoreCall, Transport};
use dedup_core::wait::Waiters;
use dedup_core::{Counter, DedupStream, Env};
use std::time::Duration;

/// The host as `dedup_core` sees it.
pub(crate) struct WasmEnv<'a> {
    pub(crate) shared: &'a WorkerState,
    pub(crate) leases: &'a mut LeaseCache,
    pub(crate) local: &'a mut LocalTier,
    pub(crate) waiters: &'a mut Waiters,
}

impl SharedData for WasmEnv<'_> {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        abi::HostSharedData.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        abi::HostSharedData.set(key, value, cas)
    }
}

impl Env for WasmEnv<'_> {
    fn now_ms(&self) -> u64 {
        abi::now_ms()
    }

    fn new_token(&mut self) -> u64 {
        let n = self.shared.token_counter.get().wrapping_add(1);
        self.shared.token_counter.set(n);
        splitmix64(self.shared.token_seed ^ n)
    }

    fn count(&mut self, counter: Counter) {
        if let Some(Some(id)) = self.shared.metrics.get(counter.index()) {
            abi::increment(*id);
        }
    }

    fn debug(&self, message: std::fmt::Arguments<'_>) {
        if abi::log_level() <= abi::LOG_DEBUG {
            abi::log(abi::LOG_DEBUG, &message.to_string());
        }
    }

    fn warn(&self, message: &str) {
        abi::log(abi::LOG_WARN, message);
    }

    fn leases(&mut self) -> &mut LeaseCache {
        self.leases
    }

    fn local(&mut self) -> &mut LocalTier {
        self.local
    }

    fn waiters(&mut self) -> &mut Waiters {
        self.waiters
    }

    fn wake_waiters(&mut self, digest: &dedup_core::key::Digest) {
        crate::waiting::wake_everywhere(self.shared, digest);
    }
}

pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Runs `f` with the host environment (the per-VM lease cache and tier borrowed for the
/// duration of the call).
pub(crate) fn with_env<R>(
    shared: &WorkerState,
    stream: &mut DedupStream,
    f: impl FnOnce(&mut DedupStream, &WorkerState, &mut WasmEnv) -> R,
) -> Option<R> {
    let result = {
        let mut leases = shared.leases.try_borrow_mut().ok()?;
        let mut local = shared.local.try_borrow_mut().ok()?;
        let mut waiters = shared.waiters.try_borrow_mut().ok()?;
        let mut env = WasmEnv {
            shared,
            leases: &mut leases,
            local: &mut local,
            waiters: &mut waiters,
        };
        f(stream, shared, &mut env)
    };
    crate::waiting::waiters_changed(shared);
    Some(result)
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
            let Some((service, method)) = etcdpb::split_method(call.path) else {
                return Err(no_answer());
            };
            abi::dispatch_grpc_call(upstream, service, method, &call.body, timeout).map_err(
                |status| {
                    abi::log(
                        abi::LOG_WARN,
                        &format!(
                            "proxy-dedup: cannot call cluster `{cluster}` over gRPC: status {status}"
                        ),
                    );
                    no_answer()
                },
            )
        }
        Transport::Http { authority } => {
            let headers = [
                (":method", "POST"),
                (":path", call.path),
                (":authority", authority.as_str()),
                ("content-type", "application/json"),
            ];
            abi::dispatch_http_call(cluster, &headers, Some(&call.body), &[], timeout).map_err(
                |status| {
                    abi::log(
                        abi::LOG_WARN,
                        &format!("proxy-dedup: cannot call cluster `{cluster}`: status {status}"),
                    );
                    no_answer()
                },
            )
        }
    }
}

/// The answer to a store call, read while `on_http_call_response` runs. Envoy reports a
/// failed call (reset, no healthy member) as a response with no headers; a timeout as
/// :status 504.
pub(crate) fn read_call_answer(num_headers: usize, body_size: usize) -> CallAnswer {
    // The pairs are read anyway for `:status`; a detached call's answer needs them all.
    let headers = if num_headers == 0 {
        Vec::new()
    } else {
        abi::header_pairs(abi::MAP_HTTP_CALL_RESPONSE_HEADERS).unwrap_or_default()
    };
    let status = headers
        .iter()
        .find(|(n, _)| n == ":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
        .unwrap_or(0);
    let body = abi::buffer(abi::BUFFER_HTTP_CALL_RESPONSE_BODY, 0, body_size).unwrap_or_default();
    CallAnswer {
        status,
        body,
        headers,
    }
}
