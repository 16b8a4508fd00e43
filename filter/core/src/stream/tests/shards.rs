//! The sharded etcd store through the plugin: records placed over several etcd clusters
//! (one fake etcd per Envoy cluster), each shard behaving as the one etcd did, one shard
//! down failing only its keys, and resharding: a claim won under one map yields to a
//! live record on the key's shard under the other, on every interleaving of two proxies
//! pushed to two steps of the procedure.

use crate::fake::{FakeEnv, FakeEtcd, FakeShared};
use crate::metrics::Counter;
use crate::stream::{CallAnswer, Decision, DedupStream, Plugin, StoreCall};
use crate::testing::*;
use std::sync::Arc;

/// Three etcd clusters, `etcd_a`, `etcd_b`, `etcd_c`, each granting its own lease ids.
pub(super) struct Fleet {
    pub(super) a: Arc<FakeEtcd>,
    pub(super) b: Arc<FakeEtcd>,
    pub(super) c: Arc<FakeEtcd>,
}

impl Fleet {
    pub(super) fn new() -> Self {
        Fleet {
            a: FakeEtcd::with_lease_ids_from(100_000),
            b: FakeEtcd::with_lease_ids_from(200_000),
            c: FakeEtcd::with_lease_ids_from(300_000),
        }
    }

    /// A proxy (its one worker) reaching the fleet.
    pub(super) fn proxy(&self, worker: u64) -> FakeEnv {
        let mut env = FakeEnv::new(FakeShared::new(), worker);
        for (name, e) in [
            ("etcd_a", &self.a),
            ("etcd_b", &self.b),
            ("etcd_c", &self.c),
        ] {
            env.etcd_clusters.insert(name.to_string(), Arc::clone(e));
        }
        // Nothing may reach a cluster not in the fleet.
        env.etcd.set_down(true);
        env
    }

    pub(super) fn keys(&self, env: &FakeEnv) -> [usize; 3] {
        [&self.a, &self.b, &self.c].map(|e| e.key_count(env.now_ms))
    }
}

/// A shard map as JSON, `"a,b"`: shards `a` (cluster `etcd_a`) and `b`.
fn map(names: &str) -> String {
    let list: Vec<String> = names
        .split(',')
        .map(|n| format!(r#"{{"name": "{n}", "cluster": "etcd_{n}"}}"#))
        .collect();
    format!("[{}]", list.join(", "))
}

/// The etcd store on `shards`, with the other map of a resharding when given
/// (`"previous_shards"` or `"next_shards"`, and its names).
fn sharded(shards: &str, check: Option<(&str, &str)>, extra: &str) -> Plugin {
    let check = match check {
        Some((field, names)) => format!(r#", "{field}": {}"#, map(names)),
        None => String::new(),
    };
    let sep = if extra.is_empty() { "" } else { ", " };
    plugin(&format!(
        r#"{{"store": {{"kind": "etcd", "timeout_ms": 500, "shards": {}{check}}}{sep}{extra}}}"#,
        map(shards)
    ))
}

/// The shard a bodiless keyed POST's record is claimed on (its first store call's).
fn home(p: &Plugin, key: &str) -> String {
    home_of(p, keyed(key))
}

/// The shard a bodiless request's record is claimed on.
fn home_of(p: &Plugin, r: Req) -> String {
    let mut env = Fleet::new().proxy(9);
    match DedupStream::new(1).on_request_headers(p, &mut env, r.head, true) {
        Decision::Call(c) => c.route.shard.clone(),
        d => panic!("{d:?}"),
    }
}

fn keyed(key: &str) -> Req {
    req("POST", "/orders").key(key)
}

/// The first `n` keys (`k0`, `k1`, …) whose records `p` places on `shard`.
fn keys_on(p: &Plugin, shard: &str, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..200)
        .map(|i| format!("k{i}"))
        .filter(|k| home(p, k) == shard)
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "fewer than {n} of 200 keys on shard {shard}");
    keys
}

#[test]
fn records_spread_over_the_shards_and_each_shard_is_a_whole_etcd() {
    let p = sharded("a,b,c", None, "");
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    for i in 0..60 {
        let r = keyed(&format!("k{i}"));
        assert_eq!(run(&p, &mut x, &r, ok("made")), executed("made"));
        run(&p, &mut y, &r, ok("no")).assert_replays(b"made");
    }
    let keys = fleet.keys(&x);
    assert_eq!(keys.iter().sum::<usize>(), 60, "{keys:?}");
    assert!(keys.iter().all(|n| *n >= 10), "{keys:?}");
    assert_eq!(x.count_of(Counter::Executed), 60);
    assert_eq!(y.count_of(Counter::Executed), 0);
    // Leases are each cluster's own: every proxy took one per purpose on each shard, and
    // none was ever used on another shard (the fakes' ids differ: it would be "not
    // found" and granted again).
    for e in [&fleet.a, &fleet.b, &fleet.c] {
        assert_eq!(e.grants(), 4);
    }
    assert_eq!(x.count_of(Counter::ReshardChecks), 0);
}

#[test]
fn one_shard_down_fails_only_its_keys_as_failure_mode_says() {
    for (mode, down_status) in [("open", 200), ("closed", 503)] {
        let p = sharded("a,b", None, &format!(r#""failure_mode": "{mode}""#));
        let fleet = Fleet::new();
        let mut x = fleet.proxy(1);
        fleet.a.set_down(true);
        let on_b = keys_on(&p, "b", 3);
        let on_a = keys_on(&p, "a", 3);
        for k in &on_b {
            assert_eq!(run(&p, &mut x, &keyed(k), ok("made")), executed("made"));
            run(&p, &mut x, &keyed(k), ok("no")).assert_replays(b"made");
        }
        for k in &on_a {
            assert_eq!(
                run(&p, &mut x, &keyed(k), ok("made")).status(),
                down_status,
                "{mode}"
            );
        }
        assert_eq!(x.count_of(Counter::StoreErrors), 3, "{mode}");
        assert_eq!(
            x.count_of(Counter::Executed),
            3,
            "{mode}: only b's keys were claimed"
        );
    }
}

#[test]
fn a_key_completed_before_a_shard_was_added_is_replayed_after_and_never_runs_again() {
    let old = sharded("a", None, "");
    let new = sharded("a,b", Some(("previous_shards", "a")), "");
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    let moved = keys_on(&new, "b", 2);
    let stayed = keys_on(&new, "a", 1);
    for k in moved.iter().chain(&stayed) {
        assert_eq!(run(&old, &mut x, &keyed(k), ok(k)), executed(k));
    }
    assert_eq!(fleet.keys(&x), [3, 0, 0]);
    for k in moved.iter().chain(&stayed) {
        run(&new, &mut y, &keyed(k), ok("again")).assert_replays(k.as_bytes());
    }
    assert_eq!(y.count_of(Counter::Executed), 0);
    // Only the moved keys were checked, and each yielded to its record; the claims made
    // on their new shard were released.
    assert_eq!(y.count_of(Counter::ReshardChecks), 2);
    assert_eq!(y.count_of(Counter::ReshardYielded), 2);
    assert_eq!(fleet.keys(&y), [3, 0, 0]);
    // New keys on b run once, and are replayed from b.
    let fresh = &keys_on(&new, "b", 3)[2];
    assert_eq!(
        run(&new, &mut y, &keyed(fresh), ok("fresh")),
        executed("fresh")
    );
    let replay = run(&new, &mut x, &keyed(fresh), ok("again"));
    replay.assert_replays(b"fresh");
    assert_eq!(fleet.keys(&y), [3, 1, 0]);
    // A payload that differs from the record on the previous shard gets 422 there too.
    let other = keyed(&moved[0]).body("other");
    let mut z = fleet.proxy(3);
    assert_eq!(run(&new, &mut z, &other, ok("no")).status(), 422);

    // Without the previous map, the moved keys would run again: the check is what
    // keeps them.
    let careless = sharded("a,b", None, "");
    let mut w = fleet.proxy(4);
    assert_eq!(
        run(&careless, &mut w, &keyed(&moved[1]), ok("twice")),
        executed("twice")
    );
}

#[test]
fn a_key_in_flight_on_its_previous_shard_gets_409_and_the_new_claim_is_released() {
    let old = sharded("a", None, "");
    let new = sharded("a,b", Some(("previous_shards", "a")), "");
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    let k = &keys_on(&new, "b", 1)[0];
    let first = send(&old, &mut x, &keyed(k)).unwrap();
    let dup = run(&new, &mut y, &keyed(k), ok("no"));
    assert_eq!(dup.status(), 409);
    assert!(dup.local().header("retry-after").is_some());
    assert_eq!(fleet.keys(&y), [1, 0, 0], "the claim on b was released");
    assert_eq!(respond(&old, &mut x, first, ok("made")), executed("made"));
    run(&new, &mut y, &keyed(k), ok("no")).assert_replays(b"made");
}

#[test]
fn a_failed_check_fails_as_failure_mode_says_and_closed_releases_the_claim() {
    for (mode, status) in [("closed", 503), ("open", 200)] {
        let new = sharded(
            "a,b",
            Some(("previous_shards", "a")),
            &format!(r#""failure_mode": "{mode}""#),
        );
        let fleet = Fleet::new();
        let mut y = fleet.proxy(2);
        let k = &keys_on(&new, "b", 1)[0];
        fleet.a.set_down(true);
        let got = run(&new, &mut y, &keyed(k), ok("made"));
        assert_eq!(got.status(), status, "{mode}");
        assert_eq!(y.count_of(Counter::StoreErrors), 1, "{mode}");
        match mode {
            // Nothing was forwarded: the claim on b is gone, the key may be sent again.
            "closed" => assert_eq!(fleet.keys(&y), [0, 0, 0]),
            // Forwarded with its claim on b: completed there, replayed from there.
            _ => {
                assert_eq!(y.count_of(Counter::FailedOpen), 1);
                assert_eq!(fleet.keys(&y), [0, 1, 0]);
                fleet.a.set_down(false);
                run(&new, &mut y, &keyed(k), ok("no")).assert_replays(b"made");
            }
        }
    }
}

/// One stream driven a call at a time.
pub(super) struct Driven {
    s: DedupStream,
    next: Option<StoreCall>,
    end: Option<Decision>,
}

impl Driven {
    pub(super) fn start(p: &Plugin, env: &mut FakeEnv, r: Req) -> Self {
        let mut s = DedupStream::new(1);
        let d = s.on_request_headers(p, env, r.head, true);
        let mut me = Driven {
            s,
            next: None,
            end: None,
        };
        me.take(d);
        me
    }

    fn take(&mut self, d: Decision) {
        match d {
            Decision::Call(c) => self.next = Some(c),
            other => self.end = Some(other),
        }
    }

    fn step(&mut self, p: &Plugin, env: &mut FakeEnv) {
        let Some(c) = self.next.take() else { return };
        let a = call(env, &c);
        let d = self.s.on_store_answer(p, env, a);
        self.take(d);
    }
}

/// One stream on its plugin and proxy, driven a call at a time.
pub(super) type Side<'a> = (&'a Plugin, &'a mut FakeEnv, &'a mut Driven);

/// Runs two streams to their ends, the bits of `schedule` (`bits` of them, cycled)
/// choosing whose call etcd answers next while both have one out: how many forwarded.
pub(super) fn interleave(schedule: u32, bits: u32, x: Side, y: Side) -> usize {
    let ((px, ex, dx), (py, ey, dy)) = (x, y);
    let mut t = 0;
    while dx.next.is_some() || dy.next.is_some() {
        let pick_x = match (dx.next.is_some(), dy.next.is_some()) {
            (true, true) => schedule >> (t % bits) & 1 == 0,
            (x_only, _) => x_only,
        };
        if pick_x {
            dx.step(px, ex);
        } else {
            dy.step(py, ey);
        }
        t += 1;
        assert!(t < 60, "schedule {schedule:#b} does not end");
    }
    [&dx, &dy]
        .iter()
        .filter(|d| d.end == Some(Decision::Continue))
        .count()
}

/// Mid-push, one proxy is still on step 1 (claims under the old map, checks the next)
/// and another already on step 2 (claims under the new map, checks the previous): on
/// every interleaving of their store calls, at most one forwards the key, and the one
/// that yields leaves no claim behind. Both may yield (each saw the other's claim), a
/// `409` the client retries; never both forward.
#[test]
fn two_proxies_on_two_steps_of_a_push_never_both_forward_a_key() {
    let step1 = sharded("a", Some(("next_shards", "a,b")), "");
    let step2 = sharded("a,b", Some(("previous_shards", "a")), "");
    let k = keys_on(&step2, "b", 1).remove(0);
    let (mut one_forwarded, mut both_yielded) = (0, 0);
    for schedule in 0u32..1 << 12 {
        let fleet = Fleet::new();
        let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
        let mut dx = Driven::start(&step1, &mut x, keyed(&k));
        let mut dy = Driven::start(&step2, &mut y, keyed(&k));
        let forwarded = interleave(
            schedule,
            12,
            (&step1, &mut x, &mut dx),
            (&step2, &mut y, &mut dy),
        );
        assert!(forwarded <= 1, "schedule {schedule:#b}: both forwarded");
        match forwarded {
            1 => one_forwarded += 1,
            _ => {
                both_yielded += 1;
                // Neither left a claim: the retry finds the key free.
                assert_eq!(fleet.keys(&x), [0, 0, 0], "schedule {schedule:#b}");
            }
        }
        // Every refused one was answered as a duplicate (409), not a store error.
        assert_eq!(
            x.count_of(Counter::StoreErrors) + y.count_of(Counter::StoreErrors),
            0
        );
    }
    assert!(
        one_forwarded > 0 && both_yielded > 0,
        "{one_forwarded} {both_yielded}"
    );
}

/// The operator API finds a record on its shard (or on its previous one mid-resharding)
/// and counts each shard's keys.
#[test]
fn the_operator_api_finds_a_records_shard_and_counts_per_shard() {
    let old = sharded("a", None, "");
    let new = sharded("a,b", Some(("previous_shards", "a")), "");
    let admin_of = |p: &Plugin| {
        let mut c = p.config.clone();
        c.role = crate::config::Role::Admin;
        Plugin::new(c)
    };
    let fleet = Fleet::new();
    let mut x = fleet.proxy(1);
    let moved = &keys_on(&new, "b", 1)[0];
    let on_b = &keys_on(&new, "b", 2)[1];
    run(&old, &mut x, &keyed(moved), ok("m"));
    run(&new, &mut x, &keyed(on_b), ok("b"));
    let admin_p = admin_of(&new);
    let get = |env: &mut FakeEnv, key: &str| {
        admin_json(&admin(
            &admin_p,
            env,
            "GET",
            &format!("/records?key={key}&authority=api.example"),
        ))
    };
    assert_eq!(get(&mut x, on_b)["shard"], "b");
    assert_eq!(
        get(&mut x, moved)["shard"],
        "a",
        "found on its previous shard"
    );
    let stats = admin_json(&admin(&admin_p, &mut x, "GET", "/stats"));
    assert_eq!(stats["records"], 2);
    assert_eq!(
        stats["shards"],
        serde_json::json!([{"name": "a", "records": 1}, {"name": "b", "records": 1}])
    );
}

/// Ordered by header `x-entity`, integer versions in header `x-version`.
const ORDERED: &str =
    r#""ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}"#;

fn delivery(entity: &str, version: &str, key: &str) -> Req {
    req("POST", "/hook")
        .key(key)
        .header("x-entity", entity)
        .header("x-version", version)
}

/// The shard of `p` an entity's key lands on (run once on a fresh fleet).
fn entity_home(p: &Plugin, entity: &str) -> &'static str {
    let fleet = Fleet::new();
    let mut env = fleet.proxy(9);
    run(p, &mut env, &delivery(entity, "1", "probe"), ok("probe"));
    let on = |e: &FakeEtcd| e.keys(env.now_ms).iter().any(|k| k.contains("o/"));
    match (on(&fleet.a), on(&fleet.b), on(&fleet.c)) {
        (true, false, false) => "a",
        (false, true, false) => "b",
        (false, false, true) => "c",
        other => panic!("entity {entity} on {other:?}"),
    }
}

/// Entities move with the map as records do: a version applied under the old map still
/// makes an older one stale after the move, and a newer one runs and is applied on the
/// entity's new shard.
#[test]
fn an_entity_applied_before_a_shard_was_added_still_refuses_older_versions() {
    let old = sharded("a", None, ORDERED);
    let new = sharded("a,b", Some(("previous_shards", "a")), ORDERED);
    let entity = (0..200)
        .map(|i| format!("o{i}"))
        .find(|e| entity_home(&new, e) == "b")
        .unwrap();
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    assert_eq!(
        run(&old, &mut x, &delivery(&entity, "5", "d5"), ok("v5")),
        executed("v5")
    );
    let stale = run(&new, &mut y, &delivery(&entity, "3", "d3"), ok("never"));
    assert_eq!(stale.status(), 409, "{stale:?}");
    assert_eq!(
        stale.problem_type(),
        "urn:proxy-dedup:problem:stale-version"
    );
    assert_eq!(y.count_of(Counter::ReshardYielded), 1);
    // Nothing is left claimed on the new shard: version 6 runs at once, and is then
    // applied there.
    assert_eq!(
        run(&new, &mut y, &delivery(&entity, "6", "d6"), ok("v6")),
        executed("v6")
    );
    let five_again = run(&new, &mut y, &delivery(&entity, "5", "d5b"), ok("never"));
    assert_eq!(five_again.status(), 409);
    assert_eq!(y.count_of(Counter::Executed), 1);
    // Without the previous map, version 3 would have run.
    let careless = sharded("a,b", None, ORDERED);
    let mut w = Fleet::new().proxy(4);
    run(&old, &mut w, &delivery(&entity, "5", "d5"), ok("v5"));
    assert_eq!(
        run(&careless, &mut w, &delivery(&entity, "3", "d3"), ok("v3")),
        executed("v3")
    );
}

/// Two versions of one entity on two proxies on two steps of a push: on every
/// interleaving, at most one is forwarded while the other is in flight.
#[test]
fn two_versions_on_two_steps_of_a_push_never_run_at_once() {
    let step1 = sharded("a", Some(("next_shards", "a,b")), ORDERED);
    let step2 = sharded("a,b", Some(("previous_shards", "a")), ORDERED);
    let entity = (0..200)
        .map(|i| format!("o{i}"))
        .find(|e| entity_home(&step2, e) == "b")
        .unwrap();
    let (mut one, mut none) = (0, 0);
    for schedule in 0u32..1 << 11 {
        let fleet = Fleet::new();
        let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
        let mut dx = Driven::start(&step1, &mut x, delivery(&entity, "4", "d4"));
        let mut dy = Driven::start(&step2, &mut y, delivery(&entity, "5", "d5"));
        let forwarded = interleave(
            schedule,
            11,
            (&step1, &mut x, &mut dx),
            (&step2, &mut y, &mut dy),
        );
        assert!(
            forwarded <= 1,
            "schedule {schedule:#b}: both versions forwarded at once"
        );
        if forwarded == 1 {
            one += 1;
        } else {
            none += 1;
            // Both yielded: nothing is left in flight, neither record nor entity.
            let live: Vec<String> = [&fleet.a, &fleet.b]
                .iter()
                .flat_map(|e| e.keys(x.now_ms))
                .filter(|k| !k.contains("o/"))
                .collect();
            assert!(live.is_empty(), "schedule {schedule:#b}: {live:?}");
        }
        assert_eq!(
            x.count_of(Counter::StoreErrors) + y.count_of(Counter::StoreErrors),
            0
        );
    }
    assert!(one > 0, "{one} {none}");
}

/// Wait mode mid-resharding: a duplicate of a moved key whose first request is in
/// flight on the key's previous shard waits (its own claim released), re-checks with
/// one read of that shard while it stays in flight, and gets the replay once that
/// completes; a record released there instead makes the waiter claim on its own shard
/// (checked again) and run.
#[test]
fn a_waiter_on_a_record_of_the_other_map_waits_and_gets_the_replay() {
    const WAIT: &str = r#""on_in_flight": "wait", "wait_timeout_ms": 5000"#;
    let old = sharded("a", None, WAIT);
    let new = sharded("a,b", Some(("previous_shards", "a")), WAIT);
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    let ks = keys_on(&new, "b", 2);
    let first = send(&old, &mut x, &keyed(&ks[0])).unwrap();
    let mut dup = DedupStream::new(2);
    let d = dup.on_request_headers(&new, &mut y, keyed(&ks[0]).head, true);
    let (d, calls) = settle_traced(&new, &mut y, &mut dup, d);
    assert_eq!(d, Decision::Pause);
    assert_eq!(calls.last().map(String::as_str), Some("b"), "{calls:?}");
    assert_eq!(fleet.keys(&y), [1, 0, 0], "its claim on b was released");
    // Still in flight: each re-check is one read on a, and waits on.
    for _ in 0..2 {
        let d = dup.on_wake(&new, &mut y);
        assert_eq!(
            settle_traced(&new, &mut y, &mut dup, d),
            (Decision::Pause, vec!["a".to_string()])
        );
    }
    assert_eq!(respond(&old, &mut x, first, ok("made")), executed("made"));
    let d = dup.on_wake(&new, &mut y);
    match settle_traced(&new, &mut y, &mut dup, d) {
        (Decision::Reply(r), calls) => {
            assert_eq!((r.status, r.body.as_slice()), (200, &b"made"[..]));
            assert_eq!(calls, ["a"], "the replay comes from the read");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(y.count_of(Counter::Executed), 0);
    assert_eq!(fleet.keys(&y), [1, 0, 0]);

    // The first is released on a (its upstream never ran it): the waiter's read finds
    // the key free there, and it claims on b, checks a, and runs.
    let first = send(&old, &mut x, &keyed(&ks[1])).unwrap();
    let mut dup = DedupStream::new(3);
    let d = dup.on_request_headers(&new, &mut y, keyed(&ks[1]).head, true);
    assert_eq!(settle_traced(&new, &mut y, &mut dup, d).0, Decision::Pause);
    let refused = origin(
        "upstream_reset_before_response_started{connection_failure}",
        0,
    );
    assert_eq!(respond(&old, &mut x, first, ended(refused)), Outcome::Reset);
    let d = dup.on_wake(&new, &mut y);
    let (d, calls) = settle_traced(&new, &mut y, &mut dup, d);
    assert!(matches!(d, Decision::Continue), "{d:?}");
    assert_eq!(calls.first().map(String::as_str), Some("a"), "{calls:?}");
    assert!(calls.iter().any(|s| s == "b"), "claimed on b: {calls:?}");
    assert_eq!(
        calls.last().map(String::as_str),
        Some("a"),
        "checked a: {calls:?}"
    );
}

/// A check read that fails is retried within the budget like any store call: one
/// failure, and the claim still yields to the record on the other map; failures past
/// the retries, and it is a store error.
#[test]
fn a_check_read_is_retried_within_its_budget() {
    let old = sharded("a", None, "");
    let new = sharded(
        "a,b",
        Some(("previous_shards", "a")),
        r#""failure_mode": "closed""#,
    );
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    let moved = keys_on(&new, "b", 2);
    for k in &moved {
        run(&old, &mut x, &keyed(k), ok(k));
    }
    fleet.a.fail_next(1);
    run(&new, &mut y, &keyed(&moved[0]), ok("again")).assert_replays(moved[0].as_bytes());
    assert_eq!(y.count_of(Counter::StoreErrors), 0);
    // The first attempt and its four retries fail: a store error (a fifth retry
    // would have been answered).
    fleet.a.fail_next(5);
    let got = run(&new, &mut y, &keyed(&moved[1]), ok("again"));
    assert_eq!(got.status(), 503);
    assert_eq!(y.count_of(Counter::StoreErrors), 1);
    assert_eq!(y.count_of(Counter::Executed), 0);
}

/// A check read has its own budget of `store.timeout_ms` from when it starts: a failure
/// answered before the budget ends is retried, one answered when it ends is not (closed:
/// the claim is released and the client gets `503`).
#[test]
fn a_check_read_is_not_retried_once_its_budget_has_ended() {
    let new = sharded(
        "a,b",
        Some(("previous_shards", "a")),
        r#""failure_mode": "closed""#,
    );
    let refused = || CallAnswer {
        status: 503,
        ..Default::default()
    };
    for (after, retried) in [(499, true), (500, false)] {
        let fleet = Fleet::new();
        let mut y = fleet.proxy(2);
        let k = &keys_on(&new, "b", 1)[0];
        let mut s = DedupStream::new(1);
        let d = s.on_request_headers(&new, &mut y, keyed(k).head, true);
        // The claim on b, until the check read on a is out.
        let check = run_calls_until(&new, &mut y, &mut s, d, |_, c| c.route.shard == "a").unwrap();
        y.now_ms += after;
        let next = s.on_store_answer(&new, &mut y, refused());
        match next {
            Decision::Call(c) if c.route.shard == "a" => {
                assert!(retried, "retried at +{after} ms");
                assert_eq!(c.timeout_ms, 1, "what is left of the budget");
                assert_eq!(c.body, check.body);
            }
            other => {
                assert!(!retried, "+{after} ms: {other:?}");
                let (end, calls) = settle_traced(&new, &mut y, &mut s, other);
                assert!(calls.iter().all(|c| c == "b"), "{calls:?}");
                assert!(
                    matches!(end, Decision::Reply(ref r) if r.status == 503),
                    "{end:?}"
                );
                assert_eq!(fleet.keys(&y), [0, 0, 0], "the claim on b was released");
            }
        }
    }
}

/// An entity's check read is retried within its budget; past its retries it is a store
/// error: `closed` answers `503` and leaves nothing claimed (the next version runs
/// once the store answers), `open` forwards.
#[test]
fn an_entity_check_read_is_retried_then_fails_as_failure_mode_says() {
    for mode in ["closed", "open"] {
        let extra = format!(r#"{ORDERED}, "failure_mode": "{mode}""#);
        // From {a, c} to {a, b}: an entity moved from c to b, and records that stay on
        // a, so that only the entity's check reads c.
        let old = sharded("a,c", None, &extra);
        let new = sharded("a,b", Some(("previous_shards", "a,c")), &extra);
        let entity = (0..200)
            .map(|i| format!("o{i}"))
            .find(|e| entity_home(&new, e) == "b" && entity_home(&old, e) == "c")
            .unwrap();
        let key = |n: u32| {
            (0..200)
                .map(|i| format!("{mode}-{n}-{i}"))
                .find(|k| {
                    let r = || delivery(&entity, "1", k);
                    home_of(&new, r()) == "a" && home_of(&old, r()) == "a"
                })
                .unwrap()
        };
        let fleet = Fleet::new();
        let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
        run(&old, &mut x, &delivery(&entity, "5", &key(0)), ok("v5"));
        // One failure: retried, and version 3 is still stale.
        fleet.c.fail_next(1);
        let got = run(&new, &mut y, &delivery(&entity, "3", &key(1)), ok("never"));
        assert_eq!(got.status(), 409, "{mode}: {got:?}");
        let errors = y.count_of(Counter::StoreErrors);
        fleet.c.fail_next(5);
        let got = run(&new, &mut y, &delivery(&entity, "6", &key(2)), ok("v6"));
        assert!(y.count_of(Counter::StoreErrors) > errors, "{mode}");
        match mode {
            "closed" => {
                assert_eq!(got.status(), 503, "{got:?}");
                assert_eq!(
                    run(&new, &mut y, &delivery(&entity, "7", &key(3)), ok("v7")),
                    executed("v7")
                );
            }
            _ => assert_eq!(got, executed("v6")),
        }
    }
}

/// A client that leaves while its entity's claim is out on the entity's new shard: once
/// the claim is won, nothing is read on the old one (nothing will be forwarded), the
/// entity's flight and the record's claim are released on the new shard, and the
/// version runs on the next delivery.
#[test]
fn a_client_gone_during_a_moved_entitys_claim_releases_it_without_a_check_read() {
    let new = sharded("a,b", Some(("previous_shards", "a")), ORDERED);
    let entity = (0..200)
        .map(|i| format!("o{i}"))
        .find(|e| entity_home(&new, e) == "b")
        .unwrap();
    let key = (0..200)
        .map(|i| format!("d{i}"))
        .find(|k| home_of(&new, delivery(&entity, "1", k)) == "b")
        .unwrap();
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    let mut s = DedupStream::new(4);
    let d = s.on_request_headers(&new, &mut x, delivery(&entity, "1", &key).head, true);
    let Ok(c) = run_calls_until(&new, &mut x, &mut s, d, entity_call_out) else {
        panic!("the entity's claim was never out")
    };
    assert_eq!(
        s.on_stream_end(&new, &mut x, &origin("client_disconnected", 0)),
        None
    );
    let ans = call(&x, &c);
    let d = s.on_store_answer(&new, &mut x, ans);
    let (d, after) = settle_traced(&new, &mut x, &mut s, d);
    assert!(!matches!(d, Decision::Reply(_)), "{d:?}");
    assert!(!after.is_empty(), "nothing released");
    assert!(after.iter().all(|shard| shard == "b"), "{after:?}");
    assert_eq!(x.count_of(Counter::Executed), 0, "never forwarded");
    // Nothing is left claimed: the same delivery runs on the other proxy.
    assert_eq!(
        run(&new, &mut y, &delivery(&entity, "1", &key), ok("1")),
        executed("1")
    );
}

/// A claim yielding on a moved key's new shard: `key`, completed by proxy `x` before
/// the move, whose duplicate on `y` (step 2) has claimed on b and has its check read of
/// a out (returned unanswered, with its stream).
fn a_yielding_claim_on_b(
    old: &Plugin,
    step2: &Plugin,
    x: &mut FakeEnv,
    y: &mut FakeEnv,
    key: &str,
) -> (DedupStream, StoreCall) {
    assert_eq!(run(old, x, &keyed(key), ok(key)), executed(key));
    let mut first = DedupStream::new(10);
    let d = first.on_request_headers(step2, y, keyed(key).head, true);
    let check = run_calls_until(step2, y, &mut first, d, |_, c| c.route.shard == "a").unwrap();
    (first, check)
}

/// Duplicates of a key completed under the previous map arrive at once, through
/// proxies on both steps: the first to claim on the key's new shard yields to the
/// record, and a duplicate that finds that yielding claim is answered from the record
/// too (a replay), never `409 in-flight`; unmoved keys race the same way already.
#[test]
fn concurrent_duplicates_of_a_moved_completed_key_are_all_replayed() {
    let old = sharded("a", None, "");
    let step1 = sharded("a", Some(("next_shards", "a,b")), "");
    let step2 = sharded("a,b", Some(("previous_shards", "a")), "");
    let fleet = Fleet::new();
    let (mut x, mut y, mut z) = (fleet.proxy(1), fleet.proxy(2), fleet.proxy(3));
    let k = &keys_on(&step2, "b", 1)[0];
    // The first duplicate (step 2) has claimed on b; its check read of a is still out.
    let (mut first, check) = a_yielding_claim_on_b(&old, &step2, &mut x, &mut y, k);
    assert_eq!(fleet.keys(&y), [1, 1, 0], "its claim stands on b");
    // Concurrent duplicates through a proxy on step 2 and one on step 1.
    let (got, calls) = {
        let mut s = DedupStream::new(11);
        let d = s.on_request_headers(&step2, &mut z, keyed(k).head, true);
        settle_traced(&step2, &mut z, &mut s, d)
    };
    match got {
        Decision::Reply(r) => {
            assert_eq!((r.status, r.body.as_slice()), (200, k.as_bytes()), "{r:?}");
            assert_eq!(r.header("idempotent-replayed"), Some(&b"true"[..]));
        }
        other => panic!("a duplicate that found the yielding claim: {other:?}"),
    }
    assert_eq!(calls.last().map(String::as_str), Some("a"), "{calls:?}");
    run(&step1, &mut x, &keyed(k), ok("no")).assert_replays(k.as_bytes());
    // The first duplicate's check answers: it yields, is released, and replays too.
    let a = call(&y, &check);
    let d = first.on_store_answer(&step2, &mut y, a);
    match settle(&step2, &mut y, &mut first, d) {
        Decision::Reply(r) => assert_eq!(r.body.as_slice(), k.as_bytes()),
        other => panic!("{other:?}"),
    }
    assert_eq!(fleet.keys(&y), [1, 0, 0], "nothing left claimed on b");
    assert_eq!(
        [&x, &y, &z].map(|e| e.count_of(Counter::Executed)),
        [1, 0, 0],
        "only the first execution ran"
    );
    // Still in flight under the previous map too: the claim here stays the answer.
    let k2 = &keys_on(&step2, "b", 2)[1];
    let _running = send(&old, &mut x, &keyed(k2)).unwrap();
    let mut first = DedupStream::new(12);
    let d = first.on_request_headers(&step2, &mut y, keyed(k2).head, true);
    let _check =
        run_calls_until(&step2, &mut y, &mut first, d, |_, c| c.route.shard == "a").unwrap();
    let dup = run(&step2, &mut z, &keyed(k2), ok("no"));
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
}

/// A duplicate's look at the other map is retried like any store call: one failure and
/// it still answers from the record there; failures past the retries, and the claim in
/// flight on its own shard is the answer (`409`), never a store error.
#[test]
fn a_duplicates_look_at_the_other_map_is_retried_then_answers_in_flight() {
    let old = sharded("a", None, "");
    let step2 = sharded("a,b", Some(("previous_shards", "a")), "");
    for (failures, replayed) in [(1, true), (4, true), (5, false)] {
        let fleet = Fleet::new();
        let (mut x, mut y, mut z) = (fleet.proxy(1), fleet.proxy(2), fleet.proxy(3));
        let k = &keys_on(&step2, "b", 1)[0];
        let _yielding = a_yielding_claim_on_b(&old, &step2, &mut x, &mut y, k);
        fleet.a.fail_next(failures);
        let got = run(&step2, &mut z, &keyed(k), ok("no"));
        if replayed {
            got.assert_replays(k.as_bytes());
        } else {
            assert_eq!(
                got.problem_type(),
                "urn:proxy-dedup:problem:in-flight",
                "{failures}"
            );
        }
        assert_eq!(z.count_of(Counter::StoreErrors), 0, "{failures}");
    }
}
