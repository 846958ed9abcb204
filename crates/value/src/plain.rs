//! `value_format: plain` (docs/values.md §3.1): attribute values as ordinary JSON, and back (§3.4).
//!
//! `S` is a string, `N` follows the number rule ([`crate::plain_number`]) or, for a
//! destination that keeps decimals exactly, the exact rule (`exact`, §3.7), `B` is base64,
//! `BOOL` a boolean, `NULL` null, `L` and every set an array, `M` an object. Set-ness is not
//! visible; `typed` keeps it.

use crate::json::{write_array, write_base64, write_i64, write_object, write_str, write_u64};
use crate::number::{Classified, classify};
use crate::{Item, Number, Value};

/// Which rule plain output writes numbers by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbers {
    /// §3.2: a JSON number when a double holds it exactly, else the text as a string.
    Doubles,
    /// §3.7: every number a JSON number with its own digits.
    Exact,
}

impl Numbers {
    /// Writes one number text by this rule.
    pub(crate) fn write(self, text: &str, out: &mut Vec<u8>) {
        match self {
            Numbers::Doubles => write_number(text, out),
            Numbers::Exact => crate::exact::write_number(text, out),
        }
    }
}

pub(crate) fn write_item(item: &Item, numbers: Numbers, out: &mut Vec<u8>) {
    write_object(out, item, |out, value| write_value(value, numbers, out));
}

pub(crate) fn write_value(value: &Value, numbers: Numbers, out: &mut Vec<u8>) {
    match value {
        Value::S(text) => write_str(out, text),
        Value::N(number) => numbers.write(number.as_str(), out),
        Value::B(bytes) => write_base64(out, bytes),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Null => out.extend_from_slice(b"null"),
        Value::M(item) => write_item(item, numbers, out),
        Value::L(values) => write_array(out, values, |out, value| {
            write_value(value, numbers, out);
        }),
        Value::Ss(texts) => write_array(out, texts, |out, text| write_str(out, text)),
        Value::Ns(texts) => write_array(out, texts, |out, number| {
            numbers.write(number.as_str(), out);
        }),
        Value::Bs(blobs) => write_array(out, blobs, |out, bytes| write_base64(out, bytes)),
    }
}

/// Writes one number text by the number rule (§3.2).
pub(crate) fn write_number(text: &str, out: &mut Vec<u8>) {
    if is_plain_integer(text) || is_plain_decimal(text) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    match classify(text) {
        Classified::U64(value) => write_u64(out, value),
        Classified::I64(value) => write_i64(out, value),
        Classified::F64(_, shortest) => out.extend_from_slice(shortest.as_bytes()),
        Classified::Text => write_str(out, text),
    }
}

/// Whether `text` is `0`, or an optional `-` and 1 to 18 digits without a leading zero. The
/// number rule writes such a text as the integer it spells (steps 2 and 3: 18 digits fit both
/// `i64` and `u64`), which is the text itself, so it is copied without being parsed.
fn is_plain_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text).as_bytes();
    match digits {
        [b'0'] => digits.len() == text.len(),
        [b'1'..=b'9', rest @ ..] => rest.len() < 18 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// Significant digits that always come back from the nearest double unchanged (`f64::DIGITS`).
const ROUND_TRIP_DIGITS: usize = 15;

/// Whether `text` is a decimal the number rule writes as exactly itself: an optional `-`, then
/// `I.F` where `I` is `0` or up to 16 digits without a leading zero, `F` ends in a non-zero
/// digit, `0.F` has at most four zeros after the point, and there are at most 15 significant
/// digits. Why the output is the text:
/// 1. It is not an integer (step 3 does not apply) and not zero.
/// 2. With at most 15 significant digits, the nearest double's shortest round-trip decimal
///    has exactly these digits (step 4 keeps the double): two decimals of 15 digits never
///    share a double, and a shorter one would be one of them with trailing zeros.
/// 3. serde_json writes a double whose first digit has a decimal exponent in −5..=15 in fixed
///    notation, without exponent or trailing zeros: the text's own spelling.
fn is_plain_decimal(text: &str) -> bool {
    let unsigned = text.strip_prefix('-').unwrap_or(text).as_bytes();
    let Some(point) = unsigned.iter().position(|&byte| byte == b'.') else {
        return false;
    };
    let (whole, fraction) = (&unsigned[..point], &unsigned[point + 1..]);
    let all_digits = |part: &[u8]| part.iter().all(u8::is_ascii_digit);
    if !all_digits(whole) || !all_digits(fraction) || fraction.last().is_none_or(|&d| d == b'0') {
        return false;
    }
    let significant = match whole {
        [b'0'] => {
            let zeros = fraction.iter().take_while(|&&digit| digit == b'0').count();
            if zeros > 4 {
                return false;
            }
            fraction.len() - zeros
        }
        [b'1'..=b'9', ..] if whole.len() <= 16 => whole.len() + fraction.len(),
        _ => return false,
    };
    significant <= ROUND_TRIP_DIGITS
}

/// §3.4: a plain (YAML-derived) JSON value to an attribute value: null→NULL, bool→BOOL,
/// integer→N printed as integer, float→N in shortest round-trip form, string→S, array→L,
/// object→M.
///
/// Sets, binary and numbers beyond a double cannot be spelled this way; they need attribute
/// JSON ([`crate::value_from_typed_json`]).
pub fn value_from_plain_json(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(flag) => Value::Bool(*flag),
        // serde_json prints integers as integers and doubles in shortest round-trip form.
        serde_json::Value::Number(number) => Value::N(Number::new(number.to_string())),
        serde_json::Value::String(text) => Value::S(text.clone()),
        serde_json::Value::Array(values) => {
            Value::L(values.iter().map(value_from_plain_json).collect())
        }
        serde_json::Value::Object(entries) => Value::M(
            entries
                .iter()
                .map(|(key, value)| (key.clone(), value_from_plain_json(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ValueFormat;

    fn plain(value: &Value) -> String {
        let mut out = Vec::new();
        ValueFormat::Plain.write_value(value, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn n(text: &str) -> Value {
        Value::N(Number::new(text))
    }

    #[test]
    fn a_string_is_a_json_string() {
        assert_eq!(plain(&Value::S("a \"b\"\n".into())), r#""a \"b\"\n""#);
    }

    #[test]
    fn binary_is_a_base64_string() {
        assert_eq!(plain(&Value::B(vec![1, 2])), r#""AQI=""#);
        assert_eq!(plain(&Value::B(vec![0xff])), r#""/w==""#);
    }

    #[test]
    fn booleans_and_null_are_json_literals() {
        assert_eq!(plain(&Value::Bool(true)), "true");
        assert_eq!(plain(&Value::Bool(false)), "false");
        assert_eq!(plain(&Value::Null), "null");
    }

    #[test]
    fn sets_are_arrays_in_response_order() {
        assert_eq!(
            plain(&Value::Ss(vec!["b".into(), "a".into()])),
            r#"["b","a"]"#
        );
        let numbers = Value::Ns(vec![
            Number::new("1"),
            Number::new("1.5"),
            Number::new("1e99999"),
        ]);
        assert_eq!(plain(&numbers), r#"[1,1.5,"1e99999"]"#);
        assert_eq!(
            plain(&Value::Bs(vec![vec![1, 2], vec![0xff]])),
            r#"["AQI=","/w=="]"#
        );
        assert_eq!(plain(&Value::Ss(vec![])), "[]");
    }

    #[test]
    fn lists_and_maps_nest() {
        let inner: Item = [("z".to_owned(), Value::Null), ("a".to_owned(), n("2"))].into();
        let value = Value::L(vec![
            Value::M(inner),
            Value::L(vec![]),
            Value::M(Item::new()),
        ]);
        assert_eq!(plain(&value), r#"[{"a":2,"z":null},[],{}]"#);
    }

    #[test]
    fn an_item_is_one_compact_object_with_sorted_keys() {
        let item: Item = [
            ("price".to_owned(), n("12345678901234567890.123456789")),
            ("pk".to_owned(), Value::S("a".into())),
            ("blob".to_owned(), Value::B(vec![1])),
            ("tags".to_owned(), Value::Ss(vec!["x".into()])),
            ("count".to_owned(), n("3")),
        ]
        .into();
        let mut out = Vec::new();
        ValueFormat::Plain.write_item(&item, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"blob":"AQ==","count":3,"pk":"a","price":"12345678901234567890.123456789","tags":["x"]}"#
        );
    }

    #[test]
    fn integers_copied_as_they_are_follow_the_number_rule() {
        for text in [
            "0",
            "7",
            "-7",
            "120",
            "999999999999999999",
            "-999999999999999999",
            "-0",
            "007",
            "1000000000000000000",
            "+7",
        ] {
            let mut expected = Vec::new();
            match crate::plain_number(text) {
                crate::PlainNumber::U64(value) => write_u64(&mut expected, value),
                crate::PlainNumber::I64(value) => write_i64(&mut expected, value),
                other => panic!("{text} is {other:?}"),
            }
            assert_eq!(plain(&n(text)).as_bytes(), expected, "{text}");
        }
        assert!(is_plain_integer("-12"));
        assert!(!is_plain_integer("-0"));
        assert!(!is_plain_integer("1000000000000000000"));
        assert!(!is_plain_integer("1.0"));
        assert!(!is_plain_integer(""));
        assert!(!is_plain_integer("-"));
    }

    #[test]
    fn decimals_copied_as_they_are_follow_the_number_rule() {
        for text in [
            "0.1",
            "-0.5",
            "12.5",
            "0.00001",
            "0.000012345678901",
            "123456789012.345",
            "1234567890123456.5",
            "0.000001",
            "1.50",
            "12345678901234567.5",
            "1.0000000000000001",
            "01.5",
            "1.",
            ".5",
            "1.5e3",
        ] {
            let mut expected = Vec::new();
            match crate::number::classify(text) {
                Classified::F64(_, shortest) => expected.extend_from_slice(shortest.as_bytes()),
                Classified::Text => write_str(&mut expected, text),
                Classified::U64(value) => write_u64(&mut expected, value),
                Classified::I64(value) => write_i64(&mut expected, value),
            }
            assert_eq!(plain(&n(text)).as_bytes(), expected, "{text}");
        }
        assert!(is_plain_decimal("-0.00001"));
        assert!(!is_plain_decimal("0.000001"));
        assert!(!is_plain_decimal("1.50"));
        assert!(!is_plain_decimal("1234567890123.456"));
    }

    proptest::proptest! {
        #[test]
        fn every_decimal_copied_as_it_is_is_what_the_number_rule_writes(
            text in "-?(0|[1-9][0-9]{0,16})\\.0{0,5}[0-9]{0,14}[1-9]",
        ) {
            if is_plain_decimal(&text) {
                let Classified::F64(_, shortest) = crate::number::classify(&text) else {
                    panic!("{text} is not a double");
                };
                proptest::prop_assert_eq!(shortest.as_bytes(), text.as_bytes());
            }
        }
    }

    #[test]
    fn writing_appends_to_what_the_buffer_already_holds() {
        let mut out = b"line 1\n".to_vec();
        ValueFormat::Plain.write_value(&Value::Bool(true), &mut out);
        assert_eq!(out, b"line 1\ntrue");
    }

    #[test]
    fn plain_json_becomes_attribute_values() {
        let json = json!({
            "nothing": null,
            "flag": true,
            "count": 42,
            "negative": -7,
            "big": u64::MAX,
            "ratio": 0.1,
            "huge": 1e20,
            "whole": 3.0,
            "name": "x",
            "list": [1, "a"],
            "map": {"k": false},
        });
        let expected: Item = [
            ("nothing".to_owned(), Value::Null),
            ("flag".to_owned(), Value::Bool(true)),
            ("count".to_owned(), n("42")),
            ("negative".to_owned(), n("-7")),
            ("big".to_owned(), n("18446744073709551615")),
            ("ratio".to_owned(), n("0.1")),
            ("huge".to_owned(), n("1e+20")),
            ("whole".to_owned(), n("3.0")),
            ("name".to_owned(), Value::S("x".into())),
            (
                "list".to_owned(),
                Value::L(vec![n("1"), Value::S("a".into())]),
            ),
            (
                "map".to_owned(),
                Value::M([("k".to_owned(), Value::Bool(false))].into()),
            ),
        ]
        .into();
        assert_eq!(value_from_plain_json(&json), Value::M(expected));
    }
}
