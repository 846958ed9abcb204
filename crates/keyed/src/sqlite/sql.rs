//! The statements of the rows and the state, built once per table, and binding a row's key to
//! them (see the `sqlite` module docs, "The SQL shape").

use rusqlite::{CachedStatement, Connection, Statement};

use crate::sql::{
    DELETED_TABLE, KeyMisfit, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN,
    VERSION_SEQ_COLUMN, Write, key_misfit, key_text, quote, repair_older, row_count,
};
use crate::{KeyValue, TableSpec};

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
    /// A repair's upsert. Parameters: the key values, the document, the repair id,
    /// `updated_at`, the write time. Replaces an older row's document and version; marks the
    /// row with the id either way.
    pub(super) repair_upsert: String,
    /// Parameters: the key values, the delete's time. Deletes the row when it is older.
    pub(super) repair_delete: String,
    /// Parameters: the key values, the repair id. Marks the row (a newer one the delete kept).
    pub(super) repair_mark: String,
}

impl TableSql {
    pub(super) fn new(spec: &TableSpec) -> Self {
        let table = quote(&spec.table);
        let deleted = quote(DELETED_TABLE);
        let doc = quote(spec.document_name());
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

/// `SELECT count(*)` of an existing table.
pub(super) fn count(conn: &Connection, table: &str) -> rusqlite::Result<u64> {
    let n: i64 = conn.query_row(
        &format!("SELECT count(*) FROM {}", quote(table)),
        [],
        |row| row.get(0),
    )?;
    Ok(row_count(n))
}
