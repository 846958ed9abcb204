//! `mode: streams`: resolve the stream, then hand the run to the library's streams runner.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::RunError;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::api::{TableApi, TableDescription};
use ddbpipe_source::aws;
use ddbpipe_source::config::{Mode, OnGap, SourceConfig, StartPosition};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::engine::{EndReason, RunBounds};
use ddbpipe_source::streams::shard_reader::StreamError;

use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::destination;
use crate::failure::{self, Exit, Failure};
use crate::telemetry::ScanProgress;
use crate::wiring::{self, describe, retry_policy, start_failure};

/// The least effective poll interval (SPEC §1.2 `poll_interval_ms`).
const MIN_POLL: Duration = Duration::from_millis(200);

/// The stream a run reads.
#[derive(Debug, Clone)]
pub struct ResolvedStream {
    /// Its ARN.
    pub arn: String,
    /// `StreamViewType`, when known from `DescribeTable`.
    pub view_type: Option<String>,
}

/// `stream_arn` if set, else the table's enabled stream (SPEC §4.2).
pub async fn resolve_stream<A: TableApi>(
    api: &A,
    source: &SourceConfig,
    cancel: &Cancel,
) -> Result<ResolvedStream, Failure> {
    if let Some(arn) = &source.stream_arn {
        return Ok(ResolvedStream {
            arn: arn.clone(),
            view_type: None,
        });
    }
    let table = describe(api, source, cancel).await?;
    stream_of(source, &table)
}

/// `stream_arn` if set (with its view type when it is the table's stream), else the table's
/// enabled stream, from the table's description.
pub fn resolve_with(
    source: &SourceConfig,
    table: &TableDescription,
) -> Result<ResolvedStream, Failure> {
    match &source.stream_arn {
        Some(arn) => Ok(ResolvedStream {
            arn: arn.clone(),
            view_type: table
                .stream
                .as_ref()
                .filter(|s| s.arn.as_deref() == Some(arn.as_str()))
                .and_then(|s| s.view_type.clone()),
        }),
        None => stream_of(source, table),
    }
}

/// The table's enabled stream (SPEC §4.2), from its description.
pub fn stream_of(
    source: &SourceConfig,
    table: &TableDescription,
) -> Result<ResolvedStream, Failure> {
    let name = &source.table_name;
    match table.stream.clone() {
        Some(stream) if stream.enabled => match stream.arn {
            Some(arn) => Ok(ResolvedStream {
                arn,
                view_type: stream.view_type,
            }),
            None => Err(no_stream(name)),
        },
        Some(_) => Err(Failure::runtime(anyhow!(
            "the stream of table '{name}' is disabled — enable it, or set stream_arn to drain the old stream"
        ))),
        None => Err(no_stream(name)),
    }
}

fn no_stream(table: &str) -> Failure {
    Failure::runtime(anyhow!(
        "table '{table}' has no stream — enable DynamoDB Streams with NEW_AND_OLD_IMAGES, or set stream_arn"
    ))
}

/// What a jsonl streams run will miss with this view type, if anything.
pub fn view_warning(view_type: Option<&str>) -> Option<String> {
    match view_type? {
        "KEYS_ONLY" => Some(
            "the stream view is KEYS_ONLY: envelopes carry keys but no before/after images".into(),
        ),
        "NEW_IMAGE" => Some("the stream view is NEW_IMAGE: envelopes carry no before image".into()),
        "OLD_IMAGE" => Some("the stream view is OLD_IMAGE: envelopes carry no after image".into()),
        _ => None,
    }
}

/// Runs a `mode: streams` pipeline.
pub async fn run(
    config: &PipelineConfig,
    config_path: &Path,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let source = &config.source;
    let mirror = source.mode == Mode::Mirror;
    let keyed = config.sink.keyed().is_some();
    let sdk = aws::load_sdk_config(&wiring::client_settings(source)).await;
    let table_api = aws::table_api(&sdk);
    // Described when the run needs the table: its stream, or the key schema of a keyed sink
    // or of snapshot rows. Draining a configured stream_arn into jsonl needs no table.
    let table = if keyed || mirror || source.stream_arn.is_none() {
        Some(describe(&table_api, source, &stop).await?)
    } else {
        None
    };
    let stream = match &table {
        Some(table) => resolve_with(source, table)?,
        None => ResolvedStream {
            arn: source.stream_arn.clone().unwrap_or_default(),
            view_type: None,
        },
    };
    if (keyed || mirror)
        && let Some(view) = stream.view_type.as_deref()
        && matches!(view, "KEYS_ONLY" | "OLD_IMAGE")
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
        .hint("change the table's stream view type (disable and re-enable the stream), or use a jsonl sink with mode: streams"));
    }
    if let Some(warning) = view_warning(stream.view_type.as_deref()) {
        tracing::warn!("{warning}.");
    }
    let mut location = wiring::location(&sdk, source);
    if let Some(table) = &table {
        location.learn(table);
    }
    let destination =
        destination::open(config, config_path, table.as_ref(), Records::Envelopes).await?;
    let mut sink = destination.sink;
    let mut checkpointer = Checkpointer::open_streams(
        destination.store,
        &config.name,
        wiring::identity(config, &location),
        Duration::from_millis(config.state.flush_interval_ms),
    )
    .await
    .map_err(|error| start_failure(error, config_path))?
    .with_cleanup(destination.cleanup);
    if checkpointer.streams_position().is_some() && source.start_position.is_some() {
        tracing::info!(
            "start_position applies to the first run only; the stored position is used."
        );
    }
    let run = StreamRun {
        table: source.table_name.clone(),
        stream_arn: stream.arn.clone(),
        format: source.value_format,
        retry: retry_policy(source),
        records_per_request: source.records_per_request,
        poll_interval: Duration::from_millis(source.poll_interval_ms).max(MIN_POLL),
        bounds: RunBounds {
            shard_concurrency: source.shard_concurrency,
            discovery_interval: Duration::from_secs(source.discovery_interval_secs),
            idle_termination: source.idle_termination_secs.map(Duration::from_secs),
            follow: source.follow,
        },
        start_position: source.start_position.unwrap_or(StartPosition::TrimHorizon),
        on_gap: source.on_gap,
        max_messages: source.max_messages.map(|m| m as u64),
        batch_size: source.batch_size,
        config_label: config_path.display().to_string(),
        mirror,
    };
    tracing::info!(stream = %stream.arn, "Run started.");
    let started = Instant::now();
    // A resnapshot scans the table: described only if one is needed.
    let snapshot = (source.on_gap == OnGap::Resnapshot || checkpointer.snapshot_open() || mirror)
        .then(|| {
            let plan_source = source.clone();
            SnapshotScan {
                api: Arc::new(table_api),
                segments: source.segments,
                max_concurrency: source.max_concurrency,
                page_limit: source.page_limit,
                consistent_read: source.consistent_read,
                read_rate: Arc::new(move |table| {
                    wiring::table_rules(&plan_source, table).read_rate
                }),
            }
        });
    // A snapshot scan (mirror, resnapshot) shows its progress and ETA against the item count.
    let bar = ScanProgress::new(
        if snapshot.is_some() {
            progress
        } else {
            ProgressMode::Never
        },
        table.as_ref().and_then(|t| t.item_count),
        checkpointer.position().done.count(),
        source.segments,
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
    let outcome = outcome.map_err(|error| stream_failure(error, config_path))?;
    let why = match outcome.end {
        EndReason::MaxMessages => "max_messages reached",
        EndReason::Idle => "idle termination",
        EndReason::Stopped => "stopped by a signal",
        EndReason::StreamDisabled => "stream disabled and fully drained",
    };
    tracing::info!(records = outcome.written, reason = why, "Run finished.");
    eprintln!(
        "ddbpipe: {} of '{}' ended ({why}): {} change record(s) written in {:.1}s; position saved in {}",
        source.mode,
        source.table_name,
        outcome.written,
        started.elapsed().as_secs_f64(),
        destination::position_label(config)
    );
    Ok(Exit::Ok)
}

fn stream_failure(error: StreamRunError, config_path: &Path) -> Failure {
    let reset = format!("`ddbpipe state reset {}`", config_path.display());
    match error {
        StreamRunError::Gap(message) => Failure::runtime(anyhow!(message)),
        StreamRunError::Config(problem) => Failure::usage(anyhow!(
            "config error: source.read_capacity_fraction: {problem}"
        )),
        StreamRunError::SnapshotInterrupted => {
            Failure::runtime(StreamRunError::SnapshotInterrupted).hint(format!(
                "the output is incomplete; `ddbpipe run {}` resumes the snapshot",
                config_path.display()
            ))
        }
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
