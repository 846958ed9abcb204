//! Strict decoding of attribute JSON (docs/values.md §3.5), for typed cursors and typed expression values.
//!
//! # Rules
//! 1. A value is an object with exactly one key, and that key is a known type tag.
//! 2. The payload has the tag's type: `S`/`N` strings, `B` valid padded standard base64,
//!    `BOOL` a boolean, `NULL` the boolean `true` (DynamoDB rejects `false` as well),
//!    `SS`/`NS` arrays of strings, `BS` an array of base64 strings, `L` an array of attribute
//!    JSON, `M` an object of attribute JSON.
//! 3. Anything else is a [`DecodeError`] naming where it sits: the caller's path, extended with
//!    `.key` for a map entry and `[i]` for a list or set element.
//!
//! `N` text is not checked here: it is kept exactly, as the typed format writes it.
//!
//! # Error paths
//! The path is only rendered when decoding fails, so a valid document allocates nothing for it.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value as Json;

use crate::{Item, Number, Value};

/// Attribute JSON that breaks the rules of docs/values.md §3.5.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed typed attribute value at {path}: {problem}")]
pub struct DecodeError {
    /// Where the value sits, such as `cursors.3.pk` or `source.expression_attribute_values_typed.:k[2]`.
    pub path: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Decodes an object of attribute JSON (`{"pk":{"S":"a"}}`) into an item.
///
/// `path` names where the object sits (e.g. `"cursors.3"`); each attribute is reported as
/// `<path>.<name>`.
pub fn item_from_typed_json(json: &serde_json::Value, path: &str) -> Result<Item, DecodeError> {
    let path = Path::Root(path);
    match json {
        Json::Object(entries) => decode_map(entries, &path),
        other => Err(path.error(format!(
            "expected an object of attribute values, found {}",
            kind(other)
        ))),
    }
}

/// Decodes one attribute JSON value (`{"N":"1.50"}`).
///
/// `path` names where the value sits (e.g. `"source.expression_attribute_values_typed.:k"`) and
/// is extended with `.key` / `[i]` for an error inside it.
pub fn value_from_typed_json(json: &serde_json::Value, path: &str) -> Result<Value, DecodeError> {
    decode_value(json, &Path::Root(path))
}

fn decode_map(
    entries: &serde_json::Map<String, Json>,
    path: &Path<'_>,
) -> Result<Item, DecodeError> {
    entries
        .iter()
        .map(|(key, value)| Ok((key.clone(), decode_value(value, &Path::Key(path, key))?)))
        .collect()
}

fn decode_value(json: &Json, path: &Path<'_>) -> Result<Value, DecodeError> {
    let Json::Object(tagged) = json else {
        return Err(path.error(format!(
            "expected an object with one type tag, found {}",
            kind(json)
        )));
    };
    let mut entries = tagged.iter();
    let (Some((tag, payload)), None) = (entries.next(), entries.next()) else {
        return Err(path.error(format!(
            "expected an object with one type tag, found {} keys",
            tagged.len()
        )));
    };
    let wrong_payload = |expected: &str| {
        path.error(format!(
            "the {tag:?} payload must be {expected}, found {}",
            kind(payload)
        ))
    };
    let value = match (tag.as_str(), payload) {
        ("S", Json::String(text)) => Value::S(text.clone()),
        ("N", Json::String(text)) => Value::N(Number::new(text.as_str())),
        ("B", Json::String(text)) => Value::B(decode_base64(text, path)?),
        ("BOOL", Json::Bool(flag)) => Value::Bool(*flag),
        ("NULL", Json::Bool(true)) => Value::Null,
        ("NULL", Json::Bool(false)) => {
            return Err(path.error("the \"NULL\" payload must be true, found false".to_owned()));
        }
        ("SS", Json::Array(elements)) => Value::Ss(decode_elements(elements, path, |text, _| {
            Ok(text.to_owned())
        })?),
        ("NS", Json::Array(elements)) => Value::Ns(decode_elements(elements, path, |text, _| {
            Ok(Number::new(text))
        })?),
        ("BS", Json::Array(elements)) => Value::Bs(decode_elements(elements, path, decode_base64)?),
        ("L", Json::Array(elements)) => Value::L(
            elements
                .iter()
                .enumerate()
                .map(|(index, element)| decode_value(element, &Path::Index(path, index)))
                .collect::<Result<_, _>>()?,
        ),
        ("M", Json::Object(entries)) => Value::M(decode_map(entries, path)?),
        ("S" | "N" | "B", _) => return Err(wrong_payload("a string")),
        ("BOOL", _) => return Err(wrong_payload("a boolean")),
        ("NULL", _) => return Err(wrong_payload("true")),
        ("SS" | "NS", _) => return Err(wrong_payload("an array of strings")),
        ("BS", _) => return Err(wrong_payload("an array of base64 strings")),
        ("L", _) => return Err(wrong_payload("an array")),
        ("M", _) => return Err(wrong_payload("an object")),
        (unknown, _) => return Err(path.error(format!("unknown type tag {unknown:?}"))),
    };
    Ok(value)
}

/// Decodes the string elements of a set, reporting element `i` as `<path>[i]`.
fn decode_elements<T>(
    elements: &[Json],
    path: &Path<'_>,
    decode: impl Fn(&str, &Path<'_>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    elements
        .iter()
        .enumerate()
        .map(|(index, element)| {
            let path = Path::Index(path, index);
            match element {
                Json::String(text) => decode(text, &path),
                other => Err(path.error(format!("expected a string, found {}", kind(other)))),
            }
        })
        .collect()
}

fn decode_base64(text: &str, path: &Path<'_>) -> Result<Vec<u8>, DecodeError> {
    STANDARD
        .decode(text)
        .map_err(|error| path.error(format!("the payload is not valid padded base64: {error}")))
}

fn kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// Where a value sits, as a chain back to the caller's path; rendered only for an error.
enum Path<'a> {
    Root(&'a str),
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn error(&self, problem: String) -> DecodeError {
        DecodeError {
            path: self.to_string(),
            problem,
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root(root) => f.write_str(root),
            Path::Key(Path::Root(""), key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn problem_at(json: Json, path: &str) -> DecodeError {
        value_from_typed_json(&json, path).unwrap_err()
    }

    #[test]
    fn every_attribute_type_decodes() {
        let cases = [
            (json!({"S": "a"}), Value::S("a".into())),
            (json!({"N": "012.50"}), Value::N(Number::new("012.50"))),
            (json!({"B": "AQI="}), Value::B(vec![1, 2])),
            (json!({"BOOL": false}), Value::Bool(false)),
            (json!({"NULL": true}), Value::Null),
            (
                json!({"M": {"k": {"S": "v"}}}),
                Value::M([("k".to_owned(), Value::S("v".into()))].into()),
            ),
            (json!({"L": [{"NULL": true}]}), Value::L(vec![Value::Null])),
            (
                json!({"SS": ["b", "a"]}),
                Value::Ss(vec!["b".into(), "a".into()]),
            ),
            (
                json!({"NS": ["1", "2.0"]}),
                Value::Ns(vec![Number::new("1"), Number::new("2.0")]),
            ),
            (
                json!({"BS": ["/w==", ""]}),
                Value::Bs(vec![vec![0xff], vec![]]),
            ),
        ];
        for (json, expected) in cases {
            assert_eq!(value_from_typed_json(&json, "v"), Ok(expected), "{json}");
        }
    }

    #[test]
    fn a_27_digit_numeric_key_comes_back_identical() {
        let json = json!({"pk": {"N": "123456789012345678901234567"}});
        let item = item_from_typed_json(&json, "cursors.3").unwrap();
        assert_eq!(
            item["pk"],
            Value::N(Number::new("123456789012345678901234567"))
        );
        assert_eq!(crate::item_to_typed_json(&item), json);
    }

    #[test]
    fn a_value_that_is_not_an_object_is_malformed() {
        let error = problem_at(json!("a"), "source.expression_attribute_values_typed.:k");
        assert_eq!(error.path, "source.expression_attribute_values_typed.:k");
        assert_eq!(
            error.to_string(),
            "malformed typed attribute value at source.expression_attribute_values_typed.:k: \
             expected an object with one type tag, found a string"
        );
    }

    #[test]
    fn zero_or_two_tags_are_malformed() {
        assert_eq!(
            problem_at(json!({}), "v").problem,
            "expected an object with one type tag, found 0 keys"
        );
        let two = problem_at(json!({"S": "a", "N": "1"}), "v");
        assert_eq!(
            two.problem,
            "expected an object with one type tag, found 2 keys"
        );
    }

    #[test]
    fn an_unknown_or_lower_case_tag_is_malformed() {
        assert_eq!(
            problem_at(json!({"X": "a"}), "v").problem,
            r#"unknown type tag "X""#
        );
        assert_eq!(
            problem_at(json!({"s": "a"}), "v").problem,
            r#"unknown type tag "s""#
        );
    }

    #[test]
    fn a_payload_of_the_wrong_type_is_malformed() {
        let cases = [
            (
                json!({"S": 1}),
                r#"the "S" payload must be a string, found a number"#,
            ),
            (
                json!({"N": 1}),
                r#"the "N" payload must be a string, found a number"#,
            ),
            (
                json!({"B": [1]}),
                r#"the "B" payload must be a string, found an array"#,
            ),
            (
                json!({"BOOL": "true"}),
                r#"the "BOOL" payload must be a boolean, found a string"#,
            ),
            (
                json!({"NULL": null}),
                r#"the "NULL" payload must be true, found null"#,
            ),
            (
                json!({"NULL": false}),
                r#"the "NULL" payload must be true, found false"#,
            ),
            (
                json!({"SS": "a"}),
                r#"the "SS" payload must be an array of strings, found a string"#,
            ),
            (
                json!({"NS": {}}),
                r#"the "NS" payload must be an array of strings, found an object"#,
            ),
            (
                json!({"BS": "AQ=="}),
                r#"the "BS" payload must be an array of base64 strings, found a string"#,
            ),
            (
                json!({"L": {}}),
                r#"the "L" payload must be an array, found an object"#,
            ),
            (
                json!({"M": []}),
                r#"the "M" payload must be an object, found an array"#,
            ),
        ];
        for (json, problem) in cases {
            let error = problem_at(json.clone(), "v");
            assert_eq!(
                (error.path.as_str(), error.problem.as_str()),
                ("v", problem),
                "{json}"
            );
        }
    }

    #[test]
    fn invalid_base64_is_malformed() {
        for text in ["AQI", "A===", "*AQ=", "AR=="] {
            let error = problem_at(json!({"B": text}), "v");
            assert!(
                error.problem.contains("is not valid padded base64"),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn an_error_inside_a_map_or_list_names_the_nested_path() {
        let json = json!({"M": {"a": {"L": [{"S": "x"}, {"SS": ["y", 2]}]}}});
        let error = problem_at(json, "cursors.3.pk");
        assert_eq!(error.path, "cursors.3.pk.a[1][1]");
        assert_eq!(error.problem, "expected a string, found a number");
    }

    #[test]
    fn an_error_in_a_binary_set_names_the_element() {
        let error = problem_at(json!({"BS": ["AQ==", "!"]}), "v");
        assert_eq!(error.path, "v[1]");
    }

    #[test]
    fn an_item_names_the_attribute_that_is_malformed() {
        let error = item_from_typed_json(&json!({"pk": {"S": "a"}, "sk": {"Q": 1}}), "cursors.3")
            .unwrap_err();
        assert_eq!(error.path, "cursors.3.sk");
        let error = item_from_typed_json(&json!({"sk": 1}), "").unwrap_err();
        assert_eq!(error.path, "sk");
    }

    #[test]
    fn an_item_that_is_not_an_object_is_malformed() {
        let error = item_from_typed_json(&json!([]), "cursors.0").unwrap_err();
        assert_eq!(error.path, "cursors.0");
        assert_eq!(
            error.problem,
            "expected an object of attribute values, found an array"
        );
    }
}
