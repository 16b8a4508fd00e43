//! The HTTP values a test builds and inspects: the client's [`Request`], the
//! [`Response`] the client gets, what an upstream or cluster sees
//! ([`UpstreamRequest`]) and what it answers ([`Reply`]).

/// Header list as Envoy keeps it: ordered, names lower case, repeats allowed.
pub type Headers = Vec<(String, String)>;

pub(crate) fn header_get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request sent by a downstream client.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authority: String,
    pub headers: Headers,
    /// Body chunks, delivered one `on_request_body` call each (as separate
    /// network reads would be). Empty: no body, headers end the stream.
    pub chunks: Vec<Vec<u8>>,
    pub trailers: Headers,
    /// Client address, `ip:port` (the `source.address` property).
    pub source_address: String,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            authority: "localhost".to_string(),
            headers: Vec::new(),
            chunks: Vec::new(),
            trailers: Vec::new(),
            source_address: "127.0.0.1:50000".to_string(),
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn post(path: &str) -> Request {
        Request::new("POST", path)
    }

    pub fn put(path: &str) -> Request {
        Request::new("PUT", path)
    }

    pub fn patch(path: &str) -> Request {
        Request::new("PATCH", path)
    }

    pub fn delete(path: &str) -> Request {
        Request::new("DELETE", path)
    }

    /// Adds a header (name lower-cased, as Envoy's codec does).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn authority(mut self, authority: &str) -> Request {
        self.authority = authority.to_string();
        self
    }

    /// The whole body, delivered as one chunk with end of stream.
    pub fn body(mut self, body: impl AsRef<[u8]>) -> Request {
        self.chunks = vec![body.as_ref().to_vec()];
        self
    }

    /// The body as separate chunks (each its own `on_request_body` call).
    pub fn chunks<I, B>(mut self, chunks: I) -> Request
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.chunks = chunks.into_iter().map(|c| c.as_ref().to_vec()).collect();
        self
    }

    pub fn trailer(mut self, name: &str, value: &str) -> Request {
        self.trailers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn source_address(mut self, address: &str) -> Request {
        self.source_address = address.to_string();
        self
    }

    pub fn body_len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// The header map Envoy hands the filter: pseudo headers first, the
    /// client's headers, then what the connection manager adds.
    pub(crate) fn envoy_headers(&self, request_id: &str) -> Headers {
        let mut h: Headers = vec![
            (":authority".into(), self.authority.clone()),
            (":path".into(), self.path.clone()),
            (":method".into(), self.method.clone()),
            (":scheme".into(), "http".into()),
        ];
        h.extend(self.headers.iter().cloned());
        if self.body_len() > 0
            && header_get(&self.headers, "content-length").is_none()
            && header_get(&self.headers, "transfer-encoding").is_none()
        {
            h.push(("content-length".into(), self.body_len().to_string()));
        }
        if header_get(&h, "x-forwarded-proto").is_none() {
            h.push(("x-forwarded-proto".into(), "http".into()));
        }
        if header_get(&h, "x-request-id").is_none() {
            h.push(("x-request-id".into(), request_id.to_string()));
        }
        h
    }
}

/// What the upstream (or a cluster, for `proxy_http_call`) received.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamRequest {
    /// All headers, pseudo headers included, as the filter left them.
    pub headers: Headers,
    pub body: Vec<u8>,
    pub trailers: Headers,
}

impl UpstreamRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_get(&self.headers, name)
    }

    pub fn method(&self) -> &str {
        self.header(":method").unwrap_or("")
    }

    pub fn path(&self) -> &str {
        self.header(":path").unwrap_or("")
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReplyKind {
    Response,
    Reset,
    NoAnswer,
}

/// An answer from the upstream service or from a cluster of `proxy_http_call`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub status: u16,
    pub headers: Headers,
    /// Body chunks; each is one `on_response_body` call. Empty: no body.
    pub chunks: Vec<Vec<u8>>,
}

impl Reply {
    pub fn new(status: u16) -> Reply {
        Reply {
            kind: ReplyKind::Response,
            status,
            headers: Vec::new(),
            chunks: Vec::new(),
        }
    }

    pub fn ok() -> Reply {
        Reply::new(200)
    }

    /// The connection is reset before any response. Upstream: Envoy's router
    /// answers 503 (through the filter). Callout: the callback gets 0 headers.
    pub fn reset() -> Reply {
        Reply {
            kind: ReplyKind::Reset,
            ..Reply::new(0)
        }
    }

    /// Never answers. Upstream: the route timeout fires (504 through the
    /// filter). Callout: the call's timeout fires (504, "upstream request
    /// timeout"); with timeout 0 the callback never comes.
    pub fn no_answer() -> Reply {
        Reply {
            kind: ReplyKind::NoAnswer,
            ..Reply::new(0)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn body(mut self, body: impl AsRef<[u8]>) -> Reply {
        self.chunks = vec![body.as_ref().to_vec()];
        self
    }

    pub fn chunks<I, B>(mut self, chunks: I) -> Reply
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.chunks = chunks.into_iter().map(|c| c.as_ref().to_vec()).collect();
        self
    }

    pub fn body_bytes(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    /// `:status` first, then the headers, with a content-length as an
    /// upstream HTTP/1.1 server would send.
    pub(crate) fn envoy_headers(&self) -> Headers {
        let mut h: Headers = vec![(":status".into(), self.status.to_string())];
        h.extend(self.headers.iter().cloned());
        let len: usize = self.chunks.iter().map(Vec::len).sum();
        if header_get(&self.headers, "content-length").is_none()
            && header_get(&self.headers, "transfer-encoding").is_none()
        {
            h.push(("content-length".into(), len.to_string()));
        }
        h
    }
}

/// What the downstream client got.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// 0 if the stream was reset before any response headers.
    pub status: u16,
    /// Response headers as sent downstream, without `:status`.
    pub headers: Headers,
    pub body: Vec<u8>,
    /// The upstream handler received this request (the filter let the
    /// headers and the whole body through).
    pub upstream_called: bool,
    /// The request headers reached the upstream (router) even if the body
    /// never did (e.g. Continue at headers, then a local reply at body end).
    pub upstream_headers_sent: bool,
    /// The answer is a local reply (from the filter, or Envoy's own: 503 on
    /// a failed VM, 504 route timeout, 503 upstream reset).
    pub local_reply: bool,
    /// The stream was reset (by the client, by the filter's close_stream, or
    /// by an upstream reset after the response had started).
    pub reset: bool,
    /// What the upstream saw, when it was called.
    pub upstream_request: Option<UpstreamRequest>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_get(&self.headers, name)
    }

    /// All values of a repeated header.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}
