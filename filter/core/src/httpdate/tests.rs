use super::*;

#[test]
fn known_dates() {
    assert_eq!(imf_fixdate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    // RFC 9110's own example.
    assert_eq!(imf_fixdate(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(imf_fixdate(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    assert_eq!(imf_fixdate(1_798_779_599), "Fri, 01 Jan 2027 04:59:59 GMT");
    assert_eq!(imf_fixdate(1_796_187_600), "Wed, 02 Dec 2026 05:00:00 GMT");
    // 2100 is no leap year.
    assert_eq!(imf_fixdate(4_107_542_400), "Mon, 01 Mar 2100 00:00:00 GMT");
}

#[test]
fn milliseconds_round_up_to_the_second() {
    assert_eq!(
        imf_fixdate_ceil_ms(1_796_187_600_000),
        "Wed, 02 Dec 2026 05:00:00 GMT"
    );
    assert_eq!(
        imf_fixdate_ceil_ms(1_796_187_599_001),
        "Wed, 02 Dec 2026 05:00:00 GMT"
    );
    assert_eq!(
        imf_fixdate_ceil_ms(1_796_187_600_001),
        "Wed, 02 Dec 2026 05:00:01 GMT"
    );
}

/// Every day for 1000 years against a plain day-by-day walk of the calendar.
#[test]
fn civil_from_days_walks_the_calendar() {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let (mut y, mut m, mut d) = (1970, 1, 1);
    for days in 0..365_250 {
        assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
        assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        let len = match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        d += 1;
        if d > len {
            d = 1;
            m += 1;
            if m > 12 {
                m = 1;
                y += 1;
            }
        }
    }
}
