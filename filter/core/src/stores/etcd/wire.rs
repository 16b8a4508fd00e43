//! The distributed store: records in etcd, reached through Envoy over etcd's v3 gRPC API
//! (`store.protocol: "grpc"`, the default; messages in `etcdpb`) or its JSON gateway
//! (`"json"`). This module builds the requests and reads the answers in either protocol;
//! `stream` drives them and sees only `EtcdAnswer`.
//!
//! - claim: one txn, `CREATE(key) == 0` → put the in-flight record with a lease; on
//!   failure the same txn returns the existing record (range), so a duplicate learns the
//!   state, and a completed record's stored response, in the same round trip.
//! - takeover of a record that expired logically before its lease: txn on `MOD == seen`.
//! - completion: txn `MOD == claim revision` → put the completed record (response inside).
//! - release: txn `MOD == claim revision` → delete.
//!
//! Leases are shared, not one per request: each worker keeps one lease per purpose and
//! time window, and attaches it to every record created in that window (see `LeaseCache`).

use crate::key::Digest;
use crate::record::RecordState;
use crate::response::StoredResponse;
use crate::stores::etcd::pb as etcdpb;
use crate::wire::{Reader, Writer};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

pub const TXN_PATH: &str = "/v3/kv/txn";
pub const LEASE_GRANT_PATH: &str = "/v3/lease/grant";
pub const RANGE_PATH: &str = "/v3/kv/range";

pub use crate::config::Protocol;

impl Protocol {
    pub fn txn_path(self) -> &'static str {
        match self {
            Protocol::Grpc => etcdpb::TXN,
            Protocol::Json => TXN_PATH,
        }
    }

    pub fn lease_grant_path(self) -> &'static str {
        match self {
            Protocol::Grpc => etcdpb::LEASE_GRANT,
            Protocol::Json => LEASE_GRANT_PATH,
        }
    }

    pub fn range_path(self) -> &'static str {
        match self {
            Protocol::Grpc => etcdpb::RANGE,
            Protocol::Json => RANGE_PATH,
        }
    }

    /// Claim: create the record if absent, else return the existing one.
    pub fn claim_txn(self, key: &str, value: &[u8], lease: i64) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::claim_txn(key, value, lease),
            Protocol::Json => claim_txn(key, value, lease),
        }
    }

    /// Replace the record at `mod_revision`, else return the current one.
    pub fn replace_txn(self, key: &str, mod_revision: i64, value: &[u8], lease: i64) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::replace_txn(key, mod_revision, value, lease),
            Protocol::Json => replace_txn(key, mod_revision, value, lease),
        }
    }

    /// Delete the record if it is still at `mod_revision`, else return the current one.
    pub fn delete_txn(self, key: &str, mod_revision: i64) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::delete_txn(key, mod_revision),
            Protocol::Json => delete_txn(key, mod_revision),
        }
    }

    /// A range request reading one key.
    pub fn read_key(self, key: &str) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::read_key(key.as_bytes()),
            Protocol::Json => read_key(key),
        }
    }

    /// A range request counting the keys under `prefix`.
    pub fn count_prefix(self, prefix: &str) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::count_range(prefix.as_bytes(), &prefix_end(prefix)),
            Protocol::Json => count_prefix(prefix),
        }
    }

    pub fn lease_grant(self, ttl_seconds: u64) -> Vec<u8> {
        match self {
            Protocol::Grpc => etcdpb::lease_grant(ttl_seconds),
            Protocol::Json => lease_grant(ttl_seconds),
        }
    }
}

/// Whether `path` is a txn in either protocol.
pub fn is_txn(path: &str) -> bool {
    path == TXN_PATH || path == etcdpb::TXN
}

/// Reads the answer to a call made on `path`, in that call's protocol: a gRPC answer
/// has status 200 and the response message, or status 0 and `etcdpb::status_body`.
/// `None` when it is not a recognisable etcd answer.
pub fn read_answer(path: &str, status: u16, body: &[u8]) -> Option<EtcdAnswer> {
    if !path.starts_with("/etcdserverpb.") {
        return parse_answer(body);
    }
    if status != 200 {
        let (code, message) = etcdpb::status(body)?;
        return Some(EtcdAnswer::Error { code, message });
    }
    match path {
        etcdpb::LEASE_GRANT => Some(match etcdpb::lease_grant_response(body)? {
            Ok(id) => EtcdAnswer::Lease { id },
            Err(message) => EtcdAnswer::Error { code: -1, message },
        }),
        _ => {
            let (succeeded, revision, existing) = etcdpb::txn_response(body)?;
            Some(EtcdAnswer::Txn {
                succeeded,
                revision,
                existing,
            })
        }
    }
}

/// The count of a range answer to a call made on `path`, in that call's protocol.
pub fn read_count(path: &str, status: u16, body: &[u8]) -> Option<u64> {
    read_range(path, status, body, etcdpb::range_count, parse_count)
}

/// The answer to a `read_key` call made on `path`, in that call's protocol: see
/// [`parse_read`].
pub fn read_one(path: &str, status: u16, body: &[u8]) -> Option<Option<(i64, Vec<u8>)>> {
    read_range(path, status, body, etcdpb::range_read, parse_read)
}

/// A range answer read by the reader of the call's protocol; a gRPC call that did not
/// answer 200 has no range in its body.
fn read_range<T>(
    path: &str,
    status: u16,
    body: &[u8],
    grpc: fn(&[u8]) -> Option<T>,
    json: fn(&[u8]) -> Option<T>,
) -> Option<T> {
    match (path == etcdpb::RANGE, status) {
        (true, 200) => grpc(body),
        (true, _) => None,
        (false, _) => json(body),
    }
}

/// Whether an etcd error is one a retry may get past: no leader, leader changed, or a
/// call that ran out of time (gRPC UNAVAILABLE, DEADLINE_EXCEEDED).
pub fn retryable_error(answer: &Option<EtcdAnswer>) -> bool {
    matches!(
        answer,
        Some(EtcdAnswer::Error {
            code: etcdpb::UNAVAILABLE | etcdpb::DEADLINE_EXCEEDED,
            ..
        })
    )
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last = last.saturating_add(1);
    }
    end
}

const VALUE_VERSION: u8 = 1;

/// A record as stored in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdRecord {
    pub state: RecordState,
    pub token: u64,
    pub expires_ms: u64,
    pub payload: Digest,
    pub response: Option<StoredResponse>,
}

impl EtcdRecord {
    /// Version, state, token, expiry, payload digest, then the stored response if any.
    pub fn encode(&self, digest: &Digest) -> Vec<u8> {
        let mut w = Writer::with_capacity(2 + 8 + 8 + 32);
        w.u8(VALUE_VERSION)
            .u8(self.state as u8)
            .u64(self.token)
            .u64(self.expires_ms)
            .bytes(&self.payload);
        if let Some(r) = &self.response {
            r.write(&mut w, digest, self.token);
        }
        w.finish()
    }

    /// `None` unless the value is a well-formed record of this version for `digest`.
    pub fn decode(bytes: &[u8], digest: &Digest) -> Option<EtcdRecord> {
        let mut r = Reader::new(bytes);
        if r.u8().ok()? != VALUE_VERSION {
            return None;
        }
        let state = RecordState::from_byte(r.u8().ok()?)?;
        let token = r.u64().ok()?;
        let expires_ms = r.u64().ok()?;
        let payload = r.array().ok()?;
        let response = if r.is_empty() {
            None
        } else {
            Some(StoredResponse::decode(r.rest(), digest, token)?)
        };
        if state == RecordState::Completed && response.is_none() {
            return None;
        }
        Some(EtcdRecord {
            state,
            token,
            expires_ms,
            payload,
            response,
        })
    }
}

/// The etcd key of a record digest.
pub fn record_key(prefix: &str, digest: &Digest) -> String {
    let mut k = String::with_capacity(prefix.len() + 64);
    k.push_str(prefix);
    crate::key::push_hex(&mut k, digest);
    k
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

fn put(key: &str, value: &[u8], lease: i64) -> Value {
    json!({"request_put": {"key": b64(key.as_bytes()), "value": b64(value), "lease": lease.to_string()}})
}

/// Claim: create the record if absent, else return the existing one.
pub fn claim_txn(key: &str, value: &[u8], lease: i64) -> Vec<u8> {
    let k = b64(key.as_bytes());
    json!({
        "compare": [{"key": k, "target": "CREATE", "create_revision": "0"}],
        "success": [put(key, value, lease)],
        "failure": [{"request_range": {"key": k}}],
    })
    .to_string()
    .into_bytes()
}

/// Replace the record at `mod_revision` (takeover after logical expiry, or completion),
/// else return the current one.
pub fn replace_txn(key: &str, mod_revision: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let k = b64(key.as_bytes());
    json!({
        "compare": [{"key": k, "target": "MOD", "mod_revision": mod_revision.to_string()}],
        "success": [put(key, value, lease)],
        "failure": [{"request_range": {"key": k}}],
    })
    .to_string()
    .into_bytes()
}

/// Delete the record if it is still at `mod_revision` (release), else return the current
/// one (none: already gone).
pub fn delete_txn(key: &str, mod_revision: i64) -> Vec<u8> {
    let k = b64(key.as_bytes());
    json!({
        "compare": [{"key": k, "target": "MOD", "mod_revision": mod_revision.to_string()}],
        "success": [{"request_delete_range": {"key": k}}],
        "failure": [{"request_range": {"key": k}}],
    })
    .to_string()
    .into_bytes()
}

/// A range request reading one key (`RANGE_PATH`; a linearizable read, no write).
pub fn read_key(key: &str) -> Vec<u8> {
    json!({"key": b64(key.as_bytes())}).to_string().into_bytes()
}

/// The answer to `read_key`: `Some(None)` when the key is absent, `Some(Some((mod
/// revision, value)))` when present; `None` when the body is not a range answer (an
/// error, or no answer at all).
pub fn parse_read(body: &[u8]) -> Option<Option<(i64, Vec<u8>)>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("error").is_some() || v.get("message").is_some() {
        return None;
    }
    v.get("header")?;
    let Some(kv) = v
        .get("kvs")
        .and_then(Value::as_array)
        .and_then(|kvs| kvs.first())
    else {
        return Some(None);
    };
    let mod_rev = kv.get("mod_revision").and_then(int)?;
    let value = match kv.get("value").and_then(Value::as_str) {
        Some(s) => B64.decode(s).ok()?,
        None => Vec::new(),
    };
    Some(Some((mod_rev, value)))
}

/// A range request counting the keys under `prefix`.
pub fn count_prefix(prefix: &str) -> Vec<u8> {
    let end = prefix_end(prefix);
    json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end), "count_only": true})
        .to_string()
        .into_bytes()
}

/// The count of a range answer (`{"header": …, "count": "12"}`; absent when zero).
pub fn parse_count(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.get("header")?;
    match v.get("count") {
        Some(c) => u64::try_from(int(c)?).ok(),
        None => Some(0),
    }
}

pub fn lease_grant(ttl_seconds: u64) -> Vec<u8> {
    json!({"TTL": ttl_seconds.to_string()})
        .to_string()
        .into_bytes()
}

/// What an etcd answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdAnswer {
    Txn {
        succeeded: bool,
        /// The store revision after the txn: a successful put's mod revision.
        revision: i64,
        /// The current record, when the failure branch read it.
        existing: Option<(i64, Vec<u8>)>,
    },
    Lease {
        id: i64,
    },
    /// etcd answered with an error (`code`, `message`): e.g. 5 "requested lease not found".
    Error {
        code: i64,
        message: String,
    },
}

/// grpc-gateway writes int64 as strings and leaves out default values.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Reads a gateway answer body. `None` when it is not a recognisable etcd answer.
pub fn parse_answer(body: &[u8]) -> Option<EtcdAnswer> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if let Some(msg) = v.get("error").or_else(|| v.get("message")) {
        return Some(EtcdAnswer::Error {
            code: v.get("code").and_then(int).unwrap_or(-1),
            message: msg.as_str().unwrap_or("").to_string(),
        });
    }
    if let Some(id) = v.get("ID") {
        return Some(EtcdAnswer::Lease { id: int(id)? });
    }
    let header = v.get("header")?;
    let revision = header.get("revision").and_then(int).unwrap_or(0);
    let succeeded = v.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
    let existing = v
        .get("responses")
        .and_then(Value::as_array)
        .and_then(|rs| rs.iter().find_map(|r| r.get("response_range")))
        .and_then(|rr| rr.get("kvs"))
        .and_then(Value::as_array)
        .and_then(|kvs| kvs.first())
        .and_then(|kv| {
            let mod_rev = kv.get("mod_revision").and_then(int)?;
            let value = match kv.get("value").and_then(Value::as_str) {
                Some(s) => B64.decode(s).ok()?,
                None => Vec::new(),
            };
            Some((mod_rev, value))
        });
    Some(EtcdAnswer::Txn {
        succeeded,
        revision,
        existing,
    })
}

/// Which records a lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeasePurpose {
    InFlight,
    Completed,
}

/// Time-bucketed leases, one per purpose and lease plan per worker. A lease granted at
/// `g` with TTL `life + window` is attached to records created in `[g, g + window)`, so
/// each record outlives its logical expiry by at most `window` (plus etcd's one-second
/// lease granularity), and etcd sees one lease grant per window per worker instead of one
/// per request. Records are expired logically by the time inside them; the lease only
/// removes them from etcd. Rules with other TTLs or in-flight timeouts have other plans,
/// hence their own leases: a lease is only reused for records of the same life.
#[derive(Debug, Default, Clone)]
pub struct LeaseCache {
    /// (shard, purpose, lease TTL s, window ms) → (lease id, usable until ms). A lease
    /// is an etcd cluster's own: each shard has its own.
    slots: Vec<(LeaseSlot, (i64, u64))>,
}

/// Which records a cached lease is for: a shard's records of a purpose under one plan.
type LeaseSlot = (u64, LeasePurpose, u64, u64);

impl LeaseCache {
    /// A lease of `shard` (its `Route::shard_id`) usable now for a record of `purpose`
    /// under `plan`, if one is cached.
    pub fn get(
        &self,
        shard: u64,
        purpose: LeasePurpose,
        plan: &LeasePlan,
        now_ms: u64,
    ) -> Option<i64> {
        let slot = (shard, purpose, plan.ttl_s(purpose), plan.window(purpose));
        self.slots
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, v)| *v)
            .filter(|(_, until)| now_ms < *until)
            .map(|(id, _)| id)
    }

    /// Caches lease `id` of `shard` for `plan`'s window after `sent_ms`, when its grant
    /// was sent (not when the answer came: etcd's TTL started before that). Leases whose
    /// window has passed are dropped, so the cache holds at most two per shard and plan
    /// in use.
    pub fn put(
        &mut self,
        shard: u64,
        purpose: LeasePurpose,
        plan: &LeasePlan,
        id: i64,
        sent_ms: u64,
    ) {
        let slot = (shard, purpose, plan.ttl_s(purpose), plan.window(purpose));
        let until = sent_ms.saturating_add(plan.window(purpose));
        self.slots.retain(|(s, (_, u))| *s != slot && *u > sent_ms);
        self.slots.push((slot, (id, until)));
    }

    /// Drops every lease of `shard` (etcd said one of them is gone: take fresh ones).
    pub fn forget(&mut self, shard: u64) {
        self.slots.retain(|((s, ..), _)| *s != shard);
    }
}

/// The longest a key this configuration writes lives in etcd (seconds): the longest
/// completed lease of any policy's records, and with `ordering` of its entities (their
/// leases run `max(ttl, ordering.ttl)`); `None` for another store. After every proxy
/// writes under a new map, records under the old one are all gone this long later: the
/// wait before a resharding's step 3 drops the old map (plus the proxies' clock skew).
pub fn longest_key_life_s(config: &crate::config::Config) -> Option<u64> {
    let crate::config::StoreConfig::Etcd(e) = &config.store else {
        return None;
    };
    let life = |p: &crate::config::Policy| {
        let ordering_ttl = p.ordering.as_ref().map_or(0, |o| o.ttl_ms);
        LeasePlan::new(
            p.ttl_ms.max(ordering_ttl),
            p.in_flight_timeout_ms,
            e.timeout_ms,
        )
        .ttl_s(LeasePurpose::Completed)
    };
    std::iter::once(&config.policy)
        .chain(config.rules.iter().map(|r| &r.policy))
        .map(life)
        .max()
}

/// Lease timing for a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePlan {
    pub in_flight_window_ms: u64,
    pub completed_window_ms: u64,
    pub in_flight_ttl_s: u64,
    pub completed_ttl_s: u64,
}

impl LeasePlan {
    /// A lease is attached to records created in the window after its grant was *sent*
    /// (etcd starts its TTL when it grants, which is later), and lives past that window
    /// by the record's whole life: a claim built with it may be forwarded as late as its
    /// store budget (`budget_ms`, `store.timeout_ms`) after it was built, and must stay
    /// in flight for `in_flight_ms` from then. The completed lease is taken at claim time
    /// (so completion is one call even if the stream is gone by the time etcd answers),
    /// hence it also covers the in-flight time, the in-flight window and the budget: a
    /// completion may land until the in-flight lease ends, and then answers for `ttl_ms`.
    pub fn new(ttl_ms: u64, in_flight_ms: u64, budget_ms: u64) -> Self {
        let window = |life: u64| (life / 8).clamp(1_000, 60_000);
        let in_flight_window_ms = window(in_flight_ms);
        let completed_window_ms = window(ttl_ms);
        let secs = |ms: u64| ms.div_ceil(1000);
        let in_flight_life = in_flight_ms + in_flight_window_ms + budget_ms;
        LeasePlan {
            in_flight_window_ms,
            completed_window_ms,
            in_flight_ttl_s: secs(in_flight_life),
            // The in-flight lease's rounding to seconds: a completion may land up to
            // one second after `in_flight_life`.
            completed_ttl_s: secs(ttl_ms + in_flight_life + 1_000 + completed_window_ms),
        }
    }

    pub fn window(&self, purpose: LeasePurpose) -> u64 {
        match purpose {
            LeasePurpose::InFlight => self.in_flight_window_ms,
            LeasePurpose::Completed => self.completed_window_ms,
        }
    }

    pub fn ttl_s(&self, purpose: LeasePurpose) -> u64 {
        match purpose {
            LeasePurpose::InFlight => self.in_flight_ttl_s,
            LeasePurpose::Completed => self.completed_ttl_s,
        }
    }
}

#[cfg(test)]
mod tests;
