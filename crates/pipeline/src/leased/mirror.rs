//! A mirror shared by several workers (docs/coordination.md §11.12): the snapshot's segments,
//! then the complete-read cleanup, run once, then the stream — each worker goes through the
//! three phases in order, and a worker that joins late finds the first two finished.
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
//! 1. **Segments**: a shared scan ([`LeasedScan`]) whose batches carry the snapshot id in their
//!    fence. It completes, on every worker, once every segment row is `Done`.
//! 2. **Cleanup**: each worker that saw the scan complete tries the close; one commits it.
//!    When it skipped its deletes (more keys than `resnapshot_max_keys`), that worker stops
//!    once with [`StreamRunError::CleanupSkipped`], as one process does.
//! 3. **Stream**: a shared stream ([`LeasedStreams`]) from `TRIM_HORIZON`. Its shard rows
//!    are created by the leader only in this phase, so no change is applied before the close
//!    and the cleanup cannot delete a row a change wrote. Replaying changes older than the
//!    snapshot converges: each key ends at its last change (docs/mirror.md §5.5).
//!
//! # The limit
//! The stream read after the snapshot must still hold the snapshot's start:
//! `TRIM_HORIZON` lies before it only while the start is younger than the retention. A worker
//! that reaches the stream phase with no shard row in the lease table yet (the stream not begun)
//! more than [`RETENTION_MARGIN`] after the start fails, naming the start, and nothing is
//! streamed. Once shard rows exist, the shard positions carry the continuity (a trimmed
//! position is a gap, `on_gap: fail`).

use std::time::Duration;

use ddbpipe_source::api::{StreamsApi, TableApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::lease::{LeaseTable, UnitId, UnitSpec};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::streams::shard_reader::StreamError;

use super::{LeasedOutcome, LeasedScan, LeasedStreamOutcome, LeasedStreams};
use crate::runner::{Progress, RunError};
use crate::sink::{CleanedUp, CloseShared, SharedSnapshot, SharedSnapshots};
use crate::streams::StreamRunError;

/// How long after its start a shared snapshot may still begin its stream: the stream keeps
/// records 24 hours, less an hour for the clocks and the listing.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(23 * 3600);

/// A mirror run by one worker of several.
pub struct LeasedMirror<TA, SA, T> {
    /// The snapshot's segments: its `snapshot` is set from the record.
    pub scan: LeasedScan<TA, T>,
    /// The stream after the cleanup: read from `TRIM_HORIZON`, keeping the segment rows.
    pub streams: LeasedStreams<SA, T>,
    /// `resnapshot_deletes`: the cleanup deletes the rows the snapshot did not write (only
    /// when the destination held rows when the snapshot was opened).
    pub deletes: bool,
    /// `resnapshot_max_keys`: no delete when the snapshot wrote more keys.
    pub max_keys: u64,
    /// How long after the snapshot's start its stream may still begin ([`RETENTION_MARGIN`]).
    pub retention: Duration,
}

/// How one worker's part of a shared mirror ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedMirrorOutcome {
    /// The snapshot's record, as this worker opened it.
    pub snapshot: SharedSnapshot,
    /// This worker's part of the segments; `None` when the snapshot was closed before it came.
    pub scan: Option<LeasedOutcome>,
    /// The cleanup, when this worker ran it.
    pub cleanup: Option<CleanedUp>,
    /// This worker's part of the stream.
    pub streams: LeasedStreamOutcome,
}

impl<TA: TableApi, SA: StreamsApi + 'static, T: LeaseTable> LeasedMirror<TA, SA, T> {
    /// Runs this worker through the phases (module docs). A stop during the segments is
    /// [`StreamRunError::SnapshotInterrupted`]: the leases are handed back with their
    /// checkpoints and the next run resumes the snapshot.
    pub async fn run<S: SharedSnapshots>(
        self,
        sink: &mut S,
        stop: ddbpipe_source::retry::Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedMirrorOutcome, StreamRunError> {
        let LeasedMirror {
            mut scan,
            mut streams,
            deletes,
            max_keys,
            retention,
        } = self;
        let pipeline = scan.worker.pipeline().to_string();
        let worker = scan.worker.id().to_string();
        let total = scan.reader.total_segments.max(1);
        let snapshot = sink
            .open_shared_snapshot(&pipeline, unix_now_ms())
            .await
            .map_err(RunError::from)?;
        let mut scanned = None;
        let mut cleanup = None;
        if snapshot.closed.is_none() {
            tracing::info!(
                snapshot = snapshot.id,
                rows_at_start = snapshot.rows_at_start,
                "The shared snapshot is open: reading its segments."
            );
            scan.snapshot = Some(snapshot.id);
            let outcome = scan.run(sink, stop.clone(), progress).await?;
            let completed = outcome.completed;
            scanned = Some(outcome);
            if !completed {
                return Err(StreamRunError::SnapshotInterrupted);
            }
            let close = CloseShared {
                by: worker.clone(),
                at_ms: unix_now_ms(),
                delete_unseen: deletes && snapshot.rows_at_start > 0,
                max_keys,
            };
            cleanup = sink
                .close_shared_snapshot(&pipeline, &snapshot, &close)
                .await
                .map_err(RunError::from)?;
            match cleanup {
                Some(done) => {
                    tracing::info!(
                        snapshot = snapshot.id,
                        keys = done.keys_written,
                        deleted = done.deleted,
                        "Shared snapshot closed here: complete-read cleanup committed."
                    );
                    if done.ceiling_hit {
                        return Err(StreamRunError::CleanupSkipped {
                            keys: done.keys_written,
                            max_keys,
                        });
                    }
                }
                None => tracing::info!(
                    snapshot = snapshot.id,
                    "The shared snapshot was closed by another worker."
                ),
            }
        }
        let rows = streams
            .worker
            .table()
            .list(streams.worker.pipeline())
            .await
            .map_err(RunError::Lease)?;
        let begun = rows.iter().any(|row| matches!(row.unit, UnitId::Shard(_)));
        let age_ms = unix_now_ms().saturating_sub(snapshot.id);
        if !begun && u128::try_from(age_ms).unwrap_or(0) > retention.as_millis() {
            return Err(StreamRunError::Run(RunError::Stream(StreamError::Gap(
                format!(
                    "the shared snapshot {} started {:.1} h ago, and its stream was not begun \
                     yet: the stream no longer holds every change since the snapshot's start \
                     (it keeps 24 h), so changes made meanwhile would be lost; run `ddbpipe \
                     state reset` once no worker runs and mirror afresh, with more workers or \
                     segments so that the snapshot ends within the retention",
                    snapshot.id,
                    age_ms as f64 / 3_600_000.0
                ),
            ))));
        }
        streams.run.start_position = StartPosition::TrimHorizon;
        streams.kept = UnitSpec::segments(total)
            .into_iter()
            .map(|spec| spec.starting(LeaseCheckpoint::Done))
            .collect();
        // The stream has no total to show progress against: the observer is told so (issue 24
        // item 20: the stream phase printed the snapshot's item count and percentage).
        progress.streaming();
        let streamed = streams.run(sink, stop, progress).await?;
        Ok(LeasedMirrorOutcome {
            snapshot,
            scan: scanned,
            cleanup,
            streams: streamed,
        })
    }
}
