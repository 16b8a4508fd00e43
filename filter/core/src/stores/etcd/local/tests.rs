//! Tests of the local tier's bounds.

use crate::response::StoredResponse;

use crate::stores::etcd::local::{LocalEntry, LocalTier, MAX_AGE_MS, MAX_BYTES, MAX_ENTRIES};

fn d(i: usize) -> [u8; 32] {
    let mut x = [0u8; 32];
    x[..8].copy_from_slice(&(i as u64).to_be_bytes());
    x
}

fn entry(body: usize, header: usize, expires_ms: u64) -> LocalEntry {
    LocalEntry {
        payload: [1; 32],
        expires_ms,
        response: Some(StoredResponse {
            status: 200,
            headers: vec![("x-h".into(), vec![b'v'; header])],
            body: vec![b'b'; body],
        }),
    }
}

/// What an entry costs, as the tier documents it: 96 bytes, the body, and each
/// header's name and value plus 16.
fn cost(body: usize, header: usize) -> usize {
    96 + body + (3 + header + 16)
}

const NOW: u64 = 1_000_000;
const LIVE: u64 = NOW + 1_000;

#[test]
fn entries_are_answered_until_they_expire_or_age_out() {
    let mut t = LocalTier::default();
    assert!(t.is_empty());
    t.insert(d(1), entry(10, 5, LIVE), NOW);
    assert!(!t.is_empty());
    assert_eq!((t.len(), t.bytes()), (1, cost(10, 5)));
    assert_eq!(
        t.get(&d(1), LIVE - 1).map(|e| e.response.is_some()),
        Some(true)
    );
    assert!(t.get(&d(1), LIVE).is_none());
    assert_eq!((t.len(), t.bytes()), (0, 0));
    // A long TTL is answered for MAX_AGE_MS at most.
    t.insert(d(2), entry(0, 0, NOW + 3_600_000), NOW);
    assert!(t.get(&d(2), NOW + MAX_AGE_MS - 1).is_some());
    // ...and keeps the record's own expiry, which a duplicate is told.
    assert_eq!(
        t.get(&d(2), NOW).map(|e| e.expires_ms),
        Some(NOW + 3_600_000)
    );
    assert!(t.get(&d(2), NOW + MAX_AGE_MS).is_none());
    // Completed without a response: the fixed cost only.
    let bare = LocalEntry {
        payload: [0; 32],
        expires_ms: LIVE,
        response: None,
    };
    t.insert(d(3), bare, NOW);
    assert_eq!(t.bytes(), 96);
}

#[test]
fn replacing_an_entry_counts_its_bytes_once() {
    let mut t = LocalTier::default();
    t.insert(d(1), entry(1_000, 10, LIVE), NOW);
    t.insert(d(1), entry(50, 10, LIVE), NOW);
    assert_eq!((t.len(), t.bytes()), (1, cost(50, 10)));
}

#[test]
fn an_entry_above_a_sixteenth_of_the_bytes_is_not_kept() {
    let mut t = LocalTier::default();
    let at_cap = MAX_BYTES / 16 - cost(0, 0);
    t.insert(d(1), entry(at_cap, 0, LIVE), NOW);
    assert_eq!(t.bytes(), MAX_BYTES / 16);
    t.insert(d(2), entry(at_cap + 1, 0, LIVE), NOW);
    assert!(t.get(&d(2), NOW).is_none());
    assert_eq!(t.len(), 1);
}

#[test]
fn a_full_tier_drops_expired_entries_before_live_ones() {
    let mut t = LocalTier::default();
    for i in 0..MAX_ENTRIES {
        // Every other entry expires at NOW + 10.
        let exp = if i % 2 == 0 { NOW + 10 } else { LIVE };
        t.insert(d(i), entry(0, 0, exp), NOW);
    }
    assert_eq!(t.len(), MAX_ENTRIES);
    t.insert(d(MAX_ENTRIES), entry(0, 0, LIVE), NOW + 10);
    assert_eq!(t.len(), MAX_ENTRIES / 2 + 1);
    for i in (1..MAX_ENTRIES).step_by(2) {
        assert!(
            t.get(&d(i), NOW + 10).is_some(),
            "live entry {i} was dropped"
        );
    }
    assert_eq!(t.bytes(), t.len() * cost(0, 0));
}

#[test]
fn a_full_tier_of_live_entries_makes_room_for_the_new_one() {
    let mut t = LocalTier::default();
    for i in 0..=MAX_ENTRIES {
        t.insert(d(i), entry(0, 0, LIVE), NOW);
    }
    assert_eq!(t.len(), MAX_ENTRIES);
    assert!(t.get(&d(MAX_ENTRIES), NOW).is_some());
    assert_eq!(t.bytes(), MAX_ENTRIES * cost(0, 0));
}

#[test]
fn a_tier_full_of_bytes_drops_expired_entries_before_live_ones() {
    let mut t = LocalTier::default();
    let body = MAX_BYTES / 16 - cost(0, 0);
    for i in 0..16 {
        let exp = if i % 2 == 0 { NOW + 10 } else { LIVE };
        t.insert(d(i), entry(body, 0, exp), NOW);
    }
    assert_eq!(t.bytes(), MAX_BYTES);
    // Eight more: the eight expired entries make room, no live one is dropped.
    for i in 16..24 {
        t.insert(d(i), entry(body, 0, LIVE), NOW + 10);
    }
    for i in (1..24).filter(|i| i % 2 == 1 || *i >= 16) {
        assert!(
            t.get(&d(i), NOW + 10).is_some(),
            "live entry {i} was dropped"
        );
    }
    assert_eq!(t.bytes(), MAX_BYTES);
}

#[test]
fn the_tier_never_holds_more_than_its_bytes() {
    let mut t = LocalTier::default();
    let body = MAX_BYTES / 16 - cost(0, 0);
    let mut inserted = 0;
    for i in 0..40 {
        t.insert(d(i), entry(body, 0, LIVE), NOW);
        inserted += 1;
        assert!(
            t.bytes() <= MAX_BYTES,
            "{} bytes after {inserted}",
            t.bytes()
        );
        assert!(t.get(&d(i), NOW).is_some(), "the newest entry is kept");
    }
    // Exactly 16 such entries fit.
    assert_eq!(t.len(), 16);
    assert_eq!(t.bytes(), MAX_BYTES);
}
