//! Edge cases found by the model-based test (`model.rs`) and behaviours the mutation
//! run (`make mutants`) showed no test asserting. A child of `tests`: same helpers.

use super::*;

#[test]
fn a_late_completion_under_an_old_layout_never_answers_for_the_key_run_again() {
    // Found by the model: a claim under the old configuration expires, the key runs
    // again under the pushed one (another layout) with another body, then the first
    // response comes. Kept, it answered the second request's retries with 422.
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 16, "in_flight_timeout_seconds": 5}"#);
    let new = plugin(r#"{"capacity": 32, "in_flight_timeout_seconds": 5}"#);
    let first = req("POST", "/o").key("k").body("one");
    let stuck = send(&old, &mut env, &first).unwrap();
    env.now_ms += 5_000;
    let second = req("POST", "/o").key("k").body("two");
    let again = send(&new, &mut env, &second).unwrap();
    respond(&old, &mut env, stuck, ok("late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    let dup = run(&old, &mut env, &second, ok("no"));
    assert_eq!(dup.problem_type(), "urn:proxy-dedup:problem:in-flight");
    respond(&new, &mut env, again, ok("two done"));
    assert_eq!(
        run(&old, &mut env, &second, ok("no")).local().body,
        b"two done"
    );
    assert_eq!(
        run(&new, &mut env, &second, ok("no")).local().body,
        b"two done"
    );
    assert_eq!(env.count_of(Counter::Executed), 2);
}

#[test]
fn a_response_after_the_in_flight_timeout_is_not_stored() {
    // The claim ended at its in-flight timeout (as `proxy_dedup_claims_lost` says):
    // a response after it is not kept, whether or not the key ran again meanwhile.
    let p = plugin(r#"{"in_flight_timeout_seconds": 5}"#);
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    let slow = send(&p, &mut env, &r).unwrap();
    env.now_ms += 4_999;
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 409);
    env.now_ms += 1;
    respond(&p, &mut env, slow, ok("too late"));
    assert_eq!(env.count_of(Counter::ClaimsLost), 1);
    assert_eq!(
        run(&p, &mut env, &r, ok("again")),
        Outcome::Upstream(200, b"again".to_vec())
    );
    // Just in time, it is kept.
    let r2 = req("POST", "/o").key("k2");
    let s = send(&p, &mut env, &r2).unwrap();
    env.now_ms += 4_999;
    respond(&p, &mut env, s, ok("in time"));
    assert_eq!(run(&p, &mut env, &r2, ok("no")).local().body, b"in time");
}
