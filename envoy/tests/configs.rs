//! Every Envoy config in envoy/configs is loaded by the real Envoy; the main
//! ones also serve traffic. The Istio example cannot be loaded by Envoy: its
//! plugin configuration is checked by the filter instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::config::{render, LDS_LISTENER, SINGLE_NODE_LDS};
use dedup_envoy::paths::{
    config_file, dedup_wasm, dist_wasm, empty_wasm, scratch_dir, workspace_root,
};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request};
use serde_json::json;
use std::time::Duration;

fn config_files() -> Vec<std::path::PathBuf> {
    let dir = workspace_root().join("envoy").join("configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "configs in {}: {files:?}", dir.display());
    files
}

fn is_istio(text: &str) -> bool {
    text.contains("kind: WasmPlugin") || text.contains("kind: EnvoyFilter")
}

#[test]
fn every_envoy_config_passes_envoy_validate() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    for file in config_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        if is_istio(&text) {
            continue;
        }
        let mut vars = vec![
            ("LISTEN_PORT", "10000".to_string()),
            ("ADMIN_PORT", "9901".into()),
            ("UPSTREAM_PORT", "8080".into()),
            ("WASM_PATH", wasm.display().to_string()),
            ("FILTER_CONFIG", r#"{"key": {"required": true}}"#.into()),
            ("DEDUP_METHODS", "POST|PATCH".into()),
            // admin-api.yaml: the operator API listener.
            ("ADMIN_API_PORT", "9902".into()),
            ("ADMIN_FILTER_CONFIG", r#"{"role": "admin"}"#.into()),
            // remote-module.yaml (validate mode does not fetch the module).
            ("MODULE_PORT", "8000".into()),
            ("MODULE_SHA256", "0".repeat(64)),
        ];
        // The LDS bootstrap names its listener file: render that too. (Envoy's
        // validate mode does not read LDS files; lds_and_jwt_scope_configs_
        // serve_traffic loads the listener for real.)
        let lds_dir = scratch_dir("validate-lds").unwrap();
        let listener = lds_dir.join("listeners.yaml");
        if text.contains("{{LDS_PATH}}") {
            let lt = std::fs::read_to_string(config_file(LDS_LISTENER)).unwrap();
            let rendered = render(&lt, &vars).unwrap_or_else(|e| panic!("{LDS_LISTENER}: {e}"));
            std::fs::write(&listener, rendered).unwrap();
            vars.push(("LDS_DIR", lds_dir.display().to_string()));
            vars.push(("LDS_PATH", listener.display().to_string()));
        }
        let yaml = render(&text, &vars).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        EnvoyProcess::validate("validate", &yaml)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let _ = std::fs::remove_dir_all(&lds_dir);
    }
}

/// Every shipped Envoy config (the LDS listener too, not the Istio example, which is
/// no Envoy config), with its text and how many data-plane dedup filters it has (the
/// admin role's is `proxy_dedup_admin` and answers the operator API only).
fn envoy_templates() -> Vec<(std::path::PathBuf, String, usize)> {
    let mut files = config_files();
    files.push(config_file(LDS_LISTENER));
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let filters = text
                .lines()
                .filter(|l| l.trim() == "- name: proxy_dedup")
                .count();
            (file, text, filters)
        })
        .filter(|(_, text, _)| !is_istio(text))
        .collect()
}

#[test]
fn every_template_with_the_filter_logs_decision_record_and_rule() {
    // docs/src/operations/access-logs.md: every shipped template logs the three per request.
    for (file, text, filters) in envoy_templates() {
        for field in ["decision", "record", "rule"] {
            let wanted = format!("%FILTER_STATE(wasm.proxy_dedup_{field}:PLAIN)%");
            let logged = text.matches(&wanted).count();
            assert!(
                logged >= filters,
                "{} has {filters} dedup filter(s) but logs `{wanted}` {logged} time(s)",
                file.display()
            );
        }
    }
}

/// The configs added for issue 8 exist (so the loop above covers them).
#[test]
fn jwt_scope_and_lds_configs_are_present() {
    let names: Vec<String> = config_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["jwt-scope.yaml", SINGLE_NODE_LDS] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    assert!(config_file(LDS_LISTENER).is_file());
}

#[test]
fn single_node_and_no_filter_configs_serve_traffic() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    for cfg in [
        EnvoyConfig::single_node(upstream.port(), &wasm, "{}").unwrap(),
        EnvoyConfig::no_filter(upstream.port()).unwrap(),
    ] {
        let name = cfg
            .template
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let envoy = EnvoyProcess::start("configs", cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = envoy.send(&Request::get("/healthz")).unwrap();
        assert_eq!(r.status, 200, "{name}: {}", r.summary());
        let r = envoy
            .send(&Request::post("/orders/config-check").key(&name).body("{}"))
            .unwrap();
        assert_eq!(r.status, 200, "{name}: {}", r.summary());
    }
}

/// The LDS template serves traffic through the dedup filter, and a pushed
/// listener file is taken; the JWT example refuses requests without a valid
/// token and serves those with one (the tenant claim reaching the upstream
/// as x-tenant).
#[test]
fn lds_and_jwt_scope_configs_serve_traffic() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();

    let cfg = EnvoyConfig::single_node_lds(upstream.port(), &wasm, "{}").unwrap();
    let mut envoy = EnvoyProcess::start("configs-lds", cfg).unwrap_or_else(|e| panic!("LDS: {e}"));
    let req = Request::post("/orders/config-check").key("lds").body("{}");
    let first = envoy.send(&req).unwrap();
    assert_executed(&first);
    assert_replay_of(&envoy.send(&req).unwrap(), &first);
    let before = envoy.stat("listener_manager.lds.update_success").unwrap();
    envoy
        .push_filter_config(r#"{"key": {"required": true}}"#)
        .unwrap();
    envoy
        .wait_stat_at_least(
            "listener_manager.lds.update_success",
            before + 1,
            Duration::from_secs(15),
        )
        .unwrap();
    // The pushed config requires a key.
    let end = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = envoy
            .send(&Request::post("/orders/config-check").body("{}"))
            .unwrap();
        if r.status == 400 {
            assert_problem(&r, 400, "missing-key");
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "push not in effect: {}",
            r.summary()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(envoy);

    let cfg = EnvoyConfig::from_template(
        &config_file("jwt-scope.yaml"),
        upstream.port(),
        &wasm,
        &jwt_recipe(),
    )
    .unwrap();
    let envoy =
        EnvoyProcess::start("configs-jwt", cfg).unwrap_or_else(|e| panic!("jwt-scope: {e}"));
    let req = Request::post("/orders/config-check").key("jwt").body("{}");
    let r = envoy.send(&req).unwrap();
    assert_eq!(r.status, 401, "no token: {}", r.summary());
    let token = example_jwt(Some("tenant-config"));
    let r = envoy
        .send(
            &req.clone()
                .header("authorization", &format!("Bearer {token}")),
        )
        .unwrap();
    assert_executed(&r);
    assert_eq!(json(&r)["tenant"], "tenant-config");
    // The filter config written in the file requires a key.
    let r = envoy
        .send(
            &Request::post("/orders/config-check")
                .header("authorization", &format!("Bearer {token}"))
                .body("{}"),
        )
        .unwrap();
    assert_problem(&r, 400, "missing-key");
}

/// The Istio files, one way each (a WasmPlugin, an EnvoyFilter), carry one filter
/// configuration, envoy/configs/recipes/istio.json: each file's is read back as
/// `dedupctl check-config` reads it, must be that JSON, and is handed to the filter in
/// a real Envoy.
#[test]
fn istio_files_carry_the_one_recipe_config_and_the_filter_accepts_it() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(config_file("recipes/istio.json")).unwrap())
            .unwrap();
    let mut kinds = Vec::new();
    for file in config_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        if !is_istio(&text) {
            continue;
        }
        let found = dedup_tools::envoy_yaml::inspect(&text).unwrap();
        assert_eq!(
            found.filters.len(),
            1,
            "{}: one variant per file",
            file.display()
        );
        let config = found.filters[0].config.clone().unwrap();
        let got: serde_json::Value = serde_json::from_str(&config).unwrap();
        assert_eq!(got, want, "{}: not recipes/istio.json", file.display());
        let cfg = EnvoyConfig::single_node(8080, &wasm, &config).unwrap();
        EnvoyProcess::validate("istio-config", &cfg.render().unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        kinds.push(found.filters[0].at.split(' ').next().unwrap().to_string());
    }
    kinds.sort();
    assert_eq!(kinds, ["EnvoyFilter", "WasmPlugin"]);
}

#[test]
fn a_missing_module_says_run_make_wasm() {
    let e = dist_wasm("no_such_module.wasm").unwrap_err();
    assert!(e.0.contains("run `make wasm`"), "{e}");
}

/// The harness itself, with the do-nothing filter: Envoy starts, chunked and
/// kept-alive requests reach the upstream, stats and prometheus are readable.
#[test]
fn harness_runs_envoy_with_the_empty_filter() {
    let wasm = empty_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    let cfg = EnvoyConfig::single_node(upstream.port(), &wasm, "{}").unwrap();
    let envoy = EnvoyProcess::start("harness-empty", cfg).unwrap();
    let mut conn =
        dedup_envoy::client::Connection::open(envoy.addr(), Duration::from_secs(5)).unwrap();
    for i in 0..3 {
        let r = conn
            .send(&Request::post("/orders/harness").key("k").chunked(
                vec![b"{\"a\":".to_vec(), format!("{i}}}").into_bytes()],
                Duration::from_millis(10),
            ))
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(json(&r)["executions"], i + 1);
        assert_eq!(json(&r)["body_bytes"], 7);
    }
    let r = conn
        .send(&Request::get("/orders/harness?status=503&delay_ms=10"))
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(upstream.executions_for_path("/orders/harness"), 4);
    let execs = envoy.send(&Request::get("/__executions")).unwrap();
    assert_eq!(json(&execs)["by_key"]["k"], 3);
    assert_eq!(envoy.send(&Request::post("/__reset")).unwrap().status, 200);
    assert_eq!(upstream.total_executions(), 0);
    assert!(
        envoy
            .stat("http.ingress_http.downstream_rq_completed")
            .unwrap()
            >= 4
    );
    assert!(envoy
        .prometheus()
        .unwrap()
        .contains("envoy_http_downstream_rq_completed"));
    let per_worker = envoy.connections_per_worker().unwrap();
    assert_eq!(per_worker.len(), 2, "{per_worker:?}");
    let _ = json!({});
}

/// `dedupctl envoy-filter`'s block in a real Envoy: the filter wrapped in Envoy's
/// matching, a GET (no policy deduplicates it) never enters Wasm (the filter counts no
/// request), a POST is deduplicated as ever.
#[test]
fn the_generated_filter_block_skips_methods_no_policy_deduplicates() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    let block = dedup_envoy::envoy_filter::FilterBlock {
        config: r#"{"methods": ["POST", "PATCH"]}"#,
        wasm_path: &wasm.display().to_string(),
        vm_id: "proxy_dedup",
    }
    .render(10)
    .unwrap();
    let template = workspace_root().join("envoy/tests/templates/matcher.yaml");
    let cfg = EnvoyConfig::from_template(&template, upstream.port(), &wasm, "{}")
        .unwrap()
        .with_var("FILTER_BLOCK", block.trim_end());
    let envoy = EnvoyProcess::start("configs-matcher", cfg).unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..3 {
        assert_eq!(envoy.send(&Request::get("/healthz")).unwrap().status, 200);
    }
    let counters = envoy.dedup_counters().unwrap();
    assert_eq!(
        counters.get("requests").copied().unwrap_or(0),
        0,
        "a GET entered the filter: {counters:?}"
    );
    let post = Request::post("/orders/matcher").key("m-1").body("{}");
    let first = envoy.send(&post).unwrap();
    assert_eq!(first.status, 200, "{}", first.summary());
    let again = envoy.send(&post).unwrap();
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(envoy.dedup_counter("requests").unwrap(), 2);
}

/// The shipped templates wrap the data plane's filter in Envoy's matching
/// (`ExtensionWithMatcher` + `SkipFilter`): every one with the filter has the matcher.
#[test]
fn every_template_with_the_filter_skips_the_methods_it_does_not_deduplicate() {
    for (file, text, filters) in envoy_templates() {
        let wrapped = text.matches("action.v3.SkipFilter").count();
        assert_eq!(
            wrapped,
            filters,
            "{}: {filters} dedup filter(s), {wrapped} wrapped in a SkipFilter matcher",
            file.display()
        );
    }
}

/// single-node.yaml's matcher takes its methods from the filter's configuration
/// (`{{DEDUP_METHODS}}`, which the kit fills as `dedupctl methods` prints it): with
/// `"methods": ["PUT"]`, a GET and a POST never enter Wasm, a PUT is deduplicated.
#[test]
fn the_single_node_template_skips_exactly_the_methods_the_config_does_not_deduplicate() {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    let cfg = EnvoyConfig::single_node(upstream.port(), &wasm, r#"{"methods": ["PUT"]}"#).unwrap();
    let envoy = EnvoyProcess::start("configs-methods", cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(envoy.send(&Request::get("/healthz")).unwrap().status, 200);
    let post = Request::post("/orders/methods").key("p-1").body("{}");
    assert_eq!(envoy.send(&post).unwrap().status, 200);
    assert_eq!(envoy.dedup_counter("requests").unwrap_or(0), 0);
    let mut put = post.clone();
    put.method = "PUT".into();
    assert_eq!(envoy.send(&put).unwrap().status, 200);
    let again = envoy.send(&put).unwrap();
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(envoy.dedup_counter("requests").unwrap(), 2);
}

/// The benchmarks' Envoy (`benches/envoy/ceiling.yaml`, `bench::ceiling_config`) starts
/// and serves both its routes: `make bench-envoy` cannot break unseen.
#[test]
fn the_benchmarks_ceiling_config_serves_both_routes() {
    use dedup_envoy::bench::{ceiling_config, BenchFilter, CeilingRoute};
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let filters = [
        BenchFilter::Buffer,
        BenchFilter::Wasm {
            module: wasm,
            config: "{}".into(),
        },
    ];
    for (route, name) in [
        (CeilingRoute::Direct, "direct"),
        (CeilingRoute::Answer, "answer"),
    ] {
        let cfg = ceiling_config(route, &filters, 1, None).unwrap();
        let envoy = EnvoyProcess::start(&format!("configs-ceiling-{name}"), cfg)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let req = Request::post("/orders").key("ceiling").body("{\"a\": 1}");
        let first = envoy.send(&req).unwrap();
        assert_eq!(first.status, 200, "{name}: {}", first.summary());
        let again = envoy.send(&req).unwrap();
        assert_eq!(again.status, 200, "{name}: {}", again.summary());
        // Envoy's own direct_response is no upstream's answer: never stored.
        let stored = matches!(route, CeilingRoute::Answer);
        assert_eq!(is_replayed(&again), stored, "{name}: {}", again.summary());
    }
}
