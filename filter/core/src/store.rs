//! The one-node store on Envoy shared data: set-associative buckets of records addressed
//! by digest, claimed with CAS, plus one response slot per record way.
//!
//! Envoy shared data has no delete and no atomic insert-if-absent (a set on an absent key
//! ignores its cas). So the store never writes one key per request: it writes a fixed
//! set of keys, `capacity / WAYS` bucket keys and at most `capacity` response slots,
//! whatever the traffic. A bucket is created with cas `u32::MAX` (absent: written,
//! present: CasMismatch), and every later change is a CAS on the value read.

use crate::key::Digest;
use crate::response::StoredResponse;

/// Records per bucket.
pub const WAYS: usize = 16;
/// CAS attempts before a claim gives up and reports contention.
const MAX_ATTEMPTS: usize = 64;
const BUCKET_VERSION: u8 = 1;
const RECORD_LEN: usize = 32 + 1 + 8 + 8 + 32;

/// A failure of the shared-data host calls other than NotFound / CasMismatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFault(pub String);

/// Result of a conditional set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    CasMismatch,
    Fault(HostFault),
}

/// Envoy's shared data as the store needs it (one call each, statuses mapped).
pub trait SharedData {
    /// `Ok(None)` when the key is absent; an empty value (tombstone) is `Some((vec![], cas))`.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault>;
    /// Envoy semantics: absent key ignores `cas`; `cas == 0` overwrites; stale cas mismatches.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError>;
}

/// Why the store could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    Host(HostFault),
    /// Every attempt lost its CAS race.
    Contention,
    /// Every record in the bucket is an unexpired in-flight claim.
    BucketFull,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Host(h) => write!(f, "shared data failed: {}", h.0),
            StoreError::Contention => write!(
                f,
                "shared data CAS contention after {MAX_ATTEMPTS} attempts"
            ),
            StoreError::BucketFull => write!(f, "bucket full of in-flight claims"),
        }
    }
}

/// A record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    InFlight = 1,
    /// Completed; the response is in the way's response slot.
    Completed = 2,
    /// Completed, but the response was too large to keep.
    CompletedNotStored = 3,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    digest: Digest,
    state: RecordState,
    token: u64,
    expires_ms: u64,
    payload: Digest,
}

/// A won claim: what completion and release need to find the record again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub digest: Digest,
    pub token: u64,
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
    /// Another request with this key has not answered yet.
    InFlight,
    /// The key completed; its response is in the slot this claim points to.
    Completed(Claim),
    /// The key completed but its response was not kept.
    CompletedNotStored,
    /// The key was used with another payload.
    PayloadMismatch,
}

/// Bucket geometry and timing for one plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
    pub buckets: u64,
    pub in_flight_ms: u64,
    pub ttl_ms: u64,
}

impl Layout {
    /// The key prefix includes the bucket count, so a reconfigured capacity never reads
    /// records laid out for another geometry.
    pub fn new(namespace: &str, capacity: u64, in_flight_ms: u64, ttl_ms: u64) -> Self {
        let buckets = (capacity / WAYS as u64).max(1);
        Layout {
            prefix: format!("{namespace}/{buckets}"),
            buckets,
            in_flight_ms,
            ttl_ms,
        }
    }

    pub fn bucket_of(&self, digest: &Digest) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(b) % self.buckets
    }

    pub fn bucket_key(&self, bucket: u64) -> String {
        format!("{}/b/{bucket}", self.prefix)
    }

    pub fn response_key(&self, bucket: u64, way: usize) -> String {
        format!("{}/r/{bucket}/{way}", self.prefix)
    }

    /// Upper bound of shared-data keys this layout ever writes.
    pub fn max_keys(&self) -> u64 {
        self.buckets * (1 + WAYS as u64)
    }
}

type Bucket = [Option<Record>; WAYS];

fn decode_bucket(bytes: &[u8]) -> Bucket {
    let mut out: Bucket = Default::default();
    // An empty value (never written, or a tombstone) or an unknown version is an empty bucket.
    if bytes.first() != Some(&BUCKET_VERSION) {
        return out;
    }
    for chunk in bytes[1..].chunks_exact(1 + RECORD_LEN) {
        let way = chunk[0] as usize;
        if way >= WAYS {
            continue;
        }
        let r = &chunk[1..];
        let state = match r[32] {
            1 => RecordState::InFlight,
            2 => RecordState::Completed,
            3 => RecordState::CompletedNotStored,
            _ => continue,
        };
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&r[..32]);
        let mut payload = [0u8; 32];
        payload.copy_from_slice(&r[49..81]);
        out[way] = Some(Record {
            digest,
            state,
            token: u64_at(r, 33),
            expires_ms: u64_at(r, 41),
            payload,
        });
    }
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

fn encode_bucket(bucket: &Bucket) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + WAYS * (1 + RECORD_LEN));
    out.push(BUCKET_VERSION);
    for (way, rec) in bucket.iter().enumerate() {
        if let Some(r) = rec {
            out.push(way as u8);
            out.extend_from_slice(&r.digest);
            out.push(r.state as u8);
            out.extend_from_slice(&r.token.to_be_bytes());
            out.extend_from_slice(&r.expires_ms.to_be_bytes());
            out.extend_from_slice(&r.payload);
        }
    }
    out
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

    fn read(&self, bucket: u64) -> Result<(Bucket, u32), StoreError> {
        match self
            .shared
            .get(&self.layout.bucket_key(bucket))
            .map_err(StoreError::Host)?
        {
            Some((bytes, cas)) => Ok((decode_bucket(&bytes), cas)),
            // Absent: create with a cas no live key holds, so a racing creator loses.
            None => Ok((Default::default(), u32::MAX)),
        }
    }

    /// Writes a bucket; `Ok(false)` when another writer got there first.
    fn write(&self, bucket: u64, b: &Bucket, cas: u32) -> Result<bool, StoreError> {
        match self
            .shared
            .set(&self.layout.bucket_key(bucket), &encode_bucket(b), cas)
        {
            Ok(()) => Ok(true),
            Err(SetError::CasMismatch) => Ok(false),
            Err(SetError::Fault(f)) => Err(StoreError::Host(f)),
        }
    }

    /// Claims `digest` for a request with payload fingerprint `payload`, atomically across
    /// every worker sharing this store: of any number of concurrent claims, one wins.
    pub fn claim(
        &self,
        digest: &Digest,
        payload: &Digest,
        now_ms: u64,
        token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let bucket = self.layout.bucket_of(digest);
        for _ in 0..MAX_ATTEMPTS {
            let (mut b, cas) = self.read(bucket)?;
            let mine = b
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| &r.digest == digest));
            if let Some(way) = mine {
                if let Some(r) = &b[way] {
                    if r.expires_ms > now_ms {
                        if &r.payload != payload {
                            return Ok(ClaimOutcome::PayloadMismatch);
                        }
                        return Ok(match r.state {
                            RecordState::InFlight => ClaimOutcome::InFlight,
                            RecordState::CompletedNotStored => ClaimOutcome::CompletedNotStored,
                            RecordState::Completed => ClaimOutcome::Completed(Claim {
                                digest: *digest,
                                token: r.token,
                                bucket,
                                way,
                            }),
                        });
                    }
                }
            }
            let (way, evicted_unexpired) = match mine.or_else(|| free_way(&b, now_ms)) {
                Some(w) => (w, false),
                None => match oldest_completed(&b) {
                    Some(w) => (w, true),
                    None => return Err(StoreError::BucketFull),
                },
            };
            b[way] = Some(Record {
                digest: *digest,
                state: RecordState::InFlight,
                token,
                expires_ms: now_ms.saturating_add(self.layout.in_flight_ms),
                payload: *payload,
            });
            if self.write(bucket, &b, cas)? {
                return Ok(ClaimOutcome::Claimed {
                    claim: Claim {
                        digest: *digest,
                        token,
                        bucket,
                        way,
                    },
                    evicted_unexpired,
                });
            }
        }
        Err(StoreError::Contention)
    }

    /// Marks a won claim completed and stores its response (`None`: too large to keep).
    /// Returns false when the claim was lost meanwhile (in-flight timeout, eviction): the
    /// record then belongs to someone else and is left alone.
    pub fn complete(
        &self,
        claim: &Claim,
        response: Option<&StoredResponse>,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut read_bucket = None;
        if let Some(resp) = response {
            // The slot is written before the record flips, so a reader that sees
            // Completed finds the body. The slot write is a CAS on the slot's own cas,
            // taken before ownership is checked: if a later owner of this way wrote its
            // response in between, ours fails and the recheck finds us no longer owner,
            // so a late completion never clobbers its successor's response. The digest
            // and token inside the slot let readers reject any other leftover.
            let bytes = resp.encode(&claim.digest, claim.token);
            let slot = self.layout.response_key(claim.bucket, claim.way);
            for attempt in 0.. {
                if attempt == MAX_ATTEMPTS {
                    return Err(StoreError::Contention);
                }
                let slot_cas = match self.shared.get(&slot).map_err(StoreError::Host)? {
                    Some((_, cas)) => cas,
                    None => u32::MAX,
                };
                let (b, cas) = self.read(claim.bucket)?;
                if !owns(&b, claim) {
                    return Ok(false);
                }
                match self.shared.set(&slot, &bytes, slot_cas) {
                    // The bucket just read is the first CAS attempt of the flip.
                    Ok(()) => {
                        read_bucket = Some((b, cas));
                        break;
                    }
                    Err(SetError::CasMismatch) => continue,
                    Err(SetError::Fault(f)) => return Err(StoreError::Host(f)),
                }
            }
        }
        let state = if response.is_some() {
            RecordState::Completed
        } else {
            RecordState::CompletedNotStored
        };
        self.update_own(claim, read_bucket, |r| {
            r.state = state;
            r.expires_ms = now_ms.saturating_add(self.layout.ttl_ms);
            true
        })
    }

    /// Releases a won claim (upstream 5xx, reset, no response) so a retry runs again.
    pub fn release(&self, claim: &Claim) -> Result<bool, StoreError> {
        self.update_own(claim, None, |_| false)
    }

    /// Applies `f` to the claim's own in-flight record (`false` from `f` empties the way).
    /// `first` is a bucket already read (with its cas), used for the first attempt.
    fn update_own(
        &self,
        claim: &Claim,
        mut first: Option<(Bucket, u32)>,
        f: impl Fn(&mut Record) -> bool,
    ) -> Result<bool, StoreError> {
        for _ in 0..MAX_ATTEMPTS {
            let (mut b, cas) = match first.take() {
                Some(read) => read,
                None => self.read(claim.bucket)?,
            };
            if !owns(&b, claim) {
                return Ok(false);
            }
            let keep = match b[claim.way].as_mut() {
                Some(r) => f(r),
                None => return Ok(false),
            };
            if !keep {
                b[claim.way] = None;
            }
            if self.write(claim.bucket, &b, cas)? {
                return Ok(true);
            }
        }
        Err(StoreError::Contention)
    }

    /// The stored response of a completed record, if its slot still holds it.
    pub fn response(&self, completed: &Claim) -> Result<Option<StoredResponse>, StoreError> {
        let key = self.layout.response_key(completed.bucket, completed.way);
        match self.shared.get(&key).map_err(StoreError::Host)? {
            Some((bytes, _)) => Ok(StoredResponse::decode(
                &bytes,
                &completed.digest,
                completed.token,
            )),
            None => Ok(None),
        }
    }
}

/// Whether the claim's in-flight record is still in its way.
fn owns(b: &Bucket, claim: &Claim) -> bool {
    b[claim.way].as_ref().is_some_and(|r| {
        r.digest == claim.digest && r.token == claim.token && r.state == RecordState::InFlight
    })
}

/// An empty way, else an expired one.
fn free_way(b: &Bucket, now_ms: u64) -> Option<usize> {
    b.iter().position(Option::is_none).or_else(|| {
        b.iter()
            .position(|r| r.as_ref().is_some_and(|r| r.expires_ms <= now_ms))
    })
}

/// The completed record closest to expiry: evicted when the bucket is full.
/// In-flight claims are never evicted, or a duplicate could run alongside its original.
fn oldest_completed(b: &Bucket) -> Option<usize> {
    b.iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
        .filter(|(_, r)| r.state != RecordState::InFlight)
        .min_by_key(|(_, r)| r.expires_ms)
        .map(|(i, _)| i)
}
