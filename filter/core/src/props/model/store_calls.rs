//! etcd calls as the fault injector delivers them: applied, lost, failed, duplicated, late.

use super::*;

impl World {
    pub(super) fn apply(&mut self, i: usize) {
        let Some(p) = self.sims[i].call.as_mut() else {
            return;
        };
        if p.applied.is_some() {
            return;
        }
        let call = p.call.clone();
        self.demand_now(i, call.path);
        // A claim etcd applies, whether or not its stream will learn it (its client
        // may be gone, its answer lost).
        if self.sims[i].req == ReqPhase::Deciding && etcd::is_txn(call.path) {
            self.sims[i].claim_applied = true;
            self.sims[i].claim_sent =
                Some(self.sims[i].call.as_ref().map_or(self.now, |p| p.sent_at));
        }
        let answer = self.etcd_of(&call).handle(call.path, &call.body, self.now);
        self.log(format!(
            "stream {i}: etcd applies {} -> {}",
            call.path, answer.0
        ));
        self.observe(i, call.path, &answer);
        if let Some(p) = self.sims[i].call.as_mut() {
            p.applied = Some(answer);
        }
    }

    /// What the contract demands of a deciding stream's claim transaction, by the state
    /// when etcd applies it (the answer the stream gets is that application's).
    fn demand_now(&mut self, i: usize, path: &str) {
        let deciding = self.sims[i].req == ReqPhase::Deciding && !self.sims[i].ended;
        if deciding && etcd::is_txn(path) {
            let d = self.demanded(i);
            if let Some(p) = self.sims[i].call.as_mut() {
                p.demand = Some(d);
            }
        }
    }

    /// A completion that etcd applied is certain.
    pub(super) fn observe(&mut self, i: usize, path: &str, answer: &(u16, Vec<u8>)) {
        let Some(n) = self.sims[i].exec else { return };
        if let Some(EtcdAnswer::Txn {
            succeeded: true, ..
        }) = etcd::read_answer(path, answer.0, &answer.1)
        {
            if let ExecState::Completed { sure, .. } = &mut self.execs[n].state {
                *sure = true;
            }
        }
    }

    pub(super) fn deliver(&mut self, i: usize, fate: Fate) -> Result<(), String> {
        let answer = match fate {
            Fate::Normal => {
                self.apply(i);
                self.applied(i)
            }
            Fate::Lost => {
                self.apply(i);
                self.sims[i].faulted = true;
                (503, Vec::new())
            }
            Fate::Failed => {
                self.sims[i].faulted = true;
                (503, Vec::new())
            }
            Fate::Duplicated => {
                self.apply(i);
                let call = self.sims[i].call.as_ref().map(|p| p.call.clone());
                match call {
                    Some(c) => {
                        // The first application may have come long before (an apply
                        // op): the answer that arrives is this one's.
                        self.demand_now(i, c.path);
                        let again = self.etcd_of(&c).handle(c.path, &c.body, self.now);
                        self.observe(i, c.path, &again);
                        again
                    }
                    None => (503, Vec::new()),
                }
            }
            Fate::Late => {
                self.apply(i);
                let due = self.sims[i].call.as_ref().map_or(self.now, |p| {
                    p.sent_at + p.call.timeout_ms.saturating_sub(1)
                });
                if due > self.now {
                    self.tick(due - self.now)?;
                }
                if self.sims[i].call.is_none() {
                    // Answered meanwhile (a timeout of its own cannot come first).
                    return Ok(());
                }
                self.applied(i)
            }
            Fate::Unavailable => {
                self.sims[i].faulted = true;
                (
                    503,
                    br#"{"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14}"#
                        .to_vec(),
                )
            }
        };
        self.log(format!("stream {i}: answer {fate:?} {}", answer.0));
        // A late answer is decided on later than etcd applied it: by then a claim it
        // found may read otherwise (past its in-flight end), so no single answer is
        // demanded of it (it is still checked against what the contract allows).
        let genuine = matches!(fate, Fate::Normal | Fate::Duplicated);
        self.answer(i, answer, genuine)
    }

    pub(super) fn applied(&self, i: usize) -> (u16, Vec<u8>) {
        self.sims[i]
            .call
            .as_ref()
            .and_then(|p| p.applied.clone())
            .unwrap_or((503, Vec::new()))
    }

    /// Delivers the answer to a stream's store call; `genuine` when it is etcd's own
    /// answer to the call (not a transport failure).
    pub(super) fn answer(
        &mut self,
        i: usize,
        (status, body): (u16, Vec<u8>),
        genuine: bool,
    ) -> Result<(), String> {
        let Some(p) = self.sims[i].call.take() else {
            return Ok(());
        };
        self.answered.push((p.call, i));
        if self.answered.len() > 16 {
            self.answered.remove(0);
        }
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        let demand = if genuine && !self.sims[i].ended {
            p.demand.flatten()
        } else {
            None
        };
        let action = self.sims[i].s.on_store_answer(
            &self.plugins[pl],
            &mut self.envs[w],
            CallAnswer {
                status,
                body,
                ..Default::default()
            },
        );
        if self.sims[i].req == ReqPhase::Deciding {
            if !matches!(action, Decision::Call(_)) && !self.sims[i].ended {
                self.check_demand(i, demand, &action)?;
            }
            return self.decided(i, action);
        }
        match action {
            Decision::Call(call) => {
                self.sims[i].call = Some(Pending::sent(call, self.now));
                Ok(())
            }
            Decision::Continue => Ok(()),
            other => Err(format!(
                "stream {i}: a settling call answered {}",
                short(&other)
            )),
        }
    }
}
