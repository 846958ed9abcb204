use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use ddbpipe_source::records::Lines;

use super::*;

fn batch(lines: &[&str], read_ms: Option<i64>) -> Batch {
    let mut records = Lines::with_capacity(lines.len(), 0);
    for line in lines {
        records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    }
    Batch {
        records,
        read_ms,
        ..Batch::default()
    }
}

fn key() -> Vec<(String, KeyType)> {
    vec![("pk".into(), KeyType::S), ("n".into(), KeyType::N)]
}

#[test]
fn items_keep_their_key_exactly_and_their_line_as_the_document() {
    let shape = Shape::new(key(), ValueFormat::Plain, Records::Items, false).unwrap();
    let big = "12345678901234567890123456789012345678";
    let line = format!(r#"{{"pk":"a","n":{big},"v":[1,2]}}"#);
    let parts = shape.parts(&batch(&[&line], None)).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].partition.dir, "", "items are not partitioned");
    let rows = &parts[0].rows;
    let names: Vec<_> = rows
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["pk", "n", "document"]);
    assert_eq!(rows.column(1).as_string::<i32>().value(0), big);
    assert_eq!(rows.column(2).as_string::<i32>().value(0), line);
}

/// An item whose page noted its key (`Lines::noted`) gives its key columns from the notes,
/// without reading the record again: notes pointing elsewhere than the record's own `pk` and
/// `n`, which only rows taken from the notes follow; the document is the record as it is.
#[test]
fn items_take_their_key_from_the_pages_notes() {
    let shape = Shape::new(key(), ValueFormat::Plain, Records::Items, false).unwrap();
    let line = r#"{"m":"noted","n":1,"o":99,"pk":"read"}"#;
    let at = |value: &str| {
        let start = line.find(value).unwrap();
        start..start + value.len()
    };
    let mut records = Lines::default();
    records.note_attributes(vec!["n".to_string(), "pk".to_string()].into());
    records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    records.note_last(|name| {
        Some(if name == "pk" {
            at(r#""noted""#)
        } else {
            at("99")
        })
    });
    let parts = shape
        .parts(&Batch {
            records,
            ..Batch::default()
        })
        .unwrap();
    let rows = &parts[0].rows;
    assert_eq!(rows.column(0).as_string::<i32>().value(0), "noted");
    assert_eq!(rows.column(1).as_string::<i32>().value(0), "99");
    assert_eq!(rows.column(2).as_string::<i32>().value(0), line);
    let rows = &shape.parts(&batch(&[line], None)).unwrap()[0].rows;
    assert_eq!(rows.column(0).as_string::<i32>().value(0), "read");
}

#[test]
fn changes_are_cut_by_the_day_of_their_time_and_snapshot_rows_take_their_read_time() {
    let shape = Shape::new(key(), ValueFormat::Plain, Records::Envelopes, true).unwrap();
    let day = 86_400_000_i64;
    let change = |op: &str, at: i64, after: &str| {
        format!(
            r#"{{"op":"{op}","key":{{"pk":"a","n":1}},"after":{after},"before":{{"pk":"a","n":1,"old":true}},"event_id":"e","shard_id":"s1","sequence_number":"100","ts_ms":{at}}}"#
        )
    };
    let snapshot = r#"{"op":"r","key":{"pk":"b","n":2},"after":{"pk":"b","n":2},"before":null,"shard_id":null,"sequence_number":null,"ts_ms":null}"#;
    let lines = [
        change("c", 20_000 * day + 5, r#"{"pk":"a","n":1}"#),
        change("d", 20_001 * day, "null"),
        snapshot.to_string(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let parts = shape.parts(&batch(&lines, Some(20_000 * day + 9))).unwrap();
    let days: Vec<_> = parts.iter().map(|p| p.partition.dir.as_str()).collect();
    assert_eq!(
        days,
        ["event_time_day=2024-10-04", "event_time_day=2024-10-05"]
    );
    let first = &parts[0].rows;
    assert_eq!(
        first.num_rows(),
        2,
        "the change and the snapshot row of that day"
    );
    let ops = first.column(2).as_string::<i32>();
    assert_eq!((ops.value(0), ops.value(1)), ("c", "r"));
    let times = first.column(4).as_primitive::<TimestampMicrosecondType>();
    assert_eq!(
        times.value(1),
        (20_000 * day + 9) * 1000,
        "a snapshot row's read time"
    );
    let deleted = &parts[1].rows;
    assert!(deleted.column(6).is_null(0), "a delete has no document");
    assert!(!deleted.column(7).is_null(0), "the old image is kept");
    let without = Shape::new(key(), ValueFormat::Plain, Records::Envelopes, false).unwrap();
    assert!(without.schema().field_with_name("before").is_err());
}

#[test]
fn typed_and_binary_keys_are_read_as_the_keyed_sinks_read_them() {
    let shape = Shape::new(
        vec![("id".into(), KeyType::B)],
        ValueFormat::Typed,
        Records::Items,
        false,
    )
    .unwrap();
    let parts = shape
        .parts(&batch(&[r#"{"id":{"B":"AP8="},"x":{"S":"y"}}"#], None))
        .unwrap();
    assert_eq!(
        parts[0].rows.column(0).as_binary::<i32>().value(0),
        [0, 255]
    );
}

#[test]
fn a_record_that_cannot_be_a_row_is_named_and_fails_the_batch() {
    let shape = Shape::new(key(), ValueFormat::Plain, Records::Envelopes, false).unwrap();
    let no_key =
        r#"{"op":"u","key":null,"after":{"pk":"a"},"event_id":"e7","shard_id":"s9","ts_ms":1}"#;
    let problem = shape.parts(&batch(&[no_key], None)).unwrap_err();
    assert_eq!(problem, "record e7 in s9 has no key");
    let keys_only = r#"{"op":"u","key":{"pk":"a","n":1},"after":null,"event_id":"e8","shard_id":"s9","ts_ms":1}"#;
    let problem = shape.parts(&batch(&[keys_only], None)).unwrap_err();
    assert!(
        problem.contains("record e8 in s9 has no new image"),
        "{problem}"
    );
    let items = Shape::new(key(), ValueFormat::Plain, Records::Items, false).unwrap();
    let problem = items.parts(&batch(&[r#"{"pk":"a"}"#], None)).unwrap_err();
    assert!(
        problem.contains("key attribute 'n' is missing"),
        "{problem}"
    );
}

#[test]
fn a_key_attribute_named_like_an_added_column_is_refused() {
    let problem = Shape::new(
        vec![("op".into(), KeyType::S)],
        ValueFormat::Plain,
        Records::Envelopes,
        false,
    )
    .unwrap_err();
    assert!(problem.contains("key attribute 'op'"), "{problem}");
    assert!(
        Shape::new(
            vec![("op".into(), KeyType::S)],
            ValueFormat::Plain,
            Records::Items,
            false
        )
        .is_ok()
    );
}

fn typed_columns(on_mismatch: ddbpipe_keyed::OnMismatch) -> TypedColumns {
    let column = |name: &str, path: &str, kind: ColumnType| ddbpipe_keyed::ColumnSpec {
        name: name.into(),
        path: ddbpipe_value::ColumnPath::parse(path).unwrap(),
        kind,
        time_format: ddbpipe_keyed::TimeFormat::default(),
    };
    TypedColumns::new(
        vec![
            column("total", "total", ColumnType::Numeric),
            column("qty", "qty", ColumnType::Bigint),
            column("paid", "paid", ColumnType::Boolean),
            column("at", "at", ColumnType::Timestamptz),
            column("city", "address.city", ColumnType::Text),
        ],
        ValueFormat::Plain,
        on_mismatch,
    )
}

#[test]
fn typed_columns_follow_the_others_with_their_arrow_types_and_exact_values() {
    let shape = Shape::typed(
        key(),
        ValueFormat::Plain,
        Records::Envelopes,
        false,
        Some(typed_columns(ddbpipe_keyed::OnMismatch::Null)),
    )
    .unwrap();
    let names: Vec<_> = shape
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "pk",
            "n",
            "op",
            "sequence_number",
            "event_time",
            "shard_id",
            "document",
            "total",
            "qty",
            "paid",
            "at",
            "city"
        ]
    );
    let big = "1234567890123456789012345678901234567.8";
    let upsert = format!(
        r#"{{"op":"u","key":{{"pk":"a","n":1}},"after":{{"pk":"a","n":1,"total":{big},"qty":"7","paid":true,"at":"2024-05-01T12:30:00.5Z","address":{{"city":"Oslo"}}}},"shard_id":"s","sequence_number":"1","ts_ms":0}}"#
    );
    let delete = r#"{"op":"d","key":{"pk":"a","n":1},"after":null,"shard_id":"s","sequence_number":"2","ts_ms":0}"#;
    let mismatch = r#"{"op":"c","key":{"pk":"b","n":2},"after":{"pk":"b","n":2,"qty":1.5},"shard_id":"s","sequence_number":"3","ts_ms":0}"#;
    let parts = shape
        .parts(&batch(&[&upsert, delete, mismatch], None))
        .unwrap();
    let rows = &parts[0].rows;
    assert_eq!(rows.column(7).as_string::<i32>().value(0), big);
    assert_eq!(
        rows.column(8)
            .as_primitive::<arrow_array::types::Int64Type>()
            .value(0),
        7
    );
    assert!(rows.column(9).as_boolean().value(0));
    let at = rows
        .column(10)
        .as_primitive::<arrow_array::types::TimestampMicrosecondType>();
    assert_eq!(at.value(0), 1_714_566_600_500_000);
    assert_eq!(rows.column(11).as_string::<i32>().value(0), "Oslo");
    assert!(
        (7..12).all(|c| rows.column(c).is_null(1)),
        "a delete's are null"
    );
    assert!(rows.column(8).is_null(2), "1.5 is no bigint: null");
    // Under fail the batch fails naming the record and its key.
    let failing = Shape::typed(
        key(),
        ValueFormat::Plain,
        Records::Envelopes,
        false,
        Some(typed_columns(ddbpipe_keyed::OnMismatch::Fail)),
    )
    .unwrap();
    let problem = failing.parts(&batch(&[mismatch], None)).unwrap_err();
    assert!(
        problem.contains(r#"the item with key pk "b", n 2 "#) && problem.contains("'qty'"),
        "{problem}"
    );
    // A typed column may not take a name the sink uses.
    let clash = ddbpipe_keyed::ColumnSpec {
        name: "op".into(),
        path: ddbpipe_value::ColumnPath::parse("op").unwrap(),
        kind: ColumnType::Text,
        time_format: ddbpipe_keyed::TimeFormat::default(),
    };
    let refused = Shape::typed(
        key(),
        ValueFormat::Plain,
        Records::Envelopes,
        false,
        Some(TypedColumns::new(
            vec![clash],
            ValueFormat::Plain,
            ddbpipe_keyed::OnMismatch::Null,
        )),
    )
    .unwrap_err();
    assert!(refused.contains("typed column 'op'"), "{refused}");
}
