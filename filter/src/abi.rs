//! Host calls the filter makes, declared here and mapped to `Result`s, and the allocator
//! the host uses to hand us buffers.
//!
//! A panic traps the VM (every later request on that worker gets 503), so these wrappers
//! never panic: every status becomes a value. Return types are `u32`, not an enum, so an
//! unexpected status from a host is a number, not undefined behaviour.

#![allow(clashing_extern_declarations)]

use dedup_core::response::status_of;
use dedup_core::shared_data::{HostFault, SetError, SharedData};
use dedup_core::stream::CallAnswer;
use dedup_core::wire::{decode_pairs, encode_pairs};
use std::time::Duration;

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;

pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
pub const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
pub const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
pub const BUFFER_GRPC_RECEIVE: u32 = 5;
pub const STREAM_HTTP_REQUEST: u32 = 0;
pub const STREAM_HTTP_RESPONSE: u32 = 1;
pub const BUFFER_REQUEST_BODY: u32 = 0;
pub const BUFFER_RESPONSE_BODY: u32 = 1;
pub const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

pub const LOG_DEBUG: u32 = 1;
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;
pub const LOG_CRITICAL: u32 = 5;

const METRIC_COUNTER: u32 = 0;
const METRIC_HISTOGRAM: u32 = 2;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
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
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_milliseconds: u32,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_grpc_call(
        service_data: *const u8,
        service_size: usize,
        service_name_data: *const u8,
        service_name_size: usize,
        method_name_data: *const u8,
        method_name_size: usize,
        initial_metadata_data: *const u8,
        initial_metadata_size: usize,
        request_data: *const u8,
        request_size: usize,
        timeout_milliseconds: u32,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_get_status(
        return_code: *mut u32,
        return_message_data: *mut *mut u8,
        return_message_size: *mut usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_register_shared_queue(
        name_data: *const u8,
        name_size: usize,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(token: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(
        token: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

/// The allocator the host calls to place buffers it returns to us (header maps, bodies,
/// shared-data values): a `Box<[u8]>` of exactly `size` bytes, leaked to the host.
/// `take_host_buffer` takes it back. On wasm32-unknown-unknown hosts look for `malloc`.
#[cfg_attr(
    all(target_arch = "wasm32", target_os = "unknown"),
    export_name = "malloc"
)]
#[cfg_attr(not(all(target_arch = "wasm32", target_os = "unknown")), no_mangle)]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    // Uninitialised: the host overwrites all `size` bytes before handing them back.
    Box::into_raw(Box::<[u8]>::new_uninit_slice(size)).cast::<u8>()
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`
/// (a boxed slice of exactly `size` bytes).
fn take_host_buffer(ptr: *mut u8, size: usize) -> Vec<u8> {
    if ptr.is_null() || size == 0 {
        return Vec::new();
    }
    // SAFETY: the host wrote `size` bytes into memory it got from our allocator, which
    // hands out `Box<[u8]>` of exactly that length; we take that box back.
    unsafe { Vec::from_raw_parts(ptr, size, size) }
}

pub fn log(level: u32, message: &str) {
    // SAFETY: pointer and length of a live str.
    unsafe {
        proxy_log(level, message.as_ptr(), message.len());
    }
}

thread_local! {
    /// The log level read since the last stream started (see [`log_level`]).
    static LOG_LEVEL: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Envoy's log level for this plugin (Info when the host cannot say), read from the host
/// at most once per request: Envoy answers with its logger's live level (changed at
/// runtime through the admin `/logging` endpoint, with no callback to the module), so
/// the cached value is forgotten each time a stream starts ([`forget_log_level`]) and a
/// change applies from the next request on.
pub fn log_level() -> u32 {
    if let Ok(Some(level)) = LOG_LEVEL.try_with(std::cell::Cell::get) {
        return level;
    }
    let mut level = LOG_INFO;
    // SAFETY: valid out-pointer.
    let status = unsafe { proxy_get_log_level(&mut level) };
    let level = if status == OK { level } else { LOG_INFO };
    let _ = LOG_LEVEL.try_with(|l| l.set(Some(level)));
    level
}

/// A stream starts: the next [`log_level`] asks the host again.
pub fn forget_log_level() {
    let _ = LOG_LEVEL.try_with(|l| l.set(None));
}

/// Nanoseconds since the Unix epoch by the host's clock (0 if it cannot say): the
/// phase-timed build's clock (`dedup_core::phases`).
pub fn now_ns() -> u64 {
    let mut ns = 0u64;
    // SAFETY: valid out-pointer.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut ns) };
    if status == OK {
        ns
    } else {
        0
    }
}

/// Milliseconds since the Unix epoch by the host's clock (0 if it cannot say).
pub fn now_ms() -> u64 {
    let mut ns = 0u64;
    // SAFETY: valid out-pointer.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut ns) };
    if status == OK {
        ns / 1_000_000
    } else {
        0
    }
}

/// `max_size` bytes of a buffer from `start`; empty if the buffer is absent.
pub fn buffer(buffer_type: u32, start: usize, max_size: usize) -> Result<Vec<u8>, u32> {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers; the result buffer is taken back below.
    let status =
        unsafe { proxy_get_buffer_bytes(buffer_type, start, max_size, &mut ptr, &mut size) };
    match status {
        OK => Ok(take_host_buffer(ptr, size)),
        NOT_FOUND => Ok(Vec::new()),
        other => Err(other),
    }
}

/// All pairs of a header map, repeated names included, values as bytes.
pub fn header_pairs(map_type: u32) -> Result<Vec<(String, Vec<u8>)>, u32> {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers; the result buffer is taken back below.
    let status = unsafe { proxy_get_header_map_pairs(map_type, &mut ptr, &mut size) };
    if status != OK {
        return Err(status);
    }
    decode_pairs(&take_host_buffer(ptr, size)).ok_or(u32::MAX)
}

pub fn send_local_response(
    status: u16,
    details: &str,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
) -> Result<(), u32> {
    let map = encode_pairs(headers);
    // SAFETY: pointers and lengths of live buffers.
    let status = unsafe {
        proxy_send_local_response(
            u32::from(status),
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    };
    checked(status)
}

/// Resumes a stream paused while the store answered: the request
/// (`STREAM_HTTP_REQUEST`) or a response held while the store settled its record
/// (`STREAM_HTTP_RESPONSE`).
pub fn resume(stream: u32) -> Result<(), u32> {
    // SAFETY: no pointers.
    checked(unsafe { proxy_continue_stream(stream) })
}

/// Sends an HTTP call to `cluster` (`headers` must hold `:method`, `:path` and
/// `:authority`) and returns its token, which the caller records as owned by the running
/// context (`context::dispatched`), so the answer finds its way back even after that
/// stream has ended. `Err` carries the host's status (BadArgument for an unknown cluster
/// or missing pseudo-headers): then no call exists.
pub fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    trailers: &[(&str, &str)],
    timeout: Duration,
) -> Result<u32, u32> {
    let pairs = |list: &[(&str, &str)]| {
        let owned: Vec<(String, Vec<u8>)> = list
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
            .collect();
        encode_pairs(&owned)
    };
    http_call_encoded(cluster, &pairs(headers), body, &pairs(trailers), timeout)
}

/// `dispatch_http_call` with headers as the host delivered them (bytes, any case), e.g.
/// a request's own header map for a detached execution.
pub fn dispatch_http_call_pairs(
    cluster: &str,
    headers: &[(String, Vec<u8>)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<u32, u32> {
    http_call_encoded(
        cluster,
        &encode_pairs(headers),
        body,
        &encode_pairs(&[]),
        timeout,
    )
}

fn http_call_encoded(
    cluster: &str,
    headers: &[u8],
    body: Option<&[u8]>,
    trailers: &[u8],
    timeout: Duration,
) -> Result<u32, u32> {
    let (body_ptr, body_len) = body.map_or((std::ptr::null(), 0), |b| (b.as_ptr(), b.len()));
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let mut token = 0u32;
    // SAFETY: pointers and lengths of live buffers; valid out-pointer.
    let status = unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body_ptr,
            body_len,
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    };
    registered(status, token)
}

/// Sends a unary gRPC call (`service`/`method`, `message` already serialized) to the
/// HTTP/2 `cluster` (its name, or a serialized `GrpcService`) and returns its token, to
/// be recorded like `dispatch_http_call`'s. `Err` carries the host's status
/// (ParseFailure for an unknown cluster): then no call exists.
pub fn dispatch_grpc_call(
    cluster: &[u8],
    service: &str,
    method: &str,
    message: &[u8],
    timeout: Duration,
) -> Result<u32, u32> {
    let metadata = encode_pairs(&[]);
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let mut token = 0u32;
    // SAFETY: pointers and lengths of live buffers; valid out-pointer.
    let status = unsafe {
        proxy_grpc_call(
            cluster.as_ptr(),
            cluster.len(),
            service.as_ptr(),
            service.len(),
            method.as_ptr(),
            method.len(),
            metadata.as_ptr(),
            metadata.len(),
            message.as_ptr(),
            message.len(),
            timeout_ms,
            &mut token,
        )
    };
    registered(status, token)
}

/// The status of the gRPC call being closed (`proxy_on_grpc_close`): code and message.
pub fn grpc_status() -> Option<(u32, Vec<u8>)> {
    let mut code = 0u32;
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers; the message buffer is taken back below.
    let status = unsafe { proxy_get_status(&mut code, &mut ptr, &mut size) };
    let message = take_host_buffer(ptr, size);
    (status == OK).then_some((code, message))
}

/// A property (e.g. `["response", "code_details"]`); `None` when the host has none.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    property_at(&path.join("\0"))
}

/// A property by its path already encoded (segments joined by NUL), e.g.
/// `"response\0code_details"`: nothing is built per call.
pub fn property_at(encoded: &str) -> Option<Vec<u8>> {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: pointer and length of a live string; valid out-pointers; the result buffer
    // is taken back below.
    let status =
        unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut ptr, &mut size) };
    let bytes = take_host_buffer(ptr, size);
    (status == OK).then_some(bytes)
}

/// `N` random bytes from WASI `random_get` (the host's secure random source).
pub fn random_bytes<const N: usize>() -> Result<[u8; N], u16> {
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    extern "C" {
        fn random_get(buf: *mut u8, len: usize) -> u16;
    }
    let mut out = [0u8; N];
    // SAFETY: a live buffer of exactly N bytes.
    let errno = unsafe { random_get(out.as_mut_ptr(), N) };
    if errno == 0 {
        Ok(out)
    } else {
        Err(errno)
    }
}

/// Makes `context_id` the context later host calls act on (the host answers callouts on
/// the root context; a stream's local reply or resume needs the stream's).
pub fn set_effective_context(context_id: u32) -> Result<(), u32> {
    // SAFETY: no pointers.
    let status = unsafe { proxy_set_effective_context(context_id) };
    checked(status)
}

/// Ticks of this VM's root context every `period_ms` (0: no ticks).
pub fn set_tick_period(period_ms: u32) -> Result<(), u32> {
    // SAFETY: no pointers.
    let status = unsafe { proxy_set_tick_period_milliseconds(period_ms) };
    checked(status)
}

/// Registers a shared queue named `name` for this VM (the last VM to register a name
/// gets its notifications, so names must be unique per VM). Returns its token, which any
/// VM of the process may enqueue to.
pub fn register_shared_queue(name: &str) -> Result<u32, u32> {
    let mut token = 0u32;
    // SAFETY: pointer and length of a live str; valid out-pointer.
    let status = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut token) };
    if status == OK {
        Ok(token)
    } else {
        Err(status)
    }
}

pub fn enqueue_shared_queue(token: u32, value: &[u8]) -> Result<(), u32> {
    // SAFETY: pointer and length of a live buffer.
    let status = unsafe { proxy_enqueue_shared_queue(token, value.as_ptr(), value.len()) };
    checked(status)
}

/// The next item of a queue this VM registered; `Ok(None)` when it is empty.
pub fn dequeue_shared_queue(token: u32) -> Result<Option<Vec<u8>>, u32> {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers.
    let status = unsafe { proxy_dequeue_shared_queue(token, &mut ptr, &mut size) };
    match status {
        OK => Ok(Some(take_host_buffer(ptr, size))),
        // Empty (7) or not found (1): nothing to take.
        1 | 7 => Ok(None),
        other => Err(other),
    }
}

pub fn define_counter(name: &str) -> Result<u32, u32> {
    define_metric(METRIC_COUNTER, name)
}

pub fn define_histogram(name: &str) -> Result<u32, u32> {
    define_metric(METRIC_HISTOGRAM, name)
}

fn define_metric(kind: u32, name: &str) -> Result<u32, u32> {
    let mut id = 0u32;
    // SAFETY: pointer and length of a live str; valid out-pointer.
    let status = unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) };
    if status == OK {
        Ok(id)
    } else {
        Err(status)
    }
}

/// Records a value in a histogram.
pub fn record(id: u32, value: u64) {
    // SAFETY: no pointers.
    unsafe {
        proxy_record_metric(id, value);
    }
}

/// Sets a property of the current stream; Envoy keeps it in the stream's filter state
/// as `wasm.<name>` (`%FILTER_STATE(wasm.<name>:PLAIN)%` in access logs).
pub fn set_property(name: &str, value: &[u8]) -> Result<(), u32> {
    // SAFETY: pointers and lengths of live buffers.
    let status =
        unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    checked(status)
}

pub fn increment(id: u32) {
    add(id, 1);
}

/// Adds `n` to counter `id` (Envoy refuses an offset at or below 0).
pub fn add(id: u32, n: u64) {
    let offset = i64::try_from(n).unwrap_or(i64::MAX);
    if offset <= 0 {
        return;
    }
    // SAFETY: no pointers.
    unsafe {
        proxy_increment_metric(id, offset);
    }
}

/// Envoy's shared data through the raw host calls.
pub struct HostSharedData;

impl SharedData for HostSharedData {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        let mut ptr: *mut u8 = std::ptr::null_mut();
        let mut size = 0usize;
        let mut cas = 0u32;
        // SAFETY: pointer and length of a live str; valid out-pointers.
        let status = unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), &mut ptr, &mut size, &mut cas)
        };
        match status {
            OK => Ok(Some((take_host_buffer(ptr, size), cas))),
            NOT_FOUND => Ok(None),
            other => Err(HostFault(format!(
                "proxy_get_shared_data returned status {other}"
            ))),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        // SAFETY: pointers and lengths of live buffers.
        let status = unsafe {
            proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
        };
        match status {
            OK => Ok(()),
            CAS_MISMATCH => Err(SetError::CasMismatch),
            other => Err(SetError::Fault(HostFault(format!(
                "proxy_set_shared_data returned status {other}"
            )))),
        }
    }
}

/// A host call's status as a result: `OK`, or the status.
fn checked(status: u32) -> Result<(), u32> {
    if status == OK {
        Ok(())
    } else {
        Err(status)
    }
}

/// A dispatched call's token; the host's status if it refused the call.
fn registered(status: u32, token: u32) -> Result<u32, u32> {
    checked(status)?;
    Ok(token)
}

/// The answer to a store call, read while `on_http_call_response` runs. Envoy reports a
/// failed call (reset, no healthy member) as a response with no headers; a timeout as
/// :status 504.
pub fn read_call_answer(num_headers: usize, body_size: usize) -> CallAnswer {
    // The pairs are read anyway for `:status`; a detached call's answer needs them all.
    let headers = if num_headers == 0 {
        Vec::new()
    } else {
        header_pairs(MAP_HTTP_CALL_RESPONSE_HEADERS).unwrap_or_default()
    };
    let status = status_of(&headers);
    let body = buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, 0, body_size).unwrap_or_default();
    CallAnswer {
        status,
        body,
        headers,
    }
}
