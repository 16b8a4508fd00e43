//! The etcd claim and settle protocol under lost, failed and late answers: retries per
//! call, the time budget, claim rounds, leases granted again, answers recognised by token.

use crate::fake::FakeEnv;
use crate::key::{ClientKey, KeySource};
use crate::metrics::Counter;
use crate::stream::CallAnswer;
use crate::stream::{Decision, DedupStream, Origin, Plugin};
use crate::testing::*;

fn txn_answer(body: &str) -> CallAnswer {
    CallAnswer {
        status: 200,
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Drives a stream's store calls: grants go to etcd, each claim txn to `txn` (or etcd
/// when it answers `None`). Returns the decision and how many txns `txn` answered.
fn drive(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    mut action: Decision,
    mut txn: impl FnMut(usize) -> Option<CallAnswer>,
) -> (Decision, usize) {
    let mut n = 0;
    while let Decision::Call(c) = action {
        let a = if crate::stores::etcd::wire::is_txn(c.path) {
            match txn(n) {
                Some(a) => {
                    n += 1;
                    a
                }
                None => call(env, &c),
            }
        } else {
            call(env, &c)
        };
        action = s.on_store_answer(p, env, a);
    }
    (action, n)
}

/// After a failed claim txn, `next` is a retry (another call) when the failure is one to
/// retry, else the fail-closed 503.
fn assert_retried(next: &Decision, retried: bool, case: String) {
    assert_eq!(
        matches!(next, Decision::Call(_)),
        retried,
        "{case}: {next:?}"
    );
    if !retried {
        assert!(
            matches!(next, Decision::Reply(r) if r.status == 503),
            "{case}: {next:?}"
        );
    }
}

#[test]
fn etcd_transport_failures_are_retried_four_times_per_call() {
    let (p, (mut a, _)) = (etcd_plugin(r#""failure_mode": "closed""#), two_proxies());
    a.etcd.fail_next(4);
    assert!(run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x")).reached_upstream());
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    let (mut b, _) = two_proxies();
    b.etcd.fail_next(5);
    assert_eq!(
        run(&p, &mut b, &req("POST", "/o").key("k1"), ok("x")).status(),
        503
    );
    assert_eq!(b.count_of(Counter::StoreErrors), 1);
}

#[test]
fn etcd_only_transport_statuses_and_unavailable_are_retried() {
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for (status, body, retried) in [
        (0u16, "", true),
        (502, "", true),
        (503, "", true),
        (504, "upstream request timeout", true),
        (500, "", false),
        (200, "not json", false),
        (
            503,
            r#"{"error":"etcdserver: too many requests","code":8}"#,
            false,
        ),
        (
            503,
            r#"{"error":"etcdserver: leader changed","code":14}"#,
            true,
        ),
    ] {
        let (mut a, _) = two_proxies();
        let (mut s, first) = start_keyed(&p, &mut a);
        assert!(matches!(first, Decision::Call(_)));
        let next = s.on_store_answer(
            &p,
            &mut a,
            CallAnswer {
                status,
                body: body.as_bytes().to_vec(),
                ..Default::default()
            },
        );
        assert_retried(&next, retried, format!("{status} {body:?}"));
    }
}

#[test]
fn etcd_grpc_unavailable_deadline_and_failed_dispatch_are_retried_other_statuses_are_errors() {
    let p = etcd_plugin(r#""failure_mode": "closed""#);
    let status = |code: u32, msg: &str| CallAnswer {
        status: 0,
        body: crate::stores::etcd::pb::status_body(code, msg.as_bytes()),
        ..Default::default()
    };
    for (answer, retried) in [
        // Envoy's timeout and reset of a gRPC call.
        (
            status(14, "upstream request timeout{response_timeout}"),
            true,
        ),
        (status(14, "etcdserver: leader changed"), true),
        (status(4, "context deadline exceeded"), true),
        // Not dispatched at all (unknown cluster).
        (
            CallAnswer {
                status: 0,
                body: Vec::new(),
                ..Default::default()
            },
            true,
        ),
        (status(8, "etcdserver: too many requests"), false),
        (status(3, "etcdserver: request is too large"), false),
        (status(2, "unknown"), false),
        // A message that is not a TxnResponse.
        (
            CallAnswer {
                status: 200,
                body: vec![0xff, 0xff],
                ..Default::default()
            },
            false,
        ),
    ] {
        let (mut a, _) = two_proxies();
        let (mut s, mut action) = start_keyed(&p, &mut a);
        // Leases first (from the fake), up to the claim txn.
        while let Decision::Call(c) = &action {
            if crate::stores::etcd::wire::is_txn(c.path) {
                break;
            }
            let ans = call(&a, c);
            action = s.on_store_answer(&p, &mut a, ans);
        }
        assert!(matches!(&action, Decision::Call(c) if c.path == crate::stores::etcd::pb::TXN));
        let next = s.on_store_answer(&p, &mut a, answer.clone());
        assert_retried(&next, retried, format!("{answer:?}"));
    }
}

#[test]
fn etcd_grpc_lease_not_found_on_a_claim_takes_fresh_leases() {
    let (p, (mut a, _)) = (etcd_plugin(r#""failure_mode": "closed""#), two_proxies());
    let (mut s, first) = start_keyed(&p, &mut a);
    let grants = a.etcd.grants();
    let (decision, n) = drive(&p, &mut a, &mut s, first, |n| {
        (n < 2).then(|| CallAnswer {
            status: 0,
            body: crate::stores::etcd::pb::status_body(5, b"etcdserver: requested lease not found"),
            ..Default::default()
        })
    });
    assert_eq!(n, 2);
    assert_eq!(decision, Decision::Continue);
    assert!(s.holds_claim());
    assert!(
        a.etcd.grants() - grants >= 4,
        "both leases granted again twice"
    );
}

#[test]
fn etcd_attempts_are_a_third_of_the_budget_and_stop_at_its_end() {
    let p = etcd_plugin(r#""failure_mode": "closed""#); // timeout_ms 500
    let (mut a, _) = two_proxies();
    let t0 = a.now_ms;
    let mut s = DedupStream::new(1);
    let Decision::Call(first) =
        s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true)
    else {
        panic!()
    };
    // A third of 500 ms is below the 100 ms floor? No: 166 ms.
    assert_eq!(first.timeout_ms, 166);
    let refused = || CallAnswer {
        status: 503,
        body: Vec::new(),
        ..Default::default()
    };
    a.now_ms = t0 + 400;
    let Decision::Call(second) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!()
    };
    assert_eq!(second.timeout_ms, 100, "what is left of the budget");
    a.now_ms = t0 + 499;
    let Decision::Call(third) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!()
    };
    assert_eq!(third.timeout_ms, 1);
    a.now_ms = t0 + 500;
    let last = s.on_store_answer(&p, &mut a, refused());
    assert!(
        matches!(last, Decision::Reply(ref r) if r.status == 503),
        "{last:?}"
    );
    // The floor: a 150 ms budget still gives an attempt 100 ms, and a 3 s budget 1 s.
    for (budget, slice) in [(150, 100), (3000, 1000)] {
        let p = plugin(&format!(
            r#"{{"store": {{"kind": "etcd", "cluster": "etcd", "timeout_ms": {budget}}}}}"#
        ));
        let mut s = DedupStream::new(2);
        let Decision::Call(c) =
            s.on_request_headers(&p, &mut a, req("POST", "/o").key("k2").head, true)
        else {
            panic!()
        };
        assert_eq!(c.timeout_ms, slice, "budget {budget}");
    }
}

/// A claim whose first `fake` txns are answered with `body`: it executes (holds its
/// claim and forwards) exactly when `executes`.
fn claims_after(
    p: &Plugin,
    a: &mut FakeEnv,
    body: &str,
    fake: usize,
    executes: bool,
    case: String,
) {
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(p, a, req("POST", "/o").key("k").head, true);
    let (decision, n) = drive(p, a, &mut s, first, |n| {
        (n < fake).then(|| txn_answer(body))
    });
    assert_eq!(n, fake);
    let claimed = decision == Decision::Continue && s.holds_claim();
    assert_eq!(claimed, executes, "{case}: {decision:?}");
}

#[test]
fn etcd_claim_rounds_are_bounded() {
    // etcd says the compare failed but returns no record (deleted in between): the
    // claim tries again, eight times at most.
    let gone =
        r#"{"header": {"revision": "9"}, "responses": [{"response_range": {"header": {}}}]}"#;
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for (fake, executes) in [(8, true), (9, false)] {
        let (mut a, _) = two_proxies();
        claims_after(&p, &mut a, gone, fake, executes, format!("{fake}"));
    }
}

#[test]
fn etcd_a_lost_lease_is_granted_again_a_bounded_number_of_times() {
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for lost in [
        r#"{"error": "etcdserver: requested lease not found", "code": 5}"#,
        r#"{"error": "x", "code": 5}"#,
        r#"{"error": "etcdserver: requested lease not found"}"#,
    ] {
        for (fake, executes) in [(8, true), (9, false)] {
            let (mut a, _) = two_proxies();
            let grants = a.etcd.grants();
            claims_after(&p, &mut a, lost, fake, executes, format!("{lost} {fake}"));
            // Both leases are granted again after each loss.
            assert!(a.etcd.grants() - grants >= 2 * fake as u32, "{lost}");
        }
    }
}

#[test]
fn etcd_a_claim_whose_answer_was_lost_is_recognised_by_its_token() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let r = req("POST", "/o").key("k");
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(&p, &mut a, r.head.clone(), true);
    let etcd = a.etcd.clone();
    let mut lost_one = false;
    let (decision, _) = drive(&p, &mut a, &mut s, first, |_| {
        // etcd applies the first claim txn; its answer is lost on the way back.
        if !std::mem::replace(&mut lost_one, true) {
            etcd.lose_next_answers(1);
        }
        None
    });
    assert!(lost_one);
    assert_eq!(decision, Decision::Continue);
    assert!(s.holds_claim());
    assert_eq!(send(&p, &mut b, &r).unwrap_err().status(), 409);
    respond(&p, &mut a, s, ok("once"));
    run(&p, &mut b, &r, ok("no")).assert_replays(b"once");
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
}

#[test]
fn etcd_a_completion_is_retried_four_times_then_counted_failed() {
    let p = etcd_plugin("");
    for (failures, confirmed) in [(4, true), (5, false)] {
        let (mut a, mut b) = two_proxies();
        let (r, s) = sent(&p, &mut a, req("POST", "/o").key("k"));
        a.etcd.fail_next(failures);
        respond(&p, &mut a, s, ok("done"));
        assert_eq!(
            a.count_of(Counter::StoreErrors),
            u64::from(!confirmed),
            "{failures}"
        );
        // Confirmed completions are learned by the worker's tier; failed ones are not.
        a.etcd.set_down(true);
        let local = run(&p, &mut a, &r, ok("through"));
        assert_eq!(
            local.status() == 200 && matches!(local, Outcome::Local(_)),
            confirmed,
            "{local:?}"
        );
        a.etcd.set_down(false);
        let other = run(&p, &mut b, &r, ok("no"));
        if confirmed {
            assert_eq!(other.local().body, b"done");
        } else {
            // The record is still in flight: the key waits for its lease.
            assert_eq!(other.status(), 409);
        }
    }
}

#[test]
fn etcd_a_completion_is_not_retried_past_its_budget() {
    let p = etcd_plugin(""); // timeout_ms 500
    let (mut a, _) = two_proxies();
    let (_r, mut s) = sent(&p, &mut a, req("POST", "/o").key("k"));
    let pairs = || vec![(":status".to_string(), b"200".to_vec())];
    let c = s.on_response_headers(&p, &mut a, 200, &Origin::upstream(), pairs, true);
    let Some(c) = c else {
        panic!("no completion call")
    };
    assert_eq!(c.timeout_ms, 166);
    let refused = || CallAnswer {
        status: 503,
        body: Vec::new(),
        ..Default::default()
    };
    a.now_ms += 499;
    let Decision::Call(again) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!("retried within the budget")
    };
    assert_eq!(again.timeout_ms, 1);
    a.now_ms += 1;
    assert_eq!(s.on_store_answer(&p, &mut a, refused()), Decision::Continue);
    assert_eq!(a.count_of(Counter::StoreErrors), 1);
}

#[test]
fn etcd_a_completion_whose_lease_etcd_lost_is_written_again_with_a_fresh_lease() {
    let p = etcd_plugin("");
    let lost = || CallAnswer {
        status: 0,
        body: crate::stores::etcd::pb::status_body(5, b"etcdserver: requested lease not found"),
        ..Default::default()
    };
    // Lost once, twice: a fresh lease each time, and the completion lands. Three
    // times: a store error, and the key stays in flight (never runs twice).
    for (losses, lands) in [(1, true), (2, true), (3, false)] {
        let (mut a, mut b) = two_proxies();
        let (r, mut s) = sent(&p, &mut a, req("POST", "/o").key("k"));
        let pairs = || vec![(":status".to_string(), b"201".to_vec())];
        let mut c = s
            .on_response_headers(&p, &mut a, 201, &Origin::upstream(), pairs, true)
            .expect("a completion call");
        let grants = a.etcd.grants();
        let mut answered = 0;
        loop {
            let answer = if crate::stores::etcd::wire::is_txn(c.path) && answered < losses {
                answered += 1;
                lost()
            } else {
                call(&a, &c)
            };
            match s.on_store_answer(&p, &mut a, answer) {
                Decision::Call(next) => c = next,
                _ => break,
            }
        }
        let regrants = a.etcd.grants() - grants;
        assert_eq!(regrants, losses.min(2), "{losses}");
        assert_eq!(
            a.count_of(Counter::StoreErrors),
            u64::from(!lands),
            "{losses}"
        );
        let dup = run(&p, &mut b, &r, ok("no"));
        if lands {
            assert!(matches!(dup, Outcome::Local(_)), "{losses}: {dup:?}");
            assert_eq!(dup.status(), 201, "{losses}: replayed");
        } else {
            assert_eq!(dup.status(), 409, "{losses}: still in flight");
        }
    }
}

#[test]
fn etcd_a_hold_whose_answer_was_lost_is_recognised() {
    let (p, (mut a, mut b)) = (etcd_plugin(""), two_proxies());
    let (r, s) = sent(&p, &mut a, req("POST", "/o").key("k"));
    a.etcd.lose_next_answers(1);
    assert_eq!(respond(&p, &mut a, s, upstream_reset()), Outcome::Reset);
    assert_eq!(
        a.count_of(Counter::ClaimsLost) + a.count_of(Counter::StoreErrors),
        0
    );
    // Kept on every proxy as an unknown outcome.
    let dup = run(&p, &mut b, &r, ok("no"));
    assert_eq!(dup.status(), 409);
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
}

#[test]
fn etcd_settling_answers_say_what_happened_to_the_record() {
    use crate::record::RecordState;
    use crate::stores::etcd::wire::EtcdRecord;
    use base64::Engine as _;
    let p = etcd_json_plugin("");
    let b64 = base64::engine::general_purpose::STANDARD;
    // A record of another claim in place of ours.
    let theirs = |digest: &[u8; 32], state| {
        let rec = EtcdRecord {
            state,
            token: 424242,
            expires_ms: 1,
            payload: [0; 32],
            response: None,
        };
        let v = b64.encode(rec.encode(digest));
        format!(
            r#"{{"header": {{"revision": "9"}}, "responses": [{{"response_range": {{"kvs": [{{"mod_revision": "8", "value": "{v}"}}]}}}}]}}"#
        )
    };
    let digest = |r: &Req| {
        crate::key::record_digest(
            &p.config.policy,
            &r.head,
            &ClientKey {
                source: KeySource::Header,
                value: b"k".to_vec(),
            },
        )
    };
    for (what, answer, lost, errors) in [
        (
            "release: gone already",
            r#"{"header": {"revision": "9"}}"#.to_string(),
            0,
            0,
        ),
        (
            "release: another claim's",
            theirs(&digest(&req("POST", "/o").key("k")), RecordState::InFlight),
            1,
            0,
        ),
        ("release: unreadable", "nonsense".to_string(), 0, 1),
    ] {
        let (mut a, _) = two_proxies();
        let (_r, mut s) = sent(&p, &mut a, req("POST", "/o").key("k"));
        let pairs = || vec![(":status".to_string(), b"503".to_vec())];
        let c = s.on_response_headers(&p, &mut a, 503, &Origin::upstream(), pairs, true);
        assert!(c.is_some(), "{what}: a release call");
        assert_eq!(
            s.on_store_answer(&p, &mut a, txn_answer(&answer)),
            Decision::Continue
        );
        assert_eq!(
            (
                a.count_of(Counter::ClaimsLost),
                a.count_of(Counter::StoreErrors)
            ),
            (lost, errors),
            "{what}"
        );
    }
    // A completion whose record is gone, or belongs to another claim, was lost.
    for (what, answer) in [
        ("gone", r#"{"header": {"revision": "9"}}"#.to_string()),
        (
            "another claim's",
            theirs(&digest(&req("POST", "/o").key("k")), RecordState::Completed),
        ),
        ("ours, still in flight", String::new()),
    ] {
        let (mut a, _) = two_proxies();
        let (r, mut s) = sent(&p, &mut a, req("POST", "/o").key("k"));
        let pairs = || vec![(":status".to_string(), b"200".to_vec())];
        let c = s.on_response_headers(&p, &mut a, 200, &Origin::upstream(), pairs, true);
        assert!(c.is_some(), "{what}: a completion call");
        let answer = if answer.is_empty() {
            // Our own claim, not completed: the completion did not land.
            let rec = EtcdRecord {
                state: RecordState::InFlight,
                token: 1 << 48 | 1,
                expires_ms: a.now_ms + 30_000,
                payload: [0; 32],
                response: None,
            };
            let v = b64.encode(rec.encode(&digest(&r)));
            format!(
                r#"{{"header": {{"revision": "9"}}, "responses": [{{"response_range": {{"kvs": [{{"mod_revision": "8", "value": "{v}"}}]}}}}]}}"#
            )
        } else {
            answer
        };
        assert_eq!(
            s.on_store_answer(&p, &mut a, txn_answer(&answer)),
            Decision::Continue
        );
        assert_eq!(a.count_of(Counter::ClaimsLost), 1, "{what}");
        // Not learned by the worker's tier: with etcd down the request needs etcd.
        a.etcd.set_down(true);
        assert_eq!(
            run(&p, &mut a, &r, ok("never")).problem_type(),
            "urn:proxy-dedup:problem:store-unavailable",
            "{what}"
        );
    }
}

#[test]
fn a_failed_settling_call_says_which_one_failed() {
    let p = etcd_plugin("");
    for (a, what) in [
        (ok("x"), "completion failed"),
        (answer(503, "x"), "release failed"),
        (upstream_reset(), "hold failed"),
    ] {
        let (mut env, _) = two_proxies();
        let s = send(&p, &mut env, &req("POST", "/o").key("k")).unwrap();
        env.etcd.set_down(true);
        respond(&p, &mut env, s, a);
        let warned = env.warnings.borrow().join("\n");
        assert!(warned.contains(what), "{what}: {warned}");
    }
}

#[test]
fn an_etcd_error_on_the_claim_is_a_store_failure_not_a_lost_lease() {
    let (p, (mut a, _)) = (
        etcd_json_plugin(r#""failure_mode": "closed""#),
        two_proxies(),
    );
    let (mut s, first) = start_keyed(&p, &mut a);
    let (decision, n) = drive(&p, &mut a, &mut s, first, |_| {
        Some(txn_answer(
            r#"{"error": "etcdserver: too many requests", "code": 8}"#,
        ))
    });
    assert_eq!(n, 1, "not retried");
    assert!(
        matches!(decision, Decision::Reply(ref r) if r.status == 503),
        "{decision:?}"
    );
}
