//! The filter chain: contexts, the filter callbacks for each side and what
//! their statuses do to the stream, and resuming a paused side.

use super::*;

impl SimEnvoy {
    pub(super) fn create_context(&mut self, sid: u64) -> bool {
        let (w, ctx, created) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx, s.context_created)
        };
        if created {
            return true;
        }
        if let Some(s) = self.streams.get_mut(&sid) {
            s.context_created = true;
        }
        let root = self.vms[w].store.data().root_id as i32;
        !matches!(
            self.invoke(w, ctx, |x| x.on_context_create.clone(), (ctx as i32, root),),
            Call::Trapped
        )
    }

    /// A VM failure met by a stream: 503 (Envoy's wasm_fail_stream), or
    /// pass-through under fail-open. Returns true if the stream goes on.
    pub(super) fn failed_vm(&mut self, sid: u64) -> bool {
        if self.fail_open {
            if let Some(s) = self.streams.get_mut(&sid) {
                s.bypass = true;
            }
            return true;
        }
        self.local_reply(
            sid,
            503,
            Vec::new(),
            Vec::new(),
            false,
            code_details::WASM_FAIL_STREAM,
        );
        false
    }

    /// [`Self::failed_vm`] as [`Self::call_filter`] answers it: the stream
    /// continues as if the callback had returned Continue, or it is gone.
    fn fail_filter(&mut self, sid: u64) -> Option<(i32, bool)> {
        self.failed_vm(sid).then_some((CONTINUE, false))
    }

    pub(super) fn call_filter(
        &mut self,
        sid: u64,
        side: Side,
        kind: Callback,
        a: i32,
        b: i32,
    ) -> Option<(i32, bool)> {
        let (w, ctx) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx)
        };
        if self.vms[w].failed {
            return self.fail_filter(sid);
        }
        if side == Side::Request && kind == Callback::Headers && !self.create_context(sid) {
            return self.fail_filter(sid);
        }
        let c = ctx as i32;
        // The callback for this side and kind: headers and body take
        // (context, size or count, end of stream), trailers (context, count).
        let x = &self.vms[w].exports;
        let call = match (side, kind) {
            (_, Callback::Trailers) => {
                let f = match side {
                    Side::Request => x.on_request_trailers.clone(),
                    Side::Response => x.on_response_trailers.clone(),
                };
                self.invoke(w, ctx, move |_| f.clone(), (c, a))
            }
            _ => {
                let f = match (side, kind) {
                    (Side::Request, Callback::Headers) => x.on_request_headers.clone(),
                    (Side::Request, _) => x.on_request_body.clone(),
                    (Side::Response, Callback::Headers) => x.on_response_headers.clone(),
                    (Side::Response, _) => x.on_response_body.clone(),
                };
                self.invoke(w, ctx, move |_| f.clone(), (c, a, b))
            }
        };
        let action = match call {
            Call::Missing => CONTINUE,
            Call::Done(a) => a,
            Call::Trapped => {
                let (d, _) = self.take_deferred(w);
                drop(d);
                return self.fail_filter(sid);
            }
        };
        let (_, stop_next) = {
            let s = self.vms[w].store.data();
            ((), s.stop_next_iteration)
        };
        Some((action, stop_next))
    }

    /// The body the filter saw on `side`, passed on: it is no longer the
    /// filter's to read.
    fn take_body(&mut self, sid: u64, side: Side) -> Vec<u8> {
        self.host(sid).map_or_else(Vec::new, |h| {
            let dir = h.side_mut(side);
            dir.body_live = false;
            std::mem::take(&mut dir.body)
        })
    }

    /// The filter manager's buffer overflows: Envoy answers 413 itself
    /// (through the filter's response callbacks).
    fn payload_too_large(&mut self, sid: u64) {
        self.local_reply(
            sid,
            413,
            b"Payload Too Large".to_vec(),
            Vec::new(),
            true,
            code_details::REQUEST_PAYLOAD_TOO_LARGE,
        );
    }

    pub(super) fn finish_call(&mut self, sid: u64) {
        if let Some(w) = self.streams.get(&sid).map(|s| s.worker) {
            let (d, _) = self.take_deferred(w);
            self.run_deferred(w, d);
        }
    }

    pub(super) fn headers_in(&mut self, sid: u64, side: Side, headers: Headers, eos: bool) {
        let n = headers.len() as i32;
        if let Some(h) = self.host(sid) {
            let dir = h.side_mut(side);
            dir.headers = headers;
            dir.headers_received = true;
            dir.headers_live = true;
        }
        if let Some(d) = self.dir(sid, side) {
            d.headers_eos = eos;
            d.eos_in = eos;
        }
        if self.streams[&sid].bypass {
            self.set_headers_state(sid, side, HeadersState::Passed);
            return;
        }
        let Some((action, stop_next)) =
            self.call_filter(sid, side, Callback::Headers, n, eos as i32)
        else {
            return;
        };
        if self.open(sid) {
            let bypass = self.streams[&sid].bypass;
            let state = if bypass
                || (!stop_next && (action == CONTINUE || action == CONTINUE_AND_END_STREAM))
            {
                HeadersState::Passed
            } else if action == STOP_ITERATION && self.allow_stop && !stop_next {
                HeadersState::Stopped
            } else {
                HeadersState::StoppedAll
            };
            self.set_headers_state(sid, side, state);
        }
        self.finish_call(sid);
    }

    pub(super) fn set_headers_state(&mut self, sid: u64, side: Side, state: HeadersState) {
        if let Some(d) = self.dir(sid, side) {
            d.headers = state;
        }
        if state == HeadersState::Passed {
            if let Some(h) = self.host(sid) {
                h.side_mut(side).headers_live = false;
            }
            self.pass_headers(sid, side);
        }
    }

    pub(super) fn data_in(&mut self, sid: u64, side: Side, chunk: Vec<u8>, eos: bool) {
        if side == Side::Request && self.streams.get(&sid).is_some_and(|s| s.local_reply) {
            return;
        }
        let (state, buffering, bypass) = {
            let Some(d) = self.dir(sid, side) else { return };
            if eos {
                d.eos_in = true;
            }
            (d.headers, d.buffering, self.streams[&sid].bypass)
        };
        if bypass {
            self.pass_data(sid, side, chunk, eos);
            return;
        }
        match state {
            HeadersState::Pending => {}
            HeadersState::StoppedAll => {
                if let Some(d) = self.dir(sid, side) {
                    d.held.extend_from_slice(&chunk);
                    d.held_any = true;
                }
            }
            HeadersState::Stopped | HeadersState::Passed => {
                self.body_callback(sid, side, chunk, eos, buffering);
            }
        }
    }

    /// Runs the filter's body callback on the buffered data plus `chunk`
    /// (Envoy hands the whole buffer when the filter has been buffering).
    pub(super) fn body_callback(
        &mut self,
        sid: u64,
        side: Side,
        chunk: Vec<u8>,
        eos: bool,
        buffering: bool,
    ) {
        if buffering && side == Side::Request {
            let buffered = self.host(sid).map_or(0, |h| h.req.body.len());
            if buffered + chunk.len() > self.buffer_limit {
                self.payload_too_large(sid);
                return;
            }
        }
        let size = {
            let Some(h) = self.host(sid) else { return };
            let dir = h.side_mut(side);
            if buffering {
                dir.body.extend_from_slice(&chunk);
            } else {
                dir.body = chunk;
            }
            dir.body_live = true;
            dir.body.len()
        };
        let Some((action, stop_next)) =
            self.call_filter(sid, side, Callback::Body, size as i32, eos as i32)
        else {
            return;
        };
        if self.open(sid) {
            let bypass = self.streams[&sid].bypass;
            if bypass || (!stop_next && action == CONTINUE) {
                let data = self.take_body(sid, side);
                let stopped = self.dir(sid, side).map(|d| {
                    d.buffering = false;
                    d.headers == HeadersState::Stopped
                });
                if stopped == Some(true) {
                    // Continue from the body resumes the stopped headers;
                    // Envoy still holds the header map (writes do nothing now).
                    if let Some(d) = self.dir(sid, side) {
                        d.headers = HeadersState::Passed;
                    }
                    self.pass_headers(sid, side);
                }
                self.pass_data(sid, side, data, eos);
            } else {
                if let Some(d) = self.dir(sid, side) {
                    d.buffering = true;
                }
                let buffered = self.host(sid).map_or(0, |h| h.req.body.len());
                if side == Side::Request && buffered > self.buffer_limit {
                    self.finish_call(sid);
                    self.payload_too_large(sid);
                    return;
                }
            }
        }
        self.finish_call(sid);
    }

    pub(super) fn trailers_in(&mut self, sid: u64, side: Side, trailers: Headers) {
        if side == Side::Request && self.streams.get(&sid).is_some_and(|s| s.local_reply) {
            return;
        }
        let (state, bypass) = {
            let Some(d) = self.dir(sid, side) else { return };
            d.eos_in = true;
            (d.headers, self.streams[&sid].bypass)
        };
        if bypass {
            self.pass_trailers(sid, side, trailers);
            return;
        }
        if state == HeadersState::StoppedAll {
            if let Some(d) = self.dir(sid, side) {
                d.held_trailers = Some(trailers);
            }
            return;
        }
        let n = trailers.len() as i32;
        if let Some(h) = self.host(sid) {
            let dir = h.side_mut(side);
            dir.trailers = trailers;
            dir.trailers_live = true;
        }
        let Some((action, stop_next)) = self.call_filter(sid, side, Callback::Trailers, n, 0)
        else {
            return;
        };
        if self.open(sid) {
            if self.streams[&sid].bypass || (!stop_next && action == CONTINUE) {
                self.release_after_trailers(sid, side);
            } else if let Some(d) = self.dir(sid, side) {
                d.trailers_stopped = true;
            }
        }
        self.finish_call(sid);
    }

    /// Trailers continued: stopped headers and buffered data go first.
    pub(super) fn release_after_trailers(&mut self, sid: u64, side: Side) {
        let (headers_stopped, buffering) = match self.dir(sid, side) {
            Some(d) => {
                d.trailers_stopped = false;
                let r = (d.headers != HeadersState::Passed, d.buffering);
                d.headers = HeadersState::Passed;
                d.buffering = false;
                r
            }
            None => return,
        };
        if headers_stopped {
            self.pass_headers(sid, side);
        }
        let (body, trailers) = match self.host(sid) {
            Some(h) => {
                let dir = h.side_mut(side);
                dir.trailers_live = false;
                dir.body_live = false;
                (std::mem::take(&mut dir.body), dir.trailers.clone())
            }
            None => return,
        };
        if buffering && !body.is_empty() {
            self.pass_data(sid, side, body, false);
        }
        self.pass_trailers(sid, side, trailers);
    }

    /// `proxy_continue_stream`: the filter manager's continueDecoding /
    /// continueEncoding.
    pub(super) fn resume(&mut self, sid: u64, side: Side) {
        if !self.open(sid) {
            return;
        }
        let Some(d) = self.dir(sid, side) else { return };
        match d.headers {
            HeadersState::Pending => {}
            HeadersState::StoppedAll => {
                let held = std::mem::take(&mut d.held);
                let held_any = std::mem::replace(&mut d.held_any, false);
                let held_trailers = d.held_trailers.take();
                let eos = d.eos_in && held_trailers.is_none();
                self.set_headers_state(sid, side, HeadersState::Passed);
                // Data held during StopAllIteration now reaches this filter.
                if held_any && self.open(sid) {
                    self.body_callback(sid, side, held, eos, false);
                }
                if let Some(t) = held_trailers {
                    if self.open(sid) {
                        self.trailers_in(sid, side, t);
                    }
                }
            }
            HeadersState::Stopped | HeadersState::Passed => {
                let was_stopped = d.headers == HeadersState::Stopped;
                let buffering = d.buffering;
                let trailers_stopped = d.trailers_stopped;
                let eos = d.eos_in;
                if trailers_stopped {
                    self.release_after_trailers(sid, side);
                    return;
                }
                if was_stopped {
                    if let Some(d) = self.dir(sid, side) {
                        d.headers = HeadersState::Passed;
                    }
                    if let Some(h) = self.host(sid) {
                        h.side_mut(side).headers_live = false;
                    }
                    self.pass_headers(sid, side);
                }
                if buffering {
                    if let Some(d) = self.dir(sid, side) {
                        d.buffering = false;
                    }
                    let body = self.take_body(sid, side);
                    self.pass_data(sid, side, body, eos);
                }
            }
        }
    }
}
