//! Acceptance example for host-test, after the SDK's `hello_world`: a root
//! context alone (no HTTP context), shipped as a bootstrap service. It greets
//! when its VM starts and asks for a tick every 5 s; each tick logs the wall
//! clock (WASI `clock_time_get`) and a random byte (WASI `random_get`), the
//! two host calls the SDK's example makes on wasm32-wasip1.

use log::info;
use proxy_wasm::traits::{Context, RootContext};
use proxy_wasm::types::LogLevel;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Greeter) });
}}

struct Greeter;

impl Context for Greeter {}

impl RootContext for Greeter {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        info!("Hello, World!");
        self.set_tick_period(Duration::from_secs(5));
        true
    }

    fn on_tick(&mut self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        info!("It's {}, your lucky number is {}.", utc(now), random_byte());
    }
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    #[link_name = "random_get"]
    fn wasi_random_get(buf: *mut u8, len: usize) -> i32;
}

/// One byte from the host's random source.
fn random_byte() -> u8 {
    let mut byte = 0u8;
    // SAFETY: the host writes at most `len` (1) bytes at `buf`, a live local.
    unsafe { wasi_random_get(&mut byte, 1) };
    byte
}

/// A time since the epoch as `2026-01-01 00:00:00.5 UTC` (a UTC date-time's
/// usual display: the fraction in 3, 6 or 9 digits, none when whole).
fn utc(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_date(days as i64);
    let nanos = since_epoch.subsec_nanos();
    let fraction = match nanos {
        0 => String::new(),
        n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
        n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
        n => format!(".{n:09}"),
    };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}{fraction} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil_date(days: i64) -> (i64, u32, u32) {
    // Counted in 400-year eras from 0000-03-01, so that the leap day ends a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
