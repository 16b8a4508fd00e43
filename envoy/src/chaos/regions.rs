//! The soak's regions variant (`--regions true`, `make chaos REGIONS=1`; issue 34):
//! two simulated regions `a` and `b` (`crate::regions`), each its own one-member
//! etcd and its own proxy (A in `a`, B in `b`, both on the etcd store), every path
//! from one region to the other's etcd delayed 40 ms each way. Records are homed by
//! the trusted scope header `x-home-region` (`store.home`, `a` when absent): a proxy
//! claims and completes a record homed in the other region over the delayed links.
//!
//! Each key's home is a function of its identity (tenant and key, or tenant and
//! entity for an ordered delivery), drawn so about half the keys live in each region;
//! every attempt goes to either region's proxy at random, so a retry changes region
//! one time in two. The nemesis cuts the regions apart and kills and freezes a
//! region's etcd (`nemesis`); proxy C (shared data) does not run here.
//!
//! One etcd member per region: the variant's question is the path between regions,
//! and the faults of a member among three (leader, follower, partition) are the
//! main soak's; one member keeps the short variant at two etcd processes instead of
//! six on a 2-core machine, and makes a killed or frozen member its whole region's
//! store down.

use super::cluster::{
    filter_value, listener_template, start_proxies, Broken, Cluster, ProxyPlan, Shards,
};
use super::history::{fnv1a, Domain};
use crate::paths::dedup_wasm;
use crate::regions::{cluster_of, store_of, Regions};
use crate::upstream::DemoUpstream;
use crate::Result;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The regions, in proxy order: proxy A runs in `a`, proxy B in `b`.
pub const NAMES: [&str; 2] = ["a", "b"];
/// The home of a record whose request has no home header.
pub const DEFAULT_HOME: &str = "a";
/// The trusted header naming a record's home region (one of `scope.headers`).
pub const HOME_HEADER: &str = "x-home-region";
/// The one-way delay of every path between the regions (as in `tests/regions.rs`).
pub const ONE_WAY: Duration = Duration::from_millis(40);
/// etcd members per region (see above).
pub const MEMBERS: usize = 1;

/// The home header a request for `subject` (its key, or an ordered delivery's
/// entity) of `tenant` carries: `a`, `b`, or none (homed in `a` by default). A
/// function of the record's identity, never of where the request lands, as the
/// filter requires: every attempt of one key carries the same.
pub fn home_of(tenant: &str, subject: &str) -> Option<&'static str> {
    match fnv1a(format!("{tenant}\n{subject}").as_bytes()) % 4 {
        0 => Some("a"),
        1 | 2 => Some("b"),
        _ => None,
    }
}

/// The region a request for `subject` of `tenant` is homed in.
pub fn home_region(tenant: &str, subject: &str) -> &'static str {
    home_of(tenant, subject).unwrap_or(DEFAULT_HOME)
}

/// The filter configuration of the proxy in region `from`: the soak's (rules, TTLs,
/// `failure_mode: "closed"`, `store.timeout_ms`...), with the home header in the
/// scope and a store of one shard per region homed by it. Under
/// `Broken::PerRegion`, the region's own etcd alone and no home rule.
pub fn filter_config(from: &str, broken: Option<Broken>, variant: u32) -> String {
    let mut cfg = filter_value(Domain::Etcd, broken, variant, Shards::ONE, false);
    let mut headers = cfg["scope"]["headers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    headers.push(json!(HOME_HEADER));
    cfg["scope"]["headers"] = Value::Array(headers);
    let timeout = cfg["store"]["timeout_ms"].clone();
    cfg["store"] = match broken {
        Some(Broken::PerRegion) => json!({"kind": "etcd", "cluster": cluster_of(from)}),
        _ => store_of(
            &NAMES,
            from,
            json!({"header": HOME_HEADER, "default": DEFAULT_HOME}),
        ),
    };
    cfg["store"]["timeout_ms"] = timeout;
    cfg.to_string()
}

/// Start the regions (each its etcd), the recording upstream and the two proxies.
pub fn start(broken: Option<Broken>, epoch: Instant) -> Result<Cluster> {
    let wasm = dedup_wasm()?;
    let regions = Regions::start("chaos-region", &NAMES, MEMBERS, ONE_WAY)?;
    let upstream = DemoUpstream::start_recording()?;
    let mut plans = Vec::new();
    for (name, from) in ["A", "B"].into_iter().zip(NAMES) {
        let configs = [0, 1].map(|v| filter_config(from, broken, v));
        let mut envoy = regions.proxy_config(from, upstream.port(), &wasm, &configs[0], true)?;
        envoy.lds_template = Some(listener_template());
        plans.push(ProxyPlan {
            name,
            domain: Domain::Etcd,
            region: Some(from),
            envoy,
            configs,
        });
    }
    let store: Vec<(String, usize)> = NAMES.iter().map(|r| (cluster_of(r), MEMBERS)).collect();
    let proxies = start_proxies(plans, &store, epoch)?;
    Ok(Cluster::new(
        proxies,
        upstream,
        Vec::new(),
        Some(regions),
        epoch,
        Shards::ONE,
        store,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_configuration_of_the_variant_is_one_the_filter_takes() {
        for from in NAMES {
            for broken in [
                None,
                Some(Broken::ReleaseOnUnknown),
                Some(Broken::HoldOnUnknown),
                Some(Broken::NoTenantScope),
                Some(Broken::NoOrdering),
                Some(Broken::PerRegion),
            ] {
                for variant in 0..2 {
                    let cfg = filter_config(from, broken, variant);
                    if let Err(e) = dedup_core::Config::parse(cfg.as_bytes()) {
                        panic!("{cfg}: {e}");
                    }
                }
            }
        }
        let store = |broken| {
            let cfg: Value = serde_json::from_str(&filter_config("b", broken, 1)).unwrap();
            cfg["store"].clone()
        };
        assert_eq!(store(None)["region"], "b");
        assert_eq!(store(None)["home"]["header"], HOME_HEADER);
        assert_eq!(store(None)["timeout_ms"], 2500);
        assert_eq!(
            store(Some(Broken::PerRegion)),
            json!({"kind": "etcd", "cluster": "etcd_b", "timeout_ms": 2500})
        );
    }

    #[test]
    fn a_key_has_one_home_and_keys_live_in_both_regions() {
        assert_eq!(home_of("tenant-1", "op-3"), home_of("tenant-1", "op-3"));
        let homes: Vec<&str> = (0..200)
            .map(|i| home_region("tenant-1", &format!("op-{i}")))
            .collect();
        let in_b = homes.iter().filter(|h| **h == "b").count();
        assert!((60..140).contains(&in_b), "{in_b} of 200 homed in b");
        assert!((0..200).any(|i| home_of("t", &format!("op-{i}")).is_none()));
    }
}
