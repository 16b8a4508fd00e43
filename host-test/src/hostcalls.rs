//! The host side of proxy-wasm ABI 0.2.1 and the WASI preview1 imports a
//! wasm32-wasip1 Rust module needs, with Envoy's semantics (statuses, map
//! availability, buffer rules, shared-data CAS) as in Envoy and cpp-host.

use crate::abi::*;
use crate::http::{header_get, Headers, UpstreamRequest};
use crate::shared::lock;
use crate::vm::{status, Deferred, GrpcOp, NewCallout, VmState};
use std::collections::HashSet;
use wasmtime::{Caller, FuncType, Linker, Val, ValType};

type C<'a> = Caller<'a, VmState>;
type R = wasmtime::Result<i32>;

const OK: i32 = Status::Ok as i32;
const NOT_FOUND: i32 = Status::NotFound as i32;
const BAD_ARGUMENT: i32 = Status::BadArgument as i32;
const INVALID_MEMORY: i32 = Status::InvalidMemoryAccess as i32;

// ---- guest memory -------------------------------------------------------

fn read(c: &mut C, ptr: i32, len: i32) -> Option<Vec<u8>> {
    if let Some(h) = c.data_mut().host_calls.as_mut() {
        h.bytes_in += len as u32 as u64;
    }
    let mem = c.data().memory?;
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    mem.data(&*c).get(start..end).map(<[u8]>::to_vec)
}

fn read_str(c: &mut C, ptr: i32, len: i32) -> Option<String> {
    read(c, ptr, len).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn write(c: &mut C, ptr: i32, bytes: &[u8]) -> bool {
    let Some(mem) = c.data().memory else {
        return false;
    };
    let start = ptr as u32 as usize;
    let Some(end) = start.checked_add(bytes.len()) else {
        return false;
    };
    match mem.data_mut(&mut *c).get_mut(start..end) {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            true
        }
        None => false,
    }
}

fn write_u32(c: &mut C, ptr: i32, v: u32) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

fn write_u64(c: &mut C, ptr: i32, v: u64) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

/// cpp-host `copyToPointerSize`: allocates in the guest (proxy_on_memory_allocate)
/// and writes pointer and size; empty data is a null pointer and size 0.
fn copy_out(c: &mut C, data: &[u8], ptr_ptr: i32, size_ptr: i32) -> R {
    if data.is_empty() {
        if !write_u32(c, ptr_ptr, 0) || !write_u32(c, size_ptr, 0) {
            return Ok(INVALID_MEMORY);
        }
        return Ok(OK);
    }
    let Some(alloc) = c.data().alloc.clone() else {
        return Ok(INVALID_MEMORY);
    };
    if let Some(h) = c.data_mut().host_calls.as_mut() {
        h.bytes_out += data.len() as u64;
    }
    let addr = alloc.call(&mut *c, data.len() as i32)?;
    if addr == 0 || !write(c, addr, data) {
        return Ok(INVALID_MEMORY);
    }
    if !write_u32(c, ptr_ptr, addr as u32) || !write_u32(c, size_ptr, data.len() as u32) {
        return Ok(INVALID_MEMORY);
    }
    Ok(OK)
}

// ---- header maps --------------------------------------------------------

enum MapView<'a> {
    Available(&'a Headers),
    /// Envoy has no such map now (null pointer): get -> BadArgument.
    Unavailable,
    /// Access-log phase: a missing map reads as NotFound.
    LogPhaseMissing,
}

fn const_map(s: &VmState, map: i32) -> MapView<'_> {
    match map {
        MAP_CALL_HEADERS => match &s.callout_response {
            Some(r) => MapView::Available(&r.headers),
            None => MapView::Unavailable,
        },
        MAP_CALL_TRAILERS => match &s.callout_response {
            Some(r) => MapView::Available(&r.trailers),
            None => MapView::Unavailable,
        },
        MAP_GRPC_INITIAL => match &s.grpc.initial {
            Some(h) => MapView::Available(h),
            None => MapView::Unavailable,
        },
        MAP_GRPC_TRAILING => match &s.grpc.trailing {
            Some(h) => MapView::Available(h),
            None => MapView::Unavailable,
        },
        _ => {
            let Some(st) = s.stream() else {
                return MapView::Unavailable;
            };
            let (dir, trailers) = match map {
                MAP_REQUEST_HEADERS => (&st.req, false),
                MAP_REQUEST_TRAILERS => (&st.req, true),
                MAP_RESPONSE_HEADERS => (&st.resp, false),
                _ => (&st.resp, true),
            };
            if st.log_phase {
                if map == MAP_REQUEST_TRAILERS {
                    return MapView::LogPhaseMissing;
                }
                let received = if trailers {
                    !dir.trailers.is_empty()
                } else {
                    dir.headers_received
                };
                return if received {
                    MapView::Available(if trailers {
                        &dir.trailers
                    } else {
                        &dir.headers
                    })
                } else {
                    MapView::LogPhaseMissing
                };
            }
            let live = if trailers {
                dir.trailers_live
            } else {
                dir.headers_live
            };
            if live {
                MapView::Available(if trailers {
                    &dir.trailers
                } else {
                    &dir.headers
                })
            } else {
                MapView::Unavailable
            }
        }
    }
}

/// Envoy's `getMap`: only the stream's live request/response maps are writable.
fn mut_map(s: &mut VmState, map: i32) -> Option<&mut Headers> {
    let st = s.stream_mut()?;
    if st.log_phase {
        return None;
    }
    let dir = match map {
        MAP_REQUEST_HEADERS | MAP_REQUEST_TRAILERS => &mut st.req,
        MAP_RESPONSE_HEADERS | MAP_RESPONSE_TRAILERS => &mut st.resp,
        _ => return None,
    };
    match map {
        MAP_REQUEST_HEADERS | MAP_RESPONSE_HEADERS if dir.headers_live => Some(&mut dir.headers),
        MAP_REQUEST_TRAILERS | MAP_RESPONSE_TRAILERS if dir.trailers_live => {
            Some(&mut dir.trailers)
        }
        _ => None,
    }
}

fn get_header_map_pairs(mut c: C, map: i32, ptr_ptr: i32, size_ptr: i32) -> R {
    if !(0..=MAP_CALL_TRAILERS).contains(&map) {
        return Ok(BAD_ARGUMENT);
    }
    let bytes = match const_map(c.data(), map) {
        MapView::Available(h) if !h.is_empty() => encode_pairs(h),
        _ => Vec::new(),
    };
    copy_out(&mut c, &bytes, ptr_ptr, size_ptr)
}

fn set_header_map_pairs(mut c: C, map: i32, ptr: i32, size: i32) -> R {
    if !(0..=MAP_CALL_TRAILERS).contains(&map) {
        return Ok(BAD_ARGUMENT);
    }
    let Some(data) = read(&mut c, ptr, size) else {
        return Ok(INVALID_MEMORY);
    };
    let pairs = decode_pairs(&data);
    let Some(h) = mut_map(c.data_mut(), map) else {
        return Ok(BAD_ARGUMENT);
    };
    h.clear();
    for (k, v) in pairs {
        add_header(h, k.to_ascii_lowercase(), v);
    }
    Ok(OK)
}

fn get_header_map_value(mut c: C, map: i32, kp: i32, kl: i32, vpp: i32, vsp: i32) -> R {
    if !(0..=MAP_CALL_TRAILERS).contains(&map) {
        return Ok(BAD_ARGUMENT);
    }
    let Some(key) = read_str(&mut c, kp, kl) else {
        return Ok(INVALID_MEMORY);
    };
    let value = match const_map(c.data(), map) {
        MapView::Available(h) => match header_get(h, &key.to_ascii_lowercase()) {
            Some(v) => v.as_bytes().to_vec(),
            None => return Ok(NOT_FOUND),
        },
        MapView::Unavailable => return Ok(BAD_ARGUMENT),
        MapView::LogPhaseMissing => return Ok(NOT_FOUND),
    };
    copy_out(&mut c, &value, vpp, vsp)
}

fn edit_header(mut c: C, map: i32, kp: i32, kl: i32, value: Option<(i32, i32)>, add: bool) -> R {
    if !(0..=MAP_CALL_TRAILERS).contains(&map) {
        return Ok(BAD_ARGUMENT);
    }
    let Some(key) = read_str(&mut c, kp, kl) else {
        return Ok(INVALID_MEMORY);
    };
    let value = match value {
        Some((vp, vl)) => match read_str(&mut c, vp, vl) {
            Some(v) => Some(v),
            None => return Ok(INVALID_MEMORY),
        },
        None => None,
    };
    let key = key.to_ascii_lowercase();
    let Some(h) = mut_map(c.data_mut(), map) else {
        return Ok(BAD_ARGUMENT);
    };
    match (value, add) {
        (Some(v), true) => add_header(h, key, v),
        (Some(v), false) => {
            // Envoy 1.40's setCopy: every entry of the name goes, one is
            // appended (seen with the ABI probe: a replaced header moves to
            // the end; a replaced pseudo header to the end of the pseudo
            // headers).
            h.retain(|(k, _)| *k != key);
            add_header(h, key, v);
        }
        (None, _) => h.retain(|(k, _)| *k != key),
    }
    Ok(OK)
}

/// Envoy's `addCopy`: a pseudo header goes after the last pseudo header
/// (Envoy keeps them in front), any other header at the end.
fn add_header(h: &mut Headers, key: String, value: String) {
    if key.starts_with(':') {
        let at = h.iter().take_while(|(k, _)| k.starts_with(':')).count();
        h.insert(at, (key, value));
    } else {
        h.push((key, value));
    }
}

fn get_header_map_size(mut c: C, map: i32, result_ptr: i32) -> R {
    let size = match mut_map(c.data_mut(), map) {
        Some(h) => h.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
        None => return Ok(BAD_ARGUMENT),
    };
    Ok(if write_u32(&mut c, result_ptr, size as u32) {
        OK
    } else {
        INVALID_MEMORY
    })
}

// ---- buffers ------------------------------------------------------------

enum BufView {
    Data(Vec<u8>),
    /// A buffer wrapper around a null instance: size 0, writes NotFound.
    Null,
    Missing,
}

fn buffer(s: &VmState, kind: i32) -> BufView {
    match kind {
        BUF_REQUEST_BODY | BUF_RESPONSE_BODY => match s.stream() {
            Some(st) => {
                let dir = if kind == BUF_REQUEST_BODY {
                    &st.req
                } else {
                    &st.resp
                };
                if dir.body_live {
                    BufView::Data(dir.body.clone())
                } else {
                    BufView::Null
                }
            }
            None => BufView::Null,
        },
        BUF_CALL_RESPONSE_BODY => match &s.callout_response {
            Some(r) => BufView::Data(r.body.clone()),
            None => BufView::Missing,
        },
        BUF_GRPC_RECEIVE => match &s.grpc.message {
            Some(m) => BufView::Data(m.clone()),
            None => BufView::Null,
        },
        BUF_VM_CONFIGURATION => BufView::Data(s.plugin.vm_config.clone()),
        BUF_PLUGIN_CONFIGURATION if s.in_configure => BufView::Data(s.plugin.plugin_config.clone()),
        _ => BufView::Missing,
    }
}

fn get_buffer_bytes(
    mut c: C,
    kind: i32,
    start: i32,
    length: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> R {
    if !(0..=BUF_MAX).contains(&kind) {
        return Ok(BAD_ARGUMENT);
    }
    let data = match buffer(c.data(), kind) {
        BufView::Data(d) => d,
        BufView::Null => Vec::new(),
        BufView::Missing => return Ok(NOT_FOUND),
    };
    let start = start as u32 as usize;
    let length = length as u32 as usize;
    if start.checked_add(length).is_none() {
        return Ok(BAD_ARGUMENT);
    }
    let slice = if start > data.len() {
        &[][..]
    } else {
        &data[start..(start + length).min(data.len())]
    };
    copy_out(&mut c, slice, ptr_ptr, size_ptr)
}

fn get_buffer_status(mut c: C, kind: i32, length_ptr: i32, flags_ptr: i32) -> R {
    if !(0..=BUF_MAX).contains(&kind) {
        return Ok(BAD_ARGUMENT);
    }
    let len = match buffer(c.data(), kind) {
        BufView::Data(d) => d.len(),
        BufView::Null => 0,
        BufView::Missing => return Ok(NOT_FOUND),
    };
    if !write_u32(&mut c, length_ptr, len as u32) || !write_u32(&mut c, flags_ptr, 0) {
        return Ok(INVALID_MEMORY);
    }
    Ok(OK)
}

/// Envoy `Buffer::copyFrom`: start 0 and length 0 prepends; start 0 and a
/// length covering the buffer replaces it; start at or past the end appends.
fn set_buffer_bytes(mut c: C, kind: i32, start: i32, length: i32, ptr: i32, size: i32) -> R {
    if !(0..=BUF_MAX).contains(&kind) {
        return Ok(BAD_ARGUMENT);
    }
    let Some(data) = read(&mut c, ptr, size) else {
        return Ok(INVALID_MEMORY);
    };
    let (start, length) = (start as u32 as usize, length as u32 as usize);
    let s = c.data_mut();
    if kind != BUF_REQUEST_BODY && kind != BUF_RESPONSE_BODY {
        return Ok(match buffer(s, kind) {
            BufView::Missing => NOT_FOUND,
            _ => BAD_ARGUMENT,
        });
    }
    let Some(st) = s.stream_mut() else {
        return Ok(NOT_FOUND);
    };
    let dir = if kind == BUF_REQUEST_BODY {
        &mut st.req
    } else {
        &mut st.resp
    };
    if !dir.body_live {
        return Ok(NOT_FOUND);
    }
    let body = &mut dir.body;
    if start == 0 {
        if length == 0 {
            let mut v = data;
            v.extend_from_slice(body);
            *body = v;
        } else if length >= body.len() {
            *body = data;
        } else {
            return Ok(BAD_ARGUMENT);
        }
    } else if start >= body.len() {
        body.extend_from_slice(&data);
    } else {
        return Ok(BAD_ARGUMENT);
    }
    Ok(OK)
}

// ---- properties -----------------------------------------------------------

fn property(s: &VmState, path: &[u8]) -> Result<Vec<u8>, Status> {
    let parts: Vec<String> = path
        .split(|b| *b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let st = s.stream();
    let str_val = |v: &str| Ok(v.as_bytes().to_vec());
    // Header-backed request attributes exist while Envoy holds the headers
    // (or in on_log); after Continue they are gone, as in Envoy's activation.
    let req_headers = st.and_then(|st| {
        (st.req.headers_live || (st.log_phase && st.req.headers_received))
            .then_some(&st.req.headers)
    });
    let resp_headers = st.and_then(|st| {
        (st.resp.headers_live || (st.log_phase && st.resp.headers_received))
            .then_some(&st.resp.headers)
    });
    match parts.as_slice() {
        ["plugin_name"] => str_val(&s.plugin.name),
        ["plugin_root_id"] => str_val(&s.plugin.root_id),
        ["plugin_vm_id"] => str_val(&s.plugin.vm_id),
        ["source", "address"] => st
            .map(|st| st.source_address.as_bytes().to_vec())
            .ok_or(Status::NotFound),
        ["source", "port"] => {
            let st = st.ok_or(Status::NotFound)?;
            let port: i64 = st
                .source_address
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            Ok(port.to_le_bytes().to_vec())
        }
        ["destination", "address"] => st
            .map(|_| b"127.0.0.1:10000".to_vec())
            .ok_or(Status::NotFound),
        ["request", "headers"] => Ok(map_property(req_headers.ok_or(Status::NotFound)?)),
        ["request", "headers", name] | ["response", "headers", name] => {
            let h = if parts[0] == "request" {
                req_headers
            } else {
                resp_headers
            };
            joined(h.ok_or(Status::NotFound)?, name).ok_or(Status::NotFound)
        }
        ["response", "headers"] => Ok(map_property(resp_headers.ok_or(Status::NotFound)?)),
        // Envoy's stream info, readable whether or not the header maps are.
        ["response", "code"] => {
            let code = st.and_then(|st| st.origin.code).ok_or(Status::NotFound)?;
            Ok(i64::from(code).to_le_bytes().to_vec())
        }
        ["response", "code_details"] => st
            .and_then(|st| st.origin.details.clone())
            .map(String::into_bytes)
            .ok_or(Status::NotFound),
        ["response", "flags"] => {
            let st = st.ok_or(Status::NotFound)?;
            Ok((st.origin.flags as i64).to_le_bytes().to_vec())
        }
        ["upstream", "address"] => st
            .and_then(|st| st.origin.upstream_address.clone())
            .map(String::into_bytes)
            .ok_or(Status::NotFound),
        ["xds", "route_name"] => st
            .and(s.plugin.route_name.clone())
            .map(String::into_bytes)
            .ok_or(Status::NotFound),
        ["xds", "cluster_name"] => st
            .and(s.plugin.cluster_name.clone())
            .map(String::into_bytes)
            .ok_or(Status::NotFound),
        ["xds", "route_metadata", rest @ ..] if !rest.is_empty() && st.is_some() => {
            crate::value::metadata_property(&s.plugin.route_metadata, rest)
        }
        ["metadata", rest @ ..] if !rest.is_empty() => {
            let st = st.ok_or(Status::NotFound)?;
            match crate::value::metadata_property(&st.metadata, rest) {
                Err(Status::NotFound) => {
                    let joined = parts.join("\0");
                    st.properties.get(&joined).cloned().ok_or(Status::NotFound)
                }
                other => other,
            }
        }
        ["request", attr] => {
            let h = req_headers.ok_or(Status::NotFound)?;
            let path = header_get(h, ":path").unwrap_or("");
            let value = match *attr {
                "path" => Some(path.to_string()),
                "url_path" => Some(path.split('?').next().unwrap_or("").to_string()),
                "query" => Some(path.split_once('?').map(|x| x.1).unwrap_or("").to_string()),
                "method" => header_get(h, ":method").map(str::to_string),
                "host" => header_get(h, ":authority").map(str::to_string),
                "scheme" => header_get(h, ":scheme").map(str::to_string),
                "id" => header_get(h, "x-request-id").map(str::to_string),
                "protocol" => Some("HTTP/1.1".to_string()),
                _ => None,
            };
            value.map(|v| v.into_bytes()).ok_or(Status::NotFound)
        }
        _ => {
            let joined = parts.join("\0");
            st.and_then(|st| st.properties.get(&joined).cloned())
                .ok_or(Status::NotFound)
        }
    }
}

/// Envoy's map-valued property: one pair per distinct header, repeated
/// values joined with ','.
fn map_property(h: &Headers) -> Vec<u8> {
    let mut keys: Vec<&str> = Vec::new();
    for (k, _) in h {
        if !keys.contains(&k.as_str()) {
            keys.push(k);
        }
    }
    let pairs: Vec<(String, Vec<u8>)> = keys
        .iter()
        .map(|k| (k.to_string(), joined(h, k).unwrap_or_default()))
        .collect();
    encode_pairs(&pairs)
}

fn joined(h: &Headers, name: &str) -> Option<Vec<u8>> {
    let name = name.to_ascii_lowercase();
    let values: Vec<&str> = h
        .iter()
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(",").into_bytes())
}

// ---- registration --------------------------------------------------------

/// Defines every import host-test provides; returns their names.
pub(crate) fn define(linker: &mut Linker<VmState>) -> wasmtime::Result<HashSet<(String, String)>> {
    let mut names = HashSet::new();
    define_proxy(linker, &mut names)?;
    define_wasi(linker, &mut names)?;
    Ok(names)
}

fn define_proxy(
    l: &mut Linker<VmState>,
    names: &mut HashSet<(String, String)>,
) -> wasmtime::Result<()> {
    let mut n = |name: &str| {
        names.insert(("env".to_string(), name.to_string()));
    };
    const ENV: &str = "env";

    n("proxy_log");
    l.func_wrap(
        ENV,
        "proxy_log",
        |mut c: C, level: i32, ptr: i32, len: i32| -> i32 {
            let Some(level) = LogLevel::from_raw(level) else {
                return BAD_ARGUMENT;
            };
            let Some(msg) = read_str(&mut c, ptr, len) else {
                return INVALID_MEMORY;
            };
            let worker = c.data().worker;
            lock(&c.data().shared).log(worker, level, msg);
            OK
        },
    )?;
    n("proxy_get_log_level");
    l.func_wrap(ENV, "proxy_get_log_level", |mut c: C, ptr: i32| -> i32 {
        let level = lock(&c.data().shared).log_level as u32;
        if write_u32(&mut c, ptr, level) {
            OK
        } else {
            INVALID_MEMORY
        }
    })?;
    n("proxy_get_current_time_nanoseconds");
    l.func_wrap(
        ENV,
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ptr: i32| -> i32 {
            let now = lock(&c.data().shared).now_ns;
            if write_u64(&mut c, ptr, now) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    n("proxy_set_tick_period_milliseconds");
    l.func_wrap(
        ENV,
        "proxy_set_tick_period_milliseconds",
        |mut c: C, period: i32| -> i32 {
            c.data_mut().tick_request = Some(period as u32);
            OK
        },
    )?;

    n("proxy_get_header_map_pairs");
    l.func_wrap(ENV, "proxy_get_header_map_pairs", get_header_map_pairs)?;
    n("proxy_set_header_map_pairs");
    l.func_wrap(ENV, "proxy_set_header_map_pairs", set_header_map_pairs)?;
    n("proxy_get_header_map_value");
    l.func_wrap(ENV, "proxy_get_header_map_value", get_header_map_value)?;
    n("proxy_replace_header_map_value");
    l.func_wrap(
        ENV,
        "proxy_replace_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            edit_header(c, map, kp, kl, Some((vp, vl)), false)
        },
    )?;
    n("proxy_add_header_map_value");
    l.func_wrap(
        ENV,
        "proxy_add_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            edit_header(c, map, kp, kl, Some((vp, vl)), true)
        },
    )?;
    n("proxy_remove_header_map_value");
    l.func_wrap(
        ENV,
        "proxy_remove_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32| edit_header(c, map, kp, kl, None, false),
    )?;
    n("proxy_get_header_map_size");
    l.func_wrap(ENV, "proxy_get_header_map_size", get_header_map_size)?;

    n("proxy_get_buffer_bytes");
    l.func_wrap(ENV, "proxy_get_buffer_bytes", get_buffer_bytes)?;
    n("proxy_get_buffer_status");
    l.func_wrap(ENV, "proxy_get_buffer_status", get_buffer_status)?;
    n("proxy_set_buffer_bytes");
    l.func_wrap(ENV, "proxy_set_buffer_bytes", set_buffer_bytes)?;

    n("proxy_get_property");
    l.func_wrap(
        ENV,
        "proxy_get_property",
        |mut c: C, pp: i32, pl: i32, vpp: i32, vsp: i32| -> R {
            let Some(path) = read(&mut c, pp, pl) else {
                return Ok(INVALID_MEMORY);
            };
            match property(c.data(), &path) {
                Ok(value) => copy_out(&mut c, &value, vpp, vsp),
                Err(s) => Ok(status(s)),
            }
        },
    )?;
    n("proxy_set_property");
    l.func_wrap(
        ENV,
        "proxy_set_property",
        |mut c: C, kp: i32, kl: i32, vp: i32, vl: i32| -> i32 {
            let (Some(key), Some(value)) = (read(&mut c, kp, kl), read(&mut c, vp, vl)) else {
                return INVALID_MEMORY;
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            match c.data_mut().stream_mut() {
                Some(st) => {
                    st.properties.insert(key, value);
                    OK
                }
                None => NOT_FOUND,
            }
        },
    )?;

    n("proxy_get_shared_data");
    l.func_wrap(
        ENV,
        "proxy_get_shared_data",
        |mut c: C, kp: i32, kl: i32, vpp: i32, vsp: i32, cas_ptr: i32| -> R {
            let Some(key) = read_str(&mut c, kp, kl) else {
                return Ok(INVALID_MEMORY);
            };
            let got = {
                let s = c.data();
                lock(&s.shared).get(&s.plugin.vm_id, &key)
            };
            match got {
                Err(s) => Ok(status(s)),
                Ok((value, cas)) => {
                    let r = copy_out(&mut c, &value, vpp, vsp)?;
                    if r != OK {
                        return Ok(r);
                    }
                    Ok(if write_u32(&mut c, cas_ptr, cas) {
                        OK
                    } else {
                        INVALID_MEMORY
                    })
                }
            }
        },
    )?;
    n("proxy_set_shared_data");
    l.func_wrap(
        ENV,
        "proxy_set_shared_data",
        |mut c: C, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> i32 {
            let (Some(key), Some(value)) = (read_str(&mut c, kp, kl), read(&mut c, vp, vl)) else {
                return INVALID_MEMORY;
            };
            let s = c.data();
            status(lock(&s.shared).set(&s.plugin.vm_id, &key, &value, cas as u32))
        },
    )?;

    n("proxy_register_shared_queue");
    l.func_wrap(
        ENV,
        "proxy_register_shared_queue",
        |mut c: C, np: i32, nl: i32, tp: i32| -> i32 {
            let Some(name) = read_str(&mut c, np, nl) else {
                return INVALID_MEMORY;
            };
            let token = {
                let s = c.data();
                let mut sh = lock(&s.shared);
                let key = (s.plugin.vm_id.clone(), name);
                let token = match sh.queue_tokens.get(&key) {
                    Some(t) => *t,
                    None => {
                        let t = sh.next_queue_token;
                        sh.next_queue_token += 1;
                        sh.queue_tokens.insert(key, t);
                        t
                    }
                };
                let queue = sh
                    .queues
                    .entry(token)
                    .or_insert_with(|| crate::shared::Queue {
                        items: Default::default(),
                        owner_worker: s.worker,
                        owner_context: s.root_id,
                    });
                queue.owner_worker = s.worker;
                queue.owner_context = s.root_id;
                token
            };
            if write_u32(&mut c, tp, token) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    n("proxy_resolve_shared_queue");
    l.func_wrap(
        ENV,
        "proxy_resolve_shared_queue",
        |mut c: C, vp: i32, vl: i32, np: i32, nl: i32, tp: i32| -> i32 {
            let (Some(vm_id), Some(name)) = (read_str(&mut c, vp, vl), read_str(&mut c, np, nl))
            else {
                return INVALID_MEMORY;
            };
            let token = {
                let s = c.data();
                let vm_id = if vm_id.is_empty() {
                    s.plugin.vm_id.clone()
                } else {
                    vm_id
                };
                lock(&s.shared).queue_tokens.get(&(vm_id, name)).copied()
            };
            match token {
                Some(t) => {
                    if write_u32(&mut c, tp, t) {
                        OK
                    } else {
                        INVALID_MEMORY
                    }
                }
                None => NOT_FOUND,
            }
        },
    )?;
    n("proxy_enqueue_shared_queue");
    l.func_wrap(
        ENV,
        "proxy_enqueue_shared_queue",
        |mut c: C, token: i32, vp: i32, vl: i32| -> i32 {
            let Some(value) = read(&mut c, vp, vl) else {
                return INVALID_MEMORY;
            };
            let s = c.data();
            let mut sh = lock(&s.shared);
            let token = token as u32;
            let Some(q) = sh.queues.get_mut(&token) else {
                return NOT_FOUND;
            };
            q.items.push_back(value);
            let owner = (q.owner_worker, q.owner_context, token);
            sh.queue_ready.push(owner);
            OK
        },
    )?;
    n("proxy_dequeue_shared_queue");
    l.func_wrap(
        ENV,
        "proxy_dequeue_shared_queue",
        |mut c: C, token: i32, vpp: i32, vsp: i32| -> R {
            let item = {
                let s = c.data();
                let mut sh = lock(&s.shared);
                match sh.queues.get_mut(&(token as u32)) {
                    None => return Ok(NOT_FOUND),
                    Some(q) => match q.items.pop_front() {
                        None => return Ok(Status::Empty as i32),
                        Some(v) => v,
                    },
                }
            };
            copy_out(&mut c, &item, vpp, vsp)
        },
    )?;

    n("proxy_continue_stream");
    l.func_wrap(ENV, "proxy_continue_stream", |mut c: C, kind: i32| -> i32 {
        continue_stream(c.data_mut(), kind)
    })?;
    n("proxy_continue_request");
    l.func_wrap(ENV, "proxy_continue_request", |mut c: C| -> i32 {
        continue_stream(c.data_mut(), STREAM_REQUEST)
    })?;
    n("proxy_continue_response");
    l.func_wrap(ENV, "proxy_continue_response", |mut c: C| -> i32 {
        continue_stream(c.data_mut(), STREAM_RESPONSE)
    })?;
    n("proxy_close_stream");
    l.func_wrap(ENV, "proxy_close_stream", |mut c: C, kind: i32| -> i32 {
        if !(0..=STREAM_MAX).contains(&kind) {
            return BAD_ARGUMENT;
        }
        let s = c.data_mut();
        let ctx = s.ctx();
        if (kind == STREAM_REQUEST || kind == STREAM_RESPONSE) && s.streams.contains_key(&ctx) {
            s.deferred.push(Deferred::Close { ctx });
        }
        OK
    })?;
    n("proxy_send_local_response");
    l.func_wrap(
        ENV,
        "proxy_send_local_response",
        |mut c: C,
         code: i32,
         dp: i32,
         dl: i32,
         bp: i32,
         bl: i32,
         hp: i32,
         hl: i32,
         grpc: i32|
         -> i32 {
            let (Some(body), Some(headers), Some(details)) = (
                read(&mut c, bp, bl),
                read(&mut c, hp, hl),
                read(&mut c, dp, dl),
            ) else {
                return INVALID_MEMORY;
            };
            let details = crate::origin::filter_details(&details);
            let headers = decode_pairs(&headers)
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect();
            let s = c.data_mut();
            let ctx = s.ctx();
            if s.streams.contains_key(&ctx) {
                s.deferred.push(Deferred::LocalReply {
                    ctx,
                    status: code as u16,
                    body,
                    headers,
                    details,
                    // Envoy takes 0..=16 as a gRPC status; anything else
                    // (the SDK passes -1) leaves it to the HTTP status.
                    grpc_status: (0..=16).contains(&grpc).then_some(grpc as u32),
                });
            }
            s.stop_next_iteration = true;
            OK
        },
    )?;
    n("proxy_clear_route_cache");
    l.func_wrap(ENV, "proxy_clear_route_cache", |_c: C| -> i32 { OK })?;

    n("proxy_http_call");
    l.func_wrap(
        ENV,
        "proxy_http_call",
        |mut c: C,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         tp: i32,
         tl: i32,
         timeout: i32,
         token_ptr: i32|
         -> i32 {
            let (Some(cluster), Some(headers), Some(body), Some(trailers)) = (
                read_str(&mut c, up, ul),
                read(&mut c, hp, hl),
                read(&mut c, bp, bl),
                read(&mut c, tp, tl),
            ) else {
                return INVALID_MEMORY;
            };
            if !write_u32(&mut c, token_ptr, 0) {
                return INVALID_MEMORY;
            }
            if timeout < 0 || !c.data().plugin.clusters.contains(&cluster) {
                return BAD_ARGUMENT;
            }
            let headers: Headers = decode_pairs(&headers)
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect();
            if [":path", ":method", ":authority"]
                .iter()
                .any(|h| header_get(&headers, h).is_none())
            {
                return BAD_ARGUMENT;
            }
            // What reaches the cluster (seen in Envoy 1.40): pseudo headers
            // first, the filter's headers, content-length, then what the
            // router adds for an internal request.
            let mut headers = pseudo_first(headers);
            if !body.is_empty() {
                headers.retain(|(k, _)| k != "content-length");
                headers.push(("content-length".into(), body.len().to_string()));
            }
            headers.push(("x-envoy-internal".into(), "true".into()));
            if timeout > 0 {
                headers.push(("x-envoy-expected-rq-timeout-ms".into(), timeout.to_string()));
            }
            let s = c.data_mut();
            // Envoy 1.40's tokens: a counter per kind, shifted left by two,
            // the kind in the low bits (HTTP 0, gRPC call 1, gRPC stream 2).
            let token = s.next_callout_token << 2;
            s.next_callout_token += 1;
            s.new_callouts.push(NewCallout {
                token,
                cluster,
                request: UpstreamRequest {
                    headers,
                    body,
                    trailers: decode_pairs(&trailers),
                },
                timeout_ms: timeout as u32,
            });
            if write_u32(&mut c, token_ptr, token) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;

    n("proxy_set_effective_context");
    l.func_wrap(
        ENV,
        "proxy_set_effective_context",
        |mut c: C, id: i32| -> i32 {
            let s = c.data_mut();
            let id = id as u32;
            if id == s.root_id || s.streams.contains_key(&id) {
                s.effective = Some(id);
                OK
            } else {
                BAD_ARGUMENT
            }
        },
    )?;
    n("proxy_done");
    l.func_wrap(ENV, "proxy_done", |_c: C| -> i32 { OK })?;

    n("proxy_define_metric");
    l.func_wrap(
        ENV,
        "proxy_define_metric",
        |mut c: C, kind: i32, np: i32, nl: i32, ip: i32| -> i32 {
            let kind = match kind {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return BAD_ARGUMENT,
            };
            let Some(name) = read_str(&mut c, np, nl) else {
                return INVALID_MEMORY;
            };
            let s = c.data_mut();
            let id = s.next_metric_id[kind as usize];
            s.next_metric_id[kind as usize] += 4;
            s.metric_names.insert(id, name.clone());
            lock(&s.shared)
                .metrics
                .entry(name)
                .or_insert_with(|| crate::shared::Metric {
                    kind,
                    value: 0,
                    samples: Vec::new(),
                });
            if write_u32(&mut c, ip, id) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    n("proxy_increment_metric");
    l.func_wrap(
        ENV,
        "proxy_increment_metric",
        |c: C, id: i32, offset: i64| -> i32 {
            let s = c.data();
            let id = id as u32;
            let kind = id & 3;
            if kind == MetricKind::Histogram as u32 || kind == 3 {
                return BAD_ARGUMENT;
            }
            let Some(name) = s.metric_names.get(&id) else {
                return NOT_FOUND;
            };
            let mut sh = lock(&s.shared);
            let Some(m) = sh.metrics.get_mut(name) else {
                return NOT_FOUND;
            };
            if kind == MetricKind::Counter as u32 {
                if offset <= 0 {
                    return BAD_ARGUMENT;
                }
                m.value = m.value.wrapping_add(offset as u64);
            } else if offset > 0 {
                m.value = m.value.wrapping_add(offset as u64);
            } else {
                m.value = m.value.saturating_sub(offset.unsigned_abs());
            }
            OK
        },
    )?;
    n("proxy_record_metric");
    l.func_wrap(
        ENV,
        "proxy_record_metric",
        |c: C, id: i32, value: i64| -> i32 {
            let s = c.data();
            let id = id as u32;
            let Some(name) = s.metric_names.get(&id) else {
                return NOT_FOUND;
            };
            let mut sh = lock(&s.shared);
            let Some(m) = sh.metrics.get_mut(name) else {
                return NOT_FOUND;
            };
            let value = value as u64;
            match id & 3 {
                0 => m.value = m.value.wrapping_add(value),
                1 => m.value = value,
                2 => m.samples.push(value),
                _ => return NOT_FOUND,
            }
            OK
        },
    )?;
    n("proxy_get_metric");
    l.func_wrap(
        ENV,
        "proxy_get_metric",
        |mut c: C, id: i32, ptr: i32| -> i32 {
            let id = id as u32;
            if id & 3 >= 2 {
                return BAD_ARGUMENT;
            }
            let value = {
                let s = c.data();
                let Some(name) = s.metric_names.get(&id) else {
                    return NOT_FOUND;
                };
                match lock(&s.shared).metrics.get(name) {
                    Some(m) => m.value,
                    None => return NOT_FOUND,
                }
            };
            if write_u64(&mut c, ptr, value) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;

    // Not modelled: foreign functions. They answer as a host without them.
    n("proxy_call_foreign_function");
    l.func_wrap(
        ENV,
        "proxy_call_foreign_function",
        |_c: C, _a: i32, _b: i32, _d: i32, _e: i32, _f: i32, _g: i32| -> i32 { NOT_FOUND },
    )?;
    define_grpc(l, &mut n)?;
    Ok(())
}

/// The cluster named by the `service` argument of a gRPC call: a serialized
/// `envoy.config.core.v3.GrpcService` whose `envoy_grpc.cluster_name` names
/// it, or (as the Rust SDK passes it) the cluster name itself.
/// `Err` when the bytes are no `GrpcService` and name no cluster (Envoy
/// 1.40 then answers ParseFailure).
fn grpc_cluster(service: &[u8], clusters: &HashSet<String>) -> Result<String, i32> {
    fn field(bytes: &[u8], number: u8) -> Option<&[u8]> {
        // Only what a GrpcService with envoy_grpc { cluster_name } holds:
        // a length-delimited field with a one-byte length.
        let (&tag, rest) = bytes.split_first()?;
        let (&len, rest) = rest.split_first()?;
        (tag == (number << 3 | 2) && len < 0x80 && rest.len() == len as usize).then_some(rest)
    }
    if let Some(name) = field(service, 1).and_then(|envoy_grpc| field(envoy_grpc, 1)) {
        return Ok(String::from_utf8_lossy(name).into_owned());
    }
    let name = String::from_utf8_lossy(service).into_owned();
    if clusters.contains(&name) {
        Ok(name)
    } else {
        Err(Status::ParseFailure as i32)
    }
}

/// Envoy 1.40's gRPC tokens (seen with the ABI probe): a counter per kind,
/// shifted left by two, the kind in the low bits (call 1, stream 2).
fn next_grpc_token(s: &mut VmState, stream: bool) -> u32 {
    let counter = if stream {
        &mut s.next_grpc_stream
    } else {
        &mut s.next_grpc_call
    };
    let id = *counter;
    *counter = counter.wrapping_add(1);
    (id << 2) | if stream { 2 } else { 1 }
}

fn is_grpc_call_token(token: u32) -> bool {
    token & 3 == 1
}

fn define_grpc(l: &mut Linker<VmState>, n: &mut impl FnMut(&str)) -> wasmtime::Result<()> {
    const ENV: &str = "env";
    n("proxy_grpc_call");
    l.func_wrap(
        ENV,
        "proxy_grpc_call",
        |mut c: C,
         sp: i32,
         sl: i32,
         np: i32,
         nl: i32,
         mp: i32,
         ml: i32,
         ip: i32,
         il: i32,
         rp: i32,
         rl: i32,
         timeout: i32,
         token_ptr: i32|
         -> i32 {
            let (Some(service), Some(name), Some(method), Some(meta), Some(message)) = (
                read(&mut c, sp, sl),
                read_str(&mut c, np, nl),
                read_str(&mut c, mp, ml),
                read(&mut c, ip, il),
                read(&mut c, rp, rl),
            ) else {
                return INVALID_MEMORY;
            };
            let cluster = match grpc_cluster(&service, &c.data().plugin.clusters) {
                Ok(name) => name,
                Err(status) => return status,
            };
            let s = c.data_mut();
            let token = next_grpc_token(s, false);
            if !s.plugin.clusters.contains(&cluster) {
                // A GrpcService naming an unknown cluster: Envoy's client
                // fails at once ("Cluster not available", delivered after
                // this call) and the call returns InternalFailure.
                s.grpc_tokens.insert(token, false);
                s.deferred.push(Deferred::GrpcRefused { token });
                return Status::InternalFailure as i32;
            }
            s.grpc_tokens.insert(token, false);
            s.grpc_ops.push(GrpcOp::Call {
                token,
                cluster,
                service: name,
                method,
                metadata: lower_pairs(&meta),
                message,
                timeout_ms: timeout as u32,
            });
            if write_u32(&mut c, token_ptr, token) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    n("proxy_grpc_stream");
    l.func_wrap(
        ENV,
        "proxy_grpc_stream",
        |mut c: C,
         sp: i32,
         sl: i32,
         np: i32,
         nl: i32,
         mp: i32,
         ml: i32,
         ip: i32,
         il: i32,
         token_ptr: i32|
         -> i32 {
            let (Some(service), Some(name), Some(method), Some(meta)) = (
                read(&mut c, sp, sl),
                read_str(&mut c, np, nl),
                read_str(&mut c, mp, ml),
                read(&mut c, ip, il),
            ) else {
                return INVALID_MEMORY;
            };
            let cluster = match grpc_cluster(&service, &c.data().plugin.clusters) {
                Ok(name) => name,
                Err(status) => return status,
            };
            let s = c.data_mut();
            let token = next_grpc_token(s, true);
            if !s.plugin.clusters.contains(&cluster) {
                s.grpc_tokens.insert(token, true);
                s.deferred.push(Deferred::GrpcRefused { token });
                return Status::InternalFailure as i32;
            }
            s.grpc_tokens.insert(token, true);
            s.grpc_ops.push(GrpcOp::Stream {
                token,
                cluster,
                service: name,
                method,
                metadata: lower_pairs(&meta),
            });
            if write_u32(&mut c, token_ptr, token) {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    n("proxy_grpc_send");
    l.func_wrap(
        ENV,
        "proxy_grpc_send",
        |mut c: C, token: i32, mp: i32, ml: i32, end: i32| -> i32 {
            let Some(message) = read(&mut c, mp, ml) else {
                return INVALID_MEMORY;
            };
            let s = c.data_mut();
            let token = token as u32;
            if is_grpc_call_token(token) {
                return BAD_ARGUMENT;
            }
            if !s.grpc_tokens.contains_key(&token) {
                return NOT_FOUND;
            }
            s.grpc_ops.push(GrpcOp::Send {
                token,
                message,
                end: end != 0,
            });
            OK
        },
    )?;
    n("proxy_grpc_close");
    l.func_wrap(ENV, "proxy_grpc_close", |mut c: C, token: i32| -> i32 {
        let s = c.data_mut();
        let token = token as u32;
        match s.grpc_tokens.get(&token) {
            None => NOT_FOUND,
            // Closing a call cancels it.
            Some(false) => {
                s.grpc_tokens.remove(&token);
                s.grpc_ops.push(GrpcOp::Cancel { token });
                OK
            }
            Some(true) => {
                s.grpc_ops.push(GrpcOp::Close { token });
                OK
            }
        }
    })?;
    n("proxy_grpc_cancel");
    l.func_wrap(ENV, "proxy_grpc_cancel", |mut c: C, token: i32| -> i32 {
        let s = c.data_mut();
        let token = token as u32;
        if s.grpc_tokens.remove(&token).is_none() {
            return NOT_FOUND;
        }
        s.grpc_ops.push(GrpcOp::Cancel { token });
        OK
    })?;
    n("proxy_get_status");
    l.func_wrap(
        ENV,
        "proxy_get_status",
        |mut c: C, code_ptr: i32, mpp: i32, msp: i32| -> R {
            let (code, message) = c.data().status.clone();
            if !write_u32(&mut c, code_ptr, code) {
                return Ok(INVALID_MEMORY);
            }
            copy_out(&mut c, message.as_bytes(), mpp, msp)
        },
    )?;
    Ok(())
}

/// Envoy's header maps keep pseudo headers in front, in their order.
fn pseudo_first(headers: Headers) -> Headers {
    let (mut pseudo, rest): (Headers, Headers) =
        headers.into_iter().partition(|(k, _)| k.starts_with(':'));
    pseudo.extend(rest);
    pseudo
}

fn lower_pairs(bytes: &[u8]) -> Headers {
    decode_pairs(bytes)
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// Envoy `continueStream`: the maps go away at once, the resume runs after
/// the VM call.
fn continue_stream(s: &mut VmState, kind: i32) -> i32 {
    if !(0..=STREAM_MAX).contains(&kind) {
        return BAD_ARGUMENT;
    }
    if kind > STREAM_RESPONSE {
        return if kind == 3 {
            Status::Unimplemented as i32
        } else {
            OK
        };
    }
    let ctx = s.ctx();
    let response = kind == STREAM_RESPONSE;
    if let Some(st) = s.streams.get_mut(&ctx) {
        // Envoy drops its request map pointers on either resume.
        st.req.headers_live = false;
        st.req.body_live = false;
        st.req.trailers_live = false;
        s.deferred.push(Deferred::Continue { ctx, response });
    }
    OK
}

fn stub(
    l: &mut Linker<VmState>,
    module: &str,
    name: &str,
    params: &[ValType],
    result: i32,
) -> wasmtime::Result<()> {
    let ty = FuncType::new(l.engine(), params.iter().cloned(), [ValType::I32]);
    l.func_new(module, name, ty, move |_c, _args, results| {
        results[0] = Val::I32(result);
        Ok(())
    })?;
    Ok(())
}

// ---- WASI preview1 ---------------------------------------------------------

const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const ERRNO_NOENT: i32 = 44;
const ERRNO_NOSYS: i32 = 52;
const ERRNO_NOTSUP: i32 = 58;

fn define_wasi(
    l: &mut Linker<VmState>,
    names: &mut HashSet<(String, String)>,
) -> wasmtime::Result<()> {
    const W: &str = "wasi_snapshot_preview1";
    let mut n = |name: &str| {
        names.insert((W.to_string(), name.to_string()));
    };

    n("fd_write");
    l.func_wrap(
        W,
        "fd_write",
        |mut c: C, fd: i32, iovs: i32, iovs_len: i32, nwritten: i32| -> i32 {
            // stdout and stderr go to the log (info and error), as in Envoy.
            let level = match fd {
                1 => LogLevel::Info,
                2 => LogLevel::Error,
                _ => return ERRNO_BADF,
            };
            let mut text = Vec::new();
            for i in 0..iovs_len.max(0) {
                let Some(iov) = read(&mut c, iovs + i * 8, 8) else {
                    return ERRNO_FAULT;
                };
                let buf = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let Some(bytes) = read(&mut c, buf, len) else {
                    return ERRNO_FAULT;
                };
                text.extend_from_slice(&bytes);
            }
            let written = text.len() as u32;
            if !text.is_empty() {
                if text.last() == Some(&b'\n') {
                    text.pop();
                }
                let worker = c.data().worker;
                lock(&c.data().shared).log(
                    worker,
                    level,
                    String::from_utf8_lossy(&text).into_owned(),
                );
            }
            if write_u32(&mut c, nwritten, written) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        },
    )?;
    n("clock_time_get");
    l.func_wrap(
        W,
        "clock_time_get",
        |mut c: C, id: i32, _precision: i64, ptr: i32| -> i32 {
            let t = {
                let sh = lock(&c.data().shared);
                match id {
                    0 => sh.now_ns,
                    1 => sh.monotonic_ns,
                    _ => return ERRNO_NOTSUP,
                }
            };
            if write_u64(&mut c, ptr, t) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        },
    )?;
    n("clock_res_get");
    l.func_wrap(W, "clock_res_get", |mut c: C, id: i32, ptr: i32| -> i32 {
        if id != 0 && id != 1 {
            return ERRNO_NOTSUP;
        }
        if write_u64(&mut c, ptr, 1) {
            ERRNO_SUCCESS
        } else {
            ERRNO_FAULT
        }
    })?;
    n("random_get");
    l.func_wrap(W, "random_get", |mut c: C, ptr: i32, len: i32| -> i32 {
        let len = len as u32 as usize;
        if len > 64 * 1024 {
            return ERRNO_INVAL;
        }
        // Deterministic per worker (Envoy uses BoringSSL's RAND_bytes).
        let mut bytes = Vec::with_capacity(len);
        let s = c.data_mut();
        while bytes.len() < len {
            s.rng ^= s.rng << 13;
            s.rng ^= s.rng >> 7;
            s.rng ^= s.rng << 17;
            bytes.extend_from_slice(&s.rng.to_le_bytes());
        }
        bytes.truncate(len);
        if write(&mut c, ptr, &bytes) {
            ERRNO_SUCCESS
        } else {
            ERRNO_FAULT
        }
    })?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        n(name);
        l.func_wrap(W, name, |mut c: C, count: i32, size: i32| -> i32 {
            if write_u32(&mut c, count, 0) && write_u32(&mut c, size, 0) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        })?;
    }
    for name in ["environ_get", "args_get"] {
        n(name);
        l.func_wrap(W, name, |_c: C, _a: i32, _b: i32| -> i32 { ERRNO_SUCCESS })?;
    }
    n("proc_exit");
    l.func_wrap(W, "proc_exit", |_c: C, code: i32| -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg(format!(
            "proc_exit({code}) called by the module"
        )))
    })?;
    n("sched_yield");
    l.func_wrap(W, "sched_yield", |_c: C| -> i32 { ERRNO_SUCCESS })?;
    n("poll_oneoff");
    l.func_wrap(
        W,
        "poll_oneoff",
        |mut c: C, _in: i32, _out: i32, _n: i32, nevents: i32| -> i32 {
            if write_u32(&mut c, nevents, 0) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        },
    )?;
    n("fd_fdstat_get");
    l.func_wrap(W, "fd_fdstat_get", |mut c: C, fd: i32, ptr: i32| -> i32 {
        if fd != 1 && fd != 2 {
            return ERRNO_BADF;
        }
        let mut stat = [0u8; 24];
        stat[8..16].copy_from_slice(&64u64.to_le_bytes()); // rights: fd_write
        if write(&mut c, ptr, &stat) {
            ERRNO_SUCCESS
        } else {
            ERRNO_FAULT
        }
    })?;
    // The rest answer like cpp-host: no files, no sockets.
    let i = ValType::I32;
    let j = ValType::I64;
    let stubs: Vec<(&str, Vec<ValType>, i32)> = vec![
        ("fd_close", vec![i.clone()], ERRNO_SUCCESS),
        (
            "fd_seek",
            vec![i.clone(), j.clone(), i.clone(), i.clone()],
            ERRNO_SUCCESS,
        ),
        ("fd_read", vec![i.clone(); 4], ERRNO_NOSYS),
        (
            "fd_pread",
            vec![i.clone(), i.clone(), i.clone(), j.clone(), i.clone()],
            ERRNO_NOSYS,
        ),
        (
            "fd_pwrite",
            vec![i.clone(), i.clone(), i.clone(), j.clone(), i.clone()],
            ERRNO_NOSYS,
        ),
        ("fd_prestat_get", vec![i.clone(); 2], ERRNO_BADF),
        ("fd_prestat_dir_name", vec![i.clone(); 3], ERRNO_NOSYS),
        ("fd_filestat_get", vec![i.clone(); 2], ERRNO_BADF),
        ("fd_fdstat_set_flags", vec![i.clone(); 2], ERRNO_NOSYS),
        (
            "fd_fdstat_set_rights",
            vec![i.clone(), j.clone(), j.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_filestat_set_size",
            vec![i.clone(), j.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_filestat_set_times",
            vec![i.clone(), j.clone(), j.clone(), i.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_advise",
            vec![i.clone(), j.clone(), j.clone(), i.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_allocate",
            vec![i.clone(), j.clone(), j.clone()],
            ERRNO_NOTSUP,
        ),
        ("fd_datasync", vec![i.clone()], ERRNO_NOTSUP),
        ("fd_sync", vec![i.clone()], ERRNO_NOTSUP),
        ("fd_tell", vec![i.clone(); 2], ERRNO_NOTSUP),
        ("fd_renumber", vec![i.clone(); 2], ERRNO_NOTSUP),
        (
            "fd_readdir",
            vec![i.clone(), i.clone(), i.clone(), j.clone(), i.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "path_open",
            vec![
                i.clone(),
                i.clone(),
                i.clone(),
                i.clone(),
                i.clone(),
                j.clone(),
                j.clone(),
                i.clone(),
                i.clone(),
            ],
            ERRNO_NOENT,
        ),
        ("path_filestat_get", vec![i.clone(); 5], ERRNO_NOTSUP),
        (
            "path_filestat_set_times",
            vec![
                i.clone(),
                i.clone(),
                i.clone(),
                i.clone(),
                j.clone(),
                j.clone(),
                i.clone(),
            ],
            ERRNO_NOTSUP,
        ),
        ("path_create_directory", vec![i.clone(); 3], ERRNO_NOTSUP),
        ("path_link", vec![i.clone(); 7], ERRNO_NOTSUP),
        ("path_readlink", vec![i.clone(); 6], ERRNO_NOTSUP),
        ("path_remove_directory", vec![i.clone(); 3], ERRNO_NOTSUP),
        ("path_rename", vec![i.clone(); 6], ERRNO_NOTSUP),
        ("path_symlink", vec![i.clone(); 5], ERRNO_NOTSUP),
        ("path_unlink_file", vec![i.clone(); 3], ERRNO_NOTSUP),
        ("proc_raise", vec![i.clone()], ERRNO_NOTSUP),
        ("sock_accept", vec![i.clone(); 3], ERRNO_NOTSUP),
        ("sock_recv", vec![i.clone(); 6], ERRNO_NOTSUP),
        ("sock_send", vec![i.clone(); 5], ERRNO_NOTSUP),
        ("sock_shutdown", vec![i.clone(); 2], ERRNO_NOTSUP),
    ];
    for (name, params, errno) in stubs {
        n(name);
        stub(l, W, name, &params, errno)?;
    }
    Ok(())
}
