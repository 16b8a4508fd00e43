//! The multi-proxy etcd suite (`multi_proxy/suite.rs`) on a sharded store: every
//! test's store is `store.shards` over two etcd clusters (`etcd_a`, `etcd_b`, each
//! with 3 members), with the same assertions. Then what only shards have: a live
//! resharding under traffic, a whole shard down, and the operator API per shard.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "multi_proxy/suite.rs"]
mod suite;

/// The suite's shard count.
const SHARDS: usize = 2;
