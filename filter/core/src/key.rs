//! Request identity: the client key (header, JSON pointer or keyless fingerprint), its
//! validation, the scope, and the digests stored in place of raw keys.

use crate::config::{FingerprintPart, Policy};
use crate::jsonptr::{self, NotJson, Target};
use sha2::{Digest as _, Sha256};

/// A 32-byte digest: SHA-256 for record and payload digests, BLAKE3 for bodies.
pub type Digest = [u8; 32];

pub use crate::head::{text, RequestHead};

impl RequestHead {
    /// The first scope header sent on more than one line, if any.
    pub fn ambiguous_scope<'a>(&self, cfg: &'a Policy) -> Option<&'a str> {
        cfg.scope_headers
            .iter()
            .find(|name| self.header_count(name) > 1)
            .map(String::as_str)
    }
}

/// How the lines of a `header:` part (fingerprint, payload check) enter a hash: the
/// marker written for no line, for one line (then the value, length-prefixed), and for
/// several lines (then their count and each value, in order). One line hashes as it
/// always did, so digests of requests that send a header once stay the same; no line,
/// an empty line and several lines all hash differently.
pub(crate) struct LineMarkers {
    pub(crate) none: &'static [u8],
    pub(crate) one: &'static [u8],
    pub(crate) many: &'static [u8],
}

/// The fingerprint's markers. A fingerprint header part used to be only its value,
/// length-prefixed (and "" when absent): the other cases begin with a length prefix no
/// value can have (`u64::MAX`, `u64::MAX - 1`), so they never read as a value.
pub(crate) const FINGERPRINT_LINES: LineMarkers = LineMarkers {
    none: &u64::MAX.to_be_bytes(),
    one: &[],
    many: &(u64::MAX - 1).to_be_bytes(),
};

/// The payload check's markers: 0 absent and 1 present were its format already; 3
/// marks several lines (2 is the body's canonical-JSON marker).
pub(crate) const PAYLOAD_LINES: LineMarkers = LineMarkers {
    none: &[0],
    one: &[1],
    many: &[3],
};

/// Feeds the lines of header `name` into `h` (see `LineMarkers`).
pub(crate) fn feed_header_part(h: &mut Sha256, head: &RequestHead, name: &str, m: &LineMarkers) {
    let mut lines = head.lines(name);
    match (lines.next(), lines.next()) {
        (None, _) => h.update(m.none),
        (Some(v), None) => {
            h.update(m.one);
            feed(h, v);
        }
        (Some(_), Some(_)) => {
            h.update(m.many);
            h.update((head.header_count(name) as u64).to_be_bytes());
            for v in head.lines(name) {
                feed(h, v);
            }
        }
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
    Missing {
        detail: String,
    },
    Invalid {
        detail: String,
    },
    /// A key header sent on more than one line: which one is the key is not clear.
    Ambiguous {
        detail: String,
    },
}

impl KeyError {
    /// What is wrong, in words.
    pub fn detail(&self) -> &str {
        match self {
            KeyError::Missing { detail }
            | KeyError::Invalid { detail }
            | KeyError::Ambiguous { detail } => detail,
        }
    }
}

/// A validated key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub source: KeySource,
    pub value: Vec<u8>,
}

/// A header key quoted as an RFC 8941 string (`"abc"`, as the IETF draft sends it),
/// unquoted; other values as they are. Only for headers: a JSON key's string content is
/// the key exactly (`"\"abc\""` in a body is the key `"abc"`, quotes included).
pub fn unquote_header_key(raw: &[u8]) -> &[u8] {
    match raw {
        [b'"', inner @ .., b'"'] => inner,
        _ => raw,
    }
}

/// Validates a client-supplied key: 1..=max_length bytes of UTF-8 without control
/// characters (C0, DEL, C1). Bytes that are not UTF-8 are refused rather than read
/// lossily, which would give `op-\xc3` and `op-\xff` one record. Otherwise the key is
/// its bytes, so two different keys never share a record (header keys are unquoted
/// first, see `unquote_header_key`).
pub fn validate_key(v: &[u8], max_length: usize, what: &str) -> Result<Vec<u8>, KeyError> {
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
    let Ok(text) = std::str::from_utf8(v) else {
        return Err(KeyError::Invalid {
            detail: format!("{what} is not UTF-8"),
        });
    };
    if text.chars().any(char::is_control) {
        return Err(KeyError::Invalid {
            detail: format!("{what} contains control characters"),
        });
    }
    Ok(v.to_vec())
}

/// The key from the configured headers, if one is present. A key header sent on more
/// than one line is refused: a proxy or client library before us could pick another
/// line than we do.
pub fn header_key(cfg: &Policy, head: &RequestHead) -> Option<Result<ClientKey, KeyError>> {
    cfg.key_headers.iter().find_map(|name| {
        if head.header_count(name) > 1 {
            return Some(Err(KeyError::Ambiguous {
                detail: format!("header `{name}` is sent more than once; send one key"),
            }));
        }
        head.header(name).map(|raw| {
            validate_key(
                unquote_header_key(raw),
                cfg.key_max_length,
                &format!("header `{name}`"),
            )
            .map(|v| ClientKey {
                source: KeySource::Header,
                value: v,
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

/// The key at `pointer` in a JSON body. Strings and integers are keys; other values are
/// invalid, and so is a member named twice on the pointer's path. A string's content is
/// the key exactly (no unquoting); an integer is its decimal digits, so `123` and `"123"`
/// are one key (as they always were: records written before stay found). The body is
/// scanned once without building the document (see `jsonptr`).
pub fn json_key(cfg: &Policy, pointer: &str, body: &[u8]) -> JsonKey {
    let what = format!("JSON value at `{pointer}`");
    let found = match jsonptr::find(body, pointer) {
        Ok(t) => t,
        Err(NotJson(e)) => return JsonKey::Absent(format!("the body is not valid JSON ({e})")),
    };
    let value = match found {
        Target::Missing => {
            return JsonKey::Absent(format!("the body has no value at `{pointer}`"));
        }
        Target::Str(s) => match validate_key(s.as_bytes(), cfg.key_max_length, &what) {
            Ok(v) => v,
            Err(e) => return JsonKey::Invalid(e),
        },
        Target::Int(n) => n.into_bytes(),
        Target::Other(kind) => {
            return JsonKey::Invalid(KeyError::Invalid {
                detail: format!("{what} is {kind}, not a string or integer"),
            });
        }
        Target::Duplicate => {
            return JsonKey::Invalid(KeyError::Ambiguous {
                detail: format!("the body names a member on the path `{pointer}` twice"),
            });
        }
    };
    JsonKey::Found(ClientKey {
        source: KeySource::JsonPointer,
        value,
    })
}

/// Feeds a length-prefixed field into a hash, so field boundaries are unambiguous.
pub(crate) fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The body, hashed once; the payload check and a keyless fingerprint both use its
/// digest, so a large body is hashed once, not twice. BLAKE3: in the Wasm module it
/// runs on Wasm SIMD (simd128), several times SHA-256's speed there, where no SHA
/// instructions exist.
#[derive(Clone, Default)]
pub struct BodyHasher {
    hasher: blake3::Hasher,
    len: u64,
}

/// BLAKE3 of a request body, with its length.
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
            digest: *self.hasher.finalize().as_bytes(),
            len: self.len,
        }
    }
}

/// The keyless fingerprint of the configured parts (the body enters as its BLAKE3 digest;
/// v1 had its SHA-256).
pub fn fingerprint_key(cfg: &Policy, head: &RequestHead, body: &BodyDigest) -> ClientKey {
    ClientKey {
        source: KeySource::Fingerprint,
        value: parts_digest(
            b"proxy-dedup fingerprint v2\0",
            &cfg.fingerprint,
            head,
            body,
        ),
    }
}

/// SHA-256 of request `parts` after `domain` (the fingerprint's, or the ordering
/// guard's entity parts).
pub fn parts_digest(
    domain: &[u8],
    parts: &[FingerprintPart],
    head: &RequestHead,
    body: &BodyDigest,
) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(domain);
    for part in parts {
        match part {
            FingerprintPart::Method => feed(&mut h, head.method.as_bytes()),
            FingerprintPart::Path => feed(&mut h, head.path_only()),
            FingerprintPart::Query => feed(&mut h, head.query()),
            FingerprintPart::Header(name) => {
                feed_header_part(&mut h, head, name, &FINGERPRINT_LINES)
            }
            FingerprintPart::Body => {
                h.update(body.len.to_be_bytes());
                h.update(body.digest);
            }
        }
    }
    h.finalize().to_vec()
}

/// The version of the record format, first in every record digest: v3 records carry
/// payload digests over BLAKE3 body digests (v2: SHA-256). A record written by another
/// version has another digest, so it is never found, rather than misread (a payload
/// digest of the other format would look like another payload: a false 422).
pub const RECORD_DIGEST_VERSION: &[u8] = b"proxy-dedup record v3\0";

/// The record digest: the records group of a rule (its name, or the one it shares), the
/// authority (unless `scope.authority` is off), scope values and the key,
/// length-prefixed, with the key's source. The top-level records have no group, so their
/// digests are the same with or without rules configured.
/// The store only ever sees this digest, never the raw key, and a client cannot choose a
/// key that lands on another scope's record without a SHA-256 collision.
pub fn record_digest(cfg: &Policy, head: &RequestHead, key: &ClientKey) -> Digest {
    let mut h = Sha256::new();
    h.update(RECORD_DIGEST_VERSION);
    feed_scope(&mut h, cfg, head);
    h.update([match key.source {
        KeySource::Header => 1,
        KeySource::JsonPointer => 2,
        KeySource::Fingerprint => 3,
    }]);
    feed(&mut h, &key.value);
    h.finalize().into()
}

/// The digest of an entity of the ordering guard: scoped like a record (rule group,
/// authority, scope headers), then the version type and where the id came from, so an
/// entity never shares a digest with a record, nor with itself under another version
/// type (whose versions would not compare).
pub fn entity_digest(
    cfg: &Policy,
    head: &RequestHead,
    version_type: u8,
    source: u8,
    value: &[u8],
) -> Digest {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup entity v1\0");
    feed_scope(&mut h, cfg, head);
    h.update([version_type, source]);
    feed(&mut h, value);
    h.finalize().into()
}

/// What a record's scope is, as its digest hashes it: the rule's record group, the
/// authority and the scope headers.
fn feed_scope(h: &mut Sha256, cfg: &Policy, head: &RequestHead) {
    // A distinct marker byte (the authority flag below is 0 or 1), so a group never
    // reads as an authority.
    if let Some(group) = &cfg.records {
        h.update([2]);
        feed(h, group.as_bytes());
    }
    if cfg.scope_authority {
        h.update([1]);
        feed(h, &head.authority.to_ascii_lowercase());
    } else {
        h.update([0]);
    }
    h.update((cfg.scope_headers.len() as u32).to_be_bytes());
    for name in &cfg.scope_headers {
        feed(h, name.as_bytes());
        match head.header(name) {
            Some(v) => {
                h.update([1]);
                feed(h, v);
            }
            None => h.update([0]),
        }
    }
}

/// A short tag of a request's scope (never 0, which marks a record of unknown scope),
/// keyed by the process's bucket secret so no client can pick another scope's tag. The
/// shared-data store keeps it beside each record: a scope's claims evict only its own
/// records, and its live claims in a bucket are bounded.
pub fn scope_tag(cfg: &Policy, head: &RequestHead, secret: &[u8]) -> u32 {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup scope tag v1\0");
    h.update(secret);
    feed_scope(&mut h, cfg, head);
    let d: Digest = h.finalize().into();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]]).max(1)
}

/// Appends `bytes` in lower-case hex (no formatting machinery: record keys are built
/// on every etcd claim).
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// The first bytes of a digest in hex, for logs and filter state; formats only when
/// displayed or asked for its bytes.
pub struct ShortHex<'a>(&'a Digest);

impl ShortHex<'_> {
    /// The 12 lower-hex digits of the digest's first 6 bytes.
    pub fn digits(&self) -> [u8; 12] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 12];
        for (pair, &b) in out.chunks_exact_mut(2).zip(self.0.iter()) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        out
    }
}

impl std::fmt::Display for ShortHex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.digits();
        f.write_str(std::str::from_utf8(&digits).unwrap_or_default())
    }
}

pub fn short_hex(d: &Digest) -> ShortHex<'_> {
    ShortHex(d)
}

#[cfg(test)]
mod tests;
