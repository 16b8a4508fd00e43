//! Native tests of the logic: config, keys, the decision table, the store under races.

use crate::config::{Config, FailureMode, OnDuplicate};
use crate::fake::{FakeEnv, FakeShared};
use crate::key::{
    self, json_key, record_digest, ClientKey, JsonKey, KeyError, KeySource, RequestHead,
};
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::reply::LocalReply;
use crate::response::{Capture, StoredResponse};
use crate::store::{ClaimOutcome, Layout, SharedStore, StoreError, WAYS};
use crate::stream::{Action, DedupStream, Origin, Plugin};
use crate::stream::{CallAnswer, StoreCall};
use std::sync::Arc;

// ---------- helpers ----------

#[derive(Clone)]
struct Req {
    head: RequestHead,
    body: Option<Vec<u8>>,
    chunk: usize,
    trailers: bool,
}

fn req(method: &str, path: &str) -> Req {
    Req {
        head: RequestHead {
            method: method.into(),
            path: path.into(),
            authority: "api.example".into(),
            headers: Vec::new(),
        },
        body: None,
        chunk: 7,
        trailers: false,
    }
}

impl Req {
    fn header(mut self, n: &str, v: &str) -> Self {
        self.head.headers.push((n.into(), v.into()));
        self
    }
    fn key(self, k: &str) -> Self {
        self.header("idempotency-key", k)
    }
    fn body(mut self, b: &str) -> Self {
        self.body = Some(b.as_bytes().to_vec());
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Reached the upstream, which answered this.
    Upstream(u16, Vec<u8>),
    Local(LocalReply),
    /// Reached the upstream, which reset the stream.
    Reset,
}

impl Outcome {
    fn status(&self) -> u16 {
        match self {
            Outcome::Upstream(s, _) => *s,
            Outcome::Local(r) => r.status,
            Outcome::Reset => 0,
        }
    }
    fn local(&self) -> &LocalReply {
        match self {
            Outcome::Local(r) => r,
            other => panic!("expected a local reply, got {other:?}"),
        }
    }
    fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.local().body).unwrap();
        v["type"].as_str().unwrap().to_string()
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Where Envoy says the response came from.
    origin: Origin,
    /// The stream ends without response headers (`origin` says why).
    reset: bool,
}

fn origin(details: &str, flag_bits: u64) -> Origin {
    Origin {
        details: details.into(),
        flags: flag_bits,
    }
}

/// The upstream reset the stream after the request was sent: the outcome is unknown.
fn upstream_reset() -> Answer {
    Answer {
        reset: true,
        origin: origin(
            "upstream_reset_before_response_started{remote_reset}",
            flags::UR,
        ),
        ..ok("")
    }
}

/// The stream ends without a response because of `o` (client gone, connection refused…).
fn ended(o: Origin) -> Answer {
    Answer {
        reset: true,
        origin: o,
        ..ok("")
    }
}

/// A local reply generated after the filter (router, a later filter) with `o`.
fn local(status: u16, o: Origin) -> Answer {
    Answer {
        origin: o,
        ..answer(status, "local")
    }
}

fn ok(body: &str) -> Answer {
    answer(200, body)
}

fn answer(status: u16, body: &str) -> Answer {
    Answer {
        status,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: body.as_bytes().to_vec(),
        origin: Origin::upstream(),
        reset: false,
    }
}

/// Sends the request up to the decision; `Ok(stream)` if it was forwarded.
/// Makes a store call against the environment's fake etcd, as Envoy's http call would.
fn call(env: &FakeEnv, c: &StoreCall) -> CallAnswer {
    let (status, body) = env
        .etcd
        .handle(c.path, &c.body, env.now_ms - env.clock_ahead_ms);
    CallAnswer { status, body }
}

/// Runs store calls until the stream decides.
fn settle(p: &Plugin, env: &mut FakeEnv, s: &mut DedupStream, mut action: Action) -> Action {
    while let Action::Call(c) = action {
        let a = call(env, &c);
        action = s.on_store_answer(p, env, a);
    }
    action
}

/// Delivers a response-side store call (completion, release) while the stream lives.
fn deliver(p: &Plugin, env: &mut FakeEnv, s: &mut DedupStream, c: Option<StoreCall>) {
    let mut next = c;
    while let Some(c) = next {
        let a = call(env, &c);
        next = match s.on_store_answer(p, env, a) {
            Action::Call(c) => Some(c),
            _ => None,
        };
    }
}

fn send(p: &Plugin, env: &mut FakeEnv, r: &Req) -> Result<DedupStream, Outcome> {
    let mut s = DedupStream::new(1);
    let mut action = s.on_request_headers(p, env, r.head.clone(), r.body.is_none() && !r.trailers);
    if let Some(body) = &r.body {
        let chunks: Vec<&[u8]> = if body.is_empty() {
            vec![&[][..]]
        } else {
            body.chunks(r.chunk).collect()
        };
        let n = chunks.len();
        let mut buffered = 0;
        for (i, c) in chunks.into_iter().enumerate() {
            if action != Action::Pause {
                break;
            }
            // Envoy buffers while the filter pauses; the filter reads it all at the end.
            buffered += c.len();
            let whole = body[..buffered].to_vec();
            action = s.on_request_body(p, env, buffered, i + 1 == n && !r.trailers, || Some(whole));
        }
        if r.trailers && action == Action::Pause {
            let whole = body.clone();
            action = s.on_request_trailers(p, env, || Some(whole));
        }
    }
    let action = settle(p, env, &mut s, action);
    match action {
        Action::Continue => Ok(s),
        Action::Reply(reply) => {
            // Envoy runs the filter's response callbacks on its own local reply too.
            let own = origin(reply.details, 0);
            assert_eq!(
                s.on_response_headers(p, env, reply.status, &own, || reply.headers.clone(), false),
                None
            );
            assert_eq!(s.on_response_body(p, env, &reply.body, true), None);
            assert_eq!(s.on_stream_end(p, env, &own), None);
            Err(Outcome::Local(reply))
        }
        Action::Pause => panic!("stream left paused at the end of the request"),
        Action::Call(_) => unreachable!("settled above"),
    }
}

fn respond(p: &Plugin, env: &mut FakeEnv, mut s: DedupStream, a: Answer) -> Outcome {
    if a.reset {
        let c = s.on_stream_end(p, env, &a.origin);
        deliver(p, env, &mut s, c);
        return Outcome::Reset;
    }
    let mut pairs = vec![(":status".to_string(), a.status.to_string().into_bytes())];
    pairs.extend(a.headers.clone());
    let c = s.on_response_headers(p, env, a.status, &a.origin, || pairs, a.body.is_empty());
    deliver(p, env, &mut s, c);
    if !a.body.is_empty() {
        let n = a.body.len().div_ceil(5);
        for (i, chunk) in a.body.chunks(5).enumerate() {
            if s.wants_response_body() {
                let c = s.on_response_body(p, env, chunk, i + 1 == n);
                deliver(p, env, &mut s, c);
            }
        }
    }
    let c = s.on_stream_end(p, env, &a.origin);
    deliver(p, env, &mut s, c);
    Outcome::Upstream(a.status, a.body)
}

fn run(p: &Plugin, env: &mut FakeEnv, r: &Req, a: Answer) -> Outcome {
    match send(p, env, r) {
        Ok(s) => respond(p, env, s, a),
        Err(o) => o,
    }
}

fn plugin(json: &str) -> Plugin {
    Plugin::new(Config::parse(json.as_bytes()).unwrap())
}

fn world() -> (Arc<FakeShared>, FakeEnv) {
    let shared = FakeShared::new();
    let env = FakeEnv::new(shared.clone(), 0);
    (shared, env)
}

fn cfg_err(json: &str) -> (String, String) {
    let e = Config::parse(json.as_bytes()).unwrap_err();
    (e.field, e.reason)
}

// ---------- configuration ----------

#[test]
fn empty_config_gives_documented_defaults() {
    let c = Config::parse(b"").unwrap();
    assert_eq!(c, Config::default());
    let c2 = Config::parse(b"{}").unwrap();
    assert_eq!(c2, c);
    assert_eq!(c.policy.key_headers, vec!["idempotency-key"]);
    assert_eq!(c.policy.methods, vec!["POST", "PATCH"]);
    assert_eq!(
        (c.policy.ttl_ms, c.policy.in_flight_timeout_ms, c.capacity),
        (86_400_000, 30_000, 100_000)
    );
    assert_eq!(
        (
            c.policy.max_body_bytes,
            c.policy.max_replay_body_bytes,
            c.policy.key_max_length
        ),
        (1_048_576, 65_536, 255)
    );
    assert_eq!(
        (c.policy.on_duplicate, c.failure_mode),
        (OnDuplicate::Replay, FailureMode::Open)
    );
    assert!(c.stores_status(200) && c.stores_status(404) && c.stores_status(302));
    assert!(!c.stores_status(500) && !c.stores_status(503) && !c.stores_status(101));
}

#[test]
fn full_config_parses() {
    let c = Config::parse(
        br#"{"key": {"headers": ["X-Request-Id", "idempotency-key"], "json_pointer": "/msg~1id", "fingerprint": ["method", "path", "query", "body", "header:X-Tenant"], "required": true, "max_length": 64},
            "scope": {"headers": ["x-tenant"]}, "methods": ["POST", "PUT"], "on_duplicate": "reject", "ttl_seconds": 60,
            "in_flight_timeout_seconds": 5, "retry_after_seconds": 2, "capacity": 1024, "max_body_bytes": 4096,
            "max_replay_body_bytes": 1024, "store_statuses": ["2xx", "409"], "replayed_header": "X-Replayed",
            "failure_mode": "closed", "store": {"kind": "shared_data", "namespace": "orders"}}"#,
    )
    .unwrap();
    assert_eq!(
        c.policy.key_headers,
        vec!["x-request-id", "idempotency-key"]
    );
    assert_eq!(c.policy.json_pointer.as_deref(), Some("/msg~1id"));
    assert_eq!(c.policy.fingerprint.len(), 5);
    assert!(c.policy.key_required);
    assert_eq!(c.policy.on_duplicate, OnDuplicate::Reject);
    assert_eq!(c.failure_mode, FailureMode::Closed);
    assert!(c.stores_status(201) && c.stores_status(409) && !c.stores_status(404));
    assert_eq!(c.replayed_header, "x-replayed");
    assert_eq!(c.namespace, "orders");
}

#[test]
fn config_errors_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (r#"{"ttl": 5}"#, "ttl", "unknown field"),
        (
            r#"{"key": {"header": ["a"]}}"#,
            "key.header",
            "unknown field",
        ),
        (r#"{"ttl_seconds": "x"}"#, "ttl_seconds", "invalid type"),
        (r#"{"ttl_seconds": -1}"#, "ttl_seconds", "invalid value"),
        (r#"{"ttl_seconds": 0}"#, "ttl_seconds", "out of range"),
        (
            r#"{"in_flight_timeout_seconds": 100000}"#,
            "in_flight_timeout_seconds",
            "out of range",
        ),
        (r#"{"capacity": 1}"#, "capacity", "out of range"),
        (
            r#"{"max_body_bytes": 999999999999}"#,
            "max_body_bytes",
            "out of range",
        ),
        (
            r#"{"max_replay_body_bytes": 99999999}"#,
            "max_replay_body_bytes",
            "out of range",
        ),
        (
            r#"{"retry_after_seconds": 4000}"#,
            "retry_after_seconds",
            "out of range",
        ),
        (
            r#"{"key": {"max_length": 0}}"#,
            "key.max_length",
            "out of range",
        ),
        (
            r#"{"key": {"required": "yes"}}"#,
            "key.required",
            "invalid type",
        ),
        (r#"{"key": {"headers": []}}"#, "key.headers", "at least one"),
        (
            r#"{"key": {"headers": ["bad header"]}}"#,
            "key.headers",
            "not a valid header name",
        ),
        (
            r#"{"key": {"json_pointer": "msgId"}}"#,
            "key.json_pointer",
            "RFC 6901",
        ),
        (
            r#"{"key": {"json_pointer": "/a~2"}}"#,
            "key.json_pointer",
            "invalid escape",
        ),
        (
            r#"{"key": {"fingerprint": ["cookies"]}}"#,
            "key.fingerprint",
            "expected",
        ),
        (
            r#"{"key": {"fingerprint": []}}"#,
            "key.fingerprint",
            "at least one",
        ),
        (
            r#"{"key": {"fingerprint": ["body", "body"]}}"#,
            "key.fingerprint",
            "twice",
        ),
        (
            r#"{"key": {"fingerprint": ["header:"]}}"#,
            "key.fingerprint",
            "expected",
        ),
        (
            r#"{"scope": {"headers": ["x y"]}}"#,
            "scope.headers",
            "not a valid header name",
        ),
        (r#"{"methods": []}"#, "methods", "at least one"),
        (r#"{"methods": ["post"]}"#, "methods", "upper-case"),
        (
            r#"{"on_duplicate": "ignore"}"#,
            "on_duplicate",
            "unknown variant",
        ),
        (
            r#"{"failure_mode": "allow"}"#,
            "failure_mode",
            "unknown variant",
        ),
        (
            r#"{"store_statuses": ["2xx", "6xx"]}"#,
            "store_statuses",
            "status class",
        ),
        (
            r#"{"store_statuses": ["99"]}"#,
            "store_statuses",
            "status class",
        ),
        (
            r#"{"replayed_header": ""}"#,
            "replayed_header",
            "not a valid header name",
        ),
        (
            r#"{"store": {"kind": "redis"}}"#,
            "store.kind",
            "not a known store",
        ),
        (
            r#"{"store": {"namespace": "a/b"}}"#,
            "store.namespace",
            "without '/'",
        ),
        (
            r#"{"store": {"kind": "shared_data", "ttl": 1}}"#,
            "store.ttl",
            "unknown field",
        ),
        (r#"[1, 2]"#, "(root)", "JSON object"),
        (r#"{"ttl_seconds": 5} trailing"#, "(root)", "trailing"),
        (r#"{"ttl_seconds": 5"#, "(root)", "EOF"),
    ];
    for (json, field, reason) in cases {
        let (f, r) = cfg_err(json);
        assert_eq!(&f, field, "field for {json}: {r}");
        assert!(
            r.contains(reason),
            "reason for {json}: {r:?} should mention {reason:?}"
        );
    }
    let e = Config::parse(&[0xff, 0xfe]).unwrap_err();
    assert_eq!(e.field, "(root)");
    let shown = Config::parse(br#"{"capacity": 1}"#)
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains("`capacity`") && shown.contains("out of range"),
        "{shown}"
    );
}

// ---------- keys ----------

#[test]
fn header_key_first_present_wins_and_is_validated() {
    let cfg = Config::parse(br#"{"key": {"headers": ["x-a", "x-b"], "max_length": 8}}"#).unwrap();
    let mut h = req("POST", "/")
        .header("x-b", "second")
        .header("x-a", "first")
        .head;
    assert_eq!(
        key::header_key(&cfg.policy, &h).unwrap().unwrap().value,
        b"first"
    );
    h.headers.remove(1);
    assert_eq!(
        key::header_key(&cfg.policy, &h).unwrap().unwrap().value,
        b"second"
    );
    h.headers.clear();
    assert!(key::header_key(&cfg.policy, &h).is_none());
    for (bad, why) in [
        ("123456789", "at most 8"),
        ("a\u{1}b", "control"),
        ("", "empty"),
        ("\"\"", "empty"),
        ("a\tb", "control"),
    ] {
        let h = req("POST", "/").header("x-a", bad).head;
        match key::header_key(&cfg.policy, &h).unwrap() {
            Err(KeyError::Invalid { detail }) => assert!(detail.contains(why), "{bad:?}: {detail}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // An RFC 8941 string (as in the IETF draft) is the same key as its content.
    let q = req("POST", "/").header("x-a", "\"abc\"").head;
    assert_eq!(
        key::header_key(&cfg.policy, &q).unwrap().unwrap().value,
        b"abc"
    );
    // Exactly max_length is fine.
    let h = req("POST", "/").header("x-a", "12345678").head;
    assert!(key::header_key(&cfg.policy, &h).unwrap().is_ok());
}

#[test]
fn json_pointer_keys() {
    let cfg = Config::parse(br#"{"key": {"json_pointer": "/msg/id", "max_length": 10}}"#).unwrap();
    let found = |body: &str| json_key(&cfg.policy, "/msg/id", body.as_bytes());
    assert!(
        matches!(found(r#"{"msg": {"id": "m-1"}}"#), JsonKey::Found(ClientKey { value, source: KeySource::JsonPointer }) if value == b"m-1")
    );
    assert!(
        matches!(found(r#"{"msg": {"id": 42}}"#), JsonKey::Found(ClientKey { value, .. }) if value == b"42")
    );
    assert!(
        matches!(found(r#"{"msg": {"id": -7}}"#), JsonKey::Found(ClientKey { value, .. }) if value == b"-7")
    );
    assert!(matches!(
        found(r#"{"msg": {"id": 1.5}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": null}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": {"x": 1}}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": "much-too-long-id"}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(found(r#"{"msg": {}}"#), JsonKey::Absent(r) if r.contains("no value")));
    assert!(
        matches!(found(r#"{"msg": {"id": "x"}"#), JsonKey::Absent(r) if r.contains("not valid JSON"))
    );
    assert!(matches!(found(""), JsonKey::Absent(r) if r.contains("not valid JSON")));
    assert!(matches!(found("\u{0}\u{ff}garbage"), JsonKey::Absent(_)));
    // Escapes: "/a~1b" is the member "a/b".
    assert!(matches!(
        json_key(&cfg.policy, "/a~1b", br#"{"a/b": "k"}"#),
        JsonKey::Found(_)
    ));
}

#[test]
fn fingerprints_differ_by_each_configured_part_only() {
    let cfg = Config::parse(
        br#"{"key": {"fingerprint": ["method", "path", "body", "header:x-device"]}}"#,
    )
    .unwrap();
    let fp = |r: &Req| {
        let mut h = key::BodyHasher::default();
        if let Some(b) = &r.body {
            for c in b.chunks(3) {
                h.update(c);
            }
        }
        key::fingerprint_key(&cfg.policy, &r.head, &h.finish()).value
    };
    let base = req("POST", "/push?x=1")
        .header("x-device", "d1")
        .body("hello");
    let same = fp(&base);
    assert_eq!(same, fp(&base.clone()));
    // Query is not a configured part: ignored.
    let mut q = base.clone();
    q.head.path = "/push?x=2".into();
    assert_eq!(fp(&q), same);
    let mut m = base.clone();
    m.head.method = "PUT".into();
    assert_ne!(fp(&m), same);
    let mut p = base.clone();
    p.head.path = "/pull?x=1".into();
    assert_ne!(fp(&p), same);
    assert_ne!(fp(&base.clone().body("hellO")), same);
    let mut d = base.clone();
    d.head.headers[0].1 = "d2".into();
    assert_ne!(fp(&d), same);
    // Chunking does not matter.
    let mut one = key::BodyHasher::default();
    one.update(b"hello");
    assert_eq!(
        key::fingerprint_key(&cfg.policy, &base.head, &one.finish()).value,
        same
    );
    // The body's place: an empty body and no body part differ from a body of "".
    let no_body =
        Config::parse(br#"{"key": {"fingerprint": ["method", "path", "header:x-device"]}}"#)
            .unwrap();
    let empty = key::BodyHasher::default().finish();
    assert_ne!(
        key::fingerprint_key(&no_body.policy, &base.head, &empty).value,
        key::fingerprint_key(&cfg.policy, &base.head, &empty).value
    );
}

#[test]
fn digests_separate_scopes_and_key_sources() {
    let cfg = Config::parse(br#"{"scope": {"headers": ["x-tenant"]}}"#).unwrap();
    let k = ClientKey {
        source: KeySource::Header,
        value: b"k1".to_vec(),
    };
    let a = req("POST", "/").header("x-tenant", "a").head;
    let b = req("POST", "/").header("x-tenant", "b").head;
    let none = req("POST", "/").head;
    let empty = req("POST", "/").header("x-tenant", "").head;
    let da = record_digest(&cfg.policy, &a, &k);
    assert_eq!(da, record_digest(&cfg.policy, &a, &k));
    assert_ne!(da, record_digest(&cfg.policy, &b, &k));
    assert_ne!(
        record_digest(&cfg.policy, &none, &k),
        record_digest(&cfg.policy, &empty, &k)
    );
    let j = ClientKey {
        source: KeySource::JsonPointer,
        value: b"k1".to_vec(),
    };
    assert_ne!(da, record_digest(&cfg.policy, &a, &j));
    // Length prefixes: ("ab","c") and ("a","bc") scopes cannot meet.
    let cfg2 = Config::parse(br#"{"scope": {"headers": ["x-a", "x-b"]}}"#).unwrap();
    let h1 = req("POST", "/").header("x-a", "ab").header("x-b", "c").head;
    let h2 = req("POST", "/").header("x-a", "a").header("x-b", "bc").head;
    assert_ne!(
        record_digest(&cfg2.policy, &h1, &k),
        record_digest(&cfg2.policy, &h2, &k)
    );
}

// ---------- the decision table ----------

#[test]
fn b1_b2_first_executes_then_replays_same_response() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/orders").key("k1").body(r#"{"item": 1}"#);
    let first = run(&p, &mut env, &r, ok(r#"{"order": 1}"#));
    assert_eq!(first, Outcome::Upstream(200, br#"{"order": 1}"#.to_vec()));
    let again = run(&p, &mut env, &r, ok("must not be called"));
    let reply = again.local();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, br#"{"order": 1}"#);
    assert_eq!(reply.header("idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(reply.header("content-type"), Some(&b"application/json"[..]));
    assert_eq!(env.count_of(Counter::Executed), 1);
    assert_eq!(env.count_of(Counter::Replayed), 1);
    assert_eq!(env.count_of(Counter::Requests), 2);
}

#[test]
fn b1_replay_keeps_end_to_end_headers_and_drops_hop_by_hop_and_cookies() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/orders").key("k1");
    let mut a = answer(201, "made");
    a.headers = vec![
        ("location".into(), b"/orders/1".to_vec()),
        ("link".into(), b"<a>".to_vec()),
        ("link".into(), b"<b>".to_vec()),
        ("set-cookie".into(), b"session=secret".to_vec()),
        ("connection".into(), b"close, x-hop".to_vec()),
        ("x-hop".into(), b"1".to_vec()),
        ("transfer-encoding".into(), b"chunked".to_vec()),
        ("content-length".into(), b"4".to_vec()),
        ("x-envoy-upstream-service-time".into(), b"3".to_vec()),
    ];
    run(&p, &mut env, &r, a);
    let replay = run(&p, &mut env, &r, ok("x"));
    let names: Vec<&str> = replay
        .local()
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        names,
        vec!["location", "link", "link", "idempotent-replayed"]
    );
    assert_eq!(replay.status(), 201);
}

#[test]
fn b3_duplicate_in_flight_gets_409_with_retry_after() {
    let p = plugin(r#"{"retry_after_seconds": 3}"#);
    let (shared, mut env) = world();
    let mut env2 = FakeEnv::new(shared, 1);
    let r = req("POST", "/orders").key("k1").body("{}");
    let first = send(&p, &mut env, &r).unwrap();
    let dup = send(&p, &mut env2, &r).unwrap_err();
    assert_eq!(dup.status(), 409);
    assert_eq!(dup.local().header("retry-after"), Some(&b"3"[..]));
    assert_eq!(
        dup.local().header("content-type"),
        Some(&b"application/problem+json"[..])
    );
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(env2.count_of(Counter::RejectedInFlight), 1);
    respond(&p, &mut env, first, ok("done"));
    assert_eq!(run(&p, &mut env2, &r, ok("no")).local().body, b"done");
}

#[test]
fn b4_same_key_different_payload_gets_422() {
    let p = plugin("{}");
    let (_, mut env) = world();
    run(
        &p,
        &mut env,
        &req("POST", "/orders").key("k1").body("a"),
        ok("1"),
    );
    for other in [
        req("POST", "/orders").key("k1").body("b"),
        req("POST", "/refunds").key("k1").body("a"),
        req("PATCH", "/orders").key("k1").body("a"),
        req("POST", "/orders?x=1").key("k1").body("a"),
        req("POST", "/orders").key("k1"),
    ] {
        let o = run(&p, &mut env, &other, ok("no"));
        assert_eq!(o.status(), 422, "{:?}", other.head);
        assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:payload-mismatch");
    }
    // A mismatch while the first is in flight is 422 too (the more specific answer).
    let (_, mut env) = world();
    let _first = send(&p, &mut env, &req("POST", "/o").key("k2").body("a")).unwrap();
    assert_eq!(
        send(&p, &mut env, &req("POST", "/o").key("k2").body("b"))
            .unwrap_err()
            .status(),
        422
    );
    assert_eq!(env.count_of(Counter::PayloadMismatch), 1);
}

#[test]
fn b5_missing_or_invalid_key_gets_400() {
    let p = plugin(r#"{"key": {"required": true, "max_length": 10}}"#);
    let (shared, mut env) = world();
    let missing = run(&p, &mut env, &req("POST", "/o").body("x"), ok("no"));
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.problem_type(),
        "urn:proxy-dedup:problem:missing-key"
    );
    for bad in ["01234567890", "a\u{7f}b"] {
        let o = run(&p, &mut env, &req("POST", "/o").key(bad), ok("no"));
        assert_eq!(o.status(), 400);
        assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:invalid-key");
    }
    assert_eq!(env.count_of(Counter::BadKey), 3);
    assert_eq!(shared.key_count(), 0, "bad requests touch no store");
    // Not required: a keyless request passes through untouched.
    let p = plugin("{}");
    let o = run(&p, &mut env, &req("POST", "/o").body("x"), ok("yes"));
    assert_eq!(o, Outcome::Upstream(200, b"yes".to_vec()));
    assert_eq!(env.count_of(Counter::Bypassed), 1);
    // A bad key is refused even when not required.
    assert_eq!(
        run(&p, &mut env, &req("POST", "/o").key(""), ok("no")).status(),
        400
    );
}

#[test]
fn b6_upstream_5xx_and_requests_never_sent_release_the_claim() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/pay").key("k1").body("{}");
    // The upstream itself answered a status that is not stored.
    assert_eq!(run(&p, &mut env, &r, answer(503, "busy")).status(), 503);
    // Envoy could not send it: connection refused, no healthy host.
    let refused = origin(
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
        flags::UF,
    );
    assert_eq!(
        run(&p, &mut env, &r, local(503, refused.clone())).status(),
        503
    );
    assert_eq!(run(&p, &mut env, &r, ended(refused)), Outcome::Reset);
    let none = origin("no_healthy_upstream", flags::UH);
    assert_eq!(run(&p, &mut env, &r, local(503, none)).status(), 503);
    // A filter after this one answered (rate limiter, ext_authz): never stored.
    let limited = origin("request_rate_limited", flags::RL);
    assert_eq!(run(&p, &mut env, &r, local(429, limited)).status(), 429);
    let denied = origin("ext_authz_denied", flags::UAEX);
    assert_eq!(run(&p, &mut env, &r, local(403, denied)).status(), 403);
    assert_eq!(
        run(&p, &mut env, &r, ok("paid")),
        Outcome::Upstream(200, b"paid".to_vec())
    );
    assert_eq!(env.count_of(Counter::Executed), 7);
    assert_eq!(env.count_of(Counter::Released), 6);
    assert_eq!(env.count_of(Counter::OutcomeUnknown), 0);
    assert_eq!(run(&p, &mut env, &r, ok("no")).local().body, b"paid");
    // 4xx is stored by default; configurable.
    let p = plugin(r#"{"store_statuses": ["2xx"]}"#);
    let r = req("POST", "/pay").key("k2");
    run(&p, &mut env, &r, answer(409, "conflict"));
    assert_eq!(
        run(&p, &mut env, &r, ok("second")),
        Outcome::Upstream(200, b"second".to_vec())
    );
}

#[test]
fn statuses_that_ask_for_a_retry_are_not_stored_by_default() {
    let (_, mut env) = world();
    let p = plugin("{}");
    for (i, status) in [408u16, 425, 429].into_iter().enumerate() {
        let r = req("POST", "/o").key(&format!("k{i}"));
        assert_eq!(
            run(&p, &mut env, &r, answer(status, "later")).status(),
            status
        );
        assert_eq!(
            run(&p, &mut env, &r, ok("done")),
            Outcome::Upstream(200, b"done".to_vec()),
            "{status} is not stored: the retry executes"
        );
    }
    for status in [400u16, 404, 409, 422, 201, 302] {
        assert!(p.config.policy.stores_status(status), "{status}");
    }
    // Exclusions: "!code" or "!class"; an exclusion wins over an inclusion.
    let p = plugin(r#"{"store_statuses": ["2xx", "4xx", "!404", "!5xx"]}"#);
    assert!(p.config.policy.stores_status(200) && p.config.policy.stores_status(429));
    assert!(!p.config.policy.stores_status(404) && !p.config.policy.stores_status(302));
}

#[test]
fn an_unknown_outcome_holds_the_claim_until_the_in_flight_timeout() {
    let p = plugin(r#"{"in_flight_timeout_seconds": 30}"#);
    let unknowns = [
        upstream_reset(),
        ended(origin("downstream_remote_disconnect", flags::DC)),
        ended(origin("", 0)),
        local(504, origin("upstream_response_timeout", flags::UT)),
        local(
            503,
            origin(
                "upstream_reset_before_response_started{connection_termination}",
                flags::UC,
            ),
        ),
    ];
    let n = unknowns.len() as u64;
    for (i, first) in unknowns.into_iter().enumerate() {
        let (_, mut env) = world();
        let r = req("POST", "/pay").key(&format!("k{i}")).body("{}");
        let t0 = env.now_ms;
        run(&p, &mut env, &r, first);
        // The retry must not run: the upstream may have executed the first.
        env.now_ms = t0 + 10_400;
        let dup = run(&p, &mut env, &r, ok("twice"));
        assert_eq!(dup.status(), 409, "case {i}");
        assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
        assert_eq!(
            dup.local().header("retry-after"),
            Some(&b"20"[..]),
            "case {i}: retry-after is the rest of the in-flight timeout"
        );
        assert_eq!(env.count_of(Counter::OutcomeUnknown), 1, "case {i}");
        assert_eq!(env.count_of(Counter::Released), 0, "case {i}");
        // Once the in-flight timeout has passed, the key may run again.
        env.now_ms = t0 + 30_000;
        assert_eq!(
            run(&p, &mut env, &r, ok("again")),
            Outcome::Upstream(200, b"again".to_vec()),
            "case {i}"
        );
    }
    assert!(n >= 5);
}

#[test]
fn on_unknown_outcome_release_lets_the_retry_run() {
    let p = plugin(r#"{"on_unknown_outcome": "release"}"#);
    let (_, mut env) = world();
    let r = req("POST", "/pay").key("k").body("{}");
    assert_eq!(run(&p, &mut env, &r, upstream_reset()), Outcome::Reset);
    assert_eq!(
        run(&p, &mut env, &r, ok("again")),
        Outcome::Upstream(200, b"again".to_vec())
    );
    assert_eq!(env.count_of(Counter::OutcomeUnknown), 1);
    assert_eq!(env.count_of(Counter::Released), 1);
}

#[test]
fn a_status_that_arrived_counts_even_if_the_body_is_cut() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k1");
    let mut s = send(&p, &mut env, &r).unwrap();
    let up = Origin::upstream();
    assert_eq!(
        s.on_response_headers(&p, &mut env, 200, &up, Vec::new, false),
        None
    );
    assert_eq!(s.on_response_body(&p, &mut env, b"part", false), None);
    let cut = origin(
        "upstream_reset_after_response_started{remote_reset}",
        flags::UR,
    );
    assert_eq!(s.on_stream_end(&p, &mut env, &cut), None);
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(env.count_of(Counter::Released), 0);
    assert_eq!(env.count_of(Counter::Executed), 1);
}

#[test]
fn b7_errors_are_problem_json() {
    let p = plugin(r#"{"key": {"required": true}}"#);
    let (_, mut env) = world();
    let o = run(&p, &mut env, &req("POST", "/o"), ok("no"));
    let v: serde_json::Value = serde_json::from_slice(&o.local().body).unwrap();
    assert_eq!(v["status"], 400);
    assert!(v["title"].as_str().unwrap().contains("missing"));
    assert!(v["detail"].as_str().unwrap().contains("idempotency-key"));
}

#[test]
fn b8_decision_waits_for_the_end_of_the_body() {
    let p = plugin("{}");
    let (shared, mut env) = world();
    let mut s = DedupStream::new(9);
    let r = req("POST", "/o").key("k1");
    assert_eq!(
        s.on_request_headers(&p, &mut env, r.head.clone(), false),
        Action::Pause
    );
    let never = || -> Option<Vec<u8>> { panic!("the body is read once, at its end") };
    assert_eq!(
        s.on_request_body(&p, &mut env, 9, false, never),
        Action::Pause
    );
    assert_eq!(shared.key_count(), 0, "no claim before the end of the body");
    assert_eq!(
        s.on_request_body(&p, &mut env, 16, false, never),
        Action::Pause
    );
    // Trailers end the body.
    assert_eq!(
        s.on_request_trailers(&p, &mut env, || Some(b"part one and two".to_vec())),
        Action::Continue
    );
    assert!(s.holds_claim());
    // The chunked body and the same body in one piece are the same payload.
    let mut whole = req("POST", "/o").key("k1").body("part one and two");
    whole.chunk = 100;
    let _ = respond(&p, &mut env, s, ok("ok"));
    assert_eq!(run(&p, &mut env, &whole, ok("no")).local().body, b"ok");
}

#[test]
fn body_over_limit_gets_413_and_nothing_is_claimed() {
    let p = plugin(r#"{"max_body_bytes": 10}"#);
    let (shared, mut env) = world();
    let o = run(
        &p,
        &mut env,
        &req("POST", "/o").key("k").body("0123456789A"),
        ok("no"),
    );
    assert_eq!(o.status(), 413);
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:body-too-large");
    assert_eq!(shared.key_count(), 0);
    assert!(matches!(
        run(
            &p,
            &mut env,
            &req("POST", "/o").key("k").body("0123456789"),
            ok("y")
        ),
        Outcome::Upstream(..)
    ));
}

#[test]
fn other_methods_pass_untouched() {
    let p = plugin("{}");
    let (shared, mut env) = world();
    for _ in 0..2 {
        let o = run(&p, &mut env, &req("GET", "/orders").key("k1"), ok("list"));
        assert_eq!(o, Outcome::Upstream(200, b"list".to_vec()));
    }
    assert_eq!(shared.key_count(), 0);
    assert_eq!(env.count_of(Counter::Bypassed), 2);
}

#[test]
fn reject_mode_answers_409_for_completed() {
    let p = plugin(r#"{"on_duplicate": "reject"}"#);
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    run(&p, &mut env, &r, ok("1"));
    let o = run(&p, &mut env, &r, ok("no"));
    assert_eq!(o.status(), 409);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:already-completed"
    );
}

#[test]
fn oversized_response_blocks_duplicates_without_replay() {
    let p = plugin(r#"{"max_replay_body_bytes": 8}"#);
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    assert!(matches!(
        run(&p, &mut env, &r, ok("0123456789")),
        Outcome::Upstream(..)
    ));
    let o = run(&p, &mut env, &r, ok("no"));
    assert_eq!(o.status(), 409);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    // At the cap it is stored.
    let r2 = req("POST", "/o").key("k2");
    run(&p, &mut env, &r2, ok("01234567"));
    assert_eq!(run(&p, &mut env, &r2, ok("no")).local().body, b"01234567");
}

#[test]
fn json_pointer_and_fingerprint_modes() {
    let p =
        plugin(r#"{"key": {"json_pointer": "/msgId", "fingerprint": ["method", "path", "body"]}}"#);
    let (_, mut env) = world();
    // Same msgId, same body: replay.
    let m = req("POST", "/push").body(r#"{"msgId": "m1", "text": "hi"}"#);
    run(&p, &mut env, &m, ok("sent"));
    assert_eq!(run(&p, &mut env, &m, ok("no")).local().body, b"sent");
    // Same msgId, other text: 422.
    let m2 = req("POST", "/push").body(r#"{"msgId": "m1", "text": "bye"}"#);
    assert_eq!(run(&p, &mut env, &m2, ok("no")).status(), 422);
    // Header key takes precedence over the body's.
    let h = req("POST", "/push")
        .key("m1")
        .body(r#"{"msgId": "m1", "text": "hi"}"#);
    assert!(matches!(
        run(&p, &mut env, &h, ok("h")),
        Outcome::Upstream(..)
    ));
    // No msgId, or not JSON: the fingerprint of the whole request is the key.
    let f = req("POST", "/push").body("plain text form");
    assert!(matches!(
        run(&p, &mut env, &f, ok("f")),
        Outcome::Upstream(..)
    ));
    assert_eq!(run(&p, &mut env, &f, ok("no")).local().body, b"f");
    // An invalid JSON key is a 400 even with a fingerprint fallback.
    let bad = req("POST", "/push").body(r#"{"msgId": [1]}"#);
    assert_eq!(run(&p, &mut env, &bad, ok("no")).status(), 400);
}

#[test]
fn json_pointer_required_without_key_explains_why() {
    let p = plugin(r#"{"key": {"json_pointer": "/id", "required": true}}"#);
    let (_, mut env) = world();
    let o = run(&p, &mut env, &req("POST", "/").body("{not json"), ok("no"));
    assert_eq!(o.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&o.local().body).unwrap();
    assert!(
        v["detail"].as_str().unwrap().contains("not valid JSON"),
        "{v}"
    );
    // No body at all: no key.
    assert_eq!(run(&p, &mut env, &req("POST", "/"), ok("no")).status(), 400);
}

#[test]
fn scopes_never_see_each_other() {
    let p = plugin(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let (_, mut env) = world();
    let a = req("POST", "/o")
        .key("k")
        .header("x-tenant", "a")
        .body("same");
    let b = req("POST", "/o")
        .key("k")
        .header("x-tenant", "b")
        .body("same");
    assert_eq!(
        run(&p, &mut env, &a, ok("secret-a")),
        Outcome::Upstream(200, b"secret-a".to_vec())
    );
    assert_eq!(
        run(&p, &mut env, &b, ok("secret-b")),
        Outcome::Upstream(200, b"secret-b".to_vec())
    );
    assert_eq!(run(&p, &mut env, &a, ok("no")).local().body, b"secret-a");
    assert_eq!(run(&p, &mut env, &b, ok("no")).local().body, b"secret-b");
}

#[test]
fn failure_modes() {
    for (mode, expect) in [("open", 200), ("closed", 503)] {
        let p = plugin(&format!(r#"{{"failure_mode": "{mode}"}}"#));
        let (shared, mut env) = world();
        shared.set_failing(true);
        let o = run(&p, &mut env, &req("POST", "/o").key("k"), ok("through"));
        assert_eq!(o.status(), expect, "{mode}");
        assert_eq!(env.count_of(Counter::StoreErrors), 1);
        if mode == "closed" {
            assert_eq!(
                o.problem_type(),
                "urn:proxy-dedup:problem:store-unavailable"
            );
        } else {
            assert_eq!(env.count_of(Counter::FailedOpen), 1);
        }
    }
    // The store failing between claim and completion: counted, nothing panics, and the
    // record stays in flight until its timeout.
    let p = plugin(r#"{"in_flight_timeout_seconds": 5}"#);
    let (shared, mut env) = world();
    let r = req("POST", "/o").key("k");
    let s = send(&p, &mut env, &r).unwrap();
    shared.set_failing(true);
    respond(&p, &mut env, s, ok("x"));
    assert_eq!(env.count_of(Counter::StoreErrors), 1);
    shared.set_failing(false);
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409);
    env.now_ms += 5_000;
    assert!(matches!(
        run(&p, &mut env, &r, ok("again")),
        Outcome::Upstream(..)
    ));
}

// ---------- expiry ----------

#[test]
fn ttl_and_in_flight_expiry() {
    let p = plugin(r#"{"ttl_seconds": 60, "in_flight_timeout_seconds": 10}"#);
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    run(&p, &mut env, &r, ok("one"));
    env.now_ms += 59_999;
    assert_eq!(run(&p, &mut env, &r, ok("no")).local().body, b"one");
    env.now_ms += 1;
    assert_eq!(
        run(&p, &mut env, &r, ok("two")),
        Outcome::Upstream(200, b"two".to_vec())
    );
    // In flight: blocks until the timeout, then the key runs again.
    let r2 = req("POST", "/o").key("k2");
    let stuck = send(&p, &mut env, &r2).unwrap();
    env.now_ms += 9_999;
    assert_eq!(send(&p, &mut env, &r2).unwrap_err().status(), 409);
    env.now_ms += 1;
    let retry = send(&p, &mut env, &r2).unwrap();
    // The stuck original answers late: it must not overwrite the new owner's record.
    respond(&p, &mut env, stuck, ok("late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    assert_eq!(send(&p, &mut env, &r2).unwrap_err().status(), 409);
    respond(&p, &mut env, retry, ok("fresh"));
    assert_eq!(run(&p, &mut env, &r2, ok("no")).local().body, b"fresh");
    // Nor its response slot, when it answers after its successor completed.
    let r3 = req("POST", "/o").key("k3");
    let stuck = send(&p, &mut env, &r3).unwrap();
    env.now_ms += 10_000;
    assert_eq!(
        run(&p, &mut env, &r3, ok("successor")),
        Outcome::Upstream(200, b"successor".to_vec())
    );
    respond(&p, &mut env, stuck, ok("late"));
    assert_eq!(run(&p, &mut env, &r3, ok("no")).local().body, b"successor");
}

// ---------- the store ----------

fn digest(i: u64) -> [u8; 32] {
    let mut d = [0u8; 32];
    let h = <sha2::Sha256 as sha2::Digest>::digest(i.to_be_bytes());
    d.copy_from_slice(&h);
    d
}

#[test]
fn interleaved_claims_one_wins_the_cas_race() {
    let shared = FakeShared::new();
    let layout = Layout::new("t", 64, 30_000, 60_000);
    let d = digest(1);
    let p = [7u8; 32];
    SharedStore::new(&*shared, &layout).register(1000).unwrap();
    // Worker B claims between worker A's read and A's CAS (the bucket does not exist yet:
    // both saw it absent, and B's create wins).
    let (s2, l2) = (shared.clone(), layout.clone());
    shared.before_next_set(move || {
        let o = SharedStore::new(&*s2, &l2).claim(&d, &p, 1000, 2).unwrap();
        assert!(matches!(o, ClaimOutcome::Claimed { .. }));
    });
    let a = SharedStore::new(&*shared, &layout)
        .claim(&d, &p, 1000, 1)
        .unwrap();
    assert_eq!(
        a,
        ClaimOutcome::InFlight { held_until: None },
        "A must see B's claim after losing the CAS"
    );

    // Same race on an existing bucket (cas path, not the create path).
    let d2 = digest(2);
    let (s3, l3) = (shared.clone(), layout.clone());
    let b2 = layout.bucket_of(&d2);
    SharedStore::new(&*shared, &layout)
        .claim(&digest(1000 + b2), &p, 1000, 9)
        .unwrap();
    shared.before_next_set(move || {
        SharedStore::new(&*s3, &l3).claim(&d2, &p, 1000, 4).unwrap();
    });
    assert_eq!(
        SharedStore::new(&*shared, &layout)
            .claim(&d2, &p, 1000, 3)
            .unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
}

#[test]
fn interleaved_claims_on_other_keys_both_win() {
    let shared = FakeShared::new();
    let layout = Layout::new("t", 16, 30_000, 60_000); // 2 buckets: collisions are likely
    let p = [0u8; 32];
    let (a, b) = (
        digest(10),
        (11..)
            .map(digest)
            .find(|d| layout.bucket_of(d) == layout.bucket_of(&digest(10)))
            .unwrap(),
    );
    let (s2, l2) = (shared.clone(), layout.clone());
    shared.before_next_set(move || {
        assert!(matches!(
            SharedStore::new(&*s2, &l2).claim(&b, &p, 0, 2).unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    });
    assert!(matches!(
        SharedStore::new(&*shared, &layout)
            .claim(&a, &p, 0, 1)
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // Both records are there: the retry re-read B's write instead of clobbering it.
    let store = SharedStore::new(&*shared, &layout);
    assert_eq!(
        store.claim(&a, &p, 0, 3).unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
    assert_eq!(
        store.claim(&b, &p, 0, 4).unwrap(),
        ClaimOutcome::InFlight { held_until: None }
    );
}

#[test]
fn threads_racing_on_one_key_execute_exactly_once() {
    for round in 0..20u64 {
        let shared = FakeShared::new();
        let layout = Arc::new(Layout::new("t", 16, 30_000, 60_000));
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let (s, l) = (shared.clone(), layout.clone());
                std::thread::spawn(move || {
                    let store = SharedStore::new(&*s, &l);
                    // Every thread also claims and releases other keys in the same two
                    // buckets, so the CAS on the contested key keeps losing races.
                    let mut won = 0;
                    for i in 0..4 {
                        if let Ok(ClaimOutcome::Claimed { claim, .. }) = store.claim(
                            &digest(round * 100 + t * 10 + i + 1_000_000),
                            &[0; 32],
                            0,
                            t,
                        ) {
                            assert!(store.release(&claim).unwrap());
                        }
                        if let Ok(ClaimOutcome::Claimed { .. }) =
                            store.claim(&digest(round), &[0; 32], 0, t + 100)
                        {
                            won += 1;
                        }
                    }
                    won
                })
            })
            .collect();
        let wins: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(wins, 1, "round {round}");
    }
}

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
        shared.key_count() as u64 <= p.layout.max_keys(),
        "{} keys",
        shared.key_count()
    );
    assert!(p.layout.max_keys() <= 64 * 2 + 2);
    assert!(env.count_of(Counter::EvictionsUnexpired) >= 2000 - 64);
    // The newest keys are still replayed.
    let last = req("POST", "/o").key("k1999");
    assert_eq!(run(&p, &mut env, &last, ok("no")).local().body, b"r1999");
    // Expired records are reused before unexpired ones are evicted.
    let p = plugin(r#"{"capacity": 16, "ttl_seconds": 1}"#);
    let (shared, mut env) = world();
    for i in 0..500 {
        run(
            &p,
            &mut env,
            &req("POST", "/o").key(&format!("k{i}")),
            ok("x"),
        );
        env.now_ms += 1_000;
    }
    assert_eq!(env.count_of(Counter::EvictionsUnexpired), 0);
    assert!(shared.key_count() as u64 <= p.layout.max_keys());
}

#[test]
fn half_full_store_evicts_almost_nothing() {
    // Buckets overflow by chance before the store is full; with 16 ways at half load the
    // share of records evicted early stays far below 0.2% (with 8 ways it was ~1%).
    let layout = Layout::new("t", 16_000, 30_000, 3_600_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let mut evicted = 0;
    for i in 0..8_000u64 {
        match store.claim(&digest(i), &[0; 32], 0, i).unwrap() {
            ClaimOutcome::Claimed {
                claim,
                evicted_unexpired,
            } => {
                evicted += u32::from(evicted_unexpired);
                assert!(store.complete(&claim, None, 0).unwrap());
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        evicted < 16,
        "{evicted} of 8000 records evicted before their TTL"
    );
}

#[test]
fn bucket_full_of_in_flight_claims_is_a_store_error_not_an_eviction() {
    let layout = Layout::new("t", 16, 30_000, 60_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let bucket = layout.bucket_of(&digest(0));
    let same: Vec<_> = (0..)
        .map(digest)
        .filter(|d| layout.bucket_of(d) == bucket)
        .take(WAYS + 1)
        .collect();
    for (i, d) in same[..WAYS].iter().enumerate() {
        assert!(matches!(
            store.claim(d, &[0; 32], 0, i as u64).unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
    assert_eq!(
        store.claim(&same[WAYS], &[0; 32], 0, 99),
        Err(StoreError::BucketFull)
    );
    // Once they time out, the way is free again.
    assert!(matches!(
        store.claim(&same[WAYS], &[0; 32], 30_000, 99).unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

#[test]
fn a_response_slot_taken_over_is_never_replayed_to_the_old_key() {
    // Record A completes; later the way is reused by B, whose response overwrites the slot.
    // Whatever interleaving, a reader of A must never get B's body.
    let layout = Layout::new("t", 16, 1_000, 1_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let bucket = layout.bucket_of(&digest(0));
    let same: Vec<_> = (0..)
        .map(digest)
        .filter(|d| layout.bucket_of(d) == bucket)
        .take(WAYS + 1)
        .collect();
    let resp = |b: &str| StoredResponse {
        status: 200,
        headers: vec![],
        body: b.as_bytes().to_vec(),
    };
    let mut claims = Vec::new();
    for (i, d) in same[..WAYS].iter().enumerate() {
        let ClaimOutcome::Claimed { claim, .. } = store.claim(d, &[0; 32], 0, i as u64).unwrap()
        else {
            panic!()
        };
        assert!(store
            .complete(&claim, Some(&resp(&format!("body-{i}"))), 0)
            .unwrap());
        claims.push(claim);
    }
    let ClaimOutcome::Completed(a_ref) = store.claim(&same[0], &[0; 32], 10, 50).unwrap() else {
        panic!()
    };
    // Everything expires; the newcomer takes way 0 and writes its response there.
    let ClaimOutcome::Claimed { claim: b, .. } =
        store.claim(&same[WAYS], &[0; 32], 2_000, 77).unwrap()
    else {
        panic!()
    };
    assert_eq!(b.way, a_ref.way);
    assert!(store
        .complete(&b, Some(&resp("secret-of-b")), 2_000)
        .unwrap());
    assert_eq!(
        store.response(&a_ref).unwrap(),
        None,
        "A's stale reference must not see B's body"
    );
    assert_eq!(store.response(&claims[1]).unwrap().unwrap().body, b"body-1");
}

#[test]
fn a_late_completion_racing_its_successor_never_clobbers_the_slot() {
    // A's claim expired and B took the way. A completes while B's slot write slips in
    // between A's slot read and A's slot write: A's write must fail, not overwrite B.
    let layout = Layout::new("t", 16, 1_000, 60_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(3);
    let resp = |b: &str| StoredResponse {
        status: 200,
        headers: vec![],
        body: b.as_bytes().to_vec(),
    };
    let ClaimOutcome::Claimed { claim: a, .. } = store.claim(&d, &[0; 32], 0, 1).unwrap() else {
        panic!()
    };
    // A checked that it still owns the way; just before its slot write, its claim
    // expires and B claims the way and completes.
    let (s2, l2) = (shared.clone(), layout.clone());
    let a_way = a.way;
    shared.before_next_set(move || {
        let st = SharedStore::new(&*s2, &l2);
        let ClaimOutcome::Claimed { claim: b, .. } = st.claim(&d, &[0; 32], 1_000, 2).unwrap()
        else {
            panic!("B must take the expired way")
        };
        assert_eq!(b.way, a_way);
        assert!(st.complete(&b, Some(&resp("from-b")), 1_000).unwrap());
    });
    assert!(!store.complete(&a, Some(&resp("from-a")), 1_000).unwrap());
    let ClaimOutcome::Completed(done) = store.claim(&d, &[0; 32], 1_001, 3).unwrap() else {
        panic!()
    };
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"from-b");
}

#[test]
fn a_late_completion_creating_a_never_written_slot_never_clobbers_its_successor() {
    // A's slot was never written, so A creates it without reading it first. Just before
    // that create, A's claim expires and B takes the way and completes: A's create must
    // fail (the slot now exists), and A finds it no longer owns the way.
    let layout = Layout::new("t", 16, 1_000, 60_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(3);
    let resp = |b: &str| StoredResponse {
        status: 200,
        headers: vec![],
        body: b.as_bytes().to_vec(),
    };
    let ClaimOutcome::Claimed { claim: a, .. } = store.claim(&d, &[0; 32], 0, 1).unwrap() else {
        panic!()
    };
    assert!(a.slot_empty, "a fresh way's slot holds nothing");
    let (s2, l2) = (shared.clone(), layout.clone());
    let a_way = a.way;
    shared.before_next_set(move || {
        let st = SharedStore::new(&*s2, &l2);
        let ClaimOutcome::Claimed { claim: b, .. } = st.claim(&d, &[0; 32], 1_000, 2).unwrap()
        else {
            panic!("B must take the expired way")
        };
        assert_eq!(b.way, a_way);
        assert!(st.complete(&b, Some(&resp("from-b")), 1_000).unwrap());
    });
    assert!(!store.complete(&a, Some(&resp("from-a")), 999).unwrap());
    let ClaimOutcome::Completed(done) = store.claim(&d, &[0; 32], 1_001, 3).unwrap() else {
        panic!()
    };
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"from-b");
}

#[test]
fn a_completion_whose_empty_slot_exists_after_all_still_stores_its_response() {
    // The bucket counted no bytes for the way, but its slot exists (blanked earlier):
    // the create fails and the completion reads the slot's cas as usual.
    let layout = Layout::new("t", 16, 1_000, 60_000);
    let shared = FakeShared::new();
    let store = SharedStore::new(&*shared, &layout);
    let d = digest(4);
    let ClaimOutcome::Claimed { claim, .. } = store.claim(&d, &[0; 32], 0, 1).unwrap() else {
        panic!()
    };
    assert!(claim.slot_empty);
    use crate::store::SharedData;
    let slot = layout.response_key(claim.buckets, claim.bucket, claim.way);
    shared.set(&slot, b"", u32::MAX).unwrap();
    let body = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"kept".to_vec(),
    };
    assert!(store.complete(&claim, Some(&body), 10).unwrap());
    let ClaimOutcome::Completed(done) = store.claim(&d, &[0; 32], 20, 2).unwrap() else {
        panic!()
    };
    assert_eq!(store.response(&done).unwrap().unwrap().body, b"kept");
}

#[test]
fn tombstoned_and_garbage_buckets_read_as_empty() {
    let layout = Layout::new("t", 16, 1_000, 1_000);
    let shared = FakeShared::new();
    let d = digest(5);
    use crate::store::SharedData;
    shared
        .set(&layout.bucket_key(layout.bucket_of(&d)), b"", 0)
        .unwrap();
    let store = SharedStore::new(&*shared, &layout);
    assert!(matches!(
        store.claim(&d, &[0; 32], 0, 1).unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    shared
        .set(
            &layout.bucket_key(layout.bucket_of(&d)),
            b"\x01garbage-of-odd-length",
            0,
        )
        .unwrap();
    assert!(matches!(
        store.claim(&d, &[0; 32], 0, 2).unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

#[test]
fn stored_response_decoding_is_total() {
    let r = StoredResponse {
        status: 201,
        headers: vec![("a".into(), b"1".to_vec())],
        body: b"hello".to_vec(),
    };
    let d = digest(1);
    let bytes = r.encode(&d, 42);
    assert_eq!(StoredResponse::decode(&bytes, &d, 42), Some(r));
    assert_eq!(StoredResponse::decode(&bytes, &d, 43), None);
    assert_eq!(StoredResponse::decode(&bytes, &digest(2), 42), None);
    for cut in 0..bytes.len() {
        assert_eq!(StoredResponse::decode(&bytes[..cut], &d, 42), None);
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(StoredResponse::decode(&long, &d, 42), None);
}

#[test]
fn capture_caps_the_body() {
    let mut c = Capture::new(200, vec![("x".into(), b"1".to_vec())], 4);
    c.body(b"ab");
    c.body(b"cd");
    assert_eq!(c.clone().finish().unwrap().body, b"abcd");
    c.body(b"e");
    assert_eq!(c.finish(), None);
}

#[test]
fn no_input_makes_the_stream_panic() {
    // Arbitrary bytes in every field the client controls.
    let p = plugin(
        r#"{"key": {"json_pointer": "/a/0", "fingerprint": ["method", "path", "query", "body", "header:x"]}, "scope": {"headers": ["x"]}}"#,
    );
    let (_, mut env) = world();
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

// ---------- the etcd store (logic against a fake of etcd's JSON gateway) ----------

const ETCD: &str = r#""store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500}"#;

fn etcd_plugin(extra: &str) -> Plugin {
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!("{{{ETCD}{sep}{extra}}}"))
}

/// The etcd store over the JSON gateway (`store.protocol: "json"`).
const ETCD_JSON: &str =
    r#""store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500, "protocol": "json"}"#;

fn etcd_json_plugin(extra: &str) -> Plugin {
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!("{{{ETCD_JSON}{sep}{extra}}}"))
}

/// Two proxies (workers of different Envoys) sharing one etcd.
fn two_proxies() -> (FakeEnv, FakeEnv) {
    let a = FakeEnv::new(FakeShared::new(), 1);
    let mut b = FakeEnv::new(FakeShared::new(), 2);
    b.etcd = a.etcd.clone();
    (a, b)
}

#[test]
fn etcd_config() {
    let c = Config::parse(br#"{"store": {"kind": "etcd", "cluster": "etcd-c"}}"#).unwrap();
    match c.store {
        crate::config::StoreConfig::Etcd(e) => {
            assert_eq!(
                (
                    e.cluster.as_str(),
                    e.authority.as_str(),
                    e.prefix.as_str(),
                    e.timeout_ms
                ),
                ("etcd-c", "etcd-c", "proxy-dedup/", 3000)
            );
            assert_eq!(e.protocol, crate::etcd::Protocol::Grpc, "gRPC by default");
        }
        other => panic!("{other:?}"),
    }
    for (name, want) in [
        ("grpc", crate::etcd::Protocol::Grpc),
        ("json", crate::etcd::Protocol::Json),
    ] {
        let c = Config::parse(
            format!(r#"{{"store": {{"kind": "etcd", "cluster": "e", "protocol": "{name}"}}}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert!(matches!(c.store, crate::config::StoreConfig::Etcd(e) if e.protocol == want));
    }
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "protocol": "http"}}"#).0,
        "store.protocol"
    );
    assert_eq!(
        cfg_err(r#"{"store": {"protocol": "grpc"}}"#).0,
        "store.protocol",
        "only for etcd"
    );
    assert_eq!(cfg_err(r#"{"store": {"kind": "etcd"}}"#).0, "store.cluster");
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "timeout_ms": 1}}"#).0,
        "store.timeout_ms"
    );
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "namespace": "x"}}"#).0,
        "store.namespace"
    );
    assert_eq!(cfg_err(r#"{"store": {"cluster": "e"}}"#).0, "store.cluster");
    assert_eq!(
        cfg_err(r#"{"store": {"kind": "etcd", "cluster": "e", "prefix": ""}}"#).0,
        "store.prefix"
    );
}

#[test]
fn etcd_first_executes_other_proxy_replays_and_in_flight_conflicts() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/orders").key("k1").body("{}");
    let first = send(&p, &mut a, &r).unwrap();
    // In flight on proxy A: B answers 409 from etcd's record.
    assert_eq!(send(&p, &mut b, &r).unwrap_err().status(), 409);
    assert_eq!(
        send(&p, &mut b, &req("POST", "/orders").key("k1").body("other"))
            .unwrap_err()
            .status(),
        422
    );
    assert_eq!(
        respond(&p, &mut a, first, ok("made")),
        Outcome::Upstream(200, b"made".to_vec())
    );
    let replay = run(&p, &mut b, &r, ok("no"));
    assert_eq!(replay.local().body, b"made");
    assert_eq!(
        replay.local().header("idempotent-replayed"),
        Some(&b"true"[..])
    );
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
}

#[test]
fn etcd_local_tier_answers_without_a_round_trip() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/orders").key("k1").body("{}");
    run(&p, &mut a, &r, ok("made"));
    // The executing worker learned the completed record when etcd confirmed it.
    a.etcd.set_down(true);
    assert_eq!(run(&p, &mut a, &r, ok("no")).local().body, b"made");
    assert_eq!(
        run(
            &p,
            &mut a,
            &req("POST", "/orders").key("k1").body("x"),
            ok("no")
        )
        .status(),
        422
    );
    // B has not seen it: it needs etcd, which is down: fails open.
    assert_eq!(
        run(&p, &mut b, &r, ok("through")),
        Outcome::Upstream(200, b"through".to_vec())
    );
    assert_eq!(b.count_of(Counter::FailedOpen), 1);
    a.etcd.set_down(false);
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"made");
    a.etcd.set_down(true);
    assert_eq!(
        run(&p, &mut b, &r, ok("no")).local().body,
        b"made",
        "B learned it from the replay"
    );
}

#[test]
fn etcd_leases_are_reused_not_granted_per_request() {
    let p = etcd_plugin(r#""ttl_seconds": 3600"#);
    let (mut a, _) = two_proxies();
    for i in 0..200 {
        run(
            &p,
            &mut a,
            &req("POST", "/o").key(&format!("k{i}")),
            ok("x"),
        );
        a.now_ms += 10;
    }
    assert_eq!(a.count_of(Counter::Executed), 200);
    // 2 s of traffic: a handful of in-flight windows and one completed window.
    assert!(a.etcd.grants() <= 6, "{} grants", a.etcd.grants());
}

#[test]
fn etcd_release_on_5xx_and_reset() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/pay").key("k").body("{}");
    assert_eq!(run(&p, &mut a, &r, answer(500, "boom")).status(), 500);
    let refused = origin(
        "upstream_reset_before_response_started{connection_failure}",
        0,
    );
    assert_eq!(run(&p, &mut b, &r, ended(refused)), Outcome::Reset);
    assert_eq!(
        run(&p, &mut a, &r, ok("paid")),
        Outcome::Upstream(200, b"paid".to_vec())
    );
    // A reset after the request was sent holds the claim on every proxy.
    let r2 = req("POST", "/pay").key("k2").body("{}");
    assert_eq!(run(&p, &mut a, &r2, upstream_reset()), Outcome::Reset);
    b.now_ms = a.now_ms + 10_000;
    let dup = run(&p, &mut b, &r2, ok("twice"));
    assert_eq!(dup.status(), 409);
    assert_eq!(
        dup.local().header("retry-after"),
        Some(&b"20"[..]),
        "the held record tells how long the hold lasts"
    );
    assert_eq!(a.count_of(Counter::OutcomeUnknown), 1);
    assert_eq!(
        a.count_of(Counter::StoreErrors) + a.count_of(Counter::ClaimsLost),
        0
    );
    assert_eq!(
        a.count_of(Counter::Released) + b.count_of(Counter::Released),
        2
    );
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"paid");
}

#[test]
fn etcd_transport_failures_retry_then_fail_by_mode() {
    let p = etcd_plugin("");
    let (mut a, _) = two_proxies();
    // One member refused the connection: the retry reaches another.
    a.etcd.fail_next(2);
    assert!(matches!(
        run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x")),
        Outcome::Upstream(..)
    ));
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    // A member without a leader answers gRPC "unavailable": retried too.
    let mut s = DedupStream::new(2);
    let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k1b").head, true);
    assert!(matches!(first, Action::Call(_)));
    let unavailable = br#"{"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14}"#;
    let again = s.on_store_answer(
        &p,
        &mut a,
        CallAnswer {
            status: 503,
            body: unavailable.to_vec(),
        },
    );
    assert!(matches!(again, Action::Call(_)), "{again:?}");
    // All down: open passes through, closed answers 503.
    a.etcd.set_down(true);
    assert!(matches!(
        run(&p, &mut a, &req("POST", "/o").key("k2"), ok("x")),
        Outcome::Upstream(..)
    ));
    assert_eq!(a.count_of(Counter::FailedOpen), 1);
    let closed = etcd_plugin(r#""failure_mode": "closed""#);
    let o = run(&closed, &mut a, &req("POST", "/o").key("k3"), ok("x"));
    assert_eq!(o.status(), 503);
    assert_eq!(
        o.problem_type(),
        "urn:proxy-dedup:problem:store-unavailable"
    );
    // A timed-out attempt (Envoy answers 504) is retried while the budget lasts (a member
    // that lost its leader keeps the request until it times out), then it fails.
    let mut s = DedupStream::new(3);
    let first = s.on_request_headers(&closed, &mut a, req("POST", "/o").key("k4").head, true);
    let Action::Call(c) = first else {
        panic!("{first:?}")
    };
    assert!(
        c.timeout_ms <= 500 / 3 + 1,
        "one attempt is a slice of the budget: {}",
        c.timeout_ms
    );
    let timeout = || CallAnswer {
        status: 504,
        body: b"upstream request timeout".to_vec(),
    };
    a.now_ms += 200;
    let retried = s.on_store_answer(&closed, &mut a, timeout());
    assert!(matches!(retried, Action::Call(_)), "{retried:?}");
    a.now_ms += 400;
    let after = s.on_store_answer(&closed, &mut a, timeout());
    assert!(
        matches!(after, Action::Reply(ref r) if r.status == 503),
        "{after:?}"
    );
}

#[test]
fn etcd_lost_lease_is_granted_again() {
    let p = etcd_plugin("");
    let (mut a, _) = two_proxies();
    run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x"));
    let grants = a.etcd.grants();
    a.etcd.revoke_all_leases();
    assert!(matches!(
        run(&p, &mut a, &req("POST", "/o").key("k2"), ok("y")),
        Outcome::Upstream(..)
    ));
    assert!(a.etcd.grants() > grants);
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
}

#[test]
fn etcd_in_flight_records_end_only_with_their_lease_whatever_the_clocks() {
    let p = etcd_plugin(r#""ttl_seconds": 10, "in_flight_timeout_seconds": 5"#);
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let t0 = a.now_ms;
    let stuck = send(&p, &mut a, &r).unwrap();
    // B's clock runs 60 s ahead: by its clock the claim expired long ago, but only
    // etcd decides when an in-flight record ends.
    b.clock_ahead_ms = 60_000;
    b.now_ms = t0 + 60_000;
    let dup = run(&p, &mut b, &r, ok("twice"));
    assert_eq!(dup.status(), 409);
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    b.now_ms = t0 + 60_000 + 4_000;
    assert_eq!(run(&p, &mut b, &r, ok("twice")).status(), 409);
    // The in-flight lease (5 s + a 1 s window + the 0.5 s store budget, in whole
    // seconds) has ended by etcd's clock: the key is
    // gone and may run again.
    b.now_ms = t0 + 60_000 + 7_001;
    let retry = send(&p, &mut b, &r).unwrap();
    a.now_ms = t0 + 7_001;
    respond(&p, &mut a, stuck, ok("late"));
    assert_eq!(a.count_of(Counter::ClaimsLost), 1);
    respond(&p, &mut b, retry, ok("fresh"));
    assert_eq!(run(&p, &mut a, &r, ok("no")).local().body, b"fresh");
    // Completed records answer for ttl by the reader's clock, then their lease removes
    // them from etcd.
    let t1 = a.now_ms;
    assert!(a.etcd.key_count(t1) >= 1);
    // ttl + (in flight + window + budget) + 1 s + the completed window, from the grant.
    assert_eq!(
        a.etcd
            .key_count(t1 + 10_000 + 6_500 + 1_000 + 1_250 + 1_000),
        0
    );
    let (mut c, _) = two_proxies();
    c.etcd = a.etcd.clone();
    c.now_ms = t1 + 10_000;
    assert!(
        matches!(run(&p, &mut c, &r, ok("third")), Outcome::Upstream(..)),
        "expired after ttl"
    );
}

#[test]
fn etcd_unreadable_records_are_never_taken_over() {
    let p = etcd_plugin("");
    let (mut a, _) = two_proxies();
    let r = req("POST", "/o").key("k");
    let s = send(&p, &mut a, &r).unwrap();
    drop(s);
    // Overwrite the record with bytes this version cannot read (a newer format).
    a.etcd.corrupt_all();
    // An hour later by this proxy's clock (etcd's lease has not run out).
    a.now_ms += 3_600_000;
    a.clock_ahead_ms = 3_600_000;
    assert_eq!(run(&p, &mut a, &r, ok("twice")).status(), 409);
}

#[test]
fn etcd_completion_and_release_are_retried_and_recognised_when_answers_are_lost() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    // Completion refused once (dead member), then accepted.
    let r = req("POST", "/o").key("k1");
    let s = send(&p, &mut a, &r).unwrap();
    a.etcd.fail_next(1);
    respond(&p, &mut a, s, ok("one"));
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"one");
    // Completion applied but its answer lost: the retry's compare fails on our own
    // completed record, which counts as confirmed.
    let r2 = req("POST", "/o").key("k2");
    let s = send(&p, &mut a, &r2).unwrap();
    a.etcd.lose_next_answers(1);
    respond(&p, &mut a, s, ok("two"));
    assert_eq!(a.count_of(Counter::ClaimsLost), 0);
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    assert_eq!(run(&p, &mut b, &r2, ok("no")).local().body, b"two");
    // Release applied but its answer lost: the key is gone, which is what we wanted.
    let r3 = req("POST", "/o").key("k3");
    let s = send(&p, &mut a, &r3).unwrap();
    a.etcd.lose_next_answers(1);
    respond(&p, &mut a, s, answer(503, "busy"));
    assert_eq!(a.count_of(Counter::ClaimsLost), 0);
    assert!(matches!(
        run(&p, &mut b, &r3, ok("again")),
        Outcome::Upstream(..)
    ));
}

// ---------- hardening: scope, identity, layouts, secrets ----------

#[test]
fn two_hosts_never_share_records_unless_authority_is_left_out() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let mut acme = req("POST", "/o").key("k").body("{}");
    acme.head.authority = "acme.example".into();
    let mut globex = acme.clone();
    globex.head.authority = "Globex.Example".into();
    assert!(matches!(
        run(&p, &mut env, &acme, ok("acme")),
        Outcome::Upstream(..)
    ));
    assert_eq!(
        run(&p, &mut env, &globex, ok("globex")),
        Outcome::Upstream(200, b"globex".to_vec())
    );
    assert_eq!(run(&p, &mut env, &acme, ok("no")).local().body, b"acme");
    // Host names compare case-insensitively.
    globex.head.authority = "globex.example".into();
    assert_eq!(run(&p, &mut env, &globex, ok("no")).local().body, b"globex");
    let p = plugin(r#"{"scope": {"authority": false}, "store": {"namespace": "other"}}"#);
    assert!(matches!(
        run(&p, &mut env, &acme, ok("acme")),
        Outcome::Upstream(..)
    ));
    assert_eq!(run(&p, &mut env, &globex, ok("no")).local().body, b"acme");
}

#[test]
fn pseudo_headers_can_scope_and_fingerprint() {
    let p = plugin(r#"{"scope": {"authority": false, "headers": [":path"]}}"#);
    let (_, mut env) = world();
    let a = req("POST", "/a").key("k");
    let b = req("POST", "/b").key("k");
    assert!(matches!(
        run(&p, &mut env, &a, ok("a")),
        Outcome::Upstream(..)
    ));
    // Without the path in the scope, /b would be a 422 payload mismatch.
    assert!(matches!(
        run(&p, &mut env, &b, ok("b")),
        Outcome::Upstream(..)
    ));
    let p = plugin(r#"{"key": {"fingerprint": ["header::authority", "body"]}}"#);
    let mut x = req("POST", "/x").body("same");
    x.head.authority = "one.example".into();
    assert!(matches!(
        run(&p, &mut env, &x, ok("one")),
        Outcome::Upstream(..)
    ));
    assert_eq!(run(&p, &mut env, &x, ok("no")).local().body, b"one");
    assert_eq!(
        cfg_err(r#"{"scope": {"headers": [":scheme"]}}"#).0,
        "scope.headers"
    );
    assert_eq!(
        cfg_err(r#"{"scope": {"headers": ["x-t", "X-T"]}}"#).0,
        "scope.headers"
    );
    assert_eq!(
        cfg_err(r#"{"key": {"headers": [":authority"]}}"#).0,
        "key.headers"
    );
    assert_eq!(
        cfg_err(r#"{"key": {"fingerprint": ["header::x"]}}"#).0,
        "key.fingerprint"
    );
}

#[test]
fn repeated_key_or_scope_headers_are_refused() {
    let p = plugin(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let (_, mut env) = world();
    let victim = req("POST", "/o").key("k").header("x-tenant", "victim");
    assert!(matches!(
        run(&p, &mut env, &victim, ok("secret")),
        Outcome::Upstream(..)
    ));
    let smuggled = victim.clone().header("x-tenant", "attacker");
    let o = run(&p, &mut env, &smuggled, ok("no"));
    assert_eq!(o.status(), 400);
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-scope");
    let two_keys = req("POST", "/o")
        .key("k")
        .key("k2")
        .header("x-tenant", "victim");
    let o = run(&p, &mut env, &two_keys, ok("no"));
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-key");
    // Even the same value twice is refused: a proxy in front may have added one.
    let same_twice = req("POST", "/o")
        .key("k")
        .key("k")
        .header("x-tenant", "victim");
    assert_eq!(run(&p, &mut env, &same_twice, ok("no")).status(), 400);
    assert_eq!(env.count_of(Counter::BadKey), 3);
    // A JSON body naming the pointer's member twice is ambiguous too.
    let p = plugin(r#"{"key": {"json_pointer": "/id"}}"#);
    let o = run(
        &p,
        &mut env,
        &req("POST", "/o").body(r#"{"id": "a", "id": "b"}"#),
        ok("no"),
    );
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-key");
}

#[test]
fn grpc_requests_pass_untouched() {
    let p = plugin(r#"{"key": {"required": true}}"#);
    let (shared, mut env) = world();
    for ct in [
        "application/grpc",
        "application/grpc+proto",
        "Application/GRPC-web",
    ] {
        let r = req("POST", "/pkg.Svc/Call")
            .key("k")
            .header("content-type", ct)
            .body("x");
        assert!(matches!(
            run(&p, &mut env, &r, ok("a")),
            Outcome::Upstream(..)
        ));
        assert!(matches!(
            run(&p, &mut env, &r, ok("b")),
            Outcome::Upstream(..)
        ));
    }
    assert_eq!(env.count_of(Counter::Bypassed), 6);
    assert_eq!(shared.key_count(), 0);
}

#[test]
fn the_bucket_secret_is_created_once_and_keys_the_bucket_choice() {
    use crate::store::bucket_secret;
    let shared = FakeShared::new();
    // Another worker creates it between our read and our create: we read theirs.
    let s2 = shared.clone();
    shared.before_next_set(move || {
        assert_eq!(bucket_secret(&*s2, "ns", [2; 32]).unwrap(), [2; 32]);
    });
    assert_eq!(bucket_secret(&*shared, "ns", [1; 32]).unwrap(), [2; 32]);
    assert_eq!(bucket_secret(&*shared, "ns", [3; 32]).unwrap(), [2; 32]);
    // A different secret sends the same digests to other buckets: nobody who does not
    // know it can aim keys at a bucket.
    let a = Layout::new("ns", 16_000, 1, 1).with_secret([2; 32]);
    let b = Layout::new("ns", 16_000, 1, 1).with_secret([9; 32]);
    let moved = (0..200).filter(|i| a.bucket_of(&digest(*i)) != b.bucket_of(&digest(*i)));
    assert!(moved.count() > 190);
}

#[test]
fn a_config_push_that_changes_capacity_keeps_records_answering() {
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 1600}"#);
    let new = plugin(r#"{"capacity": 3200, "ttl_seconds": 600}"#);
    let done = req("POST", "/o").key("done");
    let flying = req("POST", "/o").key("flying");
    assert!(matches!(
        run(&old, &mut env, &done, ok("old")),
        Outcome::Upstream(..)
    ));
    let first = send(&old, &mut env, &flying).unwrap();
    // After the push: the completed key replays, the in-flight one is still in flight.
    assert_eq!(run(&new, &mut env, &done, ok("no")).local().body, b"old");
    assert_eq!(run(&new, &mut env, &flying, ok("no")).status(), 409);
    let _ = respond(&old, &mut env, first, ok("flown"));
    assert_eq!(
        run(&new, &mut env, &flying, ok("no")).local().body,
        b"flown"
    );
    // And the other way: the old configuration (still draining) sees the new one's.
    let fresh = req("POST", "/o").key("fresh");
    assert!(matches!(
        run(&new, &mut env, &fresh, ok("new")),
        Outcome::Upstream(..)
    ));
    assert_eq!(run(&old, &mut env, &fresh, ok("no")).local().body, b"new");
    assert_eq!(env.count_of(Counter::Executed), 3);
}

#[test]
fn concurrent_claims_under_two_layouts_run_once() {
    for first_old in [true, false] {
        let shared = FakeShared::new();
        let old = Layout::new("t", 1600, 30_000, 60_000);
        let new = Layout::new("t", 3200, 30_000, 60_000);
        SharedStore::new(&*shared, &old).register(1000).unwrap();
        SharedStore::new(&*shared, &new).register(1000).unwrap();
        let (d, p) = (digest(5), [7u8; 32]);
        let (a, b) = if first_old { (old, new) } else { (new, old) };
        // B's whole claim runs between A's read of its own bucket and A's CAS.
        let (s2, b2) = (shared.clone(), b.clone());
        shared.before_next_set(move || {
            let o = SharedStore::new(&*s2, &b2).claim(&d, &p, 1000, 2).unwrap();
            assert!(matches!(o, ClaimOutcome::Claimed { .. }));
        });
        let o = SharedStore::new(&*shared, &a)
            .claim(&d, &p, 1000, 1)
            .unwrap();
        assert_eq!(
            o,
            ClaimOutcome::InFlight { held_until: None },
            "first_old {first_old}"
        );
        // A yielded and left nothing behind: B's claim is the only one.
        let again = SharedStore::new(&*shared, &a)
            .claim(&d, &p, 1000, 3)
            .unwrap();
        assert_eq!(again, ClaimOutcome::InFlight { held_until: None });
    }
}

#[test]
fn etcd_records_larger_than_the_record_limit_complete_without_the_response() {
    let p = plugin(
        r#"{"max_replay_body_bytes": 20000,
            "store": {"kind": "etcd", "cluster": "etcd", "max_record_bytes": 40000}}"#,
    );
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let mut big = ok(&"x".repeat(10_000));
    big.headers.push(("x-big".into(), vec![b'h'; 35_000]));
    assert!(matches!(run(&p, &mut a, &r, big), Outcome::Upstream(..)));
    let dup = run(&p, &mut b, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
    // A replay cap that cannot fit a record is refused at configure time.
    let (field, _) =
        cfg_err(r#"{"max_replay_body_bytes": 2000000, "store": {"kind": "etcd", "cluster": "e"}}"#);
    assert_eq!(field, "max_replay_body_bytes");
    let (field, _) = cfg_err(r#"{"store": {"max_record_bytes": 100000}}"#);
    assert_eq!(field, "store.max_record_bytes");
}

#[test]
fn etcd_a_claim_won_after_the_client_left_is_released() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let mut s = DedupStream::new(3);
    let mut action = s.on_request_headers(&p, &mut a, r.head.clone(), true);
    // Grant leases, up to the claim txn itself.
    while let Action::Call(c) = &action {
        if crate::etcd::is_txn(c.path) {
            break;
        }
        let answer = call(&a, c);
        action = s.on_store_answer(&p, &mut a, answer);
    }
    let Action::Call(claim) = action else {
        panic!("expected the claim txn, got {action:?}")
    };
    // The client leaves while the claim is out; etcd then accepts it.
    assert_eq!(s.on_stream_end(&p, &mut a, &origin("", flags::DC)), None);
    let answer = call(&a, &claim);
    let released = s.on_store_answer(&p, &mut a, answer);
    assert!(
        matches!(released, Action::Call(_)),
        "a release txn, not a forward"
    );
    let after = settle(&p, &mut a, &mut s, released);
    assert_eq!(after, Action::Continue);
    assert_eq!(a.count_of(Counter::Released), 1);
    // Nothing was forwarded, so the key is free.
    assert!(matches!(
        run(&p, &mut b, &r, ok("once")),
        Outcome::Upstream(..)
    ));
}

#[test]
fn each_decision_is_reported_once_for_access_logs() {
    let p = plugin(r#"{"key": {"required": false}}"#);
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k").body("{}");
    let mut s = send(&p, &mut env, &r).unwrap();
    let (verdict, record) = s.log_fields().unwrap();
    assert_eq!(verdict, "executed");
    let record = record.unwrap().to_string();
    assert_eq!(record.len(), 12);
    assert!(s.log_fields().is_none(), "unchanged: nothing new to report");
    let _ = respond(&p, &mut env, s, ok("done"));
    let decisions = [
        (r.clone(), "replayed"),
        (req("POST", "/o").key("k").body("other"), "mismatch"),
        (req("GET", "/o").key("k"), "bypassed"),
        (req("POST", "/o").key("k").key("k"), "bad_key"),
    ];
    for (r, want) in decisions {
        let mut s = DedupStream::new(2);
        let action = s.on_request_headers(&p, &mut env, r.head.clone(), r.body.is_none());
        let action = if action == Action::Pause {
            let body = r.body.clone().unwrap_or_default();
            s.on_request_body(&p, &mut env, body.len(), true, || Some(body.clone()))
        } else {
            action
        };
        assert!(!matches!(action, Action::Pause | Action::Call(_)));
        assert_eq!(s.log_fields().map(|f| f.0), Some(want));
    }
    // The held and released outcomes are reported when the response decides them.
    let r = req("POST", "/o").key("k2");
    let mut s = send(&p, &mut env, &r).unwrap();
    let _ = s.log_fields();
    assert_eq!(s.on_stream_end(&p, &mut env, &origin("", flags::DC)), None);
    assert_eq!(s.log_fields().map(|f| f.0), Some("outcome_unknown"));
    let r = req("POST", "/o").key("k3");
    let mut s = send(&p, &mut env, &r).unwrap();
    let up = Origin::upstream();
    let _ = s.on_response_headers(&p, &mut env, 503, &up, Vec::new, true);
    assert_eq!(s.log_fields().map(|f| f.0), Some("released"));
}

#[test]
fn a_push_redelivery_with_a_new_attempt_count_is_replayed_not_422() {
    let p = plugin(
        r#"{"key": {"json_pointer": "/message/messageId", "required": true},
            "payload": {"ignore_json_pointers": ["/deliveryAttempt"]}}"#,
    );
    let (_, mut env) = world();
    let push = |attempt: u32, data: &str| {
        req("POST", "/push").body(&format!(
            r#"{{"message": {{"messageId": "m-1", "data": "{data}"}}, "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert!(matches!(
        run(&p, &mut env, &push(1, "aGk="), ok("acked")),
        Outcome::Upstream(..)
    ));
    assert_eq!(
        run(&p, &mut env, &push(2, "aGk="), ok("no")).local().body,
        b"acked"
    );
    let changed = run(&p, &mut env, &push(3, "Ynll"), ok("no"));
    assert_eq!(
        changed.problem_type(),
        "urn:proxy-dedup:problem:payload-mismatch"
    );
    // Config errors name the field.
    for (json, field) in [
        (
            r#"{"payload": {"json_pointers": ["a"]}}"#,
            "payload.json_pointers",
        ),
        (
            r#"{"payload": {"ignore_json_pointers": ["/~2"]}}"#,
            "payload.ignore_json_pointers",
        ),
        (
            r#"{"payload": {"json_pointers": ["/a"], "ignore_json_pointers": ["/b"]}}"#,
            "payload.ignore_json_pointers",
        ),
        (
            r#"{"payload": {"parts": ["method", "body", "method"]}}"#,
            "payload.parts",
        ),
        (
            r#"{"payload": {"parts": ["path"], "json_pointers": ["/a"]}}"#,
            "payload.parts",
        ),
        (r#"{"payload": {"parts": []}}"#, "payload.parts"),
        (r#"{"payload": {"what": 1}}"#, "payload.what"),
    ] {
        assert_eq!(cfg_err(json).0, field, "{json}");
    }
}

// ---------- the operator API ----------

fn admin(p: &Plugin, env: &mut FakeEnv, method: &str, path: &str) -> LocalReply {
    let mut a = crate::admin::AdminStream::default();
    let mut action = a.on_request(p, env, method, path, "127.0.0.1:5555");
    while let Action::Call(c) = action {
        let answer = call(env, &c);
        action = a.on_store_answer(p, env, answer);
    }
    match action {
        Action::Reply(r) => r,
        other => panic!("admin requests are answered locally, got {other:?}"),
    }
}

fn admin_json(r: &LocalReply) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn check_admin_api(p: &Plugin, admin_p: &Plugin, env: &mut FakeEnv) {
    let r = req("POST", "/o")
        .key("done")
        .header("x-tenant", "acme")
        .body("{}");
    assert!(matches!(
        run(p, env, &r, answer(201, "made")),
        Outcome::Upstream(..)
    ));
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
    assert!(matches!(
        run(p, env, &flying, ok("again")),
        Outcome::Upstream(..)
    ));
    // Purged: the key executes again (etcd: once workers' copies have aged out).
    assert_eq!(
        admin(admin_p, env, "DELETE", &format!("/records?key=done&{q}")).status,
        200
    );
    assert_eq!(
        admin(admin_p, env, "GET", &format!("/records?key=done&{q}")).status,
        404
    );
    env.now_ms += crate::local::MAX_AGE_MS;
    assert!(matches!(
        run(p, env, &r, ok("second")),
        Outcome::Upstream(..)
    ));
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

#[path = "edge_tests.rs"]
mod edge;

#[path = "wait_tests.rs"]
mod wait_tests;

#[path = "rules_tests.rs"]
mod rules;

#[path = "budget_tests.rs"]
mod budget;

// ---------- the method-only fast path (the glue skips reading the other headers) ----------

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
