//! Header and trailer maps: what each map is in each phase, and the
//! get/set/add/replace/remove calls with Envoy's statuses.

use super::guest::*;
use crate::abi::*;
use crate::http::{header_get, Headers};
use crate::state::VmState;

/// The header-map imports.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func("proxy_get_header_map_pairs", get_header_map_pairs)?;
    i.func("proxy_set_header_map_pairs", set_header_map_pairs)?;
    i.func("proxy_get_header_map_value", get_header_map_value)?;
    i.func(
        "proxy_replace_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            edit_header(c, map, kp, kl, Some((vp, vl)), false)
        },
    )?;
    i.func(
        "proxy_add_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            edit_header(c, map, kp, kl, Some((vp, vl)), true)
        },
    )?;
    i.func(
        "proxy_remove_header_map_value",
        |c: C, map: i32, kp: i32, kl: i32| edit_header(c, map, kp, kl, None, false),
    )?;
    i.func("proxy_get_header_map_size", get_header_map_size)?;
    Ok(())
}

enum MapView<'a> {
    Available(&'a Headers),
    /// Envoy has no such map now (null pointer): get -> BadArgument.
    Unavailable,
    /// Access-log phase: a missing map reads as NotFound.
    LogPhaseMissing,
}

fn const_map(s: &VmState, map: i32) -> MapView<'_> {
    fn available(h: Option<&Headers>) -> MapView<'_> {
        h.map_or(MapView::Unavailable, MapView::Available)
    }
    match map {
        MAP_CALL_HEADERS => available(s.callout_response.as_ref().map(|r| &r.headers)),
        MAP_CALL_TRAILERS => available(s.callout_response.as_ref().map(|r| &r.trailers)),
        MAP_GRPC_INITIAL => available(s.grpc.initial.as_ref()),
        MAP_GRPC_TRAILING => available(s.grpc.trailing.as_ref()),
        _ => {
            let Some(st) = s.stream() else {
                return MapView::Unavailable;
            };
            let dir = match map {
                MAP_REQUEST_HEADERS | MAP_REQUEST_TRAILERS => &st.req,
                _ => &st.resp,
            };
            let (h, received, live) = match map {
                MAP_REQUEST_HEADERS | MAP_RESPONSE_HEADERS => {
                    (&dir.headers, dir.headers_received, dir.headers_live)
                }
                _ => (&dir.trailers, !dir.trailers.is_empty(), dir.trailers_live),
            };
            if st.log_phase {
                if map == MAP_REQUEST_TRAILERS || !received {
                    return MapView::LogPhaseMissing;
                }
                return MapView::Available(h);
            }
            if live {
                MapView::Available(h)
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

/// A map call's map type checked (BadArgument) and its bytes argument read
/// (InvalidMemoryAccess), in Envoy's order.
fn map_arg(c: &mut C, map: i32, ptr: i32, len: i32) -> Result<Vec<u8>, i32> {
    if !(0..=MAP_CALL_TRAILERS).contains(&map) {
        return Err(BAD_ARGUMENT);
    }
    read(c, ptr, len).ok_or(INVALID_MEMORY)
}

/// [`map_arg`] for a header name, lowercased as Envoy's maps hold it.
fn map_key(c: &mut C, map: i32, kp: i32, kl: i32) -> Result<String, i32> {
    map_arg(c, map, kp, kl).map(|k| String::from_utf8_lossy(&k).to_ascii_lowercase())
}

fn set_header_map_pairs(mut c: C, map: i32, ptr: i32, size: i32) -> R {
    let pairs = match map_arg(&mut c, map, ptr, size) {
        Ok(data) => decode_pairs(&data),
        Err(status) => return Ok(status),
    };
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
    let key = match map_key(&mut c, map, kp, kl) {
        Ok(key) => key,
        Err(status) => return Ok(status),
    };
    let value = match const_map(c.data(), map) {
        MapView::Available(h) => match header_get(h, &key) {
            Some(v) => v.as_bytes().to_vec(),
            None => return Ok(NOT_FOUND),
        },
        MapView::Unavailable => return Ok(BAD_ARGUMENT),
        MapView::LogPhaseMissing => return Ok(NOT_FOUND),
    };
    copy_out(&mut c, &value, vpp, vsp)
}

fn edit_header(mut c: C, map: i32, kp: i32, kl: i32, value: Option<(i32, i32)>, add: bool) -> R {
    let key = match map_key(&mut c, map, kp, kl) {
        Ok(key) => key,
        Err(status) => return Ok(status),
    };
    let value = match value {
        Some((vp, vl)) => match read_str(&mut c, vp, vl) {
            Some(v) => Some(v),
            None => return Ok(INVALID_MEMORY),
        },
        None => None,
    };
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
    Ok(put_u32(&mut c, result_ptr, size as u32))
}
