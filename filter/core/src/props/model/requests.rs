//! The model's side of a request: starting it, its body, the decision, the forward.

use super::*;

impl World {
    pub(super) fn new(knobs: Knobs) -> Result<World, String> {
        let parse = |cap, step| {
            Config::parse(plugin_json(&knobs, cap, step).as_bytes())
                .map(Plugin::new)
                .map_err(|e| e.to_string())
        };
        let plugins = match knobs.reshard {
            // Proxy A's configuration, then proxy B's.
            Some((a, b)) => vec![parse(16, Some(a))?, parse(16, Some(b))?],
            None => vec![parse(16, None)?, parse(32, None)?],
        };
        let etcd = FakeEtcd::new();
        let shards: std::collections::HashMap<String, Arc<FakeEtcd>> = ["etcd_a", "etcd_b"]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    c.to_string(),
                    FakeEtcd::with_lease_ids_from(1_000_000 * (i as i64 + 1)),
                )
            })
            .collect();
        let shared = FakeShared::new();
        let envs = (0..4u64)
            .map(|w| {
                let mut e = FakeEnv::new(
                    match knobs.store {
                        StoreKind::Shared => shared.clone(),
                        StoreKind::Etcd => FakeShared::new(),
                    },
                    w + 1,
                );
                e.etcd = etcd.clone();
                e.etcd_clusters = shards.clone();
                e
            })
            .collect();
        Ok(World {
            knobs,
            plugins,
            envs,
            etcd,
            shards,
            now: START_MS,
            sims: Vec::new(),
            execs: Vec::new(),
            attempts: Vec::new(),
            answered: Vec::new(),
            trace: Vec::new(),
            seen: Seen::default(),
        })
    }

    /// The etcd a store call reaches: its shard's, or the one etcd.
    pub(super) fn etcd_of(&self, call: &StoreCall) -> Arc<FakeEtcd> {
        Arc::clone(self.shards.get(&call.route.cluster).unwrap_or(&self.etcd))
    }

    /// Shared data: workers 0-2 of one process. etcd: proxy A's workers, then proxy B's.
    pub(super) fn workers(&self) -> usize {
        match self.knobs.store {
            StoreKind::Shared => 3,
            StoreKind::Etcd if self.knobs.two_workers => 4,
            StoreKind::Etcd => 2,
        }
    }

    pub(super) fn skew(&self, worker: usize) -> u64 {
        match self.knobs.store {
            StoreKind::Etcd if worker >= self.workers() / 2 => self.knobs.skew_ms,
            _ => 0,
        }
    }

    /// The worker's clock set from the world's (etcd's) clock.
    pub(super) fn sync(&mut self, w: usize) {
        let skew = self.skew(w);
        let e = &mut self.envs[w];
        e.now_ms = self.now + skew;
        e.clock_ahead_ms = skew;
    }

    pub(super) fn log(&mut self, line: String) {
        self.trace
            .push(format!("t+{:>6} {line}", self.now - START_MS));
    }

    pub(super) fn pick(&self, s: u8, f: impl Fn(&Sim) -> bool) -> Option<usize> {
        let c: Vec<usize> = (0..self.sims.len()).filter(|i| f(&self.sims[*i])).collect();
        (!c.is_empty()).then(|| c[s as usize % c.len()])
    }

    pub(super) fn run(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Start {
                worker,
                scope,
                key,
                payload,
                bad,
                layout,
            } => self.start(
                worker as usize % self.workers(),
                match self.knobs.store {
                    StoreKind::Shared => layout as usize % 2,
                    // Each proxy on its own step of the resharding.
                    StoreKind::Etcd if self.knobs.reshard.is_some() => {
                        usize::from(worker as usize % self.workers() >= self.workers() / 2)
                    }
                    StoreKind::Etcd => 0,
                },
                (scope % 2, key % 2, payload % 9, bad),
            ),
            Op::Body { s } => match self.pick(s, |x| x.req == ReqPhase::AwaitBody && !x.ended) {
                Some(i) => self.body(i),
                None => Ok(()),
            },
            Op::Apply { s } => {
                match self.pick(s, |x| x.call.as_ref().is_some_and(|c| c.applied.is_none())) {
                    Some(i) => {
                        self.apply(i);
                        Ok(())
                    }
                    None => Ok(()),
                }
            }
            Op::Deliver { s, fate } => match self.pick(s, |x| x.call.is_some()) {
                Some(i) => self.deliver(i, fate),
                None => Ok(()),
            },
            Op::Respond { s, r } => {
                match self.pick(s, |x| {
                    x.exec.is_some() && x.resp == RespPhase::None && !x.ended
                }) {
                    Some(i) => self.respond(i, r),
                    None => Ok(()),
                }
            }
            Op::RespBody { s, trailers } => {
                match self.pick(s, |x| {
                    !x.ended && matches!(x.resp, RespPhase::Headers { done: false, .. })
                }) {
                    Some(i) => self.resp_body(i, trailers),
                    None => Ok(()),
                }
            }
            Op::End { s, why } => match self.pick(s, |x| !x.ended) {
                Some(i) => self.end(i, why),
                None => Ok(()),
            },
            Op::Tick { ms } => self.tick(ms as u64),
            Op::Zombie { c } => {
                if !self.answered.is_empty() {
                    let (call, j) = self.answered[c as usize % self.answered.len()].clone();
                    let (status, _) = self.etcd_of(&call).handle(call.path, &call.body, self.now);
                    // An old claim applied again may stand as a claim no stream holds.
                    if etcd::is_txn(call.path) {
                        self.sims[j].zombie = true;
                        self.sims[j].claim_applied = true;
                    }
                    self.log(format!("etcd applies an old {} again: {status}", call.path));
                }
                Ok(())
            }
        }
    }

    /// Starts a request on `worker` under configuration `plugin`; `who` is its scope, key,
    /// payload and what is wrong with it.
    pub(super) fn start(&mut self, worker: usize, plugin: usize, who: Who) -> Result<(), String> {
        let (scope, key, payload, bad) = who;
        let mut head = RequestHead {
            method: if bad == Some(Bad::Get) { "GET" } else { "POST" }.into(),
            path: "/orders?x=1".into(),
            authority: "api.example".into(),
            headers: vec![("x-tenant".into(), format!("tenant-{scope}").into_bytes())],
            protocol: String::new(),
            properties: Vec::new(),
        };
        if caller_of(payload) < 2 {
            let auth = format!("Bearer caller-{}", caller_of(payload));
            head.headers
                .push(("authorization".into(), auth.into_bytes()));
        }
        if bad != Some(Bad::NoKey) {
            head.headers
                .push(("idempotency-key".into(), format!("key-{key}").into_bytes()));
        }
        if bad == Some(Bad::TwoKeys) {
            head.headers
                .push(("idempotency-key".into(), format!("key-{key}").into_bytes()));
        }
        if bad == Some(Bad::TwoScopes) {
            head.headers.push(("x-tenant".into(), "tenant-x".into()));
        }
        let i = self.sims.len();
        self.log(format!(
            "stream {i}: start on worker {worker}, scope {scope}, key {key}, payload {payload}{}{}",
            bad.map(|b| format!(", {b:?}")).unwrap_or_default(),
            if plugin == 1 { ", layout 2" } else { "" },
        ));
        self.sims.push(Sim {
            worker,
            scope,
            key,
            payload,
            bad,
            plugin,
            s: DedupStream::new(i as u32),
            req: ReqPhase::AwaitBody,
            call: None,
            exec: None,
            resp: RespPhase::None,
            ended: false,
            faulted: false,
            claim_applied: false,
            claim_sent: None,
            failed_open_before: self.envs[worker].count_of(Counter::FailedOpen),
            zombie: false,
        });
        self.seen.requests += 1;
        self.sync(worker);
        let eos = body_of(payload) == 0;
        if eos {
            self.attempt(i);
        }
        let demand = self.demanded(i);
        let sim = &mut self.sims[i];
        let action =
            sim.s
                .on_request_headers(&self.plugins[plugin], &mut self.envs[worker], head, eos);
        if !eos && action == Decision::Pause {
            return Ok(());
        }
        self.sims[i].req = ReqPhase::Deciding;
        if eos {
            self.check_demand(i, demand, &action)?;
        }
        self.decided(i, action)
    }

    pub(super) fn body(&mut self, i: usize) -> Result<(), String> {
        let (w, p) = (self.sims[i].worker, self.sims[i].plugin);
        let body = format!("body-{}", body_of(self.sims[i].payload)).into_bytes();
        self.log(format!("stream {i}: request body"));
        self.sync(w);
        self.sims[i].req = ReqPhase::Deciding;
        self.attempt(i);
        let demand = self.demanded(i);
        let len = body.len();
        let action =
            self.sims[i]
                .s
                .on_request_body(&self.plugins[p], &mut self.envs[w], len, true, || {
                    Some(body)
                });
        self.check_demand(i, demand, &action)?;
        self.decided(i, action)
    }

    pub(super) fn attempt(&mut self, i: usize) {
        let x = &self.sims[i];
        if x.bad.is_none() {
            self.attempts.push(Attempt {
                stream: i,
                scope: x.scope,
                key: x.key,
                payload: x.payload,
                at: self.now,
            });
        }
    }

    /// A request-path decision (or, for a client already gone, whatever its claim did).
    pub(super) fn decided(&mut self, i: usize, action: Decision) -> Result<(), String> {
        if let Decision::Call(call) = action {
            if self.knobs.store == StoreKind::Shared {
                return Err(format!("stream {i}: a store call with shared data"));
            }
            self.sims[i].call = Some(Pending::sent(call, self.now));
            return Ok(());
        }
        self.sims[i].req = ReqPhase::Decided;
        if self.sims[i].ended {
            // The client left while the claim was decided: nothing may be forwarded,
            // and a claim won meanwhile must not stay held by a stream that is gone.
            if self.sims[i].s.holds_claim() {
                return Err(format!(
                    "stream {i}: its client left, yet it holds a claim nobody will settle"
                ));
            }
            self.count_reply(&action);
            self.log(format!(
                "stream {i}: (client gone) decided {}",
                short(&action)
            ));
            return Ok(());
        }
        self.log(format!("stream {i}: decided {}", short(&action)));
        let bad = self.sims[i].bad;
        match (&action, bad) {
            (Decision::Pause, _) => Err(format!("stream {i}: paused after its whole request")),
            (Decision::Call(_), _) => Ok(()),
            (Decision::Upstream(_), _) => Err(format!(
                "stream {i}: a detached call, though the model configures none"
            )),
            (Decision::Continue, Some(Bad::Get)) => {
                self.seen.bypassed += 1;
                if self.sims[i].s.holds_claim() {
                    return Err(format!("stream {i}: a GET claimed a key"));
                }
                Ok(())
            }
            (Decision::Reply(r), Some(b)) if b != Bad::Get => {
                self.seen.bad_key += 1;
                let want = match b {
                    Bad::NoKey => "missing-key",
                    Bad::TwoKeys => "ambiguous-key",
                    _ => "ambiguous-scope",
                };
                let got = problem_slug(r);
                let reply = r.clone();
                self.local_reply_passes(i, &reply)?;
                if r.status != 400 || got != want {
                    return Err(format!(
                        "stream {i}: {b:?} answered {} {got}, not 400 {want}",
                        r.status
                    ));
                }
                Ok(())
            }
            (_, Some(b)) => Err(format!(
                "stream {i}: {b:?} request decided {}",
                short(&action)
            )),
            (Decision::Continue, None) => self.forwarded(i),
            (Decision::Reply(r), None) => {
                let r = r.clone();
                self.count_reply(&action);
                self.check_reply(i, &r)?;
                self.local_reply_passes(i, &r)
            }
        }
    }

    pub(super) fn count_reply(&mut self, action: &Decision) {
        if let Decision::Reply(r) = action {
            if r.header("idempotent-replayed").is_some() {
                self.seen.replayed += 1;
            } else {
                match problem_slug(r).as_str() {
                    "in-flight" => self.seen.in_flight += 1,
                    "payload-mismatch" | "principal-mismatch" => self.seen.mismatch += 1,
                    _ => {}
                }
            }
        }
    }

    /// Envoy runs the filter's response callbacks on its own local reply too: nothing
    /// is stored or released for it.
    pub(super) fn local_reply_passes(&mut self, i: usize, r: &LocalReply) -> Result<(), String> {
        let (w, p) = (self.sims[i].worker, self.sims[i].plugin);
        let own = origin(r.details, 0);
        let plugin = &self.plugins[p];
        let env = &mut self.envs[w];
        let s = &mut self.sims[i].s;
        let a = s.on_response_headers(plugin, env, r.status, &own, || r.headers.clone(), false);
        let b = s.on_response_body(plugin, env, &r.body, true);
        let c = s.on_stream_end(plugin, env, &own);
        self.sims[i].ended = true;
        match (a, b, c) {
            (None, None, None) => Ok(()),
            other => Err(format!(
                "stream {i}: its own local reply made store calls {other:?}"
            )),
        }
    }

    /// Executions of this identity (scope, key) in the model.
    pub(super) fn execs_of(&self, scope: u8, key: u8) -> impl Iterator<Item = (usize, &Exec)> {
        self.execs
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.scope == scope && e.key == key)
    }

    /// Whether an execution's claim may still be live at `now` for a reader with `clock`.
    pub(super) fn blocks(&self, e: &Exec, clock: u64) -> bool {
        let in_flight = self.now < e.forward_at + IN_FLIGHT_MS;
        // Under "keep" a claim lives until its TTL unless settled: by the holder's clock
        // (shared data), by the completed lease from the claim (etcd). A margin of the
        // in-flight time covers the claim preceding the forward.
        let kept =
            self.knobs.unknown == Unknown::Keep && self.now + IN_FLIGHT_MS < e.forward_at + TTL_MS;
        match &e.state {
            ExecState::Running | ExecState::Kept { .. } => in_flight || kept,
            ExecState::Held => in_flight,
            ExecState::Released => false,
            ExecState::Completed { expires, sure, .. } => {
                in_flight || (*sure && clock < *expires) || (!*sure && kept)
            }
        }
    }

    pub(super) fn forwarded(&mut self, i: usize) -> Result<(), String> {
        if !self.sims[i].s.holds_claim() {
            // Passed without a claim: only a failing store under failure_mode "open".
            if self.knobs.closed || !self.sims[i].faulted {
                return Err(format!(
                    "stream {i}: passed through without a claim (failed open) though {}",
                    if self.knobs.closed {
                        "failure_mode is closed"
                    } else {
                        "the store never failed it"
                    }
                ));
            }
            return Ok(());
        }
        self.seen.executed += 1;
        let (scope, key, payload, w) = {
            let x = &self.sims[i];
            (x.scope, x.key, x.payload, x.worker)
        };
        let clock = self.now + self.skew(w);
        let live: Vec<usize> = self
            .execs_of(scope, key)
            .filter(|(_, e)| self.blocks(e, clock))
            .map(|(n, _)| n)
            .collect();
        // Mid-resharding, a check of the other map that failed under failure_mode
        // "open" forwards with its claim kept: a failing store may let it run twice,
        // as any request failed open.
        let x = &self.sims[i];
        let unchecked = self.knobs.reshard.is_some()
            && !self.knobs.closed
            && x.faulted
            && self.envs[w].count_of(Counter::FailedOpen) > x.failed_open_before;
        if let (Some(n), false) = (live.first(), unchecked) {
            let e = &self.execs[*n];
            return Err(format!(
                "stream {i}: executed scope {scope} key {key} while execution {n} (stream {}, forwarded at t+{}, {:?}) could still be live: twice",
                e.stream,
                e.forward_at - START_MS,
                e.state
            ));
        }
        let n = self.execs.len();
        self.execs.push(Exec {
            stream: i,
            scope,
            key,
            payload,
            forward_at: self.now,
            claim_ends: self.sims[i].claim_sent.unwrap_or(self.now) + self.skew(w) + IN_FLIGHT_MS,
            state: ExecState::Running,
        });
        self.sims[i].exec = Some(n);
        self.log(format!("stream {i}: execution {n}"));
        Ok(())
    }
}
