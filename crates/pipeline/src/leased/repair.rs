//! A gap in a shared mirror repaired by incremental exports instead of a new snapshot
//! (`on_gap: repair`, docs/coordination.md §11.12 rule 9; one process's repair is docs/streams.md
//! §4.12).
//!
//! # Rules
//! 1. **The plan.** A gap found in a generation whose snapshot is closed is planned as one
//!    process plans it (`ddbpipe_source::streams::repair::plan`), from the generation's shard
//!    rows instead of a stored position: the window starts at the earliest `read_at` of the
//!    positioned rows and verification of the rows with nothing read, less the margin, and
//!    ends at the table's latest restorable time. Where one process would resnapshot (point-in-time
//!    recovery off, a row written before `read_at` was kept, a window before the earliest
//!    restorable time), for a gap found while the snapshot was still being read (nothing
//!    complete to repair), and for a window that starts before rows written without a stream
//!    sequence number (a snapshot's rows, an earlier repair's, less the 60 s margin: an item
//!    of theirs created and deleted inside the window leaves no line in the export, and the
//!    sweep deletes only rows a stream change wrote), the gap opens a new snapshot instead,
//!    logged with its reason.
//! 2. **A window is a generation.** The repair replaces the snapshot record as a new snapshot
//!    would (`generations`, rule 1: of workers finding the gap, the first one's is kept), its
//!    record naming the whole window and the current one ([`SharedRepair`]); a repair longer
//!    than AWS's longest incremental export is a window per generation, oldest first.
//! 3. **Its units are the export's files.** One incremental export per window, started under
//!    a client token made of the record's id and stored in the record by compare-and-set
//!    before anything waits for it, as a shared snapshot's export is; its data files are leased
//!    as segments. No stream is read beside a window: as in one process, the stream follows
//!    the repair.
//! 4. **Applied by version.** A window's batches carry the record's id as their repair
//!    (`Fence::repair`): the destination applies each change only over an older row and marks
//!    the row with the id (docs/streams.md §4.12), and refuses the batch once the window is
//!    closed or the record replaced.
//! 5. **The close.** Once every file is applied, each worker tries the close; one commits it:
//!    the rows a stream change wrote inside the window that the window did not mark are
//!    deleted (the window's export leaves out an item created and deleted inside it) and the
//!    record is closed, in one transaction. The next window's generation then replaces it;
//!    after the last, the generation streams from the trim horizon, as a new snapshot's does.

use ddbpipe_source::api::{StreamsApi, TableApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::OnGap;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::lease::{LeaseTable, PipelineName};
use ddbpipe_source::position::{SharedRepair, StreamKind};
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::leased::position_of_rows;
use ddbpipe_source::streams::repair::{self, RepairPlan};

use super::mirror::{export_segments, shared_export};
use super::segments::{LeasedScan, Segments, read_segments};
use super::units::SnapshotMark;
use super::{LeasedMirror, LeasedOutcome};
use crate::runner::{Progress, RunError};
use crate::sink::{SharedSnapshot, SharedSnapshots};
use crate::streams::StreamRunError;
use crate::streams::repair::unjudged;

impl<TA: TableApi, SA: StreamsApi + 'static, T: LeaseTable + Clone> LeasedMirror<TA, SA, T> {
    /// Rule 1: the repair of a gap found in `current`'s generation (its record as stored
    /// now), or `None` where a new snapshot mends it instead (the reason logged).
    pub(super) async fn plan_repair<S: SharedSnapshots>(
        &self,
        current: &SharedSnapshot,
        sink: &mut S,
        stop: &Cancel,
    ) -> Result<Option<SharedRepair>, StreamRunError> {
        let run = &self.streams.run;
        if run.on_gap != OnGap::Repair {
            return Ok(None);
        }
        let instead = |why: &str| {
            tracing::warn!(
                reason = why,
                "The gap cannot be repaired by incremental exports; the table is snapshotted \
                 again instead."
            );
            Ok(None)
        };
        let Some(repairs) = &self.repairs else {
            return instead("this worker has no export bucket for incremental exports");
        };
        if current.closed.is_none() {
            return instead(
                "it was found while the snapshot was still being read, so nothing complete is \
                 there to repair",
            );
        }
        let pipeline = self.scan.worker.pipeline().as_str();
        let partition = PipelineName::new(current.lease_pipeline(pipeline))
            .map_err(|error| StreamRunError::Config(format!("name: {error}")))?;
        let rows = (self.streams.worker.table().list(&partition).await).map_err(RunError::Lease)?;
        let position = position_of_rows(&rows, StreamKind::Mirror, &run.stream_arn);
        let recovery = (repairs.engine.recovery(&run.table, stop).await).map_err(RunError::Read)?;
        let plan = repair::plan(
            &position,
            &run.stream_arn,
            &run.table,
            &recovery,
            unix_now_ms(),
        );
        let (from_ms, to_ms) = match plan {
            RepairPlan::Repair { from_ms, to_ms } => (from_ms, to_ms),
            RepairPlan::Resnapshot(why) => return instead(&why),
        };
        // Rule 1's last case: rows the window's sweep cannot judge (a snapshot's rows, an
        // earlier repair's), within the margin of the two clocks.
        if let Some(why) = unjudged(&*sink, from_ms).await? {
            return instead(&why);
        }
        Ok(Some(SharedRepair::open(from_ms, to_ms)))
    }

    /// Rules 3 and 4: this worker's part of the window of `snapshot`'s repair, read from its
    /// incremental export (stored in the record first, and in `snapshot`). A stop is
    /// [`StreamRunError::RepairInterrupted`]: the leases are handed back with their cursors.
    pub(super) async fn repair_window<S: SharedSnapshots>(
        &self,
        scan: LeasedScan<TA, T>,
        snapshot: &mut SharedSnapshot,
        sink: &mut S,
        stop: &Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedOutcome, StreamRunError> {
        let (Some(repair), Some(repairs)) = (snapshot.repair, &self.repairs) else {
            return Err(StreamRunError::Gap(
                "the shared snapshot record holds an open repair, but this worker has no export \
                 bucket for incremental exports: give every worker source.snapshot.s3_bucket \
                 and on_gap: repair, or run `ddbpipe state reset` once no worker runs"
                    .into(),
            ));
        };
        let pipeline = self.scan.worker.pipeline().to_string();
        let arn = match shared_export(repairs, &pipeline, snapshot, sink, stop).await {
            Err(RunError::Read(ReadError::Cancelled)) => {
                return Err(StreamRunError::RepairInterrupted);
            }
            result => result?,
        };
        snapshot.export = Some(arn.clone());
        let (window, windows) = repair.window_of();
        tracing::info!(
            snapshot = snapshot.id,
            export = %arn,
            window_from_ms = repair.window_from_ms,
            window_to_ms = repair.window_to_ms,
            window,
            windows,
            "The shared repair reads the incremental export of its window."
        );
        let waiting = export_segments(repairs.clone(), arn, true, stop.clone());
        let segments = Segments::waiting(waiting, scan.batch, SnapshotMark::repair(snapshot.id));
        let parts = (scan.worker, scan.checkpoint_interval, scan.identity);
        let outcome = read_segments(segments, parts, sink, stop.clone(), progress).await?;
        if !outcome.completed {
            return Err(StreamRunError::RepairInterrupted);
        }
        Ok(outcome)
    }
}
