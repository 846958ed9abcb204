//! Each database's floor: the rows of the snapshot load, written the cheapest ordinary way the
//! database offers, to show what the database itself costs.
//!
//! # The rows
//! Before the meter starts, the phase scans the bench table with ddbpipe's scan (the load's
//! reader and runner, into a sink that keeps the rows) and turns each batch into row changes
//! with `KeyedSink::rows`, the function the keyed sink turns its batches into rows with. So the
//! floor writes the key values and the document text the sink writes, byte for byte. Every
//! row is held in memory before the meter starts, so the floor's peak RSS holds them all.
//!
//! Its table is created by ddbpipe's own `Database::prepare`, in a fresh SQLite file or
//! PostgreSQL schema: the sink's shape (key columns, document, the `_ddbpipe_*` columns,
//! primary key on the key columns; `_ddbpipe_state` and `_ddbpipe_deleted` beside it) and, in
//! SQLite, the sink's journal mode (WAL, kept in the file).
//!
//! # SQLite
//! A connection of its own on the file with the pragmas the sink sets
//! (`journal_mode=WAL`, `synchronous=FULL`; crates/keyed/src/sqlite/mod.rs `open`), then,
//! timed: one transaction, one prepared `INSERT` of the key columns, the document and
//! `_ddbpipe_updated_at` executed once per row (Python's `executemany`), `COMMIT`. The marker
//! and version columns are left null, as a scan's rows have them.
//!
//! # PostgreSQL
//! A `tokio_postgres` connection of its own (no TLS: the bench asks for `sslmode=disable`, so
//! ddbpipe's session is plain too), then, timed: one `COPY "schema"."bench" (key columns,
//! document, _ddbpipe_updated_at) FROM STDIN` in text format, the rows escaped and sent in
//! chunks of about 1 MiB; the server parses each document into `jsonb` and maintains the
//! primary key, as for the sink's rows.
//!
//! `_ddbpipe_updated_at` is one fixed RFC 3339 time of the sink's form
//! (`2025-01-01T00:00:00.000Z`); the sink writes the time of each batch.

use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use bytes::{BufMut as _, BytesMut};
use ddbpipe_keyed::sink::KeyedSink;
use ddbpipe_keyed::{KeyValue, RowChange, TableSpec, copy_text};
use ddbpipe_pipeline::batch::{Batch, BatchLimits};
use ddbpipe_pipeline::sink::{Records, Sink, SinkError, SinkErrorClass, Staged};
use futures_util::SinkExt as _;

use super::destination::{self, keyed_sink, quote};
use super::{Destination, PostgresUrl, ServerMeter, SinkPhaseSettings, Written};
use crate::ddbpipe_client;
use crate::procfs::{self, Measured, Meter};

/// The `_ddbpipe_updated_at` of every floor row.
const UPDATED_AT: &str = "2025-01-01T00:00:00.000Z";

/// The column ddbpipe writes the time of a row's write to (crates/keyed/src/lib.rs).
const UPDATED_AT_COLUMN: &str = "_ddbpipe_updated_at";

/// Bytes of `COPY` data sent at once.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// One row: the key values in key-column order, and the document.
struct Row {
    key: Vec<KeyValue>,
    document: String,
}

/// A sink that keeps the rows the keyed sink would write.
struct Collect {
    keyed: KeyedSink,
    rows: Vec<Row>,
}

impl Sink for Collect {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        let error = |message: String| SinkError {
            sink: "the floor's rows".to_string(),
            message,
            class: SinkErrorClass::Definite,
        };
        for row in self.keyed.rows(batch, false).map_err(error)? {
            match row {
                RowChange::Upsert { key, document, .. } => self.rows.push(Row { key, document }),
                RowChange::Delete { .. } => {
                    return Err(error("a scan item became a delete".to_string()));
                }
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "the floor's rows".to_string()
    }
}

/// The floor phase: collect the rows (not timed), write them (timed), count them.
pub async fn run(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    let read = settings.read_settings();
    let source = ddbpipe_client::source_config(&read);
    let (db, spec) = destination::open(&settings.destination).await?;
    db.prepare(&spec).await?;
    // The rows `ddbpipe run` writes: exact numbers in a PostgreSQL document.
    let format = destination::value_format(&settings.destination, &spec);

    let mut collect = Collect {
        keyed: keyed_sink(db.clone(), spec.clone(), format, Records::Items, &source),
        rows: Vec::new(),
    };
    let mut state = ddbpipe_client::file_state(&read).await?;
    let reader = ddbpipe_client::reader(&read, format).await;
    let received = ddbpipe_client::scan_into(
        reader,
        &mut collect,
        &mut state.checkpointer,
        u64::from(read.segments),
        BatchLimits::records(ddbpipe_client::BATCH_SIZE),
    )
    .await?;
    let rows = collect.rows;

    let server = ServerMeter::start(settings.postmaster)?;
    let measured = match &settings.destination {
        Destination::Sqlite { path, .. } => sqlite(path, &spec, &rows)?,
        Destination::Postgres { url, .. } => postgres(url, &spec, &rows).await?,
        Destination::Jsonl | Destination::Parquet { .. } | Destination::Kafka { .. } => {
            bail!(
                "the {} sink has no floor",
                settings.destination.kind().name()
            )
        }
    };
    let server = ServerMeter::stop(server)?;
    let peak_rss_kib = procfs::peak_rss_kib()?;

    let counted = db.count_rows(&spec).await?;
    Ok(Written {
        received,
        rows: counted,
        measured,
        server,
        peak_rss_kib,
        end: None,
    })
}

/// The columns the floor writes: the key columns, the document, `_ddbpipe_updated_at`.
fn columns(spec: &TableSpec) -> String {
    let mut names: Vec<String> = spec.key.iter().map(|k| quote(&k.name)).collect();
    names.extend(spec.document_column.as_deref().map(quote));
    names.push(quote(UPDATED_AT_COLUMN));
    names.join(", ")
}

/// One transaction of one prepared `INSERT` per row (see the module docs); timed from the
/// `BEGIN` to the end of the `COMMIT`.
fn sqlite(path: &Path, spec: &TableSpec, rows: &[Row]) -> anyhow::Result<Measured> {
    let mut conn = rusqlite::Connection::open(path)
        .with_context(|| format!("cannot open sqlite {}", path.display()))?;
    let journal: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    ensure!(
        journal.eq_ignore_ascii_case("wal"),
        "sqlite {} is in journal mode {journal}, not WAL",
        path.display()
    );
    conn.pragma_update(None, "synchronous", "FULL")?;
    let n = spec.key.len();
    let params: Vec<String> = (1..=n + 2).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({})",
        quote(&spec.table),
        columns(spec),
        params.join(", ")
    );

    let meter = Meter::start()?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(&sql)?;
        for row in rows {
            // As the sink binds them: S and N as TEXT, B as BLOB.
            for (i, value) in row.key.iter().enumerate() {
                match value {
                    KeyValue::S(text) | KeyValue::N(text) => {
                        insert.raw_bind_parameter(i + 1, text.as_str())?
                    }
                    KeyValue::B(bytes) => insert.raw_bind_parameter(i + 1, bytes.as_slice())?,
                }
            }
            insert.raw_bind_parameter(n + 1, row.document.as_str())?;
            insert.raw_bind_parameter(n + 2, UPDATED_AT)?;
            insert.raw_execute()?;
        }
    }
    tx.commit()?;
    meter.stop()
}

/// One `COPY … FROM STDIN` of every row (see the module docs); timed from the `COPY` to the
/// server's count of the copied rows.
async fn postgres(url: &PostgresUrl, spec: &TableSpec, rows: &[Row]) -> anyhow::Result<Measured> {
    let (client, connection) = tokio_postgres::connect(url.expose(), tokio_postgres::NoTls)
        .await
        .with_context(|| format!("cannot connect to postgres {}", url.redacted()))?;
    let connection = tokio::spawn(connection);
    let copy = format!(
        "COPY {}.{} ({}) FROM STDIN",
        quote(&spec.schema),
        quote(&spec.table),
        columns(spec)
    );

    let meter = Meter::start()?;
    let sink = client.copy_in::<_, bytes::Bytes>(&copy).await?;
    let mut sink = std::pin::pin!(sink);
    let mut chunk = BytesMut::with_capacity(COPY_CHUNK_BYTES + (1 << 16));
    for row in rows {
        for value in &row.key {
            match value {
                KeyValue::S(text) | KeyValue::N(text) => copy_text::text(&mut chunk, text),
                KeyValue::B(bytes) => copy_text::bytea(&mut chunk, bytes),
            }
            chunk.put_u8(b'\t');
        }
        copy_text::text(&mut chunk, &row.document);
        chunk.put_u8(b'\t');
        chunk.put_slice(UPDATED_AT.as_bytes());
        chunk.put_u8(b'\n');
        if chunk.len() >= COPY_CHUNK_BYTES {
            sink.send(chunk.split().freeze()).await?;
        }
    }
    if !chunk.is_empty() {
        sink.send(chunk.split().freeze()).await?;
    }
    let copied = sink.as_mut().finish().await?;
    let measured = meter.stop()?;

    ensure!(
        copied == rows.len() as u64,
        "COPY wrote {copied} rows, not {}",
        rows.len()
    );
    drop(client);
    connection
        .await
        .context("the COPY connection's task failed")?
        .context("the COPY connection failed")?;
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_with_embedded_quotes_doubled() {
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
        let spec = destination::table_spec("s");
        assert_eq!(
            columns(&spec),
            "\"pk\", \"sk\", \"document\", \"_ddbpipe_updated_at\""
        );
    }
}
