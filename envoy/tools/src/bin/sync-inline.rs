//! `sync-inline [--check] [ROOT]`: brings the inline copies of configuration files in
//! the book and the Istio files up to date ([`dedup_tools::inline`]; `make docs-ref`),
//! or with `--check` lists those that differ and exits 1 (`make docs-check`).

use std::path::PathBuf;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let root = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(dedup_tools::paths::workspace_root);
    let mut stale = 0;
    for path in dedup_tools::inline::files(&root) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        match dedup_tools::inline::sync_text(&path, &text) {
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::from(2);
            }
            Ok((_, changed)) if changed.is_empty() => {}
            Ok((new, changed)) => {
                for (line, spec) in changed {
                    stale += 1;
                    if check {
                        println!("{shown}:{line}: the inline copy of `{spec}` differs from its source: run `make docs-ref`");
                    } else {
                        println!("{shown}:{line}: `{spec}` brought up to date");
                    }
                }
                if !check {
                    if let Err(e) = std::fs::write(&path, new) {
                        eprintln!("{shown}: {e}");
                        return std::process::ExitCode::from(2);
                    }
                }
            }
        }
    }
    std::process::ExitCode::from(u8::from(check && stale > 0))
}
