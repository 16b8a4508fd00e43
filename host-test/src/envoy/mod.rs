//! The simulated Envoy: N worker VMs of one plugin, the HTTP filter chain
//! around them (filter -> router -> upstream), callouts, timers and the
//! virtual clock. Streams are driven whole ([`SimEnvoy::request`]) or step by
//! step ([`SimEnvoy::start`], [`SimEnvoy::send_headers`], ...).

mod builder;
mod chain;
mod downstream;
mod events;
mod grpc_calls;
mod inspect;
mod outbound;
mod upstream;
mod vm_calls;

pub use builder::EnvoyBuilder;

use crate::abi::{LogLevel, MetricKind};
use crate::callout::{self, CalloutResult, Cluster};
use crate::error::Error;
use crate::http::{
    header_get, Headers, Reply, ReplyKind, Request, Response, StreamId, UpstreamRequest,
};
use crate::origin::{code_details, response_flags, StreamOrigin};
use crate::shared::{lock, Faults, LogLine, Metric, Shared, SharedInner};
use crate::state::{CalloutResponse, Deferred, DirHost, PluginInfo, StreamHost, VmState};
use crate::vm::{Export, Exports, Vm};
use grpc_calls::{GrpcCluster, GrpcEvent, GrpcLive};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::{WasmParams, WasmResults};

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

// Filter statuses a callback returns (proxy-wasm ABI 0.2.1). Headers, body
// and trailers callbacks share Continue = 0 and a plain stop = 1.
/// `Continue` (headers, body and trailers alike).
const CONTINUE: i32 = 0;
/// `FilterHeadersStatus::StopIteration`.
const STOP_ITERATION: i32 = 1;
/// `FilterHeadersStatus::ContinueAndEndStream`.
const CONTINUE_AND_END_STREAM: i32 = 2;

impl StreamHost {
    /// The host's maps and body for one side of the stream.
    fn side(&self, side: Side) -> &DirHost {
        match side {
            Side::Request => &self.req,
            Side::Response => &self.resp,
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut DirHost {
        match side {
            Side::Request => &mut self.req,
            Side::Response => &mut self.resp,
        }
    }
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
    /// When the whole request reached the upstream (virtual ns): the
    /// router times its answer from there.
    upstream_sent_ns: u64,
    upstream_headers_sent: bool,
    local_reply: bool,
    /// VM failed and fail-open: the filter is skipped.
    bypass: bool,
    context_created: bool,
    outcome: Option<Response>,
}

impl StreamDriver {
    /// The filter chain's state for one side of the stream.
    fn side_mut(&mut self, side: Side) -> &mut Dir {
        match side {
            Side::Request => &mut self.req,
            Side::Response => &mut self.resp,
        }
    }
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
pub struct SimEnvoy {
    /// The workers' VMs, then the main thread's.
    vms: Vec<Vm>,
    workers: usize,
    /// A bootstrap singleton service: the main thread's VM only.
    singleton: bool,
    /// The router's `suppress_envoy_headers`.
    suppress_envoy_headers: bool,
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
