//! A shared-data bucket as bytes: its records and response-slot sizes, the layout
//! registry, and what a bucket answers about its ways (ownership, free ways, room under
//! the byte budget).

use super::{Claim, ClaimOutcome, WAYS};
use crate::key::Digest;

pub(super) const BUCKET_VERSION: u8 = 1;

pub(super) const RECORD_LEN: usize = 32 + 1 + 8 + 8 + 32;

/// The way byte of the bucket's slot-size entry. A reader without byte budgets skips it
/// like any way number past `WAYS`, so buckets stay readable by the previous version.
pub(super) const SLOTS_WAY: u8 = 0xFF;

/// A record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    InFlight = 1,
    /// Completed; the response is in the way's response slot.
    Completed = 2,
    /// Completed, but the response was too large to keep.
    CompletedNotStored = 3,
    /// Forwarded, but the filter cannot know whether the upstream ran it (client gone,
    /// route timeout, reset after sending): held like a claim until it expires.
    Held = 4,
}

impl RecordState {
    /// The name operators see.
    pub fn name(self) -> &'static str {
        match self {
            RecordState::InFlight => "in_flight",
            RecordState::Held => "held",
            RecordState::Completed => "completed",
            RecordState::CompletedNotStored => "completed_not_stored",
        }
    }

    /// A claim that still stands for a possibly running request: never evicted.
    pub(super) fn is_claim(self) -> bool {
        matches!(self, RecordState::InFlight | RecordState::Held)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) digest: Digest,
    pub(super) state: RecordState,
    pub(super) token: u64,
    pub(super) expires_ms: u64,
    pub(super) payload: Digest,
}

/// The layouts in use: bucket counts and until when their records may live (ms).
/// One small shared-data key per namespace, read by every claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Registry {
    pub(super) entries: Vec<(u64, u64)>,
}

pub(super) const REGISTRY_VERSION: u8 = 1;

/// A layout's entry is pushed forward at most once per this much time.
pub(super) const REGISTRY_SLACK_MS: u64 = 3_600_000;

impl Registry {
    pub(super) fn decode(bytes: &[u8]) -> Registry {
        let mut entries = Vec::new();
        if bytes.first() == Some(&REGISTRY_VERSION) {
            for e in bytes[1..].chunks_exact(16) {
                entries.push((u64_at(e, 0), u64_at(e, 8)));
            }
        }
        Registry { entries }
    }

    /// The layouts other than `own` whose records may still live.
    pub(super) fn others(&self, own: u64, now_ms: u64) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(b, until)| *b != own && *until > now_ms)
            .map(|(b, _)| *b)
            .collect()
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 16 * self.entries.len());
        out.push(REGISTRY_VERSION);
        for (buckets, until) in &self.entries {
            out.extend_from_slice(&buckets.to_be_bytes());
            out.extend_from_slice(&until.to_be_bytes());
        }
        out
    }
}

/// A bucket: its record ways, and the bytes each way's response slot holds (as this
/// store last wrote or blanked it), which the byte budget adds up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Bucket {
    pub(super) ways: [Option<Record>; WAYS],
    pub(super) slots: [u32; WAYS],
}

impl std::ops::Index<usize> for Bucket {
    type Output = Option<Record>;
    fn index(&self, way: usize) -> &Option<Record> {
        &self.ways[way]
    }
}

impl std::ops::IndexMut<usize> for Bucket {
    fn index_mut(&mut self, way: usize) -> &mut Option<Record> {
        &mut self.ways[way]
    }
}

impl Bucket {
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Option<Record>> {
        self.ways.iter()
    }

    #[cfg(test)]
    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Option<Record>> {
        self.ways.iter_mut()
    }

    /// Bytes of all response slots of the bucket.
    pub(super) fn slot_bytes(&self) -> u64 {
        self.slots.iter().map(|&n| u64::from(n)).sum()
    }
}

pub(super) fn decode_bucket(bytes: &[u8]) -> Bucket {
    let mut out = Bucket::default();
    // An empty value (never written, or a tombstone) or an unknown version is an empty bucket.
    if bytes.first() != Some(&BUCKET_VERSION) {
        return out;
    }
    for chunk in bytes[1..].chunks_exact(1 + RECORD_LEN) {
        if chunk[0] == SLOTS_WAY {
            for (way, n) in chunk[1..1 + 4 * WAYS].chunks_exact(4).enumerate() {
                out.slots[way] = u32::from_be_bytes([n[0], n[1], n[2], n[3]]);
            }
            continue;
        }
        let way = chunk[0] as usize;
        if way >= WAYS {
            continue;
        }
        let r = &chunk[1..];
        let state = match r[32] {
            1 => RecordState::InFlight,
            2 => RecordState::Completed,
            3 => RecordState::CompletedNotStored,
            4 => RecordState::Held,
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

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

pub(super) fn encode_bucket(bucket: &Bucket) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + (WAYS + 1) * (1 + RECORD_LEN));
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
    // Slot sizes ride in an entry of a record's size, written only once a slot holds bytes.
    if bucket.slots.iter().any(|&n| n > 0) {
        out.push(SLOTS_WAY);
        for n in bucket.slots {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out.resize(out.len() + RECORD_LEN - 4 * WAYS, 0);
    }
    out
}

/// Whether the claim's in-flight record is still in its way.
pub(super) fn owns(b: &Bucket, claim: &Claim) -> bool {
    b[claim.way].as_ref().is_some_and(|r| {
        r.digest == claim.digest && r.token == claim.token && r.state == RecordState::InFlight
    })
}

/// Whether the claim's in-flight record is still in its way and unexpired at `now_ms`.
pub(super) fn owns_at(b: &Bucket, claim: &Claim, now_ms: u64) -> bool {
    owns(b, claim) && b[claim.way].as_ref().is_some_and(|r| r.expires_ms > now_ms)
}

/// An empty way, else an expired one.
pub(super) fn free_way(b: &Bucket, now_ms: u64) -> Option<usize> {
    b.iter().position(Option::is_none).or_else(|| {
        b.iter()
            .position(|r| r.as_ref().is_some_and(|r| r.expires_ms <= now_ms))
    })
}

/// The ways whose slots to empty so that `size` bytes fit in `way`'s slot within
/// `budget`: dead ways first (no record, expired, held, completed without response),
/// then completed records closest to expiry. Unexpired in-flight ways are never
/// chosen: their owner may be writing its slot. `None` when even all of them are not
/// enough.
pub(super) fn room_for(
    b: &Bucket,
    way: usize,
    size: u32,
    budget: u64,
    now_ms: u64,
) -> Option<Vec<usize>> {
    let mut total = b.slot_bytes() - u64::from(b.slots[way]) + u64::from(size);
    if total <= budget {
        return Some(Vec::new());
    }
    let mut candidates: Vec<(bool, u64, usize)> = (0..WAYS)
        .filter(|&v| v != way && b.slots[v] > 0)
        .filter_map(|v| match &b[v] {
            None => Some((false, 0, v)),
            Some(r) if r.expires_ms <= now_ms => Some((false, r.expires_ms, v)),
            Some(r) => match r.state {
                RecordState::InFlight => None,
                RecordState::Completed => Some((true, r.expires_ms, v)),
                RecordState::Held | RecordState::CompletedNotStored => {
                    Some((false, r.expires_ms, v))
                }
            },
        })
        .collect();
    candidates.sort_unstable();
    let mut victims = Vec::new();
    for (_, _, v) in candidates {
        total -= u64::from(b.slots[v]);
        victims.push(v);
        if total <= budget {
            return Some(victims);
        }
    }
    None
}

/// The completed record closest to expiry: evicted when the bucket is full.
/// Claims (in flight or held) are never evicted, or a duplicate could run alongside
/// its original.
pub(super) fn oldest_completed(b: &Bucket) -> Option<usize> {
    b.iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
        .filter(|(_, r)| !r.state.is_claim())
        .min_by_key(|(_, r)| r.expires_ms)
        .map(|(i, _)| i)
}

/// What a claim answers for an unexpired record of its digest.
pub(super) fn existing(
    r: &Record,
    payload: &Digest,
    buckets: u64,
    bucket: u64,
    way: usize,
) -> ClaimOutcome {
    if &r.payload != payload {
        return ClaimOutcome::PayloadMismatch;
    }
    match r.state {
        RecordState::InFlight => ClaimOutcome::InFlight { held_until: None },
        RecordState::Held => ClaimOutcome::InFlight {
            held_until: Some(r.expires_ms),
        },
        RecordState::CompletedNotStored => ClaimOutcome::CompletedNotStored,
        RecordState::Completed => ClaimOutcome::Completed(Claim {
            digest: r.digest,
            token: r.token,
            buckets,
            bucket,
            way,
            slot_empty: false,
        }),
    }
}
