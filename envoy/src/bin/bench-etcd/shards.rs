//! The "## etcd shards" section (`BENCH_PART=shards`): the etcd store sharded over
//! 1, 2 and 3 etcd clusters (`store.shards`), each shard a single-member etcd on
//! loopback, first executions and replays, one Envoy per case, interleaved rounds.
//! Besides throughput and latency (ratios to the 1-shard case of the same load), it
//! reads what one box can show of sharding: how evenly the records spread (keys per
//! shard after the run) and the etcd CPU one first execution costs (the etcd
//! processes' utime + stime around each measured round, over the executions the
//! round counted), which should not grow with the shards.

use super::{etcd_version, warnings, Load};
use dedup_core::stores::etcd::shards::{name_seed, pick};
use dedup_envoy::bench::{
    envoy_version, load_average, no_write, process_cpu, run_stamp, table_header, table_row,
    write_load_chart, write_section, Case, ChartRow, Measured, Settings, BODY, CONNECTIONS,
    REPLAY_LUA, THREADS, UNIQUE_LUA,
};
use dedup_envoy::etcd::{
    render_shard_clusters, wait_cluster_hosts_healthy, EtcdCluster, MULTI_PROXY_ETCD,
};
use dedup_envoy::paths::{config_file, dedup_wasm};
use dedup_envoy::{fail, DemoUpstream, EnvoyConfig, Result};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const WARMUP_SECONDS: u64 = 2;
/// The shard counts measured; shard `i` is named `NAMES[i]`, its Envoy cluster
/// `CLUSTERS[i]`.
const SHARD_COUNTS: [usize; 3] = [1, 2, 3];
const NAMES: [&str; 3] = ["a", "b", "c"];
const CLUSTERS: [&str; 3] = ["etcd_a", "etcd_b", "etcd_c"];
/// Where the filter keeps its records (`store.prefix`'s default).
const PREFIX: &str = "proxy-dedup/";
/// Within this of the 1-shard figure, the etcd CPU per first execution is "flat".
const FLAT: f64 = 0.15;

/// `{"store": {"kind": "etcd", "shards": [...]}}` over the first `n` shards.
fn filter_config(n: usize) -> String {
    let shards: Vec<_> = (0..n)
        .map(|i| json!({"name": NAMES[i], "cluster": CLUSTERS[i]}))
        .collect();
    json!({"store": {"kind": "etcd", "shards": shards}}).to_string()
}

/// `multi-proxy-etcd.yaml` with its `etcd` cluster once per shard of `etcds`
/// (`etcd_a`, `etcd_b`, … each pointing at its one member), and the filter on
/// `store.shards` over them. Written as `file` in the first shard's directory.
fn proxy_config(etcds: &[EtcdCluster], port: u16, wasm: &Path, file: &str) -> Result<EnvoyConfig> {
    let Some(first) = etcds.first() else {
        fail!("no shard");
    };
    let template = std::fs::read_to_string(config_file(MULTI_PROXY_ETCD))?;
    let shards: Vec<(&str, Vec<u16>)> = etcds
        .iter()
        .enumerate()
        .map(|(i, e)| (CLUSTERS[i], e.proxy_ports()))
        .collect();
    // Each copy lists its shard's members only: one line here.
    let rendered = render_shard_clusters(&template, &shards)?;
    let path = first.dir.join(file);
    std::fs::write(&path, rendered)?;
    let mut config = EnvoyConfig::single_node(port, wasm, &filter_config(etcds.len()))?;
    config.template = path;
    Ok(config)
}

/// The CPU time each shard's etcd processes have used so far.
fn etcd_cpu(etcds: &[EtcdCluster]) -> Result<Vec<Duration>> {
    etcds
        .iter()
        .map(|e| {
            e.pids()
                .iter()
                .try_fold(Duration::ZERO, |sum, pid| match process_cpu(*pid) {
                    Some(t) => Ok(sum + t),
                    None => fail!("cannot read the CPU time of etcd process {pid}"),
                })
        })
        .collect()
}

/// One case and what its rounds cost etcd.
struct Tracked {
    shards: usize,
    load: Load,
    case: Case,
    /// Each shard's etcd CPU time over the measured rounds.
    etcd_cpu: Vec<Duration>,
    /// Executions (first executions) or replays counted by Envoy in those rounds.
    counted: u64,
}

impl Tracked {
    /// etcd CPU µs per execution (or replay) counted, all shards.
    fn etcd_us(&self) -> f64 {
        let total: Duration = self.etcd_cpu.iter().sum();
        total.as_secs_f64() * 1e6 / self.counted.max(1) as f64
    }

    /// Each shard's share of that CPU, "a 61%, b 39%".
    fn cpu_split(&self) -> String {
        let total: Duration = self.etcd_cpu.iter().sum();
        self.etcd_cpu
            .iter()
            .enumerate()
            .map(|(i, t)| {
                format!(
                    "{} {:.0}%",
                    NAMES[i],
                    100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-9)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn start_case(
    shards: usize,
    load: Load,
    etcds: &[EtcdCluster],
    port: u16,
    wasm: &Path,
) -> Result<Tracked> {
    let name = format!(
        "{shards} shard{}, {}",
        if shards == 1 { "" } else { "s" },
        load.name()
    );
    let file = format!("shards-{shards}-{}.yaml", load.counter());
    let config = proxy_config(etcds, port, wasm, &file)?;
    let script = match load {
        Load::FirstExecutions => UNIQUE_LUA,
        Load::Replays => REPLAY_LUA,
    };
    let case = Case::start("bench-shards", &name, config, script)?;
    for cluster in &CLUSTERS[..shards] {
        wait_cluster_hosts_healthy(&case.envoy, cluster, 1, Duration::from_secs(10))?;
    }
    if load == Load::Replays {
        case.prime_replay_key()?;
    }
    case.warm_up(WARMUP_SECONDS)?;
    Ok(Tracked {
        shards,
        load,
        case,
        etcd_cpu: vec![Duration::ZERO; shards],
        counted: 0,
    })
}

/// The shard choice itself, natively: ns per `dedup_core::stores::etcd::shards::pick` over `n`
/// shards' seeds, for digests never seen before (the filter runs the same code as
/// Wasm in V8, one choice per record and request it routes).
fn pick_ns(n: usize) -> f64 {
    const PICKS: u64 = 2_000_000;
    let seeds: Vec<u64> = NAMES[..n].iter().map(|name| name_seed(name)).collect();
    let mut digest = [0u8; 32];
    let mut sum = 0usize;
    let start = Instant::now();
    for i in 0..PICKS {
        // A digest is SHA-256: every one different; the pick reads its first 16 bytes.
        digest[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
        digest[8..16].copy_from_slice(&i.to_le_bytes());
        sum += pick(std::hint::black_box(&seeds), std::hint::black_box(&digest)).unwrap_or(0);
    }
    std::hint::black_box(sum);
    start.elapsed().as_secs_f64() * 1e9 / PICKS as f64
}

/// How the records of one shard count spread: keys per shard after the run.
struct Balance {
    shards: usize,
    keys: Vec<u64>,
    /// What the set's two Envoys executed (warm-ups, rounds and the replay key).
    executed: u64,
}

impl Balance {
    /// How far the share furthest from an even split is from it, in standard
    /// deviations of a share of keys placed at random (binomial, p = 1/n); `None`
    /// for one shard.
    fn worst_sigma(&self) -> Option<f64> {
        let total: u64 = self.keys.iter().sum();
        if self.shards < 2 || total == 0 {
            return None;
        }
        let p = 1.0 / self.shards as f64;
        let sigma = (p * (1.0 - p) / total as f64).sqrt();
        self.keys
            .iter()
            .map(|k| ((*k as f64 / total as f64) - p).abs() / sigma)
            .reduce(f64::max)
    }

    fn text(&self) -> String {
        let total: u64 = self.keys.iter().sum();
        let share = |k: u64| 100.0 * k as f64 / total.max(1) as f64;
        let per_shard = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{} {k} ({:.1}%)", NAMES[i], share(*k)))
            .collect::<Vec<_>>()
            .join(", ");
        let mut text = format!(
            "{} shard{}: {total} keys ({per_shard}; the filter executed {})",
            self.shards,
            if self.shards == 1 { "" } else { "s" },
            self.executed
        );
        if self.shards > 1 {
            let n = self.shards as f64;
            let even = total as f64 / n;
            let largest = self.keys.iter().copied().max().unwrap_or(0) as f64;
            // A share of keys placed at random: binomial, p = 1/n.
            let spread = 100.0 * ((1.0 / n) * (1.0 - 1.0 / n) / total.max(1) as f64).sqrt();
            text.push_str(&format!(
                "; the largest shard holds {:.3}× an even share; keys placed at random would \
spread each share by ±{spread:.2} points (one standard deviation), the furthest share here \
is {:.1} of those off",
                largest / even.max(1.0),
                self.worst_sigma().unwrap_or(0.0)
            ));
        }
        text
    }
}

/// The section; every case's Envoy and the 6 etcd processes are started first.
pub fn run(settings: &Settings) -> Result<()> {
    let &Settings { seconds, rounds } = settings;
    let dedup = dedup_wasm()?;
    let upstream = DemoUpstream::start(0, false)?;
    let port = upstream.port();
    // One set of single-member etcds per shard count, shared by its two cases.
    let mut sets: Vec<Vec<EtcdCluster>> = Vec::new();
    for n in SHARD_COUNTS {
        let set = (0..n)
            .map(|i| EtcdCluster::start(&format!("bench-shards-{n}{}", NAMES[i]), 1))
            .collect::<Result<Vec<_>>>()?;
        sets.push(set);
    }
    eprintln!(
        "bench-etcd shards: wrk -t{THREADS} -c{CONNECTIONS}, {WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s per case, Envoy --concurrency 2, 1, 2 and 3 shards of one etcd member each, loopback"
    );
    let load_before = load_average();
    let stamp = run_stamp();
    let mut tracked = Vec::new();
    for load in [Load::FirstExecutions, Load::Replays] {
        for (n, set) in SHARD_COUNTS.iter().zip(&sets) {
            tracked.push(start_case(*n, load, set, port, &dedup)?);
        }
    }
    // `measure_interleaved`, with etcd's CPU and Envoy's counter read around each round.
    for round in 1..=rounds {
        for t in tracked.iter_mut() {
            let set = &sets[t.shards - 1];
            let counter = t.load.counter();
            let (cpu_before, counted_before) =
                (etcd_cpu(set)?, t.case.envoy.dedup_counter(counter)?);
            t.case.measure(seconds, round, 26)?;
            let (cpu_after, counted_after) = (etcd_cpu(set)?, t.case.envoy.dedup_counter(counter)?);
            for (sum, (a, b)) in t.etcd_cpu.iter_mut().zip(cpu_after.iter().zip(&cpu_before)) {
                *sum += a.saturating_sub(*b);
            }
            t.counted += counted_after.saturating_sub(counted_before);
        }
    }
    let mut balance = Vec::new();
    for (n, set) in SHARD_COUNTS.iter().zip(&sets) {
        let keys = set
            .iter()
            .map(|e| e.count_keys(PREFIX))
            .collect::<Result<Vec<_>>>()?;
        let executed = tracked
            .iter()
            .filter(|t| t.shards == *n)
            .map(|t| t.case.envoy.dedup_counter("executed").unwrap_or(0))
            .sum();
        balance.push(Balance {
            shards: *n,
            keys,
            executed,
        });
    }
    let mut results: Vec<(&Tracked, &Measured)> = Vec::new();
    for t in &tracked {
        let w = warnings(&t.case);
        if !w.is_empty() {
            eprintln!(
                "  {}: {} filter warnings in the Envoy log; first: {}",
                t.case.name,
                w.len(),
                w[..w.len().min(3)].join("\n    ")
            );
        }
        results.push((t, t.case.best()?));
    }
    let baseline = |load: Load| {
        results
            .iter()
            .find(|(t, _)| t.shards == 1 && t.load == load)
            .map(|(_, m)| (m.rps, m.p50_ms, m.p99_ms))
            .unwrap_or((1.0, 1.0, 1.0))
    };
    let mut table = table_header(&["req/s vs 1 shard", "p50 vs 1 shard", "p99 vs 1 shard"]);
    for (t, m) in &results {
        let (rps, p50, p99) = baseline(t.load);
        table.push_str(&table_row(
            &t.case.name,
            m,
            &[m.rps / rps, m.p50_ms / p50, m.p99_ms / p99],
            &t.case.rounds_text(),
        ));
    }
    let mut cpu_table = String::from(
        "| case | Envoy CPU µs/req (median round) | etcd CPU µs per execution or replay counted | etcd CPU by shard | counted in the rounds |\n|---|---:|---:|---|---:|\n",
    );
    for (t, _) in &results {
        cpu_table.push_str(&format!(
            "| {} | {:.1} | {:.1} | {} | {} {} |\n",
            t.case.name,
            t.case.cpu_us().unwrap_or(f64::NAN),
            t.etcd_us(),
            t.cpu_split(),
            t.counted,
            match t.load {
                Load::FirstExecutions => "executions",
                Load::Replays => "replays",
            }
        ));
    }
    let balance_text: String = balance
        .iter()
        .map(|b| format!("- {}\n", b.text()))
        .collect();
    println!("\n{table}\n{cpu_table}\n{balance_text}");
    let first = |n: usize| {
        results
            .iter()
            .find(|(t, _)| t.shards == n && t.load == Load::FirstExecutions)
            .copied()
    };
    let (Some(f1), Some(f2), Some(f3)) = (first(1), first(2), first(3)) else {
        fail!("a first-execution case is missing");
    };
    let picks: Vec<f64> = SHARD_COUNTS.iter().map(|n| pick_ns(*n)).collect();
    let interpretation = interpretation(f1, f2, f3, &balance, &picks);
    println!("{interpretation}\n");
    let counters: String = tracked
        .iter()
        .map(|t| (t.case.name.as_str(), t.case.counters()))
        .filter(|(_, c)| !c.is_empty())
        .map(|(n, c)| format!("- {n}: {c}\n"))
        .collect();
    println!("{counters}");
    if no_write() {
        return Ok(());
    }
    let version = envoy_version();
    let etcd = etcd_version();
    let rows: Vec<ChartRow> = results
        .iter()
        .map(|(t, m)| ChartRow {
            name: &t.case.name,
            measured: m,
            note: format!("×{:.2}", m.rps / baseline(t.load).0),
        })
        .collect();
    let chart = write_load_chart(
        "etcd-shards.svg",
        "The etcd store on 1, 2 and 3 shards",
        &format!("Envoy {version} (--concurrency 2), one single-member etcd {etcd} per shard"),
        settings,
        &load_before,
        "1 shard, same load",
        &rows,
    )?;
    let section = format!(
        "## etcd shards\n\n\
`make bench-envoy` (envoy/src/bin/bench-etcd/shards.rs; `BENCH_PART=shards` for this \
section alone). The etcd store sharded with `store.shards` over 1, 2 and 3 shards \
(`{}` for 3; the 1-shard case is the map of one shard that `store.cluster` also \
makes), each shard an etcd {etcd} cluster of one member (`--heartbeat-interval 50 \
--election-timeout 500`, data on the local disk, fsync on), the template \
`envoy/configs/multi-proxy-etcd.yaml` with its `etcd` cluster copied once per shard \
(`etcd_a`, `etcd_b`, `etcd_c`, gRPC over HTTP/2). Real Envoy {version} with \
`--concurrency 2` and the in-process demo upstream; everything on 127.0.0.1 of one \
2-core machine. Load: wrk `-t{THREADS} -c{CONNECTIONS}`, every request a \
`POST /orders` with a {}-byte JSON body; first executions a unique key per request \
(claim and completion: two txns on the key's shard), replays one key (mostly \
answered by each worker's local tier, without etcd). One Envoy per case, all \
started first, each shard count with its own etcds (shared by its two cases); \
{WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s interleaving the \
cases, each case reporting its best round. Ratios are to the 1-shard case of the \
same load in the same run. Run: {stamp}. Load average before this run: \
{load_before} (above ~1 means other work competed for the cores).\n\n\
{table}\n\
![etcd shards: req/s, p50 and p99 per case]({chart})\n\n\
CPU: Envoy's per request (all its threads, `/proc/<pid>/task/*/schedstat`), and \
etcd's: the `utime` + `stime` of the case's etcd processes (`/proc/<pid>/stat`) \
summed over its {rounds} measured rounds, divided by the executions (first \
executions) or replays its Envoy counted in them. The other Envoys' health checks \
of their own etcds run meanwhile and are not in these figures.\n\n\
{cpu_table}\n\
Balance: keys under `{PREFIX}` in each shard's etcd after the run (a count range; \
the records of warm-ups and rounds of the shard count's two cases: the replay \
case's one record included):\n\n\
{balance_text}\n\
{interpretation}\n\n\
Filter counters after each case (warm-up and all rounds):\n\n{counters}",
        filter_config(3),
        BODY.len(),
    );
    write_section("## etcd shards", &section)?;
    Ok(())
}

/// What the figures say and what one 2-core box cannot: from the first-execution
/// cases on 1, 2 and 3 shards, the balance of the sets and the native cost of a pick.
fn interpretation(
    one: (&Tracked, &Measured),
    two: (&Tracked, &Measured),
    three: (&Tracked, &Measured),
    balance: &[Balance],
    picks: &[f64],
) -> String {
    let pick = |i: usize| picks.get(i).copied().unwrap_or(f64::NAN);
    let rps = |c: (&Tracked, &Measured)| c.1.rps / one.1.rps;
    let etcd = |c: (&Tracked, &Measured)| c.0.etcd_us() / one.0.etcd_us().max(1e-9);
    let envoy = |c: (&Tracked, &Measured)| c.0.case.cpu_us().unwrap_or(f64::NAN);
    let (e2, e3) = (etcd(two), etcd(three));
    let flat = |r: f64| (r - 1.0).abs() <= FLAT;
    let etcd_text = if flat(e2) && flat(e3) {
        format!(
            "flat within ±{:.0}%: the shards split etcd's work between them, they do not \
add to it",
            FLAT * 100.0
        )
    } else if e2.max(e3) > 1.0 + FLAT {
        format!(
            "more than {:.0}% up: the shards split the txns, but each etcd is then less \
busy, so whatever it pays per commit (a raft round, an fsync of its own log) or per \
read of its connections is shared by fewer txns at the same total load (smaller \
batches; likely, not measured apart here). If so, that is the price of one box's load \
spread thin rather than work added per txn; that the batches grow back with each shard \
at its own full load needs a machine per shard to show",
            FLAT * 100.0
        )
    } else {
        format!(
            "more than {:.0}% down (less etcd work per execution on more shards: noise, \
or one etcd less contended)",
            FLAT * 100.0
        )
    };
    let worst_sigma = balance
        .iter()
        .filter_map(Balance::worst_sigma)
        .fold(0.0f64, f64::max);
    let balance_text = if worst_sigma <= 3.0 {
        format!(
            "as even as placing each record at random would be (every shard's share within \
{worst_sigma:.1} standard deviations of an even split)"
        )
    } else {
        format!(
            "less even than placing each record at random would be (a share {worst_sigma:.1} \
standard deviations off an even split)"
        )
    };
    let throughput_text = if rps(three) < 1.0 - FLAT / 2.0 {
        ": lower, since the same cores then spend more CPU per execution, in etcd and in \
Envoy (the CPU figures below)"
    } else {
        ""
    };
    let envoy_growth = envoy(three) / envoy(one);
    let envoy_text = if envoy_growth <= 1.0 + FLAT {
        format!(
            "within {:.0}% of each other: the choice costs nothing measurable",
            FLAT * 100.0
        )
    } else {
        "they grow, but not by the choice: a worker's calls spread over one HTTP/2 \
connection per shard, so whatever Envoy pays per connection write or event-loop pass is \
shared by fewer calls (likely; this run does not split it further)"
            .to_string()
    };
    format!(
        "**Reading it.** wrk, Envoy's two workers, the upstream and every etcd share the \
same two cores and one disk, so a second or third shard brings no CPU and no disk of its \
own here: on this box more shards cannot add throughput, and first executions ran at \
{:.2}× (2 shards) and {:.2}× (3 shards) the 1-shard rate{throughput_text}. What sharding is for, each \
shard on machines of its own so that the store's capacity grows with the shards, needs \
more than one machine to measure. What the run does show: **balance**: the records \
spread {balance_text}; **etcd CPU per first execution**: {:.0} µs on 1 shard, {:.0} µs \
on 2 (×{e2:.2}), {:.0} µs on 3 (×{e3:.2}), {etcd_text}; **the cost of the shard choice**: \
natively on this machine `dedup_core::stores::etcd::shards::pick` takes {:.1}, {:.1} and {:.1} ns over \
1, 2 and 3 shards (the filter runs it as Wasm, a small factor slower, once per store \
call), against Envoy's {:.1}, {:.1} and {:.1} CPU µs per first execution on 1, 2 and 3 \
shards; {envoy_text}.",
        rps(two),
        rps(three),
        one.0.etcd_us(),
        two.0.etcd_us(),
        three.0.etcd_us(),
        pick(0),
        pick(1),
        pick(2),
        envoy(one),
        envoy(two),
        envoy(three),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_shard_cluster_is_one_member() {
        let template = std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)).unwrap();
        let out =
            render_shard_clusters(&template, &[("etcd_a", vec![5001]), ("etcd_b", vec![6001])])
                .unwrap();
        // One member line per shard cluster; the comment that explains the markers stays.
        assert_eq!(out.matches("# etcd member 1\n").count(), 2);
        assert!(!out.contains("# etcd member 2\n") && !out.contains("# etcd member 3\n"));
        assert!(out.contains("\"# etcd member N\""));
        assert!(out.contains("port_value: 5001 ") && out.contains("port_value: 6001 "));
        assert!(out.contains("  - name: etcd_b\n"));
        assert_eq!(
            filter_config(2),
            r#"{"store":{"kind":"etcd","shards":[{"cluster":"etcd_a","name":"a"},{"cluster":"etcd_b","name":"b"}]}}"#
        );
    }
}
