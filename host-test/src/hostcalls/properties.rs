//! Properties (Envoy attributes): what a path reads in each phase, and
//! per-stream properties a module sets.

use super::guest::*;
use crate::abi::*;
use crate::http::{header_get, Headers};
use crate::state::{status, VmState};

/// `proxy_get_property` and `proxy_set_property`.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
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
    i.func(
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
    Ok(())
}

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
