//! Per-route policies through the plugin: first match wins, bypass, each rule's own
//! records, and each overridable field reaching the decision and both stores.

use crate::fake::FakeEnv;
use crate::metrics::Counter;
use crate::stream::{Decision, DedupStream};
use crate::testing::*;

#[test]
fn the_first_matching_rule_wins_and_every_condition_must_hold() {
    let p = plugin(
        r#"{"rules": [
             {"name": "exact", "match": {"path_exact": "/pay/now"}, "bypass": true},
             {"name": "pay", "match": {"path_prefix": "/pay"}},
             {"name": "tenant", "match": {"header": {"name": "x-tenant", "equals": "acme"}, "methods": ["PUT"]}},
             {"name": "host", "match": {"authority": "Admin.Example"}},
             {"name": "any-debug", "match": {"header": {"name": "x-debug"}}}
           ]}"#,
    );
    let name = |r: &Req| p.config.select(&r.head).1.rule.clone();
    let named = |s: &str| Some(s.to_string());
    assert_eq!(name(&req("POST", "/pay/now")), named("exact"));
    assert_eq!(name(&req("POST", "/pay/now?x=1")), named("exact"));
    assert_eq!(name(&req("POST", "/pay/now/2")), named("pay"));
    assert_eq!(name(&req("POST", "/payments")), named("pay"));
    assert_eq!(
        name(&req("POST", "/PAY")),
        None,
        "paths compare case-sensitively"
    );
    let tenant = req("PUT", "/o").header("x-tenant", "acme");
    assert_eq!(name(&tenant), named("tenant"));
    assert_eq!(name(&req("POST", "/o").header("x-tenant", "acme")), None);
    assert_eq!(name(&req("PUT", "/o").header("x-tenant", "other")), None);
    // A header sent twice never matches `equals` (which line counts is not clear).
    assert_eq!(name(&tenant.clone().header("x-tenant", "acme")), None);
    let mut host = req("POST", "/o");
    host.head.authority = "admin.example".into();
    assert_eq!(name(&host), named("host"));
    assert_eq!(
        name(&req("POST", "/o").header("X-Debug", "")),
        named("any-debug")
    );
    assert_eq!(
        name(&req("POST", "/pay").header("x-debug", "1")),
        named("pay")
    );
    // The stream follows the chosen rule and says so for access logs.
    let (_, mut env) = world();
    let s = send(&p, &mut env, &req("POST", "/pay/now/2").key("k")).unwrap();
    assert_eq!(s.rule(&p), Some("pay"));
    let s = send(&p, &mut env, &req("POST", "/other").key("k")).unwrap();
    assert_eq!(s.rule(&p), None);
}

#[test]
fn a_bypassed_rule_passes_requests_untouched_and_counts_them() {
    let (p, mut env) = (rules(""), world().1);
    let search = req("POST", "/search").key("k").body("{}");
    for body in ["one", "two"] {
        assert_eq!(
            run(&p, &mut env, &search, ok(body)),
            Outcome::Upstream(200, body.as_bytes().to_vec())
        );
    }
    assert_eq!(counts(&env, [Counter::Bypassed, Counter::Executed]), [2, 0]);
    let mut s = send(&p, &mut env, &search).unwrap();
    assert_eq!(s.log_fields().map(|(v, _)| v), Some("bypassed"));
    assert_eq!(s.rule(&p), Some("search"));
    // Even a body far above max_body_bytes: the filter does not read it.
    let mut s = DedupStream::new(9);
    let a = s.on_request_headers(&p, &mut env, search.head.clone(), false);
    assert_eq!(a, Decision::Continue);
    assert_eq!(
        s.on_request_body(&p, &mut env, 100 << 20, true, || None),
        Decision::Continue
    );
}

#[test]
fn each_rule_has_its_own_records_and_the_same_key_runs_once_per_rule() {
    let (p, mut env) = one_worker(
        r#"{"rules": [
             {"name": "a", "match": {"path_prefix": "/a"}},
             {"name": "b", "match": {"path_prefix": "/b"}},
             {"name": "b2", "match": {"path_prefix": "/c"}, "records_of": "b"},
             {"name": "top", "match": {"path_prefix": "/d"}, "records_of": "default"}
           ],
           "payload": {"parts": ["method", "body"]}}"#,
    );
    let key = |path: &str| req("POST", path).key("same").body("{}");
    for path in ["/a", "/b", "/o"] {
        assert_eq!(
            run(&p, &mut env, &key(path), ok(path)),
            Outcome::Upstream(200, path.as_bytes().to_vec()),
            "{path}: another rule's record must not answer"
        );
    }
    // Sharing, as configured: /c reads b's records, /d the top level's.
    run(&p, &mut env, &key("/c"), ok("no")).assert_replays(b"/b");
    run(&p, &mut env, &key("/d"), ok("no")).assert_replays(b"/o");
    run(&p, &mut env, &key("/a/x"), ok("no")).assert_replays(b"/a");
    assert_eq!(env.count_of(Counter::Executed), 3);
}

#[test]
fn reordering_or_inserting_rules_keeps_each_rules_records() {
    let (shared, mut env) = world();
    let before = rules("");
    let pay = req("POST", "/payments/1").key("p1");
    let hook = req("POST", "/webhooks").body(r#"{"message": {"messageId": "m1"}}"#);
    run(&before, &mut env, &pay, answer(201, "paid"));
    run(&before, &mut env, &hook, ok("hooked"));
    // A push that inserts a rule in front and reverses the others.
    let after = plugin(
        r#"{"rules": [
             {"name": "new", "match": {"path_prefix": "/new"}},
             {"name": "search", "match": {"path_prefix": "/search"}, "bypass": true},
             {"name": "webhooks", "match": {"path_prefix": "/webhooks", "methods": ["POST"]},
              "key": {"json_pointer": "/message/messageId", "required": true},
              "payload": {"ignore_json_pointers": ["/deliveryAttempt"]},
              "ttl_seconds": 604800, "store_statuses": ["2xx"]},
             {"name": "payments", "match": {"path_prefix": "/payments"},
              "key": {"required": true}, "ttl_seconds": 86400}
           ]}"#,
    );
    let mut env2 = FakeEnv::new(shared, 3);
    env2.now_ms = env.now_ms;
    run(&after, &mut env2, &pay, ok("twice")).assert_replays(b"paid");
    run(&after, &mut env2, &hook, ok("twice")).assert_replays(b"hooked");
    // Renaming a rule is a new key space (its name is the records' identity).
    let renamed =
        plugin(r#"{"rules": [{"name": "payments-v2", "match": {"path_prefix": "/payments"}}]}"#);
    assert_eq!(
        run(&renamed, &mut env2, &pay, ok("again")),
        executed("again")
    );
}

#[test]
fn top_level_records_keep_their_digest_when_rules_are_added() {
    let (shared, mut env) = world();
    let r = req("POST", "/orders").key("o1");
    run(&plugin("{}"), &mut env, &r, ok("first"));
    let mut env2 = FakeEnv::new(shared, 4);
    env2.now_ms = env.now_ms;
    run(&rules(""), &mut env2, &r, ok("no")).assert_replays(b"first");
}

#[test]
fn the_example_policies_apply_per_route() {
    let (p, mut env) = (rules(""), world().1);
    // payments: a key is required.
    let got = run(&p, &mut env, &req("POST", "/payments").body("{}"), ok("x"));
    assert_eq!(got.status(), 400);
    // other routes: no key passes (top-level default).
    assert!(run(&p, &mut env, &req("POST", "/orders").body("{}"), ok("x")).reached_upstream());
    // webhooks: the key from the JSON body; a redelivery with a higher attempt replays.
    let m = |attempt: u32, data: &str| {
        req("POST", "/webhooks").body(&format!(
            r#"{{"message": {{"messageId": "m-7", "data": "{data}"}}, "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert_eq!(run(&p, &mut env, &m(1, "a"), answer(204, "")).status(), 204);
    let again = run(&p, &mut env, &m(2, "a"), ok("no"));
    assert_eq!(again.status(), 204);
    assert_eq!(run(&p, &mut env, &m(3, "b"), ok("no")).status(), 422);
    // webhooks store 2xx only: a 404 releases, the redelivery runs again.
    assert_eq!(
        run(
            &p,
            &mut env,
            &m(1, "z").body(r#"{"message": {"messageId": "m-8"}}"#),
            answer(404, "")
        )
        .status(),
        404
    );
    assert!(matches!(
        run(
            &p,
            &mut env,
            &req("POST", "/webhooks").body(r#"{"message": {"messageId": "m-8"}}"#),
            ok("ran")
        ),
        Outcome::Upstream(200, _)
    ));
    // while the top level stores 404s.
    run(
        &p,
        &mut env,
        &req("POST", "/o").key("nf"),
        answer(404, "gone"),
    );
    assert_eq!(
        run(&p, &mut env, &req("POST", "/o").key("nf"), ok("no"))
            .local()
            .body,
        b"gone"
    );
    // webhooks: GET is not matched by the rule, and the top level does not dedup it.
    assert!(run(&p, &mut env, &req("GET", "/webhooks"), ok("x")).reached_upstream());
}

#[test]
fn per_rule_ttl_in_flight_timeout_and_body_limit() {
    let (p, mut env) = one_worker(
        r#"{"ttl_seconds": 3600, "in_flight_timeout_seconds": 60, "on_unknown_outcome": "hold",
            "rules": [{"name": "short", "match": {"path_prefix": "/s"},
                       "ttl_seconds": 10, "in_flight_timeout_seconds": 2,
                       "max_body_bytes": 8, "max_replay_body_bytes": 3}]}"#,
    );
    let short = req("POST", "/s").key("k").body("{}");
    let long = req("POST", "/l").key("k").body("{}");
    run(&p, &mut env, &short, ok("s1"));
    run(&p, &mut env, &long, ok("l1"));
    env.now_ms += 10_000;
    assert_eq!(
        run(&p, &mut env, &short, ok("s2")),
        executed("s2"),
        "the rule's TTL ended"
    );
    run(&p, &mut env, &long, ok("no")).assert_replays(b"l1");
    // In flight: the rule's claim ends after 2 s, the top level's after 60 s.
    let (ks, kl) = (req("POST", "/s").key("f"), req("POST", "/l").key("f"));
    let _a = send(&p, &mut env, &ks).unwrap();
    let _b = send(&p, &mut env, &kl).unwrap();
    env.now_ms += 2_000;
    assert!(send(&p, &mut env, &ks).is_ok(), "the rule's claim expired");
    assert_eq!(send(&p, &mut env, &kl).unwrap_err().status(), 409);
    // The rule's body limit, and its replay cap.
    let big = req("POST", "/s").key("b").body("123456789");
    assert_eq!(run(&p, &mut env, &big, ok("x")).status(), 413);
    let big = req("POST", "/l").key("b").body("123456789");
    assert!(run(&p, &mut env, &big, ok("x")).reached_upstream());
    let r = req("POST", "/s").key("cap");
    run(&p, &mut env, &r, ok("four"));
    assert_eq!(
        run(&p, &mut env, &r, ok("no")).problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
}

#[test]
fn per_rule_on_duplicate() {
    let (p, mut env) = one_worker(
        r#"{"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "on_duplicate": "reject"}]}"#,
    );
    for path in ["/r", "/o"] {
        run(&p, &mut env, &req("POST", path).key("k"), ok("one"));
    }
    assert_eq!(
        run(&p, &mut env, &req("POST", "/r").key("k"), ok("no")).problem_type(),
        "urn:proxy-dedup:problem:already-completed"
    );
    assert_eq!(
        run(&p, &mut env, &req("POST", "/o").key("k"), ok("no"))
            .local()
            .body,
        b"one"
    );
}

#[test]
fn per_rule_ttl_and_in_flight_timeout_reach_etcd() {
    let p = plugin(&format!(
        r#"{{{ETCD}, "ttl_seconds": 86400, "on_unknown_outcome": "hold",
            "rules": [{{"name": "short", "match": {{"path_prefix": "/s"}},
                        "ttl_seconds": 10, "in_flight_timeout_seconds": 2}}]}}"#
    ));
    let (mut a, mut b) = two_proxies();
    let short = req("POST", "/s").key("k");
    let long = req("POST", "/l").key("k");
    run(&p, &mut a, &short, ok("s1"));
    run(&p, &mut a, &long, ok("l1"));
    // Each policy got its own leases: two purposes for each of the two plans.
    assert_eq!(a.etcd.grants(), 4);
    run(&p, &mut b, &short, ok("no")).assert_replays(b"s1");
    // Past the rule's TTL and its lease's slack, etcd itself has dropped the record;
    // the top level's lives on.
    b.now_ms += 120_000;
    assert_eq!(b.etcd.key_count(b.now_ms), 1);
    assert_eq!(run(&p, &mut b, &short, ok("s2")), executed("s2"));
    run(&p, &mut b, &long, ok("no")).assert_replays(b"l1");
    // In flight: the rule's claim is taken over after 2 s (its lease runs out).
    let (fs, fl) = (req("POST", "/s").key("f"), req("POST", "/l").key("f"));
    let _stuck = send(&p, &mut b, &fs).unwrap();
    let _stuck_too = send(&p, &mut b, &fl).unwrap();
    assert_eq!(send(&p, &mut b, &fs).unwrap_err().status(), 409);
    b.now_ms += 5_000;
    assert!(
        send(&p, &mut b, &fs).is_ok(),
        "the rule's in-flight lease ended"
    );
    assert_eq!(send(&p, &mut b, &fl).unwrap_err().status(), 409);
}
