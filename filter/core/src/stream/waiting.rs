//! Wait mode: a duplicate held until the first request's answer, woken by the glue,
//! re-checking its record, answering 409 once its wait is over.

use super::{Decision, DedupStream, Duplicate, Env, Phase, Plugin, Waiting};
use crate::key::short_hex;
use crate::metrics::Counter;
use crate::record::RecordTimes;

impl DedupStream {
    /// Wait mode: the glue woke this waiting duplicate (its record changed, its periodic
    /// check or its deadline came). It re-reads the record: the first's response
    /// (replayed), a released key (claimed: this one executes), still in flight (it
    /// waits on, `Pause`), or, past `wait_timeout_ms`, 409 as in reject mode. With etcd
    /// the read is a store call (`Call`) whose answer goes to `on_store_answer`.
    pub fn on_wake(&mut self, p: &Plugin, env: &mut dyn Env) -> Decision {
        if self.detached() {
            return self.detached_deadline(env);
        }
        if !matches!(self.phase, Phase::Waiting(_)) {
            // Not waiting (any more), or its read is out: nothing to do now.
            return Decision::Pause;
        }
        let Phase::Waiting(w) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Decision::Pause;
        };
        let now = env.now_ms();
        if self.wait_deadline.is_some_and(|d| now >= d) {
            return self.duplicate(
                p,
                env,
                Duplicate::InFlight {
                    held_until: w.held_until,
                },
                w.times,
            );
        }
        self.recheck(p, env, w, now)
    }

    /// Keeps a waiter waiting, or answers 409 once its deadline has passed.
    pub(crate) fn wait_on(&mut self, p: &Plugin, env: &mut dyn Env, w: Box<Waiting>) -> Decision {
        if self.wait_deadline.is_some_and(|d| env.now_ms() < d) {
            self.phase = Phase::Waiting(w);
            return Decision::Pause;
        }
        self.duplicate(
            p,
            env,
            Duplicate::InFlight {
                held_until: w.held_until,
            },
            w.times,
        )
    }

    /// Wait mode: a duplicate of a claim starts waiting (a place among this worker's
    /// `max_waiters`), or waits on. `None`: it answers 409 now (no place, or its
    /// `wait_timeout_ms` is over).
    pub(crate) fn start_or_keep_waiting(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        held_until: Option<u64>,
        times: RecordTimes,
    ) -> Option<Decision> {
        let record = self.record?;
        self.start_or_keep_waiting_on(p, env, held_until, times, record)
    }

    /// The same, woken when `watch` changes: its record, or (ordering) the entity whose
    /// other version is in flight. A waiter always re-checks its own record first.
    pub(crate) fn start_or_keep_waiting_on(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        held_until: Option<u64>,
        times: RecordTimes,
        watch: crate::key::Digest,
    ) -> Option<Decision> {
        let (digest, payload) = (self.record?, self.payload?);
        let now = env.now_ms();
        let wait_timeout_ms = p.config.policy_at(self.rule).wait_timeout_ms;
        let deadline = match self.wait_deadline {
            Some(d) => d,
            None => {
                let d = now.saturating_add(wait_timeout_ms);
                // The first check comes at the next tick: a completion that landed
                // between the claim's read and this registration woke nobody here.
                let limits = (
                    self.scope_tag,
                    p.config.max_waiters,
                    p.config.max_waiters_per_scope,
                );
                if !env.waiters().add_for_scope(self.id, watch, d, now, limits) {
                    env.debug(format_args!(
                        "stream {}: {} duplicates (or {} of its scope) already wait on this worker \
                         (max_waiters, max_waiters_per_scope); 409",
                        self.id, p.config.max_waiters, p.config.max_waiters_per_scope
                    ));
                    return None;
                }
                env.count(Counter::Waited);
                env.debug(format_args!(
                    "stream {}: record {} in flight; waiting up to {} ms for its answer",
                    self.id,
                    short_hex(&digest),
                    wait_timeout_ms
                ));
                self.wait_deadline = Some(d);
                d
            }
        };
        if now >= deadline {
            return None;
        }
        self.phase = Phase::Waiting(Box::new(Waiting {
            digest,
            payload,
            held_until,
            times,
        }));
        Some(Decision::Pause)
    }

    /// A waiting duplicate is answered or goes on: it leaves the worker's registry.
    pub(crate) fn stop_waiting(&mut self, env: &mut dyn Env) {
        if self.wait_deadline.is_some() {
            env.waiters().remove(self.id);
        }
    }
}
