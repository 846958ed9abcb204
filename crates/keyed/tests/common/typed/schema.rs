//! The schema scenarios of `typed` (docs/sinks.md §7.9, "Schema changes at start"): what
//! `prepare` adds, fills and refuses, and that `check_columns` says the same beforehand.

use ddbpipe_keyed::{
    ColumnType, ColumnValue, Database, OnMismatch, RowChange, TableSpec, TypedColumns, Version,
};
use ddbpipe_value::ValueFormat;

use super::super::observe::{Counts, Logs};
use super::super::{assert_contains_all, s};
use super::{Look, apply, column, expected, layout, orders, refused_alike, row, texts, values};

/// A column added to `columns:` is added to the table and filled for its rows from their
/// documents by the sink's reader, in one transaction with the `ALTER`: under `fail` a
/// mismatch refuses naming the row and the column, and the table is unchanged; under `null`
/// the mismatch is NULL and counted.
pub async fn a_column_added_to_a_table_with_rows_is_filled_from_the_documents(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let mut before = orders(schema);
    before.columns.truncate(1);
    db.prepare(&before).await.expect("prepare");
    let documents = [
        ("a", r#"{"pk":"a","status":"paid","total":12.50,"qty":7}"#),
        (
            "b",
            r#"{"pk":"b","status":"open","total":"99999999999999999999.5","qty":"x"}"#,
        ),
        ("c", r#"{"pk":"c"}"#),
    ];
    let rows: Vec<RowChange> = documents
        .iter()
        .map(|(pk, document)| RowChange::Upsert {
            key: vec![s(pk)],
            document: document.to_string(),
            columns: vec![ColumnValue::Text("as written".into())],
            snapshot: false,
            version: Version::default(),
        })
        .collect();
    apply(db, &before, &rows, None).await;
    let spec = orders(schema);
    let check = db.check_columns(&spec).await.expect("check");
    assert!(check.refusals.is_empty(), "{check:?}");
    assert_eq!(check.notes.len(), 2, "{check:?}");
    assert!(check.notes[0].contains("adds column \"total\" (numeric) and fills it"));

    let message = refused_alike_fill(db, &spec, look).await;
    assert_contains_all(
        "fill under fail",
        &message,
        &[
            "nothing was changed",
            "pk \"b\"",
            "column 'qty' (path qty, type bigint)",
            "holds an S",
        ],
    );

    let counts = Counts::default();
    let _recorder = metrics::set_default_local_recorder(&counts);
    let reader = TypedColumns::new(spec.columns.clone(), ValueFormat::Plain, OnMismatch::Null);
    db.prepare_with(&spec, &reader).await.expect("filled");
    assert_eq!(counts.get("ddbpipe_column_mismatches_total{column=qty}"), 1);
    // Added columns come last, after ddbpipe's own.
    let mut added = layout(Some("doc"), &["status"]);
    added.extend(["total".to_string(), "qty".to_string()]);
    assert_eq!(look.column_names(&spec).await, added);
    let written = Some("as written".to_string());
    let want = [
        (
            "a",
            vec![written.clone(), Some("12.50".into()), Some("7".into())],
        ),
        (
            "b",
            vec![written.clone(), Some("99999999999999999999.5".into()), None],
        ),
        ("c", vec![written, None, None]),
    ];
    assert_eq!(look.columns(&spec).await, expected(&want));
    assert_eq!(
        db.check_columns(&spec).await.expect("check"),
        Default::default()
    );
}

/// The `fail` half of the fill scenario: refused before anything changes.
async fn refused_alike_fill(db: &Database, spec: &TableSpec, look: &impl Look) -> String {
    let before = look.column_names(spec).await;
    let reader = TypedColumns::new(spec.columns.clone(), ValueFormat::Plain, OnMismatch::Fail);
    let error = db.prepare_with(spec, &reader).await.expect_err("refused");
    assert_eq!(
        look.column_names(spec).await,
        before,
        "the ALTER is rolled back"
    );
    error.message
}

/// A column whose type in the table differs is refused naming both types (no re-typing).
pub async fn a_column_of_another_type_is_refused_naming_both_types(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    let mut retyped = spec.clone();
    retyped.columns[2] = column("qty", ColumnType::Text);
    let message = refused_alike(db, &retyped, look, OnMismatch::Null).await;
    let table_type = format!(
        "has type {} in the table",
        look.type_name(ColumnType::Bigint)
    );
    assert_contains_all(
        "re-typed",
        &message,
        &[
            "column \"qty\"",
            &table_type,
            "gives it type text",
            "never re-types",
        ],
    );
    // Types a database stores alike (SQLite: text and timestamptz both as TEXT, numeric and
    // jsonb too, bigint and boolean as integers) are told apart all the same.
    for (at, kind) in [
        (0, ColumnType::Timestamptz),
        (1, ColumnType::Jsonb),
        (2, ColumnType::Boolean),
    ] {
        let mut retyped = spec.clone();
        retyped.columns[at].kind = kind;
        let message = refused_alike(db, &retyped, look, OnMismatch::Null).await;
        assert_contains_all(
            "re-typed alike",
            &message,
            &[&format!("gives it type {}", kind.name()), "never re-types"],
        );
    }
}

/// A column whose path changed (same name and type) holds what the old path gave: it is
/// refilled for every row from the documents (NULL where the new path finds nothing), as
/// `check` says beforehand; a column left out of the configuration while rows changed, then
/// configured again, is refilled too.
pub async fn a_column_whose_definition_changed_is_refilled_from_the_documents(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    let upsert = |pk: &str, document: &str, qty: i64| RowChange::Upsert {
        key: vec![s(pk)],
        document: document.to_string(),
        columns: values("paid", "1", qty),
        snapshot: false,
        version: Version::default(),
    };
    let rows = [
        upsert("a", r#"{"pk":"a","qty":7,"alt":{"qty":8}}"#, 7),
        upsert("b", r#"{"pk":"b","qty":3}"#, 3),
    ];
    apply(db, &spec, &rows, None).await;
    let mut moved = spec.clone();
    moved.columns[2].path = ddbpipe_value::ColumnPath::parse("alt.qty").expect("a path");
    let check = db.check_columns(&moved).await.expect("check");
    assert!(check.refusals.is_empty(), "{check:?}");
    assert_eq!(check.notes.len(), 1, "{check:?}");
    assert_contains_all(
        "check of a moved column",
        &check.notes[0],
        &[
            "refills column \"qty\"",
            "written as bigint from qty",
            "(bigint from alt.qty)",
        ],
    );
    let reader = |spec: &TableSpec| {
        TypedColumns::new(spec.columns.clone(), ValueFormat::Plain, OnMismatch::Fail)
    };
    db.prepare_with(&moved, &reader(&moved))
        .await
        .expect("refilled");
    let paid = |qty: Option<&str>| vec![Some("paid".into()), Some("1".into()), qty.map(Into::into)];
    let want = [("a", paid(Some("8"))), ("b", paid(None))];
    assert_eq!(look.columns(&moved).await, expected(&want));
    assert_eq!(
        db.check_columns(&moved).await.expect("check"),
        Default::default(),
        "recorded: nothing left to refill"
    );

    // Left out while `a` changes (its qty is not written), then configured again.
    let mut fewer = moved.clone();
    fewer.columns.truncate(2);
    db.prepare(&fewer).await.expect("prepare without qty");
    let mut changed = upsert("a", r#"{"pk":"a","alt":{"qty":9}}"#, 0);
    if let RowChange::Upsert { columns, .. } = &mut changed {
        columns.truncate(2);
    }
    apply(db, &fewer, &[changed], None).await;
    assert_eq!(look.columns(&moved).await["a"], paid(Some("8")), "stale");
    let check = db.check_columns(&moved).await.expect("check");
    assert_contains_all(
        "check of a column configured again",
        &check.notes.join("; "),
        &["refills column \"qty\"", "has no record of"],
    );
    db.prepare_with(&moved, &reader(&moved))
        .await
        .expect("refilled again");
    let want = [("a", paid(Some("9"))), ("b", paid(None))];
    assert_eq!(look.columns(&moved).await, expected(&want));
}

/// A column no longer in `columns:` stays, no longer written (NULL in new rows), and is named
/// by the run's warning and by `check`.
pub async fn a_column_removed_from_the_configuration_is_left_and_named(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    apply(
        db,
        &spec,
        &[row("a", values("x", "1", 1), false, Version::default())],
        None,
    )
    .await;
    let mut fewer = spec.clone();
    fewer.columns.truncate(2);
    let check = db.check_columns(&fewer).await.expect("check");
    assert!(check.refusals.is_empty(), "{check:?}");
    assert_eq!(check.notes.len(), 1, "{check:?}");
    assert!(check.notes[0].contains("column \"qty\" of the table is not written"));
    let probed = db.probe(&fewer).await.expect("probe");
    assert!(probed.contains(&check.notes[0]), "{probed}");
    let logs = Logs::capture();
    db.prepare(&fewer).await.expect("prepare without qty");
    let warned = logs.text();
    assert!(
        warned.contains("WARN") && warned.contains("\"qty\""),
        "{warned}"
    );
    let row_b = row(
        "b",
        values("y", "2", 2)[..2].to_vec(),
        false,
        Version::default(),
    );
    apply(db, &fewer, &[row_b], None).await;
    let mut read = spec.clone();
    read.columns.truncate(3);
    let want = [
        ("a", texts("x", "1", 1)),
        ("b", vec![Some("y".into()), Some("2".into()), None]),
    ];
    assert_eq!(look.columns(&read).await, expected(&want));
}

/// A column ddbpipe does not write that is `NOT NULL` without a default would fail every
/// insert: refused naming it; with a default it is only left.
pub async fn a_not_null_column_ddbpipe_does_not_write_is_refused(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    look.execute(&format!(
        "ALTER TABLE {} ADD COLUMN extra text NOT NULL DEFAULT 'x'",
        look.table(&spec)
    ))
    .await;
    let check = db.check_columns(&spec).await.expect("check");
    assert!(
        check.refusals.is_empty() && check.notes.len() == 1,
        "{check:?}"
    );
    db.prepare(&spec).await.expect("a default fills it");
    // The empty table's document column renamed: the old one is NOT NULL and unwritten.
    let mut renamed = spec.clone();
    renamed.document_column = Some("document".into());
    let message = refused_alike(db, &renamed, look, OnMismatch::Null).await;
    assert_contains_all(
        "not null",
        &message,
        &[
            "column \"doc\" of the table is NOT NULL without a default",
            "every insert would fail",
        ],
    );
    assert!(!message.contains("DROP COLUMN"), "{message}");
}

/// `document_column: null` on a table that has its document column: refused, saying how it is
/// dropped.
pub async fn dropping_the_document_column_from_the_configuration_is_refused(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let spec = orders(schema);
    db.prepare(&spec).await.expect("prepare");
    let mut without = spec.clone();
    without.document_column = None;
    let message = refused_alike(db, &without, look, OnMismatch::Null).await;
    assert_contains_all(
        "document dropped",
        &message,
        &[
            "column \"doc\" of the table is NOT NULL",
            "ALTER TABLE … DROP COLUMN \"doc\"",
            "another sink.table",
        ],
    );
}

/// Without documents, a new column cannot be filled for existing rows: refused (a resnapshot
/// into an empty table is needed); an empty table just gets it.
pub async fn a_new_column_over_rows_without_documents_is_refused(
    db: &Database,
    schema: &str,
    look: &impl Look,
) {
    let mut spec = orders(schema);
    spec.document_column = None;
    spec.columns.truncate(1);
    db.prepare(&spec).await.expect("prepare");
    let mut wider = spec.clone();
    wider.columns = orders(schema).columns;
    db.check_columns(&wider)
        .await
        .expect("check an empty table");
    apply(
        db,
        &spec,
        &[row(
            "a",
            vec![ColumnValue::Text("x".into())],
            false,
            Version::default(),
        )],
        None,
    )
    .await;
    let message = refused_alike(db, &wider, look, OnMismatch::Null).await;
    assert_contains_all(
        "no documents",
        &message,
        &[
            "column \"total\" of sink.columns is not in the table",
            "resnapshot",
            "ddbpipe state reset",
        ],
    );
    apply(
        db,
        &spec,
        &[RowChange::Delete {
            key: vec![s("a")],
            version: Version::default(),
        }],
        None,
    )
    .await;
    db.prepare(&wider)
        .await
        .expect("an empty table gets the columns");
    let mut added = layout(None, &["status"]);
    added.extend(["total".to_string(), "qty".to_string()]);
    assert_eq!(look.column_names(&wider).await, added);
}
