//! gRPC calls of a filter (the ABI probe) against an in-process handler and
//! against real etcd's gRPC port (Go's HTTP/2 and HPACK on the other side).
//! What Envoy does in each case is checked by envoy/tests/probe_differential.rs.

use dedup_envoy::etcd::EtcdCluster;
use host_test::{grpc_status, GrpcReply, Request, SimEnvoy};
use std::time::Duration;

fn abi(builder: impl FnOnce(host_test::EnvoyBuilder) -> host_test::EnvoyBuilder) -> SimEnvoy {
    builder(SimEnvoy::builder(host_test::dist("abi_probe.wasm")).vm_id("abi"))
        .build()
        .unwrap()
}

fn call(envoy: &mut SimEnvoy, headers: &[(&str, &str)]) -> String {
    let mut req = Request::get("/").header("x-abi", "grpc-call");
    for (k, v) in headers {
        req = req.header(k, v);
    }
    envoy.request(0, req).unwrap().body_str()
}

#[test]
fn unary_calls_to_an_in_process_handler() {
    let mut envoy = abi(|b| {
        b.grpc_cluster("auth", |req| match req.method.as_str() {
            "Check" => GrpcReply::ok([b"ok:", req.message()].concat()),
            _ => GrpcReply::status(grpc_status::PERMISSION_DENIED, "no"),
        })
    });
    let body = call(
        &mut envoy,
        &[
            ("x-cluster", "auth"),
            ("x-method", "Check"),
            ("x-message", "m"),
        ],
    );
    assert_eq!(
        body,
        "grpc_receive size=4 buffer_status=0 message=6f6b3a6d\n"
    );
    let body = call(&mut envoy, &[("x-cluster", "auth"), ("x-method", "Other")]);
    assert_eq!(
        body,
        "grpc_close status=7 get_status=0/7/no{via_upstream}\n"
    );
    // Delivered on the root context, with Envoy's tokens.
    assert!(
        envoy.log_contains("ctx=1 token=5 owner=2"),
        "{:?}",
        envoy.logs()
    );
    let body = call(&mut envoy, &[("x-cluster", "nope")]);
    assert_eq!(body, "dispatch=4\n", "ParseFailure for an unknown cluster");
}

/// One real etcd member (dedup-envoy's launcher, stopped on drop) and its client address.
fn etcd() -> (EtcdCluster, String) {
    let cluster = EtcdCluster::start("host-test-grpc-etcd", 1).unwrap();
    let client = cluster.members[0].client_addr().to_string();
    (cluster, client)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn unary_calls_to_real_etcd_over_http2() {
    let (_etcd, client) = etcd();
    let mut envoy = abi(|b| b.grpc_cluster_addr("etcd", &client));
    // PutRequest { key: "k", value: "v1" }, then RangeRequest { key: "k" }.
    let put = [&[0x0a, 1, b'k', 0x12, 2][..], b"v1"].concat();
    let mut body = String::new();
    for _ in 0..50 {
        body = call(
            &mut envoy,
            &[
                ("x-cluster", "etcd"),
                ("x-service", "etcdserverpb.KV"),
                ("x-method", "Put"),
                ("x-message-hex", &hex(&put)),
            ],
        );
        if body.starts_with("grpc_receive") {
            break;
        }
        // etcd serves before it has a leader: retry briefly.
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(body.starts_with("grpc_receive"), "{body}");
    let body = call(
        &mut envoy,
        &[
            ("x-cluster", "etcd"),
            ("x-service", "etcdserverpb.KV"),
            ("x-method", "Range"),
            ("x-message-hex", &hex(&[0x0a, 1, b'k'])),
        ],
    );
    // The RangeResponse holds the key-value: key "k", value "v1".
    assert!(body.starts_with("grpc_receive"), "{body}");
    assert!(
        body.contains(&hex(b"\x0a\x01k")) && body.contains(&hex(b"v1")),
        "{body}"
    );
    // An unknown method: etcd's own status and message.
    let body = call(
        &mut envoy,
        &[
            ("x-cluster", "etcd"),
            ("x-service", "etcdserverpb.KV"),
            ("x-method", "Nope"),
        ],
    );
    assert!(body.starts_with("grpc_close status=12"), "{body}");
}
