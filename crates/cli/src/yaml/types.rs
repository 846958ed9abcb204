//! The types a config field can hold, read strictly (`"false"` is not a boolean, `"8"` is not a
//! number), with their JSON Schema, and the words messages use for found values and near misses.

use ddbpipe_source::config::{Mode, OnGap, Secret, SnapshotEngine, StartPosition};
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_value::ValueFormat;
use serde_json::{Value as Json, json};
use yaml_serde::Value;

/// A type a config field can hold, read strictly: `"false"` is not a boolean and `"8"` is not
/// a number.
pub(crate) trait FromYaml: Sized {
    /// Reads `value`. `substituted` is the text an interpolated scalar was re-read from.
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String>;
    /// The JSON Schema of the values read (`schema`).
    fn schema() -> Json;
    /// The value as JSON, to compare a default with the declared one.
    fn to_json(&self) -> Json;
}

impl FromYaml for String {
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String> {
        match (value, substituted) {
            (Value::String(text), _) => Ok(text),
            (Value::Number(_) | Value::Bool(_), Some(text)) => Ok(text.to_owned()),
            (other, _) => Err(expected("a string", &other)),
        }
    }
    fn schema() -> Json {
        json!({"type": "string"})
    }
    fn to_json(&self) -> Json {
        json!(self)
    }
}

impl FromYaml for Secret {
    // The value never appears in a message: only its kind does.
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String> {
        match (value, substituted) {
            (Value::String(text), _) => Ok(Secret::new(text)),
            (Value::Number(_) | Value::Bool(_), Some(text)) => Ok(Secret::new(text)),
            (other, _) => Err(format!("expected a string, found {}", kind(&other))),
        }
    }
    fn schema() -> Json {
        json!({"type": "string"})
    }
    fn to_json(&self) -> Json {
        // Never the secret: no secret has a default to compare.
        json!("***")
    }
}

impl FromYaml for EndpointUrl {
    // The value never appears in a message: it may hold a password or a signature.
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String> {
        let text = match (value, substituted) {
            (Value::String(text), _) => text,
            (other, _) => return Err(format!("expected a URL, found {}", kind(&other))),
        };
        EndpointUrl::new(text).map_err(|e| e.to_string())
    }
    fn schema() -> Json {
        // The rules (docs/config.md §1.4) are checked when the file is read.
        json!({"type": "string"})
    }
    fn to_json(&self) -> Json {
        // No endpoint has a default to compare.
        json!(self.masked())
    }
}

impl FromYaml for bool {
    fn from_yaml(value: Value, _: Option<&str>) -> Result<Self, String> {
        match value {
            Value::Bool(flag) => Ok(flag),
            other => Err(expected("a boolean (true or false)", &other)),
        }
    }
    fn schema() -> Json {
        json!({"type": "boolean"})
    }
    fn to_json(&self) -> Json {
        json!(self)
    }
}

impl FromYaml for f64 {
    fn from_yaml(value: Value, _: Option<&str>) -> Result<Self, String> {
        match &value {
            Value::Number(number) => number.as_f64().ok_or_else(|| expected("a number", &value)),
            other => Err(expected("a number", other)),
        }
    }
    fn schema() -> Json {
        json!({"type": "number"})
    }
    fn to_json(&self) -> Json {
        json!(self)
    }
}

/// A list of strings (`source.tables`): each element a string, as [`String`] reads one.
impl FromYaml for Vec<String> {
    fn from_yaml(value: Value, _substituted: Option<&str>) -> Result<Self, String> {
        let Value::Sequence(items) = value else {
            return Err(expected("a list of strings", &value));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(index, item)| match item {
                Value::String(text) => Ok(text),
                other => Err(format!("element {index}: {}", expected("a string", &other))),
            })
            .collect()
    }
    fn schema() -> Json {
        json!({"type": "array", "items": {"type": "string"}})
    }
    fn to_json(&self) -> Json {
        json!(self)
    }
}

/// A value that may be an explicit `null` (`document_column: null`): null is `None`, anything
/// else a `T`. Read with a default ([`super::fields::Fields::or`]), absent is the default and
/// null a choice of its own.
impl<T: FromYaml> FromYaml for Option<T> {
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            value => T::from_yaml(value, substituted).map(Some),
        }
    }
    fn schema() -> Json {
        json!({"anyOf": [T::schema(), {"type": "null"}]})
    }
    fn to_json(&self) -> Json {
        self.as_ref().map_or(Json::Null, T::to_json)
    }
}

/// Whole numbers: YAML integers in the type's range; `1.0` and `"8"` are refused.
macro_rules! whole_number_from_yaml {
    ($($type:ty),*) => {$(
        impl FromYaml for $type {
            fn from_yaml(value: Value, _: Option<&str>) -> Result<Self, String> {
                let Value::Number(number) = &value else {
                    return Err(expected("a whole number", &value));
                };
                let in_range = match (number.as_u64(), number.as_i64()) {
                    (Some(unsigned), _) => <$type>::try_from(unsigned).ok(),
                    (None, Some(_)) => None,
                    (None, None) => return Err(expected("a whole number", &value)),
                };
                in_range.ok_or_else(|| {
                    let range = format!("a whole number from 0 to {}", <$type>::MAX);
                    expected(&range, &value)
                })
            }
            fn schema() -> Json {
                json!({"type": "integer", "minimum": 0, "maximum": <$type>::MAX})
            }
            fn to_json(&self) -> Json {
                json!(self)
            }
        }
    )*};
}

whole_number_from_yaml!(u32, u64, usize);

/// An enum written as one of a few names.
pub(crate) trait Choice: Copy + 'static {
    /// Every value, in documentation order.
    fn all() -> &'static [Self];
    /// The name of a value in the config file.
    fn name(self) -> &'static str;
    /// More words for a name that is not (or not yet) a choice.
    fn hint(_found: &str) -> Option<&'static str> {
        None
    }
}

impl<T: Choice> FromYaml for T {
    fn from_yaml(value: Value, _: Option<&str>) -> Result<Self, String> {
        let names: Vec<&str> = T::all().iter().map(|choice| choice.name()).collect();
        let expected_names = match names.as_slice() {
            [only] => (*only).to_owned(),
            names => format!("one of {}", names.join(", ")),
        };
        let Value::String(text) = &value else {
            return Err(expected(&expected_names, &value));
        };
        if let Some(choice) = T::all().iter().find(|choice| choice.name() == text) {
            return Ok(*choice);
        }
        let mut message = format!("unknown value {text:?}, expected {expected_names}");
        if let Some(hint) = T::hint(text) {
            message = format!("{message} ({hint})");
        } else if let Some(known) = did_you_mean(text, names.iter().copied()) {
            message = format!("{message} (did you mean {known}?)");
        }
        Err(message)
    }
    fn schema() -> Json {
        let names: Vec<&str> = T::all().iter().map(|choice| choice.name()).collect();
        json!({"type": "string", "enum": names})
    }
    fn to_json(&self) -> Json {
        json!(self.name())
    }
}

impl Choice for Mode {
    fn all() -> &'static [Self] {
        &Mode::ALL
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for StartPosition {
    fn all() -> &'static [Self] {
        &StartPosition::ALL
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for OnGap {
    fn all() -> &'static [Self] {
        &OnGap::ALL
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for SnapshotEngine {
    fn all() -> &'static [Self] {
        &SnapshotEngine::ALL
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for ValueFormat {
    fn all() -> &'static [Self] {
        &[ValueFormat::Plain, ValueFormat::Typed]
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
}

/// The candidate a mistyped `word` most likely meant: equal but for case, or at most two
/// edits away (one for words of up to four letters); `None` when nothing is that close.
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = if word.chars().count() <= 4 { 1 } else { 2 };
    candidates
        .into_iter()
        .filter(|candidate| *candidate != word)
        .map(|candidate| {
            let distance = if candidate.eq_ignore_ascii_case(word) {
                0
            } else {
                edit_distance(&word.to_ascii_lowercase(), &candidate.to_ascii_lowercase())
            };
            (distance, candidate)
        })
        .filter(|(distance, _)| *distance <= limit)
        .min()
        .map(|(_, candidate)| candidate)
}

/// Edit distance by characters: insertions, deletions, substitutions and swaps of two
/// neighbours (`scna` is one edit from `scan`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// "expected <what>, found <value>".
pub(crate) fn expected(what: &str, value: &Value) -> String {
    format!("expected {what}, found {}", found(value))
}

/// A value as an error message shows it: its kind and, for scalars, the value itself.
pub(crate) fn found(value: &Value) -> String {
    const SHOWN_CHARS: usize = 60;
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(flag) => format!("boolean {flag}"),
        Value::Number(number) => format!("number {number}"),
        Value::String(text) if text.chars().count() > SHOWN_CHARS => {
            let start: String = text.chars().take(SHOWN_CHARS).collect();
            format!("string {start:?}…")
        }
        Value::String(text) => format!("string {text:?}"),
        other => kind(other).to_owned(),
    }
}

/// The kind of a value, without the value.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}
