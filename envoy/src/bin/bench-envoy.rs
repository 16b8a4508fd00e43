//! `make bench-envoy`: wrk against Envoy on loopback, in one run:
//! no filter, the empty Wasm filter, dedup with unique keys, dedup replays.
//! Prints throughput and latency (p50, p99) with ratios to the no-filter and
//! empty-filter baselines of the same run, and writes the "## Envoy load"
//! section of BENCHMARKS.md. `BENCH_SECONDS` (default 8) per case,
//! `BENCH_NO_WRITE=1` to leave BENCHMARKS.md alone.

use dedup_envoy::paths::{dedup_wasm, empty_wasm, scratch_dir, workspace_root};
use dedup_envoy::process::spawn;
use dedup_envoy::{fail, DemoUpstream, Envoy, EnvoyConfig, Request, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const THREADS: u32 = 2;
const CONNECTIONS: u32 = 32;
const WARMUP_SECONDS: u64 = 1;
const BODY: &str = r#"{"item": "book", "qty": 1, "note": "bench"}"#;

/// Every request: POST /orders with a JSON body and a key never used before.
const UNIQUE_LUA: &str = r#"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  counter = 0
  prefix = "bench-" .. (args[1] or "run") .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/orders", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. counter,
  }, BODY)
end
"#;

/// Every request: the same key and body, answered from the stored response.
const REPLAY_LUA: &str = r#"
wrk.method = "POST"
wrk.path = "/orders"
wrk.body = BODY
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replay"
"#;

struct Measured {
    name: &'static str,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: u64,
    non_2xx: u64,
    errors: String,
}

fn lua(script: &str) -> String {
    script.replace("BODY", &format!("'{BODY}'"))
}

fn wrk(dir: &Path, url: &str, script: &Path, seconds: u64, tag: &str) -> Result<String> {
    let out = dir.join(format!("wrk-{tag}.txt"));
    let mut cmd = Command::new("wrk");
    cmd.arg(format!("-t{THREADS}"))
        .arg(format!("-c{CONNECTIONS}"))
        .arg(format!("-d{seconds}s"))
        .arg("--timeout")
        .arg("5s")
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .arg("--")
        .arg(tag)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&out)?))
        .stderr(Stdio::inherit());
    let mut child = spawn(cmd)?;
    match child.wait_exit(Duration::from_secs(seconds + 30)) {
        Some(0) => Ok(std::fs::read_to_string(&out)?),
        Some(code) => fail!("wrk exited {code}: {}", std::fs::read_to_string(&out)?),
        None => fail!("wrk did not finish"),
    }
}

/// "1.23ms" / "850.00us" / "1.01s" in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let (num, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))?;
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v / 1000.0,
        "ms" => v,
        "s" => v * 1000.0,
        "m" => v * 60_000.0,
        _ => return None,
    })
}

fn parse_wrk(name: &'static str, text: &str) -> Result<Measured> {
    let mut m = Measured {
        name,
        rps: 0.0,
        p50_ms: 0.0,
        p99_ms: 0.0,
        requests: 0,
        non_2xx: 0,
        errors: String::new(),
    };
    for line in text.lines() {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => m.rps = v.parse().unwrap_or(0.0),
            ["50%", v] => m.p50_ms = duration_ms(v).unwrap_or(0.0),
            ["99%", v] => m.p99_ms = duration_ms(v).unwrap_or(0.0),
            [n, "requests", "in", ..] => m.requests = n.parse().unwrap_or(0),
            ["Non-2xx", "or", "3xx", "responses:", n] => m.non_2xx = n.parse().unwrap_or(0),
            ["Socket", "errors:", ..] => m.errors = t.to_string(),
            _ => {}
        }
    }
    if m.rps <= 0.0 {
        fail!("could not read wrk's output:\n{text}");
    }
    Ok(m)
}

/// One case: its own Envoy, kept up for every round.
struct Case {
    name: &'static str,
    envoy: Envoy,
    dir: std::path::PathBuf,
    script: std::path::PathBuf,
    best: Option<Measured>,
    rounds: Vec<f64>,
}

fn start_case(name: &'static str, config: EnvoyConfig, script: &str, prime: bool) -> Result<Case> {
    let dir = scratch_dir("bench")?;
    let script_path = dir.join("script.lua");
    std::fs::write(&script_path, lua(script))?;
    let envoy = Envoy::start("bench", config)?;
    if prime {
        let r = envoy.send(
            &Request::post("/orders")
                .key("bench-replay")
                .header("content-type", "application/json")
                .body(BODY),
        )?;
        if r.status != 200 {
            fail!("priming the replay key: {}", r.summary());
        }
    }
    let case = Case {
        name,
        envoy,
        dir,
        script: script_path,
        best: None,
        rounds: Vec::new(),
    };
    case.wrk(WARMUP_SECONDS, "warmup")?;
    Ok(case)
}

impl Case {
    fn wrk(&self, seconds: u64, round: &str) -> Result<String> {
        let tag = format!(
            "{}-{}-{round}",
            self.name.replace([' ', ','], "-"),
            std::process::id()
        );
        let url = format!("{}/orders", self.envoy.url());
        wrk(&self.dir, &url, &self.script, seconds, &tag)
    }

    /// One measured round; keeps the best (highest throughput) one.
    fn measure(&mut self, seconds: u64, round: usize) -> Result<()> {
        let m = parse_wrk(self.name, &self.wrk(seconds, &format!("r{round}"))?)?;
        eprintln!(
            "  round {round} {:<22} {:>9.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  ({} requests, {} non-2xx{})",
            self.name,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.requests,
            m.non_2xx,
            if m.errors.is_empty() { String::new() } else { format!(", {}", m.errors) }
        );
        self.rounds.push(m.rps);
        if self.best.as_ref().is_none_or(|b| m.rps > b.rps) {
            self.best = Some(m);
        }
        Ok(())
    }

    fn counters(&self) -> String {
        self.envoy
            .dedup_counters()
            .map(|c| {
                c.iter()
                    .filter(|(_, v)| **v > 0)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    }
}

fn envoy_version() -> String {
    Command::new("envoy")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split('/')
                .nth(1)
                .map(str::to_string)
        })
        .unwrap_or_else(|| "?".into())
}

fn run() -> Result<()> {
    if Command::new("wrk").arg("--version").output().is_err() {
        fail!("wrk not found: run `make deps` (apt-get install wrk)");
    }
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .clamp(1, 60);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .clamp(1, 10);
    let dedup = dedup_wasm()?;
    let empty = empty_wasm()?;
    let upstream = DemoUpstream::start(0, false)?;
    let port = upstream.port();
    eprintln!(
        "bench-envoy: wrk -t{THREADS} -c{CONNECTIONS}, {WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s per case, Envoy --concurrency 2, loopback"
    );
    let cases = [
        (
            "no filter",
            EnvoyConfig::no_filter(port)?,
            UNIQUE_LUA,
            false,
        ),
        (
            "empty Wasm filter",
            EnvoyConfig::single_node(port, &empty, "{}")?,
            UNIQUE_LUA,
            false,
        ),
        (
            "dedup, unique keys",
            EnvoyConfig::single_node(port, &dedup, "{}")?,
            UNIQUE_LUA,
            false,
        ),
        (
            "dedup, replays",
            EnvoyConfig::single_node(port, &dedup, "{}")?,
            REPLAY_LUA,
            true,
        ),
    ];
    let load_before = load_average();
    let mut started = Vec::new();
    for (name, config, script, prime) in cases {
        started.push(start_case(name, config, script, prime)?);
    }
    // Rounds interleave the cases, so a burst of other work on the machine
    // hits every case alike; each case reports its best round.
    for round in 1..=rounds {
        for case in started.iter_mut() {
            case.measure(seconds, round)?;
        }
    }
    let mut results = Vec::new();
    for case in &started {
        let Some(best) = &case.best else {
            fail!("no measurement for {}", case.name)
        };
        let m = Measured {
            errors: format!(
                "{}{}",
                if best.errors.is_empty() {
                    String::new()
                } else {
                    format!("{}; ", best.errors)
                },
                case.rounds
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            name: best.name,
            rps: best.rps,
            p50_ms: best.p50_ms,
            p99_ms: best.p99_ms,
            requests: best.requests,
            non_2xx: best.non_2xx,
        };
        results.push((m, case.counters()));
    }
    let base = results[0].0.rps;
    let empty_rps = results[1].0.rps;
    let (base_p50, base_p99) = (results[0].0.p50_ms, results[0].0.p99_ms);
    let (empty_p50, empty_p99) = (results[1].0.p50_ms, results[1].0.p99_ms);
    let mut table = String::from(
        "| case | req/s | p50 ms | p99 ms | req/s vs no filter | req/s vs empty filter | p50 vs no filter | p99 vs no filter | p50 vs empty | p99 vs empty | non-2xx | rounds (req/s) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (m, _) in &results {
        table.push_str(&format!(
            "| {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            m.name,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.rps / base,
            m.rps / empty_rps,
            m.p50_ms / base_p50,
            m.p99_ms / base_p99,
            m.p50_ms / empty_p50,
            m.p99_ms / empty_p99,
            m.non_2xx,
            m.errors.trim()
        ));
    }
    println!("\n{table}");
    let counters: String = results
        .iter()
        .filter(|(_, c)| !c.is_empty())
        .map(|(m, c)| format!("- {}: {c}\n", m.name))
        .collect();
    if std::env::var("BENCH_NO_WRITE").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let section = format!(
        "## Envoy load\n\n\
`make bench-envoy` (envoy/src/bin/bench-envoy.rs). Real Envoy {} with \
`--concurrency 2`, the config `envoy/configs/single-node.yaml` (or \
`no-filter.yaml` for the baseline), in front of the in-process demo upstream, \
all on 127.0.0.1 of one 2-core machine. Load: wrk `-t{THREADS} -c{CONNECTIONS}`, \
every request a `POST /orders` with a {}-byte JSON body. One Envoy per case, \
all started first; each gets a {WARMUP_SECONDS} s warm-up, then {rounds} rounds \
of {seconds} s measured run the cases in turn (interleaved, so a burst of other \
work hits every case alike) and each case reports its best round (highest \
req/s; the per-round req/s are in the last column). Cases: no Wasm \
filter; `dist/empty_filter.wasm` (a filter that does nothing: the cost of Wasm \
itself); the dedup filter with defaults and a unique `Idempotency-Key` per \
request (each one claims, executes upstream and stores its response); the dedup \
filter replaying one stored response (same key and body; the upstream is not \
called). Ratios are to the baselines of the same run. wrk, Envoy and the upstream \
share the 2 cores, so absolute figures are low and noisy; the ratios are the point. \
Load average before this run: {load_before} (anything above ~1 means other work \
competed for the cores; figures then vary by tens of percent between runs).\n\n\
{table}\n\
Filter counters after each dedup case:\n\n{counters}",
        envoy_version(),
        BODY.len()
    );
    write_section(&section)?;
    eprintln!("wrote the \"## Envoy load\" section of BENCHMARKS.md");
    Ok(())
}

/// The 1-minute load average, as text.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Replace the "## Envoy load" section of BENCHMARKS.md (or append it),
/// leaving other sections alone.
fn write_section(section: &str) -> Result<()> {
    let path = workspace_root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let new = match old.find("## Envoy load") {
        Some(start) => {
            let after = &old[start + 2..];
            let end = after
                .find("\n## ")
                .map(|i| start + 2 + i + 1)
                .unwrap_or(old.len());
            format!("{}{}\n{}", &old[..start], section.trim_end(), &old[end..])
        }
        None => format!("{}\n\n{}\n", old.trim_end(), section.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-envoy: {e}");
        std::process::exit(1);
    }
}
