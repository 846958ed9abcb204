//! Adding the document and typed columns a destination table lacks, filling the typed ones
//! for its rows from their documents, refilling those whose values another definition wrote,
//! and recording what they hold (`crate::columns`, plan rules 4 and 7; docs/sinks.md §7.9).
//!
//! # Rules
//! 1. One transaction: `LOCK TABLE … IN ACCESS EXCLUSIVE MODE`, the table inspected and
//!    planned again under the lock (a worker that started at the same time waits here, then
//!    finds the columns added and adds nothing), `ALTER TABLE … ADD COLUMN` of each column the
//!    plan adds, the fill, the columns' record, `COMMIT`. Any failure rolls all of it back.
//! 2. A refilled column is first set to NULL in every row that has a value (before the rows
//!    are read, so the `ctid`s read are those of the rows as they are then). The fill reads every row's `ctid`, key and document through a portal, [`FILL_ROWS`] at a
//!    time, and converts each document with the sink's `TypedColumns`: the conversion the
//!    writes use (PostgreSQL's U+0000 rule included), never one in SQL. Rows with a value for
//!    some added column are copied as text (`COPY` text format) into a temporary table
//!    (`ON COMMIT DROP`); one `UPDATE t SET "c" = s.c0::text::<type>, … FROM stage s WHERE
//!    t.ctid = s.tid` then writes them all. The lock keeps every `ctid` in place until the
//!    commit.
//! 3. A mismatch follows `on_type_mismatch`: NULL (counted, the first logged), or under
//!    `fail` the run stops naming the row's key and the column, and nothing is changed.

use bytes::{BufMut as _, BytesMut};
use futures_util::{SinkExt as _, pin_mut};
use tokio_postgres::{Client, Transaction};

use super::copy_text;
use super::document;
use super::schema::{has_rows, inspect, record};
use super::session::Failure;
use super::sql::{column_cast, column_type, qualified, spec_context};
use crate::columns::ColumnPlan;
use crate::sql::{describe_key, quote};
use crate::{DbError, KeyType, KeyValue, TableSpec, TypedColumns};

/// Rows read from the portal at once (rule 2).
pub(super) const FILL_ROWS: i32 = 10_000;

/// The temporary table of the fill (rule 2).
const STAGE: &str = "_ddbpipe_fill";

/// Adds the columns the table lacks and fills them (rules 1–3) in one transaction on
/// `client`; `columns` reads the documents (`None`: a fill is refused).
pub(super) async fn add_columns(
    client: &mut Client,
    spec: &TableSpec,
    columns: Option<&TypedColumns>,
) -> Result<(), Failure> {
    let context = spec_context(spec);
    let table = qualified(&spec.schema, &spec.table);
    let tx = client.transaction().await?;
    tx.batch_execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .await?;
    let existing = inspect(&tx, spec)
        .await?
        .ok_or_else(|| DbError::fatal(format!("{context} is gone")))?;
    let plan = existing.plan(spec, has_rows(&tx, spec).await?);
    if let Some(refused) = plan.refused() {
        return Err(DbError::fatal(format!("{context}: {refused}")).into());
    }
    if plan.add_document
        && let Some(document) = &spec.document_column
    {
        tx.batch_execute(&format!(
            "ALTER TABLE {table} ADD COLUMN {} {} NOT NULL",
            quote(document),
            spec.document_type.name()
        ))
        .await?;
    }
    for column in &plan.added {
        tx.batch_execute(&format!(
            "ALTER TABLE {table} ADD COLUMN {} {}",
            quote(&column.name),
            column_type(column.kind)
        ))
        .await?;
    }
    if let Some(document) = spec.document_column.as_deref().filter(|_| plan.fill) {
        let Some(columns) = columns else {
            return Err(DbError::fatal(format!(
                "{context}: columns are to be filled for the table's rows, which needs the \
                 reader of their documents (Database::prepare_with)"
            ))
            .into());
        };
        let filled = fill(&tx, spec, document, &plan, columns).await?;
        tracing::info!(
            table = %context,
            added = plan.added.len(),
            refilled = plan.refilled.len(),
            rows = filled,
            "Filled typed columns from the rows' documents."
        );
    }
    if plan.record {
        record(&tx, spec).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Fills the columns `plan` adds or refills from the document column `document` (rule 2);
/// the rows that got a value.
async fn fill(
    tx: &Transaction<'_>,
    spec: &TableSpec,
    document: &str,
    plan: &ColumnPlan<'_>,
    columns: &TypedColumns,
) -> Result<u64, Failure> {
    let context = spec_context(spec);
    let filled = plan.filled();
    let names: Vec<&str> = filled.iter().map(|c| c.name.as_str()).collect();
    let only = columns.only(&names);
    if !plan.refilled.is_empty() {
        let table = qualified(&spec.schema, &spec.table);
        let refilled = plan.refilled.iter().map(|(column, _)| quote(&column.name));
        let refilled: Vec<String> = refilled.collect();
        let set: Vec<String> = refilled.iter().map(|c| format!("{c} = NULL")).collect();
        let any: Vec<String> = refilled
            .iter()
            .map(|c| format!("{c} IS NOT NULL"))
            .collect();
        tx.batch_execute(&format!(
            "UPDATE {table} SET {} WHERE {}",
            set.join(", "),
            any.join(" OR ")
        ))
        .await?;
    }
    let stage_columns: Vec<String> = (0..only.reader().columns().len())
        .map(|i| format!("c{i}"))
        .collect();
    tx.batch_execute(&format!(
        "CREATE TEMP TABLE {STAGE} (tid tid{}) ON COMMIT DROP",
        stage_columns
            .iter()
            .map(|c| format!(", {c} text"))
            .collect::<String>()
    ))
    .await?;
    let keys: Vec<String> = spec
        .key
        .iter()
        .map(|k| match k.kind {
            KeyType::S | KeyType::B => quote(&k.name),
            KeyType::N => format!("{}::text", quote(&k.name)),
        })
        .collect();
    let select = format!(
        "SELECT ctid::text, {}::text, {} FROM {}",
        quote(document),
        keys.join(", "),
        qualified(&spec.schema, &spec.table)
    );
    let statement = tx.prepare(&select).await?;
    let portal = tx.bind(&statement, &[]).await?;
    let mut staged = 0u64;
    loop {
        let rows = tx.query_portal(&portal, FILL_ROWS).await?;
        if rows.is_empty() {
            break;
        }
        let mut chunk = BytesMut::new();
        for row in &rows {
            let tid: &str = row.try_get(0)?;
            let text: &str = row.try_get(1)?;
            let key = || describe_key(&spec.key, &row_key(spec, row));
            let values = only
                .values(text, document::stores, key)
                .map_err(|message| not_filled(&context, &names, &message))?;
            if values.iter().all(|v| matches!(v, crate::ColumnValue::Null)) {
                continue;
            }
            copy_text::text(&mut chunk, tid);
            for value in &values {
                chunk.put_u8(b'\t');
                copy_text::text_or_null(&mut chunk, value.sql_text().as_deref());
            }
            chunk.put_u8(b'\n');
            staged += 1;
        }
        if chunk.is_empty() {
            continue;
        }
        let sink = tx
            .copy_in::<_, bytes::Bytes>(&format!("COPY {STAGE} FROM STDIN"))
            .await?;
        pin_mut!(sink);
        sink.send(chunk.freeze()).await?;
        sink.as_mut().finish().await?;
    }
    if staged == 0 {
        return Ok(0);
    }
    let set: Vec<String> = only
        .reader()
        .columns()
        .iter()
        .zip(&stage_columns)
        .map(|(column, staged)| {
            format!(
                "{} = s.{staged}{}",
                quote(&column.name),
                column_cast(column.kind)
            )
        })
        .collect();
    let updated = tx
        .execute(
            &format!(
                "UPDATE {} AS t SET {} FROM {STAGE} s WHERE t.ctid = s.tid",
                qualified(&spec.schema, &spec.table),
                set.join(", ")
            ),
            &[],
        )
        .await?;
    Ok(updated)
}

/// The key of a row the fill read (columns 2…, for messages).
fn row_key(spec: &TableSpec, row: &tokio_postgres::Row) -> Vec<KeyValue> {
    spec.key
        .iter()
        .enumerate()
        .map(|(i, k)| match k.kind {
            KeyType::S => KeyValue::S(row.try_get(i + 2).unwrap_or_default()),
            KeyType::N => KeyValue::N(row.try_get(i + 2).unwrap_or_default()),
            KeyType::B => KeyValue::B(row.try_get(i + 2).unwrap_or_default()),
        })
        .collect()
}

/// The refusal of a fill a mismatch stopped (rule 3).
fn not_filled(context: &str, names: &[&str], message: &str) -> Failure {
    let names: Vec<String> = names.iter().map(|name| quote(name)).collect();
    DbError::fatal(format!(
        "{context}: the column(s) {} could not be filled for the table's rows from their \
         documents (nothing was changed): {message}",
        names.join(", ")
    ))
    .into()
}
