//! A real etcd cluster on loopback for the multi-proxy tests: members started
//! from the `etcd` binary (3.4, Debian `etcd-server`), killed or frozen on
//! demand, stopped on drop; read through etcd's v3 JSON gateway.
//!
//! Members listen on free 127.0.0.1 ports (optionally behind `Relay`s that
//! can cut a member off: `start_relayed`), keep their data in a fresh
//! temporary directory (removed on drop: etcd preallocates ~120 MB of WAL per
//! member) and log to `target/envoy-runs/<name>-…/<member>.log`. Raft timing
//! is shortened (`--heartbeat-interval 50 --election-timeout 500`) so a
//! cluster forms in about a second and a lost leader is replaced quickly.

use crate::client::{self, Request};
use crate::config::EnvoyConfig;
use crate::envoy::EnvoyProcess;
use crate::paths::{config_file, scratch_dir};
use crate::ports::free_port;
use crate::process::{log_tail, spawn, ChildGuard};
use crate::relay::Relay;
use crate::{fail, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The multi-proxy template: listener -> dedup filter (etcd store) -> router,
/// plus the `etcd` cluster.
pub const MULTI_PROXY_ETCD: &str = "multi-proxy-etcd.yaml";
/// How long a new cluster may take to elect a leader and answer `/health`.
pub const HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one harness call to the JSON gateway.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Marker at the end of each etcd endpoint line of the template.
const MEMBER_MARKER: &str = "# etcd member ";

fn etcd_binary() -> String {
    std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Running,
    /// SIGSTOP: the process holds its sockets but answers nothing.
    Paused,
    /// SIGKILL: gone; its ports refuse connections.
    Killed,
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub log_path: PathBuf,
    pub state: MemberState,
    child: ChildGuard,
    /// The command line, to restart the member on its data after a kill.
    args: Vec<OsString>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    /// With `start_relayed`: what proxies (client) and the other members
    /// (peer) connect to instead of the member's own ports.
    client_relay: Option<Relay>,
    peer_relay: Option<Relay>,
}

impl Member {
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    pub fn client_url(&self) -> String {
        format!("http://{}", self.client_addr())
    }

    fn signal(&self, sig: libc::c_int) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            if pid > 0 {
                // SAFETY: kill(2) on our own child; it is reaped only by its
                // ChildGuard, so the pid cannot have been reused.
                unsafe {
                    libc::kill(pid, sig);
                }
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The port proxies should use: the client relay's, else the member's own.
    pub fn proxy_port(&self) -> u16 {
        self.client_relay
            .as_ref()
            .map(Relay::port)
            .unwrap_or(self.client_port)
    }

    /// Cut off from proxies and peers by its relays.
    pub fn is_cut(&self) -> bool {
        self.client_relay.as_ref().is_some_and(Relay::is_cut)
    }

    fn spawn(&mut self) -> Result<()> {
        self.child = spawn_etcd(&self.args, &self.stdout_path, &self.stderr_path)?;
        Ok(())
    }
}

/// One etcd process with `args`, its output appended to the two files.
fn spawn_etcd(args: &[OsString], stdout: &Path, stderr: &Path) -> Result<ChildGuard> {
    let append = |path: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    };
    let mut cmd = Command::new(etcd_binary());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(append(stdout)?))
        .stderr(Stdio::from(append(stderr)?));
    spawn(cmd)
}

/// A running etcd cluster; every member is SIGKILLed and its data removed on drop.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    /// Logs and the command lines (kept after a failed test for post-mortems).
    pub dir: PathBuf,
    data_dir: PathBuf,
}

impl EtcdCluster {
    /// Start `size` members forming one new cluster and wait until each
    /// answers `/health` with `{"health":"true"}`. Retries with new ports if
    /// one was taken in the meantime.
    pub fn start(name: &str, size: usize) -> Result<EtcdCluster> {
        Self::start_inner(name, size, false)
    }

    /// Like `start`, with a `Relay` in front of each member's client port
    /// (what `proxy_ports` and `multi_proxy_config` give the proxies) and
    /// peer port (what the other members dial), so that `cut` can partition
    /// a member. The harness's own calls go to the members directly.
    pub fn start_relayed(name: &str, size: usize) -> Result<EtcdCluster> {
        Self::start_inner(name, size, true)
    }

    fn start_inner(name: &str, size: usize, relayed: bool) -> Result<EtcdCluster> {
        if size == 0 {
            fail!("an etcd cluster needs at least one member");
        }
        if Command::new(etcd_binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            fail!("etcd not found: run `make deps` (apt-get install etcd-server etcd-client)");
        }
        let mut last = String::new();
        for _attempt in 0..3 {
            let cluster = Self::spawn_members(name, size, relayed)?;
            match cluster.wait_healthy(HEALTHY_TIMEOUT) {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    let logs: String = cluster
                        .members
                        .iter()
                        .map(|m| m.log())
                        .collect::<Vec<_>>()
                        .join("\n");
                    if logs.contains("address already in use") {
                        last = e.0;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        fail!("etcd could not bind its ports: {last}")
    }

    fn spawn_members(name: &str, size: usize, relayed: bool) -> Result<EtcdCluster> {
        let dir = scratch_dir(name)?;
        // Unique per cluster, so members of two clusters can never join each other.
        let token = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("{name}-{}", std::process::id()));
        let data_dir = std::env::temp_dir().join(format!("proxy-dedup-{token}"));
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        std::fs::create_dir_all(&data_dir)?;
        let mut ports = Vec::with_capacity(size);
        for i in 0..size {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let relays = if relayed {
                let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
                Some((Relay::start(at(client_port))?, Relay::start(at(peer_port))?))
            } else {
                None
            };
            ports.push((format!("m{}", i + 1), client_port, peer_port, relays));
        }
        // What the other members dial: the peer relay when there is one.
        let advertised_peer = |peer: u16, relays: &Option<(Relay, Relay)>| {
            relays.as_ref().map(|(_, p)| p.port()).unwrap_or(peer)
        };
        let initial_cluster = ports
            .iter()
            .map(|(n, _, peer, relays)| {
                format!("{n}=http://127.0.0.1:{}", advertised_peer(*peer, relays))
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members: Vec::with_capacity(size),
            dir: dir.clone(),
            data_dir: data_dir.clone(),
        };
        let mut commands = String::new();
        for (member, client_port, peer_port, relays) in ports {
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let advertised_peer_url =
                format!("http://127.0.0.1:{}", advertised_peer(peer_port, &relays));
            let log_path = dir.join(format!("{member}.log"));
            let mut cmd = Command::new(etcd_binary());
            cmd.arg("--name")
                .arg(&member)
                .arg("--data-dir")
                .arg(data_dir.join(&member))
                .arg("--listen-client-urls")
                .arg(&client_url)
                .arg("--advertise-client-urls")
                .arg(&client_url)
                .arg("--listen-peer-urls")
                .arg(&peer_url)
                .arg("--initial-advertise-peer-urls")
                .arg(&advertised_peer_url)
                .arg("--initial-cluster")
                .arg(&initial_cluster)
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--initial-cluster-token")
                .arg(&token)
                .arg("--heartbeat-interval")
                .arg("50")
                .arg("--election-timeout")
                .arg("500")
                .arg("--logger")
                .arg("zap")
                .arg("--log-level")
                .arg("error")
                .arg("--log-outputs")
                .arg(&log_path);
            commands.push_str(&format!("{cmd:?}\n"));
            let (client_relay, peer_relay) = match relays {
                Some((c, p)) => (Some(c), Some(p)),
                None => (None, None),
            };
            let args: Vec<OsString> = cmd.get_args().map(OsString::from).collect();
            let stdout_path = dir.join(format!("{member}.stdout"));
            let stderr_path = dir.join(format!("{member}.stderr"));
            let child = spawn_etcd(&args, &stdout_path, &stderr_path)?;
            cluster.members.push(Member {
                args,
                stdout_path,
                stderr_path,
                name: member,
                client_port,
                peer_port,
                log_path,
                state: MemberState::Running,
                child,
                client_relay,
                peer_relay,
            });
        }
        std::fs::write(dir.join("commands.txt"), commands)?;
        Ok(cluster)
    }

    /// Wait until every running member answers `/health` with `{"health":"true"}`.
    pub fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let end = Instant::now() + limit;
        for m in self.members.iter() {
            if m.state != MemberState::Running {
                continue;
            }
            loop {
                if self.member_healthy(m) {
                    break;
                }
                if Instant::now() >= end {
                    fail!(
                        "etcd member {} ({}) not healthy after {limit:?}; log {}:\n{}",
                        m.name,
                        m.client_url(),
                        m.log_path.display(),
                        log_tail(&m.log_path, 20)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn member_healthy(&self, m: &Member) -> bool {
        let req = Request::get("/health").timeout(Duration::from_secs(1));
        match client::send(m.client_addr(), &req) {
            Ok(r) => r.status == 200 && r.json().is_ok_and(|v| v["health"] == "true"),
            Err(_) => false,
        }
    }

    pub fn client_ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.client_port).collect()
    }

    /// The ports proxies connect to: the client relays' (`start_relayed`),
    /// else the members' own.
    pub fn proxy_ports(&self) -> Vec<u16> {
        self.members.iter().map(Member::proxy_port).collect()
    }

    /// `http://127.0.0.1:P,…` of every member (for etcdctl `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(Member::client_url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILL member `i`: its client port refuses connections from now on.
    pub fn kill(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i) {
            m.signal(libc::SIGKILL);
            m.child.stop();
            m.state = MemberState::Killed;
        }
    }

    /// Start killed member `i` again on its data directory (it rejoins the
    /// cluster and catches up); a member not killed is left alone.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let Some(m) = self.members.get_mut(i) else {
            fail!("no etcd member {i}");
        };
        if m.state != MemberState::Killed {
            return Ok(());
        }
        m.spawn()?;
        m.state = MemberState::Running;
        Ok(())
    }

    /// Partition member `i` (`start_relayed` only): its client and peer
    /// relays stop passing bytes, so proxies and the other members see a
    /// black hole; the member itself keeps running (and dialing out).
    pub fn cut(&mut self, i: usize) -> Result<()> {
        let Some(m) = self.members.get(i) else {
            fail!("no etcd member {i}");
        };
        let (Some(c), Some(p)) = (&m.client_relay, &m.peer_relay) else {
            fail!("etcd member {i} has no relays: start the cluster with start_relayed");
        };
        c.cut();
        p.cut();
        Ok(())
    }

    /// End the partition of member `i`.
    pub fn heal(&mut self, i: usize) {
        if let Some(m) = self.members.get(i) {
            for r in [&m.client_relay, &m.peer_relay].into_iter().flatten() {
                r.heal();
            }
        }
    }

    pub fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// SIGSTOP member `i`: connections are still accepted by the kernel but
    /// nothing answers — etcd "slower than any timeout".
    pub fn pause(&mut self, i: usize) {
        self.signal_if(i, MemberState::Running, libc::SIGSTOP, MemberState::Paused);
    }

    pub fn pause_all(&mut self) {
        for i in 0..self.members.len() {
            self.pause(i);
        }
    }

    /// SIGCONT member `i` after `pause`.
    pub fn resume(&mut self, i: usize) {
        self.signal_if(i, MemberState::Paused, libc::SIGCONT, MemberState::Running);
    }

    /// Send `signal` to member `i` if it is in state `from`; it is `to` then.
    fn signal_if(&mut self, i: usize, from: MemberState, signal: libc::c_int, to: MemberState) {
        if let Some(m) = self.members.get_mut(i) {
            if m.state == from {
                m.signal(signal);
                m.state = to;
            }
        }
    }

    pub fn resume_all(&mut self) {
        for i in 0..self.members.len() {
            self.resume(i);
        }
    }

    /// POST a JSON body to the v3 gateway of the first running member that answers.
    pub fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let mut errors = Vec::new();
        for m in self.members.iter() {
            if m.state != MemberState::Running {
                continue;
            }
            match self.call_member(m, path, body) {
                Ok(v) => return Ok(v),
                Err(e) => errors.push(format!("{}: {e}", m.name)),
            }
        }
        fail!(
            "etcd {path}: no running member answered ({})",
            errors.join("; ")
        )
    }

    fn call_member(&self, m: &Member, path: &str, body: &Value) -> Result<Value> {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(CALL_TIMEOUT);
        let r = client::send(m.client_addr(), &req)?;
        if r.status != 200 {
            fail!("{path} answered {}: {}", r.status, r.text());
        }
        r.json()
    }

    /// Every key under `prefix` with its value and lease (linearizable read).
    pub fn keys(&self, prefix: &str) -> Result<Vec<EtcdKey>> {
        let v = self.call("/v3/kv/range", &prefix_range(prefix.as_bytes(), false))?;
        let Some(kvs) = v.get("kvs").and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| {
                Ok(EtcdKey {
                    key: base64_field(kv, "key")?,
                    value: base64_field(kv, "value")?,
                    lease: int_field(kv, "lease").unwrap_or(0),
                })
            })
            .collect()
    }

    /// How many keys exist under `prefix`.
    pub fn count_keys(&self, prefix: &str) -> Result<u64> {
        let v = self.call("/v3/kv/range", &prefix_range(prefix.as_bytes(), true))?;
        // proto3 JSON leaves out zero values: no "count" means 0.
        Ok(int_field(&v, "count").unwrap_or(0).max(0) as u64)
    }

    /// Wait until `prefix` holds no key (records expired with their leases).
    /// Returns how long that took.
    pub fn wait_no_keys(&self, prefix: &str, limit: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let n = self.count_keys(prefix)?;
            if n == 0 {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= limit {
                fail!("{n} keys still under {prefix:?} after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `/v3/lease/timetolive`: `None` once the lease has expired (TTL -1).
    pub fn lease_ttl(&self, lease: i64) -> Result<Option<LeaseTtl>> {
        let v = self.call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() }))?;
        let ttl = int_field(&v, "TTL").unwrap_or(-1);
        if ttl < 0 {
            return Ok(None);
        }
        Ok(Some(LeaseTtl {
            remaining_seconds: ttl,
            granted_seconds: int_field(&v, "grantedTTL").unwrap_or(0),
        }))
    }

    /// Index in `members` of the current Raft leader.
    pub fn leader(&self) -> Result<usize> {
        let status = self.call("/v3/maintenance/status", &json!({}))?;
        let Some(leader) = uint_field(&status, "leader") else {
            fail!("maintenance/status without a leader: {status}");
        };
        for (i, m) in self.members.iter().enumerate() {
            if m.state != MemberState::Running {
                continue;
            }
            let own = self.call_member(m, "/v3/maintenance/status", &json!({}))?;
            if own
                .get("header")
                .and_then(|h| uint_field(h, "member_id"))
                .is_some_and(|id| id == leader)
            {
                return Ok(i);
            }
        }
        fail!("leader {leader} is not a running member")
    }

    /// Delete every key under `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> Result<()> {
        self.call(
            "/v3/kv/deleterange",
            &prefix_range(prefix.as_bytes(), false),
        )?;
        Ok(())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // SIGKILL works on paused members too; ChildGuard then reaps at once.
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.data_dir);
        // Keep the logs of a failed test (as `EnvoyProcess` does); drop the rest.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One key from a range read.
#[derive(Debug, Clone)]
pub struct EtcdKey {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// 0: no lease.
    pub lease: i64,
}

#[derive(Debug, Clone, Copy)]
pub struct LeaseTtl {
    pub remaining_seconds: i64,
    pub granted_seconds: i64,
}

/// The range request for every key starting with `prefix` (`range_end` =
/// the prefix with its last byte incremented).
fn prefix_range(prefix: &[u8], count_only: bool) -> Value {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    if end.is_empty() {
        // Every key: range_end "\0".
        end.push(0);
    }
    let mut v = json!({ "key": base64_encode(prefix), "range_end": base64_encode(&end) });
    if count_only {
        v["count_only"] = json!(true);
    }
    v
}

/// int64 fields come as JSON strings (proto3 JSON), sometimes as numbers.
fn int_field(v: &Value, name: &str) -> Option<i64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Member ids are uint64 (above i64::MAX for half of them).
fn uint_field(v: &Value, name: &str) -> Option<u64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

fn base64_field(v: &Value, name: &str) -> Result<Vec<u8>> {
    match v.get(name).and_then(Value::as_str) {
        None => Ok(Vec::new()),
        Some(s) => base64_decode(s),
    }
}

/// Standard base64 with padding (what etcd's JSON gateway uses for bytes); the same
/// crate the filter uses.
pub fn base64_encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

pub fn base64_decode(text: &str) -> Result<Vec<u8>> {
    match STANDARD.decode(text) {
        Ok(v) => Ok(v),
        Err(e) => fail!("invalid base64 {text:?}: {e}"),
    }
}

/// Put the members' client ports into the template's etcd endpoint lines:
/// each line ending in `# etcd member N` gets `port_value: <port of member N>`.
/// The template keeps real, editable defaults there (2379, 22379, 32379), so
/// it stays a valid Envoy config without this step.
pub fn render_etcd_endpoints(template: &str, ports: &[u16]) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut seen = vec![false; ports.len()];
    for line in template.split_inclusive('\n') {
        let trimmed = line.trim_end();
        let member = trimmed
            .rsplit_once(MEMBER_MARKER)
            .filter(|(code, _)| !code.trim_start().starts_with('#'))
            .and_then(|(_, n)| n.trim().parse::<usize>().ok());
        let Some(n) = member else {
            out.push_str(line);
            continue;
        };
        let Some(port) = n.checked_sub(1).and_then(|i| ports.get(i)) else {
            fail!(
                "template line {trimmed:?} names etcd member {n}, but the cluster has {} members",
                ports.len()
            );
        };
        let Some(at) = line.find("port_value:") else {
            fail!("etcd member line without port_value: {trimmed:?}");
        };
        let after = &line[at + "port_value:".len()..];
        let digits_at = after.len() - after.trim_start().len();
        let digits = after[digits_at..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len() - digits_at);
        out.push_str(&line[..at]);
        out.push_str(&format!("port_value: {port}"));
        out.push_str(&after[digits_at + digits..]);
        seen[n - 1] = true;
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        fail!(
            "the template has no line ending in \"{MEMBER_MARKER}{}\"",
            missing + 1
        );
    }
    Ok(out)
}

/// `multi-proxy-etcd.yaml` pointed at `etcd`'s members, with `wasm` and
/// `filter_config`, on fresh loopback ports. The etcd endpoints are written
/// into a copy of the template in the cluster's directory; the remaining
/// placeholders are rendered by `EnvoyProcess::start` as for `single-node.yaml`.
pub fn multi_proxy_config(
    etcd: &EtcdCluster,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    etcd_proxy_config(
        etcd,
        &config_file(MULTI_PROXY_ETCD),
        upstream_port,
        wasm,
        filter_config,
    )
}

/// `multi_proxy_config` for the filter's `store.protocol: "json"`: the same
/// template with its `etcd` cluster on HTTP/1.1 (the `typed_extension_protocol_options`
/// block that makes it HTTP/2 removed, as the template's comments tell users to do),
/// since etcd serves its JSON gateway on HTTP/1.1 only.
pub fn multi_proxy_json_config(
    etcd: &EtcdCluster,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = match std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)) {
        Ok(t) => t,
        Err(e) => fail!("cannot read {MULTI_PROXY_ETCD}: {e}"),
    };
    let http1 = without_http2_options(&template)?;
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = etcd.dir.join(format!(
        "json-template-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::write(&path, http1) {
        fail!("cannot write {}: {e}", path.display());
    }
    etcd_proxy_config(etcd, &path, upstream_port, wasm, filter_config)
}

/// `template` without its `typed_extension_protocol_options:` block (the line and the
/// more deeply indented lines after it).
pub fn without_http2_options(template: &str) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut skipping: Option<usize> = None;
    let mut found = false;
    for line in template.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = skipping {
            if indent > at && !line.trim().is_empty() {
                continue;
            }
            skipping = None;
        }
        if line
            .trim_start()
            .starts_with("typed_extension_protocol_options:")
        {
            skipping = Some(indent);
            found = true;
            continue;
        }
        out.push_str(line);
    }
    if !found {
        fail!("the template has no typed_extension_protocol_options block");
    }
    Ok(out)
}

/// `multi_proxy_config` from another template with the same `# etcd member N`
/// endpoint lines (e.g. one whose listener comes by LDS).
pub fn etcd_proxy_config(
    etcd: &EtcdCluster,
    template_path: &Path,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = match std::fs::read_to_string(template_path) {
        Ok(t) => t,
        Err(e) => fail!("cannot read {}: {e}", template_path.display()),
    };
    let rendered = render_etcd_endpoints(&template, &etcd.proxy_ports())?;
    // Next to the cluster's logs: removed with them.
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = etcd.dir.join(format!(
        "envoy-template-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    Ok(config)
}

/// Health of the `etcd` cluster's hosts as one Envoy sees them (admin
/// `/clusters`): (healthy, total).
pub fn etcd_hosts_health(envoy: &EnvoyProcess) -> Result<(usize, usize)> {
    let text = envoy.admin("/clusters")?.text();
    let mut total = 0;
    let mut healthy = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("etcd::") else {
            continue;
        };
        if let Some((_, flags)) = rest.split_once("::health_flags::") {
            total += 1;
            if flags.trim() == "healthy" {
                healthy += 1;
            }
        }
    }
    Ok((healthy, total))
}

/// Wait until `envoy` sees `want` healthy etcd hosts (active health checks).
pub fn wait_etcd_hosts_healthy(envoy: &EnvoyProcess, want: usize, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let (healthy, total) = etcd_hosts_health(envoy)?;
        if healthy == want {
            return Ok(());
        }
        if Instant::now() >= end {
            fail!("Envoy sees {healthy}/{total} healthy etcd hosts after {limit:?}, wanted {want}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_template_is_the_copyable_one_without_http2() {
        let template = std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)).unwrap();
        assert!(template.contains("http2_protocol_options"));
        let http1 = without_http2_options(&template).unwrap();
        let config_lines = || http1.lines().filter(|l| !l.trim_start().starts_with('#'));
        assert!(!config_lines().any(|l| l.contains("typed_extension_protocol_options")));
        assert!(!config_lines().any(|l| l.contains("http2_protocol_options")));
        // Only those lines went: the cluster and its members are still there.
        let removed = template.lines().count() - http1.lines().count();
        assert_eq!(removed, 5, "{http1}");
        assert!(http1.contains("# etcd member 3"));
        assert!(http1.contains("    connect_timeout: 0.25s"));
        assert!(without_http2_options("a: 1\n").is_err());
    }

    #[test]
    fn base64_round_trips() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"proxy-dedup/", "cHJveHktZGVkdXAv"),
            (b"\xff\x00\x10", "/wAQ"),
        ] {
            assert_eq!(base64_encode(raw), enc);
            assert_eq!(base64_decode(enc).unwrap(), raw);
        }
    }

    #[test]
    fn prefix_range_increments_the_last_byte() {
        let v = prefix_range(b"proxy-dedup/", true);
        assert_eq!(v["key"], base64_encode(b"proxy-dedup/"));
        assert_eq!(v["range_end"], base64_encode(b"proxy-dedup0"));
        assert_eq!(v["count_only"], true);
        let v = prefix_range(b"a\xff", false);
        assert_eq!(v["range_end"], base64_encode(b"b"));
    }

    #[test]
    fn endpoints_are_rendered_by_member_marker() {
        let t = "# port_value: 1 # etcd member 1\n  - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 2379 } } }  # etcd member 1\n  x: { port_value: 22379 } # etcd member 2\n";
        let out = render_etcd_endpoints(t, &[5001, 5002]).unwrap();
        assert_eq!(
            out,
            "# port_value: 1 # etcd member 1\n  - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 5001 } } }  # etcd member 1\n  x: { port_value: 5002 } # etcd member 2\n"
        );
        assert!(render_etcd_endpoints(t, &[5001, 5002, 5003]).is_err());
        assert!(render_etcd_endpoints(t, &[5001]).is_err());
    }
}
