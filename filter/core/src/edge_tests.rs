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

// ---------- the outcome classifier: every flag on its own ----------

#[test]
fn each_flag_alone_decides_as_the_contract_table_says() {
    use crate::outcome::{classify, flags as f, Outcome as O};
    let unknown = [
        f::UT,
        f::LR,
        f::UR,
        f::UC,
        f::DC,
        f::URX,
        f::SI,
        f::DPE,
        f::UMSDR,
        f::DT,
        f::UPE,
        f::DR,
    ];
    let not_sent = [
        f::LH,
        f::UH,
        f::UF,
        f::UO,
        f::NR,
        f::FI,
        f::RL,
        f::UAEX,
        f::RLSE,
        f::IH,
        f::NFCF,
        f::NC,
        f::OM,
        f::DF,
        f::DO,
        f::UDO,
    ];
    for bit in unknown {
        // A flag that leaves the execution open wins over details that alone would
        // say "a filter answered", and over a flag that says "never sent".
        assert_eq!(classify("some_filter_reply", bit), O::Unknown, "{bit:#x}");
        assert_eq!(
            classify("some_filter_reply", bit | f::UH),
            O::Unknown,
            "{bit:#x}"
        );
        assert_eq!(classify("via_upstream", bit), O::Upstream, "{bit:#x}");
    }
    for bit in not_sent {
        // A flag that proves the request was never sent wins over details that alone
        // would leave it open.
        assert_eq!(
            classify("upstream_something", bit),
            O::NotExecuted,
            "{bit:#x}"
        );
        assert_eq!(classify("", bit), O::NotExecuted, "{bit:#x}");
    }
    // Flags Envoy sets that prove nothing either way: the details decide.
    for bit in [f::DI, f::RFCF] {
        assert_eq!(
            classify("some_filter_reply", bit),
            O::NotExecuted,
            "{bit:#x}"
        );
        assert_eq!(classify("upstream_something", bit), O::Unknown, "{bit:#x}");
    }
    // Each word that points at a possible execution, alone in the details.
    for word in [
        "upstream",
        "downstream",
        "timeout",
        "reset",
        "disconnect",
        "response_",
        "codec",
        "protocol",
        "duration",
    ] {
        assert_eq!(classify(&format!("x_{word}_y"), 0), O::Unknown, "{word}");
    }
    for reason in [
        "connection_failure",
        "connection_timeout",
        "overflow",
        "refused_stream",
    ] {
        let d = format!("upstream_reset_before_response_started{{{reason}}}");
        assert_eq!(classify(&d, 0), O::NotExecuted, "{reason}");
    }
}

// ---------- the local tier's bounds ----------

mod tier {
    use crate::local::{LocalEntry, LocalTier, MAX_AGE_MS, MAX_BYTES, MAX_ENTRIES};
    use crate::response::StoredResponse;

    fn d(i: usize) -> [u8; 32] {
        let mut x = [0u8; 32];
        x[..8].copy_from_slice(&(i as u64).to_be_bytes());
        x
    }

    fn entry(body: usize, header: usize, expires_ms: u64) -> LocalEntry {
        LocalEntry {
            payload: [1; 32],
            expires_ms,
            response: Some(StoredResponse {
                status: 200,
                headers: vec![("x-h".into(), vec![b'v'; header])],
                body: vec![b'b'; body],
            }),
        }
    }

    /// What an entry costs, as the tier documents it: 96 bytes, the body, and each
    /// header's name and value plus 16.
    fn cost(body: usize, header: usize) -> usize {
        96 + body + (3 + header + 16)
    }

    const NOW: u64 = 1_000_000;
    const LIVE: u64 = NOW + 1_000;

    #[test]
    fn entries_are_answered_until_they_expire_or_age_out() {
        let mut t = LocalTier::default();
        assert!(t.is_empty());
        t.insert(d(1), entry(10, 5, LIVE), NOW);
        assert!(!t.is_empty());
        assert_eq!((t.len(), t.bytes()), (1, cost(10, 5)));
        assert_eq!(
            t.get(&d(1), LIVE - 1).map(|e| e.response.is_some()),
            Some(true)
        );
        assert!(t.get(&d(1), LIVE).is_none());
        assert_eq!((t.len(), t.bytes()), (0, 0));
        // A long TTL is answered for MAX_AGE_MS at most.
        t.insert(d(2), entry(0, 0, NOW + 3_600_000), NOW);
        assert!(t.get(&d(2), NOW + MAX_AGE_MS - 1).is_some());
        assert!(t.get(&d(2), NOW + MAX_AGE_MS).is_none());
        // Completed without a response: the fixed cost only.
        let bare = LocalEntry {
            payload: [0; 32],
            expires_ms: LIVE,
            response: None,
        };
        t.insert(d(3), bare, NOW);
        assert_eq!(t.bytes(), 96);
    }

    #[test]
    fn replacing_an_entry_counts_its_bytes_once() {
        let mut t = LocalTier::default();
        t.insert(d(1), entry(1_000, 10, LIVE), NOW);
        t.insert(d(1), entry(50, 10, LIVE), NOW);
        assert_eq!((t.len(), t.bytes()), (1, cost(50, 10)));
    }

    #[test]
    fn an_entry_above_a_sixteenth_of_the_bytes_is_not_kept() {
        let mut t = LocalTier::default();
        let at_cap = MAX_BYTES / 16 - cost(0, 0);
        t.insert(d(1), entry(at_cap, 0, LIVE), NOW);
        assert_eq!(t.bytes(), MAX_BYTES / 16);
        t.insert(d(2), entry(at_cap + 1, 0, LIVE), NOW);
        assert!(t.get(&d(2), NOW).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_full_tier_drops_expired_entries_before_live_ones() {
        let mut t = LocalTier::default();
        for i in 0..MAX_ENTRIES {
            // Every other entry expires at NOW + 10.
            let exp = if i % 2 == 0 { NOW + 10 } else { LIVE };
            t.insert(d(i), entry(0, 0, exp), NOW);
        }
        assert_eq!(t.len(), MAX_ENTRIES);
        t.insert(d(MAX_ENTRIES), entry(0, 0, LIVE), NOW + 10);
        assert_eq!(t.len(), MAX_ENTRIES / 2 + 1);
        for i in (1..MAX_ENTRIES).step_by(2) {
            assert!(
                t.get(&d(i), NOW + 10).is_some(),
                "live entry {i} was dropped"
            );
        }
        assert_eq!(t.bytes(), t.len() * cost(0, 0));
    }

    #[test]
    fn a_full_tier_of_live_entries_makes_room_for_the_new_one() {
        let mut t = LocalTier::default();
        for i in 0..=MAX_ENTRIES {
            t.insert(d(i), entry(0, 0, LIVE), NOW);
        }
        assert_eq!(t.len(), MAX_ENTRIES);
        assert!(t.get(&d(MAX_ENTRIES), NOW).is_some());
        assert_eq!(t.bytes(), MAX_ENTRIES * cost(0, 0));
    }

    #[test]
    fn the_tier_never_holds_more_than_its_bytes() {
        let mut t = LocalTier::default();
        let body = MAX_BYTES / 16 - cost(0, 0);
        let mut inserted = 0;
        for i in 0..40 {
            t.insert(d(i), entry(body, 0, LIVE), NOW);
            inserted += 1;
            assert!(
                t.bytes() <= MAX_BYTES,
                "{} bytes after {inserted}",
                t.bytes()
            );
            assert!(t.get(&d(i), NOW).is_some(), "the newest entry is kept");
        }
        // Exactly 16 such entries fit.
        assert_eq!(t.len(), 16);
        assert_eq!(t.bytes(), MAX_BYTES);
    }
}

// ---------- counters, callouts ----------

#[test]
fn counters_have_distinct_documented_names_and_their_own_index() {
    let names: std::collections::HashSet<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(names.len(), Counter::ALL.len());
    for (i, c) in Counter::ALL.iter().enumerate() {
        assert!(c.name().starts_with("proxy_dedup_"), "{c:?}");
        assert_eq!(c.index(), i, "{c:?}");
    }
    assert_eq!(Counter::Executed.name(), "proxy_dedup_executed");
}

#[test]
fn a_pending_callout_is_found_until_answered() {
    use crate::callouts::{Callout, Callouts};
    let mut t = Callouts::new();
    assert!(t.is_empty());
    t.register(4, 1, Some(9));
    assert!(!t.is_empty());
    let want = Some(Callout {
        root: 1,
        owner: Some(9),
    });
    assert_eq!(t.get(4), want);
    assert_eq!(t.get(4), want, "get does not take it");
    assert_eq!(t.take(4), want);
    assert_eq!(t.get(4), None);
    assert!(t.is_empty());
}

// ---------- etcd leases answered late ----------

#[test]
fn etcd_a_lease_grant_answered_late_never_shortens_the_claims_made_with_it() {
    // The worker uses a lease for claims during one window. Counted from when the grant
    // was answered, a grant answered late (up to the attempt timeout) lets claims use a
    // lease that ends before their in-flight time.
    let p = etcd_plugin(r#""in_flight_timeout_seconds": 5"#);
    let (mut a, mut b) = two_proxies();
    let t0 = a.now_ms;
    let mut first = DedupStream::new(1);
    let mut action = first.on_request_headers(&p, &mut a, req("POST", "/o").key("k0").head, true);
    // etcd grants the in-flight lease at t0; the answer reaches the worker 999 ms later
    // (within the attempt timeout).
    let Action::Call(grant) = action else {
        panic!("{action:?}")
    };
    assert_eq!(grant.path, crate::etcd::LEASE_GRANT_PATH);
    let granted = call(&a, &grant);
    a.now_ms = t0 + 999;
    action = first.on_store_answer(&p, &mut a, granted);
    assert_eq!(settle(&p, &mut a, &mut first, action), Action::Continue);
    // Another request on the same worker, just inside the lease's window.
    a.now_ms = t0 + 1_998;
    let r = req("POST", "/o").key("k1");
    let second = send(&p, &mut a, &r).unwrap();
    let forwarded_at = a.now_ms;
    // Until 5 s after that claim, the key is in flight on every proxy.
    b.now_ms = forwarded_at + 4_999;
    let dup = run(&p, &mut b, &r, ok("twice"));
    assert_eq!(
        dup.status(),
        409,
        "the claim made at t+1998 ended early: {dup:?}"
    );
    drop((first, second));
}
