//! Guest memory as the host calls see it (reads, writes, the module's
//! allocator), the statuses they answer with, and [`Imports`], which
//! registers a host function and records its name in one step.

use crate::abi::*;
use crate::state::VmState;
use std::collections::HashSet;
use wasmtime::{Caller, FuncType, IntoFunc, Linker, Val, ValType};

pub(super) type C<'a> = Caller<'a, VmState>;

/// A host function of the caller and `i32` arguments, its parameters on one
/// line however many the ABI gives it: `i32_args!(|c, ptr, len| -> i32 { … })`.
macro_rules! i32_args {
    (|$c:ident $(, $p:ident)*| -> $r:ty { $($body:tt)* }) => {
        |mut $c: C, $($p: i32),*| -> $r { $($body)* }
    };
}
pub(super) use i32_args;
pub(super) type R = wasmtime::Result<i32>;

pub(super) const OK: i32 = Status::Ok as i32;
pub(super) const NOT_FOUND: i32 = Status::NotFound as i32;
pub(super) const BAD_ARGUMENT: i32 = Status::BadArgument as i32;
pub(super) const INVALID_MEMORY: i32 = Status::InvalidMemoryAccess as i32;

/// One import module (`env`, `wasi_snapshot_preview1`) being defined: each
/// host function is registered and its name recorded at once, so the list
/// of what host-test provides cannot drift from what it links.
pub(super) struct Imports<'a> {
    linker: &'a mut Linker<VmState>,
    module: &'static str,
    names: &'a mut HashSet<(String, String)>,
}

impl<'a> Imports<'a> {
    pub(super) fn new(
        linker: &'a mut Linker<VmState>,
        module: &'static str,
        names: &'a mut HashSet<(String, String)>,
    ) -> Imports<'a> {
        Imports {
            linker,
            module,
            names,
        }
    }

    /// Registers `f` as `module.name`.
    pub(super) fn func<Params, Args>(
        &mut self,
        name: &str,
        f: impl IntoFunc<VmState, Params, Args>,
    ) -> wasmtime::Result<()> {
        self.names
            .insert((self.module.to_string(), name.to_string()));
        self.linker.func_wrap(self.module, name, f)?;
        Ok(())
    }

    /// Registers `module.name` taking `params` and always answering `result`.
    pub(super) fn stub(
        &mut self,
        name: &str,
        params: &[ValType],
        result: i32,
    ) -> wasmtime::Result<()> {
        self.names
            .insert((self.module.to_string(), name.to_string()));
        let ty = FuncType::new(self.linker.engine(), params.iter().cloned(), [ValType::I32]);
        self.linker
            .func_new(self.module, name, ty, move |_c, _args, results| {
                results[0] = Val::I32(result);
                Ok(())
            })?;
        Ok(())
    }
}

pub(super) fn read(c: &mut C, ptr: i32, len: i32) -> Option<Vec<u8>> {
    count_in(c, len);
    borrow(c, ptr, len).map(<[u8]>::to_vec)
}

/// Counts `len` bytes as copied in from the guest.
pub(super) fn count_in(c: &mut C, len: i32) {
    if let Some(h) = c.data_mut().host_calls.as_mut() {
        h.bytes_in += len as u32 as u64;
    }
}

/// The guest's bytes at `ptr..ptr + len`, without a copy: for a host call whose host
/// side copies them itself (shared data), as Envoy's does. (Count them with
/// [`count_in`].)
pub(super) fn borrow<'a>(c: &'a C, ptr: i32, len: i32) -> Option<&'a [u8]> {
    let mem = c.data().memory?;
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    mem.data(c).get(start..end)
}

pub(super) fn read_str(c: &mut C, ptr: i32, len: i32) -> Option<String> {
    read(c, ptr, len).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(super) fn write(c: &mut C, ptr: i32, bytes: &[u8]) -> bool {
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

pub(super) fn write_u32(c: &mut C, ptr: i32, v: u32) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

pub(super) fn write_u64(c: &mut C, ptr: i32, v: u64) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

/// The status a host call answers after writing its result: Ok, or
/// InvalidMemoryAccess when the guest pointer is out of bounds.
pub(super) fn written(ok: bool) -> i32 {
    if ok {
        OK
    } else {
        INVALID_MEMORY
    }
}

/// Writes `v` at `ptr` and answers the status, as most host calls end.
pub(super) fn put_u32(c: &mut C, ptr: i32, v: u32) -> i32 {
    written(write_u32(c, ptr, v))
}

/// [`put_u32`] for a 64-bit result.
pub(super) fn put_u64(c: &mut C, ptr: i32, v: u64) -> i32 {
    written(write_u64(c, ptr, v))
}

/// cpp-host `copyToPointerSize`: allocates in the guest (proxy_on_memory_allocate)
/// and writes pointer and size; empty data is a null pointer and size 0.
pub(super) fn copy_out(c: &mut C, data: &[u8], ptr_ptr: i32, size_ptr: i32) -> R {
    if data.is_empty() {
        return Ok(written(
            write_u32(c, ptr_ptr, 0) && write_u32(c, size_ptr, 0),
        ));
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
    Ok(written(
        write_u32(c, ptr_ptr, addr as u32) && write_u32(c, size_ptr, data.len() as u32),
    ))
}
