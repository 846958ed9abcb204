//! ddbpipe into its destinations: the snapshot load (`mode: scan`) and the stream catch-up
//! (`mode: streams`), a pipeline into a sqlite, postgres, parquet, kafka or jsonl sink built as
//! `ddbpipe run` builds it (`crate::ddbpipe_run`).
//!
//! Before the meter starts, as `ddbpipe run` does before the read: the clients, `DescribeTable`,
//! the database opened (SQLite: WAL, `synchronous=FULL`; PostgreSQL: one session), the
//! pipeline's lock taken, the table and `_ddbpipe_state` prepared, the position loaded from the
//! sink's database. Timed: the scan of the bench table or the read of every shard of the bench
//! stream (the streams case's settings), in batches of 5000 (`ddbpipe run`'s default into a
//! keyed sink), each one transaction of its rows and the position. Left out, as in the other
//! cases: the progress bar and the log.
//!
//! Into parquet (a fresh directory, the sink's defaults): before the meter, the same setup
//! with the commit log read (empty) instead of a database; timed, the read in batches of 1000
//! held in open Parquet files, committed when a file rolls, every `commit_interval_secs` and
//! at the run's end (a scan's with its `_manifest.json`). Afterwards the committed files are
//! read back ([`super::lake`]).

use super::destination;
use super::{Destination, ServerMeter, SinkPhaseSettings, Written};
use crate::ddbpipe_run::{self, BenchPipeline, Read};
use crate::procfs::{self, Meter};

/// The snapshot load: ddbpipe's scan of the bench table into the destination (a keyed one,
/// parquet, or the jsonl sink on `/dev/null`: the scan case's ddbpipe phase).
pub async fn load(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    run(settings, Read::Scan).await
}

/// The stream catch-up: ddbpipe's read of every change record of the bench stream into the
/// keyed destination, parquet, Kafka, or the jsonl sink on `/dev/null` (the streams case's
/// phase).
pub async fn stream(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    run(settings, Read::Stream).await
}

/// The pipeline of `read` into the phase's destination: opened, then timed to its end.
async fn run(settings: &SinkPhaseSettings, read: Read) -> anyhow::Result<Written> {
    let phase = settings.read_settings();
    let pipeline = BenchPipeline::new(&phase, read, &settings.destination)?;
    let opened = pipeline.open().await?;
    let server = ServerMeter::start(settings.postmaster)?;
    let meter = Meter::start()?;
    let (received, end) = ddbpipe_run::finish(opened).await?;
    let measured = meter.stop()?;
    let server = ServerMeter::stop(server)?;
    let peak_rss_kib = procfs::peak_rss_kib()?;
    let rows = match &settings.destination {
        // Each record is one line or one message: nothing to count but what was written.
        Destination::Jsonl | Destination::Kafka { .. } => received,
        // The rows of the committed files, read back.
        Destination::Parquet {
            path,
            iceberg: true,
        } => super::lake::iceberg_rows(path).await?,
        Destination::Parquet { path, .. } => match read {
            Read::Scan => super::lake::snapshot_rows(path).await?,
            Read::Stream => super::lake::changelog_rows(path).await?,
        },
        keyed => {
            let (db, spec) = destination::open(keyed).await?;
            db.count_rows(&spec).await?
        }
    };
    Ok(Written {
        received,
        rows,
        measured,
        server,
        peak_rss_kib,
        end,
    })
}
