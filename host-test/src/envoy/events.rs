//! The virtual clock and what it drives: ready and timed events, callout
//! and gRPC deliveries, ticks, route timeouts.

use super::*;

impl SimEnvoy {
    pub(super) fn now_ns(&self) -> u64 {
        lock(&self.shared).now_ns
    }

    pub(super) fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.timed.push((at, self.seq, event));
    }

    pub(super) fn set_clock(&mut self, at: u64) {
        let mut sh = lock(&self.shared);
        if at > sh.now_ns {
            let delta = at - sh.now_ns;
            sh.now_ns = at;
            sh.monotonic_ns += delta;
        }
    }

    /// Delivers everything ready now: callout responses, queue
    /// notifications, route timeouts.
    pub(super) fn pump(&mut self) {
        loop {
            self.poll_grpc_streams();
            let queued: Vec<(usize, u32, u32)> =
                std::mem::take(&mut lock(&self.shared).queue_ready);
            for (worker, ctx, token) in queued {
                self.ready
                    .push_back(Event::QueueReady { worker, ctx, token });
            }
            let Some(event) = self.ready.pop_front() else {
                break;
            };
            match event {
                Event::Callout {
                    worker,
                    token,
                    response,
                } => self.deliver_callout(worker, token, response),
                Event::Grpc {
                    worker,
                    token,
                    events,
                } => self.deliver_grpc(worker, token, events),
                Event::QueueReady { worker, ctx, token } => {
                    if worker < self.vms.len() {
                        self.invoke(
                            worker,
                            ctx,
                            |x| x.on_queue_ready.clone(),
                            (ctx as i32, token as i32),
                        );
                        let (d, _) = self.take_deferred(worker);
                        self.run_deferred(worker, d);
                    }
                }
                Event::RouteTimeout(sid) => {
                    if self
                        .streams
                        .get(&sid)
                        .is_some_and(|s| s.upstream == Upstream::Silent)
                    {
                        self.router_reply(
                            sid,
                            504,
                            "upstream request timeout",
                            code_details::RESPONSE_TIMEOUT,
                            response_flags::UT,
                        );
                    }
                }
            }
        }
    }

    pub(super) fn deliver_callout(&mut self, worker: usize, token: u32, response: Option<Reply>) {
        let (nh, body_len, nt) = {
            let s = self.vms[worker].store.data_mut();
            match response {
                Some(reply) => {
                    // The async client's router times every upstream answer
                    // (in process: its virtual delay).
                    let timed = reply.kind == ReplyKind::Response;
                    let headers = reply.envoy_headers(timed.then_some(reply.delay));
                    let body = reply.body_bytes();
                    let counts = (headers.len(), body.len(), 0);
                    s.callout_response = Some(CalloutResponse {
                        headers,
                        body,
                        trailers: Vec::new(),
                    });
                    counts
                }
                None => {
                    s.callout_response = None;
                    (0, 0, 0)
                }
            }
        };
        let root = self.vms[worker].store.data().root_id as i32;
        self.invoke(
            worker,
            root as u32,
            |x| x.on_http_call_response.clone(),
            (root, token as i32, nh as i32, body_len as i32, nt),
        );
        self.vms[worker].store.data_mut().callout_response = None;
        let (d, _) = self.take_deferred(worker);
        self.run_deferred(worker, d);
    }

    /// Ticks every VM whose timer is due, in Envoy's order: the main
    /// thread's VM first (Envoy starts it before the workers', so its
    /// timer fires first within a period), then the workers' by index.
    pub(super) fn fire_ticks(&mut self, now: u64) {
        let main = (self.vms.len() > self.workers).then_some(self.workers);
        let order: Vec<usize> = main.into_iter().chain(0..self.workers).collect();
        for worker in order {
            let Some((at, period)) = self.ticks[worker] else {
                continue;
            };
            if at > now || self.vms[worker].failed {
                continue;
            }
            self.ticks[worker] = Some((now + period, period));
            let root = self.vms[worker].store.data().root_id;
            self.invoke(worker, root, |x| x.on_tick.clone(), root as i32);
            let (d, _) = self.take_deferred(worker);
            self.run_deferred(worker, d);
            self.pump();
        }
    }

    pub(super) fn next_deadline(&self) -> Option<u64> {
        let ticks = self
            .ticks
            .iter()
            .enumerate()
            .filter(|(w, _)| !self.vms[*w].failed)
            .filter_map(|(_, t)| t.map(|t| t.0));
        let timed = self.timed.iter().map(|t| t.0);
        ticks.chain(timed).min()
    }

    /// Moves the virtual clock forward, firing ticks, callout timeouts and
    /// route timeouts in order as their time comes.
    pub fn advance(&mut self, by: Duration) {
        let target = self.now_ns() + by.as_nanos() as u64;
        self.advance_to(target);
    }

    pub(super) fn advance_to(&mut self, target: u64) {
        self.pump();
        while let Some(next) = self.next_deadline() {
            if next > target {
                break;
            }
            self.set_clock(next);
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.timed)
                .into_iter()
                .partition(|t| t.0 <= next);
            self.timed = later;
            let mut due = due;
            due.sort_by_key(|t| (t.0, t.1));
            for (_, _, e) in due {
                self.ready.push_back(e);
            }
            self.pump();
            self.fire_ticks(next);
        }
        self.set_clock(target);
        self.pump();
    }
}
