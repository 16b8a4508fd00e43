//! How a stream answers when it does not forward: a duplicate (409, 422, replay), a bad
//! key, a bypass, or a store that could not answer (failure mode).

use super::{Decision, DedupStream, Duplicate, Env, Phase, Plugin};
use crate::config::{FailureMode, OnDuplicate, OnInFlight, OnStoreFull, OnUnknownOutcome, Policy};
use crate::httpdate::imf_fixdate_ceil_ms;
use crate::key::KeyError;
use crate::metrics::Counter;
use crate::record::RecordTimes;
use crate::reply::{replay, LocalReply, Problem, EXPIRES_HEADER};

impl DedupStream {
    pub(crate) fn bypass(&mut self, env: &mut dyn Env, why: &str) -> Decision {
        self.decided("bypassed");
        env.count(Counter::Bypassed);
        env.debug(format_args!("stream {}: bypass ({why})", self.id));
        self.phase = Phase::Passthrough;
        Decision::Continue
    }

    pub(crate) fn bad_key(&mut self, env: &mut dyn Env, e: KeyError) -> Decision {
        let reply = bad_key_reply(env, e);
        self.reply(env, reply)
    }

    /// A local reply decided at request headers: sent now when the request has no body
    /// (more), else once the body has arrived (`Phase::Draining`). The decision is
    /// recorded now, so the access log names it even if the client goes away first.
    pub(crate) fn reply_after_body(
        &mut self,
        env: &mut dyn Env,
        reply: LocalReply,
        end_of_stream: bool,
    ) -> Decision {
        if end_of_stream {
            return self.reply(env, reply);
        }
        self.decided(verdict_of(reply.details));
        self.phase = Phase::Draining(Box::new(reply));
        Decision::Pause
    }

    /// The reply of `Phase::Draining`, now that the body is in (or too large).
    pub(crate) fn send_drained_reply(&mut self, env: &mut dyn Env) -> Decision {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Draining(reply) => self.reply(env, *reply),
            other => {
                self.phase = other;
                Decision::Continue
            }
        }
    }

    pub(crate) fn reply(&mut self, env: &mut dyn Env, reply: LocalReply) -> Decision {
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
        Decision::Reply(reply)
    }

    /// Answers a request whose key is already taken; `times` are its record's, as the
    /// store knows them (what the answer advertises, see `Advertised`).
    pub(crate) fn duplicate(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        dup: Duplicate,
        times: RecordTimes,
    ) -> Decision {
        let cfg = &p.config;
        let policy = cfg.policy_at(self.rule);
        let now = env.now_ms();
        let advertised = Advertised::new(policy, times, now);
        match dup {
            Duplicate::InFlight {
                held_until: Some(_),
            } if policy.on_unknown_outcome == OnUnknownOutcome::Keep => {
                // Kept until its TTL: waiting or retrying changes nothing, so no
                // `retry-after` either.
                env.count(Counter::RejectedOutcomeUnknown);
                let detail = "the first request with this key ended without a known outcome: it may have run \
                     (the client left, the upstream timed out or reset after the request was sent). \
                     This key will not run again until its record expires; check the operation's result \
                     before sending it again with a new key";
                let headers = advertised.expires();
                self.reply(env, Problem::OutcomeUnknown.reply(detail, headers))
            }
            Duplicate::InFlight { held_until } => {
                if policy.on_in_flight == OnInFlight::Wait {
                    if let Some(action) = self.start_or_keep_waiting(p, env, held_until, times) {
                        return action;
                    }
                    if self.wait_deadline.is_some() {
                        env.count(Counter::WaitTimeout);
                    }
                }
                env.count(Counter::RejectedInFlight);
                let (seconds, detail) = match held_until {
                    Some(until) => (
                        retry_after_held(until, now),
                        "the first request with this key ended without a known outcome (it may have run); \
                         the key is held until the in-flight timeout ends",
                    ),
                    // Never later than the claim's in-flight end, which
                    // `idempotency-expires` names: by then the answer changes.
                    None => (
                        match times.expires_ms {
                            Some(end) if end > now => cfg
                                .retry_after_seconds
                                .min(end.saturating_sub(now).div_ceil(1000)),
                            _ => cfg.retry_after_seconds,
                        },
                        "the first request with this key has not been answered yet; retry later",
                    ),
                };
                let mut headers =
                    vec![("retry-after".to_string(), seconds.to_string().into_bytes())];
                headers.extend(advertised.expires());
                self.reply(env, Problem::InFlight.reply(detail, headers))
            }
            Duplicate::PayloadMismatch => {
                env.count(Counter::PayloadMismatch);
                let detail = "this key was first used with a different method, path or body";
                let headers = advertised.expires();
                self.reply(env, Problem::PayloadMismatch.reply(detail, headers))
            }
            Duplicate::OtherCaller { unowned } => {
                env.count(Counter::PrincipalMismatch);
                let detail = if unowned {
                    "this key's record was made by a request that named no caller, or before this proxy \
                     recorded callers: it is not replayed to a named caller, and the key does not run \
                     again until its record expires"
                } else {
                    "this key was used by another caller (or by this client with other credentials, \
                     such as a refreshed token): its response goes only to the caller that made it, \
                     and the key does not run again until its record expires; the operation may have \
                     run: check before sending it again with a new key"
                };
                let headers = advertised.expires();
                self.reply(env, Problem::PrincipalMismatch.reply(detail, headers))
            }
            Duplicate::NotStored => self.not_stored(env, advertised.expires()),
            Duplicate::Completed(_) if policy.on_duplicate == OnDuplicate::Reject => {
                env.count(Counter::RejectedCompleted);
                let detail = "a request with this key has already completed";
                let headers = advertised.expires();
                self.reply(env, Problem::AlreadyCompleted.reply(detail, headers))
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
                let mut reply = replay(resp, &cfg.replayed_header);
                advertised.replace_in(&mut reply.headers);
                self.reply(env, reply)
            }
            Duplicate::Completed(None) => self.not_stored(env, advertised.expires()),
        }
    }

    pub(crate) fn not_stored(
        &mut self,
        env: &mut dyn Env,
        headers: Vec<(String, Vec<u8>)>,
    ) -> Decision {
        env.count(Counter::ResponseNotStored);
        let detail = "a request with this key has completed, but its response was too large to keep for replay";
        self.reply(env, Problem::ResponseNotStored.reply(detail, headers))
    }

    /// No slot for the claim (the bucket is full of live claims): another key's traffic
    /// must never make this one run unrecorded, so it is refused unless the operator
    /// chose to fail open.
    pub(crate) fn store_full(&mut self, p: &Plugin, env: &mut dyn Env, why: &str) -> Decision {
        if p.config.on_store_full == OnStoreFull::Open {
            env.count(Counter::StoreErrors);
            env.warn(&format!(
                "stream {}: store full: {why}; failing open as configured",
                self.id
            ));
            return self.fail_open(env);
        }
        let detail =
            "no room to record this request (too many requests in flight); it was not forwarded";
        self.refuse_full(p, env, why, detail)
    }

    /// `503 store-full` with `detail` (its cause counted and logged as `why`).
    pub(crate) fn refuse_full(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        why: &str,
        detail: &str,
    ) -> Decision {
        env.count(Counter::StoreErrors);
        env.count(Counter::StoreFull);
        env.warn(&format!("stream {}: store full: {why}", self.id));
        let retry = vec![(
            "retry-after".to_string(),
            p.config.retry_after_seconds.to_string().into_bytes(),
        )];
        self.reply(env, Problem::StoreFull.reply(detail, retry))
    }

    pub(crate) fn store_failed(&mut self, p: &Plugin, env: &mut dyn Env, why: &str) -> Decision {
        env.count(Counter::StoreErrors);
        env.warn(&format!("stream {}: store error: {why}", self.id));
        match p.config.failure_mode {
            FailureMode::Open => self.fail_open(env),
            FailureMode::Closed => {
                env.count(Counter::StoreUnavailable);
                let detail =
                    "the deduplication store could not answer; the request was not forwarded \
                     (retry it with the same key)";
                let retry = vec![(
                    "retry-after".to_string(),
                    p.config.retry_after_seconds.to_string().into_bytes(),
                )];
                self.reply(env, Problem::StoreUnavailable.reply(detail, retry))
            }
        }
    }
}

impl DedupStream {
    fn fail_open(&mut self, env: &mut dyn Env) -> Decision {
        self.stop_waiting(env);
        env.count(Counter::FailedOpen);
        self.decided("failed_open");
        self.phase = Phase::Passthrough;
        Decision::Continue
    }
}

/// What an answer tells about its record's times (`advertise_expiry`): when it stops
/// answering (`idempotency-expires`, an IMF-fixdate rounded up to the second, so from the
/// second it names on the record no longer answers) and, on a replay, how long ago it
/// completed (`age`, whole seconds). Each only when the record knows the time and it
/// makes sense now: an expiry still ahead, a completion already past; else left out,
/// never a wrong date.
struct Advertised {
    expires: Option<String>,
    age_s: Option<u64>,
}

impl Advertised {
    fn new(policy: &Policy, times: RecordTimes, now_ms: u64) -> Self {
        if !policy.advertise_expiry {
            return Advertised {
                expires: None,
                age_s: None,
            };
        }
        Advertised {
            expires: times
                .expires_ms
                .filter(|&t| t > now_ms)
                .map(imf_fixdate_ceil_ms),
            age_s: times
                .completed_ms
                .filter(|&t| t <= now_ms)
                .map(|t| (now_ms - t) / 1000),
        }
    }

    /// The `idempotency-expires` header of a problem answer (409, 422).
    fn expires(&self) -> Vec<(String, Vec<u8>)> {
        self.expires
            .iter()
            .map(|d| (EXPIRES_HEADER.to_string(), d.clone().into_bytes()))
            .collect()
    }

    /// A replay's headers: ours replace any of those names the stored response has.
    fn replace_in(&self, headers: &mut Vec<(String, Vec<u8>)>) {
        if let Some(d) = &self.expires {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(EXPIRES_HEADER));
            headers.push((EXPIRES_HEADER.to_string(), d.clone().into_bytes()));
        }
        if let Some(age) = self.age_s {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case("age"));
            headers.push(("age".to_string(), age.to_string().into_bytes()));
        }
    }
}

/// `retry-after` for a key or entity held until `until_ms`: the seconds left, at least 1.
pub(crate) fn retry_after_held(until_ms: u64, now_ms: u64) -> u64 {
    until_ms.saturating_sub(now_ms).div_ceil(1000).max(1)
}

/// The access-log decision of a local reply, from its response code details.
fn verdict_of(details: &str) -> &'static str {
    match details.strip_prefix("proxy_dedup_").unwrap_or(details) {
        "replayed" => "replayed",
        "in_flight" => "in_flight",
        "outcome_unknown" => "rejected_outcome_unknown",
        "store_full" => "store_full",
        "payload_mismatch" => "mismatch",
        "principal_mismatch" => "principal_mismatch",
        "already_completed" => "rejected_completed",
        "response_not_stored" => "not_stored",
        "body_too_large" => "body_too_large",
        "store_unavailable" => "store_unavailable",
        "stale" => "stale",
        "bad_version" => "bad_version",
        _ => "bad_key",
    }
}

/// The `400` problem for a bad key, counted.
pub(crate) fn bad_key_reply(env: &mut dyn Env, e: KeyError) -> LocalReply {
    env.count(Counter::BadKey);
    match e {
        KeyError::Missing { detail } => Problem::MissingKey.reply(&detail, Vec::new()),
        KeyError::Invalid { detail } => Problem::InvalidKey.reply(&detail, Vec::new()),
        KeyError::Ambiguous { detail } => Problem::AmbiguousKey.reply(&detail, Vec::new()),
    }
}
