//! Request identity: the client key (header, JSON pointer or keyless fingerprint), its
//! validation, the scope, and the digests stored in place of raw keys.

use crate::config::{Config, FingerprintPart};
use sha2::{Digest as _, Sha256};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The request head as the filter sees it. Header names are lower-case.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    pub method: String,
    /// Path including the query string, as in `:path`.
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// First value of a header (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn path_only(&self) -> &str {
        self.path
            .split_once('?')
            .map_or(self.path.as_str(), |(p, _)| p)
    }

    fn query(&self) -> &str {
        self.path.split_once('?').map_or("", |(_, q)| q)
    }
}

/// Where a key came from. Part of the digest, so a header key never meets a body key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Header,
    JsonPointer,
    Fingerprint,
}

/// Why a key was refused (answered with 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Missing { detail: String },
    Invalid { detail: String },
}

/// A validated key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub source: KeySource,
    pub value: Vec<u8>,
}

/// Validates a client-supplied key: 1..=max_length bytes, no control characters.
/// A value quoted as an RFC 8941 string (`"abc"`, as in the IETF draft) is unquoted.
pub fn validate_key(raw: &str, max_length: usize, what: &str) -> Result<String, KeyError> {
    let v = if raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') {
        &raw[1..raw.len() - 1]
    } else {
        raw
    };
    if v.is_empty() {
        return Err(KeyError::Invalid {
            detail: format!("{what} is empty"),
        });
    }
    if v.len() > max_length {
        return Err(KeyError::Invalid {
            detail: format!(
                "{what} is {} bytes long; at most {max_length} are allowed",
                v.len()
            ),
        });
    }
    if v.chars().any(char::is_control) {
        return Err(KeyError::Invalid {
            detail: format!("{what} contains control characters"),
        });
    }
    Ok(v.to_string())
}

/// The key from the configured headers, if one is present.
pub fn header_key(cfg: &Config, head: &RequestHead) -> Option<Result<ClientKey, KeyError>> {
    cfg.key_headers.iter().find_map(|name| {
        head.header(name).map(|raw| {
            validate_key(raw, cfg.key_max_length, &format!("header `{name}`")).map(|v| ClientKey {
                source: KeySource::Header,
                value: v.into_bytes(),
            })
        })
    })
}

/// The outcome of looking for a key in a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonKey {
    Found(ClientKey),
    /// The pointer resolves to nothing, or the body is not JSON: the reason says which.
    Absent(String),
    Invalid(KeyError),
}

/// The key at `pointer` in a JSON body. Strings and integers are keys; other values are invalid.
pub fn json_key(cfg: &Config, pointer: &str, body: &[u8]) -> JsonKey {
    let doc: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return JsonKey::Absent(format!("the body is not valid JSON ({e})")),
    };
    let what = format!("JSON value at `{pointer}`");
    match doc.pointer(pointer) {
        None => JsonKey::Absent(format!("the body has no value at `{pointer}`")),
        Some(serde_json::Value::String(s)) => match validate_key(s, cfg.key_max_length, &what) {
            Ok(v) => JsonKey::Found(ClientKey {
                source: KeySource::JsonPointer,
                value: v.into_bytes(),
            }),
            Err(e) => JsonKey::Invalid(e),
        },
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => {
            JsonKey::Found(ClientKey {
                source: KeySource::JsonPointer,
                value: n.to_string().into_bytes(),
            })
        }
        Some(other) => JsonKey::Invalid(KeyError::Invalid {
            detail: format!("{what} is {}, not a string or integer", json_kind(other)),
        }),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a non-integer number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Feeds a length-prefixed field into a hash, so field boundaries are unambiguous.
fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The body, hashed once as it streams; the payload check and a keyless fingerprint
/// both use its digest, so a large body is hashed once, not twice.
#[derive(Clone, Default)]
pub struct BodyHasher {
    hasher: Sha256,
    len: u64,
}

/// SHA-256 of a request body, with its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDigest {
    pub digest: Digest,
    pub len: u64,
}

impl BodyHasher {
    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.len += chunk.len() as u64;
    }

    pub fn finish(self) -> BodyDigest {
        BodyDigest {
            digest: self.hasher.finalize().into(),
            len: self.len,
        }
    }
}

/// The keyless fingerprint of the configured parts (the body enters as its digest).
pub fn fingerprint_key(cfg: &Config, head: &RequestHead, body: &BodyDigest) -> ClientKey {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup fingerprint v1\0");
    for part in &cfg.fingerprint {
        match part {
            FingerprintPart::Method => feed(&mut h, head.method.as_bytes()),
            FingerprintPart::Path => feed(&mut h, head.path_only().as_bytes()),
            FingerprintPart::Query => feed(&mut h, head.query().as_bytes()),
            FingerprintPart::Header(name) => {
                feed(&mut h, head.header(name).unwrap_or("").as_bytes())
            }
            FingerprintPart::Body => {
                h.update(body.len.to_be_bytes());
                h.update(body.digest);
            }
        }
    }
    ClientKey {
        source: KeySource::Fingerprint,
        value: h.finalize().to_vec(),
    }
}

/// The payload fingerprint (method, path with query, body): the 422 check.
pub fn payload_digest(head: &RequestHead, body: &BodyDigest) -> Digest {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup payload v1\0");
    feed(&mut h, head.method.as_bytes());
    feed(&mut h, head.path.as_bytes());
    h.update(body.len.to_be_bytes());
    h.update(body.digest);
    h.finalize().into()
}

/// The record digest: scope values and the key, length-prefixed, with the key's source.
/// The store only ever sees this digest, never the raw key, and a client cannot choose a
/// key that lands on another scope's record without a SHA-256 collision.
pub fn record_digest(cfg: &Config, head: &RequestHead, key: &ClientKey) -> Digest {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup record v1\0");
    h.update((cfg.scope_headers.len() as u32).to_be_bytes());
    for name in &cfg.scope_headers {
        feed(&mut h, name.as_bytes());
        match head.header(name) {
            Some(v) => {
                h.update([1]);
                feed(&mut h, v.as_bytes());
            }
            None => h.update([0]),
        }
    }
    h.update([match key.source {
        KeySource::Header => 1,
        KeySource::JsonPointer => 2,
        KeySource::Fingerprint => 3,
    }]);
    feed(&mut h, &key.value);
    h.finalize().into()
}

/// The first bytes of a digest in hex, for logs; formats only when displayed.
pub struct ShortHex<'a>(&'a Digest);

impl std::fmt::Display for ShortHex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().take(6).try_for_each(|b| write!(f, "{b:02x}"))
    }
}

pub fn short_hex(d: &Digest) -> ShortHex<'_> {
    ShortHex(d)
}
