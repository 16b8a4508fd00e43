//! The router's side of a stream: what reached the upstream, its reply,
//! resets, silence and the router's own local replies.

use super::*;

impl SimEnvoy {
    /// The request as it reached the upstream, while its reply is awaited.
    pub fn upstream_request(&self, id: StreamId) -> Option<UpstreamRequest> {
        match &self.streams.get(&id.0)?.upstream {
            Upstream::Awaiting(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// The upstream answers the stream's request with any [`Reply`]: a
    /// response, a reset before or after the headers, no answer (the route
    /// timeout fires when the clock gets there), or what Envoy answers
    /// instead (connection refused, no healthy upstream, a later filter's
    /// local reply...), each with Envoy's `response.code_details` and flags.
    pub fn respond(&mut self, id: StreamId, reply: Reply) -> Result<(), Error> {
        let s = self.stream(id)?;
        if !matches!(s.upstream, Upstream::Awaiting(_)) {
            return Err(Error::Usage(format!(
                "{id:?}: no upstream request is awaiting a reply (the filter has not let the \
                 whole request through, or it was answered already)"
            )));
        }
        let sid = id.0;
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Answered;
        }
        let flags = reply.flags;
        match reply.kind.clone() {
            ReplyKind::Response => self.upstream_response(sid, reply, true),
            ReplyKind::Reset => self.router_reply(
                sid,
                503,
                LOCAL_REPLY_RESET,
                code_details::CONNECTION_TERMINATION,
                response_flags::UC | flags,
            ),
            ReplyKind::ConnectFailure => self.router_reply(
                sid,
                503,
                LOCAL_REPLY_CONNECT_FAILURE,
                code_details::CONNECT_FAILURE,
                response_flags::UF | flags,
            ),
            ReplyKind::NoHealthyUpstream => {
                self.no_host(sid);
                self.router_reply(
                    sid,
                    503,
                    "no healthy upstream",
                    code_details::NO_HEALTHY_UPSTREAM,
                    response_flags::UH | flags,
                );
            }
            ReplyKind::Overflow => {
                self.no_host(sid);
                self.router_reply(
                    sid,
                    503,
                    LOCAL_REPLY_OVERFLOW,
                    code_details::OVERFLOW,
                    response_flags::UO | flags,
                );
            }
            ReplyKind::Local(details) => {
                self.no_host(sid);
                if let Some(o) = self.origin(sid) {
                    o.flags |= flags;
                }
                let body = reply.body_bytes();
                self.local_reply(sid, reply.status, body, reply.headers, true, &details);
            }
            ReplyKind::ResetAfterHeaders => {
                self.upstream_response(sid, reply, false);
                if self.open(sid) {
                    self.router_reply(
                        sid,
                        503,
                        LOCAL_REPLY_LATE_RESET,
                        code_details::RESET_AFTER_RESPONSE_STARTED,
                        response_flags::UPE | flags,
                    );
                }
            }
            ReplyKind::NoAnswerAfterHeaders => {
                self.upstream_response(sid, reply, false);
                if self.open(sid) {
                    self.go_silent(sid);
                }
            }
            ReplyKind::NoAnswer => self.go_silent(sid),
        }
        self.pump();
        Ok(())
    }

    /// The upstream says nothing more: the route timeout fires when the
    /// clock gets there.
    pub(super) fn go_silent(&mut self, sid: u64) {
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Silent;
        }
        let at = self.now_ns() + self.route_timeout.as_nanos() as u64;
        self.schedule(at, Event::RouteTimeout(sid));
    }

    /// The router answered without picking a host (no healthy upstream,
    /// overflow) or a filter before it answered: no `upstream.address`.
    pub(super) fn no_host(&mut self, sid: u64) {
        if let Some(o) = self.origin(sid) {
            o.upstream_address = None;
        }
    }

    pub(super) fn origin(&mut self, sid: u64) -> Option<&mut StreamOrigin> {
        self.host(sid).map(|h| &mut h.origin)
    }

    /// The upstream's response: headers, then the body chunks; `complete`
    /// false: the last chunk does not end the stream (the answer is cut).
    pub(super) fn upstream_response(&mut self, sid: u64, reply: Reply, complete: bool) {
        if let Some(o) = self.origin(sid) {
            o.details = Some(code_details::VIA_UPSTREAM.into());
            o.code = Some(reply.status);
            o.flags |= reply.flags;
        }
        // The router times the answer from the end of the request, unless
        // it is told to add no x-envoy-* header.
        let sent = self.streams.get(&sid).map_or(0, |s| s.upstream_sent_ns);
        let service_time = Duration::from_nanos(self.now_ns().saturating_sub(sent));
        let headers = reply.envoy_headers((!self.suppress_envoy_headers).then_some(service_time));
        let chunks: Vec<Vec<u8>> = reply.chunks.into_iter().filter(|c| !c.is_empty()).collect();
        self.headers_in(sid, Side::Response, headers, complete && chunks.is_empty());
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            if !self.open(sid) {
                break;
            }
            self.data_in(sid, Side::Response, chunk, complete && i + 1 == n);
        }
    }

    /// A local reply generated by the router (upstream reset, route
    /// timeout, no healthy upstream...): it passes through the filter's
    /// response callbacks, or resets the stream if the response headers
    /// already went to the client.
    pub(super) fn router_reply(
        &mut self,
        sid: u64,
        status: u16,
        body: &str,
        details: &str,
        flags: u64,
    ) {
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Answered;
        }
        if let Some(o) = self.origin(sid) {
            o.flags |= flags;
        }
        let headers = vec![("content-type".to_string(), "text/plain".to_string())];
        self.local_reply(
            sid,
            status,
            body.as_bytes().to_vec(),
            headers,
            true,
            details,
        );
    }

    pub(super) fn cancel_upstream(&mut self, sid: u64) {
        if let Some(s) = self.streams.get_mut(&sid) {
            if matches!(
                s.upstream,
                Upstream::Awaiting(_) | Upstream::Silent | Upstream::NotYet
            ) {
                s.upstream = Upstream::Cancelled;
            }
        }
    }
}
