//! What the load benchmarks (`bench-envoy`, `bench-etcd`) share: wrk against
//! real Envoys on loopback, one Envoy per case, measured rounds interleaving
//! the cases with each case reporting its best round, the results table and
//! the BENCHMARKS.md section.

mod report;
mod wrk;

pub use report::{
    counters_list, envoy_version, load_average, load_chart, machine, micros, run_stamp,
    table_header, table_row, write_chart, write_load_chart, write_section, ChartRow, CHARTS_DIR,
};
pub use wrk::{Load, Measured};

use crate::paths::{scratch_dir, workspace_root};
use crate::{fail, EnvoyConfig, EnvoyProcess, Request, Result};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use wrk::{lua, parse_wrk, wrk};

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

/// `numbered_lua!()` for scripts built at run time (`format!`): what follows goes on
/// with `init`.
pub const NUMBERED_LUA: &str = numbered_lua!();

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

/// Every request a new key and a new entity at version 1 (`x-entity`, `x-version`): a
/// first execution whose entity the ordering guard claims and settles
/// (`ORDERING_CONFIG`).
pub const ORDERED_LUA: &str = concat!(
    numbered_lua!(),
    r#"  prefix = "bench-" .. (args[1] or "run") .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/orders", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. counter,
    ["X-Entity"] = prefix .. counter,
    ["X-Version"] = "1",
  }, BODY)
end
"#
);

/// The filter's configuration for `ORDERED_LUA`: the ordering guard on the entity and
/// version headers.
pub const ORDERING_CONFIG: &str =
    r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#;

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

/// `values` to `decimals` places, comma-separated: "41.2, 40.8, 41.0".
fn comma_list(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
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

/// The CPU time process `pid` has used, user and system, all threads (`utime` +
/// `stime` of `/proc/<pid>/stat`, in clock ticks: 10 ms resolution). `None` once
/// it is gone.
pub fn process_cpu(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces; the fields
    // after it start at field 3 (state), so utime (14) and stime (15) are 11 and 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).ok().filter(|t| *t > 0)?;
    Some(std::time::Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / per_second,
    ))
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

    /// Fills the store with first executions (unique keys, wrk runs of a few
    /// seconds) until the filter has executed `records` requests.
    pub fn fill(&self, records: u64) -> Result<()> {
        for run in 0.. {
            let executed = self.envoy.dedup_counter("executed").unwrap_or(0);
            if executed >= records {
                eprintln!("  {}: {executed} records stored", self.name);
                return Ok(());
            }
            if run == 200 {
                fail!(
                    "{}: only {executed} of {records} records after 200 runs",
                    self.name
                );
            }
            self.wrk(5, &format!("fill{run}"))?;
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
    /// progress line pads the name to `name_width`. [`measure_interleaved`] runs
    /// the rounds of several cases; a bench that samples something around each
    /// round (another process's CPU) calls this itself.
    pub fn measure(&mut self, seconds: u64, round: usize, name_width: usize) -> Result<()> {
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
        comma_list(&self.cpu_rounds, 1)
    }

    /// Every round's req/s, in the order run.
    pub fn rounds(&self) -> &[f64] {
        &self.rounds
    }

    /// Every round's req/s: "1234, 1300, 1250".
    pub fn rounds_text(&self) -> String {
        comma_list(&self.rounds, 0)
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
    /// The dedup module as the shipped templates mount it: wrapped in Envoy's
    /// matching (`dedupctl envoy-filter`), so methods it does not deduplicate
    /// skip it.
    Matched { module: PathBuf, config: String },
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
            BenchFilter::Matched { module, config } => {
                let module = module.display().to_string();
                let block = crate::envoy_filter::FilterBlock {
                    config,
                    wasm_path: &module,
                    vm_id: "proxy_dedup",
                };
                // A configuration the filter refuses: Envoy refuses it too.
                block.render(10).unwrap_or_else(|e| format!("# {e}\n"))
            }
        }
    }
}

/// The probe's host calls (host-test/probes/hostcall-probe), by the name its
/// configuration takes, with what the per-call table calls them.
pub const PROBED_CALLS: &[(&str, &str)] = &[
    ("get_header_map_value", "get_header_map_value (`:path`)"),
    (
        "get_header_map_value_absent",
        "get_header_map_value, absent header",
    ),
    (
        "get_header_map_pairs",
        "get_header_map_pairs, request (wrk's POST)",
    ),
    (
        "get_header_map_pairs_response",
        "get_header_map_pairs, response",
    ),
    ("get_property", "get_property (`request.path`)"),
    ("get_shared_data", "get_shared_data (96 B)"),
    ("get_shared_data_absent", "get_shared_data, absent key"),
    ("set_shared_data", "set_shared_data (96 B)"),
    ("get_buffer_bytes", "get_buffer_bytes, request body (43 B)"),
    ("set_property", "set_property (filter state)"),
    (
        "replace_header_map_value",
        "replace_header_map_value, response",
    ),
    ("increment_metric", "increment_metric"),
    (
        "get_current_time_nanoseconds",
        "get_current_time_nanoseconds",
    ),
    ("get_log_level", "get_log_level"),
];

/// The host calls each filter-cost case needs by the contract, in the probe's
/// names: the floor no implementation of it can go below. A deduplicated request
/// reads its headers once and its body once; a claim reads its bucket and writes
/// it; a completion reads the bucket again (its cas changed since the claim, and
/// `set_shared_data` does not return the new one), writes the response slot and
/// the bucket, reading the response's headers and body once and asking Envoy whether
/// the answer is the upstream's (`response.code_details`); a replay reads the
/// bucket and the response slot. Every request records its decision and its record
/// in two filter-state keys (the access-log contract), counts itself and its
/// decision, and reads the time where a record's expiry needs it. The replay's local
/// reply is not probed (its cost is Envoy's reply path, which the `direct_response`
/// baseline also pays).
pub const FLOOR_CALLS: &[(&str, &[(&str, f64)])] = &[
    (
        "dedup, GET entering the filter (bypassed)",
        &[("get_header_map_value", 1.0)],
    ),
    (
        "dedup, first execution, empty store",
        &[
            ("get_header_map_pairs", 1.0),
            ("get_buffer_bytes", 2.0),
            ("get_shared_data", 2.0),
            ("set_shared_data", 3.0),
            ("get_header_map_pairs_response", 1.0),
            ("get_property", 1.0),
            ("set_property", 2.0),
            ("increment_metric", 2.0),
            ("get_current_time_nanoseconds", 2.0),
        ],
    ),
    (
        "dedup, replay",
        &[
            ("get_header_map_pairs", 1.0),
            ("get_buffer_bytes", 1.0),
            ("get_shared_data", 2.0),
            ("set_property", 2.0),
            ("increment_metric", 2.0),
            ("get_current_time_nanoseconds", 1.0),
        ],
    ),
];

/// The host calls the dedup filter makes per request in these cases, by import, as
/// host-test counts them (`benches/benches/host_calls.rs`; the test
/// `filter_calls_match_host_test` in benches/ fails when they drift). Priced with the
/// probe's table (a header-map read at its request price), they say how much of what
/// the filter adds is host calls; `send_local_response` is not priced.
pub const FILTER_CALLS: &[(&str, &[(&str, f64)])] = &[
    (
        "dedup, GET entering the filter (bypassed)",
        &[
            ("get_header_map_pairs", 1.0),
            ("get_log_level", 1.0),
            ("increment_metric", 2.0),
            ("set_property", 1.0),
        ],
    ),
    (
        "dedup, first execution, empty store",
        &[
            ("get_buffer_bytes", 2.0),
            ("get_current_time_nanoseconds", 2.0),
            ("get_header_map_pairs", 2.0),
            ("get_log_level", 1.0),
            ("get_property", 1.0),
            ("get_shared_data", 3.0),
            ("increment_metric", 2.0),
            ("set_property", 2.0),
            ("set_shared_data", 3.0),
        ],
    ),
    (
        "dedup, replay",
        &[
            ("get_buffer_bytes", 1.0),
            ("get_current_time_nanoseconds", 1.0),
            ("get_header_map_pairs", 1.0),
            ("get_log_level", 1.0),
            ("get_shared_data", 2.0),
            ("increment_metric", 2.0),
            ("send_local_response", 1.0),
            ("set_property", 2.0),
        ],
    ),
];

/// The µs a list of calls costs at `per_call` (µs per call by the probe's name;
/// imports the probe does not price are left out).
pub fn priced(calls: &[(&str, f64)], per_call: &[(String, f64)]) -> f64 {
    calls
        .iter()
        .filter_map(|(name, n)| {
            per_call
                .iter()
                .find(|(probe, _)| probe == name)
                .map(|(_, us)| n * us)
        })
        .sum()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_listed_to_their_decimals() {
        assert_eq!(comma_list(&[1234.4, 1300.0, 1250.2], 0), "1234, 1300, 1250");
        assert_eq!(comma_list(&[41.23, 40.8], 1), "41.2, 40.8");
        assert_eq!(comma_list(&[], 1), "");
    }

    #[test]
    fn a_process_cpu_time_is_read_from_proc_and_grows_with_work() {
        let me = std::process::id();
        let before = process_cpu(me).unwrap();
        // Work until the kernel has counted some of it (a tick at most, usually);
        // the bound only keeps a broken reader from spinning for ever.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while process_cpu(me).unwrap() <= before && std::time::Instant::now() < give_up {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
        assert!(process_cpu(me).unwrap() > before);
        assert_eq!(process_cpu(u32::MAX), None);
    }
}
