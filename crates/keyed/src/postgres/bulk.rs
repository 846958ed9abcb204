//! Batches of upserts through `COPY` (docs/sinks.md §7.3): a snapshot's pages and a scan's
//! items reach PostgreSQL at the speed of `COPY`, not of one statement per row.
//!
//! # Rules
//! 1. A batch goes this way when every row change is an upsert of one kind (`Write::Upsert`,
//!    `Write::UpsertMarked` of one snapshot, or `Write::UpsertUnlessNewer` of one snapshot and
//!    read time) and no key occurs twice in it. Any other batch (deletes, repairs, a key
//!    changed twice: stream hand-overs) takes the per-row statements, which keep per-key order.
//! 2. The rows are copied (`COPY … FROM STDIN (FORMAT binary)`) into a session's temporary
//!    staging table (`ON COMMIT DELETE ROWS`, created once per connection): the key values as
//!    text (`S`, and `N` as its exact text) or bytes, the document as text, the version, and for
//!    guarded snapshot rows the key text of the deleted-key markers.
//! 3. One `INSERT … SELECT … FROM` the staging table `ON CONFLICT … DO UPDATE` then writes them,
//!    with exactly the casts, the conflict update and the guards of the per-row statement of
//!    that kind (`sql::upsert_sql`): `N` keys cast to `numeric` by the server, documents to the
//!    document type, deleted-key markers and stream-written rows holding back snapshot rows.
//! 4. The staging rows, the merge and the state parts are one transaction with the batch, as
//!    on the per-row path.

use std::collections::HashSet;
use std::fmt::Write as _;

use futures_util::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement, Transaction};

use super::document;
use super::session::Failure;
use super::sql::{key_list, qualified};
use crate::sql::{
    DELETED_TABLE, SNAPSHOT_COLUMN, UPDATED_AT_COLUMN, VERSION_MS_COLUMN, VERSION_SEQ_COLUMN,
    Write, key_text, quote, row_key,
};
use crate::{KeyType, KeyValue, RowChange, TableSpec};

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
}

impl Bulk {
    /// The bulk kind of `writes` (of `rows`), when the batch qualifies (rule 1).
    pub(super) fn of(rows: &[RowChange], writes: &[Write<'_>]) -> Option<Bulk> {
        let first = match writes.first()? {
            Write::Upsert { .. } => Bulk::Change,
            Write::UpsertMarked { id, .. } => Bulk::Marked { id: *id },
            Write::UpsertUnlessNewer { id, cutoff_ms, .. } => Bulk::UnlessNewer {
                id: *id,
                cutoff_ms: *cutoff_ms,
            },
            _ => return None,
        };
        let same = writes.iter().all(|write| match (write, first) {
            (Write::Upsert { .. }, Bulk::Change) => true,
            (Write::UpsertMarked { id, .. }, Bulk::Marked { id: want }) => *id == want,
            (
                Write::UpsertUnlessNewer { id, cutoff_ms, .. },
                Bulk::UnlessNewer {
                    id: want,
                    cutoff_ms: cutoff,
                },
            ) => *id == want && *cutoff_ms == cutoff,
            _ => false,
        });
        let mut keys = HashSet::with_capacity(rows.len());
        (same && rows.iter().all(|row| keys.insert(row_key(row)))).then_some(first)
    }
}

/// The staging table of `spec` in this session: named after the destination, so two
/// destinations of one connection do not share one.
fn stage_name(spec: &TableSpec) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in spec
        .schema
        .bytes()
        .chain([0])
        .chain(spec.table.bytes())
        .chain([0])
        .chain(spec.key.iter().flat_map(|k| k.name.bytes().chain([0])))
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("_ddbpipe_stage_{hash:016x}")
}

fn stage_type(kind: KeyType) -> (&'static str, Type) {
    match kind {
        KeyType::S | KeyType::N => ("text", Type::TEXT),
        KeyType::B => ("bytea", Type::BYTEA),
    }
}

/// `CREATE TEMP TABLE` of the staging table (rule 2).
fn create_stage_sql(spec: &TableSpec) -> String {
    let mut columns = String::new();
    for (i, key) in spec.key.iter().enumerate() {
        let _ = write!(columns, "k{i} {}, ", stage_type(key.kind).0);
    }
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS {} ({columns}doc text, vms bigint, vseq text, \
         key_text text) ON COMMIT DELETE ROWS",
        quote(&stage_name(spec))
    )
}

fn copy_sql(spec: &TableSpec) -> String {
    let keys: Vec<String> = (0..spec.key.len()).map(|i| format!("k{i}")).collect();
    format!(
        "COPY {} ({}, doc, vms, vseq, key_text) FROM STDIN (FORMAT binary)",
        quote(&stage_name(spec)),
        keys.join(", ")
    )
}

/// The merge of the staging table into the destination (rule 3). Parameters: `updated_at`,
/// then the id (marked kinds), then the cutoff and the table name (`UnlessNewer`).
fn merge_sql(spec: &TableSpec, bulk: Bulk) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let document = quote(&spec.document_column);
    let marker = quote(SNAPSHOT_COLUMN);
    let updated_at = quote(UPDATED_AT_COLUMN);
    let version_ms = quote(VERSION_MS_COLUMN);
    let version_seq = quote(VERSION_SEQ_COLUMN);
    let keys = key_list(spec);
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("s.k{i}{}", super::sql::key_cast(k.kind)))
        .collect();
    values.push(format!("s.doc{}", document::cast(spec.document_type)));
    values.push(match bulk {
        Bulk::Change => "NULL::bigint".into(),
        Bulk::Marked { .. } | Bulk::UnlessNewer { .. } => "$2::bigint".into(),
    });
    values.push("$1::text".into());
    values.push("s.vms".into());
    values.push(match bulk {
        Bulk::UnlessNewer { .. } => "NULL::text".into(),
        _ => "s.vseq".into(),
    });
    let mut set = format!(
        "{document} = EXCLUDED.{document}, {updated_at} = EXCLUDED.{updated_at}, \
         {version_ms} = EXCLUDED.{version_ms}, {version_seq} = EXCLUDED.{version_seq}"
    );
    if bulk != Bulk::Change {
        let _ = write!(set, ", {marker} = EXCLUDED.{marker}");
    }
    let stage = quote(&stage_name(spec));
    let insert = format!(
        "INSERT INTO {table} AS t ({keys}, {document}, {marker}, {updated_at}, {version_ms}, \
         {version_seq}) SELECT {} FROM {stage} s",
        values.join(", ")
    );
    match bulk {
        Bulk::Change | Bulk::Marked { .. } => {
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

/// The staging table exists in this session and the merge is prepared (once per connection:
/// the statement cache is cleared on reconnect, and the temporary table goes with the session).
pub(super) async fn merge_statement(
    client: &Client,
    cache: &mut std::collections::HashMap<String, Statement>,
    spec: &TableSpec,
    bulk: Bulk,
) -> Result<Statement, tokio_postgres::Error> {
    let sql = merge_sql(spec, bulk);
    if let Some(statement) = cache.get(&sql) {
        return Ok(statement.clone());
    }
    client.batch_execute(&create_stage_sql(spec)).await?;
    super::session::statement(client, cache, sql).await
}

/// Copies the rows into the staging table and merges them (rules 2–3), inside `tx`.
pub(super) async fn write(
    tx: &Transaction<'_>,
    spec: &TableSpec,
    rows: &[RowChange],
    writes: &[Write<'_>],
    bulk: Bulk,
    merge: &Statement,
    updated_at: &str,
) -> Result<(), Failure> {
    let mut types: Vec<Type> = spec.key.iter().map(|k| stage_type(k.kind).1).collect();
    types.extend([Type::TEXT, Type::INT8, Type::TEXT, Type::TEXT]);
    let sink = tx.copy_in(&copy_sql(spec)).await?;
    let writer = BinaryCopyInWriter::new(sink, &types);
    pin_mut!(writer);
    for (row, write) in rows.iter().zip(writes) {
        let RowChange::Upsert { key, document, .. } = row else {
            continue;
        };
        let (version_ms, version_seq) = match write {
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
            _ => (None, None),
        };
        let guard = match bulk {
            Bulk::UnlessNewer { .. } => Some(key_text(key)),
            _ => None,
        };
        let mut values: Vec<&(dyn ToSql + Sync)> = key.iter().map(key_value).collect();
        values.extend([
            document as &(dyn ToSql + Sync),
            &version_ms,
            &version_seq,
            &guard,
        ]);
        writer.as_mut().write(&values).await?;
    }
    writer.finish().await?;
    let params: Vec<&(dyn ToSql + Sync)> = match &bulk {
        Bulk::Change => vec![&updated_at],
        Bulk::Marked { id } => vec![&updated_at, id],
        Bulk::UnlessNewer { id, cutoff_ms } => vec![&updated_at, id, cutoff_ms, &spec.table],
    };
    tx.execute(merge, &params).await?;
    Ok(())
}

fn key_value(value: &KeyValue) -> &(dyn ToSql + Sync) {
    match value {
        KeyValue::S(text) | KeyValue::N(text) => text,
        KeyValue::B(bytes) => bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyColumn, Version};

    fn upsert(key: &str, snapshot: bool) -> RowChange {
        RowChange::Upsert {
            key: vec![KeyValue::S(key.into())],
            document: "{}".into(),
            snapshot,
            version: Version::default(),
        }
    }

    #[test]
    fn only_batches_of_one_kind_of_upsert_with_distinct_keys_go_through_copy() {
        let rows = [upsert("a", false), upsert("b", false)];
        let plain = || Write::Upsert {
            version_ms: None,
            version_seq: None,
        };
        assert_eq!(Bulk::of(&rows, &[plain(), plain()]), Some(Bulk::Change));
        let twice = [upsert("a", false), upsert("a", false)];
        assert_eq!(
            Bulk::of(&twice, &[plain(), plain()]),
            None,
            "a key changed twice"
        );
        let marked = |id| Write::UpsertMarked {
            id,
            version_ms: None,
            version_seq: None,
        };
        assert_eq!(
            Bulk::of(&rows, &[marked(7), marked(7)]),
            Some(Bulk::Marked { id: 7 })
        );
        assert_eq!(Bulk::of(&rows, &[marked(7), plain()]), None, "two kinds");
        assert_eq!(Bulk::of(&rows, &[plain(), Write::Delete]), None);
        assert_eq!(Bulk::of(&[], &[]), None);
    }

    #[test]
    fn the_merge_casts_as_the_row_statement_does_and_guards_snapshot_rows() {
        let spec = TableSpec {
            table: "orders".into(),
            schema: "public".into(),
            key: vec![
                KeyColumn {
                    name: "pk".into(),
                    kind: KeyType::S,
                },
                KeyColumn {
                    name: "n".into(),
                    kind: KeyType::N,
                },
            ],
            document_column: "doc".into(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        };
        let merge = merge_sql(&spec, Bulk::Change);
        assert!(merge.contains("s.k1::text::numeric"), "{merge}");
        assert!(merge.contains("s.doc::text::jsonb"), "{merge}");
        assert!(!merge.contains("_ddbpipe_deleted"), "{merge}");
        let guarded = merge_sql(
            &spec,
            Bulk::UnlessNewer {
                id: 1,
                cutoff_ms: 2,
            },
        );
        assert!(guarded.contains("\"_ddbpipe_deleted\" d"), "{guarded}");
        assert!(guarded.contains("d.key_text = s.key_text"), "{guarded}");
        assert_eq!(stage_name(&spec), stage_name(&spec.clone()));
        let other = TableSpec {
            table: "other".into(),
            ..spec.clone()
        };
        assert_ne!(stage_name(&spec), stage_name(&other));
    }
}
