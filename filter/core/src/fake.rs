//! Test fakes: shared data with Envoy's exact rules, and an `Env` around it.
#![allow(dead_code)]

use crate::metrics::Counter;
use crate::store::{HostFault, SetError, SharedData};
use crate::stream::Env;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Hook = Box<dyn FnMut() + Send>;

/// Envoy's shared data for one vm_id: one mutex, one global cas counter (never 0),
/// absent keys ignore the cas argument, cas 0 overwrites, empty values stay as tombstones.
#[derive(Default)]
pub struct FakeShared {
    inner: Mutex<Inner>,
    /// Runs once just before the next set takes the lock: lets a test slip another
    /// worker's operation between a read and its CAS.
    hook: Mutex<Option<Hook>>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    fail: bool,
    sets: u64,
}

impl FakeShared {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeShared::default())
    }

    pub fn key_count(&self) -> usize {
        self.inner.lock().unwrap().map.len()
    }

    pub fn keys(&self) -> Vec<String> {
        self.inner.lock().unwrap().map.keys().cloned().collect()
    }

    pub fn raw(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.inner.lock().unwrap().map.get(key).cloned()
    }

    pub fn set_failing(&self, fail: bool) {
        self.inner.lock().unwrap().fail = fail;
    }

    pub fn sets(&self) -> u64 {
        self.inner.lock().unwrap().sets
    }

    pub fn before_next_set(&self, f: impl FnMut() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(f));
    }
}

impl SharedData for FakeShared {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        let inner = self.inner.lock().unwrap();
        if inner.fail {
            return Err(HostFault("injected fault".into()));
        }
        Ok(inner.map.get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(mut h) = hook {
            h();
        }
        let mut inner = self.inner.lock().unwrap();
        if inner.fail {
            return Err(SetError::Fault(HostFault("injected fault".into())));
        }
        if let Some((_, current)) = inner.map.get(key) {
            if cas != 0 && cas != *current {
                return Err(SetError::CasMismatch);
            }
        }
        inner.next_cas = inner.next_cas.wrapping_add(1);
        if inner.next_cas == 0 {
            inner.next_cas = 1;
        }
        let new_cas = inner.next_cas;
        inner.map.insert(key.to_string(), (value.to_vec(), new_cas));
        inner.sets += 1;
        Ok(())
    }
}

/// One worker's view: the shared store, a settable clock, counters, a log.
pub struct FakeEnv {
    pub shared: Arc<FakeShared>,
    pub now_ms: u64,
    pub next_token: u64,
    pub counters: HashMap<Counter, u64>,
    pub log: Vec<String>,
}

impl FakeEnv {
    pub fn new(shared: Arc<FakeShared>, worker: u64) -> Self {
        FakeEnv {
            shared,
            now_ms: 1_700_000_000_000,
            next_token: worker << 48,
            counters: HashMap::new(),
            log: Vec::new(),
        }
    }

    pub fn count_of(&self, c: Counter) -> u64 {
        self.counters.get(&c).copied().unwrap_or(0)
    }
}

impl SharedData for FakeEnv {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        self.shared.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        self.shared.set(key, value, cas)
    }
}

impl Env for FakeEnv {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn new_token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }
    fn count(&mut self, counter: Counter) {
        *self.counters.entry(counter).or_default() += 1;
    }
    fn debug(&self, _message: &str) {}
    fn warn(&self, _message: &str) {}
}
