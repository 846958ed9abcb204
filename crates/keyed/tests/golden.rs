//! Golden sink databases (`crates/pipeline/tests/golden/README.md`): the state parts every sink database
//! ddbpipe has written are read, and written back part for part, byte-identically.

// A failed unwrap in a test is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddbpipe_keyed::state::DatabaseStore;
use ddbpipe_keyed::{Database, DocumentType, KeyColumn, KeyType, SqliteDatabase, TableSpec};
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;

fn golden(name: &str) -> PathBuf {
    ddbpipe_testkit::package_dir()
        .join("../pipeline/tests/golden")
        .join(name)
}

fn table() -> TableSpec {
    TableSpec {
        table: "orders".into(),
        schema: "main".into(),
        key: vec![],
        document_column: Some("document".into()),
        columns: Vec::new(),
        document_type: DocumentType::Jsonb,
        create_table: true,
    }
}

/// The stored parts of `pipeline` in the SQLite file at `path`: `part → value`.
async fn parts(path: &Path, pipeline: &str) -> BTreeMap<String, String> {
    let db = SqliteDatabase::open_existing(path).unwrap().unwrap();
    Database::from(db).load_state(pipeline).await.unwrap()
}

#[tokio::test]
async fn every_sink_database_is_written_back_part_for_part() {
    for (name, pipeline) in [
        ("demo-mirror.db", "orders-mirror"),
        ("v1-mirror-open.db", "orders-mirror"),
        ("v1-resnapshot-complete.db", "orders-mirror"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(name);
        std::fs::copy(golden(name), &copy).unwrap();
        let db = Database::from(SqliteDatabase::open_existing(&copy).unwrap().unwrap());
        let mut store = DatabaseStore::new(db, table());
        let entry = store.load(pipeline).await.unwrap().unwrap();
        // Into a fresh database: every part is written anew.
        let fresh = dir.path().join("fresh.db");
        let db = Database::from(SqliteDatabase::open(&fresh).unwrap());
        db.prepare_state().await.unwrap();
        let mut again = DatabaseStore::new(db, table());
        again.store(pipeline, Some(&entry)).await.unwrap();
        assert_eq!(
            parts(&fresh, pipeline).await,
            parts(&golden(name), pipeline).await,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_destination_table_written_before_versions_is_upgraded_by_prepare() {
    for name in ["v1-mirror-open.db", "v1-resnapshot-complete.db"] {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(name);
        std::fs::copy(golden(name), &copy).unwrap();
        let db = Database::from(SqliteDatabase::open_existing(&copy).unwrap().unwrap());
        let spec = TableSpec {
            key: ["customer", "order_id"]
                .map(|name| KeyColumn {
                    name: name.to_string(),
                    kind: KeyType::S,
                })
                .to_vec(),
            ..table()
        };
        let before = parts(&copy, "orders-mirror").await;
        db.probe(&spec).await.unwrap();
        db.prepare(&spec).await.unwrap();
        let conn = rusqlite::Connection::open(&copy).unwrap();
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('orders') ORDER BY cid")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            columns.ends_with(&[
                "_ddbpipe_version_ms".to_string(),
                "_ddbpipe_version_seq".to_string()
            ]),
            "{name}: {columns:?}"
        );
        assert_eq!(parts(&copy, "orders-mirror").await, before, "{name}");
    }
}
