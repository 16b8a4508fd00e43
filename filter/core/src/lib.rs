//! proxy-dedup's logic, with no proxy-wasm dependency: configuration, request keys, the
//! per-stream decision machine, and the two stores a claim lives in: Envoy shared data
//! (`store`, one proxy) and etcd (`etcd` for the records and wire protocol, `stream::etcd`
//! for the claim/settle protocol, several proxies). The cdylib in `filter/` is thin glue
//! that feeds Envoy's callbacks into `DedupStream` and makes the store calls it asks for.

pub mod admin;
pub mod callouts;
pub mod config;
pub mod etcd;
pub mod etcdpb;
pub mod geometry;
pub mod head;
pub mod httpdate;
pub mod jsonptr;
pub mod key;
pub mod local;
pub mod metrics;
pub mod ordering;
pub mod outcome;
pub mod payload;
pub mod principal;
pub mod record;
pub mod reply;
pub mod response;
pub mod shards;
pub mod store;
pub mod stream;
pub mod wait;
pub mod wire;
pub mod worker;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod props;
#[cfg(test)]
mod testing;

pub use config::{Config, ConfigError};
pub use metrics::Counter;
pub use reply::LocalReply;
pub use stream::{Decision, DedupStream, Env, Plugin};
