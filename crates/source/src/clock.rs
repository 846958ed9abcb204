//! Wall-clock time as the stream works with it: unix seconds and milliseconds.
//!
//! Decisions take these as arguments; only the thin async loops read the clock.

/// Now, in unix milliseconds (0 if the clock is before 1970).
pub fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// Now, in unix seconds.
pub fn unix_now_s() -> i64 {
    unix_now_ms().div_euclid(1000)
}

/// Now, RFC 3339 UTC with milliseconds (`2026-12-01T08:00:00.123Z`): the time stored in state
/// entries and destination rows.
pub fn now_rfc3339() -> String {
    format_ms(time::OffsetDateTime::now_utc())
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds (as [`now_rfc3339`]).
pub fn rfc3339_ms(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) {
        Ok(at) => format_ms(at),
        Err(_) => format!("{ms} ms"),
    }
}

fn format_ms(at: time::OffsetDateTime) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    at.format(&format).unwrap_or_else(|_| at.to_string())
}
