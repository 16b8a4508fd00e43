//! Tests of request keys: header and JSON-pointer keys, fingerprints, record digests.

use crate::config::Config;
use crate::key::{self, json_key, record_digest, ClientKey, JsonKey, KeyError, KeySource};
use crate::testing::*;

#[test]
fn header_key_first_present_wins_and_is_validated() {
    let cfg = Config::parse(br#"{"key": {"headers": ["x-a", "x-b"], "max_length": 8}}"#).unwrap();
    let mut h = req("POST", "/")
        .header("x-b", "second")
        .header("x-a", "first")
        .head;
    assert_eq!(
        key::header_key(&cfg.policy, &h).unwrap().unwrap().value,
        b"first"
    );
    h.headers.remove(1);
    assert_eq!(
        key::header_key(&cfg.policy, &h).unwrap().unwrap().value,
        b"second"
    );
    h.headers.clear();
    assert!(key::header_key(&cfg.policy, &h).is_none());
    for (bad, why) in [
        ("123456789", "at most 8"),
        ("a\u{1}b", "control"),
        ("", "empty"),
        ("\"\"", "empty"),
        ("a\tb", "control"),
    ] {
        let h = req("POST", "/").header("x-a", bad).head;
        match key::header_key(&cfg.policy, &h).unwrap() {
            Err(KeyError::Invalid { detail }) => assert!(detail.contains(why), "{bad:?}: {detail}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // An RFC 8941 string (as in the IETF draft) is the same key as its content.
    let q = req("POST", "/").header("x-a", "\"abc\"").head;
    assert_eq!(
        key::header_key(&cfg.policy, &q).unwrap().unwrap().value,
        b"abc"
    );
    // Exactly max_length is fine.
    let h = req("POST", "/").header("x-a", "12345678").head;
    assert!(key::header_key(&cfg.policy, &h).unwrap().is_ok());
}

#[test]
fn json_pointer_keys() {
    let cfg = Config::parse(br#"{"key": {"json_pointer": "/msg/id", "max_length": 10}}"#).unwrap();
    let found = |body: &str| json_key(&cfg.policy, "/msg/id", body.as_bytes());
    assert!(
        matches!(found(r#"{"msg": {"id": "m-1"}}"#), JsonKey::Found(ClientKey { value, source: KeySource::JsonPointer }) if value == b"m-1")
    );
    assert!(
        matches!(found(r#"{"msg": {"id": 42}}"#), JsonKey::Found(ClientKey { value, .. }) if value == b"42")
    );
    assert!(
        matches!(found(r#"{"msg": {"id": -7}}"#), JsonKey::Found(ClientKey { value, .. }) if value == b"-7")
    );
    assert!(matches!(
        found(r#"{"msg": {"id": 1.5}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": null}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": {"x": 1}}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(
        found(r#"{"msg": {"id": "much-too-long-id"}}"#),
        JsonKey::Invalid(_)
    ));
    assert!(matches!(found(r#"{"msg": {}}"#), JsonKey::Absent(r) if r.contains("no value")));
    assert!(
        matches!(found(r#"{"msg": {"id": "x"}"#), JsonKey::Absent(r) if r.contains("not valid JSON"))
    );
    assert!(matches!(found(""), JsonKey::Absent(r) if r.contains("not valid JSON")));
    assert!(matches!(found("\u{0}\u{ff}garbage"), JsonKey::Absent(_)));
    // Escapes: "/a~1b" is the member "a/b".
    assert!(matches!(
        json_key(&cfg.policy, "/a~1b", br#"{"a/b": "k"}"#),
        JsonKey::Found(_)
    ));
}

#[test]
fn fingerprints_differ_by_each_configured_part_only() {
    let cfg = Config::parse(
        br#"{"key": {"fingerprint": ["method", "path", "body", "header:x-device"]}}"#,
    )
    .unwrap();
    let fp = |r: &Req| {
        let mut h = key::BodyHasher::default();
        if let Some(b) = &r.body {
            for c in b.chunks(3) {
                h.update(c);
            }
        }
        key::fingerprint_key(&cfg.policy, &r.head, &h.finish()).value
    };
    let base = req("POST", "/push?x=1")
        .header("x-device", "d1")
        .body("hello");
    let same = fp(&base);
    assert_eq!(same, fp(&base.clone()));
    // Query is not a configured part: ignored.
    let mut q = base.clone();
    q.head.path = "/push?x=2".into();
    assert_eq!(fp(&q), same);
    let mut m = base.clone();
    m.head.method = "PUT".into();
    assert_ne!(fp(&m), same);
    let mut p = base.clone();
    p.head.path = "/pull?x=1".into();
    assert_ne!(fp(&p), same);
    assert_ne!(fp(&base.clone().body("hellO")), same);
    let mut d = base.clone();
    d.head.headers[0].1 = "d2".into();
    assert_ne!(fp(&d), same);
    // Chunking does not matter.
    let mut one = key::BodyHasher::default();
    one.update(b"hello");
    assert_eq!(
        key::fingerprint_key(&cfg.policy, &base.head, &one.finish()).value,
        same
    );
    // The body's place: an empty body and no body part differ from a body of "".
    let no_body =
        Config::parse(br#"{"key": {"fingerprint": ["method", "path", "header:x-device"]}}"#)
            .unwrap();
    let empty = key::BodyHasher::default().finish();
    assert_ne!(
        key::fingerprint_key(&no_body.policy, &base.head, &empty).value,
        key::fingerprint_key(&cfg.policy, &base.head, &empty).value
    );
}

#[test]
fn digests_separate_scopes_and_key_sources() {
    let cfg = Config::parse(br#"{"scope": {"headers": ["x-tenant"]}}"#).unwrap();
    let k = ClientKey {
        source: KeySource::Header,
        value: b"k1".to_vec(),
    };
    let a = req("POST", "/").header("x-tenant", "a").head;
    let b = req("POST", "/").header("x-tenant", "b").head;
    let none = req("POST", "/").head;
    let empty = req("POST", "/").header("x-tenant", "").head;
    let da = record_digest(&cfg.policy, &a, &k);
    assert_eq!(da, record_digest(&cfg.policy, &a, &k));
    assert_ne!(da, record_digest(&cfg.policy, &b, &k));
    assert_ne!(
        record_digest(&cfg.policy, &none, &k),
        record_digest(&cfg.policy, &empty, &k)
    );
    let j = ClientKey {
        source: KeySource::JsonPointer,
        value: b"k1".to_vec(),
    };
    assert_ne!(da, record_digest(&cfg.policy, &a, &j));
    // Length prefixes: ("ab","c") and ("a","bc") scopes cannot meet.
    let cfg2 = Config::parse(br#"{"scope": {"headers": ["x-a", "x-b"]}}"#).unwrap();
    let h1 = req("POST", "/").header("x-a", "ab").header("x-b", "c").head;
    let h2 = req("POST", "/").header("x-a", "a").header("x-b", "bc").head;
    assert_ne!(
        record_digest(&cfg2.policy, &h1, &k),
        record_digest(&cfg2.policy, &h2, &k)
    );
}

#[test]
fn a_short_hex_is_the_first_six_bytes_in_lower_hex() {
    let mut d = [0xab; 32];
    d[0] = 0x01;
    d[5] = 0xf0;
    assert_eq!(crate::key::short_hex(&d).to_string(), "01ababababf0");
}

/// Record and payload digests of valid-UTF-8 requests, pinned as computed before header
/// values became bytes (issue 21): a change here would run every stored key again
/// across an upgrade.
#[test]
fn digests_of_utf8_requests_are_pinned() {
    use crate::payload::payload_digest;
    let hex = |d: &[u8]| {
        let mut s = String::new();
        key::push_hex(&mut s, d);
        s
    };
    let k = |v: &str| ClientKey {
        source: KeySource::Header,
        value: v.as_bytes().to_vec(),
    };
    let body = |b: &str| {
        let mut h = key::BodyHasher::default();
        h.update(b.as_bytes());
        h.finish()
    };
    let mut got = Vec::new();
    // The default policy: the authority (lower-cased) and the key.
    let cfg = Config::parse(b"").unwrap();
    let h = req("POST", "/orders").key("op-1").head;
    got.push(hex(&record_digest(&cfg.policy, &h, &k("op-1"))));
    let mut up = h.clone();
    up.authority = "API.Example".into();
    got.push(hex(&record_digest(&cfg.policy, &up, &k("op-1"))));
    // Scope headers, pseudo-headers among them, one absent, one empty, non-ASCII UTF-8.
    let cfg = Config::parse(
        br#"{"scope": {"headers": ["x-tenant", ":authority", ":path", ":method", "x-absent", "x-empty"]}}"#,
    )
    .unwrap();
    let h = req("POST", "/orders?x=1")
        .header("x-tenant", "acmé")
        .header("x-empty", "")
        .head;
    got.push(hex(&record_digest(&cfg.policy, &h, &k("clé-ü"))));
    // A rule's records group, authority off.
    let cfg = Config::parse(
        br#"{"rules": [{"name": "pay", "match": {"path_prefix": "/pay"}, "scope": {"authority": false, "headers": ["x-tenant"]}}]}"#,
    )
    .unwrap();
    let h = req("POST", "/pay").header("x-tenant", "globex").head;
    let (rule, policy) = cfg.select(&h);
    assert_eq!(rule, Some(0));
    got.push(hex(&record_digest(policy, &h, &k("p-9"))));
    // A keyless fingerprint with header parts (present, and present but empty).
    let cfg = Config::parse(
        br#"{"key": {"fingerprint": ["method", "path", "query", "body", "header:x-device", "header:x-empty", "header::authority"]}}"#,
    )
    .unwrap();
    let h = req("POST", "/push?a=1")
        .header("x-device", "d-1")
        .header("x-empty", "")
        .head;
    let fp = key::fingerprint_key(&cfg.policy, &h, &body("hello"));
    got.push(hex(&fp.value));
    got.push(hex(&record_digest(&cfg.policy, &h, &fp)));
    // Payload digests: the default, and parts with headers (present, empty, absent).
    let cfg = Config::parse(b"").unwrap();
    got.push(hex(&payload_digest(
        &cfg.policy.payload,
        &h,
        &body("hello"),
        b"hello",
    )
    .unwrap()));
    let cfg = Config::parse(
        br#"{"payload": {"parts": ["method", "path", "body", "header:x-device", "header:x-empty", "header:x-absent", "header::path"]}}"#,
    )
    .unwrap();
    got.push(hex(&payload_digest(
        &cfg.policy.payload,
        &h,
        &body("hello"),
        b"hello",
    )
    .unwrap()));
    let want = [
        "1671142ff22866d72c0ae904140e0bdfe0a4feb3a99733713a5fdd151b734a38",
        "1671142ff22866d72c0ae904140e0bdfe0a4feb3a99733713a5fdd151b734a38",
        "2b070388843560b7fc77ace8beac1f3812f0ce1d7bdb95d179d0e04a48c3d56b",
        "78c50389062db5b8d40ca3903b7d3f674d0fef629d98321ccc93322492e32452",
        "7c975fd665fe0e6a5531e2e69bf0089cf46dca4ffbb0af3e00ecf2ee651bd83a",
        "8d92b674e39487db92dd57bc33205af4ace8dc750902c32d53d9bb9d40b849a1",
        "ce3ea46957fcedbaa9c8dc6544d703eec93ff352440cd9e05e24e7ca9c78a9db",
        "a6375a31056791e9a3b4884a4da2e70cb8f8978bb2f85762dee31ce240a434ea",
    ];
    assert_eq!(got, want);
}

#[test]
fn keys_are_validated_as_bytes() {
    assert_eq!(key::validate_key(b"op-1", 8, "k").unwrap(), b"op-1");
    // Validation takes the value as given; header keys are unquoted before it.
    assert_eq!(key::validate_key(b"\"op-1\"", 8, "k").unwrap(), b"\"op-1\"");
    assert_eq!(key::unquote_header_key(b"\"op-1\""), b"op-1");
    // A lone quote is no quoted string: it is the key.
    assert_eq!(key::unquote_header_key(b"\""), b"\"");
    assert_eq!(key::validate_key(b"\"", 8, "k").unwrap(), b"\"");
    assert_eq!(
        key::validate_key("clé".as_bytes(), 8, "k").unwrap(),
        "clé".as_bytes()
    );
    for (bad, why) in [
        (&b"op-\xc3"[..], "not UTF-8"),
        (b"op-\xff", "not UTF-8"),
        (b"\"\xfe\"", "not UTF-8"),
        (b"a\x7fb", "control"),
        ("a\u{85}b".as_bytes(), "control"),
    ] {
        match key::validate_key(bad, 8, "k") {
            Err(KeyError::Invalid { detail }) => assert!(detail.contains(why), "{bad:?}: {detail}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn header_lines_keep_bytes_order_and_absence() {
    let h = req("POST", "/p?q")
        .header("x-a", "1")
        .header_bytes("X-A", b"\xff")
        .head;
    assert_eq!(h.lines("x-a").collect::<Vec<_>>(), [&b"1"[..], b"\xff"]);
    assert_eq!(h.header_count("x-a"), 2);
    assert_eq!(h.lines(":path").collect::<Vec<_>>(), [&b"/p?q"[..]]);
    assert_eq!(h.header_count("x-b"), 0);
    assert_eq!(h.header("x-b"), None);
    // A fingerprint tells no line from an empty one, and a second line counts.
    let cfg = Config::parse(br#"{"key": {"fingerprint": ["header:x-a"]}}"#).unwrap();
    let fp = |r: &crate::testing::Req| {
        key::fingerprint_key(&cfg.policy, &r.head, &key::BodyHasher::default().finish()).value
    };
    let all = [
        fp(&req("POST", "/")),
        fp(&req("POST", "/").header("x-a", "")),
        fp(&req("POST", "/").header("x-a", "1")),
        fp(&req("POST", "/").header("x-a", "1").header("x-a", "")),
        fp(&req("POST", "/").header("x-a", "1").header("x-a", "2")),
    ];
    for (i, a) in all.iter().enumerate() {
        for b in all.get(i + 1..).unwrap() {
            assert_ne!(a, b);
        }
    }
}
