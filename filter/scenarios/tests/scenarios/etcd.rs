//! The etcd store in host-test: gRPC calls (and, with `store.protocol: "json"`, HTTP
//! calls to the JSON gateway) to a real etcd on loopback (two "proxies" sharing it), and
//! to clusters that reset or never answer.

use super::{envoy_with, keyed, problem_type, SendWhole, Upstream, R};
use dedup_envoy::etcd::EtcdCluster;
use host_test::{EnvoyBuilder, GrpcReply, Reply, SimEnvoy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One etcd member on free loopback ports (dedup-envoy's launcher, stopped on drop)
/// and the address the proxies' "etcd" cluster points at.
pub(super) struct Etcd {
    _cluster: EtcdCluster,
    pub(super) client: String,
}

impl Etcd {
    pub(super) fn start() -> Etcd {
        let cluster = EtcdCluster::start("host-test-etcd", 1).unwrap();
        let client = cluster.members[0].client_addr().to_string();
        Etcd {
            _cluster: cluster,
            client,
        }
    }

    /// `b` with its "etcd" cluster pointed at this member: gRPC, or HTTP to the
    /// JSON gateway when `json`.
    pub(super) fn cluster(&self, b: EnvoyBuilder, json: bool) -> EnvoyBuilder {
        if json {
            b.cluster_addr("etcd", &self.client)
        } else {
            b.grpc_cluster_addr("etcd", &self.client)
        }
    }
}

/// The filter config on the etcd store (over gRPC, or the JSON gateway when `json`),
/// with `extra` top-level fields (each preceded by a comma).
pub(super) fn etcd_config(json: bool, extra: &str) -> String {
    let protocol = if json { "json" } else { "grpc" };
    format!(
        r#"{{"store": {{"kind": "etcd", "cluster": "etcd", "timeout_ms": 2000, "protocol": "{protocol}"}}{extra}}}"#
    )
}

/// A "proxy" on the etcd store with `workers` workers and the `extra` fields of
/// `etcd_config`, calling `up` upstream and the real `etcd` through its "etcd"
/// cluster: over gRPC, or the JSON gateway when `json`. Each has its own random
/// source, as separate Envoy processes do (claim tokens are random).
pub(super) fn proxy_with(
    etcd: &Etcd,
    up: &Upstream,
    workers: usize,
    json: bool,
    extra: &str,
) -> Result<SimEnvoy, host_test::Error> {
    static SEED: AtomicU64 = AtomicU64::new(1);
    let b = envoy_with(&etcd_config(json, extra), workers, up)
        .random_seed(SEED.fetch_add(1, Ordering::Relaxed));
    etcd.cluster(b, json).build()
}

/// `proxy_with` over gRPC, no extra fields.
fn proxy(etcd: &Etcd, up: &Upstream, workers: usize) -> Result<SimEnvoy, host_test::Error> {
    proxy_with(etcd, up, workers, false, "")
}

/// A fresh etcd (keep it: dropping it stops etcd) and counting upstream, and two
/// proxies on them, `proxy_with` these arguments.
pub(super) fn two_proxies(
    workers: usize,
    json: bool,
    extra: &str,
) -> Result<(Etcd, Upstream, SimEnvoy, SimEnvoy), host_test::Error> {
    let etcd = Etcd::start();
    let up = Upstream::default();
    let a = proxy_with(&etcd, &up, workers, json, extra)?;
    let b = proxy_with(&etcd, &up, workers, json, extra)?;
    Ok((etcd, up, a, b))
}

over_grpc_and_json!(
    two_proxies_share: two_proxies_share_one_real_etcd,
    two_proxies_share_one_real_etcd_over_the_json_gateway
);

#[test]
fn a_grpc_proxy_and_a_json_proxy_share_records() -> R {
    // Same records whatever the protocol: a fleet can switch proxy by proxy.
    let etcd = Etcd::start();
    let up = Upstream::default();
    let (mut g, mut j) = (
        proxy_with(&etcd, &up, 1, false, "")?,
        proxy_with(&etcd, &up, 1, true, "")?,
    );
    assert!(
        g.request(0, keyed("/orders", "mixed", "{}"))?
            .upstream_called
    );
    let replay = j.request(0, keyed("/orders", "mixed", "{}"))?;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert!(
        j.request(0, keyed("/orders", "mixed-j", "{}"))?
            .upstream_called
    );
    let replay = g.request(0, keyed("/orders", "mixed-j", "{}"))?;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.calls.get(), 2);
    Ok(())
}

fn two_proxies_share(json: bool) -> R {
    let (_etcd, up, mut a, mut b) = two_proxies(2, json, "")?;
    // In flight on A: B learns it from etcd.
    let first = a.send(0, keyed("/orders", "k1", "{}"))?;
    assert!(a.upstream_request(first).is_some());
    let dup = b.request(1, keyed("/orders", "k1", "{}"))?;
    assert_eq!(
        (dup.status, problem_type(&dup.body).as_str()),
        (409, "urn:proxy-dedup:problem:in-flight")
    );
    a.respond(first, Reply::new(201).body("created"))?;
    // Completed on A: B replays it.
    let replay = b.request(0, keyed("/orders", "k1", "{}"))?;
    assert_eq!(
        (replay.status, replay.body_str().as_str()),
        (201, "created")
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(b.request(0, keyed("/orders", "k1", "changed"))?.status, 422);
    // A 5xx on B releases the claim in etcd: A executes it again.
    up.status.set(500);
    assert_eq!(b.request(1, keyed("/orders", "k2", "{}"))?.status, 500);
    up.status.set(0);
    assert!(a.request(0, keyed("/orders", "k2", "{}"))?.upstream_called);
    // The handler saw the 500 and the retry (the first stream was answered by hand).
    assert_eq!(up.calls.get(), 2);
    assert_eq!(
        a.counter("proxy_dedup_store_errors").unwrap_or(0)
            + b.counter("proxy_dedup_store_errors").unwrap_or(0),
        0
    );
    Ok(())
}

#[test]
fn failing_and_silent_clusters_follow_failure_mode() -> R {
    for (mode, want, json) in [
        ("open", 200, false),
        ("closed", 503, false),
        ("open", 200, true),
        ("closed", 503, true),
    ] {
        let up = Upstream::default();
        let resets = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = resets.clone();
        let config = etcd_config(json, &format!(r#", "failure_mode": "{mode}""#));
        let b = envoy_with(&config, 1, &up);
        let mut e = if json {
            b.cluster("etcd", move |_| {
                seen.set(seen.get() + 1);
                Reply::reset()
            })
            .build()?
        } else {
            b.grpc_cluster("etcd", move |_| {
                seen.set(seen.get() + 1);
                GrpcReply::reset()
            })
            .build()?
        };
        let r = e.request(0, keyed("/o", "k", "x"))?;
        assert_eq!(r.status, want, "{mode}: reset cluster");
        assert!(
            resets.get() >= 2,
            "a reset call is retried within the budget"
        );
        if mode == "closed" {
            assert_eq!(
                problem_type(&r.body),
                "urn:proxy-dedup:problem:store-unavailable"
            );
        }
        assert_eq!(e.counter("proxy_dedup_store_errors"), Some(1));

        // A cluster that never answers: the call's timeout (virtual clock) decides.
        if json {
            e.set_cluster("etcd", |_| Reply::no_answer());
        } else {
            e.set_grpc_cluster("etcd", |_| GrpcReply::no_answer());
        }
        let id = e.send(0, keyed("/o", "k2", "x"))?;
        assert!(e.response(id).is_none(), "waiting on etcd");
        e.advance(Duration::from_millis(2_001));
        let r = e.finish_stream(id)?;
        assert_eq!(r.status, want, "{mode}: silent cluster");
        assert_eq!(e.counter("proxy_dedup_store_errors"), Some(2));
    }
    Ok(())
}

#[test]
fn the_response_waits_until_etcd_has_the_completed_record() -> R {
    // Read-your-writes across proxies: once a client has the first response, a retry on
    // any proxy is a replay, never a 409.
    let (_etcd, _, mut a, mut b) = two_proxies(1, false, "")?;
    for (key, status) in [("k-ok", 200u16), ("k-fail", 503)] {
        let first = a.send(0, keyed("/orders", key, "{}"))?;
        a.hold_callouts(true);
        a.respond(first, Reply::new(status).body("done"))?;
        assert_eq!(
            a.held_callouts(),
            1,
            "{key}: the completion or release is in flight"
        );
        assert!(
            a.response(first).is_none(),
            "{key}: the client does not have the response yet"
        );
        a.hold_callouts(false);
        a.release_callouts();
        let r = a.response(first).expect("released once etcd answered");
        assert_eq!((r.status, r.body_str().as_str()), (status, "done"));
        let retry = b.request(0, keyed("/orders", key, "{}"))?;
        if status == 200 {
            assert_eq!(retry.header("idempotent-replayed"), Some("true"), "{key}");
        } else {
            assert!(retry.upstream_called, "{key}: the released key runs again");
        }
    }
    Ok(())
}

#[test]
fn an_answer_after_the_stream_ended_reaches_the_root() -> R {
    // Envoy makes every callout on the root context: a completion still in flight when the
    // client hangs up is answered after the stream's context is gone. The filter hands
    // such calls to the root (no trap, no lost answer), and the worker serves on.
    let etcd = Etcd::start();
    let up = Upstream::default();
    let mut a = envoy_with(&etcd_config(false, ""), 1, &up)
        .grpc_cluster_addr("etcd", &etcd.client)
        .log_level(host_test::LogLevel::Debug)
        .build()?;
    let first = a.send(0, keyed("/orders", "k-gone", "{}"))?;
    // The completion's first attempt fails (a member that resets): only a retry made
    // after the client left can complete the record.
    a.set_grpc_cluster("etcd", |_| GrpcReply::reset());
    a.hold_callouts(true);
    a.respond(first, Reply::new(200).body("done"))?;
    assert!(a.held_callouts() >= 1, "the completion is in flight");
    a.set_grpc_cluster_addr("etcd", &etcd.client);
    a.reset_client(first)?;
    assert!(
        a.log_contains("ended with 1 pending call"),
        "{:?}",
        a.logs()
    );
    a.hold_callouts(false);
    a.release_callouts();
    assert!(!a.worker_failed(0));
    // The completion reached etcd although nobody waited for it: the record is
    // completed, and another proxy replays it.
    let mut b = proxy(&etcd, &up, 1)?;
    let dup = b.request(0, keyed("/orders", "k-gone", "{}"))?;
    assert_eq!(dup.header("idempotent-replayed"), Some("true"), "{:?}", dup);
    let next = a.request(0, keyed("/orders", "k-next", "{}"))?;
    assert_eq!(next.status, 200);
    assert!(next.upstream_called);
    Ok(())
}

#[test]
fn a_proxy_whose_clock_runs_60_s_ahead_never_takes_over_a_live_claim() -> R {
    // In-flight records end when etcd ends their lease, not when another proxy's clock
    // says so: B runs 60 s ahead of A (and of etcd), twice the in-flight timeout.
    let (_etcd, up, mut a, mut b) = two_proxies(1, false, "")?;
    b.advance(Duration::from_secs(60));
    let first = a.send(0, keyed("/orders", "skew", "{}"))?;
    assert!(a.upstream_request(first).is_some());
    let dup = b.request(0, keyed("/orders", "skew", "{}"))?;
    // By B's clock the claim is past its in-flight time: it may call it an unknown
    // outcome, never free.
    assert_eq!(
        dup.status, 409,
        "B must not take over A's live claim by its own clock"
    );
    assert!(
        matches!(
            problem_type(&dup.body).as_str(),
            "urn:proxy-dedup:problem:in-flight" | "urn:proxy-dedup:problem:outcome-unknown"
        ),
        "{}",
        problem_type(&dup.body)
    );
    assert!(!dup.upstream_called);
    a.respond(first, Reply::new(201).body("once"))?;
    let replay = b.request(0, keyed("/orders", "skew", "{}"))?;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body_str(), "once");
    // The other way round: A is 60 s behind B's completed records' clock, and still
    // replays them (completed records expire by the time inside them).
    let on_b = b.request(0, keyed("/orders", "skew-b", "{}"))?;
    assert!(on_b.upstream_called);
    let replay = a.request(0, keyed("/orders", "skew-b", "{}"))?;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.calls.get(), 1, "only skew-b reached the handler");
    Ok(())
}
