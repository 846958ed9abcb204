//! Golden sink databases (`crates/pipeline/tests/golden/README.md`): the state parts every sink database
//! ddbpipe has written are read, and written back part for part, byte-identically.

// A failed unwrap in a test is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddbpipe_keyed::state::DatabaseStore;
use ddbpipe_keyed::{Database, DocumentType, SqliteDatabase, TableSpec};
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pipeline/tests/golden")
        .join(name)
}

fn table() -> TableSpec {
    TableSpec {
        table: "orders".into(),
        schema: "main".into(),
        key: vec![],
        document_column: "document".into(),
        document_type: DocumentType::Jsonb,
        create_table: true,
    }
}

/// The stored parts of `pipeline` in the SQLite file at `path`: `part → value`.
async fn parts(path: &Path, pipeline: &str) -> BTreeMap<String, String> {
    let db = SqliteDatabase::open_existing(path).unwrap().unwrap();
    Database::Sqlite(db).load_state(pipeline).await.unwrap()
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
        let db = Database::Sqlite(SqliteDatabase::open_existing(&copy).unwrap().unwrap());
        let mut store = DatabaseStore::new(db, table());
        let entry = store.load(pipeline).await.unwrap().unwrap();
        // Into a fresh database: every part is written anew.
        let fresh = dir.path().join("fresh.db");
        let db = Database::Sqlite(SqliteDatabase::open(&fresh).unwrap());
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
