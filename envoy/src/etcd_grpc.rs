//! etcd's own txn rate over its gRPC API, for `bench-etcd`: blocking unary gRPC calls,
//! one at a time per connection, in the test kit's HTTP/2 frames (`loopback-h2`, shared
//! with host-test). No reader thread: the calling thread reads its own answer, answering
//! SETTINGS and PING and giving back the connection's window on the way; response
//! headers are not decoded (the call's message is the answer; a call without one
//! failed).
//!
//! The txns are the filter's own claim txns (`dedup_core::stores::etcd::pb::claim_txn`): a
//! create-if-absent put with a lease of a fresh key, the failure branch reading it.

use crate::error::Result;
use crate::fail;
use dedup_core::stores::etcd::pb as etcdpb;
use loopback_h2 as h2;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One HTTP/2 connection to an etcd member.
pub struct GrpcConn {
    reader: TcpStream,
    writer: h2::Writer,
    authority: String,
    next_stream: u32,
}

impl GrpcConn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<GrpcConn> {
        let sock = TcpStream::connect_timeout(&addr, timeout)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(timeout))?;
        let mut hello = h2::PREFACE.to_vec();
        h2::write_frame(&mut hello, h2::SETTINGS, 0, 0, &[])?;
        let mut writer = h2::Writer::new(sock.try_clone()?);
        writer.stream.write_all(&hello)?;
        Ok(GrpcConn {
            reader: sock,
            writer,
            authority: addr.to_string(),
            next_stream: 1,
        })
    }

    /// One unary call: `Ok(Some(message))` when the call answered a message, `Ok(None)`
    /// when it ended without one (a gRPC error status, a reset stream).
    pub fn unary(&mut self, path: &str, message: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let id = self.next_stream;
        self.next_stream += 2;
        let headers: h2::Headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority.as_str()),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        // Both frames in one write, as one segment on loopback.
        let block = h2::encode_headers(&mut self.writer.encoder, &headers);
        let mut out = Vec::with_capacity(32 + block.len() + message.len());
        h2::write_frame(&mut out, h2::HEADERS, h2::END_HEADERS, id, &block)?;
        h2::write_frame(
            &mut out,
            h2::DATA,
            h2::END_STREAM,
            id,
            &h2::frame_message(message),
        )?;
        self.writer.stream.write_all(&out)?;
        let mut data = Vec::new();
        loop {
            let frame = h2::read_frame(&mut self.reader)?;
            let eos = frame.flags & h2::END_STREAM != 0;
            match frame.kind {
                h2::SETTINGS if frame.flags & h2::ACK == 0 => {
                    h2::write_frame(&mut self.writer.stream, h2::SETTINGS, h2::ACK, 0, &[])?;
                }
                h2::PING if frame.flags & h2::ACK == 0 => {
                    let payload = &frame.payload;
                    h2::write_frame(&mut self.writer.stream, h2::PING, h2::ACK, 0, payload)?;
                }
                h2::GOAWAY => return Err(io::Error::other("GOAWAY")),
                h2::RST_STREAM if frame.stream == id => return Ok(None),
                h2::DATA if frame.stream == id => {
                    data.extend_from_slice(h2::data_payload(&frame));
                    if !frame.payload.is_empty() {
                        self.writer.window_update(0, frame.payload.len())?;
                    }
                    if eos {
                        break;
                    }
                }
                h2::HEADERS if frame.stream == id && eos => break,
                _ => {}
            }
        }
        Ok(h2::take_messages(&mut data).into_iter().next())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::EtcdCluster;

    #[test]
    fn claim_txns_answer_and_an_unknown_method_ends_without_a_message_on_a_real_etcd() {
        let etcd = EtcdCluster::start("etcd-grpc", 1).unwrap();
        etcd.wait_healthy(Duration::from_secs(20)).unwrap();
        let members: Vec<SocketAddr> = etcd
            .client_ports()
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let r = txn_rate(&members, 2, 1, 64, 0).unwrap();
        assert!(r.txns > 0 && r.failed == 0, "{r:?}");
        // A gRPC error (UNIMPLEMENTED) is a trailers-only answer: no message.
        let mut conn = GrpcConn::connect(members[0], Duration::from_secs(5)).unwrap();
        assert_eq!(
            conn.unary("/etcdserverpb.KV/NoSuchMethod", b"").unwrap(),
            None
        );
        // The connection carries on after it.
        let grant = conn.unary(etcdpb::LEASE_GRANT, &etcdpb::lease_grant(60));
        assert!(matches!(grant, Ok(Some(_))), "{grant:?}");
    }
}
