//! Our side of the proxy-wasm ABI 0.2.1: the exported `proxy_on_*` callbacks, the table
//! of live contexts, and the table of pending HTTP callouts.
//!
//! This replaces the proxy-wasm SDK's dispatcher, which panics (a trap: Envoy then answers
//! 503 on that worker until the VM is reloaded) on an unknown context id, an unknown
//! callout token or a token it still holds, and keeps the tokens of calls Envoy cancelled
//! forever. Here nothing panics:
//! - a callback for a context we do not know is ignored (Continue; logged at debug);
//! - an answer for a token we do not know is ignored; a token dispatched again while we
//!   still hold it (Envoy's per-VM call-id counter wrapped) replaces the old entry;
//! - Envoy makes every `proxy_http_call` and `proxy_grpc_call` on the ROOT context and
//!   answers it there (`proxy_on_http_call_response(root_context_id, token, ..)`,
//!   `proxy_on_grpc_receive` / `proxy_on_grpc_close`), so a call outlives the
//!   stream that made it. The stream that dispatched a call owns it while it lives; when
//!   it is deleted its pending calls pass to the root, whose
//!   [`RootContext::on_orphan_call_answer`] gets their answers;
//! - a root context that is done or deleted takes its callout entries with it (Envoy
//!   cancels a root's pending calls when it destroys it), so the table holds only calls
//!   that can still be answered.
//!
//! One VM runs on one thread, so the tables live in a `thread_local`. Every borrow is a
//! `try_borrow`: a callback re-entering a context that is already running is refused
//! (logged), never a panic.

mod traits;

pub use traits::{Action, Context, HttpContext, RootContext};

use crate::abi;
use dedup_core::callouts::Callouts;
use dedup_core::stream::CallAnswer;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// Contexts by id. Envoy assigns the ids (no client picks one), so the map needs no
/// keyed hash: a multiplication spreads them, where std's SipHash cost more than the
/// lookup on every callback.
type ById<T> = HashMap<u32, T, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Runs a stream's `on_wake` from a root callback (tick, queue), with the stream as the
/// effective context so that its resume or local reply acts on it. False when there is
/// no such stream (it ended).
pub(crate) fn wake_stream(context_id: u32) -> bool {
    if stream(context_id).is_none() {
        return false;
    }
    if let Err(status) = abi::set_effective_context(context_id) {
        debug(format_args!(
            "proxy-dedup: cannot make stream {context_id} effective (status {status})"
        ));
        return false;
    }
    on_stream(context_id, "wake", (), |s| s.on_wake());
    true
}

pub type NewRootContext = fn(context_id: u32) -> Box<dyn RootContext>;

/// Registers the constructor of root contexts (from `_initialize`).
pub fn set_root_context(new_root: NewRootContext) {
    let _ = with_vm(|vm| vm.new_root.set(Some(new_root)));
}

/// A call just dispatched (`abi::dispatch_*`), its token recorded as owned by the running
/// HTTP context (or by the root, outside a stream callback), so its answer reaches it.
pub(crate) fn dispatched(r: Result<u32, u32>) -> Result<u32, u32> {
    if let Ok(token) = r {
        register_callout(token);
    }
    r
}

fn register_callout(token: u32) {
    let replaced = with_vm(|vm| {
        let active = vm.active.get();
        let mut callouts = vm.callouts.try_borrow_mut().ok()?;
        Some(callouts.register(token, active.root, active.stream))
    })
    .flatten();
    match replaced {
        None => abi::log(
            abi::LOG_WARN,
            &format!("proxy-dedup: cannot record callout {token}; its answer will be ignored"),
        ),
        Some(Some(old)) => abi::log(
            abi::LOG_WARN,
            &format!(
                "proxy-dedup: callout token {token} reused while still pending (owner {:?}, \
                 root {}); the old call's answer can no longer be told apart",
                old.owner, old.root
            ),
        ),
        Some(None) => {}
    }
}

/// A context, shared between the table and a callback running it.
type Slot<T> = Rc<RefCell<T>>;

struct Stream {
    root: u32,
    context: Slot<Box<dyn HttpContext>>,
}

/// The context a callback runs for: what a callout dispatched now belongs to.
#[derive(Clone, Copy, Default)]
struct Active {
    root: u32,
    stream: Option<u32>,
}

#[derive(Default)]
struct Vm {
    new_root: Cell<Option<NewRootContext>>,
    roots: RefCell<ById<Slot<Box<dyn RootContext>>>>,
    streams: RefCell<ById<Stream>>,
    callouts: RefCell<Callouts>,
    active: Cell<Active>,
}

thread_local! {
    static VM: Vm = Vm::default();
}

fn with_vm<R>(f: impl FnOnce(&Vm) -> R) -> Option<R> {
    VM.try_with(f).ok()
}

fn debug(message: std::fmt::Arguments<'_>) {
    if abi::log_level() <= abi::LOG_DEBUG {
        abi::log(abi::LOG_DEBUG, &message.to_string());
    }
}

fn root(context_id: u32) -> Option<Slot<Box<dyn RootContext>>> {
    with_vm(|vm| vm.roots.try_borrow().ok()?.get(&context_id).cloned()).flatten()
}

fn stream(context_id: u32) -> Option<(u32, Slot<Box<dyn HttpContext>>)> {
    with_vm(|vm| {
        let streams = vm.streams.try_borrow().ok()?;
        let s = streams.get(&context_id)?;
        Some((s.root, s.context.clone()))
    })
    .flatten()
}

/// Runs `f` with `active` as the running context, restoring the previous one after.
fn as_active<R>(active: Active, f: impl FnOnce() -> R) -> R {
    let previous = with_vm(|vm| vm.active.replace(active));
    let result = f();
    if let Some(previous) = previous {
        let _ = with_vm(|vm| vm.active.set(previous));
    }
    result
}

/// Runs a callback of a stream context; `default` if there is none by that id.
fn on_stream<R>(
    context_id: u32,
    callback: &str,
    default: R,
    f: impl FnOnce(&mut dyn HttpContext) -> R,
) -> R {
    let found = stream(context_id).map(|(root, context)| {
        let active = Active {
            root,
            stream: Some(context_id),
        };
        (context, active)
    });
    enter(found, "stream", context_id, callback, default, |c| {
        f(c.as_mut())
    })
}

/// Runs a callback of a root context; `default` if there is none by that id.
fn on_root<R>(
    context_id: u32,
    callback: &str,
    default: R,
    f: impl FnOnce(&mut dyn RootContext) -> R,
) -> R {
    let found = root(context_id).map(|context| {
        let active = Active {
            root: context_id,
            stream: None,
        };
        (context, active)
    });
    enter(found, "root", context_id, callback, default, |c| {
        f(c.as_mut())
    })
}

/// Runs `f` on a context found by id, as the active context; `default` if none was
/// found (logged at debug) or it is already running (a re-entry, logged at warn).
fn enter<C: ?Sized, R>(
    found: Option<(Slot<C>, Active)>,
    kind: &str,
    context_id: u32,
    callback: &str,
    default: R,
    f: impl FnOnce(&mut C) -> R,
) -> R {
    let Some((context, active)) = found else {
        debug(format_args!(
            "proxy-dedup: {callback} for unknown {kind} context {context_id}; ignored"
        ));
        return default;
    };
    let Ok(mut context) = context.try_borrow_mut() else {
        abi::log(
            abi::LOG_WARN,
            &format!("proxy-dedup: {callback} re-entered {kind} context {context_id}; ignored"),
        );
        return default;
    };
    as_active(active, || f(&mut context))
}

/// A stream callback that answers an action: Continue if the stream is unknown.
fn on_stream_action(
    context_id: u32,
    callback: &str,
    f: impl FnOnce(&mut dyn HttpContext) -> Action,
) -> u32 {
    on_stream(context_id, callback, Action::Continue, f) as u32
}

/// `f` on this VM's table of pending calls; 0 if it is busy.
fn with_callouts(f: impl FnOnce(&mut Callouts) -> usize) -> usize {
    with_vm(|vm| Some(f(&mut *vm.callouts.try_borrow_mut().ok()?)))
        .flatten()
        .unwrap_or(0)
}

/// A stream context ends: its pending calls pass to its root.
fn orphan_calls_of(context_id: u32) {
    let handed = with_callouts(|c| c.orphan(context_id));
    if handed > 0 {
        debug(format_args!(
            "proxy-dedup: stream context {context_id} ended with {handed} pending call(s); \
             their answers go to the root"
        ));
    }
}

/// A root context is gone: the host cancelled its pending calls.
fn drop_calls_of_root(context_id: u32) {
    let dropped = with_callouts(|c| c.drop_root(context_id));
    if dropped > 0 {
        debug(format_args!(
            "proxy-dedup: root context {context_id} ended; forgot {dropped} pending call(s)"
        ));
    }
}

fn create_root(context_id: u32) {
    let Some(new_root) = with_vm(|vm| vm.new_root.get()).flatten() else {
        abi::log(
            abi::LOG_ERROR,
            &format!("proxy-dedup: no root context registered; root {context_id} not created"),
        );
        return;
    };
    let root = Rc::new(RefCell::new(new_root(context_id)));
    let replaced = with_vm(|vm| {
        let mut roots = vm.roots.try_borrow_mut().ok()?;
        Some(roots.insert(context_id, root).is_some())
    })
    .flatten();
    if recorded("root", context_id, replaced, abi::LOG_ERROR, "") {
        drop_calls_of_root(context_id);
    }
}

fn create_stream(context_id: u32, root_id: u32) {
    // A new request: Envoy's log level may have changed since the last one.
    abi::forget_log_level();
    let created = on_root(root_id, "proxy_on_context_create", None, |root| {
        root.create_http_context(context_id)
    });
    let Some(context) = created else {
        debug(format_args!(
            "proxy-dedup: no context for stream {context_id} (root {root_id}); it passes through"
        ));
        return;
    };
    let stream = Stream {
        root: root_id,
        context: Rc::new(RefCell::new(context)),
    };
    let replaced = with_vm(|vm| {
        let mut streams = vm.streams.try_borrow_mut().ok()?;
        Some(streams.insert(context_id, stream).is_some())
    })
    .flatten();
    if recorded(
        "stream",
        context_id,
        replaced,
        abi::LOG_WARN,
        "; it passes through",
    ) {
        // The calls of the replaced context are not the new stream's.
        orphan_calls_of(context_id);
    }
}

/// Logs what inserting a new context into its table came to (`None`: the table was
/// busy, logged at `level`, `consequence` appended); true if it replaced one by the
/// same id.
fn recorded(
    kind: &str,
    context_id: u32,
    replaced: Option<bool>,
    level: u32,
    consequence: &str,
) -> bool {
    match replaced {
        None => {
            abi::log(
                level,
                &format!("proxy-dedup: cannot record {kind} context {context_id}{consequence}"),
            );
            false
        }
        Some(true) => {
            abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: {kind} context {context_id} created twice; replaced"),
            );
            true
        }
        Some(false) => false,
    }
}

fn flag(value: u32) -> bool {
    value != 0
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_context_id: u32) {
    if parent_context_id == 0 {
        create_root(context_id);
    } else {
        create_stream(context_id, parent_context_id);
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(context_id: u32, vm_configuration_size: usize) -> u32 {
    root_start(context_id, "proxy_on_vm_start", |r| {
        r.on_vm_start(vm_configuration_size)
    })
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(context_id: u32, plugin_configuration_size: usize) -> u32 {
    root_start(context_id, "proxy_on_configure", |r| {
        r.on_configure(plugin_configuration_size)
    })
}

/// `proxy_on_vm_start` and `proxy_on_configure`: 1 if the root accepts, 0 if it refuses
/// or is unknown (refusing is visible; accepting would pass every request through
/// unchecked).
fn root_start(
    context_id: u32,
    callback: &str,
    f: impl FnOnce(&mut dyn RootContext) -> bool,
) -> u32 {
    if root(context_id).is_none() {
        abi::log(
            abi::LOG_ERROR,
            &format!("proxy-dedup: {callback} for unknown root context {context_id}"),
        );
        return 0;
    }
    u32::from(on_root(context_id, callback, false, f))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(context_id: u32) {
    on_root(context_id, "proxy_on_tick", (), |r| r.on_tick());
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(context_id: u32, queue_id: u32) {
    on_root(context_id, "proxy_on_queue_ready", (), |r| {
        r.on_queue_ready(queue_id)
    });
}

/// A stream callback of the ABI: it finds its stream context and answers its action
/// (Continue for an unknown stream). `eos` for the callbacks that carry `end_of_stream`.
macro_rules! stream_callback {
    ($export:ident, $method:ident, $size:ident, eos) => {
        #[no_mangle]
        pub extern "C" fn $export(context_id: u32, $size: usize, end_of_stream: u32) -> u32 {
            on_stream_action(context_id, stringify!($export), |s| {
                s.$method($size, flag(end_of_stream))
            })
        }
    };
    ($export:ident, $method:ident, $size:ident) => {
        #[no_mangle]
        pub extern "C" fn $export(context_id: u32, $size: usize) -> u32 {
            on_stream_action(context_id, stringify!($export), |s| s.$method($size))
        }
    };
}

stream_callback!(
    proxy_on_request_headers,
    on_http_request_headers,
    num_headers,
    eos
);
stream_callback!(proxy_on_request_body, on_http_request_body, body_size, eos);
stream_callback!(
    proxy_on_request_trailers,
    on_http_request_trailers,
    num_trailers
);
stream_callback!(
    proxy_on_response_headers,
    on_http_response_headers,
    num_headers,
    eos
);
stream_callback!(
    proxy_on_response_body,
    on_http_response_body,
    body_size,
    eos
);
stream_callback!(
    proxy_on_response_trailers,
    on_http_response_trailers,
    num_trailers
);

#[no_mangle]
pub extern "C" fn proxy_on_log(context_id: u32) {
    if stream(context_id).is_some() {
        on_stream(context_id, "proxy_on_log", (), |s| s.on_log());
    } else if root(context_id).is_none() {
        debug(format_args!(
            "proxy-dedup: proxy_on_log for unknown context {context_id}; ignored"
        ));
    }
    // A root context has nothing to log.
}

#[no_mangle]
pub extern "C" fn proxy_on_done(context_id: u32) -> u32 {
    if stream(context_id).is_some() {
        return u32::from(on_stream(context_id, "proxy_on_done", true, |s| {
            s.on_done()
        }));
    }
    let done = on_root(context_id, "proxy_on_done", true, |r| r.on_done());
    if done {
        // The host destroys the root next and cancels its pending calls.
        drop_calls_of_root(context_id);
    }
    u32::from(done)
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    let stream = with_vm(|vm| vm.streams.try_borrow_mut().ok()?.remove(&context_id)).flatten();
    if let Some(stream) = stream {
        // Its calls are still answered (on the root context): hand them to the root.
        orphan_calls_of(context_id);
        drop(stream);
        return;
    }
    let root = with_vm(|vm| vm.roots.try_borrow_mut().ok()?.remove(&context_id)).flatten();
    if let Some(root) = root {
        drop_calls_of_root(context_id);
        drop(root);
        return;
    }
    debug(format_args!(
        "proxy-dedup: proxy_on_delete for unknown context {context_id}; ignored"
    ));
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    context_id: u32,
    token: u32,
    num_headers: usize,
    body_size: usize,
    _num_trailers: usize,
) {
    // Read while the context Envoy answered on (the root) is effective: the answer's
    // headers and body belong to it.
    let answer = abi::read_call_answer(num_headers, body_size);
    route_answer(context_id, token, answer, "proxy_on_http_call_response");
}

/// A unary gRPC call's message: the call succeeded (`grpc-status` 0).
#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive(context_id: u32, token: u32, response_size: usize) {
    let body = abi::buffer(abi::BUFFER_GRPC_RECEIVE, 0, response_size).unwrap_or_default();
    route_answer(
        context_id,
        token,
        CallAnswer {
            status: 200,
            body,
            ..Default::default()
        },
        "proxy_on_grpc_receive",
    );
}

/// A gRPC call that ended without a message: a non-zero status from the server, or
/// Envoy's own (14 for a timeout, a reset or no healthy member). Handed over as status 0
/// with the status and message as `CallAnswer::grpc_failure` shapes them.
#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(context_id: u32, token: u32, status_code: u32) {
    let message = abi::grpc_status().map(|(_, m)| m).unwrap_or_default();
    route_answer(
        context_id,
        token,
        CallAnswer::grpc_failure(status_code, &message),
        "proxy_on_grpc_close",
    );
}

/// Unary calls get no metadata callbacks from Envoy; streams are not used.
#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_initial_metadata(_context_id: u32, _token: u32, _n: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_trailing_metadata(_context_id: u32, _token: u32, _n: u32) {}

/// Gives a call's answer to the stream that owns the call, or to the root.
fn route_answer(context_id: u32, token: u32, answer: CallAnswer, what: &'static str) {
    let Some(callout) = with_vm(|vm| vm.callouts.try_borrow_mut().ok()?.take(token)).flatten()
    else {
        debug(format_args!(
            "proxy-dedup: answer for unknown callout token {token} (context {context_id}); \
             ignored"
        ));
        return;
    };
    if callout.root != context_id {
        debug(format_args!(
            "proxy-dedup: callout {token} was made on root {} but answered on context \
             {context_id}",
            callout.root
        ));
    }
    if let Some(owner) = callout.owner {
        if stream(owner).is_none() {
            debug(format_args!(
                "proxy-dedup: callout {token}: stream context {owner} is gone; answer goes \
                 to the root"
            ));
        } else if let Err(status) = abi::set_effective_context(owner) {
            debug(format_args!(
                "proxy-dedup: callout {token}: the host refused stream context {owner} \
                 (status {status}); answer goes to the root"
            ));
        } else {
            on_stream(owner, what, (), |s| s.on_call_answer(token, answer));
            return;
        }
    }
    let root_id = if root(callout.root).is_some() {
        callout.root
    } else {
        context_id
    };
    if let Err(status) = abi::set_effective_context(root_id) {
        debug(format_args!(
            "proxy-dedup: callout {token}: cannot make root {root_id} effective (status \
             {status})"
        ));
    }
    on_root(root_id, what, (), |r| {
        r.on_orphan_call_answer(token, answer)
    });
}
