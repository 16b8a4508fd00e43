//! Scenario tests of the compiled filter (`dist/dedup_filter.wasm`) in host-test: every
//! numbered behaviour of the filter's contract, races across workers, expiry on the
//! virtual clock, the capacity bound, store faults, scope isolation, and the etcd store
//! against a real etcd on loopback and against failing clusters.
// Test helpers outside #[test] functions may unwrap too (as in envoy/tests).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Two tests of one scenario `fn(json: bool) -> R`: the etcd store over gRPC,
/// and over etcd's JSON gateway.
macro_rules! over_grpc_and_json {
    ($scenario:ident: $grpc:ident, $json:ident) => {
        #[test]
        fn $grpc() -> R {
            $scenario(false)
        }

        #[test]
        fn $json() -> R {
            $scenario(true)
        }
    };
}

mod detached;
mod etcd;
mod hardening;
mod ordering;
mod phases;
mod rules;
mod wait;

use dedup_envoy::problem_type;
use host_test::{EnvoyBuilder, Reply, Request, SimEnvoy, Status, StreamId};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

type R = Result<(), Box<dyn std::error::Error>>;

/// An upstream that counts executions and answers with the execution number.
#[derive(Clone, Default)]
pub struct Upstream {
    pub calls: Rc<Cell<u32>>,
    /// Status to answer with (200 unless set).
    pub status: Rc<Cell<u16>>,
    pub bodies: Rc<RefCell<Vec<Vec<u8>>>>,
}

impl Upstream {
    pub fn handler(&self) -> impl FnMut(&host_test::UpstreamRequest) -> Reply + 'static {
        let me = self.clone();
        move |req| {
            me.calls.set(me.calls.get() + 1);
            me.bodies.borrow_mut().push(req.body.clone());
            let status = match me.status.get() {
                0 => 200,
                s => s,
            };
            Reply::new(status)
                .header("content-type", "application/json")
                .header("set-cookie", "session=for-the-first-client")
                .header("x-order", &me.calls.get().to_string())
                .body(format!(r#"{{"execution": {}}}"#, me.calls.get()))
        }
    }
}

pub fn wasm() -> std::path::PathBuf {
    host_test::dist("dedup_filter.wasm")
}

/// The filter with `config` on `workers` workers, as the README's Envoy config
/// runs it (allow_on_headers_stop_iteration), its upstream still to choose.
pub fn filter_with(config: &str, workers: usize) -> EnvoyBuilder {
    SimEnvoy::builder(wasm())
        .workers(workers)
        .vm_id("proxy_dedup")
        .plugin_config(config)
        .allow_on_headers_stop_iteration(true)
}

pub fn envoy_with(config: &str, workers: usize, up: &Upstream) -> EnvoyBuilder {
    filter_with(config, workers).upstream(up.handler())
}

/// `envoy_with` a fresh counting upstream, built.
pub fn started(config: &str, workers: usize) -> Result<(SimEnvoy, Upstream), host_test::Error> {
    let up = Upstream::default();
    let e = envoy_with(config, workers, &up).build()?;
    Ok((e, up))
}

/// Whole requests sent on their way, for the test to answer.
pub trait SendWhole {
    /// Starts `req` on `worker` and sends it whole.
    fn send(&mut self, worker: usize, req: Request) -> Result<StreamId, host_test::Error>;
    /// A copy of `req` on each of `workers`: all started, then all sent whole.
    fn send_each(
        &mut self,
        workers: impl IntoIterator<Item = usize>,
        req: &Request,
    ) -> Result<Vec<StreamId>, host_test::Error>;
}

impl SendWhole for SimEnvoy {
    fn send(&mut self, worker: usize, req: Request) -> Result<StreamId, host_test::Error> {
        let id = self.start(worker, req)?;
        self.send_request(id)?;
        Ok(id)
    }

    fn send_each(
        &mut self,
        workers: impl IntoIterator<Item = usize>,
        req: &Request,
    ) -> Result<Vec<StreamId>, host_test::Error> {
        let ids: Vec<_> = workers
            .into_iter()
            .map(|w| self.start(w, req.clone()))
            .collect::<Result<_, _>>()?;
        for id in &ids {
            self.send_request(*id)?;
        }
        Ok(ids)
    }
}

pub fn keyed(path: &str, key: &str, body: &str) -> Request {
    Request::post(path)
        .header("idempotency-key", key)
        .body(body)
}

#[test]
fn the_filter_imports_only_from_env_and_wasi() -> R {
    let imports = host_test::module_imports(&wasm())?;
    assert!(
        imports.iter().any(|i| i == "env::proxy_http_call"),
        "{imports:?}"
    );
    for import in &imports {
        assert!(
            import.starts_with("env::proxy_") || import.starts_with("wasi_snapshot_preview1::"),
            "{import}"
        );
    }
    Ok(())
}

#[test]
fn first_executes_duplicate_replays_with_header() -> R {
    let (mut e, up) = started("{}", 2)?;
    let first = e.request(0, keyed("/orders", "k1", r#"{"item": 1}"#))?;
    assert_eq!(first.status, 200);
    assert!(first.upstream_called);
    assert_eq!(first.header("idempotent-replayed"), None);
    for worker in [0, 1] {
        let again = e.request(worker, keyed("/orders", "k1", r#"{"item": 1}"#))?;
        assert_eq!(again.status, 200);
        assert!(!again.upstream_called);
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.header("x-order"), Some("1"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(
            again.header("set-cookie"),
            None,
            "cookies are never replayed"
        );
    }
    assert_eq!(up.calls.get(), 1);
    assert_eq!(e.counter("proxy_dedup_executed"), Some(1));
    assert_eq!(e.counter("proxy_dedup_replayed"), Some(2));
    Ok(())
}

#[test]
fn n_way_race_across_workers_executes_once() -> R {
    let up = Upstream::default();
    let workers = 4;
    let mut e = envoy_with("{}", workers, &up).build()?;
    // Every worker gets the headers, then every worker gets the body: all claims race
    // with the first one still waiting for its upstream.
    let ids: Vec<_> = (0..workers * 2)
        .map(|i| e.start(i % workers, keyed("/pay", "race", "amount=5")))
        .collect::<Result<_, _>>()?;
    for id in &ids {
        e.send_headers(*id)?;
    }
    for id in &ids {
        e.send_body(*id)?;
    }
    let forwarded: Vec<_> = ids
        .iter()
        .filter(|id| e.upstream_request(**id).is_some())
        .collect();
    assert_eq!(
        forwarded.len(),
        1,
        "exactly one request reaches the upstream"
    );
    let winner = *forwarded[0];
    for id in ids.iter().filter(|id| **id != winner) {
        let r = e.response(*id).expect("the losers are answered at once");
        assert_eq!(r.status, 409);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(problem_type(&r.body), "urn:proxy-dedup:problem:in-flight");
    }
    e.respond(winner, Reply::new(201).body("charged"))?;
    let after = e.request(3, keyed("/pay", "race", "amount=5"))?;
    assert_eq!((after.status, after.body_str().as_str()), (201, "charged"));
    assert_eq!(
        e.counter("proxy_dedup_rejected_in_flight"),
        Some(workers as u64 * 2 - 1)
    );
    Ok(())
}

#[test]
fn different_payload_is_422_and_bad_keys_are_400() -> R {
    let (mut e, up) = started(r#"{"key": {"required": true, "max_length": 16}}"#, 2)?;
    e.request(0, keyed("/orders", "k1", "a"))?;
    for r in [
        keyed("/orders", "k1", "b"),
        keyed("/other", "k1", "a"),
        Request::patch("/orders")
            .header("idempotency-key", "k1")
            .body("a"),
    ] {
        let resp = e.request(1, r)?;
        assert_eq!(resp.status, 422);
        assert_eq!(
            problem_type(&resp.body),
            "urn:proxy-dedup:problem:payload-mismatch"
        );
    }
    let missing = e.request(0, Request::post("/orders").body("a"))?;
    assert_eq!(
        (missing.status, problem_type(&missing.body).as_str()),
        (400, "urn:proxy-dedup:problem:missing-key")
    );
    let long = e.request(0, keyed("/orders", &"x".repeat(17), "a"))?;
    assert_eq!(
        (long.status, problem_type(&long.body).as_str()),
        (400, "urn:proxy-dedup:problem:invalid-key")
    );
    let ctl = e.request(0, keyed("/orders", "a\u{1}b", "a"))?;
    assert_eq!(ctl.status, 400);
    assert_eq!(up.calls.get(), 1);
    Ok(())
}

#[test]
fn an_upstream_5xx_releases_the_claim() -> R {
    let (mut e, up) = started("{}", 2)?;
    up.status.set(503);
    assert_eq!(e.request(0, keyed("/pay", "k", "x"))?.status, 503);
    up.status.set(0);
    let ok = e.request(1, keyed("/pay", "k", "x"))?;
    assert_eq!(ok.status, 200);
    assert!(ok.upstream_called);
    assert_eq!(up.calls.get(), 2);
    assert_eq!(e.counter("proxy_dedup_released"), Some(1));
    assert_eq!(
        e.request(0, keyed("/pay", "k", "x"))?
            .header("idempotent-replayed"),
        Some("true")
    );
    Ok(())
}

/// Three requests whose outcome is unknown, on two workers: the upstream resets after
/// the request reached it, the client hangs up while the upstream works, the route
/// times out (at 15 s). Each may have executed.
fn three_unknown_outcomes(
    config: &str,
) -> Result<(SimEnvoy, Upstream), Box<dyn std::error::Error>> {
    let (mut e, up) = started(config, 2)?;
    let reset = e.send(1, keyed("/pay", "reset", "x"))?;
    e.respond(reset, Reply::reset())?;
    let gone = e.send(0, keyed("/pay", "gone", "x"))?;
    assert!(e.upstream_request(gone).is_some());
    e.reset_client(gone)?;
    let slow = e.send(0, keyed("/pay", "slow", "x"))?;
    e.respond(slow, Reply::no_answer())?;
    e.advance(Duration::from_secs(15));
    assert_eq!(e.response(slow).map(|r| r.status), Some(504));
    assert_eq!(e.counter("proxy_dedup_outcome_unknown"), Some(3));
    assert_ne!(e.counter("proxy_dedup_released"), Some(1));
    assert_eq!(
        up.calls.get(),
        0,
        "the stepped streams were answered by hand"
    );
    Ok((e, up))
}

#[test]
fn by_default_an_unknown_outcome_never_runs_again_within_the_ttl() -> R {
    let (mut e, _) =
        three_unknown_outcomes(r#"{"in_flight_timeout_seconds": 30, "ttl_seconds": 600}"#)?;
    // Within the in-flight timeout, past it, and to the end of the TTL.
    for later in [0, 16, 500] {
        e.advance(Duration::from_secs(later));
        for (w, key) in [(1, "reset"), (0, "gone"), (1, "slow")] {
            let dup = e.request(w, keyed("/pay", key, "x"))?;
            assert_eq!(dup.status, 409, "{key} +{later}s");
            assert!(!dup.upstream_called, "{key} +{later}s");
            assert_eq!(
                problem_type(&dup.body),
                "urn:proxy-dedup:problem:outcome-unknown",
                "{key} +{later}s"
            );
            assert_eq!(dup.header("retry-after"), None, "{key}");
        }
    }
    assert_eq!(e.counter("proxy_dedup_rejected_outcome_unknown"), Some(9));
    // Past the TTL the keys are new requests.
    e.advance(Duration::from_secs(100));
    for key in ["reset", "gone", "slow"] {
        assert!(
            e.request(0, keyed("/pay", key, "x"))?.upstream_called,
            "{key}"
        );
    }
    Ok(())
}

#[test]
fn under_hold_an_unknown_outcome_holds_the_claim_until_the_in_flight_timeout() -> R {
    let (mut e, _) = three_unknown_outcomes(
        r#"{"in_flight_timeout_seconds": 30, "on_unknown_outcome": "hold"}"#,
    )?;
    for key in ["reset", "gone", "slow"] {
        let dup = e.request(1, keyed("/pay", key, "x"))?;
        assert_eq!(dup.status, 409, "{key}");
        assert!(!dup.upstream_called, "{key}");
        assert_eq!(problem_type(&dup.body), "urn:proxy-dedup:problem:in-flight");
        let wait: u64 = dup.header("retry-after").unwrap_or("0").parse()?;
        assert!((1..=30).contains(&wait), "{key}: retry-after {wait}");
    }
    // After the in-flight timeout the keys may run again.
    e.advance(Duration::from_secs(16));
    for key in ["reset", "gone", "slow"] {
        assert!(
            e.request(0, keyed("/pay", key, "x"))?.upstream_called,
            "{key}"
        );
    }
    Ok(())
}

#[test]
fn chunked_body_decided_at_end_of_stream() -> R {
    let (mut e, _) = started("{}", 2)?;
    let id = e.start(
        0,
        Request::post("/msgs")
            .header("idempotency-key", "c1")
            .chunks(["part-1 ", "part-2 ", "part-3"]),
    )?;
    // Configuration writes the bucket secret and the layout registry, nothing else.
    let configured = e.shared_data_len();
    e.send_headers(id)?;
    e.send_chunk(id)?;
    e.send_chunk(id)?;
    assert!(
        e.upstream_request(id).is_none(),
        "nothing reaches the upstream before the end of the body"
    );
    assert_eq!(
        e.shared_data_len(),
        configured,
        "no claim before the end of the body"
    );
    e.send_chunk(id)?;
    let seen = e.upstream_request(id).expect("forwarded at the end");
    assert_eq!(seen.body_str(), "part-1 part-2 part-3");
    e.finish_stream(id)?;
    // Same body in one piece: the same payload, replayed.
    let whole = e.request(1, keyed("/msgs", "c1", "part-1 part-2 part-3"))?;
    assert_eq!(whole.header("idempotent-replayed"), Some("true"));
    // With trailers the body ends at the trailers.
    let t = e.request(
        1,
        Request::post("/msgs")
            .header("idempotency-key", "c2")
            .chunks(["a", "b"])
            .trailer("x-sum", "1"),
    )?;
    assert!(t.upstream_called);
    Ok(())
}

#[test]
fn without_allow_on_headers_stop_iteration_a_body_request_stalls() -> R {
    // Documents why the Envoy config must set the flag: Envoy withholds the body.
    let up = Upstream::default();
    let mut e = envoy_with("{}", 1, &up)
        .allow_on_headers_stop_iteration(false)
        .build()?;
    match e.request(0, keyed("/orders", "k", "body")) {
        Err(host_test::Error::Stalled { .. }) => {}
        other => panic!("expected a stall, got {other:?}"),
    }
    assert_eq!(up.calls.get(), 0);
    Ok(())
}

/// The compiled filter advertises its record's expiry on the host's clock, and the
/// record stops answering at the second it names: host-test's virtual clock starts at
/// 2026-01-01T00:00:00Z.
#[test]
fn replays_and_409s_name_the_second_their_record_stops_answering() -> R {
    let (mut e, _) = started(r#"{"ttl_seconds": 60, "in_flight_timeout_seconds": 10}"#, 2)?;
    // A claim whose response never comes.
    let _stuck = e.send(0, keyed("/o", "slow", "x"))?;
    e.advance(Duration::from_millis(2_000));
    let dup = e.request(1, keyed("/o", "slow", "x"))?;
    assert_eq!(problem_type(&dup.body), "urn:proxy-dedup:problem:in-flight");
    assert_eq!(
        dup.header("idempotency-expires"),
        Some("Thu, 01 Jan 2026 00:00:10 GMT")
    );
    assert_eq!(dup.header("age"), None);
    let first = e.request(0, keyed("/o", "k", "x"))?;
    assert!(first.upstream_called);
    assert_eq!(first.header("idempotency-expires"), None);
    e.advance(Duration::from_millis(59_900));
    let replay = e.request(1, keyed("/o", "k", "x"))?;
    assert!(!replay.upstream_called);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        replay.header("idempotency-expires"),
        Some("Thu, 01 Jan 2026 00:01:02 GMT")
    );
    assert_eq!(replay.header("age"), Some("59"));
    e.advance(Duration::from_millis(100));
    assert!(
        e.request(1, keyed("/o", "k", "x"))?.upstream_called,
        "runs again at the second idempotency-expires names"
    );
    Ok(())
}

#[test]
fn under_hold_ttl_and_in_flight_expiry_on_the_virtual_clock() -> R {
    let (mut e, _) = started(
        r#"{"ttl_seconds": 60, "in_flight_timeout_seconds": 10, "on_unknown_outcome": "hold"}"#,
        2,
    )?;
    e.request(0, keyed("/o", "k", "x"))?;
    e.advance(Duration::from_millis(59_900));
    assert!(!e.request(1, keyed("/o", "k", "x"))?.upstream_called);
    e.advance(Duration::from_millis(200));
    assert!(
        e.request(1, keyed("/o", "k", "x"))?.upstream_called,
        "expired after ttl"
    );
    // A claim whose response never comes blocks for in_flight_timeout_seconds.
    let stuck = e.send(0, keyed("/o", "k2", "x"))?;
    e.advance(Duration::from_millis(9_900));
    assert_eq!(e.request(1, keyed("/o", "k2", "x"))?.status, 409);
    e.advance(Duration::from_millis(200));
    let retry = e.request(1, keyed("/o", "k2", "x"))?;
    assert!(retry.upstream_called);
    // The stuck one answers late: it must not overwrite the retry's record.
    e.respond(stuck, Reply::new(200).body("late"))?;
    let again = e.request(0, keyed("/o", "k2", "x"))?;
    assert_eq!(again.body, retry.body);
    assert_eq!(e.counter("proxy_dedup_claims_lost"), Some(1));
    Ok(())
}

#[test]
fn capacity_bounds_shared_data_keys() -> R {
    let (mut e, up) = started(r#"{"capacity": 64}"#, 2)?;
    for i in 0..1500 {
        e.request(i % 2, keyed("/o", &format!("key-{i}"), "x"))?;
    }
    // 8 buckets of 8 records, plus one response slot per record.
    assert!(
        e.shared_data_len() <= 8 * 9,
        "{} shared-data keys",
        e.shared_data_len()
    );
    assert!(e.counter("proxy_dedup_evictions_unexpired").unwrap_or(0) >= 1500 - 64);
    assert_eq!(up.calls.get(), 1500);
    assert!(!e.request(0, keyed("/o", "key-1499", "x"))?.upstream_called);
    Ok(())
}

#[test]
fn store_faults_follow_failure_mode() -> R {
    for (mode, status) in [("open", 200), ("closed", 503)] {
        let (mut e, _) = started(&format!(r#"{{"failure_mode": "{mode}"}}"#), 2)?;
        e.set_faults(host_test::Faults::shared_data(Status::InternalFailure));
        let r = e.request(0, keyed("/o", "k", "x"))?;
        assert_eq!(r.status, status, "{mode}");
        assert!(!e.worker_failed(0), "a store fault never traps the VM");
        assert_eq!(e.counter("proxy_dedup_store_errors"), Some(1));
        if mode == "closed" {
            assert_eq!(
                problem_type(&r.body),
                "urn:proxy-dedup:problem:store-unavailable"
            );
        } else {
            assert_eq!(e.counter("proxy_dedup_failed_open"), Some(1));
        }
        e.set_faults(host_test::Faults::default());
        assert!(e.request(1, keyed("/o", "k", "x"))?.upstream_called);
    }
    Ok(())
}

#[test]
fn scopes_never_see_each_other() -> R {
    let (mut e, _) = started(r#"{"scope": {"headers": ["x-tenant"]}}"#, 2)?;
    let a = e.request(0, keyed("/o", "same", "same").header("x-tenant", "a"))?;
    let b = e.request(1, keyed("/o", "same", "same").header("x-tenant", "b"))?;
    assert!(a.upstream_called && b.upstream_called);
    assert_ne!(a.body, b.body);
    assert_eq!(
        e.request(1, keyed("/o", "same", "same").header("x-tenant", "a"))?
            .body,
        a.body
    );
    assert_eq!(
        e.request(0, keyed("/o", "same", "same").header("x-tenant", "b"))?
            .body,
        b.body
    );
    let none = e.request(0, keyed("/o", "same", "same"))?;
    assert!(none.upstream_called, "no tenant is a scope of its own");
    Ok(())
}

#[test]
fn other_methods_and_keyless_requests_pass_untouched() -> R {
    let (mut e, _) = started("{}", 1)?;
    for _ in 0..2 {
        assert!(
            e.request(0, Request::get("/o").header("idempotency-key", "k"))?
                .upstream_called
        );
        assert!(
            e.request(0, Request::post("/o").body("no key"))?
                .upstream_called
        );
    }
    assert_eq!(e.counter("proxy_dedup_bypassed"), Some(4));
    let records: Vec<String> = e
        .shared_data_keys()
        .into_iter()
        .filter(|k| !k.ends_with("/secret") && !k.ends_with("/layouts"))
        .collect();
    assert!(records.is_empty(), "{records:?}");
    Ok(())
}

#[test]
fn json_pointer_and_fingerprint_keys() -> R {
    let cfg = r#"{"key": {"json_pointer": "/msgId", "fingerprint": ["method", "path", "body"]}}"#;
    let (mut e, up) = started(cfg, 2)?;
    let m = || Request::post("/push").body(r#"{"msgId": "m-1", "text": "hi"}"#);
    assert!(e.request(0, m())?.upstream_called);
    assert_eq!(
        e.request(1, m())?.header("idempotent-replayed"),
        Some("true")
    );
    let other = e.request(
        1,
        Request::post("/push").body(r#"{"msgId": "m-1", "text": "changed"}"#),
    )?;
    assert_eq!(other.status, 422);
    // Not JSON: the fingerprint is the key.
    assert!(
        e.request(0, Request::post("/push").body("form=1"))?
            .upstream_called
    );
    assert!(
        !e.request(1, Request::post("/push").body("form=1"))?
            .upstream_called
    );
    assert!(
        e.request(1, Request::post("/push").body("form=2"))?
            .upstream_called
    );
    assert_eq!(up.calls.get(), 3);
    Ok(())
}

#[test]
fn oversized_bodies() -> R {
    let (mut e, up) = started(r#"{"max_body_bytes": 100, "max_replay_body_bytes": 10}"#, 1)?;
    let big = e.request(0, keyed("/o", "k", &"x".repeat(101)))?;
    assert_eq!(
        (big.status, problem_type(&big.body).as_str()),
        (413, "urn:proxy-dedup:problem:body-too-large")
    );
    assert_eq!(up.calls.get(), 0);
    // The upstream's answer (about 16 bytes) is above max_replay_body_bytes.
    assert!(e.request(0, keyed("/o", "k", "small"))?.upstream_called);
    let dup = e.request(0, keyed("/o", "k", "small"))?;
    assert_eq!(
        (dup.status, problem_type(&dup.body).as_str()),
        (409, "urn:proxy-dedup:problem:response-not-stored")
    );
    assert_eq!(up.calls.get(), 1);
    Ok(())
}

#[test]
fn bad_config_is_refused_with_the_field_named() -> R {
    let up = Upstream::default();
    match envoy_with(r#"{"ttl_seconds": "soon"}"#, 1, &up).build() {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("ttl_seconds"), "{text}");
        }
        Ok(_) => panic!("a bad config must be refused"),
    }
    Ok(())
}
