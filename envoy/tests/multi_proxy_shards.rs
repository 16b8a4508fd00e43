//! The multi-proxy etcd suite (`multi_proxy/suite.rs`) on a sharded store: every
//! test's store is `store.shards` over two etcd clusters (`etcd_a`, `etcd_b`, each
//! with 3 members), with the same assertions. Then what only shards have: a live
//! resharding under traffic, a whole shard down, and the operator API per shard.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "multi_proxy/suite.rs"]
mod suite;

/// The suite's shard count.
const SHARDS: usize = 2;

use common::{assert_executed, assert_replay_of, burst, is_replayed, keyed};
use dedup_core::admin::AdminOp;
use dedup_core::config::Config;
use dedup_core::key::Digest;
use dedup_envoy::{client, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use suite::{etcd_filter_config, shard_map, Front, Multi, HOST, PREFIX};

/// Where the filter keeps a key's record: its digest as the operator API computes it
/// from a key and a host (`dedup_core::admin::parse`, the data plane's policy), and
/// the shard a map gives it (`dedup_core::stores::etcd::shards::pick`, the filter's own rendezvous
/// hashing, pinned as a format). The tests check the prediction against what etcd
/// holds.
struct Placement {
    config: Config,
}

impl Placement {
    fn new(filter_config: &str) -> Placement {
        let config = Config::parse(filter_config.as_bytes()).unwrap();
        Placement { config }
    }

    fn digest(&self, key: &str) -> Digest {
        let path = format!("/records?key={key}&authority={HOST}");
        match dedup_core::admin::parse(&self.config, "GET", path.as_bytes()) {
            Ok(AdminOp::Get { digest, .. }) => digest,
            _ => panic!("no digest for key {key:?}"),
        }
    }

    /// The record's etcd key.
    fn record_key(&self, digest: &Digest) -> Vec<u8> {
        dedup_core::stores::etcd::wire::record_key(PREFIX, digest).into_bytes()
    }
}

/// The shard (by name: each shard is named after its cluster) `map` puts `digest` on.
fn shard_of<'a>(map: &[&'a str], digest: &Digest) -> &'a str {
    let seeds: Vec<u64> = map
        .iter()
        .map(|n| dedup_core::stores::etcd::shards::name_seed(n))
        .collect();
    map[dedup_core::stores::etcd::shards::pick(&seeds, digest).unwrap()]
}

/// The slug of a problem+json answer (`in-flight`, `store-unavailable`, ...).
fn problem_slug(r: &Response) -> Option<String> {
    let ct = r.header("content-type").unwrap_or("");
    if !ct.starts_with("application/problem+json") {
        return None;
    }
    let v: Value = serde_json::from_slice(&r.body).ok()?;
    v["type"]
        .as_str()?
        .strip_prefix("urn:proxy-dedup:problem:")
        .map(str::to_string)
}

/// Which shards hold each record key, from every shard of `m`.
fn record_holders(m: &Multi) -> HashMap<Vec<u8>, Vec<String>> {
    let mut on: HashMap<Vec<u8>, Vec<String>> = HashMap::new();
    for (i, k) in m.keys(PREFIX) {
        on.entry(k.key)
            .or_default()
            .push(m.shards[i].cluster.clone());
    }
    on
}

fn sum_counter(m: &Multi, short: &str) -> u64 {
    (0..m.proxies.len()).map(|p| m.counter(p, short)).sum()
}

// --- resharding under traffic ------------------------------------------------

const OLD: &[&str] = &["etcd_a", "etcd_b"];
const NEW: &[&str] = &["etcd_a", "etcd_b", "etcd_c"];
const RESHARD_PATH: &str = "/orders/reshard";

/// One step of the resharding procedure (`store.next_shards`, then
/// `store.previous_shards`, then neither): the map claims are written under, and the
/// other map a won claim is checked against.
struct Step {
    name: &'static str,
    shards: &'static [&'static str],
    check: Option<(&'static str, &'static [&'static str])>,
}

impl Step {
    fn config(&self) -> String {
        let mut store = json!({"shards": shard_map(self.shards)});
        if let Some((field, map)) = self.check {
            store[field] = shard_map(map);
        }
        etcd_filter_config(json!({"store": store}))
    }

    /// The shards a proxy on this step reads `digest`'s record on: its own, then the
    /// other map's.
    fn reads(&self, digest: &Digest) -> Vec<&'static str> {
        let mut on = vec![shard_of(self.shards, digest)];
        if let Some((_, map)) = self.check {
            on.push(shard_of(map, digest));
        }
        on
    }
}

/// The 3 steps from `from` to `to`: claims under `from` checked against `to`, then
/// under `to` checked against `from`, then under `to` alone.
fn procedure(from: &'static [&'static str], to: &'static [&'static str]) -> [Step; 3] {
    [
        Step {
            name: "1: shards FROM, next_shards TO",
            shards: from,
            check: Some(("next_shards", to)),
        },
        Step {
            name: "2: shards TO, previous_shards FROM",
            shards: to,
            check: Some(("previous_shards", from)),
        },
        Step {
            name: "3: shards TO",
            shards: to,
            check: None,
        },
    ]
}

fn reshard_request(key: &str) -> dedup_envoy::Request {
    keyed(HOST, RESHARD_PATH, key, &json!({"order": key}))
}

/// What one key of the clients' traffic saw.
struct KeyRun {
    key: String,
    /// The phase (pushes done so far) when its first request was sent, and when its
    /// last answer came.
    started: usize,
    finished: usize,
    /// Its one fresh execution.
    truth: Option<Response>,
    fresh: usize,
    in_flight: usize,
    problems: Vec<String>,
}

/// A client thread: each key sent to both proxies at once (the upstream takes 40 ms,
/// so the two claims meet), then once more to one of them after both answered. At
/// most one fresh execution; the other answers replays of it or `409 in-flight` (of
/// the pair only: the follow-up comes after the pair's answers); when both claims
/// yielded to each other (a resharding check saw the other claim on both sides),
/// neither ran and the follow-up executes.
fn reshard_client(
    t: usize,
    addrs: [SocketAddr; 2],
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<KeyRun>>>,
) {
    const MAX_KEYS: usize = 400;
    for j in 0..MAX_KEYS {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let key = format!("rs-{t}-{j}");
        let started = phase.load(Ordering::SeqCst);
        let req = reshard_request(&key);
        let slow = req.clone().header("x-demo-delay-ms", "40");
        let (a, b) = std::thread::scope(|s| {
            let other = s.spawn(|| client::send(addrs[1], &slow));
            let a = client::send(addrs[0], &slow);
            (a, other.join().unwrap())
        });
        let follow = client::send(addrs[j % 2], &req);
        let mut run = KeyRun {
            key,
            started,
            finished: phase.load(Ordering::SeqCst),
            truth: None,
            fresh: 0,
            in_flight: 0,
            problems: Vec::new(),
        };
        let mut replays = Vec::new();
        for (i, answer) in [a, b, follow].into_iter().enumerate() {
            match answer {
                Ok(r) if r.status == 200 && !is_replayed(&r) => {
                    run.fresh += 1;
                    if run.truth.is_none() {
                        run.truth = Some(r);
                    }
                }
                Ok(r) if r.status == 200 => replays.push(r),
                Ok(r) if i < 2 && problem_slug(&r).as_deref() == Some("in-flight") => {
                    run.in_flight += 1
                }
                Ok(r) => run.problems.push(format!("answer {i}: {}", r.summary())),
                Err(e) => run.problems.push(format!("answer {i}: {e}")),
            }
        }
        if run.fresh != 1 {
            run.problems
                .push(format!("{} fresh executions answered", run.fresh));
        }
        for r in &replays {
            if run.truth.as_ref().is_none_or(|t| t.body != r.body) {
                run.problems
                    .push(format!("a replay of another body: {}", r.summary()));
            }
        }
        done.lock().unwrap().push(run);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a checkpoint found.
#[derive(Debug, Default)]
struct Checked {
    replayed: usize,
    /// Records on a shard the step no longer reads (step 3 only: the procedure lets
    /// it come only after the longest TTL, when they are gone; this test does not
    /// wait that long).
    stranded: usize,
    /// Replays that must have yielded: the record on the other map's shard only, and
    /// the key finished before this step was pushed, so no worker tier has it (a
    /// worker's tier belongs to its root context, new with each pushed config).
    sure_yields: usize,
    yields: u64,
    checks: u64,
    /// Moved keys whose duplicates were sent at once through both proxies, and the
    /// replays they got.
    bursts: usize,
    burst_replays: usize,
}

/// Moved completed keys each step of the procedure sends concurrent duplicates of.
const BURSTS_PER_STEP: usize = 3;

/// After every proxy took `step`: every completed key whose record `step` reads is
/// replayed (same body, one of the proxies), and every record is where one of the
/// two maps puts it, on one shard.
fn checkpoint(
    m: &Multi,
    placement: &Placement,
    step: &Step,
    step_phase: usize,
    done: &Mutex<Vec<KeyRun>>,
    failures: &mut Vec<String>,
) -> Checked {
    let runs: Vec<(String, usize, Response)> = done
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.truth.clone().map(|t| (r.key.clone(), r.finished, t)))
        .collect();
    let holders = record_holders(m);
    let (yields, checks) = (
        sum_counter(m, "reshard_yielded"),
        sum_counter(m, "reshard_checks"),
    );
    let mut c = Checked::default();
    for (i, (key, finished, truth)) in runs.iter().enumerate() {
        let digest = placement.digest(key);
        let on = holders
            .get(&placement.record_key(&digest))
            .cloned()
            .unwrap_or_default();
        let [holder] = on.as_slice() else {
            failures.push(format!("[{}] {key}: record on {on:?}", step.name));
            continue;
        };
        let expected = [shard_of(OLD, &digest), shard_of(NEW, &digest)];
        if !expected.contains(&holder.as_str()) {
            failures.push(format!(
                "[{}] {key}: record on {holder}, the maps put it on {expected:?}",
                step.name
            ));
        }
        let reads = step.reads(&digest);
        if !reads.contains(&holder.as_str()) {
            c.stranded += 1;
            if step.check.is_some() {
                failures.push(format!(
                    "[{}] {key}: record on {holder}, the step reads {reads:?}",
                    step.name
                ));
            }
            continue;
        }
        // Finished before the push that preceded this step's first one: no worker
        // of this step's root contexts (new with each push) has seen the key, so the
        // replay claims, wins on its own shard and reads the other.
        if holder != reads[0] && *finished + 1 < step_phase {
            c.sure_yields += 1;
        }
        // A moved key's record on the other map's shard, during the procedure: duplicates
        // at once through both proxies are all replayed (the first to claim on the
        // key's shard yields; the others find its claim and answer from the record).
        if step.check.is_some() && holder != reads[0] && c.bursts < BURSTS_PER_STEP {
            c.bursts += 1;
            let addrs = [m.proxies[0].addr(), m.proxies[1].addr()];
            for (p, r) in burst(&addrs, 4, &reshard_request(key)) {
                if r.status == 200 && is_replayed(&r) && r.body == truth.body {
                    c.burst_replays += 1;
                } else {
                    failures.push(format!(
                        "[{}] {key} (moved, record on {holder}): a concurrent duplicate on proxy {p}: {}",
                        step.name,
                        r.summary()
                    ));
                }
            }
        }
        let r = m.send(i % 2, &reshard_request(key));
        if r.status == 200 && is_replayed(&r) && r.body == truth.body {
            c.replayed += 1;
        } else {
            failures.push(format!(
                "[{}] {key} (record on {holder}) replayed on proxy {}: {}",
                step.name,
                i % 2,
                r.summary()
            ));
        }
    }
    c.yields = sum_counter(m, "reshard_yielded") - yields;
    c.checks = sum_counter(m, "reshard_checks") - checks;
    if c.yields < c.sure_yields as u64 || c.checks < c.sure_yields as u64 {
        failures.push(format!(
            "[{}] {} replays of records on the other map's shard, {} checks and {} yields counted",
            step.name, c.sure_yields, c.checks, c.yields
        ));
    }
    c
}

/// Two proxies (listeners by LDS) go from 2 shards to 3 and back, each step pushed to
/// proxy A and then to proxy B while two clients keep sending new keys to both at
/// once, so the mixed steps (0,1), (1,2), (2,3) happen under traffic. No key runs
/// twice; after each step every completed key whose record the step reads is replayed
/// with its body (after steps 1 and 2: every key); replays of records the new map
/// places elsewhere yield to them (counted).
#[test]
fn resharding_two_to_three_and_back_under_traffic_runs_no_key_twice() {
    let start = Step {
        name: "0: shards OLD",
        shards: OLD,
        check: None,
    };
    let cfg0 = start.config();
    let mut m = Multi::start_with("reshard", 3, Front::Lds, &[&cfg0, &cfg0]);
    let placement = Placement::new(&cfg0);
    let addrs = [m.proxies[0].addr(), m.proxies[1].addr()];
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::<KeyRun>::new()));
    let clients: Vec<_> = (0..2)
        .map(|t| {
            let (phase, stop, done) = (phase.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || reshard_client(t, addrs, phase, stop, done))
        })
        .collect();
    // Until `n` keys started in the current phase have finished.
    let wait_keys = |m: &Multi, n: usize| {
        let now = phase.load(Ordering::SeqCst);
        let end = Instant::now() + Duration::from_secs(60);
        while done
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.started == now)
            .count()
            < n
        {
            assert!(
                Instant::now() < end,
                "the clients stalled in phase {now}\n{}",
                m.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_keys(&m, 20);
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut bursts = 0;
    for (way, steps) in [
        ("2 -> 3", procedure(OLD, NEW)),
        ("3 -> 2", procedure(NEW, OLD)),
    ] {
        for step in &steps {
            let step_phase = phase.load(Ordering::SeqCst) + 1;
            let cfg = step.config();
            for p in 0..2 {
                m.proxies[p]
                    .apply_filter_config(&cfg, Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{way} step {}: proxy {p}: {e}", step.name));
                phase.fetch_add(1, Ordering::SeqCst);
                // Traffic with the proxies on two steps (A pushed, B not yet), then on one.
                wait_keys(&m, 10);
            }
            let c = checkpoint(&m, &placement, step, step_phase, &done, &mut failures);
            bursts += c.bursts;
            report.push(format!("{way} step {}: {c:?}", step.name));
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let runs = std::mem::take(&mut *done.lock().unwrap());
    let mut twice = Vec::new();
    for r in &runs {
        failures.extend(r.problems.iter().map(|p| format!("{}: {p}", r.key)));
        let n = m.upstream.executions_for_key(&r.key);
        if n != 1 {
            twice.push(format!("{}: executed {n} times", r.key));
        }
    }
    let by_phase = runs.iter().fold(BTreeMap::new(), |mut acc, r| {
        *acc.entry(r.started).or_insert(0) += 1;
        acc
    });
    let in_flight: usize = runs.iter().map(|r| r.in_flight).sum();
    // Pairs whose two claims both yielded (both 409, the follow-up ran), by the phase
    // they started in: odd phases are the mixed ones (A pushed, B not yet).
    let both_yielded =
        runs.iter()
            .filter(|r| r.in_flight == 2)
            .fold(BTreeMap::new(), |mut acc, r| {
                *acc.entry(r.started).or_insert(0) += 1;
                acc
            });
    let moved = runs
        .iter()
        .filter(|r| {
            let d = placement.digest(&r.key);
            shard_of(OLD, &d) != shard_of(NEW, &d)
        })
        .count();
    eprintln!(
        "resharding: {} keys ({moved} of them move between the maps), by phase {by_phase:?}; {in_flight} in-flight 409s; pairs where both claims yielded, by phase: {both_yielded:?}\n{}\n{}",
        runs.len(),
        report.join("\n"),
        m.counters()
    );
    assert!(
        twice.is_empty(),
        "{} keys did not execute exactly once: {:?}\n{}",
        twice.len(),
        &twice[..twice.len().min(20)],
        m.diagnostics()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n"),
        m.diagnostics()
    );
    assert_eq!(m.upstream.total_executions(), runs.len() as u64);
    assert!(
        bursts > 0,
        "no moved completed key got concurrent duplicates\n{}",
        report.join("\n")
    );
    for p in 0..2 {
        assert_eq!(m.counter(p, "store_errors"), 0, "{}", m.diagnostics());
        assert!(
            m.counter(p, "reshard_checks") > 0,
            "proxy {p} never checked the other map\n{}",
            m.counters()
        );
    }
    assert!(
        sum_counter(&m, "reshard_yielded") > 0,
        "no claim yielded\n{}",
        m.counters()
    );
}

// --- a whole shard down -------------------------------------------------------

/// Where the shard-down test is when a key's requests are sent.
const UP: usize = 0;
const KILLING: usize = 1;
const DOWN: usize = 2;
const RESTARTING: usize = 3;
const UP_AGAIN: usize = 4;

/// One key of the shard-down traffic: sent to `first` (0: proxy A, failure_mode
/// closed; 1: proxy B, open), then to the other proxy.
struct Pair {
    key: String,
    first: usize,
    /// The test's epoch when the first request was sent and when the second answered.
    epochs: (usize, usize),
    answers: [Result<Response, String>; 2],
}

/// All three members of one of two shards are killed while two clients send keys
/// (each to one proxy, then its duplicate to the other), then started again. Keys on
/// the other shard execute once and replay throughout, with no 5xx; the dead shard's
/// keys get what `failure_mode` says while it is down (closed: 503 store-unavailable
/// and nothing forwarded; open: forwarded, so the one proxy-visible execution), and
/// after the restart its keys work again, the records from before the kill included.
#[test]
fn a_shard_down_fails_only_its_keys_as_failure_mode_says_until_it_is_back() {
    let store = json!({"timeout_ms": 1000});
    let closed = etcd_filter_config(json!({"failure_mode": "closed", "store": store}));
    let open = etcd_filter_config(json!({"failure_mode": "open", "store": store}));
    let mut m = Multi::start("shard-down", [&closed, &open]);
    let placement = Placement::new(&closed);
    let names: Vec<&str> = vec!["etcd_a", "etcd_b"];
    const DEAD: usize = 1;
    let dead_name = names[DEAD];
    let on_dead = |key: &str| shard_of(&names, &placement.digest(key)) == dead_name;
    let addrs = [m.proxies[0].addr(), m.proxies[1].addr()];
    let epoch = Arc::new(AtomicUsize::new(UP));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::<Pair>::new()));
    let clients: Vec<_> = (0..2)
        .map(|t| {
            let (epoch, stop, done) = (epoch.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                for j in 0..150 {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let key = format!("down-{t}-{j}");
                    let req = keyed(HOST, "/orders/shard-down", &key, &json!({"k": key}));
                    let first = (t + j) % 2;
                    let at = epoch.load(Ordering::SeqCst);
                    let a = client::send(addrs[first], &req).map_err(|e| e.to_string());
                    let b = client::send(addrs[1 - first], &req).map_err(|e| e.to_string());
                    done.lock().unwrap().push(Pair {
                        key,
                        first,
                        epochs: (at, epoch.load(Ordering::SeqCst)),
                        answers: [a, b],
                    });
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    // Until `enough` holds of the pairs sent and answered within `at`.
    let wait_pairs = |m: &Multi, at: usize, enough: &dyn Fn(&[&Pair]) -> bool| {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            {
                let all = done.lock().unwrap();
                let within: Vec<&Pair> = all.iter().filter(|p| p.epochs == (at, at)).collect();
                if enough(&within) {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "the clients stalled in epoch {at}\n{}",
                m.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let count = |ps: &[&Pair], dead: bool, first: Option<usize>| {
        ps.iter()
            .filter(|p| on_dead(&p.key) == dead && first.is_none_or(|f| p.first == f))
            .count()
    };
    wait_pairs(&m, UP, &|ps| {
        count(ps, true, None) >= 4 && count(ps, false, None) >= 4
    });
    epoch.store(KILLING, Ordering::SeqCst);
    m.shards[DEAD].etcd.kill_all();
    epoch.store(DOWN, Ordering::SeqCst);
    wait_pairs(&m, DOWN, &|ps| {
        count(ps, false, None) >= 4
            && count(ps, true, Some(0)) >= 2
            && count(ps, true, Some(1)) >= 2
    });
    epoch.store(RESTARTING, Ordering::SeqCst);
    for i in 0..3 {
        m.shards[DEAD].etcd.restart(i).unwrap();
    }
    m.wait_etcd_healthy();
    m.wait_hosts_healthy(3);
    epoch.store(UP_AGAIN, Ordering::SeqCst);
    wait_pairs(&m, UP_AGAIN, &|ps| {
        count(ps, true, None) >= 4 && count(ps, false, None) >= 4
    });
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let pairs = std::mem::take(&mut *done.lock().unwrap());

    let mut failures = Vec::new();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let fresh =
        |a: &Result<Response, String>| a.as_ref().is_ok_and(|r| r.status == 200 && !is_replayed(r));
    let store_unavailable = |a: &Result<Response, String>| {
        a.as_ref().is_ok_and(|r| {
            r.status == 503 && problem_slug(r).as_deref() == Some("store-unavailable")
        })
    };
    let summary = |a: &Result<Response, String>| match a {
        Ok(r) => r.summary(),
        Err(e) => e.clone(),
    };
    for p in &pairs {
        let dead = on_dead(&p.key);
        let n = m.upstream.executions_for_key(&p.key);
        let [a, b] = &p.answers;
        let what = format!(
            "{} (on {}, first to proxy {}, epochs {:?}): {} / {}; executed {n}",
            p.key,
            if dead { dead_name } else { names[1 - DEAD] },
            p.first,
            p.epochs,
            summary(a),
            summary(b)
        );
        let normal = fresh(a)
            && b.as_ref().is_ok_and(|r| {
                r.status == 200 && is_replayed(r) && a.as_ref().is_ok_and(|f| f.body == r.body)
            })
            && n == 1;
        let kind = match (dead, p.epochs) {
            (false, _) | (true, (UP, UP)) | (true, (UP_AGAIN, UP_AGAIN)) => {
                if !normal {
                    failures.push(format!("not executed once and replayed: {what}"));
                }
                "normal"
            }
            (true, (DOWN, DOWN)) => {
                // The closed proxy (A) refuses, the open one (B) forwards.
                let (on_closed, on_open) = if p.first == 0 { (a, b) } else { (b, a) };
                if !(store_unavailable(on_closed) && fresh(on_open) && n == 1) {
                    failures.push(format!(
                        "shard down: want 503 store-unavailable from A (closed) and a forwarded execution from B (open): {what}"
                    ));
                }
                "failure mode"
            }
            (true, _) => {
                // Sent while the shard went down or came back: either answer, and at
                // most once per proxy (open forwards what it could not claim).
                let ok = |x: &Result<Response, String>| {
                    x.as_ref().is_ok_and(|r| r.status == 200 || r.status == 409)
                        || store_unavailable(x)
                };
                if !(ok(a) && ok(b) && n <= 2) {
                    failures.push(format!("around the kill or the restart: {what}"));
                }
                "around a change"
            }
        };
        *tally
            .entry(format!("{kind}, on {}", if dead { "dead" } else { "live" }))
            .or_insert(0) += 1;
    }
    // After the restart: keys completed before the kill replay from both shards
    // (the dead shard's records survived), on both proxies.
    let before: Vec<&Pair> = pairs.iter().filter(|p| p.epochs == (UP, UP)).collect();
    for p in &before {
        let req = keyed(HOST, "/orders/shard-down", &p.key, &json!({"k": p.key}));
        let first = p.answers[0].as_ref().unwrap();
        for proxy in 0..2 {
            let r = m.send(proxy, &req);
            if !(r.status == 200 && is_replayed(&r) && r.body == first.body) {
                failures.push(format!(
                    "{} (completed before the kill) after the restart, proxy {proxy}: {}",
                    p.key,
                    r.summary()
                ));
            }
        }
    }
    // The records of the keys that ran normally are on the shard predicted for them.
    let holders = record_holders(&m);
    for p in &pairs {
        let normal_epoch = matches!(p.epochs, (UP, UP) | (UP_AGAIN, UP_AGAIN));
        if on_dead(&p.key) && !normal_epoch {
            continue;
        }
        let digest = placement.digest(&p.key);
        let on = holders.get(&placement.record_key(&digest));
        let want = shard_of(&names, &digest);
        if on.map(Vec::as_slice) != Some(&[want.to_string()][..]) {
            failures.push(format!("{}: record on {on:?}, predicted {want}", p.key));
        }
    }
    let down_dead = pairs
        .iter()
        .filter(|p| p.epochs == (DOWN, DOWN) && on_dead(&p.key))
        .count() as u64;
    eprintln!(
        "shard {dead_name} down: {} pairs, {tally:?}; {} keys completed before the kill replayed after the restart\n{}",
        pairs.len(),
        before.len(),
        m.counters()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n"),
        m.diagnostics()
    );
    assert!(
        m.counter(0, "store_errors") >= down_dead,
        "{}",
        m.counters()
    );
    assert!(m.counter(1, "failed_open") >= down_dead, "{}", m.counters());
    assert_eq!(m.counter(0, "failed_open"), 0, "{}", m.counters());
}

// --- the operator API per shard -------------------------------------------------

/// The operator API of a sharded deployment (`admin-api.yaml` with a cluster per
/// shard): `/stats` counts each shard's records, `/records` names the record's shard,
/// and a removal takes the record off its shard.
#[test]
fn operator_api_counts_finds_and_removes_records_per_shard() {
    let data = etcd_filter_config(json!({}));
    let admin = etcd_filter_config(json!({"role": "admin"}));
    let m = Multi::start_with("shard-admin", 2, Front::AdminApi(admin), &[&data]);
    let port = m.proxies[0].config.port("ADMIN_API_PORT").unwrap();
    let api_addr = SocketAddr::from(([127, 0, 0, 1], port));
    let api = |method: &str, path: &str| -> (u16, Value) {
        let r = client::send(api_addr, &dedup_envoy::Request::new(method, path)).unwrap();
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    };
    let placement = Placement::new(&data);
    let names = ["etcd_a", "etcd_b"];
    const N: usize = 12;
    let path = "/orders/shard-admin";
    let order = |key: &str| keyed(HOST, path, key, &json!({"k": key}));
    let mut expected: BTreeMap<&str, u64> = names.iter().map(|n| (*n, 0)).collect();
    let mut firsts = Vec::new();
    for i in 0..N {
        let key = format!("admin-{i}");
        let r = m.send(0, &order(&key));
        assert_executed(&r);
        *expected
            .get_mut(shard_of(&names, &placement.digest(&key)))
            .unwrap() += 1;
        firsts.push((key, r));
    }
    // The 12 fixed keys are on both shards.
    assert!(expected.values().all(|n| *n > 0), "{expected:?}");
    let stats = |expected: &BTreeMap<&str, u64>| {
        json!({
            "store": "etcd",
            "records": expected.values().sum::<u64>(),
            "shards": names.iter().map(|n| json!({"name": n, "records": expected[n]})).collect::<Vec<_>>(),
        })
    };
    let (status, v) = api("GET", "/stats");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, stats(&expected));
    for s in &m.shards {
        assert_eq!(
            s.etcd.count_keys(PREFIX).unwrap(),
            expected[s.cluster.as_str()],
            "{}",
            s.cluster
        );
    }
    for (key, first) in &firsts {
        let (status, v) = api("GET", &format!("/records?key={key}&authority={HOST}"));
        assert_eq!(status, 200, "{key}: {v}");
        assert_eq!(v["state"], "completed", "{key}: {v}");
        assert_eq!(v["status"], first.status, "{key}: {v}");
        assert_eq!(
            v["shard"],
            shard_of(&names, &placement.digest(key)),
            "{key}: {v}"
        );
    }
    // A removal on the second shard: gone from there, counted there, and the key runs
    // again.
    let (key, first) = firsts
        .iter()
        .find(|(k, _)| shard_of(&names, &placement.digest(k)) == "etcd_b")
        .unwrap();
    let records = format!("/records?key={key}&authority={HOST}");
    let (status, v) = api("DELETE", &records);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["removed"]["shard"], "etcd_b", "{v}");
    assert_eq!(api("GET", &records).0, 404);
    *expected.get_mut("etcd_b").unwrap() -= 1;
    assert_eq!(api("GET", "/stats").1, stats(&expected));
    assert_eq!(
        m.shards[1].etcd.count_keys(PREFIX).unwrap(),
        expected["etcd_b"]
    );
    // A worker that completed or replayed the key keeps a copy for at most
    // `dedup_core::stores::etcd::local::MAX_AGE_MS` (5 s) and answers it until then: replays of
    // the first response, then one execution (bounded generously, not timed).
    let end = Instant::now() + Duration::from_secs(20);
    let again = loop {
        let r = m.send(0, &order(key));
        if !is_replayed(&r) {
            break r;
        }
        assert_replay_of(&r, first);
        assert!(
            Instant::now() < end,
            "{key} still replayed 20 s after its removal"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_executed(&again);
    assert_ne!(again.body, first.body, "a second execution");
    assert_eq!(m.upstream.executions_for_key(key), 2);
    *expected.get_mut("etcd_b").unwrap() += 1;
    assert_eq!(api("GET", "/stats").1, stats(&expected));
    // The others still replay.
    for (k, first) in firsts.iter().filter(|(k, _)| k != key) {
        assert_replay_of(&m.send(0, &order(k)), first);
    }
    assert_eq!(m.upstream.total_executions(), N as u64 + 1);
}
