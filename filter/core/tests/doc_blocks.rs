//! Every JSON block in the docs is parsed: README.md and every `*.md` under docs/
//! (recursively, whatever exists when the test runs).
//!
//! The rule: a fenced block whose info string is exactly `json` is a filter
//! configuration and must pass the filter's own parser (`Config::parse`, what
//! `on_configure` and `dedupctl check-config` run). A `json` block that is not a
//! configuration (an API answer, an access-log line) says so on the line before its
//! fence with `<!-- not-a-config -->`; it must still be JSON (one or more values, e.g.
//! JSON lines). Blocks of other languages (`yaml`, `console`, `text`, …) are not read.
//! mdBook's `{{#include FILE}}` (also `FILE:START:END` and `FILE:ANCHOR`) inside a block
//! is replaced by the file's text first, relative to the markdown file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_core::config::Config;
use std::path::{Path, PathBuf};

mod support {
    pub mod schema_check;
}

const NOT_A_CONFIG: &str = "<!-- not-a-config -->";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            // mdBook's output is generated from the sources read here.
            if path.file_name().is_some_and(|n| n == "book") {
                continue;
            }
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// One fenced `json` block: where it starts, whether it is marked, its text.
struct Block {
    line: usize,
    config: bool,
    text: String,
}

fn json_blocks(md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        let Some(info) = fence.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        i += 1;
        if info.trim() == "json" {
            let marked = start > 0 && lines[start - 1].trim() == NOT_A_CONFIG;
            out.push(Block {
                line: start + 1,
                config: !marked,
                text: body.join("\n"),
            });
        }
    }
    out
}

/// `{{#include FILE}}`, `{{#include FILE:START:END}}` (lines, 1-based, either may be
/// empty) and `{{#include FILE:ANCHOR}}` resolved against `dir`.
fn resolve_includes(text: &str, dir: &Path) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("{{#include ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "{{#include ".len()..];
        let end = after.find("}}").ok_or("an unclosed {{#include")?;
        let spec = after[..end].trim();
        let mut parts = spec.split(':');
        let file = dir.join(parts.next().unwrap_or(""));
        let whole =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let lines: Vec<&str> = whole.lines().collect();
        let picked: Vec<&str> = match (parts.next(), parts.next()) {
            (None, _) => lines,
            (Some(a), Some(b)) => {
                let from = a.parse::<usize>().unwrap_or(1).max(1) - 1;
                let to = b.parse::<usize>().unwrap_or(lines.len()).min(lines.len());
                lines[from.min(to)..to].to_vec()
            }
            (Some(anchor), None) => match anchor.parse::<usize>() {
                Ok(n) => lines[n.max(1) - 1..].to_vec(),
                Err(_) => {
                    let begin = lines
                        .iter()
                        .position(|l| l.contains(&format!("ANCHOR: {anchor}")))
                        .ok_or(format!("{}: no anchor {anchor}", file.display()))?;
                    let stop = lines
                        .iter()
                        .position(|l| l.contains(&format!("ANCHOR_END: {anchor}")))
                        .ok_or(format!("{}: no end of anchor {anchor}", file.display()))?;
                    lines[begin + 1..stop].to_vec()
                }
            },
        };
        out.push_str(&picked.join("\n"));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[test]
fn every_json_block_in_the_docs_parses() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    let schema = dedup_core::config::fields::json_schema();
    let (mut configs, mut others, mut failures) = (0, 0, Vec::new());
    for file in &files {
        let md =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for block in json_blocks(&md) {
            let at = format!("{shown}:{}", block.line);
            let text = match resolve_includes(&block.text, file.parent().unwrap()) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{at}: {e}"));
                    continue;
                }
            };
            if block.config {
                configs += 1;
                if let Err(e) = Config::parse(text.as_bytes()) {
                    failures.push(format!(
                        "{at}: {e} (not a filter configuration? put {NOT_A_CONFIG} on the line before the fence)"
                    ));
                } else if let Ok(v) = serde_json::from_str(&text) {
                    let errors = support::schema_check::validate(&schema, &v);
                    if !errors.is_empty() {
                        failures.push(format!("{at}: the filter takes it, docs/config.schema.json does not: {errors:?}"));
                    }
                }
            } else {
                others += 1;
                let values =
                    serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>();
                let mut n = 0;
                for v in values {
                    match v {
                        Ok(_) => n += 1,
                        Err(e) => {
                            failures.push(format!("{at}: not JSON: {e}"));
                            break;
                        }
                    }
                }
                if n == 0 {
                    failures.push(format!("{at}: an empty JSON block"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} JSON blocks in the docs do not parse:\n{}",
        failures.len(),
        configs + others,
        failures.join("\n")
    );
    // README alone has four configurations; finding none means the scan is broken.
    assert!(
        configs >= 4,
        "only {configs} configuration blocks found in {files:?}"
    );
}

#[test]
fn the_rule_tells_configs_from_other_blocks() {
    let md = "```json\n{\"ttl_seconds\": 5}\n```\n\n<!-- not-a-config -->\n```json\n{\"record\": \"ab\"}\n```\n```yaml\na: 1\n```\n";
    let blocks = json_blocks(md);
    assert_eq!(blocks.len(), 2);
    assert!(blocks[0].config && !blocks[1].config);
    assert_eq!((blocks[0].line, blocks[1].line), (1, 6));
    assert!(
        Config::parse(blocks[1].text.as_bytes()).is_err(),
        "a marked block is not a config"
    );
    let dir = std::env::temp_dir().join(format!("doc-blocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("c.json"),
        "x\n// ANCHOR: cfg\n{\"capacity\": 16}\n// ANCHOR_END: cfg\ny\n",
    )
    .unwrap();
    assert_eq!(
        resolve_includes("{{#include c.json:cfg}}", &dir).unwrap(),
        "{\"capacity\": 16}"
    );
    assert_eq!(
        resolve_includes("{{#include c.json:3:3}}", &dir).unwrap(),
        "{\"capacity\": 16}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
