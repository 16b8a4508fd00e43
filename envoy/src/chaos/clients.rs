//! The soak's clients: each a thread with its own tenant, sending keyed POSTs
//! and retrying them with backoff to either proxy of its store, the way a
//! client behind a load balancer does; every attempt goes into the history.
//!
//! An operation is one of: a new key (payload drawn from a small pool, so
//! payloads repeat across keys and tenants, and key names repeat across
//! tenants); a late duplicate of an earlier key; an earlier key with another
//! payload; the same request sent to two proxies at once; a bad key (missing,
//! too long, repeated, or a repeated tenant header); an ordered delivery (a version of
//! one of a few entities, through the filter's `ordering` rule: new versions, with
//! gaps, and again the recent ones, so versions arrive shuffled, late and duplicated).
//! Each attempt may stop
//! waiting early (a client timeout that closes, or a hang-up that resets),
//! and may ask the upstream to be slow, fail or reset (per the nemesis's
//! upstream weather).
//!
//! In the regions variant every request also carries its record's home region
//! (`regions::home_of`, a function of tenant and key, or of tenant and entity),
//! and the two proxies are the two regions': a retry lands in the other region one
//! time in two, and a race sends one key to both regions at once.

use super::cluster::Cluster;
use super::history::{
    fnv1a, payload_hash, Answer, Attempt, Domain, KeyForm, Outcome, DETACHED_PREFIX, ENTITY_HEADER,
    KEY_HEADER, MAX_KEY_LENGTH, ORDERED_PREFIX, ORDERED_TENANT, REQUEST_ID_HEADER, TENANT_HEADER,
    VERSION_HEADER,
};
use super::nemesis::{Nemesis, Weather};
use super::regions::{home_of, HOME_HEADER};
use super::rng::Rng;
use crate::client::{problem_type, send_or_give_up, GiveUp, Leave, Request};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The host every client sends to every proxy (one service behind a load balancer).
pub const HOST: &str = "orders.example";
/// Attempts per operation before the client gives it up.
const MAX_ATTEMPTS: u32 = 8;
/// How long a patient client waits for an answer.
const PATIENCE: Duration = Duration::from_secs(8);
/// Payloads: 3 paths × 6 bodies; the third path is executed detached.
const PAYLOADS: usize = 18;

fn payload(i: usize) -> (&'static str, String) {
    let path = ["/orders", "/orders?express=1", "/detached/orders"][i % 3];
    let v = i / 3;
    (path, format!(r#"{{"item":{},"qty":{}}}"#, v % 3, 1 + v / 3))
}

/// Entities of ordered deliveries per store at a time.
const ORDERED_ENTITIES: usize = 3;
/// Every this many seconds the ordered deliveries move to new entities (`e<n>-g<gen>`):
/// an entity whose version's outcome is unknown is held for the TTL (longer than the
/// run), and fresh entities keep the ordering guard deciding.
const ORDERED_GENERATION_SECS: u64 = 10;
/// Ordered deliveries pick again one of the newest this many versions (a late delivery,
/// or the same delivery again) instead of a new one.
const ORDERED_WINDOW: u64 = 6;

/// What an operation sends: a payload of the pool, or an ordered delivery.
#[derive(Debug, Clone)]
enum Body {
    Pool(usize),
    Ordered { entity: String, version: i64 },
}

/// The versions the senders of ordered deliveries have produced so far, per store and
/// entity: shared by the clients of a store, so that they deliver versions of the same
/// entities concurrently, through either proxy.
#[derive(Default)]
pub struct OrderedFeed {
    newest: Mutex<HashMap<(Domain, String), i64>>,
}

impl OrderedFeed {
    /// The version to deliver next for `entity`: a new one (above the newest, sometimes
    /// skipping one, delivered later), or one of the newest `ORDERED_WINDOW` again.
    fn pick(&self, domain: Domain, entity: &str, rng: &mut Rng) -> i64 {
        let mut m = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let newest = m.entry((domain, entity.to_string())).or_insert(0);
        if *newest == 0 || rng.percent(45) {
            *newest += 1 + i64::from(rng.percent(30));
            *newest
        } else {
            let back = rng.below((*newest as u64).min(ORDERED_WINDOW)) as i64;
            *newest - back
        }
    }
}

pub struct Client<'a> {
    pub id: usize,
    pub domain: Domain,
    /// Indices of the proxies serving this client's store.
    pub proxies: Vec<usize>,
    pub tenant: String,
    rng: Rng,
    cluster: &'a Cluster,
    nemesis: &'a Nemesis,
    feed: &'a OrderedFeed,
    next_op: u64,
    /// Earlier operations with a good key: (key, payload).
    done: Vec<(String, usize)>,
    history: Vec<Attempt>,
    /// A noisy tenant: floods new keys and hangs up on most of them, never retrying;
    /// the checker must find that no other tenant's key ran twice for it.
    pub noisy: bool,
}

/// One prepared attempt: the request and its record before it is sent.
struct Prepared {
    req: Request,
    record: Attempt,
    patience: Duration,
    leave: Leave,
}

enum Next {
    Done,
    Wait(Duration),
}

impl<'a> Client<'a> {
    pub fn new(
        id: usize,
        domain: Domain,
        proxies: Vec<usize>,
        seed: u64,
        cluster: &'a Cluster,
        nemesis: &'a Nemesis,
        feed: &'a OrderedFeed,
    ) -> Client<'a> {
        Client {
            id,
            domain,
            proxies,
            tenant: format!("tenant-{id}"),
            rng: Rng::fork(seed, id as u64),
            cluster,
            nemesis,
            feed,
            next_op: 0,
            done: Vec::new(),
            history: Vec::new(),
            noisy: id % 8 == 7,
        }
    }

    /// Operations until `deadline`; returns every attempt.
    pub fn run(mut self, deadline: Instant) -> Vec<Attempt> {
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(self.rng.below(40)));
            let op = self.next_op;
            self.next_op += 1;
            let roll = self.rng.below(100);
            let have_old = !self.done.is_empty();
            if self.noisy {
                let p = self.rng.index(PAYLOADS);
                let prepared =
                    self.prepare(op, 0, KeyForm::Good, &format!("op-{op}"), &Body::Pool(p));
                let r = self.send(prepared);
                self.history.push(r);
                continue;
            }
            match roll {
                0..=7 if have_old => {
                    let (key, p) = self.done[self.rng.index(self.done.len())].clone();
                    self.operation(op, &key, &Body::Pool(p), deadline, false);
                }
                8..=12 if have_old => {
                    let (key, p) = self.done[self.rng.index(self.done.len())].clone();
                    // Another payload on a path of the same rule: the detached route's
                    // records are a key space of their own (rules never share records).
                    let other = (p + 3 * (1 + self.rng.index(PAYLOADS / 3 - 1))) % PAYLOADS;
                    self.operation(op, &key, &Body::Pool(other), deadline, false);
                }
                13..=18 => {
                    let p = self.rng.index(PAYLOADS);
                    self.operation(op, &format!("op-{op}"), &Body::Pool(p), deadline, true);
                }
                19..=25 => self.bad_key(op),
                26..=40 => self.ordered(op, deadline),
                _ => {
                    let p = self.rng.index(PAYLOADS);
                    self.operation(op, &format!("op-{op}"), &Body::Pool(p), deadline, false);
                }
            }
        }
        self.history
    }

    /// An ordered delivery: a version of one of the store's current entities, keyed by
    /// entity and version (the same delivery again is the same key); on etcd sometimes
    /// to both proxies at once.
    fn ordered(&mut self, op: u64, deadline: Instant) {
        let generation = self.cluster.now().as_secs() / ORDERED_GENERATION_SECS;
        let entity = format!("e{}-g{generation}", self.rng.index(ORDERED_ENTITIES));
        let version = self.feed.pick(self.domain, &entity, &mut self.rng);
        let key = format!("ord-{entity}-v{version}");
        let race = self.proxies.len() > 1 && self.rng.percent(15);
        self.operation(op, &key, &Body::Ordered { entity, version }, deadline, race);
    }

    /// Send `key` with body `b` until a final answer, `MAX_ATTEMPTS` or the
    /// deadline; `race`: the first attempt goes to two proxies at once.
    fn operation(&mut self, op: u64, key: &str, b: &Body, deadline: Instant, race: bool) {
        if let Body::Pool(p) = b {
            self.done.push((key.to_string(), *p));
        }
        let mut n = 0u32;
        if race {
            let a = self.prepare(op, n, KeyForm::Good, key, b);
            let b = self.prepare(op, n + 1, KeyForm::Good, key, b);
            n += 2;
            let (a, b) = std::thread::scope(|s| {
                let ha = s.spawn(|| self.send(a));
                let hb = s.spawn(|| self.send(b));
                (ha.join(), hb.join())
            });
            let mut finished = false;
            for r in [a, b].into_iter().flatten() {
                finished |= matches!(self.next(&r), Next::Done);
                self.history.push(r);
            }
            if finished {
                return;
            }
        }
        while n < MAX_ATTEMPTS && Instant::now() < deadline {
            let prepared = self.prepare(op, n, KeyForm::Good, key, b);
            n += 1;
            let r = self.send(prepared);
            let next = self.next(&r);
            self.history.push(r);
            match next {
                Next::Done => return,
                Next::Wait(d) => std::thread::sleep(d),
            }
        }
    }

    fn bad_key(&mut self, op: u64) {
        let form = match self.rng.below(4) {
            0 => KeyForm::Missing,
            1 => KeyForm::TooLong,
            2 => KeyForm::RepeatedKey,
            _ => KeyForm::RepeatedTenant,
        };
        let key = match form {
            KeyForm::TooLong => "k".repeat(MAX_KEY_LENGTH + 1 + self.rng.index(40)),
            _ => format!("op-{op}"),
        };
        let p = self.rng.index(PAYLOADS);
        let prepared = self.prepare(op, 0, form, &key, &Body::Pool(p));
        let r = self.send(prepared);
        self.history.push(r);
    }

    fn prepare(&mut self, op: u64, n: u32, form: KeyForm, key: &str, b: &Body) -> Prepared {
        let proxy = self.proxies[self.rng.index(self.proxies.len())];
        let (path, body, ordered) = match b {
            Body::Pool(p) => {
                let (path, body) = payload(*p);
                (path.to_string(), body, None)
            }
            Body::Ordered { entity, version } => (
                format!("{ORDERED_PREFIX}{entity}"),
                format!(r#"{{"entity":"{entity}","version":{version}}}"#),
                Some((entity.clone(), *version)),
            ),
        };
        let tenant = match ordered {
            Some(_) => ORDERED_TENANT.to_string(),
            None => self.tenant.clone(),
        };
        let request_id = format!("c{}-o{op}-a{n}", self.id);
        let mut req = Request::post(&path)
            .host(HOST)
            .header("content-type", "application/json")
            .header(REQUEST_ID_HEADER, &request_id)
            .header(TENANT_HEADER, &tenant)
            .timeout(Duration::from_secs(10));
        if let Some((entity, version)) = &ordered {
            req = req
                .header(ENTITY_HEADER, entity)
                .header(VERSION_HEADER, &version.to_string());
        }
        if self.cluster.regions.is_some() {
            // One home per record (and per entity: all its versions share it).
            let subject = match &ordered {
                Some((entity, _)) => entity.as_str(),
                None => key,
            };
            if let Some(home) = home_of(&tenant, subject) {
                req = req.header(HOME_HEADER, home);
            }
        }
        match form {
            KeyForm::Missing => {}
            KeyForm::RepeatedKey => {
                req = req
                    .header(KEY_HEADER, key)
                    .header(KEY_HEADER, &format!("{key}-2"));
            }
            KeyForm::RepeatedTenant => {
                req = req
                    .header(KEY_HEADER, key)
                    .header(TENANT_HEADER, &format!("{tenant}-2"));
            }
            KeyForm::Good | KeyForm::TooLong => req = req.header(KEY_HEADER, key),
        }
        let (asked, headers) = self.ask_upstream();
        for (name, value) in &headers {
            req = req.header(name, value);
        }
        let req = req.body(body.clone());
        let (patience, leave) = if self.noisy && self.rng.percent(80) {
            let leave = if self.rng.percent(50) {
                Leave::Reset
            } else {
                Leave::Close
            };
            (Duration::from_millis(self.rng.between(10, 300)), leave)
        } else if self.rng.percent(20) {
            let leave = if self.rng.percent(50) {
                Leave::Reset
            } else {
                Leave::Close
            };
            (Duration::from_millis(self.rng.between(30, 2500)), leave)
        } else {
            (PATIENCE, Leave::Close)
        };
        Prepared {
            req,
            patience,
            leave,
            record: Attempt {
                client: self.id,
                op,
                n,
                proxy,
                domain: self.domain,
                request_id,
                tenant,
                key: (form != KeyForm::Missing).then(|| key.to_string()),
                form,
                payload: payload_hash("POST", &path, body.as_bytes()),
                start: Duration::ZERO,
                end: Duration::ZERO,
                asked,
                detached: path.starts_with(DETACHED_PREFIX),
                ordered,
                outcome: Outcome::Failed("not sent".into()),
            },
        }
    }

    /// Headers asking the upstream to misbehave, drawn per the weather, and
    /// what they ask for.
    fn ask_upstream(&mut self) -> (Option<&'static str>, Vec<(&'static str, String)>) {
        let roll = self.rng.below(100);
        let (what, header, value): (&'static str, &'static str, String) =
            match self.nemesis.weather() {
                Weather::Calm if roll < 3 => {
                    let ms = self.rng.between(200, 1500);
                    ("slow", "x-demo-delay-ms", ms.to_string())
                }
                Weather::Calm if roll < 4 => ("5xx", "x-demo-status", "503".into()),
                Weather::Slow if roll < 50 => {
                    let ms = self.rng.between(300, 3000);
                    let what = if ms >= 2000 {
                        "slow beyond the route timeout"
                    } else {
                        "slow"
                    };
                    (what, "x-demo-delay-ms", ms.to_string())
                }
                Weather::Errors if roll < 35 => {
                    let status = [500u16, 502, 503, 429][self.rng.index(4)];
                    let what = if status == 429 { "429" } else { "5xx" };
                    (what, "x-demo-status", status.to_string())
                }
                Weather::Resets if roll < 15 => {
                    ("reset before answering", "x-demo-fault", "reset".into())
                }
                Weather::Resets if roll < 25 => ("reset mid-body", "x-demo-fault", "cut".into()),
                _ => return (None, Vec::new()),
            };
        let mut headers = vec![(header, value)];
        if header == "x-demo-fault" {
            // Some time upstream first, so the fault lands while the proxy waits.
            headers.push(("x-demo-delay-ms", self.rng.between(0, 600).to_string()));
        }
        (Some(what), headers)
    }

    fn send(&self, p: Prepared) -> Attempt {
        let Prepared {
            req,
            mut record,
            patience,
            leave,
        } = p;
        let addr = self.cluster.proxies[record.proxy].addr();
        record.start = self.cluster.now();
        let got = send_or_give_up(addr, &req, patience, leave);
        record.end = self.cluster.now();
        record.outcome = match got {
            Ok(GiveUp::Answered(r)) => {
                let json: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
                let problem = r
                    .header("content-type")
                    .filter(|ct| ct.starts_with("application/problem+json"))
                    .and(json.as_ref().filter(|j| j["type"].is_string()))
                    .map(|_| problem_type(&r.body))
                    .map(|t| t.trim_start_matches("urn:proxy-dedup:problem:").to_string());
                Outcome::Answered(Answer {
                    status: r.status,
                    replayed: r.header("idempotent-replayed") == Some("true"),
                    order_id: json.as_ref().and_then(|j| j["order_id"].as_u64()),
                    body_hash: fnv1a(&r.body),
                    problem,
                    retry_after: r.header("retry-after").and_then(|v| v.trim().parse().ok()),
                    stale: r.header("idempotent-stale") == Some("true"),
                    applied_version: r
                        .header("idempotent-applied-version")
                        .and_then(|v| v.trim().parse().ok()),
                })
            }
            Ok(GiveUp::GaveUp) => Outcome::GaveUp {
                reset: leave == Leave::Reset,
            },
            Err(e) => Outcome::Failed(e.0),
        };
        record
    }

    /// What to do after `a`: done, or wait and retry.
    fn next(&mut self, a: &Attempt) -> Next {
        let backoff = |rng: &mut Rng, n: u32| {
            Duration::from_millis((50u64 << n.min(4)).min(1000) + rng.below(100))
        };
        match &a.outcome {
            Outcome::Answered(r)
                if a.ordered.is_some()
                    && r.status == 409
                    && r.problem.as_deref() == Some("in-flight") =>
            {
                // Another version of the entity is in flight, usually for milliseconds (or
                // held for the TTL: then the attempts run out soon, as a sender's would).
                Next::Wait(Duration::from_millis(100 + self.rng.below(300)))
            }
            Outcome::Answered(r)
                if r.status == 409 && r.problem.as_deref() == Some("in-flight") =>
            {
                let secs = r.retry_after.unwrap_or(1).clamp(1, 3);
                Next::Wait(Duration::from_millis(
                    secs * 1000 / 2 + self.rng.below(secs * 500 + 1),
                ))
            }
            Outcome::Answered(r) if r.status >= 500 || matches!(r.status, 408 | 429) => {
                Next::Wait(backoff(&mut self.rng, a.n))
            }
            Outcome::Answered(_) => Next::Done,
            Outcome::GaveUp { .. } | Outcome::Failed(_) => Next::Wait(backoff(&mut self.rng, a.n)),
        }
    }
}
