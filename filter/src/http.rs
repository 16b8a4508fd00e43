//! The HTTP context: reads what Envoy offers, hands it to `DedupStream`, and carries out
//! the action it returns.

use crate::abi;
use crate::context::{Action, Context, HttpContext};
use crate::env::AbiHost;
use crate::SharedWorker;
use dedup_core::admin::AdminStream;
use dedup_core::config::Role;
use dedup_core::key::{text, RequestHead};
use dedup_core::phases::{span, Phase};
use dedup_core::reply::LocalReply;
use dedup_core::response::status_of;
use dedup_core::stream::{forwarded_header, CallAnswer, Origin, StoreCall, UpstreamCall};
use dedup_core::worker::{self, response_action, Answerer, Side, StreamIo, Worker, WorkerEnv};
use dedup_core::{Decision, DedupStream, Plugin};

pub(crate) struct DedupHttp {
    shared: Option<SharedWorker>,
    stream: DedupStream,
    /// Set when the plugin serves the admin API (`"role": "admin"`).
    admin: Option<AdminStream>,
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
            admin: None,
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

    /// Runs `f` with the worker, this stream's host calls and the stream (what
    /// `Worker`'s carrying out needs); `None` as `worker`.
    fn carry<R>(
        &mut self,
        f: impl FnOnce(&mut Worker, &mut Io, &mut DedupStream, Answerer<'_>) -> R,
    ) -> Option<R> {
        let mut w = self.shared.as_ref()?.try_borrow_mut().ok()?;
        let mut io = Io;
        let by = match self.admin.as_mut() {
            Some(admin) => Answerer::Admin(admin),
            None => Answerer::Stream,
        };
        Some(f(&mut w, &mut io, &mut self.stream, by))
    }

    /// Carries out a request-path decision (`Worker::drive`).
    fn drive(&mut self, decision: Decision) -> Action {
        let a = self.carry(|w, io, s, by| w.drive(&AbiHost, io, s, by, decision));
        act(a.unwrap_or(worker::Action::Continue))
    }

    /// A response-path store call (`Worker::hold_response_for`).
    fn hold_response_for(&mut self, call: Option<StoreCall>) -> Action {
        let a = self.carry(|w, io, s, _| w.hold_response_for(&AbiHost, io, s, call));
        act(a.unwrap_or(worker::Action::Continue))
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
}

/// The glue's ABI answer for the core's.
fn act(a: worker::Action) -> Action {
    match a {
        worker::Action::Continue => Action::Continue,
        worker::Action::Pause => Action::Pause,
    }
}

/// A stream's host calls, as `Worker`'s carrying out needs them.
struct Io;

impl StreamIo for Io {
    /// The live request (its headers, hop-by-hop ones dropped, and its buffered body)
    /// to the detached call's cluster, from the root context, so the call outlives this
    /// stream.
    fn dispatch_upstream(&mut self, call: &UpstreamCall) -> Result<u32, u32> {
        let headers: Vec<(String, Vec<u8>)> = abi::header_pairs(abi::MAP_REQUEST_HEADERS)?
            .into_iter()
            .filter(|(n, _)| forwarded_header(n))
            .collect();
        // The whole body, or no call at all: a call with a body cut short would run
        // another request than the client's.
        let body = match call.body_len {
            0 => Vec::new(),
            len => match abi::buffer(abi::BUFFER_REQUEST_BODY, 0, len)? {
                body if body.len() == len => body,
                // Fewer bytes than Envoy holds: proxy-wasm's ResultMismatch.
                _ => return Err(9),
            },
        };
        let timeout = std::time::Duration::from_millis(call.timeout_ms);
        crate::context::dispatched(abi::dispatch_http_call_pairs(
            &call.cluster,
            &headers,
            Some(&body),
            timeout,
        ))
    }

    fn send_reply(&mut self, r: &LocalReply) {
        let _t = span(Phase::LocalReply);
        if let Err(status) = abi::send_local_response(r.status, r.details, &r.headers, &r.body) {
            abi::log(
                abi::LOG_ERROR,
                &format!("proxy-dedup: send_local_response failed (status {status})"),
            );
        }
    }

    /// `%FILTER_STATE(wasm.proxy_dedup_decision:PLAIN)%`,
    /// `%FILTER_STATE(wasm.proxy_dedup_record:PLAIN)%` and
    /// `%FILTER_STATE(wasm.proxy_dedup_rule:PLAIN)%`.
    fn report(&mut self, verdict: &str, record: Option<[u8; 12]>, rule: Option<&str>) {
        let _t = span(Phase::LogProperties);
        let mut failed = abi::set_property("proxy_dedup_decision", verdict.as_bytes()).err();
        if let Some(record) = record {
            failed = failed.or(abi::set_property("proxy_dedup_record", &record).err());
        }
        if let Some(rule) = rule {
            failed = failed.or(abi::set_property("proxy_dedup_rule", rule.as_bytes()).err());
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

    fn resume(&mut self, side: Side) {
        let (stream, what) = match side {
            Side::Request => (abi::STREAM_HTTP_REQUEST, "request"),
            Side::Response => (abi::STREAM_HTTP_RESPONSE, "response"),
        };
        if let Err(status) = abi::resume(stream) {
            abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: cannot resume the {what} (status {status})"),
            );
        }
    }
}

/// The buffered request body, up to `size` bytes; `None` (logged) when unreadable.
fn read_request_body(size: usize) -> Option<Vec<u8>> {
    let _t = span(Phase::BodyRead);
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
    let _t = span(Phase::HeadRead);
    let pairs = abi::header_pairs(abi::MAP_REQUEST_HEADERS).ok()?;
    Some(RequestHead::from_pairs(pairs, || {
        abi::property_at("request\0protocol")
            .map(text)
            .unwrap_or_default()
    }))
}

impl HttpContext for DedupHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some((role, properties)) = self.worker(|w| {
            let c = &w.plugin.config;
            (c.role, c.metadata_properties.clone())
        }) else {
            return Action::Continue;
        };
        // One header-map read: the whole head. (Methods no policy deduplicates skip the
        // filter in Envoy's matcher, in the shipped templates; a pre-read of `:method`
        // would cost every deduplicated request a second call.)
        let Some(mut head) = request_head() else {
            abi::log(
                abi::LOG_WARN,
                "proxy-dedup: cannot read request headers; passing through",
            );
            return Action::Continue;
        };
        if role == Role::Admin {
            return self.admin_request(&head);
        }
        // The properties the policies' principals name (dynamic metadata an auth filter
        // earlier in the chain set); none unless a policy reads one.
        for path in properties.iter() {
            if let Some(v) = abi::property_at(path) {
                head.properties.push((path.clone(), v));
            }
        }
        match self.with_env(|s, p, env| s.on_request_headers(p, env, head, end_of_stream)) {
            Some(d) => self.drive(d),
            None => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let a = self.carry(|w, io, s, by| {
            w.request_body(
                &AbiHost,
                io,
                s,
                by,
                body_size,
                end_of_stream,
                read_request_body,
            )
        });
        act(a.unwrap_or(worker::Action::Continue))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let a =
            self.carry(|w, io, s, by| w.request_trailers(&AbiHost, io, s, by, read_request_body));
        act(a.unwrap_or(worker::Action::Continue))
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
            return act(response_action(&self.stream));
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
        let a = self.carry(|w, _, s, _| w.response_body_read(s, body_size));
        act(a.unwrap_or(worker::Action::Continue))
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let call = self
            .with_env(|s, p, env| s.on_response_trailers(p, env))
            .flatten();
        self.hold_response_for(call)
    }

    fn on_wake(&mut self) {
        let _ = self.carry(|w, io, s, _| w.woken(&AbiHost, io, s));
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
        let _ = self.carry(|w, io, s, _| w.end_stream(&AbiHost, io, s, call));
    }
}

impl Context for DedupHttp {
    fn on_call_answer(&mut self, token_id: u32, answer: CallAnswer) {
        let _ = self.carry(|w, io, s, by| w.call_answered(&AbiHost, io, s, by, token_id, answer));
    }
}
