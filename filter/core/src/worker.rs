//! One worker (one VM per Envoy worker thread): the configured plugin and the state its
//! streams share (what its store keeps per worker, wait mode's waiters, its wake-up
//! queue and tick, claim tokens, streams that ended with a store call out).
//! The glue maps its root callbacks here (`configure`, `on_tick`, `on_queue_ready`,
//! `on_orphan_answer`) and runs every stream callback through `run`, which gives the
//! stream its `Env`. The host is the `Host` seam: the glue's host calls, or the fake.
//!
//! Wait mode across workers: a worker that completes or releases a record enqueues its
//! digest to every queue on the shared board (`wake_everywhere`); Envoy runs
//! `on_queue_ready` on each queue's worker, which wakes its waiters of that record. The
//! tick re-checks the rest: deadlines, and a periodic re-read (shared data) or poll
//! (etcd) for what no queue reports.

use crate::config::Config;
use crate::key::Digest;
use crate::metrics::{Counter, Remote};
use crate::shared_data::SharedData;
use crate::stream::{
    CallAnswer, Decision, DedupStream, Env, Plugin, SetUpHost, StoreCall, StoreWorker,
};
use crate::wait::{announce, listeners, Waiters, TICK_MS};
use std::collections::HashMap;

mod carry;
pub use carry::{response_action, Action, Answerer, Side, StreamIo};

/// How long past its waiters' deadlines a worker stays on the board.
const BOARD_MARGIN_MS: u64 = 5_000;
/// The phase-timed build reports its phases' counters once per this many streams.
pub const PHASE_REPORT_EVERY: u32 = 16;
/// Most items taken from the queue in one callback.
const MAX_DEQUEUE: usize = 4096;

/// A log level of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What a worker needs of the host, besides shared data. Errors are the host's status
/// codes (only logged).
pub trait Host: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch (Envoy's clock).
    fn now_ms(&self) -> u64;
    fn log(&self, level: Level, message: &str);
    /// Whether the host logs at debug level (asked before a debug line is formatted).
    fn debug_enabled(&self) -> bool;
    fn define_counter(&self, name: &str) -> Result<u32, u32>;
    fn define_histogram(&self, name: &str) -> Result<u32, u32>;
    fn increment(&self, metric: u32);
    /// Adds `n` to counter `metric`.
    fn add(&self, metric: u32, n: u64);
    /// Records `value` in histogram `metric`.
    fn record(&self, metric: u32, value: u64);
    /// Fresh random bytes (WASI `random_get`; `Err`: its errno).
    fn random_bytes(&self) -> Result<[u8; 32], u16>;
    /// A random per-VM seed for claim tokens.
    fn random_seed(&self) -> u64;
    fn set_tick_period(&self, period_ms: u32) -> Result<(), u32>;
    fn register_queue(&self, name: &str) -> Result<u32, u32>;
    fn enqueue(&self, queue: u32, item: &[u8]) -> Result<(), u32>;
    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32>;
    /// Sends a store call; its token, or the answer to give the stream at once when it
    /// could not be dispatched.
    fn dispatch(&self, call: &StoreCall) -> Result<u32, CallAnswer>;
}

/// A configured worker.
pub struct Worker {
    pub plugin: Plugin,
    state: State,
}

/// What a worker's streams share, apart from the plugin (so a stream callback can have
/// the plugin and this at once).
struct State {
    /// Metric ids indexed by `Counter::index`; `None` if the host refused to define one.
    metrics: Vec<Option<u32>>,
    /// Regions: the remote claims' and completions' metric ids, by home region index
    /// (`None` for this proxy's own region, or if the host refused one).
    remote_metrics: Vec<(Option<u32>, Option<u32>)>,
    /// Histogram of store-call round trips in ms (a store reached by calls).
    store_call_ms: Option<u32>,
    /// Claim tokens: a random per-VM seed mixed with a counter.
    token_seed: u64,
    token_counter: u64,
    /// What the configured store keeps per worker.
    store: StoreWorker,
    /// The phase-timed build: each phase's counters (ns, count), and the streams ended
    /// since they were last reported.
    phase_metrics: Vec<(crate::phases::Phase, Option<u32>, Option<u32>)>,
    ended: u32,
    /// Streams that ended with a store call out, by the call's token. Bounded by the
    /// calls in flight: every call has a timeout, and Envoy answers or cancels it.
    orphans: HashMap<u32, DedupStream>,
    /// Wait mode: the duplicates this worker holds.
    waiters: Waiters,
    /// This VM's wake-up queue, once registered.
    queue: Option<u32>,
    /// Until when this worker's queue is on the shared board (ms).
    announced_until: u64,
    /// Whether this worker's tick is on (only while it holds waiters).
    ticking: bool,
}

impl Worker {
    /// Configures a worker from the plugin configuration `bytes`: the metrics, and for
    /// shared data the bucket secret every worker of the process shares and the layout's
    /// registration. `None` (logged) when the configuration is refused.
    pub fn configure<H: Host>(host: &H, bytes: &[u8]) -> Option<Worker> {
        let config = match Config::parse(bytes) {
            Ok(c) => c,
            Err(e) => {
                host.log(Level::Error, &format!("proxy-dedup: {e}"));
                return None;
            }
        };
        let metrics = Counter::ALL
            .iter()
            .map(|c| match host.define_counter(c.name()) {
                Ok(id) => Some(id),
                Err(status) => {
                    host.log(
                        Level::Warn,
                        &format!(
                            "proxy-dedup: cannot define metric {} (status {status})",
                            c.name()
                        ),
                    );
                    None
                }
            })
            .collect();
        let phase_metrics = if crate::phases::ENABLED {
            crate::phases::Phase::ALL
                .iter()
                .map(|&ph| {
                    let name = ph.name();
                    let ns = host
                        .define_counter(&format!("proxy_dedup_phase_{name}_ns"))
                        .ok();
                    let n = host
                        .define_counter(&format!("proxy_dedup_phase_{name}_count"))
                        .ok();
                    (ph, ns, n)
                })
                .collect()
        } else {
            Vec::new()
        };
        let remote_metrics = remote_metrics(host, &config);
        let role = config.role;
        let mut store = crate::stores::build(&config);
        if let Err(e) = store.set_up(host, role) {
            host.log(Level::Error, &format!("proxy-dedup: {e}"));
            return None;
        }
        let plugin = Plugin::with_store(config, store);
        let store_call_ms = if plugin.store.makes_calls() {
            host.define_histogram("proxy_dedup_store_call_ms").ok()
        } else {
            None
        };
        host.log(
            Level::Info,
            &format!(
                "proxy-dedup {}: configured; store: {}",
                env!("CARGO_PKG_VERSION"),
                plugin.store.describe(&plugin.config)
            ),
        );
        Some(Worker {
            plugin,
            state: State {
                metrics,
                remote_metrics,
                store_call_ms,
                token_seed: host.random_seed(),
                token_counter: 0,
                store: StoreWorker::default(),
                phase_metrics,
                ended: 0,
                orphans: HashMap::new(),
                waiters: Waiters::default(),
                queue: None,
                announced_until: 0,
                ticking: false,
            },
        })
    }

    /// A stream ended: in the phase-timed build, every `PHASE_REPORT_EVERY` streams the
    /// time and count of each phase so far go to its counters.
    pub fn stream_ended<H: Host>(&mut self, host: &H) {
        if !crate::phases::ENABLED {
            return;
        }
        let st = &mut self.state;
        st.ended += 1;
        if st.ended < PHASE_REPORT_EVERY {
            return;
        }
        st.ended = 0;
        for (phase, ns, n) in crate::phases::take() {
            if n == 0 {
                continue;
            }
            if let Some(&(_, ns_id, n_id)) = st.phase_metrics.iter().find(|m| m.0 == phase) {
                if let Some(id) = ns_id {
                    host.add(id, ns);
                }
                if let Some(id) = n_id {
                    host.add(id, n);
                }
            }
        }
    }

    /// The histogram of store-call round trips, when the store makes calls.
    pub fn store_call_ms(&self) -> Option<u32> {
        self.state.store_call_ms
    }

    /// Runs `f` (a stream callback) with the plugin and this worker's `Env`, without
    /// anything after it (the operator API, which never waits).
    pub fn with_env<H: Host, R>(
        &mut self,
        host: &H,
        f: impl FnOnce(&Plugin, &mut WorkerEnv<'_, H>) -> R,
    ) -> R {
        let mut env = WorkerEnv {
            host,
            namespace: self.plugin.config.namespace(),
            state: &mut self.state,
            now_ms: std::cell::Cell::new(None),
        };
        f(&self.plugin, &mut env)
    }

    /// Runs a stream callback (`with_env`); then a worker that holds waiters ticks and is
    /// on the board (`waiters_changed`).
    pub fn run<H: Host, R>(
        &mut self,
        host: &H,
        f: impl FnOnce(&Plugin, &mut WorkerEnv<'_, H>) -> R,
    ) -> R {
        let r = self.with_env(host, f);
        self.waiters_changed(host);
        r
    }

    /// After a stream callback: a worker that holds waiters ticks and is on the board,
    /// long enough for its longest wait.
    fn waiters_changed<H: Host>(&mut self, host: &H) {
        let st = &mut self.state;
        if st.waiters.is_empty() {
            return;
        }
        if !st.ticking {
            match host.set_tick_period(TICK_MS as u32) {
                Ok(()) => st.ticking = true,
                Err(status) => host.log(
                    Level::Warn,
                    &format!("proxy-dedup: cannot start the wait tick (status {status})"),
                ),
            }
        }
        let now = host.now_ms();
        let wait_ms = self.plugin.config.longest_wait_ms();
        if st.announced_until >= now.saturating_add(wait_ms) {
            return;
        }
        let namespace = self.plugin.config.namespace();
        let token = match st.queue {
            Some(t) => t,
            None => {
                let name = format!("{namespace}/wake/{:016x}", st.token_seed);
                match host.register_queue(&name) {
                    Ok(t) => {
                        st.queue = Some(t);
                        t
                    }
                    Err(status) => {
                        host.log(
                            Level::Warn,
                            &format!(
                                "proxy-dedup: cannot register the wake-up queue (status {status}); \
                                 waiters re-check on the tick only"
                            ),
                        );
                        return;
                    }
                }
            }
        };
        let until = now.saturating_add(wait_ms).saturating_add(BOARD_MARGIN_MS);
        match announce(host, namespace, token, until, now) {
            Ok(()) => st.announced_until = until,
            Err(e) => host.log(
                Level::Warn,
                &format!("proxy-dedup: cannot put the wake-up queue on the board: {e}"),
            ),
        }
    }

    /// The tick (or a wake-up): the waiting streams due now, for the glue to wake
    /// (`forget_waiter` those that are gone). The tick stops when no waiter is left.
    pub fn on_tick<H: Host>(&mut self, host: &H) -> Vec<u32> {
        let now = host.now_ms();
        let st = &mut self.state;
        if st.waiters.is_empty() {
            if st.ticking && host.set_tick_period(0).is_ok() {
                st.ticking = false;
            }
            return Vec::new();
        }
        st.waiters
            .take_due(now, self.plugin.store.recheck_interval_ms())
    }

    /// A stream the tick woke is gone without telling us: forget it.
    pub fn forget_waiter(&mut self, stream: u32) {
        self.state.waiters.remove(stream);
    }

    /// This worker's queue has digests of records that changed: wakes their waiters and
    /// returns the streams due now (as `on_tick`), or none when nobody was woken.
    pub fn on_queue_ready<H: Host>(&mut self, host: &H, queue: u32) -> Vec<u32> {
        let mut woken = 0;
        for _ in 0..MAX_DEQUEUE {
            match host.dequeue(queue) {
                Ok(Some(item)) => woken += self.on_queue_item(&item),
                Ok(None) | Err(_) => break,
            }
        }
        if woken > 0 {
            self.on_tick(host)
        } else {
            Vec::new()
        }
    }

    /// One item of the queue: the digest of a record that changed. Returns how many of
    /// its waiters were woken (anything not a digest wakes nobody).
    pub fn on_queue_item(&mut self, item: &[u8]) -> usize {
        <Digest>::try_from(item).map_or(0, |digest| self.state.waiters.wake(&digest))
    }

    /// A stream that ended with a store call out keeps living here, keyed by that call's
    /// token, until the store has answered (a completion or release must reach the store
    /// whether or not the client is still there).
    pub fn adopt_orphan(&mut self, token: u32, stream: DedupStream) {
        self.state.orphans.insert(token, stream);
    }

    /// The number of orphans waiting for their call's answer.
    pub fn orphans(&self) -> usize {
        self.state.orphans.len()
    }

    /// The answer to an orphan's call: drives its stream on, dispatching any retry; the
    /// orphan is forgotten once it needs nothing more. Calls that cannot be dispatched
    /// are answered at once, as transport failures.
    pub fn on_orphan_answer<H: Host>(&mut self, host: &H, token: u32, answer: CallAnswer) {
        let Some(mut stream) = self.state.orphans.remove(&token) else {
            return;
        };
        let mut next = self.run(host, |p, env| stream.on_store_answer(p, env, answer));
        while let Decision::Call(call) = next {
            match host.dispatch(&call) {
                Ok(token) => return self.adopt_orphan(token, stream),
                Err(answer) => {
                    next = self.run(host, |p, env| stream.on_store_answer(p, env, answer));
                }
            }
        }
    }
}

/// A record changed: every worker holding waiters hears of it (this one too).
pub fn wake_everywhere<H: Host + ?Sized>(host: &H, namespace: &str, digest: &Digest) {
    let now = host.now_ms();
    let tokens = match listeners(host, namespace, now) {
        Ok(t) => t,
        Err(e) => {
            host.log(
                Level::Warn,
                &format!("proxy-dedup: cannot read the wake-up board: {}", e.0),
            );
            return;
        }
    };
    for token in tokens {
        if let Err(status) = host.enqueue(token, digest) {
            if host.debug_enabled() {
                host.log(
                    Level::Debug,
                    &format!("proxy-dedup: wake-up queue {token}: status {status}"),
                );
            }
        }
    }
}

/// A stream's `Env`: the host's services and this worker's shared state.
pub struct WorkerEnv<'a, H> {
    host: &'a H,
    namespace: &'a str,
    state: &'a mut State,
    /// The host's clock, read once per callback: one instant decides a callback (a
    /// claim and the expiry its duplicate's answer advertises), and a clock read is a
    /// host call.
    now_ms: std::cell::Cell<Option<u64>>,
}

impl<H: Host> SharedData for WorkerEnv<'_, H> {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, crate::shared_data::HostFault> {
        self.host.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), crate::shared_data::SetError> {
        self.host.set(key, value, cas)
    }
}

impl<H: Host> Env for WorkerEnv<'_, H> {
    fn now_ms(&self) -> u64 {
        match self.now_ms.get() {
            Some(now) => now,
            None => {
                let now = self.host.now_ms();
                self.now_ms.set(Some(now));
                now
            }
        }
    }

    fn new_token(&mut self) -> u64 {
        let n = self.state.token_counter.wrapping_add(1);
        self.state.token_counter = n;
        splitmix64(self.state.token_seed ^ n)
    }

    fn count(&mut self, counter: Counter) {
        if let Some(Some(id)) = self.state.metrics.get(counter.index()) {
            self.host.increment(*id);
        }
    }

    fn count_remote(&mut self, what: Remote, region: u16) {
        let ids = self.state.remote_metrics.get(usize::from(region));
        let id = ids.and_then(|ids| match what {
            Remote::Claims => ids.0,
            Remote::Completions => ids.1,
        });
        if let Some(id) = id {
            self.host.increment(id);
        }
    }

    fn debug(&self, message: std::fmt::Arguments<'_>) {
        if self.host.debug_enabled() {
            self.host.log(Level::Debug, &message.to_string());
        }
    }

    fn warn(&self, message: &str) {
        self.host.log(Level::Warn, message);
    }

    fn store_worker(&mut self) -> &mut StoreWorker {
        &mut self.state.store
    }

    fn waiters(&mut self) -> &mut Waiters {
        &mut self.state.waiters
    }

    fn wake_waiters(&mut self, digest: &Digest) {
        wake_everywhere(self.host, self.namespace, digest);
    }
}

/// A store's set-up sees the worker's host.
impl<H: Host> SetUpHost for H {
    fn now_ms(&self) -> u64 {
        Host::now_ms(self)
    }
    fn random_bytes(&self) -> Result<[u8; 32], u16> {
        Host::random_bytes(self)
    }
    fn warn(&self, message: &str) {
        self.log(Level::Warn, message);
    }
}

/// Claim tokens from the seed and a counter: distinct per claim, unpredictable across
/// VMs.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests;

/// Regions: the remote claims' and completions' counters of every home region but this
/// proxy's, by region index (none without regions).
fn remote_metrics<H: Host>(host: &H, config: &Config) -> Vec<(Option<u32>, Option<u32>)> {
    let crate::config::StoreConfig::Etcd(ec) = &config.store else {
        return Vec::new();
    };
    let Some(r) = &ec.regions else {
        return Vec::new();
    };
    let define = |what: Remote, region: &str| {
        let name = what.metric(region);
        match host.define_counter(&name) {
            Ok(id) => Some(id),
            Err(status) => {
                host.log(
                    Level::Warn,
                    &format!("proxy-dedup: cannot define metric {name} (status {status})"),
                );
                None
            }
        }
    };
    r.home
        .regions
        .iter()
        .map(|region| {
            if *region == r.local {
                (None, None)
            } else {
                (
                    define(Remote::Claims, region),
                    define(Remote::Completions, region),
                )
            }
        })
        .collect()
}
