//! The SQLite backend against real database files in a temporary directory.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{delete, s, upsert_key, versions};
use ddbpipe_keyed::{
    CloseSnapshot, Closed, Database, KeyType, KeyValue, LockAttempt, RowChange, SqliteDatabase,
    StateWrite, TableSpec, Version,
};
use rusqlite::types::Value;

fn spec(table: &str, key: &[(&str, KeyType)]) -> TableSpec {
    common::spec_in("", table, key)
}

fn orders() -> TableSpec {
    spec("orders", &[("pk", KeyType::S)])
}

fn open(path: &Path) -> Database {
    Database::from(SqliteDatabase::open(path).expect("open"))
}

fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("out.db")
}

/// A database file in a fresh temporary directory (removed on drop), and a handle on it.
struct Fixture {
    /// Held for its drop.
    _dir: tempfile::TempDir,
    path: PathBuf,
    db: Database,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = db_path(&dir);
        let db = open(&path);
        Fixture {
            _dir: dir,
            path,
            db,
        }
    }

    /// A fresh database with `orders` prepared.
    async fn with_orders() -> (Self, TableSpec) {
        let fx = Self::new();
        let spec = orders();
        fx.db.prepare(&spec).await.expect("prepare");
        (fx, spec)
    }
}

fn upsert(key: &str, document: &str, snapshot: bool) -> RowChange {
    upsert_key(vec![s(key)], document, snapshot)
}

fn state(pipeline: &str, upserts: &[(&str, &str)], deletes: &[&str]) -> StateWrite {
    common::state_at("2026-11-29T21:00:00.123Z", pipeline, upserts, deletes)
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

fn text(v: &str) -> Value {
    Value::Text(v.to_string())
}

/// Applies `rows` with no state write; `what` names the step when it fails.
async fn apply(
    db: &Database,
    spec: &TableSpec,
    rows: &[RowChange],
    snapshot: Option<i64>,
    what: &str,
) {
    db.apply(spec, rows, snapshot, &no_state())
        .await
        .expect(what);
}

#[tokio::test]
async fn creates_the_table_and_reopens_a_compatible_one() {
    let Fixture { _dir, path, db } = Fixture::new();
    let spec = spec("orders", &[("pk", KeyType::S), ("sk", KeyType::N)]);
    assert_eq!(db.describe(), format!("sqlite {}", path.display()));
    db.prepare(&spec).await.expect("prepare");

    let columns = query(
        &path,
        "SELECT name, type, \"notnull\", pk FROM pragma_table_info('orders') ORDER BY cid",
    );
    // (name, type, not null, position in the primary key)
    let want = [
        ("pk", "TEXT", 1, 1),
        ("sk", "TEXT", 1, 2),
        ("doc", "TEXT", 1, 0),
        ("_ddbpipe_snapshot", "INTEGER", 0, 0),
        ("_ddbpipe_updated_at", "TEXT", 1, 0),
        ("_ddbpipe_version_ms", "INTEGER", 0, 0),
        ("_ddbpipe_version_seq", "TEXT", 0, 0),
    ]
    .map(|(name, kind, not_null, pk)| {
        vec![
            text(name),
            text(kind),
            Value::Integer(not_null),
            Value::Integer(pk),
        ]
    });
    assert_eq!(columns, want);
    assert!(table_exists(&path, "_ddbpipe_state"));
    assert!(table_exists(&path, "_ddbpipe_deleted"));
    let journal = query(&path, "PRAGMA journal_mode");
    assert_eq!(journal, vec![vec![text("wal")]]);

    let row = upsert_key(vec![s("a"), KeyValue::N("1".to_string())], "{}", false);
    apply(&db, &spec, &[row], None, "apply").await;
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
    let Fixture { _dir, path, db } = Fixture::new();
    db.prepare(&spec("orders", &[("id", KeyType::S)]))
        .await
        .expect("prepare id");

    let wanted = spec("orders", &[("pk", KeyType::S), ("sk", KeyType::S)]);
    let err = db.prepare(&wanted).await.expect_err("other key");
    assert!(!err.is_retryable());
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

    // A table without ddbpipe's columns.
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute_batch(
        "CREATE TABLE plain (pk TEXT NOT NULL PRIMARY KEY, doc TEXT NOT NULL, _ddbpipe_snapshot INTEGER); \
         CREATE TABLE docless (pk TEXT NOT NULL PRIMARY KEY, _ddbpipe_snapshot INTEGER, \
         _ddbpipe_updated_at TEXT NOT NULL); INSERT INTO docless VALUES ('a', NULL, 'x')",
    )
    .expect("create plain");
    // A table with rows cannot get a document column (an empty one would).
    let mut other_doc = spec("docless", &[("pk", KeyType::S)]);
    other_doc.document_column = Some("item".to_string());

    // (case, spec refused, every text the message holds)
    let cases = [
        (
            "same name, other type",
            spec("orders", &[("id", KeyType::B)]),
            &["(id TEXT)", "(id BLOB)"][..],
        ),
        (
            "missing column",
            spec("plain", &[("pk", KeyType::S)]),
            &["'_ddbpipe_updated_at'"],
        ),
        ("missing document", other_doc, &["\"item\"", "has rows"]),
        // Key attributes colliding with ddbpipe's columns.
        (
            "key named like the document",
            spec("x", &[("doc", KeyType::S)]),
            &["'doc'"],
        ),
        (
            "reserved key",
            spec("x", &[("_ddbpipe_snapshot", KeyType::S)]),
            &["_ddbpipe_"],
        ),
    ];
    for (case, refused, texts) in cases {
        let err = db.prepare(&refused).await.expect_err(case);
        common::assert_contains_all(case, &err.message, texts);
    }
    assert!(!table_exists(&path, "x"));
}

#[tokio::test]
async fn a_missing_table_without_create_table_is_an_error_and_probe_changes_nothing() {
    let Fixture { _dir, path, db } = Fixture::new();
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
    assert!(!table_exists(&path, "_ddbpipe_deleted"));

    spec.create_table = false;
    let expected = format!(
        "sqlite table 'orders' does not exist in {}; create it or set sink.create_table: true",
        path.display()
    );
    let err = db.prepare(&spec).await.expect_err("missing");
    assert_eq!(err.message, expected);
    assert!(!err.is_retryable());
    let err = db.probe(&spec).await.expect_err("probe missing");
    assert_eq!(err.message, expected);
    assert!(!table_exists(&path, "orders"));
    assert_eq!(db.count_rows(&spec).await.expect("count"), 0);
}

#[tokio::test]
async fn apply_runs_the_changes_in_order() {
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, path, db } = fx;
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

    apply(&db, &spec, &[delete("b")], None, "delete").await;
    assert_eq!(orders_rows(&path), vec![row("a", r#"{"v":3}"#, None)]);
}

#[tokio::test]
async fn snapshot_rows_set_the_marker_and_changes_keep_it_outside_a_snapshot() {
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, path, db } = fx;

    // (step, rows, snapshot open, the table after)
    let steps = [
        (
            "snapshot row",
            vec![upsert("a", "{}", true)],
            Some(7),
            vec![row("a", "{}", Some(7))],
        ),
        (
            "changes with no snapshot open",
            vec![upsert("a", r#"{"x":1}"#, false), upsert("b", "{}", false)],
            None,
            vec![row("a", r#"{"x":1}"#, Some(7)), row("b", "{}", None)],
        ),
        // docs/mirror.md §5.6: a change while a snapshot is open marks its row.
        (
            "a change with the snapshot open",
            vec![upsert("b", r#"{"x":1}"#, false)],
            Some(7),
            vec![
                row("a", r#"{"x":1}"#, Some(7)),
                row("b", r#"{"x":1}"#, Some(7)),
            ],
        ),
        // A later snapshot re-marks both.
        (
            "second snapshot",
            vec![upsert("a", "{}", true), upsert("b", "{}", true)],
            Some(8),
            vec![row("a", "{}", Some(8)), row("b", "{}", Some(8))],
        ),
    ];
    for (step, rows, snapshot, want) in steps {
        apply(&db, &spec, &rows, snapshot, step).await;
        assert_eq!(orders_rows(&path), want, "{step}");
    }

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
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, path, db } = fx;
    let earlier = [upsert("z", "{}", false), upsert("y", "{}", true)];
    apply(&db, &spec, &earlier, Some(3), "earlier rows").await;

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
            // Changes while the snapshot is open mark their rows (docs/mirror.md §5.6).
            row("b", r#"{"v":1}"#, Some(4)),
            row("y", r#"{"v":2}"#, Some(4)),
        ]
    );
}

#[tokio::test]
async fn a_bad_row_rolls_back_the_batch_and_the_state() {
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, path, db } = fx;
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
        upsert_key(vec![KeyValue::N("1".to_string())], "{}", false),
        // Too many values.
        RowChange::Delete {
            key: vec![s("a"), s("b")],
            version: Version::default(),
        },
        // None at all.
        RowChange::Delete {
            key: vec![],
            version: Version::default(),
        },
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
        assert!(!err.is_retryable(), "{bad:?}");
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
    apply(
        &db,
        &spec,
        &[upsert("b", "{}", false)],
        None,
        "after the rollback",
    )
    .await;
    assert_eq!(db.count_rows(&spec).await.expect("count"), 2);
}

#[tokio::test]
async fn state_round_trip() {
    let Fixture { _dir, path, db } = Fixture::new();
    let parts = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(part, value)| (part.to_string(), value.to_string()))
            .collect()
    };

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
        parts(&[("a", "1"), ("b", r#"{"x":[1,2]}"#)])
    );
    assert_eq!(
        query(
            &path,
            "SELECT updated_at FROM _ddbpipe_state WHERE pipeline = 'p' AND part = 'a'"
        ),
        vec![vec![text("2026-11-29T21:00:00.123Z")]]
    );

    db.store_state(&state("p", &[("a", "2"), ("c", "3")], &["b", "missing"]))
        .await
        .expect("upsert and delete");
    let loaded = db.load_state("p").await.expect("load");
    assert_eq!(
        loaded.into_iter().collect::<Vec<_>>(),
        parts(&[("a", "2"), ("c", "3")])
    );

    assert!(db.reset_state("p").await.expect("reset"));
    assert!(db.load_state("p").await.expect("load").is_empty());
    assert!(!db.reset_state("p").await.expect("reset again"));
    assert_eq!(
        db.load_state("other").await.expect("other").get("a"),
        Some(&"9".to_string())
    );
}

/// A fresh database with `orders` holding rows `a` (snapshot 5), `b` (no marker) and `c`
/// (snapshot 4).
async fn three_rows() -> (Fixture, TableSpec) {
    let (fx, spec) = Fixture::with_orders().await;
    apply(
        &fx.db,
        &spec,
        &[upsert("c", "{}", true)],
        Some(4),
        "old snapshot",
    )
    .await;
    let change = [upsert("b", "{}", false)];
    apply(&fx.db, &spec, &change, None, "change").await;
    apply(&fx.db, &spec, &[upsert("a", "{}", true)], Some(5), "rows").await;
    (fx, spec)
}

#[tokio::test]
async fn close_snapshot_deletes_the_unseen_rows_below_the_ceiling_when_asked() {
    let all_three = vec![
        row("a", "{}", Some(5)),
        row("b", "{}", None),
        row("c", "{}", Some(4)),
    ];
    let closed_state = [("snapshot", "null")];
    // (case, close, state parts written, what it did, the table after, the state after)
    let cases = [
        (
            "deletes the unseen rows",
            CloseSnapshot {
                id: 5,
                delete_unseen: true,
                max_keys: 1,
            },
            &closed_state[..],
            Closed {
                keys_written: 1,
                deleted: 2,
                ceiling_hit: false,
            },
            vec![row("a", "{}", Some(5))],
            &closed_state[..],
        ),
        (
            "over the ceiling deletes nothing",
            CloseSnapshot {
                id: 5,
                delete_unseen: true,
                max_keys: 0,
            },
            &closed_state,
            Closed {
                keys_written: 1,
                deleted: 0,
                ceiling_hit: true,
            },
            all_three.clone(),
            &closed_state,
        ),
        (
            "without deletes only counts",
            CloseSnapshot {
                id: 4,
                delete_unseen: false,
                max_keys: 100,
            },
            &[],
            Closed {
                keys_written: 1,
                deleted: 0,
                ceiling_hit: false,
            },
            all_three.clone(),
            &[],
        ),
    ];
    for (case, close, parts, want_closed, want_rows, want_state) in cases {
        let (fx, spec) = three_rows().await;
        let Fixture { _dir, path, db } = fx;
        let closed = db
            .close_snapshot(&spec, close, &state("p", parts, &[]))
            .await
            .expect(case);
        assert_eq!(closed, want_closed, "{case}");
        assert_eq!(orders_rows(&path), want_rows, "{case}");
        let want_state: BTreeMap<String, String> = want_state
            .iter()
            .map(|(part, value)| (part.to_string(), value.to_string()))
            .collect();
        assert_eq!(db.load_state("p").await.expect(case), want_state, "{case}");
    }
}

#[tokio::test]
async fn a_failed_close_snapshot_rolls_back_its_deletes() {
    let (fx, spec) = three_rows().await;
    let Fixture { _dir, path, db } = fx;
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
    let Fixture {
        _dir,
        path,
        db: first,
    } = Fixture::new();
    let clone = first.clone();
    let second = open(&path);
    let lock_file = format!("{}-ddbpipe-p.lock", path.display());

    assert_eq!(second.lock_holder("p").await.expect("free"), None);
    assert_eq!(
        first.lock("p").await.expect("take the lock"),
        LockAttempt::Acquired
    );
    assert_eq!(
        first.lock("p").await.expect("taking it again is a no-op"),
        LockAttempt::Acquired
    );
    assert_eq!(
        std::fs::read_to_string(&lock_file)
            .expect("lock file")
            .trim(),
        std::process::id().to_string()
    );

    let holder = match second.lock("p").await {
        Ok(LockAttempt::HeldBy(holder)) => holder,
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
    assert_eq!(
        second.lock("q").await.expect("other pipeline"),
        LockAttempt::Acquired
    );

    drop(first);
    assert_eq!(
        second.lock_holder("p").await.expect("clone alive"),
        Some(holder)
    );
    drop(clone);
    assert_eq!(second.lock_holder("p").await.expect("released"), None);
    assert_eq!(
        second.lock("p").await.expect("take after release"),
        LockAttempt::Acquired
    );
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
    let existing = Database::from(
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
    let Fixture { _dir, path, db } = Fixture::new();
    let spec = spec("things", &[("n", KeyType::N), ("b", KeyType::B)]);
    db.prepare(&spec).await.expect("prepare");
    let big = "12345678901234567890123";
    let tiny = "-0.000000000000000000000000000000001";
    let bytes = vec![0u8, 255, 1, 0, 128];
    let key = |n: &str, b: &[u8]| vec![KeyValue::N(n.to_string()), KeyValue::B(b.to_vec())];
    let rows = [
        upsert_key(key(big, &bytes), "{}", false),
        upsert_key(key(tiny, &[]), "{}", false),
        // Another number text is another key, even when numerically equal.
        upsert_key(key("1E1", b"x"), "{}", false),
        upsert_key(key("10", b"x"), "{}", false),
    ];
    apply(&db, &spec, &rows, None, "apply").await;
    let stored = query(
        &path,
        "SELECT n, typeof(n), b, typeof(b) FROM things ORDER BY n",
    );
    let want = [(tiny, &[][..]), ("10", b"x"), (big, &bytes), ("1E1", b"x")]
        .map(|(n, b)| vec![text(n), text("text"), Value::Blob(b.to_vec()), text("blob")]);
    assert_eq!(stored, want);
    let gone = RowChange::Delete {
        key: key(big, &bytes),
        version: Version::default(),
    };
    apply(&db, &spec, &[gone], None, "delete").await;
    assert_eq!(db.count_rows(&spec).await.expect("count"), 3);
}

#[tokio::test]
async fn identifiers_are_quoted() {
    let Fixture { _dir, db, .. } = Fixture::new();
    let mut spec = spec(
        r#"my "odd" table; drop"#,
        &[(r#"p"k"#, KeyType::S), ("order", KeyType::S)],
    );
    spec.document_column = Some("select".to_string());
    db.prepare(&spec).await.expect("prepare");
    let row = upsert_key(vec![s("a"), s("b")], "{}", true);
    apply(&db, &spec, &[row], Some(1), "apply").await;
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
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, path, db } = fx;
    let other = rusqlite::Connection::open(&path).expect("raw open");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("hold the write lock");
    // Waits out the 5 s busy timeout.
    let err = db
        .apply(&spec, &[upsert("a", "{}", false)], None, &no_state())
        .await
        .expect_err("busy");
    assert!(err.is_retryable(), "{}", err.message);
    assert!(err.message.contains("'orders'"), "{}", err.message);
    other.execute_batch("ROLLBACK").expect("release");
    apply(
        &db,
        &spec,
        &[upsert("a", "{}", false)],
        None,
        "after release",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_multi_thread_runtime() {
    let (fx, spec) = Fixture::with_orders().await;
    let Fixture { _dir, db, .. } = fx;
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

/// Reads a database file behind the handle's back, for the scenarios of `common::versions`.
struct FileLook<'a>(&'a Path);

impl versions::Look for FileLook<'_> {
    async fn rows(&self, spec: &TableSpec) -> BTreeMap<String, versions::Seen> {
        let conn = rusqlite::Connection::open(self.0).expect("raw open");
        let sql = format!(
            "SELECT \"{}\", \"{}\", _ddbpipe_snapshot, _ddbpipe_version_ms, _ddbpipe_version_seq \
             FROM \"{}\"",
            spec.key[0].name,
            spec.document_column.as_deref().unwrap_or_default(),
            spec.table
        );
        let mut stmt = conn.prepare(&sql).expect("prepare");
        stmt.query_map([], |row| {
            let doc: String = row.get(1)?;
            Ok((
                row.get(0)?,
                versions::Seen {
                    doc: serde_json::from_str(&doc).expect("a JSON document"),
                    marker: row.get(2)?,
                    version_ms: row.get(3)?,
                    version_seq: row.get(4)?,
                },
            ))
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
    }

    async fn markers(&self) -> Vec<versions::Marker> {
        let conn = rusqlite::Connection::open(self.0).expect("raw open");
        let mut stmt = conn
            .prepare("SELECT table_name, key_text, version_ms FROM _ddbpipe_deleted ORDER BY 1, 2")
            .expect("prepare");
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }
}

/// Runs a scenario of `common::versions` on a fresh database with `orders` prepared.
macro_rules! versions_scenario {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let (fx, spec) = Fixture::with_orders().await;
            versions::$name(&fx.db, &spec, &FileLook(&fx.path)).await;
        }
    };
}

each_versions_scenario!(versions_scenario);

#[tokio::test]
async fn a_table_without_the_version_columns_is_upgraded_by_prepare_and_keeps_its_rows() {
    let Fixture { _dir, path, db } = Fixture::new();
    // The DDL of ddbpipe before versions.
    rusqlite::Connection::open(&path)
        .expect("raw open")
        .execute_batch(
            "CREATE TABLE \"orders\" (\"pk\" TEXT NOT NULL, \"doc\" TEXT NOT NULL, \
             \"_ddbpipe_snapshot\" INTEGER, \"_ddbpipe_updated_at\" TEXT NOT NULL, \
             PRIMARY KEY (\"pk\")); \
             INSERT INTO orders VALUES ('old', '{\"v\":0}', 3, '2025-01-01T00:00:00.000Z');",
        )
        .expect("old table");
    let spec = orders();
    let columns = || {
        query(
            &path,
            "SELECT name FROM pragma_table_info('orders') ORDER BY cid",
        )
        .into_iter()
        .map(|row| match &row[0] {
            Value::Text(name) => name.clone(),
            other => panic!("a column name: {other:?}"),
        })
        .collect::<Vec<_>>()
    };
    let old_columns = columns();

    // `check` accepts it and changes nothing.
    let detail = db.probe(&spec).await.expect("probe");
    assert!(
        detail.contains("table 'orders' exists, 1 row(s)"),
        "{detail}"
    );
    assert_eq!(columns(), old_columns);
    assert!(!table_exists(&path, "_ddbpipe_deleted"));

    db.prepare(&spec).await.expect("prepare upgrades");
    db.prepare(&spec).await.expect("prepare again");
    assert_eq!(
        columns(),
        [
            "pk",
            "doc",
            "_ddbpipe_snapshot",
            "_ddbpipe_updated_at",
            "_ddbpipe_version_ms",
            "_ddbpipe_version_seq"
        ]
    );
    assert!(table_exists(&path, "_ddbpipe_deleted"));
    let look = FileLook(&path);
    let old = versions::seen(r#"{"v":0}"#, Some(3), None, None);
    assert_eq!(versions::Look::rows(&look, &spec).await["old"], old);

    // Its row does not hold a snapshot row back; new writes carry versions.
    let rows = [
        versions::snapshot_row("old", r#"{"v":1}"#, Some(versions::T)),
        versions::change("new", "{}", versions::T, "100"),
    ];
    apply(&db, &spec, &rows, Some(7), "versioned rows").await;
    let after = versions::Look::rows(&look, &spec).await;
    assert_eq!(
        after["old"],
        versions::seen(r#"{"v":1}"#, Some(7), Some(versions::T), None)
    );
    assert_eq!(
        after["new"],
        versions::seen("{}", Some(7), Some(versions::T), Some("100"))
    );
}

#[tokio::test]
async fn a_lease_fence_refuses_an_older_owners_batches() {
    let (fx, spec) = Fixture::with_orders().await;
    common::fences_refuse_older_owners(&fx.db, &spec).await;
}

#[tokio::test]
async fn a_shared_snapshot_record_is_opened_once_and_its_cleanup_runs_once() {
    let (fx, spec) = Fixture::with_orders().await;
    common::a_shared_snapshot_opens_once_and_closes_once(&fx.db, &spec).await;
}

#[tokio::test]
async fn a_shared_snapshot_is_replaced_once_and_refuses_the_older_generation() {
    let (fx, spec) = Fixture::with_orders().await;
    common::a_shared_snapshot_is_replaced_once_and_refuses_the_older_generation(&fx.db, &spec)
        .await;
}

#[tokio::test]
async fn a_state_write_under_an_older_fence_is_refused_and_writes_nothing() {
    let (fx, spec) = Fixture::with_orders().await;
    common::a_state_write_under_an_older_fence_is_refused_and_writes_nothing(&fx.db, &spec).await;
}

/// Issue 30: the runs of several tables of one pipeline file open one new SQLite file at once.
/// Switching a new file to WAL meets the other connections' locks, and SQLite answers that
/// with "database is locked" without waiting for its busy handler: the open waits instead.
/// Twenty rounds of eight threads opening a fresh file together: every open succeeds, in WAL.
#[test]
fn many_connections_opening_one_new_file_at_once_all_succeed() {
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = db_path(&dir);
        let together = std::sync::Arc::new(std::sync::Barrier::new(8));
        let opening: Vec<_> = (0..8)
            .map(|_| {
                let (path, together) = (path.clone(), std::sync::Arc::clone(&together));
                std::thread::spawn(move || {
                    together.wait();
                    SqliteDatabase::open(&path).map(|_| ())
                })
            })
            .collect();
        for (index, opened) in opening.into_iter().enumerate() {
            if let Err(error) = opened.join().expect("the thread") {
                panic!("round {round}, connection {index}: {error}");
            }
        }
        let conn = rusqlite::Connection::open(&path).expect("open");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .expect("journal mode");
        assert_eq!(mode, "wal");
    }
}
