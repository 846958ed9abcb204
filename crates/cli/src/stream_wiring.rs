//! `mode: streams`: resolve the stream, then hand the run to the library's streams runner.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, RunError};
use ddbpipe_pipeline::sinks::jsonl::JsonlSink;
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::api::TableApi;
use ddbpipe_source::aws;
use ddbpipe_source::config::{OnGap, SourceConfig, StartPosition};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::engine::{EndReason, RunBounds};
use ddbpipe_source::streams::shard_reader::StreamError;

use crate::config::PipelineConfig;
use crate::failure::{Exit, Failure};
use crate::wiring::{self, describe, jsonl_settings, retry_policy, start_failure, state_failure};

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
    let name = &source.table_name;
    match table.stream {
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
    stop: Cancel,
) -> Result<Exit, Failure> {
    let source = &config.source;
    let state = StateFile::new(&config.state.path);
    let _lock = state
        .lock(&config.name)
        .map_err(|e| state_failure(e, config_path))?;
    let mut checkpointer = Checkpointer::open_streams(
        state,
        &config.name,
        Identity::of(source),
        Duration::from_millis(config.state.flush_interval_ms),
    )
    .map_err(|error| start_failure(error, config_path))?;
    if checkpointer.streams_position().is_some() && source.start_position.is_some() {
        tracing::info!(
            "start_position applies to the first run only; the stored position is used."
        );
    }

    let sdk = aws::load_sdk_config(&wiring::client_settings(source)).await;
    let table_api = aws::table_api(&sdk);
    let stream = resolve_stream(&table_api, source, &stop).await?;
    if let Some(warning) = view_warning(stream.view_type.as_deref()) {
        tracing::warn!("{warning}.");
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
    };
    let mut sink = JsonlSink::open(jsonl_settings(config)).map_err(Failure::runtime)?;
    tracing::info!(stream = %stream.arn, "Run started.");
    let started = Instant::now();
    // A resnapshot scans the table: described only if one is needed.
    let snapshot =
        (source.on_gap == OnGap::Resnapshot || checkpointer.snapshot_open()).then(|| {
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
    let outcome = run_streams_with_snapshots(
        Arc::new(aws::streams_api(&sdk)),
        snapshot,
        &run,
        &mut sink,
        &mut checkpointer,
        stop,
        Arc::new(RequestMetrics),
        &NoProgress,
    )
    .await
    .map_err(|error| stream_failure(error, config_path))?;
    let why = match outcome.end {
        EndReason::MaxMessages => "max_messages reached",
        EndReason::Idle => "idle termination",
        EndReason::Stopped => "stopped by a signal",
        EndReason::StreamDisabled => "stream disabled and fully drained",
    };
    tracing::info!(records = outcome.written, reason = why, "Run finished.");
    eprintln!(
        "ddbpipe: streams of '{}' ended ({why}): {} change record(s) written in {:.1}s; position saved in {}",
        source.table_name,
        outcome.written,
        started.elapsed().as_secs_f64(),
        config.state.path.display()
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
        StreamRunError::Run(RunError::Stream(StreamError::Gap(message))) => {
            Failure::runtime(anyhow!(message)).hint(format!(
                "the next run applies on_gap at start-up; {reset} starts afresh"
            ))
        }
        other => Failure::runtime(other).hint(format!(
            "what was written is committed; `ddbpipe run {}` resumes after it",
            config_path.display()
        )),
    }
}
