//! What a stream is given: the configured plugin (config and the per-store state derived
//! from it), the host seam (`Env`), and the store calls a stream asks the glue to make.

use super::store::{layout_timed, StoreState};
use crate::config::{Config, Policy};
use crate::etcd::LeaseCache;
use crate::key::Digest;
use crate::local::LocalTier;
use crate::metrics::Counter;
use crate::store::{Layout, SharedData, StoreError};
use crate::wait::Waiters;
use std::borrow::Cow;
use std::sync::Arc;

/// A configured plugin: immutable config and what its store needs derived from it.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub config: Config,
    /// The configured store (`store.rs`: the one place that tells the two apart).
    pub store: StoreState,
    /// Whether any policy waits (`Config::waits`), so a completion knows at once
    /// whether to wake waiters.
    pub waits: bool,
}

impl Plugin {
    pub fn new(config: Config) -> Self {
        Plugin {
            waits: config.waits(),
            store: StoreState::new(&config),
            config,
        }
    }

    /// The shared-data layout (an error when the store is etcd: no layout exists).
    pub fn layout(&self) -> Result<&Layout, StoreError> {
        self.store.layout()
    }

    /// The shared-data layout with a policy's timing (borrowed when it is the layout's).
    pub fn layout_for(&self, policy: &Policy) -> Result<Cow<'_, Layout>, StoreError> {
        Ok(layout_timed(self.store.layout()?, policy))
    }
}

/// What the host provides a stream besides shared data.
pub trait Env: SharedData {
    /// Wall-clock time in milliseconds since the Unix epoch (Envoy's clock).
    fn now_ms(&self) -> u64;
    /// A token unique to this claim (random, or counter-based with a random seed).
    fn new_token(&mut self) -> u64;
    fn count(&mut self, counter: Counter);
    /// A debug line; formatted only when the host logs at debug level.
    fn debug(&self, message: std::fmt::Arguments<'_>);
    fn warn(&self, message: &str);
    /// This worker's leases (etcd store).
    fn leases(&mut self) -> &mut LeaseCache;
    /// This worker's tier of completed records (etcd store).
    fn local(&mut self) -> &mut LocalTier;
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
/// response message, or status 0 and `etcdpb::status_body` (the gRPC status and message).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallAnswer {
    pub status: u16,
    pub body: Vec<u8>,
    /// The answer's headers (pseudo-headers included); read for detached calls only.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Whether a policy keeps unknown outcomes (and unsettled claims) until their TTL.
pub fn keeps_unknown(policy: &Policy) -> bool {
    policy.keeps_unknown()
}
