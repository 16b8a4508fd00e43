//! One HTTP stream through the filter: key extraction, the claim decision at the end of
//! the request, response capture, completion or release. Host-independent: the proxy-wasm
//! glue feeds it callbacks and carries out the `Decision`s it returns.
//!
//! This file holds the phase machine, the request callbacks and the claim decision,
//! whatever the store. The other rooms: `plugin` (what a stream is given: config, the
//! host seam `Env`, store calls), `completion` (the response side and the end of a won
//! claim), `answer` (local replies: duplicates, bad keys, failure mode), `waiting` (wait
//! mode), `ordering` (the ordering guard's side), `detached` (detached execution), and
//! `store`: the store interface (`Store`, `Held`, `Pending`), which each store implements
//! in its own folder (`crate::stores`). Nothing here names a store.

mod answer;
mod calls;
mod completion;
mod detached;
mod ordering;
mod plugin;
mod store;
mod waiting;

pub use calls::{Answered, Holds};
pub use detached::{classify_call, forwarded_header, UpstreamCall};
pub use ordering::{APPLIED_VERSION_HEADER, STALE_HEADER};
pub use plugin::{keeps_unknown, CallAnswer, Env, Plugin, Route, StoreCall, Transport};
pub use store::{
    human_duration, Held, Operated, Operating, Operation, Pending, SetUpHost, Store, StoreWorker,
};

use crate::config::GrpcPolicy;
use crate::key::{
    fingerprint_key, header_key, json_key, record_digest, short_hex, BodyHasher, ClientKey,
    JsonKey, KeyError, RequestHead,
};
use crate::key::{Digest, ShortHex};
use crate::metrics::Counter;
use crate::payload::{payload_digest, AmbiguousPayload};
use crate::phases::{span, Phase as Timed};
use crate::record::RecordTimes;
use crate::reply::{LocalReply, Problem};
use crate::response::Capture;
use crate::response::StoredResponse;
use answer::bad_key_reply;

/// A claim the stream holds (`Phase::Forwarded`, `Capturing`, `Detached`), in the store
/// it was made in (which it carries): its operations are the store interface's.
pub(crate) type HeldClaim = Box<dyn Held>;

/// What the glue does next with the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
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
    /// Detached execution: send the request upstream with this call (from the root
    /// context); its answer goes to `on_store_answer` like a store call's, and the
    /// stream stays paused until then.
    Upstream(UpstreamCall),
}

pub(crate) enum Phase {
    /// Nothing seen yet.
    Start,
    /// Not deduplicated (method, no key, failed open): the filter stays out of the way.
    Passthrough,
    /// Reading the request body before deciding.
    Reading(Box<Reading>),
    /// Decided at request headers to answer locally (a bad key or scope), while the
    /// body is still coming: the reply waits for the body's end, so Envoy keeps the
    /// connection for the client's next request (a reply before the body is read makes
    /// it close the connection). A body that grows past `max_body_bytes` is answered at
    /// once, unread.
    Draining(Box<LocalReply>),
    /// A store call is out (a claim, a waiter's read, an entity's call, a settle): the
    /// store's own continuation, given the call's answer.
    Calling(Box<dyn Pending>),
    /// Wait mode: a duplicate held until the first request's answer (see `on_wake`).
    Waiting(Box<Waiting>),
    /// Claim won; waiting for the upstream's response headers.
    Forwarded(HeldClaim),
    /// Claim won; the detached call is out (`detached.rs`).
    Detached(HeldClaim),
    /// Claim won; collecting a storable response.
    Capturing(HeldClaim, Capture),
    /// Answered locally, completed or released: nothing left to do.
    Finished,
}

/// The record a waiting duplicate waits for.
pub struct Waiting {
    pub(crate) digest: Digest,
    pub(crate) payload: Digest,
    /// Set when the first's outcome is unknown and its claim is held until then (ms).
    pub(crate) held_until: Option<u64>,
    /// The claim's times as last read (what its 409 advertises).
    pub(crate) times: RecordTimes,
}

/// What a claim found when the key was already taken.
pub(crate) enum Duplicate {
    /// In flight; `held_until` is set when its outcome is unknown and it is held until
    /// then (ms), so the client learns how long to wait.
    InFlight {
        held_until: Option<u64>,
    },
    PayloadMismatch,
    /// Another caller's record (`unowned`: one written before records named their
    /// caller, met by a request that names one).
    OtherCaller {
        unowned: bool,
    },
    NotStored,
    Completed(Option<StoredResponse>),
}

impl Duplicate {
    /// What a record whose stored payload digest stands to the request's as `m` (not
    /// `Same`) answers.
    pub(crate) fn mismatch(m: crate::principal::PayloadMatch) -> Option<Duplicate> {
        use crate::principal::PayloadMatch;
        match m {
            PayloadMatch::Same => None,
            PayloadMatch::OtherPayload => Some(Duplicate::PayloadMismatch),
            PayloadMatch::OtherCaller => Some(Duplicate::OtherCaller { unowned: false }),
            PayloadMatch::Unowned => Some(Duplicate::OtherCaller { unowned: true }),
        }
    }
}

/// The request while its body arrives. The filter keeps no copy of the body: Envoy
/// buffers it, and it is read once, at the end, for the hashes and the JSON pointer.
pub(crate) struct Reading {
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
    /// From Envoy's properties: `details` (`response.code_details`), and `flags` read
    /// only when they matter (`response.flags`, an 8-byte little-endian integer): an
    /// upstream answer (`via_upstream`) is classified by its details alone
    /// (`outcome::classify`). Missing facts read as unknown.
    pub fn from_properties(details: String, flags: impl FnOnce() -> Option<Vec<u8>>) -> Self {
        if details == "via_upstream" {
            return Origin { details, flags: 0 };
        }
        let flags = flags()
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_le_bytes);
        Origin { details, flags }
    }

    pub fn upstream() -> Self {
        Origin {
            details: "via_upstream".to_string(),
            flags: 0,
        }
    }
}

/// The per-stream state machine.
pub struct DedupStream {
    pub(crate) id: u32,
    pub(crate) phase: Phase,
    /// What the filter decided, for access logs (see `log_fields`).
    pub(crate) verdict: Option<&'static str>,
    pub(crate) record: Option<Digest>,
    pub(crate) log_changed: bool,
    /// The request's payload digest, once decided.
    pub(crate) payload: Option<Digest>,
    /// Wait mode: when this duplicate stops waiting (ms), once it waits.
    pub(crate) wait_deadline: Option<u64>,
    /// The rule whose policy this stream follows (`None`: the top-level fields).
    pub(crate) rule: Option<usize>,
    /// Detached execution: the call was sent (so nothing may resume the request), and
    /// when the client is answered `504 still-running` if the call is still out.
    pub(crate) detached_sent: bool,
    pub(crate) client_deadline: Option<u64>,
    pub(crate) client_answered: bool,
    /// The request's scope tag: kept beside its shared-data record (eviction and
    /// per-scope bounds), and bounding its scope's waiters; 0 until decided.
    pub(crate) scope_tag: u32,
    /// What its calls hold back (`calls.rs`).
    pub(crate) calls: calls::Calls,
    /// The ordering guard: the request's entity and version, and its flight once
    /// claimed (`ordering.rs`).
    pub(crate) order: Option<Box<ordering::OrderState>>,
    /// Resharding (etcd): the record this duplicate waits on was found on the key's
    /// shard under the other map, so its re-checks read it there (`etcd::poll_call`).
    pub(crate) waits_on_other_map: bool,
    /// Regions (etcd): the home region of the request's record (and of its ordering
    /// entity), decided from its head at the claim.
    pub(crate) home: crate::config::Home,
    /// Keyless mode, a named caller: the fingerprint's record as versions before callers
    /// wrote it. The caller's request has a record of its own (`principal::caller_record`);
    /// a claim won there yields to a record here that names no caller (`Unowned`), which
    /// may be this caller's from before the upgrade.
    pub(crate) legacy_record: Option<Digest>,
    /// Request body bytes Envoy holds for us (the last body callback's size): a
    /// detached call sends exactly these.
    pub(crate) request_body_len: usize,
}

impl std::fmt::Debug for DedupStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Start => "start",
            Phase::Passthrough => "passthrough",
            Phase::Reading(_) => "reading",
            Phase::Draining(_) => "draining",
            Phase::Calling(ref c) => c.name(),
            Phase::Waiting(_) => "waiting",
            Phase::Forwarded(_) => "forwarded",
            Phase::Detached(_) => "detached",
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
            detached_sent: false,
            client_deadline: None,
            client_answered: false,
            scope_tag: 0,
            calls: calls::Calls::default(),
            order: None,
            waits_on_other_map: false,
            home: crate::config::Home::default(),
            legacy_record: None,
            request_body_len: 0,
        }
    }

    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
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
    /// waited in wait mode and got the first request's response), `stale` and
    /// `bad_version` (the ordering guard).
    pub fn log_fields(&mut self) -> Option<(&'static str, Option<ShortHex<'_>>)> {
        if !std::mem::take(&mut self.log_changed) {
            return None;
        }
        Some((self.verdict?, self.record.as_ref().map(short_hex)))
    }

    pub(crate) fn decided(&mut self, verdict: &'static str) {
        self.verdict = Some(verdict);
        self.log_changed = true;
    }

    /// True while the stream holds a claim whose response has not been settled.
    pub fn holds_claim(&self) -> bool {
        matches!(self.phase, Phase::Forwarded(_) | Phase::Capturing(..))
    }

    /// True while the stream waits (wait mode) for the first request's answer.
    pub fn waiting(&self) -> bool {
        match &self.phase {
            Phase::Waiting(_) => true,
            Phase::Calling(c) => c.waiting(),
            _ => false,
        }
    }

    /// True while the request body is wanted (the glue reads it only then).
    pub fn reading_request(&self) -> bool {
        matches!(self.phase, Phase::Reading(_) | Phase::Draining(_))
    }

    /// Request headers arrived. `end_of_stream` means there is no body.
    pub fn on_request_headers(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        head: RequestHead,
        end_of_stream: bool,
    ) -> Decision {
        env.count(Counter::Requests);
        let (rule, cfg) = {
            let _t = span(Timed::RuleSelect);
            p.config.select(&head)
        };
        self.rule = rule;
        if cfg.bypass {
            return self.bypass(env, "bypassed by its rule");
        }
        if !cfg.dedups_method(&head.method) {
            return self.bypass(env, "method not deduplicated");
        }
        if cfg.grpc == GrpcPolicy::Bypass && head.is_grpc() {
            // A gRPC status lives in trailers, which are not stored, and Envoy turns a
            // local reply to a gRPC request into a trailers-only answer: a replay would
            // be broken, so real gRPC passes untouched unless the policy says otherwise.
            // Before `key.required`: the operator chose to let gRPC by. A gRPC content
            // type over HTTP/1.1 is not gRPC (`is_grpc`): a client cannot opt out.
            return self.bypass(env, "gRPC");
        }
        if let Some(name) = head.ambiguous_scope(cfg) {
            env.count(Counter::BadKey);
            let detail = format!(
                "scope header `{name}` is sent more than once; which scope applies is not clear"
            );
            let reply = Problem::AmbiguousScope.reply(&detail, Vec::new());
            return self.reply_after_body(env, reply, end_of_stream);
        }
        let header_key = {
            let _t = span(Timed::Key);
            header_key(cfg, &head)
        };
        let header_key = match header_key {
            Some(Ok(k)) => Some(k),
            Some(Err(e)) => {
                let reply = bad_key_reply(env, e);
                return self.reply_after_body(env, reply, end_of_stream);
            }
            None => None,
        };
        if header_key.is_none() && cfg.json_pointer.is_none() && cfg.fingerprint.is_empty() {
            if cfg.key_required {
                let detail = format!(
                    "this endpoint requires an idempotency key in header `{}`",
                    cfg.key_headers.join("` or `")
                );
                let reply = bad_key_reply(env, KeyError::Missing { detail });
                return self.reply_after_body(env, reply, end_of_stream);
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
            Decision::Pause
        }
    }

    /// Request body arrived: Envoy has `buffered_len` bytes buffered. At the end of the
    /// stream `read_body` is called once for the whole body (`None`: it could not be
    /// read); before that the body is not copied at all.
    pub fn on_request_body(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        buffered_len: usize,
        end_of_stream: bool,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Decision {
        let max_body_bytes = p.config.policy_at(self.rule).max_body_bytes;
        if matches!(self.phase, Phase::Draining(_)) {
            if !end_of_stream && buffered_len <= max_body_bytes {
                return Decision::Pause;
            }
            return self.send_drained_reply(env);
        }
        if !matches!(self.phase, Phase::Reading(_)) {
            return Decision::Continue;
        }
        self.request_body_len = buffered_len;
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
            Decision::Pause
        }
    }

    /// Request trailers arrived: the body is complete; `read_body` reads it.
    pub fn on_request_trailers(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Decision {
        match self.phase {
            Phase::Reading(_) => self.read_and_decide(p, env, read_body),
            Phase::Draining(_) => self.send_drained_reply(env),
            _ => Decision::Continue,
        }
    }

    /// The body could not be read from the host: treated as a store failure
    /// (`failure_mode` decides), never as an empty body.
    fn read_and_decide(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        read_body: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Decision {
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

    /// The remote store answered a call this stream made.
    pub fn on_store_answer(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        answer: CallAnswer,
    ) -> Decision {
        let decision = match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Detached(owned) => self.upstream_answered(p, env, owned, answer),
            Phase::Calling(c) => c.answered(self, p, env, answer),
            other => {
                self.phase = other;
                Decision::Continue
            }
        };
        // A request sent detached never goes to the router as well.
        match decision {
            Decision::Continue if self.detached_sent => Decision::Pause,
            d => d,
        }
    }

    /// The whole request is known: find the key, claim it, and act on the outcome.
    fn decide(&mut self, p: &Plugin, env: &mut dyn Env, raw_body: &[u8]) -> Decision {
        let Phase::Reading(r) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Decision::Continue;
        };
        let cfg = p.config.policy_at(self.rule);
        let Reading {
            head,
            header_key,
            fingerprint,
        } = *r;
        let body = {
            let _t = span(Timed::BodyHash);
            let mut hasher = BodyHasher::default();
            hasher.update(raw_body);
            hasher.finish()
        };
        let mut absent_reason = None;
        let key = match (header_key, &cfg.json_pointer) {
            (Some(k), _) => Some(k),
            (None, Some(ptr)) => match keyed_by_json(cfg, ptr, raw_body) {
                JsonKey::Found(k) => Some(k),
                JsonKey::Invalid(e) => return self.bad_key(env, e),
                JsonKey::Absent(reason) => {
                    absent_reason = Some(reason);
                    None
                }
            },
            _ => None,
        };
        let key = key.or_else(|| {
            fingerprint.then(|| {
                let _t = span(Timed::Key);
                fingerprint_key(cfg, &head, &body)
            })
        });
        let key = match key {
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
        // Before the record: like the other 400s, an ambiguous payload names no record.
        let payload = {
            let _t = span(Timed::PayloadDigest);
            payload_digest(&cfg.payload, &head, &body, raw_body)
        };
        let payload = match payload {
            Ok(d) => d,
            Err(AmbiguousPayload(detail)) => {
                env.count(Counter::BadKey);
                return self.reply(env, Problem::AmbiguousPayload.reply(&detail, Vec::new()));
            }
        };
        if let Some(o) = &cfg.ordering {
            match crate::ordering::ordered(cfg, o, &head, raw_body, &body) {
                Ok(ordered) => self.order = Some(Box::new(ordering::OrderState::new(ordered))),
                Err(e) => return self.bad_order(env, e),
            }
        }
        let digest = {
            let _t = span(Timed::RecordDigest);
            record_digest(cfg, &head, &key)
        };
        let (payload, digest) = {
            let _t = span(Timed::Principal);
            // The record belongs to its caller: the stored payload digest is sealed with it,
            // and a keyless request of a named caller is an operation of that caller's, in a
            // record of its own (one record per caller and fingerprint, whatever becomes of
            // another caller's).
            let caller = crate::principal::principal(&cfg.principal, &head);
            let payload = crate::principal::seal(&payload, &digest, caller.as_deref());
            let digest = match caller.as_deref() {
                Some(named) if key.source == crate::key::KeySource::Fingerprint => {
                    self.legacy_record = Some(digest);
                    crate::principal::caller_record(&digest, Some(named))
                }
                _ => digest,
            };
            (payload, digest)
        };
        self.record = Some(digest);
        self.payload = Some(payload);
        self.claim(p, env, cfg, &head, digest, payload)
    }

    pub(crate) fn forward(&mut self, p: &Plugin, env: &mut dyn Env, owned: HeldClaim) -> Decision {
        let owned = match self.claim_entity(p, env, owned) {
            Ok(owned) => owned,
            Err(answer) => return answer,
        };
        self.stop_waiting(env);
        self.decided("executed");
        env.count(Counter::Executed);
        if let Some(d) = &p.config.policy_at(self.rule).detached {
            return self.send_detached(env, owned, d);
        }
        env.debug(format_args!(
            "stream {}: record {} claimed; forwarding",
            self.id,
            short_hex(owned.digest())
        ));
        self.phase = Phase::Forwarded(owned);
        Decision::Continue
    }
}

/// The key at a JSON pointer of the body (timed as the key's phase).
fn keyed_by_json(cfg: &crate::config::Policy, ptr: &str, raw_body: &[u8]) -> JsonKey {
    let _t = span(Timed::Key);
    json_key(cfg, ptr, raw_body)
}

/// Wait mode: a record this stream completed or released may have waiters, on any
/// worker.
pub(crate) fn wake(p: &Plugin, env: &mut dyn Env, digest: &Digest) {
    if p.waits {
        env.wake_waiters(digest);
    }
}

#[cfg(test)]
mod tests;
