//! A snapshot scan and the stream read together into one sink (docs/mirror.md §5.6): the run
//! of a mirror or resnapshot into a keyed sink, so that a snapshot of any length never outruns
//! the stream's retention.
//!
//! # Rules
//! 1. Scan pages and stream hand-overs become separate batches, each with its own batcher and
//!    linger; one batch is written and acknowledged at a time, so the committed position (scan
//!    progress in the open snapshot record, shard positions beside it) is always an
//!    acknowledged prefix of both.
//! 2. The stream engine runs in follow mode without `max_messages`: a quiet stream during a
//!    long scan is not idleness, and the run never ends while its snapshot is open.
//! 3. When the scan has read every segment, its last batch is written, the engine is stopped,
//!    what it handed over is written (received while it stops too: a shard waiting for room
//!    in the hand-over would otherwise keep the engine from ending), and the snapshot is
//!    closed with its cleanup (§5.3). The
//!    caller then streams on from the committed position with the run's own bounds.
//! 4. A stop (signal) stops both; everything acknowledged is committed and the next run
//!    resumes the scan segments and the shards where they were. A failure of either side drops
//!    both partial batches, commits what was acknowledged and returns the error.

use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use ddbpipe_source::scan::PageSource;
use ddbpipe_source::streams::engine::StreamEngine;
use ddbpipe_source::streams::handover::Handed;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{AbortOnDrop, Lane, Progress, RunError, engine_failed, failed, read_ended, start_read};
use crate::batch::BatchLimits;
use crate::checkpoint::Checkpointer;
use crate::sink::Sink;

/// How a scan and stream run together ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct TogetherOutcome {
    /// Snapshot rows written and acknowledged.
    pub snapshot_rows: u64,
    /// Change records written and acknowledged.
    pub changes: u64,
    /// `true` when the scan read every segment and the snapshot was closed; `false` when a
    /// signal stopped the run first.
    pub completed: bool,
}

/// Runs `reader` (the snapshot scan) and `engine` (the stream from the capture) together into
/// `sink` until the scan completes (rule 3), `stop` fires (rule 4) or either fails.
/// `engine_stop` stops the engine; `handed` is its hand-over channel.
#[allow(clippy::too_many_arguments)] // The two sides' wiring, passed once.
pub async fn run_together<R: PageSource, A: StreamsApi, S: Sink>(
    reader: R,
    engine: StreamEngine<A>,
    engine_stop: CancelHandle,
    mut handed: mpsc::Receiver<Handed>,
    limits: BatchLimits,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    stop: Cancel,
    progress: &dyn Progress,
) -> Result<TogetherOutcome, RunError> {
    let limiter = reader.limiter();
    let (mut read_task, read_stop, mut pages) = start_read(reader, checkpointer, 0);
    let mut engine_task = AbortOnDrop(tokio::spawn(engine.run().in_current_span()));

    let scanned = |written, _: &Checkpointer| progress.advanced(written, limiter.total_units());
    let mut scan = Lane::new(limits, &scanned);
    let mut stream = Lane::new(limits, &|_, _: &Checkpointer| {});
    let mut stopping = false;
    let mut pages_open = true;
    let mut handed_open = true;
    // The scan task and the engine task ended cleanly (a failure ends the loop at once).
    let mut scan_ended = false;
    let mut engine_ended = false;

    let failure: Option<RunError> = loop {
        if scan_ended && !pages_open {
            break None;
        }
        tokio::select! {
            biased;
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                read_stop.cancel();
                engine_stop.cancel();
            }
            joined = &mut read_task.0, if !scan_ended => match read_ended(joined, stopping) {
                Ok(()) => scan_ended = true,
                Err(error) => break Some(error.into()),
            },
            page = pages.recv(), if pages_open => match page {
                Some(page) => {
                    let full = scan.batcher.push(page);
                    scan.deliver_all(checkpointer, sink, full).await?;
                }
                None => pages_open = false,
            },
            joined = &mut engine_task.0, if !engine_ended => {
                match joined.unwrap_or_else(engine_failed) {
                    Err(error) => break Some(error.into()),
                    Ok(_) => engine_ended = true,
                }
            }
            next = handed.recv(), if handed_open && !engine_ended => match next {
                Some(next) => {
                    let full = stream.batcher.push_handed(next);
                    stream.deliver_all(checkpointer, sink, full).await?;
                }
                // The engine dropped its hand-over: its result follows.
                None => handed_open = false,
            },
            settled = checkpointer.next_settled() => checkpointer.settled(settled).await?,
            () = scan.lingered() => scan.finish(checkpointer, sink).await?,
            () = stream.lingered() => stream.finish(checkpointer, sink).await?,
        }
    };
    if let Some(error) = failure {
        engine_stop.cancel();
        return Err(failed(error, &mut [&mut scan, &mut stream], checkpointer).await?);
    }

    // The scan's end (or a stop): its last batch, then the stream's (rule 3).
    scan.finish(checkpointer, sink).await?;
    engine_stop.cancel();
    // The engine ends once its shard slices do, and a slice may be waiting for room in the
    // hand-over: what is handed over meanwhile is received and written, or neither would
    // ever end.
    let mut stopped = Ok(());
    while !engine_ended {
        tokio::select! {
            biased;
            joined = &mut engine_task.0 => {
                engine_ended = true;
                stopped = joined.unwrap_or_else(engine_failed).map(drop);
            }
            next = handed.recv(), if handed_open => match next {
                Some(next) => {
                    let full = stream.batcher.push_handed(next);
                    stream.deliver_all(checkpointer, sink, full).await?;
                }
                None => handed_open = false,
            },
        }
    }
    if let Err(error) = stopped {
        drop(stream.batcher.take());
        checkpointer.give_up_handed().await?;
        checkpointer.flush().await?;
        return Err(error.into());
    }
    while let Ok(next) = handed.try_recv() {
        let full = stream.batcher.push_handed(next);
        stream.deliver_all(checkpointer, sink, full).await?;
    }
    stream.finish(checkpointer, sink).await?;
    let committed = checkpointer.drain_handed().await?;

    // The loop ends on a stop or when the scan task ended and handed over every page.
    let outcome = TogetherOutcome {
        snapshot_rows: scan.written,
        changes: stream.written,
        completed: !stopping && committed,
    };
    if outcome.completed {
        checkpointer
            .complete(outcome.snapshot_rows, limiter.total_units())
            .await?;
    } else {
        checkpointer.flush().await?;
    }
    Ok(outcome)
}
