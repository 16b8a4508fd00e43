//! The shared-data store's side of a stream: the claim in this proxy's shared data,
//! and its completion, release or hold. Every call answers at once (no store call).

use super::store::layout_timed;
use super::HeldClaim;
use super::{wake, DedupStream, Duplicate, Env, Plugin};
use crate::config::OnDuplicate;
use crate::key::{short_hex, Digest};
use crate::metrics::Counter;
use crate::record::RecordTimes;
use crate::response::StoredResponse;
use crate::store::{Claim, ClaimOutcome, Layout, SharedStore, StoreError};
use crate::stream::Decision;

impl DedupStream {
    pub(super) fn claim_shared<E: Env>(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut E,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        let token = env.new_token();
        let now = env.now_ms();
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
                self.forward(p, env, HeldClaim::Shared(claim))
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
    pub(super) fn hold_shared<E: Env>(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut E,
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
    pub(super) fn complete_shared<E: Env>(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut E,
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
    pub(super) fn release_shared<E: Env>(
        &mut self,
        p: &Plugin,
        layout: &Layout,
        env: &mut E,
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
}
