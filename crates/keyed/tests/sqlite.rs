//! The SQLite backend against real database files in a temporary directory.

use std::path::{Path, PathBuf};

use ddbpipe_keyed::{
    CloseSnapshot, Closed, Database, KeyColumn, KeyType, KeyValue, RowChange, SqliteDatabase,
    StateWrite, TableSpec,
};
use rusqlite::types::Value;

fn spec(table: &str, key: &[(&str, KeyType)]) -> TableSpec {
    TableSpec {
        table: table.to_string(),
        schema: String::new(),
        key: key
            .iter()
            .map(|(name, kind)| KeyColumn {
                name: name.to_string(),
                kind: *kind,
            })
            .collect(),
        document_column: "doc".to_string(),
        create_table: true,
    }
}

fn orders() -> TableSpec {
    spec("orders", &[("pk", KeyType::S)])
}

fn open(path: &Path) -> Database {
    Database::Sqlite(SqliteDatabase::open(path).expect("open"))
}

fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("out.db")
}

fn s(text: &str) -> KeyValue {
    KeyValue::S(text.to_string())
}

fn upsert(key: &str, document: &str, snapshot: bool) -> RowChange {
    RowChange::Upsert {
        key: vec![s(key)],
        document: document.to_string(),
        snapshot,
    }
}

fn delete(key: &str) -> RowChange {
    RowChange::Delete { key: vec![s(key)] }
}

fn state(pipeline: &str, upserts: &[(&str, &str)], deletes: &[&str]) -> StateWrite {
    StateWrite {
        pipeline: pipeline.to_string(),
        upserts: upserts
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect(),
        deletes: deletes.iter().map(|p| p.to_string()).collect(),
        updated_at: "2026-11-29T21:00:00.123Z".to_string(),
    }
}

fn no_state() -> StateWrite {
    state("p", &[], &[])
}

/// Every row of a query, as SQLite values.
fn query(path: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn = rusqlite::Connection::open(path).expect("raw open");
    let mut stmt = conn.prepare(sql).expect("prepare");
    let n = stmt.column_count();
    stmt.query_map([], |row| (0..n).map(|i| row.get::<_, Value>(i)).collect())
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// `orders` as (pk, doc, marker), by key.
fn orders_rows(path: &Path) -> Vec<(String, String, Option<i64>)> {
    let conn = rusqlite::Connection::open(path).expect("raw open");
    let mut stmt = conn
        .prepare("SELECT pk, doc, _ddbpipe_snapshot FROM orders ORDER BY pk")
        .expect("prepare");
    stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn row(pk: &str, doc: &str, marker: Option<i64>) -> (String, String, Option<i64>) {
    (pk.to_string(), doc.to_string(), marker)
}

fn table_exists(path: &Path, table: &str) -> bool {
    !query(
        path,
        &format!("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{table}'"),
    )
    .is_empty()
}

#[tokio::test]
async fn creates_the_table_and_reopens_a_compatible_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let spec = spec("orders", &[("pk", KeyType::S), ("sk", KeyType::N)]);
    let db = open(&path);
    assert_eq!(db.describe(), format!("sqlite {}", path.display()));
    db.prepare(&spec).await.expect("prepare");

    let columns = query(
        &path,
        "SELECT name, type, \"notnull\", pk FROM pragma_table_info('orders') ORDER BY cid",
    );
    let text = |v: &str| Value::Text(v.to_string());
    assert_eq!(
        columns,
        vec![
            vec![
                text("pk"),
                text("TEXT"),
                Value::Integer(1),
                Value::Integer(1)
            ],
            vec![
                text("sk"),
                text("TEXT"),
                Value::Integer(1),
                Value::Integer(2)
            ],
            vec![
                text("doc"),
                text("TEXT"),
                Value::Integer(1),
                Value::Integer(0)
            ],
            vec![
                text("_ddbpipe_snapshot"),
                text("INTEGER"),
                Value::Integer(0),
                Value::Integer(0)
            ],
            vec![
                text("_ddbpipe_updated_at"),
                text("TEXT"),
                Value::Integer(1),
                Value::Integer(0)
            ],
        ]
    );
    assert!(table_exists(&path, "_ddbpipe_state"));
    let journal = query(&path, "PRAGMA journal_mode");
    assert_eq!(journal, vec![vec![text("wal")]]);

    let row = RowChange::Upsert {
        key: vec![s("a"), KeyValue::N("1".to_string())],
        document: "{}".to_string(),
        snapshot: false,
    };
    db.apply(&spec, &[row], None, &no_state())
        .await
        .expect("apply");
    drop(db);

    let again = open(&path);
    again.prepare(&spec).await.expect("compatible reopen");
    assert_eq!(again.count_rows(&spec).await.expect("count"), 1);
    let detail = again.probe(&spec).await.expect("probe");
    assert_eq!(
        detail,
        format!(
            "{}: table 'orders' exists, 1 row(s), key (pk TEXT, sk TEXT)",
            path.display()
        )
    );

    let updated: Vec<Vec<Value>> = query(&path, "SELECT _ddbpipe_updated_at FROM orders");
    let Value::Text(updated) = &updated[0][0] else {
        panic!("updated_at is not text: {updated:?}");
    };
    // 2026-11-29T21:00:00.123Z
    assert_eq!(updated.len(), 24, "{updated}");
    assert!(updated.ends_with('Z') && &updated[10..11] == "T" && &updated[19..20] == ".");
}

#[tokio::test]
async fn incompatible_tables_are_refused_naming_both_keys_or_the_missing_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    db.prepare(&spec("orders", &[("id", KeyType::S)]))
        .await
        .expect("prepare id");

    let wanted = spec("orders", &[("pk", KeyType::S), ("sk", KeyType::S)]);
    let err = db.prepare(&wanted).await.expect_err("other key");
    assert!(!err.retryable);
    assert!(
        err.message.contains("sqlite table 'orders'")
            && err.message.contains("has key columns (id TEXT)")
            && err.message.contains("the source key is (pk TEXT, sk TEXT)")
            && err
                .message
                .contains("choose another sink.table or drop the table"),
        "{}",
        err.message
    );
    let err = db.probe(&wanted).await.expect_err("probe other key");
    assert!(err.message.contains("(id TEXT)"), "{}", err.message);

    // Same name, other type.
    let err = db
        .prepare(&spec("orders", &[("id", KeyType::B)]))
        .await
        .expect_err("other type");
    assert!(
        err.message.contains("(id TEXT)") && err.message.contains("(id BLOB)"),
        "{}",
        err.message
    );

    // A table without ddbpipe's columns.
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute_batch(
        "CREATE TABLE plain (pk TEXT NOT NULL PRIMARY KEY, doc TEXT NOT NULL, _ddbpipe_snapshot INTEGER)",
    )
    .expect("create plain");
    let err = db
        .prepare(&spec("plain", &[("pk", KeyType::S)]))
        .await
        .expect_err("missing column");
    assert!(
        err.message.contains("'_ddbpipe_updated_at'"),
        "{}",
        err.message
    );
    let mut other_doc = spec("plain", &[("pk", KeyType::S)]);
    other_doc.document_column = "item".to_string();
    let err = db.prepare(&other_doc).await.expect_err("missing document");
    assert!(err.message.contains("'item'"), "{}", err.message);

    // Key attributes colliding with ddbpipe's columns.
    let err = db
        .prepare(&spec("x", &[("doc", KeyType::S)]))
        .await
        .expect_err("key named like the document");
    assert!(err.message.contains("'doc'"), "{}", err.message);
    let err = db
        .prepare(&spec("x", &[("_ddbpipe_snapshot", KeyType::S)]))
        .await
        .expect_err("reserved key");
    assert!(err.message.contains("_ddbpipe_"), "{}", err.message);
    assert!(!table_exists(&path, "x"));
}

#[tokio::test]
async fn a_missing_table_without_create_table_is_an_error_and_probe_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let mut spec = orders();

    let detail = db.probe(&spec).await.expect("probe creatable");
    assert_eq!(
        detail,
        format!(
            "{}: table 'orders' will be created, key (pk TEXT)",
            path.display()
        )
    );
    assert!(!table_exists(&path, "orders"));
    assert!(!table_exists(&path, "_ddbpipe_state"));

    spec.create_table = false;
    let expected = format!(
        "sqlite table 'orders' does not exist in {}; create it or set sink.create_table: true",
        path.display()
    );
    let err = db.prepare(&spec).await.expect_err("missing");
    assert_eq!(err.message, expected);
    assert!(!err.retryable);
    let err = db.probe(&spec).await.expect_err("probe missing");
    assert_eq!(err.message, expected);
    assert!(!table_exists(&path, "orders"));
    assert_eq!(db.count_rows(&spec).await.expect("count"), 0);
}

#[tokio::test]
async fn apply_runs_the_changes_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");
    let rows = [
        upsert("a", r#"{"v":1}"#, false),
        upsert("b", r#"{"v":1}"#, false),
        delete("a"),
        upsert("b", r#"{"v":2}"#, false),
        upsert("c", r#"{"v":1}"#, false),
        delete("c"),
        upsert("a", r#"{"v":3}"#, false),
        delete("never-there"),
    ];
    db.apply(&spec, &rows, None, &state("p", &[("position", "1")], &[]))
        .await
        .expect("apply");
    assert_eq!(
        orders_rows(&path),
        vec![row("a", r#"{"v":3}"#, None), row("b", r#"{"v":2}"#, None)]
    );
    assert_eq!(db.count_rows(&spec).await.expect("count"), 2);
    let loaded = db.load_state("p").await.expect("load");
    assert_eq!(loaded.get("position").map(String::as_str), Some("1"));

    db.apply(&spec, &[delete("b")], None, &no_state())
        .await
        .expect("delete");
    assert_eq!(orders_rows(&path), vec![row("a", r#"{"v":3}"#, None)]);
}

#[tokio::test]
async fn snapshot_rows_set_the_marker_and_changes_keep_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");

    db.apply(&spec, &[upsert("a", "{}", true)], Some(7), &no_state())
        .await
        .expect("snapshot row");
    assert_eq!(orders_rows(&path), vec![row("a", "{}", Some(7))]);

    db.apply(
        &spec,
        &[upsert("a", r#"{"x":1}"#, false), upsert("b", "{}", false)],
        Some(7),
        &no_state(),
    )
    .await
    .expect("changes");
    assert_eq!(
        orders_rows(&path),
        vec![row("a", r#"{"x":1}"#, Some(7)), row("b", "{}", None)]
    );

    // A later snapshot re-marks both.
    db.apply(
        &spec,
        &[upsert("a", "{}", true), upsert("b", "{}", true)],
        Some(8),
        &no_state(),
    )
    .await
    .expect("second snapshot");
    assert_eq!(
        orders_rows(&path),
        vec![row("a", "{}", Some(8)), row("b", "{}", Some(8))]
    );

    // A snapshot row with no snapshot open is refused.
    let err = db
        .apply(&spec, &[upsert("c", "{}", true)], None, &no_state())
        .await
        .expect_err("no snapshot id");
    assert!(err.message.contains("'orders'"), "{}", err.message);
    assert_eq!(orders_rows(&path).len(), 2);
}

#[tokio::test]
async fn applying_the_same_batch_twice_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");
    db.apply(
        &spec,
        &[upsert("z", "{}", false), upsert("y", "{}", true)],
        Some(3),
        &no_state(),
    )
    .await
    .expect("earlier rows");

    let rows = [
        upsert("a", r#"{"v":1}"#, true),
        upsert("b", r#"{"v":1}"#, false),
        delete("z"),
        upsert("y", r#"{"v":2}"#, false),
        upsert("a", r#"{"v":2}"#, false),
    ];
    let st = state("p", &[("position", r#"{"seq":"42"}"#)], &["old"]);
    let all_rows = "SELECT pk, doc, _ddbpipe_snapshot FROM orders ORDER BY pk";
    let all_state = "SELECT * FROM _ddbpipe_state ORDER BY pipeline, part";

    db.apply(&spec, &rows, Some(4), &st).await.expect("first");
    let (rows_once, state_once) = (query(&path, all_rows), query(&path, all_state));
    db.apply(&spec, &rows, Some(4), &st).await.expect("second");
    assert_eq!(query(&path, all_rows), rows_once);
    assert_eq!(query(&path, all_state), state_once);
    assert_eq!(
        orders_rows(&path),
        vec![
            row("a", r#"{"v":2}"#, Some(4)),
            row("b", r#"{"v":1}"#, None),
            row("y", r#"{"v":2}"#, Some(3)),
        ]
    );
}

#[tokio::test]
async fn a_bad_row_rolls_back_the_batch_and_the_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");
    db.apply(
        &spec,
        &[upsert("a", "{}", false)],
        None,
        &state("p", &[("position", "1")], &[]),
    )
    .await
    .expect("first batch");
    let rows_before = query(&path, "SELECT * FROM orders");
    let state_before = query(&path, "SELECT * FROM _ddbpipe_state");

    let bad_batches = [
        // A value of the wrong type.
        RowChange::Upsert {
            key: vec![KeyValue::N("1".to_string())],
            document: "{}".to_string(),
            snapshot: false,
        },
        // Too many values.
        RowChange::Delete {
            key: vec![s("a"), s("b")],
        },
        // None at all.
        RowChange::Delete { key: vec![] },
    ];
    for bad in bad_batches {
        let batch = [upsert("b", "{}", false), delete("a"), bad.clone()];
        let err = db
            .apply(
                &spec,
                &batch,
                None,
                &state("p", &[("position", "2"), ("new", "{}")], &["position"]),
            )
            .await
            .expect_err("bad row");
        assert!(!err.retryable, "{bad:?}");
        assert!(
            err.message
                .starts_with(&format!("sqlite table 'orders' in {}: ", path.display())),
            "{}",
            err.message
        );
        assert_eq!(query(&path, "SELECT * FROM orders"), rows_before, "{bad:?}");
        assert_eq!(
            query(&path, "SELECT * FROM _ddbpipe_state"),
            state_before,
            "{bad:?}"
        );
    }
    // The connection is usable afterwards.
    db.apply(&spec, &[upsert("b", "{}", false)], None, &no_state())
        .await
        .expect("after the rollback");
    assert_eq!(db.count_rows(&spec).await.expect("count"), 2);
}

#[tokio::test]
async fn state_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);

    // No state table: nothing to load or reset, and nothing created.
    assert!(db.load_state("p").await.expect("load").is_empty());
    assert!(!db.reset_state("p").await.expect("reset"));
    assert!(!table_exists(&path, "_ddbpipe_state"));

    db.prepare_state().await.expect("prepare_state");
    db.store_state(&state("p", &[("a", "1"), ("b", r#"{"x":[1,2]}"#)], &[]))
        .await
        .expect("store");
    db.store_state(&state("other", &[("a", "9")], &[]))
        .await
        .expect("store other");
    let loaded = db.load_state("p").await.expect("load");
    assert_eq!(
        loaded.into_iter().collect::<Vec<_>>(),
        vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), r#"{"x":[1,2]}"#.to_string())
        ]
    );
    assert_eq!(
        query(
            &path,
            "SELECT updated_at FROM _ddbpipe_state WHERE pipeline = 'p' AND part = 'a'"
        ),
        vec![vec![Value::Text("2026-11-29T21:00:00.123Z".to_string())]]
    );

    db.store_state(&state("p", &[("a", "2"), ("c", "3")], &["b", "missing"]))
        .await
        .expect("upsert and delete");
    let loaded = db.load_state("p").await.expect("load");
    assert_eq!(
        loaded.into_iter().collect::<Vec<_>>(),
        vec![
            ("a".to_string(), "2".to_string()),
            ("c".to_string(), "3".to_string())
        ]
    );

    assert!(db.reset_state("p").await.expect("reset"));
    assert!(db.load_state("p").await.expect("load").is_empty());
    assert!(!db.reset_state("p").await.expect("reset again"));
    assert_eq!(
        db.load_state("other").await.expect("other").get("a"),
        Some(&"9".to_string())
    );
}

/// Rows `a` (snapshot 5), `b` (no marker), `c` (snapshot 4).
async fn three_rows(db: &Database, spec: &TableSpec) {
    db.prepare(spec).await.expect("prepare");
    db.apply(spec, &[upsert("c", "{}", true)], Some(4), &no_state())
        .await
        .expect("old snapshot");
    db.apply(
        spec,
        &[upsert("a", "{}", true), upsert("b", "{}", false)],
        Some(5),
        &no_state(),
    )
    .await
    .expect("rows");
}

#[tokio::test]
async fn close_snapshot_deletes_the_unseen_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    three_rows(&db, &spec).await;
    let close = CloseSnapshot {
        id: 5,
        delete_unseen: true,
        max_keys: 1,
    };
    let closed = db
        .close_snapshot(&spec, close, &state("p", &[("snapshot", "null")], &[]))
        .await
        .expect("close");
    assert_eq!(
        closed,
        Closed {
            keys_written: 1,
            deleted: 2,
            ceiling_hit: false
        }
    );
    assert_eq!(orders_rows(&path), vec![row("a", "{}", Some(5))]);
    assert_eq!(
        db.load_state("p").await.expect("load").get("snapshot"),
        Some(&"null".to_string())
    );
}

#[tokio::test]
async fn close_snapshot_over_the_ceiling_deletes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    three_rows(&db, &spec).await;
    let close = CloseSnapshot {
        id: 5,
        delete_unseen: true,
        max_keys: 0,
    };
    let closed = db
        .close_snapshot(&spec, close, &state("p", &[("snapshot", "null")], &[]))
        .await
        .expect("close");
    assert_eq!(
        closed,
        Closed {
            keys_written: 1,
            deleted: 0,
            ceiling_hit: true
        }
    );
    assert_eq!(orders_rows(&path).len(), 3);
    assert_eq!(db.load_state("p").await.expect("load").len(), 1);
}

#[tokio::test]
async fn close_snapshot_without_deletes_only_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    three_rows(&db, &spec).await;
    let close = CloseSnapshot {
        id: 4,
        delete_unseen: false,
        max_keys: 100,
    };
    let closed = db
        .close_snapshot(&spec, close, &no_state())
        .await
        .expect("close");
    assert_eq!(
        closed,
        Closed {
            keys_written: 1,
            deleted: 0,
            ceiling_hit: false
        }
    );
    assert_eq!(orders_rows(&path).len(), 3);
}

#[tokio::test]
async fn a_failed_close_snapshot_rolls_back_its_deletes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    three_rows(&db, &spec).await;
    // Writing the state fails: no state table.
    rusqlite::Connection::open(&path)
        .expect("raw open")
        .execute_batch("DROP TABLE _ddbpipe_state")
        .expect("drop state");
    let close = CloseSnapshot {
        id: 5,
        delete_unseen: true,
        max_keys: 10,
    };
    let err = db
        .close_snapshot(&spec, close, &state("p", &[("snapshot", "null")], &[]))
        .await
        .expect_err("no state table");
    assert!(err.message.contains("_ddbpipe_state"), "{}", err.message);
    assert_eq!(orders_rows(&path).len(), 3);
}

#[tokio::test]
async fn the_run_lock_is_exclusive_until_every_clone_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let first = open(&path);
    let clone = first.clone();
    let second = open(&path);
    let lock_file = format!("{}-ddbpipe-p.lock", path.display());

    assert_eq!(second.lock_holder("p").await.expect("free"), None);
    first.lock("p").await.expect("take the lock");
    first.lock("p").await.expect("taking it again is a no-op");
    assert_eq!(
        std::fs::read_to_string(&lock_file)
            .expect("lock file")
            .trim(),
        std::process::id().to_string()
    );

    let holder = match second.lock("p").await {
        Err(Ok(holder)) => holder,
        other => panic!("expected the holder, got {other:?}"),
    };
    assert_eq!(holder.location, lock_file);
    assert_eq!(holder.pid, Some(std::process::id()));
    assert_eq!(
        second.lock_holder("p").await.expect("held"),
        Some(holder.clone())
    );
    assert_eq!(first.lock_holder("p").await.expect("ours"), None);
    // Another pipeline has its own lock.
    second.lock("q").await.expect("other pipeline");

    drop(first);
    assert_eq!(
        second.lock_holder("p").await.expect("clone alive"),
        Some(holder)
    );
    drop(clone);
    assert_eq!(second.lock_holder("p").await.expect("released"), None);
    second.lock("p").await.expect("take after release");
}

#[tokio::test]
async fn open_existing_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    assert!(
        SqliteDatabase::open_existing(&path)
            .expect("open_existing")
            .is_none()
    );
    assert!(!path.exists());

    let db = open(&path);
    db.prepare(&orders()).await.expect("prepare");
    db.store_state(&state("p", &[("a", "1")], &[]))
        .await
        .expect("store");
    drop(db);
    let existing = Database::Sqlite(
        SqliteDatabase::open_existing(&path)
            .expect("open_existing")
            .expect("exists"),
    );
    assert_eq!(existing.load_state("p").await.expect("load").len(), 1);
    assert_eq!(existing.lock_holder("p").await.expect("holder"), None);
    assert!(!Path::new(&format!("{}-ddbpipe-p.lock", path.display())).exists());

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![b'x'; 4096]).expect("write garbage");
    let err = SqliteDatabase::open_existing(&garbage).expect_err("not a database");
    assert!(err.message.contains("garbage.db"), "{}", err.message);
}

#[tokio::test]
async fn number_and_binary_keys_round_trip_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = spec("things", &[("n", KeyType::N), ("b", KeyType::B)]);
    db.prepare(&spec).await.expect("prepare");
    let big = "12345678901234567890123";
    let tiny = "-0.000000000000000000000000000000001";
    let bytes = vec![0u8, 255, 1, 0, 128];
    let key = |n: &str, b: &[u8]| vec![KeyValue::N(n.to_string()), KeyValue::B(b.to_vec())];
    let rows = [
        RowChange::Upsert {
            key: key(big, &bytes),
            document: "{}".to_string(),
            snapshot: false,
        },
        RowChange::Upsert {
            key: key(tiny, &[]),
            document: "{}".to_string(),
            snapshot: false,
        },
        // Another number text is another key, even when numerically equal.
        RowChange::Upsert {
            key: key("1E1", b"x"),
            document: "{}".to_string(),
            snapshot: false,
        },
        RowChange::Upsert {
            key: key("10", b"x"),
            document: "{}".to_string(),
            snapshot: false,
        },
    ];
    db.apply(&spec, &rows, None, &no_state())
        .await
        .expect("apply");
    let stored = query(
        &path,
        "SELECT n, typeof(n), b, typeof(b) FROM things ORDER BY n",
    );
    let text = |v: &str| Value::Text(v.to_string());
    assert_eq!(
        stored,
        vec![
            vec![text(tiny), text("text"), Value::Blob(vec![]), text("blob")],
            vec![
                text("10"),
                text("text"),
                Value::Blob(b"x".to_vec()),
                text("blob")
            ],
            vec![
                text(big),
                text("text"),
                Value::Blob(bytes.clone()),
                text("blob")
            ],
            vec![
                text("1E1"),
                text("text"),
                Value::Blob(b"x".to_vec()),
                text("blob")
            ],
        ]
    );
    db.apply(
        &spec,
        &[RowChange::Delete {
            key: key(big, &bytes),
        }],
        None,
        &no_state(),
    )
    .await
    .expect("delete");
    assert_eq!(db.count_rows(&spec).await.expect("count"), 3);
}

#[tokio::test]
async fn identifiers_are_quoted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let mut spec = spec(
        r#"my "odd" table; drop"#,
        &[(r#"p"k"#, KeyType::S), ("order", KeyType::S)],
    );
    spec.document_column = "select".to_string();
    db.prepare(&spec).await.expect("prepare");
    let row = RowChange::Upsert {
        key: vec![s("a"), s("b")],
        document: "{}".to_string(),
        snapshot: true,
    };
    db.apply(&spec, &[row], Some(1), &no_state())
        .await
        .expect("apply");
    assert_eq!(db.count_rows(&spec).await.expect("count"), 1);
    db.prepare(&spec).await.expect("compatible");
    let closed = db
        .close_snapshot(
            &spec,
            CloseSnapshot {
                id: 1,
                delete_unseen: true,
                max_keys: 10,
            },
            &no_state(),
        )
        .await
        .expect("close");
    assert_eq!(closed.keys_written, 1);
}

#[tokio::test]
async fn a_busy_database_is_retryable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");
    let other = rusqlite::Connection::open(&path).expect("raw open");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("hold the write lock");
    // Waits out the 5 s busy timeout.
    let err = db
        .apply(&spec, &[upsert("a", "{}", false)], None, &no_state())
        .await
        .expect_err("busy");
    assert!(err.retryable, "{}", err.message);
    assert!(err.message.contains("'orders'"), "{}", err.message);
    other.execute_batch("ROLLBACK").expect("release");
    db.apply(&spec, &[upsert("a", "{}", false)], None, &no_state())
        .await
        .expect("after release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_multi_thread_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = db_path(&dir);
    let db = open(&path);
    let spec = orders();
    db.prepare(&spec).await.expect("prepare");
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let db = db.clone();
            let spec = spec.clone();
            tokio::spawn(async move {
                let rows: Vec<_> = (0..25)
                    .map(|j| upsert(&format!("{i}-{j}"), "{}", false))
                    .collect();
                db.apply(&spec, &rows, None, &state("p", &[("task", "x")], &[]))
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("join").expect("apply");
    }
    assert_eq!(db.count_rows(&spec).await.expect("count"), 100);
}
