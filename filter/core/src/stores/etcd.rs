//! The etcd store, for several proxies: everything of it is in this folder. This file
//! holds the store (`EtcdStore`: its settings and one call route per shard), its side of
//! the store interface (the claim it holds, `EtcdHeld`; the call it has out, `EtcdCall`;
//! what it keeps per worker, `EtcdWorker`), and the claim protocol (lease grants, the
//! claim transaction, takeover of an expired completed record, a resharding's check, the
//! wait-mode read of a record); one classifier (`retryable`) decides what is retried.
//! The other rooms: `settle` (completion, release, hold, with retries and a lease
//! regrant), `entity` (the ordering guard's entities), `wire` (records and the JSON
//! gateway's messages, leases), `pb` (the gRPC messages), `local` (the per-worker tier of
//! completed records), `shards` (where a digest lives: a pinned format), `admin` (the
//! operator API's side).

mod admin;
mod entity;
pub mod local;
pub mod pb;
mod settle;
pub mod shards;
pub mod wire;

use crate::config::{Config, EtcdConfig, Home, HomeRule, Policy, Role, ShardConfig};
use crate::key::{short_hex, Digest, RequestHead};
use crate::metrics::{Counter, Remote};
use crate::ordering::entities::Settle as EntitySettle;
use crate::principal::compare;
use crate::record::{RecordState, RecordTimes};
use crate::response::StoredResponse;
use crate::stream::{
    human_duration, CallAnswer, Decision, DedupStream, Duplicate, Env, Held, HeldClaim, Operated,
    Operation, Pending, Phase, Plugin, Route, SetUpHost, Store, StoreCall, Transport, Waiting,
};
pub(crate) use entity::{EntityCall, EntityOp, EtcdEntity, Turn};
use local::{LocalEntry, LocalTier};
use pb as etcdpb;
pub(crate) use settle::Settling;
use std::any::Any;
use std::sync::Arc;
use wire::{self as etcd, EtcdAnswer, EtcdRecord, LeaseCache, LeasePlan, LeasePurpose};

/// A worker polls a record other waiters of it wait for this often (one read per record
/// and worker), to learn another proxy's answer.
pub const POLL_ETCD_MS: u64 = 250;

/// The etcd store: a handle on its state, cloned into every claim and call it makes.
#[derive(Debug, Clone)]
pub struct EtcdStore(Arc<EtcdState>);

impl std::ops::Deref for EtcdStore {
    type Target = EtcdState;
    fn deref(&self) -> &EtcdState {
        &self.0
    }
}

/// What the etcd store keeps per worker: its leases, reused across requests (per shard),
/// and its tier of completed records.
#[derive(Debug, Default)]
pub struct EtcdWorker {
    pub leases: LeaseCache,
    pub local: LocalTier,
}

/// This worker's etcd state.
pub(crate) fn worker(env: &mut dyn Env) -> &mut EtcdWorker {
    env.store_worker().get::<EtcdWorker>()
}

/// A call the etcd store has out for a stream: what its answer goes to.
pub(crate) enum EtcdCall {
    /// A claim (a lease grant, the claim txn, a resharding's read).
    Claiming(Box<Claiming>),
    /// An entity's call (ordering): its claim, or its settle before the record's.
    Ordering(Box<EntityCall>),
    /// A completion, release or hold, retried within the budget, then counted; the
    /// worker keeps the stream until then (holding the response when one is on its way).
    Settling(Box<Settling>),
    /// Wait mode: a read of the record a duplicate waits for.
    Polling(Box<Waiting>),
}

/// An `EtcdCall` with its store, as the stream's phase holds it.
struct Out {
    ec: EtcdStore,
    call: EtcdCall,
}

impl Pending for Out {
    fn answered(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        answer: CallAnswer,
    ) -> Decision {
        let Out { ec, call } = *self;
        match call {
            EtcdCall::Claiming(c) => s.claim_step(p, &ec, env, c, answer),
            EtcdCall::Ordering(e) => s.entity_answered(p, &ec, env, e, &answer),
            EtcdCall::Settling(st) => s.settled(p, &ec, env, st, &answer),
            EtcdCall::Polling(w) => s.polled(p, &ec, env, w, &answer),
        }
    }

    fn client_gone(&mut self) -> bool {
        match &mut self.call {
            EtcdCall::Claiming(c) => c.abandoned = true,
            // As for a claim: a won entity claim is then released at once.
            EtcdCall::Ordering(e) if matches!(e.op, EntityOp::Claim { .. }) => e.abandoned = true,
            EtcdCall::Ordering(_) | EtcdCall::Settling(_) => {}
            EtcdCall::Polling(_) => return false,
        }
        true
    }

    fn waiting(&self) -> bool {
        matches!(self.call, EtcdCall::Polling(_))
    }

    fn reply_once_settled(&mut self, reply: Option<crate::reply::LocalReply>) {
        match &mut self.call {
            EtcdCall::Settling(st) => st.then_reply = reply,
            EtcdCall::Ordering(e) => e.reply_once_settled(reply),
            _ => {}
        }
    }

    fn name(&self) -> &'static str {
        match self.call {
            EtcdCall::Claiming(_) => "claiming",
            EtcdCall::Ordering(_) => "ordering",
            EtcdCall::Settling(_) => "settling",
            EtcdCall::Polling(_) => "polling",
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The etcd call in the stream's phase, if that is one.
pub(crate) fn etcd_call_mut(phase: &mut Phase) -> Option<&mut EtcdCall> {
    match phase {
        Phase::Calling(c) => c.as_any_mut().downcast_mut::<Out>().map(|o| &mut o.call),
        _ => None,
    }
}

/// Takes the etcd call out of the stream's phase (left `Finished`); any other phase is
/// left as it is.
pub(crate) fn take_etcd_call(phase: &mut Phase) -> Option<EtcdCall> {
    etcd_call_mut(phase)?;
    match std::mem::replace(phase, Phase::Finished) {
        Phase::Calling(c) => c.into_any().downcast::<Out>().ok().map(|o| o.call),
        other => {
            *phase = other;
            None
        }
    }
}

/// A claim won on etcd, with its store, and what the stream keeps of its entity once
/// claimed (ordering), for the settle.
pub(crate) struct EtcdHeld {
    ec: EtcdStore,
    claim: EtcdClaim,
    pub(crate) entity: Option<EtcdEntity>,
}

impl Held for EtcdHeld {
    fn digest(&self) -> &Digest {
        &self.claim.digest
    }

    fn complete(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        response: Option<StoredResponse>,
        entity: EntitySettle,
        now: u64,
    ) -> Option<StoreCall> {
        let EtcdHeld {
            ec,
            claim,
            entity: held,
        } = *self;
        let call = s.complete_etcd(p, &ec, env, claim, response, now);
        Some(s.entity_first(p, &ec, env, entity, held).unwrap_or(call))
    }

    fn release(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        forwarded: bool,
    ) -> Option<StoreCall> {
        let EtcdHeld {
            ec,
            claim,
            entity: held,
        } = *self;
        if !forwarded {
            return Some(s.unwind_etcd(&ec, env, &claim));
        }
        let call = s.release_etcd(&ec, env, &claim);
        Some(
            s.entity_first(p, &ec, env, EntitySettle::Release, held)
                .unwrap_or(call),
        )
    }

    fn hold(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        until_ms: Option<u64>,
    ) -> Option<StoreCall> {
        let EtcdHeld {
            ec,
            claim,
            entity: held,
        } = *self;
        let call = s.hold_etcd(&ec, env, &claim, until_ms);
        Some(
            s.entity_first(p, &ec, env, EntitySettle::Hold { until_ms }, held)
                .unwrap_or(call),
        )
    }

    fn claim_entity(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        token: u64,
        now: u64,
    ) -> Result<Box<dyn Held>, Decision> {
        let Some(order) = s.order.as_ref() else {
            return Ok(self);
        };
        let ordered = order.ordered().clone();
        let policy = p.config.policy_at(s.rule);
        let life = if policy.keeps_unknown() {
            policy.ttl_ms.max(policy.in_flight_timeout_ms)
        } else {
            policy.in_flight_timeout_ms
        };
        let turn = Turn {
            ordered,
            token,
            until_ms: now.saturating_add(life),
        };
        let ec = self.ec.clone();
        Err(s.claim_entity_etcd(p, &ec, env, self, turn))
    }
}

impl Store for EtcdStore {
    fn describe(&self, config: &Config) -> String {
        let life_s = wire::longest_key_life_s(config);
        format!(
            "etcd via {} ({}), prefix `{}`{}{}{}",
            describe_shards(&self.config.shards),
            match self.config.protocol {
                wire::Protocol::Grpc => "gRPC",
                wire::Protocol::Json => "JSON gateway",
            },
            self.config.prefix,
            match &self.config.regions {
                Some(r) => format!(
                    "; regions: this proxy in `{}`, records homed by header `{}`{} (else `{}`)",
                    r.local,
                    r.home.header,
                    if r.home.map.is_empty() {
                        String::new()
                    } else {
                        format!(" through a map of {}", r.home.map.len())
                    },
                    r.home.region(r.home.default)
                ),
                None => String::new(),
            },
            match &self.config.check {
                Some(c) => format!(
                    "; {}: also checking {} ({})",
                    if moves_home(c, &self.config) { "re-homing" } else { "resharding" },
                    describe_shards(&c.shards),
                    moved_fields(c, &self.config)
                ),
                None => String::new(),
            },
            match (&self.config.check, life_s) {
                (Some(c), Some(s)) if c.role == crate::config::CheckRole::Previous => format!(
                    "; drop {} no sooner than {s} s ({}) after every proxy runs this configuration, plus your clock skew",
                    moved_fields(c, &self.config).replace(", ", " and "),
                    human_duration(s)
                ),
                _ => String::new(),
            }
        )
    }

    fn set_up(&mut self, _host: &dyn SetUpHost, _role: Role) -> Result<(), String> {
        Ok(())
    }

    fn makes_calls(&self) -> bool {
        true
    }

    fn recheck_interval_ms(&self) -> u64 {
        POLL_ETCD_MS
    }

    fn claim(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        policy: &Policy,
        head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        // Only waiters are bounded per scope here (no secret is needed), so the tag is
        // computed only when some policy waits.
        if p.waits {
            s.scope_tag = crate::key::scope_tag(policy, head, &[]);
        }
        s.home = self.config.home_of(head);
        s.claim_etcd(p, self, env, digest, payload)
    }

    /// A woken waiter claims when this worker's tier knows the record, else reads it
    /// (`Polling`) where it was found (during a resharding, perhaps on the other map's
    /// shard).
    fn recheck(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        w: Box<Waiting>,
        now: u64,
    ) -> Decision {
        if worker(env).local.get(&w.digest, now).is_some() {
            return s.claim_etcd(p, self, env, w.digest, w.payload);
        }
        let call = poll_call(self, s.home, &w.digest, s.waits_on_other_map);
        s.phase = self.pending(EtcdCall::Polling(w));
        Decision::Call(call)
    }

    fn operate(&self, _p: &Plugin, _env: &mut dyn Env, op: &Operation, _now: u64) -> Operated {
        self.operate_on(op)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Whether the other map of a move has another home rule than the current one.
fn moves_home(c: &crate::config::ShardCheck, config: &EtcdConfig) -> bool {
    c.home.as_ref() != config.regions.as_ref().map(|r| &r.home)
}

/// The fields that set the other map of a move: its shards, its home rule, or both.
fn moved_fields(c: &crate::config::ShardCheck, config: &EtcdConfig) -> String {
    let shards = c.shards != config.shards;
    match (shards, moves_home(c, config)) {
        (true, true) => format!("{}, {}", c.role.field(), c.role.home_field()),
        (false, true) => c.role.home_field().to_string(),
        _ => c.role.field().to_string(),
    }
}

/// A shard map in words: `cluster `etcd`` for one shard named after its cluster, else
/// each shard's name and cluster.
fn describe_shards(shards: &[ShardConfig]) -> String {
    match shards {
        [one] if one.name == one.cluster => format!("cluster `{}`", one.cluster),
        _ => {
            let list: Vec<String> = shards
                .iter()
                .map(|s| format!("`{}` (cluster `{}`)", s.name, s.cluster))
                .collect();
            format!("{} shards: {}", shards.len(), list.join(", "))
        }
    }
}

/// The etcd store's state: its settings, and where its calls go: one route per shard
/// (resolved once, carried by every `StoreCall`), grouped by home region with each
/// shard's placement seed.
#[derive(Debug)]
pub struct EtcdState {
    pub config: EtcdConfig,
    /// `store.shards`, in the configured order (the operator API's counts).
    shards: Vec<Arc<Route>>,
    /// `store.shards` by home region.
    placed: Placed,
    /// The other map of a resharding or re-homing (no groups without one).
    check: Placed,
    /// The first shard: what `route_of` gives should the map be empty (the config
    /// refuses that; a store call to no cluster then fails as a store error).
    first: Arc<Route>,
}

/// A shard map as placement sees it: one group per home region (its shards' routes and
/// seeds, in the map's order), or one group of every shard without regions.
#[derive(Debug, Default)]
struct Placed {
    groups: Vec<(Vec<Arc<Route>>, Vec<u64>)>,
}

impl Placed {
    /// `routes` (of `shards`, in order) grouped by the regions of `home`.
    fn new(shards: &[ShardConfig], routes: &[Arc<Route>], home: Option<&HomeRule>) -> Placed {
        let group = |keep: &dyn Fn(&ShardConfig) -> bool| {
            let mut g = (Vec::new(), Vec::new());
            for (s, r) in shards.iter().zip(routes) {
                if keep(s) {
                    g.0.push(Arc::clone(r));
                    g.1.push(shards::name_seed(&s.name));
                }
            }
            g
        };
        let groups = match home {
            None => vec![group(&|_| true)],
            Some(h) => h
                .regions
                .iter()
                .map(|name| group(&|s| s.region.as_deref() == Some(name.as_str())))
                .collect(),
        };
        Placed { groups }
    }

    /// The shard of region `region` that `digest` ranks highest.
    fn pick(&self, region: u16, digest: &Digest) -> Option<&Arc<Route>> {
        let (routes, seeds) = self.groups.get(usize::from(region))?;
        shards::pick(seeds, digest).and_then(|i| routes.get(i))
    }
}

/// The route of `shard`; `counted`: a shard of `store.shards`, whose calls to another
/// region than this proxy's count as remote (the other map's never do).
fn route(config: &EtcdConfig, shard: &ShardConfig, counted: bool) -> Arc<Route> {
    let transport = match config.protocol {
        // The cluster by name (`:authority` is then the cluster's name), or a
        // `GrpcService` carrying the shard's authority when that was set to something
        // else.
        etcd::Protocol::Grpc => Transport::Grpc {
            upstream: if shard.authority == shard.cluster {
                shard.cluster.as_bytes().to_vec()
            } else {
                etcdpb::grpc_service(&shard.cluster, &shard.authority)
            },
        },
        etcd::Protocol::Json => Transport::Http {
            authority: shard.authority.clone(),
        },
    };
    // A shard of another region than this proxy's: its home region's index, for the
    // remote-call counters.
    let remote = match (&config.regions, &shard.region) {
        (Some(r), Some(region)) if counted && *region != r.local => r
            .home
            .regions
            .iter()
            .position(|n| n == region)
            .and_then(|i| u16::try_from(i).ok()),
        _ => None,
    };
    Arc::new(Route {
        remote,
        cluster: shard.cluster.clone(),
        shard: shard.name.clone(),
        shard_id: shards::shard_id(&shard.name, &shard.cluster, &shard.authority),
        transport,
    })
}

impl EtcdStore {
    pub fn new(config: EtcdConfig) -> Self {
        EtcdStore(Arc::new(EtcdState::new(config)))
    }

    /// A call out of this store, as the stream's phase holds it.
    pub(crate) fn pending(&self, call: EtcdCall) -> Phase {
        Phase::Calling(Box::new(Out {
            ec: self.clone(),
            call,
        }))
    }

    /// A claim won on this store.
    pub(crate) fn held(&self, claim: EtcdClaim) -> HeldClaim {
        Box::new(EtcdHeld {
            ec: self.clone(),
            claim,
            entity: None,
        })
    }
}

impl EtcdState {
    fn new(config: EtcdConfig) -> Self {
        let routes = |list: &[ShardConfig], counted: bool| -> Vec<Arc<Route>> {
            list.iter().map(|s| route(&config, s, counted)).collect()
        };
        let shards = routes(&config.shards, true);
        let placed = Placed::new(
            &config.shards,
            &shards,
            config.regions.as_ref().map(|r| &r.home),
        );
        let check = match &config.check {
            Some(c) => Placed::new(&c.shards, &routes(&c.shards, false), c.home.as_ref()),
            None => Placed::default(),
        };
        let first = shards.first().cloned().unwrap_or_else(|| {
            let none = ShardConfig {
                name: String::new(),
                cluster: String::new(),
                authority: String::new(),
                region: None,
            };
            route(&config, &none, false)
        });
        EtcdState {
            config,
            first,
            shards,
            placed,
            check,
        }
    }

    /// The shard a record (or an ordering entity) of digest `digest` and home `home`
    /// lives on: rendezvous hashing over its home region's shards.
    pub(crate) fn route_of(&self, home: Home, digest: &Digest) -> &Arc<Route> {
        self.placed.pick(home.now, digest).unwrap_or(&self.first)
    }

    /// The shard `digest` lives on under the other map of a resharding or re-homing,
    /// when that is another shard than `route_of`'s (`None`: no move, or the key stays
    /// put).
    pub(crate) fn check_route_of(&self, home: Home, digest: &Digest) -> Option<&Arc<Route>> {
        let other = self.check.pick(home.check, digest)?;
        (other.shard_id != self.route_of(home, digest).shard_id).then_some(other)
    }

    /// The shards of the current map, in the configured order.
    pub(crate) fn routes(&self) -> &[Arc<Route>] {
        &self.shards
    }

    /// A call of `path` with `body` to the shard `route`, giving up after `timeout_ms`.
    pub(crate) fn call(
        &self,
        route: &Arc<Route>,
        path: &'static str,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> StoreCall {
        StoreCall {
            path,
            body,
            timeout_ms,
            route: Arc::clone(route),
        }
    }
}

pub(crate) struct EtcdClaim {
    /// The shard the record was claimed on (its settle goes there too).
    pub(crate) route: Arc<Route>,
    pub(crate) key: String,
    pub(crate) digest: Digest,
    pub(crate) payload: Digest,
    pub(crate) token: u64,
    pub(crate) mod_revision: i64,
    pub(crate) completed_lease: i64,
    /// The lease and expiry the in-flight record was written with (a hold keeps both).
    pub(crate) in_flight_lease: i64,
    pub(crate) expires_ms: u64,
}

/// An etcd claim in progress.
pub(crate) struct Claiming {
    /// The record's shard (the claim's calls go there; `call` may be a resharding's
    /// read of another).
    pub(crate) route: Arc<Route>,
    pub(crate) key: String,
    pub(crate) digest: Digest,
    pub(crate) payload: Digest,
    pub(crate) token: u64,
    pub(crate) step: ClaimStep,
    /// CAS rounds (claim, takeover) so far.
    pub(crate) rounds: u32,
    /// Transport retries of the current call.
    pub(crate) retries: u32,
    pub(crate) deadline_ms: u64,
    pub(crate) call: StoreCall,
    /// When `call` was last sent (a lease's window starts then).
    pub(crate) sent_ms: u64,
    /// The lease the completed record will carry, fixed when the claim txn is built.
    pub(crate) completed_lease: Option<i64>,
    /// The in-flight lease and expiry of the record the last claim txn writes.
    pub(crate) in_flight_lease: i64,
    pub(crate) expires_ms: u64,
    /// The client left before the claim was decided: a claim won now was never
    /// forwarded, so it is released at once (certainly not executed).
    pub(crate) abandoned: bool,
    /// Resharding: the claim won on its shard at this (mod revision, completed lease)
    /// while its record is read on the key's shard under the other map.
    pub(crate) won: Option<(i64, i64)>,
    /// Resharding: the key's shard holds a claim in flight (these are its times) while
    /// the key is read on its shard under the other map (`ClaimStep::Peek`).
    pub(crate) in_flight_here: Option<RecordTimes>,
    /// Keyless, a named caller: the fingerprint's record from before callers were
    /// recorded, read after the claim is won (`ClaimStep::Legacy`).
    pub(crate) legacy: Option<Digest>,
}

impl Claiming {
    /// The read of the key on its shard under the other map of a resharding (`other`),
    /// sent as `step` with a fresh budget of `timeout_ms`: the check of a won claim, or
    /// a duplicate's look before it answers `409` (`DedupStream::peek`).
    fn read_other_map(
        &mut self,
        ec: &EtcdStore,
        other: &Arc<Route>,
        step: ClaimStep,
        now: u64,
    ) -> StoreCall {
        let body = ec.config.protocol.read_key(&self.key);
        self.send_read(ec, other, body, step, now)
    }

    /// The read of `legacy`'s record (on its own shard: the same home, `home`) after
    /// this claim was won (`ClaimStep::Legacy`, a fresh budget).
    fn read_legacy(&mut self, ec: &EtcdStore, home: Home, legacy: Digest, now: u64) -> StoreCall {
        let key = etcd::record_key(&ec.config.prefix, &legacy);
        let body = ec.config.protocol.read_key(&key);
        let route = Arc::clone(ec.route_of(home, &legacy));
        self.legacy = Some(legacy);
        self.send_read(ec, &route, body, ClaimStep::Legacy, now)
    }

    fn send_read(
        &mut self,
        ec: &EtcdStore,
        route: &Arc<Route>,
        body: Vec<u8>,
        step: ClaimStep,
        now: u64,
    ) -> StoreCall {
        self.step = step;
        self.retries = 0;
        self.sent_ms = now;
        self.deadline_ms = now.saturating_add(ec.config.timeout_ms);
        self.call = ec.call(
            route,
            ec.config.protocol.range_path(),
            body,
            attempt_timeout(ec, self.deadline_ms, now),
        );
        self.call.clone()
    }

    /// The claim this attempt won, at `mod_revision`, its completed record to carry
    /// `completed_lease`.
    fn won(self, mod_revision: i64, completed_lease: i64) -> EtcdClaim {
        EtcdClaim {
            route: self.route,
            key: self.key,
            digest: self.digest,
            payload: self.payload,
            token: self.token,
            mod_revision,
            completed_lease,
            in_flight_lease: self.in_flight_lease,
            expires_ms: self.expires_ms,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimStep {
    Grant(LeasePurpose),
    Txn,
    /// Resharding: reading the key on its shard under the other map.
    Check,
    /// Resharding: the key's own shard holds a claim in flight (often another
    /// duplicate's, about to yield): reading the key under the other map, whose record,
    /// if completed, is the answer (`peeked`).
    Peek,
    /// Keyless, a named caller, the claim won: reading the fingerprint's record from
    /// before callers were recorded, which the claim yields to (`checked`).
    Legacy,
}

pub(crate) const MAX_ROUNDS: u32 = 8;

pub(crate) const MAX_RETRIES: u32 = 4;

impl DedupStream {
    /// The answer to a waiter's read of its etcd record: still a claim (wait on), a
    /// completed record (learnt by this worker's tier, so its other waiters answer
    /// without a round trip, then answered like any duplicate), or gone or over (claim
    /// it). A failed read waits on until the next check.
    pub(crate) fn polled(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut w: Box<Waiting>,
        answer: &CallAnswer,
    ) -> Decision {
        let now = env.now_ms();
        match poll_answer(ec.config.protocol.range_path(), answer, &w.digest) {
            Polled::Claimed { held_until, times } => {
                w.held_until = held_until;
                w.times = times;
                self.wait_on(p, env, w)
            }
            Polled::Completed(entry) => {
                worker(env).local.insert(w.digest, entry, now);
                env.waiters().wake(&w.digest);
                self.claim_etcd(p, ec, env, w.digest, w.payload)
            }
            Polled::Free => self.claim_etcd(p, ec, env, w.digest, w.payload),
            Polled::Failed => {
                env.count(Counter::StoreErrors);
                env.debug(format_args!(
                    "stream {}: reading record {} failed (status {}); waiting on",
                    self.id,
                    short_hex(&w.digest),
                    answer.status
                ));
                self.wait_on(p, env, w)
            }
        }
    }

    pub(crate) fn claim_etcd(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        let now = env.now_ms();
        // Where the key's record is found is decided again by this claim (and its check).
        self.waits_on_other_map = false;
        if let Some(e) = worker(env).local.get(&digest, now) {
            let dup = match Duplicate::mismatch(compare(&e.payload, &payload)) {
                Some(m) => m,
                None => match &e.response {
                    Some(r) => Duplicate::Completed(Some(r.clone())),
                    None => Duplicate::NotStored,
                },
            };
            let times = RecordTimes::expiring(e.expires_ms);
            env.debug(format_args!(
                "stream {}: record {} answered by this worker's tier",
                self.id,
                short_hex(&digest)
            ));
            return self.duplicate(p, env, dup, times);
        }
        let token = env.new_token();
        let route = Arc::clone(ec.route_of(self.home, &digest));
        if let Some(region) = route.remote {
            env.count_remote(Remote::Claims, region);
        }
        let c = Claiming {
            call: ec.call(
                &route,
                ec.config.protocol.txn_path(),
                Vec::new(),
                ec.config.timeout_ms,
            ),
            route,
            key: etcd::record_key(&ec.config.prefix, &digest),
            digest,
            payload,
            token,
            step: ClaimStep::Txn,
            rounds: 0,
            retries: 0,
            deadline_ms: now.saturating_add(ec.config.timeout_ms),
            sent_ms: now,
            completed_lease: None,
            in_flight_lease: 0,
            expires_ms: 0,
            abandoned: false,
            won: None,
            in_flight_here: None,
            legacy: None,
        };
        self.next_claim_call(p, ec, env, Box::new(c))
    }

    /// A won etcd claim goes on, unless its client left meanwhile: then nothing was
    /// forwarded and the claim is released at once.
    fn forward_unless_abandoned(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        abandoned: bool,
    ) -> Decision {
        if !abandoned {
            return self.forward(p, env, owned);
        }
        env.debug(format_args!(
            "stream {}: claim won after the client left; releasing it",
            self.id
        ));
        match self.release(p, env, owned) {
            Some(call) => Decision::Call(call),
            None => Decision::Continue,
        }
    }

    /// The next call of a claim: a lease grant if this worker has no usable lease, else
    /// the claim txn.
    fn next_claim_call(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut c: Box<Claiming>,
    ) -> Decision {
        let now = env.now_ms();
        let timeout_ms = attempt_timeout(ec, c.deadline_ms, now);
        let plan = lease_plan(ec, p.config.policy_at(self.rule));
        let shard = c.route.shard_id;
        let in_flight = worker(env)
            .leases
            .get(shard, LeasePurpose::InFlight, &plan, now);
        let completed = worker(env)
            .leases
            .get(shard, LeasePurpose::Completed, &plan, now);
        let proto = ec.config.protocol;
        let (step, path, body) = match (in_flight, completed) {
            (None, _) => (
                ClaimStep::Grant(LeasePurpose::InFlight),
                proto.lease_grant_path(),
                proto.lease_grant(plan.ttl_s(LeasePurpose::InFlight)),
            ),
            (_, None) => (
                ClaimStep::Grant(LeasePurpose::Completed),
                proto.lease_grant_path(),
                proto.lease_grant(plan.ttl_s(LeasePurpose::Completed)),
            ),
            (Some(lease), Some(completed)) => {
                c.completed_lease = Some(completed);
                let policy = p.config.policy_at(self.rule);
                let rec = in_flight_record(policy, &c, now);
                c.in_flight_lease = lease;
                c.expires_ms = rec.expires_ms;
                (
                    ClaimStep::Txn,
                    proto.txn_path(),
                    proto.claim_txn(&c.key, &rec.encode(&c.digest), claim_lease(policy, &c)),
                )
            }
        };
        c.step = step;
        c.retries = 0;
        c.sent_ms = now;
        c.call = ec.call(&c.route, path, body, timeout_ms);
        let call = c.call.clone();
        self.phase = ec.pending(EtcdCall::Claiming(c));
        Decision::Call(call)
    }

    pub(crate) fn claim_step(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut c: Box<Claiming>,
        answer: CallAnswer,
    ) -> Decision {
        if matches!(c.step, ClaimStep::Check | ClaimStep::Legacy) {
            return self.checked(p, env, ec, c, &answer);
        }
        if c.step == ClaimStep::Peek {
            return self.peeked(p, env, ec, c, &answer);
        }
        let now = env.now_ms();
        let parsed = etcd::read_answer(c.call.path, answer.status, &answer.body);
        if retryable(&answer, &parsed) {
            // Connection refused or reset, or a member without a leader: another member
            // may answer. Retry within the budget.
            if c.retries < MAX_RETRIES && now < c.deadline_ms {
                return self.resend(ec, c, now);
            }
            return self.store_failed(
                p,
                env,
                &format!("etcd unreachable (status {})", answer.status),
            );
        }
        let Some(parsed) = parsed else {
            return self.store_failed(
                p,
                env,
                &format!("etcd answered {} with an unreadable body", answer.status),
            );
        };
        match (c.step, parsed) {
            (ClaimStep::Grant(purpose), EtcdAnswer::Lease { id }) => {
                let plan = lease_plan(ec, p.config.policy_at(self.rule));
                worker(env)
                    .leases
                    .put(c.route.shard_id, purpose, &plan, id, c.sent_ms);
                self.next_claim_call(p, ec, env, c)
            }
            (ClaimStep::Txn, EtcdAnswer::Error { code, message }) if lease_lost(code, &message) => {
                // A lease we cached is gone (revoked, or etcd lost it): take fresh ones
                // (this shard's; the others' are their own clusters').
                worker(env).leases.forget(c.route.shard_id);
                c.rounds += 1;
                if c.rounds > MAX_ROUNDS {
                    return self.store_failed(p, env, "etcd keeps losing leases");
                }
                self.next_claim_call(p, ec, env, c)
            }
            (_, EtcdAnswer::Error { code, message }) => {
                self.store_failed(p, env, &format!("etcd error {code}: {message}"))
            }
            (
                ClaimStep::Txn,
                EtcdAnswer::Txn {
                    succeeded: true,
                    revision,
                    ..
                },
            ) => {
                let Some(completed_lease) = c.completed_lease else {
                    return self.store_failed(p, env, "no completion lease");
                };
                self.claim_won(p, ec, env, c, revision, completed_lease)
            }
            (
                ClaimStep::Txn,
                EtcdAnswer::Txn {
                    succeeded: false,
                    existing,
                    ..
                },
            ) => {
                c.rounds += 1;
                if c.rounds > MAX_ROUNDS {
                    return self.store_failed(p, env, "etcd CAS contention");
                }
                let Some((mod_revision, value)) = existing else {
                    // Deleted between the compare and the read: claim again.
                    return self.next_claim_call(p, ec, env, c);
                };
                let current = EtcdRecord::decode(&value, &c.digest);
                match current {
                    Some(r) if r.token == c.token && r.state == RecordState::InFlight => {
                        // Our own earlier attempt went through; its answer was lost.
                        let Some(completed_lease) = c.completed_lease else {
                            return self.store_failed(p, env, "no completion lease");
                        };
                        self.claim_won(p, ec, env, c, mod_revision, completed_lease)
                    }
                    // An in-flight record of another claim is never taken over by
                    // comparing our clock with the time its proxy wrote: only etcd ends
                    // it, when its lease runs out and the key is gone. Nor is a record
                    // this version cannot read (it may be a newer version's claim).
                    None => {
                        env.debug(format_args!(
                            "stream {}: record {} is unreadable; waiting for its lease to end",
                            self.id,
                            short_hex(&c.digest)
                        ));
                        let unknown = RecordTimes::default();
                        self.duplicate(p, env, Duplicate::InFlight { held_until: None }, unknown)
                    }
                    Some(r) => {
                        let keeps = p.config.policy_at(self.rule).keeps_unknown();
                        match classify(r, &c.payload, keeps, now) {
                            Existing::Duplicate(
                                Duplicate::InFlight { held_until: None },
                                times,
                                _,
                            ) if ec.check_route_of(self.home, &c.digest).is_some() => {
                                self.peek(p, ec, env, c, times)
                            }
                            Existing::Duplicate(dup, times, learn) => {
                                if let Some(entry) = learn {
                                    worker(env).local.insert(c.digest, entry, now);
                                }
                                self.duplicate(p, env, dup, times)
                            }
                            Existing::Over => self.take_over(p, ec, env, c, mod_revision, now),
                        }
                    }
                }
            }
            (_, other) => self.store_failed(p, env, &format!("unexpected etcd answer {other:?}")),
        }
    }

    /// A completed record past its TTL by our clock (its lease has not run out yet):
    /// take it over, conditional on it being unchanged since we read it. A clock
    /// running ahead by D takes it over D early.
    fn take_over(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut c: Box<Claiming>,
        mod_revision: i64,
        now: u64,
    ) -> Decision {
        let policy = p.config.policy_at(self.rule);
        let plan = lease_plan(ec, policy);
        let shard = c.route.shard_id;
        let Some(lease) = worker(env)
            .leases
            .get(shard, LeasePurpose::InFlight, &plan, now)
        else {
            return self.next_claim_call(p, ec, env, c);
        };
        let rec = in_flight_record(policy, &c, now);
        c.in_flight_lease = lease;
        c.expires_ms = rec.expires_ms;
        c.call = ec.call(
            &c.route,
            ec.config.protocol.txn_path(),
            ec.config.protocol.replace_txn(
                &c.key,
                mod_revision,
                &rec.encode(&c.digest),
                claim_lease(policy, &c),
            ),
            attempt_timeout(ec, c.deadline_ms, now),
        );
        c.retries = 0;
        c.sent_ms = now;
        let call = c.call.clone();
        self.phase = ec.pending(EtcdCall::Claiming(c));
        Decision::Call(call)
    }

    /// Sends the claim's current call again (a retry within its budget).
    fn resend(&mut self, ec: &EtcdStore, mut c: Box<Claiming>, now: u64) -> Decision {
        c.retries += 1;
        c.call.timeout_ms = attempt_timeout(ec, c.deadline_ms, now);
        c.sent_ms = now;
        let call = c.call.clone();
        self.phase = ec.pending(EtcdCall::Claiming(c));
        Decision::Call(call)
    }

    /// During a resharding, a claim that found another claim in flight on the key's shard
    /// reads the key on its shard under the other map before answering `409`: when several
    /// duplicates of a key completed under the other map arrive at once, the first to
    /// claim here yields to that record, and the others, finding its claim, are answered
    /// from the record too (`peeked`), not `409`.
    fn peek(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut c: Box<Claiming>,
        in_flight: RecordTimes,
    ) -> Decision {
        let Some(other) = ec.check_route_of(self.home, &c.digest) else {
            return self.duplicate(p, env, Duplicate::InFlight { held_until: None }, in_flight);
        };
        c.in_flight_here = Some(in_flight);
        let call = c.read_other_map(ec, other, ClaimStep::Peek, env.now_ms());
        self.phase = ec.pending(EtcdCall::Claiming(c));
        Decision::Call(call)
    }

    /// The other map's record of a key whose own shard holds a claim in flight: a
    /// completed one (or one of another payload or caller) answers the request; anything
    /// else, or a read that fails after its retries, leaves the claim in flight here the
    /// answer (`409 in-flight`, or waiting in wait mode).
    fn peeked(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        ec: &EtcdStore,
        mut c: Box<Claiming>,
        answer: &CallAnswer,
    ) -> Decision {
        let now = env.now_ms();
        let here = c.in_flight_here.take().unwrap_or_default();
        let read = match check_read(&c.call, answer) {
            Some(read) => read,
            None if retry_check(answer, &c.call, c.retries, c.deadline_ms, now) => {
                c.in_flight_here = Some(here);
                return self.resend(ec, c, now);
            }
            None => None,
        };
        let keeps = p.config.policy_at(self.rule).keeps_unknown();
        let there = read
            .and_then(|(_, value)| EtcdRecord::decode(&value, &c.digest))
            .map(|r| classify(r, &c.payload, keeps, now));
        if let Some(Existing::Duplicate(dup, times, learn)) = there {
            if !matches!(dup, Duplicate::InFlight { .. }) {
                if let Some(entry) = learn {
                    worker(env).local.insert(c.digest, entry, now);
                }
                env.debug(format_args!(
                    "stream {}: record {} is in flight here and settled under the other map; answering from that",
                    self.id,
                    short_hex(&c.digest)
                ));
                self.waits_on_other_map = true;
                return self.duplicate(p, env, dup, times);
            }
        }
        self.duplicate(p, env, Duplicate::InFlight { held_until: None }, here)
    }

    /// The claim won on its shard at `mod_revision`. During a resharding whose other map
    /// places the key on another shard, that shard is read before anything is forwarded
    /// (a fresh budget of `timeout_ms`): a proxy still writing under the other map wrote
    /// there first, or reads this claim after it, so of two claims on two maps at least
    /// one sees the other (`checked`).
    fn claim_won(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut c: Box<Claiming>,
        mod_revision: i64,
        completed_lease: i64,
    ) -> Decision {
        if let Some(legacy) = self.legacy_record.take() {
            c.won = Some((mod_revision, completed_lease));
            let call = c.read_legacy(ec, self.home, legacy, env.now_ms());
            self.phase = ec.pending(EtcdCall::Claiming(c));
            return Decision::Call(call);
        }
        if let Some(other) = ec.check_route_of(self.home, &c.digest) {
            c.won = Some((mod_revision, completed_lease));
            let call = c.read_other_map(ec, other, ClaimStep::Check, env.now_ms());
            env.count(Counter::ReshardChecks);
            self.phase = ec.pending(EtcdCall::Claiming(c));
            return Decision::Call(call);
        }
        let abandoned = c.abandoned;
        let owned = ec.held(c.won(mod_revision, completed_lease));
        self.forward_unless_abandoned(p, env, owned, abandoned)
    }

    /// The answer to a resharding's read of the key on its other shard: no live record
    /// there, forward; a live one (written by a proxy still on the other map, or before
    /// the move), yield to it: the won claim is released, never forwarded, and the
    /// request is answered as that record's duplicate (a replay, `409`, `422`). A read
    /// that fails after its retries is a store error (`failure_mode`; open forwards with
    /// the claim kept).
    fn checked(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        ec: &EtcdStore,
        mut c: Box<Claiming>,
        answer: &CallAnswer,
    ) -> Decision {
        let now = env.now_ms();
        let Some((mod_revision, completed_lease)) = c.won.take() else {
            return self.store_failed(p, env, "a resharding check without a won claim");
        };
        let Some(read) = check_read(&c.call, answer) else {
            if retry_check(answer, &c.call, c.retries, c.deadline_ms, now) {
                c.won = Some((mod_revision, completed_lease));
                return self.resend(ec, c, now);
            }
            let why = match c.step {
                ClaimStep::Legacy => format!(
                    "reading the record from before callers on shard `{}` failed (status {})",
                    c.call.route.shard, answer.status
                ),
                _ => format!(
                    "reading the key on shard `{}` of {} failed (status {})",
                    c.call.route.shard,
                    ec.config.check.as_ref().map_or("", |k| k.role.field()),
                    answer.status
                ),
            };
            let abandoned = c.abandoned;
            let owned = ec.held(c.won(mod_revision, completed_lease));
            return match p.config.failure_mode {
                crate::config::FailureMode::Open => {
                    env.count(Counter::StoreErrors);
                    env.count(Counter::FailedOpen);
                    env.warn(&format!(
                        "stream {}: store error: {why}; forwarded unchecked (failure_mode open)",
                        self.id
                    ));
                    self.forward_unless_abandoned(p, env, owned, abandoned)
                }
                crate::config::FailureMode::Closed => {
                    let d = self.store_failed(p, env, &why);
                    self.refuse(p, env, owned, d)
                }
            };
        };
        let keeps = p.config.policy_at(self.rule).keeps_unknown();
        if c.step == ClaimStep::Legacy {
            // Only a record that names no caller is yielded to (it may be this caller's
            // from before the upgrade); anything else is another caller's, or gone.
            let old = c.legacy.take().unwrap_or(c.digest);
            let found = read
                .and_then(|(_, value)| EtcdRecord::decode(&value, &old))
                .map(|r| classify(r, &c.payload, keeps, now));
            if let Some(Existing::Duplicate(
                dup @ Duplicate::OtherCaller { unowned: true },
                times,
                _,
            )) = found
            {
                let owned = ec.held(c.won(mod_revision, completed_lease));
                return self.yield_unrun(p, env, owned, dup, times);
            }
            c.step = ClaimStep::Txn;
            return self.claim_won(p, ec, env, c, mod_revision, completed_lease);
        }
        let found = match read {
            None => Existing::Over,
            Some((_, value)) => match EtcdRecord::decode(&value, &c.digest) {
                Some(r) => classify(r, &c.payload, keeps, now),
                // A record this version cannot read: a claim it must not run beside.
                None => Existing::Duplicate(
                    Duplicate::InFlight { held_until: None },
                    RecordTimes::default(),
                    None,
                ),
            },
        };
        let shard = c.call.route.shard.clone();
        let abandoned = c.abandoned;
        let digest = c.digest;
        let owned = ec.held(c.won(mod_revision, completed_lease));
        match found {
            Existing::Over => self.forward_unless_abandoned(p, env, owned, abandoned),
            Existing::Duplicate(dup, times, learn) => {
                env.count(Counter::ReshardYielded);
                env.debug(format_args!(
                    "stream {}: record {} is live on shard `{shard}` of the other map; yielding",
                    self.id,
                    short_hex(&digest)
                ));
                if let Some(entry) = learn {
                    worker(env).local.insert(digest, entry, now);
                }
                self.waits_on_other_map = true;
                self.yield_unrun(p, env, owned, dup, times)
            }
        }
    }

    /// A won claim yields to a record a check found: it is released, never forwarded,
    /// and the request is answered as that record's duplicate (once the release has
    /// settled).
    fn yield_unrun(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: HeldClaim,
        dup: Duplicate,
        times: RecordTimes,
    ) -> Decision {
        match self.release_unrun(p, env, owned) {
            Some(call) => {
                if let Some(EtcdCall::Settling(st)) = etcd_call_mut(&mut self.phase) {
                    st.then_duplicate = Some((dup, times));
                }
                Decision::Call(call)
            }
            None => self.duplicate(p, env, dup, times),
        }
    }
}

/// A resharding check's read of one key (`read_one`'s answer), `None` when it failed.
pub(crate) fn check_read(call: &StoreCall, answer: &CallAnswer) -> Option<Option<(i64, Vec<u8>)>> {
    etcd::read_one(call.path, answer.status, &answer.body)
}

/// Whether a failed check read is sent again: a failure a retry may get past, within
/// the retries and the budget (as every store call).
pub(crate) fn retry_check(
    answer: &CallAnswer,
    call: &StoreCall,
    retries: u32,
    deadline_ms: u64,
    now: u64,
) -> bool {
    let parsed = etcd::read_answer(call.path, answer.status, &answer.body);
    retryable(answer, &parsed) && retries < MAX_RETRIES && now < deadline_ms
}

/// What a live record found by a claim (on its shard, or on the key's shard under the
/// other map of a resharding) makes of the request.
enum Existing {
    /// A duplicate: its answer, the record's times, and a completed record for this
    /// worker's tier to learn.
    Duplicate(Duplicate, RecordTimes, Option<LocalEntry>),
    /// A completed record past its TTL by this proxy's clock: it may be taken over.
    Over,
}

/// Classifies a record read back. etcd values keep an expiry (a claim's in-flight end,
/// a hold's end, a completed record's TTL), not a completion time. An in-flight record
/// of another claim is never over by comparing our clock with the time its proxy wrote:
/// only etcd ends it, when its lease runs out and the key is gone.
fn classify(r: EtcdRecord, payload: &Digest, keeps: bool, now: u64) -> Existing {
    if !matches!(r.state, RecordState::InFlight | RecordState::Held) && r.expires_ms <= now {
        return Existing::Over;
    }
    let times = RecordTimes::expiring(r.expires_ms);
    if let Some(m) = Duplicate::mismatch(compare(&r.payload, payload)) {
        return Existing::Duplicate(m, times, None);
    }
    let (dup, learn) = match r.state {
        // Kept claims live on the completed lease: past its in-flight time (by this
        // proxy's clock), an unsettled one answers as an unknown outcome.
        RecordState::InFlight if keeps && r.expires_ms <= now => (
            Duplicate::InFlight {
                held_until: Some(r.expires_ms),
            },
            None,
        ),
        RecordState::InFlight => (Duplicate::InFlight { held_until: None }, None),
        RecordState::Held => (
            Duplicate::InFlight {
                held_until: Some(r.expires_ms),
            },
            None,
        ),
        RecordState::CompletedNotStored => (
            Duplicate::NotStored,
            Some(LocalEntry {
                payload: r.payload,
                expires_ms: r.expires_ms,
                response: None,
            }),
        ),
        RecordState::Completed => {
            let entry = LocalEntry {
                payload: r.payload,
                expires_ms: r.expires_ms,
                response: r.response.clone(),
            };
            (Duplicate::Completed(r.response), Some(entry))
        }
    };
    Existing::Duplicate(dup, times, learn)
}

/// What a waiter's read of its etcd record found.
/// Whether a store call is worth sending again (to the same or another member): no
/// answer or a gateway failure without an etcd body (connection refused or reset), or
/// etcd's "unavailable" (gRPC code 14: no leader, leader changed, and Envoy's timeouts
/// and resets of a gRPC call) and "deadline exceeded". Claims and settling calls both
/// retry on exactly this, within their budget.
fn retryable(answer: &CallAnswer, parsed: &Option<EtcdAnswer>) -> bool {
    (matches!(answer.status, 0 | 502 | 503 | 504) && parsed.is_none())
        || etcd::retryable_error(parsed)
}

/// Whether an etcd error says a lease we wrote with is gone (revoked, or etcd lost
/// it): gRPC NOT_FOUND, or the gateway's message.
fn lease_lost(code: i64, message: &str) -> bool {
    code == 5 || message.contains("lease not found")
}

pub(crate) enum Polled {
    /// In flight or held (when its outcome is unknown, until then): wait on.
    Claimed {
        held_until: Option<u64>,
        times: RecordTimes,
    },
    /// Completed: what a duplicate gets (checked against the payload by the claim).
    Completed(LocalEntry),
    /// Gone (released, or its lease ended), unreadable or past its TTL: claim it.
    Free,
    /// No answer, or not one etcd gives to a read.
    Failed,
}

/// The store call that reads a waiter's record (etcd store): on the key's shard, or,
/// when the claim yielded to the record on the key's shard under the other map of a
/// resharding (`on_other_map`), there. Only a read: whatever it finds, the key runs
/// only after a claim on its own shard and that claim's check (`claim_etcd`), so a
/// waiter's re-check costs one call while the record stays in flight, not a claim, a
/// check and a release.
pub(crate) fn poll_call(
    ec: &EtcdStore,
    home: Home,
    digest: &Digest,
    on_other_map: bool,
) -> StoreCall {
    let other = on_other_map
        .then(|| ec.check_route_of(home, digest))
        .flatten();
    ec.call(
        other.unwrap_or_else(|| ec.route_of(home, digest)),
        ec.config.protocol.range_path(),
        ec.config
            .protocol
            .read_key(&etcd::record_key(&ec.config.prefix, digest)),
        ec.config.timeout_ms.min(POLL_ETCD_MS.max(1000)),
    )
}

/// Interprets the answer to `poll_call`. The time in a completed record is not compared
/// here: the claim that follows decides whether it is over.
fn poll_answer(path: &str, answer: &CallAnswer, digest: &Digest) -> Polled {
    let Some(read) = etcd::read_one(path, answer.status, &answer.body) else {
        return Polled::Failed;
    };
    let Some((_, value)) = read else {
        return Polled::Free;
    };
    match EtcdRecord::decode(&value, digest) {
        Some(r) => match r.state {
            RecordState::InFlight => Polled::Claimed {
                held_until: None,
                times: RecordTimes::expiring(r.expires_ms),
            },
            RecordState::Held => Polled::Claimed {
                held_until: Some(r.expires_ms),
                times: RecordTimes::expiring(r.expires_ms),
            },
            RecordState::Completed | RecordState::CompletedNotStored => {
                Polled::Completed(LocalEntry {
                    payload: r.payload,
                    expires_ms: r.expires_ms,
                    response: r.response,
                })
            }
        },
        // A record this version cannot read is a claim it must not take over: the
        // claim that follows answers it as in flight.
        None => Polled::Free,
    }
}

/// The etcd lease timing of a policy: its TTLs and the budget of one store operation.
fn lease_plan(ec: &EtcdStore, policy: &Policy) -> LeasePlan {
    LeasePlan::new(
        policy.ttl_ms,
        policy.in_flight_timeout_ms,
        ec.config.timeout_ms,
    )
}

/// The timeout of one attempt: a third of the budget (at least 100 ms), never past the
/// deadline. A request stuck on a member that lost its leader (etcd drops the proposal
/// and the client waits) is abandoned in time to retry on the new leader.
fn attempt_timeout(ec: &EtcdStore, deadline_ms: u64, now_ms: u64) -> u64 {
    let slice = (ec.config.timeout_ms / 3).max(100);
    deadline_ms.saturating_sub(now_ms).min(slice).max(1)
}

/// The lease a claim is written on: the in-flight lease ends an unsettled claim at the
/// in-flight timeout; under `on_unknown_outcome: "keep"` the completed lease keeps it
/// until its TTL, so a proxy that dies with the claim never lets the key run again.
fn claim_lease(policy: &Policy, c: &Claiming) -> i64 {
    match c.completed_lease {
        Some(completed) if policy.keeps_unknown() => completed,
        _ => c.in_flight_lease,
    }
}

fn in_flight_record(policy: &Policy, c: &Claiming, now_ms: u64) -> EtcdRecord {
    EtcdRecord {
        state: RecordState::InFlight,
        token: c.token,
        expires_ms: now_ms.saturating_add(policy.in_flight_timeout_ms),
        payload: c.payload,
        response: None,
    }
}
