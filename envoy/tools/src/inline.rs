//! Copies of configuration files written inline where they are shown, so every page
//! reads whole on GitHub (which renders no mdBook `{{#include}}`) and every shipped
//! Istio file carries the one filter JSON it is made from. `src/bin/sync-inline.rs`
//! rewrites them (`make docs-ref`); with `--check` it only reports the copies that
//! differ from their sources, and `.ci/check-docs.py` (`make docs-check`) fails on them.
//!
//! In markdown (`docs/src/**/*.md`), between a marker line and `<!-- inline end -->`:
//! - `<!-- inline: PATH -->`: the file, fenced as `yaml` or `json` by its extension;
//! - `<!-- inline: PATH.md:ANCHOR -->`: the markdown between `ANCHOR: name` and
//!   `ANCHOR_END: name` (a whole `.md` file without one), as it is;
//! - `<!-- inline: render TEMPLATE CONFIG [--members CLUSTER=HOST:PORT,…]… -->`:
//!   `dedupctl render TEMPLATE --config CONFIG [--members …]` with its default ports and
//!   module path, fenced as `yaml`.
//!
//! In YAML (`envoy/configs/**/*.yaml`), between `# inline: PATH as FIELD` and
//! `# inline end`, at the marker's indentation: `FIELD: ` and the JSON file, as a
//! flow mapping (`pluginConfig`, an Istio WasmPlugin's) or as a single-quoted string
//! (`value`, a StringValue's); the result is read back and must be the file's JSON.
//!
//! Paths are relative to the file holding the marker.

use std::path::{Path, PathBuf};

const END_MD: &str = "<!-- inline end -->";
const END_YAML: &str = "# inline end";

/// One file's text with its inline copies brought up to date; the markers whose
/// copies changed (their line numbers and specs).
pub fn sync_text(path: &Path, text: &str) -> Result<(String, Vec<(usize, String)>), String> {
    let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    let dir = path.parent().unwrap_or(Path::new("."));
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len());
    let mut changed = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push_str(line);
        let Some(spec) = marker(line, yaml) else {
            i += 1;
            continue;
        };
        let end_mark = if yaml { END_YAML } else { END_MD };
        let Some(end) = (i + 1..lines.len()).find(|&j| lines[j].trim() == end_mark) else {
            return Err(format!(
                "{}:{}: `{}` has no `{end_mark}` line after it",
                path.display(),
                i + 1,
                line.trim()
            ));
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let want = generate(dir, &spec, yaml, indent)
            .map_err(|e| format!("{}:{}: {spec}: {e}", path.display(), i + 1))?;
        let have: String = lines[i + 1..end].concat();
        if have != want {
            changed.push((i + 1, spec));
        }
        out.push_str(&want);
        out.push_str(lines[end]);
        i = end + 1;
    }
    Ok((out, changed))
}

/// The spec of a marker line, if it is one.
fn marker(line: &str, yaml: bool) -> Option<String> {
    let t = line.trim();
    let spec = if yaml {
        t.strip_prefix("# inline: ")?
    } else {
        t.strip_prefix("<!-- inline: ")?.strip_suffix("-->")?
    };
    Some(spec.trim().to_string())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn fenced(lang: &str, body: &str) -> String {
    let nl = if body.ends_with('\n') { "" } else { "\n" };
    format!("```{lang}\n{body}{nl}```\n")
}

/// The copy a spec stands for.
fn generate(dir: &Path, spec: &str, yaml: bool, indent: &str) -> Result<String, String> {
    let words: Vec<&str> = spec.split_whitespace().collect();
    if yaml {
        let [file, "as", field] = words[..] else {
            return Err("expected `# inline: FILE.json as pluginConfig|value`".into());
        };
        return yaml_field(&dir.join(file), field, indent);
    }
    match words[..] {
        ["render", template, config, ref more @ ..] => {
            // `--members CLUSTER=HOST:PORT,…` pairs may follow (`dedupctl render`'s).
            let mut members = Vec::new();
            for pair in more.chunks(2) {
                match pair {
                    ["--members", m] => members.push(crate::members::Members::parse(m)?),
                    _ => return Err(format!("after the render pair, only `--members CLUSTER=HOST:PORT,…`: {}", pair.join(" "))),
                }
            }
            let r = crate::render::Render {
                template: dir.join(template).display().to_string(),
                configs: vec![(
                    "FILTER_CONFIG".into(),
                    dir.join(config).display().to_string(),
                )],
                members,
                ..Default::default()
            };
            let text = r.run(&mut std::io::sink()).map_err(|e| e.join("; "))?;
            Ok(fenced("yaml", &text))
        }
        [file] => {
            let (file, anchor) = match file.split_once(".md:") {
                Some((f, a)) => (format!("{f}.md"), Some(a)),
                None => (file.to_string(), None),
            };
            let path: PathBuf = dir.join(&file);
            let text = read(&path)?;
            match path.extension().and_then(|e| e.to_str()) {
                Some("yaml" | "yml") => Ok(fenced("yaml", &text)),
                Some("json") => Ok(fenced("json", &text)),
                Some("md") => {
                    let body = match anchor {
                        Some(a) => {
                            anchor_region(&text, a).ok_or(format!("{file} has no ANCHOR: {a}"))?
                        }
                        None => text,
                    };
                    Ok(body)
                }
                _ => Err(format!("{file}: no language for this file")),
            }
        }
        _ => Err(
            "expected `<!-- inline: FILE -->` or `<!-- inline: render TEMPLATE CONFIG [--members CLUSTER=HOST:PORT,…]… -->`".into(),
        ),
    }
}

/// The lines between `ANCHOR: name` and `ANCHOR_END: name`, each ending in a newline.
fn anchor_region(text: &str, name: &str) -> Option<String> {
    let begin = format!("ANCHOR: {name}");
    let end = format!("ANCHOR_END: {name}");
    let mut lines = text.lines();
    lines.find(|l| l.contains(&begin) && !l.contains("ANCHOR_END"))?;
    let mut out = String::new();
    for l in lines {
        if l.contains(&end) {
            return Some(out);
        }
        out.push_str(l);
        out.push('\n');
    }
    None
}

/// `FIELD: ` and the JSON file at `indent`: a flow mapping (`pluginConfig`) or a
/// single-quoted string (`value`), checked by reading it back.
fn yaml_field(file: &Path, field: &str, indent: &str) -> Result<String, String> {
    let text = read(file)?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = match field {
        "pluginConfig" => {
            let cont = format!("{indent}  ");
            let body: Vec<String> = text
                .trim_end()
                .lines()
                .enumerate()
                .map(|(n, l)| {
                    if n == 0 {
                        l.to_string()
                    } else {
                        format!("{cont}{l}")
                    }
                })
                .collect();
            format!("{indent}{field}: {}\n", body.join("\n"))
        }
        "value" => format!(
            "{indent}{field}: '{}'\n",
            crate::render::one_line_json(&text).replace('\'', "''")
        ),
        other => return Err(format!("`as {other}`: expected pluginConfig or value")),
    };
    // Read back: the YAML must hold exactly the file's JSON.
    let wrapped = out
        .lines()
        .map(|l| l.strip_prefix(indent).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let back = yaml_rust2::YamlLoader::load_from_str(&wrapped)
        .map_err(|e| format!("the written YAML does not parse: {e}"))?;
    let node = back.first().map(|d| &d[field]).ok_or("no YAML written")?;
    let got = match node {
        yaml_rust2::Yaml::String(s) => serde_json::from_str(s).map_err(|e| e.to_string())?,
        other => crate::envoy_yaml::to_json(other)?,
    };
    if got != json {
        return Err(format!(
            "the YAML written does not read back as {}",
            file.display()
        ));
    }
    Ok(out)
}

/// The files that may hold markers under `root`: `envoy/configs/**/*.yaml`, then
/// `docs/src/**/*.md`, each sorted.
pub fn files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join("envoy/configs"), "yaml", &mut out);
    out.sort();
    // The book after the YAML files: a page may show an Istio file, written first.
    let mut pages = Vec::new();
    walk(&root.join("docs/src"), "md", &mut pages);
    pages.sort();
    out.extend(pages);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn markers_are_filled_and_a_stale_copy_is_reported() {
        let dir = std::env::temp_dir().join(format!("inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("c.json"),
            "{\"key\": {\"required\": true},\n \"replayed_header\": \"x-it's\"}\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("a.md"),
            "x\n<!-- ANCHOR: s -->\nkept\n<!-- ANCHOR_END: s -->\n",
        )
        .unwrap();
        let md = "# P\n<!-- inline: c.json -->\nold\n<!-- inline end -->\n<!-- inline: a.md:s -->\n<!-- inline end -->\n";
        let (out, changed) = sync_text(&dir.join("p.md"), md).unwrap();
        assert_eq!(
            out,
            "# P\n<!-- inline: c.json -->\n```json\n{\"key\": {\"required\": true},\n \"replayed_header\": \"x-it's\"}\n```\n<!-- inline end -->\n<!-- inline: a.md:s -->\nkept\n<!-- inline end -->\n"
        );
        assert_eq!(changed.len(), 2);
        let (again, changed) = sync_text(&dir.join("p.md"), &out).unwrap();
        assert_eq!((again, changed.len()), (out, 0));

        let y = "spec:\n  # inline: c.json as pluginConfig\n  # inline end\n  v:\n    # inline: c.json as value\n    # inline end\n";
        let (out, _) = sync_text(&dir.join("w.yaml"), y).unwrap();
        let doc = &yaml_rust2::YamlLoader::load_from_str(&out).unwrap()[0];
        assert_eq!(
            doc["spec"]["pluginConfig"]["replayed_header"].as_str(),
            Some("x-it's")
        );
        assert_eq!(
            doc["spec"]["v"]["value"].as_str(),
            Some("{\"key\": {\"required\": true}, \"replayed_header\": \"x-it's\"}")
        );
        assert!(sync_text(&dir.join("p.md"), "<!-- inline: c.json -->\n").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
