//! The exact number rule (docs/values.md §3.7): every number a JSON number with its own
//! digits, for readers that keep decimals exactly (PostgreSQL's `json` and `jsonb`, whose
//! numbers are `numeric`), so that one attribute has one JSON type in every item.
//!
//! # The rule
//! 1. Parse as §3.2 step 1: trim ASCII whitespace; optional `+`/`-`; digits with at most one
//!    `.` and at least one digit; optional `e`/`E` exponent whose signed digits fit `i64`.
//!    Text that does not parse is written as the original text, a JSON string (as §3.2).
//! 2. Zero in any spelling is `0`, never negative zero.
//! 3. Any other number is written with its own digits, respelled only where JSON's grammar
//!    differs: no `+`, no leading zeros before the point (`0` when nothing is left), no point
//!    without digits after it; the fraction (trailing zeros included) and the exponent stay as
//!    written. A text DynamoDB sends is already in that grammar and comes out unchanged
//!    (`1.50`, `1E+125`, `1E-130`, 38 digits).
//!
//! # Cost
//! One pass over the text, nothing allocated, no floating point.

use crate::json::write_str;
use crate::number::{parse_exponent, split_digits};

/// Writes one number text by the exact rule.
pub(crate) fn write_number(text: &str, out: &mut Vec<u8>) {
    let unsigned = text.as_bytes().trim_ascii();
    let (negative, unsigned) = match unsigned.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, unsigned),
    };
    let (integer, rest) = split_digits(unsigned);
    let (fraction, rest) = match rest.split_first() {
        Some((b'.', after)) => split_digits(after),
        _ => (&[][..], rest),
    };
    let exponent = match rest.split_first() {
        None => None,
        Some((b'e' | b'E', digits)) if parse_exponent(digits).is_some() => Some(rest),
        Some(_) => None,
    };
    if (integer.is_empty() && fraction.is_empty()) || (!rest.is_empty() && exponent.is_none()) {
        write_str(out, text);
        return;
    }
    let significant = |part: &[u8]| part.iter().any(|&digit| digit != b'0');
    if !significant(integer) && !significant(fraction) {
        out.push(b'0');
        return;
    }
    if negative {
        out.push(b'-');
    }
    let leading = integer.iter().take_while(|&&digit| digit == b'0').count();
    match &integer[leading..] {
        [] => out.push(b'0'),
        digits => out.extend_from_slice(digits),
    }
    if !fraction.is_empty() {
        out.push(b'.');
        out.extend_from_slice(fraction);
    }
    if let Some(exponent) = exponent {
        out.extend_from_slice(exponent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(text: &str) -> String {
        let mut out = Vec::new();
        write_number(text, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn dynamodb_texts_come_out_unchanged_as_json_numbers() {
        for text in [
            "12345678901234567890123456789012345678",
            "-9.9999999999999999999999999999999999999E+125",
            "1E-130",
            "1e-130",
            "1E+125",
            "1.50",
            "0.1",
            "18446744073709551616",
            "3.14159265358979323846264338327950288",
            "-0.000123",
            "7",
        ] {
            assert_eq!(exact(text), text);
            let parsed: serde_json::Value = serde_json::from_str(&exact(text)).unwrap();
            assert!(parsed.is_number(), "{text}");
        }
    }

    #[test]
    fn other_spellings_are_respelled_in_json_grammar_keeping_their_digits() {
        let cases = [
            ("+7", "7"),
            (" 7 ", "7"),
            ("0012", "12"),
            ("00.50", "0.50"),
            (".5", "0.5"),
            ("5.", "5"),
            ("-.25e3", "-0.25e3"),
            ("1.0E+05", "1.0E+05"),
        ];
        for (text, want) in cases {
            assert_eq!(exact(text), want, "{text:?}");
            let parsed: serde_json::Value = serde_json::from_str(want).unwrap();
            assert!(parsed.is_number(), "{want}");
        }
    }

    #[test]
    fn zero_in_any_spelling_is_zero() {
        for text in ["0", "-0", "-0.000", "+0e5", ".0", "0."] {
            assert_eq!(exact(text), "0", "{text:?}");
        }
    }

    #[test]
    fn text_that_is_not_a_number_stays_a_string() {
        for text in [
            "",
            ".",
            "abc",
            "1.2.3",
            "1ex",
            "1e",
            "--1",
            "1e99999999999999999999",
        ] {
            assert_eq!(
                exact(text),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }
}
