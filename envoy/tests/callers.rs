//! Callers in a real Envoy, every default left as it is: a stored response goes back
//! only to the caller who made it (`principal`, by default the `authorization`
//! header), a keyless request of another caller is its own operation, a credential
//! refresh never runs a key twice, and `x-request-id` as the key behaves as the classic
//! middleware or the configuration is refused, naming Envoy's settings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::paths::config_file;
use dedup_envoy::{EnvoyConfig, Request};
use serde_json::json;

fn order(key: &str, auth: &str) -> Request {
    post("/orders", key, &json!({"item": "book", "qty": 1})).header("authorization", auth)
}

#[test]
fn another_callers_duplicate_never_gets_the_first_callers_response() {
    let s = Stack::start("callers-keyed", "{}");
    let alice = order("k-shared", "Bearer alice-token");
    let first = s.send(&alice);
    assert_executed(&first);
    let mallory = s.send(&order("k-shared", "Bearer mallory-token"));
    assert_problem(&mallory, 422, "principal-mismatch");
    assert_ne!(mallory.body, first.body);
    assert!(
        mallory.header("x-order-id").is_none(),
        "{}",
        mallory.summary()
    );
    // No credentials at all is another caller too.
    let anonymous = s.send(&post(
        "/orders",
        "k-shared",
        &json!({"item": "book", "qty": 1}),
    ));
    assert_problem(&anonymous, 422, "principal-mismatch");
    // Alice's own retry is still her replay.
    assert_replay_of(&s.send(&alice), &first);
    assert_eq!(s.executions("/orders"), 1);
    assert_eq!(s.counter("principal_mismatch"), 2);
}

#[test]
fn a_refreshed_bearer_token_never_runs_the_key_twice() {
    let s = Stack::start("callers-refresh", "{}");
    assert_executed(&s.send(&order("k-pay", "Bearer token-before-refresh")));
    let retry = s.send(&order("k-pay", "Bearer token-after-refresh"));
    assert_problem(&retry, 422, "principal-mismatch");
    assert!(
        json(&retry)["detail"]
            .as_str()
            .unwrap()
            .contains("refreshed token"),
        "{}",
        retry.summary()
    );
    assert!(retry.header("idempotency-expires").is_some());
    assert_eq!(s.executions("/orders"), 1, "the refreshed retry ran again");
}

#[test]
fn another_callers_identical_keyless_request_is_its_own_operation() {
    let s = Stack::start(
        "callers-keyless",
        r#"{"key": {"fingerprint": ["method", "path", "body"]}}"#,
    );
    let checkout = |auth: &str| {
        Request::post("/cart/checkout")
            .header("authorization", auth)
            .json(&json!({}))
    };
    let bob = s.send(&checkout("Bearer bob"));
    assert_executed(&bob);
    let carol = s.send(&checkout("Bearer carol"));
    assert_executed(&carol);
    assert_eq!(s.executions("/cart/checkout"), 2, "Carol's checkout ran");
    assert_replay_of(&s.send(&checkout("Bearer bob")), &bob);
    assert_replay_of(&s.send(&checkout("Bearer carol")), &carol);
    assert_eq!(s.executions("/cart/checkout"), 2);
}

/// The JWT template takes the caller from the verified token's `sub`
/// (`payload_in_metadata`), so a refreshed token of the same subject is replayed and
/// another subject is refused.
#[test]
fn a_refreshed_token_of_the_same_subject_is_replayed_through_jwt_metadata() {
    let s = Stack::start_with("callers-jwt", |port, wasm| {
        EnvoyConfig::from_template(&config_file("jwt-scope.yaml"), port, wasm, &jwt_recipe())
            .unwrap()
    });
    let (key, kid) = example_jwt_key();
    let token = |sub: &str, iat_shift: u64| {
        let mut c = example_jwt_claims(Some("tenant-a"));
        c["sub"] = json!(sub);
        c["iat"] = json!(c["iat"].as_u64().unwrap() - iat_shift);
        c["jti"] = json!(format!("{sub}-{iat_shift}"));
        jwt_hs256(&key, &kid, &c)
    };
    let pay = |tok: &str| {
        post("/orders/jwt", "k-jwt", &json!({"amount": 5}))
            .header("authorization", &format!("Bearer {tok}"))
    };
    let first = s.send(&pay(&token("user-1", 0)));
    assert_executed(&first);
    let refreshed = token("user-1", 30);
    assert_ne!(refreshed, token("user-1", 0));
    assert_replay_of(&s.send(&pay(&refreshed)), &first);
    // Another subject of the same tenant: refused, never served the first's response.
    let other = s.send(&pay(&token("user-2", 0)));
    assert_problem(&other, 422, "principal-mismatch");
    assert_eq!(s.executions("/orders/jwt"), 1);
}

/// The single-node template with the connection manager's request-id settings that
/// `request_id_preserved` asserts (and `dedupctl envoy-filter` prints), and with
/// `use_remote_address: true`: the edge proxy of the classic setup.
/// Loopback clients count as outside ones here (`internal_address_config` names another
/// range), as a real edge's clients do.
fn request_id_stack(name: &str, filter: &str, preserve: bool) -> Stack {
    let template = std::fs::read_to_string(config_file("single-node.yaml")).unwrap();
    let keep = if preserve {
        "\n          preserve_external_request_id: true\n          generate_request_id: false"
    } else {
        ""
    };
    let settings = format!(
        "stat_prefix: ingress_http\n          use_remote_address: true\n          \
         internal_address_config: {{ cidr_ranges: [{{ address_prefix: 192.0.2.1, prefix_len: 32 }}] }}{keep}"
    );
    assert!(template.contains("stat_prefix: ingress_http"));
    let edited = template.replacen("stat_prefix: ingress_http", &settings, 1);
    let dir = std::env::temp_dir().join(format!("proxy-dedup-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("single-node-request-id.yaml");
    std::fs::write(&path, edited).unwrap();
    let filter = filter.to_string();
    Stack::start_with(name, move |port, wasm| {
        EnvoyConfig::from_template(&path, port, wasm, &filter).unwrap()
    })
}

#[test]
fn x_request_id_as_the_key_is_refused_unless_envoy_keeps_the_clients() {
    assert_refused_naming_the_field(
        "callers-request-id-refused",
        &[
            (
                r#"{"key": {"headers": ["x-request-id"], "required": true}}"#,
                "key.headers",
            ),
            (
                r#"{"key": {"headers": ["x-forwarded-for"]}}"#,
                "key.headers",
            ),
        ],
    );
}

#[test]
fn x_request_id_as_the_key_behaves_as_the_middleware_behind_an_edge_envoy() {
    let s = request_id_stack("callers-request-id", REQUEST_ID_KEY, true);
    // No id from the client: 400, nothing ran (Envoy generated none).
    let missing = s.send(&Request::post("/orders").json(&json!({"qty": 1})));
    assert_problem(&missing, 400, "missing-key");
    assert_eq!(s.executions("/orders"), 0);
    // The same id twice from an outside client: one execution, then its replay.
    let req = Request::post("/orders")
        .header("x-request-id", "2f1c7d0e-seed-002")
        .json(&json!({"qty": 1}));
    let first = s.send(&req);
    assert_executed(&first);
    assert_replay_of(&s.send(&req), &first);
    assert_eq!(s.executions("/orders"), 1);
}

const REQUEST_ID_KEY: &str =
    r#"{"request_id_preserved": true, "key": {"headers": ["x-request-id"], "required": true}}"#;

/// The control: an edge Envoy with the connection manager's defaults replaces the
/// client's id before the filter sees it, so the same id runs twice. This is what
/// `request_id_preserved: true` asserts is not the case; the test above can fail.
#[test]
fn without_preserve_external_request_id_an_edge_envoy_replaces_the_clients_id() {
    let s = request_id_stack("callers-request-id-replaced", REQUEST_ID_KEY, false);
    let req = Request::post("/orders")
        .header("x-request-id", "2f1c7d0e-seed-002")
        .json(&json!({"qty": 1}));
    assert_executed(&s.send(&req));
    assert_executed(&s.send(&req));
    assert_eq!(s.executions("/orders"), 2);
}
