//! Property tests for the JSON forms: typed round trips, the number rule never losing a digit,
//! and plain output always being valid, compact, sorted JSON.

use std::collections::BTreeMap;

use ddbpipe_value::{
    Number, PlainNumber, Value, ValueFormat, item_from_typed_json, item_to_typed_json,
    plain_number, value_from_typed_json, value_to_typed_json,
};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::json;

use strategies::{item, number_text};

mod strategies;

// ---- an independent reference for §3.2 step 1, built on strings ----

/// A number text reduced to (negative, D, E); zero is `(false, "", 0)`. `None` if it does not
/// parse.
fn reduce(text: &str) -> Option<(bool, String, i128)> {
    let text = text.trim_matches(|c: char| c.is_ascii_whitespace());
    let (negative, text) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if !all_digits(integer) || !all_digits(fraction) || integer.len() + fraction.len() == 0 {
        return None;
    }
    let digits = format!("{integer}{fraction}");
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let trimmed = significant.trim_end_matches('0');
    let trailing = significant.len() - trimmed.len();
    let exponent = i128::from(exponent) - fraction.len() as i128 + trailing as i128;
    Some((negative, trimmed.to_owned(), exponent))
}

fn plain(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ValueFormat::Plain.write_value(value, &mut out);
    out
}

/// What the plain output of a value must be, built from serde_json values: serialising it
/// gives compact JSON, sorted keys and serde_json's own escaping.
fn expected_plain(value: &Value) -> serde_json::Value {
    use base64::Engine;
    let base64 = |bytes: &Vec<u8>| {
        serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let number = |number: &Number| match plain_number(number.as_str()) {
        PlainNumber::U64(value) => json!(value),
        PlainNumber::I64(value) => json!(value),
        PlainNumber::F64(value) => json!(value),
        PlainNumber::Text => json!(number.as_str()),
    };
    match value {
        Value::S(text) => json!(text),
        Value::N(n) => number(n),
        Value::B(bytes) => base64(bytes),
        Value::Bool(flag) => json!(flag),
        Value::Null => serde_json::Value::Null,
        Value::M(item) => serde_json::Value::Object(
            item.iter()
                .map(|(key, value)| (key.clone(), expected_plain(value)))
                .collect(),
        ),
        Value::L(values) => values.iter().map(expected_plain).collect(),
        Value::Ss(texts) => json!(texts),
        Value::Ns(numbers) => numbers.iter().map(number).collect(),
        Value::Bs(blobs) => blobs.iter().map(base64).collect(),
    }
}

/// Every object's keys in the order the JSON text lists them, checked to be ascending.
fn keys_are_sorted(json: &serde_json::Value) -> bool {
    match json {
        serde_json::Value::Object(entries) => {
            let keys: Vec<&String> = entries.keys().collect();
            keys.windows(2)
                .all(|pair| pair[0].as_bytes() < pair[1].as_bytes())
                && entries.values().all(keys_are_sorted)
        }
        serde_json::Value::Array(values) => values.iter().all(keys_are_sorted),
        _ => true,
    }
}

proptest! {
    #[test]
    fn a_typed_item_round_trips_exactly(item in item()) {
        let json = item_to_typed_json(&item);
        prop_assert_eq!(item_from_typed_json(&json, "item"), Ok(item.clone()));

        let mut out = Vec::new();
        ValueFormat::Typed.write_item(&item, &mut out);
        let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        prop_assert_eq!(&parsed, &json);
        prop_assert_eq!(out, serde_json::to_vec(&json).unwrap());
    }

    #[test]
    fn plain_output_is_valid_compact_json_with_sorted_keys(item in item()) {
        let mut out = Vec::new();
        ValueFormat::Plain.write_item(&item, &mut out);
        let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        prop_assert!(parsed.is_object());
        prop_assert!(keys_are_sorted(&parsed));
        let expected = expected_plain(&Value::M(item));
        prop_assert_eq!(
            String::from_utf8(out).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
    }

    #[test]
    fn decoding_accepts_only_what_encoding_produces(json in typed_json_ish()) {
        if let Ok(value) = value_from_typed_json(&json, "v") {
            prop_assert_eq!(value_to_typed_json(&value), json);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8192))]

    #[test]
    fn plain_never_loses_a_digit(text in number_text()) {
        let out = String::from_utf8(plain(&Value::N(Number::new(text.as_str())))).unwrap();
        if out.starts_with('"') {
            prop_assert_eq!(out, serde_json::to_string(&text).unwrap());
        } else {
            let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
            prop_assert!(parsed.is_number(), "{}", out);
            prop_assert!(reduce(&text).is_some(), "{:?} is not a number, yet gave {}", text, out);
            prop_assert_eq!(reduce(&out), reduce(&text), "{:?} became {}", text, out);
            prop_assert_ne!(out, "-0");
        }
    }

    /// docs/values.md §3.7: a number text that parses is always a JSON number, of the same
    /// value and with the same digits after the point; one that does not stays a string.
    #[test]
    fn the_exact_rule_writes_every_number_as_a_json_number_of_its_value(text in number_text()) {
        let mut out = Vec::new();
        ValueFormat::PlainExact.write_value(&Value::N(Number::new(text.as_str())), &mut out);
        let out = String::from_utf8(out).unwrap();
        match reduce(&text) {
            None => prop_assert_eq!(out, serde_json::to_string(&text).unwrap()),
            Some(reduced) => {
                let parsed: Result<serde_json::Value, _> = serde_json::from_str(&out);
                let is_number = parsed.as_ref().is_ok_and(serde_json::Value::is_number);
                // serde_json refuses exponents past a double's range; the grammar does not.
                let past_doubles = parsed.is_err() && out.contains(['e', 'E']);
                prop_assert!(is_number || past_doubles, "{:?} became {}", text, out);
                prop_assert_eq!(reduce(&out), Some(reduced.clone()), "{:?} became {}", text, out);
                let fraction = |t: &str| {
                    t.trim().split(['e', 'E']).next().and_then(|m| m.split_once('.'))
                        .map(|(_, f)| f.to_string()).unwrap_or_default()
                };
                if reduced.1.is_empty() {
                    prop_assert_eq!(out, "0");
                } else {
                    prop_assert_eq!(fraction(&out), fraction(&text), "{:?} became {}", text, out);
                }
            }
        }
    }

    #[test]
    fn exact_numbers_do_not_needlessly_become_strings(text in number_text()) {
        let Some((negative, digits, exponent)) = reduce(&text) else { return Ok(()); };
        let len = digits.len() as i128;
        let decision = plain_number(&text);
        if exponent >= 0 && len + exponent <= 20 {
            // Step 3: an integer whenever it fits.
            let magnitude: u128 = format!("{digits}{}", "0".repeat(exponent as usize))
                .parse()
                .unwrap_or(0);
            if negative {
                if let Ok(value) = i64::try_from(-(magnitude as i128)) {
                    prop_assert_eq!(decision, PlainNumber::I64(value));
                }
            } else if let Ok(value) = u64::try_from(magnitude) {
                prop_assert_eq!(decision, PlainNumber::U64(value));
            }
        }
        // At most 15 significant digits in the normal double range: a double holds them, and
        // they are its shortest form.
        if (1..=15).contains(&len) && (-300..=300).contains(&(len + exponent)) {
            prop_assert_ne!(decision, PlainNumber::Text, "{:?}", text);
        }
    }
}

/// JSON shaped like attribute JSON, often slightly wrong.
fn typed_json_ish() -> impl Strategy<Value = serde_json::Value> {
    let tag = prop_oneof![
        Just("S"),
        Just("N"),
        Just("B"),
        Just("BOOL"),
        Just("NULL"),
        Just("SS"),
        Just("NS"),
        Just("BS"),
        Just("L"),
        Just("M"),
        Just("X"),
    ];
    let scalar = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i32>().prop_map(|number| json!(number)),
        prop_oneof!["[A-Za-z0-9+/=]{0,8}", "[0-9.]{0,4}"].prop_map(serde_json::Value::String),
    ];
    let payload = scalar.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3).prop_map(serde_json::Value::Array),
            btree_map("[a-b]", inner, 0..3).prop_map(
                |entries: BTreeMap<String, serde_json::Value>| {
                    serde_json::Value::Object(entries.into_iter().collect())
                }
            ),
        ]
    });
    btree_map(tag.prop_map(str::to_owned), payload, 0..3)
        .prop_map(|entries| serde_json::Value::Object(entries.into_iter().collect()))
}
