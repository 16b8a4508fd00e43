//! Raw proxy-wasm ABI calls that return the host's status code instead of
//! panicking like the SDK wrappers do on unexpected statuses.

#![allow(clashing_extern_declarations)]

use proxy_wasm::types::{MapType, MetricType};

// Parameters as in abi-probe: `kp`/`kl` a key's pointer and length, `vp`/`vl`
// a value's (out-pointers where the host returns one).
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_shared_data(
        kp: *const u8,
        kl: usize,
        vp: *mut *mut u8,
        vl: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(kp: *const u8, kl: usize, vp: *const u8, vl: usize, cas: u32) -> u32;
    fn proxy_define_metric(kind: u32, np: *const u8, nl: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_metric(id: u32, value: *mut u64) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_register_shared_queue(np: *const u8, nl: usize, id: *mut u32) -> u32;
    fn proxy_resolve_shared_queue(
        vmp: *const u8,
        vml: usize,
        np: *const u8,
        nl: usize,
        id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(id: u32, vp: *const u8, vl: usize) -> u32;
    fn proxy_dequeue_shared_queue(id: u32, vp: *mut *mut u8, vl: *mut usize) -> u32;
}

use crate::abi::{returned, take};

pub fn get_shared_data(key: &str) -> (u32, Option<Vec<u8>>, u32) {
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    let mut cas = 0;
    // SAFETY: all pointers are valid for the call.
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    if status != 0 {
        return (status, None, 0);
    }
    (status, take(data, size), cas)
}

pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: all pointers are valid for the call.
    unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
}

pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, u32> {
    let mut id = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
    id_or(status, id)
}

/// The id a define or register call returned, or the host's status.
fn id_or(status: u32, id: u32) -> Result<u32, u32> {
    if status == 0 {
        Ok(id)
    } else {
        Err(status)
    }
}

pub fn increment_metric(id: u32, offset: i64) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_increment_metric(id, offset) }
}

pub fn record_metric(id: u32, value: u64) -> u32 {
    // SAFETY: plain values.
    unsafe { proxy_record_metric(id, value) }
}

pub fn get_metric(id: u32) -> (u32, u64) {
    let mut value = 0;
    // SAFETY: the pointer is valid for the call.
    let status = unsafe { proxy_get_metric(id, &mut value) };
    (status, value)
}

pub fn current_time_ns() -> u64 {
    let mut t = 0;
    // SAFETY: the pointer is valid for the call.
    unsafe { proxy_get_current_time_nanoseconds(&mut t) };
    t
}

pub fn register_queue(name: &str) -> Result<u32, u32> {
    let mut id = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    id_or(status, id)
}

pub fn resolve_queue(vm_id: &str, name: &str) -> (u32, u32) {
    let mut id = 0;
    // SAFETY: all pointers are valid for the call.
    let (vp, vl, np, nl) = (vm_id.as_ptr(), vm_id.len(), name.as_ptr(), name.len());
    let status = unsafe { proxy_resolve_shared_queue(vp, vl, np, nl, &mut id) };
    (status, id)
}

pub fn enqueue(id: u32, value: &[u8]) -> u32 {
    // SAFETY: the pointer is valid for the call.
    unsafe { proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()) }
}

pub fn dequeue(id: u32) -> (u32, Option<Vec<u8>>) {
    // SAFETY: out-pointers valid for the call.
    returned(|p, l| unsafe { proxy_dequeue_shared_queue(id, p, l) })
}

pub fn get_header(map: MapType, name: &str) -> (u32, Option<String>) {
    crate::abi::header(map as u32, name)
}

pub fn replace_header(map: MapType, name: &str, value: &str) -> u32 {
    crate::abi::replace(map as u32, name, value)
}

pub fn add_header(map: MapType, name: &str, value: &str) -> u32 {
    crate::abi::add(map as u32, name, value)
}

/// A property by its dotted path (segments joined by NUL, as the SDK does):
/// the host's status and the raw value bytes.
pub fn get_property(path: &str) -> (u32, Option<Vec<u8>>) {
    crate::abi::property(&path.replace('.', "\0"))
}

/// `proxy_send_local_response` with a status-code details string (the SDK's
/// `send_http_response` always passes none). No headers.
pub fn send_local_response(status: u32, details: &str, body: &[u8]) -> u32 {
    // An empty pairs map: count 0.
    crate::abi::local_response(status, details, body, &0u32.to_le_bytes(), -1)
}

/// Decodes the proxy-wasm pairs format (count, lengths, NUL-terminated
/// strings), as used by header maps and map-valued properties.
pub use crate::abi::decode_pairs as deserialize_pairs;
