//! The operator API's side of the etcd store: a record is read on its shard (a delete
//! whose compare never holds returns the current value), then, during a resharding, on
//! its shard under the other map; a removal is a delete compared on the revision read;
//! the counts are read shard by shard.

use super::wire::{self as etcd, EtcdAnswer, EtcdRecord};
use super::EtcdStore;
use crate::config::Home;
use crate::key::Digest;
use crate::record::RecordView;
use crate::stream::{CallAnswer, Env, Operated, Operating, Operation, Route, StoreCall};
use serde_json::{json, Value};
use std::sync::Arc;

/// An operation on etcd waiting for its call's answer.
struct EtcdOperation {
    ec: EtcdStore,
    op: Operation,
    key: String,
    /// Removal attempts (a record that changed between read and delete is read again).
    rounds: u32,
    /// The shard the call out goes to, and whether it is the key's shard under the
    /// other map of a resharding (read when its own shard has no live record).
    shard: Option<Arc<Route>>,
    on_check: bool,
    /// The record's home (regions).
    home: Home,
    /// `Stats`: each shard's count so far, in the map's order.
    counts: Vec<(String, u64)>,
}

impl EtcdStore {
    /// An operator's request: the record (or the first shard's count) is read first.
    pub(super) fn operate_on(&self, op: &Operation) -> Operated {
        let mut o = EtcdOperation {
            ec: self.clone(),
            op: op.clone(),
            key: String::new(),
            rounds: 0,
            shard: None,
            on_check: false,
            home: Home::default(),
            counts: Vec::new(),
        };
        let call = match *op {
            Operation::Stats => match self.routes().first() {
                Some(first) => count_call(self, first),
                None => return Operated::Stats(stats(&o.counts)),
            },
            Operation::Get { digest, home } | Operation::Delete { digest, home, .. } => {
                o.key = etcd::record_key(&self.config.prefix, &digest);
                o.home = home;
                let route = Arc::clone(self.route_of(home, &digest));
                let call = read_call(self, &route, &o.key);
                o.shard = Some(route);
                call
            }
        };
        Operated::Call(call, Box::new(o))
    }
}

impl Operating for EtcdOperation {
    fn answered(mut self: Box<Self>, _env: &mut dyn Env, answer: CallAnswer, now: u64) -> Operated {
        let ec = self.ec.clone();
        let unavailable = Operated::Unavailable;
        let (digest, delete, force) = match self.op {
            Operation::Stats => return self.counted(&answer),
            Operation::Get { digest, .. } => (digest, false, false),
            Operation::Delete { digest, force, .. } => (digest, true, force),
        };
        let shard = self
            .shard
            .as_ref()
            .map_or(String::new(), |r| r.shard.clone());
        let proto = ec.config.protocol;
        match etcd::read_answer(proto.txn_path(), answer.status, &answer.body) {
            // Our delete went through.
            Some(EtcdAnswer::Txn {
                succeeded: true, ..
            }) => Operated::Removed {
                view: None,
                shard: Some(shard),
            },
            Some(EtcdAnswer::Txn { existing: None, .. }) => self.not_here(&digest),
            Some(EtcdAnswer::Txn {
                existing: Some((mod_revision, value)),
                ..
            }) => {
                let Some(r) = EtcdRecord::decode(&value, &digest) else {
                    return unavailable("the record cannot be read by this version".to_string());
                };
                let claim = r.state.is_claim();
                if !claim && r.expires_ms <= now {
                    return self.not_here(&digest);
                }
                if !delete {
                    return Operated::Found(RecordView {
                        state: r.state.name(),
                        expires_ms: r.expires_ms,
                        payload: r.payload,
                        response: r.response.as_ref().map(|s| (s.status, s.body.len())),
                        buckets: 0,
                        claim_lives_to_ttl: false,
                        shard: Some(shard),
                    });
                }
                if claim && !force {
                    return Operated::Refused;
                }
                self.rounds += 1;
                if self.rounds > 4 {
                    return unavailable("the record keeps changing; try again".to_string());
                }
                let Some(route) = self.shard.clone() else {
                    return unavailable("no shard for the record".to_string());
                };
                let call = ec.call(
                    &route,
                    proto.txn_path(),
                    proto.delete_txn(&self.key, mod_revision),
                    ec.config.timeout_ms,
                );
                Operated::Call(call, self)
            }
            Some(EtcdAnswer::Error { code, message }) => {
                unavailable(format!("etcd error {code}: {message}"))
            }
            _ => unavailable(format!("etcd answered {} unreadably", answer.status)),
        }
    }
}

impl EtcdOperation {
    /// `Stats`: one shard's count; the next shard's is read, or the counts are done.
    fn counted(mut self: Box<Self>, answer: &CallAnswer) -> Operated {
        let ec = self.ec.clone();
        let routes = ec.routes();
        let Some(route) = routes.get(self.counts.len()) else {
            return Operated::Stats(stats(&self.counts));
        };
        match etcd::read_count(ec.config.protocol.range_path(), answer.status, &answer.body) {
            Some(n) => {
                self.counts.push((route.shard.clone(), n));
                match routes.get(self.counts.len()) {
                    Some(next) => Operated::Call(count_call(&ec, next), self),
                    None => Operated::Stats(stats(&self.counts)),
                }
            }
            None => Operated::Unavailable(format!(
                "etcd shard `{}` answered {} without a count",
                route.shard, answer.status
            )),
        }
    }

    /// No live record on the shard read: during a resharding, the key's shard under the
    /// other map is read next (a record written there still answers for the key).
    fn not_here(mut self: Box<Self>, digest: &Digest) -> Operated {
        if !self.on_check {
            if let Some(other) = self.ec.check_route_of(self.home, digest) {
                let other = Arc::clone(other);
                self.on_check = true;
                self.rounds = 0;
                let call = read_call(&self.ec, &other, &self.key);
                self.shard = Some(other);
                return Operated::Call(call, self);
            }
        }
        Operated::NotFound
    }
}

/// `GET /stats` on etcd: the records of each shard, and their sum.
fn stats(counts: &[(String, u64)]) -> Value {
    let shards: Vec<Value> = counts
        .iter()
        .map(|(name, n)| json!({"name": name, "records": n}))
        .collect();
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    json!({"store": "etcd", "records": total, "shards": shards})
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
