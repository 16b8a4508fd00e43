//! The simulated Envoy: N worker VMs of one plugin, the HTTP filter chain
//! around them (filter -> router -> upstream), callouts, timers and the
//! virtual clock. Streams are driven whole ([`Envoy::request`]) or step by
//! step ([`Envoy::start`], [`Envoy::send_headers`], ...).

mod grpc_calls;

use crate::abi::{LogLevel, MetricKind};
use crate::callout::{self, CalloutResult, Cluster};
use crate::error::Error;
use crate::http::{header_get, Headers, Reply, ReplyKind, Request, Response, UpstreamRequest};
use crate::origin::{code_details, response_flags, StreamOrigin};
use crate::shared::{lock, Faults, LogLine, Metric, Shared, SharedInner};
use crate::state::{CalloutResponse, Deferred, PluginInfo, StreamHost, VmState};
use crate::vm::{Exports, Vm};
use grpc_calls::{GrpcCluster, GrpcEvent, GrpcLive};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::{TypedFunc, WasmParams, WasmResults};

/// Identifies a stream started with [`Envoy::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(pub u64);

/// Where a stream stands.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamState {
    /// The client still has parts of the request to send, or the filter
    /// holds the stream.
    Open,
    /// The whole request reached the upstream; its reply is awaited.
    AwaitingUpstream,
    /// Finished (response complete, or reset).
    Done,
}

/// Configures and builds an [`Envoy`].
pub struct EnvoyBuilder {
    wasm: PathBuf,
    workers: usize,
    main_thread_vm: bool,
    config_check: bool,
    plugin_config: Vec<u8>,
    vm_config: Vec<u8>,
    vm_id: String,
    plugin_name: String,
    root_id: String,
    allow_on_headers_stop_iteration: bool,
    fail_open: bool,
    log_level: LogLevel,
    route_timeout: Duration,
    buffer_limit: usize,
    upstream: Option<crate::callout::Handler>,
    upstream_address: String,
    clusters: HashMap<String, Cluster>,
    grpc_clusters: HashMap<String, GrpcCluster>,
    random_seed: u64,
    count_host_calls: bool,
    route_name: Option<String>,
    cluster_name: Option<String>,
    route_metadata: crate::value::Metadata,
    filter_metadata: crate::value::Metadata,
    properties: Vec<(Vec<String>, Vec<u8>)>,
}

impl EnvoyBuilder {
    /// Number of worker threads, each with its own VM (default 1).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Envoy's VM on the main thread (default on, as Envoy): one more VM of
    /// the plugin, started and configured before the workers' (`on_vm_start`,
    /// `on_configure`, its own root context and ticks), that never sees a
    /// stream. Its log lines carry `worker == workers()`; it shares shared
    /// data, queues and metrics with the workers and keeps ticking when a
    /// worker's VM fails.
    pub fn main_thread_vm(mut self, on: bool) -> Self {
        self.main_thread_vm = on;
        self
    }

    /// The short-lived copy of the plugin Envoy starts and configures once
    /// before serving (default on, as Envoy): `on_vm_start` and
    /// `on_configure` run one more time, first, in a VM that is then dropped
    /// (its log lines carry `worker == workers() + 1` when the main-thread
    /// VM is on). A configuration it rejects fails the build.
    pub fn config_check(mut self, on: bool) -> Self {
        self.config_check = on;
        self
    }

    /// The plugin `configuration` (what `on_configure` reads).
    pub fn plugin_config(mut self, config: impl AsRef<[u8]>) -> Self {
        self.plugin_config = config.as_ref().to_vec();
        self
    }

    /// The VM `configuration` (what `on_vm_start` reads).
    pub fn vm_config(mut self, config: impl AsRef<[u8]>) -> Self {
        self.vm_config = config.as_ref().to_vec();
        self
    }

    /// Shared data and queues are scoped by vm_id (default "").
    pub fn vm_id(mut self, vm_id: &str) -> Self {
        self.vm_id = vm_id.to_string();
        self
    }

    pub fn plugin_name(mut self, name: &str) -> Self {
        self.plugin_name = name.to_string();
        self
    }

    pub fn root_id(mut self, root_id: &str) -> Self {
        self.root_id = root_id.to_string();
        self
    }

    /// Envoy's `allow_on_headers_stop_iteration` (default false, as Envoy):
    /// false turns Pause at headers into StopAllIteration (body withheld
    /// until the filter resumes); true keeps StopIteration (body callbacks run).
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Envoy's `failure_policy: FAIL_OPEN`: after a trap, streams pass
    /// through without the filter instead of getting 503.
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Envoy's log level (default Info): lower lines are not emitted (and
    /// not captured); `proxy_get_log_level` reports it.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.log_level = level;
        self
    }

    /// Route timeout for an upstream that never answers (default 15 s, as Envoy).
    pub fn route_timeout(mut self, timeout: Duration) -> Self {
        self.route_timeout = timeout;
        self
    }

    /// Request buffer limit (Envoy's per_connection_buffer_limit_bytes,
    /// default 1 MiB): a filter buffering more gets Envoy's 413.
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// The upstream service (default: 200 with body "upstream ok").
    pub fn upstream(mut self, handler: impl FnMut(&UpstreamRequest) -> Reply + 'static) -> Self {
        self.upstream = Some(Box::new(handler));
        self
    }

    /// Count every host call per import and the bytes copied through guest
    /// memory ([`Envoy::host_calls`]); each call then goes through a wrapper,
    /// so time measurements of such an Envoy mean nothing.
    pub fn count_host_calls(mut self, on: bool) -> Self {
        self.count_host_calls = on;
        self
    }

    /// Seeds WASI `random_get` (deterministic per worker and seed; Envoy uses
    /// BoringSSL). Two builders with different seeds model two Envoy processes.
    pub fn random_seed(mut self, seed: u64) -> Self {
        self.random_seed = seed;
        self
    }

    /// The upstream host's address, what `upstream.address` reads once the
    /// router picked it (default `127.0.0.1:8080`).
    pub fn upstream_address(mut self, address: &str) -> Self {
        self.upstream_address = address.to_string();
        self
    }

    /// A cluster for `proxy_http_call`, answered in process.
    pub fn cluster(
        mut self,
        name: &str,
        handler: impl FnMut(&UpstreamRequest) -> Reply + 'static,
    ) -> Self {
        self.clusters
            .insert(name.to_string(), Cluster::InProcess(Box::new(handler)));
        self
    }

    /// A cluster for `proxy_http_call` forwarded over TCP to a loopback
    /// HTTP/1.1 server (`"127.0.0.1:8080"`).
    pub fn cluster_addr(mut self, name: &str, addr: &str) -> Self {
        self.clusters
            .insert(name.to_string(), Cluster::Tcp(addr.to_string()));
        self
    }

    /// A cluster for `proxy_grpc_call` and `proxy_grpc_stream`, answered in
    /// process: the handler gets each call ([`crate::GrpcRequest`]: service,
    /// method, messages, metadata as Envoy sends it) and answers a
    /// [`crate::GrpcReply`]. A stream is answered when the filter
    /// half-closes it (`proxy_grpc_close`, or a send with end of stream).
    pub fn grpc_cluster(
        mut self,
        name: &str,
        handler: impl FnMut(&crate::GrpcRequest) -> crate::GrpcReply + 'static,
    ) -> Self {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::InProcess(Box::new(handler)));
        self
    }

    /// A cluster for `proxy_grpc_call` and `proxy_grpc_stream` served by a
    /// real gRPC server (HTTP/2 cleartext) on loopback, e.g. etcd's client
    /// port or a [`crate::GrpcServer`]. Unary calls block until the answer
    /// or the call's timeout (real time); stream messages arrive as they come.
    pub fn grpc_cluster_addr(mut self, name: &str, addr: &str) -> Self {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::H2(addr.to_string()));
        self
    }

    /// The matched route's name (`xds.route_name`; NotFound if unset).
    pub fn route_name(mut self, name: &str) -> Self {
        self.route_name = Some(name.to_string());
        self
    }

    /// The route's cluster (`xds.cluster_name`; NotFound if unset).
    pub fn cluster_name(mut self, name: &str) -> Self {
        self.cluster_name = Some(name.to_string());
        self
    }

    /// The route's metadata (`xds.route_metadata.filter_metadata.<namespace>`).
    pub fn route_metadata(mut self, namespace: &str, value: crate::Value) -> Self {
        self.route_metadata.push((namespace.to_string(), value));
        self
    }

    /// Dynamic metadata every request carries when it reaches the filter
    /// (`metadata.filter_metadata.<namespace>...`), as an earlier filter
    /// such as `set_metadata` would set it; [`Request::filter_metadata`]
    /// adds or replaces it per request.
    pub fn filter_metadata(mut self, namespace: &str, value: crate::Value) -> Self {
        self.filter_metadata.push((namespace.to_string(), value));
        self
    }

    /// A property every stream can read, by path segments, as the raw bytes
    /// Envoy returns (for anything host-test does not model).
    pub fn property(mut self, path: &[&str], value: impl AsRef<[u8]>) -> Self {
        let path = path.iter().map(|p| p.to_string()).collect();
        self.properties.push((path, value.as_ref().to_vec()));
        self
    }

    /// Loads the module (compiled once per path), starts one VM per worker
    /// (`_initialize`, `on_context_create`, `on_vm_start`, `on_configure`).
    pub fn build(self) -> Result<Envoy, Error> {
        let pre = if self.count_host_calls {
            crate::vm::load_counting(&self.wasm)?
        } else {
            crate::vm::load(&self.wasm)?
        };
        let shared: Shared = Arc::new(Mutex::new(SharedInner::new(self.log_level)));
        let plugin = Arc::new(PluginInfo {
            vm_id: self.vm_id,
            name: self.plugin_name,
            root_id: self.root_id,
            plugin_config: self.plugin_config,
            vm_config: self.vm_config,
            clusters: self
                .clusters
                .keys()
                .chain(self.grpc_clusters.keys())
                .cloned()
                .collect::<HashSet<_>>(),
            route_name: self.route_name,
            cluster_name: self.cluster_name,
            route_metadata: self.route_metadata,
        });
        let mut envoy = Envoy {
            vms: Vec::new(),
            workers: self.workers,
            shared: shared.clone(),
            plugin: plugin.clone(),
            allow_stop: self.allow_on_headers_stop_iteration,
            fail_open: self.fail_open,
            route_timeout: self.route_timeout,
            buffer_limit: self.buffer_limit,
            streams: HashMap::new(),
            by_ctx: HashMap::new(),
            next_stream: 1,
            next_ctx: Vec::new(),
            upstream: self.upstream.unwrap_or_else(|| {
                Box::new(|_req: &UpstreamRequest| Reply::ok().body("upstream ok"))
            }),
            upstream_address: self.upstream_address,
            filter_metadata: self.filter_metadata,
            properties: self.properties,
            clusters: self.clusters,
            grpc_clusters: self.grpc_clusters,
            grpc_live: HashMap::new(),
            ready: VecDeque::new(),
            timed: Vec::new(),
            seq: 0,
            ticks: Vec::new(),
            upstream_calls: 0,
            hold_callouts: false,
            held_callouts: Vec::new(),
        };
        // VMs by index: the workers, then the main thread's, then (while it
        // lives) the short-lived copy Envoy configures before serving.
        let main = usize::from(self.main_thread_vm);
        let check = usize::from(self.config_check);
        for index in 0..self.workers + main + check {
            let mut state = VmState::new(shared.clone(), plugin.clone(), index);
            state.rng ^= self.random_seed.wrapping_mul(0xd134_2543_de82_ef95);
            if self.count_host_calls {
                state.host_calls = Some(crate::state::HostCalls::default());
            }
            let vm = Vm::instantiate(&pre, state)?;
            envoy.vms.push(vm);
            envoy.next_ctx.push(2);
            envoy.ticks.push(None);
        }
        if self.config_check {
            let index = self.workers + main;
            envoy.start_vm(index)?;
            envoy.vms.pop();
            envoy.next_ctx.pop();
            envoy.ticks.pop();
        }
        if self.main_thread_vm {
            envoy.start_vm(self.workers)?;
        }
        for worker in 0..self.workers {
            envoy.start_vm(worker)?;
        }
        envoy.pump();
        Ok(envoy)
    }
}

enum Call<R> {
    Missing,
    Done(R),
    Trapped,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Request,
    Response,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum HeadersState {
    Pending,
    /// Pause with allow_on_headers_stop_iteration: body callbacks still run.
    Stopped,
    /// StopAllIteration: nothing reaches the filter until it resumes.
    StoppedAll,
    Passed,
}

struct Dir {
    headers: HeadersState,
    headers_eos: bool,
    /// The filter returned Pause from a body callback: data accumulates.
    buffering: bool,
    /// Data that arrived while StoppedAll, not yet seen by the filter.
    held: Vec<u8>,
    held_any: bool,
    held_trailers: Option<Headers>,
    trailers_stopped: bool,
    eos_in: bool,
    eos_out: bool,
    out_headers: Option<Headers>,
    out_body: Vec<u8>,
    out_trailers: Headers,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            headers: HeadersState::Pending,
            headers_eos: false,
            buffering: false,
            held: Vec::new(),
            held_any: false,
            held_trailers: None,
            trailers_stopped: false,
            eos_in: false,
            eos_out: false,
            out_headers: None,
            out_body: Vec::new(),
            out_trailers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Upstream {
    NotYet,
    Awaiting(UpstreamRequest),
    /// The upstream was asked and will not answer: route timeout pending.
    Silent,
    Answered,
    Cancelled,
}

struct StreamDriver {
    worker: usize,
    ctx: u32,
    request: Request,
    headers_sent: bool,
    next_chunk: usize,
    trailers_sent: bool,
    req: Dir,
    resp: Dir,
    upstream: Upstream,
    upstream_request: Option<UpstreamRequest>,
    upstream_headers_sent: bool,
    local_reply: bool,
    /// VM failed and fail-open: the filter is skipped.
    bypass: bool,
    context_created: bool,
    outcome: Option<Response>,
}

enum Event {
    Callout {
        worker: usize,
        token: u32,
        response: Option<Reply>,
    },
    QueueReady {
        worker: usize,
        ctx: u32,
        token: u32,
    },
    Grpc {
        worker: usize,
        token: u32,
        events: Vec<GrpcEvent>,
    },
    RouteTimeout(u64),
}

/// A simulated Envoy process with one proxy-wasm HTTP filter.
pub struct Envoy {
    /// The workers' VMs, then the main thread's.
    vms: Vec<Vm>,
    workers: usize,
    shared: Shared,
    plugin: Arc<PluginInfo>,
    allow_stop: bool,
    fail_open: bool,
    route_timeout: Duration,
    buffer_limit: usize,
    streams: HashMap<u64, StreamDriver>,
    by_ctx: HashMap<(usize, u32), u64>,
    next_stream: u64,
    next_ctx: Vec<u32>,
    upstream: crate::callout::Handler,
    upstream_address: String,
    filter_metadata: crate::value::Metadata,
    properties: Vec<(Vec<String>, Vec<u8>)>,
    clusters: HashMap<String, Cluster>,
    grpc_clusters: HashMap<String, GrpcCluster>,
    grpc_live: HashMap<(usize, u32), GrpcLive>,
    ready: VecDeque<Event>,
    /// (deadline ns, sequence, event)
    timed: Vec<(u64, u64, Event)>,
    seq: u64,
    /// Per worker: (next tick ns, period ns).
    ticks: Vec<Option<(u64, u64)>>,
    upstream_calls: u64,
    hold_callouts: bool,
    held_callouts: Vec<Event>,
}

// Bodies of the router's local replies (Envoy 1.40).
const LOCAL_REPLY_RESET: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection termination";
const LOCAL_REPLY_CONNECT_FAILURE: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
const LOCAL_REPLY_OVERFLOW: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: overflow";
// Only reaches the client if the filter still holds the response headers
// when the upstream resets mid-body (otherwise the stream is reset).
const LOCAL_REPLY_LATE_RESET: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: protocol error";

impl Envoy {
    /// Starts configuring an Envoy running the module at `wasm`.
    pub fn builder(wasm: impl AsRef<Path>) -> EnvoyBuilder {
        EnvoyBuilder {
            wasm: wasm.as_ref().to_path_buf(),
            workers: 1,
            main_thread_vm: true,
            config_check: true,
            plugin_config: Vec::new(),
            vm_config: Vec::new(),
            vm_id: String::new(),
            plugin_name: "host-test".into(),
            root_id: String::new(),
            allow_on_headers_stop_iteration: false,
            fail_open: false,
            log_level: LogLevel::Info,
            route_timeout: Duration::from_secs(15),
            buffer_limit: 1024 * 1024,
            upstream: None,
            upstream_address: "127.0.0.1:8080".into(),
            random_seed: 0,
            count_host_calls: false,
            clusters: HashMap::new(),
            grpc_clusters: HashMap::new(),
            route_name: None,
            cluster_name: None,
            route_metadata: Vec::new(),
            filter_metadata: Vec::new(),
            properties: Vec::new(),
        }
    }

    // ---- VM calls ------------------------------------------------------

    fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        worker: usize,
        name: &str,
        ctx: u32,
        pick: impl Fn(&Exports) -> Option<TypedFunc<P, R>>,
        params: P,
    ) -> Call<R> {
        let vm = &mut self.vms[worker];
        if vm.failed {
            return Call::Trapped;
        }
        let Some(f) = pick(&vm.exports) else {
            return Call::Missing;
        };
        {
            let s = vm.store.data_mut();
            s.current = ctx;
            s.effective = None;
            s.stop_next_iteration = false;
        }
        let result = f.call(&mut vm.store, params);
        self.after_call(worker);
        match result {
            Ok(r) => Call::Done(r),
            Err(e) => {
                self.vms[worker].failed = true;
                lock(&self.shared).log(
                    worker,
                    LogLevel::Critical,
                    format!("Function: {name} failed: {e:#}"),
                );
                Call::Trapped
            }
        }
    }

    /// Timer changes and new callouts, right after a VM call.
    fn after_call(&mut self, worker: usize) {
        let (tick, callouts, grpc) = {
            let s = self.vms[worker].store.data_mut();
            (
                s.tick_request.take(),
                std::mem::take(&mut s.new_callouts),
                std::mem::take(&mut s.grpc_ops),
            )
        };
        if !grpc.is_empty() {
            self.grpc_ops(worker, grpc);
        }
        if let Some(period) = tick {
            self.ticks[worker] = if period == 0 {
                None
            } else {
                let p = u64::from(period) * 1_000_000;
                Some((self.now_ns() + p, p))
            };
        }
        for c in callouts {
            let Some(cluster) = self.clusters.get_mut(&c.cluster) else {
                continue;
            };
            let answer = |response| Event::Callout {
                worker,
                token: c.token,
                response,
            };
            match callout::call(cluster, &c.request, c.timeout_ms) {
                CalloutResult::Response(reply) if !reply.delay.is_zero() => {
                    let at = self.now_ns() + reply.delay.as_nanos() as u64;
                    self.schedule(at, answer(Some(reply)));
                }
                CalloutResult::Response(reply) => self.answer_callout(answer(Some(reply))),
                CalloutResult::Reset => self.answer_callout(answer(None)),
                CalloutResult::Never => {}
                CalloutResult::TimeoutAfter(ms) => {
                    let at = self.now_ns() + u64::from(ms) * 1_000_000;
                    self.schedule(
                        at,
                        Event::Callout {
                            worker,
                            token: c.token,
                            response: Some(callout::timeout_reply()),
                        },
                    );
                }
                CalloutResult::ResetAfter(ms) => {
                    let at = self.now_ns() + u64::from(ms) * 1_000_000;
                    self.schedule(
                        at,
                        Event::Callout {
                            worker,
                            token: c.token,
                            response: None,
                        },
                    );
                }
            }
        }
    }

    fn answer_callout(&mut self, event: Event) {
        if self.hold_callouts {
            self.held_callouts.push(event);
        } else {
            self.ready.push_back(event);
        }
    }

    /// Holds callout answers (in-process and TCP) instead of delivering
    /// them on the next event-loop turn, so a test can act while a callout
    /// is in flight. Timeouts still fire on the virtual clock.
    pub fn hold_callouts(&mut self, hold: bool) {
        self.hold_callouts = hold;
    }

    /// Callout answers held by [`Envoy::hold_callouts`].
    pub fn held_callouts(&self) -> usize {
        self.held_callouts.len()
    }

    /// Delivers the held callout answers, in dispatch order.
    pub fn release_callouts(&mut self) {
        let held = std::mem::take(&mut self.held_callouts);
        self.ready.extend(held);
        self.pump();
    }

    fn take_deferred(&mut self, worker: usize) -> (Vec<Deferred>, bool) {
        let s = self.vms[worker].store.data_mut();
        (std::mem::take(&mut s.deferred), s.stop_next_iteration)
    }

    fn run_deferred(&mut self, worker: usize, deferred: Vec<Deferred>) {
        for d in deferred {
            match d {
                Deferred::Continue { ctx, response } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        let side = if response {
                            Side::Response
                        } else {
                            Side::Request
                        };
                        self.resume(sid, side);
                    }
                }
                Deferred::GrpcRefused { token } => self.grpc_refused(worker, token),
                Deferred::Close { ctx } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        self.cancel_upstream(sid);
                        self.finish(sid, true);
                    }
                }
                Deferred::LocalReply {
                    ctx,
                    status,
                    body,
                    headers,
                    details,
                    grpc_status,
                } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        let reply = LocalReply {
                            status,
                            body,
                            extra: headers,
                            details,
                            grpc_status,
                        };
                        self.local_reply_of(sid, reply, true);
                    }
                }
            }
        }
    }

    fn start_vm(&mut self, worker: usize) -> Result<(), Error> {
        let root = 1;
        let logs = |e: &Envoy| lock(&e.shared).logs.clone();
        let trap = |e: &Envoy, f: &str| Error::Trap {
            function: f.to_string(),
            message: "trapped (see log)".into(),
            logs: logs(e),
        };
        if let Call::Trapped = self.invoke(
            worker,
            "proxy_on_context_create",
            root,
            |x| x.on_context_create.clone(),
            (root as i32, 0),
        ) {
            return Err(trap(self, "proxy_on_context_create"));
        }
        let vm_len = self.plugin.vm_config.len() as i32;
        match self.invoke(
            worker,
            "proxy_on_vm_start",
            root,
            |x| x.on_vm_start.clone(),
            (root as i32, vm_len),
        ) {
            Call::Trapped => return Err(trap(self, "proxy_on_vm_start")),
            Call::Done(0) => {
                return Err(Error::VmStartFailed {
                    worker,
                    logs: logs(self),
                })
            }
            _ => {}
        }
        self.vms[worker].store.data_mut().in_configure = true;
        let len = self.plugin.plugin_config.len() as i32;
        let r = self.invoke(
            worker,
            "proxy_on_configure",
            root,
            |x| x.on_configure.clone(),
            (root as i32, len),
        );
        self.vms[worker].store.data_mut().in_configure = false;
        match r {
            Call::Trapped => return Err(trap(self, "proxy_on_configure")),
            Call::Done(0) => {
                return Err(Error::ConfigRejected {
                    worker,
                    logs: logs(self),
                })
            }
            _ => {}
        }
        let (d, _) = self.take_deferred(worker);
        self.run_deferred(worker, d);
        Ok(())
    }

    // ---- clock and events ----------------------------------------------

    fn now_ns(&self) -> u64 {
        lock(&self.shared).now_ns
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.timed.push((at, self.seq, event));
    }

    fn set_clock(&mut self, at: u64) {
        let mut sh = lock(&self.shared);
        if at > sh.now_ns {
            let delta = at - sh.now_ns;
            sh.now_ns = at;
            sh.monotonic_ns += delta;
        }
    }

    /// Delivers everything ready now: callout responses, queue
    /// notifications, route timeouts.
    fn pump(&mut self) {
        loop {
            self.poll_grpc_streams();
            let queued: Vec<(usize, u32, u32)> =
                std::mem::take(&mut lock(&self.shared).queue_ready);
            for (worker, ctx, token) in queued {
                self.ready
                    .push_back(Event::QueueReady { worker, ctx, token });
            }
            let Some(event) = self.ready.pop_front() else {
                break;
            };
            match event {
                Event::Callout {
                    worker,
                    token,
                    response,
                } => self.deliver_callout(worker, token, response),
                Event::Grpc {
                    worker,
                    token,
                    events,
                } => self.deliver_grpc(worker, token, events),
                Event::QueueReady { worker, ctx, token } => {
                    if worker < self.vms.len() {
                        self.invoke(
                            worker,
                            "proxy_on_queue_ready",
                            ctx,
                            |x| x.on_queue_ready.clone(),
                            (ctx as i32, token as i32),
                        );
                        let (d, _) = self.take_deferred(worker);
                        self.run_deferred(worker, d);
                    }
                }
                Event::RouteTimeout(sid) => {
                    if self
                        .streams
                        .get(&sid)
                        .is_some_and(|s| s.upstream == Upstream::Silent)
                    {
                        self.router_reply(
                            sid,
                            504,
                            "upstream request timeout",
                            code_details::RESPONSE_TIMEOUT,
                            response_flags::UT,
                        );
                    }
                }
            }
        }
    }

    fn deliver_callout(&mut self, worker: usize, token: u32, response: Option<Reply>) {
        let (nh, body_len, nt) = {
            let s = self.vms[worker].store.data_mut();
            match response {
                Some(reply) => {
                    let mut headers = reply.envoy_headers();
                    if reply.kind == ReplyKind::Response {
                        // The router times every upstream answer.
                        headers.push(("x-envoy-upstream-service-time".into(), "0".into()));
                    }
                    let body = reply.body_bytes();
                    let counts = (headers.len(), body.len(), 0);
                    s.callout_response = Some(CalloutResponse {
                        headers,
                        body,
                        trailers: Vec::new(),
                    });
                    counts
                }
                None => {
                    s.callout_response = None;
                    (0, 0, 0)
                }
            }
        };
        let root = self.vms[worker].store.data().root_id as i32;
        self.invoke(
            worker,
            "proxy_on_http_call_response",
            root as u32,
            |x| x.on_http_call_response.clone(),
            (root, token as i32, nh as i32, body_len as i32, nt),
        );
        self.vms[worker].store.data_mut().callout_response = None;
        let (d, _) = self.take_deferred(worker);
        self.run_deferred(worker, d);
    }

    fn fire_ticks(&mut self, now: u64) {
        for worker in 0..self.vms.len() {
            let Some((at, period)) = self.ticks[worker] else {
                continue;
            };
            if at > now || self.vms[worker].failed {
                continue;
            }
            self.ticks[worker] = Some((now + period, period));
            let root = self.vms[worker].store.data().root_id;
            self.invoke(
                worker,
                "proxy_on_tick",
                root,
                |x| x.on_tick.clone(),
                root as i32,
            );
            let (d, _) = self.take_deferred(worker);
            self.run_deferred(worker, d);
            self.pump();
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        let ticks = self
            .ticks
            .iter()
            .enumerate()
            .filter(|(w, _)| !self.vms[*w].failed)
            .filter_map(|(_, t)| t.map(|t| t.0));
        let timed = self.timed.iter().map(|t| t.0);
        ticks.chain(timed).min()
    }

    /// Moves the virtual clock forward, firing ticks, callout timeouts and
    /// route timeouts in order as their time comes.
    pub fn advance(&mut self, by: Duration) {
        let target = self.now_ns() + by.as_nanos() as u64;
        self.advance_to(target);
    }

    fn advance_to(&mut self, target: u64) {
        self.pump();
        while let Some(next) = self.next_deadline() {
            if next > target {
                break;
            }
            self.set_clock(next);
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.timed)
                .into_iter()
                .partition(|t| t.0 <= next);
            self.timed = later;
            let mut due = due;
            due.sort_by_key(|t| (t.0, t.1));
            for (_, _, e) in due {
                self.ready.push_back(e);
            }
            self.pump();
            self.fire_ticks(next);
        }
        self.set_clock(target);
        self.pump();
    }

    // ---- streams: the downstream side ----------------------------------

    /// Opens a stream on `worker` without sending anything yet.
    pub fn start(&mut self, worker: usize, request: Request) -> Result<StreamId, Error> {
        if worker >= self.workers {
            return Err(Error::Usage(format!(
                "worker {worker} does not exist ({} workers)",
                self.workers
            )));
        }
        let sid = self.next_stream;
        self.next_stream += 1;
        let ctx = self.next_ctx[worker];
        self.next_ctx[worker] += 1;
        let mut host = StreamHost::new(request.source_address.clone());
        host.metadata = self.filter_metadata.clone();
        for (ns, v) in &request.filter_metadata {
            host.metadata.retain(|(n, _)| n != ns);
            host.metadata.push((ns.clone(), v.clone()));
        }
        for (path, value) in self.properties.iter().chain(&request.properties) {
            host.properties.insert(path.join("\0"), value.clone());
        }
        self.vms[worker].store.data_mut().streams.insert(ctx, host);
        self.by_ctx.insert((worker, ctx), sid);
        self.streams.insert(
            sid,
            StreamDriver {
                worker,
                ctx,
                request,
                headers_sent: false,
                next_chunk: 0,
                trailers_sent: false,
                req: Dir::new(),
                resp: Dir::new(),
                upstream: Upstream::NotYet,
                upstream_request: None,
                upstream_headers_sent: false,
                local_reply: false,
                bypass: false,
                context_created: false,
                outcome: None,
            },
        );
        Ok(StreamId(sid))
    }

    fn stream(&self, id: StreamId) -> Result<&StreamDriver, Error> {
        self.streams
            .get(&id.0)
            .ok_or_else(|| Error::Usage(format!("unknown stream {id:?}")))
    }

    fn open(&self, sid: u64) -> bool {
        self.streams.get(&sid).is_some_and(|s| s.outcome.is_none())
    }

    fn host(&mut self, sid: u64) -> Option<&mut StreamHost> {
        let s = self.streams.get(&sid)?;
        let (w, ctx) = (s.worker, s.ctx);
        self.vms[w].store.data_mut().streams.get_mut(&ctx)
    }

    fn dir(&mut self, sid: u64, side: Side) -> Option<&mut Dir> {
        let s = self.streams.get_mut(&sid)?;
        Some(match side {
            Side::Request => &mut s.req,
            Side::Response => &mut s.resp,
        })
    }

    /// Sends the request headers (end of stream if there is no body).
    pub fn send_headers(&mut self, id: StreamId) -> Result<(), Error> {
        let s = self.stream(id)?;
        if s.headers_sent {
            return Err(Error::Usage(format!("{id:?}: headers already sent")));
        }
        let sid = id.0;
        let request_id = format!("00000000-0000-4000-8000-{:012}", sid);
        let (headers, eos) = {
            let s = &self.streams[&sid];
            (
                s.request.envoy_headers(&request_id),
                s.request.chunks.is_empty() && s.request.trailers.is_empty(),
            )
        };
        if let Some(s) = self.streams.get_mut(&sid) {
            s.headers_sent = true;
        }
        if !self.open(sid) {
            return Ok(());
        }
        self.headers_in(sid, Side::Request, headers, eos);
        self.pump();
        Ok(())
    }

    /// Sends the next body chunk; returns whether more chunks remain.
    pub fn send_chunk(&mut self, id: StreamId) -> Result<bool, Error> {
        let s = self.stream(id)?;
        if !s.headers_sent {
            return Err(Error::Usage(format!("{id:?}: send the headers first")));
        }
        let Some(chunk) = s.request.chunks.get(s.next_chunk).cloned() else {
            return Ok(false);
        };
        let last = s.next_chunk + 1 == s.request.chunks.len();
        let eos = last && s.request.trailers.is_empty();
        let sid = id.0;
        if let Some(s) = self.streams.get_mut(&sid) {
            s.next_chunk += 1;
        }
        if self.open(sid) {
            self.data_in(sid, Side::Request, chunk, eos);
            self.pump();
        }
        Ok(!last)
    }

    /// Sends all remaining body chunks.
    pub fn send_body(&mut self, id: StreamId) -> Result<(), Error> {
        while self.send_chunk(id)? {}
        Ok(())
    }

    /// Sends the request trailers, if the request has any.
    pub fn send_trailers(&mut self, id: StreamId) -> Result<(), Error> {
        let s = self.stream(id)?;
        if s.trailers_sent || s.request.trailers.is_empty() {
            return Ok(());
        }
        if s.next_chunk < s.request.chunks.len() {
            return Err(Error::Usage(format!("{id:?}: send the body first")));
        }
        let trailers = s.request.trailers.clone();
        if let Some(s) = self.streams.get_mut(&id.0) {
            s.trailers_sent = true;
        }
        if self.open(id.0) {
            self.trailers_in(id.0, Side::Request, trailers);
            self.pump();
        }
        Ok(())
    }

    /// Sends whatever of the request is not sent yet.
    pub fn send_request(&mut self, id: StreamId) -> Result<(), Error> {
        if !self.stream(id)?.headers_sent {
            self.send_headers(id)?;
        }
        self.send_body(id)?;
        self.send_trailers(id)
    }

    /// The client resets the stream: no response; the filter still gets
    /// `on_log`, `on_done` and `on_delete`.
    ///
    /// What `on_log` reads then is Envoy's: `response.code_details`
    /// `downstream_remote_disconnect`, flag DC added, `response.code` only
    /// if response headers had come, `upstream.address` if the request had
    /// reached the router.
    pub fn reset_client(&mut self, id: StreamId) -> Result<(), Error> {
        self.stream(id)?;
        if self.open(id.0) {
            if let Some(o) = self.origin(id.0) {
                o.details = Some(code_details::DOWNSTREAM_REMOTE_DISCONNECT.into());
                o.flags |= response_flags::DC;
            }
        }
        self.cancel_upstream(id.0);
        self.finish(id.0, true);
        self.pump();
        Ok(())
    }

    // ---- streams: the upstream side ------------------------------------

    /// The request as it reached the upstream, while its reply is awaited.
    pub fn upstream_request(&self, id: StreamId) -> Option<UpstreamRequest> {
        match &self.streams.get(&id.0)?.upstream {
            Upstream::Awaiting(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// The upstream answers the stream's request with any [`Reply`]: a
    /// response, a reset before or after the headers, no answer (the route
    /// timeout fires when the clock gets there), or what Envoy answers
    /// instead (connection refused, no healthy upstream, a later filter's
    /// local reply...), each with Envoy's `response.code_details` and flags.
    pub fn respond(&mut self, id: StreamId, reply: Reply) -> Result<(), Error> {
        let s = self.stream(id)?;
        if !matches!(s.upstream, Upstream::Awaiting(_)) {
            return Err(Error::Usage(format!(
                "{id:?}: no upstream request is awaiting a reply (the filter has not let the \
                 whole request through, or it was answered already)"
            )));
        }
        let sid = id.0;
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Answered;
        }
        let flags = reply.flags;
        match reply.kind.clone() {
            ReplyKind::Response => self.upstream_response(sid, reply, true),
            ReplyKind::Reset => self.router_reply(
                sid,
                503,
                LOCAL_REPLY_RESET,
                code_details::CONNECTION_TERMINATION,
                response_flags::UC | flags,
            ),
            ReplyKind::ConnectFailure => self.router_reply(
                sid,
                503,
                LOCAL_REPLY_CONNECT_FAILURE,
                code_details::CONNECT_FAILURE,
                response_flags::UF | flags,
            ),
            ReplyKind::NoHealthyUpstream => {
                self.no_host(sid);
                self.router_reply(
                    sid,
                    503,
                    "no healthy upstream",
                    code_details::NO_HEALTHY_UPSTREAM,
                    response_flags::UH | flags,
                );
            }
            ReplyKind::Overflow => {
                self.no_host(sid);
                self.router_reply(
                    sid,
                    503,
                    LOCAL_REPLY_OVERFLOW,
                    code_details::OVERFLOW,
                    response_flags::UO | flags,
                );
            }
            ReplyKind::Local(details) => {
                self.no_host(sid);
                if let Some(o) = self.origin(sid) {
                    o.flags |= flags;
                }
                let body = reply.body_bytes();
                self.local_reply(sid, reply.status, body, reply.headers, true, &details);
            }
            ReplyKind::ResetAfterHeaders => {
                self.upstream_response(sid, reply, false);
                if self.open(sid) {
                    self.router_reply(
                        sid,
                        503,
                        LOCAL_REPLY_LATE_RESET,
                        code_details::RESET_AFTER_RESPONSE_STARTED,
                        response_flags::UPE | flags,
                    );
                }
            }
            ReplyKind::NoAnswerAfterHeaders => {
                self.upstream_response(sid, reply, false);
                if self.open(sid) {
                    self.go_silent(sid);
                }
            }
            ReplyKind::NoAnswer => self.go_silent(sid),
        }
        self.pump();
        Ok(())
    }

    /// The upstream says nothing more: the route timeout fires when the
    /// clock gets there.
    fn go_silent(&mut self, sid: u64) {
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Silent;
        }
        let at = self.now_ns() + self.route_timeout.as_nanos() as u64;
        self.schedule(at, Event::RouteTimeout(sid));
    }

    /// The router answered without picking a host (no healthy upstream,
    /// overflow) or a filter before it answered: no `upstream.address`.
    fn no_host(&mut self, sid: u64) {
        if let Some(o) = self.origin(sid) {
            o.upstream_address = None;
        }
    }

    fn origin(&mut self, sid: u64) -> Option<&mut StreamOrigin> {
        self.host(sid).map(|h| &mut h.origin)
    }

    /// The upstream's response: headers, then the body chunks; `complete`
    /// false: the last chunk does not end the stream (the answer is cut).
    fn upstream_response(&mut self, sid: u64, reply: Reply, complete: bool) {
        if let Some(o) = self.origin(sid) {
            o.details = Some(code_details::VIA_UPSTREAM.into());
            o.code = Some(reply.status);
            o.flags |= reply.flags;
        }
        let headers = reply.envoy_headers();
        let chunks: Vec<Vec<u8>> = reply.chunks.into_iter().filter(|c| !c.is_empty()).collect();
        self.headers_in(sid, Side::Response, headers, complete && chunks.is_empty());
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            if !self.open(sid) {
                break;
            }
            self.data_in(sid, Side::Response, chunk, complete && i + 1 == n);
        }
    }

    /// A local reply generated by the router (upstream reset, route
    /// timeout, no healthy upstream...): it passes through the filter's
    /// response callbacks, or resets the stream if the response headers
    /// already went to the client.
    fn router_reply(&mut self, sid: u64, status: u16, body: &str, details: &str, flags: u64) {
        if let Some(s) = self.streams.get_mut(&sid) {
            s.upstream = Upstream::Answered;
        }
        if let Some(o) = self.origin(sid) {
            o.flags |= flags;
        }
        let headers = vec![("content-type".to_string(), "text/plain".to_string())];
        self.local_reply(
            sid,
            status,
            body.as_bytes().to_vec(),
            headers,
            true,
            details,
        );
    }

    fn cancel_upstream(&mut self, sid: u64) {
        if let Some(s) = self.streams.get_mut(&sid) {
            if matches!(
                s.upstream,
                Upstream::Awaiting(_) | Upstream::Silent | Upstream::NotYet
            ) {
                s.upstream = Upstream::Cancelled;
            }
        }
    }

    // ---- the filter chain ------------------------------------------------

    fn create_context(&mut self, sid: u64) -> bool {
        let (w, ctx, created) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx, s.context_created)
        };
        if created {
            return true;
        }
        if let Some(s) = self.streams.get_mut(&sid) {
            s.context_created = true;
        }
        let root = self.vms[w].store.data().root_id as i32;
        !matches!(
            self.invoke(
                w,
                "proxy_on_context_create",
                ctx,
                |x| x.on_context_create.clone(),
                (ctx as i32, root),
            ),
            Call::Trapped
        )
    }

    /// A VM failure met by a stream: 503 (Envoy's wasm_fail_stream), or
    /// pass-through under fail-open. Returns true if the stream goes on.
    fn failed_vm(&mut self, sid: u64) -> bool {
        if self.fail_open {
            if let Some(s) = self.streams.get_mut(&sid) {
                s.bypass = true;
            }
            return true;
        }
        self.local_reply(
            sid,
            503,
            Vec::new(),
            Vec::new(),
            false,
            code_details::WASM_FAIL_STREAM,
        );
        false
    }

    fn call_filter(
        &mut self,
        sid: u64,
        side: Side,
        kind: Callback,
        a: i32,
        b: i32,
    ) -> Option<(i32, bool)> {
        let (w, ctx) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx)
        };
        if self.vms[w].failed {
            return if self.failed_vm(sid) {
                Some((0, false))
            } else {
                None
            };
        }
        if side == Side::Request && kind == Callback::Headers && !self.create_context(sid) {
            return if self.failed_vm(sid) {
                Some((0, false))
            } else {
                None
            };
        }
        let c = ctx as i32;
        let call = match (side, kind) {
            (Side::Request, Callback::Headers) => self.invoke(
                w,
                "proxy_on_request_headers",
                ctx,
                |x| x.on_request_headers.clone(),
                (c, a, b),
            ),
            (Side::Request, Callback::Body) => self.invoke(
                w,
                "proxy_on_request_body",
                ctx,
                |x| x.on_request_body.clone(),
                (c, a, b),
            ),
            (Side::Request, Callback::Trailers) => self.invoke(
                w,
                "proxy_on_request_trailers",
                ctx,
                |x| x.on_request_trailers.clone(),
                (c, a),
            ),
            (Side::Response, Callback::Headers) => self.invoke(
                w,
                "proxy_on_response_headers",
                ctx,
                |x| x.on_response_headers.clone(),
                (c, a, b),
            ),
            (Side::Response, Callback::Body) => self.invoke(
                w,
                "proxy_on_response_body",
                ctx,
                |x| x.on_response_body.clone(),
                (c, a, b),
            ),
            (Side::Response, Callback::Trailers) => self.invoke(
                w,
                "proxy_on_response_trailers",
                ctx,
                |x| x.on_response_trailers.clone(),
                (c, a),
            ),
        };
        let action = match call {
            Call::Missing => 0,
            Call::Done(a) => a,
            Call::Trapped => {
                let (d, _) = self.take_deferred(w);
                drop(d);
                return if self.failed_vm(sid) {
                    Some((0, false))
                } else {
                    None
                };
            }
        };
        let (_, stop_next) = {
            let s = self.vms[w].store.data();
            ((), s.stop_next_iteration)
        };
        Some((action, stop_next))
    }

    fn finish_call(&mut self, sid: u64) {
        if let Some(w) = self.streams.get(&sid).map(|s| s.worker) {
            let (d, _) = self.take_deferred(w);
            self.run_deferred(w, d);
        }
    }

    fn headers_in(&mut self, sid: u64, side: Side, headers: Headers, eos: bool) {
        let n = headers.len() as i32;
        if let Some(h) = self.host(sid) {
            let dir = match side {
                Side::Request => &mut h.req,
                Side::Response => &mut h.resp,
            };
            dir.headers = headers;
            dir.headers_received = true;
            dir.headers_live = true;
        }
        if let Some(d) = self.dir(sid, side) {
            d.headers_eos = eos;
            d.eos_in = eos;
        }
        if self.streams[&sid].bypass {
            self.set_headers_state(sid, side, HeadersState::Passed);
            return;
        }
        let Some((action, stop_next)) =
            self.call_filter(sid, side, Callback::Headers, n, eos as i32)
        else {
            return;
        };
        if self.open(sid) {
            let bypass = self.streams[&sid].bypass;
            let state = if bypass || (!stop_next && (action == 0 || action == 2)) {
                HeadersState::Passed
            } else if action == 1 && self.allow_stop && !stop_next {
                HeadersState::Stopped
            } else {
                HeadersState::StoppedAll
            };
            self.set_headers_state(sid, side, state);
        }
        self.finish_call(sid);
    }

    fn set_headers_state(&mut self, sid: u64, side: Side, state: HeadersState) {
        if let Some(d) = self.dir(sid, side) {
            d.headers = state;
        }
        if state == HeadersState::Passed {
            if let Some(h) = self.host(sid) {
                match side {
                    Side::Request => h.req.headers_live = false,
                    Side::Response => h.resp.headers_live = false,
                }
            }
            self.pass_headers(sid, side);
        }
    }

    fn data_in(&mut self, sid: u64, side: Side, chunk: Vec<u8>, eos: bool) {
        if side == Side::Request && self.streams.get(&sid).is_some_and(|s| s.local_reply) {
            return;
        }
        let (state, buffering, bypass) = {
            let Some(d) = self.dir(sid, side) else { return };
            if eos {
                d.eos_in = true;
            }
            (d.headers, d.buffering, self.streams[&sid].bypass)
        };
        if bypass {
            self.pass_data(sid, side, chunk, eos);
            return;
        }
        match state {
            HeadersState::Pending => {}
            HeadersState::StoppedAll => {
                if let Some(d) = self.dir(sid, side) {
                    d.held.extend_from_slice(&chunk);
                    d.held_any = true;
                }
            }
            HeadersState::Stopped | HeadersState::Passed => {
                self.body_callback(sid, side, chunk, eos, buffering);
            }
        }
    }

    /// Runs the filter's body callback on the buffered data plus `chunk`
    /// (Envoy hands the whole buffer when the filter has been buffering).
    fn body_callback(&mut self, sid: u64, side: Side, chunk: Vec<u8>, eos: bool, buffering: bool) {
        if buffering && side == Side::Request {
            let buffered = self.host(sid).map_or(0, |h| h.req.body.len());
            if buffered + chunk.len() > self.buffer_limit {
                // The filter manager's buffer overflows: Envoy answers 413
                // itself (through the filter's response callbacks).
                self.local_reply(
                    sid,
                    413,
                    b"Payload Too Large".to_vec(),
                    Vec::new(),
                    true,
                    code_details::REQUEST_PAYLOAD_TOO_LARGE,
                );
                return;
            }
        }
        let size = {
            let Some(h) = self.host(sid) else { return };
            let dir = match side {
                Side::Request => &mut h.req,
                Side::Response => &mut h.resp,
            };
            if buffering {
                dir.body.extend_from_slice(&chunk);
            } else {
                dir.body = chunk;
            }
            dir.body_live = true;
            dir.body.len()
        };
        let Some((action, stop_next)) =
            self.call_filter(sid, side, Callback::Body, size as i32, eos as i32)
        else {
            return;
        };
        if self.open(sid) {
            let bypass = self.streams[&sid].bypass;
            if bypass || (!stop_next && action == 0) {
                let data = match self.host(sid) {
                    Some(h) => {
                        let dir = match side {
                            Side::Request => &mut h.req,
                            Side::Response => &mut h.resp,
                        };
                        dir.body_live = false;
                        std::mem::take(&mut dir.body)
                    }
                    None => Vec::new(),
                };
                let stopped = self.dir(sid, side).map(|d| {
                    d.buffering = false;
                    d.headers == HeadersState::Stopped
                });
                if stopped == Some(true) {
                    // Continue from the body resumes the stopped headers;
                    // Envoy still holds the header map (writes do nothing now).
                    if let Some(d) = self.dir(sid, side) {
                        d.headers = HeadersState::Passed;
                    }
                    self.pass_headers(sid, side);
                }
                self.pass_data(sid, side, data, eos);
            } else {
                if let Some(d) = self.dir(sid, side) {
                    d.buffering = true;
                }
                let buffered = self.host(sid).map_or(0, |h| h.req.body.len());
                if side == Side::Request && buffered > self.buffer_limit {
                    self.finish_call(sid);
                    self.local_reply(
                        sid,
                        413,
                        b"Payload Too Large".to_vec(),
                        Vec::new(),
                        true,
                        code_details::REQUEST_PAYLOAD_TOO_LARGE,
                    );
                    return;
                }
            }
        }
        self.finish_call(sid);
    }

    fn trailers_in(&mut self, sid: u64, side: Side, trailers: Headers) {
        if side == Side::Request && self.streams.get(&sid).is_some_and(|s| s.local_reply) {
            return;
        }
        let (state, bypass) = {
            let Some(d) = self.dir(sid, side) else { return };
            d.eos_in = true;
            (d.headers, self.streams[&sid].bypass)
        };
        if bypass {
            self.pass_trailers(sid, side, trailers);
            return;
        }
        if state == HeadersState::StoppedAll {
            if let Some(d) = self.dir(sid, side) {
                d.held_trailers = Some(trailers);
            }
            return;
        }
        let n = trailers.len() as i32;
        if let Some(h) = self.host(sid) {
            let dir = match side {
                Side::Request => &mut h.req,
                Side::Response => &mut h.resp,
            };
            dir.trailers = trailers;
            dir.trailers_live = true;
        }
        let Some((action, stop_next)) = self.call_filter(sid, side, Callback::Trailers, n, 0)
        else {
            return;
        };
        if self.open(sid) {
            if self.streams[&sid].bypass || (!stop_next && action == 0) {
                self.release_after_trailers(sid, side);
            } else if let Some(d) = self.dir(sid, side) {
                d.trailers_stopped = true;
            }
        }
        self.finish_call(sid);
    }

    /// Trailers continued: stopped headers and buffered data go first.
    fn release_after_trailers(&mut self, sid: u64, side: Side) {
        let (headers_stopped, buffering) = match self.dir(sid, side) {
            Some(d) => {
                d.trailers_stopped = false;
                let r = (d.headers != HeadersState::Passed, d.buffering);
                d.headers = HeadersState::Passed;
                d.buffering = false;
                r
            }
            None => return,
        };
        if headers_stopped {
            self.pass_headers(sid, side);
        }
        let (body, trailers) = match self.host(sid) {
            Some(h) => {
                let dir = match side {
                    Side::Request => &mut h.req,
                    Side::Response => &mut h.resp,
                };
                dir.trailers_live = false;
                dir.body_live = false;
                (std::mem::take(&mut dir.body), dir.trailers.clone())
            }
            None => return,
        };
        if buffering && !body.is_empty() {
            self.pass_data(sid, side, body, false);
        }
        self.pass_trailers(sid, side, trailers);
    }

    /// `proxy_continue_stream`: the filter manager's continueDecoding /
    /// continueEncoding.
    fn resume(&mut self, sid: u64, side: Side) {
        if !self.open(sid) {
            return;
        }
        let Some(d) = self.dir(sid, side) else { return };
        match d.headers {
            HeadersState::Pending => {}
            HeadersState::StoppedAll => {
                let held = std::mem::take(&mut d.held);
                let held_any = std::mem::replace(&mut d.held_any, false);
                let held_trailers = d.held_trailers.take();
                let eos = d.eos_in && held_trailers.is_none();
                self.set_headers_state(sid, side, HeadersState::Passed);
                // Data held during StopAllIteration now reaches this filter.
                if held_any && self.open(sid) {
                    self.body_callback(sid, side, held, eos, false);
                }
                if let Some(t) = held_trailers {
                    if self.open(sid) {
                        self.trailers_in(sid, side, t);
                    }
                }
            }
            HeadersState::Stopped | HeadersState::Passed => {
                let was_stopped = d.headers == HeadersState::Stopped;
                let buffering = d.buffering;
                let trailers_stopped = d.trailers_stopped;
                let eos = d.eos_in;
                if trailers_stopped {
                    self.release_after_trailers(sid, side);
                    return;
                }
                if was_stopped {
                    if let Some(d) = self.dir(sid, side) {
                        d.headers = HeadersState::Passed;
                    }
                    if let Some(h) = self.host(sid) {
                        match side {
                            Side::Request => h.req.headers_live = false,
                            Side::Response => h.resp.headers_live = false,
                        }
                    }
                    self.pass_headers(sid, side);
                }
                if buffering {
                    if let Some(d) = self.dir(sid, side) {
                        d.buffering = false;
                    }
                    let body = match self.host(sid) {
                        Some(h) => {
                            let dir = match side {
                                Side::Request => &mut h.req,
                                Side::Response => &mut h.resp,
                            };
                            dir.body_live = false;
                            std::mem::take(&mut dir.body)
                        }
                        None => Vec::new(),
                    };
                    self.pass_data(sid, side, body, eos);
                }
            }
        }
    }

    // ---- what leaves the filter ------------------------------------------

    fn pass_headers(&mut self, sid: u64, side: Side) {
        let headers = self.host(sid).map(|h| match side {
            Side::Request => h.req.headers.clone(),
            Side::Response => h.resp.headers.clone(),
        });
        let Some(s) = self.streams.get_mut(&sid) else {
            return;
        };
        let d = match side {
            Side::Request => &mut s.req,
            Side::Response => &mut s.resp,
        };
        if d.out_headers.is_some() {
            return;
        }
        d.out_headers = headers;
        let eos = d.headers_eos;
        if side == Side::Request {
            s.upstream_headers_sent = true;
            // The router picks the upstream host as the headers reach it.
            let address = self.upstream_address.clone();
            if let Some(o) = self.origin(sid) {
                o.upstream_address = Some(address);
            }
        }
        if eos {
            self.end_of_stream_out(sid, side);
        }
    }

    fn pass_data(&mut self, sid: u64, side: Side, data: Vec<u8>, eos: bool) {
        let Some(d) = self.dir(sid, side) else { return };
        d.out_body.extend_from_slice(&data);
        if eos {
            self.end_of_stream_out(sid, side);
        }
    }

    fn pass_trailers(&mut self, sid: u64, side: Side, trailers: Headers) {
        let Some(d) = self.dir(sid, side) else { return };
        d.out_trailers = trailers;
        self.end_of_stream_out(sid, side);
    }

    fn end_of_stream_out(&mut self, sid: u64, side: Side) {
        let Some(s) = self.streams.get_mut(&sid) else {
            return;
        };
        let d = match side {
            Side::Request => &mut s.req,
            Side::Response => &mut s.resp,
        };
        if d.eos_out {
            return;
        }
        d.eos_out = true;
        match side {
            Side::Request => {
                if s.upstream == Upstream::NotYet {
                    let req = UpstreamRequest {
                        headers: s.req.out_headers.clone().unwrap_or_default(),
                        body: s.req.out_body.clone(),
                        trailers: s.req.out_trailers.clone(),
                    };
                    s.upstream_request = Some(req.clone());
                    s.upstream = Upstream::Awaiting(req);
                    self.upstream_calls += 1;
                }
            }
            Side::Response => self.finish(sid, false),
        }
    }

    /// Envoy's sendLocalReply for a stream: records `details` as the
    /// response code details (and the status as the response code, unless
    /// the response headers already went out and the stream is reset).
    fn local_reply(
        &mut self,
        sid: u64,
        status: u16,
        body: Vec<u8>,
        extra: Headers,
        through_filter: bool,
        details: &str,
    ) {
        let reply = LocalReply {
            status,
            body,
            extra,
            details: details.to_string(),
            grpc_status: None,
        };
        self.local_reply_of(sid, reply, through_filter);
    }

    /// Envoy's sendLocalReply (see [`Envoy::local_reply`]); for a gRPC
    /// request (`content-type: application/grpc...`) it answers as Envoy
    /// does: 200, `content-type: application/grpc`, `grpc-status` (the
    /// filter's, or mapped from the HTTP status), `grpc-message` (the body,
    /// percent-encoded), no body: a trailers-only response.
    fn local_reply_of(&mut self, sid: u64, reply: LocalReply, through_filter: bool) {
        let LocalReply {
            status,
            body,
            extra,
            details,
            grpc_status,
        } = reply;
        let details = details.as_str();
        if !self.open(sid) {
            return;
        }
        let grpc = self.streams.get(&sid).is_some_and(|s| {
            header_get(&s.request.headers, "content-type")
                .is_some_and(|t| t.starts_with("application/grpc"))
        });
        if let Some(o) = self.origin(sid) {
            o.details = Some(details.to_string());
        }
        self.cancel_upstream(sid);
        let mut headers: Headers = vec![(":status".into(), status.to_string())];
        headers.extend(extra);
        let (status, body) = if grpc {
            grpc_local_reply(&mut headers, status, &body, grpc_status);
            (200, Vec::new())
        } else {
            (status, body)
        };
        if !body.is_empty() {
            headers.retain(|(k, _)| k != "content-length");
            headers.push(("content-length".into(), body.len().to_string()));
            if header_get(&headers, "content-type").is_none() {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let (started, committed) = {
            let s = &self.streams[&sid];
            (
                s.resp.headers != HeadersState::Pending,
                s.resp.out_headers.is_some(),
            )
        };
        if committed {
            // Headers already went to the client: Envoy can only reset.
            self.finish(sid, true);
            return;
        }
        let direct = started || !through_filter;
        if let Some(o) = self.origin(sid) {
            o.code = Some(status);
        }
        if let Some(s) = self.streams.get_mut(&sid) {
            s.local_reply = true;
            s.req.eos_in = true;
            // The request side is over: nothing more reaches the filter.
            s.req.headers = HeadersState::Passed;
            s.req.buffering = false;
            s.resp = Dir::new();
            if direct {
                s.bypass = true;
            }
        }
        if let Some(h) = self.host(sid) {
            h.req.headers_live = false;
            h.req.body_live = false;
            h.req.trailers_live = false;
            h.resp = Default::default();
        }
        let eos = body.is_empty();
        self.headers_in(sid, Side::Response, headers, eos);
        if !eos && self.open(sid) {
            self.data_in(sid, Side::Response, body, true);
        }
    }

    /// Ends the stream: `on_log`, `on_done`, `on_delete` (unless the VM has
    /// failed), and records what the client got.
    fn finish(&mut self, sid: u64, reset: bool) {
        if !self.open(sid) {
            return;
        }
        let (w, ctx, created) = {
            let s = &self.streams[&sid];
            (s.worker, s.ctx, s.context_created)
        };
        let origin = self.origin(sid).map(|o| o.clone()).unwrap_or_default();
        let outcome = {
            let s = &self.streams[&sid];
            let headers = s.resp.out_headers.clone().unwrap_or_default();
            let status = header_get(&headers, ":status")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            Response {
                status: if reset && s.resp.out_headers.is_none() {
                    0
                } else {
                    status
                },
                headers: headers
                    .into_iter()
                    .filter(|(k, _)| k != ":status")
                    .collect(),
                body: s.resp.out_body.clone(),
                upstream_called: s.upstream_request.is_some(),
                upstream_headers_sent: s.upstream_headers_sent,
                local_reply: s.local_reply,
                reset,
                upstream_request: s.upstream_request.clone(),
                code_details: origin.details,
                response_flags: origin.flags,
                upstream_address: origin.upstream_address,
            }
        };
        if let Some(s) = self.streams.get_mut(&sid) {
            s.outcome = Some(outcome);
            if matches!(s.upstream, Upstream::Awaiting(_) | Upstream::Silent) {
                s.upstream = Upstream::Cancelled;
            }
        }
        let run_vm = created && !self.vms[w].failed;
        if run_vm {
            if let Some(h) = self.host(sid) {
                h.log_phase = true;
            }
            self.invoke(w, "proxy_on_log", ctx, |x| x.on_log.clone(), ctx as i32);
            if let Some(h) = self.host(sid) {
                h.log_phase = false;
            }
            self.invoke(w, "proxy_on_done", ctx, |x| x.on_done.clone(), ctx as i32);
            self.invoke(
                w,
                "proxy_on_delete",
                ctx,
                |x| x.on_delete.clone(),
                ctx as i32,
            );
        }
        self.vms[w].store.data_mut().streams.remove(&ctx);
        self.by_ctx.remove(&(w, ctx));
        let (d, _) = self.take_deferred(w);
        self.run_deferred(w, d);
    }

    // ---- whole requests --------------------------------------------------

    /// Drives a stream to its end: sends the rest of the request, lets the
    /// default upstream answer, waits (in virtual time) for callouts and
    /// timeouts. A stream the filter holds with nothing pending is
    /// [`Error::Stalled`] (it stays open: inspect it, advance, or reset it).
    pub fn finish_stream(&mut self, id: StreamId) -> Result<Response, Error> {
        self.send_request(id)?;
        const REAL_WAIT: Duration = Duration::from_secs(10);
        let mut waited = Duration::ZERO;
        loop {
            self.pump();
            let s = self.stream(id)?;
            if let Some(r) = &s.outcome {
                let r = r.clone();
                self.forget(id);
                return Ok(r);
            }
            if let Upstream::Awaiting(req) = &s.upstream {
                let req = req.clone();
                let reply = (self.upstream)(&req);
                self.respond(id, reply)?;
                continue;
            }
            match self.timed.iter().map(|t| t.0).min() {
                Some(next) => self.advance_to(next),
                None if self.grpc_streams_open() && waited < REAL_WAIT => {
                    // A gRPC stream on a real server may still answer.
                    std::thread::sleep(Duration::from_millis(5));
                    waited += Duration::from_millis(5);
                }
                None => {
                    return Err(Error::Stalled {
                        stream: id,
                        waiting: self.describe(id.0),
                    })
                }
            }
        }
    }

    /// Sends `request` on `worker` and drives it to the end (see
    /// [`Envoy::finish_stream`]).
    pub fn request(&mut self, worker: usize, request: Request) -> Result<Response, Error> {
        let id = self.start(worker, request)?;
        self.finish_stream(id)
    }

    fn describe(&self, sid: u64) -> String {
        let Some(s) = self.streams.get(&sid) else {
            return "unknown stream".into();
        };
        let side = |d: &Dir, name: &str| -> Option<String> {
            if d.trailers_stopped {
                return Some(format!(
                    "the filter paused the {name} trailers and never resumed"
                ));
            }
            match d.headers {
                HeadersState::StoppedAll => Some(format!(
                    "the filter paused the {name} headers; Envoy turned it into StopAllIteration \
                     (allow_on_headers_stop_iteration is false), so no body callback comes until \
                     the filter resumes the stream, and it never does"
                )),
                HeadersState::Stopped if !d.buffering => Some(format!(
                    "the filter paused the {name} headers and never resumed"
                )),
                _ if d.buffering && d.eos_in => Some(format!(
                    "the filter paused the {name} body at end of stream and never resumed"
                )),
                _ => None,
            }
        };
        let what = side(&s.req, "request")
            .or_else(|| side(&s.resp, "response"))
            .unwrap_or_else(|| "the stream waits for an event that will not come".into());
        if self.held_callouts.is_empty() {
            what
        } else {
            format!(
                "{what} ({} callout answers are held: release_callouts)",
                self.held_callouts.len()
            )
        }
    }

    fn forget(&mut self, id: StreamId) {
        self.streams.remove(&id.0);
    }

    /// Where the stream stands.
    pub fn state(&self, id: StreamId) -> Result<StreamState, Error> {
        let s = self.stream(id)?;
        Ok(if s.outcome.is_some() {
            StreamState::Done
        } else if matches!(s.upstream, Upstream::Awaiting(_)) {
            StreamState::AwaitingUpstream
        } else {
            StreamState::Open
        })
    }

    /// What the client got, once the stream is done.
    pub fn response(&self, id: StreamId) -> Option<Response> {
        self.streams.get(&id.0)?.outcome.clone()
    }

    // ---- inspection and control ------------------------------------------

    /// Worker threads (VMs that serve streams).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The main-thread VM trapped (in `on_tick`, say) and is failed.
    pub fn main_thread_failed(&self) -> bool {
        self.vms.get(self.workers).is_some_and(|v| v.failed)
    }

    /// The worker's VM trapped and is failed (every later stream: 503).
    pub fn worker_failed(&self, worker: usize) -> bool {
        self.vms.get(worker).is_some_and(|v| v.failed)
    }

    /// Size of a worker VM's linear memory in bytes (it only grows: the high-water
    /// mark of what the filter ever allocated).
    pub fn memory_bytes(&self, worker: usize) -> usize {
        self.vms
            .get(worker)
            .and_then(|v| v.store.data().memory.map(|m| m.data_size(&v.store)))
            .unwrap_or(0)
    }

    /// Host calls and bytes copied since the last [`Envoy::reset_host_calls`],
    /// over every VM (empty unless built with
    /// [`EnvoyBuilder::count_host_calls`]).
    pub fn host_calls(&self) -> crate::state::HostCalls {
        let mut all = crate::state::HostCalls::default();
        for vm in &self.vms {
            if let Some(h) = &vm.store.data().host_calls {
                all.add(h);
            }
        }
        all
    }

    /// Starts the host-call counts anew.
    pub fn reset_host_calls(&mut self) {
        for vm in &mut self.vms {
            if let Some(h) = vm.store.data_mut().host_calls.as_mut() {
                *h = crate::state::HostCalls::default();
            }
        }
    }

    /// Requests that fully reached the upstream (any stream).
    pub fn upstream_calls(&self) -> u64 {
        self.upstream_calls
    }

    /// Replaces the upstream service.
    pub fn set_upstream(&mut self, handler: impl FnMut(&UpstreamRequest) -> Reply + 'static) {
        self.upstream = Box::new(handler);
    }

    /// Replaces (or adds) an in-process cluster's handler. Only clusters
    /// declared at build time exist for `proxy_http_call`.
    pub fn set_cluster(
        &mut self,
        name: &str,
        handler: impl FnMut(&UpstreamRequest) -> Reply + 'static,
    ) {
        self.clusters
            .insert(name.to_string(), Cluster::InProcess(Box::new(handler)));
    }

    /// Replaces (or adds) a gRPC cluster answered in process.
    pub fn set_grpc_cluster(
        &mut self,
        name: &str,
        handler: impl FnMut(&crate::GrpcRequest) -> crate::GrpcReply + 'static,
    ) {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::InProcess(Box::new(handler)));
    }

    /// Replaces (or adds) a gRPC cluster served by a real HTTP/2 server on loopback.
    pub fn set_grpc_cluster_addr(&mut self, name: &str, addr: &str) {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::H2(addr.to_string()));
    }

    pub fn set_faults(&mut self, faults: Faults) {
        lock(&self.shared).faults = faults;
    }

    /// The virtual wall clock.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.now_ns())
    }

    /// Every line logged so far, all workers, in order.
    pub fn logs(&self) -> Vec<LogLine> {
        lock(&self.shared).logs.clone()
    }

    /// Whether any log line contains `text`.
    pub fn log_contains(&self, text: &str) -> bool {
        lock(&self.shared)
            .logs
            .iter()
            .any(|l| l.message.contains(text))
    }

    /// Lines at `level` or above containing `text`.
    pub fn log_lines(&self, level: LogLevel, text: &str) -> Vec<LogLine> {
        lock(&self.shared)
            .logs
            .iter()
            .filter(|l| l.level >= level && l.message.contains(text))
            .cloned()
            .collect()
    }

    pub fn clear_logs(&mut self) {
        lock(&self.shared).logs.clear();
    }

    /// Number of shared-data keys (tombstones included) for this plugin's vm_id.
    pub fn shared_data_len(&self) -> usize {
        self.shared_data_len_for(&self.plugin.vm_id)
    }

    pub fn shared_data_len_for(&self, vm_id: &str) -> usize {
        lock(&self.shared).data.get(vm_id).map_or(0, |m| m.len())
    }

    /// A shared-data entry (value, cas) for this plugin's vm_id.
    pub fn shared_data(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.shared)
            .data
            .get(&self.plugin.vm_id)
            .and_then(|m| m.get(key))
            .cloned()
    }

    /// All shared-data keys for this plugin's vm_id, sorted.
    pub fn shared_data_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.shared)
            .data
            .get(&self.plugin.vm_id)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    /// Writes shared data as a filter would (cas 0: unconditional).
    pub fn put_shared_data(&mut self, key: &str, value: &[u8]) {
        let vm_id = self.plugin.vm_id.clone();
        let mut sh = lock(&self.shared);
        let saved = sh.faults;
        sh.faults = Faults::default();
        sh.set(&vm_id, key, value, 0);
        sh.faults = saved;
    }

    pub fn metric(&self, name: &str) -> Option<Metric> {
        lock(&self.shared).metrics.get(name).cloned()
    }

    /// A counter's value by the name the filter defined it with.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.metric(name)
            .filter(|m| m.kind == MetricKind::Counter)
            .map(|m| m.value)
    }

    pub fn gauge(&self, name: &str) -> Option<u64> {
        self.metric(name)
            .filter(|m| m.kind == MetricKind::Gauge)
            .map(|m| m.value)
    }

    /// All metrics, by name.
    pub fn metrics(&self) -> HashMap<String, Metric> {
        lock(&self.shared).metrics.clone()
    }
}

/// A local reply as `sendLocalReply` takes it.
struct LocalReply {
    status: u16,
    body: Vec<u8>,
    extra: Headers,
    details: String,
    grpc_status: Option<u32>,
}

/// Envoy's `Grpc::Utility::httpToGrpcStatus`.
pub(crate) fn http_to_grpc_status(status: u16) -> u32 {
    use crate::grpc::grpc_status::*;
    match status {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

/// Turns a local reply's headers into Envoy's gRPC form (trailers only).
fn grpc_local_reply(headers: &mut Headers, status: u16, body: &[u8], grpc_status: Option<u32>) {
    headers.retain(|(k, _)| k != ":status" && k != "content-length");
    headers.insert(0, (":status".into(), "200".into()));
    headers.retain(|(k, _)| k != "content-type");
    headers.push(("content-type".into(), "application/grpc".into()));
    if header_get(headers, "grpc-status").is_none() {
        let code = grpc_status.unwrap_or_else(|| http_to_grpc_status(status));
        headers.push(("grpc-status".into(), code.to_string()));
    }
    if !body.is_empty() {
        let message = crate::grpc::percent_encode(&String::from_utf8_lossy(body));
        headers.push(("grpc-message".into(), message));
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Callback {
    Headers,
    Body,
    Trailers,
}
