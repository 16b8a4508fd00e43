//! dedupctl (`src/bin/dedupctl.rs` runs [`run`]): look up, remove and count proxy-dedup
//! records through the filter's operator API (a listener where the filter runs with
//! `"role": "admin"`, see envoy/configs/admin-api.yaml). A library function so that the
//! test kit's real-Envoy tests run the whole command, from its arguments to its output
//! and exit status, without a binary of another crate.
//!
//!   dedupctl [--addr HOST:PORT] [--json] get   --key K [--authority H] [--scope NAME=VALUE]... [--source header|json_pointer] [--rule NAME]
//!   dedupctl [--addr HOST:PORT] [--json] purge --key K [--authority H] [--scope NAME=VALUE]... [--rule NAME] [--force]
//!   dedupctl [--addr HOST:PORT] [--json] stats
//!   dedupctl check-config FILE [--clusters-from FILE]...
//!   dedupctl render TEMPLATE --config FILE [--config NAME=FILE]... [--set NAME=VALUE]... [--members CLUSTER=HOST:PORT[,HOST:PORT]...]... [--clusters-from FILE]... [--out FILE]
//!   dedupctl envoy-filter FILE [--wasm PATH] [--vm-id ID] [--indent N]
//!   dedupctl methods FILE
//!   dedupctl schema
//!   dedupctl reference
//!   dedupctl --help | --version
//!
//! `check-config` parses FILE (the filter's JSON configuration) with the filter's own
//! parser and prints the error, naming the field, that Envoy would log; given an Envoy
//! or Istio YAML file instead, it checks every proxy-dedup filter in it and the clusters
//! they name (`envoy_yaml`). `render` fills a shipped template from a JSON file
//! (`render`), then checks the result the same way. `envoy-filter`
//! prints the `http_filters` entry for it: the filter wrapped in Envoy's matching, so
//! requests whose method no policy deduplicates never enter Wasm. `methods` prints the
//! value of the shipped templates' `{{DEDUP_METHODS}}` for it (e.g. `POST|PATCH`).
//! `schema` prints the configuration's JSON Schema and `reference` its markdown
//! reference, both generated from the filter's field table (`dedup_core::config::fields`);
//! `make docs-ref` writes them to docs/config.schema.json and docs/src/reference/fields.md.
//!
//! Exit status: 0 when the API answered 2xx, 1 when it refused (404, 409, 400), 2 on
//! usage or connection errors. `--help` (anywhere a flag may stand) prints the usage and
//! what each command does on standard output and exits 0; `--version` prints
//! `dedupctl <version>`, the workspace's version (the filter's: both are built from one
//! `Cargo.toml`).

use crate::client::{send, Request};
use std::io::Write;
use std::net::ToSocketAddrs;
use std::time::Duration;

const USAGE: &str = "usage: dedupctl [--addr HOST:PORT] [--json] get|purge|stats \
[--key K] [--authority H] [--scope NAME=VALUE]... [--source header|json_pointer] [--rule NAME] [--force]
       dedupctl check-config FILE [--clusters-from FILE]...
       dedupctl render TEMPLATE --config FILE [--config NAME=FILE]... [--set NAME=VALUE]... [--members CLUSTER=HOST:PORT[,HOST:PORT]...]... [--clusters-from FILE]... [--out FILE]
       dedupctl envoy-filter FILE [--wasm PATH] [--vm-id ID] [--indent N]
       dedupctl methods FILE
       dedupctl schema | reference
       dedupctl --help | --version";

/// What `--help` adds to [`USAGE`]: each command in a line or two, the exit status.
const HELP: &str = "\
commands:
  get           look up a record through the filter's operator API (a listener where the
                filter runs with \"role\": \"admin\"; --addr, default 127.0.0.1:9902)
  purge         remove a record (--force: also one in flight or with an unknown outcome)
  stats         the store's record counts
  check-config  parse FILE (the filter's JSON configuration) with the filter's own parser:
                \"ok\", or the error Envoy would log, naming the field
  envoy-filter  the http_filters entry of FILE for an Envoy config
  methods       the methods FILE deduplicates, as the templates' {{DEDUP_METHODS}}
  schema        the configuration's JSON Schema
  reference     the configuration's markdown reference
options:
  --json        print the operator API's JSON answer as it is
  -h, --help    this text
  -V, --version the version (the filter module's too)
exit status: 0 done (the API answered 2xx); 1 refused (404, 409, 400) or an invalid
configuration; 2 usage or connection error.
";

/// `--help`'s text: the usage, then [`HELP`].
fn help(out: &mut dyn Write) -> std::io::Result<u8> {
    write!(out, "{USAGE}\n\n{HELP}")?;
    Ok(0)
}

/// Whether `arg` asks for the help text.
fn is_help(arg: &str) -> bool {
    matches!(arg, "-h" | "--help")
}

/// Percent-encodes a query component (unreserved characters stay).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Args {
    /// `--help` among the flags: print the help, nothing else.
    help: bool,
    addr: String,
    json: bool,
    command: String,
    query: Vec<(String, String)>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        help: false,
        addr: "127.0.0.1:9902".to_string(),
        json: false,
        command: String::new(),
        query: Vec::new(),
    };
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--addr" => a.addr = value("--addr")?,
            "--json" => a.json = true,
            "--key" => a.query.push(("key".into(), value("--key")?)),
            "--authority" => a.query.push(("authority".into(), value("--authority")?)),
            "--source" => a.query.push(("source".into(), value("--source")?)),
            "--rule" => a.query.push(("rule".into(), value("--rule")?)),
            "--force" => a.query.push(("force".into(), "true".into())),
            "--scope" => {
                let v = value("--scope")?;
                let (name, val) = v
                    .split_once('=')
                    .ok_or(format!("--scope {v}: expected NAME=VALUE"))?;
                a.query.push((format!("scope.{name}"), val.to_string()));
            }
            "-h" | "--help" => {
                a.help = true;
                return Ok(a);
            }
            "get" | "purge" | "stats" if a.command.is_empty() => a.command = arg,
            other => return Err(format!("unexpected `{other}`\n{USAGE}")),
        }
    }
    if a.command.is_empty() {
        return Err(USAGE.to_string());
    }
    Ok(a)
}

fn show(command: &str, status: u16, v: &serde_json::Value) -> String {
    let field = |k: &str| v.get(k).cloned().unwrap_or(serde_json::Value::Null);
    if status >= 400 {
        return format!(
            "{} ({status}): {}",
            field("title").as_str().unwrap_or("error"),
            field("detail").as_str().unwrap_or("")
        );
    }
    let record = |r: &serde_json::Value| {
        let secs = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0) / 1000;
        let mut line = format!(
            "record {}: {}",
            r.get("record").and_then(|x| x.as_str()).unwrap_or("?"),
            r.get("state").and_then(|x| x.as_str()).unwrap_or("?"),
        );
        if let Some(rule) = r.get("rule").and_then(|x| x.as_str()) {
            line += &format!(" (rule {rule})");
        }
        if let Some(shard) = r.get("shard").and_then(|x| x.as_str()) {
            line += &format!(" on shard {shard}");
        }
        if let Some(s) = r.get("status").and_then(|x| x.as_u64()) {
            let bytes = r.get("body_bytes").and_then(|x| x.as_u64()).unwrap_or(0);
            line += &format!(", stored response {s} ({bytes} body bytes)");
        }
        if r.get("expires_in_ms").is_some() {
            line += &format!(
                ", age {} s, expires in {} s",
                secs("age_ms"),
                secs("expires_in_ms")
            );
        }
        line
    };
    match command {
        "purge" => format!("removed {}", record(&field("removed"))),
        "get" => record(v),
        _ => v
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, x)| match (k.as_str(), x.as_array()) {
                        // etcd's shards, one line each.
                        ("shards", Some(list)) => list
                            .iter()
                            .map(|s| {
                                format!(
                                    "shard {}: {} records",
                                    s.get("name").and_then(|n| n.as_str()).unwrap_or("?"),
                                    s.get("records").cloned().unwrap_or_default()
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n"),
                        _ => format!("{k}: {x}"),
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
    }
}

/// `check-config`, `envoy-filter` and `methods`: work on a configuration file, no API call.
fn offline(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> std::io::Result<u8> {
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => return Ok(2),
    };
    if rest.iter().any(|a| is_help(a)) {
        return help(out);
    }
    let Some(file) = rest.first() else {
        writeln!(err, "{command} needs a configuration file\n{USAGE}")?;
        return Ok(2);
    };
    let config = match std::fs::read_to_string(file) {
        Ok(c) => c.trim().to_string(),
        Err(e) => {
            writeln!(err, "{file}: {e}")?;
            return Ok(2);
        }
    };
    if command == "check-config" && crate::envoy_yaml::is_yaml(file, &config) {
        return crate::envoy_yaml::check_command(file, &config, &rest[1..], out, err);
    }
    let mut wasm = "/etc/envoy/dedup_filter.wasm".to_string();
    let mut vm_id = "proxy_dedup".to_string();
    let mut indent = 10usize;
    let mut it = rest[1..].iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            writeln!(err, "{flag} needs a value")?;
            return Ok(2);
        };
        match flag.as_str() {
            "--wasm" => wasm = value.clone(),
            "--vm-id" => vm_id = value.clone(),
            "--indent" => indent = value.parse().unwrap_or(indent),
            other => {
                writeln!(err, "unexpected `{other}`\n{USAGE}")?;
                return Ok(2);
            }
        }
    }
    let block = crate::envoy_filter::FilterBlock {
        config: &config,
        wasm_path: &wasm,
        vm_id: &vm_id,
    };
    match (command, block.render(indent)) {
        (_, Err(e)) => {
            writeln!(err, "{file}: {e}")?;
            Ok(1)
        }
        ("check-config", Ok(_)) => {
            writeln!(out, "{file}: ok")?;
            // A resharding's step 2: when its step 3 may drop the previous map.
            if let Ok(c) = dedup_core::Config::parse(config.as_bytes()) {
                let previous = matches!(&c.store, dedup_core::config::StoreConfig::Etcd(e)
                    if e.check.as_ref().is_some_and(|k| k.role == dedup_core::config::CheckRole::Previous));
                if let (true, Some(s)) = (
                    previous,
                    dedup_core::stores::etcd::wire::longest_key_life_s(&c),
                ) {
                    writeln!(
                        out,
                        "{file}: drop store.previous_shards no sooner than {s} s ({}) after every proxy runs this configuration, plus your clock skew",
                        dedup_core::stream::human_duration(s)
                    )?;
                }
            }
            Ok(0)
        }
        ("methods", Ok(_)) => {
            writeln!(out, "{}", crate::envoy_filter::methods_regex_of(&config))?;
            Ok(0)
        }
        (_, Ok(yaml)) => {
            write!(out, "{yaml}")?;
            Ok(0)
        }
    }
}

/// dedupctl with `args` (without the program name), writing what it prints to `out` and
/// `err`; the exit status. An error writing the output is status 2.
pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    try_run(args, out, err).unwrap_or(2)
}

fn try_run(all: &[String], out: &mut dyn Write, err: &mut dyn Write) -> std::io::Result<u8> {
    match all.first().map(String::as_str) {
        Some("-h" | "--help" | "help") => return help(out),
        Some("-V" | "--version") if all.len() == 1 => {
            writeln!(out, "dedupctl {}", env!("CARGO_PKG_VERSION"))?;
            return Ok(0);
        }
        Some("schema") if all.len() == 1 => {
            write!(out, "{}", dedup_core::config::fields::schema_text())?;
            return Ok(0);
        }
        Some("reference") if all.len() == 1 => {
            write!(out, "{}", dedup_core::config::fields::reference_markdown())?;
            return Ok(0);
        }
        _ => {}
    }
    if all.first().map(String::as_str) == Some("render") {
        return crate::render::command(&all[1..], out, err);
    }
    if matches!(
        all.first().map(String::as_str),
        Some("check-config" | "envoy-filter" | "methods")
    ) {
        return offline(all, out, err);
    }
    let args = match parse(all.iter().cloned()) {
        Ok(a) if a.help => return help(out),
        Ok(a) => a,
        Err(e) => {
            writeln!(err, "{e}")?;
            return Ok(2);
        }
    };
    let Some(addr) = args.addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        writeln!(err, "cannot resolve {}", args.addr)?;
        return Ok(2);
    };
    let (method, path) = match args.command.as_str() {
        "get" => ("GET", "/records"),
        "purge" => ("DELETE", "/records"),
        _ => ("GET", "/stats"),
    };
    let query: Vec<String> = args
        .query
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let req = Request::new(method, &target).timeout(Duration::from_secs(10));
    let resp = match send(addr, &req) {
        Ok(r) => r,
        Err(e) => {
            writeln!(err, "{method} {target} on {addr}: {e}")?;
            return Ok(2);
        }
    };
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    if args.json {
        writeln!(out, "{}", String::from_utf8_lossy(&resp.body))?;
    } else {
        writeln!(out, "{}", show(&args.command, resp.status, &v))?;
    }
    Ok(if resp.status < 300 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `run` with `args`: (status, stdout, stderr).
    fn ctl(args: &[&str]) -> (u8, String, String) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&args, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn schema_and_reference_print_the_field_table_s() {
        let (code, out, _) = ctl(&["schema"]);
        assert_eq!((code, out), (0, dedup_core::config::fields::schema_text()));
        let (code, out, _) = ctl(&["reference"]);
        assert_eq!(
            (code, out),
            (0, dedup_core::config::fields::reference_markdown())
        );
    }

    #[test]
    fn usage_errors_are_status_2_on_stderr() {
        for args in [
            &[][..],
            &["frobnicate"],
            &["get", "--key"],
            &["check-config"],
        ] {
            let (code, out, err) = ctl(args);
            assert_eq!((code, out.as_str()), (2, ""), "{args:?}");
            assert!(!err.is_empty(), "{args:?}");
        }
        let (_, _, err) = ctl(&["--scope", "novalue", "get"]);
        assert!(err.contains("expected NAME=VALUE"), "{err}");
    }

    #[test]
    fn methods_of_a_config_file() {
        let file = std::env::temp_dir().join(format!("ctl-methods-{}.json", std::process::id()));
        std::fs::write(&file, r#"{"methods": ["PUT", "POST"]}"#).unwrap();
        let (code, out, _) = ctl(&["methods", file.to_str().unwrap()]);
        std::fs::remove_file(&file).unwrap();
        assert_eq!((code, out.as_str()), (0, "POST|PUT\n"));
    }

    #[test]
    fn a_sharded_stores_answers_name_the_shards() {
        let stats = serde_json::json!({"store": "etcd", "records": 3,
            "shards": [{"name": "a", "records": 1}, {"name": "b", "records": 2}]});
        assert_eq!(
            show("stats", 200, &stats),
            "records: 3\nshard a: 1 records\nshard b: 2 records\nstore: \"etcd\""
        );
        let got = serde_json::json!({"record": "ab", "state": "completed", "shard": "b"});
        assert_eq!(show("get", 200, &got), "record ab: completed on shard b");
    }

    #[test]
    fn query_components_are_percent_encoded() {
        assert_eq!(encode("a b/c=d~e"), "a%20b%2Fc%3Dd~e");
    }
}
