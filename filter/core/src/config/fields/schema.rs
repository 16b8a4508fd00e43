//! The JSON Schema (draft 2020-12) of the configuration (`docs/config.schema.json`), for
//! editors and CI: types, defaults, bounds, enums, `additionalProperties: false`, the
//! syntax of names, pointers, paths and statuses, and every rule between fields of one
//! object the schema can say (`if`/`then`, `not`, `oneOf`, `contains`). It agrees with
//! the parser (`dedupctl check-config`): `null` is accepted wherever the parser takes it
//! for "absent", a whole number in any notation is an integer for both, and what only
//! the parser checks is listed in [`UNCHECKED`] (and the reference): a property test
//! (`filter/core/tests/schema_agreement.rs`) holds the two to that.

use super::{children, Applies, Field, Item, Len, Shown, Type};
use serde_json::{json, Map, Value};

/// A request header name: an RFC 9110 token.
pub const HEADER_NAME: &str = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";
/// A header name, or one of the pseudo-headers `:authority`, `:path`, `:method` (any case).
pub const HEADER_OR_PSEUDO: &str = "^([!#$%&'*+.^_`|~0-9A-Za-z-]+|:[Aa][Uu][Tt][Hh][Oo][Rr][Ii][Tt][Yy]|:[Pp][Aa][Tt][Hh]|:[Mm][Ee][Tt][Hh][Oo][Dd])$";
/// A request part of a fingerprint or payload check.
pub const PART: &str = "^(method|path|query|body|header:([!#$%&'*+.^_`|~0-9A-Za-z-]+|:[Aa][Uu][Tt][Hh][Oo][Rr][Ii][Tt][Yy]|:[Pp][Aa][Tt][Hh]|:[Mm][Ee][Tt][Hh][Oo][Dd]))$";
/// An upper-case HTTP method.
pub const METHOD: &str = "^[A-Z]+$";
/// An RFC 6901 JSON pointer into a body (not the whole document): `~` only as `~0`, `~1`.
pub const POINTER: &str = "^(/([^~]|~[01])*)+$";
/// A rule's path: from `/`, no query, no control character.
pub const PATH: &str = "^/[^?\\u0000-\\u001f\\u007f-\\u009f]*$";
/// A host: no control character, space or `/`.
pub const HOST: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f /]+$";
/// An authority of the calls to etcd: no control character or space.
pub const AUTHORITY: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f ]+$";
/// Text without control characters (an etcd prefix).
pub const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";
/// A header value to match: no control character (may be empty).
pub const HEADER_VALUE: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";
/// An Envoy cluster name of a detached upstream: no ASCII control character.
pub const CLUSTER: &str = "^[^\\u0000-\\u001f\\u007f]+$";
/// A metadata key: no NUL.
pub const NO_NUL: &str = "^[^\\u0000]+$";
/// A status class or code, `!` to exclude.
pub const STATUS: &str = "^!?([1-5]xx|[1-5][0-9][0-9])$";
/// A status entry that includes (no `!`).
pub const INCLUDING_STATUS: &str = "^[1-5]";
/// A rule name.
pub const RULE_NAME: &str = "^[A-Za-z0-9_.-]+$";
/// A shared-data namespace: visible ASCII but `/`.
pub const NAMESPACE: &str = "^[!-.0-~]+$";
/// Visible ASCII (a shard name).
pub const VISIBLE: &str = "^[!-~]+$";

/// The rules only the parser checks: the field its error names (`rules[]` for any rule)
/// and the rule. A schema cannot compare one field's value with another's, look across
/// rules or shard maps, fold case, or count bytes (it counts characters).
pub const UNCHECKED: &[(&str, &str)] = &[
    ("wait_timeout_ms", "at most the policy's `in_flight_timeout_seconds` × 1000 (in a rule, its own or the inherited one)"),
    ("upstream.timeout_ms", "below the policy's `in_flight_timeout_seconds` × 1000, the default 10000 and an inherited value included (so `in_flight_timeout_seconds` of 10 or less needs a lower `upstream.timeout_ms`)"),
    ("upstream.client_timeout_ms", "below `upstream.timeout_ms`"),
    ("max_waiters_per_scope", "at most `max_waiters`"),
    ("store.max_store_bytes", "at least `capacity` / 16 × 4096"),
    ("max_replay_body_bytes", "with the etcd store, at most `store.max_record_bytes` less the record's own bytes, in every policy"),
    ("rules[].name", "unique among the rules"),
    ("rules[].records_of", "names another rule (or `default`) that shares no records itself, is not bypassed, and has the same `key`, `scope`, `payload` and `principal` settings"),
    ("store.name", "`store.cluster` is the one shard's name too: 1-64 visible ASCII characters"),
    ("store.shards", "names and clusters unique within a map"),
    ("store.previous_shards", "names and clusters unique within the map; a shard named in both maps is the same cluster (and authority), and a cluster keeps its name"),
    ("store.next_shards", "as `store.previous_shards`"),
    ("store.shards[].region", "required on every shard with `store.home`, refused without it"),
    ("store.previous_shards[].region", "on every shard of the map or on none; with regions, a home rule (`store.previous_home`, else `store.home`) whose regions all have a shard there"),
    ("store.next_shards[].region", "as `store.previous_shards[].region`, with `store.next_home`"),
    ("store.region", "only with `store.home`, and required with it; names a region of `store.shards`"),
    ("store.home", "needs `store.shards` (not `store.cluster`)"),
    ("store.home.header", "one of `scope.headers`, and of every rule's"),
    ("store.home.default", "a region of `store.shards`"),
    ("store.home.map", "each value a region of `store.shards`; keys of 1-256 bytes"),
    ("store.next_home", "not with `store.previous_shards` or `store.previous_home`; without `store.home`, only with `store.next_shards` (with regions)"),
    ("store.next_home.header", "as `store.home.header`"),
    ("store.next_home.default", "a region of the next map (`store.next_shards`, else `store.shards`)"),
    ("store.next_home.map", "as `store.home.map`, against the next map"),
    ("store.previous_home", "not with `store.next_shards` or `store.next_home`; without `store.home`, only with `store.previous_shards` (with regions)"),
    ("store.previous_home.header", "as `store.home.header`"),
    ("store.previous_home.default", "a region of the previous map (`store.previous_shards`, else `store.shards`)"),
    ("store.previous_home.map", "as `store.home.map`, against the previous map"),
    ("scope.headers", "no header twice, compared case-insensitively; `x-request-id` only with `request_id_preserved: true`"),
    ("key.fingerprint", "no part twice, header names compared case-insensitively; no `header:x-request-id` without `request_id_preserved: true`"),
    ("payload.parts", "no part twice, header names compared case-insensitively"),
    ("ordering.entity.parts", "no part twice, header names compared case-insensitively"),
    ("key.headers", "no header Envoy sets itself (`x-forwarded-for`, …); `x-request-id` only with `request_id_preserved: true` (case-insensitively)"),
    ("principal.header", "`x-request-id` only with `request_id_preserved: true` (case-insensitively)"),
    ("store.prefix", "at most 128 bytes (UTF-8), not characters"),
    ("upstream.cluster", "at most 256 bytes (UTF-8), not characters"),
    ("principal.metadata", "each entry at most 256 bytes (UTF-8), not characters"),
    ("errors.body", "names only the variables `{{status}}`, `{{type}}`, `{{title}}`, `{{detail}}`, `{{retry_after}}` (or their `_json` forms) and closes every `{{`; with a JSON `content_type`, renders as JSON whatever the values"),
    ("(root)", "a member named twice in one object (JSON Schema sees only one of them)"),
];

fn lengths(schema: &mut Map<String, Value>, len: &Len, min_key: &str, max_key: &str) {
    if len.min > 0 {
        schema.insert(min_key.into(), len.min.into());
    }
    if let Some(max) = len.max {
        schema.insert(max_key.into(), max.into());
    }
}

/// Neither absent nor `null`.
fn not_null() -> Value {
    json!({"not": {"type": "null"}})
}

/// Every one of `names` is given (present and not `null`), in an object (a condition
/// must not hold vacuously of a `null` standing for an absent object).
fn given(names: &[&str]) -> Value {
    let props: Map<String, Value> = names.iter().map(|n| (n.to_string(), not_null())).collect();
    json!({"type": "object", "required": names, "properties": props})
}

/// None of `names` is given (each absent or `null`, which the parser reads as absent).
fn none_of<'a>(names: impl IntoIterator<Item = &'a str>) -> Value {
    let props: Map<String, Value> = names
        .into_iter()
        .map(|n| (n.to_string(), json!({"type": "null"})))
        .collect();
    json!({ "properties": props })
}

/// `name` is given with the value `v`.
fn is(name: &str, v: Value) -> Value {
    json!({"type": "object", "required": [name], "properties": {name: {"const": v}}})
}

/// The pattern of a string field, or of a list's entries, by the field's name.
fn pattern_of(name: &str) -> Option<&'static str> {
    Some(match name {
        "key.headers"
        | "principal.header"
        | "replayed_header"
        | "ordering.entity.header"
        | "ordering.version.header"
        | "rules[].match.header.name"
        | "principal.cookie" => HEADER_NAME,
        "scope.headers" => HEADER_OR_PSEUDO,
        "key.json_pointer"
        | "payload.json_pointers"
        | "payload.ignore_json_pointers"
        | "ordering.entity.json_pointer"
        | "ordering.version.json_pointer" => POINTER,
        "rules[].match.path_prefix" | "rules[].match.path_exact" => PATH,
        "rules[].match.authority" => HOST,
        "rules[].match.header.equals" => HEADER_VALUE,
        "store.authority" => AUTHORITY,
        "store.prefix" => NO_CONTROL,
        "upstream.cluster" => CLUSTER,
        "principal.metadata" => NO_NUL,
        "store_statuses" => STATUS,
        "rules[].name" => RULE_NAME,
        "store.namespace" => NAMESPACE,
        // Visible ASCII and inner spaces.
        "errors.content_type" => "^[!-~]([ -~]*[!-~])?$",
        _ => return None,
    })
}

fn item_schema(item: Item, list: &str) -> Value {
    let mut s = match item {
        Item::HeaderName | Item::Status | Item::String => json!({"type": "string", "minLength": 1}),
        Item::Method => json!({"type": "string", "pattern": METHOD}),
        Item::Part => json!({"type": "string", "pattern": PART}),
        Item::Rule => rule_schema(),
        Item::Shard => json!({
            "type": "object",
            "properties": {
                "name": {"type": ["string", "null"], "minLength": 1, "maxLength": super::MAX_SHARD_NAME_BYTES, "pattern": VISIBLE},
                "cluster": {"type": "string", "minLength": 1},
                "authority": {"type": ["string", "null"], "minLength": 1, "pattern": AUTHORITY},
                "region": {"type": ["string", "null"], "minLength": 1, "maxLength": super::MAX_SHARD_NAME_BYTES, "pattern": VISIBLE},
            },
            "required": ["cluster"],
            "additionalProperties": false,
        }),
    };
    if let (Some(p), Some(m)) = (pattern_of(list), s.as_object_mut()) {
        m.insert("pattern".into(), p.into());
    }
    if list == "principal.metadata" {
        s["maxLength"] = 256.into();
    }
    s
}

/// Whether the parser needs the field (`null` is then refused as missing). An
/// ordering's entity and version are needed unless `enabled: false` (its `if`).
fn required(f: &Field) -> bool {
    matches!(f.default, Shown::Text("required"))
        && !matches!(f.name, "ordering.entity" | "ordering.version")
}

/// `type`, or `[type, "null"]` when the parser takes `null` for absent.
fn ty(f: &Field, t: &str) -> Value {
    if required(f) {
        t.into()
    } else {
        json!([t, "null"])
    }
}

fn field_schema(f: &Field) -> Value {
    let mut s = match &f.ty {
        Type::Object => match object_schema(f.name, !required(f)) {
            Value::Object(m) => m,
            _ => Map::new(),
        },
        Type::Bool => Map::new(),
        Type::Integer(r) => Map::from_iter([
            ("minimum".into(), r.min.into()),
            ("maximum".into(), r.max.into()),
        ]),
        Type::IntegerUpTo(u) => Map::from_iter([("minimum".into(), u.min.into())]),
        Type::String(len) => {
            let mut m = Map::new();
            lengths(&mut m, len, "minLength", "maxLength");
            if let Some(p) = pattern_of(f.name) {
                m.insert("pattern".into(), p.into());
            }
            m
        }
        Type::Enum(values) => {
            let mut all = json!(values);
            if !required(f) {
                if let Some(a) = all.as_array_mut() {
                    a.push(Value::Null);
                }
            }
            Map::from_iter([("enum".into(), all)])
        }
        Type::List(item, len) => {
            let mut m = Map::from_iter([("items".into(), item_schema(*item, f.name))]);
            lengths(&mut m, len, "minItems", "maxItems");
            m
        }
        Type::Map(len) => {
            let value = json!({"type": "string", "minLength": 1, "maxLength": super::MAX_SHARD_NAME_BYTES, "pattern": VISIBLE});
            let mut m = Map::from_iter([
                ("additionalProperties".into(), value),
                (
                    "propertyNames".into(),
                    json!({"minLength": 1, "maxLength": super::MAX_HOME_VALUE_BYTES}),
                ),
            ]);
            lengths(&mut m, len, "minProperties", "maxProperties");
            m
        }
    };
    let t = match &f.ty {
        Type::Object | Type::Map(_) => "object",
        Type::Bool => "boolean",
        Type::Integer(_) | Type::IntegerUpTo(_) => "integer",
        Type::String(_) | Type::Enum(_) => "string",
        Type::List(..) => "array",
    };
    s.insert("type".into(), ty(f, t));
    match f.name {
        // No part or header twice (the parser also folds header names' case).
        "key.fingerprint" | "payload.parts" | "ordering.entity.parts" | "scope.headers" => {
            s.insert("uniqueItems".into(), true.into());
        }
        // At least one entry that includes.
        "store_statuses" => {
            s.insert("contains".into(), json!({"pattern": INCLUDING_STATUS}));
        }
        "rules[].name" => {
            s.insert(
                "not".into(),
                json!({"const": super::super::DEFAULT_RECORDS}),
            );
        }
        _ => {}
    }
    s.insert("description".into(), f.meaning_text().into());
    if let Some(d) = f.default.json() {
        s.insert("default".into(), d);
    }
    Value::Object(s)
}

/// The last segment of a dotted name.
fn short(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// A rule: its own fields and the policy fields; a bypassed rule takes no policy field
/// and no `records_of`.
fn rule_schema() -> Value {
    let mut s = object_schema("rules[]", false);
    let policy = children("rules[]")
        .into_iter()
        .filter(|f| f.applies == Applies::Policy)
        .map(|f| short(f.name))
        .chain(["records_of"]);
    s["if"] = is("bypass", true.into());
    s["then"] = none_of(policy);
    s
}

/// The object `parent`'s schema: its fields, nothing else, and the conditions between
/// them that the schema can say; `nullable`: `null` stands for it absent, and the
/// conditions hold only of an object (`anyOf: [null, conditions]`).
fn object_schema(parent: &str, nullable: bool) -> Value {
    let fields = children(parent);
    let props: Map<String, Value> = fields
        .iter()
        .map(|f| (short(f.name).to_string(), field_schema(f)))
        .collect();
    let mut s = json!({
        "type": "object",
        "properties": props,
        "additionalProperties": false,
    });
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| required(f))
        .map(|f| short(f.name))
        .collect();
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    let names = |a: Applies| {
        fields
            .iter()
            .filter(move |f| f.applies == a)
            .map(|f| short(f.name))
    };
    let mut c = json!({});
    let mut all: Vec<Value> = Vec::new();
    match parent {
        // When a rule applies: at least one condition given; a prefix or an exact path.
        "rules[].match" => {
            let each: Vec<Value> = fields.iter().map(|f| given(&[short(f.name)])).collect();
            all.push(json!({"anyOf": each}));
            all.push(json!({"not": given(&["path_prefix", "path_exact"])}));
        }
        "store" => {
            // One etcd cluster, or a map of shards; one resharding at a time.
            let mut then = none_of(names(Applies::SharedData));
            then["anyOf"] = json!([
                {"allOf": [given(&["cluster"]), none_of(["shards"])]},
                {"allOf": [given(&["shards"]), none_of(["cluster", "authority"])]},
            ]);
            then["not"] = given(&["previous_shards", "next_shards"]);
            c["if"] = is("kind", "etcd".into());
            c["then"] = then;
            c["else"] = none_of(names(Applies::Etcd));
        }
        // A body with a template, which needs one.
        "errors" => {
            c["if"] = is("format", "template".into());
            c["then"] = given(&["body"]);
            c["else"] = none_of(["body"]);
        }
        "upstream" => {
            c["if"] = is("detached", true.into());
            c["then"] = given(&["cluster"]);
            c["else"] = none_of(["cluster", "timeout_ms", "client_timeout_ms"]);
        }
        // Exactly one source, or `none: false` alone (the default source).
        "principal" => {
            c["if"] = is("none", false.into());
            c["then"] = none_of(["header", "cookie", "metadata"]);
            c["else"] = json!({"oneOf": [
                given(&["header"]), given(&["cookie"]), given(&["metadata"]), is("none", true.into())
            ]});
        }
        "payload" => {
            all.push(json!({"not": given(&["json_pointers", "ignore_json_pointers"])}));
            // JSON pointers select fields of the body: with parts given, "body" is one.
            all.push(json!({
                "if": {"allOf": [
                    given(&["parts"]),
                    {"anyOf": [given(&["json_pointers"]), given(&["ignore_json_pointers"])]}
                ]},
                "then": {"properties": {"parts": {"contains": {"const": "body"}}}}
            }));
        }
        // `enabled: false` needs neither entity nor version; the status only acknowledges.
        "ordering" => {
            all.push(json!({
                "if": is("enabled", false.into()),
                "else": given(&["entity", "version"]),
            }));
            all.push(json!({
                "if": {"not": is("on_stale", "acknowledge".into())},
                "then": none_of(["acknowledge_status"]),
            }));
        }
        "ordering.entity" => {
            c["oneOf"] = json!([
                given(&["header"]),
                given(&["json_pointer"]),
                given(&["parts"])
            ]);
        }
        "ordering.version" => {
            c["oneOf"] = json!([given(&["header"]), given(&["json_pointer"])]);
        }
        _ => {}
    }
    if !all.is_empty() {
        c["allOf"] = Value::Array(all);
    }
    if let (Some(conds), Some(obj)) = (c.as_object(), s.as_object_mut()) {
        if nullable && !conds.is_empty() {
            obj.insert("anyOf".into(), json!([{"type": "null"}, c]));
        } else {
            obj.extend(conds.clone());
        }
    }
    s
}

/// The configuration's JSON Schema, generated from `FIELDS`.
pub fn json_schema() -> Value {
    let mut s = object_schema("", false);
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema".into();
    s["$id"] = "urn:proxy-dedup:config".into();
    s["title"] = "proxy-dedup filter configuration".into();
    s["description"] = "The JSON in the Wasm plugin's `configuration`. Generated from \
        dedup-core's field table by `dedupctl schema` (`make docs-ref`): edit the table. \
        What only the filter checks (one field against another, across rules) is listed in \
        the configuration reference."
        .into();
    s
}

/// The schema as committed: pretty-printed, with a final newline.
pub fn schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}
