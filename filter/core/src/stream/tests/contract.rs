//! The README's decision table end to end through the plugin (shared data): replays,
//! 409, 422, 400, 413, released and held claims, failure modes, expiry, access-log decisions.

use crate::fake::FakeEnv;
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::stream::{Decision, DedupStream, Origin, Plugin};
use crate::testing::*;

#[test]
fn first_executes_then_replays_same_response() {
    let (p, mut env) = one_worker("{}");
    let r = req("POST", "/orders").key("k1").body(r#"{"item": 1}"#);
    let first = run(&p, &mut env, &r, ok(r#"{"order": 1}"#));
    assert_eq!(first, Outcome::Upstream(200, br#"{"order": 1}"#.to_vec()));
    let again = run(&p, &mut env, &r, ok("must not be called"));
    let reply = again.local();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, br#"{"order": 1}"#);
    assert_eq!(reply.header("idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(reply.header("content-type"), Some(&b"application/json"[..]));
    assert_eq!(
        counts(
            &env,
            [Counter::Executed, Counter::Replayed, Counter::Requests]
        ),
        [1, 1, 2]
    );
}

#[test]
fn a_replay_keeps_end_to_end_headers_and_drops_hop_by_hop_and_cookies() {
    let (p, mut env) = one_worker("{}");
    let r = req("POST", "/orders").key("k1");
    let mut a = answer(201, "made");
    a.headers = vec![
        ("location".into(), b"/orders/1".to_vec()),
        ("link".into(), b"<a>".to_vec()),
        ("link".into(), b"<b>".to_vec()),
        ("set-cookie".into(), b"session=secret".to_vec()),
        ("connection".into(), b"close, x-hop".to_vec()),
        ("x-hop".into(), b"1".to_vec()),
        ("transfer-encoding".into(), b"chunked".to_vec()),
        ("content-length".into(), b"4".to_vec()),
        ("x-envoy-upstream-service-time".into(), b"3".to_vec()),
    ];
    run(&p, &mut env, &r, a);
    let replay = run(&p, &mut env, &r, ok("x"));
    let names: Vec<&str> = replay
        .local()
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        names,
        vec![
            "location",
            "link",
            "link",
            "idempotent-replayed",
            "idempotency-expires",
            "age"
        ]
    );
    assert_eq!(replay.status(), 201);
}

#[test]
fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let p = plugin(r#"{"retry_after_seconds": 3}"#);
    let r = req("POST", "/orders").key("k1").body("{}");
    let (mut env, mut env2, first) = sent_on_worker_0(&p, &r);
    let dup = send(&p, &mut env2, &r).unwrap_err();
    assert_eq!(dup.status(), 409);
    assert_eq!(dup.local().header("retry-after"), Some(&b"3"[..]));
    assert_eq!(
        dup.local().header("content-type"),
        Some(&b"application/problem+json"[..])
    );
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(env2.count_of(Counter::RejectedInFlight), 1);
    respond(&p, &mut env, first, ok("done"));
    run(&p, &mut env2, &r, ok("no")).assert_replays(b"done");
}

#[test]
fn the_same_key_with_another_payload_gets_422() {
    let (p, mut env) = one_worker("{}");
    run(
        &p,
        &mut env,
        &req("POST", "/orders").key("k1").body("a"),
        ok("1"),
    );
    for other in [
        req("POST", "/orders").key("k1").body("b"),
        req("POST", "/refunds").key("k1").body("a"),
        req("PATCH", "/orders").key("k1").body("a"),
        req("POST", "/orders?x=1").key("k1").body("a"),
        req("POST", "/orders").key("k1"),
    ] {
        let o = run(&p, &mut env, &other, ok("no"));
        assert_eq!(o.status(), 422, "{:?}", other.head);
        assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:payload-mismatch");
    }
    // A mismatch while the first is in flight is 422 too (the more specific answer).
    let (_, mut env) = world();
    let _first = send(&p, &mut env, &req("POST", "/o").key("k2").body("a")).unwrap();
    assert_eq!(
        send(&p, &mut env, &req("POST", "/o").key("k2").body("b"))
            .unwrap_err()
            .status(),
        422
    );
    assert_eq!(env.count_of(Counter::PayloadMismatch), 1);
}

#[test]
fn a_missing_or_invalid_key_gets_400() {
    let p = plugin(r#"{"key": {"required": true, "max_length": 10}}"#);
    let (shared, mut env) = world();
    let missing = run(&p, &mut env, &req("POST", "/o").body("x"), ok("no"));
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.problem_type(),
        "urn:proxy-dedup:problem:missing-key"
    );
    for bad in ["01234567890", "a\u{7f}b"] {
        let o = run(&p, &mut env, &req("POST", "/o").key(bad), ok("no"));
        assert_eq!(o.status(), 400);
        assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:invalid-key");
    }
    assert_eq!(env.count_of(Counter::BadKey), 3);
    assert_eq!(shared.key_count(), 0, "bad requests touch no store");
    // Not required: a keyless request passes through untouched.
    let p = plugin("{}");
    let o = run(&p, &mut env, &req("POST", "/o").body("x"), ok("yes"));
    assert_eq!(o, executed("yes"));
    assert_eq!(env.count_of(Counter::Bypassed), 1);
    // A bad key is refused even when not required.
    assert_eq!(
        run(&p, &mut env, &req("POST", "/o").key(""), ok("no")).status(),
        400
    );
}

#[test]
fn an_upstream_5xx_and_requests_never_sent_release_the_claim() {
    let (p, mut env) = one_worker("{}");
    let r = req("POST", "/pay").key("k1").body("{}");
    // The upstream itself answered a status that is not stored.
    assert_eq!(run(&p, &mut env, &r, answer(503, "busy")).status(), 503);
    // Envoy could not send it: connection refused, no healthy host.
    let refused = origin(
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
        flags::UF,
    );
    assert_eq!(
        run(&p, &mut env, &r, local(503, refused.clone())).status(),
        503
    );
    assert_eq!(run(&p, &mut env, &r, ended(refused)), Outcome::Reset);
    let none = origin("no_healthy_upstream", flags::UH);
    assert_eq!(run(&p, &mut env, &r, local(503, none)).status(), 503);
    // A filter after this one answered (rate limiter, ext_authz): never stored.
    let limited = origin("request_rate_limited", flags::RL);
    assert_eq!(run(&p, &mut env, &r, local(429, limited)).status(), 429);
    let denied = origin("ext_authz_denied", flags::UAEX);
    assert_eq!(run(&p, &mut env, &r, local(403, denied)).status(), 403);
    assert_eq!(run(&p, &mut env, &r, ok("paid")), executed("paid"));
    assert_eq!(
        counts(
            &env,
            [
                Counter::Executed,
                Counter::Released,
                Counter::OutcomeUnknown
            ]
        ),
        [7, 6, 0]
    );
    run(&p, &mut env, &r, ok("no")).assert_replays(b"paid");
    // 4xx is stored by default; configurable.
    let p = plugin(r#"{"store_statuses": ["2xx"]}"#);
    let r = req("POST", "/pay").key("k2");
    run(&p, &mut env, &r, answer(409, "conflict"));
    assert_eq!(run(&p, &mut env, &r, ok("second")), executed("second"));
}

#[test]
fn statuses_that_ask_for_a_retry_are_not_stored_by_default() {
    let (p, mut env) = one_worker("{}");
    for (i, status) in [408u16, 425, 429].into_iter().enumerate() {
        let r = req("POST", "/o").key(&format!("k{i}"));
        assert_eq!(
            run(&p, &mut env, &r, answer(status, "later")).status(),
            status
        );
        assert_eq!(
            run(&p, &mut env, &r, ok("done")),
            executed("done"),
            "{status} is not stored: the retry executes"
        );
    }
    for status in [400u16, 404, 409, 422, 201, 302] {
        assert!(p.config.policy.stores_status(status), "{status}");
    }
    // Exclusions: "!code" or "!class"; an exclusion wins over an inclusion.
    let p = plugin(r#"{"store_statuses": ["2xx", "4xx", "!404", "!5xx"]}"#);
    assert!(p.config.policy.stores_status(200) && p.config.policy.stores_status(429));
    assert!(!p.config.policy.stores_status(404) && !p.config.policy.stores_status(302));
}

#[test]
fn under_hold_an_unknown_outcome_holds_the_claim_until_the_in_flight_timeout() {
    let p = plugin(r#"{"in_flight_timeout_seconds": 30, "on_unknown_outcome": "hold"}"#);
    let unknowns = unknown_outcomes();
    let n = unknowns.len() as u64;
    for (i, first) in unknowns.into_iter().enumerate() {
        let (_, mut env) = world();
        let r = req("POST", "/pay").key(&format!("k{i}")).body("{}");
        let t0 = env.now_ms;
        run(&p, &mut env, &r, first);
        // The retry must not run: the upstream may have executed the first.
        env.now_ms = t0 + 10_400;
        let dup = run(&p, &mut env, &r, ok("twice"));
        assert_eq!(dup.status(), 409, "case {i}");
        assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
        assert_eq!(
            dup.local().header("retry-after"),
            Some(&b"20"[..]),
            "case {i}: retry-after is the rest of the in-flight timeout"
        );
        assert_eq!(env.count_of(Counter::OutcomeUnknown), 1, "case {i}");
        assert_eq!(env.count_of(Counter::Released), 0, "case {i}");
        // Once the in-flight timeout has passed, the key may run again.
        env.now_ms = t0 + 30_000;
        assert_eq!(
            run(&p, &mut env, &r, ok("again")),
            executed("again"),
            "case {i}"
        );
    }
    assert!(n >= 5);
}

#[test]
fn by_default_an_unknown_outcome_is_kept_until_the_ttl_and_never_runs_again() {
    let p = plugin(r#"{"in_flight_timeout_seconds": 30, "ttl_seconds": 600}"#);
    for (i, first) in unknown_outcomes().into_iter().enumerate() {
        let (_, mut env) = world();
        let r = req("POST", "/pay").key(&format!("k{i}")).body("{}");
        let t0 = env.now_ms;
        run(&p, &mut env, &r, first);
        // During the in-flight timeout, after it, and to the last second of the TTL
        // (counted from the end of the first stream): never again.
        for (n, at) in [10_400u64, 30_000, 31_000, 599_999].into_iter().enumerate() {
            env.now_ms = t0 + at;
            let dup = run(&p, &mut env, &r, ok("twice"));
            assert_eq!(dup.status(), 409, "case {i} at {at}");
            assert_eq!(
                dup.problem_type(),
                "urn:proxy-dedup:problem:outcome-unknown",
                "case {i} at {at}"
            );
            assert_eq!(dup.local().header("retry-after"), None, "case {i}");
            assert_eq!(
                env.count_of(Counter::RejectedOutcomeUnknown),
                n as u64 + 1,
                "case {i}"
            );
        }
        // Another payload under the same key is still a mismatch.
        let other = req("POST", "/pay").key(&format!("k{i}")).body("{\"x\":1}");
        assert_eq!(
            run(&p, &mut env, &other, ok("no")).status(),
            422,
            "case {i}"
        );
        assert_eq!(env.count_of(Counter::OutcomeUnknown), 1, "case {i}");
        assert_eq!(env.count_of(Counter::Released), 0, "case {i}");
        assert_eq!(env.count_of(Counter::RejectedInFlight), 0, "case {i}");
        // Its TTL over, the record is gone and the key is a new request.
        env.now_ms = t0 + 600_001;
        assert_eq!(
            run(&p, &mut env, &r, ok("again")),
            executed("again"),
            "case {i}"
        );
    }
}

/// Forwarded requests whose outcome Envoy leaves open.
fn unknown_outcomes() -> Vec<Answer> {
    vec![
        upstream_reset(),
        ended(origin("downstream_remote_disconnect", flags::DC)),
        ended(origin("", 0)),
        local(504, origin("upstream_response_timeout", flags::UT)),
        local(
            503,
            origin(
                "upstream_reset_before_response_started{connection_termination}",
                flags::UC,
            ),
        ),
    ]
}

#[test]
fn on_unknown_outcome_release_lets_the_retry_run() {
    let (p, mut env) = one_worker(r#"{"on_unknown_outcome": "release"}"#);
    let r = req("POST", "/pay").key("k").body("{}");
    assert_eq!(run(&p, &mut env, &r, upstream_reset()), Outcome::Reset);
    assert_eq!(run(&p, &mut env, &r, ok("again")), executed("again"));
    let unknown_then_released = [Counter::OutcomeUnknown, Counter::Released];
    assert_eq!(counts(&env, unknown_then_released), [1, 1]);
}

#[test]
fn a_status_that_arrived_counts_even_if_the_body_is_cut() {
    let (p, mut env) = one_worker("{}");
    let (r, mut s) = sent(&p, &mut env, req("POST", "/o").key("k1"));
    let up = Origin::upstream();
    assert_eq!(
        s.on_response_headers(&p, &mut env, 200, &up, Vec::new, false),
        None
    );
    assert_eq!(s.on_response_body(&p, &mut env, b"part", false), None);
    let cut = origin(
        "upstream_reset_after_response_started{remote_reset}",
        flags::UR,
    );
    assert_eq!(s.on_stream_end(&p, &mut env, &cut), None);
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(counts(&env, [Counter::Released, Counter::Executed]), [0, 1]);
}

#[test]
fn local_errors_are_problem_json() {
    let (p, mut env) = one_worker(r#"{"key": {"required": true}}"#);
    let o = run(&p, &mut env, &req("POST", "/o"), ok("no"));
    let v: serde_json::Value = serde_json::from_slice(&o.local().body).unwrap();
    assert_eq!(v["status"], 400);
    assert!(v["title"].as_str().unwrap().contains("missing"));
    assert!(v["detail"].as_str().unwrap().contains("idempotency-key"));
}

#[test]
fn the_decision_waits_for_the_end_of_the_body() {
    let p = plugin("{}");
    let (shared, mut env) = world();
    let mut s = DedupStream::new(9);
    let r = req("POST", "/o").key("k1");
    assert_eq!(
        s.on_request_headers(&p, &mut env, r.head.clone(), false),
        Decision::Pause
    );
    let never = || -> Option<Vec<u8>> { panic!("the body is read once, at its end") };
    assert_eq!(
        s.on_request_body(&p, &mut env, 9, false, never),
        Decision::Pause
    );
    assert_eq!(shared.key_count(), 0, "no claim before the end of the body");
    assert_eq!(
        s.on_request_body(&p, &mut env, 16, false, never),
        Decision::Pause
    );
    // Trailers end the body.
    assert_eq!(
        s.on_request_trailers(&p, &mut env, || Some(b"part one and two".to_vec())),
        Decision::Continue
    );
    assert!(s.holds_claim());
    // The chunked body and the same body in one piece are the same payload.
    let mut whole = req("POST", "/o").key("k1").body("part one and two");
    whole.chunk = 100;
    let _ = respond(&p, &mut env, s, ok("ok"));
    run(&p, &mut env, &whole, ok("no")).assert_replays(b"ok");
}

#[test]
fn body_over_limit_gets_413_and_nothing_is_claimed() {
    let p = plugin(r#"{"max_body_bytes": 10}"#);
    let (shared, mut env) = world();
    let o = run(
        &p,
        &mut env,
        &req("POST", "/o").key("k").body("0123456789A"),
        ok("no"),
    );
    assert_eq!(o.status(), 413);
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:body-too-large");
    assert_eq!(shared.key_count(), 0);
    assert!(run(
        &p,
        &mut env,
        &req("POST", "/o").key("k").body("0123456789"),
        ok("y")
    )
    .reached_upstream());
}

#[test]
fn other_methods_pass_untouched() {
    let p = plugin("{}");
    let (shared, mut env) = world();
    for _ in 0..2 {
        let o = run(&p, &mut env, &req("GET", "/orders").key("k1"), ok("list"));
        assert_eq!(o, executed("list"));
    }
    assert_eq!(shared.key_count(), 0);
    assert_eq!(env.count_of(Counter::Bypassed), 2);
}

#[test]
fn reject_mode_answers_409_for_completed() {
    let (p, mut env) = one_worker(r#"{"on_duplicate": "reject"}"#);
    let r = req("POST", "/o").key("k");
    run(&p, &mut env, &r, ok("1"));
    let o = run(&p, &mut env, &r, ok("no"));
    assert_eq!(o.status(), 409);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:already-completed"
    );
}

#[test]
fn oversized_response_blocks_duplicates_without_replay() {
    let (p, mut env) = one_worker(r#"{"max_replay_body_bytes": 8}"#);
    let r = req("POST", "/o").key("k");
    assert!(run(&p, &mut env, &r, ok("0123456789")).reached_upstream());
    let o = run(&p, &mut env, &r, ok("no"));
    assert_eq!(o.status(), 409);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    // At the cap it is stored.
    let r2 = req("POST", "/o").key("k2");
    run(&p, &mut env, &r2, ok("01234567"));
    run(&p, &mut env, &r2, ok("no")).assert_replays(b"01234567");
}

#[test]
fn failure_modes() {
    for (mode, expect) in [("open", 200), ("closed", 503)] {
        let p = plugin(&format!(r#"{{"failure_mode": "{mode}"}}"#));
        let (shared, mut env) = world();
        shared.set_failing(true);
        let o = run(&p, &mut env, &req("POST", "/o").key("k"), ok("through"));
        assert_eq!(o.status(), expect, "{mode}");
        assert_eq!(env.count_of(Counter::StoreErrors), 1);
        if mode == "closed" {
            assert_eq!(
                o.problem_type(),
                "urn:proxy-dedup:problem:store-unavailable"
            );
        } else {
            assert_eq!(env.count_of(Counter::FailedOpen), 1);
        }
    }
    // The store failing between claim and completion: counted, nothing panics, and
    // under "hold" the record stays in flight until its timeout...
    let p = plugin(r#"{"in_flight_timeout_seconds": 5, "on_unknown_outcome": "hold"}"#);
    let (shared, mut env) = world();
    let (r, s) = sent(&p, &mut env, req("POST", "/o").key("k"));
    shared.set_failing(true);
    respond(&p, &mut env, s, ok("x"));
    assert_eq!(env.count_of(Counter::StoreErrors), 1);
    shared.set_failing(false);
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409);
    env.now_ms += 5_000;
    assert!(run(&p, &mut env, &r, ok("again")).reached_upstream());
    // ...and by default until its TTL: it ran, and nothing recorded it.
    let p = plugin(r#"{"in_flight_timeout_seconds": 5, "ttl_seconds": 60}"#);
    let (shared, mut env) = world();
    let (r, s) = sent(&p, &mut env, req("POST", "/o").key("k"));
    shared.set_failing(true);
    respond(&p, &mut env, s, ok("x"));
    shared.set_failing(false);
    assert_eq!(
        run(&p, &mut env, &r, ok("no")).problem_type(),
        "urn:proxy-dedup:problem:in-flight"
    );
    env.now_ms += 5_000;
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    env.now_ms += 54_999;
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409);
    env.now_ms += 1;
    assert!(run(&p, &mut env, &r, ok("again")).reached_upstream());
}

#[test]
fn under_hold_ttl_and_in_flight_expiry() {
    let (p, mut env) = one_worker(
        r#"{"ttl_seconds": 60, "in_flight_timeout_seconds": 10, "on_unknown_outcome": "hold"}"#,
    );
    let r = req("POST", "/o").key("k");
    run(&p, &mut env, &r, ok("one"));
    env.now_ms += 59_999;
    run(&p, &mut env, &r, ok("no")).assert_replays(b"one");
    env.now_ms += 1;
    assert_eq!(run(&p, &mut env, &r, ok("two")), executed("two"));
    // In flight: blocks until the timeout, then the key runs again.
    let r2 = req("POST", "/o").key("k2");
    let stuck = send(&p, &mut env, &r2).unwrap();
    env.now_ms += 9_999;
    assert_eq!(send(&p, &mut env, &r2).unwrap_err().status(), 409);
    env.now_ms += 1;
    let retry = send(&p, &mut env, &r2).unwrap();
    // The stuck original answers late: it must not overwrite the new owner's record.
    respond(&p, &mut env, stuck, ok("late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    assert_eq!(send(&p, &mut env, &r2).unwrap_err().status(), 409);
    respond(&p, &mut env, retry, ok("fresh"));
    run(&p, &mut env, &r2, ok("no")).assert_replays(b"fresh");
    // Nor its response slot, when it answers after its successor completed.
    let r3 = req("POST", "/o").key("k3");
    let stuck = send(&p, &mut env, &r3).unwrap();
    env.now_ms += 10_000;
    assert_eq!(
        run(&p, &mut env, &r3, ok("successor")),
        executed("successor")
    );
    respond(&p, &mut env, stuck, ok("late"));
    run(&p, &mut env, &r3, ok("no")).assert_replays(b"successor");
}

#[test]
fn by_default_a_response_after_the_in_flight_timeout_is_still_stored() {
    // The claim lives until its TTL: a slow upstream's answer completes it.
    let (p, mut env) = one_worker(r#"{"in_flight_timeout_seconds": 5}"#);
    let (r, slow) = sent(&p, &mut env, req("POST", "/o").key("k"));
    env.now_ms += 4_999;
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    env.now_ms += 1;
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    env.now_ms += 60_000;
    respond(&p, &mut env, slow, ok("slow but kept"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 0);
    run(&p, &mut env, &r, ok("no")).assert_replays(b"slow but kept");
    assert_eq!(env.count_of(Counter::Executed), 1);
}

#[test]
fn under_hold_a_response_after_the_in_flight_timeout_is_not_stored() {
    // The claim ended at its in-flight timeout (as `proxy_dedup_claims_lost` says):
    // a response after it is not kept, whether or not the key ran again meanwhile.
    let (p, mut env) =
        one_worker(r#"{"in_flight_timeout_seconds": 5, "on_unknown_outcome": "hold"}"#);
    let (r, slow) = sent(&p, &mut env, req("POST", "/o").key("k"));
    env.now_ms += 4_999;
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409);
    env.now_ms += 1;
    respond(&p, &mut env, slow, ok("too late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    assert_eq!(run(&p, &mut env, &r, ok("again")), executed("again"));
    // Just in time, it is kept.
    let r2 = req("POST", "/o").key("k2");
    let s = send(&p, &mut env, &r2).unwrap();
    env.now_ms += 4_999;
    respond(&p, &mut env, s, ok("in time"));
    run(&p, &mut env, &r2, ok("no")).assert_replays(b"in time");
}

#[test]
fn each_decision_is_reported_once_for_access_logs() {
    let (p, mut env) = one_worker(r#"{"key": {"required": false}}"#);
    let (r, mut s) = sent(&p, &mut env, req("POST", "/o").key("k").body("{}"));
    let (verdict, record) = s.log_fields().unwrap();
    assert_eq!(verdict, "executed");
    let record = record.unwrap().to_string();
    assert_eq!(record.len(), 12);
    assert!(s.log_fields().is_none(), "unchanged: nothing new to report");
    let _ = respond(&p, &mut env, s, ok("done"));
    let decisions = [
        (r.clone(), "replayed"),
        (req("POST", "/o").key("k").body("other"), "mismatch"),
        (req("GET", "/o").key("k"), "bypassed"),
        (req("POST", "/o").key("k").key("k"), "bad_key"),
        (
            r.clone().header("authorization", "Bearer another"),
            "principal_mismatch",
        ),
    ];
    for (r, want) in decisions {
        let mut s = DedupStream::new(2);
        let action = s.on_request_headers(&p, &mut env, r.head.clone(), r.body.is_none());
        let action = if action == Decision::Pause {
            let body = r.body.clone().unwrap_or_default();
            s.on_request_body(&p, &mut env, body.len(), true, || Some(body.clone()))
        } else {
            action
        };
        assert!(!matches!(action, Decision::Pause | Decision::Call(_)));
        assert_eq!(s.log_fields().map(|f| f.0), Some(want));
    }
    // The held and released outcomes are reported when the response decides them.
    let (_r, mut s) = sent(&p, &mut env, req("POST", "/o").key("k2"));
    let _ = s.log_fields();
    assert_eq!(s.on_stream_end(&p, &mut env, &origin("", flags::DC)), None);
    assert_eq!(s.log_fields().map(|f| f.0), Some("outcome_unknown"));
    let (_r, mut s) = sent(&p, &mut env, req("POST", "/o").key("k3"));
    let up = Origin::upstream();
    let _ = s.on_response_headers(&p, &mut env, 503, &up, Vec::new, true);
    assert_eq!(s.log_fields().map(|f| f.0), Some("released"));
}

#[test]
fn each_local_answer_is_logged_as_its_decision() {
    let (_, mut env) = world();
    let decide = |p: &Plugin, env: &mut FakeEnv, r: &Req| {
        let mut s = DedupStream::new(9);
        let body = r.body.clone();
        let mut a = s.on_request_headers(p, env, r.head.clone(), body.is_none());
        if let Some(b) = body {
            a = s.on_request_body(p, env, b.len(), true, || Some(b.clone()));
        }
        assert!(matches!(a, Decision::Reply(_)), "{a:?}");
        s.log_fields().map(|(v, _)| v)
    };
    let p = plugin(r#"{"max_body_bytes": 4, "max_replay_body_bytes": 2}"#);
    let flying = send(&p, &mut env, &req("POST", "/o").key("fly")).unwrap();
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("fly")),
        Some("in_flight")
    );
    drop(flying);
    run(&p, &mut env, &req("POST", "/o").key("big"), ok("too big"));
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("big")),
        Some("not_stored")
    );
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("b").body("12345")),
        Some("body_too_large")
    );
    let reject = plugin(r#"{"on_duplicate": "reject", "store": {"namespace": "r"}}"#);
    run(&reject, &mut env, &req("POST", "/o").key("done"), ok("x"));
    assert_eq!(
        decide(&reject, &mut env, &req("POST", "/o").key("done")),
        Some("rejected_completed")
    );
    let closed = plugin(r#"{"failure_mode": "closed", "store": {"namespace": "c"}}"#);
    env.shared.set_failing(true);
    assert_eq!(
        decide(&closed, &mut env, &req("POST", "/o").key("c")),
        Some("store_unavailable")
    );
    env.shared.set_failing(false);
    let required = plugin(r#"{"key": {"required": true}}"#);
    assert_eq!(
        decide(&required, &mut env, &req("POST", "/o")),
        Some("bad_key")
    );
}

#[test]
fn a_push_redelivery_with_a_new_attempt_count_is_replayed_not_422() {
    let (p, mut env) = one_worker(
        r#"{"key": {"json_pointer": "/message/messageId", "required": true},
            "payload": {"ignore_json_pointers": ["/deliveryAttempt"]}}"#,
    );
    let push = |attempt: u32, data: &str| {
        req("POST", "/push").body(&format!(
            r#"{{"message": {{"messageId": "m-1", "data": "{data}"}}, "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert!(run(&p, &mut env, &push(1, "aGk="), ok("acked")).reached_upstream());
    run(&p, &mut env, &push(2, "aGk="), ok("no")).assert_replays(b"acked");
    let changed = run(&p, &mut env, &push(3, "Ynll"), ok("no"));
    assert_eq!(
        changed.problem_type(),
        "urn:proxy-dedup:problem:payload-mismatch"
    );
    // Its configuration errors: testdata/refused-configs.txt.
}
