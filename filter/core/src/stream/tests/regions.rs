//! Regions through the plugin: every record lives on its home region's shards, the home
//! given by a scope header (through a map, or a default), never by the region the
//! request landed in. Three fake etcd clusters: `a` and `b` in region `eu`, `c` in
//! region `us`; proxies in either region reach all three.

use super::shards::{interleave, Driven, Fleet};
use crate::fake::FakeEnv;
use crate::metrics::{Counter, Remote};
use crate::stores::etcd::shards::{name_seed, pick};
use crate::stream::{Decision, DedupStream, Plugin};
use crate::testing::*;

/// `eu` is region 0 and `us` region 1 (regions are indexed in name order).
const EU: u16 = 0;
const US: u16 = 1;

const SHARDS: &str = r#"[{"name": "a", "cluster": "etcd_a", "region": "eu"},
    {"name": "b", "cluster": "etcd_b", "region": "eu"},
    {"name": "c", "cluster": "etcd_c", "region": "us"}]"#;

/// A proxy of region `local`, records homed by `home` (a `store.home` object), with
/// `store` fields and top-level fields added.
fn regional(local: &str, home: &str, store: &str, extra: &str) -> Plugin {
    let sep = |s: &str| if s.is_empty() { "" } else { ", " };
    plugin(&format!(
        r#"{{"scope": {{"headers": ["x-region", "x-tenant"]}},
            "store": {{"kind": "etcd", "timeout_ms": 500, "region": "{local}",
                      "shards": {SHARDS}, "home": {home}{}{store}}}{}{extra}}}"#,
        sep(store),
        sep(extra)
    ))
}

/// Homed by the `x-region` header, `us` when it is absent or names no region.
const BY_HEADER: &str = r#"{"header": "x-region", "default": "us"}"#;

fn homed(key: &str, region: Option<&str>) -> Req {
    let r = req("POST", "/orders").key(key);
    match region {
        Some(h) => r.header("x-region", h),
        None => r,
    }
}

/// The shard a request's record is claimed on (its first store call's).
fn shard_of(p: &Plugin, r: Req) -> String {
    let mut env = Fleet::new().proxy(9);
    match DedupStream::new(1).on_request_headers(p, &mut env, r.head, true) {
        Decision::Call(c) => c.route.shard.clone(),
        d => panic!("{d:?}"),
    }
}

fn remote(env: &FakeEnv, what: Remote, region: u16) -> u64 {
    env.remote.get(&(what, region)).copied().unwrap_or(0)
}

fn remote_calls(env: &FakeEnv) -> u64 {
    env.remote.values().sum()
}

/// The record's digest as the operator API computes it (the data plane's).
fn digest_of(p: &Plugin, key: &str, region: &str) -> crate::key::Digest {
    let path = format!("/records?key={key}&authority=api.example&scope.x-region={region}");
    match crate::admin::parse(&p.config, "GET", path.as_bytes()) {
        Ok(crate::admin::AdminOp::Get { digest, .. }) => digest,
        _ => panic!("no digest for {key}"),
    }
}

#[test]
fn a_record_lives_on_its_home_regions_shards_wherever_the_request_lands() {
    let in_eu = regional("eu", BY_HEADER, "", "");
    let in_us = regional("us", BY_HEADER, "", "");
    let eu_seeds = [name_seed("a"), name_seed("b")];
    let mut on = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..40 {
        let key = format!("k{i}");
        for p in [&in_eu, &in_us] {
            // Rendezvous hashing within the home region: the pinned pick over its
            // shards' names only.
            let want = ["a", "b"][pick(&eu_seeds, &digest_of(p, &key, "eu")).unwrap()];
            let got = shard_of(p, homed(&key, Some("eu")));
            assert_eq!(got, want, "{key}");
            *on.entry(got).or_default() += 1;
            for other in [Some("us"), None, Some("mars"), Some("EU")] {
                assert_eq!(shard_of(p, homed(&key, other)), "c", "{key} {other:?}");
            }
        }
    }
    assert!(on["a"] >= 20 && on["b"] >= 20, "{on:?}");
}

#[test]
fn a_retry_that_changes_region_is_replayed_and_only_remote_homes_cost_remote_calls() {
    let (in_eu, in_us) = (
        regional("eu", BY_HEADER, "", ""),
        regional("us", BY_HEADER, "", ""),
    );
    let fleet = Fleet::new();
    let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
    // Homed in eu, first sent in eu: no remote call; its retry in us reads eu once.
    let k = homed("pay-1", Some("eu"));
    assert_eq!(run(&in_eu, &mut x, &k, ok("charged")), executed("charged"));
    assert_eq!(remote_calls(&x), 0);
    run(&in_us, &mut y, &k, ok("twice")).assert_replays(b"charged");
    assert_eq!(remote(&y, Remote::Claims, EU), 1);
    assert_eq!(remote(&y, Remote::Completions, EU), 0);
    // Homed in us, first sent in eu: a remote claim and a remote completion; us replays
    // from its own shard.
    let k = homed("pay-2", Some("us"));
    assert_eq!(run(&in_eu, &mut x, &k, ok("made")), executed("made"));
    assert_eq!(remote(&x, Remote::Claims, US), 1);
    assert_eq!(remote(&x, Remote::Completions, US), 1);
    let before = remote_calls(&y);
    run(&in_us, &mut y, &k, ok("no")).assert_replays(b"made");
    assert_eq!(
        remote_calls(&y),
        before,
        "us-homed key in us: no remote call"
    );
    assert_eq!(
        x.count_of(Counter::Executed) + y.count_of(Counter::Executed),
        2
    );
    // A second duplicate in us of the eu-homed key: this worker's tier answers it.
    run(&in_us, &mut y, &homed("pay-1", Some("eu")), ok("no")).assert_replays(b"charged");
    assert_eq!(remote(&y, Remote::Claims, EU), 1);
    let keys = fleet.keys(&x);
    assert_eq!((keys[0] + keys[1], keys[2]), (1, 1), "{keys:?}");
}

#[test]
fn a_tenant_map_homes_each_tenant_and_the_default_takes_the_rest() {
    let home = r#"{"header": "x-tenant", "map": {"acme": "eu", "globex": "us"}, "default": "eu"}"#;
    let p = regional("eu", home, "", "");
    let tenant = |t: Option<&str>| {
        let r = req("POST", "/orders").key("k1");
        match t {
            Some(t) => r.header("x-tenant", t),
            None => r,
        }
    };
    assert_eq!(shard_of(&p, tenant(Some("globex"))), "c");
    let acme = shard_of(&p, tenant(Some("acme")));
    assert!(acme == "a" || acme == "b", "{acme}");
    for t in [None, Some("initech"), Some("us")] {
        let s = shard_of(&p, tenant(t));
        assert!(s == "a" || s == "b", "{t:?}: {s}");
    }
}

#[test]
fn a_cut_off_home_fails_only_its_keys_as_failure_mode_says() {
    for (mode, status) in [("closed", 503), ("open", 200)] {
        let p = regional("eu", BY_HEADER, "", &format!(r#""failure_mode": "{mode}""#));
        let fleet = Fleet::new();
        let mut x = fleet.proxy(1);
        fleet.c.set_down(true);
        for i in 0..3 {
            let eu = homed(&format!("e{i}"), Some("eu"));
            assert_eq!(run(&p, &mut x, &eu, ok("made")), executed("made"), "{mode}");
            let us = homed(&format!("u{i}"), Some("us"));
            assert_eq!(run(&p, &mut x, &us, ok("made")).status(), status, "{mode}");
        }
        assert_eq!(x.count_of(Counter::StoreErrors), 3, "{mode}");
        assert_eq!(fleet.keys(&x)[2], 0, "{mode}");
    }
}

/// Re-homing tenant `acme` from eu to us by the documented steps: `store.next_home`,
/// then `store.home` changed with `store.previous_home`, then neither.
#[test]
fn re_homing_a_tenant_by_the_two_steps_never_runs_a_key_twice() {
    let to_eu = r#"{"header": "x-tenant", "map": {"acme": "eu"}, "default": "eu"}"#;
    let to_us = r#"{"header": "x-tenant", "map": {"acme": "us"}, "default": "eu"}"#;
    let old = regional("eu", to_eu, "", "");
    let step1 = regional("eu", to_eu, &format!(r#""next_home": {to_us}"#), "");
    let step2 = regional("us", to_us, &format!(r#""previous_home": {to_eu}"#), "");
    let done = regional("us", to_us, "", "");
    let acme = |key: &str| req("POST", "/orders").key(key).header("x-tenant", "acme");
    let fleet = Fleet::new();
    let (mut x, mut y, mut z) = (fleet.proxy(1), fleet.proxy(2), fleet.proxy(3));
    // Completed before the move, in its old home: replayed at every step after.
    assert_eq!(run(&old, &mut x, &acme("before"), ok("b")), executed("b"));
    run(&step1, &mut y, &acme("before"), ok("no")).assert_replays(b"b");
    run(&step2, &mut z, &acme("before"), ok("no")).assert_replays(b"b");
    assert_eq!(z.count_of(Counter::ReshardChecks), 1);
    assert_eq!(z.count_of(Counter::ReshardYielded), 1);
    assert_eq!(fleet.keys(&z)[2], 0, "the claim made in us was released");
    // Completed on step 1 (still claimed in eu): replayed on step 2.
    assert_eq!(run(&step1, &mut x, &acme("mid"), ok("m")), executed("m"));
    run(&step2, &mut y, &acme("mid"), ok("no")).assert_replays(b"m");
    // Completed on step 2 (claimed in us): replayed by a proxy still on step 1, which
    // checks the next home.
    assert_eq!(run(&step2, &mut x, &acme("new"), ok("n")), executed("n"));
    run(&step1, &mut y, &acme("new"), ok("no")).assert_replays(b"n");
    // Other tenants never move and are never checked elsewhere.
    let other = req("POST", "/orders")
        .key("o")
        .header("x-tenant", "initech");
    let checks = x.count_of(Counter::ReshardChecks);
    assert_eq!(run(&step2, &mut x, &other, ok("o")), executed("o"));
    assert_eq!(x.count_of(Counter::ReshardChecks), checks);
    // Skipping step 2 would run a key of the old home again: the check is what keeps it.
    let mut w = fleet.proxy(4);
    assert_eq!(
        run(&done, &mut w, &acme("before"), ok("twice")),
        executed("twice")
    );
}

/// Mid-push, one proxy on step 1 and one on step 2 of a re-homing: on every
/// interleaving of their calls, at most one forwards a key of the moving tenant.
#[test]
fn two_proxies_on_two_steps_of_a_re_homing_never_both_forward_a_key() {
    let to_eu = r#"{"header": "x-tenant", "map": {"acme": "eu"}, "default": "eu"}"#;
    let to_us = r#"{"header": "x-tenant", "map": {"acme": "us"}, "default": "eu"}"#;
    let step1 = regional("eu", to_eu, &format!(r#""next_home": {to_us}"#), "");
    let step2 = regional("us", to_us, &format!(r#""previous_home": {to_eu}"#), "");
    let acme = || {
        req("POST", "/orders")
            .key("race")
            .header("x-tenant", "acme")
    };
    let mut one_forwarded = 0;
    for schedule in 0u32..1 << 10 {
        let fleet = Fleet::new();
        let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
        let mut dx = Driven::start(&step1, &mut x, acme());
        let mut dy = Driven::start(&step2, &mut y, acme());
        let forwarded = interleave(
            schedule,
            10,
            (&step1, &mut x, &mut dx),
            (&step2, &mut y, &mut dy),
        );
        assert!(forwarded <= 1, "schedule {schedule:#b}: both forwarded");
        one_forwarded += forwarded;
    }
    assert!(one_forwarded > 0);
}

/// Ordered by header `x-entity`: the entity lives beside its records, in their home.
#[test]
fn an_ordering_entity_lives_in_its_records_home() {
    let ordered =
        r#""ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}"#;
    let p = regional("eu", BY_HEADER, "", ordered);
    for (home, want) in [("us", [false, false, true]), ("eu", [true, true, false])] {
        let fleet = Fleet::new();
        let mut x = fleet.proxy(1);
        for i in 0..8 {
            let r = homed(&format!("d{i}"), Some(home))
                .header("x-entity", &format!("order-{i}"))
                .header("x-version", "1");
            assert_eq!(run(&p, &mut x, &r, ok("applied")), executed("applied"));
        }
        let entities = |e: &crate::fake::FakeEtcd| {
            e.keys(x.now_ms).iter().filter(|k| k.contains("o/")).count()
        };
        let on = [&fleet.a, &fleet.b, &fleet.c].map(|e| entities(e) > 0);
        // eu's 8 entities spread over a and b; us's all on c.
        assert_eq!(on[2], want[2], "{home}: {on:?}");
        assert_eq!(on[0] || on[1], want[0], "{home}: {on:?}");
        assert_eq!(
            [&fleet.a, &fleet.b, &fleet.c]
                .map(|e| entities(e))
                .iter()
                .sum::<usize>(),
            8
        );
    }
}

#[test]
fn the_operator_api_reads_a_record_in_its_home() {
    let p = regional("eu", BY_HEADER, "", "");
    let mut c = p.config.clone();
    c.role = crate::config::Role::Admin;
    let admin_p = Plugin::new(c);
    let fleet = Fleet::new();
    let mut x = fleet.proxy(1);
    run(&p, &mut x, &homed("k", Some("us")), ok("u"));
    let got = admin_json(&admin(
        &admin_p,
        &mut x,
        "GET",
        "/records?key=k&authority=api.example&scope.x-region=us",
    ));
    assert_eq!(got["shard"], "c");
    let absent = admin(
        &admin_p,
        &mut x,
        "GET",
        "/records?key=k&authority=api.example&scope.x-region=eu",
    );
    assert_eq!(absent.status, 404, "another scope, another record");
}

/// A sharded deployment without regions adopts them by the same two steps: its old map
/// (placed over all its shards) is the other map while records move to their homes.
#[test]
fn adopting_regions_by_the_two_steps_never_runs_a_key_twice() {
    let old_map = r#"[{"name": "a", "cluster": "etcd_a"}, {"name": "c", "cluster": "etcd_c"}]"#;
    let home = r#"{"header": "x-tenant", "map": {"acme": "us"}, "default": "eu"}"#;
    let scoped = |store: &str| {
        plugin(&format!(
            r#"{{"scope": {{"headers": ["x-tenant"]}},
                "store": {{"kind": "etcd", "timeout_ms": 500, {store}}}}}"#
        ))
    };
    let old = scoped(&format!(r#""shards": {old_map}"#));
    let step1 = scoped(&format!(
        r#""shards": {old_map}, "next_shards": {SHARDS}, "next_home": {home}"#
    ));
    let step2 = scoped(&format!(
        r#""region": "eu", "shards": {SHARDS}, "home": {home}, "previous_shards": {old_map}"#
    ));
    let done = scoped(&format!(
        r#""region": "eu", "shards": {SHARDS}, "home": {home}"#
    ));
    let fleet = Fleet::new();
    let (mut x, mut y, mut z) = (fleet.proxy(1), fleet.proxy(2), fleet.proxy(3));
    let tenant = |key: &str, t: &str| req("POST", "/orders").key(key).header("x-tenant", t);
    let mut moved = 0;
    for i in 0..12 {
        let (k, t) = (format!("k{i}"), if i % 2 == 0 { "acme" } else { "initech" });
        assert_eq!(run(&old, &mut x, &tenant(&k, t), ok(&k)), executed(&k));
        run(&step1, &mut y, &tenant(&k, t), ok("no")).assert_replays(k.as_bytes());
        run(&step2, &mut z, &tenant(&k, t), ok("no")).assert_replays(k.as_bytes());
        // A key whose shard changed would run again without the old map.
        let before = shard_of(&old, tenant(&k, t));
        if before != shard_of(&done, tenant(&k, t)) {
            moved += 1;
        }
    }
    assert!(moved >= 3, "{moved} of 12 keys moved");
    assert_eq!(z.count_of(Counter::ReshardYielded), moved);
    assert_eq!(
        y.count_of(Counter::Executed) + z.count_of(Counter::Executed),
        0
    );
    // Mid-push, step 1 and step 2 race for a fresh key of each tenant.
    for t in ["acme", "initech"] {
        let mut forwarded_once = 0;
        for schedule in 0u32..1 << 8 {
            let fleet = Fleet::new();
            let (mut x, mut y) = (fleet.proxy(1), fleet.proxy(2));
            let mut dx = Driven::start(&step1, &mut x, tenant("race", t));
            let mut dy = Driven::start(&step2, &mut y, tenant("race", t));
            let n = interleave(
                schedule,
                8,
                (&step1, &mut x, &mut dx),
                (&step2, &mut y, &mut dy),
            );
            assert!(n <= 1, "{t} schedule {schedule:#b}: both forwarded");
            forwarded_once += n;
        }
        assert!(forwarded_once > 0, "{t}");
    }
}
