//! What a stream is given: the configured plugin (config and its store), the host seam
//! (`Env`), and the store calls a stream asks the glue to make.

use super::store::{Store, StoreWorker};
use crate::config::{Config, Policy};
use crate::key::Digest;
use crate::metrics::{Counter, Remote};
use crate::shared_data::SharedData;
use crate::wait::Waiters;
use std::sync::Arc;

/// A configured plugin: immutable config and its store (`Plugin::new`, in `stores`,
/// chooses which).
#[derive(Debug, Clone)]
pub struct Plugin {
    pub config: Config,
    /// The configured store, behind the store interface (`store.rs`).
    pub store: Arc<dyn Store>,
    /// Whether any policy waits (`Config::waits`), so a completion knows at once
    /// whether to wake waiters.
    pub waits: bool,
}

impl Plugin {
    /// A plugin of `config` with `store` (set up already).
    pub fn with_store(config: Config, store: Box<dyn Store>) -> Self {
        Plugin {
            waits: config.waits(),
            store: Arc::from(store),
            config,
        }
    }
}

/// What the host provides a stream besides shared data.
pub trait Env: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch (Envoy's clock).
    fn now_ms(&self) -> u64;
    /// A token unique to this claim (random, or counter-based with a random seed).
    fn new_token(&mut self) -> u64;
    fn count(&mut self, counter: Counter);
    /// Regions: a call of kind `what` to the home region of index `region` (never this
    /// proxy's own; `Route::remote`).
    fn count_remote(&mut self, what: Remote, region: u16);
    /// A debug line; formatted only when the host logs at debug level.
    fn debug(&self, message: std::fmt::Arguments<'_>);
    fn warn(&self, message: &str);
    /// What the configured store keeps per worker.
    fn store_worker(&mut self) -> &mut StoreWorker;
    /// The duplicates this worker holds in wait mode.
    fn waiters(&mut self) -> &mut Waiters;
    /// A record this proxy completed or released: wake its waiters on every worker.
    fn wake_waiters(&mut self, digest: &Digest);
}

/// A call to the remote store through the proxy, giving up after `timeout_ms`: a unary
/// gRPC call of method `path` (`/etcdserverpb.KV/Txn`, …) with the protobuf message
/// `body`, or (JSON gateway) a POST of `path` with the JSON `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCall {
    pub path: &'static str,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
    /// Where it goes: the store's cluster, over gRPC or HTTP (resolved once per config).
    pub route: Arc<Route>,
}

/// Where a store's calls go: an Envoy cluster, and how it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub cluster: String,
    /// Regions: the index of the shard's region among the home regions when it is not
    /// this proxy's (its claims and completions count as remote), else `None`.
    pub remote: Option<u16>,
    /// The shard's name (for logs and the operator API) and what its leases are cached
    /// under (`shards::shard_id`).
    pub shard: String,
    pub shard_id: u64,
    pub transport: Transport,
}

/// How a store call is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A unary gRPC call of the method `StoreCall::path` names (`/service/method`) to
    /// `upstream`: the cluster's name, or a serialised `GrpcService` naming the cluster
    /// and carrying `store.authority`.
    Grpc { upstream: Vec<u8> },
    /// An HTTP POST of `path` with a JSON body and this `:authority`.
    Http { authority: String },
}

/// The answer to a `StoreCall`: the HTTP status (0 when the call failed without a
/// response, e.g. reset) and the body. A gRPC call's answer is status 200 and the
/// response message, or status 0 and the gRPC status (`CallAnswer::grpc_failure`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallAnswer {
    pub status: u16,
    pub body: Vec<u8>,
    /// The answer's headers (pseudo-headers included); read for detached calls only.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl StoreCall {
    /// A gRPC call's service and method: its path is `/service/method`.
    pub fn grpc_method(&self) -> Option<(&str, &str)> {
        self.path.strip_prefix('/')?.split_once('/')
    }
}

impl CallAnswer {
    /// A gRPC call that ended without a message, with its `grpc-status` (the server's, or
    /// Envoy's own: 14 for a timeout, a reset or no healthy member) and message: status 0,
    /// and the status as a `google.rpc.Status` message (code: field 1, message: field 2),
    /// which a store reads like any answer.
    pub fn grpc_failure(code: u32, message: &[u8]) -> Self {
        let mut body = Vec::with_capacity(message.len() + 8);
        body.push(0x08); // field 1, varint
        varint(&mut body, u64::from(code));
        body.push(0x12); // field 2, length-delimited
        varint(&mut body, message.len() as u64);
        body.extend_from_slice(message);
        CallAnswer {
            status: 0,
            body,
            headers: Vec::new(),
        }
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Whether a policy keeps unknown outcomes (and unsettled claims) until their TTL.
pub fn keeps_unknown(policy: &Policy) -> bool {
    policy.keeps_unknown()
}
