//! Wait mode (`on_in_flight: "wait"`) in host-test: duplicates held on every worker until
//! the first answers (woken by the shared queue), one waiter executing after a release,
//! the wait timeout and the client that leaves, on the virtual clock.

use super::{keyed, problem_type, started, SendWhole, R};
use host_test::{Reply, Request, SimEnvoy, StreamId, StreamState};
use std::time::Duration;

const WAIT: &str = r#"{"on_in_flight": "wait", "wait_timeout_ms": 3000}"#;

/// Two workers with `config`: `req` in flight on worker `first_on`, then a
/// duplicate of it sent on each of `dups_on`.
fn first_and_dups(
    config: &str,
    req: Request,
    first_on: usize,
    dups_on: impl IntoIterator<Item = usize>,
) -> Result<(SimEnvoy, StreamId, Vec<StreamId>), host_test::Error> {
    let (mut e, _) = started(config, 2)?;
    let first = e.send(first_on, req.clone())?;
    let dups = e.send_each(dups_on, &req)?;
    Ok((e, first, dups))
}

/// `first_and_dups` with the first on worker 0 and one duplicate on worker 1.
fn first_and_dup(
    config: &str,
    req: Request,
) -> Result<(SimEnvoy, StreamId, StreamId), host_test::Error> {
    let (e, first, dups) = first_and_dups(config, req, 0, [1])?;
    Ok((e, first, dups[0]))
}

#[test]
fn duplicates_on_every_worker_get_the_replay_when_the_first_completes() -> R {
    let req = keyed("/pay", "k1", "amount=5");
    let (mut e, first, dups) = first_and_dups(WAIT, req, 0, (0..6).map(|i| i % 2))?;
    e.advance(Duration::from_millis(1200));
    for d in &dups {
        assert_eq!(e.state(*d)?, StreamState::Open, "held, not answered");
        assert!(
            e.upstream_request(*d).is_none(),
            "nothing reaches the upstream"
        );
    }
    assert_eq!(e.counter("proxy_dedup_waited"), Some(6));
    // The completion on worker 0 wakes worker 1's waiters through its queue: no tick
    // needs to pass.
    e.respond(
        first,
        Reply::new(201).header("x-order", "7").body("charged"),
    )?;
    for d in &dups {
        let r = e
            .response(*d)
            .expect("answered as soon as the first completed");
        assert_eq!((r.status, r.body_str().as_str()), (201, "charged"));
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
        assert_eq!(r.header("x-order"), Some("7"));
        assert!(!r.upstream_called);
    }
    assert_eq!(e.upstream_calls(), 1);
    assert_eq!(e.counter("proxy_dedup_wait_replayed"), Some(6));
    assert_eq!(e.counter("proxy_dedup_rejected_in_flight"), Some(0));
    assert_eq!(e.counter("proxy_dedup_wait_timeout"), Some(0));
    Ok(())
}

#[test]
fn after_a_5xx_exactly_one_waiter_executes_and_the_others_get_its_answer() -> R {
    let req = keyed("/pay", "k", "x");
    let (mut e, first, dups) = first_and_dups(WAIT, req, 1, (0..5).map(|i| i % 2))?;
    e.respond(first, Reply::new(503).body("down"))?;
    assert_eq!(e.response(first).map(|r| r.status), Some(503));
    e.advance(Duration::from_millis(600));
    let running: Vec<_> = dups
        .iter()
        .filter(|d| e.upstream_request(**d).is_some())
        .copied()
        .collect();
    assert_eq!(running.len(), 1, "exactly one waiter claims the key");
    let runner = running[0];
    let body = e
        .upstream_request(runner)
        .map(|r| r.body)
        .unwrap_or_default();
    assert_eq!(body, b"x", "its buffered body went upstream");
    for d in dups.iter().filter(|d| **d != runner) {
        assert_eq!(e.state(*d)?, StreamState::Open, "the others keep waiting");
    }
    e.respond(runner, Reply::new(201).body("charged"))?;
    assert_eq!(e.response(runner).map(|r| r.status), Some(201));
    for d in dups.iter().filter(|d| **d != runner) {
        let r = e.response(*d).expect("answered when the runner completed");
        assert_eq!((r.status, r.body_str().as_str()), (201, "charged"));
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(e.counter("proxy_dedup_executed"), Some(2));
    assert_eq!(e.counter("proxy_dedup_released"), Some(1));
    Ok(())
}

#[test]
fn a_wait_that_times_out_gets_409_with_retry_after() -> R {
    let (mut e, first, dup) = first_and_dup(WAIT, keyed("/pay", "slow", "x"))?;
    e.advance(Duration::from_millis(2900));
    assert_eq!(e.state(dup)?, StreamState::Open);
    e.advance(Duration::from_millis(200));
    let r = e.response(dup).expect("answered at wait_timeout_ms");
    assert_eq!(r.status, 409);
    assert_eq!(problem_type(&r.body), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(e.counter("proxy_dedup_wait_timeout"), Some(1));
    assert_eq!(e.counter("proxy_dedup_rejected_in_flight"), Some(1));
    // The first still completes and is replayed afterwards.
    e.respond(first, Reply::new(200).body("ok"))?;
    let again = e.request(1, keyed("/pay", "slow", "x"))?;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    Ok(())
}

#[test]
fn a_client_that_leaves_while_waiting_leaves_no_waiter_behind() -> R {
    let cfg = r#"{"on_in_flight": "wait", "wait_timeout_ms": 3000, "max_waiters": 1}"#;
    let (mut e, first, gone) = first_and_dup(cfg, keyed("/pay", "k", "x"))?;
    e.advance(Duration::from_millis(300));
    e.reset_client(gone)?;
    // Its place among worker 1's max_waiters (1) is free again.
    let next = e.send(1, keyed("/pay", "k", "x"))?;
    assert_eq!(e.state(next)?, StreamState::Open, "waits, not 409");
    e.respond(first, Reply::new(503))?;
    e.advance(Duration::from_millis(300));
    assert!(
        e.upstream_request(next).is_some(),
        "the key was not claimed by the one that left"
    );
    e.respond(next, Reply::new(200).body("done"))?;
    assert_eq!(e.response(next).map(|r| r.status), Some(200));
    assert_eq!(e.upstream_calls(), 2);
    Ok(())
}

#[test]
fn above_max_waiters_a_duplicate_gets_409_at_once() -> R {
    let cfg = r#"{"on_in_flight": "wait", "max_waiters": 2, "max_waiters_per_scope": 2, "retry_after_seconds": 4}"#;
    let (mut e, first, held) = first_and_dups(cfg, keyed("/pay", "k", "x"), 0, [1, 1])?;
    let over = e.request(1, keyed("/pay", "k", "x"))?;
    assert_eq!(over.status, 409);
    assert_eq!(over.header("retry-after"), Some("4"));
    for h in &held {
        assert_eq!(e.state(*h)?, StreamState::Open);
    }
    e.respond(first, Reply::new(200).body("ok"))?;
    for h in &held {
        assert_eq!(e.response(*h).map(|r| r.status), Some(200));
    }
    assert_eq!(e.counter("proxy_dedup_waited"), Some(2));
    Ok(())
}

#[test]
fn under_hold_a_waiter_answers_after_a_held_claim_only_with_409_at_its_timeout() -> R {
    let hold = r#"{"on_in_flight": "wait", "wait_timeout_ms": 3000, "on_unknown_outcome": "hold"}"#;
    let (mut e, first, dup) = first_and_dup(hold, keyed("/pay", "k", "x"))?;
    e.respond(first, Reply::reset())?;
    e.advance(Duration::from_millis(2000));
    assert_eq!(
        e.state(dup)?,
        StreamState::Open,
        "a held claim keeps it waiting"
    );
    e.advance(Duration::from_millis(1100));
    let r = e.response(dup).expect("409 at its timeout");
    assert_eq!(r.status, 409);
    // retry-after: the seconds left of the hold (30 s in-flight timeout).
    assert_eq!(r.header("retry-after"), Some("27"));
    assert_eq!(e.upstream_calls(), 1);
    Ok(())
}

#[test]
fn by_default_a_waiter_of_an_unknown_outcome_is_answered_at_once() -> R {
    let (mut e, first, dup) = first_and_dup(WAIT, keyed("/pay", "k", "x"))?;
    e.respond(first, Reply::reset())?;
    e.advance(Duration::from_millis(300));
    let r = e
        .response(dup)
        .expect("answered without waiting out its timeout");
    assert_eq!(r.status, 409);
    assert_eq!(
        problem_type(&r.body),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    assert_eq!(e.upstream_calls(), 1);
    Ok(())
}

over_grpc_and_json!(
    etcd_waiters_woken_and_polling: etcd_waiters_on_this_proxy_are_woken_and_on_another_proxy_poll,
    etcd_waiters_woken_and_polling_over_the_json_gateway
);

fn etcd_waiters_woken_and_polling(json: bool) -> R {
    // Two proxies in wait mode on the real etcd.
    let wait = r#", "on_in_flight": "wait", "wait_timeout_ms": 3000"#;
    let (_etcd, up, mut a, mut b) = super::etcd::two_proxies(2, json, wait)?;
    let first = a.send(0, keyed("/orders", "k1", "{}"))?;
    let on_a = a.send(1, keyed("/orders", "k1", "{}"))?;
    let on_b = b.send_each(0..2, &keyed("/orders", "k1", "{}"))?;
    b.advance(Duration::from_millis(600));
    for s in &on_b {
        assert_eq!(
            b.state(*s)?,
            StreamState::Open,
            "B's waiters poll, still in flight"
        );
    }
    a.respond(first, Reply::new(201).body("created"))?;
    // Proxy A's other worker hears of it through its queue, at once.
    let r = a.response(on_a).expect("woken by the queue");
    assert_eq!((r.status, r.body_str().as_str()), (201, "created"));
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    // Proxy B learns it at its next poll.
    b.advance(Duration::from_millis(300));
    for s in &on_b {
        let r = b.response(*s).expect("answered after B's poll");
        assert_eq!((r.status, r.body_str().as_str()), (201, "created"));
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(
        up.calls.get(),
        0,
        "the first was answered by hand; nobody else ran"
    );
    assert_eq!(b.counter("proxy_dedup_wait_replayed"), Some(2));
    assert_eq!(b.counter("proxy_dedup_store_errors"), Some(0));
    Ok(())
}
