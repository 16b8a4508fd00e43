//! `make oci`'s image through a real registry: the `oci-image` binary writes
//! the layout, skopeo pushes it to Debian's docker-registry on loopback and
//! pulls it back, and the module comes out byte for byte under the same
//! digests. The registry is then read the way Istio's image fetcher reads it, and a
//! plain Envoy loads the module from the registry's blob URL (`vm_config.code.remote`,
//! the variant docs/src/deployment/kubernetes.md gives for a registry).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_envoy::paths::{config_file, dedup_wasm, empty_wasm, scratch_dir};
use dedup_envoy::registry::Registry;
use dedup_envoy::{EnvoyConfig, EnvoyProcess, Request};
use dedup_tools::oci::{digest, find_layer, sha256_hex, Image, MODULE_LAYER, REF_NAME};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const REPO: &str = "proxy-dedup";
const TAG: &str = "0.1.0";

/// Every file of a directory tree, relative path -> bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// `oci-image --out DIR --tag TAG` (the binary `make oci` runs); its output.
fn oci_image(out: &Path, extra: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_oci-image"))
        .arg("--out")
        .arg(out)
        .arg("--tag")
        .arg(TAG)
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "oci-image failed: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

/// The value after `label` on a line of oci-image's output.
fn printed(text: &str, label: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{text}"))
        .trim()
        .to_string()
}

fn skopeo(args: &[&str]) {
    let o = Command::new("skopeo")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("skopeo: {e} (run `make deps`: apt-get install skopeo)"));
    assert!(
        o.status.success(),
        "skopeo {args:?}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The manifest digest a layout's index.json gives `tag`.
fn layout_digest(dir: &Path, tag: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let m = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"][REF_NAME] == tag)
        .unwrap_or_else(|| panic!("no {tag} in {index}"));
    m["digest"].as_str().unwrap().to_string()
}

fn blob(dir: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").unwrap();
    std::fs::read(dir.join("blobs").join("sha256").join(hex)).unwrap()
}

#[test]
fn make_oci_is_deterministic_and_survives_a_real_registry() {
    let module_path = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let module = std::fs::read(&module_path).unwrap();
    let want = Image::new(&module, "dedup_filter.wasm").unwrap();
    let dir = scratch_dir("oci").unwrap();

    // The binary, twice: the same bytes, the digests it prints are the image's.
    let (a, b) = (dir.join("a"), dir.join("b"));
    let out = oci_image(&a, &[]);
    oci_image(&b, &[]);
    assert_eq!(tree(&a), tree(&b), "two runs wrote different layouts");
    assert_eq!(printed(&out, "image digest"), want.digest());
    assert_eq!(printed(&out, "module sha256"), sha256_hex(&module));
    assert_eq!(layout_digest(&a, TAG), want.digest());
    assert_eq!(blob(&a, &want.module_digest()), module);
    // Another module, another digest (the digest follows the module).
    let other = dir.join("other");
    let empty = empty_wasm().unwrap_or_else(|e| panic!("{e}"));
    let out_other = oci_image(&other, &["--module", &empty.display().to_string()]);
    assert_ne!(printed(&out_other, "image digest"), want.digest());

    // Push with skopeo to a real registry on loopback.
    let registry = Registry::start("oci-registry").unwrap();
    let host = registry.host();
    let pushed = format!("docker://{host}/{REPO}:{TAG}");
    skopeo(&[
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{}:{TAG}", a.display()),
        &pushed,
    ]);

    // What Istio's fetcher does: the manifest by tag (its digest is the
    // image's), exactly two layers, the module layer by media type, its blob.
    let (served_digest, manifest) = registry.manifest(REPO, TAG).unwrap();
    assert_eq!(served_digest, want.digest());
    assert_eq!(manifest, want.manifest);
    let (layer, size) = find_layer(&manifest, MODULE_LAYER).unwrap();
    assert_eq!(size, module.len() as u64);
    let served_module = registry.blob(REPO, &layer).unwrap();
    assert_eq!(served_module, module, "the registry serves other bytes");
    assert_eq!(digest(&served_module), layer);

    // Pull it back by digest, as a WasmPlugin pinned with
    // `url: oci://<registry>/proxy-dedup@<digest>` does.
    let pulled = dir.join("pulled");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{host}/{REPO}@{}", want.digest()),
        &format!("oci:{}:{TAG}", pulled.display()),
    ]);
    assert_eq!(layout_digest(&pulled, TAG), want.digest());
    let pulled_manifest = blob(&pulled, &want.digest());
    assert_eq!(pulled_manifest, want.manifest);
    let (layer, _) = find_layer(&pulled_manifest, MODULE_LAYER).unwrap();
    assert_eq!(blob(&pulled, &layer), module, "the pulled module differs");

    // Plain Envoy, no Istio: remote code from the registry's blob URL, checked by the
    // module's SHA-256 (the module layer's digest).
    let blob_path = format!("/v2/{REPO}/blobs/{}", want.module_digest());
    let template = std::fs::read_to_string(config_file("remote-module.yaml")).unwrap();
    let uri = "http://127.0.0.1:{{MODULE_PORT}}/dedup_filter.wasm";
    assert!(template.contains(uri), "remote-module.yaml's uri moved");
    let from_registry = dir.join("remote-from-registry.yaml");
    std::fs::write(
        &from_registry,
        template.replace(
            uri,
            &format!("http://127.0.0.1:{{{{MODULE_PORT}}}}{blob_path}"),
        ),
    )
    .unwrap();
    let mut cfg = EnvoyConfig::remote_module(
        1,
        registry.addr().port(),
        &sha256_hex(&module),
        r#"{"key": {"required": true}}"#,
    )
    .unwrap();
    cfg.template = from_registry;
    let envoy = EnvoyProcess::start("oci-remote", cfg).unwrap_or_else(|e| panic!("{e}"));
    // A module that failed to load would leave the listener without the filter,
    // answering 503 (FAIL_CLOSED): the filter's own 400 shows it loaded.
    let r = envoy.send(&Request::post("/orders").body("{}")).unwrap();
    assert_eq!(r.status, 400, "{}\n{}", r.summary(), envoy.log());
    assert_eq!(
        dedup_envoy::problem_type(&r.body),
        "urn:proxy-dedup:problem:missing-key"
    );
    drop(envoy);
    drop(registry);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Istio example pins the image by digest, in the form `make oci` prints
/// (`url: oci://REGISTRY/proxy-dedup@<image digest>`), with the digest as a
/// placeholder (the module is built, not committed).
#[test]
fn the_istio_example_pins_the_image_by_digest() {
    let text = std::fs::read_to_string(config_file("istio-wasmplugin.yaml")).unwrap();
    let url = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("url: "))
        .expect("a url: line");
    assert_eq!(
        url,
        "oci://registry.example.com/proxy-dedup@{{IMAGE_DIGEST}}"
    );
    assert!(
        text.contains("make oci"),
        "the example says where the digest comes from"
    );
}
