//! A loopback TCP relay that can cut the link it carries: the chaos soak puts
//! one in front of each etcd member's client and peer ports, so a member can
//! be partitioned (its packets silently stop) and healed without root,
//! iptables or network namespaces.
//!
//! While cut, nothing passes either way: bytes already read are held, new
//! connections are accepted but not forwarded, so peers see a black hole
//! (timeouts), not a refusal. Healing lets the held bytes through, as TCP
//! retransmission would after a short partition. A target that refuses (a
//! killed member) makes the relay reset the accepted connection.
//!
//! Started with a one-way delay (`start_delayed`), it is also a long link: every
//! byte reaches the other side that long after it was read, in order, both ways
//! (a network latency, not a bandwidth limit). The connection itself is made at
//! once: the links it stands for (a proxy to a remote region's etcd) are long-lived
//! HTTP/2 connections, whose handshake is not what a request waits for.

use crate::Result;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

struct Shared {
    target: SocketAddr,
    /// Added to every byte's passage, each way.
    delay: Duration,
    cut: Mutex<bool>,
    healed: Condvar,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Both sockets of every live pair, so that drop can unblock their pumps.
    live: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

impl Shared {
    fn cut_flag(&self) -> MutexGuard<'_, bool> {
        self.cut.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Block while the link is cut; false once the relay is stopping.
    fn wait_open(&self) -> bool {
        let mut cut = self.cut_flag();
        while *cut && !self.stop.load(Ordering::SeqCst) {
            cut = match self.healed.wait_timeout(cut, Duration::from_millis(200)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        !self.stop.load(Ordering::SeqCst)
    }

    fn forget(&self, id: u64) {
        let pair = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(pair) = pair {
            for s in &pair {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A running relay from `addr()` to its target; stops (and closes every
/// relayed connection) when dropped.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Relay {
    /// Listen on a free 127.0.0.1 port and forward each connection to `target`.
    pub fn start(target: SocketAddr) -> Result<Relay> {
        Self::start_delayed(target, Duration::ZERO)
    }

    /// `start`, every byte delayed by `one_way` in each direction.
    pub fn start_delayed(target: SocketAddr, one_way: Duration) -> Result<Relay> {
        let (addr, shared) = crate::accept::spawn(
            "relay",
            0,
            Shared {
                target,
                delay: one_way,
                cut: Mutex::new(false),
                healed: Condvar::new(),
                stop: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                live: Mutex::new(HashMap::new()),
            },
            |s| &s.stop,
            relay_connection,
        )?;
        Ok(Relay { addr, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Partition: from now on nothing passes until `heal`.
    pub fn cut(&self) {
        *self.shared.cut_flag() = true;
    }

    pub fn heal(&self) {
        *self.shared.cut_flag() = false;
        self.shared.healed.notify_all();
    }

    pub fn is_cut(&self) -> bool {
        *self.shared.cut_flag()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.healed.notify_all();
        let ids: Vec<u64> = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        for id in ids {
            self.shared.forget(id);
        }
        crate::accept::stop(&self.shared.stop, self.addr);
    }
}

fn relay_connection(client: TcpStream, shared: &Arc<Shared>) {
    // A connection accepted during a cut waits, unanswered, like a SYN into a black hole
    // that the kernel happened to complete.
    if !shared.wait_open() {
        return;
    }
    let upstream = match TcpStream::connect_timeout(&shared.target, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(_) => {
            let _ = crate::http::close_with_reset(client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    shared
        .live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, [c2, u2]);
    let (Ok(c_read), Ok(u_write)) = (client.try_clone(), upstream.try_clone()) else {
        shared.forget(id);
        return;
    };
    let s = shared.clone();
    let back = std::thread::Builder::new()
        .name("relay-pump".into())
        .spawn(move || {
            pump(upstream, client, &s);
            s.forget(id);
        });
    if back.is_err() {
        shared.forget(id);
        return;
    }
    pump(c_read, u_write, shared);
    shared.forget(id);
}

/// Copy `from` to `to` until either side closes; hold the bytes while cut.
fn pump(from: TcpStream, to: TcpStream, shared: &Arc<Shared>) {
    if shared.delay.is_zero() {
        return pump_now(from, to, shared);
    }
    // A writer sends each chunk when its time comes; the reader never waits for it.
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let s = shared.clone();
    let writer = std::thread::Builder::new()
        .name("relay-delay".into())
        .spawn(move || {
            let mut to = to;
            for (due, bytes) in rx {
                let now = std::time::Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if !s.wait_open() || to.write_all(&bytes).is_err() {
                    return;
                }
            }
        });
    let Ok(writer) = writer else {
        return;
    };
    let mut from = from;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let due = std::time::Instant::now() + shared.delay;
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}

fn pump_now(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !shared.wait_open() {
            return;
        }
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// An echo server on loopback: one line in, the same line out.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                std::thread::spawn(move || {
                    let mut r = std::io::BufReader::new(c.try_clone().unwrap());
                    let mut w = c;
                    let mut line = String::new();
                    while r.read_line(&mut line).unwrap_or(0) > 0 {
                        if w.write_all(line.as_bytes()).is_err() {
                            return;
                        }
                        line.clear();
                    }
                });
            }
        });
        addr
    }

    fn round_trip(
        c: &mut TcpStream,
        r: &mut std::io::BufReader<TcpStream>,
        msg: &str,
    ) -> Option<String> {
        c.write_all(format!("{msg}\n").as_bytes()).ok()?;
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim_end().to_string()),
            _ => None,
        }
    }

    #[test]
    fn passes_holds_while_cut_and_delivers_after_heal() {
        let relay = Relay::start(echo()).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut r = std::io::BufReader::new(c.try_clone().unwrap());
        assert_eq!(round_trip(&mut c, &mut r, "one").as_deref(), Some("one"));

        relay.cut();
        assert_eq!(
            round_trip(&mut c, &mut r, "two"),
            None,
            "nothing passes while cut"
        );
        // A new connection during the cut is accepted but gets nothing either.
        let mut c2 = TcpStream::connect(relay.addr()).unwrap();
        c2.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut r2 = std::io::BufReader::new(c2.try_clone().unwrap());
        assert_eq!(round_trip(&mut c2, &mut r2, "three"), None);

        relay.heal();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), "two", "held bytes arrive after the heal");
        c2.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut line = String::new();
        r2.read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), "three");
    }

    #[test]
    fn a_refusing_target_resets_the_client() {
        // A port nothing listens on.
        let dead = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let relay = Relay::start(dead).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 8];
        let got = c.read(&mut buf);
        assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    }
}
