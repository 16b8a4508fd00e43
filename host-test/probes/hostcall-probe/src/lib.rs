//! A proxy-wasm probe that makes one kind of host call `n` times per request and
//! nothing else, for bench-envoy's per-call cost table: a case's cost over the same
//! probe with `n = 0` (the same requests, the same hooks), divided by `n`, is what one
//! such call costs in that Envoy. The plugin configuration names the call and `n`:
//! `get_header_map_value 20`. Calls on request headers are made there, on the request
//! body at its end (the whole body, read by `get_buffer_bytes`), on response headers
//! there; the others (shared data, properties, metrics, time, log level) at request
//! headers. Values are consumed (their length summed), so nothing is optimised away.
//!
//! It speaks the ABI (0.2.1) itself, like the dedup filter's glue: every value the
//! host returns is allocated through `proxy_on_memory_allocate` and freed here.
//!
//! Two more configurations mimic the dedup filter's own requests with no logic in
//! between: `mimic_first_execution` makes a first execution's host calls (the
//! `FILTER_CALLS` host-test counts for it, in the same hooks, on values of the same
//! sizes: a 1.4 KB bucket of one of 6,250 keys read and written back, the registry read,
//! the response slot and the bucket written at the response's end) and pauses the
//! request at its headers as the filter does; `mimic_replay` makes a replay's (the
//! bucket and the response slot read, the stored answer sent as a local reply). What the
//! dedup filter costs over its mimic is its own Wasm; what the mimic costs over the empty
//! filter is the calls and the pause, whatever code makes them.

#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;

#[path = "../../common/abi.rs"]
mod abi;
#[path = "../../common/exports.rs"]
mod exports;

type Ptr = *const u8;
type Out = *mut *mut u8;

#[rustfmt::skip]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_pairs(map: u32, vp: Out, vl: *mut usize) -> u32;
    fn proxy_get_buffer_bytes(kind: u32, start: usize, len: usize, vp: Out, vl: *mut usize) -> u32;
    fn proxy_get_shared_data(kp: Ptr, kl: usize, vp: Out, vl: *mut usize, cas: *mut u32) -> u32;
    fn proxy_set_shared_data(kp: Ptr, kl: usize, vp: Ptr, vl: usize, cas: u32) -> u32;
    fn proxy_set_property(pp: Ptr, pl: usize, vp: Ptr, vl: usize) -> u32;
    fn proxy_define_metric(kind: u32, np: Ptr, nl: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
}

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const BUF_REQUEST_BODY: u32 = 0;
const BUF_PLUGIN_CONFIG: u32 = 7;
const SHARED_KEY: &str = "hostcall-probe/record";
const ABSENT_KEY: &str = "hostcall-probe/absent";

/// The calls the probe can make; each names the hook it runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    None,
    HeaderValue,
    HeaderValueAbsent,
    RequestPairs,
    ResponsePairs,
    Property,
    SharedData,
    SharedDataAbsent,
    SetSharedData,
    RequestBody,
    SetProperty,
    ReplaceHeader,
    IncrementMetric,
    Time,
    LogLevel,
    MimicFirst,
    MimicReplay,
}

/// Every call, by the name the configuration gives it.
const CALLS: &[(&str, Call)] = &[
    ("none", Call::None),
    ("get_header_map_value", Call::HeaderValue),
    ("get_header_map_value_absent", Call::HeaderValueAbsent),
    ("get_header_map_pairs", Call::RequestPairs),
    ("get_header_map_pairs_response", Call::ResponsePairs),
    ("get_property", Call::Property),
    ("get_shared_data", Call::SharedData),
    ("get_shared_data_absent", Call::SharedDataAbsent),
    ("set_shared_data", Call::SetSharedData),
    ("get_buffer_bytes", Call::RequestBody),
    ("set_property", Call::SetProperty),
    ("replace_header_map_value", Call::ReplaceHeader),
    ("increment_metric", Call::IncrementMetric),
    ("get_current_time_nanoseconds", Call::Time),
    ("get_log_level", Call::LogLevel),
    ("mimic_first_execution", Call::MimicFirst),
    ("mimic_replay", Call::MimicReplay),
];

/// The mimics' bucket keys (one per 16 records of the default 100,000), their size, and
/// the size of a stored response (the demo service's small JSON answer with its headers).
const MIMIC_BUCKETS: u32 = 6_250;
const MIMIC_BUCKET_BYTES: usize = 1_400;
const MIMIC_SLOT_BYTES: usize = 220;
const MIMIC_REGISTRY: &str = "hostcall-probe/registry";
const MIMIC_SLOT: &str = "hostcall-probe/slot";

thread_local! {
    static CALL: Cell<Call> = const { Cell::new(Call::None) };
    static N: Cell<u32> = const { Cell::new(0) };
    static METRIC: Cell<u32> = const { Cell::new(0) };
    /// Bytes the calls returned, summed so no call is dead code.
    static SEEN: Cell<usize> = const { Cell::new(0) };
    /// The mimics' request count: which bucket key the next request uses.
    static REQUEST: Cell<u32> = const { Cell::new(0) };
}

fn mimic() -> Option<Call> {
    Some(CALL.with(Cell::get)).filter(|c| matches!(c, Call::MimicFirst | Call::MimicReplay))
}

/// The bucket key of this request (a name as long as the filter's).
fn bucket_key() -> String {
    format!(
        "hostcall-probe/b/{:08x}",
        REQUEST.with(Cell::get) % MIMIC_BUCKETS
    )
}

/// Reads a key and writes `len` bytes back on its cas.
fn read_and_write(key: &str, len: usize) {
    let (mut p, mut l, mut cas) = (std::ptr::null_mut(), 0, 0);
    // SAFETY: pointer and length of a live string; out-pointers valid.
    let s = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut p, &mut l, &mut cas) };
    took(s, p, l);
    set_shared(key, len, cas);
}

fn set_shared(key: &str, len: usize, cas: u32) {
    let value = vec![5u8; len];
    // SAFETY: pointers and lengths of live buffers.
    let s =
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) };
    seen(s as usize);
}

fn set_state(name: &str, value: &str) {
    // SAFETY: pointers and lengths of live strings.
    let s = unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    seen(s as usize);
}

fn count() {
    // SAFETY: no pointers.
    seen(unsafe { proxy_increment_metric(METRIC.with(Cell::get), 1) } as usize);
}

fn now() {
    let mut t = 0;
    // SAFETY: out-pointer valid.
    unsafe { proxy_get_current_time_nanoseconds(&mut t) };
    seen(t as usize & 1);
}

fn request_body(size: u32) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: out-pointers valid for the call.
    let s = unsafe { proxy_get_buffer_bytes(BUF_REQUEST_BODY, 0, size as usize, &mut p, &mut l) };
    took(s, p, l);
}

/// The request is whole: the mimic's claim (first execution) or replay.
fn mimic_decide(call: Call, body_size: u32) -> u32 {
    request_body(body_size);
    now();
    count();
    if call == Call::MimicFirst {
        read_and_write(&bucket_key(), MIMIC_BUCKET_BYTES);
        get_shared(MIMIC_REGISTRY);
        set_state("proxy_dedup_decision", "executed");
        set_state("proxy_dedup_record", "0123456789ab");
        count();
        return 0;
    }
    get_shared(&bucket_key());
    get_shared(MIMIC_SLOT);
    let headers = [
        ("content-type".to_string(), "application/json".to_string()),
        ("idempotent-replayed".to_string(), "true".to_string()),
        (
            "idempotency-expires".to_string(),
            "Tue, 08 Dec 2026 07:00:00 GMT".to_string(),
        ),
    ];
    let body = [b'r'; 60];
    let map = abi::encode_pairs(&headers);
    seen(abi::local_response(200, "proxy_dedup_replay", &body, &map, -1) as usize);
    set_state("proxy_dedup_decision", "replayed");
    set_state("proxy_dedup_record", "0123456789ab");
    count();
    1
}

fn seen(len: usize) {
    SEEN.with(|s| s.set(s.get().wrapping_add(len)));
}

/// A value the host handed back (freed at once).
fn took(status: u32, p: *mut u8, l: usize) {
    if status == 0 {
        seen(abi::take(p, l).map_or(0, |v| v.len()));
    }
}

fn repeat(call: Call, f: impl Fn()) {
    if CALL.with(Cell::get) == call {
        for _ in 0..N.with(Cell::get) {
            f();
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_ctx: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_ctx: u32, _size: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_ctx: u32, size: u32) -> u32 {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: out-pointers valid for the call.
    let s = unsafe { proxy_get_buffer_bytes(BUF_PLUGIN_CONFIG, 0, size as usize, &mut p, &mut l) };
    let text = if s == 0 {
        abi::take(p, l).unwrap_or_default()
    } else {
        Vec::new()
    };
    let text = String::from_utf8_lossy(&text);
    let mut words = text.split_whitespace();
    let name = words.next().unwrap_or("none");
    let Some(call) = CALLS.iter().find(|(n, _)| *n == name).map(|c| c.1) else {
        return 0;
    };
    let Some(n) = words.next().map_or(Some(0), |w| w.parse().ok()) else {
        return 0;
    };
    CALL.with(|c| c.set(call));
    N.with(|c| c.set(n));
    if call == Call::MimicReplay {
        // What a replay reads: its bucket and its response slot.
        for b in 0..MIMIC_BUCKETS {
            REQUEST.with(|r| r.set(b));
            set_shared(&bucket_key(), MIMIC_BUCKET_BYTES, 0);
        }
        set_shared(MIMIC_SLOT, MIMIC_SLOT_BYTES, 0);
    }
    if call == Call::MimicFirst {
        set_shared(MIMIC_REGISTRY, 17, 0);
    }
    // A record of a typical bucket's size to read back.
    let value = [7u8; 96];
    // SAFETY: pointers and lengths of live buffers.
    unsafe {
        proxy_set_shared_data(
            SHARED_KEY.as_ptr(),
            SHARED_KEY.len(),
            value.as_ptr(),
            value.len(),
            0,
        )
    };
    let name = "hostcall_probe_calls";
    let mut id = 0;
    // SAFETY: pointer and length of a live string; out-pointer valid. Kind 0: counter.
    unsafe { proxy_define_metric(0, name.as_ptr(), name.len(), &mut id) };
    METRIC.with(|m| m.set(id));
    1
}

fn get_shared(key: &str) {
    let (mut p, mut l, mut cas) = (std::ptr::null_mut(), 0, 0);
    // SAFETY: pointer and length of a live string; out-pointers valid.
    let s = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut p, &mut l, &mut cas) };
    took(s, p, l);
}

fn pairs(map: u32) {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    // SAFETY: out-pointers valid for the call.
    let s = unsafe { proxy_get_header_map_pairs(map, &mut p, &mut l) };
    took(s, p, l);
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_ctx: u32, _n: u32, eos: u32) -> u32 {
    if mimic().is_some() {
        REQUEST.with(|r| r.set(r.get().wrapping_add(1)));
        pairs(MAP_REQUEST_HEADERS);
        let mut level = 0;
        // SAFETY: out-pointer valid.
        unsafe { proxy_get_log_level(&mut level) };
        seen(level as usize);
        // The filter pauses the request until its body is whole.
        return u32::from(eos == 0);
    }
    repeat(Call::HeaderValue, || {
        seen(
            abi::header(MAP_REQUEST_HEADERS, ":path")
                .1
                .map_or(0, |v| v.len()),
        )
    });
    repeat(Call::HeaderValueAbsent, || {
        seen(
            abi::header(MAP_REQUEST_HEADERS, "x-absent")
                .1
                .map_or(0, |v| v.len()),
        )
    });
    repeat(Call::RequestPairs, || pairs(MAP_REQUEST_HEADERS));
    repeat(Call::Property, || {
        seen(abi::property("request\0path").1.map_or(0, |v| v.len()))
    });
    repeat(Call::SharedData, || get_shared(SHARED_KEY));
    repeat(Call::SharedDataAbsent, || get_shared(ABSENT_KEY));
    repeat(Call::SetSharedData, || {
        let value = [9u8; 96];
        // SAFETY: pointers and lengths of live buffers.
        let s = unsafe {
            proxy_set_shared_data(
                SHARED_KEY.as_ptr(),
                SHARED_KEY.len(),
                value.as_ptr(),
                value.len(),
                0,
            )
        };
        seen(s as usize);
    });
    repeat(Call::SetProperty, || {
        let (path, value) = ("probe_state", "executed");
        // SAFETY: pointers and lengths of live strings.
        let s =
            unsafe { proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len()) };
        seen(s as usize);
    });
    repeat(Call::IncrementMetric, || {
        // SAFETY: no pointers.
        let s = unsafe { proxy_increment_metric(METRIC.with(Cell::get), 1) };
        seen(s as usize);
    });
    repeat(Call::Time, || {
        let mut t = 0;
        // SAFETY: out-pointer valid.
        unsafe { proxy_get_current_time_nanoseconds(&mut t) };
        seen(t as usize & 1);
    });
    repeat(Call::LogLevel, || {
        let mut level = 0;
        // SAFETY: out-pointer valid.
        unsafe { proxy_get_log_level(&mut level) };
        seen(level as usize);
    });
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_ctx: u32, size: u32, eos: u32) -> u32 {
    if let Some(call) = mimic() {
        // StopIterationAndBuffer until the end, as the filter.
        return if eos != 0 {
            mimic_decide(call, size)
        } else {
            1
        };
    }
    if eos != 0 {
        repeat(Call::RequestBody, || {
            let (mut p, mut l) = (std::ptr::null_mut(), 0);
            // SAFETY: out-pointers valid for the call.
            let s = unsafe {
                proxy_get_buffer_bytes(BUF_REQUEST_BODY, 0, size as usize, &mut p, &mut l)
            };
            took(s, p, l);
        });
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_ctx: u32, _n: u32, _eos: u32) -> u32 {
    if mimic() == Some(Call::MimicFirst) {
        pairs(MAP_RESPONSE_HEADERS);
        seen(
            abi::property("response\0code_details")
                .1
                .map_or(0, |v| v.len()),
        );
        return 0;
    }
    repeat(Call::ResponsePairs, || pairs(MAP_RESPONSE_HEADERS));
    repeat(Call::ReplaceHeader, || {
        seen(abi::replace(MAP_RESPONSE_HEADERS, "x-probe", "1") as usize)
    });
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_ctx: u32, size: u32, eos: u32) -> u32 {
    if mimic() == Some(Call::MimicFirst) {
        let (mut p, mut l) = (std::ptr::null_mut(), 0);
        // SAFETY: out-pointers valid for the call.
        let s = unsafe { proxy_get_buffer_bytes(1, 0, size as usize, &mut p, &mut l) };
        took(s, p, l);
        if eos != 0 {
            // The completion: the bucket read, the slot written, the bucket written.
            now();
            let key = bucket_key();
            let (mut p, mut l, mut cas) = (std::ptr::null_mut(), 0, 0);
            // SAFETY: pointer and length of a live string; out-pointers valid.
            let s =
                unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut p, &mut l, &mut cas) };
            took(s, p, l);
            set_shared(MIMIC_SLOT, MIMIC_SLOT_BYTES, 0);
            set_shared(&key, MIMIC_BUCKET_BYTES, cas);
        }
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_ctx: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_ctx: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_delete(_ctx: u32) {}
