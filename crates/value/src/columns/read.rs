//! [`ColumnReader`]: the typed columns of one JSON document (rules 1–3 of the module docs).
//!
//! # Reading
//! 1. The document's attributes that paths start at are found by [`key_attributes`], which
//!    skips every other attribute without building anything; each found one is read once,
//!    however many columns start at it.
//! 2. A typed document's attribute is decoded strictly (docs/values.md §3.5). Its numbers are
//!    strings, so nothing is lost on the way.
//! 3. A plain document's attribute is read as raw JSON, level by level: a number's text is
//!    taken as the `N`'s text exactly as written (serde_json here parses numbers into
//!    doubles, which would lose digits).
//! 4. The rest of the path is walked over the value (rule 2), and what it reaches goes to the
//!    one conversion (`convert`), told whether strings may stand for numbers (rule 3). In a
//!    plain document the path is walked over the raw JSON, and only the value it reaches is
//!    read (`address.city` reads one string, not the whole `address` map); the steps' rules
//!    are the same as over a value.

use std::collections::BTreeMap;

use serde_json::error::Category;
use serde_json::value::RawValue;

use super::convert::{Strings, convert_read, convert_read_owned};
use super::path::StepText;
use super::{ColumnSpec, ColumnValue, Mismatch, PathStep, a_tag};
use crate::{Number, Value, ValueFormat, key_attributes, value_from_typed_json};

/// Reads the typed columns of documents in one format.
#[derive(Debug, Clone)]
pub struct ColumnReader {
    columns: Vec<ColumnSpec>,
    format: ValueFormat,
    /// The distinct attributes the paths start at.
    roots: Vec<String>,
    /// Each column's root, as a place in `roots`.
    root_of: Vec<usize>,
}

impl ColumnReader {
    /// A reader of `columns` from documents written in `format`.
    pub fn new(columns: Vec<ColumnSpec>, format: ValueFormat) -> ColumnReader {
        let mut roots: Vec<String> = Vec::new();
        let root_of = columns
            .iter()
            .map(|column| {
                let root = column.path.root();
                roots
                    .iter()
                    .position(|known| known == root)
                    .unwrap_or_else(|| {
                        roots.push(root.to_owned());
                        roots.len() - 1
                    })
            })
            .collect();
        ColumnReader {
            columns,
            format,
            roots,
            root_of,
        }
    }

    /// The columns, in the order [`ColumnReader::read`] answers.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// The columns' values of one document (a JSON object), in column order. Only the
    /// attributes the paths start at are parsed beyond skipping. An error only when the
    /// document is not a JSON object (or, typed, not attribute JSON where a path goes); the
    /// error never quotes the document.
    pub fn read(&self, document: &str) -> Result<Vec<Result<ColumnValue, Mismatch>>, String> {
        let found = key_attributes(document, &self.roots, |root| root.as_str())
            .map_err(|error| describe("the document", &error))?;
        self.read_found(&found)
    }

    /// The attributes the paths start at, each once: what [`ColumnReader::read_found`] takes
    /// the raw values of.
    pub fn roots(&self) -> &[String] {
        &self.roots
    }

    /// [`ColumnReader::read`] of a document whose [`roots`](ColumnReader::roots) were found
    /// already (`found[i]` the raw value of `roots()[i]`, as [`key_attributes`] gives it): a
    /// caller that reads other attributes of the same document (a keyed sink, its key) finds
    /// them all in one pass.
    pub fn read_found(
        &self,
        found: &[Option<&RawValue>],
    ) -> Result<Vec<Result<ColumnValue, Mismatch>>, String> {
        if found.len() != self.roots.len() {
            return Err(format!(
                "{} root attribute value(s) given for {} root(s)",
                found.len(),
                self.roots.len()
            ));
        }
        if self.format != ValueFormat::Typed {
            return self.read_plain(found);
        }
        let values = found
            .iter()
            .copied()
            .zip(&self.roots)
            .map(|(raw, root)| raw.map(|raw| self.attribute(raw, root)).transpose())
            .collect::<Result<Vec<Option<Value>>, String>>()?;
        let strings = match self.format {
            ValueFormat::Typed => Strings::AreStrings,
            ValueFormat::Plain | ValueFormat::PlainExact => Strings::MayBeNumbers,
        };
        let read = |(column, &root): (&ColumnSpec, &usize)| {
            let rest = column.path.steps().get(1..).unwrap_or_default();
            match walk(values[root].as_ref(), rest)? {
                Some(value) => convert_read(value, column.kind, column.time_format, strings),
                None => Ok(ColumnValue::Null),
            }
        };
        Ok(self.columns.iter().zip(&self.root_of).map(read).collect())
    }

    /// The columns of a plain document whose path roots are `found` (reading rules 3 and 4):
    /// each path walked over the raw JSON, only the value it reaches read.
    fn read_plain(
        &self,
        found: &[Option<&RawValue>],
    ) -> Result<Vec<Result<ColumnValue, Mismatch>>, String> {
        let mut values = Vec::with_capacity(self.columns.len());
        for (column, &root) in self.columns.iter().zip(&self.root_of) {
            let rest = column.path.steps().get(1..).unwrap_or_default();
            let reached = walk_raw(found[root], rest)
                .map_err(|error| describe(&format!("attribute {:?}", self.roots[root]), &error))?;
            values.push(match reached {
                Ok(Some(raw)) => {
                    let value = plain_value(raw).map_err(|error| {
                        describe(&format!("attribute {:?}", self.roots[root]), &error)
                    })?;
                    convert_read_owned(
                        value,
                        column.kind,
                        column.time_format,
                        Strings::MayBeNumbers,
                    )
                }
                Ok(None) => Ok(ColumnValue::Null),
                Err(mismatch) => Err(mismatch),
            });
        }
        Ok(values)
    }

    /// One attribute's value, read as the format says (reading rules 2 and 3).
    fn attribute(&self, raw: &RawValue, root: &str) -> Result<Value, String> {
        match self.format {
            ValueFormat::Typed => {
                let json: serde_json::Value = serde_json::from_str(raw.get())
                    .map_err(|error| describe(&format!("attribute {root:?}"), &error))?;
                value_from_typed_json(&json, root).map_err(|error| error.to_string())
            }
            ValueFormat::Plain | ValueFormat::PlainExact => {
                plain_value(raw).map_err(|error| describe(&format!("attribute {root:?}"), &error))
            }
        }
    }
}

/// A plain JSON value as an attribute value (rule 3), every number's text kept as written.
fn plain_value(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get().trim_matches([' ', '\t', '\n', '\r']);
    Ok(match text.as_bytes().first() {
        Some(b'{') => {
            let entries: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            Value::M(
                entries
                    .into_iter()
                    .map(|(name, raw)| Ok((name, plain_value(raw)?)))
                    .collect::<Result<_, serde_json::Error>>()?,
            )
        }
        Some(b'[') => {
            let elements: Vec<&RawValue> = serde_json::from_str(text)?;
            Value::L(
                elements
                    .into_iter()
                    .map(plain_value)
                    .collect::<Result<_, _>>()?,
            )
        }
        Some(b'"') => Value::S(serde_json::from_str(text)?),
        Some(b't' | b'f') => Value::Bool(serde_json::from_str(text)?),
        // A raw value is valid JSON, so this is a number and its text is its digits.
        Some(b'-' | b'0'..=b'9') => Value::N(Number::new(text)),
        _ => {
            serde_json::from_str::<()>(text)?;
            Value::Null
        }
    })
}

/// The DynamoDB type a plain JSON value is read as (rule 3), from its first character.
fn plain_tag(raw: &RawValue) -> &'static str {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'{') => "M",
        Some(b'[') => "L",
        Some(b'"') => "S",
        Some(b't' | b'f') => "BOOL",
        Some(b'n') => "NULL",
        _ => "N",
    }
}

/// [`walk`] over plain raw JSON: the raw value `steps` reach from an attribute, by the same
/// rules (an array is a list, so an index reads it).
fn walk_raw<'a>(
    attribute: Option<&'a RawValue>,
    steps: &[PathStep],
) -> Result<Result<Option<&'a RawValue>, Mismatch>, serde_json::Error> {
    let Some(mut at) = attribute else {
        return Ok(Ok(None));
    };
    for step in steps {
        let tag = plain_tag(at);
        let next = match (tag, step) {
            ("NULL", _) => None,
            ("M", PathStep::Name(name)) => {
                key_attributes(at.get(), std::slice::from_ref(name), String::as_str)?
                    .pop()
                    .flatten()
            }
            ("L", PathStep::Index(index)) => serde_json::from_str::<Vec<&RawValue>>(at.get())?
                .get(*index)
                .copied(),
            (_, step) => return Ok(Err(step_mismatch(tag, step))),
        };
        match next {
            Some(value) => at = value,
            None => return Ok(Ok(None)),
        }
    }
    Ok(Ok(Some(at)))
}

/// The mismatch of a step into a value of type `tag` that has no such step (rule 2).
fn step_mismatch(tag: &'static str, step: &PathStep) -> Mismatch {
    let cannot = |why: &str, verb: &str| {
        Mismatch::new(
            tag,
            format!("{} {why}: {} cannot {verb} it", a_tag(tag), StepText(step)),
        )
    };
    match (tag, step) {
        ("SS" | "NS" | "BS", PathStep::Index(_)) => cannot("has no order", "index"),
        (_, PathStep::Index(_)) => cannot("is not a list", "index"),
        (_, PathStep::Name(_)) => cannot("is not a map", "read"),
    }
}

/// The value `steps` reach from an attribute (rule 2): `None` for an absent one, a missing
/// entry or element, or a `NULL` on the way; a mismatch for a step into a value that has no
/// such step.
fn walk<'v>(
    attribute: Option<&'v Value>,
    steps: &[PathStep],
) -> Result<Option<&'v Value>, Mismatch> {
    let Some(mut at) = attribute else {
        return Ok(None);
    };
    for step in steps {
        let next = match (at, step) {
            (Value::Null, _) => None,
            (Value::M(entries), PathStep::Name(name)) => entries.get(name),
            (Value::L(elements), PathStep::Index(index)) => elements.get(*index),
            (value, step) => return Err(step_mismatch(value.type_tag(), step)),
        };
        match next {
            Some(value) => at = value,
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

/// A JSON error described without the JSON's text, which may be personal data: what kind of
/// error and where.
fn describe(what: &str, error: &serde_json::Error) -> String {
    let problem = match error.classify() {
        Category::Data => "is not a JSON object",
        Category::Syntax => "is not valid JSON",
        Category::Eof => "ends before its JSON does",
        Category::Io => "could not be read",
    };
    format!(
        "{what} {problem} (line {}, column {})",
        error.line(),
        error.column()
    )
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
