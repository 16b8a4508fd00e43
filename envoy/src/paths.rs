//! Where the workspace, the built Wasm modules and the config templates are.

use crate::{fail, Result};
use std::path::PathBuf;

/// The workspace root (`PROXY_DEDUP_ROOT` overrides, for a moved binary).
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("PROXY_DEDUP_ROOT") {
        return PathBuf::from(root);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// `envoy/configs/<name>`.
pub fn config_file(name: &str) -> PathBuf {
    workspace_root().join("envoy").join("configs").join(name)
}

/// A built module in `dist/`; a missing one is an error that says how to build it.
pub fn dist_wasm(file: &str) -> Result<PathBuf> {
    let path = workspace_root().join("dist").join(file);
    if !path.is_file() {
        fail!(
            "{} is missing: run `make wasm` (it builds dist/dedup_filter.wasm and dist/empty_filter.wasm)",
            path.display()
        );
    }
    Ok(path)
}

pub fn dedup_wasm() -> Result<PathBuf> {
    dist_wasm("dedup_filter.wasm")
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
