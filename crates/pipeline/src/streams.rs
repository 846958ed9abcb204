//! A streams run from start-up to end: discovery, the start-up gap checks, the first run's
//! initial position, then the engine feeding the sink.
//!
//! # Start-up (SPEC §4.4–§4.6)
//! 1. Discover every shard (a failure, after retries, fails the run).
//! 2. First run (no stored streams position): admit the shards described now per
//!    `start_position` and commit that initial position **before** reading.
//! 3. Later runs: the layered gap checks; layer 4 probes each positioned shard with
//!    `GetShardIterator(AFTER_SEQUENCE_NUMBER)` and keeps the iterator for its first slice.
//!    A gap with `on_gap: fail` stops the run and leaves the state as it was.
//! 4. Without a gap: store the current ARN, prune finished shards nobody needs, commit.
//!
//! Nothing here names an AWS type: it runs on the AWS client and on the in-memory fake alike.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_source::api::{StartAt, StreamsApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{OnGap, StartPosition};
use ddbpipe_source::error::ReadError;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::position::{StreamKind, StreamsPosition};
use ddbpipe_source::retry::{AttemptObserver, Cancel, RetryPolicy};
use ddbpipe_source::streams::engine::{self, RunBounds, StreamEngine};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::handover::{self, Handover};
use ddbpipe_source::streams::lineage::{self, ShardGraph};
use ddbpipe_source::streams::shard_reader::StreamContext;
use ddbpipe_value::ValueFormat;
use tokio::sync::mpsc;

use crate::checkpoint::Checkpointer;
use crate::runner::{Progress, RunError, StreamOutcome, run_stream};
use crate::sink::Sink;

/// Hand-overs waiting between the engine and the batcher.
const HANDOVER_DEPTH: usize = 2;

/// Everything a streams run needs besides its I/O.
#[derive(Debug, Clone)]
pub struct StreamRun {
    /// The configured table name (envelopes, messages).
    pub table: String,
    /// The resolved stream.
    pub stream_arn: String,
    /// Plain or typed values.
    pub format: ValueFormat,
    /// The one retry policy.
    pub retry: RetryPolicy,
    /// `GetRecords` `Limit`.
    pub records_per_request: u32,
    /// Effective poll interval (at least 200 ms).
    pub poll_interval: Duration,
    /// Concurrency, discovery and end conditions.
    pub bounds: RunBounds,
    /// `trim_horizon` or `latest` (first run only).
    pub start_position: StartPosition,
    /// What a gap found at start-up does.
    pub on_gap: OnGap,
    /// Stop after this many records.
    pub max_messages: Option<u64>,
    /// Records per batch.
    pub batch_size: usize,
    /// The config path as the user gave it (for remedies in messages).
    pub config_label: String,
}

/// Why a streams run could not start or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamRunError {
    /// Definite: a gap at start-up with `on_gap: fail` (the state is unchanged).
    #[error("{0}")]
    Gap(String),
    /// A start-up request failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Runs the stream from the checkpointer's stored position to an end condition.
pub async fn run_streams<A: StreamsApi, S: Sink>(
    api: Arc<A>,
    run: &StreamRun,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    stop: Cancel,
    observer: Arc<dyn AttemptObserver>,
    progress: &dyn Progress,
) -> Result<StreamOutcome, StreamRunError> {
    let run_start_ms = unix_now_ms();
    let discovery = engine::discover(api.as_ref(), &run.stream_arn, &run.retry, &stop).await?;
    let mut graph = ShardGraph::new();
    graph.merge(discovery.shards);
    tracing::info!(shards = graph.len(), stream = %run.stream_arn, "Shards discovered.");

    let stored = checkpointer.streams_position().cloned();
    let first_run = stored.is_none();
    let mut probed = BTreeMap::new();
    let position = match stored {
        None => {
            let mut position =
                StreamsPosition::new(StreamKind::Streams, Some(run.stream_arn.clone()));
            for mark in engine::first_run_marks(&graph, &position, run.start_position, run_start_ms)
            {
                handover::apply(&mut position, &mark);
            }
            position
        }
        Some(mut position) => {
            let findings = gaps::check(
                &position,
                &run.stream_arn,
                &graph,
                &run.table,
                run_start_ms / 1000,
            );
            for warning in &findings.warnings {
                tracing::warn!("{warning}");
            }
            let mut reasons = findings.reasons;
            if reasons.is_empty() {
                reasons = probe(api.as_ref(), run, &findings.probes, &stop, &mut probed).await?;
            }
            if !reasons.is_empty() {
                tracing::warn!(reasons = %reasons.join("; "), "Gap detected at start-up.");
                return Err(StreamRunError::Gap(match run.on_gap {
                    OnGap::Fail => gaps::cannot_resume(&run.table, &reasons, &run.config_label),
                    OnGap::Resnapshot => format!(
                        "{} (on_gap: resnapshot is not available in this version of ddbpipe)",
                        gaps::cannot_resume(&run.table, &reasons, &run.config_label)
                    ),
                }));
            }
            position.stream_arn = Some(run.stream_arn.clone());
            lineage::prune(&graph, &mut position);
            position
        }
    };
    checkpointer
        .set_streams(position.clone())
        .map_err(RunError::from)?;

    let (tx, rx) = mpsc::channel(HANDOVER_DEPTH);
    let handover = Arc::new(Handover::new(tx, position, run.max_messages));
    let ctx = Arc::new(StreamContext {
        api,
        stream_arn: run.stream_arn.clone(),
        table: run.table.clone(),
        format: run.format,
        retry: run.retry,
        records_per_request: run.records_per_request,
        poll_interval: run.poll_interval,
        handover,
        cancel: stop.clone(),
        observer,
    });
    let engine = StreamEngine::new(
        ctx,
        run.bounds.clone(),
        graph,
        run.start_position,
        first_run,
        run_start_ms,
        probed,
        stop,
    )
    .await;
    Ok(run_stream(engine, rx, run.batch_size, sink, checkpointer, progress).await?)
}

/// Layer 4: `GetShardIterator(AFTER_SEQUENCE_NUMBER)` for each positioned shard, a few at
/// once; trimmed answers are reasons, iterators are kept for the first slices.
async fn probe<A: StreamsApi>(
    api: &A,
    run: &StreamRun,
    probes: &[(ShardId, ddbpipe_source::ids::SequenceNumber)],
    stop: &Cancel,
    probed: &mut BTreeMap<ShardId, String>,
) -> Result<Vec<String>, StreamRunError> {
    let mut reasons = Vec::new();
    for chunk in probes.chunks(run.bounds.shard_concurrency.max(1)) {
        let answers = chunk.iter().map(|(shard, seq)| async move {
            let start = StartAt::After(seq.clone());
            let answer = run
                .retry
                .run(
                    "get_shard_iterator",
                    || format!("GetShardIterator for {shard}"),
                    stop,
                    &ddbpipe_source::retry::NoObserver,
                    |_| api.shard_iterator(&run.stream_arn, shard, &start),
                )
                .await;
            (shard, seq, answer)
        });
        for (shard, seq, answer) in join_all(answers).await {
            match answer {
                Ok(Some(iterator)) => {
                    probed.insert(shard.clone(), iterator);
                }
                Ok(None) => {}
                Err(error) if error.code() == Some("TrimmedDataAccessException") => {
                    reasons.push(gaps::trimmed(shard, seq));
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(reasons)
}

/// Awaits futures concurrently, keeping their order.
async fn join_all<F: std::future::Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
