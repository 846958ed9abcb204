//! Typed columns (docs/sinks.md §7.9) in the SQLite backend: the scenarios of
//! `common::typed`, and what only SQLite shows (declared types, storage classes, its names).
// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::typed::{self, Look, column};
use common::{assert_contains_all, s};
use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{
    ColumnType, ColumnValue, Database, KeyType, OnMismatch, RowChange, SqliteDatabase, StateWrite,
    TableSpec, TimeFormat, Version,
};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Records, Sink as _};
use ddbpipe_source::records::Lines;
use ddbpipe_value::ValueFormat;
use rusqlite::types::Value;

/// A fresh database file.
struct Fixture {
    /// Held for its drop.
    _dir: tempfile::TempDir,
    path: PathBuf,
    db: Database,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.db");
        let db = Database::from(SqliteDatabase::open(&path).unwrap());
        Fixture {
            _dir: dir,
            path,
            db,
        }
    }

    /// Every column of every row of `table`, by the first column, as SQLite returns them.
    fn raw(&self, table: &str) -> BTreeMap<String, Vec<Value>> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let width = stmt.column_count();
        stmt.query_map([], |row| {
            let values: Vec<Value> = (0..width).map(|i| row.get(i).unwrap()).collect();
            let Value::Text(key) = &values[0] else {
                panic!("a text key")
            };
            Ok((key.clone(), values[1..].to_vec()))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    /// (name, declared type) of `table`'s columns.
    fn declared(&self, table: &str) -> Vec<(String, String)> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        let mut stmt = conn
            .prepare("SELECT name, type FROM pragma_table_info(?1) ORDER BY cid")
            .unwrap();
        stmt.query_map([table], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }
}

/// Reads the file behind ddbpipe's back.
struct FileLook<'a>(&'a Path);

impl Look for FileLook<'_> {
    async fn columns(&self, spec: &TableSpec) -> BTreeMap<String, Vec<Option<String>>> {
        let conn = rusqlite::Connection::open(self.0).unwrap();
        let names: Vec<String> = spec
            .columns
            .iter()
            .map(|c| format!("\"{}\"", c.name))
            .collect();
        let sql = format!("SELECT pk, {} FROM \"{}\"", names.join(", "), spec.table);
        let mut stmt = conn.prepare(&sql).unwrap();
        stmt.query_map([], |row| {
            let cells = (1..=names.len()).map(|i| match row.get::<_, Value>(i).unwrap() {
                Value::Null => None,
                Value::Integer(n) => Some(n.to_string()),
                Value::Real(x) => Some(format!("{x:?}")),
                Value::Text(text) => Some(text),
                Value::Blob(_) => panic!("no blob in a typed column"),
            });
            Ok((row.get(0)?, cells.collect()))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    async fn column_names(&self, spec: &TableSpec) -> Vec<String> {
        let conn = rusqlite::Connection::open(self.0).unwrap();
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
            .unwrap();
        stmt.query_map([&spec.table], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    async fn execute(&self, sql: &str) {
        rusqlite::Connection::open(self.0)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
    }

    fn table(&self, spec: &TableSpec) -> String {
        format!("\"{}\"", spec.table)
    }

    fn type_name(&self, kind: ColumnType) -> &'static str {
        match kind {
            ColumnType::Text => "TEXT",
            ColumnType::Numeric => "NUMERIC TEXT",
            ColumnType::Timestamptz => "TIMESTAMPTZ TEXT",
            ColumnType::Jsonb => "JSONB TEXT",
            ColumnType::Bigint => "BIGINT",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Double => "DOUBLE",
        }
    }
}

/// Runs a scenario of `common::typed` on a fresh database.
macro_rules! typed_scenario {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let fx = Fixture::new();
            typed::$name(&fx.db, "main", &FileLook(&fx.path)).await;
        }
    };
}

each_typed_scenario!(typed_scenario);

/// One column of each type, named after it.
fn every_type() -> TableSpec {
    let mut spec = common::spec_in("main", "every", &[("pk", KeyType::S)]);
    spec.columns = ColumnType::ALL
        .into_iter()
        .map(|kind| column(kind.name(), kind))
        .collect();
    spec
}

/// 38 digits, DynamoDB's most.
const DIGITS_38: &str = "-1234567890.1234567890123456789012345678";

/// docs/sinks.md §7.9's SQLite column: each type's declared type and storage class, the value
/// exactly (38 digits as text, a time as `timestamp_text`, a double's bits, JSON as written).
#[tokio::test]
async fn every_type_is_stored_exactly_with_its_declared_type() {
    let fx = Fixture::new();
    let spec = every_type();
    fx.db.prepare(&spec).await.unwrap();
    let declared: Vec<(String, String)> = fx.declared("every")[2..9].to_vec();
    let want: Vec<(String, String)> = [
        ("text", "TEXT"),
        ("numeric", "NUMERIC TEXT"),
        ("bigint", "BIGINT"),
        ("double", "DOUBLE"),
        ("boolean", "BOOLEAN"),
        ("timestamptz", "TIMESTAMPTZ TEXT"),
        ("jsonb", "JSONB TEXT"),
    ]
    .map(|(name, kind)| (name.to_string(), kind.to_string()))
    .to_vec();
    assert_eq!(declared, want);
    let micros = 1_714_566_600_123_456;
    let values = vec![
        ColumnValue::Text("é\0\"x".into()),
        ColumnValue::Numeric(DIGITS_38.into()),
        ColumnValue::Bigint(i64::MIN),
        ColumnValue::Double(0.1),
        ColumnValue::Boolean(true),
        ColumnValue::Timestamp(micros),
        ColumnValue::Json(r#"{"a":[1.50,"x"]}"#.into()),
    ];
    let upsert = RowChange::Upsert {
        key: vec![s("a")],
        document: "{}".into(),
        columns: values,
        snapshot: false,
        version: Version::default(),
    };
    fx.db
        .apply(&spec, &[upsert], None, &StateWrite::default())
        .await
        .unwrap();
    let row = &fx.raw("every")["a"];
    assert_eq!(
        row[1..8],
        [
            Value::Text("é\0\"x".into()),
            Value::Text(DIGITS_38.into()),
            Value::Integer(i64::MIN),
            Value::Real(0.1),
            Value::Integer(1),
            Value::Text("2024-05-01T12:30:00.123456Z".into()),
            Value::Text(r#"{"a":[1.50,"x"]}"#.into()),
        ]
    );
    let false_row = RowChange::Upsert {
        key: vec![s("b")],
        document: "{}".into(),
        columns: vec![
            ColumnValue::Null,
            ColumnValue::Null,
            ColumnValue::Null,
            ColumnValue::Null,
            ColumnValue::Boolean(false),
            ColumnValue::Null,
            ColumnValue::Null,
        ],
        snapshot: false,
        version: Version::default(),
    };
    fx.db
        .apply(&spec, &[false_row], None, &StateWrite::default())
        .await
        .unwrap();
    assert_eq!(fx.raw("every")["b"][5], Value::Integer(0));
}

/// The sink's reader end to end: plain and typed documents give the same stored values, times
/// from ISO 8601 text and from epoch seconds.
#[tokio::test]
async fn plain_and_typed_documents_store_the_same_values() {
    let mut stored = Vec::new();
    for (format, item) in [
        (
            ValueFormat::Plain,
            r#"{"pk":"a","t":"x","n":12.50,"b":7,"d":0.1,"f":true,"at":"2024-05-01T14:30:00+02:00","ep":1714566600,"j":{"k":[1,2.50]}}"#,
        ),
        (
            ValueFormat::Typed,
            r#"{"pk":{"S":"a"},"t":{"S":"x"},"n":{"N":"12.50"},"b":{"N":"7"},"d":{"N":"0.1"},"f":{"BOOL":true},"at":{"S":"2024-05-01T14:30:00+02:00"},"ep":{"N":"1714566600"},"j":{"M":{"k":{"L":[{"N":"1"},{"N":"2.50"}]}}}}"#,
        ),
    ] {
        let fx = Fixture::new();
        let mut spec = common::spec_in("main", "items", &[("pk", KeyType::S)]);
        spec.columns = vec![
            column("t", ColumnType::Text),
            column("n", ColumnType::Numeric),
            column("b", ColumnType::Bigint),
            column("d", ColumnType::Double),
            column("f", ColumnType::Boolean),
            column("at", ColumnType::Timestamptz),
            ddbpipe_keyed::ColumnSpec {
                time_format: TimeFormat::EpochSeconds,
                ..column("ep", ColumnType::Timestamptz)
            },
            column("j", ColumnType::Jsonb),
        ];
        let mut sink = KeyedSink::new(fx.db.clone(), spec, format, Records::Items, retry())
            .on_type_mismatch(OnMismatch::Fail);
        sink.prepare().await.unwrap();
        sink.write(&batch(&[item]), None).await.unwrap();
        stored.push(fx.raw("items")["a"][1..9].to_vec());
    }
    let time = Value::Text("2024-05-01T12:30:00.000000Z".into());
    assert_eq!(
        stored[0],
        [
            Value::Text("x".into()),
            Value::Text("12.50".into()),
            Value::Integer(7),
            Value::Real(0.1),
            Value::Integer(1),
            time.clone(),
            time,
            Value::Text(r#"{"k":[1,2.50]}"#.into()),
        ]
    );
    assert_eq!(stored[0], stored[1], "typed documents");
}

/// A change's typed columns come from its new image (`after`), never its old one or its key;
/// a mismatch under `fail` names the record and the column.
#[tokio::test]
async fn envelopes_take_their_columns_from_the_new_image() {
    let fx = Fixture::new();
    let mut spec = common::spec_in("main", "changes", &[("pk", KeyType::S)]);
    spec.columns = vec![column("qty", ColumnType::Bigint)];
    let envelope = |op: &str, event: &str, after: &str| {
        format!(
            r#"{{"op":"{op}","key":{{"pk":"a"}},"before":{{"pk":"a","qty":1}},"after":{after},"event_id":"{event}","shard_id":"s1","sequence_number":"{event}","ts_ms":1}}"#
        )
    };
    let created = envelope("c", "10", r#"{"pk":"a","qty":2}"#);
    let updated = envelope("u", "11", r#"{"pk":"a","qty":3}"#);
    let mut sink = KeyedSink::new(
        fx.db.clone(),
        spec.clone(),
        ValueFormat::Plain,
        Records::Envelopes,
        retry(),
    )
    .on_type_mismatch(OnMismatch::Fail);
    sink.prepare().await.unwrap();
    sink.write(&batch(&[&created, &updated]), None)
        .await
        .unwrap();
    assert_eq!(fx.raw("changes")["a"][1], Value::Integer(3));
    let bad = envelope("u", "12", r#"{"pk":"a","qty":"three"}"#);
    let error = sink
        .write(&batch(&[&bad]), None)
        .await
        .expect_err("refused");
    assert_contains_all(
        "envelope",
        &error.message,
        &[
            "record 12 in s1",
            "pk \"a\"",
            "column 'qty' (path qty, type bigint)",
            "holds an S",
        ],
    );
    assert!(!error.message.contains("three"), "{}", error.message);
    let deleted = envelope("d", "13", "null");
    sink.write(&batch(&[&deleted]), None).await.unwrap();
    assert!(fx.raw("changes").is_empty());
}

/// SQLite names: a typed column may not take a key's, the document's or another typed
/// column's name in any case, nor ddbpipe's prefix; nothing is created.
#[tokio::test]
async fn typed_column_names_that_collide_are_refused_before_anything_is_created() {
    let fx = Fixture::new();
    for (case, name, texts) in [
        (
            "key",
            "PK",
            &["'PK'", "key attribute", "SQLite ignores case"][..],
        ),
        ("document", "Doc", &["'Doc'"]),
        ("typed twice", "qty", &["'qty'", "another typed column"]),
        ("reserved", "_ddbpipe_qty", &["'_ddbpipe_qty'", "reserved"]),
        ("empty", "", &["empty name"]),
    ] {
        let mut spec = common::spec_in("main", "named", &[("pk", KeyType::S)]);
        spec.columns = vec![
            column("qty", ColumnType::Bigint),
            column("qty", ColumnType::Text),
        ];
        spec.columns[1].name = name.into();
        let error = fx.db.prepare(&spec).await.expect_err(case);
        assert_contains_all(case, &error.message, texts);
    }
    assert!(fx.declared("named").is_empty(), "nothing created");
    // Reserved words and mixed case are quoted.
    let mut spec = common::spec_in("main", "named", &[("pk", KeyType::S)]);
    spec.columns = vec![
        column("order", ColumnType::Text),
        column("Select", ColumnType::Bigint),
    ];
    fx.db.prepare(&spec).await.unwrap();
    assert_eq!(
        fx.declared("named")[2..4],
        [
            ("order".into(), "TEXT".into()),
            ("Select".into(), "BIGINT".into())
        ]
    );
}

fn retry() -> SinkRetry {
    SinkRetry {
        max_retries: 0,
        initial_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(1),
    }
}

fn batch(lines: &[&str]) -> Batch {
    let mut records = Lines::default();
    for line in lines {
        records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    }
    Batch {
        records,
        ..Batch::default()
    }
}
