//! A real Envoy process on loopback: start from a rendered config, wait for
//! `/ready`, talk to its listener and admin, stop (kill) on drop.

use crate::client::{self, Request, Response};
use crate::config::{EnvoyConfig, WORKERS};
use crate::paths::scratch_dir;
use crate::process::{log_tail, spawn, ChildGuard};
use crate::{fail, Result};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long Envoy may take to become ready (V8 compiles the module per worker).
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The Envoy binary every harness start uses: `ENVOY_BIN` (how `make
/// test-compat` runs the suites on an older Envoy), else `envoy` on PATH.
pub fn envoy_binary() -> String {
    std::env::var("ENVOY_BIN").unwrap_or_else(|_| "envoy".into())
}

/// The release of [`envoy_binary`], e.g. `1.40.0`, from `envoy --version`
/// (`…  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`).
pub fn version() -> Result<String> {
    let bin = envoy_binary();
    let out = match Command::new(&bin).arg("--version").output() {
        Ok(out) => out,
        Err(e) => fail!("cannot run {bin} --version: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match parse_version(&text) {
        Some(v) => Ok(v),
        None => fail!("no version in `{bin} --version`: {text:?}"),
    }
}

/// `1.40.0` from a version line (`envoy --version`, or /server_info's
/// `version` field: `<sha>/1.40.0/Clean/RELEASE/BoringSSL`).
pub fn parse_version(text: &str) -> Option<String> {
    let rest = match text.split_once("version: ") {
        Some((_, rest)) => rest,
        None => text,
    };
    let v = rest.trim().split('/').nth(1)?;
    let parts: Vec<&str> = v.split('.').collect();
    let numeric = parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok());
    numeric.then(|| v.to_string())
}

/// `envoy -c config` with `workers` worker threads, pinned to `cpus`
/// (`taskset -c`, which execs Envoy: the child is Envoy itself) when given.
fn envoy_command(
    config: &Path,
    log: &Path,
    workers: u32,
    cpus: Option<&str>,
    extra: &[&str],
) -> Command {
    let mut cmd = match cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg(envoy_binary());
            c
        }
        None => Command::new(envoy_binary()),
    };
    cmd.arg("-c")
        .arg(config)
        .arg("--concurrency")
        .arg(workers.to_string())
        // No hot restart: no shared-memory segment, so parallel Envoys never
        // clash on a base id.
        .arg("--disable-hot-restart")
        .arg("--log-path")
        .arg(log)
        .arg("--log-level")
        .arg("info")
        // Access logs reach their file within half a second (Envoy's default: 10 s).
        .arg("--file-flush-interval-msec")
        .arg("500")
        .args(extra)
        .stdin(Stdio::null())
        // Its own process group: a Ctrl-C in the terminal reaches the demo,
        // which then stops Envoy in order.
        .process_group(0);
    cmd
}

pub struct EnvoyProcess {
    // Declared first: dropped (killed) first.
    child: ChildGuard,
    pub config: EnvoyConfig,
    pub dir: PathBuf,
    pub log_path: PathBuf,
}

/// A scratch directory for `name` with `config` rendered into it, the path
/// of Envoy's log there, and the command that runs Envoy on it.
fn prepare(name: &str, config: &EnvoyConfig) -> Result<(PathBuf, PathBuf, Command)> {
    let dir = scratch_dir(name)?;
    let cfg_path = dir.join("envoy.yaml");
    std::fs::write(&cfg_path, config.render_in(&dir)?)?;
    let log_path = dir.join("envoy.log");
    let cmd = envoy_command(
        &cfg_path,
        &log_path,
        config.workers,
        config.cpus.as_deref(),
        &[],
    );
    Ok((dir, log_path, cmd))
}

impl EnvoyProcess {
    /// Render `config`, start Envoy and wait until `/ready` says LIVE.
    /// Retries with new ports if a port was taken in the meantime.
    pub fn start(name: &str, mut config: EnvoyConfig) -> Result<EnvoyProcess> {
        let mut last = String::new();
        for _attempt in 0..3 {
            let (dir, log_path, mut cmd) = prepare(name, &config)?;
            cmd.stdout(Stdio::from(std::fs::File::create(dir.join("stdout.log"))?));
            cmd.stderr(Stdio::from(std::fs::File::create(dir.join("stderr.log"))?));
            let child = spawn(cmd)?;
            let mut envoy = EnvoyProcess {
                child,
                config: config.clone(),
                dir,
                log_path,
            };
            match envoy.wait_ready() {
                Ok(()) => return Ok(envoy),
                Err(e) => {
                    let log = envoy.log();
                    envoy.child.stop();
                    if log.contains("Address already in use") || log.contains("cannot bind") {
                        last = e.0;
                        config.reassign_ports()?;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        fail!("Envoy could not bind its ports: {last}")
    }

    /// Start Envoy with a config it must refuse. Returns its exit code and log.
    pub fn start_expect_failure(name: &str, config: &EnvoyConfig) -> Result<(i32, String)> {
        let (_dir, log_path, mut cmd) = prepare(name, config)?;
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = spawn(cmd)?;
        match child.wait_exit(READY_TIMEOUT) {
            Some(code) => Ok((code, std::fs::read_to_string(&log_path).unwrap_or_default())),
            None => fail!(
                "Envoy accepted a config it should refuse (still running after {READY_TIMEOUT:?}); log:\n{}",
                log_tail(&log_path, 20)
            ),
        }
    }

    /// `envoy --mode validate`: parses the config and builds every listener,
    /// filter (loading the Wasm module and running on_configure) and cluster
    /// without serving. Returns the log on failure (in validate mode Envoy logs
    /// to standard error, not to `--log-path`).
    pub fn validate(name: &str, yaml: &str) -> Result<()> {
        let dir = scratch_dir(name)?;
        let cfg_path = dir.join("envoy.yaml");
        std::fs::write(&cfg_path, yaml)?;
        let log_path = dir.join("envoy.log");
        let stderr_path = dir.join("stderr.log");
        let mut cmd = envoy_command(&cfg_path, &log_path, WORKERS, None, &["--mode", "validate"]);
        cmd.stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&stderr_path)?));
        let mut child = spawn(cmd)?;
        match child.wait_exit(READY_TIMEOUT) {
            Some(0) => Ok(()),
            Some(code) => fail!(
                "envoy --mode validate {} exited {code}:\n{}{}",
                cfg_path.display(),
                log_tail(&log_path, 15),
                log_tail(&stderr_path, 15)
            ),
            None => fail!("envoy --mode validate did not finish"),
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let end = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(code) = self.child.try_exit() {
                fail!(
                    "Envoy exited with {code} before it was ready; log {}:\n{}",
                    self.log_path.display(),
                    log_tail(&self.log_path, 20)
                );
            }
            let req = Request::get("/ready").timeout(Duration::from_secs(2));
            if let Ok(r) = client::send(self.admin_addr(), &req) {
                if r.status == 200 && r.text().trim() == "LIVE" {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                fail!(
                    "Envoy not ready after {READY_TIMEOUT:?}; log {}:\n{}",
                    self.log_path.display(),
                    log_tail(&self.log_path, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.config.listen_port))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.config.admin_port))
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr())
    }

    /// One request to the listener on a fresh connection.
    pub fn send(&self, req: &Request) -> Result<Response> {
        client::send(self.addr(), req)
    }

    /// One request to the admin interface.
    pub fn admin(&self, path: &str) -> Result<Response> {
        let r = client::send(self.admin_addr(), &Request::get(path))?;
        if r.status != 200 {
            fail!("admin {path} answered {}: {}", r.status, r.text());
        }
        Ok(r)
    }

    /// `/stats?filter=REGEX` as name -> value (counters and gauges).
    pub fn stats(&self, filter: &str) -> Result<BTreeMap<String, u64>> {
        let r = self.admin(&format!("/stats?filter={}", url_escape(filter)))?;
        Ok(parse_stats(&r.text()))
    }

    /// One counter or gauge by its exact name; missing is an error.
    pub fn stat(&self, name: &str) -> Result<u64> {
        let all = self.stats(&format!("^{}$", regex_escape(name)))?;
        match all.get(name) {
            Some(v) => Ok(*v),
            None => fail!("stat {name} not in /stats (have: {:?})", all.keys()),
        }
    }

    /// A filter counter: `dedup_counter("executed")` reads `wasmcustom.proxy_dedup_executed`.
    pub fn dedup_counter(&self, short: &str) -> Result<u64> {
        self.stat(&format!("wasmcustom.proxy_dedup_{short}"))
    }

    /// All filter counters, short names.
    pub fn dedup_counters(&self) -> Result<BTreeMap<String, u64>> {
        Ok(self
            .stats("wasmcustom\\.proxy_dedup_")?
            .into_iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("wasmcustom.proxy_dedup_")
                    .map(|s| (s.to_string(), v))
            })
            .collect())
    }

    /// `/stats/prometheus`.
    pub fn prometheus(&self) -> Result<String> {
        Ok(self.admin("/stats/prometheus")?.text())
    }

    /// Downstream connections each worker accepted on the listener.
    pub fn connections_per_worker(&self) -> Result<Vec<u64>> {
        let stats = self.stats("^listener\\.127\\.0\\.0\\.1_.*worker_.*downstream_cx_total$")?;
        Ok(stats.values().copied().collect())
    }

    /// Wait until stat `name` is at least `min`; returns its value.
    pub fn wait_stat_at_least(&self, name: &str, min: u64, limit: Duration) -> Result<u64> {
        let end = Instant::now() + limit;
        loop {
            let v = self
                .stats(&format!("^{}$", regex_escape(name)))?
                .get(name)
                .copied();
            if let Some(v) = v.filter(|v| *v >= min) {
                return Ok(v);
            }
            if Instant::now() >= end {
                fail!("stat {name} is {v:?} after {limit:?}, waited for >= {min}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// With an LDS listener file (`EnvoyConfig::single_node_lds`): rewrite it
    /// with another filter configuration (atomically, by rename). Envoy picks
    /// it up on its own; wait for `listener_manager.lds.update_success`.
    pub fn push_filter_config(&mut self, filter_config: &str) -> Result<()> {
        self.config.filter_config = filter_config.to_string();
        self.config.write_lds(&self.dir)
    }

    /// `push_filter_config`, then wait (up to `limit`) until Envoy serves it: the update
    /// counted in `listener_manager.lds.update_success`, none rejected, and the
    /// `ingress` listener active with `filter_config` and nothing warming (new
    /// connections get the new filter configuration from then on).
    pub fn apply_filter_config(&mut self, filter_config: &str, limit: Duration) -> Result<()> {
        const SUCCESS: &str = "listener_manager.lds.update_success";
        const REJECTED: &str = "listener_manager.lds.update_rejected";
        let before = self.stat(SUCCESS)?;
        let rejected = self.stat(REJECTED).unwrap_or(0);
        self.push_filter_config(filter_config)?;
        self.wait_stat_at_least(SUCCESS, before + 1, limit)?;
        if self.stat(REJECTED).unwrap_or(0) > rejected {
            fail!(
                "Envoy rejected the pushed filter configuration {filter_config} (log {})",
                self.log_path.display()
            );
        }
        // The configuration as it appears inside the dump's JSON text.
        let quoted = serde_json::to_string(filter_config)?;
        let inner = &quoted[1..quoted.len() - 1];
        let end = Instant::now() + limit;
        loop {
            let dump = self
                .admin("/config_dump?resource=dynamic_listeners")?
                .json()?;
            let ingress = dump["configs"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|l| l["name"] == "ingress");
            if let Some(l) = ingress {
                if l["warming_state"].is_null() && l["active_state"].to_string().contains(inner) {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                fail!("the pushed filter configuration is not active after {limit:?}: {filter_config}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop Envoy now (also done on drop).
    pub fn stop(&mut self) {
        self.child.stop();
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        self.child.stop();
        // Keep the config and log of a failed test; drop the rest.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            Some((k.trim().to_string(), v.trim().parse::<u64>().ok()?))
        })
        .collect()
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if ".^$*+?()[]{}|\\".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_are_read_from_both_spellings() {
        let cli = "\n/usr/bin/envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL\n\n";
        assert_eq!(parse_version(cli).as_deref(), Some("1.40.0"));
        let server_info = "bad8280de85c25b147a90c1d9b8a8c67a13e7134/1.36.4/Clean/RELEASE/BoringSSL";
        assert_eq!(parse_version(server_info).as_deref(), Some("1.36.4"));
        // The old bench parse took the first '/' of the binary's path.
        assert_eq!(parse_version("/Real Envoy root/envoy version: x"), None);
    }
}
