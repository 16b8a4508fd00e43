//! The demo upstream: a small "orders" service that counts how often each
//! request was really executed, so a test can prove a duplicate never got here.
//!
//! Every executed request gets a fresh `order_id`, so a replayed response is
//! recognisable (same id as the first). On demand it is slow or failing:
//! header `x-demo-delay-ms: 2000` / query `delay_ms=2000`, header
//! `x-demo-status: 503` / query `status=503`, with `x-demo-retry-after: 1` /
//! query `retry_after=1` a `retry-after` header. Header `x-demo-fault: reset`
//! executes the request and then resets the connection without answering;
//! `x-demo-fault: cut` sends the status line, headers and half the body, then
//! resets. `GET /__executions` returns the counts as JSON, `POST /__reset`
//! clears them; neither is counted. `POST /v1/charges` answers like Stripe's
//! charges endpoint as well: a `charge` object (`id`, `amount`, `currency` from
//! the form body) that Stripe's SDKs read.
//!
//! Started with `start_recording`, it also keeps every execution (request
//! headers and body, the status and body it sent, when) for the chaos soak's
//! checker.
//!
//! std threads, one per connection, HTTP/1.1 keep-alive, content-length and
//! chunked request bodies (Envoy forwards chunked when the client sent chunked).

use crate::http::{read_body, read_head, Head};
use crate::Result;
use serde_json::{json, Value};
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest delay honoured, so a typo cannot hang a test.
const MAX_DELAY_MS: u64 = 30_000;
/// Largest `x-demo-pad-bytes`.
const MAX_PAD_BYTES: usize = 1 << 20;

#[derive(Default)]
struct Counts {
    next_order_id: u64,
    total: u64,
    /// Executions per `idempotency-key` header value (requests with one).
    by_key: BTreeMap<String, u64>,
    /// Executions per path (query excluded).
    by_path: BTreeMap<String, u64>,
    /// Executions per `METHOD path #body-hash`.
    by_request: BTreeMap<String, u64>,
}

/// What the upstream did besides answering (header `x-demo-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFault {
    /// Executed, then the connection was reset without an answer.
    Reset,
    /// Executed, status line, headers and half the body sent, then reset.
    Cut,
}

/// One execution, as the upstream saw and answered it (`start_recording`).
#[derive(Debug, Clone)]
pub struct Execution {
    /// The `order_id` of its answer: unique per execution.
    pub order_id: u64,
    /// When the whole request had been read (the execution began).
    pub arrived: Instant,
    /// When the status line and headers were written; `None`: never
    /// (reset without an answer).
    pub head_sent: Option<Instant>,
    /// The whole answer was written without error.
    pub delivered: bool,
    pub method: String,
    /// Path with query.
    pub target: String,
    /// Every request header line, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status it answered (or would have, for `Reset`).
    pub status: u16,
    /// The body it sent in full (`Cut` sent only half of it).
    pub response_body: Vec<u8>,
    pub fault: Option<UpstreamFault>,
}

impl Execution {
    /// Every value of request header `name` (lower-case), in order.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

struct Shared {
    counts: Mutex<Counts>,
    stop: AtomicBool,
    log: bool,
    /// `Some`: every execution is kept.
    record: Option<Mutex<Vec<Execution>>>,
    /// Executions begun and not yet answered (or reset).
    running: AtomicU64,
}

impl Shared {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, e: Execution) {
        if let Some(r) = &self.record {
            r.lock().unwrap_or_else(|e| e.into_inner()).push(e);
        }
    }

    /// The answer of execution `order_id` could not be written whole.
    fn undelivered(&self, order_id: u64) {
        if let Some(r) = &self.record {
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = r.iter_mut().rev().find(|e| e.order_id == order_id) {
                e.delivered = false;
            }
        }
    }
}

/// A running demo upstream; stops accepting when dropped.
pub struct DemoUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl DemoUpstream {
    /// Listen on 127.0.0.1:`port` (0: any free port). `log`: one line per request on stderr.
    pub fn start(port: u16, log: bool) -> Result<Self> {
        Self::start_inner(port, log, false)
    }

    /// Like `start` (any free port, no log), keeping every execution: see
    /// `executions`.
    pub fn start_recording() -> Result<Self> {
        Self::start_inner(0, false, true)
    }

    fn start_inner(port: u16, log: bool, record: bool) -> Result<Self> {
        let (addr, shared) = crate::accept::spawn(
            "demo-upstream",
            port,
            Shared {
                counts: Mutex::new(Counts {
                    next_order_id: 1000,
                    ..Counts::default()
                }),
                stop: AtomicBool::new(false),
                log,
                record: record.then(|| Mutex::new(Vec::new())),
                running: AtomicU64::new(0),
            },
            |s| &s.stop,
            // Errors end only this connection.
            |stream, s| serve_connection(stream, s).unwrap_or(()),
        )?;
        Ok(DemoUpstream { addr, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Executions of requests to `path` since start or the last reset.
    pub fn executions_for_path(&self, path: &str) -> u64 {
        self.shared.counts().by_path.get(path).copied().unwrap_or(0)
    }

    /// Executions of requests carrying `idempotency-key: key`.
    pub fn executions_for_key(&self, key: &str) -> u64 {
        self.shared.counts().by_key.get(key).copied().unwrap_or(0)
    }

    pub fn total_executions(&self) -> u64 {
        self.shared.counts().total
    }

    /// Every execution so far, in the order they were answered
    /// (`start_recording`; empty otherwise).
    pub fn executions(&self) -> Vec<Execution> {
        match &self.shared.record {
            Some(r) => r.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            None => Vec::new(),
        }
    }

    /// Executions begun but not yet answered (a slow one sleeping).
    pub fn running(&self) -> u64 {
        self.shared.running.load(Ordering::SeqCst)
    }

    /// The same JSON as `GET /__executions`.
    pub fn executions_json(&self) -> Value {
        executions_json(&self.shared.counts())
    }

    pub fn reset(&self) {
        let mut c = self.shared.counts();
        let next = c.next_order_id;
        *c = Counts {
            next_order_id: next,
            ..Counts::default()
        };
    }
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        crate::accept::stop(&self.shared.stop, self.addr);
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(head) = read_head(&mut reader)? else {
            return Ok(());
        };
        let body = read_body(&mut reader, &head, false)?;
        let arrived = Instant::now();
        shared.running.fetch_add(1, Ordering::SeqCst);
        let (status, payload, delay) = handle(&head, &body, shared);
        let retry_after = head
            .header("x-demo-retry-after")
            .map(str::to_string)
            .or_else(|| query_param(&head.start, "retry_after"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let fault = match head.header("x-demo-fault") {
            Some("reset") => Some(UpstreamFault::Reset),
            Some("cut") => Some(UpstreamFault::Cut),
            _ => None,
        };
        let close = head.wants_close() || fault.is_some();
        let text = payload.to_string();
        let mut resp = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            reason(status),
            text.len()
        );
        if let Some(id) = payload.get("order_id") {
            resp.push_str(&format!("x-order-id: {id}\r\n"));
        }
        if let Some(secs) = retry_after {
            resp.push_str(&format!("retry-after: {secs}\r\n"));
        }
        if close {
            resp.push_str("connection: close\r\n");
        }
        resp.push_str("\r\n");
        let head_len = resp.len();
        resp.push_str(&text);
        let order_id = payload.get("order_id").and_then(Value::as_u64);
        let mut execution = order_id.map(|order_id| Execution {
            order_id,
            arrived,
            head_sent: None,
            delivered: false,
            method: head.start.split_whitespace().next().unwrap_or("").into(),
            target: head.start.split_whitespace().nth(1).unwrap_or("").into(),
            headers: head.headers.clone(),
            body,
            status,
            response_body: text.clone().into_bytes(),
            fault,
        });
        // Taken before writing: the proxy cannot have the head any earlier. Kept before
        // writing too, so whoever has the answer finds its execution recorded; a write
        // that fails (the proxy gone) marks it undelivered after.
        let head_at = Instant::now();
        if let Some(e) = execution.as_mut() {
            if fault != Some(UpstreamFault::Reset) {
                e.head_sent = Some(head_at);
            }
            e.delivered = fault.is_none();
        }
        if let Some(e) = execution {
            shared.keep(e);
        }
        let sent = match fault {
            None => out.write_all(resp.as_bytes()).and_then(|_| out.flush()),
            Some(UpstreamFault::Reset) => Ok(()),
            Some(UpstreamFault::Cut) => out
                .write_all(&resp.as_bytes()[..head_len + text.len() / 2])
                .and_then(|_| out.flush()),
        };
        if let (Some(id), Err(_)) = (order_id, &sent) {
            shared.undelivered(id);
        }
        shared.running.fetch_sub(1, Ordering::SeqCst);
        if fault.is_some() {
            drop(reader);
            return crate::http::close_with_reset(out);
        }
        sent?;
        if close {
            return Ok(());
        }
    }
}

/// Decide the answer; counts the execution. Returns status, JSON body, delay.
fn handle(head: &Head, body: &[u8], shared: &Shared) -> (u16, Value, Duration) {
    let mut parts = head.start.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let path = match target.split_once('?') {
        Some((p, _)) => p.to_string(),
        None => target.clone(),
    };
    let param = |name: &str| query_param(&head.start, name);
    match (method.as_str(), path.as_str()) {
        ("GET", "/__executions") => {
            return (200, executions_json(&shared.counts()), Duration::ZERO);
        }
        ("POST", "/__reset") => {
            let mut c = shared.counts();
            let next = c.next_order_id;
            *c = Counts {
                next_order_id: next,
                ..Counts::default()
            };
            return (200, json!({"reset": true}), Duration::ZERO);
        }
        ("GET", "/healthz") => return (200, json!({"ok": true}), Duration::ZERO),
        _ => {}
    }

    let delay_ms = head
        .header("x-demo-delay-ms")
        .map(str::to_string)
        .or_else(|| param("delay_ms"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .min(MAX_DELAY_MS);
    let status = head
        .header("x-demo-status")
        .map(str::to_string)
        .or_else(|| param("status"))
        .and_then(|v| v.trim().parse::<u16>().ok())
        .filter(|s| (200..=599).contains(s))
        .unwrap_or(200);
    let key = head.header("idempotency-key").map(str::to_string);
    let mut h = DefaultHasher::new();
    body.hash(&mut h);
    let request_id = format!("{method} {path} #{:016x}", h.finish());

    let (order_id, executions) = {
        let mut c = shared.counts();
        c.next_order_id += 1;
        c.total += 1;
        let id = c.next_order_id;
        *c.by_path.entry(path.clone()).or_default() += 1;
        let per_request = {
            let e = c.by_request.entry(request_id).or_default();
            *e += 1;
            *e
        };
        let n = match &key {
            Some(k) => {
                let e = c.by_key.entry(k.clone()).or_default();
                *e += 1;
                *e
            }
            None => per_request,
        };
        (id, n)
    };
    if shared.log {
        eprintln!(
            "demo-upstream: {method} {target} key={} body={}B chunked={} -> order {order_id} (execution #{executions}) status {status} after {delay_ms} ms",
            key.as_deref().unwrap_or("-"),
            body.len(),
            head.is_chunked()
        );
    }
    let mut payload = json!({
        "order_id": order_id,
        "executions": executions,
        "method": method,
        "path": path,
        "key": key,
        "tenant": head.header("x-tenant"),
        "body_bytes": body.len(),
        "body_chunked": head.is_chunked(),
    });
    if status >= 400 {
        payload["error"] = json!(format!("failing on demand with {status}"));
    } else if method == "POST" && path == "/v1/charges" {
        charge(&mut payload, order_id, body);
    }
    // A large response on demand (memory budget tests).
    let pad = head
        .header("x-demo-pad-bytes")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_PAD_BYTES);
    if pad > 0 {
        payload["pad"] = json!("p".repeat(pad));
    }
    (status, payload, Duration::from_millis(delay_ms))
}

/// Makes `payload` a Stripe charge object (Stripe's SDKs build a `Charge` from
/// `"object": "charge"`): its id from the execution's order id, `amount` and
/// `currency` from the form-encoded body, as Stripe's API answers a created charge.
fn charge(payload: &mut Value, order_id: u64, body: &[u8]) {
    let form = String::from_utf8_lossy(body);
    let field = |name: &str| {
        form.split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    payload["id"] = json!(format!("ch_demo{order_id:012}"));
    payload["object"] = json!("charge");
    payload["amount"] = json!(field("amount").and_then(|a| a.parse::<u64>().ok()));
    payload["currency"] = json!(field("currency"));
    payload["status"] = json!("succeeded");
    payload["paid"] = json!(true);
    payload["livemode"] = json!(false);
}

/// The value of query parameter `name` in the request line `start`.
fn query_param(start: &str, name: &str) -> Option<String> {
    let target = start.split_whitespace().nth(1)?;
    let (_, query) = target.split_once('?')?;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn executions_json(c: &Counts) -> Value {
    json!({
        "total": c.total,
        "by_key": c.by_key,
        "by_path": c.by_path,
        "by_request": c.by_request,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
