//! Reading and writing the cluster through etcd's v3 JSON gateway: keys,
//! leases, the leader, and the proto3 JSON fields they come in.

use super::{EtcdCluster, Member, MemberState};
use crate::client::{self, Request};
use crate::{fail, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Timeout of one harness call to the JSON gateway.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl EtcdCluster {
    /// POST a JSON body to the v3 gateway of the first running member that answers.
    pub fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let mut errors = Vec::new();
        for m in self.members.iter() {
            if m.state != MemberState::Running {
                continue;
            }
            match self.call_member(m, path, body) {
                Ok(v) => return Ok(v),
                Err(e) => errors.push(format!("{}: {e}", m.name)),
            }
        }
        fail!(
            "etcd {path}: no running member answered ({})",
            errors.join("; ")
        )
    }

    fn call_member(&self, m: &Member, path: &str, body: &Value) -> Result<Value> {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(CALL_TIMEOUT);
        let r = client::send(m.client_addr(), &req)?;
        if r.status != 200 {
            fail!("{path} answered {}: {}", r.status, r.text());
        }
        r.json()
    }

    /// Every key under `prefix` with its value and lease (linearizable read).
    pub fn keys(&self, prefix: &str) -> Result<Vec<EtcdKey>> {
        let v = self.call("/v3/kv/range", &prefix_range(prefix.as_bytes(), false))?;
        let Some(kvs) = v.get("kvs").and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| {
                Ok(EtcdKey {
                    key: base64_field(kv, "key")?,
                    value: base64_field(kv, "value")?,
                    lease: int_field(kv, "lease").unwrap_or(0),
                })
            })
            .collect()
    }

    /// How many keys exist under `prefix`.
    pub fn count_keys(&self, prefix: &str) -> Result<u64> {
        let v = self.call("/v3/kv/range", &prefix_range(prefix.as_bytes(), true))?;
        // proto3 JSON leaves out zero values: no "count" means 0.
        Ok(int_field(&v, "count").unwrap_or(0).max(0) as u64)
    }

    /// Wait until `prefix` holds no key (records expired with their leases).
    /// Returns how long that took.
    pub fn wait_no_keys(&self, prefix: &str, limit: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let n = self.count_keys(prefix)?;
            if n == 0 {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= limit {
                fail!("{n} keys still under {prefix:?} after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `/v3/lease/timetolive`: `None` once the lease has expired (TTL -1).
    pub fn lease_ttl(&self, lease: i64) -> Result<Option<LeaseTtl>> {
        let v = self.call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() }))?;
        let ttl = int_field(&v, "TTL").unwrap_or(-1);
        if ttl < 0 {
            return Ok(None);
        }
        Ok(Some(LeaseTtl {
            remaining_seconds: ttl,
            granted_seconds: int_field(&v, "grantedTTL").unwrap_or(0),
        }))
    }

    /// Index in `members` of the current Raft leader.
    pub fn leader(&self) -> Result<usize> {
        let status = self.call("/v3/maintenance/status", &json!({}))?;
        let Some(leader) = uint_field(&status, "leader") else {
            fail!("maintenance/status without a leader: {status}");
        };
        for (i, m) in self.members.iter().enumerate() {
            if m.state != MemberState::Running {
                continue;
            }
            let own = self.call_member(m, "/v3/maintenance/status", &json!({}))?;
            if own
                .get("header")
                .and_then(|h| uint_field(h, "member_id"))
                .is_some_and(|id| id == leader)
            {
                return Ok(i);
            }
        }
        fail!("leader {leader} is not a running member")
    }

    /// Delete every key under `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> Result<()> {
        self.call(
            "/v3/kv/deleterange",
            &prefix_range(prefix.as_bytes(), false),
        )?;
        Ok(())
    }
}

/// One key from a range read.
#[derive(Debug, Clone)]
pub struct EtcdKey {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// 0: no lease.
    pub lease: i64,
}

#[derive(Debug, Clone, Copy)]
pub struct LeaseTtl {
    pub remaining_seconds: i64,
    pub granted_seconds: i64,
}

/// The range request for every key starting with `prefix` (`range_end` =
/// the prefix with its last byte incremented).
fn prefix_range(prefix: &[u8], count_only: bool) -> Value {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    if end.is_empty() {
        // Every key: range_end "\0".
        end.push(0);
    }
    let mut v = json!({ "key": base64_encode(prefix), "range_end": base64_encode(&end) });
    if count_only {
        v["count_only"] = json!(true);
    }
    v
}

/// int64 fields come as JSON strings (proto3 JSON), sometimes as numbers.
fn int_field(v: &Value, name: &str) -> Option<i64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Member ids are uint64 (above i64::MAX for half of them).
fn uint_field(v: &Value, name: &str) -> Option<u64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

fn base64_field(v: &Value, name: &str) -> Result<Vec<u8>> {
    match v.get(name).and_then(Value::as_str) {
        None => Ok(Vec::new()),
        Some(s) => base64_decode(s),
    }
}

/// Standard base64 with padding (what etcd's JSON gateway uses for bytes); the same
/// crate the filter uses.
pub fn base64_encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

pub fn base64_decode(text: &str) -> Result<Vec<u8>> {
    match STANDARD.decode(text) {
        Ok(v) => Ok(v),
        Err(e) => fail!("invalid base64 {text:?}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn base64_round_trips() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"proxy-dedup/", "cHJveHktZGVkdXAv"),
            (b"\xff\x00\x10", "/wAQ"),
        ] {
            assert_eq!(base64_encode(raw), enc);
            assert_eq!(base64_decode(enc).unwrap(), raw);
        }
    }

    #[test]
    fn prefix_range_increments_the_last_byte() {
        let v = prefix_range(b"proxy-dedup/", true);
        assert_eq!(v["key"], base64_encode(b"proxy-dedup/"));
        assert_eq!(v["range_end"], base64_encode(b"proxy-dedup0"));
        assert_eq!(v["count_only"], true);
        let v = prefix_range(b"a\xff", false);
        assert_eq!(v["range_end"], base64_encode(b"b"));
    }
}
