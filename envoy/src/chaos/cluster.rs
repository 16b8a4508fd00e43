//! The soak's processes: a 3-member etcd behind relays (or, with `--shards N`, N of
//! them, the etcd store sharded over them by `store.shards`), the recording demo
//! upstream, proxies A and B (2 workers each, etcd store) and proxy C (2
//! workers, shared data), every listener served by LDS from a file so its
//! filter configuration can be pushed. Built on the harness's launchers. (The
//! regions variant builds its own world of two regions and two proxies:
//! `super::regions`.)

use super::checker::ProxyCounters;
use super::history::{
    Domain, DETACHED_PREFIX, ENTITY_HEADER, ORDERED_PREFIX, TENANT_HEADER, VERSION_HEADER,
};
use crate::config::EnvoyConfig;
use crate::envoy::EnvoyProcess;
use crate::etcd::{
    etcd_proxy_config, render_shard_clusters, wait_cluster_hosts_healthy, EtcdCluster,
};
use crate::paths::{config_file, dedup_wasm, workspace_root};
use crate::regions::Regions;
use crate::upstream::DemoUpstream;
use crate::{fail, Result};
use dedup_core::config::DEFAULT_ETCD_PREFIX;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `in_flight_timeout_seconds` of the soak: above the 2 s route timeout of
/// its listener, short enough that claims held under `BROKEN=hold` expire
/// within a short run (and the checker sees their keys run again).
pub const IN_FLIGHT_TIMEOUT: Duration = Duration::from_secs(5);
/// `ttl_seconds`: longer than any run, so a completed record never expires in it.
pub const TTL: Duration = Duration::from_secs(3600);
/// `ordering.ttl_seconds` of the ordered rule: longer than any run, so an applied
/// version never expires in it.
pub const ORDERING_TTL: Duration = Duration::from_secs(3600);
/// `store.timeout_ms` (pushes alternate it with 2500): above etcd's failover
/// (about 1 s with the harness's election timeout).
pub const STORE_TIMEOUT_MS: u64 = 2000;

/// The most etcd shards the soak starts (each a 3-member cluster).
pub const MAX_SHARDS: usize = 4;
const SHARD_NAMES: [&str; MAX_SHARDS] = ["a", "b", "c", "d"];

/// The etcd store's shards: their names in `store.shards` and their Envoy clusters.
/// One shard is today's unsharded store: `store.cluster` "etcd".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards(usize);

impl Shards {
    /// One etcd cluster, unsharded.
    pub const ONE: Shards = Shards(1);

    /// `n` shards, 1 to [`MAX_SHARDS`].
    pub fn new(n: usize) -> Option<Shards> {
        (1..=MAX_SHARDS).contains(&n).then_some(Shards(n))
    }

    pub fn count(self) -> usize {
        self.0
    }

    /// Shard `i`'s name: "a", "b", …
    pub fn name(self, i: usize) -> &'static str {
        SHARD_NAMES[i.min(MAX_SHARDS - 1)]
    }

    /// The Envoy cluster of shard `i`: `etcd` unsharded, else `etcd_<name>`.
    pub fn cluster(self, i: usize) -> String {
        if self.0 == 1 {
            "etcd".into()
        } else {
            format!("etcd_{}", self.name(i))
        }
    }

    /// The `store` fields naming the etcd clusters.
    fn store(self) -> Value {
        if self.0 == 1 {
            json!({"cluster": "etcd"})
        } else {
            let shards: Vec<Value> = (0..self.0)
                .map(|i| json!({"name": self.name(i), "cluster": self.cluster(i)}))
                .collect();
            json!({ "shards": shards })
        }
    }
}

/// A deliberately broken configuration, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// `on_unknown_outcome: "release"`: a client that hangs up releases its
    /// claim while the upstream may still run it.
    ReleaseOnUnknown,
    /// `on_unknown_outcome: "hold"`: an unknown outcome (or a claim never settled) is
    /// held only until the in-flight timeout, then its key runs again.
    HoldOnUnknown,
    /// No `scope.headers`: tenants share records.
    NoTenantScope,
    /// The ordered rule's guard off (`"ordering": {"enabled": false}`): stale versions
    /// reach the upstream, and versions of one entity run at once.
    NoOrdering,
    /// Regions variant only: no home rule, each region's proxy on its own region's
    /// etcd alone (option (c) of the regions page): a retry in the other region runs
    /// again.
    PerRegion,
}

impl Broken {
    pub fn parse(s: &str) -> Option<Broken> {
        match s {
            "release" | "release-on-unknown" => Some(Broken::ReleaseOnUnknown),
            "hold" | "hold-on-unknown" => Some(Broken::HoldOnUnknown),
            "no-scope" | "no-tenant-scope" => Some(Broken::NoTenantScope),
            "no-ordering" => Some(Broken::NoOrdering),
            "per-region" | "no-home" => Some(Broken::PerRegion),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Broken::ReleaseOnUnknown => "release (on_unknown_outcome: \"release\")",
            Broken::HoldOnUnknown => "hold (on_unknown_outcome: \"hold\")",
            Broken::NoTenantScope => "no-scope (no scope.headers)",
            Broken::NoOrdering => "no-ordering (the ordered rule's guard off)",
            Broken::PerRegion => "per-region (no home rule: each region on its own etcd)",
        }
    }

    /// The `make chaos` knob that selects it.
    pub fn knob(&self) -> &'static str {
        match self {
            Broken::ReleaseOnUnknown => "BROKEN=release",
            Broken::HoldOnUnknown => "BROKEN=hold",
            Broken::NoTenantScope => "BROKEN=no-scope",
            Broken::NoOrdering => "BROKEN=no-ordering",
            Broken::PerRegion => "BROKEN=per-region",
        }
    }
}

/// The filter configuration of a proxy on `domain`; `variant` picks the
/// values of the fields a push changes (none of them part of a record's identity).
/// With `defaults`, every field that decides what runs and when is left at its
/// default (`failure_mode`, `ttl_seconds`, `in_flight_timeout_seconds`,
/// `on_unknown_outcome`, `store.timeout_ms`, `ordering.ttl_seconds`, `capacity`,
/// `principal`...): only the workload's key, tenant scope and rules are set, and a
/// push changes nothing but the configuration's version.
pub fn filter_config(
    domain: Domain,
    broken: Option<Broken>,
    variant: u32,
    shards: Shards,
    defaults: bool,
) -> String {
    filter_value(domain, broken, variant, shards, defaults).to_string()
}

/// `filter_config` as JSON, for a variant to build on (`super::regions`).
pub fn filter_value(
    domain: Domain,
    broken: Option<Broken>,
    variant: u32,
    shards: Shards,
    defaults: bool,
) -> Value {
    if defaults {
        return defaults_config(domain, shards);
    }
    let odd = variant % 2 == 1;
    let mut cfg = json!({
        "key": {"required": true},
        "scope": {"headers": [TENANT_HEADER]},
        "failure_mode": "closed",
        "in_flight_timeout_seconds": IN_FLIGHT_TIMEOUT.as_secs(),
        "ttl_seconds": TTL.as_secs(),
        "retry_after_seconds": if odd { 2 } else { 1 },
        // The third payload path's first executions are sent by the filter itself.
        "rules": [{"name": "detached", "match": {"path_prefix": DETACHED_PREFIX},
                   "upstream": {"detached": true, "cluster": "service", "timeout_ms": 4000}},
                  // Ordered deliveries: entity and version in headers; stale ones are
                  // refused on etcd and acknowledged on shared data.
                  {"name": "ordered", "match": {"path_prefix": ORDERED_PREFIX},
                   "ordering": {"entity": {"header": ENTITY_HEADER},
                                "version": {"header": VERSION_HEADER},
                                "ttl_seconds": ORDERING_TTL.as_secs(),
                                "on_stale": match domain {
                                    Domain::Etcd => "reject",
                                    Domain::SharedData => "acknowledge",
                                }}}],
    });
    match domain {
        Domain::Etcd => {
            let mut store = shards.store();
            store["kind"] = json!("etcd");
            store["timeout_ms"] = json!(if odd {
                STORE_TIMEOUT_MS + 500
            } else {
                STORE_TIMEOUT_MS
            });
            cfg["store"] = store;
        }
        Domain::SharedData => {
            // A new capacity lays out new buckets: the old layout must still answer.
            cfg["capacity"] = json!(if odd { 131_072 } else { 65_536 });
        }
    }
    match broken {
        Some(Broken::ReleaseOnUnknown) => cfg["on_unknown_outcome"] = json!("release"),
        Some(Broken::HoldOnUnknown) => cfg["on_unknown_outcome"] = json!("hold"),
        Some(Broken::NoTenantScope) => cfg["scope"] = json!({"headers": Value::Array(Vec::new())}),
        Some(Broken::NoOrdering) => cfg["rules"][1]["ordering"] = json!({"enabled": false}),
        // The regions variant's: its store (`super::regions`).
        Some(Broken::PerRegion) | None => {}
    }
    cfg
}

/// The soak's workload on a configuration of defaults (see `filter_config`).
fn defaults_config(domain: Domain, shards: Shards) -> Value {
    let mut cfg = json!({
        "key": {"required": true},
        "scope": {"headers": [TENANT_HEADER]},
        "rules": [{"name": "detached", "match": {"path_prefix": DETACHED_PREFIX},
                   "upstream": {"detached": true, "cluster": "service", "timeout_ms": 4000}},
                  {"name": "ordered", "match": {"path_prefix": ORDERED_PREFIX},
                   "ordering": {"entity": {"header": ENTITY_HEADER},
                                "version": {"header": VERSION_HEADER},
                                "on_stale": match domain {
                                    Domain::Etcd => "reject",
                                    Domain::SharedData => "acknowledge",
                                }}}],
    });
    if domain == Domain::Etcd {
        let mut store = shards.store();
        store["kind"] = json!("etcd");
        cfg["store"] = store;
    }
    cfg
}

/// The TTLs the checker holds the soak to: the configured ones, or the defaults'.
pub fn ttls(defaults: bool) -> (Duration, Duration) {
    if defaults {
        (
            Duration::from_millis(dedup_core::config::DEFAULT_TTL_MS),
            Duration::from_secs(dedup_core::config::DEFAULT_ORDERING_TTL_SECONDS),
        )
    } else {
        (TTL, ORDERING_TTL)
    }
}

/// One proxy; its process can be replaced (restart) while clients run.
pub struct Proxy {
    pub name: &'static str,
    pub domain: Domain,
    /// The region it runs in (the regions variant), else `None`.
    pub region: Option<&'static str>,
    label: String,
    /// Listener port of the current process (clients read it per attempt).
    port: AtomicU16,
    envoy: Mutex<Option<EnvoyProcess>>,
    counters: Mutex<ProxyCounters>,
    /// Its filter configuration at variant 0 and 1: a push alternates them.
    configs: [String; 2],
    variant: Mutex<u32>,
    started_at: Mutex<Duration>,
}

/// A proxy to start: its Envoy configuration (filter configuration `configs[0]`)
/// and what it is.
pub struct ProxyPlan {
    pub name: &'static str,
    pub domain: Domain,
    pub region: Option<&'static str>,
    pub envoy: EnvoyConfig,
    pub configs: [String; 2],
}

impl Proxy {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port.load(Ordering::SeqCst)))
    }

    fn envoy(&self) -> MutexGuard<'_, Option<EnvoyProcess>> {
        self.envoy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counters(&self) -> MutexGuard<'_, ProxyCounters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, snapshot: &std::collections::BTreeMap<String, u64>) {
        let mut c = self.counters();
        for (k, v) in snapshot {
            *c.totals.entry(k.clone()).or_insert(0) += v;
        }
    }

    pub fn log_path(&self) -> Option<PathBuf> {
        self.envoy().as_ref().map(|e| e.log_path.clone())
    }
}

/// Start every planned proxy at once; each on the etcd store waits until it sees
/// every member of `store` healthy.
pub fn start_proxies(
    plans: Vec<ProxyPlan>,
    store: &[(String, usize)],
    epoch: Instant,
) -> Result<Vec<Proxy>> {
    let started: Vec<Result<EnvoyProcess>> = std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .iter()
            .map(|p| {
                let label = format!("chaos-proxy-{}", p.name);
                let c = p.envoy.clone();
                s.spawn(move || EnvoyProcess::start(&label, c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| fail_thread()))
            .collect()
    });
    let mut proxies = Vec::new();
    for (e, plan) in started.into_iter().zip(plans) {
        let e = e?;
        if plan.domain == Domain::Etcd {
            wait_store_healthy(&e, store, Duration::from_secs(15))?;
        }
        proxies.push(Proxy {
            name: plan.name,
            domain: plan.domain,
            region: plan.region,
            label: format!("chaos-proxy-{}", plan.name),
            port: AtomicU16::new(e.config.listen_port),
            envoy: Mutex::new(Some(e)),
            counters: Mutex::new(ProxyCounters::default()),
            configs: plan.configs,
            variant: Mutex::new(0),
            started_at: Mutex::new(epoch.elapsed()),
        });
    }
    Ok(proxies)
}

// Fields drop in order: proxies before the upstream and etcd they use.
pub struct Cluster {
    pub proxies: Vec<Proxy>,
    pub upstream: DemoUpstream,
    /// The etcd clusters, one per shard (index = shard); none in the regions variant.
    pub etcds: Vec<Mutex<EtcdCluster>>,
    /// The regions variant's regions (each its etcd) and the links between them.
    pub regions: Option<Mutex<Regions>>,
    pub epoch: Instant,
    pub shards: Shards,
    /// The Envoy clusters of the etcd store and their members: what a proxy on it
    /// waits to see healthy.
    store: Vec<(String, usize)>,
}

/// The soak's listener (by LDS; a 2 s route timeout).
pub fn listener_template() -> PathBuf {
    templates_dir().join("chaos-listener.yaml")
}

fn templates_dir() -> PathBuf {
    workspace_root()
        .join("envoy")
        .join("tests")
        .join("templates")
}

/// The chaos etcd template with its `etcd` cluster once per shard (the members'
/// relays), written next to the first shard's logs; unsharded, the template as it is.
fn etcd_template(shards: Shards, etcds: &[EtcdCluster], template: &Path) -> Result<PathBuf> {
    let (Some(first), true) = (etcds.first(), shards.count() > 1) else {
        return Ok(template.to_path_buf());
    };
    let text = std::fs::read_to_string(template)?;
    let names: Vec<String> = (0..etcds.len()).map(|i| shards.cluster(i)).collect();
    let named: Vec<(&str, Vec<u16>)> = names
        .iter()
        .zip(etcds)
        .map(|(name, e)| (name.as_str(), e.proxy_ports()))
        .collect();
    let path = first.dir.join("chaos-etcd-shards.yaml");
    std::fs::write(&path, render_shard_clusters(&text, &named)?)?;
    Ok(path)
}

/// Wait until `envoy` sees every member of every cluster of `store` healthy.
fn wait_store_healthy(
    envoy: &EnvoyProcess,
    store: &[(String, usize)],
    limit: Duration,
) -> Result<()> {
    for (cluster, members) in store {
        wait_cluster_hosts_healthy(envoy, cluster, *members, limit)?;
    }
    Ok(())
}

impl Cluster {
    pub fn start(
        broken: Option<Broken>,
        shards: Shards,
        defaults: bool,
        epoch: Instant,
    ) -> Result<Cluster> {
        let wasm = dedup_wasm()?;
        let etcds = (0..shards.count())
            .map(|i| match shards.count() {
                1 => EtcdCluster::start_relayed("chaos-etcd", 3),
                _ => EtcdCluster::start_relayed(&format!("chaos-etcd-{}", shards.name(i)), 3),
            })
            .collect::<Result<Vec<_>>>()?;
        let upstream = DemoUpstream::start_recording()?;
        let etcd_template =
            etcd_template(shards, &etcds, &templates_dir().join("chaos-etcd.yaml"))?;
        let mut plans = Vec::new();
        for (name, domain) in [
            ("A", Domain::Etcd),
            ("B", Domain::Etcd),
            ("C", Domain::SharedData),
        ] {
            let configs = [0, 1].map(|v| filter_config(domain, broken, v, shards, defaults));
            let fc = &configs[0];
            let mut c = match domain {
                // Unsharded: the template's `# etcd member N` lines get the members'
                // relays; sharded, `etcd_template` has written each shard's already.
                Domain::Etcd if shards.count() == 1 => {
                    etcd_proxy_config(&etcds[0], &etcd_template, upstream.port(), &wasm, fc)?
                }
                Domain::Etcd => {
                    let mut c = EnvoyConfig::single_node(upstream.port(), &wasm, fc)?;
                    c.template = etcd_template.clone();
                    c
                }
                Domain::SharedData => EnvoyConfig::from_template(
                    &config_file(crate::config::SINGLE_NODE_LDS),
                    upstream.port(),
                    &wasm,
                    fc,
                )?,
            };
            c.lds_template = Some(listener_template());
            plans.push(ProxyPlan {
                name,
                domain,
                region: None,
                envoy: c,
                configs,
            });
        }
        let store: Vec<(String, usize)> = (0..shards.count())
            .map(|i| (shards.cluster(i), 3))
            .collect();
        let proxies = start_proxies(plans, &store, epoch)?;
        Ok(Cluster::new(
            proxies, upstream, etcds, None, epoch, shards, store,
        ))
    }

    /// The cluster of processes started: `etcds` (one per shard) or `regions`, and
    /// `store`, the etcd store's Envoy clusters with their member counts.
    pub fn new(
        proxies: Vec<Proxy>,
        upstream: DemoUpstream,
        etcds: Vec<EtcdCluster>,
        regions: Option<Regions>,
        epoch: Instant,
        shards: Shards,
        store: Vec<(String, usize)>,
    ) -> Cluster {
        Cluster {
            proxies,
            upstream,
            etcds: etcds.into_iter().map(Mutex::new).collect(),
            regions: regions.map(Mutex::new),
            epoch,
            shards,
            store,
        }
    }

    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Shard `shard`'s etcd cluster (the first for an index past the last).
    pub fn etcd(&self, shard: usize) -> MutexGuard<'_, EtcdCluster> {
        let i = shard.min(self.etcds.len().saturating_sub(1));
        self.etcds[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys under the filter's prefix in each shard's etcd (records and ordering
    /// entities), by shard name (by region in the regions variant); `None` for a shard
    /// that did not answer.
    pub fn keys_per_shard(&self) -> Vec<(String, Option<u64>)> {
        if let Some(regions) = &self.regions {
            let regions = regions.lock().unwrap_or_else(|e| e.into_inner());
            return regions
                .regions
                .iter()
                .map(|r| (r.name.clone(), r.etcd.count_keys(DEFAULT_ETCD_PREFIX).ok()))
                .collect();
        }
        (0..self.shards.count())
            .map(|i| {
                (
                    self.shards.name(i).to_string(),
                    self.etcd(i).count_keys(DEFAULT_ETCD_PREFIX).ok(),
                )
            })
            .collect()
    }

    /// Proxy `i` and its process slot, locked.
    fn proxy_slot(&self, i: usize) -> Result<(&Proxy, MutexGuard<'_, Option<EnvoyProcess>>)> {
        match self.proxies.get(i) {
            Some(p) => Ok((p, p.envoy())),
            None => fail!("no proxy {i}"),
        }
    }

    /// kill -9 proxy `i` and start it again on the same config (its pushed
    /// filter configuration included). Its counters are read first; what it
    /// counts between that read and the kill is lost (recorded as a window).
    /// Returns how long it was down.
    pub fn restart_proxy(&self, i: usize) -> Result<Duration> {
        let (p, mut slot) = self.proxy_slot(i)?;
        let Some(old) = slot.take() else {
            fail!("proxy {} is not running", p.name);
        };
        let from = match old.dedup_counters() {
            Ok(c) => {
                let at = self.now();
                p.add(&c);
                at
            }
            Err(_) => *p.started_at.lock().unwrap_or_else(|e| e.into_inner()),
        };
        if let Ok(pid) = i32::try_from(old.pid()) {
            if pid > 0 {
                // SAFETY: kill(2) on our own child, reaped only by its guard below.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let killed = self.now();
        p.counters().lost.push((from, killed));
        let config = old.config.clone();
        drop(old);
        let envoy = EnvoyProcess::start(&p.label, config)?;
        if p.domain == Domain::Etcd {
            // Serving already; health checks settle in about one interval (a region
            // cut off stays unhealthy: the wait gives up, the proxy serves on).
            let _ = wait_store_healthy(&envoy, &self.store, Duration::from_secs(5));
        }
        p.port.store(envoy.config.listen_port, Ordering::SeqCst);
        *p.started_at.lock().unwrap_or_else(|e| e.into_inner()) = self.now();
        *slot = Some(envoy);
        Ok(self.now().saturating_sub(killed))
    }

    /// Push proxy `i`'s listener again (LDS from a file) with the other
    /// variant of its filter configuration; waits until Envoy took it.
    /// Returns the field values pushed.
    pub fn push_config(&self, i: usize) -> Result<String> {
        let (p, mut slot) = self.proxy_slot(i)?;
        let Some(envoy) = slot.as_mut() else {
            fail!("proxy {} is not running", p.name);
        };
        let variant = {
            let mut v = p.variant.lock().unwrap_or_else(|e| e.into_inner());
            *v += 1;
            *v
        };
        let cfg = p.configs[(variant % 2) as usize].clone();
        let stat = "listener_manager.lds.update_success";
        let before = envoy.stat(stat)?;
        envoy.push_filter_config(&cfg)?;
        envoy.wait_stat_at_least(stat, before + 1, Duration::from_secs(15))?;
        let rejected = envoy
            .stat("listener_manager.lds.update_rejected")
            .unwrap_or(0);
        if rejected > 0 {
            fail!(
                "proxy {}: the pushed configuration was rejected: {cfg}",
                p.name
            );
        }
        let v: Value = serde_json::from_str(&cfg)?;
        Ok(match p.domain {
            Domain::Etcd => format!(
                "retry_after_seconds {}, store.timeout_ms {}",
                v["retry_after_seconds"], v["store"]["timeout_ms"]
            ),
            Domain::SharedData => format!(
                "retry_after_seconds {}, capacity {}",
                v["retry_after_seconds"], v["capacity"]
            ),
        })
    }

    /// Add every running proxy's counters to its totals (at the end).
    pub fn final_counters(&self) -> Result<Vec<ProxyCounters>> {
        let mut out = Vec::new();
        for p in &self.proxies {
            let slot = p.envoy();
            let Some(envoy) = slot.as_ref() else {
                fail!("proxy {} is not running at the end", p.name);
            };
            p.add(&envoy.dedup_counters()?);
            out.push(p.counters().clone());
        }
        Ok(out)
    }

    /// The Envoy logs (for a failed run's post-mortem).
    pub fn log_paths(&self) -> Vec<String> {
        self.proxies
            .iter()
            .filter_map(|p| p.log_path().map(|l| format!("{}: {}", p.name, l.display())))
            .collect()
    }
}

fn fail_thread() -> Result<EnvoyProcess> {
    fail!("a thread starting Envoy panicked")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_configuration_of_the_soak_is_one_the_filter_takes() {
        for n in 1..=MAX_SHARDS {
            let shards = Shards::new(n).unwrap();
            for broken in [
                None,
                Some(Broken::ReleaseOnUnknown),
                Some(Broken::HoldOnUnknown),
                Some(Broken::NoTenantScope),
                Some(Broken::NoOrdering),
            ] {
                for variant in 0..2 {
                    for domain in [Domain::Etcd, Domain::SharedData] {
                        for defaults in [false, true] {
                            let cfg = filter_config(domain, broken, variant, shards, defaults);
                            if let Err(e) = dedup_core::Config::parse(cfg.as_bytes()) {
                                panic!("{cfg}: {e}");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(Shards::new(0), None);
        assert_eq!(Shards::new(MAX_SHARDS + 1), None);
    }

    #[test]
    fn unsharded_is_the_one_cluster_and_sharded_names_a_cluster_per_shard() {
        let store = |n| {
            let cfg = filter_config(Domain::Etcd, None, 0, Shards::new(n).unwrap(), false);
            serde_json::from_str::<Value>(&cfg).unwrap()["store"].clone()
        };
        assert_eq!(store(1)["cluster"], "etcd");
        assert!(store(1).get("shards").is_none());
        assert_eq!(
            store(2)["shards"],
            json!([{"name": "a", "cluster": "etcd_a"}, {"name": "b", "cluster": "etcd_b"}])
        );
        assert!(store(2).get("cluster").is_none());
        assert_eq!(Shards::new(2).unwrap().cluster(1), "etcd_b");
    }
}
