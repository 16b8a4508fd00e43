//! The response side: upstream answers, bodies, settling calls, stream ends, clock ticks, counters.

use super::*;

impl World {
    pub(super) fn respond(&mut self, i: usize, r: Resp) -> Result<(), String> {
        let Some(n) = self.sims[i].exec else {
            return Ok(());
        };
        let (status, origin, len) = match r {
            Resp::Upstream { status, len } => (status, Origin::upstream(), len as usize % 13),
            Resp::NotSent(k) => {
                let (s, o) = not_sent_origin(k);
                (s, o, 5)
            }
            Resp::Unknown(k) => {
                let (s, o) = unknown_origin(k);
                (s, o, 5)
            }
        };
        // The reference: what the contract says this answer does to the claim.
        let capturing = match r {
            Resp::Upstream { .. } if stored_status(status) => true,
            Resp::Upstream { .. } | Resp::NotSent(_) => {
                self.execs[n].state = ExecState::Released;
                false
            }
            Resp::Unknown(_) => {
                self.execs[n].state = self.unknown_state();
                false
            }
        };
        self.log(format!(
            "stream {i}: response {status} ({}) with {len} body bytes",
            origin.details
        ));
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        let pairs = vec![
            (":status".to_string(), status.to_string().into_bytes()),
            ("content-type".to_string(), b"text/plain".to_vec()),
            ("x-exec".to_string(), n.to_string().into_bytes()),
            ("set-cookie".to_string(), b"session=1".to_vec()),
            ("connection".to_string(), b"keep-alive".to_vec()),
        ];
        self.sims[i].resp = RespPhase::Headers {
            status,
            origin: origin.clone(),
            len,
            sent: 0,
            capturing,
            done: len == 0,
        };
        if capturing && len == 0 {
            self.completed(i, n, status, Vec::new(), true);
        }
        let call = self.sims[i].s.on_response_headers(
            &self.plugins[pl],
            &mut self.envs[w],
            status,
            &origin,
            || pairs,
            len == 0,
        );
        if self.sims[i].s.wants_response_body() != (capturing && len > 0) {
            return Err(format!(
                "stream {i}: after response {status} ({}) the filter {} the body; the contract says it {}",
                origin.details,
                if self.sims[i].s.wants_response_body() { "captures" } else { "does not capture" },
                if capturing && len > 0 { "is kept" } else { "is not" }
            ));
        }
        self.settling(i, call)
    }

    pub(super) fn body_bytes(n: usize, len: usize) -> Vec<u8> {
        format!("e{n}-").bytes().cycle().take(len).collect()
    }

    pub(super) fn completed(
        &mut self,
        i: usize,
        n: usize,
        status: u16,
        body: Vec<u8>,
        whole: bool,
    ) {
        let clock = self.now + self.skew(self.sims[i].worker);
        let stored = (whole && body.len() <= CAP).then(|| StoredResponse {
            status,
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("x-exec".into(), n.to_string().into_bytes()),
            ],
            body,
        });
        // Shared data completes at once: certain if no other claim could have taken the
        // record. etcd: certain once etcd applies the completion (see `observe`).
        let sure = self.knobs.store == StoreKind::Shared
            && self.now < self.execs[n].forward_at + IN_FLIGHT_MS;
        self.execs[n].state = ExecState::Completed {
            stored,
            expires: clock + TTL_MS,
            sure,
        };
    }

    pub(super) fn resp_body(&mut self, i: usize, trailers: bool) -> Result<(), String> {
        let Some(n) = self.sims[i].exec else {
            return Ok(());
        };
        let RespPhase::Headers {
            status,
            len,
            sent,
            capturing,
            ..
        } = self.sims[i].resp.clone()
        else {
            return Ok(());
        };
        let whole = Self::body_bytes(n, len);
        let next = (sent + 5).min(len);
        let last = next == len;
        let end_here = last && !trailers;
        if let RespPhase::Headers { sent, done, .. } = &mut self.sims[i].resp {
            *sent = next;
            *done = last;
        }
        if last && capturing {
            self.completed(i, n, status, whole.clone(), true);
        }
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        self.log(format!(
            "stream {i}: response body {}..{next}{}",
            sent,
            if last {
                if trailers {
                    " + trailers"
                } else {
                    " (end)"
                }
            } else {
                ""
            }
        ));
        let mut calls = Vec::new();
        if self.sims[i].s.wants_response_body() {
            calls.push(self.sims[i].s.on_response_body(
                &self.plugins[pl],
                &mut self.envs[w],
                &whole[sent..next],
                end_here,
            ));
        }
        if last && trailers {
            calls.push(
                self.sims[i]
                    .s
                    .on_response_trailers(&self.plugins[pl], &mut self.envs[w]),
            );
        }
        for c in calls {
            self.settling(i, c)?;
        }
        Ok(())
    }

    pub(super) fn settling(&mut self, i: usize, call: Option<StoreCall>) -> Result<(), String> {
        match (call, self.knobs.store) {
            (None, _) => Ok(()),
            (Some(c), StoreKind::Shared) => {
                Err(format!("stream {i}: store call {c:?} with shared data"))
            }
            (Some(call), StoreKind::Etcd) => {
                if self.sims[i].call.is_some() {
                    return Err(format!("stream {i}: a second store call while one is out"));
                }
                self.sims[i].call = Some(Pending::sent(call, self.now));
                Ok(())
            }
        }
    }

    /// What the contract makes of an execution whose outcome is unknown.
    fn unknown_state(&self) -> ExecState {
        match self.knobs.unknown {
            Unknown::Keep => ExecState::Kept { at: self.now },
            Unknown::Hold => ExecState::Held,
            Unknown::Release => ExecState::Released,
        }
    }

    pub(super) fn end(&mut self, i: usize, why: EndWhy) -> Result<(), String> {
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        let o = match &self.sims[i].resp {
            RespPhase::Headers { origin, .. } => origin.clone(),
            RespPhase::None => end_origin(why),
        };
        // The reference again.
        if let Some(n) = self.sims[i].exec {
            match (&self.sims[i].resp, &self.execs[n].state) {
                (RespPhase::None, ExecState::Running) => {
                    let not_sent = matches!(why, EndWhy::Refused | EndWhy::NoHealthy);
                    self.execs[n].state = if not_sent {
                        ExecState::Released
                    } else {
                        self.unknown_state()
                    };
                }
                (
                    RespPhase::Headers {
                        status,
                        capturing: true,
                        done: false,
                        ..
                    },
                    ExecState::Running,
                ) => {
                    // The upstream answered; the body was cut: completed, not kept.
                    let status = *status;
                    self.completed(i, n, status, Vec::new(), false);
                }
                _ => {}
            }
        }
        self.log(format!("stream {i}: ends ({:?}, {})", why, o.details));
        // A bad request is counted at its headers; its 400 waits for the body, so a
        // client gone before the body never sees it.
        if self.sims[i].req == ReqPhase::AwaitBody
            && !self.sims[i].ended
            && self.sims[i].bad.is_some_and(|b| b != Bad::Get)
        {
            self.seen.bad_key += 1;
        }
        self.sims[i].ended = true;
        self.sync(w);
        let call = self.sims[i]
            .s
            .on_stream_end(&self.plugins[pl], &mut self.envs[w], &o);
        self.settling(i, call)
    }

    /// The clock moves on; store calls past their timeout get Envoy's 504 (applied by
    /// etcd or not).
    pub(super) fn tick(&mut self, ms: u64) -> Result<(), String> {
        let target = self.now + ms;
        loop {
            let due = self
                .sims
                .iter()
                .enumerate()
                .filter_map(|(i, x)| {
                    let p = x.call.as_ref()?;
                    Some((p.sent_at + p.call.timeout_ms, i))
                })
                .filter(|(at, _)| *at <= target)
                .min();
            let Some((at, i)) = due else { break };
            self.now = self.now.max(at);
            // Half of the timed-out calls went through before the timeout.
            if at % 2 == 0 {
                self.apply(i);
            }
            self.sims[i].faulted = true;
            self.log(format!("stream {i}: store call timed out"));
            self.answer(i, (504, b"upstream request timeout".to_vec()), false)?;
        }
        self.now = target;
        self.log(format!("clock +{ms} ms"));
        Ok(())
    }

    /// The counters agree with what the clients saw.
    pub(super) fn counters(&self) -> Result<(), String> {
        let sum = |c: Counter| self.envs.iter().map(|e| e.count_of(c)).sum::<u64>();
        let got = Seen {
            requests: sum(Counter::Requests),
            executed: sum(Counter::Executed),
            replayed: sum(Counter::Replayed),
            in_flight: sum(Counter::RejectedInFlight),
            mismatch: sum(Counter::PayloadMismatch) + sum(Counter::PrincipalMismatch),
            bad_key: sum(Counter::BadKey),
            bypassed: sum(Counter::Bypassed),
        };
        // Bad requests still waiting for their body: counted, their 400 not yet sent.
        let mut seen = self.seen.clone();
        seen.bad_key += self
            .sims
            .iter()
            .filter(|x| {
                x.req == ReqPhase::AwaitBody && !x.ended && x.bad.is_some_and(|b| b != Bad::Get)
            })
            .count() as u64;
        if got != seen {
            return Err(format!("counters {got:?}, clients saw {seen:?}"));
        }
        Ok(())
    }
}
