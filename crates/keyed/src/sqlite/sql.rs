//! The statements of the rows and the state, built once per table, and binding a row's key to
//! them (see the `sqlite` module docs, "The SQL shape").

use rusqlite::{CachedStatement, Connection, Statement};

use crate::sql::{
    DELETED_TABLE, KeyMisfit, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN,
    VERSION_SEQ_COLUMN, Write, key_misfit, key_text, quote, repair_older, row_count,
};
use crate::{KeyValue, StateWrite, TableSpec};

const UPSERT_STATE_SQL: &str = "INSERT INTO \"_ddbpipe_state\" (pipeline, part, value, updated_at) \
     VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (pipeline, part) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE_STATE_SQL: &str = "DELETE FROM \"_ddbpipe_state\" WHERE pipeline = ?1 AND part = ?2";
/// Advances a lease fence unless a newer owner's counter is stored (docs/coordination.md §11.7
/// rule 4): no row changed means refused.
const FENCE_SQL: &str = "INSERT INTO \"_ddbpipe_fences\" (pipeline, unit, counter, position) \
     VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (pipeline, unit) DO UPDATE SET counter = excluded.counter, \
     position = COALESCE(excluded.position, \"_ddbpipe_fences\".position) \
     WHERE \"_ddbpipe_fences\".counter <= excluded.counter";
/// The position stored with a fence.
pub(super) const FENCE_POSITION_SQL: &str =
    "SELECT position FROM \"_ddbpipe_fences\" WHERE pipeline = ?1 AND unit = ?2";
const FENCE_STORED_SQL: &str =
    "SELECT counter FROM \"_ddbpipe_fences\" WHERE pipeline = ?1 AND unit = ?2";

/// The statements of one destination table.
pub(super) struct TableSql {
    /// The spec they were built for (a different spec under the same name rebuilds them).
    pub(super) spec: TableSpec,
    /// Parameters: the key values, the document, the marker (bound null), `updated_at`, the
    /// version's time and sequence. The marker is not updated on conflict.
    pub(super) upsert_change: String,
    /// As `upsert_change`, the marker bound to the snapshot id and updated on conflict.
    pub(super) upsert_marked: String,
    /// Parameters: the key values, the document, the snapshot id, `updated_at`, the read time,
    /// the cutoff, the table name and the key text (`crate::sql::key_text`). Writes nothing
    /// when a deleted-key marker or a stream-written row of this snapshot is newer than the
    /// cutoff (a null time counts as newer).
    pub(super) upsert_unless_newer: String,
    /// Parameters: the key values.
    pub(super) delete: String,
    /// Parameters: the table name, the key text, the delete's time. Keeps the newer time of
    /// two markers of a key (null, unknown, counts as the newest).
    pub(super) mark_deleted: String,
    /// Parameter: the snapshot id.
    pub(super) count_marked: String,
    /// Parameter: the snapshot id.
    pub(super) delete_unmarked: String,
    /// Parameter: the table name.
    pub(super) drop_deleted_marks: String,
    /// A repair's upsert. Parameters: the key values, the document, the repair id,
    /// `updated_at`, the write time. Replaces an older row's document and version; marks the
    /// row with the id either way.
    pub(super) repair_upsert: String,
    /// Parameters: the key values, the delete's time. Deletes the row when it is older.
    pub(super) repair_delete: String,
    /// Parameters: the key values, the repair id. Marks the row (a newer one the delete kept).
    pub(super) repair_mark: String,
    /// Parameters: the repair id, the window's start and end. Deletes the rows a stream change
    /// wrote inside the window that the repair did not mark.
    pub(super) repair_sweep: String,
}

impl TableSql {
    pub(super) fn new(spec: &TableSpec) -> Self {
        let table = quote(&spec.table);
        let deleted = quote(DELETED_TABLE);
        let doc = quote(&spec.document_column);
        let marker = quote(SNAPSHOT_COLUMN);
        let updated = quote(UPDATED_AT_COLUMN);
        let version_ms = quote(VERSION_MS_COLUMN);
        let version_seq = quote(VERSION_SEQ_COLUMN);
        let keys: Vec<String> = spec.key.iter().map(|k| quote(&k.name)).collect();
        let n = keys.len();
        let key_list = keys.join(", ");
        let params = |count: usize| {
            (1..=count)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let columns =
            format!("{key_list}, {doc}, {marker}, {updated}, {version_ms}, {version_seq}");
        let set = format!(
            "{doc} = excluded.{doc}, {updated} = excluded.{updated}, \
             {version_ms} = excluded.{version_ms}, {version_seq} = excluded.{version_seq}"
        );
        let insert = format!(
            "INSERT INTO {table} ({columns}) VALUES ({}) ON CONFLICT ({key_list}) DO UPDATE SET {set}",
            params(n + 5)
        );
        let cutoff = format!("?{}", n + 5);
        let unless_newer = format!(
            "INSERT INTO {table} ({columns}) SELECT {}, NULL \
             WHERE NOT EXISTS (SELECT 1 FROM {deleted} WHERE table_name = ?{} AND key_text = ?{} \
             AND (version_ms IS NULL OR version_ms > {cutoff})) \
             ON CONFLICT ({key_list}) DO UPDATE SET {set}, {marker} = excluded.{marker} \
             WHERE NOT ({table}.{marker} IS excluded.{marker} AND {table}.{version_seq} IS NOT NULL \
             AND ({table}.{version_ms} IS NULL OR {table}.{version_ms} > {cutoff}))",
            params(n + 4),
            n + 6,
            n + 7
        );
        let where_key = keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ?{}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        let older = |written: &str| repair_older(&table, written);
        let keep = |column: &str| {
            format!(
                "{column} = CASE WHEN {} THEN excluded.{column} ELSE {table}.{column} END",
                older(&format!("excluded.{version_ms}"))
            )
        };
        let repair_upsert = format!(
            "INSERT INTO {table} ({columns}) VALUES ({}, NULL) ON CONFLICT ({key_list}) DO UPDATE SET \
             {}, {}, {}, {}, {marker} = excluded.{marker}",
            params(n + 4),
            keep(&doc),
            keep(&updated),
            keep(&version_seq),
            keep(&version_ms),
        );
        TableSql {
            repair_delete: format!(
                "DELETE FROM {table} WHERE {where_key} AND {}",
                older(&format!("?{}", n + 1))
            ),
            repair_mark: format!("UPDATE {table} SET {marker} = ?{} WHERE {where_key}", n + 1),
            repair_sweep: format!(
                "DELETE FROM {table} WHERE {version_seq} IS NOT NULL AND {version_ms} >= ?2 \
                 AND {version_ms} < ?3 AND ({marker} IS NULL OR {marker} <> ?1)"
            ),
            repair_upsert,
            spec: spec.clone(),
            upsert_marked: format!("{insert}, {marker} = excluded.{marker}"),
            upsert_change: insert,
            upsert_unless_newer: unless_newer,
            delete: format!("DELETE FROM {table} WHERE {where_key}"),
            // SQLite's max() of two values is null when either is.
            mark_deleted: format!(
                "INSERT INTO {deleted} (table_name, key_text, version_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (table_name, key_text) DO UPDATE SET \
                 version_ms = max(version_ms, excluded.version_ms)"
            ),
            count_marked: format!("SELECT count(*) FROM {table} WHERE {marker} = ?1"),
            delete_unmarked: format!(
                "DELETE FROM {table} WHERE {marker} IS NULL OR {marker} <> ?1"
            ),
            drop_deleted_marks: format!("DELETE FROM {deleted} WHERE table_name = ?1"),
        }
    }
}

/// The statements of a table in one transaction, each prepared on first use (through the
/// connection's statement cache).
pub(super) struct Statements<'t> {
    tx: &'t Connection,
    sql: &'t TableSql,
    upsert_change: Option<CachedStatement<'t>>,
    upsert_marked: Option<CachedStatement<'t>>,
    upsert_unless_newer: Option<CachedStatement<'t>>,
    delete: Option<CachedStatement<'t>>,
    mark_deleted: Option<CachedStatement<'t>>,
    repair_upsert: Option<CachedStatement<'t>>,
    repair_delete: Option<CachedStatement<'t>>,
    repair_mark: Option<CachedStatement<'t>>,
}

impl<'t> Statements<'t> {
    pub(super) fn new(tx: &'t Connection, sql: &'t TableSql) -> Self {
        Statements {
            tx,
            sql,
            upsert_change: None,
            upsert_marked: None,
            upsert_unless_newer: None,
            delete: None,
            mark_deleted: None,
            repair_upsert: None,
            repair_delete: None,
            repair_mark: None,
        }
    }

    /// Writes one row change of `key` as `write` says (`document` is ignored for deletes).
    pub(super) fn write(
        &mut self,
        spec: &TableSpec,
        key: &[KeyValue],
        document: &str,
        updated_at: &str,
        write: &Write<'_>,
    ) -> rusqlite::Result<()> {
        let (tx, sql) = (self.tx, self.sql);
        let n = key.len();
        match *write {
            Write::Upsert {
                version_ms,
                version_seq,
            } => {
                let stmt = cached(&mut self.upsert_change, tx, &sql.upsert_change)?;
                bind_upsert(stmt, key, document, None, updated_at)?;
                stmt.raw_bind_parameter(n + 4, version_ms)?;
                stmt.raw_bind_parameter(n + 5, version_seq)?;
                stmt.raw_execute().map(drop)
            }
            Write::UpsertMarked {
                id,
                version_ms,
                version_seq,
            } => {
                let stmt = cached(&mut self.upsert_marked, tx, &sql.upsert_marked)?;
                bind_upsert(stmt, key, document, Some(id), updated_at)?;
                stmt.raw_bind_parameter(n + 4, version_ms)?;
                stmt.raw_bind_parameter(n + 5, version_seq)?;
                stmt.raw_execute().map(drop)
            }
            Write::UpsertUnlessNewer {
                id,
                read_ms,
                cutoff_ms,
            } => {
                let stmt = cached(&mut self.upsert_unless_newer, tx, &sql.upsert_unless_newer)?;
                bind_upsert(stmt, key, document, Some(id), updated_at)?;
                stmt.raw_bind_parameter(n + 4, read_ms)?;
                stmt.raw_bind_parameter(n + 5, cutoff_ms)?;
                stmt.raw_bind_parameter(n + 6, spec.table.as_str())?;
                stmt.raw_bind_parameter(n + 7, key_text(key))?;
                stmt.raw_execute().map(drop)
            }
            Write::Delete => self.delete(key),
            Write::DeleteMarked { version_ms } => {
                self.delete(key)?;
                let stmt = cached(&mut self.mark_deleted, tx, &sql.mark_deleted)?;
                stmt.execute((spec.table.as_str(), key_text(key), version_ms))
                    .map(drop)
            }
            Write::RepairUpsert { id, version_ms } => {
                let stmt = cached(&mut self.repair_upsert, tx, &sql.repair_upsert)?;
                bind_upsert(stmt, key, document, Some(id), updated_at)?;
                stmt.raw_bind_parameter(n + 4, version_ms)?;
                stmt.raw_execute().map(drop)
            }
            Write::RepairDelete { id, version_ms } => {
                let stmt = cached(&mut self.repair_delete, tx, &sql.repair_delete)?;
                bind_key(stmt, key)?;
                stmt.raw_bind_parameter(n + 1, version_ms)?;
                stmt.raw_execute()?;
                let stmt = cached(&mut self.repair_mark, tx, &sql.repair_mark)?;
                bind_key(stmt, key)?;
                stmt.raw_bind_parameter(n + 1, id)?;
                stmt.raw_execute().map(drop)
            }
        }
    }

    fn delete(&mut self, key: &[KeyValue]) -> rusqlite::Result<()> {
        let stmt = cached(&mut self.delete, self.tx, &self.sql.delete)?;
        bind_key(stmt, key)?;
        stmt.raw_execute().map(drop)
    }
}

/// The statement in `slot`, prepared (through the cache) when it is not yet.
fn cached<'s, 't>(
    slot: &'s mut Option<CachedStatement<'t>>,
    tx: &'t Connection,
    sql: &str,
) -> rusqlite::Result<&'s mut CachedStatement<'t>> {
    match slot {
        Some(stmt) => Ok(stmt),
        None => Ok(slot.insert(tx.prepare_cached(sql)?)),
    }
}

/// Binds the key values, the document, the marker and `updated_at` (parameters `1..=n + 3`).
fn bind_upsert(
    stmt: &mut Statement<'_>,
    key: &[KeyValue],
    document: &str,
    marker: Option<i64>,
    updated_at: &str,
) -> rusqlite::Result<()> {
    let n = key.len();
    bind_key(stmt, key)?;
    stmt.raw_bind_parameter(n + 1, document)?;
    stmt.raw_bind_parameter(n + 2, marker)?;
    stmt.raw_bind_parameter(n + 3, updated_at)
}

/// Checks a row's key against the key columns.
pub(super) fn check_key(spec: &TableSpec, index: usize, key: &[KeyValue]) -> Result<(), String> {
    match key_misfit(spec, key) {
        None => Ok(()),
        Some(KeyMisfit::Count) => Err(format!(
            "change {index} has {} key value(s) but the table has {} key column(s)",
            key.len(),
            spec.key.len()
        )),
        Some(KeyMisfit::Type { found, column }) => Err(format!(
            "change {index} has a {} value for the key column '{}' of type {}",
            found.tag(),
            column.name,
            column.kind.tag()
        )),
    }
}

/// Binds the key values to parameters `1..=key.len()`: S and N as TEXT, B as BLOB.
fn bind_key(stmt: &mut Statement<'_>, key: &[KeyValue]) -> rusqlite::Result<()> {
    for (i, value) in key.iter().enumerate() {
        match value {
            KeyValue::S(text) | KeyValue::N(text) => {
                stmt.raw_bind_parameter(i + 1, text.as_str())?
            }
            KeyValue::B(bytes) => stmt.raw_bind_parameter(i + 1, bytes.as_slice())?,
        }
    }
    Ok(())
}

/// What refused a transaction.
pub(super) enum Refused<'a> {
    /// A lease fence: the unit, the counter held, the counter stored.
    Fence {
        unit: &'a str,
        held: u64,
        stored: i64,
    },
    /// The shared snapshot record, and why.
    Snapshot(String),
}

/// The shared snapshot record (`crate::SNAPSHOT_UNIT`): its counter and JSON.
const SNAPSHOT_RECORD_SQL: &str =
    "SELECT counter, position FROM \"_ddbpipe_fences\" WHERE pipeline = ?1 AND unit = ?2";
/// Stores a shared snapshot record unless one is stored.
pub(super) const OPEN_SNAPSHOT_SQL: &str = "INSERT INTO \"_ddbpipe_fences\" (pipeline, unit, counter, position) \
     VALUES (?1, ?2, 0, ?3) ON CONFLICT (pipeline, unit) DO NOTHING";
/// Marks the shared snapshot record closed.
const CLOSE_SNAPSHOT_SQL: &str = "UPDATE \"_ddbpipe_fences\" SET counter = 1, position = ?3 \
     WHERE pipeline = ?1 AND unit = ?2";

/// The pipeline's shared snapshot record: its counter and JSON, `None` when none is stored.
pub(super) fn snapshot_record(
    conn: &Connection,
    pipeline: &str,
) -> rusqlite::Result<Option<(i64, Option<String>)>> {
    use rusqlite::OptionalExtension as _;
    conn.prepare_cached(SNAPSHOT_RECORD_SQL)?
        .query_row((pipeline, crate::SNAPSHOT_UNIT), |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()
}

/// Passes the shared snapshot guard and the fences of `state` in the open transaction; the
/// first that refuses is returned (the caller rolls back). The transaction holds SQLite's write
/// lock, so nothing changes the record before its commit.
pub(super) fn pass_fences<'a>(
    conn: &Connection,
    state: &'a StateWrite,
) -> rusqlite::Result<Option<Refused<'a>>> {
    if let Some(guard) = &state.snapshot {
        let stored = snapshot_record(conn, &state.pipeline)?;
        if let Some(why) = guard.refusal(
            stored
                .as_ref()
                .map(|(counter, text)| (*counter, text.as_deref())),
        ) {
            return Ok(Some(Refused::Snapshot(why)));
        }
        if let crate::SnapshotGuard::Close { record, .. } = guard {
            conn.prepare_cached(CLOSE_SNAPSHOT_SQL)?.execute((
                &state.pipeline,
                crate::SNAPSHOT_UNIT,
                record,
            ))?;
        }
    }
    if state.fences.is_empty() {
        return Ok(None);
    }
    let mut fence = conn.prepare_cached(FENCE_SQL)?;
    for write in &state.fences {
        let counter_value = i64::try_from(write.counter).unwrap_or(i64::MAX);
        let unit = &write.unit;
        if fence.execute((&state.pipeline, unit, counter_value, &write.position))? == 0 {
            let stored: i64 =
                conn.query_row(FENCE_STORED_SQL, (&state.pipeline, unit), |row| row.get(0))?;
            return Ok(Some(Refused::Fence {
                unit,
                held: write.counter,
                stored,
            }));
        }
    }
    Ok(None)
}

/// Upserts and deletes the state parts (nothing when `state` is empty).
pub(super) fn write_state(conn: &Connection, state: &StateWrite) -> rusqlite::Result<()> {
    if state.is_empty() {
        return Ok(());
    }
    if !state.upserts.is_empty() {
        let mut upsert = conn.prepare_cached(UPSERT_STATE_SQL)?;
        for (part, value) in &state.upserts {
            upsert.execute((&state.pipeline, part, value, &state.updated_at))?;
        }
    }
    if !state.deletes.is_empty() {
        let mut delete = conn.prepare_cached(DELETE_STATE_SQL)?;
        for part in &state.deletes {
            delete.execute((&state.pipeline, part))?;
        }
    }
    Ok(())
}

/// `SELECT count(*)` of an existing table.
pub(super) fn count(conn: &Connection, table: &str) -> rusqlite::Result<u64> {
    let n: i64 = conn.query_row(
        &format!("SELECT count(*) FROM {}", quote(table)),
        [],
        |row| row.get(0),
    )?;
    Ok(row_count(n))
}
