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

// ---------- configuration bounds: each documented end is inside, one past it outside ----------

#[test]
fn every_documented_range_includes_its_ends() {
    let ok = |json: &str| {
        Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
    };
    let refused = |json: &str, field: &str| {
        assert_eq!(cfg_err(json).0, field, "{json}");
    };
    for (field, low, high) in [
        ("ttl_seconds", 1u64, 31_536_000u64),
        ("in_flight_timeout_seconds", 1, 86_400),
        ("retry_after_seconds", 0, 3600),
        ("capacity", 16, 10_000_000),
        ("max_body_bytes", 0, 64 << 20),
        ("max_replay_body_bytes", 0, 16 << 20),
    ] {
        ok(&format!(r#"{{"{field}": {low}}}"#));
        ok(&format!(r#"{{"{field}": {high}}}"#));
        refused(&format!(r#"{{"{field}": {}}}"#, high + 1), field);
        if low > 0 {
            refused(&format!(r#"{{"{field}": {}}}"#, low - 1), field);
        }
    }
    let c = Config::parse(br#"{"ttl_seconds": 31536000, "capacity": 16}"#).unwrap();
    assert_eq!((c.ttl_ms, c.capacity), (31_536_000_000, 16));
    ok(r#"{"key": {"max_length": 4096}}"#);
    refused(r#"{"key": {"max_length": 4097}}"#, "key.max_length");
    let etcd = |extra: &str| format!(r#"{{"store": {{"kind": "etcd", "cluster": "e"{extra}}}}}"#);
    ok(&etcd(r#", "timeout_ms": 10"#));
    ok(&etcd(r#", "timeout_ms": 60000"#));
    refused(&etcd(r#", "timeout_ms": 60001"#), "store.timeout_ms");
    ok(&etcd(r#", "max_record_bytes": 67108864"#));
    refused(
        &etcd(r#", "max_record_bytes": 4095"#),
        "store.max_record_bytes",
    );
}

#[test]
fn header_lists_hold_up_to_16_names() {
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("\"x-h{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for field in ["key", "scope"] {
        let json = |n| format!(r#"{{"{field}": {{"headers": [{}]}}}}"#, names(n));
        Config::parse(json(16).as_bytes()).unwrap();
        assert_eq!(cfg_err(&json(17)).0, format!("{field}.headers"));
    }
}

#[test]
fn the_etcd_record_limit_defaults_to_1_mib_and_must_fit_the_replay_cap() {
    let c = Config::parse(br#"{"store": {"kind": "etcd", "cluster": "e"}}"#).unwrap();
    let crate::config::StoreConfig::Etcd(ec) = &c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(ec.max_record_bytes, 1 << 20);
    // The replay cap may use all the room the record's own bytes leave, not one more.
    let room = 4096 * 4 + 100 - crate::config::RECORD_OVERHEAD_BYTES;
    let json = |cap: usize| {
        format!(
            r#"{{"max_replay_body_bytes": {cap}, "store": {{"kind": "etcd", "cluster": "e", "max_record_bytes": {}}}}}"#,
            4096 * 4 + 100
        )
    };
    Config::parse(json(room).as_bytes()).unwrap();
    assert_eq!(cfg_err(&json(room + 1)).0, "max_replay_body_bytes");
}

#[test]
fn store_names_are_checked_at_both_ends() {
    let ns = |n: &str| format!(r#"{{"store": {{"namespace": "{n}"}}}}"#);
    Config::parse(ns(&"n".repeat(64)).as_bytes()).unwrap();
    for bad in ["".to_string(), "n".repeat(65), "a/b".into(), "a b".into()] {
        assert_eq!(cfg_err(&ns(&bad)).0, "store.namespace", "{bad:?}");
    }
    let etcd = |extra: &str| format!(r#"{{"store": {{"kind": "etcd"{extra}}}}}"#);
    assert_eq!(cfg_err(&etcd(r#", "cluster": """#)).0, "store.cluster");
    Config::parse(etcd(r#", "cluster": "c", "authority": "etcd.local""#).as_bytes()).unwrap();
    for bad in ["", "a b", "a\\u0001"] {
        let json = etcd(&format!(r#", "cluster": "c", "authority": "{bad}""#));
        assert_eq!(cfg_err(&json).0, "store.authority", "{bad:?}");
    }
    let prefix = |p: &str| etcd(&format!(r#", "cluster": "c", "prefix": "{p}""#));
    Config::parse(prefix(&"p".repeat(128)).as_bytes()).unwrap();
    for bad in ["".to_string(), "p".repeat(129), "a\\u0007".into()] {
        assert_eq!(cfg_err(&prefix(&bad)).0, "store.prefix", "{bad:?}");
    }
}

// ---------- request identity ----------

#[test]
fn a_short_content_type_is_not_grpc() {
    let p = plugin("{}");
    let (_, mut env) = world();
    for ct in ["text/plain", "application/grp", ""] {
        let r = req("POST", "/o")
            .key(&format!("k-{ct}"))
            .header("content-type", ct);
        assert!(matches!(
            run(&p, &mut env, &r, ok("a")),
            Outcome::Upstream(..)
        ));
        assert_eq!(run(&p, &mut env, &r, ok("b")).local().body, b"a", "{ct:?}");
    }
    assert_eq!(env.count_of(Counter::Bypassed), 0);
}

#[test]
fn the_query_is_part_of_the_payload_and_of_a_query_fingerprint() {
    let (_, mut env) = world();
    let p = plugin("{}");
    assert!(matches!(
        run(&p, &mut env, &req("POST", "/o?a=1").key("k"), ok("a")),
        Outcome::Upstream(..)
    ));
    let o = run(&p, &mut env, &req("POST", "/o?a=2").key("k"), ok("no"));
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:payload-mismatch");
    // Keyless: only the query differs, and it is a configured part.
    let p = plugin(r#"{"key": {"fingerprint": ["path", "query"]}, "store": {"namespace": "fp"}}"#);
    for q in ["/f?x=1", "/f?x=2"] {
        assert!(matches!(
            run(&p, &mut env, &req("POST", q), ok(q)),
            Outcome::Upstream(..)
        ));
    }
    assert_eq!(
        run(&p, &mut env, &req("POST", "/f?x=2"), ok("no"))
            .local()
            .body,
        b"/f?x=2"
    );
}

#[test]
fn authority_as_a_named_header_separates_hosts() {
    // Without scope.authority, naming :authority in the fingerprint still tells hosts apart.
    let p = plugin(
        r#"{"scope": {"authority": false}, "key": {"fingerprint": ["header::authority", "body"]}}"#,
    );
    let (_, mut env) = world();
    let mut one = req("POST", "/x").body("same");
    one.head.authority = "one.example".into();
    let mut two = one.clone();
    two.head.authority = "two.example".into();
    assert!(matches!(
        run(&p, &mut env, &one, ok("one")),
        Outcome::Upstream(..)
    ));
    assert!(matches!(
        run(&p, &mut env, &two, ok("two")),
        Outcome::Upstream(..)
    ));
    assert_eq!(run(&p, &mut env, &two, ok("no")).local().body, b"two");
}

#[test]
fn a_json_key_that_is_absent_passes_unless_keys_are_required() {
    let (_, mut env) = world();
    let p = plugin(r#"{"key": {"json_pointer": "/id"}}"#);
    let r = req("POST", "/o").body(r#"{"other": 1}"#);
    assert!(matches!(
        run(&p, &mut env, &r, ok("a")),
        Outcome::Upstream(..)
    ));
    assert!(matches!(
        run(&p, &mut env, &r, ok("b")),
        Outcome::Upstream(..)
    ));
    assert_eq!(env.count_of(Counter::Bypassed), 2);
    let p = plugin(r#"{"key": {"json_pointer": "/id", "required": true}}"#);
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 400);
}

// ---------- what the glue asks the stream ----------

#[test]
fn the_stream_says_when_it_wants_bodies() {
    let p = plugin(r#"{"max_replay_body_bytes": 4}"#);
    let (_, mut env) = world();
    let mut s = DedupStream::new(1);
    let head = req("POST", "/o").key("k").head;
    assert_eq!(
        s.on_request_headers(&p, &mut env, head, false),
        Action::Pause
    );
    assert!(s.reading_request());
    assert_eq!(
        s.on_request_body(&p, &mut env, 2, true, || Some(b"{}".to_vec())),
        Action::Continue
    );
    assert!(!s.reading_request());
    assert!(s.holds_claim());
    let pairs = || vec![(":status".to_string(), b"200".to_vec())];
    assert_eq!(
        s.on_response_headers(&p, &mut env, 200, &Origin::upstream(), pairs, false),
        None
    );
    assert!(s.wants_response_body() && s.capture_within_cap());
    assert_eq!(s.on_response_body(&p, &mut env, b"12345", false), None);
    // Over the cap: still completing (it executed), no longer worth buffering.
    assert!(s.wants_response_body() && !s.capture_within_cap());
    // Trailers end the response: completed, not kept.
    assert_eq!(s.on_response_trailers(&p, &mut env), None);
    assert!(!s.wants_response_body() && !s.holds_claim());
    let dup = run(
        &p,
        &mut env,
        &req("POST", "/o").key("k").body("{}"),
        ok("no"),
    );
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
}

#[test]
fn trailers_complete_a_captured_response() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    let mut s = send(&p, &mut env, &r).unwrap();
    let pairs = || vec![(":status".to_string(), b"201".to_vec())];
    assert_eq!(
        s.on_response_headers(&p, &mut env, 201, &Origin::upstream(), pairs, false),
        None
    );
    assert_eq!(s.on_response_body(&p, &mut env, b"made", false), None);
    assert_eq!(s.on_response_trailers(&p, &mut env), None);
    let replay = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        (replay.status(), &replay.local().body[..]),
        (201, &b"made"[..])
    );
}

#[test]
fn an_unreadable_response_body_completes_without_keeping_it() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let r = req("POST", "/o").key("k");
    let mut s = send(&p, &mut env, &r).unwrap();
    let pairs = || vec![(":status".to_string(), b"200".to_vec())];
    assert_eq!(
        s.on_response_headers(&p, &mut env, 200, &Origin::upstream(), pairs, false),
        None
    );
    s.on_response_body_unreadable();
    assert!(!s.capture_within_cap());
    assert_eq!(s.on_response_body(&p, &mut env, b"rest", true), None);
    let dup = run(&p, &mut env, &r, ok("no"));
    assert_eq!(
        dup.problem_type(),
        "urn:proxy-dedup:problem:response-not-stored"
    );
    assert_eq!(env.count_of(Counter::Executed), 1);
}
