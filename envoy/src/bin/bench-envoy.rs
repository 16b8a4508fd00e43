//! `make bench-envoy`: wrk against Envoy on loopback, in one run:
//! no filter, the empty Wasm filter, dedup with unique keys, dedup replays.
//! Prints throughput and latency (p50, p99) with ratios to the no-filter and
//! empty-filter baselines of the same run, and writes the "## Envoy load"
//! section of BENCHMARKS.md with its chart, benches/charts/envoy-load.svg. `BENCH_SECONDS` (default 3) per case,
//! `BENCH_NO_WRITE=1` to leave BENCHMARKS.md alone; `BENCH_PERF=1` adds a `perf record` profile of
//! each filter-cost case (share of Envoy's samples per object: its binary, V8's code, the kernel).

use dedup_envoy::bench::{
    added_us, ceiling_config, counters_list, envoy_version, load_average, measure_interleaved,
    no_write, priced, run_stamp, table_header, table_row, write_load_chart, write_section,
    BenchFilter, Case, CeilingRoute, ChartRow, Load, Measured, Settings, BIG_BODY_BYTES, BODY,
    CONNECTIONS, FILTER_CALLS, FLOOR_CALLS, GET_LUA, KEYLESS_64K_LUA, NO_KEY_LUA, ORDERED_LUA,
    ORDERING_CONFIG, PROBED_CALLS, REPLAY_LUA, THREADS, UNIQUE_LUA,
};
use dedup_envoy::config::WORKERS;
use dedup_envoy::paths::{dedup_wasm, dist_wasm, empty_wasm, hostcall_probe_wasm};
use dedup_envoy::{DemoUpstream, EnvoyConfig, Result};
use std::path::PathBuf;

const WARMUP_SECONDS: u64 = 1;

fn start_case(name: &str, config: EnvoyConfig, script: &str, prime: bool) -> Result<Case> {
    let case = Case::start("bench", name, config, script)?;
    if prime {
        case.prime_replay_key()?;
    }
    case.warm_up(WARMUP_SECONDS)?;
    Ok(case)
}

/// `BENCH_PART=load`, `cost`, `calls`, `phases` or `workers` (or a comma list, e.g. `calls,cost`:
/// the filter-cost section prices host calls only when `calls` ran first in the same
/// run) runs only those sections.
fn part(name: &str) -> bool {
    std::env::var("BENCH_PART").map_or(true, |p| p.is_empty() || p.split(',').any(|x| x == name))
}

fn run() -> Result<()> {
    if part("load") {
        envoy_load()?;
    }
    let mut per_call = Vec::new();
    if part("calls") {
        per_call = host_call_cost()?;
    }
    if part("cost") {
        filter_cost(&per_call)?;
    }
    if part("phases") {
        phases()?;
    }
    if part("workers") {
        workers()?;
    }
    Ok(())
}

fn envoy_load() -> Result<()> {
    let Settings { seconds, rounds } = Settings::from_env()?;
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
        (
            "direct_response (ceiling)",
            ceiling_config(CeilingRoute::Direct, &[], WORKERS, None)?,
            REPLAY_LUA,
            false,
        ),
    ];
    let load_before = load_average();
    let mut started = Vec::new();
    for (name, config, script, prime) in cases {
        started.push(start_case(name, config, script, prime)?);
    }
    measure_interleaved(&mut started, seconds, rounds, 22)?;
    let mut results = Vec::new();
    for case in &started {
        results.push((case, case.best()?));
    }
    let base = results[0].1;
    let empty_filter = results[1].1;
    let ceiling = results[4].1;
    let mut table = table_header(&[
        "req/s vs no filter",
        "req/s vs empty filter",
        "req/s vs direct_response",
        "p50 vs no filter",
        "p99 vs no filter",
        "p50 vs empty",
        "p99 vs empty",
    ]);
    for (case, m) in &results {
        // The rounds column also carries wrk's socket errors of the best round.
        let last = format!(
            "{}{}",
            if m.errors.is_empty() {
                String::new()
            } else {
                format!("{}; ", m.errors)
            },
            case.rounds_text()
        );
        table.push_str(&table_row(
            &case.name,
            m,
            &[
                m.rps / base.rps,
                m.rps / empty_filter.rps,
                m.rps / ceiling.rps,
                m.p50_ms / base.p50_ms,
                m.p99_ms / base.p99_ms,
                m.p50_ms / empty_filter.p50_ms,
                m.p99_ms / empty_filter.p99_ms,
            ],
            last.trim(),
        ));
    }
    println!("\n{table}");
    let counters = counters_list(&started);
    if no_write() {
        return Ok(());
    }
    let version = envoy_version();
    let rows: Vec<ChartRow> = results
        .iter()
        .map(|(case, m)| ChartRow {
            name: &case.name,
            measured: m,
            note: format!("×{:.2}", m.rps / base.rps),
        })
        .collect();
    let chart = write_load_chart(
        "envoy-load.svg",
        "Envoy load: proxy-dedup against no filter and the empty Wasm filter",
        &format!("Envoy {version}, --concurrency 2"),
        &Settings { seconds, rounds },
        &load_before,
        "the no-filter case",
        &rows,
    )?;
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
called); and Envoy answering every request by itself with a `direct_response` \
route (`benches/envoy/ceiling.yaml`, no filter, no upstream): no filter can \
answer a replay faster, so it is the ceiling for replays. Ratios are to the baselines of the same run. wrk, Envoy and the upstream \
share the 2 cores, so absolute figures are low and noisy; the ratios are the point. \
Run: {}. Load average before this run: {load_before} (anything above ~1 means other work \
competed for the cores; figures then vary by tens of percent between runs).\n\n\
{table}\n\
![Envoy load: req/s, p50 and p99 per case]({chart})\n\n\
Filter counters after each dedup case:\n\n{counters}",
        version,
        BODY.len(),
        run_stamp()
    );
    write_section("## Envoy load", &section)?;
    Ok(())
}

/// Envoy's worker and wrk on separate cores in the filter-cost section.
const ENVOY_CPU: &str = "0";
const WRK_CPU: &str = "1";
const COST_LOAD: Load = Load {
    threads: 1,
    connections: 16,
    cpus: Some(WRK_CPU),
};

/// `BENCH_CASES=a,b`: only the cases whose names contain one of these, with their
/// baselines (indices renumbered). Unset: every case.
fn wanted_cases(cases: &[CostCase]) -> Vec<CostCase> {
    let Ok(wanted) = std::env::var("BENCH_CASES") else {
        return cases.to_vec();
    };
    let picked = |c: &CostCase| {
        wanted
            .split(',')
            .any(|w| !w.is_empty() && c.name.contains(w))
    };
    let keep: Vec<bool> = (0..cases.len())
        .map(|i| picked(&cases[i]) || cases.iter().any(|c| picked(c) && c.baseline == i))
        .collect();
    let index = |i: usize| keep[..i].iter().filter(|k| **k).count();
    cases
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(c, _)| CostCase {
            baseline: index(c.baseline),
            ..c.clone()
        })
        .collect()
}

/// The Wasm filter of a filter-cost case, after the buffer filter.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CostWasm {
    None,
    Empty,
    /// The dedup filter with this configuration, always entered.
    Dedup(&'static str),
    /// The dedup filter in the shipped templates' matcher (`dedupctl envoy-filter`).
    Matched(&'static str),
    /// The host-call probe with this configuration (a mimic of the filter's calls).
    Probe(&'static str),
    /// The dedup module `BENCH_BEFORE` names (a build before a change), this config.
    Before(&'static str),
}

/// One case of the filter-cost section: its filters, the wrk script, the
/// filter config, whether to prime the replay key, and the index of its
/// baseline (the empty filter with the same requests).
#[derive(Clone)]
struct CostCase {
    name: &'static str,
    wasm: CostWasm,
    script: &'static str,
    prime: bool,
    /// Records stored before the warm-up (the store's fill).
    fill: u64,
    baseline: usize,
    /// `Direct`: Envoy answers by itself (the baseline of a replay, which
    /// never goes upstream either).
    route: CeilingRoute,
}

/// The filter's own µs per request in Envoy: one worker pinned to one core,
/// wrk pinned to the other, the upstream a `direct_response` listener of the
/// same Envoy, every body read whole by the buffer filter first.
fn filter_cost(per_call: &[(String, f64)]) -> Result<()> {
    let Settings { seconds, rounds } = Settings::from_env()?;
    let dedup = dedup_wasm()?;
    let empty = empty_wasm()?;
    let probe = hostcall_probe_wasm()?;
    eprintln!(
        "bench-envoy, filter cost: Envoy --concurrency 1 on CPU {ENVOY_CPU}, wrk -t{} -c{} on CPU {WRK_CPU}, {rounds} rounds of {seconds} s",
        COST_LOAD.threads, COST_LOAD.connections
    );
    use CeilingRoute::{Answer, Direct};
    const BIG: &str = KEYLESS_64K_LUA;
    const KEYLESS: &str = KEYLESS_CONFIG;
    // 90% of the default capacity (100000 records).
    const FULL: u64 = 90_000;
    let case = |name, wasm, script, baseline, route| CostCase {
        name,
        wasm,
        script,
        prime: script == REPLAY_LUA,
        fill: 0,
        baseline,
        route,
    };
    // Baselines (indices): 0 no Wasm with small POSTs, 1 no Wasm with GETs,
    // 2 the empty filter with small POSTs, 3 with GETs, 4 with 64 KiB POSTs,
    // 5 small POSTs answered by Envoy itself.
    let cases = [
        case(
            "buffer filter only, POST",
            CostWasm::None,
            NO_KEY_LUA,
            0,
            Answer,
        ),
        case(
            "buffer filter only, GET",
            CostWasm::None,
            GET_LUA,
            1,
            Answer,
        ),
        case("empty filter, POST", CostWasm::Empty, NO_KEY_LUA, 2, Answer),
        case("empty filter, GET", CostWasm::Empty, GET_LUA, 3, Answer),
        case("empty filter, POST 64 KiB", CostWasm::Empty, BIG, 4, Answer),
        case(
            "empty filter, POST, direct_response",
            CostWasm::Empty,
            NO_KEY_LUA,
            5,
            Direct,
        ),
        case(
            "dedup in the template's matcher, GET",
            CostWasm::Matched("{}"),
            GET_LUA,
            1,
            Answer,
        ),
        case(
            "dedup, GET entering the filter (bypassed)",
            CostWasm::Dedup("{}"),
            GET_LUA,
            3,
            Answer,
        ),
        case(
            "dedup, POST without a key",
            CostWasm::Dedup("{}"),
            NO_KEY_LUA,
            2,
            Answer,
        ),
        case(
            "dedup, first execution, empty store",
            CostWasm::Dedup("{}"),
            UNIQUE_LUA,
            2,
            Answer,
        ),
        CostCase {
            fill: FULL,
            ..case(
                "dedup, first execution, store 90% full",
                CostWasm::Dedup("{}"),
                UNIQUE_LUA,
                2,
                Answer,
            )
        },
        case(
            "dedup, replay",
            CostWasm::Dedup("{}"),
            REPLAY_LUA,
            5,
            Answer,
        ),
        case(
            "dedup, keyless 64 KiB",
            CostWasm::Dedup(KEYLESS),
            BIG,
            4,
            Answer,
        ),
        case(
            "dedup with ordering, first execution",
            CostWasm::Dedup(ORDERING_CONFIG),
            ORDERED_LUA,
            9,
            Answer,
        ),
        // The filter's host calls and pause with no logic between them
        // (hostcall-probe's mimics): what any code making those calls pays.
        case(
            "mimic of a first execution's calls",
            CostWasm::Probe("mimic_first_execution"),
            UNIQUE_LUA,
            2,
            Answer,
        ),
        case(
            "mimic of a replay's calls",
            CostWasm::Probe("mimic_replay"),
            REPLAY_LUA,
            5,
            Answer,
        ),
    ];
    // `BENCH_BEFORE=path.wasm`: the same first execution and replay with that module
    // too, interleaved in the same run (a change's before and after).
    let before = std::env::var("BENCH_BEFORE")
        .ok()
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    let mut cases = cases.to_vec();
    if before.is_some() {
        cases.push(case(
            "before: dedup, first execution, empty store",
            CostWasm::Before("{}"),
            UNIQUE_LUA,
            2,
            Answer,
        ));
        cases.push(case(
            "before: dedup, replay",
            CostWasm::Before("{}"),
            REPLAY_LUA,
            5,
            Answer,
        ));
    }
    let cases = wanted_cases(&cases);
    let load_before = load_average();
    let mut started = Vec::new();
    for case in &cases {
        let mut filters = vec![BenchFilter::Buffer];
        match case.wasm {
            CostWasm::None => {}
            CostWasm::Empty => filters.push(BenchFilter::Wasm {
                module: empty.clone(),
                config: "{}".into(),
            }),
            CostWasm::Dedup(config) => filters.push(BenchFilter::Wasm {
                module: dedup.clone(),
                config: config.into(),
            }),
            CostWasm::Matched(config) => filters.push(BenchFilter::Matched {
                module: dedup.clone(),
                config: config.into(),
            }),
            CostWasm::Probe(config) => filters.push(BenchFilter::Wasm {
                module: probe.clone(),
                config: config.into(),
            }),
            CostWasm::Before(config) => filters.push(BenchFilter::Wasm {
                module: before.clone().unwrap_or_else(|| dedup.clone()),
                config: config.into(),
            }),
        }
        let config = ceiling_config(case.route, &filters, 1, Some(ENVOY_CPU))?;
        let c = Case::start_with("bench-cost", case.name, config, case.script, COST_LOAD)?;
        if case.prime {
            c.prime_replay_key()?;
        }
        if case.fill > 0 {
            c.fill(case.fill)?;
        }
        c.warm_up(WARMUP_SECONDS)?;
        started.push(c);
    }
    measure_interleaved(&mut started, seconds, rounds, 42)?;
    let mut best: Vec<&Measured> = Vec::new();
    for c in &started {
        best.push(c.best()?);
    }
    let mut table = String::from(
        "| case | req/s | Envoy CPU µs per request | baseline | added CPU µs | CPU: baseline / case | added µs by throughput | req/s vs baseline | non-2xx | CPU µs per request, each round | req/s, each round |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|\n",
    );
    let mut added = Vec::new();
    for (i, (case, c)) in cases.iter().zip(&started).enumerate() {
        let m = best[i];
        let b = best[case.baseline];
        let cpu = c.cpu_us().unwrap_or(f64::NAN);
        let base_cpu = started[case.baseline].cpu_us().unwrap_or(f64::NAN);
        added.push((case.name, cpu - base_cpu));
        table.push_str(&format!(
            "| {} | {:.0} | {:.1} | {} | {:+.1} | {:.2} | {:+.1} | {:.2} | {} | {} | {} |\n",
            case.name,
            m.rps,
            cpu,
            cases[case.baseline].name,
            cpu - base_cpu,
            base_cpu / cpu,
            added_us(m, b),
            m.rps / b.rps,
            m.non_2xx,
            c.cpu_rounds_text(),
            c.rounds_text()
        ));
    }
    println!("\n{table}");
    let floors = calls_table(per_call, &added);
    println!("{floors}");
    let floors = if floors.is_empty() {
        String::new()
    } else {
        format!(
            "\nWhat the host calls explain (priced with \"Host calls in Envoy\" of the same \
run): the floor is the calls the contract needs (`FLOOR_CALLS` in envoy/src/bench.rs, \
with the reason for each), the filter's calls are those host-test counts for it \
(`FILTER_CALLS`, checked against host-test by a test); the rest of what the filter adds \
is its own Wasm and Envoy's work around the calls.\n\n{floors}"
        )
    };
    let mimics = mimic_table(&added);
    println!("{mimics}");
    let profile = if std::env::var("BENCH_PERF").is_ok_and(|v| v == "1") {
        let t = profile_table(&cases, &started, seconds)?;
        println!("{t}");
        format!(
            "\nWhere Envoy's CPU time goes (`BENCH_PERF=1`: one more {seconds} s run of each \
case under `perf record -F 2999 -p <envoy>`; each object's share of the samples times \
the run's CPU µs per request). `envoy` is the stripped Envoy binary: Envoy's own HTTP \
work, V8's runtime and the C++ side of every host call (shared-data lookups and \
copies, header maps, filter state, local replies); `JIT` is V8's compiled Wasm, the \
filter's own code; `kernel` is mostly the sockets.\n\n{t}"
        )
    } else {
        String::new()
    };
    let counters = counters_list(&started);
    if no_write() {
        return Ok(());
    }
    let section = format!(
        "## Filter cost in Envoy\n\n\
`make bench-envoy` (envoy/src/bin/bench-envoy.rs, `BENCH_PART=cost` for this \
section alone). What the filter itself costs per request inside Envoy, with \
nothing else on the worker's core: Envoy {} with `--concurrency 1` pinned to \
CPU {ENVOY_CPU}, wrk `-t{} -c{}` pinned to CPU {WRK_CPU}; the config \
`benches/envoy/ceiling.yaml`: Envoy's buffer filter (so every case reads the \
whole body before the answer), the Wasm filter under test, and a route to a \
second listener of the same Envoy that reads the whole request (its own buffer \
filter, so connections are kept alive) and answers with a `direct_response` (the \
filter sees an upstream answer and stores it, yet no other process runs). The \
worker does all the work, so 1/throughput is its time per request, and the \
difference to the empty Wasm filter with the same requests is what the filter \
adds (\"added µs by throughput\"). \"Envoy CPU µs per request\" is the CPU time all \
of Envoy's threads ran in a round (`/proc/<pid>/task/*/schedstat`) over the round's \
requests, the median of the rounds; other work on the machine inflates it less than \
1/throughput (a VM's steal time and shared caches still do), so \"added CPU µs\" and \
\"CPU: baseline / case\" (the throughput a saturated worker keeps) are the figures to \
read on a busy machine. Requests: `POST /orders` with a {}-byte JSON body (no key; \
a unique `Idempotency-Key`; the same key, replayed), `GET /orders` (a method \
the filter does not deduplicate: through the shipped templates' matcher, where it \
never enters Wasm, against no Wasm filter at all; and entering the filter, against \
the empty filter), and a unique {} KiB JSON body with \
`key.fingerprint: [method, path, body]`. \"Store 90% full\": the store (default \
`capacity`, 100000 records) filled with 90000 first executions before the warm-up, \
and still taking new keys (evicting) while measured. A replay never goes upstream, so its \
baseline is the empty filter on a route where Envoy answers by itself \
(`direct_response`): the ceiling no filter can pass. {rounds} rounds of {seconds} s, \
interleaved, best round per case. Run: {}. Load average before this run: {load_before} \
(above ~1 means other work competed for the cores).\n\n{table}{floors}\n{mimics}{profile}\n\
Filter counters after each case:\n\n{counters}",
        envoy_version(),
        COST_LOAD.threads,
        COST_LOAD.connections,
        BODY.len(),
        BIG_BODY_BYTES / 1024,
        run_stamp(),
    );
    write_section("## Filter cost in Envoy", &section)?;
    Ok(())
}

/// The dedup cases and their mimics (hostcall-probe making the same host calls in the
/// same hooks, with the same pause, and nothing else): the filter's own logic is the
/// difference. Empty when the cases did not run.
fn mimic_table(added: &[(&str, f64)]) -> String {
    let of = |name: &str| added.iter().find(|(n, _)| *n == name).map(|(_, us)| *us);
    let mut rows = String::new();
    for (case, mimic) in [
        (
            "dedup, first execution, empty store",
            "mimic of a first execution's calls",
        ),
        ("dedup, replay", "mimic of a replay's calls"),
    ] {
        if let (Some(c), Some(m)) = (of(case), of(mimic)) {
            rows.push_str(&format!("| {case} | {c:+.1} | {m:+.1} | {:+.1} |\n", c - m));
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "The calls against the logic: each dedup case beside its mimic \
(`host-test/probes/hostcall-probe`, `mimic_*`: the host calls host-test counts for the case, \
in the same hooks, on values of the same sizes, with the same pause of the request, and \
no other code), both as added CPU µs over the same baseline. The mimic's figure is what \
any filter making those calls pays in this Envoy; the rest is the filter's own Wasm.\n\n\
| case | added CPU µs | its mimic's | the filter's own logic |\n|---|---:|---:|---:|\n{rows}\n"
    )
}

/// Calls the probe makes per request in each per-call case.
const PROBE_CALLS: u32 = 100;

/// What one host call of each kind costs in this Envoy: the probe making it
/// `PROBE_CALLS` times per request against the probe making none, both behind the
/// buffer filter on the answer route, one worker pinned as in the filter-cost
/// section. Returns µs per call (CPU), by the probe's call name.
fn host_call_cost() -> Result<Vec<(String, f64)>> {
    let Settings { seconds, rounds } = Settings::from_env()?;
    let probe = hostcall_probe_wasm()?;
    eprintln!(
        "bench-envoy, host calls: the probe making each call {PROBE_CALLS}× per request, Envoy --concurrency 1 on CPU {ENVOY_CPU}, {rounds} rounds of {seconds} s"
    );
    let load_before = load_average();
    let mut started = Vec::new();
    let mut names = vec![("none", "no call (baseline)")];
    names.extend(PROBED_CALLS.iter().copied());
    for (call, label) in &names {
        let n = if *call == "none" { 0 } else { PROBE_CALLS };
        let filters = [
            BenchFilter::Buffer,
            BenchFilter::Wasm {
                module: probe.clone(),
                config: format!("{call} {n}"),
            },
        ];
        let config = ceiling_config(CeilingRoute::Answer, &filters, 1, Some(ENVOY_CPU))?;
        let c = Case::start_with("bench-calls", label, config, NO_KEY_LUA, COST_LOAD)?;
        c.warm_up(WARMUP_SECONDS)?;
        started.push(c);
    }
    measure_interleaved(&mut started, seconds, rounds, 44)?;
    let base = started[0].best()?.clone();
    let base_cpu = started[0].cpu_us().unwrap_or(f64::NAN);
    let mut table = String::from(
        "| call | µs per call (CPU) | µs per call (by throughput) | probe's CPU µs per request | req/s | CPU µs per request, each round |\n|---|---:|---:|---:|---:|---|\n",
    );
    let mut per_call = Vec::new();
    for ((call, label), c) in names.iter().zip(&started) {
        let m = c.best()?;
        let cpu = c.cpu_us().unwrap_or(f64::NAN);
        let (us_cpu, us_rps) = if *call == "none" {
            (0.0, 0.0)
        } else {
            let n = f64::from(PROBE_CALLS);
            ((cpu - base_cpu) / n, added_us(m, &base) / n)
        };
        if *call != "none" {
            per_call.push((call.to_string(), us_cpu));
        }
        table.push_str(&format!(
            "| {label} | {us_cpu:.2} | {us_rps:.2} | {cpu:.1} | {:.0} | {} |\n",
            m.rps,
            c.cpu_rounds_text()
        ));
    }
    println!("\n{table}");
    if !no_write() {
        let section = format!(
            "## Host calls in Envoy: what each costs\n\n\
`make bench-envoy` (`BENCH_PART=calls` for this section alone; the filter-cost \
section's floor needs it in the same run). A probe of our own \
(`host-test/probes/hostcall-probe`, the ABI without the SDK, as the filter's glue \
speaks it) makes one kind of host call {PROBE_CALLS} times per request and nothing \
else; each case's Envoy CPU µs per request over the probe making no call, divided \
by {PROBE_CALLS}, is one call's cost. Envoy {} with `--concurrency 1` pinned to CPU \
{ENVOY_CPU}, wrk `-t{} -c{}` pinned to CPU {WRK_CPU}, every request a `POST /orders` \
with a {}-byte JSON body behind Envoy's buffer filter, routed to a second listener \
of the same Envoy that reads it and answers (`benches/envoy/ceiling.yaml`). \
{rounds} rounds of {seconds} s, interleaved, best round per case; CPU figures are \
the median of the rounds. Run: {}. Load average before this run: {load_before}.\n\n{table}",
            envoy_version(),
            COST_LOAD.threads,
            COST_LOAD.connections,
            BODY.len(),
            run_stamp(),
        );
        write_section("## Host calls in Envoy: what each costs", &section)?;
    }
    Ok(per_call)
}

/// The floor and the filter's own calls of the cases that have them, priced with
/// the per-call table of the same run.
fn calls_table(per_call: &[(String, f64)], added: &[(&str, f64)]) -> String {
    if per_call.is_empty() {
        return String::new();
    }
    let mut t = String::from(
        "| case | added CPU µs | floor: the calls the contract needs | the filter's host calls, priced | the rest (the filter's own work and Envoy's around it) |\n|---|---:|---:|---:|---:|\n",
    );
    for (name, floor) in FLOOR_CALLS {
        let Some((_, add)) = added.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let own = FILTER_CALLS
            .iter()
            .find(|(n, _)| n == name)
            .map_or(f64::NAN, |(_, calls)| priced(calls, per_call));
        t.push_str(&format!(
            "| {name} | {add:+.1} | {:.1} | {own:.1} | {:+.1} |\n",
            priced(floor, per_call),
            add - own
        ));
    }
    t
}

/// `BENCH_PERF=1`: one more run of each case under `perf record`, Envoy's CPU
/// µs per request split by object, and each dedup case's difference to its
/// baseline by object.
fn profile_table(cases: &[CostCase], started: &[Case], seconds: u64) -> Result<String> {
    let mut profiles = Vec::new();
    for c in started {
        profiles.push(c.profile(seconds)?);
    }
    let objects = ["envoy", "JIT (V8's Wasm code)", "kernel", "libc"];
    let us = |p: &[(String, f64)], o: &str| {
        p.iter()
            .filter(|(name, _)| name == o)
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let mut t = String::from(
        "| case | Envoy CPU µs per request, by object (perf) | added over the baseline, by object |\n|---|---|---|\n",
    );
    for (i, case) in cases.iter().enumerate() {
        let own: Vec<String> = objects
            .iter()
            .map(|o| format!("{o} {:.1}", us(&profiles[i], o)))
            .collect();
        let added: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{o} {:+.1}",
                    us(&profiles[i], o) - us(&profiles[case.baseline], o)
                )
            })
            .collect();
        t.push_str(&format!(
            "| {} | {} | {} |\n",
            case.name,
            own.join(", "),
            added.join(", ")
        ));
    }
    Ok(t)
}

/// The phase-timed module's cases: name, filter configuration, wrk script, primed.
const PHASE_CASES: [(&str, &str, &str, bool); 4] = [
    ("first execution", "{}", UNIQUE_LUA, false),
    ("replay", "{}", REPLAY_LUA, true),
    (
        "first execution with ordering",
        ORDERING_CONFIG,
        ORDERED_LUA,
        false,
    ),
    // `body_hash` here is BLAKE3's own time over 64 KiB in V8.
    (
        "keyless 64 KiB, first execution",
        KEYLESS_CONFIG,
        KEYLESS_64K_LUA,
        false,
    ),
];

/// Keyless mode on method, path and body (the 64 KiB cases).
const KEYLESS_CONFIG: &str = r#"{"key": {"fingerprint": ["method", "path", "body"]}}"#;

/// `BENCH_PART=phases`: where a request's time goes inside the filter. The phase-timed
/// module (`dist/dedup_filter_phases.wasm`, `--features phase-timing`) in the filter-cost
/// setup (one worker pinned, wrk pinned to the other core, the upstream a
/// `direct_response` listener of the same Envoy); after a warm-up, one run per case,
/// and each phase's counters read before and after it: its mean µs per request and its
/// calls per request. Writes "## Where the time goes".
fn phases() -> Result<()> {
    let Settings { seconds, .. } = Settings::from_env()?;
    let module = dist_wasm("dedup_filter_phases.wasm")?;
    let load_before = load_average();
    let mut tables = String::new();
    for (name, config, script, prime) in PHASE_CASES {
        let filters = [
            BenchFilter::Buffer,
            BenchFilter::Wasm {
                module: module.clone(),
                config: config.into(),
            },
        ];
        let envoy_config = ceiling_config(CeilingRoute::Answer, &filters, 1, Some(ENVOY_CPU))?;
        let mut c = Case::start_with("bench-phases", name, envoy_config, script, COST_LOAD)?;
        if prime {
            c.prime_replay_key()?;
        }
        c.warm_up(WARMUP_SECONDS)?;
        let before = c.envoy.dedup_counters()?;
        c.measure(seconds, 1, 32)?;
        let after = c.envoy.dedup_counters()?;
        let delta = |k: &str| {
            after
                .get(k)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get(k).copied().unwrap_or(0))
        };
        // The phases of the requests reported (every worker reports every 16 streams).
        let requests = delta("phase_head_read_count").max(1) as f64;
        let mut rows: Vec<(&str, f64, f64)> = dedup_core::phases::Phase::ALL
            .iter()
            .map(|p| {
                let n = p.name();
                let ns = delta(&format!("phase_{n}_ns")) as f64;
                let count = delta(&format!("phase_{n}_count")) as f64;
                (n, ns / requests / 1000.0, count / requests)
            })
            .filter(|(_, _, calls)| *calls > 0.0)
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        let m = c.best()?;
        let cpu = c.cpu_us().unwrap_or(f64::NAN);
        // Top-level phases do not nest in one another; `complete` holds its reads and
        // writes, `entity` its store calls: the sum counts them once.
        let nested = [
            "shared_read",
            "bucket_decode",
            "bucket_encode",
            "shared_write",
        ];
        let top: f64 = rows
            .iter()
            .filter(|(n, ..)| {
                !(nested.contains(n)
                    && rows
                        .iter()
                        .any(|(m, ..)| *m == "complete" || *m == "entity"))
            })
            .map(|(_, us, _)| us)
            .sum();
        let mut t = format!(
            "### {name}\n\n{:.0} req/s, Envoy {cpu:.1} CPU µs per request (the phase-timed build; its clock reads add to it). Phases, most time first:\n\n| phase | µs per request | calls per request | share of the Envoy CPU µs |\n|---|---:|---:|---:|\n",
            m.rps
        );
        for (n, us, calls) in &rows {
            t.push_str(&format!(
                "| `{n}` | {us:.2} | {calls:.2} | {:.0}% |\n",
                100.0 * us / cpu
            ));
        }
        t.push_str(&format!(
            "\nThe phases' own time: {top:.1} µs per request of {cpu:.1} ({:.0}%); the rest is Envoy's HTTP work, V8's entry into the module and the filter's code between phases.\n\n",
            100.0 * top / cpu
        ));
        println!("{t}");
        tables.push_str(&t);
    }
    if no_write() {
        return Ok(());
    }
    let section = format!(
        "## Where the time goes\n\n\
`make bench-envoy` (`BENCH_PART=phases` for this section alone): the phase-timed \
module (`dist/dedup_filter_phases.wasm`, built by `make wasm` with the `phase-timing` \
feature, never shipped) reads Envoy's clock at both ends of each phase and reports the \
time and count per phase as counters (`proxy_dedup_phase_<phase>_ns`, `_count`; \
filter/core/src/phases.rs says where each phase starts and ends). The setup is the \
filter-cost one: Envoy {} with `--concurrency 1` pinned to CPU {ENVOY_CPU}, wrk \
`-t{} -c{}` pinned to CPU {WRK_CPU}, the upstream a `direct_response` listener of the \
same Envoy. One {seconds} s run per case after a warm-up; load average before: {}. \
Phases may nest (`complete` holds its shared-data reads and writes, `entity` the \
entity's); a clock read costs a host call, so the absolute figures are a little \
above the shipped module's, and the shares are what to read.\n\n{}\n",
        envoy_version(),
        COST_LOAD.threads,
        COST_LOAD.connections,
        load_before,
        tables
    );
    write_section("## Where the time goes", &section)?;
    Ok(())
}

/// The worker counts of `BENCH_PART=workers`: `BENCH_WORKERS` (comma-separated, e.g.
/// `1,2,4,8,12` on a larger machine), else 1 and 2.
fn worker_counts() -> Result<Vec<u32>> {
    let text = std::env::var("BENCH_WORKERS").unwrap_or_else(|_| "1,2".into());
    let mut counts = Vec::new();
    for w in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match w.parse::<u32>() {
            Ok(n) if (1..=256).contains(&n) => counts.push(n),
            _ => dedup_envoy::fail!("BENCH_WORKERS: {w:?} is not a worker count (1-256)"),
        }
    }
    if counts.is_empty() {
        dedup_envoy::fail!("BENCH_WORKERS names no worker count");
    }
    Ok(counts)
}

/// `BENCH_PART=workers`: how throughput grows with Envoy's workers. At each worker
/// count, the empty filter, first executions and replays (small POSTs, the upstream a
/// listener of the same Envoy), Envoy and wrk unpinned, wrk with one thread and 16
/// connections per worker; cases interleaved over the rounds, the best round kept.
/// Writes "## Workers".
fn workers() -> Result<()> {
    let Settings { seconds, rounds } = Settings::from_env()?;
    let counts = worker_counts()?;
    let dedup = dedup_wasm()?;
    let empty = empty_wasm()?;
    let load_before = load_average();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kinds: [(&str, &PathBuf, &str, bool); 3] = [
        ("empty filter, POST", &empty, NO_KEY_LUA, false),
        ("dedup, first execution", &dedup, UNIQUE_LUA, false),
        ("dedup, replay", &dedup, REPLAY_LUA, true),
    ];
    let mut table = String::from(
        "| workers | case | req/s | req/s per worker | vs the empty filter at this count | vs this case at 1 worker |\n|---:|---|---:|---:|---:|---:|\n",
    );
    let mut at_one: Vec<Option<f64>> = vec![None; kinds.len()];
    for &n in &counts {
        let load = Load {
            threads: n,
            connections: 16 * n,
            cpus: None,
        };
        let mut started = Vec::new();
        for (name, module, script, prime) in kinds {
            let filters = [
                BenchFilter::Buffer,
                BenchFilter::Wasm {
                    module: module.clone(),
                    config: "{}".into(),
                },
            ];
            let config = ceiling_config(CeilingRoute::Answer, &filters, n, None)?;
            let c = Case::start_with(
                "bench-workers",
                &format!("{name}, {n} workers"),
                config,
                script,
                load,
            )?;
            if prime {
                c.prime_replay_key()?;
            }
            c.warm_up(WARMUP_SECONDS)?;
            started.push(c);
        }
        measure_interleaved(&mut started, seconds, rounds, 36)?;
        let empty_rps = started[0].best()?.rps;
        for (i, ((name, ..), c)) in kinds.iter().zip(&started).enumerate() {
            let rps = c.best()?.rps;
            let base = *at_one[i].get_or_insert(rps / f64::from(n));
            table.push_str(&format!(
                "| {n} | {name} | {rps:.0} | {:.0} | {:.2} | {:.2} |\n",
                rps / f64::from(n),
                rps / empty_rps,
                rps / base
            ));
        }
    }
    println!("\n{table}");
    if no_write() {
        return Ok(());
    }
    let section = format!(
        "## Workers\n\n\
`make bench-envoy` (`BENCH_PART=workers` for this section alone; `BENCH_WORKERS=1,2,4,8` \
for other counts): Envoy {} with `--concurrency N` and wrk `-tN -c16N`, neither pinned, on \
a machine of {cores} cores, the upstream a listener of the same Envoy; at each count the \
three cases interleaved over {rounds} rounds of {seconds} s, the best kept. Load average \
before: {load_before}. \"vs this case at 1 worker\" is the throughput over the first \
count's per-worker throughput (the first count, scaled, when it is not 1): linear \
scaling doubles it with the workers.\n\n{table}\n",
        envoy_version(),
    );
    write_section("## Workers", &section)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-envoy: {e}");
        std::process::exit(1);
    }
}
