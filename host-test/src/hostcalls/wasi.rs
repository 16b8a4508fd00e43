//! WASI preview1 as cpp-host answers it: stdout/stderr to the log, the
//! clock, random bytes; no files, no sockets.

use super::guest::*;
use crate::abi::*;
use crate::shared::lock;
use wasmtime::ValType;

const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const ERRNO_NOENT: i32 = 44;
const ERRNO_NOSYS: i32 = 52;
const ERRNO_NOTSUP: i32 = 58;

/// The errno a WASI call answers after writing its result.
fn errno(written: bool) -> i32 {
    if written {
        ERRNO_SUCCESS
    } else {
        ERRNO_FAULT
    }
}

/// The WASI preview1 imports a wasm32-wasip1 Rust module needs.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
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
            errno(write_u32(&mut c, nwritten, written))
        },
    )?;
    i.func(
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
            errno(write_u64(&mut c, ptr, t))
        },
    )?;
    i.func("clock_res_get", |mut c: C, id: i32, ptr: i32| -> i32 {
        if id != 0 && id != 1 {
            return ERRNO_NOTSUP;
        }
        errno(write_u64(&mut c, ptr, 1))
    })?;
    i.func("random_get", |mut c: C, ptr: i32, len: i32| -> i32 {
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
        errno(write(&mut c, ptr, &bytes))
    })?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        i.func(name, |mut c: C, count: i32, size: i32| -> i32 {
            errno(write_u32(&mut c, count, 0) && write_u32(&mut c, size, 0))
        })?;
    }
    for name in ["environ_get", "args_get"] {
        i.func(name, |_c: C, _a: i32, _b: i32| -> i32 { ERRNO_SUCCESS })?;
    }
    i.func("proc_exit", |_c: C, code: i32| -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg(format!(
            "proc_exit({code}) called by the module"
        )))
    })?;
    i.func("sched_yield", |_c: C| -> i32 { ERRNO_SUCCESS })?;
    i.func(
        "poll_oneoff",
        |mut c: C, _in: i32, _out: i32, _n: i32, nevents: i32| -> i32 {
            errno(write_u32(&mut c, nevents, 0))
        },
    )?;
    i.func("fd_fdstat_get", |mut c: C, fd: i32, ptr: i32| -> i32 {
        if fd != 1 && fd != 2 {
            return ERRNO_BADF;
        }
        let mut stat = [0u8; 24];
        stat[8..16].copy_from_slice(&64u64.to_le_bytes()); // rights: fd_write
        errno(write(&mut c, ptr, &stat))
    })?;
    // The rest answer like cpp-host: no files, no sockets. Each stub's
    // parameters are spelled one letter a value: `i` an i32, `l` an i64.
    const STUBS: &[(&str, &str, i32)] = &[
        ("fd_close", "i", ERRNO_SUCCESS),
        ("fd_seek", "ilii", ERRNO_SUCCESS),
        ("fd_read", "iiii", ERRNO_NOSYS),
        ("fd_pread", "iiili", ERRNO_NOSYS),
        ("fd_pwrite", "iiili", ERRNO_NOSYS),
        ("fd_prestat_get", "ii", ERRNO_BADF),
        ("fd_prestat_dir_name", "iii", ERRNO_NOSYS),
        ("fd_filestat_get", "ii", ERRNO_BADF),
        ("fd_fdstat_set_flags", "ii", ERRNO_NOSYS),
        ("fd_fdstat_set_rights", "ill", ERRNO_NOTSUP),
        ("fd_filestat_set_size", "il", ERRNO_NOTSUP),
        ("fd_filestat_set_times", "illi", ERRNO_NOTSUP),
        ("fd_advise", "illi", ERRNO_NOTSUP),
        ("fd_allocate", "ill", ERRNO_NOTSUP),
        ("fd_datasync", "i", ERRNO_NOTSUP),
        ("fd_sync", "i", ERRNO_NOTSUP),
        ("fd_tell", "ii", ERRNO_NOTSUP),
        ("fd_renumber", "ii", ERRNO_NOTSUP),
        ("fd_readdir", "iiili", ERRNO_NOTSUP),
        ("path_open", "iiiiillii", ERRNO_NOENT),
        ("path_filestat_get", "iiiii", ERRNO_NOTSUP),
        ("path_filestat_set_times", "iiiilli", ERRNO_NOTSUP),
        ("path_create_directory", "iii", ERRNO_NOTSUP),
        ("path_link", "iiiiiii", ERRNO_NOTSUP),
        ("path_readlink", "iiiiii", ERRNO_NOTSUP),
        ("path_remove_directory", "iii", ERRNO_NOTSUP),
        ("path_rename", "iiiiii", ERRNO_NOTSUP),
        ("path_symlink", "iiiii", ERRNO_NOTSUP),
        ("path_unlink_file", "iii", ERRNO_NOTSUP),
        ("proc_raise", "i", ERRNO_NOTSUP),
        ("sock_accept", "iii", ERRNO_NOTSUP),
        ("sock_recv", "iiiiii", ERRNO_NOTSUP),
        ("sock_send", "iiiii", ERRNO_NOTSUP),
        ("sock_shutdown", "ii", ERRNO_NOTSUP),
    ];
    for &(name, params, result) in STUBS {
        let params: Vec<ValType> = params
            .chars()
            .map(|p| if p == 'l' { ValType::I64 } else { ValType::I32 })
            .collect();
        i.stub(name, &params, result)?;
    }
    Ok(())
}
