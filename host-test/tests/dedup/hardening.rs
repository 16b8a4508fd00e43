//! The filter against hostile inputs in host-test: bucket aiming, memory under many
//! large pending bodies.

use super::{envoy_with, keyed, Upstream, R};
use host_test::Request;
use std::collections::BTreeSet;

/// The bucket keys a run of keys writes to.
fn buckets_written(seed: u64) -> Result<BTreeSet<String>, Box<dyn std::error::Error>> {
    let up = Upstream::default();
    let mut e = envoy_with(r#"{"capacity": 16000}"#, 2, &up)
        .random_seed(seed)
        .build()?;
    for i in 0..20 {
        e.request(i % 2, keyed("/o", &format!("key-{i}"), "{}"))?;
    }
    let secret = e.shared_data("proxy-dedup/secret").map(|(v, _)| v.len());
    assert_eq!(secret, Some(32), "one 32-byte secret per process");
    Ok(e.shared_data_keys()
        .into_iter()
        .filter(|k| k.contains("/b/"))
        .collect())
}

#[test]
fn buckets_are_chosen_by_a_per_process_secret() -> R {
    // Same keys, same configuration, two Envoy processes (different random sources):
    // the keys land in other buckets, so nobody can compute a key's bucket from the
    // key alone and aim a flood of keys at one victim's bucket.
    let one = buckets_written(1)?;
    let again = buckets_written(1)?;
    let other = buckets_written(2)?;
    assert_eq!(one, again, "deterministic for one random source");
    assert!(one.len() >= 15, "{one:?}");
    assert!(
        one.intersection(&other).count() <= 2,
        "{one:?} vs {other:?}"
    );
    Ok(())
}

#[test]
fn many_large_pending_json_bodies_do_not_grow_the_vm() -> R {
    // JSON-pointer keys: the body is read once, when complete, and scanned without
    // building the document. 32 streams each holding 1 MiB pending must not cost
    // 32 MiB inside the VM (Envoy buffers them, not the filter).
    let up = Upstream::default();
    let config = r#"{"key": {"json_pointer": "/id", "required": true}, "max_body_bytes": 1100000}"#;
    let mut e = envoy_with(config, 1, &up).buffer_limit(2 << 20).build()?;
    e.request(0, Request::post("/warm").body(r#"{"id": "warm"}"#))?;
    let before = e.memory_bytes(0);
    let pad = "x".repeat(64 * 1024);
    let mut streams = Vec::new();
    for i in 0..32 {
        let mut chunks = vec![format!(r#"{{"id": "big-{i}", "pad": ["#)];
        for _ in 0..16 {
            chunks.push(format!("\"{pad}\","));
        }
        chunks.push("\"end\"]}".to_string());
        let id = e.start(0, Request::post("/big").chunks(chunks))?;
        e.send_headers(id)?;
        for _ in 0..17 {
            e.send_chunk(id)?;
        }
        streams.push(id);
    }
    let pending = e.memory_bytes(0);
    assert!(
        pending < before + (4 << 20),
        "32 pending 1 MiB bodies grew the VM from {before} to {pending} bytes"
    );
    for id in streams {
        e.send_chunk(id)?;
        assert!(e.upstream_request(id).is_some(), "decided at the end");
    }
    let after = e.memory_bytes(0);
    assert!(
        after < before + (8 << 20),
        "deciding 32 bodies one by one grew the VM from {before} to {after} bytes"
    );
    // A hostile body: nesting deeper than the parser allows is not JSON, never a trap.
    let deep = "[".repeat(200_000);
    let r = e.request(0, Request::post("/deep").body(deep))?;
    assert_eq!(r.status, 400);
    assert!(!e.worker_failed(0));
    Ok(())
}
