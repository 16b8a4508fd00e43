//! What both hand-written probes (abi-probe, shared-data-probe) need from
//! the proxy-wasm ABI 0.2.1, written once: the host calls they share, each
//! returning the host's raw status, and the pairs format. Each probe
//! includes this file as a module (`#[path]`), so neither depends on the
//! other and abi-probe keeps no dependencies.

#![allow(dead_code)]

/// A pointer to bytes the probe passes in, and an out-pointer the host
/// sets to bytes it allocated.
pub type Ptr = *const u8;
pub type Out = *mut *mut u8;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_value(map: u32, kp: Ptr, kl: usize, vp: Out, vl: *mut usize) -> u32;
    fn proxy_replace_header_map_value(map: u32, kp: Ptr, kl: usize, vp: Ptr, vl: usize) -> u32;
    fn proxy_add_header_map_value(map: u32, kp: Ptr, kl: usize, vp: Ptr, vl: usize) -> u32;
    fn proxy_get_property(pp: Ptr, pl: usize, vp: Out, vl: *mut usize) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        dp: *const u8,
        dl: usize,
        bp: *const u8,
        bl: usize,
        hp: *const u8,
        hl: usize,
        grpc_status: i32,
    ) -> u32;
}

/// Takes ownership of a buffer the host allocated with
/// `proxy_on_memory_allocate` (the Rust allocator); `None` for a null
/// pointer (the host had no bytes to give).
pub fn take(ptr: *mut u8, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() {
        return None;
    }
    if len == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the host filled `len` bytes at `ptr`, which the probe's
    // `proxy_on_memory_allocate` allocated as exactly `len` bytes.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// A call that hands back a host-allocated buffer: the status `call`
/// returns, and the bytes when it returns Ok (0).
pub fn returned(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> (u32, Option<Vec<u8>>) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    let status = call(&mut p, &mut l);
    if status != 0 {
        return (status, None);
    }
    (status, Some(take(p, l).unwrap_or_default()))
}

pub fn header(map: u32, name: &str) -> (u32, Option<String>) {
    // SAFETY: pointer and length of a live string; out-pointers valid.
    let (s, v) = returned(|p, l| unsafe {
        proxy_get_header_map_value(map, name.as_ptr(), name.len(), p, l)
    });
    (s, v.map(|v| String::from_utf8_lossy(&v).into_owned()))
}

pub fn replace(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointers and lengths of live strings.
    unsafe {
        proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    }
}

pub fn add(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointers and lengths of live strings.
    unsafe {
        proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    }
}

/// A property by its path, the segments joined with NUL as the ABI wants.
pub fn property(path: &str) -> (u32, Option<Vec<u8>>) {
    // SAFETY: pointer and length of a live string; out-pointers valid.
    returned(|p, l| unsafe { proxy_get_property(path.as_ptr(), path.len(), p, l) })
}

/// `proxy_send_local_response` with status-code details and headers
/// already in the pairs format.
pub fn local_response(
    status: u32,
    details: &str,
    body: &[u8],
    headers: &[u8],
    grpc_status: i32,
) -> u32 {
    // SAFETY: pointers and lengths of live buffers.
    unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            grpc_status,
        )
    }
}

/// The pairs format: u32 count, a (key length, value length) u32 pair per
/// entry, then each key and value followed by NUL. Little endian.
pub fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let lens = pairs.iter().flat_map(|(k, v)| [k.len(), v.len()]);
    let mut out: Vec<u8> = std::iter::once(pairs.len())
        .chain(lens)
        .flat_map(|n| (n as u32).to_le_bytes())
        .collect();
    for text in pairs.iter().flat_map(|(k, v)| [k, v]) {
        out.extend_from_slice(text.as_bytes());
        out.push(0);
    }
    out
}

/// Decodes the pairs format; stops at the first entry that does not fit.
pub fn decode_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let text = |at: usize, len: usize| -> Option<String> {
        Some(String::from_utf8_lossy(bytes.get(at..at + len)?).into_owned())
    };
    let count = word(0).unwrap_or(0);
    let mut at = 4 + count * 8;
    let mut out = Vec::new();
    for i in 0..count {
        let Some((kl, vl)) = word(4 + i * 8).zip(word(8 + i * 8)) else {
            break;
        };
        let Some(pair) = text(at, kl).zip(text(at + kl + 1, vl)) else {
            break;
        };
        out.push(pair);
        at += kl + vl + 2;
    }
    out
}
