//! The one store interface a stream talks to: the configured store (`StoreState`, built
//! once from the config) and the claim a stream holds in it (`HeldClaim`). Each
//! operation (claim, complete, release, hold, the answer to a store call, a waiter's
//! re-check, the operator API) goes to that store's own module: `shared` answers at once,
//! `etcd` returns the store call to make and carries its own config. This file is the
//! only place in `stream` that chooses between the two.

use super::etcd::{EntityOp, EtcdStore, Turn};
use super::{CallAnswer, Decision, DedupStream, Env, HeldClaim, Phase, Plugin, StoreCall, Waiting};
use crate::config::{Config, Eviction, Policy, StoreConfig};
use crate::key::{Digest, RequestHead};
use crate::ordering::entities::{Settle as EntitySettle, SharedEntities};
use crate::ordering::Ordered;
use crate::response::StoredResponse;
use crate::store::{HostFault, Layout, StoreError, WAYS};
use crate::wait::{POLL_ETCD_MS, RECHECK_SHARED_MS};
use std::borrow::Cow;

/// The configured store, with what it needs derived once from the config.
#[derive(Debug, Clone)]
pub enum StoreState {
    /// The buckets every policy shares, timed for the longest-lived policy (what the
    /// layout registry needs); a stream uses `layout_for` its policy.
    SharedData(Layout),
    /// etcd, with its settings (a policy's lease timing follows from its TTLs and the
    /// budget of one store operation, `timeout_ms`) and where its calls go.
    Etcd(EtcdStore),
}

impl HeldClaim {
    /// The record claimed.
    pub(super) fn digest(&self) -> &Digest {
        match self {
            HeldClaim::Shared(c) => &c.digest,
            HeldClaim::Etcd(o) => &o.digest,
        }
    }
}

impl StoreState {
    /// The store `config` asks for.
    pub fn new(config: &Config) -> Self {
        match &config.store {
            StoreConfig::SharedData {
                namespace,
                max_store_bytes,
                eviction,
                scope_claims_per_bucket,
                max_entities,
            } => {
                // Every policy shares the buckets; the layout registers itself for as
                // long as the longest-lived policy's records may live.
                let top = &config.policy;
                let policies =
                    || std::iter::once(top).chain(config.rules.iter().map(|r| &r.policy));
                let layout = Layout::new(
                    namespace,
                    config.capacity,
                    policies()
                        .map(|p| p.in_flight_timeout_ms)
                        .max()
                        .unwrap_or(0),
                    policies().map(|p| p.ttl_ms).max().unwrap_or(0),
                )
                // Registered for as long as the longest-lived policy's claims may live.
                .keeping_unknown(policies().any(Policy::keeps_unknown))
                .isolating_scopes(
                    *eviction == Eviction::Oldest,
                    usize::try_from(*scope_claims_per_bucket).unwrap_or(WAYS),
                )
                .with_max_store_bytes(*max_store_bytes);
                let layout = if policies().any(|p| p.ordering.is_some()) {
                    layout.with_entities(*max_entities)
                } else {
                    layout
                };
                StoreState::SharedData(layout)
            }
            StoreConfig::Etcd(ec) => StoreState::Etcd(EtcdStore::new(ec.clone())),
        }
    }

    /// The shared-data layout (an error when the store is etcd: no layout exists).
    pub fn layout(&self) -> Result<&Layout, StoreError> {
        match self {
            StoreState::SharedData(layout) => Ok(layout),
            StoreState::Etcd(_) => Err(StoreError::Host(HostFault(
                "the store is etcd: no shared-data layout".into(),
            ))),
        }
    }

    /// The shared-data layout, to set up its bucket secret and register it at
    /// configuration (`None` with etcd: nothing to set up).
    pub fn layout_mut(&mut self) -> Option<&mut Layout> {
        match self {
            StoreState::SharedData(layout) => Some(layout),
            StoreState::Etcd(_) => None,
        }
    }

    /// Whether the store is reached by store calls (etcd): their round trips are timed,
    /// and settling a won claim is one, so the glue holds the response (and buffers a
    /// storable body) until the store has the record.
    pub fn makes_calls(&self) -> bool {
        matches!(self, StoreState::Etcd(_))
    }

    /// How often a worker re-checks what its waiters wait for without a wake-up.
    pub fn recheck_interval_ms(&self) -> u64 {
        match self {
            StoreState::SharedData(_) => RECHECK_SHARED_MS,
            StoreState::Etcd(_) => POLL_ETCD_MS,
        }
    }

    /// The store in one line, for the configuration log.
    /// The store in words, for the configuration's log line; `life_s` is the longest a
    /// key lives in etcd (`etcd::longest_key_life_s`), named in a resharding's step 2.
    pub fn describe(&self, life_s: Option<u64>) -> String {
        match self {
            StoreState::SharedData(layout) => format!(
                "shared data, {} buckets, at most {} keys",
                layout.buckets,
                layout.max_keys()
            ),
            StoreState::Etcd(ec) => format!(
                "etcd via {} ({}), prefix `{}`{}{}",
                describe_shards(&ec.config.shards),
                match ec.config.protocol {
                    crate::etcd::Protocol::Grpc => "gRPC",
                    crate::etcd::Protocol::Json => "JSON gateway",
                },
                ec.config.prefix,
                match &ec.config.check {
                    Some(c) => format!(
                        "; resharding: also checking {} ({})",
                        describe_shards(&c.shards),
                        c.role.field()
                    ),
                    None => String::new(),
                },
                match (&ec.config.check, life_s) {
                    (Some(c), Some(s)) if c.role == crate::config::CheckRole::Previous => format!(
                        "; drop store.previous_shards no sooner than {s} s ({}) after every proxy runs this configuration, plus your clock skew",
                        human_duration(s)
                    ),
                    _ => String::new(),
                }
            ),
        }
    }
}

/// Seconds in words (`1 d 0 h 2 min 40 s`), for the log line.
pub fn human_duration(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{sec} s"),
        (0, 0, _) => format!("{m} min {sec} s"),
        (0, _, _) => format!("{h} h {m} min {sec} s"),
        _ => format!("{d} d {h} h {m} min {sec} s"),
    }
}

/// A shard map in words: `cluster `etcd`` for one shard named after its cluster, else
/// each shard's name and cluster.
fn describe_shards(shards: &[crate::config::ShardConfig]) -> String {
    match shards {
        [one] if one.name == one.cluster => format!("cluster `{}`", one.cluster),
        _ => {
            let list: Vec<String> = shards
                .iter()
                .map(|s| format!("`{}` (cluster `{}`)", s.name, s.cluster))
                .collect();
            format!("{} shards: {}", shards.len(), list.join(", "))
        }
    }
}

/// Work that differs by store, done by someone outside the store modules (the operator
/// API): the store picks the method, so the choice of store stays here.
pub trait StoreVisit {
    type Out;
    fn shared_data(self, layout: &Layout) -> Self::Out;
    fn etcd(self, store: &EtcdStore) -> Self::Out;
}

impl StoreState {
    /// Runs the visitor's method for this store.
    pub fn visit<V: StoreVisit>(&self, v: V) -> V::Out {
        match self {
            StoreState::SharedData(layout) => v.shared_data(layout),
            StoreState::Etcd(ec) => v.etcd(ec),
        }
    }
}

/// The shared-data layout with a policy's timing (borrowed when it is the layout's).
pub(super) fn layout_timed<'l>(layout: &'l Layout, policy: &Policy) -> Cow<'l, Layout> {
    if policy.in_flight_timeout_ms == layout.in_flight_ms
        && policy.ttl_ms == layout.ttl_ms
        && policy.keeps_unknown() == layout.keep_unknown
    {
        Cow::Borrowed(layout)
    } else {
        Cow::Owned(layout.timed(
            policy.in_flight_timeout_ms,
            policy.ttl_ms,
            policy.keeps_unknown(),
        ))
    }
}

impl DedupStream {
    /// Claims the record `digest` for this request, in the configured store.
    pub(super) fn claim<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        policy: &Policy,
        head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        match &p.store {
            StoreState::SharedData(layout) => {
                self.scope_tag = layout.scope_tag(policy, head);
                self.claim_shared(p, layout, env, digest, payload)
            }
            StoreState::Etcd(ec) => {
                // Only waiters are bounded per scope here (no secret is needed), so the
                // tag is computed only when some policy waits.
                if p.waits {
                    self.scope_tag = crate::key::scope_tag(policy, head, &[]);
                }
                self.claim_etcd(p, ec, env, digest, payload)
            }
        }
    }

    /// A woken waiter re-checks its record: shared data claims again at once; etcd
    /// claims when this worker's tier knows the record, else reads it (`Polling`) where
    /// it was found (during a resharding, perhaps on the other map's shard).
    pub(super) fn recheck<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        w: Box<Waiting>,
        now: u64,
    ) -> Decision {
        match &p.store {
            StoreState::SharedData(layout) => {
                self.claim_shared(p, layout, env, w.digest, w.payload)
            }
            StoreState::Etcd(ec) => {
                if env.local().get(&w.digest, now).is_some() {
                    return self.claim_etcd(p, ec, env, w.digest, w.payload);
                }
                let call = super::etcd::poll_call(ec, &w.digest, self.waits_on_other_map);
                self.phase = Phase::Polling(w);
                Decision::Call(call)
            }
        }
    }

    /// The answer to a store call of `phase` (only etcd makes them; any other phase is
    /// kept as it is).
    pub(super) fn store_answered<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        phase: Phase,
        answer: CallAnswer,
    ) -> Decision {
        let StoreState::Etcd(ec) = &p.store else {
            self.phase = phase;
            return Decision::Continue;
        };
        match phase {
            Phase::Claiming(c) => self.claim_step(p, ec, env, c, answer),
            Phase::Ordering(e) => self.entity_answered(p, ec, env, e, &answer),
            Phase::Settling(st) => self.settled(p, ec, env, st, &answer),
            Phase::Polling(w) => self.polled(p, ec, env, w, &answer),
            other => {
                self.phase = other;
                Decision::Continue
            }
        }
    }

    /// Writes the completed record (with `response` when the store keeps it).
    pub(super) fn complete_claim<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
        response: Option<StoredResponse>,
        now: u64,
    ) -> Option<StoreCall> {
        match (owned, &p.store) {
            (HeldClaim::Shared(claim), StoreState::SharedData(layout)) => {
                self.complete_shared(p, layout, env, &claim, response.as_ref(), now);
                let how = self.completed_entity(p);
                self.settle_entity_shared(p, layout, env, how);
                None
            }
            (HeldClaim::Etcd(o), StoreState::Etcd(ec)) => {
                let call = self.complete_etcd(p, ec, env, o, response, now);
                let how = self.completed_entity(p);
                Some(self.entity_first(p, ec, env, how).unwrap_or(call))
            }
            // A claim is made in the configured store only.
            _ => None,
        }
    }

    /// Removes the claim: the request certainly did not run.
    pub(super) fn release_claim<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
    ) -> Option<StoreCall> {
        match (owned, &p.store) {
            (HeldClaim::Shared(claim), StoreState::SharedData(layout)) => {
                self.release_shared(p, layout, env, &claim, true);
                self.settle_entity_shared(p, layout, env, EntitySettle::Release);
                None
            }
            (HeldClaim::Etcd(o), StoreState::Etcd(ec)) => {
                let call = self.release_etcd(ec, env, &o);
                Some(
                    self.entity_first(p, ec, env, EntitySettle::Release)
                        .unwrap_or(call),
                )
            }
            _ => None,
        }
    }

    /// Marks the claim held (an unknown outcome): until `until_ms` when given, else
    /// until its in-flight expiry.
    pub(super) fn hold_claim<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
        until_ms: Option<u64>,
    ) -> Option<StoreCall> {
        match (owned, &p.store) {
            (HeldClaim::Shared(claim), StoreState::SharedData(layout)) => {
                self.hold_shared(p, layout, env, &claim, until_ms);
                self.settle_entity_shared(p, layout, env, EntitySettle::Hold { until_ms });
                None
            }
            (HeldClaim::Etcd(o), StoreState::Etcd(ec)) => {
                let call = self.hold_etcd(ec, env, &o, until_ms);
                Some(
                    self.entity_first(p, ec, env, EntitySettle::Hold { until_ms })
                        .unwrap_or(call),
                )
            }
            _ => None,
        }
    }
}

impl DedupStream {
    /// Releases a won claim that was never forwarded (its entity said no): not counted
    /// as a release, its waiters woken. With etcd, the release call to make (the stream
    /// is then `Settling`).
    pub(super) fn release_unrun<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
    ) -> Option<StoreCall> {
        match (owned, &p.store) {
            (HeldClaim::Shared(claim), StoreState::SharedData(layout)) => {
                self.release_shared(p, layout, env, &claim, false);
                None
            }
            (HeldClaim::Etcd(o), StoreState::Etcd(ec)) => Some(self.unwind_etcd(ec, env, &o)),
            _ => None,
        }
    }

    /// Claims the stream's entity for its version in the configured store, for the won
    /// record claim `owned` (see `claim_entity`).
    pub(super) fn claim_entity_in_store<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
        token: u64,
        now: u64,
    ) -> Result<HeldClaim, Decision> {
        let Some(order) = self.order.as_ref() else {
            return Ok(owned);
        };
        let (entity, version) = (order.ordered().entity, order.ordered().version.clone());
        let policy = p.config.policy_at(self.rule);
        match &p.store {
            StoreState::SharedData(layout) => {
                let until = now.saturating_add(layout_timed(layout, policy).claim_ms());
                let outcome = SharedEntities::new(&*env, layout)
                    .scoped(self.scope_tag)
                    .claim(&entity, &version, token, now, until);
                self.entity_decided(p, env, owned, outcome)
            }
            StoreState::Etcd(ec) => {
                let life = if policy.keeps_unknown() {
                    policy.ttl_ms.max(policy.in_flight_timeout_ms)
                } else {
                    policy.in_flight_timeout_ms
                };
                let turn = Turn {
                    ordered: Ordered { entity, version },
                    token,
                    until_ms: now.saturating_add(life),
                };
                Err(self.claim_entity_etcd(p, ec, env, owned, turn))
            }
        }
    }

    /// etcd: when the stream holds a claimed entity, its settle goes first and the
    /// record's (the `Settling` just built) follows: the call to send first.
    fn entity_first<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        how: EntitySettle,
    ) -> Option<StoreCall> {
        let (ordered, token, held) = self.take_claimed_entity(&how)?;
        let then = match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Settling(st) => Some(st),
            other => {
                self.phase = other;
                None
            }
        };
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
