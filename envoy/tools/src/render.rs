//! A shipped Envoy template (`envoy/configs/*.yaml`) with its `{{NAME}}` placeholders
//! filled in (`dedupctl render`), each value quoted for where it stands in the YAML.
//! The test kit renders every template it starts through [`fill`], so the tests run
//! exactly what users get.
//!
//! Where a placeholder stands decides how its value is written:
//! - alone on its line (`{{HTTP_FILTERS}}`): a block of YAML, each of its lines
//!   inserted at the placeholder's indentation;
//! - inside a single-quoted scalar (`value: '{{FILTER_CONFIG}}'`): `'` doubled (a JSON
//!   configuration's `#`, `&`, `"` and `:` need nothing there);
//! - inside a double-quoted scalar (`regex: "{{DEDUP_METHODS}}"`): escaped as JSON
//!   escapes a string, which YAML reads the same;
//! - bare (`port_value: {{LISTEN_PORT}}`, `filename: {{WASM_PATH}}`): as it is when
//!   YAML reads it back unchanged as a plain scalar, else single-quoted when the
//!   placeholder is the whole scalar, else refused.
//!
//! Comment lines are left as written: they document the placeholders.

/// A filter configuration as a template's one-line YAML string carries it: runs of
/// whitespace outside JSON strings become one space (a JSON string holds no raw line
/// break, so the result is one line), the ends trimmed. The filter parses it as it
/// parses the text it came from (whitespace between tokens is not meaning; two tokens
/// never merge, even in text that is not JSON).
pub fn one_line_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped, mut space) = (false, false, false);
    for c in text.trim().chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        if c == '"' {
            in_string = true;
        }
        out.push(c);
    }
    out
}

/// Where a placeholder stands on its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    Single,
    Double,
    /// A plain scalar; `flow`: inside `{…}` or `[…]`; `whole`: nothing else in the scalar.
    Bare {
        flow: bool,
        whole: bool,
    },
}

/// Whether `v` reads back from YAML as the plain scalar `v` (in a flow collection too
/// when `flow`): no indicator at its start, no `: ` or ` #`, no line break.
fn plain_safe(v: &str, flow: bool) -> bool {
    let Some(first) = v.chars().next() else {
        return false;
    };
    if "-?:,[]{}#&*!|>'\"%@`".contains(first)
        && !(first == '-' && v.len() > 1 && !v.starts_with("- "))
    {
        return false;
    }
    if v != v.trim() || v.contains(": ") || v.ends_with(':') || v.contains(" #") {
        return false;
    }
    if v.chars().any(|c| c.is_control()) {
        return false;
    }
    !(flow && v.chars().any(|c| ",[]{}".contains(c)))
}

/// The context of the placeholder at byte `at` of `line`, or `None` when it is inside a
/// trailing comment.
fn context(line: &str, at: usize, len: usize) -> Option<Context> {
    let (mut single, mut double, mut escaped) = (false, false, false);
    let mut depth = 0i32;
    // Where the scalar holding `at` starts: after the last `: `, `- `, `{`, `[` or `,`.
    let mut scalar_start = 0usize;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        if i >= at {
            break;
        }
        if single {
            if c == '\'' {
                single = false;
            }
        } else if double {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                double = false;
            }
        } else {
            match c {
                '\'' => single = true,
                '"' => double = true,
                '#' if prev == ' ' || i == 0 => return None,
                '{' | '[' => {
                    depth += 1;
                    scalar_start = i + 1;
                }
                '}' | ']' => depth -= 1,
                ',' if depth > 0 => scalar_start = i + 1,
                ' ' if prev == ':' || (prev == '-' && line[..i - 1].trim().is_empty()) => {
                    scalar_start = i + 1
                }
                _ => {}
            }
        }
        prev = c;
    }
    if single {
        return Some(Context::Single);
    }
    if double {
        return Some(Context::Double);
    }
    let before = line[scalar_start..at].trim();
    let rest = &line[at + len..];
    let after = match rest.find(" #") {
        Some(cut) => &rest[..cut],
        None => rest,
    };
    let after = after.trim_start();
    let whole = before.is_empty()
        && (after.trim().is_empty() || (depth > 0 && after.starts_with([',', '}', ']'])));
    Some(Context::Bare {
        flow: depth > 0,
        whole,
    })
}

/// `value` written for `ctx`; `Err` says why it cannot be.
fn quoted(name: &str, value: &str, ctx: Context) -> Result<String, String> {
    match ctx {
        Context::Single => {
            if value.contains(['\n', '\r']) {
                return Err(format!(
                    "{{{{{name}}}}} stands in a single-quoted YAML string, which cannot hold a line break"
                ));
            }
            Ok(value.replace('\'', "''"))
        }
        Context::Double => {
            let json = serde_json::Value::from(value).to_string();
            Ok(json[1..json.len() - 1].to_string())
        }
        Context::Bare { flow, whole } => {
            if plain_safe(value, flow) {
                Ok(value.to_string())
            } else if whole && !value.contains(['\n', '\r']) {
                Ok(format!("'{}'", value.replace('\'', "''")))
            } else {
                Err(format!(
                    "{{{{{name}}}}} is part of a plain YAML scalar, and its value {value:?} cannot be written there unquoted"
                ))
            }
        }
    }
}

/// `template` with every `{{NAME}}` outside comments replaced by its value from `vars`,
/// quoted for where it stands. A placeholder without a value is an error naming every
/// missing one.
pub fn fill(template: &str, vars: &[(&str, String)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut missing: Vec<String> = Vec::new();
    for line in template.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            out.push_str(line);
            continue;
        }
        if let Some(name) = trimmed
            .strip_prefix("{{")
            .and_then(|r| r.strip_suffix("}}"))
            .filter(|n| !n.contains(['{', '}']))
        {
            match vars.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => {
                    // Each line of the block at the placeholder's indentation.
                    let indent = &line[..line.len() - line.trim_start().len()];
                    for l in v.split_inclusive('\n') {
                        if !l.trim().is_empty() {
                            out.push_str(indent);
                        }
                        out.push_str(l);
                    }
                    if line.ends_with('\n') && !v.ends_with('\n') {
                        out.push('\n');
                    }
                }
                None => missing.push(name.to_string()),
            }
            continue;
        }
        let mut done = 0usize;
        let mut search = 0usize;
        while let Some(off) = line[search..].find("{{") {
            let at = search + off;
            let Some(len) = line[at..].find("}}").map(|l| l + 2) else {
                return Err(format!("unterminated placeholder in line {line:?}"));
            };
            let name = &line[at + 2..at + len - 2];
            let Some(ctx) = context(line, at, len) else {
                break; // the rest of the line is a comment
            };
            let Some((_, value)) = vars.iter().find(|(n, _)| *n == name) else {
                if !missing.iter().any(|m| m == name) {
                    missing.push(name.to_string());
                }
                search = at + len;
                continue;
            };
            out.push_str(&line[done..at]);
            out.push_str(&quoted(name, value, ctx)?);
            done = at + len;
            search = done;
        }
        out.push_str(&line[done..]);
    }
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|m| format!("{{{{{m}}}}}")).collect();
        return Err(format!("no value for {}", list.join(", ")));
    }
    Ok(out)
}

/// The placeholders of `template` outside comments, in order of first use.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in template
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        let mut rest = line;
        while let Some(at) = rest.find("{{") {
            let Some(len) = rest[at..].find("}}") else {
                break;
            };
            let name = &rest[at + 2..at + len];
            if context(rest, at, len + 2).is_none() {
                break;
            }
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
            rest = &rest[at + len + 2..];
        }
    }
    out
}

/// What `dedupctl render` fills in when not told otherwise: the ports and module path
/// of the templates' own examples.
pub const DEFAULTS: [(&str, &str); 4] = [
    ("LISTEN_PORT", "10000"),
    ("ADMIN_PORT", "9901"),
    ("UPSTREAM_PORT", "8080"),
    ("WASM_PATH", "/etc/envoy/dedup_filter.wasm"),
];

pub const USAGE: &str = "dedupctl render TEMPLATE --config FILE [--config NAME=FILE]... [--set NAME=VALUE]... [--members CLUSTER=HOST:PORT[,HOST:PORT]...]... [--clusters-from FILE]... [--out FILE]";

/// What a render is given.
#[derive(Debug, Clone, Default)]
pub struct Render {
    pub template: String,
    /// Filter configurations (JSON files) by placeholder (`FILTER_CONFIG` unless named).
    pub configs: Vec<(String, String)>,
    /// Other placeholders' values.
    pub set: Vec<(String, String)>,
    /// Files whose clusters the rendered filters may name too (an LDS listener's bootstrap).
    pub clusters_from: Vec<String>,
    /// The etcd clusters' members (`crate::members`).
    pub members: Vec<crate::members::Members>,
    pub out: Option<String>,
}

impl Render {
    fn parse(args: &[String]) -> Result<Render, String> {
        let mut r = Render::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--config" => {
                    let v = value()?;
                    let (name, file) = match v.split_once('=') {
                        Some((n, f)) if !n.contains('/') && !n.is_empty() => {
                            (n.to_string(), f.to_string())
                        }
                        _ => ("FILTER_CONFIG".to_string(), v),
                    };
                    r.configs.push((name, file));
                }
                "--set" => {
                    let v = value()?;
                    let (n, x) = v
                        .split_once('=')
                        .ok_or(format!("--set {v}: expected NAME=VALUE"))?;
                    r.set.push((n.to_string(), x.to_string()));
                }
                "--clusters-from" => r.clusters_from.push(value()?),
                "--members" => r.members.push(crate::members::Members::parse(&value()?)?),
                "--out" | "-o" => r.out = Some(value()?),
                other if other.starts_with('-') || !r.template.is_empty() => {
                    return Err(format!("unexpected `{other}`"))
                }
                _ => r.template = arg.clone(),
            }
        }
        if r.template.is_empty() {
            return Err("which template?".into());
        }
        Ok(r)
    }

    /// The rendered text, checked: every filter configuration parses, and every cluster
    /// it names is defined. `Err` lists the problems.
    pub fn run(&self, err: &mut dyn std::io::Write) -> Result<String, Vec<String>> {
        let one = |e: String| vec![e];
        let template = std::fs::read_to_string(&self.template)
            .map_err(|e| one(format!("{}: {e}", self.template)))?;
        let mut vars: Vec<(String, String)> = Vec::new();
        for (name, file) in &self.configs {
            let text = std::fs::read_to_string(file).map_err(|e| one(format!("{file}: {e}")))?;
            if let Err(e) = dedup_core::Config::parse(text.as_bytes()) {
                return Err(one(format!("{file}: {e}")));
            }
            vars.push((name.clone(), one_line_json(&text)));
        }
        let wanted = placeholders(&template);
        if let Some((name, file)) = self.configs.iter().find(|(n, _)| !wanted.contains(n)) {
            return Err(one(format!(
                "{} has no {{{{{name}}}}}: the configuration {file} would not be used",
                self.template
            )));
        }
        if wanted.iter().any(|w| w == "FILTER_CONFIG")
            && !vars.iter().any(|(n, _)| n == "FILTER_CONFIG")
        {
            return Err(one(format!(
                "{} has {{{{FILTER_CONFIG}}}}: give the filter's configuration with --config FILE",
                self.template
            )));
        }
        for (n, v) in &self.set {
            vars.retain(|(m, _)| m != n);
            vars.push((n.clone(), v.clone()));
        }
        if let Some((_, config)) = vars.iter().find(|(n, _)| n == "FILTER_CONFIG") {
            if !vars.iter().any(|(n, _)| n == "DEDUP_METHODS") {
                let methods = crate::envoy_filter::methods_regex_of(config);
                vars.push(("DEDUP_METHODS".into(), methods));
            }
        }
        for (n, v) in DEFAULTS {
            if !vars.iter().any(|(m, _)| m == n) {
                vars.push((n.into(), v.into()));
            }
        }
        let refs: Vec<(&str, String)> = vars.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        let text = fill(&template, &refs).map_err(|e| {
            one(format!("{}: {e} (give it with --set NAME=VALUE, or --config NAME=FILE for a filter configuration)", self.template))
        })?;
        let text = crate::members::apply(&text, &self.members)
            .map_err(|e| one(format!("{}: {e}", self.template)))?;
        let others = crate::envoy_yaml::clusters_of_files(&self.clusters_from).map_err(one)?;
        let i = crate::envoy_yaml::inspect(&text)
            .map_err(|e| one(format!("{} rendered: {e}", self.template)))?;
        if i.filters.is_empty() {
            // A bootstrap whose listener comes by LDS: nothing of the filter's to check here.
            return Ok(text);
        }
        let mut bad = Vec::new();
        let mut ok_lines = Vec::new();
        let given = (!self.clusters_from.is_empty()).then_some(&others[..]);
        let passed = crate::envoy_yaml::report(&self.template, &i, given, &mut ok_lines, &mut bad)
            .unwrap_or(false);
        if !passed {
            return Err(String::from_utf8_lossy(&bad)
                .lines()
                .map(str::to_string)
                .collect());
        }
        let _ = err.write_all(&ok_lines);
        Ok(text)
    }
}

/// `dedupctl render …` (without the word `render`): the rendered file on `out` (or
/// `--out`), what was checked on `err`. Exit status 0, 1 (a check failed: nothing is
/// written) or 2 (usage).
pub fn command(
    args: &[String],
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<u8> {
    let r = match Render::parse(args) {
        Ok(r) => r,
        Err(e) => {
            writeln!(err, "render: {e}\nusage: {USAGE}")?;
            return Ok(2);
        }
    };
    match r.run(err) {
        Ok(text) => {
            match &r.out {
                Some(path) => {
                    if let Err(e) = std::fs::write(path, &text) {
                        writeln!(err, "{path}: {e}")?;
                        return Ok(2);
                    }
                }
                None => write!(out, "{text}")?,
            }
            Ok(0)
        }
        Err(problems) => {
            for p in problems {
                writeln!(err, "{p}")?;
            }
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn yaml(text: &str) -> yaml_rust2::Yaml {
        yaml_rust2::YamlLoader::load_from_str(text)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_configuration_with_quotes_hashes_ampersands_and_line_breaks_reads_back() {
        let config = "{\"replayed_header\": \"x-it's\",\n  \"scope\": {\"headers\": [\"x-a#b\"]},\n\
                      \t\"rules\": [{\"name\": \"a&b\", \"match\": {\"path_prefix\": \"/a: #b\\n\"}}]}";
        let t = "a:\n  value: '{{C}}'\n  re: \"{{M}}\"\n";
        let out = fill(
            t,
            &[("C", one_line_json(config)), ("M", "PO\"ST|\\d".into())],
        )
        .unwrap();
        let y = yaml(&out);
        let back: serde_json::Value =
            serde_json::from_str(y["a"]["value"].as_str().unwrap()).unwrap();
        let want: serde_json::Value = serde_json::from_str(config).unwrap();
        assert_eq!(back, want);
        assert_eq!(y["a"]["re"].as_str(), Some("PO\"ST|\\d"));
    }

    #[test]
    fn bare_values_stay_plain_or_are_quoted_whole() {
        let t = "p: { port_value: {{P}} }\nf: {{W}}\nu: http://h:{{P}}/m\nx: a{{W}}\n";
        let vars = [
            ("P", "8080".to_string()),
            ("W", "/tmp/a #b.wasm".to_string()),
        ];
        let err = fill(t, &vars).unwrap_err();
        assert!(
            err.contains("{{W}} is part of a plain YAML scalar"),
            "{err}"
        );
        let out = fill(&t.replace("x: a{{W}}\n", ""), &vars).unwrap();
        let y = yaml(&out);
        assert_eq!(y["p"]["port_value"].as_i64(), Some(8080));
        assert_eq!(y["f"].as_str(), Some("/tmp/a #b.wasm"));
        assert_eq!(y["u"].as_str(), Some("http://h:8080/m"));
        let flow = fill("p: { a: {{W}}, b: 1 }\n", &[("W", "x,y".into())]).unwrap();
        assert_eq!(yaml(&flow)["p"]["a"].as_str(), Some("x,y"));
    }

    #[test]
    fn a_block_takes_the_indentation_of_its_placeholder() {
        let t = "routes:\n- match: {}\n  {{ROUTE}}\n{{MORE}}\n";
        let out = fill(
            t,
            &[
                ("ROUTE", "route: {cluster: a}\nextra: 1".into()),
                ("MORE", "  - x\n\n  - y\n".into()),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            "routes:\n- match: {}\n  route: {cluster: a}\n  extra: 1\n  - x\n\n  - y\n"
        );
        let y = yaml(&out.replace("  - x\n\n  - y\n", ""));
        assert_eq!(y["routes"][0]["route"]["cluster"].as_str(), Some("a"));
    }

    #[test]
    fn comments_blocks_and_missing_values() {
        let t = "  # {{P}} stays in comments\nport: {{P}} # and {{Q}} here\nfilters:\n{{BLOCK}}\n";
        let out = fill(t, &[("P", "80".into()), ("BLOCK", "- a\n- b".into())]).unwrap();
        assert_eq!(
            out,
            "  # {{P}} stays in comments\nport: 80 # and {{Q}} here\nfilters:\n- a\n- b\n"
        );
        let err = fill("a: {{X}}\nb: '{{Y}}'\nc: {{X}}\n", &[]).unwrap_err();
        assert_eq!(err, "no value for {{X}}, {{Y}}");
        assert!(fill("v: '{{C}}'\n", &[("C", "a\nb".into())]).is_err());
        assert_eq!(
            placeholders("a: {{X}} # {{Z}}\n# {{W}}\nb: '{{Y}}{{X}}'\n"),
            ["X", "Y"]
        );
    }

    #[test]
    fn one_line_json_keeps_strings_and_token_boundaries() {
        assert_eq!(
            one_line_json(" {\"a b\":\n\t[1,  2 ],\r\n \"c\\\" d\": \"x\\n y\"} "),
            "{\"a b\": [1, 2 ], \"c\\\" d\": \"x\\n y\"}"
        );
        assert_eq!(one_line_json("{\"a\": 1\n2}"), "{\"a\": 1 2}");
    }
}
