//! Body and call-response buffers: reads, status and Envoy's rules for
//! replacing bytes.

use super::guest::*;
use crate::abi::*;
use crate::state::VmState;

/// The buffer imports.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func("proxy_get_buffer_bytes", get_buffer_bytes)?;
    i.func("proxy_get_buffer_status", get_buffer_status)?;
    i.func("proxy_set_buffer_bytes", set_buffer_bytes)?;
    Ok(())
}

enum BufView {
    Data(Vec<u8>),
    /// A buffer wrapper around a null instance: size 0, writes NotFound.
    Null,
    Missing,
}

/// The stream body a buffer kind names, if it is one that is live.
fn body_mut(s: &mut VmState, kind: i32) -> Option<&mut Vec<u8>> {
    let st = s.stream_mut()?;
    let dir = if kind == BUF_REQUEST_BODY {
        &mut st.req
    } else {
        &mut st.resp
    };
    dir.body_live.then_some(&mut dir.body)
}

/// Buffer `kind`'s bytes. A stream body is moved out of the state (no copy) and must be
/// put back with [`put_back`]; the others (callout answers, configurations) are copied.
fn take(s: &mut VmState, kind: i32) -> BufView {
    match kind {
        BUF_REQUEST_BODY | BUF_RESPONSE_BODY => match body_mut(s, kind) {
            Some(body) => BufView::Data(std::mem::take(body)),
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

/// Returns a stream body [`take`] moved out.
fn put_back(s: &mut VmState, kind: i32, data: Vec<u8>) {
    if matches!(kind, BUF_REQUEST_BODY | BUF_RESPONSE_BODY) {
        if let Some(body) = body_mut(s, kind) {
            *body = data;
        }
    }
}

/// Buffer `kind`'s length, without copying it (`None`: no such buffer).
fn buffer_len(s: &VmState, kind: i32) -> Option<usize> {
    Some(match kind {
        BUF_REQUEST_BODY | BUF_RESPONSE_BODY => s.stream().map_or(0, |st| {
            let dir = if kind == BUF_REQUEST_BODY {
                &st.req
            } else {
                &st.resp
            };
            if dir.body_live {
                dir.body.len()
            } else {
                0
            }
        }),
        BUF_CALL_RESPONSE_BODY => s.callout_response.as_ref()?.body.len(),
        BUF_GRPC_RECEIVE => s.grpc.message.as_ref().map_or(0, Vec::len),
        BUF_VM_CONFIGURATION => s.plugin.vm_config.len(),
        BUF_PLUGIN_CONFIGURATION if s.in_configure => s.plugin.plugin_config.len(),
        _ => return None,
    })
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
    let data = match take(c.data_mut(), kind) {
        BufView::Data(d) => d,
        BufView::Null => Vec::new(),
        BufView::Missing => return Ok(NOT_FOUND),
    };
    let start = start as u32 as usize;
    let length = length as u32 as usize;
    let Some(end) = start.checked_add(length) else {
        put_back(c.data_mut(), kind, data);
        return Ok(BAD_ARGUMENT);
    };
    let slice = if start > data.len() {
        &[][..]
    } else {
        &data[start..end.min(data.len())]
    };
    let copied = copy_out(&mut c, slice, ptr_ptr, size_ptr);
    put_back(c.data_mut(), kind, data);
    copied
}

fn get_buffer_status(mut c: C, kind: i32, length_ptr: i32, flags_ptr: i32) -> R {
    if !(0..=BUF_MAX).contains(&kind) {
        return Ok(BAD_ARGUMENT);
    }
    let Some(len) = buffer_len(c.data(), kind) else {
        return Ok(NOT_FOUND);
    };
    Ok(written(
        write_u32(&mut c, length_ptr, len as u32) && write_u32(&mut c, flags_ptr, 0),
    ))
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
        return Ok(match buffer_len(s, kind) {
            None => NOT_FOUND,
            Some(_) => BAD_ARGUMENT,
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
