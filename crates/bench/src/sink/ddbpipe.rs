//! ddbpipe into its keyed destinations: the snapshot load (`mode: scan`) and the stream
//! catch-up (`mode: streams`), wired as `ddbpipe run` wires them into a sqlite or postgres sink.
//!
//! Before the meter starts (as `ddbpipe run` does before the read): the database is opened
//! (SQLite: WAL, `synchronous=FULL`; PostgreSQL: one session), the pipeline's lock taken, the
//! table and `_ddbpipe_state` prepared, and the checkpointer opened on the sink's
//! `DatabaseStore` (flushing every second). Timed: the scan of the bench table (the scan case's
//! reader) or the read of every shard of the bench stream (the streams case's run settings,
//! every shard at once), in batches of 5000 (`ddbpipe run`'s default into a keyed sink), each
//! one transaction of its rows and the position.
//! Left out, as in the other cases: `DescribeTable`, the progress bar and the log.

use anyhow::ensure;
use ddbpipe_pipeline::checkpoint::{Checkpointer, CleanupPolicy};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_source::config::defaults::KEYED_BATCH_SIZE;
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::ScanKind;

use super::destination::{self, keyed_sink, output};
use super::{Destination, ServerMeter, SinkPhaseSettings, Written};
use crate::procfs::Meter;
use crate::{ddbpipe_client, ddbpipe_streams};

/// The snapshot load: ddbpipe's scan of the bench table into the keyed destination.
pub async fn load(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    let read = settings.read_settings();
    let source = ddbpipe_client::source_config(&read);
    let (db, spec) = destination::open(&settings.destination).await?;
    destination::lock(&db, ddbpipe_client::PIPELINE).await?;
    let mut sink = keyed_sink(db.clone(), spec.clone(), Records::Items, &source);
    sink.prepare().await?;
    let mut checkpointer = Checkpointer::open_scan(
        sink.state_store(),
        ddbpipe_client::PIPELINE,
        Identity::of(&source, &Location::default(), Some(&output())),
        ScanKind::Scan,
        read.segments,
        ddbpipe_client::FLUSH_INTERVAL,
    )
    .await?;
    ensure!(
        !checkpointer.position().has_progress(),
        "the fresh destination holds a scan position"
    );
    let reader = ddbpipe_client::reader(&read).await;

    let server = ServerMeter::start(settings.postmaster)?;
    let meter = Meter::start()?;
    let received = ddbpipe_client::scan_into(
        reader,
        &mut sink,
        &mut checkpointer,
        u64::from(read.segments),
        BatchLimits::records(KEYED_BATCH_SIZE),
    )
    .await?;
    let measured = meter.stop()?;
    let server = ServerMeter::stop(server)?;

    let rows = db.count_rows(&spec).await?;
    Ok(Written {
        received,
        rows,
        measured,
        server,
        end: None,
    })
}

/// The stream catch-up: ddbpipe's read of every change record of the bench stream into the
/// keyed destination, or into the jsonl sink on `/dev/null` (the streams case's phase).
pub async fn stream(settings: &SinkPhaseSettings) -> anyhow::Result<Written> {
    let read = settings.read_settings();
    if let Destination::Jsonl = settings.destination {
        let prepared = ddbpipe_streams::prepare(&read).await?;
        let meter = Meter::start()?;
        let (received, end) = prepared.read().await?;
        return Ok(Written {
            received,
            rows: received,
            measured: meter.stop()?,
            server: None,
            end: Some(end),
        });
    }
    let source = ddbpipe_streams::source_config(&read.endpoint);
    let (db, spec) = destination::open(&settings.destination).await?;
    destination::lock(&db, ddbpipe_streams::PIPELINE).await?;
    let mut sink = keyed_sink(db.clone(), spec.clone(), Records::Envelopes, &source);
    sink.prepare().await?;
    let mut checkpointer = Checkpointer::open_streams(
        sink.state_store(),
        ddbpipe_streams::PIPELINE,
        Identity::of(&source, &Location::default(), Some(&output())),
        ddbpipe_client::FLUSH_INTERVAL,
    )
    .await?
    .with_cleanup(CleanupPolicy {
        deletes: source.resnapshot_deletes,
        max_keys: source.resnapshot_max_keys as u64,
    });
    ensure!(
        checkpointer.streams_position().is_none(),
        "the fresh destination holds a streams position"
    );
    let api = ddbpipe_streams::streams_api(&read.endpoint).await;
    let run = ddbpipe_streams::stream_run(read.concurrency, BatchLimits::records(KEYED_BATCH_SIZE));

    let server = ServerMeter::start(settings.postmaster)?;
    let meter = Meter::start()?;
    let (received, end) = ddbpipe_streams::read_into(
        api,
        &run,
        &mut sink,
        &mut checkpointer,
        read.segments as usize,
    )
    .await?;
    let measured = meter.stop()?;
    let server = ServerMeter::stop(server)?;

    let rows = db.count_rows(&spec).await?;
    Ok(Written {
        received,
        rows,
        measured,
        server,
        end: Some(end),
    })
}
