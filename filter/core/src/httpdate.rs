//! HTTP dates (RFC 9110's IMF-fixdate, `Wed, 02 Dec 2026 05:00:00 GMT`) from Unix
//! milliseconds, for the headers that tell a client when a record stops answering.
//! Written here rather than taken from a crate: it is one civil-from-days conversion.

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The IMF-fixdate of the whole second `unix_s` (seconds since 1970-01-01T00:00:00Z).
pub fn imf_fixdate(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    let secs = unix_s % 86_400;
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(i64::MAX / 2));
    // 1970-01-01 was a Thursday.
    let weekday = DAYS.get((days % 7) as usize).copied().unwrap_or("Thu");
    let month = MONTHS
        .get(month.saturating_sub(1) as usize)
        .copied()
        .unwrap_or("Jan");
    format!(
        "{weekday}, {day:02} {month} {year:04} {:02}:{:02}:{:02} GMT",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The IMF-fixdate of the instant `ms` (Unix milliseconds), rounded up to the whole
/// second: from the second it names on, the instant has passed.
pub fn imf_fixdate_ceil_ms(ms: u64) -> String {
    imf_fixdate(ms.div_ceil(1000))
}

/// (year, month 1..=12, day 1..=31) of `days` since 1970-01-01 (negative: before it),
/// proleptic Gregorian: Howard Hinnant's `civil_from_days`.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    // Shifted to 0000-03-01, so a leap day ends its (March-based) year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of
/// `civil_from_days`).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
