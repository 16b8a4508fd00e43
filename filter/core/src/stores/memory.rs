//! A third store, for tests only: records in this process's memory, one map behind a
//! lock. It shows what a store is made of (the folder-or-file of `Store` and `Held`,
//! nothing else): its tests run streams on it through the same interface as the real
//! stores', and nothing in `stream`, `worker`, `admin` or the glue names it. It is not a
//! store to deploy: Envoy's workers share no memory, and it keeps records until they
//! expire with no bound. (Ordering is not supported: `claim_entity` forwards unordered.)

use crate::config::{Config, Policy, Role};
use crate::key::{Digest, RequestHead};
use crate::ordering::entities::Settle;
use crate::principal::compare;
use crate::record::RecordTimes;
use crate::response::StoredResponse;
use crate::stream::{
    Decision, DedupStream, Duplicate, Env, Held, Operated, Operation, Plugin, SetUpHost, Store,
    StoreCall, Waiting,
};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
enum State {
    InFlight { token: u64 },
    Held { until_ms: u64 },
    Completed(Option<StoredResponse>),
}

#[derive(Debug, Clone)]
struct Record {
    payload: Digest,
    state: State,
    expires_ms: u64,
}

/// Records in memory, shared by every clone of the store.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<Digest, Record>>>,
}

impl MemoryStore {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<Digest, Record>) -> R) -> Option<R> {
        self.records.lock().ok().map(|mut m| f(&mut m))
    }

    /// Claims `digest`, or answers what holds it.
    fn claim_now(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        let now = env.now_ms();
        let token = env.new_token();
        let policy = p.config.policy_at(s.rule);
        let found = self.with(|m| {
            if let Some(r) = m.get(&digest).filter(|r| r.expires_ms > now) {
                return Err(r.clone());
            }
            let expires_ms = now.saturating_add(policy.in_flight_timeout_ms);
            let state = State::InFlight { token };
            m.insert(
                digest,
                Record {
                    payload,
                    state,
                    expires_ms,
                },
            );
            Ok(())
        });
        let found = match found {
            Some(Ok(())) => {
                let held = Box::new(MemoryHeld {
                    store: self.clone(),
                    digest,
                    token,
                });
                return s.forward(p, env, held);
            }
            Some(Err(r)) => r,
            None => return s.store_failed(p, env, "the memory store's lock is poisoned"),
        };
        let times = RecordTimes::expiring(found.expires_ms);
        let dup =
            Duplicate::mismatch(compare(&found.payload, &payload)).unwrap_or(match found.state {
                State::InFlight { .. } => Duplicate::InFlight { held_until: None },
                State::Held { until_ms } => Duplicate::InFlight {
                    held_until: Some(until_ms),
                },
                State::Completed(Some(r)) => Duplicate::Completed(Some(r)),
                State::Completed(None) => Duplicate::NotStored,
            });
        s.duplicate(p, env, dup, times)
    }
}

impl Store for MemoryStore {
    fn describe(&self, _config: &Config) -> String {
        "memory (tests only)".to_string()
    }

    fn set_up(&mut self, _host: &dyn SetUpHost, _role: Role) -> Result<(), String> {
        Ok(())
    }

    fn makes_calls(&self) -> bool {
        false
    }

    fn recheck_interval_ms(&self) -> u64 {
        100
    }

    fn claim(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        _policy: &Policy,
        _head: &RequestHead,
        digest: Digest,
        payload: Digest,
    ) -> Decision {
        self.claim_now(s, p, env, digest, payload)
    }

    fn recheck(
        &self,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        w: Box<Waiting>,
        _now: u64,
    ) -> Decision {
        self.claim_now(s, p, env, w.digest, w.payload)
    }

    fn operate(&self, _p: &Plugin, _env: &mut dyn Env, op: &Operation, _now: u64) -> Operated {
        match op {
            Operation::Stats => {
                let n = self.with(|m| m.len()).unwrap_or(0);
                Operated::Stats(serde_json::json!({"store": "memory", "records": n}))
            }
            Operation::Get { .. } | Operation::Delete { .. } => Operated::NotFound,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A claim won in memory.
struct MemoryHeld {
    store: MemoryStore,
    digest: Digest,
    token: u64,
}

impl MemoryHeld {
    /// Sets the record to `state` until `expires_ms` if the claim is still ours.
    fn settle(&self, state: Option<State>, expires_ms: u64) {
        self.store.with(|m| {
            let ours = matches!(
                m.get(&self.digest),
                Some(Record { state: State::InFlight { token }, .. }) if *token == self.token
            );
            if !ours {
                return;
            }
            match state {
                Some(state) => {
                    if let Some(r) = m.get_mut(&self.digest) {
                        r.state = state;
                        r.expires_ms = expires_ms;
                    }
                }
                None => {
                    m.remove(&self.digest);
                }
            }
        });
    }
}

impl Held for MemoryHeld {
    fn digest(&self) -> &Digest {
        &self.digest
    }

    fn complete(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        _env: &mut dyn Env,
        response: Option<StoredResponse>,
        _entity: Settle,
        now: u64,
    ) -> Option<StoreCall> {
        let ttl = p.config.policy_at(s.rule).ttl_ms;
        self.settle(Some(State::Completed(response)), now.saturating_add(ttl));
        None
    }

    fn release(
        self: Box<Self>,
        _s: &mut DedupStream,
        _p: &Plugin,
        _env: &mut dyn Env,
        _forwarded: bool,
    ) -> Option<StoreCall> {
        self.settle(None, 0);
        None
    }

    fn hold(
        self: Box<Self>,
        s: &mut DedupStream,
        p: &Plugin,
        env: &mut dyn Env,
        until_ms: Option<u64>,
    ) -> Option<StoreCall> {
        let policy = p.config.policy_at(s.rule);
        let until =
            until_ms.unwrap_or_else(|| env.now_ms().saturating_add(policy.in_flight_timeout_ms));
        self.settle(Some(State::Held { until_ms: until }), until);
        None
    }

    fn claim_entity(
        self: Box<Self>,
        _s: &mut DedupStream,
        _p: &Plugin,
        _env: &mut dyn Env,
        _token: u64,
        _now: u64,
    ) -> Result<Box<dyn Held>, Decision> {
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    //! The stream's contract on the third store, through the interface alone.
    use super::MemoryStore;
    use crate::config::Config;
    use crate::stream::Plugin;
    use crate::testing::*;

    fn memory_plugin() -> Plugin {
        let config = Config::parse(b"{}").unwrap();
        Plugin::with_store(config, Box::new(MemoryStore::default()))
    }

    #[test]
    fn a_third_store_keeps_the_contract_through_the_interface_alone() {
        let p = memory_plugin();
        let (_, mut env) = world();
        let r = req("POST", "/charges").key("k").body(r#"{"amount": 5}"#);
        run(&p, &mut env, &r, ok("charged")).assert_upstream("the first execution");
        run(&p, &mut env, &r, ok("again")).assert_replays(b"charged");
        let other = req("POST", "/charges").key("k").body(r#"{"amount": 6}"#);
        assert_eq!(run(&p, &mut env, &other, ok("no")).status(), 422);
        // A status not stored releases the claim: the retry runs.
        let r2 = req("POST", "/charges").key("k2");
        assert_eq!(run(&p, &mut env, &r2, answer(503, "down")).status(), 503);
        run(&p, &mut env, &r2, ok("ran")).assert_upstream("released, so it runs");
        // In flight: 409.
        let r3 = req("POST", "/charges").key("k3");
        let _first = send(&p, &mut env, &r3).unwrap();
        assert_eq!(run(&p, &mut env, &r3, ok("no")).status(), 409);
    }
}
