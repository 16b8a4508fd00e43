//! One HTTP stream through the filter: key extraction, the claim decision at the end of
//! the request, response capture, completion or release. Host-independent: the proxy-wasm
//! glue feeds it callbacks and carries out the `Action`s it returns.

use crate::config::{Config, FailureMode, OnDuplicate};
use crate::key::{
    header_key, json_key, record_digest, short_hex, ClientKey, FingerprintHasher, JsonKey,
    KeyError, PayloadHasher, RequestHead,
};
use crate::metrics::Counter;
use crate::reply::{replay, LocalReply, Problem};
use crate::response::Capture;
use crate::store::{Claim, ClaimOutcome, Layout, SharedData, SharedStore};

/// A configured plugin: immutable config and the store geometry derived from it.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub config: Config,
    pub layout: Layout,
}

impl Plugin {
    pub fn new(config: Config) -> Self {
        let layout = Layout::new(
            &config.namespace,
            config.capacity,
            config.in_flight_timeout_ms,
            config.ttl_ms,
        );
        Plugin { config, layout }
    }
}

/// What the host provides a stream besides shared data.
pub trait Env: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch (Envoy's clock).
    fn now_ms(&self) -> u64;
    /// A token unique to this claim (random, or counter-based with a random seed).
    fn new_token(&mut self) -> u64;
    fn count(&mut self, counter: Counter);
    fn debug(&self, message: &str);
    fn warn(&self, message: &str);
}

/// What the glue does next with the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Hold the stream (buffer the body) until a later callback decides.
    Pause,
    /// Answer locally; the request never reaches the upstream.
    Reply(LocalReply),
}

enum Phase {
    /// Nothing seen yet.
    Start,
    /// Not deduplicated (method, no key, failed open): the filter stays out of the way.
    Passthrough,
    /// Reading the request body before deciding.
    Reading(Box<Reading>),
    /// Claim won; waiting for the upstream's response headers.
    Forwarded(Claim),
    /// Claim won; collecting a storable response.
    Capturing(Claim, Capture),
    /// Answered locally, completed or released: nothing left to do.
    Finished,
}

struct Reading {
    head: RequestHead,
    header_key: Option<ClientKey>,
    payload: PayloadHasher,
    fingerprint: Option<FingerprintHasher>,
    /// Only kept when the JSON pointer may give the key.
    json_body: Option<Vec<u8>>,
    body_len: usize,
}

/// The per-stream state machine.
pub struct DedupStream {
    id: u32,
    phase: Phase,
}

impl std::fmt::Debug for DedupStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Start => "start",
            Phase::Passthrough => "passthrough",
            Phase::Reading(_) => "reading",
            Phase::Forwarded(_) => "forwarded",
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
        }
    }

    /// True while the stream holds a claim whose response has not been settled.
    pub fn holds_claim(&self) -> bool {
        matches!(self.phase, Phase::Forwarded(_) | Phase::Capturing(..))
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

    /// True while the response body is wanted (the glue reads it only then).
    pub fn wants_response_body(&self) -> bool {
        matches!(self.phase, Phase::Capturing(..))
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
        let cfg = &p.config;
        if !cfg.dedups_method(&head.method) {
            return self.bypass(env, "method not deduplicated");
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
        let fingerprint = (header_key.is_none() && !cfg.fingerprint.is_empty())
            .then(|| FingerprintHasher::new(cfg, &head));
        let json_body = (header_key.is_none() && cfg.json_pointer.is_some()).then(Vec::new);
        self.phase = Phase::Reading(Box::new(Reading {
            payload: PayloadHasher::new(&head),
            head,
            header_key,
            fingerprint,
            json_body,
            body_len: 0,
        }));
        if end_of_stream {
            self.decide(p, env)
        } else {
            Action::Pause
        }
    }

    /// A request body chunk arrived: `chunk` is the part not seen before.
    pub fn on_request_body<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Action {
        let Phase::Reading(r) = &mut self.phase else {
            return Action::Continue;
        };
        r.body_len += chunk.len();
        if r.body_len > p.config.max_body_bytes {
            env.count(Counter::BodyTooLarge);
            let detail = format!(
                "the request body exceeds {} bytes, the most this proxy reads to deduplicate a request",
                p.config.max_body_bytes
            );
            return self.reply(env, Problem::BodyTooLarge.reply(&detail, Vec::new()));
        }
        r.payload.body(chunk);
        if let Some(f) = r.fingerprint.as_mut() {
            f.body(chunk);
        }
        if let Some(b) = r.json_body.as_mut() {
            b.extend_from_slice(chunk);
        }
        if end_of_stream {
            self.decide(p, env)
        } else {
            Action::Pause
        }
    }

    /// The request body could not be read from the host: treated as a store failure
    /// (`failure_mode` decides), never as an empty body.
    pub fn on_request_unreadable<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Action {
        if !matches!(self.phase, Phase::Reading(_)) {
            return Action::Continue;
        }
        self.store_failed(p, env, "the request body could not be read")
    }

    /// Request trailers arrived: the body is complete.
    pub fn on_request_trailers<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Action {
        match self.phase {
            Phase::Reading(_) => self.decide(p, env),
            _ => Action::Continue,
        }
    }

    /// Upstream response headers. `pairs` is called only when the response will be stored.
    pub fn on_response_headers<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        status: u16,
        pairs: impl FnOnce() -> Vec<(String, Vec<u8>)>,
        end_of_stream: bool,
    ) {
        let Phase::Forwarded(claim) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return;
        };
        if !p.config.stores_status(status) {
            env.debug(&format!(
                "stream {}: upstream answered {status}; releasing the claim",
                self.id
            ));
            self.release(p, env, &claim);
            return;
        }
        let capture = Capture::new(status, pairs(), p.config.max_replay_body_bytes);
        self.phase = Phase::Capturing(claim, capture);
        if end_of_stream {
            self.complete(p, env);
        }
    }

    /// A response body chunk passed (only called while `wants_response_body`).
    pub fn on_response_body<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        chunk: &[u8],
        end_of_stream: bool,
    ) {
        if let Phase::Capturing(_, capture) = &mut self.phase {
            capture.body(chunk);
            if end_of_stream {
                self.complete(p, env);
            }
        }
    }

    /// Response trailers arrived: the response is complete (trailers are not stored).
    pub fn on_response_trailers<E: Env>(&mut self, p: &Plugin, env: &mut E) {
        if matches!(self.phase, Phase::Capturing(..)) {
            self.complete(p, env);
        }
    }

    /// The stream ended (Envoy's on_log / on_done). A claim still held here never got a
    /// complete response: reset, timeout, or the client went away. Release it.
    pub fn on_stream_end<E: Env>(&mut self, p: &Plugin, env: &mut E) {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Forwarded(claim) | Phase::Capturing(claim, _) => {
                env.debug(&format!(
                    "stream {}: ended without a complete response; releasing the claim",
                    self.id
                ));
                self.release(p, env, &claim);
            }
            other => self.phase = other,
        }
    }

    fn bypass<E: Env>(&mut self, env: &mut E, why: &str) -> Action {
        env.count(Counter::Bypassed);
        env.debug(&format!("stream {}: bypass ({why})", self.id));
        self.phase = Phase::Passthrough;
        Action::Continue
    }

    fn bad_key<E: Env>(&mut self, env: &mut E, e: KeyError) -> Action {
        env.count(Counter::BadKey);
        let reply = match e {
            KeyError::Missing { detail } => Problem::MissingKey.reply(&detail, Vec::new()),
            KeyError::Invalid { detail } => Problem::InvalidKey.reply(&detail, Vec::new()),
        };
        self.reply(env, reply)
    }

    fn reply<E: Env>(&mut self, env: &mut E, reply: LocalReply) -> Action {
        env.debug(&format!(
            "stream {}: local reply {} ({})",
            self.id, reply.status, reply.details
        ));
        self.phase = Phase::Finished;
        Action::Reply(reply)
    }

    /// The whole request is known: find the key, claim it, and act on the outcome.
    fn decide<E: Env>(&mut self, p: &Plugin, env: &mut E) -> Action {
        let Phase::Reading(r) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Action::Continue;
        };
        let cfg = &p.config;
        let Reading {
            head,
            header_key,
            payload,
            fingerprint,
            json_body,
            ..
        } = *r;
        let mut absent_reason = None;
        let key = match (header_key, &cfg.json_pointer, json_body) {
            (Some(k), _, _) => Some(k),
            (None, Some(ptr), Some(body)) => match json_key(cfg, ptr, &body) {
                JsonKey::Found(k) => Some(k),
                JsonKey::Invalid(e) => return self.bad_key(env, e),
                JsonKey::Absent(reason) => {
                    absent_reason = Some(reason);
                    None
                }
            },
            _ => None,
        };
        let key = match key.or_else(|| fingerprint.map(FingerprintHasher::finish)) {
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
        let payload = payload.finish();
        let token = env.new_token();
        let now = env.now_ms();
        let outcome = SharedStore::new(&*env, &p.layout).claim(&digest, &payload, now, token);
        let id = self.id;
        let rec = short_hex(&digest);
        match outcome {
            Ok(ClaimOutcome::Claimed {
                claim,
                evicted_unexpired,
            }) => {
                env.count(Counter::Executed);
                if evicted_unexpired {
                    env.count(Counter::EvictionsUnexpired);
                }
                env.debug(&format!("stream {id}: record {rec} claimed; forwarding"));
                self.phase = Phase::Forwarded(claim);
                Action::Continue
            }
            Ok(ClaimOutcome::InFlight) => {
                env.count(Counter::RejectedInFlight);
                let retry = vec![(
                    "retry-after".to_string(),
                    cfg.retry_after_seconds.to_string().into_bytes(),
                )];
                let detail =
                    "the first request with this key has not been answered yet; retry later";
                self.reply(env, Problem::InFlight.reply(detail, retry))
            }
            Ok(ClaimOutcome::PayloadMismatch) => {
                env.count(Counter::PayloadMismatch);
                let detail = "this key was first used with a different method, path or body";
                self.reply(env, Problem::PayloadMismatch.reply(detail, Vec::new()))
            }
            Ok(ClaimOutcome::CompletedNotStored) => self.not_stored(env),
            Ok(ClaimOutcome::Completed(_)) if cfg.on_duplicate == OnDuplicate::Reject => {
                env.count(Counter::RejectedCompleted);
                let detail = "a request with this key has already completed";
                self.reply(env, Problem::AlreadyCompleted.reply(detail, Vec::new()))
            }
            Ok(ClaimOutcome::Completed(done)) => {
                match SharedStore::new(&*env, &p.layout).response(&done) {
                    Ok(Some(resp)) => {
                        env.count(Counter::Replayed);
                        env.debug(&format!(
                            "stream {id}: record {rec} completed; replaying {}",
                            resp.status
                        ));
                        self.reply(env, replay(resp, &cfg.replayed_header))
                    }
                    Ok(None) => self.not_stored(env),
                    Err(e) => self.store_failed(p, env, &e.to_string()),
                }
            }
            Err(e) => self.store_failed(p, env, &e.to_string()),
        }
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
                env.count(Counter::FailedOpen);
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

    fn complete<E: Env>(&mut self, p: &Plugin, env: &mut E) {
        let Phase::Capturing(claim, capture) = std::mem::replace(&mut self.phase, Phase::Finished)
        else {
            return;
        };
        let response = capture.finish();
        if response.is_none() {
            env.count(Counter::ResponseNotStored);
        }
        let now = env.now_ms();
        match SharedStore::new(&*env, &p.layout).complete(&claim, response.as_ref(), now) {
            Ok(true) => env.debug(&format!(
                "stream {}: record {} completed",
                self.id,
                short_hex(&claim.digest)
            )),
            Ok(false) => {
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
    }

    fn release<E: Env>(&mut self, p: &Plugin, env: &mut E, claim: &Claim) {
        self.phase = Phase::Finished;
        match SharedStore::new(&*env, &p.layout).release(claim) {
            Ok(true) => env.count(Counter::Released),
            Ok(false) => env.count(Counter::ClaimsLost),
            Err(e) => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: releasing the claim failed: {e}",
                    self.id
                ));
            }
        }
    }
}
