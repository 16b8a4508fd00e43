//! One worker's VM: the wasmtime store (its host state is in `state`), the
//! exported proxy-wasm callbacks, and loading (compiled modules are cached per
//! path).

use crate::error::Error;
use crate::shared::lock;
use crate::state::VmState;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;
use wasmtime::{Engine, InstancePre, Linker, Module, Store, TypedFunc};

type CallResponseFn = Export<(i32, i32, i32, i32, i32), ()>;

/// An exported callback and the name it is exported under (which a trap
/// reports), so each name is written once, where it is looked up.
pub(crate) struct Export<P, R> {
    pub name: &'static str,
    pub func: TypedFunc<P, R>,
}

impl<P, R> Clone for Export<P, R> {
    fn clone(&self) -> Self {
        Export {
            name: self.name,
            func: self.func.clone(),
        }
    }
}

/// The exported callbacks of a proxy-wasm module (absent ones are skipped,
/// as Envoy does).
pub(crate) struct Exports {
    pub on_context_create: Option<Export<(i32, i32), ()>>,
    pub on_vm_start: Option<Export<(i32, i32), i32>>,
    pub on_configure: Option<Export<(i32, i32), i32>>,
    pub on_request_headers: Option<Export<(i32, i32, i32), i32>>,
    pub on_request_body: Option<Export<(i32, i32, i32), i32>>,
    pub on_request_trailers: Option<Export<(i32, i32), i32>>,
    pub on_response_headers: Option<Export<(i32, i32, i32), i32>>,
    pub on_response_body: Option<Export<(i32, i32, i32), i32>>,
    pub on_response_trailers: Option<Export<(i32, i32), i32>>,
    pub on_log: Option<Export<i32, ()>>,
    pub on_done: Option<Export<i32, i32>>,
    pub on_delete: Option<Export<i32, ()>>,
    pub on_tick: Option<Export<i32, ()>>,
    pub on_queue_ready: Option<Export<(i32, i32), ()>>,
    pub on_http_call_response: Option<CallResponseFn>,
    pub on_grpc_receive_initial_metadata: Option<Export<(i32, i32, i32), ()>>,
    pub on_grpc_receive: Option<Export<(i32, i32, i32), ()>>,
    pub on_grpc_receive_trailing_metadata: Option<Export<(i32, i32, i32), ()>>,
    pub on_grpc_close: Option<Export<(i32, i32, i32), ()>>,
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
            // `HOST_TEST_PERFMAP=1` names the compiled Wasm functions for `perf`
            // (/tmp/perf-<pid>.map), so a profile shows the filter's own code.
            let mut config = wasmtime::Config::new();
            if std::env::var("HOST_TEST_PERFMAP").is_ok_and(|v| v == "1") {
                config.profiler(wasmtime::ProfilingStrategy::PerfMap);
            }
            let engine = Engine::new(&config).map_err(|e| format!("{e:#}"))?;
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
                    Some(f) => Some(Export {
                        name: $name,
                        func: f.typed(&store).map_err(|e| {
                            Error::Host(format!(
                                "export {} has an unexpected signature: {e}",
                                $name
                            ))
                        })?,
                    }),
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
