//! DynamoDB numbers as decimal text, and the §3.2 rule that decides how plain output shows them.
//!
//! DynamoDB numbers carry up to 38 significant digits and an exponent from -130 to +125, far
//! more than an `f64` holds. A [`Number`] therefore keeps the text DynamoDB sent, and only the
//! plain writer ever looks at its value, through [`plain_number`].
//!
//! # The number rule (docs/values.md §3.2)
//! 1. Parse: trim ASCII whitespace; optional `+`/`-`; digits with at most one `.` and at least
//!    one digit; optional `e`/`E` exponent whose signed digits fit `i64`. Reduce to a sign, a
//!    digit string `D` without leading or trailing zeros and an exponent `E`, value ±D×10^E.
//!    Text that does not parse stays text.
//! 2. Zero in any spelling is the integer `0`, never negative zero.
//! 3. If `E ≥ 0` and `len(D) + E ≤ 20`, a negative value that fits `i64` or a positive value
//!    that fits `u64` is an integer.
//! 4. Otherwise take the nearest `f64`. If it is finite and its shortest round-trip decimal
//!    reduces to the same sign, `D` and `E`, it is that double; else the text stays text.
//!
//! # Cost
//! Classification allocates nothing: the reduced form borrows the text, and the double is
//! parsed from and printed into stack buffers. A shortest round-trip decimal has at most 17
//! significant digits, so any longer `D` is text without consulting floating point at all.
//! Short decimals (`D` of at most 15 digits, `|E| ≤ 22`, which covers prices and most
//! measurements) get their double from one exact multiplication or division; the rest go
//! through the standard library's correctly rounded parser.

use std::fmt;

use serde_json::ser::{CompactFormatter, Formatter};

/// A DynamoDB number kept as its original decimal text, never passed through f64.
///
/// The text is not validated: it is whatever DynamoDB (or a typed JSON document) said, and it is
/// written back unchanged by the typed format.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Number(String);

impl Number {
    /// Wraps a decimal text such as `"12.50"` or `"1E+3"`, unchanged.
    pub fn new(text: impl Into<String>) -> Self {
        Number(text.into())
    }

    /// The original text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// §3.2 decision for one number text: how `value_format: plain` writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlainNumber {
    /// A JSON integer (zero, and positive values up to `u64::MAX`).
    U64(u64),
    /// A negative JSON integer down to `i64::MIN`.
    I64(i64),
    /// A double whose shortest round-trip form has exactly the digits of the text.
    F64(f64),
    /// Not exactly representable (or not a number): the original text as a JSON string.
    Text,
}

/// Applies the number rule (docs/values.md §3.2) to one number text.
///
/// ```
/// use ddbpipe_value::{PlainNumber, plain_number};
///
/// assert_eq!(plain_number("1.50"), PlainNumber::F64(1.5));
/// assert_eq!(plain_number("-1.5e2"), PlainNumber::I64(-150));
/// assert_eq!(plain_number("12345678901234567890123"), PlainNumber::Text);
/// ```
pub fn plain_number(text: &str) -> PlainNumber {
    match classify(text) {
        Classified::U64(value) => PlainNumber::U64(value),
        Classified::I64(value) => PlainNumber::I64(value),
        Classified::F64(value, _) => PlainNumber::F64(value),
        Classified::Text => PlainNumber::Text,
    }
}

/// [`PlainNumber`] plus, for a double, the bytes the plain writer emits for it, so the double
/// is printed once (for the step 4 check) and not again for the output.
pub(crate) enum Classified {
    U64(u64),
    I64(i64),
    F64(f64, Shortest),
    Text,
}

/// Integers take at most this many digits (`len(D) + E`, step 3); `u64::MAX` has 20.
const MAX_INTEGER_DIGITS: i128 = 20;
/// A shortest round-trip decimal of an `f64` never has more significant digits than this.
const MAX_SHORTEST_DIGITS: usize = 17;
/// Beyond this exponent (either way) a 17-digit value is far outside the `f64` range, so it can
/// only parse to infinity or zero. Checking it first keeps the exponent text short.
const MAX_DOUBLE_EXPONENT: i128 = 400;

/// The §3.2 decision for `text`, carrying the printed form when it is a double.
pub(crate) fn classify(text: &str) -> Classified {
    let Some(decimal) = Decimal::parse(text.as_bytes()) else {
        return Classified::Text;
    };
    if decimal.is_zero() {
        return Classified::U64(0);
    }
    if let Some(integer) = integer(&decimal) {
        return integer;
    }
    nearest_double(&decimal)
}

/// The significant digits `len(D)` and the exponent `E` of a number text (rule 1); `None`
/// when the text is not a number. Zero has no significant digits.
pub(crate) fn significant(text: &str) -> Option<(usize, i128)> {
    let decimal = Decimal::parse(text.as_bytes())?;
    Some((decimal.len, decimal.exponent))
}

/// A number text's value as an integer once its point is moved `shift` places to the right
/// (`shift` 0 for `bigint`, 6 and 3 for epoch seconds and milliseconds in microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scaled {
    /// The text is not a number (rule 1).
    NotANumber,
    /// Non-zero digits remain after the point.
    Fraction,
    /// More than 38 digits before the point: beyond `i128`.
    TooLong,
    /// The exact integer.
    Integer(i128),
}

/// Most digits an `i128` always holds (its maximum has 39).
const MAX_I128_DIGITS: i128 = 38;

/// The value of `text` times 10^`shift`, if that is an integer (see [`Scaled`]).
pub(crate) fn scaled_integer(text: &str, shift: i128) -> Scaled {
    let Some(decimal) = Decimal::parse(text.as_bytes()) else {
        return Scaled::NotANumber;
    };
    if decimal.is_zero() {
        return Scaled::Integer(0);
    }
    let exponent = decimal.exponent + shift;
    // `D` has no trailing zeros, so a negative exponent leaves a fraction.
    if exponent < 0 {
        return Scaled::Fraction;
    }
    let Ok(digits) = i128::try_from(decimal.len) else {
        return Scaled::TooLong;
    };
    if digits + exponent > MAX_I128_DIGITS {
        return Scaled::TooLong;
    }
    let magnitude = decimal.magnitude(exponent);
    Scaled::Integer(if decimal.negative {
        -magnitude
    } else {
        magnitude
    })
}

/// Step 4 on its own, for integers too: the nearest double of `text` when its shortest
/// round-trip decimal has the same value (zero in any spelling is `0.0`, never `-0.0`).
pub(crate) fn exact_double(text: &str) -> Option<f64> {
    let decimal = Decimal::parse(text.as_bytes())?;
    if decimal.is_zero() {
        return Some(0.0);
    }
    match nearest_double(&decimal) {
        Classified::F64(value, _) => Some(value),
        _ => None,
    }
}

/// Step 3: the value as a JSON integer, if it is one that fits.
fn integer(decimal: &Decimal<'_>) -> Option<Classified> {
    let digits = i128::try_from(decimal.len).ok()?;
    if decimal.exponent < 0 || digits + decimal.exponent > MAX_INTEGER_DIGITS {
        return None;
    }
    let magnitude = decimal.magnitude(decimal.exponent);
    if decimal.negative {
        i64::try_from(-magnitude).ok().map(Classified::I64)
    } else {
        u64::try_from(magnitude).ok().map(Classified::U64)
    }
}

/// Step 4: the nearest double, if printing it gives back exactly this decimal.
fn nearest_double(decimal: &Decimal<'_>) -> Classified {
    if decimal.len > MAX_SHORTEST_DIGITS || decimal.exponent.abs() > MAX_DOUBLE_EXPONENT {
        return Classified::Text;
    }
    let magnitude = match exact_quotient(decimal) {
        Some(magnitude) => magnitude,
        None => match parse_double(decimal) {
            Some(magnitude) => magnitude,
            None => return Classified::Text,
        },
    };
    let value = if decimal.negative {
        -magnitude
    } else {
        magnitude
    };
    if !value.is_finite() {
        return Classified::Text;
    }
    let Some(shortest) = Shortest::new(value) else {
        return Classified::Text;
    };
    match Decimal::parse(shortest.as_bytes()) {
        Some(printed) if printed.same_value(decimal) => Classified::F64(value, shortest),
        _ => Classified::Text,
    }
}

/// Digits a double holds exactly, and exponents whose power of ten it holds exactly.
const EXACT_DIGITS: usize = 15;
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The nearest double by one IEEE operation, for the common short decimals (Clinger's fast
/// path): when `D` and `10^|E|` are both exact doubles, `D × 10^E` or `D ÷ 10^-E` is rounded
/// once, to the nearest.
fn exact_quotient(decimal: &Decimal<'_>) -> Option<f64> {
    if decimal.len > EXACT_DIGITS {
        return None;
    }
    let power = *EXACT_POWERS_OF_TEN.get(usize::try_from(decimal.exponent.unsigned_abs()).ok()?)?;
    // At most 15 digits: below 10^15 < 2^53, so the mantissa converts exactly.
    let mantissa = decimal
        .digits()
        .fold(0u64, |value, digit| value * 10 + u64::from(digit - b'0'));
    let mantissa = mantissa as f64;
    Some(if decimal.exponent >= 0 {
        mantissa * power
    } else {
        mantissa / power
    })
}

/// The nearest double by the standard library's correctly rounded parser, from `D` and `E`.
fn parse_double(decimal: &Decimal<'_>) -> Option<f64> {
    // `D` then `e<E>`: at most 17 digits, 'e', '-' and 3 exponent digits.
    let mut canonical = [0u8; 24];
    let mut len = 0;
    for digit in decimal.digits() {
        canonical[len] = digit;
        len += 1;
    }
    canonical[len] = b'e';
    len += 1;
    let mut exponent = itoa::Buffer::new();
    let exponent = exponent.format(decimal.exponent).as_bytes();
    canonical[len..len + exponent.len()].copy_from_slice(exponent);
    len += exponent.len();

    std::str::from_utf8(&canonical[..len]).ok()?.parse().ok()
}

/// A finite double printed in shortest round-trip form with serde_json's notation
/// (`0.0025`, `1e-7`, `1e+20`), held on the stack.
#[derive(Clone, Copy)]
pub(crate) struct Shortest {
    bytes: [u8; 32],
    len: usize,
}

impl Shortest {
    /// `None` only if serde_json could not print the double into 32 bytes; its longest form,
    /// `-2.2250738585072014e-308`, takes 24.
    fn new(value: f64) -> Option<Self> {
        let mut bytes = [0u8; 32];
        let mut unwritten: &mut [u8] = &mut bytes;
        CompactFormatter.write_f64(&mut unwritten, value).ok()?;
        let len = 32 - unwritten.len();
        Some(Shortest { bytes, len })
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A number text reduced to ±D×10^E (step 1), borrowing the text.
///
/// `D` is not contiguous in the text when it spans the point (`"1.50"`), so it is kept as the
/// digits before and after the point plus the range of them that is significant.
struct Decimal<'a> {
    negative: bool,
    integer: &'a [u8],
    fraction: &'a [u8],
    /// Leading zeros of `integer ++ fraction`, which are not part of `D`.
    skip: usize,
    /// `len(D)`; zero for the value zero.
    len: usize,
    /// `E`. An `i128` so that the `i64` exponent of the text minus the fraction length cannot
    /// overflow.
    exponent: i128,
}

impl<'a> Decimal<'a> {
    fn parse(text: &'a [u8]) -> Option<Self> {
        let text = text.trim_ascii();
        let (negative, text) = match text.split_first() {
            Some((b'-', rest)) => (true, rest),
            Some((b'+', rest)) => (false, rest),
            _ => (false, text),
        };
        let (integer, text) = split_digits(text);
        let (fraction, text) = match text.split_first() {
            Some((b'.', rest)) => split_digits(rest),
            _ => (&[][..], text),
        };
        if integer.is_empty() && fraction.is_empty() {
            return None;
        }
        let written_exponent = match text.split_first() {
            None => 0,
            Some((b'e' | b'E', rest)) => parse_exponent(rest)?,
            Some(_) => return None,
        };

        let total = integer.len() + fraction.len();
        let all = || integer.iter().chain(fraction);
        let skip = all().take_while(|&&digit| digit == b'0').count();
        if skip == total {
            return Some(Decimal {
                negative,
                integer,
                fraction,
                skip,
                len: 0,
                exponent: 0,
            });
        }
        let trailing = all().rev().take_while(|&&digit| digit == b'0').count();
        let exponent = i128::from(written_exponent) - i128::try_from(fraction.len()).ok()?
            + i128::try_from(trailing).ok()?;
        Some(Decimal {
            negative,
            integer,
            fraction,
            skip,
            len: total - skip - trailing,
            exponent,
        })
    }

    fn is_zero(&self) -> bool {
        self.len == 0
    }

    /// The ASCII digits of `D`.
    fn digits(&self) -> impl Iterator<Item = u8> + '_ {
        self.integer
            .iter()
            .chain(self.fraction)
            .skip(self.skip)
            .take(self.len)
            .copied()
    }

    /// `D × 10^exponent`, for `len(D) + exponent` of at most 38 digits (the callers check),
    /// which stays below 10^38 < `i128::MAX`.
    fn magnitude(&self, exponent: i128) -> i128 {
        let digits = self
            .digits()
            .fold(0i128, |value, digit| value * 10 + i128::from(digit - b'0'));
        (0..exponent).fold(digits, |value, _| value * 10)
    }

    /// Same sign, `D` and `E`. Zero equals zero whatever its sign.
    fn same_value(&self, other: &Decimal<'_>) -> bool {
        if self.is_zero() || other.is_zero() {
            return self.is_zero() && other.is_zero();
        }
        self.negative == other.negative
            && self.exponent == other.exponent
            && self.len == other.len
            && self.digits().eq(other.digits())
    }
}

/// Splits off the leading ASCII digits.
pub(crate) fn split_digits(text: &[u8]) -> (&[u8], &[u8]) {
    let count = text.iter().take_while(|byte| byte.is_ascii_digit()).count();
    text.split_at(count)
}

/// An exponent after the `e`: optional sign and at least one digit, the whole rest of the text,
/// with a value that fits `i64`.
pub(crate) fn parse_exponent(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Accumulate towards the sign so that i64::MIN parses.
    digits.iter().try_fold(0i64, |value, &digit| {
        let digit = i64::from(digit - b'0');
        let value = value.checked_mul(10)?;
        if negative {
            value.checked_sub(digit)
        } else {
            value.checked_add(digit)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Value, ValueFormat};

    fn plain(text: &str) -> String {
        let mut out = Vec::new();
        ValueFormat::Plain.write_value(&Value::N(Number::new(text)), &mut out);
        String::from_utf8(out).unwrap()
    }

    fn stays_text(text: &str) {
        assert_eq!(
            plain(text),
            serde_json::to_string(text).unwrap(),
            "{text:?}"
        );
        assert_eq!(plain_number(text), PlainNumber::Text, "{text:?}");
    }

    #[test]
    fn serde_json_prints_doubles_in_the_notation_the_spec_pins() {
        assert_eq!(serde_json::to_string(&1e20f64).unwrap(), "1e+20");
        assert_eq!(serde_json::to_string(&1e30f64).unwrap(), "1e+30");
        assert_eq!(serde_json::to_string(&1e-7f64).unwrap(), "1e-7");
        assert_eq!(serde_json::to_string(&0.0025f64).unwrap(), "0.0025");
    }

    #[test]
    fn a_trailing_zero_fraction_is_an_integer() {
        assert_eq!(plain("1.0"), "1");
        assert_eq!(plain_number("1.0"), PlainNumber::U64(1));
    }

    #[test]
    fn a_short_fraction_is_a_double() {
        assert_eq!(plain("0.1"), "0.1");
        assert_eq!(plain_number("0.1"), PlainNumber::F64(0.1));
    }

    #[test]
    fn a_positive_exponent_that_lands_on_an_integer_is_an_integer() {
        assert_eq!(plain("1E+3"), "1000");
    }

    #[test]
    fn trailing_zeros_of_a_fraction_are_dropped() {
        assert_eq!(plain("1.50"), "1.5");
    }

    #[test]
    fn a_plus_sign_and_surrounding_whitespace_are_ignored() {
        assert_eq!(plain("+7"), "7");
        assert_eq!(plain(" 7 "), "7");
        assert_eq!(plain("\t7\n"), "7");
    }

    #[test]
    fn a_negative_exponent_is_written_as_a_plain_fraction_when_serde_json_does() {
        assert_eq!(plain("2.5e-3"), "0.0025");
    }

    #[test]
    fn leading_zeros_are_dropped() {
        assert_eq!(plain("0012"), "12");
    }

    #[test]
    fn a_negative_value_with_an_exponent_can_be_an_integer() {
        assert_eq!(plain("-1.5e2"), "-150");
        assert_eq!(plain_number("-1.5e2"), PlainNumber::I64(-150));
    }

    #[test]
    fn u64_max_is_an_integer() {
        assert_eq!(plain("18446744073709551615"), "18446744073709551615");
        assert_eq!(
            plain_number("18446744073709551615"),
            PlainNumber::U64(u64::MAX)
        );
    }

    #[test]
    fn i64_min_is_an_integer() {
        assert_eq!(plain("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(
            plain_number("-9223372036854775808"),
            PlainNumber::I64(i64::MIN)
        );
    }

    #[test]
    fn one_past_u64_max_stays_a_string() {
        stays_text("18446744073709551616");
    }

    #[test]
    fn one_past_i64_min_stays_a_string() {
        stays_text("-9223372036854775809");
    }

    #[test]
    fn a_20_digit_number_above_u64_max_stays_a_string() {
        stays_text("99999999999999999999");
    }

    #[test]
    fn a_23_digit_number_stays_a_string() {
        stays_text("12345678901234567890123");
    }

    #[test]
    fn an_integer_beyond_double_precision_is_still_an_exact_integer() {
        assert_eq!(plain("9007199254740993"), "9007199254740993");
    }

    #[test]
    fn a_17_digit_fraction_that_a_double_holds_is_a_number() {
        assert_eq!(plain("0.30000000000000004"), "0.30000000000000004");
    }

    #[test]
    fn a_power_of_ten_too_large_for_u64_is_a_double_in_exponent_notation() {
        assert_eq!(plain("1e20"), "1e+20");
        assert_eq!(plain("1E+30"), "1e+30");
    }

    #[test]
    fn a_small_power_of_ten_is_a_double_in_exponent_notation() {
        assert_eq!(plain("1e-7"), "1e-7");
        assert_eq!(plain("0.0000001"), "1e-7");
    }

    #[test]
    fn an_18_digit_fraction_stays_a_string() {
        stays_text("1.00000000000000001");
        stays_text("123456789.123456789");
    }

    #[test]
    fn an_exponent_outside_the_double_range_stays_a_string() {
        stays_text("1e-400");
        stays_text("1e400");
    }

    #[test]
    fn pi_to_36_digits_stays_a_string() {
        stays_text("3.14159265358979323846264338327950288");
    }

    #[test]
    fn text_that_is_not_a_number_stays_a_string() {
        for text in [
            "", ".", "abc", "1.2.3", "1ex", "1e", "1e+", "--1", "+-1", "1 2", "0x10", "e5",
        ] {
            stays_text(text);
        }
    }

    #[test]
    fn an_exponent_that_overflows_i64_stays_a_string() {
        stays_text("1e99999999999999999999");
        stays_text("0e9223372036854775808");
    }

    #[test]
    fn an_exponent_at_the_i64_limits_still_parses() {
        assert_eq!(plain("0e9223372036854775807"), "0");
        assert_eq!(plain("0e-9223372036854775808"), "0");
        stays_text("1e9223372036854775807");
        stays_text("1e-9223372036854775808");
    }

    #[test]
    fn zero_in_any_spelling_is_zero() {
        for text in [
            "0", "-0", "+0", "-0.000", "0e10", "-0E-5", ".0", "0.", "000",
        ] {
            assert_eq!(plain(text), "0", "{text:?}");
            assert_eq!(plain_number(text), PlainNumber::U64(0), "{text:?}");
        }
    }

    #[test]
    fn a_point_without_digits_on_one_side_parses() {
        assert_eq!(plain(".5"), "0.5");
        assert_eq!(plain("5."), "5");
        assert_eq!(plain("-.5"), "-0.5");
    }

    #[test]
    fn a_decimal_that_is_not_the_shortest_form_of_its_double_stays_a_string() {
        // Seventeen digits whose nearest doubles print as 0.1 and 0.3.
        stays_text("0.10000000000000001");
        stays_text("0.30000000000000001");
    }

    #[test]
    fn a_negative_integer_below_i64_min_can_still_be_an_exact_double() {
        assert_eq!(plain("-1e19"), "-1e+19");
        assert_eq!(plain("20000000000000000000"), "2e+19");
    }

    #[test]
    fn the_extremes_of_the_double_range_are_numbers() {
        assert_eq!(plain("1.7976931348623157e308"), "1.7976931348623157e+308");
        assert_eq!(plain("5e-324"), "5e-324");
        assert_eq!(
            plain("-2.2250738585072014e-308"),
            "-2.2250738585072014e-308"
        );
    }

    #[test]
    fn whitespace_inside_the_original_text_is_kept_when_it_stays_a_string() {
        assert_eq!(plain(" 1.2.3\n"), r#"" 1.2.3\n""#);
    }

    proptest::proptest! {
        #[test]
        fn the_fast_path_finds_the_same_double_as_the_parser(
            digits in "[1-9]([0-9]{0,13}[1-9])?",
            exponent in -22i64..=22,
        ) {
            let text = format!("{digits}e{exponent}");
            let decimal = Decimal::parse(text.as_bytes()).unwrap();
            let fast = exact_quotient(&decimal).unwrap();
            proptest::prop_assert_eq!(fast, parse_double(&decimal).unwrap());
            proptest::prop_assert_eq!(fast, text.parse::<f64>().unwrap());
        }
    }

    #[test]
    fn number_keeps_its_original_text() {
        let number = Number::new("012.50E+0");
        assert_eq!(number.as_str(), "012.50E+0");
        assert_eq!(number.to_string(), "012.50E+0");
    }
}
