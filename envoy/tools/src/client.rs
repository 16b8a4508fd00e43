//! A small HTTP/1.1 client for dedupctl, the tests and the demo: one connection per request
//! (or a kept-alive `Connection`), per-request timeouts, chunked bodies sent
//! by hand, loopback only.

use crate::http::{read_body, read_head, write_chunk, Head};
use crate::{fail, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone)]
pub enum Body {
    Empty,
    /// Sent with `content-length`.
    Fixed(Vec<u8>),
    /// Sent with `transfer-encoding: chunked`, one chunk per part, with a pause
    /// before each part after the first.
    Chunked(Vec<Vec<u8>>, Duration),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    pub timeout: Duration,
    /// The `host` header (`:authority` in Envoy); `None`: the address connected to.
    pub host: Option<String>,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Self {
        Request {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Body::Empty,
            timeout: Duration::from_secs(10),
            host: None,
        }
    }

    pub fn get(path: &str) -> Self {
        Self::new("GET", path)
    }

    pub fn post(path: &str) -> Self {
        Self::new("POST", path)
    }

    /// Add a header line. Calling it twice with one name sends two lines.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Send `host: <host>` instead of the address connected to.
    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.into());
        self
    }

    pub fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Body::Fixed(body.into());
        self
    }

    pub fn json(self, v: &serde_json::Value) -> Self {
        self.header("content-type", "application/json")
            .body(v.to_string())
    }

    pub fn chunked(mut self, parts: Vec<Vec<u8>>, pause: Duration) -> Self {
        self.body = Body::Chunked(parts, pause);
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The equivalent curl command line (for the demo's transcript).
    pub fn curl(&self, base: &str) -> String {
        let mut s = format!("curl -si -X {} {base}{}", self.method, self.path);
        if let Some(h) = &self.host {
            s.push_str(&format!(" -H 'host: {h}'"));
        }
        for (n, v) in &self.headers {
            s.push_str(&format!(" -H '{n}: {v}'"));
        }
        match &self.body {
            Body::Empty => {}
            Body::Fixed(b) => s.push_str(&format!(" -d '{}'", String::from_utf8_lossy(b))),
            Body::Chunked(parts, _) => {
                let all: Vec<u8> = parts.concat();
                s.push_str(&format!(
                    " -H 'transfer-encoding: chunked' -d '{}'",
                    String::from_utf8_lossy(&all)
                ));
            }
        }
        s
    }
}

/// The `type` of an RFC 9457 problem body (`urn:proxy-dedup:problem:<slug>`),
/// or "" when the body is not JSON with a string `type`. Takes the body bytes so
/// that every test layer's response (host-test's, this client's) reads it one way.
pub fn problem_type(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub head: Head,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Result<serde_json::Value> {
        match serde_json::from_slice(&self.body) {
            Ok(v) => Ok(v),
            Err(e) => fail!("response body is not JSON ({e}): {}", self.text()),
        }
    }

    /// One line for logs and assertion messages.
    pub fn summary(&self) -> String {
        let mut hs: Vec<String> = self
            .head
            .headers
            .iter()
            .filter(|(n, _)| {
                matches!(
                    n.as_str(),
                    "content-type" | "retry-after" | "idempotent-replayed" | "x-order-id"
                )
            })
            .map(|(n, v)| format!("{n}: {v}"))
            .collect();
        hs.sort();
        format!("{} [{}] {}", self.status, hs.join("; "), self.text())
    }
}

/// A kept-alive connection to `addr`.
pub struct Connection {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Connection {
    pub fn open(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        if !addr.ip().is_loopback() {
            fail!("refusing to connect to non-loopback address {addr}");
        }
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Connection {
            stream,
            reader,
            addr,
        })
    }

    /// Send `req` and read its response.
    pub fn send(&mut self, req: &Request) -> Result<Response> {
        self.write_request(req)?;
        self.read_response(req)
    }

    /// Write `req` (head and body) without reading the answer.
    pub fn write_request(&mut self, req: &Request) -> Result<()> {
        self.stream.set_write_timeout(Some(req.timeout))?;
        self.stream.set_read_timeout(Some(req.timeout))?;
        let host = match &req.host {
            Some(h) => h.clone(),
            None => self.addr.to_string(),
        };
        let mut head = format!("{} {} HTTP/1.1\r\nhost: {host}\r\n", req.method, req.path);
        for (n, v) in &req.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        match &req.body {
            Body::Empty => {
                if matches!(req.method.as_str(), "POST" | "PUT" | "PATCH") {
                    head.push_str("content-length: 0\r\n");
                }
                head.push_str("\r\n");
                self.stream.write_all(head.as_bytes())?;
            }
            Body::Fixed(b) => {
                head.push_str(&format!("content-length: {}\r\n\r\n", b.len()));
                let mut msg = head.into_bytes();
                msg.extend_from_slice(b);
                self.stream.write_all(&msg)?;
            }
            Body::Chunked(parts, pause) => {
                head.push_str("transfer-encoding: chunked\r\n\r\n");
                self.stream.write_all(head.as_bytes())?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 && !pause.is_zero() {
                        std::thread::sleep(*pause);
                    }
                    if !p.is_empty() {
                        write_chunk(&mut self.stream, p)?;
                    }
                }
                write_chunk(&mut self.stream, b"")?;
            }
        }
        self.stream.flush()?;
        Ok(())
    }

    /// Read the response to `req` (written with `write_request`).
    pub fn read_response(&mut self, req: &Request) -> Result<Response> {
        self.stream.set_read_timeout(Some(req.timeout))?;
        let Some(head) = read_head(&mut self.reader)? else {
            fail!(
                "connection closed before a response to {} {}",
                req.method,
                req.path
            );
        };
        let status = parse_status(&head.start)?;
        let no_body = req.method == "HEAD" || status == 204 || status == 304 || status < 200;
        let body = if no_body {
            Vec::new()
        } else {
            read_body(&mut self.reader, &head, true)?
        };
        Ok(Response { status, head, body })
    }

    /// Wait up to `patience` for the first byte of an answer. `Ok(true)`:
    /// something arrived (read it with `read_response`); `Ok(false)`: nothing
    /// yet; an error if the connection was closed.
    pub fn wait_answer(&mut self, patience: Duration) -> Result<bool> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        self.stream
            .set_read_timeout(Some(patience.max(Duration::from_millis(1))))?;
        match self.reader.fill_buf() {
            Ok([]) => fail!("connection closed by the server before any answer"),
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Close with a TCP reset (SO_LINGER 0) instead of an orderly FIN: the
    /// client "crashes" or its connection is cut.
    pub fn reset(self) -> Result<()> {
        let Connection { stream, reader, .. } = self;
        drop(reader);
        crate::http::close_with_reset(stream)
    }
}

/// How a client that gives up fared.
#[derive(Debug)]
pub enum GiveUp {
    /// The answer came in time.
    Answered(Response),
    /// No answer within the patience: the connection was closed.
    GaveUp,
}

/// How a client that gives up leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// Orderly close (FIN), as a client whose timeout fired.
    Close,
    /// TCP reset, as a crashed client or a cut connection.
    Reset,
}

/// Send `req` on a fresh connection, wait at most `patience` for the answer,
/// then give up and close the connection (`leave`). Nothing is read after
/// giving up.
pub fn send_or_give_up(
    addr: SocketAddr,
    req: &Request,
    patience: Duration,
    leave: Leave,
) -> Result<GiveUp> {
    let mut conn = Connection::open(addr, req.timeout)?;
    conn.write_request(req)?;
    if conn.wait_answer(patience)? {
        return Ok(GiveUp::Answered(conn.read_response(req)?));
    }
    match leave {
        Leave::Close => drop(conn),
        Leave::Reset => conn.reset()?,
    }
    Ok(GiveUp::GaveUp)
}

fn parse_status(start: &str) -> Result<u16> {
    match start.split_whitespace().nth(1).map(str::parse::<u16>) {
        Some(Ok(s)) => Ok(s),
        _ => fail!("bad status line {start:?}"),
    }
}

/// One request on a fresh connection.
pub fn send(addr: SocketAddr, req: &Request) -> Result<Response> {
    Connection::open(addr, req.timeout)?.send(req)
}
