//! The soak's processes: a 3-member etcd behind relays, the recording demo
//! upstream, proxies A and B (2 workers each, etcd store) and proxy C (2
//! workers, shared data), every listener served by LDS from a file so its
//! filter configuration can be pushed. Built on the harness's launchers.

use super::checker::ProxyCounters;
use super::history::{
    Domain, DETACHED_PREFIX, ENTITY_HEADER, ORDERED_PREFIX, TENANT_HEADER, VERSION_HEADER,
};
use crate::config::EnvoyConfig;
use crate::envoy::EnvoyProcess;
use crate::etcd::{etcd_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use crate::paths::{config_file, dedup_wasm, workspace_root};
use crate::upstream::DemoUpstream;
use crate::{fail, Result};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
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
}

impl Broken {
    pub fn parse(s: &str) -> Option<Broken> {
        match s {
            "release" | "release-on-unknown" => Some(Broken::ReleaseOnUnknown),
            "hold" | "hold-on-unknown" => Some(Broken::HoldOnUnknown),
            "no-scope" | "no-tenant-scope" => Some(Broken::NoTenantScope),
            "no-ordering" => Some(Broken::NoOrdering),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Broken::ReleaseOnUnknown => "release (on_unknown_outcome: \"release\")",
            Broken::HoldOnUnknown => "hold (on_unknown_outcome: \"hold\")",
            Broken::NoTenantScope => "no-scope (no scope.headers)",
            Broken::NoOrdering => "no-ordering (the ordered rule's guard off)",
        }
    }
}

/// The filter configuration of a proxy on `domain`; `variant` picks the
/// values of the fields a push changes (none of them part of a record's identity).
pub fn filter_config(domain: Domain, broken: Option<Broken>, variant: u32) -> String {
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
            cfg["store"] = json!({
                "kind": "etcd",
                "cluster": "etcd",
                "timeout_ms": if odd { STORE_TIMEOUT_MS + 500 } else { STORE_TIMEOUT_MS },
            });
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
        None => {}
    }
    cfg.to_string()
}

/// One proxy; its process can be replaced (restart) while clients run.
pub struct Proxy {
    pub name: &'static str,
    pub domain: Domain,
    label: String,
    /// Listener port of the current process (clients read it per attempt).
    port: AtomicU16,
    envoy: Mutex<Option<EnvoyProcess>>,
    counters: Mutex<ProxyCounters>,
    variant: Mutex<u32>,
    started_at: Mutex<Duration>,
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

// Fields drop in order: proxies before the upstream and etcd they use.
pub struct Cluster {
    pub proxies: Vec<Proxy>,
    pub upstream: DemoUpstream,
    pub etcd: Mutex<EtcdCluster>,
    pub epoch: Instant,
    broken: Option<Broken>,
}

impl Cluster {
    pub fn start(broken: Option<Broken>, epoch: Instant) -> Result<Cluster> {
        let wasm = dedup_wasm()?;
        let etcd = EtcdCluster::start_relayed("chaos-etcd", 3)?;
        let upstream = DemoUpstream::start_recording()?;
        let templates = workspace_root()
            .join("envoy")
            .join("tests")
            .join("templates");
        let listener = templates.join("chaos-listener.yaml");
        let mut configs = Vec::new();
        for domain in [Domain::Etcd, Domain::Etcd, Domain::SharedData] {
            let fc = filter_config(domain, broken, 0);
            let mut c = match domain {
                Domain::Etcd => etcd_proxy_config(
                    &etcd,
                    &templates.join("chaos-etcd.yaml"),
                    upstream.port(),
                    &wasm,
                    &fc,
                )?,
                Domain::SharedData => EnvoyConfig::from_template(
                    &config_file(crate::config::SINGLE_NODE_LDS),
                    upstream.port(),
                    &wasm,
                    &fc,
                )?,
            };
            c.lds_template = Some(listener.clone());
            configs.push((domain, c));
        }
        let names = ["A", "B", "C"];
        let started: Vec<Result<EnvoyProcess>> = std::thread::scope(|s| {
            let handles: Vec<_> = configs
                .iter()
                .enumerate()
                .map(|(i, (_, c))| {
                    let label = format!("chaos-proxy-{}", names[i]);
                    let c = c.clone();
                    s.spawn(move || EnvoyProcess::start(&label, c))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| fail_thread()))
                .collect()
        });
        let mut proxies = Vec::new();
        for (i, (e, (domain, _))) in started.into_iter().zip(configs).enumerate() {
            let e = e?;
            if domain == Domain::Etcd {
                wait_etcd_hosts_healthy(&e, 3, Duration::from_secs(15))?;
            }
            proxies.push(Proxy {
                name: names[i],
                domain,
                label: format!("chaos-proxy-{}", names[i]),
                port: AtomicU16::new(e.config.listen_port),
                envoy: Mutex::new(Some(e)),
                counters: Mutex::new(ProxyCounters::default()),
                variant: Mutex::new(0),
                started_at: Mutex::new(epoch.elapsed()),
            });
        }
        Ok(Cluster {
            proxies,
            upstream,
            etcd: Mutex::new(etcd),
            epoch,
            broken,
        })
    }

    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub fn etcd(&self) -> MutexGuard<'_, EtcdCluster> {
        self.etcd.lock().unwrap_or_else(|e| e.into_inner())
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
            // Serving already; health checks settle in about one interval.
            let _ = wait_etcd_hosts_healthy(&envoy, 3, Duration::from_secs(5));
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
        let cfg = filter_config(p.domain, self.broken, variant);
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
