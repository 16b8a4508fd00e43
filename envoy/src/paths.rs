//! Where the workspace, the built Wasm modules and the config templates are
//! (the first two shared with the tools, `dedup_tools::paths`).

use crate::Result;
use std::path::PathBuf;

pub use dedup_tools::paths::{dedup_wasm, dist_wasm, workspace_root};

/// `envoy/configs/<name>`.
pub fn config_file(name: &str) -> PathBuf {
    workspace_root().join("envoy").join("configs").join(name)
}

pub fn empty_wasm() -> Result<PathBuf> {
    dist_wasm("empty_filter.wasm")
}

/// The probe that makes one kind of host call N times per request
/// (host-test/probes/hostcall-probe; bench-envoy's per-call cost table).
pub fn hostcall_probe_wasm() -> Result<PathBuf> {
    dist_wasm("hostcall_probe.wasm")
}

/// A fresh scratch directory under `target/envoy-runs/` for configs and logs.
pub fn scratch_dir(name: &str) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = workspace_root()
        .join("target")
        .join("envoy-runs")
        .join(format!("{name}-{}-{n}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
