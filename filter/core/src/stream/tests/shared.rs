//! The shared-data store end to end through the plugin: its keys, capacity, layouts
//! across config pushes, records of an older format, dropped bodies.

use crate::key::{record_digest, ClientKey, KeySource};
use crate::metrics::Counter;
use crate::response::StoredResponse;
use crate::stores::shared::{ClaimOutcome, SharedStore};
use crate::testing::*;

#[test]
fn capacity_bounds_keys_and_evicts_oldest_completed_first() {
    let p = plugin(r#"{"capacity": 64}"#);
    let (shared, mut env) = world();
    for i in 0..2000 {
        let r = req("POST", "/o").key(&format!("k{i}"));
        run(&p, &mut env, &r, ok(&format!("r{i}")));
        env.now_ms += 1;
    }
    assert!(
        shared.key_count() as u64 <= p.layout().unwrap().max_keys(),
        "{} keys",
        shared.key_count()
    );
    assert!(p.layout().unwrap().max_keys() <= 64 * 2 + 2);
    assert!(env.count_of(Counter::EvictionsUnexpired) >= 2000 - 64);
    // The newest keys are still replayed.
    let last = req("POST", "/o").key("k1999");
    run(&p, &mut env, &last, ok("no")).assert_replays(b"r1999");
    // Expired records are reused before unexpired ones are evicted.
    let p = plugin(r#"{"capacity": 16, "ttl_seconds": 1}"#);
    let (shared, mut env) = world();
    for i in 0..500 {
        run(&p, &mut env, &keyed(i), ok("x"));
        env.now_ms += 1_000;
    }
    assert_eq!(env.count_of(Counter::EvictionsUnexpired), 0);
    assert!(shared.key_count() as u64 <= p.layout().unwrap().max_keys());
}

#[test]
fn the_store_writes_only_its_documented_keys() {
    let p = plugin(r#"{"capacity": 32, "store": {"namespace": "orders"}}"#);
    let (shared, mut env) = world();
    for i in 0..20 {
        run(&p, &mut env, &keyed(i), ok("x"));
    }
    let mut keys = shared.keys();
    keys.sort();
    assert!(keys.contains(&"orders/layouts".to_string()), "{keys:?}");
    for k in &keys {
        let ok =
            k == "orders/layouts" || k.starts_with("orders/2/b/") || k.starts_with("orders/2/r/");
        assert!(ok, "unexpected key {k}");
    }
    assert!(
        keys.len() as u64 <= p.layout().unwrap().max_keys(),
        "{}",
        keys.len()
    );
    assert_eq!(p.layout().unwrap().namespace(), "orders");
}

#[test]
fn another_layout_yields_only_to_a_live_record_of_the_same_key() {
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 16, "ttl_seconds": 10}"#);
    let new = plugin(r#"{"capacity": 32, "ttl_seconds": 10}"#);
    // The old layout has one bucket: every key of it is in the bucket read.
    assert!(run(&old, &mut env, &req("POST", "/o").key("a"), ok("a")).reached_upstream());
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("b"), ok("b")),
        executed("b")
    );
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("a"), ok("no"))
            .local()
            .body,
        b"a"
    );
    // Expired there: it runs again here.
    env.now_ms += 10_000;
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("a"), ok("a2")),
        executed("a2")
    );
}

#[test]
fn a_layout_in_use_stays_registered_for_its_other_layouts() {
    // The old configuration keeps serving for hours after a push: the new one must keep
    // seeing its records, however long ago the old one first registered.
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 16, "ttl_seconds": 10}"#);
    let new = plugin(r#"{"capacity": 32, "ttl_seconds": 10}"#);
    run(&old, &mut env, &req("POST", "/o").key("first"), ok("1"));
    env.now_ms += 3 * 3_600_000;
    run(&old, &mut env, &req("POST", "/o").key("late"), ok("late"));
    env.now_ms += 5_000;
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("late"), ok("no"))
            .local()
            .body,
        b"late"
    );
}

#[test]
fn a_record_of_the_previous_format_is_never_found_nor_misread() {
    // The previous version's records: digest "record v2", payload digest over a SHA-256
    // of the body. The same request now neither replays that record nor calls its
    // payload different (422): it is a new request.
    use sha2::{Digest as _, Sha256};
    let p = plugin("{}");
    let (shared, mut env) = world();
    let r = req("POST", "/orders").key("k-old").body("{}");
    let feed = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    let mut h = Sha256::new();
    h.update(b"proxy-dedup record v2\0");
    h.update([1]);
    feed(&mut h, b"api.example");
    h.update(0u32.to_be_bytes());
    h.update([1]);
    feed(&mut h, b"k-old");
    let old: [u8; 32] = h.finalize().into();
    let key = ClientKey {
        source: KeySource::Header,
        value: b"k-old".to_vec(),
    };
    assert_ne!(record_digest(&p.config.policy, &r.head, &key), old);
    let store = SharedStore::new(&*shared, p.layout().unwrap());
    let now = env.now_ms;
    let ClaimOutcome::Claimed { claim, .. } = store.claim(&old, &[9; 32], 0, now, 1).unwrap()
    else {
        panic!()
    };
    let stale = StoredResponse {
        status: 200,
        headers: vec![],
        body: b"from the old version".to_vec(),
    };
    assert!(store.complete(&claim, Some(&stale), now).unwrap().owned);
    assert_eq!(run(&p, &mut env, &r, ok("new")), executed("new"));
    assert_eq!(
        counts(&env, [Counter::Executed, Counter::PayloadMismatch]),
        [1, 0]
    );
}

#[test]
fn a_config_push_that_changes_capacity_keeps_records_answering() {
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 1600}"#);
    let new = plugin(r#"{"capacity": 3200, "ttl_seconds": 600}"#);
    let done = req("POST", "/o").key("done");
    let flying = req("POST", "/o").key("flying");
    assert!(run(&old, &mut env, &done, ok("old")).reached_upstream());
    let first = send(&old, &mut env, &flying).unwrap();
    // After the push: the completed key replays, the in-flight one is still in flight.
    run(&new, &mut env, &done, ok("no")).assert_replays(b"old");
    assert_eq!(run(&new, &mut env, &flying, ok("no")).status(), 409);
    let _ = respond(&old, &mut env, first, ok("flown"));
    run(&new, &mut env, &flying, ok("no")).assert_replays(b"flown");
    // And the other way: the old configuration (still draining) sees the new one's.
    let fresh = req("POST", "/o").key("fresh");
    assert!(run(&new, &mut env, &fresh, ok("new")).reached_upstream());
    run(&old, &mut env, &fresh, ok("no")).assert_replays(b"new");
    assert_eq!(env.count_of(Counter::Executed), 3);
}

#[test]
fn a_late_completion_under_an_old_layout_never_answers_for_the_key_run_again() {
    // Found by the model: a claim under the old configuration expires, the key runs
    // again under the pushed one (another layout) with another body, then the first
    // response comes. Kept, it answered the second request's retries with 422.
    let (_, mut env) = world();
    let old =
        plugin(r#"{"capacity": 16, "in_flight_timeout_seconds": 5, "on_unknown_outcome": "hold"}"#);
    let new =
        plugin(r#"{"capacity": 32, "in_flight_timeout_seconds": 5, "on_unknown_outcome": "hold"}"#);
    let first = req("POST", "/o").key("k").body("one");
    let stuck = send(&old, &mut env, &first).unwrap();
    env.now_ms += 5_000;
    let second = req("POST", "/o").key("k").body("two");
    let again = send(&new, &mut env, &second).unwrap();
    respond(&old, &mut env, stuck, ok("late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    let dup = run(&old, &mut env, &second, ok("no"));
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    respond(&new, &mut env, again, ok("two done"));
    run(&old, &mut env, &second, ok("no")).assert_replays(b"two done");
    run(&new, &mut env, &second, ok("no")).assert_replays(b"two done");
    assert_eq!(env.count_of(Counter::Executed), 2);
}

#[test]
fn dropped_bodies_are_counted_and_their_keys_answer_409_response_not_stored() {
    // One bucket of 1 MiB, responses of 300 KB: three fit.
    let p = plugin(
        r#"{"capacity": 16, "max_replay_body_bytes": 600000, "store": {"max_store_bytes": 1048576}}"#,
    );
    let (_shared, mut env) = world();
    let body = "r".repeat(300_000);
    for i in 0..5 {
        let r = req("POST", "/orders").key(&format!("k{i}")).body("{}");
        assert_eq!(run(&p, &mut env, &r, ok(&body)).status(), 200);
    }
    assert_eq!(
        counts(
            &env,
            [
                Counter::Executed,
                Counter::BodiesDropped,
                Counter::ResponseNotStored
            ]
        ),
        [5, 2, 0]
    );
    for i in 0..2 {
        let r = req("POST", "/orders").key(&format!("k{i}")).body("{}");
        let o = run(&p, &mut env, &r, ok("must not run"));
        assert_eq!(
            o.problem_type(),
            "urn:proxy-dedup:problem:response-not-stored"
        );
        assert_eq!(o.status(), 409);
    }
    let r = req("POST", "/orders").key("k4").body("{}");
    let o = run(&p, &mut env, &r, ok("must not run"));
    assert_eq!(o.local().status, 200);
    assert_eq!(o.local().body, body.as_bytes());
    assert_eq!(env.count_of(Counter::Executed), 5, "nothing ran twice");
    assert_eq!(env.count_of(Counter::ResponseNotStored), 2);
}

#[test]
fn a_bucket_full_of_live_claims_answers_503_store_full_unless_told_to_fail_open() {
    // One bucket (capacity 16): sixteen claims in flight fill it (one scope may hold
    // them all here).
    for (extra, expect) in [("", 503u16), (r#", "on_store_full": "open""#, 200)] {
        let p = plugin(&format!(
            r#"{{"capacity": 16, "store": {{"scope_claims_per_bucket": 16}}{extra}}}"#
        ));
        let (_, mut env) = world();
        let _held: Vec<_> = (0..16)
            .map(|i| send(&p, &mut env, &req("POST", "/o").key(&format!("k{i}"))).unwrap())
            .collect();
        let r = req("POST", "/o").key("one-more");
        let got = run(&p, &mut env, &r, ok("through"));
        assert_eq!(got.status(), expect, "{extra}");
        if expect == 503 {
            assert_eq!(got.problem_type(), "urn:proxy-dedup:problem:store-full");
            assert_eq!(got.local().header("retry-after"), Some(&b"1"[..]));
            assert_eq!(env.count_of(Counter::StoreFull), 1);
            assert_eq!(env.count_of(Counter::FailedOpen), 0);
        } else {
            assert_eq!(env.count_of(Counter::FailedOpen), 1);
            assert_eq!(env.count_of(Counter::StoreFull), 0);
        }
    }
}

const TENANTS: &str = r#""scope": {"headers": ["x-tenant"]}, "capacity": 16"#;

fn of(tenant: &str, key: &str) -> Req {
    req("POST", "/o")
        .key(key)
        .header("x-tenant", tenant)
        .body("{}")
}

#[test]
fn another_tenants_flood_never_evicts_a_victims_completed_record() {
    let p = plugin(&format!("{{{TENANTS}}}"));
    let (_, mut env) = world();
    let victim = of("victim", "pay-1");
    run(&p, &mut env, &victim, ok("paid once"));
    // The flooder fills the one bucket with its own completed records, then keeps
    // going: its claims evict its own records, never the victim's.
    for i in 0..40 {
        env.now_ms += 1;
        let got = run(&p, &mut env, &of("flood", &format!("f{i}")), ok("f"));
        assert!(got.reached_upstream(), "flood {i}: {got:?}");
    }
    assert!(
        env.count_of(Counter::EvictionsUnexpired) > 0,
        "the flooder evicted its own"
    );
    run(&p, &mut env, &victim, ok("twice")).assert_replays(b"paid once");
    // Told so, a full bucket evicts the oldest record whatever its scope (as before).
    let p = plugin(&format!(
        r#"{{{TENANTS}, "store": {{"eviction": "oldest"}}}}"#
    ));
    let (_, mut env) = world();
    run(&p, &mut env, &victim, ok("paid once"));
    for i in 0..16 {
        env.now_ms += 1;
        run(&p, &mut env, &of("flood", &format!("f{i}")), ok("f"));
    }
    assert_eq!(run(&p, &mut env, &victim, ok("again")), executed("again"));
}

#[test]
fn a_bucket_full_of_another_tenants_records_answers_store_full_not_an_eviction() {
    let p = plugin(&format!("{{{TENANTS}}}"));
    let (_, mut env) = world();
    for i in 0..16 {
        env.now_ms += 1;
        run(&p, &mut env, &of("flood", &format!("f{i}")), ok("f"));
    }
    let got = run(&p, &mut env, &of("victim", "new"), ok("no"));
    assert_eq!(got.status(), 503);
    assert_eq!(got.problem_type(), "urn:proxy-dedup:problem:store-full");
    assert_eq!(env.count_of(Counter::StoreFull), 1);
    // The flooder's own records still answer.
    run(&p, &mut env, &of("flood", "f3"), ok("no")).assert_replays(b"f");
}

#[test]
fn one_tenants_hung_up_claims_hold_at_most_half_a_bucket() {
    let p = plugin(&format!("{{{TENANTS}}}"));
    let (_, mut env) = world();
    // Eight claims whose clients hang up: kept as unknown outcomes (live claims).
    for i in 0..8 {
        let (_, s) = sent(&p, &mut env, of("noisy", &format!("h{i}")));
        respond(&p, &mut env, s, upstream_reset());
    }
    // The ninth claim of that tenant in the bucket is refused; nothing runs unrecorded.
    let ninth = run(&p, &mut env, &of("noisy", "h8"), ok("no"));
    assert_eq!(ninth.problem_type(), "urn:proxy-dedup:problem:store-full");
    // Another tenant still claims and runs, and its retry is a replay.
    let victim = of("victim", "pay");
    assert_eq!(run(&p, &mut env, &victim, ok("paid")), executed("paid"));
    run(&p, &mut env, &victim, ok("twice")).assert_replays(b"paid");
}

#[test]
fn a_kept_unknown_outcome_under_a_rule_stays_visible_to_a_pushed_layout() {
    // The top level holds, a rule keeps: the layout registers for as long as the rule's
    // kept claims may live (claim + TTL, then the TTL of a late completion), so after a
    // capacity push the new configuration still sees the kept record.
    let cfg = |capacity: u32| {
        format!(
            r#"{{"capacity": {capacity}, "ttl_seconds": 7200, "in_flight_timeout_seconds": 5,
                "on_unknown_outcome": "hold",
                "rules": [{{"name": "pay", "match": {{"path_prefix": "/pay"}}, "on_unknown_outcome": "keep"}}]}}"#
        )
    };
    let (old, new) = (plugin(&cfg(16)), plugin(&cfg(32)));
    let (_, mut env) = world();
    let r = req("POST", "/pay").key("k").body("{}");
    run(&old, &mut env, &r, upstream_reset());
    // Long past the registry's slack (an hour) and the in-flight timeout.
    env.now_ms += 2 * 3_600_000 - 1_000;
    let dup = run(&new, &mut env, &r, ok("twice"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:outcome-unknown"
    );
}
