//! The schema: inspecting an existing destination table (key columns, columns, document type,
//! rights) against the spec, the `CREATE TABLE` statements of the table, the state and the
//! deleted-key markers, what a table of an earlier ddbpipe lacks (the version columns, a
//! `timestamptz` `_ddbpipe_updated_at`: `migrate`), and the plan of its document and typed
//! columns (`crate::columns::plan`, carried out by `fill`).

use std::fmt::Write as _;

use tokio_postgres::GenericClient;

use super::session::Failure;
use super::sql::{column_type, key_list, qualified, spec_context, sql_type};
use crate::columns::{ColumnPlan, Naming, Recorded, TableColumn, plan, records};
use crate::sql::{
    DELETED_TABLE, SNAPSHOT_COLUMN, STATE_TABLE, UPDATED_AT_COLUMN, VERSION_MS_COLUMN,
    VERSION_SEQ_COLUMN, quote,
};

/// The version columns (docs/mirror.md §5.6) with their types; a table created by an earlier
/// ddbpipe lacks them and gets them from `prepare`.
const VERSION_COLUMNS: [(&str, &str); 2] =
    [(VERSION_MS_COLUMN, "bigint"), (VERSION_SEQ_COLUMN, "text")];
use crate::{DbError, TableSpec};

/// The type of `_ddbpipe_updated_at` this version creates and writes (as `format_type` names it).
pub(super) const UPDATED_AT_TYPE: &str = "timestamp with time zone";
/// The type earlier versions created it with: `prepare` converts it (`migrate`).
const OLD_UPDATED_AT_TYPE: &str = "text";

/// What `prepare` changes in a table of an earlier ddbpipe (`ALTER TABLE`, owner only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alteration {
    /// Adds the version columns.
    VersionColumns,
    /// Converts `_ddbpipe_updated_at` from `text` to `timestamptz`.
    UpdatedAtType,
    /// Adds the document or typed columns the table lacks (`crate::columns::plan`).
    Columns,
}

impl Alteration {
    /// What `check` says the run will do.
    pub(super) fn describe(self) -> &'static str {
        match self {
            Alteration::VersionColumns => {
                "run adds the version columns _ddbpipe_version_ms and _ddbpipe_version_seq"
            }
            Alteration::UpdatedAtType => {
                "run converts _ddbpipe_updated_at from text to timestamptz (a rewrite of the \
                 table under an exclusive lock; its times keep their instant, UTC where a value \
                 has no offset)"
            }
            Alteration::Columns => "run adds the column(s) below",
        }
    }

    /// What the owner does by hand, for the message when this role may not.
    fn by_hand(self) -> String {
        match self {
            Alteration::VersionColumns => format!(
                "lacks the columns {VERSION_MS_COLUMN} and {VERSION_SEQ_COLUMN} (written by an \
                 earlier ddbpipe) and only its owner can add them; run ddbpipe once as the \
                 owner, or add them: {VERSION_MS_COLUMN} bigint, {VERSION_SEQ_COLUMN} text"
            ),
            Alteration::UpdatedAtType => format!(
                "has {UPDATED_AT_COLUMN} of type text (written by an earlier ddbpipe), which \
                 this version converts to timestamptz, and only its owner can; run ddbpipe once \
                 as the owner, or convert it: ALTER TABLE … ALTER COLUMN {UPDATED_AT_COLUMN} \
                 TYPE timestamptz USING {UPDATED_AT_COLUMN}::timestamptz"
            ),
            Alteration::Columns => "lacks columns of sink.columns (or the document column) \
                 and only its owner can add them; run ddbpipe once as the owner, or add them \
                 yourself (the types are in docs/sinks.md §7.9)"
                .to_string(),
        }
    }
}

/// How PostgreSQL names and compares columns (`columns` rule 6): quoted names exactly, types
/// as `format_type` writes them.
pub(super) const NAMING: Naming = Naming {
    same: |a, b| a == b,
    type_name: column_type,
};

/// An existing destination table.
pub(super) struct Existing {
    pub(super) oid: u32,
    /// Primary key columns in order: (name, type).
    key: Vec<(String, String)>,
    /// All columns, with their types as `format_type` writes them.
    columns: Vec<TableColumn>,
    /// What its typed columns hold (`crate::columns::records`).
    recorded: Vec<Recorded>,
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
        let missing: Vec<String> = [SNAPSHOT_COLUMN, UPDATED_AT_COLUMN]
            .into_iter()
            .filter(|column| !self.has(column))
            .map(quote)
            .collect();
        if !missing.is_empty() {
            return Err(DbError::fatal(format!(
                "{context} exists without the column(s) {} that ddbpipe writes; \
                 drop the table or set sink.table to another name",
                missing.join(", ")
            )));
        }
        if let Some(found) = self
            .type_of(UPDATED_AT_COLUMN)
            .filter(|kind| *kind != UPDATED_AT_TYPE && *kind != OLD_UPDATED_AT_TYPE)
        {
            return Err(DbError::fatal(format!(
                "{context} exists with {} of type {found}, but ddbpipe writes timestamptz there \
                 (and converts the text of earlier versions); alter the column to timestamptz, \
                 or drop the table or set sink.table to another name",
                quote(UPDATED_AT_COLUMN)
            )));
        }
        let wanted = spec.document_type.name();
        if let Some(document) = &spec.document_column
            && let Some(found) = self.type_of(document).filter(|kind| *kind != wanted)
        {
            return Err(DbError::fatal(format!(
                "{context} exists with document column {} of type {found} but \
                 sink.document_type is {wanted}; set sink.document_type to match the table, \
                 or drop it or set sink.table to another name",
                quote(document)
            )));
        }
        Ok(())
    }

    /// Whether the table has the column `name`.
    fn has(&self, name: &str) -> bool {
        self.type_of(name).is_some()
    }

    /// The type of the column `name`, when the table has it.
    fn type_of(&self, name: &str) -> Option<&str> {
        let column = self.columns.iter().find(|column| column.name == name)?;
        Some(&column.type_name)
    }

    /// The plan of `spec`'s document and typed columns over this table, holding rows when
    /// `has_rows` (`crate::columns::plan`).
    pub(super) fn plan<'s>(&self, spec: &'s TableSpec, has_rows: bool) -> ColumnPlan<'s> {
        plan(spec, &self.columns, &self.recorded, has_rows, NAMING)
    }

    /// What `prepare` changes in this table (nothing for a table of this version), its
    /// columns' plan being `plan`.
    pub(super) fn alterations(&self, spec: &TableSpec, plan: &ColumnPlan<'_>) -> Vec<Alteration> {
        let mut alterations = Vec::new();
        if plan.adds() {
            alterations.push(Alteration::Columns);
        }
        if !self.add_version_columns_sql(spec).is_empty() {
            alterations.push(Alteration::VersionColumns);
        }
        if self.updated_at_is_text() {
            alterations.push(Alteration::UpdatedAtType);
        }
        alterations
    }

    /// `_ddbpipe_updated_at` is the `text` of an earlier ddbpipe (`migrate`).
    pub(super) fn updated_at_is_text(&self) -> bool {
        self.type_of(UPDATED_AT_COLUMN) == Some(OLD_UPDATED_AT_TYPE)
    }

    /// `ALTER TABLE … ADD COLUMN IF NOT EXISTS` for each version column the table lacks (none
    /// for a table of this version).
    pub(super) fn add_version_columns_sql(&self, spec: &TableSpec) -> Vec<String> {
        VERSION_COLUMNS
            .iter()
            .filter(|(name, _)| !self.has(name))
            .map(|(name, kind)| {
                format!(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {kind}",
                    qualified(&spec.schema, &spec.table),
                    quote(name)
                )
            })
            .collect()
    }
}

/// A relation's oid and kind, when it exists.
pub(super) async fn relation<C: GenericClient + Sync>(
    client: &C,
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
pub(super) async fn inspect<C: GenericClient + Sync>(
    client: &C,
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
            "SELECT attname::text, pg_catalog.format_type(atttypid, atttypmod), \
             attnotnull AND NOT atthasdef AND attidentity = '' AND attgenerated = '' \
             FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(TableColumn {
                name: row.try_get(0)?,
                type_name: row.try_get(1)?,
                required: row.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    let recorded = recorded(client, spec).await?;
    Ok(Some(Existing {
        oid,
        key,
        columns,
        recorded,
    }))
}

/// The typed columns recorded for `spec`'s table (`crate::columns::records`); none before the
/// record table exists.
async fn recorded<C: GenericClient + Sync>(
    client: &C,
    spec: &TableSpec,
) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    if relation(client, &spec.schema, records::COLUMNS_TABLE)
        .await?
        .is_none()
    {
        return Ok(Vec::new());
    }
    let table = qualified(&spec.schema, records::COLUMNS_TABLE);
    let rows = client
        .query(&records::select_sql(&table), &[&spec.table])
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Recorded {
                name: row.try_get(0)?,
                definition: row.try_get(1)?,
            })
        })
        .collect()
}

/// Records `spec`'s typed columns as what its table's columns hold, replacing the record.
pub(super) async fn record<C: GenericClient + Sync>(
    client: &C,
    spec: &TableSpec,
) -> Result<(), tokio_postgres::Error> {
    let table = qualified(&spec.schema, records::COLUMNS_TABLE);
    client.batch_execute(&records::create_sql(&table)).await?;
    client
        .execute(&records::delete_sql(&table), &[&spec.table])
        .await?;
    let insert = client.prepare(&records::insert_sql(&table)).await?;
    for (name, definition) in records::rows(&spec.columns) {
        client
            .execute(&insert, &[&spec.table, &name, &definition])
            .await?;
    }
    Ok(())
}

/// Whether the destination table (which exists) has a row.
pub(super) async fn has_rows<C: GenericClient + Sync>(
    client: &C,
    spec: &TableSpec,
) -> Result<bool, tokio_postgres::Error> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {})",
        qualified(&spec.schema, &spec.table)
    );
    client.query_one(&sql, &[]).await?.try_get(0)
}

/// Fails naming the rights (of SELECT, INSERT, UPDATE, DELETE) missing on a table. Each right
/// is checked alone: `has_table_privilege` with a list is true when *any* is held.
pub(super) async fn missing_rights<C: GenericClient + Sync>(
    client: &C,
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

/// Fails unless this role may alter the table (`ALTER TABLE` needs its owner) as `alteration`
/// says: what `prepare` does to a table of an earlier ddbpipe.
pub(super) async fn may_alter<C: GenericClient + Sync>(
    client: &C,
    oid: u32,
    context: &str,
    alteration: Alteration,
) -> Result<(), Failure> {
    let owner: bool = client
        .query_one(
            "SELECT pg_catalog.pg_has_role(relowner, 'USAGE') FROM pg_catalog.pg_class \
             WHERE oid = $1::oid",
            &[&oid],
        )
        .await?
        .try_get(0)?;
    if owner {
        Ok(())
    } else {
        Err(DbError::fatal(format!("{context} {}", alteration.by_hand())).into())
    }
}

/// `sql` (ddbpipe's `CREATE TABLE IF NOT EXISTS` statements) behind a transaction advisory
/// lock of `schema`. Sent as one simple query its statements are one transaction (inside an
/// open one, the lock lasts until that ends), so two sessions creating one table at once — the
/// tables of one pipeline file, pipelines started together — wait for each other instead of
/// one failing with a unique violation in `pg_type`. The key is no pipeline's run lock:
/// `:ddl` is no pipeline name.
pub(super) fn ddl_locked(schema: &str, sql: &str) -> String {
    let key = super::session::lock_key(schema, ":ddl");
    format!("SELECT pg_catalog.pg_advisory_xact_lock({key}); {sql}")
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
    if let Some(document) = &spec.document_column {
        let _ = write!(
            sql,
            "{} {} NOT NULL, ",
            quote(document),
            spec.document_type.name()
        );
    }
    for column in &spec.columns {
        let _ = write!(
            sql,
            "{} {}, ",
            quote(&column.name),
            column_type(column.kind)
        );
    }
    let _ = write!(
        sql,
        "{} bigint, {} timestamptz NOT NULL, ",
        quote(SNAPSHOT_COLUMN),
        quote(UPDATED_AT_COLUMN),
    );
    for (name, kind) in VERSION_COLUMNS {
        let _ = write!(sql, "{} {kind}, ", quote(name));
    }
    let _ = write!(sql, "PRIMARY KEY ({}))", key_list(spec));
    sql
}

pub(super) fn create_deleted_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (table_name text NOT NULL, key_text text NOT NULL, \
         version_ms bigint, PRIMARY KEY (table_name, key_text))",
        qualified(schema, DELETED_TABLE)
    )
}

pub(super) fn create_state_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, part text NOT NULL, \
         value jsonb NOT NULL, updated_at text NOT NULL, PRIMARY KEY (pipeline, part)); \
         CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, unit text NOT NULL, \
         counter bigint NOT NULL, position text, PRIMARY KEY (pipeline, unit))",
        qualified(schema, STATE_TABLE),
        qualified(schema, crate::FENCE_TABLE)
    )
}
