//! Wall-clock dates as the user-facing outputs write them, all through
//! `jiff`: `strftime_now` in chat templates (local time, as Hugging Face
//! templates and llama.cpp see it) and the UTC stamps of `longhaul bench`
//! (llama-bench's `test_time`). Nothing else in the crate does calendar
//! arithmetic.

use jiff::fmt::strtime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ZonedDateTime};

/// A format that `strftime` cannot apply.
#[derive(Debug, thiserror::Error)]
#[error(
    "strftime format {format:?}: {reason}; use C strftime conversions such as %Y-%m-%d %H:%M:%S"
)]
pub struct FormatError {
    pub format: String,
    pub reason: String,
}

/// `fmt` applied to `t` like C `strftime` (`%Y %m %d %e %H %M %S %y %j %B %b
/// %A %a %p %I %z %Z %%` and the rest of POSIX's conversions).
pub fn strftime(fmt: &str, t: &ZonedDateTime) -> Result<String, FormatError> {
    strtime::format(fmt, t).map_err(|e| FormatError {
        format: fmt.to_string(),
        reason: e.to_string(),
    })
}

/// `fmt` applied to the current local time: the zone in `TZ`, else the
/// system's (`/etc/localtime`), else UTC. llama.cpp renders `strftime_now`
/// from `localtime`, and Python's `datetime.now()` in transformers does too.
pub fn strftime_local_now(fmt: &str) -> Result<String, FormatError> {
    strftime(fmt, &Timestamp::now().to_zoned_datetime(TimeZone::system()))
}

/// `t` as RFC 3339 in UTC to the second (`2024-01-31T12:00:00Z`), as
/// llama-bench writes `test_time` (`%FT%TZ` of `gmtime`).
pub fn utc_rfc3339(t: Timestamp) -> String {
    // `%FT%TZ` has no conversion that can fail on a timestamp.
    strtime::format("%FT%TZ", t).unwrap_or_default()
}

/// The current time as [`utc_rfc3339`].
pub fn utc_rfc3339_now() -> String {
    utc_rfc3339(Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    // 1_709_211_909 s after the epoch is 2024-02-29 13:05:09 UTC, a
    // Thursday (GNU `date -u -d @1709211909`); day 60 of a leap year.
    const LEAP_DAY: i64 = 1_709_211_909;

    fn at(secs: i64, tz: TimeZone) -> ZonedDateTime {
        Timestamp::from_second(secs).unwrap().to_zoned_datetime(tz)
    }

    #[test]
    fn formats_known_instants_in_utc() {
        let t = at(LEAP_DAY, TimeZone::UTC);
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S", &t).unwrap(),
            "2024-02-29 13:05:09"
        );
        // Llama 3.1's template asks for `strftime_now("%d %b %Y")`.
        assert_eq!(
            strftime("%d %b %Y, %A %j %I%p %%", &t).unwrap(),
            "29 Feb 2024, Thursday 060 01PM %"
        );
        assert_eq!(strftime("%e %B %y", &t).unwrap(), "29 February 24");
        assert_eq!(
            strftime("%Y-%m-%d %a", &at(0, TimeZone::UTC)).unwrap(),
            "1970-01-01 Thu"
        );
    }

    #[test]
    fn local_time_follows_the_zone() {
        // Five hours west of UTC the leap day's 13:05 is 08:05 the same day;
        // seven hours west of 02:00 UTC on 2024-03-01 is still February 29th.
        let west = TimeZone::fixed(jiff::tz::offset(-5));
        assert_eq!(
            strftime("%Y-%m-%d %H:%M %z", &at(LEAP_DAY, west)).unwrap(),
            "2024-02-29 08:05 -0500"
        );
        let march_first_2am = 1_709_258_400; // 2024-03-01 02:00:00 UTC
        let far_west = TimeZone::fixed(jiff::tz::offset(-7));
        assert_eq!(
            strftime("%Y-%m-%d %H:%M", &at(march_first_2am, far_west)).unwrap(),
            "2024-02-29 19:00"
        );
    }

    #[test]
    fn bench_stamps_are_utc_seconds() {
        assert_eq!(
            utc_rfc3339(Timestamp::from_second(LEAP_DAY).unwrap()),
            "2024-02-29T13:05:09Z"
        );
        assert_eq!(
            utc_rfc3339(Timestamp::from_second(0).unwrap()),
            "1970-01-01T00:00:00Z"
        );
        let now = utc_rfc3339_now();
        assert_eq!(now.len(), "2024-02-29T13:05:09Z".len(), "{now}");
    }

    #[test]
    fn bad_formats_are_errors_not_panics() {
        let e = strftime("%K", &at(0, TimeZone::UTC)).unwrap_err();
        assert!(e.to_string().contains("%K"), "{e}");
    }
}
