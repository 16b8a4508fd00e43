//! Local replies: RFC 9457 problem+json errors and replays of stored responses.

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
}

impl LocalReply {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
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

    fn title(self) -> &'static str {
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
    }
}
