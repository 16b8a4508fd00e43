//! Raw proxy-wasm ABI calls that return the host's status code instead of
//! panicking like the SDK wrappers do on unexpected statuses.

#![allow(clashing_extern_declarations)]

use proxy_wasm::types::{MapType, MetricType};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_get_metric(metric_id: u32, return_value: *mut u64) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_register_shared_queue(
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_resolve_shared_queue(
        vm_id_data: *const u8,
        vm_id_size: usize,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

/// Takes ownership of a buffer the host allocated with
/// `proxy_on_memory_allocate` (which is the Rust allocator).
fn take(ptr: *mut u8, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the host filled `len` bytes at `ptr`, allocated by the SDK's
    // `proxy_on_memory_allocate` as a boxed slice of exactly `len` bytes.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

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
    if status == 0 {
        Ok(id)
    } else {
        Err(status)
    }
}

pub fn resolve_queue(vm_id: &str, name: &str) -> (u32, u32) {
    let mut id = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe {
        proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    };
    (status, id)
}

pub fn enqueue(id: u32, value: &[u8]) -> u32 {
    // SAFETY: the pointer is valid for the call.
    unsafe { proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()) }
}

pub fn dequeue(id: u32) -> (u32, Option<Vec<u8>>) {
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe { proxy_dequeue_shared_queue(id, &mut data, &mut size) };
    if status != 0 {
        return (status, None);
    }
    (status, Some(take(data, size).unwrap_or_default()))
}

pub fn get_header(map: MapType, name: &str) -> (u32, Option<String>) {
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe {
        proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    if status != 0 {
        return (status, None);
    }
    let value = take(data, size).unwrap_or_default();
    (status, Some(String::from_utf8_lossy(&value).into_owned()))
}

pub fn replace_header(map: MapType, name: &str, value: &str) -> u32 {
    // SAFETY: all pointers are valid for the call.
    unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    }
}

pub fn add_header(map: MapType, name: &str, value: &str) -> u32 {
    // SAFETY: all pointers are valid for the call.
    unsafe {
        proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    }
}

/// A property by its dotted path (segments joined by NUL, as the SDK does):
/// the host's status and the raw value bytes.
pub fn get_property(path: &str) -> (u32, Option<Vec<u8>>) {
    let joined = path.replace('.', "\0");
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: all pointers are valid for the call.
    let status = unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    if status != 0 {
        return (status, None);
    }
    (status, Some(take(data, size).unwrap_or_default()))
}

/// `proxy_send_local_response` with a status-code details string (the SDK's
/// `send_http_response` always passes none). No headers.
pub fn send_local_response(status: u32, details: &str, body: &[u8]) -> u32 {
    // An empty pairs map: count 0.
    let headers = 0u32.to_le_bytes();
    // SAFETY: all pointers are valid for the call.
    unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    }
}

/// Decodes the proxy-wasm pairs format (count, lengths, NUL-terminated
/// strings), as used by header maps and map-valued properties.
pub fn deserialize_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut out = Vec::new();
    let Some(count) = word(0) else { return out };
    let mut data = 4 + count * 8;
    for i in 0..count {
        let (Some(kl), Some(vl)) = (word(4 + i * 8), word(8 + i * 8)) else {
            return out;
        };
        let (Some(k), Some(v)) = (
            bytes.get(data..data + kl),
            bytes.get(data + kl + 1..data + kl + 1 + vl),
        ) else {
            return out;
        };
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
        data += kl + vl + 2;
    }
    out
}
