//! Records to Arrow rows: the columns of a lake table (docs/sinks.md §7.10) and a batch's
//! records as record batches of them, cut by partition (`partition`).
//!
//! # Columns
//! 1. The key attributes, hash key first, by their names: `S` and `N` as text (a number keeps
//!    its exact digits: nothing is rounded), `B` as binary. Read as the keyed sinks read them,
//!    an item's key and typed columns in one pass over its line (`ddbpipe_keyed::sink`:
//!    `item_attributes`, `key_of`).
//! 2. Scan, query and export runs (items): then `document`, the item as the line ddbpipe
//!    writes it (`value_format`), never null.
//! 3. Streams and mirror runs (envelopes): `op` (`c`, `u`, `d`, `r`), `sequence_number`,
//!    `event_time` (UTC, in µs as Iceberg keeps time: the record's `ts_ms`; a snapshot row's,
//!    the time its page was read), `shard_id`, `document` (the new image; null for a delete),
//!    and `before` (the old image) when the stream's view has old images.
//! 4. Then the typed columns (`sink.columns`, docs/sinks.md §7.9), nullable, in the order
//!    listed, read out of the document (a change's new image; null for a delete) by the keyed
//!    sinks' reader under `sink.on_type_mismatch`: `text`, `numeric` (the exact digits as a
//!    string: a Parquet decimal has one scale, a DynamoDB number any), `jsonb` as `string`;
//!    `bigint` as `int64`, `double` as `double`, `boolean` as `bool`, `timestamptz` as
//!    `timestamp[us, UTC]`.
//! 5. A key attribute or typed column named as a column of rules 2–3 (or as each other) is
//!    refused when the sink opens, naming it: the two could not be told apart.
//! 6. A record that cannot become a row fails the batch, named by its event id and shard (or
//!    its start), never by a value: nothing of the batch is written.
//! 7. Every column carries a field id, 1 up in column order, in the files' Parquet schema: what
//!    Iceberg readers find columns by (the Iceberg sink's table schema has the same ids).

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use ddbpipe_keyed::sink::{item_attributes, key_of, short};
use ddbpipe_keyed::{
    ColumnType, ColumnValue, KeyColumn, KeyType, KeyValue, TypedColumns, describe_key,
};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::envelope::EnvelopeFields;
use ddbpipe_source::records::Lines;
use ddbpipe_value::ValueFormat;

use crate::partition::{Partition, Partitioning, Term};

/// The columns of a lake table and how records fill them.
#[derive(Debug, Clone)]
pub struct Shape {
    key: Vec<KeyColumn>,
    /// What an item is read for in one pass: the key attributes, then the typed columns'
    /// roots (`ddbpipe_keyed::sink::item_attributes`).
    attributes: Vec<String>,
    format: ValueFormat,
    records: Records,
    before: bool,
    typed: Option<TypedColumns>,
    schema: SchemaRef,
    partitioning: Partitioning,
}

/// Rows of one partition.
#[derive(Debug)]
pub struct Part {
    /// The partition.
    pub partition: Partition,
    /// The rows.
    pub rows: RecordBatch,
}

impl Shape {
    /// The columns of records of `records` kind from a table whose key is `key` (rule 1),
    /// written in `format`; `before`: the stream's view has old images (rule 3).
    pub fn new(
        key: Vec<(String, KeyType)>,
        format: ValueFormat,
        records: Records,
        before: bool,
    ) -> Result<Shape, String> {
        Shape::typed(key, format, records, before, None)
    }

    /// [`Shape::new`] with typed columns after the others (rule 4).
    pub fn typed(
        key: Vec<(String, KeyType)>,
        format: ValueFormat,
        records: Records,
        before: bool,
        typed: Option<TypedColumns>,
    ) -> Result<Shape, String> {
        let key: Vec<KeyColumn> = key
            .into_iter()
            .map(|(name, kind)| KeyColumn { name, kind })
            .collect();
        let mut fields: Vec<Field> = key
            .iter()
            .map(|column| {
                let data_type = match column.kind {
                    KeyType::S | KeyType::N => DataType::Utf8,
                    KeyType::B => DataType::Binary,
                };
                Field::new(&column.name, data_type, false)
            })
            .collect();
        let added: &[(&str, DataType, bool)] = match records {
            Records::Items => &[("document", DataType::Utf8, false)],
            Records::Envelopes => &[
                ("op", DataType::Utf8, false),
                ("sequence_number", DataType::Utf8, true),
                ("event_time", timestamp(), true),
                ("shard_id", DataType::Utf8, true),
                ("document", DataType::Utf8, true),
                ("before", DataType::Utf8, true),
            ],
        };
        for (name, data_type, nullable) in added {
            if *name == "before" && !before {
                continue;
            }
            if let Some(column) = key.iter().find(|column| column.name == *name) {
                return Err(format!(
                    "key attribute '{}' has the name of a column the lake sink adds \
                     ({}); such a table cannot be written to the lake yet",
                    column.name,
                    added
                        .iter()
                        .map(|(name, ..)| *name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            fields.push(Field::new(*name, data_type.clone(), *nullable));
        }
        let typed = typed.filter(|typed| !typed.reader().columns().is_empty());
        for column in typed.iter().flat_map(|t| t.reader().columns()) {
            if fields.iter().any(|field| field.name() == &column.name) {
                return Err(format!(
                    "typed column '{}' has the name of a key attribute or of a column the lake \
                     sink adds ({}): choose another name",
                    column.name,
                    fields
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            fields.push(Field::new(&column.name, typed_type(column.kind), true));
        }
        let attributes = match &typed {
            Some(typed) => item_attributes(&key, typed),
            None => key.iter().map(|column| column.name.clone()).collect(),
        };
        let schema = Arc::new(Schema::new(numbered(fields)));
        // `partition` rule 4: changes by day, items not at all.
        let terms = match records {
            Records::Items => Vec::new(),
            Records::Envelopes => vec![Term::parse("day(event_time)")?],
        };
        Ok(Shape {
            key,
            attributes,
            format,
            records,
            before,
            typed,
            partitioning: Partitioning::bind(&terms, &schema)?,
            schema,
        })
    }

    /// The shape with its rows partitioned by `terms` (`sink.partition_by`) instead of the
    /// default (`partition` rule 4); a term the columns do not take is refused (rule 3).
    pub fn partitioned(mut self, terms: &[Term]) -> Result<Shape, String> {
        self.partitioning = Partitioning::bind(terms, &self.schema)?;
        Ok(self)
    }

    /// How the rows are partitioned.
    pub fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    /// The table's columns.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The columns whose values are nearly all distinct: the key attributes, `document`,
    /// `before` and `sequence_number`.
    pub fn distinct_columns(&self) -> Vec<String> {
        let mut names: Vec<String> = self.key.iter().map(|c| c.name.clone()).collect();
        for name in ["document", "before", "sequence_number"] {
            if self.schema.field_with_name(name).is_ok() {
                names.push(name.to_string());
            }
        }
        names
    }

    /// What the records are.
    pub fn records(&self) -> Records {
        self.records
    }

    /// The rows of `batch`, by partition in the order of their directories (rule 6: the first
    /// bad record fails all).
    pub fn parts(&self, batch: &Batch) -> Result<Vec<Part>, String> {
        let mut columns = self.columns(&batch.records);
        for i in 0..batch.records.len() {
            let line = batch.records.get(i).unwrap_or_default();
            let text = std::str::from_utf8(line)
                .map_err(|_| format!("record {i} of the batch is not UTF-8"))?;
            match self.records {
                Records::Items => {
                    let (key, values) = self.read_item(&batch.records, i, text)?;
                    columns.push_key(&key);
                    columns.text[0].append_value(text);
                    columns.push_typed(values);
                }
                Records::Envelopes => {
                    self.push_envelope(&batch.records, i, text, batch.read_ms, &mut columns)?
                }
            }
        }
        let rows = RecordBatch::try_new(self.schema.clone(), columns.finish(self))
            .map_err(|e| format!("internal error: rows do not fit the columns: {e}"))?;
        let parts = self.partitioning.split(rows)?;
        Ok(parts
            .into_iter()
            .map(|(partition, rows)| Part { partition, rows })
            .collect())
    }

    /// The empty columns of `records`' rows, sized for them: the documents (and old images)
    /// hold at most the records' bytes, so filling them copies nothing twice. Reserved, not
    /// touched: memory only holds what is written.
    fn columns(&self, records: &Lines) -> Columns {
        let (rows, bytes) = (records.len(), records.bytes());
        // Items: `document`. Envelopes: `op`, `sequence_number`, `shard_id` (short), then
        // `document` and `before` (each at most the records' bytes; `before` only when the
        // stream's view has old images, else it stays empty).
        let before = if self.before { bytes } else { 0 };
        let texts: &[usize] = match self.records {
            Records::Items => &[bytes],
            Records::Envelopes => &[2 * rows, 32 * rows, 64 * rows, bytes, before],
        };
        Columns {
            key: self
                .key
                .iter()
                .map(|column| match column.kind {
                    KeyType::B => KeyBuilder::Binary(BinaryBuilder::with_capacity(rows, 0)),
                    KeyType::S | KeyType::N => {
                        KeyBuilder::Text(StringBuilder::with_capacity(rows, 32 * rows))
                    }
                })
                .collect(),
            text: texts
                .iter()
                .map(|&bytes| StringBuilder::with_capacity(rows, bytes))
                .collect(),
            time: TimestampMicrosecondBuilder::new(),
            typed: self
                .typed
                .iter()
                .flat_map(|t| t.reader().columns())
                .map(|column| TypedColumn::new(column.kind))
                .collect(),
        }
    }

    /// An item's key and typed columns, read in one pass over its line (as the keyed sinks
    /// read it), or without reading it where the page noted them: record `i` of `records`.
    fn read_item(
        &self,
        records: &Lines,
        i: usize,
        text: &str,
    ) -> Result<(Vec<KeyValue>, Vec<ColumnValue>), String> {
        let unreadable = |problem: String| format!("item {}: {problem}", short(text));
        let found = records
            .attributes(i, text, &self.attributes, String::as_str)
            .map_err(|e| unreadable(format!("not a JSON object: {e}")))?;
        let (key_found, roots_found) = found.split_at(self.key.len());
        let key = key_of(&self.key, key_found, self.format).map_err(unreadable)?;
        let values = match &self.typed {
            Some(typed) => typed
                .values_found(roots_found, |_| true, || describe_key(&self.key, &key))
                .map_err(unreadable)?,
            None => Vec::new(),
        };
        Ok((key, values))
    }

    fn push_envelope(
        &self,
        records: &Lines,
        i: usize,
        text: &str,
        read_ms: Option<i64>,
        columns: &mut Columns,
    ) -> Result<(), String> {
        // Its fields where its page noted them, else read from it (record `i` of `records`).
        let envelope = EnvelopeFields::of(records, i, text)
            .map_err(|e| format!("record is not an envelope: {e}"))?;
        let record = || envelope.record();
        let raw = present(envelope.key).ok_or_else(|| format!("{} has no key", record()))?;
        let found = ddbpipe_value::key_attributes(raw, &self.key, |c| c.name.as_str())
            .map_err(|e| format!("{}: its key is not an object: {e}", record()))?;
        let key = key_of(&self.key, &found, self.format)
            .map_err(|problem| format!("{}: {problem}", record()))?;
        let document = present(envelope.after);
        match envelope.op.as_ref() {
            "c" | "u" | "r" if document.is_none() => {
                return Err(format!(
                    "{} has no new image: the lake sinks need a stream view of NEW_IMAGE or \
                     NEW_AND_OLD_IMAGES",
                    record()
                ));
            }
            "c" | "u" | "r" | "d" => {}
            other => {
                return Err(format!(
                    "{} has op '{other}', which the lake sinks cannot store (only c, u, d and r)",
                    record()
                ));
            }
        }
        let values = self.typed_values(document, &key, record)?;
        let time = if envelope.op == "r" {
            read_ms
        } else {
            envelope.ts_ms
        };
        columns.push_key(&key);
        columns.text[0].append_value(envelope.op.as_ref());
        columns.text[1].append_option(envelope.sequence_number.as_deref());
        columns.time.append_option(time.map(|ms| ms * 1000));
        columns.text[2].append_option(envelope.shard_id.as_deref());
        columns.text[3].append_option(document);
        columns.text[4].append_option(present(envelope.before));
        columns.push_typed(values);
        Ok(())
    }

    /// The typed columns' values of `document` (rule 4): all null without a document (a
    /// delete); a mismatch under `fail` names the record by its key.
    fn typed_values(
        &self,
        document: Option<&str>,
        key: &[KeyValue],
        record: impl Fn() -> String,
    ) -> Result<Vec<ColumnValue>, String> {
        let Some(typed) = &self.typed else {
            return Ok(Vec::new());
        };
        let Some(document) = document else {
            return Ok(vec![ColumnValue::Null; typed.reader().columns().len()]);
        };
        typed
            .values(document, |_| true, || describe_key(&self.key, key))
            .map_err(|problem| format!("{}: {problem}", record()))
    }
}

/// The Arrow type of a typed column (rule 4).
/// Rule 7: each column's field id, 1 up in order, in its Parquet schema.
fn numbered(fields: Vec<Field>) -> Vec<Field> {
    fields
        .into_iter()
        .zip(1..)
        .map(|(field, id): (Field, i32)| {
            field.with_metadata(
                [(FIELD_ID.to_string(), id.to_string())]
                    .into_iter()
                    .collect(),
            )
        })
        .collect()
}

/// The Arrow field metadata key the Parquet writer stores as a column's field id.
const FIELD_ID: &str = "PARQUET:field_id";

fn typed_type(kind: ColumnType) -> DataType {
    match kind {
        ColumnType::Text | ColumnType::Numeric | ColumnType::Jsonb => DataType::Utf8,
        ColumnType::Bigint => DataType::Int64,
        ColumnType::Double => DataType::Float64,
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::Timestamptz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    }
}

/// The type of `event_time`.
fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// A JSON value other than `null`.
fn present(raw: Option<&str>) -> Option<&str> {
    raw.filter(|raw| *raw != "null")
}

/// The columns of one partition being filled.
struct Columns {
    key: Vec<KeyBuilder>,
    /// Items: `document`. Envelopes: `op`, `sequence_number`, `shard_id`, `document`,
    /// `before`.
    text: Vec<StringBuilder>,
    time: TimestampMicrosecondBuilder,
    typed: Vec<TypedColumn>,
}

/// The builder of a typed column, by its Arrow type.
enum TypedColumn {
    Text(StringBuilder),
    Int(Int64Builder),
    Double(Float64Builder),
    Bool(BooleanBuilder),
    Time(TimestampMicrosecondBuilder),
}

impl TypedColumn {
    fn new(kind: ColumnType) -> TypedColumn {
        match kind {
            ColumnType::Text | ColumnType::Numeric | ColumnType::Jsonb => {
                TypedColumn::Text(StringBuilder::new())
            }
            ColumnType::Bigint => TypedColumn::Int(Int64Builder::new()),
            ColumnType::Double => TypedColumn::Double(Float64Builder::new()),
            ColumnType::Boolean => TypedColumn::Bool(BooleanBuilder::new()),
            ColumnType::Timestamptz => TypedColumn::Time(TimestampMicrosecondBuilder::new()),
        }
    }

    /// Appends `value`; a value of another type than the column's (which the reader never
    /// gives) is stored as null.
    fn push(&mut self, value: ColumnValue) {
        match (self, value) {
            (
                TypedColumn::Text(b),
                ColumnValue::Text(text) | ColumnValue::Numeric(text) | ColumnValue::Json(text),
            ) => b.append_value(text),
            (TypedColumn::Int(b), ColumnValue::Bigint(v)) => b.append_value(v),
            (TypedColumn::Double(b), ColumnValue::Double(v)) => b.append_value(v),
            (TypedColumn::Bool(b), ColumnValue::Boolean(v)) => b.append_value(v),
            (TypedColumn::Time(b), ColumnValue::Timestamp(v)) => b.append_value(v),
            (TypedColumn::Text(b), _) => b.append_null(),
            (TypedColumn::Int(b), _) => b.append_null(),
            (TypedColumn::Double(b), _) => b.append_null(),
            (TypedColumn::Bool(b), _) => b.append_null(),
            (TypedColumn::Time(b), _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            TypedColumn::Text(b) => Arc::new(b.finish()),
            TypedColumn::Int(b) => Arc::new(b.finish()),
            TypedColumn::Double(b) => Arc::new(b.finish()),
            TypedColumn::Bool(b) => Arc::new(b.finish()),
            TypedColumn::Time(b) => Arc::new(b.finish().with_timezone("UTC")),
        }
    }
}

enum KeyBuilder {
    Text(StringBuilder),
    Binary(BinaryBuilder),
}

impl Columns {
    fn push_typed(&mut self, values: Vec<ColumnValue>) {
        for (column, value) in self.typed.iter_mut().zip(values) {
            column.push(value);
        }
    }

    fn push_key(&mut self, key: &[KeyValue]) {
        for (column, value) in self.key.iter_mut().zip(key) {
            match (column, value) {
                (KeyBuilder::Text(b), KeyValue::S(text) | KeyValue::N(text)) => {
                    b.append_value(text)
                }
                (KeyBuilder::Binary(b), KeyValue::B(bytes)) => b.append_value(bytes),
                // `key_value` answers with the kind it was asked for.
                (KeyBuilder::Text(b), KeyValue::B(_)) => b.append_null(),
                (KeyBuilder::Binary(b), _) => b.append_null(),
            }
        }
    }

    /// The arrays in the schema's order (`Shape::new`).
    fn finish(mut self, shape: &Shape) -> Vec<ArrayRef> {
        let mut arrays: Vec<ArrayRef> = self
            .key
            .iter_mut()
            .map(|column| match column {
                KeyBuilder::Text(b) => Arc::new(b.finish()) as ArrayRef,
                KeyBuilder::Binary(b) => Arc::new(b.finish()) as ArrayRef,
            })
            .collect();
        let mut text = self
            .text
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        match shape.records {
            Records::Items => arrays.extend(text),
            Records::Envelopes => {
                arrays.extend(text.by_ref().take(2));
                arrays.push(Arc::new(self.time.finish().with_timezone("UTC")));
                arrays.extend(text.by_ref().take(2));
                if shape.before {
                    arrays.extend(text);
                }
            }
        }
        arrays.extend(self.typed.iter_mut().map(TypedColumn::finish));
        arrays
    }
}

#[cfg(test)]
mod tests;
