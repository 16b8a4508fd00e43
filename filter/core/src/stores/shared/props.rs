//! Property tests of the shared-data store's own encodings (bucket records, the layouts
//! registry, the bucket secret): random bytes never panic, encode -> decode is the identity.

use super::bucket::{BUCKET_VERSION, RECORD_LEN, REGISTRY_VERSION, SLOTS_WAY};
use super::*;
use crate::fake::FakeShared;
use crate::props::decoders::{config, stored_response};
use proptest::prelude::*;

fn state() -> impl Strategy<Value = RecordState> {
    proptest::sample::select(&RecordState::ALL[..])
}

fn record() -> impl Strategy<Value = Record> {
    (
        any::<[u8; 32]>(),
        state(),
        any::<u64>(),
        any::<u64>(),
        any::<[u8; 32]>(),
    )
        .prop_map(|(digest, state, token, expires_ms, payload)| Record {
            digest,
            state,
            token,
            expires_ms,
            payload,
        })
}

fn bucket() -> impl Strategy<Value = Bucket> {
    (
        prop::collection::vec(prop::option::of(record()), WAYS),
        prop::option::of(any::<[u32; WAYS]>()),
    )
        .prop_map(|(ways, slots)| {
            let mut b: Bucket = Default::default();
            for (slot, r) in b.iter_mut().zip(ways) {
                *slot = r;
            }
            b.slots = slots.unwrap_or_default();
            b
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn buckets_round_trip(b in bucket()) {
        let bytes = encode_bucket(&b);
        let sizes = usize::from(b.slots.iter().any(|&n| n > 0));
        prop_assert_eq!(bytes.len(), 1 + (b.iter().flatten().count() + sizes) * (1 + RECORD_LEN));
        prop_assert_eq!(decode_bucket(&bytes), b.clone());
        // A reader of the previous format (no slot sizes) skips the sizes entry, whose
        // way number is past WAYS, and sees the same records.
        for chunk in bytes[1..].chunks_exact(1 + RECORD_LEN) {
            prop_assert!(usize::from(chunk[0]) < WAYS || chunk[0] == SLOTS_WAY);
        }
        let mut without_sizes = b;
        without_sizes.slots = Default::default();
        let old_reader: Vec<u8> = std::iter::once(BUCKET_VERSION)
            .chain(bytes[1..].chunks_exact(1 + RECORD_LEN).filter(|c| c[0] != SLOTS_WAY).flatten().copied())
            .collect();
        prop_assert_eq!(decode_bucket(&old_reader), without_sizes);
    }

    #[test]
    fn bucket_decoding_never_panics_and_keeps_only_whole_valid_records(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        versioned in any::<bool>(),
    ) {
        let mut input = bytes;
        if versioned {
            input.insert(0, BUCKET_VERSION);
        }
        let b = decode_bucket(&input);
        let whole = input.len().saturating_sub(1) / (1 + RECORD_LEN);
        prop_assert!(b.iter().flatten().count() <= whole);
        if input.first() != Some(&BUCKET_VERSION) {
            prop_assert!(b.iter().all(Option::is_none));
        }
        // What was read is written back as the same records.
        prop_assert_eq!(decode_bucket(&encode_bucket(&b)), b);
    }

    #[test]
    fn the_registry_round_trips_and_never_panics(
        entries in prop::collection::vec((any::<u64>(), any::<u64>()), 0..8),
        bytes in prop::collection::vec(any::<u8>(), 0..100),
    ) {
        let reg = Registry { entries };
        prop_assert_eq!(Registry::decode(&reg.encode()), reg);
        let read = Registry::decode(&bytes);
        if bytes.first() == Some(&REGISTRY_VERSION) {
            prop_assert_eq!(read.entries.len(), (bytes.len() - 1) / 16);
        } else {
            prop_assert!(read.entries.is_empty());
        }
    }

    #[test]
    fn the_secret_is_whatever_32_bytes_are_stored_else_a_fresh_one(
        stored in prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
        fresh in any::<[u8; 32]>(),
        later in any::<[u8; 32]>(),
    ) {
        let shared = FakeShared::new();
        if let Some(v) = &stored {
            shared.set("ns/secret", v, 0).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        }
        let got = bucket_secret(&*shared, "ns", fresh).map_err(|e| TestCaseError::fail(e.to_string()))?;
        match stored.as_deref() {
            Some(v) if v.len() == SECRET_LEN => prop_assert_eq!(&got[..], v),
            // Absent, a tombstone or garbage: replaced by the fresh secret.
            _ => prop_assert_eq!(got, fresh),
        }
        // Every later caller gets the same one.
        prop_assert_eq!(bucket_secret(&*shared, "ns", later).map_err(|e| TestCaseError::fail(e.to_string()))?, got);
        prop_assert_eq!(shared.raw("ns/secret").map(|(v, _)| v), Some(got.to_vec()));
    }

    #[test]
    fn a_completed_claim_replays_exactly_its_response(
        resp in prop::option::of(stored_response()),
        digest in any::<[u8; 32]>(),
        payload in any::<[u8; 32]>(),
        token in any::<u64>(),
        secret in any::<[u8; 32]>(),
    ) {
        let shared = FakeShared::new();
        let layout = Layout::new("ns", 64, 1_000, 10_000).with_secret(secret);
        let store = SharedStore::new(&*shared, &layout);
        let fail = |e: StoreError| TestCaseError::fail(e.to_string());
        let ClaimOutcome::Claimed { claim, evicted_unexpired: false } =
            store.claim(&digest, &payload, 0, 5_000, token).map_err(fail)?
        else {
            return Err(TestCaseError::fail("a fresh key was not claimed"));
        };
        prop_assert_eq!(claim.bucket, layout.bucket_of(&digest));
        prop_assert!(store.complete(&claim, resp.as_ref(), 5_500).map(|c| c.owned).map_err(fail)?);
        let again = store.claim(&digest, &payload, 0, 6_000, token ^ 7).map_err(fail)?;
        match &resp {
            Some(r) => {
                let ClaimOutcome::Completed(done) = again else {
                    return Err(TestCaseError::fail(format!("{again:?}")));
                };
                prop_assert_eq!(store.response(&done).map_err(fail)?, Some(r.clone()));
            }
            None => prop_assert_eq!(again, ClaimOutcome::CompletedNotStored),
        }
        // Until the TTL from completion, then the key is free again.
        let before = store.claim(&digest, &payload, 0, 5_500 + 10_000 - 1, 1).map_err(fail)?;
        prop_assert!(
            matches!(before, ClaimOutcome::Completed(_) | ClaimOutcome::CompletedNotStored),
            "{:?}", before
        );
        let after = store.claim(&digest, &payload, 0, 5_500 + 10_000, 2).map_err(fail)?;
        prop_assert!(matches!(after, ClaimOutcome::Claimed { .. }), "{:?}", after);
    }
}
