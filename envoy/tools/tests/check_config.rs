//! `dedupctl check-config FILE` rejects every refused configuration of the config tests
//! (filter/core/testdata/refused-configs.txt) with the error the filter logs, naming the
//! same field: a user's CI can run it before a configuration push. No Envoy needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_core::config::Config;
use std::process::Command;

const CATALOGUE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../filter/core/testdata/refused-configs.txt"
);

/// `(field, configuration)` of each catalogued refused configuration.
fn refused_configs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(CATALOGUE).unwrap_or_else(|e| panic!("{CATALOGUE}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let parts: Vec<&str> = l.splitn(3, '|').map(str::trim).collect();
            assert_eq!(parts.len(), 3, "not `field | reason | config`: {l}");
            (parts[0].to_string(), parts[2].to_string())
        })
        .collect()
}

fn check_config(file: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupctl"))
        .arg("check-config")
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_rejects_each_refused_config_naming_the_field_the_filter_logs() {
    let dir = std::env::temp_dir().join(format!("dedupctl-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = refused_configs();
    assert!(cases.len() > 100, "{} cases in {CATALOGUE}", cases.len());
    for (i, (field, config)) in cases.iter().enumerate() {
        let file = dir.join(format!("case-{i}.json"));
        std::fs::write(&file, config).unwrap();
        let (code, stdout, stderr) = check_config(&file);
        assert_eq!(
            code,
            Some(1),
            "{config}: stdout {stdout:?}, stderr {stderr:?}"
        );
        // The filter logs `proxy-dedup: <error>` in on_configure; dedupctl `<file>: <error>`.
        let logged = Config::parse(config.as_bytes()).unwrap_err();
        assert_eq!(logged.field, *field, "{config}");
        assert_eq!(
            stderr,
            format!("{}: {logged}\n", file.display()),
            "{config}"
        );
        assert!(
            stderr.contains(&format!("invalid configuration: field `{field}`: ")),
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_accepts_a_good_config_and_says_ok() {
    let dir = std::env::temp_dir().join(format!("dedupctl-check-ok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ok.json");
    std::fs::write(&file, r#"{"key": {"required": true}, "ttl_seconds": 600}"#).unwrap();
    let (code, stdout, stderr) = check_config(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, format!("{}: ok\n", file.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}
