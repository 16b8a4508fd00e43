//! What the glue asks the stream: when it wants bodies, trailers, when a local reply
//! decided at request headers is sent, and what a stream does when Envoy skips a
//! callback.

use crate::fake::FakeEnv;
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

/// A bad key seen at request headers is answered once the body has arrived (a reply
/// before the body makes Envoy close the client's connection), without reading the
/// body; counted at once, and answered at once when the request has no body or its
/// body outgrows `max_body_bytes`.
#[test]
fn a_reply_decided_at_request_headers_waits_for_the_body() {
    let (p, mut env) = one_worker(r#"{"key": {"required": true}, "max_body_bytes": 8}"#);
    let bad = || req("POST", "/o").head;
    let mut s = DedupStream::new(1);
    assert_eq!(
        s.on_request_headers(&p, &mut env, bad(), false),
        Decision::Pause
    );
    assert_eq!(env.count_of(Counter::BadKey), 1);
    assert!(
        s.reading_request(),
        "the body callbacks must reach the stream"
    );
    let unread = || -> Option<Vec<u8>> { panic!("the body of a rejected request was read") };
    assert_eq!(
        s.on_request_body(&p, &mut env, 4, false, unread),
        Decision::Pause
    );
    let Decision::Reply(r) = s.on_request_body(&p, &mut env, 6, true, unread) else {
        panic!("no reply at the body's end");
    };
    assert_eq!(r.status, 400);
    assert!(!s.reading_request());
    assert_eq!(env.count_of(Counter::BadKey), 1, "counted once");
    // Trailers end the body too.
    let mut s = DedupStream::new(2);
    assert_eq!(
        s.on_request_headers(&p, &mut env, bad(), false),
        Decision::Pause
    );
    assert!(
        matches!(s.on_request_trailers(&p, &mut env, unread), Decision::Reply(r) if r.status == 400)
    );
    // Past max_body_bytes: at once, unread.
    let mut s = DedupStream::new(3);
    assert_eq!(
        s.on_request_headers(&p, &mut env, bad(), false),
        Decision::Pause
    );
    assert!(
        matches!(s.on_request_body(&p, &mut env, 9, false, unread), Decision::Reply(r) if r.status == 400)
    );
    // No body: at once.
    let mut s = DedupStream::new(4);
    assert!(
        matches!(s.on_request_headers(&p, &mut env, bad(), true), Decision::Reply(r) if r.status == 400)
    );
    assert_eq!(env.count_of(Counter::BadKey), 4);
    // The decision is recorded at the headers, for a client that leaves before the body.
    let mut s = DedupStream::new(5);
    assert_eq!(
        s.on_request_headers(&p, &mut env, bad(), false),
        Decision::Pause
    );
    assert_eq!(s.log_fields().map(|(v, _)| v), Some("bad_key"));
    assert_eq!(s.on_stream_end(&p, &mut env, &Origin::upstream()), None);
}

/// The request head from Envoy's pairs: pseudo-headers to their fields (others
/// dropped), values as bytes, names lower-cased, and the protocol asked for only when
/// the content type says gRPC.
#[test]
fn the_request_head_comes_from_envoys_pairs_and_asks_the_protocol_only_for_grpc() {
    use crate::key::RequestHead;
    let pair = |n: &str, v: &[u8]| (n.to_string(), v.to_vec());
    let pairs = vec![
        pair(":method", b"POST"),
        pair(":path", b"/o?x=\xff"),
        pair(":authority", b"api"),
        pair(":scheme", b"https"),
        pair("Idempotency-Key", b"k\xfe"),
        pair("x-a", b"1"),
        pair("x-a", b"2"),
    ];
    let head = RequestHead::from_pairs(pairs, || panic!("not gRPC: the protocol is not read"));
    assert_eq!(head.method, "POST");
    assert_eq!(head.path, b"/o?x=\xff");
    assert_eq!(head.authority, b"api");
    assert_eq!(
        head.headers,
        vec![
            pair("idempotency-key", b"k\xfe"),
            pair("x-a", b"1"),
            pair("x-a", b"2")
        ]
    );
    assert_eq!(head.protocol, "");
    let grpc = RequestHead::from_pairs(
        vec![
            pair(":method", b"\xffPOST"),
            pair("content-type", b"application/grpc+proto"),
        ],
        || "HTTP/2".to_string(),
    );
    assert_eq!(grpc.protocol, "HTTP/2");
    assert!(grpc.is_grpc());
    assert_eq!(
        grpc.method, "\u{fffd}POST",
        "a method that is not UTF-8 never matches"
    );
}

/// Envoy's response flags are read only when the details are not `via_upstream`, as an
/// 8-byte little-endian integer (anything else reads as none).
#[test]
fn the_origin_reads_flags_only_when_they_matter() {
    let upstream = Origin::from_properties("via_upstream".into(), || panic!("not read"));
    assert_eq!(upstream, Origin::upstream());
    let reset = Origin::from_properties("upstream_reset_before_response_started".into(), || {
        Some(0x40u64.to_le_bytes().to_vec())
    });
    assert_eq!(reset.flags, 0x40);
    let odd = Origin::from_properties("x".into(), || Some(vec![1, 2, 3]));
    assert_eq!(odd.flags, 0);
    assert_eq!(Origin::from_properties(String::new(), || None).flags, 0);
}

#[test]
fn a_status_is_read_from_the_header_map() {
    let pairs = |v: &[u8]| {
        vec![
            ("x".to_string(), b"1".to_vec()),
            (":status".to_string(), v.to_vec()),
        ]
    };
    assert_eq!(crate::response::status_of(&pairs(b"201")), 201);
    assert_eq!(crate::response::status_of(&pairs(b"2x1")), 0);
    assert_eq!(crate::response::status_of(&[]), 0);
}

#[test]
fn a_detached_call_forwards_every_header_but_the_hop_by_hop_ones() {
    use crate::stream::forwarded_header;
    for h in [
        "Connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "upgrade",
        "content-length",
        "expect",
    ] {
        assert!(!forwarded_header(h), "{h}");
    }
    for h in [
        ":method",
        ":path",
        "content-type",
        "idempotency-key",
        "tenant",
    ] {
        assert!(forwarded_header(h), "{h}");
    }
}
