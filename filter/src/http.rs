//! The HTTP context: each of Envoy's stream callbacks goes to one `Worker` call (which
//! decides, and says whether to pause), with the host calls that read what Envoy offers
//! (header maps, bodies, properties) and the per-stream ones it carries out with (`Io`:
//! a detached call, a local reply, the access-log properties, a resume).

use crate::abi;
use crate::context::{Action, Context, HttpContext};
use crate::env::AbiHost;
use crate::SharedWorker;
use dedup_core::admin::AdminStream;
use dedup_core::key::{text, RequestHead};
use dedup_core::phases::{span, Phase};
use dedup_core::reply::LocalReply;
use dedup_core::response::status_of;
use dedup_core::stream::{forwarded_header, CallAnswer, Origin, UpstreamCall};
use dedup_core::worker::{self, Answerer, Side, StreamIo, Worker};
use dedup_core::DedupStream;

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

    /// Runs `f` with the worker, this stream's host calls and the stream (what
    /// `Worker`'s carrying out needs); `None` when there is no worker (a context without
    /// configuration) or a callback re-enters it.
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

/// `len` bytes of the response body from `start`; `None` (logged) when unreadable.
fn read_response_body(start: usize, len: usize) -> Option<Vec<u8>> {
    match abi::buffer(abi::BUFFER_RESPONSE_BODY, start, len) {
        Ok(chunk) => Some(chunk),
        Err(status) => {
            abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: cannot read response body (status {status})"),
            );
            None
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
        // A context without configuration (or a callback re-entering the worker) passes.
        let Some(Ok(mut w)) = self.shared.as_ref().map(|s| s.try_borrow_mut()) else {
            return Action::Continue;
        };
        act(w.request_headers(
            &AbiHost,
            &mut Io,
            &mut self.stream,
            &mut self.admin,
            end_of_stream,
            request_head,
            abi::property_at,
            || {
                abi::property(&["source", "address"])
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_default()
            },
        ))
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
        let a = self.carry(|w, io, s, _| {
            w.response_headers(&AbiHost, io, s, end_of_stream, || {
                let pairs = abi::header_pairs(abi::MAP_RESPONSE_HEADERS).unwrap_or_default();
                (status_of(&pairs), pairs, response_origin())
            })
        });
        act(a.unwrap_or(worker::Action::Continue))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let a = self.carry(|w, io, s, _| {
            w.response_body(
                &AbiHost,
                io,
                s,
                body_size,
                end_of_stream,
                read_response_body,
            )
        });
        act(a.unwrap_or(worker::Action::Continue))
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let a = self.carry(|w, io, s, _| w.response_trailers(&AbiHost, io, s));
        act(a.unwrap_or(worker::Action::Continue))
    }

    fn on_wake(&mut self) {
        let _ = self.carry(|w, io, s, _| w.woken(&AbiHost, io, s));
    }

    fn on_log(&mut self) {
        let _ = self.carry(|w, io, s, _| w.stream_end(&AbiHost, io, s, response_origin));
    }
}

impl Context for DedupHttp {
    fn on_call_answer(&mut self, token_id: u32, answer: CallAnswer) {
        let _ = self.carry(|w, io, s, by| w.call_answered(&AbiHost, io, s, by, token_id, answer));
    }
}
