//! The `dedupctl` binary as a shell runs it: `--version` prints the workspace's version
//! (read here from the workspace's Cargo.toml, not from the crate the binary is built
//! from), `--help` prints every command and exits 0 wherever a flag may stand, and a
//! usage error still exits 2 on standard error. No Envoy needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// `dedupctl args`: (exit code, stdout, stderr).
fn dedupctl(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupctl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `version = "…"` of the workspace's `[workspace.package]`, read from the file.
fn workspace_version() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let toml = std::fs::read_to_string(path).unwrap();
    let section = toml
        .split("[workspace.package]")
        .nth(1)
        .unwrap_or_else(|| panic!("no [workspace.package] in {path}"));
    let line = section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find(|l| l.trim_start().starts_with("version"))
        .unwrap_or_else(|| panic!("no version in [workspace.package] of {path}"));
    let v = line.split('"').nth(1).unwrap().to_string();
    assert!(
        v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()),
        "not a version: {line:?}"
    );
    v
}

#[test]
fn version_prints_the_workspace_version() {
    let want = format!("dedupctl {}\n", workspace_version());
    for flag in ["--version", "-V"] {
        let (code, out, err) = dedupctl(&[flag]);
        assert_eq!(code, Some(0), "{flag}: {err}");
        assert_eq!(out, want, "{flag}");
        assert_eq!(err, "", "{flag}");
    }
}

/// The CHANGELOG has a section for the version the binary says it is.
#[test]
fn the_changelog_has_the_workspace_version() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../CHANGELOG.md");
    let log = std::fs::read_to_string(path).unwrap();
    let heading = format!("## {}", workspace_version());
    assert!(
        log.lines().any(|l| l.starts_with(&heading)),
        "no `{heading}` section in {path}"
    );
}

#[test]
fn help_exits_0_and_names_every_command() {
    let commands = [
        "get",
        "purge",
        "stats",
        "check-config",
        "envoy-filter",
        "methods",
        "schema",
        "reference",
        "--version",
    ];
    // First, after a command's flags, after an offline command, in place of its file.
    let cases: [&[&str]; 7] = [
        &["--help"],
        &["-h"],
        &["help"],
        &["--addr", "127.0.0.1:1", "get", "--help"],
        &["stats", "-h"],
        &["check-config", "--help"],
        &["envoy-filter", "filter.json", "--help"],
    ];
    for args in cases {
        let (code, out, err) = dedupctl(args);
        assert_eq!(code, Some(0), "{args:?}: stderr {err:?}");
        assert_eq!(err, "", "{args:?}");
        assert!(out.starts_with("usage: dedupctl"), "{args:?}: {out}");
        for c in commands {
            assert!(out.contains(c), "{args:?}: help names no {c}:\n{out}");
        }
        assert!(out.contains("exit status"), "{args:?}: {out}");
    }
}

#[test]
fn usage_errors_still_exit_2_on_stderr() {
    // No command, an unknown one, a flag without its value, a version with more after it;
    // and a key that happens to read `--help` is a key, not a request for help (the call
    // then fails: nothing listens on port 1).
    let cases: [&[&str]; 5] = [
        &[],
        &["frobnicate"],
        &["get", "--key"],
        &["--version", "get"],
        &["--addr", "127.0.0.1:1", "get", "--key", "--help"],
    ];
    for args in cases {
        let (code, out, err) = dedupctl(args);
        assert_eq!(code, Some(2), "{args:?}: stdout {out:?}");
        assert_eq!(out, "", "{args:?}");
        assert!(!err.is_empty(), "{args:?}");
    }
}
