//! Probe differential: the ABI probe (`dist/abi_probe.wasm`, no SDK) runs the
//! same cases in real Envoy 1.40 and in host-test, and what a client, the
//! callout servers and the probe's own log (callbacks with their raw context
//! ids, tokens and statuses) see must agree: gRPC calls and streams, gRPC
//! local replies, header edits, properties, callout lifetimes and headers,
//! the main-thread VM. A difference is a bug in host-test's fidelity. The
//! acceptance examples (host-test/examples, after the SDK's) run here too:
//! `probe_differential/examples.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "probe_differential/examples.rs"]
mod examples;
#[path = "common/host.rs"]
mod host;

use dedup_envoy::client::{self, Request, Response};
use dedup_envoy::paths::{dist_wasm, scratch_dir};
use dedup_envoy::ports::free_port;
use dedup_envoy::process::{spawn, ChildGuard};
use host_test::{grpc_status, GrpcReply, GrpcRequest, GrpcServer, Reply, SimEnvoy};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---------- the servers both hosts call ----------

/// The gRPC service of the probe cases, by method.
fn grpc_handler(req: &GrpcRequest) -> GrpcReply {
    let echo = [b"re:".as_slice(), req.message()].concat();
    match req.method.as_str() {
        "Unary" => GrpcReply::ok(echo),
        "Fail" => GrpcReply::status(grpc_status::PERMISSION_DENIED, "denied here")
            .trailing_metadata("x-why", "policy"),
        "Slow" => GrpcReply::ok(echo).after(Duration::from_millis(600)),
        "Silent" => GrpcReply::no_answer(),
        "Reset" => GrpcReply::reset(),
        "Stream" => GrpcReply::messages(req.messages.iter().map(|m| [b"re:", &m[..]].concat()))
            .initial_metadata("x-initial", "1")
            .trailing_metadata("x-trailing", "2"),
        _ => GrpcReply::status(grpc_status::UNIMPLEMENTED, "no such method"),
    }
}

/// A loopback HTTP/1.1 server: answers every request with its own request
/// head as the body (so a callout's headers as sent can be compared);
/// `/sleep/MS` answers after MS milliseconds.
struct EchoServer {
    addr: SocketAddr,
}

impl EchoServer {
    fn start() -> EchoServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                std::thread::spawn(move || echo(conn));
            }
        });
        EchoServer { addr }
    }
}

fn echo(mut conn: TcpStream) {
    loop {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => data.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
        let need = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        while data.len() < head_end + 4 + need {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => data.extend_from_slice(&buf[..n]),
            }
        }
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        if path == "/probe" {
            let reply = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n\r\nupstream ok";
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        if let Some(ms) = path.strip_prefix("/sleep/") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
            let reply =
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nslept";
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        // Lines sorted away from the wire order would hide a difference;
        // keep them as sent, minus what differs per run.
        let body: String = head
            .lines()
            .map(|l| {
                if l.to_ascii_lowercase().starts_with("x-request-id:") {
                    "x-request-id: *".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

// ---------- cases ----------

#[derive(Clone)]
struct Case {
    name: &'static str,
    /// A GET to `probe.test` with `x-abi` and the case's headers.
    request: Request,
    /// The client hangs up this long after sending (and never reads).
    hang_up_after: Option<Duration>,
    /// Time to let pass after the response (or the hang-up) before the log
    /// is read: callouts that outlive their stream land in it meanwhile.
    settle: Duration,
    /// The request reaches the upstream: its response callbacks are left
    /// out (Envoy delivers an HTTP/1.1 upstream body without end of stream,
    /// then an empty end-of-stream call; host-test does not).
    upstream_answers: bool,
}

fn case(name: &'static str, abi: &str, headers: &[(&'static str, &str)]) -> Case {
    let mut request = Request::get("/probe")
        .host("probe.test")
        .timeout(Duration::from_secs(5))
        .header("x-abi", abi);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    Case {
        name,
        request,
        hang_up_after: None,
        settle: Duration::ZERO,
        upstream_answers: headers.contains(&("x-then", "continue")),
    }
}

/// A unary gRPC call of `method` on `cluster` (`x-abi: grpc-call`).
fn grpc_case(name: &'static str, cluster: &str, method: &str) -> Case {
    case(
        name,
        "grpc-call",
        &[("x-cluster", cluster), ("x-method", method)],
    )
}

fn settle(mut c: Case, ms: u64) -> Case {
    c.settle = Duration::from_millis(ms);
    c
}

fn hang_up(mut c: Case, ms: u64) -> Case {
    c.hang_up_after = Some(Duration::from_millis(ms));
    c
}

fn at(mut c: Case, path: &'static str) -> Case {
    c.request.path = path.into();
    c
}

fn cases() -> Vec<Case> {
    let grpc = ("content-type", "application/grpc");
    vec![
        // (2) gRPC calls and streams.
        case(
            "grpc-ok",
            "grpc-call",
            &[("x-cluster", "grpc"), ("x-message", "hello")],
        ),
        case(
            "grpc-service-proto",
            "grpc-call",
            &[
                ("x-cluster", "grpc"),
                ("x-service-proto", "1"),
                ("x-message", "p"),
            ],
        ),
        grpc_case("grpc-status", "grpc", "Fail"),
        case(
            "grpc-timeout",
            "grpc-call",
            &[
                ("x-cluster", "grpc"),
                ("x-method", "Silent"),
                ("x-timeout-ms", "200"),
            ],
        ),
        grpc_case("grpc-reset", "grpc", "Reset"),
        grpc_case("grpc-unimplemented", "grpc", "Nope"),
        case(
            "grpc-unknown-cluster",
            "grpc-call",
            &[("x-cluster", "nope")],
        ),
        case(
            "grpc-unknown-cluster-proto",
            "grpc-call",
            &[("x-cluster", "nope"), ("x-service-proto", "1")],
        ),
        case(
            "grpc-refused",
            "grpc-call",
            &[("x-cluster", "grpc_refused")],
        ),
        case(
            "grpc-metadata",
            "grpc-call",
            &[
                ("x-cluster", "grpc"),
                ("x-meta", "x-token=abc;x-tenant=t1"),
                ("x-timeout-ms", "750"),
            ],
        ),
        case(
            "grpc-stream",
            "grpc-stream",
            &[
                ("x-cluster", "grpc"),
                ("x-messages", "a,b"),
                ("x-end", "close"),
            ],
        ),
        case(
            "grpc-stream-error",
            "grpc-stream",
            &[
                ("x-cluster", "grpc"),
                ("x-method", "Fail"),
                ("x-messages", "a"),
                ("x-end", "close"),
            ],
        ),
        case(
            "grpc-stream-cancel",
            "grpc-stream",
            &[
                ("x-cluster", "grpc"),
                ("x-messages", "a"),
                ("x-end", "cancel"),
            ],
        ),
        // The same against host-test's in-process handler (`grpc_cluster`).
        case(
            "grpc-local-ok",
            "grpc-call",
            &[("x-cluster", "grpc_local"), ("x-message", "hi")],
        ),
        grpc_case("grpc-local-status", "grpc_local", "Fail"),
        grpc_case("grpc-local-reset", "grpc_local", "Reset"),
        case(
            "grpc-local-stream",
            "grpc-stream",
            &[
                ("x-cluster", "grpc_local"),
                ("x-messages", "a,b"),
                ("x-end", "close"),
            ],
        ),
        case(
            "grpc-local-stream-error",
            "grpc-stream",
            &[
                ("x-cluster", "grpc_local"),
                ("x-method", "Fail"),
                ("x-messages", "a"),
                ("x-end", "close"),
            ],
        ),
        // (3) gRPC-aware local replies.
        case(
            "local-plain",
            "local",
            &[("x-status", "403"), ("x-body", "nope")],
        ),
        case(
            "local-grpc",
            "local",
            &[("x-status", "403"), ("x-body", "nope"), grpc],
        ),
        case(
            "local-grpc-status",
            "local",
            &[
                ("x-status", "503"),
                ("x-body", "try later"),
                ("x-grpc-status", "9"),
                ("x-reply-headers", "x-a=1"),
                grpc,
            ],
        ),
        case(
            "local-plain-grpc-status",
            "local",
            &[
                ("x-status", "429"),
                ("x-body", "slow"),
                ("x-grpc-status", "9"),
            ],
        ),
        case("local-grpc-empty", "local", &[("x-status", "200"), grpc]),
        at(case("router-grpc", "", &[grpc]), "/refused"),
        // (4) header edits.
        case(
            "headers-replace",
            "headers",
            &[
                ("x-a", "1"),
                ("x-b", "2"),
                ("x-ops", "replace x-a new; replace x-z z; add x-c 3"),
            ],
        ),
        case(
            "headers-pseudo",
            "headers",
            &[
                ("x-a", "1"),
                (
                    "x-ops",
                    "replace :path /new; add x-a 2; remove x-b; replace x-a only",
                ),
            ],
        ),
        // (5) properties.
        case(
            "props",
            "props",
            &[(
                "x-props",
                "xds/route_name,xds/cluster_name,metadata/filter_metadata/probe.ns/s,\
                 metadata/filter_metadata/probe.ns/n,metadata/filter_metadata/probe.ns/b,\
                 metadata/filter_metadata/probe.ns/o,metadata/filter_metadata/probe.ns/l,\
                 metadata/filter_metadata/probe.ns/missing,metadata/filter_metadata/nope,\
                 xds/route_metadata/filter_metadata/probe.route/team",
            )],
        ),
        // (6) callout lifetimes and headers.
        case(
            "http-call-headers",
            "http-call",
            &[
                ("x-cluster", "echo"),
                ("x-path", "/head"),
                ("x-body", "b"),
                ("x-meta", "x-token=abc"),
            ],
        ),
        case(
            "http-call-timeout",
            "http-call",
            &[
                ("x-cluster", "echo"),
                ("x-path", "/sleep/500"),
                ("x-timeout-ms", "200"),
            ],
        ),
        case(
            "http-call-refused",
            "http-call",
            &[("x-cluster", "refused")],
        ),
        settle(
            case(
                "http-call-outlives-stream",
                "http-call",
                &[
                    ("x-cluster", "slow"),
                    ("x-path", "/sleep/400"),
                    ("x-then", "continue"),
                ],
            ),
            800,
        ),
        settle(
            hang_up(
                case(
                    "http-call-client-gone",
                    "http-call",
                    &[("x-cluster", "slow"), ("x-path", "/sleep/400")],
                ),
                100,
            ),
            800,
        ),
        settle(
            case(
                "grpc-call-outlives-stream",
                "grpc-call",
                &[
                    ("x-cluster", "grpc_local"),
                    ("x-method", "Slow"),
                    ("x-then", "continue"),
                ],
            ),
            1000,
        ),
        settle(
            hang_up(
                grpc_case("grpc-call-client-gone", "grpc_local", "Slow"),
                100,
            ),
            1000,
        ),
    ]
}

/// Blanks what differs between runs: timings, request ids, and the length of a probe's
/// answer that quotes a timing (a service time of 10 ms or more is a digit longer; the
/// body itself is compared, timings blanked).
fn normalize(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    loop {
        let next = [
            "x-envoy-upstream-service-time",
            "x-request-id",
            "content-length=",
        ]
        .iter()
        .filter_map(|n| rest.find(n).map(|at| (at, n.len())))
        .min();
        let Some((at, len)) = next else {
            out.push_str(rest);
            return out;
        };
        let (head, tail) = rest.split_at(at + len);
        out.push_str(head);
        let sep_len = tail
            .find(|c: char| c != ':' && c != '=' && c != ' ')
            .unwrap_or(tail.len());
        out.push_str(&tail[..sep_len]);
        out.push('*');
        let value = &tail[sep_len..];
        let end = value.find([',', ']', '\n', '\\']).unwrap_or(value.len());
        rest = &value[end..];
    }
}

/// What is compared for one case.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// The probe's `abi ...` lines for this case, in order.
    log: Vec<String>,
    /// The gRPC calls the server saw: (path, selected metadata, cancelled).
    grpc_calls: Vec<String>,
}

/// Response headers worth comparing (the rest differ by design: date,
/// server; the router's headers are compared in `examples.rs`).
/// (`content-length` too: Envoy's HTTP/1.1 codec adds `content-length: 0`
/// to a response that ends with its headers; host-test reports the headers
/// as the filter chain left them.)
const KEPT: &[&str] = &["content-type", "grpc-status", "grpc-message", "x-a"];

fn keep(headers: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    headers
        .into_iter()
        .filter(|(k, _)| KEPT.contains(&k.as_str()))
        .collect()
}

fn grpc_calls(calls: &[GrpcRequest]) -> Vec<String> {
    calls
        .iter()
        .map(|c| {
            let meta: Vec<String> = c.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            normalize(&format!(
                "/{}/{} messages={:?} cancelled={} [{}]",
                c.service,
                c.method,
                c.messages,
                c.cancelled,
                meta.join(",")
            ))
        })
        .collect()
}

// ---------- real Envoy ----------

struct RealEnvoy {
    child: ChildGuard,
    listen: u16,
    log_path: PathBuf,
}

fn wasm_filter(config: &str) -> String {
    let wasm = dist_wasm("abi_probe.wasm").unwrap_or_else(|e| panic!("{e}"));
    format!(
        r#"
          - name: abi
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: abi
                root_id: ""
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: "{config}"
                vm_config:
                  vm_id: abi
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {} }} }}"#,
        wasm.display()
    )
}

fn cluster(name: &str, port: u16, h2: bool) -> String {
    let proto = if h2 {
        r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }"#
    } else {
        ""
    };
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s{proto}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"#
    )
}

impl RealEnvoy {
    fn start(name: &str, concurrency: u32, config: &str, echo: u16, grpc: u16) -> RealEnvoy {
        let refused = free_port().unwrap();
        let (listen, admin) = (free_port().unwrap(), free_port().unwrap());
        let yaml = format!(
            r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: probe
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: probe
          route_config:
            name: probe_routes
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - name: refused_route
                match: {{ prefix: "/refused" }}
                route: {{ cluster: refused, timeout: 5s }}
              - name: probe_route
                match: {{ prefix: "/" }}
                route: {{ cluster: upstream, timeout: 5s }}
                metadata: {{ filter_metadata: {{ probe.route: {{ team: blue }} }} }}
          http_filters:
          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: probe.ns
                value: {{ s: text, n: 42, b: true, o: {{ k: v }}, l: [1, x] }}{}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:{}{}{}{}{}{}{}
"#,
            wasm_filter(config),
            cluster("upstream", echo, false),
            cluster("echo", echo, false),
            cluster("refused", refused, false),
            cluster("grpc", grpc, true),
            cluster("grpc_local", grpc, true),
            cluster("slow", echo, false),
            cluster("grpc_refused", refused, true),
        );
        RealEnvoy::launch(name, concurrency, &yaml, listen, admin)
    }

    /// Runs Envoy on `yaml` (whose admin listens on `admin`) until it is ready;
    /// `listen` is the listener [`RealEnvoy::addr`] names.
    fn launch(name: &str, concurrency: u32, yaml: &str, listen: u16, admin: u16) -> RealEnvoy {
        let dir = scratch_dir(&format!("probe-{name}")).unwrap();
        let cfg = dir.join("envoy.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        let log_path = dir.join("envoy.log");
        let mut cmd = Command::new(std::env::var("ENVOY_BIN").unwrap_or_else(|_| "envoy".into()));
        cmd.arg("-c")
            .arg(&cfg)
            .args(["--concurrency", &concurrency.to_string()])
            .arg("--disable-hot-restart")
            .arg("--log-path")
            .arg(&log_path)
            .args(["--log-level", "info"])
            // The log is read while Envoy runs.
            .args(["--file-flush-interval-msec", "20"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn(cmd).unwrap();
        let envoy = RealEnvoy {
            child,
            listen,
            log_path,
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client::send(
                SocketAddr::from(([127, 0, 0, 1], admin)),
                &Request::get("/ready").timeout(Duration::from_secs(2)),
            );
            if ready.is_ok_and(|r| r.status == 200) {
                break;
            }
            assert!(
                Instant::now() < end,
                "Envoy not ready; log:\n{}",
                std::fs::read_to_string(&envoy.log_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        envoy
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.listen))
    }

    /// The probe's lines so far (`abi ...`), without Envoy's prefix.
    fn abi_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.find(": abi ").map(|at| l[at + 2..].to_string()))
            .collect()
    }

    fn run(&self, c: &Case, server: &GrpcServer) -> Seen {
        let (log_from, calls_from) = (self.abi_lines().len(), server.calls().len());
        let answer = match c.hang_up_after {
            Some(after) => {
                let gone =
                    client::send_or_give_up(self.addr(), &c.request, after, client::Leave::Close)
                        .unwrap();
                assert!(matches!(gone, client::GiveUp::GaveUp), "{}", c.name);
                None
            }
            None => Some(client::send(self.addr(), &c.request).unwrap()),
        };
        std::thread::sleep(c.settle + Duration::from_millis(100));
        let log = self.abi_lines()[log_from..]
            .iter()
            .map(|l| normalize(l))
            .collect();
        Seen::of(answer, log, &server.calls()[calls_from..]).without_upstream_answer(c)
    }
}

// ---------- host-test ----------

type Calls = std::rc::Rc<std::cell::RefCell<Vec<GrpcRequest>>>;

fn host(
    config: &str,
    echo: SocketAddr,
    grpc: SocketAddr,
    workers: usize,
    local_calls: Calls,
) -> SimEnvoy {
    let wasm = dist_wasm("abi_probe.wasm").unwrap_or_else(|e| panic!("{e}"));
    let refused = free_port().unwrap();
    SimEnvoy::builder(wasm)
        .workers(workers)
        .vm_id("abi")
        .plugin_name("abi")
        .plugin_config(config)
        .route_timeout(Duration::from_secs(5))
        .upstream(|req| {
            if req.path().starts_with("/refused") {
                Reply::connect_failure()
            } else {
                Reply::ok()
                    .header("content-type", "text/plain")
                    .body("upstream ok")
            }
        })
        .cluster_addr("echo", &echo.to_string())
        .cluster_addr("refused", &format!("127.0.0.1:{refused}"))
        .cluster("slow", |_| {
            Reply::ok()
                .header("content-type", "text/plain")
                .body("slept")
                .after(Duration::from_millis(400))
        })
        .grpc_cluster("grpc_local", move |req| {
            local_calls.borrow_mut().push(req.clone());
            grpc_handler(req)
        })
        .grpc_cluster_addr("grpc", &grpc.to_string())
        .grpc_cluster_addr("grpc_refused", &format!("127.0.0.1:{refused}"))
        .route_name("probe_route")
        .cluster_name("upstream")
        .filter_metadata(
            "probe.ns",
            host_test::Value::object([
                ("s", host_test::Value::from("text")),
                ("n", host_test::Value::from(42.0)),
                ("b", host_test::Value::from(true)),
                (
                    "o",
                    host_test::Value::object([("k", host_test::Value::from("v"))]),
                ),
                (
                    "l",
                    host_test::Value::List(vec![
                        host_test::Value::from(1.0),
                        host_test::Value::from("x"),
                    ]),
                ),
            ]),
        )
        .route_metadata(
            "probe.route",
            host_test::Value::object([("team", host_test::Value::from("blue"))]),
        )
        .build()
        .unwrap_or_else(|e| panic!("host-test: {e}"))
}

fn run_in_host(e: &mut SimEnvoy, c: &Case, server: &GrpcServer, local: &Calls) -> Seen {
    let (log_from, calls_from) = (e.logs().len(), server.calls().len());
    let local_from = local.borrow().len();
    let id = e.start(0, host::request(&c.request)).unwrap();
    let answer = match c.hang_up_after {
        Some(after) => {
            e.send_request(id).unwrap();
            e.advance(after);
            e.reset_client(id).unwrap();
            None
        }
        None => Some(host::response(e.finish_stream(id).unwrap())),
    };
    e.advance(c.settle + Duration::from_millis(100));
    // The loopback server's threads see a cancel a moment later.
    std::thread::sleep(Duration::from_millis(50));
    let log = e.logs()[log_from..]
        .iter()
        .filter(|l| l.message.starts_with("abi "))
        .map(|l| normalize(&l.message))
        .collect();
    let calls = [&server.calls()[calls_from..], &local.borrow()[local_from..]].concat();
    Seen::of(answer, log, &calls).without_upstream_answer(c)
}

impl Seen {
    /// What the client got (`None`: it hung up), the probe's log lines and the gRPC calls.
    fn of(answer: Option<Response>, log: Vec<String>, calls: &[GrpcRequest]) -> Seen {
        let (status, headers, body) = match answer {
            Some(r) => (r.status, keep(r.head.headers.iter().cloned()), r.text()),
            None => (0, Vec::new(), String::new()),
        };
        Seen {
            status,
            headers,
            body: normalize(&body),
            log,
            grpc_calls: grpc_calls(calls),
        }
    }

    fn without_upstream_answer(mut self, c: &Case) -> Seen {
        if c.upstream_answers {
            self.log.retain(|l| {
                !l.starts_with("abi response_headers") && !l.starts_with("abi response_body")
            });
        }
        self
    }
}

#[test]
fn envoy_and_host_test_agree_on_every_probe_case() {
    let echo = EchoServer::start();
    let server = GrpcServer::start(grpc_handler).unwrap();
    let envoy = RealEnvoy::start("cases", 1, "", echo.addr.port(), server.addr().port());
    // Envoy flushes its log every 20 ms: the VMs' start-up lines may land after
    // `/ready`. They belong to no case; wait until they are in and the log is still.
    let end = Instant::now() + Duration::from_secs(5);
    let mut seen = 0;
    while seen == 0 || envoy.abi_lines().len() != seen {
        assert!(
            Instant::now() < end,
            "the probe's start-up lines never settled"
        );
        seen = envoy.abi_lines().len();
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut real = Vec::new();
    for c in cases() {
        let seen = envoy.run(&c, &server);
        if std::env::var_os("PROBE_SHOW").is_some() {
            eprintln!("ENVOY {}: {seen:#?}", c.name);
        }
        real.push(seen);
    }
    drop(envoy);
    let local: Calls = Default::default();
    let mut e = host("", echo.addr, server.addr(), 1, local.clone());
    let mut differences = Vec::new();
    for (c, r) in cases().iter().zip(&real) {
        let m = run_in_host(&mut e, c, &server, &local);
        if *r != m {
            differences.push(format!(
                "{}:\n  envoy:     {r:?}\n  host-test: {m:?}",
                c.name
            ));
        } else {
            eprintln!("{}: {r:?}", c.name);
        }
    }
    assert!(
        differences.is_empty(),
        "Envoy and host-test differ:\n{}",
        differences.join("\n")
    );
}

/// The probe's start-up and tick lines in a process with two workers:
/// (lines from start until ready, tick lines in one second, tick lines in
/// one second after one worker's VM trapped).
fn vm_layout_in_envoy(echo: u16, grpc: u16) -> (Vec<String>, usize, usize) {
    let envoy = RealEnvoy::start("vms", 2, "tick_ms=100", echo, grpc);
    std::thread::sleep(Duration::from_millis(300));
    let start: Vec<String> = envoy
        .abi_lines()
        .into_iter()
        .filter(|l| !l.starts_with("abi tick"))
        .collect();
    let ticks = |envoy: &RealEnvoy| {
        let before = envoy
            .abi_lines()
            .iter()
            .filter(|l| l.starts_with("abi tick"))
            .count();
        std::thread::sleep(Duration::from_millis(1000));
        envoy
            .abi_lines()
            .iter()
            .filter(|l| l.starts_with("abi tick"))
            .count()
            - before
    };
    let healthy = ticks(&envoy);
    let trap = Request::get("/probe").header("x-abi", "trap");
    let r = client::send(envoy.addr(), &trap).unwrap();
    assert_eq!(r.status, 503);
    let after_trap = ticks(&envoy);
    (start, healthy, after_trap)
}

/// The same in host-test (two workers, virtual time).
fn vm_layout_in_host(echo: SocketAddr, grpc: SocketAddr) -> (Vec<String>, usize, usize) {
    let mut e = host("tick_ms=100", echo, grpc, 2, Default::default());
    let ticks = |e: &SimEnvoy| {
        e.logs()
            .iter()
            .filter(|l| l.message.starts_with("abi tick"))
            .count()
    };
    let start = e
        .logs()
        .iter()
        .filter(|l| l.message.starts_with("abi ") && !l.message.starts_with("abi tick"))
        .map(|l| l.message.clone())
        .collect();
    let before = ticks(&e);
    e.advance(Duration::from_millis(1000));
    let healthy = ticks(&e) - before;
    let r = e
        .request(
            0,
            host::request(&Request::get("/probe").header("x-abi", "trap")),
        )
        .unwrap();
    assert_eq!(r.status, 503);
    let before = ticks(&e);
    e.advance(Duration::from_millis(1000));
    (start, healthy, ticks(&e) - before)
}

/// Start-up lines as a sorted multiset (Envoy starts its threads' VMs
/// concurrently, so only what happens, not its order, is compared).
fn sorted(mut lines: Vec<String>) -> Vec<String> {
    lines.sort();
    lines
}

// Envoy runs a plugin on a main-thread VM (start, configure, ticks) beside the
// worker VMs, and configures a short-lived copy before serving.
#[test]
fn envoy_and_host_test_agree_on_the_vm_layout() {
    let echo = EchoServer::start();
    let server = GrpcServer::start(grpc_handler).unwrap();
    let (start, healthy, after_trap) = vm_layout_in_envoy(echo.addr.port(), server.addr().port());
    eprintln!("ENVOY start: {start:#?}\nticks/s: {healthy}, after a trap: {after_trap}");
    let (h_start, h_healthy, h_after) = vm_layout_in_host(echo.addr, server.addr());
    assert_eq!(sorted(start), sorted(h_start), "start-up callbacks");
    // Ticks every 100 ms: Envoy's timers drift a little in real time.
    let close = |a: usize, b: usize| a.abs_diff(b) <= a / 10 + 1;
    assert!(
        close(healthy, h_healthy),
        "ticks/s: envoy {healthy}, host-test {h_healthy}"
    );
    assert!(
        close(after_trap, h_after),
        "ticks/s after a worker trapped: envoy {after_trap}, host-test {h_after}"
    );
}
