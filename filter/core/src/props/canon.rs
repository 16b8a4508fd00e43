//! Property tests of the canonical JSON form (`payload::canon`): it is a function of the
//! JSON value. Random values, each rendered with random member orders, whitespace,
//! number spellings and string escapes, give one payload digest; a changed digit,
//! member or character gives another; serde_json's bytes for what it holds exactly;
//! and no byte string panics.

use crate::key::{BodyHasher, RequestHead};
use crate::payload::canon::{canonical, Canonical};
use crate::payload::{payload_digest, JsonSelection, PayloadConfig};
use crate::props::decoders::config;
use proptest::prelude::*;

/// A JSON value in normal form, so that `==` is equality of JSON values.
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    /// 0.`digits` x 10^`point`, digits without leading or trailing zeros; zero is
    /// `digits` empty, `neg` false, `point` 0.
    Num {
        neg: bool,
        digits: Vec<u8>,
        point: i64,
    },
    Str(Vec<Unit>),
    Arr(Vec<J>),
    /// Members sorted by name, names distinct.
    Obj(Vec<(Vec<Unit>, J)>),
}

/// A string's unit: a code point, or a lone surrogate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Char(char),
    Lone(u16),
}

fn units() -> impl Strategy<Value = Vec<Unit>> {
    let unit = prop_oneof![
        4 => "[a-c]".prop_map(|s| Unit::Char(s.chars().next().unwrap_or('a'))),
        2 => prop::sample::select(vec!['"', '\\', '/', '\n', '\t', '\u{1}', '\u{1f}', '\u{7f}',
            'é', '\u{2028}', '\u{ffff}', '\u{fffd}', '😀', '\u{10ffff}', ' ']).prop_map(Unit::Char),
        1 => prop_oneof![0xd800u16..0xdc00, 0xdc00u16..0xe000].prop_map(Unit::Lone),
    ];
    prop::collection::vec(unit, 0..5).prop_map(|mut v| {
        // A lone high surrogate before a lone low one would be a pair: not a distinct value.
        let mut i = 0;
        while i + 1 < v.len() {
            if let [Unit::Lone(h), Unit::Lone(l)] = [v[i], v[i + 1]] {
                if (0xd800..0xdc00).contains(&h) && (0xdc00..0xe000).contains(&l) {
                    v.insert(i + 1, Unit::Char('x'));
                }
            }
            i += 1;
        }
        v
    })
}

fn number() -> impl Strategy<Value = J> {
    (
        any::<bool>(),
        "[1-9]([0-9]{0,24}[1-9])?",
        -30i64..30,
        0u8..8,
    )
        .prop_map(|(neg, digits, point, zero)| {
            if zero == 0 {
                J::Num {
                    neg: false,
                    digits: Vec::new(),
                    point: 0,
                }
            } else {
                J::Num {
                    neg,
                    digits: digits.into_bytes(),
                    point,
                }
            }
        })
}

fn value() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number(),
        units().prop_map(J::Str),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            prop::collection::btree_map(units(), inner, 0..5)
                .prop_map(|m| J::Obj(m.into_iter().collect())),
        ]
    })
}

/// splitmix64: the rendering's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

fn ws(r: &mut Rng, out: &mut String) {
    for _ in 0..r.below(3) {
        out.push([' ', '\t', '\n', '\r'][r.below(4) as usize]);
    }
}

fn hex4(r: &mut Rng, out: &mut String, u: u32) {
    let s = format!("\\u{u:04x}");
    out.push_str(&if r.coin() {
        s.to_uppercase().replace("\\U", "\\u")
    } else {
        s
    });
}

fn render_str(r: &mut Rng, units: &[Unit], out: &mut String) {
    out.push('"');
    for u in units {
        match *u {
            Unit::Lone(s) => hex4(r, out, u32::from(s)),
            Unit::Char(c) => {
                let short = match c {
                    '"' => Some("\\\""),
                    '\\' => Some("\\\\"),
                    '/' => Some("\\/"),
                    '\n' => Some("\\n"),
                    '\t' => Some("\\t"),
                    _ => None,
                };
                let must_escape = c < ' ' || c == '"' || c == '\\';
                match r.below(3) {
                    0 if short.is_some() => out.push_str(short.unwrap_or_default()),
                    1 | 0 if !must_escape => out.push(c),
                    _ => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            hex4(r, out, u32::from(*unit));
                        }
                    }
                }
            }
        }
    }
    out.push('"');
}

fn render_num(r: &mut Rng, neg: bool, digits: &[u8], point: i64, out: &mut String) {
    if neg || (digits.is_empty() && r.coin()) {
        out.push('-');
    }
    let lead = if r.coin() { 1 + r.below(3) as usize } else { 0 };
    let trail = r.below(4) as usize;
    let mut m = "0".repeat(lead);
    m.push_str(std::str::from_utf8(digits).unwrap_or("0"));
    m.push_str(&"0".repeat(trail));
    if m.is_empty() {
        m.push('0');
    }
    // Integer part: "0" when there are leading zeros, else up to all the digits.
    let p = if lead > 0 || digits.is_empty() {
        1
    } else {
        1 + r.below(m.len() as u64) as usize
    };
    // m with the point after p digits is 0.digits x 10^(p - lead); the exponent makes up
    // the rest.
    let exp = if digits.is_empty() {
        r.below(7) as i64 - 3
    } else {
        point - (p as i64 - lead as i64)
    };
    out.push_str(&m[..p]);
    if p < m.len() {
        out.push('.');
        out.push_str(&m[p..]);
    }
    if exp != 0 || r.coin() {
        out.push(if r.coin() { 'e' } else { 'E' });
        if exp < 0 {
            out.push('-');
        } else if r.coin() {
            out.push('+');
        }
        out.push_str(&"0".repeat(r.below(2) as usize));
        out.push_str(&exp.unsigned_abs().to_string());
    }
}

fn render(r: &mut Rng, v: &J, out: &mut String) {
    ws(r, out);
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num { neg, digits, point } => render_num(r, *neg, digits, *point, out),
        J::Str(u) => render_str(r, u, out),
        J::Arr(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(r, x, out);
            }
            ws(r, out);
            out.push(']');
        }
        J::Obj(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, r.below(i as u64 + 1) as usize);
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                ws(r, out);
                render_str(r, &members[i].0, out);
                ws(r, out);
                out.push(':');
                render(r, &members[i].1, out);
            }
            ws(r, out);
            out.push('}');
        }
    }
    ws(r, out);
}

fn spelled(v: &J, seed: u64) -> String {
    let mut s = String::new();
    render(&mut Rng(seed), v, &mut s);
    s
}

/// The whole document, canonical.
fn whole() -> JsonSelection {
    JsonSelection::Ignore(vec!["/\u{0}none".into()])
}

fn digest(body: &str) -> [u8; 32] {
    let cfg = PayloadConfig {
        parts: None,
        json: whole(),
    };
    let head = RequestHead {
        method: "POST".into(),
        path: "/p".into(),
        ..RequestHead::default()
    };
    let mut h = BodyHasher::default();
    h.update(body.as_bytes());
    payload_digest(&cfg, &head, &h.finish(), body.as_bytes()).unwrap_or([0; 32])
}

/// A change of `v` that makes it another JSON value, at the `pick`-th place that can
/// take one (`None` when `v` has none: then the caller wraps it).
fn mutate(v: &J, pick: &mut u64, r: &mut Rng) -> Option<J> {
    let here = |r: &mut Rng| -> J {
        match v {
            J::Null => J::Bool(false),
            J::Bool(b) => J::Bool(!b),
            J::Num { neg, digits, point } => {
                let mut d = digits.clone();
                if d.is_empty() {
                    d.push(b'1');
                } else if r.coin() {
                    // One more significant digit (not a trailing zero).
                    d.push(b'1' + r.below(9) as u8);
                } else {
                    let i = r.below(d.len() as u64) as usize;
                    let last = i + 1 == d.len();
                    let old = d[i];
                    // Another digit in place; the first and last stay non-zero.
                    let choices: Vec<u8> = (if i == 0 || last { b'1' } else { b'0' }..=b'9')
                        .filter(|&c| c != old)
                        .collect();
                    d[i] = choices[r.below(choices.len() as u64) as usize];
                }
                J::Num {
                    neg: *neg,
                    digits: d,
                    point: *point,
                }
            }
            J::Str(u) => {
                let mut u = u.clone();
                if u.is_empty() || r.coin() {
                    u.push(Unit::Char('z'));
                } else {
                    let i = r.below(u.len() as u64) as usize;
                    u[i] = match u[i] {
                        Unit::Char('q') => Unit::Char('w'),
                        _ => Unit::Char('q'),
                    };
                    // Keep no high-low lone pair (it would read as one code point).
                }
                J::Str(u)
            }
            J::Arr(items) => {
                let mut items = items.clone();
                items.push(J::Null);
                J::Arr(items)
            }
            J::Obj(m) => {
                let mut m = m.clone();
                let name = vec![Unit::Char('n'), Unit::Char('e'), Unit::Char('w')];
                if !m.iter().any(|(n, _)| *n == name) {
                    m.push((name, J::Null));
                    m.sort_by(|a, b| a.0.cmp(&b.0));
                } else {
                    m.retain(|(n, _)| *n != name);
                }
                J::Obj(m)
            }
        }
    };
    if *pick == 0 {
        return Some(here(r));
    }
    *pick -= 1;
    match v {
        J::Arr(items) => {
            for (i, x) in items.iter().enumerate() {
                if let Some(y) = mutate(x, pick, r) {
                    let mut items = items.clone();
                    items[i] = y;
                    return Some(J::Arr(items));
                }
            }
            None
        }
        J::Obj(m) => {
            for (i, (_, x)) in m.iter().enumerate() {
                if let Some(y) = mutate(x, pick, r) {
                    let mut m = m.clone();
                    m[i].1 = y;
                    return Some(J::Obj(m));
                }
            }
            None
        }
        _ => None,
    }
}

/// serde_json's `Value` of `v` when it holds it exactly (integers within i64, decimals
/// of at most 15 digits, strings without lone surrogates).
fn serde_value(v: &J) -> Option<serde_json::Value> {
    use serde_json::Value;
    Some(match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Num { neg, digits, point } => {
            let n = i64::try_from(digits.len()).ok()?;
            if *point < n && n <= 15 {
                // A decimal of at most 15 digits round-trips through f64: serde_json
                // (ryu) writes its shortest spelling, these digits.
                let s = format!(
                    "{}0.{}e{point}",
                    if *neg { "-" } else { "" },
                    String::from_utf8(digits.clone()).ok()?
                );
                return Some(Value::from(s.parse::<f64>().ok()?));
            }
            if *point < n || *point > 18 {
                return None;
            }
            let mut s = String::from_utf8(digits.clone()).ok()?;
            if s.is_empty() {
                return Some(Value::from(0));
            }
            s.push_str(&"0".repeat((*point - n) as usize));
            let x: i64 = s.parse().ok()?;
            Value::from(if *neg { -x } else { x })
        }
        J::Str(u) => Value::String(plain(u)?),
        J::Arr(items) => Value::Array(items.iter().map(serde_value).collect::<Option<_>>()?),
        J::Obj(m) => Value::Object(
            m.iter()
                .map(|(n, x)| Some((plain(n)?, serde_value(x)?)))
                .collect::<Option<_>>()?,
        ),
    })
}

fn plain(u: &[Unit]) -> Option<String> {
    u.iter()
        .map(|x| match x {
            Unit::Char(c) => Some(*c),
            Unit::Lone(_) => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn every_spelling_of_a_value_has_one_digest(v in value(), s1 in any::<u64>(), s2 in any::<u64>()) {
        let (a, b) = (spelled(&v, s1), spelled(&v, s2));
        prop_assert!(matches!(canonical(&whole(), a.as_bytes()), Canonical::Json(_)), "{}", a);
        prop_assert_eq!(
            canonical(&whole(), a.as_bytes()),
            canonical(&whole(), b.as_bytes()),
            "{} vs {}", a, b
        );
        prop_assert_eq!(digest(&a), digest(&b));
    }

    #[test]
    fn another_value_has_another_digest(v in value(), pick in any::<u64>(), seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut p = pick % 12;
        let w = mutate(&v, &mut p, &mut r).unwrap_or_else(|| J::Arr(vec![v.clone()]));
        prop_assume!(w != v);
        let (a, b) = (spelled(&v, seed), spelled(&w, seed ^ 1));
        prop_assert_ne!(digest(&a), digest(&b), "{} vs {}", a, b);
    }

    #[test]
    fn two_random_values_share_a_form_only_when_equal(v in value(), w in value(), seed in any::<u64>()) {
        let a = canonical(&whole(), spelled(&v, seed).as_bytes());
        let b = canonical(&whole(), spelled(&w, seed ^ 7).as_bytes());
        prop_assert_eq!(a == b, v == w);
    }

    #[test]
    fn what_serde_json_holds_exactly_keeps_its_bytes(v in value(), seed in any::<u64>()) {
        if let Some(sv) = serde_value(&v) {
            let want = serde_json::to_vec(&sv).unwrap_or_default();
            prop_assert_eq!(
                canonical(&whole(), spelled(&v, seed).as_bytes()),
                Canonical::Json(want)
            );
        }
    }

    #[test]
    fn random_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        soup in prop::collection::vec(prop::sample::select(
            vec!["{", "}", "[", "]", "\"", ":", ",", "0", "1", "-", ".", "e", "E", "+", "\\",
                 "u", "d800", "\\u", "true", "null", " ", "\"a\"", "\"\\ud800\"", "1e999"]), 0..64),
        ptrs in prop::collection::vec("/[a0-1~]{0,2}(/[a0-1]{0,2})?", 1..4),
        only in any::<bool>(),
    ) {
        let soup = soup.concat();
        let sel = if only { JsonSelection::Only(ptrs) } else { JsonSelection::Ignore(ptrs) };
        for body in [&bytes[..], soup.as_bytes()] {
            let _ = canonical(&sel, body);
            let _ = canonical(&whole(), body);
        }
    }
}
