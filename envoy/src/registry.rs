//! A real OCI registry on loopback for the image tests: Debian's
//! `docker-registry` (the CNCF distribution registry) with a config file
//! written here, its storage in a scratch directory, plain HTTP on
//! 127.0.0.1:<free port>, no authentication. Killed on drop.

use crate::client::{self, Request};
use crate::paths::scratch_dir;
use crate::ports::free_port;
use crate::process::{spawn, ChildGuard};
use crate::{fail, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The registry binary (`REGISTRY_BIN` overrides).
pub fn registry_binary() -> String {
    std::env::var("REGISTRY_BIN").unwrap_or_else(|_| "docker-registry".into())
}

pub struct Registry {
    child: ChildGuard,
    pub port: u16,
    pub dir: PathBuf,
}

impl Registry {
    /// Start the registry and wait until `GET /v2/` answers 200.
    pub fn start(name: &str) -> Result<Registry> {
        let bin = registry_binary();
        if Command::new(&bin).arg("--version").output().is_err() {
            fail!("{bin} not found: run `make deps` (apt-get install docker-registry)");
        }
        let mut last = String::new();
        for _attempt in 0..3 {
            let dir = scratch_dir(name)?;
            let port = free_port()?;
            let config = dir.join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\n\
                     log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: 127.0.0.1:{port}\n",
                    dir.join("storage").display()
                ),
            )?;
            let log = dir.join("registry.log");
            let mut cmd = Command::new(&bin);
            cmd.arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::from(std::fs::File::create(&log)?))
                .stderr(Stdio::from(std::fs::File::create(dir.join("stderr.log"))?));
            let mut registry = Registry {
                child: spawn(cmd)?,
                port,
                dir,
            };
            match registry.wait_ready(Duration::from_secs(15)) {
                Ok(()) => return Ok(registry),
                Err(e) => {
                    registry.child.stop();
                    let text = registry.log();
                    if text.contains("address already in use") {
                        last = e.0;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        fail!("the registry could not bind a port: {last}")
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let end = Instant::now() + limit;
        loop {
            if let Some(code) = self.child.try_exit() {
                fail!("the registry exited with {code}:\n{}", self.log());
            }
            let req = Request::get("/v2/").timeout(Duration::from_secs(2));
            if let Ok(r) = client::send(self.addr(), &req) {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                fail!(
                    "the registry did not answer /v2/ within {limit:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:PORT`, the registry part of an image reference.
    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// What the registry logged (stdout and stderr).
    pub fn log(&self) -> String {
        ["registry.log", "stderr.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("")
    }

    /// `GET /v2/<repo>/manifests/<reference>` (a tag or a digest) as an OCI
    /// manifest: the registry's `docker-content-digest` and the bytes.
    pub fn manifest(&self, repo: &str, reference: &str) -> Result<(String, Vec<u8>)> {
        let r = client::send(
            self.addr(),
            &Request::get(&format!("/v2/{repo}/manifests/{reference}"))
                .header("accept", crate::oci::MANIFEST),
        )?;
        if r.status != 200 {
            fail!("manifest {repo}:{reference}: {}", r.summary());
        }
        let Some(digest) = r.header("docker-content-digest") else {
            fail!("manifest {repo}:{reference} came without docker-content-digest");
        };
        Ok((digest.to_string(), r.body.clone()))
    }

    /// `GET /v2/<repo>/blobs/<digest>`.
    pub fn blob(&self, repo: &str, digest: &str) -> Result<Vec<u8>> {
        let r = client::send(
            self.addr(),
            &Request::get(&format!("/v2/{repo}/blobs/{digest}")),
        )?;
        if r.status != 200 {
            fail!("blob {repo}@{digest}: {}", r.summary());
        }
        Ok(r.body)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.child.stop();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
