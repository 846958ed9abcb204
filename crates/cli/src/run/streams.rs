//! `mode: streams` and `mode: mirror`: resolve the stream, open the destination and the
//! position, build the stream plan, then hand the run to the library's streams runner.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::RunError;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws::{self, AwsTableApi};
use ddbpipe_source::config::Mode;
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::export::SnapshotExports;
use ddbpipe_source::plan::{self, ResolvedStream, StreamPlan};
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::engine::EndReason;
use ddbpipe_source::streams::shard_reader::StreamError;

use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::destination;
use crate::failure::{self, Failure, start_failure};
use crate::given::Given;
use crate::summary::{Ended, Summary};
use crate::telemetry::ScanProgress;
use crate::wiring::{self, describe};

/// Runs a `mode: streams` or `mode: mirror` pipeline.
pub async fn run(
    config: &PipelineConfig,
    config_path: &Path,
    given: &Given,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let source = &config.source;
    let OpenedStream {
        sdk,
        table_api,
        table,
        stream,
        location,
    } = open_stream(config, given, &stop).await?;
    let destination = destination::open(
        config,
        config_path,
        table.as_ref(),
        Records::Envelopes,
        given,
    )
    .await?;
    let mut sink = destination.sink;
    let mut checkpointer = Checkpointer::open_streams(
        destination.store,
        &config.name,
        wiring::identity(config, &location, given.sink.as_ref()),
        Duration::from_millis(config.state.flush_interval_ms),
    )
    .await
    .map_err(|error| start_failure(error, config_path))?
    .with_cleanup(destination.cleanup)
    .with_hand_out(given.driven.clone());
    if checkpointer.streams_position().is_some() && source.start_position.is_some() {
        tracing::info!(
            "start_position applies to the first run only; the stored position is used."
        );
    }
    let plan = StreamPlan::build(source);
    let run = StreamRun::new(
        &plan,
        &source.table_name,
        &stream.arn,
        config_path.display().to_string(),
    );
    tracing::info!(stream = %stream.arn, "Run started.");
    let started = Instant::now();
    let open = checkpointer.snapshot_open() || checkpointer.repair_open();
    let snapshot = plan.scans_table(open).then(|| {
        let exports = crate::export::engine(&sdk, source)
            .map(|engine| Arc::new(engine) as Arc<dyn SnapshotExports>);
        let repairs = crate::export::repairs(&sdk, source, checkpointer.repair_open())
            .map(|engine| Arc::new(engine) as Arc<dyn SnapshotExports>);
        SnapshotScan::new(Arc::new(table_api), &plan.snapshot)
            .with_exports(exports)
            .with_repairs(repairs)
    });
    // A snapshot scan (mirror, resnapshot) shows its progress and ETA against the item count;
    // the stream then shows its change records, shards and lag (`Progress::streaming`).
    let bar = ScanProgress::new(
        progress,
        table
            .as_ref()
            .and_then(|t| t.item_count)
            .filter(|_| snapshot.is_some()),
        checkpointer.position().done.count(),
        plan.snapshot.segments,
    );
    let outcome = run_streams_with_snapshots(
        Arc::new(aws::streams_api(&sdk)),
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
        Err(error) => return stream_end(error, config, config_path),
        Ok(outcome) => outcome,
    };
    let why = ended_because(outcome.end);
    tracing::info!(records = outcome.written, reason = why, "Run finished.");
    Ok(super::summary(
        ended(outcome.end),
        outcome.written,
        format!(
            "ddbpipe: {} of '{}' ended ({why}): {} change record(s) written in {:.1}s; position saved in {}",
            source.mode,
            source.table_name,
            outcome.written,
            started.elapsed().as_secs_f64(),
            destination::position_label(config)
        ),
    ))
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

/// What a `mode: streams` or `mode: mirror` run reads, resolved before its destination opens.
pub(super) struct OpenedStream {
    /// The SDK settings every client is built from.
    pub sdk: aws::SdkSettings,
    /// The table API (snapshots, exports).
    pub table_api: AwsTableApi,
    /// The table's description, when the run needs it.
    pub table: Option<TableDescription>,
    /// The stream read.
    pub stream: ResolvedStream,
    /// Where the clients read, with what `DescribeTable` said.
    pub location: Location,
}

/// Resolves the stream of `config`: describes the table when the run needs it (its stream, or
/// the key schema of a keyed sink or of snapshot rows; draining a configured `stream_arn`
/// into jsonl needs no table), and refuses a view type a keyed sink or a mirror cannot apply.
pub(super) async fn open_stream(
    config: &PipelineConfig,
    given: &Given,
    stop: &Cancel,
) -> Result<OpenedStream, Failure> {
    let source = &config.source;
    let mirror = source.mode == Mode::Mirror;
    let keyed = config.sink.keyed().is_some();
    let sdk = wiring::sdk_config(source, given.sdk.as_ref()).await;
    let table_api = aws::table_api(&sdk);
    let table = if keyed || mirror || source.stream_arn.is_none() {
        Some(describe(&table_api, source, stop).await?)
    } else {
        None
    };
    let stream = match &table {
        Some(table) => plan::resolve_stream(source, table).map_err(Failure::runtime)?,
        // Without a table description the stream is the configured one (see above).
        None => plan::configured_stream(source).ok_or_else(|| {
            Failure::runtime(anyhow!(
                "internal error: no stream_arn and no table description"
            ))
        })?,
    };
    if (keyed || mirror)
        && let Some(view) = stream.view_type.as_deref()
        && plan::lacks_new_images(view)
    {
        let who = if mirror {
            "mode: mirror".to_string()
        } else {
            format!("the {} sink", config.sink.kind())
        };
        return Err(Failure::usage(anyhow!(
            "config error: the stream of table '{}' has view type {view}; {who} needs NEW_IMAGE or NEW_AND_OLD_IMAGES",
            source.table_name
        ))
        .hint(plan::NEW_IMAGES_REMEDY));
    }
    if let Some(warning) = plan::view_warning(stream.view_type.as_deref()) {
        tracing::warn!("{warning}.");
    }
    let mut location = wiring::location(&sdk, source);
    if let Some(table) = &table {
        location.learn(table);
    }
    Ok(OpenedStream {
        sdk,
        table_api,
        table,
        stream,
        location,
    })
}

/// How a stream or mirror run that returned `error` ends: a snapshot or repair a signal stopped
/// saved its progress, which is a clean stop (docs/cli.md §8.5); anything else fails.
pub(super) fn stream_end(
    error: StreamRunError,
    config: &PipelineConfig,
    config_path: &Path,
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
        error => return Err(stream_failure(error, config_path)),
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
        note: Some(super::stopped_note(config_path, left, rerun)),
    })
}

pub(super) fn stream_failure(error: StreamRunError, config_path: &Path) -> Failure {
    let reset = format!("`ddbpipe state reset {}`", config_path.display());
    match error {
        StreamRunError::Gap(message) => Failure::runtime(anyhow!(message)),
        StreamRunError::Config(problem) => Failure::usage(anyhow!(
            "config error: source.read_capacity_fraction: {problem}"
        )),
        error @ StreamRunError::CleanupSkipped { .. } => Failure::runtime(error).hint(format!(
            "the snapshot is closed; the next `ddbpipe run {}` streams on (raise resnapshot_max_keys to allow the cleanup of a table this size)",
            config_path.display()
        )),
        StreamRunError::Run(RunError::Stream(StreamError::Gap(message))) => {
            Failure::runtime(anyhow!(message)).hint(format!(
                "the next run applies on_gap at start-up; {reset} starts afresh"
            ))
        }
        other => {
            let run = match &other {
                StreamRunError::Run(run) => Some(run),
                _ => None,
            };
            let hint = failure::rerun_hint(run, config_path, "it");
            Failure::runtime(other).hint(hint)
        }
    }
}
