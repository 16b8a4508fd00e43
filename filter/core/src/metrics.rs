//! The filter's counters, all in one list. In Envoy they appear as `wasmcustom.<name>`.

/// A counter the filter increments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Every request the filter saw.
    Requests,
    /// First requests with a key: claimed and forwarded.
    Executed,
    /// Duplicates answered with the stored response.
    Replayed,
    /// Duplicates answered 409 because the first is still in flight.
    RejectedInFlight,
    /// Completed duplicates answered 409 under `on_duplicate: "reject"`.
    RejectedCompleted,
    /// Keys reused with another payload (422).
    PayloadMismatch,
    /// Requests refused with 400: missing, invalid or ambiguous keys, ambiguous scopes
    /// and ambiguous payloads.
    BadKey,
    /// Requests passed through untouched (method not deduplicated, no key).
    Bypassed,
    /// Store operations that failed (host fault, contention, full bucket).
    StoreErrors,
    /// Requests passed through because the store failed under `failure_mode: "open"`.
    FailedOpen,
    /// Completed records evicted before their TTL to make room.
    EvictionsUnexpired,
    /// Claims released after a 5xx, reset or missing response.
    Released,
    /// Request bodies above `max_body_bytes` (413).
    BodyTooLarge,
    /// Responses too large to keep, and duplicates answered 409 for that reason.
    ResponseNotStored,
    /// Claims that expired (in-flight timeout) or were taken over before their response came.
    ClaimsLost,
    /// Forwarded requests whose outcome the filter cannot know (client gone, route
    /// timeout, reset after sending): held in flight, or released under
    /// `on_unknown_outcome: "release"`.
    OutcomeUnknown,
    /// Records removed through the operator API.
    AdminRemoved,
    /// Duplicates of a request in flight held to wait for its answer (`on_in_flight: "wait"`).
    Waited,
    /// Waiting duplicates answered with the first request's stored response.
    WaitReplayed,
    /// Waiting duplicates answered 409 `in-flight` when `wait_timeout_ms` ran out.
    WaitTimeout,
    /// Stored responses of completed records dropped to keep a bucket within its share
    /// of `store.max_store_bytes` (their keys then answer 409 `response-not-stored`).
    BodiesDropped,
    /// Duplicates answered 409 `outcome-unknown`: the first request's outcome is unknown
    /// and its record is kept until its TTL (`on_unknown_outcome: "keep"`).
    RejectedOutcomeUnknown,
    /// Requests answered 503 `store-full`: no slot could be had for their claim (the
    /// bucket is full of live claims) and `on_store_full` is `"reject"`.
    StoreFull,
    /// First executions sent upstream by the filter itself (`upstream.detached`).
    Detached,
    /// Detached executions whose client left before the answer: the call went on and
    /// its answer completed the record.
    DetachedClientGone,
    /// Ordering: requests at or below their entity's applied version, not forwarded
    /// (`409 stale-version`, or acknowledged under `on_stale: "acknowledge"`).
    Stale,
    /// Ordering: entities whose applied version was dropped before its TTL to make room
    /// in a full entity bucket (an older version of them could then run).
    EntitiesEvicted,
    /// Resharding: won claims that read their key on its shard under the other map
    /// (`store.previous_shards` or `store.next_shards`) before going on.
    ReshardChecks,
    /// Resharding: of those, claims that found a live record there and yielded to it
    /// (released unforwarded, answered as its duplicate).
    ReshardYielded,
    /// Requests answered `422 principal-mismatch`: their key's record is another
    /// caller's (a refreshed credential of the same client counts here too).
    PrincipalMismatch,
    /// Requests answered `503 store-unavailable` (`failure_mode: "closed"`): the store
    /// could not answer, nothing was forwarded.
    StoreUnavailable,
}

/// Regions (etcd store): calls to a shard of another region than this proxy's,
/// counted per home region: `proxy_dedup_remote_claims.<region>` and
/// `proxy_dedup_remote_completions.<region>` (defined for every region but the proxy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Remote {
    /// Claims sent to a record's home region (a claim attempt: its txn, whatever the
    /// answer; a woken waiter's claim counts again).
    Claims,
    /// Completions (the completed record written) sent to a record's home region.
    Completions,
}

impl Remote {
    pub const ALL: [Remote; 2] = [Remote::Claims, Remote::Completions];

    pub fn name(self) -> &'static str {
        match self {
            Remote::Claims => "proxy_dedup_remote_claims",
            Remote::Completions => "proxy_dedup_remote_completions",
        }
    }

    /// The counter of `region`.
    pub fn metric(self, region: &str) -> String {
        format!("{}.{region}", self.name())
    }
}

impl Counter {
    pub const ALL: [Counter; 31] = [
        Counter::Requests,
        Counter::Executed,
        Counter::Replayed,
        Counter::RejectedInFlight,
        Counter::RejectedCompleted,
        Counter::PayloadMismatch,
        Counter::BadKey,
        Counter::Bypassed,
        Counter::StoreErrors,
        Counter::FailedOpen,
        Counter::EvictionsUnexpired,
        Counter::Released,
        Counter::BodyTooLarge,
        Counter::ResponseNotStored,
        Counter::ClaimsLost,
        Counter::OutcomeUnknown,
        Counter::AdminRemoved,
        Counter::Waited,
        Counter::WaitReplayed,
        Counter::WaitTimeout,
        Counter::BodiesDropped,
        Counter::RejectedOutcomeUnknown,
        Counter::StoreFull,
        Counter::Detached,
        Counter::DetachedClientGone,
        Counter::Stale,
        Counter::EntitiesEvicted,
        Counter::ReshardChecks,
        Counter::ReshardYielded,
        Counter::PrincipalMismatch,
        Counter::StoreUnavailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Requests => "proxy_dedup_requests",
            Counter::Executed => "proxy_dedup_executed",
            Counter::Replayed => "proxy_dedup_replayed",
            Counter::RejectedInFlight => "proxy_dedup_rejected_in_flight",
            Counter::RejectedCompleted => "proxy_dedup_rejected_completed",
            Counter::PayloadMismatch => "proxy_dedup_payload_mismatch",
            Counter::BadKey => "proxy_dedup_bad_key",
            Counter::Bypassed => "proxy_dedup_bypassed",
            Counter::StoreErrors => "proxy_dedup_store_errors",
            Counter::FailedOpen => "proxy_dedup_failed_open",
            Counter::EvictionsUnexpired => "proxy_dedup_evictions_unexpired",
            Counter::Released => "proxy_dedup_released",
            Counter::BodyTooLarge => "proxy_dedup_body_too_large",
            Counter::ResponseNotStored => "proxy_dedup_response_not_stored",
            Counter::ClaimsLost => "proxy_dedup_claims_lost",
            Counter::OutcomeUnknown => "proxy_dedup_outcome_unknown",
            Counter::AdminRemoved => "proxy_dedup_admin_removed",
            Counter::Waited => "proxy_dedup_waited",
            Counter::WaitReplayed => "proxy_dedup_wait_replayed",
            Counter::WaitTimeout => "proxy_dedup_wait_timeout",
            Counter::BodiesDropped => "proxy_dedup_bodies_dropped",
            Counter::RejectedOutcomeUnknown => "proxy_dedup_rejected_outcome_unknown",
            Counter::StoreFull => "proxy_dedup_store_full",
            Counter::Detached => "proxy_dedup_detached",
            Counter::DetachedClientGone => "proxy_dedup_detached_client_gone",
            Counter::Stale => "proxy_dedup_stale",
            Counter::EntitiesEvicted => "proxy_dedup_entities_evicted",
            Counter::ReshardChecks => "proxy_dedup_reshard_checks",
            Counter::ReshardYielded => "proxy_dedup_reshard_yielded",
            Counter::PrincipalMismatch => "proxy_dedup_principal_mismatch",
            Counter::StoreUnavailable => "proxy_dedup_store_unavailable",
        }
    }

    /// Position in `ALL`, for array-indexed metric ids.
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests;
