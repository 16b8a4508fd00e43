//! The configuration JSON as written: serde shapes, checked and turned into `Config`
//! by the parsers (`policy`, `rules`, `store`).

use super::*;

/// Hands the policy fields, as `[name: type, …]`, to the macro `$then` before its other
/// input: they are listed once and go into `RawPolicy`, `RawConfig` and `RawRule` (serde's
/// `flatten` would lose the field paths that errors name, and `deny_unknown_fields`).
macro_rules! with_policy_fields {
    ($then:ident! $($input:tt)*) => {
        $then! {
            [
                key: RawKey,
                scope: RawScope,
                principal: RawPrincipal,
                methods: Vec<String>,
                on_duplicate: OnDuplicate,
                on_in_flight: OnInFlight,
                wait_timeout_ms: u64,
                ttl_seconds: u64,
                in_flight_timeout_seconds: u64,
                on_unknown_outcome: OnUnknownOutcome,
                max_body_bytes: u64,
                max_replay_body_bytes: u64,
                store_statuses: Vec<String>,
                payload: RawPayload,
                upstream: RawUpstream,
                grpc: GrpcPolicy,
                ordering: RawOrdering,
                advertise_expiry: bool,
                errors: RawErrors,
            ]
            $($input)*
        }
    };
}

/// `RawPolicy`: the policy fields, at the top level or in a rule.
macro_rules! raw_policy {
    ([$($pf:ident: $pt:ty,)*]) => {
        pub(super) struct RawPolicy {
            $(pub(super) $pf: Option<$pt>,)*
        }

        impl RawPolicy {
            /// The names of the fields that are set, in declaration order.
            pub(super) fn set_fields(&self) -> impl Iterator<Item = &'static str> {
                [$((stringify!($pf), self.$pf.is_some()),)*]
                    .into_iter()
                    .filter_map(|(name, set)| set.then_some(name))
            }
        }
    };
}

/// A raw struct with its own fields and the policy fields, which `take_policy` moves out.
macro_rules! raw_with_policy {
    (
        [$($pf:ident: $pt:ty,)*]
        $(#[$attr:meta])*
        $name:ident { $($(#[$fattr:meta])* $field:ident: $ty:ty,)* }
    ) => {
        $(#[$attr])*
        pub(super) struct $name {
            $($(#[$fattr])* pub(super) $field: $ty,)*
            $(pub(super) $pf: Option<$pt>,)*
        }

        impl $name {
            pub(super) fn take_policy(&mut self) -> RawPolicy {
                RawPolicy {
                    $($pf: self.$pf.take(),)*
                }
            }
        }
    };
}

with_policy_fields!(raw_policy!);

with_policy_fields!(raw_with_policy!
    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    RawConfig {
        max_waiters: Option<u64>,
        max_waiters_per_scope: Option<u64>,
        retry_after_seconds: Option<u64>,
        capacity: Option<u64>,
        replayed_header: Option<String>,
        failure_mode: Option<FailureMode>,
        on_store_full: Option<OnStoreFull>,
        request_id_preserved: Option<bool>,
        role: Option<Role>,
        store: Option<RawStore>,
        rules: Option<Vec<RawRule>>,
    }
);

with_policy_fields!(raw_with_policy!
    /// One entry of `rules`: a match, a stable name, and the policy fields it overrides.
    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    RawRule {
        name: Option<String>,
        #[serde(rename = "match")]
        matcher: Option<RawMatch>,
        records_of: Option<String>,
        bypass: Option<bool>,
    }
);

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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub(super) detached: Option<bool>,
    pub(super) cluster: Option<String>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) client_timeout_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOrdering {
    pub(super) enabled: Option<bool>,
    pub(super) entity: Option<RawEntity>,
    pub(super) version: Option<RawVersion>,
    pub(super) ttl_seconds: Option<u64>,
    pub(super) on_stale: Option<RawOnStale>,
    pub(super) acknowledge_status: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntity {
    pub(super) header: Option<String>,
    pub(super) json_pointer: Option<String>,
    pub(super) parts: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVersion {
    pub(super) header: Option<String>,
    pub(super) json_pointer: Option<String>,
    pub(super) r#type: Option<VersionType>,
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
pub(super) struct RawPrincipal {
    pub(super) header: Option<String>,
    pub(super) cookie: Option<String>,
    pub(super) metadata: Option<Vec<String>>,
    pub(super) none: Option<bool>,
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
    pub(super) eviction: Option<String>,
    pub(super) scope_claims_per_bucket: Option<u64>,
    pub(super) max_entities: Option<u64>,
    pub(super) shards: Option<Vec<RawShard>>,
    pub(super) previous_shards: Option<Vec<RawShard>>,
    pub(super) next_shards: Option<Vec<RawShard>>,
    pub(super) region: Option<String>,
    pub(super) home: Option<RawHome>,
    pub(super) previous_home: Option<RawHome>,
    pub(super) next_home: Option<RawHome>,
}

/// `store.home` (and the previous or next home rule of a re-homing).
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHome {
    pub(super) header: Option<String>,
    pub(super) map: Option<std::collections::BTreeMap<String, String>>,
    pub(super) default: Option<String>,
}

/// An entry of `store.shards` (and of the previous or next map).
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShard {
    pub(super) name: Option<String>,
    pub(super) cluster: Option<String>,
    pub(super) authority: Option<String>,
    pub(super) region: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawErrors {
    pub(super) format: Option<RawErrorFormat>,
    pub(super) content_type: Option<String>,
    pub(super) body: Option<String>,
}

/// `errors.format` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum RawErrorFormat {
    #[serde(rename = "problem+json")]
    ProblemJson,
    #[serde(rename = "stripe")]
    Stripe,
    #[serde(rename = "template")]
    Template,
}

/// `ordering.on_stale` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawOnStale {
    Reject,
    Acknowledge,
}
