//! Tests of the byte budget of stored responses (`store.max_store_bytes`): each
//! bucket keeps its slots within its share, drops the oldest completed bodies first,
//! never touches claims, and a key whose body was dropped never runs again.

use super::{claimed, completed, in_bucket};
use crate::fake::FakeShared;
use crate::key::Digest;
use crate::response::StoredResponse;
use crate::stores::shared::{ClaimOutcome, Completion, Layout, SharedStore, WAYS};
use crate::testing::*;
use std::sync::Arc;

fn response(n: usize, tag: u8) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![],
        body: vec![tag; n],
    }
}

/// Slot bytes of a body of `n` bytes without headers (magic, digest, token, framing).
const SLOT_OVERHEAD: usize = 52;

/// Bytes physically held in response slots under `prefix` (what Envoy keeps in memory).
fn slot_bytes(shared: &FakeShared, prefix: &str) -> u64 {
    shared
        .keys()
        .iter()
        .filter(|k| k.starts_with(prefix))
        .map(|k| shared.raw(k).map_or(0, |(v, _)| v.len() as u64))
        .sum()
}

/// Claims `d` and completes it with `resp` at `now`.
fn complete(
    store: &SharedStore<'_, FakeShared>,
    d: &Digest,
    resp: &StoredResponse,
    now: u64,
) -> Completion {
    let claim = claimed(store.claim(d, &[7; 32], 0, now, now ^ 0x55));
    store.complete(&claim, Some(resp), now).unwrap()
}

/// `layout` over empty shared data, and `n` keys that land in bucket 0.
fn bucket_0(layout: Layout, n: usize) -> (Layout, Arc<FakeShared>, Vec<Digest>) {
    let keys = in_bucket(&layout, 0, n);
    (layout, FakeShared::new(), keys)
}

#[test]
fn every_bucket_keeps_its_slots_within_its_share_whatever_the_traffic() {
    // 4 buckets, 10,000 bytes each; 3,052-byte slots: three fit in a bucket.
    let layout = Layout::new("t", 64, 30_000, 600_000).with_max_store_bytes(40_000);
    assert_eq!(layout.bucket_budget, 10_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let mut dropped = 0;
    for i in 0..300u64 {
        let done = complete(&store, &digest(i), &response(3_000, i as u8), i);
        assert!(done.owned);
        assert!(done.stored, "a response within the share is always kept");
        dropped += done.dropped;
        for bucket in 0..4 {
            let held = slot_bytes(&shared, &format!("t/4/r/{bucket}/"));
            assert!(
                held <= 10_000,
                "bucket {bucket} holds {held} bytes after key {i}"
            );
        }
    }
    let st = store.stats(300).unwrap();
    assert_eq!(
        st.stored_bytes,
        slot_bytes(&shared, "t/4/r/"),
        "counted = held"
    );
    assert!(st.stored_bytes <= 40_000);
    // 300 completions, at most 12 bodies held: the rest were dropped or evicted with
    // their records (capacity 64), and the ones dropped were counted.
    assert!(dropped > 0);
    assert_eq!(st.completed, 12, "{st:?}");
}

#[test]
fn the_oldest_completed_bodies_go_first_and_their_keys_never_run_again() {
    let (layout, shared, keys) = bucket_0(
        Layout::new("t", 16, 30_000, 600_000).with_max_store_bytes(10_000),
        5,
    );
    let store = SharedStore::new(&*shared, &layout);
    let mut dropped = Vec::new();
    for (i, d) in keys.iter().enumerate() {
        let done = complete(&store, d, &response(3_000, i as u8), 1_000 * i as u64);
        assert!(done.owned && done.stored);
        dropped.push(done.dropped);
    }
    // Three fit; the fourth and fifth each pushed out the oldest one.
    assert_eq!(dropped, [0, 0, 0, 1, 1]);
    let now = 10_000;
    for (i, d) in keys.iter().enumerate() {
        match store.claim(d, &[7; 32], 0, now, 99).unwrap() {
            ClaimOutcome::CompletedNotStored => assert!(i < 2, "key {i} lost its body"),
            ClaimOutcome::Completed(done) => {
                assert!(i >= 2, "key {i} should have been dropped");
                assert_eq!(
                    store.response(&done).unwrap(),
                    Some(response(3_000, i as u8))
                );
            }
            other => panic!("key {i} must never run again, got {other:?}"),
        }
    }
    // The dropped bodies' slots were overwritten with nothing (shared data has no delete).
    assert_eq!(slot_bytes(&shared, "t/1/r/"), 3 * 3_052);
    // And they stay completed until their TTL like any other record.
    assert_eq!(
        store.claim(&keys[0], &[7; 32], 0, 600_000 - 1, 5).unwrap(),
        ClaimOutcome::CompletedNotStored
    );
}

#[test]
fn dead_slots_are_emptied_before_any_live_body() {
    // ttl 10 s: the first key's record expires; its slot still holds its bytes.
    let (layout, shared, keys) = bucket_0(
        Layout::new("t", 16, 5_000, 10_000).with_max_store_bytes(10_000),
        4,
    );
    let store = SharedStore::new(&*shared, &layout);
    complete(&store, &keys[0], &response(3_000, 0), 0);
    complete(&store, &keys[1], &response(3_000, 1), 9_000);
    complete(&store, &keys[2], &response(3_000, 2), 9_000);
    let done = complete(&store, &keys[3], &response(3_000, 3), 12_000);
    assert_eq!(
        (done.stored, done.dropped),
        (true, 0),
        "only dead bytes went"
    );
    for (i, d) in keys.iter().enumerate().skip(1) {
        let c = completed(store.claim(d, &[7; 32], 0, 12_001, 9));
        assert_eq!(store.response(&c).unwrap(), Some(response(3_000, i as u8)));
    }
    assert_eq!(slot_bytes(&shared, "t/1/r/"), 3 * 3_052);
}

#[test]
fn claims_are_never_dropped_and_a_response_that_does_not_fit_beside_them_is_not_kept() {
    let (layout, shared, keys) = bucket_0(
        Layout::new("t", 16, 30_000, 1_000).with_max_store_bytes(10_000),
        WAYS + 1,
    );
    let store = SharedStore::new(&*shared, &layout);
    // Key 0 completes with 6 KB and expires; its slot keeps the bytes.
    complete(&store, &keys[0], &response(6_000, 0), 0);
    // Fifteen claims fill the empty ways, the sixteenth takes key 0's expired way: it
    // is in flight over 6 KB it did not write, which nobody may blank under it.
    let mut claims = Vec::new();
    for (i, d) in keys[1..].iter().enumerate() {
        let claim = claimed(store.claim(d, &[7; 32], 0, 2_000, 100 + i as u64));
        claims.push(claim);
    }
    let reused = claims.last().unwrap().clone();
    let slot0 = layout.response_key(1, 0, reused.way);
    assert_eq!(shared.raw(&slot0).unwrap().0.len(), 6_052);
    // A 6 KB response elsewhere would need that way's bytes: it is completed without it.
    let done = store
        .complete(&claims[0], Some(&response(6_000, 1)), 2_500)
        .unwrap();
    assert_eq!((done.owned, done.stored, done.dropped), (true, false, 0));
    assert_eq!(
        store.claim(&keys[1], &[7; 32], 0, 2_600, 1).unwrap(),
        ClaimOutcome::CompletedNotStored,
        "completed without body: never runs again"
    );
    let own = layout.response_key(1, 0, claims[0].way);
    assert_eq!(
        shared.raw(&own).map_or(0, |(v, _)| v.len()),
        0,
        "not written where it cannot fit"
    );
    assert_eq!(
        shared.raw(&slot0).unwrap().0.len(),
        6_052,
        "the claim's way untouched"
    );
    // The claim over the old bytes completes and replaces them.
    let done = store
        .complete(&reused, Some(&response(2_000, 2)), 2_700)
        .unwrap();
    assert!(done.owned && done.stored);
    let c = completed(store.claim(&keys[WAYS], &[7; 32], 0, 2_800, 3));
    assert_eq!(store.response(&c).unwrap(), Some(response(2_000, 2)));
    assert!(slot_bytes(&shared, "t/1/r/") <= 10_000);
}

#[test]
fn a_response_larger_than_a_buckets_share_is_never_kept() {
    let layout = Layout::new("t", 16, 30_000, 600_000).with_max_store_bytes(10_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(1);
    let done = complete(&store, &d, &response(10_000 - SLOT_OVERHEAD + 1, 1), 0);
    assert_eq!((done.owned, done.stored), (true, false));
    assert_eq!(slot_bytes(&shared, "t/1/r/"), 0, "not even written");
    assert_eq!(
        store.claim(&d, &[7; 32], 0, 1, 2).unwrap(),
        ClaimOutcome::CompletedNotStored
    );
    // Exactly the share fits.
    let d = digest(2);
    let done = complete(&store, &d, &response(10_000 - SLOT_OVERHEAD, 2), 0);
    assert!(done.stored);
}

#[test]
fn racing_completions_in_one_bucket_never_undercount_nor_exceed_the_budget() {
    // Four workers complete keys of one bucket at once (CAS races on the bucket and
    // on the slots). Once they are done, the bytes held are within the budget and
    // never above what the bucket counts.
    for round in 0..10u64 {
        let shared = FakeShared::new();
        let layout = Arc::new(Layout::new("t", 16, 30_000, 600_000).with_max_store_bytes(10_000));
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (s, l) = (shared.clone(), layout.clone());
                std::thread::spawn(move || {
                    let store = SharedStore::new(&*s, &l);
                    for i in 0..12u64 {
                        let d = digest(round * 1_000 + t * 100 + i);
                        let now = i * 10 + t;
                        // Not claimed: a bucket full of in-flight claims, or contention.
                        if let Ok(ClaimOutcome::Claimed { claim, .. }) =
                            store.claim(&d, &[1; 32], 0, now, t << 32 | i)
                        {
                            let size = 1_000 + 700 * (i as usize % 4);
                            let _ = store.complete(&claim, Some(&response(size, i as u8)), now);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let store = SharedStore::new(&*shared, &layout);
        let held = slot_bytes(&shared, "t/1/r/");
        let counted = store.stats(1_000).unwrap().stored_bytes;
        assert!(held <= 10_000, "round {round}: {held} bytes held");
        assert!(
            held <= counted,
            "round {round}: {held} held, {counted} counted"
        );
        // Every completed record's body is there, whole.
        for t in 0..4u64 {
            for i in 0..12u64 {
                let d = digest(round * 1_000 + t * 100 + i);
                if let Ok(ClaimOutcome::Completed(c)) = store.claim(&d, &[1; 32], 0, 1_000, 7) {
                    let size = 1_000 + 700 * (i as usize % 4);
                    assert_eq!(store.response(&c).unwrap(), Some(response(size, i as u8)));
                }
            }
        }
    }
}
