//! Stream control: continue, close, local replies, the effective context.

use super::guest::*;
use crate::abi::*;
use crate::state::{Deferred, VmState};

/// Continue/close a stream, send a local response, clear the route cache,
/// set the effective context, `proxy_done`.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func("proxy_continue_stream", |mut c: C, kind: i32| -> i32 {
        continue_stream(c.data_mut(), kind)
    })?;
    i.func("proxy_continue_request", |mut c: C| -> i32 {
        continue_stream(c.data_mut(), STREAM_REQUEST)
    })?;
    i.func("proxy_continue_response", |mut c: C| -> i32 {
        continue_stream(c.data_mut(), STREAM_RESPONSE)
    })?;
    i.func("proxy_close_stream", |mut c: C, kind: i32| -> i32 {
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
    i.func(
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
    i.func("proxy_clear_route_cache", |_c: C| -> i32 { OK })?;
    i.func("proxy_set_effective_context", |mut c: C, id: i32| -> i32 {
        let s = c.data_mut();
        let id = id as u32;
        if id == s.root_id || s.streams.contains_key(&id) {
            s.effective = Some(id);
            OK
        } else {
            BAD_ARGUMENT
        }
    })?;
    i.func("proxy_done", |_c: C| -> i32 { OK })?;
    Ok(())
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
