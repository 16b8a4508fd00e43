//! Detached execution (`upstream.detached`): the filter sends a key's first execution
//! upstream itself, with a call made from the root context, so the call (and the record
//! it completes) outlives the client's stream; the client, if still there, is answered
//! with the call's answer. A client that gave up leaves the call running: its retry
//! finds the record completed and gets the replay.

use super::{CallAnswer, Decision, DedupStream, Env, HeldClaim, Origin, Phase, Plugin, StoreCall};
use crate::config::Detached;
use crate::metrics::Counter;
use crate::outcome::Outcome;
use crate::reply::{LocalReply, Problem};
use crate::response::{kept_headers, Capture};

/// The call the glue makes for a detached execution: the live request (its headers,
/// hop-by-hop ones dropped, and its buffered body) to `cluster`, from the root context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamCall {
    pub cluster: String,
    pub timeout_ms: u64,
    /// Request body bytes Envoy holds (the last body callback's size): the call sends
    /// exactly these, or none at all (a call with a body cut short would run another
    /// request than the client's).
    pub body_len: usize,
}

/// Bodies of the local replies Envoy's async client gives for a call that may have
/// reached the upstream (reset after sending, timeout): their outcome is unknown,
/// whatever their status.
const UNKNOWN_BODIES: [&str; 6] = [
    "upstream request timeout",
    "reset reason: connection termination",
    "reset reason: remote reset",
    "reset reason: local reset",
    "reset reason: protocol error",
    "reset reason: overflow",
];

/// What a detached call's answer says about the execution. Envoy reports no response
/// details for a call, so only what the answer itself proves counts: no headers at all
/// (a reset) or one of Envoy's own replies for a call that was sent is unknown; a
/// refused connection or no healthy host answers 503 with a body saying so, which is
/// released like any 5xx; any other answer is the upstream's.
pub fn classify_call(answer: &CallAnswer) -> Outcome {
    if answer.status == 0 {
        return Outcome::Unknown;
    }
    if answer.status >= 500 {
        let body = String::from_utf8_lossy(&answer.body);
        if UNKNOWN_BODIES.iter().any(|b| body.contains(b)) {
            return Outcome::Unknown;
        }
    }
    Outcome::Upstream
}

/// Whether a request header goes into a detached call: not the hop-by-hop ones, nor
/// `content-length` (Envoy frames the call's body itself).
pub fn forwarded_header(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "content-length"
            | "expect"
    )
}

impl DedupStream {
    /// A won claim under detached execution: ask the glue to send the request itself.
    pub(crate) fn send_detached(
        &mut self,
        env: &mut dyn Env,
        owned: HeldClaim,
        d: &Detached,
    ) -> Decision {
        env.count(Counter::Detached);
        self.detached_sent = true;
        if let (Some(ms), Some(digest)) = (d.client_timeout_ms, self.record) {
            // The worker's tick answers the client at its deadline (`on_wake`).
            let deadline = env.now_ms().saturating_add(ms);
            self.client_deadline = Some(deadline);
            env.waiters()
                .add(self.id, digest, deadline, deadline, usize::MAX);
        }
        env.debug(format_args!(
            "stream {}: sending the first execution to cluster `{}` detached",
            self.id, d.cluster
        ));
        self.phase = Phase::Detached(owned);
        Decision::Upstream(UpstreamCall {
            cluster: d.cluster.clone(),
            timeout_ms: d.timeout_ms,
            body_len: self.request_body_len,
        })
    }

    /// True while a detached call is out: its answer goes to `on_store_answer`, and the
    /// glue keeps the stream (as an orphan once the client has gone) until it comes.
    pub fn detached(&self) -> bool {
        matches!(self.phase, Phase::Detached(_))
    }

    /// The client-facing deadline (`upstream.client_timeout_ms`) of a detached call: at
    /// it the client is answered `504 still-running` and the call goes on; its answer
    /// then only completes the record.
    pub(crate) fn detached_deadline(&mut self, env: &mut dyn Env) -> Decision {
        let due = self.client_deadline.is_some_and(|d| env.now_ms() >= d);
        if !self.detached() || self.client_answered || !due {
            return Decision::Pause;
        }
        self.client_answered = true;
        env.waiters().remove(self.id);
        env.debug(format_args!(
            "stream {}: the client's deadline passed; the detached call goes on",
            self.id
        ));
        Decision::Reply(Problem::StillRunning.reply(
            "the request is still running upstream; it will not run twice. \
             Retry with the same idempotency key to get its answer",
            Vec::new(),
        ))
    }

    /// No waiter entry, and no client answer, once the call has answered or the client
    /// has gone.
    pub(crate) fn detached_over(&mut self, env: &mut dyn Env) {
        if self.client_deadline.take().is_some() {
            env.waiters().remove(self.id);
        }
    }

    /// The detached call could not be dispatched (an unknown cluster, a bad header):
    /// nothing was sent, so the claim is released and the client gets a 503.
    pub fn on_upstream_unsent(&mut self, p: &Plugin, env: &mut dyn Env) -> Decision {
        let Phase::Detached(owned) = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return Decision::Continue;
        };
        env.warn(&format!(
            "stream {}: the detached call could not be sent; releasing the claim",
            self.id
        ));
        let reply = Problem::UpstreamUnavailable.reply(
            "the request could not be sent upstream (see the proxy's log); it did not run",
            Vec::new(),
        );
        let call = self.release(p, env, owned);
        self.then_reply(call, reply)
    }

    /// The detached call's answer: the record is completed, released or kept as an
    /// unknown outcome exactly as for a forwarded request, and the client (if still
    /// there) gets the answer once the store has it.
    pub(crate) fn upstream_answered(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        answer: CallAnswer,
    ) -> Decision {
        self.detached_over(env);
        let policy = p.config.policy_at(self.rule);
        let status = answer.status;
        let outcome = classify_call(&answer);
        // The headers a replay carries, filtered once; the body is copied only into the
        // capture, then moved into the client's answer.
        let headers = kept_headers(answer.headers);
        let call = match outcome {
            Outcome::Upstream if policy.stores_status(status) => {
                let mut capture =
                    Capture::new(status, headers.clone(), policy.max_replay_body_bytes);
                capture.body(&answer.body);
                self.phase = Phase::Capturing(owned, capture);
                self.complete(p, env)
            }
            Outcome::Upstream | Outcome::NotExecuted => {
                env.debug(format_args!(
                    "stream {}: the detached call answered {status}; releasing the claim",
                    self.id
                ));
                self.release(p, env, owned)
            }
            Outcome::Unknown => {
                let details = if status == 0 { "reset" } else { "local reply" };
                let origin = Origin {
                    details: format!("detached call: {details} {status}"),
                    flags: 0,
                };
                let call = self.unknown_outcome(p, env, owned, &origin);
                let reply = Problem::UpstreamFailed.reply(
                    "the upstream call failed after the request was sent: it may have run. \
                     This key will not run again while its record lasts; check the operation's result",
                    Vec::new(),
                );
                return self.then_reply(call, reply);
            }
        };
        let reply = LocalReply {
            status,
            headers,
            body: answer.body,
            details: "proxy_dedup_detached",
            problem: None,
        };
        self.then_reply(call, reply)
    }

    /// Answers the client with `reply`, after the store call settling the record when
    /// there is one (etcd), so a client that has its answer finds the record settled.
    fn then_reply(&mut self, call: Option<StoreCall>, reply: LocalReply) -> Decision {
        // A client answered at its deadline gets nothing more.
        let reply = (!self.client_answered).then_some(reply);
        match call {
            None => {
                self.phase = Phase::Finished;
                reply.map_or(Decision::Pause, Decision::Reply)
            }
            Some(call) => {
                self.reply_once_settled(reply);
                Decision::Call(call)
            }
        }
    }
}
