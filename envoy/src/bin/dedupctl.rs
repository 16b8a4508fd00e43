//! dedupctl: look up, remove and count proxy-dedup records through the filter's operator
//! API (a listener where the filter runs with `"role": "admin"`, see
//! envoy/configs/admin-api.yaml).
//!
//!   dedupctl [--addr HOST:PORT] [--json] get   --key K [--authority H] [--scope NAME=VALUE]... [--source header|json_pointer] [--rule NAME]
//!   dedupctl [--addr HOST:PORT] [--json] purge --key K [--authority H] [--scope NAME=VALUE]... [--rule NAME] [--force]
//!   dedupctl [--addr HOST:PORT] [--json] stats
//!   dedupctl check-config FILE
//!   dedupctl envoy-filter FILE [--wasm PATH] [--vm-id ID] [--indent N]
//!   dedupctl methods FILE
//!   dedupctl schema
//!   dedupctl reference
//!
//! `check-config` parses FILE (the filter's JSON configuration) with the filter's own
//! parser and prints the error, naming the field, that Envoy would log. `envoy-filter`
//! prints the `http_filters` entry for it: the filter wrapped in Envoy's matching, so
//! requests whose method no policy deduplicates never enter Wasm. `methods` prints the
//! value of the shipped templates' `{{DEDUP_METHODS}}` for it (e.g. `POST|PATCH`).
//! `schema` prints the configuration's JSON Schema and `reference` its markdown
//! reference, both generated from the filter's field table (`dedup_core::config::fields`);
//! `make docs-ref` writes them to docs/config.schema.json and docs/src/reference/fields.md.
//!
//! Exit status: 0 when the API answered 2xx, 1 when it refused (404, 409, 400), 2 on
//! usage or connection errors.

use dedup_envoy::client::{send, Request};
use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: dedupctl [--addr HOST:PORT] [--json] get|purge|stats \
[--key K] [--authority H] [--scope NAME=VALUE]... [--source header|json_pointer] [--rule NAME] [--force]
       dedupctl check-config FILE
       dedupctl envoy-filter FILE [--wasm PATH] [--vm-id ID] [--indent N]
       dedupctl methods FILE
       dedupctl schema | reference";

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
    addr: String,
    json: bool,
    command: String,
    query: Vec<(String, String)>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
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
            "-h" | "--help" => return Err(USAGE.to_string()),
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
                    .map(|(k, x)| format!("{k}: {x}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
    }
}

/// `check-config`, `envoy-filter` and `methods`: work on a configuration file, no API call.
fn offline(args: &[String]) -> ExitCode {
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => return ExitCode::from(2),
    };
    let Some(file) = rest.first() else {
        eprintln!("{command} needs a configuration file\n{USAGE}");
        return ExitCode::from(2);
    };
    let config = match std::fs::read_to_string(file) {
        Ok(c) => c.trim().to_string(),
        Err(e) => {
            eprintln!("{file}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut wasm = "/etc/envoy/dedup_filter.wasm".to_string();
    let mut vm_id = "proxy_dedup".to_string();
    let mut indent = 10usize;
    let mut it = rest[1..].iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            eprintln!("{flag} needs a value");
            return ExitCode::from(2);
        };
        match flag.as_str() {
            "--wasm" => wasm = value.clone(),
            "--vm-id" => vm_id = value.clone(),
            "--indent" => indent = value.parse().unwrap_or(indent),
            other => {
                eprintln!("unexpected `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let block = dedup_envoy::envoy_filter::FilterBlock {
        config: &config,
        wasm_path: &wasm,
        vm_id: &vm_id,
    };
    match (command, block.render(indent)) {
        (_, Err(e)) => {
            eprintln!("{file}: {e}");
            ExitCode::from(1)
        }
        ("check-config", Ok(_)) => {
            println!("{file}: ok");
            ExitCode::SUCCESS
        }
        ("methods", Ok(_)) => {
            println!("{}", dedup_envoy::envoy_filter::methods_regex_of(&config));
            ExitCode::SUCCESS
        }
        (_, Ok(yaml)) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
    }
}

fn main() -> ExitCode {
    let all: Vec<String> = std::env::args().skip(1).collect();
    match all.first().map(String::as_str) {
        Some("schema") if all.len() == 1 => {
            print!("{}", dedup_core::config::fields::schema_text());
            return ExitCode::SUCCESS;
        }
        Some("reference") if all.len() == 1 => {
            print!("{}", dedup_core::config::fields::reference_markdown());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    if matches!(
        all.first().map(String::as_str),
        Some("check-config" | "envoy-filter" | "methods")
    ) {
        return offline(&all);
    }
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(addr) = args.addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        eprintln!("cannot resolve {}", args.addr);
        return ExitCode::from(2);
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
            eprintln!("{method} {target} on {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    if args.json {
        println!("{}", String::from_utf8_lossy(&resp.body));
    } else {
        println!("{}", show(&args.command, resp.status, &v));
    }
    if resp.status < 300 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
