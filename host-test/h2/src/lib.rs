//! Just enough HTTP/2 (cleartext, prior knowledge) for gRPC on loopback, written once
//! for the test kit: frames, a client connection whose reader thread turns frames into
//! per-stream events (host-test's gRPC calls to a real etcd), the pieces of the server
//! side of host-test's `GrpcServer`, and gRPC's length-prefixed messages; dedup-envoy's
//! bench-etcd sends its blocking unary calls with the same frames. Flow control is
//! answered (every DATA frame is given back at once), priorities and server push are
//! ignored; header blocks use HPACK (the `hpack` crate). Why not the `h2` crate:
//! ARCHITECTURE.md, "Dependencies of the test kit".

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// A header list in order, names lower-case (`:path`, `content-type`, …).
pub type Headers = Vec<(String, String)>;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// RST_STREAM error code CANCEL.
pub const CANCEL: u32 = 0x8;

pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

pub fn write_frame(
    w: &mut impl Write,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> io::Result<()> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    w.write_all(&out)
}

/// The header block fragment of a HEADERS frame, without padding and priority.
pub fn header_fragment(frame: &Frame) -> &[u8] {
    let mut p = &frame.payload[..];
    let mut pad = 0;
    if frame.flags & PADDED != 0 && !p.is_empty() {
        pad = p[0] as usize;
        p = &p[1..];
    }
    if frame.flags & PRIORITY != 0 && p.len() >= 5 {
        p = &p[5..];
    }
    &p[..p.len().saturating_sub(pad)]
}

/// DATA payload without padding.
pub fn data_payload(frame: &Frame) -> &[u8] {
    let p = &frame.payload[..];
    if frame.flags & PADDED != 0 && !p.is_empty() {
        let pad = p[0] as usize;
        return &p[1..p.len().saturating_sub(pad).max(1)];
    }
    p
}

pub fn decode_headers(decoder: &mut hpack::Decoder<'static>, block: &[u8]) -> io::Result<Headers> {
    let pairs = decoder
        .decode(block)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("hpack: {e:?}")))?;
    Ok(pairs
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(&k).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect())
}

pub fn encode_headers(encoder: &mut hpack::Encoder<'static>, headers: &Headers) -> Vec<u8> {
    encoder.encode(headers.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
}

/// The writing half of a connection (shared by the reader, which answers
/// PINGs and gives back flow-control window).
pub struct Writer {
    pub stream: TcpStream,
    pub encoder: hpack::Encoder<'static>,
}

impl Writer {
    /// The writing half of `stream`, with a fresh HPACK encoder.
    pub fn new(stream: TcpStream) -> Writer {
        Writer {
            stream,
            encoder: hpack::Encoder::new(),
        }
    }

    pub fn headers(&mut self, stream: u32, headers: &Headers, eos: bool) -> io::Result<()> {
        let block = encode_headers(&mut self.encoder, headers);
        let flags = END_HEADERS | if eos { END_STREAM } else { 0 };
        write_frame(&mut self.stream, HEADERS, flags, stream, &block)
    }

    pub fn data(&mut self, stream: u32, data: &[u8], eos: bool) -> io::Result<()> {
        // Frames of at most the default maximum frame size (16 KiB).
        let mut chunks: Vec<&[u8]> = data.chunks(16_384).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let n = chunks.len();
        for (i, c) in chunks.into_iter().enumerate() {
            let flags = if eos && i + 1 == n { END_STREAM } else { 0 };
            write_frame(&mut self.stream, DATA, flags, stream, c)?;
        }
        Ok(())
    }

    pub fn reset(&mut self, stream: u32, code: u32) -> io::Result<()> {
        write_frame(&mut self.stream, RST_STREAM, 0, stream, &code.to_be_bytes())
    }

    pub fn window_update(&mut self, stream: u32, n: usize) -> io::Result<()> {
        write_frame(
            &mut self.stream,
            WINDOW_UPDATE,
            0,
            stream,
            &(n as u32).to_be_bytes(),
        )
    }
}

/// What the peer did on one stream.
#[derive(Debug)]
pub enum Event {
    Headers(Headers, bool),
    Data(Vec<u8>, bool),
    Reset,
    /// The connection ended (GOAWAY, close or error) with the stream open.
    Gone,
}

fn lock(w: &Mutex<Writer>) -> std::sync::MutexGuard<'_, Writer> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads frames until the connection ends; answers SETTINGS and PING, gives
/// back window for DATA, and reports stream events. Returns when the peer
/// closes (or on error), after reporting `Gone` on stream 0.
pub fn read_loop(mut reader: TcpStream, writer: Arc<Mutex<Writer>>, events: Sender<(u32, Event)>) {
    let mut decoder = hpack::Decoder::new();
    // A header block spread over HEADERS + CONTINUATION frames.
    let mut pending: Option<(u32, bool, Vec<u8>)> = None;
    while let Ok(frame) = read_frame(&mut reader) {
        match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => {
                let _ = write_frame(&mut lock(&writer).stream, SETTINGS, ACK, 0, &[]);
            }
            PING if frame.flags & ACK == 0 => {
                let _ = write_frame(&mut lock(&writer).stream, PING, ACK, 0, &frame.payload);
            }
            HEADERS => {
                let eos = frame.flags & END_STREAM != 0;
                let block = header_fragment(&frame).to_vec();
                if frame.flags & END_HEADERS != 0 {
                    match decode_headers(&mut decoder, &block) {
                        Ok(h) => {
                            let _ = events.send((frame.stream, Event::Headers(h, eos)));
                        }
                        Err(_) => break,
                    }
                } else {
                    pending = Some((frame.stream, eos, block));
                }
            }
            CONTINUATION => {
                if let Some((stream, eos, mut block)) = pending.take() {
                    block.extend_from_slice(&frame.payload);
                    if frame.flags & END_HEADERS != 0 {
                        match decode_headers(&mut decoder, &block) {
                            Ok(h) => {
                                let _ = events.send((stream, Event::Headers(h, eos)));
                            }
                            Err(_) => break,
                        }
                    } else {
                        pending = Some((stream, eos, block));
                    }
                }
            }
            DATA => {
                let eos = frame.flags & END_STREAM != 0;
                let n = frame.payload.len();
                if n > 0 {
                    let mut w = lock(&writer);
                    let _ = w.window_update(0, n);
                    if !eos {
                        let _ = w.window_update(frame.stream, n);
                    }
                }
                let _ = events.send((
                    frame.stream,
                    Event::Data(data_payload(&frame).to_vec(), eos),
                ));
            }
            RST_STREAM => {
                let code = frame
                    .payload
                    .get(..4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                let _ = code;
                let _ = events.send((frame.stream, Event::Reset));
            }
            GOAWAY => break,
            _ => {}
        }
    }
    let _ = events.send((0, Event::Gone));
}

/// A client connection: streams are opened on it, events arrive on `events`.
pub struct Client {
    pub writer: Arc<Mutex<Writer>>,
    pub events: Receiver<(u32, Event)>,
    next_stream: u32,
}

impl Client {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        let mut w = stream.try_clone()?;
        w.write_all(PREFACE)?;
        write_frame(&mut w, SETTINGS, 0, 0, &[])?;
        let writer = Arc::new(Mutex::new(Writer::new(w)));
        let (tx, rx) = channel();
        let reader_writer = writer.clone();
        std::thread::spawn(move || read_loop(stream, reader_writer, tx));
        Ok(Client {
            writer,
            events: rx,
            next_stream: 1,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a stream with `headers`; returns its id.
    pub fn open(&mut self, headers: &Headers, eos: bool) -> io::Result<u32> {
        let id = self.next_stream;
        self.next_stream += 2;
        self.lock().headers(id, headers, eos)?;
        Ok(id)
    }

    pub fn data(&self, stream: u32, data: &[u8], eos: bool) -> io::Result<()> {
        self.lock().data(stream, data, eos)
    }

    pub fn reset(&self, stream: u32) -> io::Result<()> {
        self.lock().reset(stream, CANCEL)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.lock().stream.shutdown(std::net::Shutdown::Both);
    }
}

/// A length-prefixed gRPC message (uncompressed).
pub fn frame_message(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Splits complete messages off the front of `buf`.
pub fn take_messages(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        out.push(buf[5..5 + len].to_vec());
        buf.drain(..5 + len);
    }
    out
}
