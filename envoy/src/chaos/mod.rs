//! The chaos soak (`make chaos`): a bounded, seeded run of many clients
//! against two Envoys on a 3-member etcd (or on N of them, the store sharded:
//! `--shards N`) and one Envoy on shared data, while
//! a nemesis kills, freezes and partitions etcd members, restarts proxies,
//! pushes their configuration and makes the upstream slow, failing or
//! resetting (a share of the requests are ordered deliveries, through an
//! `ordering` rule); then a checker reads the whole history (see `checker` for the
//! rules) and prints the figures. With `--regions true`, two simulated regions
//! instead, each its etcd and its proxy, records homed by a scope header, while the
//! nemesis also cuts the regions apart (`regions`).
//!
//! The seed fixes the fault schedule and every client's choices; thread
//! timing still differs between runs, so a seed replays the same pressure,
//! not the same interleaving.

pub mod checker;
pub mod clients;
pub mod cluster;
pub mod history;
pub mod nemesis;
pub mod regions;
pub mod rng;

use crate::Result;
use checker::{Findings, Params, ProxyCounters, Rule};
use cluster::Cluster;
pub use cluster::{Broken, Shards, MAX_SHARDS};
use history::{Attempt, Domain, Exec, Outcome};
use nemesis::{FaultEvent, Nemesis};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Options {
    /// Length of the soak (clients and nemesis), startup and checking excluded.
    pub seconds: u64,
    pub seed: u64,
    /// Client threads; three quarters on proxies A and B, the rest on C.
    pub clients: usize,
    pub broken: Option<Broken>,
    /// etcd clusters the store is sharded over (1: one cluster, `store.cluster`).
    pub shards: usize,
    /// Every field that decides what runs and when at its default (`--defaults`):
    /// `failure_mode`, TTLs, `store.timeout_ms`, ... (see `cluster::filter_config`).
    pub defaults: bool,
    /// The regions variant (`--regions true`): two regions, each its etcd and its
    /// proxy, every client on both (see `regions`).
    pub regions: bool,
}

pub struct Report {
    pub options: Options,
    pub soak: Duration,
    pub attempts: Vec<Attempt>,
    pub execs: Vec<Exec>,
    pub findings: Findings,
    pub faults: Vec<FaultEvent>,
    pub nemesis_errors: Vec<String>,
    pub counters: Vec<ProxyCounters>,
    pub operations: u64,
    /// Keys under the filter's prefix in each shard's etcd after the run, by name
    /// (`None`: the shard did not answer).
    pub shard_keys: Vec<(String, Option<u64>)>,
}

/// How a regions run crossed regions (`Report::regions_figures`).
#[derive(Debug, Clone)]
pub struct RegionFigures {
    /// Attempts with a well-formed key, and those sent to the proxy of another region
    /// than their record's home (their claims crossed regions).
    pub attempts: usize,
    pub away: usize,
    /// Operations with a well-formed key sent more than once (retried, or raced), and
    /// those whose attempts reached both regions.
    pub retried: usize,
    pub both: usize,
    /// Replays answered by one region's proxy from an execution made through the other
    /// region's.
    pub replays_across: usize,
    /// Times the nemesis cut the regions apart.
    pub cuts: usize,
    /// Answers `503 store-unavailable` (a home out of reach, under `failure_mode: "closed"`).
    pub unavailable: usize,
    /// Per proxy: its region, and the claims and completions it sent to the other
    /// region (`remote_claims.<region>`, `remote_completions.<region>`).
    pub remote: Vec<(&'static str, u64, u64)>,
}

impl RegionFigures {
    pub fn line(&self) -> String {
        let remote: Vec<String> = self
            .remote
            .iter()
            .map(|(r, claims, completions)| {
                format!("from {r}: {claims} claims, {completions} completions")
            })
            .collect();
        format!(
            "regions: {} of {} keyed attempts landed outside their record's home; {} of {} operations sent more than once had attempts in both regions; {} replays crossed regions (answered in one from an execution through the other); {} region cuts, {} answers 503 store-unavailable; remote calls {}",
            self.away,
            self.attempts,
            self.both,
            self.retried,
            self.replays_across,
            self.cuts,
            self.unavailable,
            remote.join("; ")
        )
    }
}

/// Start everything, soak, drain, check.
pub fn run(options: &Options) -> Result<Report> {
    let epoch = Instant::now();
    let Some(shards) = Shards::new(options.shards) else {
        crate::fail!("--shards must be 1 to {MAX_SHARDS}, not {}", options.shards);
    };
    let cluster = match options.regions {
        true if shards.count() > 1 || options.defaults => {
            crate::fail!("--regions runs on its own store: without --shards and --defaults")
        }
        true => regions::start(options.broken, epoch)?,
        false if options.broken == Some(Broken::PerRegion) => {
            crate::fail!(
                "--broken per-region is a configuration of the regions variant: add --regions true"
            )
        }
        false => Cluster::start(options.broken, shards, options.defaults, epoch)?,
    };
    let nemesis = Nemesis::new();
    let soak_start = Instant::now();
    let deadline = soak_start + Duration::from_secs(options.seconds);
    // The regions variant has no shared-data proxy: every client is on etcd there.
    let on_etcd = match cluster.proxies.len() {
        2 => options.clients.max(2),
        _ => (options.clients * 3 / 4).max(1),
    };
    let feed = clients::OrderedFeed::default();
    let attempts: Vec<Attempt> = std::thread::scope(|s| {
        let nem = s.spawn(|| nemesis.run(&cluster, options.seed, deadline));
        let handles: Vec<_> = (0..options.clients.max(2))
            .map(|id| {
                let (domain, proxies) = if id < on_etcd {
                    (Domain::Etcd, vec![0, 1])
                } else {
                    (Domain::SharedData, vec![2])
                };
                let client = clients::Client::new(
                    id,
                    domain,
                    proxies,
                    options.seed,
                    &cluster,
                    &nemesis,
                    &feed,
                );
                s.spawn(move || client.run(deadline))
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            if let Ok(mut a) = h.join() {
                all.append(&mut a);
            }
        }
        let _ = nem.join();
        all
    });
    let soak = soak_start.elapsed();
    // Drain: slow executions finish, completions and releases land.
    let end = Instant::now() + Duration::from_secs(15);
    while cluster.upstream.running() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let counters = cluster.final_counters()?;
    let shard_keys = cluster.keys_per_shard();
    let execs: Vec<Exec> = cluster
        .upstream
        .executions()
        .iter()
        .map(|e| Exec::from_upstream(e, epoch))
        .collect();
    let (ttl, ordering_ttl) = cluster::ttls(options.defaults);
    let params = Params {
        ttl,
        ordering_ttl,
        keeps_unknown: !matches!(
            options.broken,
            Some(Broken::ReleaseOnUnknown | Broken::HoldOnUnknown)
        ),
        domains: cluster.proxies.iter().map(|p| p.domain).collect(),
    };
    let findings = checker::check(&params, &attempts, &execs, &counters);
    let operations = attempts
        .iter()
        .map(|a| (a.client, a.op))
        .collect::<std::collections::HashSet<_>>()
        .len() as u64;
    Ok(Report {
        options: options.clone(),
        soak,
        attempts,
        execs,
        findings,
        faults: nemesis.events(),
        nemesis_errors: nemesis.errors(),
        counters,
        operations,
        shard_keys,
    })
}

impl Report {
    pub fn violations(&self) -> usize {
        self.findings.violations.len()
    }

    pub fn violations_of(&self, rule: Rule) -> usize {
        self.findings
            .violations
            .iter()
            .filter(|v| v.rule == rule)
            .count()
    }

    /// Faults injected, by kind: the nemesis's events, what requests asked
    /// of the upstream, and clients leaving early.
    pub fn fault_counts(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for e in &self.faults {
            *m.entry(e.kind.to_string()).or_insert(0) += 1;
        }
        for a in &self.attempts {
            if let Some(asked) = a.asked {
                *m.entry(format!("upstream asked: {asked}")).or_insert(0) += 1;
            }
            match a.outcome {
                history::Outcome::GaveUp { reset: true } => {
                    *m.entry("client hang-up (reset)".into()).or_insert(0) += 1
                }
                history::Outcome::GaveUp { reset: false } => {
                    *m.entry("client timeout (close)".into()).or_insert(0) += 1
                }
                _ => {}
            }
        }
        m
    }

    /// The figures and, if any, the violations with their history excerpts.
    pub fn text(&self) -> String {
        let o = &self.options;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "chaos soak: seed {}, {} s ({:.1} s run), {} clients, {}configuration: {}",
            o.seed,
            o.seconds,
            self.soak.as_secs_f64(),
            o.clients,
            if o.regions { "two regions, " } else { "" },
            match (o.broken, o.defaults) {
                (Some(b), _) => b.name(),
                (None, true) =>
                    "every default (failure_mode, TTLs, store.timeout_ms, principal...)",
                (None, false) => "correct",
            }
        );
        let _ = writeln!(s, "{}", self.etcd_line());
        let answered = self
            .attempts
            .iter()
            .filter(|a| a.answer().is_some())
            .count();
        let _ = writeln!(
            s,
            "requests: {} attempts in {} operations ({:.0}/s), {} answered",
            self.attempts.len(),
            self.operations,
            self.attempts.len() as f64 / self.soak.as_secs_f64().max(1.0),
            answered
        );
        let by_status = |pred: &dyn Fn(u16) -> bool| {
            self.attempts
                .iter()
                .filter(|a| a.answer().is_some_and(|r| pred(r.status)))
                .count()
        };
        let replays = self
            .attempts
            .iter()
            .filter(|a| a.answer().is_some_and(|r| r.replayed))
            .count();
        let on_etcd: std::collections::HashSet<&str> = self
            .attempts
            .iter()
            .filter(|a| a.domain == Domain::Etcd)
            .map(|a| a.request_id.as_str())
            .collect();
        let etcd_execs = self
            .execs
            .iter()
            .filter(|e| e.request_id.as_deref().is_some_and(|r| on_etcd.contains(r)))
            .count();
        let _ = writeln!(
            s,
            "executions: {} ({} etcd store, {} shared data); a key ran again after a release: {}, after its TTL: {}",
            self.execs.len(),
            etcd_execs,
            self.execs.len() - etcd_execs,
            self.findings.again_after_release,
            self.findings.again_after_expiry
        );
        let (gave_up, got_replay) = self.detached_retries();
        let _ = writeln!(
            s,
            "detached: {gave_up} operations on the detached route whose client gave up were retried; {got_replay} of them got the replay of their one execution"
        );
        let _ = writeln!(s, "{}", self.ordered_line());
        if o.regions {
            let _ = writeln!(s, "{}", self.regions_figures().line());
        }
        let _ = writeln!(
            s,
            "answers: {} replays, 409: {}, 422: {}, 400: {}, 5xx: {}",
            replays,
            by_status(&|st| st == 409),
            by_status(&|st| st == 422),
            by_status(&|st| st == 400),
            by_status(&|st| st >= 500),
        );
        for (what, n) in checker::tally(&self.attempts) {
            let _ = writeln!(s, "  {n:>7}  {what}");
        }
        let _ = writeln!(s, "faults injected:");
        for (kind, n) in self.fault_counts() {
            let _ = writeln!(s, "  {n:>7}  {kind}");
        }
        let _ = writeln!(s, "counters (summed over restarts) against the history:");
        for l in &self.findings.counter_lines {
            let _ = writeln!(s, "  {l}");
        }
        if !self.nemesis_errors.is_empty() {
            let _ = writeln!(s, "nemesis errors:");
            for e in &self.nemesis_errors {
                let _ = writeln!(s, "  {e}");
            }
        }
        let mut by_rule: BTreeMap<Rule, usize> = BTreeMap::new();
        for v in &self.findings.violations {
            *by_rule.entry(v.rule).or_insert(0) += 1;
        }
        let rules: Vec<String> = by_rule.iter().map(|(r, n)| format!("{r}: {n}")).collect();
        let _ = writeln!(
            s,
            "violations: {}{}",
            self.violations(),
            if rules.is_empty() {
                String::new()
            } else {
                format!(" ({})", rules.join(", "))
            }
        );
        if self.violations() > 0 {
            let on = |store: &str| {
                self.findings
                    .violations
                    .iter()
                    .filter(|v| v.what.starts_with(store))
                    .count()
            };
            let (etcd, shared) = (on("etcd store"), on("shared-data store"));
            let _ = writeln!(
                s,
                "  by store: {etcd} etcd store, {shared} shared data, {} not named by store",
                self.violations() - etcd - shared
            );
        }
        for v in self.findings.violations.iter().take(8) {
            let _ = writeln!(s, "- {} at {:.3}s: {}", v.rule, v.at.as_secs_f64(), v.what);
            for l in &v.excerpt {
                let _ = writeln!(s, "    {l}");
            }
        }
        if self.violations() > 8 {
            let _ = writeln!(s, "  … and {} more", self.violations() - 8);
        }
        let _ = writeln!(
            s,
            "seed {} (replay the schedule: make chaos SEED={} SECONDS={}{}{}{}{})",
            o.seed,
            o.seed,
            o.seconds,
            match o.shards {
                1 => String::new(),
                n => format!(" SHARDS={n}"),
            },
            if o.regions { " REGIONS=1" } else { "" },
            if o.defaults { " DEFAULTS=1" } else { "" },
            o.broken
                .map(|b| format!(" {}", b.knob()))
                .unwrap_or_default()
        );
        s
    }

    /// The etcd store's clusters, one line: how many, the keys each holds after the
    /// run and, sharded, the etcd faults each took.
    pub fn etcd_line(&self) -> String {
        let keys = |k: &Option<u64>| k.map_or("?".to_string(), |k| k.to_string());
        if self.options.regions {
            let per_region: Vec<String> = self
                .shard_keys
                .iter()
                .enumerate()
                .map(|(i, (name, k))| {
                    let faults = self.faults.iter().filter(|e| e.shard == Some(i)).count();
                    format!("{name}: {} keys, {faults} etcd faults", keys(k))
                })
                .collect();
            return format!(
                "etcd store: {} regions ({} ms one way between them), each a {}-member etcd; after the run {}",
                regions::NAMES.len(),
                regions::ONE_WAY.as_millis(),
                regions::MEMBERS,
                per_region.join("; ")
            );
        }
        if self.options.shards <= 1 {
            let n = self.shard_keys.first().map(|(_, k)| keys(k));
            return format!(
                "etcd store: one 3-member cluster; keys after the run: {}",
                n.unwrap_or_else(|| "?".into())
            );
        }
        let mut faults: BTreeMap<usize, u64> = BTreeMap::new();
        for e in &self.faults {
            if let (Some(shard), true) =
                (e.shard, e.kind != "etcd faults on several shards at once")
            {
                *faults.entry(shard).or_insert(0) += 1;
            }
        }
        let per_shard: Vec<String> = self
            .shard_keys
            .iter()
            .enumerate()
            .map(|(i, (name, k))| {
                format!(
                    "{name}: {} keys, {} etcd faults",
                    keys(k),
                    faults.get(&i).copied().unwrap_or(0)
                )
            })
            .collect();
        format!(
            "etcd store: {} shards (store.shards), each a 3-member cluster; after the run {}",
            self.options.shards,
            per_shard.join("; ")
        )
    }

    /// The ordered deliveries' figures, one line.
    pub fn ordered_line(&self) -> String {
        let ordered: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.ordered.is_some())
            .collect();
        let ops: std::collections::HashSet<(usize, u64)> =
            ordered.iter().map(|a| (a.client, a.op)).collect();
        let versions: std::collections::HashSet<(Domain, &str, i64)> = ordered
            .iter()
            .filter_map(|a| a.ordered.as_ref().map(|(e, v)| (a.domain, e.as_str(), *v)))
            .collect();
        let entities: std::collections::HashSet<(Domain, &str)> =
            versions.iter().map(|(d, e, _)| (*d, *e)).collect();
        let count = |pred: &dyn Fn(&history::Answer) -> bool| {
            ordered
                .iter()
                .filter(|a| a.answer().is_some_and(pred))
                .count()
        };
        let rejected = count(&|r| r.problem.as_deref() == Some("stale-version"));
        let acknowledged = count(&|r| r.stale);
        let busy = count(&|r| r.problem.as_deref() == Some("in-flight"));
        let by_id: std::collections::HashMap<&str, Domain> = ordered
            .iter()
            .map(|a| (a.request_id.as_str(), a.domain))
            .collect();
        let on_etcd = self
            .execs
            .iter()
            .filter(|e| e.request_id.as_deref().and_then(|r| by_id.get(r)) == Some(&Domain::Etcd))
            .count();
        let on_shared = self
            .execs
            .iter()
            .filter(|e| {
                e.request_id.as_deref().and_then(|r| by_id.get(r)) == Some(&Domain::SharedData)
            })
            .count();
        format!(
            "ordered: {} deliveries ({} attempts) of {} versions of {} entities; {} executions ({on_etcd} etcd store, {on_shared} shared data); stale: {} refused 409 stale-version (etcd), {} acknowledged (shared data); {} 409 in-flight; rules (f) and (g) checked them against {} completions",
            ops.len(),
            ordered.len(),
            versions.len(),
            entities.len(),
            self.findings.ordered_execs,
            rejected,
            acknowledged,
            busy,
            self.findings.completions
        )
    }

    /// Operations on the detached route whose client gave up on an attempt and tried
    /// again, and how many of them were later answered with a replay.
    pub fn detached_retries(&self) -> (usize, usize) {
        // Per operation: a client gave up, a later attempt followed, one got a replay.
        let mut ops: BTreeMap<(usize, u64), (bool, bool, bool)> = BTreeMap::new();
        let mut sorted: Vec<&Attempt> = self.attempts.iter().filter(|a| a.detached).collect();
        sorted.sort_by_key(|a| (a.client, a.op, a.n));
        for a in sorted {
            let e = ops.entry((a.client, a.op)).or_default();
            if e.0 {
                e.1 = true;
                e.2 |= a.answer().is_some_and(|r| r.replayed);
            }
            e.0 |= matches!(a.outcome, Outcome::GaveUp { .. });
        }
        let retried = ops.values().filter(|e| e.1).count();
        let replayed = ops.values().filter(|e| e.2).count();
        (retried, replayed)
    }

    /// The regions variant's figures: how the attempts, executions and replays
    /// crossed regions, and the proxies' remote counters.
    pub fn regions_figures(&self) -> RegionFigures {
        let region = |proxy: usize| regions::NAMES.get(proxy).copied().unwrap_or("?");
        let home = |a: &Attempt| {
            let subject = match (&a.ordered, &a.key) {
                (Some((entity, _)), _) => entity.as_str(),
                (None, Some(key)) => key.as_str(),
                (None, None) => "",
            };
            regions::home_region(&a.tenant, subject)
        };
        let keyed: Vec<&Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.form == history::KeyForm::Good)
            .collect();
        let away = keyed.iter().filter(|a| home(a) != region(a.proxy)).count();
        // Per operation: its attempts, and the proxies they went to (a bit each).
        let mut proxies_of: BTreeMap<(usize, u64), (usize, u8)> = BTreeMap::new();
        for a in &keyed {
            let e = proxies_of.entry((a.client, a.op)).or_insert((0, 0));
            e.0 += 1;
            e.1 |= 1 << a.proxy.min(7);
        }
        let retried = proxies_of.values().filter(|(n, _)| *n > 1).count();
        let both = proxies_of
            .values()
            .filter(|(_, m)| m.count_ones() > 1)
            .count();
        let through: std::collections::HashMap<&str, usize> = self
            .attempts
            .iter()
            .map(|a| (a.request_id.as_str(), a.proxy))
            .collect();
        let by_order: std::collections::HashMap<u64, &Exec> =
            self.execs.iter().map(|e| (e.order_id, e)).collect();
        let replays_across = keyed
            .iter()
            .filter(|a| {
                a.answer()
                    .filter(|r| r.replayed)
                    .and_then(|r| r.order_id)
                    .and_then(|o| by_order.get(&o))
                    .and_then(|e| e.request_id.as_deref())
                    .and_then(|r| through.get(r))
                    .is_some_and(|p| *p != a.proxy)
            })
            .count();
        let remote = |c: &ProxyCounters, what: &str| -> u64 {
            c.totals
                .iter()
                .filter(|(k, _)| k.starts_with(what))
                .map(|(_, v)| v)
                .sum()
        };
        RegionFigures {
            attempts: keyed.len(),
            away,
            retried,
            both,
            replays_across,
            cuts: self
                .faults
                .iter()
                .filter(|e| e.kind == nemesis::REGION_CUT)
                .count(),
            unavailable: keyed
                .iter()
                .filter(|a| {
                    a.answer()
                        .is_some_and(|r| r.problem.as_deref() == Some("store-unavailable"))
                })
                .count(),
            remote: self
                .counters
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    (
                        region(i),
                        remote(c, "remote_claims."),
                        remote(c, "remote_completions."),
                    )
                })
                .collect(),
        }
    }

    /// The nemesis's events in order, one per line.
    pub fn fault_log(&self) -> String {
        self.faults
            .iter()
            .map(|e| format!("{:>8.3}s  {}: {}", e.at.as_secs_f64(), e.kind, e.detail))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
