//! One worker's VM: the wasmtime store and its host state, the exported
//! proxy-wasm callbacks, and loading (compiled modules are cached per path).

use crate::abi::Status;
use crate::error::Error;
use crate::http::Headers;
use crate::shared::{lock, Shared};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;
use wasmtime::{Engine, InstancePre, Linker, Memory, Module, Store, TypedFunc};

/// Plugin facts every VM of an Envoy shares.
pub(crate) struct PluginInfo {
    pub vm_id: String,
    pub name: String,
    pub root_id: String,
    pub plugin_config: Vec<u8>,
    pub vm_config: Vec<u8>,
    pub clusters: HashSet<String>,
    /// `xds.route_name`, `xds.cluster_name`, `xds.route_metadata`.
    pub route_name: Option<String>,
    pub cluster_name: Option<String>,
    pub route_metadata: crate::value::Metadata,
}

/// Host-side view of one direction (request or response) of a stream, as
/// the filter can reach it through host calls.
#[derive(Default)]
pub(crate) struct DirHost {
    pub headers: Headers,
    pub headers_received: bool,
    /// Envoy keeps a pointer to the headers only until the filter lets them
    /// go (Continue) or resumes the stream; then setters and getters fail.
    pub headers_live: bool,
    /// The body the filter sees: the current chunk, or everything buffered.
    pub body: Vec<u8>,
    pub body_live: bool,
    pub trailers: Headers,
    pub trailers_live: bool,
}

pub(crate) struct StreamHost {
    pub source_address: String,
    pub req: DirHost,
    pub resp: DirHost,
    /// In `on_log`: maps are read-only snapshots.
    pub log_phase: bool,
    pub properties: HashMap<String, Vec<u8>>,
    /// What Envoy's stream info says of the response's origin.
    pub origin: crate::origin::StreamOrigin,
    /// Dynamic metadata (`metadata.filter_metadata.*`).
    pub metadata: crate::value::Metadata,
}

impl StreamHost {
    pub fn new(source_address: String) -> StreamHost {
        StreamHost {
            source_address,
            req: DirHost::default(),
            resp: DirHost::default(),
            log_phase: false,
            properties: HashMap::new(),
            origin: Default::default(),
            metadata: Vec::new(),
        }
    }
}

/// Actions Envoy runs after the VM call returns (DeferAfterCallActions).
pub(crate) enum Deferred {
    Continue {
        ctx: u32,
        response: bool,
    },
    Close {
        ctx: u32,
    },
    /// A gRPC call or stream to an unknown cluster: Envoy's client closes it
    /// ("Cluster not available") right after the VM call.
    GrpcRefused {
        token: u32,
    },
    LocalReply {
        ctx: u32,
        status: u16,
        body: Vec<u8>,
        headers: Headers,
        /// `response.code_details` as Envoy records it.
        details: String,
        /// The filter's gRPC status for a gRPC request (0..=16), if any.
        grpc_status: Option<u32>,
    },
}

pub(crate) struct NewCallout {
    pub token: u32,
    pub cluster: String,
    pub request: crate::http::UpstreamRequest,
    pub timeout_ms: u32,
}

/// A gRPC operation the filter asked for, carried out after the VM call.
pub(crate) enum GrpcOp {
    Call {
        token: u32,
        cluster: String,
        service: String,
        method: String,
        metadata: Headers,
        message: Vec<u8>,
        timeout_ms: u32,
    },
    Stream {
        token: u32,
        cluster: String,
        service: String,
        method: String,
        metadata: Headers,
    },
    Send {
        token: u32,
        message: Vec<u8>,
        end: bool,
    },
    /// Half-close of a stream.
    Close { token: u32 },
    /// Cancel of a call, reset of a stream.
    Cancel { token: u32 },
}

/// What the VM's gRPC callbacks can read while they run.
#[derive(Default)]
pub(crate) struct GrpcDelivery {
    pub message: Option<Vec<u8>>,
    pub initial: Option<Headers>,
    pub trailing: Option<Headers>,
}

pub(crate) struct CalloutResponse {
    pub headers: Headers,
    pub body: Vec<u8>,
    pub trailers: Headers,
}

/// Everything the host functions of one VM reach through `Caller`.
pub(crate) struct VmState {
    pub shared: Shared,
    pub plugin: Arc<PluginInfo>,
    pub worker: usize,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<i32, i32>>,
    pub root_id: u32,
    /// Context of the callback being run, and the one `proxy_set_effective_context` chose.
    pub current: u32,
    pub effective: Option<u32>,
    pub in_configure: bool,
    pub streams: HashMap<u32, StreamHost>,
    pub callout_response: Option<CalloutResponse>,
    pub deferred: Vec<Deferred>,
    pub stop_next_iteration: bool,
    pub new_callouts: Vec<NewCallout>,
    pub next_callout_token: u32,
    pub grpc_ops: Vec<GrpcOp>,
    /// Counters of gRPC calls and streams (tokens: see hostcalls).
    pub next_grpc_call: u32,
    pub next_grpc_stream: u32,
    /// Live gRPC tokens: true for a stream.
    pub grpc_tokens: HashMap<u32, bool>,
    pub grpc: GrpcDelivery,
    /// `proxy_get_status`: the status of the callout being delivered.
    pub status: (u32, String),
    /// Set when the filter called `proxy_set_tick_period_milliseconds`.
    pub tick_request: Option<u32>,
    pub metric_names: HashMap<u32, String>,
    pub next_metric_id: [u32; 3],
    pub rng: u64,
    /// Host calls and bytes copied, when the Envoy counts them
    /// ([`crate::EnvoyBuilder::count_host_calls`]).
    pub host_calls: Option<HostCalls>,
}

/// What a module asked of the host: calls per import, and bytes copied each
/// way through guest memory (`bytes_in`: read from the guest, e.g. a header
/// value or a shared-data value it sets; `bytes_out`: handed to the guest,
/// e.g. a body or a shared-data value it gets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCalls {
    pub calls: std::collections::BTreeMap<String, u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl HostCalls {
    /// Every call, whatever the import.
    pub fn total(&self) -> u64 {
        self.calls.values().sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &HostCalls) {
        for (name, n) in &other.calls {
            *self.calls.entry(name.clone()).or_default() += n;
        }
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
    }
}

impl VmState {
    pub fn new(shared: Shared, plugin: Arc<PluginInfo>, worker: usize) -> VmState {
        VmState {
            shared,
            plugin,
            worker,
            memory: None,
            alloc: None,
            root_id: 1,
            current: 1,
            effective: None,
            in_configure: false,
            streams: HashMap::new(),
            callout_response: None,
            deferred: Vec::new(),
            stop_next_iteration: false,
            new_callouts: Vec::new(),
            next_callout_token: 1,
            grpc_ops: Vec::new(),
            next_grpc_call: 1,
            next_grpc_stream: 1,
            grpc_tokens: HashMap::new(),
            grpc: GrpcDelivery::default(),
            status: (0, String::new()),
            tick_request: None,
            metric_names: HashMap::new(),
            next_metric_id: [0, 1, 2],
            rng: 0x9e37_79b9_7f4a_7c15 ^ (worker as u64 + 1),
            host_calls: None,
        }
    }

    pub fn ctx(&self) -> u32 {
        self.effective.unwrap_or(self.current)
    }

    pub fn stream(&self) -> Option<&StreamHost> {
        self.streams.get(&self.ctx())
    }

    pub fn stream_mut(&mut self) -> Option<&mut StreamHost> {
        let ctx = self.ctx();
        self.streams.get_mut(&ctx)
    }
}

type CallResponseFn = TypedFunc<(i32, i32, i32, i32, i32), ()>;

/// The exported callbacks of a proxy-wasm module (absent ones are skipped,
/// as Envoy does).
pub(crate) struct Exports {
    pub on_context_create: Option<TypedFunc<(i32, i32), ()>>,
    pub on_vm_start: Option<TypedFunc<(i32, i32), i32>>,
    pub on_configure: Option<TypedFunc<(i32, i32), i32>>,
    pub on_request_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub on_request_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub on_request_trailers: Option<TypedFunc<(i32, i32), i32>>,
    pub on_response_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub on_response_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub on_response_trailers: Option<TypedFunc<(i32, i32), i32>>,
    pub on_log: Option<TypedFunc<i32, ()>>,
    pub on_done: Option<TypedFunc<i32, i32>>,
    pub on_delete: Option<TypedFunc<i32, ()>>,
    pub on_tick: Option<TypedFunc<i32, ()>>,
    pub on_queue_ready: Option<TypedFunc<(i32, i32), ()>>,
    pub on_http_call_response: Option<CallResponseFn>,
    pub on_grpc_receive_initial_metadata: Option<TypedFunc<(i32, i32, i32), ()>>,
    pub on_grpc_receive: Option<TypedFunc<(i32, i32, i32), ()>>,
    pub on_grpc_receive_trailing_metadata: Option<TypedFunc<(i32, i32, i32), ()>>,
    pub on_grpc_close: Option<TypedFunc<(i32, i32, i32), ()>>,
}

pub(crate) struct Vm {
    pub store: Store<VmState>,
    pub exports: Exports,
    pub failed: bool,
}

struct Runtime {
    engine: Engine,
    linker: Linker<VmState>,
    provided: HashSet<(String, String)>,
}

fn runtime() -> Result<&'static Runtime, Error> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let engine = Engine::default();
            let mut linker = Linker::new(&engine);
            let provided = crate::hostcalls::define(&mut linker).map_err(|e| format!("{e:#}"))?;
            Ok(Runtime {
                engine,
                linker,
                provided,
            })
        })
        .as_ref()
        .map_err(|e| Error::Host(format!("cannot build the wasmtime linker: {e}")))
}

type ModuleCache = Mutex<HashMap<PathBuf, (SystemTime, u64, InstancePre<VmState>)>>;

/// Compiles a module once per (path, mtime, size) and checks its imports.
pub(crate) fn load(path: &Path) -> Result<InstancePre<VmState>, Error> {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let meta = std::fs::metadata(path).map_err(|_| Error::WasmMissing(path.to_path_buf()))?;
    let stamp = (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    );
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    {
        let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((mtime, len, pre)) = cache.get(path) {
            if (*mtime, *len) == stamp {
                return Ok(pre.clone());
            }
        }
    }
    let rt = runtime()?;
    let bytes = std::fs::read(path).map_err(|_| Error::WasmMissing(path.to_path_buf()))?;
    let module = Module::new(&rt.engine, &bytes)
        .map_err(|e| Error::Host(format!("cannot compile {}: {e:#}", path.display())))?;
    let unknown: Vec<String> = module
        .imports()
        .filter(|i| {
            !rt.provided
                .contains(&(i.module().to_string(), i.name().to_string()))
        })
        .map(|i| format!("{}::{}", i.module(), i.name()))
        .collect();
    if !unknown.is_empty() {
        return Err(Error::UnknownImports(unknown));
    }
    let pre = rt
        .linker
        .instantiate_pre(&module)
        .map_err(|e| Error::Host(format!("cannot link {}: {e:#}", path.display())))?;
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache.insert(path.to_path_buf(), (stamp.0, stamp.1, pre.clone()));
    Ok(pre)
}

/// [`load`] with every import wrapped to count its calls in the VM's
/// [`HostCalls`]: slower, for the host-call profile only, so compiled anew.
pub(crate) fn load_counting(path: &Path) -> Result<InstancePre<VmState>, Error> {
    let rt = runtime()?;
    // Checks the imports, and compiles the module for the plain linker.
    load(path)?;
    let bytes = std::fs::read(path).map_err(|_| Error::WasmMissing(path.to_path_buf()))?;
    let module = Module::new(&rt.engine, &bytes)
        .map_err(|e| Error::Host(format!("cannot compile {}: {e:#}", path.display())))?;
    let mut counting: Linker<VmState> = Linker::new(&rt.engine);
    for import in module.imports() {
        let wasmtime::ExternType::Func(ty) = import.ty() else {
            continue;
        };
        let (module_name, name) = (import.module().to_string(), import.name().to_string());
        let (m, n) = (module_name.clone(), name.clone());
        counting
            .func_new(
                &module_name,
                &name,
                ty,
                move |mut caller: wasmtime::Caller<'_, VmState>, params, results| {
                    if let Some(h) = caller.data_mut().host_calls.as_mut() {
                        match h.calls.get_mut(&n) {
                            Some(count) => *count += 1,
                            None => {
                                h.calls.insert(n.clone(), 1);
                            }
                        }
                    }
                    let Some(f) = rt
                        .linker
                        .get(&mut caller, &m, &n)
                        .ok()
                        .and_then(|e| e.into_func())
                    else {
                        return Err(wasmtime::Error::msg(format!("no host function {m}::{n}")));
                    };
                    f.call(&mut caller, params, results)
                },
            )
            .map_err(|e| Error::Host(format!("cannot wrap {module_name}::{name}: {e:#}")))?;
    }
    counting
        .instantiate_pre(&module)
        .map_err(|e| Error::Host(format!("cannot link {}: {e:#}", path.display())))
}

/// The imports of a module, `module::name`, for diagnostics.
pub fn module_imports(path: &Path) -> Result<Vec<String>, Error> {
    let rt = runtime()?;
    let bytes = std::fs::read(path).map_err(|_| Error::WasmMissing(path.to_path_buf()))?;
    let module = Module::new(&rt.engine, &bytes)
        .map_err(|e| Error::Host(format!("cannot compile {}: {e:#}", path.display())))?;
    Ok(module
        .imports()
        .map(|i| format!("{}::{}", i.module(), i.name()))
        .collect())
}

impl Vm {
    /// Instantiates the module and runs the wasip1 reactor initialiser.
    pub fn instantiate(pre: &InstancePre<VmState>, state: VmState) -> Result<Vm, Error> {
        let rt = runtime()?;
        let mut store = Store::new(&rt.engine, state);
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| Error::Host(format!("instantiation failed: {e:#}")))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| Error::Host("the module exports no memory".into()))?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<i32, i32>(&mut store, "malloc"))
            .map_err(|_| {
                Error::Host("the module exports neither proxy_on_memory_allocate nor malloc".into())
            })?;
        store.data_mut().memory = Some(memory);
        store.data_mut().alloc = Some(alloc);

        macro_rules! export {
            ($name:literal) => {
                match instance.get_func(&mut store, $name) {
                    None => None,
                    Some(f) => Some(f.typed(&store).map_err(|e| {
                        Error::Host(format!("export {} has an unexpected signature: {e}", $name))
                    })?),
                }
            };
        }
        let exports = Exports {
            on_context_create: export!("proxy_on_context_create"),
            on_vm_start: export!("proxy_on_vm_start"),
            on_configure: export!("proxy_on_configure"),
            on_request_headers: export!("proxy_on_request_headers"),
            on_request_body: export!("proxy_on_request_body"),
            on_request_trailers: export!("proxy_on_request_trailers"),
            on_response_headers: export!("proxy_on_response_headers"),
            on_response_body: export!("proxy_on_response_body"),
            on_response_trailers: export!("proxy_on_response_trailers"),
            on_log: export!("proxy_on_log"),
            on_done: export!("proxy_on_done"),
            on_delete: export!("proxy_on_delete"),
            on_tick: export!("proxy_on_tick"),
            on_queue_ready: export!("proxy_on_queue_ready"),
            on_http_call_response: export!("proxy_on_http_call_response"),
            on_grpc_receive_initial_metadata: export!("proxy_on_grpc_receive_initial_metadata"),
            on_grpc_receive: export!("proxy_on_grpc_receive"),
            on_grpc_receive_trailing_metadata: export!("proxy_on_grpc_receive_trailing_metadata"),
            on_grpc_close: export!("proxy_on_grpc_close"),
        };
        let init = instance
            .get_typed_func::<(), ()>(&mut store, "_initialize")
            .or_else(|_| instance.get_typed_func::<(), ()>(&mut store, "_start"))
            .ok();
        if let Some(init) = init {
            if let Err(e) = init.call(&mut store, ()) {
                return Err(Error::Trap {
                    function: "_initialize".into(),
                    message: format!("{e:#}"),
                    logs: lock(&store.data().shared).logs.clone(),
                });
            }
        }
        Ok(Vm {
            store,
            exports,
            failed: false,
        })
    }
}

pub(crate) fn status(s: Status) -> i32 {
    s.code()
}
