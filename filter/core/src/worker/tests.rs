//! The worker through the fake host: configuration (metrics, the bucket secret, the
//! layout registration), tokens, wait mode's tick, queue and board across workers, and
//! orphans finishing their store calls.

use super::{splitmix64, Level, Worker};
use crate::fake::{FakeEtcd, FakeHost, FakeVm};
use crate::metrics::Counter;
use crate::stream::{CallAnswer, Decision, DedupStream, Env, Origin, StoreCall};
use crate::testing::req;
use crate::wait::listeners;
use std::sync::Arc;

const WAIT: &str = r#"{"on_in_flight": "wait", "wait_timeout_ms": 5000}"#;
const ETCD: &str = r#"{"store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500}}"#;

fn worker(host: &FakeHost, config: &str) -> Worker {
    Worker::configure(host, config.as_bytes()).expect("configured")
}

fn head(key: &str) -> crate::key::RequestHead {
    req("POST", "/orders").key(key).head
}

/// A new stream `id` on worker `w` sends `POST /orders` with key `key` and no body:
/// the stream and what its request headers decided.
fn send(w: &mut Worker, host: &FakeHost, id: u32, key: &str) -> (DedupStream, Decision) {
    let mut s = DedupStream::new(id);
    let d = w.run(host, |p, env| s.on_request_headers(p, env, head(key), true));
    (s, d)
}

#[test]
fn configure_defines_every_counter_and_times_store_calls_only_for_etcd() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let w = worker(&host, "{}");
    let names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(*host.metrics.borrow(), names);
    assert_eq!(w.store_call_ms(), None);
    assert!(host.logged(Level::Info, "configured; store: shared data, "));
    // The module's version leads the line (CHANGELOG, `dedupctl --version`).
    let version = format!("proxy-dedup {}: configured", env!("CARGO_PKG_VERSION"));
    assert!(host.logged(Level::Info, &version), "{version}");

    let host = FakeHost::new(FakeVm::new(), 1);
    let w = worker(&host, ETCD);
    assert_eq!(
        host.metrics.borrow().last().map(String::as_str),
        Some("proxy_dedup_store_call_ms")
    );
    assert_eq!(w.store_call_ms(), Some(names.len() as u32));
    assert!(host.logged(
        Level::Info,
        "store: etcd via cluster `etcd` (gRPC), prefix `"
    ));
    // etcd needs no secret and registers nothing in shared data.
    assert_eq!(host.vm.shared.key_count(), 0);
}

#[test]
fn the_configuration_log_names_every_shard_and_the_map_being_checked() {
    // One shard named after its cluster is the plain `cluster` form; a shard with a
    // name of its own is named, however many there are.
    for (shards, check, line) in [
        (
            r#"[{"name": "a", "cluster": "etcd-a"}]"#,
            "",
            "store: etcd via 1 shards: `a` (cluster `etcd-a`) (gRPC), prefix `",
        ),
        (
            r#"[{"cluster": "etcd-a"}, {"name": "b", "cluster": "etcd-b"}]"#,
            r#", "next_shards": [{"cluster": "etcd-a"}]"#,
            "store: etcd via 2 shards: `etcd-a` (cluster `etcd-a`), `b` (cluster `etcd-b`) (gRPC), \
             prefix `proxy-dedup/`; resharding: also checking cluster `etcd-a` (store.next_shards)",
        ),
        (
            r#"[{"cluster": "etcd-a"}, {"name": "b", "cluster": "etcd-b"}]"#,
            r#", "previous_shards": [{"cluster": "etcd-a"}]"#,
            // TTL 24 h, in flight 30 s, budget 500 ms: 86,400 + 30 + 3.75 (in-flight
            // window) + 0.5 + 1 + 60 (completed window) s, rounded up.
            "resharding: also checking cluster `etcd-a` (store.previous_shards); drop \
             store.previous_shards no sooner than 86496 s (1 d 0 h 1 min 36 s) after every proxy",
        ),
    ] {
        let host = FakeHost::new(FakeVm::new(), 1);
        let config =
            format!(r#"{{"store": {{"kind": "etcd", "shards": {shards}{check}, "timeout_ms": 500}}}}"#);
        worker(&host, &config);
        assert!(host.logged(Level::Info, line), "{line}");
    }
}

/// Regions: the log names this proxy's region and the home rule, a re-homing names the
/// field to drop, and each other region gets its remote counters.
#[test]
fn the_configuration_log_names_the_regions_and_a_re_homing() {
    let shards = r#"[{"name": "a", "cluster": "etcd-a", "region": "eu"},
        {"name": "c", "cluster": "etcd-c", "region": "us"}]"#;
    let home = r#"{"header": "x-tenant", "map": {"acme": "us"}, "default": "eu"}"#;
    let moved = r#"{"header": "x-tenant", "map": {"acme": "eu"}, "default": "eu"}"#;
    for (extra, line) in [
        (
            String::new(),
            "; regions: this proxy in `eu`, records homed by header `x-tenant` through a map of 1 (else `eu`)",
        ),
        (
            format!(r#", "previous_home": {moved}"#),
            "; re-homing: also checking 2 shards: `a` (cluster `etcd-a`), `c` (cluster `etcd-c`) \
             (store.previous_home); drop store.previous_home no sooner than",
        ),
        (
            format!(
                r#", "previous_home": {moved}, "previous_shards": [{{"name": "a", "cluster": "etcd-a", "region": "eu"}}]"#
            ),
            "; re-homing: also checking 1 shards: `a` (cluster `etcd-a`) \
             (store.previous_shards, store.previous_home); drop store.previous_shards and \
             store.previous_home no sooner than",
        ),
        (
            r#", "next_shards": [{"name": "a", "cluster": "etcd-a", "region": "eu"}, {"name": "c", "cluster": "etcd-c", "region": "us"}, {"name": "b", "cluster": "etcd-b", "region": "us"}]"#.to_string(),
            "; resharding: also checking 3 shards: `a` (cluster `etcd-a`), `c` (cluster `etcd-c`), \
             `b` (cluster `etcd-b`) (store.next_shards)",
        ),
    ] {
        let host = FakeHost::new(FakeVm::new(), 1);
        let config = format!(
            r#"{{"scope": {{"headers": ["x-tenant"]}}, "store": {{"kind": "etcd", "region": "eu",
                "shards": {shards}, "home": {home}{extra}, "timeout_ms": 500}}}}"#
        );
        worker(&host, &config);
        assert!(host.logged(Level::Info, line), "{line}");
        let names: Vec<String> = host.metrics.borrow().clone();
        for want in [
            "proxy_dedup_remote_claims.us",
            "proxy_dedup_remote_completions.us",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.ends_with(".eu")), "{names:?}");
    }
}

#[test]
fn configure_refuses_a_bad_config_and_a_missing_secret() {
    let host = FakeHost::new(FakeVm::new(), 1);
    assert!(Worker::configure(&host, br#"{"capacity": "many"}"#).is_none());
    assert!(host.logged(Level::Error, "capacity"));

    let mut host = FakeHost::new(FakeVm::new(), 1);
    host.random = Err(52);
    assert!(Worker::configure(&host, b"{}").is_none());
    assert!(host.logged(
        Level::Error,
        "no random bytes for the bucket secret (errno 52)"
    ));
    assert_eq!(host.vm.shared.key_count(), 0);

    let host = FakeHost::new(FakeVm::new(), 1);
    host.vm.shared.set_failing(true);
    assert!(Worker::configure(&host, b"{}").is_none());
    assert!(host.logged(Level::Error, "cannot set up the bucket secret"));
}

/// Every worker of a process keys its buckets with the first worker's secret, so a key
/// claimed on one is seen on the other; the admin role registers no layout.
#[test]
fn workers_of_one_process_share_the_bucket_secret_and_the_data_plane_registers_its_layout() {
    let vm = FakeVm::new();
    let (ha, mut hb) = (FakeHost::new(vm.clone(), 1), FakeHost::new(vm.clone(), 2));
    hb.random = Ok([0xee; 32]);
    let (mut wa, mut wb) = (worker(&ha, "{}"), worker(&hb, "{}"));
    assert_eq!(
        vm.shared.raw("proxy-dedup/secret").map(|(v, _)| v),
        Some(vec![1; 32])
    );
    assert!(vm.shared.raw("proxy-dedup/layouts").is_some());
    let (_first, d) = send(&mut wa, &ha, 1, "k");
    assert_eq!(d, Decision::Continue);
    let (_dup, d) = send(&mut wb, &hb, 2, "k");
    assert!(
        matches!(d, Decision::Reply(r) if r.status == 409),
        "in flight on the other worker"
    );
    assert_eq!(hb.count(Counter::RejectedInFlight), 1);

    let vm = FakeVm::new();
    let host = FakeHost::new(vm.clone(), 1);
    worker(&host, r#"{"role": "admin"}"#);
    assert!(vm.shared.raw("proxy-dedup/secret").is_some());
    assert!(vm.shared.raw("proxy-dedup/layouts").is_none());
}

#[test]
fn claim_tokens_mix_the_seed_with_a_counter() {
    let host = FakeHost::new(FakeVm::new(), 7);
    let mut w = worker(&host, "{}");
    let tokens = w.with_env(&host, |_, env| [env.new_token(), env.new_token()]);
    assert_eq!(tokens, [splitmix64(7 ^ 1), splitmix64(7 ^ 2)]);
    assert_ne!(tokens[0], tokens[1]);
}

/// A duplicate waiting on worker B: B ticks, registers its queue and puts it on the
/// board; the first request completing on worker A enqueues the record to B, whose
/// queue wakes the waiter; once nobody waits, B's tick stops.
#[test]
fn a_waiter_is_woken_through_its_workers_queue_and_the_tick_stops_after() {
    let vm = FakeVm::new();
    let (ha, hb) = (FakeHost::new(vm.clone(), 1), FakeHost::new(vm.clone(), 2));
    let (mut wa, mut wb) = (worker(&ha, WAIT), worker(&hb, WAIT));
    let (mut first, d) = send(&mut wa, &ha, 1, "k");
    assert_eq!(d, Decision::Continue);
    assert!(ha.ticks.borrow().is_empty(), "no waiter on A: no tick");

    let (mut dup, d) = send(&mut wb, &hb, 2, "k");
    assert_eq!(d, Decision::Pause);
    assert_eq!(*hb.ticks.borrow(), [100]);
    let queue = {
        let q = vm.queues.lock().unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].0, format!("proxy-dedup/wake/{:016x}", 2));
        1
    };
    let now = hb.now_ms.get();
    assert_eq!(listeners(&*vm.shared, "proxy-dedup", now).unwrap(), [queue]);
    // Nothing changed yet: the queue wakes nobody.
    assert!(wb.on_queue_ready(&hb, queue).is_empty());

    let call = wa.run(&ha, |p, env| {
        first.on_response_headers(p, env, 200, &Origin::upstream(), Vec::new, true)
    });
    assert_eq!(call, None);
    assert_eq!(wb.on_queue_ready(&hb, queue), [2]);
    let d = wb.run(&hb, |p, env| dup.on_wake(p, env));
    assert!(
        matches!(d, Decision::Reply(r) if r.status == 200),
        "replayed"
    );
    assert_eq!(hb.count(Counter::WaitReplayed), 1);
    assert!(wb.on_tick(&hb).is_empty());
    assert_eq!(*hb.ticks.borrow(), [100, 0]);
    // The tick is off: a later tick asks nothing of the host.
    assert!(wb.on_tick(&hb).is_empty());
    assert_eq!(*hb.ticks.borrow(), [100, 0]);
}

/// A waiter whose stream is gone is forgotten; anything in the queue that is not a
/// digest wakes nobody.
#[test]
fn the_tick_hands_out_due_waiters_and_forgets_the_gone() {
    let vm = FakeVm::new();
    let (ha, hb) = (FakeHost::new(vm.clone(), 1), FakeHost::new(vm.clone(), 2));
    let (mut wa, mut wb) = (worker(&ha, WAIT), worker(&hb, WAIT));
    let (_first, _) = send(&mut wa, &ha, 1, "k");
    let (_dup, _) = send(&mut wb, &hb, 9, "k");
    assert_eq!(wb.on_queue_item(b"not a digest"), 0);
    // The first check comes at the next tick.
    assert_eq!(wb.on_tick(&hb), [9]);
    wb.forget_waiter(9);
    assert!(wb.on_tick(&hb).is_empty());
    assert_eq!(*hb.ticks.borrow(), [100, 0]);
}

/// Answers a call as etcd would.
fn etcd_answer(etcd: &FakeEtcd, host: &FakeHost, c: &StoreCall) -> CallAnswer {
    let (status, body) = etcd.handle(c.path, &c.body, host.now_ms.get());
    CallAnswer {
        status,
        body,
        ..Default::default()
    }
}

/// A stream on worker `w` whose key `k` is claimed in etcd (its calls answered).
fn claimed_on_etcd(w: &mut Worker, host: &FakeHost, etcd: &FakeEtcd) -> DedupStream {
    let (mut s, mut d) = send(w, host, 1, "k");
    while let Decision::Call(c) = d {
        let a = etcd_answer(etcd, host, &c);
        d = w.run(host, |p, env| s.on_store_answer(p, env, a));
    }
    assert_eq!(d, Decision::Continue, "claimed");
    s
}

/// A stream that ended with its completion out is adopted; its call's answer drives it
/// on from the worker, a retry dispatched from there, until etcd confirms it.
#[test]
fn an_orphan_finishes_its_store_call_with_retries() {
    let etcd: Arc<FakeEtcd> = FakeEtcd::new();
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, ETCD);
    let mut s = claimed_on_etcd(&mut w, &host, &etcd);
    let completion = w
        .run(&host, |p, env| {
            s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
        })
        .expect("a completion call");
    w.adopt_orphan(40, s);
    assert_eq!(w.orphans(), 1);
    // Reset: retried from the worker, the orphan kept under the retry's token.
    w.on_orphan_answer(&host, 40, CallAnswer::default());
    assert_eq!(w.orphans(), 1);
    let (token, retry) = host.calls.borrow().last().cloned().expect("a retry");
    assert_eq!(retry.body, completion.body);
    // An answer for a token nobody holds is dropped.
    w.on_orphan_answer(&host, 40, CallAnswer::default());
    assert_eq!(w.orphans(), 1);
    let a = etcd_answer(&etcd, &host, &retry);
    w.on_orphan_answer(&host, token, a);
    assert_eq!(w.orphans(), 0);
    assert_eq!(host.count(Counter::StoreErrors), 0);
    assert_eq!(host.calls.borrow().len(), 1);
}

/// Retries that cannot be dispatched are answered at once as failures, until the
/// budget is spent: the orphan is then forgotten, the failure counted.
#[test]
fn an_orphan_whose_retries_cannot_be_sent_gives_up() {
    let etcd: Arc<FakeEtcd> = FakeEtcd::new();
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, ETCD);
    let mut s = claimed_on_etcd(&mut w, &host, &etcd);
    w.run(&host, |p, env| {
        s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
    });
    w.adopt_orphan(40, s);
    host.refuse_calls.set(true);
    w.on_orphan_answer(&host, 40, CallAnswer::default());
    assert_eq!(w.orphans(), 0);
    assert!(host.calls.borrow().is_empty());
    assert_eq!(host.count(Counter::StoreErrors), 1);
    assert!(host.logged(Level::Warn, "completion failed (status 0)"));
}

/// A stream's clock is the host's: a record past its TTL on the host's clock runs again.
#[test]
fn streams_see_the_hosts_clock() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, r#"{"ttl_seconds": 1}"#);
    let run_once = |w: &mut Worker| {
        let (mut s, d) = send(w, &host, 1, "k");
        if d == Decision::Continue {
            w.run(&host, |p, env| {
                s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
            });
        }
        d
    };
    assert_eq!(run_once(&mut w), Decision::Continue);
    assert!(
        matches!(run_once(&mut w), Decision::Reply(r) if r.status == 201),
        "replayed"
    );
    host.now_ms.set(host.now_ms.get() + 1_001);
    assert_eq!(run_once(&mut w), Decision::Continue, "expired: runs again");
}

/// A stream's debug lines reach the host only when it logs at debug level.
#[test]
fn debug_lines_are_logged_only_at_debug_level() {
    let mut host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, "{}");
    let (_s, _) = send(&mut w, &host, 1, "k");
    assert!(!host.logged(Level::Debug, "claimed; forwarding"));
    host.debug = true;
    let (_s, _) = send(&mut w, &host, 2, "k2");
    assert!(host.logged(Level::Debug, "stream 2: record "));
    assert!(host.logged(Level::Debug, "claimed; forwarding"));
}

/// SplitMix64's published first outputs (seed 0): the token mix is the real one.
#[test]
fn splitmix64_is_splitmix64() {
    assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    assert_eq!(splitmix64(7 ^ 1), 0xbd64_a5d9_adef_e000);
}

/// The worker's tier outlives a stream: once etcd confirms a completion, a duplicate
/// on the same worker is replayed without a store call.
#[test]
fn a_confirmed_completion_answers_this_workers_duplicates_from_its_tier() {
    let etcd: Arc<FakeEtcd> = FakeEtcd::new();
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, ETCD);
    let mut s = claimed_on_etcd(&mut w, &host, &etcd);
    let mut call = w.run(&host, |p, env| {
        s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
    });
    while let Some(c) = call {
        let a = etcd_answer(&etcd, &host, &c);
        call = match w.run(&host, |p, env| s.on_store_answer(p, env, a)) {
            Decision::Call(c) => Some(c),
            _ => None,
        };
    }
    let (_dup, d) = send(&mut w, &host, 2, "k");
    assert!(matches!(&d, Decision::Reply(r) if r.status == 201), "{d:?}");
}

/// The worker's leases outlive a stream: a second claim on the worker writes at once,
/// on the leases the first one was granted.
#[test]
fn a_workers_leases_serve_its_next_claims() {
    let etcd: Arc<FakeEtcd> = FakeEtcd::new();
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, ETCD);
    let mut paths = Vec::new();
    for key in ["k1", "k2"] {
        let mut s = DedupStream::new(1);
        let mut d = w.run(&host, |p, env| {
            s.on_request_headers(p, env, head(key), true)
        });
        let mut these = Vec::new();
        while let Decision::Call(c) = d {
            assert!(these.len() < 8, "a claim that never ends: {these:?}");
            these.push(c.path);
            let a = etcd_answer(&etcd, &host, &c);
            d = w.run(&host, |p, env| s.on_store_answer(p, env, a));
        }
        assert_eq!(d, Decision::Continue);
        paths.push(these);
    }
    assert!(
        paths[0].len() > 1,
        "the first claim takes leases: {:?}",
        paths[0]
    );
    assert_eq!(paths[1], ["/etcdserverpb.KV/Txn"]);
}

/// Without a wake-up, a waiter is re-checked at its store's interval (shared data:
/// every 500 ms), not at every tick.
#[test]
fn the_tick_rechecks_a_waiter_at_its_stores_interval() {
    let vm = FakeVm::new();
    let (ha, hb) = (FakeHost::new(vm.clone(), 1), FakeHost::new(vm.clone(), 2));
    let (mut wa, mut wb) = (worker(&ha, WAIT), worker(&hb, WAIT));
    let (_first, _) = send(&mut wa, &ha, 1, "k");
    let (_dup, _) = send(&mut wb, &hb, 9, "k");
    let t0 = hb.now_ms.get();
    assert_eq!(wb.on_tick(&hb), [9]);
    hb.now_ms.set(t0 + 100);
    assert!(wb.on_tick(&hb).is_empty(), "checked 100 ms ago");
    hb.now_ms.set(t0 + 500);
    assert_eq!(wb.on_tick(&hb), [9]);
}
