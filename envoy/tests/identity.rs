//! Exact identity (issue 21) in a real Envoy with the demo upstream: keys, scope values
//! and `header:` parts are the bytes Envoy delivers (no lossy text between them and the
//! digest); a missing header is not an empty one and every line of a repeated header
//! counts; the gRPC bypass is the operator's (`grpc`), for real gRPC (HTTP/2) only, so
//! a gRPC content type over HTTP/1.1 neither skips deduplication nor `key.required`;
//! and the operator API finds and purges records scoped by `:authority`, `:path` and
//! `:method`.
//!
//! Requests with bytes that are not UTF-8 are written on a raw socket (the test client
//! takes text); HTTP/2 requests are sent with `curl --http2-prior-knowledge`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::http::{read_body, read_head};
use dedup_envoy::paths::config_file;
use dedup_envoy::{EnvoyConfig, Request, Response};
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// Top level: a tenant scope. Rules: a keyless fingerprint with a header part, a payload
/// check with a header part, and required keys. (The gRPC test has its own Envoy: a
/// filter without the `grpc` field refuses that configuration.)
fn identity_config() -> String {
    json!({
        "scope": {"headers": ["x-tenant"]},
        "rules": [
            {"name": "fp", "match": {"path_prefix": "/fp/"},
             "key": {"fingerprint": ["method", "path", "body", "header:x-device"]}},
            {"name": "sig", "match": {"path_prefix": "/sig/"},
             "payload": {"parts": ["method", "path", "body", "header:x-sig"]}},
            {"name": "required", "match": {"path_prefix": "/required/"},
             "key": {"required": true}},
        ],
    })
    .to_string()
}

/// The shared Envoy; never dropped (it dies with the test process).
fn ident() -> &'static Stack {
    static S: OnceLock<Stack> = OnceLock::new();
    S.get_or_init(|| Stack::start("identity", &identity_config()))
}

/// A POST written byte for byte on a fresh connection: `headers` are whole lines
/// (`name: value`, any bytes but CR and LF).
fn raw_post(addr: SocketAddr, path: &str, headers: &[&[u8]], body: &[u8]) -> Response {
    let mut msg = format!("POST {path} HTTP/1.1\r\nhost: identity.example\r\n").into_bytes();
    for h in headers {
        msg.extend_from_slice(h);
        msg.extend_from_slice(b"\r\n");
    }
    msg.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    msg.extend_from_slice(body);
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&msg).unwrap();
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader).unwrap().expect("a response");
    let status = head
        .start
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    let body = read_body(&mut reader, &head, true).unwrap();
    Response { status, head, body }
}

/// Two tenants whose scope values read the same through a lossy UTF-8 conversion
/// (`acme\xff`, `acme\xfe`, and `acme` + U+FFFD sent as UTF-8) never meet: each runs
/// once and replays its own answer.
#[test]
fn scope_values_are_the_bytes_envoy_delivers() {
    let s = ident();
    let path = "/identity/scope";
    let tenants: [&[u8]; 3] = [b"acme\xff", b"acme\xfe", "acme\u{fffd}".as_bytes()];
    let send = |tenant: &[u8]| {
        let line = [&b"x-tenant: "[..], tenant].concat();
        raw_post(
            s.envoy.addr(),
            path,
            &[b"idempotency-key: scope-1", &line],
            br#"{"item": "lamp"}"#,
        )
    };
    let firsts: Vec<Response> = tenants.iter().map(|t| send(t)).collect();
    for (t, r) in tenants.iter().zip(&firsts) {
        assert_executed(r);
        assert!(
            !is_replayed(r),
            "tenant {t:?} got another tenant's response"
        );
    }
    for (t, first) in tenants.iter().zip(&firsts) {
        assert_replay_of(&send(t), first);
    }
    assert_eq!(s.executions(path), 3);
}

/// Keys that are not UTF-8 are refused (400 invalid-key): read lossily, `op-\xc3` and
/// `op-\xff` were one key and the second got the first's response. A key sent as
/// valid UTF-8 U+FFFD is a key of its own.
#[test]
fn keys_that_are_not_utf8_are_refused_not_merged() {
    let s = ident();
    let path = "/identity/keys";
    for key in [&b"op-\xc3"[..], b"op-\xff"] {
        let line = [&b"idempotency-key: "[..], key].concat();
        let r = raw_post(s.envoy.addr(), path, &[&line], b"{}");
        assert_problem(&r, 400, "invalid-key");
        assert!(
            json(&r)["detail"].as_str().unwrap().contains("UTF-8"),
            "{}",
            r.summary()
        );
    }
    assert_eq!(s.executions(path), 0);
    let valid = post(path, "op-\u{fffd}", &json!({}));
    let first = s.send(&valid);
    assert_executed(&first);
    assert_replay_of(&s.send(&valid), &first);
    assert_eq!(s.executions(path), 1);
}

/// A fingerprint's header part: no header, an empty header, one line, and two lines
/// with another second line are five requests, each run once.
#[test]
fn fingerprint_header_parts_tell_missing_from_empty_and_count_every_line() {
    let s = ident();
    let path = "/fp/identity";
    let cases: [&[&[u8]]; 5] = [
        &[],
        &[b"x-device:"],
        &[b"x-device: d-1"],
        &[b"x-device: d-1", b"x-device: a"],
        &[b"x-device: d-1", b"x-device: b"],
    ];
    for (i, lines) in cases.iter().enumerate() {
        let first = raw_post(s.envoy.addr(), path, lines, b"same body");
        assert_executed(&first);
        assert!(
            !is_replayed(&first),
            "case {i} met an earlier case's record"
        );
        assert_replay_of(&raw_post(s.envoy.addr(), path, lines, b"same body"), &first);
    }
    assert_eq!(s.executions(path), 5);
}

/// The payload check's header part: the same key with another second line of the
/// signed header is another payload (422), not a replay.
#[test]
fn payload_header_parts_count_every_line() {
    let s = ident();
    let path = "/sig/identity";
    let (key, sig_a, sig_b) = (
        &b"idempotency-key: sig-1"[..],
        &b"x-sig: v1"[..],
        &b"x-sig: v2"[..],
    );
    let first = raw_post(s.envoy.addr(), path, &[key, sig_a, sig_a], b"{}");
    assert_executed(&first);
    assert_replay_of(
        &raw_post(s.envoy.addr(), path, &[key, sig_a, sig_a], b"{}"),
        &first,
    );
    for other in [&[key, sig_a, sig_b][..], &[key, sig_a], &[key]] {
        let r = raw_post(s.envoy.addr(), path, other, b"{}");
        assert_problem(&r, 422, "payload-mismatch");
    }
    assert_eq!(s.executions(path), 1);
}

/// A gRPC content type over HTTP/1.1 is no gRPC: two keyed POSTs to a REST route run
/// once (the second is a duplicate), and `key.required` holds for it.
#[test]
fn a_grpc_content_type_over_http1_is_deduplicated_and_needs_its_key() {
    let s = ident();
    let path = "/identity/grpc-label";
    // One content-type line: `post` would add `application/json` before it.
    let labelled = Request::post(path)
        .key("label-1")
        .header("content-type", "application/grpc+json")
        .body(br#"{"item": "lamp"}"#.to_vec());
    let first = s.send(&labelled);
    assert_executed(&first);
    // The duplicate does not run. Envoy goes by the content type: the replay reaches
    // the client as a trailers-only gRPC answer (seen in Envoy 1.40), not as the first.
    let second = s.send(&labelled);
    assert!(is_replayed(&second), "{:?}", second.head.headers);
    assert!(
        second.header("grpc-status").is_some(),
        "{:?}",
        second.head.headers
    );
    assert_eq!(
        s.executions(path),
        1,
        "the second gRPC-labelled POST executed"
    );
    let required = "/required/grpc-label";
    let keyless = Request::post(required)
        .header("content-type", "application/grpc")
        .body(b"\x00\x00\x00\x00\x00".to_vec());
    let r = s.send(&keyless);
    assert_eq!(
        s.executions(required),
        0,
        "key.required was skipped: {}",
        r.summary()
    );
    // Envoy goes by the content type: its local reply to a gRPC-labelled request is a
    // trailers-only gRPC answer with the problem in grpc-message (seen in Envoy 1.40).
    let message = r.header("grpc-message").unwrap_or_default();
    assert!(message.contains("missing-key"), "{:?}", r.head.headers);
}

/// Real gRPC (HTTP/2 with a gRPC content type) passes untouched by default, counted as
/// bypassed; a rule with `"grpc": "deduplicate"` deduplicates it.
#[test]
fn real_grpc_is_bypassed_by_default_and_deduplicated_when_the_policy_says_so() {
    let config = json!({"rules": [
        {"name": "rpc", "match": {"path_prefix": "/rpc.Dedup/"}, "grpc": "deduplicate"},
    ]});
    let s = Stack::start("identity-grpc", &config.to_string());
    let frame = b"\x00\x00\x00\x00\x05hello";
    let grpc = |path: &str, key: &str| {
        h2_post(
            s.envoy.addr(),
            path,
            &[
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("idempotency-key", key),
            ],
            frame,
        )
    };
    let bypassed_before = s.counter("bypassed");
    let bypassed = "/orders.v1.Orders/Create";
    for _ in 0..2 {
        let r = grpc(bypassed, "rpc-1");
        assert_eq!(r.status, 200, "{}", r.summary());
        assert!(!is_replayed(&r));
    }
    assert_eq!(s.executions(bypassed), 2);
    assert!(s.counter("bypassed") >= bypassed_before + 2);
    let deduplicated = "/rpc.Dedup/Create";
    let first = grpc(deduplicated, "rpc-2");
    assert_eq!(first.status, 200, "{}", first.summary());
    let second = grpc(deduplicated, "rpc-2");
    // The duplicate never ran; Envoy turned its replay into a trailers-only gRPC answer
    // (seen in Envoy 1.40: grpc-status 2, the stored body in grpc-message).
    assert!(is_replayed(&second), "{:?}", second.head.headers);
    assert!(
        second.header("grpc-status").is_some(),
        "{:?}",
        second.head.headers
    );
    assert_eq!(
        s.executions(deduplicated),
        1,
        "the operator asked to deduplicate gRPC"
    );
}

/// The data plane and the operator API agree on rules scoped by each pseudo-header.
fn pseudo_rules(role: Option<&str>) -> String {
    let mut v = json!({
        "rules": [
            {"name": "host", "match": {"path_prefix": "/host/"},
             "scope": {"authority": false, "headers": [":authority"]}},
            {"name": "path", "match": {"path_prefix": "/path/"},
             "scope": {"headers": [":path"]}},
            {"name": "method", "match": {"path_prefix": "/method/"},
             "methods": ["POST", "PUT"], "scope": {"headers": [":method"]}},
        ],
    });
    if let Some(role) = role {
        v["role"] = json!(role);
    }
    v.to_string()
}

/// Records scoped by `:authority`, `:path` and `:method` are found and purged through
/// the admin API (`dedupctl --scope :authority=…`), and then run again.
#[test]
fn records_scoped_by_pseudo_headers_are_found_and_purged() {
    let s = Stack::start_with("identity-admin", |port, wasm| {
        EnvoyConfig::from_template(
            &config_file("admin-api.yaml"),
            port,
            wasm,
            &pseudo_rules(None),
        )
        .unwrap()
        .with_port("ADMIN_API_PORT")
        .unwrap()
        .with_var("ADMIN_FILTER_CONFIG", &pseudo_rules(Some("admin")))
    });
    let admin = SocketAddr::from((
        [127, 0, 0, 1],
        s.envoy.config.port("ADMIN_API_PORT").unwrap(),
    ));
    let host = "Shop.Example";
    let cases = [
        ("host", "POST", "/host/orders", ":authority", host),
        (
            "path",
            "POST",
            "/path/orders?x=1",
            ":path",
            "/path/orders?x=1",
        ),
        ("method", "PUT", "/method/orders", ":method", "PUT"),
    ];
    for (rule, method, path, pseudo, value) in cases {
        let req = Request::new(method, path)
            .host(host)
            .key("ps-1")
            .json(&json!({"item": rule}));
        assert_executed(&s.send(&req));
        let scope = format!("{pseudo}={value}");
        let mut target = vec!["--rule", rule, "--key", "ps-1", "--scope", &scope];
        if rule != "host" {
            target.extend(["--authority", host]);
        }
        let (code, out) = dedupctl(admin, &[&["--json", "get"][..], &target].concat());
        assert_eq!(code, Some(0), "{rule}: {out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["state"], "completed", "{rule}: {v}");
        let (code, out) = dedupctl(admin, &[&["purge"][..], &target].concat());
        assert_eq!(code, Some(0), "{rule}: {out}");
        assert!(out.starts_with("removed record"), "{rule}: {out}");
        let (code, _) = dedupctl(admin, &[&["get"][..], &target].concat());
        assert_eq!(code, Some(1), "{rule}: purged");
        assert_executed(&s.send(&req));
        let exec_path = path.split('?').next().unwrap();
        assert_eq!(
            s.executions(exec_path),
            2,
            "{rule}: runs again after the purge"
        );
    }
}
