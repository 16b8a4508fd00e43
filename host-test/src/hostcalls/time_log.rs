//! Logging, the clock and the tick period.

use super::guest::*;
use crate::abi::*;
use crate::shared::lock;

/// `proxy_log`, `proxy_get_log_level`, the current time and the tick period.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
        "proxy_log",
        |mut c: C, level: i32, ptr: i32, len: i32| -> i32 {
            let Some(level) = LogLevel::from_raw(level) else {
                return BAD_ARGUMENT;
            };
            let Some(msg) = read_str(&mut c, ptr, len) else {
                return INVALID_MEMORY;
            };
            let worker = c.data().worker;
            lock(&c.data().shared).log(worker, level, msg);
            OK
        },
    )?;
    i.func("proxy_get_log_level", |mut c: C, ptr: i32| -> i32 {
        let level = lock(&c.data().shared).log_level as u32;
        put_u32(&mut c, ptr, level)
    })?;
    i.func(
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ptr: i32| -> i32 {
            let now = lock(&c.data().shared).now_ns;
            put_u64(&mut c, ptr, now)
        },
    )?;
    i.func(
        "proxy_set_tick_period_milliseconds",
        |mut c: C, period: i32| -> i32 {
            c.data_mut().tick_request = Some(period as u32);
            OK
        },
    )?;
    Ok(())
}
