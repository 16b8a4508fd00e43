//! Metadata values a test supplies (dynamic metadata of earlier filters,
//! route metadata) and the bytes a filter reads for them through
//! `proxy_get_property`, in Envoy's encodings (`serializeValue` of a CEL
//! value: strings raw, numbers as an 8-byte little-endian `f64`, booleans as
//! one byte, structs and lists in the pairs format).

use crate::abi::{encode_pairs, Status};

/// A `google.protobuf.Value`, as metadata holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// Every number in a `Struct` is a double.
    Number(f64),
    String(String),
    List(Vec<Value>),
    /// Key order as given (Envoy's order is its protobuf map's).
    Struct(Vec<(String, Value)>),
}

impl Value {
    /// A struct from `(key, value)` pairs.
    pub fn object<K: Into<String>>(fields: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Struct(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// What `proxy_get_property` returns for this value.
    pub(crate) fn property_bytes(&self) -> Result<Vec<u8>, Status> {
        Ok(match self {
            Value::Null => return Err(Status::SerializationFailure),
            Value::Bool(b) => vec![u8::from(*b)],
            Value::Number(n) => n.to_le_bytes().to_vec(),
            Value::String(s) => s.as_bytes().to_vec(),
            Value::List(items) => {
                let mut pairs = Vec::new();
                for i in items {
                    pairs.push((i.property_bytes()?, Vec::new()));
                }
                encode_pairs(&pairs)
            }
            Value::Struct(fields) => {
                let mut pairs = Vec::new();
                for (k, v) in fields {
                    pairs.push((k.as_bytes().to_vec(), v.property_bytes()?));
                }
                encode_pairs(&pairs)
            }
        })
    }

    /// The value at `path` below this one (struct keys, list indexes).
    pub(crate) fn at(&self, path: &[&str]) -> Option<&Value> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        match self {
            Value::Struct(fields) => fields
                .iter()
                .find(|(k, _)| k == first)
                .and_then(|(_, v)| v.at(rest)),
            Value::List(items) => first
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get(i))
                .and_then(|v| v.at(rest)),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Value {
        Value::Number(n)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Number(n as f64)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

/// Metadata by filter namespace (`filter_metadata`).
pub(crate) type Metadata = Vec<(String, Value)>;

/// A property below a metadata message (`metadata`, `xds.route_metadata`):
/// `filter_metadata.<namespace>[.<key>...]`.
pub(crate) fn metadata_property(md: &Metadata, path: &[&str]) -> Result<Vec<u8>, Status> {
    match path {
        ["filter_metadata", ns, rest @ ..] => md
            .iter()
            .rev()
            .find(|(n, _)| n == ns)
            .and_then(|(_, v)| v.at(rest))
            .ok_or(Status::NotFound)?
            .property_bytes(),
        ["filter_metadata"] => {
            let mut pairs = Vec::new();
            for (ns, v) in md {
                pairs.push((ns.as_bytes().to_vec(), v.property_bytes()?));
            }
            Ok(encode_pairs(&pairs))
        }
        _ => Err(Status::NotFound),
    }
}
