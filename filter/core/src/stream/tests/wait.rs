//! Wait mode (`on_in_flight: "wait"`) through the plugin: duplicates held until the
//! first's answer, on other workers and, with etcd, other proxies.

use crate::fake::FakeEnv;
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::reply::LocalReply;
use crate::stream::CallAnswer;
use crate::stream::{Decision, DedupStream, Plugin};
use crate::testing::*;

const WAIT: &str = r#""on_in_flight": "wait", "wait_timeout_ms": 5000"#;

fn wait_plugin(extra: &str) -> Plugin {
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!("{{{WAIT}{sep}{extra}}}"))
}

/// Runs a request up to the filter's decision (store calls answered): the stream and
/// what it decided (`Pause`: it waits).
fn decide(p: &Plugin, env: &mut FakeEnv, r: &Req, id: u32) -> (DedupStream, Decision) {
    let mut s = DedupStream::new(id);
    let mut a = s.on_request_headers(p, env, r.head.clone(), r.body.is_none());
    if let (Some(b), Decision::Pause) = (&r.body, &a) {
        let whole = b.clone();
        a = s.on_request_body(p, env, b.len(), true, || Some(whole));
    }
    let a = settle(p, env, &mut s, a);
    (s, a)
}

/// The glue's wake-up: the stream re-checks, its store calls answered.
fn wake(p: &Plugin, env: &mut FakeEnv, s: &mut DedupStream) -> Decision {
    let a = s.on_wake(p, env);
    settle(p, env, s, a)
}

/// Two workers over one shared-data store: a request with `key` forwarded on `a`, and
/// a duplicate of it decided on `b`.
struct Duplicate {
    a: FakeEnv,
    b: FakeEnv,
    r: Req,
    dup: DedupStream,
    act: Decision,
}

impl Duplicate {
    /// The duplicate stopped waiting: it logged `logged`, counted each of `counters`
    /// once on its worker, and left the waiter registry.
    fn ended_as(&mut self, logged: &str, counters: [Counter; 2]) {
        assert_eq!(decision(&mut self.dup), Some(logged));
        assert_eq!(counts(&self.b, counters), [1, 1]);
        assert!(self.b.waiters.is_empty());
    }
}

/// (The first request's stream is returned beside it, to be answered.)
fn duplicate(p: &Plugin, key: &str) -> (Duplicate, DedupStream) {
    let (mut a, mut b) = two_workers();
    let r = req("POST", "/orders").key(key).body("{}");
    let first = send(p, &mut a, &r).unwrap();
    let (dup, act) = decide(p, &mut b, &r, 2);
    let d = Duplicate { a, b, r, dup, act };
    (d, first)
}

/// Two proxies: `a` forwards `r`, two duplicates of it wait on `b`.
fn two_waiting_on_b(p: &Plugin, r: &Req) -> (FakeEnv, FakeEnv, DedupStream, [DedupStream; 2]) {
    let (mut a, mut b) = two_proxies();
    let first = send(p, &mut a, r).unwrap();
    let waiters = [2, 3].map(|id| decide(p, &mut b, r, id).0);
    (a, b, first, waiters)
}

fn reply(a: Decision) -> LocalReply {
    match a {
        Decision::Reply(r) => r,
        other => panic!("expected a local reply, got {other:?}"),
    }
}

fn decision(s: &mut DedupStream) -> Option<&'static str> {
    s.log_fields().map(|(d, _)| d)
}

#[test]
fn a_rule_in_wait_mode_waits_while_the_top_level_rejects() {
    let p = plugin(
        r#"{"rules": [{"name": "pay", "match": {"path_prefix": "/pay"}, "on_in_flight": "wait"}]}"#,
    );
    let (mut a, mut b) = two_workers();
    let pay = req("POST", "/pay").key("k").body("{}");
    let first = send(&p, &mut a, &pay).unwrap();
    let (mut dup, act) = decide(&p, &mut b, &pay, 2);
    assert_eq!(act, Decision::Pause, "the rule waits");
    let orders = req("POST", "/orders").key("k").body("{}");
    let _other = send(&p, &mut a, &orders).unwrap();
    assert_eq!(
        reply(decide(&p, &mut b, &orders, 3).1).status,
        409,
        "the top level rejects"
    );
    respond(&p, &mut a, first, ok("paid"));
    let got = reply(wake(&p, &mut b, &mut dup));
    assert_eq!((got.status, got.body.as_slice()), (200, &b"paid"[..]));
}

#[test]
fn a_duplicate_on_another_worker_waits_and_gets_the_replay() {
    let p = wait_plugin("");
    let (mut d, first) = duplicate(&p, "k1");
    assert_eq!(d.act, Decision::Pause, "held, nothing forwarded");
    assert!(d.dup.waiting());
    assert_eq!(
        counts(&d.b, [Counter::Waited, Counter::RejectedInFlight]),
        [1, 0]
    );
    assert_eq!(d.b.waiters.len(), 1);
    // Still in flight: a re-check waits on.
    assert_eq!(wake(&p, &mut d.b, &mut d.dup), Decision::Pause);
    respond(&p, &mut d.a, first, ok("made"));
    assert_eq!(d.a.wake_calls.len(), 1, "the completion wakes the waiters");
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!((got.status, got.body.as_slice()), (200, &b"made"[..]));
    assert_eq!(got.header("idempotent-replayed"), Some(&b"true"[..]));
    d.ended_as("waited", [Counter::WaitReplayed, Counter::Replayed]);
    assert_eq!(
        d.a.count_of(Counter::Executed) + d.b.count_of(Counter::Executed),
        1
    );
}

#[test]
fn after_a_release_exactly_one_waiter_executes_and_the_others_get_its_answer() {
    let p = wait_plugin("");
    let r = req("POST", "/pay").key("k").body("x");
    let (mut a, mut b, first) = sent_on_worker_0(&p, &r);
    let mut waiters: Vec<DedupStream> = (10..14)
        .map(|id| {
            let (s, act) = decide(&p, &mut b, &r, id);
            assert_eq!(act, Decision::Pause);
            s
        })
        .collect();
    respond(&p, &mut a, first, answer(503, "down"));
    let acts: Vec<Decision> = waiters.iter_mut().map(|s| wake(&p, &mut b, s)).collect();
    let executing: Vec<usize> = (0..acts.len())
        .filter(|i| acts[*i] == Decision::Continue)
        .collect();
    assert_eq!(executing.len(), 1, "{acts:?}");
    assert!(acts
        .iter()
        .all(|a| matches!(a, Decision::Continue | Decision::Pause)));
    let runner = waiters.remove(executing[0]);
    assert_eq!(b.waiters.len(), 3, "the executing one left the registry");
    respond(&p, &mut b, runner, answer(201, "charged"));
    for mut s in waiters {
        let got = reply(wake(&p, &mut b, &mut s));
        assert_eq!((got.status, got.body.as_slice()), (201, &b"charged"[..]));
    }
    assert_eq!(
        counts(&b, [Counter::Executed, Counter::WaitReplayed]),
        [1, 3]
    );
    assert!(b.waiters.is_empty());
}

#[test]
fn a_waiter_gets_409_when_its_wait_times_out() {
    let p = wait_plugin(r#""retry_after_seconds": 2"#);
    let (mut d, _first) = duplicate(&p, "slow");
    assert_eq!(d.act, Decision::Pause);
    d.b.now_ms += 4_999;
    assert_eq!(wake(&p, &mut d.b, &mut d.dup), Decision::Pause);
    d.b.now_ms += 1;
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!(got.status, 409);
    assert_eq!(got.header("retry-after"), Some(&b"2"[..]));
    // The claim's in-flight end (30 s after it was made), as a duplicate that never
    // waited is told.
    assert_eq!(
        got.header(crate::reply::EXPIRES_HEADER),
        Some(&b"Tue, 14 Nov 2023 22:13:50 GMT"[..])
    );
    d.ended_as(
        "in_flight",
        [Counter::WaitTimeout, Counter::RejectedInFlight],
    );
}

#[test]
fn above_max_waiters_a_duplicate_gets_409_at_once() {
    let p = wait_plugin(r#""max_waiters": 2, "max_waiters_per_scope": 2"#);
    let r = req("POST", "/orders").key("k").body("{}");
    let (mut a, mut b, _first) = sent_on_worker_0(&p, &r);
    for id in [2, 3] {
        assert_eq!(decide(&p, &mut b, &r, id).1, Decision::Pause);
    }
    let (_, act) = decide(&p, &mut b, &r, 4);
    assert_eq!(reply(act).status, 409);
    assert_eq!(
        counts(
            &b,
            [
                Counter::Waited,
                Counter::RejectedInFlight,
                Counter::WaitTimeout
            ]
        ),
        [2, 1, 0]
    );
    // Another worker has its own places.
    assert_eq!(decide(&p, &mut a, &r, 5).1, Decision::Pause);
}

#[test]
fn a_client_that_leaves_while_waiting_leaves_nothing_behind() {
    let p = wait_plugin("");
    let (mut d, first) = duplicate(&p, "k");
    assert_eq!(
        d.dup.on_stream_end(
            &p,
            &mut d.b,
            &origin("downstream_remote_disconnect", flags::DC)
        ),
        None
    );
    assert!(d.b.waiters.is_empty());
    assert!(!d.dup.waiting());
    assert_eq!(
        wake(&p, &mut d.b, &mut d.dup),
        Decision::Pause,
        "a late wake-up does nothing"
    );
    respond(&p, &mut d.a, first, answer(503, "down"));
    // Nothing was claimed for the client that left: the key is free.
    assert!(send(&p, &mut d.b, &d.r).is_ok());
}

#[test]
fn a_waiter_of_a_response_not_stored_gets_what_a_duplicate_gets() {
    let p = wait_plugin(r#""max_replay_body_bytes": 4"#);
    let (mut d, first) = duplicate(&p, "k");
    respond(&p, &mut d.a, first, ok("far too long"));
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!(got.status, 409);
    assert_eq!(got.details, "proxy_dedup_response_not_stored");
}

#[test]
fn under_hold_a_held_claim_keeps_waiters_until_their_timeout() {
    let p = wait_plugin(r#""on_unknown_outcome": "hold""#);
    let (mut d, first) = duplicate(&p, "k");
    respond(&p, &mut d.a, first, upstream_reset());
    assert_eq!(wake(&p, &mut d.b, &mut d.dup), Decision::Pause);
    d.b.now_ms += 5_000;
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!(got.status, 409);
    // retry-after: what is left of the hold (30 s from the claim, 5 s gone).
    assert_eq!(got.header("retry-after"), Some(&b"25"[..]));
}

#[test]
fn by_default_waiters_of_an_unknown_outcome_are_answered_at_once() {
    let p = wait_plugin("");
    let (mut d, first) = duplicate(&p, "k");
    respond(&p, &mut d.a, first, upstream_reset());
    // Waiting would change nothing: the record is kept until its TTL.
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!(got.status, 409);
    assert_eq!(got.details, "proxy_dedup_outcome_unknown");
    assert_eq!(got.header("retry-after"), None);
    assert_eq!(d.b.count_of(Counter::RejectedOutcomeUnknown), 1);
}

#[test]
fn reject_mode_never_waits_nor_wakes() {
    let p = plugin("{}");
    let r = req("POST", "/orders").key("k").body("{}");
    let (mut a, mut b, first) = sent_on_worker_0(&p, &r);
    assert_eq!(reply(decide(&p, &mut b, &r, 2).1).status, 409);
    assert!(b.waiters.is_empty());
    respond(&p, &mut a, first, ok("x"));
    assert!(a.wake_calls.is_empty());
}

#[test]
fn etcd_a_waiter_on_another_proxy_polls_and_gets_the_replay() {
    let (p, (mut a, mut b)) = (etcd_plugin(WAIT), two_proxies());
    let (r, first) = sent(&p, &mut a, req("POST", "/orders").key("k1").body("{}"));
    let (mut dup, act) = decide(&p, &mut b, &r, 2);
    assert_eq!(act, Decision::Pause);
    // The poll is a read of the record, not a claim.
    match dup.on_wake(&p, &mut b) {
        Decision::Call(c) => {
            assert_eq!(c.path, crate::stores::etcd::pb::RANGE);
            let got = call(&b, &c);
            assert_eq!(dup.on_store_answer(&p, &mut b, got), Decision::Pause);
        }
        other => panic!("{other:?}"),
    }
    respond(&p, &mut a, first, ok("made"));
    let got = reply(wake(&p, &mut b, &mut dup));
    assert_eq!((got.status, got.body.as_slice()), (200, &b"made"[..]));
    assert_eq!(got.header("idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(b.count_of(Counter::WaitReplayed), 1);
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
}

#[test]
fn etcd_after_a_release_one_waiter_claims_and_a_failed_poll_waits_on() {
    let p = etcd_plugin(WAIT);
    let (mut a, mut b, first, [mut w1, mut w2]) =
        two_waiting_on_b(&p, &req("POST", "/pay").key("k").body("x"));
    b.etcd.fail_next(1);
    let c = match w1.on_wake(&p, &mut b) {
        Decision::Call(c) => c,
        other => panic!("{other:?}"),
    };
    let failed = call(&b, &c);
    assert_eq!(w1.on_store_answer(&p, &mut b, failed), Decision::Pause);
    respond(&p, &mut a, first, answer(500, "boom"));
    assert_eq!(
        wake(&p, &mut b, &mut w1),
        Decision::Continue,
        "w1 claims and executes"
    );
    assert_eq!(
        wake(&p, &mut b, &mut w2),
        Decision::Pause,
        "w2 waits for w1"
    );
    respond(&p, &mut b, w1, answer(201, "charged"));
    let got = reply(wake(&p, &mut b, &mut w2));
    assert_eq!((got.status, got.body.as_slice()), (201, &b"charged"[..]));
    assert_eq!(b.count_of(Counter::Executed), 1);
}

#[test]
fn etcd_a_completed_poll_answers_this_workers_other_waiters_from_the_tier() {
    let p = etcd_plugin(WAIT);
    let (mut a, mut b, first, [mut w1, mut w2]) =
        two_waiting_on_b(&p, &req("POST", "/orders").key("k").body("{}"));
    respond(&p, &mut a, first, ok("made"));
    assert!(matches!(reply(wake(&p, &mut b, &mut w1)).status, 200));
    // w1's poll learnt the record and woke w2, which needs no round trip now.
    b.etcd.set_down(true);
    assert_eq!(b.waiters.take_due(b.now_ms, 250), vec![3]);
    assert_eq!(reply(wake(&p, &mut b, &mut w2)).body, b"made");
}

#[test]
fn any_answer_to_a_poll_keeps_the_waiter_safe() {
    // Both protocols: gRPC (the default) and the JSON gateway.
    for (p, protocol) in [
        (etcd_plugin(WAIT), crate::stores::etcd::wire::Protocol::Grpc),
        (
            etcd_json_plugin(WAIT),
            crate::stores::etcd::wire::Protocol::Json,
        ),
    ] {
        let (mut a, mut b) = two_proxies();
        let (r, _first) = sent(&p, &mut a, req("POST", "/orders").key("k").body("{}"));
        let (mut dup, _) = decide(&p, &mut b, &r, 2);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let bodies: Vec<(u16, Vec<u8>)> = vec![
            (200, Vec::new()),
            (200, b"{}".to_vec()),
            (
                200,
                br#"{"header": {}, "kvs": [{"mod_revision": "x"}]}"#.to_vec(),
            ),
            (
                200,
                br#"{"header": {}, "kvs": [{"mod_revision": "3", "value": "!!"}]}"#.to_vec(),
            ),
            (
                200,
                br#"{"error": "etcdserver: no leader", "code": 14}"#.to_vec(),
            ),
            // A RangeResponse with a kv but no header: not an answer etcd gives.
            (200, vec![0x12, 0x04, 0x18, 0x03, 0x2a, 0x00]),
            (0, crate::stores::etcd::pb::status_body(14, b"no leader")),
        ];
        for i in 0..200 {
            let (status, body) = match bodies.get(i) {
                Some(b) => b.clone(),
                None => (
                    200,
                    (0..(i % 50))
                        .map(|_| {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            seed as u8
                        })
                        .collect(),
                ),
            };
            let Decision::Call(c) = dup.on_wake(&p, &mut b) else {
                panic!("a waiter polls");
            };
            assert_eq!(c.path, protocol.range_path());
            let got = dup.on_store_answer(
                &p,
                &mut b,
                CallAnswer {
                    status,
                    body,
                    ..Default::default()
                },
            );
            assert_eq!(got, Decision::Pause, "still in flight: it waits on");
        }
        assert!(b.count_of(Counter::StoreErrors) >= 5);
        assert_eq!(b.count_of(Counter::Executed), 0);
    }
}

#[test]
fn a_wake_up_of_a_stream_that_does_not_wait_changes_nothing() {
    let p = wait_plugin("");
    let (_, mut a) = world();
    let (r, mut first) = sent(&p, &mut a, req("POST", "/orders").key("k").body("{}"));
    assert_eq!(first.on_wake(&p, &mut a), Decision::Pause);
    assert!(first.holds_claim(), "the executing stream keeps its claim");
    let out = respond(&p, &mut a, first, ok("made"));
    assert_eq!(out, executed("made"));
    run(&p, &mut a, &r, ok("no")).assert_replays(b"made");
}

#[test]
fn waiters_of_a_detached_execution_get_its_answer_when_the_call_completes_the_record() {
    let p = wait_plugin(r#""upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000}"#);
    let (mut d, mut first) = duplicate(&p, "k");
    assert!(first.detached());
    assert_eq!(d.act, Decision::Pause, "the duplicate waits");
    // The first's client leaves; the call goes on and completes the record.
    assert_eq!(
        first.on_stream_end(&p, &mut d.a, &crate::stream::Origin::default()),
        None
    );
    let _ = detached_answer(&p, &mut d.a, &mut first, call_answer(201, "charged"));
    let got = reply(wake(&p, &mut d.b, &mut d.dup));
    assert_eq!((got.status, got.body.as_slice()), (201, &b"charged"[..]));
    assert_eq!(got.header("idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(d.b.count_of(Counter::WaitReplayed), 1);
}

#[test]
fn one_scope_cannot_take_the_whole_waiter_pool() {
    let p = plugin(&format!(
        r#"{{{WAIT}, "scope": {{"headers": ["x-tenant"]}}, "max_waiters": 4, "max_waiters_per_scope": 2}}"#
    ));
    let (mut a, mut b) = two_workers();
    let of = |t: &str, k: &str| req("POST", "/o").key(k).header("x-tenant", t).body("{}");
    // Each tenant's first requests are in flight on worker a.
    let _firsts: Vec<_> = [("noisy", "n"), ("victim", "v")]
        .iter()
        .map(|(t, k)| send(&p, &mut a, &of(t, k)).unwrap())
        .collect();
    let (_w1, d1) = decide(&p, &mut b, &of("noisy", "n"), 11);
    let (_w2, d2) = decide(&p, &mut b, &of("noisy", "n"), 12);
    assert_eq!((d1, d2), (Decision::Pause, Decision::Pause));
    // The noisy tenant's third waiter is refused at once...
    let (_w3, d3) = decide(&p, &mut b, &of("noisy", "n"), 13);
    assert_eq!(reply(d3).status, 409);
    // ...while the victim's duplicate still waits.
    let (_w4, d4) = decide(&p, &mut b, &of("victim", "v"), 14);
    assert_eq!(
        d4,
        Decision::Pause,
        "another scope's waiters never crowd it out"
    );
    assert_eq!(b.count_of(Counter::Waited), 3);
}

#[test]
fn a_pool_of_two_leaves_another_scope_room_by_default() {
    // No per-scope setting: half the pool (1 of 2) per scope.
    let p = plugin(&format!(
        r#"{{{WAIT}, "scope": {{"headers": ["x-tenant"]}}, "max_waiters": 2}}"#
    ));
    assert_eq!(p.config.max_waiters_per_scope, 1);
    let (mut a, mut b) = two_workers();
    let of = |t: &str, k: &str| req("POST", "/o").key(k).header("x-tenant", t).body("{}");
    let _firsts: Vec<_> = [("noisy", "n"), ("victim", "v")]
        .iter()
        .map(|(t, k)| send(&p, &mut a, &of(t, k)).unwrap())
        .collect();
    let (_w1, d1) = decide(&p, &mut b, &of("noisy", "n"), 11);
    assert_eq!(d1, Decision::Pause);
    let (_w2, d2) = decide(&p, &mut b, &of("noisy", "n"), 12);
    assert_eq!(reply(d2).status, 409, "the noisy tenant's second waiter");
    let (_w3, d3) = decide(&p, &mut b, &of("victim", "v"), 13);
    assert_eq!(
        d3,
        Decision::Pause,
        "the other tenant's duplicate still waits"
    );
}
