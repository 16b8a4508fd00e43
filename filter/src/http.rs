//! The HTTP context: reads what Envoy offers, hands it to `DedupStream`, and carries out
//! the action it returns.

use crate::abi;
use crate::Shared;
use dedup_core::key::RequestHead;
use dedup_core::store::{HostFault, SetError, SharedData};
use dedup_core::{Action as Decision, Counter, DedupStream, Env};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

pub(crate) struct DedupHttp {
    shared: Option<Rc<Shared>>,
    stream: DedupStream,
    /// Request body bytes already handed to the stream (Envoy re-offers the whole
    /// buffered body on each callback while we pause).
    request_seen: usize,
}

/// The host as `dedup_core` sees it.
struct WasmEnv<'a> {
    shared: &'a Shared,
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

    fn debug(&self, message: &str) {
        if abi::log_level() <= abi::LOG_DEBUG {
            abi::log(abi::LOG_DEBUG, message);
        }
    }

    fn warn(&self, message: &str) {
        abi::log(abi::LOG_WARN, message);
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl DedupHttp {
    pub(crate) fn new(context_id: u32, shared: Option<Rc<Shared>>) -> Self {
        DedupHttp {
            shared,
            stream: DedupStream::new(context_id),
            request_seen: 0,
        }
    }

    /// Carries out a decision. A local reply is sent and the stream stays paused, as Envoy
    /// expects after `send_local_response`.
    fn apply(&self, decision: Decision) -> Action {
        match decision {
            Decision::Continue => Action::Continue,
            Decision::Pause => Action::Pause,
            Decision::Reply(r) => {
                if let Err(status) =
                    abi::send_local_response(r.status, r.details, &r.headers, &r.body)
                {
                    abi::log(
                        abi::LOG_ERROR,
                        &format!("proxy-dedup: send_local_response failed (status {status})"),
                    );
                }
                Action::Pause
            }
        }
    }
}

fn request_head() -> Option<RequestHead> {
    let pairs = abi::header_pairs(abi::MAP_REQUEST_HEADERS).ok()?;
    let mut head = RequestHead::default();
    for (name, value) in pairs {
        let value = String::from_utf8_lossy(&value).into_owned();
        match name.as_str() {
            ":method" => head.method = value,
            ":path" => head.path = value,
            n if n.starts_with(':') => {}
            _ => head.headers.push((name.to_ascii_lowercase(), value)),
        }
    }
    Some(head)
}

impl Context for DedupHttp {}

impl HttpContext for DedupHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let Some(head) = request_head() else {
            abi::log(
                abi::LOG_WARN,
                "proxy-dedup: cannot read request headers; passing through",
            );
            return Action::Continue;
        };
        let mut env = WasmEnv { shared: &shared };
        let d = self
            .stream
            .on_request_headers(&shared.plugin, &mut env, head, end_of_stream);
        self.apply(d)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !self.stream.reading_request() {
            return Action::Continue;
        }
        let start = if body_size >= self.request_seen {
            self.request_seen
        } else {
            0
        };
        let chunk = match abi::buffer(abi::BUFFER_REQUEST_BODY, start, body_size - start) {
            Ok(c) => c,
            Err(status) => {
                abi::log(
                    abi::LOG_WARN,
                    &format!("proxy-dedup: cannot read request body (status {status})"),
                );
                Vec::new()
            }
        };
        self.request_seen = body_size;
        let mut env = WasmEnv { shared: &shared };
        let d = self
            .stream
            .on_request_body(&shared.plugin, &mut env, &chunk, end_of_stream);
        self.apply(d)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let mut env = WasmEnv { shared: &shared };
        let d = self.stream.on_request_trailers(&shared.plugin, &mut env);
        self.apply(d)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !self.stream.holds_claim() {
            return Action::Continue;
        }
        let pairs = abi::header_pairs(abi::MAP_RESPONSE_HEADERS).unwrap_or_default();
        let status = pairs
            .iter()
            .find(|(n, _)| n == ":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let mut env = WasmEnv { shared: &shared };
        self.stream.on_response_headers(
            &shared.plugin,
            &mut env,
            status,
            move || pairs,
            end_of_stream,
        );
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !self.stream.wants_response_body() {
            return Action::Continue;
        }
        // We never pause the response, so the buffer holds just this chunk.
        let mut env = WasmEnv { shared: &shared };
        match abi::buffer(abi::BUFFER_RESPONSE_BODY, 0, body_size) {
            Ok(chunk) => {
                self.stream
                    .on_response_body(&shared.plugin, &mut env, &chunk, end_of_stream)
            }
            Err(status) => {
                abi::log(
                    abi::LOG_WARN,
                    &format!("proxy-dedup: cannot read response body (status {status})"),
                );
                self.stream.on_response_body_unreadable();
                self.stream
                    .on_response_body(&shared.plugin, &mut env, &[], end_of_stream);
            }
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if let Some(shared) = self.shared.clone() {
            let mut env = WasmEnv { shared: &shared };
            self.stream.on_response_trailers(&shared.plugin, &mut env);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(shared) = self.shared.clone() {
            let mut env = WasmEnv { shared: &shared };
            self.stream.on_stream_end(&shared.plugin, &mut env);
        }
    }
}
