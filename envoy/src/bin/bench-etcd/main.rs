//! `make bench-envoy` (second half): the etcd store against the shared-data
//! store, with wrk against real Envoys on loopback in one run. Cases: first
//! executions (a unique key per request) and replays (one key), each on
//! shared data and on a real 3-member etcd over gRPC; first executions also
//! over etcd's JSON gateway; and etcd's own txn rate through gRPC at the same
//! concurrency (the filter's claim txn, from a small HTTP/2 client in this
//! process), the ceiling of first executions (two txns each). As in bench-envoy, every case has
//! its own Envoy, started first; measured rounds interleave the cases and each
//! case reports its best round. Prints throughput and latency with ratios to
//! the shared-data case of the same load, and writes the "## etcd store"
//! section of BENCHMARKS.md with its chart, benches/charts/etcd-store.svg. Then
//! the sharded store (`shards.rs`: 1, 2 and 3 shards), the "## etcd shards"
//! section; then regions (`regions.rs`: keys homed locally and remotely under a
//! simulated 40 ms one-way delay, against a single region), the "## Regions"
//! section. `BENCH_SECONDS` (default 3) per round, `BENCH_ROUNDS` (default 3),
//! `BENCH_NO_WRITE=1` to leave BENCHMARKS.md alone, `BENCH_PART=etcd`, `shards`
//! or `regions` (or several, comma-separated; unset: all) for some sections alone.

mod regions;
mod shards;

use dedup_envoy::bench::{
    counters_list, envoy_version, load_average, measure_interleaved, no_write, run_stamp,
    table_header, table_row, write_load_chart, write_section, Case, ChartRow, Settings, BODY,
    CONNECTIONS, REPLAY_LUA, THREADS, UNIQUE_LUA,
};
use dedup_envoy::etcd::{
    multi_proxy_config, multi_proxy_json_config, wait_etcd_hosts_healthy, EtcdCluster,
};
use dedup_envoy::etcd_grpc::{txn_rate, TxnRate};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, EnvoyConfig, Result};
use std::process::Command;
use std::time::Duration;

const WARMUP_SECONDS: u64 = 2;
const SHARED_DATA_CONFIG: &str = "{}";
const ETCD_CONFIG: &str = r#"{"store": {"kind": "etcd", "cluster": "etcd"}}"#;
const ETCD_JSON_CONFIG: &str =
    r#"{"store": {"kind": "etcd", "cluster": "etcd", "protocol": "json"}}"#;
/// The value of the raw txns: about a completed record with the demo's response.
const TXN_VALUE_BYTES: usize = 400;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    SharedData,
    Etcd,
    EtcdJson,
}

/// What a case's requests are (every part of bench-etcd measures both).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Load {
    FirstExecutions,
    Replays,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::FirstExecutions => "first executions",
            Load::Replays => "replays",
        }
    }

    /// The counter of what a round of this load does: executions or replays.
    fn counter(self) -> &'static str {
        match self {
            Load::FirstExecutions => "executed",
            Load::Replays => "replayed",
        }
    }
}

fn start_case(store: Store, load: Load, config: EnvoyConfig) -> Result<Case> {
    let name = format!(
        "{}, {}",
        match store {
            Store::SharedData => "shared data",
            Store::Etcd => "etcd (gRPC)",
            Store::EtcdJson => "etcd (JSON gateway)",
        },
        load.name()
    );
    let script = match load {
        Load::FirstExecutions => UNIQUE_LUA,
        Load::Replays => REPLAY_LUA,
    };
    let case = Case::start("bench-etcd", &name, config, script)?;
    if store != Store::SharedData {
        wait_etcd_hosts_healthy(&case.envoy, 3, Duration::from_secs(10))?;
    }
    if load == Load::Replays {
        case.prime_replay_key()?;
    }
    case.warm_up(WARMUP_SECONDS)?;
    Ok(case)
}

/// The filter's own warnings (store errors name their cause there).
fn warnings(case: &Case) -> Vec<String> {
    case.envoy
        .log()
        .lines()
        .filter(|l| l.contains("][wasm]") && (l.contains("][warning]") || l.contains("][error]")))
        .map(str::to_string)
        .collect()
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

/// `BENCH_PART` names this section, or is unset or empty. The same variable picks
/// bench-envoy's sections (`load`, `cost`, `calls`), so `make bench-envoy` with
/// one of those runs no section here.
fn part(name: &str) -> bool {
    std::env::var("BENCH_PART").map_or(true, |p| p.is_empty() || p.split(',').any(|x| x == name))
}

fn run() -> Result<()> {
    let settings = Settings::from_env()?;
    if part("etcd") {
        etcd_store(&settings)?;
    }
    if part("shards") {
        shards::run(&settings)?;
    }
    if part("regions") {
        regions::run(&settings)?;
    }
    Ok(())
}

/// The "## etcd store" section.
fn etcd_store(settings: &Settings) -> Result<()> {
    let &Settings { seconds, rounds } = settings;
    let dedup = dedup_wasm()?;
    let upstream = DemoUpstream::start(0, false)?;
    let port = upstream.port();
    let etcd = EtcdCluster::start("bench-etcd-cluster", 3)?;
    eprintln!(
        "bench-etcd: wrk -t{THREADS} -c{CONNECTIONS}, {WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s per case, Envoy --concurrency 2, 3-member etcd, loopback"
    );
    let load_before = load_average();
    let stamp = run_stamp();
    // (store, load) of each case, in the order of `cases`.
    let mut kinds = Vec::new();
    let mut cases = Vec::new();
    let mut start = |store: Store, load: Load, config: EnvoyConfig| -> Result<()> {
        kinds.push((store, load));
        cases.push(start_case(store, load, config)?);
        Ok(())
    };
    for load in [Load::FirstExecutions, Load::Replays] {
        let shared_data = EnvoyConfig::single_node(port, &dedup, SHARED_DATA_CONFIG)?;
        start(Store::SharedData, load, shared_data)?;
        start(
            Store::Etcd,
            load,
            multi_proxy_config(&etcd, port, &dedup, ETCD_CONFIG)?,
        )?;
        if load == Load::FirstExecutions {
            let json = multi_proxy_json_config(&etcd, port, &dedup, ETCD_JSON_CONFIG)?;
            start(Store::EtcdJson, load, json)?;
        }
    }
    measure_interleaved(&mut cases, seconds, rounds, 26)?;
    // etcd's own txn rate through gRPC at wrk's concurrency, best of the rounds, the
    // Envoys idle meanwhile.
    let members: Vec<std::net::SocketAddr> = etcd
        .client_ports()
        .iter()
        .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    let mut raw: Option<TxnRate> = None;
    let mut raw_rounds = Vec::new();
    for round in 0..rounds {
        let round = u32::try_from(round).unwrap_or(0);
        let r = txn_rate(
            &members,
            CONNECTIONS as usize,
            seconds,
            TXN_VALUE_BYTES,
            round,
        )?;
        raw_rounds.push(format!("{:.0}", r.txn_per_s));
        if raw.as_ref().is_none_or(|b| r.txn_per_s > b.txn_per_s) {
            raw = Some(r);
        }
    }
    let Some(raw) = raw else {
        return Err(dedup_envoy::Error::msg("no etcd gRPC round"));
    };
    let records = etcd.count_keys("proxy-dedup/").unwrap_or(0);
    let mut results = Vec::new();
    for (case, &(store, load)) in cases.iter().zip(&kinds) {
        let best = case.best()?;
        let warnings = warnings(case);
        if !warnings.is_empty() {
            eprintln!(
                "  {}: {} filter warnings in the Envoy log; first: {}",
                case.name,
                warnings.len(),
                warnings[..warnings.len().min(3)].join("\n    ")
            );
        }
        results.push((case, store, load, best));
    }
    let baseline = |load: Load| {
        results
            .iter()
            .find(|(_, s, l, _)| *s == Store::SharedData && *l == load)
            .map(|(_, _, _, m)| (m.rps, m.p50_ms, m.p99_ms))
            .unwrap_or((1.0, 1.0, 1.0))
    };
    let mut table = table_header(&[
        "req/s vs shared data",
        "p50 vs shared data",
        "p99 vs shared data",
    ]);
    for (case, _, load, m) in &results {
        let (rps, p50, p99) = baseline(*load);
        table.push_str(&table_row(
            &case.name,
            m,
            &[m.rps / rps, m.p50_ms / p50, m.p99_ms / p99],
            &case.rounds_text(),
        ));
    }
    println!("\n{table}");
    let first_rps = |store: Store| {
        results
            .iter()
            .find(|(_, s, l, _)| *s == store && *l == Load::FirstExecutions)
            .map_or(0.0, |(_, _, _, m)| m.rps)
    };
    let (grpc_rps, json_rps) = (first_rps(Store::Etcd), first_rps(Store::EtcdJson));
    let half = raw.txn_per_s / 2.0;
    let ceiling = format!(
        "etcd's own txn rate through gRPC, same concurrency ({CONNECTIONS} clients, one HTTP/2 \
connection each over the 3 members, the filter's claim txn with a {TXN_VALUE_BYTES}-byte \
value and a lease, a fresh key each; best of {rounds} rounds of {seconds} s, every round: \
{}): **{:.0} txn/s** (p50 {:.1} ms, p99 {:.1} ms; {} txns failed). A first execution is \
two txns (claim, completion), so the ceiling is half of that, {:.0} req/s. The filter's \
first executions over gRPC: {:.0} req/s = **{:.2}× that ceiling**; over the JSON gateway \
in the same run: {:.0} req/s, so gRPC is **{:.2}× the JSON gateway**.",
        raw_rounds.join(", "),
        raw.txn_per_s,
        raw.p50_ms,
        raw.p99_ms,
        raw.failed,
        half,
        grpc_rps,
        grpc_rps / half.max(1e-9),
        json_rps,
        grpc_rps / json_rps.max(1e-9),
    );
    println!("{ceiling}\n");
    let counters = counters_list(&cases);
    if no_write() {
        return Ok(());
    }
    let version = envoy_version();
    let etcd = etcd_version();
    let rows: Vec<ChartRow> = results
        .iter()
        .map(|(case, _, load, m)| ChartRow {
            name: &case.name,
            measured: m,
            note: format!("×{:.2}", m.rps / baseline(*load).0),
        })
        .collect();
    let chart = write_load_chart(
        "etcd-store.svg",
        "The etcd store against the shared-data store",
        &format!("Envoy {version} (--concurrency 2) and a 3-member etcd {etcd}"),
        &Settings { seconds, rounds },
        &load_before,
        "shared data, same load",
        &rows,
    )?;
    let section = format!(
        "## etcd store\n\n\
`make bench-envoy` (envoy/src/bin/bench-etcd/main.rs, `BENCH_PART=etcd` for this \
section alone). Real Envoy {} with \
`--concurrency 2` and the dedup filter, in front of the in-process demo \
upstream; the shared-data cases use `envoy/configs/single-node.yaml` with the \
default store, the etcd cases `envoy/configs/multi-proxy-etcd.yaml` with \
`\"store\": {{\"kind\": \"etcd\", \"cluster\": \"etcd\"}}` (gRPC over the \
template's HTTP/2 cluster; the JSON-gateway case adds `\"protocol\": \"json\"` and \
removes the cluster's HTTP/2 options) and a 3-member etcd {} \
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
the ratios are the point. Run: {stamp}. Load average before this run: {load_before} \
(above ~1 means other work competed for the cores). Records in etcd after \
the run: {records} (they expire with their leases).\n\n\
{table}\n\
{ceiling}\n\n\
![etcd store: req/s, p50 and p99 per case]({chart})\n\n\
Filter counters after each case (warm-up and all rounds):\n\n{counters}",
        version,
        etcd,
        BODY.len()
    );
    write_section("## etcd store", &section)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-etcd: {e}");
        std::process::exit(1);
    }
}
