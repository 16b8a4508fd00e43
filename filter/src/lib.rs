//! proxy-dedup as a proxy-wasm module: registration, the root context (configuration and
//! metrics) and the HTTP context that feeds Envoy's callbacks into `dedup_core`.

mod abi;
mod context;
mod env;
mod http;
mod waiting;

use context::{HttpContext, RootContext};
use dedup_core::config::Role;
use dedup_core::etcd::LeaseCache;
use dedup_core::local::LocalTier;
use dedup_core::store::{bucket_secret, SharedStore, SECRET_LEN};
use dedup_core::stream::CallAnswer;
use dedup_core::wait::Waiters;
use dedup_core::{Config, Counter, DedupStream, Plugin};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// The WASI reactor initialiser: the host calls it once, before any other export. It runs
/// the static constructors (std's start-up), then registers our root context.
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: the linker-generated constructor runner, called once, first.
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors();
    }
    // A panic would trap the VM; say why at critical level first.
    std::panic::set_hook(Box::new(|info| {
        abi::log(abi::LOG_CRITICAL, &format!("proxy-dedup panicked: {info}"));
    }));
    context::set_root_context(|_| -> Box<dyn RootContext> { Box::new(DedupRoot::new()) });
}

/// One worker's state (one VM per worker thread), shared by the root and its HTTP contexts.
pub(crate) struct WorkerState {
    pub plugin: Plugin,
    /// Metric ids indexed by `Counter::index`; `None` if the host refused to define one.
    pub metrics: Vec<Option<u32>>,
    /// Histogram of store-call round trips in ms (etcd store).
    pub store_call_ms: Option<u32>,
    /// Claim tokens: a random per-VM seed mixed with a counter.
    pub token_seed: u64,
    pub token_counter: Cell<u64>,
    /// etcd leases of this worker, reused across requests.
    pub leases: RefCell<LeaseCache>,
    /// Completed records this worker has seen (etcd store).
    pub local: RefCell<LocalTier>,
    /// Streams that ended with a store call out, by the call's token (see
    /// `http::adopt_orphan`). Bounded by the calls in flight: every call has a timeout,
    /// and Envoy answers or cancels it.
    pub orphans: RefCell<HashMap<u32, DedupStream>>,
    /// Wait mode: the duplicates this worker holds (see `waiting`).
    pub waiters: RefCell<Waiters>,
    /// This VM's wake-up queue, once registered.
    pub queue: Cell<Option<u32>>,
    /// Until when this worker's queue is on the shared board (ms).
    pub announced_until: Cell<u64>,
    /// Whether this worker's tick is on (only while it holds waiters).
    pub ticking: Cell<bool>,
}

struct DedupRoot {
    shared: Option<Rc<WorkerState>>,
}

impl DedupRoot {
    fn new() -> Self {
        DedupRoot { shared: None }
    }
}

/// A random seed from WASI `random_get` (std's RandomState draws its keys from it).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(abi::now_ms());
    h.finish()
}

impl RootContext for DedupRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match abi::buffer(abi::BUFFER_PLUGIN_CONFIGURATION, 0, usize::MAX) {
            Ok(b) => b,
            Err(status) => {
                abi::log(
                    abi::LOG_ERROR,
                    &format!("proxy-dedup: cannot read plugin configuration (status {status})"),
                );
                return false;
            }
        };
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                abi::log(abi::LOG_ERROR, &format!("proxy-dedup: {e}"));
                return false;
            }
        };
        let metrics = Counter::ALL
            .iter()
            .map(|c| match abi::define_counter(c.name()) {
                Ok(id) => Some(id),
                Err(status) => {
                    abi::log(
                        abi::LOG_WARN,
                        &format!(
                            "proxy-dedup: cannot define metric {} (status {status})",
                            c.name()
                        ),
                    );
                    None
                }
            })
            .collect();
        let mut plugin = Plugin::new(config);
        let store_call_ms = if plugin.store.makes_calls() {
            abi::define_histogram("proxy_dedup_store_call_ms").ok()
        } else {
            None
        };
        let namespace = plugin.config.namespace().to_string();
        let role = plugin.config.role;
        if let Some(layout) = plugin.store.layout_mut() {
            // One secret per Envoy process keys the bucket choice; every worker must use
            // the same, or a key would be claimed in two buckets.
            let fresh = match abi::random_bytes::<SECRET_LEN>() {
                Ok(b) => b,
                Err(errno) => {
                    abi::log(
                        abi::LOG_ERROR,
                        &format!(
                            "proxy-dedup: no random bytes for the bucket secret (errno {errno})"
                        ),
                    );
                    return false;
                }
            };
            match bucket_secret(&abi::HostSharedData, &namespace, fresh) {
                Ok(secret) => *layout = layout.clone().with_secret(secret),
                Err(e) => {
                    abi::log(
                        abi::LOG_ERROR,
                        &format!("proxy-dedup: cannot set up the bucket secret: {e}"),
                    );
                    return false;
                }
            }
            // Make this layout visible to the configurations already serving (a push).
            // The admin role only reads the layouts the data plane registered.
            let registered = match role {
                Role::Data => SharedStore::new(&abi::HostSharedData, layout)
                    .register(abi::now_ms())
                    .map(|_| ()),
                Role::Admin => Ok(()),
            };
            if let Err(e) = registered {
                abi::log(
                    abi::LOG_WARN,
                    &format!("proxy-dedup: cannot register the store layout yet: {e}"),
                );
            }
        }
        let store = plugin.store.describe();
        abi::log(
            abi::LOG_INFO,
            &format!("proxy-dedup: configured; store: {store}"),
        );
        self.shared = Some(Rc::new(WorkerState {
            plugin,
            metrics,
            store_call_ms,
            token_seed: random_seed(),
            token_counter: Cell::new(0),
            leases: RefCell::new(LeaseCache::default()),
            local: RefCell::new(LocalTier::default()),
            orphans: RefCell::new(HashMap::new()),
            waiters: RefCell::new(Waiters::default()),
            queue: Cell::new(None),
            announced_until: Cell::new(0),
            ticking: Cell::new(false),
        }));
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // A context without configuration passes through.
        Some(Box::new(http::DedupHttp::new(
            context_id,
            self.shared.clone(),
        )))
    }

    fn on_tick(&mut self) {
        if let Some(shared) = self.shared.as_ref() {
            waiting::run_due(shared);
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(shared) = self.shared.as_ref() {
            waiting::on_queue_ready(shared, queue_id);
        }
    }

    fn on_orphan_call_answer(&mut self, token_id: u32, answer: CallAnswer) {
        // The answer to a call whose stream has ended (a completion or release the
        // client did not wait for): finish it, retries included.
        if let Some(shared) = self.shared.as_ref() {
            http::orphan_answer(shared, token_id, answer);
        }
    }
}
