//! Expiry advertised (`advertise_expiry`): what replays, 409s and 422s tell a client
//! about when their record stops answering, on both stores, at a known clock.

use crate::reply::EXPIRES_HEADER;
use crate::testing::*;

/// 2026-12-02 04:59:59.600 UTC: 400 ms before a whole second, so rounding shows.
const T0: u64 = 1_796_187_599_600;

fn header(o: &Outcome, name: &str) -> Option<String> {
    o.local()
        .header(name)
        .map(|v| String::from_utf8(v.to_vec()).unwrap())
}

fn expires(o: &Outcome) -> Option<String> {
    header(o, EXPIRES_HEADER)
}

#[test]
fn shared_data_replays_and_409s_say_when_the_record_stops_answering() {
    let (p, mut env) = one_worker(r#"{"ttl_seconds": 86400, "in_flight_timeout_seconds": 30}"#);
    env.now_ms = T0;
    let r = req("POST", "/orders").key("k1").body("{}");
    let (r, first) = sent(&p, &mut env, r);
    env.now_ms = T0 + 100;
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    // The claim's in-flight end, 04:59:59.6 + 30 s, rounded up to the second.
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    assert_eq!(header(&dup, "retry-after").as_deref(), Some("1"));
    assert_eq!(header(&dup, "age"), None, "a 409 is no stored response");
    let other = send(&p, &mut env, &req("POST", "/orders").key("k1").body("x")).unwrap_err();
    assert_eq!(other.status(), 422);
    assert_eq!(
        expires(&other).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    // Completed at 05:00:00.000: answers for 24 h from then.
    env.now_ms = T0 + 400;
    assert_eq!(respond(&p, &mut env, first, ok("made")), executed("made"));
    env.now_ms = T0 + 400 + 61_999;
    let replay = run(&p, &mut env, &r, ok("no"));
    replay.assert_replays(b"made");
    assert_eq!(
        expires(&replay).as_deref(),
        Some("Thu, 03 Dec 2026 05:00:00 GMT")
    );
    assert_eq!(header(&replay, "age").as_deref(), Some("61"));
    env.now_ms = T0 + 400 + 62_000;
    assert_eq!(
        header(&run(&p, &mut env, &r, ok("no")), "age").as_deref(),
        Some("62")
    );
    let other = run(
        &p,
        &mut env,
        &req("POST", "/orders").key("k1").body("x"),
        ok("no"),
    );
    assert_eq!(other.status(), 422);
    assert_eq!(
        expires(&other).as_deref(),
        Some("Thu, 03 Dec 2026 05:00:00 GMT")
    );
    assert_eq!(header(&other, "age"), None);
}

#[test]
fn advertise_expiry_false_sends_neither_header_and_a_rule_may_turn_it_back_on() {
    let p = plugin(
        r#"{"advertise_expiry": false, "rules": [
            {"name": "on", "match": {"path_prefix": "/on"}, "advertise_expiry": true},
            {"name": "off", "match": {"path_prefix": "/off"}}
        ]}"#,
    );
    let (_, mut env) = world();
    env.now_ms = T0;
    for (path, advertised) in [("/on", true), ("/off", false), ("/top", false)] {
        let r = req("POST", path).key("k1");
        let (r, first) = sent(&p, &mut env, r);
        let dup = send(&p, &mut env, &r).unwrap_err();
        assert_eq!(expires(&dup).is_some(), advertised, "{path}: 409");
        assert_eq!(header(&dup, "retry-after").as_deref(), Some("1"), "{path}");
        respond(&p, &mut env, first, ok("made"));
        let replay = run(&p, &mut env, &r, ok("no"));
        replay.assert_replays(b"made");
        assert_eq!(expires(&replay).is_some(), advertised, "{path}: replay");
        assert_eq!(
            header(&replay, "age").is_some(),
            advertised,
            "{path}: replay"
        );
    }
}

#[test]
fn a_replay_s_times_replace_the_stored_response_s_own_headers_of_those_names() {
    let (p, mut env) = one_worker(r#"{"ttl_seconds": 60}"#);
    env.now_ms = T0;
    let r = req("POST", "/orders").key("k1");
    let stamped = || {
        let mut a = answer(200, "made");
        a.headers = vec![
            ("age".into(), b"999".to_vec()),
            ("idempotency-expires".into(), b"never".to_vec()),
        ];
        a
    };
    run(&p, &mut env, &r, stamped());
    env.now_ms = T0 + 2_500;
    let replay = run(&p, &mut env, &r, ok("no"));
    let names: Vec<&str> = replay
        .local()
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["idempotent-replayed", "idempotency-expires", "age"]);
    assert_eq!(
        expires(&replay).as_deref(),
        Some("Wed, 02 Dec 2026 05:01:00 GMT")
    );
    assert_eq!(header(&replay, "age").as_deref(), Some("2"));
    // Turned off, the stored response is replayed as it was stored.
    let (p, mut env) = one_worker(r#"{"ttl_seconds": 60, "advertise_expiry": false}"#);
    run(&p, &mut env, &r, stamped());
    let replay = run(&p, &mut env, &r, ok("no"));
    assert_eq!(header(&replay, "age").as_deref(), Some("999"));
    assert_eq!(expires(&replay).as_deref(), Some("never"));
}

#[test]
fn not_stored_and_rejected_duplicates_advertise_the_completed_record_s_expiry() {
    for (extra, slug) in [
        (r#""max_replay_body_bytes": 2"#, "response-not-stored"),
        (r#""on_duplicate": "reject""#, "already-completed"),
    ] {
        let (p, mut env) = one_worker(&format!(r#"{{"ttl_seconds": 60, {extra}}}"#));
        env.now_ms = T0;
        let r = req("POST", "/orders").key("k1");
        run(&p, &mut env, &r, ok("too large"));
        env.now_ms = T0 + 10_000;
        let dup = run(&p, &mut env, &r, ok("no"));
        assert_eq!(
            dup.problem_type(),
            format!("urn:proxy-dedup:problem:{slug}")
        );
        assert_eq!(
            expires(&dup).as_deref(),
            Some("Wed, 02 Dec 2026 05:01:00 GMT"),
            "{slug}"
        );
        assert_eq!(header(&dup, "age"), None, "{slug}");
    }
}

#[test]
fn an_unknown_outcome_advertises_the_hold_s_end_and_retry_after_agrees() {
    // Kept (the default): until its TTL from the hold; no retry-after (waiting is no use).
    let (p, mut env) = one_worker(r#"{"ttl_seconds": 600, "in_flight_timeout_seconds": 30}"#);
    env.now_ms = T0;
    let (r, first) = sent(&p, &mut env, req("POST", "/orders").key("k1"));
    env.now_ms = T0 + 400;
    respond(&p, &mut env, first, upstream_reset());
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:10:00 GMT")
    );
    assert_eq!(header(&dup, "retry-after"), None);
    // Held until the in-flight timeout: retry-after counts down to the same instant.
    let (p, mut env) =
        one_worker(r#"{"on_unknown_outcome": "hold", "in_flight_timeout_seconds": 30}"#);
    env.now_ms = T0;
    let (r, first) = sent(&p, &mut env, req("POST", "/orders").key("k1"));
    respond(&p, &mut env, first, upstream_reset());
    env.now_ms = T0 + 20_400;
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    assert_eq!(header(&dup, "retry-after").as_deref(), Some("10"));
}

#[test]
fn a_kept_claim_unsettled_past_its_in_flight_time_advertises_its_ttl_end() {
    let (p, mut env) = one_worker(r#"{"ttl_seconds": 600, "in_flight_timeout_seconds": 30}"#);
    env.now_ms = T0;
    let (r, _first) = sent(&p, &mut env, req("POST", "/orders").key("k1"));
    env.now_ms = T0 + 10_000;
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    env.now_ms = T0 + 31_000;
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:10:00 GMT")
    );
}

#[test]
fn retry_after_never_points_past_the_claim_s_in_flight_end() {
    let (p, mut env) =
        one_worker(r#"{"retry_after_seconds": 20, "in_flight_timeout_seconds": 30}"#);
    env.now_ms = T0;
    let (r, _first) = sent(&p, &mut env, req("POST", "/orders").key("k1"));
    env.now_ms = T0 + 1_000;
    assert_eq!(
        header(&send(&p, &mut env, &r).unwrap_err(), "retry-after").as_deref(),
        Some("20")
    );
    env.now_ms = T0 + 25_000;
    let dup = send(&p, &mut env, &r).unwrap_err();
    assert_eq!(header(&dup, "retry-after").as_deref(), Some("5"));
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
}

#[test]
fn etcd_replays_advertise_the_record_s_expiry_without_an_age() {
    let (p, (mut a, mut b)) = (
        etcd_plugin(r#""ttl_seconds": 60, "in_flight_timeout_seconds": 30"#),
        two_proxies(),
    );
    a.now_ms = T0;
    b.now_ms = T0;
    let (r, first) = sent(&p, &mut a, req("POST", "/orders").key("k1").body("{}"));
    b.now_ms = T0 + 100;
    let dup = send(&p, &mut b, &r).unwrap_err();
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(
        expires(&dup).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    let other = send(&p, &mut b, &req("POST", "/orders").key("k1").body("x")).unwrap_err();
    assert_eq!(other.status(), 422);
    assert_eq!(
        expires(&other).as_deref(),
        Some("Wed, 02 Dec 2026 05:00:30 GMT")
    );
    a.now_ms = T0 + 400;
    assert_eq!(respond(&p, &mut a, first, ok("made")), executed("made"));
    b.now_ms = T0 + 10_000;
    let replay = run(&p, &mut b, &r, ok("no"));
    replay.assert_replays(b"made");
    assert_eq!(
        expires(&replay).as_deref(),
        Some("Wed, 02 Dec 2026 05:01:00 GMT")
    );
    // etcd values keep no completion time.
    assert_eq!(header(&replay, "age"), None);
    // This worker's tier answers the next one: the record's expiry, not the tier's.
    b.etcd.set_down(true);
    b.now_ms = T0 + 11_000;
    let replay = run(&p, &mut b, &r, ok("no"));
    replay.assert_replays(b"made");
    assert_eq!(
        expires(&replay).as_deref(),
        Some("Wed, 02 Dec 2026 05:01:00 GMT")
    );
}

#[test]
fn an_etcd_claim_past_its_in_flight_end_is_answered_without_a_past_date() {
    // `hold`: the claim lives on its in-flight lease, which etcd ends a little after the
    // claim's own in-flight end; meanwhile its 409 names no date.
    let (p, (mut a, mut b)) = (
        etcd_plugin(r#""on_unknown_outcome": "hold", "in_flight_timeout_seconds": 5"#),
        two_proxies(),
    );
    a.now_ms = T0;
    let (r, _first) = sent(&p, &mut a, req("POST", "/orders").key("k1"));
    b.now_ms = T0 + 5_000;
    let dup = send(&p, &mut b, &r).unwrap_err();
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(expires(&dup), None);
    assert_eq!(header(&dup, "retry-after").as_deref(), Some("1"));
}
