//! The HTTP context: reads what Envoy offers, hands it to `DedupStream`, and carries out
//! the action it returns.

use crate::abi;
use crate::context::{Action, Context, HttpContext};
use crate::env::{dispatch, no_answer, AbiHost};
use crate::SharedWorker;
use dedup_core::admin::AdminStream;
use dedup_core::config::Role;
use dedup_core::key::{text, RequestHead};
use dedup_core::response::status_of;
use dedup_core::stream::{forwarded_header, CallAnswer, Holds, Origin, StoreCall, UpstreamCall};
use dedup_core::worker::{Worker, WorkerEnv};
use dedup_core::{Decision, DedupStream, Plugin};

pub(crate) struct DedupHttp {
    shared: Option<SharedWorker>,
    context_id: u32,
    stream: DedupStream,
    /// Set when the plugin serves the admin API (`"role": "admin"`).
    admin: Option<AdminStream>,
    /// Request body bytes Envoy holds for us (the last body callback's size): a
    /// detached call sends exactly these.
    request_body_len: usize,
}

/// Where the response came from, as Envoy says (`Origin::from_properties`).
fn response_origin() -> Origin {
    let details = abi::property_at("response\0code_details")
        .map(text)
        .unwrap_or_default();
    Origin::from_properties(details, || abi::property_at("response\0flags"))
}

impl DedupHttp {
    pub(crate) fn new(context_id: u32, shared: Option<SharedWorker>) -> Self {
        DedupHttp {
            shared,
            stream: DedupStream::new(context_id),
            context_id,
            admin: None,
            request_body_len: 0,
        }
    }

    /// Runs a stream callback `f` through the worker (`Worker::run`: the plugin and the
    /// stream's `Env`); `None` when there is no worker or a callback re-enters it.
    fn with_env<R>(
        &mut self,
        f: impl FnOnce(&mut DedupStream, &Plugin, &mut WorkerEnv<'_, AbiHost>) -> R,
    ) -> Option<R> {
        let stream = &mut self.stream;
        let mut w = self.shared.as_ref()?.try_borrow_mut().ok()?;
        Some(w.run(&AbiHost, |p, env| f(stream, p, env)))
    }

    /// Runs `f` on the worker, when there is one and it is not running already.
    fn worker<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
        let mut w = self.shared.as_ref()?.try_borrow_mut().ok()?;
        Some(f(&mut w))
    }

    /// Sends a store call; the stream remembers it as its pending call, held by `holds`.
    fn dispatch(&mut self, call: &StoreCall, holds: Holds) -> Result<u32, CallAnswer> {
        if self.shared.is_none() {
            return Err(no_answer());
        }
        let token = dispatch(call)?;
        self.stream.call_sent(token, abi::now_ms(), holds);
        Ok(token)
    }

    /// Sends the live request (its headers, hop-by-hop ones dropped, and its buffered
    /// body) to the detached call's cluster, from the root context, so the call outlives
    /// this stream; the request waits for it.
    fn dispatch_upstream(&mut self, call: &UpstreamCall) -> Result<u32, u32> {
        let headers: Vec<(String, Vec<u8>)> = abi::header_pairs(abi::MAP_REQUEST_HEADERS)?
            .into_iter()
            .filter(|(n, _)| forwarded_header(n))
            .collect();
        // The whole body, or no call at all: a call with a body cut short would run
        // another request than the client's.
        let body = match self.request_body_len {
            0 => Vec::new(),
            len => match abi::buffer(abi::BUFFER_REQUEST_BODY, 0, len)? {
                body if body.len() == len => body,
                // Fewer bytes than Envoy holds: proxy-wasm's ResultMismatch.
                _ => return Err(9),
            },
        };
        let timeout = std::time::Duration::from_millis(call.timeout_ms);
        let token = crate::context::dispatched(abi::dispatch_http_call_pairs(
            &call.cluster,
            &headers,
            Some(&body),
            timeout,
        ))?;
        self.stream.call_sent(token, abi::now_ms(), Holds::Request);
        Ok(token)
    }

    /// Puts a new decision (and the record's digest prefix, and the rule that chose the
    /// policy) in Envoy's filter state, for access logs:
    /// `%FILTER_STATE(wasm.proxy_dedup_decision:PLAIN)%`,
    /// `%FILTER_STATE(wasm.proxy_dedup_record:PLAIN)%` and
    /// `%FILTER_STATE(wasm.proxy_dedup_rule:PLAIN)%`.
    fn report(&mut self) {
        let Some((verdict, record)) = self.stream.log_fields() else {
            return;
        };
        let mut failed = abi::set_property("proxy_dedup_decision", verdict.as_bytes()).err();
        if let Some(record) = record {
            failed = failed.or(abi::set_property("proxy_dedup_record", &record.digits()).err());
        }
        if let Some(w) = self.shared.as_ref().and_then(|w| w.try_borrow().ok()) {
            if let Some(rule) = self.stream.rule(&w.plugin) {
                failed = failed.or(abi::set_property("proxy_dedup_rule", rule.as_bytes()).err());
            }
        }
        if let Some(status) = failed {
            if abi::log_level() <= abi::LOG_DEBUG {
                abi::log(
                    abi::LOG_DEBUG,
                    &format!("proxy-dedup: cannot set filter state (status {status})"),
                );
            }
        }
    }

    /// Gives a store answer to whoever waits for it: the admin request, or the stream.
    fn store_answer(&mut self, answer: CallAnswer) -> Option<Decision> {
        if let Some(admin) = self.admin.as_mut() {
            let mut w = self.shared.as_ref()?.try_borrow_mut().ok()?;
            return Some(w.with_env(&AbiHost, |p, env| admin.on_store_answer(p, env, answer)));
        }
        self.with_env(|s, p, env| s.on_store_answer(p, env, answer))
    }

    /// An admin request (`"role": "admin"`): answered from the store, never forwarded.
    fn admin_request(&mut self, head: &RequestHead) -> Action {
        if self.shared.is_none() {
            return Action::Continue;
        }
        let peer = abi::property(&["source", "address"])
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        let mut admin = AdminStream::default();
        let Some(decision) = self.worker(|w| {
            w.with_env(&AbiHost, |p, env| {
                admin.on_request(p, env, &head.method, &head.path, &peer)
            })
        }) else {
            return Action::Continue;
        };
        self.admin = Some(admin);
        self.drive(decision)
    }

    /// Carries out a request-path decision, following store calls until one is in flight
    /// (then the request stays paused) or the stream decides.
    fn drive(&mut self, mut decision: Decision) -> Action {
        loop {
            match decision {
                Decision::Call(call) => match self.dispatch(&call, Holds::Request) {
                    Ok(_) => return Action::Pause,
                    Err(answer) => match self.store_answer(answer) {
                        Some(d) => decision = d,
                        None => return Action::Continue,
                    },
                },
                Decision::Upstream(call) => match self.dispatch_upstream(&call) {
                    Ok(_) => return Action::Pause,
                    Err(status) => {
                        abi::log(
                            abi::LOG_WARN,
                            &format!(
                                "proxy-dedup: cannot call cluster `{}` (status {status})",
                                call.cluster
                            ),
                        );
                        match self.with_env(|s, p, env| s.on_upstream_unsent(p, env)) {
                            Some(d) => decision = d,
                            None => return Action::Continue,
                        }
                    }
                },
                other => return self.apply(other),
            }
        }
    }

    /// A response-path store call (completion, release). The response is paused until
    /// the store answers (the call's own timeout bounds the wait); a call that cannot be
    /// dispatched is settled at once and the response goes on.
    fn hold_response_for(&mut self, call: Option<StoreCall>) -> Action {
        self.report();
        let Some(call) = call else {
            return self.response_action();
        };
        match self.dispatch(&call, Holds::Response) {
            Ok(_) => {
                if abi::log_level() <= abi::LOG_DEBUG {
                    abi::log(
                        abi::LOG_DEBUG,
                        &format!(
                            "stream {}: response held until etcd answers",
                            self.context_id
                        ),
                    );
                }
                Action::Pause
            }
            Err(answer) => {
                let _ = self.with_env(|s, p, env| s.on_store_answer(p, env, answer));
                self.response_action()
            }
        }
    }

    /// While the response is held, later response callbacks keep it paused (buffered).
    fn response_action(&self) -> Action {
        if self.stream.response_held() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    /// The stream ends: a store call still out (or one the end itself needs) is taken
    /// over by the VM's orphans, so its answer and retries are still handled.
    fn hand_over(&mut self, call: Option<StoreCall>) {
        if self.shared.is_none() {
            return;
        }
        let mut token = self.stream.pending_call();
        if let Some(call) = call {
            match dispatch(&call) {
                Ok(t) => token = Some(t),
                Err(answer) => {
                    // Settled (as a failure) at once; nothing to wait for.
                    let _ = self.with_env(|s, p, env| s.on_store_answer(p, env, answer));
                    return;
                }
            }
        }
        if let Some(token) = token {
            let stream = self.stream.hand_over();
            self.worker(|w| w.adopt_orphan(token, stream));
        }
    }

    /// Carries out a decision. A local reply is sent and the stream stays paused, as Envoy
    /// expects after `send_local_response`.
    fn apply(&mut self, decision: Decision) -> Action {
        self.report();
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
            // Only reached through `drive`, which dispatches calls itself.
            Decision::Call(_) | Decision::Upstream(_) => Action::Pause,
        }
    }
}

/// The buffered request body, up to `size` bytes; `None` (logged) when unreadable.
fn read_request_body(size: usize) -> Option<Vec<u8>> {
    match abi::buffer(abi::BUFFER_REQUEST_BODY, 0, size) {
        Ok(body) => Some(body),
        Err(status) => {
            abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: cannot read request body (status {status})"),
            );
            None
        }
    }
}

/// The request head from Envoy's header map (`RequestHead::from_pairs`).
fn request_head() -> Option<RequestHead> {
    let pairs = abi::header_pairs(abi::MAP_REQUEST_HEADERS).ok()?;
    Some(RequestHead::from_pairs(pairs, || {
        abi::property_at("request\0protocol")
            .map(text)
            .unwrap_or_default()
    }))
}

impl HttpContext for DedupHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(role) = self.worker(|w| w.plugin.config.role) else {
            return Action::Continue;
        };
        // One header-map read: the whole head. (Methods no policy deduplicates skip the
        // filter in Envoy's matcher, in the shipped templates; a pre-read of `:method`
        // would cost every deduplicated request a second call.)
        let Some(head) = request_head() else {
            abi::log(
                abi::LOG_WARN,
                "proxy-dedup: cannot read request headers; passing through",
            );
            return Action::Continue;
        };
        if role == Role::Admin {
            return self.admin_request(&head);
        }
        match self.with_env(|s, p, env| s.on_request_headers(p, env, head, end_of_stream)) {
            Some(d) => self.drive(d),
            None => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.stream.request_waits_on_call() {
            // Body arriving while a store call is out: Envoy buffers it; keep waiting.
            return Action::Pause;
        }
        if !self.stream.reading_request() {
            return Action::Continue;
        }
        self.request_body_len = body_size;
        // Envoy buffers the body while we pause; it is read once, when complete.
        let decision = self.with_env(|s, p, env| {
            s.on_request_body(p, env, body_size, end_of_stream, || {
                read_request_body(body_size)
            })
        });
        match decision {
            Some(d) => self.drive(d),
            None => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.stream.request_waits_on_call() {
            return Action::Pause;
        }
        if !self.stream.reading_request() {
            return Action::Continue;
        }
        let decision = self
            .with_env(|s, p, env| s.on_request_trailers(p, env, || read_request_body(usize::MAX)));
        match decision {
            Some(d) => self.drive(d),
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !self.stream.holds_claim() {
            return Action::Continue;
        }
        let pairs = abi::header_pairs(abi::MAP_RESPONSE_HEADERS).unwrap_or_default();
        let status = status_of(&pairs);
        let origin = response_origin();
        let call = self
            .with_env(|s, p, env| {
                s.on_response_headers(p, env, status, &origin, move || pairs, end_of_stream)
            })
            .flatten();
        self.hold_response_for(call)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stream.wants_response_body() {
            return self.response_action();
        }
        let start = self.stream.response_chunk_start(body_size);
        let call = match abi::buffer(abi::BUFFER_RESPONSE_BODY, start, body_size - start) {
            Ok(chunk) => {
                self.with_env(|s, p, env| s.on_response_body(p, env, &chunk, end_of_stream))
            }
            Err(status) => {
                abi::log(
                    abi::LOG_WARN,
                    &format!("proxy-dedup: cannot read response body (status {status})"),
                );
                self.with_env(|s, p, env| {
                    s.on_response_body_unreadable();
                    s.on_response_body(p, env, &[], end_of_stream)
                })
            }
        }
        .flatten();
        if end_of_stream {
            self.stream.response_body_read(body_size);
            return self.hold_response_for(call);
        }
        let remote = self
            .worker(|w| w.plugin.store.makes_calls())
            .unwrap_or(false);
        if self.stream.buffer_response_body(remote, body_size) {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let call = self
            .with_env(|s, p, env| s.on_response_trailers(p, env))
            .flatten();
        self.hold_response_for(call)
    }

    fn on_wake(&mut self) {
        if !self.stream.wants_wake() {
            return;
        }
        let Some(decision) = self.with_env(|s, p, env| s.on_wake(p, env)) else {
            return;
        };
        if self.drive(decision) == Action::Continue {
            resume(abi::STREAM_HTTP_REQUEST);
        }
    }

    fn on_log(&mut self) {
        if self.stream.handed_over() {
            return;
        }
        // Envoy's properties are read only when the stream's end is classified by them.
        let origin = if self.stream.origin_matters_at_end() {
            response_origin()
        } else {
            Origin::default()
        };
        let call = self
            .with_env(|s, p, env| s.on_stream_end(p, env, &origin))
            .flatten();
        self.report();
        self.hand_over(call);
    }
}

impl Context for DedupHttp {
    fn on_call_answer(&mut self, token_id: u32, answer: CallAnswer) {
        if self.stream.handed_over() {
            self.worker(|w| w.on_orphan_answer(&AbiHost, token_id, answer));
            return;
        }
        let store_call_ms = self.worker(|w| w.store_call_ms()).flatten();
        let answered = self.stream.call_answered(match store_call_ms {
            Some(_) => abi::now_ms(),
            None => 0,
        });
        if let Some(id) = store_call_ms {
            abi::record(id, answered.elapsed_ms);
        }
        let Some(decision) = self.store_answer(answer) else {
            return;
        };
        if answered.response_held {
            // A response-path call (completion, release): resent after a transport
            // failure, else settled, and the response goes on.
            if let Decision::Call(call) = decision {
                if self.hold_response_for(Some(call)) == Action::Pause {
                    return;
                }
            }
            resume(abi::STREAM_HTTP_RESPONSE);
            return;
        }
        if !answered.request_waited {
            return;
        }
        // Otherwise the stream is paused on the next call, or was answered locally.
        if self.drive(decision) == Action::Continue {
            resume(abi::STREAM_HTTP_REQUEST);
        }
    }
}

/// Resumes the paused request or the held response (`abi::STREAM_HTTP_*`); a refusal
/// is logged (the stream then ends on Envoy's terms).
fn resume(stream: u32) {
    if let Err(status) = abi::resume(stream) {
        let what = if stream == abi::STREAM_HTTP_REQUEST {
            "request"
        } else {
            "response"
        };
        abi::log(
            abi::LOG_WARN,
            &format!("proxy-dedup: cannot resume the {what} (status {status})"),
        );
    }
}
