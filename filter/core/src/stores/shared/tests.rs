//! Tests of the shared-data store on its own: CAS races, eviction, slots taken over,
//! layouts, errors. Its byte budget is in `budget.rs`.

mod budget;

use crate::fake::FakeShared;
use crate::key::Digest;
use crate::response::StoredResponse;
use crate::stores::shared::{Claim, ClaimOutcome, Layout, SharedStore, StoreError, WAYS};
use crate::testing::*;
use std::sync::Arc;

/// A response of `status` with this body and no headers.
fn stored(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

/// The claim a claim attempt won; panics on any other outcome.
fn claimed(r: Result<ClaimOutcome, StoreError>) -> Claim {
    match r.unwrap() {
        ClaimOutcome::Claimed { claim, .. } => claim,
        other => panic!("expected to win the claim, got {other:?}"),
    }
}

/// Asserts a claim attempt found the key in flight (not held); `why` says why.
fn in_flight(r: Result<ClaimOutcome, StoreError>, why: &str) {
    assert_eq!(
        r.unwrap(),
        ClaimOutcome::InFlight { held_until: None },
        "{why}"
    );
}

/// The completed claim a claim attempt found; panics on any other outcome.
fn completed(r: Result<ClaimOutcome, StoreError>) -> Claim {
    match r.unwrap() {
        ClaimOutcome::Completed(claim) => claim,
        other => panic!("expected a completed key, got {other:?}"),
    }
}

/// Just before the next shared-data write, worker B claims `d` under `layout` at `now`,
/// and wins.
fn b_claims_first(shared: &Arc<FakeShared>, layout: &Layout, d: Digest, p: Digest, now: u64) {
    let (s2, l2) = (shared.clone(), layout.clone());
    shared.before_next_set(move || {
        claimed(SharedStore::new(&*s2, &l2).claim(&d, &p, 0, now, 2));
    });
}

/// `n` digests that land in `bucket`.
fn in_bucket(layout: &Layout, bucket: u64, n: usize) -> Vec<Digest> {
    (0..)
        .map(digest)
        .filter(|d| layout.bucket_of(d) == bucket)
        .take(n)
        .collect()
}

#[test]
fn interleaved_claims_one_wins_the_cas_race() {
    let (layout, shared) = (Layout::new("t", 64, 30_000, 60_000), FakeShared::new());
    let d = digest(1);
    let p = [7u8; 32];
    SharedStore::new(&*shared, &layout).register(1000).unwrap();
    // Worker B claims between worker A's read and A's CAS (the bucket does not exist yet:
    // both saw it absent, and B's create wins).
    b_claims_first(&shared, &layout, d, p, 1000);
    in_flight(
        SharedStore::new(&*shared, &layout).claim(&d, &p, 0, 1000, 1),
        "A must see B's claim after losing the CAS",
    );

    // Same race on an existing bucket (cas path, not the create path).
    let d2 = digest(2);
    let (s3, l3) = (shared.clone(), layout.clone());
    let b2 = layout.bucket_of(&d2);
    SharedStore::new(&*shared, &layout)
        .claim(&digest(1000 + b2), &p, 0, 1000, 9)
        .unwrap();
    shared.before_next_set(move || {
        SharedStore::new(&*s3, &l3)
            .claim(&d2, &p, 0, 1000, 4)
            .unwrap();
    });
    assert_eq!(
        SharedStore::new(&*shared, &layout)
            .claim(&d2, &p, 0, 1000, 3)
            .unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
}

#[test]
fn interleaved_claims_on_other_keys_both_win() {
    let (layout, shared) = (Layout::new("t", 16, 30_000, 60_000), FakeShared::new()); // 2 buckets: collisions are likely
    let p = [0u8; 32];
    let (a, b) = (
        digest(10),
        (11..)
            .map(digest)
            .find(|d| layout.bucket_of(d) == layout.bucket_of(&digest(10)))
            .unwrap(),
    );
    b_claims_first(&shared, &layout, b, p, 0);
    assert!(matches!(
        SharedStore::new(&*shared, &layout)
            .claim(&a, &p, 0, 0, 1)
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // Both records are there: the retry re-read B's write instead of clobbering it.
    let store = SharedStore::new(&*shared, &layout);
    assert_eq!(
        store.claim(&a, &p, 0, 0, 3).unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
    assert_eq!(
        store.claim(&b, &p, 0, 0, 4).unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
}

#[test]
fn threads_racing_on_one_key_execute_exactly_once() {
    for round in 0..20u64 {
        let shared = FakeShared::new();
        let layout = Arc::new(Layout::new("t", 16, 30_000, 60_000));
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let (s, l) = (shared.clone(), layout.clone());
                std::thread::spawn(move || {
                    let store = SharedStore::new(&*s, &l);
                    // Every thread also claims and releases other keys in the same two
                    // buckets, so the CAS on the contested key keeps losing races.
                    let mut won = 0;
                    for i in 0..4 {
                        if let Ok(ClaimOutcome::Claimed { claim, .. }) = store.claim(
                            &digest(round * 100 + t * 10 + i + 1_000_000),
                            &[0; 32],
                            0,
                            0,
                            t,
                        ) {
                            assert!(store.release(&claim).unwrap());
                        }
                        if let Ok(ClaimOutcome::Claimed { .. }) =
                            store.claim(&digest(round), &[0; 32], 0, 0, t + 100)
                        {
                            won += 1;
                        }
                    }
                    won
                })
            })
            .collect();
        let wins: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(wins, 1, "round {round}");
    }
}

#[test]
fn half_full_store_evicts_almost_nothing() {
    // Buckets overflow by chance before the store is full; with 16 ways at half load the
    // share of records evicted early stays far below 0.2% (with 8 ways it was ~1%).
    let (layout, shared) = (
        Layout::new("t", 16_000, 30_000, 3_600_000),
        FakeShared::new(),
    );
    let store = SharedStore::new(&*shared, &layout);
    let mut evicted = 0;
    for i in 0..8_000u64 {
        match store.claim(&digest(i), &[0; 32], 0, 0, i).unwrap() {
            ClaimOutcome::Claimed {
                claim,
                evicted_unexpired,
            } => {
                evicted += u32::from(evicted_unexpired);
                assert!(store.complete(&claim, None, 0).unwrap().owned);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        evicted < 16,
        "{evicted} of 8000 records evicted before their TTL"
    );
}

#[test]
fn bucket_full_of_in_flight_claims_is_a_store_error_not_an_eviction() {
    let (layout, shared) = (Layout::new("t", 16, 30_000, 60_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let same = in_bucket(&layout, layout.bucket_of(&digest(0)), WAYS + 1);
    for (i, d) in same[..WAYS].iter().enumerate() {
        claimed(store.claim(d, &[0; 32], 0, 0, i as u64));
    }
    assert_eq!(
        store.claim(&same[WAYS], &[0; 32], 0, 0, 99),
        Err(StoreError::BucketFull)
    );
    // Once they time out, the way is free again.
    claimed(store.claim(&same[WAYS], &[0; 32], 0, 30_000, 99));
}

#[test]
fn a_response_slot_taken_over_is_never_replayed_to_the_old_key() {
    // Record A completes; later the way is reused by B, whose response overwrites the slot.
    // Whatever interleaving, a reader of A must never get B's body.
    let (layout, shared) = (Layout::new("t", 16, 1_000, 1_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let same = in_bucket(&layout, layout.bucket_of(&digest(0)), WAYS + 1);
    let mut claims = Vec::new();
    for (i, d) in same[..WAYS].iter().enumerate() {
        let claim = claimed(store.claim(d, &[0; 32], 0, 0, i as u64));
        assert!(
            store
                .complete(&claim, Some(&stored(200, &format!("body-{i}"))), 0)
                .unwrap()
                .owned
        );
        claims.push(claim);
    }
    let a_ref = completed(store.claim(&same[0], &[0; 32], 0, 10, 50));
    // Everything expires; the newcomer takes way 0 and writes its response there.
    let b = claimed(store.claim(&same[WAYS], &[0; 32], 0, 2_000, 77));
    assert_eq!(b.way, a_ref.way);
    assert!(
        store
            .complete(&b, Some(&stored(200, "secret-of-b")), 2_000)
            .unwrap()
            .owned
    );
    assert_eq!(
        store.response(&a_ref).unwrap(),
        None,
        "A's stale reference must not see B's body"
    );
    assert_eq!(store.response(&claims[1]).unwrap().unwrap().body, b"body-1");
}

#[test]
fn a_late_completion_racing_its_successor_never_clobbers_the_slot() {
    // A's claim expired and B took the way. A completes while B's slot write slips in
    // between A's slot read and A's slot write: A's write must fail, not overwrite B.
    late_completion_loses_to_its_successor(1_000);
}

#[test]
fn a_late_completion_near_its_expiry_never_clobbers_its_successor() {
    // A completes within SLOT_WRITE_MARGIN_MS of its claim's expiry, so it takes the
    // slot's cas first. Just before A's slot write, A's claim expires and B takes the
    // way and completes: A's write must fail, and A finds it no longer owns the way.
    late_completion_loses_to_its_successor(999);
}

#[test]
fn a_completion_well_before_its_expiry_writes_its_slot_without_reading_it() {
    // In a full store every way's slot holds an earlier response: a completion that
    // owns its way for long enough writes over it without copying it out first.
    let (layout, shared) = (Layout::new("t", 16, 30_000, 60_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(7);
    let first = claimed(store.claim(&d, &[0; 32], 0, 0, 1));
    assert!(
        store
            .complete(&first, Some(&stored(200, "old")), 10)
            .unwrap()
            .owned
    );
    // The record expires; the next claim of the key reuses the way, whose slot holds
    // the old response.
    let again = claimed(store.claim(&d, &[0; 32], 0, 70_000, 2));
    assert_eq!(again.way, first.way);
    let slot = layout.response_key(again.buckets, again.bucket, again.way);
    let reads = shared.gets_of(&slot);
    assert!(
        store
            .complete(&again, Some(&stored(201, "new")), 70_010)
            .unwrap()
            .owned
    );
    assert_eq!(
        shared.gets_of(&slot),
        reads,
        "the slot was read before its write"
    );
    let done = completed(store.claim(&d, &[0; 32], 0, 70_020, 3));
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"new");
}

/// A claims a fresh way and completes at `a_now`; just before
/// A's slot write, A's claim expires and B claims the way and completes. A's
/// completion must fail and the key must answer with B's body.
fn late_completion_loses_to_its_successor(a_now: u64) {
    let (layout, shared) = (Layout::new("t", 16, 1_000, 60_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(3);
    let a = claimed(store.claim(&d, &[0; 32], 0, 0, 1));
    let (s2, l2) = (shared.clone(), layout.clone());
    let a_way = a.way;
    shared.before_next_set(move || {
        let st = SharedStore::new(&*s2, &l2);
        let b = claimed(st.claim(&d, &[0; 32], 0, 1_000, 2));
        assert_eq!(b.way, a_way, "B must take the expired way");
        assert!(
            st.complete(&b, Some(&stored(200, "from-b")), 1_000)
                .unwrap()
                .owned
        );
    });
    assert!(
        !store
            .complete(&a, Some(&stored(200, "from-a")), a_now)
            .unwrap()
            .owned
    );
    let done = completed(store.claim(&d, &[0; 32], 0, 1_001, 3));
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"from-b");
}

#[test]
fn a_completion_whose_empty_slot_exists_after_all_still_stores_its_response() {
    // The bucket counted no bytes for the way, but its slot exists (blanked earlier):
    // the completion writes over it.
    let (layout, shared) = (Layout::new("t", 16, 1_000, 60_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(4);
    let claim = claimed(store.claim(&d, &[0; 32], 0, 0, 1));
    use crate::stores::shared::SharedData;
    let slot = layout.response_key(claim.buckets, claim.bucket, claim.way);
    shared.set(&slot, b"", u32::MAX).unwrap();
    let body = stored(201, "kept");
    assert!(store.complete(&claim, Some(&body), 10).unwrap().owned);
    let done = completed(store.claim(&d, &[0; 32], 0, 20, 2));
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"kept");
}

#[test]
fn tombstoned_and_garbage_buckets_read_as_empty() {
    let (layout, shared) = (Layout::new("t", 16, 1_000, 1_000), FakeShared::new());
    let d = digest(5);
    use crate::stores::shared::SharedData;
    shared
        .set(&layout.bucket_key(layout.bucket_of(&d)), b"", 0)
        .unwrap();
    let store = SharedStore::new(&*shared, &layout);
    claimed(store.claim(&d, &[0; 32], 0, 0, 1));
    shared
        .set(
            &layout.bucket_key(layout.bucket_of(&d)),
            b"\x01garbage-of-odd-length",
            0,
        )
        .unwrap();
    claimed(store.claim(&d, &[0; 32], 0, 0, 2));
}

#[test]
fn the_bucket_secret_is_created_once_and_keys_the_bucket_choice() {
    use crate::stores::shared::bucket_secret;
    let shared = FakeShared::new();
    // Another worker creates it between our read and our create: we read theirs.
    let s2 = shared.clone();
    shared.before_next_set(move || {
        assert_eq!(bucket_secret(&*s2, "ns", [2; 32]).unwrap(), [2; 32]);
    });
    assert_eq!(bucket_secret(&*shared, "ns", [1; 32]).unwrap(), [2; 32]);
    assert_eq!(bucket_secret(&*shared, "ns", [3; 32]).unwrap(), [2; 32]);
    // A different secret sends the same digests to other buckets: nobody who does not
    // know it can aim keys at a bucket.
    let a = Layout::new("ns", 16_000, 1, 1).with_secret([2; 32]);
    let b = Layout::new("ns", 16_000, 1, 1).with_secret([9; 32]);
    let moved = (0..200).filter(|i| a.bucket_of(&digest(*i)) != b.bucket_of(&digest(*i)));
    assert!(moved.count() > 190);
}

#[test]
fn concurrent_claims_under_two_layouts_run_once() {
    for first_old in [true, false] {
        let shared = FakeShared::new();
        let old = Layout::new("t", 1600, 30_000, 60_000);
        let new = Layout::new("t", 3200, 30_000, 60_000);
        SharedStore::new(&*shared, &old).register(1000).unwrap();
        SharedStore::new(&*shared, &new).register(1000).unwrap();
        let (d, p) = (digest(5), [7u8; 32]);
        let (a, b) = if first_old { (old, new) } else { (new, old) };
        // B's whole claim runs between A's read of its own bucket and A's CAS.
        b_claims_first(&shared, &b, d, p, 1000);
        in_flight(
            SharedStore::new(&*shared, &a).claim(&d, &p, 0, 1000, 1),
            "first_old {first_old}",
        );
        // A yielded and left nothing behind: B's claim is the only one.
        let again = SharedStore::new(&*shared, &a)
            .claim(&d, &p, 0, 1000, 3)
            .unwrap();
        assert_eq!(again, ClaimOutcome::InFlight { held_until: None });
    }
}

#[test]
fn store_errors_say_what_failed() {
    use crate::stores::shared::{HostFault, StoreError};
    assert!(StoreError::Host(HostFault("boom".into()))
        .to_string()
        .contains("boom"));
    assert!(StoreError::Contention.to_string().contains("contention"));
    assert!(StoreError::BucketFull.to_string().contains("full"));
}

#[test]
fn shared_data_keys_are_spelled_as_they_always_were() {
    let layout = Layout::new("ns", 16, 1_000, 60_000);
    for (buckets, bucket, way) in [
        (1, 0, 0),
        (10, 9, 15),
        (1_000_000, 999_999, 3),
        (u64::MAX, u64::MAX, usize::MAX),
    ] {
        assert_eq!(
            layout.bucket_key_in(buckets, bucket),
            format!("ns/{buckets}/b/{bucket}")
        );
        assert_eq!(
            layout.response_key(buckets, bucket, way),
            format!("ns/{buckets}/r/{bucket}/{way}")
        );
    }
}

#[test]
fn a_claim_racing_a_new_layout_at_the_registry_sees_its_claim() {
    // A claims under the old layout (16 buckets), already registered; B, a pushed
    // configuration (32 buckets), registers and claims the same key between A's
    // registry step and A's claim write. Whichever reads the registry last must see
    // the other's layout and yield: the key never runs twice.
    let shared = FakeShared::new();
    let old = Layout::new("t", 16, 30_000, 60_000);
    let new = Layout::new("t", 32, 30_000, 60_000);
    let (d, p) = (digest(5), [3u8; 32]);
    SharedStore::new(&*shared, &old).register(1000).unwrap();
    let (s2, l2) = (shared.clone(), new.clone());
    let b_won = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = b_won.clone();
    // A's next write is its claim (its registration is fresh): B runs just before it.
    shared.before_next_set(move || {
        let got = SharedStore::new(&*s2, &l2)
            .claim(&d, &p, 0, 1000, 2)
            .unwrap();
        b.store(
            matches!(got, ClaimOutcome::Claimed { .. }),
            std::sync::atomic::Ordering::SeqCst,
        );
    });
    let a = SharedStore::new(&*shared, &old)
        .claim(&d, &p, 0, 1000, 1)
        .unwrap();
    let a_won = matches!(a, ClaimOutcome::Claimed { .. });
    let b_won = b_won.load(std::sync::atomic::Ordering::SeqCst);
    assert!(b_won, "B claimed first, seeing no claim in the old layout");
    assert!(!a_won, "A must see B's layout and B's claim: {a:?}");
    assert_eq!(a, ClaimOutcome::InFlight { held_until: None });
}

/// What a duplicate is told about its record's times: a claim's in-flight end (a kept
/// claim's too, though it lives until its TTL), a hold's end, a completed record's
/// expiry and completion time, exactly.
#[test]
fn a_duplicate_learns_the_times_of_the_record_it_found() {
    use crate::record::RecordTimes;
    let shared = FakeShared::new();
    let layout = Layout::new("t", 64, 30_000, 60_000);
    let store = SharedStore::new(&*shared, &layout);
    let (d, p) = (digest(1), digest(100));
    let t0 = 1_796_187_600_123;
    let c = claimed(store.claim(&d, &p, 0, t0, 1));
    let (outcome, times) = store.claim_timed(&d, &p, 0, t0 + 5, 2).unwrap();
    assert_eq!(outcome, ClaimOutcome::InFlight { held_until: None });
    assert_eq!(times, RecordTimes::expiring(t0 + 30_000));
    // A mismatching payload learns the same record's times.
    let (outcome, times) = store.claim_timed(&d, &digest(101), 0, t0 + 5, 2).unwrap();
    assert_eq!(outcome, ClaimOutcome::PayloadMismatch);
    assert_eq!(times, RecordTimes::expiring(t0 + 30_000));
    store
        .complete(&c, Some(&stored(201, "made")), t0 + 700)
        .unwrap();
    let (outcome, times) = store.claim_timed(&d, &p, 0, t0 + 9_000, 3).unwrap();
    assert!(matches!(outcome, ClaimOutcome::Completed(_)), "{outcome:?}");
    let done = t0 + 700;
    assert_eq!(
        times,
        RecordTimes {
            expires_ms: Some(done + 60_000),
            completed_ms: Some(done),
        }
    );
    // A kept claim (on_unknown_outcome: keep) is in flight for 30 s, then held to its TTL.
    let kept = Layout::new("k", 64, 30_000, 60_000).keeping_unknown(true);
    let store = SharedStore::new(&*shared, &kept);
    claimed(store.claim(&d, &p, 0, t0, 4));
    let (_, times) = store.claim_timed(&d, &p, 0, t0 + 1, 5).unwrap();
    assert_eq!(times, RecordTimes::expiring(t0 + 30_000));
    let (outcome, times) = store.claim_timed(&d, &p, 0, t0 + 30_000, 5).unwrap();
    assert_eq!(
        outcome,
        ClaimOutcome::InFlight {
            held_until: Some(t0 + 60_000)
        }
    );
    assert_eq!(times, RecordTimes::expiring(t0 + 60_000));
}

/// A keyless caller's claim on its own record yields to the fingerprint's record from
/// before callers were recorded (its payload digest unsealed, as that version wrote it),
/// in this layout or another live one, and to nothing else there.
#[test]
fn a_claim_beside_a_record_from_before_callers_yields_to_it_only() {
    let (layout, shared) = (Layout::new("t", 64, 30_000, 60_000), FakeShared::new());
    let store = SharedStore::new(&*shared, &layout);
    let (old, own, other) = (digest(1), digest(2), digest(3));
    let plain = [7u8; 32];
    // The previous version's record of the fingerprint: the plain payload digest.
    let c = claimed(store.claim(&old, &plain, 0, 1_000, 1));
    store
        .complete(&c, Some(&stored(200, "before")), 1_000)
        .unwrap();
    let named = crate::principal::seal(&plain, &old, Some(b"Bearer alice"));
    let got = store
        .claim_beside(&own, &named, Some(&old), 0, 2_000, 2)
        .unwrap()
        .0;
    assert_eq!(got, ClaimOutcome::OtherCaller { unowned: true });
    // Its own claim was released: another attempt finds its record free again.
    assert!(matches!(
        store.claim(&own, &named, 0, 2_001, 3).unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // Another caller's sealed record there, or none, is no reason to yield.
    let theirs = crate::principal::seal(&plain, &other, None);
    let c = claimed(store.claim(&other, &theirs, 0, 3_000, 4));
    store
        .complete(&c, Some(&stored(200, "theirs")), 3_000)
        .unwrap();
    let mine = crate::principal::seal(&plain, &other, Some(b"Bearer bob"));
    assert!(matches!(
        store
            .claim_beside(&digest(4), &mine, Some(&other), 0, 3_001, 5)
            .unwrap()
            .0,
        ClaimOutcome::Claimed { .. }
    ));
    assert!(matches!(
        store
            .claim_beside(&digest(5), &mine, Some(&digest(6)), 0, 3_002, 6)
            .unwrap()
            .0,
        ClaimOutcome::Claimed { .. }
    ));
}
