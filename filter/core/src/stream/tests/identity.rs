//! A request's identity end to end through the plugin: keys, scopes, fingerprints,
//! pseudo-headers, gRPC and the payload.

use crate::metrics::Counter;
use crate::testing::*;

#[test]
fn json_pointer_and_fingerprint_modes() {
    let p =
        plugin(r#"{"key": {"json_pointer": "/msgId", "fingerprint": ["method", "path", "body"]}}"#);
    let (_, mut env) = world();
    // Same msgId, same body: replay.
    let m = req("POST", "/push").body(r#"{"msgId": "m1", "text": "hi"}"#);
    run(&p, &mut env, &m, ok("sent"));
    run(&p, &mut env, &m, ok("no")).assert_replays(b"sent");
    // Same msgId, other text: 422.
    let m2 = req("POST", "/push").body(r#"{"msgId": "m1", "text": "bye"}"#);
    assert_eq!(run(&p, &mut env, &m2, ok("no")).status(), 422);
    // Header key takes precedence over the body's.
    let h = req("POST", "/push")
        .key("m1")
        .body(r#"{"msgId": "m1", "text": "hi"}"#);
    assert!(run(&p, &mut env, &h, ok("h")).reached_upstream());
    // No msgId, or not JSON: the fingerprint of the whole request is the key.
    let f = req("POST", "/push").body("plain text form");
    assert!(run(&p, &mut env, &f, ok("f")).reached_upstream());
    run(&p, &mut env, &f, ok("no")).assert_replays(b"f");
    // An invalid JSON key is a 400 even with a fingerprint fallback.
    let bad = req("POST", "/push").body(r#"{"msgId": [1]}"#);
    assert_eq!(run(&p, &mut env, &bad, ok("no")).status(), 400);
}

#[test]
fn json_pointer_required_without_key_explains_why() {
    let (p, mut env) = one_worker(r#"{"key": {"json_pointer": "/id", "required": true}}"#);
    let o = run(&p, &mut env, &req("POST", "/").body("{not json"), ok("no"));
    assert_eq!(o.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&o.local().body).unwrap();
    assert!(
        v["detail"].as_str().unwrap().contains("not valid JSON"),
        "{v}"
    );
    // No body at all: no key.
    assert_eq!(run(&p, &mut env, &req("POST", "/"), ok("no")).status(), 400);
}

#[test]
fn scopes_never_see_each_other() {
    let (p, mut env) = one_worker(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let a = req("POST", "/o")
        .key("k")
        .header("x-tenant", "a")
        .body("same");
    let b = req("POST", "/o")
        .key("k")
        .header("x-tenant", "b")
        .body("same");
    assert_eq!(run(&p, &mut env, &a, ok("secret-a")), executed("secret-a"));
    assert_eq!(run(&p, &mut env, &b, ok("secret-b")), executed("secret-b"));
    run(&p, &mut env, &a, ok("no")).assert_replays(b"secret-a");
    run(&p, &mut env, &b, ok("no")).assert_replays(b"secret-b");
}

#[test]
fn two_hosts_never_share_records_unless_authority_is_left_out() {
    let (p, mut env) = one_worker("{}");
    let mut acme = req("POST", "/o").key("k").body("{}");
    acme.head.authority = "acme.example".into();
    let mut globex = acme.clone();
    globex.head.authority = "Globex.Example".into();
    assert!(run(&p, &mut env, &acme, ok("acme")).reached_upstream());
    assert_eq!(run(&p, &mut env, &globex, ok("globex")), executed("globex"));
    run(&p, &mut env, &acme, ok("no")).assert_replays(b"acme");
    // Host names compare case-insensitively.
    globex.head.authority = "globex.example".into();
    run(&p, &mut env, &globex, ok("no")).assert_replays(b"globex");
    let p = plugin(r#"{"scope": {"authority": false}, "store": {"namespace": "other"}}"#);
    assert!(run(&p, &mut env, &acme, ok("acme")).reached_upstream());
    run(&p, &mut env, &globex, ok("no")).assert_replays(b"acme");
}

#[test]
fn pseudo_headers_can_scope_and_fingerprint() {
    let (p, mut env) = one_worker(r#"{"scope": {"authority": false, "headers": [":path"]}}"#);
    let a = req("POST", "/a").key("k");
    let b = req("POST", "/b").key("k");
    assert!(run(&p, &mut env, &a, ok("a")).reached_upstream());
    // Without the path in the scope, /b would be a 422 payload mismatch.
    assert!(run(&p, &mut env, &b, ok("b")).reached_upstream());
    let p = plugin(r#"{"key": {"fingerprint": ["header::authority", "body"]}}"#);
    let mut x = req("POST", "/x").body("same");
    x.head.authority = "one.example".into();
    assert!(run(&p, &mut env, &x, ok("one")).reached_upstream());
    run(&p, &mut env, &x, ok("no")).assert_replays(b"one");
    assert_eq!(
        cfg_err(r#"{"scope": {"headers": [":scheme"]}}"#).0,
        "scope.headers"
    );
    assert_eq!(
        cfg_err(r#"{"scope": {"headers": ["x-t", "X-T"]}}"#).0,
        "scope.headers"
    );
    assert_eq!(
        cfg_err(r#"{"key": {"headers": [":authority"]}}"#).0,
        "key.headers"
    );
    assert_eq!(
        cfg_err(r#"{"key": {"fingerprint": ["header::x"]}}"#).0,
        "key.fingerprint"
    );
}

#[test]
fn repeated_key_or_scope_headers_are_refused() {
    let (p, mut env) = one_worker(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let victim = req("POST", "/o").key("k").header("x-tenant", "victim");
    assert!(run(&p, &mut env, &victim, ok("secret")).reached_upstream());
    let smuggled = victim.clone().header("x-tenant", "attacker");
    let o = run(&p, &mut env, &smuggled, ok("no"));
    assert_eq!(o.status(), 400);
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-scope");
    let two_keys = req("POST", "/o")
        .key("k")
        .key("k2")
        .header("x-tenant", "victim");
    let o = run(&p, &mut env, &two_keys, ok("no"));
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-key");
    // Even the same value twice is refused: a proxy in front may have added one.
    let same_twice = req("POST", "/o")
        .key("k")
        .key("k")
        .header("x-tenant", "victim");
    assert_eq!(run(&p, &mut env, &same_twice, ok("no")).status(), 400);
    assert_eq!(env.count_of(Counter::BadKey), 3);
    // A JSON body naming the pointer's member twice is ambiguous too.
    let p = plugin(r#"{"key": {"json_pointer": "/id"}}"#);
    let o = run(
        &p,
        &mut env,
        &req("POST", "/o").body(r#"{"id": "a", "id": "b"}"#),
        ok("no"),
    );
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:ambiguous-key");
}

/// A request over `protocol` with this content type.
fn grpc_over(protocol: &str, ct: &str) -> Req {
    let mut r = req("POST", "/pkg.Svc/Call")
        .header("content-type", ct)
        .body("x");
    r.head.protocol = protocol.into();
    r
}

#[test]
fn grpc_requests_pass_untouched() {
    let p = plugin(r#"{"key": {"required": true}}"#);
    let (shared, mut env) = world();
    for (protocol, ct) in [
        ("HTTP/2", "application/grpc"),
        ("HTTP/2", "application/grpc+proto"),
        ("HTTP/3", "Application/GRPC-web"),
    ] {
        let r = grpc_over(protocol, ct).key("k");
        assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
        assert!(run(&p, &mut env, &r, ok("b")).reached_upstream());
    }
    // The operator chose to let real gRPC by: `key.required` does not apply to it.
    let keyless = grpc_over("HTTP/2", "application/grpc");
    assert!(run(&p, &mut env, &keyless, ok("c")).reached_upstream());
    assert_eq!(env.count_of(Counter::Bypassed), 7);
    assert_eq!(shared.key_count(), 0);
}

/// Issue 21: a gRPC content type over HTTP/1.1 is a label any client can put on any
/// request: it is deduplicated, and `key.required` holds.
#[test]
fn a_grpc_content_type_over_http1_is_deduplicated_and_needs_its_key() {
    let p = plugin(r#"{"key": {"required": true}}"#);
    let (_, mut env) = world();
    for (i, protocol) in ["HTTP/1.1", "HTTP/1.0", ""].into_iter().enumerate() {
        let r = grpc_over(protocol, "application/grpc+json").key(&format!("h1-{i}"));
        assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
        run(&p, &mut env, &r, ok("b")).assert_replays(b"a");
        let keyless = grpc_over(protocol, "application/grpc");
        let o = run(&p, &mut env, &keyless, ok("no"));
        assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:missing-key");
    }
    assert_eq!(env.count_of(Counter::Bypassed), 0);
}

#[test]
fn grpc_deduplicate_is_the_operators_choice_top_level_or_per_rule() {
    let p = plugin(
        r#"{"rules": [
            {"name": "rpc", "match": {"path_prefix": "/pkg.Svc/"}, "grpc": "deduplicate"},
            {"name": "other", "match": {"path_prefix": "/other.Svc/"}, "methods": ["POST"]}
        ]}"#,
    );
    let (_, mut env) = world();
    let r = grpc_over("HTTP/2", "application/grpc").key("g-1");
    assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
    assert!(!run(&p, &mut env, &r, ok("b")).reached_upstream());
    // Another rule keeps the default (bypass).
    let mut o = grpc_over("HTTP/2", "application/grpc").key("g-2");
    o.head.path = "/other.Svc/Call".into();
    assert!(run(&p, &mut env, &o, ok("a")).reached_upstream());
    assert!(run(&p, &mut env, &o, ok("b")).reached_upstream());
    assert_eq!(env.count_of(Counter::Bypassed), 2);
    // At the top level, for every request no rule matches.
    let p = plugin(r#"{"grpc": "deduplicate"}"#);
    let (_, mut env) = world();
    let r = grpc_over("HTTP/2", "application/grpc").key("g-3");
    assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
    assert!(!run(&p, &mut env, &r, ok("b")).reached_upstream());
    assert_eq!(env.count_of(Counter::Bypassed), 0);
}

/// Issue 21: scope values are the bytes Envoy delivered. `acme\xff` and `acme\xfe`
/// read the same through a lossy conversion; they are two tenants.
#[test]
fn scope_values_that_are_not_utf8_are_distinct_tenants() {
    let p = plugin(r#"{"scope": {"headers": ["x-tenant"]}}"#);
    let (_, mut env) = world();
    let ff = req("POST", "/o")
        .key("k")
        .header_bytes("x-tenant", b"acme\xff");
    let fe = req("POST", "/o")
        .key("k")
        .header_bytes("x-tenant", b"acme\xfe");
    let lossy = req("POST", "/o")
        .key("k")
        .header("x-tenant", "acme\u{fffd}");
    assert!(run(&p, &mut env, &ff, ok("ff")).reached_upstream());
    assert!(run(&p, &mut env, &fe, ok("fe")).reached_upstream());
    assert!(run(&p, &mut env, &lossy, ok("lossy")).reached_upstream());
    run(&p, &mut env, &ff, ok("no")).assert_replays(b"ff");
    run(&p, &mut env, &fe, ok("no")).assert_replays(b"fe");
}

/// Issue 21: a key that is not UTF-8 is refused (400 invalid-key), never read lossily
/// into another key's record.
#[test]
fn keys_that_are_not_utf8_are_refused() {
    let p = plugin("{}");
    let (shared, mut env) = world();
    for raw in [&b"op-\xc3"[..], b"op-\xff", b"\"op-\xff\""] {
        let r = req("POST", "/o").header_bytes("idempotency-key", raw);
        let o = run(&p, &mut env, &r, ok("no"));
        assert_eq!(
            o.problem_type(),
            "urn:proxy-dedup:problem:invalid-key",
            "{raw:?}"
        );
    }
    assert_eq!(shared.key_count(), 0);
    // The replacement character itself is a valid key of its own.
    let r = req("POST", "/o").key("op-\u{fffd}");
    assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
    run(&p, &mut env, &r, ok("b")).assert_replays(b"a");
}

/// Issue 21: a fingerprint's header part tells a missing header from an empty one, and
/// every line of a repeated header counts.
#[test]
fn fingerprint_header_parts_count_absence_and_every_line() {
    let p = plugin(r#"{"key": {"fingerprint": ["method", "path", "header:x-device"]}}"#);
    let (_, mut env) = world();
    let cases = [
        req("POST", "/o"),
        req("POST", "/o").header("x-device", ""),
        req("POST", "/o").header("x-device", "a"),
        req("POST", "/o")
            .header("x-device", "a")
            .header("x-device", "b"),
        req("POST", "/o")
            .header("x-device", "a")
            .header("x-device", "c"),
        req("POST", "/o")
            .header("x-device", "b")
            .header("x-device", "a"),
        req("POST", "/o").header_bytes("x-device", b"\xff"),
        req("POST", "/o").header_bytes("x-device", b"\xfe"),
    ];
    for (i, r) in cases.iter().enumerate() {
        let first = format!("first-{i}");
        let o = run(&p, &mut env, r, ok(&first));
        assert!(
            o.reached_upstream(),
            "case {i} met an earlier case's record"
        );
        run(&p, &mut env, r, ok("no")).assert_replays(first.as_bytes());
    }
}

/// Issue 21: so does the payload check's: another second line is another payload.
#[test]
fn payload_header_parts_count_absence_and_every_line() {
    let p = plugin(r#"{"payload": {"parts": ["method", "path", "body", "header:x-sig"]}}"#);
    let (_, mut env) = world();
    let two = req("POST", "/o")
        .key("p-1")
        .header("x-sig", "a")
        .header("x-sig", "b");
    assert!(run(&p, &mut env, &two, ok("a")).reached_upstream());
    run(&p, &mut env, &two, ok("no")).assert_replays(b"a");
    for other in [
        req("POST", "/o").key("p-1").header("x-sig", "a"),
        req("POST", "/o")
            .key("p-1")
            .header("x-sig", "a")
            .header("x-sig", "c"),
        req("POST", "/o").key("p-1"),
    ] {
        assert_eq!(run(&p, &mut env, &other, ok("no")).status(), 422);
    }
    let empty = req("POST", "/o").key("p-2").header("x-sig", "");
    assert!(run(&p, &mut env, &empty, ok("a")).reached_upstream());
    assert_eq!(
        run(&p, &mut env, &req("POST", "/o").key("p-2"), ok("no")).status(),
        422
    );
}

#[test]
fn a_short_content_type_is_not_grpc() {
    let (p, mut env) = one_worker("{}");
    for ct in ["text/plain", "application/grp", ""] {
        let r = req("POST", "/o")
            .key(&format!("k-{ct}"))
            .header("content-type", ct);
        assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
        assert_eq!(run(&p, &mut env, &r, ok("b")).local().body, b"a", "{ct:?}");
    }
    assert_eq!(env.count_of(Counter::Bypassed), 0);
}

#[test]
fn the_query_is_part_of_the_payload_and_of_a_query_fingerprint() {
    let (p, mut env) = one_worker("{}");
    assert!(run(&p, &mut env, &req("POST", "/o?a=1").key("k"), ok("a")).reached_upstream());
    let o = run(&p, &mut env, &req("POST", "/o?a=2").key("k"), ok("no"));
    assert_eq!(o.problem_type(), "urn:proxy-dedup:problem:payload-mismatch");
    // Keyless: only the query differs, and it is a configured part.
    let p = plugin(r#"{"key": {"fingerprint": ["path", "query"]}, "store": {"namespace": "fp"}}"#);
    for q in ["/f?x=1", "/f?x=2"] {
        assert!(run(&p, &mut env, &req("POST", q), ok(q)).reached_upstream());
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
    let (p, mut env) = one_worker(
        r#"{"scope": {"authority": false}, "key": {"fingerprint": ["header::authority", "body"]}}"#,
    );
    let mut one = req("POST", "/x").body("same");
    one.head.authority = "one.example".into();
    let mut two = one.clone();
    two.head.authority = "two.example".into();
    assert!(run(&p, &mut env, &one, ok("one")).reached_upstream());
    assert!(run(&p, &mut env, &two, ok("two")).reached_upstream());
    run(&p, &mut env, &two, ok("no")).assert_replays(b"two");
}

#[test]
fn a_json_key_that_is_absent_passes_unless_keys_are_required() {
    let (p, mut env) = one_worker(r#"{"key": {"json_pointer": "/id"}}"#);
    let r = req("POST", "/o").body(r#"{"other": 1}"#);
    assert!(run(&p, &mut env, &r, ok("a")).reached_upstream());
    assert!(run(&p, &mut env, &r, ok("b")).reached_upstream());
    assert_eq!(env.count_of(Counter::Bypassed), 2);
    let p = plugin(r#"{"key": {"json_pointer": "/id", "required": true}}"#);
    assert_eq!(run(&p, &mut env, &r, ok("no")).status(), 400);
}

#[test]
fn the_method_can_be_a_fingerprint_part() {
    let (p, mut env) = one_worker(r#"{"key": {"fingerprint": ["header::method", "body"]}}"#);
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
fn a_json_key_is_its_string_content_exactly() {
    // Issue 21: `"\"abc\""` was unquoted like a structured-header string and got the
    // replay of the message whose id is `abc`.
    let (p, mut env) = one_worker(r#"{"key": {"json_pointer": "/id"}}"#);
    let r =
        |id: &str, body: &str| req("POST", "/m").body(&format!(r#"{{"id": {id}, "b": "{body}"}}"#));
    assert!(run(&p, &mut env, &r(r#""abc""#, "x"), ok("plain")).reached_upstream());
    let quoted = r(r#""\"abc\"""#, "x");
    assert_eq!(run(&p, &mut env, &quoted, ok("quoted")), executed("quoted"));
    run(&p, &mut env, &quoted, ok("no")).assert_replays(b"quoted");
    run(&p, &mut env, &r(r#""abc""#, "x"), ok("no")).assert_replays(b"plain");
    // An integer is its decimal digits: `123` and `"123"` are one key (as they were),
    // so the second is that key reused with another body: 422, not a new execution.
    assert!(run(&p, &mut env, &r("123", "y"), ok("n")).reached_upstream());
    assert_eq!(
        run(&p, &mut env, &r(r#""123""#, "y"), ok("no")).status(),
        422
    );
    run(&p, &mut env, &r("123", "y"), ok("no")).assert_replays(b"n");
    // A header key is still unquoted (RFC 8941 string, as the IETF draft sends it).
    let h = |k: &str| req("POST", "/h").header("idempotency-key", k).body("same");
    assert!(run(&p, &mut env, &h("k1"), ok("h")).reached_upstream());
    run(&p, &mut env, &h(r#""k1""#), ok("no")).assert_replays(b"h");
}

#[test]
fn ordinary_json_string_keys_keep_their_record_digest() {
    // The record digest of a JSON key is over its bytes: unchanged for keys without
    // surrounding quotes, so records written before stay found.
    use crate::key::{json_key, record_digest, ClientKey, JsonKey, KeySource};
    let p = plugin(r#"{"key": {"json_pointer": "/id"}}"#);
    let cfg = &p.config.policy;
    let head = req("POST", "/m").head;
    let JsonKey::Found(k) = json_key(cfg, "/id", br#"{"id": "msg-1"}"#) else {
        panic!()
    };
    let want = ClientKey {
        source: KeySource::JsonPointer,
        value: b"msg-1".to_vec(),
    };
    assert_eq!(k, want);
    assert_eq!(
        record_digest(cfg, &head, &k),
        record_digest(cfg, &head, &want)
    );
    let JsonKey::Found(q) = json_key(cfg, "/id", br#"{"id": "\"msg-1\""}"#) else {
        panic!()
    };
    assert_eq!(q.value, br#""msg-1""#.to_vec());
}
