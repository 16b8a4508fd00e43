//! Shared data: get and set with Envoy's compare-and-swap.

use super::guest::*;
use crate::shared::lock;
use crate::state::status;

/// `proxy_get_shared_data` and `proxy_set_shared_data`.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
        "proxy_get_shared_data",
        |mut c: C, kp: i32, kl: i32, vpp: i32, vsp: i32, cas_ptr: i32| -> R {
            let Some(key) = read_str(&mut c, kp, kl) else {
                return Ok(INVALID_MEMORY);
            };
            let got = {
                let s = c.data();
                lock(&s.shared).get(&s.plugin.vm_id, &key)
            };
            match got {
                Err(s) => Ok(status(s)),
                Ok((value, cas)) => {
                    let r = copy_out(&mut c, &value, vpp, vsp)?;
                    if r != OK {
                        return Ok(r);
                    }
                    Ok(put_u32(&mut c, cas_ptr, cas))
                }
            }
        },
    )?;
    i.func(
        "proxy_set_shared_data",
        |mut c: C, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> i32 {
            let Some(key) = read_str(&mut c, kp, kl) else {
                return INVALID_MEMORY;
            };
            count_in(&mut c, vl);
            let Some(value) = borrow(&c, vp, vl) else {
                return INVALID_MEMORY;
            };
            // The value is copied once, into the store, as Envoy does.
            let s = c.data();
            status(lock(&s.shared).set(&s.plugin.vm_id, &key, value, cas as u32))
        },
    )?;
    Ok(())
}
