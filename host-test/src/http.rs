//! The HTTP values a test builds and inspects: the client's [`Request`], the
//! [`Response`] the client gets, what an upstream or cluster sees
//! ([`UpstreamRequest`]) and what it answers ([`Reply`]).

/// Identifies a stream started with [`crate::Envoy::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(pub u64);

/// Header list as Envoy keeps it: ordered, names lower case, repeats allowed.
pub type Headers = Vec<(String, String)>;

pub(crate) fn header_get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The builder methods a [`Request`] and a [`Reply`] share: headers and
/// the body, whole or in chunks.
macro_rules! message_builder {
    ($t:ty) => {
        impl $t {
            /// Adds a header (name lower-cased, as Envoy's codec does).
            pub fn header(mut self, name: &str, value: &str) -> Self {
                self.headers
                    .push((name.to_ascii_lowercase(), value.to_string()));
                self
            }

            /// The whole body, delivered as one chunk with end of stream.
            pub fn body(mut self, body: impl AsRef<[u8]>) -> Self {
                self.chunks = vec![body.as_ref().to_vec()];
                self
            }

            /// The body as separate chunks (each its own body callback).
            pub fn chunks<I, B>(mut self, chunks: I) -> Self
            where
                I: IntoIterator<Item = B>,
                B: AsRef<[u8]>,
            {
                self.chunks = chunks.into_iter().map(|c| c.as_ref().to_vec()).collect();
                self
            }
        }
    };
}

message_builder!(Request);
message_builder!(Reply);

/// The builder methods an [`crate::EnvoyBuilder`] (every request) and a
/// [`Request`] (this one, replacing the builder's namespace or path) share:
/// what earlier filters and Envoy let the filter read.
macro_rules! filter_inputs {
    ($t:ty) => {
        impl $t {
            /// Dynamic metadata an earlier filter set (e.g.
            /// `envoy.filters.http.set_metadata`, JWT claims): the filter
            /// reads it as `metadata.filter_metadata.<namespace>...`, in
            /// Envoy's encodings. A request's replaces the builder's
            /// [`crate::EnvoyBuilder::filter_metadata`] of the same namespace.
            pub fn filter_metadata(mut self, namespace: &str, value: crate::Value) -> Self {
                self.filter_metadata.push((namespace.to_string(), value));
                self
            }

            /// Any other property the filter may read, by path segments,
            /// as the raw bytes Envoy would return (for anything host-test
            /// does not model).
            pub fn property(mut self, path: &[&str], value: impl AsRef<[u8]>) -> Self {
                let path = path.iter().map(|p| p.to_string()).collect();
                self.properties.push((path, value.as_ref().to_vec()));
                self
            }
        }
    };
}

pub(crate) use filter_inputs;

filter_inputs!(Request);

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
    /// Dynamic metadata set by filters before ours, by namespace.
    pub filter_metadata: Vec<(String, crate::Value)>,
    /// Other properties the filter can read, by path segments, raw bytes.
    pub properties: Vec<(Vec<String>, Vec<u8>)>,
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
            filter_metadata: Vec::new(),
            properties: Vec::new(),
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

    pub fn authority(mut self, authority: &str) -> Request {
        self.authority = authority.to_string();
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
    /// All headers, pseudo headers included, as the filter left them; for
    /// the route's upstream, the router's `x-envoy-expected-rq-timeout-ms`
    /// (the route timeout) last, unless `suppress_envoy_headers`.
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
    ConnectFailure,
    NoHealthyUpstream,
    Overflow,
    ResetAfterHeaders,
    NoAnswerAfterHeaders,
    /// A local reply by a filter after ours (or the router's own
    /// direct_response), with its `response.code_details`.
    Local(String),
}

/// An answer from the upstream service or from a cluster of `proxy_http_call`.
///
/// Each way an answer can come about sets what the filter reads of its
/// origin (`response.code_details`, `response.flags`, `response.code`,
/// `upstream.address`) as Envoy 1.40 does; the table is in
/// `host-test/PROBES.md`, "Response origin".
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub status: u16,
    pub headers: Headers,
    /// Body chunks; each is one `on_response_body` call. Empty: no body.
    pub chunks: Vec<Vec<u8>>,
    /// Response flags added to the ones the kind of answer sets
    /// ([`Reply::with_flags`]).
    pub(crate) flags: u64,
    /// For a cluster of `proxy_http_call` in process: how long (virtual
    /// time) the answer takes ([`Reply::after`]).
    pub(crate) delay: std::time::Duration,
}

impl Reply {
    /// The upstream answers (`via_upstream`, no flags), whatever the status.
    pub fn new(status: u16) -> Reply {
        Reply {
            kind: ReplyKind::Response,
            status,
            headers: Vec::new(),
            chunks: Vec::new(),
            flags: 0,
            delay: std::time::Duration::ZERO,
        }
    }

    pub fn ok() -> Reply {
        Reply::new(200)
    }

    fn of(kind: ReplyKind, status: u16) -> Reply {
        Reply {
            kind,
            ..Reply::new(status)
        }
    }

    /// The upstream closes (or resets) the connection after reading the
    /// request, before any response. Upstream: Envoy's router answers 503
    /// through the filter, `upstream_reset_before_response_started{connection_termination}`,
    /// flag UC, `upstream.address` set. Callout: the callback gets 0 headers.
    pub fn reset() -> Reply {
        Reply::of(ReplyKind::Reset, 0)
    }

    /// Never answers. Upstream: the route timeout fires (504 through the
    /// filter, `response_timeout`, flag UT, `upstream.address` set).
    /// Callout: the call's timeout fires (504, "upstream request timeout");
    /// with timeout 0 the callback never comes.
    pub fn no_answer() -> Reply {
        Reply::of(ReplyKind::NoAnswer, 0)
    }

    /// The upstream host refuses the connection: the request never reached
    /// the service. Upstream: 503 through the filter,
    /// `upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}`,
    /// flag UF, `upstream.address` set (the host tried). Callout: 503.
    pub fn connect_failure() -> Reply {
        Reply::of(ReplyKind::ConnectFailure, 503)
    }

    /// The cluster has no healthy host (none configured, or all failing
    /// health checks): the request never left Envoy. Upstream: 503 "no
    /// healthy upstream" through the filter, `no_healthy_upstream`, flag UH,
    /// no `upstream.address`. Callout: 503.
    pub fn no_healthy_upstream() -> Reply {
        Reply::of(ReplyKind::NoHealthyUpstream, 503)
    }

    /// The cluster's circuit breaker is open: the request never left Envoy.
    /// Upstream: 503 through the filter,
    /// `upstream_reset_before_response_started{overflow}`, flag UO, no
    /// `upstream.address`. Callout: 503.
    pub fn overflow() -> Reply {
        Reply::of(ReplyKind::Overflow, 503)
    }

    /// The upstream sends the response headers (`status`, with a
    /// content-length larger than what follows) and `partial_body`, then
    /// closes the connection. The filter sees the headers and the partial
    /// body as `via_upstream` (body without end of stream); the client gets
    /// them and then a reset; in `on_log` the details are
    /// `upstream_reset_after_response_started{protocol_error}`, flag UPE
    /// (what an HTTP/1.1 upstream closing mid-body gives in Envoy 1.40,
    /// with FIN or RST alike), `response.code` stays `status`.
    /// Callout: reset (0 headers).
    pub fn reset_after_headers(status: u16, partial_body: impl AsRef<[u8]>) -> Reply {
        Reply::of(ReplyKind::ResetAfterHeaders, status).partial_body(partial_body)
    }

    /// The upstream sends the response headers and `partial_body`, then
    /// nothing: the route timeout fires (on the virtual clock) and Envoy
    /// resets the stream; in `on_log` the details are `response_timeout`,
    /// flag UT, `response.code` stays `status`. Callout: reset (0 headers)
    /// at the call's timeout.
    pub fn no_answer_after_headers(status: u16, partial_body: impl AsRef<[u8]>) -> Reply {
        Reply::of(ReplyKind::NoAnswerAfterHeaders, status).partial_body(partial_body)
    }

    fn partial_body(mut self, partial_body: impl AsRef<[u8]>) -> Reply {
        let body = partial_body.as_ref();
        if !body.is_empty() {
            self.chunks = vec![body.to_vec()];
        }
        self
    }

    /// A local reply from a filter after ours in the chain (rate limit,
    /// ext_authz, RBAC, ...) or from the router (no route, unknown cluster):
    /// the request never reached the upstream. It passes through our
    /// filter's response callbacks with `response.code_details` = `details`
    /// and `response.flags` = `flags`, no `upstream.address`. Add a body
    /// with [`Reply::body`] (Envoy adds `content-type: text/plain`).
    /// E.g. `Reply::local(404, "route_not_found", response_flags::NR)`.
    /// Callout: a plain response with this status and body.
    pub fn local(status: u16, details: &str, flags: u64) -> Reply {
        Reply {
            flags,
            ..Reply::of(ReplyKind::Local(details.to_string()), status)
        }
    }

    /// `envoy.filters.http.local_ratelimit` placed after our filter,
    /// out of tokens: 429 "local_rate_limited", details
    /// `local_rate_limited`, flag RL.
    pub fn rate_limited() -> Reply {
        Reply::local(
            429,
            crate::origin::code_details::LOCAL_RATE_LIMITED,
            crate::origin::response_flags::RL,
        )
        .body("local_rate_limited")
    }

    /// A `direct_response` route: `status` and `body` from Envoy's route
    /// configuration, details `direct_response`, no flags.
    pub fn direct_response(status: u16, body: impl AsRef<[u8]>) -> Reply {
        Reply::local(status, crate::origin::code_details::DIRECT_RESPONSE, 0).body(body)
    }

    /// Adds response flags to the ones this kind of answer sets, e.g.
    /// `Reply::new(503).with_flags(response_flags::URX)` (the router's
    /// retries exhausted on 5xx: the last upstream answer, `via_upstream`,
    /// flag URX) or `Reply::connect_failure().with_flags(response_flags::URX)`
    /// (connect-failure retries exhausted: flags UF and URX).
    pub fn with_flags(mut self, flags: u64) -> Reply {
        self.flags |= flags;
        self
    }

    /// A cluster of `proxy_http_call` in process answers after `delay` on
    /// the virtual clock (e.g. to let the calling stream end first).
    pub fn after(mut self, delay: std::time::Duration) -> Reply {
        self.delay = delay;
        self
    }

    pub fn body_bytes(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    /// `:status` first, then the headers, with a content-length as an
    /// upstream HTTP/1.1 server would send (for an answer cut mid-body, a
    /// length larger than what arrives); last, when the router times the
    /// answer, its `x-envoy-upstream-service-time` in milliseconds (Envoy's
    /// router appends it to the upstream's headers before the filters see
    /// them, unless `suppress_envoy_headers`).
    pub(crate) fn envoy_headers(&self, service_time: Option<std::time::Duration>) -> Headers {
        let mut h: Headers = vec![(":status".into(), self.status.to_string())];
        h.extend(self.headers.iter().cloned());
        let mut len: usize = self.chunks.iter().map(Vec::len).sum();
        if matches!(
            self.kind,
            ReplyKind::ResetAfterHeaders | ReplyKind::NoAnswerAfterHeaders
        ) {
            len += 100;
        }
        if header_get(&self.headers, "content-length").is_none()
            && header_get(&self.headers, "transfer-encoding").is_none()
        {
            h.push(("content-length".into(), len.to_string()));
        }
        if let Some(t) = service_time {
            h.push((
                "x-envoy-upstream-service-time".into(),
                t.as_millis().to_string(),
            ));
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
    /// headers and the whole body through). Also true when the handler
    /// answered with what Envoy answers when the service never gets the
    /// request ([`Reply::connect_failure`], [`Reply::no_healthy_upstream`],
    /// [`Reply::overflow`], [`Reply::local`]).
    pub upstream_called: bool,
    /// The request headers reached the upstream (router) even if the body
    /// never did (e.g. Continue at headers, then a local reply at body end).
    pub upstream_headers_sent: bool,
    /// The answer is a local reply (from the filter, or Envoy's own: 503 on
    /// a failed VM, 504 route timeout, 503 upstream reset or connection
    /// failure..., or a later filter's, [`Reply::local`]).
    pub local_reply: bool,
    /// The stream was reset (by the client, by the filter's close_stream, or
    /// by an upstream reset after the response had started).
    pub reset: bool,
    /// What the upstream saw, when it was called.
    pub upstream_request: Option<UpstreamRequest>,
    /// `response.code_details` at the end of the stream (as `on_log` saw it).
    pub code_details: Option<String>,
    /// `response.flags` at the end of the stream (see [`crate::response_flags`]).
    pub response_flags: u64,
    /// `upstream.address` at the end of the stream.
    pub upstream_address: Option<String>,
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
