//! Regions on one machine, for the multi-region tests (issue 34): each region is its
//! own etcd cluster, and every path from one region to another region's etcd goes
//! through a relay that delays each byte by the same one-way latency in both
//! directions (`Relay::start_delayed`), so a round trip across regions costs twice
//! that, on every cross-region path alike. A region's own proxies reach its members
//! directly. Cutting a region off cuts every path into it and out of it; its proxies
//! still reach their own etcd, as a region that lost its links but not its power.

use crate::etcd::{proxy_config_on_ports, EtcdCluster};
use crate::relay::Relay;
use crate::{fail, EnvoyConfig, Result};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The Envoy cluster through which every proxy reaches region `name`'s etcd.
pub fn cluster_of(name: &str) -> String {
    format!("etcd_{name}")
}

/// The filter's `store` for a proxy of region `from` among regions `names`: one shard
/// per region (named after it, its cluster `cluster_of`), records homed by `home`.
pub fn store_of(names: &[&str], from: &str, home: Value) -> Value {
    let shards: Vec<Value> = names
        .iter()
        .map(|r| json!({"name": r, "cluster": cluster_of(r), "region": r}))
        .collect();
    json!({"kind": "etcd", "region": from, "shards": shards, "home": home})
}

/// One region: its etcd cluster, and the relays through which each other region
/// reaches it.
pub struct Region {
    pub name: String,
    pub etcd: EtcdCluster,
    /// By the region the path comes from: one relay per member of this region.
    inbound: Vec<(String, Vec<Relay>)>,
}

/// Regions, each with its etcd, joined by delayed links.
pub struct Regions {
    pub regions: Vec<Region>,
    /// The one-way delay of every cross-region path.
    pub one_way: Duration,
}

impl Regions {
    /// `names` regions, each an etcd cluster of `members` members, every
    /// cross-region path delayed by `one_way` each way.
    pub fn start(
        label: &str,
        names: &[&str],
        members: usize,
        one_way: Duration,
    ) -> Result<Regions> {
        if names.is_empty() {
            fail!("regions: name one region at least");
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                fail!("regions: {n} named twice");
            }
        }
        let mut regions = Vec::new();
        for name in names {
            let etcd = EtcdCluster::start(&format!("{label}-{name}"), members)?;
            regions.push(Region {
                name: name.to_string(),
                etcd,
                inbound: Vec::new(),
            });
        }
        for region in &mut regions {
            let targets: Vec<SocketAddr> = region
                .etcd
                .proxy_ports()
                .into_iter()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                .collect();
            for from in names.iter().filter(|n| **n != region.name) {
                let relays = targets
                    .iter()
                    .map(|t| Relay::start_delayed(*t, one_way))
                    .collect::<Result<Vec<_>>>()?;
                region.inbound.push((from.to_string(), relays));
            }
        }
        Ok(Regions { regions, one_way })
    }

    pub fn region(&self, name: &str) -> Result<&Region> {
        match self.regions.iter().find(|r| r.name == name) {
            Some(r) => Ok(r),
            None => fail!("regions: no region {name}"),
        }
    }

    /// The ports a proxy in region `from` uses for region `to`'s etcd members: the
    /// members themselves when `to` is its own region, else the delayed relays.
    pub fn ports(&self, from: &str, to: &str) -> Result<Vec<u16>> {
        self.region(from)?;
        let target = self.region(to)?;
        if from == to {
            return Ok(target.etcd.proxy_ports());
        }
        match target.inbound.iter().find(|(f, _)| f == from) {
            Some((_, relays)) => Ok(relays.iter().map(Relay::port).collect()),
            None => fail!("regions: no path from {from} to {to}"),
        }
    }

    /// The filter's `store` for a proxy of region `from`: one shard per region (named
    /// after it, its cluster `cluster_of`), records homed by `home` (`store.home`).
    pub fn store(&self, from: &str, home: Value) -> Value {
        let names: Vec<&str> = self.regions.iter().map(|r| r.name.as_str()).collect();
        store_of(&names, from, home)
    }

    /// The Envoy configuration of a proxy in region `from` (`multi-proxy-etcd.yaml`,
    /// or with `lds` the listener by LDS): one cluster per region (`cluster_of`), its
    /// own region's members reached directly, the others' through the delayed relays.
    pub fn proxy_config(
        &self,
        from: &str,
        upstream_port: u16,
        wasm: &Path,
        filter_config: &str,
        lds: bool,
    ) -> Result<EnvoyConfig> {
        let mut shards = Vec::new();
        for r in &self.regions {
            shards.push((cluster_of(&r.name), self.ports(from, &r.name)?));
        }
        let named: Vec<(&str, Vec<u16>)> = shards
            .iter()
            .map(|(c, p)| (c.as_str(), p.clone()))
            .collect();
        let dir = &self.region(from)?.etcd.dir;
        proxy_config_on_ports(dir, &named, upstream_port, wasm, filter_config, lds)
    }

    /// Cuts region `name` off: nothing passes on any path into it or out of it.
    pub fn cut(&self, name: &str) -> Result<()> {
        self.each_link_of(name, Relay::cut)
    }

    /// Ends `cut`: the held bytes go through, as after a short partition.
    pub fn heal(&self, name: &str) -> Result<()> {
        self.each_link_of(name, Relay::heal)
    }

    fn each_link_of(&self, name: &str, f: impl Fn(&Relay)) -> Result<()> {
        self.region(name)?;
        for r in &self.regions {
            for (from, relays) in &r.inbound {
                if r.name == name || from == name {
                    relays.iter().for_each(&f);
                }
            }
        }
        Ok(())
    }
}
