//! Local replies: errors (RFC 9457 problem+json as built, rewritten once in a policy's
//! `errors` format where they leave the core) and replays of stored responses.

use crate::config::{ErrorBody, ErrorFormat, TemplateValues};
use crate::response::StoredResponse;

/// The header that tells a client when the record behind an answer stops answering
/// (`advertise_expiry`).
pub const EXPIRES_HEADER: &str = "idempotency-expires";

/// A response the filter sends itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// Envoy's response code details (`%RESPONSE_CODE_DETAILS%` in access logs).
    pub details: &'static str,
    /// The problem an error answer reports, with its detail (`None`: not an error,
    /// e.g. a replay): what `in_format` writes the body from.
    pub problem: Option<ProblemDetail>,
}

/// An error answer's problem and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemDetail {
    pub problem: Problem,
    pub detail: String,
}

impl LocalReply {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// This answer as a policy's `errors` format writes it (`None`: as built): an
    /// error's body and `content-type` rewritten, its status too for Stripe's
    /// idempotency errors (`Problem::stripe`); its other headers, and any answer that
    /// is not an error, unchanged.
    pub fn in_format(mut self, format: Option<&ErrorFormat>) -> LocalReply {
        let (Some(format), Some(p)) = (format, self.problem.as_ref()) else {
            return self;
        };
        if format.is_default() {
            return self;
        }
        let (problem, detail) = (p.problem, p.detail.as_str());
        match &format.body {
            ErrorBody::ProblemJson => {}
            ErrorBody::Stripe => {
                let stripe = problem.stripe();
                self.status = stripe.status;
                self.body = serde_json::json!({"error": {
                    "type": stripe.kind,
                    "code": stripe.code,
                    "message": detail,
                }})
                .to_string()
                .into_bytes();
            }
            ErrorBody::Template(template) => {
                let retry_after = self
                    .header("retry-after")
                    .and_then(|v| std::str::from_utf8(v).ok());
                self.body = template.render(&TemplateValues {
                    status: self.status,
                    slug: problem.slug(),
                    title: problem.title(),
                    detail,
                    retry_after,
                });
            }
        }
        for (name, value) in self.headers.iter_mut() {
            if name.eq_ignore_ascii_case("content-type") {
                *value = format.content_type.as_bytes().to_vec();
            }
        }
        self
    }
}

/// A problem as Stripe's API writes it: what Stripe's SDKs choose their error class by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeError {
    pub status: u16,
    /// `error.type`: `idempotency_error`, `invalid_request_error` or `api_error`.
    pub kind: &'static str,
    /// `error.code`: the slug in Stripe's snake case, Stripe's own code where it has one.
    pub code: &'static str,
}

/// The problems the filter answers with; `slug` names the problem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    MissingKey,
    InvalidKey,
    AmbiguousKey,
    AmbiguousScope,
    /// A canonicalised JSON body names a member twice in one object.
    AmbiguousPayload,
    InFlight,
    /// Ordering: the version is at or below its entity's applied version.
    StaleVersion,
    /// Ordering: the request has no entity id, or one that cannot be used.
    MissingEntity,
    InvalidEntity,
    /// Ordering: the request has no version, or one that is not of the configured type.
    MissingVersion,
    InvalidVersion,
    /// The first request's outcome is unknown (it may have run); kept until its TTL.
    OutcomeUnknown,
    AlreadyCompleted,
    ResponseNotStored,
    BodyTooLarge,
    PayloadMismatch,
    /// The key's record belongs to another caller (`principal`).
    PrincipalMismatch,
    StoreUnavailable,
    /// No slot for the claim: the bucket is full of live claims.
    StoreFull,
    /// Detached execution: the call could not be sent (nothing ran).
    UpstreamUnavailable,
    /// Detached execution: the call failed after it was sent (it may have run).
    UpstreamFailed,
    /// Detached execution: the client's deadline passed; the call goes on.
    StillRunning,
    /// Admin API: a request it cannot read.
    BadAdminRequest,
    /// Admin API: no live record for these parameters.
    NoSuchRecord,
    /// Admin API: removing a claim needs `force=true`.
    RecordIsClaim,
    /// Admin role: not an admin path (data-plane traffic is refused).
    NotAdminPath,
}

impl Problem {
    pub fn status(self) -> u16 {
        match self {
            Problem::MissingKey
            | Problem::InvalidKey
            | Problem::AmbiguousKey
            | Problem::AmbiguousScope
            | Problem::AmbiguousPayload
            | Problem::MissingEntity
            | Problem::InvalidEntity
            | Problem::MissingVersion
            | Problem::InvalidVersion => 400,
            Problem::InFlight
            | Problem::StaleVersion
            | Problem::OutcomeUnknown
            | Problem::AlreadyCompleted
            | Problem::ResponseNotStored => 409,
            Problem::BodyTooLarge => 413,
            Problem::PayloadMismatch | Problem::PrincipalMismatch => 422,
            Problem::StoreUnavailable | Problem::StoreFull | Problem::UpstreamUnavailable => 503,
            Problem::UpstreamFailed => 502,
            Problem::StillRunning => 504,
            Problem::BadAdminRequest => 400,
            Problem::NoSuchRecord | Problem::NotAdminPath => 404,
            Problem::RecordIsClaim => 409,
        }
    }

    pub fn slug(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::InvalidKey => "invalid-key",
            Problem::AmbiguousKey => "ambiguous-key",
            Problem::AmbiguousScope => "ambiguous-scope",
            Problem::AmbiguousPayload => "ambiguous-payload",
            Problem::InFlight => "in-flight",
            Problem::StaleVersion => "stale-version",
            Problem::MissingEntity => "missing-entity",
            Problem::InvalidEntity => "invalid-entity",
            Problem::MissingVersion => "missing-version",
            Problem::InvalidVersion => "invalid-version",
            Problem::OutcomeUnknown => "outcome-unknown",
            Problem::AlreadyCompleted => "already-completed",
            Problem::ResponseNotStored => "response-not-stored",
            Problem::BodyTooLarge => "body-too-large",
            Problem::PayloadMismatch => "payload-mismatch",
            Problem::PrincipalMismatch => "principal-mismatch",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::StoreFull => "store-full",
            Problem::UpstreamUnavailable => "upstream-unavailable",
            Problem::UpstreamFailed => "upstream-failed",
            Problem::StillRunning => "still-running",
            Problem::BadAdminRequest => "bad-admin-request",
            Problem::NoSuchRecord => "no-such-record",
            Problem::RecordIsClaim => "record-is-claim",
            Problem::NotAdminPath => "not-admin-path",
        }
    }

    /// This problem in Stripe's terms. stripe-python picks its error class by status,
    /// then `error.type` (`specific_v1_api_error`): `IdempotencyError` only for a `400`
    /// or `404` with type `idempotency_error`, `InvalidRequestError` for other `400`s,
    /// `APIError` for the rest, and it retries `409` and `5xx` itself; stripe-node picks
    /// by `error.type` alone. So the problems of a key already used (in flight, unknown
    /// outcome, completed, another payload or caller) answer `400 idempotency_error`,
    /// as Stripe's API answers a key reused with other parameters, and both SDKs raise
    /// their idempotency error for them; an in-flight one keeps Stripe's own code for
    /// it, `idempotency_key_in_use` (Stripe sends that as a `409`, which stripe-python
    /// retries, then raises as a bare `APIError`). A request the filter cannot use is
    /// an `invalid_request_error` at its own status; a store or upstream that failed an
    /// `api_error` at its own `5xx`, which the SDKs retry, as `retry-after` asks.
    pub fn stripe(self) -> StripeError {
        let (idempotency, request, api) =
            ("idempotency_error", "invalid_request_error", "api_error");
        let (kind, code) = match self {
            Problem::InFlight => (idempotency, "idempotency_key_in_use"),
            Problem::OutcomeUnknown => (idempotency, "outcome_unknown"),
            Problem::AlreadyCompleted => (idempotency, "already_completed"),
            Problem::ResponseNotStored => (idempotency, "response_not_stored"),
            Problem::PayloadMismatch => (idempotency, "payload_mismatch"),
            Problem::PrincipalMismatch => (idempotency, "principal_mismatch"),
            Problem::MissingKey => (request, "missing_key"),
            Problem::InvalidKey => (request, "invalid_key"),
            Problem::AmbiguousKey => (request, "ambiguous_key"),
            Problem::AmbiguousScope => (request, "ambiguous_scope"),
            Problem::AmbiguousPayload => (request, "ambiguous_payload"),
            Problem::StaleVersion => (request, "stale_version"),
            Problem::MissingEntity => (request, "missing_entity"),
            Problem::InvalidEntity => (request, "invalid_entity"),
            Problem::MissingVersion => (request, "missing_version"),
            Problem::InvalidVersion => (request, "invalid_version"),
            Problem::BodyTooLarge => (request, "body_too_large"),
            Problem::StoreUnavailable => (api, "store_unavailable"),
            Problem::StoreFull => (api, "store_full"),
            Problem::UpstreamUnavailable => (api, "upstream_unavailable"),
            Problem::UpstreamFailed => (api, "upstream_failed"),
            Problem::StillRunning => (api, "still_running"),
            Problem::BadAdminRequest => (request, "bad_admin_request"),
            Problem::NoSuchRecord => (request, "no_such_record"),
            Problem::RecordIsClaim => (request, "record_is_claim"),
            Problem::NotAdminPath => (request, "not_admin_path"),
        };
        let status = if kind == idempotency {
            400
        } else {
            self.status()
        };
        StripeError { status, kind, code }
    }

    pub fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "Idempotency key missing",
            Problem::InvalidKey => "Idempotency key invalid",
            Problem::AmbiguousKey => "Idempotency key ambiguous",
            Problem::AmbiguousScope => "Request scope ambiguous",
            Problem::AmbiguousPayload => "Request payload ambiguous",
            Problem::InFlight => "A request with this idempotency key is in progress",
            Problem::StaleVersion => "A newer version of this entity has already been applied",
            Problem::MissingEntity => "Entity id missing",
            Problem::InvalidEntity => "Entity id invalid",
            Problem::MissingVersion => "Version missing",
            Problem::InvalidVersion => "Version invalid",
            Problem::OutcomeUnknown => {
                "A request with this idempotency key may have run; its outcome is unknown"
            }
            Problem::AlreadyCompleted => "A request with this idempotency key has completed",
            Problem::ResponseNotStored => {
                "A request with this idempotency key has completed; its response was not kept"
            }
            Problem::BodyTooLarge => "Request body too large for deduplication",
            Problem::PayloadMismatch => "Idempotency key reused with a different request",
            Problem::PrincipalMismatch => "Idempotency key used by another caller",
            Problem::StoreUnavailable => "Deduplication store unavailable",
            Problem::StoreFull => "Deduplication store full",
            Problem::UpstreamUnavailable => "The upstream could not be reached",
            Problem::UpstreamFailed => "The upstream call failed; the request may have run",
            Problem::StillRunning => "The request is still running upstream",
            Problem::BadAdminRequest => "Bad admin request",
            Problem::NoSuchRecord => "No such record",
            Problem::RecordIsClaim => "The record is a claim whose request may be running",
            Problem::NotAdminPath => "Not an admin path",
        }
    }

    fn details(self) -> &'static str {
        match self {
            Problem::MissingKey => "proxy_dedup_missing_key",
            Problem::InvalidKey => "proxy_dedup_invalid_key",
            Problem::AmbiguousKey => "proxy_dedup_ambiguous_key",
            Problem::AmbiguousScope => "proxy_dedup_ambiguous_scope",
            Problem::AmbiguousPayload => "proxy_dedup_ambiguous_payload",
            Problem::InFlight => "proxy_dedup_in_flight",
            Problem::StaleVersion => "proxy_dedup_stale",
            Problem::MissingEntity
            | Problem::InvalidEntity
            | Problem::MissingVersion
            | Problem::InvalidVersion => "proxy_dedup_bad_version",
            Problem::OutcomeUnknown => "proxy_dedup_outcome_unknown",
            Problem::AlreadyCompleted => "proxy_dedup_already_completed",
            Problem::ResponseNotStored => "proxy_dedup_response_not_stored",
            Problem::BodyTooLarge => "proxy_dedup_body_too_large",
            Problem::PayloadMismatch => "proxy_dedup_payload_mismatch",
            Problem::PrincipalMismatch => "proxy_dedup_principal_mismatch",
            Problem::StoreUnavailable => "proxy_dedup_store_unavailable",
            Problem::StoreFull => "proxy_dedup_store_full",
            Problem::UpstreamUnavailable => "proxy_dedup_upstream_unavailable",
            Problem::UpstreamFailed => "proxy_dedup_upstream_failed",
            Problem::StillRunning => "proxy_dedup_still_running",
            Problem::BadAdminRequest
            | Problem::NoSuchRecord
            | Problem::RecordIsClaim
            | Problem::NotAdminPath => "proxy_dedup_admin",
        }
    }

    /// The problem+json reply; `extra` headers (e.g. `retry-after`) are added.
    pub fn reply(self, detail: &str, extra: Vec<(String, Vec<u8>)>) -> LocalReply {
        let body = serde_json::json!({
            "type": format!("urn:proxy-dedup:problem:{}", self.slug()),
            "title": self.title(),
            "status": self.status(),
            "detail": detail,
        });
        let mut headers = vec![(
            "content-type".to_string(),
            b"application/problem+json".to_vec(),
        )];
        headers.extend(extra);
        LocalReply {
            status: self.status(),
            headers,
            body: body.to_string().into_bytes(),
            details: self.details(),
            problem: Some(ProblemDetail {
                problem: self,
                detail: detail.to_string(),
            }),
        }
    }
}

/// A replay of a stored response, marked with `replayed_header: true`.
pub fn replay(resp: StoredResponse, replayed_header: &str) -> LocalReply {
    let mut headers = resp.headers;
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(replayed_header));
    headers.push((replayed_header.to_string(), b"true".to_vec()));
    LocalReply {
        status: resp.status,
        headers,
        body: resp.body,
        details: "proxy_dedup_replayed",
        problem: None,
    }
}

#[cfg(test)]
mod tests;
