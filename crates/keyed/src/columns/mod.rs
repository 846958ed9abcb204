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
use serde_json::value::RawValue;

use crate::OnMismatch;

mod plan;
pub(crate) mod records;

pub(crate) use plan::{ColumnPlan, Naming, TableColumn, plan};
pub(crate) use records::Recorded;

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
    pub fn values(
        &self,
        document: &str,
        stores: impl Fn(&ColumnValue) -> bool,
        key: impl Fn() -> String,
    ) -> Result<Vec<ColumnValue>, String> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        self.resolve(self.reader.read(document)?, stores, key)
    }

    /// [`TypedColumns::values`] of a document whose path roots (`reader().roots()`) its
    /// caller found already, in the pass that read its key.
    pub fn values_found(
        &self,
        found: &[Option<&RawValue>],
        stores: impl Fn(&ColumnValue) -> bool,
        key: impl Fn() -> String,
    ) -> Result<Vec<ColumnValue>, String> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        self.resolve(self.reader.read_found(found)?, stores, key)
    }

    /// The values read, each mismatch (and each value the database cannot store) resolved
    /// per rules 2–4.
    fn resolve(
        &self,
        read: Vec<Result<ColumnValue, Mismatch>>,
        stores: impl Fn(&ColumnValue) -> bool,
        key: impl Fn() -> String,
    ) -> Result<Vec<ColumnValue>, String> {
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
                ddbpipe_value::a_tag(mismatch.found),
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
    use ddbpipe_value::{ColumnPath, ColumnType, TimeFormat};

    use super::*;

    fn columns(on_mismatch: OnMismatch) -> TypedColumns {
        let column = |name: &str, path: &str, kind| ColumnSpec {
            name: name.into(),
            path: ColumnPath::parse(path).expect("a path"),
            kind,
            time_format: TimeFormat::default(),
        };
        TypedColumns::new(
            vec![
                column("qty", "qty", ColumnType::Bigint),
                column("city", "address.city", ColumnType::Text),
            ],
            ValueFormat::Plain,
            on_mismatch,
        )
    }

    const KEY: fn() -> String = || "pk \"a\"".to_string();

    /// Rule 1: values in column order, absent attributes null.
    #[test]
    fn values_are_read_in_column_order() {
        let values = columns(OnMismatch::Fail)
            .values(r#"{"qty":7,"address":{"city":"Oslo"}}"#, |_| true, KEY)
            .expect("values");
        assert_eq!(
            values,
            [ColumnValue::Bigint(7), ColumnValue::Text("Oslo".into())]
        );
        let values = columns(OnMismatch::Fail)
            .values(r#"{"pk":"a"}"#, |_| true, KEY)
            .expect("values");
        assert_eq!(values, [ColumnValue::Null, ColumnValue::Null]);
    }

    /// Rule 3: NULL, and one warning per column (the flag), not per value.
    #[test]
    fn a_mismatch_under_null_is_null_and_marks_its_column_warned() {
        let columns = columns(OnMismatch::Null);
        let document = r#"{"qty":"seven","address":{"city":"Oslo"}}"#;
        let values = columns.values(document, |_| true, KEY).expect("values");
        assert_eq!(
            values,
            [ColumnValue::Null, ColumnValue::Text("Oslo".into())]
        );
        let warned: Vec<bool> = columns
            .warned
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(warned, [true, false]);
        // Clones (the sink's threads) share the flags.
        let clone = columns.clone();
        assert!(clone.warned[0].load(Ordering::Relaxed));
    }

    /// Rule 4: the message names key, column, path, type found; never the value.
    #[test]
    fn a_mismatch_under_fail_names_key_column_path_and_type_found() {
        let document = r#"{"qty":"sev\"en-secret","address":{"city":"Oslo"}}"#;
        let error = columns(OnMismatch::Fail)
            .values(document, |_| true, KEY)
            .expect_err("refused");
        for text in [
            "the item with key pk \"a\"",
            "column 'qty' (path qty, type bigint)",
            "holds an S",
            "set sink.on_type_mismatch: null to store NULL, or change the column's type",
        ] {
            assert!(error.contains(text), "no {text:?} in {error}");
        }
        assert!(!error.contains("secret"), "{error}");
    }

    /// Rule 2: what the database cannot store is a mismatch of its column.
    #[test]
    fn a_value_the_database_cannot_store_is_a_mismatch() {
        let document = r#"{"qty":1,"address":{"city":"a\u0000b"}}"#;
        let no_nul =
            |value: &ColumnValue| !matches!(value, ColumnValue::Text(t) if t.contains('\0'));
        let values = columns(OnMismatch::Null)
            .values(document, no_nul, KEY)
            .expect("values");
        assert_eq!(values, [ColumnValue::Bigint(1), ColumnValue::Null]);
        let error = columns(OnMismatch::Fail)
            .values(document, no_nul, KEY)
            .expect_err("refused");
        assert!(
            error.contains("column 'city'") && error.contains("U+0000"),
            "{error}"
        );
        assert_eq!(
            columns(OnMismatch::Fail).values(document, |_| true, KEY),
            Ok(vec![
                ColumnValue::Bigint(1),
                ColumnValue::Text("a\0b".into())
            ])
        );
    }

    /// Rule 5.
    #[test]
    fn a_document_that_is_no_object_is_an_error() {
        assert!(
            columns(OnMismatch::Null)
                .values("[1]", |_| true, KEY)
                .is_err()
        );
    }

    /// A fill reads the added columns only.
    #[test]
    fn only_keeps_the_named_columns_and_the_policy() {
        let only = columns(OnMismatch::Fail).only(&["city"]);
        assert_eq!(only.reader().columns().len(), 1);
        assert_eq!(only.on_mismatch(), OnMismatch::Fail);
        let values = only
            .values(r#"{"qty":"x","address":{"city":"Oslo"}}"#, |_| true, KEY)
            .expect("qty is not read");
        assert_eq!(values, [ColumnValue::Text("Oslo".into())]);
    }
}
