//! Scenarios of typed columns (docs/sinks.md §7.9), run by both backends' typed-column tests
//! (`typed_sqlite.rs`, `typed_postgres.rs`) on a fresh database, each over a [`Look`] that
//! reads the table behind ddbpipe's back. The scenarios use `text`, `numeric` and `bigint`
//! columns, whose values read back as the same text in both databases; each backend's file
//! checks every type's storage itself.

use std::collections::BTreeMap;

use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{
    ColumnSpec, ColumnType, ColumnValue, Database, KeyType, OnMismatch, RowChange, StateWrite,
    TableSpec, TimeFormat, TypedColumns, Version,
};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Records, Sink as _, SinkErrorClass};
use ddbpipe_source::records::Lines;
use ddbpipe_value::{ColumnPath, ValueFormat};

use super::observe::{Counts, Logs};
use super::{assert_contains_all, s};

mod schema;

// Only the typed_* test binaries run the scenarios; the others compile `common` unused.
#[allow(unused_imports)]
pub use schema::*;

/// Calls `$each!(<scenario>)` for every scenario below (see `versions::each_versions_scenario`).
#[macro_export]
macro_rules! each_typed_scenario {
    ($each:ident) => {
        $each!(every_upsert_path_writes_the_typed_columns);
        $each!(a_newer_row_keeps_its_columns_and_a_newer_change_replaces_them);
        $each!(a_table_without_a_document_column_keeps_the_key_and_the_typed_columns);
        $each!(a_column_added_to_a_table_with_rows_is_filled_from_the_documents);
        $each!(a_column_of_another_type_is_refused_naming_both_types);
        $each!(a_column_whose_definition_changed_is_refilled_from_the_documents);
        $each!(a_column_removed_from_the_configuration_is_left_and_named);
        $each!(a_not_null_column_ddbpipe_does_not_write_is_refused);
        $each!(dropping_the_document_column_from_the_configuration_is_refused);
        $each!(a_new_column_over_rows_without_documents_is_refused);
        $each!(mismatches_are_null_and_counted_or_fail_the_batch_whole);
    };
}

/// Reads a backend's table directly.
// Only this test crate implements and calls it, so `Send` bounds on the futures do not matter.
#[allow(async_fn_in_trait)]
pub trait Look {
    /// The typed columns of every row of `spec`'s table by its one `S` key, each as text
    /// (`None`: NULL): PostgreSQL's `::text`; SQLite's text, an INTEGER's digits.
    async fn columns(&self, spec: &TableSpec) -> BTreeMap<String, Vec<Option<String>>>;
    /// The table's column names, in order.
    async fn column_names(&self, spec: &TableSpec) -> Vec<String>;
    /// Runs statements behind ddbpipe's back.
    async fn execute(&self, sql: &str);
    /// `spec`'s table as a statement names it (quoted, qualified).
    fn table(&self, spec: &TableSpec) -> String;
    /// How the database names `kind` in its catalog (`bigint` / `INTEGER`).
    fn type_name(&self, kind: ColumnType) -> &'static str;
}

/// A typed column of `kind` named like its path.
pub fn column(name: &str, kind: ColumnType) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        path: ColumnPath::parse(name).expect("a path"),
        kind,
        time_format: TimeFormat::default(),
    }
}

/// `orders` keyed by `pk` (S), the document in `doc`, typed `status` text, `total` numeric,
/// `qty` bigint.
pub fn orders(schema: &str) -> TableSpec {
    let mut spec = super::spec_in(schema, "orders", &[("pk", KeyType::S)]);
    spec.columns = vec![
        column("status", ColumnType::Text),
        column("total", ColumnType::Numeric),
        column("qty", ColumnType::Bigint),
    ];
    spec
}

/// The typed values of [`orders`]: `status`, `total`, `qty`.
pub fn values(status: &str, total: &str, qty: i64) -> Vec<ColumnValue> {
    vec![
        ColumnValue::Text(status.into()),
        ColumnValue::Numeric(total.into()),
        ColumnValue::Bigint(qty),
    ]
}

/// The columns of a row as [`Look::columns`] reads them.
pub fn texts(status: &str, total: &str, qty: i64) -> Vec<Option<String>> {
    vec![
        Some(status.into()),
        Some(total.into()),
        Some(qty.to_string()),
    ]
}

/// An upsert of `pk` with `columns`, at `version`; the document says which.
pub fn row(pk: &str, columns: Vec<ColumnValue>, snapshot: bool, version: Version) -> RowChange {
    RowChange::Upsert {
        key: vec![s(pk)],
        document: format!(r#"{{"pk":"{pk}"}}"#),
        columns,
        snapshot,
        version,
    }
}

/// A stream change's version.
pub fn change(at_ms: i64, seq: &str) -> Version {
    Version {
        at_ms: Some(at_ms),
        sequence: Some(seq.into()),
        repair: None,
    }
}

/// 2026-01-01T00:00:00Z.
pub const T: i64 = 1_767_225_600_000;

async fn apply(db: &Database, spec: &TableSpec, rows: &[RowChange], snapshot: Option<i64>) {
    db.apply(spec, rows, snapshot, &StateWrite::default())
        .await
        .expect("apply");
}

fn expected(rows: &[(&str, Vec<Option<String>>)]) -> BTreeMap<String, Vec<Option<String>>> {
    rows.iter()
        .map(|(pk, columns)| (pk.to_string(), columns.clone()))
        .collect()
}

/// Refused by `prepare_with` as `check_columns` says beforehand (each refusal of the check is
/// in the run's message), and nothing is changed by either; the run's message.
async fn refused_alike(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
    on_mismatch: OnMismatch,
) -> String {
    let before = look.column_names(spec).await;
    let check = db.check_columns(spec).await.expect("check columns");
    assert!(!check.refusals.is_empty(), "check refuses nothing");
    let reader = TypedColumns::new(spec.columns.clone(), ValueFormat::Plain, on_mismatch);
    let error = db.prepare_with(spec, &reader).await.expect_err("refused");
    assert_eq!(error.class, SinkErrorClass::Definite);
    for refusal in &check.refusals {
        assert!(
            error.message.contains(refusal),
            "{refusal:?} not in {}",
            error.message
        );
    }
    assert_eq!(look.column_names(spec).await, before, "nothing changed");
    error.message
}

/// The table's columns after `prepare`: key, document, typed columns in order, ddbpipe's.
fn layout(document: Option<&str>, typed: &[&str]) -> Vec<String> {
    let own = [
        "_ddbpipe_snapshot",
        "_ddbpipe_updated_at",
        "_ddbpipe_version_ms",
        "_ddbpipe_version_seq",
    ];
    let names = ["pk"]
        .into_iter()
        .chain(document)
        .chain(typed.iter().copied());
    names.chain(own).map(str::to_string).collect()
}

/// Every way an upsert is written carries the typed columns: new keys at once (PostgreSQL:
/// `COPY` straight in), keys that exist (the staging merge), stream changes with deletes and a
/// key twice, guarded snapshot rows, a marked change, a repair's upsert (per-row statements).
pub async fn every_upsert_path_writes_the_typed_columns(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    assert_eq!(
        look.column_names(&spec).await,
        layout(Some("doc"), &["status", "total", "qty"])
    );
    let new = [
        row("a", values("new", "1.10", 1), false, Version::default()),
        row("b", values("new", "2.20", 2), false, Version::default()),
    ];
    apply(db, &spec, &new, None).await;
    let want = [
        ("a", texts("new", "1.10", 1)),
        ("b", texts("new", "2.20", 2)),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want), "new keys");

    let again = [
        row("a", values("again", "1.11", 11), false, Version::default()),
        row("b", values("again", "2.21", 21), false, Version::default()),
    ];
    apply(db, &spec, &again, None).await;
    let want = [
        ("a", texts("again", "1.11", 11)),
        ("b", texts("again", "2.21", 21)),
    ];
    assert_eq!(
        look.columns(&spec).await,
        expected(&want),
        "keys that exist"
    );

    let stream = [
        row("a", values("first", "1.0", 100), false, change(T, "1")),
        RowChange::Delete {
            key: vec![s("b")],
            version: change(T, "2"),
        },
        row("a", values("last", "1.5", 101), false, change(T, "3")),
        row("c", values("streamed", "3.00", 3), false, change(T, "4")),
    ];
    apply(db, &spec, &stream, None).await;
    let want = [
        ("a", texts("last", "1.5", 101)),
        ("c", texts("streamed", "3.00", 3)),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want), "stream changes");

    let read_at = |ms| Version {
        at_ms: Some(ms),
        ..Version::default()
    };
    let pages = [
        row("d", values("page", "4.000", 4), true, read_at(T)),
        row("e", values("page", "-5", -5), true, read_at(T)),
    ];
    apply(db, &spec, &pages, Some(7)).await;
    let marked = [row("c", values("marked", "3.3", 33), false, change(T, "5"))];
    apply(db, &spec, &marked, Some(7)).await;
    let repair = Version {
        at_ms: Some(T + 100_000),
        sequence: None,
        repair: Some(9),
    };
    apply(
        db,
        &spec,
        &[row("a", values("repaired", "9", 9), false, repair)],
        None,
    )
    .await;
    let want = [
        ("a", texts("repaired", "9", 9)),
        ("c", texts("marked", "3.3", 33)),
        ("d", texts("page", "4.000", 4)),
        ("e", texts("page", "-5", -5)),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want), "all paths");
}

/// The typed columns follow the document: a snapshot row the stream's newer change holds back
/// and a repair older than the row leave them; a newer repair and any stream change replace
/// them, NULLs included.
pub async fn a_newer_row_keeps_its_columns_and_a_newer_change_replaces_them(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    apply(
        db,
        &spec,
        &[row("a", values("streamed", "1", 1), false, change(T, "1"))],
        Some(7),
    )
    .await;
    let page = Version {
        at_ms: Some(T + 1_000),
        ..Version::default()
    };
    apply(
        db,
        &spec,
        &[row("a", values("page", "2", 2), true, page)],
        Some(7),
    )
    .await;
    let kept = expected(&[("a", texts("streamed", "1", 1))]);
    assert_eq!(look.columns(&spec).await, kept, "the snapshot row is older");
    let repair = |at_ms| Version {
        at_ms: Some(at_ms),
        sequence: None,
        repair: Some(3),
    };
    apply(
        db,
        &spec,
        &[row("a", values("old", "3", 3), false, repair(T - 10_000))],
        None,
    )
    .await;
    assert_eq!(look.columns(&spec).await, kept, "the repair is older");
    apply(
        db,
        &spec,
        &[row("a", values("new", "4", 4), false, repair(T + 10_000))],
        None,
    )
    .await;
    let replaced = expected(&[("a", texts("new", "4", 4))]);
    assert_eq!(look.columns(&spec).await, replaced, "the repair is newer");
    let nulls = vec![ColumnValue::Null, ColumnValue::Null, ColumnValue::Null];
    apply(
        db,
        &spec,
        &[row("a", nulls, false, change(T + 20_000, "2"))],
        None,
    )
    .await;
    let cleared = expected(&[("a", vec![None, None, None])]);
    assert_eq!(
        look.columns(&spec).await,
        cleared,
        "a change replaces them all"
    );
}

/// `document_column: null`: the table has the key, the typed columns and ddbpipe's own
/// columns, and every path writes without a document.
pub async fn a_table_without_a_document_column_keeps_the_key_and_the_typed_columns(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let mut spec = orders(schema);
    spec.document_column = None;
    db.prepare(&spec).await.expect("prepare");
    let names = look.column_names(&spec).await;
    assert_eq!(names, layout(None, &["status", "total", "qty"]));
    // A document a jsonb column could not hold: nothing of it is stored, so nothing fails.
    let mut first = row("a", values("x", "1", 1), false, Version::default());
    if let RowChange::Upsert { document, .. } = &mut first {
        *document = r#"{"pk":"a","v":"\u0000"}"#.into();
    }
    let second = row("b", values("y", "2", 2), false, Version::default());
    apply(db, &spec, &[first.clone(), second.clone()], None).await;
    apply(db, &spec, &[first, second], None).await;
    let repair = Version {
        at_ms: Some(T),
        sequence: None,
        repair: Some(1),
    };
    apply(
        db,
        &spec,
        &[row("c", values("z", "3", 3), false, repair)],
        None,
    )
    .await;
    let want = [
        ("a", texts("x", "1", 1)),
        ("b", texts("y", "2", 2)),
        ("c", texts("z", "3", 3)),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want));
}

/// A sink of items: a mismatch under `null` is stored as NULL, counted per column and logged
/// once per column; under `fail` the batch is refused whole, naming the item and the column.
pub async fn mismatches_are_null_and_counted_or_fail_the_batch_whole(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    let retry = SinkRetry {
        max_retries: 0,
        initial_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(1),
    };
    let sink = |on_mismatch| {
        KeyedSink::new(
            db.clone(),
            spec.clone(),
            ValueFormat::Plain,
            Records::Items,
            retry,
        )
        .on_type_mismatch(on_mismatch)
    };
    let items = [
        r#"{"pk":"a","status":"ok","total":1.5,"qty":2}"#,
        r#"{"pk":"b","status":{"nested":true},"total":"x","qty":1.5}"#,
        r#"{"pk":"c","status":["l"],"total":3,"qty":3}"#,
    ];
    let mut batch = Lines::default();
    for item in items {
        batch.push_with(|buf| buf.extend_from_slice(item.as_bytes()));
    }
    let batch = Batch {
        records: batch,
        ..Batch::default()
    };
    let mut failing = sink(OnMismatch::Fail);
    failing.prepare().await.expect("prepare");
    let error = failing.write(&batch, None).await.expect_err("refused");
    assert_eq!(error.class, SinkErrorClass::Definite);
    assert_contains_all(
        "fail",
        &error.message,
        &[
            "pk \"b\"",
            "column 'status' (path status, type text)",
            "holds an M",
            "sink.on_type_mismatch: null",
        ],
    );
    assert_eq!(
        db.count_rows(&spec).await.expect("count"),
        0,
        "nothing written"
    );

    let counts = Counts::default();
    let _recorder = metrics::set_default_local_recorder(&counts);
    let logs = Logs::capture();
    let mut storing = sink(OnMismatch::Null);
    storing.write(&batch, None).await.expect("written");
    let want = [
        ("a", texts("ok", "1.5", 2)),
        ("b", vec![None, None, None]),
        ("c", vec![None, Some("3".into()), Some("3".into())]),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want));
    assert_eq!(
        counts.get("ddbpipe_column_mismatches_total{column=status}"),
        2
    );
    assert_eq!(
        counts.get("ddbpipe_column_mismatches_total{column=total}"),
        1
    );
    assert_eq!(counts.get("ddbpipe_column_mismatches_total{column=qty}"), 1);
    let warned = logs.text();
    assert_eq!(
        warned.matches("does not fit its typed column").count(),
        3,
        "{warned}"
    );
    assert!(!warned.contains("nested"), "never a value: {warned}");
}
