//! Carrying out a stream's decisions, for the glue: the request path follows store
//! calls until one is in flight (the request stays paused) or the stream decides; a
//! response-path call (completion, release, hold) holds the response until the store
//! answers; a call's answer resumes whichever side waited for it; a stream that ends
//! with a call out goes to the orphans. The per-stream host calls are the `StreamIo`
//! seam (the glue's HTTP context, or a fake in tests); the stream's own call state is
//! `stream/calls.rs`.

use super::{Host, Worker};
use crate::admin::AdminStream;
use crate::config::Role;
use crate::key::RequestHead;
use crate::reply::LocalReply;
use crate::stream::{CallAnswer, Decision, DedupStream, Holds, Origin, StoreCall, UpstreamCall};

/// What a stream callback tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

/// Which side of a stream to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

/// The per-stream host calls a decision is carried out with.
pub trait StreamIo {
    /// Sends the live request (its headers and buffered body) to a detached call's
    /// cluster, from the root context: its token, or the host's status.
    fn dispatch_upstream(&mut self, call: &UpstreamCall) -> Result<u32, u32>;
    /// Sends a local reply (a refusal is the glue's to log).
    fn send_reply(&mut self, reply: &LocalReply);
    /// Puts the decision, the record's digest prefix and the rule in Envoy's filter
    /// state, for access logs.
    fn report(&mut self, verdict: &str, record: Option<[u8; 12]>, rule: Option<&str>);
    /// Resumes the paused request or the held response.
    fn resume(&mut self, side: Side);
}

/// Who answers a stream's store calls: the stream, or the operator API's request.
pub enum Answerer<'a> {
    Stream,
    Admin(&'a mut AdminStream),
}

impl Worker {
    /// Sends `call` for `stream`, `holds` waiting for it; `Err`: the answer to give at
    /// once (it could not be dispatched).
    fn send<H: Host>(
        host: &H,
        stream: &mut DedupStream,
        call: &StoreCall,
        holds: Holds,
    ) -> Result<u32, CallAnswer> {
        let token = host.dispatch(call)?;
        stream.call_sent(token, host.now_ms(), holds);
        Ok(token)
    }

    /// A store call's answer to whoever waits for it.
    fn answer<H: Host>(
        &mut self,
        host: &H,
        stream: &mut DedupStream,
        by: &mut Answerer<'_>,
        answer: CallAnswer,
    ) -> Decision {
        match by {
            Answerer::Admin(admin) => {
                self.with_env(host, |p, env| admin.on_store_answer(p, env, answer))
            }
            Answerer::Stream => self.run(host, |p, env| stream.on_store_answer(p, env, answer)),
        }
    }

    /// Puts a changed decision in Envoy's filter state.
    pub fn report<S: StreamIo>(&self, io: &mut S, stream: &mut DedupStream) {
        let rule = stream.rule(&self.plugin).map(str::to_string);
        if let Some((verdict, record)) = stream.log_fields() {
            io.report(verdict, record.map(|r| r.digits()), rule.as_deref());
        }
    }

    /// Carries out a request-path decision, following store calls until one is in
    /// flight (the request stays paused) or the stream decides.
    pub fn drive<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        mut by: Answerer<'_>,
        mut decision: Decision,
    ) -> Action {
        loop {
            match decision {
                Decision::Call(call) => match Self::send(host, stream, &call, Holds::Request) {
                    Ok(_) => return Action::Pause,
                    Err(answer) => decision = self.answer(host, stream, &mut by, answer),
                },
                Decision::Upstream(call) => match io.dispatch_upstream(&call) {
                    Ok(token) => {
                        stream.call_sent(token, host.now_ms(), Holds::Request);
                        return Action::Pause;
                    }
                    Err(status) => {
                        host.log(
                            super::Level::Warn,
                            &format!(
                                "proxy-dedup: cannot call cluster `{}` (status {status})",
                                call.cluster
                            ),
                        );
                        decision = self.run(host, |p, env| stream.on_upstream_unsent(p, env));
                    }
                },
                other => return self.apply(io, stream, other),
            }
        }
    }

    /// Carries out a final decision: a local reply is sent (an error in its policy's
    /// `errors` format) and the stream stays paused, as Envoy expects after one.
    fn apply<S: StreamIo>(&self, io: &mut S, stream: &mut DedupStream, d: Decision) -> Action {
        self.report(io, stream);
        match d {
            Decision::Continue => Action::Continue,
            Decision::Reply(r) => {
                let format = self.plugin.config.error_format(stream.rule(&self.plugin));
                io.send_reply(&r.in_format(format));
                Action::Pause
            }
            // Calls are followed by `drive`; nothing else is final.
            Decision::Pause | Decision::Call(_) | Decision::Upstream(_) => Action::Pause,
        }
    }

    /// A response-path store call (completion, release, hold): the response is held
    /// until the store answers (the call's own timeout bounds the wait); a call that
    /// cannot be dispatched is settled at once and the response goes on.
    pub fn hold_response_for<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        call: Option<StoreCall>,
    ) -> Action {
        self.report(io, stream);
        let Some(call) = call else {
            return response_action(stream);
        };
        match Self::send(host, stream, &call, Holds::Response) {
            Ok(_) => {
                if host.debug_enabled() {
                    host.log(
                        super::Level::Debug,
                        &format!("stream {}: response held until etcd answers", stream.id()),
                    );
                }
                Action::Pause
            }
            Err(answer) => {
                let _ = self.run(host, |p, env| stream.on_store_answer(p, env, answer));
                response_action(stream)
            }
        }
    }

    /// The answer to a call `stream` made (token `token`): an orphan's goes to the
    /// orphans; else the side that waited goes on (a retry sent, the response resumed,
    /// the request driven on).
    pub fn call_answered<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        mut by: Answerer<'_>,
        token: u32,
        answer: CallAnswer,
    ) {
        if stream.handed_over() {
            return self.on_orphan_answer(host, token, answer);
        }
        let histogram = self.store_call_ms();
        let answered = stream.call_answered(match histogram {
            Some(_) => host.now_ms(),
            None => 0,
        });
        if let Some(id) = histogram {
            host.record(id, answered.elapsed_ms);
        }
        let decision = self.answer(host, stream, &mut by, answer);
        if answered.response_held {
            // A response-path call: resent after a transport failure, else settled, and
            // the response goes on.
            if let Decision::Call(call) = decision {
                if self.hold_response_for(host, io, stream, Some(call)) == Action::Pause {
                    return;
                }
            }
            io.resume(Side::Response);
            return;
        }
        if !answered.request_waited {
            return;
        }
        // Otherwise the stream is paused on the next call, or was answered locally.
        if self.drive(host, io, stream, by, decision) == Action::Continue {
            io.resume(Side::Request);
        }
    }

    /// A woken stream (a waiter, or a detached call's client deadline) goes on.
    pub fn woken<H: Host, S: StreamIo>(&mut self, host: &H, io: &mut S, stream: &mut DedupStream) {
        if !stream.wants_wake() {
            return;
        }
        let decision = self.run(host, |p, env| stream.on_wake(p, env));
        if self.drive(host, io, stream, Answerer::Stream, decision) == Action::Continue {
            io.resume(Side::Request);
        }
    }

    /// The stream ends (`call`: one its end needs): a store call still out is taken over
    /// by the orphans, so its answer and retries are still handled.
    pub fn end_stream<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        call: Option<StoreCall>,
    ) {
        self.report(io, stream);
        self.stream_ended(host);
        let mut token = stream.pending_call();
        if let Some(call) = call {
            match host.dispatch(&call) {
                Ok(t) => token = Some(t),
                Err(answer) => {
                    // Settled (as a failure) at once; nothing to wait for.
                    let _ = self.run(host, |p, env| stream.on_store_answer(p, env, answer));
                    return;
                }
            }
        }
        if let Some(token) = token {
            let orphan = stream.hand_over();
            self.adopt_orphan(token, orphan);
        }
    }
}

impl Worker {
    /// A request body callback (`body_size` bytes buffered): held while a call is out
    /// (Envoy buffers it), passed when the stream does not read it, else read (`read`,
    /// the whole buffered body, at its end) and decided.
    #[allow(clippy::too_many_arguments)]
    pub fn request_body<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        by: Answerer<'_>,
        body_size: usize,
        end_of_stream: bool,
        read: impl FnOnce(usize) -> Option<Vec<u8>>,
    ) -> Action {
        if stream.request_waits_on_call() {
            return Action::Pause;
        }
        if !stream.reading_request() {
            return Action::Continue;
        }
        let d = self.run(host, |p, env| {
            stream.on_request_body(p, env, body_size, end_of_stream, || read(body_size))
        });
        self.drive(host, io, stream, by, d)
    }

    /// Request trailers: the body is complete (`read` reads it all), as for the body's
    /// end.
    pub fn request_trailers<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        by: Answerer<'_>,
        read: impl FnOnce(usize) -> Option<Vec<u8>>,
    ) -> Action {
        if stream.request_waits_on_call() {
            return Action::Pause;
        }
        if !stream.reading_request() {
            return Action::Continue;
        }
        let d = self.run(host, |p, env| {
            stream.on_request_trailers(p, env, || read(usize::MAX))
        });
        self.drive(host, io, stream, by, d)
    }

    /// Request headers: the head is read (`read_head`; `None`: unreadable, the request
    /// passes) with the properties the policies' principals name (`read_property`:
    /// dynamic metadata an auth filter earlier in the chain set; none unless a policy
    /// reads one). The operator API's plugin (`"role": "admin"`) answers it from the
    /// store (`admin`, kept for its store calls' answers; `peer`: who asks); a data-plane
    /// stream decides, and the decision is carried out (`drive`).
    #[allow(clippy::too_many_arguments)]
    pub fn request_headers<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        admin: &mut Option<AdminStream>,
        end_of_stream: bool,
        read_head: impl FnOnce() -> Option<RequestHead>,
        mut read_property: impl FnMut(&str) -> Option<Vec<u8>>,
        peer: impl FnOnce() -> String,
    ) -> Action {
        let Some(mut head) = read_head() else {
            host.log(
                super::Level::Warn,
                "proxy-dedup: cannot read request headers; passing through",
            );
            return Action::Continue;
        };
        if self.plugin.config.role == Role::Admin {
            let peer = peer();
            let mut a = AdminStream::default();
            let d = self.with_env(host, |p, env| {
                a.on_request(p, env, &head.method, &head.path, &peer)
            });
            let a = admin.insert(a);
            return self.drive(host, io, stream, Answerer::Admin(a), d);
        }
        for path in self.plugin.config.metadata_properties.iter() {
            if let Some(v) = read_property(path) {
                head.properties.push((path.clone(), v));
            }
        }
        let d = self.run(host, |p, env| {
            stream.on_request_headers(p, env, head, end_of_stream)
        });
        self.drive(host, io, stream, Answerer::Stream, d)
    }

    /// Response headers: a stream that holds a claim reads them (`read`: the status, the
    /// header pairs and where the response came from) and decides; a response-path call
    /// it needs holds the response (`hold_response_for`). Any other stream passes.
    pub fn response_headers<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        end_of_stream: bool,
        read: impl FnOnce() -> (u16, Vec<(String, Vec<u8>)>, Origin),
    ) -> Action {
        if !stream.holds_claim() {
            return Action::Continue;
        }
        let (status, pairs, origin) = read();
        let call = self.run(host, |p, env| {
            stream.on_response_headers(p, env, status, &origin, move || pairs, end_of_stream)
        });
        self.hold_response_for(host, io, stream, call)
    }

    /// A response body callback (`body_size` bytes offered): while the response is
    /// captured, its new bytes are read (`read(start, len)`; `None`: unreadable, kept
    /// without a body rather than truncated) and kept; at its end the completion holds
    /// the response; before it, the body is buffered or passed (`buffer_or_pass`). A
    /// response not captured passes, or stays held while a call holds it.
    pub fn response_body<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        body_size: usize,
        end_of_stream: bool,
        read: impl FnOnce(usize, usize) -> Option<Vec<u8>>,
    ) -> Action {
        if !stream.wants_response_body() {
            return response_action(stream);
        }
        let start = stream.response_chunk_start(body_size);
        let chunk = read(start, body_size.saturating_sub(start));
        let call = self.run(host, |p, env| match chunk {
            Some(chunk) => stream.on_response_body(p, env, &chunk, end_of_stream),
            None => {
                stream.on_response_body_unreadable();
                stream.on_response_body(p, env, &[], end_of_stream)
            }
        });
        if end_of_stream {
            stream.response_body_read(body_size);
            return self.hold_response_for(host, io, stream, call);
        }
        self.buffer_or_pass(stream, body_size)
    }

    /// Response trailers: the response is complete.
    pub fn response_trailers<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
    ) -> Action {
        let call = self.run(host, |p, env| stream.on_response_trailers(p, env));
        self.hold_response_for(host, io, stream, call)
    }

    /// The stream's end (Envoy's log callback): the stream classifies it, reading where
    /// the response came from (`origin`) only when that decides; then `end_stream`. A
    /// stream handed over to the orphans has nothing left here.
    pub fn stream_end<H: Host, S: StreamIo>(
        &mut self,
        host: &H,
        io: &mut S,
        stream: &mut DedupStream,
        origin: impl FnOnce() -> Origin,
    ) {
        if stream.handed_over() {
            return;
        }
        let origin = if stream.origin_matters_at_end() {
            origin()
        } else {
            Origin::default()
        };
        let call = self.run(host, |p, env| stream.on_stream_end(p, env, &origin));
        self.end_stream(host, io, stream, call);
    }

    /// After a response body callback that read up to `body_size`, not its end: whether
    /// Envoy buffers the body (`Pause`). With a store reached by calls, the last bytes
    /// must not reach the client before the store has the completed record
    /// (`DedupStream::buffer_response_body`).
    fn buffer_or_pass(&self, stream: &mut DedupStream, body_size: usize) -> Action {
        if stream.buffer_response_body(self.plugin.store.makes_calls(), body_size) {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}

/// While the response is held, later response callbacks keep it paused (buffered).
pub fn response_action(stream: &DedupStream) -> Action {
    if stream.response_held() {
        Action::Pause
    } else {
        Action::Continue
    }
}

#[cfg(test)]
mod tests;
