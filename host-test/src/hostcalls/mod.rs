//! The host side of proxy-wasm ABI 0.2.1 and the WASI preview1 imports a
//! wasm32-wasip1 Rust module needs, with Envoy's semantics (statuses, map
//! availability, buffer rules, shared-data CAS) as in Envoy and cpp-host.
//!
//! One file per family of host calls, each with its own `add_to_linker`;
//! [`guest`] holds guest memory access and the registration helper they
//! share. To add a host call, register it with `Imports::func` in its
//! family's `add_to_linker`.

mod buffers;
mod calls;
mod grpc;
mod guest;
mod maps;
mod metrics;
mod properties;
mod queues;
mod shared_data;
mod stream;
mod time_log;
mod wasi;

use crate::state::VmState;
use guest::Imports;
use std::collections::HashSet;
use wasmtime::Linker;

/// Defines every import host-test provides; returns their names.
pub(crate) fn define(linker: &mut Linker<VmState>) -> wasmtime::Result<HashSet<(String, String)>> {
    let mut names = HashSet::new();
    {
        let mut env = Imports::new(linker, "env", &mut names);
        time_log::add_to_linker(&mut env)?;
        maps::add_to_linker(&mut env)?;
        buffers::add_to_linker(&mut env)?;
        properties::add_to_linker(&mut env)?;
        shared_data::add_to_linker(&mut env)?;
        queues::add_to_linker(&mut env)?;
        stream::add_to_linker(&mut env)?;
        calls::add_to_linker(&mut env)?;
        metrics::add_to_linker(&mut env)?;
        grpc::add_to_linker(&mut env)?;
    }
    wasi::add_to_linker(&mut Imports::new(
        linker,
        "wasi_snapshot_preview1",
        &mut names,
    ))?;
    Ok(names)
}
