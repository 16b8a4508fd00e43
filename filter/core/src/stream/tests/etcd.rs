//! The etcd store end to end through the plugin: two proxies, the local tier, leases,
//! releases, takeovers, record limits.

use crate::metrics::Counter;
use crate::outcome::flags;
use crate::response::StoredResponse;
use crate::stream::CallAnswer;
use crate::stream::{Decision, DedupStream};
use crate::testing::*;

const TTL_10_IN_FLIGHT_5: &str = r#""ttl_seconds": 10, "in_flight_timeout_seconds": 5"#;

#[test]
fn etcd_first_executes_other_proxy_replays_and_in_flight_conflicts() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let (r, first) = sent(&p, &mut a, req("POST", "/orders").key("k1").body("{}"));
    // In flight on proxy A: B answers 409 from etcd's record.
    assert_eq!(send(&p, &mut b, &r).unwrap_err().status(), 409);
    assert_eq!(
        send(&p, &mut b, &req("POST", "/orders").key("k1").body("other"))
            .unwrap_err()
            .status(),
        422
    );
    assert_eq!(respond(&p, &mut a, first, ok("made")), executed("made"));
    let replay = run(&p, &mut b, &r, ok("no"));
    assert_eq!(replay.local().body, b"made");
    assert_eq!(
        replay.local().header("idempotent-replayed"),
        Some(&b"true"[..])
    );
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
}

#[test]
fn etcd_local_tier_answers_without_a_round_trip() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let r = req("POST", "/orders").key("k1").body("{}");
    run(&p, &mut a, &r, ok("made"));
    // The executing worker learned the completed record when etcd confirmed it.
    a.etcd.set_down(true);
    run(&p, &mut a, &r, ok("no")).assert_replays(b"made");
    assert_eq!(
        run(
            &p,
            &mut a,
            &req("POST", "/orders").key("k1").body("x"),
            ok("no")
        )
        .status(),
        422
    );
    // B has not seen it: it needs etcd, which is down: refused (failure_mode closed by
    // default), with retry-after, nothing forwarded.
    let refused = run(&p, &mut b, &r, ok("never"));
    assert_eq!(
        (refused.status(), refused.problem_type()),
        (503, "urn:proxy-dedup:problem:store-unavailable".to_string())
    );
    assert_eq!(refused.local().header("retry-after"), Some(&b"1"[..]));
    assert_eq!(
        (
            b.count_of(Counter::StoreUnavailable),
            b.count_of(Counter::FailedOpen)
        ),
        (1, 0)
    );
    a.etcd.set_down(false);
    run(&p, &mut b, &r, ok("no")).assert_replays(b"made");
    a.etcd.set_down(true);
    assert_eq!(
        run(&p, &mut b, &r, ok("no")).local().body,
        b"made",
        "B learned it from the replay"
    );
}

#[test]
fn etcd_leases_are_reused_not_granted_per_request() {
    let (p, (mut a, _)) = (etcd_plugin(r#""ttl_seconds": 3600"#), two_proxies());
    for i in 0..200 {
        run(&p, &mut a, &keyed(i), ok("x"));
        a.now_ms += 10;
    }
    assert_eq!(a.count_of(Counter::Executed), 200);
    // 2 s of traffic: a handful of in-flight windows and one completed window.
    assert!(a.etcd.grants() <= 6, "{} grants", a.etcd.grants());
}

#[test]
fn etcd_release_on_5xx_and_reset() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let r = req("POST", "/pay").key("k").body("{}");
    assert_eq!(run(&p, &mut a, &r, answer(500, "boom")).status(), 500);
    let refused = origin(
        "upstream_reset_before_response_started{connection_failure}",
        0,
    );
    assert_eq!(run(&p, &mut b, &r, ended(refused)), Outcome::Reset);
    assert_eq!(run(&p, &mut a, &r, ok("paid")), executed("paid"));
    // A reset after the request was sent keeps the record on every proxy, past the
    // in-flight timeout (its lease is the completed one now).
    let r2 = req("POST", "/pay").key("k2").body("{}");
    assert_eq!(run(&p, &mut a, &r2, upstream_reset()), Outcome::Reset);
    for later in [10_000, 31_000, 3_600_000] {
        b.now_ms = a.now_ms + later;
        let dup = run(&p, &mut b, &r2, ok("twice"));
        assert_eq!(dup.status(), 409, "{later}");
        assert_eq!(
            dup.problem_type(),
            "urn:proxy-dedup:problem:outcome-unknown",
            "{later}"
        );
    }
    assert_eq!(a.count_of(Counter::OutcomeUnknown), 1);
    assert_eq!(
        a.count_of(Counter::StoreErrors) + a.count_of(Counter::ClaimsLost),
        0
    );
    assert_eq!(
        a.count_of(Counter::Released) + b.count_of(Counter::Released),
        2
    );
    run(&p, &mut b, &r, ok("no")).assert_replays(b"paid");
}

/// Under `keep` an unsettled claim is kept until its TTL: past its in-flight lease (the
/// in-flight time, the lease window and the budget), etcd still holds it, and a
/// duplicate still gets `409 outcome-unknown`, never a second execution.
#[test]
fn a_kept_etcd_claim_outlives_its_in_flight_lease() {
    let p = etcd_plugin(TTL_10_IN_FLIGHT_5);
    let r = req("POST", "/o").key("k");
    let (mut a, mut b) = two_proxies();
    let t0 = a.now_ms;
    let _stuck = send(&p, &mut a, &r).unwrap();
    // In flight 5 s + a window of 1 s + the 500 ms budget: the in-flight lease is gone.
    b.now_ms = t0 + 8_000;
    let dup = run(&p, &mut b, &r, ok("twice"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    assert_eq!(b.count_of(Counter::Executed), 0);
}

#[test]
fn a_kept_etcd_claim_still_in_flight_past_its_end_answers_as_an_unknown_outcome() {
    // Under `keep` a claim lives on the completed lease, so etcd still has it after its
    // in-flight end: from that instant (by the reader's clock) its first may have run
    // and died unsettled, which is an unknown outcome; before it, plain in flight.
    // Under `hold` the same record past its end is still only in flight.
    for (policy, at_end) in [
        ("keep", "urn:proxy-dedup:problem:outcome-unknown"),
        ("hold", "urn:proxy-dedup:problem:in-flight"),
    ] {
        let cfg = format!(r#"{TTL_10_IN_FLIGHT_5}, "on_unknown_outcome": "{policy}""#);
        let (p, r) = (etcd_plugin(&cfg), req("POST", "/o").key("k"));
        let (mut a, mut b) = two_proxies();
        let t0 = a.now_ms;
        let stuck = send(&p, &mut a, &r).unwrap();
        for (at, expected) in [
            (4_999, "urn:proxy-dedup:problem:in-flight"),
            (5_000, at_end),
        ] {
            b.now_ms = t0 + at;
            let dup = run(&p, &mut b, &r, ok("twice"));
            assert_eq!(dup.status(), 409, "{policy} at {at}");
            assert_eq!(dup.problem_type(), expected, "{policy} at {at}");
            assert_eq!(
                dup.local().header("retry-after").is_some(),
                expected.ends_with("in-flight"),
                "{policy} at {at}"
            );
        }
        a.now_ms = t0 + 5_000;
        respond(&p, &mut a, stuck, ok("made"));
        assert_eq!(b.count_of(Counter::Executed), 0, "{policy}");
    }
}

#[test]
fn etcd_transport_failures_retry_then_fail_by_mode() {
    let (p, (mut a, _)) = (etcd_plugin(""), two_proxies());
    // One member refused the connection: the retry reaches another.
    a.etcd.fail_next(2);
    assert!(run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x")).reached_upstream());
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    // A member without a leader answers gRPC "unavailable": retried too.
    let mut s = DedupStream::new(2);
    let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k1b").head, true);
    assert!(matches!(first, Decision::Call(_)));
    let unavailable = br#"{"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14}"#;
    let again = s.on_store_answer(
        &p,
        &mut a,
        CallAnswer {
            status: 503,
            body: unavailable.to_vec(),
            ..Default::default()
        },
    );
    assert!(matches!(again, Decision::Call(_)), "{again:?}");
    // All down: open passes through, closed answers 503.
    a.etcd.set_down(true);
    let open = etcd_plugin(r#""failure_mode": "open""#);
    assert!(run(&open, &mut a, &req("POST", "/o").key("k2"), ok("x")).reached_upstream());
    assert_eq!(a.count_of(Counter::FailedOpen), 1);
    let closed = etcd_plugin("");
    let o = run(&closed, &mut a, &req("POST", "/o").key("k3"), ok("x"));
    assert_eq!(o.status(), 503);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:store-unavailable"
    );
    // A timed-out attempt (Envoy answers 504) is retried while the budget lasts (a member
    // that lost its leader keeps the request until it times out), then it fails.
    let mut s = DedupStream::new(3);
    let first = s.on_request_headers(&closed, &mut a, req("POST", "/o").key("k4").head, true);
    let Decision::Call(c) = first else {
        panic!("{first:?}")
    };
    assert!(
        c.timeout_ms <= 500 / 3 + 1,
        "one attempt is a slice of the budget: {}",
        c.timeout_ms
    );
    let timeout = || CallAnswer {
        status: 504,
        body: b"upstream request timeout".to_vec(),
        ..Default::default()
    };
    a.now_ms += 200;
    let retried = s.on_store_answer(&closed, &mut a, timeout());
    assert!(matches!(retried, Decision::Call(_)), "{retried:?}");
    a.now_ms += 400;
    let after = s.on_store_answer(&closed, &mut a, timeout());
    assert!(
        matches!(after, Decision::Reply(ref r) if r.status == 503),
        "{after:?}"
    );
}

#[test]
fn etcd_lost_lease_is_granted_again() {
    let (p, (mut a, _)) = (etcd_plugin(""), two_proxies());
    run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x"));
    let grants = a.etcd.grants();
    a.etcd.revoke_all_leases();
    assert!(run(&p, &mut a, &req("POST", "/o").key("k2"), ok("y")).reached_upstream());
    assert!(a.etcd.grants() > grants);
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
}

#[test]
fn under_hold_etcd_in_flight_records_end_only_with_their_lease_whatever_the_clocks() {
    let hold = format!(r#"{TTL_10_IN_FLIGHT_5}, "on_unknown_outcome": "hold""#);
    let (p, r) = (etcd_plugin(&hold), req("POST", "/o").key("k"));
    let (mut a, mut b) = two_proxies();
    let t0 = a.now_ms;
    let stuck = send(&p, &mut a, &r).unwrap();
    // B's clock runs 60 s ahead: by its clock the claim expired long ago, but only
    // etcd decides when an in-flight record ends.
    b.clock_ahead_ms = 60_000;
    b.now_ms = t0 + 60_000;
    let dup = run(&p, &mut b, &r, ok("twice"));
    assert_eq!(dup.status(), 409);
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    b.now_ms = t0 + 60_000 + 4_000;
    assert_eq!(run(&p, &mut b, &r, ok("twice")).status(), 409);
    // The in-flight lease (5 s + a 1 s window + the 0.5 s store budget, in whole
    // seconds) has ended by etcd's clock: the key is
    // gone and may run again.
    b.now_ms = t0 + 60_000 + 7_001;
    let retry = send(&p, &mut b, &r).unwrap();
    a.now_ms = t0 + 7_001;
    respond(&p, &mut a, stuck, ok("late"));
    assert_eq!(a.count_of(Counter::ClaimsLost), 1);
    respond(&p, &mut b, retry, ok("fresh"));
    run(&p, &mut a, &r, ok("no")).assert_replays(b"fresh");
    // Completed records answer for ttl by the reader's clock, then their lease removes
    // them from etcd.
    let t1 = a.now_ms;
    assert!(a.etcd.key_count(t1) >= 1);
    // ttl + (in flight + window + budget) + 1 s + the completed window, from the grant.
    assert_eq!(
        a.etcd
            .key_count(t1 + 10_000 + 6_500 + 1_000 + 1_250 + 1_000),
        0
    );
    let (mut c, _) = two_proxies();
    c.etcd = a.etcd.clone();
    c.now_ms = t1 + 10_000;
    run(&p, &mut c, &r, ok("third")).assert_upstream("expired after ttl");
}

#[test]
fn etcd_unreadable_records_are_never_taken_over() {
    let (p, (mut a, _)) = (etcd_plugin(""), two_proxies());
    let (r, s) = sent(&p, &mut a, req("POST", "/o").key("k"));
    drop(s);
    // Overwrite the record with bytes this version cannot read (a newer format).
    a.etcd.corrupt_all();
    // An hour later by this proxy's clock (etcd's lease has not run out).
    a.now_ms += 3_600_000;
    a.clock_ahead_ms = 3_600_000;
    assert_eq!(run(&p, &mut a, &r, ok("twice")).status(), 409);
}

#[test]
fn etcd_completion_and_release_are_retried_and_recognised_when_answers_are_lost() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    // Completion refused once (dead member), then accepted.
    let (r, s) = sent(&p, &mut a, req("POST", "/o").key("k1"));
    a.etcd.fail_next(1);
    respond(&p, &mut a, s, ok("one"));
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    run(&p, &mut b, &r, ok("no")).assert_replays(b"one");
    // Completion applied but its answer lost: the retry's compare fails on our own
    // completed record, which counts as confirmed.
    let r2 = req("POST", "/o").key("k2");
    let s = send(&p, &mut a, &r2).unwrap();
    a.etcd.lose_next_answers(1);
    respond(&p, &mut a, s, ok("two"));
    assert_eq!(
        counts(&a, [Counter::ClaimsLost, Counter::StoreErrors]),
        [0, 0]
    );
    run(&p, &mut b, &r2, ok("no")).assert_replays(b"two");
    // Release applied but its answer lost: the key is gone, which is what we wanted.
    let r3 = req("POST", "/o").key("k3");
    let s = send(&p, &mut a, &r3).unwrap();
    a.etcd.lose_next_answers(1);
    respond(&p, &mut a, s, answer(503, "busy"));
    assert_eq!(a.count_of(Counter::ClaimsLost), 0);
    assert!(run(&p, &mut b, &r3, ok("again")).reached_upstream());
}

#[test]
fn etcd_records_larger_than_the_record_limit_complete_without_the_response() {
    let p = plugin(
        r#"{"max_replay_body_bytes": 20000,
            "store": {"kind": "etcd", "cluster": "etcd", "max_record_bytes": 40000}}"#,
    );
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let mut big = ok(&"x".repeat(10_000));
    big.headers.push(("x-big".into(), vec![b'h'; 35_000]));
    assert!(run(&p, &mut a, &r, big).reached_upstream());
    let dup = run(&p, &mut b, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
    // A replay cap that cannot fit a record is refused at configure time.
    let (field, _) =
        cfg_err(r#"{"max_replay_body_bytes": 2000000, "store": {"kind": "etcd", "cluster": "e"}}"#);
    assert_eq!(field, "max_replay_body_bytes");
    let (field, _) = cfg_err(r#"{"store": {"max_record_bytes": 100000}}"#);
    assert_eq!(field, "store.max_record_bytes");
}

#[test]
fn etcd_a_claim_won_after_the_client_left_is_released() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let r = req("POST", "/o").key("k");
    let mut s = DedupStream::new(3);
    let mut action = s.on_request_headers(&p, &mut a, r.head.clone(), true);
    // Grant leases, up to the claim txn itself.
    while let Decision::Call(c) = &action {
        if crate::stores::etcd::wire::is_txn(c.path) {
            break;
        }
        let answer = call(&a, c);
        action = s.on_store_answer(&p, &mut a, answer);
    }
    let Decision::Call(claim) = action else {
        panic!("expected the claim txn, got {action:?}")
    };
    // The client leaves while the claim is out; etcd then accepts it.
    assert_eq!(s.on_stream_end(&p, &mut a, &origin("", flags::DC)), None);
    let answer = call(&a, &claim);
    let released = s.on_store_answer(&p, &mut a, answer);
    assert!(
        matches!(released, Decision::Call(_)),
        "a release txn, not a forward"
    );
    let after = settle(&p, &mut a, &mut s, released);
    assert_eq!(after, Decision::Continue);
    assert_eq!(a.count_of(Counter::Released), 1);
    // Nothing was forwarded, so the key is free.
    assert!(run(&p, &mut b, &r, ok("once")).reached_upstream());
}

#[test]
fn etcd_a_lease_grant_answered_late_never_shortens_the_claims_made_with_it() {
    // The worker uses a lease for claims during one window. Counted from when the grant
    // was answered, a grant answered late (up to the attempt timeout) lets claims use a
    // lease that ends before their in-flight time.
    let (p, (mut a, mut b)) = (
        etcd_plugin(r#""in_flight_timeout_seconds": 5"#),
        two_proxies(),
    );
    let t0 = a.now_ms;
    let mut first = DedupStream::new(1);
    let mut action = first.on_request_headers(&p, &mut a, req("POST", "/o").key("k0").head, true);
    // etcd grants the in-flight lease at t0; the answer reaches the worker 999 ms later
    // (within the attempt timeout).
    let Decision::Call(grant) = action else {
        panic!("{action:?}")
    };
    assert_eq!(grant.path, crate::stores::etcd::pb::LEASE_GRANT);
    let granted = call(&a, &grant);
    a.now_ms = t0 + 999;
    action = first.on_store_answer(&p, &mut a, granted);
    assert_eq!(settle(&p, &mut a, &mut first, action), Decision::Continue);
    // Another request on the same worker, just inside the lease's window.
    a.now_ms = t0 + 1_998;
    let (r, second) = sent(&p, &mut a, req("POST", "/o").key("k1"));
    let forwarded_at = a.now_ms;
    // Until 5 s after that claim, the key is in flight on every proxy.
    b.now_ms = forwarded_at + 4_999;
    let dup = run(&p, &mut b, &r, ok("twice"));
    assert_eq!(
        dup.status(),
        409,
        "the claim made at t+1998 ended early: {dup:?}"
    );
    drop((first, second));
}

#[test]
fn an_etcd_record_of_exactly_the_limit_keeps_its_response() {
    use crate::record::RecordState;
    use crate::stores::etcd::wire::EtcdRecord;
    let limit = 20_000;
    let p = plugin(&format!(
        r#"{{"max_replay_body_bytes": 3616,
            "store": {{"kind": "etcd", "cluster": "etcd", "max_record_bytes": {limit}}}}}"#
    ));
    // The size of the completed record for a header value of `n` bytes.
    let size = |n: usize| {
        EtcdRecord {
            state: RecordState::Completed,
            token: 0,
            expires_ms: 0,
            payload: [0; 32],
            response: Some(StoredResponse {
                status: 200,
                headers: vec![
                    ("content-type".into(), b"application/json".to_vec()),
                    ("x-big".into(), vec![b'h'; n]),
                ],
                body: b"body".to_vec(),
            }),
        }
        .encode(&[0; 32])
        .len()
    };
    let fits = limit - size(0);
    assert_eq!(size(fits), limit);
    for (key, n, kept) in [("exact", fits, true), ("over", fits + 1, false)] {
        let (mut a, mut b) = two_proxies();
        let r = req("POST", "/o").key(key);
        let mut big = ok("body");
        big.headers.push(("x-big".into(), vec![b'h'; n]));
        assert!(run(&p, &mut a, &r, big).reached_upstream());
        let dup = run(&p, &mut b, &r, ok("no"));
        assert_eq!(
            matches!(dup, Outcome::Local(ref l) if l.status == 200),
            kept,
            "{key}: {dup:?}"
        );
    }
}

#[test]
fn etcd_a_completed_record_is_taken_over_at_its_expiry_while_its_lease_lives() {
    let (p, r) = (etcd_plugin(TTL_10_IN_FLIGHT_5), req("POST", "/o").key("k"));
    let (mut a, mut b) = two_proxies();
    let t0 = a.now_ms;
    assert!(run(&p, &mut a, &r, ok("first")).reached_upstream());
    b.now_ms = t0 + 9_999;
    run(&p, &mut b, &r, ok("no")).assert_replays(b"first");
    // Expired by the reader's clock; etcd still has it (its lease runs longer).
    let (mut c, _) = two_proxies();
    c.etcd = a.etcd.clone();
    c.now_ms = t0 + 10_000;
    assert!(c.etcd.key_count(c.now_ms) >= 1);
    assert_eq!(run(&p, &mut c, &r, ok("second")), executed("second"));
    let (mut d, _) = two_proxies();
    d.etcd = a.etcd.clone();
    d.now_ms = t0 + 10_001;
    run(&p, &mut d, &r, ok("no")).assert_replays(b"second");
}

#[test]
fn a_plugin_builds_the_state_of_its_own_store_only() {
    use crate::stores::etcd::EtcdStore;
    use crate::stores::shared::SharedDataStore;
    let etcd = etcd_plugin(r#""ttl_seconds": 60"#);
    let ec = etcd.store.as_any().downcast_ref::<EtcdStore>();
    assert!(ec.is_some_and(|ec| ec.config.timeout_ms == 500));
    assert!(etcd.store.makes_calls() && !plugin("{}").store.makes_calls());
    assert!(etcd.layout().is_err(), "etcd has no shared-data layout");
    assert!(etcd.layout_for(&etcd.config.policy).is_err());
    let shared = plugin("{}");
    assert!(shared.store.as_any().is::<SharedDataStore>());
    assert_eq!(
        shared.layout().unwrap().namespace(),
        shared.config.namespace()
    );
}

/// Every store call carries where it goes, resolved once from the config: the cluster
/// by name over gRPC (or a `GrpcService` carrying `store.authority` when that differs),
/// or an HTTP POST with `store.authority` (the JSON gateway).
#[test]
fn store_calls_carry_the_route_of_their_store() {
    use crate::stream::{Route, Transport};
    let first_call = |p: &crate::stream::Plugin| {
        let (_, mut env) = world();
        let r = req("POST", "/orders").key("k1");
        match DedupStream::new(1).on_request_headers(p, &mut env, r.head, true) {
            Decision::Call(c) => c,
            d => panic!("{d:?}"),
        }
    };
    let grpc = first_call(&etcd_plugin(""));
    assert_eq!(
        *grpc.route,
        Route {
            remote: None,
            cluster: "etcd".into(),
            shard: "etcd".into(),
            shard_id: crate::stores::etcd::shards::shard_id("etcd", "etcd", "etcd"),
            transport: Transport::Grpc {
                upstream: b"etcd".to_vec()
            }
        }
    );
    let p = plugin(
        r#"{"store": {"kind": "etcd", "cluster": "etcd", "authority": "etcd.internal", "timeout_ms": 500}}"#,
    );
    assert_eq!(
        first_call(&p).route.transport,
        Transport::Grpc {
            upstream: crate::stores::etcd::pb::grpc_service("etcd", "etcd.internal")
        }
    );
    let json = first_call(&etcd_json_plugin(""));
    assert_eq!(
        *json.route,
        Route {
            remote: None,
            cluster: "etcd".into(),
            shard: "etcd".into(),
            shard_id: crate::stores::etcd::shards::shard_id("etcd", "etcd", "etcd"),
            transport: Transport::Http {
                authority: "etcd".into()
            }
        }
    );
}
