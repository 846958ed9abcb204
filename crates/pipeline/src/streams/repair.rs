//! `on_gap: repair` (docs/streams.md §4.12): the changes a gap lost, read from incremental
//! exports and applied, then the stream captured again.
//!
//! # Rules
//! 1. The plan (`ddbpipe_source::streams::repair::plan`) needs the table's point-in-time
//!    recovery window, from `DescribeContinuousBackups`; where it says "resnapshot", the run
//!    resnapshots with the configured engine and logs why in one line. So it does when the
//!    window starts (less 60 s) before rows the destination holds without a stream sequence
//!    number ([`unjudged`]: a snapshot's rows, an earlier repair's): an item of theirs created
//!    and deleted inside the window leaves no line in the export, and the sweep deletes only
//!    rows a stream change wrote.
//! 2. The repair record is committed **before** the first export is started, and each window's
//!    export ARN before it is waited for: a crash resumes the same window and export.
//! 3. A window's files are read as a snapshot's are (in parallel, exact cursors, resumable),
//!    their changes written as change envelopes; a keyed sink applies them by version. Once the
//!    window's files are all applied its vanished rows are deleted and the next window begins,
//!    in one transaction.
//! 4. After the last window the stream is captured again (`Startup::recapture`) at that time
//!    and committed without the repair record; the run then streams from it.

use std::sync::Arc;

use ddbpipe_source::api::{SnapshotShape, StreamsApi, TableApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::position::StreamsPosition;
use ddbpipe_source::streams::repair::{self, REPAIR_MARGIN_MS, RepairPlan};

use super::snapshot::{SnapshotScan, Snapshots};
use super::{StreamRunError, discover};
use crate::checkpoint::Checkpointer;
use crate::runner::{RunError, run_scan};
use crate::sink::{Sink, Versioned};

impl<T: TableApi> Snapshots<'_, T> {
    /// Rule 1: what a gap of `stored` with `on_gap: repair` leads to, before the destination's
    /// rows are asked ([`unjudged`]).
    pub async fn plan_repair(
        &self,
        scan: &SnapshotScan<T>,
        stored: &StreamsPosition,
    ) -> Result<RepairPlan, StreamRunError> {
        let run = self.run;
        let Some(repairs) = &scan.repairs else {
            return Ok(RepairPlan::Resnapshot(
                "this run has no export bucket for incremental exports".into(),
            ));
        };
        let recovery = repairs.recovery(&run.table, self.stop).await?;
        Ok(repair::plan(
            stored,
            &run.stream_arn,
            &run.table,
            &recovery,
            unix_now_ms(),
        ))
    }

    /// Rules 2–3: applies every window of the open repair that is not applied yet.
    pub async fn repair<S: Sink>(
        &self,
        scan: &SnapshotScan<T>,
        sink: &mut S,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), StreamRunError> {
        let run = self.run;
        let Some(repairs) = &scan.repairs else {
            return Err(StreamRunError::Gap(
                "the stored position holds an open repair, but this run has no export bucket \
                 for incremental exports: restore source.snapshot.s3_bucket and on_gap: repair, \
                 or run `ddbpipe state reset`"
                    .into(),
            ));
        };
        if checkpointer.repair().is_none_or(|repair| repair.applied) {
            return Ok(());
        }
        let description = self.describe(scan).await?;
        let table_arn = description.arn.clone().ok_or_else(|| {
            StreamRunError::Gap(format!(
                "DescribeTable '{}' reported no TableArn, which an export needs",
                run.table
            ))
        })?;
        let key_schema = description.key_schema;
        let shape = Arc::new(SnapshotShape {
            key_schema,
            table: run.table.clone(),
            format: run.format,
        });
        let mut abandoned = false;
        while let Some(record) = checkpointer.repair().filter(|r| !r.applied).cloned() {
            let stored = checkpointer.position().export_arn.clone();
            let window = (record.window_from_ms, record.window_to_ms);
            let arn = repairs
                .begin_incremental(
                    stored.as_deref(),
                    &table_arn,
                    window,
                    &record.id.to_string(),
                    self.stop,
                )
                .await?;
            if stored.as_deref() != Some(arn.as_str()) {
                checkpointer
                    .set_export(&arn)
                    .await
                    .map_err(RunError::from)?;
            }
            tracing::info!(
                export = %arn,
                window_from_ms = window.0,
                window_to_ms = window.1,
                windows = record.windows(),
                "Repair: reading the incremental export of a window."
            );
            let reader = repairs.incremental_reader(&arn, Arc::clone(&shape));
            let outcome = match run_scan(
                reader,
                run.batch,
                sink,
                checkpointer,
                self.stop.clone(),
                self.progress,
            )
            .await
            {
                // A damaged export fails every read the same way: a new one for the window,
                // once (`ddbpipe_source::export` rule 13).
                Err(error) if !abandoned && error.damaged_export().is_some() => {
                    tracing::warn!(error = %error, "The repair's export is damaged.");
                    abandoned = true;
                    let replacement = repairs
                        .abandon(
                            &arn,
                            &table_arn,
                            Some(window),
                            &record.id.to_string(),
                            self.stop,
                        )
                        .await?;
                    checkpointer
                        .set_export(&replacement)
                        .await
                        .map_err(RunError::from)?;
                    continue;
                }
                result => result?,
            };
            if !outcome.completed {
                return Err(StreamRunError::RepairInterrupted);
            }
        }
        Ok(())
    }
}

/// Rule 4: captures the stream again once the repair is applied and commits it without the
/// repair record; returns the listing it made.
pub(super) async fn recapture<A: StreamsApi>(
    api: &Arc<A>,
    snapshots: &Snapshots<'_, impl TableApi>,
    checkpointer: &mut Checkpointer,
) -> Result<
    (
        StreamsPosition,
        ddbpipe_source::streams::lineage::ShardGraph,
        Option<String>,
    ),
    StreamRunError,
> {
    let run = snapshots.run;
    let Some(stored) = checkpointer.streams_position().cloned() else {
        return Err(StreamRunError::Gap(
            "a repair without a stored stream position".into(),
        ));
    };
    let (graph, status) = discover(
        api.as_ref(),
        run,
        snapshots.stop,
        snapshots.observer.as_ref(),
    )
    .await?;
    let trimmed = super::trimmed(
        api.as_ref(),
        run,
        &stored,
        &graph,
        snapshots.stop,
        snapshots.observer.as_ref(),
    )
    .await?;
    let capture = run
        .startup()
        .recapture(&stored, &graph, &trimmed, unix_now_ms());
    tracing::info!(
        shards = capture.shards.len(),
        "Repair applied; the stream is captured again and read from there."
    );
    checkpointer
        .set_streams(capture.clone())
        .await
        .map_err(RunError::from)?;
    Ok((capture, graph, status))
}

/// Why a repair whose window starts at `from_ms` cannot be trusted with `sink`'s rows (rule 1,
/// docs/streams.md §4.12; across workers docs/coordination.md §11.12 rule 9): rows written
/// without a stream sequence number (a snapshot's, an earlier repair's) at or after its start,
/// less the margin of the two clocks; `None` when none is. The answer borrows nothing of the
/// sink.
pub(crate) fn unjudged<S: Sink>(
    sink: &S,
    from_ms: i64,
) -> impl Future<Output = Result<Option<String>, RunError>> + Send + use<S> {
    let since_ms = from_ms - REPAIR_MARGIN_MS;
    let answer =
        (sink.versioned()).map(|versioned| versioned.rows_without_sequence_since(since_ms));
    async move {
        let Some(answer) = answer else {
            return Ok(None);
        };
        let unsure = answer.await?;
        Ok((unsure > 0).then(|| {
            format!(
                "{unsure} row(s) of the destination were written by a snapshot or a repair at or \
                 after the window's start ({from_ms}, unix ms, less 60 s): the repair could not \
                 tell which of their items were created and deleted inside the window"
            )
        }))
    }
}
