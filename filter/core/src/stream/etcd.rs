//! The etcd store's side of a stream: the claim protocol (lease grants, the claim
//! transaction, takeover of an expired completed record), settling a won claim
//! (completion, release, hold) with retries and a lease regrant, and the wait-mode
//! read of a record. One classifier (`retryable`) decides what is retried.

mod entity;
mod settle;

use super::{
    CallAnswer, Decision, DedupStream, Duplicate, Env, HeldClaim, Phase, Plugin, Route, StoreCall,
    Transport, Waiting,
};
use crate::config::{EtcdConfig, Policy, ShardConfig};
use crate::etcd::{self, EtcdAnswer, EtcdRecord, LeasePlan, LeasePurpose};
use crate::etcdpb;
use crate::key::{short_hex, Digest};
use crate::local::LocalEntry;
use crate::metrics::Counter;
use crate::principal::compare;
use crate::record::{RecordState, RecordTimes};
use crate::shards;
use crate::wait::POLL_ETCD_MS;
pub(super) use entity::{EntityCall, EntityOp, EtcdEntity, Turn};
pub(super) use settle::Settling;
use std::sync::Arc;

/// The etcd store: its settings, and where its calls go: one route per shard (resolved
/// once, carried by every `StoreCall`), with each shard's placement seed.
#[derive(Debug, Clone)]
pub struct EtcdStore {
    pub config: EtcdConfig,
    shards: Vec<Arc<Route>>,
    seeds: Vec<u64>,
    /// The other map of a resharding (empty without one).
    check: Vec<Arc<Route>>,
    check_seeds: Vec<u64>,
    /// The first shard: what `route_of` gives should the map be empty (the config
    /// refuses that; a store call to no cluster then fails as a store error).
    first: Arc<Route>,
}

fn route(config: &EtcdConfig, shard: &ShardConfig) -> Arc<Route> {
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
    Arc::new(Route {
        cluster: shard.cluster.clone(),
        shard: shard.name.clone(),
        shard_id: shards::shard_id(&shard.name, &shard.cluster, &shard.authority),
        transport,
    })
}

impl EtcdStore {
    pub fn new(config: EtcdConfig) -> Self {
        let routes = |list: &[ShardConfig]| -> (Vec<Arc<Route>>, Vec<u64>) {
            (
                list.iter().map(|s| route(&config, s)).collect(),
                list.iter().map(|s| shards::name_seed(&s.name)).collect(),
            )
        };
        let (shards, seeds) = routes(&config.shards);
        let (check, check_seeds) = match &config.check {
            Some(c) => routes(&c.shards),
            None => (Vec::new(), Vec::new()),
        };
        let first = shards.first().cloned().unwrap_or_else(|| {
            let none = ShardConfig {
                name: String::new(),
                cluster: String::new(),
                authority: String::new(),
            };
            route(&config, &none)
        });
        EtcdStore {
            config,
            first,
            shards,
            seeds,
            check,
            check_seeds,
        }
    }

    /// The shard `digest` (a record's or an entity's) lives on.
    pub(crate) fn route_of(&self, digest: &Digest) -> &Arc<Route> {
        shards::pick(&self.seeds, digest)
            .and_then(|i| self.shards.get(i))
            .unwrap_or(&self.first)
    }

    /// The shard `digest` lives on under the other map of a resharding, when that is
    /// another shard than `route_of`'s (`None`: no resharding, or the key stays put).
    pub(crate) fn check_route_of(&self, digest: &Digest) -> Option<&Arc<Route>> {
        let i = shards::pick(&self.check_seeds, digest)?;
        let other = self.check.get(i)?;
        (other.shard_id != self.route_of(digest).shard_id).then_some(other)
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

pub(super) struct EtcdClaim {
    /// The shard the record was claimed on (its settle goes there too).
    pub(super) route: Arc<Route>,
    pub(super) key: String,
    pub(super) digest: Digest,
    pub(super) payload: Digest,
    pub(super) token: u64,
    pub(super) mod_revision: i64,
    pub(super) completed_lease: i64,
    /// The lease and expiry the in-flight record was written with (a hold keeps both).
    pub(super) in_flight_lease: i64,
    pub(super) expires_ms: u64,
}

/// An etcd claim in progress.
pub(super) struct Claiming {
    /// The record's shard (the claim's calls go there; `call` may be a resharding's
    /// read of another).
    pub(super) route: Arc<Route>,
    pub(super) key: String,
    pub(super) digest: Digest,
    pub(super) payload: Digest,
    pub(super) token: u64,
    pub(super) step: ClaimStep,
    /// CAS rounds (claim, takeover) so far.
    pub(super) rounds: u32,
    /// Transport retries of the current call.
    pub(super) retries: u32,
    pub(super) deadline_ms: u64,
    pub(super) call: StoreCall,
    /// When `call` was last sent (a lease's window starts then).
    pub(super) sent_ms: u64,
    /// The lease the completed record will carry, fixed when the claim txn is built.
    pub(super) completed_lease: Option<i64>,
    /// The in-flight lease and expiry of the record the last claim txn writes.
    pub(super) in_flight_lease: i64,
    pub(super) expires_ms: u64,
    /// The client left before the claim was decided: a claim won now was never
    /// forwarded, so it is released at once (certainly not executed).
    pub(super) abandoned: bool,
    /// Resharding: the claim won on its shard at this (mod revision, completed lease)
    /// while its record is read on the key's shard under the other map.
    pub(super) won: Option<(i64, i64)>,
    /// Resharding: the key's shard holds a claim in flight (these are its times) while
    /// the key is read on its shard under the other map (`ClaimStep::Peek`).
    pub(super) in_flight_here: Option<RecordTimes>,
    /// Keyless, a named caller: the fingerprint's record from before callers were
    /// recorded, read after the claim is won (`ClaimStep::Legacy`).
    pub(super) legacy: Option<Digest>,
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

    /// The read of `legacy`'s record (on its own shard) after this claim was won
    /// (`ClaimStep::Legacy`, a fresh budget).
    fn read_legacy(&mut self, ec: &EtcdStore, legacy: Digest, now: u64) -> StoreCall {
        let key = etcd::record_key(&ec.config.prefix, &legacy);
        let body = ec.config.protocol.read_key(&key);
        let route = Arc::clone(ec.route_of(&legacy));
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
pub(super) enum ClaimStep {
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

pub(super) const MAX_ROUNDS: u32 = 8;

pub(super) const MAX_RETRIES: u32 = 4;

impl DedupStream {
    /// The answer to a waiter's read of its etcd record: still a claim (wait on), a
    /// completed record (learnt by this worker's tier, so its other waiters answer
    /// without a round trip, then answered like any duplicate), or gone or over (claim
    /// it). A failed read waits on until the next check.
    pub(super) fn polled<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
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
                env.local().insert(w.digest, entry, now);
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

    pub(super) fn claim_etcd<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        let now = env.now_ms();
        // Where the key's record is found is decided again by this claim (and its check).
        self.waits_on_other_map = false;
        if let Some(e) = env.local().get(&digest, now) {
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
        let route = Arc::clone(ec.route_of(&digest));
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
    fn forward_unless_abandoned<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
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
    fn next_claim_call<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        mut c: Box<Claiming>,
    ) -> Decision {
        let now = env.now_ms();
        let timeout_ms = attempt_timeout(ec, c.deadline_ms, now);
        let plan = lease_plan(ec, p.config.policy_at(self.rule));
        let shard = c.route.shard_id;
        let in_flight = env.leases().get(shard, LeasePurpose::InFlight, &plan, now);
        let completed = env.leases().get(shard, LeasePurpose::Completed, &plan, now);
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
        self.phase = Phase::Claiming(c);
        Decision::Call(call)
    }

    pub(super) fn claim_step<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
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
                env.leases()
                    .put(c.route.shard_id, purpose, &plan, id, c.sent_ms);
                self.next_claim_call(p, ec, env, c)
            }
            (ClaimStep::Txn, EtcdAnswer::Error { code, message }) if lease_lost(code, &message) => {
                // A lease we cached is gone (revoked, or etcd lost it): take fresh ones
                // (this shard's; the others' are their own clusters').
                env.leases().forget(c.route.shard_id);
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
                            ) if ec.check_route_of(&c.digest).is_some() => {
                                self.peek(p, ec, env, c, times)
                            }
                            Existing::Duplicate(dup, times, learn) => {
                                if let Some(entry) = learn {
                                    env.local().insert(c.digest, entry, now);
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
    fn take_over<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        mut c: Box<Claiming>,
        mod_revision: i64,
        now: u64,
    ) -> Decision {
        let policy = p.config.policy_at(self.rule);
        let plan = lease_plan(ec, policy);
        let shard = c.route.shard_id;
        let Some(lease) = env.leases().get(shard, LeasePurpose::InFlight, &plan, now) else {
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
        self.phase = Phase::Claiming(c);
        Decision::Call(call)
    }

    /// Sends the claim's current call again (a retry within its budget).
    fn resend(&mut self, ec: &EtcdStore, mut c: Box<Claiming>, now: u64) -> Decision {
        c.retries += 1;
        c.call.timeout_ms = attempt_timeout(ec, c.deadline_ms, now);
        c.sent_ms = now;
        let call = c.call.clone();
        self.phase = Phase::Claiming(c);
        Decision::Call(call)
    }

    /// During a resharding, a claim that found another claim in flight on the key's shard
    /// reads the key on its shard under the other map before answering `409`: when several
    /// duplicates of a key completed under the other map arrive at once, the first to
    /// claim here yields to that record, and the others, finding its claim, are answered
    /// from the record too (`peeked`), not `409`.
    fn peek<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        mut c: Box<Claiming>,
        in_flight: RecordTimes,
    ) -> Decision {
        let Some(other) = ec.check_route_of(&c.digest) else {
            return self.duplicate(p, env, Duplicate::InFlight { held_until: None }, in_flight);
        };
        c.in_flight_here = Some(in_flight);
        let call = c.read_other_map(ec, other, ClaimStep::Peek, env.now_ms());
        self.phase = Phase::Claiming(c);
        Decision::Call(call)
    }

    /// The other map's record of a key whose own shard holds a claim in flight: a
    /// completed one (or one of another payload or caller) answers the request; anything
    /// else, or a read that fails after its retries, leaves the claim in flight here the
    /// answer (`409 in-flight`, or waiting in wait mode).
    fn peeked<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
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
                    env.local().insert(c.digest, entry, now);
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
    fn claim_won<E: Env>(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut E,
        mut c: Box<Claiming>,
        mod_revision: i64,
        completed_lease: i64,
    ) -> Decision {
        if let Some(legacy) = self.legacy_record.take() {
            c.won = Some((mod_revision, completed_lease));
            let call = c.read_legacy(ec, legacy, env.now_ms());
            self.phase = Phase::Claiming(c);
            return Decision::Call(call);
        }
        if let Some(other) = ec.check_route_of(&c.digest) {
            c.won = Some((mod_revision, completed_lease));
            let call = c.read_other_map(ec, other, ClaimStep::Check, env.now_ms());
            env.count(Counter::ReshardChecks);
            self.phase = Phase::Claiming(c);
            return Decision::Call(call);
        }
        let abandoned = c.abandoned;
        let owned = HeldClaim::Etcd(c.won(mod_revision, completed_lease));
        self.forward_unless_abandoned(p, env, owned, abandoned)
    }

    /// The answer to a resharding's read of the key on its other shard: no live record
    /// there, forward; a live one (written by a proxy still on the other map, or before
    /// the move), yield to it: the won claim is released, never forwarded, and the
    /// request is answered as that record's duplicate (a replay, `409`, `422`). A read
    /// that fails after its retries is a store error (`failure_mode`; open forwards with
    /// the claim kept).
    fn checked<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
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
            let owned = HeldClaim::Etcd(c.won(mod_revision, completed_lease));
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
                let owned = HeldClaim::Etcd(c.won(mod_revision, completed_lease));
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
        let owned = HeldClaim::Etcd(c.won(mod_revision, completed_lease));
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
                    env.local().insert(digest, entry, now);
                }
                self.waits_on_other_map = true;
                self.yield_unrun(p, env, owned, dup, times)
            }
        }
    }

    /// A won claim yields to a record a check found: it is released, never forwarded,
    /// and the request is answered as that record's duplicate (once the release has
    /// settled).
    fn yield_unrun<E: Env>(
        &mut self,
        p: &Plugin,
        env: &mut E,
        owned: HeldClaim,
        dup: Duplicate,
        times: RecordTimes,
    ) -> Decision {
        match self.release_unrun(p, env, owned) {
            Some(call) => {
                if let Phase::Settling(st) = &mut self.phase {
                    st.then_duplicate = Some((dup, times));
                }
                Decision::Call(call)
            }
            None => self.duplicate(p, env, dup, times),
        }
    }
}

/// A resharding check's read of one key (`read_one`'s answer), `None` when it failed.
pub(super) fn check_read(call: &StoreCall, answer: &CallAnswer) -> Option<Option<(i64, Vec<u8>)>> {
    etcd::read_one(call.path, answer.status, &answer.body)
}

/// Whether a failed check read is sent again: a failure a retry may get past, within
/// the retries and the budget (as every store call).
pub(super) fn retry_check(
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

pub(super) enum Polled {
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
pub(super) fn poll_call(ec: &EtcdStore, digest: &Digest, on_other_map: bool) -> StoreCall {
    let other = on_other_map.then(|| ec.check_route_of(digest)).flatten();
    ec.call(
        other.unwrap_or_else(|| ec.route_of(digest)),
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
