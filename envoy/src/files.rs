//! A static file server on loopback: `GET /<name>` answers the bytes given for
//! that name, anything else 404. It counts the GETs per path, so a test can
//! see when Envoy fetched a module (`vm_config.code.remote`).

use crate::http::{read_head, Head};
use crate::Result;
use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Shared {
    files: BTreeMap<String, Vec<u8>>,
    gets: Mutex<BTreeMap<String, u64>>,
    stop: AtomicBool,
}

/// A running file server; stops accepting when dropped.
pub struct FileServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FileServer {
    /// Serve `files` (path such as `/dedup_filter.wasm` -> bytes) on a free
    /// port of 127.0.0.1.
    pub fn start(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<Self> {
        let (addr, shared) = crate::accept::spawn(
            "file-server",
            0,
            Shared {
                files: files.into_iter().collect(),
                gets: Mutex::new(BTreeMap::new()),
                stop: AtomicBool::new(false),
            },
            |s| &s.stop,
            // Errors end only this connection.
            |stream, s| serve(stream, s).unwrap_or(()),
        )?;
        Ok(FileServer { addr, shared })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// GET requests for `path` so far (served or not).
    pub fn gets(&self, path: &str) -> u64 {
        let gets = self.shared.gets.lock().unwrap_or_else(|e| e.into_inner());
        gets.get(path).copied().unwrap_or(0)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        crate::accept::stop(&self.shared.stop, self.addr);
    }
}

fn serve(stream: TcpStream, shared: &Shared) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    while let Some(head) = read_head(&mut reader)? {
        let (method, path) = request_line(&head);
        if method == "GET" {
            let mut gets = shared.gets.lock().unwrap_or_else(|e| e.into_inner());
            *gets.entry(path.to_string()).or_default() += 1;
        }
        let found = shared.files.get(path).filter(|_| method == "GET");
        let (status, body): (&str, &[u8]) = match found {
            Some(bytes) => ("200 OK", bytes),
            None => ("404 Not Found", b"not found\n"),
        };
        write!(
            out,
            "HTTP/1.1 {status}\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )?;
        out.write_all(body)?;
        out.flush()?;
        if head.wants_close() {
            break;
        }
    }
    Ok(())
}

/// `GET /x?y HTTP/1.1` -> ("GET", "/x").
fn request_line(head: &Head) -> (&str, &str) {
    let mut words = head.start.split_whitespace();
    let method = words.next().unwrap_or("");
    let target = words.next().unwrap_or("");
    (method, target.split('?').next().unwrap_or(""))
}
