//! Typed columns (docs/sinks.md §7.9) in the PostgreSQL backend: the scenarios of
//! `common::typed`, and what only PostgreSQL shows (column types, U+0000, its names).
//!
//! The server comes from `DDBPIPE_TEST_POSTGRES_URL`, which `scripts/test.sh` sets (it starts a
//! throwaway server); without it every test here fails. Each test works in its own schema.
// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::observe::Counts;
use common::typed::{self, Look, column};
use common::{assert_contains_all, s};
use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{
    ColumnType, ColumnValue, Database, KeyType, OnMismatch, PostgresDatabase, RowChange,
    StateWrite, TableSpec, Version,
};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Records, Sink as _};
use ddbpipe_source::records::Lines;
use ddbpipe_testkit::postgres::{TestSchema, connect as admin, url};
use ddbpipe_value::ValueFormat;

/// A fresh schema, a handle whose state schema it is, and an admin connection to look.
struct Fixture {
    schema: String,
    /// Drops the schema with the fixture.
    _owned: TestSchema,
    db: Database,
    admin: tokio_postgres::Client,
}

impl Fixture {
    async fn new() -> Self {
        let admin = admin().await;
        let owned = TestSchema::create(&admin, "typed").await;
        let schema = owned.name().to_string();
        let db = Database::from(
            PostgresDatabase::connect(&url())
                .await
                .unwrap()
                .with_schema(&schema),
        );
        admin.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
        Fixture {
            schema,
            _owned: owned,
            db,
            admin,
        }
    }

    /// (name, type) of `table`'s columns, as `format_type` writes them.
    async fn types(&self, table: &str) -> Vec<(String, String)> {
        self.admin
            .query(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = format('%I.%I', $1::text, $2::text)::regclass \
                 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&self.schema, &table],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }
}

impl Look for Fixture {
    async fn columns(&self, spec: &TableSpec) -> BTreeMap<String, Vec<Option<String>>> {
        let names: Vec<String> = spec
            .columns
            .iter()
            .map(|c| format!("\"{}\"::text", c.name))
            .collect();
        let sql = format!("SELECT pk, {} FROM {}", names.join(", "), self.table(spec));
        self.admin
            .query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let cells = (1..=names.len()).map(|i| row.get::<_, Option<String>>(i));
                (row.get(0), cells.collect())
            })
            .collect()
    }

    async fn column_names(&self, spec: &TableSpec) -> Vec<String> {
        let types = self.types(&spec.table).await;
        types.into_iter().map(|(name, _)| name).collect()
    }

    async fn execute(&self, sql: &str) {
        self.admin.batch_execute(sql).await.unwrap();
    }

    fn table(&self, spec: &TableSpec) -> String {
        format!("\"{}\".\"{}\"", spec.schema, spec.table)
    }

    fn type_name(&self, kind: ColumnType) -> &'static str {
        match kind {
            ColumnType::Double => "double precision",
            ColumnType::Timestamptz => "timestamp with time zone",
            other => other.name(),
        }
    }
}

/// Runs a scenario of `common::typed` in a fresh schema.
macro_rules! typed_scenario {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let fx = Fixture::new().await;
            typed::$name(&fx.db, &fx.schema, &fx).await;
        }
    };
}

each_typed_scenario!(typed_scenario);

/// One column of each type, named after it.
fn every_type(schema: &str) -> TableSpec {
    let mut spec = common::spec_in(schema, "every", &[("pk", KeyType::S)]);
    spec.columns = ColumnType::ALL
        .into_iter()
        .map(|kind| column(kind.name(), kind))
        .collect();
    spec
}

/// 38 digits, DynamoDB's most.
const DIGITS_38: &str = "-1234567890.1234567890123456789012345678";

/// The values of every type, for key `pk`.
fn every_value(pk: &str, version: Version) -> RowChange {
    RowChange::Upsert {
        key: vec![s(pk)],
        document: "{}".into(),
        columns: vec![
            ColumnValue::Text("é\t\\\n\"x".into()),
            ColumnValue::Numeric(DIGITS_38.into()),
            ColumnValue::Bigint(i64::MIN),
            ColumnValue::Double(0.1),
            ColumnValue::Boolean(true),
            ColumnValue::Timestamp(1_714_566_600_123_456),
            ColumnValue::Json(r#"{"a":[1.50,"x\\ty"]}"#.into()),
        ],
        snapshot: false,
        version,
    }
}

/// docs/sinks.md §7.9's PostgreSQL column: each type as created, the values exactly through
/// every path (`COPY` straight in, the staging merge, the per-row statement of a repair).
#[tokio::test]
async fn every_type_is_stored_exactly_on_every_path() {
    let fx = Fixture::new().await;
    let spec = every_type(&fx.schema);
    fx.db.prepare(&spec).await.unwrap();
    let types: Vec<(String, String)> = fx.types("every").await[2..9].to_vec();
    let want = [
        ("text", "text"),
        ("numeric", "numeric"),
        ("bigint", "bigint"),
        ("double", "double precision"),
        ("boolean", "boolean"),
        ("timestamptz", "timestamp with time zone"),
        ("jsonb", "jsonb"),
    ]
    .map(|(name, kind)| (name.to_string(), kind.to_string()));
    assert_eq!(types, want);
    let repair = Version {
        at_ms: Some(1),
        sequence: None,
        repair: Some(1),
    };
    let batches = [
        (
            "copied",
            vec![
                every_value("a", Version::default()),
                every_value("b", Version::default()),
            ],
        ),
        (
            "staged",
            vec![
                every_value("a", Version::default()),
                every_value("c", Version::default()),
            ],
        ),
        ("per row", vec![every_value("d", repair)]),
    ];
    for (path, rows) in batches {
        fx.db
            .apply(&spec, &rows, None, &StateWrite::default())
            .await
            .unwrap();
        let sql = format!(
            "SELECT pk, text, numeric::text, bigint, double, boolean, \
             to_char(timestamptz, 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), jsonb::text \
             FROM {} ORDER BY pk",
            fx.table(&spec)
        );
        let read = fx.admin.query(&sql, &[]).await.unwrap();
        for row in &read {
            let pk: String = row.get(0);
            assert_eq!(row.get::<_, String>(1), "é\t\\\n\"x", "{path} {pk}");
            assert_eq!(row.get::<_, String>(2), DIGITS_38, "{path} {pk}");
            assert_eq!(row.get::<_, i64>(3), i64::MIN, "{path} {pk}");
            assert_eq!(
                row.get::<_, f64>(4).to_bits(),
                0.1f64.to_bits(),
                "{path} {pk}"
            );
            assert!(row.get::<_, bool>(5), "{path} {pk}");
            assert_eq!(
                row.get::<_, String>(6),
                "2024-05-01T12:30:00.123456Z",
                "{path} {pk}"
            );
            assert_eq!(
                row.get::<_, String>(7),
                r#"{"a": [1.50, "x\\ty"]}"#,
                "{path} {pk}"
            );
        }
    }
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 4);
}

/// PostgreSQL's `text` and `jsonb` hold no U+0000: such a typed value is a mismatch of its
/// column (NULL and counted, or the batch refused), not a failed batch.
#[tokio::test]
async fn u0000_in_a_text_or_jsonb_column_is_a_mismatch() {
    let fx = Fixture::new().await;
    let mut spec = common::spec_in(&fx.schema, "nul", &[("pk", KeyType::S)]);
    spec.document_type = ddbpipe_keyed::DocumentType::Json;
    spec.columns = vec![
        column("t", ColumnType::Text),
        column("j", ColumnType::Jsonb),
    ];
    let items = [
        r#"{"pk":"a","t":"x\u0000y","j":{"k":"\u0000"}}"#,
        r#"{"pk":"b","t":"ok","j":["\\u0000"]}"#,
    ];
    let sink = |on_mismatch| {
        KeyedSink::new(
            fx.db.clone(),
            spec.clone(),
            ValueFormat::Plain,
            Records::Items,
            retry(),
        )
        .on_type_mismatch(on_mismatch)
    };
    let mut failing = sink(OnMismatch::Fail);
    failing.prepare().await.unwrap();
    let error = failing
        .write(&batch(&items), None)
        .await
        .expect_err("refused");
    assert_contains_all(
        "fail",
        &error.message,
        &["pk \"a\"", "column 't' (path t, type text)", "U+0000"],
    );
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 0);
    let counts = Counts::default();
    let _recorder = metrics::set_default_local_recorder(&counts);
    sink(OnMismatch::Null)
        .write(&batch(&items), None)
        .await
        .unwrap();
    let want: BTreeMap<String, Vec<Option<String>>> = [
        ("a", vec![None, None]),
        ("b", vec![Some("ok".into()), Some(r#"["\\u0000"]"#.into())]),
    ]
    .into_iter()
    .map(|(pk, cells)| (pk.to_string(), cells))
    .collect();
    assert_eq!(fx.columns(&spec).await, want);
    assert_eq!(counts.get("ddbpipe_column_mismatches_total{column=t}"), 1);
    assert_eq!(counts.get("ddbpipe_column_mismatches_total{column=j}"), 1);
}

/// PostgreSQL names: at most 63 bytes, no NUL, no column twice, not ddbpipe's prefix; refused
/// before anything is created. Reserved words and mixed case work as written.
#[tokio::test]
async fn typed_column_names_are_checked_and_quoted() {
    let fx = Fixture::new().await;
    let long = "c".repeat(64);
    for (case, name, texts) in [
        ("64 bytes", long.as_str(), &["longer than 63 bytes"][..]),
        ("NUL", "a\0b", &["NUL"]),
        ("the key", "pk", &["column 'pk' is used twice"]),
        ("the document", "doc", &["column 'doc' is used twice"]),
        (
            "ddbpipe's prefix",
            "_ddbpipe_x",
            &["'_ddbpipe_x' starts with _ddbpipe_"],
        ),
    ] {
        let mut spec = common::spec_in(&fx.schema, "named", &[("pk", KeyType::S)]);
        spec.columns = vec![column("qty", ColumnType::Bigint)];
        spec.columns[0].name = name.into();
        let error = fx.db.prepare(&spec).await.expect_err(case);
        assert_contains_all(case, &error.message, texts);
        let check = fx.db.check_columns(&spec).await.expect_err(case);
        assert_contains_all(case, &check.message, texts);
    }
    let created: Option<String> = fx
        .admin
        .query_one(
            "SELECT to_regclass(format('%I.named', $1::text))::text",
            &[&fx.schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(created, None, "nothing created");
    let mut spec = common::spec_in(&fx.schema, "named", &[("pk", KeyType::S)]);
    let exactly_63 = "é".repeat(31) + "x";
    spec.columns = vec![
        column("order", ColumnType::Text),
        column("Select", ColumnType::Bigint),
        column("select", ColumnType::Boolean),
        column(&exactly_63, ColumnType::Text),
    ];
    fx.db.prepare(&spec).await.unwrap();
    let names: Vec<String> = fx.types("named").await[2..6]
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(names, ["order", "Select", "select", exactly_63.as_str()]);
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
