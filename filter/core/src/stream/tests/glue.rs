//! What the glue asks the stream: when it wants bodies, trailers, the method-only fast
//! path, and what a stream does when Envoy skips a callback.

use crate::fake::{FakeEnv, FakeShared};
use crate::metrics::Counter;
use crate::stream::{Decision, DedupStream, Origin, Plugin};
use crate::testing::*;

/// A stream whose request headers (key `k`, a body to follow) paused it for the body.
fn paused_for_the_body(p: &Plugin, env: &mut FakeEnv) -> DedupStream {
    let mut s = DedupStream::new(1);
    let head = req("POST", "/o").key("k").head;
    assert_eq!(s.on_request_headers(p, env, head, false), Decision::Pause);
    s
}

#[test]
fn the_stream_says_when_it_wants_bodies() {
    let (p, mut env) = one_worker(r#"{"max_replay_body_bytes": 4}"#);
    let mut s = paused_for_the_body(&p, &mut env);
    assert!(s.reading_request());
    assert_eq!(
        s.on_request_body(&p, &mut env, 2, true, || Some(b"{}".to_vec())),
        Decision::Continue
    );
    assert!(!s.reading_request());
    assert!(s.holds_claim());
    let pairs = || vec![(":status".to_string(), b"200".to_vec())];
    assert_eq!(
        s.on_response_headers(&p, &mut env, 200, &Origin::upstream(), pairs, false),
        None
    );
    assert!(s.wants_response_body() && s.capture_within_cap());
    assert_eq!(s.on_response_body(&p, &mut env, b"12345", false), None);
    // Over the cap: still completing (it executed), no longer worth buffering.
    assert!(s.wants_response_body() && !s.capture_within_cap());
    // Trailers end the response: completed, not kept.
    assert_eq!(s.on_response_trailers(&p, &mut env), None);
    assert!(!s.wants_response_body() && !s.holds_claim());
    let dup = run(
        &p,
        &mut env,
        &req("POST", "/o").key("k").body("{}"),
        ok("no"),
    );
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
}

/// Forwards a request with key `k` and gives its stream the upstream's response headers
/// of `status`, a body to follow.
fn responding(p: &Plugin, env: &mut FakeEnv, status: u16) -> (Req, DedupStream) {
    let r = req("POST", "/o").key("k");
    let mut s = send(p, env, &r).unwrap();
    let pairs = || vec![(":status".to_string(), status.to_string().into_bytes())];
    let up = Origin::upstream();
    assert_eq!(
        s.on_response_headers(p, env, status, &up, pairs, false),
        None
    );
    (r, s)
}

#[test]
fn trailers_complete_a_captured_response() {
    let (p, mut env) = one_worker("{}");
    let (r, mut s) = responding(&p, &mut env, 201);
    assert_eq!(s.on_response_body(&p, &mut env, b"made", false), None);
    assert_eq!(s.on_response_trailers(&p, &mut env), None);
    let replay = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        (replay.status(), &replay.local().body[..]),
        (201, &b"made"[..])
    );
}

#[test]
fn an_unreadable_response_body_completes_without_keeping_it() {
    let (p, mut env) = one_worker("{}");
    let (r, mut s) = responding(&p, &mut env, 200);
    s.on_response_body_unreadable();
    assert!(!s.capture_within_cap());
    assert_eq!(s.on_response_body(&p, &mut env, b"rest", true), None);
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(env.count_of(Counter::Executed), 1);
}

#[test]
fn a_body_read_at_its_trailers_is_held_to_the_limit() {
    let (p, mut env) = one_worker(r#"{"max_body_bytes": 4}"#);
    let mut s = paused_for_the_body(&p, &mut env);
    // The body arrived in chunks the filter was not shown (trailers end it).
    let a = s.on_request_trailers(&p, &mut env, || Some(b"12345".to_vec()));
    assert!(
        matches!(a, Decision::Reply(ref r) if r.status == 413),
        "{a:?}"
    );
    assert_eq!(env.count_of(Counter::Executed), 0);
}

#[test]
fn the_stream_debug_names_its_phase() {
    let (p, mut env) = one_worker("{}");
    let mut s = DedupStream::new(42);
    assert_eq!(format!("{s:?}"), "DedupStream { id: 42, phase: start }");
    s.on_request_headers(&p, &mut env, req("POST", "/o").key("k").head, false);
    assert_eq!(format!("{s:?}"), "DedupStream { id: 42, phase: reading }");
}

#[test]
fn no_input_makes_the_stream_panic() {
    // Arbitrary bytes in every field the client controls.
    let (p, mut env) = one_worker(
        r#"{"key": {"json_pointer": "/a/0", "fingerprint": ["method", "path", "query", "body", "header:x"]}, "scope": {"headers": ["x"]}}"#,
    );
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        let n = (next() % 40) as usize;
        let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let mut r = req("POST", &format!("/{text}?{text}")).header("x", &text);
        if next() % 2 == 0 {
            r = r.key(&text);
        }
        r.body = Some(bytes);
        r.chunk = 1 + (next() % 8) as usize;
        let status = [200u16, 404, 500, 0][(next() % 4) as usize];
        let _ = run(&p, &mut env, &r, answer(status, &text));
    }
}

/// `on_request_method` decides exactly as `on_request_headers` would (same action,
/// counters and logged decision) whenever it decides, and leaves to it every request a
/// rule, the key or another header could matter for.
#[test]
fn method_fast_path_agrees_with_the_whole_head() {
    let configs = [
        r#"{}"#,
        r#"{"methods": ["POST"]}"#,
        r#"{"methods": ["GET", "POST"], "key": {"required": true}}"#,
        r#"{"rules": [{"name": "gets", "match": {"methods": ["GET"]}, "methods": ["GET"]}]}"#,
    ];
    for json in configs {
        let p = plugin(json);
        for method in ["GET", "HEAD", "POST", "PATCH", "PUT", "DELETE", "post"] {
            let head = req(method, "/orders").key("k1").head;
            let shared = FakeShared::new();
            let mut fast_env = FakeEnv::new(shared.clone(), 1);
            let mut fast = DedupStream::new(1);
            let Some(action) = fast.on_request_method(&p, &mut fast_env, method) else {
                assert!(
                    fast_env.counters.is_empty() && fast.log_fields().is_none(),
                    "{json} {method}: undecided but counted"
                );
                let must_read = !p.config.rules.is_empty() || p.config.policy.dedups_method(method);
                assert!(must_read, "{json} {method}: left undecided for no reason");
                continue;
            };
            let mut full_env = FakeEnv::new(FakeShared::new(), 1);
            let mut full = DedupStream::new(1);
            let full_action = full.on_request_headers(&p, &mut full_env, head, false);
            assert_eq!(action, full_action, "{json} {method}");
            assert_eq!(fast_env.counters, full_env.counters, "{json} {method}");
            let fast_log = fast
                .log_fields()
                .map(|(v, r)| (v, r.map(|r| r.to_string())));
            let full_log = full
                .log_fields()
                .map(|(v, r)| (v, r.map(|r| r.to_string())));
            assert_eq!(fast_log, full_log, "{json} {method}");
            assert!(fast_log.is_some(), "{json} {method}: no decision logged");
            assert_eq!(fast.rule(&p), full.rule(&p), "{json} {method}");
            assert!(!fast.reading_request() && !fast.holds_claim());
        }
    }
}
