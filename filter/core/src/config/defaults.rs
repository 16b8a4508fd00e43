//! Every default of the configuration, in one place: the `Default` impls of `Policy`
//! and `Config` and the parsers (`policy`, `store`, …) read them from here, so a default
//! is written once.

use super::{FailureMode, GrpcPolicy, OnStoreFull, OnUnknownOutcome, Role, StatusRange};

/// Default `key.headers`: the header that carries the idempotency key.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";
/// Default `key.max_length` (bytes).
pub const DEFAULT_KEY_MAX_LENGTH: u64 = 255;
/// Default `key.required`.
pub const DEFAULT_KEY_REQUIRED: bool = false;
/// Default `scope.authority`: records are scoped by the `:authority`.
pub const DEFAULT_SCOPE_AUTHORITY: bool = true;
/// Default `principal.header`: the caller is named by its credentials.
pub const DEFAULT_PRINCIPAL_HEADER: &str = "authorization";
/// Default `methods`: the methods deduplicated.
pub const DEFAULT_METHODS: [&str; 2] = ["POST", "PATCH"];
/// Default `ttl_seconds` (24 hours), in ms.
pub const DEFAULT_TTL_MS: u64 = 86_400_000;
/// Default `in_flight_timeout_seconds` (30 s), in ms.
pub const DEFAULT_IN_FLIGHT_TIMEOUT_MS: u64 = 30_000;
/// Default `max_body_bytes` (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1_048_576;
/// Default `max_replay_body_bytes` (16 KiB): with the default `capacity`, every bucket's
/// share of the default 128 MiB budget then holds one such response with its headers
/// (6250 × 20 KiB), so the defaults' stored responses fit 128 MiB, a sidecar's size.
pub const DEFAULT_MAX_REPLAY_BODY_BYTES: u64 = 16_384;
/// Default `retry_after_seconds` of a 409 for a request in flight.
pub const DEFAULT_RETRY_AFTER_SECONDS: u64 = 1;
/// Default `capacity`: records in shared data.
pub const DEFAULT_CAPACITY: u64 = 100_000;
/// Default `advertise_expiry`: replays and 409s say when their record stops answering.
pub const DEFAULT_ADVERTISE_EXPIRY: bool = true;
/// Default `replayed_header`, set on a replayed response.
pub const DEFAULT_REPLAYED_HEADER: &str = "idempotent-replayed";
/// Default `failure_mode`.
/// Closed: a store that cannot answer never lets a key run unrecorded (a key that may
/// have run never runs again within its TTL), as `on_store_full` refuses by default.
pub const DEFAULT_FAILURE_MODE: FailureMode = FailureMode::Closed;
/// Default `on_store_full`.
pub const DEFAULT_ON_STORE_FULL: OnStoreFull = OnStoreFull::Reject;
/// Default `on_unknown_outcome`.
pub const DEFAULT_ON_UNKNOWN_OUTCOME: OnUnknownOutcome = OnUnknownOutcome::Keep;
/// Default `role`.
pub const DEFAULT_ROLE: Role = Role::Data;
/// Default `store.namespace` (shared data).
pub const DEFAULT_NAMESPACE: &str = "proxy-dedup";
/// Default `store.prefix` (etcd).
pub const DEFAULT_ETCD_PREFIX: &str = "proxy-dedup/";
/// Default `store.timeout_ms` (etcd): the budget of one claim or settling. It bridges a
/// leader election: on 3-member etcd 3.4 clusters here, a killed leader stopped writes
/// for 1.0-1.65 s with etcd's defaults (`--election-timeout 1000`), also at load 7 on 2
/// cores; an attempt stuck on a member that lost its leader is abandoned after a third
/// of the budget, so 8 s leaves a stuck attempt and two elections' time to spare.
pub const DEFAULT_ETCD_TIMEOUT_MS: u64 = 8000;

/// Statuses stored by default: 2xx, 3xx and 4xx except those that tell the client to
/// come back later (408 Request Timeout, 425 Too Early, 429 Too Many Requests): a retry
/// of those must be able to execute.
/// `DEFAULT_STORE_STATUSES_WRITTEN` parsed, entry for entry (a test checks it).
pub const DEFAULT_STORE_STATUSES: [StatusRange; 6] = [
    StatusRange::new(200, 299, false),
    StatusRange::new(300, 399, false),
    StatusRange::new(400, 499, false),
    StatusRange::new(408, 408, true),
    StatusRange::new(425, 425, true),
    StatusRange::new(429, 429, true),
];

/// Default `store_statuses` as written in a configuration.
pub const DEFAULT_STORE_STATUSES_WRITTEN: [&str; 6] = ["2xx", "3xx", "4xx", "!408", "!425", "!429"];

/// Default `max_waiters`: duplicates one worker holds at once in wait mode.
pub const DEFAULT_MAX_WAITERS: u64 = 1024;

/// Default `wait_timeout_ms` (lowered to the policy's in-flight timeout when that is
/// shorter).
pub const DEFAULT_WAIT_TIMEOUT_MS: u64 = 10_000;

/// Default largest etcd record value: below etcd's default `--max-request-bytes`
/// (1.5 MiB) once base64-encoded in the JSON gateway's request.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 20;

/// Room a record needs besides the response body: its header, the stored response's
/// status and framing, and a typical set of response headers. A record above
/// `store.max_record_bytes` at completion (very large headers) is kept without its
/// response instead.
pub const RECORD_OVERHEAD_BYTES: usize = 16 << 10;

/// Default byte budget of stored responses in shared data (`store.max_store_bytes`),
/// raised so that every bucket can keep one response of the largest
/// `max_replay_body_bytes` (see `store_budget`).
pub const DEFAULT_MAX_STORE_BYTES: u64 = 128 << 20;
/// The least share of `store.max_store_bytes` a bucket of 16 records may get: below it
/// hardly a response would be kept.
pub const MIN_BUCKET_STORE_BYTES: u64 = 4096;
/// Room for a stored response's status and headers beside its body, in the default
/// budget's per-bucket floor.
pub const STORED_HEADERS_ALLOWANCE: u64 = 4096;
/// Default `upstream.timeout_ms` (detached execution).
pub const DEFAULT_DETACHED_TIMEOUT_MS: u64 = 10_000;

/// Default `grpc`: real gRPC requests pass untouched.
pub const DEFAULT_GRPC: GrpcPolicy = GrpcPolicy::Bypass;
/// Default `store.scope_claims_per_bucket`: one scope holds at most half a bucket's ways
/// with live claims.
pub const DEFAULT_SCOPE_CLAIMS_PER_BUCKET: u64 = 8;
/// Default `max_waiters_per_scope`: at most a quarter of the default pool.
pub const DEFAULT_MAX_WAITERS_PER_SCOPE: u64 = 256;

/// Default `max_waiters_per_scope` for a pool of `max_waiters`: half of it (at least 1,
/// at most `DEFAULT_MAX_WAITERS_PER_SCOPE`), so one scope's waiters always leave room
/// for another's.
pub const fn default_max_waiters_per_scope(max_waiters: u64) -> u64 {
    let half = max_waiters / 2;
    let half = if half == 0 { 1 } else { half };
    if half < DEFAULT_MAX_WAITERS_PER_SCOPE {
        half
    } else {
        DEFAULT_MAX_WAITERS_PER_SCOPE
    }
}

/// Default `request_id_preserved`: Envoy's connection manager is taken to generate an
/// `x-request-id` for every request without one and to replace an outside client's.
pub const DEFAULT_REQUEST_ID_PRESERVED: bool = false;

/// Default `ordering.ttl_seconds` (7 days): how long an entity's applied version is kept.
pub const DEFAULT_ORDERING_TTL_SECONDS: u64 = 604_800;
/// Default `ordering.acknowledge_status`.
pub const DEFAULT_ACKNOWLEDGE_STATUS: u64 = 200;
/// Default `store.max_entities` (shared data): entities the ordering guard keeps.
pub const DEFAULT_MAX_ENTITIES: u64 = 16_384;
