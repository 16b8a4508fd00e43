//! Detached execution (`upstream.detached`): the first execution is a call the filter
//! makes itself; its answer completes the record whether or not the client is still
//! there, and the client is answered with it. Both stores.

use crate::metrics::Counter;
use crate::reply::LocalReply;
use crate::stream::{CallAnswer, Decision, DedupStream, Plugin};
use crate::testing::*;

const DETACHED: &str = r#""upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000}"#;

fn plugins() -> Vec<(&'static str, Plugin)> {
    vec![
        ("shared", plugin(&format!("{{{DETACHED}}}"))),
        ("etcd", etcd_plugin(DETACHED)),
    ]
}

fn env_for(store: &str) -> crate::fake::FakeEnv {
    if store == "etcd" {
        two_proxies().0
    } else {
        world().1
    }
}

/// Sends `r` and expects the detached call (never a plain forward).
fn sent_detached(p: &Plugin, env: &mut crate::fake::FakeEnv, r: &Req) -> DedupStream {
    let s = send(p, env, r).unwrap();
    assert!(s.detached(), "the first execution is a detached call");
    s
}

fn reply_of(d: Decision) -> LocalReply {
    match d {
        Decision::Reply(r) => r,
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn the_client_gets_the_calls_answer_and_a_retry_gets_its_replay() {
    for (store, p) in plugins() {
        let mut env = env_for(store);
        let r = req("POST", "/charges").key("k").body(r#"{"amount": 5}"#);
        let mut s = sent_detached(&p, &mut env, &r);
        let got = reply_of(detached_answer(
            &p,
            &mut env,
            &mut s,
            call_answer(201, "ch_1"),
        ));
        assert_eq!(
            (got.status, got.body.as_slice()),
            (201, &b"ch_1"[..]),
            "{store}"
        );
        assert_eq!(got.header("idempotent-replayed"), None, "{store}");
        assert_eq!(got.header(":status"), None, "{store}: no pseudo-headers");
        assert_eq!(got.header("content-type"), Some(&b"text/plain"[..]));
        run(&p, &mut env, &r, ok("no")).assert_replays(b"ch_1");
        assert_eq!(
            counts(
                &env,
                [Counter::Executed, Counter::Detached, Counter::Replayed]
            ),
            [1, 1, 1],
            "{store}"
        );
    }
}

#[test]
fn a_client_that_leaves_still_has_its_call_complete_the_record() {
    for (store, p) in plugins() {
        let mut env = env_for(store);
        let r = req("POST", "/charges").key("gone").body("{}");
        let mut s = sent_detached(&p, &mut env, &r);
        // The client hangs up: the stream ends while the call is out.
        let own = crate::stream::Origin::default();
        assert_eq!(s.on_stream_end(&p, &mut env, &own), None, "{store}");
        assert!(s.detached(), "{store}: the call goes on");
        // Meanwhile its retries are told it is in flight, never run.
        assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409, "{store}");
        env.now_ms += 3_000;
        let _ = detached_answer(&p, &mut env, &mut s, call_answer(200, "done"));
        run(&p, &mut env, &r, ok("no")).assert_replays(b"done");
        assert_eq!(env.count_of(Counter::DetachedClientGone), 1, "{store}");
        assert_eq!(env.count_of(Counter::Executed), 1, "{store}");
    }
}

#[test]
fn a_call_that_never_reached_the_upstream_is_released_one_that_may_have_is_kept() {
    for (store, p) in plugins() {
        let mut env = env_for(store);
        // Connection refused: Envoy's 503 says the connection failed; a 5xx releases.
        let r = req("POST", "/charges").key("refused").body("{}");
        let mut s = sent_detached(&p, &mut env, &r);
        let refused = CallAnswer {
            status: 503,
            body: b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure".to_vec(),
            headers: vec![(":status".into(), b"503".to_vec())],
        };
        let got = reply_of(detached_answer(&p, &mut env, &mut s, refused));
        assert_eq!(got.status, 503, "{store}");
        let again = send(&p, &mut env, &r).unwrap();
        assert!(again.detached(), "{store}: released, the retry runs");
        // A reset after sending (no headers) and a timeout: unknown, kept.
        for (key, unknown) in [
            ("reset", CallAnswer::default()),
            (
                "timeout",
                CallAnswer {
                    status: 504,
                    body: b"upstream request timeout".to_vec(),
                    headers: vec![(":status".into(), b"504".to_vec())],
                },
            ),
        ] {
            let r = req("POST", "/charges").key(key).body("{}");
            let mut s = sent_detached(&p, &mut env, &r);
            let got = reply_of(detached_answer(&p, &mut env, &mut s, unknown));
            assert_eq!(got.status, 502, "{store} {key}");
            assert_eq!(
                crate::testing::problem_of(&got),
                "urn:proxy-dedup:problem:upstream-failed",
                "{store} {key}"
            );
            env.now_ms += 60_000;
            let dup = run(&p, &mut env, &r, ok("no"));
            assert_eq!(
                dup.problem_type(),
                "urn:proxy-dedup:problem:outcome-unknown",
                "{store} {key}"
            );
        }
    }
}

#[test]
fn a_call_that_cannot_be_dispatched_releases_the_claim() {
    for (store, p) in plugins() {
        let mut env = env_for(store);
        let r = req("POST", "/charges").key("bad-cluster").body("{}");
        let mut s = sent_detached(&p, &mut env, &r);
        let d = s.on_upstream_unsent(&p, &mut env);
        let got = reply_of(settle(&p, &mut env, &mut s, d));
        assert_eq!(got.status, 503, "{store}");
        assert!(send(&p, &mut env, &r).unwrap().detached(), "{store}");
        assert_eq!(env.count_of(Counter::Released), 1, "{store}");
    }
}

#[test]
fn detached_needs_a_cluster_and_a_timeout_below_the_in_flight_timeout() {
    let err = |json: &str| {
        crate::config::Config::parse(json.as_bytes())
            .unwrap_err()
            .field
    };
    assert_eq!(
        err(r#"{"upstream": {"detached": true}}"#),
        "upstream.cluster"
    );
    assert_eq!(
        err(r#"{"upstream": {"detached": true, "cluster": "a", "timeout_ms": 30000}}"#),
        "upstream.timeout_ms"
    );
    assert_eq!(
        err(r#"{"upstream": {"cluster": "a"}}"#),
        "upstream.detached"
    );
    assert_eq!(
        err(r#"{"upstream": {"detached": true, "cluster": "a"},
               "rules": [{"name": "r", "match": {"path_prefix": "/r"}, "in_flight_timeout_seconds": 5}]}"#),
        "rules[0].upstream.timeout_ms"
    );
    let p = plugin(
        r#"{"rules": [{"name": "pay", "match": {"path_prefix": "/pay"},
                      "upstream": {"detached": true, "cluster": "payments"}}]}"#,
    );
    let d = p.config.rules[0].policy.detached.clone().unwrap();
    assert_eq!((d.cluster.as_str(), d.timeout_ms), ("payments", 10_000));
    assert_eq!(p.config.policy.detached, None);
}

#[test]
fn at_the_client_deadline_the_client_gets_504_still_running_and_the_call_goes_on() {
    let deadline = r#""upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000,
                      "client_timeout_ms": 1000}"#;
    for (store, p) in [
        ("shared", plugin(&format!("{{{deadline}}}"))),
        ("etcd", etcd_plugin(deadline)),
    ] {
        let mut env = env_for(store);
        let r = req("POST", "/charges").key("slow").body("{}");
        let mut s = sent_detached(&p, &mut env, &r);
        assert_eq!(env.waiters.len(), 1, "{store}: the deadline is on the tick");
        env.now_ms += 999;
        assert_eq!(s.on_wake(&p, &mut env), Decision::Pause, "{store}");
        env.now_ms += 1;
        let got = reply_of(s.on_wake(&p, &mut env));
        assert_eq!(got.status, 504, "{store}");
        assert_eq!(problem_of(&got), "urn:proxy-dedup:problem:still-running");
        assert!(s.detached(), "{store}: the call goes on");
        assert_eq!(env.waiters.len(), 0, "{store}");
        // The call answers later: the record completes, no second answer to the client.
        env.now_ms += 2_000;
        let after = detached_answer(&p, &mut env, &mut s, call_answer(201, "ch_9"));
        assert_eq!(
            after,
            Decision::Pause,
            "{store}: the client already has its answer"
        );
        run(&p, &mut env, &r, ok("no")).assert_replays(b"ch_9");
        assert_eq!(env.count_of(Counter::Executed), 1, "{store}");
    }
}

#[test]
fn a_client_deadline_must_be_below_the_call_timeout() {
    let err = |json: &str| {
        crate::config::Config::parse(json.as_bytes())
            .unwrap_err()
            .field
    };
    assert_eq!(
        err(
            r#"{"upstream": {"detached": true, "cluster": "a", "timeout_ms": 2000, "client_timeout_ms": 2000}}"#
        ),
        "upstream.client_timeout_ms"
    );
    assert_eq!(
        err(r#"{"upstream": {"client_timeout_ms": 5}}"#),
        "upstream.detached"
    );
}

/// The detached call sends exactly the body Envoy buffers (the last body callback's
/// size), whatever the chunks it came in.
#[test]
fn the_detached_call_sends_the_whole_buffered_body() {
    for (store, p) in plugins() {
        let mut env = env_for(store);
        let body = br#"{"amount": 12345}"#;
        let r = req("POST", "/charges").key("k");
        let mut s = DedupStream::new(1);
        let d = s.on_request_headers(&p, &mut env, r.head.clone(), false);
        assert_eq!(d, Decision::Pause, "{store}");
        let d = s.on_request_body(&p, &mut env, 7, false, || None);
        assert_eq!(d, Decision::Pause, "{store}");
        let d = s.on_request_body(&p, &mut env, body.len(), true, || Some(body.to_vec()));
        match settle(&p, &mut env, &mut s, d) {
            Decision::Upstream(call) => assert_eq!(call.body_len, body.len(), "{store}"),
            other => panic!("{store}: expected the detached call, got {other:?}"),
        }
    }
}
