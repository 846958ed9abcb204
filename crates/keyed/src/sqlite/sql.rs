//! The statements of the rows and the state, built once per table, and binding a row's key to
//! them (see the `sqlite` module docs, "The SQL shape").

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{CachedStatement, Connection, Statement};

use crate::sql::{
    DELETED_TABLE, KeyMisfit, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN,
    VERSION_SEQ_COLUMN, Write, key_misfit, key_text, quote, repair_older, row_count, value_columns,
};
use crate::{ColumnValue, KeyValue, TableSpec};

/// The statements of one destination table.
pub(super) struct TableSql {
    /// The spec they were built for (a different spec under the same name rebuilds them).
    pub(super) spec: TableSpec,
    /// Parameters: the key values, the values (the document when the table keeps one, then
    /// the typed columns), the marker (bound null), `updated_at`, the version's time and
    /// sequence. The marker is not updated on conflict.
    pub(super) upsert_change: String,
    /// As `upsert_change`, the marker bound to the snapshot id and updated on conflict.
    pub(super) upsert_marked: String,
    /// Parameters: the key values, the values, the snapshot id, `updated_at`, the read time,
    /// the cutoff, the table name and the key text (`crate::sql::key_text`). Writes nothing
    /// when a deleted-key marker or a stream-written row of this snapshot is newer than the
    /// cutoff (a null time counts as newer).
    pub(super) upsert_unless_newer: String,
    /// Parameters: the key values.
    pub(super) delete: String,
    /// Parameters: the table name, the key text, the delete's time. Keeps the newer time of
    /// two markers of a key (null, unknown, counts as the newest).
    pub(super) mark_deleted: String,
    /// A repair's upsert. Parameters: the key values, the values, the repair id,
    /// `updated_at`, the write time. Replaces an older row's values and version; marks the
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
        let values: Vec<String> = value_columns(spec).into_iter().map(quote).collect();
        let marker = quote(SNAPSHOT_COLUMN);
        let updated = quote(UPDATED_AT_COLUMN);
        let version_ms = quote(VERSION_MS_COLUMN);
        let version_seq = quote(VERSION_SEQ_COLUMN);
        let keys: Vec<String> = spec.key.iter().map(|k| quote(&k.name)).collect();
        let n = keys.len();
        // The parameters after the values: `m + 1` is the marker.
        let m = n + values.len();
        let key_list = keys.join(", ");
        let params = |count: usize| {
            (1..=count)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let columns: Vec<&str> = keys
            .iter()
            .chain(&values)
            .map(String::as_str)
            .chain([&*marker, &updated, &version_ms, &version_seq])
            .collect();
        let columns = columns.join(", ");
        let set: Vec<String> = values
            .iter()
            .chain([&updated, &version_ms, &version_seq])
            .map(|column| format!("{column} = excluded.{column}"))
            .collect();
        let set = set.join(", ");
        let insert = format!(
            "INSERT INTO {table} ({columns}) VALUES ({}) ON CONFLICT ({key_list}) DO UPDATE SET {set}",
            params(m + 4)
        );
        let cutoff = format!("?{}", m + 4);
        let unless_newer = format!(
            "INSERT INTO {table} ({columns}) SELECT {}, NULL \
             WHERE NOT EXISTS (SELECT 1 FROM {deleted} WHERE table_name = ?{} AND key_text = ?{} \
             AND (version_ms IS NULL OR version_ms > {cutoff})) \
             ON CONFLICT ({key_list}) DO UPDATE SET {set}, {marker} = excluded.{marker} \
             WHERE NOT ({table}.{marker} IS excluded.{marker} AND {table}.{version_seq} IS NOT NULL \
             AND ({table}.{version_ms} IS NULL OR {table}.{version_ms} > {cutoff}))",
            params(m + 3),
            m + 5,
            m + 6
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
        let kept: Vec<String> = values
            .iter()
            .chain([&updated, &version_seq, &version_ms])
            .map(|column| keep(column))
            .collect();
        let repair_upsert = format!(
            "INSERT INTO {table} ({columns}) VALUES ({}, NULL) ON CONFLICT ({key_list}) DO UPDATE SET \
             {}, {marker} = excluded.{marker}",
            params(m + 3),
            kept.join(", "),
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

    /// Writes one row change of `key` as `write` says (`values` are ignored for deletes).
    pub(super) fn write(
        &mut self,
        spec: &TableSpec,
        key: &[KeyValue],
        values: &RowValues<'_>,
        updated_at: &str,
        write: &Write<'_>,
    ) -> rusqlite::Result<()> {
        let (tx, sql) = (self.tx, self.sql);
        // The parameters after the key and the values (`m + 1`: the marker).
        let m = key.len() + values.len(spec);
        match *write {
            Write::Upsert {
                version_ms,
                version_seq,
            } => {
                let stmt = cached(&mut self.upsert_change, tx, &sql.upsert_change)?;
                bind_upsert(stmt, spec, key, values, None, updated_at)?;
                stmt.raw_bind_parameter(m + 3, version_ms)?;
                stmt.raw_bind_parameter(m + 4, version_seq)?;
                stmt.raw_execute().map(drop)
            }
            Write::UpsertMarked {
                id,
                version_ms,
                version_seq,
            } => {
                let stmt = cached(&mut self.upsert_marked, tx, &sql.upsert_marked)?;
                bind_upsert(stmt, spec, key, values, Some(id), updated_at)?;
                stmt.raw_bind_parameter(m + 3, version_ms)?;
                stmt.raw_bind_parameter(m + 4, version_seq)?;
                stmt.raw_execute().map(drop)
            }
            Write::UpsertUnlessNewer {
                id,
                read_ms,
                cutoff_ms,
            } => {
                let stmt = cached(&mut self.upsert_unless_newer, tx, &sql.upsert_unless_newer)?;
                bind_upsert(stmt, spec, key, values, Some(id), updated_at)?;
                stmt.raw_bind_parameter(m + 3, read_ms)?;
                stmt.raw_bind_parameter(m + 4, cutoff_ms)?;
                stmt.raw_bind_parameter(m + 5, spec.table.as_str())?;
                stmt.raw_bind_parameter(m + 6, key_text(key))?;
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
                bind_upsert(stmt, spec, key, values, Some(id), updated_at)?;
                stmt.raw_bind_parameter(m + 3, version_ms)?;
                stmt.raw_execute().map(drop)
            }
            Write::RepairDelete { id, version_ms } => {
                let stmt = cached(&mut self.repair_delete, tx, &sql.repair_delete)?;
                bind_key(stmt, key)?;
                stmt.raw_bind_parameter(key.len() + 1, version_ms)?;
                stmt.raw_execute()?;
                let stmt = cached(&mut self.repair_mark, tx, &sql.repair_mark)?;
                bind_key(stmt, key)?;
                stmt.raw_bind_parameter(key.len() + 1, id)?;
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

/// The values an upsert writes after its key: the document, then the typed columns.
pub(super) struct RowValues<'r> {
    /// The document (bound only when the table keeps one).
    pub(super) document: &'r str,
    /// The typed columns' values, in the spec's order.
    pub(super) columns: &'r [ColumnValue],
}

impl RowValues<'_> {
    /// The parameters they take in `spec`'s statements.
    fn len(&self, spec: &TableSpec) -> usize {
        usize::from(spec.document_column.is_some()) + self.columns.len()
    }
}

/// Binds the key values, the values, the marker and `updated_at` (parameters `1..=m + 2`, `m`
/// being the key's and the values' count).
fn bind_upsert(
    stmt: &mut Statement<'_>,
    spec: &TableSpec,
    key: &[KeyValue],
    values: &RowValues<'_>,
    marker: Option<i64>,
    updated_at: &str,
) -> rusqlite::Result<()> {
    bind_key(stmt, key)?;
    let mut at = key.len();
    if spec.document_column.is_some() {
        at += 1;
        stmt.raw_bind_parameter(at, values.document)?;
    }
    for value in values.columns {
        at += 1;
        stmt.raw_bind_parameter(at, column_param(value))?;
    }
    stmt.raw_bind_parameter(at + 1, marker)?;
    stmt.raw_bind_parameter(at + 2, updated_at)
}

/// A typed column's value as bound (docs/sinks.md §7.9): `bigint` and `boolean` (0/1) as
/// INTEGER, `double` as REAL, the others as TEXT (`timestamptz` as `timestamp_text`).
pub(super) fn column_param(value: &ColumnValue) -> ToSqlOutput<'_> {
    match value {
        ColumnValue::Text(text) | ColumnValue::Numeric(text) | ColumnValue::Json(text) => {
            ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes()))
        }
        other => ToSqlOutput::Owned(column_value(other)),
    }
}

/// A typed column's value as SQLite stores it (see [`column_param`]).
pub(super) fn column_value(value: &ColumnValue) -> Value {
    match value {
        ColumnValue::Null => Value::Null,
        ColumnValue::Text(text) | ColumnValue::Numeric(text) | ColumnValue::Json(text) => {
            Value::Text(text.clone())
        }
        ColumnValue::Bigint(n) => Value::Integer(*n),
        ColumnValue::Double(x) => Value::Real(*x),
        ColumnValue::Boolean(b) => Value::Integer(i64::from(*b)),
        ColumnValue::Timestamp(micros) => Value::Text(ddbpipe_value::timestamp_text(*micros)),
    }
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

/// Whether an existing table has a row.
pub(super) fn has_rows(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        &format!("SELECT EXISTS (SELECT 1 FROM {})", quote(table)),
        [],
        |row| row.get(0),
    )
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
