//! Plugin configuration: the JSON contract, parsed strictly and checked once at `on_configure`.

mod defaults;
mod errors;
pub mod fields;
mod ordering;
mod policy;
mod raw;
mod regions;
mod rules;
mod store;
mod values;

pub use defaults::*;
pub use errors::{
    is_json, ErrorBody, ErrorFormat, Template, TemplateValues, JSON_CONTENT_TYPE,
    PROBLEM_JSON_CONTENT_TYPE,
};
pub use fields::MAX_RULES;
pub use ordering::{
    EntitySource, OnStale, Ordering, VersionSource, VersionType, MAX_ENTITY_BYTES,
    MAX_VERSION_BYTES,
};
pub use regions::{Home, HomeRule, Regions};
pub use rules::DEFAULT_RECORDS;
pub use values::PSEUDO_HEADERS;

use fields::in_range;
pub use policy::metadata_property;
use policy::parse_policy;
use raw::RawConfig;
use rules::parse_rules;
use store::parse_store;
use values::{header_name_ok, header_names, header_names_with, parse_status};

use crate::head::RequestHead;
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

/// Where records live, with the settings of that store only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Envoy shared data: one node.
    SharedData {
        /// Prefix of every shared-data key (`store.namespace`).
        namespace: String,
        /// Budget of stored response bytes, split evenly over the buckets
        /// (`store.max_store_bytes`, or its default for the capacity and replay cap).
        max_store_bytes: u64,
        /// Whose unexpired completed records a claim may evict when its bucket is full
        /// (`store.eviction`).
        eviction: Eviction,
        /// Most unexpired claims (in flight or held) of one scope in one bucket
        /// (`store.scope_claims_per_bucket`).
        scope_claims_per_bucket: u64,
        /// Most entities the ordering guard keeps (`store.max_entities`).
        max_entities: u64,
    },
    /// etcd through an Envoy cluster: many nodes.
    Etcd(EtcdConfig),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// The etcd clusters records are placed on (`store.shards`, or the one
    /// `store.cluster`): each record on one, by rendezvous hashing of its digest over
    /// the shards' names.
    pub shards: Vec<ShardConfig>,
    /// The other shard map of a resharding (`store.previous_shards` or
    /// `store.next_shards`): a claim won on its shard also reads the key's shard under
    /// that map, and yields to a live record there.
    pub check: Option<ShardCheck>,
    /// Key prefix of the records.
    pub prefix: String,
    /// Budget of one store operation, retries included.
    pub timeout_ms: u64,
    /// Largest record value written (etcd refuses requests above `--max-request-bytes`).
    pub max_record_bytes: usize,
    /// etcd's gRPC API (an HTTP/2 cluster) or its JSON gateway.
    pub protocol: Protocol,
    /// Regions (`store.region`, `store.home`): this proxy's region and the rule that
    /// gives each record its home region (`None`: every shard serves every key).
    pub regions: Option<Box<Regions>>,
}

/// One etcd cluster of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardConfig {
    /// What records are placed by (a shard keeps its records while its name stays).
    pub name: String,
    /// The Envoy cluster of its members.
    pub cluster: String,
    /// `:authority` of the calls.
    pub authority: String,
    /// The region its members are in (`shards[].region`; with `store.home` only).
    pub region: Option<String>,
}

/// The shard map checked besides `store.shards` while records move between maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardCheck {
    pub role: CheckRole,
    pub shards: Vec<ShardConfig>,
    /// The home rule under that map (`store.next_home` or `store.previous_home`, else
    /// `store.home`; `None` without regions).
    pub home: Option<HomeRule>,
}

/// Which step of a resharding the checked map stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckRole {
    /// `store.next_shards`: the map being moved to (step 1).
    Next,
    /// `store.previous_shards`: the map being moved from (step 2).
    Previous,
}

impl CheckRole {
    pub fn field(self) -> &'static str {
        match self {
            CheckRole::Next => "store.next_shards",
            CheckRole::Previous => "store.previous_shards",
        }
    }

    /// The home rule of that map (regions).
    pub fn home_field(self) -> &'static str {
        match self {
            CheckRole::Next => "store.next_home",
            CheckRole::Previous => "store.previous_home",
        }
    }
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

/// What a policy does with gRPC requests (HTTP/2 or HTTP/3 with a gRPC content type):
/// the operator's choice, never the client's.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GrpcPolicy {
    /// Pass them untouched, counted as bypassed (a gRPC status lives in trailers, which
    /// are not stored, and Envoy turns a local reply to a gRPC request into a
    /// trailers-only answer: a replay would not be the first answer).
    Bypass,
    /// Deduplicate them like any other request.
    Deduplicate,
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

/// Which completed records a claim may evict before their TTL when its bucket is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Only records of the claim's own scope (or written before scopes were tagged):
    /// another scope's traffic never makes a key run twice.
    OwnScope,
    /// The oldest completed record, whatever its scope.
    Oldest,
}

/// What a request gets when its claim finds no slot (its bucket is full of live claims).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreFull {
    /// `503 store-full` with `retry-after`: nothing runs unrecorded.
    Reject,
    /// Pass the request through unrecorded (counted in `proxy_dedup_failed_open`): a retry
    /// of it may run again.
    Open,
}

/// What happens to a claim when the filter cannot know whether the upstream executed
/// the request (client gone, route timeout, upstream reset after the request was sent).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknownOutcome {
    /// Keep the record as "outcome unknown" until `ttl_seconds`: the key never runs
    /// again within its TTL, and its duplicates get `409 outcome-unknown`.
    Keep,
    /// Keep the record in flight until `in_flight_timeout_seconds`, then let the key run
    /// again (for senders that retry until they get an answer).
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

/// `principal`: which part of a request names its caller (`crate::principal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalSource {
    /// `{"none": true}`: records name no caller (every request is "no caller").
    None,
    /// `{"header": name}`: a request header's bytes (default `authorization`).
    Header(String),
    /// `{"cookie": name}`: a cookie's value.
    Cookie(String),
    /// `{"metadata": [namespace, key, …]}`: a value an earlier filter put in the
    /// stream's dynamic metadata (jwt_authn's payload: `sub`), read as the Envoy
    /// property `property` (NUL-joined, `metadata_property`).
    Metadata { path: Vec<String>, property: String },
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
    /// Who a record belongs to: its replay goes only to requests of that caller.
    pub principal: PrincipalSource,
    pub methods: Vec<String>,
    pub on_duplicate: OnDuplicate,
    pub on_in_flight: OnInFlight,
    /// What gRPC requests get (`grpc`).
    pub grpc: GrpcPolicy,
    /// How long a duplicate waits for the first (wait mode), ≤ `in_flight_timeout_ms`.
    pub wait_timeout_ms: u64,
    pub ttl_ms: u64,
    pub in_flight_timeout_ms: u64,
    /// What a forwarded request whose outcome is unknown leaves behind.
    pub on_unknown_outcome: OnUnknownOutcome,
    pub max_body_bytes: usize,
    pub max_replay_body_bytes: usize,
    pub store_statuses: Vec<StatusRange>,
    /// What the payload check (422) compares.
    pub payload: PayloadConfig,
    /// `upstream.detached`: the first execution is sent by the filter itself (see
    /// `Detached`); `None`: the router forwards it.
    pub detached: Option<Detached>,
    /// `ordering`: the per-entity version guard (`None`: none).
    pub ordering: Option<Ordering>,
    /// `advertise_expiry`: replays and 409s carry `idempotency-expires` (and replays
    /// `age`) when their record knows the time.
    pub advertise_expiry: bool,
    /// `errors`: how this policy's error answers are written (problem+json, Stripe's
    /// shape, a template).
    pub errors: ErrorFormat,
}

/// Detached execution: the filter sends a key's first execution to `cluster` with
/// `dispatch_http_call`, from a context that outlives the stream, so the answer is
/// recorded even when the client has gone; the client is answered from that answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    pub cluster: String,
    /// The call's own timeout (below the in-flight timeout).
    pub timeout_ms: u64,
    /// When the client is answered `504 still-running` if the call has not answered yet
    /// (the call goes on); `None`: the client waits for the call.
    pub client_timeout_ms: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            rule: None,
            records: None,
            bypass: false,
            key_headers: vec![DEFAULT_KEY_HEADER.to_string()],
            json_pointer: None,
            fingerprint: Vec::new(),
            key_required: DEFAULT_KEY_REQUIRED,
            key_max_length: DEFAULT_KEY_MAX_LENGTH as usize,
            scope_headers: Vec::new(),
            scope_authority: DEFAULT_SCOPE_AUTHORITY,
            principal: PrincipalSource::Header(DEFAULT_PRINCIPAL_HEADER.to_string()),
            methods: DEFAULT_METHODS.iter().map(|m| m.to_string()).collect(),
            on_duplicate: OnDuplicate::Replay,
            on_in_flight: OnInFlight::Reject,
            grpc: DEFAULT_GRPC,
            wait_timeout_ms: DEFAULT_WAIT_TIMEOUT_MS,
            ttl_ms: DEFAULT_TTL_MS,
            in_flight_timeout_ms: DEFAULT_IN_FLIGHT_TIMEOUT_MS,
            on_unknown_outcome: DEFAULT_ON_UNKNOWN_OUTCOME,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES as usize,
            max_replay_body_bytes: DEFAULT_MAX_REPLAY_BODY_BYTES as usize,
            store_statuses: DEFAULT_STORE_STATUSES.to_vec(),
            payload: PayloadConfig::default(),
            detached: None,
            ordering: None,
            advertise_expiry: DEFAULT_ADVERTISE_EXPIRY,
            errors: ErrorFormat::default(),
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

    /// Whether this policy keeps unknown outcomes (and unsettled claims) until their TTL
    /// (`on_unknown_outcome: "keep"`, the default).
    pub fn keeps_unknown(&self) -> bool {
        self.on_unknown_outcome == OnUnknownOutcome::Keep
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
        if self.principal != other.principal {
            return Some("principal");
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
    /// Most of them of one scope (its authority and scope headers, its rule).
    pub max_waiters_per_scope: usize,
    pub retry_after_seconds: u64,
    pub capacity: u64,
    pub replayed_header: String,
    pub failure_mode: FailureMode,
    pub on_store_full: OnStoreFull,
    pub role: Role,
    pub store: StoreConfig,
    /// `request_id_preserved`: the operator says Envoy keeps a client's `x-request-id`
    /// and generates none, so it may be a key (`values::check_envoy_set_headers`).
    pub request_id_preserved: bool,
    /// The Envoy properties the glue reads at request headers for the policies'
    /// principals (`PrincipalSource::Metadata`), each once (shared: the glue takes it
    /// for every request without a copy).
    pub metadata_properties: std::sync::Arc<[String]>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            rules: Vec::new(),
            max_waiters: DEFAULT_MAX_WAITERS as usize,
            max_waiters_per_scope: DEFAULT_MAX_WAITERS_PER_SCOPE as usize,
            retry_after_seconds: DEFAULT_RETRY_AFTER_SECONDS,
            capacity: DEFAULT_CAPACITY,
            replayed_header: DEFAULT_REPLAYED_HEADER.to_string(),
            failure_mode: DEFAULT_FAILURE_MODE,
            on_store_full: DEFAULT_ON_STORE_FULL,
            role: DEFAULT_ROLE,
            store: StoreConfig::default(),
            request_id_preserved: DEFAULT_REQUEST_ID_PRESERVED,
            metadata_properties: std::sync::Arc::from(Vec::new()),
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
        let text = integral_numbers(text);
        let mut de = serde_json::Deserializer::from_str(&text);
        let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(serde_error)?;
        de.end().map_err(|e| err("(root)", e.to_string()))?;
        Config::try_from(raw)
    }

    /// The prefix of this proxy's shared-data keys: the shared-data store's records, and
    /// the wake-up board of wait mode, which lives in shared data whatever the store
    /// (with etcd, under the default namespace).
    pub fn namespace(&self) -> &str {
        self.store.namespace()
    }

    /// The shared-data store's byte budget (`None` with etcd).
    pub fn max_store_bytes(&self) -> Option<u64> {
        self.store.max_store_bytes()
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
        self.longest_wait_ms() > 0
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

    /// How the filter's error answers are written for a request of the rule named
    /// `rule` (`None`: the top level): that policy's `errors`, but problem+json from
    /// the operator API (`role: "admin"`), whatever the policies say.
    pub fn error_format(&self, rule: Option<&str>) -> Option<&ErrorFormat> {
        if self.role == Role::Admin {
            return None;
        }
        let policy = rule
            .and_then(|name| self.rule_named(name))
            .map_or(&self.policy, |r| &r.policy);
        Some(&policy.errors)
    }
}

impl RuleMatch {
    /// Whether every condition holds for this request.
    pub fn matches(&self, head: &RequestHead) -> bool {
        let path = head.path_only();
        self.path_prefix
            .as_ref()
            .is_none_or(|p| path.starts_with(p.as_bytes()))
            && self
                .path_exact
                .as_ref()
                .is_none_or(|p| path == p.as_bytes())
            && self
                .methods
                .as_ref()
                .is_none_or(|m| m.contains(&head.method))
            && self
                .authority
                .as_ref()
                .is_none_or(|a| head.authority.eq_ignore_ascii_case(a.as_bytes()))
            && self.header.as_ref().is_none_or(|h| match &h.equals {
                None => head.header_count(&h.name) > 0,
                Some(v) => {
                    head.header_count(&h.name) == 1 && head.header(&h.name) == Some(v.as_bytes())
                }
            })
    }
}

/// `text` with every number written with a fraction or an exponent that is a whole
/// number in range (`60.0`, `6e1`, `1.5e3`) written as its digits (`60`, `60`, `1500`):
/// an integer field takes what JSON Schema calls an integer (a number with no
/// fractional part, whatever its notation), so the filter and the schema
/// (`docs/config.schema.json`) agree. Exact (decimal digits, no float); a number with a
/// fraction (`1.5`), or too large for 20 digits, stays as written and is refused by the
/// field as before. Strings are left alone.
fn integral_numbers(text: &str) -> std::borrow::Cow<'_, str> {
    let b = text.as_bytes();
    let mut out: Option<String> = None;
    let (mut i, mut copied) = (0usize, 0usize);
    let mut in_string = false;
    while i < b.len() {
        let c = b[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if !(c == b'-' || c.is_ascii_digit()) {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
            i += 1;
        }
        let token = text.get(start..i).unwrap_or("");
        if let Some(digits) = whole_number(token) {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(text.get(copied..start).unwrap_or(""));
            o.push_str(&digits);
            copied = i;
        }
    }
    match out {
        Some(mut o) => {
            o.push_str(text.get(copied..).unwrap_or(""));
            std::borrow::Cow::Owned(o)
        }
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// The digits of a JSON number token with a fraction or exponent that is a whole
/// number of at most 20 digits (`None`: an integer already, not whole, or not a number).
fn whole_number(token: &str) -> Option<String> {
    let (negative, rest) = match token.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, token),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], Some(rest[at + 1..].parse::<i32>().ok()?)),
        None => (rest, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    if exponent.is_none() && frac.is_none() {
        return None;
    }
    if int.is_empty()
        || !int.bytes().all(|d| d.is_ascii_digit())
        || (int.len() > 1 && int.starts_with('0'))
    {
        return None;
    }
    let frac = frac.unwrap_or("");
    if !frac.bytes().all(|d| d.is_ascii_digit()) || (mantissa.contains('.') && frac.is_empty()) {
        return None;
    }
    // The value is `int frac` × 10^(exponent − frac's length).
    let mut digits = format!("{int}{frac}");
    let shift = exponent
        .unwrap_or(0)
        .checked_sub(i32::try_from(frac.len()).ok()?)?;
    if shift >= 0 {
        if shift > 20 {
            return None;
        }
        digits.extend(std::iter::repeat_n('0', shift as usize));
    } else {
        let cut = digits.len().checked_sub(shift.unsigned_abs() as usize)?;
        if !digits[cut..].bytes().all(|d| d == b'0') {
            return None;
        }
        digits.truncate(cut);
    }
    let digits = digits.trim_start_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    if digits.len() > 20 {
        return None;
    }
    Some(if negative && digits != "0" {
        format!("-{digits}")
    } else {
        digits.to_string()
    })
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

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(mut raw: RawConfig) -> Result<Self, ConfigError> {
        let d = Config::default();
        let policy = parse_policy("", &Policy::default(), raw.take_policy())?;
        let retry_after_seconds = fields::RETRY_AFTER_SECONDS.check(
            "retry_after_seconds",
            raw.retry_after_seconds,
            DEFAULT_RETRY_AFTER_SECONDS,
        )?;
        let max_waiters =
            fields::MAX_WAITERS.check("max_waiters", raw.max_waiters, DEFAULT_MAX_WAITERS)?
                as usize;
        let max_waiters_per_scope = in_range(
            "max_waiters_per_scope",
            raw.max_waiters_per_scope,
            default_max_waiters_per_scope(max_waiters as u64),
            fields::MAX_WAITERS_PER_SCOPE.min,
            fields::MAX_WAITERS_PER_SCOPE.max(max_waiters as u64),
        )? as usize;
        let capacity = fields::CAPACITY.check("capacity", raw.capacity, DEFAULT_CAPACITY)?;
        let replayed_header = match raw.replayed_header {
            Some(h) => header_names("replayed_header", vec![h], false)?.remove(0),
            None => d.replayed_header,
        };
        let rules = parse_rules(&policy, raw.rules.unwrap_or_default())?;
        let largest_replay = rules
            .iter()
            .map(|r| r.policy.max_replay_body_bytes)
            .fold(policy.max_replay_body_bytes, usize::max);
        let store = parse_store(
            raw.store.unwrap_or_default(),
            capacity,
            largest_replay as u64,
        )?;
        store.check_record_room(&policy, &rules)?;
        if let StoreConfig::Etcd(ec) = &store {
            let scopes = std::iter::once((String::new(), policy.scope_headers.as_slice())).chain(
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (format!("rules[{i}]."), r.policy.scope_headers.as_slice())),
            );
            regions::check_home_in_scope(ec, scopes)?;
        }
        let request_id_preserved = raw
            .request_id_preserved
            .unwrap_or(DEFAULT_REQUEST_ID_PRESERVED);
        for (prefix, p) in std::iter::once((String::new(), &policy)).chain(
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("rules[{i}]."), &r.policy)),
        ) {
            values::check_envoy_set_headers(&prefix, p, request_id_preserved)?;
        }
        let mut metadata_properties: Vec<String> = Vec::new();
        for p in std::iter::once(&policy).chain(rules.iter().map(|r| &r.policy)) {
            if let PrincipalSource::Metadata { property, .. } = &p.principal {
                if !metadata_properties.contains(property) {
                    metadata_properties.push(property.clone());
                }
            }
        }
        Ok(Config {
            request_id_preserved,
            metadata_properties: metadata_properties.into(),
            policy,
            rules,
            max_waiters,
            max_waiters_per_scope,
            retry_after_seconds,
            capacity,
            replayed_header,
            failure_mode: raw.failure_mode.unwrap_or(DEFAULT_FAILURE_MODE),
            on_store_full: raw.on_store_full.unwrap_or(DEFAULT_ON_STORE_FULL),
            role: raw.role.unwrap_or(DEFAULT_ROLE),
            store,
        })
    }
}

/// Which JSON fields of the body count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JsonSelection {
    /// The body as sent, byte for byte.
    #[default]
    Raw,
    /// Only these pointers' values (absent ones count as absent).
    Only(Vec<String>),
    /// The whole document without these pointers' values.
    Ignore(Vec<String>),
}

/// The payload check's settings; the default is the check of v1 (method, path with
/// query, raw body).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PayloadConfig {
    /// `None`: the default parts.
    pub parts: Option<Vec<FingerprintPart>>,
    pub json: JsonSelection,
}

impl PayloadConfig {
    /// Whether the raw body is all the check needs (then it is hashed as it is).
    pub fn is_default(&self) -> bool {
        self.parts.is_none() && self.json == JsonSelection::Raw
    }
}

/// How the filter talks to etcd (`store.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// etcd's v3 gRPC API through `proxy_grpc_call` (an HTTP/2 cluster).
    #[default]
    Grpc,
    /// etcd's v3 JSON gateway through `proxy_http_call`.
    Json,
}

#[cfg(test)]
mod tests;
