//! `make oci`: the built module as an OCI image layout for Istio's WasmPlugin
//! (see `dedup_tools::oci`), and the digests a deployment pins.
//!
//! `oci-image [--module dist/dedup_filter.wasm] [--out dist/oci] [--tag 0.1.0]`
//! writes the layout and prints the module's SHA-256 and the image digest.

use dedup_tools::oci::{check_tag, sha256_hex, Image};
use dedup_tools::paths::{dedup_wasm, workspace_root};
use dedup_tools::{fail, Result};
use std::path::PathBuf;

struct Args {
    module: Option<PathBuf>,
    out: PathBuf,
    tag: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        module: None,
        out: workspace_root().join("dist").join("oci"),
        tag: env!("CARGO_PKG_VERSION").to_string(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            fail!("{flag} needs a value");
        };
        match flag.as_str() {
            "--module" => a.module = Some(value.into()),
            "--out" => a.out = value.into(),
            "--tag" => a.tag = value,
            _ => fail!(
                "unknown argument {flag}; usage: oci-image [--module FILE] [--out DIR] [--tag TAG]"
            ),
        }
    }
    check_tag(&a.tag)?;
    Ok(a)
}

fn run() -> Result<()> {
    let a = args()?;
    let module_path = match a.module {
        Some(p) => p,
        None => dedup_wasm()?,
    };
    let module = std::fs::read(&module_path)
        .map_err(|e| dedup_tools::Error(format!("{}: {e}", module_path.display())))?;
    let name = module_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plugin.wasm".into());
    let image = Image::new(&module, &name)?;
    image.write_layout(&a.out, &a.tag)?;
    let out = a.out.display();
    let tag = &a.tag;
    println!(
        "wrote {out}: an OCI image layout of {} ({} bytes), tag {tag}\n\
         \n\
         module sha256  {}\n\
         image digest   {}\n\
         \n\
         Publish it (any registry; skopeo or oras):\n\
         \x20 skopeo copy oci:{out}:{tag} docker://REGISTRY/proxy-dedup:{tag}\n\
         Pin it in the WasmPlugin (envoy/configs/istio-wasmplugin.yaml):\n\
         \x20 url: oci://REGISTRY/proxy-dedup@{}\n\
         The module sha256 is also the `sha256` of vm_config.code.remote\n\
         (envoy/configs/remote-module.yaml).",
        module_path.display(),
        module.len(),
        sha256_hex(&module),
        image.digest(),
        image.digest(),
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("oci-image: {e}");
        std::process::exit(1);
    }
}
