//! The configuration JSON as written: serde shapes, checked and turned into `Config`
//! by the parsers (`policy`, `rules`, `store`).

use super::*;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) key: Option<RawKey>,
    pub(super) scope: Option<RawScope>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) on_duplicate: Option<OnDuplicate>,
    pub(super) on_in_flight: Option<OnInFlight>,
    pub(super) wait_timeout_ms: Option<u64>,
    pub(super) max_waiters: Option<u64>,
    pub(super) ttl_seconds: Option<u64>,
    pub(super) in_flight_timeout_seconds: Option<u64>,
    pub(super) retry_after_seconds: Option<u64>,
    pub(super) capacity: Option<u64>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) max_replay_body_bytes: Option<u64>,
    pub(super) store_statuses: Option<Vec<String>>,
    pub(super) replayed_header: Option<String>,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) on_unknown_outcome: Option<OnUnknownOutcome>,
    pub(super) payload: Option<RawPayload>,
    pub(super) role: Option<Role>,
    pub(super) store: Option<RawStore>,
    pub(super) rules: Option<Vec<RawRule>>,
}

/// One entry of `rules`: a match, a stable name, and the policy fields it overrides.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: Option<String>,
    #[serde(rename = "match")]
    pub(super) matcher: Option<RawMatch>,
    pub(super) records_of: Option<String>,
    pub(super) bypass: Option<bool>,
    pub(super) key: Option<RawKey>,
    pub(super) scope: Option<RawScope>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) on_duplicate: Option<OnDuplicate>,
    pub(super) on_in_flight: Option<OnInFlight>,
    pub(super) wait_timeout_ms: Option<u64>,
    pub(super) ttl_seconds: Option<u64>,
    pub(super) in_flight_timeout_seconds: Option<u64>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) max_replay_body_bytes: Option<u64>,
    pub(super) store_statuses: Option<Vec<String>>,
    pub(super) payload: Option<RawPayload>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub(super) path_prefix: Option<String>,
    pub(super) path_exact: Option<String>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) authority: Option<String>,
    pub(super) header: Option<RawHeaderMatch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderMatch {
    pub(super) name: String,
    pub(super) equals: Option<String>,
}

/// The policy fields, at the top level or in a rule.
pub(super) struct RawPolicy {
    pub(super) key: Option<RawKey>,
    pub(super) scope: Option<RawScope>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) on_duplicate: Option<OnDuplicate>,
    pub(super) on_in_flight: Option<OnInFlight>,
    pub(super) wait_timeout_ms: Option<u64>,
    pub(super) ttl_seconds: Option<u64>,
    pub(super) in_flight_timeout_seconds: Option<u64>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) max_replay_body_bytes: Option<u64>,
    pub(super) store_statuses: Option<Vec<String>>,
    pub(super) payload: Option<RawPayload>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPayload {
    pub(super) parts: Option<Vec<String>>,
    pub(super) json_pointers: Option<Vec<String>>,
    pub(super) ignore_json_pointers: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    pub(super) headers: Option<Vec<String>>,
    pub(super) json_pointer: Option<String>,
    pub(super) fingerprint: Option<Vec<String>>,
    pub(super) required: Option<bool>,
    pub(super) max_length: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScope {
    pub(super) headers: Option<Vec<String>>,
    pub(super) authority: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) kind: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) cluster: Option<String>,
    pub(super) authority: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) max_record_bytes: Option<u64>,
    pub(super) protocol: Option<String>,
    pub(super) max_store_bytes: Option<u64>,
}
