use super::*;
use crate::head::RequestHead;

fn head(headers: &[(&str, &str)]) -> RequestHead {
    RequestHead {
        method: "POST".into(),
        path: b"/orders".to_vec(),
        authority: b"api.example".to_vec(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect(),
        ..RequestHead::default()
    }
}

fn header(name: &str) -> PrincipalSource {
    PrincipalSource::Header(name.into())
}

const P: Digest = [7u8; 32];
const R: Digest = [9u8; 32];

#[test]
fn a_header_principal_is_its_bytes_and_an_absent_or_empty_one_is_none() {
    let h = head(&[("authorization", "Bearer alice")]);
    assert_eq!(
        principal(&header("authorization"), &h).as_deref(),
        Some(&b"Bearer alice"[..])
    );
    assert_eq!(principal(&header("x-api-key"), &h), None);
    assert_eq!(
        principal(&header("authorization"), &head(&[("authorization", "")])),
        None
    );
    assert_eq!(principal(&PrincipalSource::None, &h), None);
}

#[test]
fn a_header_on_two_lines_is_neither_line() {
    let two = head(&[("x-api-key", "a"), ("x-api-key", "b")]);
    let got = principal(&header("x-api-key"), &two).unwrap().into_owned();
    assert_ne!(got, b"a");
    assert_ne!(got, b"b");
    let swapped = head(&[("x-api-key", "b"), ("x-api-key", "a")]);
    assert_ne!(principal(&header("x-api-key"), &swapped).unwrap(), got);
}

#[test]
fn a_cookie_principal_is_its_value_among_others() {
    let h = head(&[("cookie", "theme=dark; session=s-1 ;lang=en")]);
    let src = PrincipalSource::Cookie("session".into());
    assert_eq!(principal(&src, &h).as_deref(), Some(&b"s-1"[..]));
    // Names are case-sensitive, and a prefix is not a name.
    assert_eq!(
        principal(&PrincipalSource::Cookie("Session".into()), &h),
        None
    );
    assert_eq!(principal(&PrincipalSource::Cookie("sess".into()), &h), None);
    let twice = head(&[("cookie", "session=a"), ("cookie", "session=b")]);
    let got = principal(&src, &twice).unwrap().into_owned();
    assert_ne!(got, b"a");
    assert_ne!(got, b"b");
}

#[test]
fn a_metadata_principal_is_the_property_the_glue_read() {
    let path = vec![
        "envoy.filters.http.jwt_authn".to_string(),
        "jwt_payload".to_string(),
        "sub".to_string(),
    ];
    let property = crate::config::metadata_property(&path);
    assert_eq!(
        property,
        "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0sub"
    );
    let src = PrincipalSource::Metadata {
        path,
        property: property.clone(),
    };
    let mut h = head(&[("authorization", "Bearer t1")]);
    assert_eq!(principal(&src, &h), None, "no metadata: no caller");
    h.properties.push((property, b"user-42".to_vec()));
    assert_eq!(principal(&src, &h).as_deref(), Some(&b"user-42"[..]));
}

#[test]
fn the_same_caller_matches_another_caller_does_not() {
    let alice = seal(&P, &R, Some(b"Bearer alice"));
    let mallory = seal(&P, &R, Some(b"Bearer mallory"));
    let nobody = seal(&P, &R, None);
    assert_eq!(
        compare(&alice, &seal(&P, &R, Some(b"Bearer alice"))),
        PayloadMatch::Same
    );
    assert_eq!(compare(&alice, &mallory), PayloadMatch::OtherCaller);
    assert_eq!(compare(&mallory, &alice), PayloadMatch::OtherCaller);
    assert_eq!(compare(&alice, &nobody), PayloadMatch::OtherCaller);
    assert_eq!(compare(&nobody, &alice), PayloadMatch::OtherCaller);
    assert_eq!(compare(&nobody, &seal(&P, &R, None)), PayloadMatch::Same);
}

#[test]
fn another_payload_is_told_from_another_caller() {
    let mut other = P;
    other[0] ^= 1;
    let alice = seal(&P, &R, Some(b"a"));
    assert_eq!(
        compare(&alice, &seal(&other, &R, Some(b"a"))),
        PayloadMatch::OtherPayload
    );
    assert_eq!(
        compare(&alice, &seal(&other, &R, Some(b"b"))),
        PayloadMatch::OtherPayload
    );
    // A payload digest that differs only in the sealed tail still differs.
    let mut tail = P;
    tail[31] ^= 1;
    assert_ne!(
        compare(&alice, &seal(&tail, &R, Some(b"a"))),
        PayloadMatch::Same
    );
}

#[test]
fn a_record_from_before_callers_matches_a_request_of_none_and_no_named_caller() {
    // Before this version a record stored the payload digest itself.
    let old = P;
    assert_eq!(compare(&old, &seal(&P, &R, None)), PayloadMatch::Same);
    assert_eq!(
        compare(&old, &seal(&P, &R, Some(b"Bearer alice"))),
        PayloadMatch::Unowned
    );
    let mut other = P;
    other[3] ^= 0x80;
    assert_eq!(
        compare(&old, &seal(&other, &R, None)),
        PayloadMatch::OtherPayload
    );
}

#[test]
fn a_callers_tag_is_salted_by_the_record() {
    let r2 = [10u8; 32];
    let a1 = seal(&P, &R, Some(b"alice"));
    let a2 = seal(&P, &r2, Some(b"alice"));
    assert_ne!(
        a1[24..],
        a2[24..],
        "one caller's tag differs from record to record"
    );
    // The principal's bytes are nowhere in the sealed digest.
    let long = b"Bearer a-very-long-credential";
    let sealed = seal(&P, &R, Some(long));
    assert!(!sealed.windows(8).any(|w| long.windows(8).any(|l| l == w)));
}

#[test]
fn a_callers_own_record_differs_by_caller_and_from_the_fingerprints() {
    let a = caller_record(&R, Some(b"alice"));
    let b = caller_record(&R, Some(b"bob"));
    let none = caller_record(&R, None);
    assert_ne!(a, b);
    assert_ne!(a, none);
    assert_ne!(a, R);
    assert_ne!(caller_record(&R, Some(b"")), none);
    assert_eq!(a, caller_record(&R, Some(b"alice")));
}

/// The format is pinned: these bytes are what every store holds for this version.
#[test]
fn the_sealed_digest_is_pinned() {
    let sealed = seal(&P, &R, Some(b"Bearer alice"));
    assert_eq!(sealed[..20], P[..20]);
    assert_eq!(
        [
            sealed[20] ^ P[20],
            sealed[21] ^ P[21],
            sealed[22] ^ P[22],
            sealed[23] ^ P[23]
        ],
        *b"PRIN"
    );
    let nobody = seal(&P, &R, None);
    assert_eq!(
        [
            nobody[20] ^ P[20],
            nobody[21] ^ P[21],
            nobody[22] ^ P[22],
            nobody[23] ^ P[23]
        ],
        *b"ANON"
    );
    let mut h = Sha256::new();
    h.update(b"proxy-dedup principal v1\0");
    h.update(R);
    h.update([1]);
    h.update(12u64.to_be_bytes());
    h.update(b"Bearer alice");
    let d = h.finalize();
    for i in 0..8 {
        assert_eq!(sealed[24 + i] ^ P[24 + i], d[i]);
    }
}
