//! The store interface: what a stream asks of the configured store, and what the store's
//! own types answer. Each store implements it in its own folder (`stores/shared`,
//! `stores/etcd`) and the stream never names one: the configured `Store` claims (and
//! re-checks a waiter's record), the claim it won is a `Held` of that store (completed,
//! released or held through it, the ordering guard's entity with it), and a call the
//! store has out is a `Pending` of that store in the stream's phase, given the call's
//! answer. An operation either acts at once (shared data answers every call in the
//! worker) or returns the call to make (`Decision::Call`, or `Some(StoreCall)` on the
//! response path), its continuation kept in the `Pending`.

use super::{CallAnswer, Decision, DedupStream, Env, Plugin, StoreCall, Waiting};
use crate::config::{Config, Home, Policy, Role};
use crate::key::{Digest, RequestHead};
use crate::ordering::entities::Settle;
use crate::record::RecordView;
use crate::reply::LocalReply;
use crate::response::StoredResponse;
use crate::shared_data::SharedData;
use std::any::Any;

/// The configured store (built once from the configuration, per worker).
pub trait Store: std::fmt::Debug + Send + Sync {
    /// The store in words, for the configuration's log line.
    fn describe(&self, config: &Config) -> String;

    /// Set-up at configuration, before the worker serves (shared data: the bucket secret
    /// every worker of the process shares, and the layout's registration). `Err`: the
    /// configuration is refused, with why.
    fn set_up(&mut self, host: &dyn SetUpHost, role: Role) -> Result<(), String>;

    /// Whether the store is reached by store calls: their round trips are timed, and
    /// settling a won claim is one, so the worker holds the response (and buffers a
    /// storable body) until the store has the record.
    fn makes_calls(&self) -> bool;

    /// How often a worker re-checks what its waiters wait for without a wake-up.
    fn recheck_interval_ms(&self) -> u64;

    /// Claims the record `digest` for the stream's request (`payload`: its sealed
    /// payload digest): forwards, answers as a duplicate, or makes a call.
    #[allow(clippy::too_many_arguments)]
    fn claim(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        policy: &Policy,
        head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision;

    /// A woken waiter re-checks its record.
    fn recheck(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        w: Box<Waiting>,
        now: u64,
    ) -> Decision;

    /// The operator API's side: `op` on one record or on the store as a whole.
    fn operate(&self, p: &Plugin, env: &mut dyn Env, op: &Operation, now: u64) -> Operated;

    /// The store itself, for a look at its own type (its own tests).
    fn as_any(&self) -> &dyn Any;
}

/// An operator's request to the store (the operator API, `admin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// The store's counts.
    Stats,
    /// The live record of `digest` (homed at `home`, with regions).
    Get { digest: Digest, home: Home },
    /// Removes the live record of `digest`; a claim (its request may be running) only
    /// with `force`.
    Delete {
        digest: Digest,
        home: Home,
        force: bool,
    },
}

/// What the store answered an operation: done, or a call to make first.
pub enum Operated {
    /// The store's counts, as the operator API shows them.
    Stats(serde_json::Value),
    /// The record found.
    Found(RecordView),
    /// Removed: the record as it was (when the store read it), or the shard it was on.
    Removed {
        view: Option<RecordView>,
        shard: Option<String>,
    },
    /// Not removed: a claim, and `force` was not given.
    Refused,
    NotFound,
    /// The store could not answer (why).
    Unavailable(String),
    /// A call to make, and what to do with its answer.
    Call(StoreCall, Box<dyn Operating>),
}

/// An operation waiting for its store call's answer.
pub trait Operating: Send {
    fn answered(self: Box<Self>, env: &mut dyn Env, answer: CallAnswer, now: u64) -> Operated;
}

/// A claim a stream won, in the store that made it (it carries that store).
pub trait Held: Send {
    /// The record claimed.
    fn digest(&self) -> &Digest;

    /// Writes the completed record (with `response` when the store keeps it), and ends
    /// the entity's flight as `entity` says.
    fn complete(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        response: Option<StoredResponse>,
        entity: Settle,
        now: u64,
    ) -> Option<StoreCall>;

    /// Removes the claim: the request certainly did not run. `forwarded`: it was sent
    /// (and refused, or never reached the upstream), so the release is counted and the
    /// entity's flight ends too; a claim never forwarded (its entity said no, or it
    /// yielded to another record) is neither.
    fn release(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        forwarded: bool,
    ) -> Option<StoreCall>;

    /// Marks the claim held (an unknown outcome): until `until_ms` when given, else until
    /// its in-flight expiry.
    fn hold(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        until_ms: Option<u64>,
    ) -> Option<StoreCall>;

    /// Claims the stream's entity for its version (the ordering guard), for this won
    /// claim: `Ok` forwards it; `Err` is what the stream does instead (a call out, or an
    /// answer with this claim released).
    fn claim_entity(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        token: u64,
        now: u64,
    ) -> Result<Box<dyn Held>, Decision>;
}

/// A store call out for a stream, and what to do with its answer.
pub trait Pending: Any + Send {
    /// The call's answer came.
    fn answered(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        answer: CallAnswer,
    ) -> Decision;

    /// The client left while the call was out. `false`: the call's answer is of no use
    /// any more (a waiter's read); `true`: it still decides what the store keeps (a
    /// claim won now is released, since nothing was forwarded).
    fn client_gone(&mut self) -> bool;

    /// Whether the stream waits (wait mode) while this call is out.
    fn waiting(&self) -> bool {
        false
    }

    /// The client's answer, to send once the settling calls are done.
    fn reply_once_settled(&mut self, _reply: Option<LocalReply>) {}

    /// What the call is, for debug output.
    fn name(&self) -> &'static str;

    /// The call as the store's own type (only the store that made it looks).
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// What a store's set-up may use of the host.
pub trait SetUpHost: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Fresh random bytes (`Err`: the host's errno).
    fn random_bytes(&self) -> Result<[u8; 32], u16>;
    fn warn(&self, message: &str);
}

/// What a store keeps per worker (etcd: its leases and its tier of completed records), in
/// the worker's `Env`: one slot, holding the configured store's own type.
#[derive(Default)]
pub struct StoreWorker(Option<Box<dyn Any + Send>>);

impl StoreWorker {
    /// The slot's state as `T`, made fresh when it holds nothing (or another type).
    pub fn get<T: Any + Send + Default>(&mut self) -> &mut T {
        if !self.0.as_ref().is_some_and(|b| b.is::<T>()) {
            self.0 = Some(Box::<T>::default());
        }
        // The slot holds a `T` now: the fallback is never taken (a leaked default would
        // be a fresh, empty state; it keeps this accessor free of panics).
        self.0
            .as_mut()
            .and_then(|b| b.downcast_mut::<T>())
            .unwrap_or_else(|| Box::leak(Box::<T>::default()))
    }
}

impl std::fmt::Debug for StoreWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreWorker")
    }
}

/// Seconds in words (`1 d 0 h 2 min 40 s`), for log lines.
pub fn human_duration(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{sec} s"),
        (0, 0, _) => format!("{m} min {sec} s"),
        (0, _, _) => format!("{h} h {m} min {sec} s"),
        _ => format!("{d} d {h} h {m} min {sec} s"),
    }
}

impl DedupStream {
    /// Claims the record `digest` for this request, in the configured store.
    pub(crate) fn claim(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        policy: &Policy,
        head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        p.store.claim(self, p, env, policy, head, digest, payload)
    }

    /// A woken waiter re-checks its record.
    pub(crate) fn recheck(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        w: Box<Waiting>,
        now: u64,
    ) -> Decision {
        p.store.recheck(self, p, env, w, now)
    }

    /// Writes the completed record (with `response` when the store keeps it), and the
    /// entity's settle beside it.
    pub(crate) fn complete_claim(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: Box<dyn Held>,
        response: Option<StoredResponse>,
        now: u64,
    ) -> Option<StoreCall> {
        let entity = self.completed_entity(p);
        owned.complete(self, p, env, response, entity, now)
    }

    /// Removes the claim: the request certainly did not run.
    pub(crate) fn release_claim(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: Box<dyn Held>,
    ) -> Option<StoreCall> {
        owned.release(self, p, env, true)
    }

    /// Marks the claim held (an unknown outcome).
    pub(crate) fn hold_claim(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: Box<dyn Held>,
        until_ms: Option<u64>,
    ) -> Option<StoreCall> {
        owned.hold(self, p, env, until_ms)
    }

    /// Releases a won claim that was never forwarded (its entity said no, or it yielded
    /// to another record): not counted as a release, its waiters woken.
    pub(crate) fn release_unrun(
        &mut self,
        p: &Plugin,
        env: &mut dyn Env,
        owned: Box<dyn Held>,
    ) -> Option<StoreCall> {
        owned.release(self, p, env, false)
    }
}
