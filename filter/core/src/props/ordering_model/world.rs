//! The operations applied to the plugin: requests, answers, ends, clock moves, and the
//! faults and races around them.

use super::*;

/// A racing request that ran: its stream, decision, delivery and worker, and whether it
/// ran at the operation's second write.
type Raced = (DedupStream, Decision, Delivery, FakeEnv, bool);

impl World {
    pub(super) fn new(knobs: Knobs) -> Result<World, String> {
        let config = Config::parse(plugin_json(&knobs).as_bytes()).map_err(|e| e.to_string())?;
        let plugin = Plugin::new(config);
        let shared = FakeShared::new();
        let envs = (0..2u64)
            .map(|w| FakeEnv::new(shared.clone(), w + 1))
            .collect();
        let policy = &plugin.config.policy;
        let o = policy.ordering.as_ref().ok_or("no ordering")?;
        let body = BodyHasher::default().finish();
        let digests = (0..ENTITIES as u8)
            .map(|e| {
                crate::ordering::ordered(policy, o, &head_of((e, 1, 0)), b"", &body)
                    .map(|x| x.entity)
                    .map_err(|e| format!("{e:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(World {
            knobs,
            plugin,
            shared,
            envs,
            now: START_MS,
            sims: Vec::new(),
            execs: Vec::new(),
            recs: HashMap::new(),
            ents: (0..ENTITIES).map(|_| Ent::default()).collect(),
            digests,
            armed: None,
            trace: Vec::new(),
            seen_stale: 0,
            seen_executed: 0,
        })
    }

    pub(super) fn log(&mut self, line: String) {
        self.trace
            .push(format!("t+{:>6} {line}", self.now - START_MS));
    }

    fn pick(&self, s: u8, f: impl Fn(&Sim) -> bool) -> Option<usize> {
        let c: Vec<usize> = (0..self.sims.len()).filter(|i| f(&self.sims[*i])).collect();
        (!c.is_empty()).then(|| c[s as usize % c.len()])
    }

    pub(super) fn run(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Start {
                worker,
                entity,
                version,
                copy,
                fault,
            } => self.start(worker as usize % 2, (entity, version, copy), fault)?,
            Op::Respond { s, r, fault } => {
                if let Some(i) = self.pick(s, |x| x.life == Life::Executing) {
                    self.respond(i, r, fault)?;
                }
            }
            Op::End { s, why, fault } => {
                if let Some(i) = self.pick(s, |x| x.life == Life::Executing) {
                    self.end(i, why, fault)?;
                }
            }
            Op::Tick { ms } => {
                self.now += u64::from(ms);
                self.log(format!("clock +{ms} ms"));
            }
            Op::Race {
                entity,
                version,
                copy,
                at_write,
            } => {
                self.log(format!(
                    "a request of entity {entity} version {version} (key {copy}) races the next operation's write {at_write}"
                ));
                self.armed = Some(((entity, version, copy), at_write));
            }
        }
        self.forget_unsure();
        self.check_store()
    }

    /// Runs `f` (one operation on the plugin) under `fault`, or with the armed race
    /// slipped before its first write; returns the racer's stream and decision if it ran.
    fn perform<T>(
        &mut self,
        key: Delivery,
        fault: Fault,
        f: impl FnOnce(&mut World) -> T,
    ) -> (T, Option<Raced>) {
        for e in &mut self.envs {
            e.now_ms = self.now;
        }
        let mut racer = None;
        match fault {
            Fault::None => {
                if let Some((d, at_write)) = self.armed.take() {
                    let mut env = FakeEnv::new(self.shared.clone(), 1 + self.envs.len() as u64);
                    env.now_ms = self.now;
                    let cell = Arc::new(Mutex::new(Racer {
                        plugin: self.plugin.clone(),
                        env: Some(env),
                        head: head_of(d),
                        ran: None,
                    }));
                    let c = cell.clone();
                    let race = move || {
                        let mut r = c.lock().unwrap();
                        let ran = {
                            let Racer {
                                plugin, env, head, ..
                            } = &mut *r;
                            env.as_mut().map(|env| {
                                let mut s = DedupStream::new(1000);
                                let decision =
                                    s.on_request_headers(plugin, env, head.clone(), true);
                                (s, decision)
                            })
                        };
                        r.ran = ran;
                    };
                    let second = at_write == 2 && d != key;
                    if second {
                        let shared = self.shared.clone();
                        let mut race = Some(race);
                        self.shared.before_next_set(move || {
                            if let Some(race) = race.take() {
                                shared.before_next_set(race);
                            }
                        });
                    } else {
                        self.shared.before_next_set(race);
                    }
                    racer = Some((cell, d, second));
                }
            }
            Fault::Whole => self.shared.set_failing(true),
            Fault::FromWrite(n) => fail_from(&self.shared, n),
        }
        let out = f(self);
        self.shared.set_failing(false);
        // Disarm whatever did not fire (and drop the hooks' handles on the store).
        self.shared.before_next_set(|| {});
        let ran = racer.and_then(|(cell, d, second)| {
            let mut r = cell.lock().unwrap();
            let (s, decision) = r.ran.take()?;
            Some((s, decision, d, r.env.take()?, second))
        });
        (out, ran)
    }

    /// A racing request that ran inside the last operation: it came first.
    fn adopt(&mut self, ran: Option<Raced>) -> Result<(), String> {
        let Some((s, decision, d, env, _)) = ran else {
            return Ok(());
        };
        let worker = self.envs.len();
        self.envs.push(env);
        let i = self.push_sim(worker, d, s);
        self.log(format!(
            "stream {i}: (racing) entity {} version {} key {} on worker {worker}",
            d.0, d.1, d.2
        ));
        self.decided(i, decision, Fault::None, false)
    }

    fn push_sim(&mut self, worker: usize, d: Delivery, s: DedupStream) -> usize {
        self.sims.push(Sim {
            worker,
            d,
            s,
            life: Life::Answered,
            forwarded: None,
            exec: None,
        });
        self.sims.len() - 1
    }

    fn start(&mut self, worker: usize, d: Delivery, fault: Fault) -> Result<(), String> {
        let mut s = DedupStream::new(self.sims.len() as u32);
        let opened = self.envs[worker].count_of(Counter::FailedOpen);
        let head = head_of(d);
        let (decision, mut ran) = self.perform(d, fault, |w| {
            s.on_request_headers(&w.plugin, &mut w.envs[worker], head, true)
        });
        // A race at the second write: before the entity's CAS if the request was
        // forwarded, or refused as busy by the racer's flight (the CAS failed, the claim
        // read again); else after its decision (the second write was its record's
        // release), and the request came first.
        let busy_by_racer = |r: &Raced| {
            let busy = matches!(&decision, Decision::Reply(x)
                if problem(x).0 == "in-flight" && problem(x).1.contains("of this entity"));
            busy && r.1 == Decision::Continue && r.2 .0 == d.0
        };
        let after = ran
            .as_ref()
            .is_some_and(|r| r.4 && decision != Decision::Continue && !busy_by_racer(r));
        if !after {
            self.adopt(ran.take())?;
        }
        let failed_open = self.envs[worker].count_of(Counter::FailedOpen) > opened;
        let i = self.push_sim(worker, d, s);
        self.log(format!(
            "stream {i}: entity {} version {} key {} on worker {worker}{}",
            d.0,
            d.1,
            d.2,
            if fault == Fault::None {
                String::new()
            } else {
                format!(", store fault {fault:?}")
            }
        ));
        self.decided(i, decision, fault, failed_open)?;
        self.adopt(ran)
    }

    /// Envoy runs the response callbacks on the filter's own local reply too: nothing is
    /// settled for it.
    pub(super) fn local_reply_passes(&mut self, i: usize, r: &LocalReply) -> Result<(), String> {
        let w = self.sims[i].worker;
        let own = origin(r.details, 0);
        let (plugin, env, s) = (&self.plugin, &mut self.envs[w], &mut self.sims[i].s);
        let a = s.on_response_headers(plugin, env, r.status, &own, || r.headers.clone(), false);
        let b = s.on_response_body(plugin, env, &r.body, true);
        let c = s.on_stream_end(plugin, env, &own);
        match (a, b, c) {
            (None, None, None) => Ok(()),
            other => Err(format!(
                "stream {i}: its own local reply made store calls {other:?}"
            )),
        }
    }

    fn respond(&mut self, i: usize, r: Resp, fault: Fault) -> Result<(), String> {
        let n = self.sims[i].exec.unwrap_or(0);
        let (status, o) = match r {
            Resp::Stored(s) | Resp::NotStored(s) => (s, Origin::upstream()),
            Resp::NotSent => (503, origin("no_healthy_upstream", flags::UH)),
            Resp::Unknown => (504, origin("response_timeout", flags::UT)),
        };
        let w = self.sims[i].worker;
        let pairs = vec![
            (":status".to_string(), status.to_string().into_bytes()),
            ("x-exec".to_string(), n.to_string().into_bytes()),
        ];
        let mut s = std::mem::replace(&mut self.sims[i].s, DedupStream::new(0));
        let (calls, ran) = self.perform(self.sims[i].d, fault, |world| {
            let (p, env) = (&world.plugin, &mut world.envs[w]);
            let a = s.on_response_headers(p, env, status, &o, || pairs, true);
            let b = s.on_stream_end(p, env, &o);
            (a, b)
        });
        self.sims[i].s = s;
        self.adopt(ran)?;
        self.log(format!(
            "stream {i}: response {status} ({}){}",
            o.details,
            if fault == Fault::None {
                String::new()
            } else {
                format!(", store fault {fault:?}")
            }
        ));
        if calls != (None, None) {
            return Err(format!(
                "stream {i}: store calls with shared data {calls:?}"
            ));
        }
        let how = match r {
            Resp::Stored(_) => reference::Outcome::Completed,
            Resp::NotStored(_) | Resp::NotSent => reference::Outcome::Released,
            Resp::Unknown => reference::Outcome::Unknown,
        };
        self.settled(i, how, fault)
    }

    fn end(&mut self, i: usize, why: EndWhy, fault: Fault) -> Result<(), String> {
        let o = match why {
            EndWhy::ClientGone => origin("", flags::DC),
            EndWhy::UpstreamReset => origin(
                "upstream_reset_before_response_started{remote_reset}",
                flags::UR,
            ),
            EndWhy::Refused => origin(
                "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
                flags::UF,
            ),
        };
        let w = self.sims[i].worker;
        let mut s = std::mem::replace(&mut self.sims[i].s, DedupStream::new(0));
        let (call, ran) = self.perform(self.sims[i].d, fault, |world| {
            s.on_stream_end(&world.plugin, &mut world.envs[w], &o)
        });
        self.sims[i].s = s;
        self.adopt(ran)?;
        self.log(format!(
            "stream {i}: ends ({why:?}){}",
            if fault == Fault::None {
                String::new()
            } else {
                format!(", store fault {fault:?}")
            }
        ));
        if let Some(c) = call {
            return Err(format!("stream {i}: a store call with shared data {c:?}"));
        }
        let how = match why {
            EndWhy::Refused => reference::Outcome::Released,
            _ => reference::Outcome::Unknown,
        };
        self.settled(i, how, fault)
    }

    /// The counters agree with what the clients saw.
    pub(super) fn counters(&self) -> Result<(), String> {
        let sum = |c: Counter| self.envs.iter().map(|e| e.count_of(c)).sum::<u64>();
        let got = (sum(Counter::Stale), sum(Counter::Executed));
        let seen = (self.seen_stale, self.seen_executed);
        if got != seen {
            return Err(format!(
                "counters (stale, executed) {got:?}, clients saw {seen:?}"
            ));
        }
        Ok(())
    }
}

/// Shared data fails from its `n`-th write on (1: the next one).
fn fail_from(shared: &Arc<FakeShared>, n: u8) {
    let s = shared.clone();
    shared.before_next_set(move || {
        if n <= 1 {
            s.set_failing(true);
        } else {
            fail_from(&s, n - 1);
        }
    });
}
