//! Stored responses: what is kept of an upstream answer, its encoding in a response slot,
//! and the capture of a response as it streams through the filter.

use crate::key::Digest;

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
    /// Encodes with the owner's digest and claim token, checked again on decode.
    pub fn encode(&self, digest: &Digest, token: u64) -> Vec<u8> {
        let hdr_len: usize = self
            .headers
            .iter()
            .map(|(n, v)| 6 + n.len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(4 + 32 + 8 + 4 + hdr_len + 4 + self.body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(digest);
        out.extend_from_slice(&token.to_be_bytes());
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&(self.headers.len() as u16).to_be_bytes());
        for (n, v) in &self.headers {
            out.extend_from_slice(&(n.len() as u16).to_be_bytes());
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
        }
        out.extend_from_slice(&(self.body.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// Whether a slot holds a response of `digest`/`token` (without decoding it).
    pub fn belongs(bytes: &[u8], digest: &Digest, token: u64) -> bool {
        bytes.get(..4) == Some(MAGIC)
            && bytes.get(4..36) == Some(digest)
            && bytes.get(36..44) == Some(&token.to_be_bytes()[..])
    }

    /// Decodes a slot; `None` unless it is well-formed and belongs to `digest`/`token`.
    pub fn decode(bytes: &[u8], digest: &Digest, token: u64) -> Option<StoredResponse> {
        let mut r = Reader { b: bytes };
        if r.take(4)? != MAGIC || r.take(32)? != digest || r.u64()? != token {
            return None;
        }
        let status = r.u16()?;
        let n = r.u16()? as usize;
        let mut headers = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            let nl = r.u16()? as usize;
            let name = std::str::from_utf8(r.take(nl)?).ok()?.to_string();
            let vl = r.u32()? as usize;
            headers.push((name, r.take(vl)?.to_vec()));
        }
        let bl = r.u32()? as usize;
        let body = r.take(bl)?.to_vec();
        if !r.b.is_empty() {
            return None;
        }
        Some(StoredResponse {
            status,
            headers,
            body,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut x = [0u8; 8];
        x.copy_from_slice(b);
        Some(u64::from_be_bytes(x))
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

impl Capture {
    /// Starts a capture from the response headers (all pairs, repeated headers included).
    pub fn new(status: u16, pairs: Vec<(String, Vec<u8>)>, cap: usize) -> Self {
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
        let headers = pairs
            .into_iter()
            .filter(|(n, _)| keeps_header(n, &tokens))
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect();
        Capture {
            status,
            headers,
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
mod tests;
