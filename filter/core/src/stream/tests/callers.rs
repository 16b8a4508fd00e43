//! Callers (`principal`): a record's replay goes only to the caller that made it, a
//! keyless request of another caller is its own operation, and nothing runs twice, on
//! both stores.

use crate::fake::FakeEnv;
use crate::metrics::Counter;
use crate::testing::*;

const MISMATCH: &str = "urn:proxy-dedup:problem:principal-mismatch";

fn keyed(key: &str, auth: &str) -> Req {
    req("POST", "/orders")
        .key(key)
        .header("authorization", auth)
        .body(r#"{"amount": 10}"#)
}

/// The plugins to run a case on: shared data, and etcd (two proxies on one etcd).
fn stores(extra: &str) -> Vec<(&'static str, crate::Plugin, FakeEnv, FakeEnv)> {
    let sep = if extra.is_empty() { "" } else { ", " };
    let (a, b) = two_workers();
    let (c, d) = two_proxies();
    vec![
        ("shared data", plugin(&format!("{{{extra}}}")), a, b),
        (
            "etcd",
            etcd_plugin(&format!("{extra}{sep}\"failure_mode\": \"closed\"")),
            c,
            d,
        ),
    ]
}

#[test]
fn another_callers_duplicate_never_gets_the_stored_response() {
    for (store, p, mut a, mut b) in stores("") {
        let alice = keyed("k-shared", "Bearer alice-token");
        assert_eq!(
            run(&p, &mut a, &alice, ok("alice-order")),
            executed("alice-order")
        );
        // Mallory, same key and body, through either proxy or worker: refused, unforwarded.
        for env in [&mut a, &mut b] {
            let got = run(
                &p,
                env,
                &keyed("k-shared", "Bearer mallory-token"),
                ok("ran"),
            );
            assert_eq!(
                (got.status(), got.problem_type()),
                (422, MISMATCH.into()),
                "{store}"
            );
            assert!(
                !got.local().body.windows(5).any(|w| w == b"alice"),
                "{store}"
            );
        }
        assert_eq!(
            a.count_of(Counter::PrincipalMismatch) + b.count_of(Counter::PrincipalMismatch),
            2,
            "{store}"
        );
        // Without credentials at all: another caller too.
        let anon = req("POST", "/orders")
            .key("k-shared")
            .body(r#"{"amount": 10}"#);
        assert_eq!(
            run(&p, &mut b, &anon, ok("ran")).problem_type(),
            MISMATCH,
            "{store}"
        );
        // Alice's own retry is still replayed, on both.
        run(&p, &mut a, &alice, ok("no")).assert_replays(b"alice-order");
        run(&p, &mut b, &alice, ok("no")).assert_replays(b"alice-order");
        // Another payload of Alice's is still a payload mismatch.
        let other = req("POST", "/orders")
            .key("k-shared")
            .header("authorization", "Bearer alice-token")
            .body(r#"{"amount": 11}"#);
        assert_eq!(run(&p, &mut a, &other, ok("no")).status(), 422);
        assert_eq!(
            run(&p, &mut a, &other, ok("no")).problem_type(),
            "urn:proxy-dedup:problem:payload-mismatch"
        );
    }
}

#[test]
fn another_caller_never_waits_on_or_joins_a_record_in_flight() {
    let p = plugin(r#"{"on_in_flight": "wait"}"#);
    let (mut a, mut b) = two_workers();
    let _first = send(&p, &mut a, &keyed("k", "Bearer alice")).unwrap();
    let got = run(&p, &mut b, &keyed("k", "Bearer mallory"), ok("ran"));
    assert_eq!((got.status(), got.problem_type()), (422, MISMATCH.into()));
    assert_eq!(b.count_of(Counter::Waited), 0);
}

#[test]
fn a_refreshed_token_is_refused_never_run_twice() {
    for (store, p, mut a, mut b) in stores("") {
        let first = keyed("k-pay", "Bearer token-1");
        assert_eq!(run(&p, &mut a, &first, ok("charged")), executed("charged"));
        let refreshed = keyed("k-pay", "Bearer token-2");
        for env in [&mut a, &mut b] {
            let got = run(&p, env, &refreshed, ok("charged again"));
            assert_eq!(got.problem_type(), MISMATCH, "{store}");
            let v: serde_json::Value = serde_json::from_slice(&got.local().body).unwrap();
            assert!(
                v["detail"].as_str().unwrap().contains("refreshed token"),
                "{store}: {v}"
            );
        }
    }
}

#[test]
fn a_stable_principal_replays_across_token_refreshes() {
    let jwt =
        r#""principal": {"metadata": ["envoy.filters.http.jwt_authn", "jwt_payload", "sub"]}"#;
    let property = "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0sub";
    for (store, p, mut a, mut b) in stores(jwt) {
        assert_eq!(
            p.config.metadata_properties.to_vec(),
            vec![property.to_string()]
        );
        let of = |token: &str, sub: &str| keyed("k-jwt", token).property(property, sub);
        assert_eq!(
            run(&p, &mut a, &of("Bearer t1", "user-1"), ok("done")),
            executed("done")
        );
        // A refreshed token of the same subject: replayed.
        run(&p, &mut b, &of("Bearer t2", "user-1"), ok("no")).assert_replays(b"done");
        // Another subject: refused.
        let other = run(&p, &mut b, &of("Bearer t1", "user-2"), ok("no"));
        assert_eq!(other.problem_type(), MISMATCH, "{store}");
    }
    // An API key header, and a cookie.
    for (src, of) in [
        (
            r#""principal": {"header": "x-api-key"}"#,
            ("x-api-key", "key-1", "key-2"),
        ),
        (
            r#""principal": {"cookie": "sid"}"#,
            ("cookie", "theme=a; sid=s1", "sid=s2"),
        ),
    ] {
        let (p, mut env) = one_worker(&format!("{{{src}}}"));
        let (name, mine, theirs) = of;
        let mk = |v: &str, auth: &str| keyed("k2", auth).header(name, v);
        assert!(run(&p, &mut env, &mk(mine, "Bearer 1"), ok("x")).reached_upstream());
        run(&p, &mut env, &mk(mine, "Bearer 2"), ok("no")).assert_replays(b"x");
        assert_eq!(
            run(&p, &mut env, &mk(theirs, "Bearer 1"), ok("no")).problem_type(),
            MISMATCH
        );
    }
}

#[test]
fn keyless_requests_of_two_callers_are_two_operations() {
    let fp = r#""key": {"fingerprint": ["method", "path", "body"]}"#;
    for (store, p, mut a, mut b) in stores(fp) {
        let checkout = |auth: &str| {
            req("POST", "/cart/checkout")
                .header("authorization", auth)
                .body("{}")
        };
        assert_eq!(
            run(&p, &mut a, &checkout("Bearer bob"), ok("bob")),
            executed("bob")
        );
        // Carol's identical request runs: it is her checkout.
        assert_eq!(
            run(&p, &mut b, &checkout("Bearer carol"), ok("carol")),
            executed("carol"),
            "{store}"
        );
        // Each retry gets its own caller's answer, through either.
        run(&p, &mut a, &checkout("Bearer carol"), ok("no")).assert_replays(b"carol");
        run(&p, &mut b, &checkout("Bearer bob"), ok("no")).assert_replays(b"bob");
        // A request without credentials is a caller of its own too.
        let anon = req("POST", "/cart/checkout").body("{}");
        assert_eq!(
            run(&p, &mut a, &anon, ok("anon")),
            executed("anon"),
            "{store}"
        );
        run(&p, &mut b, &anon, ok("no")).assert_replays(b"anon");
        assert_eq!(a.count_of(Counter::PrincipalMismatch), 0, "{store}");
    }
}

#[test]
fn principal_none_shares_a_key_across_callers() {
    let (p, mut env) = one_worker(r#"{"principal": {"none": true}}"#);
    run(&p, &mut env, &keyed("k", "Bearer a"), ok("one"));
    run(&p, &mut env, &keyed("k", "Bearer b"), ok("no")).assert_replays(b"one");
}

/// With callers off, keyless requests of any caller with the same fingerprint are one
/// operation, as before callers were recorded.
#[test]
fn principal_none_makes_identical_keyless_requests_one_operation() {
    let fp = r#""key": {"fingerprint": ["method", "path", "body"]}"#;
    let (p, mut env) = one_worker(&format!(r#"{{{fp}, "principal": {{"none": true}}}}"#));
    let checkout = |auth: &str| {
        req("POST", "/cart/checkout")
            .header("authorization", auth)
            .body("{}")
    };
    assert_eq!(
        run(&p, &mut env, &checkout("Bearer bob"), ok("bob")),
        executed("bob")
    );
    run(&p, &mut env, &checkout("Bearer carol"), ok("no")).assert_replays(b"bob");
    assert_eq!(env.count_of(Counter::Executed), 1);
}

/// A record written before records named their caller holds the payload digest itself.
/// Found again after the upgrade, it never runs again: a request without credentials is
/// replayed as before; one with credentials is refused (whose it was is unknown).
#[test]
fn a_record_from_before_callers_never_runs_again() {
    for fp in [false, true] {
        let cfg = if fp {
            r#""key": {"fingerprint": ["method", "path", "body"]}, "failure_mode": "closed""#
        } else {
            r#""failure_mode": "closed""#
        };
        let p = etcd_plugin(cfg);
        let (mut a, mut b) = two_proxies();
        let mk = |auth: Option<&str>| {
            let r = req("POST", "/orders").body("{}");
            let r = if fp { r } else { r.key("old") };
            match auth {
                Some(v) => r.header("authorization", v),
                None => r,
            }
        };
        assert_eq!(run(&p, &mut a, &mk(None), ok("before")), executed("before"));
        // As the previous version wrote it: the payload digest, unsealed.
        a.etcd.rewrite_records(|digest, rec| {
            let mark = crate::principal::seal(&[0; 32], digest, None);
            for (b, m) in rec.payload.iter_mut().zip(mark) {
                *b ^= m;
            }
        });
        // Another proxy (no tier): a request without credentials is replayed...
        run(&p, &mut b, &mk(None), ok("no")).assert_replays(b"before");
        // ...one with credentials is refused, in keyless mode too (never its own record).
        let (_, mut c) = two_proxies();
        c.etcd = a.etcd.clone();
        let got = run(&p, &mut c, &mk(Some("Bearer alice")), ok("again"));
        assert_eq!(
            (got.status(), got.problem_type()),
            (422, MISMATCH.into()),
            "fp {fp}"
        );
        let v: serde_json::Value = serde_json::from_slice(&got.local().body).unwrap();
        assert!(
            v["detail"].as_str().unwrap().contains("named no caller"),
            "{v}"
        );
    }
}

/// Keyless: a caller's operation lives in one record of its own, whatever becomes of
/// another caller's identical request: when Bob's is released (his upstream answered
/// 503), Carol's retry is still her replay, never a second run.
#[test]
fn a_keyless_callers_retry_never_runs_again_when_another_callers_record_goes() {
    let fp = r#""key": {"fingerprint": ["method", "path", "body"]}"#;
    for (store, p, mut a, mut b) in stores(fp) {
        let checkout = |auth: &str| {
            req("POST", "/cart/checkout")
                .header("authorization", auth)
                .body("{}")
        };
        let bob = send(&p, &mut a, &checkout("Bearer bob")).unwrap();
        assert_eq!(
            run(&p, &mut b, &checkout("Bearer carol"), ok("carol")),
            executed("carol"),
            "{store}"
        );
        respond(&p, &mut a, bob, answer(503, "busy"));
        for env in [&mut a, &mut b] {
            run(&p, env, &checkout("Bearer carol"), ok("again")).assert_replays(b"carol");
        }
        assert_eq!(
            run(&p, &mut a, &checkout("Bearer bob"), ok("bob")),
            executed("bob"),
            "{store}: Bob's released request runs"
        );
    }
}
