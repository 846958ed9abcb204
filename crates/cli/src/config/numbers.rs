//! The text of the YAML numbers in `expression_attribute_values`, so they are sent exactly.
//!
//! `yaml_serde` reads a plain scalar like `1.00000000000000001` or a 42-digit integer as a
//! double, which has already lost digits: a filter sent with it silently misses the items it
//! should match. DynamoDB numbers are decimal text of up to 38 significant digits, so the value
//! is sent from the scalar's own text instead.
//!
//! # Rules
//! 1. An integer that fits `i64`/`u64` is exact as parsed.
//! 2. Any other number is sent from its text, read from the file by a second, guided pass
//!    over the same YAML (or from the `${…}` substitution it came from), when that text is a
//!    plain decimal (`-12.5`, `1e3`) of at most 38 significant digits.
//! 3. Otherwise (`.inf`, `.nan`, hexadecimal beyond 64 bits, more than 38 digits, or a number
//!    whose text is not known, such as one brought in by a `<<` merge) it is refused, naming
//!    the field and pointing at `expression_attribute_values_typed`. So is an integer between
//!    64 and 128 bits, which the YAML parser refuses for the whole file: that error is turned
//!    into one naming the field.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use yaml_serde::Value;

use crate::yaml::fields::join;

/// DynamoDB's precision.
const MAX_SIGNIFICANT_DIGITS: usize = 38;

/// The text of every number under `source.expression_attribute_values` of `document` (the
/// file as parsed, before merges), by path; empty when rule 1 covers them all.
pub(super) fn texts(text: &str, document: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let values = document
        .get("source")
        .and_then(|source| source.get("expression_attribute_values"));
    if values.is_some_and(has_inexact_number) {
        let node = Node {
            guide: document,
            path: String::new(),
            out: &mut out,
        };
        // The text parsed once already: a second pass over it cannot fail differently.
        let _ = node.deserialize(yaml_serde::Deserializer::from_str(text));
    }
    out
}

/// The path and an actionable message for a YAML parse error about an integer wider than 64
/// bits (`yaml_serde` refuses those for the whole file), `None` for any other error.
pub(super) fn wide_integer(error: &str) -> Option<(String, String)> {
    let (path, rest) = error.split_once(": invalid type: integer `")?;
    let (digits, rest) = rest.split_once('`')?;
    if !(rest.starts_with(" as u128") || rest.starts_with(" as i128")) {
        return None;
    }
    // Only an expression value can hold such a number; every other field has a range far below.
    let message = if path.contains("expression_attribute_values") {
        format!(
            "the integer {digits} is wider than 64 bits, which plain YAML values cannot hold; write it as text in expression_attribute_values_typed, e.g. {{\":v\": {{N: \"{digits}\"}}}}"
        )
    } else {
        format!(
            "the integer {digits} is far out of range (wider than 64 bits): see the field's range in docs/config.md"
        )
    };
    Some((path.to_string(), message))
}

/// Whether `value` holds a number outside rule 1.
fn has_inexact_number(value: &Value) -> bool {
    match value {
        Value::Number(number) => !(number.is_u64() || number.is_i64()),
        Value::Sequence(items) => items.iter().any(has_inexact_number),
        Value::Mapping(mapping) => mapping.values().any(has_inexact_number),
        _ => false,
    }
}

/// The DynamoDB number for a YAML number at `path` (rules 1–3), or why it has none.
pub(super) fn exact(number: &yaml_serde::Number, text: Option<&str>) -> Result<String, String> {
    if let Some(unsigned) = number.as_u64() {
        return Ok(unsigned.to_string());
    }
    if let Some(signed) = number.as_i64() {
        return Ok(signed.to_string());
    }
    let remedy =
        "write it as text in expression_attribute_values_typed, e.g. {\":v\": {N: \"12.5\"}}";
    let Some(text) = text else {
        return Err(format!(
            "the number {number} cannot be sent exactly (its text is not known here); {remedy}"
        ));
    };
    let text = text.trim();
    match significant_digits(text) {
        None => Err(format!(
            "{text} is not a decimal number DynamoDB accepts; {remedy}"
        )),
        Some(digits) if digits > MAX_SIGNIFICANT_DIGITS => Err(format!(
            "{text} has {digits} significant digits and DynamoDB numbers have at most \
             {MAX_SIGNIFICANT_DIGITS}; {remedy}"
        )),
        Some(_) => Ok(text.strip_prefix('+').unwrap_or(text).to_string()),
    }
}

/// The significant digits of a plain decimal (`[+-]digits[.digits][e[+-]digits]`), `None` if
/// `text` is not one.
fn significant_digits(text: &str) -> Option<usize> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (unsigned, None),
    };
    if let Some(exponent) = exponent {
        let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !all(whole) || !all(fraction) {
        return None;
    }
    let digits: String = format!("{whole}{fraction}");
    let trimmed = digits.trim_start_matches('0').trim_end_matches('0');
    Some(trimmed.len().max(1))
}

/// One node of the guided pass: the parsed value says what the same node of the text is.
struct Node<'g, 'o> {
    guide: &'g Value,
    path: String,
    out: &'o mut BTreeMap<String, String>,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.guide {
            // A scalar read as a string is its text as written.
            Value::Number(_) => {
                let text = String::deserialize(deserializer)?;
                self.out.insert(self.path, text);
                Ok(())
            }
            Value::Mapping(_) => deserializer.deserialize_map(self),
            Value::Sequence(_) => deserializer.deserialize_seq(self),
            _ => deserializer.deserialize_ignored_any(IgnoredAny).map(|_| ()),
        }
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the same YAML as the first pass")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Value::Mapping(mapping) = self.guide else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<Value>()? {
            match (&key, mapping.get(&key)) {
                (Value::String(name), Some(child)) => map.next_value_seed(Node {
                    guide: child,
                    path: join(&self.path, name),
                    out: &mut *self.out,
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Value::Sequence(items) = self.guide else {
            return Ok(());
        };
        let mut index = 0;
        loop {
            let seed = match items.get(index) {
                Some(child) => Node {
                    guide: child,
                    path: format!("{}[{index}]", self.path),
                    out: &mut *self.out,
                },
                None => {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    return Ok(());
                }
            };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> BTreeMap<String, String> {
        let document: Value = yaml_serde::from_str(text).unwrap_or_default();
        texts(text, &document)
    }

    #[test]
    fn the_guided_pass_finds_the_text_of_each_inexact_number_by_path() {
        let found = parsed(
            "name: x\nsource:\n  expression_attribute_values:\n    ':a': 123456789.123456789\n    \
             ':b': [1, 1.00000000000000001, {c: 123456789012345678901234567890123456789012}]\n    \
             ':i': 7\n",
        );
        let values = "source.expression_attribute_values";
        assert_eq!(found[&format!("{values}.:a")], "123456789.123456789");
        assert_eq!(found[&format!("{values}.:b[1]")], "1.00000000000000001");
        assert_eq!(
            found[&format!("{values}.:b[2].c")],
            "123456789012345678901234567890123456789012"
        );
        assert_eq!(found[&format!("{values}.:i")], "7");
    }

    #[test]
    fn integers_that_fit_need_no_second_pass() {
        assert!(parsed("source:\n  expression_attribute_values: {':a': 1, ':b': -2}\n").is_empty());
    }

    #[test]
    fn exact_numbers_come_from_their_text_or_are_refused() {
        let double = |text: &str| -> yaml_serde::Number {
            yaml_serde::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.as_f64())
                .map(yaml_serde::Number::from)
                .unwrap_or_else(|| yaml_serde::Number::from(0.5))
        };
        for text in [
            "123456789.123456789",
            "1.00000000000000001",
            "-0.5",
            "1e3",
            "99999999999999999999",
        ] {
            assert_eq!(exact(&double(text), Some(text)).as_deref(), Ok(text));
        }
        assert_eq!(exact(&double("+2.5"), Some("+2.5")).as_deref(), Ok("2.5"));
        let long = "123456789012345678901234567890123456789012";
        let refused = exact(&double(long), Some(long)).unwrap_err();
        assert!(refused.contains("42 significant digits"), "{refused}");
        assert!(
            refused.contains("expression_attribute_values_typed"),
            "{refused}"
        );
        for text in [".inf", ".nan", "0x1p3"] {
            let refused = exact(&double("0.5"), Some(text)).unwrap_err();
            assert!(
                refused.contains("is not a decimal number"),
                "{text}: {refused}"
            );
        }
        let unknown = exact(&double("0.5"), None).unwrap_err();
        assert!(unknown.contains("cannot be sent exactly"), "{unknown}");
        assert_eq!(
            exact(&yaml_serde::Number::from(7u64), None).as_deref(),
            Ok("7")
        );
    }
}
