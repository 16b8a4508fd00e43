//! What a stream is given: the configured plugin (config and the per-store state derived
//! from it), the host seam (`Env`), and the store calls a stream asks the glue to make.

use crate::config::{Config, Policy, StoreConfig};
use crate::etcd::{LeaseCache, LeasePlan};
use crate::key::Digest;
use crate::local::LocalTier;
use crate::metrics::Counter;
use crate::store::{HostFault, Layout, SharedData, StoreError, WAYS};
use crate::wait::Waiters;
use std::borrow::Cow;

/// A configured plugin: immutable config and what its store needs derived from it.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub config: Config,
    /// Built for the configured store only.
    pub store: StoreState,
    /// Whether any policy waits (`Config::waits`), so a completion knows at once
    /// whether to wake waiters.
    pub waits: bool,
}

/// What the configured store needs, derived once from the config.
#[derive(Debug, Clone)]
pub enum StoreState {
    /// The buckets every policy shares, timed for the longest-lived policy (what the
    /// layout registry needs); a stream uses `layout_for` its policy.
    SharedData(Layout),
    /// etcd: a policy's lease timing (`leases_for`) follows from its TTLs and the
    /// budget of one store operation (`store.timeout_ms`).
    Etcd { budget_ms: u64 },
}

impl Plugin {
    pub fn new(config: Config) -> Self {
        let store = match &config.store {
            StoreConfig::SharedData {
                namespace,
                max_store_bytes,
                eviction,
                scope_claims_per_bucket,
            } => {
                // Every policy shares the buckets; the layout registers itself for as
                // long as the longest-lived policy's records may live.
                let top = &config.policy;
                let policies =
                    || std::iter::once(top).chain(config.rules.iter().map(|r| &r.policy));
                let layout = Layout::new(
                    namespace,
                    config.capacity,
                    policies()
                        .map(|p| p.in_flight_timeout_ms)
                        .max()
                        .unwrap_or(0),
                    policies().map(|p| p.ttl_ms).max().unwrap_or(0),
                )
                // Registered for as long as the longest-lived policy's claims may live.
                .keeping_unknown(policies().any(keeps_unknown))
                .isolating_scopes(
                    *eviction == crate::config::Eviction::Oldest,
                    usize::try_from(*scope_claims_per_bucket).unwrap_or(WAYS),
                )
                .with_max_store_bytes(*max_store_bytes);
                StoreState::SharedData(layout)
            }
            StoreConfig::Etcd(ec) => StoreState::Etcd {
                budget_ms: ec.timeout_ms,
            },
        };
        Plugin {
            waits: config.waits(),
            config,
            store,
        }
    }

    /// The shared-data layout (an error when the store is etcd: no layout exists).
    pub fn layout(&self) -> Result<&Layout, StoreError> {
        match &self.store {
            StoreState::SharedData(layout) => Ok(layout),
            StoreState::Etcd { .. } => Err(StoreError::Host(HostFault(
                "the store is etcd: no shared-data layout".into(),
            ))),
        }
    }

    /// The shared-data layout with a policy's timing (borrowed when it is the layout's).
    pub fn layout_for(&self, policy: &Policy) -> Result<Cow<'_, Layout>, StoreError> {
        let layout = self.layout()?;
        Ok(
            if policy.in_flight_timeout_ms == layout.in_flight_ms
                && policy.ttl_ms == layout.ttl_ms
                && keeps_unknown(policy) == layout.keep_unknown
            {
                Cow::Borrowed(layout)
            } else {
                Cow::Owned(layout.timed(
                    policy.in_flight_timeout_ms,
                    policy.ttl_ms,
                    keeps_unknown(policy),
                ))
            },
        )
    }

    /// The etcd lease timing of a policy.
    pub fn leases_for(&self, policy: &Policy) -> LeasePlan {
        let budget_ms = match self.store {
            StoreState::Etcd { budget_ms } => budget_ms,
            StoreState::SharedData(_) => 0,
        };
        LeasePlan::new(policy.ttl_ms, policy.in_flight_timeout_ms, budget_ms)
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
    policy.on_unknown_outcome == crate::config::OnUnknownOutcome::Keep
}
