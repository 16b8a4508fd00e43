//! The proxy-wasm header-map encoding, shared by the glue and by tests.

/// The proxy-wasm map encoding: count, then (name size, value size) per pair, then each
/// name and value followed by a NUL byte. All numbers are little-endian u32.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = word(0)?;
    let mut sizes_at = 4;
    let mut data_at = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let (ns, vs) = (word(sizes_at)?, word(sizes_at + 4)?);
        sizes_at += 8;
        let name = bytes.get(data_at..data_at.checked_add(ns)?)?;
        data_at = data_at.checked_add(ns + 1)?;
        let value = bytes.get(data_at..data_at.checked_add(vs)?)?;
        data_at = data_at.checked_add(vs + 1)?;
        out.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
    }
    Some(out)
}

pub fn encode_pairs(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (n, v) in pairs {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (n, v) in pairs {
        out.extend_from_slice(n.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
