//! Scan segments as leased units (docs/coordination.md §11.10): a scan or query shared by
//! several workers. The leader writes a row per segment once the run's settings are stored; a
//! taken segment is read from its row's cursor, its pages' cursors are its positions, and the
//! run is complete, on every worker, once every segment row is `Done` (the worker that writes
//! the last `Done` runs a round at once and sees it then; the others within a third of the lease
//! duration). Then the sink is told (`Sink::complete`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ddbpipe_source::api::TableApi;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::lease::{Lease, LeaseError, LeaseTable, UnitId, UnitSpec, Worker};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::records::SegmentCursor;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::scan::{PageOut, SegmentRead, SegmentReader};
use ddbpipe_source::streams::leased::ReadFlags;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::units::{SnapshotMark, Units, View};
use super::{LeaseCounts, Leased, unreadable};
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::runner::{Progress, RunError};
use crate::sink::{RunStart, Sink};
use crate::state::identity::Identity;

/// A scan or query run by one worker of several.
pub struct LeasedScan<A, T> {
    /// Reads one segment at a time (`SegmentReader::read_segment`).
    pub reader: SegmentReader<A>,
    /// This worker on the lease table.
    pub worker: Worker<T>,
    /// How large a batch may grow.
    pub batch: BatchLimits,
    /// Least time between two checkpoints of one segment (`state.flush_interval_ms`).
    pub checkpoint_interval: Duration,
    /// The run's settings, kept in the leader row: a worker with other settings is refused.
    pub identity: Identity,
}

/// How one worker's part of a shared scan ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedOutcome {
    /// Items received from DynamoDB by this worker.
    pub read: u64,
    /// Items written and acknowledged by this worker.
    pub written: u64,
    /// Read capacity units consumed by this worker.
    pub capacity_units: f64,
    /// `true` when every segment of the table is done (by any worker); `false` when stopped.
    pub completed: bool,
    /// Segments done in the lease table, of `total`.
    pub segments_done: u64,
    /// The table's segments.
    pub total_segments: u32,
    /// What this worker's leases did.
    pub leases: LeaseCounts,
}

impl<A: TableApi, T: LeaseTable> LeasedScan<A, T> {
    /// Runs this worker until every segment is done, `stop` fires, or something fails.
    pub async fn run<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedOutcome, RunError> {
        let total = self.reader.total_segments.max(1);
        let segments = Segments::new(Arc::new(self.reader), self.batch, SnapshotMark::default());
        let parts = (self.worker, self.checkpoint_interval, self.identity);
        let outcome = read_segments(segments, parts, sink, stop, progress).await?;
        if outcome.completed {
            sink.complete().await?;
        }
        Ok(LeasedOutcome {
            total_segments: total,
            ..outcome
        })
    }
}

/// This worker's part of a shared run of `segments` (a scan's, a repair's window), with its
/// worker, checkpoint interval and settings: until every segment is done (by any worker),
/// `stop` fires, or something fails.
pub(crate) async fn read_segments<T: LeaseTable, S: Sink>(
    segments: Segments,
    (worker, checkpoint_interval, identity): (Worker<T>, Duration, Identity),
    sink: &mut S,
    stop: Cancel,
    progress: &dyn Progress,
) -> Result<LeasedOutcome, RunError> {
    let run = Leased {
        units: segments,
        worker,
        checkpoint_interval,
        identity,
    };
    sink.start(RunStart::Resumed).await?;
    let (ran, segments) = run.run(sink, stop, progress).await?;
    Ok(LeasedOutcome {
        read: segments.items_read(),
        written: ran.written,
        capacity_units: segments.capacity_units(),
        completed: ran.end,
        segments_done: segments.done(&ran.rows),
        total_segments: segments.total().unwrap_or_default(),
        leases: ran.leases,
    })
}

/// The segments of one snapshot or scan: a Scan's, or an export's data files.
pub(crate) struct Segments {
    /// What reads them, once known: an export's files are known once it completed.
    reader: OnceLock<Arc<dyn SegmentRead>>,
    /// Until then, the task waiting for the export (`Segments::waiting`).
    waiting: Mutex<Option<Waiting>>,
    /// Why that task failed, until `check` fails the run with it.
    failed: Mutex<Option<RunError>>,
    batch: BatchLimits,
    /// Items received.
    read: u64,
    /// What the segments' batches carry of a shared mirror's record: the open snapshot whose
    /// rows they are, or the repair whose window's changes they are.
    mark: SnapshotMark,
}

/// The task that finds a snapshot's segments (an export's wait and manifests).
pub(crate) type Waiting = tokio::task::JoinHandle<Result<Arc<dyn SegmentRead>, RunError>>;

impl Segments {
    /// The segments `reader` reads, in batches of `batch` carrying `mark`.
    pub(crate) fn new(
        reader: Arc<dyn SegmentRead>,
        batch: BatchLimits,
        mark: SnapshotMark,
    ) -> Self {
        Segments {
            reader: OnceLock::from(reader),
            waiting: Mutex::new(None),
            failed: Mutex::new(None),
            batch,
            read: 0,
            mark,
        }
    }

    /// The segments `waiting` finds (an export's files once it completed): none is listed or
    /// read before (one taken meanwhile is held); its failure fails the run at the next round
    /// (`check`).
    pub(crate) fn waiting(waiting: Waiting, batch: BatchLimits, mark: SnapshotMark) -> Self {
        Segments {
            reader: OnceLock::new(),
            waiting: Mutex::new(Some(waiting)),
            failed: Mutex::new(None),
            batch,
            read: 0,
            mark,
        }
    }

    /// The reader, once known: takes the waiting task's result when it has finished (its
    /// failure is kept for `check`, which fails the run with it).
    fn reader(&self) -> Option<&Arc<dyn SegmentRead>> {
        if self.reader.get().is_none() {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(task) = waiting.take_if(|task| task.is_finished()) {
                match task.now_or_never() {
                    Some(Ok(Ok(reader))) => {
                        let _ = self.reader.set(reader);
                    }
                    // Stopped with the run, whose stop ends it (docs/coordination.md §11.12
                    // rule 6): no failure.
                    Some(Ok(Err(RunError::Read(ReadError::Cancelled)))) => {}
                    Some(Ok(Err(error))) => *self.lock_failed() = Some(error),
                    Some(Err(failed)) => {
                        *self.lock_failed() = Some(RunError::Read(ReadError::Internal(format!(
                            "the task finding the snapshot's segments failed: {failed}"
                        ))));
                    }
                    None => {}
                }
            }
        }
        self.reader.get()
    }

    fn lock_failed(&self) -> std::sync::MutexGuard<'_, Option<RunError>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open shared snapshot whose rows the segments are.
    pub(crate) fn snapshot(&self) -> Option<i64> {
        self.mark.rows
    }

    /// The segments' number, once known.
    pub(crate) fn total(&self) -> Option<u32> {
        self.reader().map(|reader| reader.total())
    }

    /// Whether the segments are known.
    pub(crate) fn known(&self) -> bool {
        self.reader().is_some()
    }

    /// Items received.
    pub(crate) fn items_read(&self) -> u64 {
        self.read
    }

    /// Segment rows of this scan finished in `rows`.
    pub(crate) fn done(&self, rows: &[Lease]) -> u64 {
        let Some(total) = self.total() else { return 0 };
        rows.iter()
            .filter(|row| matches!(row.unit, UnitId::Segment { total: t, .. } if t == total))
            .filter(|row| row.state.is_finished())
            .count() as u64
    }
}

impl Drop for Segments {
    /// A run that ends before its export completed stops waiting for it.
    fn drop(&mut self) {
        let waiting = self.waiting.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = waiting.take() {
            task.abort();
        }
    }
}

impl Units for Segments {
    type Read = PageOut;
    /// Whether every segment is done.
    type End = bool;

    const DEPTH: usize = 1;

    /// A segment of this snapshot; while its export is awaited, any segment (held, not read
    /// before the files are known; one of another count fails `check` then).
    fn owns(&self, unit: &UnitId) -> bool {
        match (unit, self.total()) {
            (UnitId::Segment { total, .. }, Some(ours)) => *total == ours,
            (UnitId::Segment { .. }, None) => true,
            _ => false,
        }
    }

    fn starts(&self, unit: &UnitId, at: Option<&LeaseCheckpoint>) -> Result<(), RunError> {
        match at {
            None | Some(LeaseCheckpoint::Cursor(_) | LeaseCheckpoint::Done) => Ok(()),
            Some(other) => Err(unreadable(unit, other)),
        }
    }

    fn read(
        &self,
        unit: &UnitId,
        from: Option<&LeaseCheckpoint>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
        _flags: ReadFlags,
    ) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError> {
        let UnitId::Segment { index, .. } = *unit else {
            return Err(self.panicked(unit));
        };
        let start = match from {
            None => None,
            Some(LeaseCheckpoint::Cursor(key)) => Some(key.clone()),
            Some(other) => return Err(unreadable(unit, other)),
        };
        let Some(reader) = self.reader() else {
            return Err(self.panicked(unit));
        };
        let reading = reader.read_one(index, start, out, cancel);
        Ok(async move {
            match reading.await {
                Ok(()) | Err(ReadError::Cancelled) => Ok(()),
                Err(error) => Err(RunError::Read(error)),
            }
        }
        .boxed())
    }

    fn panicked(&self, unit: &UnitId) -> RunError {
        let segment = match unit {
            UnitId::Segment { index, .. } => *index,
            _ => u32::MAX,
        };
        RunError::Read(ReadError::Panicked {
            segment,
            message: "segment task panicked".into(),
        })
    }

    /// Not before the segments are known.
    fn may_read(&self, _unit: &UnitId, reading: usize) -> bool {
        self.reader()
            .is_some_and(|reader| reading < reader.max_concurrency())
    }

    /// A snapshot batch is guarded by its rows' snapshot, a repair's by its window's record:
    /// either names the generation.
    fn snapshot_of(&self, _unit: &UnitId) -> SnapshotMark {
        self.mark
    }

    fn push(&mut self, batcher: &mut Batcher, page: PageOut) -> Vec<Batch> {
        self.read += page.records.len() as u64;
        batcher.push(page)
    }

    fn marks(&self, batch: &Batch) -> Vec<(UnitId, LeaseCheckpoint)> {
        batch
            .segments
            .iter()
            .map(|(index, cursor)| {
                let unit = UnitId::Segment {
                    index: *index,
                    total: self.total().unwrap_or_default(),
                };
                let at = match cursor {
                    SegmentCursor::Next(key) => LeaseCheckpoint::Cursor(key.clone()),
                    SegmentCursor::Done => LeaseCheckpoint::Done,
                };
                (unit, at)
            })
            .collect()
    }

    /// Every batch: a page without items still moves its segment's cursor in a fence.
    fn writes(&self, _batch: &Batch) -> bool {
        true
    }

    fn limits(&self) -> BatchLimits {
        self.batch
    }

    fn capacity_units(&self) -> f64 {
        self.reader()
            .map_or(0.0, |reader| reader.limiter().total_units())
    }

    /// The segment rows, once the segments are known.
    async fn specs(
        &mut self,
        _rows: &[Lease],
        _stop: &Cancel,
    ) -> Result<Option<Vec<UnitSpec>>, RunError> {
        Ok(self.total().map(UnitSpec::segments))
    }

    /// Rows of another segment count mean the pipeline's `segments` changed while a shared
    /// scan was unfinished: refused, naming both.
    fn check(&self, rows: &[Lease]) -> Result<(), RunError> {
        let ours = self.total();
        if let Some(failed) = self.lock_failed().take() {
            return Err(failed);
        }
        let Some(ours) = ours else {
            return Ok(());
        };
        let other = rows.iter().find_map(|row| match row.unit {
            UnitId::Segment { total, .. } if total != ours => Some(total),
            _ => None,
        });
        match other {
            Some(other) => Err(RunError::Lease(LeaseError::Fatal(format!(
                "the lease table holds an unfinished scan of {other} segment(s) for this \
                 pipeline, but source.segments is {}: set it back to {other}, or run `ddbpipe \
                 state reset` once no worker runs",
                ours
            )))),
            None => Ok(()),
        }
    }

    fn ended(&self, view: &View<'_>) -> Option<bool> {
        let total = self.total()?;
        let complete = self.done(view.rows) == u64::from(total);
        (complete && view.held.is_empty() && !view.pending).then_some(true)
    }

    fn stopped(&self) -> bool {
        false
    }
}
