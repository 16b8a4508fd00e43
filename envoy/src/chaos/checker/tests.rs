#![allow(clippy::unwrap_used)]
use super::super::history::Answer;
use super::*;

const TTL: Duration = Duration::from_secs(60);

fn params() -> Params {
    Params {
        ttl: TTL,
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
