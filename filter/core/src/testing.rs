//! Test-only builders shared by the native tests: a request (`Req`), an upstream answer
//! (`Answer`), the outcome a client sees (`Outcome`), and drivers that run a request through
//! a `Plugin` and a `DedupStream` against the fakes of `fake.rs` (shared data, etcd).

use crate::config::Config;
use crate::fake::{FakeEnv, FakeShared};
use crate::key::RequestHead;
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::reply::LocalReply;
use crate::stream::{CallAnswer, StoreCall};
use crate::stream::{Decision, DedupStream, Origin, Plugin};
use std::sync::Arc;

#[derive(Clone)]
pub(crate) struct Req {
    pub(crate) head: RequestHead,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) chunk: usize,
    pub(crate) trailers: bool,
}

pub(crate) fn req(method: &str, path: &str) -> Req {
    Req {
        head: RequestHead {
            method: method.into(),
            path: path.into(),
            authority: "api.example".into(),
            headers: Vec::new(),
            protocol: String::new(),
            properties: Vec::new(),
        },
        body: None,
        chunk: 7,
        trailers: false,
    }
}

impl Req {
    pub(crate) fn header(mut self, n: &str, v: &str) -> Self {
        self.head.headers.push((n.into(), v.into()));
        self
    }
    /// A header whose value is any bytes (not UTF-8, say).
    pub(crate) fn header_bytes(mut self, n: &str, v: &[u8]) -> Self {
        self.head.headers.push((n.into(), v.to_vec()));
        self
    }
    /// An Envoy property the glue read for this request (dynamic metadata, say).
    pub(crate) fn property(mut self, path: &str, v: &str) -> Self {
        self.head.properties.push((path.into(), v.into()));
        self
    }
    pub(crate) fn key(self, k: &str) -> Self {
        self.header("idempotency-key", k)
    }
    pub(crate) fn body(mut self, b: &str) -> Self {
        self.body = Some(b.as_bytes().to_vec());
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Reached the upstream, which answered this.
    Upstream(u16, Vec<u8>),
    Local(LocalReply),
    /// Reached the upstream, which reset the stream.
    Reset,
}

impl Outcome {
    /// The request reached the upstream (it was not answered by the filter).
    pub(crate) fn reached_upstream(&self) -> bool {
        matches!(self, Outcome::Upstream(..))
    }
    /// Asserts the request reached the upstream; `why` says why it should have.
    pub(crate) fn assert_upstream(&self, why: &str) {
        assert!(self.reached_upstream(), "{why}: {self:?}");
    }
    /// Asserts the filter answered with a replay of this body.
    pub(crate) fn assert_replays(&self, body: &[u8]) {
        assert_eq!(self.local().body, body);
    }
    pub(crate) fn status(&self) -> u16 {
        match self {
            Outcome::Upstream(s, _) => *s,
            Outcome::Local(r) => r.status,
            Outcome::Reset => 0,
        }
    }
    pub(crate) fn local(&self) -> &LocalReply {
        match self {
            Outcome::Local(r) => r,
            other => panic!("expected a local reply, got {other:?}"),
        }
    }
    pub(crate) fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.local().body).unwrap();
        v["type"].as_str().unwrap().to_string()
    }
}

/// The problem type of a local reply.
pub(crate) fn problem_of(r: &LocalReply) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["type"].as_str().unwrap().to_string()
}

pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
    /// Where Envoy says the response came from.
    pub(crate) origin: Origin,
    /// The stream ends without response headers (`origin` says why).
    pub(crate) reset: bool,
}

pub(crate) fn origin(details: &str, flag_bits: u64) -> Origin {
    Origin {
        details: details.into(),
        flags: flag_bits,
    }
}

/// The upstream reset the stream after the request was sent: the outcome is unknown.
pub(crate) fn upstream_reset() -> Answer {
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
pub(crate) fn ended(o: Origin) -> Answer {
    Answer {
        reset: true,
        origin: o,
        ..ok("")
    }
}

/// A local reply generated after the filter (router, a later filter) with `o`.
pub(crate) fn local(status: u16, o: Origin) -> Answer {
    Answer {
        origin: o,
        ..answer(status, "local")
    }
}

pub(crate) fn ok(body: &str) -> Answer {
    answer(200, body)
}

pub(crate) fn answer(status: u16, body: &str) -> Answer {
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
pub(crate) fn call(env: &FakeEnv, c: &StoreCall) -> CallAnswer {
    let (status, body) =
        env.etcd_of(&c.route.cluster)
            .handle(c.path, &c.body, env.now_ms - env.clock_ahead_ms);
    CallAnswer {
        status,
        body,
        ..Default::default()
    }
}

/// Runs store calls until the stream decides.
pub(crate) fn settle(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    action: Decision,
) -> Decision {
    settle_traced(p, env, s, action).0
}

/// Runs store calls until the stream decides: the decision, and the shard of each call,
/// in order.
pub(crate) fn settle_traced(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    mut action: Decision,
) -> (Decision, Vec<String>) {
    let mut shards = Vec::new();
    while let Decision::Call(c) = action {
        shards.push(c.route.shard.clone());
        let a = call(env, &c);
        action = s.on_store_answer(p, env, a);
    }
    (action, shards)
}

/// Runs store calls until `stop` picks one, which is returned unanswered (`Err`: the
/// stream decided first, and how).
pub(crate) fn run_calls_until(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    mut action: Decision,
    stop: impl Fn(&DedupStream, &StoreCall) -> bool,
) -> Result<StoreCall, Decision> {
    while let Decision::Call(c) = action {
        if stop(s, &c) {
            return Ok(c);
        }
        let a = call(env, &c);
        action = s.on_store_answer(p, env, a);
    }
    Err(action)
}

/// For `run_calls_until`: the stream's ordering entity has a call out.
pub(crate) fn entity_call_out(s: &DedupStream, _: &StoreCall) -> bool {
    format!("{s:?}").contains("phase: ordering")
}

/// The answer to a stream's detached call, store calls run until the stream decides.
pub(crate) fn detached_answer(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    answer: CallAnswer,
) -> Decision {
    let d = s.on_store_answer(p, env, answer);
    settle(p, env, s, d)
}

/// An upstream's answer to a detached call: status, headers, body.
pub(crate) fn call_answer(status: u16, body: &str) -> CallAnswer {
    CallAnswer {
        status,
        body: body.as_bytes().to_vec(),
        headers: vec![
            (":status".to_string(), status.to_string().into_bytes()),
            ("content-type".to_string(), b"text/plain".to_vec()),
            ("set-cookie".to_string(), b"s=1".to_vec()),
        ],
    }
}

/// Delivers a response-side store call (completion, release) while the stream lives.
pub(crate) fn deliver(p: &Plugin, env: &mut FakeEnv, s: &mut DedupStream, c: Option<StoreCall>) {
    let mut next = c;
    while let Some(c) = next {
        let a = call(env, &c);
        next = match s.on_store_answer(p, env, a) {
            Decision::Call(c) => Some(c),
            _ => None,
        };
    }
}

pub(crate) fn send(p: &Plugin, env: &mut FakeEnv, r: &Req) -> Result<DedupStream, Outcome> {
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
            if action != Decision::Pause {
                break;
            }
            // Envoy buffers while the filter pauses; the filter reads it all at the end.
            buffered += c.len();
            let whole = body[..buffered].to_vec();
            action = s.on_request_body(p, env, buffered, i + 1 == n && !r.trailers, || Some(whole));
        }
        if r.trailers && action == Decision::Pause {
            let whole = body.clone();
            action = s.on_request_trailers(p, env, || Some(whole));
        }
    }
    let action = settle(p, env, &mut s, action);
    match action {
        // Forwarded by the router, or sent detached (answer it with `detached_answer`).
        Decision::Continue | Decision::Upstream(_) => Ok(s),
        Decision::Reply(reply) => {
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
        Decision::Pause => panic!("stream left paused at the end of the request"),
        Decision::Call(_) => unreachable!("settled above"),
    }
}

pub(crate) fn respond(p: &Plugin, env: &mut FakeEnv, mut s: DedupStream, a: Answer) -> Outcome {
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

pub(crate) fn run(p: &Plugin, env: &mut FakeEnv, r: &Req, a: Answer) -> Outcome {
    match send(p, env, r) {
        Ok(s) => respond(p, env, s, a),
        Err(o) => o,
    }
}

pub(crate) fn plugin(json: &str) -> Plugin {
    Plugin::new(Config::parse(json.as_bytes()).unwrap())
}

pub(crate) fn world() -> (Arc<FakeShared>, FakeEnv) {
    let shared = FakeShared::new();
    let env = FakeEnv::new(shared.clone(), 0);
    (shared, env)
}

pub(crate) fn cfg_err(json: &str) -> (String, String) {
    let e = Config::parse(json.as_bytes()).unwrap_err();
    (e.field, e.reason)
}

pub(crate) fn digest(i: u64) -> [u8; 32] {
    let mut d = [0u8; 32];
    let h = <sha2::Sha256 as sha2::Digest>::digest(i.to_be_bytes());
    d.copy_from_slice(&h);
    d
}

pub(crate) const ETCD: &str = r#""store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500}"#;

pub(crate) fn etcd_plugin(extra: &str) -> Plugin {
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!("{{{ETCD}{sep}{extra}}}"))
}

/// The etcd store over the JSON gateway (`store.protocol: "json"`).
pub(crate) const ETCD_JSON: &str =
    r#""store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500, "protocol": "json"}"#;

pub(crate) fn etcd_json_plugin(extra: &str) -> Plugin {
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!("{{{ETCD_JSON}{sep}{extra}}}"))
}

/// Two proxies (workers of different Envoys) sharing one etcd.
pub(crate) fn two_proxies() -> (FakeEnv, FakeEnv) {
    let a = FakeEnv::new(FakeShared::new(), 1);
    let mut b = FakeEnv::new(FakeShared::new(), 2);
    b.etcd = a.etcd.clone();
    (a, b)
}

/// The README's example: payments need a header key for 24 h, webhooks key on a JSON
/// message id for 7 days, search is never deduplicated.
pub(crate) const EXAMPLE: &str = r#"
  "rules": [
    {"name": "payments", "match": {"path_prefix": "/payments"},
     "key": {"required": true}, "ttl_seconds": 86400},
    {"name": "webhooks", "match": {"path_prefix": "/webhooks", "methods": ["POST"]},
     "key": {"json_pointer": "/message/messageId", "required": true},
     "payload": {"ignore_json_pointers": ["/deliveryAttempt"]},
     "ttl_seconds": 604800, "store_statuses": ["2xx"]},
    {"name": "search", "match": {"path_prefix": "/search"}, "bypass": true}
  ]"#;

pub(crate) fn rules(extra: &str) -> Plugin {
    plugin(&format!("{{{EXAMPLE}{extra}}}"))
}

pub(crate) fn admin(p: &Plugin, env: &mut FakeEnv, method: &str, path: &str) -> LocalReply {
    let mut a = crate::admin::AdminStream::default();
    let mut action = a.on_request(p, env, method, path.as_bytes(), "127.0.0.1:5555");
    while let Decision::Call(c) = action {
        let answer = call(env, &c);
        action = a.on_store_answer(p, env, answer);
    }
    match action {
        Decision::Reply(r) => r,
        other => panic!("admin requests are answered locally, got {other:?}"),
    }
}

pub(crate) fn admin_json(r: &LocalReply) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

pub(crate) fn detail(r: &LocalReply) -> String {
    admin_json(r)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The values of these counters in `env`, to assert several at once.
pub(crate) fn counts<const N: usize>(env: &FakeEnv, counters: [Counter; N]) -> [u64; N] {
    counters.map(|c| env.count_of(c))
}

/// A POST to `/o` with key `k{i}`: the `i`th of many distinct keys.
pub(crate) fn keyed(i: usize) -> Req {
    req("POST", "/o").key(&format!("k{i}"))
}

/// A plugin configured with `json`, and one worker over an empty shared-data store.
pub(crate) fn one_worker(json: &str) -> (Plugin, FakeEnv) {
    (plugin(json), world().1)
}

/// Two workers (context ids 0 and 1) over one empty shared-data store.
pub(crate) fn two_workers() -> (FakeEnv, FakeEnv) {
    let (shared, a) = world();
    (a, FakeEnv::new(shared, 1))
}

/// What a client sees when its request ran: the upstream's 200 with this body.
pub(crate) fn executed(body: &str) -> Outcome {
    Outcome::Upstream(200, body.as_bytes().to_vec())
}

/// A stream started with a bodiless POST to `/o` with key `k`: the stream and its first
/// action.
pub(crate) fn start_keyed(p: &Plugin, env: &mut FakeEnv) -> (DedupStream, Decision) {
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(p, env, req("POST", "/o").key("k").head, true);
    (s, first)
}

/// Sends `r` up to the decision, which must forward it: the request and its stream.
pub(crate) fn sent(p: &Plugin, env: &mut FakeEnv, r: Req) -> (Req, DedupStream) {
    let s = send(p, env, &r).unwrap();
    (r, s)
}

/// Two workers over one shared-data store, `r` forwarded on the first: the workers and
/// its stream.
pub(crate) fn sent_on_worker_0(p: &Plugin, r: &Req) -> (FakeEnv, FakeEnv, DedupStream) {
    let (mut a, b) = two_workers();
    let first = send(p, &mut a, r).unwrap();
    (a, b, first)
}
