//! Tests of the canonical JSON form: exact numbers and strings, duplicate members, the
//! bytes serde_json wrote for typical bodies, the depth limit and the memory bound
//! (measured with a counting allocator).

use super::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

fn ignore(p: &[&str]) -> JsonSelection {
    JsonSelection::Ignore(p.iter().map(|s| s.to_string()).collect())
}

/// The whole document, canonical (an ignore selection that names nothing present).
fn canon(body: &str) -> Canonical {
    canonical(&ignore(&["/\u{1}none"]), body.as_bytes())
}

fn text(body: &str) -> String {
    match canon(body) {
        Canonical::Json(b) => String::from_utf8(b).unwrap(),
        other => panic!("{body}: {other:?}"),
    }
}

#[test]
fn numbers_are_compared_by_exact_value() {
    for same in [
        &[
            "1", "1.0", "1e0", "1E0", "10e-1", "0.1e1", "1.000", "100e-2", "1E+0",
        ][..],
        &["0", "-0", "0.0", "-0.0e5", "0e-7"],
        &["-12.5", "-125e-1", "-0.125E2", "-12.50"],
        &["1200", "12e2", "1.2e3", "1200.0"],
        &["0.001", "1e-3", "10e-4"],
    ] {
        let want = text(same[0]);
        for s in same {
            assert_eq!(text(s), want, "{s} vs {}", same[0]);
        }
    }
    // Beyond f64's precision: still distinct.
    for (a, b) in [
        ("12345678901234567890123", "12345678901234567890124"),
        ("1.000000000000000001", "1.000000000000000002"),
        ("9007199254740993", "9007199254740992"),
        ("1e400", "1e401"),
        ("-1", "1"),
    ] {
        assert_ne!(text(a), text(b), "{a} vs {b}");
    }
}

#[test]
fn number_spellings_are_pinned() {
    for (input, want) in [
        ("0", "0"),
        ("-0", "0"),
        ("7", "7"),
        ("-42", "-42"),
        ("18446744073709551615", "18446744073709551615"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("1e19", "10000000000000000000"),
        ("1e20", "1e+20"),
        ("1e21", "1e+21"),
        ("123456789012345678901234", "1.23456789012345678901234e+23"),
        ("12.99", "12.99"),
        ("0.5", "0.5"),
        ("1.5e-5", "0.000015"),
        ("1e-6", "1e-6"),
        ("-2.5E-7", "-2.5e-7"),
        ("1e999999999999", "1e+999999999999"),
        ("1e-999999999999", "1e-999999999999"),
        ("1e0000000000000000000000000005", "100000"),
    ] {
        assert_eq!(text(input), want, "{input}");
    }
    // Exponents past the bound, and malformed numbers: compared raw.
    for raw in [
        "1e1000000000000001",
        "1e99999999999999999999",
        "01",
        "1.",
        ".5",
        "-",
        "1e",
        "+1",
    ] {
        assert_eq!(canon(raw), Canonical::Raw, "{raw}");
    }
}

#[test]
fn strings_are_compared_by_code_point() {
    assert_eq!(text(r#""\u0041\u00e9\/""#), text(r#""Aé/""#));
    assert_eq!(text(r#""\ud83d\ude00""#), text("\"\u{1f600}\""));
    assert_eq!(text(r#""\uD83D\uDE00""#), text("\"\u{1f600}\""));
    assert_eq!(text(r#""\u000a\u0022\u005c""#), r#""\n\"\\""#);
    assert_eq!(text(r#""\u0001\u001F\u007f""#), "\"\\u0001\\u001f\u{7f}\"");
    // A lone surrogate is kept, in one spelling; it differs from every code point.
    assert_eq!(text(r#""\uD800""#), r#""\ud800""#);
    assert_eq!(text(r#""a\udc00b""#), r#""a\udc00b""#);
    assert_eq!(text(r#""\ud800\ud800""#), r#""\ud800\ud800""#);
    assert_eq!(text(r#""\ud800\u0041""#), r#""\ud800A""#);
    assert_ne!(text(r#""\ud800""#), text(r#""\ud801""#));
    assert_ne!(text(r#""\ud800""#), text("\"\u{fffd}\""));
    // Not JSON: raw control characters, bad escapes, invalid UTF-8.
    for raw in ["\"a\nb\"", r#""\x""#, r#""\u12""#, r#""\u12g4""#, "\"abc"] {
        assert_eq!(canon(raw), Canonical::Raw, "{raw:?}");
    }
    assert_eq!(canonical(&ignore(&["/x"]), b"\"\xff\""), Canonical::Raw);
}

#[test]
fn members_are_sorted_and_a_name_given_twice_is_ambiguous() {
    assert_eq!(
        text(r#" { "b" : [ 1 , {"y":1,"x":2} ] , "a" : null } "#),
        r#"{"a":null,"b":[1,{"x":2,"y":1}]}"#
    );
    // Sorted by decoded name: `"` (0x22) sorts before `A`, though `\"` is spelled with `\`.
    assert_eq!(text(r#"{"A":1,"\"":2}"#), r#"{"\"":2,"A":1}"#);
    for body in [
        r#"{"amount":5000,"amount":5}"#,
        r#"{"a":1,"\u0061":2}"#,
        r#"{"x":{"m":[{"k":1,"j":2,"k":3}]}}"#,
        r#"{"\ud800":1,"\uD800":2}"#,
        r#"[{"a":1},{"b":1,"b":1}]"#,
    ] {
        assert!(
            matches!(canon(body), Canonical::Ambiguous(_)),
            "{body}: {:?}",
            canon(body)
        );
    }
    // Even when the repeated member is ignored, or not selected.
    let dup = br#"{"deliveryAttempt":1,"deliveryAttempt":2}"#;
    assert!(matches!(
        canonical(&ignore(&["/deliveryAttempt"]), dup),
        Canonical::Ambiguous(_)
    ));
    let only = JsonSelection::Only(vec!["/id".into()]);
    assert!(matches!(
        canonical(&only, br#"{"id":1,"x":{"y":1,"y":2}}"#),
        Canonical::Ambiguous(_)
    ));
    // One name in two objects is fine.
    assert_eq!(text(r#"[{"a":1},{"a":1}]"#), r#"[{"a":1},{"a":1}]"#);
}

#[test]
fn typical_bodies_keep_the_bytes_serde_json_wrote() {
    // The form before this canonicaliser: serde_json's `to_vec` of the parsed `Value`
    // (its map is sorted by name). For these bodies an upgrade changes no digest.
    let bodies = [
        r#"{"message": {"data": "aGk=", "messageId": "1", "attributes": {"k": "v"}}, "subscription": "s"}"#,
        r#"{"id": 123, "amount": -5000, "currency": "EUR", "items": [1, 2, 3], "ok": true, "note": null}"#,
        r#"{"price": 12.99, "rate": 0.5, "tags": [], "meta": {}, "z": false}"#,
        r#"[0.001, 1.5e-5, 2.5e-7, 1e-6, 1e21, 1.25e30, -3.75, 100.5]"#,
        r#"{"text": "line\nbreak \"quoted\" back\\slash tab\t \u0001 é ☃ 😀 \u00e9 \/"}"#,
        r#"[{"b": 1, "a": 2}, "x", 18446744073709551615, -9223372036854775808, 0]"#,
        r#"{"": 1, "A": 2, "a": 3, "é": 4, "\"": 5, "\n": 6, "ä": 7}"#,
    ];
    for body in bodies {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let want = serde_json::to_vec(&v).unwrap();
        assert_eq!(text(body), String::from_utf8(want).unwrap(), "{body}");
        // And the selection of one member, as `json_pointers` had it.
        let only = JsonSelection::Only(vec!["/id".into(), "/nope".into()]);
        let want_only = serde_json::to_vec(&serde_json::json!([
            v.pointer("/id").map(|x| vec![x.clone()]),
            null
        ]))
        .unwrap();
        assert_eq!(
            canonical(&only, body.as_bytes()),
            Canonical::Json(want_only)
        );
    }
}

#[test]
fn pointers_select_and_ignore_like_before() {
    let only = |p: &[&str], body: &str| match canonical(
        &JsonSelection::Only(p.iter().map(|s| s.to_string()).collect()),
        body.as_bytes(),
    ) {
        Canonical::Json(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    let doc = r#"{"a": {"b/c": [10, {"~d": "x"}], "n": 7}, "s": "top", "": 0}"#;
    assert_eq!(
        only(
            &["/a/b~1c/1/~0d", "/s", "/zz", "/a/n", "/a/b~1c/01", "/"],
            doc
        ),
        r#"[["x"],["top"],null,[7],null,[0]]"#
    );
    // Nested selections both see the whole value.
    assert_eq!(
        only(&["/a", "/a/n"], doc),
        r#"[[{"b/c":[10,{"~d":"x"}],"n":7}],[7]]"#
    );
    let ign = |p: &[&str], body: &str| match canonical(&ignore(p), body.as_bytes()) {
        Canonical::Json(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ign(&["/a/b~1c/0", "/s", "/a/n/x"], doc),
        r#"{"":0,"a":{"b/c":[{"~d":"x"}],"n":7}}"#
    );
    // Array indexes name elements of the body as sent (several in one array too).
    assert_eq!(
        ign(&["/i/0", "/i/2"], r#"{"i":[0,1,2,3]}"#),
        r#"{"i":[1,3]}"#
    );
    assert_eq!(
        ign(&["/i/3", "/i/+1", "/i/-"], r#"{"i":[0,1,2,3]}"#),
        r#"{"i":[0,1,2]}"#
    );
    assert_eq!(ign(&["/i/0", "/i/1"], r#"{"i":[0,1]}"#), r#"{"i":[]}"#);
    assert_eq!(ign(&["/a", "/b"], r#"{"b":1,"a":2}"#), r#"{}"#);
}

#[test]
fn nesting_is_limited_without_recursion() {
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(text(&nested(MAX_DEPTH)), nested(MAX_DEPTH));
    assert_eq!(canon(&nested(MAX_DEPTH + 1)), Canonical::Raw);
    // Far deeper than any stack would take: refused at the limit, no recursion.
    assert_eq!(canon(&nested(1_000_000)), Canonical::Raw);
    let objects = format!("{}1{}", r#"{"a":"#.repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
    assert_eq!(text(&objects), objects);
}

#[test]
fn malformed_bodies_are_compared_raw() {
    for raw in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{1:2}",
        "[1 2]",
        "tru",
        "nul",
        "1 2",
        "{\"a\":1}x",
        "\u{feff}{}",
        "[",
        "]",
        "{\"a\":}",
        "NaN",
        "Infinity",
    ] {
        assert_eq!(canon(raw), Canonical::Raw, "{raw:?}");
    }
    assert_eq!(
        text(" \t\r\n[ true , false , null ] \n"),
        "[true,false,null]"
    );
}

// Peak heap of the current thread, for the memory bound.
thread_local! {
    static HEAP: Cell<(bool, isize, isize)> = const { Cell::new((false, 0, 0)) };
}

fn note(delta: isize) {
    let _ = HEAP.try_with(|h| {
        let (on, cur, peak) = h.get();
        if on {
            let cur = cur + delta;
            h.set((on, cur, peak.max(cur)));
        }
    });
}

struct Counting;

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new as isize - l.size() as isize);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak bytes allocated while canonicalising `body` (the output included).
fn peak(selection: &JsonSelection, body: &[u8]) -> (usize, Canonical) {
    HEAP.with(|h| h.set((true, 0, 0)));
    let c = canonical(selection, body);
    let (_, _, peak) = HEAP.with(|h| h.replace((false, 0, 0)));
    (peak as usize, c)
}

#[test]
fn memory_stays_a_small_multiple_of_the_body() {
    let sel = ignore(&["/deliveryAttempt", "/0/x"]);
    // A 3.4 MB array of numbers and strings (the report's case grew Envoy by 26x).
    let mut arr = String::from("[");
    let mut i = 0u64;
    while arr.len() < 3_400_000 {
        arr.push_str(&format!("{i}, \"s{i}\", {i}.5e-1, "));
        i += 1;
    }
    arr.push_str("null]");
    // An object with 100 000 unsorted members, and an array of small unsorted objects.
    let mut obj = String::from("{");
    for i in (0..100_000).rev() {
        obj.push_str(&format!(
            "\"member{i}\": {{\"z\": {i}, \"a\": [\"v{i}\"]}}, "
        ));
    }
    obj.push_str("\"deliveryAttempt\": 1}");
    let mut recs = String::from("[");
    for i in 0..60_000 {
        recs.push_str(&format!(
            "{{\"id\": {i}, \"name\": \"n{i}\", \"amount\": {i}.25}},"
        ));
    }
    recs.push_str("{}]");
    // Numbers with exponents: the one place the output outgrows the body.
    // `1e19` (4 bytes) is written as its 20 digits.
    let exps = format!("[{}0]", "1e19,".repeat(500_000));
    for (name, body, bound) in [
        ("array", &arr, 2.0),
        ("object", &obj, 3.0),
        ("records", &recs, 2.0),
        ("exponents", &exps, 8.5),
    ] {
        let (p, c) = peak(&sel, body.as_bytes());
        let Canonical::Json(out) = c else {
            panic!("{name}: {c:?}")
        };
        let ratio = p as f64 / body.len() as f64;
        eprintln!(
            "{name}: body {} bytes, canonical {} bytes, peak heap {p} bytes ({ratio:.2}x)",
            body.len(),
            out.len()
        );
        assert!(ratio <= bound, "{name}: {ratio:.2}x the body");
    }
    // Selecting a few members keeps the names of the open objects and their index.
    let only = JsonSelection::Only(vec!["/member5".into(), "/deliveryAttempt".into()]);
    let (p, c) = peak(&only, obj.as_bytes());
    assert!(matches!(c, Canonical::Json(_)));
    eprintln!("object, two pointers: peak heap {p} bytes");
    assert!(p < 2 * obj.len(), "{p}");
}
