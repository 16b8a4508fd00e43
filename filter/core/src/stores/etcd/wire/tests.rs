//! Tests of etcd answers and the lease cache.

#[test]
fn an_etcd_error_without_a_code_is_not_mistaken_for_a_known_one() {
    use crate::stores::etcd::wire::{parse_answer, EtcdAnswer};
    assert_eq!(
        parse_answer(br#"{"error": "boom"}"#),
        Some(EtcdAnswer::Error {
            code: -1,
            message: "boom".into()
        })
    );
    assert_eq!(
        parse_answer(br#"{"message": "m", "code": "14"}"#),
        Some(EtcdAnswer::Error {
            code: 14,
            message: "m".into()
        })
    );
}

#[test]
fn a_cached_lease_serves_its_window_and_not_a_millisecond_more() {
    use crate::stores::etcd::wire::{LeaseCache, LeasePlan, LeasePurpose};
    let plan = LeasePlan {
        in_flight_window_ms: 500,
        completed_window_ms: 2_000,
        in_flight_ttl_s: 10,
        completed_ttl_s: 20,
    };
    // Another rule's plan (a longer TTL) never gets this plan's leases.
    let other = LeasePlan {
        in_flight_ttl_s: 11,
        completed_ttl_s: 21,
        ..plan
    };
    let mut c = LeaseCache::default();
    assert_eq!(c.get(1, LeasePurpose::InFlight, &plan, 0), None);
    c.put(1, LeasePurpose::InFlight, &plan, 7, 1_000);
    c.put(1, LeasePurpose::Completed, &plan, 8, 1_000);
    assert_eq!(c.get(1, LeasePurpose::InFlight, &plan, 1_499), Some(7));
    assert_eq!(c.get(1, LeasePurpose::InFlight, &other, 1_499), None);
    assert_eq!(c.get(1, LeasePurpose::InFlight, &plan, 1_500), None);
    assert_eq!(c.get(1, LeasePurpose::Completed, &plan, 2_999), Some(8));
    assert_eq!(c.get(1, LeasePurpose::Completed, &other, 2_999), None);
    assert_eq!(c.get(1, LeasePurpose::Completed, &plan, 3_000), None);
    c.put(1, LeasePurpose::InFlight, &other, 9, 1_200);
    assert_eq!(c.get(1, LeasePurpose::InFlight, &other, 1_300), Some(9));
    assert_eq!(c.get(1, LeasePurpose::InFlight, &plan, 1_300), Some(7));
    // Another shard (another etcd cluster) never gets these leases, and forgetting
    // one shard's leaves the others'.
    assert_eq!(c.get(2, LeasePurpose::InFlight, &plan, 1_300), None);
    c.put(2, LeasePurpose::InFlight, &plan, 70, 1_200);
    assert_eq!(c.get(2, LeasePurpose::InFlight, &plan, 1_300), Some(70));
    c.forget(1);
    assert_eq!(c.get(1, LeasePurpose::InFlight, &plan, 1_300), None);
    assert_eq!(c.get(2, LeasePurpose::InFlight, &plan, 1_300), Some(70));
}

/// The byte formats, pinned: a format change fails here, and values written before it
/// must still decode.
mod format {
    use crate::response::tests::format::{response, RESPONSE};
    use crate::stores::etcd::wire::*;
    use crate::wire::unhex;

    /// An etcd record value as every version so far writes it (version 1, completed,
    /// token 7, its expiry and payload digest, then the response slot's encoding): a
    /// format change fails here, and records written before it must still decode.
    const HEAD: &str = "010200000000000000070000018bcfe568004444444444444444444444444444444444444444444444444444444444444444";

    #[test]
    fn record_keys_are_the_prefix_and_the_digest_in_lower_hex() {
        let mut digest = [0xab; 32];
        digest[0] = 0x01;
        let key = record_key("dedup/", &digest);
        assert_eq!(key, format!("dedup/01{}", "ab".repeat(31)));
    }

    #[test]
    fn etcd_record_bytes_are_pinned() {
        let record = EtcdRecord {
            state: RecordState::Completed,
            token: 7,
            expires_ms: 1_700_000_000_000,
            payload: [0x44; 32],
            response: Some(response()),
        };
        let bytes = unhex(&[&[HEAD][..], RESPONSE].concat());
        assert_eq!(record.encode(&[0x33; 32]), bytes);
        assert_eq!(
            EtcdRecord::decode(&bytes, &[0x33; 32]),
            Some(record.clone())
        );
        // Without its response a completed record is not one we wrote; a claim is.
        let head = unhex(&[HEAD]);
        assert_eq!(EtcdRecord::decode(&head, &[0x33; 32]), None);
        let mut claim = head.clone();
        claim[1] = RecordState::InFlight as u8;
        let claim = EtcdRecord::decode(&claim, &[0x33; 32]).unwrap();
        assert_eq!((claim.state, claim.response), (RecordState::InFlight, None));
        assert_eq!(EtcdRecord::decode(&head[..49], &[0x33; 32]), None);
    }
}

#[test]
fn the_longest_key_life_is_the_longest_completed_lease_of_any_policy() {
    let life = |json: &str| {
        let c = crate::config::Config::parse(json.as_bytes()).unwrap();
        crate::stores::etcd::wire::longest_key_life_s(&c)
    };
    assert_eq!(life("{}"), None, "shared data");
    // 60 s TTL, 10 s in flight, 1 s budget: 60 + (10 + 1.25 + 1) + 1 + 7.5 s -> 81 s.
    let base = r#""ttl_seconds": 60, "in_flight_timeout_seconds": 10, "store": {"kind": "etcd", "cluster": "e", "timeout_ms": 1000}"#;
    assert_eq!(life(&format!("{{{base}}}")), Some(81));
    // A rule with a longer TTL, and one whose entities outlive its records.
    let rules = format!(
        r#"{{{base}, "rules": [{{"name": "long", "match": {{"path_prefix": "/l"}}, "ttl_seconds": 120}},
             {{"name": "o", "match": {{"path_prefix": "/o"}}, "ordering": {{"entity": {{"header": "e"}}, "version": {{"header": "v"}}, "ttl_seconds": 600}}}}]}}"#
    );
    // Ordering: 600 + 12.25 + 1 + 60 (a window of 600/8 = 75 s, at most 60) -> 674 s.
    assert_eq!(life(&rules), Some(674));
}
