//! The statement builders (row upserts and deletes, the state's statements), the names'
//! validation, the key check and the message contexts (see the `postgres` module docs, "SQL
//! shape").

use std::fmt::Write as _;

use tokio_postgres::types::ToSql;

use super::document;
use crate::sql::{
    DELETED_TABLE, RESERVED_PREFIX, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN,
    VERSION_SEQ_COLUMN, key_misfit, key_type, quote, repair_older,
};
use crate::{ColumnType, DbError, KeyType, KeyValue, TableSpec};

/// The parameter cast of `_ddbpipe_updated_at`: RFC 3339 text, stored as `timestamptz`.
pub(super) const UPDATED_AT_CAST: &str = "::text::timestamptz";

/// PostgreSQL truncates longer identifiers (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

pub(super) fn qualified(schema: &str, table: &str) -> String {
    format!("{}.{}", quote(schema), quote(table))
}

pub(super) fn table_context(schema: &str, table: &str) -> String {
    format!("postgres table '{schema}.{table}'")
}

pub(super) fn spec_context(spec: &TableSpec) -> String {
    table_context(&spec.schema, &spec.table)
}

pub(super) fn check_identifier(name: &str, what: &str, context: &str) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::fatal(format!("{context}: empty {what} name")));
    }
    if name.contains('\0') {
        return Err(DbError::fatal(format!(
            "{context}: the {what} name '{}' contains a NUL character",
            name.escape_debug()
        )));
    }
    if name.len() > MAX_IDENTIFIER_BYTES {
        return Err(DbError::fatal(format!(
            "{context}: postgres {what} name '{name}' is longer than {MAX_IDENTIFIER_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Names that fit PostgreSQL, and no column twice; no typed column named like ddbpipe's own.
pub(super) fn validate(spec: &TableSpec) -> Result<(), DbError> {
    if spec.table.len() > MAX_IDENTIFIER_BYTES {
        return Err(DbError::fatal(format!(
            "postgres table name '{}' is longer than {MAX_IDENTIFIER_BYTES} bytes; set sink.table to a shorter name",
            spec.table
        )));
    }
    let context = spec_context(spec);
    check_identifier(&spec.table, "table", &context)?;
    check_identifier(&spec.schema, "schema", &context)?;
    if spec.key.is_empty() {
        return Err(DbError::fatal(format!("{context}: no key columns")));
    }
    for column in &spec.columns {
        if column.name.starts_with(RESERVED_PREFIX) {
            return Err(DbError::fatal(format!(
                "{context}: the typed column '{}' starts with {RESERVED_PREFIX}, reserved for \
                 ddbpipe's columns; give it another name in sink.columns",
                column.name
            )));
        }
    }
    let mut columns: Vec<&str> = Vec::new();
    let typed = spec.columns.iter().map(|c| c.name.as_str());
    let names = spec.key.iter().map(|k| k.name.as_str());
    let names = names.chain(spec.document_column.as_deref()).chain(typed);
    for column in names.chain([
        SNAPSHOT_COLUMN,
        UPDATED_AT_COLUMN,
        VERSION_MS_COLUMN,
        VERSION_SEQ_COLUMN,
    ]) {
        check_identifier(column, "column", &context)?;
        if columns.contains(&column) {
            return Err(DbError::fatal(format!(
                "{context}: column '{column}' is used twice (key attributes, document column, \
                 typed columns and ddbpipe's own {SNAPSHOT_COLUMN}, {UPDATED_AT_COLUMN}, \
                 {VERSION_MS_COLUMN} and {VERSION_SEQ_COLUMN} must differ)"
            )));
        }
        columns.push(column);
    }
    Ok(())
}

/// The type of a typed column (docs/sinks.md §7.9) as `format_type` names it, which is also
/// how the table is created.
pub(super) fn column_type(kind: ColumnType) -> &'static str {
    match kind {
        ColumnType::Text => "text",
        ColumnType::Numeric => "numeric",
        ColumnType::Bigint => "bigint",
        ColumnType::Double => "double precision",
        ColumnType::Boolean => "boolean",
        ColumnType::Timestamptz => "timestamp with time zone",
        ColumnType::Jsonb => "jsonb",
    }
}

/// The parameter cast of a typed column: every value goes as its text
/// (`ColumnValue::sql_text`), parsed by the server into the column's type.
pub(super) fn column_cast(kind: ColumnType) -> &'static str {
    match kind {
        ColumnType::Text => "::text",
        ColumnType::Numeric => "::text::numeric",
        ColumnType::Bigint => "::text::bigint",
        ColumnType::Double => "::text::float8",
        ColumnType::Boolean => "::text::boolean",
        ColumnType::Timestamptz => "::text::timestamptz",
        ColumnType::Jsonb => "::text::jsonb",
    }
}

/// The columns an upsert writes after the key (`crate::sql` rule 8), quoted, each with the
/// cast of its text: the document (to the document type), then the typed columns.
pub(super) fn value_casts(spec: &TableSpec) -> Vec<(String, &'static str)> {
    let document = spec
        .document_column
        .iter()
        .map(|name| (quote(name), document::cast(spec.document_type)));
    let typed = spec
        .columns
        .iter()
        .map(|column| (quote(&column.name), column_cast(column.kind)));
    document.chain(typed).collect()
}

/// The key values match the key columns in number and type.
pub(super) fn check_key(spec: &TableSpec, key: &[KeyValue]) -> Result<(), DbError> {
    if key_misfit(spec, key).is_none() {
        return Ok(());
    }
    let got: Vec<&str> = key.iter().map(|value| key_type(value).tag()).collect();
    let wanted: Vec<String> = spec
        .key
        .iter()
        .map(|k| format!("{} {}", k.name, k.kind.tag()))
        .collect();
    Err(DbError::fatal(format!(
        "{}: a row's key has {} value(s) ({}) but the table's key is ({})",
        spec_context(spec),
        key.len(),
        got.join(", "),
        wanted.join(", ")
    )))
}

pub(super) fn key_param(value: &KeyValue) -> &(dyn ToSql + Sync) {
    match value {
        KeyValue::S(text) | KeyValue::N(text) => text,
        KeyValue::B(bytes) => bytes,
    }
}

pub(super) fn sql_type(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S => "text",
        KeyType::N => "numeric",
        KeyType::B => "bytea",
    }
}

/// The parameter cast of a key column: numbers go as text and are cast by the server.
pub(super) fn key_cast(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S => "::text",
        KeyType::N => "::text::numeric",
        KeyType::B => "::bytea",
    }
}

pub(super) fn key_list(spec: &TableSpec) -> String {
    spec.key
        .iter()
        .map(|k| quote(&k.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which upsert statement a row change takes (see `crate::sql::Write`). The values are the
/// document (when the table keeps one) and the typed columns (`value_casts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UpsertKind {
    /// Parameters: the keys, the values, `_ddbpipe_updated_at`, the version's time and
    /// sequence. The marker is not updated (a new row gets null).
    Change,
    /// Parameters: the keys, the values, the snapshot id, `_ddbpipe_updated_at`, the version's
    /// time and sequence. The marker becomes the id.
    Marked,
    /// Parameters: the keys, the values, the snapshot id, `_ddbpipe_updated_at`, the read
    /// time, the cutoff, the table name and the key text (`crate::sql::key_text`). Writes
    /// nothing when a deleted-key marker or a stream-written row of this snapshot is newer than
    /// the cutoff (a null time counts as newer); otherwise as `Marked`, with no sequence.
    UnlessNewer,
}

/// The conflict update of an upsert: the values (document and typed columns) and the
/// version, and the marker when the upsert marks its row (every upsert statement, per row or
/// in bulk, takes this one).
pub(super) fn conflict_set(spec: &TableSpec, marked: bool) -> String {
    let updated_at = quote(UPDATED_AT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let mut set = String::new();
    for (column, _) in value_casts(spec) {
        let _ = write!(set, "{column} = EXCLUDED.{column}, ");
    }
    let _ = write!(
        set,
        "{updated_at} = EXCLUDED.{updated_at}, \
         {version_ms} = EXCLUDED.{version_ms}, {version_seq} = EXCLUDED.{version_seq}"
    );
    if marked {
        let marker = quote(SNAPSHOT_COLUMN);
        let _ = write!(set, ", {marker} = EXCLUDED.{marker}");
    }
    set
}

/// The destination's columns an upsert writes, in order: the keys, the values, the marker,
/// `_ddbpipe_updated_at` and the version (every upsert, per row, in bulk or copied, names them
/// so).
pub(super) fn upsert_columns(spec: &TableSpec) -> String {
    let mut columns = key_list(spec);
    for (column, _) in value_casts(spec) {
        let _ = write!(columns, ", {column}");
    }
    for own in [
        SNAPSHOT_COLUMN,
        UPDATED_AT_COLUMN,
        VERSION_MS_COLUMN,
        VERSION_SEQ_COLUMN,
    ] {
        let _ = write!(columns, ", {}", quote(own));
    }
    columns
}

pub(super) fn upsert_sql(spec: &TableSpec, kind: UpsertKind) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let marker = quote(SNAPSHOT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("${}{}", i + 1, key_cast(k.kind)))
        .collect();
    let mut n = spec.key.len();
    let mut param = |cast: &str| {
        n += 1;
        format!("${n}{cast}")
    };
    for (_, cast) in value_casts(spec) {
        values.push(param(cast));
    }
    values.push(match kind {
        UpsertKind::Change => "NULL".to_string(),
        UpsertKind::Marked | UpsertKind::UnlessNewer => param("::bigint"),
    });
    values.push(param(UPDATED_AT_CAST));
    values.push(param("::bigint"));
    values.push(match kind {
        UpsertKind::UnlessNewer => "NULL".to_string(),
        UpsertKind::Change | UpsertKind::Marked => param("::text"),
    });
    let set = conflict_set(spec, kind != UpsertKind::Change);
    let keys = key_list(spec);
    let columns = upsert_columns(spec);
    let values = values.join(", ");
    if kind != UpsertKind::UnlessNewer {
        return format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {set}"
        );
    }
    let cutoff = param("::bigint");
    let table_name = param("::text");
    let key_text = param("::text");
    format!(
        "INSERT INTO {table} AS t ({columns}) SELECT {values} \
         WHERE NOT EXISTS (SELECT 1 FROM {} d WHERE d.table_name = {table_name} \
         AND d.key_text = {key_text} AND (d.version_ms IS NULL OR d.version_ms > {cutoff})) \
         ON CONFLICT ({keys}) DO UPDATE SET {set} \
         WHERE NOT (t.{marker} IS NOT DISTINCT FROM EXCLUDED.{marker} AND t.{version_seq} IS NOT NULL \
         AND (t.{version_ms} IS NULL OR t.{version_ms} > {cutoff}))",
        qualified(&spec.schema, DELETED_TABLE)
    )
}

/// A repair's upsert (`crate::sql::Write::RepairUpsert`). Parameters: the keys, the values,
/// the repair id, `_ddbpipe_updated_at`, the write time. Replaces an older row's values and
/// version, marks the row with the id either way.
pub(super) fn repair_upsert_sql(spec: &TableSpec) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let marker = quote(SNAPSHOT_COLUMN);
    let updated_at = quote(UPDATED_AT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let written = value_casts(spec);
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("${}{}", i + 1, key_cast(k.kind)))
        .collect();
    let mut n = spec.key.len();
    for (_, cast) in &written {
        n += 1;
        values.push(format!("${n}{cast}"));
    }
    values.push(format!("${}::bigint", n + 1));
    values.push(format!("${}{UPDATED_AT_CAST}", n + 2));
    values.push(format!("${}::bigint", n + 3));
    values.push("NULL".into());
    let older = repair_older("t", &format!("EXCLUDED.{version_ms}"));
    let keep = |column: &str| {
        format!("{column} = CASE WHEN {older} THEN EXCLUDED.{column} ELSE t.{column} END")
    };
    let kept: Vec<String> = written
        .iter()
        .map(|(column, _)| column)
        .chain([&updated_at, &version_seq, &version_ms])
        .map(|column| keep(column))
        .collect();
    format!(
        "INSERT INTO {table} AS t ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}, \
         {marker} = EXCLUDED.{marker}",
        upsert_columns(spec),
        values.join(", "),
        key_list(spec),
        kept.join(", "),
    )
}

/// A repair's delete: parameters the keys, the delete's time; deletes the row when older.
pub(super) fn repair_delete_sql(spec: &TableSpec) -> String {
    let n = spec.key.len();
    format!(
        "{} AND {}",
        delete_sql(spec).replacen(" WHERE ", " AS t WHERE ", 1),
        repair_older("t", &format!("${}::bigint", n + 1))
    )
}

/// Parameters: the keys, the repair id. Marks the row (a newer one a repair's delete kept).
pub(super) fn repair_mark_sql(spec: &TableSpec) -> String {
    let n = spec.key.len();
    let conditions: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ${}{}", quote(&k.name), i + 1, key_cast(k.kind)))
        .collect();
    format!(
        "UPDATE {} SET {} = ${}::bigint WHERE {}",
        qualified(&spec.schema, &spec.table),
        quote(SNAPSHOT_COLUMN),
        n + 1,
        conditions.join(" AND ")
    )
}

/// Parameters: the table name, the key text, the delete's time. Of two markers of a key the
/// newer time stays (null, unknown, counts as the newest).
pub(super) fn mark_deleted_sql(schema: &str) -> String {
    format!(
        "INSERT INTO {} AS d (table_name, key_text, version_ms) \
         VALUES ($1::text, $2::text, $3::bigint) ON CONFLICT (table_name, key_text) DO UPDATE \
         SET version_ms = CASE WHEN d.version_ms IS NULL OR EXCLUDED.version_ms IS NULL THEN NULL \
         ELSE GREATEST(d.version_ms, EXCLUDED.version_ms) END",
        qualified(schema, DELETED_TABLE)
    )
}

pub(super) fn delete_sql(spec: &TableSpec) -> String {
    let conditions: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ${}{}", quote(&k.name), i + 1, key_cast(k.kind)))
        .collect();
    format!(
        "DELETE FROM {} WHERE {}",
        qualified(&spec.schema, &spec.table),
        conditions.join(" AND ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_sql_shape() {
        let spec = TableSpec {
            table: "or\"ders".into(),
            schema: "public".into(),
            key: vec![
                crate::KeyColumn {
                    name: "id".into(),
                    kind: KeyType::S,
                },
                crate::KeyColumn {
                    name: "n".into(),
                    kind: KeyType::N,
                },
            ],
            document_column: Some("doc".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        };
        assert_eq!(
            upsert_sql(&spec, UpsertKind::Change),
            "INSERT INTO \"public\".\"or\"\"ders\" (\"id\", \"n\", \"doc\", \"_ddbpipe_snapshot\", \
             \"_ddbpipe_updated_at\", \"_ddbpipe_version_ms\", \"_ddbpipe_version_seq\") VALUES \
             ($1::text, $2::text::numeric, $3::text::jsonb, NULL, $4::text::timestamptz, $5::bigint, $6::text) \
             ON CONFLICT (\"id\", \"n\") DO UPDATE SET \"doc\" = EXCLUDED.\"doc\", \
             \"_ddbpipe_updated_at\" = EXCLUDED.\"_ddbpipe_updated_at\", \
             \"_ddbpipe_version_ms\" = EXCLUDED.\"_ddbpipe_version_ms\", \
             \"_ddbpipe_version_seq\" = EXCLUDED.\"_ddbpipe_version_seq\""
        );
        assert!(upsert_sql(&spec, UpsertKind::Marked).ends_with(
            "$4::bigint, $5::text::timestamptz, $6::bigint, $7::text) ON CONFLICT (\"id\", \"n\") DO UPDATE \
             SET \"doc\" = EXCLUDED.\"doc\", \"_ddbpipe_updated_at\" = EXCLUDED.\"_ddbpipe_updated_at\", \
             \"_ddbpipe_version_ms\" = EXCLUDED.\"_ddbpipe_version_ms\", \
             \"_ddbpipe_version_seq\" = EXCLUDED.\"_ddbpipe_version_seq\", \
             \"_ddbpipe_snapshot\" = EXCLUDED.\"_ddbpipe_snapshot\""
        ));
        let guarded = upsert_sql(&spec, UpsertKind::UnlessNewer);
        assert!(
            guarded.contains(
                "SELECT $1::text, $2::text::numeric, $3::text::jsonb, $4::bigint, \
                 $5::text::timestamptz, $6::bigint, NULL WHERE NOT EXISTS"
            ) && guarded.contains("d.table_name = $8::text AND d.key_text = $9::text")
                && guarded.ends_with("t.\"_ddbpipe_version_ms\" > $7::bigint))"),
            "{guarded}"
        );
    }

    #[test]
    fn typed_columns_follow_the_document_in_every_statement() {
        let column = |name: &str, kind| crate::ColumnSpec {
            name: name.into(),
            path: ddbpipe_value::ColumnPath::parse(name).expect("a path"),
            kind,
            time_format: crate::TimeFormat::default(),
        };
        let mut spec = TableSpec {
            table: "t".into(),
            schema: "s".into(),
            key: vec![crate::KeyColumn {
                name: "id".into(),
                kind: KeyType::S,
            }],
            document_column: Some("doc".into()),
            columns: vec![
                column("total", ColumnType::Numeric),
                column("at", ColumnType::Timestamptz),
            ],
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        };
        let change = upsert_sql(&spec, UpsertKind::Change);
        assert!(
            change.contains("(\"id\", \"doc\", \"total\", \"at\", \"_ddbpipe_snapshot\"")
                && change.contains(
                    "VALUES ($1::text, $2::text::jsonb, $3::text::numeric, \
                     $4::text::timestamptz, NULL, $5::text::timestamptz, $6::bigint, $7::text)"
                )
                && change.contains(
                    "\"doc\" = EXCLUDED.\"doc\", \"total\" = EXCLUDED.\"total\", \
                     \"at\" = EXCLUDED.\"at\", \"_ddbpipe_updated_at\""
                ),
            "{change}"
        );
        let repair = repair_upsert_sql(&spec);
        assert!(
            repair.contains("\"total\" = CASE WHEN") && repair.contains("ELSE t.\"at\" END"),
            "{repair}"
        );
        spec.document_column = None;
        let guarded = upsert_sql(&spec, UpsertKind::UnlessNewer);
        assert!(
            !guarded.contains("doc")
                && guarded.contains(
                    "SELECT $1::text, $2::text::numeric, $3::text::timestamptz, \
                     $4::bigint"
                )
                && guarded.contains("d.table_name = $8::text"),
            "{guarded}"
        );
    }
}
