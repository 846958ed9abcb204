//! The run's checkpointer: applies acknowledged positions and writes them, debounced.
//!
//! # Rules (docs/state.md §6.4)
//! 1. A position advances only after the sink acknowledged the batch carrying it and every
//!    batch before it. Sinks acknowledge in order, so applying each acknowledged batch's
//!    positions in turn keeps the committed position a contiguous acknowledged prefix.
//! 2. Writes are debounced by `flush_interval` (0 = after every batch) and always happen at a
//!    clean end, a drain and after a failure. Nothing changed → nothing written.
//! 3. A completed scan clears the position and records `last_completed`.
//! 4. With a keyed sink the position lives in the sink's database (docs/state.md §6.5): each batch's
//!    state parts are [staged](Checkpointer::stage) before the write and committed by the sink
//!    in the transaction holding the batch's rows, so rows and position never disagree.
//! 5. A completed snapshot is first marked `complete`, then closed together with the
//!    complete-read cleanup in one transaction (docs/mirror.md §5.3); a failed cleanup is retried by the
//!    next run without scanning again.
//! 6. An open repair keeps its current export's file progress in its record; the files of a
//!    window all applied, the window closes with the deletes of its vanished rows in one
//!    transaction, and the repair moves to its next window (docs/streams.md §4.12).
//! 7. A driven run's batches are handed out and acknowledged by the program in any order: their
//!    positions are applied per segment and shard as `driven` frees them (an
//!    acknowledged prefix of each), and a run's end waits until every batch is acknowledged
//!    (docs/state.md §6.9, `driven`).

pub mod store;

use std::time::{Duration, Instant};

use ddbpipe_source::position::{
    RepairRecord, SnapshotReason, SnapshotRecord, StreamKind, StreamsPosition,
};
use ddbpipe_source::records::SegmentCursor;
use ddbpipe_source::streams::handover;
use serde_json::json;

use crate::batch::Batch;
use crate::events::CheckpointAged;
use crate::sink::Staged;
use crate::state::identity::Identity;
use crate::state::{Entry, StateError};
use ddbpipe_source::position::{Position, ScanKind, ScanPosition};
use store::{Ceiling, CheckpointStore, RepairSweep, SnapshotClose, Unseen};

/// Why a run cannot start from the stored state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The state could not be read (or is corrupt).
    #[error(transparent)]
    State(#[from] StateError),
    /// Definite: the stored position belongs to another source (exit 2).
    #[error(
        "stored position of pipeline '{pipeline}' was made with a different source: {changes}. \
         Restore the config, use a new pipeline name, or run `ddbpipe state reset <config>`."
    )]
    IdentityChanged {
        /// The pipeline.
        pipeline: String,
        /// The changed fields, joined by "; ".
        changes: String,
    },
    /// Definite: the stored position is of another mode than the configured one.
    #[error(
        "stored position of pipeline '{pipeline}' is a {stored} position but the source is in \
         mode: {mode}. Run `ddbpipe state reset <config>` to start afresh."
    )]
    WrongKind {
        /// The pipeline.
        pipeline: String,
        /// The stored kind.
        stored: &'static str,
        /// The configured mode.
        mode: String,
    },
}

/// What a snapshot's completion may delete (docs/mirror.md §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// `resnapshot_deletes`.
    pub deletes: bool,
    /// `resnapshot_max_keys`.
    pub max_keys: u64,
}

/// The cleanup ceiling was hit: the snapshot was closed without deletes (docs/mirror.md §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CeilingHit {
    /// Distinct keys the snapshot wrote.
    pub keys: u64,
    /// `resnapshot_max_keys`.
    pub max_keys: u64,
}

/// Applies and stores one pipeline's position.
#[derive(Debug)]
pub struct Checkpointer {
    store: Box<dyn CheckpointStore>,
    pipeline: String,
    identity: Identity,
    last_completed: Option<serde_json::Value>,
    position: ScanPosition,
    streams: Option<StreamsPosition>,
    flush_interval: Duration,
    written_at: Option<Instant>,
    dirty: bool,
    cleanup: CleanupPolicy,
    ceiling: Option<CeilingHit>,
    /// A driven run's hand-out and window (`driven`).
    pub(crate) driven: Option<crate::driven::Driven>,
}

/// RFC 3339 UTC with milliseconds: the one clock of state documents and keyed rows.
pub use ddbpipe_source::clock::now_rfc3339;

impl Checkpointer {
    /// A checkpointer over `store` starting from what was loaded.
    fn new(
        store: Box<dyn CheckpointStore>,
        pipeline: &str,
        identity: Identity,
        last_completed: Option<serde_json::Value>,
        position: ScanPosition,
        streams: Option<StreamsPosition>,
        flush_interval: Duration,
    ) -> Self {
        Checkpointer {
            store,
            pipeline: pipeline.to_string(),
            identity,
            last_completed,
            position,
            streams,
            flush_interval,
            written_at: None,
            dirty: false,
            cleanup: CleanupPolicy {
                deletes: false,
                max_keys: u64::MAX,
            },
            ceiling: None,
            driven: None,
        }
    }

    /// Loads the stored entry and checks it belongs to this source; returns the checkpointer
    /// and the scan position to resume from (fresh when none is stored).
    pub async fn open_scan(
        store: impl CheckpointStore + 'static,
        pipeline: &str,
        identity: Identity,
        kind: ScanKind,
        total_segments: u32,
        flush_interval: Duration,
    ) -> Result<Self, StartError> {
        let mut store: Box<dyn CheckpointStore> = Box::new(store);
        let stored = store.load(pipeline).await?;
        let (last_completed, position) = match stored {
            None => (None, None),
            Some(entry) => {
                if let Some(position) = &entry.position {
                    let changes = identity.changes_for(&entry.identity, position);
                    if !changes.is_empty() {
                        return Err(StartError::IdentityChanged {
                            pipeline: pipeline.to_string(),
                            changes: changes.join("; "),
                        });
                    }
                    let stored_kind = match position {
                        Position::Scan(scan) => scan.kind.as_str(),
                        Position::Streams(_) => "streams",
                    };
                    let wanted = kind.as_str();
                    if stored_kind != wanted {
                        return Err(StartError::WrongKind {
                            pipeline: pipeline.to_string(),
                            stored: stored_kind,
                            mode: match kind {
                                ScanKind::Export => "scan with snapshot.engine: export".into(),
                                _ => wanted.to_string(),
                            },
                        });
                    }
                }
                // An export's files are known only once it completed: its position is kept
                // whatever the count (checked against the manifest when read).
                let position = match entry.position {
                    Some(Position::Scan(scan))
                        if scan.total_segments == total_segments || kind == ScanKind::Export =>
                    {
                        Some(scan)
                    }
                    _ => None,
                };
                (entry.last_completed, position)
            }
        };
        Ok(Checkpointer::new(
            store,
            pipeline,
            identity,
            last_completed,
            position.unwrap_or_else(|| ScanPosition::new(kind, total_segments)),
            None,
            flush_interval,
        ))
    }

    /// Loads the stored entry of a streams pipeline and checks it belongs to this source.
    /// Returns the checkpointer; [`streams_position`](Self::streams_position) is `None` on a
    /// first run.
    pub async fn open_streams(
        store: impl CheckpointStore + 'static,
        pipeline: &str,
        identity: Identity,
        flush_interval: Duration,
    ) -> Result<Self, StartError> {
        let mut store: Box<dyn CheckpointStore> = Box::new(store);
        let stored = store.load(pipeline).await?;
        let (last_completed, streams) = match stored {
            None => (None, None),
            Some(entry) => match entry.position {
                None => (entry.last_completed, None),
                Some(ref stored @ Position::Streams(ref position)) => {
                    let changes = identity.changes_for(&entry.identity, stored);
                    if !changes.is_empty() {
                        return Err(StartError::IdentityChanged {
                            pipeline: pipeline.to_string(),
                            changes: changes.join("; "),
                        });
                    }
                    (entry.last_completed, Some(position.clone()))
                }
                Some(Position::Scan(ref scan)) => {
                    return Err(StartError::WrongKind {
                        pipeline: pipeline.to_string(),
                        stored: scan.kind.as_str(),
                        mode: "streams".to_string(),
                    });
                }
            },
        };
        let corrupt = |part: &str, problem: String| {
            StartError::State(StateError::Corrupt {
                path: store.describe().into(),
                location: format!("pipeline '{pipeline}' at pipelines.{pipeline}.position.{part}"),
                problem,
            })
        };
        let snapshot = streams.as_ref().and_then(|s| s.snapshot.as_ref());
        let repair = streams.as_ref().and_then(|s| s.repair.as_ref());
        let position = match (snapshot, repair) {
            (Some(snapshot), _) => snapshot
                .progress()
                .map_err(|problem| corrupt("snapshot", problem))?,
            (None, Some(repair)) => repair
                .progress()
                .map_err(|problem| corrupt("repair", problem))?,
            (None, None) => ScanPosition::new(ScanKind::Scan, 1),
        };
        Ok(Checkpointer::new(
            store,
            pipeline,
            identity,
            last_completed,
            position,
            streams,
            flush_interval,
        ))
    }

    /// Sets what a snapshot's completion may delete (default: nothing).
    pub fn with_cleanup(mut self, cleanup: CleanupPolicy) -> Self {
        self.cleanup = cleanup;
        self
    }

    /// Whether a snapshot (resnapshot or mirror scan) is open: segment progress then lives in
    /// the snapshot record, and completing the scan closes the snapshot instead of clearing
    /// the position.
    pub fn snapshot_open(&self) -> bool {
        self.streams.as_ref().is_some_and(|s| s.snapshot.is_some())
    }

    /// Whether the open snapshot's scan already completed (only its closing is left).
    pub fn snapshot_complete(&self) -> bool {
        self.snapshot().is_some_and(|snapshot| snapshot.complete)
    }

    fn snapshot(&self) -> Option<&SnapshotRecord> {
        self.streams.as_ref()?.snapshot.as_deref()
    }

    /// The open snapshot's id, the marker of its rows in a keyed sink.
    pub fn snapshot_id(&self) -> Option<i64> {
        self.streams.as_ref()?.snapshot_id()
    }

    /// Rows in the destination table when the position lives in the sink's database (a
    /// mirror's capture records it: docs/mirror.md §5.1).
    pub async fn destination_rows(&self) -> Result<Option<u64>, StateError> {
        match self.store.with_rows() {
            Some(rows) => rows.destination_rows().await.map(Some),
            None => Ok(None),
        }
    }

    /// Whether completing a snapshot deletes destination rows it did not see: a keyed sink
    /// with `resnapshot_deletes: true`.
    pub fn deletes_unseen(&self) -> bool {
        self.cleanup.deletes && self.store.with_rows().is_some()
    }

    /// Commits a capture with its open snapshot record **before** the first Scan request, so
    /// a crash resumes the snapshot instead of detecting the gap again (docs/streams.md §4.7, docs/mirror.md §5.1).
    pub async fn begin_snapshot(
        &mut self,
        capture: StreamsPosition,
        total_segments: u32,
    ) -> Result<(), StateError> {
        self.position = ScanPosition::new(ScanKind::Scan, total_segments);
        self.streams = Some(capture);
        self.dirty = true;
        self.flush().await
    }

    /// Records the export a snapshot reads (its files are the segments) and writes it now:
    /// **before** the first wait for it, so a restart waits on the same export instead of
    /// paying for another (docs/scan.md §2.10). In a streams run it is stored in the open
    /// snapshot record.
    ///
    /// File progress belongs to its export: recording another export (or the first, over scan
    /// segment progress) starts its files afresh.
    pub async fn set_export(&mut self, arn: &str) -> Result<(), StateError> {
        if self.position.export_arn.as_deref() != Some(arn) {
            self.position = ScanPosition::new(ScanKind::Export, 0);
        }
        self.position.export_arn = Some(arn.to_string());
        self.dirty = true;
        self.flush().await
    }

    /// Whether a repair of a gap by incremental exports is open: file progress then lives in
    /// its record, and completing an export's files closes its window.
    pub fn repair_open(&self) -> bool {
        self.repair().is_some()
    }

    /// The open repair.
    pub fn repair(&self) -> Option<&RepairRecord> {
        self.streams.as_ref()?.repair.as_deref()
    }

    /// Commits `repair` as the open repair **before** its first export is started, so a crash
    /// resumes it instead of detecting the gap again (docs/streams.md §4.12).
    /// A repair follows a stored streams position (a gap needs one); without one nothing
    /// happens.
    pub async fn begin_repair(&mut self, repair: RepairRecord) -> Result<(), StateError> {
        let Some(streams) = self.streams.as_mut() else {
            return Ok(());
        };
        streams.repair = Some(Box::new(repair));
        self.position = ScanPosition::new(ScanKind::Export, 0);
        self.dirty = true;
        self.flush().await
    }

    /// The files of the open repair's current window were all applied: in one write (with a
    /// keyed sink, in the transaction that also deletes the window's vanished rows), the
    /// repair moves on to its next window, or is marked applied after its last.
    async fn close_repair_window(&mut self) -> Result<(), StateError> {
        let Some(mut repair) = self.repair().cloned() else {
            return Ok(());
        };
        let sweep = RepairSweep {
            id: repair.id,
            from_ms: repair.window_from_ms,
            to_ms: repair.window_to_ms,
        };
        if !repair.next_window() {
            repair.applied = true;
        }
        let position = ScanPosition::new(ScanKind::Export, 0);
        let mut streams = self.streams.clone();
        if let Some(streams) = streams.as_mut() {
            streams.repair = Some(Box::new(repair.clone()));
        }
        let entry = self.entry(current_position(&position, streams.as_ref()));
        // A store apart from the rows has nothing to delete: it writes the entry.
        let swept = match self.store.with_rows() {
            Some(rows) => {
                rows.close_repair_window(&self.pipeline, sweep, &entry)
                    .await?
            }
            None => {
                self.store.store(&self.pipeline, Some(&entry)).await?;
                0
            }
        };
        self.position = position;
        self.streams = streams;
        self.written_at = Some(Instant::now());
        self.dirty = false;
        tracing::info!(
            repair = sweep.id,
            window_from_ms = sweep.from_ms,
            window_to_ms = sweep.to_ms,
            vanished_rows_deleted = swept,
            applied = repair.applied,
            "Repair window applied."
        );
        Ok(())
    }

    /// The stored streams position (`None` before the first run committed one).
    pub fn streams_position(&self) -> Option<&StreamsPosition> {
        self.streams.as_ref()
    }

    /// Replaces the streams position and writes it now (start-up: the first run's initial
    /// position, the current ARN, pruning).
    pub async fn set_streams(&mut self, position: StreamsPosition) -> Result<(), StateError> {
        self.streams = Some(position);
        self.dirty = true;
        self.flush().await
    }

    /// The position the run resumes from / has reached.
    pub fn position(&self) -> &ScanPosition {
        &self.position
    }

    /// The last completed scan, if recorded.
    pub fn last_completed(&self) -> Option<&serde_json::Value> {
        self.last_completed.as_ref()
    }

    /// With a store that commits with the batches (store rule 3): the entry the position
    /// reaches once `batch` is acknowledged, for the sink to commit with the batch. `None`
    /// with a state file.
    pub fn stage(&self, batch: &Batch) -> Option<Staged> {
        if !self.store.commits_with_batches() {
            return None;
        }
        let mut position = self.position.clone();
        let mut streams = self.streams.clone();
        apply_batch(&mut position, &mut streams, batch);
        Some(Staged {
            pipeline: self.pipeline.clone(),
            entry: self.entry(current_position(&position, streams.as_ref())),
        })
    }

    /// Applies the positions of an acknowledged batch and writes them when due. `staged` is
    /// what the sink committed with the batch (a keyed sink): then nothing is left to write.
    pub async fn acknowledged(
        &mut self,
        batch: &Batch,
        staged: Option<Staged>,
    ) -> Result<(), StateError> {
        if apply_batch(&mut self.position, &mut self.streams, batch) {
            self.dirty = true;
        }
        if staged.is_some() {
            self.written_at = Some(Instant::now());
            self.dirty = false;
        }
        let due = self
            .written_at
            .is_none_or(|at| at.elapsed() >= self.flush_interval);
        if self.dirty && due {
            self.flush().await?;
        }
        if let Some(at) = self.written_at {
            CheckpointAged {
                seconds: at.elapsed().as_secs_f64(),
            }
            .emit();
        }
        Ok(())
    }

    /// Writes the position now if it changed since the last write.
    pub async fn flush(&mut self) -> Result<(), StateError> {
        if !self.dirty {
            // What a store holds past its last commit is committed now (store rule 4).
            return self.store.commit_held().await;
        }
        let position = current_position(&self.position, self.streams.as_ref());
        self.write(position).await
    }

    /// The scan completed: clear the position, record `last_completed`, write now.
    ///
    /// With an open snapshot, the snapshot is closed instead and the stream position — the
    /// capture — stays, so streaming starts from it. In a sink database the snapshot is first
    /// committed as `complete`, then closed with the complete-read cleanup in one transaction
    /// (docs/mirror.md §5.3); over `resnapshot_max_keys` nothing is deleted and
    /// [`take_ceiling`](Self::take_ceiling) says so.
    pub async fn complete(&mut self, items: u64, capacity_units: f64) -> Result<(), StateError> {
        if self.repair_open() {
            return self.close_repair_window().await;
        }
        if self.snapshot_open() {
            tracing::info!(
                items,
                capacity_units,
                snapshot = self.snapshot_id().unwrap_or_default(),
                "Snapshot complete."
            );
            return self.close_snapshot().await;
        }
        self.last_completed = Some(json!({
            "at": now_rfc3339(),
            "capacity_units": capacity_units,
            "items": items,
        }));
        self.position = ScanPosition::new(self.position.kind, self.position.total_segments);
        self.write(None).await
    }

    /// Closes a snapshot whose scan completed (the end of its scan, or a later run retrying a
    /// cleanup that failed).
    pub async fn close_snapshot(&mut self) -> Result<(), StateError> {
        if !self.snapshot_open() {
            return Ok(());
        }
        let complete = self.snapshot_complete();
        let Some(snapshot) = self.streams.as_mut().and_then(|s| s.snapshot.as_mut()) else {
            return Ok(());
        };
        // A store with the rows commits the snapshot as complete first: should its cleanup
        // fail, the next run retries it without scanning. A store apart has no cleanup.
        if !complete && self.store.with_rows().is_some() {
            snapshot.complete = true;
            self.dirty = true;
            self.flush().await?;
        }
        let id = self.snapshot_id().unwrap_or_default();
        let (mirror, rows_at_start) = self.snapshot().map_or((false, 0), |snapshot| {
            (
                snapshot.reason == SnapshotReason::Mirror,
                snapshot.destination_rows_at_start.unwrap_or(0),
            )
        });
        let close = SnapshotClose {
            id,
            unseen: if self.cleanup.deletes && (!mirror || rows_at_start > 0) {
                Unseen::Delete
            } else {
                Unseen::Keep
            },
            max_keys: self.cleanup.max_keys,
        };
        let mut closed_streams = self.streams.clone();
        if let Some(streams) = closed_streams.as_mut() {
            streams.snapshot = None;
        }
        let entry = self.entry(current_position(&self.position, closed_streams.as_ref()));
        let Some(rows) = self.store.with_rows() else {
            // A store apart from the rows: nothing to clean up (jsonl deletes nothing).
            self.streams = closed_streams;
            return self.write(entry.position).await;
        };
        let closed = rows.close_snapshot(&self.pipeline, close, &entry).await?;
        self.streams = closed_streams;
        self.written_at = Some(Instant::now());
        self.dirty = false;
        tracing::info!(
            snapshot = id,
            keys_written = closed.keys_written,
            deleted = closed.deleted,
            "Snapshot closed."
        );
        if closed.ceiling == Ceiling::Hit {
            self.ceiling = Some(CeilingHit {
                keys: closed.keys_written,
                max_keys: close.max_keys,
            });
        }
        Ok(())
    }

    /// The cleanup ceiling hit by the last snapshot close, if any.
    pub fn take_ceiling(&mut self) -> Option<CeilingHit> {
        self.ceiling.take()
    }

    fn entry(&self, position: Option<Position>) -> Entry {
        Entry {
            identity: self.identity.clone(),
            last_completed: self.last_completed.clone(),
            position,
            updated_at: now_rfc3339(),
        }
    }

    async fn write(&mut self, position: Option<Position>) -> Result<(), StateError> {
        let entry = self.entry(position);
        self.store.store(&self.pipeline, Some(&entry)).await?;
        self.written_at = Some(Instant::now());
        self.dirty = false;
        Ok(())
    }
}

/// Applies a batch's positions; `true` when it carried any.
fn apply_batch(
    position: &mut ScanPosition,
    streams: &mut Option<StreamsPosition>,
    batch: &Batch,
) -> bool {
    for (segment, cursor) in &batch.segments {
        match cursor {
            SegmentCursor::Next(key) => {
                position.cursors.insert(*segment, key.clone());
            }
            SegmentCursor::Done => {
                position.cursors.remove(segment);
                position.done.insert(*segment);
            }
        }
    }
    if !batch.shards.is_empty() {
        let streams =
            streams.get_or_insert_with(|| StreamsPosition::new(StreamKind::Streams, None));
        for mark in &batch.shards {
            handover::apply(streams, mark);
        }
    }
    !batch.segments.is_empty() || !batch.shards.is_empty()
}

/// The position to store: the streams position (with an open snapshot's scan progress in its
/// record), or the scan position while it has progress.
fn current_position(
    position: &ScanPosition,
    streams: Option<&StreamsPosition>,
) -> Option<Position> {
    match streams {
        Some(streams) => {
            let mut streams = streams.clone();
            if let Some(snapshot) = streams.snapshot.as_mut() {
                snapshot.set_progress(position);
            }
            if let Some(repair) = streams.repair.as_mut() {
                repair.set_progress(position);
            }
            Some(Position::Streams(streams))
        }
        // An export's ARN is kept from before its first file (docs/scan.md §2.10).
        None => (position.has_progress() || position.export_arn.is_some())
            .then(|| Position::Scan(position.clone())),
    }
}
