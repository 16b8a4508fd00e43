//! A validator of the JSON Schema keywords `docs/config.schema.json` uses, for tests
//! (a full validator crate is a heavy build for this): `type`, `properties`,
//! `additionalProperties`, `required`, `enum`, `const`, `minimum`, `maximum`,
//! `minLength`, `maxLength`, `minItems`, `maxItems`, `minProperties`, `items`, `anyOf`,
//! `if`/`then`/`else`, boolean schemas, and the two `pattern`s it writes. A keyword it
//! does not know fails the test, so the schema cannot say more than is checked.

use serde_json::Value;

const ANNOTATIONS: [&str; 5] = ["description", "default", "$schema", "$id", "title"];

/// The errors of `v` against `schema` (empty: valid), each with the JSON path.
pub fn validate(schema: &Value, v: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, v, "$", &mut errors);
    errors
}

fn pattern_matches(pattern: &str, s: &str) -> bool {
    match pattern {
        "^[A-Z]+$" => !s.is_empty() && s.bytes().all(|b| b.is_ascii_uppercase()),
        "^header:.+$" => s.strip_prefix("header:").is_some_and(|r| !r.is_empty()),
        other => panic!("the test validator knows no pattern {other:?}: teach it"),
    }
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_u64() || v.is_i64(),
        other => panic!("the test validator knows no type {other:?}"),
    }
}

fn check(schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let map = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => return errors.push(format!("{at}: not allowed")),
        Value::Object(m) => m,
        other => panic!("{at}: a schema must be an object or a boolean, not {other}"),
    };
    let mut fails = Vec::new();
    let mut fail = |what: String| fails.push(format!("{at}: {what}"));
    for (key, rule) in map {
        match key.as_str() {
            k if ANNOTATIONS.contains(&k) => {}
            "type" => {
                if !type_ok(rule.as_str().unwrap(), v) {
                    fail(format!("not of type {rule}"));
                }
            }
            "enum" => {
                if !rule.as_array().unwrap().contains(v) {
                    fail(format!("not one of {rule}"));
                }
            }
            "const" => {
                if rule != v {
                    fail(format!("not {rule}"));
                }
            }
            "minimum" | "maximum" => {
                if let Some(n) = v.as_i64().map(i128::from).or(v.as_u64().map(i128::from)) {
                    let bound = i128::from(rule.as_u64().unwrap());
                    if (key == "minimum" && n < bound) || (key == "maximum" && n > bound) {
                        fail(format!("{n} is beyond its {key} {bound}"));
                    }
                }
            }
            "minLength" | "maxLength" => {
                if let Some(s) = v.as_str() {
                    let (n, bound) = (s.chars().count() as u64, rule.as_u64().unwrap());
                    if (key == "minLength" && n < bound) || (key == "maxLength" && n > bound) {
                        fail(format!("{n} characters, beyond its {key} {bound}"));
                    }
                }
            }
            "minProperties" => {
                if let Some(o) = v.as_object() {
                    if (o.len() as u64) < rule.as_u64().unwrap() {
                        fail(format!("fewer than {rule} properties"));
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let Some(a) = v.as_array() {
                    let (n, bound) = (a.len() as u64, rule.as_u64().unwrap());
                    if (key == "minItems" && n < bound) || (key == "maxItems" && n > bound) {
                        fail(format!("{n} items, beyond its {key} {bound}"));
                    }
                }
            }
            "pattern" => {
                if let Some(s) = v.as_str() {
                    if !pattern_matches(rule.as_str().unwrap(), s) {
                        fail(format!("{s:?} does not match {rule}"));
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, item) in a.iter().enumerate() {
                        check(rule, item, &format!("{at}[{i}]"), errors);
                    }
                }
            }
            "properties" => {
                if let Some(o) = v.as_object() {
                    for (name, sub) in rule.as_object().unwrap() {
                        if let Some(value) = o.get(name) {
                            check(sub, value, &format!("{at}.{name}"), errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(o) = v.as_object() {
                    let known = map.get("properties").and_then(Value::as_object);
                    for (name, value) in o {
                        if !known.is_some_and(|k| k.contains_key(name)) {
                            check(rule, value, &format!("{at}.{name}"), errors);
                        }
                    }
                }
            }
            "required" => {
                if let Some(o) = v.as_object() {
                    for name in rule.as_array().unwrap() {
                        if !o.contains_key(name.as_str().unwrap()) {
                            fail(format!("{name} is required"));
                        }
                    }
                }
            }
            "anyOf" => {
                let any = rule
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| validate(s, v).is_empty());
                if !any {
                    fail(format!("matches none of {rule}"));
                }
            }
            "if" => {
                let branch = if validate(rule, v).is_empty() {
                    "then"
                } else {
                    "else"
                };
                if let Some(s) = map.get(branch) {
                    check(s, v, at, errors);
                }
            }
            "then" | "else" => {}
            other => panic!("{at}: the test validator knows no keyword {other:?}: teach it"),
        }
    }
    errors.extend(fails);
}
