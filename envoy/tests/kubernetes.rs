//! The Kubernetes manifests (envoy/ops/kubernetes/) are valid against Kubernetes'
//! own schemas (`kubernetes-validate --strict`, which ships them: no cluster, no
//! network), and the Envoy configuration inside the ConfigMap passes `envoy --mode
//! validate` with the built module (Envoy loads it and runs the filter's
//! configuration check); the Deployment mounts what that configuration reads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_envoy::paths::{dedup_wasm, scratch_dir, workspace_root};
use dedup_envoy::EnvoyProcess;
use std::path::{Path, PathBuf};
use std::process::Command;

const DIR: &str = "envoy/ops/kubernetes";
const MODULE_PATH: &str = "/etc/envoy/module/dedup_filter.wasm";

fn manifests() -> Vec<PathBuf> {
    let dir = workspace_root().join(DIR);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn read(name: &str) -> String {
    let p = workspace_root().join(DIR).join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `kubernetes-validate --strict --quiet FILES`: whether all passed, and its output.
fn kubernetes_validate(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .arg("--quiet")
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run kubernetes-validate ({e}): run `make deps` (pip kubernetes-validate)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_manifests_are_valid_kubernetes_objects() {
    let files = manifests();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "namespace.yaml",
        "etcd.yaml",
        "envoy-config.yaml",
        "proxy-dedup.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {DIR}");
    }
    let (ok, out) = kubernetes_validate(&files);
    assert!(ok, "kubernetes-validate --strict {DIR}/*.yaml:\n{out}");
    // The validator catches what it should: a misspelt field, a wrong type.
    let dir = scratch_dir("k8s-validate").unwrap();
    let deployment = read("proxy-dedup.yaml");
    for (what, from, to) in [
        (
            "a misspelt field",
            "terminationGracePeriodSeconds",
            "terminationGracePeriod",
        ),
        ("a wrong type", "replicas: 2", "replicas: two"),
    ] {
        assert!(deployment.contains(from), "{from}");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, deployment.replacen(from, to, 1)).unwrap();
        let (ok, out) = kubernetes_validate(&[bad]);
        assert!(!ok, "kubernetes-validate passed {what}: {out}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The block scalar under `  <key>: |` in `text` (a ConfigMap's data), dedented.
fn block_scalar(text: &str, key: &str) -> String {
    let head = format!("  {key}: |");
    let mut lines = text.lines().skip_while(|l| l.trim_end() != head);
    assert!(lines.next().is_some(), "no `{head}` in the ConfigMap");
    let mut out = String::new();
    for l in lines {
        if !l.trim().is_empty() && !l.starts_with("    ") {
            break;
        }
        out.push_str(l.get(4..).unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The ConfigMap's envoy.yaml with the module's path in the pod replaced by `wasm`.
fn envoy_yaml(wasm: &Path) -> String {
    let yaml = block_scalar(&read("envoy-config.yaml"), "envoy.yaml");
    assert!(
        yaml.contains(MODULE_PATH),
        "envoy.yaml names no {MODULE_PATH}"
    );
    yaml.replace(MODULE_PATH, &wasm.display().to_string())
}

#[test]
fn the_configmaps_envoy_config_passes_envoy_validate_with_the_module() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let yaml = envoy_yaml(&wasm);
    EnvoyProcess::validate("k8s-envoy", &yaml).unwrap_or_else(|e| panic!("{e}"));
    // Validation runs the filter's configuration check: a misspelt field fails it.
    let bad = yaml.replacen(r#""required": true"#, r#""requird": true"#, 1);
    assert_ne!(bad, yaml);
    let err = EnvoyProcess::validate("k8s-envoy-bad", &bad).unwrap_err();
    assert!(
        err.0.contains("field `key.requird`: unknown field"),
        "{err}"
    );
}

#[test]
fn the_deployment_mounts_what_the_envoy_config_reads() {
    let deployment = read("proxy-dedup.yaml");
    let config = read("envoy-config.yaml");
    // `-c DIR/envoy.yaml` where the proxy-dedup-envoy ConfigMap is mounted.
    assert!(config.contains("name: proxy-dedup-envoy"));
    assert!(config.contains("  envoy.yaml: |"));
    let (config_dir, module_dir) = ("/etc/envoy/config", "/etc/envoy/module");
    assert!(deployment.contains(&format!("- {config_dir}/envoy.yaml")));
    for (volume, dir, configmap) in [
        ("config", config_dir, "proxy-dedup-envoy"),
        ("module", module_dir, "proxy-dedup-module"),
    ] {
        assert!(
            deployment.contains(&format!("- name: {volume}\n          mountPath: {dir}\n")),
            "volume {volume} not mounted at {dir}"
        );
        assert!(
            deployment.contains(&format!(
                "- name: {volume}\n        configMap:\n          name: {configmap}\n"
            )),
            "volume {volume} is not the ConfigMap {configmap}"
        );
    }
    assert!(MODULE_PATH.starts_with(module_dir));
    // The module ConfigMap's key is the file name Envoy reads, as the command that
    // makes it says.
    assert!(deployment.contains("--from-file=dedup_filter.wasm=dist/dedup_filter.wasm"));
    // The etcd names Envoy resolves are the StatefulSet's headless Service.
    let etcd = read("etcd.yaml");
    assert!(etcd.contains("  clusterIP: None\n") && etcd.contains("  serviceName: etcd\n"));
    assert!(config.contains("address: etcd.proxy-dedup.svc.cluster.local, port_value: 2379"));
    assert!(etcd.contains(
        "--advertise-client-urls=http://$(POD_NAME).etcd.proxy-dedup.svc.cluster.local:2379"
    ));
}
