//! The field walker: reads a YAML mapping key by key so that every problem is reported.
//!
//! A serde derive stops at the first error. Here each section asks its [`Fields`] for the keys
//! it knows, one at a time, with the type it expects. A value of the wrong type is reported
//! with its dotted path and the field falls back to its default, so the rest of the file is
//! still checked and validated. When the section is done, [`Fields::finish`] reports every key
//! nobody asked for as unknown.
//!
//! # Declared fields
//! Every mapping is opened with its section's table of fields (`schema`), the same tables the
//! JSON Schema is made of. A section may read only declared keys, with the declared type and
//! presence; debug builds assert it, so every config test checks that the walker and the
//! schema agree. "Did you mean" suggests declared keys.
//!
//! # Error handling
//! Problems are collected in a [`Report`] with the [`Stage`] that found them. The final list
//! is ordered by stage (interpolation, unknown keys, types, missing fields, validation), then
//! in the order the walk met them. A validation error at a path that already has an earlier
//! error is dropped: it would only describe the default that stood in for the bad value.

use std::collections::{BTreeMap, BTreeSet};

use ddbpipe_source::config::{ConfigError, Mode, OnGap, Secret, StartPosition};
use ddbpipe_value::ValueFormat;
use serde_json::{Value as Json, json};
use yaml_serde::Value;

use super::schema::{Field, Presence, Shape, Variant};

/// The stage of loading that found a problem; problems are reported in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stage {
    /// `${…}` could not be substituted.
    Interpolate,
    /// A key that no section knows.
    Unknown,
    /// A value of the wrong type, or an unknown enum value.
    Type,
    /// A required field that is absent.
    Missing,
    /// A rule of docs/config.md §1.3.
    Validate,
}

/// Everything the loading stages found, shared by every section of the walk.
#[derive(Debug, Default)]
pub(super) struct Report {
    problems: Vec<(Stage, ConfigError)>,
    /// Scalars that were exactly one `${…}` and re-read as a number or boolean, by path, with
    /// their substituted text. A string field takes the text, so `table_name: ${TABLE}` with
    /// `TABLE=2024` is the table "2024", not a type error.
    pub(super) substituted: BTreeMap<String, String>,
    /// The text of each YAML number under `source.expression_attribute_values` that is not
    /// an exact integer, by path (`numbers`).
    pub(super) number_texts: BTreeMap<String, String>,
    /// Paths whose interpolation failed. The failure is reported once; the walker skips the
    /// field instead of adding a type error about the unsubstituted text.
    pub(super) failed: BTreeSet<String>,
}

impl Report {
    /// Records a problem at `path`.
    pub(super) fn error(&mut self, stage: Stage, path: &str, message: impl Into<String>) {
        self.problems
            .push((stage, ConfigError::new(path, message.into())));
    }

    /// Whether the value at `path`, or anything inside it, failed interpolation.
    fn interpolation_failed(&self, path: &str) -> bool {
        self.failed.iter().any(|failed| is_within(failed, path))
    }

    /// The problems in report order (see the module docs); empty when the file is valid.
    pub(super) fn into_errors(mut self) -> Vec<ConfigError> {
        self.problems.sort_by_key(|(stage, _)| *stage);
        let mut errors: Vec<ConfigError> = Vec::with_capacity(self.problems.len());
        let mut earlier: Vec<&str> = Vec::new();
        for (stage, error) in &self.problems {
            if *stage == Stage::Validate {
                if earlier.iter().any(|path| is_within(&error.path, path)) {
                    continue;
                }
            } else {
                earlier.push(&error.path);
            }
            errors.push(error.clone());
        }
        errors
    }
}

/// Where every value is a secret or may hold one: a message about a value there names its
/// kind, never the value (issue 9 item 4: a value typed into the wrong place is still a
/// secret).
const SECRET_SECTIONS: [&str; 2] = ["source.credentials", "sink.url"];

/// Whether a value at `path` may be a secret.
fn is_secret(path: &str) -> bool {
    SECRET_SECTIONS
        .iter()
        .any(|section| is_within(path, section))
}

/// `message` about `value` at `path`, with the value replaced by its kind where it may be a
/// secret.
fn shown(path: &str, message: String, value: &Value) -> String {
    if !is_secret(path) {
        return message;
    }
    let mut message = message.replace(&found(value), kind(value));
    if let Value::String(text) = value
        && !text.is_empty()
    {
        message = message.replace(text.as_str(), "***");
    }
    message
}

/// Whether `path` is `ancestor` or lies inside it (`source.retry.x` is within `source.retry`).
fn is_within(path: &str, ancestor: &str) -> bool {
    match path.strip_prefix(ancestor) {
        Some(rest) => ancestor.is_empty() || rest.is_empty() || rest.starts_with(['.', '[']),
        None => false,
    }
}

/// The dotted path of `key` inside `parent` (the top level has the empty path).
pub(super) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// One mapping of the file, read key by key.
pub(super) struct Fields<'r> {
    path: String,
    /// The entries in file order; `None` once a section asked for the key.
    entries: Vec<(String, Option<Value>)>,
    /// Keys asked for whose value was set (not null).
    present: BTreeSet<String>,
    /// Every key the section asked for; any other key is unknown.
    asked: BTreeSet<String>,
    /// The declared fields of the section: its table, then those of the variant selected.
    declared: Vec<&'static [Field]>,
    /// The variants of a tagged section, one of which [`Fields::select`] adds.
    variants: &'static [Variant],
    report: &'r mut Report,
}

/// What a section found under a key.
enum Taken {
    Absent,
    /// Interpolation failed inside the value; that is reported already.
    Skipped,
    Present(String, Value),
}

impl<'r> Fields<'r> {
    /// Opens `value` at `path` as a mapping of the declared `fields`; anything else is a type
    /// error.
    pub(super) fn open(
        report: &'r mut Report,
        path: &str,
        value: Value,
        fields: &'static [Field],
    ) -> Option<Self> {
        let Value::Mapping(mapping) = value else {
            let message = format!("expected a mapping, found {}", found(&value));
            report.error(Stage::Type, path, shown(path, message, &value));
            return None;
        };
        let mut entries = Vec::with_capacity(mapping.len());
        for (key, value) in mapping {
            match key {
                Value::String(key) => entries.push((key, Some(value))),
                other => {
                    let message = format!("keys must be strings, found {}", found(&other));
                    report.error(Stage::Type, path, shown(path, message, &other));
                }
            }
        }
        Some(Fields {
            path: path.to_owned(),
            entries,
            present: BTreeSet::new(),
            asked: BTreeSet::new(),
            declared: vec![fields],
            variants: &[],
            report,
        })
    }

    /// Opens `value` at `path` as a mapping of the shape `shape` declares: a section's fields,
    /// a tagged mapping's tag (until [`Fields::select`]), or a map's entries.
    fn open_shape(
        report: &'r mut Report,
        path: &str,
        value: Value,
        shape: Option<Shape>,
    ) -> Option<Self> {
        let (fields, variants): (&'static [Field], &'static [Variant]) = match shape {
            Some(Shape::Section(fields)) => (fields, &[]),
            Some(Shape::Tagged { tag, variants }) => (std::slice::from_ref(tag), variants),
            Some(Shape::Map(_)) => (&[], &[]),
            Some(Shape::Value(_)) | None => {
                if cfg!(debug_assertions) {
                    panic!("{path} is read as a mapping but not declared as one");
                }
                (&[], &[])
            }
        };
        let mut fields = Fields::open(report, path, value, fields)?;
        fields.variants = variants;
        Some(fields)
    }

    /// Adds the fields of the variant `tag` of a tagged section.
    pub(super) fn select(&mut self, tag: &str) {
        let variant = self.variants.iter().find(|variant| variant.tag == tag);
        debug_assert!(
            variant.is_some(),
            "{}: variant {tag} is not declared",
            self.path
        );
        if let Some(variant) = variant {
            self.declared.push(variant.fields);
        }
    }

    /// The declaration of `key` in this section.
    fn declared(&self, key: &str) -> Option<&'static Field> {
        self.declared
            .iter()
            .flat_map(|fields| fields.iter())
            .find(|field| field.name == key)
    }

    /// Debug builds: `key` is declared, holds values of type `T`, and is read as `presence`
    /// says (`Default` also allows a read that applies its default itself).
    fn assert_declared<T: FromYaml>(&self, key: &str, read: Read<'_, T>) {
        if !cfg!(debug_assertions) {
            return;
        }
        let path = join(&self.path, key);
        let Some(field) = self.declared(key) else {
            panic!("{path} is read but not declared in its section's fields");
        };
        match field.shape {
            Shape::Value(schema) => assert_eq!(
                schema(),
                T::schema(),
                "{path} is read with another type than declared"
            ),
            _ => panic!("{path} is read as a value but declared as a mapping"),
        }
        match (field.presence, read) {
            (Presence::Required, Read::Required)
            | (Presence::Optional | Presence::Default(_), Read::Optional) => {}
            (Presence::Default(declared), Read::Default(default)) => assert_eq!(
                declared(),
                default.to_json(),
                "{path} is read with another default than declared"
            ),
            (presence, _) => panic!("{path} is declared {presence:?} but read otherwise"),
        }
    }

    /// The report, for sections that convert values themselves.
    pub(super) fn report(&mut self) -> &mut Report {
        self.report
    }

    /// The dotted path of this mapping.
    pub(super) fn path(&self) -> &str {
        &self.path
    }

    fn take(&mut self, key: &str) -> Taken {
        debug_assert!(
            self.declared(key).is_some(),
            "{} is read but not declared in its section's fields",
            join(&self.path, key)
        );
        self.take_any(key)
    }

    /// Takes `key`, declared or not (for [`Fields::refuse`] and [`Fields::skip`]).
    fn take_any(&mut self, key: &str) -> Taken {
        self.asked.insert(key.to_owned());
        let Some(value) = self
            .entries
            .iter_mut()
            .find(|(name, _)| name == key)
            .and_then(|(_, value)| value.take())
        else {
            return Taken::Absent;
        };
        let path = join(&self.path, key);
        if self.report.interpolation_failed(&path) {
            return Taken::Skipped;
        }
        if !value.is_null() {
            self.present.insert(key.to_owned());
        }
        Taken::Present(path, value)
    }

    /// An optional field: absent or null is `None`.
    pub(super) fn get<T: FromYaml>(&mut self, key: &str) -> Option<T> {
        self.assert_declared::<T>(key, Read::Optional);
        match self.take(key) {
            Taken::Absent | Taken::Skipped | Taken::Present(_, Value::Null) => None,
            Taken::Present(path, value) => convert(self.report, &path, value),
        }
    }

    /// A field with a default: absent is `default`; null is a type error.
    pub(super) fn or<T: FromYaml>(&mut self, key: &str, default: T) -> T {
        self.assert_declared(key, Read::Default(&default));
        match self.take(key) {
            Taken::Absent | Taken::Skipped => default,
            Taken::Present(path, value) => convert(self.report, &path, value).unwrap_or(default),
        }
    }

    /// A required field: absent or null is reported as missing.
    pub(super) fn required<T: FromYaml>(&mut self, key: &str) -> Option<T> {
        self.assert_declared::<T>(key, Read::Required);
        match self.take(key) {
            Taken::Skipped => None,
            Taken::Absent | Taken::Present(_, Value::Null) => {
                self.missing(key);
                None
            }
            Taken::Present(path, value) => convert(self.report, &path, value),
        }
    }

    /// The raw value of a field with its path, for conversions of its own; absent, null or
    /// skipped is `None`.
    pub(super) fn raw(&mut self, key: &str) -> Option<(String, Value)> {
        match self.take(key) {
            Taken::Absent | Taken::Skipped | Taken::Present(_, Value::Null) => None,
            Taken::Present(path, value) => Some((path, value)),
        }
    }

    /// A nested mapping; absent or null is `None`, anything but a mapping a type error.
    pub(super) fn section(&mut self, key: &str) -> Option<Fields<'_>> {
        let shape = self.declared(key).map(|field| field.shape);
        let (path, value) = self.raw(key)?;
        Fields::open_shape(self.report, &path, value, shape)
    }

    /// A nested mapping where absent, null or skipped reads as empty, so its required fields
    /// are reported missing.
    pub(super) fn section_or_empty(&mut self, key: &str) -> Option<Fields<'_>> {
        let shape = self.declared(key).map(|field| field.shape);
        let path = join(&self.path, key);
        let value = self
            .raw(key)
            .map_or(Value::Mapping(Default::default()), |(_, value)| value);
        Fields::open_shape(self.report, &path, value, shape)
    }

    /// A required nested mapping.
    pub(super) fn required_section(&mut self, key: &str) -> Option<Fields<'_>> {
        let shape = self.declared(key).map(|field| field.shape);
        match self.take(key) {
            Taken::Skipped => None,
            Taken::Absent | Taken::Present(_, Value::Null) => {
                self.missing(key);
                None
            }
            Taken::Present(path, value) => Fields::open_shape(self.report, &path, value, shape),
        }
    }

    /// Refuses `key`, which this section (or the variant selected) does not have, with
    /// `message` instead of "unknown field", when it is set.
    pub(super) fn refuse(&mut self, key: &str, message: &str) {
        if let Taken::Present(path, _) = self.take_any(key) {
            self.report.error(Stage::Unknown, &path, message);
        }
    }

    /// Passes over `key` without judging it: the section could not tell what it may hold (an
    /// error saying why is reported already).
    pub(super) fn skip(&mut self, key: &str) {
        self.take_any(key);
    }

    /// A mapping from string keys to values converted by `convert`, which reports its own
    /// problems and returns `None` for a value it refused. Absent or null is empty.
    pub(super) fn map<T>(
        &mut self,
        key: &str,
        mut convert: impl FnMut(&mut Report, &str, Value) -> Option<T>,
    ) -> BTreeMap<String, T> {
        let mut converted = BTreeMap::new();
        let Some(mut entries) = self.section(key) else {
            return converted;
        };
        for (name, value) in std::mem::take(&mut entries.entries) {
            let Some(value) = value else { continue };
            let path = join(&entries.path, &name);
            if let Some(value) = convert(entries.report, &path, value) {
                converted.insert(name, value);
            }
        }
        converted
    }

    /// Reports `key` as a missing required field.
    pub(super) fn missing(&mut self, key: &str) {
        let path = join(&self.path, key);
        self.report
            .error(Stage::Missing, &path, "missing required field");
    }

    /// Reports every key no section asked for as unknown, and returns the keys that were set.
    pub(super) fn finish(self) -> BTreeSet<String> {
        for (key, value) in &self.entries {
            if value.is_some() {
                let path = join(&self.path, key);
                let declared = self.declared.iter().flat_map(|fields| fields.iter());
                let message = match did_you_mean(key, declared.map(|field| field.name)) {
                    Some(known) => format!("unknown field (did you mean {known}?)"),
                    None => "unknown field".to_owned(),
                };
                self.report.error(Stage::Unknown, &path, message);
            }
        }
        self.present
    }
}

/// Converts `value` at `path`, reporting a type error on failure.
pub(super) fn convert<T: FromYaml>(report: &mut Report, path: &str, value: Value) -> Option<T> {
    let text = report.substituted.get(path).map(String::as_str);
    let secret = is_secret(path).then(|| value.clone());
    match T::from_yaml(value, text) {
        Ok(converted) => Some(converted),
        Err(message) => {
            let message = match &secret {
                Some(value) => shown(path, message, value),
                None => message,
            };
            report.error(Stage::Type, path, message);
            None
        }
    }
}

/// A type a config field can hold, read strictly: `"false"` is not a boolean and `"8"` is not
/// a number.
pub(super) trait FromYaml: Sized {
    /// Reads `value`. `substituted` is the text an interpolated scalar was re-read from.
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String>;
    /// The JSON Schema of the values read (`schema`).
    fn schema() -> Json;
    /// The value as JSON, to compare a default with the declared one.
    fn to_json(&self) -> Json;
}

/// How a section reads a key, to compare with its declared presence.
enum Read<'a, T> {
    Required,
    Optional,
    Default(&'a T),
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
pub(super) trait Choice: Copy + 'static {
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
pub(super) fn did_you_mean<'a>(
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
pub(super) fn expected(what: &str, value: &Value) -> String {
    format!("expected {what}, found {}", found(value))
}

/// A value as an error message shows it: its kind and, for scalars, the value itself.
pub(super) fn found(value: &Value) -> String {
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
pub(super) fn kind(value: &Value) -> &'static str {
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
