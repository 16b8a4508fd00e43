//! The checker: reads the whole history of a soak (every attempt as its
//! client saw it, every execution as the upstream saw it, the proxies'
//! counters) and lists what breaks the README's promises.
//!
//! A record's identity is (store, tenant, key): the two etcd proxies share
//! one store, the shared-data proxy has its own; every client sends one host.
//!
//! - (a) at most once. Executions of one identity, in the order they reached
//!   the upstream: each one after the first is allowed only if
//!   1. the previous one was answered by the upstream with a status the
//!      filter does not store (5xx, 429…: the claim is released) and that
//!      status line had been written before this one arrived; or
//!   2. it arrived `ttl` or more after the client began sending the request
//!      that caused the previous one. Nothing shorter: a claim whose outcome is
//!      unknown (client gone, route timeout, reset after sending), or whose
//!      completion never reached the store (a proxy killed, etcd down), is
//!      kept until its TTL (`on_unknown_outcome: "keep"`, the default), never
//!      only until `in_flight_timeout_seconds`.
//!
//!   Completed records live `ttl` (longer than any run), so in addition no
//!   execution may arrive after a client was answered from a completed record
//!   of the same identity (a replay, or `409 response-not-stored`), unless the
//!   store counted unexpired evictions. And one attempt never executes twice
//!   (the proxy must not retry upstream).
//! - (b) right response: every answer carrying an `order_id` comes from an
//!   execution of the same store, tenant, key and payload; a fresh (not
//!   replayed) answer from the execution of that very attempt.
//! - (c) replays: a replayed answer equals the status and body the upstream
//!   sent for that execution, in full, with a status the filter stores; a
//!   fresh answer equals what the upstream sent.
//! - (d) counters: per proxy (summed over its restarts), the filter's
//!   counters agree with the history, within what the history cannot see:
//!   attempts whose client left or failed (counted by the proxy, not seen by
//!   the client), requests forwarded and answered by Envoy itself (a local
//!   5xx: counted as executed, maybe never at the upstream), and counts lost
//!   when a proxy was killed after its last snapshot; `stale` against the stale
//!   answers. `failed_open` must be 0 (the soak runs `failure_mode: closed`).
//! - (e) bad keys: requests with a missing, too long or repeated key, or a
//!   repeated tenant header, are answered 400 and never executed.
//! - (f) no stale version: an entity's identity is (store, tenant, entity id), its
//!   executions' entity and version those the upstream got (`x-entity`, `x-version`).
//!   No execution of version u of an entity may reach the upstream after the history
//!   proves that a version v ≥ u had completed, by one of:
//!   1. an answer naming the applied version (`idempotent-applied-version: v`, on every
//!      stale answer): the applied version was v or more when the client got it;
//!   2. (under `on_unknown_outcome: "keep"`, the soak's) a client answered from the
//!      execution of version v with a stored status, fresh or replayed, or `409
//!      response-not-stored`, by the time its answer ended;
//!   3. (under "keep") an execution of version v wrote a stored status line, by then.
//!
//!   2 and 3 prove "completed, or the entity held": under "keep" the filter either
//!   raised the applied version to v, or (the outcome unknown: client gone, route
//!   timeout, body cut; or the settle never landed: a proxy killed, etcd down) holds the
//!   entity in flight for the TTL, which refuses every version; either way nothing at
//!   or below v starts after. As one version is in flight at a time, an execution that
//!   arrives after such a point was claimed after it (its flight, from its claim until
//!   its answer or outcome, would otherwise overlap v's). Under "release" and "hold" a
//!   flight ends while its request may still be on its way or running, so only 1
//!   counts, and only against requests begun after it. Applied versions never fall
//!   within `ordering.ttl_seconds` (longer than a run); a store that counted evicted
//!   entities (`entities_evicted`, shared data) is not checked. The same version again
//!   (the same key) is rule (a)'s: at most once per (entity, version, key).
//! - (g) one version in flight (under "keep" only): no execution of an entity reaches
//!   the upstream while an execution of another version of it is still running there
//!   (arrived, its status line not yet written), nor within the TTL after one that
//!   reset without an answer (an unknown outcome: the entity held).

use super::history::{proxy_name, Attempt, Domain, Exec, KeyForm, Outcome, MAX_KEY_LENGTH};
use crate::upstream::UpstreamFault;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    AtMostOnce,
    RightResponse,
    Replay,
    Counters,
    BadKey,
    StaleVersion,
    OneVersionInFlight,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::AtMostOnce => "(a) at most once",
            Rule::RightResponse => "(b) right scope and payload",
            Rule::Replay => "(c) replay equals the execution",
            Rule::Counters => "(d) counters agree",
            Rule::BadKey => "(e) bad keys refused",
            Rule::StaleVersion => "(f) no stale version after a newer one completed",
            Rule::OneVersionInFlight => "(g) one version of an entity in flight",
        })
    }
}

#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: Rule,
    pub at: Duration,
    pub what: String,
    /// The attempts and executions involved, one per line.
    pub excerpt: Vec<String>,
}

/// What the checker needs to know about the run.
#[derive(Debug, Clone)]
pub struct Params {
    pub ttl: Duration,
    /// `ordering.ttl_seconds` of the ordered rule.
    pub ordering_ttl: Duration,
    /// `on_unknown_outcome` is `"keep"` (the default): an unknown outcome holds its key
    /// and its entity for the TTL.
    pub keeps_unknown: bool,
    /// The store of each proxy, by index.
    pub domains: Vec<Domain>,
}

/// One proxy's counters over the run.
#[derive(Debug, Clone, Default)]
pub struct ProxyCounters {
    /// Short names (`executed`), summed over the proxy's processes.
    pub totals: BTreeMap<String, u64>,
    /// From each last snapshot to the kill after it: counts made then are lost.
    pub lost: Vec<(Duration, Duration)>,
}

impl ProxyCounters {
    pub fn get(&self, short: &str) -> u64 {
        self.totals.get(short).copied().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
pub struct Findings {
    pub violations: Vec<Violation>,
    /// Second and later executions of one identity, by the rule that allowed them.
    pub again_after_release: u64,
    pub again_after_expiry: u64,
    /// Ordered deliveries: executions checked by (f) and (g), and the completions
    /// (proofs that a version completed) they were checked against.
    pub ordered_execs: u64,
    pub completions: u64,
    /// One line per counter comparison.
    pub counter_lines: Vec<String>,
}

/// The filter's default `store_statuses`: 2xx, 3xx, 4xx except 408, 425, 429.
pub fn stored_status(status: u16) -> bool {
    (200..500).contains(&status) && !matches!(status, 408 | 425 | 429)
}

type Identity = (Domain, String, String);

fn exec_identity(e: &Exec, domain: Domain) -> Option<Identity> {
    match (e.tenants.as_slice(), e.keys.as_slice()) {
        ([t], [k]) if !k.is_empty() && k.len() <= MAX_KEY_LENGTH => {
            Some((domain, t.clone(), k.clone()))
        }
        _ => None,
    }
}

fn attempt_identity(a: &Attempt) -> Option<Identity> {
    match (&a.form, &a.key) {
        (KeyForm::Good, Some(k)) => Some((a.domain, a.tenant.clone(), k.clone())),
        _ => None,
    }
}

pub fn check(
    params: &Params,
    attempts: &[Attempt],
    execs: &[Exec],
    counters: &[ProxyCounters],
) -> Findings {
    let mut f = Findings::default();
    let by_request: HashMap<&str, &Attempt> = attempts
        .iter()
        .map(|a| (a.request_id.as_str(), a))
        .collect();
    let by_order: HashMap<u64, &Exec> = execs.iter().map(|e| (e.order_id, e)).collect();
    let mut of_identity: HashMap<Identity, Vec<&Attempt>> = HashMap::new();
    for a in attempts {
        if let Some(id) = attempt_identity(a) {
            of_identity.entry(id).or_default().push(a);
        }
    }

    // Executions: attributed to one attempt each, grouped by identity.
    let mut groups: BTreeMap<Identity, Vec<(&Exec, &Attempt)>> = BTreeMap::new();
    let mut per_request: HashMap<&str, Vec<&Exec>> = HashMap::new();
    for e in execs {
        let Some(a) = e.request_id.as_deref().and_then(|r| by_request.get(r)) else {
            f.violations.push(Violation {
                rule: Rule::AtMostOnce,
                at: e.arrived,
                what: "an execution no recorded request asked for".into(),
                excerpt: vec![e.describe()],
            });
            continue;
        };
        per_request
            .entry(a.request_id.as_str())
            .or_default()
            .push(e);
        match exec_identity(e, a.domain) {
            Some(id) => groups.entry(id).or_default().push((e, a)),
            None => f.violations.push(Violation {
                rule: Rule::BadKey,
                at: e.arrived,
                what: "a request with a missing, too long or repeated key or tenant was executed"
                    .into(),
                excerpt: vec![e.describe(), a.describe()],
            }),
        }
    }
    for (req, es) in &per_request {
        if es.len() > 1 {
            f.violations.push(Violation {
                rule: Rule::AtMostOnce,
                at: es[1].arrived,
                what: format!("attempt {req} reached the upstream {} times", es.len()),
                excerpt: es.iter().map(|e| e.describe()).collect(),
            });
        }
    }

    // (a) consecutive executions of one identity.
    for (id, list) in groups.iter_mut() {
        list.sort_by_key(|(e, _)| e.arrived);
        for w in list.windows(2) {
            let ((prev, prev_a), (next, next_a)) = (w[0], w[1]);
            let released = !stored_status(prev.status)
                && prev.fault != Some(UpstreamFault::Reset)
                && prev.head_sent.is_some_and(|h| h <= next.arrived);
            let expired = next.arrived >= prev_a.start + params.ttl;
            if released {
                f.again_after_release += 1;
            } else if expired {
                f.again_after_expiry += 1;
            } else {
                f.violations.push(Violation {
                    rule: Rule::AtMostOnce,
                    at: next.arrived,
                    what: format!(
                        "{} executed again {:.3}s after its previous execution (whose request began {:.3}s before), which was not released ({})",
                        identity_text(id),
                        (next.arrived.saturating_sub(prev.arrived)).as_secs_f64(),
                        (next.arrived.saturating_sub(prev_a.start)).as_secs_f64(),
                        match prev.fault {
                            Some(UpstreamFault::Reset) => "reset without an answer".to_string(),
                            _ if stored_status(prev.status) => format!("status {} is stored", prev.status),
                            _ => format!("its status {} was not written before", prev.status),
                        }
                    ),
                    excerpt: excerpt(
                        &[prev, next],
                        &[prev_a, next_a],
                        of_identity.get(id),
                        prev_a.start,
                        next.arrived,
                    ),
                });
            }
        }
    }
    // (a) nothing runs after a client was answered from the completed record.
    let evicting: Vec<Domain> = params
        .domains
        .iter()
        .zip(counters)
        .filter(|(_, c)| c.get("evictions_unexpired") > 0)
        .map(|(d, _)| *d)
        .collect();
    for (id, list) in &groups {
        if evicting.contains(&id.0) {
            continue;
        }
        let Some(seen) = of_identity.get(id).and_then(|atts| {
            atts.iter()
                .filter(|a| {
                    a.answer().is_some_and(|r| {
                        r.replayed || r.problem.as_deref() == Some("response-not-stored")
                    })
                })
                .min_by_key(|a| a.end)
                .copied()
        }) else {
            continue;
        };
        for (e, a) in list {
            if e.arrived > seen.end && e.arrived < seen.end + params.ttl {
                f.violations.push(Violation {
                    rule: Rule::AtMostOnce,
                    at: e.arrived,
                    what: format!(
                        "{} executed after a client had been answered from its completed record",
                        identity_text(id)
                    ),
                    excerpt: vec![
                        format!("completed record seen: {}", seen.describe()),
                        format!("later execution: {}", e.describe()),
                        format!("  by: {}", a.describe()),
                    ],
                });
            }
        }
    }

    // (b), (c), (e) per attempt.
    for a in attempts {
        let Some(ans) = a.answer() else { continue };
        if a.form != KeyForm::Good {
            if ans.status != 400 {
                f.violations.push(Violation {
                    rule: Rule::BadKey,
                    at: a.end,
                    what: format!(
                        "a {:?} request was answered {}, not 400",
                        a.form, ans.status
                    ),
                    excerpt: vec![a.describe()],
                });
            }
            continue;
        }
        let Some(order) = ans.order_id else {
            if ans.replayed {
                f.violations.push(Violation {
                    rule: Rule::Replay,
                    at: a.end,
                    what: "a replay without the execution's order id".into(),
                    excerpt: vec![a.describe()],
                });
            }
            continue;
        };
        let Some(e) = by_order.get(&order) else {
            f.violations.push(Violation {
                rule: Rule::RightResponse,
                at: a.end,
                what: format!("answered with order {order}, which no execution has"),
                excerpt: vec![a.describe()],
            });
            continue;
        };
        let cause = e.request_id.as_deref().and_then(|r| by_request.get(r));
        let same_store = cause.is_some_and(|c| c.domain == a.domain);
        let same_scope = e.tenants.len() == 1 && e.tenants[0] == a.tenant;
        let same_key = e.keys.len() == 1 && Some(&e.keys[0]) == a.key.as_ref();
        let same_payload = e.payload == a.payload;
        let own = e.request_id.as_deref() == Some(a.request_id.as_str());
        if !(same_store && same_scope && same_key && same_payload) || (!ans.replayed && !own) {
            let mut wrong = Vec::new();
            for (ok, what) in [
                (same_store, "store"),
                (same_scope, "tenant"),
                (same_key, "key"),
                (same_payload, "payload"),
                (
                    ans.replayed || own,
                    "request (a fresh answer from another request's execution)",
                ),
            ] {
                if !ok {
                    wrong.push(what);
                }
            }
            let mut ex = vec![
                format!("answer: {}", a.describe()),
                format!("execution: {}", e.describe()),
            ];
            if let Some(c) = cause {
                ex.push(format!("  by: {}", c.describe()));
            }
            f.violations.push(Violation {
                rule: Rule::RightResponse,
                at: a.end,
                what: format!("a client got the response of another {}", wrong.join(", ")),
                excerpt: ex,
            });
        }
        let equal = ans.status == e.status && ans.body_hash == e.body_hash;
        if ans.replayed && (!stored_status(e.status) || e.fault.is_some() || !equal) {
            f.violations.push(Violation {
                rule: Rule::Replay,
                at: a.end,
                what: if !stored_status(e.status) {
                    format!(
                        "replayed an execution answered {}, a status not stored",
                        e.status
                    )
                } else if e.fault.is_some() {
                    "replayed an execution whose answer was never complete".into()
                } else {
                    "the replay differs from the execution's status or body".into()
                },
                excerpt: vec![
                    format!("replay: {}", a.describe()),
                    format!("execution: {}", e.describe()),
                ],
            });
        } else if !ans.replayed && !equal {
            f.violations.push(Violation {
                rule: Rule::Replay,
                at: a.end,
                what: "a fresh answer differs from what the upstream sent".into(),
                excerpt: vec![
                    format!("answer: {}", a.describe()),
                    format!("execution: {}", e.describe()),
                ],
            });
        }
    }

    check_counters(params, attempts, execs, counters, &by_request, &mut f);
    check_ordering(params, attempts, execs, counters, &by_request, &mut f);
    f.violations.sort_by_key(|v| (v.rule, v.at));
    f
}

/// An ordered entity: store, tenant, entity id.
type EntityId = (Domain, String, String);

/// A point after which the history proves no version at or below `version` of an
/// entity may start (see (f)).
struct Completion {
    at: Duration,
    version: i64,
    /// Proof 1 (an applied version named to a client): sound under every
    /// `on_unknown_outcome`.
    applied: bool,
    line: String,
}

/// (f) and (g): the ordering guard, per entity.
fn check_ordering(
    params: &Params,
    attempts: &[Attempt],
    execs: &[Exec],
    counters: &[ProxyCounters],
    by_request: &HashMap<&str, &Attempt>,
    f: &mut Findings,
) {
    let evicting: Vec<Domain> = params
        .domains
        .iter()
        .zip(counters)
        .filter(|(_, c)| c.get("entities_evicted") > 0)
        .map(|(d, _)| *d)
        .collect();
    let by_order: HashMap<u64, &Exec> = execs.iter().map(|e| (e.order_id, e)).collect();
    // Executions of each entity (with the attempt that caused each), in arrival order.
    let mut runs: BTreeMap<EntityId, Vec<(&Exec, &Attempt, i64)>> = BTreeMap::new();
    for e in execs {
        let (Some(entity), Some(version), [tenant]) =
            (e.entity.as_ref(), e.version, e.tenants.as_slice())
        else {
            continue;
        };
        let Some(a) = e.request_id.as_deref().and_then(|r| by_request.get(r)) else {
            continue;
        };
        runs.entry((a.domain, tenant.clone(), entity.clone()))
            .or_default()
            .push((e, a, version));
    }
    let mut proofs: BTreeMap<EntityId, Vec<Completion>> = BTreeMap::new();
    let mut tried: BTreeMap<EntityId, Vec<&Attempt>> = BTreeMap::new();
    for a in attempts {
        let (Some((entity, version)), KeyForm::Good) = (&a.ordered, &a.form) else {
            continue;
        };
        let id = (a.domain, a.tenant.clone(), entity.clone());
        tried.entry(id.clone()).or_default().push(a);
        let Some(ans) = a.answer() else { continue };
        if let Some(applied) = ans.applied_version {
            proofs.entry(id.clone()).or_default().push(Completion {
                at: a.end,
                version: applied,
                applied: true,
                line: format!("answer naming applied version {applied}: {}", a.describe()),
            });
        }
        let own_or_replayed = ans
            .order_id
            .and_then(|o| by_order.get(&o))
            .is_some_and(|e| {
                ans.replayed || e.request_id.as_deref() == Some(a.request_id.as_str())
            });
        let completed = (stored_status(ans.status) && own_or_replayed)
            || ans.problem.as_deref() == Some("response-not-stored");
        if params.keeps_unknown && completed {
            proofs.entry(id).or_default().push(Completion {
                at: a.end,
                version: *version,
                applied: false,
                line: format!("client answered from a completed version: {}", a.describe()),
            });
        }
    }
    if params.keeps_unknown {
        for (id, list) in &runs {
            for (e, _, version) in list {
                if let (Some(h), true, false) = (
                    e.head_sent,
                    stored_status(e.status),
                    e.fault == Some(UpstreamFault::Reset),
                ) {
                    proofs.entry(id.clone()).or_default().push(Completion {
                        at: h,
                        version: *version,
                        applied: false,
                        line: format!("execution answered a stored status: {}", e.describe()),
                    });
                }
            }
        }
    }
    for (id, list) in runs.iter_mut() {
        list.sort_by_key(|(e, _, _)| e.arrived);
        f.ordered_execs += list.len() as u64;
        let mut none = Vec::new();
        let done = proofs.get_mut(id).unwrap_or(&mut none);
        done.sort_by_key(|c| c.at);
        f.completions += done.len() as u64;
        if evicting.contains(&id.0) {
            continue;
        }
        let around = |from: Duration, to: Duration| -> Vec<String> {
            let mut out = Vec::new();
            for (e, _, _) in list
                .iter()
                .filter(|(e, _, _)| e.arrived + Duration::from_secs(1) >= from && e.arrived <= to)
            {
                out.push(format!("  execution: {}", e.describe()));
            }
            let mut atts: Vec<&&Attempt> = tried
                .get(id)
                .map(|v| {
                    v.iter()
                        .filter(|a| a.end + Duration::from_secs(1) >= from && a.start <= to)
                        .collect()
                })
                .unwrap_or_default();
            atts.sort_by_key(|a| a.start);
            for a in atts.iter().take(16) {
                out.push(format!("  attempt: {}", a.describe()));
            }
            out
        };
        // (f) nothing at or below a completed version after it completed.
        for (e, a, version) in list.iter() {
            if e.arrived >= params.ordering_ttl {
                continue;
            }
            let proof = done.iter().find(|c| {
                c.version >= *version
                    && if params.keeps_unknown {
                        e.arrived > c.at
                    } else {
                        c.applied && a.start > c.at
                    }
            });
            let Some(c) = proof else { continue };
            let mut excerpt = vec![
                format!("completed: {}", c.line),
                format!("later execution: {}", e.describe()),
                format!("  by: {}", a.describe()),
            ];
            excerpt.extend(around(c.at, e.arrived));
            f.violations.push(Violation {
                rule: Rule::StaleVersion,
                at: e.arrived,
                what: format!(
                    "{}: version {version} reached the upstream {:.3}s after version {} had completed",
                    entity_text(id),
                    e.arrived.saturating_sub(c.at).as_secs_f64(),
                    c.version
                ),
                excerpt,
            });
        }
        // (g) no execution while another version's runs, or after one reset unanswered.
        if !params.keeps_unknown {
            continue;
        }
        for (i, (e, a, version)) in list.iter().enumerate() {
            let before = list[..i].iter().find(|(x, xa, xv)| {
                xv != version
                    && match x.head_sent {
                        None => {
                            x.fault == Some(UpstreamFault::Reset)
                                && e.arrived < xa.start + params.ttl
                        }
                        Some(h) => e.arrived < h,
                    }
            });
            let Some((x, xa, xv)) = before else { continue };
            let mut excerpt = vec![
                format!("execution: {}", x.describe()),
                format!("  by: {}", xa.describe()),
                format!("execution: {}", e.describe()),
                format!("  by: {}", a.describe()),
            ];
            excerpt.extend(around(x.arrived, e.arrived));
            f.violations.push(Violation {
                rule: Rule::OneVersionInFlight,
                at: e.arrived,
                what: format!(
                    "{}: version {version} reached the upstream {:.3}s after version {xv}, {}",
                    entity_text(id),
                    e.arrived.saturating_sub(x.arrived).as_secs_f64(),
                    match x.head_sent {
                        None => "which reset without an answer (its outcome unknown: the entity is held)"
                            .to_string(),
                        Some(h) => format!(
                            "still running there (its status line {:.3}s later)",
                            h.saturating_sub(e.arrived).as_secs_f64()
                        ),
                    }
                ),
                excerpt,
            });
        }
    }
}

fn entity_text(id: &EntityId) -> String {
    format!(
        "{} tenant {} entity {}",
        match id.0 {
            Domain::Etcd => "etcd store",
            Domain::SharedData => "shared-data store",
        },
        id.1,
        id.2
    )
}

/// (d): the filter's counters against the history, per proxy.
fn check_counters(
    params: &Params,
    attempts: &[Attempt],
    execs: &[Exec],
    counters: &[ProxyCounters],
    by_request: &HashMap<&str, &Attempt>,
    f: &mut Findings,
) {
    for (p, c) in counters.iter().enumerate().take(params.domains.len()) {
        let mine: Vec<&Attempt> = attempts.iter().filter(|a| a.proxy == p).collect();
        let lost = mine
            .iter()
            .filter(|a| {
                c.lost
                    .iter()
                    .any(|(from, to)| a.start <= *to && a.end >= *from)
            })
            .count() as u64;
        let unanswered = mine.iter().filter(|a| a.answer().is_none()).count() as u64;
        let count =
            |pred: &dyn Fn(&Attempt) -> bool| mine.iter().filter(|a| pred(a)).count() as u64;
        let problem = |a: &Attempt, slug: &str| {
            a.answer()
                .is_some_and(|r| r.problem.as_deref() == Some(slug))
        };
        let executions = execs
            .iter()
            .filter(|e| {
                e.request_id
                    .as_deref()
                    .and_then(|r| by_request.get(r))
                    .is_some_and(|a| a.proxy == p)
            })
            .count() as u64;
        let bad_keys = count(&|a| {
            a.answer().is_some_and(|r| r.status == 400)
                && matches!(
                    a.answer().and_then(|r| r.problem.as_deref()),
                    Some(
                        "missing-key"
                            | "invalid-key"
                            | "ambiguous-key"
                            | "ambiguous-scope"
                            | "ambiguous-payload"
                    )
                )
        });
        // Forwarded, then answered by Envoy itself (connect failure, upstream
        // reset, route timeout): counted as executed whether or not the
        // upstream got it.
        let local_5xx = count(&|a| {
            a.answer()
                .is_some_and(|r| r.status >= 500 && r.order_id.is_none() && r.problem.is_none())
        });
        // (name, seen in the history, counter, how many more it may count)
        let rows: Vec<(&str, u64, u64, u64)> = vec![
            // An answered attempt was seen by the filter; an unanswered one may not
            // have been (refused while the proxy restarted).
            (
                "requests",
                mine.len() as u64 - unanswered,
                c.get("requests"),
                0,
            ),
            ("executed", executions, c.get("executed"), local_5xx),
            (
                "replayed",
                count(&|a| a.answer().is_some_and(|r| r.replayed)),
                c.get("replayed"),
                0,
            ),
            (
                "rejected_in_flight",
                count(&|a| problem(a, "in-flight")),
                c.get("rejected_in_flight"),
                0,
            ),
            (
                "rejected_outcome_unknown",
                count(&|a| problem(a, "outcome-unknown")),
                c.get("rejected_outcome_unknown"),
                0,
            ),
            (
                "payload_mismatch",
                count(&|a| problem(a, "payload-mismatch")),
                c.get("payload_mismatch"),
                0,
            ),
            ("bad_key", bad_keys, c.get("bad_key"), 0),
            (
                "stale",
                count(&|a| {
                    a.answer()
                        .is_some_and(|r| r.stale || problem_is(r, "stale-version"))
                }),
                c.get("stale"),
                0,
            ),
        ];
        let name = proxy_name(p);
        for (what, seen, counted, local) in rows {
            // A counted event the client never saw: it left, or its connection failed.
            // A seen event not counted: counted by a process killed after its snapshot.
            let ok = seen <= counted + lost && counted <= seen + unanswered + local;
            f.counter_lines.push(format!(
                "{name} {what}: counter {counted}, history {seen} (unanswered {unanswered}{}, lost in restarts {lost}) {}",
                if local > 0 {
                    format!(", local 5xx {local}")
                } else {
                    String::new()
                },
                if ok { "ok" } else { "MISMATCH" }
            ));
            if !ok {
                f.violations.push(Violation {
                    rule: Rule::Counters,
                    at: Duration::ZERO,
                    what: format!(
                        "proxy {name}: counter {what} is {counted}, the history has {seen} (allowed: {}..={})",
                        seen.saturating_sub(lost),
                        seen + unanswered + local
                    ),
                    excerpt: Vec::new(),
                });
            }
        }
        let failed_open = c.get("failed_open");
        if failed_open > 0 {
            f.violations.push(Violation {
                rule: Rule::Counters,
                at: Duration::ZERO,
                what: format!(
                    "proxy {name}: failed_open is {failed_open} under failure_mode closed"
                ),
                excerpt: Vec::new(),
            });
        }
        let stored_answers = count(&|a| problem(a, "response-not-stored"));
        if stored_answers > c.get("response_not_stored") + lost {
            f.violations.push(Violation {
                rule: Rule::Counters,
                at: Duration::ZERO,
                what: format!(
                    "proxy {name}: {stored_answers} answers 409 response-not-stored, counter response_not_stored {}",
                    c.get("response_not_stored")
                ),
                excerpt: Vec::new(),
            });
        }
    }
}

fn identity_text(id: &Identity) -> String {
    format!(
        "{} tenant {} key {}",
        match id.0 {
            Domain::Etcd => "etcd store",
            Domain::SharedData => "shared-data store",
        },
        id.1,
        id.2
    )
}

/// Both executions, their attempts, and every attempt of the identity in between.
fn excerpt(
    execs: &[&Exec],
    causes: &[&Attempt],
    all: Option<&Vec<&Attempt>>,
    from: Duration,
    to: Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    for (e, a) in execs.iter().zip(causes) {
        out.push(format!("execution: {}", e.describe()));
        out.push(format!("  by: {}", a.describe()));
    }
    if let Some(all) = all {
        let mut around: Vec<&&Attempt> = all
            .iter()
            .filter(|a| a.end >= from && a.start <= to + Duration::from_secs(1))
            .collect();
        around.sort_by_key(|a| a.start);
        for a in around.iter().take(12) {
            out.push(format!("  attempt: {}", a.describe()));
        }
    }
    out
}

fn problem_is(r: &super::history::Answer, slug: &str) -> bool {
    r.problem.as_deref() == Some(slug)
}

/// Outcome counts for the figures.
pub fn tally(attempts: &[Attempt]) -> BTreeMap<String, u64> {
    let mut t = BTreeMap::new();
    let mut add = |k: String| *t.entry(k).or_insert(0) += 1;
    for a in attempts {
        match &a.outcome {
            Outcome::Answered(r) => {
                let what = match (r.status, r.replayed, r.problem.as_deref(), r.order_id) {
                    (s, false, None, None) if r.stale => format!("{s} stale (acknowledged)"),
                    (s, true, _, _) => format!("{s} replayed"),
                    (s, false, _, Some(_)) if s < 300 => format!("{s} executed"),
                    (s, false, _, Some(_)) => format!("{s} from the upstream"),
                    (s, false, Some(p), None) => format!("{s} {p}"),
                    (s, false, None, None) => format!("{s} from Envoy"),
                };
                add(what);
            }
            Outcome::GaveUp { reset: true } => add("gave up (reset)".into()),
            Outcome::GaveUp { reset: false } => add("gave up (close)".into()),
            Outcome::Failed(_) => add("no answer (connection failed)".into()),
        }
    }
    t
}

#[cfg(test)]
mod tests;
