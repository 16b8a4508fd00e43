//! proxy-dedup as a proxy-wasm module: registration, the root context (its callbacks
//! mapped to `dedup_core`'s `Worker`) and the HTTP context that feeds Envoy's callbacks
//! into `dedup_core`.

mod abi;
mod context;
mod env;
mod http;

use context::{HttpContext, RootContext};
use dedup_core::stream::CallAnswer;
use dedup_core::worker::Worker;
use env::AbiHost;
use std::cell::RefCell;
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
    // The phase-timed build reads the host's clock at each phase's ends.
    dedup_core::phases::set_clock(abi::now_ns);
    context::set_root_context(|_| -> Box<dyn RootContext> { Box::new(DedupRoot::new()) });
}

/// This VM's worker (one VM per worker thread), shared by the root and its HTTP contexts.
pub(crate) type SharedWorker = Rc<RefCell<Worker>>;

struct DedupRoot {
    worker: Option<SharedWorker>,
}

impl DedupRoot {
    fn new() -> Self {
        DedupRoot { worker: None }
    }

    /// Runs `f` on the worker (not when a callback re-enters it: then nothing is done).
    fn worker<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
        let mut w = self.worker.as_ref()?.try_borrow_mut().ok()?;
        Some(f(&mut w))
    }

    /// Wakes the waiting streams the worker says are due (their callbacks borrow the
    /// worker themselves); one that is gone is forgotten.
    fn wake(&self, due: Option<Vec<u32>>) {
        for id in due.unwrap_or_default() {
            if !context::wake_stream(id) {
                self.worker(|w| w.forget_waiter(id));
            }
        }
    }
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
        let Some(worker) = Worker::configure(&AbiHost, &bytes) else {
            return false;
        };
        self.worker = Some(Rc::new(RefCell::new(worker)));
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // A context without configuration passes through.
        Some(Box::new(http::DedupHttp::new(
            context_id,
            self.worker.clone(),
        )))
    }

    fn on_tick(&mut self) {
        let due = self.worker(|w| w.on_tick(&AbiHost));
        self.wake(due);
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        let due = self.worker(|w| w.on_queue_ready(&AbiHost, queue_id));
        self.wake(due);
    }

    fn on_orphan_call_answer(&mut self, token_id: u32, answer: CallAnswer) {
        // The answer to a call whose stream has ended (a completion or release the
        // client did not wait for): finish it, retries included.
        self.worker(|w| w.on_orphan_answer(&AbiHost, token_id, answer));
    }
}
