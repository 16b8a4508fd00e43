//! The reference model of the ordering guard, from the documented rules (fields.md, the
//! `ordering.*`, `on_unknown_outcome`, `in_flight_timeout_seconds` and `failure_mode`
//! rows), and the checks of every step against it.
//!
//! Per key, the record (deduplication comes first): claimed while its request runs
//! (`409 in-flight` for its in-flight time; past it, under `"keep"`, `409
//! outcome-unknown` until the claim's TTL), completed (replayed until its TTL), kept
//! after an unknown outcome (`"keep"`: `409 outcome-unknown` until the TTL from then),
//! held (`"hold"`: `409 in-flight` until the in-flight time from the claim), or free.
//!
//! Per entity: the applied version (a completion raises it when it is above the live
//! one, for `ordering.ttl_seconds` from that completion; a release or a hold never
//! does), and the one flight: claimed with the record for as long as a record's claim
//! lives, ended by its request's settling, held on an unknown outcome like its record
//! (`"keep"`: until the TTL from then; `"hold"`: until the claim's own end; `"release"`:
//! released). A free record then: another version's live flight gives `409 in-flight`
//! (`retry-after`: the hold's end, else `retry_after_seconds`), a version at or below the
//! live applied one `409 stale-version`, else the request is forwarded.
//!
//! Faults: a key or entity a fault touched (a write that may or may not have landed) is
//! unknown to the model until everything written then must have expired; meanwhile its
//! answers are only checked for being possible. Under a fault `failure_mode: "closed"`
//! may answer `503 store-unavailable`; `"open"` may forward without a record claim, or
//! with one but unordered: such a request holds no flight (it is exempt from the
//! ordering checks, and blocks nothing), and its completion raises the applied version
//! like any other.

use super::*;
use crate::stores::shared::SharedEntities;

/// How a forwarded request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Completed,
    Released,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Rec {
    #[default]
    Free,
    Running {
        stream: usize,
        at: u64,
    },
    Completed {
        exec: usize,
        until: u64,
    },
    Kept {
        until: u64,
    },
    Held {
        until: u64,
    },
}

/// What a record answers now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecView {
    Free,
    InFlight,
    OutcomeUnknown,
    Replay(usize),
}

#[derive(Debug, Default)]
pub(super) struct Keyed {
    rec: Rec,
    /// Unknown to the model until then.
    unsure_until: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flight {
    stream: usize,
    version: u8,
    until: u64,
    held: bool,
}

#[derive(Debug, Default)]
pub(super) struct Ent {
    applied: Option<(u8, u64)>,
    flight: Option<Flight>,
    unsure_until: Option<u64>,
    /// Known again after a fault: the store may keep an expired flight the model does not
    /// know, which its stream's hold could bring back.
    flight_unknown: bool,
    /// The store's live applied version (and its end) as last read.
    seen: Option<(u8, u64)>,
}

/// What an entity answers a free record's request of some version now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EntView {
    Free,
    Busy { held_until: Option<u64> },
    Stale { applied: u8 },
}

type StoreView = (Option<(u8, u64)>, Option<(u8, u64, bool)>);

impl World {
    /// How long a record's claim (and its entity's flight) lives.
    fn claim_ms(&self) -> u64 {
        if self.knobs.unknown == Unknown::Keep {
            TTL_MS.max(IN_FLIGHT_MS)
        } else {
            IN_FLIGHT_MS
        }
    }

    fn rec_view(&self, d: Delivery) -> Option<RecView> {
        let Some(k) = self.recs.get(&d) else {
            return Some(RecView::Free);
        };
        if k.unsure_until.is_some() {
            return None;
        }
        let now = self.now;
        let keep = self.knobs.unknown == Unknown::Keep;
        Some(match k.rec {
            Rec::Running { at, .. } if now < at + IN_FLIGHT_MS => RecView::InFlight,
            Rec::Running { at, .. } if keep && now < at + self.claim_ms() => {
                RecView::OutcomeUnknown
            }
            Rec::Completed { exec, until } if now < until => RecView::Replay(exec),
            Rec::Kept { until } if now < until => RecView::OutcomeUnknown,
            Rec::Held { until } if now < until => RecView::InFlight,
            _ => RecView::Free,
        })
    }

    fn ent_view(&self, e: u8, v: u8) -> Option<EntView> {
        let x = &self.ents[e as usize];
        if x.unsure_until.is_some() {
            return None;
        }
        if let Some(f) = x.flight.filter(|f| f.until > self.now) {
            return Some(EntView::Busy {
                held_until: f.held.then_some(f.until),
            });
        }
        match x.applied {
            Some((a, until)) if until > self.now && v <= a => Some(EntView::Stale { applied: a }),
            _ => Some(EntView::Free),
        }
    }

    /// A write to the key's record may or may not have landed.
    fn unsure_key(&mut self, d: Delivery) {
        let until = self.now + TTL_MS + 2 * IN_FLIGHT_MS;
        let k = self.recs.entry(d).or_default();
        k.unsure_until = Some(k.unsure_until.map_or(until, |u| u.max(until)));
    }

    /// The same for an entity.
    fn unsure_entity(&mut self, e: u8) {
        let until = self.now + self.knobs.order_ttl_ms + 2 * TTL_MS + IN_FLIGHT_MS;
        let x = &mut self.ents[e as usize];
        x.unsure_until = Some(x.unsure_until.map_or(until, |u| u.max(until)));
    }

    fn set_rec(&mut self, d: Delivery, rec: Rec) {
        if self.recs.get(&d).is_some_and(|k| k.unsure_until.is_some()) {
            self.unsure_key(d);
        } else {
            self.recs.entry(d).or_default().rec = rec;
        }
    }

    /// Unknown keys and entities whose writes must all have expired are known again.
    pub(super) fn forget_unsure(&mut self) {
        let now = self.now;
        for k in self.recs.values_mut() {
            if k.unsure_until.is_some_and(|u| u <= now) {
                *k = Keyed::default();
            }
        }
        for x in &mut self.ents {
            if x.unsure_until.is_some_and(|u| u <= now) {
                x.applied = None;
                x.flight = None;
                x.unsure_until = None;
                x.flight_unknown = true;
            }
        }
    }

    fn completed_version(&self, e: u8, v: u8) -> bool {
        self.execs.iter().any(|x| {
            x.d.0 == e
                && x.d.1 == v
                && x.completed
                && self.sims[x.stream].forwarded.is_some_and(|f| f.1 || f.2)
        })
    }

    fn classify(&mut self, i: usize, r: &LocalReply) -> Result<Got, String> {
        if r.header("idempotent-replayed").is_some() {
            return r
                .header("x-exec")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .map(Got::Replay)
                .ok_or_else(|| format!("stream {i}: a replay of no execution: {r:?}"));
        }
        let header =
            |n: &str| -> Option<u64> { std::str::from_utf8(r.header(n)?).ok()?.parse().ok() };
        let (slug, detail) = problem(r);
        Ok(match (r.status, slug.as_str()) {
            (409, "in-flight") if detail.contains("of this entity") => Got::EntBusy {
                retry: header("retry-after")
                    .ok_or_else(|| format!("stream {i}: 409 in-flight without retry-after"))?,
            },
            (409, "in-flight") => Got::RecInFlight,
            (409, "outcome-unknown") => Got::RecUnknown,
            (409, "stale-version") => {
                self.seen_stale += 1;
                let applied = header("idempotent-applied-version")
                    .and_then(|a| u8::try_from(a).ok())
                    .ok_or_else(|| format!("stream {i}: stale without its applied version"))?;
                Got::Stale { applied }
            }
            (503, "store-unavailable") => Got::Unavailable,
            _ => {
                return Err(format!(
                    "stream {i}: answered {} {slug} ({detail}), which no rule gives",
                    r.status
                ))
            }
        })
    }

    /// The one answer the rules give when the model knows the key and the entity.
    fn expected(&self, d: Delivery) -> Option<Got> {
        let (e, v, _) = d;
        Some(match self.rec_view(d)? {
            RecView::Replay(n) => Got::Replay(n),
            RecView::InFlight => Got::RecInFlight,
            RecView::OutcomeUnknown => Got::RecUnknown,
            RecView::Free => match self.ent_view(e, v)? {
                EntView::Busy { held_until } => Got::EntBusy {
                    retry: held_until.map_or(1, |u| (u - self.now).div_ceil(1000).max(1)),
                },
                EntView::Stale { applied } => Got::Stale { applied },
                EntView::Free => Got::Forward {
                    claimed: true,
                    ordered: true,
                },
            },
        })
    }

    /// A request's answer: the one demanded when the model knows the state and no fault
    /// struck, else one the rules make possible.
    fn check_answer(&self, i: usize, got: &Got, fault: Fault) -> Result<(), String> {
        let d = self.sims[i].d;
        let (e, v, _) = d;
        let faulted = fault != Fault::None;
        if !faulted {
            if let Some(want) = self.expected(d) {
                if *got != want {
                    return Err(format!(
                        "stream {i}: the rules demand {want:?}, the filter decided {got:?}"
                    ));
                }
                return Ok(());
            }
        }
        let rec = self.rec_view(d);
        let ent = self.ent_view(e, v);
        let rec_is = |want: RecView| rec.is_none_or(|r| r == want);
        let ok = match *got {
            Got::Forward {
                claimed: false,
                ordered: _,
            } => faulted && !self.knobs.closed,
            Got::Forward {
                claimed: true,
                ordered: false,
            } => faulted && !self.knobs.closed && rec_is(RecView::Free),
            Got::Forward { .. } => rec_is(RecView::Free) && ent.is_none_or(|x| x == EntView::Free),
            Got::Replay(n) => match rec {
                Some(r) => r == RecView::Replay(n),
                None => self.execs.get(n).is_some_and(|x| x.d == d && x.completed),
            },
            Got::RecInFlight => rec_is(RecView::InFlight),
            Got::RecUnknown => {
                rec_is(RecView::OutcomeUnknown)
                    && (rec.is_some() || self.knobs.unknown == Unknown::Keep)
            }
            Got::EntBusy { .. } => {
                rec_is(RecView::Free) && ent.is_none_or(|x| matches!(x, EntView::Busy { .. }))
            }
            Got::Stale { applied } => {
                rec_is(RecView::Free)
                    && applied >= v
                    && match ent {
                        Some(x) => x == EntView::Stale { applied },
                        None => self.completed_version(e, applied),
                    }
            }
            Got::Unavailable => faulted && self.knobs.closed,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "stream {i}: entity {e} version {v} key {} answered {got:?}, which the history does not allow (record {rec:?}, entity {ent:?}, fault {fault:?})",
                d.2
            ))
        }
    }

    /// The safety rules, whatever the model knows: no version at or below a live applied
    /// one is forwarded, nor while another version of its entity is forwarded and not
    /// settled (or held after an unknown outcome), but once that flight expired.
    fn check_forward(&self, i: usize) -> Result<(), String> {
        let (e, v, _) = self.sims[i].d;
        let now = self.now;
        let x = &self.ents[e as usize];
        if x.unsure_until.is_none() {
            if let Some((a, until)) = x.applied.filter(|a| a.1 > now) {
                if v <= a {
                    return Err(format!(
                        "stream {i}: version {v} of entity {e} forwarded though version {a} is applied until t+{} (the model)",
                        until - START_MS
                    ));
                }
            }
        }
        if let Some((a, until)) = x.seen.filter(|a| a.1 > now) {
            if v <= a {
                return Err(format!(
                    "stream {i}: version {v} of entity {e} forwarded though the store showed version {a} applied until t+{}",
                    until - START_MS
                ));
            }
        }
        let claim_ms = self.claim_ms();
        for (j, y) in self.sims.iter().enumerate() {
            let Some((at, _, true)) = y.forwarded else {
                continue;
            };
            if j == i || y.d.0 != e {
                continue;
            }
            let until = match y.life {
                Life::Executing => Some(at + claim_ms),
                Life::Unknown { at: end, clean } => match self.knobs.unknown {
                    Unknown::Keep if clean && end < at + claim_ms => {
                        Some((at + claim_ms).max(end + TTL_MS))
                    }
                    Unknown::Keep | Unknown::Hold => Some(at + claim_ms),
                    Unknown::Release => None,
                },
                _ => None,
            };
            if let Some(until) = until.filter(|u| *u > now) {
                return Err(format!(
                    "stream {i}: version {v} of entity {e} forwarded while stream {j} (version {}, forwarded at t+{}, {:?}) holds the entity until t+{}",
                    y.d.1,
                    at - START_MS,
                    y.life,
                    until - START_MS
                ));
            }
        }
        Ok(())
    }

    /// A request's decision (or a racing request's, which came first).
    pub(super) fn decided(
        &mut self,
        i: usize,
        decision: Decision,
        fault: Fault,
        failed_open: bool,
    ) -> Result<(), String> {
        let got = match &decision {
            Decision::Continue => Got::Forward {
                claimed: self.sims[i].s.holds_claim(),
                ordered: !failed_open,
            },
            Decision::Reply(r) => self.classify(i, r)?,
            other => return Err(format!("stream {i}: decided {other:?}")),
        };
        self.log(format!("stream {i}: {got:?}"));
        self.check_answer(i, &got, fault)?;
        let (d, now) = (self.sims[i].d, self.now);
        match got {
            Got::Forward { claimed, ordered } => {
                if ordered {
                    self.check_forward(i)?;
                }
                let n = self.execs.len();
                self.execs.push(Exec {
                    stream: i,
                    d,
                    completed: false,
                });
                let x = &mut self.sims[i];
                x.exec = Some(n);
                x.life = Life::Executing;
                x.forwarded = Some((now, claimed, ordered));
                if claimed {
                    self.seen_executed += 1;
                    self.set_rec(d, Rec::Running { stream: i, at: now });
                }
                if ordered {
                    let flight = Flight {
                        stream: i,
                        version: d.1,
                        until: now + self.claim_ms(),
                        held: false,
                    };
                    let (_, in_store) = self.store_entity(d.0)?;
                    if in_store != Some((d.1, flight.until, false)) {
                        return Err(format!(
                            "stream {i}: forwarded, but its entity's flight in the store is {in_store:?}"
                        ));
                    }
                    let x = &mut self.ents[d.0 as usize];
                    if x.unsure_until.is_some() {
                        self.unsure_entity(d.0);
                    } else {
                        x.flight = Some(flight);
                        x.flight_unknown = false;
                    }
                }
            }
            // The record was claimed, then released unrun (or not, under a fault).
            Got::EntBusy { .. } | Got::Stale { .. } | Got::Unavailable if fault != Fault::None => {
                self.unsure_key(d)
            }
            _ => {}
        }
        if let Decision::Reply(r) = &decision {
            self.local_reply_passes(i, r)?;
        }
        Ok(())
    }

    /// A forwarded request's outcome, as the rules settle its record and its entity.
    pub(super) fn settled(&mut self, i: usize, how: Outcome, fault: Fault) -> Result<(), String> {
        let Some((at, claimed, ordered)) = self.sims[i].forwarded else {
            return Err(format!("stream {i}: settled, never forwarded"));
        };
        let (d, now, clean) = (self.sims[i].d, self.now, fault == Fault::None);
        let keep = self.knobs.unknown;
        self.sims[i].life = match how {
            Outcome::Unknown if keep != Unknown::Release => Life::Unknown { at: now, clean },
            _ => Life::Settled { clean },
        };
        let n = self.sims[i].exec.unwrap_or(0);
        if how == Outcome::Completed {
            self.execs[n].completed = true;
        }
        if claimed {
            let ours = self.recs.get(&d).is_some_and(|k| {
                k.unsure_until.is_none()
                    && matches!(k.rec, Rec::Running { stream, .. } if stream == i)
            }) && now < at + self.claim_ms();
            if !clean || !ours {
                self.unsure_key(d);
            } else {
                let rec = match (how, keep) {
                    (Outcome::Completed, _) => Rec::Completed {
                        exec: n,
                        until: now + TTL_MS,
                    },
                    (Outcome::Unknown, Unknown::Keep) => Rec::Kept {
                        until: now + TTL_MS,
                    },
                    (Outcome::Unknown, Unknown::Hold) => Rec::Held {
                        until: at + IN_FLIGHT_MS,
                    },
                    _ => Rec::Free,
                };
                self.set_rec(d, rec);
            }
        }
        // Forwarded unordered (failed open) with its record's claim: it holds no flight,
        // but its completion raises the applied version like any other.
        if !(ordered || (claimed && how == Outcome::Completed)) {
            return Ok(());
        }
        let (e, v) = (d.0, d.1);
        let x = &mut self.ents[e as usize];
        let owned = x.flight.is_some_and(|f| f.stream == i);
        let revives = how == Outcome::Unknown && keep == Unknown::Keep;
        if !clean || x.unsure_until.is_some() || (!owned && x.flight_unknown && revives) {
            self.unsure_entity(e);
            return Ok(());
        }
        match (how, keep) {
            (Outcome::Completed, _) => {
                if x.applied.is_none_or(|(a, until)| until <= now || v > a) {
                    x.applied = Some((v, now + self.knobs.order_ttl_ms));
                }
                if owned {
                    x.flight = None;
                }
            }
            (Outcome::Unknown, Unknown::Keep) => {
                if let Some(f) = x.flight.as_mut().filter(|_| owned) {
                    f.held = true;
                    f.until = f.until.max(now + TTL_MS);
                }
            }
            (Outcome::Unknown, Unknown::Hold) => {
                if let Some(f) = x.flight.as_mut().filter(|_| owned) {
                    f.held = true;
                }
            }
            _ => {
                if owned {
                    x.flight = None;
                }
            }
        }
        Ok(())
    }

    /// An entity's live applied version and live flight in the store.
    fn store_entity(&self, e: u8) -> Result<StoreView, String> {
        let layout = self.plugin.layout().map_err(|e| e.to_string())?;
        let got = SharedEntities::new(&*self.shared, layout)
            .get(&self.digests[e as usize])
            .map_err(|err| format!("reading entity {e}: {err}"))?;
        let Some(got) = got else {
            return Ok((None, None));
        };
        let num = |v: &crate::ordering::Version| v.show().parse::<u8>().unwrap_or(0);
        let now = self.now;
        Ok((
            got.applied
                .filter(|a| a.expires_ms > now)
                .map(|a| (num(&a.version), a.expires_ms)),
            got.flight
                .filter(|f| f.expires_ms > now)
                .map(|f| (num(&f.version), f.expires_ms, f.held)),
        ))
    }

    /// After every step: the store's applied version never falls while live, is one that
    /// completed, and the store holds what the model says where it knows.
    pub(super) fn check_store(&mut self) -> Result<(), String> {
        let now = self.now;
        for e in 0..ENTITIES as u8 {
            let (applied, flight) = self.store_entity(e)?;
            let x = &self.ents[e as usize];
            if let Some((w, until)) = x.seen.filter(|s| s.1 > now) {
                if applied.is_none_or(|(a, _)| a < w) {
                    return Err(format!(
                        "the applied version of entity {e} fell from {w} (until t+{}) to {applied:?}",
                        until - START_MS
                    ));
                }
            }
            if let Some((a, _)) = applied {
                if !self.completed_version(e, a) {
                    return Err(format!(
                        "entity {e}'s applied version is {a}, which never completed"
                    ));
                }
            }
            let x = &self.ents[e as usize];
            if x.unsure_until.is_none() {
                let want = (
                    x.applied.filter(|a| a.1 > now),
                    x.flight
                        .filter(|f| f.until > now)
                        .map(|f| (f.version, f.until, f.held)),
                );
                if (applied, flight) != want {
                    return Err(format!(
                        "entity {e} in the store: applied {applied:?}, flight {flight:?}; the model: applied {:?}, flight {:?} (times absolute)",
                        want.0, want.1
                    ));
                }
            }
            self.ents[e as usize].seen = applied;
        }
        Ok(())
    }
}
