//! `make bench-envoy`: wrk against Envoy on loopback, in one run:
//! no filter, the empty Wasm filter, dedup with unique keys, dedup replays.
//! Prints throughput and latency (p50, p99) with ratios to the no-filter and
//! empty-filter baselines of the same run, and writes the "## Envoy load"
//! section of BENCHMARKS.md with its chart, benches/charts/envoy-load.svg. `BENCH_SECONDS` (default 3) per case,
//! `BENCH_NO_WRITE=1` to leave BENCHMARKS.md alone.

use dedup_envoy::bench::{
    counters_list, envoy_version, load_average, load_chart, measure_interleaved, no_write,
    table_header, table_row, write_chart, write_section, Case, ChartRow, Settings, BODY,
    CONNECTIONS, REPLAY_LUA, THREADS, UNIQUE_LUA,
};
use dedup_envoy::paths::{dedup_wasm, empty_wasm};
use dedup_envoy::{DemoUpstream, EnvoyConfig, Result};

const WARMUP_SECONDS: u64 = 1;

fn start_case(name: &str, config: EnvoyConfig, script: &str, prime: bool) -> Result<Case> {
    let case = Case::start("bench", name, config, script)?;
    if prime {
        case.prime_replay_key()?;
    }
    case.warm_up(WARMUP_SECONDS)?;
    Ok(case)
}

fn run() -> Result<()> {
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
    let mut table = table_header(&[
        "req/s vs no filter",
        "req/s vs empty filter",
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
    let chart = write_chart(
        "envoy-load.svg",
        &load_chart(
            "Envoy load: proxy-dedup against no filter and the empty Wasm filter",
            &format!(
                "Envoy {version}, --concurrency 2, wrk -t{THREADS} -c{CONNECTIONS}, best of {rounds} rounds of {seconds} s, one 2-core machine, load average before: {load_before}"
            ),
            "the no-filter case",
            &rows,
        ),
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
called). Ratios are to the baselines of the same run. wrk, Envoy and the upstream \
share the 2 cores, so absolute figures are low and noisy; the ratios are the point. \
Load average before this run: {load_before} (anything above ~1 means other work \
competed for the cores; figures then vary by tens of percent between runs).\n\n\
{table}\n\
![Envoy load: req/s, p50 and p99 per case]({chart})\n\n\
Filter counters after each dedup case:\n\n{counters}",
        version,
        BODY.len()
    );
    write_section("## Envoy load", &section)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-envoy: {e}");
        std::process::exit(1);
    }
}
