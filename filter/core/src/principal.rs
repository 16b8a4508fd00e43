//! The caller a record belongs to (`principal`): which part of a request names it, and
//! how a record carries it without keeping it in clear.
//!
//! A record keeps its payload digest (the 422 check). Since this version the digest
//! stored is *sealed* with its caller: its first 20 bytes stay the payload digest's, the
//! last 12 are the payload digest's XOR a mark (4 bytes: a named caller or none) and a
//! salted 8-byte tag of the caller (SHA-256 over the record digest and the principal's
//! bytes). So the record format is unchanged, byte for byte, and comparing the stored
//! digest with the request's sealed one tells every case apart (`compare`):
//! - equal: the same payload of the same caller;
//! - the first 20 bytes differ: another payload (`422 payload-mismatch`);
//! - the tails differ by the "no caller" mark: a record written before records named
//!   their caller (its digest is the payload digest as it was) met by a request with no
//!   principal: the same as before this version;
//! - the tails differ by the "named" mark: such an old record met by a request that
//!   names a caller: nobody can say whose it was (`Unowned`);
//! - any other difference: another caller's record (`OtherCaller`).
//!
//! Records written by this version are always sealed (a request without a principal as
//! "no caller"), so an older filter reads them as another payload: a rollback refuses
//! them with `422`, never runs them again.

use crate::config::PrincipalSource;
use crate::head::RequestHead;
use crate::key::{feed, Digest};
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;

/// Bytes of the payload digest a sealed digest keeps as they are.
const KEPT: usize = 20;
/// The mark of a sealed digest whose request named a caller.
const NAMED: [u8; 4] = *b"PRIN";
/// The mark of a sealed digest whose request named none.
const NOBODY: [u8; 4] = *b"ANON";

/// The principal of a request under `source`: the bytes that name its caller, `None`
/// when the request names none (no such header, cookie or metadata, or an empty one).
/// One value is borrowed from the request as it is; a header or cookie given more than
/// once is all of its values, in order, each length-prefixed after their count, so no
/// single value reads as that list.
pub fn principal<'h>(source: &'h PrincipalSource, head: &'h RequestHead) -> Option<Cow<'h, [u8]>> {
    let one = |v: &'h [u8]| (!v.is_empty()).then_some(Cow::Borrowed(v));
    match source {
        PrincipalSource::None => None,
        PrincipalSource::Metadata { property, .. } => one(head.property(property)?),
        PrincipalSource::Header(name) => {
            let mut lines = head.lines(name);
            match (lines.next(), lines.next()) {
                (None, _) => None,
                (Some(v), None) => one(v),
                _ => Some(Cow::Owned(all_of(head.lines(name)))),
            }
        }
        PrincipalSource::Cookie(name) => match cookies(head, name).as_slice() {
            [] => None,
            [v] => one(v),
            many => Some(Cow::Owned(all_of(many.iter().copied()))),
        },
    }
}

/// Several values as one principal: a marker no single value's length can be, their
/// count, then each length-prefixed.
fn all_of<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let values: Vec<&[u8]> = values.collect();
    let mut out = Vec::new();
    out.extend_from_slice(&u64::MAX.to_be_bytes());
    out.extend_from_slice(&(values.len() as u64).to_be_bytes());
    for v in values {
        out.extend_from_slice(&(v.len() as u64).to_be_bytes());
        out.extend_from_slice(v);
    }
    out
}

/// The values of cookie `name` in the request's `cookie` lines (RFC 6265: `a=1; b=2`),
/// in order. Names compare exactly (cookie names are case-sensitive).
fn cookies<'a>(head: &'a RequestHead, name: &str) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for line in head.lines("cookie") {
        for pair in line.split(|&b| b == b';') {
            let pair = trim(pair);
            if let Some(eq) = pair.iter().position(|&b| b == b'=') {
                if &pair[..eq] == name.as_bytes() {
                    out.push(&pair[eq + 1..]);
                }
            }
        }
    }
    out
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// SHA-256 after `domain` of the record digest (a salt: one caller's hashes differ from
/// record to record) and the principal, if any.
fn caller_hash(domain: &[u8], record: &Digest, principal: Option<&[u8]>) -> Digest {
    let mut h = Sha256::new();
    h.update(domain);
    h.update(record);
    match principal {
        Some(p) => {
            h.update([1]);
            feed(&mut h, p);
        }
        None => h.update([0]),
    }
    h.finalize().into()
}

/// The caller's tag for record `record`: the first 8 bytes of its `caller_hash`.
fn tag(record: &Digest, principal: Option<&[u8]>) -> [u8; 8] {
    let d = caller_hash(b"proxy-dedup principal v1\0", record, principal);
    let mut t = [0u8; 8];
    t.copy_from_slice(&d[..8]);
    t
}

/// The payload digest as the record of `record` stores it for this caller (see the
/// module's note).
pub fn seal(payload: &Digest, record: &Digest, principal: Option<&[u8]>) -> Digest {
    let mark = if principal.is_some() { NAMED } else { NOBODY };
    let t = tag(record, principal);
    let mut out = *payload;
    for (o, m) in out[KEPT..KEPT + 4].iter_mut().zip(mark) {
        *o ^= m;
    }
    for (o, t) in out[KEPT + 4..].iter_mut().zip(t) {
        *o ^= t;
    }
    out
}

/// How a record's stored (sealed) payload digest stands to a request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadMatch {
    /// The same request of the same caller (or an old record and a request that names
    /// no caller, as before callers were recorded).
    Same,
    /// Another method, path or body.
    OtherPayload,
    /// The record is another caller's.
    OtherCaller,
    /// The record was written before records named their caller, and this request
    /// names one: whose it was cannot be told.
    Unowned,
}

/// Compares a record's stored payload digest with this request's sealed one.
pub fn compare(stored: &Digest, mine: &Digest) -> PayloadMatch {
    if stored == mine {
        return PayloadMatch::Same;
    }
    if stored[..KEPT] != mine[..KEPT] {
        return PayloadMatch::OtherPayload;
    }
    let mut d = [0u8; 4];
    for (i, x) in d.iter_mut().enumerate() {
        *x = stored[KEPT + i] ^ mine[KEPT + i];
    }
    match d {
        NOBODY => PayloadMatch::Same,
        NAMED => PayloadMatch::Unowned,
        _ => PayloadMatch::OtherCaller,
    }
}

/// Keyless mode: the record digest a caller's request takes when the fingerprint's own
/// record is another caller's, so two callers' identical requests are two operations.
pub fn caller_record(record: &Digest, principal: Option<&[u8]>) -> Digest {
    caller_hash(b"proxy-dedup caller record v1\0", record, principal)
}

#[cfg(test)]
mod tests;
