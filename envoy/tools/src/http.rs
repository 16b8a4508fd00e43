//! Minimal HTTP/1.1 framing shared by the client, the demo upstream and the relays:
//! a head (start line + headers) and a body by `content-length` or chunked.

use crate::{fail, Result};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Largest head or body accepted; the harness never needs more.
pub const MAX_HEAD: usize = 64 * 1024;
pub const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, Default)]
pub struct Head {
    /// `POST /x HTTP/1.1` or `HTTP/1.1 200 OK`.
    pub start: String,
    /// In order, names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    pub fn content_length(&self) -> Result<Option<usize>> {
        match self.header("content-length") {
            None => Ok(None),
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_BODY => Ok(Some(n)),
                _ => fail!("bad content-length {v:?}"),
            },
        }
    }

    /// `connection: close` was asked for.
    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Read one head; `Ok(None)` on a clean EOF before any byte.
pub fn read_head(r: &mut impl BufRead) -> Result<Option<Head>> {
    let mut total = 0usize;
    let mut lines = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line)?;
        if n == 0 {
            if lines.is_empty() && total == 0 {
                return Ok(None);
            }
            fail!("connection closed inside a message head");
        }
        total += n;
        if total > MAX_HEAD {
            fail!("message head larger than {MAX_HEAD} bytes");
        }
        let text = String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_string();
        if text.is_empty() {
            if lines.is_empty() {
                continue; // tolerate a stray CRLF between messages
            }
            break;
        }
        lines.push(text);
    }
    let mut it = lines.into_iter();
    let start = it.next().unwrap_or_default();
    let mut headers = Vec::new();
    for l in it {
        match l.split_once(':') {
            Some((n, v)) => headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string())),
            None => fail!("malformed header line {l:?}"),
        }
    }
    Ok(Some(Head { start, headers }))
}

/// Read a body framed by `head`. `until_eof`: with neither length nor chunked,
/// read to EOF (responses) instead of assuming no body (requests).
/// Returns the body and whether it arrived chunked.
pub fn read_body(r: &mut impl BufRead, head: &Head, until_eof: bool) -> Result<Vec<u8>> {
    if head.is_chunked() {
        return read_chunked(r);
    }
    if let Some(n) = head.content_length()? {
        let mut body = vec![0; n];
        r.read_exact(&mut body)?;
        return Ok(body);
    }
    let mut body = Vec::new();
    if until_eof {
        r.take(MAX_BODY as u64).read_to_end(&mut body)?;
    }
    Ok(body)
}

fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            fail!("connection closed inside a chunked body");
        }
        let size_text = line.trim().split(';').next().unwrap_or("").trim();
        let size = match usize::from_str_radix(size_text, 16) {
            Ok(s) => s,
            Err(_) => fail!("bad chunk size line {line:?}"),
        };
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let mut t = String::new();
                if r.read_line(&mut t)? == 0 || t.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            fail!("chunked body larger than {MAX_BODY} bytes");
        }
        let at = body.len();
        body.resize(at + size, 0);
        r.read_exact(&mut body[at..])?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            fail!("chunk not followed by CRLF");
        }
    }
}

/// Write one chunk of a chunked body (an empty `data` is the last chunk).
pub fn write_chunk(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    if data.is_empty() {
        w.write_all(b"0\r\n\r\n")?;
    } else {
        write!(w, "{:x}\r\n", data.len())?;
        w.write_all(data)?;
        w.write_all(b"\r\n")?;
    }
    w.flush()
}

/// Close `stream` with a TCP reset (SO_LINGER 0) instead of an orderly FIN:
/// the peer sees its connection cut (a crashed client, a service that dies
/// mid-request).
pub fn close_with_reset(stream: TcpStream) -> Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket this function owns, with a correctly
    // sized `linger` value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        fail!("setsockopt(SO_LINGER): {}", std::io::Error::last_os_error());
    }
    drop(stream);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    #[test]
    fn chunked_body_with_extension_and_trailer() {
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\nGET";
        let mut r = BufReader::new(&raw[..]);
        let head = read_head(&mut r).unwrap().unwrap();
        assert!(head.is_chunked());
        assert_eq!(read_body(&mut r, &head, false).unwrap(), b"abcde");
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "GET");
    }

    #[test]
    fn content_length_body_and_eof() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let mut r = BufReader::new(&raw[..]);
        let head = read_head(&mut r).unwrap().unwrap();
        assert_eq!(read_body(&mut r, &head, true).unwrap(), b"ok");
        assert!(read_head(&mut r).unwrap().is_none());
    }
}
