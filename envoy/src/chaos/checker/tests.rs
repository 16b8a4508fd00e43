#![allow(clippy::unwrap_used)]
use super::super::history::Answer;
use super::*;

const TTL: Duration = Duration::from_secs(60);

fn params() -> Params {
    Params {
        ttl: TTL,
        ordering_ttl: TTL,
        keeps_unknown: true,
        domains: vec![Domain::Etcd, Domain::Etcd, Domain::SharedData],
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn attempt(
    id: &str,
    proxy: usize,
    tenant: &str,
    key: &str,
    start: u64,
    end: u64,
    outcome: Outcome,
) -> Attempt {
    Attempt {
        client: 0,
        op: 0,
        n: 0,
        proxy,
        domain: params().domains[proxy],
        request_id: id.into(),
        tenant: tenant.into(),
        key: Some(key.into()),
        form: KeyForm::Good,
        payload: 7,
        start: ms(start),
        end: ms(end),
        asked: None,
        detached: false,
        ordered: None,
        outcome,
    }
}

fn answered(status: u16, replayed: bool, order: Option<u64>, body: u64) -> Outcome {
    Outcome::Answered(Answer {
        status,
        replayed,
        order_id: order,
        body_hash: body,
        problem: None,
        retry_after: None,
        stale: false,
        applied_version: None,
    })
}

fn exec(
    order: u64,
    id: &str,
    tenant: &str,
    key: &str,
    arrived: u64,
    status: u16,
    fault: Option<UpstreamFault>,
) -> Exec {
    Exec {
        order_id: order,
        arrived: ms(arrived),
        head_sent: (fault != Some(UpstreamFault::Reset)).then(|| ms(arrived + 10)),
        request_id: Some(id.into()),
        tenants: vec![tenant.into()],
        keys: vec![key.into()],
        payload: 7,
        status,
        body_hash: order * 100,
        fault,
        entity: None,
        version: None,
    }
}

/// A fresh answer from execution `order` (whose body hash is `order * 100`).
fn fresh(status: u16, order: u64) -> Outcome {
    answered(status, false, Some(order), order * 100)
}

/// A replay of execution `order`.
fn replay(status: u16, order: u64) -> Outcome {
    answered(status, true, Some(order), order * 100)
}

fn rules(f: &Findings) -> Vec<Rule> {
    f.violations.iter().map(|v| v.rule).collect()
}

fn no_counters() -> Vec<ProxyCounters> {
    Vec::new()
}

#[test]
fn a_clean_history_passes() {
    // Executed once on A, replayed on B, 5xx released then run again on C.
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 50, fresh(200, 1)),
        attempt("r2", 1, "t1", "k", 60, 70, replay(200, 1)),
        attempt("r3", 2, "t1", "k", 0, 50, fresh(503, 2)),
        attempt("r4", 2, "t1", "k", 100, 150, fresh(200, 3)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, None),
        exec(2, "r3", "t1", "k", 10, 503, None),
        exec(3, "r4", "t1", "k", 110, 200, None),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert!(f.violations.is_empty(), "{:#?}", f.violations);
    assert_eq!(f.again_after_release, 1);
}

#[test]
fn a_second_execution_while_held_is_flagged_and_after_the_timeout_is_not() {
    // r1 gives up (held), r2 runs 1 s later: a violation. r3 after T: allowed.
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 300, Outcome::GaveUp { reset: true }),
        attempt("r2", 1, "t1", "k", 1000, 1100, fresh(200, 2)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, None),
        exec(2, "r2", "t1", "k", 1010, 200, None),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::AtMostOnce], "{:#?}", f.violations);
    assert!(f.violations[0].excerpt.iter().any(|l| l.contains("r1")));

    // Past an in-flight timeout (5 s) is not enough: an unknown outcome is kept until
    // the TTL.
    let late = vec![
        attempt("r1", 0, "t1", "k", 0, 300, Outcome::GaveUp { reset: true }),
        attempt("r3", 1, "t1", "k", 5000, 5100, fresh(200, 3)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, None),
        exec(3, "r3", "t1", "k", 5010, 200, None),
    ];
    let f = check(&params(), &late, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::AtMostOnce], "{:#?}", f.violations);
    let after_ttl = vec![
        attempt("r1", 0, "t1", "k", 0, 300, Outcome::GaveUp { reset: true }),
        attempt("r4", 1, "t1", "k", 60_000, 60_100, fresh(200, 4)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, None),
        exec(4, "r4", "t1", "k", 60_010, 200, None),
    ];
    let f = check(&params(), &after_ttl, &execs, &no_counters());
    assert!(f.violations.is_empty(), "{:#?}", f.violations);
    assert_eq!(f.again_after_expiry, 1);
}

#[test]
fn a_reset_upstream_does_not_release_but_other_stores_and_tenants_are_separate() {
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 300, answered(504, false, None, 0)),
        attempt("r2", 0, "t1", "k", 400, 500, fresh(200, 2)),
        attempt("r3", 2, "t1", "k", 400, 500, fresh(200, 3)),
        attempt("r4", 0, "t2", "k", 400, 500, fresh(200, 4)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, Some(UpstreamFault::Reset)),
        exec(2, "r2", "t1", "k", 410, 200, None),
        exec(3, "r3", "t1", "k", 410, 200, None),
        exec(4, "r4", "t2", "k", 410, 200, None),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::AtMostOnce], "{:#?}", f.violations);
    assert!(f.violations[0].what.contains("etcd store tenant t1"));
}

#[test]
fn an_execution_after_a_replay_is_flagged_even_past_the_timeout() {
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 50, fresh(200, 1)),
        attempt("r2", 1, "t1", "k", 100, 120, replay(200, 1)),
        attempt("r3", 1, "t1", "k", 9000, 9100, fresh(200, 3)),
    ];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 200, None),
        exec(3, "r3", "t1", "k", 9010, 200, None),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    // Within the TTL of the first: flagged as a second execution, and as one after a
    // client was answered from the completed record.
    assert!(
        rules(&f).iter().all(|r| *r == Rule::AtMostOnce) && !f.violations.is_empty(),
        "{:#?}",
        f.violations
    );
    assert!(
        f.violations
            .iter()
            .any(|v| v.what.contains("completed record")),
        "{:#?}",
        f.violations
    );
}

#[test]
fn another_tenants_or_payloads_response_is_flagged() {
    let mut other_payload = attempt("r3", 0, "t1", "k", 200, 220, replay(200, 1));
    other_payload.payload = 8;
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 50, fresh(200, 1)),
        attempt("r2", 1, "t2", "k", 100, 120, replay(200, 1)),
        other_payload,
    ];
    let execs = vec![exec(1, "r1", "t1", "k", 10, 200, None)];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(
        rules(&f),
        vec![Rule::RightResponse, Rule::RightResponse],
        "{:#?}",
        f.violations
    );
    assert!(f.violations[0].what.contains("tenant"));
    assert!(f.violations[1].what.contains("payload"));
}

#[test]
fn a_replay_that_differs_or_replays_a_5xx_or_a_cut_answer_is_flagged() {
    let atts = vec![
        attempt("r1", 0, "t1", "k1", 0, 50, fresh(201, 1)),
        attempt(
            "r2",
            0,
            "t1",
            "k1",
            60,
            70,
            answered(201, true, Some(1), 999),
        ),
        attempt("r3", 0, "t1", "k2", 0, 50, fresh(503, 2)),
        attempt("r4", 0, "t1", "k2", 60, 70, replay(503, 2)),
        attempt("r5", 0, "t1", "k3", 0, 50, Outcome::Failed("cut".into())),
        attempt("r6", 0, "t1", "k3", 60, 70, replay(200, 3)),
    ];
    let mut e1 = exec(1, "r1", "t1", "k1", 10, 201, None);
    e1.body_hash = 100;
    let execs = vec![
        e1,
        exec(2, "r3", "t1", "k2", 10, 503, None),
        exec(3, "r5", "t1", "k3", 10, 200, Some(UpstreamFault::Cut)),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    let whats: Vec<&str> = f.violations.iter().map(|v| v.what.as_str()).collect();
    assert_eq!(rules(&f), vec![Rule::Replay; 3], "{whats:#?}");
}

#[test]
fn bad_keys_must_get_400_and_never_execute() {
    let mut missing = attempt("r1", 0, "t1", "k", 0, 10, fresh(200, 1));
    missing.form = KeyForm::Missing;
    missing.key = None;
    let mut long = attempt("r2", 0, "t1", "k", 0, 10, answered(400, false, None, 0));
    long.form = KeyForm::TooLong;
    let mut e = exec(1, "r1", "t1", "k", 5, 200, None);
    e.keys.clear();
    let f = check(&params(), &[missing, long], &[e], &no_counters());
    assert_eq!(
        rules(&f),
        vec![Rule::BadKey, Rule::BadKey],
        "{:#?}",
        f.violations
    );
}

#[test]
fn one_attempt_executed_twice_and_unknown_executions_are_flagged() {
    let atts = vec![attempt("r1", 0, "t1", "k", 0, 50, fresh(200, 2))];
    let execs = vec![
        exec(1, "r1", "t1", "k", 10, 503, None),
        exec(2, "r1", "t1", "k", 30, 200, None),
        exec(3, "nobody", "t1", "k", 30, 200, None),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert!(f
        .violations
        .iter()
        .any(|v| v.what.contains("reached the upstream 2 times")));
    assert!(f
        .violations
        .iter()
        .any(|v| v.what.contains("no recorded request")));
}

#[test]
fn counters_must_agree_within_what_the_history_cannot_see() {
    let atts = vec![
        attempt("r1", 0, "t1", "k", 0, 50, fresh(200, 1)),
        attempt("r2", 0, "t1", "k", 60, 70, replay(200, 1)),
        attempt("r3", 0, "t1", "j", 60, 70, Outcome::GaveUp { reset: false }),
    ];
    let execs = vec![exec(1, "r1", "t1", "k", 10, 200, None)];
    let counters = |executed: u64, replayed: u64, failed_open: u64| {
        let mut c = ProxyCounters::default();
        for (k, v) in [
            ("requests", 3),
            ("executed", executed),
            ("replayed", replayed),
            ("failed_open", failed_open),
        ] {
            c.totals.insert(k.into(), v);
        }
        vec![c, ProxyCounters::default(), ProxyCounters::default()]
    };
    // r3 may have been executed by the proxy but not reached the upstream yet.
    let f = check(&params(), &atts, &execs, &counters(2, 1, 0));
    assert!(f.violations.is_empty(), "{:#?}", f.violations);
    let f = check(&params(), &atts, &execs, &counters(3, 1, 0));
    assert_eq!(rules(&f), vec![Rule::Counters], "{:#?}", f.violations);
    let f = check(&params(), &atts, &execs, &counters(1, 0, 1));
    assert_eq!(rules(&f), vec![Rule::Counters; 2], "{:#?}", f.violations);
}

/// An ordered delivery of `version` of entity `e` (key `e-v<version>`).
fn delivery(
    id: &str,
    proxy: usize,
    e: &str,
    version: i64,
    start: u64,
    end: u64,
    outcome: Outcome,
) -> Attempt {
    let mut a = attempt(
        id,
        proxy,
        "ord",
        &format!("{e}-v{version}"),
        start,
        end,
        outcome,
    );
    a.ordered = Some((e.into(), version));
    a
}

/// Its execution, arrived at `arrived`, its status line 10 ms later.
fn ordered_exec(order: u64, id: &str, e: &str, version: i64, arrived: u64, status: u16) -> Exec {
    let mut x = exec(
        order,
        id,
        "ord",
        &format!("{e}-v{version}"),
        arrived,
        status,
        None,
    );
    x.entity = Some(e.into());
    x.version = Some(version);
    x
}

/// A stale answer naming the applied version (`409 stale-version`, or acknowledged).
fn stale(applied: i64, acknowledged: bool) -> Outcome {
    Outcome::Answered(Answer {
        status: if acknowledged { 200 } else { 409 },
        replayed: false,
        order_id: None,
        body_hash: 0,
        problem: (!acknowledged).then(|| "stale-version".into()),
        retry_after: None,
        stale: acknowledged,
        applied_version: Some(applied),
    })
}

fn keeping(keeps_unknown: bool) -> Params {
    Params {
        keeps_unknown,
        ..params()
    }
}

#[test]
fn ordered_versions_in_order_with_stale_ones_refused_and_releases_pass() {
    // v1 runs; v3 runs; v2 arrives late: refused stale (applied 3), on etcd and
    // acknowledged on shared data; v5 gets a 503 (released), then v4 runs below it, then
    // v5 again; another entity and another store are separate histories.
    let atts = vec![
        delivery("r1", 0, "e", 1, 0, 50, fresh(200, 1)),
        delivery("r2", 1, "e", 3, 100, 150, fresh(201, 2)),
        delivery("r3", 0, "e", 2, 200, 210, stale(3, false)),
        delivery("r4", 1, "e", 2, 220, 230, stale(3, false)),
        delivery("r5", 0, "e", 5, 300, 350, fresh(503, 3)),
        delivery("r6", 1, "e", 4, 400, 450, fresh(200, 4)),
        delivery("r7", 0, "e", 5, 500, 550, fresh(200, 5)),
        delivery("r8", 0, "f", 1, 600, 650, fresh(200, 6)),
        delivery("r9", 2, "e", 1, 600, 650, fresh(200, 7)),
        delivery("r10", 2, "e", 1, 700, 710, stale(1, true)),
        delivery("r11", 1, "e", 5, 800, 810, replay(200, 5)),
    ];
    let execs = vec![
        ordered_exec(1, "r1", "e", 1, 10, 200),
        ordered_exec(2, "r2", "e", 3, 110, 201),
        ordered_exec(3, "r5", "e", 5, 310, 503),
        ordered_exec(4, "r6", "e", 4, 410, 200),
        ordered_exec(5, "r7", "e", 5, 510, 200),
        ordered_exec(6, "r8", "f", 1, 610, 200),
        ordered_exec(7, "r9", "e", 1, 610, 200),
    ];
    for keep in [true, false] {
        let f = check(&keeping(keep), &atts, &execs, &no_counters());
        assert!(f.violations.is_empty(), "{:#?}", f.violations);
        assert_eq!(f.ordered_execs, 7);
    }
    // The stale answers are counted against the proxies' `stale` counters.
    let f = check(&params(), &atts, &execs, &no_counters());
    assert!(f.completions >= 4, "{}", f.completions);
}

#[test]
fn a_stale_version_executed_after_a_newer_one_completed_is_flagged() {
    // v2 completed (its client got 200), then v1 reached the upstream.
    let atts = vec![
        delivery("r1", 0, "e", 2, 0, 50, fresh(200, 1)),
        delivery("r2", 1, "e", 1, 100, 150, fresh(200, 2)),
    ];
    let execs = vec![
        ordered_exec(1, "r1", "e", 2, 10, 200),
        ordered_exec(2, "r2", "e", 1, 110, 200),
    ];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::StaleVersion], "{:#?}", f.violations);
    let v = &f.violations[0];
    assert!(
        v.what.contains("entity e: version 1") && v.what.contains("after version 2"),
        "{}",
        v.what
    );
    assert!(
        v.excerpt.iter().any(|l| l.contains("r1")) && v.excerpt.iter().any(|l| l.contains("r2"))
    );

    // The same version again under another key: at or above counts.
    let mut again = ordered_exec(2, "r2", "e", 2, 110, 200);
    again.keys = vec!["other".into()];
    let mut r2 = delivery("r2", 1, "e", 2, 100, 150, fresh(200, 2));
    r2.key = Some("other".into());
    let f = check(
        &params(),
        &[atts[0].clone(), r2],
        &[execs[0].clone(), again],
        &no_counters(),
    );
    assert_eq!(rules(&f), vec![Rule::StaleVersion], "{:#?}", f.violations);
}

#[test]
fn what_proves_a_completion_depends_on_on_unknown_outcome() {
    // v2 ran and the upstream answered 200, but its client hung up (outcome unknown);
    // v1 ran later. Under "keep" the entity is held for the TTL after an unknown
    // outcome, so v1 cannot run: flagged. Under "release" or "hold" the flight may
    // end without v2's completion: legal.
    let atts = vec![
        delivery("r1", 0, "e", 2, 0, 5, Outcome::GaveUp { reset: true }),
        delivery("r2", 1, "e", 1, 100, 150, fresh(200, 2)),
    ];
    let execs = vec![
        ordered_exec(1, "r1", "e", 2, 3, 200),
        ordered_exec(2, "r2", "e", 1, 110, 200),
    ];
    let f = check(&keeping(true), &atts, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::StaleVersion], "{:#?}", f.violations);
    assert!(f.violations[0].excerpt[0].contains("execution answered a stored status"));
    let f = check(&keeping(false), &atts, &execs, &no_counters());
    assert!(f.violations.is_empty(), "{:#?}", f.violations);

    // A client told applied version 2 proves it under any setting, against requests
    // begun after that answer; one begun before it may still have been on its way.
    let mut told = atts.clone();
    told.push(delivery("r3", 2, "e", 1, 60, 70, stale(2, false)));
    for r in told.iter_mut().filter(|a| a.request_id != "r1") {
        r.proxy = 0;
        r.domain = Domain::Etcd;
    }
    let f = check(&keeping(false), &told, &execs, &no_counters());
    assert_eq!(rules(&f), vec![Rule::StaleVersion], "{:#?}", f.violations);
    assert!(f.violations[0].excerpt[0].contains("applied version 2"));
    told[1].start = ms(50);
    let f = check(&keeping(false), &told, &execs, &no_counters());
    assert!(f.violations.is_empty(), "{:#?}", f.violations);

    // A store that evicted entities may legally forget an applied version.
    let mut evicted = ProxyCounters::default();
    evicted.totals.insert("entities_evicted".into(), 1);
    let counters = vec![evicted, ProxyCounters::default(), ProxyCounters::default()];
    let f = check(&keeping(true), &atts, &execs, &counters);
    assert!(
        !rules(&f).contains(&Rule::StaleVersion),
        "{:#?}",
        f.violations
    );
}

#[test]
fn two_versions_of_an_entity_at_the_upstream_at_once_are_flagged() {
    // v1 is still running (its status line at 1.01 s) when v2 arrives.
    let mut slow = ordered_exec(1, "r1", "e", 1, 10, 503);
    slow.head_sent = Some(ms(1010));
    let atts = vec![
        delivery("r1", 0, "e", 1, 0, 1050, fresh(503, 1)),
        delivery("r2", 1, "e", 2, 400, 450, fresh(200, 2)),
    ];
    let execs = vec![slow.clone(), ordered_exec(2, "r2", "e", 2, 410, 200)];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(
        rules(&f),
        vec![Rule::OneVersionInFlight],
        "{:#?}",
        f.violations
    );
    assert!(f.violations[0].what.contains("still running"));
    // Under "release" the flight may end while the upstream still runs it.
    let f = check(&keeping(false), &atts, &execs, &no_counters());
    assert!(f.violations.is_empty(), "{:#?}", f.violations);

    // After a reset without an answer (outcome unknown) the entity is held: v2 later.
    let mut reset = ordered_exec(1, "r1", "e", 1, 10, 200);
    reset.fault = Some(UpstreamFault::Reset);
    reset.head_sent = None;
    let atts = vec![
        delivery("r1", 0, "e", 1, 0, 50, answered(503, false, None, 0)),
        delivery("r2", 1, "e", 2, 4000, 4050, fresh(200, 2)),
    ];
    let execs = vec![reset, ordered_exec(2, "r2", "e", 2, 4010, 200)];
    let f = check(&params(), &atts, &execs, &no_counters());
    assert_eq!(
        rules(&f),
        vec![Rule::OneVersionInFlight],
        "{:#?}",
        f.violations
    );
    assert!(f.violations[0].what.contains("reset without an answer"));
    // Once its 503 was written, v1's flight is released: v2 may run.
    slow.head_sent = Some(ms(300));
    let atts = vec![
        delivery("r1", 0, "e", 1, 0, 350, fresh(503, 1)),
        delivery("r2", 1, "e", 2, 400, 450, fresh(200, 2)),
    ];
    let f = check(
        &params(),
        &atts,
        &[slow, ordered_exec(2, "r2", "e", 2, 410, 200)],
        &no_counters(),
    );
    assert!(f.violations.is_empty(), "{:#?}", f.violations);
}
