//! etcd's own txn rate over its gRPC API, for `bench-etcd`: a small blocking HTTP/2
//! client (cleartext, prior knowledge) that sends unary gRPC calls and reads their
//! answers, one call at a time per connection. Just enough HTTP/2 for that: the preface,
//! SETTINGS and PING acknowledgements, connection window updates, HPACK literals without
//! indexing for the request headers; response headers are not decoded (the call's
//! message is the answer; a call without one failed).
//!
//! The txns are the filter's own claim txns (`dedup_core::etcdpb::claim_txn`): a
//! create-if-absent put with a lease of a fresh key, the failure branch reading it.

use crate::error::Result;
use crate::fail;
use dedup_core::etcdpb;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// One HTTP/2 connection to an etcd member.
pub struct GrpcConn {
    sock: TcpStream,
    authority: String,
    next_stream: u32,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK string (no Huffman) with a 7-bit prefix length.
fn hpack_string(out: &mut Vec<u8>, s: &str) {
    let mut len = s.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(s.as_bytes());
}

impl GrpcConn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<GrpcConn> {
        let mut sock = TcpStream::connect_timeout(&addr, timeout)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(timeout))?;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        sock.write_all(&hello)?;
        Ok(GrpcConn {
            sock,
            authority: addr.to_string(),
            next_stream: 1,
        })
    }

    fn read_frame(&mut self) -> io::Result<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.sock.read_exact(&mut head)?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload)?;
        Ok((head[3], head[4], stream, payload))
    }

    /// One unary call: `Ok(Some(message))` when the call answered a message, `Ok(None)`
    /// when it ended without one (a gRPC error status, a reset stream).
    pub fn unary(&mut self, path: &str, message: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut block = Vec::with_capacity(160);
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority.as_str()),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            block.push(0); // literal without indexing, new name
            hpack_string(&mut block, name);
            hpack_string(&mut block, value);
        }
        let mut body = Vec::with_capacity(5 + message.len());
        body.push(0);
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(DATA, END_STREAM, id, &body));
        self.sock.write_all(&out)?;
        let mut data = Vec::new();
        loop {
            let (kind, flags, stream, mut payload) = self.read_frame()?;
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.sock.write_all(&frame(SETTINGS, ACK, 0, &[]))?;
                }
                PING if flags & ACK == 0 => {
                    self.sock.write_all(&frame(PING, ACK, 0, &payload))?;
                }
                GOAWAY => return Err(io::Error::other("GOAWAY")),
                RST_STREAM if stream == id => return Ok(None),
                DATA if stream == id => {
                    let n = payload.len() as u32;
                    if flags & PADDED != 0 && !payload.is_empty() {
                        let pad = payload[0] as usize;
                        let end = payload.len().saturating_sub(pad);
                        payload = payload.get(1..end).unwrap_or_default().to_vec();
                    }
                    data.extend_from_slice(&payload);
                    if n > 0 {
                        self.sock
                            .write_all(&frame(WINDOW_UPDATE, 0, 0, &n.to_be_bytes()))?;
                    }
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                HEADERS if stream == id => {
                    let _ = flags & PRIORITY;
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        if data.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        Ok(data.get(5..5 + len).map(<[u8]>::to_vec))
    }
}

/// etcd's txn rate through its gRPC API.
#[derive(Debug, Clone)]
pub struct TxnRate {
    pub txn_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub txns: u64,
    /// Calls that got no message or a txn that did not succeed.
    pub failed: u64,
}

/// Runs `concurrency` clients, one connection each spread over `members`, for
/// `seconds`: each sends the filter's claim txn (a `value_bytes` value, one shared
/// lease) of a fresh key, one at a time.
pub fn txn_rate(
    members: &[SocketAddr],
    concurrency: usize,
    seconds: u64,
    value_bytes: usize,
    round: u32,
) -> Result<TxnRate> {
    if members.is_empty() || concurrency == 0 {
        fail!("txn_rate needs members and clients");
    }
    let timeout = Duration::from_secs(5);
    let mut first = match GrpcConn::connect(members[0], timeout) {
        Ok(c) => c,
        Err(e) => fail!("connecting to etcd {}: {e}", members[0]),
    };
    let grant = match first.unary(etcdpb::LEASE_GRANT, &etcdpb::lease_grant(120)) {
        Ok(Some(m)) => m,
        Ok(None) => fail!("etcd refused a lease grant"),
        Err(e) => fail!("lease grant: {e}"),
    };
    let lease = match etcdpb::lease_grant_response(&grant) {
        Some(Ok(id)) => id,
        other => fail!("unreadable lease grant answer: {other:?}"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let value = vec![0x5au8; value_bytes];
    let start = Instant::now();
    let handles: Vec<_> = (0..concurrency)
        .map(|i| {
            let addr = members[i % members.len()];
            let (stop, value) = (stop.clone(), value.clone());
            std::thread::spawn(move || -> io::Result<(Vec<u32>, u64)> {
                let mut conn = GrpcConn::connect(addr, timeout)?;
                let mut lat_us = Vec::new();
                let mut failed = 0;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // The filter's key shape: a prefix and 64 hex digits.
                    let key = format!("bench-grpc/{round:04}{i:04}{n:056x}");
                    n += 1;
                    let t = Instant::now();
                    let answer =
                        conn.unary(etcdpb::TXN, &etcdpb::claim_txn(&key, &value, lease))?;
                    let ok = answer
                        .as_deref()
                        .and_then(etcdpb::txn_response)
                        .is_some_and(|(succeeded, _, _)| succeeded);
                    if ok {
                        lat_us.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    } else {
                        failed += 1;
                    }
                }
                Ok((lat_us, failed))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut failed = 0;
    for h in handles {
        match h.join() {
            Ok(Ok((lat, f))) => {
                all.extend(lat);
                failed += f;
            }
            Ok(Err(e)) => fail!("an etcd gRPC client failed: {e}"),
            Err(_) => fail!("an etcd gRPC client panicked"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |us| f64::from(*us) / 1000.0)
    };
    Ok(TxnRate {
        txn_per_s: all.len() as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        txns: all.len() as u64,
        failed,
    })
}
