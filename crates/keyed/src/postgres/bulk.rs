//! Batches of upserts through `COPY` (docs/sinks.md §7.3): a snapshot's pages and a scan's
//! items reach PostgreSQL at the speed of `COPY`, not of one statement per row.
//!
//! # Rules
//! 1. A batch goes this way when every row change is an upsert of one kind (`Write::Upsert`,
//!    `Write::UpsertMarked` of one snapshot, or `Write::UpsertUnlessNewer` of one snapshot and
//!    read time) and no key occurs twice in it; or when it holds stream changes only —
//!    `Upsert` and `Delete`, or, with a snapshot open, `UpsertMarked` of that snapshot and
//!    `DeleteMarked` — in any order (rule 5). A batch with a repair's changes takes the per-row
//!    statements.
//! 2. The rows are copied (`COPY … FROM STDIN (FORMAT binary)`) into a session's temporary
//!    staging table (`ON COMMIT DELETE ROWS`, created once per connection): the key values as
//!    text (`S`, and `N` as its exact text) or bytes, the document as text (null when the table
//!    keeps none), each typed column's value as text (`ColumnValue::sql_text`), the version,
//!    and for guarded snapshot rows the key text of the deleted-key markers.
//! 3. One `INSERT … SELECT … FROM` the staging table `ON CONFLICT … DO UPDATE` then writes them,
//!    with exactly the casts, the conflict update and the guards of the per-row statement of
//!    that kind (`sql::upsert_sql`): `N` keys cast to `numeric` by the server, documents to the
//!    document type, typed columns to theirs, deleted-key markers and stream-written rows holding back snapshot rows.
//! 4. The staging rows, the merge and the state parts are one transaction with the batch, as
//!    on the per-row path.
//! 5. Stream changes: ddbpipe stages each key's **last** change of the batch only (the key
//!    compared by its text, as deleted-key markers are): a delete (`op` 1) deletes the row, an
//!    upsert (`op` 0) writes its document and version. With a snapshot open, every key the
//!    batch deletes also leaves one deleted-key marker, at the newest time of its deletes (null
//!    counting as newest, as the per-row marker statement keeps): on its last change's staged
//!    row when that is a delete, else on a marker-only row (`op` 2) that neither deletes nor
//!    writes. That is the state applying the changes one by one leaves — the same rows,
//!    documents, versions and markers — except that a key deleted and upserted again in one
//!    batch without a snapshot open keeps its old snapshot marker instead of null, which no
//!    cleanup tells apart (only the open snapshot's id counts there). Choosing the last change
//!    here spares the server a sort of the batch; each destination row is touched once.
//! 6. Straight into the destination: a batch of upserts of one kind with distinct keys whose
//!    keys are all new to the table is copied into the destination itself (`COPY`'s text
//!    format, `copy_text`), with the columns the merge would have inserted. That is the merge's
//!    result exactly when no key is in the table yet and, for snapshot rows read beside the
//!    stream (`UpsertUnlessNewer`), the table has no deleted-key marker at all (asked just before
//!    the batch; the pipeline's lock makes the run the table's only writer). A key already present fails the copy with a unique violation:
//!    the transaction is rolled back and the batch goes through the staging table (rules 2–3);
//!    the session then stages that table's batches for the rest of its life, since a table
//!    with rows tends to keep meeting them (a resnapshot, a scan run again).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use bytes::{BufMut as _, BytesMut};
use futures_util::{SinkExt as _, pin_mut};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement, Transaction};

use super::session::{Failure, fnv1a};
use super::sql::{UPDATED_AT_CAST, column_cast, conflict_set, key_list, qualified, upsert_columns};
use super::{copy_binary, copy_text, document};
use crate::sql::{
    DELETED_TABLE, SNAPSHOT_COLUMN, VERSION_MS_COLUMN, VERSION_SEQ_COLUMN, Write, quote, row_key,
};
use crate::{ColumnValue, KeyType, KeyValue, RowChange, TableSpec};

/// The one kind of upsert of a batch that goes through `COPY` (rule 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bulk {
    /// Plain upserts: the marker is left as it is.
    Change,
    /// Upserts marking their rows with a snapshot id.
    Marked {
        /// The snapshot id.
        id: i64,
    },
    /// Snapshot rows read at one time, written unless the stream has something newer.
    UnlessNewer {
        /// The snapshot id.
        id: i64,
        /// The cutoff of their read time.
        cutoff_ms: i64,
    },
    /// Stream upserts and deletes in any order (rule 5); with a snapshot open, marked with its
    /// id and leaving deleted-key markers.
    Changes {
        /// The open snapshot's id.
        marked: Option<i64>,
    },
}

impl Bulk {
    /// Whether this kind may go straight into the destination (rule 6).
    pub(super) fn direct(self) -> bool {
        !matches!(self, Bulk::Changes { .. })
    }

    /// The bulk kind of `writes` (of `rows`, planned with `snapshot_id` open), when the batch
    /// qualifies (rule 1).
    pub(super) fn of(
        rows: &[RowChange],
        writes: &[Write<'_>],
        snapshot_id: Option<i64>,
    ) -> Option<Bulk> {
        let first = match writes.first()? {
            Write::Upsert { .. } => Bulk::Change,
            Write::UpsertMarked { id, .. } => Bulk::Marked { id: *id },
            Write::UpsertUnlessNewer { id, cutoff_ms, .. } => Bulk::UnlessNewer {
                id: *id,
                cutoff_ms: *cutoff_ms,
            },
            _ => Bulk::Changes {
                marked: snapshot_id,
            },
        };
        let same = writes.iter().all(|write| match (write, first) {
            (Write::Upsert { .. }, Bulk::Change)
            | (Write::UpsertMarked { .. }, Bulk::Marked { .. }) => true,
            (
                Write::UpsertUnlessNewer { cutoff_ms, .. },
                Bulk::UnlessNewer {
                    cutoff_ms: cutoff, ..
                },
            ) => *cutoff_ms == cutoff,
            _ => false,
        });
        let mut keys = HashSet::with_capacity(rows.len());
        if same && rows.iter().all(|row| keys.insert(row_key(row))) {
            return Some(first);
        }
        // Stream changes (rule 5): `plan` gave every upsert and delete of the batch the same
        // snapshot state, marked exactly when a snapshot is open.
        let changes = writes.iter().all(|write| {
            matches!(
                write,
                Write::Upsert { .. }
                    | Write::Delete
                    | Write::UpsertMarked { .. }
                    | Write::DeleteMarked { .. }
            )
        });
        changes.then_some(Bulk::Changes {
            marked: snapshot_id,
        })
    }
}

/// The staging table of `spec` in this session: named after the destination and its columns,
/// so two destinations of one connection (or two shapes of one) do not share one.
fn stage_name(spec: &TableSpec) -> String {
    let typed = spec.columns.iter().flat_map(|c| {
        let kind = c.kind.name().bytes();
        c.name.bytes().chain([0]).chain(kind).chain([0])
    });
    let document = spec
        .document_column
        .iter()
        .flat_map(|d| d.bytes().chain([0]));
    let hash = fnv1a(
        spec.schema
            .bytes()
            .chain([0])
            .chain(spec.table.bytes())
            .chain([0])
            .chain(spec.key.iter().flat_map(|k| k.name.bytes().chain([0])))
            .chain([1])
            .chain(document)
            .chain([1])
            .chain(typed),
    );
    format!("_ddbpipe_stage_{hash:016x}")
}

/// The staging table's columns of the typed columns (`c0`, `c1`, …, text).
fn stage_columns(spec: &TableSpec) -> String {
    (0..spec.columns.len()).map(|i| format!("c{i}, ")).collect()
}

fn stage_type(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S | KeyType::N => "text",
        KeyType::B => "bytea",
    }
}

/// `CREATE TEMP TABLE` of the staging table (rule 2).
fn create_stage_sql(spec: &TableSpec) -> String {
    let mut columns = String::new();
    for (i, key) in spec.key.iter().enumerate() {
        let _ = write!(columns, "k{i} {}, ", stage_type(key.kind));
    }
    let _ = write!(columns, "doc text, ");
    for i in 0..spec.columns.len() {
        let _ = write!(columns, "c{i} text, ");
    }
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS {} ({columns}vms bigint, vseq text, \
         key_text text, op smallint) ON COMMIT DELETE ROWS",
        quote(&stage_name(spec))
    )
}

fn copy_sql(spec: &TableSpec) -> String {
    let keys: Vec<String> = (0..spec.key.len()).map(|i| format!("k{i}")).collect();
    format!(
        "COPY {} ({}, doc, {}vms, vseq, key_text, op) FROM STDIN (FORMAT binary)",
        quote(&stage_name(spec)),
        keys.join(", "),
        stage_columns(spec)
    )
}

/// The merge of the staging table into the destination (rules 3 and 5). An upsert's
/// parameters: `updated_at`, then the id (marked kinds), then the cutoff and the table name
/// (`UnlessNewer`); `Changes`: see [`changes_sql`].
fn merge_sql(spec: &TableSpec, bulk: Bulk) -> String {
    match bulk {
        Bulk::Changes { marked } => changes_sql(spec, marked),
        _ => upserts_sql(spec, bulk),
    }
}

/// The value expressions of a staged row `s` in the destination's column order.
fn staged_values(spec: &TableSpec, s: &str, marker: &str, vseq: &str) -> String {
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{s}.k{i}{}", super::sql::key_cast(k.kind)))
        .collect();
    if spec.document_column.is_some() {
        values.push(format!("{s}.doc{}", document::cast(spec.document_type)));
    }
    for (i, column) in spec.columns.iter().enumerate() {
        values.push(format!("{s}.c{i}{}", column_cast(column.kind)));
    }
    values.push(marker.to_string());
    values.push(format!("$1{UPDATED_AT_CAST}"));
    values.push(format!("{s}.vms"));
    values.push(vseq.to_string());
    values.join(", ")
}

/// Rule 5, one statement over the staged last changes: the markers (with a snapshot open),
/// the deletes and the upserts. Parameters: `updated_at`, then with a snapshot open its id and
/// the table name. The parts of a data-modifying `WITH` see one snapshot of the tables; they
/// touch no row twice, since each key is staged once (and marked at most once).
fn changes_sql(spec: &TableSpec, marked: Option<i64>) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let stage = quote(&stage_name(spec));
    let mut sql = String::from("WITH ");
    if marked.is_some() {
        let _ = write!(
            sql,
            "marks AS (INSERT INTO {} AS d (table_name, key_text, version_ms) SELECT $3::text, \
             s.key_text, s.vms FROM {stage} s WHERE s.op <> 0 ON CONFLICT (table_name, key_text) \
             DO UPDATE SET version_ms = CASE WHEN d.version_ms IS NULL OR EXCLUDED.version_ms IS \
             NULL THEN NULL ELSE GREATEST(d.version_ms, EXCLUDED.version_ms) END), ",
            qualified(&spec.schema, DELETED_TABLE)
        );
    }
    let matches: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| {
            format!(
                "t.{} = s.k{i}{}",
                quote(&k.name),
                super::sql::key_cast(k.kind)
            )
        })
        .collect();
    let marker = if marked.is_some() {
        "$2::bigint"
    } else {
        "NULL::bigint"
    };
    let _ = write!(
        sql,
        "gone AS (DELETE FROM {table} AS t USING {stage} s WHERE s.op = 1 AND {}) \
         INSERT INTO {table} AS t ({}) SELECT {} FROM {stage} s WHERE s.op = 0 \
         ON CONFLICT ({}) DO UPDATE SET {}",
        matches.join(" AND "),
        upsert_columns(spec),
        staged_values(spec, "s", marker, "s.vseq"),
        key_list(spec),
        conflict_set(spec, marked.is_some())
    );
    sql
}

/// Rule 3: upserts of one kind with distinct keys.
fn upserts_sql(spec: &TableSpec, bulk: Bulk) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let marker = quote(SNAPSHOT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let keys = key_list(spec);
    let marker_value = match bulk {
        Bulk::Change | Bulk::Changes { .. } => "NULL::bigint",
        Bulk::Marked { .. } | Bulk::UnlessNewer { .. } => "$2::bigint",
    };
    let vseq = match bulk {
        Bulk::UnlessNewer { .. } => "NULL::text",
        _ => "s.vseq",
    };
    let set = conflict_set(spec, bulk != Bulk::Change);
    let stage = quote(&stage_name(spec));
    let insert = format!(
        "INSERT INTO {table} AS t ({}) SELECT {} FROM {stage} s",
        upsert_columns(spec),
        staged_values(spec, "s", marker_value, vseq)
    );
    match bulk {
        Bulk::Change | Bulk::Marked { .. } | Bulk::Changes { .. } => {
            format!("{insert} ON CONFLICT ({keys}) DO UPDATE SET {set}")
        }
        Bulk::UnlessNewer { .. } => format!(
            "{insert} WHERE NOT EXISTS (SELECT 1 FROM {} d WHERE d.table_name = $4::text \
             AND d.key_text = s.key_text AND (d.version_ms IS NULL OR d.version_ms > $3::bigint)) \
             ON CONFLICT ({keys}) DO UPDATE SET {set} \
             WHERE NOT (t.{marker} IS NOT DISTINCT FROM EXCLUDED.{marker} AND t.{version_seq} IS NOT NULL \
             AND (t.{version_ms} IS NULL OR t.{version_ms} > $3::bigint))",
            qualified(&spec.schema, DELETED_TABLE)
        ),
    }
}

/// `COPY` of the destination's columns (rule 6).
fn direct_copy_sql(spec: &TableSpec) -> String {
    format!(
        "COPY {} ({}) FROM STDIN",
        qualified(&spec.schema, &spec.table),
        upsert_columns(spec)
    )
}

/// Whether the table has any deleted-key marker (rule 6): a parameter, the table name.
fn markers_sql(spec: &TableSpec) -> String {
    format!(
        "SELECT 1 FROM {} WHERE table_name = $1::text LIMIT 1",
        qualified(&spec.schema, DELETED_TABLE)
    )
}

/// Whether `bulk` may go straight into the table as far as deleted-key markers go (rule 6):
/// snapshot rows read beside the stream only while the table has none. The pipeline's lock
/// makes this run the table's only writer, so the answer holds for its batch.
pub(super) async fn markers_allow(
    client: &Client,
    cache: &mut std::collections::HashMap<String, Statement>,
    spec: &TableSpec,
    bulk: Bulk,
) -> Result<bool, tokio_postgres::Error> {
    match bulk {
        Bulk::UnlessNewer { .. } => {
            let probe = super::session::statement(client, cache, &markers_sql(spec)).await?;
            Ok(client.query_opt(&probe, &[&spec.table]).await?.is_none())
        }
        _ => Ok(true),
    }
}

/// The version columns a write stages: a change's time and sequence number, a snapshot row's
/// read time, a marked delete's time.
fn staged_version<'a>(write: &Write<'a>) -> (Option<i64>, Option<&'a str>) {
    match write {
        Write::Upsert {
            version_ms,
            version_seq,
        }
        | Write::UpsertMarked {
            version_ms,
            version_seq,
            ..
        } => (*version_ms, *version_seq),
        Write::UpsertUnlessNewer { read_ms, .. } => (Some(*read_ms), None),
        Write::DeleteMarked { version_ms } => (*version_ms, None),
        _ => (None, None),
    }
}

/// Bytes of `COPY` data sent at once: the server parses them while the next are encoded.
const DIRECT_CHUNK_BYTES: usize = 64 * 1024;

/// Copies the rows straight into the destination (rule 6), inside `tx`; the caller checked
/// [`markers_allow`]. A unique violation comes back as the driver's error, the transaction
/// then aborted.
pub(super) async fn direct(
    tx: &Transaction<'_>,
    spec: &TableSpec,
    rows: &[RowChange],
    writes: &[Write<'_>],
    bulk: Bulk,
    updated_at: &str,
) -> Result<(), Failure> {
    let marker = match bulk {
        Bulk::Marked { id } | Bulk::UnlessNewer { id, .. } => Some(id),
        Bulk::Change | Bulk::Changes { .. } => None,
    };
    let sink = tx
        .copy_in::<_, bytes::Bytes>(&direct_copy_sql(spec))
        .await?;
    pin_mut!(sink);
    let mut chunk = BytesMut::with_capacity(DIRECT_CHUNK_BYTES + (1 << 14));
    for (row, write) in rows.iter().zip(writes) {
        let RowChange::Upsert {
            key,
            document,
            columns,
            ..
        } = row
        else {
            return Err(crate::DbError::fatal("postgres: a delete in a batch of upserts").into());
        };
        let (version_ms, version_seq) = staged_version(write);
        for value in key {
            match value {
                KeyValue::S(text) | KeyValue::N(text) => copy_text::text(&mut chunk, text),
                KeyValue::B(bytes) => copy_text::bytea(&mut chunk, bytes),
            }
            chunk.put_u8(b'\t');
        }
        if spec.document_column.is_some() {
            copy_text::text(&mut chunk, document);
            chunk.put_u8(b'\t');
        }
        for value in columns {
            copy_text::text_or_null(&mut chunk, value.sql_text().as_deref());
            chunk.put_u8(b'\t');
        }
        copy_text::int(&mut chunk, marker);
        chunk.put_u8(b'\t');
        copy_text::text(&mut chunk, updated_at);
        chunk.put_u8(b'\t');
        copy_text::int(&mut chunk, version_ms);
        chunk.put_u8(b'\t');
        copy_text::text_or_null(&mut chunk, version_seq);
        chunk.put_u8(b'\n');
        if chunk.len() >= DIRECT_CHUNK_BYTES {
            sink.send(chunk.split().freeze()).await?;
        }
    }
    if !chunk.is_empty() {
        sink.send(chunk.split().freeze()).await?;
    }
    all_copied(sink.as_mut().finish().await?, rows.len(), "wrote")?;
    Ok(())
}

/// Fails unless a `COPY` took every row it was sent (`copied`, as the server counted, of
/// `sent`).
fn all_copied(copied: u64, sent: usize, verb: &str) -> Result<(), Failure> {
    if copied == sent as u64 {
        return Ok(());
    }
    Err(crate::DbError::fatal(format!(
        "postgres: COPY {verb} {copied} rows of {sent} sent"
    ))
    .into())
}

/// The staging table exists in this session and the merge is prepared (once per connection:
/// the statement cache is cleared on reconnect, and the temporary table goes with the session).
pub(super) async fn merge_statement(
    client: &Client,
    cache: &mut std::collections::HashMap<String, Statement>,
    spec: &TableSpec,
    bulk: Bulk,
) -> Result<Statement, tokio_postgres::Error> {
    let sql = merge_sql(spec, bulk);
    if !cache.contains_key(&sql) {
        client.batch_execute(&create_stage_sql(spec)).await?;
    }
    super::session::statement(client, cache, &sql).await
}

/// One row of the staging table: the batch row it comes from, its `op` (0 upsert, 1 delete,
/// 2 a deleted-key marker only), its version and the key text of its guard or marker.
struct Stage<'a> {
    index: usize,
    op: i16,
    version_ms: Option<i64>,
    version_seq: Option<&'a str>,
    guard: Option<&'a str>,
}

/// The newer of two deleted-key marker times, null counting as newest (rule 5).
fn newest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.zip(b).map(|(a, b)| a.max(b))
}

/// What a batch stages, in batch order (rules 2 and 5): every row; for stream changes each
/// key's last change, and with a snapshot open one marker per deleted key.
fn stage_rows<'a>(
    rows: &'a [RowChange],
    writes: &[Write<'a>],
    key_texts: &'a [String],
    bulk: Bulk,
) -> Vec<Stage<'a>> {
    let stage = |index: usize, op: i16, guard: bool| {
        let (version_ms, version_seq) = staged_version(&writes[index]);
        Stage {
            index,
            op,
            version_ms,
            version_seq,
            // `apply` made the key text of exactly the guarded and marked rows.
            guard: guard.then(|| key_texts[index].as_str()),
        }
    };
    let Bulk::Changes { .. } = bulk else {
        let guarded = matches!(bulk, Bulk::UnlessNewer { .. });
        return (0..rows.len())
            .map(|index| stage(index, 0, guarded))
            .collect();
    };
    let mut seen = HashSet::with_capacity(rows.len());
    // Per deleted key (with a snapshot open): one of its deletes, and their newest time.
    let mut marks: HashMap<&[KeyValue], (usize, Option<i64>)> = HashMap::new();
    let mut last = Vec::with_capacity(rows.len());
    for index in (0..rows.len()).rev() {
        let key = row_key(&rows[index]);
        if let Write::DeleteMarked { version_ms } = writes[index] {
            marks
                .entry(key)
                .and_modify(|(_, at)| *at = newest(*at, version_ms))
                .or_insert((index, version_ms));
        }
        if seen.insert(key) {
            last.push(index);
        }
    }
    last.reverse();
    let mut staged: Vec<Stage<'a>> = last
        .into_iter()
        .map(|index| match &rows[index] {
            RowChange::Upsert { .. } => stage(index, 0, false),
            RowChange::Delete { key, .. } => match marks.remove(key.as_slice()) {
                Some((_, at)) => Stage {
                    version_ms: at,
                    ..stage(index, 1, true)
                },
                None => stage(index, 1, false),
            },
        })
        .collect();
    let mut marked_only: Vec<(usize, Option<i64>)> = marks.into_values().collect();
    marked_only.sort_unstable();
    staged.extend(marked_only.into_iter().map(|(index, at)| Stage {
        version_ms: at,
        version_seq: None,
        ..stage(index, 2, true)
    }));
    staged
}

/// Copies the batch into the staging table and merges it (rules 2–3, 5), inside `tx`.
#[allow(clippy::too_many_arguments)] // The batch as `apply` planned it, passed once.
pub(super) async fn write(
    tx: &Transaction<'_>,
    spec: &TableSpec,
    rows: &[RowChange],
    writes: &[Write<'_>],
    key_texts: &[String],
    bulk: Bulk,
    merge: &Statement,
    updated_at: &str,
) -> Result<(), Failure> {
    let staged = stage_rows(rows, writes, key_texts, bulk);
    let sink = tx.copy_in::<_, bytes::Bytes>(&copy_sql(spec)).await?;
    pin_mut!(sink);
    let fields = u16::try_from(spec.key.len() + spec.columns.len() + 5)
        .map_err(|_| crate::DbError::fatal("postgres: too many key and typed columns"))?;
    let mut chunk = BytesMut::with_capacity(DIRECT_CHUNK_BYTES + (1 << 14));
    copy_binary::header(&mut chunk);
    for one in &staged {
        let (key, document, columns): (&[KeyValue], Option<&str>, &[ColumnValue]) =
            match &rows[one.index] {
                RowChange::Upsert {
                    key,
                    document,
                    columns,
                    ..
                } => (
                    key,
                    spec.document_column.as_ref().map(|_| &**document),
                    columns,
                ),
                RowChange::Delete { key, .. } => (key, None, &[]),
            };
        copy_binary::row(&mut chunk, fields);
        for value in key {
            match value {
                KeyValue::S(text) | KeyValue::N(text) => {
                    copy_binary::bytes(&mut chunk, text.as_bytes());
                }
                KeyValue::B(bytes) => copy_binary::bytes(&mut chunk, bytes),
            }
        }
        copy_binary::text_or_null(&mut chunk, document);
        for i in 0..spec.columns.len() {
            let text = columns.get(i).and_then(ColumnValue::sql_text);
            copy_binary::text_or_null(&mut chunk, text.as_deref());
        }
        copy_binary::int8(&mut chunk, one.version_ms);
        copy_binary::text_or_null(&mut chunk, one.version_seq);
        copy_binary::text_or_null(&mut chunk, one.guard);
        copy_binary::int2(&mut chunk, one.op);
        if chunk.len() >= DIRECT_CHUNK_BYTES {
            sink.send(chunk.split().freeze()).await?;
        }
    }
    copy_binary::trailer(&mut chunk);
    sink.send(chunk.split().freeze()).await?;
    all_copied(sink.as_mut().finish().await?, staged.len(), "staged")?;
    let params: Vec<&(dyn ToSql + Sync)> = match &bulk {
        Bulk::Change | Bulk::Changes { marked: None } => vec![&updated_at],
        Bulk::Marked { id } => vec![&updated_at, id],
        Bulk::Changes { marked: Some(id) } => vec![&updated_at, id, &spec.table],
        Bulk::UnlessNewer { id, cutoff_ms } => vec![&updated_at, id, cutoff_ms, &spec.table],
    };
    tx.execute(merge, &params).await?;
    Ok(())
}

#[cfg(test)]
mod tests;
