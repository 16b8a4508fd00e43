//! The operator API (`"role": "admin"`): look up, remove and count records. Mounted on an
//! admin-only listener with the same `vm_id` and store settings as the data plane, it
//! answers `GET /records?…`, `DELETE /records?…` and `GET /stats`, and nothing else.

use crate::config::{Config, Home, Policy};
use crate::key::{record_digest, ClientKey, Digest, KeySource, RequestHead};
use crate::metrics::Counter;
use crate::record::RecordView;
use crate::reply::{LocalReply, Problem};
use crate::stream::{CallAnswer, Decision, Env, Operated, Operating, Operation, Plugin};
use serde_json::{json, Value};

/// One admin operation, parsed from the request. `rule` is the index of the rule named
/// by `rule=<name>` (`None`: the top-level records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOp {
    Get {
        digest: Digest,
        home: Home,
        rule: Option<usize>,
    },
    Delete {
        digest: Digest,
        home: Home,
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
    // The record's home, as the data plane decides it from the same scope.
    let home = cfg.store.home_of(&head);
    Ok(match method {
        "DELETE" => AdminOp::Delete {
            digest,
            home,
            force,
            rule,
        },
        _ => AdminOp::Get { digest, home, rule },
    })
}

pub(crate) fn hex(d: &Digest) -> String {
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

/// A record as JSON: state, expiry, age (by the policy's timeouts), payload digest, the
/// stored response's status and body size, and its shard when the store has shards.
fn record_json(cfg: &Policy, digest: &Digest, view: &RecordView, now_ms: u64) -> Value {
    let keep = crate::stream::keeps_unknown(cfg);
    let life = match view.state {
        "in_flight" if keep && view.claim_lives_to_ttl => cfg.ttl_ms.max(cfg.in_flight_timeout_ms),
        "held" if keep => cfg.ttl_ms.max(cfg.in_flight_timeout_ms),
        "in_flight" | "held" => cfg.in_flight_timeout_ms,
        _ => cfg.ttl_ms,
    };
    let mut found = json!({
        "record": hex(digest),
        "rule": cfg.rule,
        "state": view.state,
        "expires_at_ms": view.expires_ms,
        "expires_in_ms": view.expires_ms.saturating_sub(now_ms),
        "age_ms": now_ms.saturating_sub(view.expires_ms.saturating_sub(life)),
        "payload_digest": hex(&view.payload),
        "status": view.response.map(|r| r.0),
        "body_bytes": view.response.map(|r| r.1),
    });
    if let Some(shard) = &view.shard {
        found["shard"] = json!(shard);
    }
    found
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

/// An admin request on its way: answered at once, or after the store's calls.
#[derive(Default)]
pub struct AdminStream {
    op: Option<AdminOp>,
    /// The operation's continuation while its store call is out.
    pending: Option<Box<dyn Operating>>,
    /// Who asked (for the removal's log line).
    peer: String,
}

impl std::fmt::Debug for AdminStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminStream").field("op", &self.op).finish()
    }
}

impl AdminStream {
    /// The request's head arrived (an admin request is decided there).
    pub fn on_request(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        method: &str,
        path: &[u8],
        peer: &str,
    ) -> Decision {
        let op = match parse(&p.config, method, path) {
            Ok(op) => op,
            Err(reply) => return Decision::Reply(reply),
        };
        let operation = match &op {
            AdminOp::Stats => Operation::Stats,
            AdminOp::Get { digest, home, .. } => Operation::Get {
                digest: *digest,
                home: *home,
            },
            AdminOp::Delete {
                digest,
                home,
                force,
                ..
            } => {
                env.warn(&format!(
                    "proxy-dedup admin: DELETE {} from {peer}",
                    String::from_utf8_lossy(path)
                ));
                Operation::Delete {
                    digest: *digest,
                    home: *home,
                    force: *force,
                }
            }
        };
        self.op = Some(op);
        self.peer = peer.to_string();
        let now = env.now_ms();
        let operated = p.store.operate(p, env, &operation, now);
        self.carry_on(p, env, operated, now)
    }

    /// The store answered the admin stream's call.
    pub fn on_store_answer(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        answer: CallAnswer,
    ) -> Decision {
        let Some(pending) = self.pending.take() else {
            return Decision::Continue;
        };
        let now = env.now_ms();
        let operated = pending.answered(env, answer, now);
        self.carry_on(p, env, operated, now)
    }

    /// A call to make (its continuation kept), or the operator's answer.
    fn carry_on(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        operated: Operated,
        now: u64,
    ) -> Decision {
        if let Operated::Call(call, next) = operated {
            self.pending = Some(next);
            return Decision::Call(call);
        }
        let Some(op) = self.op.clone() else {
            return Decision::Continue;
        };
        Decision::Reply(self.answer(p, env, &op, operated, now))
    }

    fn answer(
        &self,
        p: &Plugin,
        env: &mut dyn Env,
        op: &AdminOp,
        operated: Operated,
        now: u64,
    ) -> LocalReply {
        let (digest, rule) = match op {
            AdminOp::Get { digest, rule, .. } | AdminOp::Delete { digest, rule, .. } => {
                (*digest, *rule)
            }
            AdminOp::Stats => ([0; 32], None),
        };
        if let AdminOp::Delete { force, .. } = op {
            env.warn(&format!(
                "proxy-dedup admin: {} asked to remove record {} (force {force}): {}",
                self.peer,
                hex(&digest),
                match &operated {
                    Operated::Removed { .. } => "removed",
                    Operated::Refused => "refused: a claim",
                    Operated::NotFound => "not found",
                    _ => "failed",
                }
            ));
        }
        let policy = p.config.policy_at(rule);
        match operated {
            Operated::Stats(v) => json_reply(200, v),
            Operated::Found(view) => json_reply(200, record_json(policy, &digest, &view, now)),
            Operated::Removed { view, shard } => {
                env.count(Counter::AdminRemoved);
                let removed = match view {
                    Some(view) => record_json(policy, &digest, &view, now),
                    None => json!({"record": hex(&digest), "shard": shard}),
                };
                json_reply(200, json!({ "removed": removed }))
            }
            Operated::Refused => refused(CLAIM_REFUSED),
            Operated::NotFound => not_found(&digest),
            Operated::Unavailable(why) => Problem::StoreUnavailable.reply(&why, Vec::new()),
            // Carried on before this.
            Operated::Call(..) => {
                Problem::StoreUnavailable.reply("the store did not answer", Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests;
