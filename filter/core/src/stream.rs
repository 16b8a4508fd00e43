//! One HTTP stream through the filter: key extraction, the claim decision at the end of
//! the request, response capture, completion or release. Host-independent: the proxy-wasm
//! glue feeds it callbacks and carries out the `Action`s it returns.
//!
//! This file holds the phase machine and the callbacks, shared by both stores; each
//! store's side lives in its own room: `shared` (claims in this proxy's shared data,
//! answered at once) and `etcd` (the claim/settle protocol through store calls).

mod etcd;
mod shared;

use crate::config::{
    Config, FailureMode, OnDuplicate, OnInFlight, OnUnknownOutcome, Policy, StoreConfig,
};
use crate::etcd::{LeaseCache, LeasePlan};
use crate::key::{
    fingerprint_key, header_key, json_key, record_digest, short_hex, BodyHasher, ClientKey,
    JsonKey, KeyError, RequestHead,
};
use crate::key::{Digest, ShortHex};
use crate::local::LocalTier;
use crate::metrics::Counter;
use crate::outcome::{classify, Outcome};
use crate::payload::payload_digest;
use crate::reply::{replay, LocalReply, Problem};
use crate::response::Capture;
use crate::response::StoredResponse;
use crate::store::{Claim, Layout, SharedData};
use crate::wait::{Waiters, POLL_ETCD_MS, RECHECK_SHARED_MS};
use etcd::{poll_call, Claiming, EtcdOwned, Settling};

/// A configured plugin: immutable config and the store geometry derived from it.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub config: Config,
    /// The buckets every policy shares, timed for the longest-lived policy (what the
    /// layout registry needs); a stream uses `layout_for` its policy.
    pub layout: Layout,
    /// The top-level policy's lease plan; a stream uses `leases_for` its policy.
    pub leases: LeasePlan,
}

impl Plugin {
    pub fn new(config: Config) -> Self {
        let top = &config.policy;
        let leases = LeasePlan::new(top.ttl_ms, top.in_flight_timeout_ms, budget_ms(&config));
        // Every policy shares the buckets; the layout registers itself for as long as
        // the longest-lived policy's records may live.
        let policies = || std::iter::once(top).chain(config.rules.iter().map(|r| &r.policy));
        let layout = Layout::new(
            &config.namespace,
            config.capacity,
            policies()
                .map(|p| p.in_flight_timeout_ms)
                .max()
                .unwrap_or(0),
            policies().map(|p| p.ttl_ms).max().unwrap_or(0),
        )
        .with_max_store_bytes(config.max_store_bytes);
        Plugin {
            config,
            layout,
            leases,
        }
    }

    /// The shared-data layout with a policy's timing (borrowed when it is the layout's).
    pub fn layout_for(&self, policy: &Policy) -> std::borrow::Cow<'_, Layout> {
        if policy.in_flight_timeout_ms == self.layout.in_flight_ms
            && policy.ttl_ms == self.layout.ttl_ms
        {
            std::borrow::Cow::Borrowed(&self.layout)
        } else {
            std::borrow::Cow::Owned(
                self.layout
                    .timed(policy.in_flight_timeout_ms, policy.ttl_ms),
            )
        }
    }

    /// The etcd lease timing of a policy.
    pub fn leases_for(&self, policy: &Policy) -> LeasePlan {
        LeasePlan::new(
            policy.ttl_ms,
            policy.in_flight_timeout_ms,
            budget_ms(&self.config),
        )
    }
}

fn budget_ms(config: &Config) -> u64 {
    match &config.store {
        StoreConfig::Etcd(ec) => ec.timeout_ms,
        StoreConfig::SharedData => 0,
    }
}

/// What the host provides a stream besides shared data.
pub trait Env: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch (Envoy's clock).
    fn now_ms(&self) -> u64;
    /// A token unique to this claim (random, or counter-based with a random seed).
    fn new_token(&mut self) -> u64;
    fn count(&mut self, counter: Counter);
    /// A debug line; formatted only when the host logs at debug level.
    fn debug(&self, message: std::fmt::Arguments<'_>);
    fn warn(&self, message: &str);
    /// This worker's leases (etcd store).
    fn leases(&mut self) -> &mut LeaseCache;
    /// This worker's tier of completed records (etcd store).
    fn local(&mut self) -> &mut LocalTier;
    /// The duplicates this worker holds in wait mode.
    fn waiters(&mut self) -> &mut Waiters;
    /// A record this proxy completed or released: wake its waiters on every worker.
    fn wake_waiters(&mut self, digest: &Digest);
}

/// A call to the remote store through the proxy, giving up after `timeout_ms`: a unary
/// gRPC call of method `path` (`/etcdserverpb.KV/Txn`, …) with the protobuf message
/// `body`, or (JSON gateway) a POST of `path` with the JSON `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCall {
    pub path: &'static str,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// The answer to a `StoreCall`: the HTTP status (0 when the call failed without a
/// response, e.g. reset) and the body. A gRPC call's answer is status 200 and the
/// response message, or status 0 and `etcdpb::status_body` (the gRPC status and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallAnswer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What the glue does next with the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Hold the stream (buffer the body) until a later callback decides.
    Pause,
    /// Answer locally; the request never reaches the upstream.
    Reply(LocalReply),
    /// Make this store call. The stream stays paused and the answer goes to
    /// `on_store_answer`: on the request path (a claim, a waiter's read) the request
    /// waits for it; on the response path (an etcd completion, release or hold) the glue
    /// holds the response until etcd settles the record (or the call fails for good),
    /// so a client that has the response finds the record settled on every proxy.
    Call(StoreCall),
}

enum Phase {
    /// Nothing seen yet.
    Start,
    /// Not deduplicated (method, no key, failed open): the filter stays out of the way.
    Passthrough,
    /// Reading the request body before deciding.
    Reading(Box<Reading>),
    /// Waiting for the remote store to answer a claim.
    Claiming(Box<Claiming>),
    /// Wait mode: a duplicate held until the first request's answer (see `on_wake`).
    Waiting(Box<Waiting>),
    /// Wait mode, etcd: a read of the record is out.
    Polling(Box<Waiting>),
    /// Claim won; waiting for the upstream's response headers.
    Forwarded(Owned),
    /// Claim won; collecting a storable response.
    Capturing(Owned, Capture),
    /// Completion or release sent to the remote store; its answer is only counted.
    Settling(Box<Settling>),
    /// Answered locally, completed or released: nothing left to do.
    Finished,
}

/// The record a waiting duplicate waits for.
struct Waiting {
    digest: Digest,
    payload: Digest,
    /// Set when the first's outcome is unknown and its claim is held until then (ms).
    held_until: Option<u64>,
}

/// A claim the stream holds.
enum Owned {
    Shared(Claim),
    Etcd(EtcdOwned),
}

/// What a claim found when the key was already taken.
enum Duplicate {
    /// In flight; `held_until` is set when its outcome is unknown and it is held until
    /// then (ms), so the client learns how long to wait.
    InFlight {
        held_until: Option<u64>,
    },
    PayloadMismatch,
    NotStored,
    Completed(Option<StoredResponse>),
}

/// The request while its body arrives. The filter keeps no copy of the body: Envoy
/// buffers it, and it is read once, at the end, for the hashes and the JSON pointer.
struct Reading {
    head: RequestHead,
    header_key: Option<ClientKey>,
    /// Whether a keyless fingerprint may give the key.
    fingerprint: bool,
}

/// Where a response came from, in Envoy's words: `response.code_details` and
/// `response.flags` (see `outcome`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    pub details: String,
    pub flags: u64,
}

impl Origin {
    pub fn upstream() -> Self {
        Origin {
            details: "via_upstream".to_string(),
            flags: 0,
        }
    }
}

/// The per-stream state machine.
pub struct DedupStream {
    id: u32,
    phase: Phase,
    /// What the filter decided, for access logs (see `log_fields`).
    verdict: Option<&'static str>,
    record: Option<Digest>,
    log_changed: bool,
    /// The request's payload digest, once decided.
    payload: Option<Digest>,
    /// Wait mode: when this duplicate stops waiting (ms), once it waits.
    wait_deadline: Option<u64>,
    /// The rule whose policy this stream follows (`None`: the top-level fields).
    rule: Option<usize>,
}

impl std::fmt::Debug for DedupStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Start => "start",
            Phase::Passthrough => "passthrough",
            Phase::Reading(_) => "reading",
            Phase::Claiming(_) => "claiming",
            Phase::Waiting(_) => "waiting",
            Phase::Polling(_) => "polling",
            Phase::Forwarded(_) => "forwarded",
            Phase::Settling(_) => "settling",
            Phase::Capturing(..) => "capturing",
            Phase::Finished => "finished",
        };
        write!(f, "DedupStream {{ id: {}, phase: {phase} }}", self.id)
    }
}

impl DedupStream {
    pub fn new(id: u32) -> Self {
        DedupStream {
            id,
            phase: Phase::Start,
            verdict: None,
            record: None,
            log_changed: false,
            payload: None,
            wait_deadline: None,
            rule: None,
        }
    }

    /// The name of the rule whose policy this stream follows, once the request's
    /// headers chose it (`None`: no rule matched).
    pub fn rule<'p>(&self, p: &'p Plugin) -> Option<&'p str> {
        self.rule
            .and_then(|i| p.config.rules.get(i))
            .map(|r| r.name.as_str())
    }

    /// The decision and the record's digest prefix, when they changed since the last
    /// call: the glue puts them in Envoy's filter state for access logs. Decisions:
    /// `executed`, `replayed`, `in_flight`, `mismatch`, `bad_key`, `bypassed`,
    /// `failed_open`, `store_unavailable`, `body_too_large`, `not_stored`,
    /// `rejected_completed`, `released`, `outcome_unknown`, `waited` (a duplicate that
    /// waited in wait mode and got the first request's response).
    pub fn log_fields(&mut self) -> Option<(&'static str, Option<ShortHex<'_>>)> {
        if !std::mem::take(&mut self.log_changed) {
            return None;
        }
        Some((self.verdict?, self.record.as_ref().map(short_hex)))
    }

    fn decided(&mut self, verdict: &'static str) {
        self.verdict = Some(verdict);
        self.log_changed = true;
    }

    /// True while the stream holds a claim whose response has not been settled.
    pub fn holds_claim(&self) -> bool {
        matches!(self.phase, Phase::Forwarded(_) | Phase::Capturing(..))
    }

    /// True while the stream waits (wait mode) for the first request's answer.
    pub fn waiting(&self) -> bool {
        matches!(self.phase, Phase::Waiting(_) | Phase::Polling(_))
    }

    /// Wait mode: the glue woke this waiting duplicate (its record changed, its periodic
    /// check or its deadline came). It re-reads the record: the first's response
    /// (replayed), a released key (claimed: this one executes), still in flight (it
    /// waits on, `Pause`), or, past `wait_timeout_ms`, 409 as in reject mode. With etcd
    /// the read is a store call (`Call`) whose answer goes to `on_store_answer`.
    pub fn on_wake<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Action {
        if !matches!(self.phase, Phase::Waiting(_)) {
            // Not waiting (any more), or its read is out: nothing to do now.
            return Action::Pause;
        }
        let Phase::Waiting(w) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Action::Pause;
        };
        let now = env.now_ms();
        if self.wait_deadline.is_some_and(|d| now >= d) {
            return self.duplicate(
                p,
                env,
                Duplicate::InFlight {
                    held_until: w.held_until,
                },
            );
        }
        match &p.config.store {
            StoreConfig::SharedData => self.claim_shared(p, env, w.digest, w.payload),
            StoreConfig::Etcd(ec) => {
                if env.local().get(&w.digest, now).is_some() {
                    return self.claim_etcd(p, env, ec, w.digest, w.payload);
                }
                let call = poll_call(ec, &w.digest);
                self.phase = Phase::Polling(w);
                Action::Call(call)
            }
        }
    }

    /// Keeps a waiter waiting, or answers 409 once its deadline has passed.
    fn wait_on<E: Env>(&mut self, p: &Plugin, env: &mut E, w: Box<Waiting>) -> Action {
        if self.wait_deadline.is_some_and(|d| env.now_ms() < d) {
            self.phase = Phase::Waiting(w);
            return Action::Pause;
        }
        self.duplicate(
            p,
            env,
            Duplicate::InFlight {
                held_until: w.held_until,
            },
        )
    }

    /// True while the request body is wanted (the glue reads it only then).
    pub fn reading_request(&self) -> bool {
        matches!(self.phase, Phase::Reading(_))
    }

    /// The response body could not be read: the response is kept as completed without a
    /// body rather than stored truncated (and rather than released: it did execute).
    pub fn on_response_body_unreadable(&mut self) {
        if let Phase::Capturing(_, capture) = &mut self.phase {
            capture.poison();
        }
    }

    /// True while the response is being captured and still fits the replay cap.
    pub fn capture_within_cap(&self) -> bool {
        matches!(&self.phase, Phase::Capturing(_, c) if !c.overflowed())
    }

    /// True while the response body is wanted (the glue reads it only then).
    pub fn wants_response_body(&self) -> bool {
        matches!(self.phase, Phase::Capturing(..))
    }

    /// Whether `on_stream_end` would look at the origin: only a forwarded request
    /// whose response never started is classified then (the glue reads Envoy's
    /// properties only in that case).
    pub fn origin_matters_at_end(&self) -> bool {
        matches!(self.phase, Phase::Forwarded(_))
    }

    /// Request headers arrived, and the method alone may decide: with no rules, a
    /// method the policy does not deduplicate passes through, whatever the other
    /// headers say. `Some` is exactly what `on_request_headers` would do for such a
    /// request (same counters, same decision), so the glue need not read the other
    /// headers; `None`: call `on_request_headers` with the whole head.
    pub fn on_request_method<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        method: &str,
    ) -> Option<Action> {
        if !p.config.rules.is_empty() {
            return None;
        }
        let cfg = &p.config.policy;
        if cfg.bypass {
            env.count(Counter::Requests);
            return Some(self.bypass(env, "bypassed by its rule"));
        }
        if !cfg.dedups_method(method) {
            env.count(Counter::Requests);
            return Some(self.bypass(env, "method not deduplicated"));
        }
        None
    }

    /// Request headers arrived. `end_of_stream` means there is no body.
    pub fn on_request_headers<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        head: RequestHead,
        end_of_stream: bool,
    ) -> Action {
        env.count(Counter::Requests);
        let (rule, cfg) = p.config.select(&head);
        self.rule = rule;
        if cfg.bypass {
            return self.bypass(env, "bypassed by its rule");
        }
        if !cfg.dedups_method(&head.method) {
            return self.bypass(env, "method not deduplicated");
        }
        if head.is_grpc() {
            // A gRPC status lives in trailers, which are not stored, and Envoy turns a
            // local reply to a gRPC request into a trailers-only answer: a replay would
            // be broken, so gRPC passes untouched.
            return self.bypass(env, "gRPC");
        }
        if let Some(name) = head.ambiguous_scope(cfg) {
            env.count(Counter::BadKey);
            let detail = format!(
                "scope header `{name}` is sent more than once; which scope applies is not clear"
            );
            return self.reply(env, Problem::AmbiguousScope.reply(&detail, Vec::new()));
        }
        let header_key = match header_key(cfg, &head) {
            Some(Ok(k)) => Some(k),
            Some(Err(e)) => return self.bad_key(env, e),
            None => None,
        };
        if header_key.is_none() && cfg.json_pointer.is_none() && cfg.fingerprint.is_empty() {
            if cfg.key_required {
                let detail = format!(
                    "this endpoint requires an idempotency key in header `{}`",
                    cfg.key_headers.join("` or `")
                );
                return self.bad_key(env, KeyError::Missing { detail });
            }
            return self.bypass(env, "no key");
        }
        let fingerprint = header_key.is_none() && !cfg.fingerprint.is_empty();
        self.phase = Phase::Reading(Box::new(Reading {
            head,
            header_key,
            fingerprint,
        }));
        if end_of_stream {
            self.decide(p, env, &[])
        } else {
            Action::Pause
        }
    }

    /// Request body arrived: Envoy has `buffered_len` bytes buffered. At the end of the
    /// stream `read_body` is called once for the whole body (`None`: it could not be
    /// read); before that the body is not copied at all.
    pub fn on_request_body<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        buffered_len: usize,
        end_of_stream: bool,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Action {
        if !matches!(self.phase, Phase::Reading(_)) {
            return Action::Continue;
        }
        let max_body_bytes = p.config.policy_at(self.rule).max_body_bytes;
        if buffered_len > max_body_bytes {
            env.count(Counter::BodyTooLarge);
            let detail = format!(
                "the request body exceeds {max_body_bytes} bytes, the most this proxy reads to deduplicate a request",
            );
            return self.reply(env, Problem::BodyTooLarge.reply(&detail, Vec::new()));
        }
        if end_of_stream {
            self.read_and_decide(p, env, read_body)
        } else {
            Action::Pause
        }
    }

    /// Request trailers arrived: the body is complete; `read_body` reads it.
    pub fn on_request_trailers<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Action {
        match self.phase {
            Phase::Reading(_) => self.read_and_decide(p, env, read_body),
            _ => Action::Continue,
        }
    }

    /// The body could not be read from the host: treated as a store failure
    /// (`failure_mode` decides), never as an empty body.
    fn read_and_decide<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Action {
        let max_body_bytes = p.config.policy_at(self.rule).max_body_bytes;
        match read_body() {
            Some(body) if body.len() <= max_body_bytes => self.decide(p, env, &body),
            Some(_) => {
                env.count(Counter::BodyTooLarge);
                let detail = format!(
                    "the request body exceeds {max_body_bytes} bytes, the most this proxy reads to deduplicate a request",
                );
                self.reply(env, Problem::BodyTooLarge.reply(&detail, Vec::new()))
            }
            None => self.store_failed(p, env, "the request body could not be read"),
        }
    }

    /// Response headers. `origin` says where the response came from (Envoy's
    /// `response.code_details` and `response.flags`); `pairs` is called only when the
    /// response will be stored. Returns a store call to make (etcd).
    pub fn on_response_headers<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        status: u16,
        origin: &Origin,
        pairs: impl FnOnce() -> Vec<(String, Vec<u8>)>,
        end_of_stream: bool,
    ) -> Option<StoreCall> {
        let Phase::Forwarded(owned) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return None;
        };
        let policy = p.config.policy_at(self.rule);
        match classify(&origin.details, origin.flags) {
            Outcome::Upstream if policy.stores_status(status) => {}
            Outcome::Upstream => {
                env.debug(format_args!(
                    "stream {}: upstream answered {status}; releasing the claim",
                    self.id
                ));
                return self.release(p, env, owned);
            }
            Outcome::NotExecuted => {
                env.debug(format_args!(
                    "stream {}: local reply {status} ({}): the upstream did not run the request; releasing the claim",
                    self.id, origin.details
                ));
                return self.release(p, env, owned);
            }
            Outcome::Unknown => return self.unknown_outcome(p, env, owned, origin),
        }
        let capture = Capture::new(status, pairs(), policy.max_replay_body_bytes);
        self.phase = Phase::Capturing(owned, capture);
        if end_of_stream {
            return self.complete(p, env);
        }
        None
    }

    /// A response body chunk passed (only called while `wants_response_body`).
    pub fn on_response_body<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Option<StoreCall> {
        if let Phase::Capturing(_, capture) = &mut self.phase {
            capture.body(chunk);
            if end_of_stream {
                return self.complete(p, env);
            }
        }
        None
    }

    /// Response trailers arrived: the response is complete (trailers are not stored).
    pub fn on_response_trailers<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Option<StoreCall> {
        if matches!(self.phase, Phase::Capturing(..)) {
            return self.complete(p, env);
        }
        None
    }

    /// The stream ended (Envoy's on_log) with `origin` as Envoy reports it then.
    /// A claim whose response never started is released only if Envoy proves the request
    /// never reached an upstream; otherwise its outcome is unknown (client gone, reset,
    /// timeout) and the claim is held. A response whose status arrived but whose body
    /// was cut counts as the upstream's answer: completed, response not kept.
    pub fn on_stream_end<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        origin: &Origin,
    ) -> Option<StoreCall> {
        if self.wait_deadline.is_some() {
            // A client that leaves while waiting leaves nothing behind.
            env.waiters().remove(self.id);
        }
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Waiting(_) | Phase::Polling(_) => {
                env.debug(format_args!(
                    "stream {}: the client left while waiting",
                    self.id
                ));
                None
            }
            Phase::Forwarded(owned) => match classify(&origin.details, origin.flags) {
                Outcome::NotExecuted => {
                    env.debug(format_args!(
                        "stream {}: ended before the upstream ran the request ({}); releasing the claim",
                        self.id, origin.details
                    ));
                    self.release(p, env, owned)
                }
                Outcome::Upstream | Outcome::Unknown => self.unknown_outcome(p, env, owned, origin),
            },
            Phase::Capturing(owned, mut capture) => {
                env.debug(format_args!(
                    "stream {}: the response was cut; completed without keeping it",
                    self.id
                ));
                capture.poison();
                self.phase = Phase::Capturing(owned, capture);
                self.complete(p, env)
            }
            Phase::Claiming(mut c) => {
                // The client left while the claim was being decided: its answer still
                // comes (the glue keeps the stream for it), and a claim won then is
                // released, since nothing was forwarded.
                c.abandoned = true;
                self.phase = Phase::Claiming(c);
                None
            }
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// The upstream may or may not have run the request: hold the record in flight until
    /// it expires (default), or release it when configured so.
    fn unknown_outcome<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: Owned,
        origin: &Origin,
    ) -> Option<StoreCall> {
        env.count(Counter::OutcomeUnknown);
        self.decided("outcome_unknown");
        if p.config.on_unknown_outcome == OnUnknownOutcome::Release {
            env.debug(format_args!(
                "stream {}: outcome unknown ({}); releasing the claim as configured",
                self.id, origin.details
            ));
            return self.release(p, env, owned);
        }
        env.debug(format_args!(
            "stream {}: outcome unknown ({}); the claim is held until it expires",
            self.id, origin.details
        ));
        self.phase = Phase::Finished;
        match owned {
            Owned::Shared(claim) => {
                self.hold_shared(p, env, &claim);
                None
            }
            Owned::Etcd(o) => Some(self.hold_etcd(p, env, &o)),
        }
    }

    /// The remote store answered a call this stream made.
    pub fn on_store_answer<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        answer: CallAnswer,
    ) -> Action {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Claiming(c) => self.claim_step(p, env, c, answer),
            Phase::Settling(st) => self.settled(p, env, st, &answer),
            Phase::Polling(w) => self.polled(p, env, w, &answer),
            other => {
                self.phase = other;
                Action::Continue
            }
        }
    }

    fn bypass<E: Env>(&mut self, env: &mut E, why: &str) -> Action {
        self.decided("bypassed");
        env.count(Counter::Bypassed);
        env.debug(format_args!("stream {}: bypass ({why})", self.id));
        self.phase = Phase::Passthrough;
        Action::Continue
    }

    /// A waiting duplicate is answered or goes on: it leaves the worker's registry.
    fn stop_waiting<E: Env>(&mut self, env: &mut E) {
        if self.wait_deadline.is_some() {
            env.waiters().remove(self.id);
        }
    }

    fn bad_key<E: Env>(&mut self, env: &mut E, e: KeyError) -> Action {
        env.count(Counter::BadKey);
        let reply = match e {
            KeyError::Missing { detail } => Problem::MissingKey.reply(&detail, Vec::new()),
            KeyError::Invalid { detail } => Problem::InvalidKey.reply(&detail, Vec::new()),
            KeyError::Ambiguous { detail } => Problem::AmbiguousKey.reply(&detail, Vec::new()),
        };
        self.reply(env, reply)
    }

    fn reply<E: Env>(&mut self, env: &mut E, reply: LocalReply) -> Action {
        env.debug(format_args!(
            "stream {}: local reply {} ({})",
            self.id, reply.status, reply.details
        ));
        self.phase = Phase::Finished;
        self.stop_waiting(env);
        let verdict = match verdict_of(reply.details) {
            "replayed" if self.wait_deadline.is_some() => "waited",
            v => v,
        };
        self.decided(verdict);
        Action::Reply(reply)
    }

    /// The whole request is known: find the key, claim it, and act on the outcome.
    fn decide<E: Env>(&mut self, p: &Plugin, env: &mut E, raw_body: &[u8]) -> Action {
        let Phase::Reading(r) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Action::Continue;
        };
        let cfg = p.config.policy_at(self.rule);
        let Reading {
            head,
            header_key,
            fingerprint,
        } = *r;
        let mut hasher = BodyHasher::default();
        hasher.update(raw_body);
        let body = hasher.finish();
        let mut absent_reason = None;
        let key = match (header_key, &cfg.json_pointer) {
            (Some(k), _) => Some(k),
            (None, Some(ptr)) => match json_key(cfg, ptr, raw_body) {
                JsonKey::Found(k) => Some(k),
                JsonKey::Invalid(e) => return self.bad_key(env, e),
                JsonKey::Absent(reason) => {
                    absent_reason = Some(reason);
                    None
                }
            },
            _ => None,
        };
        let key = match key.or_else(|| fingerprint.then(|| fingerprint_key(cfg, &head, &body))) {
            Some(k) => k,
            None if cfg.key_required => {
                let detail = format!(
                    "this endpoint requires an idempotency key in header `{}` or at `{}` in the JSON body; {}",
                    cfg.key_headers.join("` or `"),
                    cfg.json_pointer.as_deref().unwrap_or(""),
                    absent_reason.as_deref().unwrap_or("none was found"),
                );
                return self.bad_key(env, KeyError::Missing { detail });
            }
            None => return self.bypass(env, absent_reason.as_deref().unwrap_or("no key")),
        };
        let digest = record_digest(cfg, &head, &key);
        self.record = Some(digest);
        self.payload = Some(payload_digest(&cfg.payload, &head, &body, raw_body));
        let Some(payload) = self.payload else {
            return Action::Continue;
        };
        match &p.config.store {
            StoreConfig::SharedData => self.claim_shared(p, env, digest, payload),
            StoreConfig::Etcd(ec) => self.claim_etcd(p, env, ec, digest, payload),
        }
    }

    fn forward<E: Env>(&mut self, env: &mut E, owned: Owned) -> Action {
        self.stop_waiting(env);
        self.decided("executed");
        env.count(Counter::Executed);
        let digest = match &owned {
            Owned::Shared(c) => c.digest,
            Owned::Etcd(o) => o.digest,
        };
        env.debug(format_args!(
            "stream {}: record {} claimed; forwarding",
            self.id,
            short_hex(&digest)
        ));
        self.phase = Phase::Forwarded(owned);
        Action::Continue
    }

    /// Answers a request whose key is already taken.
    fn duplicate<E: Env>(&mut self, p: &Plugin, env: &mut E, dup: Duplicate) -> Action {
        let cfg = &p.config;
        let policy = cfg.policy_at(self.rule);
        match dup {
            Duplicate::InFlight { held_until } => {
                if policy.on_in_flight == OnInFlight::Wait {
                    if let Some(action) = self.start_or_keep_waiting(p, env, held_until) {
                        return action;
                    }
                    if self.wait_deadline.is_some() {
                        env.count(Counter::WaitTimeout);
                    }
                }
                env.count(Counter::RejectedInFlight);
                let (seconds, detail) = match held_until {
                    Some(until) => (
                        until.saturating_sub(env.now_ms()).div_ceil(1000).max(1),
                        "the first request with this key ended without a known outcome (it may have run); \
                         the key is held until the in-flight timeout ends",
                    ),
                    None => (
                        cfg.retry_after_seconds,
                        "the first request with this key has not been answered yet; retry later",
                    ),
                };
                let retry = vec![("retry-after".to_string(), seconds.to_string().into_bytes())];
                self.reply(env, Problem::InFlight.reply(detail, retry))
            }
            Duplicate::PayloadMismatch => {
                env.count(Counter::PayloadMismatch);
                let detail = "this key was first used with a different method, path or body";
                self.reply(env, Problem::PayloadMismatch.reply(detail, Vec::new()))
            }
            Duplicate::NotStored => self.not_stored(env),
            Duplicate::Completed(_) if policy.on_duplicate == OnDuplicate::Reject => {
                env.count(Counter::RejectedCompleted);
                let detail = "a request with this key has already completed";
                self.reply(env, Problem::AlreadyCompleted.reply(detail, Vec::new()))
            }
            Duplicate::Completed(Some(resp)) => {
                env.count(Counter::Replayed);
                if self.wait_deadline.is_some() {
                    env.count(Counter::WaitReplayed);
                }
                env.debug(format_args!(
                    "stream {}: replaying a stored {}",
                    self.id, resp.status
                ));
                self.reply(env, replay(resp, &cfg.replayed_header))
            }
            Duplicate::Completed(None) => self.not_stored(env),
        }
    }

    /// Wait mode: a duplicate of a claim starts waiting (a place among this worker's
    /// `max_waiters`), or waits on. `None`: it answers 409 now (no place, or its
    /// `wait_timeout_ms` is over).
    fn start_or_keep_waiting<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        held_until: Option<u64>,
    ) -> Option<Action> {
        let (digest, payload) = (self.record?, self.payload?);
        let now = env.now_ms();
        let wait_timeout_ms = p.config.policy_at(self.rule).wait_timeout_ms;
        let deadline = match self.wait_deadline {
            Some(d) => d,
            None => {
                let d = now.saturating_add(wait_timeout_ms);
                // The first check comes at the next tick: a completion that landed
                // between the claim's read and this registration woke nobody here.
                if !env
                    .waiters()
                    .add(self.id, digest, d, now, p.config.max_waiters)
                {
                    env.debug(format_args!(
                        "stream {}: {} duplicates already wait on this worker (max_waiters); 409",
                        self.id, p.config.max_waiters
                    ));
                    return None;
                }
                env.count(Counter::Waited);
                env.debug(format_args!(
                    "stream {}: record {} in flight; waiting up to {} ms for its answer",
                    self.id,
                    short_hex(&digest),
                    wait_timeout_ms
                ));
                self.wait_deadline = Some(d);
                d
            }
        };
        if now >= deadline {
            return None;
        }
        self.phase = Phase::Waiting(Box::new(Waiting {
            digest,
            payload,
            held_until,
        }));
        Some(Action::Pause)
    }

    fn not_stored<E: Env>(&mut self, env: &mut E) -> Action {
        env.count(Counter::ResponseNotStored);
        let detail = "a request with this key has completed, but its response was too large to keep for replay";
        self.reply(env, Problem::ResponseNotStored.reply(detail, Vec::new()))
    }

    fn store_failed<E: Env>(&mut self, p: &Plugin, env: &mut E, why: &str) -> Action {
        env.count(Counter::StoreErrors);
        env.warn(&format!("stream {}: store error: {why}", self.id));
        match p.config.failure_mode {
            FailureMode::Open => {
                self.stop_waiting(env);
                env.count(Counter::FailedOpen);
                self.decided("failed_open");
                self.phase = Phase::Passthrough;
                Action::Continue
            }
            FailureMode::Closed => {
                let detail =
                    "the deduplication store could not answer; the request was not forwarded";
                self.reply(env, Problem::StoreUnavailable.reply(detail, Vec::new()))
            }
        }
    }

    fn complete<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Option<StoreCall> {
        let Phase::Capturing(owned, capture) = std::mem::replace(&mut self.phase, Phase::Finished)
        else {
            return None;
        };
        let response = capture.finish();
        if response.is_none() {
            env.count(Counter::ResponseNotStored);
        }
        let now = env.now_ms();
        match owned {
            Owned::Shared(claim) => {
                self.complete_shared(p, env, &claim, response.as_ref(), now);
                None
            }
            Owned::Etcd(o) => Some(self.complete_etcd(p, env, o, response, now)),
        }
    }

    fn release<E: Env>(&mut self, p: &Plugin, env: &mut E, owned: Owned) -> Option<StoreCall> {
        self.phase = Phase::Finished;
        if self.verdict != Some("outcome_unknown") {
            self.decided("released");
        }
        match owned {
            Owned::Shared(claim) => {
                self.release_shared(p, env, &claim);
                None
            }
            Owned::Etcd(o) => Some(self.release_etcd(p, env, &o)),
        }
    }
}

/// Wait mode: a record this stream completed or released may have waiters, on any
/// worker.
fn wake<E: Env>(p: &Plugin, env: &mut E, digest: &Digest) {
    if p.config.waits() {
        env.wake_waiters(digest);
    }
}

/// How often a worker re-checks what its waiters wait for without a wake-up.
pub fn recheck_interval_ms(p: &Plugin) -> u64 {
    match p.config.store {
        StoreConfig::SharedData => RECHECK_SHARED_MS,
        StoreConfig::Etcd(_) => POLL_ETCD_MS,
    }
}

/// The access-log decision of a local reply, from its response code details.
fn verdict_of(details: &str) -> &'static str {
    match details.strip_prefix("proxy_dedup_").unwrap_or(details) {
        "replayed" => "replayed",
        "in_flight" => "in_flight",
        "payload_mismatch" => "mismatch",
        "already_completed" => "rejected_completed",
        "response_not_stored" => "not_stored",
        "body_too_large" => "body_too_large",
        "store_unavailable" => "store_unavailable",
        _ => "bad_key",
    }
}
