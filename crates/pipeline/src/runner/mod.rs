//! Wiring only: segment readers → bounded channel → batcher → sink → acknowledgements →
//! checkpoint.
//!
//! # Ordering
//! Pages arrive from the segment tasks through a bounded channel into the run's `Lane`
//! (`lane.rs`, rule 1): the committed position is always a contiguous acknowledged prefix.
//!
//! # Stopping (docs/cli.md §8.5)
//! - `stop` (first SIGINT/SIGTERM): reading stops (in-flight requests are cancelled), pages
//!   already read are handed over, the last batch is written, the position is committed, and
//!   the run reports that it was interrupted.
//! - A read failure: batches already written stay committed; the batch being assembled is
//!   dropped; the position is written; the error is returned.
//! - Completion: every segment done and every batch acknowledged → the position is cleared,
//!   then the sink is told (`Sink::complete`, e.g. the jsonl sink renames its temporary file
//!   over the output). In that order: a crash between the two leaves no position, so the next
//!   run reads the table afresh and the output is still the previous complete one; the other
//!   order could publish a file while a position still says more of it was written.

use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use ddbpipe_source::scan::{PageOut, PageSource};
use ddbpipe_source::streams::engine::{EndReason, StreamEngine};
use ddbpipe_source::streams::handover::Handed;
use ddbpipe_source::streams::shard_reader::StreamError;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::batch::BatchLimits;
use crate::checkpoint::Checkpointer;
use crate::sink::{RunStart, Sink, SinkError};
use crate::state::StateError;

mod hand_out;
mod lane;
mod together;

pub(crate) use lane::{Commit, Lane, Wrote};
pub use together::{TogetherOutcome, run_together};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Reading failed definitely.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The sink failed; the batch was not acknowledged.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The position could not be written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Reading the stream failed (a gap while reading, a failed shard, a bad record).
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The lease table failed definitely (docs/coordination.md §11.2 rule 3).
    #[error(transparent)]
    Lease(#[from] ddbpipe_source::lease::LeaseError),
}

impl RunError {
    /// The damaged data file behind this failure, when its export is beyond use
    /// (`ddbpipe_source::export` rule 13): the run abandons that export once for a new one.
    pub fn damaged_export(&self) -> Option<&ddbpipe_source::export::ExportError> {
        match self {
            RunError::Read(ReadError::Export(error)) if error.is_damaged() => Some(error),
            _ => None,
        }
    }
}

/// Told about progress after each acknowledged batch.
pub trait Progress: Send + Sync {
    /// Records written so far, and capacity units consumed so far.
    fn advanced(&self, written: u64, capacity_units: f64);

    /// A streams or mirror run moved on from its snapshot (if any) to the stream: what follows
    /// counts change records, with no total.
    fn streaming(&self) {}
}

/// A progress observer that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn advanced(&self, _written: u64, _capacity_units: f64) {}
}

/// How a scan or query run ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanOutcome {
    /// Items received from DynamoDB.
    pub read: u64,
    /// Items written and acknowledged.
    pub written: u64,
    /// Read capacity units consumed by this run.
    pub capacity_units: f64,
    /// `true` when every segment was read to its end; `false` when stopped by a signal.
    pub completed: bool,
    /// Segments finished, of the total.
    pub segments_done: u64,
}

/// Records a page is assumed to hold when the scan's queue is given room for a batch: DynamoDB's
/// pages of at most 1 MB hold about 1000 items of 1 KB. The queue is counted in pages, so its
/// memory is at most a megabyte a page whatever the items' size.
const PAGE_ITEMS_GUESS: usize = 1000;

/// DynamoDB's largest page (a `Scan`/`Query` answer or a `GetRecords` answer).
const PAGE_BYTES_MAX: usize = 1024 * 1024;

/// Pages a batch is assumed to span, for the queue's room: by its record count at
/// [`PAGE_ITEMS_GUESS`] a page, and no more than its byte bound fills with full pages.
pub(crate) fn batch_pages(limits: BatchLimits) -> usize {
    limits
        .records
        .div_ceil(PAGE_ITEMS_GUESS)
        .min(limits.bytes.div_ceil(PAGE_BYTES_MAX))
        .max(1)
}

/// Runs a scan or query to completion (or until `stop`), writing to `sink`.
pub async fn run_scan<R: PageSource, S: Sink>(
    reader: R,
    limits: BatchLimits,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    stop: Cancel,
    progress: &dyn Progress,
) -> Result<ScanOutcome, RunError> {
    let start = if checkpointer.position().has_progress() {
        RunStart::Resumed
    } else {
        RunStart::Fresh
    };
    sink.start(start).await?;
    let limiter = reader.limiter();
    // Room for a whole batch besides one page per reader, so the next batch is read while
    // the sink writes one (docs/scan.md §2.4).
    let (mut read_task, read_stop, mut rx) = start_read(reader, checkpointer, batch_pages(limits));

    let report = |written, _: &Checkpointer| progress.advanced(written, limiter.total_units());
    let mut lane = Lane::new(limits, &report);
    let mut stopping = false;
    let mut scan_ended = false;
    let mut read = 0u64;

    // The loop ends once the read task ended (or failed).
    let failure = loop {
        tokio::select! {
            biased;
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                read_stop.cancel();
            }
            joined = &mut read_task.0, if !scan_ended => match read_ended(joined, stopping) {
                Ok(()) => scan_ended = true,
                Err(error) => break Some(error),
            },
            page = rx.recv() => match page {
                Some(page) => {
                    read += page.records.len() as u64;
                    let full = lane.batcher.push(page);
                    lane.deliver_all(checkpointer, sink, full).await?;
                }
                None if scan_ended => break None,
                // Senders are gone; the reader's result follows at once.
                None => break read_ended((&mut read_task.0).await, stopping).err(),
            },
            settled = checkpointer.next_settled() => checkpointer.settled(settled).await?,
            () = lane.lingered() => lane.finish(checkpointer, sink).await?,
        }
    };

    let capacity_units = limiter.total_units();
    if let Some(error) = failure {
        return Err(failed(error.into(), &mut [&mut lane], checkpointer).await?);
    }
    lane.finish(checkpointer, sink).await?;
    // A scan ends only once every batch is acknowledged (a driven run's, `driven` rule 4).
    let committed = checkpointer.drain_handed().await?;
    let written = lane.written;
    let completed = !stopping && committed;
    let segments_done = checkpointer.position().done.count();
    if completed {
        checkpointer.complete(written, capacity_units).await?;
        sink.complete().await?;
    } else {
        checkpointer.flush().await?;
    }
    Ok(ScanOutcome {
        read,
        written,
        capacity_units,
        completed,
        segments_done,
    })
}

/// Starts `reader` where the checkpointer's position stands: its task, what stops it, and its
/// pages, through a queue of a page a reader and `room` more.
fn start_read<R: PageSource>(
    reader: R,
    checkpointer: &Checkpointer,
    room: usize,
) -> (
    AbortOnDrop<Result<(), ReadError>>,
    CancelHandle,
    mpsc::Receiver<PageOut>,
) {
    let (stop, cancel) = Cancel::new();
    let (tx, rx) = mpsc::channel(reader.in_flight() + room);
    let at = checkpointer.position();
    let read = reader.read(at.done.clone(), at.cursors.clone(), tx, cancel);
    (AbortOnDrop(tokio::spawn(read.in_current_span())), stop, rx)
}

/// The stream engine's task panicked (or was aborted): an internal error.
fn engine_failed(error: tokio::task::JoinError) -> Result<EndReason, StreamError> {
    Err(StreamError::Read(ReadError::Internal(format!(
        "stream engine task failed: {error}"
    ))))
}

/// A scan's read task ended: `Ok` when it read every segment or a stop cancelled it.
fn read_ended(
    joined: Result<Result<(), ReadError>, tokio::task::JoinError>,
    stopping: bool,
) -> Result<(), ReadError> {
    match joined {
        // The task that schedules segments panicked (or was aborted): an internal error.
        Err(error) => Err(ReadError::Internal(format!(
            "segment scheduler task failed: {error}"
        ))),
        Ok(Err(ReadError::Cancelled)) if stopping => Ok(()),
        Ok(result) => result,
    }
}

/// How a streams run ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOutcome {
    /// Change records written and acknowledged.
    pub written: u64,
    /// Why the run ended.
    pub end: EndReason,
}

/// Runs a stream read until an end condition, writing handed-over records to `sink` and
/// committing the marks of every acknowledged batch.
///
/// `handed` is the receiving end of the engine's hand-over channel. When the engine ends,
/// what it already handed over is written and committed (a clean end, a signal, or
/// `max_messages`); when it fails, the batch being assembled is dropped.
pub async fn run_stream<A: StreamsApi, S: Sink>(
    engine: StreamEngine<A>,
    mut handed: mpsc::Receiver<Handed>,
    limits: BatchLimits,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    progress: &dyn Progress,
) -> Result<StreamOutcome, RunError> {
    let mut engine_task = AbortOnDrop(tokio::spawn(engine.run().in_current_span()));
    let report = |written, _: &Checkpointer| progress.advanced(written, 0.0);
    let mut lane = Lane::new(limits, &report);
    let ended = loop {
        tokio::select! {
            biased;
            joined = &mut engine_task.0 => break joined.unwrap_or_else(engine_failed),
            next = handed.recv() => {
                let Some(next) = next else {
                    // The engine dropped its hand-over: its result follows at once.
                    break (&mut engine_task.0).await.unwrap_or_else(engine_failed);
                };
                let full = lane.batcher.push_handed(next);
                lane.deliver_all(checkpointer, sink, full).await?;
            }
            settled = checkpointer.next_settled() => checkpointer.settled(settled).await?,
            () = lane.lingered() => lane.finish(checkpointer, sink).await?,
        }
    };
    let end = match ended {
        Ok(end) => end,
        Err(error) => return Err(failed(error.into(), &mut [&mut lane], checkpointer).await?),
    };
    // What was handed over before the end is written and committed.
    while let Ok(next) = handed.try_recv() {
        let full = lane.batcher.push_handed(next);
        lane.deliver_all(checkpointer, sink, full).await?;
    }
    lane.finish(checkpointer, sink).await?;
    checkpointer.drain_handed().await?;
    checkpointer.flush().await?;
    Ok(StreamOutcome {
        written: lane.written,
        end,
    })
}

/// A read failed: the batches being assembled are dropped, what was acknowledged is
/// committed. Returns the error to report (or the state error that hid it).
async fn failed(
    error: RunError,
    lanes: &mut [&mut Lane<'_, Checkpointer>],
    checkpointer: &mut Checkpointer,
) -> Result<RunError, RunError> {
    ddbpipe_source::health::failed(&error);
    for lane in lanes {
        drop(lane.batcher.take());
    }
    checkpointer.give_up_handed().await?;
    checkpointer.flush().await?;
    Ok(error)
}

/// A spawned task that is aborted when its owner is dropped: a run whose caller gives up (a
/// timeout, a crash of the calling task) stops reading instead of running on unseen.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
