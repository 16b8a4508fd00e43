//! Per-route policies in the compiled filter: three routes with their own policies
//! across two workers, the same key kept apart per rule, and each rule's TTL and
//! in-flight timeout on the virtual clock.

use super::{keyed, problem_type, started, SendWhole, R};
use host_test::{Reply, Request};
use std::time::Duration;

const RULES: &str = r#"{"ttl_seconds": 3600, "rules": [
  {"name": "payments", "match": {"path_prefix": "/payments"},
   "key": {"required": true}, "ttl_seconds": 60, "in_flight_timeout_seconds": 5,
   "on_unknown_outcome": "hold"},
  {"name": "webhooks", "match": {"path_prefix": "/webhooks", "methods": ["POST"]},
   "key": {"json_pointer": "/message/messageId", "required": true},
   "payload": {"ignore_json_pointers": ["/deliveryAttempt"]},
   "ttl_seconds": 604800, "store_statuses": ["2xx"]},
  {"name": "search", "match": {"path_prefix": "/search"}, "bypass": true}
]}"#;

fn push(attempt: u32, data: &str) -> Request {
    Request::post("/webhooks/pubsub").body(format!(
        r#"{{"message": {{"messageId": "m-1", "data": "{data}"}}, "deliveryAttempt": {attempt}}}"#
    ))
}

#[test]
fn three_routes_follow_their_own_policies_across_workers() -> R {
    let (mut e, up) = started(RULES, 2)?;
    // payments: a key is required; the key runs once on any worker.
    let no_key = e.request(0, Request::post("/payments/charge").body("{}"))?;
    assert_eq!(no_key.status, 400);
    assert_eq!(
        problem_type(&no_key.body),
        "urn:proxy-dedup:problem:missing-key"
    );
    let paid = e.request(0, keyed("/payments/charge", "k", "{}"))?;
    assert!(paid.upstream_called);
    let again = e.request(1, keyed("/payments/charge", "k", "{}"))?;
    assert_eq!(
        (again.upstream_called, again.body.clone()),
        (false, paid.body.clone())
    );
    // The same key where no rule matches: other records.
    assert!(e.request(1, keyed("/orders", "k", "{}"))?.upstream_called);
    assert!(!e.request(0, keyed("/orders", "k", "{}"))?.upstream_called);
    // webhooks: a redelivery is replayed, a changed message refused.
    assert!(e.request(0, push(1, "a"))?.upstream_called);
    let redelivered = e.request(1, push(2, "a"))?;
    assert_eq!(redelivered.header("idempotent-replayed"), Some("true"));
    assert_eq!(e.request(0, push(3, "b"))?.status, 422);
    // search: never deduplicated.
    for w in [0, 1] {
        assert!(e.request(w, keyed("/search", "k", "{}"))?.upstream_called);
    }
    assert_eq!(up.calls.get(), 5);
    // payments' TTL (60 s) ends long before the top level's (1 h).
    e.advance(Duration::from_secs(60));
    assert!(
        e.request(0, keyed("/payments/charge", "k", "{}"))?
            .upstream_called
    );
    assert!(!e.request(1, keyed("/orders", "k", "{}"))?.upstream_called);
    // payments' in-flight timeout (5 s) against the top level's 30 s.
    let stuck = e.send(0, keyed("/payments/charge", "f", "{}"))?;
    let stuck_too = e.send(1, keyed("/orders", "f", "{}"))?;
    e.advance(Duration::from_secs(5));
    assert!(
        e.request(1, keyed("/payments/charge", "f", "{}"))?
            .upstream_called
    );
    assert_eq!(e.request(0, keyed("/orders", "f", "{}"))?.status, 409);
    e.respond(stuck, Reply::new(200).body("late"))?;
    e.respond(stuck_too, Reply::new(200).body("done"))?;
    assert_eq!(e.counter("proxy_dedup_bypassed"), Some(2));
    Ok(())
}
