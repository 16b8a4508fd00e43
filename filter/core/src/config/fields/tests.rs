//! The field table against the parser, field by field: the same names (probed through
//! serde's unknown-field errors), both ends of every bound accepted and one past each
//! refused naming exactly that field, every enum value, every default, and the
//! committed reference and schema as the generators write them.

use super::super::raw::RawConfig;
use super::*;
use crate::config::Config;
use serde_json::{json, Value as Json};

#[path = "../../../tests/support/schema_check.rs"]
mod schema_check;

/// Whether the generated schema accepts `doc`.
fn schema_accepts(doc: &Json) -> Result<(), Vec<String>> {
    let errors = schema_check::validate(&json_schema(), doc);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Whether the schema can say that `value` at `path` is wrong: all but the bounds one
/// field sets on another (`wait_timeout_ms` ≤ `in_flight_timeout_seconds` × 1000, …),
/// which only the parser checks.
fn schema_can_tell(path: &str, value: &Json) -> bool {
    match field(&table_name(path)).map(|f| f.ty) {
        Some(Type::IntegerUpTo(u)) => value.as_u64().is_none_or(|v| v < u.min),
        _ => true,
    }
}

/// The error path of a field written at the top level (`key.headers`) or in the first
/// rule (`rules[0].key.headers`): every place it may be written.
fn paths(f: &Field) -> Vec<String> {
    match f.applies {
        Applies::Policy => vec![f.name.to_string(), f.path_in_rule(0)],
        Applies::Rule => vec![f.path_in_rule(0)],
        _ => vec![f.name.to_string()],
    }
}

/// Splits `rules[0].match.methods` into `rules`, `0`, `match`, `methods`.
fn segments(path: &str) -> Vec<Result<&str, usize>> {
    let mut out = Vec::new();
    for seg in path.split('.') {
        match seg.split_once('[') {
            Some((name, index)) => {
                out.push(Ok(name));
                out.push(Err(index.trim_end_matches(']').parse().unwrap()));
            }
            None => out.push(Ok(seg)),
        }
    }
    out
}

/// Writes `value` at `path` into `doc`, making the objects and the array entry on the way.
fn set(doc: &mut Json, path: &str, value: Json) {
    let segs = segments(path);
    let mut at = doc;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let next_is_index = matches!(segs.get(i + 1), Some(Err(_)));
        let fresh = || if next_is_index { json!([]) } else { json!({}) };
        at = match *seg {
            Ok(name) => {
                let map = at.as_object_mut().unwrap();
                if last {
                    map.insert(name.to_string(), value);
                    return;
                }
                map.entry(name.to_string()).or_insert_with(fresh)
            }
            Err(index) => {
                let list = at.as_array_mut().unwrap();
                while list.len() <= index {
                    list.push(json!({}));
                }
                if last {
                    list[index] = value;
                    return;
                }
                &mut list[index]
            }
        };
    }
}

/// The path's field as the table names it (`rules[0].ttl_seconds` → `ttl_seconds`).
fn table_name(path: &str) -> String {
    let inner = path.strip_prefix("rules[0].");
    match inner {
        Some(rest) if field(rest).is_some_and(|f| f.applies == Applies::Policy) => rest.to_string(),
        Some(rest) => format!("rules[].{rest}"),
        None => path.to_string(),
    }
}

/// The smallest configuration around `path` that a valid value there completes.
/// A field of regions (`store.region`, the home rules).
fn is_regional(path: &str) -> bool {
    path == "store.region"
        || ["store.home", "store.next_home", "store.previous_home"]
            .iter()
            .any(|h| path == *h || path.starts_with(&format!("{h}.")))
}

/// A regions configuration that parses, the field at `path` left for the test to set:
/// one shard in region `r`, this proxy in `r`, homed by scope header `x-h`.
fn regioned(path: &str) -> Json {
    let mut store = json!({
        "kind": "etcd",
        "shards": [{"cluster": "e", "region": "r"}],
        "region": "r",
        "home": {"header": "x-h", "default": "r"},
    });
    for h in ["store.next_home", "store.previous_home"] {
        if path.starts_with(&format!("{h}.")) {
            set(
                &mut store,
                &h["store.".len()..],
                json!({"header": "x-h", "default": "r"}),
            );
        }
    }
    let mut doc = json!({"scope": {"headers": ["x-h"]}, "store": store});
    if path.starts_with("store.") {
        // The field's own value comes from the test.
        if let Some(last) = path.rsplit('.').next() {
            let parent = &path[..path.len() - last.len() - 1];
            if let Some(o) = get_mut(&mut doc, parent).and_then(Json::as_object_mut) {
                o.remove(last);
            }
        }
    }
    doc
}

fn get_mut<'a>(doc: &'a mut Json, path: &str) -> Option<&'a mut Json> {
    path.split('.').try_fold(doc, |d, k| d.get_mut(k))
}

fn context(path: &str) -> Json {
    let mut doc = json!({});
    let (prefix, inner) = match path.strip_prefix("rules[0].") {
        Some(rest) => {
            set(
                &mut doc,
                "rules[0]",
                json!({"name": "r", "match": {"path_prefix": "/r"}}),
            );
            ("rules[0].", rest)
        }
        None => ("", path),
    };
    if inner.starts_with("match.") {
        set(&mut doc, "rules[0].match", json!({}));
        if inner.starts_with("match.header.") && inner != "match.header.name" {
            set(&mut doc, "rules[0].match.header", json!({"name": "x"}));
        }
    }
    if inner.starts_with("upstream.") && inner != "upstream.detached" {
        set(
            &mut doc,
            &format!("{prefix}upstream"),
            json!({"detached": true, "cluster": "c"}),
        );
    }
    if let Some(rest) = inner.strip_prefix("ordering.") {
        // A guard that parses; the field under test fills its own part.
        let mut o = json!({"entity": {"header": "x-e"}, "version": {"header": "x-v"}});
        match rest {
            "entity.header" | "entity.json_pointer" | "entity.parts" => o["entity"] = json!({}),
            "version.header" | "version.json_pointer" => o["version"] = json!({}),
            "acknowledge_status" => o["on_stale"] = json!("acknowledge"),
            _ => {}
        }
        if rest == "entity" || rest == "version" {
            o.as_object_mut().unwrap().remove(rest);
        }
        set(&mut doc, &format!("{prefix}ordering"), o);
    }
    if inner == "errors.body" {
        // A template, under a content type that takes any text.
        set(
            &mut doc,
            &format!("{prefix}errors"),
            json!({"format": "template", "content_type": "text/plain"}),
        );
    }
    if is_regional(path) {
        return regioned(path);
    }
    match field(&table_name(path)).map(|f| f.applies) {
        Some(Applies::Etcd) if path == "store.shards" => {
            set(&mut doc, "store", json!({"kind": "etcd"}))
        }
        Some(Applies::Etcd) => set(&mut doc, "store", json!({"kind": "etcd", "cluster": "e"})),
        _ if path == "store.max_store_bytes" => set(&mut doc, "capacity", json!(16)),
        _ => {}
    }
    if path == "store.max_record_bytes" {
        // The replay cap must fit a record: 0 fits the smallest.
        set(&mut doc, "max_replay_body_bytes", json!(0));
    }
    doc
}

/// `context(path)` with `value` at `path` (and what that value needs beside it).
fn doc_with(path: &str, value: Json) -> Json {
    let mut doc = context(path);
    let needs_cluster = value == json!(true) && path.ends_with("upstream.detached");
    let etcd = path == "store.kind" && value == json!("etcd");
    let template = path.ends_with("errors.format") && value == json!("template");
    set(&mut doc, path, value);
    if template {
        set(
            &mut doc,
            &path.replace("errors.format", "errors.body"),
            json!("{\"error\": \"{{type}}\"}"),
        );
    }
    if needs_cluster {
        set(
            &mut doc,
            &path.replace("upstream.detached", "upstream.cluster"),
            json!("c"),
        );
    }
    if etcd {
        set(&mut doc, "store.cluster", json!("e"));
    }
    doc
}

fn parse(doc: &Json) -> Result<Config, crate::config::ConfigError> {
    Config::parse(doc.to_string().as_bytes())
}

fn accepted(path: &str, value: Json) {
    let doc = doc_with(path, value);
    if let Err(e) = parse(&doc) {
        panic!("{doc} should parse: {e}");
    }
    if let Err(e) = schema_accepts(&doc) {
        panic!("the schema refuses {doc}, which the parser accepts: {e:?}");
    }
}

fn refused(path: &str, value: Json) {
    let tell = schema_can_tell(path, &value);
    let doc = doc_with(path, value);
    match parse(&doc) {
        Ok(_) => panic!("{doc} should be refused naming `{path}`"),
        Err(e) => assert_eq!(e.field, path, "{doc}: {e}"),
    }
    if tell {
        assert!(
            schema_accepts(&doc).is_err(),
            "the schema accepts {doc}, which the parser refuses"
        );
    }
}

/// `n` distinct valid entries of a list of `item`s.
fn items(item: Item, n: usize) -> Json {
    let letters = |i: usize| {
        let mut s = String::from("M");
        let mut k = i;
        loop {
            s.push((b'A' + (k % 26) as u8) as char);
            k /= 26;
            if k == 0 {
                break s;
            }
        }
    };
    let list: Vec<Json> = (0..n)
        .map(|i| match item {
            Item::HeaderName => json!(format!("x-h{i}")),
            Item::Method => json!(letters(i)),
            Item::Part => match PARTS.get(i) {
                Some(p) => json!(p),
                None => json!(format!("header:x-h{i}")),
            },
            Item::Status => json!(format!("{}", 200 + i)),
            Item::String => json!(format!("/f{i}")),
            Item::Rule => {
                json!({"name": format!("r{i}"), "match": {"path_prefix": format!("/r{i}")}})
            }
            Item::Shard => json!({"name": format!("s{i}"), "cluster": format!("etcd_s{i}")}),
        })
        .collect();
    Json::Array(list)
}

/// A valid value of the field (for strings, one whose first character repeated is
/// valid too).
fn sample(f: &Field) -> Json {
    match &f.ty {
        Type::Object => json!({}),
        Type::Bool => json!(true),
        Type::Integer(r) => json!(r.min),
        Type::IntegerUpTo(u) => json!(u.min),
        Type::Enum(values) => json!(values[0]),
        Type::List(item, len) => items(*item, len.min.max(1)),
        Type::Map(_) => json!({"v": "r"}),
        Type::String(_) => json!(match f.name {
            // `regioned`'s one region and scope header.
            "store.region"
            | "store.home.default"
            | "store.next_home.default"
            | "store.previous_home.default" => "r",
            "store.home.header" | "store.next_home.header" | "store.previous_home.header" => {
                "x-h"
            }
            "key.json_pointer" => "/id",
            "replayed_header" => "x-replayed",
            "store.namespace" => "n",
            "upstream.cluster" => "c",
            "store.cluster" => "e",
            "store.authority" => "a",
            "store.prefix" => "p",
            "rules[].name" => "r",
            "rules[].match.path_prefix" | "rules[].match.path_exact" => "/p",
            "rules[].match.authority" => "a",
            "rules[].match.header.name" => "x",
            "rules[].match.header.equals" => "v",
            "rules[].records_of" => "default",
            "ordering.entity.header" | "ordering.version.header" => "x",
            "principal.header" => "x-api-key",
            "principal.cookie" => "session",
            "errors.content_type" => "application/json",
            // Under `context`'s `text/plain`: any text, so its first character repeated too.
            "errors.body" => "x",
            "ordering.entity.json_pointer" | "ordering.version.json_pointer" => "/i",
            other => panic!("no sample string for `{other}`: add one"),
        }),
    }
}

/// The field names serde accepts in the object at `at` (a path whose value is an object,
/// `""` for the top level), read from its unknown-field error.
fn accepted_names(at: &str) -> Vec<String> {
    let mut doc = json!({});
    if at.is_empty() {
        set(&mut doc, "__probe__", json!(1));
    } else {
        set(&mut doc, &format!("{at}.__probe__"), json!(1));
    }
    let text = match serde_json::from_str::<RawConfig>(&doc.to_string()) {
        Ok(_) => panic!("{doc}: an unknown field was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(text.contains("unknown field `__probe__`"), "{text}");
    let expected = text.split_once("expected").map(|(_, r)| r).unwrap_or("");
    let expected = expected.split(" at line").next().unwrap_or("");
    expected
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, name)| name.to_string())
        .collect()
}

#[test]
fn the_table_names_exactly_the_fields_the_parser_accepts() {
    // Every object of the configuration, at the top level and in a rule.
    let objects: Vec<(&str, &str)> = vec![
        ("", ""),
        ("key", "key"),
        ("scope", "scope"),
        ("payload", "payload"),
        ("upstream", "upstream"),
        ("ordering", "ordering"),
        ("ordering.entity", "ordering.entity"),
        ("ordering.version", "ordering.version"),
        ("principal", "principal"),
        ("errors", "errors"),
        ("store", "store"),
        ("rules[0]", "rules[]"),
        ("rules[0].match", "rules[].match"),
        ("rules[0].match.header", "rules[].match.header"),
        ("rules[0].key", "key"),
        ("rules[0].scope", "scope"),
        ("rules[0].payload", "payload"),
        ("rules[0].upstream", "upstream"),
        ("rules[0].ordering", "ordering"),
        ("rules[0].principal", "principal"),
        ("rules[0].errors", "errors"),
        ("store.home", "store.home"),
        ("store.next_home", "store.next_home"),
        ("store.previous_home", "store.previous_home"),
    ];
    for (at, table) in &objects {
        let mut parser = accepted_names(at);
        let mut ours: Vec<String> = children(table)
            .iter()
            .map(|f| f.name.rsplit('.').next().unwrap().to_string())
            .collect();
        parser.sort();
        ours.sort();
        assert_eq!(
            ours, parser,
            "the table's fields of `{table}` (left) against what the parser accepts at `{at}`"
        );
    }
    // Every object in the table is one of those probed, so no field was left out.
    for f in FIELDS.iter().filter(|f| matches!(f.ty, Type::Object)) {
        assert!(
            objects.iter().any(|(_, t)| *t == f.name),
            "object `{}` is not probed",
            f.name
        );
    }
}

#[test]
fn every_field_parses_a_valid_value_wherever_it_applies() {
    for f in FIELDS {
        if matches!(f.ty, Type::Object) || f.name == "rules[].match" {
            continue;
        }
        for path in paths(f) {
            accepted(&path, sample(f));
        }
    }
}

#[test]
fn the_top_level_fields_are_refused_in_a_rule_naming_the_field() {
    for f in FIELDS.iter().filter(|f| f.applies == Applies::TopLevel) {
        let doc =
            json!({"rules": [{"name": "r", "match": {"path_prefix": "/r"}, f.name: sample(f)}]});
        let e = parse(&doc).unwrap_err();
        assert_eq!(e.field, format!("rules[0].{}", f.name), "{doc}: {e}");
        assert!(schema_accepts(&doc).is_err(), "the schema accepts {doc}");
    }
}

#[test]
fn a_store_field_of_the_other_kind_is_refused_naming_it() {
    let mut checked = 0;
    for f in FIELDS {
        let other = match f.applies {
            Applies::SharedData => json!({"kind": "etcd", "cluster": "e"}),
            Applies::Etcd => json!({"kind": "shared_data"}),
            _ => continue,
        };
        let mut doc = json!({"store": other});
        if f.name == "store.cluster" || f.name == "store.shards" {
            doc["store"] = json!({});
        }
        set(&mut doc, f.name, sample(f));
        let e = parse(&doc).unwrap_err();
        // A field of an object in `store` (`store.home.header`): the object is named.
        let top: Vec<&str> = f.name.splitn(3, '.').take(2).collect();
        assert_eq!(e.field, top.join("."), "{doc}: {e}");
        assert!(e.reason.contains("only applies to store.kind"), "{e}");
        assert!(schema_accepts(&doc).is_err(), "the schema accepts {doc}");
        checked += 1;
    }
    assert_eq!(checked, 27);
}

/// The bound of an `UpTo` field at `path`, with its bounding field at `bound` (or, with
/// `None`, at its default).
fn up_to_max(u: &UpTo, bound: Option<u64>) -> u64 {
    let bound = bound.unwrap_or_else(|| match field(u.field).map(|f| f.default) {
        Some(Shown::Json(Value::Int(n)) | Shown::JsonNote(Value::Int(n), _)) => n,
        other => panic!("`{}` has no integer default: {other:?}", u.field),
    });
    u.max(bound)
}

#[test]
fn both_ends_of_every_integer_range_parse_and_one_past_is_refused_naming_the_field() {
    let mut checked = 0;
    for f in FIELDS {
        for path in paths(f) {
            let (min, max) = match &f.ty {
                Type::Integer(r) => (r.min, r.max),
                Type::IntegerUpTo(u) => (u.min, up_to_max(u, None)),
                _ => continue,
            };
            accepted(&path, json!(min));
            accepted(&path, json!(max));
            refused(&path, json!(max + 1));
            if min > 0 {
                refused(&path, json!(min - 1));
            } else {
                // Not a number of the range at all.
                let doc = doc_with(&path, json!(-1));
                assert_eq!(parse(&doc).unwrap_err().field, path, "{doc}");
            }
            refused(&path, json!("1"));
            checked += 1;
        }
    }
    assert!(checked >= 24, "{checked}");
}

#[test]
fn a_bound_set_by_another_field_follows_that_field() {
    for f in FIELDS {
        let Type::IntegerUpTo(u) = &f.ty else {
            continue;
        };
        let bounding = field(u.field).unwrap();
        let Shown::Json(Value::Int(d)) = bounding.default else {
            panic!("{:?}", bounding.default)
        };
        let v = d / 2;
        for path in paths(f) {
            let prefix = path.strip_suffix(f.name).unwrap_or("");
            let doc = |value: u64| {
                let mut doc = doc_with(&path, json!(value));
                set(&mut doc, &format!("{prefix}{}", u.field), json!(v));
                doc
            };
            let max = up_to_max(u, Some(v));
            parse(&doc(max)).unwrap_or_else(|e| panic!("{}: {e}", doc(max)));
            let e = parse(&doc(max + 1)).unwrap_err();
            assert_eq!(e.field, path, "{}: {e}", doc(max + 1));
        }
    }
}

#[test]
fn every_length_bound_holds_at_both_ends() {
    let mut checked = 0;
    for f in FIELDS {
        for path in paths(f) {
            match &f.ty {
                Type::List(item, len) => {
                    accepted(&path, items(*item, len.min));
                    if len.min > 0 {
                        refused(&path, items(*item, len.min - 1));
                    }
                    if let Some(max) = len.max {
                        accepted(&path, items(*item, max));
                        let e = parse(&doc_with(&path, items(*item, max + 1))).unwrap_err();
                        assert_eq!(e.field, path, "{} + 1 entries: {e}", max);
                    }
                    refused(&path, json!("not a list"));
                }
                Type::String(len) => {
                    let unit = sample(f).as_str().unwrap().chars().next().unwrap();
                    if len.min > 0 {
                        refused(&path, json!(""));
                    }
                    if let Some(max) = len.max {
                        accepted(&path, json!(unit.to_string().repeat(max)));
                        refused(&path, json!(unit.to_string().repeat(max + 1)));
                    }
                    refused(&path, json!(1));
                }
                _ => continue,
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked}");
}

#[test]
fn every_enum_value_parses_and_another_is_refused_naming_the_field() {
    for f in FIELDS {
        for path in paths(f) {
            match &f.ty {
                Type::Enum(values) => {
                    for v in *values {
                        accepted(&path, json!(v));
                    }
                    refused(&path, json!("no-such-value"));
                }
                Type::Bool => {
                    accepted(&path, json!(true));
                    if path.ends_with("upstream.detached") {
                        // `false` takes no cluster: its context has none.
                        let mut doc = context(&path);
                        set(&mut doc, &path, json!(false));
                        parse(&doc).unwrap();
                    } else {
                        accepted(&path, json!(false));
                    }
                    refused(&path, json!("yes"));
                }
                _ => {}
            }
        }
    }
}

#[test]
fn every_default_is_what_the_parser_gives_when_the_field_is_absent() {
    let mut checked = 0;
    for f in FIELDS {
        let Some(default) = f.default.json() else {
            continue;
        };
        for path in paths(f) {
            let absent = parse(&context(&path)).unwrap();
            let written = parse(&doc_with(&path, default.clone()))
                .unwrap_or_else(|e| panic!("{path} = {default}: {e}"));
            assert_eq!(
                written, absent,
                "`{path}`: its default {default} is not the parser's"
            );
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked}");
    assert_eq!(
        parse(&json!({"store_statuses": DEFAULT_STORE_STATUSES_WRITTEN}))
            .unwrap()
            .policy
            .store_statuses,
        DEFAULT_STORE_STATUSES
    );
}

/// `store.max_store_bytes`'s default, as its formula in the table says.
fn formula(capacity: u64, largest_replay: u64) -> u64 {
    let buckets = capacity / crate::stores::shared::WAYS as u64;
    DEFAULT_MAX_STORE_BYTES.max(buckets * (largest_replay + STORED_HEADERS_ALLOWANCE))
}

#[test]
fn the_computed_default_of_max_store_bytes_is_its_formula() {
    let text = field("store.max_store_bytes").unwrap().default_text();
    assert!(
        text.contains(&format!(
            "max({DEFAULT_MAX_STORE_BYTES}, capacity / 16 × (max_replay_body_bytes + {STORED_HEADERS_ALLOWANCE}))"
        )),
        "{text}"
    );
    let with_defaults = formula(DEFAULT_CAPACITY, DEFAULT_MAX_REPLAY_BODY_BYTES);
    assert!(
        text.contains(&format!("about {} MiB", (with_defaults + (1 << 19)) >> 20)),
        "{text}"
    );
    for (capacity, top, rule) in [
        (DEFAULT_CAPACITY, DEFAULT_MAX_REPLAY_BODY_BYTES, 0),
        (16, 0, 0),
        (1600, 1024, 0),
        (16_000, 1024, 1 << 20),
        (10_000_000, 0, 0),
        (10_000_000, 16 << 20, 0),
        (4096, 65_536, 16 << 20),
    ] {
        let doc = json!({"capacity": capacity, "max_replay_body_bytes": top,
            "rules": [{"name": "r", "match": {"path_prefix": "/r"}, "max_replay_body_bytes": rule}]});
        let c = parse(&doc).unwrap();
        assert_eq!(
            c.max_store_bytes(),
            Some(formula(capacity, top.max(rule))),
            "{doc}"
        );
    }
}

#[test]
fn the_table_is_well_formed() {
    let mut names: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a field is listed twice");
    for f in FIELDS {
        // A range is written where the meaning says, and only there.
        assert_eq!(
            f.range_text().is_some(),
            f.meaning.contains("{range}"),
            "`{}`: {{range}} in its meaning iff it has bounds",
            f.name
        );
        // Every dotted field sits in an object of the table.
        if let Some((parent, _)) = f.name.rsplit_once('.') {
            let p = field(parent);
            assert!(
                p.is_some_and(|p| matches!(p.ty, Type::Object)) || parent == "rules[]",
                "`{}`: no object `{parent}`",
                f.name
            );
        }
        assert_eq!(
            f.name.starts_with("rules[]."),
            f.applies == Applies::Rule,
            "{}",
            f.name
        );
        assert_eq!(
            f.group == Group::Etcd,
            f.applies == Applies::Etcd,
            "{}",
            f.name
        );
        if let Type::IntegerUpTo(u) = &f.ty {
            assert!(
                field(u.field).is_some(),
                "{}: bound by `{}`",
                f.name,
                u.field
            );
        }
        assert!(
            !f.meaning.is_empty() && !f.meaning.contains('\n'),
            "{}",
            f.name
        );
    }
}

/// The committed file at `path` (from the workspace root) equals `generated`.
fn committed_matches(path: &str, generated: &str, command: &str) {
    let file = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} differs from the field table (filter/core/src/config/fields.rs): \
         run `make docs-ref` (or `cargo run -p dedup-envoy --bin dedupctl -- {command} > {path}`) \
         and commit it"
    );
}

#[test]
fn the_committed_reference_and_schema_are_the_generated_ones() {
    committed_matches(
        "docs/src/reference/fields.md",
        &reference_markdown(),
        "reference",
    );
    committed_matches("docs/config.schema.json", &schema_text(), "schema");
}

#[test]
fn the_schema_refuses_every_catalogued_config_refused_for_its_shape() {
    // Refusals of shape: what a JSON Schema can say. The others (header names, pointers,
    // rule names that clash, bounds between fields) only the parser checks.
    let shape = [
        "unknown field",
        "unknown variant",
        "invalid type",
        "invalid value",
        "expected value",
        "out of range",
        "at least one",
        "required",
        "only applies",
        "JSON object",
    ];
    let mut checked = 0;
    for line in include_str!("../../../testdata/refused-configs.txt").lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.splitn(3, '|').map(str::trim).collect();
        let (field, reason, config) = (parts[0], parts[1], parts[2]);
        let Ok(doc) = serde_json::from_str::<Json>(config) else {
            continue; // Not JSON at all.
        };
        let relative = field.ends_with("wait_timeout_ms")
            || field.ends_with("upstream.timeout_ms")
            || field.ends_with("max_replay_body_bytes");
        if shape.iter().any(|s| reason.contains(s)) && !relative {
            assert!(
                schema_accepts(&doc).is_err(),
                "the schema accepts {config}, which the parser refuses naming `{field}`"
            );
            checked += 1;
        } else {
            // The schema may accept it; it never refuses what the parser accepts, and
            // this the parser refuses, so nothing to compare.
        }
    }
    assert!(checked >= 40, "{checked}");
}

#[test]
fn the_schema_has_every_field_of_the_table_where_it_applies() {
    let schema = json_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    let at = |path: &str| -> Json {
        let mut s = &schema;
        for seg in path.split('.') {
            s = match seg {
                "rules[]" => &s["properties"]["rules"]["items"],
                name => &s["properties"][name],
            };
        }
        s.clone()
    };
    for f in FIELDS {
        let s = at(f.name);
        assert!(s.is_object(), "`{}` is not in the schema", f.name);
        assert_eq!(
            s["default"],
            f.default.json().unwrap_or(Json::Null),
            "{}",
            f.name
        );
        match &f.ty {
            Type::Object => assert_eq!(s["additionalProperties"], json!(false), "{}", f.name),
            Type::Integer(r) => {
                assert_eq!(
                    (s["minimum"].as_u64(), s["maximum"].as_u64()),
                    (Some(r.min), Some(r.max)),
                    "{}",
                    f.name
                )
            }
            // Every value, and `null` (the parser's "absent") but where it is required.
            Type::Enum(values) => {
                let mut want = json!(values);
                if !matches!(f.default, Shown::Text("required")) {
                    want.as_array_mut().unwrap().push(Json::Null);
                }
                assert_eq!(s["enum"], want, "{}", f.name)
            }
            _ => {}
        }
        if f.applies == Applies::Policy && !f.name.contains('.') {
            assert_eq!(
                at(&format!("rules[].{}", f.name)),
                s,
                "{} in a rule",
                f.name
            );
        }
    }
    assert_eq!(schema["additionalProperties"], json!(false));
}

#[test]
fn every_default_that_is_no_value_says_what_the_parser_does() {
    use crate::config::StoreConfig;
    let rule = |extra: Json| {
        let mut r = json!({"name": "r", "match": {"path_prefix": "/r"}});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        parse(&json!({"rules": [r]})).unwrap().rules.remove(0)
    };
    let mut checked = 0;
    for f in FIELDS {
        let Shown::Text(text) = f.default else {
            continue;
        };
        if text == "required" {
            let path = paths(f).remove(0);
            let mut doc = doc_with(&path, sample(f));
            let (parent, last) = path.rsplit_once('.').unwrap_or(("", &path));
            let pointer = format!("/{}", parent.replace('.', "/").replace("[0]", "/0"));
            let parent_value = doc.pointer_mut(&pointer).unwrap();
            parent_value.as_object_mut().unwrap().remove(last);
            let e = parse(&doc).unwrap_err();
            // serde names the object a required field is missing from, and the field.
            let missing = e.field == parent && e.reason == format!("missing field `{last}`");
            assert!(e.field == path || missing, "{doc}: {e}");
            checked += 1;
            continue;
        }
        let c = parse(&json!({})).unwrap();
        let p = &c.policy;
        match f.name {
            "key" | "scope" | "payload" | "upstream" | "store" => {}
            "ordering" => assert_eq!(p.ordering, None),
            "ordering.entity.header"
            | "ordering.entity.json_pointer"
            | "ordering.entity.parts"
            | "ordering.version.header"
            | "ordering.version.json_pointer" => {
                // One of them is needed; which one is the user's choice.
                let c = parse(
                    &json!({"ordering": {"entity": {"header": "e"}, "version": {"header": "v"}}}),
                )
                .unwrap();
                let o = c.policy.ordering.unwrap();
                assert_eq!(o.entity, crate::config::EntitySource::Header("e".into()));
            }
            "principal" => assert_eq!(
                p.principal,
                crate::config::PrincipalSource::Header("authorization".into())
            ),
            "principal.cookie" | "principal.metadata" | "principal.none" => {
                // One source is used; with none given it is the `authorization` header.
                assert!(matches!(
                    p.principal,
                    crate::config::PrincipalSource::Header(_)
                ))
            }
            "key.json_pointer" => assert_eq!(p.json_pointer, None),
            "key.fingerprint" => assert!(p.fingerprint.is_empty()),
            "payload.parts" => assert_eq!(p.payload.parts, None),
            "payload.json_pointers" | "payload.ignore_json_pointers" => {
                assert_eq!(p.payload, crate::payload::PayloadConfig::default())
            }
            "upstream.cluster" => assert_eq!(p.detached, None, "no cluster: not detached"),
            "upstream.client_timeout_ms" => {
                let c = parse(&json!({"upstream": {"detached": true, "cluster": "c"}})).unwrap();
                assert_eq!(c.policy.detached.unwrap().client_timeout_ms, None);
            }
            "store.authority" => {
                let c = parse(&json!({"store": {"kind": "etcd", "cluster": "etcd-c"}})).unwrap();
                let StoreConfig::Etcd(e) = c.store else {
                    panic!("{:?}", c.store)
                };
                assert_eq!(e.shards[0].authority, "etcd-c", "{text}");
            }
            "rules[].match.path_prefix" | "rules[].match.path_exact" => {
                let r = rule(json!({"match": {"methods": ["POST"]}}));
                assert_eq!((r.matcher.path_prefix, r.matcher.path_exact), (None, None));
            }
            "store.cluster" => {
                // Required without store.shards (named), and not with it.
                let e = parse(&json!({"store": {"kind": "etcd"}})).unwrap_err();
                assert_eq!(e.field, "store.cluster", "{e}");
                let c = parse(&json!({"store": {"kind": "etcd", "shards": [{"cluster": "a"}]}}));
                assert!(c.is_ok());
            }
            "store.shards" => {
                let c = parse(&json!({"store": {"kind": "etcd", "cluster": "etcd-c"}})).unwrap();
                let StoreConfig::Etcd(e) = c.store else {
                    panic!("{:?}", c.store)
                };
                assert_eq!(e.shards.len(), 1);
                assert_eq!(
                    (e.shards[0].name.as_str(), e.shards[0].cluster.as_str()),
                    ("etcd-c", "etcd-c")
                );
            }
            "store.region" | "store.home" | "store.next_home" | "store.previous_home" => {
                let c = parse(&json!({"store": {"kind": "etcd", "cluster": "etcd-c"}})).unwrap();
                let StoreConfig::Etcd(e) = c.store else {
                    panic!("{:?}", c.store)
                };
                assert_eq!((e.regions, e.check), (None, None));
            }
            "store.home.map" | "store.next_home.map" | "store.previous_home.map" => {
                let c = parse(&regioned(f.name)).unwrap();
                let StoreConfig::Etcd(e) = c.store else {
                    panic!("{:?}", c.store)
                };
                let rule = match f.name {
                    "store.home.map" => e.regions.map(|r| r.home),
                    _ => e.check.and_then(|c| c.home),
                };
                assert!(rule.unwrap().map.is_empty(), "{}", f.name);
            }
            "store.previous_shards" | "store.next_shards" => {
                let c = parse(&json!({"store": {"kind": "etcd", "cluster": "etcd-c"}})).unwrap();
                let StoreConfig::Etcd(e) = c.store else {
                    panic!("{:?}", c.store)
                };
                assert_eq!(e.check, None);
            }
            "errors" => assert_eq!(p.errors, crate::config::ErrorFormat::default()),
            "errors.content_type" => {
                let of = |format: &str| {
                    let c = parse(&json!({"errors": {"format": format, "body": "{}"}}));
                    let c = c.or_else(|_| parse(&json!({"errors": {"format": format}})));
                    c.unwrap().policy.errors.content_type
                };
                assert_eq!(p.errors.content_type, "application/problem+json");
                assert_eq!(of("stripe"), "application/json");
                assert_eq!(of("template"), "application/json");
            }
            "errors.body" => {
                let e = parse(&json!({"errors": {"format": "template"}})).unwrap_err();
                assert_eq!(e.field, "errors.body", "{e}");
            }
            "rules[].match.methods" => assert_eq!(rule(json!({})).matcher.methods, None),
            "rules[].match.authority" => assert_eq!(rule(json!({})).matcher.authority, None),
            "rules[].match.header" => assert_eq!(rule(json!({})).matcher.header, None),
            "rules[].match.header.equals" => {
                let r = rule(json!({"match": {"header": {"name": "x"}}}));
                assert_eq!(r.matcher.header.unwrap().equals, None);
            }
            "rules[].records_of" => {
                assert_eq!(
                    rule(json!({})).policy.records.as_deref(),
                    Some("r"),
                    "its own"
                )
            }
            other => panic!("`{other}`: say what its default {text:?} means here"),
        }
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
}
