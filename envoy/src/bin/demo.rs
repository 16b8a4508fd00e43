//! `make demo`: the demo upstream and Envoy with the dedup filter on loopback,
//! a walkthrough of each case with the equivalent curl commands and their
//! real answers, then (on a terminal) Envoy keeps serving until Ctrl-C.
//! `--once` or `DEMO_EXIT=1` or a non-terminal stdin: exit after the walkthrough.
//! Exits non-zero if a step did not behave as the README says.

use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{
    problem_type, signals, DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response, Result,
};
use serde_json::json;
use std::time::{Duration, Instant};

const FILTER_CONFIG: &str = r#"{"key": {"required": true}, "retry_after_seconds": 1, "rules": [{"name": "hooks", "match": {"path_prefix": "/hooks/"}, "ordering": {"entity": {"header": "x-entity"}, "version": {"header": "x-version"}}}]}"#;

struct Walk<'a> {
    envoy: &'a EnvoyProcess,
    base: String,
    failures: Vec<String>,
    step: usize,
}

impl Walk<'_> {
    fn title(&mut self, text: &str) {
        self.step += 1;
        println!("\n{}. {text}", self.step);
    }

    fn show(&self, req: &Request) -> Result<Response> {
        self.show_as(req, &req.curl(&self.base))
    }

    fn show_as(&self, req: &Request, command: &str) -> Result<Response> {
        println!("   $ {command}");
        let r = self.envoy.send(req)?;
        print_response(&r);
        Ok(r)
    }

    fn expect(&mut self, ok: bool, what: &str) {
        if ok {
            println!("   ok: {what}");
        } else {
            println!("   UNEXPECTED: {what} did not hold");
            self.failures.push(format!("step {}: {what}", self.step));
        }
    }
}

fn print_response(r: &Response) {
    println!("   HTTP/1.1 {}", r.status);
    for (n, v) in &r.head.headers {
        if matches!(
            n.as_str(),
            "content-type" | "retry-after" | "idempotent-replayed" | "x-order-id"
        ) {
            println!("   {n}: {v}");
        }
    }
    println!("   {}", r.text());
}

fn run() -> Result<i32> {
    let once = std::env::args().any(|a| a == "--once")
        || std::env::var("DEMO_EXIT").is_ok_and(|v| v == "1")
        || !signals::stdin_is_terminal();
    signals::install();
    let wasm = dedup_wasm()?;
    let upstream = DemoUpstream::start(0, false)?;
    let config = EnvoyConfig::single_node(upstream.port(), &wasm, FILTER_CONFIG)?;
    println!("proxy-dedup demo: Envoy 1.40 (2 workers) -> dedup filter -> demo orders service");
    println!("   demo upstream  http://{}", upstream.addr());
    let started = Instant::now();
    let mut envoy = EnvoyProcess::start("demo", config)?;
    println!(
        "   Envoy          {} (admin {}), ready in {} ms",
        envoy.url(),
        envoy.admin_url(),
        started.elapsed().as_millis()
    );
    println!(
        "   config         {}",
        envoy.dir.join("envoy.yaml").display()
    );
    println!("   Envoy log      {}", envoy.log_path.display());
    println!("   filter config  {FILTER_CONFIG}");
    println!(
        "                  (every other field at its default: records belong to the caller named by \
         the Authorization header (`principal`); a store that cannot answer gets 503, never a \
         second run (`failure_mode: \"closed\"`))"
    );

    let mut w = Walk {
        base: envoy.url(),
        envoy: &envoy,
        failures: Vec::new(),
        step: 0,
    };
    let order = json!({"item": "book", "qty": 1});

    w.title("A first POST with an Idempotency-Key executes (the service assigns an order id).");
    let req = Request::post("/orders").key("demo-1").json(&order);
    let first = w.show(&req)?;
    w.expect(
        first.status == 200 && first.header("idempotent-replayed").is_none(),
        "200 from the service",
    );

    w.title("The same POST again (a client retry) is answered by Envoy from the stored response.");
    let again = w.show(&req)?;
    w.expect(
        again.status == 200
            && again.header("idempotent-replayed") == Some("true")
            && again.body == first.body,
        "same status and body, idempotent-replayed: true, service not called",
    );

    w.title("A duplicate while the first is still running gets 409 (the first is made slow: x-demo-delay-ms: 2000).");
    let slow_req = Request::post("/orders")
        .key("demo-2")
        .header("x-demo-delay-ms", "2000")
        .json(&json!({"item": "lamp", "qty": 1}));
    println!("   $ {} &", slow_req.curl(&w.base));
    let addr = envoy.addr();
    let slow = std::thread::spawn(move || dedup_envoy::client::send(addr, &slow_req));
    let end = Instant::now() + Duration::from_secs(5);
    while upstream.executions_for_key("demo-2") == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let dup = Request::post("/orders")
        .key("demo-2")
        .json(&json!({"item": "lamp", "qty": 1}));
    let conflict = w.show(&dup)?;
    w.expect(
        conflict.status == 409
            && conflict.header("retry-after").is_some()
            && problem_type(&conflict.body).ends_with(":in-flight"),
        "409 in-flight with retry-after",
    );
    let slow = slow
        .join()
        .map_err(|_| dedup_envoy::Error::msg("slow request thread panicked"))??;
    println!("   (the first one, after 2 s:)");
    print_response(&slow);
    w.expect(slow.status == 200, "the first one completes with 200");

    w.title("The same key with a different body gets 422: it is another operation.");
    let changed = w.show(
        &Request::post("/orders")
            .key("demo-1")
            .json(&json!({"item": "book", "qty": 2})),
    )?;
    w.expect(
        changed.status == 422 && problem_type(&changed.body).ends_with(":payload-mismatch"),
        "422 payload-mismatch",
    );

    w.title("Another caller with the same key and body gets 422: a stored response goes only to its caller.");
    let other = w.show(
        &Request::post("/orders")
            .key("demo-1")
            .header("authorization", "Bearer someone-else")
            .json(&order),
    )?;
    w.expect(
        other.status == 422
            && problem_type(&other.body).ends_with(":principal-mismatch")
            && other.body != first.body,
        "422 principal-mismatch, not the first caller's response",
    );

    w.title("A POST without a key (key.required) or with a bad key gets 400.");
    let missing = w.show(&Request::post("/orders").json(&order))?;
    w.expect(
        missing.status == 400 && problem_type(&missing.body).ends_with(":missing-key"),
        "400 missing-key",
    );
    let long_key = "k".repeat(300);
    let bad_req = Request::post("/orders").key(&long_key).json(&order);
    let shown = bad_req
        .curl(&w.base)
        .replace(&long_key, "$(printf 'k%.0s' {1..300})")
        .replacen("-H 'idempotency-key: ", "-H \"idempotency-key: ", 1)
        .replacen("{1..300})'", "{1..300})\"", 1);
    let bad = w.show_as(&bad_req, &shown)?;
    w.expect(
        bad.status == 400 && problem_type(&bad.body).ends_with(":invalid-key"),
        "400 invalid-key (longer than key.max_length 255)",
    );

    w.title("Ordering (the `hooks` rule): version 2 of an entity runs; version 1 after it is stale, never forwarded.");
    let hook = |key: &str, version: &str| {
        Request::post("/hooks/orders")
            .key(key)
            .header("x-entity", "order-7")
            .header("x-version", version)
            .json(&json!({"status": "shipped"}))
    };
    let v2 = w.show(&hook("hook-2", "2"))?;
    w.expect(v2.status == 200, "version 2 executes");
    let v1 = w.show(&hook("hook-1", "1"))?;
    w.expect(
        v1.status == 409
            && problem_type(&v1.body).ends_with(":stale-version")
            && v1.header("idempotent-applied-version") == Some("2"),
        "409 stale-version, idempotent-applied-version: 2",
    );

    w.title("How often the service really executed each key:");
    let execs = w.show(&Request::get("/__executions"))?;
    let by_key = execs.json().ok().map(|v| v["by_key"].clone());
    w.expect(
        by_key == Some(json!({"demo-1": 1, "demo-2": 1, "hook-2": 1})),
        "demo-1, demo-2 and hook-2 executed exactly once each (hook-1 never)",
    );

    w.title("The filter's counters in Envoy's stats:");
    println!(
        "   $ curl -s '{}/stats?filter=proxy_dedup'",
        envoy.admin_url()
    );
    let counters = envoy.dedup_counters()?;
    for (n, v) in &counters {
        println!("   wasmcustom.proxy_dedup_{n}: {v}");
    }
    let c = |n: &str| counters.get(n).copied().unwrap_or(0);
    w.expect(
        c("executed") == 3
            && c("replayed") == 1
            && c("rejected_in_flight") == 1
            && c("payload_mismatch") == 1
            && c("bad_key") == 2
            && c("stale") == 1,
        "executed 3, replayed 1, rejected_in_flight 1, payload_mismatch 1, bad_key 2, stale 1",
    );

    let failures = std::mem::take(&mut w.failures);
    println!();
    if failures.is_empty() {
        println!("Every step behaved as the README says.");
    } else {
        println!("{} step(s) did not behave as expected:", failures.len());
        for f in &failures {
            println!("   {f}");
        }
        return Ok(1);
    }

    if once {
        println!("(--once / DEMO_EXIT=1 / no terminal: stopping.)");
    } else {
        println!(
            "\nEnvoy on {} — Ctrl-C to stop (admin {}, service {})",
            envoy.url(),
            envoy.admin_url(),
            upstream.addr()
        );
        while !signals::stop_requested() {
            if envoy.stat("server.live").is_err() {
                println!("Envoy stopped by itself; see {}", envoy.log_path.display());
                return Ok(1);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        println!("\nstopping Envoy and the demo service");
    }
    envoy.stop();
    Ok(0)
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(1);
        }
    }
}
