//! The request head as the filter sees it: a leaf (the configuration selects rules by
//! it, the key and payload code read it), depending on nothing else of the crate.

/// The request head as the filter sees it. Header names are lower-case. Everything that
/// can enter a digest (path, authority, header values) is kept as the bytes Envoy
/// delivered: a lossy text conversion would let two different byte strings meet in one
/// record (issue 21). Valid UTF-8 hashes exactly as it did when these were `String`s.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// `:method`. Text: a method is deduplicated only when it equals a configured
    /// (upper-case ASCII) method, so how other bytes read never reaches a digest.
    pub method: String,
    /// Path including the query string, as in `:path`.
    pub path: Vec<u8>,
    /// `:authority` (the Host), as the client sent it.
    pub authority: Vec<u8>,
    /// Regular headers (no pseudo-headers), repeated lines as separate pairs.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Envoy's `request.protocol` (`HTTP/1.1`, `HTTP/2`, `HTTP/3`). The glue reads it
    /// only for a request with a gRPC content type (see `is_grpc`); empty otherwise.
    pub protocol: String,
    /// Envoy properties the configuration reads from a request (a `principal` from
    /// dynamic metadata), by their NUL-joined path, as the glue read them at request
    /// headers; a property Envoy does not have is not listed.
    pub properties: Vec<(String, Vec<u8>)>,
}

/// Bytes from the host as text, without a copy when they are valid UTF-8.
pub fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl RequestHead {
    /// The request head from Envoy's header map `pairs`. Values stay the bytes Envoy
    /// delivered: they enter record digests, where a lossy conversion would let two
    /// different values meet (issue 21). Only `:method` becomes text (a method that is
    /// not UTF-8 never equals a configured method, so it is never deduplicated). Names
    /// come lower-cased from Envoy; one that is not UTF-8 (Envoy's codecs accept only
    /// tokens) cannot equal a configured name however it reads. `protocol` (Envoy's
    /// `request.protocol`, a host call) is asked only for a gRPC content type.
    pub fn from_pairs(
        pairs: Vec<(String, Vec<u8>)>,
        protocol: impl FnOnce() -> String,
    ) -> RequestHead {
        let mut head = RequestHead::default();
        for (mut name, value) in pairs {
            match name.as_str() {
                ":method" => head.method = text(value),
                ":path" => head.path = value,
                ":authority" => head.authority = value,
                n if n.starts_with(':') => {}
                _ => {
                    // Envoy hands header names in lower case already: this copies nothing.
                    name.make_ascii_lowercase();
                    head.headers.push((name, value));
                }
            }
        }
        // gRPC is HTTP/2 or HTTP/3 with a gRPC content type; the protocol costs a host
        // call, so it is read only when the content type says gRPC.
        if head.grpc_content_type() {
            head.protocol = protocol();
        }
        head
    }

    /// First value of a header (names compare case-insensitively); `:authority`,
    /// `:path` and `:method` name the pseudo-headers.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        if let Some(v) = self.pseudo(name) {
            return Some(v);
        }
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Every line of a header, in the order Envoy delivered them (a pseudo-header has
    /// one line).
    pub fn lines<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        let pseudo = self.pseudo(name);
        let regular = self
            .headers
            .iter()
            .filter(move |(n, _)| pseudo.is_none() && n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice());
        pseudo.into_iter().chain(regular)
    }

    /// A property the glue read for this request (see `properties`).
    pub fn property(&self, path: &str) -> Option<&[u8]> {
        self.properties
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v.as_slice())
    }

    /// How many lines carry this header (a pseudo-header counts once).
    pub fn header_count(&self, name: &str) -> usize {
        self.lines(name).count()
    }

    fn pseudo(&self, name: &str) -> Option<&[u8]> {
        match name {
            ":authority" => Some(&self.authority),
            ":path" => Some(&self.path),
            ":method" => Some(self.method.as_bytes()),
            _ => None,
        }
    }

    /// Whether the content type says gRPC (`application/grpc`, `+proto`, `+json`,
    /// `-web`…). The client chooses it: alone it decides nothing (see `is_grpc`); the
    /// glue reads the protocol only when it holds.
    pub fn grpc_content_type(&self) -> bool {
        self.header("content-type").is_some_and(|ct| {
            ct.get(..16)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        })
    }

    /// Whether the request really is gRPC: a gRPC content type over HTTP/2 or HTTP/3
    /// (gRPC needs either). Over HTTP/1.1 a gRPC content type is only a label a client
    /// can put on any request, so such a request is deduplicated like any other.
    pub fn is_grpc(&self) -> bool {
        (self.protocol.starts_with("HTTP/2") || self.protocol.starts_with("HTTP/3"))
            && self.grpc_content_type()
    }

    pub(crate) fn path_only(&self) -> &[u8] {
        split_query(&self.path).0
    }

    pub(crate) fn query(&self) -> &[u8] {
        split_query(&self.path).1
    }
}

/// The path and the query (after the first `?`; empty without one).
pub(crate) fn split_query(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().position(|&b| b == b'?') {
        Some(at) => (
            path.get(..at).unwrap_or_default(),
            path.get(at + 1..).unwrap_or_default(),
        ),
        None => (path, &[]),
    }
}
