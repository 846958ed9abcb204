//! Times for `timestamptz` columns: ISO 8601 text and epoch numbers read into microseconds
//! since 1970-01-01 UTC, and microseconds written back as text.
//!
//! # Rules
//! 1. **ISO 8601** is `YYYY-MM-DD`, optionally followed by `T` (or `t`, or a space) and
//!    `HH:MM:SS`, an optional fraction `.f` of 1 to 9 digits and an optional offset: `Z`
//!    (or `z`), `±HH:MM`, `±HHMM` or `±HH`. Nothing else: no week dates, no ordinal dates,
//!    no `,` fraction, no leap second `60`, no hour `24`, no trailing text.
//! 2. The date must exist (days per month, leap years of the Gregorian calendar). Hours run
//!    to 23, minutes and seconds to 59, an offset to ±23:59.
//! 3. A time without an offset is UTC; a date alone is midnight UTC.
//! 4. **Epoch** seconds and milliseconds are `N` texts, fractions and negatives allowed.
//! 5. **Exact or refused.** A time with a non-zero digit below the microsecond, or whose UTC
//!    instant is outside years 1–9999, is refused, never rounded or clamped.
//! 6. **Text** is `YYYY-MM-DDTHH:MM:SS.ffffffZ`: UTC, always six fraction digits, so text order
//!    is time order.
//!
//! The calendar is the proleptic Gregorian one, by the day-count algorithms of Howard
//! Hinnant's "chrono-compatible low-level date algorithms".

use crate::number::{Scaled, scaled_integer};

/// Microseconds in a second, a minute, an hour and a day.
const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_MINUTE: i64 = 60 * MICROS_PER_SECOND;
const MICROS_PER_HOUR: i64 = 60 * MICROS_PER_MINUTE;
const MICROS_PER_DAY: i64 = 24 * MICROS_PER_HOUR;

/// 0001-01-01T00:00:00Z, the first instant rule 5 allows.
const FIRST_MICROS: i64 = -62_135_596_800 * MICROS_PER_SECOND;
/// 9999-12-31T23:59:59.999999Z, the last instant rule 5 allows.
const LAST_MICROS: i64 = 253_402_300_800 * MICROS_PER_SECOND - 1;

/// Why a text or number is not a time a `timestamptz` column stores, without the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeProblem {
    /// Not in the accepted form (rule 1 for text, not a number for epochs).
    Form(&'static str),
    /// A date that does not exist, or a field beyond its range (rule 2).
    Field(&'static str),
    /// Non-zero digits below the microsecond (rule 5).
    BelowMicros,
    /// Outside years 1–9999 in UTC (rule 5).
    OutOfRange,
}

impl TimeProblem {
    /// The problem as a mismatch's reason, for a value described as `what` (`an S`).
    pub(super) fn why(self, what: &str) -> String {
        match self {
            TimeProblem::Form(form) => format!("{what} that is not {form}"),
            TimeProblem::Field(field) => format!("{what} with {field}"),
            TimeProblem::BelowMicros => {
                format!("{what} with digits below the microsecond cannot be stored exactly")
            }
            TimeProblem::OutOfRange => format!("{what} outside years 1-9999 (UTC)"),
        }
    }
}

/// Microseconds since 1970-01-01 UTC of an ISO 8601 / RFC 3339 time, if it is one a
/// `timestamptz` column stores exactly (rules 1, 2, 3 and 5): `2024-05-01T12:30:00Z`,
/// `2024-05-01 12:30:00.123456+02:00`, `2024-05-01`. `None` for anything else, including a
/// time with nanoseconds and one outside years 1–9999.
///
/// ```
/// use ddbpipe_value::parse_timestamp;
///
/// assert_eq!(parse_timestamp("1970-01-01T00:00:01.5Z"), Some(1_500_000));
/// assert_eq!(parse_timestamp("1970-01-01T02:00:00+02:00"), Some(0));
/// assert_eq!(parse_timestamp("1970-01-01T00:00:00.0000001Z"), None);
/// ```
pub fn parse_timestamp(text: &str) -> Option<i64> {
    iso8601_micros(text).ok()
}

/// [`parse_timestamp`], saying why not.
pub(super) fn iso8601_micros(text: &str) -> Result<i64, TimeProblem> {
    const FORM: TimeProblem = TimeProblem::Form("an ISO 8601 time");
    let mut text = Digits(text.as_bytes());
    let year = text.number(4).ok_or(FORM)?;
    text.literal(b"-").ok_or(FORM)?;
    let month = text.number(2).ok_or(FORM)?;
    text.literal(b"-").ok_or(FORM)?;
    let day = text.number(2).ok_or(FORM)?;
    let mut micros_of_day = 0;
    let mut offset_minutes = 0;
    if !text.is_empty() {
        text.one_of(b"Tt ").ok_or(FORM)?;
        let hour = text.number(2).ok_or(FORM)?;
        text.literal(b":").ok_or(FORM)?;
        let minute = text.number(2).ok_or(FORM)?;
        text.literal(b":").ok_or(FORM)?;
        let second = text.number(2).ok_or(FORM)?;
        let fraction = match text.literal(b".") {
            Some(()) => fraction_nanos(&mut text).ok_or(FORM)?,
            None => 0,
        };
        offset_minutes = offset(&mut text).ok_or(FORM)?;
        if !text.is_empty() {
            return Err(FORM);
        }
        if hour > 23 {
            return Err(TimeProblem::Field("an hour beyond 23"));
        }
        if minute > 59 {
            return Err(TimeProblem::Field("a minute beyond 59"));
        }
        if second > 59 {
            return Err(TimeProblem::Field("a second beyond 59"));
        }
        if fraction % 1000 != 0 {
            return Err(TimeProblem::BelowMicros);
        }
        micros_of_day = hour * MICROS_PER_HOUR
            + minute * MICROS_PER_MINUTE
            + second * MICROS_PER_SECOND
            + fraction / 1000;
    }
    if !(1..=12).contains(&month) {
        return Err(TimeProblem::Field("a month that does not exist"));
    }
    if !(1..=days_in_month(year, month)).contains(&day) {
        return Err(TimeProblem::Field("a day its month does not have"));
    }
    // Years 0–9999 and offsets under a day: far inside i64 microseconds.
    let micros = days_from_civil(year, month, day) * MICROS_PER_DAY + micros_of_day
        - offset_minutes * MICROS_PER_MINUTE;
    in_range(micros)
}

/// Microseconds since 1970-01-01 UTC of an epoch number (rules 4 and 5): `N` text of seconds
/// (`digits_below_unit` 6) or milliseconds (3).
pub(super) fn epoch_micros(text: &str, digits_below_unit: i128) -> Result<i64, TimeProblem> {
    match scaled_integer(text, digits_below_unit) {
        Scaled::NotANumber => Err(TimeProblem::Form("a number")),
        Scaled::Fraction => Err(TimeProblem::BelowMicros),
        Scaled::TooLong => Err(TimeProblem::OutOfRange),
        Scaled::Integer(micros) => {
            in_range(i64::try_from(micros).map_err(|_| TimeProblem::OutOfRange)?)
        }
    }
}

/// `micros` if it is within years 1–9999 (rule 5).
fn in_range(micros: i64) -> Result<i64, TimeProblem> {
    if (FIRST_MICROS..=LAST_MICROS).contains(&micros) {
        Ok(micros)
    } else {
        Err(TimeProblem::OutOfRange)
    }
}

/// A timestamp as RFC 3339 text in UTC with six fraction digits
/// (`2024-05-01T12:30:00.000000Z`): what a SQLite `timestamptz` column stores, and what
/// PostgreSQL is sent (rule 6). A year outside 0–9999, which no converted value has, is
/// written with a sign and six digits (ISO 8601's expanded form).
pub fn timestamp_text(micros: i64) -> String {
    let days = micros.div_euclid(MICROS_PER_DAY);
    let of_day = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let hour = of_day / MICROS_PER_HOUR;
    let minute = of_day % MICROS_PER_HOUR / MICROS_PER_MINUTE;
    let second = of_day % MICROS_PER_MINUTE / MICROS_PER_SECOND;
    let fraction = of_day % MICROS_PER_SECOND;
    let year = if (0..=9999).contains(&year) {
        format!("{year:04}")
    } else {
        format!("{year:+07}")
    };
    format!("{year}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{fraction:06}Z")
}

/// The fraction after the `.`: 1 to 9 digits, as nanoseconds.
fn fraction_nanos(text: &mut Digits<'_>) -> Option<i64> {
    let count = text
        .0
        .iter()
        .take_while(|byte| byte.is_ascii_digit())
        .count();
    if !(1..=9).contains(&count) {
        return None;
    }
    let digits = text.number(count)?;
    Some(digits * 10i64.pow(9 - count as u32))
}

/// The offset east of UTC in minutes: nothing (UTC), `Z`, `z`, `±HH:MM`, `±HHMM` or `±HH`.
fn offset(text: &mut Digits<'_>) -> Option<i64> {
    let sign = match text.0.first() {
        None => return Some(0),
        Some(b'Z' | b'z') => {
            text.0 = &text.0[1..];
            return Some(0);
        }
        Some(b'+') => 1,
        Some(b'-') => -1,
        Some(_) => return None,
    };
    text.0 = &text.0[1..];
    let hours = text.number(2)?;
    let minutes = if text.is_empty() {
        0
    } else {
        // `HH:MM` or `HHMM`.
        let _ = text.literal(b":");
        text.number(2)?
    };
    (hours <= 23 && minutes <= 59).then_some(sign * (hours * 60 + minutes))
}

/// The days of `month` (1–12) in `year`.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The unread rest of a time's text.
struct Digits<'a>(&'a [u8]);

impl Digits<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Exactly `count` ASCII digits (at most 18), as a number.
    fn number(&mut self, count: usize) -> Option<i64> {
        let digits = self.0.get(..count)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.0 = &self.0[count..];
        Some(
            digits
                .iter()
                .fold(0, |value, digit| value * 10 + i64::from(digit - b'0')),
        )
    }

    /// `expected`, consumed if it is next.
    fn literal(&mut self, expected: &[u8]) -> Option<()> {
        self.0 = self.0.strip_prefix(expected)?;
        Some(())
    }

    /// One byte of `allowed`, consumed if it is next.
    fn one_of(&mut self, allowed: &[u8]) -> Option<()> {
        let (first, rest) = self.0.split_first()?;
        allowed.contains(first).then(|| self.0 = rest)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Microseconds of a UTC date and time, built independently of the parser.
    fn utc(year: i32, month: u8, day: u8, hms: (u8, u8, u8), micro: u32) -> i64 {
        let date = ::time::Date::from_calendar_date(year, month.try_into().unwrap(), day).unwrap();
        let time = ::time::Time::from_hms_micro(hms.0, hms.1, hms.2, micro).unwrap();
        let nanos = date.with_time(time).assume_utc().unix_timestamp_nanos();
        i64::try_from(nanos / 1000).unwrap()
    }

    #[test]
    fn every_accepted_form_reads_to_its_instant() {
        let noon = utc(2024, 5, 1, (12, 30, 0), 0);
        let cases = [
            ("2024-05-01T12:30:00Z", noon),
            ("2024-05-01t12:30:00z", noon),
            ("2024-05-01 12:30:00Z", noon),
            ("2024-05-01T12:30:00", noon),
            ("2024-05-01T14:30:00+02:00", noon),
            ("2024-05-01T14:30:00+0200", noon),
            ("2024-05-01T14:30:00+02", noon),
            ("2024-05-01T10:00:00-02:30", noon),
            ("2024-05-01T12:30:00-00:00", noon),
            ("2024-05-01T12:30:00.5Z", noon + 500_000),
            ("2024-05-01T12:30:00.123456+00:00", noon + 123_456),
            ("2024-05-01T12:30:00.123456000Z", noon + 123_456),
            ("2024-05-01T12:30:00.000001", noon + 1),
            ("2024-05-01", utc(2024, 5, 1, (0, 0, 0), 0)),
            ("2024-02-29", utc(2024, 2, 29, (0, 0, 0), 0)),
            ("2000-02-29T23:59:59Z", utc(2000, 2, 29, (23, 59, 59), 0)),
            ("1970-01-01T00:00:00Z", 0),
            ("1969-12-31T23:59:59.999999Z", -1),
            ("0001-01-01T00:00:00Z", FIRST_MICROS),
            ("0001-01-01T01:00:00+01:00", FIRST_MICROS),
            ("9999-12-31T23:59:59.999999Z", LAST_MICROS),
            ("9999-12-31T22:59:59.999999-01:00", LAST_MICROS),
        ];
        for (text, micros) in cases {
            assert_eq!(iso8601_micros(text), Ok(micros), "{text}");
            assert_eq!(parse_timestamp(text), Some(micros), "{text}");
        }
    }

    #[test]
    fn every_other_form_is_refused_saying_why() {
        let form = TimeProblem::Form("an ISO 8601 time");
        let field = TimeProblem::Field;
        let cases = [
            ("", form),
            ("2024-05-01T12:30Z", form),
            ("2024-05-01T12:30:00.Z", form),
            ("2024-05-01T12:30:00.1234567890Z", form),
            ("2024-05-01T12:30:00,5Z", form),
            ("2024-05-01T12:30:00 Z", form),
            ("2024-05-01T12:30:00+2", form),
            ("2024-05-01T12:30:00+02:0", form),
            ("2024-05-01T12:30:00+02:00:00", form),
            ("2024-05-01T12:30:00UTC", form),
            ("2024-05-01Z", form),
            ("2024-05-01T", form),
            ("2024-5-01", form),
            ("24-05-01", form),
            ("+2024-05-01", form),
            ("20240501T123000Z", form),
            ("2024-W18-3", form),
            ("2024-122", form),
            (" 2024-05-01", form),
            ("2024-05-01T12:30:00Z ", form),
            ("2024-05-01_12:30:00", form),
            ("2024-05-01T12:30:00+24:00", form),
            ("2024-05-01T12:30:00+02:60", form),
            ("2023-02-29", field("a day its month does not have")),
            ("1900-02-29", field("a day its month does not have")),
            ("2024-04-31", field("a day its month does not have")),
            ("2024-01-00", field("a day its month does not have")),
            ("2024-13-01", field("a month that does not exist")),
            ("2024-00-01", field("a month that does not exist")),
            ("2024-05-01T24:00:00Z", field("an hour beyond 23")),
            ("2024-05-01T12:60:00Z", field("a minute beyond 59")),
            ("2016-12-31T23:59:60Z", field("a second beyond 59")),
            ("2024-05-01T12:30:00.0000001Z", TimeProblem::BelowMicros),
            ("2024-05-01T12:30:00.123456789Z", TimeProblem::BelowMicros),
            ("0000-01-01", TimeProblem::OutOfRange),
            ("0000-12-31T23:59:59.999999Z", TimeProblem::OutOfRange),
            ("0001-01-01T00:30:00+01:00", TimeProblem::OutOfRange),
            ("9999-12-31T23:30:00-01:00", TimeProblem::OutOfRange),
            ("10000-01-01", form),
        ];
        for (text, problem) in cases {
            assert_eq!(iso8601_micros(text), Err(problem), "{text}");
            assert_eq!(parse_timestamp(text), None, "{text}");
        }
    }

    #[test]
    fn epoch_numbers_read_exactly_to_the_microsecond() {
        let seconds = 1_000_000;
        let millis = 1_000;
        let cases = [
            ("0", 6, Ok(0)),
            ("-0", 6, Ok(0)),
            ("1714566600", 6, Ok(1_714_566_600 * seconds)),
            ("1714566600.123456", 6, Ok(1_714_566_600_123_456)),
            ("1714566600.1234560", 6, Ok(1_714_566_600_123_456)),
            ("1.7145666E+9", 6, Ok(1_714_566_600 * seconds)),
            ("-1.5", 6, Ok(-1_500_000)),
            ("-62135596800", 6, Ok(FIRST_MICROS)),
            ("253402300799.999999", 6, Ok(LAST_MICROS)),
            ("1714566600123", 3, Ok(1_714_566_600_123 * millis)),
            ("1714566600123.456", 3, Ok(1_714_566_600_123_456)),
            ("-0.001", 3, Ok(-1)),
            ("1714566600.1234567", 6, Err(TimeProblem::BelowMicros)),
            ("1714566600123.4567", 3, Err(TimeProblem::BelowMicros)),
            ("0.0001", 3, Err(TimeProblem::BelowMicros)),
            ("-62135596800.000001", 6, Err(TimeProblem::OutOfRange)),
            ("253402300800", 6, Err(TimeProblem::OutOfRange)),
            ("1E+30", 6, Err(TimeProblem::OutOfRange)),
            ("1E+125", 3, Err(TimeProblem::OutOfRange)),
            ("-1E+125", 3, Err(TimeProblem::OutOfRange)),
            ("soon", 6, Err(TimeProblem::Form("a number"))),
        ];
        for (text, shift, want) in cases {
            assert_eq!(epoch_micros(text, shift), want, "{text} ({shift})");
        }
    }

    #[test]
    fn text_has_six_fraction_digits_at_every_edge() {
        let cases = [
            (0, "1970-01-01T00:00:00.000000Z"),
            (1, "1970-01-01T00:00:00.000001Z"),
            (-1, "1969-12-31T23:59:59.999999Z"),
            (-86_400_000_000, "1969-12-31T00:00:00.000000Z"),
            (951_782_400_000_000, "2000-02-29T00:00:00.000000Z"),
            (FIRST_MICROS, "0001-01-01T00:00:00.000000Z"),
            (LAST_MICROS, "9999-12-31T23:59:59.999999Z"),
            (FIRST_MICROS - 1, "0000-12-31T23:59:59.999999Z"),
            (LAST_MICROS + 1, "+010000-01-01T00:00:00.000000Z"),
        ];
        for (micros, text) in cases {
            assert_eq!(timestamp_text(micros), text, "{micros}");
        }
        assert!(timestamp_text(i64::MIN).starts_with("-29"));
        assert!(timestamp_text(i64::MAX).starts_with("+29"));
    }

    proptest! {
        #[test]
        fn text_agrees_with_the_time_crate_and_parses_back(
            micros in FIRST_MICROS..=LAST_MICROS,
        ) {
            let text = timestamp_text(micros);
            let instant =
                ::time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
                    .unwrap();
            let expected = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
                instant.year(),
                u8::from(instant.month()),
                instant.day(),
                instant.hour(),
                instant.minute(),
                instant.second(),
                instant.microsecond(),
            );
            prop_assert_eq!(&text, &expected);
            prop_assert_eq!(parse_timestamp(&text), Some(micros));
        }

        #[test]
        fn an_offset_moves_the_instant_by_its_minutes(
            micros in (FIRST_MICROS + MICROS_PER_DAY)..=(LAST_MICROS - MICROS_PER_DAY),
            east in -(23 * 60 + 59)..=(23i64 * 60 + 59),
        ) {
            let local = timestamp_text(micros + east * MICROS_PER_MINUTE);
            let sign = if east < 0 { '-' } else { '+' };
            let text = format!(
                "{}{sign}{:02}:{:02}",
                local.trim_end_matches('Z'),
                east.abs() / 60,
                east.abs() % 60,
            );
            prop_assert_eq!(parse_timestamp(&text), Some(micros), "{}", text);
        }
    }
}
