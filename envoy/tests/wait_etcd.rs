//! Wait mode on the etcd store: two real Envoys (2 workers each) on one 3-member etcd and
//! one demo upstream. Duplicates spread over both proxies wait for the first's answer; a
//! waiter on proxy B gets proxy A's answer (by polling the record); after a 5xx exactly
//! one waiter executes; a wait past `wait_timeout_ms` gets 409; waiters whose clients
//! hang up leave nothing behind; store calls land in the `proxy_dedup_store_call_ms`
//! histogram.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_one_fresh_answer, assert_problem, burst, counter_of, is_replayed, keyed};
use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, EnvoyProcess, Request, Response};
use serde_json::json;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CONFIG: &str = r#"{"key": {"required": true}, "store": {"kind": "etcd", "cluster": "etcd"},
    "on_in_flight": "wait", "wait_timeout_ms": 4000}"#;
const HOST: &str = "orders.example";

/// Dropped in this order: proxies, upstream, etcd.
struct Multi {
    proxies: Vec<EnvoyProcess>,
    upstream: DemoUpstream,
    _etcd: EtcdCluster,
}

impl Multi {
    fn start(name: &str) -> Multi {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let etcd = EtcdCluster::start(&format!("{name}-etcd"), 3)
            .unwrap_or_else(|e| panic!("starting etcd: {e}"));
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let cfg = CONFIG.replace('\n', " ");
        let proxies: Vec<EnvoyProcess> = ["a", "b"]
            .iter()
            .map(|p| {
                let config = multi_proxy_config(&etcd, upstream.port(), &wasm, &cfg)
                    .unwrap_or_else(|e| panic!("{e}"));
                EnvoyProcess::start(&format!("{name}-proxy-{p}"), config)
                    .unwrap_or_else(|e| panic!("starting Envoy: {e}"))
            })
            .collect();
        for p in &proxies {
            wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Multi {
            proxies,
            upstream,
            _etcd: etcd,
        }
    }

    fn send(&self, proxy: usize, req: &Request) -> Response {
        self.proxies[proxy]
            .send(req)
            .unwrap_or_else(|e| panic!("proxy {proxy}: {e}"))
    }

    fn counter(&self, proxy: usize, short: &str) -> u64 {
        counter_of(&self.proxies[proxy], short)
    }

    /// Sends `req` through `proxy` on another thread and returns once the
    /// upstream has begun executing it; join for the answer.
    fn send_in_background(self: &Arc<Self>, proxy: usize, req: Request) -> JoinHandle<Response> {
        let (m, path) = (self.clone(), req.path.clone());
        let answer = std::thread::spawn(move || m.send(proxy, &req));
        self.wait_executions(&path, 1);
        answer
    }

    fn wait_executions(&self, path: &str, n: u64) {
        let end = Instant::now() + Duration::from_secs(5);
        while self.upstream.executions_for_path(path) < n {
            assert!(Instant::now() < end, "the upstream never ran {path}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn etcd_wait_mode_across_two_proxies() {
    let m = Arc::new(Multi::start("wait-etcd"));
    let addrs: Vec<_> = m.proxies.iter().map(EnvoyProcess::addr).collect();

    // 40 concurrent duplicates over both proxies: one execution, 40 identical answers.
    let path = "/wait/forty";
    let req = keyed(HOST, path, "forty-1", &json!({"n": 40})).header("x-demo-delay-ms", "1500");
    let answers = burst(&addrs, 40, &req);
    assert_eq!(m.upstream.executions_for_path(path), 1);
    assert_one_fresh_answer(answers.iter().map(|(_, r)| r));

    // A waiter on proxy B gets proxy A's answer.
    let path = "/wait/other-proxy";
    let req = keyed(HOST, path, "other-1", &json!({"n": 1}));
    let slow = req.clone().header("x-demo-delay-ms", "1200");
    let a = m.send_in_background(0, slow);
    let on_b = m.send(1, &req);
    let on_a = a.join().unwrap();
    assert_eq!(on_a.status, 200);
    assert!(!is_replayed(&on_a));
    assert_eq!(on_b.status, 200, "{}", on_b.summary());
    assert!(is_replayed(&on_b));
    assert_eq!(on_b.body, on_a.body, "B's waiter got A's answer");
    assert!(m.counter(1, "wait_replayed") >= 1);
    assert_eq!(m.upstream.executions_for_path(path), 1);

    // The first answers 503: exactly one waiter executes, the others get its answer.
    let path = "/wait/release";
    let body = json!({"n": 5});
    let failing = keyed(HOST, path, "release-1", &body)
        .header("x-demo-delay-ms", "1000")
        .header("x-demo-status", "503");
    let first = m.send_in_background(0, failing);
    let dup = keyed(HOST, path, "release-1", &body).header("x-demo-delay-ms", "700");
    let answers = burst(&addrs, 10, &dup);
    assert_eq!(first.join().unwrap().status, 503);
    assert_eq!(m.upstream.executions_for_path(path), 2);
    assert_one_fresh_answer(answers.iter().map(|(_, r)| r));

    // A first that runs longer than wait_timeout_ms: the waiter gets 409.
    let path = "/wait/timeout";
    let req = keyed(HOST, path, "timeout-1", &json!({"n": 9}));
    let slow = req.clone().header("x-demo-delay-ms", "6000");
    let first = m.send_in_background(0, slow);
    let dup = m.send(1, &req);
    assert_problem(&dup, 409, "in-flight");
    assert_eq!(m.counter(1, "wait_timeout"), 1);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(m.upstream.executions_for_path(path), 1);

    // Waiters on proxy B whose clients hang up (some with a poll of etcd out) leave
    // nothing behind: after A's first answers 503, only the waiter that stayed runs,
    // and its answer is what a later duplicate on A gets.
    let path = "/wait/hangup";
    let body = json!({"n": 3});
    let failing = keyed(HOST, path, "hangup-1", &body)
        .header("x-demo-delay-ms", "2500")
        .header("x-demo-status", "503");
    let first = m.send_in_background(0, failing);
    let waited = m.counter(1, "waited");
    for i in 0..3u64 {
        let mut conn =
            dedup_envoy::client::Connection::open(m.proxies[1].addr(), Duration::from_secs(5))
                .unwrap();
        conn.write_request(&keyed(HOST, path, "hangup-1", &body))
            .unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while m.counter(1, "waited") < waited + i + 1 {
            assert!(Instant::now() < end, "waiter {i} never waited");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Long enough for a poll (every 250 ms) to be out now and then.
        std::thread::sleep(Duration::from_millis(100 * i));
        conn.reset().unwrap();
    }
    let stays = {
        let m = m.clone();
        let req = keyed(HOST, path, "hangup-1", &body).header("x-demo-delay-ms", "200");
        std::thread::spawn(move || m.send(1, &req))
    };
    assert_eq!(first.join().unwrap().status, 503);
    let stays = stays.join().unwrap();
    assert_eq!(stays.status, 200, "{}", stays.summary());
    assert!(!is_replayed(&stays), "the waiter that stayed executed");
    let later = m.send(0, &keyed(HOST, path, "hangup-1", &body));
    assert!(is_replayed(&later), "{}", later.summary());
    assert_eq!(later.body, stays.body);
    assert_eq!(
        m.upstream.executions_for_path(path),
        2,
        "the 503 and the waiter that stayed; none that left"
    );

    // Every store call's round trip lands in the histogram (Envoy merges histograms
    // at its stats flush, every 5 s by default). In Prometheus's format Envoy strips the
    // `wasmcustom.` namespace and adds no `envoy_` prefix.
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let text = m.proxies[0].prometheus().unwrap();
        assert!(
            text.lines().any(|l| l.starts_with("proxy_dedup_requests")),
            "no proxy_dedup_requests in /stats/prometheus"
        );
        let count = text
            .lines()
            .find(|l| l.starts_with("proxy_dedup_store_call_ms_count"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        if count > 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "no proxy_dedup_store_call_ms samples in /stats/prometheus: {:?}",
            text.lines()
                .filter(|l| l.contains("store_call"))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
