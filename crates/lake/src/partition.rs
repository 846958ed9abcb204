//! The partitions of a lake table (docs/sinks.md §7.10 rule 3, §7.11 rule 2): the terms of
//! `sink.partition_by`, bound to the table's columns as an Iceberg partition spec, and a
//! batch's rows split by their partition values.
//!
//! # Rules
//! 1. A term is a column (identity) or one of Iceberg's transforms of a column: `year(c)`,
//!    `month(c)`, `day(c)`, `hour(c)`, `bucket(N, c)`, `truncate(W, c)` (the number before or
//!    after the column, as Spark and Trino write them).
//! 2. Its partition field is named as Iceberg names it: the column for identity, else the column
//!    and `_year`, `_month`, `_day`, `_hour`, `_bucket` or `_trunc`.
//! 3. The column is one of the table's other than `document` and `before` (a directory per
//!    item), of a type the transform takes (Iceberg's rules: the time transforms on timestamps,
//!    `bucket` and `truncate` on text, binary and integers, identity on any); a column named
//!    twice is refused.
//! 4. Without `partition_by`: changes by `day(event_time)`, items not at all.
//! 5. A partition's directory is `<field>=<value>` per field, joined by `/`: the value as
//!    Iceberg writes it (a year `2026`, a month `2026-12`, a day `2026-12-05`, an hour
//!    `2026-12-05-03`, a missing value `null`, a text that reads `null` `%6Eull`), every byte outside
//!    `A-Z a-z 0-9 . _ -` as `%XX`, at most [`VALUE_BYTES`] of it (a longer value is cut and
//!    ends in `~` and a hash of it: two values never share a directory by being cut).
//! 6. Rows keep their order within a partition; a batch's partitions come in the order of
//!    their directories (days in date order).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::spec::{
    Literal, PartitionSpec, PrimitiveLiteral, Schema, Struct, StructType, Transform, Type,
};

/// At most this many bytes of a partition value's escaped text in a directory (rule 5).
pub const VALUE_BYTES: usize = 100;

/// One term of `partition_by` (rule 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    column: String,
    transform: Transform,
}

impl Term {
    /// The term written as `text` (rule 1).
    pub fn parse(text: &str) -> Result<Term, String> {
        let text = text.trim();
        let Some((name, rest)) = text.split_once('(') else {
            return match text.is_empty() {
                true => Err("an empty term: give a column or a transform of one".into()),
                false => Ok(Term::new(text, Transform::Identity)),
            };
        };
        let inner = rest.strip_suffix(')').ok_or_else(|| {
            format!("'{text}' does not end in ')': write day(event_time), bucket(16, pk), …")
        })?;
        let arguments: Vec<&str> = inner.split(',').map(str::trim).collect();
        let name = name.trim().to_ascii_lowercase();
        let unary = match name.as_str() {
            "identity" => Some(Transform::Identity),
            "year" | "years" => Some(Transform::Year),
            "month" | "months" => Some(Transform::Month),
            "day" | "days" => Some(Transform::Day),
            "hour" | "hours" => Some(Transform::Hour),
            "bucket" | "truncate" => None,
            other => {
                return Err(format!(
                    "'{text}': no transform '{other}' (identity, year, month, day, hour, \
                     bucket, truncate)"
                ));
            }
        };
        match (unary, arguments.as_slice()) {
            (Some(transform), [column]) if !column.is_empty() => Ok(Term::new(column, transform)),
            (Some(_), _) => Err(format!("'{text}': {name} takes one column: {name}(column)")),
            (None, [a, b]) => {
                let (number, column) = match (a.parse::<u32>(), b.parse::<u32>()) {
                    (Ok(n), Err(_)) => (n, *b),
                    (Err(_), Ok(n)) => (n, *a),
                    _ => {
                        return Err(format!(
                            "'{text}': {name} takes a count and a column: {name}(16, column)"
                        ));
                    }
                };
                if number == 0 || column.is_empty() {
                    return Err(format!(
                        "'{text}': {name} needs a count above 0 and a column"
                    ));
                }
                let transform = match name.as_str() {
                    "bucket" => Transform::Bucket(number),
                    _ => Transform::Truncate(number),
                };
                Ok(Term::new(column, transform))
            }
            (None, _) => Err(format!(
                "'{text}': {name} takes a count and a column: {name}(16, column)"
            )),
        }
    }

    fn new(column: &str, transform: Transform) -> Term {
        Term {
            column: column.to_string(),
            transform,
        }
    }

    /// Rule 2: the partition field's name.
    pub fn field_name(&self) -> String {
        let suffix = match self.transform {
            Transform::Year => "_year",
            Transform::Month => "_month",
            Transform::Day => "_day",
            Transform::Hour => "_hour",
            Transform::Bucket(_) => "_bucket",
            Transform::Truncate(_) => "_trunc",
            _ => "",
        };
        format!("{}{suffix}", self.column)
    }
}

impl std::fmt::Display for Partitioning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", describe(&self.spec, &self.schema))
    }
}

/// `spec` as `partition_by` terms over `schema`'s columns: `[day(event_time)]`, `[]` for none.
pub fn describe(spec: &PartitionSpec, schema: &Schema) -> String {
    let terms: Vec<String> = spec
        .fields()
        .iter()
        .map(|field| {
            let column = schema
                .name_by_field_id(field.source_id)
                .map(str::to_string)
                .unwrap_or_else(|| format!("field {}", field.source_id));
            let term = Term::new(&column, field.transform).to_string();
            match field.name == Term::new(&column, field.transform).field_name() {
                true => term,
                false => format!("{term} as {}", field.name),
            }
        })
        .collect();
    format!("[{}]", terms.join(", "))
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.transform {
            Transform::Identity => write!(f, "{}", self.column),
            Transform::Bucket(n) => write!(f, "bucket({n}, {})", self.column),
            Transform::Truncate(n) => write!(f, "truncate({n}, {})", self.column),
            other => write!(f, "{other}({})", self.column),
        }
    }
}

/// The terms bound to a table's columns: its Iceberg partition spec and how rows are split.
#[derive(Debug, Clone)]
pub struct Partitioning {
    terms: Vec<Term>,
    spec: PartitionSpec,
    schema: Arc<Schema>,
    split: Option<Arc<Splitter>>,
}

#[derive(Debug)]
struct Splitter {
    calculator: PartitionValueCalculator,
    fields: StructType,
}

/// One partition: its directory (rule 5) and its values (the Iceberg data file's partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `<field>=<value>/…`; empty for an unpartitioned table.
    pub dir: String,
    /// The values, one per field.
    pub values: Struct,
}

impl Partitioning {
    /// `terms` bound to the table's `columns` (rule 3).
    pub fn bind(terms: &[Term], columns: &SchemaRef) -> Result<Partitioning, String> {
        let schema = Arc::new(
            iceberg::arrow::arrow_schema_to_schema(columns)
                .map_err(|e| format!("internal error: {e}"))?,
        );
        let mut spec = PartitionSpec::builder(schema.clone());
        for term in terms {
            if ["document", "before"].contains(&term.column.as_str()) {
                return Err(format!(
                    "'{term}': {} holds whole items; partition by a key attribute, a typed \
                     column or event_time",
                    term.column
                ));
            }
            let Some(field) = schema.field_by_name(&term.column) else {
                let names: Vec<&str> = columns.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(format!(
                    "'{term}': '{}' is not a column of the table ({})",
                    term.column,
                    names.join(", ")
                ));
            };
            if term.transform.result_type(&field.field_type).is_err() {
                return Err(format!(
                    "'{term}': '{}' is {}, which {} does not take ({})",
                    term.column,
                    kind(&field.field_type),
                    transform_name(term.transform),
                    takes(term.transform)
                ));
            }
            spec = spec
                .add_partition_field(&term.column, term.field_name(), term.transform)
                .map_err(|e| format!("'{term}': {}", e.message()))?;
        }
        let spec = spec.build().map_err(|e| format!("internal error: {e}"))?;
        let split = match spec.is_unpartitioned() {
            true => None,
            false => Some(Arc::new(Splitter {
                calculator: PartitionValueCalculator::try_new(&spec, &schema)
                    .map_err(|e| format!("internal error: {e}"))?,
                fields: spec
                    .partition_type(&schema)
                    .map_err(|e| format!("internal error: {e}"))?,
            })),
        };
        Ok(Partitioning {
            terms: terms.to_vec(),
            spec,
            schema,
            split,
        })
    }

    /// The terms, as `partition_by` would write them.
    pub fn terms(&self) -> &[Term] {
        &self.terms
    }

    /// The Iceberg partition spec (spec id 0).
    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// Whether a table whose spec is `spec` is partitioned as these terms say (the same
    /// fields: source column ids, transforms, names, in order).
    pub fn matches(&self, spec: &PartitionSpec) -> bool {
        let fields = |spec: &PartitionSpec| {
            spec.fields()
                .iter()
                .map(|f| (f.source_id, f.transform, f.name.clone()))
                .collect::<Vec<_>>()
        };
        fields(spec) == fields(&self.spec)
    }

    /// Rule 6: `rows` by partition, in the order of their directories.
    pub fn split(&self, rows: RecordBatch) -> Result<Vec<(Partition, RecordBatch)>, String> {
        let Some(split) = &self.split else {
            let whole = Partition {
                dir: String::new(),
                values: Struct::empty(),
            };
            return Ok(vec![(whole, rows)]);
        };
        let values = split
            .calculator
            .calculate(&offset_time(&rows)?)
            .and_then(|array| arrow_struct_to_literal(&array, &split.fields))
            .map_err(|e| format!("internal error: partition values: {e}"))?;
        let mut groups: HashMap<Struct, Vec<u32>> = HashMap::new();
        for (row, value) in values.into_iter().enumerate() {
            let Some(Literal::Struct(value)) = value else {
                return Err(format!("internal error: row {row} has no partition value"));
            };
            groups.entry(value).or_default().push(row as u32);
        }
        let mut parts = Vec::with_capacity(groups.len());
        for (values, rows_of) in groups {
            let part = match rows_of.len() == rows.num_rows() {
                true => rows.clone(),
                false => arrow_select::take::take_record_batch(&rows, &UInt32Array::from(rows_of))
                    .map_err(|e| format!("internal error: {e}"))?,
            };
            let dir = dir(&self.spec, &split.fields, &values);
            parts.push((Partition { dir, values }, part));
        }
        parts.sort_by(|a, b| a.0.dir.cmp(&b.0.dir));
        Ok(parts)
    }
}

/// Rule 5: the directory of partition `values` of `spec`, whose values have the types of
/// `fields`.
fn dir(spec: &PartitionSpec, fields: &StructType, values: &Struct) -> String {
    spec.fields()
        .iter()
        .zip(fields.fields())
        .enumerate()
        .map(|(i, (field, ty))| {
            let value = values.fields().get(i).and_then(Option::as_ref);
            let text = time(field.transform, value)
                .unwrap_or_else(|| field.transform.to_human_string(&ty.field_type, value));
            // A value that reads `null` is not a missing one: the two never share a
            // directory (nor, in the writer, an open file and its partition values).
            let shown = match value {
                Some(_) if text == "null" => "%6Eull".to_string(),
                _ => escape(&text),
            };
            format!("{}={shown}", escape(&field.name))
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `rows` with their times' zone `UTC` said as the offset `+00:00`, the only form the `iceberg`
/// crate's time transforms read (without a time zone database); the arrays are shared.
fn offset_time(rows: &RecordBatch) -> Result<RecordBatch, String> {
    let utc =
        |ty: &DataType| matches!(ty, DataType::Timestamp(_, Some(zone)) if zone.as_ref() == "UTC");
    if !rows.schema().fields().iter().any(|f| utc(f.data_type())) {
        return Ok(rows.clone());
    }
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in rows.schema().fields().iter().zip(rows.columns()) {
        match field.data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, Some(zone)) if zone.as_ref() == "UTC" => {
                let offset = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
                fields.push(field.as_ref().clone().with_data_type(offset));
                let times = column.as_primitive::<TimestampMicrosecondType>();
                columns.push(Arc::new(times.clone().with_timezone("+00:00")) as ArrayRef);
            }
            _ => {
                fields.push(field.as_ref().clone());
                columns.push(column.clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns)
        .map_err(|e| format!("internal error: {e}"))
}

/// Rule 5: a year, month or hour as Iceberg writes it (`2026`, `2026-12`, `2026-12-05-03`;
/// a day's value is a date, which says itself).
fn time(transform: Transform, value: Option<&Literal>) -> Option<String> {
    let Some(Literal::Primitive(PrimitiveLiteral::Int(n))) = value else {
        return None;
    };
    let n = i64::from(*n);
    match transform {
        Transform::Year => Some(format!("{:04}", 1970 + n)),
        Transform::Month => Some(format!(
            "{:04}-{:02}",
            1970 + n.div_euclid(12),
            n.rem_euclid(12) + 1
        )),
        Transform::Hour => {
            let at = time::OffsetDateTime::from_unix_timestamp(n * 3600).ok()?;
            Some(format!(
                "{:04}-{:02}-{:02}-{:02}",
                at.year(),
                u8::from(at.month()),
                at.day(),
                at.hour()
            ))
        }
        _ => None,
    }
}

/// Rule 5: `text` as a directory name's part.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => {
                escaped.push(byte as char)
            }
            other => escaped.push_str(&format!("%{other:02X}")),
        }
    }
    if escaped.len() <= VALUE_BYTES {
        return escaped;
    }
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    let mut cut = VALUE_BYTES - 17;
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{:016x}", &escaped[..cut], hasher.finish())
}

fn transform_name(transform: Transform) -> &'static str {
    match transform {
        Transform::Year => "year",
        Transform::Month => "month",
        Transform::Day => "day",
        Transform::Hour => "hour",
        Transform::Bucket(_) => "bucket",
        Transform::Truncate(_) => "truncate",
        _ => "identity",
    }
}

fn takes(transform: Transform) -> &'static str {
    match transform {
        Transform::Year | Transform::Month | Transform::Day | Transform::Hour => {
            "a timestamp: event_time or a timestamptz column"
        }
        Transform::Bucket(_) | Transform::Truncate(_) => "text, binary or a bigint column",
        _ => "a column of any type",
    }
}

/// A column's kind as `columns:` names it.
fn kind(ty: &Type) -> String {
    use iceberg::spec::PrimitiveType as P;
    match ty {
        Type::Primitive(P::String) => "text".into(),
        Type::Primitive(P::Binary) => "binary".into(),
        Type::Primitive(P::Long) => "bigint".into(),
        Type::Primitive(P::Double) => "double".into(),
        Type::Primitive(P::Boolean) => "boolean".into(),
        Type::Primitive(P::Timestamptz) => "a timestamp".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
