//! The response side of a stream that won its claim: capturing the response, and the
//! end of the claim, completed, released (never executed), or held when the outcome is
//! unknown. The store writes its own record (through the claim it holds, `store.rs`).

use super::{DedupStream, Env, HeldClaim, Origin, Phase, Plugin, StoreCall};
use crate::config::OnUnknownOutcome;
use crate::metrics::Counter;
use crate::outcome::{classify, Outcome};
use crate::phases::{span, Phase as Timed};
use crate::response::Capture;

impl DedupStream {
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

    /// Response headers. `origin` says where the response came from (Envoy's
    /// `response.code_details` and `response.flags`); `pairs` is called only when the
    /// response will be stored. Returns a store call to make (etcd).
    pub fn on_response_headers(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
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
        let capture = {
            let _t = span(Timed::Capture);
            Capture::new(status, pairs(), policy.max_replay_body_bytes)
        };
        self.phase = Phase::Capturing(owned, capture);
        if end_of_stream {
            return self.complete(p, env);
        }
        None
    }

    /// A response body chunk passed (only called while `wants_response_body`).
    pub fn on_response_body(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Option<StoreCall> {
        if let Phase::Capturing(_, capture) = &mut self.phase {
            {
                let _t = span(Timed::Capture);
                capture.body(chunk);
            }
            if end_of_stream {
                return self.complete(p, env);
            }
        }
        None
    }

    /// Response trailers arrived: the response is complete (trailers are not stored).
    pub fn on_response_trailers(&mut self, p: &Plugin, env: &mut dyn Env) -> Option<StoreCall> {
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
    pub fn on_stream_end(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        origin: &Origin,
    ) -> Option<StoreCall> {
        if self.wait_deadline.is_some() {
            // A client that leaves while waiting leaves nothing behind.
            env.waiters().remove(self.id);
        }
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Waiting(_) => {
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
            Phase::Detached(owned) => {
                // The call goes on (the glue keeps this stream for its answer), and the
                // record completes whether or not anyone is left to answer.
                self.detached_over(env);
                env.count(Counter::DetachedClientGone);
                env.debug(format_args!(
                    "stream {}: the client left; the detached call goes on",
                    self.id
                ));
                self.phase = Phase::Detached(owned);
                None
            }
            Phase::Calling(mut c) => {
                // The client left while a store call was out: a waiter's read is of no
                // use now; a claim's answer still comes (the glue keeps the stream for
                // it), and a claim won then is released, since nothing was forwarded.
                if c.client_gone() {
                    self.phase = Phase::Calling(c);
                } else {
                    env.debug(format_args!(
                        "stream {}: the client left while waiting",
                        self.id
                    ));
                }
                None
            }
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// The upstream may or may not have run the request. By default the record is kept
    /// as "outcome unknown" until its TTL, so the key never runs again within it; under
    /// `on_unknown_outcome: "hold"` it is held until the in-flight timeout ends, under
    /// `"release"` released at once.
    pub(crate) fn unknown_outcome(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        origin: &Origin,
    ) -> Option<StoreCall> {
        env.count(Counter::OutcomeUnknown);
        self.decided("outcome_unknown");
        let policy = p.config.policy_at(self.rule);
        let until_ms = match policy.on_unknown_outcome {
            OnUnknownOutcome::Release => {
                env.debug(format_args!(
                    "stream {}: outcome unknown ({}); releasing the claim as configured",
                    self.id, origin.details
                ));
                return self.release(p, env, owned);
            }
            OnUnknownOutcome::Hold => None,
            OnUnknownOutcome::Keep => Some(env.now_ms().saturating_add(policy.ttl_ms)),
        };
        env.debug(format_args!(
            "stream {}: outcome unknown ({}); the record is kept {}",
            self.id,
            origin.details,
            if until_ms.is_some() {
                "until its TTL ends"
            } else {
                "until the in-flight timeout ends"
            }
        ));
        self.phase = Phase::Finished;
        self.hold_claim(p, env, owned, until_ms)
    }

    pub(crate) fn complete(&mut self, p: &Plugin, env: &mut dyn Env) -> Option<StoreCall> {
        let Phase::Capturing(owned, capture) = std::mem::replace(&mut self.phase, Phase::Finished)
        else {
            return None;
        };
        let response = capture.finish();
        if response.is_none() {
            env.count(Counter::ResponseNotStored);
        }
        let now = env.now_ms();
        let _t = span(Timed::Complete);
        self.complete_claim(p, env, owned, response, now)
    }

    pub(crate) fn release(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
    ) -> Option<StoreCall> {
        self.phase = Phase::Finished;
        if self.verdict != Some("outcome_unknown") {
            self.decided("released");
        }
        self.release_claim(p, env, owned)
    }
}
