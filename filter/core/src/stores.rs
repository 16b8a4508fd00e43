//! The stores a claim can live in, each in a folder of its own (`shared`: Envoy shared
//! data, one node; `etcd`: several proxies), and the one place that chooses among them:
//! `Plugin::new` builds the store the configuration names. Everything else reaches a
//! store through the store interface (`stream::Store`).

pub mod etcd;
/// A third store, for tests: what adding a store takes (ARCHITECTURE.md, Adding a store).
#[cfg(test)]
pub mod memory;
pub mod shared;

use crate::config::{Config, StoreConfig};
use crate::stream::{Plugin, Store};

/// The store `config` names (not set up yet: `Store::set_up`).
pub fn build(config: &Config) -> Box<dyn Store> {
    match &config.store {
        StoreConfig::SharedData { .. } => Box::new(shared::SharedDataStore::new(config)),
        StoreConfig::Etcd(ec) => Box::new(etcd::EtcdStore::new(ec.clone())),
    }
}

impl Plugin {
    /// A plugin of `config`, with the store it names (not set up: a worker's
    /// configuration does that, `Worker::configure`).
    pub fn new(config: Config) -> Self {
        let store = build(&config);
        Plugin::with_store(config, store)
    }
}
