//! The operations kit against real Envoys: the Prometheus rules
//! (envoy/ops/prometheus/) pass `promtool test rules` on series scraped from a run of
//! three Envoys with the filter (two on a real 3-member etcd, one on shared data) and
//! the demo upstream, driven through healthy traffic, an etcd outage and a run of
//! trouble (the timeline is in proxy-dedup.test.yaml); every metric a rule uses is
//! needed by that test (each renamed in turn makes promtool fail); the Grafana
//! dashboard (envoy/ops/grafana/) queries only metrics those Envoys export, and
//! shows every counter; each alert's runbook names a section of the troubleshooting
//! page, and the alerts page names every alert.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_executed, assert_problem, counter_of, is_replayed, json};
use dedup_envoy::etcd::{multi_proxy_config, wait_etcd_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::{dedup_wasm, scratch_dir, workspace_root};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const RULES: &str = "envoy/ops/prometheus/proxy-dedup.rules.yaml";
const RULES_TEST: &str = "envoy/ops/prometheus/proxy-dedup.test.yaml";
const DASHBOARD: &str = "envoy/ops/grafana/proxy-dedup.json";
const TROUBLESHOOTING: &str = "docs/src/operations/troubleshooting.md";
const ALERTS_PAGE: &str = "docs/src/operations/alerts.md";

/// Rounds of each phase (one scrape after each; proxy-dedup.test.yaml's timeline).
const HEALTHY: usize = 6;
const ETCD_DOWN: usize = 6;
const TROUBLE: usize = 6;
const QUIET: usize = 12;

/// The instances, as proxy-dedup.test.yaml names them.
const NAMES: [&str; 3] = ["proxy-1", "proxy-2", "proxy-3"];
/// proxy-1's caller (`authorization`), and the same client after a token refresh.
const TOKEN: &str = "Bearer token-1";
const REFRESHED: &str = "Bearer token-2";

fn root_file(rel: &str) -> PathBuf {
    workspace_root().join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root_file(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// --- one scrape ---------------------------------------------------------------

/// One /stats/prometheus answer: the filter's series (`proxy_dedup_*`, labels as
/// Envoy wrote them, `name{}` written `name`) and their values as written; and every
/// metric name Envoy exported (series names, and the names of `# TYPE` lines).
#[derive(Debug, Clone, Default)]
struct Scrape {
    series: BTreeMap<String, String>,
    names: BTreeSet<String>,
}

fn parse_scrape(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                s.names.insert(name.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        s.names.insert(name.to_string());
        if name.starts_with("proxy_dedup_") {
            assert!(
                value.parse::<f64>().is_ok(),
                "not a sample value in /stats/prometheus: {line:?}"
            );
            let series = series.strip_suffix("{}").unwrap_or(series);
            s.series.insert(series.to_string(), value.to_string());
        }
    }
    s
}

impl Scrape {
    /// A counter's value (`short`: `executed` for `proxy_dedup_executed`).
    fn counter(&self, short: &str) -> u64 {
        let name = format!("proxy_dedup_{short}");
        let v = self
            .series
            .get(&name)
            .unwrap_or_else(|| panic!("{name} not in the scrape"));
        v.parse::<f64>().unwrap() as u64
    }
}

// --- the run -------------------------------------------------------------------

/// Everything the tests read from one run: each proxy's scrapes, in order.
struct Run {
    scrapes: [Vec<Scrape>; 3],
}

/// The three proxies and what they stand on.
struct World {
    // Envoys first: stopped before etcd and the upstream.
    proxies: [EnvoyProcess; 3],
    etcd: EtcdCluster,
    upstream: DemoUpstream,
    scrapes: [Vec<Scrape>; 3],
}

fn etcd_config(extra: Value) -> String {
    let mut c = json!({"key": {"required": true}, "store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 1000}});
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            c[k] = v;
        }
    }
    c.to_string()
}

/// proxy-3: one bucket of 16 records, tenants by `x-tenant`, and a rule whose records
/// (among the top level's) live one second.
const SHARED_CONFIG: &str = r#"{"key": {"required": true}, "capacity": 16,
 "scope": {"headers": ["x-tenant"]},
 "rules": [{"name": "short", "match": {"path_prefix": "/short"}, "records_of": "default",
            "ttl_seconds": 1, "in_flight_timeout_seconds": 1}]}"#;

impl World {
    fn start() -> World {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let etcd = EtcdCluster::start("ops-etcd", 3).unwrap();
        let upstream = DemoUpstream::start(0, false).unwrap();
        let on_etcd = |name: &str, cfg: String| {
            let c = multi_proxy_config(&etcd, upstream.port(), &wasm, &cfg).unwrap();
            EnvoyProcess::start(name, c).unwrap_or_else(|e| panic!("starting {name}: {e}"))
        };
        let p1 = on_etcd("ops-proxy-1", etcd_config(json!({})));
        let p2 = on_etcd("ops-proxy-2", etcd_config(json!({"failure_mode": "open"})));
        let c3 = EnvoyConfig::single_node(upstream.port(), &wasm, SHARED_CONFIG).unwrap();
        let p3 = EnvoyProcess::start("ops-proxy-3", c3).unwrap_or_else(|e| panic!("{e}"));
        for p in [&p1, &p2] {
            wait_etcd_hosts_healthy(p, 3, Duration::from_secs(10)).unwrap();
        }
        World {
            proxies: [p1, p2, p3],
            etcd,
            upstream,
            scrapes: Default::default(),
        }
    }

    fn send(&self, p: usize, req: &Request) -> Response {
        self.proxies[p]
            .send(req)
            .unwrap_or_else(|e| panic!("{} {} {}: {e}", NAMES[p], req.method, req.path))
    }

    /// Scrapes every proxy once: the next sample of every series.
    fn scrape(&mut self) {
        for (p, proxy) in self.proxies.iter().enumerate() {
            let text = proxy.prometheus().unwrap();
            self.scrapes[p].push(parse_scrape(&text));
        }
    }

    /// How much `short` grew on proxy `p` between the last two scrapes.
    fn grew(&self, p: usize, short: &str) -> u64 {
        let s = &self.scrapes[p];
        let (a, b) = (&s[s.len() - 2], &s[s.len() - 1]);
        b.counter(short) - a.counter(short)
    }

    /// After a round: each counter named grew by exactly this much on proxy `p`.
    fn assert_round(&self, p: usize, what: &str, want: &[(&str, u64)]) {
        for (short, n) in want {
            assert_eq!(
                self.grew(p, short),
                *n,
                "{} in a {what} round: proxy_dedup_{short}\nEnvoy log {}",
                NAMES[p],
                self.proxies[p].log_path.display()
            );
        }
    }

    /// Waits (up to 5 s) until the upstream has begun an execution of `key`.
    fn wait_begun(&self, key: &str) {
        let end = Instant::now() + Duration::from_secs(5);
        while self.upstream.executions_for_key(key) == 0 {
            assert!(Instant::now() < end, "the upstream never began {key}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits (up to 5 s) until proxy `p`'s counter `short` reaches `n`.
    fn wait_counter(&self, p: usize, short: &str, n: u64) {
        let end = Instant::now() + Duration::from_secs(5);
        while counter_of(&self.proxies[p], short) < n {
            assert!(
                Instant::now() < end,
                "{}: proxy_dedup_{short} stayed below {n}",
                NAMES[p]
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A healthy round on an etcd proxy (8 requests; with `refreshed`, 9: the first
    /// key again from the same client with a refreshed token, `422
    /// principal-mismatch`).
    fn healthy_etcd_round(&self, p: usize, round: usize, refreshed: bool) {
        let key = |n: usize| format!("{}-r{round}-k{n}", NAMES[p]);
        let req = |k: &str, body: Value| {
            Request::post("/orders/ops")
                .key(k)
                .header("authorization", TOKEN)
                .json(&body)
        };
        let (k1, k2, k3) = (key(1), key(2), key(3));
        let first = self.send(p, &req(&k1, json!({"n": 1})));
        assert_executed(&first);
        assert_executed(&self.send(p, &req(&k2, json!({"n": 2}))));
        let replay = self.send(p, &req(&k1, json!({"n": 1})));
        assert!(is_replayed(&replay), "{}", replay.summary());
        assert_eq!(json(&replay)["order_id"], json(&first)["order_id"]);
        assert!(is_replayed(&self.send(p, &req(&k2, json!({"n": 2})))));
        assert_problem(
            &self.send(p, &req(&k1, json!({"n": 99}))),
            422,
            "payload-mismatch",
        );
        assert_problem(
            &self.send(p, &Request::post("/orders/ops").json(&json!({}))),
            400,
            "missing-key",
        );
        // A slow first request and its duplicate meanwhile.
        let slow = req(&k3, json!({"n": 3})).header("x-demo-delay-ms", "500");
        let addr = self.proxies[p].addr();
        let background = {
            let slow = slow.clone();
            std::thread::spawn(move || dedup_envoy::client::send(addr, &slow).unwrap())
        };
        self.wait_begun(&k3);
        assert_problem(&self.send(p, &req(&k3, json!({"n": 3}))), 409, "in-flight");
        assert_executed(&background.join().unwrap());
        if refreshed {
            let again = Request::post("/orders/ops")
                .key(&k1)
                .header("authorization", REFRESHED)
                .json(&json!({"n": 1}));
            assert_problem(&self.send(p, &again), 422, "principal-mismatch");
        }
    }

    /// A round on an etcd proxy while etcd is down: two new keys.
    fn etcd_down_round(&self, p: usize, round: usize) {
        for n in 1..=2 {
            let k = format!("{}-r{round}-down{n}", NAMES[p]);
            let r = self.send(
                p,
                &Request::post("/orders/ops")
                    .key(&k)
                    .header("authorization", TOKEN)
                    .json(&json!({"n": n})),
            );
            if p == 0 {
                assert_problem(&r, 503, "store-unavailable");
                assert_eq!(self.upstream.executions_for_key(&k), 0);
            } else {
                // failure_mode "open": passed unrecorded.
                assert_executed(&r);
            }
        }
    }

    fn shared_req(&self, path: &str, key: &str, tenant: &str) -> Request {
        Request::post(path)
            .key(key)
            .header("x-tenant", tenant)
            .json(&json!({"key": key}))
    }

    /// A healthy round on proxy-3: one first request and its replay.
    fn healthy_shared_round(&self, round: usize) {
        let req = self.shared_req("/orders/ops", &format!("p3-r{round}"), "shop");
        let first = self.send(2, &req);
        assert_executed(&first);
        let replay = self.send(2, &req);
        assert!(is_replayed(&replay), "{}", replay.summary());
    }

    /// A round of trouble on proxy-3 (8 requests). Its one bucket is full from the
    /// first such round on: the tenant `shop` then evicts its own completed records
    /// before their TTL, and another tenant finds no room.
    fn trouble_round(&self, round: usize) {
        let p = 2;
        // A request that outlives its record (the `short` rule's 1 s TTL): its claim
        // is lost, and its way is free again.
        let before = counter_of(&self.proxies[p], "claims_lost");
        let short = self
            .shared_req("/short/ops", &format!("p3-r{round}-short"), "shop")
            .header("x-demo-delay-ms", "1300");
        assert_executed(&self.send(p, &short));
        self.wait_counter(p, "claims_lost", before + 1);
        // Three first requests and a replay.
        for n in 1..=3 {
            let req = self.shared_req("/orders/ops", &format!("p3-r{round}-k{n}"), "shop");
            assert_executed(&self.send(p, &req));
        }
        let req = self.shared_req("/orders/ops", &format!("p3-r{round}-k3"), "shop");
        assert!(is_replayed(&self.send(p, &req)));
        // A client that hangs up while its request runs: the outcome is unknown, and
        // the retry gets 409 outcome-unknown.
        let lost = format!("p3-r{round}-lost");
        let before = counter_of(&self.proxies[p], "outcome_unknown");
        let slow = self
            .shared_req("/orders/ops", &lost, "shop")
            .header("x-demo-delay-ms", "1500");
        let gone = dedup_envoy::client::send_or_give_up(
            self.proxies[p].addr(),
            &slow,
            Duration::from_millis(200),
            dedup_envoy::client::Leave::Close,
        )
        .unwrap();
        assert!(
            matches!(gone, dedup_envoy::client::GiveUp::GaveUp),
            "{gone:?}"
        );
        self.wait_counter(p, "outcome_unknown", before + 1);
        assert_problem(
            &self.send(p, &self.shared_req("/orders/ops", &lost, "shop")),
            409,
            "outcome-unknown",
        );
        // Another tenant: the bucket holds only `shop`'s records and claims.
        let other = self.shared_req("/orders/ops", &format!("p3-r{round}-other"), "other");
        assert_problem(&self.send(p, &other), 503, "store-full");
    }

    /// The whole timeline of proxy-dedup.test.yaml, scraping after each round.
    fn drive(&mut self) {
        self.scrape();
        let etcd_round = [
            ("requests", 8),
            ("executed", 3),
            ("replayed", 2),
            ("rejected_in_flight", 1),
            ("payload_mismatch", 1),
            ("bad_key", 1),
            ("store_errors", 0),
        ];
        let shared_round = [("requests", 2), ("executed", 1), ("replayed", 1)];
        let mut round = 0;
        for _ in 0..HEALTHY {
            round += 1;
            self.healthy_etcd_round(0, round, false);
            self.healthy_etcd_round(1, round, false);
            self.healthy_shared_round(round);
            self.scrape();
            self.assert_round(0, "healthy", &etcd_round);
            self.assert_round(1, "healthy", &etcd_round);
            self.assert_round(2, "healthy", &shared_round);
        }
        self.etcd.kill_all();
        for p in 0..2 {
            wait_etcd_hosts_healthy(&self.proxies[p], 0, Duration::from_secs(10)).unwrap();
        }
        for _ in 0..ETCD_DOWN {
            round += 1;
            let w = &*self;
            std::thread::scope(|s| {
                s.spawn(|| w.etcd_down_round(0, round));
                s.spawn(|| w.etcd_down_round(1, round));
            });
            self.healthy_shared_round(round);
            self.scrape();
            self.assert_round(
                0,
                "etcd-down",
                &[("requests", 2), ("store_unavailable", 2), ("executed", 0)],
            );
            self.assert_round(1, "etcd-down", &[("requests", 2), ("failed_open", 2)]);
            self.assert_round(2, "etcd-down", &shared_round);
            assert!(self.grew(0, "store_errors") >= 2);
            assert!(self.grew(1, "store_errors") >= 2);
        }
        for i in 0..3 {
            self.etcd.restart(i).unwrap();
        }
        self.etcd
            .wait_healthy(dedup_envoy::etcd::HEALTHY_TIMEOUT)
            .unwrap();
        for p in 0..2 {
            wait_etcd_hosts_healthy(&self.proxies[p], 3, Duration::from_secs(15)).unwrap();
        }
        for _ in 0..TROUBLE {
            round += 1;
            self.healthy_etcd_round(0, round, true);
            self.healthy_etcd_round(1, round, false);
            self.trouble_round(round);
            self.scrape();
            let mut with_refresh = etcd_round.to_vec();
            with_refresh[0].1 += 1;
            with_refresh.push(("principal_mismatch", 1));
            self.assert_round(0, "trouble", &with_refresh);
            self.assert_round(1, "trouble", &etcd_round);
            self.assert_round(
                2,
                "trouble",
                &[
                    ("requests", 8),
                    ("executed", 5),
                    ("replayed", 1),
                    ("outcome_unknown", 1),
                    ("rejected_outcome_unknown", 1),
                    ("store_full", 1),
                    ("claims_lost", 1),
                ],
            );
        }
        assert!(
            self.scrapes[2]
                .last()
                .unwrap()
                .counter("evictions_unexpired")
                > 0,
            "no completed record was evicted on proxy-3"
        );
        // Envoy publishes histograms at its stats flush (every 5 s): the trouble
        // phase is long enough for proxy-1's store call histogram to move in it, which
        // the test's p99 expectation at minute 18 needs.
        let calls = |s: &Scrape| s.counter("store_call_ms_count");
        let p1 = &self.scrapes[0];
        assert!(
            calls(&p1[p1.len() - 1]) > calls(&p1[p1.len() - 1 - (TROUBLE - 1)]),
            "proxy-1's proxy_dedup_store_call_ms did not move in the last {} rounds",
            TROUBLE - 1
        );
        for _ in 0..QUIET {
            self.scrape();
            for p in 0..3 {
                self.assert_round(p, "quiet", &[("requests", 0)]);
            }
        }
    }
}

/// The run, once for every test of this file; a failed run fails each of them with
/// its message.
fn run() -> &'static Run {
    static RUN: OnceLock<Result<Run, String>> = OnceLock::new();
    let got = RUN.get_or_init(|| {
        std::panic::catch_unwind(|| {
            let mut w = World::start();
            w.drive();
            Run {
                scrapes: std::mem::take(&mut w.scrapes),
            }
        })
        .map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    match got {
        Ok(r) => r,
        Err(e) => panic!("the run of real Envoys failed: {e}"),
    }
}

impl Run {
    /// promtool's `input_series`: every filter series of every proxy, one sample per
    /// scrape (`_` where a scrape lacked it), with the labels Prometheus adds to a
    /// target (`job`, `instance`).
    fn input_series(&self) -> String {
        let mut out = String::new();
        for (p, scrapes) in self.scrapes.iter().enumerate() {
            let all: BTreeSet<&String> = scrapes.iter().flat_map(|s| s.series.keys()).collect();
            for series in all {
                let target = format!("job=\"envoy\",instance=\"{}\"", NAMES[p]);
                let labelled = match series.strip_suffix('}') {
                    Some(open) => format!("{open},{target}}}"),
                    None => format!("{series}{{{target}}}"),
                };
                let values: Vec<&str> = scrapes
                    .iter()
                    .map(|s| s.series.get(series).map_or("_", String::as_str))
                    .collect();
                out.push_str(&format!(
                    "  - series: '{labelled}'\n    values: '{}'\n",
                    values.join(" ")
                ));
            }
        }
        out
    }

    /// Every metric name the proxies exported.
    fn exported_names(&self) -> BTreeSet<String> {
        self.scrapes
            .iter()
            .flatten()
            .flat_map(|s| s.names.iter().cloned())
            .collect()
    }
}

// --- promtool ------------------------------------------------------------------

/// The promtool test with `rules` and this run's series, written to `path`.
fn write_rules_test(run: &Run, rules: &Path, path: &Path) {
    // The kit's renderer quotes a value for where it stands (here a YAML scalar).
    let rule_file = rules.display().to_string();
    let series = run.input_series();
    let vars = [
        ("RULE_FILE", rule_file),
        ("INPUT_SERIES", series.trim_end().to_string()),
    ];
    // The kit's template rendering: comment lines kept, a placeholder without a
    // value an error.
    let text = dedup_envoy::config::render(&read(RULES_TEST), &vars)
        .unwrap_or_else(|e| panic!("{RULES_TEST}: {e}"));
    std::fs::write(path, text).unwrap();
}

/// `promtool test rules FILE`: whether it passed, and what it printed.
fn promtool_test(file: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): run `make deps` (Debian's `prometheus` package)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_rules_pass_promtool_on_series_from_real_envoys() {
    let run = run();
    // Kept for whoever changes the rules: `promtool test rules target/ops/...`.
    let dir = root_file("target/ops");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("proxy-dedup.test.yaml");
    write_rules_test(run, &root_file(RULES), &file);
    let (ok, out) = promtool_test(&file);
    assert!(ok, "promtool test rules {}:\n{out}", file.display());
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The numbers of the lines of a rules file that hold its rules' `expr` (a block
/// scalar's lines included).
fn expr_lines(rules: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut block: Option<usize> = None;
    for (i, line) in rules.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = block {
            if line.trim().is_empty() || indent > at {
                lines.push(i);
                continue;
            }
            block = None;
        }
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            lines.push(i);
            if rest.trim() == "|" {
                block = Some(indent);
            }
        }
    }
    lines
}

/// The metric names (not recording rules' names) in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| !t.contains(':') && (t.starts_with("proxy_dedup_") || t.starts_with("envoy_")))
        .map(str::to_string)
        .collect()
}

#[test]
fn each_metric_the_rules_use_is_exported_and_checked_by_the_test() {
    let run = run();
    let rules = read(RULES);
    let lines: Vec<&str> = rules.lines().collect();
    let exprs = expr_lines(&rules);
    let used: BTreeSet<String> = exprs.iter().flat_map(|&i| metric_names(lines[i])).collect();
    assert!(used.len() > 10, "metrics in {RULES}: {used:?}");
    let exported = run.exported_names();
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "{RULES} uses metrics Envoy does not export: {missing:?}"
    );
    // Each metric renamed in the rules' expressions makes the promtool test fail.
    let dir = scratch_dir("ops-mutants").unwrap();
    let mut survived = Vec::new();
    for name in &used {
        let mutated: String = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let l = if exprs.contains(&i) {
                    replace_token(l, name, &format!("{name}_typo"))
                } else {
                    l.to_string()
                };
                l + "\n"
            })
            .collect();
        assert_ne!(mutated, rules, "{name} not replaced");
        let rules_file = dir.join(format!("{name}.rules.yaml"));
        std::fs::write(&rules_file, mutated).unwrap();
        let test_file = dir.join(format!("{name}.test.yaml"));
        write_rules_test(run, &rules_file, &test_file);
        let (ok, _) = promtool_test(&test_file);
        if ok {
            survived.push(name.clone());
        }
    }
    assert!(
        survived.is_empty(),
        "with these metrics renamed in {RULES}, `promtool test rules` still passed \
         (give {RULES_TEST} an expectation that needs them): {survived:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `line` with each whole-token `from` (a metric name) replaced by `to`.
fn replace_token(line: &str, from: &str, to: &str) -> String {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().last();
        let after = rest[at + from.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

// --- the dashboard ---------------------------------------------------------------

/// Every `expr` of the dashboard's panels and template variables (`query`).
fn dashboard_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::Object(q)) => {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    _ => dashboard_queries(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_queries(x, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_queries_only_exported_metrics_and_shows_every_counter() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"));
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert!(
        queries.len() > 10,
        "{} queries in {DASHBOARD}",
        queries.len()
    );
    let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    let exported = run().exported_names();
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} queries metrics Envoy does not export: {missing:?}"
    );
    // Recorded series it reads must be recorded by the rules.
    let rules = read(RULES);
    for q in &queries {
        for t in q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            if t.matches(':').count() == 2 {
                assert!(
                    rules.contains(&format!("record: {t}")),
                    "{DASHBOARD} reads {t}, which {RULES} does not record"
                );
            }
        }
    }
    let names: Vec<&str> = dedup_core::metrics::Counter::ALL
        .iter()
        .map(|c| c.name())
        .collect();
    let unshown: Vec<_> = names.iter().filter(|n| !used.contains(**n)).collect();
    assert!(
        unshown.is_empty(),
        "{DASHBOARD} shows no panel for these counters: {unshown:?}"
    );
    for n in names {
        assert!(exported.contains(n), "{n} is not exported by Envoy");
    }
}

// --- the docs of the kit -----------------------------------------------------------

/// A heading's anchor as GitHub and mdBook make it (.ci/check-docs.py's rule).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn each_alert_has_a_troubleshooting_section_and_a_line_on_the_alerts_page() {
    let rules = read(RULES);
    let page = read(TROUBLESHOOTING);
    let anchors: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(slug)
        .collect();
    let runbooks: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook: "))
        .collect();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(runbooks.len(), alerts.len(), "one runbook per alert");
    for r in runbooks {
        let (file, anchor) = r.split_once('#').unwrap();
        assert_eq!(file, TROUBLESHOOTING, "{r}");
        assert!(
            anchors.contains(anchor),
            "runbook {r}: no such section in {TROUBLESHOOTING} (have {anchors:?})"
        );
    }
    let alerts_page = read(ALERTS_PAGE);
    for a in alerts {
        assert!(
            alerts_page.contains(&format!("`{a}`")),
            "{ALERTS_PAGE} does not name the alert {a}"
        );
    }
}
