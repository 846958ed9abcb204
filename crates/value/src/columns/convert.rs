//! [`convert`]: one attribute value to a column's type (rule 4 of the module docs), the one
//! place conversions are decided.
//!
//! Numbers are judged on their reduced decimal form (`number`): `bigint` and the epoch times
//! take the exact integer the digits spell, `double` the nearest double only when its
//! shortest round trip spells the same value, `numeric` the text itself. Nothing here rounds.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::time::{epoch_micros, iso8601_micros};
use super::{ColumnType, ColumnValue, Mismatch, TimeFormat, a_tag};
use crate::limits::{NumberProblem, number_problem};
use crate::number::{Scaled, exact_double, scaled_integer, significant};
use crate::{Value, ValueFormat};

/// Significant digits of the longest shortest round trip of a double.
const DOUBLE_DIGITS: usize = 17;

/// How strings of a document are taken (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strings {
    /// A string is an `S` (typed documents, and values that say their type).
    AreStrings,
    /// A string that is a number's text counts as that number for the columns that read
    /// numbers (plain documents, where §3.2 writes some numbers as strings).
    MayBeNumbers,
}

/// One value converted to a column's type (rule 4).
///
/// ```
/// use ddbpipe_value::{ColumnType, ColumnValue, Number, TimeFormat, Value, convert};
///
/// let price = Value::N(Number::new("12.50"));
/// let numeric = convert(&price, ColumnType::Numeric, TimeFormat::Iso8601);
/// assert_eq!(numeric, Ok(ColumnValue::Numeric("12.50".to_owned())));
/// let bigint = convert(&price, ColumnType::Bigint, TimeFormat::Iso8601);
/// assert_eq!(bigint.unwrap_err().why, "an N with a fraction is not an integer");
/// ```
pub fn convert(
    value: &Value,
    kind: ColumnType,
    time_format: TimeFormat,
) -> Result<ColumnValue, Mismatch> {
    match (kind, value) {
        (_, Value::Null) => Ok(ColumnValue::Null),
        (_, Value::N(number)) if kind != ColumnType::Text && kind != ColumnType::Jsonb => {
            convert_number(number.as_str(), kind, time_format)
        }
        (ColumnType::Text, _) => text(value),
        (ColumnType::Numeric | ColumnType::Bigint | ColumnType::Double, _) => {
            Err(not(value, "is not a number"))
        }
        (ColumnType::Boolean, Value::Bool(flag)) => Ok(ColumnValue::Boolean(*flag)),
        (ColumnType::Boolean, _) => Err(not(value, "is not a boolean")),
        (ColumnType::Timestamptz, _) => timestamp(value, time_format),
        (ColumnType::Jsonb, _) => Ok(ColumnValue::Json(jsonb(value))),
    }
}

/// [`convert`] for a value read from a document whose strings are taken as `strings` says
/// (rule 3).
pub(super) fn convert_read(
    value: &Value,
    kind: ColumnType,
    time_format: TimeFormat,
    strings: Strings,
) -> Result<ColumnValue, Mismatch> {
    if let (Strings::MayBeNumbers, Value::S(text)) = (strings, value)
        && reads_numbers(kind, time_format)
        && significant(text).is_some()
    {
        return convert_number(text, kind, time_format);
    }
    convert(value, kind, time_format)
}

/// [`convert_read`] of a value the caller owns: a string for a `text` column is moved, not
/// copied (the common case of a plain document).
pub(super) fn convert_read_owned(
    value: Value,
    kind: ColumnType,
    time_format: TimeFormat,
    strings: Strings,
) -> Result<ColumnValue, Mismatch> {
    match (kind, value) {
        (ColumnType::Text, Value::S(text)) => Ok(ColumnValue::Text(text)),
        (_, value) => convert_read(&value, kind, time_format, strings),
    }
}

/// Whether a column of `kind` takes an `N` and nothing else (the columns rule 3 lets a string
/// stand for a number in).
fn reads_numbers(kind: ColumnType, time_format: TimeFormat) -> bool {
    match kind {
        ColumnType::Numeric | ColumnType::Bigint | ColumnType::Double => true,
        ColumnType::Timestamptz => time_format != TimeFormat::Iso8601,
        ColumnType::Text | ColumnType::Boolean | ColumnType::Jsonb => false,
    }
}

/// An `N`'s text in a column other than `text` and `jsonb`.
fn convert_number(
    text: &str,
    kind: ColumnType,
    time_format: TimeFormat,
) -> Result<ColumnValue, Mismatch> {
    let mismatch = |why: String| Mismatch::new("N", why);
    match kind {
        ColumnType::Numeric => numeric(text).map_err(mismatch),
        ColumnType::Bigint => bigint(text).map_err(mismatch),
        ColumnType::Double => double(text).map_err(mismatch),
        ColumnType::Timestamptz => {
            let digits_below_unit = match time_format {
                TimeFormat::EpochSeconds => 6,
                TimeFormat::EpochMillis => 3,
                TimeFormat::Iso8601 => {
                    return Err(mismatch(
                        "an N is not an ISO 8601 time (format epoch_seconds or epoch_millis \
                         reads numbers)"
                            .to_owned(),
                    ));
                }
            };
            epoch_micros(text, digits_below_unit)
                .map(ColumnValue::Timestamp)
                .map_err(|problem| mismatch(problem.why("an N")))
        }
        ColumnType::Boolean => Err(mismatch("an N is not a boolean".to_owned())),
        ColumnType::Text | ColumnType::Jsonb => {
            convert(&Value::N(crate::Number::new(text)), kind, time_format)
        }
    }
}

/// `text`: `S`, `N`, `BOOL` and `B`; nothing with parts.
fn text(value: &Value) -> Result<ColumnValue, Mismatch> {
    let text = match value {
        Value::S(text) => text.clone(),
        Value::N(number) => number.as_str().to_owned(),
        Value::Bool(flag) => flag.to_string(),
        Value::B(bytes) => STANDARD.encode(bytes),
        _ => return Err(not(value, "has no text form (a jsonb column takes it)")),
    };
    Ok(ColumnValue::Text(text))
}

/// `numeric`: a number DynamoDB holds, as its text.
fn numeric(text: &str) -> Result<ColumnValue, String> {
    match number_problem(text) {
        None => Ok(ColumnValue::Numeric(text.trim_ascii().to_owned())),
        Some(NumberProblem::NotANumber) => Err("an N that is not a number".to_owned()),
        Some(NumberProblem::TooManyDigits(digits)) => Err(format!(
            "an N with {digits} significant digits is more than DynamoDB holds (38)"
        )),
        Some(NumberProblem::OutOfRange) => Err("an N beyond DynamoDB's range (magnitude 1E-130 \
                                                to 9.9999999999999999999999999999999999999E+125)"
            .to_owned()),
    }
}

/// `bigint`: an integer within i64.
fn bigint(text: &str) -> Result<ColumnValue, String> {
    let beyond = || {
        let digits = significant(text).map_or(0, |(digits, exponent)| digits as i128 + exponent);
        format!(
            "an N with {digits} integer digits is beyond bigint \
             (-9223372036854775808 to 9223372036854775807)"
        )
    };
    match scaled_integer(text, 0) {
        Scaled::NotANumber => Err("an N that is not a number".to_owned()),
        Scaled::Fraction => Err("an N with a fraction is not an integer".to_owned()),
        Scaled::TooLong => Err(beyond()),
        Scaled::Integer(value) => i64::try_from(value)
            .map(ColumnValue::Bigint)
            .map_err(|_| beyond()),
    }
}

/// `double`: the nearest double when its shortest round trip has the same value.
fn double(text: &str) -> Result<ColumnValue, String> {
    if let Some(value) = exact_double(text) {
        return Ok(ColumnValue::Double(value));
    }
    Err(match significant(text) {
        None => "an N that is not a number".to_owned(),
        Some((digits, _)) if digits > DOUBLE_DIGITS => format!(
            "an N with {digits} significant digits is more than a double holds \
             ({DOUBLE_DIGITS} at most)"
        ),
        Some((digits, exponent)) if !(-324..=308).contains(&(exponent + digits as i128 - 1)) => {
            "an N beyond the range of a double".to_owned()
        }
        Some(_) => {
            "an N that no double holds exactly (its nearest double prints otherwise)".to_owned()
        }
    })
}

/// `timestamptz` of anything but an `N` (that is [`convert_number`]'s).
fn timestamp(value: &Value, time_format: TimeFormat) -> Result<ColumnValue, Mismatch> {
    match (time_format, value) {
        (TimeFormat::Iso8601, Value::S(text)) => iso8601_micros(text)
            .map(ColumnValue::Timestamp)
            .map_err(|problem| Mismatch::new("S", problem.why("an S"))),
        (TimeFormat::Iso8601, _) => Err(not(value, "is not an ISO 8601 time")),
        (TimeFormat::EpochSeconds | TimeFormat::EpochMillis, Value::S(_)) => Err(not(
            value,
            &format!(
                "is not a number of {} (format iso8601 reads text)",
                match time_format {
                    TimeFormat::EpochMillis => "milliseconds",
                    _ => "seconds",
                }
            ),
        )),
        (TimeFormat::EpochSeconds | TimeFormat::EpochMillis, _) => {
            Err(not(value, "is not a number"))
        }
    }
}

/// `jsonb`: plain JSON, every number a JSON number of its own digits (§3.7).
fn jsonb(value: &Value) -> String {
    let mut out = Vec::new();
    ValueFormat::PlainExact.write_value(value, &mut out);
    String::from_utf8(out)
        .expect("the JSON writers write UTF-8: strings from `str`, ASCII for everything else")
}

/// The mismatch of a value whose type does not fit: `a BOOL is not a number`.
fn not(value: &Value, why: &str) -> Mismatch {
    let tag = value.type_tag();
    Mismatch::new(tag, format!("{} {why}", a_tag(tag)))
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
