//! gRPC for `proxy_grpc_call` and `proxy_grpc_stream`: what a gRPC cluster
//! receives ([`GrpcRequest`]) and answers ([`GrpcReply`]), the message
//! framing, and [`GrpcServer`], a real HTTP/2 gRPC server on loopback that
//! answers with a handler (for tests that point real Envoy and host-test at
//! the same server).

use crate::h2::{self, frame_message, take_messages, Event, Writer};
use crate::http::{header_get, Headers};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// gRPC status codes.
pub mod grpc_status {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const UNKNOWN: u32 = 2;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const ALREADY_EXISTS: u32 = 6;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const ABORTED: u32 = 10;
    pub const OUT_OF_RANGE: u32 = 11;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const DATA_LOSS: u32 = 15;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// A gRPC call as the cluster receives it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GrpcRequest {
    /// `pkg.Service`, from `:path` `/pkg.Service/Method`.
    pub service: String,
    pub method: String,
    /// Every request header as it arrived (pseudo headers, `content-type`,
    /// `te`, `grpc-timeout`, the filter's initial metadata, what Envoy adds).
    pub metadata: Headers,
    /// The messages the caller sent, unframed.
    pub messages: Vec<Vec<u8>>,
    /// The caller reset (cancelled) the call before it was answered.
    pub cancelled: bool,
}

impl GrpcRequest {
    /// The first (for a unary call: the only) message; empty if none.
    pub fn message(&self) -> &[u8] {
        self.messages.first().map_or(&[][..], Vec::as_slice)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        header_get(&self.metadata, name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GrpcReplyKind {
    Answer,
    /// Never answers: the call's timeout (if any) fires.
    NoAnswer,
    /// Resets the stream (RST_STREAM) without answering.
    Reset,
}

/// How a gRPC cluster answers a call.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcReply {
    pub(crate) kind: GrpcReplyKind,
    pub initial_metadata: Headers,
    pub messages: Vec<Vec<u8>>,
    /// The gRPC status (0 = OK) and message of the trailers.
    pub status: u32,
    pub status_message: String,
    pub trailing_metadata: Headers,
    /// How long the server takes (virtual time in process, real time on a
    /// [`GrpcServer`]).
    pub delay: Duration,
}

impl GrpcReply {
    fn of(kind: GrpcReplyKind) -> GrpcReply {
        GrpcReply {
            kind,
            initial_metadata: Vec::new(),
            messages: Vec::new(),
            status: 0,
            status_message: String::new(),
            trailing_metadata: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// One response message, status OK.
    pub fn ok(message: impl AsRef<[u8]>) -> GrpcReply {
        GrpcReply::messages([message])
    }

    /// Several response messages (a server stream), status OK.
    pub fn messages<I, B>(messages: I) -> GrpcReply
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        GrpcReply {
            messages: messages.into_iter().map(|m| m.as_ref().to_vec()).collect(),
            ..GrpcReply::of(GrpcReplyKind::Answer)
        }
    }

    /// No message, a non-OK status with its message (a "trailers-only"
    /// answer, as gRPC servers send errors).
    pub fn status(code: u32, message: &str) -> GrpcReply {
        GrpcReply {
            status: code,
            status_message: message.to_string(),
            ..GrpcReply::of(GrpcReplyKind::Answer)
        }
    }

    /// The server never answers; the call's timeout decides.
    pub fn no_answer() -> GrpcReply {
        GrpcReply::of(GrpcReplyKind::NoAnswer)
    }

    /// The server resets the stream without answering.
    pub fn reset() -> GrpcReply {
        GrpcReply::of(GrpcReplyKind::Reset)
    }

    pub fn initial_metadata(mut self, name: &str, value: &str) -> GrpcReply {
        self.initial_metadata
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn trailing_metadata(mut self, name: &str, value: &str) -> GrpcReply {
        self.trailing_metadata
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// Answers after `delay`.
    pub fn after(mut self, delay: Duration) -> GrpcReply {
        self.delay = delay;
        self
    }
}

/// A gRPC cluster's handler in process.
pub type GrpcHandler = Box<dyn FnMut(&GrpcRequest) -> GrpcReply>;

/// `grpc-message` is percent-encoded on the wire (gRPC spec).
pub(crate) fn percent_encode(message: &str) -> String {
    let mut out = String::new();
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits `/pkg.Service/Method`.
pub(crate) fn split_path(path: &str) -> (String, String) {
    let p = path.trim_start_matches('/');
    match p.rsplit_once('/') {
        Some((s, m)) => (s.to_string(), m.to_string()),
        None => (p.to_string(), String::new()),
    }
}

type SharedHandler = Arc<dyn Fn(&GrpcRequest) -> GrpcReply + Send + Sync>;

/// A real gRPC server (HTTP/2 cleartext) on 127.0.0.1, answering every call
/// with a handler. A call is answered once the caller half-closes it; the
/// calls it saw are kept ([`GrpcServer::calls`]), with whether the caller
/// cancelled them. Stops when dropped.
pub struct GrpcServer {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<GrpcRequest>>>,
    stop: Arc<AtomicBool>,
}

impl GrpcServer {
    pub fn start(
        handler: impl Fn(&GrpcRequest) -> GrpcReply + Send + Sync + 'static,
    ) -> io::Result<GrpcServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let calls = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: SharedHandler = Arc::new(handler);
        let (c, s) = (calls.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (h, c) = (handler.clone(), c.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, h, c);
                });
            }
        });
        Ok(GrpcServer { addr, calls, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every call received so far, in arrival order.
    pub fn calls(&self) -> Vec<GrpcRequest> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    conn: TcpStream,
    handler: SharedHandler,
    calls: Arc<Mutex<Vec<GrpcRequest>>>,
) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = conn.try_clone()?;
    let mut preface = [0u8; 24];
    reader.read_exact(&mut preface)?;
    if preface != h2::PREFACE {
        return Ok(());
    }
    let mut w = conn.try_clone()?;
    h2::write_frame(&mut w, h2::SETTINGS, 0, 0, &[])?;
    w.flush()?;
    let writer = Arc::new(Mutex::new(Writer::new(w)));
    let (tx, rx) = channel();
    let rw = writer.clone();
    std::thread::spawn(move || h2::read_loop(reader, rw, tx));
    // Per stream: index into `calls`, and the unframed bytes so far.
    let mut streams: HashMap<u32, (usize, Vec<u8>)> = HashMap::new();
    for (id, event) in rx {
        let mut all = calls.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Headers(headers, eos) => {
                let (service, method) = split_path(header_get(&headers, ":path").unwrap_or(""));
                all.push(GrpcRequest {
                    service,
                    method,
                    metadata: headers,
                    messages: Vec::new(),
                    cancelled: false,
                });
                streams.insert(id, (all.len() - 1, Vec::new()));
                if eos {
                    let req = all[all.len() - 1].clone();
                    answer(&writer, id, &handler, req);
                }
            }
            Event::Data(bytes, eos) => {
                let Some((at, buf)) = streams.get_mut(&id) else {
                    continue;
                };
                buf.extend_from_slice(&bytes);
                let messages = take_messages(buf);
                all[*at].messages.extend(messages);
                if eos {
                    let req = all[*at].clone();
                    answer(&writer, id, &handler, req);
                }
            }
            Event::Reset => {
                if let Some((at, _)) = streams.get(&id) {
                    all[*at].cancelled = true;
                }
            }
            Event::Gone => break,
        }
    }
    Ok(())
}

/// Runs the handler on its own thread (calls on one connection must not
/// wait for each other) and writes its answer.
fn answer(writer: &Arc<Mutex<Writer>>, id: u32, handler: &SharedHandler, req: GrpcRequest) {
    let (writer, handler) = (writer.clone(), handler.clone());
    std::thread::spawn(move || {
        let reply = handler(&req);
        if !reply.delay.is_zero() {
            std::thread::sleep(reply.delay);
        }
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = write_reply(&mut w, id, &reply);
    });
}

/// The response headers of an answer (for a trailers-only answer, the
/// whole block: status and trailing metadata included).
pub(crate) fn reply_head(reply: &GrpcReply) -> Headers {
    let mut head: Headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "application/grpc".into()),
    ];
    head.extend(reply.initial_metadata.iter().cloned());
    if reply_trailers(reply).is_none() {
        head.extend(trailers_of(reply));
    }
    head
}

fn trailers_of(reply: &GrpcReply) -> Headers {
    let mut trailers: Headers = vec![("grpc-status".into(), reply.status.to_string())];
    if !reply.status_message.is_empty() {
        trailers.push(("grpc-message".into(), percent_encode(&reply.status_message)));
    }
    trailers.extend(reply.trailing_metadata.iter().cloned());
    trailers
}

/// The trailers of an answer, or `None` for a trailers-only answer (no
/// message and no initial metadata, as gRPC servers send errors).
pub(crate) fn reply_trailers(reply: &GrpcReply) -> Option<Headers> {
    if reply.messages.is_empty() && reply.initial_metadata.is_empty() {
        None
    } else {
        Some(trailers_of(reply))
    }
}

fn write_reply(w: &mut Writer, id: u32, reply: &GrpcReply) -> io::Result<()> {
    match reply.kind {
        GrpcReplyKind::NoAnswer => return Ok(()),
        GrpcReplyKind::Reset => return w.reset(id, h2::CANCEL),
        GrpcReplyKind::Answer => {}
    }
    let head = reply_head(reply);
    let Some(trailers) = reply_trailers(reply) else {
        return w.headers(id, &head, true);
    };
    w.headers(id, &head, false)?;
    for m in &reply.messages {
        w.data(id, &frame_message(m), false)?;
    }
    w.headers(id, &trailers, true)
}
