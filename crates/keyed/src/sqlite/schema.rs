//! The schema: validating a spec's names, inspecting an existing table against it, the
//! `CREATE TABLE` statements of the destination, the state and the deleted-key markers, adding
//! the version columns to a table of an earlier ddbpipe, and the typed columns' declared
//! types and additions (see the `sqlite` module docs, "The SQL shape" and "Typed columns").

use rusqlite::{Connection, OptionalExtension};

use crate::columns::{Naming, Recorded, TableColumn, records};
use crate::sql::{
    SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN, VERSION_SEQ_COLUMN, quote,
};
use crate::{ColumnType, KeyColumn, KeyType, TableSpec};

use crate::RESERVED_PREFIX;

pub(super) const CREATE_STATE_SQL: &str = "CREATE TABLE IF NOT EXISTS \"_ddbpipe_state\" (\
     pipeline TEXT NOT NULL, part TEXT NOT NULL, value TEXT NOT NULL, updated_at TEXT NOT NULL, \
     PRIMARY KEY (pipeline, part)); \
     CREATE TABLE IF NOT EXISTS \"_ddbpipe_fences\" (\
     pipeline TEXT NOT NULL, unit TEXT NOT NULL, counter INTEGER NOT NULL, position TEXT, \
     PRIMARY KEY (pipeline, unit))";

pub(super) const CREATE_DELETED_SQL: &str = "CREATE TABLE IF NOT EXISTS \"_ddbpipe_deleted\" (\
     table_name TEXT NOT NULL, key_text TEXT NOT NULL, version_ms INTEGER, \
     PRIMARY KEY (table_name, key_text))";

/// The version columns (docs/mirror.md §5.6) with their declared types; a table created by an
/// earlier ddbpipe lacks them and gets them from `prepare`.
const VERSION_COLUMNS: [(&str, &str); 2] =
    [(VERSION_MS_COLUMN, "INTEGER"), (VERSION_SEQ_COLUMN, "TEXT")];

/// What a name is in the database.
pub(super) enum Found {
    /// Nothing of that name.
    Missing,
    /// A view, index or trigger.
    Other(String),
    /// A table, with its columns.
    Table(Vec<ColumnInfo>),
}

/// One column of an existing table.
pub(super) struct ColumnInfo {
    name: String,
    declared: String,
    /// The 1-based position in the primary key, 0 when not in it.
    pk: i64,
    /// `NOT NULL` without a default value.
    required: bool,
}

/// Looks `table` up in the main schema (names compare case-insensitively, as in SQLite).
pub(super) fn inspect(conn: &Connection, table: &str) -> rusqlite::Result<Found> {
    let kind: Option<String> = conn
        .prepare_cached(
            "SELECT type FROM main.sqlite_master WHERE name = ?1 COLLATE NOCASE \
             ORDER BY type = 'table' DESC LIMIT 1",
        )?
        .query_row([table], |row| row.get(0))
        .optional()?;
    match kind.as_deref() {
        None => Ok(Found::Missing),
        Some("table") => {
            let mut stmt = conn.prepare_cached(
                "SELECT name, type, pk, \"notnull\" AND dflt_value IS NULL \
                 FROM pragma_table_info(?1, 'main') ORDER BY cid",
            )?;
            let columns = stmt
                .query_map([table], |row| {
                    Ok(ColumnInfo {
                        name: row.get(0)?,
                        declared: row.get(1)?,
                        pk: row.get(2)?,
                        required: row.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Found::Table(columns))
        }
        Some(other) => Ok(Found::Other(other.to_string())),
    }
}

/// Compares an existing table's key columns and ddbpipe's own columns with `spec` (the others
/// are `crate::columns::plan`'s): `Err` completes "sqlite table 'x' in f …".
pub(super) fn check_existing(spec: &TableSpec, columns: &[ColumnInfo]) -> Result<(), String> {
    let mut key: Vec<&ColumnInfo> = columns.iter().filter(|c| c.pk > 0).collect();
    key.sort_by_key(|c| c.pk);
    let same_key = key.len() == spec.key.len()
        && key.iter().zip(&spec.key).all(|(have, want)| {
            have.name.eq_ignore_ascii_case(&want.name)
                && have.declared.eq_ignore_ascii_case(sql_type(want.kind))
        });
    if !same_key {
        let have = key
            .iter()
            .map(|c| format!("{} {}", c.name, c.declared))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!(
            "has key columns ({have}) but the source key is {}",
            spec_key_text(spec)
        ));
    }
    for (wanted, what) in [
        (SNAPSHOT_COLUMN, "the snapshot marker"),
        (UPDATED_AT_COLUMN, "the update time"),
    ] {
        if !columns.iter().any(|c| c.name.eq_ignore_ascii_case(wanted)) {
            return Err(format!("has no column '{wanted}' ({what})"));
        }
    }
    Ok(())
}

/// How SQLite names and compares columns (`columns` rule 6): names ignoring ASCII case,
/// typed columns by their declared types.
pub(super) const NAMING: Naming = Naming {
    same: str::eq_ignore_ascii_case,
    type_name: column_type,
};

/// The columns of an existing table, for `crate::columns::plan`.
/// The typed columns recorded for `table` (`crate::columns::records`); none before the record
/// table exists.
pub(super) fn recorded(conn: &Connection, table: &str) -> rusqlite::Result<Vec<Recorded>> {
    let exists: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?1")?
        .query_row([records::COLUMNS_TABLE], |row| row.get(0))
        .optional()?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let mut select = conn.prepare(&records::select_sql(&quote(records::COLUMNS_TABLE)))?;
    let rows = select.query_map([table], |row| {
        Ok(Recorded {
            name: row.get(0)?,
            definition: row.get(1)?,
        })
    })?;
    rows.collect()
}

/// Records `spec`'s typed columns as what its table's columns hold, replacing the record.
pub(super) fn record(conn: &Connection, spec: &TableSpec) -> rusqlite::Result<()> {
    let table = quote(records::COLUMNS_TABLE);
    conn.execute_batch(&records::create_sql(&table))?;
    conn.execute(&records::delete_sql(&table), [&spec.table])?;
    let mut insert = conn.prepare(&records::insert_sql(&table))?;
    for (name, definition) in records::rows(&spec.columns) {
        insert.execute([&spec.table, &name, &definition])?;
    }
    Ok(())
}

pub(super) fn table_columns(columns: &[ColumnInfo]) -> Vec<TableColumn> {
    columns
        .iter()
        .map(|c| TableColumn {
            name: c.name.clone(),
            type_name: c.declared.clone(),
            required: c.required,
        })
        .collect()
}

/// The declared type of a typed column (docs/sinks.md §7.9). Each names the column's type, so
/// that a changed `type:` is seen even where two types store alike, and its words give the
/// affinity that keeps each value exactly as bound (SQLite's rules: a declared type holding
/// `INT` is INTEGER, then `TEXT` is TEXT, then `DOUB` is REAL, and none of these is NUMERIC):
/// numbers as their text, times as `timestamp_text` and JSON as its text (`… TEXT`, TEXT
/// affinity), integers (`BIGINT`), doubles (`DOUBLE`), and 0/1 (`BOOLEAN`, NUMERIC affinity,
/// which keeps an integer an integer).
pub(super) fn column_type(kind: ColumnType) -> &'static str {
    match kind {
        ColumnType::Text => "TEXT",
        ColumnType::Numeric => "NUMERIC TEXT",
        ColumnType::Timestamptz => "TIMESTAMPTZ TEXT",
        ColumnType::Jsonb => "JSONB TEXT",
        ColumnType::Bigint => "BIGINT",
        ColumnType::Boolean => "BOOLEAN",
        ColumnType::Double => "DOUBLE",
    }
}

/// `ALTER TABLE … ADD COLUMN` of a column `name` declared `declared`.
pub(super) fn add_column_sql(spec: &TableSpec, name: &str, declared: &str) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN {} {declared}",
        quote(&spec.table),
        quote(name)
    )
}

/// `ALTER TABLE … ADD COLUMN` for each version column the existing table lacks (none for a
/// table of this version).
pub(super) fn add_version_columns_sql(spec: &TableSpec, columns: &[ColumnInfo]) -> Vec<String> {
    VERSION_COLUMNS
        .iter()
        .filter(|(name, _)| !columns.iter().any(|c| c.name.eq_ignore_ascii_case(name)))
        .map(|(name, kind)| {
            format!(
                "ALTER TABLE {} ADD COLUMN {} {kind}",
                quote(&spec.table),
                quote(name)
            )
        })
        .collect()
}

/// Rejects specs whose columns would collide (the caller checks too).
pub(super) fn validate_spec(spec: &TableSpec) -> Result<(), String> {
    let reserved = |name: &str| {
        name.get(..RESERVED_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
    };
    if spec.table.is_empty() || reserved(&spec.table) {
        return Err("the table name is empty or reserved by ddbpipe".to_string());
    }
    if spec.key.is_empty() {
        return Err("the key has no columns".to_string());
    }
    let document = spec.document_column.as_deref();
    if let Some(document) = document
        && (document.is_empty() || reserved(document))
    {
        return Err(format!(
            "the document column '{document}' is empty or starts with {RESERVED_PREFIX}"
        ));
    }
    for (i, k) in spec.key.iter().enumerate() {
        if k.name.is_empty() {
            return Err("a key attribute has an empty name".to_string());
        }
        if reserved(&k.name) {
            return Err(format!(
                "the key attribute '{}' starts with {RESERVED_PREFIX}, reserved for ddbpipe's columns",
                k.name
            ));
        }
        if document.is_some_and(|document| k.name.eq_ignore_ascii_case(document)) {
            return Err(format!(
                "the key attribute '{}' has the document column's name; set another sink.document_column",
                k.name
            ));
        }
        if spec.key[..i]
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(&k.name))
        {
            return Err(format!(
                "the key attributes have the same column name '{}' (SQLite ignores case)",
                k.name
            ));
        }
    }
    let mut names: Vec<&str> = spec.key.iter().map(|k| k.name.as_str()).collect();
    names.extend(document);
    for column in &spec.columns {
        let name = column.name.as_str();
        if name.is_empty() {
            return Err("a typed column of sink.columns has an empty name".to_string());
        }
        if reserved(name) {
            return Err(format!(
                "the typed column '{name}' starts with {RESERVED_PREFIX}, reserved for ddbpipe's \
                 columns; give it another name in sink.columns"
            ));
        }
        if names.iter().any(|other| other.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "the typed column '{name}' has the name of a key attribute, the document column \
                 or another typed column (SQLite ignores case); give it another name in \
                 sink.columns"
            ));
        }
        names.push(name);
    }
    Ok(())
}

/// `CREATE TABLE IF NOT EXISTS` for `spec` (see the module docs).
pub(super) fn create_table_sql(spec: &TableSpec) -> String {
    let mut columns: Vec<String> = spec
        .key
        .iter()
        .map(|k| format!("{} {} NOT NULL", quote(&k.name), sql_type(k.kind)))
        .collect();
    if let Some(document) = &spec.document_column {
        columns.push(format!("{} TEXT NOT NULL", quote(document)));
    }
    for column in &spec.columns {
        columns.push(format!(
            "{} {}",
            quote(&column.name),
            column_type(column.kind)
        ));
    }
    columns.push(format!("{} INTEGER", quote(SNAPSHOT_COLUMN)));
    columns.push(format!("{} TEXT NOT NULL", quote(UPDATED_AT_COLUMN)));
    for (name, kind) in VERSION_COLUMNS {
        columns.push(format!("{} {kind}", quote(name)));
    }
    let key = spec
        .key
        .iter()
        .map(|k| quote(&k.name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({key}))",
        quote(&spec.table),
        columns.join(", ")
    )
}

/// `"(pk TEXT, sk TEXT)"`.
pub(super) fn spec_key_text(spec: &TableSpec) -> String {
    let parts = spec
        .key
        .iter()
        .map(|KeyColumn { name, kind }| format!("{name} {}", sql_type(*kind)))
        .collect::<Vec<_>>();
    format!("({})", parts.join(", "))
}

/// The declared column type of a key type.
fn sql_type(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S | KeyType::N => "TEXT",
        KeyType::B => "BLOB",
    }
}
