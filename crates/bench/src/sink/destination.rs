//! A phase's destination: the bench table's keyed table (`bench`, key `pk` S and `sk` N,
//! document column `document`, the defaults a config gives), opened as `ddbpipe run` opens a
//! sqlite or postgres sink (crates/cli/src/sinks/keyed).

use anyhow::{Context as _, bail};
use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{
    Database, DocumentType, KeyColumn, KeyType, PostgresDatabase, SqliteDatabase, TableSpec,
};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::config::SourceConfig;
use ddbpipe_value::ValueFormat;

use super::Destination;
use crate::items::TABLE;

/// `sink.document_column` default.
pub const DOCUMENT_COLUMN: &str = "document";

/// The destination table of the bench table in `schema` (SQLite: `main`).
pub fn table_spec(schema: &str) -> TableSpec {
    TableSpec {
        table: TABLE.to_string(),
        schema: schema.to_string(),
        key: vec![
            KeyColumn {
                name: "pk".to_string(),
                kind: KeyType::S,
            },
            KeyColumn {
                name: "sk".to_string(),
                kind: KeyType::N,
            },
        ],
        document_column: Some(DOCUMENT_COLUMN.to_string()),
        columns: Vec::new(),
        document_type: DocumentType::Jsonb,
        create_table: true,
    }
}

/// Double-quotes an identifier, doubling embedded quotes (as ddbpipe does).
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Opens (creating the SQLite file) or connects to the destination's database; returns it
/// with the bench table's spec.
pub async fn open(destination: &Destination) -> anyhow::Result<(Database, TableSpec)> {
    match destination {
        Destination::Sqlite { path, .. } => {
            let db = SqliteDatabase::open(path)
                .with_context(|| format!("cannot open sqlite {}", path.display()))?;
            Ok((Database::from(db), table_spec("main")))
        }
        Destination::Postgres { url, schema, .. } => {
            let db = PostgresDatabase::connect(url.expose())
                .await
                .with_context(|| format!("cannot connect to postgres {}", url.redacted()))?;
            Ok((Database::from(db.with_schema(schema)), table_spec(schema)))
        }
        Destination::Jsonl | Destination::Parquet { .. } | Destination::Kafka { .. } => {
            bail!("the {} sink has no database", destination.kind().name())
        }
    }
}

/// The value format a config with `value_format: plain` (the default) gives a keyed sink into
/// `destination`: a PostgreSQL `json`/`jsonb` document keeps every number exact
/// (docs/values.md §3.7), as `ddbpipe run` writes it.
pub fn value_format(destination: &Destination, spec: &TableSpec) -> ValueFormat {
    match destination {
        Destination::Postgres { .. } => spec.document_type.value_format(ValueFormat::Plain),
        Destination::Sqlite { .. }
        | Destination::Jsonl
        | Destination::Parquet { .. }
        | Destination::Kafka { .. } => ValueFormat::Plain,
    }
}

/// The keyed sink of `records` into `spec` of `db` in `format`, retrying as `source` says, as
/// `ddbpipe run` builds it; not prepared yet.
pub fn keyed_sink(
    db: Database,
    spec: TableSpec,
    format: ValueFormat,
    records: Records,
    source: &SourceConfig,
) -> KeyedSink {
    let retry = source.retry.policy();
    KeyedSink::new(
        db,
        spec,
        format,
        records,
        SinkRetry {
            max_retries: retry.max_retries,
            initial_backoff: retry.initial_backoff,
            max_backoff: retry.max_backoff,
        },
    )
}
