//! Where a response came from, as Envoy's stream info records it and a
//! filter reads it: `response.code_details`, `response.flags`,
//! `response.code` and `upstream.address` (values observed in Envoy 1.40,
//! see `host-test/PROBES.md`, "Response origin").

/// Envoy's legacy response-flag bitmask, as `response.flags` returns it
/// (an `i64`, 8 little-endian bytes): bit `i` is Envoy's `CoreResponseFlag`
/// number `i`. The names are the access log's `%RESPONSE_FLAGS%`.
pub mod response_flags {
    /// Local server health check failed.
    pub const LH: u64 = 1 << 0;
    /// No healthy upstream host.
    pub const UH: u64 = 1 << 1;
    /// Upstream request timeout (the route timeout).
    pub const UT: u64 = 1 << 2;
    /// Local codec-level reset.
    pub const LR: u64 = 1 << 3;
    /// Upstream remote reset.
    pub const UR: u64 = 1 << 4;
    /// Upstream connection failure.
    pub const UF: u64 = 1 << 5;
    /// Upstream connection termination.
    pub const UC: u64 = 1 << 6;
    /// Upstream overflow (circuit breaker).
    pub const UO: u64 = 1 << 7;
    /// No route.
    pub const NR: u64 = 1 << 8;
    /// Delay injected.
    pub const DI: u64 = 1 << 9;
    /// Fault injected.
    pub const FI: u64 = 1 << 10;
    /// Rate limited (local or global rate limit filter).
    pub const RL: u64 = 1 << 11;
    /// Unauthorized by the external authorization service.
    pub const UAEX: u64 = 1 << 12;
    /// Rate limit service error.
    pub const RLSE: u64 = 1 << 13;
    /// Downstream connection termination (the client went away).
    pub const DC: u64 = 1 << 14;
    /// Upstream retry limit exceeded.
    pub const URX: u64 = 1 << 15;
    /// Stream idle timeout.
    pub const SI: u64 = 1 << 16;
    /// Invalid `x-envoy-*` request headers.
    pub const IH: u64 = 1 << 17;
    /// Downstream protocol error.
    pub const DPE: u64 = 1 << 18;
    /// Upstream max stream duration reached.
    pub const UMSDR: u64 = 1 << 19;
    /// Response from the cache filter.
    pub const RFCF: u64 = 1 << 20;
    /// No filter config found.
    pub const NFCF: u64 = 1 << 21;
    /// Duration timeout.
    pub const DT: u64 = 1 << 22;
    /// Upstream protocol error (e.g. an HTTP/1.1 upstream closing mid-body).
    pub const UPE: u64 = 1 << 23;
    /// No cluster found.
    pub const NC: u64 = 1 << 24;
    /// Overload manager.
    pub const OM: u64 = 1 << 25;
    /// DNS resolution failed.
    pub const DF: u64 = 1 << 26;
    /// Drop overload.
    pub const DO: u64 = 1 << 27;
    /// Downstream remote reset.
    pub const DR: u64 = 1 << 28;
    /// Unconditional drop overload.
    pub const UDO: u64 = 1 << 29;

    pub(crate) const NAMES: [&str; 30] = [
        "LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE",
        "DC", "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF",
        "DO", "DR", "UDO",
    ];

    /// The flags' names in bit order, comma-separated ("" for none), e.g.
    /// `"UF,URX"` (Envoy's access log orders them differently).
    pub fn names(flags: u64) -> String {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| flags & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `response.code_details` values Envoy 1.40 sets for the cases host-test
/// models (observed; see `host-test/PROBES.md`).
pub mod code_details {
    /// Any answer from the upstream, whatever its status.
    pub const VIA_UPSTREAM: &str = "via_upstream";
    /// Connection refused by the upstream host (UF).
    pub const CONNECT_FAILURE: &str = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}";
    /// The upstream closed or reset the connection after reading the
    /// request, before any response (UC).
    pub const CONNECTION_TERMINATION: &str =
        "upstream_reset_before_response_started{connection_termination}";
    /// Circuit breaker open (UO).
    pub const OVERFLOW: &str = "upstream_reset_before_response_started{overflow}";
    /// The route timeout fired (UT), before or after the response headers.
    pub const RESPONSE_TIMEOUT: &str = "response_timeout";
    /// An HTTP/1.1 upstream closed (FIN or RST) in the middle of the body (UPE).
    pub const RESET_AFTER_RESPONSE_STARTED: &str =
        "upstream_reset_after_response_started{protocol_error}";
    /// No healthy host in the cluster (UH).
    pub const NO_HEALTHY_UPSTREAM: &str = "no_healthy_upstream";
    /// The client went away before the response was complete (DC).
    pub const DOWNSTREAM_REMOTE_DISCONNECT: &str = "downstream_remote_disconnect";
    /// The local rate limit filter answered 429 (RL).
    pub const LOCAL_RATE_LIMITED: &str = "local_rate_limited";
    /// A `direct_response` route.
    pub const DIRECT_RESPONSE: &str = "direct_response";
    /// No route matched (NR, 404).
    pub const ROUTE_NOT_FOUND: &str = "route_not_found";
    /// The route names an unknown cluster (NC, 503).
    pub const CLUSTER_NOT_FOUND: &str = "cluster_not_found";
    /// The request body overflowed the buffer limit while a filter buffered it (413).
    pub const REQUEST_PAYLOAD_TOO_LARGE: &str = "request_payload_too_large";
    /// The stream met a failed Wasm VM (503, FAIL_CLOSED).
    pub const WASM_FAIL_STREAM: &str = "wasm_fail_stream";
}

/// Envoy's stream info for one stream, as far as the filter can read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamOrigin {
    /// `response.code_details`: unset (NotFound) until a response or a
    /// reset decides it.
    pub details: Option<String>,
    /// `response.flags`: always readable in a stream, 0 until set.
    pub flags: u64,
    /// `response.code`: unset until response headers exist.
    pub code: Option<u16>,
    /// `upstream.address`: set when the router picked a host.
    pub upstream_address: Option<String>,
}

/// Details passed by a filter's `proxy_send_local_response`: Envoy replaces
/// whitespace with '_' (seen in Envoy 1.40: "two words" -> "two_words").
pub(crate) fn filter_details(details: &[u8]) -> String {
    String::from_utf8_lossy(details)
        .chars()
        .map(|c| if c.is_ascii_whitespace() { '_' } else { c })
        .collect()
}
