//! One HTTP stream through the filter: key extraction, the claim decision at the end of
//! the request, response capture, completion or release. Host-independent: the proxy-wasm
//! glue feeds it callbacks and carries out the `Action`s it returns.

use crate::config::{
    Config, EtcdConfig, FailureMode, OnDuplicate, OnInFlight, OnUnknownOutcome, Policy, StoreConfig,
};
use crate::etcd::{self, EtcdAnswer, EtcdRecord, EtcdState, LeaseCache, LeasePlan, LeasePurpose};
use crate::key::{
    fingerprint_key, header_key, json_key, record_digest, short_hex, BodyHasher, ClientKey,
    JsonKey, KeyError, RequestHead,
};
use crate::key::{Digest, ShortHex};
use crate::local::{LocalEntry, LocalTier};
use crate::metrics::Counter;
use crate::outcome::{classify, Outcome};
use crate::payload::payload_digest;
use crate::reply::{replay, LocalReply, Problem};
use crate::response::Capture;
use crate::response::StoredResponse;
use crate::store::{Claim, ClaimOutcome, Layout, SharedData, SharedStore};
use crate::wait::{Waiters, POLL_ETCD_MS, RECHECK_SHARED_MS};

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
    /// Make this store call. On the request path the stream stays paused and the answer
    /// goes to `on_store_answer`; on the response path the stream is not held.
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

struct EtcdOwned {
    key: String,
    digest: Digest,
    payload: Digest,
    token: u64,
    mod_revision: i64,
    completed_lease: i64,
    /// The lease and expiry the in-flight record was written with (a hold keeps both).
    in_flight_lease: i64,
    expires_ms: u64,
}

/// An etcd claim in progress.
struct Claiming {
    key: String,
    digest: Digest,
    payload: Digest,
    token: u64,
    step: ClaimStep,
    /// CAS rounds (claim, takeover) so far.
    rounds: u32,
    /// Transport retries of the current call.
    retries: u32,
    deadline_ms: u64,
    call: StoreCall,
    /// When `call` was last sent (a lease's window starts then).
    sent_ms: u64,
    /// The lease the completed record will carry, fixed when the claim txn is built.
    completed_lease: Option<i64>,
    /// The in-flight lease and expiry of the record the last claim txn writes.
    in_flight_lease: i64,
    expires_ms: u64,
    /// The client left before the claim was decided: a claim won now was never
    /// forwarded, so it is released at once (certainly not executed).
    abandoned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimStep {
    Grant(LeasePurpose),
    Txn,
}

/// What a settling call does to the claim's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Complete,
    Release,
    Hold,
}

impl Settle {
    fn what(self) -> &'static str {
        match self {
            Settle::Complete => "completion",
            Settle::Release => "release",
            Settle::Hold => "hold",
        }
    }
}

struct Settling {
    kind: Settle,
    /// Kept to learn the completed record locally once etcd confirms it.
    learned: Option<(Digest, LocalEntry)>,
    digest: Digest,
    token: u64,
    /// Resent on a transport failure within the budget.
    call: StoreCall,
    retries: u32,
    deadline_ms: u64,
    /// A completion whose lease etcd no longer has is written again with a fresh one.
    regrant: Option<Regrant>,
}

/// What a completion needs to be written again with a fresh lease.
struct Regrant {
    key: String,
    mod_revision: i64,
    /// A lease grant is out (`call` is that grant), sent at this time.
    granting: Option<u64>,
    rounds: u8,
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

const MAX_ROUNDS: u32 = 8;
const MAX_RETRIES: u32 = 4;

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

    /// The answer to a waiter's read of its etcd record: still a claim (wait on), a
    /// completed record (learnt by this worker's tier, so its other waiters answer
    /// without a round trip, then answered like any duplicate), or gone or over (claim
    /// it). A failed read waits on until the next check.
    fn polled<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        mut w: Box<Waiting>,
        answer: &CallAnswer,
    ) -> Action {
        let StoreConfig::Etcd(ec) = &p.config.store else {
            return Action::Continue;
        };
        let now = env.now_ms();
        match poll_answer(ec.protocol.range_path(), answer, &w.digest) {
            Polled::Claimed { held_until } => {
                w.held_until = held_until;
                self.wait_on(p, env, w)
            }
            Polled::Completed(entry) => {
                env.local().insert(w.digest, entry, now);
                env.waiters().wake(&w.digest);
                self.claim_etcd(p, env, ec, w.digest, w.payload)
            }
            Polled::Free => self.claim_etcd(p, env, ec, w.digest, w.payload),
            Polled::Failed => {
                env.count(Counter::StoreErrors);
                env.debug(format_args!(
                    "stream {}: reading record {} failed (status {}); waiting on",
                    self.id,
                    short_hex(&w.digest),
                    answer.status
                ));
                self.wait_on(p, env, w)
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
                // Mark it, so duplicates learn how long the hold lasts.
                if let Err(e) = SharedStore::new(&*env, &p.layout).hold(&claim) {
                    env.count(Counter::StoreErrors);
                    env.warn(&format!(
                        "stream {}: marking the claim held failed: {e}",
                        self.id
                    ));
                }
                None
            }
            // etcd: mark it held, on the same in-flight lease, which alone ends it.
            Owned::Etcd(o) => {
                let record = EtcdRecord {
                    state: EtcdState::Held,
                    token: o.token,
                    expires_ms: o.expires_ms,
                    payload: o.payload,
                    response: None,
                };
                let body = protocol(p).replace_txn(
                    &o.key,
                    o.mod_revision,
                    &record.encode(&o.digest),
                    o.in_flight_lease,
                );
                Some(self.settle(p, env.now_ms(), &o, Settle::Hold, body, None))
            }
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

    fn claim_shared<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        digest: Digest,
        payload: Digest,
    ) -> Action {
        let token = env.new_token();
        let now = env.now_ms();
        let layout = p.layout_for(p.config.policy_at(self.rule));
        let outcome = SharedStore::new(&*env, &layout).claim(&digest, &payload, now, token);
        match outcome {
            Ok(ClaimOutcome::Claimed {
                claim,
                evicted_unexpired,
            }) => {
                if evicted_unexpired {
                    env.count(Counter::EvictionsUnexpired);
                }
                self.forward(env, Owned::Shared(claim))
            }
            Ok(ClaimOutcome::InFlight { held_until }) => {
                self.duplicate(p, env, Duplicate::InFlight { held_until })
            }
            Ok(ClaimOutcome::PayloadMismatch) => self.duplicate(p, env, Duplicate::PayloadMismatch),
            Ok(ClaimOutcome::CompletedNotStored) => self.duplicate(p, env, Duplicate::NotStored),
            Ok(ClaimOutcome::Completed(_))
                if p.config.policy_at(self.rule).on_duplicate == OnDuplicate::Reject =>
            {
                self.duplicate(p, env, Duplicate::Completed(None))
            }
            Ok(ClaimOutcome::Completed(done)) => {
                match SharedStore::new(&*env, &p.layout).response(&done) {
                    Ok(Some(resp)) => self.duplicate(p, env, Duplicate::Completed(Some(resp))),
                    Ok(None) => self.duplicate(p, env, Duplicate::NotStored),
                    Err(e) => self.store_failed(p, env, &e.to_string()),
                }
            }
            Err(e) => self.store_failed(p, env, &e.to_string()),
        }
    }

    /// A won etcd claim goes on, unless its client left meanwhile: then nothing was
    /// forwarded and the claim is released at once.
    fn forward_unless_abandoned<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: Owned,
        abandoned: bool,
    ) -> Action {
        if !abandoned {
            return self.forward(env, owned);
        }
        env.debug(format_args!(
            "stream {}: claim won after the client left; releasing it",
            self.id
        ));
        match self.release(p, env, owned) {
            Some(call) => Action::Call(call),
            None => Action::Continue,
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

    fn claim_etcd<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        ec: &EtcdConfig,
        digest: Digest,
        payload: Digest,
    ) -> Action {
        let now = env.now_ms();
        if let Some(e) = env.local().get(&digest, now) {
            let dup = if e.payload != payload {
                Duplicate::PayloadMismatch
            } else {
                match &e.response {
                    Some(r) => Duplicate::Completed(Some(r.clone())),
                    None => Duplicate::NotStored,
                }
            };
            env.debug(format_args!(
                "stream {}: record {} answered by this worker's tier",
                self.id,
                short_hex(&digest)
            ));
            return self.duplicate(p, env, dup);
        }
        let token = env.new_token();
        let c = Claiming {
            key: etcd::record_key(&ec.prefix, &digest),
            digest,
            payload,
            token,
            step: ClaimStep::Txn,
            rounds: 0,
            retries: 0,
            deadline_ms: now.saturating_add(ec.timeout_ms),
            call: StoreCall {
                path: ec.protocol.txn_path(),
                body: Vec::new(),
                timeout_ms: ec.timeout_ms,
            },
            sent_ms: now,
            completed_lease: None,
            in_flight_lease: 0,
            expires_ms: 0,
            abandoned: false,
        };
        self.next_claim_call(p, env, Box::new(c))
    }

    /// The next call of a claim: a lease grant if this worker has no usable lease, else
    /// the claim txn.
    fn next_claim_call<E: Env>(&mut self, p: &Plugin, env: &mut E, mut c: Box<Claiming>) -> Action {
        let now = env.now_ms();
        let timeout_ms = attempt_timeout(p, c.deadline_ms, now);
        let plan = p.leases_for(p.config.policy_at(self.rule));
        let in_flight = env.leases().get(LeasePurpose::InFlight, &plan, now);
        let completed = env.leases().get(LeasePurpose::Completed, &plan, now);
        let proto = protocol(p);
        let (step, path, body) = match (in_flight, completed) {
            (None, _) => (
                ClaimStep::Grant(LeasePurpose::InFlight),
                proto.lease_grant_path(),
                proto.lease_grant(plan.ttl_s(LeasePurpose::InFlight)),
            ),
            (_, None) => (
                ClaimStep::Grant(LeasePurpose::Completed),
                proto.lease_grant_path(),
                proto.lease_grant(plan.ttl_s(LeasePurpose::Completed)),
            ),
            (Some(lease), Some(completed)) => {
                c.completed_lease = Some(completed);
                let rec = in_flight_record(p.config.policy_at(self.rule), &c, now);
                c.in_flight_lease = lease;
                c.expires_ms = rec.expires_ms;
                (
                    ClaimStep::Txn,
                    proto.txn_path(),
                    proto.claim_txn(&c.key, &rec.encode(&c.digest), lease),
                )
            }
        };
        c.step = step;
        c.retries = 0;
        c.sent_ms = now;
        c.call = StoreCall {
            path,
            body,
            timeout_ms,
        };
        let call = c.call.clone();
        self.phase = Phase::Claiming(c);
        Action::Call(call)
    }

    fn claim_step<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        mut c: Box<Claiming>,
        answer: CallAnswer,
    ) -> Action {
        let now = env.now_ms();
        let parsed = etcd::read_answer(c.call.path, answer.status, &answer.body);
        let transport_failure = matches!(answer.status, 0 | 502 | 503 | 504) && parsed.is_none();
        // etcd's "unavailable" (gRPC code 14: no leader, leader changed, and Envoy's
        // timeouts and resets of a gRPC call) and "deadline exceeded" pass too.
        let unavailable = etcd::retryable_error(&parsed);
        if transport_failure || unavailable {
            // Connection refused or reset, or a member without a leader: another member
            // may answer. Retry within the budget.
            if c.retries < MAX_RETRIES && now < c.deadline_ms {
                c.retries += 1;
                c.call.timeout_ms = attempt_timeout(p, c.deadline_ms, now);
                c.sent_ms = now;
                let call = c.call.clone();
                self.phase = Phase::Claiming(c);
                return Action::Call(call);
            }
            return self.store_failed(
                p,
                env,
                &format!("etcd unreachable (status {})", answer.status),
            );
        }
        let Some(parsed) = parsed else {
            return self.store_failed(
                p,
                env,
                &format!("etcd answered {} with an unreadable body", answer.status),
            );
        };
        match (c.step, parsed) {
            (ClaimStep::Grant(purpose), EtcdAnswer::Lease { id }) => {
                let plan = p.leases_for(p.config.policy_at(self.rule));
                env.leases().put(purpose, &plan, id, c.sent_ms);
                self.next_claim_call(p, env, c)
            }
            (ClaimStep::Txn, EtcdAnswer::Error { code, message })
                if code == 5 || message.contains("lease not found") =>
            {
                // A lease we cached is gone (revoked, or etcd lost it): take fresh ones.
                *env.leases() = LeaseCache::default();
                c.rounds += 1;
                if c.rounds > MAX_ROUNDS {
                    return self.store_failed(p, env, "etcd keeps losing leases");
                }
                self.next_claim_call(p, env, c)
            }
            (_, EtcdAnswer::Error { code, message }) => {
                self.store_failed(p, env, &format!("etcd error {code}: {message}"))
            }
            (
                ClaimStep::Txn,
                EtcdAnswer::Txn {
                    succeeded: true,
                    revision,
                    ..
                },
            ) => {
                let Some(completed_lease) = c.completed_lease else {
                    return self.store_failed(p, env, "no completion lease");
                };
                let owned = Owned::Etcd(EtcdOwned {
                    key: c.key,
                    digest: c.digest,
                    payload: c.payload,
                    token: c.token,
                    mod_revision: revision,
                    completed_lease,
                    in_flight_lease: c.in_flight_lease,
                    expires_ms: c.expires_ms,
                });
                self.forward_unless_abandoned(p, env, owned, c.abandoned)
            }
            (
                ClaimStep::Txn,
                EtcdAnswer::Txn {
                    succeeded: false,
                    existing,
                    ..
                },
            ) => {
                c.rounds += 1;
                if c.rounds > MAX_ROUNDS {
                    return self.store_failed(p, env, "etcd CAS contention");
                }
                let Some((mod_revision, value)) = existing else {
                    // Deleted between the compare and the read: claim again.
                    return self.next_claim_call(p, env, c);
                };
                let current = EtcdRecord::decode(&value, &c.digest);
                match current {
                    Some(r) if r.token == c.token && r.state == EtcdState::InFlight => {
                        // Our own earlier attempt went through; its answer was lost.
                        let Some(completed_lease) = c.completed_lease else {
                            return self.store_failed(p, env, "no completion lease");
                        };
                        let owned = Owned::Etcd(EtcdOwned {
                            key: c.key,
                            digest: c.digest,
                            payload: c.payload,
                            token: c.token,
                            mod_revision,
                            completed_lease,
                            in_flight_lease: c.in_flight_lease,
                            expires_ms: c.expires_ms,
                        });
                        self.forward_unless_abandoned(p, env, owned, c.abandoned)
                    }
                    // An in-flight record of another claim is never taken over by
                    // comparing our clock with the time its proxy wrote: only etcd ends
                    // it, when its lease runs out and the key is gone. Nor is a record
                    // this version cannot read (it may be a newer version's claim).
                    None => {
                        env.debug(format_args!(
                            "stream {}: record {} is unreadable; waiting for its lease to end",
                            self.id,
                            short_hex(&c.digest)
                        ));
                        self.duplicate(p, env, Duplicate::InFlight { held_until: None })
                    }
                    Some(r)
                        if matches!(r.state, EtcdState::InFlight | EtcdState::Held)
                            || r.expires_ms > now =>
                    {
                        if r.payload != c.payload {
                            return self.duplicate(p, env, Duplicate::PayloadMismatch);
                        }
                        match r.state {
                            EtcdState::InFlight => {
                                self.duplicate(p, env, Duplicate::InFlight { held_until: None })
                            }
                            EtcdState::Held => self.duplicate(
                                p,
                                env,
                                Duplicate::InFlight {
                                    held_until: Some(r.expires_ms),
                                },
                            ),
                            EtcdState::CompletedNotStored => {
                                let entry = LocalEntry {
                                    payload: r.payload,
                                    expires_ms: r.expires_ms,
                                    response: None,
                                };
                                env.local().insert(c.digest, entry, now);
                                self.duplicate(p, env, Duplicate::NotStored)
                            }
                            EtcdState::Completed => {
                                let entry = LocalEntry {
                                    payload: r.payload,
                                    expires_ms: r.expires_ms,
                                    response: r.response.clone(),
                                };
                                env.local().insert(c.digest, entry, now);
                                self.duplicate(p, env, Duplicate::Completed(r.response))
                            }
                        }
                    }
                    // A completed record past its TTL by our clock (its lease has not run
                    // out yet): take it over, conditional on it being unchanged since we
                    // read it. A clock running ahead by D takes it over D early.
                    Some(_) => {
                        let policy = p.config.policy_at(self.rule);
                        let plan = p.leases_for(policy);
                        let Some(lease) = env.leases().get(LeasePurpose::InFlight, &plan, now)
                        else {
                            return self.next_claim_call(p, env, c);
                        };
                        let rec = in_flight_record(policy, &c, now);
                        c.in_flight_lease = lease;
                        c.expires_ms = rec.expires_ms;
                        c.call = StoreCall {
                            path: protocol(p).txn_path(),
                            body: protocol(p).replace_txn(
                                &c.key,
                                mod_revision,
                                &rec.encode(&c.digest),
                                lease,
                            ),
                            timeout_ms: attempt_timeout(p, c.deadline_ms, now),
                        };
                        c.retries = 0;
                        c.sent_ms = now;
                        let call = c.call.clone();
                        self.phase = Phase::Claiming(c);
                        Action::Call(call)
                    }
                }
            }
            (_, other) => self.store_failed(p, env, &format!("unexpected etcd answer {other:?}")),
        }
    }

    /// The answer to a completion or release. A transport failure is retried within the
    /// budget (the response is held meanwhile); a failed compare is checked against the
    /// current record, because a retried write whose first attempt went through fails
    /// its compare on our own record.
    fn settled<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        mut st: Box<Settling>,
        answer: &CallAnswer,
    ) -> Action {
        let parsed = etcd::read_answer(st.call.path, answer.status, &answer.body);
        let retryable = (matches!(answer.status, 0 | 502 | 503 | 504) && parsed.is_none())
            || etcd::retryable_error(&parsed);
        let now = env.now_ms();
        if !retryable {
            if let Some(next) = self.regranted(p, env, &mut st, &parsed, now) {
                self.phase = Phase::Settling(st);
                return Action::Call(next);
            }
        }
        if retryable && st.retries < MAX_RETRIES && now < st.deadline_ms {
            st.retries += 1;
            st.call.timeout_ms = attempt_timeout(p, st.deadline_ms, now);
            let call = st.call.clone();
            self.phase = Phase::Settling(st);
            return Action::Call(call);
        }
        let confirmed = match &parsed {
            Some(EtcdAnswer::Txn {
                succeeded: true, ..
            }) => Some(true),
            Some(EtcdAnswer::Txn {
                succeeded: false,
                existing,
                ..
            }) => Some(match existing {
                // Released: the record is gone, by us or by its lease.
                None => st.kind == Settle::Release,
                Some((_, value)) => EtcdRecord::decode(value, &st.digest).is_some_and(|r| {
                    r.token == st.token
                        && match st.kind {
                            Settle::Complete => matches!(
                                r.state,
                                EtcdState::Completed | EtcdState::CompletedNotStored
                            ),
                            Settle::Hold => r.state == EtcdState::Held,
                            Settle::Release => false,
                        }
                }),
            }),
            _ => None,
        };
        match confirmed {
            Some(true) => {
                env.debug(format_args!(
                    "stream {}: {} confirmed by etcd",
                    self.id,
                    st.kind.what()
                ));
                if let Some((digest, entry)) = st.learned {
                    env.local().insert(digest, entry, now);
                }
                if matches!(st.kind, Settle::Complete | Settle::Release) {
                    wake(p, env, &st.digest);
                }
            }
            Some(false) => {
                env.count(Counter::ClaimsLost);
                env.warn(&format!(
                    "stream {}: {}: the claim expired or was taken over first",
                    self.id,
                    st.kind.what()
                ));
            }
            None => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: {} failed (status {})",
                    self.id,
                    st.kind.what(),
                    answer.status
                ));
            }
        }
        Action::Continue
    }

    /// A completion answered "lease not found" (etcd lost or revoked the completed lease
    /// cached at claim time; the in-flight record is still there, or the compare would
    /// have failed first): take a fresh completed lease and write the completion again,
    /// twice at most, within the budget. Returns the next call, if any.
    fn regranted<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        st: &mut Settling,
        parsed: &Option<EtcdAnswer>,
        now: u64,
    ) -> Option<StoreCall> {
        let proto = protocol(p);
        let r = st.regrant.as_mut()?;
        if let Some(sent_ms) = r.granting {
            let Some(EtcdAnswer::Lease { id }) = parsed else {
                return None;
            };
            r.granting = None;
            let plan = p.leases_for(p.config.policy_at(self.rule));
            env.leases()
                .put(LeasePurpose::Completed, &plan, *id, sent_ms);
            let (_, entry) = st.learned.as_ref()?;
            let record = EtcdRecord {
                state: if entry.response.is_some() {
                    EtcdState::Completed
                } else {
                    EtcdState::CompletedNotStored
                },
                token: st.token,
                expires_ms: entry.expires_ms,
                payload: entry.payload,
                response: entry.response.clone(),
            };
            st.call = StoreCall {
                path: proto.txn_path(),
                body: proto.replace_txn(&r.key, r.mod_revision, &record.encode(&st.digest), *id),
                timeout_ms: attempt_timeout(p, st.deadline_ms, now),
            };
            st.retries = 0;
            return Some(st.call.clone());
        }
        let lost = matches!(parsed, Some(EtcdAnswer::Error { code, message })
            if *code == 5 || message.contains("lease not found"));
        if !lost || r.rounds >= 2 || now >= st.deadline_ms {
            return None;
        }
        env.warn(&format!(
            "stream {}: completion: etcd lost its lease; writing it again with a fresh one",
            self.id
        ));
        *env.leases() = LeaseCache::default();
        r.rounds += 1;
        r.granting = Some(now);
        st.call = StoreCall {
            path: proto.lease_grant_path(),
            body: proto.lease_grant(
                p.leases_for(p.config.policy_at(self.rule))
                    .ttl_s(LeasePurpose::Completed),
            ),
            timeout_ms: attempt_timeout(p, st.deadline_ms, now),
        };
        st.retries = 0;
        Some(st.call.clone())
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
                let layout = p.layout_for(p.config.policy_at(self.rule));
                let store = SharedStore::new(&*env, &layout);
                match store.complete_within_budget(&claim, response.as_ref(), now) {
                    Ok(done) if done.owned => {
                        if response.is_some() && !done.stored {
                            // Larger than its bucket's share of `max_store_bytes`.
                            env.count(Counter::ResponseNotStored);
                        }
                        for _ in 0..done.dropped {
                            env.count(Counter::BodiesDropped);
                        }
                        env.debug(format_args!(
                            "stream {}: record {} completed (response kept: {}, bodies dropped: {})",
                            self.id,
                            short_hex(&claim.digest),
                            done.stored,
                            done.dropped
                        ));
                        wake(p, env, &claim.digest);
                    }
                    Ok(_) => {
                        env.count(Counter::ClaimsLost);
                        env.warn(&format!(
                            "stream {}: claim on record {} expired before the response came; not stored",
                            self.id,
                            short_hex(&claim.digest)
                        ));
                    }
                    Err(e) => {
                        env.count(Counter::StoreErrors);
                        env.warn(&format!(
                            "stream {}: completing the record failed: {e}",
                            self.id
                        ));
                    }
                }
                None
            }
            Owned::Etcd(o) => {
                let expires_ms = now.saturating_add(p.config.policy_at(self.rule).ttl_ms);
                let mut record = EtcdRecord {
                    state: if response.is_some() {
                        EtcdState::Completed
                    } else {
                        EtcdState::CompletedNotStored
                    },
                    token: o.token,
                    expires_ms,
                    payload: o.payload,
                    response,
                };
                let mut value = record.encode(&o.digest);
                if record.response.is_some() && value.len() > max_record_bytes(p) {
                    // etcd would refuse it and the key would stay in flight: keep the
                    // completion without the response instead.
                    env.count(Counter::ResponseNotStored);
                    record.state = EtcdState::CompletedNotStored;
                    record.response = None;
                    value = record.encode(&o.digest);
                }
                let body =
                    protocol(p).replace_txn(&o.key, o.mod_revision, &value, o.completed_lease);
                let learned = LocalEntry {
                    payload: o.payload,
                    expires_ms,
                    response: record.response,
                };
                let call = self.settle(p, now, &o, Settle::Complete, body, Some(learned));
                if let Phase::Settling(st) = &mut self.phase {
                    st.regrant = Some(Regrant {
                        key: o.key,
                        mod_revision: o.mod_revision,
                        granting: None,
                        rounds: 0,
                    });
                }
                Some(call)
            }
        }
    }

    fn release<E: Env>(&mut self, p: &Plugin, env: &mut E, owned: Owned) -> Option<StoreCall> {
        self.phase = Phase::Finished;
        if self.verdict != Some("outcome_unknown") {
            self.decided("released");
        }
        match owned {
            Owned::Shared(claim) => {
                match SharedStore::new(&*env, &p.layout).release(&claim) {
                    Ok(true) => {
                        env.count(Counter::Released);
                        wake(p, env, &claim.digest);
                    }
                    Ok(false) => env.count(Counter::ClaimsLost),
                    Err(e) => {
                        env.count(Counter::StoreErrors);
                        env.warn(&format!(
                            "stream {}: releasing the claim failed: {e}",
                            self.id
                        ));
                    }
                }
                None
            }
            Owned::Etcd(o) => {
                env.count(Counter::Released);
                let body = protocol(p).delete_txn(&o.key, o.mod_revision);
                Some(self.settle(p, env.now_ms(), &o, Settle::Release, body, None))
            }
        }
    }

    /// Sends a completion or release txn and waits for it in `Settling`.
    fn settle(
        &mut self,
        p: &Plugin,
        now: u64,
        o: &EtcdOwned,
        kind: Settle,
        body: Vec<u8>,
        learned: Option<LocalEntry>,
    ) -> StoreCall {
        let deadline_ms = now.saturating_add(etcd_timeout(p));
        let call = StoreCall {
            path: protocol(p).txn_path(),
            body,
            timeout_ms: attempt_timeout(p, deadline_ms, now),
        };
        self.phase = Phase::Settling(Box::new(Settling {
            kind,
            learned: learned.map(|l| (o.digest, l)),
            digest: o.digest,
            token: o.token,
            call: call.clone(),
            retries: 0,
            deadline_ms,
            regrant: None,
        }));
        call
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

/// What a waiter's read of its etcd record found.
enum Polled {
    /// In flight or held (when its outcome is unknown, until then): wait on.
    Claimed { held_until: Option<u64> },
    /// Completed: what a duplicate gets (checked against the payload by the claim).
    Completed(LocalEntry),
    /// Gone (released, or its lease ended), unreadable or past its TTL: claim it.
    Free,
    /// No answer, or not one etcd gives to a read.
    Failed,
}

/// The store call that reads a waiter's record (etcd store).
fn poll_call(ec: &EtcdConfig, digest: &Digest) -> StoreCall {
    StoreCall {
        path: ec.protocol.range_path(),
        body: ec.protocol.read_key(&etcd::record_key(&ec.prefix, digest)),
        timeout_ms: ec.timeout_ms.min(POLL_ETCD_MS.max(1000)),
    }
}

/// Interprets the answer to `poll_call`. The time in a completed record is not compared
/// here: the claim that follows decides whether it is over.
fn poll_answer(path: &str, answer: &CallAnswer, digest: &Digest) -> Polled {
    let Some(read) = etcd::read_one(path, answer.status, &answer.body) else {
        return Polled::Failed;
    };
    let Some((_, value)) = read else {
        return Polled::Free;
    };
    match EtcdRecord::decode(&value, digest) {
        Some(r) => match r.state {
            EtcdState::InFlight => Polled::Claimed { held_until: None },
            EtcdState::Held => Polled::Claimed {
                held_until: Some(r.expires_ms),
            },
            EtcdState::Completed | EtcdState::CompletedNotStored => Polled::Completed(LocalEntry {
                payload: r.payload,
                expires_ms: r.expires_ms,
                response: r.response,
            }),
        },
        // A record this version cannot read is a claim it must not take over: the
        // claim that follows answers it as in flight.
        None => Polled::Free,
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

fn etcd_timeout(p: &Plugin) -> u64 {
    match &p.config.store {
        StoreConfig::Etcd(ec) => ec.timeout_ms,
        StoreConfig::SharedData => 1000,
    }
}

fn protocol(p: &Plugin) -> etcd::Protocol {
    match &p.config.store {
        StoreConfig::Etcd(ec) => ec.protocol,
        StoreConfig::SharedData => etcd::Protocol::default(),
    }
}

fn max_record_bytes(p: &Plugin) -> usize {
    match &p.config.store {
        StoreConfig::Etcd(ec) => ec.max_record_bytes,
        StoreConfig::SharedData => usize::MAX,
    }
}

/// The timeout of one attempt: a third of the budget (at least 100 ms), never past the
/// deadline. A request stuck on a member that lost its leader (etcd drops the proposal
/// and the client waits) is abandoned in time to retry on the new leader.
fn attempt_timeout(p: &Plugin, deadline_ms: u64, now_ms: u64) -> u64 {
    let slice = (etcd_timeout(p) / 3).max(100);
    deadline_ms.saturating_sub(now_ms).min(slice).max(1)
}

fn in_flight_record(policy: &Policy, c: &Claiming, now_ms: u64) -> EtcdRecord {
    EtcdRecord {
        state: EtcdState::InFlight,
        token: c.token,
        expires_ms: now_ms.saturating_add(policy.in_flight_timeout_ms),
        payload: c.payload,
        response: None,
    }
}
