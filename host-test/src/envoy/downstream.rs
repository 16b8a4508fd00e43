//! The client's side of a stream: starting it, sending its headers, body
//! chunks and trailers, hanging up, and whole requests driven to the end.

use super::*;

impl SimEnvoy {
    /// Opens a stream on `worker` without sending anything yet.
    pub fn start(&mut self, worker: usize, request: Request) -> Result<StreamId, Error> {
        if self.singleton {
            return Err(Error::Usage(
                "a bootstrap singleton service has no worker and serves no stream".into(),
            ));
        }
        if worker >= self.workers {
            return Err(Error::Usage(format!(
                "worker {worker} does not exist ({} workers)",
                self.workers
            )));
        }
        let sid = self.next_stream;
        self.next_stream += 1;
        let ctx = self.next_ctx[worker];
        self.next_ctx[worker] += 1;
        let mut host = StreamHost::new(request.source_address.clone());
        host.metadata = self.filter_metadata.clone();
        for (ns, v) in &request.filter_metadata {
            host.metadata.retain(|(n, _)| n != ns);
            host.metadata.push((ns.clone(), v.clone()));
        }
        for (path, value) in self.properties.iter().chain(&request.properties) {
            host.properties.insert(path.join("\0"), value.clone());
        }
        self.vms[worker].store.data_mut().streams.insert(ctx, host);
        self.by_ctx.insert((worker, ctx), sid);
        self.streams.insert(
            sid,
            StreamDriver {
                worker,
                ctx,
                request,
                headers_sent: false,
                next_chunk: 0,
                trailers_sent: false,
                req: Dir::new(),
                resp: Dir::new(),
                upstream: Upstream::NotYet,
                upstream_request: None,
                upstream_sent_ns: 0,
                upstream_headers_sent: false,
                local_reply: false,
                bypass: false,
                context_created: false,
                outcome: None,
            },
        );
        Ok(StreamId(sid))
    }

    pub(super) fn stream(&self, id: StreamId) -> Result<&StreamDriver, Error> {
        self.streams
            .get(&id.0)
            .ok_or_else(|| Error::Usage(format!("unknown stream {id:?}")))
    }

    fn stream_mut(&mut self, id: StreamId) -> Result<&mut StreamDriver, Error> {
        self.streams
            .get_mut(&id.0)
            .ok_or_else(|| Error::Usage(format!("unknown stream {id:?}")))
    }

    pub(super) fn open(&self, sid: u64) -> bool {
        self.streams.get(&sid).is_some_and(|s| s.outcome.is_none())
    }

    pub(super) fn host(&mut self, sid: u64) -> Option<&mut StreamHost> {
        let s = self.streams.get(&sid)?;
        let (w, ctx) = (s.worker, s.ctx);
        self.vms[w].store.data_mut().streams.get_mut(&ctx)
    }

    pub(super) fn dir(&mut self, sid: u64, side: Side) -> Option<&mut Dir> {
        let s = self.streams.get_mut(&sid)?;
        Some(s.side_mut(side))
    }

    /// Sends the request headers (end of stream if there is no body).
    pub fn send_headers(&mut self, id: StreamId) -> Result<(), Error> {
        let s = self.stream(id)?;
        if s.headers_sent {
            return Err(Error::Usage(format!("{id:?}: headers already sent")));
        }
        let sid = id.0;
        let request_id = format!("00000000-0000-4000-8000-{:012}", sid);
        let (headers, eos) = {
            let s = &self.streams[&sid];
            (
                s.request.envoy_headers(&request_id),
                s.request.chunks.is_empty() && s.request.trailers.is_empty(),
            )
        };
        if let Some(s) = self.streams.get_mut(&sid) {
            s.headers_sent = true;
        }
        if !self.open(sid) {
            return Ok(());
        }
        self.headers_in(sid, Side::Request, headers, eos);
        self.pump();
        Ok(())
    }

    /// Sends the next body chunk; returns whether more chunks remain.
    pub fn send_chunk(&mut self, id: StreamId) -> Result<bool, Error> {
        let s = self.stream(id)?;
        if !s.headers_sent {
            return Err(Error::Usage(format!("{id:?}: send the headers first")));
        }
        let Some(chunk) = s.request.chunks.get(s.next_chunk).cloned() else {
            return Ok(false);
        };
        let last = s.next_chunk + 1 == s.request.chunks.len();
        let eos = last && s.request.trailers.is_empty();
        let sid = id.0;
        if let Some(s) = self.streams.get_mut(&sid) {
            s.next_chunk += 1;
        }
        if self.open(sid) {
            self.data_in(sid, Side::Request, chunk, eos);
            self.pump();
        }
        Ok(!last)
    }

    /// Sends all remaining body chunks.
    pub fn send_body(&mut self, id: StreamId) -> Result<(), Error> {
        while self.send_chunk(id)? {}
        Ok(())
    }

    /// Sends the request trailers, if the request has any.
    pub fn send_trailers(&mut self, id: StreamId) -> Result<(), Error> {
        let s = self.stream(id)?;
        if s.trailers_sent || s.request.trailers.is_empty() {
            return Ok(());
        }
        if s.next_chunk < s.request.chunks.len() {
            return Err(Error::Usage(format!("{id:?}: send the body first")));
        }
        let trailers = s.request.trailers.clone();
        if let Some(s) = self.streams.get_mut(&id.0) {
            s.trailers_sent = true;
        }
        if self.open(id.0) {
            self.trailers_in(id.0, Side::Request, trailers);
            self.pump();
        }
        Ok(())
    }

    /// Sends whatever of the request is not sent yet.
    pub fn send_request(&mut self, id: StreamId) -> Result<(), Error> {
        if !self.stream(id)?.headers_sent {
            self.send_headers(id)?;
        }
        self.send_body(id)?;
        self.send_trailers(id)
    }

    /// The client resets the stream: no response; the filter still gets
    /// `on_log`, `on_done` and `on_delete`.
    ///
    /// What `on_log` reads then is Envoy's: `response.code_details`
    /// `downstream_remote_disconnect`, flag DC added, `response.code` only
    /// if response headers had come, `upstream.address` if the request had
    /// reached the router.
    pub fn reset_client(&mut self, id: StreamId) -> Result<(), Error> {
        self.stream(id)?;
        if self.open(id.0) {
            if let Some(o) = self.origin(id.0) {
                o.details = Some(code_details::DOWNSTREAM_REMOTE_DISCONNECT.into());
                o.flags |= response_flags::DC;
            }
        }
        self.cancel_upstream(id.0);
        self.finish(id.0, true);
        self.pump();
        Ok(())
    }

    /// Drives a stream to its end: sends the rest of the request, lets the
    /// default upstream answer, waits (in virtual time) for callouts and
    /// timeouts. A stream the filter holds with nothing pending is
    /// [`Error::Stalled`] (it stays open: inspect it, advance, or reset it).
    pub fn finish_stream(&mut self, id: StreamId) -> Result<Response, Error> {
        self.send_request(id)?;
        const REAL_WAIT: Duration = Duration::from_secs(10);
        let mut waited = Duration::ZERO;
        loop {
            self.pump();
            if let Some(r) = self.stream_mut(id)?.outcome.take() {
                self.forget(id);
                return Ok(r);
            }
            // The default upstream reads the request where it waits (no copy).
            let reply = match self.streams.get(&id.0).map(|s| &s.upstream) {
                Some(Upstream::Awaiting(req)) => Some((self.upstream)(req)),
                _ => None,
            };
            if let Some(reply) = reply {
                self.respond(id, reply)?;
                continue;
            }
            match self.timed.iter().map(|t| t.0).min() {
                Some(next) => self.advance_to(next),
                None if self.grpc_streams_open() && waited < REAL_WAIT => {
                    // A gRPC stream on a real server may still answer.
                    std::thread::sleep(Duration::from_millis(5));
                    waited += Duration::from_millis(5);
                }
                None => {
                    return Err(Error::Stalled {
                        stream: id,
                        waiting: self.describe(id.0),
                    })
                }
            }
        }
    }

    /// Sends `request` on `worker` and drives it to the end (see
    /// [`SimEnvoy::finish_stream`]).
    pub fn request(&mut self, worker: usize, request: Request) -> Result<Response, Error> {
        let id = self.start(worker, request)?;
        self.finish_stream(id)
    }

    pub(super) fn describe(&self, sid: u64) -> String {
        let Some(s) = self.streams.get(&sid) else {
            return "unknown stream".into();
        };
        let side = |d: &Dir, name: &str| -> Option<String> {
            if d.trailers_stopped {
                return Some(format!(
                    "the filter paused the {name} trailers and never resumed"
                ));
            }
            match d.headers {
                HeadersState::StoppedAll => Some(format!(
                    "the filter paused the {name} headers; Envoy turned it into StopAllIteration \
                     (allow_on_headers_stop_iteration is false), so no body callback comes until \
                     the filter resumes the stream, and it never does"
                )),
                HeadersState::Stopped if !d.buffering => Some(format!(
                    "the filter paused the {name} headers and never resumed"
                )),
                _ if d.buffering && d.eos_in => Some(format!(
                    "the filter paused the {name} body at end of stream and never resumed"
                )),
                _ => None,
            }
        };
        let what = side(&s.req, "request")
            .or_else(|| side(&s.resp, "response"))
            .unwrap_or_else(|| "the stream waits for an event that will not come".into());
        if self.held_callouts.is_empty() {
            what
        } else {
            format!(
                "{what} ({} callout answers are held: release_callouts)",
                self.held_callouts.len()
            )
        }
    }

    pub(super) fn forget(&mut self, id: StreamId) {
        self.streams.remove(&id.0);
    }

    /// Where the stream stands.
    pub fn state(&self, id: StreamId) -> Result<StreamState, Error> {
        let s = self.stream(id)?;
        Ok(if s.outcome.is_some() {
            StreamState::Done
        } else if matches!(s.upstream, Upstream::Awaiting(_)) {
            StreamState::AwaitingUpstream
        } else {
            StreamState::Open
        })
    }

    /// What the client got, once the stream is done.
    pub fn response(&self, id: StreamId) -> Option<Response> {
        self.streams.get(&id.0)?.outcome.clone()
    }
}
