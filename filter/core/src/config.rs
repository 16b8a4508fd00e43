//! Plugin configuration: the JSON contract, parsed strictly and checked once at `on_configure`.

use crate::payload::{JsonSelection, PayloadConfig};
use serde::Deserialize;
use std::fmt;

/// A configuration error: the dotted path of the offending field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: field `{}`: {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        reason: reason.into(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    key: Option<RawKey>,
    scope: Option<RawScope>,
    methods: Option<Vec<String>>,
    on_duplicate: Option<OnDuplicate>,
    ttl_seconds: Option<u64>,
    in_flight_timeout_seconds: Option<u64>,
    retry_after_seconds: Option<u64>,
    capacity: Option<u64>,
    max_body_bytes: Option<u64>,
    max_replay_body_bytes: Option<u64>,
    store_statuses: Option<Vec<String>>,
    replayed_header: Option<String>,
    failure_mode: Option<FailureMode>,
    on_unknown_outcome: Option<OnUnknownOutcome>,
    payload: Option<RawPayload>,
    role: Option<Role>,
    store: Option<RawStore>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPayload {
    parts: Option<Vec<String>>,
    json_pointers: Option<Vec<String>>,
    ignore_json_pointers: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawKey {
    headers: Option<Vec<String>>,
    json_pointer: Option<String>,
    fingerprint: Option<Vec<String>>,
    required: Option<bool>,
    max_length: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawScope {
    headers: Option<Vec<String>>,
    authority: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Option<String>,
    namespace: Option<String>,
    cluster: Option<String>,
    authority: Option<String>,
    prefix: Option<String>,
    timeout_ms: Option<u64>,
    max_record_bytes: Option<u64>,
    max_store_bytes: Option<u64>,
}

/// Where records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Envoy shared data: one node.
    SharedData,
    /// etcd through an Envoy cluster: many nodes.
    Etcd(EtcdConfig),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Envoy cluster with the etcd members.
    pub cluster: String,
    /// `:authority` of the calls.
    pub authority: String,
    /// Key prefix of the records.
    pub prefix: String,
    /// Budget of one store operation, retries included.
    pub timeout_ms: u64,
    /// Largest record value written (etcd refuses requests above `--max-request-bytes`).
    pub max_record_bytes: usize,
}

/// What a completed duplicate gets.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnDuplicate {
    /// Replay the stored response.
    Replay,
    /// Answer 409 `already-completed`.
    Reject,
}

/// What to do when the store cannot answer.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Pass the request through, counted.
    Open,
    /// Answer 503 `store-unavailable`.
    Closed,
}

/// What a filter instance does with requests.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Deduplicate requests.
    Data,
    /// Serve the operator API (records, stats) and nothing else.
    Admin,
}

/// What happens to a claim when the filter cannot know whether the upstream executed
/// the request (client gone, route timeout, upstream reset after the request was sent).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknownOutcome {
    /// Keep the record in flight until `in_flight_timeout_seconds`: the key never runs
    /// twice on a guess.
    Hold,
    /// Release the claim at the end of the stream (a retry executes again).
    Release,
}

/// One part of a keyless fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintPart {
    Method,
    Path,
    Query,
    Body,
    Header(String),
}

/// A range of upstream statuses whose responses are stored (or, with `exclude`, are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    pub low: u16,
    pub high: u16,
    pub exclude: bool,
}

impl StatusRange {
    const fn new(low: u16, high: u16, exclude: bool) -> Self {
        StatusRange { low, high, exclude }
    }

    fn contains(&self, status: u16) -> bool {
        status >= self.low && status <= self.high
    }
}

/// Statuses stored by default: 2xx, 3xx and 4xx except those that tell the client to
/// come back later (408 Request Timeout, 425 Too Early, 429 Too Many Requests): a retry
/// of those must be able to execute.
pub const DEFAULT_STORE_STATUSES: [StatusRange; 4] = [
    StatusRange::new(200, 499, false),
    StatusRange::new(408, 408, true),
    StatusRange::new(425, 425, true),
    StatusRange::new(429, 429, true),
];

/// Default largest etcd record value: below etcd's default `--max-request-bytes`
/// (1.5 MiB) once base64-encoded in the JSON gateway's request.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 20;

/// Room a record needs besides the response body: its header, the stored response's
/// status and framing, and a typical set of response headers. A record above
/// `store.max_record_bytes` at completion (very large headers) is kept without its
/// response instead.
pub const RECORD_OVERHEAD_BYTES: usize = 16 << 10;

/// Default byte budget of stored responses in shared data (`store.max_store_bytes`).
pub const DEFAULT_MAX_STORE_BYTES: u64 = 128 << 20;
/// The least share of `store.max_store_bytes` a bucket of 16 records may get: below it
/// hardly a response would be kept. The default grows to it for very large `capacity`.
pub const MIN_BUCKET_STORE_BYTES: u64 = 4096;

/// The validated configuration. Header names are lower-case.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub key_headers: Vec<String>,
    pub json_pointer: Option<String>,
    pub fingerprint: Vec<FingerprintPart>,
    pub key_required: bool,
    pub key_max_length: usize,
    pub scope_headers: Vec<String>,
    /// Whether `:authority` is part of every record's scope.
    pub scope_authority: bool,
    pub methods: Vec<String>,
    pub on_duplicate: OnDuplicate,
    pub ttl_ms: u64,
    pub in_flight_timeout_ms: u64,
    pub retry_after_seconds: u64,
    pub capacity: u64,
    pub max_body_bytes: usize,
    pub max_replay_body_bytes: usize,
    pub store_statuses: Vec<StatusRange>,
    pub replayed_header: String,
    pub failure_mode: FailureMode,
    pub on_unknown_outcome: OnUnknownOutcome,
    /// What the payload check (422) compares.
    pub payload: PayloadConfig,
    pub role: Role,
    pub namespace: String,
    pub store: StoreConfig,
    /// Budget of stored response bytes in shared data, split evenly over the buckets.
    pub max_store_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            key_headers: vec!["idempotency-key".to_string()],
            json_pointer: None,
            fingerprint: Vec::new(),
            key_required: false,
            key_max_length: 255,
            scope_headers: Vec::new(),
            scope_authority: true,
            methods: vec!["POST".to_string(), "PATCH".to_string()],
            on_duplicate: OnDuplicate::Replay,
            ttl_ms: 86_400_000,
            in_flight_timeout_ms: 30_000,
            retry_after_seconds: 1,
            capacity: 100_000,
            max_body_bytes: 1_048_576,
            max_replay_body_bytes: 65_536,
            store_statuses: DEFAULT_STORE_STATUSES.to_vec(),
            replayed_header: "idempotent-replayed".to_string(),
            failure_mode: FailureMode::Open,
            on_unknown_outcome: OnUnknownOutcome::Hold,
            payload: PayloadConfig::default(),
            role: Role::Data,
            namespace: "proxy-dedup".to_string(),
            store: StoreConfig::SharedData,
            max_store_bytes: DEFAULT_MAX_STORE_BYTES,
        }
    }
}

impl Config {
    /// Parses and validates the plugin configuration. Empty input means all defaults.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|_| err("(root)", "not UTF-8"))?;
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        if !text.trim_start().starts_with('{') {
            return Err(err("(root)", "the configuration must be a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(serde_error)?;
        de.end().map_err(|e| err("(root)", e.to_string()))?;
        Config::try_from(raw)
    }

    /// Whether an upstream status's response is stored (otherwise the claim is released).
    /// Listed ranges include, `!` entries exclude (an exclusion wins).
    pub fn stores_status(&self, status: u16) -> bool {
        let mut included = false;
        for r in self.store_statuses.iter().filter(|r| r.contains(status)) {
            if r.exclude {
                return false;
            }
            included = true;
        }
        included
    }

    /// Whether requests with this method are deduplicated.
    pub fn dedups_method(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == method)
    }
}

/// Turns a serde error into a field-naming error, e.g. `key.max_length`.
fn serde_error(e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let mut reason = inner.to_string();
    if reason.starts_with("unknown field") {
        // serde's text lists every expected field; the path already names the bad one.
        if let Some(cut) = reason.find(", expected") {
            reason.truncate(cut);
        }
    }
    if let Some(at) = reason.find(" at line ") {
        reason.truncate(at);
    }
    let field = if path == "." || path == "?" {
        "(root)".to_string()
    } else {
        path
    };
    err(&field, reason)
}

/// Pseudo-headers that may be named where request headers are named (scope, fingerprint).
pub const PSEUDO_HEADERS: [&str; 3] = [":authority", ":path", ":method"];

/// A request header name, or one of `PSEUDO_HEADERS` when `pseudo` allows it.
fn header_name_ok(name: &str, pseudo: bool) -> bool {
    let lower = name.to_ascii_lowercase();
    (!name.is_empty() && name.bytes().all(is_token_byte))
        || (pseudo && PSEUDO_HEADERS.contains(&lower.as_str()))
}

fn header_names(
    field: &str,
    names: Vec<String>,
    allow_empty: bool,
) -> Result<Vec<String>, ConfigError> {
    header_names_with(field, names, allow_empty, false)
}

fn header_names_with(
    field: &str,
    names: Vec<String>,
    allow_empty: bool,
    pseudo: bool,
) -> Result<Vec<String>, ConfigError> {
    if !allow_empty && names.is_empty() {
        return Err(err(field, "must list at least one header"));
    }
    if names.len() > 16 {
        return Err(err(field, "at most 16 headers"));
    }
    names
        .into_iter()
        .map(|n| {
            if !header_name_ok(&n, pseudo) {
                let also = if pseudo {
                    " (pseudo-headers allowed: :authority, :path, :method)"
                } else {
                    ""
                };
                Err(err(
                    field,
                    format!("`{n}` is not a valid header name{also}"),
                ))
            } else {
                Ok(n.to_ascii_lowercase())
            }
        })
        .collect()
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn in_range(
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

fn parse_status(field: &str, entry: &str) -> Result<StatusRange, ConfigError> {
    let (exclude, s) = match entry.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, entry),
    };
    let bad = || {
        err(
            field,
            format!("`{entry}` is neither a status class like \"2xx\" nor a code 100..=599 (a leading `!` excludes)"),
        )
    };
    if s.len() == 3 && s.ends_with("xx") {
        let class = s[..1].parse::<u16>().map_err(|_| bad())?;
        if !(1..=5).contains(&class) {
            return Err(bad());
        }
        return Ok(StatusRange::new(class * 100, class * 100 + 99, exclude));
    }
    let code = s.parse::<u16>().map_err(|_| bad())?;
    if !(100..=599).contains(&code) {
        return Err(bad());
    }
    Ok(StatusRange::new(code, code, exclude))
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let d = Config::default();
        let key = raw.key.unwrap_or_default();
        let key_headers = match key.headers {
            Some(h) => header_names("key.headers", h, false)?,
            None => d.key_headers,
        };
        let json_pointer = match key.json_pointer {
            Some(p) => Some(json_pointer("key.json_pointer", p)?),
            None => None,
        };
        let fingerprint = match key.fingerprint {
            Some(parts) => parse_parts("key.fingerprint", parts)?,
            None => Vec::new(),
        };
        let payload = parse_payload(raw.payload.unwrap_or_default())?;
        let key_max_length = in_range("key.max_length", key.max_length, 255, 1, 4096)? as usize;
        let scope = raw.scope.unwrap_or_default();
        let scope_headers = match scope.headers {
            Some(h) => header_names_with("scope.headers", h, true, true)?,
            None => Vec::new(),
        };
        if let Some(dup) = scope_headers
            .iter()
            .enumerate()
            .find(|(i, h)| scope_headers[..*i].contains(h))
        {
            return Err(err("scope.headers", format!("`{}` is listed twice", dup.1)));
        }
        let methods = match raw.methods {
            Some(m) => {
                if m.is_empty() {
                    return Err(err("methods", "must list at least one method"));
                }
                for x in &m {
                    if x.is_empty() || !x.bytes().all(|b| b.is_ascii_uppercase()) {
                        return Err(err(
                            "methods",
                            format!("`{x}` is not an upper-case HTTP method"),
                        ));
                    }
                }
                m
            }
            None => d.methods,
        };
        let ttl_s = in_range("ttl_seconds", raw.ttl_seconds, 86_400, 1, 31_536_000)?;
        let in_flight_s = in_range(
            "in_flight_timeout_seconds",
            raw.in_flight_timeout_seconds,
            30,
            1,
            86_400,
        )?;
        let retry_after_seconds =
            in_range("retry_after_seconds", raw.retry_after_seconds, 1, 0, 3600)?;
        let capacity = in_range("capacity", raw.capacity, 100_000, 16, 10_000_000)?;
        let max_body_bytes =
            in_range("max_body_bytes", raw.max_body_bytes, 1_048_576, 0, 64 << 20)? as usize;
        let max_replay_body_bytes = in_range(
            "max_replay_body_bytes",
            raw.max_replay_body_bytes,
            65_536,
            0,
            16 << 20,
        )? as usize;
        let store_statuses = match raw.store_statuses {
            Some(list) => {
                let ranges = list
                    .iter()
                    .map(|s| parse_status("store_statuses", s))
                    .collect::<Result<Vec<_>, _>>()?;
                if !ranges.iter().any(|r| !r.exclude) {
                    return Err(err(
                        "store_statuses",
                        "must include at least one status or class (`!` entries only exclude)",
                    ));
                }
                ranges
            }
            None => d.store_statuses,
        };
        let replayed_header = match raw.replayed_header {
            Some(h) => header_names("replayed_header", vec![h], false)?.remove(0),
            None => d.replayed_header,
        };
        let max_store_bytes = raw.store.as_ref().and_then(|st| st.max_store_bytes);
        let (namespace, store) = match raw.store {
            Some(st) => parse_store(st)?,
            None => (d.namespace, StoreConfig::SharedData),
        };
        let max_store_bytes = store_budget(max_store_bytes, capacity)?;
        if let StoreConfig::Etcd(ec) = &store {
            // The record carries the response plus its own header: leave room for both.
            let room = ec.max_record_bytes.saturating_sub(RECORD_OVERHEAD_BYTES);
            if max_replay_body_bytes > room {
                return Err(err(
                    "max_replay_body_bytes",
                    format!(
                        "{max_replay_body_bytes} does not fit an etcd record of store.max_record_bytes {} \
                         (at most {room} with the record's own {RECORD_OVERHEAD_BYTES} bytes); \
                         lower it or raise store.max_record_bytes",
                        ec.max_record_bytes
                    ),
                ));
            }
        }
        Ok(Config {
            key_headers,
            json_pointer,
            fingerprint,
            key_required: key.required.unwrap_or(false),
            key_max_length,
            scope_headers,
            scope_authority: scope.authority.unwrap_or(true),
            methods,
            on_duplicate: raw.on_duplicate.unwrap_or(OnDuplicate::Replay),
            ttl_ms: ttl_s * 1000,
            in_flight_timeout_ms: in_flight_s * 1000,
            retry_after_seconds,
            capacity,
            max_body_bytes,
            max_replay_body_bytes,
            store_statuses,
            replayed_header,
            failure_mode: raw.failure_mode.unwrap_or(FailureMode::Open),
            on_unknown_outcome: raw.on_unknown_outcome.unwrap_or(OnUnknownOutcome::Hold),
            payload,
            role: raw.role.unwrap_or(Role::Data),
            namespace,
            store,
            max_store_bytes,
        })
    }
}

/// `store.max_store_bytes`: 128 MiB by default, or 4 KiB per bucket when `capacity` has
/// more buckets than that covers. A set value must leave every bucket at least 4 KiB.
fn store_budget(set: Option<u64>, capacity: u64) -> Result<u64, ConfigError> {
    let buckets = (capacity / crate::store::WAYS as u64).max(1);
    let least = buckets * MIN_BUCKET_STORE_BYTES;
    let Some(v) = set else {
        return Ok(DEFAULT_MAX_STORE_BYTES.max(least));
    };
    let v = in_range("store.max_store_bytes", Some(v), 0, 1 << 20, 1 << 40)?;
    if v < least {
        return Err(err(
            "store.max_store_bytes",
            format!(
                "{v} leaves each of the {buckets} buckets (capacity {capacity} / 16) {} bytes; \
                 at least {MIN_BUCKET_STORE_BYTES} per bucket ({least} in all) are needed: \
                 raise it or lower capacity",
                v / buckets
            ),
        ));
    }
    Ok(v)
}

/// An RFC 6901 pointer into a JSON body, checked.
fn json_pointer(field: &str, p: String) -> Result<String, ConfigError> {
    if p.is_empty() || !p.starts_with('/') {
        return Err(err(
            field,
            format!("`{p}` is not an RFC 6901 pointer (must start with '/')"),
        ));
    }
    if let Some(bad) = invalid_escape(&p) {
        return Err(err(
            field,
            format!("`{p}` has an invalid escape `~{bad}` (only ~0 and ~1)"),
        ));
    }
    Ok(p)
}

/// Parts of a request (keyless fingerprint, payload check), at least one, none twice.
fn parse_parts(field: &str, parts: Vec<String>) -> Result<Vec<FingerprintPart>, ConfigError> {
    if parts.is_empty() {
        return Err(err(field, "must list at least one part"));
    }
    let mut out = Vec::new();
    for p in parts {
        let part = match p.as_str() {
            "method" => FingerprintPart::Method,
            "path" => FingerprintPart::Path,
            "query" => FingerprintPart::Query,
            "body" => FingerprintPart::Body,
            other => match other.strip_prefix("header:") {
                Some(h) if header_name_ok(h, true) => FingerprintPart::Header(h.to_ascii_lowercase()),
                _ => {
                    return Err(err(
                        field,
                        format!("`{other}`: expected \"method\", \"path\", \"query\", \"body\" or \"header:<name>\" (a header or :authority, :path, :method)"),
                    ))
                }
            },
        };
        if out.contains(&part) {
            return Err(err(field, format!("`{p}` is listed twice")));
        }
        out.push(part);
    }
    Ok(out)
}

fn parse_payload(raw: RawPayload) -> Result<PayloadConfig, ConfigError> {
    let pointers = |field: &str, list: Vec<String>| -> Result<Vec<String>, ConfigError> {
        if list.is_empty() || list.len() > 32 {
            return Err(err(field, "must list 1 to 32 pointers"));
        }
        list.into_iter().map(|p| json_pointer(field, p)).collect()
    };
    let json = match (raw.json_pointers, raw.ignore_json_pointers) {
        (Some(_), Some(_)) => {
            return Err(err(
                "payload.ignore_json_pointers",
                "set either payload.json_pointers or payload.ignore_json_pointers, not both",
            ))
        }
        (Some(only), None) => JsonSelection::Only(pointers("payload.json_pointers", only)?),
        (None, Some(ignore)) => {
            JsonSelection::Ignore(pointers("payload.ignore_json_pointers", ignore)?)
        }
        (None, None) => JsonSelection::Raw,
    };
    let parts = match raw.parts {
        Some(parts) => Some(parse_parts("payload.parts", parts)?),
        None => None,
    };
    if json != JsonSelection::Raw
        && parts
            .as_ref()
            .is_some_and(|p| !p.contains(&FingerprintPart::Body))
    {
        return Err(err(
            "payload.parts",
            "JSON pointers select fields of the body: list \"body\" among the parts",
        ));
    }
    Ok(PayloadConfig { parts, json })
}

/// Returns the character after a `~` that is not `0` or `1`, if any.
fn invalid_escape(p: &str) -> Option<String> {
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') | Some('1') => {}
                Some(o) => return Some(o.to_string()),
                None => return Some(String::new()),
            }
        }
    }
    None
}

fn parse_store(st: RawStore) -> Result<(String, StoreConfig), ConfigError> {
    let kind = st.kind.as_deref().unwrap_or("shared_data");
    let etcd_only = [
        ("store.cluster", st.cluster.is_some()),
        ("store.authority", st.authority.is_some()),
        ("store.prefix", st.prefix.is_some()),
        ("store.timeout_ms", st.timeout_ms.is_some()),
        ("store.max_record_bytes", st.max_record_bytes.is_some()),
    ];
    match kind {
        "shared_data" => {
            if let Some((field, _)) = etcd_only.iter().find(|(_, set)| *set) {
                return Err(err(field, "only applies to store.kind \"etcd\""));
            }
            let namespace = match st.namespace {
                Some(ns) => {
                    if ns.is_empty()
                        || ns.len() > 64
                        || !ns.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
                    {
                        return Err(err(
                            "store.namespace",
                            "1-64 visible ASCII characters without '/'",
                        ));
                    }
                    ns
                }
                None => "proxy-dedup".to_string(),
            };
            Ok((namespace, StoreConfig::SharedData))
        }
        "etcd" => {
            if st.max_store_bytes.is_some() {
                return Err(err(
                    "store.max_store_bytes",
                    "only applies to store.kind \"shared_data\" (the etcd store's local tier has its own bound)",
                ));
            }
            if st.namespace.is_some() {
                return Err(err(
                    "store.namespace",
                    "only applies to store.kind \"shared_data\" (etcd uses store.prefix)",
                ));
            }
            let cluster =
                match st.cluster {
                    Some(c) if !c.is_empty() => c,
                    Some(_) => return Err(err("store.cluster", "must not be empty")),
                    None => return Err(err(
                        "store.cluster",
                        "required for store.kind \"etcd\": the Envoy cluster of the etcd members",
                    )),
                };
            let authority = st.authority.unwrap_or_else(|| cluster.clone());
            if authority.is_empty() || authority.chars().any(|c| c.is_control() || c == ' ') {
                return Err(err("store.authority", "must be a host name"));
            }
            let prefix = st.prefix.unwrap_or_else(|| "proxy-dedup/".to_string());
            if prefix.is_empty() || prefix.len() > 128 || prefix.chars().any(char::is_control) {
                return Err(err(
                    "store.prefix",
                    "1-128 characters, no control characters",
                ));
            }
            let timeout_ms = in_range("store.timeout_ms", st.timeout_ms, 3000, 10, 60_000)?;
            let max_record_bytes = in_range(
                "store.max_record_bytes",
                st.max_record_bytes,
                DEFAULT_MAX_RECORD_BYTES,
                4096,
                64 << 20,
            )? as usize;
            Ok((
                "proxy-dedup".to_string(),
                StoreConfig::Etcd(EtcdConfig {
                    cluster,
                    authority,
                    prefix,
                    timeout_ms,
                    max_record_bytes,
                }),
            ))
        }
        other => Err(err(
            "store.kind",
            format!("`{other}` is not a known store (expected \"shared_data\" or \"etcd\")"),
        )),
    }
}
