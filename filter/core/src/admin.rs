//! The operator API (`"role": "admin"`): look up, remove and count records. Mounted on an
//! admin-only listener with the same `vm_id` and store settings as the data plane, it
//! answers `GET /records?…`, `DELETE /records?…` and `GET /stats`, and nothing else.

use crate::config::{Config, Policy};
use crate::etcd::{self, EtcdAnswer, EtcdRecord};
use crate::key::{record_digest, ClientKey, Digest, KeySource, RequestHead};
use crate::metrics::Counter;
use crate::reply::{LocalReply, Problem};
use crate::store::{Layout, Purge, RecordView, SharedStore};
use crate::stream::{CallAnswer, Decision, Env, EtcdStore, Plugin, Route, StoreCall, StoreVisit};
use serde_json::{json, Value};
use std::sync::Arc;

/// One admin operation, parsed from the request. `rule` is the index of the rule named
/// by `rule=<name>` (`None`: the top-level records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOp {
    Get {
        digest: Digest,
        rule: Option<usize>,
    },
    Delete {
        digest: Digest,
        force: bool,
        rule: Option<usize>,
    },
    Stats,
}

/// Decodes `%XX` and `+` in a query component. The bytes, not text: a scope value is
/// whatever bytes the data plane saw (`%FF` included).
fn unescape(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        match c {
            b'%' => {
                let hex = std::str::from_utf8(s.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

fn bad(detail: &str) -> LocalReply {
    Problem::BadAdminRequest.reply(detail, Vec::new())
}

/// The pseudo-header values a record's scope may name, from `scope.:authority`,
/// `scope.:path` and `scope.:method`.
#[derive(Default)]
struct PseudoParams {
    authority: Option<Vec<u8>>,
    path: Option<Vec<u8>>,
    method: Option<String>,
}

/// Parses an admin request; `Err` is the answer to give at once.
pub fn parse(cfg: &Config, method: &str, path: &[u8]) -> Result<AdminOp, LocalReply> {
    let (route, query) = match path.iter().position(|&b| b == b'?') {
        Some(at) => (
            path.get(..at).unwrap_or_default(),
            path.get(at + 1..).unwrap_or_default(),
        ),
        None => (path, &b""[..]),
    };
    let route_text = String::from_utf8_lossy(route);
    match (method, route) {
        ("GET", b"/stats") => return Ok(AdminOp::Stats),
        ("GET" | "DELETE", b"/records") => {}
        (_, b"/records" | b"/stats") => {
            return Err(bad(&format!("{method} is not allowed on {route_text}")));
        }
        _ => {
            let detail = "this listener serves the proxy-dedup admin API only: GET /records, DELETE /records, GET /stats";
            return Err(Problem::NotAdminPath.reply(detail, Vec::new()));
        }
    }
    let mut key = None;
    let mut source = KeySource::Header;
    let mut head = RequestHead::default();
    let mut authority = None;
    let mut pseudo = PseudoParams::default();
    let mut force = false;
    let mut params = Vec::new();
    for pair in query.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (
                pair.get(..at).unwrap_or_default(),
                pair.get(at + 1..).unwrap_or_default(),
            ),
            None => (pair, &b""[..]),
        };
        let name = unescape(name).and_then(|n| String::from_utf8(n).ok());
        let (Some(name), Some(value)) = (name, unescape(value)) else {
            return Err(bad(&format!(
                "`{}` is not a valid query parameter",
                String::from_utf8_lossy(pair)
            )));
        };
        params.push((name, value));
    }
    // Text parameters (the rule, the key, the source, a method): UTF-8 or refused. A
    // data-plane key is UTF-8 (`validate_key`), so no other key has a record.
    let text = |name: &str, v: Vec<u8>| {
        String::from_utf8(v).map_err(|_| bad(&format!("the parameter `{name}` is not UTF-8")))
    };
    // The rule first: its policy says which scope parameters the record has.
    let rule = match params.iter().find(|(n, _)| n == "rule") {
        None => None,
        Some((_, name)) => match cfg.rules.iter().position(|r| r.name.as_bytes() == name) {
            Some(i) if cfg.rules.get(i).is_some_and(|r| r.policy.bypass) => {
                return Err(bad(&format!(
                    "rule `{}` is bypassed: its requests have no records",
                    String::from_utf8_lossy(name)
                )))
            }
            Some(i) => Some(i),
            None => {
                let names: Vec<&str> = cfg.rules.iter().map(|r| r.name.as_str()).collect();
                return Err(bad(&format!(
                    "no rule is named `{}` (rules: {}); leave `rule` out for requests no rule matches",
                    String::from_utf8_lossy(name),
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                )));
            }
        },
    };
    let policy = cfg.policy_at(rule);
    for (name, value) in params {
        match name.as_str() {
            "rule" => {}
            "key" => key = Some(text("key", value)?),
            "source" => {
                source = match text("source", value)?.as_str() {
                    "header" => KeySource::Header,
                    "json_pointer" => KeySource::JsonPointer,
                    other => {
                        return Err(bad(&format!(
                            "source `{other}`: expected \"header\" or \"json_pointer\""
                        )))
                    }
                }
            }
            "authority" => authority = Some(value),
            "force" => force = value == b"true" || value == b"1",
            other => match other.strip_prefix("scope.").map(str::to_ascii_lowercase) {
                Some(h) if policy.scope_headers.contains(&h) => {
                    let twice = match h.as_str() {
                        ":authority" => pseudo.authority.replace(value).is_some(),
                        ":path" => pseudo.path.replace(value).is_some(),
                        ":method" => pseudo.method.replace(text(other, value)?).is_some(),
                        _ => {
                            let seen = head.header_count(&h) > 0;
                            head.headers.push((h, value));
                            seen
                        }
                    };
                    if twice {
                        return Err(bad(&format!(
                            "the parameter `{other}` is given twice; a record has one scope"
                        )));
                    }
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown parameter `{other}` (key, source, authority, force, rule, scope.<one of the policy's scope.headers>)"
                    )))
                }
            },
        }
    }
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return Err(bad("the parameter `key` is required"));
    };
    // One request has one authority: `scope.authority` and a `:authority` scope part
    // both hash it, so the two parameters must agree, and either gives it.
    let scoped = |name: &str| policy.scope_headers.iter().any(|s| s == name);
    head.authority = match (authority, pseudo.authority) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(
                "the parameters `authority` and `scope.:authority` differ; a request has one authority",
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) if policy.scope_authority => return Err(bad(
            "the parameter `authority` (the request's host) is required: scope.authority is on",
        )),
        (None, None) if scoped(":authority") => return Err(bad(
            "the parameter `authority` or `scope.:authority` is required: scope.headers lists :authority",
        )),
        (None, None) => Vec::new(),
    };
    // Every request has a path and a method: a record scoped by them needs them named.
    match pseudo.path {
        Some(p) => head.path = p,
        None if scoped(":path") => {
            return Err(bad(
                "the parameter `scope.:path` is required: scope.headers lists :path",
            ))
        }
        None => {}
    }
    match pseudo.method {
        Some(m) => head.method = m,
        None if scoped(":method") => {
            return Err(bad(
                "the parameter `scope.:method` is required: scope.headers lists :method",
            ))
        }
        None => {}
    }
    let digest = record_digest(
        policy,
        &head,
        &ClientKey {
            source,
            value: key.into_bytes(),
        },
    );
    Ok(match method {
        "DELETE" => AdminOp::Delete {
            digest,
            force,
            rule,
        },
        _ => AdminOp::Get { digest, rule },
    })
}

fn hex(d: &Digest) -> String {
    let mut out = String::with_capacity(64);
    crate::key::push_hex(&mut out, d);
    out
}

fn json_reply(status: u16, v: Value) -> LocalReply {
    LocalReply {
        status,
        headers: vec![("content-type".to_string(), b"application/json".to_vec())],
        body: v.to_string().into_bytes(),
        details: "proxy_dedup_admin",
        problem: None,
    }
}

/// A record as JSON: state, expiry, age (by the policy's timeouts), payload digest, and
/// the stored response's status and body size.
/// `shared`: a shared-data record, whose kept claims (`on_unknown_outcome: "keep"`)
/// expire at their TTL; an etcd claim's expiry stays its in-flight time (its lease ends it).
fn record_json(
    cfg: &Policy,
    shared: bool,
    digest: &Digest,
    view: &RecordView,
    now_ms: u64,
) -> Value {
    let keep = crate::stream::keeps_unknown(cfg);
    let life = match view.state {
        "in_flight" if keep && shared => cfg.ttl_ms.max(cfg.in_flight_timeout_ms),
        "held" if keep => cfg.ttl_ms.max(cfg.in_flight_timeout_ms),
        "in_flight" | "held" => cfg.in_flight_timeout_ms,
        _ => cfg.ttl_ms,
    };
    json!({
        "record": hex(digest),
        "rule": cfg.rule,
        "state": view.state,
        "expires_at_ms": view.expires_ms,
        "expires_in_ms": view.expires_ms.saturating_sub(now_ms),
        "age_ms": now_ms.saturating_sub(view.expires_ms.saturating_sub(life)),
        "payload_digest": hex(&view.payload),
        "status": view.response.map(|r| r.0),
        "body_bytes": view.response.map(|r| r.1),
    })
}

fn not_found(digest: &Digest) -> LocalReply {
    let detail = format!("no live record {} for these parameters", hex(digest));
    Problem::NoSuchRecord.reply(&detail, Vec::new())
}

fn refused(detail: &str) -> LocalReply {
    Problem::RecordIsClaim.reply(detail, Vec::new())
}

const CLAIM_REFUSED: &str =
    "the record is a claim (in flight or held): its request may be running; add force=true to remove it anyway";

/// An operator request, decided: shared data answers at once, etcd reads first.
struct OnRequest<'a, E> {
    admin: &'a mut AdminStream,
    p: &'a Plugin,
    env: &'a mut E,
    op: AdminOp,
    now: u64,
    path: &'a [u8],
    peer: &'a str,
}

impl<E: Env> StoreVisit for OnRequest<'_, E> {
    type Out = Decision;
    fn shared_data(self, layout: &Layout) -> Decision {
        let r = self
            .admin
            .shared(self.p, layout, self.env, self.op, self.now, self.peer);
        Decision::Reply(r)
    }
    fn etcd(self, ec: &EtcdStore) -> Decision {
        self.admin
            .etcd_request(ec, self.env, self.op, self.path, self.peer)
    }
}

/// The answer to an operator request's store call (only etcd makes them).
struct OnAnswer<'a, E> {
    admin: &'a mut AdminStream,
    p: &'a Plugin,
    env: &'a mut E,
    answer: CallAnswer,
}

impl<E: Env> StoreVisit for OnAnswer<'_, E> {
    type Out = Decision;
    fn shared_data(self, _layout: &Layout) -> Decision {
        Decision::Continue
    }
    fn etcd(self, ec: &EtcdStore) -> Decision {
        self.admin.etcd_answer(self.p, ec, self.env, self.answer)
    }
}

/// An admin request on its way: shared data answers at once, etcd after calls.
#[derive(Debug, Default)]
pub struct AdminStream {
    op: Option<AdminOp>,
    key: String,
    /// Removal attempts (a record that changed between read and delete is read again).
    rounds: u32,
    /// etcd: the shard the call out goes to, and whether it is the key's shard under the
    /// other map of a resharding (read when its own shard has no live record).
    shard: Option<Arc<Route>>,
    on_check: bool,
    /// `GET /stats` on etcd: each shard's count so far, in the map's order.
    counts: Vec<(String, u64)>,
}

impl AdminStream {
    /// The request's head arrived (an admin request is decided there).
    pub fn on_request<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        method: &str,
        path: &[u8],
        peer: &str,
    ) -> Decision {
        let op = match parse(&p.config, method, path) {
            Ok(op) => op,
            Err(reply) => return Decision::Reply(reply),
        };
        let now = env.now_ms();
        p.store.visit(OnRequest {
            admin: self,
            p,
            env,
            op,
            now,
            path,
            peer,
        })
    }

    /// An operation on etcd: the record (or the count) is read first.
    pub(crate) fn etcd_request<E: Env>(
        &mut self,
        ec: &EtcdStore,
        env: &mut E,
        op: AdminOp,
        path: &[u8],
        peer: &str,
    ) -> Decision {
        let call = match &op {
            AdminOp::Stats => {
                self.counts.clear();
                match ec.routes().first() {
                    Some(first) => count_call(ec, first),
                    None => return Decision::Reply(stats_reply(&self.counts)),
                }
            }
            AdminOp::Get { digest: d, .. } | AdminOp::Delete { digest: d, .. } => {
                self.key = etcd::record_key(&ec.config.prefix, d);
                let route = Arc::clone(ec.route_of(d));
                let call = read_call(ec, &route, &self.key);
                self.shard = Some(route);
                call
            }
        };
        if matches!(op, AdminOp::Delete { .. }) {
            env.warn(&format!(
                "proxy-dedup admin: DELETE {} from {peer}",
                String::from_utf8_lossy(path)
            ));
        }
        self.op = Some(op);
        Decision::Call(call)
    }

    /// An operation on shared data, answered at once.
    pub(crate) fn shared<E: Env>(
        &self,
        p: &Plugin,
        layout: &Layout,
        env: &mut E,
        op: AdminOp,
        now: u64,
        peer: &str,
    ) -> LocalReply {
        let failed = |e: crate::store::StoreError| {
            Problem::StoreUnavailable.reply(&format!("shared data failed: {e}"), Vec::new())
        };
        let store = SharedStore::new(&*env, layout);
        match op {
            AdminOp::Stats => match store.stats(now) {
                Ok(st) => json_reply(
                    200,
                    json!({
                        "store": "shared_data",
                        "buckets": st.buckets,
                        "capacity": st.ways,
                        "in_flight": st.in_flight,
                        "held": st.held,
                        "completed": st.completed,
                        "completed_not_stored": st.completed_not_stored,
                        "expired": st.expired,
                        "other_layouts": st.other_layouts,
                        "stored_bytes": st.stored_bytes,
                        "max_store_bytes": p.config.max_store_bytes(),
                    }),
                ),
                Err(e) => failed(e),
            },
            AdminOp::Get { digest: d, rule } => match store.inspect(&d, now) {
                Ok(Some(view)) => json_reply(
                    200,
                    record_json(p.config.policy_at(rule), true, &d, &view, now),
                ),
                Ok(None) => not_found(&d),
                Err(e) => failed(e),
            },
            AdminOp::Delete {
                digest,
                force,
                rule,
            } => {
                let result = store.purge(&digest, force, now);
                env.warn(&format!(
                    "proxy-dedup admin: {peer} asked to remove record {} (force {force}): {:?}",
                    hex(&digest),
                    result.as_ref().map(|r| match r {
                        Purge::Removed(_) => "removed",
                        Purge::Refused(_) => "refused: a claim",
                        Purge::NotFound => "not found",
                    })
                ));
                match result {
                    Ok(Purge::Removed(view)) => {
                        env.count(Counter::AdminRemoved);
                        json_reply(
                            200,
                            json!({"removed": record_json(p.config.policy_at(rule), true, &digest, &view, now)}),
                        )
                    }
                    Ok(Purge::Refused(_)) => refused(CLAIM_REFUSED),
                    Ok(Purge::NotFound) => not_found(&digest),
                    Err(e) => failed(e),
                }
            }
        }
    }

    /// etcd answered the admin stream's call.
    pub fn on_store_answer(
        &mut self,
        p: &Plugin,
        env: &mut impl Env,
        answer: CallAnswer,
    ) -> Decision {
        p.store.visit(OnAnswer {
            admin: self,
            p,
            env,
            answer,
        })
    }

    /// The answer to `etcd_request`'s read (or a delete that followed it).
    pub(crate) fn etcd_answer<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        answer: CallAnswer,
    ) -> Decision {
        let now = env.now_ms();
        let Some(op) = self.op.clone() else {
            return Decision::Continue;
        };
        let unavailable =
            |why: String| Decision::Reply(Problem::StoreUnavailable.reply(&why, Vec::new()));
        if op == AdminOp::Stats {
            let routes = ec.routes();
            let Some(route) = routes.get(self.counts.len()) else {
                return Decision::Reply(stats_reply(&self.counts));
            };
            return match etcd::read_count(
                ec.config.protocol.range_path(),
                answer.status,
                &answer.body,
            ) {
                Some(n) => {
                    self.counts.push((route.shard.clone(), n));
                    match routes.get(self.counts.len()) {
                        Some(next) => Decision::Call(count_call(ec, next)),
                        None => Decision::Reply(stats_reply(&self.counts)),
                    }
                }
                None => unavailable(format!(
                    "etcd shard `{}` answered {} without a count",
                    route.shard, answer.status
                )),
            };
        }
        let shard = self
            .shard
            .as_ref()
            .map_or(String::new(), |r| r.shard.clone());
        let proto = ec.config.protocol;
        let parsed = etcd::read_answer(proto.txn_path(), answer.status, &answer.body);
        let (digest, delete, force, rule) = match op {
            AdminOp::Get { digest, rule } => (digest, false, false, rule),
            AdminOp::Delete {
                digest,
                force,
                rule,
            } => (digest, true, force, rule),
            AdminOp::Stats => return Decision::Continue,
        };
        match parsed {
            // Our delete went through.
            Some(EtcdAnswer::Txn {
                succeeded: true, ..
            }) => Decision::Reply(json_reply(
                200,
                json!({"removed": {"record": hex(&digest), "shard": shard}}),
            )),
            Some(EtcdAnswer::Txn { existing: None, .. }) => self.not_here(ec, &digest),
            Some(EtcdAnswer::Txn {
                existing: Some((mod_revision, value)),
                ..
            }) => {
                let Some(r) = EtcdRecord::decode(&value, &digest) else {
                    return unavailable("the record cannot be read by this version".to_string());
                };
                let claim = r.state.is_claim();
                if !claim && r.expires_ms <= now {
                    return self.not_here(ec, &digest);
                }
                let view = RecordView {
                    state: r.state.name(),
                    expires_ms: r.expires_ms,
                    payload: r.payload,
                    response: r.response.as_ref().map(|s| (s.status, s.body.len())),
                    buckets: 0,
                };
                if !delete {
                    let mut found =
                        record_json(p.config.policy_at(rule), false, &digest, &view, now);
                    found["shard"] = json!(shard);
                    return Decision::Reply(json_reply(200, found));
                }
                if claim && !force {
                    return Decision::Reply(refused(CLAIM_REFUSED));
                }
                self.rounds += 1;
                if self.rounds > 4 {
                    return unavailable("the record keeps changing; try again".to_string());
                }
                let Some(route) = self.shard.clone() else {
                    return Decision::Continue;
                };
                Decision::Call(ec.call(
                    &route,
                    proto.txn_path(),
                    proto.delete_txn(&self.key, mod_revision),
                    ec.config.timeout_ms,
                ))
            }
            Some(EtcdAnswer::Error { code, message }) => {
                unavailable(format!("etcd error {code}: {message}"))
            }
            _ => unavailable(format!("etcd answered {} unreadably", answer.status)),
        }
    }
}

impl AdminStream {
    /// No live record on the shard read: during a resharding, the key's shard under the
    /// other map is read next (a record written there still answers for the key).
    fn not_here(&mut self, ec: &EtcdStore, digest: &Digest) -> Decision {
        if !self.on_check {
            if let Some(other) = ec.check_route_of(digest) {
                let other = Arc::clone(other);
                self.on_check = true;
                self.rounds = 0;
                let call = read_call(ec, &other, &self.key);
                self.shard = Some(other);
                return Decision::Call(call);
            }
        }
        Decision::Reply(not_found(digest))
    }
}

/// `GET /stats` on etcd: the records of each shard, and their sum.
fn stats_reply(counts: &[(String, u64)]) -> LocalReply {
    let shards: Vec<Value> = counts
        .iter()
        .map(|(name, n)| json!({"name": name, "records": n}))
        .collect();
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    json_reply(
        200,
        json!({"store": "etcd", "records": total, "shards": shards}),
    )
}

/// Counts the keys under the prefix on one shard (records and ordering entities).
fn count_call(ec: &EtcdStore, route: &Arc<Route>) -> StoreCall {
    ec.call(
        route,
        ec.config.protocol.range_path(),
        ec.config.protocol.count_prefix(&ec.config.prefix),
        ec.config.timeout_ms,
    )
}

/// Reads a record: a delete whose compare never holds returns the current value.
fn read_call(ec: &EtcdStore, route: &Arc<Route>, key: &str) -> StoreCall {
    let proto = ec.config.protocol;
    ec.call(
        route,
        proto.txn_path(),
        proto.delete_txn(key, -1),
        ec.config.timeout_ms,
    )
}

#[cfg(test)]
mod tests;
