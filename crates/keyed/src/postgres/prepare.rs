//! What a run does first in the database, and `check`'s probe of it (docs/sinks.md §7.3,
//! docs/cli.md §8.2).
//!
//! # Writable session
//! Before creating anything, [`writable_session`] reads the session's settings and refuses, naming
//! the setting and what to do: a server in recovery (a standby: `pg_is_in_recovery()`), a
//! read-only session (`transaction_read_only`, from `default_transaction_read_only` on the role,
//! the database, the URL's `options` or `PGOPTIONS`), and a `statement_timeout` (other than 0)
//! below [`MIN_STATEMENT_TIMEOUT_MS`], which a batch's transaction cannot be sure to finish in.
//! The run would otherwise fail at its first write (or at a batch whose statement is cancelled,
//! which retrying cannot change).
//!
//! # The tables
//! [`create_tables`] is `prepare`'s DDL: the destination table (or the check of an existing
//! one, and what a table of an earlier ddbpipe lacks: `migrate`), the state and the deleted-key
//! tables. It also plans the document and typed columns of an existing table
//! (`crate::columns::plan`) and refuses what the plan refuses; the columns the plan adds are
//! added (and filled) by the run afterwards, in a transaction of their own (`fill`), which
//! `check` does not rehearse: it reports the plan instead. The run runs it on the connection; `check` runs the very same statements in a
//! transaction it rolls back, so whatever the run does first — a missing right, a lock it waits
//! for, a timeout — fails in `check` the same way, and `check` leaves nothing behind
//! (PostgreSQL's DDL is transactional). One exception: the conversion of `_ddbpipe_updated_at`
//! rewrites the table, so `check` only checks its values ([`Conversion::Validate`]) and says
//! that the run converts it.

use std::fmt::Write as _;

use tokio_postgres::{Client, GenericClient};

use super::migrate::{Conversion, convert_updated_at_sql};
use super::schema::{
    create_deleted_sql, create_state_sql, create_table_sql, ddl_locked, has_rows, inspect,
    may_alter, missing_rights, relation,
};
use super::session::Failure;
use super::sql::{qualified, spec_context, table_context};
use crate::columns::{ColumnPlan, records};
use crate::sql::{DELETED_TABLE, STATE_TABLE, row_count};
use crate::{DbError, TableSpec};

/// The lowest `statement_timeout` (milliseconds) a run accepts; 0 (no timeout) is accepted.
pub(super) const MIN_STATEMENT_TIMEOUT_MS: i64 = 1000;

/// SQLSTATE `query_canceled`: what a statement cut by `statement_timeout` fails with.
const QUERY_CANCELED: &str = "57014";

/// Fails unless this session may write for as long as a batch needs (see the module docs).
/// `server` names the server in the messages ("postgres host:port/db").
pub(super) async fn writable_session<C: GenericClient + Sync>(
    client: &C,
    server: &str,
) -> Result<(), Failure> {
    let timeout_fix = "raise it to 1s or more, or set it to 0, where it is set (ALTER ROLE … \
                       SET statement_timeout, ALTER DATABASE … SET statement_timeout, the \
                       URL's options or PGOPTIONS)";
    let row = match client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(), \
                    pg_catalog.current_setting('transaction_read_only'), \
                    (SELECT setting::bigint FROM pg_catalog.pg_settings \
                     WHERE name = 'statement_timeout'), \
                    pg_catalog.current_setting('statement_timeout')",
            &[],
        )
        .await
    {
        Ok(row) => row,
        // Even this one small query was cut short: the timeout is the problem.
        Err(e) if e.code().is_some_and(|code| code.code() == QUERY_CANCELED) => {
            return Err(DbError::fatal(format!(
                "{server}: the session's statement_timeout cancelled even the first query; \
                 {timeout_fix}"
            ))
            .into());
        }
        Err(e) => return Err(e.into()),
    };
    let in_recovery: bool = row.try_get(0)?;
    let read_only: String = row.try_get(1)?;
    let timeout_ms: Option<i64> = row.try_get(2)?;
    let timeout_shown: String = row.try_get(3)?;
    if in_recovery {
        return Err(DbError::fatal(format!(
            "{server}: the server is a standby in recovery (pg_is_in_recovery() is true) and \
             accepts no writes; point sink.url at the primary"
        ))
        .into());
    }
    if read_only == "on" {
        return Err(DbError::fatal(format!(
            "{server}: the session is read-only (transaction_read_only = on) and cannot create \
             or write ddbpipe's tables; remove default_transaction_read_only from the role \
             (ALTER ROLE … RESET default_transaction_read_only), the database, the URL's \
             options or PGOPTIONS, or point sink.url at a writable server"
        ))
        .into());
    }
    if let Some(ms) = timeout_ms
        && ms > 0
        && ms < MIN_STATEMENT_TIMEOUT_MS
    {
        return Err(DbError::fatal(format!(
            "{server}: statement_timeout is {timeout_shown}, below the 1s a batch's statements \
             may need (a cancelled statement fails the run); {timeout_fix}"
        ))
        .into());
    }
    Ok(())
}

/// `prepare`'s DDL on `client` (the connection, or `check`'s transaction that it rolls back):
/// creates or checks the destination table, brings a table of an earlier ddbpipe up to date
/// (the version columns; `_ddbpipe_updated_at` converted, or only checked: `conversion`), and
/// creates the state and deleted-key tables. Returns the plan of the table's document and
/// typed columns, having refused what it refuses.
pub(super) async fn create_tables<'s, C: GenericClient + Sync>(
    client: &C,
    spec: &'s TableSpec,
    conversion: Conversion,
) -> Result<ColumnPlan<'s>, Failure> {
    let context = spec_context(spec);
    let existing = match inspect(client, spec).await? {
        Some(existing) => existing,
        None if !spec.create_table => {
            return Err(DbError::fatal(format!(
                "{context} does not exist and create_table is false"
            ))
            .into());
        }
        None => {
            client
                .batch_execute(&ddl_locked(&spec.schema, &create_table_sql(spec)))
                .await?;
            // Re-read what is there: another run may have created it meanwhile.
            inspect(client, spec).await?.ok_or_else(|| {
                DbError::fatal(format!("{context} is missing right after CREATE TABLE"))
            })?
        }
    };
    existing.check(spec)?;
    let plan = existing.plan(spec, has_rows(client, spec).await?);
    if let Some(refused) = plan.refused() {
        return Err(DbError::fatal(format!("{context}: {refused}")).into());
    }
    // A table of an earlier ddbpipe: its rows keep null versions.
    for alter in existing.add_version_columns_sql(spec) {
        client.batch_execute(&alter).await?;
    }
    if existing.updated_at_is_text() {
        client
            .batch_execute(&convert_updated_at_sql(spec, existing.oid, conversion))
            .await?;
    }
    let shared = format!(
        "{}; {}",
        create_state_sql(&spec.schema),
        create_deleted_sql(&spec.schema)
    );
    client
        .batch_execute(&ddl_locked(&spec.schema, &shared))
        .await?;
    Ok(plan)
}

/// `check`'s probe: the session ([`writable_session`]), the schema's rights, the table against
/// the spec and the rights on it and on ddbpipe's own tables (each named when missing), then
/// [`create_tables`] in a transaction that is rolled back. Returns what it found.
pub(super) async fn probe(
    client: &mut Client,
    spec: &TableSpec,
    server: &str,
) -> Result<String, Failure> {
    writable_session(&*client, server).await?;
    let detail = probe_rights(client, spec).await?;
    let tx = client.transaction().await?;
    let tried = create_tables(&tx, spec, Conversion::Validate).await;
    // Whatever the DDL did is undone; a failed rollback only means the transaction is gone.
    let _ = tx.rollback().await;
    tried?;
    Ok(detail)
}

/// The catalog half of [`probe`]: clear messages for the rights the DDL would trip on.
async fn probe_rights(client: &Client, spec: &TableSpec) -> Result<String, Failure> {
    let context = spec_context(spec);
    let display = format!("{}.{}", spec.schema, spec.table);
    let schema_oid: Option<u32> = client
        .query_opt(
            "SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1::text",
            &[&spec.schema],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    let Some(schema_oid) = schema_oid else {
        return Err(DbError::fatal(format!(
            "{context}: schema '{}' does not exist",
            spec.schema
        ))
        .into());
    };
    let schema_rights = |right: &'static str| async move {
        let row = client
            .query_one(
                "SELECT pg_catalog.has_schema_privilege($1::oid, $2::text)",
                &[&schema_oid, &right],
            )
            .await?;
        row.try_get::<_, bool>(0)
    };
    if !schema_rights("USAGE").await? {
        return Err(DbError::fatal(format!(
            "{context}: no USAGE right on schema '{}'",
            spec.schema
        ))
        .into());
    }
    let can_create = schema_rights("CREATE").await?;
    let detail = match inspect(client, spec).await? {
        Some(existing) => {
            existing.check(spec)?;
            missing_rights(client, existing.oid, &context).await?;
            let plan = existing.plan(spec, has_rows(client, spec).await?);
            if let Some(refused) = plan.refused() {
                return Err(DbError::fatal(format!("{context}: {refused}")).into());
            }
            let alterations = existing.alterations(spec, &plan);
            for &alteration in &alterations {
                may_alter(client, existing.oid, &context, alteration).await?;
            }
            let rows: i64 = client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {}",
                        qualified(&spec.schema, &spec.table)
                    ),
                    &[],
                )
                .await?
                .try_get(0)?;
            let mut detail = format!("table '{display}' exists, {} row(s)", row_count(rows));
            for alteration in alterations {
                let _ = write!(detail, "; {}", alteration.describe());
            }
            for note in plan.check(spec).notes {
                let _ = write!(detail, "; {note}");
            }
            detail
        }
        None if !spec.create_table => {
            return Err(DbError::fatal(format!(
                "{context} does not exist and create_table is false"
            ))
            .into());
        }
        None if !can_create => {
            return Err(DbError::fatal(format!(
                "{context} does not exist and there is no CREATE right on schema '{}' to create it",
                spec.schema
            ))
            .into());
        }
        None => format!("table '{display}' will be created"),
    };
    // The typed columns' record is written when there are typed columns (`fill`).
    let record = (!spec.columns.is_empty()).then_some(records::COLUMNS_TABLE);
    for own in [STATE_TABLE, DELETED_TABLE].into_iter().chain(record) {
        let own_context = table_context(&spec.schema, own);
        match relation(client, &spec.schema, own).await? {
            Some((oid, _)) => missing_rights(client, oid, &own_context).await?,
            None if !can_create => {
                return Err(DbError::fatal(format!(
                    "{own_context} does not exist and there is no CREATE right on schema '{}' to create it",
                    spec.schema
                ))
                .into());
            }
            None => {}
        }
    }
    Ok(detail)
}
