//! Every configuration field, once: its dotted name, type, default, bounds, meaning and
//! where it applies. The parsers read their bounds from here (`Range`, `UpTo`, the
//! `MAX_*` lengths) and their defaults from `defaults`, which this table shows; the
//! reference (`docs/src/reference/fields.md`) and the JSON Schema
//! (`docs/config.schema.json`) are generated from it (`dedupctl reference`,
//! `dedupctl schema`, `make docs-ref`), and `fields/tests.rs` proves it matches the
//! parser field by field.

mod reference;
mod schema;

pub use reference::reference_markdown;
pub use schema::{json_schema, schema_text, UNCHECKED};

use super::defaults::*;
use super::{err, Config, ConfigError};

/// One configuration field.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Dotted path: `key.headers`, `store.max_store_bytes`, `rules[].match.path_prefix`
    /// (`rules[]` is any rule; errors name its index, `rules[2].`).
    pub name: &'static str,
    pub ty: Type,
    /// The default as shown to users.
    pub default: Shown,
    pub applies: Applies,
    /// The reference table the field is listed in.
    pub group: Group,
    /// What it does, in markdown; `{range}` stands where its bounds are written
    /// (`Field::range_text`).
    pub meaning: &'static str,
}

/// A field's JSON type and bounds.
#[derive(Debug, Clone, Copy)]
pub enum Type {
    /// An object whose fields are the table's `<name>.*` entries.
    Object,
    Bool,
    /// An integer within fixed bounds.
    Integer(Range),
    /// An integer bounded by another field's value.
    IntegerUpTo(UpTo),
    /// A string of `Len` bytes (further rules in the meaning).
    String(Len),
    /// One of these strings.
    Enum(&'static [&'static str]),
    /// A list of `Len` entries.
    List(Item, Len),
    /// An object of `Len` entries, each a string (its rules in the field's meaning).
    Map(Len),
}

/// What a list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// A request header name.
    HeaderName,
    /// An upper-case HTTP method.
    Method,
    /// A request part: `method`, `path`, `query`, `body` or `header:<name>`.
    Part,
    /// A status class (`2xx`), a code (`409`), or either with a leading `!`.
    Status,
    /// A string (its rules in the field's meaning).
    String,
    /// A rule: an object with the `rules[].*` fields and the policy fields.
    Rule,
    /// An etcd shard: `{"name", "cluster", "authority", "region"}` (its rules in the field's meaning).
    Shard,
}

/// The parts a `Item::Part` list may name besides `header:<name>`.
pub const PARTS: [&str; 4] = ["method", "path", "query", "body"];

pub(super) fn in_range(
    field: &str,
    v: Option<u64>,
    default: u64,
    low: u64,
    high: u64,
) -> Result<u64, ConfigError> {
    let v = v.unwrap_or(default);
    if v < low || v > high {
        return Err(err(field, format!("{v} is out of range {low}..={high}")));
    }
    Ok(v)
}

/// Fixed integer bounds, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl Range {
    /// `v` (or `default` when absent) if within the bounds, else an error naming `field`.
    pub(super) fn check(
        &self,
        field: &str,
        v: Option<u64>,
        default: u64,
    ) -> Result<u64, ConfigError> {
        in_range(field, v, default, self.min, self.max)
    }
}

/// Bounds of an integer whose largest value is another field's (times a factor; `below`:
/// strictly less than it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpTo {
    pub min: u64,
    /// The field (in the same policy) that bounds it.
    pub field: &'static str,
    pub times: u64,
    pub below: bool,
}

impl UpTo {
    /// The largest value allowed when the bounding field has the value `bound`.
    pub const fn max(&self, bound: u64) -> u64 {
        let m = bound.saturating_mul(self.times);
        if self.below {
            m.saturating_sub(1)
        } else {
            m
        }
    }
}

/// Bounds of a length (bytes of a string, entries of a list), both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Len {
    pub min: usize,
    /// `None`: no upper bound.
    pub max: Option<usize>,
}

impl Len {
    pub const fn new(min: usize, max: Option<usize>) -> Len {
        Len { min, max }
    }
}

/// A default as shown to users.
#[derive(Debug, Clone, Copy)]
pub enum Shown {
    /// This JSON value.
    Json(Value),
    /// This JSON value, with a note on when it differs.
    JsonNote(Value, &'static str),
    /// No value of its own (`none`, `required`, `the cluster name`).
    Text(&'static str),
    /// Computed from other fields: the formula, in markdown.
    Computed(fn() -> String),
}

/// A default JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Int(u64),
    Bool(bool),
    Str(&'static str),
    List(&'static [&'static str]),
}

impl Value {
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Value::Int(n) => n.into(),
            Value::Bool(b) => b.into(),
            Value::Str(s) => s.into(),
            Value::List(l) => l.iter().map(|s| serde_json::Value::from(*s)).collect(),
        }
    }
}

impl Shown {
    /// The default as a JSON value, when it is one.
    pub fn json(&self) -> Option<serde_json::Value> {
        match self {
            Shown::Json(v) | Shown::JsonNote(v, _) => Some(v.to_json()),
            Shown::Text(_) | Shown::Computed(_) => None,
        }
    }
}

/// Where a field may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// At the top level only: the filter's, not a route's.
    TopLevel,
    /// A policy field: at the top level, and in a rule to override it there.
    Policy,
    /// In a rule only.
    Rule,
    /// In `store`, whatever its kind.
    Store,
    /// In `store`, with `kind: "shared_data"` only.
    SharedData,
    /// In `store`, with `kind: "etcd"` only.
    Etcd,
}

impl Applies {
    pub fn text(self) -> &'static str {
        match self {
            Applies::TopLevel => "top level",
            Applies::Policy => "top level and per rule",
            Applies::Rule => "per rule",
            Applies::Store => "store (either kind)",
            Applies::SharedData => "store: shared data",
            Applies::Etcd => "store: etcd",
        }
    }
}

/// The reference table a field is listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The filter's fields: policy, limits, shared data.
    Configuration,
    /// The fields of a rule.
    Rules,
    /// The etcd store's fields.
    Etcd,
    /// The ordering guard's fields (`ordering.*`).
    Ordering,
}

/// Most names in a header list (`key.headers`, `scope.headers`).
pub const MAX_HEADERS: usize = 16;
/// Most pointers in `payload.json_pointers` or `payload.ignore_json_pointers`.
pub const MAX_PAYLOAD_POINTERS: usize = 32;
/// Longest `store.namespace`.
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// Longest `store.prefix`.
pub const MAX_ETCD_PREFIX_BYTES: usize = 128;
/// Most shards in one map (`store.shards`, `store.previous_shards`, `store.next_shards`).
pub const MAX_SHARDS: usize = 16;
/// Longest shard name.
pub const MAX_SHARD_NAME_BYTES: usize = 64;
/// Most entries of a home rule's `map` (`store.home.map`).
pub const MAX_HOME_MAP: usize = 4096;
/// Longest header value a home rule's `map` names.
pub const MAX_HOME_VALUE_BYTES: usize = 256;
/// Longest `upstream.cluster`.
pub const MAX_CLUSTER_BYTES: usize = 256;
/// Longest rule name.
pub const MAX_RULE_NAME_BYTES: usize = 64;
/// Most rules in one configuration (each request is matched against them in order).
pub const MAX_RULES: usize = 128;
/// Longest `principal.cookie` name.
pub const MAX_PRINCIPAL_NAME_BYTES: usize = 256;
/// Most entries of `principal.metadata` (the namespace and the keys inside it).
pub const MAX_METADATA_PATH: usize = 8;
/// Longest `errors.content_type`.
pub const MAX_CONTENT_TYPE_BYTES: usize = 256;
/// Longest `errors.body` template.
pub const MAX_ERROR_TEMPLATE_BYTES: usize = 4096;

pub const KEY_MAX_LENGTH: Range = Range { min: 1, max: 4096 };
pub const MAX_WAITERS: Range = Range {
    min: 1,
    max: 100_000,
};
pub const TTL_SECONDS: Range = Range {
    min: 1,
    max: 31_536_000,
};
pub const IN_FLIGHT_TIMEOUT_SECONDS: Range = Range {
    min: 1,
    max: 86_400,
};
pub const RETRY_AFTER_SECONDS: Range = Range { min: 0, max: 3600 };
pub const CAPACITY: Range = Range {
    min: 16,
    max: 10_000_000,
};
pub const MAX_BODY_BYTES: Range = Range {
    min: 0,
    max: 64 << 20,
};
pub const MAX_REPLAY_BODY_BYTES: Range = Range {
    min: 0,
    max: 16 << 20,
};
pub const MAX_STORE_BYTES: Range = Range {
    min: 1 << 20,
    max: 1 << 40,
};
pub const SCOPE_CLAIMS_PER_BUCKET: Range = Range {
    min: 1,
    max: crate::geometry::WAYS as u64,
};
pub const ETCD_TIMEOUT_MS: Range = Range {
    min: 10,
    max: 60_000,
};
pub const MAX_RECORD_BYTES: Range = Range {
    min: 4096,
    max: 64 << 20,
};
pub const ORDERING_TTL_SECONDS: Range = Range {
    min: 1,
    max: 31_536_000,
};
pub const ACKNOWLEDGE_STATUS: Range = Range { min: 200, max: 299 };
pub const MAX_ENTITIES: Range = Range {
    min: 16,
    max: 4_000_000,
};
pub const WAIT_TIMEOUT_MS: UpTo = UpTo {
    min: 1,
    field: "in_flight_timeout_seconds",
    times: 1000,
    below: false,
};
pub const MAX_WAITERS_PER_SCOPE: UpTo = UpTo {
    min: 1,
    field: "max_waiters",
    times: 1,
    below: false,
};
pub const UPSTREAM_TIMEOUT_MS: UpTo = UpTo {
    min: 1,
    field: "in_flight_timeout_seconds",
    times: 1000,
    below: true,
};
pub const UPSTREAM_CLIENT_TIMEOUT_MS: UpTo = UpTo {
    min: 1,
    field: "upstream.timeout_ms",
    times: 1,
    below: true,
};

/// `store.max_store_bytes`'s default: the formula, and its value with the defaults.
fn max_store_bytes_default() -> String {
    let with_defaults = Config::default().max_store_bytes().unwrap_or(0);
    format!(
        "{} MiB, raised so that every bucket can keep one response of the largest \
         `max_replay_body_bytes` (with its headers): \
         `max({DEFAULT_MAX_STORE_BYTES}, capacity / {ways} × (max_replay_body_bytes + \
         {STORED_HEADERS_ALLOWANCE}))`, about {} MiB with the defaults",
        DEFAULT_MAX_STORE_BYTES >> 20,
        (with_defaults + (1 << 19)) >> 20,
        ways = crate::geometry::WAYS,
    )
}

impl Field {
    /// The bounds as written in the reference (`{range}` in the meaning), if any.
    pub fn range_text(&self) -> Option<String> {
        let len = |l: &Len| match (l.min, l.max) {
            (_, None) => None,
            (0, Some(max)) => Some(format!("at most {max}")),
            (min, Some(max)) => Some(format!("{min}–{max}")),
        };
        match &self.ty {
            Type::Integer(r) => Some(format!("{} – {}", r.min, r.max)),
            Type::IntegerUpTo(u) => {
                let below = if u.below { "below " } else { "" };
                let times = if u.times == 1 {
                    String::new()
                } else {
                    format!(" × {}", u.times)
                };
                Some(format!("{} – {below}`{}`{times}", u.min, u.field))
            }
            Type::String(l) | Type::List(_, l) | Type::Map(l) => len(l),
            Type::Object | Type::Bool | Type::Enum(_) => None,
        }
    }

    /// The meaning with its bounds written in.
    pub fn meaning_text(&self) -> String {
        match self.range_text() {
            Some(r) => self.meaning.replace("{range}", &r),
            None => self.meaning.to_string(),
        }
    }

    /// The default as the reference shows it.
    pub fn default_text(&self) -> String {
        let json = |v: &Value| match v {
            Value::List(l) => format!(
                "`[{}]`",
                l.iter()
                    .map(|s| serde_json::Value::from(*s).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => format!("`{}`", other.to_json()),
        };
        match &self.default {
            Shown::Json(v) => json(v),
            Shown::JsonNote(v, note) => format!("{} {note}", json(v)),
            Shown::Text(t) => t.to_string(),
            Shown::Computed(f) => f(),
        }
    }

    /// The field's name under `rules[i]` (its own name for a rule field, the policy
    /// field's inside a rule), with `i` written in.
    pub fn path_in_rule(&self, i: usize) -> String {
        match self.name.strip_prefix("rules[].") {
            Some(rest) => format!("rules[{i}].{rest}"),
            None => format!("rules[{i}].{}", self.name),
        }
    }
}

/// The field named `name` (as the table writes it).
pub fn field(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

/// The fields directly inside the object `parent` (`""`: the top level, `"rules[]"`: a
/// rule, which also takes the policy fields).
pub fn children(parent: &str) -> Vec<&'static Field> {
    let direct = |f: &&Field| match parent {
        "" => !f.name.contains('.'),
        p => f
            .name
            .strip_prefix(p)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| !rest.contains('.')),
    };
    let mut out: Vec<&Field> = FIELDS.iter().filter(direct).collect();
    if parent.is_empty() {
        out.retain(|f| f.applies != Applies::Rule);
    }
    if parent == "rules[]" {
        out.extend(
            FIELDS
                .iter()
                .filter(|f| f.applies == Applies::Policy && !f.name.contains('.')),
        );
    }
    out
}

/// Every configuration field, in the reference's order.
pub const FIELDS: &[Field] = &[
    Field {
        name: "key",
        ty: Type::Object,
        default: Shown::Text(r#"see its fields"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"where a request's idempotency key comes from: a header, a JSON body field, or a fingerprint of the request (the `key.*` fields below)."#,
    },
    Field {
        name: "key.headers",
        ty: Type::List(Item::HeaderName, Len::new(1, Some(MAX_HEADERS))),
        default: Shown::Json(Value::List(&[DEFAULT_KEY_HEADER])),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"request headers that carry the client's key; the first one present wins. {range} names. A key header sent on more than one line gets `400 ambiguous-key`. A key is its bytes, exactly as Envoy delivers them (never read through a lossy text conversion), so two different keys never share a record; the one equivalence is an RFC 8941 string: `"abc"` (quoted) is the key `abc`."#,
    },
    Field {
        name: "key.json_pointer",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"RFC 6901 pointer (e.g. `"/msgId"`) into a JSON request body; used when no header key is present. A string or integer value is the key; a member named twice on the pointer's path (`{"id": "a", "id": "b"}`) gets `400 ambiguous-key`. A string's content is the key exactly, escapes decoded: `"\"abc\""` is the key `"abc"` with its quotes, another key than `"abc"` (only header keys are unquoted as RFC 8941 strings). An integer is its decimal digits, so `123` and `"123"` are one key (with the default payload check, `{"id": 123}` after `{"id": "123"}` is that key with another body: `422`). A key string holding a lone surrogate (`"\ud800"`) is not read: for the key, the body is not JSON."#,
    },
    Field {
        name: "key.fingerprint",
        ty: Type::List(Item::Part, Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"keyless mode: list of `"method"`, `"path"`, `"query"`, `"body"`, `"header:<name>"` (`<name>` may be `:authority`, `:path` or `:method`); the key is a SHA-256 of these parts (the body enters as its BLAKE3 digest). Used when neither a header nor the pointer gives a key. A `header:` part hashes the header's bytes; a missing header differs from an empty one, and a header sent on several lines counts with every line, in order (`a` then `b` differs from `a` alone and from `b` then `a`)."#,
    },
    Field {
        name: "key.required",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(DEFAULT_KEY_REQUIRED)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"a request with no key gets `400`. When `false` it passes through untouched (counted as bypassed)."#,
    },
    Field {
        name: "key.max_length",
        ty: Type::Integer(KEY_MAX_LENGTH),
        default: Shown::Json(Value::Int(DEFAULT_KEY_MAX_LENGTH)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"longer keys (in bytes) get `400 invalid-key` ({range}). A key must be UTF-8 without control characters (C0, DEL, C1): bytes that are not UTF-8 (`op-\xff`) or control characters get `400 invalid-key`; any other UTF-8, spaces included, is a key."#,
    },
    Field {
        name: "scope",
        ty: Type::Object,
        default: Shown::Text(r#"see its fields"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"what namespaces every key: header values and the `:authority` (the `scope.*` fields below)."#,
    },
    Field {
        name: "scope.headers",
        ty: Type::List(Item::HeaderName, Len::new(0, Some(MAX_HEADERS))),
        default: Shown::Json(Value::List(&[])),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"header values that namespace every key (tenant, user, API key); `:authority`, `:path` and `:method` may be named too. Two scopes never see each other's records; a missing scope header is a scope of its own, distinct from an empty one. A scope header sent on more than one line gets `400 ambiguous-scope`. Scope values are the bytes Envoy delivers, UTF-8 or not (`acme\xff` and `acme\xfe` are two tenants). Put only headers here that your auth layer sets or verifies (see [Where the filter sits](../recipes/jwt-tenants.md)); {range} names."#,
    },
    Field {
        name: "scope.authority",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(DEFAULT_SCOPE_AUTHORITY)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the request's `:authority` (Host, compared case-insensitively) is part of every record's scope: two hosts behind one listener never see each other's records. Turn off only if several host names serve one logical API and must share keys."#,
    },
    Field {
        name: "principal",
        ty: Type::Object,
        default: Shown::Text(r#"`{"header": "authorization"}`"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"which part of a request names its caller: exactly one of `principal.header`, `principal.cookie`, `principal.metadata` or `principal.none`. A record belongs to the caller that made it: a request of another caller with the same key never gets its stored response (`422 principal-mismatch`, counted in `proxy_dedup_principal_mismatch`), and in keyless mode (`key.fingerprint`) a named caller's request has a record of its own, so another caller's identical request is an operation of its own and runs. A request that names no caller (the header absent or empty) is "no caller", a caller of its own. Records keep a salted 8-byte tag of the principal, never its bytes. See [Callers](../semantics/callers.md)."#,
    },
    Field {
        name: "principal.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Json(Value::Str(DEFAULT_PRINCIPAL_HEADER)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"a request header whose bytes name the caller (`authorization`, `x-api-key`); every line of it counts, in order. With a credential that changes (a refreshed bearer token), the same client's retry with the new one is another caller: `422 principal-mismatch`, never a second execution; name a stable header or a verified claim where clients refresh tokens."#,
    },
    Field {
        name: "principal.cookie",
        ty: Type::String(Len::new(1, Some(MAX_PRINCIPAL_NAME_BYTES))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"a cookie (an RFC 6265 name of {range}, case-sensitive) of the `cookie` header whose value names the caller (a session id); a cookie sent twice counts with both values, in order."#,
    },
    Field {
        name: "principal.metadata",
        ty: Type::List(Item::String, Len::new(2, Some(MAX_METADATA_PATH))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"a value an earlier filter of the chain put in the stream's dynamic metadata: the filter's namespace, then the keys inside it, e.g. `["envoy.filters.http.jwt_authn", "jwt_payload", "sub"]` ({range} entries; jwt_authn with `payload_in_metadata: "jwt_payload"`): the verified token's subject, the same across token refreshes. Only the auth layer writes metadata, so no client can set it; a request without it (no token, an allowed missing one) names no caller."#,
    },
    Field {
        name: "principal.none",
        ty: Type::Bool,
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"`true`: records name no caller (`false` is the default source, `authorization`); any caller's request with a key gets the key's stored response, as when the key alone is the secret (an upstream that scopes keys itself, a trusted internal network). Keyed records written by named callers then answer `422 principal-mismatch` until they expire; in keyless mode a named caller's request had a record of its own, which a request naming no caller does not look for, so those requests run again (as when `key.fingerprint` changes)."#,
    },
    Field {
        name: "methods",
        ty: Type::List(Item::Method, Len::new(1, None)),
        default: Shown::Json(Value::List(&DEFAULT_METHODS)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"methods that are deduplicated; others pass untouched. The shipped Envoy templates wrap the filter in Envoy's own matching, so a request of a method no policy deduplicates (this field and the rules' `methods`) skips the filter in Envoy and never enters Wasm: it is not counted in `proxy_dedup_requests` and logs `dedup=-`. The templates take the list as `{{DEDUP_METHODS}}` (`dedupctl methods filter.json` prints it, e.g. `POST\|PATCH`); keep it in step with this field (see [the operator API](../operations/operator-api.md), "`envoy-filter`")."#,
    },
    Field {
        name: "on_duplicate",
        ty: Type::Enum(&["replay", "reject"]),
        default: Shown::Json(Value::Str("replay")),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"`"replay"` answers a completed duplicate with the stored response; `"reject"` answers `409`."#,
    },
    Field {
        name: "grpc",
        ty: Type::Enum(&["bypass", "deduplicate"]),
        default: Shown::Json(Value::Str("bypass")),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"what real gRPC requests get (HTTP/2 or HTTP/3 with a `content-type` of `application/grpc`, `+proto`, `-web`…): `"bypass"` passes them untouched (counted in `proxy_dedup_bypassed`, decision `bypassed`), even under `key.required`, because the operator chose to let gRPC by; `"deduplicate"` treats them like any other request (see [Bodies, limits](bodies-and-limits.md) for what a gRPC client then gets). A gRPC content type over HTTP/1.1 is not gRPC: it is deduplicated, and `key.required` holds."#,
    },
    Field {
        name: "on_in_flight",
        ty: Type::Enum(&["reject", "wait"]),
        default: Shown::Json(Value::Str("reject")),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"what a duplicate of a request still in flight gets: `"reject"` answers `409 in-flight` at once; `"wait"` holds it (nothing reaches the upstream) until the first request's answer, on any worker and, with etcd, any proxy (see [Wait mode](../semantics/wait-mode.md))."#,
    },
    Field {
        name: "wait_timeout_ms",
        ty: Type::IntegerUpTo(WAIT_TIMEOUT_MS),
        default: Shown::JsonNote(
            Value::Int(DEFAULT_WAIT_TIMEOUT_MS),
            "(the in-flight timeout if shorter)",
        ),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"how long a duplicate waits in `"wait"` mode before it gets `409 in-flight` (with `retry-after`) as in `"reject"` mode; {range}."#,
    },
    Field {
        name: "max_waiters",
        ty: Type::Integer(MAX_WAITERS),
        default: Shown::Json(Value::Int(DEFAULT_MAX_WAITERS)),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"most duplicates one worker holds waiting at once ({range}); above it a duplicate gets `409 in-flight` at once. Each waiter costs about 1 KiB of filter state plus the request Envoy buffers for it."#,
    },
    Field {
        name: "max_waiters_per_scope",
        ty: Type::IntegerUpTo(MAX_WAITERS_PER_SCOPE),
        default: Shown::JsonNote(
            Value::Int(DEFAULT_MAX_WAITERS_PER_SCOPE),
            "(at most half of `max_waiters`, at least 1)",
        ),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"most of those waiters of one scope (its authority, scope headers and rule) on one worker ({range}); above it that scope's duplicates get `409 in-flight` at once, while other scopes' duplicates still wait."#,
    },
    Field {
        name: "ttl_seconds",
        ty: Type::Integer(TTL_SECONDS),
        default: Shown::Json(Value::Int(DEFAULT_TTL_MS / 1000)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"how long a completed record answers duplicates ({range})."#,
    },
    Field {
        name: "in_flight_timeout_seconds",
        ty: Type::Integer(IN_FLIGHT_TIMEOUT_SECONDS),
        default: Shown::Json(Value::Int(DEFAULT_IN_FLIGHT_TIMEOUT_MS / 1000)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"how long a claim counts as running ({range}): its duplicates get `409 in-flight` meanwhile. A claim still unsettled after it (its response never came) answers `409 outcome-unknown` and, with the default `on_unknown_outcome: "keep"`, is kept until `ttl_seconds`; under `"hold"` it expires then and the key can run again. Keep the route timeout below it (see [When the outcome is unknown](../semantics/unknown-outcomes.md))."#,
    },
    Field {
        name: "on_unknown_outcome",
        ty: Type::Enum(&["keep", "hold", "release"]),
        default: Shown::Json(Value::Str("keep")),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"when the filter cannot know whether the upstream ran the request (client gone, route timeout, reset after sending), and for claims nobody settled: `"keep"` keeps the record as "outcome unknown" until `ttl_seconds` (duplicates get `409 outcome-unknown`; the key never runs again within its TTL); `"hold"` keeps it only until `in_flight_timeout_seconds` after the claim (duplicates get `409 in-flight` with the time left), then the key may run again; `"release"` releases it at the end of the stream, so a retry may run a second time (only for endpoints that are safe to repeat). Top level and per rule."#,
    },
    Field {
        name: "on_store_full",
        ty: Type::Enum(&["reject", "open"]),
        default: Shown::Json(Value::Str("reject")),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"(shared data) when a claim finds no slot (its bucket holds only live claims): `"reject"` answers `503 store-full` with `retry-after: retry_after_seconds`, so nothing runs unrecorded; `"open"` passes the request through unrecorded (counted in `proxy_dedup_failed_open`), so a retry of it may run again."#,
    },
    Field {
        name: "retry_after_seconds",
        ty: Type::Integer(RETRY_AFTER_SECONDS),
        default: Shown::Json(Value::Int(DEFAULT_RETRY_AFTER_SECONDS)),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"value of `retry-after` on the in-flight `409` while the first request is still running ({range}), but never more than the seconds left until the claim's in-flight end (its `idempotency-expires`). A held claim (outcome unknown) answers with the seconds left until it expires instead."#,
    },
    Field {
        name: "advertise_expiry",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(DEFAULT_ADVERTISE_EXPIRY)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"whether replays and `409`/`422` answers tell the client when their record stops answering: `idempotency-expires` (an HTTP date, rounded up to the second), and on a replay `age` (whole seconds since the record completed, shared data only). A header is left out when the record does not know the time. `false` sends neither (a replay then carries the stored response's own headers of those names). Top level and per rule (see [Outcomes](../semantics/outcomes.md#when-a-record-stops-answering))."#,
    },
    Field {
        name: "errors",
        ty: Type::Object,
        default: Shown::Text(r#"`{"format": "problem+json"}`"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the body of the filter's own error answers (`400`, `409`, `422`, `503`, …), so clients read them as they read the API's own errors (the `errors.*` fields below). An `errors` given in a rule replaces the top level's as a whole. The status codes and headers (`retry-after`, `idempotency-expires`, …) are the same in every format, but for Stripe's idempotency errors; replays are the stored response, untouched; the operator API always answers problem+json. See [Error bodies](../semantics/outcomes.md#error-bodies)."#,
    },
    Field {
        name: "errors.format",
        ty: Type::Enum(&["problem+json", "stripe", "template"]),
        default: Shown::Json(Value::Str("problem+json")),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"`"problem+json"`: RFC 9457, `{"type": "urn:proxy-dedup:problem:<slug>", "title", "status", "detail"}`. `"stripe"`: Stripe's shape, `{"error": {"type", "code", "message"}}` with the detail as the message, for clients on Stripe's SDKs; the idempotency problems (`in-flight`, `outcome-unknown`, `already-completed`, `response-not-stored`, `payload-mismatch`, `principal-mismatch`) answer `400` with type `idempotency_error` there, the status Stripe's own API gives them and the only one Stripe's SDKs raise their `IdempotencyError` for (see [the mapping](../semantics/outcomes.md#stripe)). `"template"`: `errors.body`, filled in."#,
    },
    Field {
        name: "errors.content_type",
        ty: Type::String(Len::new(1, Some(MAX_CONTENT_TYPE_BYTES))),
        default: Shown::Text(
            r#"`"application/problem+json"` for `"problem+json"`, `"application/json"` for `"stripe"` and `"template"`"#,
        ),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the `content-type` of an error answer ({range} visible ASCII characters), in any format (e.g. `"application/json"` for clients that refuse problem+json). With a JSON type (`application/json`, `application/*+json`) a template must render as JSON."#,
    },
    Field {
        name: "errors.body",
        ty: Type::String(Len::new(1, Some(MAX_ERROR_TEMPLATE_BYTES))),
        default: Shown::Text(r#"none (required with `"template"`)"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"with `format: "template"` only: the body ({range} bytes), where `{{status}}`, `{{type}}` (the problem's slug, `in-flight`), `{{title}}`, `{{detail}}` and `{{retry_after}}` (the `retry-after` seconds, empty without one) are written JSON-escaped, for the inside of a JSON string, and `{{status_json}}`, `{{type_json}}`, … as a whole JSON value (a quoted string; a number for `status` and `retry_after`, `null` for a missing `retry_after`). E.g. `{"code": "{{type}}", "msg": {{detail_json}}, "retry_in": {{retry_after_json}}}`. Every `{{` opens a variable; an unknown one is refused, and with a JSON `errors.content_type` so is a template that does not render as JSON for every answer."#,
    },
    Field {
        name: "capacity",
        ty: Type::Integer(CAPACITY),
        default: Shown::Json(Value::Int(DEFAULT_CAPACITY)),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"most records held ({range}). Shared-data keys stay bounded by it, stored response bytes by `store.max_store_bytes`. Size it at about twice the keys live within `ttl_seconds`: buckets fill unevenly, and a completed record evicted early (counted) lets its key run again."#,
    },
    Field {
        name: "max_body_bytes",
        ty: Type::Integer(MAX_BODY_BYTES),
        default: Shown::Json(Value::Int(DEFAULT_MAX_BODY_BYTES)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"largest request body read for the key or the payload check ({range}). Above it: `413`."#,
    },
    Field {
        name: "max_replay_body_bytes",
        ty: Type::Integer(MAX_REPLAY_BODY_BYTES),
        default: Shown::Json(Value::Int(DEFAULT_MAX_REPLAY_BODY_BYTES)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"largest response body stored ({range}; with the etcd store at most `store.max_record_bytes` − 16384). Above it the record is kept as completed without a body and duplicates get `409` (`response-not-stored`), so the operation still never runs twice. With shared data a response is also not stored when it is larger than its bucket's share of `store.max_store_bytes` (see [Memory](../operations/sizing.md))."#,
    },
    Field {
        name: "store_statuses",
        ty: Type::List(Item::Status, Len::new(1, None)),
        default: Shown::Json(Value::List(&DEFAULT_STORE_STATUSES_WRITTEN)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"statuses of **upstream** answers whose response is stored; classes (`"2xx"`), exact codes (`"409"`), and exclusions (`"!429"`, `"!4xx"`; an exclusion wins). Another status from the upstream releases the claim. 408, 425 and 429 ask the client to come back later, so by default a retry runs again. Local replies (Envoy's or another filter's) are never stored."#,
    },
    Field {
        name: "replayed_header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Json(Value::Str(DEFAULT_REPLAYED_HEADER)),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"header added (value `true`) to replayed responses."#,
    },
    Field {
        name: "failure_mode",
        ty: Type::Enum(&["open", "closed"]),
        default: Shown::Json(Value::Str("closed")),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"when the store cannot answer (etcd: it times out, errors or is unreachable after its retries within `store.timeout_ms`): `"closed"` answers `503` problem+json `urn:proxy-dedup:problem:store-unavailable` with `retry-after: retry_after_seconds`, nothing forwarded (counted in `proxy_dedup_store_errors` and `proxy_dedup_store_unavailable`), so a key that may have run never runs again; `"open"` passes the request through unrecorded (counted in `proxy_dedup_store_errors` and `proxy_dedup_failed_open`): the service stays available through a store outage, and every key that passed may run again when its client retries (through this or another proxy). Choose `"open"` only where a second execution is cheaper than a refusal."#,
    },
    Field {
        name: "request_id_preserved",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(DEFAULT_REQUEST_ID_PRESERVED)),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"`true` says Envoy's http_connection_manager keeps a client's `x-request-id` and generates none (`preserve_external_request_id: true`, `generate_request_id: false`; with tracing, also the UUID `request_id_extension`'s `pack_trace_reason: false`), so `x-request-id` may be named in `key.headers`, `scope.headers`, `principal.header` or a `header:` part of `key.fingerprint`. Without it such a configuration is refused: Envoy would put its own id there, a missing key would never be missing and every retry would be a new key. Headers Envoy always sets itself (`x-forwarded-for`, `x-forwarded-proto`, `x-envoy-external-address`, `x-envoy-internal`, `x-forwarded-client-cert`, `x-forwarded-host`, `x-forwarded-port`, `x-envoy-original-path`) are refused in `key.headers` either way. `dedupctl envoy-filter` prints the connection manager's settings."#,
    },
    Field {
        name: "payload",
        ty: Type::Object,
        default: Shown::Text(r#"see its fields"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"what the payload check (`422`) compares (the `payload.*` fields below)."#,
    },
    Field {
        name: "payload.parts",
        ty: Type::List(Item::Part, Len::new(1, None)),
        default: Shown::Text(
            r#"`["method", "path", "query", "body"]` (left out, the same parts are compared, under another payload digest: a retry across a push that writes them out gets a false `422`)"#,
        ),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"what the payload check (422) compares: any of `"method"`, `"path"`, `"query"`, `"body"`, `"header:<name>"`, each at most once. A `header:` part compares the header's bytes, a missing header differs from an empty one, and every line of a repeated header counts, in order."#,
    },
    Field {
        name: "payload.json_pointers",
        ty: Type::List(Item::String, Len::new(1, Some(MAX_PAYLOAD_POINTERS))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"compare only these fields of a JSON body (RFC 6901 pointers, {range}; a missing field differs from `null`), in canonical form (see [The canonical JSON form](../semantics/canonical-json.md)): member order, whitespace, number spelling and string escapes do not matter, values do, exactly. Needs `"body"` among the parts. A body that is not JSON is compared as sent. A body naming a member twice in one object, anywhere, gets `400 ambiguous-payload`."#,
    },
    Field {
        name: "payload.ignore_json_pointers",
        ty: Type::List(Item::String, Len::new(1, Some(MAX_PAYLOAD_POINTERS))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"compare the whole JSON body except these fields ({range} pointers; not together with `payload.json_pointers`), canonically. An array index names an element of the body as sent (`["/a/0", "/a/1"]` ignores the first two)."#,
    },
    Field {
        name: "store",
        ty: Type::Object,
        default: Shown::Text(r#"see its fields"#),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"where records live: Envoy shared data on one node, or etcd for many proxies (the `store.*` fields)."#,
    },
    Field {
        name: "store.kind",
        ty: Type::Enum(&["shared_data", "etcd"]),
        default: Shown::Json(Value::Str("shared_data")),
        applies: Applies::Store,
        group: Group::Configuration,
        meaning: r#"`"shared_data"`: Envoy shared data, one node; `"etcd"`: many proxies, see [Many proxies](../deployment/etcd.md) for its fields."#,
    },
    Field {
        name: "store.namespace",
        ty: Type::String(Len::new(1, Some(MAX_NAMESPACE_BYTES))),
        default: Shown::Json(Value::Str(DEFAULT_NAMESPACE)),
        applies: Applies::SharedData,
        group: Group::Configuration,
        meaning: r#"(shared data) prefix of the shared-data keys, {range} visible characters without `/`; plugins sharing a `vm_id` need different namespaces."#,
    },
    Field {
        name: "upstream",
        ty: Type::Object,
        default: Shown::Text(r#"see its fields"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"detached execution (the `upstream.*` fields below)."#,
    },
    Field {
        name: "upstream.detached",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(false)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"`true`: the filter sends a key's first execution upstream **itself** (a call that outlives the client's stream), so its answer is recorded even when the client has gone, and the client's retry gets the replay. See [Detached execution](../semantics/detached.md) for what this mode gives up. Top level and per rule."#,
    },
    Field {
        name: "upstream.cluster",
        ty: Type::String(Len::new(1, Some(MAX_CLUSTER_BYTES))),
        default: Shown::Text(r#"none (required with `detached`)"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the Envoy cluster the call goes to: the cluster the route would send to. {range} visible characters. An unknown cluster answers `503 upstream-unavailable` and releases the key."#,
    },
    Field {
        name: "upstream.timeout_ms",
        ty: Type::IntegerUpTo(UPSTREAM_TIMEOUT_MS),
        default: Shown::Json(Value::Int(DEFAULT_DETACHED_TIMEOUT_MS)),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the detached call's own timeout, {range} (a claim never ends while its call runs). It replaces the route timeout, which does not apply to the call."#,
    },
    Field {
        name: "upstream.client_timeout_ms",
        ty: Type::IntegerUpTo(UPSTREAM_CLIENT_TIMEOUT_MS),
        default: Shown::Text(r#"none (the client waits for the call)"#),
        applies: Applies::Policy,
        group: Group::Configuration,
        meaning: r#"the client-facing deadline of a detached execution, {range}: if the call has not answered by then, the client gets `504 still-running` and the call goes on; its answer completes the record, and the client's retry with the same key gets it. 504 rather than 202: clients and SDKs retry a 5xx (Stripe's does), while a 202 would be taken for the operation's answer. Met to within the worker's 100 ms tick."#,
    },
    Field {
        name: "ordering",
        ty: Type::Object,
        default: Shown::Text(r#"none (no ordering guard)"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"the ordering guard (the `ordering.*` fields): per entity, the highest version that completed is kept, and a request whose version is at or below it is **stale**: never forwarded, answered `409 stale-version` (or acknowledged, `ordering.on_stale`). One version of an entity is in flight at a time. Both stores: shared data (`store.max_entities`) and etcd (one key per entity under `store.prefix` + `o/`). See [Ordering](../semantics/ordering.md)."#,
    },
    Field {
        name: "ordering.enabled",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(true)),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"`false` turns the guard off (a rule's `"ordering": {"enabled": false}` turns an inherited one off; its other fields are then not needed)."#,
    },
    Field {
        name: "ordering.entity",
        ty: Type::Object,
        default: Shown::Text(r#"required"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"where the entity id is: exactly one of `header`, `json_pointer`, `parts`. Entities are scoped like records (`scope.*`, the rule's records): tenant A's entity `o1` is not tenant B's."#,
    },
    Field {
        name: "ordering.entity.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"a request header whose value is the entity id (1–255 bytes of UTF-8 without control characters; missing: `400 missing-entity`; sent twice or invalid: `400 invalid-entity`)."#,
    },
    Field {
        name: "ordering.entity.json_pointer",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"an RFC 6901 pointer into the JSON body (e.g. `/data/object/id`): a string or an integer there is the entity id (`123` and `"123"` are one entity)."#,
    },
    Field {
        name: "ordering.entity.parts",
        ty: Type::List(Item::Part, Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"request parts whose hash is the entity, like `key.fingerprint` (`["path"]`: one entity per resource path, e.g. `PUT /devices/42`)."#,
    },
    Field {
        name: "ordering.version",
        ty: Type::Object,
        default: Shown::Text(r#"required"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"where the version is: exactly one of `header`, `json_pointer`; and its `type`. Missing: `400 missing-version`; not of the type: `400 invalid-version`."#,
    },
    Field {
        name: "ordering.version.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"a request header whose value is the version (sent twice: `400 invalid-version`)."#,
    },
    Field {
        name: "ordering.version.json_pointer",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"an RFC 6901 pointer into the JSON body (e.g. `/created`). An `integer` version may be a JSON integer or a string of one; `timestamp` and `string` versions are JSON strings."#,
    },
    Field {
        name: "ordering.version.type",
        ty: Type::Enum(&["integer", "timestamp", "string"]),
        default: Shown::Json(Value::Str("integer")),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"how versions compare: `"integer"`: signed 64-bit decimal (`-5`, `0042`; no `+`, no fraction, no exponent); `"timestamp"`: RFC 3339 date-time with an offset (`2026-12-02T10:00:00.25+01:00`), compared as the instant it names (up to nanoseconds; `:60` counts as the next second); `"string"`: byte by byte (UTF-8 code point order, so `"10"` < `"9"`), 1–128 bytes. Changing the type starts a new history for every entity."#,
    },
    Field {
        name: "ordering.ttl_seconds",
        ty: Type::Integer(ORDERING_TTL_SECONDS),
        default: Shown::Json(Value::Int(DEFAULT_ORDERING_TTL_SECONDS)),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"how long an entity's applied version is kept after the completion that set it ({range}); past it any version of the entity runs again. Independent of `ttl_seconds` (how long a key is deduplicated)."#,
    },
    Field {
        name: "ordering.on_stale",
        ty: Type::Enum(&["reject", "acknowledge"]),
        default: Shown::Json(Value::Str("reject")),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"what a stale request gets: `"reject"`: `409` problem+json `stale-version` naming the applied version; `"acknowledge"`: `ordering.acknowledge_status` with `idempotent-stale: true` (and, but for 204, a JSON body `{"stale": true, "version": …, "applied_version": …}`), for senders that retry until they get a 2xx. Both carry `idempotent-applied-version`, log `dedup=stale` and count in `proxy_dedup_stale`."#,
    },
    Field {
        name: "ordering.acknowledge_status",
        ty: Type::Integer(ACKNOWLEDGE_STATUS),
        default: Shown::Json(Value::Int(DEFAULT_ACKNOWLEDGE_STATUS)),
        applies: Applies::Policy,
        group: Group::Ordering,
        meaning: r#"the status of an acknowledged stale request ({range}); only with `on_stale: "acknowledge"`."#,
    },
    Field {
        name: "rules",
        ty: Type::List(Item::Rule, Len::new(0, Some(MAX_RULES))),
        default: Shown::Json(Value::List(&[])),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"per-route policies: an ordered list ({range}); the first rule whose `match` holds gives the request its policy, the fields above are the policy of requests no rule matches. See [Per-route policies](../recipes/rules.md)."#,
    },
    Field {
        name: "role",
        ty: Type::Enum(&["data", "admin"]),
        default: Shown::Json(Value::Str("data")),
        applies: Applies::TopLevel,
        group: Group::Configuration,
        meaning: r#"`"data"` deduplicates requests; `"admin"` makes the instance answer the [operator API](../operations/operator-api.md) and nothing else (mount it only on an admin-only listener)."#,
    },
    Field {
        name: "store.max_store_bytes",
        ty: Type::Integer(MAX_STORE_BYTES),
        default: Shown::Computed(max_store_bytes_default),
        applies: Applies::SharedData,
        group: Group::Configuration,
        meaning: r#"(shared data) most bytes of stored responses held in shared data, whatever the traffic ({range}). Each of the `capacity / 16` buckets gets an equal share, which must be at least 4096 bytes; a response larger than its bucket's share is not kept (`409 response-not-stored` for its duplicates). When a bucket's share is reached, the oldest stored responses are dropped (counted in `proxy_dedup_bodies_dropped`); their keys answer `409 response-not-stored` and never run again. See [Memory](../operations/sizing.md). Not for the etcd store (its per-worker tier has its own bound)."#,
    },
    Field {
        name: "store.eviction",
        ty: Type::Enum(&["own_scope", "oldest"]),
        default: Shown::Json(Value::Str("own_scope")),
        applies: Applies::SharedData,
        group: Group::Configuration,
        meaning: r#"(shared data) which completed records a claim may evict before their TTL when its bucket is full: `"own_scope"`: only records of its own scope (authority, scope headers, rule), so another tenant's traffic never makes a key run again; when the bucket holds only other scopes' unexpired records and live claims, the request gets `503 store-full`. `"oldest"`: the oldest completed record, whatever its scope (a flood of one tenant's keys can then make another tenant's retry run again). Records written before scopes were tagged may be evicted by any scope."#,
    },
    Field {
        name: "store.scope_claims_per_bucket",
        ty: Type::Integer(SCOPE_CLAIMS_PER_BUCKET),
        default: Shown::Json(Value::Int(DEFAULT_SCOPE_CLAIMS_PER_BUCKET)),
        applies: Applies::SharedData,
        group: Group::Configuration,
        meaning: r#"(shared data) most unexpired claims (in flight, or kept as an unknown outcome) of one scope in one bucket ({range}, the bucket's ways): above it that scope's new key in that bucket gets `503 store-full`, so one tenant's hung-up or slow requests never fill a bucket another tenant needs."#,
    },
    Field {
        name: "store.max_entities",
        ty: Type::Integer(MAX_ENTITIES),
        default: Shown::Json(Value::Int(DEFAULT_MAX_ENTITIES)),
        applies: Applies::SharedData,
        group: Group::Configuration,
        meaning: r#"(shared data) most entities the ordering guard keeps ({range}), in `max_entities / 16` shared-data keys written only when some policy has `ordering`. A new entity in a full bucket takes the slot of one whose state expired, else of the one of its own scope whose applied version expires first (counted in `proxy_dedup_entities_evicted`: an older version of that entity could then run), never of one with a version in flight, nor, under the default `store.eviction: "own_scope"`, of another scope's (`503 store-full`). Changing it starts a new history for every entity."#,
    },
    Field {
        name: "rules[].name",
        ty: Type::String(Len::new(1, Some(MAX_RULE_NAME_BYTES))),
        default: Shown::Text(r#"required"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the rule's stable identity: {range} characters of `A-Z a-z 0-9 _ - .`, unique, not `default`. It is part of every record the rule writes (see [Rules](configuration.md#rules)), so **renaming a rule starts a new key space**; reordering or inserting rules does not."#,
    },
    Field {
        name: "rules[].match",
        ty: Type::Object,
        default: Shown::Text(r#"required"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"when the rule applies: every condition given holds; at least one of the `rules[].match.*` fields below (an empty `match` is refused)."#,
    },
    Field {
        name: "rules[].match.path_prefix",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the path (query cut off, compared byte for byte, case-sensitively, as Envoy hands it to filters) starts with this; must start with `/`."#,
    },
    Field {
        name: "rules[].match.path_exact",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the path (query cut off) is exactly this; not together with `path_prefix`."#,
    },
    Field {
        name: "rules[].match.methods",
        ty: Type::List(Item::Method, Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the request's method is one of these (upper case). This selects the rule; the rule's own `methods` field (below) says which of its requests are deduplicated."#,
    },
    Field {
        name: "rules[].match.authority",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the `:authority` (Host, with its port if the client sent one) equals this, case-insensitively."#,
    },
    Field {
        name: "rules[].match.header",
        ty: Type::Object,
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"`{"name": "x-route"}`: the header is present; `{"name": "x-route", "equals": "v"}`: it is sent on exactly one line, with exactly that value (a header sent twice never matches `equals`)."#,
    },
    Field {
        name: "rules[].match.header.name",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"required"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the header `rules[].match.header` is about (a request header; not a pseudo-header)."#,
    },
    Field {
        name: "rules[].match.header.equals",
        ty: Type::String(Len::new(0, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"the value the header must have, on exactly one line; left out: the header only has to be present."#,
    },
    Field {
        name: "rules[].bypass",
        ty: Type::Bool,
        default: Shown::Json(Value::Bool(false)),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"`true`: the rule's requests pass untouched (counted in `proxy_dedup_bypassed`, decision `bypassed`); a bypassed rule takes no policy fields and no `records_of`."#,
    },
    Field {
        name: "rules[].records_of",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none"#),
        applies: Applies::Rule,
        group: Group::Rules,
        meaning: r#"share the records of another rule (its `name`), or with `"default"` those of the top level, instead of having its own. The rule named must not share itself, and both must have the same `key`, `scope` and `payload` settings (else a request through one would get `422` or never meet the other's records)."#,
    },
    Field {
        name: "store.cluster",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"required, unless `store.shards` is set"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"name of the Envoy cluster with the etcd members: the store is that one etcd cluster (a map of one shard named after the cluster). Set it or `store.shards`, not both."#,
    },
    Field {
        name: "store.shards",
        ty: Type::List(Item::Shard, Len::new(1, Some(MAX_SHARDS))),
        default: Shown::Text(r#"one shard, `store.cluster`"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"the etcd clusters records are spread over ({range}), each an independent etcd cluster: `{"name": "a", "cluster": "etcd_a", "authority": "etcd_a"}` (`cluster` required; `name` defaults to the cluster, 1-64 visible ASCII characters; `authority` as `store.authority`, defaulting to the cluster; `region`, 1-64 visible ASCII characters, the region its members are in: in `store.shards`, required on every shard with `store.home` and refused without it; in a previous or next map, on every shard (the map then places by its home rule) or on none (it places over all its shards, as without regions), so that a deployment adopts or drops regions by the resharding steps). A record (and an ordering entity) lives on the shard its digest ranks highest by rendezvous hashing over the names (with regions, over its home region's shards only), so adding or removing one shard moves only the keys that must move; names and clusters are unique in a map, and a shard keeps its records while its name stays. Changing the map of a live deployment needs the [resharding procedure](../deployment/sharding.md)."#,
    },
    Field {
        name: "store.next_shards",
        ty: Type::List(Item::Shard, Len::new(1, Some(MAX_SHARDS))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"step 1 of a resharding: the map being moved to ({range}). Claims are still written under `store.shards`; one won on its shard also reads the key's shard under this map and yields to a live record there (a replay, `409` or `422`, as a duplicate there gets). A shard named in both maps must be the same cluster. Not with `store.previous_shards`."#,
    },
    Field {
        name: "store.previous_shards",
        ty: Type::List(Item::Shard, Len::new(1, Some(MAX_SHARDS))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"step 2 of a resharding: the map being moved from ({range}), kept until every key written under it is gone from etcd: the wait the configuration's log line and `dedupctl check-config` print for this step, the longest completed lease of any policy (see [the procedure, step 3](../deployment/sharding.md)). Checked like `store.next_shards`: a claim won under `store.shards` yields to a live record on the key's previous shard, so a key completed before the move is replayed, never run again."#,
    },
    Field {
        name: "store.region",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"none; required with `store.home`"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"the region this proxy runs in (1-64 visible ASCII characters), a region of `store.shards`. It places nothing (a record's home never depends on where the request landed); a claim or completion sent to another region's shard counts in that region's `proxy_dedup_remote_claims.<region>` or `proxy_dedup_remote_completions.<region>`. See [Many regions](../deployment/regions.md)."#,
    },
    Field {
        name: "store.home",
        ty: Type::Object,
        default: Shown::Text(r#"none: no regions, every shard serves every key"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"home-region records: every record lives on the shards of one region, its home, given by `header` (through `map` when set) or `default`, a function of the record's identity, never of where the request landed. Needs `store.shards`, each with its `region`, and `store.region`. A request landing elsewhere sends its claim and completion to its home region's etcd (two cross-region round trips); its duplicates, from any region, meet that record. Changing a key's home (a `map` entry, the `default`, a region added) is a re-homing: use `store.next_home`, then `store.previous_home`, as a resharding. See [Many regions](../deployment/regions.md)."#,
    },
    Field {
        name: "store.home.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"the header (or `:authority`) whose value names a record's home region, or its `map` entry. It must be one of `scope.headers`, and of every rule's (refused otherwise, `store.home.header`), so that a key's home is part of its record's identity; like any scope header it must come from a trusted source (a JWT claim copied by Envoy, a header your edge sets), or a client could give one key two homes."#,
    },
    Field {
        name: "store.home.map",
        ty: Type::Map(Len::new(1, Some(MAX_HOME_MAP))),
        default: Shown::Text(r#"none: the header's value is a region's name"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"header value → home region (`{"acme": "eu-west", "globex": "us-east"}`; {range} entries, values of 1-256 bytes, compared exactly), each region one of `store.shards`. With a map, a value not in it is homed in `default`."#,
    },
    Field {
        name: "store.home.default",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"the home region of a record whose header is absent, or names no region (without `map`) or no entry (with it); a region of `store.shards`. There is no "the region the request landed in": that would let one key be claimed in two homes."#,
    },
    Field {
        name: "store.next_home",
        ty: Type::Object,
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"step 1 of a re-homing: the home rule being moved to (`header`, `map`, `default`, as `store.home`), applied to `store.next_shards` when given, else to `store.shards`. Claims are still written under `store.home`; one won there also reads the key in its home under this rule when that is another shard, and yields to a live record there. Not with the previous map's fields."#,
    },
    Field {
        name: "store.next_home.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.header`: one of `scope.headers` (and of every rule's)."#,
    },
    Field {
        name: "store.next_home.map",
        ty: Type::Map(Len::new(1, Some(MAX_HOME_MAP))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.map` ({range} entries)."#,
    },
    Field {
        name: "store.next_home.default",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.default`, a region of the map this rule goes with."#,
    },
    Field {
        name: "store.previous_home",
        ty: Type::Object,
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"step 2 of a re-homing: the home rule being moved from (as `store.home`), applied to `store.previous_shards` when given, else to `store.shards`, kept until every record written under it has expired (the wait the configuration's log line prints, as for `store.previous_shards`). A claim won under `store.home` yields to a live record in the key's previous home, so a key completed before the move is replayed, never run again."#,
    },
    Field {
        name: "store.previous_home.header",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.header`: one of `scope.headers` (and of every rule's)."#,
    },
    Field {
        name: "store.previous_home.map",
        ty: Type::Map(Len::new(1, Some(MAX_HOME_MAP))),
        default: Shown::Text(r#"none"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.map` ({range} entries)."#,
    },
    Field {
        name: "store.previous_home.default",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text("required"),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"as `store.home.default`, a region of the map this rule goes with."#,
    },
    Field {
        name: "store.protocol",
        ty: Type::Enum(&["grpc", "json"]),
        default: Shown::Json(Value::Str("grpc")),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"`"grpc"`: etcd's gRPC API, the cluster must speak HTTP/2 to the members; `"json"`: etcd's v3 JSON gateway over an HTTP/1.1 cluster. Anything else is rejected (`store.protocol`)."#,
    },
    Field {
        name: "store.authority",
        ty: Type::String(Len::new(1, None)),
        default: Shown::Text(r#"the cluster name"#),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"`:authority` of the calls to etcd (over gRPC, passed to Envoy as a `GrpcService` when it differs from the cluster name)."#,
    },
    Field {
        name: "store.prefix",
        ty: Type::String(Len::new(1, Some(MAX_ETCD_PREFIX_BYTES))),
        default: Shown::Json(Value::Str(DEFAULT_ETCD_PREFIX)),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"etcd key prefix ({range} characters); a record's key is the prefix + hex of a SHA-256 digest of the scoped key. Values are the filter's binary records (base64 in the JSON gateway). Give two deployments sharing an etcd different prefixes."#,
    },
    Field {
        name: "store.max_record_bytes",
        ty: Type::Integer(MAX_RECORD_BYTES),
        default: Shown::Json(Value::Int(DEFAULT_MAX_RECORD_BYTES)),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"largest record value written to etcd ({range}); keep it below etcd's `--max-request-bytes` (1.5 MiB by default), with room for base64 (× 4/3) on the JSON gateway. A record above it is stored without its response."#,
    },
    Field {
        name: "store.timeout_ms",
        ty: Type::Integer(ETCD_TIMEOUT_MS),
        default: Shown::Json(Value::Int(DEFAULT_ETCD_TIMEOUT_MS)),
        applies: Applies::Etcd,
        group: Group::Etcd,
        meaning: r#"budget of one store operation, retries included ({range}). One attempt gets a third of it (at least 100 ms); an attempt refused, reset or timed out, or answered "unavailable" (no leader) or "deadline exceeded" (gRPC statuses 14 and 4; Envoy reports its own timeouts and resets of a gRPC call as 14), is retried on another member within the budget; other etcd errors are store errors at once. Keep it above etcd's leader failover time (about 2 × `--election-timeout`), so that losing any one member of three, the leader included, costs no errors."#,
    },
];

#[cfg(test)]
mod tests;
