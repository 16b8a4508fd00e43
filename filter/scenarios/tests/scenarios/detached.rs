//! Detached execution in host-test: the first execution is a `proxy_http_call` the
//! filter makes on the root context, answered on the virtual clock after the client's
//! stream has ended (the call outlives the stream, as in Envoy); its answer completes
//! the record, and the retry on another worker gets the replay.

use super::*;

const DETACHED: &str = r#"{"in_flight_timeout_seconds": 10,
    "upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000}}"#;

/// The filter with a detached cluster `api` whose answers take `delay` (virtual time),
/// counting its executions.
fn detached_envoy(delay: Duration) -> Result<(SimEnvoy, Rc<Cell<u32>>), host_test::Error> {
    let calls = Rc::new(Cell::new(0));
    let seen = calls.clone();
    let e = filter_with(DETACHED, 2)
        .cluster("api", move |_req: &host_test::UpstreamRequest| {
            seen.set(seen.get() + 1);
            Reply::new(201)
                .header("content-type", "application/json")
                .body(format!(r#"{{"charge": {}}}"#, seen.get()))
                .after(delay)
        })
        .upstream(|_req: &host_test::UpstreamRequest| {
            Reply::new(500).body("the router must not be used")
        })
        .build()?;
    Ok((e, calls))
}

#[test]
fn a_client_that_leaves_still_gets_its_one_execution_on_retry() -> R {
    let (mut e, calls) = detached_envoy(Duration::from_secs(3))?;
    let req = keyed("/charges", "k", r#"{"amount": 1}"#);
    let first = e.send(0, req.clone())?;
    e.advance(Duration::from_secs(1));
    e.reset_client(first)?;
    // While the call runs, retries are in flight; none runs.
    let dup = e.request(1, req.clone())?;
    assert_eq!(dup.status, 409);
    assert!(!dup.upstream_called);
    e.advance(Duration::from_secs(3));
    assert_eq!(calls.get(), 1);
    let replay = e.request(1, req.clone())?;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body_str(), r#"{"charge": 1}"#);
    assert_eq!(calls.get(), 1, "one execution");
    assert_eq!(e.counter("proxy_dedup_detached_client_gone"), Some(1));
    Ok(())
}

#[test]
fn a_client_that_stays_is_answered_with_the_calls_answer() -> R {
    let (mut e, calls) = detached_envoy(Duration::from_millis(200))?;
    let req = keyed("/charges", "k2", "{}");
    let id = e.send(0, req.clone())?;
    e.advance(Duration::from_secs(1));
    let got = e.response(id).expect("answered");
    assert_eq!(got.status, 201);
    assert_eq!(got.header("idempotent-replayed"), None);
    assert_eq!(got.body_str(), r#"{"charge": 1}"#);
    assert_eq!(calls.get(), 1);
    let replay = e.request(1, req)?;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(e.counter("proxy_dedup_detached"), Some(1));
    Ok(())
}
