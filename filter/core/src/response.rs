//! Stored responses: what is kept of an upstream answer, its encoding in a response slot,
//! and the capture of a response as it streams through the filter.

use crate::key::Digest;
use crate::wire::{Reader, WireError, Writer};

const MAGIC: &[u8; 4] = b"PDR1";

/// Headers never stored or replayed: hop-by-hop (RFC 9110 7.6.1), per-connection framing
/// that Envoy recomputes for a local reply, and `set-cookie`, which belongs to one client
/// session and must not be handed to a retrying one.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "set-cookie",
    "set-cookie2",
];

/// A response as replayed: status, end-to-end headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Whether a response header is kept for replay. `connection_tokens` are the header names
/// listed in the response's `Connection` header, which are hop-by-hop too.
pub fn keeps_header(name: &str, connection_tokens: &[String]) -> bool {
    let lower = name.to_ascii_lowercase();
    !(lower.starts_with(':')
        || lower.starts_with("x-envoy-")
        || DROPPED.contains(&lower.as_str())
        || connection_tokens.iter().any(|t| t == &lower))
}

impl StoredResponse {
    /// Bytes of the encoding.
    pub fn encoded_len(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| 6 + n.len() + v.len())
            .sum();
        4 + 32 + 8 + 2 + 2 + headers + 4 + self.body.len()
    }

    /// Encodes with the owner's digest and claim token, checked again on decode.
    pub fn encode(&self, digest: &Digest, token: u64) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.encoded_len());
        self.write(&mut w, digest, token);
        w.finish()
    }

    /// Magic, digest, token, status, headers (u16 name size, name, u32 value size,
    /// value), u32 body size, body.
    pub fn write(&self, w: &mut Writer, digest: &Digest, token: u64) {
        w.bytes(MAGIC)
            .bytes(digest)
            .u64(token)
            .u16(self.status)
            .u16(self.headers.len() as u16);
        for (n, v) in &self.headers {
            w.u16(n.len() as u16)
                .bytes(n.as_bytes())
                .u32(v.len() as u32)
                .bytes(v);
        }
        w.u32(self.body.len() as u32).bytes(&self.body);
    }

    /// Whether a slot holds a response of `digest`/`token` (without decoding it).
    pub fn belongs(bytes: &[u8], digest: &Digest, token: u64) -> bool {
        Self::owned_by(&mut Reader::new(bytes), digest, token).unwrap_or(false)
    }

    fn owned_by(r: &mut Reader<'_>, digest: &Digest, token: u64) -> Result<bool, WireError> {
        Ok(r.bytes(4)? == MAGIC && r.bytes(32)? == digest && r.u64()? == token)
    }

    /// Decodes a slot; `None` unless it is well-formed and belongs to `digest`/`token`.
    pub fn decode(bytes: &[u8], digest: &Digest, token: u64) -> Option<StoredResponse> {
        Self::read(bytes, digest, token).ok().flatten()
    }

    fn read(bytes: &[u8], digest: &Digest, token: u64) -> Result<Option<Self>, WireError> {
        let mut r = Reader::new(bytes);
        if !Self::owned_by(&mut r, digest, token)? {
            return Ok(None);
        }
        let status = r.u16()?;
        let n = r.u16()? as usize;
        let mut headers = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            let nl = r.u16()? as usize;
            let name = r.str(nl)?.to_string();
            let vl = r.u32()? as usize;
            headers.push((name, r.bytes(vl)?.to_vec()));
        }
        let bl = r.u32()? as usize;
        let body = r.bytes(bl)?.to_vec();
        r.end()?;
        Ok(Some(StoredResponse {
            status,
            headers,
            body,
        }))
    }
}

/// Collects an upstream response as it passes, up to a body cap.
#[derive(Debug, Clone)]
pub struct Capture {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    cap: usize,
    overflow: bool,
}

/// The response headers a replay carries (lower-cased): all pairs but hop-by-hop ones
/// (including those the response's `Connection` header lists), framing, `x-envoy-*`
/// and `set-cookie`.
/// The `:status` of a header map (0 when it has none, or not a number).
pub fn status_of(pairs: &[(String, Vec<u8>)]) -> u16 {
    pairs
        .iter()
        .find(|(n, _)| n == ":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
        .unwrap_or(0)
}

pub fn kept_headers(pairs: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    let tokens: Vec<String> = pairs
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    pairs
        .into_iter()
        .filter(|(n, _)| keeps_header(n, &tokens))
        .map(|(n, v)| (n.to_ascii_lowercase(), v))
        .collect()
}

impl Capture {
    /// Starts a capture from the response headers (all pairs, repeated headers included).
    pub fn new(status: u16, pairs: Vec<(String, Vec<u8>)>, cap: usize) -> Self {
        Capture {
            status,
            headers: kept_headers(pairs),
            body: Vec::new(),
            cap,
            overflow: false,
        }
    }

    pub fn body(&mut self, chunk: &[u8]) {
        if self.overflow {
            return;
        }
        if self.body.len() + chunk.len() > self.cap {
            self.overflow = true;
            self.body = Vec::new();
            return;
        }
        self.body.extend_from_slice(chunk);
    }

    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Marks the capture unusable (a body chunk could not be read).
    pub fn poison(&mut self) {
        self.overflow = true;
        self.body = Vec::new();
    }

    /// The stored response, or `None` if the body went over the cap.
    pub fn finish(self) -> Option<StoredResponse> {
        if self.overflow {
            return None;
        }
        Some(StoredResponse {
            status: self.status,
            headers: self.headers,
            body: self.body,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
