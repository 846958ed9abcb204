//! A scan or query shared by several workers through segment leases (docs/coordination.md
//! §11.10): each worker reads the segments it holds, writes their pages to its own sink, and
//! checkpoints each segment in its lease row.
//!
//! # Ordering
//! 1. A page's records are written and acknowledged before its cursor is checkpointed, so a
//!    lease row never runs ahead of the data (the same rule as docs/scan.md §2.5).
//! 2. A segment's cursor is written to its lease at most every `checkpoint_interval`, and at
//!    once when the segment ends (`Done`, which hands the lease back finished) and before a
//!    graceful stop hands the lease back.
//! 3. The worker's leases are renewed by its keeper, on a timer of its own: a slow batch or
//!    a busy reader delays the rounds, not the renewals (docs/coordination.md §11.4 rule 1).
//! 4. A lease reported lost (by the keeper, a round, or a checkpoint whose condition failed)
//!    stops its segment at once: its task is cancelled and nothing more is checkpointed for
//!    it. Pages of it already read may still be written to this worker's sink: a hand-over
//!    repeats at most what was read after the last checkpoint, in the new owner's output (at
//!    least once).
//!
//! # Fencing (§11.7 rule 4)
//! A sink that keeps lease fences (the keyed sinks: every worker writes one database) gets one
//! page per batch, written with its segment's lease counter in the batch's transaction; a
//! taken lease's counter is stored first (`Sink::claim`). A batch whose fence holds a newer
//! owner's counter is refused with nothing written, and its segment is lost to this worker:
//! a worker that lost a lease cannot write rows for it once the new owner has claimed it.
//!
//! # Ending
//! - Every segment `Done` in the lease table: the run is complete, on every worker, and the
//!   sink is told (`Sink::complete`). A worker that finishes a segment runs a round at once,
//!   so the one that writes the last `Done` sees the end then; the others see it at their
//!   next round, within a third of the lease duration.
//! - `stop` (SIGINT/SIGTERM): reading stops, the pages already read are written, every held
//!   segment's last acknowledged cursor is checkpointed, and every lease is handed back, so
//!   the other workers take them at their next round.
//! - A read or sink failure: what was acknowledged is checkpointed, the leases are handed back,
//!   and the error is returned.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ddbpipe_source::api::TableApi;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::lease::{
    KeeperHandle, LeaseCounter, LeaseError, LeaseTable, LocalTime, LostReason, UnitId, UnitSpec,
    Worker,
};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::records::SegmentCursor;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use ddbpipe_source::scan::{PageOut, SegmentReader};
use ddbpipe_value::Item;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::units::{self, Checkpointed, Rounds, Took};
use super::{Progress, RunError, batch_pages, pending_deadline, sleep_until};
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::events::BatchAcknowledged;
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
    /// The open shared snapshot the segments are read for (a mirror across workers,
    /// docs/coordination.md §11.12): every batch carries its id in its fence. `None` for a
    /// scan or query.
    pub snapshot: Option<i64>,
}

/// What one worker's leases did in a run (the run summary and `--json` name them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Leases taken, steals included.
    pub taken: u64,
    /// Of those, taken from a live worker (§11.4 rule 4).
    pub stolen: u64,
    /// Leases lost to another worker or to expiry.
    pub lost: u64,
    /// Segments this worker read to their end.
    pub finished: u64,
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

/// What a segment's task left: its id, its segment and how its read ended, or how it died.
type SegmentJoined =
    Result<(tokio::task::Id, (u32, Result<(), ReadError>)), tokio::task::JoinError>;

/// A segment this worker holds.
struct Holding {
    /// Where the segment stands once the acknowledged batches are in: `None` at its start.
    acknowledged: Option<Item>,
    /// Whether `acknowledged` is newer than the lease row's checkpoint.
    unsaved: bool,
    /// When the lease row was last checkpointed.
    saved_at: Instant,
    /// Cancels its reading task; `None` while it waits for a reading slot.
    reading: Option<CancelHandle>,
    /// Read to its end, acknowledged, but the `Done` checkpoint is still to be written.
    ended: bool,
}

impl<A: TableApi, T: LeaseTable> LeasedScan<A, T> {
    /// Runs this worker until every segment is done, `stop` fires, or something fails.
    pub async fn run<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedOutcome, RunError> {
        let LeasedScan {
            reader,
            worker,
            batch,
            checkpoint_interval,
            identity,
            snapshot,
        } = self;
        let total = reader.total_segments.max(1);
        let (tx, rx) = mpsc::channel(reader.max_concurrency.max(1) + batch_pages(batch));
        let mut run = Run {
            reader,
            worker,
            identity,
            snapshot,
            total,
            checkpoint_interval,
            origin: Instant::now(),
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            tx,
            counts: LeaseCounts::default(),
            read: 0,
            written: 0,
            stopping: false,
            finished_one: false,
        };
        sink.start(RunStart::Resumed).await?;
        let mut rounds = Rounds::new(run.origin, run.worker.settings().renew_interval());
        let mut keeper = run.worker.keeper().spawn(rounds.clock());
        let result = run
            .drive(sink, rx, batch, &stop, progress, &mut rounds, &mut keeper)
            .await;
        // Whatever happened, what was acknowledged is checkpointed and the leases handed back,
        // so the other workers take them at their next round instead of after expiry.
        let saved = run.save_all(true).await;
        let released = run.worker.release_all().await;
        drop(keeper);
        for (unit, error) in &released {
            tracing::warn!(lease = %unit, error = %error, "A lease could not be handed back; it expires instead.");
        }
        let completed = result?;
        saved?;
        if completed {
            sink.complete().await?;
        }
        let segments_done = run.segments_done();
        Ok(LeasedOutcome {
            read: run.read,
            written: run.written,
            capacity_units: run.reader.limiter.total_units(),
            completed,
            segments_done,
            total_segments: total,
            leases: run.counts,
        })
    }
}

struct Run<A, T> {
    reader: SegmentReader<A>,
    worker: Worker<T>,
    identity: Identity,
    snapshot: Option<i64>,
    total: u32,
    checkpoint_interval: Duration,
    origin: Instant,
    held: BTreeMap<u32, Holding>,
    tasks: JoinSet<(u32, Result<(), ReadError>)>,
    running: HashMap<tokio::task::Id, u32>,
    tx: mpsc::Sender<PageOut>,
    counts: LeaseCounts,
    read: u64,
    written: u64,
    /// The run stops: no segment starts reading any more.
    stopping: bool,
    /// A segment was finished since the last round: the next one runs at once.
    finished_one: bool,
}

impl<A: TableApi, T: LeaseTable> Run<A, T> {
    fn now(&self) -> LocalTime {
        LocalTime::new(self.origin.elapsed())
    }

    fn unit(&self, segment: u32) -> UnitId {
        UnitId::Segment {
            index: segment,
            total: self.total,
        }
    }

    /// The loop; returns whether every segment is done.
    #[allow(clippy::too_many_arguments)] // The loop's wiring, passed once.
    async fn drive<S: Sink>(
        &mut self,
        sink: &mut S,
        mut rx: mpsc::Receiver<PageOut>,
        limits: BatchLimits,
        stop: &Cancel,
        progress: &dyn Progress,
        rounds: &mut Rounds,
        keeper: &mut KeeperHandle,
    ) -> Result<bool, RunError> {
        // A fencing sink gets one unit per batch: a page is a batch (module docs, Fencing).
        let fenced = sink.fences();
        let mut batcher = Batcher::new(if fenced {
            BatchLimits::UNBOUNDED
        } else {
            limits
        });
        let mut deadline: Option<Instant> = None;
        loop {
            if std::mem::take(&mut self.finished_one) {
                rounds.soon();
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                event = keeper.next() => {
                    if let Some(lost) = units::kept(event, &self.worker)?
                        && let UnitId::Segment { index, .. } = lost.unit
                    {
                        self.lose(index, &lost.reason);
                    }
                }
                () = tokio::time::sleep_until(rounds.next) => {
                    let (complete, again, expiry) = self.round(sink).await?;
                    if complete && self.held.is_empty() && !batcher.has_pending() {
                        return Ok(true);
                    }
                    // A leader that just created rows takes its share at once.
                    rounds.ran(expiry, again);
                }
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.joined(joined)?;
                }
                page = rx.recv() => {
                    let Some(page) = page else { break };
                    self.page(sink, &mut batcher, page, progress).await?;
                    deadline = pending_deadline(&batcher, deadline);
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    deadline = None;
                    if let Some(batch) = batcher.take() {
                        self.deliver(sink, batch, progress).await?;
                    }
                }
            }
        }
        // Stopping: reading stops, what was read is written.
        self.stopping = true;
        for holding in self.held.values_mut() {
            if let Some(cancel) = holding.reading.take() {
                cancel.cancel();
            }
        }
        // A task may wait to hand on a page: the channel is read while they end.
        while !self.tasks.is_empty() {
            tokio::select! {
                Some(joined) = self.tasks.join_next_with_id() => self.joined(joined)?,
                Some(page) = rx.recv() => self.page(sink, &mut batcher, page, progress).await?,
            }
        }
        while let Ok(page) = rx.try_recv() {
            self.page(sink, &mut batcher, page, progress).await?;
        }
        if let Some(batch) = batcher.take() {
            self.deliver(sink, batch, progress).await?;
        }
        Ok(false)
    }

    /// A page read: cut into batches and delivered; a fencing sink's page is a batch of its own.
    async fn page<S: Sink>(
        &mut self,
        sink: &mut S,
        batcher: &mut Batcher,
        page: PageOut,
        progress: &dyn Progress,
    ) -> Result<(), RunError> {
        self.read += page.records.len() as u64;
        for batch in batcher.push(page) {
            self.deliver(sink, batch, progress).await?;
        }
        if sink.fences()
            && let Some(batch) = batcher.take()
        {
            self.deliver(sink, batch, progress).await?;
        }
        Ok(())
    }

    /// One round (§11.4): renew, list, take, steal; as the leader, write the segments' rows.
    /// Returns whether every segment is done, whether to run the next round at once, and when
    /// a lease seen standing still expires.
    async fn round<S: Sink>(
        &mut self,
        sink: &mut S,
    ) -> Result<(bool, bool, Option<LocalTime>), RunError> {
        let report = self.worker.round(self.now()).await?;
        if report.transient.is_empty() {
            // The lease table answered: a worker waiting for work is idle, not stalled.
            ddbpipe_source::health::answered();
        }
        let now = self.now();
        let identified = units::same_run(&mut self.worker, &self.identity, now).await?;
        tracing::trace!(
            at_ms = self.origin.elapsed().as_millis() as u64,
            held = self.held.len(),
            leader = report.leader,
            target = report.target,
            "Lease round."
        );
        for error in &report.transient {
            tracing::debug!(error = %error, "A lease request failed; the next round retries it.");
        }
        for lost in report.lost {
            if let UnitId::Segment { index, .. } = lost.unit {
                self.lose(index, &lost.reason);
            }
        }
        for taken in report.taken {
            let UnitId::Segment { index, total } = taken.unit else {
                continue;
            };
            if total != self.total {
                continue;
            }
            let Took::Held(claimed) = units::took(
                &self.worker,
                &mut self.counts,
                sink,
                &taken,
                self.held.len() + 1,
            )
            .await?
            else {
                continue;
            };
            // A fencing sink's position was committed with its rows: it is the newer one.
            let (start, ended) = match claimed.as_ref().or(taken.checkpoint.as_ref()) {
                None => (None, false),
                // Read to its end, the `Done` checkpoint lost: it is written at once.
                Some(LeaseCheckpoint::Done) => (None, true),
                Some(LeaseCheckpoint::Cursor(key)) => (Some(key.clone()), false),
                Some(other) => {
                    let why = other.unreadable(&taken.unit, "a segment's cursor");
                    return Err(RunError::Lease(LeaseError::Fatal(why)));
                }
            };
            // Held here still: the keeper lost the earlier tenure while this round ran (its
            // report is on its way, and `units::kept` drops it): that tenure stops first.
            if self.held.contains_key(&index) {
                self.lose(index, &LostReason::Expired);
            }
            self.held.insert(
                index,
                Holding {
                    acknowledged: start,
                    unsaved: ended,
                    saved_at: Instant::now(),
                    reading: None,
                    ended,
                },
            );
        }
        let mut again = false;
        if report.leader && identified {
            let synced = self.worker.sync(&UnitSpec::segments(self.total)).await?;
            if !synced.created.is_empty() {
                tracing::info!(created = synced.created.len(), "Segment leases created.");
                again = true;
            }
        }
        self.check_rows()?;
        self.save_all(false).await?;
        self.start_reading();
        Ok((self.all_done(), again, report.next_expiry))
    }

    /// Rows of another segment count mean the pipeline's `segments` changed while a shared
    /// scan was unfinished: refused, naming both.
    fn check_rows(&self) -> Result<(), RunError> {
        let other = self.worker.rows().iter().find_map(|row| match row.unit {
            UnitId::Segment { total, .. } if total != self.total => Some(total),
            _ => None,
        });
        match other {
            Some(other) => Err(RunError::Lease(LeaseError::Fatal(format!(
                "the lease table holds an unfinished scan of {other} segment(s) for this \
                 pipeline, but source.segments is {}: set it back to {other}, or run `ddbpipe \
                 state reset` once no worker runs",
                self.total
            )))),
            None => Ok(()),
        }
    }

    /// Whether the lease table has every segment's row, each finished.
    fn all_done(&self) -> bool {
        self.segments_done() == u64::from(self.total)
    }

    fn segments_done(&self) -> u64 {
        self.worker
            .rows()
            .iter()
            .filter(|row| matches!(row.unit, UnitId::Segment { total, .. } if total == self.total))
            .filter(|row| row.state.is_finished())
            .count() as u64
    }

    /// Starts the held segments that wait, up to `max_concurrency` read at once.
    fn start_reading(&mut self) {
        if self.stopping {
            return;
        }
        let limit = self.reader.max_concurrency.max(1);
        let mut reading = self.held.values().filter(|h| h.reading.is_some()).count();
        for (&segment, holding) in &mut self.held {
            if reading >= limit {
                break;
            }
            if holding.reading.is_some() || holding.ended {
                continue;
            }
            let (cancel, cancelled) = Cancel::new();
            let reader = self.reader.clone();
            let out = self.tx.clone();
            let start = holding.acknowledged.clone();
            let handle = self.tasks.spawn(
                async move {
                    let result = reader.read_segment(segment, start, out, cancelled).await;
                    (segment, result)
                }
                .in_current_span(),
            );
            self.running.insert(handle.id(), segment);
            holding.reading = Some(cancel);
            reading += 1;
        }
    }

    /// A segment's task ended: read to its end (its `Done` page follows through the
    /// channel), cancelled because its lease was lost or the run stops, or failed.
    fn joined(&mut self, joined: SegmentJoined) -> Result<(), RunError> {
        match joined {
            Ok((id, (segment, result))) => {
                self.running.remove(&id);
                match result {
                    Ok(()) | Err(ReadError::Cancelled) => Ok(()),
                    Err(error) => {
                        tracing::error!(segment, error = %error, "Segment read failed.");
                        Err(RunError::Read(error))
                    }
                }
            }
            Err(error) => {
                let segment = self.running.remove(&error.id()).unwrap_or_default();
                if error.is_panic() {
                    return Err(RunError::Read(ReadError::Panicked {
                        segment,
                        message: "segment task panicked".into(),
                    }));
                }
                Ok(())
            }
        }
    }

    /// Writes a batch, then records its cursors; checkpoints what is due.
    async fn deliver<S: Sink>(
        &mut self,
        sink: &mut S,
        batch: Batch,
        progress: &dyn Progress,
    ) -> Result<(), RunError> {
        // A fencing sink's batch is one page, so one unit's; its cursor goes with the rows.
        let segment = batch.segments.first().map(|&(segment, _)| segment);
        let position = batch.segments.last().map(|(_, cursor)| match cursor {
            SegmentCursor::Next(key) => LeaseCheckpoint::Cursor(key.clone()),
            SegmentCursor::Done => LeaseCheckpoint::Done,
        });
        let unit = segment.map(|s| self.unit(s));
        if !units::write(&self.worker, sink, unit, position, self.snapshot, &batch).await? {
            if let Some(segment) = segment {
                self.lose(segment, &LostReason::Taken);
            }
            return Ok(());
        }
        BatchAcknowledged { batch: &batch }.emit();
        self.written += batch.records.len() as u64;
        progress.advanced(self.written, self.reader.limiter.total_units());
        for (segment, cursor) in &batch.segments {
            // A segment whose lease was lost is not checkpointed any more (module docs, 3).
            let Some(holding) = self.held.get_mut(segment) else {
                continue;
            };
            holding.unsaved = true;
            match cursor {
                SegmentCursor::Next(key) => holding.acknowledged = Some(key.clone()),
                SegmentCursor::Done => {
                    holding.ended = true;
                    if let Some(cancel) = holding.reading.take() {
                        cancel.cancel();
                    }
                }
            }
        }
        self.save_all(false).await?;
        self.start_reading();
        Ok(())
    }

    /// Checkpoints the held segments whose acknowledged cursor is newer than their row: ended
    /// ones always, the others once `checkpoint_interval` passed (or all, with `every`).
    async fn save_all(&mut self, every: bool) -> Result<(), RunError> {
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.unsaved && (every || h.ended || h.saved_at.elapsed() >= self.checkpoint_interval)
            })
            .map(|(segment, _)| *segment)
            .collect();
        for segment in due {
            let Some(holding) = self.held.get(&segment) else {
                continue;
            };
            let unit = self.unit(segment);
            let checkpoint = if holding.ended {
                LeaseCheckpoint::Done
            } else {
                match &holding.acknowledged {
                    Some(key) => LeaseCheckpoint::Cursor(key.clone()),
                    None => continue,
                }
            };
            let now = self.now();
            let result = self.worker.checkpoint(&unit, &checkpoint, now).await;
            match units::checkpointed(&unit, result)? {
                Checkpointed::Saved(counter) => self.saved(segment, counter),
                Checkpointed::Lost(reason) => self.lose(segment, &reason),
                // Kept unsaved: the next batch or round writes it again.
                Checkpointed::Later => {}
            }
        }
        Ok(())
    }

    fn saved(&mut self, segment: u32, counter: LeaseCounter) {
        let Some(holding) = self.held.get_mut(&segment) else {
            return;
        };
        holding.unsaved = false;
        holding.saved_at = Instant::now();
        if holding.ended {
            self.held.remove(&segment);
            self.finished_one = true;
            self.counts.finished += 1;
            self.event("finished", 0);
            tracing::debug!(
                segment,
                counter = counter.0,
                "Segment done; lease handed back."
            );
        }
    }

    /// Tells the metrics; `more` counts a lease about to be added to `held`.
    fn event(&self, event: &'static str, more: usize) {
        units::event(&self.worker, event, self.held.len() + more);
    }

    /// A lease is lost: its segment stops at once, without another checkpoint.
    fn lose(&mut self, segment: u32, reason: &LostReason) {
        if let Some(holding) = self.held.remove(&segment) {
            if let Some(cancel) = holding.reading {
                cancel.cancel();
            }
            let unit = self.unit(segment);
            units::lost(
                &self.worker,
                &mut self.counts,
                &unit,
                reason,
                self.held.len(),
            );
        }
    }
}
