//! The schema: inspecting an existing destination table (key columns, columns, document type,
//! rights) against the spec, and the `CREATE TABLE` statements of the table and the state.

use std::fmt::Write as _;

use tokio_postgres::Client;

use super::session::Failure;
use super::sql::{key_list, qualified, spec_context, sql_type};
use crate::sql::{SNAPSHOT_COLUMN, STATE_TABLE, UPDATED_AT_COLUMN, quote};
use crate::{DbError, TableSpec};

/// An existing destination table.
pub(super) struct Existing {
    pub(super) oid: u32,
    /// Primary key columns in order: (name, type).
    key: Vec<(String, String)>,
    /// All columns: (name, type).
    columns: Vec<(String, String)>,
}

impl Existing {
    /// The same key columns (names, order, types) and the columns ddbpipe writes.
    pub(super) fn check(&self, spec: &TableSpec) -> Result<(), DbError> {
        let context = spec_context(spec);
        let wanted: Vec<(String, String)> = spec
            .key
            .iter()
            .map(|k| (k.name.clone(), sql_type(k.kind).to_string()))
            .collect();
        if self.key != wanted {
            let list = |cols: &[(String, String)]| {
                if cols.is_empty() {
                    "(none)".to_string()
                } else {
                    let cols: Vec<String> = cols
                        .iter()
                        .map(|(name, kind)| format!("{} {kind}", quote(name)))
                        .collect();
                    format!("({})", cols.join(", "))
                }
            };
            return Err(DbError::fatal(format!(
                "{context} exists with primary key {} but the source table's key needs {}; \
                 drop the table or set sink.table to another name",
                list(&self.key),
                list(&wanted)
            )));
        }
        let missing: Vec<String> = [
            spec.document_column.as_str(),
            SNAPSHOT_COLUMN,
            UPDATED_AT_COLUMN,
        ]
        .into_iter()
        .filter(|column| !self.columns.iter().any(|(name, _)| name == column))
        .map(quote)
        .collect();
        if !missing.is_empty() {
            return Err(DbError::fatal(format!(
                "{context} exists without the column(s) {} that ddbpipe writes; \
                 drop the table or set sink.table to another name",
                missing.join(", ")
            )));
        }
        let wanted = spec.document_type.name();
        if let Some((_, found)) = self
            .columns
            .iter()
            .find(|(name, kind)| *name == spec.document_column && kind != wanted)
        {
            return Err(DbError::fatal(format!(
                "{context} exists with document column {} of type {found} but \
                 sink.document_type is {wanted}; set sink.document_type to match the table, \
                 or drop it or set sink.table to another name",
                quote(&spec.document_column)
            )));
        }
        Ok(())
    }
}

/// A relation's oid and kind, when it exists.
pub(super) async fn relation(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<(u32, String)>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1::text AND c.relname = $2::text",
            &[&schema, &name],
        )
        .await?;
    row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .transpose()
}

/// The destination table's key and columns, when it exists.
pub(super) async fn inspect(
    client: &Client,
    spec: &TableSpec,
) -> Result<Option<Existing>, Failure> {
    let Some((oid, kind)) = relation(client, &spec.schema, &spec.table).await? else {
        return Ok(None);
    };
    if kind != "r" && kind != "p" {
        return Err(DbError::fatal(format!(
            "{} exists but is not a table (relkind '{kind}')",
            spec_context(spec)
        ))
        .into());
    }
    let key = client
        .query(
            "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod) \
             FROM pg_catalog.pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1::oid AND i.indisprimary ORDER BY k.ord",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    let columns = client
        .query(
            "SELECT attname::text, pg_catalog.format_type(atttypid, atttypmod) \
             FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    Ok(Some(Existing { oid, key, columns }))
}

/// Fails naming the rights (of SELECT, INSERT, UPDATE, DELETE) missing on a table. Each right
/// is checked alone: `has_table_privilege` with a list is true when *any* is held.
pub(super) async fn missing_rights(
    client: &Client,
    oid: u32,
    context: &str,
) -> Result<(), Failure> {
    let missing: Vec<String> = client
        .query(
            "SELECT r FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS r \
             WHERE NOT pg_catalog.has_table_privilege($1::oid, r)",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DbError::fatal(format!("{context}: no {} right(s)", missing.join(", "))).into())
    }
}

pub(super) fn create_table_sql(spec: &TableSpec) -> String {
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS {} (",
        qualified(&spec.schema, &spec.table)
    );
    for column in &spec.key {
        let _ = write!(
            sql,
            "{} {} NOT NULL, ",
            quote(&column.name),
            sql_type(column.kind)
        );
    }
    let _ = write!(
        sql,
        "{} {} NOT NULL, {} bigint, {} text NOT NULL, PRIMARY KEY ({}))",
        quote(&spec.document_column),
        spec.document_type.name(),
        quote(SNAPSHOT_COLUMN),
        quote(UPDATED_AT_COLUMN),
        key_list(spec)
    );
    sql
}

pub(super) fn create_state_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, part text NOT NULL, \
         value jsonb NOT NULL, updated_at text NOT NULL, PRIMARY KEY (pipeline, part))",
        qualified(schema, STATE_TABLE)
    )
}
