//! A mirror shared by several workers (docs/coordination.md §11.12), the same algorithm as one
//! process's (docs/mirror.md §5.2, §5.6): the snapshot's segments are read beside the stream,
//! then the complete-read cleanup runs once, then the stream goes on. One process is the case
//! of one worker.
//!
//! # The snapshot record
//! The destination's database keeps the snapshot's record ([`SharedSnapshots`]): opened before
//! any snapshot row is written (the first worker's record wins, with the row count the
//! destination then held), closed by the cleanup's own transaction. So:
//! - every worker marks its snapshot rows with the one snapshot id;
//! - a batch of snapshot rows is refused once the record is closed (a worker still reading a
//!   segment after the close, a zombie, cannot write an old image over a streamed change);
//! - the cleanup runs once: a second worker's close finds the record closed and does nothing,
//!   also when the first one died right after its commit.
//!
//! # Phases
//! 1. **Segments beside the stream**: one leased run holding both kinds of unit. The leader
//!    writes the segment rows and, from its first listing, the shard rows at their trim
//!    horizon, in one sync (each kind's own sync would delete the other's finished rows).
//!    Segment batches carry the snapshot id as their rows' (`Fence::snapshot`); shard batches
//!    carry it as the snapshot they were read beside (`Fence::beside`): their upserts are
//!    marked with it and their deletes leave markers, so a snapshot row never overwrites a
//!    newer change, whichever worker wrote either (docs/mirror.md §5.6). The phase ends, on
//!    every worker, once every segment row is `Done`; the shard leases are handed back with
//!    their checkpoints.
//! 2. **Cleanup**: each worker that saw the segments complete tries the close; one commits it.
//!    When it skipped its deletes (more keys than `resnapshot_max_keys`), that worker stops
//!    once with [`StreamRunError::CleanupSkipped`], as one process does.
//! 3. **Stream**: a shared stream ([`LeasedStreams`]) on the same shard rows, from their
//!    checkpoints. A change read beside the snapshot by a worker still in phase 1 after the
//!    close is still marked with the closed snapshot's id: harmless, no cleanup of that
//!    snapshot runs again.
//!
//! # Gaps
//! The stream is read from the snapshot's start, so the snapshot may take any time: a gap is
//! a position the stream no longer holds (a shard trimmed past its checkpoint while no worker
//! read it), found by the shard's read as in one process, never assumed from a clock.
//!
//! # Exports
//! With `snapshot.engine: export` (docs/coordination.md §11.12 rule 7) the segments are the
//! data files of one export: the one the record names unless it FAILED, else the configured
//! `export_arn`, else a new one whose client token is made of the snapshot's id, so workers
//! starting it at once start one. A new export's ARN is stored in the record by
//! compare-and-set ([`SharedSnapshots::shared_export`]) before anything waits for it: every
//! worker reads the first one stored, whenever it comes. Each worker waits for it on a task of
//! its own while the leased run reads the shards; until its files are known the worker holds
//! the segment leases it takes without reading them, and as the leader writes no sync once
//! another worker wrote the file rows (a sync without them would delete the finished ones).

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument as _;

use ddbpipe_source::api::{SnapshotShape, StreamsApi, TableApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::export::{GivenExport, SnapshotExports};
use ddbpipe_source::lease::Lease;
use ddbpipe_source::lease::{LeaseTable, PipelineName, UnitId, UnitSpec};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::scan::PageOut;
use ddbpipe_source::streams::handover::Handed;
use ddbpipe_source::streams::leased::ReadFlags;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::segments::{Segments, Waiting};
use super::shards::{Shards, shard_reads};
use super::units::{SnapshotMark, Units, View};
use super::{Leased, LeasedOutcome, LeasedScan, LeasedStreamOutcome, LeasedStreams};
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::runner::{Progress, RunError};
use crate::sink::{CleanedUp, CloseShared, RunStart, SharedSnapshot, SharedSnapshots, Sink};
use crate::streams::StreamRunError;

/// A mirror run by one worker of several.
pub struct LeasedMirror<TA, SA, T> {
    /// The snapshot's segments (read beside the stream: their batches carry the record's id).
    pub scan: LeasedScan<TA, T>,
    /// The stream, read beside the segments and after the cleanup from `TRIM_HORIZON`,
    /// keeping the segment rows.
    pub streams: LeasedStreams<SA, T>,
    /// `resnapshot_deletes`: the cleanup deletes the rows the snapshot did not write (only
    /// when the destination held rows when the snapshot was opened).
    pub deletes: bool,
    /// `resnapshot_max_keys`: no delete when the snapshot wrote more keys.
    pub max_keys: u64,
    /// `snapshot.engine: export`: the snapshot is read from a full export instead of `Scan`
    /// pages, its data files leased as segments (module docs, Exports).
    pub exports: Option<SharedExports>,
    /// `on_gap: resnapshot`: a gap this worker finds opens a snapshot of the next generation
    /// in place of the current one, and every worker moves to it (module docs, Gaps);
    /// otherwise the gap fails the worker.
    pub resnapshot: bool,
    /// The export engine a gap is repaired with (`on_gap: repair`, docs/coordination.md §11.12
    /// rule 9; a repair left open in the record is finished through it whatever `on_gap` says
    /// now): `None` without an export bucket.
    pub repairs: Option<SharedExports>,
    /// How often the worker reads the snapshot record to learn that another worker replaced
    /// its snapshot.
    pub watch_interval: Duration,
}

/// A worker's scan and stream of one generation.
type Phases<TA, SA, T> = (LeasedScan<TA, T>, LeasedStreams<SA, T>);

/// How a generation ended on this worker, when it did not fail.
pub(super) enum Ended {
    /// This worker's end (its stream ended).
    Worker(Box<LeasedMirrorOutcome>),
    /// A repair's window was applied and closed, and another window follows: the next
    /// generation goes on with it.
    WindowApplied,
}

/// How a shared mirror's snapshot is read from an export (`snapshot.engine: export`).
#[derive(Clone)]
pub struct SharedExports {
    /// The export engine.
    pub engine: Arc<dyn SnapshotExports>,
    /// The table's ARN, which an export needs.
    pub table_arn: String,
    /// The snapshot rows' table, key schema and format.
    pub shape: Arc<SnapshotShape>,
}

/// How one worker's part of a shared mirror ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedMirrorOutcome {
    /// The snapshot's record, as this worker opened it.
    pub snapshot: SharedSnapshot,
    /// This worker's part of the segments, the changes it wrote beside them included in
    /// `written`; `None` when the snapshot was closed before it came.
    pub scan: Option<LeasedOutcome>,
    /// Of those, the changes written beside the snapshot.
    pub changes_beside: u64,
    /// The cleanup, when this worker ran it.
    pub cleanup: Option<CleanedUp>,
    /// This worker's part of the stream.
    pub streams: LeasedStreamOutcome,
    /// Snapshots this worker saw replaced (a gap, a damaged export) and moved past; what it
    /// wrote under them is not in this outcome's counts.
    pub replaced: u32,
}

impl<TA: TableApi, SA: StreamsApi + 'static, T: LeaseTable + Clone> LeasedMirror<TA, SA, T> {
    /// This worker's scan and stream for the leases of `snapshot`'s generation, kept under
    /// their own name (docs/coordination.md §11.12 rule 8).
    fn parts(&self, snapshot: &SharedSnapshot) -> Result<Phases<TA, SA, T>, StreamRunError> {
        let pipeline = self.scan.worker.pipeline().as_str();
        let partition = PipelineName::new(snapshot.lease_pipeline(pipeline))
            .map_err(|error| StreamRunError::Config(format!("name: {error}")))?;
        let scan = LeasedScan {
            reader: self.scan.reader.clone(),
            worker: self.scan.worker.under(partition.clone()),
            batch: self.scan.batch,
            checkpoint_interval: self.scan.checkpoint_interval,
            identity: self.scan.identity.clone(),
        };
        let mut run = self.streams.run.clone();
        run.start_position = StartPosition::TrimHorizon;
        let streams = LeasedStreams {
            api: Arc::clone(&self.streams.api),
            run,
            worker: self.streams.worker.under(partition),
            checkpoint_interval: self.streams.checkpoint_interval,
            observer: Arc::clone(&self.streams.observer),
            identity: self.streams.identity.clone(),
            kept: Vec::new(),
        };
        Ok((scan, streams))
    }

    /// Runs this worker through the phases (module docs) of `snapshot`'s generation. A stop
    /// during the segments is [`StreamRunError::SnapshotInterrupted`]: the leases are handed
    /// back with their checkpoints and the next run resumes the snapshot.
    pub(super) async fn generation<S: SharedSnapshots>(
        &self,
        mut snapshot: SharedSnapshot,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<Ended, StreamRunError> {
        let (scan, mut streams) = self.parts(&snapshot)?;
        let pipeline = self.scan.worker.pipeline().to_string();
        let worker = scan.worker.id().to_string();
        // The segment rows the stream phase keeps: a Scan's, or those of the export's files
        // (a repair window's included).
        let mut total = (self.exports.is_none() && snapshot.repair.is_none())
            .then(|| scan.reader.total_segments.max(1));
        let mut scanned = None;
        let mut changes_beside = 0;
        let mut cleanup = None;
        if snapshot.closed.is_none() && snapshot.repair.is_some() {
            let outcome = self
                .repair_window(scan, &mut snapshot, sink, &stop, progress)
                .await?;
            total = Some(outcome.total_segments);
            scanned = Some(outcome);
            cleanup = self.close(&pipeline, &worker, &snapshot, sink).await?;
        } else if snapshot.closed.is_none() {
            tracing::info!(
                snapshot = snapshot.id,
                generation = snapshot.generation,
                rows_at_start = snapshot.rows_at_start,
                "The shared snapshot is open: reading its segments beside the stream."
            );
            let segments = match &self.exports {
                None => Segments::new(
                    Arc::new(scan.reader.clone()),
                    scan.batch,
                    SnapshotMark::rows(snapshot.id),
                ),
                Some(exports) => {
                    let arn = match shared_export(exports, &pipeline, &snapshot, sink, &stop).await
                    {
                        // A stop while the export starts: the snapshot is incomplete, as after a
                        // stop during its segments (rule 6 of docs/coordination.md §11.12).
                        Err(RunError::Read(ReadError::Cancelled)) => {
                            return Err(StreamRunError::SnapshotInterrupted);
                        }
                        result => result?,
                    };
                    // The record closes with its export named.
                    snapshot.export = Some(arn.clone());
                    let waiting = export_segments(exports.clone(), arn, false, stop.clone());
                    Segments::waiting(waiting, scan.batch, SnapshotMark::rows(snapshot.id))
                }
            };
            let (outcome, beside) =
                beside_the_stream(scan, segments, &streams, sink, &stop, progress).await?;
            let completed = outcome.completed;
            total = total.or((outcome.total_segments > 0).then_some(outcome.total_segments));
            scanned = Some(outcome);
            changes_beside = beside;
            if !completed {
                return Err(StreamRunError::SnapshotInterrupted);
            }
            cleanup = self.close(&pipeline, &worker, &snapshot, sink).await?;
        }
        if snapshot.repair.and_then(|repair| repair.next()).is_some() {
            return Ok(Ended::WindowApplied);
        }
        // An export's files are unknown to a worker that came after the close: the rows found
        // are kept then (`Shards::specs`).
        streams.kept = total
            .map(UnitSpec::segments)
            .unwrap_or_default()
            .into_iter()
            .map(|spec| spec.starting(LeaseCheckpoint::Done))
            .collect();
        // The stream has no total to show progress against: the observer is told so (issue 24
        // item 20: the stream phase printed the snapshot's item count and percentage).
        progress.streaming();
        let streamed = streams
            .run_of(sink, stop, progress, Some(snapshot.id))
            .await?;
        Ok(Ended::Worker(Box::new(LeasedMirrorOutcome {
            snapshot,
            scan: scanned,
            changes_beside,
            cleanup,
            streams: streamed,
            replaced: 0,
        })))
    }

    /// Tries the close of `snapshot` (its complete-read cleanup, or a repair window's sweep,
    /// docs/coordination.md §11.12 rule 9) as `worker`: what it did when this worker committed
    /// it, `None` when another worker had. A cleanup that skipped its deletes stops the worker
    /// once, as one process does.
    async fn close<S: SharedSnapshots>(
        &self,
        pipeline: &str,
        worker: &str,
        snapshot: &SharedSnapshot,
        sink: &mut S,
    ) -> Result<Option<CleanedUp>, StreamRunError> {
        let close = CloseShared {
            by: worker.to_string(),
            at_ms: unix_now_ms(),
            delete_unseen: self.deletes && snapshot.rows_at_start > 0,
            max_keys: self.max_keys,
        };
        let cleanup = sink
            .close_shared_snapshot(pipeline, snapshot, &close)
            .await
            .map_err(RunError::from)?;
        match (cleanup, snapshot.repair) {
            (Some(done), Some(repair)) => tracing::info!(
                snapshot = snapshot.id,
                window_from_ms = repair.window_from_ms,
                window_to_ms = repair.window_to_ms,
                deleted = done.deleted,
                "Shared repair window closed here: the rows its changes left out are deleted."
            ),
            (Some(done), None) => {
                tracing::info!(
                    snapshot = snapshot.id,
                    keys = done.keys_written,
                    deleted = done.deleted,
                    "Shared snapshot closed here: complete-read cleanup committed."
                );
                if done.ceiling_hit {
                    return Err(StreamRunError::CleanupSkipped {
                        keys: done.keys_written,
                        max_keys: self.max_keys,
                    });
                }
            }
            (None, _) => tracing::info!(
                snapshot = snapshot.id,
                "The shared snapshot was closed by another worker."
            ),
        }
        Ok(cleanup)
    }
}

/// The export shared snapshot `snapshot` reads (module docs, Exports): the one its record
/// names unless it FAILED, else the configured `export_arn`, else a new one whose client token
/// is made of the snapshot's id (so workers starting it at once start one), stored in the
/// record before anything waits for it; the record's export wins. A repair's record reads the
/// incremental export of its window so (`super::repair`, rule 3).
pub(super) async fn shared_export<S: SharedSnapshots>(
    exports: &SharedExports,
    pipeline: &str,
    snapshot: &SharedSnapshot,
    sink: &mut S,
    stop: &Cancel,
) -> Result<String, RunError> {
    let stored = snapshot.export.as_deref();
    let unique = snapshot.id.to_string();
    let engine = &exports.engine;
    let arn = match snapshot.repair {
        None => {
            let given = GivenExport::Read;
            (engine.begin(stored, &exports.table_arn, &unique, given, stop)).await?
        }
        Some(repair) => {
            let window = (repair.window_from_ms, repair.window_to_ms);
            (engine.begin_incremental(stored, &exports.table_arn, window, &unique, stop)).await?
        }
    };
    if stored == Some(arn.as_str()) {
        return Ok(arn);
    }
    let kept = sink
        .shared_export(pipeline, snapshot.id, stored, &arn)
        .await?;
    if kept != arn {
        tracing::warn!(export = %arn, kept = %kept, "Another worker stored the snapshot's export first; this one is not read.");
    }
    Ok(kept)
}

/// The task that waits for export `arn` (`incremental`: a repair window's) and reads its
/// manifests: its data files are the snapshot's segments.
pub(super) fn export_segments(
    exports: SharedExports,
    arn: String,
    incremental: bool,
    stop: Cancel,
) -> Waiting {
    tokio::spawn(
        async move {
            tracing::info!(export = %arn, incremental, "The shared snapshot reads an export.");
            let shape = Arc::clone(&exports.shape);
            let engine = &exports.engine;
            Ok(if incremental {
                engine.incremental_segments(&arn, shape, &stop).await?
            } else {
                engine.segments(&arn, shape, &stop).await?
            })
        }
        .in_current_span(),
    )
}

/// Phase 1 (module docs): this worker's part of the segments, read beside the stream, and the
/// changes it wrote beside them.
async fn beside_the_stream<TA: TableApi, SA: StreamsApi + 'static, T: LeaseTable, S: Sink>(
    scan: LeasedScan<TA, T>,
    segments: Segments,
    streams: &LeasedStreams<SA, T>,
    sink: &mut S,
    stop: &Cancel,
    progress: &dyn Progress,
) -> Result<(LeasedOutcome, u64), RunError> {
    let snapshot = segments.snapshot();
    let source = shard_reads(
        &streams.run,
        Arc::clone(&streams.api),
        Arc::clone(&streams.observer),
    );
    let both = Both {
        segments,
        shards: Shards::new(
            source,
            streams.run.clone(),
            Vec::new(),
            SnapshotMark {
                beside: snapshot,
                of: snapshot,
                ..SnapshotMark::default()
            },
        ),
        listed: Vec::new(),
        changes: 0,
    };
    let leased = Leased {
        units: both,
        worker: scan.worker,
        checkpoint_interval: scan.checkpoint_interval,
        identity: scan.identity,
    };
    sink.start(RunStart::Resumed).await?;
    let (ran, both) = leased.run(sink, stop.clone(), progress).await?;
    let outcome = LeasedOutcome {
        read: both.segments.items_read(),
        written: ran.written,
        capacity_units: both.segments.capacity_units(),
        completed: ran.end,
        segments_done: both.segments.done(&ran.rows),
        total_segments: both.segments.total().unwrap_or_default(),
        leases: ran.leases,
    };
    Ok((outcome, both.changes))
}

/// What a reader of phase 1 hands the loop: a segment's page or a shard's hand-over.
pub(crate) enum MirrorRead {
    /// A segment's page.
    Page(PageOut),
    /// A shard's hand-over.
    Handed(Handed),
}

/// Phase 1's units: the snapshot's segments and the stream's shards, in one leased run.
pub(crate) struct Both<SA> {
    segments: Segments,
    shards: Shards<SA>,
    /// The shard rows of the leader's last listing: every sync writes them with the segments'.
    listed: Vec<UnitSpec>,
    /// Change records written beside the snapshot.
    changes: u64,
}

/// Forwards what a reader of one kind hands over, wrapped, while it reads.
fn wrapped<R: Send + 'static>(
    read: impl FnOnce(mpsc::Sender<R>) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError>,
    out: mpsc::Sender<MirrorRead>,
    wrap: fn(R) -> MirrorRead,
) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError> {
    let (tx, mut rx) = mpsc::channel(1);
    let read = read(tx)?;
    Ok(async move {
        let forward = async move {
            while let Some(item) = rx.recv().await {
                if out.send(wrap(item)).await.is_err() {
                    break;
                }
            }
        };
        let (result, ()) = tokio::join!(read, forward);
        result
    }
    .boxed())
}

impl<SA: StreamsApi + 'static> Units for Both<SA> {
    type Read = MirrorRead;
    /// Whether every segment is done.
    type End = bool;

    const DEPTH: usize = crate::streams::HANDOVER_DEPTH;

    fn owns(&self, unit: &UnitId) -> bool {
        self.segments.owns(unit) || self.shards.owns(unit)
    }

    fn starts(&self, unit: &UnitId, at: Option<&LeaseCheckpoint>) -> Result<(), RunError> {
        match unit {
            UnitId::Shard(_) => self.shards.starts(unit, at),
            _ => self.segments.starts(unit, at),
        }
    }

    fn read(
        &self,
        unit: &UnitId,
        from: Option<&LeaseCheckpoint>,
        out: mpsc::Sender<MirrorRead>,
        cancel: Cancel,
        flags: ReadFlags,
    ) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError> {
        match unit {
            UnitId::Shard(_) => wrapped(
                |tx| self.shards.read(unit, from, tx, cancel, flags),
                out,
                MirrorRead::Handed,
            ),
            _ => wrapped(
                |tx| self.segments.read(unit, from, tx, cancel, flags),
                out,
                MirrorRead::Page,
            ),
        }
    }

    fn panicked(&self, unit: &UnitId) -> RunError {
        match unit {
            UnitId::Shard(_) => self.shards.panicked(unit),
            _ => self.segments.panicked(unit),
        }
    }

    fn may_read(&self, unit: &UnitId, reading: usize) -> bool {
        match unit {
            UnitId::Shard(_) => self.shards.may_read(unit, reading),
            _ => self.segments.may_read(unit, reading),
        }
    }

    fn snapshot_of(&self, unit: &UnitId) -> SnapshotMark {
        match unit {
            UnitId::Shard(_) => self.shards.snapshot_of(unit),
            _ => self.segments.snapshot_of(unit),
        }
    }

    fn push(&mut self, batcher: &mut Batcher, read: MirrorRead) -> Vec<Batch> {
        match read {
            MirrorRead::Page(page) => self.segments.push(batcher, page),
            MirrorRead::Handed(handed) => self.shards.push(batcher, handed),
        }
    }

    fn marks(&self, batch: &Batch) -> Vec<(UnitId, LeaseCheckpoint)> {
        let mut marks = self.segments.marks(batch);
        marks.extend(self.shards.marks(batch));
        marks
    }

    fn writes(&self, batch: &Batch) -> bool {
        !batch.segments.is_empty() || self.shards.writes(batch)
    }

    fn written(&mut self, batch: &Batch) {
        if batch.segments.is_empty() {
            self.changes += batch.records.len() as u64;
        }
    }

    fn limits(&self) -> BatchLimits {
        self.segments.limits()
    }

    fn capacity_units(&self) -> f64 {
        self.segments.capacity_units()
    }

    async fn specs(
        &mut self,
        rows: &[Lease],
        stop: &Cancel,
    ) -> Result<Option<Vec<UnitSpec>>, RunError> {
        if let Some(listed) = self.shards.specs(rows, stop).await? {
            self.listed = listed;
        }
        let shard_rows = rows.iter().any(|row| matches!(row.unit, UnitId::Shard(_)));
        if self.listed.is_empty() && shard_rows {
            // Not listed yet by this leader: a sync of the segments alone would delete the
            // finished shard rows.
            return Ok(None);
        }
        let segment_rows = rows
            .iter()
            .any(|row| matches!(row.unit, UnitId::Segment { .. }));
        if !self.segments.known() && segment_rows {
            // This leader's export is not complete yet (another worker's is): a sync of the
            // shards alone would delete the finished segment rows.
            return Ok(None);
        }
        let mut specs = self.segments.specs(rows, stop).await?.unwrap_or_default();
        specs.extend(self.listed.iter().cloned());
        Ok(Some(specs))
    }

    fn check(&self, rows: &[Lease]) -> Result<(), RunError> {
        self.segments.check(rows)
    }

    fn measured(&self, rows: &[Lease], held: &[(&UnitId, &ReadFlags)]) {
        let shards: Vec<(&UnitId, &ReadFlags)> = held
            .iter()
            .filter(|(unit, _)| matches!(unit, UnitId::Shard(_)))
            .copied()
            .collect();
        self.shards.measured(rows, &shards);
    }

    /// Every segment done, none held: the stream beside it is handed back with its positions.
    fn ended(&self, view: &View<'_>) -> Option<bool> {
        let segments = View {
            rows: view.rows,
            held: view
                .held
                .iter()
                .filter(|(unit, _, _)| !matches!(unit, UnitId::Shard(_)))
                .copied()
                .collect(),
            pending: view.pending,
            expired: view.expired,
        };
        self.segments.ended(&segments)
    }

    fn stopped(&self) -> bool {
        false
    }
}
