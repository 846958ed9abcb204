//! The pipeline's entry in the sink's database: a [`CheckpointStore`] whose batches commit
//! with their rows (docs/state.md §6.5).
//!
//! # Parts (docs/state.md §6.5)
//! In a database the entry is split into rows of `_ddbpipe_state`: `segment:<i>` holds the
//! cursor of segment `i` (of a scan position, or of an open snapshot), `shard:<id>` holds a
//! shard's entry (`{"position", "verified_at"?, "latest_floor_ms"?, "read_at"?}`), and `meta`
//! holds the rest (an open repair's file cursors included: a repair is small).
//! So a batch that advances two shards rewrites two small rows, not the whole entry. Reading
//! assembles the parts into the same document as a state-file entry and checks it as strictly.
//!
//! # Sharing
//! The store and the [`KeyedSink`](crate::sink::KeyedSink) writing the batches share what was
//! last written ([`DatabaseStore`] clones share it): the sink commits a batch's changed parts,
//! the store's own writes then start from them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use ddbpipe_pipeline::checkpoint::store::{
    Ceiling, CheckpointStore, RepairSweep, SnapshotClose, SnapshotClosed, Unseen, WithRows,
};
use ddbpipe_pipeline::state::{Entry, StateError};
use ddbpipe_source::position::{PositionParts, put_parts, take_parts};
use futures_util::future::BoxFuture;
use serde_json::Value as Json;

use crate::{CloseSnapshot, Database, StateWrite, TableSpec};

/// The part holding everything that is not a segment cursor or a shard entry.
const META: &str = "meta";
/// The prefix of a segment cursor's part.
const SEGMENT: &str = "segment:";
/// The prefix of a shard entry's part.
const SHARD: &str = "shard:";

/// The state parts of one pipeline in a sink database, and what was last written there.
/// Clones share what was written (see the module docs).
#[derive(Debug, Clone)]
pub struct DatabaseStore {
    db: Database,
    table: TableSpec,
    /// The parts as last read or written (canonical JSON text), to write only changed ones.
    written: Arc<Mutex<BTreeMap<String, String>>>,
}

/// Another pipeline whose position in `db` is of rows it writes into `table` (its `meta`
/// part's `identity.sink_table`; docs/state.md §6.5): a run of `pipeline` writing there too
/// would mix its rows with that pipeline's, each deleting and overwriting the other's. Table
/// names compare as the database does ([`Database::same_name`]). Only the `meta` parts are
/// read; one that does not read names no table.
pub async fn other_writer(
    db: &Database,
    table: &TableSpec,
    pipeline: &str,
) -> Result<Option<String>, crate::DbError> {
    let writes = |meta: &str| {
        let meta = serde_json::from_str::<Json>(meta).ok()?;
        let name = meta.pointer("/identity/sink_table")?.as_str()?;
        Some(db.same_name(name, &table.table))
    };
    let mut metas = db.stored_part(META).await?.into_iter();
    Ok(metas.find_map(|(other, meta)| {
        (other != pipeline && writes(&meta) == Some(true)).then_some(other)
    }))
}

impl DatabaseStore {
    /// The store in `db`, beside the destination `table` (whose snapshot rows it cleans up).
    pub fn new(db: Database, table: TableSpec) -> Self {
        DatabaseStore {
            db,
            table,
            written: Arc::default(),
        }
    }

    /// The database.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// The destination table.
    pub fn table(&self) -> &TableSpec {
        &self.table
    }

    fn error(&self, message: String) -> StateError {
        StateError::Database {
            store: self.db.describe(),
            message,
        }
    }

    fn written_parts(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn load(&self, pipeline: &str) -> Result<Option<Entry>, StateError> {
        let raw = self
            .db
            .load_state(pipeline)
            .await
            .map_err(|e| self.error(e.message))?;
        let where_ = PathBuf::from(self.db.describe());
        let mut parts = BTreeMap::new();
        for (part, text) in raw {
            let value: Json = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                path: where_.clone(),
                location: format!("pipeline '{pipeline}' at _ddbpipe_state part '{part}'"),
                problem: format!("not JSON: {e}"),
            })?;
            parts.insert(part, value);
        }
        if parts.is_empty() {
            self.written_parts().clear();
            return Ok(None);
        }
        let entry = assemble(&parts).map_err(|problem| StateError::Corrupt {
            path: where_.clone(),
            location: format!("pipeline '{pipeline}' in _ddbpipe_state"),
            problem,
        })?;
        let entry = Entry::from_json(&entry, pipeline, &where_)?;
        *self.written_parts() = parts
            .into_iter()
            .map(|(part, value)| (part, value.to_string()))
            .collect();
        Ok(Some(entry))
    }

    async fn store(&self, pipeline: &str, entry: Option<&Entry>) -> Result<(), StateError> {
        let (write, parts) = self.changes(pipeline, entry);
        if !write.is_empty() {
            self.db
                .store_state(&write)
                .await
                .map_err(|e| self.error(e.message))?;
        }
        self.written(parts);
        Ok(())
    }

    async fn close(
        &self,
        pipeline: &str,
        close: SnapshotClose,
        entry: &Entry,
    ) -> Result<SnapshotClosed, StateError> {
        let (write, parts) = self.changes(pipeline, Some(entry));
        let close = CloseSnapshot {
            id: close.id,
            delete_unseen: close.unseen == Unseen::Delete,
            max_keys: close.max_keys,
        };
        let closed = self
            .db
            .close_snapshot(&self.table, close, &write)
            .await
            .map_err(|e| self.error(e.message))?;
        self.written(parts);
        Ok(SnapshotClosed {
            keys_written: closed.keys_written,
            deleted: closed.deleted,
            ceiling: if closed.ceiling_hit {
                Ceiling::Hit
            } else {
                Ceiling::Kept
            },
        })
    }

    async fn close_repair(
        &self,
        pipeline: &str,
        sweep: RepairSweep,
        entry: &Entry,
    ) -> Result<u64, StateError> {
        let (write, parts) = self.changes(pipeline, Some(entry));
        let deleted = self
            .db
            .close_repair_window(&self.table, sweep, &write)
            .await
            .map_err(|e| self.error(e.message))?;
        self.written(parts);
        Ok(deleted)
    }

    /// The parts `entry` consists of, and the write that turns what is stored into them.
    pub fn changes(
        &self,
        pipeline: &str,
        entry: Option<&Entry>,
    ) -> (StateWrite, BTreeMap<String, String>) {
        let parts: BTreeMap<String, String> = match entry {
            Some(entry) => split(&entry.to_json())
                .into_iter()
                .map(|(part, value)| (part, value.to_string()))
                .collect(),
            None => BTreeMap::new(),
        };
        let written = self.written_parts();
        let upserts = parts
            .iter()
            .filter(|(part, text)| written.get(*part) != Some(text))
            .map(|(part, text)| (part.clone(), text.clone()))
            .collect();
        let deletes = written
            .keys()
            .filter(|part| !parts.contains_key(*part))
            .cloned()
            .collect();
        let write = StateWrite {
            pipeline: pipeline.to_string(),
            upserts,
            deletes,
            updated_at: entry.map_or_else(ddbpipe_pipeline::checkpoint::now_rfc3339, |e| {
                e.updated_at.clone()
            }),
            fences: Vec::new(),
            snapshot: None,
            record_of: None,
        };
        (write, parts)
    }

    /// Records parts as written (after a sink transaction committed them).
    pub fn written(&self, parts: BTreeMap<String, String>) {
        *self.written_parts() = parts;
    }
}

impl CheckpointStore for DatabaseStore {
    fn describe(&self) -> String {
        self.db.describe()
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
        Box::pin(DatabaseStore::load(self, pipeline))
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(DatabaseStore::store(self, pipeline, entry))
    }

    fn with_rows(&self) -> Option<&dyn WithRows> {
        Some(self)
    }
}

/// The position lives with the rows: a snapshot's cleanup and a repair window's deletes commit
/// with the entry.
impl WithRows for DatabaseStore {
    fn destination_rows(&self) -> BoxFuture<'_, Result<u64, StateError>> {
        Box::pin(async move {
            self.db
                .count_rows(&self.table)
                .await
                .map_err(|e| self.error(e.message))
        })
    }

    fn close_snapshot<'a>(
        &'a self,
        pipeline: &'a str,
        close: SnapshotClose,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<SnapshotClosed, StateError>> {
        Box::pin(self.close(pipeline, close, entry))
    }

    fn close_repair_window<'a>(
        &'a self,
        pipeline: &'a str,
        sweep: RepairSweep,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<u64, StateError>> {
        Box::pin(self.close_repair(pipeline, sweep, entry))
    }
}

/// Splits an entry document into parts (see the module docs).
pub fn split(entry: &Json) -> BTreeMap<String, Json> {
    let mut parts = BTreeMap::new();
    let mut meta = entry.clone();
    if let Some(position) = meta.get_mut("position").and_then(Json::as_object_mut) {
        let taken = take_parts(position);
        for (segment, cursor) in taken.segments {
            parts.insert(format!("{SEGMENT}{segment}"), cursor);
        }
        for (id, shard) in taken.shards {
            parts.insert(format!("{SHARD}{id}"), shard);
        }
    }
    parts.insert(META.into(), meta);
    parts
}

/// Assembles parts into an entry document; the inverse of [`split`].
pub fn assemble(parts: &BTreeMap<String, Json>) -> Result<Json, String> {
    let mut entry = parts
        .get(META)
        .cloned()
        .ok_or("the 'meta' part is missing")?;
    let mut taken = PositionParts::default();
    for (part, value) in parts {
        if let Some(segment) = part.strip_prefix(SEGMENT) {
            taken.segments.insert(segment.to_string(), value.clone());
        } else if let Some(id) = part.strip_prefix(SHARD) {
            taken.shards.insert(id.to_string(), value.clone());
        } else if part != META {
            return Err(format!("unknown part '{part}'"));
        }
    }
    match entry.get_mut("position").and_then(Json::as_object_mut) {
        Some(position) => put_parts(position, taken)?,
        None if taken.is_empty() => {}
        None => return Err("segment or shard parts without a position".into()),
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(entry: Json) {
        let parts = split(&entry);
        assert_eq!(assemble(&parts).unwrap(), entry, "parts: {parts:?}");
    }

    #[test]
    fn a_scan_entry_splits_into_meta_and_segment_parts_and_back() {
        let entry = json!({"fingerprint": "sha256:x", "identity": {"table_name": "t"},
            "last_completed": null, "updated_at": "2026-01-01T00:00:00.000Z",
            "position": {"cursors": {"3": {"pk": {"S": "k17"}}, "5": {"pk": {"N": "1"}}},
                "done": [[0, 2]], "kind": "scan", "total_segments": 8}});
        let parts = split(&entry);
        assert_eq!(parts["segment:3"], json!({"pk": {"S": "k17"}}));
        assert!(parts["meta"]["position"].get("cursors").is_none());
        round_trip(entry);
    }

    #[test]
    fn an_export_entry_keeps_its_arn_and_its_files_as_segment_parts() {
        let entry = json!({"fingerprint": "sha256:x", "identity": {"table_name": "t"},
            "last_completed": null, "updated_at": "2026-01-01T00:00:00.000Z",
            "position": {"cursors": {"2": {"lines": {"N": "1000"}}}, "done": [[0, 1]],
                "export_arn": "arn:aws:dynamodb:us-east-1:1:table/t/export/01-a", "kind": "export",
                "total_segments": 0}});
        let parts = split(&entry);
        assert_eq!(parts["segment:2"], json!({"lines": {"N": "1000"}}));
        round_trip(entry);
    }

    #[test]
    fn a_streams_entry_keeps_each_shard_with_its_verification_and_floor() {
        let entry = json!({"fingerprint": "sha256:x", "identity": {}, "last_completed": null,
            "updated_at": "t", "position": {"finished": ["s0"], "kind": "mirror",
            "latest_floor_ms": {"s2": 5}, "shards": {"s1": "49", "s2": ""},
            "snapshot": {"cursors": {"1": {"pk": {"S": "a"}}}, "done": [], "id": 7},
            "stream_arn": "arn", "verified_at": {"s0": 9, "s2": 10}}});
        let parts = split(&entry);
        assert_eq!(
            parts["shard:s2"],
            json!({"latest_floor_ms": 5, "position": "", "verified_at": 10})
        );
        assert_eq!(parts["shard:s1"], json!({"position": "49"}));
        // A finished shard's frontier stays in meta.
        assert_eq!(parts["meta"]["position"]["verified_at"], json!({"s0": 9}));
        assert_eq!(parts["segment:1"], json!({"pk": {"S": "a"}}));
        round_trip(entry);
    }

    #[test]
    fn an_entry_without_position_is_only_meta() {
        let entry = json!({"fingerprint": "f", "identity": {}, "last_completed": {"items": 1},
            "position": null, "updated_at": "t"});
        assert_eq!(split(&entry).len(), 1);
        round_trip(entry);
    }

    /// A streams entry of pipeline `p` at `updated_at` whose shards are at `shards`.
    fn streams_entry(updated_at: &str, shards: Json) -> Entry {
        Entry::from_json(
            &json!({"fingerprint": ddbpipe_pipeline::state::identity::Identity::from_json(json!({})).fingerprint(),
                "identity": {}, "last_completed": null, "updated_at": updated_at,
                "position": {"finished": [], "kind": "streams", "latest_floor_ms": {},
                    "shards": shards, "snapshot": null, "stream_arn": "arn",
                    "verified_at": {}}}),
            "p",
            std::path::Path::new("s.db"),
        )
        .unwrap()
    }

    /// The destination of the stores of these tests (only its name matters).
    fn state_table() -> TableSpec {
        TableSpec {
            table: "t".into(),
            schema: "main".into(),
            key: vec![],
            document_column: Some("document".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        }
    }

    /// docs/state.md §6.5: a write carries only the parts that changed, and deletes parts that are gone.
    #[test]
    fn only_changed_parts_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::SqliteDatabase::open(&dir.path().join("s.db")).unwrap();
        let table = state_table();
        let store = DatabaseStore::new(Database::from(db), table);
        let entry = |shards: Json| streams_entry("t", shards);
        let first = entry(json!({"s1": "100000000000000000001", "s2": "100000000000000000002"}));
        let (write, parts) = store.changes("p", Some(&first));
        let names: Vec<&str> = write.upserts.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["meta", "shard:s1", "shard:s2"]);
        store.written(parts);

        let second = entry(json!({"s1": "100000000000000000009"}));
        let (write, _) = store.changes("p", Some(&second));
        let names: Vec<&str> = write.upserts.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["shard:s1"], "meta and s2 did not change");
        assert_eq!(write.deletes, ["shard:s2"]);
    }

    #[test]
    fn unknown_or_orphan_parts_are_reported() {
        let mut parts = BTreeMap::new();
        parts.insert("meta".to_string(), json!({"position": null}));
        parts.insert("shard:s1".to_string(), json!({"position": "1"}));
        assert!(assemble(&parts).unwrap_err().contains("without a position"));
        parts.insert("bogus".to_string(), json!(1));
        assert!(
            assemble(&parts)
                .unwrap_err()
                .contains("unknown part 'bogus'")
        );
        assert!(assemble(&BTreeMap::new()).unwrap_err().contains("meta"));
    }
}
