//! `make bench-envoy` (second half): the etcd store against the shared-data
//! store, with wrk against real Envoys on loopback in one run. Cases: first
//! executions (a unique key per request) and replays (one key), each on
//! shared data and on a real 3-member etcd. As in bench-envoy, every case has
//! its own Envoy, started first; measured rounds interleave the cases and each
//! case reports its best round. Prints throughput and latency with ratios to
//! the shared-data case of the same load, and writes the "## etcd store"
//! section of BENCHMARKS.md. `BENCH_SECONDS` (default 3) per round,
//! `BENCH_ROUNDS` (default 3), `BENCH_NO_WRITE=1` to leave BENCHMARKS.md alone.

use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::{dedup_wasm, scratch_dir, workspace_root};
use dedup_envoy::process::spawn;
use dedup_envoy::{fail, DemoUpstream, Envoy, EnvoyConfig, Request, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const THREADS: u32 = 2;
const CONNECTIONS: u32 = 32;
const WARMUP_SECONDS: u64 = 2;
const BODY: &str = r#"{"item": "book", "qty": 1, "note": "bench"}"#;
const SHARED_DATA_CONFIG: &str = "{}";
const ETCD_CONFIG: &str = r#"{"store": {"kind": "etcd", "cluster": "etcd"}}"#;

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    SharedData,
    Etcd,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    FirstExecutions,
    Replays,
}

#[derive(Clone)]
struct Measured {
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

fn parse_wrk(text: &str) -> Result<Measured> {
    let mut m = Measured {
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
    name: String,
    store: Store,
    load: Load,
    envoy: Envoy,
    dir: PathBuf,
    script: PathBuf,
    best: Option<Measured>,
    rounds: Vec<f64>,
}

impl Case {
    fn start(store: Store, load: Load, config: EnvoyConfig) -> Result<Case> {
        let name = format!(
            "{}, {}",
            match store {
                Store::SharedData => "shared data",
                Store::Etcd => "etcd",
            },
            match load {
                Load::FirstExecutions => "first executions",
                Load::Replays => "replays",
            }
        );
        let dir = scratch_dir("bench-etcd")?;
        let script = dir.join("script.lua");
        std::fs::write(
            &script,
            lua(match load {
                Load::FirstExecutions => UNIQUE_LUA,
                Load::Replays => REPLAY_LUA,
            }),
        )?;
        let envoy = Envoy::start("bench-etcd", config)?;
        if store == Store::Etcd {
            wait_etcd_hosts_healthy(&envoy, 3, Duration::from_secs(10))?;
        }
        if load == Load::Replays {
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
            store,
            load,
            envoy,
            dir,
            script,
            best: None,
            rounds: Vec::new(),
        };
        case.wrk(WARMUP_SECONDS, "warmup")?;
        Ok(case)
    }

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
        let m = parse_wrk(&self.wrk(seconds, &format!("r{round}"))?)?;
        eprintln!(
            "  round {round} {:<26} {:>9.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  ({} requests, {} non-2xx{})",
            self.name,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.requests,
            m.non_2xx,
            if m.errors.is_empty() {
                String::new()
            } else {
                format!(", {}", m.errors)
            }
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

    /// The filter's own warnings (store errors name their cause there).
    fn warnings(&self) -> Vec<String> {
        self.envoy
            .log()
            .lines()
            .filter(|l| {
                l.contains("][wasm]") && (l.contains("][warning]") || l.contains("][error]"))
            })
            .map(str::to_string)
            .collect()
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// `…envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL` -> `1.40.0`.
fn envoy_version() -> String {
    Command::new("envoy")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let (_, rest) = text.split_once("version: ")?;
            rest.split('/').nth(1).map(str::to_string)
        })
        .unwrap_or_else(|| "?".into())
}

fn etcd_version() -> String {
    Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().last())
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
    let upstream = DemoUpstream::start(0, false)?;
    let port = upstream.port();
    let etcd = EtcdCluster::start("bench-etcd-cluster", 3)?;
    eprintln!(
        "bench-etcd: wrk -t{THREADS} -c{CONNECTIONS}, {WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s per case, Envoy --concurrency 2, 3-member etcd, loopback"
    );
    let load_before = load_average();
    let mut cases = Vec::new();
    for load in [Load::FirstExecutions, Load::Replays] {
        cases.push(Case::start(
            Store::SharedData,
            load,
            EnvoyConfig::single_node(port, &dedup, SHARED_DATA_CONFIG)?,
        )?);
        cases.push(Case::start(
            Store::Etcd,
            load,
            multi_proxy_config(&etcd, port, &dedup, ETCD_CONFIG)?,
        )?);
    }
    // Rounds interleave the cases, so a burst of other work on the machine
    // hits every case alike; each case reports its best round.
    for round in 1..=rounds {
        for case in cases.iter_mut() {
            case.measure(seconds, round)?;
        }
    }
    let records = etcd.count_keys("proxy-dedup/").unwrap_or(0);
    let mut results = Vec::new();
    for case in &cases {
        let Some(best) = case.best.clone() else {
            fail!("no measurement for {}", case.name)
        };
        let warnings = case.warnings();
        if !warnings.is_empty() {
            eprintln!(
                "  {}: {} filter warnings in the Envoy log; first: {}",
                case.name,
                warnings.len(),
                warnings[..warnings.len().min(3)].join("\n    ")
            );
        }
        results.push((case, best));
    }
    let baseline = |load: Load| {
        results
            .iter()
            .find(|(c, _)| c.store == Store::SharedData && c.load == load)
            .map(|(_, m)| (m.rps, m.p50_ms, m.p99_ms))
            .unwrap_or((1.0, 1.0, 1.0))
    };
    let mut table = String::from(
        "| case | req/s | p50 ms | p99 ms | req/s vs shared data | p50 vs shared data | p99 vs shared data | non-2xx | rounds (req/s) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (case, m) in &results {
        let (rps, p50, p99) = baseline(case.load);
        table.push_str(&format!(
            "| {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            case.name,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.rps / rps,
            m.p50_ms / p50,
            m.p99_ms / p99,
            m.non_2xx,
            case.rounds
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    println!("\n{table}");
    let counters: String = results
        .iter()
        .map(|(c, _)| (c.name.clone(), c.counters()))
        .filter(|(_, c)| !c.is_empty())
        .map(|(n, c)| format!("- {n}: {c}\n"))
        .collect();
    if std::env::var("BENCH_NO_WRITE").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let section = format!(
        "## etcd store\n\n\
`make bench-envoy` (envoy/src/bin/bench-etcd.rs). Real Envoy {} with \
`--concurrency 2` and the dedup filter, in front of the in-process demo \
upstream; the shared-data cases use `envoy/configs/single-node.yaml` with the \
default store, the etcd cases `envoy/configs/multi-proxy-etcd.yaml` with \
`\"store\": {{\"kind\": \"etcd\", \"cluster\": \"etcd\"}}` and a 3-member etcd {} \
(`--heartbeat-interval 50 --election-timeout 500`, data on the local disk, \
fsync on). Everything on 127.0.0.1 of one 2-core machine. Load: wrk \
`-t{THREADS} -c{CONNECTIONS}`, every request a `POST /orders` with a {}-byte \
JSON body. One Envoy per case, all started first; each gets a \
{WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s measured run \
the cases in turn (interleaved) and each case reports its best round \
(highest req/s; every round in the last column). First executions: a unique \
`Idempotency-Key` per request (claim in etcd, upstream call, completion \
write: two etcd transactions per request). Replays: one key answered from \
the stored record (the upstream is not called); with etcd, each worker keeps \
the completed records it has seen, so a hot key is replayed mostly without \
an etcd read and this case measures that tier. Ratios are to the shared-data \
case of the same load in the same run. wrk, Envoy, the upstream and the \
three etcd members share the 2 cores, so absolute figures are low and noisy; \
the ratios are the point. Load average before this run: {load_before} \
(above ~1 means other work competed for the cores). Records in etcd after \
the run: {records} (they expire with their leases).\n\n\
{table}\n\
Filter counters after each case (warm-up and all rounds):\n\n{counters}",
        envoy_version(),
        etcd_version(),
        BODY.len()
    );
    write_section(&section)?;
    eprintln!("wrote the \"## etcd store\" section of BENCHMARKS.md");
    Ok(())
}

/// Replace the "## etcd store" section of BENCHMARKS.md (or append it),
/// leaving other sections alone.
fn write_section(section: &str) -> Result<()> {
    let path = workspace_root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let new = match old.find("## etcd store") {
        Some(start) => {
            let after = &old[start + 2..];
            let end = after
                .find("\n## ")
                .map(|i| start + 2 + i + 1)
                .unwrap_or(old.len());
            format!("{}{}\n\n{}", &old[..start], section.trim_end(), &old[end..])
        }
        None => format!("{}\n\n{}\n", old.trim_end(), section.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-etcd: {e}");
        std::process::exit(1);
    }
}
