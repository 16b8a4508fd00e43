//! The ordering guard's request side: a request's entity and version, read from where
//! the policy's `ordering` says, and the version's order-preserving bytes. The entities'
//! state and their shared-data buckets are in `ordering/entities.rs`.
//!
//! A version is stored as a type byte and bytes that compare, byte by byte, as the
//! versions do: a signed integer as its 8 big-endian bytes with the sign bit flipped; an
//! RFC 3339 timestamp as the instant it names (seconds the same way, then 4 bytes of
//! nanoseconds), whatever its offset; a string as its bytes. So one comparison serves
//! every type, in every store.

pub mod entities;

use crate::config::{
    EntitySource, Ordering, Policy, VersionSource, VersionType, MAX_ENTITY_BYTES, MAX_VERSION_BYTES,
};
use crate::head::RequestHead;
use crate::httpdate::{civil_from_days, days_from_civil};
use crate::jsonptr::{self, NotJson, Target};
use crate::key::{entity_digest, parts_digest, validate_key, BodyDigest, Digest};

/// A version, as it is stored and compared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(Vec<u8>);

const TYPE_INTEGER: u8 = 1;
const TYPE_TIMESTAMP: u8 = 2;
const TYPE_STRING: u8 = 3;
const SIGN: u64 = 1 << 63;

fn type_byte(t: VersionType) -> u8 {
    match t {
        VersionType::Integer => TYPE_INTEGER,
        VersionType::Timestamp => TYPE_TIMESTAMP,
        VersionType::String => TYPE_STRING,
    }
}

impl Version {
    /// A version from its text (a header value, or a JSON string's content).
    pub fn parse(t: VersionType, text: &[u8]) -> Result<Version, String> {
        match t {
            VersionType::Integer => {
                let n = parse_integer(text).ok_or("is not a decimal integer within 64 bits")?;
                Ok(Version::integer(n))
            }
            VersionType::Timestamp => {
                let (secs, nanos) = parse_rfc3339(text).ok_or(
                    "is not an RFC 3339 date-time with an offset (e.g. 2026-12-02T10:00:00Z)",
                )?;
                let mut b = Vec::with_capacity(13);
                b.push(TYPE_TIMESTAMP);
                b.extend_from_slice(&((secs as u64) ^ SIGN).to_be_bytes());
                b.extend_from_slice(&nanos.to_be_bytes());
                Ok(Version(b))
            }
            VersionType::String => {
                let v = validate_key(text, MAX_VERSION_BYTES, "it")
                    .map_err(|e| e.detail().trim_start_matches("it ").to_string())?;
                let mut b = Vec::with_capacity(v.len() + 1);
                b.push(TYPE_STRING);
                b.extend_from_slice(&v);
                Ok(Version(b))
            }
        }
    }

    fn integer(n: i64) -> Version {
        let mut b = Vec::with_capacity(9);
        b.push(TYPE_INTEGER);
        b.extend_from_slice(&((n as u64) ^ SIGN).to_be_bytes());
        Version(b)
    }

    /// The stored bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A version read back from a store: `None` for bytes no version writes.
    pub fn from_stored(b: &[u8]) -> Option<Version> {
        let ok = match b.split_first()? {
            (&TYPE_INTEGER, rest) => rest.len() == 8,
            (&TYPE_TIMESTAMP, rest) => rest.len() == 12,
            (&TYPE_STRING, rest) => !rest.is_empty() && rest.len() <= MAX_VERSION_BYTES,
            _ => false,
        };
        ok.then(|| Version(b.to_vec()))
    }

    /// The version as a client wrote it, normalised: an integer in decimal, a timestamp
    /// in UTC (`2026-12-02T10:00:00.5Z`), a string as it is.
    pub fn show(&self) -> String {
        let Some((t, rest)) = self.0.split_first() else {
            return String::new();
        };
        let be8 =
            |b: &[u8]| -> Option<u64> { Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?)) };
        match *t {
            TYPE_INTEGER => be8(rest).map_or_else(String::new, |v| ((v ^ SIGN) as i64).to_string()),
            TYPE_TIMESTAMP => {
                let secs = be8(rest).map_or(0, |v| (v ^ SIGN) as i64);
                let nanos = rest
                    .get(8..12)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u32::from_be_bytes);
                show_rfc3339(secs, nanos)
            }
            _ => String::from_utf8_lossy(rest).into_owned(),
        }
    }
}

/// Why a request's entity or version could not be read (a `400`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderingError {
    MissingEntity(String),
    InvalidEntity(String),
    MissingVersion(String),
    InvalidVersion(String),
}

/// What the guard needs of one request: its entity's digest (scoped like its record,
/// and by the version type) and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    pub entity: Digest,
    pub version: Version,
}

/// The request's entity and version under `o`.
pub fn ordered(
    policy: &Policy,
    o: &Ordering,
    head: &RequestHead,
    raw_body: &[u8],
    body: &BodyDigest,
) -> Result<Ordered, OrderingError> {
    let (source, value) = match &o.entity {
        EntitySource::Header(name) => {
            let what = format!("the entity header `{name}`");
            let raw = one_header(head, name)
                .map_err(|()| {
                    OrderingError::InvalidEntity(format!("{what} is sent more than once"))
                })?
                .ok_or_else(|| OrderingError::MissingEntity(format!("{what} is missing")))?;
            let v = validate_key(raw, MAX_ENTITY_BYTES, &what)
                .map_err(|e| OrderingError::InvalidEntity(e.detail().to_string()))?;
            (1u8, v)
        }
        EntitySource::JsonPointer(ptr) => {
            let what = format!("the entity at `{ptr}` in the JSON body");
            let v = match json_at(raw_body, ptr) {
                Err(reason) => {
                    return Err(OrderingError::MissingEntity(format!("{what}: {reason}")))
                }
                Ok(Target::Missing) => {
                    return Err(OrderingError::MissingEntity(format!("{what} is missing")))
                }
                Ok(Target::Str(s)) => validate_key(s.as_bytes(), MAX_ENTITY_BYTES, &what)
                    .map_err(|e| OrderingError::InvalidEntity(e.detail().to_string()))?,
                Ok(Target::Int(n)) => n.into_bytes(),
                Ok(Target::Other(kind)) => {
                    return Err(OrderingError::InvalidEntity(format!(
                        "{what} is {kind}, not a string or integer"
                    )))
                }
                Ok(Target::Duplicate) => {
                    return Err(OrderingError::InvalidEntity(format!(
                        "the body names a member on the path `{ptr}` twice"
                    )))
                }
            };
            (2, v)
        }
        EntitySource::Parts(parts) => (
            3,
            parts_digest(b"proxy-dedup entity parts v1\0", parts, head, body),
        ),
    };
    let version = version_of(o, head, raw_body)?;
    Ok(Ordered {
        entity: entity_digest(policy, head, type_byte(o.version_type), source, &value),
        version,
    })
}

fn version_of(o: &Ordering, head: &RequestHead, raw_body: &[u8]) -> Result<Version, OrderingError> {
    let t = o.version_type;
    match &o.version {
        VersionSource::Header(name) => {
            let what = format!("the version header `{name}`");
            let raw = one_header(head, name)
                .map_err(|()| {
                    OrderingError::InvalidVersion(format!("{what} is sent more than once"))
                })?
                .ok_or_else(|| OrderingError::MissingVersion(format!("{what} is missing")))?;
            Version::parse(t, raw).map_err(|e| OrderingError::InvalidVersion(format!("{what} {e}")))
        }
        VersionSource::JsonPointer(ptr) => {
            let what = format!("the version at `{ptr}` in the JSON body");
            match json_at(raw_body, ptr) {
                Err(reason) => Err(OrderingError::MissingVersion(format!("{what}: {reason}"))),
                Ok(Target::Missing) => {
                    Err(OrderingError::MissingVersion(format!("{what} is missing")))
                }
                Ok(Target::Str(s)) => Version::parse(t, s.as_bytes())
                    .map_err(|e| OrderingError::InvalidVersion(format!("{what} {e}"))),
                Ok(Target::Int(n)) if t == VersionType::Integer => Version::parse(t, n.as_bytes())
                    .map_err(|e| OrderingError::InvalidVersion(format!("{what} {e}"))),
                Ok(Target::Int(_)) => Err(OrderingError::InvalidVersion(format!(
                    "{what} is a number; the version type `{}` takes a string",
                    if t == VersionType::Timestamp {
                        "timestamp"
                    } else {
                        "string"
                    }
                ))),
                Ok(Target::Other(kind)) => {
                    Err(OrderingError::InvalidVersion(format!("{what} is {kind}")))
                }
                Ok(Target::Duplicate) => Err(OrderingError::InvalidVersion(format!(
                    "the body names a member on the path `{ptr}` twice"
                ))),
            }
        }
    }
}

/// A header's one value: `Err` when it is sent on more than one line.
fn one_header<'h>(head: &'h RequestHead, name: &str) -> Result<Option<&'h [u8]>, ()> {
    if head.header_count(name) > 1 {
        return Err(());
    }
    Ok(head.header(name))
}

fn json_at(body: &[u8], ptr: &str) -> Result<Target, String> {
    jsonptr::find(body, ptr).map_err(|NotJson(e)| format!("the body is not valid JSON ({e})"))
}

/// `[-]digits`, within i64; no sign `+`, no spaces.
fn parse_integer(text: &[u8]) -> Option<i64> {
    let (neg, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i128 = 0;
    for d in digits {
        n = n * 10 + i128::from(d - b'0');
    }
    i64::try_from(if neg { -n } else { n }).ok()
}

/// RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` (`T` or `t` or a
/// space, `Z` or `z`; a leap second `:60` counts as the next second; at most 9 fraction
/// digits). The instant as seconds since the Unix epoch and nanoseconds.
pub fn parse_rfc3339(text: &[u8]) -> Option<(i64, u32)> {
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let b = text.get(r)?;
        if !b.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(b.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |i: usize| text.get(i).copied();
    if at(4)? != b'-' || at(7)? != b'-' || !matches!(at(10)?, b'T' | b't' | b' ') {
        return None;
    }
    if at(13)? != b':' || at(16)? != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if at(i) == Some(b'.') {
        i += 1;
        let start = i;
        while at(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        let digits = text.get(start..i)?;
        if digits.is_empty() || digits.len() > 9 {
            return None;
        }
        let mut n = 0u32;
        for k in 0..9 {
            n = n * 10 + digits.get(k).map_or(0, |c| u32::from(c - b'0'));
        }
        nanos = n;
    }
    let offset = match at(i)? {
        b'Z' | b'z' if i + 1 == text.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == text.len() && at(i + 3)? == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset;
    Some((secs, nanos))
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn show_rfc3339(secs: i64, nanos: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let mut out = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

#[cfg(test)]
mod tests;
