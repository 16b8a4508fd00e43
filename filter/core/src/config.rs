//! Plugin configuration: the JSON contract, parsed strictly and checked once at `on_configure`.

use crate::key::RequestHead;
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
    on_in_flight: Option<OnInFlight>,
    wait_timeout_ms: Option<u64>,
    max_waiters: Option<u64>,
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
    rules: Option<Vec<RawRule>>,
}

/// One entry of `rules`: a match, a stable name, and the policy fields it overrides.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    #[serde(rename = "match")]
    matcher: Option<RawMatch>,
    records_of: Option<String>,
    bypass: Option<bool>,
    key: Option<RawKey>,
    scope: Option<RawScope>,
    methods: Option<Vec<String>>,
    on_duplicate: Option<OnDuplicate>,
    on_in_flight: Option<OnInFlight>,
    wait_timeout_ms: Option<u64>,
    ttl_seconds: Option<u64>,
    in_flight_timeout_seconds: Option<u64>,
    max_body_bytes: Option<u64>,
    max_replay_body_bytes: Option<u64>,
    store_statuses: Option<Vec<String>>,
    payload: Option<RawPayload>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    path_prefix: Option<String>,
    path_exact: Option<String>,
    methods: Option<Vec<String>>,
    authority: Option<String>,
    header: Option<RawHeaderMatch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderMatch {
    name: String,
    equals: Option<String>,
}

/// The policy fields, at the top level or in a rule.
struct RawPolicy {
    key: Option<RawKey>,
    scope: Option<RawScope>,
    methods: Option<Vec<String>>,
    on_duplicate: Option<OnDuplicate>,
    on_in_flight: Option<OnInFlight>,
    wait_timeout_ms: Option<u64>,
    ttl_seconds: Option<u64>,
    in_flight_timeout_seconds: Option<u64>,
    max_body_bytes: Option<u64>,
    max_replay_body_bytes: Option<u64>,
    store_statuses: Option<Vec<String>>,
    payload: Option<RawPayload>,
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
    protocol: Option<String>,
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
    /// etcd's gRPC API (an HTTP/2 cluster) or its JSON gateway.
    pub protocol: crate::etcd::Protocol,
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

/// What a duplicate of a request still in flight gets.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnInFlight {
    /// Answer 409 `in-flight` at once.
    Reject,
    /// Hold the duplicate (nothing forwarded) until the first completes, then answer it
    /// as a duplicate of the completed record; 409 after `wait_timeout_ms`.
    Wait,
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

/// What one request is deduplicated by: the top-level fields, or a rule's overrides of
/// them. The stream reads every per-request setting from here, never from `Config`.
/// Header names are lower-case.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The rule that chose this policy (`None`: no rule matched, the top-level fields).
    pub rule: Option<String>,
    /// The records this policy reads and writes: its rule's name, the rule named by
    /// `records_of`, or `None` for the top-level records. Part of every record digest.
    pub records: Option<String>,
    /// Requests of this policy pass untouched.
    pub bypass: bool,
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
    pub on_in_flight: OnInFlight,
    /// How long a duplicate waits for the first (wait mode), ≤ `in_flight_timeout_ms`.
    pub wait_timeout_ms: u64,
    pub ttl_ms: u64,
    pub in_flight_timeout_ms: u64,
    pub max_body_bytes: usize,
    pub max_replay_body_bytes: usize,
    pub store_statuses: Vec<StatusRange>,
    /// What the payload check (422) compares.
    pub payload: PayloadConfig,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            rule: None,
            records: None,
            bypass: false,
            key_headers: vec!["idempotency-key".to_string()],
            json_pointer: None,
            fingerprint: Vec::new(),
            key_required: false,
            key_max_length: 255,
            scope_headers: Vec::new(),
            scope_authority: true,
            methods: vec!["POST".to_string(), "PATCH".to_string()],
            on_duplicate: OnDuplicate::Replay,
            on_in_flight: OnInFlight::Reject,
            wait_timeout_ms: DEFAULT_WAIT_TIMEOUT_MS,
            ttl_ms: 86_400_000,
            in_flight_timeout_ms: 30_000,
            max_body_bytes: 1_048_576,
            max_replay_body_bytes: 65_536,
            store_statuses: DEFAULT_STORE_STATUSES.to_vec(),
            payload: PayloadConfig::default(),
        }
    }
}

impl Policy {
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

    /// The settings that decide which records two requests meet in (key source, scope,
    /// payload check): rules that share records must agree on them.
    fn identity_differs(&self, other: &Policy) -> Option<&'static str> {
        if self.key_headers != other.key_headers
            || self.json_pointer != other.json_pointer
            || self.fingerprint != other.fingerprint
        {
            return Some("key");
        }
        if self.scope_headers != other.scope_headers
            || self.scope_authority != other.scope_authority
        {
            return Some("scope");
        }
        if self.payload != other.payload {
            return Some("payload");
        }
        None
    }
}

/// When a rule applies: every condition given holds (an empty match is refused).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleMatch {
    /// The path (query cut off) starts with this.
    pub path_prefix: Option<String>,
    /// The path (query cut off) is exactly this.
    pub path_exact: Option<String>,
    pub methods: Option<Vec<String>>,
    /// The `:authority`, compared case-insensitively (lower-case here).
    pub authority: Option<String>,
    pub header: Option<HeaderMatch>,
}

/// A request header that must be present (on exactly one line, when `equals` is set,
/// with that value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    pub name: String,
    pub equals: Option<String>,
}

/// One rule: its stable name, when it applies, and the resulting policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub matcher: RuleMatch,
    pub policy: Policy,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The top-level policy: requests no rule matches.
    pub policy: Policy,
    /// Ordered: the first rule whose match holds decides a request's policy.
    pub rules: Vec<Rule>,
    /// Most duplicates waiting at once on one worker (wait mode, every policy); above
    /// it they get 409 at once.
    pub max_waiters: usize,
    pub retry_after_seconds: u64,
    pub capacity: u64,
    pub replayed_header: String,
    pub failure_mode: FailureMode,
    pub on_unknown_outcome: OnUnknownOutcome,
    pub role: Role,
    pub namespace: String,
    pub store: StoreConfig,
    /// Budget of stored response bytes in shared data, split evenly over the buckets.
    pub max_store_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            rules: Vec::new(),
            max_waiters: DEFAULT_MAX_WAITERS as usize,
            retry_after_seconds: 1,
            capacity: 100_000,
            replayed_header: "idempotent-replayed".to_string(),
            failure_mode: FailureMode::Open,
            on_unknown_outcome: OnUnknownOutcome::Hold,
            role: Role::Data,
            namespace: "proxy-dedup".to_string(),
            store: StoreConfig::SharedData,
            max_store_bytes: store_budget(None, 100_000, 65_536).unwrap_or(DEFAULT_MAX_STORE_BYTES),
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

    /// Whether an upstream status's response is stored under the top-level policy.
    pub fn stores_status(&self, status: u16) -> bool {
        self.policy.stores_status(status)
    }

    /// The policy of a request: the first rule whose match holds, else the top level.
    /// Returns the rule's index too (`None`: the top level).
    pub fn select(&self, head: &RequestHead) -> (Option<usize>, &Policy) {
        match self.rules.iter().position(|r| r.matcher.matches(head)) {
            Some(i) => (Some(i), &self.rules[i].policy),
            None => (None, &self.policy),
        }
    }

    /// The policy at an index `select` returned (the top level when out of range).
    pub fn policy_at(&self, rule: Option<usize>) -> &Policy {
        rule.and_then(|i| self.rules.get(i))
            .map_or(&self.policy, |r| &r.policy)
    }

    /// Whether any policy (the top level or a rule) waits for in-flight duplicates.
    pub fn waits(&self) -> bool {
        self.policy.on_in_flight == OnInFlight::Wait
            || self
                .rules
                .iter()
                .any(|r| r.policy.on_in_flight == OnInFlight::Wait)
    }

    /// The longest `wait_timeout_ms` of the policies that wait (0: none waits).
    pub fn longest_wait_ms(&self) -> u64 {
        std::iter::once(&self.policy)
            .chain(self.rules.iter().map(|r| &r.policy))
            .filter(|p| p.on_in_flight == OnInFlight::Wait)
            .map(|p| p.wait_timeout_ms)
            .max()
            .unwrap_or(0)
    }

    /// The rule named `name`.
    pub fn rule_named(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }
}

impl RuleMatch {
    /// Whether every condition holds for this request.
    pub fn matches(&self, head: &RequestHead) -> bool {
        let path = head.path_only();
        self.path_prefix
            .as_ref()
            .is_none_or(|p| path.starts_with(p.as_str()))
            && self.path_exact.as_ref().is_none_or(|p| path == p)
            && self
                .methods
                .as_ref()
                .is_none_or(|m| m.contains(&head.method))
            && self
                .authority
                .as_ref()
                .is_none_or(|a| head.authority.eq_ignore_ascii_case(a))
            && self.header.as_ref().is_none_or(|h| match &h.equals {
                None => head.header_count(&h.name) > 0,
                Some(v) => head.header_count(&h.name) == 1 && head.header(&h.name) == Some(v),
            })
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
        let policy = parse_policy(
            "",
            &Policy::default(),
            RawPolicy {
                key: raw.key,
                scope: raw.scope,
                methods: raw.methods,
                on_duplicate: raw.on_duplicate,
                on_in_flight: raw.on_in_flight,
                wait_timeout_ms: raw.wait_timeout_ms,
                ttl_seconds: raw.ttl_seconds,
                in_flight_timeout_seconds: raw.in_flight_timeout_seconds,
                max_body_bytes: raw.max_body_bytes,
                max_replay_body_bytes: raw.max_replay_body_bytes,
                store_statuses: raw.store_statuses,
                payload: raw.payload,
            },
        )?;
        let retry_after_seconds =
            in_range("retry_after_seconds", raw.retry_after_seconds, 1, 0, 3600)?;
        let max_waiters = in_range(
            "max_waiters",
            raw.max_waiters,
            DEFAULT_MAX_WAITERS,
            1,
            100_000,
        )? as usize;
        let capacity = in_range("capacity", raw.capacity, 100_000, 16, 10_000_000)?;
        let replayed_header = match raw.replayed_header {
            Some(h) => header_names("replayed_header", vec![h], false)?.remove(0),
            None => d.replayed_header,
        };
        let max_store_bytes = raw.store.as_ref().and_then(|st| st.max_store_bytes);
        let (namespace, store) = match raw.store {
            Some(st) => parse_store(st)?,
            None => (d.namespace, StoreConfig::SharedData),
        };
        let rules = parse_rules(&policy, raw.rules.unwrap_or_default())?;
        let largest_replay = rules
            .iter()
            .map(|r| r.policy.max_replay_body_bytes)
            .fold(policy.max_replay_body_bytes, usize::max);
        let max_store_bytes = store_budget(max_store_bytes, capacity, largest_replay as u64)?;
        if let StoreConfig::Etcd(ec) = &store {
            check_record_room("", &policy, ec)?;
            for (i, r) in rules.iter().enumerate() {
                check_record_room(&format!("rules[{i}]."), &r.policy, ec)?;
            }
        }
        Ok(Config {
            policy,
            rules,
            max_waiters,
            retry_after_seconds,
            capacity,
            replayed_header,
            failure_mode: raw.failure_mode.unwrap_or(FailureMode::Open),
            on_unknown_outcome: raw.on_unknown_outcome.unwrap_or(OnUnknownOutcome::Hold),
            role: raw.role.unwrap_or(Role::Data),
            namespace,
            store,
            max_store_bytes,
        })
    }
}

/// `store.max_store_bytes`. By default 128 MiB, raised so that every bucket's share
/// holds one response of the largest `max_replay_body_bytes` with its headers (with the
/// defaults: 6250 buckets × 68 KiB ≈ 415 MiB), so the default never refuses a response
/// the size limits allow; and never below 4 KiB per bucket. A set value must leave every
/// bucket at least 4 KiB; below the default, responses larger than a bucket's share
/// (`max_store_bytes / (capacity / 16)`) are not kept.
fn store_budget(set: Option<u64>, capacity: u64, largest_replay: u64) -> Result<u64, ConfigError> {
    let buckets = (capacity / crate::store::WAYS as u64).max(1);
    let least = buckets * MIN_BUCKET_STORE_BYTES;
    let Some(v) = set else {
        let one_response = buckets.saturating_mul(largest_replay + STORED_HEADERS_ALLOWANCE);
        return Ok(DEFAULT_MAX_STORE_BYTES.max(least).max(one_response));
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

/// The record carries the response plus its own header: leave room for both.
fn check_record_room(prefix: &str, policy: &Policy, ec: &EtcdConfig) -> Result<(), ConfigError> {
    let room = ec.max_record_bytes.saturating_sub(RECORD_OVERHEAD_BYTES);
    let max_replay_body_bytes = policy.max_replay_body_bytes;
    if max_replay_body_bytes > room {
        return Err(err(
            &format!("{prefix}max_replay_body_bytes"),
            format!(
                "{max_replay_body_bytes} does not fit an etcd record of store.max_record_bytes {} \
                 (at most {room} with the record's own {RECORD_OVERHEAD_BYTES} bytes); \
                 lower it or raise store.max_record_bytes",
                ec.max_record_bytes
            ),
        ));
    }
    Ok(())
}

/// The policy fields under `prefix` (`""` at the top level, `rules[2].` in a rule). A
/// field left out keeps `base`'s value; an object given (`key`, `scope`, `payload`)
/// replaces `base`'s as a whole, its own missing sub-fields at their built-in defaults.
fn parse_policy(prefix: &str, base: &Policy, raw: RawPolicy) -> Result<Policy, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let d = Policy::default();
    let mut out = base.clone();
    if let Some(key) = raw.key {
        out.key_headers = match key.headers {
            Some(h) => header_names(&f("key.headers"), h, false)?,
            None => d.key_headers.clone(),
        };
        out.json_pointer = match key.json_pointer {
            Some(p) => Some(json_pointer(&f("key.json_pointer"), p)?),
            None => None,
        };
        out.fingerprint = match key.fingerprint {
            Some(parts) => parse_parts(&f("key.fingerprint"), parts)?,
            None => Vec::new(),
        };
        out.key_required = key.required.unwrap_or(false);
        out.key_max_length = in_range(&f("key.max_length"), key.max_length, 255, 1, 4096)? as usize;
    }
    if let Some(payload) = raw.payload {
        out.payload = parse_payload(prefix, payload)?;
    }
    if let Some(scope) = raw.scope {
        let scope_headers = match scope.headers {
            Some(h) => header_names_with(&f("scope.headers"), h, true, true)?,
            None => Vec::new(),
        };
        if let Some(dup) = scope_headers
            .iter()
            .enumerate()
            .find(|(i, h)| scope_headers[..*i].contains(h))
        {
            return Err(err(
                &f("scope.headers"),
                format!("`{}` is listed twice", dup.1),
            ));
        }
        out.scope_headers = scope_headers;
        out.scope_authority = scope.authority.unwrap_or(true);
    }
    if let Some(m) = raw.methods {
        out.methods = parse_methods(&f("methods"), m)?;
    }
    if let Some(o) = raw.on_duplicate {
        out.on_duplicate = o;
    }
    if let Some(o) = raw.on_in_flight {
        out.on_in_flight = o;
    }
    out.ttl_ms = in_range(
        &f("ttl_seconds"),
        raw.ttl_seconds,
        base.ttl_ms / 1000,
        1,
        31_536_000,
    )? * 1000;
    out.in_flight_timeout_ms = in_range(
        &f("in_flight_timeout_seconds"),
        raw.in_flight_timeout_seconds,
        base.in_flight_timeout_ms / 1000,
        1,
        86_400,
    )? * 1000;
    // A waiter never outlasts the claim it waits for: a wait timeout given here must
    // fit this policy's in-flight timeout; one inherited follows a shorter one down.
    let in_flight_ms = out.in_flight_timeout_ms;
    out.wait_timeout_ms = match raw.wait_timeout_ms {
        Some(ms) if ms == 0 || ms > in_flight_ms => {
            return Err(err(
                &f("wait_timeout_ms"),
                format!(
                    "{ms} is out of range 1..={in_flight_ms} (at most in_flight_timeout_seconds)"
                ),
            ))
        }
        Some(ms) => ms,
        None => base.wait_timeout_ms.min(in_flight_ms),
    };
    out.max_body_bytes = in_range(
        &f("max_body_bytes"),
        raw.max_body_bytes,
        base.max_body_bytes as u64,
        0,
        64 << 20,
    )? as usize;
    out.max_replay_body_bytes = in_range(
        &f("max_replay_body_bytes"),
        raw.max_replay_body_bytes,
        base.max_replay_body_bytes as u64,
        0,
        16 << 20,
    )? as usize;
    if let Some(list) = raw.store_statuses {
        let field = f("store_statuses");
        let ranges = list
            .iter()
            .map(|s| parse_status(&field, s))
            .collect::<Result<Vec<_>, _>>()?;
        if !ranges.iter().any(|r| !r.exclude) {
            return Err(err(
                &field,
                "must include at least one status or class (`!` entries only exclude)",
            ));
        }
        out.store_statuses = ranges;
    }
    Ok(out)
}

fn parse_methods(field: &str, m: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if m.is_empty() {
        return Err(err(field, "must list at least one method"));
    }
    for x in &m {
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(err(
                field,
                format!("`{x}` is not an upper-case HTTP method"),
            ));
        }
    }
    Ok(m)
}

/// Most rules in one configuration (each request is matched against them in order).
pub const MAX_RULES: usize = 128;

/// The records group of the top-level policy, as `records_of` names it.
pub const DEFAULT_RECORDS: &str = "default";

/// A rule name: 1-64 of `A-Z a-z 0-9 _ - .`; `default` is reserved for `records_of`.
fn rule_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

fn parse_rules(top: &Policy, raw: Vec<RawRule>) -> Result<Vec<Rule>, ConfigError> {
    if raw.len() > MAX_RULES {
        return Err(err("rules", format!("at most {MAX_RULES} rules")));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    let mut shares: Vec<Option<String>> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let prefix = format!("rules[{i}].");
        let f = |name: &str| format!("{prefix}{name}");
        let name =
            match r.name {
                None => {
                    return Err(err(
                        &f("name"),
                        "required: a stable name, part of the identity of the rule's records",
                    ))
                }
                Some(n) if n == DEFAULT_RECORDS => return Err(err(
                    &f("name"),
                    "`default` is reserved (records_of: \"default\" names the top-level records)",
                )),
                Some(n) if !rule_name_ok(&n) => {
                    return Err(err(
                        &f("name"),
                        format!("`{n}`: 1-64 characters of A-Z, a-z, 0-9, `_`, `-`, `.`"),
                    ))
                }
                Some(n) => n,
            };
        if let Some(j) = rules.iter().position(|o| o.name == name) {
            return Err(err(
                &f("name"),
                format!("`{name}` is already the name of rules[{j}]"),
            ));
        }
        let matcher = parse_match(&prefix, r.matcher)?;
        let bypass = r.bypass.unwrap_or(false);
        let policy_fields = [
            ("key", r.key.is_some()),
            ("scope", r.scope.is_some()),
            ("methods", r.methods.is_some()),
            ("on_duplicate", r.on_duplicate.is_some()),
            ("on_in_flight", r.on_in_flight.is_some()),
            ("wait_timeout_ms", r.wait_timeout_ms.is_some()),
            ("ttl_seconds", r.ttl_seconds.is_some()),
            (
                "in_flight_timeout_seconds",
                r.in_flight_timeout_seconds.is_some(),
            ),
            ("max_body_bytes", r.max_body_bytes.is_some()),
            ("max_replay_body_bytes", r.max_replay_body_bytes.is_some()),
            ("store_statuses", r.store_statuses.is_some()),
            ("payload", r.payload.is_some()),
            ("records_of", r.records_of.is_some()),
        ];
        if bypass {
            if let Some((field, _)) = policy_fields.iter().find(|(_, set)| *set) {
                return Err(err(
                    &f("bypass"),
                    format!("a bypassed rule takes no policy fields, but `{field}` is set"),
                ));
            }
        }
        let mut policy = parse_policy(
            &prefix,
            top,
            RawPolicy {
                key: r.key,
                scope: r.scope,
                methods: r.methods,
                on_duplicate: r.on_duplicate,
                on_in_flight: r.on_in_flight,
                wait_timeout_ms: r.wait_timeout_ms,
                ttl_seconds: r.ttl_seconds,
                in_flight_timeout_seconds: r.in_flight_timeout_seconds,
                max_body_bytes: r.max_body_bytes,
                max_replay_body_bytes: r.max_replay_body_bytes,
                store_statuses: r.store_statuses,
                payload: r.payload,
            },
        )?;
        policy.rule = Some(name.clone());
        policy.records = Some(name.clone());
        policy.bypass = bypass;
        shares.push(r.records_of);
        rules.push(Rule {
            name,
            matcher,
            policy,
        });
    }
    // Sharing is resolved once every name is known: a rule may name a later one.
    for i in 0..rules.len() {
        let Some(target) = shares[i].clone() else {
            continue;
        };
        let field = format!("rules[{i}].records_of");
        let other = if target == DEFAULT_RECORDS {
            top
        } else {
            match rules.iter().position(|r| r.name == target) {
                None => {
                    return Err(err(
                        &field,
                        format!("`{target}` is not the name of a rule (nor \"default\")"),
                    ))
                }
                Some(j) if j == i => return Err(err(&field, "a rule cannot name itself")),
                Some(j) if shares[j].is_some() => {
                    return Err(err(
                        &field,
                        format!(
                        "`{target}` shares another rule's records itself: name that rule instead"
                    ),
                    ))
                }
                Some(j) if rules[j].policy.bypass => {
                    return Err(err(
                        &field,
                        format!("`{target}` is bypassed: it has no records"),
                    ))
                }
                Some(j) => &rules[j].policy,
            }
        };
        if let Some(what) = rules[i].policy.identity_differs(other) {
            return Err(err(
                &field,
                format!("rules sharing records must have the same key, scope and payload settings; `{what}` differs from `{target}`'s"),
            ));
        }
        rules[i].policy.records = (target != DEFAULT_RECORDS).then_some(target);
    }
    Ok(rules)
}

fn parse_match(prefix: &str, raw: Option<RawMatch>) -> Result<RuleMatch, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let Some(m) = raw else {
        return Err(err(
            &f("match"),
            "required: when the rule applies (path_prefix, path_exact, methods, authority, header)",
        ));
    };
    let path = |field: &str, p: Option<String>| -> Result<Option<String>, ConfigError> {
        match p {
            Some(p)
                if !p.starts_with('/') || p.contains('?') || p.chars().any(char::is_control) =>
            {
                Err(err(
                    &f(field),
                    format!("`{p}` must start with '/' and have no query or control characters"),
                ))
            }
            other => Ok(other),
        }
    };
    let path_prefix = path("match.path_prefix", m.path_prefix)?;
    let path_exact = path("match.path_exact", m.path_exact)?;
    if path_prefix.is_some() && path_exact.is_some() {
        return Err(err(
            &f("match.path_exact"),
            "set either match.path_prefix or match.path_exact, not both",
        ));
    }
    let methods = match m.methods {
        Some(list) => Some(parse_methods(&f("match.methods"), list)?),
        None => None,
    };
    let authority = match m.authority {
        Some(a) if a.is_empty() || a.chars().any(|c| c.is_control() || c == ' ' || c == '/') => {
            return Err(err(&f("match.authority"), format!("`{a}` is not a host")))
        }
        other => other.map(|a| a.to_ascii_lowercase()),
    };
    let header = match m.header {
        Some(h) => {
            if !header_name_ok(&h.name, false) {
                return Err(err(
                    &f("match.header.name"),
                    format!("`{}` is not a valid header name", h.name),
                ));
            }
            if h.equals
                .as_ref()
                .is_some_and(|v| v.chars().any(char::is_control))
            {
                return Err(err(
                    &f("match.header.equals"),
                    "control characters cannot be in a header value",
                ));
            }
            Some(HeaderMatch {
                name: h.name.to_ascii_lowercase(),
                equals: h.equals,
            })
        }
        None => None,
    };
    let matcher = RuleMatch {
        path_prefix,
        path_exact,
        methods,
        authority,
        header,
    };
    if matcher == RuleMatch::default() {
        return Err(err(
            &f("match"),
            "empty: name at least one of path_prefix, path_exact, methods, authority, header \
             (the top-level fields are the policy of every request no rule matches)",
        ));
    }
    Ok(matcher)
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

fn parse_payload(prefix: &str, raw: RawPayload) -> Result<PayloadConfig, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let pointers = |field: &str, list: Vec<String>| -> Result<Vec<String>, ConfigError> {
        if list.is_empty() || list.len() > 32 {
            return Err(err(field, "must list 1 to 32 pointers"));
        }
        list.into_iter().map(|p| json_pointer(field, p)).collect()
    };
    let json = match (raw.json_pointers, raw.ignore_json_pointers) {
        (Some(_), Some(_)) => {
            return Err(err(
                &f("payload.ignore_json_pointers"),
                "set either payload.json_pointers or payload.ignore_json_pointers, not both",
            ))
        }
        (Some(only), None) => JsonSelection::Only(pointers(&f("payload.json_pointers"), only)?),
        (None, Some(ignore)) => {
            JsonSelection::Ignore(pointers(&f("payload.ignore_json_pointers"), ignore)?)
        }
        (None, None) => JsonSelection::Raw,
    };
    let parts = match raw.parts {
        Some(parts) => Some(parse_parts(&f("payload.parts"), parts)?),
        None => None,
    };
    if json != JsonSelection::Raw
        && parts
            .as_ref()
            .is_some_and(|p| !p.contains(&FingerprintPart::Body))
    {
        return Err(err(
            &f("payload.parts"),
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
        ("store.protocol", st.protocol.is_some()),
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
            let protocol = match st.protocol.as_deref() {
                None | Some("grpc") => crate::etcd::Protocol::Grpc,
                Some("json") => crate::etcd::Protocol::Json,
                Some(other) => {
                    return Err(err(
                        "store.protocol",
                        format!(
                            "`{other}` is not a known protocol (expected \"grpc\" or \"json\")"
                        ),
                    ))
                }
            };
            Ok((
                "proxy-dedup".to_string(),
                StoreConfig::Etcd(EtcdConfig {
                    cluster,
                    authority,
                    prefix,
                    timeout_ms,
                    max_record_bytes,
                    protocol,
                }),
            ))
        }
        other => Err(err(
            "store.kind",
            format!("`{other}` is not a known store (expected \"shared_data\" or \"etcd\")"),
        )),
    }
}
