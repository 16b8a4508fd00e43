//! The host calls the probe uses, declared by hand from the proxy-wasm ABI
//! 0.2.1, each wrapped to return the host's raw status.

#![allow(clippy::too_many_arguments)]

use crate::abi::{Out, Ptr};

// One import a line, as the ABI lists them (`Ptr`: bytes passed in; `Out`:
// where the host puts bytes it allocated).
#[rustfmt::skip]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, ptr: Ptr, len: usize) -> u32;
    fn proxy_get_header_map_pairs(map: u32, vp: Out, vl: *mut usize) -> u32;
    fn proxy_remove_header_map_value(map: u32, kp: Ptr, kl: usize) -> u32;
    fn proxy_get_buffer_bytes(kind: u32, start: usize, len: usize, vp: Out, vl: *mut usize) -> u32;
    fn proxy_http_call(up: Ptr, ul: usize, hp: Ptr, hl: usize, bp: Ptr, bl: usize, tp: Ptr, tl: usize, timeout: u32, token: *mut u32) -> u32;
    fn proxy_grpc_call(sp: Ptr, sl: usize, np: Ptr, nl: usize, mp: Ptr, ml: usize, ip: Ptr, il: usize, rp: Ptr, rl: usize, timeout: u32, token: *mut u32) -> u32;
    fn proxy_grpc_stream(sp: Ptr, sl: usize, np: Ptr, nl: usize, mp: Ptr, ml: usize, ip: Ptr, il: usize, token: *mut u32) -> u32;
    fn proxy_grpc_send(token: u32, mp: Ptr, ml: usize, end_stream: u32) -> u32;
    fn proxy_grpc_close(token: u32) -> u32;
    fn proxy_grpc_cancel(token: u32) -> u32;
    fn proxy_get_status(code: *mut u32, mp: Out, ml: *mut usize) -> u32;
    fn proxy_set_effective_context(ctx: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(ms: u32) -> u32;
}

pub use crate::abi::{add, decode_pairs, encode_pairs, header, replace};

/// A buffer the host allocated, empty for none.
fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    crate::abi::take(ptr, len).unwrap_or_default()
}

pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
pub const MAP_GRPC_INITIAL: u32 = 4;
pub const MAP_GRPC_TRAILING: u32 = 5;
pub const MAP_CALL_HEADERS: u32 = 6;
pub const BUF_GRPC_RECEIVE: u32 = 5;
pub const BUF_CALL_BODY: u32 = 4;
pub const BUF_PLUGIN_CONFIG: u32 = 7;

pub fn log(message: &str) {
    // SAFETY: pointer and length of a live string.
    unsafe { proxy_log(2, message.as_ptr(), message.len()) };
}

pub fn pairs(map: u32) -> (u32, Vec<(String, String)>) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: all pointers are valid for the call.
    let s = unsafe { proxy_get_header_map_pairs(map, &mut p, &mut l) };
    (s, decode_pairs(&take(p, l)))
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
    let (s, value) = crate::abi::property(&segments.join("\0"));
    (s, value.unwrap_or_default())
}

pub fn local_response(
    status: u32,
    details: &str,
    body: &[u8],
    headers: &[(String, String)],
    grpc_status: i32,
) -> u32 {
    crate::abi::local_response(status, details, body, &encode_pairs(headers), grpc_status)
}

pub fn http_call(
    cluster: &str,
    headers: &[(String, String)],
    body: &[u8],
    timeout_ms: u32,
) -> (u32, u32) {
    let (h, t) = (encode_pairs(headers), encode_pairs(&[]));
    let (up, ul, hp, hl) = (cluster.as_ptr(), cluster.len(), h.as_ptr(), h.len());
    let (bp, bl, tp, tl) = (body.as_ptr(), body.len(), t.as_ptr(), t.len());
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers.
    let s = unsafe { proxy_http_call(up, ul, hp, hl, bp, bl, tp, tl, timeout_ms, &mut token) };
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
    grpc_open(
        service,
        service_name,
        method,
        metadata,
        Some((message, timeout_ms)),
    )
}

pub fn grpc_stream(
    service: &[u8],
    service_name: &str,
    method: &str,
    metadata: &[(String, String)],
) -> (u32, u32) {
    grpc_open(service, service_name, method, metadata, None)
}

/// `proxy_grpc_call` (with a message and a timeout) or `proxy_grpc_stream`:
/// (host status, token).
fn grpc_open(
    service: &[u8],
    name: &str,
    method: &str,
    metadata: &[(String, String)],
    call: Option<(&[u8], u32)>,
) -> (u32, u32) {
    let m = encode_pairs(metadata);
    let (sp, sl, np, nl) = (service.as_ptr(), service.len(), name.as_ptr(), name.len());
    let (mp, ml, ip, il) = (method.as_ptr(), method.len(), m.as_ptr(), m.len());
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers.
    let s = unsafe {
        match call {
            Some((message, timeout)) => {
                let (rp, rl) = (message.as_ptr(), message.len());
                proxy_grpc_call(sp, sl, np, nl, mp, ml, ip, il, rp, rl, timeout, &mut token)
            }
            None => proxy_grpc_stream(sp, sl, np, nl, mp, ml, ip, il, &mut token),
        }
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
