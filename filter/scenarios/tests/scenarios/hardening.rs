//! The filter against hostile inputs in host-test: bucket aiming, memory under many
//! large pending bodies, stored responses within `store.max_store_bytes`.

use super::{envoy_with, filter_with, keyed, problem_type, Upstream, R};
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

#[test]
fn stored_responses_stay_within_max_store_bytes_and_no_key_runs_twice() -> R {
    // 64 buckets with 16 KiB each: two 6 KB responses fit in a bucket. 200 keys give
    // every bucket about three, so older bodies are dropped as newer ones come.
    let calls = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let seen = calls.clone();
    let config = r#"{"capacity": 1024, "store": {"max_store_bytes": 1048576}}"#;
    let mut e = filter_with(config, 2)
        .upstream(move |req| {
            seen.set(seen.get() + 1);
            let tag = req.body.first().copied().unwrap_or(b'?');
            host_test::Reply::new(201).body(vec![tag; 6_000])
        })
        .build()?;
    let stored = |e: &host_test::SimEnvoy| -> usize {
        e.shared_data_keys()
            .iter()
            .filter(|k| k.contains("/r/"))
            .map(|k| e.shared_data(k).map_or(0, |(v, _)| v.len()))
            .sum()
    };
    let body = |i: usize| format!("{}", i % 10);
    for i in 0..200 {
        let r = e.request(i % 2, keyed("/o", &format!("key-{i}"), &body(i)))?;
        assert_eq!(r.status, 201);
        assert!(stored(&e) <= 1 << 20, "after key {i}: {} bytes", stored(&e));
    }
    assert_eq!(calls.get(), 200);
    let dropped = e.counter("proxy_dedup_bodies_dropped").unwrap_or(0);
    assert!(dropped > 0, "the budget was reached");
    assert_eq!(e.counter("proxy_dedup_evictions_unexpired"), Some(0));
    // Every key is answered from the store: its body when kept, else 409.
    let (mut replayed, mut not_stored) = (0, 0);
    for i in 0..200 {
        let r = e.request(i % 2, keyed("/o", &format!("key-{i}"), &body(i)))?;
        assert!(!r.upstream_called, "key-{i} ran twice");
        match r.status {
            201 => {
                assert_eq!(r.body.len(), 6_000);
                assert_eq!(r.body[0], body(i).as_bytes()[0]);
                replayed += 1;
            }
            409 => {
                assert_eq!(
                    problem_type(&r.body),
                    "urn:proxy-dedup:problem:response-not-stored"
                );
                not_stored += 1;
            }
            s => panic!("key-{i}: {s}"),
        }
    }
    assert_eq!(calls.get(), 200);
    assert_eq!(not_stored as u64, dropped, "every dropped body answers 409");
    assert!(replayed <= 64 * 2, "{replayed} bodies kept");
    // The last key completed is always kept.
    assert_eq!(
        e.request(0, keyed("/o", "key-199", &body(199)))?.status,
        201
    );
    Ok(())
}
