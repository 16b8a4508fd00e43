//! The "## Regions" section (`BENCH_PART=regions`, issue 34): first executions and
//! replays of keys homed in the proxy's own region and in another one, against the
//! same proxy on a plain one-etcd store, all in one run. The regions are
//! `dedup_envoy::regions`' simulation, as in envoy/tests/regions.rs: regions `a` and
//! `b`, a single-member etcd each, every path from `a` to `b`'s etcd through a relay
//! that delays it 40 ms each way. Every case is its own proxy in region `a`, the home
//! given by the scope header `x-home-region`; wrk loads the cases in interleaved
//! rounds as in the other sections, each case reporting its best round. Besides
//! throughput and latency it reads what each case sent across regions (Envoy's
//! requests on each region's etcd cluster, the filter's remote counters, per request
//! counted), and times requests one at a time: a first execution through one proxy,
//! then its replay through another proxy of `a` whose worker tier has not seen it.

use super::{etcd_version, warnings, Load};
use dedup_core::config::DEFAULT_REPLAYED_HEADER;
use dedup_envoy::bench::{
    envoy_version, load_average, no_write, run_stamp, table_header, table_row, write_section, Case,
    Load as WrkLoad, Measured, Settings, BODY, CONNECTIONS, NUMBERED_LUA, THREADS,
};
use dedup_envoy::etcd::wait_cluster_hosts_healthy;
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::regions::{cluster_of, Regions};
use dedup_envoy::{fail, DemoUpstream, EnvoyProcess, Request, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Every cross-region path's delay, each way (envoy/tests/regions.rs's).
const ONE_WAY: Duration = Duration::from_millis(40);
/// The proxies' region, and the other one.
const LOCAL: &str = "a";
const REMOTE: &str = "b";
/// The scope header that names a record's home (`store.home.header`).
const HOME: &str = "x-home-region";
/// Every request's `Host`: a record's scope holds it, so that the cases' Envoys (each on
/// its own port) name a key's record alike.
const HOST: &str = "orders.example";
const WARMUP_SECONDS: u64 = 2;
/// The connections of the second remote first-execution case: enough for Little's law
/// to show that the remote rate is bound by the requests in flight, not by the store.
const WIDE: u32 = 256;
/// Requests one at a time per setup: first executions, then as many cold replays.
const PROBES: usize = 30;
const NAME_WIDTH: usize = 52;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    /// No regions: `store.cluster` on region `a`'s etcd.
    Single,
    /// Regions, the key homed in `a`, the proxy's region.
    Local,
    /// Regions, the key homed in `b`.
    Remote,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Single => "single region",
            Setup::Local => "homed in a (local)",
            Setup::Remote => "homed in b (remote)",
        }
    }

    /// The home header every request of this setup carries.
    fn home(self) -> &'static str {
        match self {
            Setup::Single | Setup::Local => LOCAL,
            Setup::Remote => REMOTE,
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Setup::Single => "single",
            Setup::Local => "local",
            Setup::Remote => "remote",
        }
    }
}

const CASES: [(Load, Setup, u32); 7] = [
    (Load::FirstExecutions, Setup::Single, CONNECTIONS),
    (Load::FirstExecutions, Setup::Local, CONNECTIONS),
    (Load::FirstExecutions, Setup::Remote, CONNECTIONS),
    (Load::FirstExecutions, Setup::Remote, WIDE),
    (Load::Replays, Setup::Single, CONNECTIONS),
    (Load::Replays, Setup::Local, CONNECTIONS),
    (Load::Replays, Setup::Remote, CONNECTIONS),
];

/// `store.home`: the home header, `a` when it is absent.
fn home_rule() -> Value {
    json!({"header": HOME, "default": LOCAL})
}

/// The filter's configuration in `setup`: the home header in the scope in every setup
/// (so a request means the same to each), and as the store `regional` (`Regions::store`
/// of a proxy in `a`) or, for the single region, a plain store on `a`'s etcd.
fn filter_config(setup: Setup, regional: &Value) -> String {
    let store = match setup {
        Setup::Single => json!({"kind": "etcd", "cluster": cluster_of(LOCAL)}),
        Setup::Local | Setup::Remote => regional.clone(),
    };
    json!({"scope": {"headers": [HOME]}, "store": store}).to_string()
}

/// wrk's script: every request a `POST /orders` homed in `home`, with a key never used
/// before (first executions) or `replay_key` every time (replays).
fn script(load: Load, home: &str, replay_key: &str) -> String {
    match load {
        Load::FirstExecutions => format!(
            r#"{NUMBERED_LUA}  prefix = "bench-" .. (args[1] or "run") .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/orders", {{
    ["Host"] = "{HOST}",
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. counter,
    ["{HOME}"] = "{home}",
  }}, BODY)
end
"#
        ),
        Load::Replays => format!(
            r#"
wrk.method = "POST"
wrk.path = "/orders"
wrk.body = BODY
wrk.headers["Host"] = "{HOST}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "{replay_key}"
wrk.headers["{HOME}"] = "{home}"
"#
        ),
    }
}

/// A `POST /orders` like wrk's, keyed `key`, homed in `home`.
fn order(key: &str, home: &str) -> Request {
    Request::post("/orders")
        .host(HOST)
        .key(key)
        .header("content-type", "application/json")
        .header(HOME, home)
        .body(BODY)
}

/// What one proxy has counted so far: the requests its filter saw, executed and
/// replayed; Envoy's requests on each region's etcd cluster; the filter's remote claims
/// and completions to `b`.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Calls {
    requests: u64,
    executed: u64,
    replayed: u64,
    local: u64,
    remote: u64,
    claims: u64,
    completions: u64,
}

impl Calls {
    fn read(envoy: &EnvoyProcess) -> Result<Calls> {
        let (a, b) = (cluster_of(LOCAL), cluster_of(REMOTE));
        let rq = envoy.stats(&format!("^cluster\\.({a}|{b})\\.upstream_rq_total$"))?;
        let on = |cluster: &str| {
            rq.get(&format!("cluster.{cluster}.upstream_rq_total"))
                .copied()
                .unwrap_or(0)
        };
        let counters = envoy.dedup_counters()?;
        let counter = |name: &str| counters.get(name).copied().unwrap_or(0);
        Ok(Calls {
            requests: counter("requests"),
            executed: counter("executed"),
            replayed: counter("replayed"),
            local: on(&a),
            remote: on(&b),
            claims: counter(&format!("remote_claims.{REMOTE}")),
            completions: counter(&format!("remote_completions.{REMOTE}")),
        })
    }

    fn since(self, before: Calls) -> Calls {
        Calls {
            requests: self.requests.saturating_sub(before.requests),
            executed: self.executed.saturating_sub(before.executed),
            replayed: self.replayed.saturating_sub(before.replayed),
            local: self.local.saturating_sub(before.local),
            remote: self.remote.saturating_sub(before.remote),
            claims: self.claims.saturating_sub(before.claims),
            completions: self.completions.saturating_sub(before.completions),
        }
    }

    /// `n` per request the filter saw.
    fn per(self, n: u64) -> f64 {
        n as f64 / self.requests.max(1) as f64
    }

    /// "2.00 / 0.00": Envoy's requests on `a`'s etcd and on `b`'s, per request.
    fn split(self) -> String {
        format!("{:.2} / {:.2}", self.per(self.local), self.per(self.remote))
    }
}

/// One case while it runs, with its counts from before its first measured round.
struct Tracked {
    setup: Setup,
    load: Load,
    connections: u32,
    case: Case,
    before: Calls,
}

/// One case's results.
struct Row {
    name: String,
    setup: Setup,
    load: Load,
    connections: u32,
    best: Measured,
    /// Every round's req/s.
    rounds: Vec<f64>,
    /// Over the measured rounds.
    calls: Calls,
    /// The filter's non-zero counters at the end, warm-up included.
    counters: String,
}

impl Row {
    /// How far the rounds' req/s spread: (highest − lowest) / highest.
    fn spread(&self) -> f64 {
        let hi = self.rounds.iter().copied().fold(0.0, f64::max);
        let lo = self.rounds.iter().copied().fold(f64::INFINITY, f64::min);
        if hi > 0.0 {
            (hi - lo) / hi
        } else {
            0.0
        }
    }

    /// `connections / req/s`: the time each request held its connection (Little's law).
    fn held_ms(&self) -> f64 {
        f64::from(self.connections) * 1e3 / self.best.rps.max(1e-9)
    }

    fn rounds_text(&self) -> String {
        self.rounds
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Requests one at a time in one setup: each one's time (ms), and the calls of each
/// phase (the first proxy's, then the second's).
struct Probe {
    setup: Setup,
    first: Vec<f64>,
    replay: Vec<f64>,
    first_calls: Calls,
    replay_calls: Calls,
}

/// Everything the section shows.
struct Report {
    rows: Vec<Row>,
    probes: Vec<Probe>,
    settings: Settings,
    /// The regional store's filter configuration.
    config: String,
    stamp: String,
    load_before: String,
    envoy: String,
    etcd: String,
    /// The part's wall time, s.
    wall_s: f64,
}

impl Report {
    fn row(&self, setup: Setup, load: Load, connections: u32) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.setup == setup && r.load == load && r.connections == connections)
    }
}

fn start_case(
    regions: &Regions,
    regional: &Value,
    port: u16,
    wasm: &Path,
    (load, setup, connections): (Load, Setup, u32),
) -> Result<Tracked> {
    let mut name = format!("{}, {}", setup.name(), load.name());
    if connections != CONNECTIONS {
        name.push_str(&format!(", {connections} connections"));
    }
    let config = regions.proxy_config(LOCAL, port, wasm, &filter_config(setup, regional), false)?;
    let replay_key = format!("bench-replay-{}", setup.slug());
    let load_of = WrkLoad {
        threads: THREADS,
        connections,
        cpus: None,
    };
    let script = script(load, setup.home(), &replay_key);
    let case = Case::start_with("bench-regions", &name, config, &script, load_of)?;
    for region in [LOCAL, REMOTE] {
        wait_cluster_hosts_healthy(&case.envoy, &cluster_of(region), 1, Duration::from_secs(10))?;
    }
    if load == Load::Replays {
        let r = case.envoy.send(&order(&replay_key, setup.home()))?;
        if r.status != 200 {
            fail!("{name}: priming the replay key: {}", r.summary());
        }
    }
    case.warm_up(WARMUP_SECONDS)?;
    Ok(Tracked {
        setup,
        load,
        connections,
        case,
        before: Calls::default(),
    })
}

/// `PROBES` first executions through `first`, one at a time, then the same requests
/// through `second` (another proxy of `a`, same store), whose worker tier has not seen
/// them: each must be a replay there.
fn probe(setup: Setup, first: &EnvoyProcess, second: &EnvoyProcess) -> Result<Probe> {
    let keys: Vec<String> = (0..PROBES)
        .map(|i| format!("probe-{}-{}-{i}", setup.slug(), std::process::id()))
        .collect();
    let timed = |envoy: &EnvoyProcess, key: &str, replay: bool| -> Result<f64> {
        let start = Instant::now();
        let r = envoy.send(&order(key, setup.home()))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let replayed = r.header(DEFAULT_REPLAYED_HEADER) == Some("true");
        if r.status != 200 || replayed != replay {
            fail!(
                "{}: {key} {}: {}",
                setup.name(),
                if replay {
                    "not replayed"
                } else {
                    "not executed"
                },
                r.summary()
            );
        }
        Ok(ms)
    };
    // Each phase's calls: one at a time, every call is done before the next request
    // (the answer waits for the completion), so nothing is cut off at the end.
    let phase = |envoy: &EnvoyProcess, replay: bool| -> Result<(Vec<f64>, Calls)> {
        let before = Calls::read(envoy)?;
        let ms = keys
            .iter()
            .map(|k| timed(envoy, k, replay))
            .collect::<Result<Vec<_>>>()?;
        Ok((ms, Calls::read(envoy)?.since(before)))
    };
    let (first_ms, first_calls) = phase(first, false)?;
    let (replay_ms, replay_calls) = phase(second, true)?;
    Ok(Probe {
        setup,
        first: first_ms,
        replay: replay_ms,
        first_calls,
        replay_calls,
    })
}

/// The section; both regions' etcds and every case's Envoy are started first.
pub fn run(settings: &Settings) -> Result<()> {
    let started = Instant::now();
    let &Settings { seconds, rounds } = settings;
    let wasm = dedup_wasm()?;
    let regions = Regions::start("bench-regions", &[LOCAL, REMOTE], 1, ONE_WAY)?;
    let upstream = DemoUpstream::start(0, false)?;
    let regional = regions.store(LOCAL, home_rule());
    eprintln!(
        "bench-etcd regions: regions a and b ({} ms one way), proxies in a; wrk -t{THREADS} -c{CONNECTIONS} (and -c{WIDE}), {WARMUP_SECONDS} s warm-up, then {rounds} rounds of {seconds} s per case",
        ONE_WAY.as_millis()
    );
    let load_before = load_average();
    let stamp = run_stamp();
    let mut tracked = CASES
        .into_iter()
        .map(|c| start_case(&regions, &regional, upstream.port(), &wasm, c))
        .collect::<Result<Vec<_>>>()?;
    // From here on: the warm-ups' last calls have long settled.
    for t in &mut tracked {
        t.before = Calls::read(&t.case.envoy)?;
    }
    for round in 1..=rounds {
        for t in tracked.iter_mut() {
            t.case.measure(seconds, round, NAME_WIDTH)?;
        }
    }
    // The completions of the last round's requests still crossing the link.
    std::thread::sleep(Duration::from_secs(1));
    let mut rows = Vec::new();
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
        rows.push(Row {
            name: t.case.name.clone(),
            setup: t.setup,
            load: t.load,
            connections: t.connections,
            best: t.case.best()?.clone(),
            rounds: t.case.rounds().to_vec(),
            calls: Calls::read(&t.case.envoy)?.since(t.before),
            counters: t.case.counters(),
        });
    }
    let envoy_of = |setup: Setup, load: Load| {
        tracked
            .iter()
            .find(|t| t.setup == setup && t.load == load && t.connections == CONNECTIONS)
            .map(|t| &t.case.envoy)
    };
    let mut probes = Vec::new();
    for setup in [Setup::Single, Setup::Local, Setup::Remote] {
        let (Some(first), Some(second)) = (
            envoy_of(setup, Load::FirstExecutions),
            envoy_of(setup, Load::Replays),
        ) else {
            fail!("{}: a case is missing", setup.name());
        };
        probes.push(probe(setup, first, second)?);
    }
    let report = Report {
        rows,
        probes,
        settings: Settings { seconds, rounds },
        config: filter_config(Setup::Local, &regional),
        stamp,
        load_before,
        envoy: envoy_version(),
        etcd: etcd_version(),
        wall_s: started.elapsed().as_secs_f64(),
    };
    println!(
        "\n{}\n{}\n{}\n{}\n\n{}",
        table(&report),
        calls_table(&report),
        probe_table(&report),
        reading(&report),
        counters_text(&report)
    );
    if no_write() {
        return Ok(());
    }
    write_section("## Regions", &section(&report))
}

/// Throughput and latency, with ratios to the single region and to local homes (the
/// case of the same load at the default connections).
fn table(report: &Report) -> String {
    let mut table = table_header(&[
        "req/s vs single region",
        "p50 vs single region",
        "p99 vs single region",
        "req/s vs homed in a",
        "p50 vs homed in a",
    ]);
    for row in &report.rows {
        let of = |setup| {
            report
                .row(setup, row.load, CONNECTIONS)
                .map_or((f64::NAN, f64::NAN, f64::NAN), |r| {
                    (r.best.rps, r.best.p50_ms, r.best.p99_ms)
                })
        };
        let ((rps, p50, p99), (local_rps, local_p50, _)) = (of(Setup::Single), of(Setup::Local));
        let m = &row.best;
        table.push_str(&table_row(
            &row.name,
            m,
            &[
                m.rps / rps,
                m.p50_ms / p50,
                m.p99_ms / p99,
                m.rps / local_rps,
                m.p50_ms / local_p50,
            ],
            &row.rounds_text(),
        ));
    }
    table
}

/// What each case sent across regions in its measured rounds, per request its filter
/// saw.
fn calls_table(report: &Report) -> String {
    let (a, b) = (cluster_of(LOCAL), cluster_of(REMOTE));
    let mut out = format!(
        "| case | requests the filter saw | executed | replayed | `{a}` requests per request | `{b}` requests per request | `remote_claims.{REMOTE}` per request | `remote_completions.{REMOTE}` per request | connections ÷ req/s, ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for row in &report.rows {
        let c = row.calls;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} |\n",
            row.name,
            c.requests,
            c.executed,
            c.replayed,
            c.per(c.local),
            c.per(c.remote),
            c.per(c.claims),
            c.per(c.completions),
            row.held_ms()
        ));
    }
    out
}

/// "- <case>: <counters>" lines.
fn counters_text(report: &Report) -> String {
    report
        .rows
        .iter()
        .filter(|r| !r.counters.is_empty())
        .map(|r| format!("- {}: {}\n", r.name, r.counters))
        .collect()
}

/// The median and the highest of `ms`.
fn median_max(ms: &[f64]) -> (f64, f64) {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    (
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

fn probe_table(report: &Report) -> String {
    let (a, b) = (cluster_of(LOCAL), cluster_of(REMOTE));
    let mut out = format!(
        "| one request at a time | first execution p50 ms | max ms | `{a}` / `{b}` requests per first execution | cold replay p50 ms | max ms | `{a}` / `{b}` requests per cold replay |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in &report.probes {
        let ((f50, fmax), (r50, rmax)) = (median_max(&p.first), median_max(&p.replay));
        out.push_str(&format!(
            "| {} | {f50:.1} | {fmax:.1} | {} | {r50:.1} | {rmax:.1} | {} |\n",
            p.setup.name(),
            p.first_calls.split(),
            p.replay_calls.split(),
        ));
    }
    out
}

/// What the figures say: local homes against the single region (equal within the
/// rounds' spread, or not), remote against local, Little's law, and the calls.
fn reading(report: &Report) -> String {
    let get = |setup, load, c| report.row(setup, load, c);
    let probe = |setup| report.probes.iter().find(|p| p.setup == setup);
    let rt_ms = 2.0 * ONE_WAY.as_secs_f64() * 1e3;
    let (a, b) = (cluster_of(LOCAL), cluster_of(REMOTE));
    let mut parts = Vec::new();
    for load in [Load::FirstExecutions, Load::Replays] {
        let (Some(single), Some(local)) = (
            get(Setup::Single, load, CONNECTIONS),
            get(Setup::Local, load, CONNECTIONS),
        ) else {
            continue;
        };
        let ratio = local.best.rps / single.best.rps;
        let noise = single.spread().max(local.spread());
        let verdict = if (ratio - 1.0).abs() <= noise {
            "equal within the noise"
        } else {
            "apart by more than the noise"
        };
        parts.push(format!(
            "{} ×{ratio:.2} the req/s, p50 ×{:.2}, p99 ×{:.2}, where the rounds of either case \
spread by up to {:.0}% of its best: {verdict}",
            load.name(),
            local.best.p50_ms / single.best.p50_ms,
            local.best.p99_ms / single.best.p99_ms,
            noise * 100.0
        ));
    }
    let mut text = format!(
        "**Reading it.** Keys homed locally against the single region (the same proxy and \
etcd, no regions): {}.",
        parts.join("; ")
    );
    if let (Some(local), Some(remote)) = (probe(Setup::Local), probe(Setup::Remote)) {
        let (f, r) = (remote.first_calls, remote.replay_calls);
        text.push_str(&format!(
            " **Calls.** Homed locally, nothing crosses: one request at a time, a first \
execution made {:.2} requests on `{a}` and {:.2} on `{b}`. Homed remotely, a first execution made \
{:.2} on `{b}` and {:.2} on `{a}`: its claim and its completion ({:.2} remote claims and \
{:.2} remote completions by the filter's counters); the rest are lease grants (each worker \
takes a lease per purpose on a shard every few seconds and writes its claims with it). A \
cold replay homed remotely made {:.2} on `{b}`: its claim, answered with the record.",
            local.first_calls.per(local.first_calls.local),
            local.first_calls.per(local.first_calls.remote),
            f.per(f.remote),
            f.per(f.local),
            f.per(f.claims),
            f.per(f.completions),
            r.per(r.remote),
        ));
    }
    if let Some(wide) = get(Setup::Remote, Load::FirstExecutions, WIDE) {
        let c = wide.calls;
        text.push_str(&format!(
            " Under wrk, per request the filter saw at {WIDE} connections: {:.2} claims, {:.2} \
completions, {:.2} `{b}` requests. The requests wrk abandons when a round ends are claimed, \
never completed, and released (the `released` counter below, one call each); and when a \
worker's lease is due, every claim it starts before the new one arrives asks for one \
(one round trip more), so with many requests in flight the grants add up.",
            c.per(c.claims),
            c.per(c.completions),
            c.per(c.remote),
        ));
    }
    if let (Some(local), Some(remote), Some(wide)) = (
        get(Setup::Local, Load::FirstExecutions, CONNECTIONS),
        get(Setup::Remote, Load::FirstExecutions, CONNECTIONS),
        get(Setup::Remote, Load::FirstExecutions, WIDE),
    ) {
        text.push_str(&format!(
            " **Latency and Little's law.** Two calls across are at least two round trips, \
2 × {rt_ms:.0} ms = {:.0} ms: remote first executions ran at p50 {:.1} ms against {:.1} ms \
homed locally. A request holds its connection that long, so {CONNECTIONS} connections carry \
at most {CONNECTIONS} / {:.0} ms = {:.0} req/s: {:.0} req/s measured ({:.0} ms per request by \
connections ÷ req/s), ×{:.2} the local rate. The calls per execution are the same as locally; \
the requests wait longer, so more must be in flight for the same rate (the local rate times \
the remote latency: {:.0} × {:.3} s ≈ {:.0} requests, against {:.0} locally). With {WIDE} \
connections the remote first executions ran at {:.0} req/s (p50 {:.1} ms), ×{:.2} the local \
rate at {CONNECTIONS}; Envoy spent {:.0} CPU µs per request there against {:.0} locally, on \
the same two cores as wrk, the upstream, both etcds and the relays.",
            2.0 * rt_ms,
            remote.best.p50_ms,
            local.best.p50_ms,
            2.0 * rt_ms,
            f64::from(CONNECTIONS) * 1e3 / (2.0 * rt_ms),
            remote.best.rps,
            remote.held_ms(),
            remote.best.rps / local.best.rps,
            local.best.rps,
            remote.best.p50_ms / 1e3,
            local.best.rps * remote.best.p50_ms / 1e3,
            local.best.rps * local.best.p50_ms / 1e3,
            wide.best.rps,
            wide.best.p50_ms,
            wide.best.rps / local.best.rps,
            wide.best.cpu_us.unwrap_or(f64::NAN),
            local.best.cpu_us.unwrap_or(f64::NAN),
        ));
    }
    if let (Some(local), Some(remote)) = (
        get(Setup::Local, Load::Replays, CONNECTIONS),
        get(Setup::Remote, Load::Replays, CONNECTIONS),
    ) {
        let c = remote.calls;
        text.push_str(&format!(
            " **Replays** of one hot key homed remotely ran at ×{:.2} the local rate (p50 \
×{:.2}): each worker answers a record it has seen in the last 5 s from its tier, without a \
call; when its copy ages out, the requests it gets before a fresh one arrives claim across \
({} remote claims in {} replays, {:.2} per 1000), each waiting one round trip or more (a \
lease grant first when one is due). Those few waits are the whole p99 ({:.1} ms against \
{:.1} ms locally): wrk corrects for coordinated omission (a response slower than its \
connection's mean interval adds the samples a client sending at that rate would have \
seen: about 80 ms / {:.1} ms ≈ {:.0} samples for one 80 ms wait here).",
            remote.best.rps / local.best.rps,
            remote.best.p50_ms / local.best.p50_ms,
            c.claims,
            c.requests,
            c.per(c.claims) * 1e3,
            remote.best.p99_ms,
            local.best.p99_ms,
            remote.held_ms(),
            rt_ms / remote.held_ms(),
        ));
    }
    if let (Some(local), Some(remote)) = (probe(Setup::Local), probe(Setup::Remote)) {
        let ((lf, _), (lr, _)) = (median_max(&local.first), median_max(&local.replay));
        let ((rf, _), (rr, _)) = (median_max(&remote.first), median_max(&remote.replay));
        text.push_str(&format!(
            " **A retry that changed region** lands on a proxy that has not seen the record: \
one at a time, such a cold replay took {rr:.1} ms homed remotely against {lr:.1} ms locally \
(one round trip: {rt_ms:.0} ms floor), a first execution {rf:.1} ms against {lf:.1} ms \
({:.0} ms floor).",
            2.0 * rt_ms
        ));
    }
    text
}

fn section(report: &Report) -> String {
    let Settings { seconds, rounds } = report.settings;
    format!(
        "## Regions\n\n\
`make bench-envoy` (envoy/src/bin/bench-etcd/regions.rs); this section alone: \
`BENCH_PART=regions make bench-envoy` (bench-envoy has no part of that name, so only \
bench-etcd runs), about {:.0} s of wall time in this run. At most once across regions \
(issue 34) under the simulation of `dedup_envoy::regions`, as in envoy/tests/regions.rs: \
two regions `a` and `b`, each a single-member etcd {} (`--heartbeat-interval 50 \
--election-timeout 500`, data on the local disk, fsync on), every path from region `a` to \
`b`'s etcd through a relay in the benchmark's process that delays every byte \
**{} ms each way** (a round trip across regions: {} ms). Every case is its own Envoy \
{} (`--concurrency 2`) in region `a`, on `envoy/configs/multi-proxy-etcd.yaml` with one \
cluster per region (`etcd_a` to `a`'s member directly, `etcd_b` through the relay), in \
front of the in-process demo upstream. The filter's configuration: keys homed by the \
scope header `{HOME}` (`a` when absent), \
`{}`; the single-region cases use the same Envoy and header with `\"store\": {{\"kind\": \
\"etcd\", \"cluster\": \"etcd_a\"}}` instead (no regions, the same etcd as the local \
homes). Load: wrk `-t{THREADS} -c{CONNECTIONS}` (one remote case also at `-c{WIDE}`), every \
request a `POST /orders` with a {}-byte JSON body, `Host: {HOST}` and `{HOME}: a` or `b`; first executions a \
unique `Idempotency-Key` per request (claim, upstream call, completion: two txns on the \
home's etcd), replays one key per case (mostly answered by each worker's tier). \
{WARMUP_SECONDS} s warm-up per case, then {rounds} rounds of {seconds} s interleaving the \
cases, each case reporting its best round. Everything on 127.0.0.1 of one 2-core machine, \
so absolute figures are low and noisy; compare within the run. Run: {}. Load average \
before this run: {} (above ~1 means other work competed for the cores).\n\n\
{}\n\
What each case sent across regions in its measured rounds, per request its filter saw \
(`requests`; wrk abandons the requests in flight when a round ends, so a few are neither \
executed nor replayed): Envoy's requests on each region's etcd cluster \
(`cluster.<name>.upstream_rq_total`: the filter's gRPC calls; the health checks are not \
counted there) and the filter's remote counters. The last column is the time each \
request held its connection by Little's law (connections ÷ req/s).\n\n\
{}\n\
One request at a time ({PROBES} keys per setup, after the rounds): a first execution \
through the first-execution case's Envoy, then the same request through the replay \
case's Envoy (the same configuration, so another proxy of region `a`, whose worker tier \
has never seen the record: a cold replay reads it from the home's etcd), with Envoy's \
requests on each etcd cluster per request.\n\n\
{}\n\
{}\n\n\
Filter counters after each case's rounds (warm-up included):\n\n{}",
        report.wall_s,
        report.etcd,
        ONE_WAY.as_millis(),
        2 * ONE_WAY.as_millis(),
        report.envoy,
        report.config,
        BODY.len(),
        report.stamp,
        report.load_before,
        table(report),
        calls_table(report),
        probe_table(report),
        reading(report),
        counters_text(report),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use dedup_core::config::Config;

    fn measured(rps: f64, p50_ms: f64) -> Measured {
        Measured {
            rps,
            p50_ms,
            p99_ms: p50_ms * 2.0,
            requests: (rps * 3.0) as u64,
            non_2xx: 0,
            errors: String::new(),
            cpu_us: Some(400.0),
        }
    }

    /// `n` requests, each with `local` and `remote` etcd requests, `each` remote claim
    /// and completion.
    fn calls(n: u64, (local, remote, each): (u64, u64, u64), executed: bool) -> Calls {
        Calls {
            requests: n,
            executed: if executed { n } else { 0 },
            replayed: if executed { 0 } else { n },
            local: local * n,
            remote: remote * n,
            claims: each * n,
            completions: each * n,
        }
    }

    fn report() -> Report {
        let rows = CASES
            .iter()
            .map(|&(load, setup, connections)| {
                let (rps, p50, calls) = match (load, setup, connections) {
                    (Load::FirstExecutions, Setup::Remote, WIDE) => (900.0, 250.0, (0, 2, 1)),
                    (Load::FirstExecutions, Setup::Remote, _) => (190.0, 165.0, (0, 2, 1)),
                    (Load::FirstExecutions, Setup::Single, _) => (1020.0, 30.0, (2, 0, 0)),
                    (Load::FirstExecutions, _, _) => (1000.0, 30.0, (2, 0, 0)),
                    (Load::Replays, Setup::Remote, _) => (9000.0, 3.0, (0, 0, 0)),
                    (Load::Replays, _, _) => (9100.0, 3.0, (0, 0, 0)),
                };
                Row {
                    name: format!("{}, {}", setup.name(), load.name()),
                    setup,
                    load,
                    connections,
                    best: measured(rps, p50),
                    rounds: vec![rps, rps * 0.97, rps * 0.99],
                    calls: self::calls(3000, calls, load == Load::FirstExecutions),
                    counters: "executed=1 requests=1".into(),
                }
            })
            .collect();
        let probe = |setup, first: f64, replay: f64| {
            let remote = u64::from(setup == Setup::Remote);
            let local = 1 - remote;
            Probe {
                setup,
                first: vec![first; PROBES],
                replay: vec![replay; PROBES],
                first_calls: calls(30, (2 * local, 2 * remote, remote), true),
                replay_calls: calls(30, (local, remote, remote), false),
            }
        };
        Report {
            rows,
            probes: vec![
                probe(Setup::Single, 3.0, 1.5),
                probe(Setup::Local, 3.1, 1.5),
                probe(Setup::Remote, 164.0, 82.0),
            ],
            settings: Settings {
                seconds: 3,
                rounds: 3,
            },
            config: "{}".into(),
            stamp: "2026-12-07 12:00 UTC".into(),
            load_before: "0.5".into(),
            envoy: "1.40.0".into(),
            etcd: "3.4.23".into(),
            wall_s: 150.0,
        }
    }

    #[test]
    fn every_setup_parses_and_homes_its_requests_as_named() {
        // `Regions::store` for a proxy in `a`, without starting the regions' etcds.
        let regional = dedup_envoy::regions::store_of(&["a", "b"], LOCAL, home_rule());
        for setup in [Setup::Single, Setup::Local, Setup::Remote] {
            let text = filter_config(setup, &regional);
            Config::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        }
        assert!(filter_config(Setup::Single, &regional).contains(r#""cluster":"etcd_a""#));
        for load in [Load::FirstExecutions, Load::Replays] {
            let s = script(load, Setup::Remote.home(), "k");
            assert!(s.contains(r#"["x-home-region"] = "b""#), "{s}");
            assert!(s.contains(r#"["Host"] = "orders.example""#), "{s}");
            assert!(s.contains("BODY"), "the body is filled in by the bench kit");
        }
        assert!(script(Load::Replays, "a", "bench-replay-local")
            .contains(r#"wrk.headers["Idempotency-Key"] = "bench-replay-local""#));
    }

    #[test]
    fn the_section_renders_every_case_and_its_reading() {
        let report = report();
        let text = section(&report);
        assert!(text.starts_with("## Regions\n\n"));
        assert!(text.contains("`BENCH_PART=regions make bench-envoy`"));
        for row in &report.rows {
            assert!(text.contains(&format!("| {} |", row.name)), "{}", row.name);
        }
        // Local figures equal the single region's within the rounds' 3% spread.
        assert!(text.contains("×0.98 the req/s"), "{text}");
        assert!(text.contains("equal within the noise"));
        // Two remote calls per first execution homed in b, none to a; one per cold replay.
        assert!(
            text.contains("a first execution made 2.00 requests on `etcd_a` and 0.00 on `etcd_b`")
        );
        assert!(text.contains(
            "made 2.00 on `etcd_b` and 0.00 on `etcd_a`: its claim and its completion (1.00 remote claims and 1.00 remote completions"
        ));
        assert!(text.contains("A cold replay homed remotely made 1.00 on `etcd_b`"));
        assert!(text.contains("32 connections carry at most 32 / 160 ms = 200 req/s"));
        assert!(text.contains(
            "| homed in b (remote) | 164.0 | 164.0 | 0.00 / 2.00 | 82.0 | 82.0 | 0.00 / 1.00 |"
        ));
        assert!(text.contains("- homed in b (remote), replays: executed=1 requests=1\n"));
        assert!(
            text.ends_with("requests=1\n"),
            "{}",
            &text[text.len() - 80..]
        );
    }

    #[test]
    fn a_case_spread_is_its_rounds_range_over_its_best() {
        let report = report();
        let row = report
            .row(Setup::Local, Load::Replays, CONNECTIONS)
            .unwrap();
        assert!((row.spread() - 0.03).abs() < 1e-9);
        assert_eq!(row.rounds_text(), "9100, 8827, 9009");
        assert!((row.held_ms() - 32.0 * 1e3 / 9100.0).abs() < 1e-9);
    }
}
