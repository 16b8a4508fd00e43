//! Versions (parsing, order, display) and the entity bucket format, pinned as bytes.

use super::entities::{decode, encode, Applied, Entity, EntityClaim, Flight, Settle};
use super::*;

fn v(t: VersionType, s: &str) -> Version {
    Version::parse(t, s.as_bytes()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn integers_order_numerically_across_signs_and_leading_zeros() {
    let i = |s| v(VersionType::Integer, s);
    let ordered = [
        "-9223372036854775808",
        "-10",
        "-9",
        "0",
        "7",
        "0042",
        "100",
        "9223372036854775807",
    ];
    for pair in ordered.windows(2) {
        assert!(i(pair[0]) < i(pair[1]), "{pair:?}");
    }
    assert_eq!(i("007"), i("7"));
    assert_eq!(i("-0"), i("0"));
    assert_eq!(i("0042").show(), "42");
    assert_eq!(i("-10").show(), "-10");
    for bad in [
        "",
        "-",
        "+1",
        "1.0",
        "1e3",
        " 1",
        "9223372036854775808",
        "0x10",
        "١",
    ] {
        assert!(
            Version::parse(VersionType::Integer, bad.as_bytes()).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn timestamps_order_as_instants_whatever_their_offset() {
    let t = |s| v(VersionType::Timestamp, s);
    assert_eq!(t("2026-12-02T10:00:00+02:00"), t("2026-12-02T08:00:00Z"));
    assert_eq!(t("2026-12-02t08:00:00z"), t("2026-12-02 08:00:00Z"));
    assert!(t("2026-12-02T08:00:00Z") < t("2026-12-02T08:00:00.000000001Z"));
    assert!(t("1969-12-31T23:59:59Z") < t("1970-01-01T00:00:00Z"));
    assert!(t("2024-02-29T00:00:00Z") < t("2024-03-01T00:00:00-01:00"));
    // A leap second is the next second.
    assert_eq!(t("2016-12-31T23:59:60Z"), t("2017-01-01T00:00:00Z"));
    assert_eq!(
        t("2026-12-02T10:00:00.250+01:00").show(),
        "2026-12-02T09:00:00.25Z"
    );
    assert_eq!(parse_rfc3339(b"1970-01-01T00:00:00Z"), Some((0, 0)));
    assert_eq!(
        parse_rfc3339(b"2000-03-01T00:00:00Z"),
        Some((951_868_800, 0))
    );
    for bad in [
        "2026-12-02T08:00:00",
        "2026-12-02",
        "2026-13-02T08:00:00Z",
        "2026-02-29T08:00:00Z",
        "2026-12-02T24:00:00Z",
        "2026-12-02T08:00:00.Z",
        "2026-12-02T08:00:00.1234567890Z",
        "2026-12-02T08:00:00+2:00",
        "2026-12-02T08:00:00Zjunk",
        "1733130000",
    ] {
        assert!(
            Version::parse(VersionType::Timestamp, bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn strings_order_byte_by_byte_and_are_bounded() {
    let s = |x| v(VersionType::String, x);
    assert!(s("10") < s("9"));
    assert!(s("a") < s("ab"));
    assert!(s("Z") < s("a"));
    assert_eq!(s("é").show(), "é");
    assert!(Version::parse(VersionType::String, b"").is_err());
    assert!(Version::parse(VersionType::String, &[b'x'; 129]).is_err());
    assert!(Version::parse(VersionType::String, &[b'x'; 128]).is_ok());
    assert!(Version::parse(VersionType::String, b"a\nb").is_err());
}

#[test]
fn a_stored_version_reads_back_and_garbage_does_not() {
    for x in [
        v(VersionType::Integer, "-3"),
        v(VersionType::Timestamp, "2026-01-01T00:00:00Z"),
        v(VersionType::String, "v1"),
    ] {
        assert_eq!(Version::from_stored(x.as_bytes()), Some(x.clone()));
    }
    for bad in [&[][..], &[1, 0, 0][..], &[9, 1][..], &[3][..], &[2; 12][..]] {
        assert_eq!(Version::from_stored(bad), None, "{bad:?}");
    }
}

fn entity(d: u8) -> Entity {
    Entity {
        digest: [d; 32],
        scope: 0,
        applied: None,
        flight: None,
    }
}

#[test]
fn the_entity_bucket_format_is_pinned() {
    let one = v(VersionType::Integer, "1");
    let two = v(VersionType::Integer, "2");
    let mut a = entity(0xAA);
    a.applied = Some(Applied {
        version: one.clone(),
        expires_ms: 0x0102,
    });
    let mut b = entity(0xBB);
    b.scope = 12345;
    b.flight = Some(Flight {
        token: 7,
        version: two,
        expires_ms: 0x0304,
        held: true,
    });
    let bytes = encode(&[a.clone(), b.clone()]);
    let mut want = vec![0xE1, 2];
    want.extend([0xAA; 32]);
    // flags 1 (applied), scope 0, then the applied version's expiry and bytes.
    want.extend([1, 0, 0, 0, 0]);
    want.extend([
        0, 0, 0, 0, 0, 0, 0x01, 0x02, 9, 1, 0x80, 0, 0, 0, 0, 0, 0, 1,
    ]);
    want.extend([0xBB; 32]);
    // flags 6 (flight, held), scope 12345, then the flight's token and expiry.
    want.extend([6, 0, 0, 0x30, 0x39]);
    want.extend([0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x03, 0x04]);
    want.extend([9, 1, 0x80, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(bytes, want);
    assert_eq!(decode(&bytes).unwrap(), vec![a, b]);
    assert_eq!(decode(&[]).unwrap(), vec![]);
    // Another format, or a cut bucket, is not read as empty.
    assert!(decode(&[0xE2, 0]).is_err());
    assert!(decode(&want[..want.len() - 1]).is_err());
}

#[test]
fn an_entity_claims_settles_and_never_lowers_its_applied_version() {
    let i = |s| v(VersionType::Integer, s);
    let mut e = entity(1);
    assert_eq!(
        e.claim(1, &i("5"), 0, 100),
        EntityClaim::Claimed {
            evicted_unexpired: false
        }
    );
    // Another token while 5 flies: busy, until the flight expires.
    assert!(matches!(
        e.claim(2, &i("6"), 50, 150),
        EntityClaim::Busy {
            held_until: None,
            ..
        }
    ));
    assert!(e.settle(
        1,
        &Settle::Hold {
            until_ms: Some(500)
        },
        60
    ));
    assert_eq!(
        e.claim(2, &i("6"), 70, 170),
        EntityClaim::Busy {
            version: i("5"),
            held_until: Some(500)
        }
    );
    // Past the hold, 6 runs and completes; 5's late completion does not lower it.
    assert!(matches!(
        e.claim(2, &i("6"), 501, 600),
        EntityClaim::Claimed { .. }
    ));
    assert!(e.settle(
        2,
        &Settle::Complete {
            version: i("6"),
            ttl_ms: 1000
        },
        510
    ));
    assert!(!e.settle(
        1,
        &Settle::Complete {
            version: i("5"),
            ttl_ms: 1000
        },
        520
    ));
    assert_eq!(e.applied.as_ref().map(|a| a.version.clone()), Some(i("6")));
    assert_eq!(
        e.claim(3, &i("6"), 530, 630),
        EntityClaim::Stale { applied: i("6") }
    );
    // A release ends the flight and keeps the applied version.
    assert!(matches!(
        e.claim(4, &i("8"), 540, 640),
        EntityClaim::Claimed { .. }
    ));
    assert!(e.settle(4, &Settle::Release, 550));
    assert_eq!(e.flight, None);
    assert!(matches!(
        e.claim(5, &i("7"), 560, 660),
        EntityClaim::Claimed { .. }
    ));
    // Past the applied version's expiry, anything runs.
    assert!(e.settle(5, &Settle::Release, 570));
    assert!(matches!(
        e.claim(6, &i("1"), 1511, 1600),
        EntityClaim::Claimed { .. }
    ));
}

#[test]
fn a_full_entity_bucket_evicts_the_earliest_expiring_never_a_flight() {
    use crate::fake::FakeShared;
    use crate::stores::shared::Layout;
    let shared = FakeShared::new();
    let layout = Layout::new("t", 16, 1000, 1000).with_entities(16);
    let store = crate::stores::shared::SharedEntities::new(&*shared, &layout);
    let i = |s| v(VersionType::Integer, s);
    // 16 entities, one bucket: each completes version 1, expiring 1000 + k.
    for k in 0..16u8 {
        let d = [k; 32];
        assert!(matches!(
            store.claim(&d, &i("1"), u64::from(k), 0, 100),
            Ok(EntityClaim::Claimed {
                evicted_unexpired: false
            })
        ));
        store
            .settle(
                &d,
                u64::from(k),
                &Settle::Complete {
                    version: i("1"),
                    ttl_ms: 1000 + u64::from(k),
                },
                0,
            )
            .unwrap();
    }
    // A 17th takes entity 0's slot (its version expires first), counted as unexpired.
    assert_eq!(
        store.claim(&[99; 32], &i("1"), 99, 10, 200),
        Ok(EntityClaim::Claimed {
            evicted_unexpired: true
        })
    );
    assert_eq!(store.get(&[0; 32]).unwrap(), None);
    assert!(store.get(&[1; 32]).unwrap().is_some());
    // With every slot in flight, a new entity finds no room.
    for k in 1..16u8 {
        let d = [k; 32];
        assert!(matches!(
            store.claim(&d, &i("2"), 200 + u64::from(k), 20, 900),
            Ok(EntityClaim::Claimed { .. })
        ));
    }
    assert_eq!(
        store.claim(&[100; 32], &i("1"), 300, 30, 900),
        Err(crate::stores::shared::StoreError::BucketFull)
    );
}

#[test]
fn an_applied_version_ends_at_its_expiry_to_the_millisecond() {
    let i = |s| v(VersionType::Integer, s);
    let mut e = entity(2);
    assert!(matches!(
        e.claim(1, &i("5"), 0, 100),
        EntityClaim::Claimed { .. }
    ));
    assert!(e.settle(
        1,
        &Settle::Complete {
            version: i("5"),
            ttl_ms: 1000
        },
        10
    ));
    // Live until 1010 (exclusive): at 1009 a lower version is stale, at 1010 it runs.
    assert_eq!(
        e.claim(2, &i("4"), 1009, 1100),
        EntityClaim::Stale { applied: i("5") }
    );
    assert!(matches!(
        e.claim(2, &i("4"), 1010, 1100),
        EntityClaim::Claimed { .. }
    ));
}

#[test]
fn the_same_version_completing_again_keeps_the_expiry_of_the_completion_that_set_it() {
    let i = |s| v(VersionType::Integer, s);
    let mut e = entity(3);
    assert!(matches!(
        e.claim(1, &i("5"), 0, 100),
        EntityClaim::Claimed { .. }
    ));
    assert!(e.settle(
        1,
        &Settle::Complete {
            version: i("5"),
            ttl_ms: 1000
        },
        0
    ));
    // A completion of version 5 that holds no flight (forwarded unordered).
    assert!(!e.settle(
        9,
        &Settle::Complete {
            version: i("5"),
            ttl_ms: 1000
        },
        500
    ));
    assert_eq!(e.applied.as_ref().map(|a| a.expires_ms), Some(1000));
}

#[test]
fn a_new_entity_takes_an_expired_slot_without_counting_an_eviction() {
    use crate::fake::FakeShared;
    use crate::stores::shared::Layout;
    let shared = FakeShared::new();
    let layout = Layout::new("t", 16, 1000, 1000).with_entities(16);
    let store = crate::stores::shared::SharedEntities::new(&*shared, &layout);
    let i = |s| v(VersionType::Integer, s);
    for k in 0..16u8 {
        let d = [k; 32];
        store.claim(&d, &i("1"), u64::from(k), 0, 100).unwrap();
        let done = Settle::Complete {
            version: i("1"),
            ttl_ms: 100,
        };
        store.settle(&d, u64::from(k), &done, 0).unwrap();
    }
    // At 200 every entity has expired: a new one reuses a slot, evicting nothing live.
    assert_eq!(
        store.claim(&[77; 32], &i("1"), 77, 200, 300),
        Ok(EntityClaim::Claimed {
            evicted_unexpired: false
        })
    );
}

#[test]
fn entities_live_in_their_buckets_keys_and_ending_an_unknown_flight_writes_nothing() {
    use crate::fake::FakeShared;
    use crate::stores::shared::Layout;
    let shared = FakeShared::new();
    let layout = Layout::new("ns", 16, 1000, 1000).with_entities(64);
    let store = crate::stores::shared::SharedEntities::new(&*shared, &layout);
    let i = |s| v(VersionType::Integer, s);
    let d = [5; 32];
    store.claim(&d, &i("1"), 1, 0, 100).unwrap();
    let bucket = layout.bucket_in(layout.entity_buckets, &d);
    assert_eq!(shared.keys(), vec![format!("ns/4/o/{bucket}")]);
    // A release or hold of an entity the bucket does not hold: nothing to end.
    let sets = shared.sets();
    for how in [
        Settle::Release,
        Settle::Hold {
            until_ms: Some(500),
        },
    ] {
        assert_eq!(store.settle(&[6; 32], 2, &how, 10), Ok(false));
    }
    assert_eq!(shared.sets(), sets);
    assert_eq!(store.get(&[6; 32]).unwrap(), None);
}

#[test]
fn a_full_entity_bucket_evicts_only_its_own_scopes_entities_unless_told_otherwise() {
    use crate::fake::FakeShared;
    use crate::stores::shared::Layout;
    let i = |s| v(VersionType::Integer, s);
    for any in [false, true] {
        let shared = FakeShared::new();
        let layout = Layout::new("t", 16, 1000, 1000)
            .with_entities(16)
            .isolating_scopes(any, 16);
        // Tenant 7 fills the one bucket with applied versions.
        let tenant = crate::stores::shared::SharedEntities::new(&*shared, &layout).scoped(7);
        for k in 0..16u8 {
            let d = [k; 32];
            tenant.claim(&d, &i("1"), u64::from(k), 0, 100).unwrap();
            let done = Settle::Complete {
                version: i("1"),
                ttl_ms: 10_000,
            };
            tenant.settle(&d, u64::from(k), &done, 0).unwrap();
        }
        // Tenant 9's new entity may not take tenant 7's slot, unless any scope's may go.
        let other = crate::stores::shared::SharedEntities::new(&*shared, &layout).scoped(9);
        let got = other.claim(&[99; 32], &i("1"), 99, 10, 200);
        if any {
            assert_eq!(
                got,
                Ok(EntityClaim::Claimed {
                    evicted_unexpired: true
                })
            );
        } else {
            assert_eq!(got, Err(crate::stores::shared::StoreError::BucketFull));
            // Tenant 7's own new entity evicts its own oldest.
            let own = tenant.claim(&[98; 32], &i("1"), 98, 10, 200);
            assert_eq!(
                own,
                Ok(EntityClaim::Claimed {
                    evicted_unexpired: true
                })
            );
        }
    }
}
