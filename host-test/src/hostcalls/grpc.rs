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
        i32_args!(
            |c, sp, sl, np, nl, mp, ml, ip, il, rp, rl, timeout, token_ptr| -> i32 {
                let (Some(target), Some(message)) = (
                    read_target(&mut c, [sp, sl, np, nl, mp, ml, ip, il]),
                    read(&mut c, rp, rl),
                ) else {
                    return INVALID_MEMORY;
                };
                open(&mut c, target, Some((message, timeout as u32)), token_ptr)
            }
        ),
    )?;
    i.func(
        "proxy_grpc_stream",
        i32_args!(|c, sp, sl, np, nl, mp, ml, ip, il, token_ptr| -> i32 {
            let Some(target) = read_target(&mut c, [sp, sl, np, nl, mp, ml, ip, il]) else {
                return INVALID_MEMORY;
            };
            open(&mut c, target, None, token_ptr)
        }),
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
            if !s.grpc_calls.live.contains_key(&token) {
                return NOT_FOUND;
            }
            s.grpc_calls.ops.push(GrpcOp::Send {
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
        match s.grpc_calls.live.get(&token) {
            None => NOT_FOUND,
            // Closing a call cancels it.
            Some(false) => {
                s.grpc_calls.live.remove(&token);
                s.grpc_calls.ops.push(GrpcOp::Cancel { token });
                OK
            }
            Some(true) => {
                s.grpc_calls.ops.push(GrpcOp::Close { token });
                OK
            }
        }
    })?;
    i.func("proxy_grpc_cancel", |mut c: C, token: i32| -> i32 {
        let s = c.data_mut();
        let token = token as u32;
        if s.grpc_calls.live.remove(&token).is_none() {
            return NOT_FOUND;
        }
        s.grpc_calls.ops.push(GrpcOp::Cancel { token });
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

/// What a gRPC call or stream is opened with, read from guest memory.
struct Target {
    /// The serialized `GrpcService` (or cluster name) the call names.
    service: Vec<u8>,
    name: String,
    method: String,
    metadata: Headers,
}

/// Reads the service, name, method and metadata (pointer and length each)
/// that `proxy_grpc_call` and `proxy_grpc_stream` both start with.
fn read_target(c: &mut C, [sp, sl, np, nl, mp, ml, ip, il]: [i32; 8]) -> Option<Target> {
    let (service, name, method, meta) = (
        read(c, sp, sl),
        read_str(c, np, nl),
        read_str(c, mp, ml),
        read(c, ip, il),
    );
    Some(Target {
        service: service?,
        name: name?,
        method: method?,
        metadata: lower_pairs(&meta?),
    })
}

/// Opens a call (with its message and timeout) or a stream (`None`) to the
/// cluster the target's service names, and writes its token.
/// A GrpcService naming an unknown cluster: Envoy's client fails at once
/// ("Cluster not available", delivered after this call) and the call
/// returns InternalFailure.
fn open(c: &mut C, target: Target, call: Option<(Vec<u8>, u32)>, token_ptr: i32) -> i32 {
    let cluster = match grpc_cluster(&target.service, &c.data().plugin.clusters) {
        Ok(cluster) => cluster,
        Err(status) => return status,
    };
    let s = c.data_mut();
    let stream = call.is_none();
    let token = next_grpc_token(s, stream);
    s.grpc_calls.live.insert(token, stream);
    if !s.plugin.clusters.contains(&cluster) {
        s.deferred.push(Deferred::GrpcRefused { token });
        return Status::InternalFailure as i32;
    }
    s.grpc_calls.ops.push(GrpcOp::Open {
        token,
        cluster,
        service: target.name,
        method: target.method,
        metadata: target.metadata,
        call,
    });
    put_u32(c, token_ptr, token)
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
        &mut s.grpc_calls.next_stream
    } else {
        &mut s.grpc_calls.next_call
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
