//! Clusters for `proxy_http_call`: an in-process handler, or a real HTTP/1.1
//! server on loopback that the call is forwarded to over TCP. Failures come
//! back as Envoy's async client reports them.

use crate::http::{header_get, Headers, Reply, ReplyKind, UpstreamRequest};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A cluster's handler: called once per request, answers a [`Reply`].
pub type Handler = Box<dyn FnMut(&UpstreamRequest) -> Reply>;

pub(crate) enum Cluster {
    InProcess(Handler),
    Tcp(String),
}

/// What the filter's `on_http_call_response` gets.
pub(crate) enum CalloutResult {
    Response(Reply),
    /// Reset: the callback gets no headers.
    Reset,
    /// Never answered and no timeout: no callback.
    Never,
    /// Timed out after the given milliseconds.
    TimeoutAfter(u32),
    /// Reset (no headers) after the given milliseconds: a response that
    /// started and stalled until the call's timeout.
    ResetAfter(u32),
}

// Envoy's own answers to a callout (local replies of its async client),
// as Envoy 1.40 delivers them.
pub(crate) fn timeout_reply() -> Reply {
    Reply::local(504, "response_timeout", 0)
        .header("content-type", "text/plain")
        .body("upstream request timeout")
}

pub(crate) fn connect_failure_reply() -> Reply {
    Reply::local(503, "connect_failure", 0)
        .header("content-type", "text/plain")
        .body("upstream connect error or disconnect/reset before headers. reset reason: remote connection failure")
}

pub(crate) fn call(
    cluster: &mut Cluster,
    request: &UpstreamRequest,
    timeout_ms: u32,
) -> CalloutResult {
    match cluster {
        Cluster::InProcess(handler) => {
            let reply = handler(request);
            match reply.kind {
                ReplyKind::Response | ReplyKind::Local(_) => CalloutResult::Response(reply),
                ReplyKind::Reset | ReplyKind::ResetAfterHeaders => CalloutResult::Reset,
                ReplyKind::NoAnswer | ReplyKind::NoAnswerAfterHeaders if timeout_ms == 0 => {
                    CalloutResult::Never
                }
                ReplyKind::NoAnswer => CalloutResult::TimeoutAfter(timeout_ms),
                ReplyKind::NoAnswerAfterHeaders => CalloutResult::ResetAfter(timeout_ms),
                ReplyKind::ConnectFailure => CalloutResult::Response(connect_failure_reply()),
                ReplyKind::NoHealthyUpstream => CalloutResult::Response(
                    Reply::local(503, "no_healthy_upstream", 0)
                        .header("content-type", "text/plain")
                        .body("no healthy upstream"),
                ),
                ReplyKind::Overflow => CalloutResult::Response(
                    Reply::local(503, "overflow", 0).header("content-type", "text/plain").body(
                        "upstream connect error or disconnect/reset before headers. reset reason: overflow",
                    ),
                ),
            }
        }
        Cluster::Tcp(addr) => over_tcp(addr, request, timeout_ms),
    }
}

/// Forwards the call to a loopback HTTP/1.1 server, waiting at most the
/// call's timeout in real time (0: Envoy's "no timeout"; here 30 s).
fn over_tcp(addr: &str, request: &UpstreamRequest, timeout_ms: u32) -> CalloutResult {
    let budget = if timeout_ms == 0 {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(u64::from(timeout_ms))
    };
    let deadline = Instant::now() + budget;
    let Some(sock) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return CalloutResult::Response(connect_failure_reply());
    };
    match exchange(sock, request, deadline) {
        Ok(reply) => CalloutResult::Response(reply),
        Err(Failure::Connect) => CalloutResult::Response(connect_failure_reply()),
        Err(Failure::Timeout) => CalloutResult::Response(timeout_reply()),
        Err(Failure::Reset) => CalloutResult::Reset,
    }
}

enum Failure {
    Connect,
    Timeout,
    Reset,
}

fn remaining(deadline: Instant) -> Result<Duration, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(Failure::Timeout)
    } else {
        Ok(left)
    }
}

fn io_failure(e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Failure::Timeout,
        _ => Failure::Reset,
    }
}

fn exchange(
    addr: SocketAddr,
    request: &UpstreamRequest,
    deadline: Instant,
) -> Result<Reply, Failure> {
    let mut stream = TcpStream::connect_timeout(&addr, remaining(deadline)?).map_err(|e| {
        if matches!(e.kind(), std::io::ErrorKind::TimedOut) {
            Failure::Timeout
        } else {
            Failure::Connect
        }
    })?;
    // As Envoy's HTTP/1.1 codec writes it: `host` from `:authority`, then
    // the headers in order (content-length among them when there is a body).
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        request.method(),
        request.path(),
        request.header(":authority").unwrap_or("")
    );
    for (k, v) in &request.headers {
        if !k.starts_with(':') {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    // The codec's own length for a bodiless request of a method with a body.
    if request.body.is_empty()
        && request.header("content-length").is_none()
        && !matches!(request.method(), "GET" | "HEAD")
    {
        head.push_str("content-length: 0\r\n");
    }
    head.push_str("\r\n");
    stream
        .set_write_timeout(Some(remaining(deadline)?))
        .map_err(io_failure)?;
    stream.write_all(head.as_bytes()).map_err(io_failure)?;
    stream.write_all(&request.body).map_err(io_failure)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        stream
            .set_read_timeout(Some(remaining(deadline)?))
            .map_err(io_failure)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if let Some(reply) = parse(&raw, false) {
                    return Ok(reply);
                }
            }
            Err(e) => return Err(io_failure(e)),
        }
    }
    parse(&raw, true).ok_or(Failure::Reset)
}

/// Parses a complete HTTP/1.1 response; `eof` allows a body delimited by
/// the end of the connection.
fn parse(raw: &[u8], eof: bool) -> Option<Reply> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers: Headers = Vec::new();
    for line in lines {
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let rest = &raw[end + 4..];
    let body = if let Some(len) = header_get(&headers, "content-length") {
        let len: usize = len.parse().ok()?;
        if rest.len() < len {
            return None;
        }
        rest[..len].to_vec()
    } else if header_get(&headers, "transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        let body = dechunk(rest)?;
        headers.retain(|(k, _)| k != "transfer-encoding");
        body
    } else if eof {
        rest.to_vec()
    } else {
        return None;
    };
    headers.retain(|(k, _)| k != "connection");
    let mut reply = Reply::new(status);
    reply.headers = headers;
    if !body.is_empty() {
        reply.chunks = vec![body];
    }
    Some(reply)
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if raw.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}
