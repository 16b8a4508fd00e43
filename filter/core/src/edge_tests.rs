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
    fn a_tier_full_of_bytes_drops_expired_entries_before_live_ones() {
        let mut t = LocalTier::default();
        let body = MAX_BYTES / 16 - cost(0, 0);
        for i in 0..16 {
            let exp = if i % 2 == 0 { NOW + 10 } else { LIVE };
            t.insert(d(i), entry(body, 0, exp), NOW);
        }
        assert_eq!(t.bytes(), MAX_BYTES);
        // Eight more: the eight expired entries make room, no live one is dropped.
        for i in 16..24 {
            t.insert(d(i), entry(body, 0, LIVE), NOW + 10);
        }
        for i in (1..24).filter(|i| i % 2 == 1 || *i >= 16) {
            assert!(
                t.get(&d(i), NOW + 10).is_some(),
                "live entry {i} was dropped"
            );
        }
        assert_eq!(t.bytes(), MAX_BYTES);
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
    assert_eq!(grant.path, crate::etcdpb::LEASE_GRANT);
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
    assert_eq!((c.policy.ttl_ms, c.capacity), (31_536_000_000, 16));
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
    // The replay cap may use all the room the record's own 16384 bytes leave, not one more.
    let room = 4096 * 4 + 100 - 16_384;
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

// ---------- etcd: claim retries, rounds, budgets ----------

fn txn_answer(body: &str) -> CallAnswer {
    CallAnswer {
        status: 200,
        body: body.as_bytes().to_vec(),
    }
}

/// Drives a stream's store calls: grants go to etcd, each claim txn to `txn` (or etcd
/// when it answers `None`). Returns the decision and how many txns `txn` answered.
fn drive(
    p: &Plugin,
    env: &mut FakeEnv,
    s: &mut DedupStream,
    mut action: Action,
    mut txn: impl FnMut(usize) -> Option<CallAnswer>,
) -> (Action, usize) {
    let mut n = 0;
    while let Action::Call(c) = action {
        let a = if crate::etcd::is_txn(c.path) {
            match txn(n) {
                Some(a) => {
                    n += 1;
                    a
                }
                None => call(env, &c),
            }
        } else {
            call(env, &c)
        };
        action = s.on_store_answer(p, env, a);
    }
    (action, n)
}

#[test]
fn etcd_transport_failures_are_retried_four_times_per_call() {
    let p = etcd_plugin(r#""failure_mode": "closed""#);
    let (mut a, _) = two_proxies();
    a.etcd.fail_next(4);
    assert!(matches!(
        run(&p, &mut a, &req("POST", "/o").key("k1"), ok("x")),
        Outcome::Upstream(..)
    ));
    assert_eq!(a.count_of(Counter::StoreErrors), 0);
    let (mut b, _) = two_proxies();
    b.etcd.fail_next(5);
    assert_eq!(
        run(&p, &mut b, &req("POST", "/o").key("k1"), ok("x")).status(),
        503
    );
    assert_eq!(b.count_of(Counter::StoreErrors), 1);
}

#[test]
fn etcd_only_transport_statuses_and_unavailable_are_retried() {
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for (status, body, retried) in [
        (0u16, "", true),
        (502, "", true),
        (503, "", true),
        (504, "upstream request timeout", true),
        (500, "", false),
        (200, "not json", false),
        (
            503,
            r#"{"error":"etcdserver: too many requests","code":8}"#,
            false,
        ),
        (
            503,
            r#"{"error":"etcdserver: leader changed","code":14}"#,
            true,
        ),
    ] {
        let (mut a, _) = two_proxies();
        let mut s = DedupStream::new(1);
        let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
        assert!(matches!(first, Action::Call(_)));
        let next = s.on_store_answer(
            &p,
            &mut a,
            CallAnswer {
                status,
                body: body.as_bytes().to_vec(),
            },
        );
        assert_eq!(
            matches!(next, Action::Call(_)),
            retried,
            "{status} {body:?}: {next:?}"
        );
        if !retried {
            assert!(
                matches!(next, Action::Reply(ref r) if r.status == 503),
                "{next:?}"
            );
        }
    }
}

#[test]
fn etcd_grpc_unavailable_deadline_and_failed_dispatch_are_retried_other_statuses_are_errors() {
    let p = etcd_plugin(r#""failure_mode": "closed""#);
    let status = |code: u32, msg: &str| CallAnswer {
        status: 0,
        body: crate::etcdpb::status_body(code, msg.as_bytes()),
    };
    for (answer, retried) in [
        // Envoy's timeout and reset of a gRPC call.
        (
            status(14, "upstream request timeout{response_timeout}"),
            true,
        ),
        (status(14, "etcdserver: leader changed"), true),
        (status(4, "context deadline exceeded"), true),
        // Not dispatched at all (unknown cluster).
        (
            CallAnswer {
                status: 0,
                body: Vec::new(),
            },
            true,
        ),
        (status(8, "etcdserver: too many requests"), false),
        (status(3, "etcdserver: request is too large"), false),
        (status(2, "unknown"), false),
        // A message that is not a TxnResponse.
        (
            CallAnswer {
                status: 200,
                body: vec![0xff, 0xff],
            },
            false,
        ),
    ] {
        let (mut a, _) = two_proxies();
        let mut s = DedupStream::new(1);
        let mut action = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
        // Leases first (from the fake), up to the claim txn.
        while let Action::Call(c) = &action {
            if crate::etcd::is_txn(c.path) {
                break;
            }
            let ans = call(&a, c);
            action = s.on_store_answer(&p, &mut a, ans);
        }
        assert!(matches!(&action, Action::Call(c) if c.path == crate::etcdpb::TXN));
        let next = s.on_store_answer(&p, &mut a, answer.clone());
        assert_eq!(
            matches!(next, Action::Call(_)),
            retried,
            "{answer:?}: {next:?}"
        );
        if !retried {
            assert!(
                matches!(next, Action::Reply(ref r) if r.status == 503),
                "{next:?}"
            );
        }
    }
}

#[test]
fn etcd_grpc_lease_not_found_on_a_claim_takes_fresh_leases() {
    let p = etcd_plugin(r#""failure_mode": "closed""#);
    let (mut a, _) = two_proxies();
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
    let grants = a.etcd.grants();
    let (decision, n) = drive(&p, &mut a, &mut s, first, |n| {
        (n < 2).then(|| CallAnswer {
            status: 0,
            body: crate::etcdpb::status_body(5, b"etcdserver: requested lease not found"),
        })
    });
    assert_eq!(n, 2);
    assert_eq!(decision, Action::Continue);
    assert!(s.holds_claim());
    assert!(
        a.etcd.grants() - grants >= 4,
        "both leases granted again twice"
    );
}

#[test]
fn etcd_attempts_are_a_third_of_the_budget_and_stop_at_its_end() {
    let p = etcd_plugin(r#""failure_mode": "closed""#); // timeout_ms 500
    let (mut a, _) = two_proxies();
    let t0 = a.now_ms;
    let mut s = DedupStream::new(1);
    let Action::Call(first) =
        s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true)
    else {
        panic!()
    };
    // A third of 500 ms is below the 100 ms floor? No: 166 ms.
    assert_eq!(first.timeout_ms, 166);
    let refused = || CallAnswer {
        status: 503,
        body: Vec::new(),
    };
    a.now_ms = t0 + 400;
    let Action::Call(second) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!()
    };
    assert_eq!(second.timeout_ms, 100, "what is left of the budget");
    a.now_ms = t0 + 499;
    let Action::Call(third) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!()
    };
    assert_eq!(third.timeout_ms, 1);
    a.now_ms = t0 + 500;
    let last = s.on_store_answer(&p, &mut a, refused());
    assert!(
        matches!(last, Action::Reply(ref r) if r.status == 503),
        "{last:?}"
    );
    // The floor: a 150 ms budget still gives an attempt 100 ms, and a 3 s budget 1 s.
    for (budget, slice) in [(150, 100), (3000, 1000)] {
        let p = plugin(&format!(
            r#"{{"store": {{"kind": "etcd", "cluster": "etcd", "timeout_ms": {budget}}}}}"#
        ));
        let mut s = DedupStream::new(2);
        let Action::Call(c) =
            s.on_request_headers(&p, &mut a, req("POST", "/o").key("k2").head, true)
        else {
            panic!()
        };
        assert_eq!(c.timeout_ms, slice, "budget {budget}");
    }
}

#[test]
fn etcd_claim_rounds_are_bounded() {
    // etcd says the compare failed but returns no record (deleted in between): the
    // claim tries again, eight times at most.
    let gone =
        r#"{"header": {"revision": "9"}, "responses": [{"response_range": {"header": {}}}]}"#;
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for (fake, executes) in [(8, true), (9, false)] {
        let (mut a, _) = two_proxies();
        let mut s = DedupStream::new(1);
        let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
        let (decision, n) = drive(&p, &mut a, &mut s, first, |n| {
            (n < fake).then(|| txn_answer(gone))
        });
        assert_eq!(n, fake);
        assert_eq!(
            decision == Action::Continue && s.holds_claim(),
            executes,
            "{fake}: {decision:?}"
        );
    }
}

#[test]
fn etcd_a_lost_lease_is_granted_again_a_bounded_number_of_times() {
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    for lost in [
        r#"{"error": "etcdserver: requested lease not found", "code": 5}"#,
        r#"{"error": "x", "code": 5}"#,
        r#"{"error": "etcdserver: requested lease not found"}"#,
    ] {
        for (fake, executes) in [(8, true), (9, false)] {
            let (mut a, _) = two_proxies();
            let mut s = DedupStream::new(1);
            let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
            let grants = a.etcd.grants();
            let (decision, n) = drive(&p, &mut a, &mut s, first, |n| {
                (n < fake).then(|| txn_answer(lost))
            });
            assert_eq!(n, fake);
            assert_eq!(
                decision == Action::Continue && s.holds_claim(),
                executes,
                "{lost} {fake}"
            );
            // Both leases are granted again after each loss.
            assert!(a.etcd.grants() - grants >= 2 * fake as u32, "{lost}");
        }
    }
}

#[test]
fn etcd_a_claim_whose_answer_was_lost_is_recognised_by_its_token() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(&p, &mut a, r.head.clone(), true);
    let etcd = a.etcd.clone();
    let mut lost_one = false;
    let (decision, _) = drive(&p, &mut a, &mut s, first, |_| {
        // etcd applies the first claim txn; its answer is lost on the way back.
        if !std::mem::replace(&mut lost_one, true) {
            etcd.lose_next_answers(1);
        }
        None
    });
    assert!(lost_one);
    assert_eq!(decision, Action::Continue);
    assert!(s.holds_claim());
    assert_eq!(send(&p, &mut b, &r).unwrap_err().status(), 409);
    respond(&p, &mut a, s, ok("once"));
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"once");
    assert_eq!(
        a.count_of(Counter::Executed) + b.count_of(Counter::Executed),
        1
    );
}

// ---------- etcd: completion, release and hold answers ----------

#[test]
fn etcd_a_completion_is_retried_four_times_then_counted_failed() {
    let p = etcd_plugin("");
    for (failures, confirmed) in [(4, true), (5, false)] {
        let (mut a, mut b) = two_proxies();
        let r = req("POST", "/o").key("k");
        let s = send(&p, &mut a, &r).unwrap();
        a.etcd.fail_next(failures);
        respond(&p, &mut a, s, ok("done"));
        assert_eq!(
            a.count_of(Counter::StoreErrors),
            u64::from(!confirmed),
            "{failures}"
        );
        // Confirmed completions are learned by the worker's tier; failed ones are not.
        a.etcd.set_down(true);
        let local = run(&p, &mut a, &r, ok("through"));
        assert_eq!(
            local.status() == 200 && matches!(local, Outcome::Local(_)),
            confirmed,
            "{local:?}"
        );
        a.etcd.set_down(false);
        let other = run(&p, &mut b, &r, ok("no"));
        if confirmed {
            assert_eq!(other.local().body, b"done");
        } else {
            // The record is still in flight: the key waits for its lease.
            assert_eq!(other.status(), 409);
        }
    }
}

#[test]
fn etcd_a_completion_is_not_retried_past_its_budget() {
    let p = etcd_plugin(""); // timeout_ms 500
    let (mut a, _) = two_proxies();
    let r = req("POST", "/o").key("k");
    let mut s = send(&p, &mut a, &r).unwrap();
    let pairs = || vec![(":status".to_string(), b"200".to_vec())];
    let c = s.on_response_headers(&p, &mut a, 200, &Origin::upstream(), pairs, true);
    let Some(c) = c else {
        panic!("no completion call")
    };
    assert_eq!(c.timeout_ms, 166);
    let refused = || CallAnswer {
        status: 503,
        body: Vec::new(),
    };
    a.now_ms += 499;
    let Action::Call(again) = s.on_store_answer(&p, &mut a, refused()) else {
        panic!("retried within the budget")
    };
    assert_eq!(again.timeout_ms, 1);
    a.now_ms += 1;
    assert_eq!(s.on_store_answer(&p, &mut a, refused()), Action::Continue);
    assert_eq!(a.count_of(Counter::StoreErrors), 1);
}

#[test]
fn etcd_a_completion_whose_lease_etcd_lost_is_written_again_with_a_fresh_lease() {
    let p = etcd_plugin("");
    let lost = || CallAnswer {
        status: 0,
        body: crate::etcdpb::status_body(5, b"etcdserver: requested lease not found"),
    };
    // Lost once, twice: a fresh lease each time, and the completion lands. Three
    // times: a store error, and the key stays in flight (never runs twice).
    for (losses, lands) in [(1, true), (2, true), (3, false)] {
        let (mut a, mut b) = two_proxies();
        let r = req("POST", "/o").key("k");
        let mut s = send(&p, &mut a, &r).unwrap();
        let pairs = || vec![(":status".to_string(), b"201".to_vec())];
        let mut c = s
            .on_response_headers(&p, &mut a, 201, &Origin::upstream(), pairs, true)
            .expect("a completion call");
        let grants = a.etcd.grants();
        let mut answered = 0;
        loop {
            let answer = if crate::etcd::is_txn(c.path) && answered < losses {
                answered += 1;
                lost()
            } else {
                call(&a, &c)
            };
            match s.on_store_answer(&p, &mut a, answer) {
                Action::Call(next) => c = next,
                _ => break,
            }
        }
        let regrants = a.etcd.grants() - grants;
        assert_eq!(regrants, losses.min(2), "{losses}");
        assert_eq!(
            a.count_of(Counter::StoreErrors),
            u64::from(!lands),
            "{losses}"
        );
        let dup = run(&p, &mut b, &r, ok("no"));
        if lands {
            assert!(matches!(dup, Outcome::Local(_)), "{losses}: {dup:?}");
            assert_eq!(dup.status(), 201, "{losses}: replayed");
        } else {
            assert_eq!(dup.status(), 409, "{losses}: still in flight");
        }
    }
}

#[test]
fn etcd_a_hold_whose_answer_was_lost_is_recognised() {
    let p = etcd_plugin("");
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let s = send(&p, &mut a, &r).unwrap();
    a.etcd.lose_next_answers(1);
    assert_eq!(respond(&p, &mut a, s, upstream_reset()), Outcome::Reset);
    assert_eq!(
        a.count_of(Counter::ClaimsLost) + a.count_of(Counter::StoreErrors),
        0
    );
    // Held on every proxy, with the time left.
    let dup = run(&p, &mut b, &r, ok("no"));
    assert_eq!(dup.status(), 409);
    assert!(dup.local().header("retry-after").is_some());
}

#[test]
fn etcd_settling_answers_say_what_happened_to_the_record() {
    use crate::etcd::EtcdRecord;
    use crate::record::RecordState;
    use base64::Engine as _;
    let p = etcd_json_plugin("");
    let b64 = base64::engine::general_purpose::STANDARD;
    // A record of another claim in place of ours.
    let theirs = |digest: &[u8; 32], state| {
        let rec = EtcdRecord {
            state,
            token: 424242,
            expires_ms: 1,
            payload: [0; 32],
            response: None,
        };
        let v = b64.encode(rec.encode(digest));
        format!(
            r#"{{"header": {{"revision": "9"}}, "responses": [{{"response_range": {{"kvs": [{{"mod_revision": "8", "value": "{v}"}}]}}}}]}}"#
        )
    };
    let digest = |r: &Req| {
        crate::key::record_digest(
            &p.config.policy,
            &r.head,
            &ClientKey {
                source: KeySource::Header,
                value: b"k".to_vec(),
            },
        )
    };
    for (what, answer, lost, errors) in [
        (
            "release: gone already",
            r#"{"header": {"revision": "9"}}"#.to_string(),
            0,
            0,
        ),
        (
            "release: another claim's",
            theirs(&digest(&req("POST", "/o").key("k")), RecordState::InFlight),
            1,
            0,
        ),
        ("release: unreadable", "nonsense".to_string(), 0, 1),
    ] {
        let (mut a, _) = two_proxies();
        let r = req("POST", "/o").key("k");
        let mut s = send(&p, &mut a, &r).unwrap();
        let pairs = || vec![(":status".to_string(), b"503".to_vec())];
        let c = s.on_response_headers(&p, &mut a, 503, &Origin::upstream(), pairs, true);
        assert!(c.is_some(), "{what}: a release call");
        assert_eq!(
            s.on_store_answer(&p, &mut a, txn_answer(&answer)),
            Action::Continue
        );
        assert_eq!(
            (
                a.count_of(Counter::ClaimsLost),
                a.count_of(Counter::StoreErrors)
            ),
            (lost, errors),
            "{what}"
        );
    }
    // A completion whose record is gone, or belongs to another claim, was lost.
    for (what, answer) in [
        ("gone", r#"{"header": {"revision": "9"}}"#.to_string()),
        (
            "another claim's",
            theirs(&digest(&req("POST", "/o").key("k")), RecordState::Completed),
        ),
        ("ours, still in flight", String::new()),
    ] {
        let (mut a, _) = two_proxies();
        let r = req("POST", "/o").key("k");
        let mut s = send(&p, &mut a, &r).unwrap();
        let pairs = || vec![(":status".to_string(), b"200".to_vec())];
        let c = s.on_response_headers(&p, &mut a, 200, &Origin::upstream(), pairs, true);
        assert!(c.is_some(), "{what}: a completion call");
        let answer = if answer.is_empty() {
            // Our own claim, not completed: the completion did not land.
            let rec = EtcdRecord {
                state: RecordState::InFlight,
                token: 1 << 48 | 1,
                expires_ms: a.now_ms + 30_000,
                payload: [0; 32],
                response: None,
            };
            let v = b64.encode(rec.encode(&digest(&r)));
            format!(
                r#"{{"header": {{"revision": "9"}}, "responses": [{{"response_range": {{"kvs": [{{"mod_revision": "8", "value": "{v}"}}]}}}}]}}"#
            )
        } else {
            answer
        };
        assert_eq!(
            s.on_store_answer(&p, &mut a, txn_answer(&answer)),
            Action::Continue
        );
        assert_eq!(a.count_of(Counter::ClaimsLost), 1, "{what}");
        // Not learned by the worker's tier.
        a.etcd.set_down(true);
        assert!(
            matches!(run(&p, &mut a, &r, ok("through")), Outcome::Upstream(..)),
            "{what}"
        );
    }
}

// ---------- the shared-data store: keys, layouts, errors ----------

#[test]
fn the_store_writes_only_its_documented_keys() {
    let p = plugin(r#"{"capacity": 32, "store": {"namespace": "orders"}}"#);
    let (shared, mut env) = world();
    for i in 0..20 {
        run(
            &p,
            &mut env,
            &req("POST", "/o").key(&format!("k{i}")),
            ok("x"),
        );
    }
    let mut keys = shared.keys();
    keys.sort();
    assert!(keys.contains(&"orders/layouts".to_string()), "{keys:?}");
    for k in &keys {
        let ok =
            k == "orders/layouts" || k.starts_with("orders/2/b/") || k.starts_with("orders/2/r/");
        assert!(ok, "unexpected key {k}");
    }
    assert!(keys.len() as u64 <= p.layout.max_keys(), "{}", keys.len());
    assert_eq!(p.layout.namespace(), "orders");
}

#[test]
fn another_layout_yields_only_to_a_live_record_of_the_same_key() {
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 16, "ttl_seconds": 10}"#);
    let new = plugin(r#"{"capacity": 32, "ttl_seconds": 10}"#);
    // The old layout has one bucket: every key of it is in the bucket read.
    assert!(matches!(
        run(&old, &mut env, &req("POST", "/o").key("a"), ok("a")),
        Outcome::Upstream(..)
    ));
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("b"), ok("b")),
        Outcome::Upstream(200, b"b".to_vec())
    );
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("a"), ok("no"))
            .local()
            .body,
        b"a"
    );
    // Expired there: it runs again here.
    env.now_ms += 10_000;
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("a"), ok("a2")),
        Outcome::Upstream(200, b"a2".to_vec())
    );
}

#[test]
fn store_errors_say_what_failed() {
    use crate::store::{HostFault, StoreError};
    assert!(StoreError::Host(HostFault("boom".into()))
        .to_string()
        .contains("boom"));
    assert!(StoreError::Contention.to_string().contains("contention"));
    assert!(StoreError::BucketFull.to_string().contains("full"));
}

#[test]
fn an_etcd_error_without_a_code_is_not_mistaken_for_a_known_one() {
    use crate::etcd::{parse_answer, EtcdAnswer};
    assert_eq!(
        parse_answer(br#"{"error": "boom"}"#),
        Some(EtcdAnswer::Error {
            code: -1,
            message: "boom".into()
        })
    );
    assert_eq!(
        parse_answer(br#"{"message": "m", "code": "14"}"#),
        Some(EtcdAnswer::Error {
            code: 14,
            message: "m".into()
        })
    );
}

// ---------- the operator API: parameters, ages, etcd answers ----------

fn detail(r: &LocalReply) -> String {
    admin_json(r)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn admin_parameters_are_percent_decoded() {
    let p = plugin("{}");
    let admin_p = plugin(r#"{"role": "admin"}"#);
    let (_, mut env) = world();
    for key in ["a/b c", "é+x"] {
        assert!(matches!(
            run(&p, &mut env, &req("POST", "/o").key(key), ok(key)),
            Outcome::Upstream(..)
        ));
    }
    let digest = |key: &str| {
        let d = record_digest(
            &p.config.policy,
            &req("POST", "/o").key(key).head,
            &ClientKey {
                source: KeySource::Header,
                value: key.as_bytes().to_vec(),
            },
        );
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    for (query, key) in [
        ("key=a%2Fb+c", "a/b c"),
        ("key=a%2fb%20c", "a/b c"),
        ("key=%C3%A9%2Bx", "é+x"),
        ("k%65y=a%2Fb+c", "a/b c"),
    ] {
        let got = admin(
            &admin_p,
            &mut env,
            "GET",
            &format!("/records?{query}&authority=api.example"),
        );
        assert_eq!(got.status, 200, "{query}: {}", detail(&got));
        assert_eq!(admin_json(&got)["record"], digest(key), "{query}");
    }
    for query in ["key=a%2", "key=a%zzb", "key=%C3", "key=%"] {
        let got = admin(
            &admin_p,
            &mut env,
            "GET",
            &format!("/records?{query}&authority=api.example"),
        );
        assert_eq!(got.status, 400, "{query}");
    }
    // The record named in a 404 is the digest of the parameters.
    let missing = admin(
        &admin_p,
        &mut env,
        "GET",
        "/records?key=none&authority=api.example",
    );
    assert_eq!(missing.status, 404);
    assert!(
        detail(&missing).contains(&digest("none")),
        "{}",
        detail(&missing)
    );
}

#[test]
fn admin_force_is_true_or_1_only() {
    let p = plugin("{}");
    let admin_p = plugin(r#"{"role": "admin"}"#);
    let (_, mut env) = world();
    for (i, (force, removed)) in [("yes", false), ("0", false), ("1", true), ("true", true)]
        .into_iter()
        .enumerate()
    {
        let key = format!("k{i}");
        let _flying = send(&p, &mut env, &req("POST", "/o").key(&key)).unwrap();
        let got = admin(
            &admin_p,
            &mut env,
            "DELETE",
            &format!("/records?key={key}&authority=api.example&force={force}"),
        );
        assert_eq!(got.status == 200, removed, "force={force}: {}", got.status);
    }
}

#[test]
fn admin_ages_count_from_the_claim_or_the_completion() {
    let admin_of = |p: &Plugin| {
        let mut c = p.config.clone();
        c.role = crate::config::Role::Admin;
        Plugin::new(c)
    };
    for (p, mut env) in [
        (plugin("{}"), world().1),
        (etcd_plugin(""), two_proxies().0),
    ] {
        let admin_p = admin_of(&p);
        let _flying = send(&p, &mut env, &req("POST", "/o").key("f")).unwrap();
        run(&p, &mut env, &req("POST", "/o").key("d"), ok("x"));
        env.now_ms += 1_234;
        for key in ["f", "d"] {
            let got = admin(
                &admin_p,
                &mut env,
                "GET",
                &format!("/records?key={key}&authority=api.example"),
            );
            assert_eq!(got.status, 200, "{key}: {}", detail(&got));
            assert_eq!(admin_json(&got)["age_ms"], 1_234, "{key}");
        }
    }
}

#[test]
fn admin_on_etcd_reads_without_deleting_and_gives_up_on_a_record_that_keeps_changing() {
    let p = etcd_plugin(r#""ttl_seconds": 10"#);
    let admin_p = etcd_plugin(r#""role": "admin", "ttl_seconds": 10"#);
    let (mut a, _) = two_proxies();
    let r = req("POST", "/o").key("k");
    let (_, mut b) = two_proxies();
    b.etcd = a.etcd.clone();
    // The first record etcd ever wrote (mod revision 1): a read must not remove it.
    let first = send(&p, &mut a, &r).unwrap();
    let q = "/records?key=k&authority=api.example";
    for _ in 0..2 {
        let got = admin(&admin_p, &mut a, "GET", q);
        assert_eq!(admin_json(&got)["state"], "in_flight");
    }
    assert_eq!(run(&p, &mut b, &r, ok("twice")).status(), 409);
    respond(&p, &mut a, first, ok("kept"));
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"kept");
    // Past its TTL by this proxy's clock (still in etcd): not a live record.
    a.now_ms += 10_000;
    assert_eq!(admin(&admin_p, &mut a, "GET", q).status, 404);
    a.now_ms -= 10_000;
    // A DELETE whose record changes under it every time: five reads, then 503.
    let mut s = crate::admin::AdminStream::default();
    let mut action = s.on_request(&admin_p, &mut a, "DELETE", q, "peer");
    let Action::Call(first) = &action else {
        panic!("{action:?}")
    };
    let read = first.body.clone();
    let read_path = first.path;
    let mut answers = 0;
    while let Action::Call(_) = action {
        // Whatever was asked, etcd's answer shows the record as it is (not removed).
        let (status, body) = a.etcd.handle(read_path, &read, a.now_ms);
        answers += 1;
        action = s.on_store_answer(&admin_p, &mut a, CallAnswer { status, body });
        assert!(answers < 10);
    }
    assert_eq!(answers, 5);
    assert!(
        matches!(action, Action::Reply(ref r) if r.status == 503),
        "{action:?}"
    );
    // etcd's own errors are named in the answer.
    let mut s = crate::admin::AdminStream::default();
    assert!(matches!(
        s.on_request(&admin_p, &mut a, "GET", q, "peer"),
        Action::Call(_)
    ));
    let e = s.on_store_answer(
        &admin_p,
        &mut a,
        CallAnswer {
            status: 0,
            body: crate::etcdpb::status_body(8, b"etcdserver: too many requests"),
        },
    );
    let Action::Reply(e) = e else { panic!("{e:?}") };
    assert_eq!(e.status, 503);
    assert!(detail(&e).contains("too many requests"), "{}", detail(&e));
}

#[test]
fn a_cached_lease_serves_its_window_and_not_a_millisecond_more() {
    use crate::etcd::{LeaseCache, LeasePlan, LeasePurpose};
    let plan = LeasePlan {
        in_flight_window_ms: 500,
        completed_window_ms: 2_000,
        in_flight_ttl_s: 10,
        completed_ttl_s: 20,
    };
    // Another rule's plan (a longer TTL) never gets this plan's leases.
    let other = LeasePlan {
        in_flight_ttl_s: 11,
        completed_ttl_s: 21,
        ..plan
    };
    let mut c = LeaseCache::default();
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 0), None);
    c.put(LeasePurpose::InFlight, &plan, 7, 1_000);
    c.put(LeasePurpose::Completed, &plan, 8, 1_000);
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_499), Some(7));
    assert_eq!(c.get(LeasePurpose::InFlight, &other, 1_499), None);
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_500), None);
    assert_eq!(c.get(LeasePurpose::Completed, &plan, 2_999), Some(8));
    assert_eq!(c.get(LeasePurpose::Completed, &other, 2_999), None);
    assert_eq!(c.get(LeasePurpose::Completed, &plan, 3_000), None);
    c.put(LeasePurpose::InFlight, &other, 9, 1_200);
    assert_eq!(c.get(LeasePurpose::InFlight, &other, 1_300), Some(9));
    assert_eq!(c.get(LeasePurpose::InFlight, &plan, 1_300), Some(7));
}

#[test]
fn the_method_can_be_a_fingerprint_part() {
    let p = plugin(r#"{"key": {"fingerprint": ["header::method", "body"]}}"#);
    let (_, mut env) = world();
    for m in ["POST", "PATCH"] {
        let r = req(m, "/x").body("same");
        assert_eq!(
            run(&p, &mut env, &r, ok(m)),
            Outcome::Upstream(200, m.as_bytes().to_vec())
        );
    }
    assert_eq!(
        run(&p, &mut env, &req("PATCH", "/x").body("same"), ok("no"))
            .local()
            .body,
        b"PATCH"
    );
}

#[test]
fn response_flags_are_envoys_bits() {
    use crate::outcome::flags::*;
    // `StreamInfo::CoreResponseFlag`, in order: the filter reads Envoy's bits as they are.
    let order = [
        LH, UH, UT, LR, UR, UF, UC, UO, NR, DI, FI, RL, UAEX, RLSE, DC, URX, SI, IH, DPE, UMSDR,
        RFCF, NFCF, DT, UPE, NC, OM, DF, DO, DR, UDO,
    ];
    for (i, bit) in order.iter().enumerate() {
        assert_eq!(*bit, 1u64 << i, "flag {i}");
    }
}

#[test]
fn a_layout_in_use_stays_registered_for_its_other_layouts() {
    // The old configuration keeps serving for hours after a push: the new one must keep
    // seeing its records, however long ago the old one first registered.
    let (_, mut env) = world();
    let old = plugin(r#"{"capacity": 16, "ttl_seconds": 10}"#);
    let new = plugin(r#"{"capacity": 32, "ttl_seconds": 10}"#);
    run(&old, &mut env, &req("POST", "/o").key("first"), ok("1"));
    env.now_ms += 3 * 3_600_000;
    run(&old, &mut env, &req("POST", "/o").key("late"), ok("late"));
    env.now_ms += 5_000;
    assert_eq!(
        run(&new, &mut env, &req("POST", "/o").key("late"), ok("no"))
            .local()
            .body,
        b"late"
    );
}

// ---------- the payload check ----------

#[test]
fn ignored_array_elements_do_not_count_in_the_payload() {
    let p =
        plugin(r#"{"payload": {"ignore_json_pointers": ["/items/0", "/items/5", "/meta/at"]}}"#);
    let (_, mut env) = world();
    let r = |body: &str| req("POST", "/o").key("k").body(body);
    let first = r(r#"{"items": [1, 2], "meta": {"at": 1}}"#);
    assert!(matches!(
        run(&p, &mut env, &first, ok("made")),
        Outcome::Upstream(..)
    ));
    // Only the ignored element and member differ: the same payload.
    let same = r(r#"{"items": [9, 2], "meta": {"at": 2}}"#);
    assert_eq!(run(&p, &mut env, &same, ok("no")).local().body, b"made");
    // Another element differs: another payload.
    let other = r(r#"{"items": [1, 3], "meta": {"at": 1}}"#);
    assert_eq!(run(&p, &mut env, &other, ok("no")).status(), 422);
    // A pointer one past the end of the array removes nothing.
    let p2 = plugin(
        r#"{"payload": {"ignore_json_pointers": ["/items/2"]}, "store": {"namespace": "two"}}"#,
    );
    let two = r(r#"{"items": [1, 2]}"#);
    assert!(matches!(
        run(&p2, &mut env, &two, ok("two")),
        Outcome::Upstream(..)
    ));
    assert_eq!(
        run(&p2, &mut env, &r(r#"{"items": [1, 3]}"#), ok("no")).status(),
        422
    );
}

#[test]
fn the_default_payload_digest_format_is_pinned() {
    // SHA-256 over method, path with query, and the body's length and BLAKE3 digest.
    // A change here is a new record format: bump `key::RECORD_DIGEST_VERSION`.
    use sha2::{Digest as _, Sha256};
    let head = req("POST", "/o?x=1").head;
    let mut hasher = crate::key::BodyHasher::default();
    hasher.update(b"{");
    hasher.update(b"}");
    let body = hasher.finish();
    assert_eq!(body.digest, *blake3::hash(b"{}").as_bytes());
    assert_eq!(body.len, 2);
    let mut h = Sha256::new();
    h.update(b"proxy-dedup payload v1\0");
    for part in [&b"POST"[..], &b"/o?x=1"[..]] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(2u64.to_be_bytes());
    h.update(body.digest);
    let want: [u8; 32] = h.finalize().into();
    let cfg = crate::payload::PayloadConfig::default();
    assert_eq!(
        crate::payload::payload_digest(&cfg, &head, &body, b"{}"),
        want
    );
}

#[test]
fn a_record_of_the_previous_format_is_never_found_nor_misread() {
    // The previous version's records: digest "record v2", payload digest over a SHA-256
    // of the body. The same request now neither replays that record nor calls its
    // payload different (422): it is a new request.
    use sha2::{Digest as _, Sha256};
    let p = plugin("{}");
    let (shared, mut env) = world();
    let r = req("POST", "/orders").key("k-old").body("{}");
    let feed = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    let mut h = Sha256::new();
    h.update(b"proxy-dedup record v2\0");
    h.update([1]);
    feed(&mut h, b"api.example");
    h.update(0u32.to_be_bytes());
    h.update([1]);
    feed(&mut h, b"k-old");
    let old: [u8; 32] = h.finalize().into();
    let key = ClientKey {
        source: KeySource::Header,
        value: b"k-old".to_vec(),
    };
    assert_ne!(record_digest(&p.config.policy, &r.head, &key), old);
    let store = SharedStore::new(&*shared, &p.layout);
    let now = env.now_ms;
    let ClaimOutcome::Claimed { claim, .. } = store.claim(&old, &[9; 32], now, 1).unwrap() else {
        panic!()
    };
    let stale = StoredResponse {
        status: 200,
        headers: vec![],
        body: b"from the old version".to_vec(),
    };
    assert!(store.complete(&claim, Some(&stale), now).unwrap());
    assert_eq!(
        run(&p, &mut env, &r, ok("new")),
        Outcome::Upstream(200, b"new".to_vec())
    );
    assert_eq!(env.count_of(Counter::Executed), 1);
    assert_eq!(env.count_of(Counter::PayloadMismatch), 0);
}

#[test]
fn a_failed_settling_call_says_which_one_failed() {
    let p = etcd_plugin("");
    for (a, what) in [
        (ok("x"), "completion failed"),
        (answer(503, "x"), "release failed"),
        (upstream_reset(), "hold failed"),
    ] {
        let (mut env, _) = two_proxies();
        let s = send(&p, &mut env, &req("POST", "/o").key("k")).unwrap();
        env.etcd.set_down(true);
        respond(&p, &mut env, s, a);
        let warned = env.warnings.borrow().join("\n");
        assert!(warned.contains(what), "{what}: {warned}");
    }
}

// ---------- decisions as the glue and access logs see them ----------

#[test]
fn each_local_answer_is_logged_as_its_decision() {
    let (_, mut env) = world();
    let decide = |p: &Plugin, env: &mut FakeEnv, r: &Req| {
        let mut s = DedupStream::new(9);
        let body = r.body.clone();
        let mut a = s.on_request_headers(p, env, r.head.clone(), body.is_none());
        if let Some(b) = body {
            a = s.on_request_body(p, env, b.len(), true, || Some(b.clone()));
        }
        assert!(matches!(a, Action::Reply(_)), "{a:?}");
        s.log_fields().map(|(v, _)| v)
    };
    let p = plugin(r#"{"max_body_bytes": 4, "max_replay_body_bytes": 2}"#);
    let flying = send(&p, &mut env, &req("POST", "/o").key("fly")).unwrap();
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("fly")),
        Some("in_flight")
    );
    drop(flying);
    run(&p, &mut env, &req("POST", "/o").key("big"), ok("too big"));
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("big")),
        Some("not_stored")
    );
    assert_eq!(
        decide(&p, &mut env, &req("POST", "/o").key("b").body("12345")),
        Some("body_too_large")
    );
    let reject = plugin(r#"{"on_duplicate": "reject", "store": {"namespace": "r"}}"#);
    run(&reject, &mut env, &req("POST", "/o").key("done"), ok("x"));
    assert_eq!(
        decide(&reject, &mut env, &req("POST", "/o").key("done")),
        Some("rejected_completed")
    );
    let closed = plugin(r#"{"failure_mode": "closed", "store": {"namespace": "c"}}"#);
    env.shared.set_failing(true);
    assert_eq!(
        decide(&closed, &mut env, &req("POST", "/o").key("c")),
        Some("store_unavailable")
    );
    env.shared.set_failing(false);
    let required = plugin(r#"{"key": {"required": true}}"#);
    assert_eq!(
        decide(&required, &mut env, &req("POST", "/o")),
        Some("bad_key")
    );
}

#[test]
fn a_body_read_at_its_trailers_is_held_to_the_limit() {
    let p = plugin(r#"{"max_body_bytes": 4}"#);
    let (_, mut env) = world();
    let mut s = DedupStream::new(1);
    let head = req("POST", "/o").key("k").head;
    assert_eq!(
        s.on_request_headers(&p, &mut env, head, false),
        Action::Pause
    );
    // The body arrived in chunks the filter was not shown (trailers end it).
    let a = s.on_request_trailers(&p, &mut env, || Some(b"12345".to_vec()));
    assert!(
        matches!(a, Action::Reply(ref r) if r.status == 413),
        "{a:?}"
    );
    assert_eq!(env.count_of(Counter::Executed), 0);
}

#[test]
fn the_stream_debug_names_its_phase() {
    let p = plugin("{}");
    let (_, mut env) = world();
    let mut s = DedupStream::new(42);
    assert_eq!(format!("{s:?}"), "DedupStream { id: 42, phase: start }");
    s.on_request_headers(&p, &mut env, req("POST", "/o").key("k").head, false);
    assert_eq!(format!("{s:?}"), "DedupStream { id: 42, phase: reading }");
}

#[test]
fn an_etcd_error_on_the_claim_is_a_store_failure_not_a_lost_lease() {
    let p = etcd_json_plugin(r#""failure_mode": "closed""#);
    let (mut a, _) = two_proxies();
    let mut s = DedupStream::new(1);
    let first = s.on_request_headers(&p, &mut a, req("POST", "/o").key("k").head, true);
    let (decision, n) = drive(&p, &mut a, &mut s, first, |_| {
        Some(txn_answer(
            r#"{"error": "etcdserver: too many requests", "code": 8}"#,
        ))
    });
    assert_eq!(n, 1, "not retried");
    assert!(
        matches!(decision, Action::Reply(ref r) if r.status == 503),
        "{decision:?}"
    );
}

#[test]
fn an_etcd_record_of_exactly_the_limit_keeps_its_response() {
    use crate::etcd::EtcdRecord;
    use crate::record::RecordState;
    let limit = 20_000;
    let p = plugin(&format!(
        r#"{{"max_replay_body_bytes": 3616,
            "store": {{"kind": "etcd", "cluster": "etcd", "max_record_bytes": {limit}}}}}"#
    ));
    // The size of the completed record for a header value of `n` bytes.
    let size = |n: usize| {
        EtcdRecord {
            state: RecordState::Completed,
            token: 0,
            expires_ms: 0,
            payload: [0; 32],
            response: Some(StoredResponse {
                status: 200,
                headers: vec![
                    ("content-type".into(), b"application/json".to_vec()),
                    ("x-big".into(), vec![b'h'; n]),
                ],
                body: b"body".to_vec(),
            }),
        }
        .encode(&[0; 32])
        .len()
    };
    let fits = limit - size(0);
    assert_eq!(size(fits), limit);
    for (key, n, kept) in [("exact", fits, true), ("over", fits + 1, false)] {
        let (mut a, mut b) = two_proxies();
        let r = req("POST", "/o").key(key);
        let mut big = ok("body");
        big.headers.push(("x-big".into(), vec![b'h'; n]));
        assert!(matches!(run(&p, &mut a, &r, big), Outcome::Upstream(..)));
        let dup = run(&p, &mut b, &r, ok("no"));
        assert_eq!(
            matches!(dup, Outcome::Local(ref l) if l.status == 200),
            kept,
            "{key}: {dup:?}"
        );
    }
}

#[test]
fn etcd_a_completed_record_is_taken_over_at_its_expiry_while_its_lease_lives() {
    let p = etcd_plugin(r#""ttl_seconds": 10, "in_flight_timeout_seconds": 5"#);
    let (mut a, mut b) = two_proxies();
    let r = req("POST", "/o").key("k");
    let t0 = a.now_ms;
    assert!(matches!(
        run(&p, &mut a, &r, ok("first")),
        Outcome::Upstream(..)
    ));
    b.now_ms = t0 + 9_999;
    assert_eq!(run(&p, &mut b, &r, ok("no")).local().body, b"first");
    // Expired by the reader's clock; etcd still has it (its lease runs longer).
    let (mut c, _) = two_proxies();
    c.etcd = a.etcd.clone();
    c.now_ms = t0 + 10_000;
    assert!(c.etcd.key_count(c.now_ms) >= 1);
    assert_eq!(
        run(&p, &mut c, &r, ok("second")),
        Outcome::Upstream(200, b"second".to_vec())
    );
    let (mut d, _) = two_proxies();
    d.etcd = a.etcd.clone();
    d.now_ms = t0 + 10_001;
    assert_eq!(run(&p, &mut d, &r, ok("no")).local().body, b"second");
}

#[test]
fn admin_stats_and_lookups_on_shared_data() {
    let p = plugin(r#"{"capacity": 48, "ttl_seconds": 10}"#);
    let admin_p = plugin(r#"{"role": "admin", "capacity": 48, "ttl_seconds": 10}"#);
    let (_, mut env) = world();
    let v = admin_json(&admin(&admin_p, &mut env, "GET", "/stats"));
    assert_eq!(
        (v["buckets"].as_u64(), v["capacity"].as_u64()),
        (Some(3), Some(48))
    );
    // Another key in the same bucket is not this one; an expired record is not live.
    run(&p, &mut env, &req("POST", "/o").key("k"), ok("x"));
    let q = |k: &str| format!("/records?key={k}&authority=api.example");
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("k")).status, 200);
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("other")).status, 404);
    env.now_ms += 10_000;
    assert_eq!(admin(&admin_p, &mut env, "GET", &q("k")).status, 404);
}

#[test]
fn payload_pointer_lists_hold_1_to_32() {
    let json = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("\"/f{i}\"")).collect();
        format!(
            r#"{{"payload": {{"json_pointers": [{}]}}}}"#,
            list.join(", ")
        )
    };
    Config::parse(json(1).as_bytes()).unwrap();
    Config::parse(json(32).as_bytes()).unwrap();
    assert_eq!(cfg_err(&json(33)).0, "payload.json_pointers");
    assert_eq!(cfg_err(&json(0)).0, "payload.json_pointers");
}
