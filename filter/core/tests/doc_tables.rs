//! A field's default written by hand in a docs table (README.md, docs/**/*.md) is the
//! field table's: a row `` | `name` | default | meaning | `` naming a configuration
//! field must show its default as the generated reference does (it may leave off the
//! note after it). The generated reference itself is checked against the table in
//! dedup-core's unit tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_core::config::fields::field;
use std::path::{Path, PathBuf};

/// The generated reference says so in its first line; it is not hand-written.
const GENERATED: &str = "Generated from dedup-core's field table";

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.map(|e| e.unwrap().path()) {
        if path.is_dir() && !path.ends_with("book") {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// `(field name, default cell)` of a three-column table row naming one field.
fn field_row(line: &str) -> Option<(String, &str)> {
    let cells: Vec<&str> = line.strip_prefix("| `")?.splitn(3, " | ").collect();
    let [name, default, _meaning] = cells[..] else {
        return None;
    };
    let name = name.strip_suffix('`')?;
    if name.contains('`') {
        return None; // Several names in one row (`rules[i].key`, `.scope`, …).
    }
    Some((name.replace("rules[i].", "rules[]."), default))
}

#[test]
fn hand_written_defaults_in_the_docs_are_the_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let md = std::fs::read_to_string(&file).unwrap();
        if md.contains(GENERATED) {
            continue;
        }
        for (i, line) in md.lines().enumerate() {
            let Some((name, default)) = field_row(line) else {
                continue;
            };
            let Some(f) = field(&name) else {
                continue;
            };
            let ours = f.default_text();
            if !ours.starts_with(default) {
                wrong.push(format!(
                    "{}:{}: `{name}` shows the default {default:?}, the field table {ours:?} \
                     (filter/core/src/config/fields.rs)",
                    file.strip_prefix(&root).unwrap_or(&file).display(),
                    i + 1
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_row_is_read_as_name_and_default() {
    assert_eq!(
        field_row("| `rules[i].bypass` | `false` | `true`: … |"),
        Some(("rules[].bypass".to_string(), "`false`"))
    );
    assert_eq!(
        field_row("| `rules[i].key`, `.scope` | the top-level object | … |"),
        None
    );
    assert_eq!(field_row("| request | answer |"), None);
}
