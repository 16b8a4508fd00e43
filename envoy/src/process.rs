//! Child processes that cannot outlive the harness.
//!
//! Children are spawned from one long-lived thread with `PR_SET_PDEATHSIG`:
//! the kernel sends SIGKILL when the spawning *thread* exits, so spawning from
//! a test thread would kill a shared Envoy when that test ends. The spawner
//! thread lives as long as the process, so a crashed or killed test binary
//! leaves no Envoy behind. `ChildGuard` kills on drop for the normal path.

use crate::Result;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

type Job = (Command, Sender<std::io::Result<Child>>);

static SPAWNER: Mutex<Option<Sender<Job>>> = Mutex::new(None);

fn spawner() -> std::io::Result<Sender<Job>> {
    let mut slot = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(tx) = slot.as_ref() {
        return Ok(tx.clone());
    }
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name("child-spawner".into())
        .spawn(move || {
            for (mut cmd, reply) in rx {
                // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.spawn());
            }
        })?;
    *slot = Some(tx.clone());
    Ok(tx)
}

/// Spawn `cmd` so that it dies with this process.
pub fn spawn(cmd: Command) -> Result<ChildGuard> {
    let (tx, rx) = channel();
    spawner()?
        .send((cmd, tx))
        .map_err(|_| crate::Error::msg("child spawner thread is gone"))?;
    let child = rx
        .recv()
        .map_err(|_| crate::Error::msg("child spawner thread is gone"))??;
    Ok(ChildGuard { child: Some(child) })
}

/// A child that is stopped (SIGTERM, then SIGKILL) when dropped.
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    pub fn id(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `Some(exit code)` (or -signal) once the child has exited.
    pub fn try_exit(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(st)) => Some(st.code().unwrap_or_else(|| -st.signal().unwrap_or(0))),
            _ => None,
        }
    }

    /// Wait up to `limit` for the child to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            if let Some(code) = self.try_exit() {
                return Some(code);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// SIGTERM, a short grace period, then SIGKILL; reaps the child.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: plain kill(2) on our own child's pid, not yet reaped.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let end = Instant::now() + Duration::from_secs(3);
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a child's log file (empty if it cannot be read),
/// for the error that says why the child did not come up.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
