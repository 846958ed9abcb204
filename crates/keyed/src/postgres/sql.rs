//! The statement builders (row upserts and deletes, the state's statements), the names'
//! validation, the key check and the message contexts (see the `postgres` module docs, "SQL
//! shape").

use std::fmt::Write as _;

use tokio_postgres::types::ToSql;

use super::document;
use crate::sql::{
    DELETED_TABLE, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN, VERSION_SEQ_COLUMN,
    key_misfit, key_type, quote, repair_older,
};
use crate::{DbError, KeyType, KeyValue, TableSpec};

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

/// Names that fit PostgreSQL, and no column twice.
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
    let mut columns: Vec<&str> = Vec::new();
    for column in spec.key.iter().map(|k| k.name.as_str()).chain([
        spec.document_name(),
        SNAPSHOT_COLUMN,
        UPDATED_AT_COLUMN,
        VERSION_MS_COLUMN,
        VERSION_SEQ_COLUMN,
    ]) {
        check_identifier(column, "column", &context)?;
        if columns.contains(&column) {
            return Err(DbError::fatal(format!(
                "{context}: column '{column}' is used twice (key attributes, document column and \
                 ddbpipe's own {SNAPSHOT_COLUMN}, {UPDATED_AT_COLUMN}, {VERSION_MS_COLUMN} and \
                 {VERSION_SEQ_COLUMN} must differ)"
            )));
        }
        columns.push(column);
    }
    Ok(())
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

/// Which upsert statement a row change takes (see `crate::sql::Write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UpsertKind {
    /// Parameters: the keys, the document, `_ddbpipe_updated_at`, the version's time and
    /// sequence. The marker is not updated (a new row gets null).
    Change,
    /// Parameters: the keys, the document, the snapshot id, `_ddbpipe_updated_at`, the version's
    /// time and sequence. The marker becomes the id.
    Marked,
    /// Parameters: the keys, the document, the snapshot id, `_ddbpipe_updated_at`, the read
    /// time, the cutoff, the table name and the key text (`crate::sql::key_text`). Writes
    /// nothing when a deleted-key marker or a stream-written row of this snapshot is newer than
    /// the cutoff (a null time counts as newer); otherwise as `Marked`, with no sequence.
    UnlessNewer,
}

/// The conflict update of an upsert: the document and the version, and the marker when the
/// upsert marks its row (every upsert statement, per row or in bulk, takes this one).
pub(super) fn conflict_set(spec: &TableSpec, marked: bool) -> String {
    let document = quote(spec.document_name());
    let updated_at = quote(UPDATED_AT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let mut set = format!(
        "{document} = EXCLUDED.{document}, {updated_at} = EXCLUDED.{updated_at}, \
         {version_ms} = EXCLUDED.{version_ms}, {version_seq} = EXCLUDED.{version_seq}"
    );
    if marked {
        let marker = quote(SNAPSHOT_COLUMN);
        let _ = write!(set, ", {marker} = EXCLUDED.{marker}");
    }
    set
}

pub(super) fn upsert_sql(spec: &TableSpec, kind: UpsertKind) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let document = quote(spec.document_name());
    let marker = quote(SNAPSHOT_COLUMN);
    let updated_at = quote(UPDATED_AT_COLUMN);
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
    values.push(param(document::cast(spec.document_type)));
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
    let columns =
        format!("{keys}, {document}, {marker}, {updated_at}, {version_ms}, {version_seq}");
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

/// A repair's upsert (`crate::sql::Write::RepairUpsert`). Parameters: the keys, the document,
/// the repair id, `_ddbpipe_updated_at`, the write time. Replaces an older row's document and
/// version, marks the row with the id either way.
pub(super) fn repair_upsert_sql(spec: &TableSpec) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let document = quote(spec.document_name());
    let marker = quote(SNAPSHOT_COLUMN);
    let updated_at = quote(UPDATED_AT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let n = spec.key.len();
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("${}{}", i + 1, key_cast(k.kind)))
        .collect();
    values.push(format!("${}{}", n + 1, document::cast(spec.document_type)));
    values.push(format!("${}::bigint", n + 2));
    values.push(format!("${}{UPDATED_AT_CAST}", n + 3));
    values.push(format!("${}::bigint", n + 4));
    values.push("NULL".into());
    let older = repair_older("t", &format!("EXCLUDED.{version_ms}"));
    let keep = |column: &str| {
        format!("{column} = CASE WHEN {older} THEN EXCLUDED.{column} ELSE t.{column} END")
    };
    let keys = key_list(spec);
    format!(
        "INSERT INTO {table} AS t ({keys}, {document}, {marker}, {updated_at}, {version_ms}, \
         {version_seq}) VALUES ({}) ON CONFLICT ({keys}) DO UPDATE SET {}, {}, {}, {}, \
         {marker} = EXCLUDED.{marker}",
        values.join(", "),
        keep(&document),
        keep(&updated_at),
        keep(&version_seq),
        keep(&version_ms),
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
}
