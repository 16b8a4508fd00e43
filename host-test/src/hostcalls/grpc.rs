//! gRPC calls and streams: the cluster a call names, Envoy's tokens, and
//! send/close/cancel with `proxy_get_status`.

use super::guest::*;
use crate::abi::*;
use crate::http::Headers;
use crate::state::{Deferred, GrpcOp, VmState};
use std::collections::HashSet;

/// The gRPC imports and `proxy_get_status`.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
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
    i.func(
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
    i.func(
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
    i.func("proxy_grpc_close", |mut c: C, token: i32| -> i32 {
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
    i.func("proxy_grpc_cancel", |mut c: C, token: i32| -> i32 {
        let s = c.data_mut();
        let token = token as u32;
        if s.grpc_tokens.remove(&token).is_none() {
            return NOT_FOUND;
        }
        s.grpc_ops.push(GrpcOp::Cancel { token });
        OK
    })?;
    i.func(
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

fn lower_pairs(bytes: &[u8]) -> Headers {
    decode_pairs(bytes)
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}
