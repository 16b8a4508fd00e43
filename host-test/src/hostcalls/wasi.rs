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
            if write_u32(&mut c, nwritten, written) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
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
            if write_u64(&mut c, ptr, t) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        },
    )?;
    i.func("clock_res_get", |mut c: C, id: i32, ptr: i32| -> i32 {
        if id != 0 && id != 1 {
            return ERRNO_NOTSUP;
        }
        if write_u64(&mut c, ptr, 1) {
            ERRNO_SUCCESS
        } else {
            ERRNO_FAULT
        }
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
        if write(&mut c, ptr, &bytes) {
            ERRNO_SUCCESS
        } else {
            ERRNO_FAULT
        }
    })?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        i.func(name, |mut c: C, count: i32, size: i32| -> i32 {
            if write_u32(&mut c, count, 0) && write_u32(&mut c, size, 0) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
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
            if write_u32(&mut c, nevents, 0) {
                ERRNO_SUCCESS
            } else {
                ERRNO_FAULT
            }
        },
    )?;
    i.func("fd_fdstat_get", |mut c: C, fd: i32, ptr: i32| -> i32 {
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
    let int = ValType::I32;
    let long = ValType::I64;
    let stubs: Vec<(&str, Vec<ValType>, i32)> = vec![
        ("fd_close", vec![int.clone()], ERRNO_SUCCESS),
        (
            "fd_seek",
            vec![int.clone(), long.clone(), int.clone(), int.clone()],
            ERRNO_SUCCESS,
        ),
        ("fd_read", vec![int.clone(); 4], ERRNO_NOSYS),
        (
            "fd_pread",
            vec![
                int.clone(),
                int.clone(),
                int.clone(),
                long.clone(),
                int.clone(),
            ],
            ERRNO_NOSYS,
        ),
        (
            "fd_pwrite",
            vec![
                int.clone(),
                int.clone(),
                int.clone(),
                long.clone(),
                int.clone(),
            ],
            ERRNO_NOSYS,
        ),
        ("fd_prestat_get", vec![int.clone(); 2], ERRNO_BADF),
        ("fd_prestat_dir_name", vec![int.clone(); 3], ERRNO_NOSYS),
        ("fd_filestat_get", vec![int.clone(); 2], ERRNO_BADF),
        ("fd_fdstat_set_flags", vec![int.clone(); 2], ERRNO_NOSYS),
        (
            "fd_fdstat_set_rights",
            vec![int.clone(), long.clone(), long.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_filestat_set_size",
            vec![int.clone(), long.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_filestat_set_times",
            vec![int.clone(), long.clone(), long.clone(), int.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_advise",
            vec![int.clone(), long.clone(), long.clone(), int.clone()],
            ERRNO_NOTSUP,
        ),
        (
            "fd_allocate",
            vec![int.clone(), long.clone(), long.clone()],
            ERRNO_NOTSUP,
        ),
        ("fd_datasync", vec![int.clone()], ERRNO_NOTSUP),
        ("fd_sync", vec![int.clone()], ERRNO_NOTSUP),
        ("fd_tell", vec![int.clone(); 2], ERRNO_NOTSUP),
        ("fd_renumber", vec![int.clone(); 2], ERRNO_NOTSUP),
        (
            "fd_readdir",
            vec![
                int.clone(),
                int.clone(),
                int.clone(),
                long.clone(),
                int.clone(),
            ],
            ERRNO_NOTSUP,
        ),
        (
            "path_open",
            vec![
                int.clone(),
                int.clone(),
                int.clone(),
                int.clone(),
                int.clone(),
                long.clone(),
                long.clone(),
                int.clone(),
                int.clone(),
            ],
            ERRNO_NOENT,
        ),
        ("path_filestat_get", vec![int.clone(); 5], ERRNO_NOTSUP),
        (
            "path_filestat_set_times",
            vec![
                int.clone(),
                int.clone(),
                int.clone(),
                int.clone(),
                long.clone(),
                long.clone(),
                int.clone(),
            ],
            ERRNO_NOTSUP,
        ),
        ("path_create_directory", vec![int.clone(); 3], ERRNO_NOTSUP),
        ("path_link", vec![int.clone(); 7], ERRNO_NOTSUP),
        ("path_readlink", vec![int.clone(); 6], ERRNO_NOTSUP),
        ("path_remove_directory", vec![int.clone(); 3], ERRNO_NOTSUP),
        ("path_rename", vec![int.clone(); 6], ERRNO_NOTSUP),
        ("path_symlink", vec![int.clone(); 5], ERRNO_NOTSUP),
        ("path_unlink_file", vec![int.clone(); 3], ERRNO_NOTSUP),
        ("proc_raise", vec![int.clone()], ERRNO_NOTSUP),
        ("sock_accept", vec![int.clone(); 3], ERRNO_NOTSUP),
        ("sock_recv", vec![int.clone(); 6], ERRNO_NOTSUP),
        ("sock_send", vec![int.clone(); 5], ERRNO_NOTSUP),
        ("sock_shutdown", vec![int.clone(); 2], ERRNO_NOTSUP),
    ];
    for (name, params, errno) in stubs {
        i.stub(name, &params, errno)?;
    }
    Ok(())
}
