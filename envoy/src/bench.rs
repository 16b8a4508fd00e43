//! What the load benchmarks (`bench-envoy`, `bench-etcd`) share: wrk against
//! real Envoys on loopback, one Envoy per case, measured rounds interleaving
//! the cases with each case reporting its best round, the results table and
//! the BENCHMARKS.md section.

use crate::chart::{self, Chart, Panel, Series};
use crate::paths::{scratch_dir, workspace_root};
use crate::process::spawn;
use crate::{fail, EnvoyConfig, EnvoyProcess, Request, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub const THREADS: u32 = 2;
pub const CONNECTIONS: u32 = 32;
pub const BODY: &str = r#"{"item": "book", "qty": 1, "note": "bench"}"#;

/// The start of a script that numbers its requests per thread: `tid` is the
/// thread's number, `counter` counts its requests; `init` goes on.
macro_rules! numbered_lua {
    () => {
        r#"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  counter = 0
"#
    };
}

/// The start of a script whose every request is a JSON POST /orders.
macro_rules! post_orders_lua {
    () => {
        r#"
wrk.method = "POST"
wrk.path = "/orders"
wrk.body = BODY
wrk.headers["Content-Type"] = "application/json"
"#
    };
}

/// Every request: POST /orders with a JSON body and a key never used before.
pub const UNIQUE_LUA: &str = concat!(
    numbered_lua!(),
    r#"  prefix = "bench-" .. (args[1] or "run") .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/orders", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. counter,
  }, BODY)
end
"#
);

/// Every request: the same key and body, answered from the stored response.
pub const REPLAY_LUA: &str = concat!(
    post_orders_lua!(),
    r#"wrk.headers["Idempotency-Key"] = "bench-replay"
"#
);

/// Every request: GET /orders, a method the filter does not deduplicate.
pub const GET_LUA: &str = r#"
wrk.method = "GET"
wrk.path = "/orders"
"#;

/// Every request: POST /orders with a JSON body and no key (the default
/// config lets it through untouched).
pub const NO_KEY_LUA: &str = post_orders_lua!();

/// The body size of [`KEYLESS_64K_LUA`].
pub const BIG_BODY_BYTES: usize = 64 * 1024;

/// Every request: POST /orders with a 64 KiB JSON body never sent before and
/// no key (with `key.fingerprint` the key is the hash of method, path and
/// body: every request is a first execution).
pub const KEYLESS_64K_LUA: &str = concat!(
    numbered_lua!(),
    r#"  prefix = '{"run": "' .. (args[1] or "run") .. '-' .. tid .. '", "n": '
  pad = string.rep("x", BIG_BODY_BYTES - 64)
end
function request()
  counter = counter + 1
  local head = prefix .. string.format("%12d", counter) .. ', "pad": "'
  local body = head .. string.sub(pad, 1, BIG_BODY_BYTES - #head - 2) .. '"}'
  return wrk.format("POST", "/orders", {["Content-Type"] = "application/json"}, body)
end
"#
);

/// `BENCH_SECONDS` (default 3) per round and `BENCH_ROUNDS` (default 3).
pub struct Settings {
    pub seconds: u64,
    pub rounds: usize,
}

impl Settings {
    /// Fails when wrk is not installed.
    pub fn from_env() -> Result<Settings> {
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
        Ok(Settings { seconds, rounds })
    }
}

/// `BENCH_NO_WRITE=1`: leave BENCHMARKS.md alone.
pub fn no_write() -> bool {
    std::env::var("BENCH_NO_WRITE").is_ok_and(|v| v == "1")
}

/// One wrk run, as read from its output.
#[derive(Clone)]
pub struct Measured {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    pub non_2xx: u64,
    /// wrk's "Socket errors: …" line, or empty.
    pub errors: String,
    /// Envoy's own CPU time per request in this round (every thread's run
    /// time from `/proc/<pid>/task/*/schedstat`, over wrk's request count):
    /// unlike 1/throughput, other work on the machine does not inflate it.
    pub cpu_us: Option<f64>,
}

fn lua(script: &str) -> String {
    script
        .replace("BIG_BODY_BYTES", &BIG_BODY_BYTES.to_string())
        .replace("BODY", &format!("'{BODY}'"))
}

/// How wrk loads a case: its threads and connections, and the CPUs it is
/// pinned to (`taskset -c`), if any.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub threads: u32,
    pub connections: u32,
    pub cpus: Option<&'static str>,
}

impl Load {
    /// `-t2 -c32`, not pinned: what the load tables use.
    pub const DEFAULT: Load = Load {
        threads: THREADS,
        connections: CONNECTIONS,
        cpus: None,
    };
}

fn wrk(
    dir: &Path,
    url: &str,
    script: &Path,
    seconds: u64,
    tag: &str,
    load: Load,
) -> Result<String> {
    let out = dir.join(format!("wrk-{tag}.txt"));
    let mut cmd = match load.cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg("wrk");
            c
        }
        None => Command::new("wrk"),
    };
    cmd.arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
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
        cpu_us: None,
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
pub struct Case {
    pub name: String,
    pub envoy: EnvoyProcess,
    dir: PathBuf,
    script: PathBuf,
    best: Option<Measured>,
    rounds: Vec<f64>,
    /// Each round's Envoy CPU µs per request.
    cpu_rounds: Vec<f64>,
    load: Load,
}

/// The CPU time every thread of process `pid` has run, in ns (the first field
/// of each `/proc/<pid>/task/<tid>/schedstat`).
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

impl Case {
    /// A scratch directory `<label>-…` with the wrk script (`UNIQUE_LUA` or
    /// `REPLAY_LUA`), and an Envoy named `label` on `config`. Then, as the
    /// case needs: [`Case::prime_replay_key`], and [`Case::warm_up`].
    pub fn start(label: &str, name: &str, config: EnvoyConfig, script: &str) -> Result<Case> {
        Self::start_with(label, name, config, script, Load::DEFAULT)
    }

    /// [`Case::start`] with wrk loading it as `load` says.
    pub fn start_with(
        label: &str,
        name: &str,
        config: EnvoyConfig,
        script: &str,
        load: Load,
    ) -> Result<Case> {
        let dir = scratch_dir(label)?;
        let script_path = dir.join("script.lua");
        std::fs::write(&script_path, lua(script))?;
        let envoy = EnvoyProcess::start(label, config)?;
        Ok(Case {
            name: name.to_string(),
            envoy,
            dir,
            script: script_path,
            best: None,
            rounds: Vec::new(),
            cpu_rounds: Vec::new(),
            load,
        })
    }

    /// Stores the response that `REPLAY_LUA` replays.
    pub fn prime_replay_key(&self) -> Result<()> {
        let r = self.envoy.send(
            &Request::post("/orders")
                .key("bench-replay")
                .header("content-type", "application/json")
                .body(BODY),
        )?;
        if r.status != 200 {
            fail!("priming the replay key: {}", r.summary());
        }
        Ok(())
    }

    /// A run of wrk whose figures are not kept.
    pub fn warm_up(&self, seconds: u64) -> Result<()> {
        self.wrk(seconds, "warmup")?;
        Ok(())
    }

    fn wrk(&self, seconds: u64, round: &str) -> Result<String> {
        let tag = format!(
            "{}-{}-{round}",
            self.name.replace([' ', ','], "-"),
            std::process::id()
        );
        let url = format!("{}/orders", self.envoy.url());
        wrk(&self.dir, &url, &self.script, seconds, &tag, self.load)
    }

    /// One measured round; keeps the best (highest throughput) one. The
    /// progress line pads the name to `name_width`.
    fn measure(&mut self, seconds: u64, round: usize, name_width: usize) -> Result<()> {
        let pid = self.envoy.pid();
        let before = cpu_ns(pid);
        let mut m = parse_wrk(&self.wrk(seconds, &format!("r{round}"))?)?;
        if let (Some(b), Some(a)) = (before, cpu_ns(pid)) {
            if m.requests > 0 {
                let us = a.saturating_sub(b) as f64 / 1e3 / m.requests as f64;
                m.cpu_us = Some(us);
                self.cpu_rounds.push(us);
            }
        }
        eprintln!(
            "  round {round} {:<name_width$} {:>9.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  {:>6.1} CPU µs/req  ({} requests, {} non-2xx{})",
            self.name,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.cpu_us.unwrap_or(f64::NAN),
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

    /// Samples Envoy's CPU time with `perf record` while wrk loads this case
    /// for `seconds`, and splits Envoy's CPU µs per request by the object the
    /// samples fell in (`perf report --sort dso`): `envoy` (Envoy itself, V8's
    /// runtime and the host calls' C++ side, all in the one stripped binary),
    /// `JIT` (V8's compiled Wasm: the filter's own code), the kernel (sockets)
    /// and libc (memcpy, malloc). Objects under 1% are left out.
    pub fn profile(&self, seconds: u64) -> Result<Vec<(String, f64)>> {
        let data = self.dir.join("perf.data");
        let pid = self.envoy.pid();
        let before = cpu_ns(pid);
        let mut perf = Command::new("perf")
            .args(["record", "-q", "-F", "2999", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&data)
            .args(["--", "sleep"])
            .arg(seconds.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let load = self.wrk(seconds, "perf");
        let recorded = perf.wait()?;
        let m = parse_wrk(&load?)?;
        let (Some(b), Some(a)) = (before, cpu_ns(pid)) else {
            fail!("cannot read Envoy's CPU time for {}", self.name);
        };
        if !recorded.success() || m.requests == 0 {
            fail!("perf record failed for {}", self.name);
        }
        let cpu_us = a.saturating_sub(b) as f64 / 1e3 / m.requests as f64;
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--sort",
                "dso",
                "--percent-limit",
                "1",
                "-i",
            ])
            .arg(&data)
            .stderr(Stdio::null())
            .output()?;
        let mut shares = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut words = line.split_whitespace();
            let (Some(pct), Some(dso)) = (words.next(), words.next()) else {
                continue;
            };
            let Some(pct) = pct.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) else {
                continue;
            };
            let dso = match dso {
                "[JIT]" => "JIT (V8's Wasm code)",
                "[kernel.kallsyms]" => "kernel",
                "libc.so.6" => "libc",
                other => other,
            };
            shares.push((dso.to_string(), pct / 100.0 * cpu_us));
        }
        Ok(shares)
    }

    /// The best round.
    pub fn best(&self) -> Result<&Measured> {
        match &self.best {
            Some(best) => Ok(best),
            None => fail!("no measurement for {}", self.name),
        }
    }

    /// The median over the rounds of Envoy's CPU µs per request.
    pub fn cpu_us(&self) -> Option<f64> {
        let mut v = self.cpu_rounds.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }

    /// Every round's Envoy CPU µs per request: "41.2, 40.8, 41.0".
    pub fn cpu_rounds_text(&self) -> String {
        self.cpu_rounds
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every round's req/s: "1234, 1300, 1250".
    pub fn rounds_text(&self) -> String {
        self.rounds
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The filter's non-zero counters: "executed=1 replayed=10".
    pub fn counters(&self) -> String {
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

/// `benches/envoy/ceiling.yaml`: the setups where Envoy answers by itself.
pub const CEILING_TEMPLATE: &str = "benches/envoy/ceiling.yaml";

/// Where the ceiling listener's router sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeilingRoute {
    /// A `direct_response`: Envoy answers by itself, nothing upstream.
    Direct,
    /// The cluster `answer`: a second listener of the same Envoy whose
    /// `direct_response` plays the upstream (the filter sees an upstream answer).
    Answer,
}

/// An HTTP filter before the router in the ceiling setups.
#[derive(Debug, Clone)]
pub enum BenchFilter {
    /// Envoy's buffer filter (1 MiB): every request body is read whole first.
    Buffer,
    /// A Wasm module with its JSON configuration.
    Wasm { module: PathBuf, config: String },
}

impl BenchFilter {
    fn yaml(&self) -> String {
        match self {
            BenchFilter::Buffer => "          - name: envoy.filters.http.buffer
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 1048576
"
            .to_string(),
            BenchFilter::Wasm { module, config } => format!(
                "          - name: proxy_dedup
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: proxy_dedup
                root_id: \"\"
                allow_on_headers_stop_iteration: true
                configuration:
                  \"@type\": type.googleapis.com/google.protobuf.StringValue
                  value: '{}'
                vm_config:
                  vm_id: proxy_dedup
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {} }} }}
",
                config.replace('\'', "''"),
                module.display()
            ),
        }
    }
}

/// The ceiling template with `filters` (in order, before the router) and
/// `route`, with `workers` workers pinned to `cpus` when given.
pub fn ceiling_config(
    route: CeilingRoute,
    filters: &[BenchFilter],
    workers: u32,
    cpus: Option<&str>,
) -> Result<EnvoyConfig> {
    let route = match route {
        CeilingRoute::Direct => {
            r#"direct_response: { status: 200, body: { inline_string: "{\"order\": \"accepted\", \"id\": 42}" } }"#
        }
        CeilingRoute::Answer => "route: { cluster: answer, timeout: 15s }",
    };
    let filters: String = filters.iter().map(BenchFilter::yaml).collect();
    let template = workspace_root().join(CEILING_TEMPLATE);
    // The upstream port is not used by this template.
    let mut config = EnvoyConfig::no_filter(0)?
        .with_port("ANSWER_PORT")?
        .with_var("ROUTE", route)
        .with_var("HTTP_FILTERS", filters.trim_end_matches('\n'))
        .with_workers(workers, cpus);
    config.template = template;
    Ok(config)
}

/// The µs a case adds per request over `baseline` when one worker does all the
/// work: the difference of their inverse throughputs.
pub fn added_us(case: &Measured, baseline: &Measured) -> f64 {
    1e6 / case.rps - 1e6 / baseline.rps
}

/// `rounds` measured rounds of `seconds` each. Rounds interleave the cases,
/// so a burst of other work on the machine hits every case alike; each case
/// keeps its best round.
pub fn measure_interleaved(
    cases: &mut [Case],
    seconds: u64,
    rounds: usize,
    name_width: usize,
) -> Result<()> {
    for round in 1..=rounds {
        for case in cases.iter_mut() {
            case.measure(seconds, round, name_width)?;
        }
    }
    Ok(())
}

/// The table's header: case, req/s, p50, p99, then `ratio_columns`, then
/// non-2xx and the rounds.
pub fn table_header(ratio_columns: &[&str]) -> String {
    let mut names = String::from("| case | req/s | p50 ms | p99 ms |");
    let mut align = String::from("|---|---:|---:|---:|");
    for column in ratio_columns {
        names.push_str(&format!(" {column} |"));
        align.push_str("---:|");
    }
    format!("{names} non-2xx | rounds (req/s) |\n{align}---:|---|\n")
}

/// One row under [`table_header`]: `ratios` to two decimals, `last` in the
/// rounds column.
pub fn table_row(name: &str, m: &Measured, ratios: &[f64], last: &str) -> String {
    let mut row = format!(
        "| {} | {:.0} | {:.3} | {:.3} |",
        name, m.rps, m.p50_ms, m.p99_ms
    );
    for ratio in ratios {
        row.push_str(&format!(" {ratio:.2} |"));
    }
    row.push_str(&format!(" {} | {} |\n", m.non_2xx, last));
    row
}

/// "- <case>: <counters>" lines for the cases with any counter.
pub fn counters_list(cases: &[Case]) -> String {
    cases
        .iter()
        .map(|c| (c.name.as_str(), c.counters()))
        .filter(|(_, c)| !c.is_empty())
        .map(|(n, c)| format!("- {n}: {c}\n"))
        .collect()
}

/// Where the benchmarks write their charts (linked from BENCHMARKS.md).
pub const CHARTS_DIR: &str = "benches/charts";

/// One case of a load chart: its name, its best round, and the text after
/// its req/s (a ratio to the run's baseline).
pub struct ChartRow<'a> {
    pub name: &'a str,
    pub measured: &'a Measured,
    pub note: String,
}

/// A load benchmark as a chart: req/s per case (with its note, a ratio to
/// `baseline`), then p50 and p99.
pub fn load_chart(title: &str, subtitle: &str, baseline: &str, rows: &[ChartRow]) -> Chart {
    let rps = rows.iter().map(|r| Some(r.measured.rps)).collect();
    let rps_labels = rows
        .iter()
        .map(|r| {
            format!("{:.0} {}", r.measured.rps, r.note)
                .trim()
                .to_string()
        })
        .collect();
    let ms = |f: fn(&Measured) -> f64| rows.iter().map(|r| Some(f(r.measured))).collect();
    Chart {
        title: title.to_string(),
        subtitle: subtitle.to_string(),
        rows: rows.iter().map(|r| r.name.to_string()).collect(),
        panels: vec![
            Panel {
                title: format!("req/s, × {baseline} (higher is better)"),
                series: vec![Series::new("req/s", chart::BLUE, rps).labels(rps_labels)],
            },
            Panel {
                title: "latency, ms (lower is better)".into(),
                series: vec![
                    Series::new("p50", chart::GREEN, ms(|m| m.p50_ms)),
                    Series::new("p99", chart::VERMILLION, ms(|m| m.p99_ms)),
                ],
            },
        ],
    }
}

/// Write `chart` to `benches/charts/<file>` and say so on stderr; returns
/// the path relative to the workspace root, for a link in BENCHMARKS.md.
/// [`load_chart`] written to `file` (see [`write_chart`]), its subtitle `setup`
/// followed by wrk's load, the rounds and the load average before the run.
pub fn write_load_chart(
    file: &str,
    title: &str,
    setup: &str,
    settings: &Settings,
    load_before: &str,
    baseline: &str,
    rows: &[ChartRow],
) -> Result<String> {
    let Settings { seconds, rounds } = settings;
    let subtitle = format!(
        "{setup}, wrk -t{THREADS} -c{CONNECTIONS}, best of {rounds} rounds of {seconds} s, one 2-core machine, load average before: {load_before}"
    );
    write_chart(file, &load_chart(title, &subtitle, baseline, rows))
}

/// Seconds as the benchmark tables show them, in microseconds with 3
/// significant digits: `412 µs`, `3.5 µs`.
pub fn micros(seconds: f64) -> String {
    let us = seconds * 1e6;
    if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

pub fn write_chart(file: &str, chart: &Chart) -> Result<String> {
    let relative = format!("{CHARTS_DIR}/{file}");
    chart.write(&workspace_root().join(&relative))?;
    eprintln!("wrote {relative}");
    Ok(relative)
}

/// "AMD EPYC, 2 cores, 24 GiB": the CPU model, the cores and the memory of
/// this machine, for the text beside the results.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kb| (kb / (1024.0 * 1024.0)).round())
        .unwrap_or(0.0);
    format!("{cpu}, {cores} cores, {gib:.0} GiB")
}

/// When and where the run happened: `date -u` and the CPU model.
pub fn run_stamp() -> String {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{date}, {cores} cores ({cpu})")
}

/// The 1-minute load average, as text.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The release of the Envoy the benchmark runs (`ENVOY_BIN` or `envoy`),
/// e.g. `1.40.0`.
pub fn envoy_version() -> String {
    crate::envoy::version().unwrap_or_else(|_| "?".into())
}

/// Replace the section of BENCHMARKS.md that starts with `heading` (or
/// append it), leaving other sections alone, and say so on stderr.
pub fn write_section(heading: &str, section: &str) -> Result<()> {
    let path = workspace_root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    std::fs::write(&path, replace_section(&old, heading, section))?;
    eprintln!("wrote the \"{heading}\" section of BENCHMARKS.md");
    Ok(())
}

/// `old` with the section starting at `heading` (up to the next "## ") replaced
/// by `section`, or with `section` appended. A blank line separates it from a
/// following section; the text ends with one newline.
fn replace_section(old: &str, heading: &str, section: &str) -> String {
    match old.find(heading) {
        Some(start) => {
            let after = &old[start + 2..];
            match after.find("\n## ") {
                Some(i) => {
                    let end = start + 2 + i + 1;
                    format!("{}{}\n\n{}", &old[..start], section.trim_end(), &old[end..])
                }
                None => format!("{}{}\n", &old[..start], section.trim_end()),
            }
        }
        None => format!("{}\n\n{}\n", old.trim_end(), section.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nold etcd\n\n## Envoy load\n\nold envoy\n";

    #[test]
    fn a_section_followed_by_another_keeps_a_blank_line_before_it() {
        assert_eq!(
            replace_section(OLD, "## etcd store", "## etcd store\n\nnew etcd\n\n"),
            "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nnew etcd\n\n## Envoy load\n\nold envoy\n"
        );
    }

    #[test]
    fn the_last_section_ends_the_file_with_one_newline() {
        assert_eq!(
            replace_section(OLD, "## Envoy load", "## Envoy load\n\nnew envoy\n"),
            "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nold etcd\n\n## Envoy load\n\nnew envoy\n"
        );
    }

    #[test]
    fn a_missing_section_is_appended() {
        assert_eq!(
            replace_section("# Benchmarks\n", "## Envoy load", "## Envoy load\n\nx\n"),
            "# Benchmarks\n\n## Envoy load\n\nx\n"
        );
    }

    #[test]
    fn wrk_output_is_read() {
        let m = parse_wrk(
            "  Latency Distribution\n     50%    1.23ms\n     99%  850.00us\n  \
             1000 requests in 1.00s, 10 KB read\n  Socket errors: connect 0, read 1, write 0, timeout 0\n  \
             Non-2xx or 3xx responses: 2\nRequests/sec:   999.50\n",
        )
        .unwrap();
        assert_eq!(
            (m.rps, m.p50_ms, m.p99_ms, m.requests, m.non_2xx),
            (999.5, 1.23, 0.85, 1000, 2)
        );
        assert_eq!(
            m.errors,
            "Socket errors: connect 0, read 1, write 0, timeout 0"
        );
    }

    #[test]
    fn the_header_has_a_column_per_ratio() {
        assert_eq!(
            table_header(&["a", "b"]),
            "| case | req/s | p50 ms | p99 ms | a | b | non-2xx | rounds (req/s) |\n|---|---:|---:|---:|---:|---:|---:|---|\n"
        );
    }
}
