//! `mode: streams` and `mode: mirror` in one process: the stream plan over what was built
//! (`build`), then the library's streams runner (a mirror's snapshot, a repair, the stream).

use std::sync::Arc;
use std::time::Instant;

use anyhow::anyhow;
use ddbpipe_pipeline::runner::RunError;
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::aws;
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::export::SnapshotExports;
use ddbpipe_source::plan::StreamPlan;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::engine::EndReason;
use ddbpipe_source::streams::shard_reader::StreamError;

use super::build::{Alone, Read, Run};
use crate::config::PipelineConfig;
use crate::destination;
use crate::failure::{self, Failure};
use crate::origin::Origin;
use crate::summary::{Ended, Summary};
use crate::telemetry::ScanProgress;

/// Runs a `mode: streams` or `mode: mirror` pipeline in this process.
pub(super) async fn run(
    run: Run<'_>,
    read: Read,
    alone: Alone,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let Run {
        config,
        origin,
        progress,
    } = run;
    let source = &config.source;
    let stream = read.stream()?;
    let Alone {
        mut sink,
        mut checkpointer,
        ..
    } = alone;
    let plan = StreamPlan::build(source);
    let run = StreamRun::new(&plan, &source.table_name, &stream.arn);
    tracing::info!(stream = %stream.arn, "Run started.");
    let started = Instant::now();
    let open = checkpointer.snapshot_open() || checkpointer.repair_open();
    let snapshot = plan.scans_table(open).then(|| {
        let exports = crate::export::engine(&read.sdk, source)
            .map(|engine| Arc::new(engine) as Arc<dyn SnapshotExports>);
        let repairs = crate::export::repairs(&read.sdk, source, checkpointer.repair_open())
            .map(|engine| Arc::new(engine) as Arc<dyn SnapshotExports>);
        SnapshotScan::new(Arc::clone(&read.table_api), &plan.snapshot)
            .with_exports(exports)
            .with_repairs(repairs)
    });
    // A snapshot scan (mirror, resnapshot) shows its progress and ETA against the item count;
    // the stream then shows its change records, shards and lag (`Progress::streaming`).
    let bar = ScanProgress::new(
        progress,
        read.table
            .as_ref()
            .and_then(|t| t.item_count)
            .filter(|_| snapshot.is_some()),
        checkpointer.position().done.count(),
        plan.snapshot.segments,
    );
    let outcome = run_streams_with_snapshots(
        Arc::new(aws::streams_api(&read.sdk)),
        snapshot,
        &run,
        &mut sink,
        &mut checkpointer,
        stop,
        Arc::new(RequestMetrics),
        &bar,
    )
    .await;
    bar.finish();
    let outcome = match outcome {
        Err(error) => return stream_end(error, config, origin),
        Ok(outcome) => outcome,
    };
    let why = ended_because(outcome.end);
    tracing::info!(records = outcome.written, reason = why, "Run finished.");
    Ok(super::summary(
        ended(outcome.end),
        outcome.written,
        format!(
            "ddbpipe: {} of '{}' ended ({why}): {} change record(s) written in {:.1}s{}; position saved in {}",
            source.mode,
            source.table_name,
            outcome.written,
            started.elapsed().as_secs_f64(),
            request_rate(),
            destination::position_label(config)
        ),
    ))
}

/// What the run's shard reads cost, for its summary: `, N GetRecords per shard-hour`
/// (docs/streams.md §4.8, "What an idle shard costs"); nothing before a shard-second.
pub(super) fn request_rate() -> String {
    ddbpipe_source::events::stream_status()
        .get_records_per_shard_hour
        .map(|rate| format!(", {rate:.0} GetRecords per shard-hour"))
        .unwrap_or_default()
}

/// A stream run's end, as the library says it.
pub(super) fn ended(end: EndReason) -> Ended {
    match end {
        EndReason::MaxMessages => Ended::MaxMessages,
        EndReason::Idle => Ended::Idle,
        EndReason::Stopped => Ended::Stopped,
        EndReason::StreamDisabled => Ended::StreamDisabled,
    }
}

/// Why a stream run ended, as its summary says it.
pub(super) fn ended_because(end: EndReason) -> &'static str {
    match end {
        EndReason::MaxMessages => "max_messages reached",
        EndReason::Idle => "idle termination",
        EndReason::Stopped => "stopped by a signal",
        EndReason::StreamDisabled => "stream disabled and fully drained",
    }
}

/// How a stream or mirror run that returned `error` ends: a snapshot or repair a signal stopped
/// saved its progress, which is a clean stop (docs/cli.md §8.5); anything else fails.
pub(super) fn stream_end(
    error: StreamRunError,
    config: &PipelineConfig,
    origin: &Origin,
) -> Result<Summary, Failure> {
    let (ended, left, rerun) = match error {
        StreamRunError::SnapshotInterrupted => (
            Ended::SnapshotStopped,
            "the snapshot is incomplete",
            "resumes the snapshot",
        ),
        StreamRunError::RepairInterrupted => (
            Ended::RepairStopped,
            "the destination misses changes of the gap until the repair completes",
            "resumes the repair",
        ),
        StreamRunError::ReplacementInterrupted => (
            Ended::SnapshotStopped,
            "the shared snapshot was to be replaced when it came, and nothing was replaced",
            "replaces it, or moves to the snapshot another worker replaced it by",
        ),
        error => return Err(stream_failure(error, origin)),
    };
    let during = match ended {
        Ended::RepairStopped => "repair",
        _ => "snapshot",
    };
    let line = format!(
        "ddbpipe: {} of '{}' stopped by a signal during its {during}",
        config.source.mode, config.source.table_name
    );
    Ok(Summary {
        ended,
        written: None,
        line,
        note: Some(super::stopped_note(origin, left, rerun)),
    })
}

pub(super) fn stream_failure(error: StreamRunError, origin: &Origin) -> Failure {
    match error {
        StreamRunError::CannotResume(message) => Failure::runtime(anyhow!(message)).hint(format!(
            "set on_gap: resnapshot to read the table again, or {} to start afresh",
            origin.reset()
        )),
        StreamRunError::Gap(message) => Failure::runtime(anyhow!(message)),
        StreamRunError::Config(problem) => Failure::usage(anyhow!(
            "config error: source.read_capacity_fraction: {problem}"
        )),
        error @ StreamRunError::CleanupSkipped { .. } => Failure::runtime(error).hint(format!(
            "the snapshot is closed; {} streams on (raise resnapshot_max_keys to allow the cleanup of a table this size)",
            origin.rerun()
        )),
        StreamRunError::Run(RunError::Stream(StreamError::Gap(message))) => {
            Failure::runtime(anyhow!(message)).hint(format!(
                "the next run applies on_gap at start-up; or {} to start afresh",
                origin.reset()
            ))
        }
        other => {
            let run = match &other {
                StreamRunError::Run(run) => Some(run),
                _ => None,
            };
            let hint = failure::rerun_hint(run, origin, "it");
            Failure::runtime(other).hint(hint)
        }
    }
}
