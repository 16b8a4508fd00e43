//! Property tests of every decoder of outside bytes: stored responses, etcd records and
//! answers (JSON gateway and gRPC), JSON pointers, the proxy-wasm pair encoding. Random bytes never panic, and
//! encoding then decoding gives back what was encoded. (Bucket records and the layouts
//! registry are private to `store`: their properties are in `store_props.rs`.)

use crate::jsonptr::{self, Target};
use crate::record::RecordState;
use crate::response::StoredResponse;
use crate::stores::etcd::wire::{self as etcd, EtcdAnswer, EtcdRecord};
use crate::wire;
use base64::Engine as _;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

/// The proptest configuration of this crate: `cases` unless `PROPTEST_CASES` says
/// otherwise, a fixed seed unless `PROPTEST_RNG_SEED` gives one (so `make test` runs the
/// same cases every time), and no regression files written into the source tree.
pub(crate) fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0x5eed_dedd);
    }
    c.failure_persistence = None;
    c
}

pub(crate) fn stored_response() -> impl Strategy<Value = StoredResponse> {
    (
        any::<u16>(),
        prop::collection::vec((".{0,12}", prop::collection::vec(any::<u8>(), 0..16)), 0..5),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(status, headers, body)| StoredResponse {
            status,
            headers,
            body,
        })
}

/// Every state an etcd record can be in.
fn etcd_record() -> impl Strategy<Value = EtcdRecord> {
    (
        proptest::sample::select(&RecordState::ALL[..]),
        any::<u64>(),
        any::<u64>(),
        any::<[u8; 32]>(),
        prop::option::of(stored_response()),
        stored_response(),
    )
        .prop_map(|(state, token, expires_ms, payload, response, fallback)| {
            // A completed record always carries its response.
            let response = match state {
                RecordState::Completed => Some(response.unwrap_or(fallback)),
                _ => response,
            };
            EtcdRecord {
                state,
                token,
                expires_ms,
                payload,
                response,
            }
        })
}

/// Any JSON document, small.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-c~/0-9+]{0,3}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-c~/0-9+]{0,3}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// What `jsonptr::find` should answer, from serde_json's own pointer lookup.
fn expected_target(v: Option<&serde_json::Value>) -> Target {
    use serde_json::Value;
    match v {
        None => Target::Missing,
        Some(Value::String(s)) => Target::Str(s.clone()),
        Some(Value::Number(n)) if n.is_f64() => Target::Other("a non-integer number"),
        Some(Value::Number(n)) => Target::Int(n.to_string()),
        Some(Value::Bool(_)) => Target::Other("a boolean"),
        Some(Value::Null) => Target::Other("null"),
        Some(Value::Object(_)) => Target::Other("an object"),
        Some(Value::Array(_)) => Target::Other("an array"),
    }
}

fn escape_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn stored_responses_round_trip_and_belong_to_their_owner(
        r in stored_response(),
        digest in any::<[u8; 32]>(),
        token in any::<u64>(),
        other in any::<[u8; 32]>(),
    ) {
        let bytes = r.encode(&digest, token);
        prop_assert_eq!(StoredResponse::decode(&bytes, &digest, token), Some(r.clone()));
        // Another record's slot, or a later claim of the same way, is never replayed.
        prop_assert_eq!(StoredResponse::decode(&bytes, &digest, token ^ 1), None);
        if other != digest {
            prop_assert_eq!(StoredResponse::decode(&bytes, &other, token), None);
        }
        // Every cut, and any byte more, is refused.
        for cut in 0..bytes.len() {
            prop_assert_eq!(StoredResponse::decode(&bytes[..cut], &digest, token), None);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(StoredResponse::decode(&longer, &digest, token), None);
    }

    #[test]
    fn stored_response_decoding_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        digest in any::<[u8; 32]>(),
        token in any::<u64>(),
    ) {
        let _ = StoredResponse::decode(&bytes, &digest, token);
        // The same bytes behind a valid owner prefix reach the header and body parsing.
        let mut owned = b"PDR1".to_vec();
        owned.extend_from_slice(&digest);
        owned.extend_from_slice(&token.to_be_bytes());
        owned.extend_from_slice(&bytes);
        if let Some(r) = StoredResponse::decode(&owned, &digest, token) {
            prop_assert_eq!(r.encode(&digest, token), owned);
        }
    }

    #[test]
    fn etcd_records_round_trip(rec in etcd_record(), digest in any::<[u8; 32]>()) {
        let bytes = rec.encode(&digest);
        prop_assert_eq!(EtcdRecord::decode(&bytes, &digest), Some(rec.clone()));
        for cut in 0..bytes.len() {
            let short = EtcdRecord::decode(&bytes[..cut], &digest);
            // A cut inside the response is refused; only cutting the whole response off
            // (at its first byte) leaves a valid record of a state that needs none.
            if short.is_some() {
                prop_assert_eq!(cut, 50);
                prop_assert!(rec.state != RecordState::Completed);
            }
        }
    }

    #[test]
    fn etcd_record_decoding_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..160),
        version_and_state in (0u8..3, 0u8..6),
        digest in any::<[u8; 32]>(),
    ) {
        let _ = EtcdRecord::decode(&bytes, &digest);
        // Random bytes behind a plausible version and state.
        let mut b = vec![version_and_state.0, version_and_state.1];
        b.extend_from_slice(&bytes);
        if let Some(r) = EtcdRecord::decode(&b, &digest) {
            prop_assert_eq!(b[0], 1);
            prop_assert_eq!(r.state as u8, b[1]);
            prop_assert!(r.state != RecordState::Completed || r.response.is_some());
            prop_assert_eq!(r.encode(&digest), b);
        }
    }

    #[test]
    fn etcd_answers_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        doc in json_value(),
    ) {
        let _ = etcd::parse_answer(&bytes);
        let _ = etcd::parse_answer(doc.to_string().as_bytes());
        // The same document in the places the parser looks.
        for wrapped in [
            serde_json::json!({"header": doc, "responses": [{"response_range": {"kvs": [doc]}}]}),
            serde_json::json!({"header": {}, "succeeded": doc, "responses": doc}),
            serde_json::json!({"ID": doc}),
            serde_json::json!({"error": doc, "code": doc}),
        ] {
            let _ = etcd::parse_answer(wrapped.to_string().as_bytes());
        }
    }

    #[test]
    fn etcd_answers_read_as_the_gateway_writes_them(
        succeeded in any::<bool>(),
        revision in 0i64..i64::MAX,
        existing in prop::option::of((1i64..i64::MAX, prop::collection::vec(any::<u8>(), 0..80))),
        numbers_as_strings in any::<bool>(),
        lease in 1i64..i64::MAX,
        code in 0i64..20,
        message in ".{0,20}",
    ) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let int = |n: i64| if numbers_as_strings {
            serde_json::Value::from(n.to_string())
        } else {
            serde_json::Value::from(n)
        };
        let kvs: Vec<serde_json::Value> = existing
            .iter()
            .map(|(m, v)| serde_json::json!({"key": "a2V5", "create_revision": int(1), "mod_revision": int(*m), "value": b64.encode(v)}))
            .collect();
        let mut txn = serde_json::json!({
            "header": {"revision": int(revision)},
            "responses": [{"response_range": {"header": {}, "kvs": kvs}}],
        });
        if succeeded {
            // grpc-gateway leaves out false booleans.
            txn["succeeded"] = serde_json::Value::Bool(true);
        }
        prop_assert_eq!(
            etcd::parse_answer(txn.to_string().as_bytes()),
            Some(EtcdAnswer::Txn { succeeded, revision, existing: existing.clone() })
        );
        let grant = serde_json::json!({"header": {}, "ID": int(lease), "TTL": "6"});
        prop_assert_eq!(
            etcd::parse_answer(grant.to_string().as_bytes()),
            Some(EtcdAnswer::Lease { id: lease })
        );
        let error = serde_json::json!({"error": message, "message": message, "code": code});
        prop_assert_eq!(
            etcd::parse_answer(error.to_string().as_bytes()),
            Some(EtcdAnswer::Error { code, message: message.clone() })
        );
    }

    #[test]
    fn etcd_grpc_answers_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        status in prop::sample::select(vec![0u16, 200, 503]),
        cut in any::<prop::sample::Index>(),
    ) {
        use crate::stores::etcd::pb as etcdpb;
        for path in [etcdpb::TXN, etcdpb::LEASE_GRANT, etcdpb::RANGE] {
            let _ = etcd::read_answer(path, status, &bytes);
            let _ = etcd::read_count(path, status, &bytes);
            let _ = etcd::read_one(path, status, &bytes);
        }
        let _ = etcdpb::status(&bytes);
        let _ = etcdpb::range_read(&bytes);
        // A well-formed answer cut anywhere, or with bytes appended: never a panic.
        let kv = etcdpb::testing::kv(b"k", 1, 2, &bytes, 3);
        let range = etcdpb::testing::range_response(2, &[kv], 1);
        // A read's answer decodes to the kv it carries; cut anywhere, no panic.
        prop_assert_eq!(etcdpb::range_read(&range), Some(Some((2, bytes.clone()))));
        let _ = etcdpb::range_read(&range[..cut.index(range.len() + 1)]);
        let mut t = etcdpb::testing::txn_response(5, false, &[(1, range)]);
        let at = cut.index(t.len() + 1);
        let _ = etcdpb::txn_response(&t[..at]);
        t.extend_from_slice(&bytes);
        let _ = etcdpb::txn_response(&t);
    }

    #[test]
    fn etcd_grpc_answers_read_as_etcd_writes_them(
        succeeded in any::<bool>(),
        revision in 0i64..i64::MAX,
        existing in prop::option::of((1i64..i64::MAX, prop::collection::vec(any::<u8>(), 0..80))),
        lease in 1i64..i64::MAX,
        code in 1u32..17,
        message in ".{0,20}",
        count in 0i64..i64::MAX,
    ) {
        use crate::stores::etcd::pb::{self as etcdpb, testing as pb};
        let ops = match &existing {
            Some((m, v)) => vec![(1, pb::range_response(revision, &[pb::kv(b"key", 1, *m, v, lease)], 1))],
            None => vec![(1, pb::range_response(revision, &[], 0))],
        };
        let txn = pb::txn_response(revision, succeeded, &ops);
        prop_assert_eq!(
            etcd::read_answer(etcdpb::TXN, 200, &txn),
            Some(EtcdAnswer::Txn { succeeded, revision, existing: existing.clone() })
        );
        prop_assert_eq!(
            etcd::read_answer(etcdpb::LEASE_GRANT, 200, &pb::lease_response(revision, lease, 6)),
            Some(EtcdAnswer::Lease { id: lease })
        );
        prop_assert_eq!(
            etcd::read_answer(etcdpb::TXN, 0, &etcdpb::status_body(code, message.as_bytes())),
            Some(EtcdAnswer::Error { code: i64::from(code), message: message.clone() })
        );
        prop_assert_eq!(
            etcd::read_count(etcdpb::RANGE, 200, &pb::range_response(revision, &[], count)),
            Some(count as u64)
        );
    }

    #[test]
    fn json_pointer_search_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..120),
        pointer in "(/[a-c~01+]{0,3}){0,4}",
    ) {
        let _ = jsonptr::find(&bytes, &pointer);
    }

    #[test]
    fn json_pointer_search_agrees_with_serde_json(
        doc in json_value(),
        tokens in prop::collection::vec("[a-c~/0-9+]{0,3}", 0..4),
        pick in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4), 0..4),
    ) {
        // Mostly follow members and indexes the document has, so the pointer leads
        // somewhere; otherwise use the random tokens.
        let mut path = Vec::new();
        let mut at = Some(&doc);
        for (i, token) in tokens.iter().enumerate() {
            let chosen = match (at, pick.get(i)) {
                (Some(serde_json::Value::Object(m)), Some((ix, _))) if !m.is_empty() => {
                    m.keys().nth(ix.index(m.len())).cloned().unwrap_or_default()
                }
                // An index as RFC 6901 writes it, or with a sign or a leading zero
                // (which name no element).
                (Some(serde_json::Value::Array(a)), Some((ix, form))) if !a.is_empty() => {
                    let i = ix.index(a.len());
                    match form {
                        0 => format!("+{i}"),
                        1 => format!("0{i}"),
                        _ => i.to_string(),
                    }
                }
                _ => token.clone(),
            };
            at = at.and_then(|v| match v {
                serde_json::Value::Object(m) => m.get(&chosen),
                serde_json::Value::Array(a) => (chosen == "0" || !chosen.starts_with('0'))
                    .then(|| chosen.bytes().all(|b| b.is_ascii_digit()).then(|| chosen.parse::<usize>().ok()))
                    .flatten()
                    .flatten()
                    .and_then(|i| a.get(i)),
                _ => None,
            });
            path.push(chosen);
        }
        let pointer: String = path.iter().map(|t| format!("/{}", escape_token(t))).collect();
        let body = doc.to_string();
        let want = expected_target(doc.pointer(&pointer));
        prop_assert_eq!(jsonptr::find(body.as_bytes(), &pointer), Ok(want), "pointer {:?} in {}", pointer, body);
    }

    #[test]
    fn header_pairs_round_trip_and_random_bytes_never_panic(
        pairs in prop::collection::vec((".{0,10}", prop::collection::vec(any::<u8>(), 0..12)), 0..6),
        bytes in prop::collection::vec(any::<u8>(), 0..120),
    ) {
        prop_assert_eq!(wire::decode_pairs(&wire::encode_pairs(&pairs)), Some(pairs));
        let _ = wire::decode_pairs(&bytes);
        // A count that promises more than the bytes hold is refused, not trusted.
        let mut lying = (u32::MAX).to_le_bytes().to_vec();
        lying.extend_from_slice(&bytes);
        prop_assert_eq!(wire::decode_pairs(&lying), None);
    }
}
