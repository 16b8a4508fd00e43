//! Differential check: one table of scenarios runs in real Envoy and in host-test, and
//! what a client and the service see must agree step by step: status, the replay header,
//! the problem type, and how many times the upstream executed. A difference is a bug in
//! host-test's fidelity (or in the filter's assumptions about Envoy).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/host.rs"]
mod host;

use common::{counter_of, Stack};
use dedup_envoy::client::Body;
use dedup_envoy::{problem_type, Request, Response};
use host_test::{Reply, SimEnvoy};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

enum Step {
    /// Send and record what came back.
    Send(Request),
    /// Hold `first` at the upstream, send `dup` meanwhile, then let `first` finish.
    WhileInFlight { first: Request, dup: Request },
    /// Wait mode: hold `first` at the upstream, send `dup` (it waits, held by the
    /// filter), then let `first` finish; `dup` is answered after it.
    WaitsForFirst { first: Request, dup: Request },
    /// Let time pass (real in Envoy, virtual in host-test).
    Wait(Duration),
    /// The client sends the request, the upstream gets it and takes long, and the
    /// client hangs up before the answer.
    GiveUp(Request),
}

struct Scenario {
    name: &'static str,
    config: &'static str,
    steps: Vec<Step>,
}

/// What is compared: of a response, its status, the replay header and the problem type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    replayed: bool,
    problem: String,
    /// Upstream executions for this scenario's path, after the step.
    executions: u64,
}

impl Seen {
    fn of(r: &Response, executions: u64) -> Seen {
        Seen {
            status: r.status,
            replayed: r.header("idempotent-replayed") == Some("true"),
            problem: problem_type(&r.body),
            executions,
        }
    }

    /// The client hung up: no answer.
    fn gave_up(executions: u64) -> Seen {
        Seen {
            status: 0,
            replayed: false,
            problem: String::new(),
            executions,
        }
    }
}

/// [`Step::WhileInFlight`].
fn while_in_flight(first: Request, dup: Request) -> Step {
    Step::WhileInFlight { first, dup }
}

/// [`Step::WaitsForFirst`].
fn waits_for_first(first: Request, dup: Request) -> Step {
    Step::WaitsForFirst { first, dup }
}

/// A keyed (or unkeyed) POST to this scenario's path.
fn call(name: &str, key: Option<&str>, body: &str) -> Request {
    let r = Request::post(&format!("/diff/{name}"));
    match key {
        Some(k) => r.key(k),
        None => r,
    }
    .body(body)
}

/// The same request with another method (a GET sends no body).
fn method(mut r: Request, method: &str) -> Request {
    r.method = method.into();
    if method == "GET" {
        r.body = Body::Empty;
    }
    r
}

fn scenarios() -> Vec<Scenario> {
    let k = Some("key-1");
    vec![
        Scenario {
            name: "replay",
            config: "{}",
            steps: vec![
                Step::Send(call("replay", k, r#"{"a":1}"#)),
                Step::Send(call("replay", k, r#"{"a":1}"#)),
                Step::Send(call("replay", k, r#"{"a":2}"#)),
                Step::Send(method(call("replay", k, ""), "GET")),
                Step::Send(call("replay", None, "no key")),
            ],
        },
        Scenario {
            name: "release",
            config: "{}",
            steps: vec![
                Step::Send(call("release", k, "x").header("x-demo-status", "503")),
                Step::Send(call("release", k, "x")),
                Step::Send(call("release", k, "x")),
                Step::Send(call("release", Some("k2"), "x").header("x-demo-status", "404")),
                Step::Send(call("release", Some("k2"), "x")),
            ],
        },
        Scenario {
            name: "required",
            config: r#"{"key": {"required": true, "max_length": 8}}"#,
            steps: vec![
                Step::Send(call("required", None, "x")),
                Step::Send(call("required", Some("123456789"), "x")),
                Step::Send(call("required", Some("12345678"), "x")),
            ],
        },
        Scenario {
            name: "reject",
            config: r#"{"on_duplicate": "reject"}"#,
            steps: vec![
                Step::Send(call("reject", k, "x")),
                Step::Send(call("reject", k, "x")),
            ],
        },
        Scenario {
            name: "scope",
            config: r#"{"scope": {"headers": ["x-tenant"]}}"#,
            steps: vec![
                Step::Send(call("scope", k, "x").header("x-tenant", "a")),
                Step::Send(call("scope", k, "x").header("x-tenant", "b")),
                Step::Send(call("scope", k, "x").header("x-tenant", "a")),
                Step::Send(call("scope", k, "x")),
            ],
        },
        Scenario {
            name: "body-keys",
            config: r#"{"key": {"json_pointer": "/msgId", "fingerprint": ["method", "path", "body"]}}"#,
            steps: vec![
                Step::Send(call("body-keys", None, r#"{"msgId": "m1", "t": 1}"#)),
                Step::Send(call("body-keys", None, r#"{"msgId": "m1", "t": 1}"#)),
                Step::Send(call("body-keys", None, r#"{"msgId": "m1", "t": 2}"#)),
                Step::Send(call("body-keys", None, "form=1")),
                Step::Send(call("body-keys", None, "form=1")),
                Step::Send(call("body-keys", None, r#"{"msgId": [1]}"#)),
            ],
        },
        Scenario {
            name: "in-flight",
            config: "{}",
            steps: vec![
                while_in_flight(call("in-flight", k, "x"), call("in-flight", k, "x")),
                Step::Send(call("in-flight", k, "x")),
            ],
        },
        Scenario {
            name: "wait",
            config: r#"{"on_in_flight": "wait"}"#,
            steps: vec![
                waits_for_first(call("wait", k, "x"), call("wait", k, "x")),
                Step::Send(call("wait", k, "x")),
            ],
        },
        Scenario {
            name: "wait-release",
            config: r#"{"on_in_flight": "wait"}"#,
            steps: vec![
                waits_for_first(
                    call("wait-release", k, "x").header("x-demo-status", "503"),
                    call("wait-release", k, "x"),
                ),
                Step::Send(call("wait-release", k, "x")),
            ],
        },
        Scenario {
            name: "rule-wait",
            config: r#"{"rules": [{"name": "waits",
                "match": {"header": {"name": "x-route", "equals": "wait"}},
                "on_in_flight": "wait"}]}"#,
            steps: vec![
                // The rule waits for the first's answer...
                waits_for_first(
                    call("rule-wait", k, "x").header("x-route", "wait"),
                    call("rule-wait", k, "x").header("x-route", "wait"),
                ),
                // ...while the top level (same key, its own records) answers 409.
                while_in_flight(call("rule-wait", k, "x"), call("rule-wait", k, "x")),
                Step::Send(call("rule-wait", k, "x").header("x-route", "wait")),
            ],
        },
        Scenario {
            name: "limits",
            config: r#"{"max_body_bytes": 16, "max_replay_body_bytes": 8}"#,
            steps: vec![
                Step::Send(call("limits", k, "this body is over sixteen bytes")),
                Step::Send(call("limits", k, "small")),
                Step::Send(call("limits", k, "small")),
            ],
        },
        Scenario {
            name: "hosts",
            config: "{}",
            steps: vec![
                Step::Send(call("hosts", k, "x").host("acme.example")),
                Step::Send(call("hosts", k, "x").host("globex.example")),
                Step::Send(call("hosts", k, "x").host("acme.example")),
            ],
        },
        Scenario {
            name: "ambiguous",
            config: r#"{"scope": {"headers": ["x-tenant"]}}"#,
            steps: vec![
                Step::Send(call("ambiguous", k, "x").header("x-tenant", "victim")),
                Step::Send(
                    call("ambiguous", k, "x")
                        .header("x-tenant", "victim")
                        .header("x-tenant", "attacker"),
                ),
                Step::Send(
                    call("ambiguous", k, "x")
                        .header("x-tenant", "victim")
                        .header("idempotency-key", "key-2"),
                ),
            ],
        },
        Scenario {
            name: "retry-later",
            config: "{}",
            steps: vec![
                Step::Send(call("retry-later", k, "x").header("x-demo-status", "429")),
                Step::Send(call("retry-later", k, "x")),
                Step::Send(call("retry-later", k, "x")),
                Step::Send(
                    call("retry-later", Some("k2"), "x")
                        .header("x-demo-status", "429")
                        .header("content-type", "application/grpc"),
                ),
                Step::Send(
                    call("retry-later", Some("k2"), "x").header("content-type", "application/grpc"),
                ),
            ],
        },
        Scenario {
            name: "ordering",
            config: r#"{"ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}"#,
            steps: {
                let v = |key: &str, version: &str| {
                    call("ordering", Some(key), "x")
                        .header("x-entity", "e1")
                        .header("x-version", version)
                };
                vec![
                    Step::Send(v("v2", "2")),
                    // Stale (not forwarded), stale again, a duplicate replayed.
                    Step::Send(v("v1", "1")),
                    Step::Send(v("v1", "1")),
                    Step::Send(v("v2", "2")),
                    // A 5xx of version 3 raises nothing; its retry runs.
                    Step::Send(v("v3", "3").header("x-demo-status", "503")),
                    Step::Send(v("v3", "3")),
                    Step::Send(v("v2b", "2")),
                    Step::Send(v("bad", "two")),
                    while_in_flight(v("v4", "4"), v("v5", "5")),
                ]
            },
        },
        Scenario {
            name: "gave-up",
            config: r#"{"in_flight_timeout_seconds": 2}"#,
            steps: vec![
                Step::GiveUp(call("gave-up", k, "x")),
                Step::Send(call("gave-up", k, "x")),
                Step::Wait(Duration::from_millis(2_300)),
                Step::Send(call("gave-up", k, "x")),
                Step::Send(call("gave-up", k, "x")),
            ],
        },
        Scenario {
            name: "detached",
            config: r#"{"in_flight_timeout_seconds": 5,
                        "upstream": {"detached": true, "cluster": "service", "timeout_ms": 4000}}"#,
            steps: vec![
                Step::Send(call("detached", k, "x")),
                Step::Send(call("detached", k, "x")),
                // The client leaves while the call runs (1 s); the call goes on.
                Step::GiveUp(call("detached", Some("k2"), "x")),
                Step::Send(call("detached", Some("k2"), "x")),
                Step::Wait(Duration::from_millis(1_500)),
                Step::Send(call("detached", Some("k2"), "x")),
                Step::Send(call("detached", Some("k3"), "x").header("x-demo-status", "503")),
                Step::Send(call("detached", Some("k3"), "x")),
            ],
        },
        Scenario {
            name: "gave-up-hold",
            config: r#"{"in_flight_timeout_seconds": 2, "on_unknown_outcome": "hold"}"#,
            steps: vec![
                Step::GiveUp(call("gave-up-hold", k, "x")),
                Step::Send(call("gave-up-hold", k, "x")),
                Step::Wait(Duration::from_millis(2_300)),
                Step::Send(call("gave-up-hold", k, "x")),
                Step::Send(call("gave-up-hold", k, "x")),
            ],
        },
        Scenario {
            name: "rules",
            config: r#"{"rules": [
                {"name": "pay", "match": {"header": {"name": "x-route", "equals": "pay"}},
                 "key": {"required": true}, "on_duplicate": "reject"},
                {"name": "hook", "match": {"header": {"name": "x-route", "equals": "hook"}},
                 "key": {"json_pointer": "/id"}, "store_statuses": ["2xx"]},
                {"name": "search", "match": {"header": {"name": "x-route", "equals": "search"}},
                 "bypass": true}]}"#,
            steps: vec![
                Step::Send(call("rules", None, "x").header("x-route", "pay")),
                Step::Send(call("rules", k, "x").header("x-route", "pay")),
                Step::Send(call("rules", k, "x").header("x-route", "pay")),
                // The same key where no rule matches: the top level's records.
                Step::Send(call("rules", k, "x")),
                Step::Send(call("rules", k, "x")),
                Step::Send(call("rules", None, r#"{"id": "m1"}"#).header("x-route", "hook")),
                Step::Send(call("rules", None, r#"{"id": "m1"}"#).header("x-route", "hook")),
                Step::Send(
                    call("rules", None, r#"{"id": "m2"}"#)
                        .header("x-route", "hook")
                        .header("x-demo-status", "404"),
                ),
                Step::Send(call("rules", None, r#"{"id": "m2"}"#).header("x-route", "hook")),
                Step::Send(call("rules", k, "x").header("x-route", "search")),
                Step::Send(call("rules", k, "x").header("x-route", "search")),
                // A header sent twice never matches `equals`: the top level applies.
                Step::Send(
                    call("rules", Some("k3"), "x")
                        .header("x-route", "search")
                        .header("x-route", "search"),
                ),
                Step::Send(call("rules", Some("k3"), "x")),
            ],
        },
        Scenario {
            name: "rule-ttl",
            config: r#"{"rules": [{"name": "put", "match": {"methods": ["PUT"]},
                        "methods": ["PUT"], "ttl_seconds": 1}]}"#,
            steps: vec![
                Step::Send(method(call("rule-ttl", k, "x"), "PUT")),
                Step::Send(method(call("rule-ttl", k, "x"), "PUT")),
                Step::Send(call("rule-ttl", k, "x")),
                Step::Wait(Duration::from_millis(1_300)),
                Step::Send(method(call("rule-ttl", k, "x"), "PUT")),
                Step::Send(call("rule-ttl", k, "x")),
            ],
        },
        Scenario {
            name: "ttl",
            config: r#"{"ttl_seconds": 1}"#,
            steps: vec![
                Step::Send(call("ttl", k, "x")),
                Step::Send(call("ttl", k, "x")),
                Step::Wait(Duration::from_millis(1_300)),
                Step::Send(call("ttl", k, "x")),
            ],
        },
    ]
}

// ---------- real Envoy ----------

fn run_in_envoy(s: &Scenario) -> Vec<Seen> {
    // One line: the template quotes it into YAML.
    let stack = Stack::start(&format!("diff-{}", s.name), &s.config.replace('\n', " "));
    let path = format!("/diff/{}", s.name);
    let seen = |r: &Response| Seen::of(r, stack.executions(&path));
    let mut out = Vec::new();
    for step in &s.steps {
        match step {
            Step::Send(c) => out.push(seen(&stack.send(c))),
            Step::WhileInFlight { first, dup } => {
                let slow = first.clone().header("x-demo-delay-ms", "1500");
                let before = stack.executions(&path);
                std::thread::scope(|scope| {
                    let held = scope.spawn(|| stack.send(&slow));
                    stack.wait_executions(&path, before + 1, Duration::from_secs(5));
                    let dup_seen = seen(&stack.send(dup));
                    out.push(seen(&held.join().unwrap()));
                    out.push(dup_seen);
                });
            }
            Step::WaitsForFirst { first, dup } => {
                let slow = first.clone().header("x-demo-delay-ms", "1000");
                let before = stack.executions(&path);
                std::thread::scope(|scope| {
                    let held = scope.spawn(|| stack.send(&slow));
                    stack.wait_executions(&path, before + 1, Duration::from_secs(5));
                    let d = stack.send(dup);
                    out.push(seen(&held.join().unwrap()));
                    out.push(seen(&d));
                });
            }
            Step::Wait(d) => std::thread::sleep(*d),
            Step::GiveUp(c) => {
                let slow = c.clone().header("x-demo-delay-ms", "1000");
                let before = stack.executions(&path);
                let ended = || {
                    counter_of(&stack.envoy, "outcome_unknown")
                        + counter_of(&stack.envoy, "detached_client_gone")
                };
                let ended_before = ended();
                stack.hang_up(&slow, Duration::from_millis(300));
                stack.wait_executions(&path, before + 1, Duration::from_secs(5));
                // The next step comes after Envoy ended the stream the client left (on
                // another worker, maybe): host-test ends it at once.
                let end = std::time::Instant::now() + Duration::from_secs(5);
                while ended() == ended_before {
                    assert!(
                        std::time::Instant::now() < end,
                        "Envoy never ended the stream the client left"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                out.push(Seen::gave_up(stack.executions(&path)));
            }
        }
    }
    out
}

// ---------- host-test ----------

/// The demo upstream's behaviour, in process: `x-demo-status` sets the status, and every
/// execution is counted per path.
fn host(config: &str, counts: Rc<RefCell<HashMap<String, u64>>>) -> SimEnvoy {
    let wasm = dedup_envoy::paths::dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let detached_counts = counts.clone();
    SimEnvoy::builder(wasm)
        .workers(2)
        .vm_id("proxy_dedup")
        .plugin_config(config)
        .allow_on_headers_stop_iteration(true)
        .upstream(move |req| demo_answer(req, &counts))
        // The route's cluster, for detached calls: the same service, its
        // `x-demo-delay-ms` on the virtual clock.
        .cluster("service", move |req| {
            let delay = req
                .header("x-demo-delay-ms")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            demo_answer(req, &detached_counts).after(Duration::from_millis(delay))
        })
        .build()
        .unwrap_or_else(|e| panic!("host-test: {e}"))
}

/// The demo upstream's answer, counting the execution per path.
fn demo_answer(req: &host_test::UpstreamRequest, counts: &RefCell<HashMap<String, u64>>) -> Reply {
    let path = req.path().split('?').next().unwrap_or("").to_string();
    let n = {
        let mut c = counts.borrow_mut();
        let e = c.entry(path).or_default();
        *e += 1;
        *e
    };
    let status = req
        .header("x-demo-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    Reply::new(status)
        .header("content-type", "application/json")
        .body(format!(r#"{{"order_id": {n}}}"#))
}

fn run_in_host_test(s: &Scenario) -> Vec<Seen> {
    let counts = Rc::new(RefCell::new(HashMap::new()));
    let mut e = host(s.config, counts.clone());
    let path = format!("/diff/{}", s.name);
    let executions = || counts.borrow().get(&path).copied().unwrap_or(0);
    let mut out = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        match step {
            Step::Send(c) => {
                let r = host::response(e.request(i % 2, host::request(c)).unwrap());
                out.push(Seen::of(&r, executions()));
            }
            Step::WhileInFlight { first, dup } => {
                let id = e.start(0, host::request(first)).unwrap();
                e.send_request(id).unwrap();
                let d = host::response(e.request(1, host::request(dup)).unwrap());
                let f = host::response(e.finish_stream(id).unwrap());
                // In Envoy the duplicate is answered while the first executes (count 1).
                out.push(Seen::of(&f, executions()));
                out.push(Seen::of(&d, executions()));
            }
            Step::WaitsForFirst { first, dup } => {
                let id = e.start(0, host::request(first)).unwrap();
                e.send_request(id).unwrap();
                let d = e.start(1, host::request(dup)).unwrap();
                e.send_request(d).unwrap();
                e.advance(Duration::from_millis(500));
                assert!(e.response(d).is_none(), "the duplicate waits for the first");
                let f = e.finish_stream(id).unwrap();
                let r = e.finish_stream(d).unwrap();
                // As in Envoy, both are recorded once both have their answer.
                for x in [f, r] {
                    out.push(Seen::of(&host::response(x), executions()));
                }
            }
            Step::Wait(d) => e.advance(*d),
            Step::GiveUp(c) => {
                // As in Envoy, the upstream takes 1 s (a detached call's cluster waits
                // that long on the virtual clock; the router's upstream is reset).
                let slow = c.clone().header("x-demo-delay-ms", "1000");
                let id = e.start(i % 2, host::request(&slow)).unwrap();
                e.send_request(id).unwrap();
                // The upstream got it (and, in Envoy, runs it to the end).
                if e.upstream_request(id).is_some() {
                    *counts.borrow_mut().entry(path.clone()).or_default() += 1;
                }
                e.reset_client(id).unwrap();
                out.push(Seen::gave_up(executions()));
            }
        }
    }
    out
}

#[test]
fn envoy_and_host_test_agree_on_every_scenario() {
    let mut differences = Vec::new();
    for s in scenarios() {
        let real = run_in_envoy(&s);
        let modelled = run_in_host_test(&s);
        assert_eq!(real.len(), modelled.len());
        for (i, (r, m)) in real.iter().zip(&modelled).enumerate() {
            if r != m {
                differences.push(format!(
                    "{} step {i}: envoy {r:?} vs host-test {m:?}",
                    s.name
                ));
            }
        }
        if s.name == "rule-wait" {
            // Steps: the rule's first and its waiter, the top level's first and its 409.
            assert!(real[1].replayed, "the rule's duplicate waited: {real:?}");
            assert_eq!(
                real[3].problem, "urn:proxy-dedup:problem:in-flight",
                "{real:?}"
            );
        }
        // The table must exercise what it claims: each scenario sees some local answer
        // or replay, so an all-pass-through filter would not agree by accident.
        assert!(
            real.iter().any(|x| x.replayed || !x.problem.is_empty()),
            "{}: nothing deduplicated: {real:?}",
            s.name
        );
    }
    assert!(
        differences.is_empty(),
        "Envoy and host-test differ:\n{}",
        differences.join("\n")
    );
}
