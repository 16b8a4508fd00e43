//! Finds the value at an RFC 6901 pointer in a JSON body without building the document:
//! one pass over the bytes, skipping everything off the pointer's path. Memory stays at
//! the size of the value found (at most a key) whatever the body holds; serde_json's
//! recursion limit (128 levels) bounds nesting.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::fmt;

/// What the pointer led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nothing at the pointer.
    Missing,
    Str(String),
    /// An integer, as written in decimal.
    Int(String),
    /// Another kind of value: "null", "a boolean", "an object"…
    Other(&'static str),
    /// An object on the path names the same member twice: parsers disagree on which
    /// one counts, so neither does.
    Duplicate,
}

/// Why the body could not be read as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJson(pub String);

/// The value at `pointer` (which starts with `/`) in `body`.
pub fn find(body: &[u8], pointer: &str) -> Result<Target, NotJson> {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let found = RefCell::new(Target::Missing);
    let mut de = serde_json::Deserializer::from_slice(body);
    Follow {
        tokens: &tokens,
        found: &found,
    }
    .deserialize(&mut de)
    .map_err(|e| NotJson(e.to_string()))?;
    de.end().map_err(|e| NotJson(e.to_string()))?;
    Ok(found.into_inner())
}

/// Walks one level of the pointer; at its end, records the value.
struct Follow<'a> {
    tokens: &'a [String],
    found: &'a RefCell<Target>,
}

impl<'de> DeserializeSeed<'de> for Follow<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.tokens.is_empty() {
            let value = d.deserialize_any(Capture)?;
            let mut found = self.found.borrow_mut();
            *found = match *found {
                Target::Missing => value,
                _ => Target::Duplicate,
            };
            Ok(())
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Follow<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (token, rest) = (&self.tokens[0], &self.tokens[1..]);
        while let Some(matched) = map.next_key_seed(KeyIs(token))? {
            if matched {
                map.next_value_seed(Follow {
                    tokens: rest,
                    found: self.found,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (token, rest) = (&self.tokens[0], &self.tokens[1..]);
        // RFC 6901: an index is "0" or digits without a leading zero (no sign: Rust's
        // `parse` would take "+1" as 1).
        let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
        let index = (digits && (token == "0" || !token.starts_with('0')))
            .then(|| token.parse::<usize>().ok())
            .flatten();
        let mut i = 0usize;
        loop {
            if Some(i) == index {
                let seed = Follow {
                    tokens: rest,
                    found: self.found,
                };
                if seq.next_element_seed(seed)?.is_none() {
                    return Ok(());
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
            i = i.saturating_add(1);
        }
    }

    // A scalar on the way: the pointer goes nowhere.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Compares a member name with the pointer token without keeping it.
struct KeyIs<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

/// The value at the pointer's end: strings and integers are kept, others named.
struct Capture;

impl<'de> Visitor<'de> for Capture {
    type Value = Target;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Target, E> {
        Ok(Target::Str(v.to_string()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Target, E> {
        Ok(Target::Int(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Target, E> {
        Ok(Target::Int(v.to_string()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Target, E> {
        Ok(Target::Other("a non-integer number"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Target, E> {
        Ok(Target::Other("a boolean"))
    }
    fn visit_unit<E>(self) -> Result<Target, E> {
        Ok(Target::Other("null"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Target, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Target::Other("an object"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Target, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Target::Other("an array"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(body: &str, ptr: &str) -> Target {
        find(body.as_bytes(), ptr).unwrap()
    }

    #[test]
    fn follows_members_indexes_and_escapes() {
        let doc = r#"{"a": {"b/c": [10, {"~d": "x"}], "n": 7}, "s": "top", "f": 1.5}"#;
        assert_eq!(at(doc, "/s"), Target::Str("top".into()));
        assert_eq!(at(doc, "/a/n"), Target::Int("7".into()));
        assert_eq!(at(doc, "/a/b~1c/0"), Target::Int("10".into()));
        assert_eq!(at(doc, "/a/b~1c/1/~0d"), Target::Str("x".into()));
        assert_eq!(at(doc, "/a/b~1c/2"), Target::Missing);
        assert_eq!(at(doc, "/a/b~1c/01"), Target::Missing);
        // A signed index names no element (found by the property test against serde_json).
        assert_eq!(at(doc, "/a/b~1c/+0"), Target::Missing);
        assert_eq!(at(doc, "/a/b~1c/+1/~0d"), Target::Missing);
        assert_eq!(at(doc, "/f"), Target::Other("a non-integer number"));
        assert_eq!(at(doc, "/a"), Target::Other("an object"));
        assert_eq!(at(doc, "/s/x"), Target::Missing);
        assert_eq!(at(doc, "/zz"), Target::Missing);
        assert_eq!(at(r#"{"k": "\u0041b"}"#, "/k"), Target::Str("Ab".into()));
    }

    #[test]
    fn a_member_named_twice_on_the_path_is_a_duplicate() {
        assert_eq!(at(r#"{"id": "a", "id": "b"}"#, "/id"), Target::Duplicate);
        assert_eq!(
            at(r#"{"m": {"id": "a"}, "m": {"id": "b"}}"#, "/m/id"),
            Target::Duplicate
        );
        // Elsewhere in the document, duplicates do not matter.
        assert_eq!(
            at(r#"{"x": 1, "x": 2, "id": "a"}"#, "/id"),
            Target::Str("a".into())
        );
    }

    #[test]
    fn malformed_and_too_deep_bodies_are_not_json() {
        assert!(find(b"{\"a\": ", "/a").is_err());
        assert!(find(b"{\"a\": 1} trailing", "/a").is_err());
        assert!(find(b"", "/a").is_err());
        let deep = "[".repeat(100_000);
        assert!(find(deep.as_bytes(), "/0").is_err());
        let deep_ignored = format!("{{\"id\": \"k\", \"x\": {}}}", "[".repeat(100_000));
        assert!(find(deep_ignored.as_bytes(), "/id").is_err());
    }
}
