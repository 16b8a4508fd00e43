//! The payload check (422): which parts of a request must be the same for a key to be
//! reused. By default the method, the path with its query and the whole body; the
//! `payload` settings pick other parts and, for JSON bodies, only some fields or all but
//! some, compared in a canonical form (member order and whitespace do not matter), so a
//! push provider's redelivery with a new `deliveryAttempt` is the same payload. The
//! canonical form is exact (`canon`): numbers by decimal value, strings by code point,
//! and an object naming a member twice is refused rather than merged.

pub mod canon;

use crate::config::FingerprintPart;
use crate::key::{BodyDigest, Digest, RequestHead};
use canon::Canonical;
use sha2::{Digest as _, Sha256};

pub use crate::config::{JsonSelection, PayloadConfig};

fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// A canonicalised JSON body names a member twice in one object (answered with 400
/// `ambiguous-payload`): parsers disagree on which one counts, so the payload check
/// cannot say what the request is. The detail names the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousPayload(pub String);

/// The payload digest of a request; `raw_body` is read only when a JSON selection is set.
pub fn payload_digest(
    cfg: &PayloadConfig,
    head: &RequestHead,
    body: &BodyDigest,
    raw_body: &[u8],
) -> Result<Digest, AmbiguousPayload> {
    let mut h = Sha256::new();
    if cfg.is_default() {
        h.update(b"proxy-dedup payload v1\0");
        feed(&mut h, head.method.as_bytes());
        feed(&mut h, &head.path);
        h.update(body.len.to_be_bytes());
        h.update(body.digest);
        return Ok(h.finalize().into());
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
            FingerprintPart::Body => match canon::canonical(&cfg.json, raw_body) {
                Canonical::Json(canonical) => {
                    // Like the raw body: its length and BLAKE3 digest.
                    h.update([2]);
                    h.update((canonical.len() as u64).to_be_bytes());
                    h.update(blake3::hash(&canonical).as_bytes());
                }
                Canonical::Raw => {
                    h.update([1]);
                    h.update(body.len.to_be_bytes());
                    h.update(body.digest);
                }
                Canonical::Ambiguous(detail) => return Err(AmbiguousPayload(detail)),
            },
        }
    }
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests;
