//! The ordering guard (`ordering`, shared data) in host-test, two workers on the virtual
//! clock: a version whose client hung up after it reached the upstream (an unknown
//! outcome) holds its entity on every worker as long as its record is held (to the
//! record's TTL by default, to the in-flight timeout under `on_unknown_outcome:
//! "hold"`), then the next version runs; the held version raised nothing, so a version
//! below the next one's is stale only once that one completed. A waiter (wait mode)
//! of a held entity runs as soon as the hold ends.

use super::{keyed, problem_type, started, SendWhole, R};
use host_test::{Reply, Request, Response, SimEnvoy, StreamState};
use std::time::Duration;

/// The guard on header `x-entity`, integer versions in `x-version`, with `more` fields.
fn ordered(more: &str) -> String {
    format!(
        r#"{{{more}, "ordering": {{"entity": {{"header": "x-entity"}}, "version": {{"header": "x-version"}}}}}}"#
    )
}

fn delivery(entity: &str, version: &str, key: &str) -> Request {
    keyed("/hook", key, &format!(r#"{{"version": {version}}}"#))
        .header("x-entity", entity)
        .header("x-version", version)
}

/// Version 1 of `entity` sent on `worker`, forwarded, and its client gone.
fn client_gone_after_forwarding(e: &mut SimEnvoy, worker: usize, entity: &str) -> R {
    let v1 = e.send(worker, delivery(entity, "1", "v1"))?;
    assert!(e.upstream_request(v1).is_some(), "version 1 was forwarded");
    e.reset_client(v1)?;
    assert_eq!(e.counter("proxy_dedup_outcome_unknown"), Some(1));
    Ok(())
}

/// `r` is `409 in-flight` naming the held version, with `retry-after` `secs`.
fn assert_held(r: &Response, secs: u64, when: &str) {
    assert_eq!(r.status, 409, "{when}: {}", r.body_str());
    assert!(
        !r.upstream_called,
        "{when}: forwarded while the entity is held"
    );
    assert_eq!(
        problem_type(&r.body),
        "urn:proxy-dedup:problem:in-flight",
        "{when}"
    );
    assert!(
        r.body_str()
            .contains("version 1 of this entity ended without a known outcome"),
        "{when}: {}",
        r.body_str()
    );
    assert_eq!(
        r.header("retry-after"),
        Some(secs.to_string().as_str()),
        "{when}: the hold's seconds left"
    );
}

fn assert_stale(r: &Response, applied: &str) {
    assert_eq!(r.status, 409, "{}", r.body_str());
    assert!(!r.upstream_called);
    assert_eq!(
        problem_type(&r.body),
        "urn:proxy-dedup:problem:stale-version"
    );
    assert_eq!(r.header("idempotent-applied-version"), Some(applied));
}

#[test]
fn by_default_an_unknown_outcome_holds_its_entity_until_the_record_ttl_then_the_next_version_runs(
) -> R {
    let (mut e, up) = started(
        &ordered(r#""ttl_seconds": 120, "in_flight_timeout_seconds": 10"#),
        2,
    )?;
    client_gone_after_forwarding(&mut e, 0, "o")?;
    // On the other worker: version 2 is refused for the hold's time, past the in-flight
    // timeout (10 s) and to the end of the record's TTL (120 s after the claim).
    assert_held(&e.request(1, delivery("o", "2", "v2"))?, 120, "at once");
    // Version 1 again (its key): the record's own answer.
    let dup = e.request(1, delivery("o", "1", "v1"))?;
    assert_eq!(dup.status, 409);
    assert_eq!(
        problem_type(&dup.body),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
    e.advance(Duration::from_secs(11));
    assert_held(&e.request(1, delivery("o", "2", "v2"))?, 109, "+11 s");
    e.advance(Duration::from_millis(108_500));
    assert_held(&e.request(0, delivery("o", "2", "v2"))?, 1, "+119.5 s");
    assert_eq!(up.calls.get(), 0, "nothing reached the upstream meanwhile");
    e.advance(Duration::from_millis(600));
    // The hold is over: version 2 runs, on either worker.
    let v2 = e.request(1, delivery("o", "2", "v2"))?;
    assert_eq!(v2.status, 200, "{}", v2.body_str());
    assert!(v2.upstream_called);
    // Version 1 (its record expired with the hold, the entity's applied version is 2) is
    // stale now, under any key.
    assert_stale(&e.request(0, delivery("o", "1", "v1"))?, "2");
    assert_stale(&e.request(1, delivery("o", "1", "v1-again"))?, "2");
    assert_eq!(up.calls.get(), 1);
    Ok(())
}

#[test]
fn under_hold_an_unknown_outcome_holds_its_entity_until_the_in_flight_timeout() -> R {
    let (mut e, up) = started(
        &ordered(r#""on_unknown_outcome": "hold", "in_flight_timeout_seconds": 5"#),
        2,
    )?;
    client_gone_after_forwarding(&mut e, 1, "o")?;
    assert_held(&e.request(0, delivery("o", "2", "v2"))?, 5, "at once");
    e.advance(Duration::from_millis(4500));
    assert_held(&e.request(0, delivery("o", "2", "v2"))?, 1, "+4.5 s");
    e.advance(Duration::from_millis(600));
    // Version 1 itself may run again now (it is not below any completed version), but
    // version 2 comes first here and runs.
    let v2 = e.request(0, delivery("o", "2", "v2"))?;
    assert_eq!(v2.status, 200, "{}", v2.body_str());
    assert!(v2.upstream_called);
    assert_stale(&e.request(1, delivery("o", "1", "v1"))?, "2");
    assert_eq!(up.calls.get(), 1);
    Ok(())
}

#[test]
fn under_hold_a_version_released_before_the_next_raises_nothing_after_the_hold() -> R {
    // The held version was never settled as run: once its hold is over, it and any
    // version above the last completed one may run (version 1 here, then 3, not 2).
    let (mut e, up) = started(
        &ordered(r#""on_unknown_outcome": "hold", "in_flight_timeout_seconds": 5"#),
        2,
    )?;
    client_gone_after_forwarding(&mut e, 0, "p")?;
    e.advance(Duration::from_millis(5100));
    let again = e.request(1, delivery("p", "1", "v1"))?;
    assert_eq!(again.status, 200, "{}", again.body_str());
    assert!(again.upstream_called, "version 1 ran again after its hold");
    let v3 = e.request(0, delivery("p", "3", "v3"))?;
    assert_eq!(v3.status, 200);
    assert_stale(&e.request(1, delivery("p", "2", "v2"))?, "3");
    assert_eq!(up.calls.get(), 2);
    Ok(())
}

#[test]
fn in_wait_mode_the_next_version_waits_out_the_hold_and_then_runs() -> R {
    let (mut e, up) = started(
        &ordered(
            r#""on_unknown_outcome": "hold", "in_flight_timeout_seconds": 3,
               "on_in_flight": "wait", "wait_timeout_ms": 3000"#,
        ),
        2,
    )?;
    client_gone_after_forwarding(&mut e, 0, "w")?;
    e.advance(Duration::from_millis(500));
    // On the other worker, 2.5 s of hold left, 3 s of wait: it waits, unanswered.
    let v2 = e.send(1, delivery("w", "2", "v2"))?;
    e.advance(Duration::from_millis(2000));
    assert_eq!(
        e.state(v2)?,
        StreamState::Open,
        "waits while the entity is held"
    );
    assert!(e.upstream_request(v2).is_none());
    e.advance(Duration::from_millis(1000));
    assert!(
        e.upstream_request(v2).is_some(),
        "forwarded once the hold was over (state {:?}, answer {:?})",
        e.state(v2)?,
        e.response(v2).map(|r| (r.status, r.body_str()))
    );
    e.respond(v2, Reply::new(200).body("two"))?;
    assert_eq!(e.response(v2).map(|r| r.status), Some(200));
    assert_stale(&e.request(0, delivery("w", "1", "v1-again"))?, "2");
    assert_eq!(up.calls.get(), 0, "v2 was answered by hand");
    Ok(())
}
