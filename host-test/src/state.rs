//! The host state of one VM (what the host calls read and change): plugin
//! facts, per-stream maps and bodies, queued callouts and gRPC operations,
//! deferred work, and the host-call counters.

use crate::abi::Status;
use crate::http::Headers;
use crate::shared::Shared;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use wasmtime::{Memory, TypedFunc};

/// Plugin facts every VM of an Envoy shares.
pub(crate) struct PluginInfo {
    /// Scopes shared data and queues.
    pub vm_id: String,
    /// The `plugin_name` property.
    pub name: String,
    /// The `plugin_root_id` property.
    pub root_id: String,
    /// What `proxy_on_configure` reads.
    pub plugin_config: Vec<u8>,
    /// What `proxy_on_vm_start` reads.
    pub vm_config: Vec<u8>,
    /// The clusters a callout or gRPC call may name.
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
    /// A unary call (`call`: its message and timeout) or a stream (`None`).
    Open {
        token: u32,
        cluster: String,
        service: String,
        method: String,
        metadata: Headers,
        call: Option<(Vec<u8>, u32)>,
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

/// A VM's gRPC calls and streams as the host calls keep them.
pub(crate) struct GrpcCalls {
    /// What the module asked for during the current VM call.
    pub ops: Vec<GrpcOp>,
    /// Counters of gRPC calls and streams (tokens: see hostcalls).
    pub next_call: u32,
    pub next_stream: u32,
    /// Live gRPC tokens: true for a stream.
    pub live: HashMap<u32, bool>,
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
    /// `proxy_on_configure` is running: the plugin configuration is readable.
    pub in_configure: bool,
    /// The streams of this VM, by context id.
    pub streams: HashMap<u32, StreamHost>,
    /// What `proxy_on_http_call_response` reads while it runs.
    pub callout_response: Option<CalloutResponse>,
    pub deferred: Vec<Deferred>,
    /// The module sent a local reply during the current callback: the
    /// chain stops there whatever the callback returns.
    pub stop_next_iteration: bool,
    /// Callouts the module started during the current VM call, and the
    /// counter of their tokens.
    pub new_callouts: Vec<NewCallout>,
    pub next_callout_token: u32,
    pub grpc_calls: GrpcCalls,
    /// What the gRPC callbacks read while they run.
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
            grpc_calls: GrpcCalls {
                ops: Vec::new(),
                next_call: 1,
                next_stream: 1,
                live: HashMap::new(),
            },
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

pub(crate) fn status(s: Status) -> i32 {
    s.code()
}
