//! [`EnvoyBuilder`]: how a test configures a simulated Envoy, and `build`,
//! which loads the module and starts the VMs as Envoy 1.40 does.

use super::*;

/// Builder options that set one field: `name(arg: Type) = value;` becomes
/// `pub fn name(mut self, arg: Type) -> Self`, setting `self.name = value`;
/// `name(key: &str, arg: Type) in field = value;` adds `(key, value)` to
/// `self.field` (a map, where it replaces the key's entry, or a list).
macro_rules! options {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$name = $value;
                self
            }
        )*
    };
    ($($(#[$doc:meta])* $name:ident($key:ident: &str, $arg:ident: $ty:ty) in $field:ident = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $key: &str, $arg: $ty) -> Self {
                self.$field.extend([($key.to_string(), $value)]);
                self
            }
        )*
    };
}

crate::http::filter_inputs!(EnvoyBuilder);

/// Configures and builds an [`SimEnvoy`].
pub struct EnvoyBuilder {
    wasm: PathBuf,
    workers: usize,
    main_thread_vm: bool,
    bootstrap_singleton: bool,
    config_check: bool,
    suppress_envoy_headers: bool,
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
    options! {
        /// Number of worker threads, each with its own VM (default 1).
        workers(n: usize) = n.max(1);
        /// Envoy's VM on the main thread (default on, as Envoy): one more VM of
        /// the plugin, started and configured before the workers' (`on_vm_start`,
        /// `on_configure`, its own root context and ticks), that never sees a
        /// stream. Its log lines carry `worker == workers()`; it shares shared
        /// data, queues and metrics with the workers and keeps ticking when a
        /// worker's VM fails.
        main_thread_vm(on: bool) = on;
        /// Envoy's `bootstrap_extensions` Wasm service with `singleton: true`
        /// (`envoy.bootstrap.wasm`, as the SDK ships its hello_world) instead of
        /// an HTTP filter (default off): the plugin runs in the main thread's VM
        /// alone, no worker VM and no stream ([`SimEnvoy::workers`] is 0; its
        /// log lines carry `worker == 0`). As in Envoy 1.40, with
        /// [`EnvoyBuilder::config_check`] on it starts twice (`on_vm_start`,
        /// `on_configure`) and ticks once per period. `workers` and
        /// `main_thread_vm` do not apply.
        bootstrap_singleton(on: bool) = on;
        /// The short-lived copy of the plugin Envoy starts and configures once
        /// before serving (default on, as Envoy): `on_vm_start` and
        /// `on_configure` run one more time, first, in a VM that is then dropped
        /// (its log lines carry `worker == workers() + 1` when the main-thread
        /// VM is on). A configuration it rejects fails the build.
        config_check(on: bool) = on;
        /// The plugin `configuration` (what `on_configure` reads).
        plugin_config(config: impl AsRef<[u8]>) = config.as_ref().to_vec();
        /// The VM `configuration` (what `on_vm_start` reads).
        vm_config(config: impl AsRef<[u8]>) = config.as_ref().to_vec();
        /// Shared data and queues are scoped by vm_id (default "").
        vm_id(vm_id: &str) = vm_id.to_string();
        plugin_name(name: &str) = name.to_string();
        root_id(root_id: &str) = root_id.to_string();
        /// Envoy's `allow_on_headers_stop_iteration` (default false, as Envoy):
        /// false turns Pause at headers into StopAllIteration (body withheld
        /// until the filter resumes); true keeps StopIteration (body callbacks run).
        allow_on_headers_stop_iteration(allow: bool) = allow;
        /// Envoy's `failure_policy: FAIL_OPEN`: after a trap, streams pass
        /// through without the filter instead of getting 503.
        fail_open(fail_open: bool) = fail_open;
        /// Envoy's log level (default Info): lower lines are not emitted (and
        /// not captured); `proxy_get_log_level` reports it.
        log_level(level: LogLevel) = level;
        /// Route timeout for an upstream that never answers (default 15 s, as Envoy).
        route_timeout(timeout: Duration) = timeout;
        /// The router filter's `suppress_envoy_headers` (default false, as
        /// Envoy): true drops the `x-envoy-upstream-service-time` the router
        /// otherwise adds to an upstream's response headers (last, after the
        /// upstream's own), where the filter sees it.
        suppress_envoy_headers(on: bool) = on;
        /// Request buffer limit (Envoy's per_connection_buffer_limit_bytes,
        /// default 1 MiB): a filter buffering more gets Envoy's 413.
        buffer_limit(bytes: usize) = bytes;
        /// The upstream service (default: 200 with body "upstream ok").
        upstream(handler: impl FnMut(&UpstreamRequest) -> Reply + 'static) =
            Some(Box::new(handler));
        /// Count every host call per import and the bytes copied through guest
        /// memory ([`SimEnvoy::host_calls`]); each call then goes through a wrapper,
        /// so time measurements of such an Envoy mean nothing.
        count_host_calls(on: bool) = on;
        /// Seeds WASI `random_get` (deterministic per worker and seed; Envoy uses
        /// BoringSSL). Two builders with different seeds model two Envoy processes.
        random_seed(seed: u64) = seed;
        /// The upstream host's address, what `upstream.address` reads once the
        /// router picked it (default `127.0.0.1:8080`).
        upstream_address(address: &str) = address.to_string();
        /// The matched route's name (`xds.route_name`; NotFound if unset).
        route_name(name: &str) = Some(name.to_string());
        /// The route's cluster (`xds.cluster_name`; NotFound if unset).
        cluster_name(name: &str) = Some(name.to_string());
    }

    options! {
        /// A cluster for `proxy_http_call`, answered in process.
        cluster(name: &str, handler: impl FnMut(&UpstreamRequest) -> Reply + 'static) in clusters =
            Cluster::InProcess(Box::new(handler));
        /// A cluster for `proxy_http_call` forwarded over TCP to a loopback
        /// HTTP/1.1 server (`"127.0.0.1:8080"`).
        cluster_addr(name: &str, addr: &str) in clusters = Cluster::Tcp(addr.to_string());
        /// A cluster for `proxy_grpc_call` and `proxy_grpc_stream`, answered in
        /// process: the handler gets each call ([`crate::GrpcRequest`]: service,
        /// method, messages, metadata as Envoy sends it) and answers a
        /// [`crate::GrpcReply`]. A stream is answered when the filter
        /// half-closes it (`proxy_grpc_close`, or a send with end of stream).
        grpc_cluster(
            name: &str,
            handler: impl FnMut(&crate::GrpcRequest) -> crate::GrpcReply + 'static
        ) in grpc_clusters = GrpcCluster::InProcess(Box::new(handler));
        /// A cluster for `proxy_grpc_call` and `proxy_grpc_stream` served by a
        /// real gRPC server (HTTP/2 cleartext) on loopback, e.g. etcd's client
        /// port or a [`crate::GrpcServer`]. Unary calls block until the answer
        /// or the call's timeout (real time); stream messages arrive as they come.
        grpc_cluster_addr(name: &str, addr: &str) in grpc_clusters = GrpcCluster::H2(addr.to_string());
        /// The route's metadata (`xds.route_metadata.filter_metadata.<namespace>`).
        route_metadata(namespace: &str, value: crate::Value) in route_metadata = value;
    }

    /// Loads the module (compiled once per path), starts one VM per worker
    /// (`_initialize`, `on_context_create`, `on_vm_start`, `on_configure`).
    pub fn build(self) -> Result<SimEnvoy, Error> {
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
        // A singleton service has the main thread's VM and no worker's.
        let (workers, main_thread_vm) = if self.bootstrap_singleton {
            (0, true)
        } else {
            (self.workers, self.main_thread_vm)
        };
        let mut envoy = SimEnvoy {
            vms: Vec::new(),
            workers,
            singleton: self.bootstrap_singleton,
            suppress_envoy_headers: self.suppress_envoy_headers,
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
        let main = usize::from(main_thread_vm);
        let check = usize::from(self.config_check);
        for index in 0..workers + main + check {
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
            let index = workers + main;
            envoy.start_vm(index)?;
            envoy.vms.pop();
            envoy.next_ctx.pop();
            envoy.ticks.pop();
        }
        if main_thread_vm {
            envoy.start_vm(workers)?;
        }
        for worker in 0..workers {
            envoy.start_vm(worker)?;
        }
        envoy.pump();
        Ok(envoy)
    }
}

impl SimEnvoy {
    /// Starts configuring an Envoy running the module at `wasm`.
    pub fn builder(wasm: impl AsRef<Path>) -> EnvoyBuilder {
        EnvoyBuilder {
            wasm: wasm.as_ref().to_path_buf(),
            workers: 1,
            main_thread_vm: true,
            bootstrap_singleton: false,
            config_check: true,
            suppress_envoy_headers: false,
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
}
