//! Typed columns of a keyed table (docs/sinks.md §7.9): a row's values read out of its
//! document under `sink.on_type_mismatch`, and the comparison of the configured columns with
//! an existing table (`plan`: what `prepare` does and `check` reports).
//!
//! # Values
//! 1. A row's typed columns are read from its document (a change's `after`) by
//!    [`ColumnReader`](ddbpipe_value::ColumnReader), which decides every conversion; a column
//!    added to a table with rows is filled from the stored documents by the very same reader
//!    (`TypedColumns::values`), never by a conversion in SQL.
//! 2. A converted value the database cannot store is a mismatch too: PostgreSQL `text` and
//!    `jsonb` hold no U+0000 (the backend says what it stores).
//! 3. Under `on_type_mismatch: null` a mismatch is stored as NULL, counted in
//!    `ddbpipe_column_mismatches_total{column}`, and the first of each column (per
//!    [`TypedColumns`] value, i.e. per sink) is logged as a warning naming the column, its
//!    path, the type found and the record's key, never the value.
//! 4. Under `fail` it is an error naming the column, its path, the record's key and the type
//!    found, and what to do; the batch (or the fill) it belongs to writes nothing.
//! 5. A document that is not a JSON object fails as an unreadable record does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ddbpipe_value::{ColumnReader, ColumnSpec, ColumnValue, Mismatch, ValueFormat};

use crate::OnMismatch;

mod plan;

pub(crate) use plan::{ColumnPlan, Naming, TableColumn, plan};

/// The name of the mismatch counter (rule 3).
const MISMATCHES: &str = "ddbpipe_column_mismatches_total";

/// Describes the keyed sinks' metrics to the installed recorder (the `# HELP` lines of the
/// Prometheus text format). Call once, after installing a recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        MISMATCHES,
        "Attribute values that did not fit their typed column and were stored as NULL \
         (sink.on_type_mismatch: null), by column"
    );
}

/// The typed columns of a table as its documents give them: the reader of the documents'
/// format, and what a value that does not fit does (`sink.on_type_mismatch`).
#[derive(Debug, Clone)]
pub struct TypedColumns {
    reader: ColumnReader,
    /// The format of the documents (`reader`'s).
    format: ValueFormat,
    on_mismatch: OnMismatch,
    /// Per column: a mismatch was logged already (rule 3).
    warned: Arc<[AtomicBool]>,
}

impl TypedColumns {
    /// Reads `columns` out of documents rendered in `format`, under `on_mismatch`.
    pub fn new(columns: Vec<ColumnSpec>, format: ValueFormat, on_mismatch: OnMismatch) -> Self {
        let warned = columns.iter().map(|_| AtomicBool::new(false));
        TypedColumns {
            warned: warned.collect(),
            reader: ColumnReader::new(columns, format),
            format,
            on_mismatch,
        }
    }

    /// The reader.
    pub fn reader(&self) -> &ColumnReader {
        &self.reader
    }

    /// What a mismatch does.
    pub fn on_mismatch(&self) -> OnMismatch {
        self.on_mismatch
    }

    /// The same reading, of the columns named `names` only (a fill of added columns).
    pub(crate) fn only(&self, names: &[&str]) -> TypedColumns {
        let columns = self
            .reader
            .columns()
            .iter()
            .filter(|column| names.contains(&column.name.as_str()))
            .cloned()
            .collect();
        TypedColumns::new(columns, self.format, self.on_mismatch)
    }

    /// Whether there are no columns to read.
    pub(crate) fn is_empty(&self) -> bool {
        self.reader.columns().is_empty()
    }

    /// The values of `document`'s columns in column order (rules 1–4): `stores` says whether
    /// the database holds a converted value (rule 2), `key` describes the record's key for
    /// messages. `Err` is the message of a failed record.
    pub(crate) fn values(
        &self,
        document: &str,
        stores: impl Fn(&ColumnValue) -> bool,
        key: impl Fn() -> String,
    ) -> Result<Vec<ColumnValue>, String> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let read = self.reader.read(document)?;
        let mut values = Vec::with_capacity(read.len());
        for (index, (value, column)) in read.into_iter().zip(self.reader.columns()).enumerate() {
            let value = value.and_then(|value| {
                if stores(&value) {
                    Ok(value)
                } else {
                    Err(unstorable(&value))
                }
            });
            match value {
                Ok(value) => values.push(value),
                Err(mismatch) => {
                    values.push(self.mismatched(index, column, &mismatch, &key)?);
                }
            }
        }
        Ok(values)
    }

    /// A mismatch of column `index` (rules 3 and 4).
    fn mismatched(
        &self,
        index: usize,
        column: &ColumnSpec,
        mismatch: &Mismatch,
        key: &impl Fn() -> String,
    ) -> Result<ColumnValue, String> {
        match self.on_mismatch {
            OnMismatch::Fail => Err(format!(
                "the item with key {} does not fit column '{}' (path {}, type {}): {} holds {} \
                 ({}); set sink.on_type_mismatch: null to store NULL, or change the column's type",
                key(),
                column.name,
                column.path,
                column.kind,
                column.path,
                article(mismatch.found),
                mismatch.why
            )),
            OnMismatch::Null => {
                metrics::counter!(MISMATCHES, "column" => column.name.clone()).increment(1);
                let first = self
                    .warned
                    .get(index)
                    .is_some_and(|warned| !warned.swap(true, Ordering::Relaxed));
                if first {
                    tracing::warn!(
                        column = %column.name,
                        path = %column.path,
                        r#type = %column.kind,
                        found = mismatch.found,
                        key = %key(),
                        "A value does not fit its typed column and is stored as NULL \
                         (sink.on_type_mismatch: null); further mismatches of this column are \
                         only counted in ddbpipe_column_mismatches_total."
                    );
                }
                Ok(ColumnValue::Null)
            }
        }
    }
}

/// The mismatch of a converted value the database cannot store (rule 2): a text or JSON
/// holding U+0000.
fn unstorable(value: &ColumnValue) -> Mismatch {
    let found = match value {
        ColumnValue::Json(text) if text.starts_with('{') => "M",
        ColumnValue::Json(text) if text.starts_with('[') => "L",
        _ => "S",
    };
    Mismatch {
        found,
        why: "a string holding U+0000, which PostgreSQL cannot store in text or jsonb".into(),
    }
}

/// "an S", "a BOOL": a type tag with its article.
fn article(tag: &str) -> String {
    let vowel_sound = tag != "NULL" && matches!(tag.chars().next(), Some('S' | 'N' | 'M' | 'L'));
    format!("{} {tag}", if vowel_sound { "an" } else { "a" })
}

/// What `check` finds about a table's columns ([`Database::check_columns`](crate::Database::check_columns)):
/// what the run would refuse and what it would change; nothing is changed by asking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColumnCheck {
    /// Why the run would refuse to start (each a complete sentence; empty: it would not).
    pub refusals: Vec<String>,
    /// What the run would do or leave: columns it adds (and fills), columns it no longer
    /// writes.
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_tags_take_their_article() {
        assert_eq!(article("S"), "an S");
        assert_eq!(article("N"), "an N");
        assert_eq!(article("BOOL"), "a BOOL");
        assert_eq!(article("B"), "a B");
        assert_eq!(article("NS"), "an NS");
        assert_eq!(article("NULL"), "a NULL");
    }
}
