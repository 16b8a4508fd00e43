//! Tests of etcd answers and the lease cache.

#[test]
fn an_etcd_error_without_a_code_is_not_mistaken_for_a_known_one() {
    use crate::etcd::{parse_answer, EtcdAnswer};
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
    use crate::etcd::{LeaseCache, LeasePlan, LeasePurpose};
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
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 0), None);
    c.put(LeasePurpose::InFlight, &plan, 7, 1_000);
    c.put(LeasePurpose::Completed, &plan, 8, 1_000);
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_499), Some(7));
    assert_eq!(c.get(LeasePurpose::InFlight, &other, 1_499), None);
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_500), None);
    assert_eq!(c.get(LeasePurpose::Completed, &plan, 2_999), Some(8));
    assert_eq!(c.get(LeasePurpose::Completed, &other, 2_999), None);
    assert_eq!(c.get(LeasePurpose::Completed, &plan, 3_000), None);
    c.put(LeasePurpose::InFlight, &other, 9, 1_200);
    assert_eq!(c.get(LeasePurpose::InFlight, &other, 1_300), Some(9));
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_300), Some(7));
}
