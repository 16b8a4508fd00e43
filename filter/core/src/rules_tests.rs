//! Native tests of per-route policies (`rules`): configuration errors with the rule's
//! index, first match wins, the rule in the record's identity, bypass, and each
//! overridable field reaching the decision and both stores.

use super::*;

/// The README's example: payments need a header key for 24 h, webhooks key on a JSON
/// message id for 7 days, search is never deduplicated.
const EXAMPLE: &str = r#"
  "rules": [
    {"name": "payments", "match": {"path_prefix": "/payments"},
     "key": {"required": true}, "ttl_seconds": 86400},
    {"name": "webhooks", "match": {"path_prefix": "/webhooks", "methods": ["POST"]},
     "key": {"json_pointer": "/message/messageId", "required": true},
     "payload": {"ignore_json_pointers": ["/deliveryAttempt"]},
     "ttl_seconds": 604800, "store_statuses": ["2xx"]},
    {"name": "search", "match": {"path_prefix": "/search"}, "bypass": true}
  ]"#;

fn rules(extra: &str) -> Plugin {
    plugin(&format!("{{{EXAMPLE}{extra}}}"))
}

fn rule_err(rules: &str) -> (String, String) {
    cfg_err(&format!(r#"{{"rules": [{rules}]}}"#))
}

const OK_RULE: &str = r#"{"name": "a", "match": {"path_prefix": "/a"}}"#;

#[test]
fn rule_config_errors_name_the_rule_index_and_the_field() {
    let cases: &[(&str, &str)] = &[
        (r#"{"match": {"path_prefix": "/b"}}"#, "rules[1].name"),
        (
            r#"{"name": "", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "a b", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "default", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "a", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (r#"{"name": "b"}"#, "rules[1].match"),
        (r#"{"name": "b", "match": {}}"#, "rules[1].match"),
        (
            r#"{"name": "b", "match": {"path_prefx": "/b"}}"#,
            "rules[1].match",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "b"}}"#,
            "rules[1].match.path_prefix",
        ),
        (
            r#"{"name": "b", "match": {"path_exact": "/b?x=1"}}"#,
            "rules[1].match.path_exact",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b", "path_exact": "/b"}}"#,
            "rules[1].match.path_exact",
        ),
        (
            r#"{"name": "b", "match": {"methods": []}}"#,
            "rules[1].match.methods",
        ),
        (
            r#"{"name": "b", "match": {"methods": ["post"]}}"#,
            "rules[1].match.methods",
        ),
        (
            r#"{"name": "b", "match": {"authority": "a b"}}"#,
            "rules[1].match.authority",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x y"}}}"#,
            "rules[1].match.header.name",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": ":path"}}}"#,
            "rules[1].match.header.name",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x", "equals": "a\u0001"}}}"#,
            "rules[1].match.header.equals",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x", "value": "y"}}}"#,
            "rules[1].match.header",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "bypass": true, "ttl_seconds": 5}"#,
            "rules[1].bypass",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "bypass": true, "records_of": "a"}"#,
            "rules[1].bypass",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "ttl_seconds": 0}"#,
            "rules[1].ttl_seconds",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "in_flight_timeout_seconds": 86401}"#,
            "rules[1].in_flight_timeout_seconds",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "key": {"json_pointer": "x"}}"#,
            "rules[1].key.json_pointer",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "key": {"headerz": ["x"]}}"#,
            "rules[1].key",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "scope": {"headers": ["a", "a"]}}"#,
            "rules[1].scope.headers",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "store_statuses": ["!5xx"]}"#,
            "rules[1].store_statuses",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "payload": {"json_pointers": ["/a"], "parts": ["method"]}}"#,
            "rules[1].payload.parts",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "max_body_bytes": 67108865}"#,
            "rules[1].max_body_bytes",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "zz"}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "b"}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "a", "scope": {"authority": false}}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "retry_after_seconds": 3}"#,
            "rules[1]",
        ),
    ];
    for (rule, field) in cases {
        let (got, reason) = rule_err(&format!("{OK_RULE}, {rule}"));
        assert!(
            got == *field || got.starts_with(&format!("{field}.")),
            "{rule}: field `{got}` ({reason}), expected `{field}`"
        );
    }
    // A chain of sharing names the rule that owns the records instead.
    let (field, reason) = rule_err(&format!(
        r#"{OK_RULE}, {{"name": "b", "match": {{"path_prefix": "/b"}}, "records_of": "a"}},
           {{"name": "c", "match": {{"path_prefix": "/c"}}, "records_of": "b"}}"#
    ));
    assert_eq!(field, "rules[2].records_of", "{reason}");
    // A bypassed rule has no records to share.
    let (field, _) = rule_err(
        r#"{"name": "s", "match": {"path_prefix": "/s"}, "bypass": true},
           {"name": "b", "match": {"path_prefix": "/b"}, "records_of": "s"}"#,
    );
    assert_eq!(field, "rules[1].records_of");
    // With etcd, a rule's replay cap must fit a record too.
    let (field, _) = cfg_err(&format!(
        r#"{{{ETCD}, "rules": [{{"name": "b", "match": {{"path_prefix": "/b"}}, "max_replay_body_bytes": 16777216}}]}}"#
    ));
    assert_eq!(field, "rules[0].max_replay_body_bytes");
    let (field, _) = cfg_err(r#"{"rules": {"name": "a"}}"#);
    assert_eq!(field, "rules");
    // The message names the field, so the one log line says which rule is wrong.
    let e = Config::parse(
        format!(r#"{{"rules": [{OK_RULE}, {{"name": "a", "match": {{"methods": ["PUT"]}}}}]}}"#)
            .as_bytes(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("rules[1].name"), "{e}");
    assert!(e.reason.contains("rules[0]"), "{}", e.reason);
}

#[test]
fn rules_inherit_the_top_level_fields_they_leave_out() {
    let c = Config::parse(
        br#"{"ttl_seconds": 600, "methods": ["POST"], "scope": {"headers": ["x-tenant"]},
             "key": {"headers": ["x-id"], "required": true},
             "rules": [
               {"name": "a", "match": {"path_prefix": "/a"}, "in_flight_timeout_seconds": 5},
               {"name": "b", "match": {"path_prefix": "/b"}, "key": {"json_pointer": "/id"}, "ttl_seconds": 7}
             ]}"#,
    )
    .unwrap();
    let (a, b) = (&c.rules[0].policy, &c.rules[1].policy);
    assert_eq!(
        (a.ttl_ms, a.in_flight_timeout_ms, a.key_required),
        (600_000, 5_000, true)
    );
    assert_eq!(a.key_headers, vec!["x-id"]);
    assert_eq!(a.scope_headers, vec!["x-tenant"]);
    assert_eq!(
        (a.rule.as_deref(), a.records.as_deref()),
        (Some("a"), Some("a"))
    );
    // An object given replaces the top-level one as a whole: built-in defaults inside.
    assert_eq!(b.key_headers, vec!["idempotency-key"]);
    assert_eq!(b.json_pointer.as_deref(), Some("/id"));
    assert!(!b.key_required);
    assert_eq!((b.ttl_ms, b.in_flight_timeout_ms), (7_000, 30_000));
    assert_eq!(b.methods, vec!["POST"]);
    assert_eq!(c.policy.rule, None);
    assert_eq!(c.policy.records, None);
}

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
    let p = rules("");
    let (_, mut env) = world();
    let search = req("POST", "/search").key("k").body("{}");
    for body in ["one", "two"] {
        assert_eq!(
            run(&p, &mut env, &search, ok(body)),
            Outcome::Upstream(200, body.as_bytes().to_vec())
        );
    }
    assert_eq!(env.count_of(Counter::Bypassed), 2);
    assert_eq!(env.count_of(Counter::Executed), 0);
    let mut s = send(&p, &mut env, &search).unwrap();
    assert_eq!(s.log_fields().map(|(v, _)| v), Some("bypassed"));
    assert_eq!(s.rule(&p), Some("search"));
    // Even a body far above max_body_bytes: the filter does not read it.
    let mut s = DedupStream::new(9);
    let a = s.on_request_headers(&p, &mut env, search.head.clone(), false);
    assert_eq!(a, Action::Continue);
    assert_eq!(
        s.on_request_body(&p, &mut env, 100 << 20, true, || None),
        Action::Continue
    );
}

#[test]
fn each_rule_has_its_own_records_and_the_same_key_runs_once_per_rule() {
    let p = plugin(
        r#"{"rules": [
             {"name": "a", "match": {"path_prefix": "/a"}},
             {"name": "b", "match": {"path_prefix": "/b"}},
             {"name": "b2", "match": {"path_prefix": "/c"}, "records_of": "b"},
             {"name": "top", "match": {"path_prefix": "/d"}, "records_of": "default"}
           ],
           "payload": {"parts": ["method", "body"]}}"#,
    );
    let (_, mut env) = world();
    let key = |path: &str| req("POST", path).key("same").body("{}");
    for path in ["/a", "/b", "/o"] {
        assert_eq!(
            run(&p, &mut env, &key(path), ok(path)),
            Outcome::Upstream(200, path.as_bytes().to_vec()),
            "{path}: another rule's record must not answer"
        );
    }
    // Sharing, as configured: /c reads b's records, /d the top level's.
    assert_eq!(run(&p, &mut env, &key("/c"), ok("no")).local().body, b"/b");
    assert_eq!(run(&p, &mut env, &key("/d"), ok("no")).local().body, b"/o");
    assert_eq!(
        run(&p, &mut env, &key("/a/x"), ok("no")).local().body,
        b"/a"
    );
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
    assert_eq!(
        run(&after, &mut env2, &pay, ok("twice")).local().body,
        b"paid"
    );
    assert_eq!(
        run(&after, &mut env2, &hook, ok("twice")).local().body,
        b"hooked"
    );
    // Renaming a rule is a new key space (its name is the records' identity).
    let renamed =
        plugin(r#"{"rules": [{"name": "payments-v2", "match": {"path_prefix": "/payments"}}]}"#);
    assert_eq!(
        run(&renamed, &mut env2, &pay, ok("again")),
        Outcome::Upstream(200, b"again".to_vec())
    );
}

#[test]
fn top_level_records_keep_their_digest_when_rules_are_added() {
    let (shared, mut env) = world();
    let r = req("POST", "/orders").key("o1");
    run(&plugin("{}"), &mut env, &r, ok("first"));
    let mut env2 = FakeEnv::new(shared, 4);
    env2.now_ms = env.now_ms;
    assert_eq!(
        run(&rules(""), &mut env2, &r, ok("no")).local().body,
        b"first"
    );
}

#[test]
fn the_example_policies_apply_per_route() {
    let p = rules("");
    let (_, mut env) = world();
    // payments: a key is required.
    let got = run(&p, &mut env, &req("POST", "/payments").body("{}"), ok("x"));
    assert_eq!(got.status(), 400);
    // other routes: no key passes (top-level default).
    assert!(matches!(
        run(&p, &mut env, &req("POST", "/orders").body("{}"), ok("x")),
        Outcome::Upstream(..)
    ));
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
    assert!(matches!(
        run(&p, &mut env, &req("GET", "/webhooks"), ok("x")),
        Outcome::Upstream(..)
    ));
}

#[test]
fn per_rule_ttl_in_flight_timeout_and_body_limit() {
    let p = plugin(
        r#"{"ttl_seconds": 3600, "in_flight_timeout_seconds": 60,
            "rules": [{"name": "short", "match": {"path_prefix": "/s"},
                       "ttl_seconds": 10, "in_flight_timeout_seconds": 2,
                       "max_body_bytes": 8, "max_replay_body_bytes": 3}]}"#,
    );
    let (_, mut env) = world();
    let short = req("POST", "/s").key("k").body("{}");
    let long = req("POST", "/l").key("k").body("{}");
    run(&p, &mut env, &short, ok("s1"));
    run(&p, &mut env, &long, ok("l1"));
    env.now_ms += 10_000;
    assert_eq!(
        run(&p, &mut env, &short, ok("s2")),
        Outcome::Upstream(200, b"s2".to_vec()),
        "the rule's TTL ended"
    );
    assert_eq!(run(&p, &mut env, &long, ok("no")).local().body, b"l1");
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
    assert!(matches!(
        run(&p, &mut env, &big, ok("x")),
        Outcome::Upstream(..)
    ));
    let r = req("POST", "/s").key("cap");
    run(&p, &mut env, &r, ok("four"));
    assert_eq!(
        run(&p, &mut env, &r, ok("no")).problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
}

#[test]
fn per_rule_on_duplicate() {
    let p = plugin(
        r#"{"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "on_duplicate": "reject"}]}"#,
    );
    let (_, mut env) = world();
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
        r#"{{{ETCD}, "ttl_seconds": 86400,
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
    assert_eq!(run(&p, &mut b, &short, ok("no")).local().body, b"s1");
    // Past the rule's TTL and its lease's slack, etcd itself has dropped the record;
    // the top level's lives on.
    b.now_ms += 120_000;
    assert_eq!(b.etcd.key_count(b.now_ms), 1);
    assert_eq!(
        run(&p, &mut b, &short, ok("s2")),
        Outcome::Upstream(200, b"s2".to_vec())
    );
    assert_eq!(run(&p, &mut b, &long, ok("no")).local().body, b"l1");
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

#[test]
fn the_admin_api_addresses_a_rules_records_by_name() {
    for (p, admin_p, mut env) in [
        (rules(""), rules(r#", "role": "admin""#), world().1),
        (
            plugin(&format!("{{{ETCD}, {EXAMPLE}}}")),
            plugin(&format!(r#"{{{ETCD}, "role": "admin", {EXAMPLE}}}"#)),
            two_proxies().0,
        ),
    ] {
        run(
            &p,
            &mut env,
            &req("POST", "/payments").key("k"),
            answer(201, "paid"),
        );
        run(
            &p,
            &mut env,
            &req("POST", "/orders").key("k"),
            answer(200, "top"),
        );
        let q = "key=k&authority=api.example";
        let got = admin(
            &admin_p,
            &mut env,
            "GET",
            &format!("/records?{q}&rule=payments"),
        );
        assert_eq!(got.status, 200, "{}", detail(&got));
        let v = admin_json(&got);
        assert_eq!(
            (v["status"].clone(), v["rule"].clone()),
            (201.into(), "payments".into())
        );
        assert_eq!(
            admin_json(&admin(&admin_p, &mut env, "GET", &format!("/records?{q}")))["status"],
            200
        );
        assert_eq!(
            admin(
                &admin_p,
                &mut env,
                "GET",
                &format!("/records?{q}&rule=webhooks")
            )
            .status,
            404
        );
        for bad in ["rule=nope", "rule=search"] {
            let got = admin(&admin_p, &mut env, "GET", &format!("/records?{q}&{bad}"));
            assert_eq!(got.status, 400, "{bad}");
        }
        assert!(detail(&admin(
            &admin_p,
            &mut env,
            "GET",
            &format!("/records?{q}&rule=nope")
        ))
        .contains("payments, webhooks, search"));
        // Purge the rule's record: the key runs again there, the top level's stays.
        let got = admin(
            &admin_p,
            &mut env,
            "DELETE",
            &format!("/records?{q}&rule=payments"),
        );
        assert_eq!(got.status, 200, "{}", detail(&got));
        // (With etcd, a worker keeps its copy of a completed record for up to 5 s.)
        env.now_ms += 5_000;
        assert!(matches!(
            run(
                &p,
                &mut env,
                &req("POST", "/payments").key("k"),
                ok("again")
            ),
            Outcome::Upstream(200, _)
        ));
        assert_eq!(
            run(&p, &mut env, &req("POST", "/orders").key("k"), ok("no"))
                .local()
                .body,
            b"top"
        );
    }
}

fn detail(r: &LocalReply) -> String {
    admin_json(r)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_readme_example_parses_and_means_what_it_says() {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("### Per-route policies").unwrap()..];
    let start = section.find("```json\n").unwrap() + "```json\n".len();
    let json = &section[start..start + section[start..].find("```").unwrap()];
    let c = Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{json}"));
    let names: Vec<&str> = c.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["payments", "webhooks", "search"]);
    let hook = &c.rules[1].policy;
    assert_eq!(
        hook.scope_headers,
        vec!["x-tenant"],
        "the top-level scope is kept"
    );
    assert_eq!(hook.ttl_ms, 604_800_000);
    assert!(hook.stores_status(200) && !hook.stores_status(404));
    assert!(c.rules[2].policy.bypass);
}
