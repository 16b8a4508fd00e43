//! The shared-data store's side of the store interface: the store as a stream sees it
//! (`SharedDataStore`), the claim a stream holds in it (`SharedHeld`), and the stream's
//! claim in this proxy's shared data with its completion, release or hold. Every
//! operation answers at once (no store call).

use super::entities::SharedEntities;
use super::{bucket_secret, Claim, ClaimOutcome, Layout, Purge, SharedStore, StoreError, WAYS};
use crate::config::{Config, Eviction, OnDuplicate, Policy, Role, StoreConfig};
use crate::key::{short_hex, Digest, RequestHead};
use crate::metrics::Counter;
use crate::ordering::entities::Settle;
use crate::record::RecordTimes;
use crate::response::StoredResponse;
use crate::stream::{
    wake, Decision, DedupStream, Duplicate, Env, Held, HeldClaim, Operated, Operation, Plugin,
    SetUpHost, Store, StoreCall, Waiting,
};
use serde_json::json;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

/// A waiter re-reads its record this often even without a wake-up (a claim that
/// expired, a notification lost with a dead worker).
pub const RECHECK_SHARED_MS: u64 = 500;

/// The shared-data store: the buckets every policy shares, timed for the longest-lived
/// policy (what the layout registry needs); a stream uses `layout_timed` for its policy.
/// A handle, cloned into every claim.
#[derive(Debug, Clone)]
pub struct SharedDataStore {
    pub(crate) layout: Arc<Layout>,
}

impl SharedDataStore {
    /// The store `config` (whose store is shared data) asks for.
    pub fn new(config: &Config) -> Self {
        let (max_store_bytes, eviction, scope_claims_per_bucket, max_entities) = match &config.store
        {
            StoreConfig::SharedData {
                max_store_bytes,
                eviction,
                scope_claims_per_bucket,
                max_entities,
                ..
            } => (
                *max_store_bytes,
                *eviction,
                *scope_claims_per_bucket,
                *max_entities,
            ),
            _ => (0, Eviction::Oldest, 0, 0),
        };
        // Every policy shares the buckets; the layout registers itself for as long as
        // the longest-lived policy's records may live.
        let top = &config.policy;
        let policies = || std::iter::once(top).chain(config.rules.iter().map(|r| &r.policy));
        let layout = Layout::new(
            config.namespace(),
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
            eviction == Eviction::Oldest,
            usize::try_from(scope_claims_per_bucket).unwrap_or(WAYS),
        )
        .with_max_store_bytes(max_store_bytes);
        let layout = if policies().any(|p| p.ordering.is_some()) {
            layout.with_entities(max_entities)
        } else {
            layout
        };
        SharedDataStore {
            layout: Arc::new(layout),
        }
    }

    /// A claim won in this store.
    fn held(&self, claim: Claim) -> HeldClaim {
        Box::new(SharedHeld {
            store: self.clone(),
            claim,
        })
    }
}

#[cfg(test)]
impl Plugin {
    /// The shared-data layout (an error when the store is another).
    pub fn layout(&self) -> Result<&Layout, StoreError> {
        self.store
            .as_any()
            .downcast_ref::<SharedDataStore>()
            .map(|s| &*s.layout)
            .ok_or_else(|| {
                StoreError::Host(crate::shared_data::HostFault(
                    "the store is not shared data: no layout".into(),
                ))
            })
    }

    /// The shared-data layout with a policy's timing.
    pub fn layout_for(&self, policy: &Policy) -> Result<Cow<'_, Layout>, StoreError> {
        Ok(layout_timed(self.layout()?, policy))
    }
}

/// The shared-data layout with a policy's timing (borrowed when it is the layout's).
pub(crate) fn layout_timed<'l>(layout: &'l Layout, policy: &Policy) -> Cow<'l, Layout> {
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

impl Store for SharedDataStore {
    fn describe(&self, _config: &Config) -> String {
        format!(
            "shared data, {} buckets, at most {} keys",
            self.layout.buckets,
            self.layout.max_keys()
        )
    }

    /// One secret per Envoy process keys the bucket choice: every worker must use the
    /// same, or a key would be claimed in two buckets. Then the layout registers itself,
    /// visible to the configurations already serving (a push); the admin role only reads
    /// the layouts the data plane registered.
    fn set_up(&mut self, host: &dyn SetUpHost, role: Role) -> Result<(), String> {
        let fresh = host
            .random_bytes()
            .map_err(|errno| format!("no random bytes for the bucket secret (errno {errno})"))?;
        let namespace = self.layout.namespace().to_string();
        let secret = bucket_secret(host, &namespace, fresh)
            .map_err(|e| format!("cannot set up the bucket secret: {e}"))?;
        let layout = Arc::make_mut(&mut self.layout);
        *layout = layout.clone().with_secret(secret);
        if role == Role::Data {
            if let Err(e) = SharedStore::new(host, &self.layout).register(host.now_ms()) {
                host.warn(&format!(
                    "proxy-dedup: cannot register the store layout yet: {e}"
                ));
            }
        }
        Ok(())
    }

    fn makes_calls(&self) -> bool {
        false
    }

    fn recheck_interval_ms(&self) -> u64 {
        RECHECK_SHARED_MS
    }

    fn claim(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        policy: &Policy,
        head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        s.scope_tag = {
            let _t = crate::phases::span(crate::phases::Phase::ScopeTag);
            self.layout.scope_tag(policy, head)
        };
        s.claim_shared(p, self, env, digest, payload)
    }

    /// A woken waiter claims again, at once.
    fn recheck(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        w: Box<Waiting>,
        _now: u64,
    ) -> Decision {
        s.claim_shared(p, self, env, w.digest, w.payload)
    }

    /// Answered at once: the layouts are searched as claims do.
    fn operate(&self, p: &Plugin, env: &mut dyn Env, op: &Operation, now: u64) -> Operated {
        let failed = |e: StoreError| Operated::Unavailable(format!("shared data failed: {e}"));
        let store = SharedStore::new(&*env, &self.layout);
        match *op {
            Operation::Stats => match store.stats(now) {
                Ok(st) => Operated::Stats(json!({
                    "store": "shared_data",
                    "buckets": st.buckets,
                    "capacity": st.ways,
                    "in_flight": st.in_flight,
                    "held": st.held,
                    "completed": st.completed,
                    "completed_not_stored": st.completed_not_stored,
                    "expired": st.expired,
                    "other_layouts": st.other_layouts,
                    "stored_bytes": st.stored_bytes,
                    "max_store_bytes": p.config.max_store_bytes(),
                })),
                Err(e) => failed(e),
            },
            Operation::Get { digest, .. } => match store.inspect(&digest, now) {
                Ok(Some(view)) => Operated::Found(view),
                Ok(None) => Operated::NotFound,
                Err(e) => failed(e),
            },
            Operation::Delete { digest, force, .. } => match store.purge(&digest, force, now) {
                Ok(Purge::Removed(view)) => Operated::Removed {
                    view: Some(view),
                    shard: None,
                },
                Ok(Purge::Refused(_)) => Operated::Refused,
                Ok(Purge::NotFound) => Operated::NotFound,
                Err(e) => failed(e),
            },
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A claim won in shared data, with its store.
struct SharedHeld {
    store: SharedDataStore,
    claim: Claim,
}

impl Held for SharedHeld {
    fn digest(&self) -> &Digest {
        &self.claim.digest
    }

    fn complete(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        response: Option<StoredResponse>,
        entity: Settle,
        now: u64,
    ) -> Option<StoreCall> {
        let layout = &self.store.layout;
        s.complete_shared(p, layout, env, &self.claim, response.as_ref(), now);
        s.settle_entity_shared(p, layout, env, entity);
        None
    }

    fn release(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        forwarded: bool,
    ) -> Option<StoreCall> {
        let layout = &self.store.layout;
        s.release_shared(p, layout, env, &self.claim, forwarded);
        if forwarded {
            s.settle_entity_shared(p, layout, env, Settle::Release);
        }
        None
    }

    fn hold(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        until_ms: Option<u64>,
    ) -> Option<StoreCall> {
        let layout = &self.store.layout;
        s.hold_shared(p, layout, env, &self.claim, until_ms);
        s.settle_entity_shared(p, layout, env, Settle::Hold { until_ms });
        None
    }

    fn claim_entity(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        token: u64,
        now: u64,
    ) -> Result<Box<dyn Held>, Decision> {
        let Some(order) = s.order.as_ref() else {
            return Ok(self);
        };
        let (entity, version) = (order.ordered().entity, order.ordered().version.clone());
        let policy = p.config.policy_at(s.rule);
        let layout = &self.store.layout;
        let until = now.saturating_add(layout_timed(layout, policy).claim_ms());
        let outcome = SharedEntities::new(&*env, layout)
            .scoped(s.scope_tag)
            .claim(&entity, &version, token, now, until);
        s.entity_decided(p, env, self, outcome)
    }
}

impl DedupStream {
    pub(crate) fn claim_shared(
        &mut self,
        p: &Plugin,
        store: &SharedDataStore,
        env: &mut dyn Env,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        let token = env.new_token();
        let now = env.now_ms();
        let layout = &*store.layout;
        let timed = layout_timed(layout, p.config.policy_at(self.rule));
        let outcome = SharedStore::new(&*env, &timed).claim_beside(
            &digest,
            &payload,
            self.legacy_record.as_ref(),
            self.scope_tag,
            now,
            token,
        );
        let times = outcome.as_ref().map_or(RecordTimes::default(), |(_, t)| *t);
        match outcome.map(|(o, _)| o) {
            Ok(ClaimOutcome::Claimed {
                claim,
                evicted_unexpired,
            }) => {
                if evicted_unexpired {
                    env.count(Counter::EvictionsUnexpired);
                }
                self.forward(p, env, store.held(claim))
            }
            Ok(ClaimOutcome::InFlight { held_until }) => {
                self.duplicate(p, env, Duplicate::InFlight { held_until }, times)
            }
            Ok(ClaimOutcome::PayloadMismatch) => {
                self.duplicate(p, env, Duplicate::PayloadMismatch, times)
            }
            Ok(ClaimOutcome::OtherCaller { unowned }) => {
                self.duplicate(p, env, Duplicate::OtherCaller { unowned }, times)
            }
            Ok(ClaimOutcome::CompletedNotStored) => {
                self.duplicate(p, env, Duplicate::NotStored, times)
            }
            Ok(ClaimOutcome::Completed(_))
                if p.config.policy_at(self.rule).on_duplicate == OnDuplicate::Reject =>
            {
                self.duplicate(p, env, Duplicate::Completed(None), times)
            }
            Ok(ClaimOutcome::Completed(done)) => {
                match SharedStore::new(&*env, layout).response(&done) {
                    Ok(Some(resp)) => {
                        self.duplicate(p, env, Duplicate::Completed(Some(resp)), times)
                    }
                    Ok(None) => self.duplicate(p, env, Duplicate::NotStored, times),
                    Err(e) => self.store_failed(p, env, &e.to_string()),
                }
            }
            Err(e @ (StoreError::BucketFull | StoreError::ScopeFull)) => {
                self.store_full(p, env, &e.to_string())
            }
            Err(e) => self.store_failed(p, env, &e.to_string()),
        }
    }

    /// An unknown outcome: mark the claim held (until `until_ms` when given, else until
    /// its in-flight expiry), so duplicates learn what it is. A hold past the layout's
    /// registered lifetime extends that registration first, so a capacity push never
    /// loses sight of it.
    pub(crate) fn hold_shared(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut dyn Env,
        claim: &Claim,
        until_ms: Option<u64>,
    ) {
        let now = env.now_ms();
        let timed = layout_timed(layout, p.config.policy_at(self.rule));
        let store = SharedStore::new(&*env, &timed);
        let held = (if until_ms.is_some() {
            store.register(now).map(|_| ())
        } else {
            Ok(())
        })
        .and_then(|()| store.hold(claim, until_ms));
        match held {
            // Waiters of a record kept until its TTL are answered now, not at their
            // timeout.
            Ok(true) if until_ms.is_some() => wake(p, env, &claim.digest),
            Ok(true) => {}
            Ok(false) => env.count(Counter::ClaimsLost),
            Err(e) => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: marking the claim held failed: {e}",
                    self.id
                ));
            }
        }
    }

    /// Writes the completed record (with the response when it fits its bucket's share).
    pub(crate) fn complete_shared(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut dyn Env,
        claim: &Claim,
        response: Option<&StoredResponse>,
        now: u64,
    ) {
        let timed = layout_timed(layout, p.config.policy_at(self.rule));
        let completed = SharedStore::new(&*env, &timed).complete(claim, response, now);
        match completed {
            Ok(done) if done.owned => {
                if response.is_some() && !done.stored {
                    // Larger than its bucket's share of `max_store_bytes`.
                    env.count(Counter::ResponseNotStored);
                }
                for _ in 0..done.dropped {
                    env.count(Counter::BodiesDropped);
                }
                env.debug(format_args!(
                    "stream {}: record {} completed (response kept: {}, bodies dropped: {})",
                    self.id,
                    short_hex(&claim.digest),
                    done.stored,
                    done.dropped
                ));
                wake(p, env, &claim.digest);
            }
            Ok(_) => {
                env.count(Counter::ClaimsLost);
                env.warn(&format!(
                    "stream {}: claim on record {} expired before the response came; not stored",
                    self.id,
                    short_hex(&claim.digest)
                ));
            }
            Err(e) => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: completing the record failed: {e}",
                    self.id
                ));
            }
        }
    }

    /// Removes the claim (`counted`: as a release; a claim never forwarded is not).
    pub(crate) fn release_shared(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut dyn Env,
        claim: &Claim,
        counted: bool,
    ) {
        match SharedStore::new(&*env, layout).release(claim) {
            Ok(true) => {
                if counted {
                    env.count(Counter::Released);
                }
                wake(p, env, &claim.digest);
            }
            Ok(false) => env.count(Counter::ClaimsLost),
            Err(e) => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: releasing the claim failed: {e}",
                    self.id
                ));
            }
        }
    }

    /// Ends the entity's flight in shared data as the record's claim ended (no-op when
    /// the stream holds no entity).
    pub(crate) fn settle_entity_shared(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut dyn Env,
        how: Settle,
    ) {
        let Some((ordered, token)) = self.take_claimed_entity(&how) else {
            return;
        };
        let now = env.now_ms();
        let store = SharedEntities::new(&*env, layout).scoped(self.scope_tag);
        match store.settle(&ordered.entity, token, &how, now) {
            Ok(true) => {}
            Ok(false) => env.count(Counter::ClaimsLost),
            Err(e) => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: settling entity {} failed: {e}",
                    self.id,
                    short_hex(&ordered.entity)
                ));
            }
        }
        // Waiters for the entity (another version, wait mode) try again.
        wake(p, env, &ordered.entity);
    }
}
