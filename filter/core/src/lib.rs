//! proxy-dedup's logic, with no proxy-wasm dependency: configuration, request keys, the
//! per-stream decision machine (`stream`, which reaches its store through one interface),
//! and the two stores a claim lives in, each in its own folder: Envoy shared data
//! (`stores::shared`, one proxy) and etcd (`stores::etcd`, several proxies). The cdylib
//! in `filter/` is thin glue that feeds Envoy's callbacks into the `worker` and makes the
//! calls it asks for.

pub mod admin;
pub mod callouts;
pub mod config;
pub mod geometry;
pub mod head;
pub mod httpdate;
pub mod jsonptr;
pub mod key;
pub mod metrics;
pub mod ordering;
pub mod outcome;
pub mod payload;
pub mod phases;
pub mod principal;
pub mod record;
pub mod reply;
pub mod response;
pub mod shared_data;
pub mod stores;
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
