//! The module as an OCI image for Istio's `WasmPlugin` (`url: oci://…`),
//! written as an OCI image layout directory (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) that `skopeo copy oci:DIR:TAG docker://…` or
//! `oras cp --from-oci-layout` push to any registry.
//!
//! The format is the *oci* variant of the Wasm image specification, the one
//! Istio's image fetcher recognises by media types: a manifest with exactly two
//! layers, the module itself as an `application/vnd.module.wasm.content.layer.v1+wasm`
//! blob (the `.wasm` bytes unchanged, so the layer's digest is the module's
//! SHA-256) and a small runtime configuration as
//! `application/vnd.module.wasm.config.v1+json` (also the manifest's config).
//!
//! Deterministic: nothing in the blobs depends on the time, the machine or the
//! tag, and the JSON is written compactly with a fixed key order, so the same
//! module always gives the same manifest digest.

use crate::{fail, Result};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::path::Path;

pub const MODULE_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
pub const RUNTIME_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The layer annotation that names the file (`oras pull` writes it under this name).
pub const TITLE: &str = "org.opencontainers.image.title";
/// The index annotation that gives a manifest its tag in a layout.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// `sha256` of `bytes` as 64 lower-case hex digits (what Envoy's
/// `vm_config.code.remote.sha256` takes).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `sha256:<hex>`, an OCI digest.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// One image: its three blobs, as they are written and pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub module: Vec<u8>,
    /// `file_name` of the module layer (`TITLE` annotation).
    pub module_name: String,
    pub runtime_config: Vec<u8>,
    pub manifest: Vec<u8>,
}

impl Image {
    /// The image of a proxy-wasm module. The module must be WebAssembly and
    /// export a `proxy_abi_version_*` function (that name goes into the
    /// runtime configuration); anything else is refused.
    pub fn new(module: &[u8], module_name: &str) -> Result<Image> {
        if !module.starts_with(b"\0asm") {
            fail!("{module_name} is not a WebAssembly module (no \\0asm header)");
        }
        let Some(abi) = proxy_abi_version(module) else {
            fail!("{module_name} exports no proxy_abi_version_* function: not a proxy-wasm module");
        };
        let runtime_config = serde_json::to_vec(&json!({
            "type": "envoy_proxy",
            "abiVersions": [abi],
            "config": {"root_ids": [""]},
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": descriptor(RUNTIME_CONFIG, &runtime_config, None),
            "layers": [
                descriptor(MODULE_LAYER, module, Some(module_name)),
                descriptor(RUNTIME_CONFIG, &runtime_config, Some("runtime-config.json")),
            ],
        }))?;
        Ok(Image {
            module: module.to_vec(),
            module_name: module_name.to_string(),
            runtime_config,
            manifest,
        })
    }

    /// The image's digest: the manifest's. A WasmPlugin pins the image with
    /// `url: oci://<registry>/<repository>@<this>`.
    pub fn digest(&self) -> String {
        digest(&self.manifest)
    }

    /// The module layer's digest, `sha256:` + the module's SHA-256.
    pub fn module_digest(&self) -> String {
        digest(&self.module)
    }

    /// Write the image as an OCI image layout in `dir` with tag `tag`. An
    /// existing layout there is replaced (so no blob of an older module stays
    /// behind); any other non-empty directory is refused.
    pub fn write_layout(&self, dir: &Path, tag: &str) -> Result<()> {
        check_tag(tag)?;
        if dir.exists() {
            let is_layout = dir.join("oci-layout").is_file();
            let is_empty = std::fs::read_dir(dir)?.next().is_none();
            if !is_layout && !is_empty {
                fail!(
                    "{} exists and is not an OCI image layout: not overwriting it",
                    dir.display()
                );
            }
            std::fs::remove_dir_all(dir)?;
        }
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs)?;
        for blob in [&self.module, &self.runtime_config, &self.manifest] {
            std::fs::write(blobs.join(sha256_hex(blob)), blob)?;
        }
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [{
                "mediaType": MANIFEST,
                "digest": self.digest(),
                "size": self.manifest.len(),
                "annotations": {REF_NAME: tag},
            }],
        }))?;
        std::fs::write(dir.join("index.json"), index)?;
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        Ok(())
    }
}

fn descriptor(media_type: &str, blob: &[u8], title: Option<&str>) -> serde_json::Value {
    let mut d = json!({
        "mediaType": media_type,
        "digest": digest(blob),
        "size": blob.len(),
    });
    if let Some(title) = title {
        d["annotations"] = json!({ TITLE: title });
    }
    d
}

/// A tag as the OCI distribution spec allows it: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn check_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        fail!("{tag:?} is not a valid image tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})");
    }
    Ok(())
}

/// The `proxy_abi_version_X_Y_Z` name in the module's bytes (an export name
/// is stored as plain UTF-8), if any.
fn proxy_abi_version(module: &[u8]) -> Option<String> {
    const PREFIX: &[u8] = b"proxy_abi_version_";
    let at = module.windows(PREFIX.len()).position(|w| w == PREFIX)?;
    let rest = &module[at + PREFIX.len()..];
    let len = rest
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'_')
        .count();
    if len == 0 {
        return None;
    }
    let name = &module[at..at + PREFIX.len() + len];
    Some(String::from_utf8_lossy(name).into_owned())
}

/// A manifest's layer of media type `media_type`: (digest, size). Fails, as
/// Istio's fetcher does, unless the manifest has exactly two layers.
pub fn find_layer(manifest: &[u8], media_type: &str) -> Result<(String, u64)> {
    let m: serde_json::Value = serde_json::from_slice(manifest)?;
    let Some(layers) = m["layers"].as_array() else {
        fail!("manifest without layers");
    };
    if layers.len() != 2 {
        fail!(
            "the Wasm image's oci variant has 2 layers, this manifest has {}",
            layers.len()
        );
    }
    for l in layers {
        if l["mediaType"] == media_type {
            match (l["digest"].as_str(), l["size"].as_u64()) {
                (Some(d), Some(s)) => return Ok((d.to_string(), s)),
                _ => fail!("layer {l} has no digest or size"),
            }
        }
    }
    fail!("no layer of type {media_type} in the manifest")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest module with a proxy-wasm ABI export name in it.
    fn module() -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        m.extend_from_slice(b"\x07\x1c\x01\x18proxy_abi_version_0_2_1\0\0");
        m
    }

    #[test]
    fn same_module_same_digest_and_another_module_another() {
        let a = Image::new(&module(), "x.wasm").unwrap();
        let b = Image::new(&module(), "x.wasm").unwrap();
        assert_eq!(a, b);
        let mut other = module();
        other.push(0);
        let c = Image::new(&other, "x.wasm").unwrap();
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.module_digest(), digest(&module()));
        assert_eq!(
            String::from_utf8(a.runtime_config.clone()).unwrap(),
            r#"{"abiVersions":["proxy_abi_version_0_2_1"],"config":{"root_ids":[""]},"type":"envoy_proxy"}"#
        );
    }

    #[test]
    fn the_manifest_has_the_module_layer_and_the_runtime_config() {
        let img = Image::new(&module(), "dedup_filter.wasm").unwrap();
        let (d, size) = find_layer(&img.manifest, MODULE_LAYER).unwrap();
        assert_eq!((d, size), (digest(&module()), module().len() as u64));
        let m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
        assert_eq!(m["config"]["mediaType"], RUNTIME_CONFIG);
        assert_eq!(m["layers"][0]["annotations"][TITLE], "dedup_filter.wasm");
        assert_eq!(m["layers"][1]["mediaType"], RUNTIME_CONFIG);
    }

    #[test]
    fn non_modules_and_bad_tags_are_refused() {
        assert!(Image::new(b"hello", "x").is_err());
        assert!(Image::new(b"\0asm\x01\0\0\0", "x").is_err());
        for bad in ["", "-x", ".x", "a/b", "a:b", &"t".repeat(129)] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
        for good in ["0.1.0", "latest", "v1_2-rc.3", "_x"] {
            check_tag(good).unwrap();
        }
    }

    #[test]
    fn sha256_of_abc() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
