//! The payload check (422): which parts of a request must be the same for a key to be
//! reused. By default the method, the path with its query and the whole body; the
//! `payload` settings pick other parts and, for JSON bodies, only some fields or all but
//! some, compared in a canonical form (member order and whitespace do not matter), so a
//! push provider's redelivery with a new `deliveryAttempt` is the same payload.

use crate::config::FingerprintPart;
use crate::key::{BodyDigest, Digest, RequestHead};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Which JSON fields of the body count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JsonSelection {
    /// The body as sent, byte for byte.
    #[default]
    Raw,
    /// Only these pointers' values (absent ones count as absent).
    Only(Vec<String>),
    /// The whole document without these pointers' values.
    Ignore(Vec<String>),
}

/// The payload check's settings; the default is the check of v1 (method, path with
/// query, raw body).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PayloadConfig {
    /// `None`: the default parts.
    pub parts: Option<Vec<FingerprintPart>>,
    pub json: JsonSelection,
}

impl PayloadConfig {
    /// Whether the raw body is all the check needs (then it is hashed as it is).
    pub fn is_default(&self) -> bool {
        self.parts.is_none() && self.json == JsonSelection::Raw
    }
}

fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The payload digest of a request; `raw_body` is read only when a JSON selection is set.
pub fn payload_digest(
    cfg: &PayloadConfig,
    head: &RequestHead,
    body: &BodyDigest,
    raw_body: &[u8],
) -> Digest {
    let mut h = Sha256::new();
    if cfg.is_default() {
        h.update(b"proxy-dedup payload v1\0");
        feed(&mut h, head.method.as_bytes());
        feed(&mut h, &head.path);
        h.update(body.len.to_be_bytes());
        h.update(body.digest);
        return h.finalize().into();
    }
    h.update(b"proxy-dedup payload v2\0");
    let default_parts = [
        FingerprintPart::Method,
        FingerprintPart::Path,
        FingerprintPart::Query,
        FingerprintPart::Body,
    ];
    let parts = cfg.parts.as_deref().unwrap_or(&default_parts);
    for part in parts {
        match part {
            FingerprintPart::Method => feed(&mut h, head.method.as_bytes()),
            FingerprintPart::Path => feed(&mut h, head.path_only()),
            FingerprintPart::Query => feed(&mut h, head.query()),
            FingerprintPart::Header(name) => {
                crate::key::feed_header_part(&mut h, head, name, &crate::key::PAYLOAD_LINES)
            }
            FingerprintPart::Body => match canonical_json(&cfg.json, raw_body) {
                Some(canonical) => {
                    // Like the raw body: its length and BLAKE3 digest.
                    h.update([2]);
                    h.update((canonical.len() as u64).to_be_bytes());
                    h.update(blake3::hash(&canonical).as_bytes());
                }
                None => {
                    h.update([1]);
                    h.update(body.len.to_be_bytes());
                    h.update(body.digest);
                }
            },
        }
    }
    h.finalize().into()
}

/// The selected part of a JSON body in canonical form (members sorted, no whitespace);
/// `None` for the raw selection or a body that is not JSON (then the raw body counts).
fn canonical_json(selection: &JsonSelection, raw: &[u8]) -> Option<Vec<u8>> {
    let pointers = match selection {
        JsonSelection::Raw => return None,
        JsonSelection::Only(p) | JsonSelection::Ignore(p) => p,
    };
    let mut doc: Value = serde_json::from_slice(raw).ok()?;
    let selected = match selection {
        JsonSelection::Only(_) => Value::Array(
            pointers
                .iter()
                .map(|p| match doc.pointer(p) {
                    // Absent and null differ: wrap each present value.
                    Some(v) => Value::Array(vec![v.clone()]),
                    None => Value::Null,
                })
                .collect(),
        ),
        _ => {
            for p in pointers {
                remove_at(&mut doc, p);
            }
            doc
        }
    };
    // serde_json's map keeps members sorted by name: this is the canonical form.
    serde_json::to_vec(&selected).ok()
}

/// Removes the value at `pointer` (a member, or an array element), if present.
fn remove_at(doc: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
