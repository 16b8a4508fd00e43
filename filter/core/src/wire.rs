//! Byte formats: one reader and one writer for every binary value the filter keeps
//! (shared-data buckets and response slots, etcd record values: big-endian numbers), and
//! the proxy-wasm header-map encoding (little-endian), shared by the glue and by tests.

/// Bytes that end early or hold a value no writer produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError;

/// Reads numbers and byte runs off the front of a slice. Every read past the end is a
/// `WireError`, never a panic, so decoders can be fed any bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// The next `n` bytes, borrowed.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < n {
            return Err(WireError);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// The next `N` bytes, copied.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, WireError> {
        self.array().map(u16::from_be_bytes)
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_be_bytes)
    }

    pub fn u64(&mut self) -> Result<u64, WireError> {
        self.array().map(u64::from_be_bytes)
    }

    /// A little-endian u32 (the proxy-wasm ABI's numbers).
    pub fn u32_le(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_le_bytes)
    }

    /// The next `n` bytes as UTF-8.
    pub fn str(&mut self, n: usize) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.bytes(n)?).map_err(|_| WireError)
    }

    /// What is left, without consuming it.
    pub fn rest(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Fails unless every byte was read: a value with trailing bytes is not one we wrote.
    pub fn end(&self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError)
        }
    }
}

/// Appends big-endian numbers and byte runs to a buffer: the inverse of [`Reader`].
#[derive(Debug, Clone, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            out: Vec::with_capacity(n),
        }
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }

    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    pub fn u32_le(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }

    /// `n` zero bytes.
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.out.resize(self.out.len() + n, 0);
        self
    }

    pub fn len(&self) -> usize {
        self.out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

/// The proxy-wasm map encoding: count, then (name size, value size) per pair, then each
/// name and value followed by a NUL byte. All numbers are little-endian u32.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    read_pairs(bytes).ok()
}

fn read_pairs(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, WireError> {
    let mut sizes = Reader::new(bytes);
    let count = sizes.u32_le()? as usize;
    let data_at = count.checked_mul(8).ok_or(WireError)?.saturating_add(4);
    let mut data = Reader::new(bytes.get(data_at..).ok_or(WireError)?);
    let mut out = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let (ns, vs) = (sizes.u32_le()? as usize, sizes.u32_le()? as usize);
        let name = data.bytes(ns)?;
        data.u8()?;
        let value = data.bytes(vs)?;
        // The last value's NUL may be missing (it always was accepted).
        if data.u8().is_err() && i + 1 < count {
            return Err(WireError);
        }
        // Names are ASCII in practice: the check without the lossy decoder's chunking.
        let name = match std::str::from_utf8(name) {
            Ok(n) => n.to_owned(),
            Err(_) => String::from_utf8_lossy(name).into_owned(),
        };
        out.push((name, value.to_vec()));
    }
    Ok(out)
}

pub fn encode_pairs(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut w = Writer::with_capacity(4 + pairs.len() * 8 + data);
    w.u32_le(pairs.len() as u32);
    for (n, v) in pairs {
        w.u32_le(n.len() as u32).u32_le(v.len() as u32);
    }
    for (n, v) in pairs {
        w.bytes(n.as_bytes()).u8(0).bytes(v).u8(0);
    }
    w.finish()
}

/// Bytes from hex lines (pinned encodings in tests).
#[cfg(test)]
pub(crate) fn unhex(lines: &[&str]) -> Vec<u8> {
    let hex: String = lines.concat();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reads_what_writer_wrote_and_errs_past_the_end() {
        let mut w = Writer::default();
        w.u8(1)
            .u16(0x0203)
            .u32(0x0405_0607)
            .u64(8)
            .u32_le(9)
            .bytes(b"ab");
        let bytes = w.finish();
        assert_eq!(
            bytes,
            unhex(&[
                "01",
                "0203",
                "04050607",
                "0000000000000008",
                "09000000",
                "6162"
            ])
        );
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x0203));
        assert_eq!(r.u32(), Ok(0x0405_0607));
        assert_eq!(r.u64(), Ok(8));
        assert_eq!(r.u32_le(), Ok(9));
        assert_eq!(r.end(), Err(WireError));
        assert_eq!(r.str(2), Ok("ab"));
        assert_eq!(r.end(), Ok(()));
        assert_eq!(r.u8(), Err(WireError));
        assert_eq!(r.bytes(usize::MAX), Err(WireError));
        assert_eq!(Reader::new(&[0xff, 0xfe]).str(2), Err(WireError));
    }

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            (":status".to_string(), b"200".to_vec()),
            ("set-cookie".to_string(), b"a=1".to_vec()),
            ("set-cookie".to_string(), b"b=2".to_vec()),
            ("x-empty".to_string(), Vec::new()),
            // An empty name and value: the encoder's size arithmetic must not underflow.
            (String::new(), Vec::new()),
        ];
        assert_eq!(decode_pairs(&encode_pairs(&pairs)), Some(pairs));
    }

    #[test]
    fn truncated_pairs_are_rejected_not_panicking() {
        let bytes = encode_pairs(&[("name".to_string(), b"value".to_vec())]);
        for cut in 1..bytes.len() - 1 {
            let _ = decode_pairs(&bytes[..cut]);
        }
        assert_eq!(decode_pairs(&bytes[..bytes.len() - 3]), None);
    }
}
