//! State one Envoy process shares between its worker VMs: shared data,
//! shared queues, metrics, logs, the virtual clock and fault switches.

use crate::abi::{LogLevel, MetricKind, Status};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// One line a VM logged (`proxy_log`, or stdout/stderr through WASI), or a
/// line the host logged about a VM (traps).
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub worker: usize,
    pub level: LogLevel,
    pub message: String,
}

/// Fault switches for the stores a filter depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// `proxy_get_shared_data` returns this status instead of answering.
    pub shared_data_get: Option<Status>,
    /// `proxy_set_shared_data` returns this status instead of writing.
    pub shared_data_set: Option<Status>,
}

impl Faults {
    /// Shared data get and set both fail with `status`.
    pub fn shared_data(status: Status) -> Faults {
        Faults {
            shared_data_get: Some(status),
            shared_data_set: Some(status),
        }
    }
}

/// A metric as Envoy's stats store holds it (shared by all workers).
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub kind: MetricKind,
    /// Counter total or gauge value.
    pub value: u64,
    /// Histogram samples.
    pub samples: Vec<u64>,
}

pub(crate) struct Queue {
    pub items: VecDeque<Vec<u8>>,
    /// Last registrant gets `on_queue_ready` (as in cpp-host).
    pub owner_worker: usize,
    pub owner_context: u32,
}

pub(crate) struct SharedInner {
    /// vm_id -> key -> (value, cas)
    pub data: HashMap<String, HashMap<String, (Vec<u8>, u32)>>,
    pub next_cas: u32,
    pub queues: HashMap<u32, Queue>,
    pub queue_tokens: HashMap<(String, String), u32>,
    pub next_queue_token: u32,
    /// (worker, root context, queue token) waiting for delivery.
    pub queue_ready: Vec<(usize, u32, u32)>,
    pub metrics: HashMap<String, Metric>,
    pub logs: Vec<LogLine>,
    pub log_level: LogLevel,
    pub echo_logs: bool,
    /// Virtual wall clock and monotonic clock, nanoseconds.
    pub now_ns: u64,
    pub monotonic_ns: u64,
    pub faults: Faults,
}

/// 2026-01-01T00:00:00Z: a fixed start so tests are reproducible.
pub(crate) const CLOCK_START_NS: u64 = 1_767_225_600_000_000_000;

impl SharedInner {
    pub fn new(log_level: LogLevel) -> SharedInner {
        SharedInner {
            data: HashMap::new(),
            next_cas: 1,
            queues: HashMap::new(),
            queue_tokens: HashMap::new(),
            next_queue_token: 1,
            queue_ready: Vec::new(),
            metrics: HashMap::new(),
            logs: Vec::new(),
            log_level,
            echo_logs: std::env::var_os("HOST_TEST_LOG").is_some(),
            now_ns: CLOCK_START_NS,
            monotonic_ns: 1_000_000_000,
            faults: Faults::default(),
        }
    }

    fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        cas
    }

    /// cpp-host `SharedData::get`.
    pub fn get(&self, vm_id: &str, key: &str) -> Result<(Vec<u8>, u32), Status> {
        if let Some(status) = self.faults.shared_data_get {
            return Err(status);
        }
        self.data
            .get(vm_id)
            .and_then(|m| m.get(key))
            .cloned()
            .ok_or(Status::NotFound)
    }

    /// cpp-host `SharedData::set`: an absent key ignores `cas`; a present
    /// key accepts cas 0 or its current cas; every write takes a new cas
    /// from one counter shared by all keys.
    pub fn set(&mut self, vm_id: &str, key: &str, value: &[u8], cas: u32) -> Status {
        if let Some(status) = self.faults.shared_data_set {
            return status;
        }
        let present = self.data.get(vm_id).and_then(|m| m.get(key)).map(|e| e.1);
        if let Some(current) = present {
            if cas != 0 && cas != current {
                return Status::CasMismatch;
            }
        }
        let new_cas = self.next_cas();
        // Envoy copies the value once, from the VM's memory: so does this (a key and a
        // vm_id are copied only when new).
        let map = match self.data.get_mut(vm_id) {
            Some(m) => m,
            None => self.data.entry(vm_id.to_string()).or_default(),
        };
        match map.get_mut(key) {
            Some(entry) => {
                entry.0.clear();
                entry.0.extend_from_slice(value);
                entry.1 = new_cas;
            }
            None => {
                map.insert(key.to_string(), (value.to_vec(), new_cas));
            }
        }
        Status::Ok
    }

    pub fn log(&mut self, worker: usize, level: LogLevel, message: String) {
        if level < self.log_level {
            return;
        }
        if self.echo_logs {
            eprintln!("[worker {worker}] [{level:?}] {message}");
        }
        self.logs.push(LogLine {
            worker,
            level,
            message,
        });
    }
}

pub(crate) type Shared = Arc<Mutex<SharedInner>>;

pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, SharedInner> {
    // A panic while holding the lock (a failed assertion in a test handler)
    // must not hide the state from the rest of the test.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
