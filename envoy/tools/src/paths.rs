//! Where the workspace and the built Wasm modules are (the test kit's
//! `dedup_envoy::paths` adds the config templates and scratch directories).

use crate::{fail, Result};
use std::path::{Path, PathBuf};

/// The workspace root (`PROXY_DEDUP_ROOT` overrides, for a moved binary).
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("PROXY_DEDUP_ROOT") {
        return PathBuf::from(root);
    }
    // This crate is envoy/tools/.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .to_path_buf()
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
