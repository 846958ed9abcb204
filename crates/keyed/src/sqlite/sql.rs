//! The statements of the rows and the state, built once per table, and binding a row's key to
//! them (see the `sqlite` module docs, "The SQL shape").

use rusqlite::{Connection, Statement};

use crate::sql::{KeyMisfit, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, key_misfit, quote, row_count};
use crate::{KeyValue, StateWrite, TableSpec};

const UPSERT_STATE_SQL: &str = "INSERT INTO \"_ddbpipe_state\" (pipeline, part, value, updated_at) \
     VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (pipeline, part) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE_STATE_SQL: &str = "DELETE FROM \"_ddbpipe_state\" WHERE pipeline = ?1 AND part = ?2";

/// The statements of one destination table.
pub(super) struct TableSql {
    /// The spec they were built for (a different spec under the same name rebuilds them).
    pub(super) spec: TableSpec,
    /// Parameters: the key values, the document, the marker, `updated_at`.
    pub(super) upsert_snapshot: String,
    /// As `upsert_snapshot`, but the marker is not updated on conflict.
    pub(super) upsert_change: String,
    /// Parameters: the key values.
    pub(super) delete: String,
    /// Parameter: the snapshot id.
    pub(super) count_marked: String,
    /// Parameter: the snapshot id.
    pub(super) delete_unmarked: String,
}

impl TableSql {
    pub(super) fn new(spec: &TableSpec) -> Self {
        let table = quote(&spec.table);
        let doc = quote(&spec.document_column);
        let marker = quote(SNAPSHOT_COLUMN);
        let updated = quote(UPDATED_AT_COLUMN);
        let keys: Vec<String> = spec.key.iter().map(|k| quote(&k.name)).collect();
        let n = keys.len();
        let key_list = keys.join(", ");
        let values = (1..=n + 3)
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let insert = format!(
            "INSERT INTO {table} ({key_list}, {doc}, {marker}, {updated}) VALUES ({values}) \
             ON CONFLICT ({key_list}) DO UPDATE SET {doc} = excluded.{doc}, "
        );
        let where_key = keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ?{}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        TableSql {
            spec: spec.clone(),
            upsert_snapshot: format!(
                "{insert}{marker} = excluded.{marker}, {updated} = excluded.{updated}"
            ),
            upsert_change: format!("{insert}{updated} = excluded.{updated}"),
            delete: format!("DELETE FROM {table} WHERE {where_key}"),
            count_marked: format!("SELECT count(*) FROM {table} WHERE {marker} = ?1"),
            delete_unmarked: format!(
                "DELETE FROM {table} WHERE {marker} IS NULL OR {marker} <> ?1"
            ),
        }
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
pub(super) fn bind_key(stmt: &mut Statement<'_>, key: &[KeyValue]) -> rusqlite::Result<()> {
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
