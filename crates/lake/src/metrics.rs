//! A Parquet file's column metrics, read off its footer when it rolls: what an Iceberg data
//! file's manifest entry carries so that readers skip files (docs/sinks.md §7.11 rule 9).
//!
//! # Rules
//! 1. Per column, by its field id (`rows` rule 7): the bytes its chunks take (compressed), its
//!    values (nulls included) and its nulls, summed over the row groups.
//! 2. Bounds come from the row groups' statistics: the least minimum and the greatest maximum.
//!    A column whose row group holds non-null values but no minimum or maximum gets no bound
//!    at all (a bound must hold for every value); a row group of nulls only adds none.
//! 3. A bound is kept as the statistics give it: the Parquet writer truncates long byte
//!    strings, a truncated minimum stays below every value and a truncated maximum is rounded
//!    up, so both stay bounds. Byte strings compare as unsigned bytes, which is UTF-8's code
//!    point order: the order Iceberg gives strings and binary.
//! 4. Only exact types get bounds (byte strings, 64-bit integers and timestamps, booleans); a
//!    double does not (NaN has no place in an order), and a column without statistics (the
//!    documents, `file` rule 2) has counts only.

use std::collections::HashMap;

use iceberg::spec::{Datum, PrimitiveType, Schema, Type};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;

/// A bound of a column's values, as the file's statistics hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    Bytes(Vec<u8>),
    Long(i64),
    Bool(bool),
}

impl Bound {
    fn less(&self, other: &Bound) -> bool {
        match (self, other) {
            (Bound::Bytes(a), Bound::Bytes(b)) => a < b,
            (Bound::Long(a), Bound::Long(b)) => a < b,
            (Bound::Bool(a), Bound::Bool(b)) => a < b,
            // One column has one physical type.
            _ => false,
        }
    }

    /// The bound as Iceberg keeps a value of `kind` (rule 4).
    fn datum(&self, kind: &PrimitiveType) -> Option<Datum> {
        match (kind, self) {
            (PrimitiveType::String, Bound::Bytes(bytes)) => {
                std::str::from_utf8(bytes).ok().map(Datum::string)
            }
            (PrimitiveType::Binary, Bound::Bytes(bytes)) => Some(Datum::binary(bytes.clone())),
            (PrimitiveType::Long, Bound::Long(value)) => Some(Datum::long(*value)),
            (PrimitiveType::Timestamptz, Bound::Long(value)) => {
                Some(Datum::timestamptz_micros(*value))
            }
            (PrimitiveType::Timestamp, Bound::Long(value)) => Some(Datum::timestamp_micros(*value)),
            (PrimitiveType::Boolean, Bound::Bool(value)) => Some(Datum::bool(*value)),
            _ => None,
        }
    }
}

/// One column's metrics (rule 1), and its bounds while they hold (rule 2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Column {
    bytes: u64,
    values: u64,
    nulls: u64,
    /// A row group did not count its nulls: the column's are not known.
    uncounted: bool,
    bounds: Option<(Bound, Bound)>,
    /// A row group gave no bound for its values: the column has none.
    unbounded: bool,
}

/// The metrics of one Parquet file (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileMetrics {
    columns: HashMap<i32, Column>,
}

/// What an Iceberg data file carries of a file's metrics, by field id.
#[derive(Debug, Default)]
pub struct IcebergMetrics {
    pub column_sizes: HashMap<i32, u64>,
    pub value_counts: HashMap<i32, u64>,
    pub null_value_counts: HashMap<i32, u64>,
    pub lower_bounds: HashMap<i32, Datum>,
    pub upper_bounds: HashMap<i32, Datum>,
}

impl FileMetrics {
    /// The metrics of the file whose footer is `metadata` (rules 1–3).
    pub fn of(metadata: &ParquetMetaData) -> FileMetrics {
        let mut columns: HashMap<i32, Column> = HashMap::new();
        for group in metadata.row_groups() {
            for chunk in group.columns() {
                let info = chunk.column_descr().self_type().get_basic_info();
                if !info.has_id() {
                    continue;
                }
                let column = columns.entry(info.id()).or_default();
                column.bytes += u64::try_from(chunk.compressed_size()).unwrap_or(0);
                let values = u64::try_from(chunk.num_values()).unwrap_or(0);
                column.values += values;
                let nulls = chunk.statistics().and_then(Statistics::null_count_opt);
                match nulls {
                    Some(nulls) => column.nulls += nulls,
                    None => column.uncounted = true,
                }
                let bounds = chunk.statistics().and_then(bounds);
                match bounds {
                    Some((low, high)) => {
                        column.bounds = Some(match column.bounds.take() {
                            None => (low, high),
                            Some((lo, hi)) => (
                                if low.less(&lo) { low } else { lo },
                                if hi.less(&high) { high } else { hi },
                            ),
                        });
                    }
                    // Nulls only: nothing to bound.
                    None if nulls == Some(values) => {}
                    None => column.unbounded = true,
                }
            }
        }
        FileMetrics { columns }
    }

    /// As an Iceberg data file of a table whose schema is `schema` keeps them (rule 4).
    pub fn iceberg(&self, schema: &Schema) -> IcebergMetrics {
        let mut out = IcebergMetrics::default();
        for (&id, column) in &self.columns {
            out.column_sizes.insert(id, column.bytes);
            out.value_counts.insert(id, column.values);
            if !column.uncounted {
                out.null_value_counts.insert(id, column.nulls);
            }
            let kind = schema
                .field_by_id(id)
                .and_then(|field| match &*field.field_type {
                    Type::Primitive(kind) => Some(kind.clone()),
                    _ => None,
                });
            let (Some(kind), Some((low, high)), false) = (kind, &column.bounds, column.unbounded)
            else {
                continue;
            };
            if let (Some(low), Some(high)) = (low.datum(&kind), high.datum(&kind)) {
                out.lower_bounds.insert(id, low);
                out.upper_bounds.insert(id, high);
            }
        }
        out
    }
}

/// A row group's minimum and maximum of a column, when its statistics hold both (rule 2).
fn bounds(statistics: &Statistics) -> Option<(Bound, Bound)> {
    match statistics {
        Statistics::ByteArray(s) => Some((
            Bound::Bytes(s.min_opt()?.data().to_vec()),
            Bound::Bytes(s.max_opt()?.data().to_vec()),
        )),
        Statistics::Int64(s) => Some((Bound::Long(*s.min_opt()?), Bound::Long(*s.max_opt()?))),
        Statistics::Boolean(s) => Some((Bound::Bool(*s.min_opt()?), Bound::Bool(*s.max_opt()?))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema as ArrowSchema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    use parquet::schema::types::ColumnPath;

    use super::*;

    fn field(name: &str, kind: DataType, id: i32) -> Field {
        Field::new(name, kind, true).with_metadata(HashMap::from([(
            "PARQUET:field_id".to_string(),
            id.to_string(),
        )]))
    }

    /// Rules 1–4 over a file of three row groups: the bounds span every group, a group of
    /// nulls only adds none, a column without statistics has counts only.
    #[test]
    fn a_files_metrics_span_its_row_groups() {
        let arrow = Arc::new(ArrowSchema::new(vec![
            field("pk", DataType::Utf8, 1),
            field("n", DataType::Int64, 2),
            field("document", DataType::Utf8, 3),
        ]));
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .set_column_statistics_enabled(ColumnPath::from("document"), EnabledStatistics::None)
            .build();
        let mut writer = ArrowWriter::try_new(Vec::new(), arrow.clone(), Some(properties)).unwrap();
        let rows = RecordBatch::try_new(
            arrow.clone(),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("k5"),
                    Some("k2"),
                    None,
                    None,
                    Some("k9"),
                    Some("é"),
                ])) as ArrayRef,
                Arc::new(Int64Array::from(vec![
                    Some(7),
                    Some(-3),
                    None,
                    None,
                    Some(40),
                    None,
                ])),
                Arc::new(StringArray::from(vec![Some("{}"); 6])),
            ],
        )
        .unwrap();
        writer.write(&rows).unwrap();
        let footer = writer.finish().unwrap();
        assert_eq!(footer.num_row_groups(), 3);
        let schema = iceberg::arrow::arrow_schema_to_schema(&arrow).unwrap();
        let metrics = FileMetrics::of(&footer).iceberg(&schema);
        assert_eq!(
            metrics.value_counts,
            HashMap::from([(1, 6), (2, 6), (3, 6)])
        );
        assert_eq!(metrics.null_value_counts[&1], 2);
        assert_eq!(metrics.null_value_counts[&2], 3);
        assert_eq!(metrics.lower_bounds[&1], Datum::string("k2"));
        // Byte order: "é" (0xC3 0xA9) is above every ASCII key.
        assert_eq!(metrics.upper_bounds[&1], Datum::string("é"));
        assert_eq!(metrics.lower_bounds[&2], Datum::long(-3));
        assert_eq!(metrics.upper_bounds[&2], Datum::long(40));
        assert!(
            !metrics.lower_bounds.contains_key(&3),
            "no statistics, no bounds"
        );
        assert!(metrics.column_sizes[&3] > 0);
    }

    /// Rule 2: a row group with values but no bounds leaves the column unbounded.
    #[test]
    fn a_group_without_bounds_unbounds_the_column() {
        let column = Column {
            bounds: Some((Bound::Long(1), Bound::Long(2))),
            unbounded: true,
            ..Column::default()
        };
        let metrics = FileMetrics {
            columns: HashMap::from([(1, column)]),
        };
        let arrow = ArrowSchema::new(vec![field("n", DataType::Int64, 1)]);
        let schema = iceberg::arrow::arrow_schema_to_schema(&arrow).unwrap();
        let metrics = metrics.iceberg(&schema);
        assert!(metrics.lower_bounds.is_empty() && metrics.upper_bounds.is_empty());
    }
}
