//! The ordering guard through the plugin (shared data): stale versions are never
//! forwarded, one version of an entity runs at a time, a released version raises
//! nothing, an unknown outcome holds the entity, and deduplication still comes first.

use crate::fake::FakeEnv;
use crate::metrics::Counter;
use crate::stream::Decision;
use crate::testing::*;

/// Ordered by header `x-entity`, integer versions in header `x-version`.
const HEADERS: &str =
    r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#;

fn delivery(entity: &str, version: &str, key: &str) -> Req {
    req("POST", "/hook")
        .key(key)
        .header("x-entity", entity)
        .header("x-version", version)
}

#[test]
fn a_version_at_or_below_the_applied_one_is_stale_and_never_forwarded() {
    let (p, mut env) = one_worker(HEADERS);
    assert_eq!(
        run(&p, &mut env, &delivery("o1", "5", "e5"), ok("v5")),
        executed("v5")
    );
    // Version 4 after 5: stale, with the applied version named.
    let stale = run(&p, &mut env, &delivery("o1", "4", "e4"), ok("never"));
    assert_eq!(stale.status(), 409);
    assert_eq!(
        stale.problem_type(),
        "urn:proxy-dedup:problem:stale-version"
    );
    assert!(
        detail(stale.local()).contains("applied version 5"),
        "{stale:?}"
    );
    let applied = stale
        .local()
        .headers
        .iter()
        .find(|(n, _)| n == "idempotent-applied-version");
    assert_eq!(applied.map(|(_, v)| v.as_slice()), Some(&b"5"[..]));
    // The same version with another key: stale too (at or below).
    assert_eq!(
        run(&p, &mut env, &delivery("o1", "5", "other"), ok("never")).status(),
        409
    );
    // The same delivery again: a duplicate, replayed (dedup first).
    run(&p, &mut env, &delivery("o1", "5", "e5"), ok("never")).assert_replays(b"v5");
    // A newer one runs; another entity is independent.
    assert_eq!(
        run(&p, &mut env, &delivery("o1", "6", "e6"), ok("v6")),
        executed("v6")
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o2", "1", "f1"), ok("w1")),
        executed("w1")
    );
    assert_eq!(counts(&env, [Counter::Stale, Counter::Executed]), [2, 3]);
    // The stale request's key was released, not kept: it is stale again, not replayed.
    assert_eq!(
        run(&p, &mut env, &delivery("o1", "4", "e4"), ok("never")).status(),
        409
    );
    assert_eq!(
        counts(&env, [Counter::Released]),
        [0],
        "a stale claim is not a release"
    );
}

#[test]
fn one_version_of_an_entity_is_in_flight_at_a_time() {
    let (p, mut env) = one_worker(HEADERS);
    let (_, v1) = sent(&p, &mut env, delivery("o", "1", "a"));
    // Version 2 while 1 runs: 409 in-flight, not forwarded.
    let busy = send(&p, &mut env, &delivery("o", "2", "b")).unwrap_err();
    assert_eq!(busy.status(), 409);
    assert_eq!(busy.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert!(detail(busy.local()).contains("version 1"), "{busy:?}");
    assert!(busy.local().headers.iter().any(|(n, _)| n == "retry-after"));
    assert_eq!(respond(&p, &mut env, v1, ok("one")), executed("one"));
    // Now 2 runs (its key was released when it was refused).
    assert_eq!(
        run(&p, &mut env, &delivery("o", "2", "b"), ok("two")),
        executed("two")
    );
}

#[test]
fn a_released_version_raises_nothing_and_may_be_retried() {
    let (p, mut env) = one_worker(HEADERS);
    assert_eq!(
        run(&p, &mut env, &delivery("o", "3", "c"), ok("three")),
        executed("three")
    );
    // Version 5 fails with a 503: released; 5 may run again, 4 still may (3 is applied).
    assert_eq!(
        run(&p, &mut env, &delivery("o", "5", "e"), answer(503, "busy")).status(),
        503
    );
    assert_eq!(counts(&env, [Counter::Released]), [1]);
    assert_eq!(
        run(&p, &mut env, &delivery("o", "4", "d"), ok("four")),
        executed("four")
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o", "5", "e"), ok("five")),
        executed("five")
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o", "4", "d2"), ok("x")).status(),
        409
    );
}

#[test]
fn an_unknown_outcome_holds_the_entity_as_it_holds_the_record() {
    let (p, mut env) = one_worker(HEADERS);
    let s = send(&p, &mut env, &delivery("o", "1", "a")).unwrap();
    assert_eq!(respond(&p, &mut env, s, upstream_reset()), Outcome::Reset);
    // Kept until its TTL (the default `on_unknown_outcome: "keep"`): version 2 waits.
    env.now_ms += 60_000;
    let busy = send(&p, &mut env, &delivery("o", "2", "b")).unwrap_err();
    assert_eq!(busy.problem_type(), "urn:proxy-dedup:problem:in-flight");
    let retry = busy
        .local()
        .headers
        .iter()
        .find(|(n, _)| n == "retry-after")
        .unwrap();
    let secs: u64 = std::str::from_utf8(&retry.1).unwrap().parse().unwrap();
    assert!(secs > 80_000, "held until the record's TTL: {secs}");
    // Under "hold", until the in-flight timeout only.
    let (p, mut env) = one_worker(
        r#"{"on_unknown_outcome": "hold", "in_flight_timeout_seconds": 5,
            "ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#,
    );
    let s = send(&p, &mut env, &delivery("o", "1", "a")).unwrap();
    respond(&p, &mut env, s, upstream_reset());
    assert_eq!(
        send(&p, &mut env, &delivery("o", "2", "b"))
            .unwrap_err()
            .status(),
        409
    );
    env.now_ms += 5_001;
    assert_eq!(
        run(&p, &mut env, &delivery("o", "2", "b"), ok("two")),
        executed("two")
    );
}

#[test]
fn stale_requests_can_be_acknowledged_for_senders_that_retry_until_a_2xx() {
    let (p, mut env) = one_worker(
        r#"{"ordering": {"entity": {"json_pointer": "/data/id"}, "version": {"json_pointer": "/created"},
                         "on_stale": "acknowledge"}}"#,
    );
    let event = |id: &str, created: u64| {
        req("POST", "/hook").key(id).body(&format!(
            r#"{{"id": "{id}", "created": {created}, "data": {{"id": "cus_1"}}}}"#
        ))
    };
    assert_eq!(
        run(&p, &mut env, &event("evt_2", 200), ok("ok")),
        executed("ok")
    );
    let ack = run(&p, &mut env, &event("evt_1", 100), ok("never"));
    assert_eq!(ack.status(), 200);
    let h = |n: &str| {
        ack.local()
            .headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(h("idempotent-stale"), Some(b"true".to_vec()));
    assert_eq!(h("idempotent-applied-version"), Some(b"200".to_vec()));
    let body: serde_json::Value = serde_json::from_slice(&ack.local().body).unwrap();
    assert_eq!(body["applied_version"], "200");
    assert_eq!(body["version"], "100");
    let s = send(&p, &mut env, &event("evt_0", 50)).unwrap_err();
    assert_eq!(s.local().details, "proxy_dedup_stale");
    // 204: no body.
    let (p, mut env) = one_worker(
        r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"},
                         "on_stale": "acknowledge", "acknowledge_status": 204}}"#,
    );
    run(&p, &mut env, &delivery("o", "2", "b"), ok("two"));
    let ack = run(&p, &mut env, &delivery("o", "1", "a"), ok("never"));
    assert_eq!((ack.status(), ack.local().body.len()), (204, 0));
}

#[test]
fn timestamps_compare_as_instants_and_strings_byte_by_byte() {
    let (p, mut env) = one_worker(
        r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version", "type": "timestamp"}}}"#,
    );
    let at = |v: &str, k: &str| delivery("o", v, k);
    assert_eq!(
        run(&p, &mut env, &at("2026-12-02T10:00:00+02:00", "a"), ok("a")),
        executed("a")
    );
    // 08:30Z is after 10:00+02:00 (08:00Z), though it reads smaller.
    assert_eq!(
        run(&p, &mut env, &at("2026-12-02T08:30:00Z", "b"), ok("b")),
        executed("b")
    );
    let stale = run(
        &p,
        &mut env,
        &at("2026-12-02T08:29:59.999999999Z", "c"),
        ok("never"),
    );
    assert_eq!(stale.status(), 409);
    assert!(
        detail(stale.local()).contains("2026-12-02T08:30:00Z"),
        "{stale:?}"
    );
    assert_eq!(
        run(&p, &mut env, &at("2026-12-02T08:30:00.5Z", "d"), ok("d")),
        executed("d")
    );
    let bad = run(&p, &mut env, &at("2026-12-02 25:00:00Z", "e"), ok("never"));
    assert_eq!(
        bad.problem_type(),
        "urn:proxy-dedup:problem:invalid-version"
    );

    let (p, mut env) = one_worker(
        r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version", "type": "string"}}}"#,
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o", "b", "1"), ok("b")),
        executed("b")
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o", "a9", "2"), ok("x")).status(),
        409
    );
    assert_eq!(
        run(&p, &mut env, &delivery("o", "ba", "3"), ok("ba")),
        executed("ba")
    );
}

#[test]
fn a_missing_or_malformed_entity_or_version_gets_400() {
    let (p, mut env) = one_worker(HEADERS);
    let cases = [
        (
            req("POST", "/h").key("k").header("x-version", "1"),
            "missing-entity",
        ),
        (
            req("POST", "/h").key("k").header("x-entity", "o"),
            "missing-version",
        ),
        (delivery("o", "1.5", "k"), "invalid-version"),
        (delivery("o", "+1", "k"), "invalid-version"),
        (
            delivery("o", "99999999999999999999", "k"),
            "invalid-version",
        ),
        (
            delivery("o", "1", "k").header("x-version", "2"),
            "invalid-version",
        ),
        (delivery("", "1", "k"), "invalid-entity"),
    ];
    for (i, (r, slug)) in cases.iter().enumerate() {
        let out = run(&p, &mut env, r, ok("never"));
        assert_eq!(out.status(), 400, "case {i}");
        assert_eq!(
            out.problem_type(),
            format!("urn:proxy-dedup:problem:{slug}"),
            "case {i}"
        );
    }
    assert_eq!(counts(&env, [Counter::BadKey, Counter::Executed]), [7, 0]);
    let mut s = crate::stream::DedupStream::new(3);
    let first = s.on_request_headers(&p, &mut env, delivery("o", "x", "k").head, true);
    assert!(matches!(first, Decision::Reply(_)));
    assert_eq!(s.log_fields().map(|(v, _)| v), Some("bad_version"));
}

#[test]
fn entities_are_scoped_like_records() {
    let (p, mut env) = one_worker(
        r#"{"scope": {"headers": ["x-tenant"]},
            "ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#,
    );
    let of = |tenant: &str, v: &str, k: &str| delivery("o", v, k).header("x-tenant", tenant);
    assert_eq!(
        run(&p, &mut env, &of("a", "9", "k1"), ok("a9")),
        executed("a9")
    );
    // Tenant b's entity "o" is another entity: its version 1 runs.
    assert_eq!(
        run(&p, &mut env, &of("b", "1", "k1"), ok("b1")),
        executed("b1")
    );
    assert_eq!(
        run(&p, &mut env, &of("a", "8", "k2"), ok("x")).status(),
        409
    );
}

#[test]
fn wait_mode_waits_for_the_other_version_then_runs() {
    let (p, mut env) = one_worker(
        r#"{"on_in_flight": "wait", "wait_timeout_ms": 2000,
            "ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#,
    );
    let (_, v1) = sent(&p, &mut env, delivery("o", "1", "a"));
    let mut v2 = crate::stream::DedupStream::new(7);
    let d = v2.on_request_headers(&p, &mut env, delivery("o", "2", "b").head, true);
    assert_eq!(d, Decision::Pause, "waits for version 1");
    assert!(v2.waiting());
    assert_eq!(respond(&p, &mut env, v1, ok("one")), executed("one"));
    env.now_ms += 10;
    assert_eq!(v2.on_wake(&p, &mut env), Decision::Continue, "its turn");
    assert_eq!(respond(&p, &mut env, v2, ok("two")), executed("two"));
    // A stale one does not wait.
    let mut v0 = crate::stream::DedupStream::new(8);
    let d = v0.on_request_headers(&p, &mut env, delivery("o", "0", "z").head, true);
    assert!(matches!(d, Decision::Reply(r) if r.status == 409));
}

#[test]
fn two_workers_share_the_entities() {
    let p = plugin(HEADERS);
    let (mut a, mut b): (FakeEnv, FakeEnv) = two_workers();
    let (_, v2) = sent(&p, &mut a, delivery("o", "2", "b"));
    assert_eq!(
        send(&p, &mut b, &delivery("o", "3", "c"))
            .unwrap_err()
            .status(),
        409
    );
    respond(&p, &mut a, v2, ok("two"));
    assert_eq!(
        run(&p, &mut b, &delivery("o", "1", "a"), ok("x")).status(),
        409
    );
    assert_eq!(
        run(&p, &mut b, &delivery("o", "3", "c"), ok("three")),
        executed("three")
    );
}

#[test]
fn bad_ordering_configs_name_the_field_and_a_rule_can_turn_it_off() {
    let (field, _) = cfg_err(r#"{"ordering": {"entity": {"header": "x-e"}}}"#);
    assert_eq!(field, "ordering.version");
    let (field, _) = cfg_err(
        r#"{"ordering": {"entity": {"header": "x-e", "json_pointer": "/a"}, "version": {"header": "v"}}}"#,
    );
    assert_eq!(field, "ordering.entity");
    // A rule turns an inherited guard off.
    let p = plugin(
        r#"{"ordering": {"entity": {"header": "x-e"}, "version": {"header": "x-v"}},
            "rules": [{"name": "free", "match": {"path_prefix": "/free"}, "ordering": {"enabled": false}}]}"#,
    );
    assert!(p.config.policy.ordering.is_some());
    assert!(p.config.rules[0].policy.ordering.is_none());
}

/// The guard on etcd: `extra` config fields besides the store and the header guard.
fn etcd_ordered(extra: &str) -> crate::stream::Plugin {
    let guard =
        r#""ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}"#;
    let sep = if extra.is_empty() { "" } else { ", " };
    etcd_plugin(&format!("{guard}{sep}{extra}"))
}

#[test]
fn etcd_two_proxies_share_entities_stale_and_busy_as_on_shared_data() {
    for p in [etcd_ordered(""), {
        let guard =
            r#""ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}"#;
        etcd_json_plugin(guard)
    }] {
        let (mut a, mut b) = two_proxies();
        let (_, v2) = sent(&p, &mut a, delivery("o", "2", "b"));
        // Version 3 on the other proxy while 2 runs: 409 in-flight (no wait on etcd).
        let busy = send(&p, &mut b, &delivery("o", "3", "c")).unwrap_err();
        assert_eq!(busy.problem_type(), "urn:proxy-dedup:problem:in-flight");
        assert_eq!(respond(&p, &mut a, v2, ok("two")), executed("two"));
        // Stale on B after A's completion, the record of the refused key released.
        let stale = run(&p, &mut b, &delivery("o", "1", "a"), ok("never"));
        assert_eq!(
            stale.problem_type(),
            "urn:proxy-dedup:problem:stale-version"
        );
        assert_eq!(
            run(&p, &mut b, &delivery("o", "1", "a"), ok("never")).status(),
            409
        );
        assert_eq!(
            run(&p, &mut b, &delivery("o", "3", "c"), ok("three")),
            executed("three")
        );
        // The same delivery again: replayed (dedup first), on either proxy.
        run(&p, &mut a, &delivery("o", "2", "b"), ok("never")).assert_replays(b"two");
        assert_eq!(
            run(&p, &mut a, &delivery("o", "3", "x"), ok("never")).status(),
            409
        );
        let runs = a.count_of(Counter::Executed) + b.count_of(Counter::Executed);
        assert_eq!(runs, 2);
        assert_eq!(
            a.count_of(Counter::Released) + b.count_of(Counter::Released),
            0
        );
    }
}

#[test]
fn etcd_a_released_version_raises_nothing_and_a_held_one_holds_the_entity() {
    let p = etcd_ordered(r#""on_unknown_outcome": "hold", "in_flight_timeout_seconds": 5"#);
    let (mut a, mut b) = two_proxies();
    assert_eq!(
        run(&p, &mut a, &delivery("o", "3", "c"), ok("3")),
        executed("3")
    );
    assert_eq!(
        run(&p, &mut a, &delivery("o", "5", "e"), answer(503, "x")).status(),
        503
    );
    assert_eq!(
        run(&p, &mut b, &delivery("o", "4", "d"), ok("4")),
        executed("4")
    );
    // 6 resets: held until the in-flight timeout, on both proxies.
    let s = send(&p, &mut a, &delivery("o", "6", "f")).unwrap();
    assert_eq!(respond(&p, &mut a, s, upstream_reset()), Outcome::Reset);
    let busy = send(&p, &mut b, &delivery("o", "7", "g")).unwrap_err();
    assert_eq!(busy.problem_type(), "urn:proxy-dedup:problem:in-flight");
    a.now_ms += 5_001;
    b.now_ms += 5_001;
    assert_eq!(
        run(&p, &mut b, &delivery("o", "7", "g"), ok("7")),
        executed("7")
    );
    assert_eq!(
        run(&p, &mut a, &delivery("o", "5", "e2"), ok("x")).status(),
        409
    );
}

#[test]
fn etcd_a_client_gone_during_the_entity_claim_leaves_nothing_held() {
    let p = etcd_ordered("");
    let (mut a, mut b) = two_proxies();
    let mut s = crate::stream::DedupStream::new(4);
    let d = s.on_request_headers(&p, &mut a, delivery("o", "1", "a").head, true);
    // Run the record claim, then stop with the entity's call out.
    let c = run_calls_until(&p, &mut a, &mut s, d, entity_call_out).unwrap();
    let gone = s.on_stream_end(&p, &mut a, &origin("client_disconnected", 0));
    assert_eq!(gone, None);
    let ans = call(&a, &c);
    let d = s.on_store_answer(&p, &mut a, ans);
    let d = settle(&p, &mut a, &mut s, d);
    assert!(!matches!(d, Decision::Reply(_)), "{d:?}");
    // Nothing ran: the next version and the same key run on the other proxy.
    assert_eq!(
        run(&p, &mut b, &delivery("o", "1", "a"), ok("1")),
        executed("1")
    );
    assert_eq!(a.count_of(Counter::Executed), 0, "never forwarded");
}

/// An entity call has a budget of `store.timeout_ms` from when it starts: a failure
/// answered before the budget ends is retried, one answered when it ends is a store
/// error (closed: the record's claim is released and the client gets `503`).
#[test]
fn etcd_an_entity_call_is_not_retried_once_its_budget_has_ended() {
    let p = etcd_ordered(r#""failure_mode": "closed""#);
    for (after, retried) in [(499, true), (500, false)] {
        let (mut a, mut b) = two_proxies();
        let mut s = crate::stream::DedupStream::new(5);
        let d = s.on_request_headers(&p, &mut a, delivery("o", "1", "a").head, true);
        // The record's claim, until the entity's first call is out.
        let first = run_calls_until(&p, &mut a, &mut s, d, entity_call_out).unwrap();
        a.now_ms += after;
        let refused = crate::stream::CallAnswer {
            status: 503,
            ..Default::default()
        };
        match s.on_store_answer(&p, &mut a, refused) {
            Decision::Call(c) if c.path == first.path && c.body == first.body => {
                assert!(retried, "retried at +{after} ms");
                assert_eq!(c.timeout_ms, 1, "what is left of the budget");
            }
            other => {
                assert!(!retried, "+{after} ms: {other:?}");
                let end = settle(&p, &mut a, &mut s, other);
                assert!(
                    matches!(end, Decision::Reply(ref r) if r.status == 503),
                    "{end:?}"
                );
                assert_eq!(a.count_of(Counter::StoreErrors), 1);
                // Nothing is left claimed: the delivery runs on the other proxy.
                b.now_ms = a.now_ms;
                assert_eq!(
                    run(&p, &mut b, &delivery("o", "1", "a"), ok("1")),
                    executed("1")
                );
            }
        }
    }
}

#[test]
fn etcd_failure_closed_refuses_and_releases_failure_open_runs_unordered() {
    let p = etcd_ordered(r#""failure_mode": "closed""#);
    let (mut a, mut b) = two_proxies();
    assert_eq!(
        run(&p, &mut a, &delivery("o", "2", "b"), ok("2")),
        executed("2")
    );
    // etcd fails every call from here: the record claim fails first (503).
    a.etcd.fail_next(100);
    assert_eq!(
        run(&p, &mut a, &delivery("o", "1", "a"), ok("x")).status(),
        503
    );
    a.etcd.fail_next(0);
    assert_eq!(
        run(&p, &mut b, &delivery("o", "1", "a"), ok("x")).status(),
        409
    );
}

#[test]
fn detached_executions_are_ordered_on_both_stores_and_the_client_gets_its_answer() {
    let detached = r#""upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000}"#;
    let guard =
        r#""ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}"#;
    let shared = plugin(&format!("{{{detached}, {guard}}}"));
    let etcd = etcd_plugin(&format!("{detached}, {guard}"));
    for (p, mut env) in [(shared, world().1), (etcd, two_proxies().0)] {
        let mut s = send(&p, &mut env, &delivery("o", "2", "b")).unwrap();
        assert!(s.detached());
        let d = detached_answer(&p, &mut env, &mut s, call_answer(200, "done"));
        let Decision::Reply(r) = d else {
            panic!("{d:?}")
        };
        assert_eq!((r.status, r.body.as_slice()), (200, &b"done"[..]));
        let stale = send(&p, &mut env, &delivery("o", "1", "a")).unwrap_err();
        assert_eq!(
            stale.problem_type(),
            "urn:proxy-dedup:problem:stale-version"
        );
    }
}

#[test]
fn a_full_entity_bucket_refuses_or_under_on_store_full_open_runs_unordered_once() {
    for open in [false, true] {
        let extra = if open {
            r#""on_store_full": "open", "#
        } else {
            ""
        };
        let (p, mut env) = one_worker(&format!(
            r#"{{{extra}"store": {{"max_entities": 16}},
                "ordering": {{"entity": {{"header": "x-entity"}}, "version": {{"header": "x-version"}}}}}}"#
        ));
        // 16 entities in flight fill the one entity bucket.
        let flying: Vec<_> = (0..16)
            .map(|i| {
                sent(
                    &p,
                    &mut env,
                    delivery(&format!("e{i}"), "1", &format!("k{i}")),
                )
                .1
            })
            .collect();
        let r = delivery("new", "1", "kn");
        if open {
            let s = send(&p, &mut env, &r).unwrap();
            // Its record is claimed: the same key again is in flight, not run twice.
            assert_eq!(send(&p, &mut env, &r).unwrap_err().status(), 409);
            assert_eq!(respond(&p, &mut env, s, ok("n")), executed("n"));
            assert_eq!(counts(&env, [Counter::FailedOpen]), [1]);
        } else {
            let full = send(&p, &mut env, &r).unwrap_err();
            assert_eq!(full.problem_type(), "urn:proxy-dedup:problem:store-full");
            assert!(detail(full.local()).contains("entity"), "{full:?}");
            // Nothing was claimed for it: its retry after the others settle runs.
            for s in flying {
                respond(&p, &mut env, s, ok("x"));
            }
            assert_eq!(run(&p, &mut env, &r, ok("n")), executed("n"));
        }
    }
}

/// Runs `r`'s request-path calls on `env`'s etcd until the entity's claim is out; then
/// `before_entity` (a fault), and the rest: the stream and what it decided.
fn at_entity_claim(
    p: &crate::stream::Plugin,
    env: &mut FakeEnv,
    r: &Req,
    before_entity: impl FnOnce(&FakeEnv),
) -> (crate::stream::DedupStream, Decision) {
    let mut s = crate::stream::DedupStream::new(11);
    let d = s.on_request_headers(p, env, r.head.clone(), true);
    let d = match run_calls_until(p, env, &mut s, d, entity_call_out) {
        Ok(c) => {
            before_entity(env);
            let a = call(env, &c);
            let d = s.on_store_answer(p, env, a);
            settle(p, env, &mut s, d)
        }
        Err(d) => d,
    };
    (s, d)
}

#[test]
fn etcd_an_entity_claim_is_retried_four_times_then_fails_as_failure_mode_says() {
    // Four transport failures: retried, claimed, forwarded.
    let p = etcd_ordered("");
    let (mut a, _) = two_proxies();
    let (s, d) = at_entity_claim(&p, &mut a, &delivery("o", "2", "b"), |e| {
        e.etcd.fail_next(4)
    });
    assert_eq!(d, Decision::Continue);
    assert_eq!(respond(&p, &mut a, s, ok("two")), executed("two"));
    assert_eq!(
        run(&p, &mut a, &delivery("o", "1", "a"), ok("x")).status(),
        409
    );
    // Five: closed (the default) refuses (and releases the record: the key runs later).
    let p = etcd_ordered("");
    let (mut a, _) = two_proxies();
    let (_, d) = at_entity_claim(&p, &mut a, &delivery("o", "2", "b"), |e| {
        e.etcd.fail_next(5)
    });
    assert!(matches!(&d, Decision::Reply(r) if r.status == 503), "{d:?}");
    assert_eq!(
        run(&p, &mut a, &delivery("o", "2", "b"), ok("two")),
        executed("two")
    );
    // Five under open: forwarded unordered, once; its completion still raises the
    // applied version (the entity is created by the settle).
    let p = etcd_ordered(r#""failure_mode": "open""#);
    let (mut a, _) = two_proxies();
    let (s, d) = at_entity_claim(&p, &mut a, &delivery("o", "2", "b"), |e| {
        e.etcd.fail_next(5)
    });
    assert_eq!(d, Decision::Continue);
    assert_eq!(counts(&a, [Counter::FailedOpen]), [1]);
    assert_eq!(respond(&p, &mut a, s, ok("two")), executed("two"));
    let stale = run(&p, &mut a, &delivery("o", "1", "a"), ok("x"));
    assert_eq!(
        stale.problem_type(),
        "urn:proxy-dedup:problem:stale-version"
    );
}

#[test]
fn etcd_an_entity_claim_whose_lease_is_gone_takes_a_fresh_one() {
    let p = etcd_ordered("");
    let (mut a, mut b) = two_proxies();
    let grants = a.etcd.grants();
    let (s, d) = at_entity_claim(&p, &mut a, &delivery("o", "2", "b"), |e| {
        e.etcd.revoke_all_leases()
    });
    // The record's claim went with its lease too; the entity took a fresh lease and
    // was claimed.
    assert_eq!(d, Decision::Continue);
    assert!(a.etcd.grants() > grants + 1, "a fresh grant for the entity");
    respond(&p, &mut a, s, ok("two"));
    assert_eq!(
        run(&p, &mut b, &delivery("o", "1", "a"), ok("x")).status(),
        409
    );
}

#[test]
fn etcd_entities_are_keys_under_the_prefix_and_a_vanished_one_is_a_lost_claim() {
    let p = etcd_ordered("");
    let (mut a, _) = two_proxies();
    let s = send(&p, &mut a, &delivery("o", "1", "a")).unwrap();
    let now = a.now_ms;
    let keys = a.etcd.keys(now);
    let entities: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("proxy-dedup/o/"))
        .collect();
    assert_eq!(entities.len(), 1, "{keys:?}");
    assert_eq!(entities[0].len(), "proxy-dedup/o/".len() + 64, "{keys:?}");
    // Its lease is revoked while version 1 runs: the release finds nothing to end.
    a.etcd.revoke_all_leases();
    let lost = a.count_of(Counter::ClaimsLost);
    assert_eq!(respond(&p, &mut a, s, answer(503, "x")).status(), 503);
    assert_eq!(
        a.count_of(Counter::ClaimsLost),
        lost + 1,
        "the entity's flight was gone"
    );
}
