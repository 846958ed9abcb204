use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow_array::{TimestampMicrosecondArray, cast::AsArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::*;

fn columns() -> SchemaRef {
    let field = |name: &str, ty: DataType, id: i32| {
        Field::new(name, ty, true).with_metadata(
            [("PARQUET:field_id".to_string(), id.to_string())]
                .into_iter()
                .collect(),
        )
    };
    Arc::new(Schema::new(vec![
        field("pk", DataType::Utf8, 1),
        field(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            2,
        ),
        field("document", DataType::Utf8, 3),
        field("price", DataType::Float64, 4),
    ]))
}

fn terms(texts: &[&str]) -> Vec<Term> {
    texts.iter().map(|t| Term::parse(t).unwrap()).collect()
}

const DAY_US: i64 = 86_400_000_000;

fn rows(keys: &[&str], times: &[Option<i64>]) -> RecordBatch {
    let n = keys.len();
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(keys.to_vec())),
        Arc::new(TimestampMicrosecondArray::from(times.to_vec()).with_timezone("UTC")),
        Arc::new(StringArray::from(vec!["{}"; n])),
        Arc::new(Float64Array::from(vec![1.5; n])),
    ];
    RecordBatch::try_new(columns(), arrays).unwrap()
}

fn keys(rows: &RecordBatch) -> Vec<String> {
    let column = rows.column(0).as_string::<i32>();
    (0..column.len())
        .map(|i| column.value(i).to_string())
        .collect()
}

#[test]
fn terms_are_read_as_iceberg_spark_and_trino_write_them() {
    let read = |text: &str| Term::parse(text).map(|t| (t.to_string(), t.field_name()));
    assert_eq!(read("pk").unwrap(), ("pk".into(), "pk".into()));
    assert_eq!(read(" identity(pk) ").unwrap(), ("pk".into(), "pk".into()));
    assert_eq!(
        read("days(event_time)").unwrap(),
        ("day(event_time)".into(), "event_time_day".into())
    );
    assert_eq!(read("month(t)").unwrap().1, "t_month");
    assert_eq!(read("year(t)").unwrap().1, "t_year");
    assert_eq!(read("hours(t)").unwrap().1, "t_hour");
    assert_eq!(
        read("bucket(16, pk)").unwrap(),
        ("bucket(16, pk)".into(), "pk_bucket".into())
    );
    // Trino writes the count last.
    assert_eq!(read("bucket(pk, 16)").unwrap().0, "bucket(16, pk)");
    assert_eq!(
        read("truncate(4,pk)").unwrap(),
        ("truncate(4, pk)".into(), "pk_trunc".into())
    );
    for (bad, says) in [
        ("", "empty term"),
        ("week(t)", "no transform 'week'"),
        ("day(a, b)", "day takes one column"),
        ("day()", "day takes one column"),
        ("bucket(pk)", "bucket takes a count and a column"),
        ("bucket(a, b)", "bucket takes a count and a column"),
        ("bucket(0, pk)", "a count above 0"),
        ("day(t", "does not end in ')'"),
    ] {
        let problem = Term::parse(bad).unwrap_err();
        assert!(problem.contains(says), "{bad}: {problem}");
    }
}

#[test]
fn a_term_the_columns_do_not_take_is_refused_naming_it() {
    let refused = |text: &str| Partitioning::bind(&terms(&[text]), &columns()).unwrap_err();
    let problem = refused("day(pk)");
    assert!(problem.contains("'day(pk)': 'pk' is text"), "{problem}");
    assert!(problem.contains("a timestamp"), "{problem}");
    let problem = refused("bucket(4, price)");
    assert!(problem.contains("'price' is double"), "{problem}");
    let problem = refused("sk");
    assert!(
        problem.contains("'sk' is not a column of the table (pk, event_time, document, price)"),
        "{problem}"
    );
    assert!(refused("truncate(8, document)").contains("holds whole items"));
    let problem = Partitioning::bind(&terms(&["pk", "identity(pk)"]), &columns()).unwrap_err();
    assert!(problem.starts_with("'pk':"), "{problem}");
    // What the columns take binds, in order.
    let bound =
        Partitioning::bind(&terms(&["day(event_time)", "bucket(8, pk)"]), &columns()).unwrap();
    assert_eq!(bound.to_string(), "[day(event_time), bucket(8, pk)]");
    assert_eq!(bound.terms().len(), 2);
}

#[test]
fn rows_split_by_day_in_date_order_keeping_their_order() {
    let partitioning = Partitioning::bind(&terms(&["day(event_time)"]), &columns()).unwrap();
    let day = 20_427 * DAY_US; // 2025-12-05
    let parts = partitioning
        .split(rows(
            &["a", "b", "c", "d", "e"],
            &[Some(day + 5), None, Some(day - 1), Some(day), Some(day + 7)],
        ))
        .unwrap();
    let found: Vec<(String, Vec<String>)> = parts
        .iter()
        .map(|(partition, rows)| (partition.dir.clone(), keys(rows)))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                "event_time_day=2025-12-04".to_string(),
                vec!["c".to_string()]
            ),
            (
                "event_time_day=2025-12-05".to_string(),
                vec!["a".to_string(), "d".to_string(), "e".to_string()]
            ),
            ("event_time_day=null".to_string(), vec!["b".to_string()]),
        ]
    );
    assert_eq!(
        parts[1].0.values,
        Struct::from_iter([Some(Literal::date(20_427))])
    );
    assert_eq!(parts[2].0.values, Struct::from_iter([None]));
}

#[test]
fn buckets_are_icebergs_and_unpartitioned_rows_stay_whole() {
    // The Iceberg spec's example: bucket of the string "iceberg" hashes to 1210000089.
    let partitioning = Partitioning::bind(&terms(&["bucket(16, pk)"]), &columns()).unwrap();
    let parts = partitioning.split(rows(&["iceberg"], &[Some(0)])).unwrap();
    assert_eq!(parts[0].0.dir, format!("pk_bucket={}", 1_210_000_089 % 16));
    let whole = Partitioning::bind(&[], &columns()).unwrap();
    let parts = whole.split(rows(&["a", "b"], &[None, Some(0)])).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].0.dir, "");
    assert_eq!(parts[0].0.values, Struct::empty());
    assert_eq!(keys(&parts[0].1), ["a", "b"]);
    assert_eq!(whole.to_string(), "[]");
}

#[test]
fn a_value_becomes_a_safe_bounded_directory_name() {
    let partitioning = Partitioning::bind(&terms(&["pk"]), &columns()).unwrap();
    let long_a = format!("{}a", "x/".repeat(80));
    let long_b = format!("{}b", "x/".repeat(80));
    let parts = partitioning
        .split(rows(&["a/b c", "ü", &long_a, &long_b], &[None; 4]))
        .unwrap();
    let dirs: Vec<&str> = parts.iter().map(|(p, _)| p.dir.as_str()).collect();
    assert!(dirs.contains(&"pk=a%2Fb%20c"), "{dirs:?}");
    // A text that reads `null` and a missing value: two partitions, two directories.
    let texts = partitioning
        .split(rows(&["null", "x"], &[None, None]))
        .unwrap();
    assert_eq!(texts[0].0.dir, "pk=%6Eull");
    let with_missing = RecordBatch::try_new(
        columns(),
        vec![
            Arc::new(StringArray::from(vec![Some("null"), None])) as ArrayRef,
            Arc::new(TimestampMicrosecondArray::from(vec![None, None]).with_timezone("UTC")),
            Arc::new(StringArray::from(vec!["{}"; 2])),
            Arc::new(Float64Array::from(vec![1.5; 2])),
        ],
    )
    .unwrap();
    let apart = partitioning.split(with_missing).unwrap();
    let apart: Vec<&str> = apart.iter().map(|(p, _)| p.dir.as_str()).collect();
    assert_eq!(apart, ["pk=%6Eull", "pk=null"]);
    assert!(dirs.contains(&"pk=%C3%BC"), "{dirs:?}");
    let cut: Vec<&&str> = dirs.iter().filter(|d| d.contains('~')).collect();
    assert_eq!(cut.len(), 2, "{dirs:?}");
    assert_ne!(cut[0], cut[1]);
    assert!(
        cut.iter().all(|d| d.len() <= "pk=".len() + VALUE_BYTES),
        "{dirs:?}"
    );
}

#[test]
fn a_table_spec_is_told_as_terms_and_compared_field_by_field() {
    let day = Partitioning::bind(&terms(&["day(event_time)"]), &columns()).unwrap();
    let bucket = Partitioning::bind(&terms(&["bucket(8, pk)"]), &columns()).unwrap();
    assert!(day.matches(day.spec()));
    assert!(!day.matches(bucket.spec()));
    assert!(!bucket.matches(&PartitionSpec::unpartition_spec()));
    let schema = iceberg::arrow::arrow_schema_to_schema(&columns()).unwrap();
    assert_eq!(describe(bucket.spec(), &schema), "[bucket(8, pk)]");
    let renamed = PartitionSpec::builder(schema.clone())
        .add_partition_field("event_time", "day", Transform::Day)
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(describe(&renamed, &schema), "[day(event_time) as day]");
    assert!(!day.matches(&renamed));
}

#[test]
fn years_months_and_hours_are_named_as_iceberg_names_them() {
    // 2025-12-05T03:04:05Z and a time before 1970.
    let at = 20_427 * DAY_US + (3 * 3600 + 4 * 60 + 5) * 1_000_000;
    for (term, before, after) in [
        (
            "year(event_time)",
            "event_time_year=1969",
            "event_time_year=2025",
        ),
        (
            "month(event_time)",
            "event_time_month=1969-12",
            "event_time_month=2025-12",
        ),
        (
            "hour(event_time)",
            "event_time_hour=1969-12-31-23",
            "event_time_hour=2025-12-05-03",
        ),
    ] {
        let partitioning = Partitioning::bind(&terms(&[term]), &columns()).unwrap();
        let parts = partitioning
            .split(rows(&["a", "b"], &[Some(at), Some(-1)]))
            .unwrap();
        let dirs: Vec<&str> = parts.iter().map(|(p, _)| p.dir.as_str()).collect();
        assert_eq!(dirs, [before, after], "{term}");
    }
    // Iceberg allows one time transform per column.
    let problem = Partitioning::bind(&terms(&["year(event_time)", "day(event_time)"]), &columns())
        .unwrap_err();
    assert!(problem.starts_with("'day(event_time)': "), "{problem}");
}
