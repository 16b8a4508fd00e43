//! A shared-data bucket as bytes: its records and response-slot sizes, the layout
//! registry, and what a bucket answers about its ways (ownership, free ways, room under
//! the byte budget).

use super::{Claim, ClaimOutcome, Layout, WAYS};
use crate::key::Digest;
use crate::principal::{compare, PayloadMatch};
use crate::record::{RecordState, RecordTimes};
use crate::wire::{Reader, WireError, Writer};

pub(crate) const BUCKET_VERSION: u8 = 1;

pub(crate) const RECORD_LEN: usize = 32 + 1 + 8 + 8 + 32;

/// The way byte of the bucket's slot-size entry. A reader without byte budgets skips it
/// like any way number past `WAYS`, so buckets stay readable by the previous version.
pub(crate) const SLOTS_WAY: u8 = 0xFF;

/// The way byte of the bucket's scope-tag entry (`WAYS` u32, 0: unknown scope, as in a
/// bucket the previous version wrote). A reader without scope tags skips it as it skips
/// `SLOTS_WAY`, so buckets stay readable both ways.
pub(crate) const SCOPES_WAY: u8 = 0xFE;

/// The way byte of the bucket's completion entry: each way's TTL in seconds as its
/// completed record was written (`WAYS` u32; 0: unknown, as in a bucket the previous
/// version wrote), so the record's completion time is its expiry minus that TTL. A
/// reader without it skips it like `SCOPES_WAY`, and a writer without it drops it:
/// every way then reads as completed at an unknown time, never at a wrong one.
pub(crate) const TTLS_WAY: u8 = 0xFD;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The key's digest (scope and key): which request this record stands for.
    pub(crate) digest: Digest,
    pub(crate) state: RecordState,
    /// The claim's token: tells this claim from a later one of the same key.
    pub(crate) token: u64,
    /// In flight or held: when the claim lapses; completed: when the answer does.
    pub(crate) expires_ms: u64,
    /// The payload fingerprint: the same key with another payload is refused.
    pub(crate) payload: Digest,
}

/// The layouts in use: bucket counts and until when their records may live (ms).
/// One small shared-data key per namespace, read by every claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Registry {
    pub(crate) entries: Vec<(u64, u64)>,
}

pub(crate) const REGISTRY_VERSION: u8 = 1;

/// A layout's entry is pushed forward at most once per this much time.
pub(crate) const REGISTRY_SLACK_MS: u64 = 3_600_000;

impl Registry {
    /// Version, then (bucket count, live until ms) pairs; a stray tail is ignored.
    pub(crate) fn decode(bytes: &[u8]) -> Registry {
        let mut r = Reader::new(bytes);
        let mut entries = Vec::new();
        if r.u8() == Ok(REGISTRY_VERSION) {
            while let (Ok(buckets), Ok(until)) = (r.u64(), r.u64()) {
                entries.push((buckets, until));
            }
        }
        Registry { entries }
    }

    /// The layouts other than `own` whose records may still live.
    pub(crate) fn others(&self, own: u64, now_ms: u64) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(b, until)| *b != own && *until > now_ms)
            .map(|(b, _)| *b)
            .collect()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(1 + 16 * self.entries.len());
        w.u8(REGISTRY_VERSION);
        for &(buckets, until) in &self.entries {
            w.u64(buckets).u64(until);
        }
        w.finish()
    }
}

/// A bucket: its record ways, and the bytes each way's response slot holds (as this
/// store last wrote or blanked it), which the byte budget adds up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) ways: [Option<Record>; WAYS],
    pub(crate) slots: [u32; WAYS],
    /// Each way's scope tag (`key::scope_tag`), set when a claim takes the way.
    pub(crate) scopes: [u32; WAYS],
    /// Each way's TTL (seconds) its completed record was written with; 0: unknown.
    /// Set by a completion, cleared when a claim takes the way.
    pub(crate) completed_ttl_s: [u32; WAYS],
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
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Option<Record>> {
        self.ways.iter()
    }

    #[cfg(test)]
    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Option<Record>> {
        self.ways.iter_mut()
    }

    /// Bytes of all response slots of the bucket.
    pub(crate) fn slot_bytes(&self) -> u64 {
        self.slots.iter().map(|&n| u64::from(n)).sum()
    }
}

/// A bucket value: the version, then entries of `1 + RECORD_LEN` bytes, each a way
/// number and that way's record (digest, state, token, expiry, payload digest), or
/// `SLOTS_WAY` and the slot sizes (`WAYS` u32, zero-padded to a record's size). Entries
/// of an unknown way or state, and a stray tail, are skipped.
fn entries(bytes: &[u8]) -> std::slice::ChunksExact<'_, u8> {
    match bytes.split_first() {
        Some((&BUCKET_VERSION, rest)) => rest.chunks_exact(1 + RECORD_LEN),
        // An empty value (never written, or a tombstone) or an unknown version is an
        // empty bucket.
        _ => [].chunks_exact(1 + RECORD_LEN),
    }
}

/// What one entry holds.
enum Entry {
    Record(usize, Record),
    Slots([u32; WAYS]),
    Scopes([u32; WAYS]),
    CompletedTtls([u32; WAYS]),
    /// An unknown way or state: skipped.
    Unknown,
}

fn read_entry(entry: &[u8]) -> Result<Entry, WireError> {
    let mut r = Reader::new(entry);
    let way = r.u8()?;
    if way == SLOTS_WAY || way == SCOPES_WAY || way == TTLS_WAY {
        let mut values = [0u32; WAYS];
        for n in &mut values {
            *n = r.u32()?;
        }
        return Ok(match way {
            SLOTS_WAY => Entry::Slots(values),
            SCOPES_WAY => Entry::Scopes(values),
            _ => Entry::CompletedTtls(values),
        });
    }
    let way = usize::from(way);
    let digest = r.array()?;
    let Some(state) = RecordState::from_byte(r.u8()?) else {
        return Ok(Entry::Unknown);
    };
    if way >= WAYS {
        return Ok(Entry::Unknown);
    }
    Ok(Entry::Record(
        way,
        Record {
            digest,
            state,
            token: r.u64()?,
            expires_ms: r.u64()?,
            payload: r.array()?,
        },
    ))
}

pub(crate) fn decode_bucket(bytes: &[u8]) -> Bucket {
    let mut out = Bucket::default();
    for entry in entries(bytes) {
        match read_entry(entry) {
            Ok(Entry::Record(way, record)) => {
                if let Some(w) = out.ways.get_mut(way) {
                    *w = Some(record);
                }
            }
            Ok(Entry::Slots(slots)) => out.slots = slots,
            Ok(Entry::Scopes(scopes)) => out.scopes = scopes,
            Ok(Entry::CompletedTtls(ttls)) => out.completed_ttl_s = ttls,
            Ok(Entry::Unknown) | Err(_) => {}
        }
    }
    out
}

/// The records of `digest` in a bucket value, in way order, as `decode_bucket` would
/// give them, but decoding only those: the other entries are told apart by their way,
/// state and digest bytes in place.
pub(crate) fn records_of<'a>(
    bytes: &'a [u8],
    digest: &'a Digest,
) -> impl Iterator<Item = (usize, Record)> + 'a {
    // The entry each way ends up with: the last one of a known state.
    let mut last: [Option<&[u8]>; WAYS] = [None; WAYS];
    for entry in entries(bytes) {
        let (Some(&way), Some(&state)) = (entry.first(), entry.get(1 + 32)) else {
            continue;
        };
        if let (Some(slot), Some(_)) = (
            last.get_mut(usize::from(way)),
            RecordState::from_byte(state),
        ) {
            *slot = Some(entry);
        }
    }
    last.into_iter()
        .flatten()
        .filter(move |entry| entry.get(1..1 + 32) == Some(&digest[..]))
        .filter_map(|entry| match read_entry(entry) {
            Ok(Entry::Record(way, record)) => Some((way, record)),
            _ => None,
        })
}

/// The TTL (seconds) the completed record in `way` was written with, read from a bucket
/// value without decoding it (0: unknown), as `decode_bucket` would give it.
pub(crate) fn completed_ttl_of(bytes: &[u8], way: usize) -> u32 {
    let mut ttl = 0;
    for entry in entries(bytes).filter(|e| e.first() == Some(&TTLS_WAY)) {
        if let Ok(Entry::CompletedTtls(ttls)) = read_entry(entry) {
            ttl = ttls.get(way).copied().unwrap_or(0);
        }
    }
    ttl
}

/// When a completed record completed (ms), given the TTL it was written with (0:
/// unknown).
pub(crate) fn completed_at(r: &Record, ttl_s: u32) -> Option<u64> {
    let completed = matches!(
        r.state,
        RecordState::Completed | RecordState::CompletedNotStored
    );
    (completed && ttl_s > 0).then(|| r.expires_ms.saturating_sub(u64::from(ttl_s) * 1000))
}

pub(crate) fn encode_bucket(bucket: &Bucket) -> Vec<u8> {
    let mut w = Writer::with_capacity(1 + (WAYS + 3) * (1 + RECORD_LEN));
    w.u8(BUCKET_VERSION);
    for (way, rec) in bucket.iter().enumerate() {
        if let Some(r) = rec {
            w.u8(way as u8)
                .bytes(&r.digest)
                .u8(r.state as u8)
                .u64(r.token)
                .u64(r.expires_ms)
                .bytes(&r.payload);
        }
    }
    // Slot sizes ride in an entry of a record's size, written only once a slot holds bytes.
    if bucket.slots.iter().any(|&n| n > 0) {
        w.u8(SLOTS_WAY);
        for n in bucket.slots {
            w.u32(n);
        }
        w.zeros(RECORD_LEN - 4 * WAYS);
    }
    // Scope tags likewise, once a claim has written one.
    if bucket.scopes.iter().any(|&t| t > 0) {
        w.u8(SCOPES_WAY);
        for t in bucket.scopes {
            w.u32(t);
        }
        w.zeros(RECORD_LEN - 4 * WAYS);
    }
    // Completion TTLs likewise, once a completion has written one.
    if bucket.completed_ttl_s.iter().any(|&t| t > 0) {
        w.u8(TTLS_WAY);
        for t in bucket.completed_ttl_s {
            w.u32(t);
        }
        w.zeros(RECORD_LEN - 4 * WAYS);
    }
    w.finish()
}

/// Whether the claim's in-flight record is still in its way.
pub(crate) fn owns(b: &Bucket, claim: &Claim) -> bool {
    b[claim.way].as_ref().is_some_and(|r| {
        r.digest == claim.digest && r.token == claim.token && r.state == RecordState::InFlight
    })
}

/// Whether the claim's in-flight record is still in its way and unexpired at `now_ms`.
pub(crate) fn owns_at(b: &Bucket, claim: &Claim, now_ms: u64) -> bool {
    owns(b, claim) && b[claim.way].as_ref().is_some_and(|r| r.expires_ms > now_ms)
}

/// An empty way, else an expired one.
pub(crate) fn free_way(b: &Bucket, now_ms: u64) -> Option<usize> {
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
pub(crate) fn room_for(
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

/// The completed record closest to expiry: evicted when the bucket is full. With
/// `scope` (`store.eviction: "own_scope"`), only a record of that scope or of an unknown
/// one (written before scope tags) may go: another scope's traffic never makes a key
/// run twice. Claims (in flight or held) are never evicted, or a duplicate could run
/// alongside its original.
pub(crate) fn oldest_completed(b: &Bucket, scope: Option<u32>) -> Option<usize> {
    b.iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
        .filter(|(_, r)| !r.state.is_claim())
        .filter(|(i, _)| scope.is_none_or(|t| matches!(b.scopes[*i], 0) || b.scopes[*i] == t))
        .min_by_key(|(_, r)| r.expires_ms)
        .map(|(i, _)| i)
}

/// The unexpired claims (in flight or held) of scope `tag` in a bucket.
pub(crate) fn live_claims_of(b: &Bucket, tag: u32, now_ms: u64) -> usize {
    b.iter()
        .zip(b.scopes)
        .filter(|(r, t)| {
            *t == tag
                && r.as_ref()
                    .is_some_and(|r| r.state.is_claim() && r.expires_ms > now_ms)
        })
        .count()
}

/// The times a duplicate is told of an unexpired record (`ttl_s`: the TTL its completion
/// was written with, 0: unknown): a claim's is when it stops counting as in flight, a
/// held one's its hold's end, a completed one's its expiry and completion.
pub(crate) fn times_of(r: &Record, ttl_s: u32, layout: &Layout, now_ms: u64) -> RecordTimes {
    match r.state {
        // A kept claim lives until its TTL, but is in flight only for the in-flight time.
        RecordState::InFlight if !layout.claim_overdue(r.expires_ms, now_ms) => {
            RecordTimes::expiring(layout.in_flight_end(r.expires_ms))
        }
        RecordState::InFlight | RecordState::Held => RecordTimes::expiring(r.expires_ms),
        RecordState::Completed | RecordState::CompletedNotStored => RecordTimes {
            expires_ms: Some(r.expires_ms),
            completed_ms: completed_at(r, ttl_s),
        },
    }
}

/// What a claim answers for an unexpired record of its digest.
pub(crate) fn existing(
    r: &Record,
    payload: &Digest,
    buckets: u64,
    bucket: u64,
    way: usize,
    layout: &Layout,
    now_ms: u64,
) -> ClaimOutcome {
    match compare(&r.payload, payload) {
        PayloadMatch::Same => {}
        PayloadMatch::OtherPayload => return ClaimOutcome::PayloadMismatch,
        PayloadMatch::OtherCaller => return ClaimOutcome::OtherCaller { unowned: false },
        PayloadMatch::Unowned => return ClaimOutcome::OtherCaller { unowned: true },
    }
    match r.state {
        // A kept claim past its in-flight time: nobody settled it, its outcome is unknown.
        RecordState::InFlight if layout.claim_overdue(r.expires_ms, now_ms) => {
            ClaimOutcome::InFlight {
                held_until: Some(r.expires_ms),
            }
        }
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
        }),
    }
}

#[cfg(test)]
mod format_tests {
    use super::*;
    use crate::wire::unhex;

    /// A bucket as every version so far writes it (an in-flight record in way 0, a
    /// completed one in way 5 whose slot holds 300 bytes): a format change fails here,
    /// and buckets written before it must still decode.
    const BUCKET: &[&str] = &[
        "0100111111111111111111111111111111111111111111111111111111111111",
        "111101010203040506070800000000000003e822222222222222222222222222",
        "2222222222222222222222222222222222222205333333333333333333333333",
        "3333333333333333333333333333333333333333020000000000000007000001",
        "8bcfe56800444444444444444444444444444444444444444444444444444444",
        "4444444444ff00000000000000000000000000000000000000000000012c0000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000",
    ];

    fn completed() -> Record {
        Record {
            digest: [0x33; 32],
            state: RecordState::Completed,
            token: 7,
            expires_ms: 1_700_000_000_000,
            payload: [0x44; 32],
        }
    }

    fn bucket() -> Bucket {
        let mut b = Bucket::default();
        b[0] = Some(Record {
            digest: [0x11; 32],
            state: RecordState::InFlight,
            token: 0x0102_0304_0506_0708,
            expires_ms: 1_000,
            payload: [0x22; 32],
        });
        b[5] = Some(completed());
        b.slots[5] = 300;
        b
    }

    #[test]
    fn bucket_bytes_are_pinned() {
        assert_eq!(encode_bucket(&bucket()), unhex(BUCKET));
        assert_eq!(decode_bucket(&unhex(BUCKET)), bucket());
    }

    #[test]
    fn one_record_is_found_without_decoding_the_bucket() {
        let bytes = unhex(BUCKET);
        let found: Vec<_> = records_of(&bytes, &[0x33; 32]).collect();
        assert_eq!(found, vec![(5, completed())]);
        assert_eq!(records_of(&bytes, &[0x44; 32]).count(), 0);
        // A later entry for a way replaces the earlier one, as in a full decode: way 5
        // written again with way 0's record.
        let mut twice = bytes.clone();
        twice.push(5);
        twice.extend_from_slice(&bytes[2..2 + RECORD_LEN]);
        let full = decode_bucket(&twice);
        let found: Vec<_> = records_of(&twice, &[0x11; 32]).collect();
        assert_eq!(
            found,
            vec![(0, full[0].clone().unwrap()), (5, full[5].clone().unwrap())]
        );
        assert_eq!(records_of(&twice, &[0x33; 32]).count(), 0);
    }

    #[test]
    fn scope_tags_ride_in_an_entry_the_previous_version_skips() {
        let mut tagged = bucket();
        tagged.scopes[0] = 0x0a0b_0c0d;
        let bytes = encode_bucket(&tagged);
        // The pinned bucket, then one more entry: way 0xFE and the tags.
        let old = unhex(BUCKET);
        assert_eq!(&bytes[..old.len()], &old[..]);
        assert_eq!(bytes.len(), old.len() + 1 + RECORD_LEN);
        assert_eq!(bytes[old.len()], SCOPES_WAY);
        assert_eq!(
            &bytes[old.len() + 1..old.len() + 5],
            &[0x0a, 0x0b, 0x0c, 0x0d]
        );
        assert_eq!(decode_bucket(&bytes), tagged);
        // The previous version's reader skips any way past WAYS: it sees the bucket as
        // it was, and a bucket of the previous version reads with unknown scopes.
        assert_eq!(decode_bucket(&old).scopes, [0; WAYS]);
        let found: Vec<_> = records_of(&bytes, &[0x33; 32]).collect();
        assert_eq!(found, vec![(5, completed())]);
    }

    #[test]
    fn completion_ttls_ride_in_an_entry_the_previous_version_skips() {
        let mut timed = bucket();
        timed.completed_ttl_s[5] = 0x0102_0304;
        let bytes = encode_bucket(&timed);
        // The pinned bucket, then one more entry: way 0xFD and the TTLs.
        let old = unhex(BUCKET);
        assert_eq!(&bytes[..old.len()], &old[..]);
        assert_eq!(bytes.len(), old.len() + 1 + RECORD_LEN);
        assert_eq!(bytes[old.len()], TTLS_WAY);
        let at = old.len() + 1 + 4 * 5;
        assert_eq!(&bytes[at..at + 4], &[0x01, 0x02, 0x03, 0x04]);
        assert_eq!(decode_bucket(&bytes), timed);
        assert_eq!(completed_ttl_of(&bytes, 5), 0x0102_0304);
        assert_eq!(completed_ttl_of(&bytes, 0), 0);
        // A bucket of the previous version: every completion time unknown.
        assert_eq!(decode_bucket(&old).completed_ttl_s, [0; WAYS]);
        assert_eq!(completed_ttl_of(&old, 5), 0);
        assert_eq!(completed_at(&completed(), 0), None);
        // The previous version's reader skips the entry: its records read as they were.
        let found: Vec<_> = records_of(&bytes, &[0x33; 32]).collect();
        assert_eq!(found, vec![(5, completed())]);
        // Known: expiry minus the TTL; an in-flight way never has a completion time.
        assert_eq!(
            completed_at(&completed(), 60),
            Some(1_700_000_000_000 - 60_000)
        );
        assert_eq!(completed_at(timed[0].as_ref().unwrap(), 60), None);
    }

    #[test]
    fn registry_bytes_are_pinned() {
        let reg = Registry {
            entries: vec![(6250, 99), (16, 5)],
        };
        let bytes = unhex(&["01000000000000186a000000000000006300000000000000100000000000000005"]);
        assert_eq!(reg.encode(), bytes);
        assert_eq!(Registry::decode(&bytes), reg);
        // A stray tail is ignored, an unknown version is an empty registry.
        assert_eq!(
            Registry::decode(&[bytes.as_slice(), &[1, 2, 3]].concat()),
            reg
        );
        assert_eq!(Registry::decode(&[2]), Registry::default());
    }
}
