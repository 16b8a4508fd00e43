//! The ordering guard in a stream: after its record is claimed, a request claims its
//! entity for its version (stale, another version in flight, or its turn), and when its
//! record is completed, released or held, its entity's flight ends the same way. The
//! store side is the held claim's (`Held::claim_entity`, and the settle beside the
//! record's in `Held::complete`, `release`, `hold`).

use super::HeldClaim;
use super::{Decision, DedupStream, Env, Phase, Plugin};
use crate::config::{FailureMode, OnInFlight, OnStale, OnStoreFull};
use crate::key::short_hex;
use crate::metrics::Counter;
use crate::ordering::entities::{EntityClaim, Settle};
use crate::ordering::{Ordered, OrderingError, Version};
use crate::record::RecordTimes;
use crate::reply::{LocalReply, Problem};
use crate::shared_data::StoreError;

/// A stream's place in its entity's order.
pub(crate) struct OrderState {
    ordered: Ordered,
    /// The flight's token, once the entity is claimed (`claimed`).
    token: u64,
    claimed: bool,
    /// Forwarded without its entity (the store failed under `failure_mode: "open"`):
    /// a completion still raises the entity's applied version.
    unordered: bool,
}

impl OrderState {
    pub(crate) fn ordered(&self) -> &Ordered {
        &self.ordered
    }

    pub(crate) fn new(ordered: Ordered) -> Self {
        OrderState {
            ordered,
            token: 0,
            claimed: false,
            unordered: false,
        }
    }
}

/// Header on acknowledged stale requests (`on_stale: "acknowledge"`).
pub const STALE_HEADER: &str = "idempotent-stale";
/// Header naming the entity's applied version on every stale answer.
pub const APPLIED_VERSION_HEADER: &str = "idempotent-applied-version";

impl DedupStream {
    /// A `400` for an entity or version that cannot be read.
    pub(crate) fn bad_order(&mut self, env: &mut dyn Env, e: OrderingError) -> Decision {
        env.count(Counter::BadKey);
        let reply = match e {
            OrderingError::MissingEntity(d) => Problem::MissingEntity.reply(&d, Vec::new()),
            OrderingError::InvalidEntity(d) => Problem::InvalidEntity.reply(&d, Vec::new()),
            OrderingError::MissingVersion(d) => Problem::MissingVersion.reply(&d, Vec::new()),
            OrderingError::InvalidVersion(d) => Problem::InvalidVersion.reply(&d, Vec::new()),
        };
        self.reply(env, reply)
    }

    /// Before a won claim is forwarded: the entity's turn. `Ok`: forward (the entity is
    /// claimed, or the policy does not order, or the store failed open). `Err`: what the
    /// stream does instead (a store call out for the entity, or an answer, the record's
    /// claim released: the request did not run).
    pub(crate) fn claim_entity(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
    ) -> Result<HeldClaim, Decision> {
        let Some(order) = self.order.as_mut().filter(|o| !o.claimed) else {
            return Ok(owned);
        };
        let token = env.new_token();
        order.token = token;
        let now = env.now_ms();
        let _t = crate::phases::span(crate::phases::Phase::Entity);
        owned.claim_entity(self, p, env, token, now)
    }

    /// What a claim of the entity found, for the won record claim `owned`.
    pub(crate) fn entity_decided(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        outcome: Result<EntityClaim, StoreError>,
    ) -> Result<HeldClaim, Decision> {
        let policy = p.config.policy_at(self.rule);
        let Some(order) = self.order.as_mut() else {
            return Ok(owned);
        };
        let entity = order.ordered.entity;
        let version = order.ordered.version.clone();
        match outcome {
            Ok(EntityClaim::Claimed { evicted_unexpired }) => {
                if evicted_unexpired {
                    env.count(Counter::EntitiesEvicted);
                }
                order.claimed = true;
                Ok(owned)
            }
            Ok(EntityClaim::Stale { applied }) => {
                let d = self.stale(p, env, &version, &applied);
                Err(self.refuse(p, env, owned, d))
            }
            Ok(EntityClaim::Busy {
                version: running,
                held_until,
            }) => {
                // Waiting needs the record released first, at once: shared data only.
                if policy.on_in_flight == OnInFlight::Wait && !p.store.makes_calls() {
                    self.release_unrun(p, env, owned);
                    if let Some(d) = self.start_or_keep_waiting_on(
                        p,
                        env,
                        held_until,
                        RecordTimes::default(),
                        entity,
                    ) {
                        return Err(d);
                    }
                    if self.wait_deadline.is_some() {
                        env.count(Counter::WaitTimeout);
                    }
                    return Err(self.entity_busy(p, env, &running, held_until));
                }
                let d = self.entity_busy(p, env, &running, held_until);
                Err(self.refuse(p, env, owned, d))
            }
            Err(e @ (StoreError::BucketFull | StoreError::ScopeFull)) => {
                let why = format!("entity {}: {e}", short_hex(&entity));
                if p.config.on_store_full == OnStoreFull::Open {
                    // As for a failed store: the record's claim stands, the request runs
                    // once, unordered.
                    env.count(Counter::StoreErrors);
                    env.count(Counter::FailedOpen);
                    env.warn(&format!(
                        "stream {}: store full: {why}; forwarding unordered (on_store_full open)",
                        self.id
                    ));
                    order.unordered = true;
                    return Ok(owned);
                }
                let detail = "no room to keep this request's entity (its entity bucket holds only \
                     versions in flight); it was not forwarded";
                let d = self.refuse_full(p, env, &why, detail);
                Err(self.refuse(p, env, owned, d))
            }
            Err(e) if p.config.failure_mode == FailureMode::Open => {
                // The record's claim stands: the request runs once, unordered.
                env.count(Counter::StoreErrors);
                env.count(Counter::FailedOpen);
                env.warn(&format!(
                    "stream {}: ordering store error: {e}; forwarding unordered (failure_mode open)",
                    self.id
                ));
                order.unordered = true;
                Ok(owned)
            }
            Err(e) => {
                let d = self.store_failed(p, env, &e.to_string());
                Err(self.refuse(p, env, owned, d))
            }
        }
    }

    /// Answers `d` (decided: its verdict and counters are in) and releases the won
    /// claim `owned`, never forwarded; with etcd the answer follows the release call.
    pub(crate) fn refuse(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        d: Decision,
    ) -> Decision {
        match self.release_unrun(p, env, owned) {
            None => d,
            Some(call) => {
                if let Decision::Reply(r) = d {
                    self.reply_once_settled(Some(r));
                }
                Decision::Call(call)
            }
        }
    }

    /// The client's answer, sent once the settle calls out (etcd: the entity's, then the
    /// record's) are done.
    pub(crate) fn reply_once_settled(&mut self, reply: Option<LocalReply>) {
        if let Phase::Calling(c) = &mut self.phase {
            c.reply_once_settled(reply);
        }
    }

    /// The stream's entity is claimed (a store that claims it by calls says so).
    pub(crate) fn entity_claimed(&mut self) {
        if let Some(o) = self.order.as_mut() {
            o.claimed = true;
        }
    }

    /// The entity this stream settles, taken: (state, token), when it claimed the
    /// entity, or, forwarded unordered, when `how` is a completion (which raises the
    /// applied version whoever's flight stands).
    pub(crate) fn take_claimed_entity(&mut self, how: &Settle) -> Option<(Ordered, u64)> {
        let completes = matches!(how, Settle::Complete { .. });
        let o = self
            .order
            .take()
            .filter(|o| o.claimed || (o.unordered && completes))?;
        let OrderState { ordered, token, .. } = *o;
        Some((ordered, token))
    }

    /// The settle of a completion: the applied version rises to this request's.
    pub(crate) fn completed_entity(&self, p: &Plugin) -> Settle {
        let ttl_ms = p
            .config
            .policy_at(self.rule)
            .ordering
            .as_ref()
            .map_or(0, |o| o.ttl_ms);
        match &self.order {
            Some(o) => Settle::Complete {
                version: o.ordered.version.clone(),
                ttl_ms,
            },
            None => Settle::Release,
        }
    }

    fn stale(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        version: &Version,
        applied: &Version,
    ) -> Decision {
        env.count(Counter::Stale);
        let (v, a) = (version.show(), applied.show());
        let on_stale = p
            .config
            .policy_at(self.rule)
            .ordering
            .as_ref()
            .map_or(OnStale::Reject, |o| o.on_stale);
        let applied_header = (APPLIED_VERSION_HEADER.to_string(), a.clone().into_bytes());
        let reply = match on_stale {
            OnStale::Reject => {
                let detail = format!(
                    "version {v} of this entity is not above its applied version {a}; it was not forwarded"
                );
                Problem::StaleVersion.reply(&detail, vec![applied_header])
            }
            OnStale::Acknowledge { status } => {
                let mut headers =
                    vec![(STALE_HEADER.to_string(), b"true".to_vec()), applied_header];
                let body = if status == 204 {
                    Vec::new()
                } else {
                    headers.push(("content-type".to_string(), b"application/json".to_vec()));
                    serde_json::json!({"stale": true, "version": v, "applied_version": a})
                        .to_string()
                        .into_bytes()
                };
                LocalReply {
                    status,
                    headers,
                    body,
                    details: "proxy_dedup_stale",
                    problem: None,
                }
            }
        };
        self.reply(env, reply)
    }

    fn entity_busy(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        running: &Version,
        held_until: Option<u64>,
    ) -> Decision {
        env.count(Counter::RejectedInFlight);
        let (seconds, detail) = match held_until {
            Some(until) => (
                super::answer::retry_after_held(until, env.now_ms()),
                format!(
                    "version {} of this entity ended without a known outcome (it may have run); \
                     the entity is held until then",
                    running.show()
                ),
            ),
            None => (
                p.config.retry_after_seconds,
                format!(
                    "version {} of this entity is in flight; one version of an entity runs at a time; retry later",
                    running.show()
                ),
            ),
        };
        let retry = vec![("retry-after".to_string(), seconds.to_string().into_bytes())];
        self.reply(env, Problem::InFlight.reply(&detail, retry))
    }
}
