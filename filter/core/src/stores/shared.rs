//! The shared-data store, for one node: everything of it is in this folder. This file
//! holds its records: set-associative buckets of records addressed by digest, claimed
//! with CAS, plus one response slot per record way. The other rooms: `stream` (its side
//! of the store interface: `SharedDataStore`, the claim a stream holds, and the stream's
//! claim, completion, release and hold), `bucket` (the bucket codec), `layout` (the
//! geometry and byte budget), `entities` (the ordering guard's entity buckets), `admin`
//! (the operator view).
//!
//! Envoy shared data has no delete and no atomic insert-if-absent (a set on an absent key
//! ignores its cas). So the store never writes one key per request: it writes a fixed
//! set of keys, `capacity / WAYS` bucket keys and at most `capacity` response slots,
//! whatever the traffic. A bucket is created with cas `u32::MAX` (absent: written,
//! present: CasMismatch), and every later change is a CAS on the value read.

use crate::key::Digest;
use crate::phases::{span, Phase};
use crate::response::StoredResponse;
pub use crate::shared_data::{HostFault, SetError, SharedData, StoreError};

mod admin;
mod bucket;
mod entities;
mod layout;
mod stream;
pub use crate::record::RecordState;
use crate::record::RecordTimes;
pub use admin::{Purge, StoreStats};
use bucket::{
    completed_ttl_of, decode_bucket, encode_bucket, existing, free_way, live_claims_of,
    oldest_completed, owns, owns_at, records_of, room_for, times_of, Bucket, Record, Registry,
    REGISTRY_SLACK_MS,
};
pub use entities::SharedEntities;
pub use layout::Layout;
pub use stream::SharedDataStore;

pub use crate::geometry::WAYS;
/// CAS attempts before a claim gives up and reports contention.
use crate::shared_data::CAS_ATTEMPTS as MAX_ATTEMPTS;
/// A completion whose claim owns its way for at least this long writes its response
/// slot without reading it first (`SharedStore::complete`).
const SLOT_WRITE_MARGIN_MS: u64 = 1_000;
/// A conditional set: `Ok(false)` when another writer changed the key first.
fn cas_set<S: SharedData + ?Sized>(
    shared: &S,
    key: &str,
    value: &[u8],
    cas: u32,
) -> Result<bool, StoreError> {
    let _t = span(Phase::SharedWrite);
    match shared.set(key, value, cas) {
        Ok(()) => Ok(true),
        Err(SetError::CasMismatch) => Ok(false),
        Err(SetError::Fault(f)) => Err(StoreError::Host(f)),
    }
}

/// Bytes of the per-process bucket secret.
pub const SECRET_LEN: usize = 32;

/// The bucket secret of `namespace`: the one in shared data, or `fresh` written there
/// if none exists yet. Created with cas `u32::MAX`, so of two workers creating it at
/// once one loses and reads the winner's: every VM of the process uses the same secret.
pub fn bucket_secret<S: SharedData + ?Sized>(
    shared: &S,
    namespace: &str,
    fresh: [u8; SECRET_LEN],
) -> Result<[u8; SECRET_LEN], StoreError> {
    let key = format!("{namespace}/secret");
    for _ in 0..MAX_ATTEMPTS {
        let cas = match shared.get(&key).map_err(StoreError::Host)? {
            Some((v, cas)) => match <[u8; SECRET_LEN]>::try_from(v.as_slice()) {
                Ok(secret) => return Ok(secret),
                // A tombstone or garbage: replace it.
                Err(_) => cas,
            },
            None => u32::MAX,
        };
        if cas_set(shared, &key, &fresh, cas)? {
            return Ok(fresh);
        }
    }
    Err(StoreError::Contention)
}

/// A won claim: what completion and release need to find the record again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub digest: Digest,
    pub token: u64,
    /// The layout (bucket count) the record lives in: a config push may change the
    /// current one while this claim is out.
    pub buckets: u64,
    pub bucket: u64,
    pub way: usize,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This request owns the key: forward it.
    Claimed {
        claim: Claim,
        evicted_unexpired: bool,
    },
    /// Another request with this key has not answered yet; `held_until` (ms) is set
    /// when its outcome is unknown and the key is held until then.
    InFlight { held_until: Option<u64> },
    /// The key completed; its response is in the slot this claim points to.
    Completed(Claim),
    /// The key completed but its response was not kept.
    CompletedNotStored,
    /// The key was used with another payload.
    PayloadMismatch,
    /// The record is another caller's (`unowned`: written before records named their
    /// caller, met by a request that names one); see `principal::compare`.
    OtherCaller { unowned: bool },
}

/// What a completion did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    /// The claim was still ours and is now completed (false: lost, left alone).
    pub owned: bool,
    /// Its response is kept for replay.
    pub stored: bool,
    /// Bodies of other completed records dropped to keep the bucket within its budget.
    pub dropped: u32,
}

/// The store: stateless apart from the host it calls; every operation is a CAS loop.
pub struct SharedStore<'a, S: SharedData + ?Sized> {
    shared: &'a S,
    layout: &'a Layout,
}

impl<'a, S: SharedData + ?Sized> SharedStore<'a, S> {
    pub fn new(shared: &'a S, layout: &'a Layout) -> Self {
        SharedStore { shared, layout }
    }

    /// A shared-data read (timed as one in the phase-timed build).
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, crate::shared_data::HostFault> {
        let _t = span(Phase::SharedRead);
        self.shared.get(key)
    }

    fn read(&self, buckets: u64, bucket: u64) -> Result<(Bucket, u32), StoreError> {
        let (bytes, cas) = self.read_bytes(buckets, bucket)?;
        Ok((
            {
                let _t = span(Phase::BucketDecode);
                decode_bucket(&bytes)
            },
            cas,
        ))
    }

    /// A bucket's value as stored (empty when absent) and its cas.
    fn read_bytes(&self, buckets: u64, bucket: u64) -> Result<(Vec<u8>, u32), StoreError> {
        match self
            .get(&self.layout.bucket_key_in(buckets, bucket))
            .map_err(StoreError::Host)?
        {
            Some(read) => Ok(read),
            // Absent: create with a cas no live key holds, so a racing creator loses.
            None => Ok((Vec::new(), u32::MAX)),
        }
    }

    /// Writes a bucket; `Ok(false)` when another writer got there first.
    fn write(&self, buckets: u64, bucket: u64, b: &Bucket, cas: u32) -> Result<bool, StoreError> {
        let key = self.layout.bucket_key_in(buckets, bucket);
        let bytes = {
            let _t = span(Phase::BucketEncode);
            encode_bucket(b)
        };
        cas_set(self.shared, &key, &bytes, cas)
    }

    /// Claims `digest` for a request with payload fingerprint `payload`, atomically across
    /// every worker sharing this store: of any number of concurrent claims, one wins.
    /// Claims made under another live layout (a configuration before or after a push)
    /// count too: a claim won here yields to a live record there.
    /// `scope` is the request's `key::scope_tag` (0: unknown, no per-scope bounds).
    pub fn claim(
        &self,
        digest: &Digest,
        payload: &Digest,
        scope: u32,
        now_ms: u64,
        token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_timed(digest, payload, scope, now_ms, token)
            .map(|(outcome, _)| outcome)
    }

    /// `claim`, with the times of the record a duplicate found (what its answer
    /// advertises; none for a won claim).
    pub fn claim_timed(
        &self,
        digest: &Digest,
        payload: &Digest,
        scope: u32,
        now_ms: u64,
        token: u64,
    ) -> Result<(ClaimOutcome, RecordTimes), StoreError> {
        self.claim_beside(digest, payload, None, scope, now_ms, token)
    }

    /// `claim_timed`; a claim won also yields to a record of `legacy` (in any live
    /// layout) that names no caller while this request names one: a keyless caller's
    /// record from before callers were recorded (`stream.rs`, `legacy_record`).
    pub fn claim_beside(
        &self,
        digest: &Digest,
        payload: &Digest,
        legacy: Option<&Digest>,
        scope: u32,
        now_ms: u64,
        token: u64,
    ) -> Result<(ClaimOutcome, RecordTimes), StoreError> {
        // This layout is in the registry before its claim is written...
        if self.layout.registered_until.get() < self.registration_needed(now_ms) {
            self.register(now_ms)?;
        }
        let fresh = Record {
            digest: *digest,
            state: RecordState::InFlight,
            token,
            expires_ms: now_ms.saturating_add(self.layout.claim_ms()),
            payload: *payload,
        };
        let (outcome, times) = self.claim_in_own(&fresh, scope, now_ms)?;
        let ClaimOutcome::Claimed { claim, .. } = &outcome else {
            return Ok((outcome, times));
        };
        // ...and the registry is read after it. A claimer under another layout does the
        // same: of two concurrent claims, the later registry read sees the other's
        // layout, and its lookup there finds the other's claim (written before that
        // read), so at least one yields and the key never runs twice.
        let others = self.other_layouts(now_ms)?;
        for &buckets in &others {
            if let Some(found) = self.lookup(buckets, digest, payload, now_ms)? {
                self.update_own(claim, None, None, |_| false)?;
                return Ok(found);
            }
        }
        if let Some(legacy) = legacy {
            for buckets in std::iter::once(self.layout.buckets).chain(others) {
                if let Some(found @ (ClaimOutcome::OtherCaller { unowned: true }, _)) =
                    self.lookup(buckets, legacy, payload, now_ms)?
                {
                    self.update_own(claim, None, None, |_| false)?;
                    return Ok(found);
                }
            }
        }
        Ok((outcome, times))
    }

    /// How long the registry must keep this layout for a claim made at `now_ms`.
    fn registration_needed(&self, now_ms: u64) -> u64 {
        now_ms
            .saturating_add(self.layout.ttl_ms)
            .saturating_add(self.layout.claim_ms())
    }

    /// The other layouts whose records may still live, as the registry says now.
    fn other_layouts(&self, now_ms: u64) -> Result<Vec<u64>, StoreError> {
        let reg = match self
            .get(&self.layout.registry_key())
            .map_err(StoreError::Host)?
        {
            Some((bytes, _)) => Registry::decode(&bytes),
            None => Registry::default(),
        };
        Ok(reg.others(self.layout.buckets, now_ms))
    }

    /// Makes sure this layout is in the registry for as long as its records may live,
    /// and returns the other layouts whose records may still live. Claims do it; the
    /// glue also does it when a configuration is applied.
    pub fn register(&self, now_ms: u64) -> Result<Vec<u64>, StoreError> {
        let key = self.layout.registry_key();
        let own = self.layout.buckets;
        let needed = self.registration_needed(now_ms);
        for _ in 0..MAX_ATTEMPTS {
            let (mut reg, cas) = match self.get(&key).map_err(StoreError::Host)? {
                Some((bytes, cas)) => (Registry::decode(&bytes), cas),
                None => (Registry::default(), u32::MAX),
            };
            let current = reg.entries.iter().find(|(b, _)| *b == own).map(|e| e.1);
            if let Some(until) = current.filter(|until| *until >= needed) {
                self.layout.registered_until.set(until);
                return Ok(reg.others(own, now_ms));
            }
            let until = needed.saturating_add(REGISTRY_SLACK_MS);
            reg.entries.retain(|(b, u)| *b != own && *u > now_ms);
            reg.entries.push((own, until));
            if cas_set(self.shared, &key, &reg.encode(), cas)? {
                self.layout.registered_until.set(until);
                return Ok(reg.others(own, now_ms));
            }
        }
        Err(StoreError::Contention)
    }

    /// A live record of `digest` in another layout, as a claim would answer it.
    fn lookup(
        &self,
        buckets: u64,
        digest: &Digest,
        payload: &Digest,
        now_ms: u64,
    ) -> Result<Option<(ClaimOutcome, RecordTimes)>, StoreError> {
        let bucket = self.layout.bucket_in(buckets, digest);
        let (bytes, _) = self.read_bytes(buckets, bucket)?;
        let live = records_of(&bytes, digest).find(|(_, r)| r.expires_ms > now_ms);
        Ok(live.map(|(way, r)| {
            let times = times_of(&r, completed_ttl_of(&bytes, way), self.layout, now_ms);
            let outcome = existing(&r, payload, buckets, bucket, way, self.layout, now_ms);
            (outcome, times)
        }))
    }

    /// Claims in the current layout by writing `fresh`, the in-flight record.
    fn claim_in_own(
        &self,
        fresh: &Record,
        scope: u32,
        now_ms: u64,
    ) -> Result<(ClaimOutcome, RecordTimes), StoreError> {
        let (digest, payload) = (&fresh.digest, &fresh.payload);
        let buckets = self.layout.buckets;
        let bucket = self.layout.bucket_of(digest);
        for _ in 0..MAX_ATTEMPTS {
            let (bytes, cas) = self.read_bytes(buckets, bucket)?;
            // A duplicate's answer needs its own record only: the bucket is decoded
            // whole only when this claim writes it.
            let mine = records_of(&bytes, digest).next();
            if let Some((way, r)) = &mine {
                if r.expires_ms > now_ms {
                    let ttl_s = completed_ttl_of(&bytes, *way);
                    let times = times_of(r, ttl_s, self.layout, now_ms);
                    let outcome = existing(r, payload, buckets, bucket, *way, self.layout, now_ms);
                    return Ok((outcome, times));
                }
            }
            let mine = mine.map(|(way, _)| way);
            let mut b = {
                let _t = span(Phase::BucketDecode);
                decode_bucket(&bytes)
            };
            if scope > 0 && live_claims_of(&b, scope, now_ms) >= self.layout.scope_claims {
                return Err(StoreError::ScopeFull);
            }
            let own_scope = (scope > 0 && !self.layout.evict_any_scope).then_some(scope);
            let (way, evicted_unexpired) = match mine.or_else(|| free_way(&b, now_ms)) {
                Some(w) => (w, false),
                None => match oldest_completed(&b, own_scope) {
                    Some(w) => (w, true),
                    None => return Err(StoreError::BucketFull),
                },
            };
            b[way] = Some(fresh.clone());
            b.scopes[way] = scope;
            b.completed_ttl_s[way] = 0;
            if self.write(buckets, bucket, &b, cas)? {
                let claimed = ClaimOutcome::Claimed {
                    claim: Claim {
                        digest: *digest,
                        token: fresh.token,
                        buckets,
                        bucket,
                        way,
                    },
                    evicted_unexpired,
                };
                return Ok((claimed, RecordTimes::default()));
            }
        }
        Err(StoreError::Contention)
    }

    /// Marks a won claim completed and stores its response (`None`: too large to keep),
    /// saying whether the claim was still this stream's (`owned`), whether the response
    /// was kept and how many other responses were dropped to keep the bucket within its
    /// byte budget. A claim lost meanwhile (in-flight timeout, eviction) belongs to
    /// someone else, or is free for the next claim, and is left alone. A claim past its
    /// in-flight time is lost even if no one took its way yet: another layout (a
    /// configuration before or after a push) may already have run the key again, and a
    /// late completion here would answer its retries with this response.
    ///
    /// The bucket record counts the bytes of each way's response slot. When a response
    /// would take the bucket past its budget, slots of dead ways (no record, expired,
    /// held, completed without response) are blanked first, then the bodies of the
    /// completed records closest to expiry, which become completed-without-response:
    /// their keys answer `409 response-not-stored` and never run again. Claims are
    /// never touched (an in-flight owner may be writing its slot). If the response
    /// still does not fit, the record is completed without it.
    pub fn complete(
        &self,
        claim: &Claim,
        response: Option<&StoredResponse>,
        now_ms: u64,
    ) -> Result<Completion, StoreError> {
        let budget = self.layout.bucket_budget;
        let slot = self
            .layout
            .response_key(claim.buckets, claim.bucket, claim.way);
        // A response larger than a whole bucket's share is never kept.
        let mut bytes = response
            .map(|r| r.encode(&claim.digest, claim.token))
            .filter(|b| b.len() as u64 <= budget);
        let size = bytes
            .as_ref()
            .map_or(0, |b| u32::try_from(b.len()).unwrap_or(u32::MAX));
        let mut read_bucket = None;
        let mut written = false;
        let mut decided = false;
        if let Some(encoded) = &bytes {
            // The slot is written before the record flips, so a reader that sees
            // Completed finds the body. Ownership and room are checked on the bucket
            // first. While this claim owns its way for at least `SLOT_WRITE_MARGIN_MS`
            // more, no one else can own the way before this write lands (a way changes
            // owner only when its claim is released by its owner or expires), so the
            // slot is written unconditionally, without reading it for its cas: shared
            // data has no call that returns a cas without copying the value, and in a
            // full store every way's slot holds a response. An earlier owner's late
            // completion cannot clobber it either: it reads the slot's cas before it
            // checks ownership (below, or here under the margin) and so fails or finds
            // itself no longer owner. Closer to expiry, the loop below takes the cas.
            let (b, cas) = self.read(claim.buckets, claim.bucket)?;
            if !owns_at(&b, claim, now_ms) {
                return Ok(Completion::default());
            }
            if owns_at(&b, claim, now_ms.saturating_add(SLOT_WRITE_MARGIN_MS)) {
                if room_for(&b, claim.way, size, budget, now_ms).is_some() {
                    written = cas_set(self.shared, &slot, encoded, 0)?;
                }
                read_bucket = Some((b, cas));
                decided = true;
            }
        }
        if let (Some(encoded), false) = (&bytes, decided) {
            // Near its expiry, the slot write is a CAS on the slot's own cas,
            // taken before ownership is checked: if a later owner of this way wrote its
            // response in between, ours fails and the recheck finds us no longer owner,
            // so a late completion never clobbers its successor's response. The digest
            // and token inside the slot let readers reject any other leftover.
            for attempt in 0.. {
                if attempt == MAX_ATTEMPTS {
                    return Err(StoreError::Contention);
                }
                let slot_cas = match self.get(&slot).map_err(StoreError::Host)? {
                    Some((_, cas)) => cas,
                    None => u32::MAX,
                };
                let (b, cas) = self.read(claim.buckets, claim.bucket)?;
                if !owns_at(&b, claim, now_ms) {
                    return Ok(Completion::default());
                }
                if room_for(&b, claim.way, size, budget, now_ms).is_none() {
                    // Claims hold the rest of the budget: not worth writing.
                    read_bucket = Some((b, cas));
                    break;
                }
                if cas_set(self.shared, &slot, encoded, slot_cas)? {
                    // The bucket just read is the first CAS attempt of the flip.
                    read_bucket = Some((b, cas));
                    written = true;
                    break;
                }
            }
        }
        if !written {
            bytes = None;
        }
        for _ in 0..MAX_ATTEMPTS {
            let (mut b, cas) = match read_bucket.take() {
                Some(read) => read,
                None => self.read(claim.buckets, claim.bucket)?,
            };
            if !owns_at(&b, claim, now_ms) {
                if bytes.is_some() {
                    // Written for nothing: give the bytes back.
                    self.blank_slot_of(&slot, claim)?;
                }
                return Ok(Completion::default());
            }
            let mut completion = Completion {
                owned: true,
                stored: bytes.is_some(),
                dropped: 0,
            };
            let mut victims = Vec::new();
            if completion.stored {
                match room_for(&b, claim.way, size, budget, now_ms) {
                    Some(ways) => {
                        b.slots[claim.way] = size;
                        for v in ways {
                            if let Some(r) = b[v].as_mut() {
                                if r.state == RecordState::Completed && r.expires_ms > now_ms {
                                    completion.dropped += 1;
                                }
                                if r.state == RecordState::Completed {
                                    r.state = RecordState::CompletedNotStored;
                                }
                            }
                            b.slots[v] = 0;
                            // The victim's slot cas, read before the bucket write: if a
                            // new owner of that way writes its slot after the write, the
                            // blank below fails instead of erasing its response.
                            let key = self.layout.response_key(claim.buckets, claim.bucket, v);
                            if let Some((_, slot_cas)) = self.get(&key).map_err(StoreError::Host)? {
                                victims.push((key, slot_cas));
                            }
                        }
                    }
                    None => {
                        // Only claims hold the rest: keep the completion without the
                        // response (counted until our bytes are blanked below).
                        completion.stored = false;
                        b.slots[claim.way] = b.slots[claim.way].max(size);
                    }
                }
            }
            if let Some(r) = b[claim.way].as_mut() {
                r.state = if completion.stored {
                    RecordState::Completed
                } else {
                    RecordState::CompletedNotStored
                };
                r.expires_ms = now_ms.saturating_add(self.layout.ttl_ms);
            }
            // The TTL the record is written with, so readers know when it completed (a
            // TTL not in whole seconds, which no configuration gives, reads as unknown).
            b.completed_ttl_s[claim.way] = match self.layout.ttl_ms % 1000 {
                0 => u32::try_from(self.layout.ttl_ms / 1000).unwrap_or(0),
                _ => 0,
            };
            if !self.write(claim.buckets, claim.bucket, &b, cas)? {
                continue;
            }
            // Shared data has no delete: a dropped body's slot is overwritten with an
            // empty value, which readers take for "no response".
            for (key, slot_cas) in victims {
                self.blank(&key, slot_cas)?;
            }
            if bytes.is_some() && !completion.stored {
                self.blank_slot_of(&slot, claim)?;
            }
            return Ok(completion);
        }
        Err(StoreError::Contention)
    }

    /// Empties a slot unless it changed since `cas` was read.
    fn blank(&self, key: &str, cas: u32) -> Result<(), StoreError> {
        cas_set(self.shared, key, &[], cas).map(|_| ())
    }

    /// Empties a slot if it still holds the response of `claim`.
    fn blank_slot_of(&self, key: &str, claim: &Claim) -> Result<(), StoreError> {
        match self.get(key).map_err(StoreError::Host)? {
            Some((bytes, cas)) if StoredResponse::belongs(&bytes, &claim.digest, claim.token) => {
                self.blank(key, cas)
            }
            _ => Ok(()),
        }
    }

    /// Releases a won claim (the upstream answered a status not stored, or never got
    /// the request) so a retry runs again.
    pub fn release(&self, claim: &Claim) -> Result<bool, StoreError> {
        self.update_own(claim, None, None, |_| false)
    }

    /// Marks a won claim held: its outcome is unknown, so it stays until it expires
    /// (`until_ms` when given, never earlier than the claim's own expiry) and duplicates
    /// are told what it is. A claim no longer ours is left alone (`Ok(false)`).
    pub fn hold(&self, claim: &Claim, until_ms: Option<u64>) -> Result<bool, StoreError> {
        self.update_own(claim, None, None, |r| {
            r.state = RecordState::Held;
            if let Some(until) = until_ms {
                r.expires_ms = r.expires_ms.max(until);
            }
            true
        })
    }

    /// Applies `f` to the claim's own in-flight record (`false` from `f` empties the way).
    /// `first` is a bucket already read (with its cas), used for the first attempt;
    /// with `unexpired_at`, a record past its expiry then is no longer ours.
    fn update_own(
        &self,
        claim: &Claim,
        mut first: Option<(Bucket, u32)>,
        unexpired_at: Option<u64>,
        f: impl Fn(&mut Record) -> bool,
    ) -> Result<bool, StoreError> {
        for _ in 0..MAX_ATTEMPTS {
            let (mut b, cas) = match first.take() {
                Some(read) => read,
                None => self.read(claim.buckets, claim.bucket)?,
            };
            let ours = match unexpired_at {
                Some(now_ms) => owns_at(&b, claim, now_ms),
                None => owns(&b, claim),
            };
            if !ours {
                return Ok(false);
            }
            let keep = match b[claim.way].as_mut() {
                Some(r) => f(r),
                None => return Ok(false),
            };
            if !keep {
                b[claim.way] = None;
            }
            if self.write(claim.buckets, claim.bucket, &b, cas)? {
                return Ok(true);
            }
        }
        Err(StoreError::Contention)
    }

    /// The stored response of a completed record, if its slot still holds it.
    pub fn response(&self, completed: &Claim) -> Result<Option<StoredResponse>, StoreError> {
        let key = self
            .layout
            .response_key(completed.buckets, completed.bucket, completed.way);
        match self.get(&key).map_err(StoreError::Host)? {
            Some((bytes, _)) => Ok(StoredResponse::decode(
                &bytes,
                &completed.digest,
                completed.token,
            )),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests;
