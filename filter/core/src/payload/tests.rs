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
        ..RequestHead::default()
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
    let parts = |p: Vec<FingerprintPart>| PayloadConfig {
        parts: Some(p),
        json: JsonSelection::Raw,
    };
    let only_body = parts(vec![FingerprintPart::Body]);
    let with_query = parts(vec![FingerprintPart::Path, FingerprintPart::Query]);
    // The default is the v1 check: method, path with query, raw body.
    let default = PayloadConfig::default();
    // (config, two requests as "method path body", whether their digests are equal)
    let cases = [
        (&only_body, "POST /a?x=1 b", "PUT /b b", true),
        (&with_query, "POST /a?x=1 b", "POST /a?x=2 b", false),
        (&with_query, "POST /a?x=1 b", "POST /a?x=1 c", true),
        (&default, "POST /a?x=1 b", "POST /a?x=2 b", false),
        (&default, "POST /a b", "PATCH /a b", false),
    ];
    let digest_of = |cfg, r: &str| {
        let [m, p, b]: [&str; 3] = r.split(' ').collect::<Vec<_>>().try_into().unwrap();
        digest(cfg, m, p, b)
    };
    for (cfg, r1, r2, same) in cases {
        assert_eq!(
            digest_of(cfg, r1) == digest_of(cfg, r2),
            same,
            "{r1} vs {r2}"
        );
    }
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
    assert!(run(&p, &mut env, &first, ok("made")).reached_upstream());
    // Only the ignored element and member differ: the same payload.
    let same = r(r#"{"items": [9, 2], "meta": {"at": 2}}"#);
    run(&p, &mut env, &same, ok("no")).assert_replays(b"made");
    // Another element differs: another payload.
    let other = r(r#"{"items": [1, 3], "meta": {"at": 1}}"#);
    assert_eq!(run(&p, &mut env, &other, ok("no")).status(), 422);
    // A pointer one past the end of the array removes nothing.
    let p2 = plugin(
        r#"{"payload": {"ignore_json_pointers": ["/items/2"]}, "store": {"namespace": "two"}}"#,
    );
    let two = r(r#"{"items": [1, 2]}"#);
    assert!(run(&p2, &mut env, &two, ok("two")).reached_upstream());
    assert_eq!(
        run(&p2, &mut env, &r(r#"{"items": [1, 3]}"#), ok("no")).status(),
        422
    );
}
