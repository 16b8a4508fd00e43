//! Shared by the end-to-end tests: one real Envoy (2 workers) with the dedup
//! filter in front of an in-process demo upstream, on free loopback ports.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use dedup_envoy::client::{send_or_give_up, Connection, GiveUp, Leave};
use dedup_envoy::paths::dedup_wasm;
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub struct Stack {
    // Envoy first: it is stopped before its upstream goes away.
    pub envoy: EnvoyProcess,
    pub upstream: DemoUpstream,
}

impl Stack {
    /// Envoy with `dist/dedup_filter.wasm` and `filter_config`. Panics (fails
    /// the test) with "run `make wasm`" when the module was not built.
    pub fn start(name: &str, filter_config: &str) -> Stack {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let config = EnvoyConfig::single_node(upstream.port(), &wasm, filter_config).unwrap();
        let envoy =
            EnvoyProcess::start(name, config).unwrap_or_else(|e| panic!("starting Envoy: {e}"));
        Stack { envoy, upstream }
    }

    /// Envoy from the config `make` builds for the upstream's port and
    /// `dist/dedup_filter.wasm` (another template, more placeholders).
    pub fn start_with(name: &str, make: impl FnOnce(u16, &Path) -> EnvoyConfig) -> Stack {
        let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
        let upstream = DemoUpstream::start(0, false).expect("demo upstream");
        let config = make(upstream.port(), &wasm);
        let envoy =
            EnvoyProcess::start(name, config).unwrap_or_else(|e| panic!("starting Envoy: {e}"));
        Stack { envoy, upstream }
    }

    pub fn send(&self, req: &Request) -> Response {
        self.envoy
            .send(req)
            .unwrap_or_else(|e| panic!("{} {}: {e}", req.method, req.path))
    }

    pub fn executions(&self, path: &str) -> u64 {
        self.upstream.executions_for_path(path)
    }

    /// Wait until the upstream has executed `n` requests to `path`.
    pub fn wait_executions(&self, path: &str, n: u64, limit: Duration) {
        let end = Instant::now() + limit;
        while self.executions(path) < n {
            assert!(
                Instant::now() < end,
                "upstream saw {} executions of {path}, waited for {n}",
                self.executions(path)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `req` on another thread and returns once the upstream has begun
    /// the `n`th execution of its path (within 5 s); join for the answer.
    pub fn send_in_background(&self, req: Request, n: u64) -> JoinHandle<Response> {
        let (addr, path) = (self.envoy.addr(), req.path.clone());
        let answer = std::thread::spawn(move || dedup_envoy::client::send(addr, &req).unwrap());
        self.wait_executions(&path, n, Duration::from_secs(5));
        answer
    }

    /// Sends `req` and closes the connection `after` this long without an
    /// answer; fails if the answer came first.
    pub fn hang_up(&self, req: &Request, after: Duration) {
        let gone = send_or_give_up(self.envoy.addr(), req, after, Leave::Close).unwrap();
        assert!(
            matches!(gone, GiveUp::GaveUp),
            "{} {} was answered within {after:?}: {gone:?}",
            req.method,
            req.path
        );
    }

    pub fn counter(&self, short: &str) -> u64 {
        self.envoy
            .dedup_counter(short)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Polls Envoy's access log (the harness has Envoy flush it every 0.5 s)
    /// for up to 8 s until `find` finds something in it; fails naming `what`.
    pub fn poll_access_log<T>(&self, what: &str, find: impl Fn(&str) -> Option<T>) -> T {
        let log_path = self.envoy.dir.join("stdout.log");
        let deadline = Instant::now() + Duration::from_secs(8);
        loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(found) = find(&log) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in the access log:\n{log}\nEnvoy's log:\n{}",
                self.envoy.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The access log, once it contains every one of `wanted`.
    pub fn access_log_with(&self, wanted: &[&str]) -> String {
        self.poll_access_log(&format!("{wanted:?}"), |log| {
            wanted
                .iter()
                .all(|w| log.contains(w))
                .then(|| log.to_string())
        })
    }
}

/// A filter counter of one of several proxies; a counter not (yet) in /stats is 0.
pub fn counter_of(proxy: &EnvoyProcess, short: &str) -> u64 {
    proxy
        .dedup_counters()
        .unwrap_or_else(|e| panic!("{e}"))
        .get(short)
        .copied()
        .unwrap_or(0)
}

/// `dedupctl --addr <admin> <args>`: its exit code and standard output. The command
/// runs in this process (`dedup_tools::ctl::run`, all of the binary but its three-line
/// `main`): a test here cannot name another crate's binary, and one that looked for a
/// built `target/*/dedupctl` could run a stale one. The binary itself is run by
/// dedup-tools' own tests (envoy/tools/tests/).
pub fn dedupctl(admin: SocketAddr, args: &[&str]) -> (Option<i32>, String) {
    let mut argv = vec!["--addr".to_string(), admin.to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = dedup_tools::ctl::run(&argv, &mut out, &mut err);
    (
        Some(i32::from(code)),
        String::from_utf8_lossy(&out).into_owned(),
    )
}

/// A JSON POST with an idempotency key.
pub fn post(path: &str, key: &str, body: &Value) -> Request {
    Request::post(path).key(key).json(body)
}

/// A keyed JSON POST as a client behind a load balancer sends it: the same
/// `host` whichever proxy it reaches (the filter scopes records by `:authority`;
/// the proxies' own addresses differ). It waits up to 20 s for the answer:
/// long enough for an etcd leader election behind the proxies.
pub fn keyed(host: &str, path: &str, key: &str, body: &Value) -> Request {
    post(path, key, body)
        .host(host)
        .timeout(Duration::from_secs(20))
}

/// `n` copies of `req` released together, alternating between `proxies`, each
/// on its own connection opened beforehand: (index of the proxy, answer).
pub fn burst(proxies: &[SocketAddr], n: usize, req: &Request) -> Vec<(usize, Response)> {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let p = i % proxies.len();
            let (addr, req, barrier) = (proxies[p], req.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = Connection::open(addr, Duration::from_secs(20)).unwrap();
                barrier.wait();
                (p, conn.send(&req).unwrap())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

pub fn json(r: &Response) -> Value {
    r.json().unwrap_or_else(|e| panic!("{e}"))
}

/// Assert `r` is an RFC 9457 problem with this status and slug.
pub fn assert_problem(r: &Response, status: u16, slug: &str) {
    assert_eq!(
        r.status,
        status,
        "expected {status} {slug}, got {}",
        r.summary()
    );
    let ct = r.header("content-type").unwrap_or("");
    assert!(
        ct.starts_with("application/problem+json"),
        "problem content-type, got {ct:?}: {}",
        r.summary()
    );
    let p = json(r);
    assert_eq!(
        p["type"],
        format!("urn:proxy-dedup:problem:{slug}"),
        "problem type: {}",
        r.summary()
    );
    assert_eq!(p["status"], status, "problem status field: {}", r.summary());
    assert!(p["title"].is_string(), "problem title: {}", r.summary());
}

pub fn is_replayed(r: &Response) -> bool {
    r.header("idempotent-replayed") == Some("true")
}

pub fn assert_executed(r: &Response) {
    assert_eq!(r.status, 200, "expected an execution, got {}", r.summary());
    assert!(
        !is_replayed(r),
        "expected a fresh execution, got a replay: {}",
        r.summary()
    );
}

pub fn assert_replay_of(r: &Response, first: &Response) {
    assert_eq!(r.status, first.status, "replay status: {}", r.summary());
    assert!(
        is_replayed(r),
        "expected idempotent-replayed: true, got {}",
        r.summary()
    );
    assert_eq!(
        r.body, first.body,
        "replayed body differs from the first response"
    );
    assert_eq!(
        r.header("x-order-id"),
        first.header("x-order-id"),
        "replay keeps the upstream's headers"
    );
}

/// Envoy refuses to start with each filter config, a `[wasm]` log line naming
/// its field.
pub fn assert_refused_naming_the_field(name: &str, cases: &[(&str, &str)]) {
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    for (config, field) in cases {
        let cfg = EnvoyConfig::single_node(1, &wasm, config).unwrap();
        let (code, log) = EnvoyProcess::start_expect_failure(name, &cfg).unwrap();
        assert_ne!(code, 0, "Envoy started with {config}");
        let named = log
            .lines()
            .any(|l| l.contains("[wasm]") && l.contains(&format!("`{field}`")));
        assert!(
            named,
            "no wasm log line names {field:?} for {config}; log:\n{log}"
        );
    }
}

/// Where the lines marked `begin` and `end` stand in `text` (`begin`'s
/// position, `end`'s); fails naming the marker that is missing.
pub fn markers(text: &str, begin: &str, end: &str) -> (usize, usize) {
    let at = |marker: &str| {
        text.find(marker)
            .unwrap_or_else(|| panic!("no marker {marker:?}"))
    };
    (at(begin), at(end))
}

/// Concurrent duplicates were answered by one execution: one fresh answer,
/// every other a replay of it, all 200 with its body.
pub fn assert_one_fresh_answer<'a>(answers: impl IntoIterator<Item = &'a Response>) {
    let answers: Vec<&Response> = answers.into_iter().collect();
    let fresh: Vec<_> = answers.iter().filter(|r| !is_replayed(r)).collect();
    assert_eq!(
        fresh.len(),
        1,
        "one fresh answer, {} replays",
        answers.len() - 1
    );
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.body, fresh[0].body, "every client gets the same answer");
    }
}

/// `first` is the one execution of `key`, and `replay()` (the same request
/// again) is answered with its replay: the upstream ran `key` once.
pub fn assert_once_then_replayed(
    s: &Stack,
    key: &str,
    first: &Response,
    replay: impl FnOnce() -> Response,
) {
    assert_executed(first);
    assert_eq!(s.upstream.executions_for_key(key), 1);
    assert_replay_of(&replay(), first);
    assert_eq!(s.upstream.executions_for_key(key), 1);
}

/// After an answer the filter did not store, `req` executes again (the
/// upstream's second execution) and is then replayed. Returns that execution.
pub fn assert_runs_again_then_replays(s: &Stack, req: &Request) -> Response {
    let again = s.send(req);
    assert_executed(&again);
    assert_eq!(json(&again)["executions"], 2);
    assert_replay_of(&s.send(req), &again);
    again
}

// --- HS256 JWTs for envoy/configs/jwt-scope.yaml ------------------------------

/// HMAC-SHA256 (RFC 2104), by the RustCrypto `hmac` crate.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    // Any key length is valid for HMAC: this cannot fail.
    let mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.chain_update(msg).finalize().into_bytes().into()
}

/// An HS256 JWT over `claims`.
pub fn jwt_hs256(key: &[u8], kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "HS256", "typ": "JWT", "kid": kid});
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = hmac_sha256(key, signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The example's HS256 key and its `kid`: the `oct` key in
/// envoy/configs/jwt-scope.yaml (read from the file, so the tests follow it).
pub fn example_jwt_key() -> (Vec<u8>, String) {
    let path = dedup_envoy::paths::config_file("jwt-scope.yaml");
    let template = std::fs::read_to_string(&path).unwrap();
    let field = |name: &str| -> String {
        let pat = format!("\"{name}\": \"");
        let at = template
            .find(&pat)
            .unwrap_or_else(|| panic!("no {pat} in {}", path.display()))
            + pat.len();
        let len = template[at..].find('"').unwrap();
        template[at..at + len].to_string()
    };
    let key = URL_SAFE_NO_PAD
        .decode(field("k"))
        .unwrap_or_else(|e| panic!("the example key is not base64url: {e}"));
    (key, field("kid"))
}

/// The claims jwt-scope.yaml accepts (issuer, audience, valid 10 minutes),
/// with a `tenant` claim if given.
pub fn example_jwt_claims(tenant: Option<&str>) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut c = json!({
        "iss": "https://auth.example.com",
        "aud": "orders",
        "sub": "user-1",
        "iat": now,
        "exp": now + 600,
    });
    if let Some(t) = tenant {
        c["tenant"] = json!(t);
    }
    c
}

/// The filter configuration jwt-scope.yaml is rendered with
/// (envoy/configs/recipes/jwt-tenants.json: scoped by x-tenant, the caller the
/// token's `sub`).
pub fn jwt_recipe() -> String {
    std::fs::read_to_string(dedup_envoy::paths::config_file("recipes/jwt-tenants.json")).unwrap()
}

/// A token jwt-scope.yaml accepts, signed with the example key.
pub fn example_jwt(tenant: Option<&str>) -> String {
    let (key, kid) = example_jwt_key();
    jwt_hs256(&key, &kid, &example_jwt_claims(tenant))
}

/// A POST over HTTP/2 without TLS (prior knowledge), sent by curl.
pub fn h2_post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let dir = std::env::temp_dir().join(format!(
        "identity-h2-{}-{}",
        std::process::id(),
        path.replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (req_body, resp_body) = (dir.join("request"), dir.join("response"));
    std::fs::write(&req_body, body).unwrap();
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--http2-prior-knowledge",
        "--max-time",
        "10",
        "-D",
        "-",
    ])
    .arg("-o")
    .arg(&resp_body)
    .arg("--data-binary")
    .arg(format!("@{}", req_body.display()));
    for (n, v) in headers {
        cmd.arg("-H").arg(format!("{n}: {v}"));
    }
    let out = cmd.arg(format!("http://{addr}{path}")).output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let start = lines.next().unwrap_or_default().to_string();
    assert!(start.starts_with("HTTP/2"), "not an HTTP/2 answer: {text}");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let status = start.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = std::fs::read(&resp_body).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    Response {
        status,
        head: dedup_envoy::http::Head { start, headers },
        body,
    }
}

/// The Unix time (s) of an IMF-fixdate (`Wed, 02 Dec 2026 05:00:00 GMT`), parsed here
/// on its own (days from the civil date) so it checks the filter's formatting rather
/// than repeating it.
pub fn http_date_secs(date: &str) -> u64 {
    let parts: Vec<&str> = date.split([' ', ':']).collect();
    let [_, day, month, year, h, m, s, "GMT"] = parts[..] else {
        panic!("not an IMF-fixdate: {date:?}");
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|x| *x == month).unwrap() as i64 + 1;
    let num = |v: &str| v.parse::<i64>().unwrap();
    let (year, day) = (num(year), num(day));
    // Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + num(h) * 3600 + num(m) * 60 + num(s)) as u64
}

/// The wall clock, in Unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Asserts a response's `idempotency-expires` names the instant its record stops
/// answering, known from the wall clock to lie in `[earliest, latest]` (Unix s: the
/// test brackets the claim or completion with two readings), rounded up to the second
/// as the filter writes it; `what` says which answer it is.
pub fn assert_expires_within(r: &Response, earliest: f64, latest: f64, what: &str) {
    let date = r
        .header("idempotency-expires")
        .unwrap_or_else(|| panic!("{what}: no idempotency-expires: {}", r.summary()));
    let got = http_date_secs(date) as f64;
    assert!(
        got >= earliest.ceil() && got <= latest.ceil(),
        "{what}: idempotency-expires {date} ({got}) is not in [{earliest:.3}, {latest:.3}] rounded up"
    );
}
