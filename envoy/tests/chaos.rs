//! The chaos soak's short variant (`make chaos` runs it longer): two Envoys
//! on a 3-member etcd and one on shared data under many clients, while etcd
//! members are killed, frozen and partitioned, proxies restarted and
//! reconfigured, and the upstream slow, failing and resetting; the checker
//! must find nothing, and the ordered deliveries must have met the ordering
//! guard on both stores (stale versions refused on etcd, acknowledged on shared
//! data). Then the same soak with a deliberately broken
//! configuration (`on_unknown_outcome: "release"`, and `"hold"`, which lets a
//! key whose outcome is unknown run again after the in-flight timeout), which
//! the checker must catch: a checker that finds nothing there proves nothing.
//! And a shorter soak with the etcd store sharded over two 3-member clusters
//! (`make chaos SHARDS=2`), every fault on either shard, both at once too; the
//! "hold" soak runs sharded as well, so a broken build is caught there too.
//! And the regions variant (`make chaos REGIONS=1`): two simulated regions, each its
//! etcd and its proxy, records homed by a scope header, clients retrying across
//! regions while the regions are cut apart; then the same with each region on its
//! own etcd and no home rule, which the checker must catch running a key twice.
//!
//! The soaks take the machine: they run one at a time. `CHAOS_SEED` picks
//! another seed than the fixed one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_envoy::chaos::checker::Rule;
use dedup_envoy::chaos::{self, Broken, Options, Report};
use std::sync::Mutex;

static ONE_SOAK_AT_A_TIME: Mutex<()> = Mutex::new(());

fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129)
}

fn soak(seconds: u64, broken: Option<Broken>) -> Report {
    soak_on(seconds, broken, 1)
}

/// A soak with the etcd store on `shards` etcd clusters.
fn soak_on(seconds: u64, broken: Option<Broken>, shards: usize) -> Report {
    run_soak(Options {
        seconds,
        seed: seed(),
        clients: 24,
        broken,
        shards,
        defaults: false,
        regions: false,
    })
}

/// A soak of the regions variant.
fn soak_regions(seconds: u64, broken: Option<Broken>) -> Report {
    run_soak(Options {
        seconds,
        seed: seed(),
        clients: 24,
        broken,
        shards: 1,
        defaults: false,
        regions: true,
    })
}

fn run_soak(options: Options) -> Report {
    let _one = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let report = chaos::run(&options).unwrap_or_else(|e| panic!("the soak did not run: {e}"));
    eprintln!("{}", report.text());
    report
}

/// The nemesis injected and healed every fault it planned, and the checker found no
/// violation.
fn assert_clean(report: &Report) {
    assert!(
        report.nemesis_errors.is_empty(),
        "the nemesis failed to inject or heal: {:?}\nschedule:\n{}",
        report.nemesis_errors,
        report.fault_log()
    );
    assert_eq!(
        report.violations(),
        0,
        "the checker found violations (report above); schedule:\n{}",
        report.fault_log()
    );
}

#[test]
fn short_soak_under_every_fault_finds_no_violation() {
    let report = soak(60, None);
    assert_clean(&report);
    // Every kind of fault was injected, and the run exercised every answer.
    let faults = report.fault_counts();
    for kind in [
        "etcd kill -9 leader",
        "etcd kill -9 follower",
        "etcd SIGSTOP member",
        "etcd partition member",
        "proxy kill -9 and restart",
        "proxy LDS push",
        "upstream slow window",
        "upstream 5xx/429 window",
        "upstream reset window",
        "upstream asked: reset before answering",
        "upstream asked: reset mid-body",
        "upstream asked: slow beyond the route timeout",
        "client hang-up (reset)",
        "client timeout (close)",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "no {kind:?} in this run: {faults:?}"
        );
    }
    let statuses = |pred: &dyn Fn(u16, bool) -> bool| {
        report
            .attempts
            .iter()
            .filter(|a| a.answer().is_some_and(|r| pred(r.status, r.replayed)))
            .count()
    };
    assert!(
        report.execs.len() >= 200,
        "{} executions",
        report.execs.len()
    );
    assert!(statuses(&|_, replayed| replayed) > 0, "no replays");
    for status in [400, 409, 422] {
        assert!(statuses(&|s, _| s == status) > 0, "no {status}");
    }
    // The ordering guard decided on both stores: ordered versions ran, and stale ones
    // were refused (etcd) and acknowledged (shared data).
    assert!(
        report.findings.ordered_execs >= 50 && report.findings.completions > 0,
        "{} ordered executions, {} completions",
        report.findings.ordered_execs,
        report.findings.completions
    );
    let answered = |pred: &dyn Fn(&dedup_envoy::chaos::history::Answer) -> bool| {
        report
            .attempts
            .iter()
            .filter(|a| a.ordered.is_some() && a.answer().is_some_and(pred))
            .count()
    };
    assert!(
        answered(&|r| r.problem.as_deref() == Some("stale-version")) > 0,
        "no 409 stale-version"
    );
    assert!(answered(&|r| r.stale) > 0, "no acknowledged stale delivery");
}

#[test]
fn short_soak_on_two_shards_faulted_both_finds_no_violation() {
    let report = soak_on(30, None, 2);
    assert_clean(&report);
    // Each shard was faulted, and each holds records (and entities): the keys were
    // spread over both, the proxies read and wrote both.
    for shard in 0..2 {
        assert!(
            report.faults.iter().any(|e| e.shard == Some(shard)),
            "no fault on shard {shard}; schedule:\n{}",
            report.fault_log()
        );
    }
    assert_eq!(report.shard_keys.len(), 2);
    for (name, keys) in &report.shard_keys {
        assert!(keys.is_some_and(|k| k > 0), "shard {name}: {keys:?} keys");
    }
    assert!(
        report.execs.len() >= 100,
        "{} executions",
        report.execs.len()
    );
}

#[test]
fn a_build_that_releases_unknown_outcomes_is_caught() {
    let report = soak(30, Some(Broken::ReleaseOnUnknown));
    assert!(
        report.violations_of(Rule::AtMostOnce) > 0,
        "with on_unknown_outcome \"release\" a retry after a hang-up or route timeout runs again, \
         and the checker must flag it; it found nothing (report above)"
    );
}

#[test]
fn a_build_that_holds_unknown_outcomes_only_until_the_in_flight_timeout_is_caught() {
    // On two shards: the checker catches a broken build on a sharded store too.
    let report = soak_on(30, Some(Broken::HoldOnUnknown), 2);
    assert!(
        report.violations_of(Rule::AtMostOnce) > 0,
        "with on_unknown_outcome \"hold\" a retry more than in_flight_timeout_seconds after a \
         hang-up or route timeout runs again, and the checker must flag it; it found nothing \
         (report above)"
    );
}

/// Every field that decides what runs and when left at its default (`failure_mode`
/// closed, the 24 h TTL, the 30 s in-flight time, `store.timeout_ms` 8 s, `principal`
/// the authorization header...): under every fault, no key ran twice within its TTL.
#[test]
fn short_soak_with_every_default_runs_no_key_twice() {
    let report = run_soak(Options {
        seconds: 30,
        seed: seed(),
        clients: 24,
        broken: None,
        shards: 1,
        defaults: true,
        regions: false,
    });
    assert_eq!(
        report.violations_of(Rule::AtMostOnce),
        0,
        "a key ran twice within its TTL with every default (report above); schedule:\n{}",
        report.fault_log()
    );
    assert_clean(&report);
}

/// Two regions (`make chaos REGIONS=1`), 40 ms apart one way, each its one-member etcd
/// and its proxy; keys homed in either by a scope header, every attempt to either
/// region, while the nemesis cuts the regions apart, kills and freezes a region's etcd
/// and restarts and reconfigures the proxies: no violation, and the run crossed
/// regions (claims sent to the other region, replays answered in one region from an
/// execution through the other, records in both).
#[test]
fn short_soak_across_two_regions_cut_apart_finds_no_violation() {
    let report = soak_regions(25, None);
    assert_clean(&report);
    let faults = report.fault_counts();
    assert!(
        faults.get("region cut off").copied().unwrap_or(0) > 0,
        "no region cut in this run: {faults:?}"
    );
    let regions = report.regions_figures();
    assert!(
        regions.replays_across > 0 && regions.away > 0,
        "nothing crossed regions: {}",
        regions.line()
    );
    for (region, claims, completions) in &regions.remote {
        assert!(
            *claims > 0 && *completions > 0,
            "region {region} sent no claim or completion to the other: {}",
            regions.line()
        );
    }
    for (region, keys) in &report.shard_keys {
        assert!(
            keys.is_some_and(|k| k > 0),
            "region {region}: {keys:?} keys"
        );
    }
    assert!(
        report.execs.len() >= 100,
        "{} executions",
        report.execs.len()
    );
}

/// Each region on its own etcd with no home rule (option (c) of the regions page,
/// `BROKEN=per-region`): a retry in the other region runs the key again, and the
/// checker must flag it; no replay can cross regions there.
#[test]
fn regions_on_their_own_stores_without_a_home_rule_are_caught() {
    let report = soak_regions(15, Some(Broken::PerRegion));
    assert!(
        report.violations_of(Rule::AtMostOnce) > 0,
        "with a store per region and no home rule a retry in the other region runs again, \
         and the checker must flag it; it found nothing (report above)"
    );
    assert_eq!(report.regions_figures().replays_across, 0);
}
