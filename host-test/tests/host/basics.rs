use crate::*;
use host_test::{Error, Request, SimEnvoy};

#[test]
fn modules_import_only_what_the_host_provides() {
    for module in ["empty_filter.wasm", "shared_data_probe.wasm"] {
        let imports = host_test::module_imports(&host_test::dist(module)).unwrap();
        eprintln!("{module}: {imports:?}");
        assert!(imports.iter().any(|i| i == "env::proxy_log"), "{imports:?}");
        // Building checks every import; an unknown one is an error naming it.
        SimEnvoy::builder(host_test::dist(module)).build().unwrap();
    }
}

/// A test written against the old name still builds and runs (deprecated, one release).
#[test]
#[allow(deprecated)]
fn the_old_name_envoy_still_builds_a_sim_envoy() {
    let mut envoy: SimEnvoy = host_test::Envoy::builder(host_test::dist("empty_filter.wasm"))
        .build()
        .unwrap();
    let resp = envoy.request(0, Request::post("/x").body("hi")).unwrap();
    assert_eq!(resp.status, 200);
}

#[test]
fn empty_filter_passes_requests_to_the_upstream() {
    let mut envoy = SimEnvoy::builder(host_test::dist("empty_filter.wasm"))
        .build()
        .unwrap();
    let resp = envoy.request(0, Request::post("/x").body("hello")).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "upstream ok");
    assert!(resp.upstream_called);
    let up = resp.upstream_request.unwrap();
    assert_eq!(up.body_str(), "hello");
    assert_eq!(up.path(), "/x");
}

#[test]
fn missing_wasm_names_the_build_command() {
    let err = build_error(SimEnvoy::builder("/nonexistent/filter.wasm"));
    assert!(matches!(err, Error::WasmMissing(_)));
    assert!(err.to_string().contains("make wasm"), "{err}");
}

#[test]
fn probe_passes_plain_requests() {
    let mut envoy = probe(1);
    let resp = envoy.request(0, Request::get("/")).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-probe-response-seen"), Some("200"));
    assert!(envoy.log_contains("probe log: probe= status=200"));
}

#[test]
fn unknown_import_is_named() {
    // A minimal module: one type () -> (), one import env::proxy_nonexistent.
    let mut wasm = b"\0asm\x01\0\0\0".to_vec();
    wasm.extend_from_slice(&[0x01, 0x04, 0x01, 0x60, 0x00, 0x00]);
    wasm.extend_from_slice(&[0x02, 0x19, 0x01, 0x03]);
    wasm.extend_from_slice(b"env");
    wasm.push(17);
    wasm.extend_from_slice(b"proxy_nonexistent");
    wasm.extend_from_slice(&[0x00, 0x00]);
    let path = std::env::temp_dir().join(format!("host-test-unknown-{}.wasm", std::process::id()));
    std::fs::write(&path, wasm).unwrap();
    let err = build_error(SimEnvoy::builder(&path));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(err, Error::UnknownImports(_)), "{err}");
    assert!(err.to_string().contains("env::proxy_nonexistent"), "{err}");
}
