//! Tests of the payload check: its digest format and the JSON pointers it ignores.

use super::*;
use crate::key::BodyHasher;
use crate::key::{Digest, RequestHead};
use crate::metrics::Counter;
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
    payload_digest(cfg, &head, &hasher.finish(), body.as_bytes()).unwrap()
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
        Ok(want)
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

/// A push endpoint's config: the key in a header, `deliveryAttempt` ignored.
fn push_plugin() -> crate::stream::Plugin {
    plugin(r#"{"payload": {"ignore_json_pointers": ["/deliveryAttempt"]}}"#)
}

#[test]
fn numbers_beyond_f64_precision_are_other_payloads() {
    // Issue 21: through f64 these were one payload, and the second got the first's reply.
    let p = push_plugin();
    let (_, mut env) = world();
    for (key, first, second) in [
        ("big", "12345678901234567890123", "12345678901234567890124"),
        ("long", "1.000000000000000001", "1.000000000000000002"),
        ("u64", "18446744073709551615", "18446744073709551614"),
    ] {
        let r = |n: &str| {
            req("POST", "/pay")
                .key(key)
                .body(&format!(r#"{{"amount": {n}, "deliveryAttempt": 1}}"#))
        };
        assert!(run(&p, &mut env, &r(first), ok("paid")).reached_upstream());
        assert_eq!(
            run(&p, &mut env, &r(second), ok("no")).status(),
            422,
            "{key}"
        );
        run(&p, &mut env, &r(first), ok("no")).assert_replays(b"paid");
    }
}

#[test]
fn one_number_spelled_another_way_is_the_same_payload() {
    let p = push_plugin();
    let (_, mut env) = world();
    let r = |n: &str, attempt: u32| {
        req("POST", "/pay").key("k").body(&format!(
            r#"{{"amount": {n}, "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert!(run(&p, &mut env, &r("1.0", 1), ok("paid")).reached_upstream());
    for same in ["1", "1e0", "10e-1", "0.1E1", "1.000"] {
        run(&p, &mut env, &r(same, 2), ok("no")).assert_replays(b"paid");
    }
    assert_eq!(run(&p, &mut env, &r("1.01", 3), ok("no")).status(), 422);
}

#[test]
fn a_member_named_twice_is_an_ambiguous_payload() {
    let p = push_plugin();
    let (_, mut env) = world();
    let first = req("POST", "/pay").key("k").body(r#"{"amount": 5}"#);
    assert!(run(&p, &mut env, &first, ok("five")).reached_upstream());
    for (i, body) in [
        r#"{"amount": 5000, "amount": 5}"#,
        r#"{"amount": 5, "\u0061mount": 5}"#,
        r#"{"order": {"lines": [{"sku": "a", "qty": 1, "qty": 100}]}, "amount": 5}"#,
    ]
    .into_iter()
    .enumerate()
    {
        // Never the stored "five", never the upstream: a 400 the client can fix.
        let bad_before = env.count_of(Counter::BadKey);
        let o = run(
            &p,
            &mut env,
            &req("POST", "/pay").key("k").body(body),
            ok("no"),
        );
        assert_eq!(o.status(), 400, "{body}");
        assert_eq!(
            o.problem_type(),
            "urn:proxy-dedup:problem:ambiguous-payload"
        );
        assert_eq!(o.local().details, "proxy_dedup_ambiguous_payload");
        assert!(detail(o.local()).contains("twice"), "{}", detail(o.local()));
        assert_eq!(env.count_of(Counter::BadKey), bad_before + 1, "case {i}");
        // Nor does it claim a fresh key.
        let fresh = req("POST", "/pay").key(&format!("fresh{i}")).body(body);
        assert_eq!(run(&p, &mut env, &fresh, ok("no")).status(), 400);
    }
    // Logged as a bad_key decision, without a record, like the other 400s.
    let r = req("POST", "/pay").key("k").body(r#"{"a": 1, "a": 1}"#);
    let mut s = crate::stream::DedupStream::new(9);
    let action = s.on_request_headers(&p, &mut env, r.head.clone(), false);
    assert_eq!(action, crate::Decision::Pause);
    let body = r.body.clone().unwrap();
    let action = s.on_request_body(&p, &mut env, body.len(), true, || Some(body.clone()));
    assert!(matches!(action, crate::Decision::Reply(ref l) if l.status == 400));
    let (verdict, record) = s.log_fields().unwrap();
    assert_eq!(verdict, "bad_key");
    assert!(record.is_none());
    // The raw comparison (no JSON selection) is exact: nothing to refuse there.
    let raw = plugin(r#"{"store": {"namespace": "raw"}}"#);
    let dup = req("POST", "/pay")
        .key("k")
        .body(r#"{"amount": 5000, "amount": 5}"#);
    assert!(run(&raw, &mut env, &dup, ok("raw")).reached_upstream());
}

#[test]
fn a_lone_surrogate_redelivered_with_a_new_attempt_is_the_same_payload() {
    // serde_json refused `\ud800`, so the raw body counted and the redelivery got a 422.
    let p = push_plugin();
    let (_, mut env) = world();
    let r = |attempt: u32, text: &str| {
        req("POST", "/push").key("m1").body(&format!(
            r#"{{"text": "{text}", "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert!(run(&p, &mut env, &r(1, r"a\ud800b"), ok("done")).reached_upstream());
    run(&p, &mut env, &r(2, r"a\uD800b"), ok("no")).assert_replays(b"done");
    // Another lone surrogate, or the replacement character, is another text.
    assert_eq!(
        run(&p, &mut env, &r(3, r"a\ud801b"), ok("no")).status(),
        422
    );
    assert_eq!(
        run(&p, &mut env, &r(3, "a\u{fffd}b"), ok("no")).status(),
        422
    );
}

#[test]
fn the_push_recipe_replays_a_redelivery_with_a_lone_surrogate() {
    // The key from the body (the lone surrogate is elsewhere in it), as in the README's
    // push recipe.
    let p = plugin(
        r#"{"key": {"json_pointer": "/message/messageId", "required": true},
            "payload": {"ignore_json_pointers": ["/deliveryAttempt"]}}"#,
    );
    let (_, mut env) = world();
    let push = |attempt: u32| {
        req("POST", "/push").body(&format!(
            r#"{{"message": {{"messageId": "m7", "data": "\udbff"}}, "deliveryAttempt": {attempt}}}"#
        ))
    };
    assert!(run(&p, &mut env, &push(1), ok("acked")).reached_upstream());
    run(&p, &mut env, &push(2), ok("no")).assert_replays(b"acked");
}

#[test]
fn bodies_too_deep_to_canonicalise_are_compared_as_sent() {
    let p = push_plugin();
    let (_, mut env) = world();
    let deep = |attempt: u32| {
        let n = crate::payload::canon::MAX_DEPTH + 1;
        format!(
            r#"{{"deliveryAttempt": {attempt}, "x": {}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let r = |b: &str| req("POST", "/push").key("d").body(b);
    assert!(run(&p, &mut env, &r(&deep(1)), ok("deep")).reached_upstream());
    run(&p, &mut env, &r(&deep(1)), ok("no")).assert_replays(b"deep");
    // Raw: the ignored field counts after all (a false 422, never a wrong replay).
    assert_eq!(run(&p, &mut env, &r(&deep(2)), ok("no")).status(), 422);
}
