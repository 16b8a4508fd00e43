//! etcd's v3 gRPC messages, as far as the store uses them: a hand-written protobuf
//! encoder for the requests and a decoder for the answers (no code generation, no
//! dependency; a few hundred bytes of Wasm). Field numbers are those of etcd's
//! `etcdserverpb/rpc.proto` and `mvccpb/kv.proto`.
//!
//! The decoder never panics: every length is checked against what is left, and an
//! answer that does not read as the expected message is `None`.

/// gRPC methods (`/service/method`, as `StoreCall::path`).
pub const TXN: &str = "/etcdserverpb.KV/Txn";
pub const RANGE: &str = "/etcdserverpb.KV/Range";
pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";

/// gRPC status codes retried as transport failures.
pub const DEADLINE_EXCEEDED: i64 = 4;
pub const UNAVAILABLE: i64 = 14;

// Compare.target
const TARGET_CREATE: u64 = 1;
const TARGET_MOD: u64 = 2;

/// Splits `/service/method` into its two parts (for `proxy_grpc_call`).
pub fn split_method(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    rest.split_once('/')
}

// ---- encoding ----

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// An integer field (int64 and enums are varints; negative int64 takes ten bytes).
fn int_field(out: &mut Vec<u8>, field: u32, v: i64) {
    tag(out, field, 0);
    varint(out, v as u64);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, v: &[u8]) {
    tag(out, field, 2);
    varint(out, v.len() as u64);
    out.extend_from_slice(v);
}

fn put_op(key: &[u8], value: &[u8], lease: i64) -> Vec<u8> {
    let mut put = Vec::with_capacity(key.len() + value.len() + 16);
    bytes_field(&mut put, 1, key);
    bytes_field(&mut put, 2, value);
    if lease != 0 {
        int_field(&mut put, 3, lease);
    }
    let mut op = Vec::with_capacity(put.len() + 4);
    bytes_field(&mut op, 2, &put);
    op
}

fn key_op(field: u32, key: &[u8]) -> Vec<u8> {
    let mut inner = Vec::with_capacity(key.len() + 2);
    bytes_field(&mut inner, 1, key);
    let mut op = Vec::with_capacity(inner.len() + 4);
    bytes_field(&mut op, field, &inner);
    op
}

/// A `Compare` with result EQUAL on `target` (CREATE: field 5, MOD: field 6). The oneof
/// value is written even when zero: it is set.
fn compare(key: &[u8], target: u64, revision: i64) -> Vec<u8> {
    let mut c = Vec::with_capacity(key.len() + 16);
    int_field(&mut c, 2, target as i64);
    bytes_field(&mut c, 3, key);
    int_field(
        &mut c,
        if target == TARGET_CREATE { 5 } else { 6 },
        revision,
    );
    c
}

fn txn(compare: &[u8], success: &[u8], failure: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(compare.len() + success.len() + failure.len() + 12);
    bytes_field(&mut t, 1, compare);
    bytes_field(&mut t, 2, success);
    bytes_field(&mut t, 3, failure);
    t
}

/// Claim: create the record if absent, else read the existing one.
pub fn claim_txn(key: &str, value: &[u8], lease: i64) -> Vec<u8> {
    let k = key.as_bytes();
    txn(
        &compare(k, TARGET_CREATE, 0),
        &put_op(k, value, lease),
        &key_op(1, k),
    )
}

/// Replace the record at `mod_revision`, else read the current one.
pub fn replace_txn(key: &str, mod_revision: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let k = key.as_bytes();
    txn(
        &compare(k, TARGET_MOD, mod_revision),
        &put_op(k, value, lease),
        &key_op(1, k),
    )
}

/// Delete the record if it is still at `mod_revision`, else read the current one.
pub fn delete_txn(key: &str, mod_revision: i64) -> Vec<u8> {
    let k = key.as_bytes();
    txn(
        &compare(k, TARGET_MOD, mod_revision),
        &key_op(3, k),
        &key_op(1, k),
    )
}

/// A `RangeRequest` reading one key (a linearizable read).
pub fn read_key(key: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(key.len() + 4);
    bytes_field(&mut r, 1, key);
    r
}

/// A `RangeRequest` counting the keys in `[key, range_end)`.
pub fn count_range(key: &[u8], range_end: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(key.len() + range_end.len() + 8);
    bytes_field(&mut r, 1, key);
    bytes_field(&mut r, 2, range_end);
    int_field(&mut r, 9, 1);
    r
}

pub fn lease_grant(ttl_seconds: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(12);
    int_field(&mut r, 1, i64::try_from(ttl_seconds).unwrap_or(i64::MAX));
    r
}

/// How the glue hands a failed gRPC call to the core: the body of the `CallAnswer`
/// (status 0), shaped as `google.rpc.Status` (code 1, message 2).
pub fn status_body(code: u32, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 8);
    int_field(&mut out, 1, i64::from(code));
    bytes_field(&mut out, 2, message);
    out
}

/// Envoy's `config.core.v3.GrpcService` naming `cluster` with `authority` (the first
/// argument of `proxy_grpc_call` when the calls' `:authority` is not the cluster name).
pub fn grpc_service(cluster: &str, authority: &str) -> Vec<u8> {
    let mut envoy_grpc = Vec::with_capacity(cluster.len() + authority.len() + 4);
    bytes_field(&mut envoy_grpc, 1, cluster.as_bytes());
    bytes_field(&mut envoy_grpc, 2, authority.as_bytes());
    let mut out = Vec::with_capacity(envoy_grpc.len() + 2);
    bytes_field(&mut out, 1, &envoy_grpc);
    out
}

// ---- decoding ----

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Iterates the fields of one message; yields `None` (and stops) on malformed input.
pub struct Fields<'a> {
    rest: &'a [u8],
}

pub fn fields(bytes: &[u8]) -> Fields<'_> {
    Fields { rest: bytes }
}

fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

impl<'a> Fields<'a> {
    /// The next field, `Some(Err(()))` when the rest does not read as protobuf.
    fn step(&mut self) -> Option<Result<(u64, Value<'a>), ()>> {
        if self.rest.is_empty() {
            return None;
        }
        let r = self.read();
        if r.is_err() {
            self.rest = &[];
        }
        Some(r)
    }

    fn read(&mut self) -> Result<(u64, Value<'a>), ()> {
        let (key, n) = read_varint(self.rest).ok_or(())?;
        let rest = self.rest.get(n..).ok_or(())?;
        let field = key >> 3;
        if field == 0 {
            return Err(());
        }
        let (value, used) = match key & 7 {
            0 => {
                let (v, m) = read_varint(rest).ok_or(())?;
                (Value::Varint(v), m)
            }
            1 => (Value::Fixed, 8),
            2 => {
                let (len, m) = read_varint(rest).ok_or(())?;
                let len = usize::try_from(len).map_err(|_| ())?;
                let end = m.checked_add(len).ok_or(())?;
                (Value::Bytes(rest.get(m..end).ok_or(())?), end)
            }
            5 => (Value::Fixed, 4),
            _ => return Err(()),
        };
        self.rest = rest.get(used..).ok_or(())?;
        Ok((field, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), ()>;
    fn next(&mut self) -> Option<Self::Item> {
        self.step()
    }
}

/// Checks that `bytes` is a well-formed message, calling `f` on each field.
fn each<'a>(bytes: &'a [u8], mut f: impl FnMut(u64, Value<'a>)) -> Option<()> {
    for item in fields(bytes) {
        let (n, v) = item.ok()?;
        f(n, v);
    }
    Some(())
}

fn header_revision(header: &[u8]) -> Option<i64> {
    let mut rev = 0i64;
    each(header, |n, v| {
        if let (3, Value::Varint(r)) = (n, v) {
            rev = r as i64;
        }
    })?;
    Some(rev)
}

/// A `TxnResponse`: (succeeded, header revision, first kv of the first range response).
#[allow(clippy::type_complexity)]
pub fn txn_response(bytes: &[u8]) -> Option<(bool, i64, Option<(i64, Vec<u8>)>)> {
    let mut header = None;
    let mut succeeded = false;
    let mut first_range: Option<&[u8]> = None;
    each(bytes, |n, v| match (n, v) {
        (1, Value::Bytes(h)) => header = Some(h),
        (2, Value::Varint(b)) => succeeded = b != 0,
        (3, Value::Bytes(op)) if first_range.is_none() => {
            // ResponseOp: response_range is field 1.
            for (m, w) in fields(op).flatten() {
                if let (1, Value::Bytes(r)) = (m, w) {
                    first_range = Some(r);
                }
            }
        }
        _ => {}
    })?;
    let revision = header_revision(header?)?;
    let existing = match first_range {
        None => None,
        Some(range) => range_first_kv(range)?,
    };
    Some((succeeded, revision, existing))
}

/// The first kv of a `RangeResponse` (kvs: field 2) as (mod_revision, value);
/// `Some(None)` when it has none, `None` when the message does not decode.
fn range_first_kv(range: &[u8]) -> Option<Option<(i64, Vec<u8>)>> {
    let mut kv = None;
    each(range, |n, v| {
        if let (2, Value::Bytes(k)) = (n, v) {
            if kv.is_none() {
                kv = Some(k);
            }
        }
    })?;
    let Some(kv) = kv else {
        return Some(None);
    };
    // KeyValue: mod_revision 3, value 5.
    let mut mod_rev = 0i64;
    let mut value: &[u8] = &[];
    each(kv, |n, v| match (n, v) {
        (3, Value::Varint(r)) => mod_rev = r as i64,
        (5, Value::Bytes(b)) => value = b,
        _ => {}
    })?;
    Some(Some((mod_rev, value.to_vec())))
}

/// A `RangeResponse` to [`read_key`]: `Some(None)` when the key is absent,
/// `Some(Some((mod_revision, value)))` when present; `None` when it does not decode or
/// has no header (not an answer etcd gives).
pub fn range_read(bytes: &[u8]) -> Option<Option<(i64, Vec<u8>)>> {
    let mut header = false;
    each(bytes, |n, v| {
        if let (1, Value::Bytes(_)) = (n, v) {
            header = true;
        }
    })?;
    if !header {
        return None;
    }
    range_first_kv(bytes)
}

/// A `LeaseGrantResponse`: `Ok(id)`, or `Err(error)` when etcd put an error in it.
pub fn lease_grant_response(bytes: &[u8]) -> Option<Result<i64, String>> {
    let mut id = 0i64;
    let mut error: &[u8] = &[];
    let mut header = false;
    each(bytes, |n, v| match (n, v) {
        (1, Value::Bytes(_)) => header = true,
        (2, Value::Varint(i)) => id = i as i64,
        (4, Value::Bytes(e)) => error = e,
        _ => {}
    })?;
    if !error.is_empty() {
        return Some(Err(String::from_utf8_lossy(error).into_owned()));
    }
    (header && id != 0).then_some(Ok(id))
}

/// A `RangeResponse`'s count (field 4; absent when zero).
pub fn range_count(bytes: &[u8]) -> Option<u64> {
    let mut count = 0u64;
    let mut header = false;
    each(bytes, |n, v| match (n, v) {
        (1, Value::Bytes(_)) => header = true,
        (4, Value::Varint(c)) => count = c,
        _ => {}
    })?;
    header.then_some(count)
}

/// A failed call's `status_body`: (code, message).
pub fn status(bytes: &[u8]) -> Option<(i64, String)> {
    let mut code = None;
    let mut message: &[u8] = &[];
    each(bytes, |n, v| match (n, v) {
        (1, Value::Varint(c)) => code = Some(c as i64),
        (2, Value::Bytes(m)) => message = m,
        _ => {}
    })?;
    Some((code?, String::from_utf8_lossy(message).into_owned()))
}

#[cfg(test)]
pub mod testing {
    //! Encoders of etcd's answers and decoders of the requests, for the fake etcd and
    //! the tests (the filter itself never needs these directions).
    use super::*;

    pub fn header(revision: i64) -> Vec<u8> {
        let mut h = Vec::new();
        int_field(&mut h, 3, revision);
        h
    }

    pub fn kv(key: &[u8], create: i64, modr: i64, value: &[u8], lease: i64) -> Vec<u8> {
        let mut k = Vec::new();
        bytes_field(&mut k, 1, key);
        int_field(&mut k, 2, create);
        int_field(&mut k, 3, modr);
        bytes_field(&mut k, 5, value);
        if lease != 0 {
            int_field(&mut k, 6, lease);
        }
        k
    }

    /// A `TxnResponse`; `ops` are (ResponseOp field, inner message).
    pub fn txn_response(revision: i64, succeeded: bool, ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut t = Vec::new();
        bytes_field(&mut t, 1, &header(revision));
        if succeeded {
            int_field(&mut t, 2, 1);
        }
        for (f, m) in ops {
            let mut op = Vec::new();
            bytes_field(&mut op, *f, m);
            bytes_field(&mut t, 3, &op);
        }
        t
    }

    pub fn range_response(revision: i64, kvs: &[Vec<u8>], count: i64) -> Vec<u8> {
        let mut r = Vec::new();
        bytes_field(&mut r, 1, &header(revision));
        for k in kvs {
            bytes_field(&mut r, 2, k);
        }
        if count != 0 {
            int_field(&mut r, 4, count);
        }
        r
    }

    pub fn put_response(revision: i64) -> Vec<u8> {
        let mut r = Vec::new();
        bytes_field(&mut r, 1, &header(revision));
        r
    }

    pub fn lease_response(revision: i64, id: i64, ttl: i64) -> Vec<u8> {
        let mut r = Vec::new();
        bytes_field(&mut r, 1, &header(revision));
        int_field(&mut r, 2, id);
        int_field(&mut r, 3, ttl);
        r
    }

    /// The fields of a message as (number, value), panicking on malformed input.
    pub fn all(bytes: &[u8]) -> Vec<(u64, Value<'_>)> {
        fields(bytes).map(|f| f.unwrap()).collect()
    }

    pub fn bytes_of<'a>(fs: &[(u64, Value<'a>)], n: u64) -> Vec<&'a [u8]> {
        fs.iter()
            .filter_map(|(m, v)| match v {
                Value::Bytes(b) if *m == n => Some(*b),
                _ => None,
            })
            .collect()
    }

    pub fn int_of(fs: &[(u64, Value<'_>)], n: u64) -> Option<i64> {
        fs.iter().find_map(|(m, v)| match v {
            Value::Varint(x) if *m == n => Some(*x as i64),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn a_claim_txn_reads_back_as_etcds_message() {
        let t = claim_txn("p/k", b"v", 77);
        let fs = all(&t);
        let cmp = all(bytes_of(&fs, 1)[0]);
        assert_eq!(int_of(&cmp, 2), Some(1)); // CREATE
        assert_eq!(bytes_of(&cmp, 3), vec![b"p/k".as_slice()]);
        assert_eq!(int_of(&cmp, 5), Some(0)); // set, though zero
        let success = all(bytes_of(&fs, 2)[0]);
        let put = all(bytes_of(&success, 2)[0]);
        assert_eq!(bytes_of(&put, 2), vec![b"v".as_slice()]);
        assert_eq!(int_of(&put, 3), Some(77));
        let failure = all(bytes_of(&fs, 3)[0]);
        assert_eq!(
            bytes_of(&all(bytes_of(&failure, 1)[0]), 1),
            vec![b"p/k".as_slice()]
        );
        // A negative revision (the admin read: a compare that never holds) is a
        // ten-byte varint that reads back as itself.
        let d = delete_txn("k", -1);
        let cmp = all(bytes_of(&all(&d), 1)[0]);
        assert_eq!(int_of(&cmp, 6), Some(-1));
    }

    #[test]
    fn answers_decode() {
        let kv = kv(b"k", 3, 9, b"val", 5);
        let range = range_response(9, std::slice::from_ref(&kv), 1);
        let t = super::testing::txn_response(12, false, &[(1, range)]);
        assert_eq!(
            super::txn_response(&t),
            Some((false, 12, Some((9, b"val".to_vec()))))
        );
        let ok = super::testing::txn_response(13, true, &[(2, put_response(13))]);
        assert_eq!(super::txn_response(&ok), Some((true, 13, None)));
        assert_eq!(
            lease_grant_response(&lease_response(1, 42, 10)),
            Some(Ok(42))
        );
        assert_eq!(range_count(&range_response(1, &[], 0)), Some(0));
        assert_eq!(range_count(&range_response(1, &[], 7)), Some(7));
        assert_eq!(
            status(&status_body(5, b"lease not found")),
            Some((5, "lease not found".into()))
        );
        assert_eq!(split_method(TXN), Some(("etcdserverpb.KV", "Txn")));
        // Truncated or empty: not an answer.
        assert_eq!(super::txn_response(&t[..t.len() - 1]), None);
        assert_eq!(super::txn_response(&[]), None);
        assert_eq!(status(&[]), None);
    }
}
