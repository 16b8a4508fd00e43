//! Tests of the operator API through the plugin, on both stores: listing, lookups,
//! purges, parameters, ages, and a rule's records by name.

use crate::fake::FakeEnv;
use crate::key::{record_digest, ClientKey, KeySource};
use crate::metrics::Counter;
use crate::reply::LocalReply;
use crate::stream::CallAnswer;
use crate::stream::{Decision, Plugin};
use crate::testing::*;

fn check_admin_api(p: &Plugin, admin_p: &Plugin, env: &mut FakeEnv) {
    let r = req("POST", "/o")
        .key("done")
        .header("x-tenant", "acme")
        .body("{}");
    assert!(run(p, env, &r, answer(201, "made")).reached_upstream());
    let flying = req("POST", "/o").key("flying").header("x-tenant", "acme");
    let _first = send(p, env, &flying).unwrap();
    let q = "authority=api.example&scope.x-tenant=acme";
    let got = admin(admin_p, env, "GET", &format!("/records?key=done&{q}"));
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    let v = admin_json(&got);
    assert_eq!(v["state"], "completed");
    assert_eq!(v["status"], 201);
    assert_eq!(v["body_bytes"], 4);
    // Another tenant's parameters name another record.
    let other = admin(
        admin_p,
        env,
        "GET",
        "/records?key=done&authority=api.example&scope.x-tenant=globex",
    );
    assert_eq!(other.status, 404);
    let v = admin_json(&admin(
        admin_p,
        env,
        "GET",
        &format!("/records?key=flying&{q}"),
    ));
    assert_eq!(v["state"], "in_flight");
    // A claim is removed only with force.
    let refused = admin(admin_p, env, "DELETE", &format!("/records?key=flying&{q}"));
    assert_eq!(refused.status, 409);
    let forced = admin(
        admin_p,
        env,
        "DELETE",
        &format!("/records?key=flying&{q}&force=true"),
    );
    assert_eq!(
        forced.status,
        200,
        "{}",
        String::from_utf8_lossy(&forced.body)
    );
    assert!(run(p, env, &flying, ok("again")).reached_upstream());
    // Purged: the key executes again (etcd: once workers' copies have aged out).
    assert_eq!(
        admin(admin_p, env, "DELETE", &format!("/records?key=done&{q}")).status,
        200
    );
    assert_eq!(
        admin(admin_p, env, "GET", &format!("/records?key=done&{q}")).status,
        404
    );
    env.now_ms += crate::stores::etcd::local::MAX_AGE_MS;
    assert!(run(p, env, &r, ok("second")).reached_upstream());
    // Bad and foreign requests.
    assert_eq!(
        admin(admin_p, env, "GET", "/records?authority=a").status,
        400
    );
    assert_eq!(
        admin(admin_p, env, "GET", "/records?key=k").status,
        400,
        "authority missing"
    );
    assert_eq!(
        admin(
            admin_p,
            env,
            "GET",
            "/records?key=k&authority=a&scope.x-other=1"
        )
        .status,
        400
    );
    assert_eq!(
        admin(admin_p, env, "POST", "/records?key=k&authority=a").status,
        400
    );
    let data = admin(admin_p, env, "POST", "/o");
    assert_eq!(data.status, 404);
    assert!(String::from_utf8_lossy(&data.body).contains("not-admin-path"));
    let stats = admin(admin_p, env, "GET", "/stats");
    assert_eq!(stats.status, 200);
    assert!(admin_json(&stats).is_object());
}

#[test]
fn the_admin_api_inspects_and_purges_shared_data_records() {
    let p = plugin(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let admin_p = plugin(r#"{"role": "admin", "scope": {"headers": ["x-tenant"]}}"#);
    let (_, mut env) = world();
    check_admin_api(&p, &admin_p, &mut env);
    let v = admin_json(&admin(&admin_p, &mut env, "GET", "/stats"));
    assert_eq!(v["completed"], 2);
    assert_eq!(v["in_flight"], 0);
    assert_eq!(env.count_of(Counter::AdminRemoved), 2);
}

#[test]
fn the_admin_api_inspects_and_purges_etcd_records() {
    let p = etcd_plugin(r#""scope": {"headers": ["x-tenant"]}"#);
    let admin_p = etcd_plugin(r#""role": "admin", "scope": {"headers": ["x-tenant"]}"#);
    let (mut a, _) = two_proxies();
    check_admin_api(&p, &admin_p, &mut a);
    let v = admin_json(&admin(&admin_p, &mut a, "GET", "/stats"));
    assert_eq!(v["records"], 2);
}

/// The operator API's answer to `method /records?{query}` on the default authority.
fn records(admin_p: &Plugin, env: &mut FakeEnv, method: &str, query: &str) -> LocalReply {
    admin(
        admin_p,
        env,
        method,
        &format!("/records?{query}&authority=api.example"),
    )
}

#[test]
fn admin_parameters_are_percent_decoded() {
    let p = plugin("{}");
    let admin_p = plugin(r#"{"role": "admin"}"#);
    let (_, mut env) = world();
    for key in ["a/b c", "é+x"] {
        assert!(run(&p, &mut env, &req("POST", "/o").key(key), ok(key)).reached_upstream());
    }
    let digest = |key: &str| {
        let d = record_digest(
            &p.config.policy,
            &req("POST", "/o").key(key).head,
            &ClientKey {
                source: KeySource::Header,
                value: key.as_bytes().to_vec(),
            },
        );
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    for (query, key) in [
        ("key=a%2Fb+c", "a/b c"),
        ("key=a%2fb%20c", "a/b c"),
        ("key=%C3%A9%2Bx", "é+x"),
        ("k%65y=a%2Fb+c", "a/b c"),
    ] {
        let got = records(&admin_p, &mut env, "GET", query);
        assert_eq!(got.status, 200, "{query}: {}", detail(&got));
        assert_eq!(admin_json(&got)["record"], digest(key), "{query}");
    }
    for query in ["key=a%2", "key=a%zzb", "key=%C3", "key=%"] {
        let got = records(&admin_p, &mut env, "GET", query);
        assert_eq!(got.status, 400, "{query}");
    }
    // The record named in a 404 is the digest of the parameters.
    let missing = records(&admin_p, &mut env, "GET", "key=none");
    assert_eq!(missing.status, 404);
    assert!(
        detail(&missing).contains(&digest("none")),
        "{}",
        detail(&missing)
    );
}

#[test]
fn admin_force_is_true_or_1_only() {
    let p = plugin("{}");
    let admin_p = plugin(r#"{"role": "admin"}"#);
    let (_, mut env) = world();
    for (i, (force, removed)) in [("yes", false), ("0", false), ("1", true), ("true", true)]
        .into_iter()
        .enumerate()
    {
        let key = format!("k{i}");
        let _flying = send(&p, &mut env, &req("POST", "/o").key(&key)).unwrap();
        let got = records(
            &admin_p,
            &mut env,
            "DELETE",
            &format!("key={key}&force={force}"),
        );
        assert_eq!(got.status == 200, removed, "force={force}: {}", got.status);
    }
}

#[test]
fn admin_ages_count_from_the_claim_or_the_completion() {
    let admin_of = |p: &Plugin| {
        let mut c = p.config.clone();
        c.role = crate::config::Role::Admin;
        Plugin::new(c)
    };
    for (p, mut env) in [
        (plugin("{}"), world().1),
        (etcd_plugin(""), two_proxies().0),
    ] {
        let admin_p = admin_of(&p);
        let _flying = send(&p, &mut env, &req("POST", "/o").key("f")).unwrap();
        run(&p, &mut env, &req("POST", "/o").key("d"), ok("x"));
        env.now_ms += 1_234;
        for key in ["f", "d"] {
            let got = records(&admin_p, &mut env, "GET", &format!("key={key}"));
            assert_eq!(got.status, 200, "{key}: {}", detail(&got));
            assert_eq!(admin_json(&got)["age_ms"], 1_234, "{key}");
        }
    }
}

#[test]
fn admin_on_etcd_reads_without_deleting_and_gives_up_on_a_record_that_keeps_changing() {
    let p = etcd_plugin(r#""ttl_seconds": 10"#);
    let admin_p = etcd_plugin(r#""role": "admin", "ttl_seconds": 10"#);
    let (mut a, _) = two_proxies();
    let r = req("POST", "/o").key("k");
    let (_, mut b) = two_proxies();
    b.etcd = a.etcd.clone();
    // The first record etcd ever wrote (mod revision 1): a read must not remove it.
    let first = send(&p, &mut a, &r).unwrap();
    let q = "/records?key=k&authority=api.example";
    for _ in 0..2 {
        let got = admin(&admin_p, &mut a, "GET", q);
        assert_eq!(admin_json(&got)["state"], "in_flight");
    }
    assert_eq!(run(&p, &mut b, &r, ok("twice")).status(), 409);
    respond(&p, &mut a, first, ok("kept"));
    run(&p, &mut b, &r, ok("no")).assert_replays(b"kept");
    // Past its TTL by this proxy's clock (still in etcd): not a live record.
    a.now_ms += 10_000;
    assert_eq!(admin(&admin_p, &mut a, "GET", q).status, 404);
    a.now_ms -= 10_000;
    // A DELETE whose record changes under it every time: five reads, then 503.
    let mut s = crate::admin::AdminStream::default();
    let mut action = s.on_request(&admin_p, &mut a, "DELETE", q.as_bytes(), "peer");
    let Decision::Call(first) = &action else {
        panic!("{action:?}")
    };
    let read = first.body.clone();
    let read_path = first.path;
    let mut answers = 0;
    while let Decision::Call(_) = action {
        // Whatever was asked, etcd's answer shows the record as it is (not removed).
        let (status, body) = a.etcd.handle(read_path, &read, a.now_ms);
        answers += 1;
        action = s.on_store_answer(
            &admin_p,
            &mut a,
            CallAnswer {
                status,
                body,
                ..Default::default()
            },
        );
        assert!(answers < 10);
    }
    assert_eq!(answers, 5);
    assert!(
        matches!(action, Decision::Reply(ref r) if r.status == 503),
        "{action:?}"
    );
    // etcd's own errors are named in the answer.
    let mut s = crate::admin::AdminStream::default();
    assert!(matches!(
        s.on_request(&admin_p, &mut a, "GET", q.as_bytes(), "peer"),
        Decision::Call(_)
    ));
    let e = s.on_store_answer(
        &admin_p,
        &mut a,
        CallAnswer {
            status: 0,
            body: crate::stores::etcd::pb::status_body(8, b"etcdserver: too many requests"),
            ..Default::default()
        },
    );
    let Decision::Reply(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.status, 503);
    assert!(detail(&e).contains("too many requests"), "{}", detail(&e));
}

#[test]
fn admin_stats_and_lookups_on_shared_data() {
    let p = plugin(r#"{"capacity": 48, "ttl_seconds": 10}"#);
    let admin_p = plugin(r#"{"role": "admin", "capacity": 48, "ttl_seconds": 10}"#);
    let (_, mut env) = world();
    let v = admin_json(&admin(&admin_p, &mut env, "GET", "/stats"));
    assert_eq!(
        (v["buckets"].as_u64(), v["capacity"].as_u64()),
        (Some(3), Some(48))
    );
    // Another key in the same bucket is not this one; an expired record is not live.
    run(&p, &mut env, &req("POST", "/o").key("k"), ok("x"));
    let q = |k: &str| format!("/records?key={k}&authority=api.example");
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("k")).status, 200);
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("other")).status, 404);
    env.now_ms += 10_000;
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("k")).status, 404);
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
        let rule_records = |env: &mut FakeEnv, method: &str, rule: &str| {
            admin(&admin_p, env, method, &format!("/records?{q}{rule}"))
        };
        let got = rule_records(&mut env, "GET", "&rule=payments");
        assert_eq!(got.status, 200, "{}", detail(&got));
        let v = admin_json(&got);
        assert_eq!(
            (v["status"].clone(), v["rule"].clone()),
            (201.into(), "payments".into())
        );
        assert_eq!(
            admin_json(&rule_records(&mut env, "GET", ""))["status"],
            200
        );
        assert_eq!(rule_records(&mut env, "GET", "&rule=webhooks").status, 404);
        for bad in ["rule=nope", "rule=search"] {
            let got = rule_records(&mut env, "GET", &format!("&{bad}"));
            assert_eq!(got.status, 400, "{bad}");
        }
        assert!(detail(&rule_records(&mut env, "GET", "&rule=nope"))
            .contains("payments, webhooks, search"));
        // Purge the rule's record: the key runs again there, the top level's stays.
        let got = rule_records(&mut env, "DELETE", "&rule=payments");
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

/// Issue 21: records scoped by a pseudo-header are found and purged through
/// `scope.:authority`, `scope.:path` and `scope.:method`.
#[test]
fn admin_finds_and_purges_records_scoped_by_each_pseudo_header() {
    for (scope, param) in [
        (":authority", "scope.:authority=Api.Example"),
        (":path", "scope.:path=/orders%3Fx%3D1"),
        (":method", "scope.:method=PUT"),
    ] {
        let data = format!(
            r#"{{"scope": {{"authority": false, "headers": ["{scope}"]}}, "methods": ["POST", "PUT"]}}"#
        );
        let p = plugin(&data);
        let admin_p = plugin(&format!(r#"{{"role": "admin", {}"#, &data[1..]));
        let (_, mut env) = world();
        let mut r = req("PUT", "/orders?x=1").key("k");
        r.head.authority = "Api.Example".into();
        assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
        let q = format!("/records?key=k&{param}");
        let got = admin(&admin_p, &mut env, "GET", &q);
        assert_eq!(got.status, 200, "{scope}: {}", detail(&got));
        assert_eq!(admin_json(&got)["state"], "completed", "{scope}");
        // Another value of the pseudo-header is another record.
        let other = q
            .replace("Api.Example", "api.example")
            .replace("%3D1", "%3D2")
            .replace("PUT", "POST");
        assert_eq!(
            admin(&admin_p, &mut env, "GET", &other).status,
            404,
            "{scope}"
        );
        // Left out: the record cannot be named.
        let missing = admin(&admin_p, &mut env, "GET", "/records?key=k");
        assert_eq!(missing.status, 400, "{scope}");
        assert!(
            detail(&missing).contains(scope),
            "{scope}: {}",
            detail(&missing)
        );
        assert_eq!(
            admin(&admin_p, &mut env, "DELETE", &q).status,
            200,
            "{scope}"
        );
        assert_eq!(admin(&admin_p, &mut env, "GET", &q).status, 404, "{scope}");
        assert!(
            run(&p, &mut env, &r, ok("b")).reached_upstream(),
            "{scope}: purged"
        );
    }
}

#[test]
fn admin_authority_and_a_scope_authority_must_agree() {
    let data = r#""scope": {"headers": [":authority", "x-tenant"]}"#;
    let p = plugin(&format!("{{{data}}}"));
    let admin_p = plugin(&format!(r#"{{"role": "admin", {data}}}"#));
    let (_, mut env) = world();
    let r = req("POST", "/o")
        .key("k")
        .header_bytes("x-tenant", b"acme\xff");
    assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
    // Either parameter gives the one authority; a scope value may be any bytes.
    for q in [
        "key=k&authority=api.example&scope.x-tenant=acme%FF",
        "key=k&scope.:authority=api.example&scope.x-tenant=acme%FF",
        "key=k&authority=api.example&scope.:authority=api.example&scope.x-tenant=acme%FF",
    ] {
        let got = admin(&admin_p, &mut env, "GET", &format!("/records?{q}"));
        assert_eq!(got.status, 200, "{q}: {}", detail(&got));
    }
    for q in [
        "key=k&authority=api.example&scope.x-tenant=acme%FE",
        "key=k&authority=api.example&scope.x-tenant=acme%EF%BF%BD",
    ] {
        assert_eq!(
            admin(&admin_p, &mut env, "GET", &format!("/records?{q}")).status,
            404,
            "{q}"
        );
    }
    let got = admin(
        &admin_p,
        &mut env,
        "GET",
        "/records?key=k&authority=api.example&scope.:authority=other.example",
    );
    assert_eq!(got.status, 400);
    assert!(detail(&got).contains("differ"), "{}", detail(&got));
    let got = admin(
        &admin_p,
        &mut env,
        "GET",
        "/records?key=k&authority=a&scope.x-tenant=1&scope.x-tenant=2",
    );
    assert_eq!(got.status, 400);
    assert!(detail(&got).contains("twice"), "{}", detail(&got));
}
