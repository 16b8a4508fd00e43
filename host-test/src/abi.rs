//! proxy-wasm ABI 0.2.1 constants and the pairs wire format.

/// Status codes returned by host calls (proxy-wasm `WasmResult`), numbered
/// from 0 in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    Ok,
    NotFound,
    BadArgument,
    SerializationFailure,
    ParseFailure,
    BadExpression,
    InvalidMemoryAccess,
    Empty,
    CasMismatch,
    ResultMismatch,
    InternalFailure,
    BrokenConnection,
    Unimplemented,
}

impl Status {
    pub(crate) fn code(self) -> i32 {
        self as i32
    }
}

/// Log levels of `proxy_log` (and of Envoy's logger), numbered from 0 in
/// this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    const ALL: [LogLevel; 6] = [
        LogLevel::Trace,
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warn,
        LogLevel::Error,
        LogLevel::Critical,
    ];

    pub(crate) fn from_raw(level: i32) -> Option<LogLevel> {
        from_raw(&Self::ALL, level)
    }
}

/// Metric kinds of `proxy_define_metric`, numbered from 0 in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

impl MetricKind {
    const ALL: [MetricKind; 3] = [
        MetricKind::Counter,
        MetricKind::Gauge,
        MetricKind::Histogram,
    ];

    pub(crate) fn from_raw(kind: i32) -> Option<MetricKind> {
        from_raw(&Self::ALL, kind)
    }
}

/// The variant an ABI number names: its index in `all`.
fn from_raw<T: Copy>(all: &[T], raw: i32) -> Option<T> {
    usize::try_from(raw).ok().and_then(|i| all.get(i)).copied()
}

// Header map types.
pub(crate) const MAP_REQUEST_HEADERS: i32 = 0;
pub(crate) const MAP_REQUEST_TRAILERS: i32 = 1;
pub(crate) const MAP_RESPONSE_HEADERS: i32 = 2;
pub(crate) const MAP_RESPONSE_TRAILERS: i32 = 3;
pub(crate) const MAP_GRPC_INITIAL: i32 = 4;
pub(crate) const MAP_GRPC_TRAILING: i32 = 5;
pub(crate) const MAP_CALL_HEADERS: i32 = 6;
pub(crate) const MAP_CALL_TRAILERS: i32 = 7;

// Buffer types.
pub(crate) const BUF_REQUEST_BODY: i32 = 0;
pub(crate) const BUF_RESPONSE_BODY: i32 = 1;
pub(crate) const BUF_GRPC_RECEIVE: i32 = 5;
pub(crate) const BUF_CALL_RESPONSE_BODY: i32 = 4;
pub(crate) const BUF_VM_CONFIGURATION: i32 = 6;
pub(crate) const BUF_PLUGIN_CONFIGURATION: i32 = 7;
pub(crate) const BUF_MAX: i32 = 8;

// Stream types of proxy_continue_stream / proxy_close_stream.
pub(crate) const STREAM_REQUEST: i32 = 0;
pub(crate) const STREAM_RESPONSE: i32 = 1;
pub(crate) const STREAM_MAX: i32 = 3;

/// Encodes pairs: u32 count, then (u32 key len, u32 value len) per pair,
/// then each key and value followed by a NUL byte. Little endian.
pub(crate) fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 10 + k.as_ref().len() + v.as_ref().len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Decodes the pairs format; malformed input yields the pairs read so far
/// (as cpp-host's `toPairs`, which returns an empty list on bad sizes).
pub(crate) fn decode_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let Some(count) = word(0) else {
        return Vec::new();
    };
    let mut lens = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        match (word(4 + i * 8), word(8 + i * 8)) {
            (Some(k), Some(v)) => lens.push((k, v)),
            _ => return Vec::new(),
        }
    }
    let mut at = 4 + count * 8;
    let mut out = Vec::with_capacity(count);
    for (kl, vl) in lens {
        let (Some(k), Some(v)) = (
            bytes.get(at..at + kl),
            bytes.get(at + kl + 1..at + kl + 1 + vl),
        ) else {
            return Vec::new();
        };
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
        at += kl + vl + 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_have_the_abi_numbers() {
        assert_eq!(Status::InvalidMemoryAccess as u32, 6);
        assert_eq!(Status::Unimplemented as u32, 12);
        assert_eq!(LogLevel::from_raw(5), Some(LogLevel::Critical));
        assert_eq!(LogLevel::from_raw(6), None);
        assert_eq!(MetricKind::from_raw(2), Some(MetricKind::Histogram));
        assert_eq!(MetricKind::from_raw(-1), None);
    }

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![(":path", "/a"), ("k", ""), ("", "v")];
        let decoded = decode_pairs(&encode_pairs(&pairs));
        let expected: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(decoded, expected);
        assert!(decode_pairs(&[1, 0, 0, 0, 9]).is_empty());
    }
}
