//! What leaves the filter: headers, data and trailers passed on, local
//! replies (through the filter or not), and the end of a stream.

use super::*;

impl SimEnvoy {
    pub(super) fn pass_headers(&mut self, sid: u64, side: Side) {
        let headers = self.host(sid).map(|h| h.side(side).headers.clone());
        let Some(s) = self.streams.get_mut(&sid) else {
            return;
        };
        let d = s.side_mut(side);
        if d.out_headers.is_some() {
            return;
        }
        d.out_headers = headers;
        let eos = d.headers_eos;
        if side == Side::Request {
            s.upstream_headers_sent = true;
            // The router picks the upstream host as the headers reach it.
            let address = self.upstream_address.clone();
            if let Some(o) = self.origin(sid) {
                o.upstream_address = Some(address);
            }
        }
        if eos {
            self.end_of_stream_out(sid, side);
        }
    }

    pub(super) fn pass_data(&mut self, sid: u64, side: Side, data: Vec<u8>, eos: bool) {
        let Some(d) = self.dir(sid, side) else { return };
        d.out_body.extend_from_slice(&data);
        if eos {
            self.end_of_stream_out(sid, side);
        }
    }

    pub(super) fn pass_trailers(&mut self, sid: u64, side: Side, trailers: Headers) {
        let Some(d) = self.dir(sid, side) else { return };
        d.out_trailers = trailers;
        self.end_of_stream_out(sid, side);
    }

    pub(super) fn end_of_stream_out(&mut self, sid: u64, side: Side) {
        let now = self.now_ns();
        let Some(s) = self.streams.get_mut(&sid) else {
            return;
        };
        let d = s.side_mut(side);
        if d.eos_out {
            return;
        }
        d.eos_out = true;
        match side {
            Side::Request => {
                if s.upstream == Upstream::NotYet {
                    let mut headers = s.req.out_headers.clone().unwrap_or_default();
                    if !self.suppress_envoy_headers && !self.route_timeout.is_zero() {
                        // The router tells the upstream how long it will wait.
                        headers.push((
                            "x-envoy-expected-rq-timeout-ms".into(),
                            self.route_timeout.as_millis().to_string(),
                        ));
                    }
                    let req = UpstreamRequest {
                        headers,
                        // The request is whole: its bytes move on (Envoy copies
                        // nothing here either).
                        body: std::mem::take(&mut s.req.out_body),
                        trailers: s.req.out_trailers.clone(),
                    };
                    s.upstream_request = Some(req.clone());
                    s.upstream = Upstream::Awaiting(req);
                    s.upstream_sent_ns = now;
                    self.upstream_calls += 1;
                }
            }
            Side::Response => self.finish(sid, false),
        }
    }

    /// Envoy's sendLocalReply for a stream: records `details` as the
    /// response code details (and the status as the response code, unless
    /// the response headers already went out and the stream is reset).
    pub(super) fn local_reply(
        &mut self,
        sid: u64,
        status: u16,
        body: Vec<u8>,
        extra: Headers,
        through_filter: bool,
        details: &str,
    ) {
        let reply = LocalReply {
            status,
            body,
            extra,
            details: details.to_string(),
            grpc_status: None,
        };
        self.local_reply_of(sid, reply, through_filter);
    }

    /// Envoy's sendLocalReply (see [`SimEnvoy::local_reply`]); for a gRPC
    /// request (`content-type: application/grpc...`) it answers as Envoy
    /// does: 200, `content-type: application/grpc`, `grpc-status` (the
    /// filter's, or mapped from the HTTP status), `grpc-message` (the body,
    /// percent-encoded), no body: a trailers-only response.
    pub(super) fn local_reply_of(&mut self, sid: u64, reply: LocalReply, through_filter: bool) {
        let LocalReply {
            status,
            body,
            extra,
            details,
            grpc_status,
        } = reply;
        let details = details.as_str();
        if !self.open(sid) {
            return;
        }
        let grpc = self.streams.get(&sid).is_some_and(|s| {
            header_get(&s.request.headers, "content-type")
                .is_some_and(|t| t.starts_with("application/grpc"))
        });
        if let Some(o) = self.origin(sid) {
            o.details = Some(details.to_string());
        }
        self.cancel_upstream(sid);
        let mut headers: Headers = vec![(":status".into(), status.to_string())];
        headers.extend(extra);
        let (status, body) = if grpc {
            grpc_local_reply(&mut headers, status, &body, grpc_status);
            (200, Vec::new())
        } else {
            (status, body)
        };
        if !body.is_empty() {
            headers.retain(|(k, _)| k != "content-length");
            headers.push(("content-length".into(), body.len().to_string()));
            if header_get(&headers, "content-type").is_none() {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let (started, committed) = {
            let s = &self.streams[&sid];
            (
                s.resp.headers != HeadersState::Pending,
                s.resp.out_headers.is_some(),
            )
        };
        if committed {
            // Headers already went to the client: Envoy can only reset.
            self.finish(sid, true);
            return;
        }
        let direct = started || !through_filter;
        if let Some(o) = self.origin(sid) {
            o.code = Some(status);
        }
        if let Some(s) = self.streams.get_mut(&sid) {
            s.local_reply = true;
            s.req.eos_in = true;
            // The request side is over: nothing more reaches the filter.
            s.req.headers = HeadersState::Passed;
            s.req.buffering = false;
            s.resp = Dir::new();
            if direct {
                s.bypass = true;
            }
        }
        if let Some(h) = self.host(sid) {
            h.req.headers_live = false;
            h.req.body_live = false;
            h.req.trailers_live = false;
            h.resp = Default::default();
        }
        let eos = body.is_empty();
        self.headers_in(sid, Side::Response, headers, eos);
        if !eos && self.open(sid) {
            self.data_in(sid, Side::Response, body, true);
        }
    }

    /// Ends the stream: `on_log`, `on_done`, `on_delete` (unless the VM has
    /// failed), and records what the client got.
    pub(super) fn finish(&mut self, sid: u64, reset: bool) {
        if !self.open(sid) {
            return;
        }
        let (w, ctx, created) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx, s.context_created)
        };
        let origin = self.origin(sid).map(|o| o.clone()).unwrap_or_default();
        let outcome = {
            let Some(s) = self.streams.get_mut(&sid) else {
                return;
            };
            let headers = s.resp.out_headers.clone().unwrap_or_default();
            let status = header_get(&headers, ":status")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            Response {
                status: if reset && s.resp.out_headers.is_none() {
                    0
                } else {
                    status
                },
                headers: headers
                    .into_iter()
                    .filter(|(k, _)| k != ":status")
                    .collect(),
                body: std::mem::take(&mut s.resp.out_body),
                upstream_called: s.upstream_request.is_some(),
                upstream_headers_sent: s.upstream_headers_sent,
                local_reply: s.local_reply,
                reset,
                upstream_request: s.upstream_request.clone(),
                code_details: origin.details,
                response_flags: origin.flags,
                upstream_address: origin.upstream_address,
            }
        };
        if let Some(s) = self.streams.get_mut(&sid) {
            s.outcome = Some(outcome);
            if matches!(s.upstream, Upstream::Awaiting(_) | Upstream::Silent) {
                s.upstream = Upstream::Cancelled;
            }
        }
        let run_vm = created && !self.vms[w].failed;
        if run_vm {
            if let Some(h) = self.host(sid) {
                h.log_phase = true;
            }
            self.invoke(w, ctx, |x| x.on_log.clone(), ctx as i32);
            if let Some(h) = self.host(sid) {
                h.log_phase = false;
            }
            self.invoke(w, ctx, |x| x.on_done.clone(), ctx as i32);
            self.invoke(w, ctx, |x| x.on_delete.clone(), ctx as i32);
        }
        self.vms[w].store.data_mut().streams.remove(&ctx);
        self.by_ctx.remove(&(w, ctx));
        let (d, _) = self.take_deferred(w);
        self.run_deferred(w, d);
    }
}
