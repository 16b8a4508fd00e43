//! The two exports every hand-written probe (abi-probe, hostcall-probe) needs: the ABI
//! version it speaks and the allocator the host fills returned values into (the Rust
//! allocator, so `abi::take` gives the buffer back as a `Vec`). Each probe includes
//! this file as a module (`#[path]`); shared-data-probe gets both from the SDK.

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut v: Vec<u8> = Vec::with_capacity(size);
    let p = v.as_mut_ptr();
    std::mem::forget(v);
    p
}
