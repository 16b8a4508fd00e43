//! The reference model of the contract: which local replies a request may get, and the one it must get when the model knows the state.

use super::*;

impl World {
    /// A local reply to a valid request: allowed by the contract, and the one it demands
    /// when the model knows the state for certain.
    pub(super) fn check_reply(&mut self, i: usize, r: &LocalReply) -> Result<(), String> {
        let (scope, key, payload, w, faulted) = {
            let x = &self.sims[i];
            (x.scope, x.key, x.payload, x.worker, x.faulted)
        };
        let others: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.stream != i && a.scope == scope && a.key == key)
            .collect();
        let same = others.iter().any(|a| a.payload == payload);
        let other_payload = others
            .iter()
            .any(|a| mismatch_of(a.payload, payload) == Some("422"));
        let other_caller = others
            .iter()
            .any(|a| mismatch_of(a.payload, payload) == Some("422 principal"));
        if let Some(v) = r.header("idempotent-replayed") {
            if v != b"true" {
                return Err(format!("stream {i}: replayed header {v:?}"));
            }
            if self.knobs.reject {
                return Err(format!("stream {i}: replayed under on_duplicate reject"));
            }
            // The x-exec header names the execution whose response this is.
            let Some(n) = r
                .header("x-exec")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
            else {
                return Err(format!(
                    "stream {i}: a replay without its execution's headers: {r:?}"
                ));
            };
            let Some(e) = self.execs.get(n) else {
                return Err(format!(
                    "stream {i}: replayed execution {n}, which never ran"
                ));
            };
            if (e.scope, e.key, e.payload) != (scope, key, payload) {
                return Err(format!(
                    "stream {i}: scope {scope} key {key} payload {payload} got the replay of execution {n} (scope {} key {} payload {})",
                    e.scope, e.key, e.payload
                ));
            }
            let ExecState::Completed {
                stored: Some(want), ..
            } = &e.state
            else {
                return Err(format!(
                    "stream {i}: replayed execution {n}, which has no stored response ({:?})",
                    e.state
                ));
            };
            let mut headers = want.headers.clone();
            headers.push(("idempotent-replayed".into(), b"true".to_vec()));
            // The record's times (`advertise_expiry`) are the filter's, not the stored
            // response's: checked below where the model knows them.
            let mut got = r.headers.clone();
            got.retain(|(n, _)| n != crate::reply::EXPIRES_HEADER && n != "age");
            if (r.status, &got, &r.body) != (want.status, &headers, &want.body) {
                return Err(format!(
                    "stream {i}: replay {} {:?} {:?} differs from execution {n}'s stored {} {:?} {:?}",
                    r.status,
                    r.headers,
                    String::from_utf8_lossy(&r.body),
                    want.status,
                    headers,
                    String::from_utf8_lossy(&want.body)
                ));
            }
            // Shared data, completed for certain: the record expires TTL_MS after the
            // completion (by the completing worker's clock), and the replay says so and
            // how old it is, by the replaying worker's clock; never a date already past,
            // never a negative age.
            if let ExecState::Completed {
                expires,
                sure: true,
                ..
            } = &e.state
            {
                if self.knobs.store == StoreKind::Shared {
                    let now = self.now + self.skew(w);
                    let want_expires =
                        (*expires > now).then(|| crate::httpdate::imf_fixdate_ceil_ms(*expires));
                    let done = expires - TTL_MS;
                    let want_age = (done <= now).then(|| ((now - done) / 1000).to_string());
                    let text = |name: &str| {
                        r.header(name)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    };
                    let got = (text(crate::reply::EXPIRES_HEADER), text("age"));
                    if got != (want_expires.clone(), want_age.clone()) {
                        return Err(format!(
                            "stream {i}: replay of execution {n} advertises {got:?}, not {:?}",
                            (want_expires, want_age)
                        ));
                    }
                }
            }
        } else {
            let slug = problem_slug(r);
            let allowed = match slug.as_str() {
                "payload-mismatch" => other_payload,
                "principal-mismatch" => other_caller,
                "in-flight" => {
                    let ok = r
                        .header("retry-after")
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                        .is_some_and(|s| (1..=IN_FLIGHT_MS / 1000 + 4).contains(&s));
                    if !ok {
                        return Err(format!(
                            "stream {i}: 409 with retry-after {:?}",
                            r.header("retry-after")
                        ));
                    }
                    same
                }
                "response-not-stored" => self.execs_of(scope, key).any(|(_, e)| {
                    e.payload == payload
                        && matches!(e.state, ExecState::Completed { stored: None, .. })
                }),
                "already-completed" => {
                    self.knobs.reject
                        && self.execs_of(scope, key).any(|(_, e)| {
                            e.payload == payload && matches!(e.state, ExecState::Completed { .. })
                        })
                }
                "outcome-unknown" => {
                    if r.header("retry-after").is_some() {
                        return Err(format!("stream {i}: outcome-unknown with retry-after"));
                    }
                    // A claim kept until its TTL whose stream ended without an outcome,
                    // or never settled it (still running past its in-flight time, a
                    // completion that may not have reached the store).
                    self.knobs.unknown == Unknown::Keep
                        && (self.execs_of(scope, key).any(|(_, e)| {
                            // Released, unless that release may not have reached the
                            // store (a call out, or one a fault touched).
                            let first = &self.sims[e.stream];
                            e.payload == payload
                                && (!matches!(e.state, ExecState::Released)
                                    || first.faulted
                                    || first.call.is_some())
                        }) || self.orphan_claim(i, scope, key, payload))
                }
                "store-unavailable" => self.knobs.closed && faulted,
                _ => false,
            };
            if !allowed {
                return Err(format!(
                    "stream {i}: scope {scope} key {key} payload {payload} answered {} {slug}, which the history does not allow",
                    r.status
                ));
            }
        }
        Ok(())
    }

    /// Another stream of this identity whose claim etcd applied while a fault kept it
    /// from knowing: a record of its claim may stand, kept until its TTL, that no
    /// stream will settle.
    fn orphan_claim(&self, i: usize, scope: u8, key: u8, payload: u8) -> bool {
        self.sims.iter().enumerate().any(|(j, x)| {
            j != i
                && (x.scope, x.key, x.payload) == (scope, key, payload)
                && (x.faulted || x.zombie)
                && x.claim_applied
        })
    }

    /// What the contract demands when the model knows the state for certain: a fresh
    /// key runs; a live claim answers 409 or 422; a completed one replays.
    pub(super) fn demanded(&self, i: usize) -> Option<String> {
        let x = &self.sims[i];
        if x.faulted || x.bad.is_some() {
            return None;
        }
        let clock = self.now + self.skew(x.worker);
        let others: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.stream != i && a.scope == x.scope && a.key == x.key)
            .collect();
        if others.is_empty() {
            return Some("executed".into());
        }
        // A kept record whose hold may still stand, though not for certain: the filter
        // keeps it `ttl` from the hold, which may come after the claim's own end, while
        // a claim under another shared-data layout ran beside it. Either may answer.
        let mut shadowed = false;
        // An execution still running within its in-flight time.
        for (n, e) in self.execs_of(x.scope, x.key) {
            // Its record still reads as in flight by this reader's clock (past its
            // in-flight end, a kept claim reads as an unknown outcome).
            let running = matches!(e.state, ExecState::Running | ExecState::Held)
                && self.now < e.forward_at + IN_FLIGHT_MS
                && (self.knobs.unknown != Unknown::Keep || clock < e.claim_ends);
            if running {
                if shadowed {
                    return None;
                }
                return Some(if let Some(m) = mismatch_of(e.payload, x.payload) {
                    format!("{m} (execution {n} in flight)")
                } else {
                    format!("409 in-flight (execution {n})")
                });
            }
            if let ExecState::Kept { at } = e.state {
                // Only once its hold has certainly reached the store: until then (a hold
                // call out, or one a fault touched) the record may still read as the
                // claim in flight.
                let first = &self.sims[e.stream];
                let held = first.call.is_none() && !first.faulted;
                if held && self.now + IN_FLIGHT_MS < at.min(e.forward_at) + TTL_MS {
                    return Some(if let Some(m) = mismatch_of(e.payload, x.payload) {
                        format!("{m} (execution {n} outcome unknown)")
                    } else {
                        format!("409 outcome-unknown (execution {n})")
                    });
                }
                shadowed |= self.now < at.saturating_add(TTL_MS + IN_FLIGHT_MS);
            }
        }
        if shadowed {
            return None;
        }
        // The last execution completed for certain, nothing tried the key since, and it
        // has not expired by this reader's clock (a clock ahead may see it expire early).
        let (n, e) = self.execs_of(x.scope, x.key).last()?;
        if let ExecState::Completed {
            stored,
            expires,
            sure: true,
        } = &e.state
        {
            let tried_since = others.iter().any(|a| a.at > e.forward_at);
            if !tried_since && clock < *expires {
                return Some(if let Some(m) = mismatch_of(e.payload, x.payload) {
                    format!("{m} (execution {n} completed)")
                } else if stored.is_none() {
                    format!("409 response-not-stored (execution {n})")
                } else if self.knobs.reject {
                    format!("409 already-completed (execution {n})")
                } else {
                    format!("replay of execution {n}")
                });
            }
        }
        None
    }

    pub(super) fn check_demand(
        &self,
        i: usize,
        demand: Option<String>,
        got: &Decision,
    ) -> Result<(), String> {
        let Some(d) = demand else { return Ok(()) };
        let ok = match got {
            Decision::Continue => d == "executed" && self.sims[i].s.holds_claim(),
            Decision::Reply(r) => {
                let slug = problem_slug(r);
                if d.starts_with("replay of execution ") {
                    let n = d.trim_start_matches("replay of execution ");
                    r.header("x-exec") == Some(n.as_bytes())
                        && r.header("idempotent-replayed").is_some()
                } else if d.starts_with("422 principal") {
                    slug == "principal-mismatch"
                } else if d.starts_with("422") {
                    slug == "payload-mismatch"
                } else if d.starts_with("409 in-flight") {
                    slug == "in-flight"
                } else if d.starts_with("409 outcome-unknown") {
                    slug == "outcome-unknown"
                } else if d.starts_with("409 already-completed") {
                    slug == "already-completed"
                } else if d.starts_with("409 response-not-stored") {
                    slug == "response-not-stored"
                } else {
                    false
                }
            }
            Decision::Pause | Decision::Call(_) => true,
            // The model runs no detached execution.
            Decision::Upstream(_) => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "stream {i}: the contract demands {d}, the filter decided {}",
                short(got)
            ))
        }
    }
}
