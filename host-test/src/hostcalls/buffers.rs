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
