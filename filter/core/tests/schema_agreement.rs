//! The JSON Schema (`docs/config.schema.json`) and the parser (`Config::parse`, what
//! `dedupctl check-config` and the filter run) agree wherever the schema decides:
//! generated configurations, valid and broken in every way the table knows (bounds and
//! one past them, `null`, `60.0` and `1e3`, wrong types, bad names and pointers, rules
//! sharing names, one cluster and shards, both pointer lists, …), are checked by both.
//! - The schema refuses: the parser must refuse too (no false failure in an editor).
//! - The schema accepts and the parser refuses: the field the parser names must be one
//!   of `UNCHECKED`, the rules the reference lists as the filter's alone (no false pass
//!   for any rule a schema can say).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support {
    pub mod schema_check;
}

use dedup_core::config::fields::{children, json_schema, Field, Item, Type, UNCHECKED};
use dedup_core::config::Config;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A small deterministic generator (xorshift), driven by proptest's seed.
struct Gen(u64, u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())].clone()
    }
    /// Whether to write something wrong here (this configuration's error rate).
    fn wrong(&mut self) -> bool {
        let rate = self.1;
        self.chance(rate)
    }
    /// A string of `pool` (see `strings`): a valid one unless `wrong`.
    fn pick_str(&mut self, pool: &[String]) -> String {
        let cut = pool.iter().position(|s| s == "|").unwrap_or(pool.len());
        let (valid, invalid) = (&pool[..cut], &pool[(cut + 1).min(pool.len())..]);
        if (self.wrong() && !invalid.is_empty()) || valid.is_empty() {
            self.pick(invalid)
        } else {
            self.pick(valid)
        }
    }
}

/// Strings for a field, by the field (or list) name: those before the `"|"` entry are
/// valid for it (alone), those after are not.
fn strings(name: &str) -> Vec<String> {
    let v: &[&str] = match name {
        "key.headers"
        | "principal.header"
        | "replayed_header"
        | "ordering.entity.header"
        | "ordering.version.header"
        | "rules[].match.header.name" => &[
            "x-tenant",
            "X-Api-Key",
            "idempotency-key",
            "x-a",
            "|",
            "bad header",
            "",
            "x-request-id",
            "x-forwarded-for",
            ":authority",
        ],
        "scope.headers" => &[
            "x-tenant",
            ":authority",
            ":PATH",
            "x-a",
            "|",
            "X-Tenant",
            "bad header",
            "",
            "x-request-id",
        ],
        "principal.cookie" => &["sid", "|", "bad;", "", "a b"],
        "key.json_pointer"
        | "payload.json_pointers"
        | "payload.ignore_json_pointers"
        | "ordering.entity.json_pointer"
        | "ordering.version.json_pointer" => &["/id", "/a~1b", "/", "|", "/a~2", "id", "", "/a~"],
        "rules[].match.path_prefix" | "rules[].match.path_exact" => {
            &["/v1", "/", "|", "/a?b", "v1", "/a\u{1}"]
        }
        "rules[].match.authority" => &[
            "api.example.com",
            "API.example.com:8080",
            "|",
            "a b",
            "x/y",
            "",
        ],
        "rules[].match.header.equals" => &["v", "", "|", "a\nb"],
        "store.authority" => &["etcd", "|", "a b", ""],
        "store.region"
        | "store.home.default"
        | "store.next_home.default"
        | "store.previous_home.default"
        | "store.home.map"
        | "store.next_home.map"
        | "store.previous_home.map" => &["eu", "us", "|", "", "a b"],
        "store.home.header" | "store.next_home.header" | "store.previous_home.header" => {
            &["x-tenant", "x-a", "|", "", "bad header"]
        }
        "store.prefix" => &[
            "proxy-dedup/",
            "|",
            "",
            "a\u{7f}",
            "üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü",
        ],
        "upstream.cluster" => &["service", "payments", "|", "", "a\u{7}"],
        "principal.metadata" => &[
            "envoy.filters.http.jwt_authn",
            "jwt_payload",
            "sub",
            "|",
            "",
            "a\u{0}b",
        ],
        "store_statuses" => &[
            "2xx", "4xx", "409", "!404", "!2xx", "|", "600", "abc", "2XX",
        ],
        "rules[].name" | "rules[].records_of" => &["a", "b", "|", "default", "bad name", "zz"],
        "store.namespace" => &["ns", "proxy-dedup", "|", "a/b", ""],
        "store.cluster" => &[
            "etcd",
            "etcd_a",
            "|",
            "",
            "a-cluster-name-longer-than-sixty-four-characters-is-no-shard-name-x",
        ],
        "store.kind" => &["etcd", "shared_data", "|", "bogus"],
        "store.protocol" => &["grpc", "json", "|", "h3"],
        "store.eviction" => &["own_scope", "oldest", "|", "newest"],
        "methods" => &["POST", "PUT", "|", "get", ""],
        "parts" => &[
            "method",
            "path",
            "body",
            "query",
            "header:x-a",
            "header::authority",
            "|",
            "header:bad h",
            "bogus",
        ],
        _ => &["x", "|", ""],
    };
    v.iter().map(|s| s.to_string()).collect()
}

fn integer(g: &mut Gen, min: u64, max: u64) -> Value {
    if !g.wrong() {
        return match g.below(4) {
            0 => json!(min),
            1 => json!(max),
            2 => json!(min as f64),
            _ => json!(min + g.next() % (max - min + 1).max(1)),
        };
    }
    match g.below(10) {
        0 => json!(min),
        1 => json!(max),
        2 => json!(min.saturating_sub(1)),
        3 => json!(max.saturating_add(1)),
        4 => json!((min / 2 + max / 2) as f64), // 60.0 style
        5 => serde_json::from_str(&format!("{}e0", min.max(1))).unwrap(),
        6 => json!(1.5),
        7 => json!(-1),
        8 => json!("10"),
        _ => json!(min + g.next() % (max - min + 1).max(1)),
    }
}

fn item(g: &mut Gen, item: Item, list: &str) -> Value {
    match item {
        Item::Method => json!(g.pick_str(&strings("methods"))),
        Item::Part => json!(g.pick_str(&strings("parts"))),
        Item::Rule => rule(g),
        Item::Shard => {
            let mut s = Map::new();
            if g.chance(50) {
                s.insert("name".into(), json!(g.pick(&["a", "b", "", "a b", "c"])));
            }
            if g.chance(90) {
                s.insert(
                    "cluster".into(),
                    json!(g.pick(&["etcd_a", "etcd_b", "etcd_c", ""])),
                );
            }
            if g.chance(20) {
                s.insert("authority".into(), json!(g.pick(&["h", "a b"])));
            }
            if g.chance(40) {
                s.insert("region".into(), json!(g.pick(&["eu", "us", "", "a b"])));
            }
            Value::Object(s)
        }
        _ => json!(g.pick_str(&strings(list))),
    }
}

/// A value for `f` (its name as the table writes it).
fn value(g: &mut Gen, f: &Field) -> Value {
    if g.chance(4) {
        return Value::Null;
    }
    if g.wrong() && g.chance(10) {
        return json!(["wrong type"]);
    }
    match &f.ty {
        Type::Object => object(g, f.name),
        Type::Bool => json!(g.chance(50)),
        Type::Integer(r) => integer(g, r.min, r.max),
        Type::IntegerUpTo(u) => {
            let pool = [u.min, 0, 1000, 5000, 9999, 10000, 30000, 60000];
            if g.chance(15) {
                json!(g.pick(&pool) as f64)
            } else {
                json!(g.pick(&pool))
            }
        }
        Type::String(_) => json!(g.pick_str(&strings(f.name))),
        Type::Enum(values) => {
            if g.wrong() {
                json!("bogus")
            } else {
                json!(g.pick(values))
            }
        }
        Type::List(it, len) => {
            let most = len.max.unwrap_or(4).min(4);
            let n = g.below(most + 2);
            Value::Array((0..n).map(|_| item(g, *it, f.name)).collect())
        }
        Type::Map(_) => {
            let n = g.below(3);
            let mut m = Map::new();
            for _ in 0..n {
                let key = g.pick(&["acme", "globex", ""]);
                m.insert(key.to_string(), json!(g.pick_str(&strings(f.name))));
            }
            Value::Object(m)
        }
    }
}

/// An object of the fields under `parent`, each present at random.
fn object(g: &mut Gen, parent: &str) -> Value {
    let fields = children(parent);
    let chance = if parent.is_empty() { 15 } else { 40 };
    let mut m = Map::new();
    for f in fields {
        if f.name == "rules" && !g.chance(40) {
            continue;
        }
        if g.chance(chance) {
            let key = f.name.rsplit('.').next().unwrap();
            m.insert(key.to_string(), value(g, f));
        }
    }
    Value::Object(m)
}

fn rule(g: &mut Gen) -> Value {
    let mut r = object(g, "rules[]");
    // Mostly a rule the parser gets past its name and match, so the policy is checked.
    if g.chance(85) {
        r["name"] = json!(g.pick(&["a", "b", "c"]));
    }
    if g.chance(85) {
        r["match"] = json!({"path_prefix": g.pick(&["/a", "/b"])});
    }
    r
}

/// The field a parser error names, with rule indexes dropped (`rules[2].x` → `rules[].x`).
fn normalized(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '[' {
            while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                chars.next();
            }
        }
    }
    out
}

/// Whether the parser's error field is one of the rules only it checks.
fn unchecked(field: &str) -> bool {
    let f = normalized(field);
    let bare = f.strip_prefix("rules[].").unwrap_or(&f);
    UNCHECKED.iter().any(|(u, _)| {
        [f.as_str(), bare]
            .iter()
            .any(|x| *x == *u || x.starts_with(&format!("{u}[")) || x.starts_with(&format!("{u}.")))
    })
}

/// Checks one configuration; `Err` says how the two disagree.
fn agree(doc: &Value, schema: &Value) -> Result<bool, String> {
    let errors = support::schema_check::validate(schema, doc);
    let parsed = Config::parse(doc.to_string().as_bytes());
    match (errors.is_empty(), parsed) {
        (false, Ok(_)) => Err(format!(
            "the schema refuses what the parser accepts: {doc}\n{errors:?}"
        )),
        (true, Err(e)) if !unchecked(&e.field) => Err(format!(
            "the parser refuses what the schema accepts, naming `{}` (not in UNCHECKED): {e}\n{doc}",
            e.field
        )),
        (valid, _) => Ok(valid),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    #[test]
    fn the_schema_and_the_parser_agree_wherever_the_schema_decides(seed in 1u64..) {
        let schema = json_schema();
        // A third of the configurations with nothing wrong written on purpose, the
        // others with 2% to 30% of their values wrong.
        let rate = [0, 0, 0, 2, 5, 10, 30][(seed % 7) as usize];
        let mut g = Gen(seed, rate);
        let doc = object(&mut g, "");
        if let Err(e) = agree(&doc, &schema) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// The cases the issue named, and some the generator may rarely reach.
#[test]
fn the_named_cases_agree() {
    let schema = json_schema();
    let cases = [
        json!({"ordering": {"enabled": false}}),
        json!({"ordering": {"enabled": false, "ttl_seconds": 0}}),
        json!({"ttl_seconds": null, "key": null, "store": {"kind": null}}),
        json!({"ttl_seconds": 60.0}),
        serde_json::from_str::<Value>(r#"{"ttl_seconds": 1e3}"#).unwrap(),
        json!({"ttl_seconds": 60.5}),
        json!({"payload": {"json_pointers": ["/a"], "ignore_json_pointers": ["/b"]}}),
        json!({"payload": {"json_pointers": ["/a"], "ignore_json_pointers": null}}),
        json!({"payload": {"json_pointers": ["/a"], "parts": ["method"]}}),
        json!({"store": {"kind": "etcd", "shards": [{"cluster": "a"}], "next_shards": [{"cluster": "a"}], "previous_shards": [{"cluster": "a"}]}}),
        json!({"store": {"kind": "etcd", "cluster": "e", "shards": [{"cluster": "a"}]}}),
        json!({"principal": {}}),
        json!({"principal": {"none": false}}),
        json!({"principal": {"none": false, "cookie": "s"}}),
        json!({"principal": {"header": "x-user", "cookie": "s"}}),
        json!({"rules": [{"name": "a", "match": {"path_prefix": "/a", "path_exact": "/a"}}]}),
        json!({"rules": [{"name": "a", "match": {"path_prefix": null}}]}),
        json!({"rules": [{"name": "a", "match": {"path_prefix": "/a"}, "bypass": true, "ttl_seconds": 5}]}),
        json!({"rules": [{"name": "default", "match": {"path_prefix": "/a"}}]}),
        json!({"ordering": {"entity": {"header": "x-e"}, "version": {"header": "x-v"}, "acknowledge_status": 204}}),
        json!({"store_statuses": ["!404"]}),
    ];
    for doc in cases {
        agree(&doc, &schema).unwrap_or_else(|e| panic!("{e}"));
    }
    // The issue's false failure is gone: the schema takes what the filter documents.
    let ok = |doc: Value| support::schema_check::validate(&schema, &doc).is_empty();
    assert!(ok(json!({"ordering": {"enabled": false}})));
    assert!(ok(json!({"ttl_seconds": null})));
    // And its false passes: both refuse.
    assert!(!ok(
        json!({"payload": {"json_pointers": ["/a"], "ignore_json_pointers": ["/b"]}})
    ));
    assert!(!ok(
        json!({"store": {"kind": "etcd", "shards": [{"cluster": "a"}], "next_shards": [{"cluster": "a"}], "previous_shards": [{"cluster": "a"}]}})
    ));
    assert!(Config::parse(br#"{"ttl_seconds": 1e3}"#).is_ok());
}

/// The generator reaches both sides: many configurations both accept, many both refuse,
/// and the schema decides (refuses) a good share of those the parser refuses.
#[test]
fn the_generated_configurations_are_both_valid_and_not() {
    let schema = json_schema();
    let (mut valid, mut refused_by_schema, mut only_parser) = (0, 0, 0);
    for seed in 1..=1500u64 {
        let rate = [0, 0, 0, 2, 5, 10, 30][(seed % 7) as usize];
        let doc = object(
            &mut Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, rate),
            "",
        );
        match agree(&doc, &schema) {
            Ok(true) if Config::parse(doc.to_string().as_bytes()).is_ok() => valid += 1,
            Ok(true) => only_parser += 1,
            Ok(false) => refused_by_schema += 1,
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("{valid} valid, {refused_by_schema} refused by both, {only_parser} refused by the parser alone (UNCHECKED)");
    assert!(
        valid >= 300 && refused_by_schema >= 300,
        "{valid} valid, {refused_by_schema} refused"
    );
}
