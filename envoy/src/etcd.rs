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

mod gateway;
mod proxies;

pub use gateway::{base64_decode, base64_encode, EtcdKey, LeaseTtl};
pub use proxies::{
    append_shard_clusters, cluster_hosts_health, etcd_hosts_health, etcd_proxy_config,
    multi_proxy_config, multi_proxy_json_config, proxy_config_on_ports, render_etcd_endpoints,
    render_shard_clusters, sharded_bootstrap_config, sharded_proxy_config,
    sharded_proxy_json_config, sharded_proxy_lds_config, wait_cluster_hosts_healthy,
    wait_etcd_hosts_healthy, without_http2_options, MULTI_PROXY_ETCD,
};

use crate::client::{self, Request};
use crate::paths::scratch_dir;
use crate::ports::free_port;
use crate::process::{log_tail, spawn, ChildGuard};
use crate::relay::Relay;
use crate::{fail, Result};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new cluster may take to elect a leader and answer `/health`.
pub const HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);

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

    /// The members' process ids (0 for a killed member), e.g. to read their CPU time
    /// in `/proc`.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.child.id()).collect()
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
