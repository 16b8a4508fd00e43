//! Model-based fuzzing of the stream machine. Proptest draws a sequence of operations:
//! requests started on random workers (shared data: three workers over one store; etcd:
//! two proxies of two workers over one etcd, the second proxy's clock running ahead),
//! their bodies, store answers that arrive late, lost (applied, answer dropped), failed,
//! duplicated (applied twice) or answered "unavailable", store calls applied again much
//! later, upstream answers of every origin (stored statuses, released statuses, local
//! replies of Envoy or a later filter, unknown outcomes), cut bodies, client hang-ups, and
//! clock jumps. Every decision is checked against a small reference model of the contract
//! (README): at most one execution per (scope, key) while a claim could be live, a claim
//! released only when the upstream answered a status not stored or certainly never ran
//! it; replays equal to the stored response of that execution; 409 and 422 only when the
//! contract says; no replay across scopes or payloads. A divergence is shrunk to a minimal
//! sequence, printed as "minimal failing input", with the trace of that run.

use crate::config::Config;
use crate::etcd::{self, EtcdAnswer};
use crate::fake::{FakeEnv, FakeEtcd, FakeShared};
use crate::key::RequestHead;
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::props::decoders::config as proptest_config;
use crate::reply::LocalReply;
use crate::response::StoredResponse;
use crate::stream::{Action, CallAnswer, DedupStream, Origin, Plugin, StoreCall};
use proptest::prelude::*;
use std::sync::Arc;

const IN_FLIGHT_MS: u64 = 5_000;
const TTL_MS: u64 = 20_000;
/// `max_replay_body_bytes`: some responses are too large to keep.
const CAP: usize = 8;
const START_MS: u64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Shared,
    Etcd,
}

/// The configuration of one run.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    store: StoreKind,
    unknown_release: bool,
    reject: bool,
    closed: bool,
    /// How far the second proxy's clock runs ahead of etcd's (etcd store).
    skew_ms: u64,
    /// etcd store: two workers per proxy (else one).
    two_workers: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    NoKey,
    TwoKeys,
    TwoScopes,
    /// Not deduplicated (GET): passes untouched.
    Get,
}

/// What happens to a store call's answer.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Normal,
    /// Applied, but the answer is lost (connection reset): 503 without body.
    Lost,
    /// Refused before etcd saw it (if not applied yet): 503 without body.
    Failed,
    /// Applied twice (a resent request); the second application's answer arrives.
    Duplicated,
    /// A member without a leader: gRPC "unavailable", not applied.
    Unavailable,
    /// Applied now; the answer arrives just before Envoy's timeout for the call.
    Late,
}

#[derive(Debug, Clone, Copy)]
enum Resp {
    /// The upstream answered `status` with a body of `len` bytes.
    Upstream { status: u16, len: u8 },
    /// Envoy or a later filter answered: the upstream never got the request.
    NotSent(u8),
    /// Envoy answered after the request may have reached the upstream.
    Unknown(u8),
}

/// Why a stream ends before its response headers.
#[derive(Debug, Clone, Copy)]
enum EndWhy {
    ClientGone,
    UpstreamReset,
    Refused,
    NoHealthy,
}

#[derive(Debug, Clone)]
enum Op {
    Start {
        worker: u8,
        scope: u8,
        key: u8,
        /// 0: no body; 1, 2: two bodies.
        payload: u8,
        bad: Option<Bad>,
        /// Shared data: which of two configurations (capacities) serves it.
        layout: u8,
    },
    Body {
        s: u8,
    },
    /// etcd applies a pending call; its answer comes later.
    Apply {
        s: u8,
    },
    Deliver {
        s: u8,
        fate: Fate,
    },
    Respond {
        s: u8,
        r: Resp,
    },
    /// The next chunk of a response body (the last one ends it, or trailers do).
    RespBody {
        s: u8,
        trailers: bool,
    },
    End {
        s: u8,
        why: EndWhy,
    },
    Tick {
        ms: u32,
    },
    /// etcd applies an already answered call once more (a delayed duplicate).
    Zombie {
        c: u8,
    },
}

fn not_sent_origin(i: u8) -> (u16, Origin) {
    let (status, details, f) = match i % 4 {
        0 => (503, "no_healthy_upstream", flags::UH),
        1 => (429, "local_rate_limited", flags::RL),
        // A direct response of 200: a success status, but not the upstream's.
        2 => (200, "direct_response", 0),
        _ => (
            503,
            "upstream_reset_before_response_started{connection_failure}",
            flags::UF,
        ),
    };
    (status, origin(details, f))
}

fn unknown_origin(i: u8) -> (u16, Origin) {
    let (status, details, f) = match i % 3 {
        0 => (504, "response_timeout", flags::UT),
        1 => (
            503,
            "upstream_reset_before_response_started{connection_termination}",
            flags::UC,
        ),
        _ => (504, "upstream_per_try_timeout", flags::UT),
    };
    (status, origin(details, f))
}

fn end_origin(why: EndWhy) -> Origin {
    match why {
        EndWhy::ClientGone => origin("", flags::DC),
        EndWhy::UpstreamReset => origin(
            "upstream_reset_before_response_started{remote_reset}",
            flags::UR,
        ),
        EndWhy::Refused => origin(
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            flags::UF,
        ),
        EndWhy::NoHealthy => origin("no_healthy_upstream", flags::UH),
    }
}

fn origin(details: &str, f: u64) -> Origin {
    Origin {
        details: details.to_string(),
        flags: f,
    }
}

/// The contract's default `store_statuses`.
fn stored_status(s: u16) -> bool {
    (200..500).contains(&s) && ![408, 425, 429].contains(&s)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqPhase {
    AwaitBody,
    Deciding,
    Decided,
}

struct Pending {
    call: StoreCall,
    sent_at: u64,
    applied: Option<(u16, Vec<u8>)>,
    /// For a claim call: what the contract demanded when etcd applied it.
    demand: Option<Option<String>>,
}

impl Pending {
    /// A call the stream just sent, not applied yet.
    fn sent(call: StoreCall, now: u64) -> Self {
        Pending {
            call,
            sent_at: now,
            applied: None,
            demand: None,
        }
    }
}

/// The response as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RespPhase {
    None,
    /// Headers passed; `capturing` while the model expects the body to be kept.
    Headers {
        status: u16,
        origin: Origin,
        len: usize,
        sent: usize,
        capturing: bool,
        done: bool,
    },
}

/// A request's scope, key, payload (0: no body) and what is wrong with it, if anything.
type Who = (u8, u8, u8, Option<Bad>);

struct Sim {
    worker: usize,
    scope: u8,
    key: u8,
    payload: u8,
    bad: Option<Bad>,
    plugin: usize,
    s: DedupStream,
    req: ReqPhase,
    call: Option<Pending>,
    exec: Option<usize>,
    resp: RespPhase,
    ended: bool,
    /// A fault touched one of its store calls: failing open or closed is allowed.
    faulted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ExecState {
    /// Forwarded; no answer yet (or its body is being captured).
    Running,
    Held,
    Released,
    Completed {
        stored: Option<StoredResponse>,
        /// Completion time by the completing proxy's clock + TTL.
        expires: u64,
        /// The completion certainly reached the store.
        sure: bool,
    },
}

#[derive(Debug)]
struct Exec {
    stream: usize,
    scope: u8,
    key: u8,
    payload: u8,
    forward_at: u64,
    state: ExecState,
}

/// A claim attempt: a decision about this identity was taken (the record may exist).
struct Attempt {
    stream: usize,
    scope: u8,
    key: u8,
    payload: u8,
    at: u64,
}

struct World {
    knobs: Knobs,
    plugins: Vec<Plugin>,
    envs: Vec<FakeEnv>,
    etcd: Arc<FakeEtcd>,
    now: u64,
    sims: Vec<Sim>,
    execs: Vec<Exec>,
    attempts: Vec<Attempt>,
    /// Calls already answered, for `Zombie`.
    answered: Vec<StoreCall>,
    trace: Vec<String>,
    seen: Seen,
}

/// What clients saw, to compare with the counters.
#[derive(Default, Debug, PartialEq, Eq)]
struct Seen {
    requests: u64,
    executed: u64,
    replayed: u64,
    in_flight: u64,
    mismatch: u64,
    bad_key: u64,
    bypassed: u64,
}

fn plugin_json(k: &Knobs, capacity: u32) -> String {
    let store = match k.store {
        StoreKind::Shared => String::new(),
        StoreKind::Etcd => {
            r#", "store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 3000}"#.to_string()
        }
    };
    format!(
        r#"{{"key": {{"required": true}}, "scope": {{"headers": ["x-tenant"]}},
            "ttl_seconds": {}, "in_flight_timeout_seconds": {}, "capacity": {capacity},
            "max_replay_body_bytes": {CAP}, "on_unknown_outcome": "{}", "on_duplicate": "{}",
            "failure_mode": "{}"{store}}}"#,
        TTL_MS / 1000,
        IN_FLIGHT_MS / 1000,
        if k.unknown_release { "release" } else { "hold" },
        if k.reject { "reject" } else { "replay" },
        if k.closed { "closed" } else { "open" },
    )
}

fn problem_slug(r: &LocalReply) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .and_then(|t| {
            t.strip_prefix("urn:proxy-dedup:problem:")
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("status {} (not problem+json)", r.status))
}

impl World {
    fn new(knobs: Knobs) -> Result<World, String> {
        let parse = |cap| {
            Config::parse(plugin_json(&knobs, cap).as_bytes())
                .map(Plugin::new)
                .map_err(|e| e.to_string())
        };
        let plugins = vec![parse(16)?, parse(32)?];
        let etcd = FakeEtcd::new();
        let shared = FakeShared::new();
        let envs = (0..4u64)
            .map(|w| {
                let mut e = FakeEnv::new(
                    match knobs.store {
                        StoreKind::Shared => shared.clone(),
                        StoreKind::Etcd => FakeShared::new(),
                    },
                    w + 1,
                );
                e.etcd = etcd.clone();
                e
            })
            .collect();
        Ok(World {
            knobs,
            plugins,
            envs,
            etcd,
            now: START_MS,
            sims: Vec::new(),
            execs: Vec::new(),
            attempts: Vec::new(),
            answered: Vec::new(),
            trace: Vec::new(),
            seen: Seen::default(),
        })
    }

    /// Shared data: workers 0-2 of one process. etcd: proxy A's workers, then proxy B's.
    fn workers(&self) -> usize {
        match self.knobs.store {
            StoreKind::Shared => 3,
            StoreKind::Etcd if self.knobs.two_workers => 4,
            StoreKind::Etcd => 2,
        }
    }

    fn skew(&self, worker: usize) -> u64 {
        match self.knobs.store {
            StoreKind::Etcd if worker >= self.workers() / 2 => self.knobs.skew_ms,
            _ => 0,
        }
    }

    /// The worker's clock set from the world's (etcd's) clock.
    fn sync(&mut self, w: usize) {
        let skew = self.skew(w);
        let e = &mut self.envs[w];
        e.now_ms = self.now + skew;
        e.clock_ahead_ms = skew;
    }

    fn log(&mut self, line: String) {
        self.trace
            .push(format!("t+{:>6} {line}", self.now - START_MS));
    }

    fn pick(&self, s: u8, f: impl Fn(&Sim) -> bool) -> Option<usize> {
        let c: Vec<usize> = (0..self.sims.len()).filter(|i| f(&self.sims[*i])).collect();
        (!c.is_empty()).then(|| c[s as usize % c.len()])
    }

    fn run(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Start {
                worker,
                scope,
                key,
                payload,
                bad,
                layout,
            } => self.start(
                worker as usize % self.workers(),
                match self.knobs.store {
                    StoreKind::Shared => layout as usize % 2,
                    StoreKind::Etcd => 0,
                },
                (scope % 2, key % 2, payload % 3, bad),
            ),
            Op::Body { s } => match self.pick(s, |x| x.req == ReqPhase::AwaitBody && !x.ended) {
                Some(i) => self.body(i),
                None => Ok(()),
            },
            Op::Apply { s } => {
                match self.pick(s, |x| x.call.as_ref().is_some_and(|c| c.applied.is_none())) {
                    Some(i) => {
                        self.apply(i);
                        Ok(())
                    }
                    None => Ok(()),
                }
            }
            Op::Deliver { s, fate } => match self.pick(s, |x| x.call.is_some()) {
                Some(i) => self.deliver(i, fate),
                None => Ok(()),
            },
            Op::Respond { s, r } => {
                match self.pick(s, |x| {
                    x.exec.is_some() && x.resp == RespPhase::None && !x.ended
                }) {
                    Some(i) => self.respond(i, r),
                    None => Ok(()),
                }
            }
            Op::RespBody { s, trailers } => {
                match self.pick(s, |x| {
                    !x.ended && matches!(x.resp, RespPhase::Headers { done: false, .. })
                }) {
                    Some(i) => self.resp_body(i, trailers),
                    None => Ok(()),
                }
            }
            Op::End { s, why } => match self.pick(s, |x| !x.ended) {
                Some(i) => self.end(i, why),
                None => Ok(()),
            },
            Op::Tick { ms } => self.tick(ms as u64),
            Op::Zombie { c } => {
                if !self.answered.is_empty() {
                    let call = self.answered[c as usize % self.answered.len()].clone();
                    let (status, _) = self.etcd.handle(call.path, &call.body, self.now);
                    self.log(format!("etcd applies an old {} again: {status}", call.path));
                }
                Ok(())
            }
        }
    }

    /// Starts a request on `worker` under configuration `plugin`; `who` is its scope, key,
    /// payload and what is wrong with it.
    fn start(&mut self, worker: usize, plugin: usize, who: Who) -> Result<(), String> {
        let (scope, key, payload, bad) = who;
        let mut head = RequestHead {
            method: if bad == Some(Bad::Get) { "GET" } else { "POST" }.into(),
            path: "/orders?x=1".into(),
            authority: "api.example".into(),
            headers: vec![("x-tenant".into(), format!("tenant-{scope}"))],
        };
        if bad != Some(Bad::NoKey) {
            head.headers
                .push(("idempotency-key".into(), format!("key-{key}")));
        }
        if bad == Some(Bad::TwoKeys) {
            head.headers
                .push(("idempotency-key".into(), format!("key-{key}")));
        }
        if bad == Some(Bad::TwoScopes) {
            head.headers.push(("x-tenant".into(), "tenant-x".into()));
        }
        let i = self.sims.len();
        self.log(format!(
            "stream {i}: start on worker {worker}, scope {scope}, key {key}, payload {payload}{}{}",
            bad.map(|b| format!(", {b:?}")).unwrap_or_default(),
            if plugin == 1 { ", layout 2" } else { "" },
        ));
        self.sims.push(Sim {
            worker,
            scope,
            key,
            payload,
            bad,
            plugin,
            s: DedupStream::new(i as u32),
            req: ReqPhase::AwaitBody,
            call: None,
            exec: None,
            resp: RespPhase::None,
            ended: false,
            faulted: false,
        });
        self.seen.requests += 1;
        self.sync(worker);
        let eos = payload == 0;
        if eos {
            self.attempt(i);
        }
        let demand = self.demanded(i);
        let sim = &mut self.sims[i];
        let action =
            sim.s
                .on_request_headers(&self.plugins[plugin], &mut self.envs[worker], head, eos);
        if !eos && action == Action::Pause {
            return Ok(());
        }
        self.sims[i].req = ReqPhase::Deciding;
        if eos {
            self.check_demand(i, demand, &action)?;
        }
        self.decided(i, action)
    }

    fn body(&mut self, i: usize) -> Result<(), String> {
        let (w, p) = (self.sims[i].worker, self.sims[i].plugin);
        let body = format!("body-{}", self.sims[i].payload).into_bytes();
        self.log(format!("stream {i}: request body"));
        self.sync(w);
        self.sims[i].req = ReqPhase::Deciding;
        self.attempt(i);
        let demand = self.demanded(i);
        let len = body.len();
        let action =
            self.sims[i]
                .s
                .on_request_body(&self.plugins[p], &mut self.envs[w], len, true, || {
                    Some(body)
                });
        self.check_demand(i, demand, &action)?;
        self.decided(i, action)
    }

    fn attempt(&mut self, i: usize) {
        let x = &self.sims[i];
        if x.bad.is_none() {
            self.attempts.push(Attempt {
                stream: i,
                scope: x.scope,
                key: x.key,
                payload: x.payload,
                at: self.now,
            });
        }
    }

    /// A request-path decision (or, for a client already gone, whatever its claim did).
    fn decided(&mut self, i: usize, action: Action) -> Result<(), String> {
        if let Action::Call(call) = action {
            if self.knobs.store == StoreKind::Shared {
                return Err(format!("stream {i}: a store call with shared data"));
            }
            self.sims[i].call = Some(Pending::sent(call, self.now));
            return Ok(());
        }
        self.sims[i].req = ReqPhase::Decided;
        if self.sims[i].ended {
            // The client left while the claim was decided: nothing may be forwarded,
            // and a claim won meanwhile must not stay held by a stream that is gone.
            if self.sims[i].s.holds_claim() {
                return Err(format!(
                    "stream {i}: its client left, yet it holds a claim nobody will settle"
                ));
            }
            self.count_reply(&action);
            self.log(format!(
                "stream {i}: (client gone) decided {}",
                short(&action)
            ));
            return Ok(());
        }
        self.log(format!("stream {i}: decided {}", short(&action)));
        let bad = self.sims[i].bad;
        match (&action, bad) {
            (Action::Pause, _) => Err(format!("stream {i}: paused after its whole request")),
            (Action::Call(_), _) => Ok(()),
            (Action::Continue, Some(Bad::Get)) => {
                self.seen.bypassed += 1;
                if self.sims[i].s.holds_claim() {
                    return Err(format!("stream {i}: a GET claimed a key"));
                }
                Ok(())
            }
            (Action::Reply(r), Some(b)) if b != Bad::Get => {
                self.seen.bad_key += 1;
                let want = match b {
                    Bad::NoKey => "missing-key",
                    Bad::TwoKeys => "ambiguous-key",
                    _ => "ambiguous-scope",
                };
                let got = problem_slug(r);
                let reply = r.clone();
                self.local_reply_passes(i, &reply)?;
                if r.status != 400 || got != want {
                    return Err(format!(
                        "stream {i}: {b:?} answered {} {got}, not 400 {want}",
                        r.status
                    ));
                }
                Ok(())
            }
            (_, Some(b)) => Err(format!(
                "stream {i}: {b:?} request decided {}",
                short(&action)
            )),
            (Action::Continue, None) => self.forwarded(i),
            (Action::Reply(r), None) => {
                let r = r.clone();
                self.count_reply(&action);
                self.check_reply(i, &r)?;
                self.local_reply_passes(i, &r)
            }
        }
    }

    fn count_reply(&mut self, action: &Action) {
        if let Action::Reply(r) = action {
            if r.header("idempotent-replayed").is_some() {
                self.seen.replayed += 1;
            } else {
                match problem_slug(r).as_str() {
                    "in-flight" => self.seen.in_flight += 1,
                    "payload-mismatch" => self.seen.mismatch += 1,
                    _ => {}
                }
            }
        }
    }

    /// Envoy runs the filter's response callbacks on its own local reply too: nothing
    /// is stored or released for it.
    fn local_reply_passes(&mut self, i: usize, r: &LocalReply) -> Result<(), String> {
        let (w, p) = (self.sims[i].worker, self.sims[i].plugin);
        let own = origin(r.details, 0);
        let plugin = &self.plugins[p];
        let env = &mut self.envs[w];
        let s = &mut self.sims[i].s;
        let a = s.on_response_headers(plugin, env, r.status, &own, || r.headers.clone(), false);
        let b = s.on_response_body(plugin, env, &r.body, true);
        let c = s.on_stream_end(plugin, env, &own);
        self.sims[i].ended = true;
        match (a, b, c) {
            (None, None, None) => Ok(()),
            other => Err(format!(
                "stream {i}: its own local reply made store calls {other:?}"
            )),
        }
    }

    /// Executions of this identity (scope, key) in the model.
    fn execs_of(&self, scope: u8, key: u8) -> impl Iterator<Item = (usize, &Exec)> {
        self.execs
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.scope == scope && e.key == key)
    }

    /// Whether an execution's claim may still be live at `now` for a reader with `clock`.
    fn blocks(&self, e: &Exec, clock: u64) -> bool {
        let in_flight = self.now < e.forward_at + IN_FLIGHT_MS;
        match &e.state {
            ExecState::Running | ExecState::Held => in_flight,
            ExecState::Released => false,
            ExecState::Completed { expires, sure, .. } => in_flight || (*sure && clock < *expires),
        }
    }

    fn forwarded(&mut self, i: usize) -> Result<(), String> {
        if !self.sims[i].s.holds_claim() {
            // Passed without a claim: only a failing store under failure_mode "open".
            if self.knobs.closed || !self.sims[i].faulted {
                return Err(format!(
                    "stream {i}: passed through without a claim (failed open) though {}",
                    if self.knobs.closed {
                        "failure_mode is closed"
                    } else {
                        "the store never failed it"
                    }
                ));
            }
            return Ok(());
        }
        self.seen.executed += 1;
        let (scope, key, payload, w) = {
            let x = &self.sims[i];
            (x.scope, x.key, x.payload, x.worker)
        };
        let clock = self.now + self.skew(w);
        let live: Vec<usize> = self
            .execs_of(scope, key)
            .filter(|(_, e)| self.blocks(e, clock))
            .map(|(n, _)| n)
            .collect();
        if let Some(n) = live.first() {
            let e = &self.execs[*n];
            return Err(format!(
                "stream {i}: executed scope {scope} key {key} while execution {n} (stream {}, forwarded at t+{}, {:?}) could still be live: twice",
                e.stream,
                e.forward_at - START_MS,
                e.state
            ));
        }
        let n = self.execs.len();
        self.execs.push(Exec {
            stream: i,
            scope,
            key,
            payload,
            forward_at: self.now,
            state: ExecState::Running,
        });
        self.sims[i].exec = Some(n);
        self.log(format!("stream {i}: execution {n}"));
        Ok(())
    }

    /// A local reply to a valid request: allowed by the contract, and the one it demands
    /// when the model knows the state for certain.
    fn check_reply(&mut self, i: usize, r: &LocalReply) -> Result<(), String> {
        let (scope, key, payload, w, faulted) = {
            let x = &self.sims[i];
            (x.scope, x.key, x.payload, x.worker, x.faulted)
        };
        let _ = w;
        let others: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.stream != i && a.scope == scope && a.key == key)
            .collect();
        let same = others.iter().any(|a| a.payload == payload);
        let other_payload = others.iter().any(|a| a.payload != payload);
        if let Some(v) = r.header("idempotent-replayed") {
            if v != b"true" {
                return Err(format!("stream {i}: replayed header {v:?}"));
            }
            if self.knobs.reject {
                return Err(format!("stream {i}: replayed under on_duplicate reject"));
            }
            // The x-exec header names the execution whose response this is.
            let Some(n) = r
                .header("x-exec")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
            else {
                return Err(format!(
                    "stream {i}: a replay without its execution's headers: {r:?}"
                ));
            };
            let Some(e) = self.execs.get(n) else {
                return Err(format!(
                    "stream {i}: replayed execution {n}, which never ran"
                ));
            };
            if (e.scope, e.key, e.payload) != (scope, key, payload) {
                return Err(format!(
                    "stream {i}: scope {scope} key {key} payload {payload} got the replay of execution {n} (scope {} key {} payload {})",
                    e.scope, e.key, e.payload
                ));
            }
            let ExecState::Completed {
                stored: Some(want), ..
            } = &e.state
            else {
                return Err(format!(
                    "stream {i}: replayed execution {n}, which has no stored response ({:?})",
                    e.state
                ));
            };
            let mut headers = want.headers.clone();
            headers.push(("idempotent-replayed".into(), b"true".to_vec()));
            if (r.status, &r.headers, &r.body) != (want.status, &headers, &want.body) {
                return Err(format!(
                    "stream {i}: replay {} {:?} {:?} differs from execution {n}'s stored {} {:?} {:?}",
                    r.status,
                    r.headers,
                    String::from_utf8_lossy(&r.body),
                    want.status,
                    headers,
                    String::from_utf8_lossy(&want.body)
                ));
            }
        } else {
            let slug = problem_slug(r);
            let allowed = match slug.as_str() {
                "payload-mismatch" => other_payload,
                "in-flight" => {
                    let ok = r
                        .header("retry-after")
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                        .is_some_and(|s| (1..=IN_FLIGHT_MS / 1000 + 4).contains(&s));
                    if !ok {
                        return Err(format!(
                            "stream {i}: 409 with retry-after {:?}",
                            r.header("retry-after")
                        ));
                    }
                    same
                }
                "response-not-stored" => self.execs_of(scope, key).any(|(_, e)| {
                    e.payload == payload
                        && matches!(e.state, ExecState::Completed { stored: None, .. })
                }),
                "already-completed" => {
                    self.knobs.reject
                        && self.execs_of(scope, key).any(|(_, e)| {
                            e.payload == payload && matches!(e.state, ExecState::Completed { .. })
                        })
                }
                "store-unavailable" => self.knobs.closed && faulted,
                _ => false,
            };
            if !allowed {
                return Err(format!(
                    "stream {i}: scope {scope} key {key} payload {payload} answered {} {slug}, which the history does not allow",
                    r.status
                ));
            }
        }
        Ok(())
    }

    /// What the contract demands when the model knows the state for certain: a fresh
    /// key runs; a live claim answers 409 or 422; a completed one replays.
    fn demanded(&self, i: usize) -> Option<String> {
        let x = &self.sims[i];
        if x.faulted || x.bad.is_some() {
            return None;
        }
        let clock = self.now + self.skew(x.worker);
        let others: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.stream != i && a.scope == x.scope && a.key == x.key)
            .collect();
        if others.is_empty() {
            return Some("executed".into());
        }
        // An execution still running within its in-flight time.
        for (n, e) in self.execs_of(x.scope, x.key) {
            let running = matches!(e.state, ExecState::Running | ExecState::Held)
                && self.now < e.forward_at + IN_FLIGHT_MS;
            if running {
                return Some(if e.payload != x.payload {
                    format!("422 (execution {n} in flight)")
                } else {
                    format!("409 in-flight (execution {n})")
                });
            }
        }
        // The last execution completed for certain, nothing tried the key since, and it
        // has not expired by this reader's clock (a clock ahead may see it expire early).
        let (n, e) = self.execs_of(x.scope, x.key).last()?;
        if let ExecState::Completed {
            stored,
            expires,
            sure: true,
        } = &e.state
        {
            let tried_since = others.iter().any(|a| a.at > e.forward_at);
            if !tried_since && clock < *expires {
                return Some(if e.payload != x.payload {
                    format!("422 (execution {n} completed)")
                } else if stored.is_none() {
                    format!("409 response-not-stored (execution {n})")
                } else if self.knobs.reject {
                    format!("409 already-completed (execution {n})")
                } else {
                    format!("replay of execution {n}")
                });
            }
        }
        None
    }

    fn check_demand(&self, i: usize, demand: Option<String>, got: &Action) -> Result<(), String> {
        let Some(d) = demand else { return Ok(()) };
        let ok = match got {
            Action::Continue => d == "executed" && self.sims[i].s.holds_claim(),
            Action::Reply(r) => {
                let slug = problem_slug(r);
                if d.starts_with("replay of execution ") {
                    let n = d.trim_start_matches("replay of execution ");
                    r.header("x-exec") == Some(n.as_bytes())
                        && r.header("idempotent-replayed").is_some()
                } else if d.starts_with("422") {
                    slug == "payload-mismatch"
                } else if d.starts_with("409 in-flight") {
                    slug == "in-flight"
                } else if d.starts_with("409 already-completed") {
                    slug == "already-completed"
                } else if d.starts_with("409 response-not-stored") {
                    slug == "response-not-stored"
                } else {
                    false
                }
            }
            Action::Pause | Action::Call(_) => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "stream {i}: the contract demands {d}, the filter decided {}",
                short(got)
            ))
        }
    }

    fn apply(&mut self, i: usize) {
        let Some(p) = self.sims[i].call.as_mut() else {
            return;
        };
        if p.applied.is_some() {
            return;
        }
        let call = p.call.clone();
        let deciding = self.sims[i].req == ReqPhase::Deciding && !self.sims[i].ended;
        if deciding && etcd::is_txn(call.path) {
            let d = self.demanded(i);
            if let Some(p) = self.sims[i].call.as_mut() {
                p.demand = Some(d);
            }
        }
        let answer = self.etcd.handle(call.path, &call.body, self.now);
        self.log(format!(
            "stream {i}: etcd applies {} -> {}",
            call.path, answer.0
        ));
        self.observe(i, call.path, &answer);
        if let Some(p) = self.sims[i].call.as_mut() {
            p.applied = Some(answer);
        }
    }

    /// A completion that etcd applied is certain.
    fn observe(&mut self, i: usize, path: &str, answer: &(u16, Vec<u8>)) {
        let Some(n) = self.sims[i].exec else { return };
        if let Some(EtcdAnswer::Txn {
            succeeded: true, ..
        }) = etcd::read_answer(path, answer.0, &answer.1)
        {
            if let ExecState::Completed { sure, .. } = &mut self.execs[n].state {
                *sure = true;
            }
        }
    }

    fn deliver(&mut self, i: usize, fate: Fate) -> Result<(), String> {
        let answer = match fate {
            Fate::Normal => {
                self.apply(i);
                self.applied(i)
            }
            Fate::Lost => {
                self.apply(i);
                self.sims[i].faulted = true;
                (503, Vec::new())
            }
            Fate::Failed => {
                self.sims[i].faulted = true;
                (503, Vec::new())
            }
            Fate::Duplicated => {
                self.apply(i);
                let call = self.sims[i].call.as_ref().map(|p| p.call.clone());
                match call {
                    Some(c) => {
                        let again = self.etcd.handle(c.path, &c.body, self.now);
                        self.observe(i, c.path, &again);
                        again
                    }
                    None => (503, Vec::new()),
                }
            }
            Fate::Late => {
                self.apply(i);
                let due = self.sims[i].call.as_ref().map_or(self.now, |p| {
                    p.sent_at + p.call.timeout_ms.saturating_sub(1)
                });
                if due > self.now {
                    self.tick(due - self.now)?;
                }
                if self.sims[i].call.is_none() {
                    // Answered meanwhile (a timeout of its own cannot come first).
                    return Ok(());
                }
                self.applied(i)
            }
            Fate::Unavailable => {
                self.sims[i].faulted = true;
                (
                    503,
                    br#"{"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14}"#
                        .to_vec(),
                )
            }
        };
        self.log(format!("stream {i}: answer {fate:?} {}", answer.0));
        let genuine = matches!(fate, Fate::Normal | Fate::Duplicated | Fate::Late);
        self.answer(i, answer, genuine)
    }

    fn applied(&self, i: usize) -> (u16, Vec<u8>) {
        self.sims[i]
            .call
            .as_ref()
            .and_then(|p| p.applied.clone())
            .unwrap_or((503, Vec::new()))
    }

    /// Delivers the answer to a stream's store call; `genuine` when it is etcd's own
    /// answer to the call (not a transport failure).
    fn answer(
        &mut self,
        i: usize,
        (status, body): (u16, Vec<u8>),
        genuine: bool,
    ) -> Result<(), String> {
        let Some(p) = self.sims[i].call.take() else {
            return Ok(());
        };
        self.answered.push(p.call);
        if self.answered.len() > 16 {
            self.answered.remove(0);
        }
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        let demand = if genuine && !self.sims[i].ended {
            p.demand.flatten()
        } else {
            None
        };
        let action = self.sims[i].s.on_store_answer(
            &self.plugins[pl],
            &mut self.envs[w],
            CallAnswer { status, body },
        );
        if self.sims[i].req == ReqPhase::Deciding {
            if !matches!(action, Action::Call(_)) && !self.sims[i].ended {
                self.check_demand(i, demand, &action)?;
            }
            return self.decided(i, action);
        }
        match action {
            Action::Call(call) => {
                self.sims[i].call = Some(Pending::sent(call, self.now));
                Ok(())
            }
            Action::Continue => Ok(()),
            other => Err(format!(
                "stream {i}: a settling call answered {}",
                short(&other)
            )),
        }
    }

    fn respond(&mut self, i: usize, r: Resp) -> Result<(), String> {
        let Some(n) = self.sims[i].exec else {
            return Ok(());
        };
        let (status, origin, len) = match r {
            Resp::Upstream { status, len } => (status, Origin::upstream(), len as usize % 13),
            Resp::NotSent(k) => {
                let (s, o) = not_sent_origin(k);
                (s, o, 5)
            }
            Resp::Unknown(k) => {
                let (s, o) = unknown_origin(k);
                (s, o, 5)
            }
        };
        // The reference: what the contract says this answer does to the claim.
        let capturing = match r {
            Resp::Upstream { .. } if stored_status(status) => true,
            Resp::Upstream { .. } | Resp::NotSent(_) => {
                self.execs[n].state = ExecState::Released;
                false
            }
            Resp::Unknown(_) => {
                self.execs[n].state = if self.knobs.unknown_release {
                    ExecState::Released
                } else {
                    ExecState::Held
                };
                false
            }
        };
        self.log(format!(
            "stream {i}: response {status} ({}) with {len} body bytes",
            origin.details
        ));
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        let pairs = vec![
            (":status".to_string(), status.to_string().into_bytes()),
            ("content-type".to_string(), b"text/plain".to_vec()),
            ("x-exec".to_string(), n.to_string().into_bytes()),
            ("set-cookie".to_string(), b"session=1".to_vec()),
            ("connection".to_string(), b"keep-alive".to_vec()),
        ];
        self.sims[i].resp = RespPhase::Headers {
            status,
            origin: origin.clone(),
            len,
            sent: 0,
            capturing,
            done: len == 0,
        };
        if capturing && len == 0 {
            self.completed(i, n, status, Vec::new(), true);
        }
        let call = self.sims[i].s.on_response_headers(
            &self.plugins[pl],
            &mut self.envs[w],
            status,
            &origin,
            || pairs,
            len == 0,
        );
        if self.sims[i].s.wants_response_body() != (capturing && len > 0) {
            return Err(format!(
                "stream {i}: after response {status} ({}) the filter {} the body; the contract says it {}",
                origin.details,
                if self.sims[i].s.wants_response_body() { "captures" } else { "does not capture" },
                if capturing && len > 0 { "is kept" } else { "is not" }
            ));
        }
        self.settling(i, call)
    }

    fn body_bytes(n: usize, len: usize) -> Vec<u8> {
        format!("e{n}-").bytes().cycle().take(len).collect()
    }

    fn completed(&mut self, i: usize, n: usize, status: u16, body: Vec<u8>, whole: bool) {
        let clock = self.now + self.skew(self.sims[i].worker);
        let stored = (whole && body.len() <= CAP).then(|| StoredResponse {
            status,
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("x-exec".into(), n.to_string().into_bytes()),
            ],
            body,
        });
        // Shared data completes at once: certain if no other claim could have taken the
        // record. etcd: certain once etcd applies the completion (see `observe`).
        let sure = self.knobs.store == StoreKind::Shared
            && self.now < self.execs[n].forward_at + IN_FLIGHT_MS;
        self.execs[n].state = ExecState::Completed {
            stored,
            expires: clock + TTL_MS,
            sure,
        };
    }

    fn resp_body(&mut self, i: usize, trailers: bool) -> Result<(), String> {
        let Some(n) = self.sims[i].exec else {
            return Ok(());
        };
        let RespPhase::Headers {
            status,
            len,
            sent,
            capturing,
            ..
        } = self.sims[i].resp.clone()
        else {
            return Ok(());
        };
        let whole = Self::body_bytes(n, len);
        let next = (sent + 5).min(len);
        let last = next == len;
        let end_here = last && !trailers;
        if let RespPhase::Headers { sent, done, .. } = &mut self.sims[i].resp {
            *sent = next;
            *done = last;
        }
        if last && capturing {
            self.completed(i, n, status, whole.clone(), true);
        }
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        self.sync(w);
        self.log(format!(
            "stream {i}: response body {}..{next}{}",
            sent,
            if last {
                if trailers {
                    " + trailers"
                } else {
                    " (end)"
                }
            } else {
                ""
            }
        ));
        let mut calls = Vec::new();
        if self.sims[i].s.wants_response_body() {
            calls.push(self.sims[i].s.on_response_body(
                &self.plugins[pl],
                &mut self.envs[w],
                &whole[sent..next],
                end_here,
            ));
        }
        if last && trailers {
            calls.push(
                self.sims[i]
                    .s
                    .on_response_trailers(&self.plugins[pl], &mut self.envs[w]),
            );
        }
        for c in calls {
            self.settling(i, c)?;
        }
        Ok(())
    }

    fn settling(&mut self, i: usize, call: Option<StoreCall>) -> Result<(), String> {
        match (call, self.knobs.store) {
            (None, _) => Ok(()),
            (Some(c), StoreKind::Shared) => {
                Err(format!("stream {i}: store call {c:?} with shared data"))
            }
            (Some(call), StoreKind::Etcd) => {
                if self.sims[i].call.is_some() {
                    return Err(format!("stream {i}: a second store call while one is out"));
                }
                self.sims[i].call = Some(Pending::sent(call, self.now));
                Ok(())
            }
        }
    }

    fn end(&mut self, i: usize, why: EndWhy) -> Result<(), String> {
        let (w, pl) = (self.sims[i].worker, self.sims[i].plugin);
        let o = match &self.sims[i].resp {
            RespPhase::Headers { origin, .. } => origin.clone(),
            RespPhase::None => end_origin(why),
        };
        // The reference again.
        if let Some(n) = self.sims[i].exec {
            match (&self.sims[i].resp, &self.execs[n].state) {
                (RespPhase::None, ExecState::Running) => {
                    let not_sent = matches!(why, EndWhy::Refused | EndWhy::NoHealthy);
                    self.execs[n].state = if not_sent || self.knobs.unknown_release {
                        ExecState::Released
                    } else {
                        ExecState::Held
                    };
                }
                (
                    RespPhase::Headers {
                        status,
                        capturing: true,
                        done: false,
                        ..
                    },
                    ExecState::Running,
                ) => {
                    // The upstream answered; the body was cut: completed, not kept.
                    let status = *status;
                    self.completed(i, n, status, Vec::new(), false);
                }
                _ => {}
            }
        }
        self.log(format!("stream {i}: ends ({:?}, {})", why, o.details));
        self.sims[i].ended = true;
        self.sync(w);
        let call = self.sims[i]
            .s
            .on_stream_end(&self.plugins[pl], &mut self.envs[w], &o);
        self.settling(i, call)
    }

    /// The clock moves on; store calls past their timeout get Envoy's 504 (applied by
    /// etcd or not).
    fn tick(&mut self, ms: u64) -> Result<(), String> {
        let target = self.now + ms;
        loop {
            let due = self
                .sims
                .iter()
                .enumerate()
                .filter_map(|(i, x)| {
                    let p = x.call.as_ref()?;
                    Some((p.sent_at + p.call.timeout_ms, i))
                })
                .filter(|(at, _)| *at <= target)
                .min();
            let Some((at, i)) = due else { break };
            self.now = self.now.max(at);
            // Half of the timed-out calls went through before the timeout.
            if at % 2 == 0 {
                self.apply(i);
            }
            self.sims[i].faulted = true;
            self.log(format!("stream {i}: store call timed out"));
            self.answer(i, (504, b"upstream request timeout".to_vec()), false)?;
        }
        self.now = target;
        self.log(format!("clock +{ms} ms"));
        Ok(())
    }

    /// The counters agree with what the clients saw.
    fn counters(&self) -> Result<(), String> {
        let sum = |c: Counter| self.envs.iter().map(|e| e.count_of(c)).sum::<u64>();
        let got = Seen {
            requests: sum(Counter::Requests),
            executed: sum(Counter::Executed),
            replayed: sum(Counter::Replayed),
            in_flight: sum(Counter::RejectedInFlight),
            mismatch: sum(Counter::PayloadMismatch),
            bad_key: sum(Counter::BadKey),
            bypassed: sum(Counter::Bypassed),
        };
        if got != self.seen {
            return Err(format!("counters {got:?}, clients saw {:?}", self.seen));
        }
        Ok(())
    }
}

fn short(a: &Action) -> String {
    match a {
        Action::Continue => "continue".into(),
        Action::Pause => "pause".into(),
        Action::Call(c) => format!("call {}", c.path),
        Action::Reply(r) if r.header("idempotent-replayed").is_some() => format!(
            "replay of execution {}",
            String::from_utf8_lossy(r.header("x-exec").unwrap_or(b"?"))
        ),
        Action::Reply(r) => format!("{} {}", r.status, problem_slug(r)),
    }
}

fn run_case(knobs: Knobs, ops: &[Op]) -> Result<(), String> {
    let mut world = World::new(knobs)?;
    let mut result = Ok(());
    for op in ops {
        result = world.run(op);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = world.counters();
    }
    result.map_err(|e| {
        format!(
            "{e}\nknobs: {knobs:?}\ntrace:\n  {}",
            world.trace.join("\n  ")
        )
    })
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![Just(StoreKind::Shared), Just(StoreKind::Etcd)],
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        any::<bool>(),
        prop_oneof![Just(0u64), 1u64..3_000],
        any::<bool>(),
    )
        .prop_map(
            |(store, unknown_release, reject, closed, skew_ms, two_workers)| Knobs {
                store,
                unknown_release,
                reject,
                closed,
                skew_ms,
                two_workers,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let bad = prop_oneof![
        Just(Bad::NoKey),
        Just(Bad::TwoKeys),
        Just(Bad::TwoScopes),
        Just(Bad::Get)
    ];
    let fate = prop_oneof![
        6 => Just(Fate::Normal),
        1 => Just(Fate::Lost),
        1 => Just(Fate::Failed),
        1 => Just(Fate::Duplicated),
        1 => Just(Fate::Unavailable),
        2 => Just(Fate::Late),
    ];
    let resp = prop_oneof![
        6 => (prop::sample::select(vec![200u16, 201, 302, 404, 409, 429, 500, 503]), 0u8..13)
            .prop_map(|(status, len)| Resp::Upstream { status, len }),
        1 => (0u8..4).prop_map(Resp::NotSent),
        1 => (0u8..3).prop_map(Resp::Unknown),
    ];
    let why = prop_oneof![
        Just(EndWhy::ClientGone),
        Just(EndWhy::UpstreamReset),
        Just(EndWhy::Refused),
        Just(EndWhy::NoHealthy)
    ];
    prop_oneof![
        5 => (any::<u8>(), 0u8..2, 0u8..2, 0u8..3, prop::option::weighted(0.08, bad), 0u8..2)
            .prop_map(|(worker, scope, key, payload, bad, layout)| Op::Start { worker, scope, key, payload, bad, layout }),
        3 => any::<u8>().prop_map(|s| Op::Body { s }),
        2 => any::<u8>().prop_map(|s| Op::Apply { s }),
        6 => (any::<u8>(), fate).prop_map(|(s, fate)| Op::Deliver { s, fate }),
        3 => (any::<u8>(), resp).prop_map(|(s, r)| Op::Respond { s, r }),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(s, trailers)| Op::RespBody { s, trailers }),
        2 => (any::<u8>(), why).prop_map(|(s, why)| Op::End { s, why }),
        3 => prop::sample::select(vec![1u32, 40, 400, 999, 1_500, 3_000, 4_999, 5_000, 9_000, 21_000])
            .prop_map(|ms| Op::Tick { ms }),
        1 => any::<u8>().prop_map(|c| Op::Zombie { c }),
    ]
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// Random histories across workers and proxies keep the contract.
    #[test]
    fn random_histories_keep_the_contract(
        knobs in knobs(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        if let Err(e) = run_case(knobs, &ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The history that showed leases counted from a late grant answer ending claims early
/// (fixed in `LeaseCache::put`): the model must flag it, and the filter must pass it.
#[test]
fn a_late_lease_grant_history_keeps_the_contract() {
    let knobs = Knobs {
        store: StoreKind::Etcd,
        unknown_release: false,
        reject: false,
        closed: false,
        skew_ms: 0,
        two_workers: false,
    };
    let start = |worker, key| Op::Start {
        worker,
        scope: 0,
        key,
        payload: 0,
        bad: None,
        layout: 0,
    };
    let deliver = |fate| Op::Deliver { s: 0, fate };
    let ops = vec![
        start(0, 0),
        // The in-flight lease is granted now, and its answer comes 999 ms later.
        deliver(Fate::Late),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
        Op::Tick { ms: 400 },
        // Another claim on that worker, with the same lease.
        start(0, 1),
        deliver(Fate::Normal),
        // 4999 ms after that claim, a retry on the other proxy.
        Op::Tick { ms: 4_999 },
        start(1, 1),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
    ];
    if let Err(e) = run_case(knobs, &ops) {
        panic!("{e}");
    }
}
