//! ddbpipe into its keyed destinations: the snapshot load (`mode: scan`) and the stream
//! catch-up (`mode: streams`), a pipeline into a sqlite or postgres sink built as `ddbpipe run`
//! builds it (`crate::ddbpipe_run`).
//!
//! Before the meter starts, as `ddbpipe run` does before the read: the clients, `DescribeTable`,
//! the database opened (SQLite: WAL, `synchronous=FULL`; PostgreSQL: one session), the
//! pipeline's lock taken, the table and `_ddbpipe_state` prepared, the position loaded from the
//! sink's database. Timed: the scan of the bench table or the read of every shard of the bench
//! stream (the streams case's settings), in batches of 5000 (`ddbpipe run`'s default into a
//! keyed sink), each one transaction of its rows and the position. Left out, as in the other
//! cases: the progress bar and the log.

use super::destination;
use super::{Destination, ServerMeter, SinkPhaseSettings, Written};
use crate::ddbpipe_run::{self, BenchPipeline, Read};
use crate::procfs::Meter;

/// The snapshot load: ddbpipe's scan of the bench table into the keyed destination.
pub async fn load(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    run(settings, Read::Scan).await
}

/// The stream catch-up: ddbpipe's read of every change record of the bench stream into the
/// keyed destination, or into the jsonl sink on `/dev/null` (the streams case's phase).
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
    let rows = match &settings.destination {
        // Each record is one line or one message: nothing to count but what was written.
        Destination::Jsonl | Destination::Kafka { .. } => received,
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
        end,
    })
}
