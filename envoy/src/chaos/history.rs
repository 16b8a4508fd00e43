//! What the soak records: every request attempt as its client saw it, every
//! execution as the upstream saw it, in one vocabulary the checker reads.
//! Times are durations since the run's epoch (one process, one clock).

use crate::upstream::{Execution, UpstreamFault};
use std::time::{Duration, Instant};

/// Where a proxy keeps its records: the two etcd proxies share one store,
/// the shared-data proxy has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Domain {
    Etcd,
    SharedData,
}

/// Request header carrying the attempt's id to the upstream (not part of the
/// filter's payload hash, so retries with another id are the same request).
pub const REQUEST_ID_HEADER: &str = "x-chaos-request";
/// The scope header of the soak's filter configuration.
pub const TENANT_HEADER: &str = "x-tenant";
/// The key header (the filter's default).
pub const KEY_HEADER: &str = "idempotency-key";
/// The filter's default `key.max_length`.
pub const MAX_KEY_LENGTH: usize = 255;
/// The path whose requests the filter sends itself (`upstream.detached`, a rule):
/// the cluster configures the rule, the clients send there. Here, beside the other
/// names both share, so that neither imports the other.
pub const DETACHED_PREFIX: &str = "/detached/";
/// The path of ordered deliveries: the cluster configures an `ordering` rule on it, with
/// the entity and the version in these two request headers; the clients send there.
pub const ORDERED_PREFIX: &str = "/ordered/";
pub const ENTITY_HEADER: &str = "x-entity";
pub const VERSION_HEADER: &str = "x-version";
/// The tenant every client of a store sends its ordered deliveries as, so that the
/// clients of one store deliver versions of the same entities (entities are scoped
/// like records).
pub const ORDERED_TENANT: &str = "tenant-ordered";

/// How an attempt's key and scope headers were formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyForm {
    /// One key line, one tenant line: a well-formed request.
    Good,
    /// No key header (`key.required` → 400).
    Missing,
    /// A key longer than `key.max_length` (400).
    TooLong,
    /// The key header on two lines (400 ambiguous-key).
    RepeatedKey,
    /// The tenant header on two lines (400 ambiguous-scope).
    RepeatedTenant,
}

/// What the client got for one attempt.
#[derive(Debug, Clone)]
pub enum Outcome {
    Answered(Answer),
    /// The client stopped waiting and closed (`reset`: with a TCP reset).
    GaveUp {
        reset: bool,
    },
    /// Connection refused or cut, malformed answer: the client got nothing.
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// `idempotent-replayed: true`.
    pub replayed: bool,
    /// `order_id` of the body: the execution the answer came from.
    pub order_id: Option<u64>,
    pub body_hash: u64,
    /// The problem type's slug for a problem+json answer.
    pub problem: Option<String>,
    pub retry_after: Option<u64>,
    /// `idempotent-stale: true`: a stale request acknowledged (`on_stale: "acknowledge"`).
    pub stale: bool,
    /// `idempotent-applied-version`: the entity's applied version, on stale answers.
    pub applied_version: Option<i64>,
}

/// One request attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub client: usize,
    /// The client's operation this attempt belongs to, and its number in it.
    pub op: u64,
    pub n: u32,
    pub proxy: usize,
    pub domain: Domain,
    pub request_id: String,
    pub tenant: String,
    /// The key as sent (the first line for a repeated key); `None`: missing.
    pub key: Option<String>,
    pub form: KeyForm,
    /// `payload_hash` of method, path with query and body.
    pub payload: u64,
    pub start: Duration,
    pub end: Duration,
    /// Upstream behaviour asked for with `x-demo-*` headers (for the figures).
    pub asked: Option<&'static str>,
    /// Sent to the route the filter executes detached (`upstream.detached`).
    pub detached: bool,
    /// An ordered delivery: the entity and version it carries.
    pub ordered: Option<(String, i64)>,
    pub outcome: Outcome,
}

impl Attempt {
    pub fn answer(&self) -> Option<&Answer> {
        match &self.outcome {
            Outcome::Answered(a) => Some(a),
            _ => None,
        }
    }

    /// One line for violation reports.
    pub fn describe(&self) -> String {
        let outcome = match &self.outcome {
            Outcome::Answered(a) => format!(
                "{}{}{}{}{}",
                a.status,
                if a.replayed { " replayed" } else { "" },
                a.order_id
                    .map(|o| format!(" order {o}"))
                    .unwrap_or_default(),
                a.problem
                    .as_deref()
                    .map(|p| format!(" {p}"))
                    .unwrap_or_default(),
                match (a.stale, a.applied_version) {
                    (true, Some(v)) => format!(" stale (applied {v})"),
                    (true, None) => " stale".to_string(),
                    (false, Some(v)) => format!(" (applied {v})"),
                    (false, None) => String::new(),
                }
            ),
            Outcome::GaveUp { reset } => {
                format!("gave up ({})", if *reset { "reset" } else { "close" })
            }
            Outcome::Failed(e) => format!("failed: {e}"),
        };
        format!(
            "{} proxy {} tenant {} key {:?}{} payload {:016x} {:.3}s..{:.3}s{} -> {outcome}",
            self.request_id,
            proxy_name(self.proxy),
            self.tenant,
            self.key.as_deref().map(short),
            self.ordered
                .as_ref()
                .map(|(e, v)| format!(" entity {e} version {v}"))
                .unwrap_or_default(),
            self.payload,
            self.start.as_secs_f64(),
            self.end.as_secs_f64(),
            self.asked
                .map(|a| format!(" [asked {a}]"))
                .unwrap_or_default(),
        )
    }
}

fn short(k: &str) -> String {
    if k.len() > 24 {
        format!("{}…({} chars)", &k[..12], k.len())
    } else {
        k.to_string()
    }
}

/// Proxies by index: A and B on etcd, C on shared data.
pub fn proxy_name(i: usize) -> &'static str {
    ["A", "B", "C"].get(i).copied().unwrap_or("?")
}

/// An execution in the checker's terms.
#[derive(Debug, Clone)]
pub struct Exec {
    pub order_id: u64,
    pub arrived: Duration,
    pub head_sent: Option<Duration>,
    pub request_id: Option<String>,
    pub tenants: Vec<String>,
    pub keys: Vec<String>,
    pub payload: u64,
    pub status: u16,
    pub body_hash: u64,
    pub fault: Option<UpstreamFault>,
    /// The `x-entity` and `x-version` request headers, each sent once (the version an
    /// integer): an ordered delivery's entity and version as the upstream got them.
    pub entity: Option<String>,
    pub version: Option<i64>,
}

impl Exec {
    pub fn from_upstream(e: &Execution, epoch: Instant) -> Exec {
        let since = |t: Instant| t.saturating_duration_since(epoch);
        Exec {
            order_id: e.order_id,
            arrived: since(e.arrived),
            head_sent: e.head_sent.map(since),
            request_id: e
                .header_values(REQUEST_ID_HEADER)
                .first()
                .map(|s| s.to_string()),
            tenants: e
                .header_values(TENANT_HEADER)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            keys: e
                .header_values(KEY_HEADER)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            payload: payload_hash(&e.method, &e.target, &e.body),
            status: e.status,
            body_hash: fnv1a(&e.response_body),
            fault: e.fault,
            entity: match e.header_values(ENTITY_HEADER).as_slice() {
                [one] => Some(one.to_string()),
                _ => None,
            },
            version: match e.header_values(VERSION_HEADER).as_slice() {
                [one] => one.trim().parse().ok(),
                _ => None,
            },
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "order {} for {} tenant {:?} key {:?}{} payload {:016x} arrived {:.3}s, {} {}",
            self.order_id,
            self.request_id.as_deref().unwrap_or("?"),
            self.tenants,
            self.keys.iter().map(|k| short(k)).collect::<Vec<_>>(),
            match (&self.entity, self.version) {
                (Some(e), Some(v)) => format!(" entity {e} version {v}"),
                (Some(e), None) => format!(" entity {e} version ?"),
                _ => String::new(),
            },
            self.payload,
            self.arrived.as_secs_f64(),
            match self.fault {
                Some(UpstreamFault::Reset) => "reset before answering".to_string(),
                Some(UpstreamFault::Cut) => format!("answered {} then cut", self.status),
                None => format!("answered {}", self.status),
            },
            self.head_sent
                .map(|h| format!("at {:.3}s", h.as_secs_f64()))
                .unwrap_or_default()
        )
    }
}

/// FNV-1a, 64 bits: a stable hash of bytes within this process and across runs.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What the filter's payload check compares: method, path with query, body.
pub fn payload_hash(method: &str, target: &str, body: &[u8]) -> u64 {
    let mut all = Vec::with_capacity(method.len() + target.len() + body.len() + 2);
    all.extend_from_slice(method.as_bytes());
    all.push(b'\n');
    all.extend_from_slice(target.as_bytes());
    all.push(b'\n');
    all.extend_from_slice(body);
    fnv1a(&all)
}
