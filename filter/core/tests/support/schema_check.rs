//! A validator of the JSON Schema keywords `docs/config.schema.json` uses, for tests
//! (a full validator crate is a heavy build for this), with the standard's meaning:
//! `type` (one or a list; an `integer` is any number without a fractional part, `60.0`
//! included), `properties`, `additionalProperties`, `required`, `enum`, `const`,
//! `minimum`, `maximum`, `minLength`, `maxLength` (in characters), `minItems`,
//! `maxItems`, `uniqueItems`, `contains`, `minProperties`, `items`, `not`, `allOf`,
//! `anyOf`, `oneOf`, `if`/`then`/`else`, boolean schemas, and the `pattern`s the schema
//! writes, each matched by hand below. A keyword or pattern it does not know fails the
//! test, so the schema cannot say more than is checked.

use serde_json::Value;

const ANNOTATIONS: [&str; 5] = ["description", "default", "$schema", "$id", "title"];

/// The errors of `v` against `schema` (empty: valid), each with the JSON path.
pub fn validate(schema: &Value, v: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, v, "$", &mut errors);
    errors
}

/// An RFC 9110 token character.
fn tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn header_or_pseudo(s: &str) -> bool {
    (!s.is_empty() && s.chars().all(tchar))
        || [":authority", ":path", ":method"].contains(&s.to_ascii_lowercase().as_str())
}

/// `char::is_control`: Unicode's Cc, U+0000–U+001F and U+007F–U+009F.
fn cc(c: char) -> bool {
    ('\u{0}'..='\u{1f}').contains(&c) || ('\u{7f}'..='\u{9f}').contains(&c)
}

fn pattern_matches(pattern: &str, s: &str) -> bool {
    let nonempty = !s.is_empty();
    match pattern {
        "^[A-Z]+$" => nonempty && s.bytes().all(|b| b.is_ascii_uppercase()),
        "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$" => nonempty && s.chars().all(tchar),
        "^([!#$%&'*+.^_`|~0-9A-Za-z-]+|:[Aa][Uu][Tt][Hh][Oo][Rr][Ii][Tt][Yy]|:[Pp][Aa][Tt][Hh]|:[Mm][Ee][Tt][Hh][Oo][Dd])$" => {
            header_or_pseudo(s)
        }
        "^(method|path|query|body|header:([!#$%&'*+.^_`|~0-9A-Za-z-]+|:[Aa][Uu][Tt][Hh][Oo][Rr][Ii][Tt][Yy]|:[Pp][Aa][Tt][Hh]|:[Mm][Ee][Tt][Hh][Oo][Dd]))$" => {
            ["method", "path", "query", "body"].contains(&s)
                || s.strip_prefix("header:").is_some_and(header_or_pseudo)
        }
        "^(/([^~]|~[01])*)+$" => {
            s.starts_with('/')
                && s.split('~').skip(1).all(|after| after.starts_with(['0', '1']))
        }
        "^/[^?\\u0000-\\u001f\\u007f-\\u009f]*$" => {
            s.starts_with('/') && !s.chars().any(|c| c == '?' || cc(c))
        }
        "^[^\\u0000-\\u001f\\u007f-\\u009f /]+$" => {
            nonempty && !s.chars().any(|c| cc(c) || c == ' ' || c == '/')
        }
        "^[^\\u0000-\\u001f\\u007f-\\u009f ]+$" => nonempty && !s.chars().any(|c| cc(c) || c == ' '),
        "^[^\\u0000-\\u001f\\u007f-\\u009f]+$" => nonempty && !s.chars().any(cc),
        "^[^\\u0000-\\u001f\\u007f-\\u009f]*$" => !s.chars().any(cc),
        "^[^\\u0000-\\u001f\\u007f]+$" => nonempty && !s.bytes().any(|b| b < 0x20 || b == 0x7f),
        "^[^\\u0000]+$" => nonempty && !s.contains('\0'),
        "^!?([1-5]xx|[1-5][0-9][0-9])$" => {
            let b = s.strip_prefix('!').unwrap_or(s).as_bytes();
            b.len() == 3
                && (b'1'..=b'5').contains(&b[0])
                && ((b[1] == b'x' && b[2] == b'x') || (b[1].is_ascii_digit() && b[2].is_ascii_digit()))
        }
        "^[1-5]" => s.starts_with(['1', '2', '3', '4', '5']),
        "^[A-Za-z0-9_.-]+$" => {
            nonempty && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        }
        "^[!-.0-~]+$" => nonempty && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'/'),
        "^[!-~]+$" => nonempty && s.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "^[!-~]([ -~]*[!-~])?$" => {
            nonempty
                && s.bytes().all(|b| (0x20..=0x7e).contains(&b))
                && !s.starts_with(' ')
                && !s.ends_with(' ')
        }
        other => panic!("the test validator knows no pattern {other:?}: teach it"),
    }
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "integer" => v.is_u64() || v.is_i64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => panic!("the test validator knows no type {other:?}"),
    }
}

fn valid(schema: &Value, v: &Value) -> bool {
    validate(schema, v).is_empty()
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
                let ok = match rule {
                    Value::Array(list) => list.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
                    t => type_ok(t.as_str().unwrap(), v),
                };
                if !ok {
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
                if let Some(n) = v.as_f64() {
                    let exact = v.as_i64().map(i128::from).or(v.as_u64().map(i128::from));
                    let bound = rule.as_u64().unwrap();
                    let beyond = match exact {
                        Some(n) => {
                            (key == "minimum" && n < i128::from(bound))
                                || (key == "maximum" && n > i128::from(bound))
                        }
                        None => {
                            (key == "minimum" && n < bound as f64)
                                || (key == "maximum" && n > bound as f64)
                        }
                    };
                    if beyond {
                        fail(format!("{v} is beyond its {key} {bound}"));
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
            "minProperties" | "maxProperties" => {
                if let Some(o) = v.as_object() {
                    let (n, bound) = (o.len() as u64, rule.as_u64().unwrap());
                    if (key == "minProperties" && n < bound)
                        || (key == "maxProperties" && n > bound)
                    {
                        fail(format!("{n} properties, beyond its {key} {bound}"));
                    }
                }
            }
            "propertyNames" => {
                if let Some(o) = v.as_object() {
                    for name in o.keys() {
                        check(
                            rule,
                            &Value::String(name.clone()),
                            &format!("{at}.{name}"),
                            errors,
                        );
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
            "uniqueItems" => {
                if let (Some(a), Some(true)) = (v.as_array(), rule.as_bool()) {
                    if a.iter().enumerate().any(|(i, x)| a[..i].contains(x)) {
                        fail("an item twice".into());
                    }
                }
            }
            "contains" => {
                if let Some(a) = v.as_array() {
                    if !a.iter().any(|x| valid(rule, x)) {
                        fail(format!("no item matches {rule}"));
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
            "not" => {
                if valid(rule, v) {
                    fail(format!("matches {rule}, which it must not"));
                }
            }
            "allOf" => {
                for s in rule.as_array().unwrap() {
                    check(s, v, at, errors);
                }
            }
            "anyOf" => {
                if !rule.as_array().unwrap().iter().any(|s| valid(s, v)) {
                    fail(format!("matches none of {rule}"));
                }
            }
            "oneOf" => {
                let n = rule
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|s| valid(s, v))
                    .count();
                if n != 1 {
                    fail(format!("matches {n} of {rule}, not exactly one"));
                }
            }
            "if" => {
                let branch = if valid(rule, v) { "then" } else { "else" };
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
