//! The host calls the probe uses, declared by hand from the proxy-wasm ABI
//! 0.2.1, each wrapped to return the host's raw status.

#![allow(clippy::too_many_arguments)]

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, ptr: *const u8, len: usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        kp: *const u8,
        kl: usize,
        vp: *mut *mut u8,
        vl: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, vp: *mut *mut u8, vl: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        kp: *const u8,
        kl: usize,
        vp: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        kp: *const u8,
        kl: usize,
        vp: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, kp: *const u8, kl: usize) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        len: usize,
        vp: *mut *mut u8,
        vl: *mut usize,
    ) -> u32;
    fn proxy_get_property(pp: *const u8, pl: usize, vp: *mut *mut u8, vl: *mut usize) -> u32;
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
    fn proxy_http_call(
        up: *const u8,
        ul: usize,
        hp: *const u8,
        hl: usize,
        bp: *const u8,
        bl: usize,
        tp: *const u8,
        tl: usize,
        timeout: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_call(
        sp: *const u8,
        sl: usize,
        np: *const u8,
        nl: usize,
        mp: *const u8,
        ml: usize,
        ip: *const u8,
        il: usize,
        rp: *const u8,
        rl: usize,
        timeout: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_stream(
        sp: *const u8,
        sl: usize,
        np: *const u8,
        nl: usize,
        mp: *const u8,
        ml: usize,
        ip: *const u8,
        il: usize,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_send(token: u32, mp: *const u8, ml: usize, end_stream: u32) -> u32;
    fn proxy_grpc_close(token: u32) -> u32;
    fn proxy_grpc_cancel(token: u32) -> u32;
    fn proxy_get_status(code: *mut u32, mp: *mut *mut u8, ml: *mut usize) -> u32;
    fn proxy_set_effective_context(ctx: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(ms: u32) -> u32;
}

pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
pub const MAP_GRPC_INITIAL: u32 = 4;
pub const MAP_GRPC_TRAILING: u32 = 5;
pub const MAP_CALL_HEADERS: u32 = 6;
pub const BUF_GRPC_RECEIVE: u32 = 5;
pub const BUF_CALL_BODY: u32 = 4;
pub const BUF_PLUGIN_CONFIG: u32 = 7;

/// Takes a buffer the host allocated with `proxy_on_memory_allocate`.
fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the host wrote `len` bytes at `ptr`, which our
    // `proxy_on_memory_allocate` allocated as a Vec of exactly `len` bytes.
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

pub fn log(message: &str) {
    // SAFETY: pointer and length of a live string.
    unsafe { proxy_log(2, message.as_ptr(), message.len()) };
}

pub fn header(map: u32, name: &str) -> (u32, Option<String>) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut p, &mut l) };
    if s != 0 {
        return (s, None);
    }
    (s, Some(String::from_utf8_lossy(&take(p, l)).into_owned()))
}

pub fn pairs(map: u32) -> (u32, Vec<(String, String)>) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_header_map_pairs(map, &mut p, &mut l) };
    (s, decode_pairs(&take(p, l)))
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

pub fn remove(map: u32, name: &str) -> u32 {
    // SAFETY: pointer and length of a live string.
    unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) }
}

pub fn buffer(kind: u32, len: usize) -> (u32, Vec<u8>) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_buffer_bytes(kind, 0, len, &mut p, &mut l) };
    (s, take(p, l))
}

/// A property by its path segments (joined with NUL, as the ABI wants).
pub fn property(segments: &[&str]) -> (u32, Vec<u8>) {
    let path = segments.join("\0");
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut p, &mut l) };
    (s, take(p, l))
}

pub fn local_response(
    status: u32,
    details: &str,
    body: &[u8],
    headers: &[(String, String)],
    grpc_status: i32,
) -> u32 {
    let h = encode_pairs(headers);
    // SAFETY: pointers and lengths of live buffers.
    unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            h.as_ptr(),
            h.len(),
            grpc_status,
        )
    }
}

pub fn http_call(
    cluster: &str,
    headers: &[(String, String)],
    body: &[u8],
    timeout_ms: u32,
) -> (u32, u32) {
    let h = encode_pairs(headers);
    let t = encode_pairs(&[]);
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers.
    let s = unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            h.as_ptr(),
            h.len(),
            body.as_ptr(),
            body.len(),
            t.as_ptr(),
            t.len(),
            timeout_ms,
            &mut token,
        )
    };
    (s, token)
}

pub fn grpc_call(
    service: &[u8],
    service_name: &str,
    method: &str,
    metadata: &[(String, String)],
    message: &[u8],
    timeout_ms: u32,
) -> (u32, u32) {
    let m = encode_pairs(metadata);
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers.
    let s = unsafe {
        proxy_grpc_call(
            service.as_ptr(),
            service.len(),
            service_name.as_ptr(),
            service_name.len(),
            method.as_ptr(),
            method.len(),
            m.as_ptr(),
            m.len(),
            message.as_ptr(),
            message.len(),
            timeout_ms,
            &mut token,
        )
    };
    (s, token)
}

pub fn grpc_stream(
    service: &[u8],
    service_name: &str,
    method: &str,
    metadata: &[(String, String)],
) -> (u32, u32) {
    let m = encode_pairs(metadata);
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers.
    let s = unsafe {
        proxy_grpc_stream(
            service.as_ptr(),
            service.len(),
            service_name.as_ptr(),
            service_name.len(),
            method.as_ptr(),
            method.len(),
            m.as_ptr(),
            m.len(),
            &mut token,
        )
    };
    (s, token)
}

pub fn grpc_send(token: u32, message: &[u8], end_stream: bool) -> u32 {
    // SAFETY: pointer and length of a live buffer.
    unsafe { proxy_grpc_send(token, message.as_ptr(), message.len(), end_stream as u32) }
}

pub fn grpc_close(token: u32) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_grpc_close(token) }
}

pub fn grpc_cancel(token: u32) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_grpc_cancel(token) }
}

/// `proxy_get_status`: (host status, code, message).
pub fn status() -> (u32, u32, String) {
    let (mut code, mut p, mut l) = (0, std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_status(&mut code, &mut p, &mut l) };
    (s, code, String::from_utf8_lossy(&take(p, l)).into_owned())
}

pub fn set_effective_context(ctx: u32) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_set_effective_context(ctx) }
}

pub fn set_tick_period(ms: u32) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_set_tick_period_milliseconds(ms) }
}

pub fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

pub fn decode_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut out = Vec::new();
    let Some(count) = word(0) else { return out };
    let mut at = 4 + count * 8;
    for i in 0..count {
        let (Some(kl), Some(vl)) = (word(4 + i * 8), word(8 + i * 8)) else {
            return out;
        };
        let (Some(k), Some(v)) = (
            bytes.get(at..at + kl),
            bytes.get(at + kl + 1..at + kl + 1 + vl),
        ) else {
            return out;
        };
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
        at += kl + vl + 2;
    }
    out
}
