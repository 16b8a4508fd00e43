//! Tests of the payload check: its digest format and the JSON pointers it ignores.

use super::*;
use crate::key::BodyHasher;
use crate::key::{Digest, RequestHead};
use crate::testing::*;

fn digest(cfg: &PayloadConfig, method: &str, path: &str, body: &str) -> Digest {
    let head = RequestHead {
        method: method.into(),
        path: path.into(),
        authority: "h".into(),
        headers: vec![("x-attempt".into(), "1".into())],
    };
    let mut hasher = BodyHasher::default();
    hasher.update(body.as_bytes());
    payload_digest(cfg, &head, &hasher.finish(), body.as_bytes())
}

#[test]
fn ignored_fields_key_order_and_whitespace_do_not_count() {
    let cfg = PayloadConfig {
        parts: None,
        json: JsonSelection::Ignore(vec!["/deliveryAttempt".into(), "/meta/ts".into()]),
    };
    let first = r#"{"message": {"data": "aGk=", "messageId": "1"}, "deliveryAttempt": 1, "meta": {"ts": 5, "src": "a"}}"#;
    let again = r#"{ "deliveryAttempt": 7, "meta": {"src": "a", "ts": 9},
                     "message": {"messageId": "1", "data": "aGk="} }"#;
    let changed = r#"{"message": {"data": "Ynll", "messageId": "1"}, "deliveryAttempt": 2, "meta": {"ts": 5, "src": "a"}}"#;
    let d = |b| digest(&cfg, "POST", "/push", b);
    assert_eq!(d(first), d(again));
    assert_ne!(d(first), d(changed));
    // A body that is not JSON is compared as it is.
    assert_eq!(d("plain"), d("plain"));
    assert_ne!(d("plain"), d("plain!"));
}

#[test]
fn only_selected_fields_count_and_absent_differs_from_null() {
    let cfg = PayloadConfig {
        parts: None,
        json: JsonSelection::Only(vec!["/message/data".into(), "/a/0".into()]),
    };
    let d = |b| digest(&cfg, "POST", "/push", b);
    assert_eq!(
        d(r#"{"message": {"data": "x", "n": 1}, "a": [1, 2]}"#),
        d(r#"{"a": [1, 3], "message": {"n": 2, "data": "x"}}"#)
    );
    assert_ne!(
        d(r#"{"message": {"data": "x"}}"#),
        d(r#"{"message": {"data": "y"}}"#)
    );
    assert_ne!(d(r#"{"message": {}}"#), d(r#"{"message": {"data": null}}"#));
}

#[test]
fn parts_choose_what_counts() {
    let only_body = PayloadConfig {
        parts: Some(vec![FingerprintPart::Body]),
        json: JsonSelection::Raw,
    };
    assert_eq!(
        digest(&only_body, "POST", "/a?x=1", "b"),
        digest(&only_body, "PUT", "/b", "b")
    );
    let with_query = PayloadConfig {
        parts: Some(vec![FingerprintPart::Path, FingerprintPart::Query]),
        json: JsonSelection::Raw,
    };
    assert_ne!(
        digest(&with_query, "POST", "/a?x=1", "b"),
        digest(&with_query, "POST", "/a?x=2", "b")
    );
    assert_eq!(
        digest(&with_query, "POST", "/a?x=1", "b"),
        digest(&with_query, "POST", "/a?x=1", "c")
    );
    // The default is the v1 check: method, path with query, raw body.
    let default = PayloadConfig::default();
    assert_ne!(
        digest(&default, "POST", "/a?x=1", "b"),
        digest(&default, "POST", "/a?x=2", "b")
    );
    assert_ne!(
        digest(&default, "POST", "/a", "b"),
        digest(&default, "PATCH", "/a", "b")
    );
}

#[test]
fn the_default_payload_digest_format_is_pinned() {
    // SHA-256 over method, path with query, and the body's length and BLAKE3 digest.
    // A change here is a new record format: bump `key::RECORD_DIGEST_VERSION`.
    use sha2::{Digest as _, Sha256};
    let head = req("POST", "/o?x=1").head;
    let mut hasher = crate::key::BodyHasher::default();
    hasher.update(b"{");
    hasher.update(b"}");
    let body = hasher.finish();
    assert_eq!(body.digest, *blake3::hash(b"{}").as_bytes());
    assert_eq!(body.len, 2);
    let mut h = Sha256::new();
    h.update(b"proxy-dedup payload v1\0");
    for part in [&b"POST"[..], &b"/o?x=1"[..]] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(2u64.to_be_bytes());
    h.update(body.digest);
    let want: [u8; 32] = h.finalize().into();
    let cfg = crate::payload::PayloadConfig::default();
    assert_eq!(
        crate::payload::payload_digest(&cfg, &head, &body, b"{}"),
        want
    );
}

#[test]
fn ignored_array_elements_do_not_count_in_the_payload() {
    let p =
        plugin(r#"{"payload": {"ignore_json_pointers": ["/items/0", "/items/5", "/meta/at"]}}"#);
    let (_, mut env) = world();
    let r = |body: &str| req("POST", "/o").key("k").body(body);
    let first = r(r#"{"items": [1, 2], "meta": {"at": 1}}"#);
    assert!(matches!(
        run(&p, &mut env, &first, ok("made")),
        Outcome::Upstream(..)
    ));
    // Only the ignored element and member differ: the same payload.
    let same = r(r#"{"items": [9, 2], "meta": {"at": 2}}"#);
    assert_eq!(run(&p, &mut env, &same, ok("no")).local().body, b"made");
    // Another element differs: another payload.
    let other = r(r#"{"items": [1, 3], "meta": {"at": 1}}"#);
    assert_eq!(run(&p, &mut env, &other, ok("no")).status(), 422);
    // A pointer one past the end of the array removes nothing.
    let p2 = plugin(
        r#"{"payload": {"ignore_json_pointers": ["/items/2"]}, "store": {"namespace": "two"}}"#,
    );
    let two = r(r#"{"items": [1, 2]}"#);
    assert!(matches!(
        run(&p2, &mut env, &two, ok("two")),
        Outcome::Upstream(..)
    ));
    assert_eq!(
        run(&p2, &mut env, &r(r#"{"items": [1, 3]}"#), ok("no")).status(),
        422
    );
}
