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

use ddbpipe_source::config::ConfigError;
use yaml_serde::Value;

use super::schema::{Field, Presence, Shape, Variant};
use super::types::{FromYaml, did_you_mean, expected, found, kind};

/// The stage of loading that found a problem; problems are reported in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
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
pub(crate) struct Report {
    problems: Vec<(Stage, ConfigError)>,
    /// Scalars that were exactly one `${…}` and re-read as a number or boolean, by path, with
    /// their substituted text. A string field takes the text, so `table_name: ${TABLE}` with
    /// `TABLE=2024` is the table "2024", not a type error.
    pub(crate) substituted: BTreeMap<String, String>,
    /// The text of each YAML number under `source.expression_attribute_values` that is not
    /// an exact integer, by path (`numbers`).
    pub(crate) number_texts: BTreeMap<String, String>,
    /// Paths whose interpolation failed. The failure is reported once; the walker skips the
    /// field instead of adding a type error about the unsubstituted text.
    pub(crate) failed: BTreeSet<String>,
}

impl Report {
    /// Records a problem at `path`.
    pub(crate) fn error(&mut self, stage: Stage, path: &str, message: impl Into<String>) {
        self.problems
            .push((stage, ConfigError::new(path, message.into())));
    }

    /// Whether the value at `path`, or anything inside it, failed interpolation.
    pub(crate) fn interpolation_failed(&self, path: &str) -> bool {
        self.failed.iter().any(|failed| is_within(failed, path))
    }

    /// The problems in report order (see the module docs); empty when the file is valid.
    pub(crate) fn into_errors(mut self) -> Vec<ConfigError> {
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
/// secret). An endpoint URL may hold a password or a signature (docs/config.md §1.4), a Kafka client
/// property a password (`sasl.password`).
const SECRET_SECTIONS: [&str; 7] = [
    "source.credentials",
    "sink.url",
    "sink.properties",
    "source.endpoint_url",
    "source.snapshot.s3_endpoint_url",
    "sink.s3_endpoint_url",
    "sink.catalog.uri",
];

/// Whether a value at `path` may be a secret.
pub(crate) fn is_secret(path: &str) -> bool {
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
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// One mapping of the file, read key by key.
pub(crate) struct Fields<'r> {
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
    pub(crate) fn open(
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
            Some(Shape::Value(_) | Shape::List(_)) | None => {
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
    pub(crate) fn select(&mut self, tag: &str) {
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
            | (Presence::Optional | Presence::Default(_) | Presence::Instead(_), Read::Optional) => {
            }
            (Presence::Default(declared), Read::Default(default)) => assert_eq!(
                declared(),
                default.to_json(),
                "{path} is read with another default than declared"
            ),
            (presence, _) => panic!("{path} is declared {presence:?} but read otherwise"),
        }
    }

    /// The report, for sections that convert values themselves.
    pub(crate) fn report(&mut self) -> &mut Report {
        self.report
    }

    /// The dotted path of this mapping.
    pub(crate) fn path(&self) -> &str {
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
    pub(crate) fn get<T: FromYaml>(&mut self, key: &str) -> Option<T> {
        self.assert_declared::<T>(key, Read::Optional);
        match self.take(key) {
            Taken::Absent | Taken::Skipped | Taken::Present(_, Value::Null) => None,
            Taken::Present(path, value) => convert(self.report, &path, value),
        }
    }

    /// A field with a default: absent is `default`; null is a type error.
    pub(crate) fn or<T: FromYaml>(&mut self, key: &str, default: T) -> T {
        self.assert_declared(key, Read::Default(&default));
        match self.take(key) {
            Taken::Absent | Taken::Skipped => default,
            Taken::Present(path, value) => convert(self.report, &path, value).unwrap_or(default),
        }
    }

    /// A required field: absent or null is reported as missing.
    pub(crate) fn required<T: FromYaml>(&mut self, key: &str) -> Option<T> {
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
    pub(crate) fn raw(&mut self, key: &str) -> Option<(String, Value)> {
        match self.take(key) {
            Taken::Absent | Taken::Skipped | Taken::Present(_, Value::Null) => None,
            Taken::Present(path, value) => Some((path, value)),
        }
    }

    /// A nested mapping; absent or null is `None`, anything but a mapping a type error.
    pub(crate) fn section(&mut self, key: &str) -> Option<Fields<'_>> {
        let shape = self.declared(key).map(|field| field.shape);
        let (path, value) = self.raw(key)?;
        Fields::open_shape(self.report, &path, value, shape)
    }

    /// A nested mapping where absent, null or skipped reads as empty, so its required fields
    /// are reported missing.
    pub(crate) fn section_or_empty(&mut self, key: &str) -> Option<Fields<'_>> {
        let shape = self.declared(key).map(|field| field.shape);
        let path = join(&self.path, key);
        let value = self
            .raw(key)
            .map_or(Value::Mapping(Default::default()), |(_, value)| value);
        Fields::open_shape(self.report, &path, value, shape)
    }

    /// A required nested mapping.
    pub(crate) fn required_section(&mut self, key: &str) -> Option<Fields<'_>> {
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
    pub(crate) fn refuse(&mut self, key: &str, message: &str) {
        if let Taken::Present(path, _) = self.take_any(key) {
            self.report.error(Stage::Unknown, &path, message);
        }
    }

    /// Passes over `key` without judging it: the section could not tell what it may hold (an
    /// error saying why is reported already).
    pub(crate) fn skip(&mut self, key: &str) {
        self.take_any(key);
    }

    /// A mapping from string keys to values converted by `convert`, which reports its own
    /// problems and returns `None` for a value it refused. Absent or null is empty.
    pub(crate) fn map<T>(
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

    /// A list of mappings with the declared element keys, each read by `read` (its unknown
    /// keys reported when `read` returns). Absent or null is empty; anything but a list is a
    /// type error. An element that is not a mapping is a type error and reads as
    /// `T::default()`, so every element keeps its index: validation names `key[i]`, and an
    /// error there hides a validation error about the default that stands in.
    pub(crate) fn list<T: Default>(
        &mut self,
        key: &str,
        mut read: impl FnMut(&mut Fields<'_>) -> T,
    ) -> Vec<T> {
        let elements = match self.declared(key).map(|field| field.shape) {
            Some(Shape::List(fields)) => fields,
            _ => {
                if cfg!(debug_assertions) {
                    panic!("{} is read as a list but not declared as one", self.path);
                }
                &[]
            }
        };
        let Some((path, value)) = self.raw(key) else {
            return Vec::new();
        };
        let Value::Sequence(items) = value else {
            let message = expected("a list", &value);
            self.report
                .error(Stage::Type, &path, shown(&path, message, &value));
            return Vec::new();
        };
        let mut read_items = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let at = format!("{path}[{index}]");
            let read_item = match Fields::open(self.report, &at, item, elements) {
                Some(mut element) => {
                    let read_item = read(&mut element);
                    element.finish();
                    read_item
                }
                None => T::default(),
            };
            read_items.push(read_item);
        }
        read_items
    }

    /// Reports `key` as a missing required field.
    pub(crate) fn missing(&mut self, key: &str) {
        let path = join(&self.path, key);
        self.report
            .error(Stage::Missing, &path, "missing required field");
    }

    /// Reports every key no section asked for as unknown, and returns the keys that were set.
    pub(crate) fn finish(self) -> BTreeSet<String> {
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
pub(crate) fn convert<T: FromYaml>(report: &mut Report, path: &str, value: Value) -> Option<T> {
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

/// How a section reads a key, to compare with its declared presence.
enum Read<'a, T> {
    Required,
    Optional,
    Default(&'a T),
}
