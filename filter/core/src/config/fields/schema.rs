//! The JSON Schema (draft 2020-12) of the configuration (`docs/config.schema.json`), for
//! editors and CI: types, defaults, bounds, enums, `additionalProperties: false`, and
//! which store kind each `store` field needs. Bounds that depend on another field
//! (`wait_timeout_ms`, `upstream.timeout_ms`, …) are in the descriptions only; the
//! filter's parser (`dedupctl check-config`) is the last word.

use super::{children, Applies, Field, Item, Len, Type, PARTS};
use serde_json::{json, Map, Value};

fn lengths(schema: &mut Map<String, Value>, len: &Len, min_key: &str, max_key: &str) {
    if len.min > 0 {
        schema.insert(min_key.into(), len.min.into());
    }
    if let Some(max) = len.max {
        schema.insert(max_key.into(), max.into());
    }
}

fn item_schema(item: Item) -> Value {
    match item {
        Item::HeaderName | Item::Status | Item::String => json!({"type": "string", "minLength": 1}),
        Item::Method => json!({"type": "string", "pattern": "^[A-Z]+$"}),
        Item::Part => json!({"anyOf": [
            {"enum": PARTS},
            {"type": "string", "pattern": "^header:.+$"}
        ]}),
        Item::Rule => object_schema("rules[]"),
        Item::Shard => json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": super::MAX_SHARD_NAME_BYTES},
                "cluster": {"type": "string", "minLength": 1},
                "authority": {"type": "string", "minLength": 1},
            },
            "required": ["cluster"],
            "additionalProperties": false,
        }),
    }
}

fn field_schema(f: &Field) -> Value {
    let mut s = match &f.ty {
        Type::Object => match object_schema(f.name) {
            Value::Object(m) => m,
            _ => Map::new(),
        },
        Type::Bool => Map::from_iter([("type".into(), "boolean".into())]),
        Type::Integer(r) => Map::from_iter([
            ("type".into(), "integer".into()),
            ("minimum".into(), r.min.into()),
            ("maximum".into(), r.max.into()),
        ]),
        Type::IntegerUpTo(u) => Map::from_iter([
            ("type".into(), "integer".into()),
            ("minimum".into(), u.min.into()),
        ]),
        Type::String(len) => {
            let mut m = Map::from_iter([("type".into(), "string".into())]);
            lengths(&mut m, len, "minLength", "maxLength");
            m
        }
        Type::Enum(values) => Map::from_iter([
            ("type".into(), "string".into()),
            ("enum".into(), json!(values)),
        ]),
        Type::List(item, len) => {
            let mut m = Map::from_iter([
                ("type".into(), "array".into()),
                ("items".into(), item_schema(*item)),
            ]);
            lengths(&mut m, len, "minItems", "maxItems");
            m
        }
    };
    s.insert("description".into(), f.meaning_text().into());
    if let Some(d) = f.default.json() {
        s.insert("default".into(), d);
    }
    Value::Object(s)
}

/// The names of `fields` as properties that must be absent (`false` schemas).
fn forbidden<'a>(fields: impl Iterator<Item = &'a Field>) -> Value {
    let props: Map<String, Value> = fields
        .map(|f| (short(f.name).to_string(), Value::Bool(false)))
        .collect();
    json!({ "properties": props })
}

/// The last segment of a dotted name.
fn short(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// The object `parent`'s schema: its fields, nothing else, and the conditions between
/// them that the schema can say.
fn object_schema(parent: &str) -> Value {
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
        .filter(|f| matches!(f.default, super::Shown::Text("required")))
        .map(|f| short(f.name))
        .collect();
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    match parent {
        // An empty match is refused: it would be every request.
        "rules[].match" => s["minProperties"] = json!(1),
        "store" => {
            let only = |a: Applies| fields.clone().into_iter().filter(move |f| f.applies == a);
            let mut then = forbidden(only(Applies::SharedData));
            // One etcd cluster, or a map of shards.
            then["anyOf"] = json!([
                {"required": ["cluster"], "properties": {"shards": false}},
                {"required": ["shards"], "properties": {"cluster": false, "authority": false}},
            ]);
            s["if"] = json!({"properties": {"kind": {"const": "etcd"}}, "required": ["kind"]});
            s["then"] = then;
            s["else"] = forbidden(only(Applies::Etcd));
        }
        "upstream" => {
            s["if"] =
                json!({"properties": {"detached": {"const": true}}, "required": ["detached"]});
            s["then"] = json!({"required": ["cluster"]});
            s["else"] = forbidden(
                fields
                    .iter()
                    .copied()
                    .filter(|f| short(f.name) != "detached"),
            );
        }
        _ => {}
    }
    s
}

/// The configuration's JSON Schema, generated from `FIELDS`.
pub fn json_schema() -> Value {
    let mut s = object_schema("");
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema".into();
    s["$id"] = "urn:proxy-dedup:config".into();
    s["title"] = "proxy-dedup filter configuration".into();
    s["description"] = "The JSON in the Wasm plugin's `configuration`. Generated from \
        dedup-core's field table by `dedupctl schema` (`make docs-ref`): edit the table."
        .into();
    s
}

/// The schema as committed: pretty-printed, with a final newline.
pub fn schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}
