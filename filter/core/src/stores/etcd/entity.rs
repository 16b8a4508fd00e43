//! The ordering guard on etcd: one key per entity, `<prefix>o/<hex digest>`, whose value
//! is the entity (`ordering::entities`' format, one entry) and which is written only by a
//! txn comparing its revision: created with `CREATE == 0`, replaced with `MOD == seen`,
//! each failure branch returning the current value, so a claim or settle is one round
//! trip unless another proxy changed the entity meanwhile. The decisions are the same
//! as shared data's (`Entity::claim`, `Entity::settle`).
//!
//! The key carries a lease that outlives every state written in it: taken (or reused)
//! when the entity is claimed, with the completed records' timing for the longer of the
//! policy's TTL and `ordering.ttl_seconds`, so a completion written up to the end of the
//! flight still answers for the whole ordering TTL. A flight ends at its expiry by the
//! proxies' clocks (the value holds it); the applied version at its own.

use super::settle::Settling;
use super::wire::{self as etcd, EtcdAnswer, LeasePlan, LeasePurpose};
use super::{
    attempt_timeout, check_read, lease_lost, retry_check, retryable, take_etcd_call, worker,
    EtcdCall, EtcdHeld, EtcdStore, MAX_RETRIES, MAX_ROUNDS,
};
use crate::config::Policy;
use crate::key::Digest;
use crate::metrics::Counter;
use crate::ordering::entities::{decode, encode, Entity, EntityClaim, Settle};
use crate::ordering::{Ordered, Version};
use crate::shared_data::{HostFault, StoreError};
use crate::stream::{CallAnswer, Decision, DedupStream, Env, Phase, Plugin, StoreCall};
use std::sync::Arc;

/// What an entity call is for.
pub(crate) enum EntityOp {
    /// Claiming the entity for the won record claim `owned`.
    Claim { owned: Box<EtcdHeld> },
    /// Ending the flight, then the record's own settle (`then`, sent once this is done).
    Settle {
        how: Settle,
        then: Option<Box<Settling>>,
    },
}

/// An entity call in progress (`Phase::Ordering`).
pub(crate) struct EntityCall {
    pub(crate) op: EntityOp,
    key: String,
    entity: Digest,
    version: Version,
    token: u64,
    flight_until_ms: u64,
    lease: Option<i64>,
    /// The entity as last read: its mod revision and state (`None`: absent).
    seen: Option<(i64, Entity)>,
    /// The state the txn out writes, `seen` once it succeeds.
    writing: Option<Entity>,
    /// A lease grant is out, sent at this time.
    granting: Option<u64>,
    rounds: u32,
    retries: u32,
    deadline_ms: u64,
    call: StoreCall,
    /// The client left while the claim was out: a won claim is released at once.
    pub(crate) abandoned: bool,
    /// Resharding: the claim won on the entity's shard, and `call` reads the entity on
    /// its shard under the other map (`checked`).
    checking: bool,
}

impl EntityCall {
    /// The reply sent once the record's settle after this one is done.
    pub(crate) fn reply_once_settled(&mut self, reply: Option<crate::reply::LocalReply>) {
        if let EntityOp::Settle {
            then: Some(then), ..
        } = &mut self.op
        {
            then.then_reply = reply;
        }
    }
}

/// What a stream keeps of its entity on etcd once claimed, for the settle.
#[derive(Debug, Clone)]
pub(crate) struct EtcdEntity {
    lease: i64,
    seen: Option<(i64, Entity)>,
}

/// Whose turn an entity call is: the entity and version, the flight's token, and
/// (claims) when the flight ends.
pub(crate) struct Turn {
    pub(crate) ordered: Ordered,
    pub(crate) token: u64,
    pub(crate) until_ms: u64,
}

/// The etcd key of an entity.
pub(crate) fn entity_key(prefix: &str, digest: &Digest) -> String {
    let mut k = String::with_capacity(prefix.len() + 66);
    k.push_str(prefix);
    k.push_str("o/");
    crate::key::push_hex(&mut k, digest);
    k
}

/// The lease timing of an entity key (see the module's text).
fn entity_plan(ec: &EtcdStore, policy: &Policy) -> LeasePlan {
    let ordering_ttl = policy.ordering.as_ref().map_or(0, |o| o.ttl_ms);
    LeasePlan::new(
        policy.ttl_ms.max(ordering_ttl),
        policy.in_flight_timeout_ms,
        ec.config.timeout_ms,
    )
}

fn one(entity: &Entity) -> Vec<u8> {
    encode(std::slice::from_ref(entity))
}

/// The entity in a value read back: `Err` for a value this version cannot read (left
/// alone: it may be a newer version's).
fn entity_of(value: &[u8], digest: &Digest) -> Result<Entity, StoreError> {
    match decode(value) {
        Ok(list) => Ok(list
            .into_iter()
            .find(|e| e.digest == *digest)
            .unwrap_or(Entity::fresh(*digest))),
        Err(_) => Err(StoreError::Host(HostFault(
            "an etcd entity is in a format this version cannot read".into(),
        ))),
    }
}

impl DedupStream {
    /// Starts the claim of the stream's entity on etcd for the won record claim `owned`.
    pub(crate) fn claim_entity_etcd(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        owned: Box<EtcdHeld>,
        turn: Turn,
    ) -> Decision {
        let now = env.now_ms();
        let deadline_ms = now.saturating_add(ec.config.timeout_ms);
        let e = EntityCall {
            op: EntityOp::Claim { owned },
            key: entity_key(&ec.config.prefix, &turn.ordered.entity),
            entity: turn.ordered.entity,
            version: turn.ordered.version,
            token: turn.token,
            flight_until_ms: turn.until_ms,
            lease: None,
            seen: None,
            writing: None,
            granting: None,
            rounds: 0,
            retries: 0,
            deadline_ms,
            call: ec.call(
                ec.route_of(self.home, &turn.ordered.entity),
                ec.config.protocol.txn_path(),
                Vec::new(),
                1,
            ),
            abandoned: false,
            checking: false,
        };
        self.next_entity_call(p, ec, env, Box::new(e))
    }

    /// Ends the entity's flight on etcd (`op`: `EntityOp::Settle`, how, and the record's
    /// own settle to send after it): the call to send first.
    pub(crate) fn settle_entity_etcd(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        held: Option<EtcdEntity>,
        turn: Turn,
        op: EntityOp,
    ) -> Decision {
        // Forwarded unordered (no entity claimed): a completion takes a lease and reads
        // the entity first, like a claim.
        let (lease, seen) = match held {
            Some(h) => (Some(h.lease), h.seen),
            None => (None, None),
        };
        let now = env.now_ms();
        let e = EntityCall {
            op,
            key: entity_key(&ec.config.prefix, &turn.ordered.entity),
            entity: turn.ordered.entity,
            version: turn.ordered.version,
            token: turn.token,
            flight_until_ms: 0,
            lease,
            seen,
            writing: None,
            granting: None,
            rounds: 0,
            retries: 0,
            deadline_ms: now.saturating_add(ec.config.timeout_ms),
            call: ec.call(
                ec.route_of(self.home, &turn.ordered.entity),
                ec.config.protocol.txn_path(),
                Vec::new(),
                1,
            ),
            abandoned: false,
            checking: false,
        };
        self.next_entity_call(p, ec, env, Box::new(e))
    }

    /// The next call of an entity operation: a lease grant if none is usable, else the
    /// txn writing what the operation makes of the entity as last seen; or, when it
    /// needs no write (stale, busy, nothing to settle), its end.
    fn next_entity_call(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut e: Box<EntityCall>,
    ) -> Decision {
        let now = env.now_ms();
        let policy = p.config.policy_at(self.rule);
        let proto = ec.config.protocol;
        let timeout = attempt_timeout(ec, e.deadline_ms, now);
        let lease = match e.lease {
            Some(l) => l,
            None => match worker(env).leases.get(
                e.call.route.shard_id,
                LeasePurpose::Completed,
                &entity_plan(ec, policy),
                now,
            ) {
                Some(l) => {
                    e.lease = Some(l);
                    l
                }
                None => {
                    e.granting = Some(now);
                    e.call = ec.call(
                        &Arc::clone(&e.call.route),
                        proto.lease_grant_path(),
                        proto.lease_grant(entity_plan(ec, policy).ttl_s(LeasePurpose::Completed)),
                        timeout,
                    );
                    e.retries = 0;
                    let call = e.call.clone();
                    self.phase = ec.pending(EtcdCall::Ordering(e));
                    return Decision::Call(call);
                }
            },
        };
        let mut state = e
            .seen
            .as_ref()
            .map_or(Entity::fresh(e.entity), |(_, s)| s.clone());
        let before = state.clone();
        match &e.op {
            EntityOp::Claim { .. } => {
                let outcome = state.claim(e.token, &e.version, now, e.flight_until_ms);
                if !matches!(outcome, EntityClaim::Claimed { .. }) {
                    return self.entity_claim_decided(p, env, e, Ok(outcome));
                }
            }
            EntityOp::Settle { how, .. } => {
                state.settle(e.token, how, now);
                if state == before && e.seen.is_some() {
                    return self.entity_settled(p, ec, env, e, true);
                }
                if e.seen.is_none() && !matches!(how, Settle::Complete { .. }) {
                    // Gone (its lease ended): no flight left to end.
                    return self.entity_settled(p, ec, env, e, false);
                }
            }
        }
        let value = one(&state);
        let body = match &e.seen {
            Some((rev, _)) => proto.replace_txn(&e.key, *rev, &value, lease),
            None => proto.claim_txn(&e.key, &value, lease),
        };
        e.call = ec.call(&Arc::clone(&e.call.route), proto.txn_path(), body, timeout);
        e.retries = 0;
        e.writing = Some(state);
        let call = e.call.clone();
        self.phase = ec.pending(EtcdCall::Ordering(e));
        Decision::Call(call)
    }

    /// The answer to an entity call.
    pub(crate) fn entity_answered(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut e: Box<EntityCall>,
        answer: &CallAnswer,
    ) -> Decision {
        if e.checking {
            return self.entity_checked(p, ec, env, e, answer);
        }
        let now = env.now_ms();
        let parsed = etcd::read_answer(e.call.path, answer.status, &answer.body);
        if retryable(answer, &parsed) {
            if e.retries < MAX_RETRIES && now < e.deadline_ms {
                e.retries += 1;
                e.call.timeout_ms = attempt_timeout(ec, e.deadline_ms, now);
                let call = e.call.clone();
                self.phase = ec.pending(EtcdCall::Ordering(e));
                return Decision::Call(call);
            }
            return self.entity_failed(
                p,
                ec,
                env,
                e,
                format!("etcd unreachable (status {})", answer.status),
            );
        }
        if let Some(sent_ms) = e.granting.take() {
            return match parsed {
                Some(EtcdAnswer::Lease { id }) => {
                    let plan = entity_plan(ec, p.config.policy_at(self.rule));
                    worker(env).leases.put(
                        e.call.route.shard_id,
                        LeasePurpose::Completed,
                        &plan,
                        id,
                        sent_ms,
                    );
                    e.lease = Some(id);
                    // The last write was not sent: what was seen is read again.
                    self.next_entity_call(p, ec, env, e)
                }
                other => {
                    self.entity_failed(p, ec, env, e, format!("lease grant failed: {other:?}"))
                }
            };
        }
        match parsed {
            Some(EtcdAnswer::Txn {
                succeeded: true,
                revision,
                ..
            }) => {
                e.seen = e.writing.take().map(|s| (revision, s));
                match e.op {
                    EntityOp::Claim { .. } if !e.abandoned => {
                        match ec.check_route_of(self.home, &e.entity).map(Arc::clone) {
                            Some(other) => self.check_entity(ec, env, e, &other),
                            None => self.entity_claim_decided(
                                p,
                                env,
                                e,
                                Ok(EntityClaim::Claimed {
                                    evicted_unexpired: false,
                                }),
                            ),
                        }
                    }
                    EntityOp::Claim { .. } => self.entity_claim_decided(
                        p,
                        env,
                        e,
                        Ok(EntityClaim::Claimed {
                            evicted_unexpired: false,
                        }),
                    ),
                    EntityOp::Settle { .. } => self.entity_settled(p, ec, env, e, true),
                }
            }
            Some(EtcdAnswer::Txn {
                succeeded: false,
                existing,
                ..
            }) => {
                e.rounds += 1;
                if e.rounds > MAX_ROUNDS {
                    return self.entity_failed(p, ec, env, e, "etcd CAS contention".into());
                }
                e.seen = match existing {
                    Some((rev, value)) => match entity_of(&value, &e.entity) {
                        Ok(state) => Some((rev, state)),
                        Err(err) => return self.entity_failed(p, ec, env, e, err.to_string()),
                    },
                    None => None,
                };
                self.next_entity_call(p, ec, env, e)
            }
            Some(EtcdAnswer::Error { code, message }) if lease_lost(code, &message) => {
                // The lease we wrote with is gone: take a fresh one.
                worker(env).leases.forget(e.call.route.shard_id);
                e.lease = None;
                e.rounds += 1;
                if e.rounds > MAX_ROUNDS {
                    return self.entity_failed(p, ec, env, e, "etcd keeps losing leases".into());
                }
                // The write was refused: the entity is as last read.
                e.writing = None;
                self.next_entity_call(p, ec, env, e)
            }
            other => self.entity_failed(p, ec, env, e, format!("unexpected etcd answer {other:?}")),
        }
    }

    /// Resharding: the entity's flight is claimed on its shard; before anything is
    /// forwarded, the entity is read on its shard under the other map (a fresh budget),
    /// the same write-then-read as a record's claim, so of two versions claimed on two
    /// maps at once at least one sees the other, and a version at or below one applied
    /// under the other map is stale.
    fn check_entity(
        &mut self,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut e: Box<EntityCall>,
        other: &Arc<crate::stream::Route>,
    ) -> Decision {
        let now = env.now_ms();
        let proto = ec.config.protocol;
        e.checking = true;
        e.retries = 0;
        e.deadline_ms = now.saturating_add(ec.config.timeout_ms);
        e.call = ec.call(
            other,
            proto.range_path(),
            proto.read_key(&e.key),
            attempt_timeout(ec, e.deadline_ms, now),
        );
        env.count(Counter::ReshardChecks);
        let call = e.call.clone();
        self.phase = ec.pending(EtcdCall::Ordering(e));
        Decision::Call(call)
    }

    /// The answer to `check_entity`'s read: no entity there, or one this version would be
    /// claimed on, forward; a stale version or another version in flight there, yield:
    /// the flight claimed on the entity's own shard is ended (released), then the
    /// record's claim, then the request is answered as stale or busy. A read that fails
    /// after its retries is a store error: `failure_mode: "open"` forwards (the flight
    /// stays claimed on its own shard), `"closed"` ends both claims and answers `503`.
    fn entity_checked(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut e: Box<EntityCall>,
        answer: &CallAnswer,
    ) -> Decision {
        let now = env.now_ms();
        let found = match check_read(&e.call, answer) {
            Some(None) => Ok(None),
            Some(Some((_, value))) => entity_of(&value, &e.entity).map(Some),
            None => {
                if retry_check(answer, &e.call, e.retries, e.deadline_ms, now) {
                    e.retries += 1;
                    e.call.timeout_ms = attempt_timeout(ec, e.deadline_ms, now);
                    let call = e.call.clone();
                    self.phase = ec.pending(EtcdCall::Ordering(e));
                    return Decision::Call(call);
                }
                Err(StoreError::Host(HostFault(format!(
                    "reading the entity on shard `{}` of the other map failed (status {})",
                    e.call.route.shard, answer.status
                ))))
            }
        };
        e.checking = false;
        let claimed = Ok(EntityClaim::Claimed {
            evicted_unexpired: false,
        });
        let there = match found {
            Ok(None) => return self.entity_claim_decided(p, env, e, claimed),
            Ok(Some(there)) => there,
            Err(err) if p.config.failure_mode == crate::config::FailureMode::Open => {
                env.count(Counter::StoreErrors);
                env.count(Counter::FailedOpen);
                env.warn(&format!(
                    "stream {}: ordering store error: {err}; forwarded unchecked (failure_mode open)",
                    self.id
                ));
                return self.entity_claim_decided(p, env, e, claimed);
            }
            Err(err) => return self.entity_yield(p, ec, env, e, Err(err)),
        };
        let mut probe = there;
        match probe.claim(e.token, &e.version, now, e.flight_until_ms) {
            EntityClaim::Claimed { .. } => self.entity_claim_decided(p, env, e, claimed),
            refused => {
                env.count(Counter::ReshardYielded);
                self.entity_yield(p, ec, env, e, Ok(refused))
            }
        }
    }

    /// Ends the flight claimed on the entity's shard (released: nothing ran), then the
    /// record's claim, then answers as `outcome` (stale, busy, or a store error) says.
    fn entity_yield(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        e: Box<EntityCall>,
        outcome: Result<EntityClaim, StoreError>,
    ) -> Decision {
        let EntityCall {
            op,
            lease,
            seen,
            entity,
            version,
            token,
            ..
        } = *e;
        let EntityOp::Claim { owned } = op else {
            return Decision::Continue;
        };
        let d = match self.entity_decided(p, env, owned, outcome) {
            // A store error under failure_mode open forwards (not reached: handled by
            // the caller), as would a claim.
            Ok(owned) => return self.forward(p, env, owned),
            Err(d) => d,
        };
        let then = self.take_settling(ec);
        let Some(lease) = lease else {
            return d;
        };
        let held = Some(EtcdEntity { lease, seen });
        let turn = Turn {
            ordered: Ordered { entity, version },
            token,
            until_ms: 0,
        };
        let op = EntityOp::Settle {
            how: Settle::Release,
            then,
        };
        match self.settle_entity_etcd(p, ec, env, held, turn, op) {
            Decision::Call(call) => Decision::Call(call),
            _ => d,
        }
    }

    fn entity_failed(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        e: Box<EntityCall>,
        why: String,
    ) -> Decision {
        match e.op {
            EntityOp::Claim { .. } => {
                self.entity_claim_decided(p, env, e, Err(StoreError::Host(HostFault(why))))
            }
            EntityOp::Settle { .. } => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: settling the entity on etcd failed: {why}",
                    self.id
                ));
                self.entity_settled(p, ec, env, e, true)
            }
        }
    }

    /// A claim decided: its stream goes on (forwarded, refused, or released at once if
    /// its client left).
    fn entity_claim_decided(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        e: Box<EntityCall>,
        outcome: Result<EntityClaim, StoreError>,
    ) -> Decision {
        let EntityCall {
            op,
            lease,
            seen,
            abandoned,
            ..
        } = *e;
        let EntityOp::Claim { mut owned } = op else {
            return Decision::Continue;
        };
        let claimed = matches!(outcome, Ok(EntityClaim::Claimed { .. }));
        if claimed {
            if let Some(lease) = lease {
                // What the settle needs, kept with the claim.
                owned.entity = Some(EtcdEntity { lease, seen });
                self.entity_claimed();
            }
        }
        let owned: crate::stream::HeldClaim = owned;
        if abandoned {
            self.phase = Phase::Finished;
            return match claimed {
                // Nothing was forwarded: the entity's flight and the record's claim end.
                true => match self.release(p, env, owned) {
                    Some(call) => Decision::Call(call),
                    None => Decision::Continue,
                },
                false => self.refuse(p, env, owned, Decision::Continue),
            };
        }
        match self.entity_decided(p, env, owned, outcome) {
            Ok(owned) => self.forward(p, env, owned),
            Err(d) => d,
        }
    }

    /// A settle done (`ok`: confirmed or nothing to do): the record's own settle follows.
    fn entity_settled(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        e: Box<EntityCall>,
        ok: bool,
    ) -> Decision {
        if !ok {
            env.count(Counter::ClaimsLost);
        }
        crate::stream::wake(p, env, &e.entity);
        match e.op {
            EntityOp::Settle {
                then: Some(then), ..
            } => {
                let call = then.call.clone();
                self.phase = ec.pending(EtcdCall::Settling(then));
                Decision::Call(call)
            }
            _ => {
                self.phase = Phase::Finished;
                Decision::Continue
            }
        }
    }

    /// The record's settle just built (`Settling`, in the phase), taken out to follow
    /// an entity's call; any other phase is left as it is.
    fn take_settling(&mut self, ec: &EtcdStore) -> Option<Box<Settling>> {
        match take_etcd_call(&mut self.phase) {
            Some(EtcdCall::Settling(st)) => Some(st),
            Some(other) => {
                self.phase = ec.pending(other);
                None
            }
            None => None,
        }
    }

    /// When the stream holds a claimed entity (`held`: what the claim kept of it), its
    /// settle goes first and the record's (the `Settling` just built) follows: the call
    /// to send first.
    pub(crate) fn entity_first(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        how: Settle,
        held: Option<EtcdEntity>,
    ) -> Option<StoreCall> {
        let (ordered, token) = self.take_claimed_entity(&how)?;
        let then = self.take_settling(ec);
        let turn = Turn {
            ordered,
            token,
            until_ms: 0,
        };
        let op = EntityOp::Settle { how, then };
        match self.settle_entity_etcd(p, ec, env, held, turn, op) {
            Decision::Call(call) => Some(call),
            _ => None,
        }
    }
}
