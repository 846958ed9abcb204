//! `value_format: typed` (docs/values.md §3.3): every attribute as DynamoDB attribute JSON.
//!
//! `{"S":s}`, `{"N":"<original text>"}`, `{"B":"<base64>"}`, `{"BOOL":b}`, `{"NULL":true}`,
//! `{"SS":[…]}`, `{"NS":["<text>",…]}`, `{"BS":["<base64>",…]}`, `{"L":[…]}`, `{"M":{…}}`.
//! Numbers keep every digit and their spelling, so this form round-trips exactly; scan cursors
//! are always stored in it. The writer here is the hot path; the `serde_json::Value` builders
//! are for state files. Decoding is in `decode`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Map;

use crate::json::{write_array, write_base64, write_object, write_str};
use crate::{Item, Value};

pub(crate) fn write_item(item: &Item, out: &mut Vec<u8>) {
    write_object(out, item, |out, value| write_value(value, out));
}

pub(crate) fn write_value(value: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"");
    out.extend_from_slice(value.type_tag().as_bytes());
    out.extend_from_slice(b"\":");
    match value {
        Value::S(text) => write_str(out, text),
        Value::N(number) => write_str(out, number.as_str()),
        Value::B(bytes) => write_base64(out, bytes),
        Value::Bool(true) | Value::Null => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::M(item) => write_item(item, out),
        Value::L(values) => write_array(out, values, |out, value| write_value(value, out)),
        Value::Ss(texts) => write_array(out, texts, |out, text| write_str(out, text)),
        Value::Ns(numbers) => {
            write_array(out, numbers, |out, number| write_str(out, number.as_str()));
        }
        Value::Bs(blobs) => write_array(out, blobs, |out, bytes| write_base64(out, bytes)),
    }
    out.push(b'}');
}

/// An item as attribute JSON (§3.3): an object whose values are `{"S":..}` and so on. Used for
/// scan cursors stored in state files; output lines use [`crate::ValueFormat::write_item`].
pub fn item_to_typed_json(item: &Item) -> serde_json::Value {
    serde_json::Value::Object(typed_map(item))
}

/// One value as attribute JSON (§3.3), such as `{"N":"1.50"}`.
pub fn value_to_typed_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as Json;

    let strings = |texts: &mut dyn Iterator<Item = &str>| {
        Json::Array(texts.map(|text| Json::String(text.to_owned())).collect())
    };
    let payload = match value {
        Value::S(text) => Json::String(text.clone()),
        Value::N(number) => Json::String(number.as_str().to_owned()),
        Value::B(bytes) => Json::String(STANDARD.encode(bytes)),
        Value::Bool(flag) => Json::Bool(*flag),
        Value::Null => Json::Bool(true),
        Value::M(item) => Json::Object(typed_map(item)),
        Value::L(values) => Json::Array(values.iter().map(value_to_typed_json).collect()),
        Value::Ss(texts) => strings(&mut texts.iter().map(String::as_str)),
        Value::Ns(numbers) => strings(&mut numbers.iter().map(|number| number.as_str())),
        Value::Bs(blobs) => Json::Array(
            blobs
                .iter()
                .map(|bytes| Json::String(STANDARD.encode(bytes)))
                .collect(),
        ),
    };
    let mut tagged = Map::new();
    tagged.insert(value.type_tag().to_owned(), payload);
    Json::Object(tagged)
}

fn typed_map(item: &Item) -> Map<String, serde_json::Value> {
    item.iter()
        .map(|(key, value)| (key.clone(), value_to_typed_json(value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Number, ValueFormat};

    fn typed(value: &Value) -> String {
        let mut out = Vec::new();
        ValueFormat::Typed.write_value(value, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// Every attribute type, with its typed text.
    fn every_type() -> Vec<(Value, &'static str)> {
        vec![
            (Value::S("a\"b".into()), r#"{"S":"a\"b"}"#),
            (Value::N(Number::new("012.50E+0")), r#"{"N":"012.50E+0"}"#),
            (Value::B(vec![1, 2]), r#"{"B":"AQI="}"#),
            (Value::Bool(true), r#"{"BOOL":true}"#),
            (Value::Bool(false), r#"{"BOOL":false}"#),
            (Value::Null, r#"{"NULL":true}"#),
            (
                Value::M(
                    [
                        ("b".to_owned(), Value::Null),
                        ("a".to_owned(), Value::Bool(false)),
                    ]
                    .into(),
                ),
                r#"{"M":{"a":{"BOOL":false},"b":{"NULL":true}}}"#,
            ),
            (
                Value::L(vec![Value::S("x".into()), Value::L(vec![])]),
                r#"{"L":[{"S":"x"},{"L":[]}]}"#,
            ),
            (
                Value::Ss(vec!["b".into(), "a".into()]),
                r#"{"SS":["b","a"]}"#,
            ),
            (
                Value::Ns(vec![
                    Number::new("1"),
                    Number::new("123456789012345678901234567"),
                ]),
                r#"{"NS":["1","123456789012345678901234567"]}"#,
            ),
            (Value::Bs(vec![vec![0xff], vec![]]), r#"{"BS":["/w==",""]}"#),
        ]
    }

    #[test]
    fn the_spec_example_is_written_byte_for_byte() {
        let item: Item = [
            ("pk".to_owned(), Value::S("a".into())),
            (
                "price".to_owned(),
                Value::N(Number::new("12345678901234567890.123456789")),
            ),
            ("tags".to_owned(), Value::Ss(vec!["x".into()])),
            ("blob".to_owned(), Value::B(vec![1])),
        ]
        .into();
        let mut out = Vec::new();
        ValueFormat::Typed.write_item(&item, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"blob":{"B":"AQ=="},"pk":{"S":"a"},"price":{"N":"12345678901234567890.123456789"},"tags":{"SS":["x"]}}"#
        );
    }

    #[test]
    fn every_attribute_type_is_written_as_attribute_json() {
        for (value, expected) in every_type() {
            assert_eq!(typed(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn the_json_builders_agree_with_the_writer_for_every_type() {
        for (value, expected) in every_type() {
            let built = value_to_typed_json(&value);
            assert_eq!(
                serde_json::to_string(&built).unwrap(),
                expected,
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_typed_item_is_an_object_of_attribute_json() {
        let item: Item = [
            (
                "pk".to_owned(),
                Value::N(Number::new("123456789012345678901")),
            ),
            ("sk".to_owned(), Value::S("x".into())),
        ]
        .into();
        assert_eq!(
            item_to_typed_json(&item),
            json!({"pk": {"N": "123456789012345678901"}, "sk": {"S": "x"}})
        );
        assert_eq!(item_to_typed_json(&Item::new()), json!({}));
    }
}
