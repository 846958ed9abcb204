//! A streams run from start-up to end: discovery, the start-up gap checks, the first run's
//! initial position, then the engine feeding the sink.
//!
//! # Start-up (docs/streams.md §4.4–§4.6)
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

use ddbpipe_source::api::{
    KeyAttribute, Page, ReadKind, ReadRequest, Render, SnapshotShape, StartAt, StreamsApi,
    TableApi, TableDescription, TableNames,
};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{Mode, OnGap, StartPosition};
use ddbpipe_source::error::ApiError;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::plan::{ReadRule, Refresher, SnapshotPlan, StreamPlan};
use ddbpipe_source::position::ShardCheckpoint;
use ddbpipe_source::position::{SnapshotReason, SnapshotRecord, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{AttemptObserver, Cancel, RetryPolicy};
use ddbpipe_source::scan::SegmentReader;
use ddbpipe_source::streams::engine::{self, RunBounds, StreamEngine};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::handover::{self, Handover};
use ddbpipe_source::streams::lineage::{self, ShardGraph};
use ddbpipe_source::streams::shard_reader::StreamContext;
use ddbpipe_source::streams::shard_sync;
use ddbpipe_value::ValueFormat;
use tokio::sync::mpsc;

use crate::checkpoint::Checkpointer;
use crate::runner::{Progress, RunError, StreamOutcome, run_scan, run_stream};
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
    /// `streams`, or `mirror`: a mirror's first run captures every shard at its trim horizon
    /// and scans the table before streaming (docs/mirror.md §5).
    pub kind: StreamKind,
}

impl StreamRun {
    /// The run of `plan` on `stream_arn` of `table`; `config_label` names the config file in
    /// remedies.
    pub fn new(plan: &StreamPlan, table: &str, stream_arn: &str, config_label: String) -> Self {
        StreamRun {
            table: table.to_string(),
            stream_arn: stream_arn.to_string(),
            format: plan.format,
            retry: plan.retry,
            records_per_request: plan.records_per_request,
            poll_interval: plan.poll_interval,
            bounds: plan.bounds.clone(),
            start_position: plan.start_position,
            on_gap: plan.on_gap,
            max_messages: plan.max_messages,
            batch_size: plan.batch_size,
            config_label,
            kind: if plan.mode == Mode::Mirror {
                StreamKind::Mirror
            } else {
                StreamKind::Streams
            },
        }
    }
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
    /// Definite: a setting cannot be applied to the table (e.g. a capacity fraction without
    /// a base); the message names the field.
    #[error("{0}")]
    Config(String),
    /// A signal stopped the snapshot scan; its progress is saved and the next run resumes it.
    #[error("the snapshot was interrupted: its progress is saved and the next run resumes it")]
    SnapshotInterrupted,
    /// The snapshot wrote more keys than `resnapshot_max_keys`: it was closed without deletes
    /// (docs/mirror.md §5.3); the next run streams on.
    #[error(
        "complete-read cleanup skipped: the snapshot saw {keys} keys, more than resnapshot_max_keys ({max_keys}); nothing was deleted and the position was saved"
    )]
    CleanupSkipped {
        /// Keys the snapshot wrote.
        keys: u64,
        /// `resnapshot_max_keys`.
        max_keys: u64,
    },
}

/// What a resnapshot (`on_gap: resnapshot`, docs/streams.md §4.7) scans the table with. The table is
/// described only when a snapshot is needed: its key schema and read rate come from there.
pub struct SnapshotScan<T> {
    /// The table API.
    pub api: Arc<T>,
    /// `TotalSegments`.
    pub segments: u32,
    /// Segments read at once.
    pub max_concurrency: usize,
    /// `Limit` of each page.
    pub page_limit: Option<u32>,
    /// `ConsistentRead`.
    pub consistent_read: bool,
    /// The read-rate rule (docs/scan.md §2.7), applied to the described table and refreshed while
    /// the scan runs.
    pub read_rule: ReadRule,
}

impl<T> SnapshotScan<T> {
    /// The snapshot scan of `plan` through `api`.
    pub fn new(api: Arc<T>, plan: &SnapshotPlan) -> Self {
        SnapshotScan {
            api,
            segments: plan.segments,
            max_concurrency: plan.max_concurrency,
            page_limit: plan.page_limit,
            consistent_read: plan.consistent_read,
            read_rule: plan.read_rule.clone(),
        }
    }
}

/// A `TableApi` that cannot exist: the type of "no snapshot scan".
enum NoTable {}

impl TableApi for NoTable {
    async fn read_page(&self, _: &ReadRequest) -> Result<Page, ApiError> {
        match *self {}
    }
    async fn describe_table(&self, _: &str) -> Result<Option<TableDescription>, ApiError> {
        match *self {}
    }
    async fn list_tables(&self, _: Option<&str>) -> Result<TableNames, ApiError> {
        match *self {}
    }
}

/// Runs the stream from the checkpointer's stored position to an end condition. A gap at
/// start-up with `on_gap: resnapshot` fails: resnapshots need [`run_streams_with_snapshots`].
pub async fn run_streams<A: StreamsApi, S: Sink>(
    api: Arc<A>,
    run: &StreamRun,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    stop: Cancel,
    observer: Arc<dyn AttemptObserver>,
    progress: &dyn Progress,
) -> Result<StreamOutcome, StreamRunError> {
    run_streams_with_snapshots::<A, NoTable, S>(
        api,
        None,
        run,
        sink,
        checkpointer,
        stop,
        observer,
        progress,
    )
    .await
}

/// [`run_streams`], able to resnapshot: a gap at start-up with `on_gap: resnapshot` captures the
/// shard positions, scans the table as snapshot envelopes (`op: "r"`) with per-segment
/// checkpoints kept in the snapshot record, then streams from the capture. An open snapshot
/// found at start-up is resumed where it stopped.
#[allow(clippy::too_many_arguments)] // The run's wiring, passed once.
pub async fn run_streams_with_snapshots<A: StreamsApi, T: TableApi, S: Sink>(
    api: Arc<A>,
    snapshot: Option<SnapshotScan<T>>,
    run: &StreamRun,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    stop: Cancel,
    observer: Arc<dyn AttemptObserver>,
    progress: &dyn Progress,
) -> Result<StreamOutcome, StreamRunError> {
    let run_start_ms = unix_now_ms();
    let discovery = shard_sync::discover(
        api.as_ref(),
        &run.stream_arn,
        &run.retry,
        &stop,
        observer.as_ref(),
    )
    .await?;
    let status = discovery.status.clone();
    let mut graph = ShardGraph::new();
    graph.merge(discovery.shards);
    tracing::info!(shards = graph.len(), stream = %run.stream_arn, "Shards discovered.");

    let mut snapshotted = false;
    if checkpointer.snapshot_open() {
        let Some(scan) = &snapshot else {
            return Err(StreamRunError::Gap(
                "the stored position holds an open snapshot; this run cannot scan the table".into(),
            ));
        };
        tracing::info!("Resuming the open snapshot.");
        snapshot_phase(
            scan,
            run,
            sink,
            checkpointer,
            None,
            &stop,
            observer.clone(),
            progress,
        )
        .await?;
        snapshotted = true;
    }
    if run.kind == StreamKind::Mirror && checkpointer.streams_position().is_none() {
        let Some(scan) = &snapshot else {
            return Err(StreamRunError::Gap(
                "mode: mirror needs a table scan; this run cannot scan the table".into(),
            ));
        };
        let rows = checkpointer
            .destination_rows()
            .await
            .map_err(RunError::from)?
            .unwrap_or(0);
        let capture = mirror_capture(run, &graph, scan.segments, rows);
        tracing::info!(
            shards = capture.shards.len(),
            destination_rows = rows,
            "Mirror: shard positions captured; scanning the table."
        );
        snapshot_phase(
            scan,
            run,
            sink,
            checkpointer,
            Some(capture),
            &stop,
            observer.clone(),
            progress,
        )
        .await?;
        snapshotted = true;
    }
    let stored = checkpointer.streams_position().cloned();
    let first_run = stored.is_none();
    let mut probed = BTreeMap::new();
    let position = match stored {
        None => {
            let mut position = StreamsPosition::new(run.kind, Some(run.stream_arn.clone()));
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
                // Now, not the run's start: a snapshot may have taken hours (docs/mirror.md §5.4).
                unix_now_ms() / 1000,
            );
            for warning in &findings.warnings {
                tracing::warn!("{warning}");
            }
            let mut reasons = findings.reasons;
            if reasons.is_empty() {
                reasons = probe(
                    api.as_ref(),
                    run,
                    &findings.probes,
                    &stop,
                    &mut probed,
                    observer.as_ref(),
                )
                .await?
                .into_iter()
                .map(|(_, reason)| reason)
                .collect();
            }
            if !reasons.is_empty() {
                tracing::warn!(reasons = %reasons.join("; "), "Gap detected at start-up.");
                let resnapshot = run.on_gap == OnGap::Resnapshot && !snapshotted;
                let Some(scan) = snapshot.as_ref().filter(|_| resnapshot) else {
                    let message = gaps::cannot_resume(&run.table, &reasons, &run.config_label);
                    return Err(StreamRunError::Gap(if snapshotted {
                        format!(
                            "{message} (found right after a snapshot: the snapshot took longer than the stream retention margin — raise segments, max_concurrency or the read limit)"
                        )
                    } else {
                        message
                    }));
                };
                let deletes = if checkpointer.deletes_unseen() {
                    "destination rows of items deleted meanwhile are deleted once the scan completes (resnapshot_deletes: true)"
                } else {
                    "nothing is deleted, so rows of items deleted meanwhile stay in the destination (resnapshot_deletes: false or a jsonl sink)"
                };
                tracing::warn!(
                    table = %run.table,
                    reasons = %reasons.join("; "),
                    "Resnapshot: the table is scanned again, then the stream is read from a fresh capture; {deletes}."
                );
                let capture = capture(
                    api.as_ref(),
                    run,
                    &graph,
                    &position,
                    &reasons,
                    scan.segments,
                    &stop,
                )
                .await?;
                snapshot_phase(
                    scan,
                    run,
                    sink,
                    checkpointer,
                    Some(capture),
                    &stop,
                    observer.clone(),
                    progress,
                )
                .await?;
                probed.clear();
                checkpointer.streams_position().cloned().unwrap_or(position)
            } else {
                position.stream_arn = Some(run.stream_arn.clone());
                lineage::prune(&graph, &mut position);
                position
            }
        }
    };
    checkpointer
        .set_streams(position.clone())
        .await
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
    .await
    .with_status(status.as_deref());
    // The stream has no total to show progress against: the observer is told so.
    progress.streaming();
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
    observer: &dyn AttemptObserver,
) -> Result<Vec<(ShardId, String)>, StreamRunError> {
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
                    observer,
                    |_| api.shard_iterator(&run.stream_arn, shard, &start),
                )
                .await;
            (shard, seq, answer)
        });
        for (shard, seq, answer) in futures_util::future::join_all(answers).await {
            match answer {
                Ok(Some(iterator)) => {
                    probed.insert(shard.clone(), iterator);
                }
                Ok(None) => {}
                Err(error) if error.code() == Some("TrimmedDataAccessException") => {
                    reasons.push((shard.clone(), gaps::trimmed(shard, seq)));
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(reasons)
}

/// The capture of a resnapshot (docs/streams.md §4.7 step 3): the current ARN; every described shard
/// opened; a positioned shard keeps its position only if the ARN is unchanged and its trim
/// probe passed; finished ids are kept when the ARN is unchanged; every other shard is `""`
/// verified at the capture time. The open snapshot record goes with it.
async fn capture<A: StreamsApi>(
    api: &A,
    run: &StreamRun,
    graph: &ShardGraph,
    stored: &StreamsPosition,
    reasons: &[String],
    segments: u32,
    stop: &Cancel,
) -> Result<StreamsPosition, StreamRunError> {
    let captured_ms = unix_now_ms();
    let captured_s = captured_ms.div_euclid(1000);
    let same_stream = stored.stream_arn.as_deref() == Some(run.stream_arn.as_str());
    let mut unused = BTreeMap::new();
    let trimmed: Vec<ShardId> = if same_stream {
        probe(
            api,
            run,
            &gaps::probes(stored, graph),
            stop,
            &mut unused,
            &ddbpipe_source::events::RequestMetrics,
        )
        .await?
        .into_iter()
        .map(|(shard, _)| shard)
        .collect()
    } else {
        Vec::new()
    };
    let mut capture = StreamsPosition::new(run.kind, Some(run.stream_arn.clone()));
    if same_stream {
        capture.finished = stored.finished.clone();
        for id in &capture.finished {
            if let Some(at) = stored.verified_at.get(id) {
                capture.verified_at.insert(id.clone(), *at);
            }
        }
    }
    for id in graph.ids() {
        if capture.finished.contains(id) {
            continue;
        }
        match stored.shards.get(id) {
            Some(ShardCheckpoint::After(seq)) if same_stream && !trimmed.contains(id) => {
                capture.advance(id, seq);
            }
            _ => capture.admit(id, Some(captured_s), None),
        }
    }
    capture.snapshot = Some(snapshot_record(
        captured_ms,
        segments,
        SnapshotReason::Resnapshot,
        reasons,
        0,
    ));
    Ok(capture)
}

/// A mirror's first capture (docs/mirror.md §5.1): every described shard at its trim horizon, verified at
/// the capture time, with the open snapshot record.
fn mirror_capture(
    run: &StreamRun,
    graph: &ShardGraph,
    segments: u32,
    destination_rows: u64,
) -> StreamsPosition {
    let captured_ms = unix_now_ms();
    let captured_s = captured_ms.div_euclid(1000);
    let mut capture = StreamsPosition::new(run.kind, Some(run.stream_arn.clone()));
    for id in graph.ids() {
        capture.admit(id, Some(captured_s), None);
    }
    capture.snapshot = Some(snapshot_record(
        captured_ms,
        segments,
        SnapshotReason::Mirror,
        &[],
        destination_rows,
    ));
    capture
}

/// An open snapshot record (docs/state.md §6.3).
fn snapshot_record(
    captured_ms: i64,
    segments: u32,
    reason: SnapshotReason,
    gap_reasons: &[String],
    destination_rows: u64,
) -> Box<SnapshotRecord> {
    Box::new(SnapshotRecord {
        captured_at: captured_ms.div_euclid(1000),
        complete: false,
        cursors: BTreeMap::new(),
        destination_rows_at_start: Some(destination_rows),
        done: Vec::new(),
        gap_reasons: gap_reasons.to_vec(),
        id: captured_ms,
        keys_written: 0,
        reason,
        total_segments: segments,
        other: BTreeMap::new(),
    })
}

/// The scan of a snapshot: every item as a snapshot envelope, segment progress committed in
/// the snapshot record; completing it closes the snapshot. A new `capture` is committed with
/// its open snapshot record **before** the first Scan request; without one, the stored open
/// snapshot is resumed. A snapshot whose scan completed earlier (its cleanup failed) is only
/// closed.
#[allow(clippy::too_many_arguments)] // The run's wiring, passed once.
async fn snapshot_phase<T: TableApi, S: Sink>(
    scan: &SnapshotScan<T>,
    run: &StreamRun,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    capture: Option<StreamsPosition>,
    stop: &Cancel,
    observer: Arc<dyn AttemptObserver>,
    progress: &dyn Progress,
) -> Result<(), StreamRunError> {
    if let Some(capture) = capture {
        checkpointer
            .begin_snapshot(capture, scan.segments)
            .await
            .map_err(RunError::from)?;
    }
    if checkpointer.snapshot_complete() {
        tracing::info!("The snapshot's scan completed earlier; closing it.");
        checkpointer
            .close_snapshot()
            .await
            .map_err(RunError::from)?;
        return ceiling(checkpointer);
    }
    let described = run
        .retry
        .run(
            "describe_table",
            || format!("DescribeTable '{}'", run.table),
            stop,
            observer.as_ref(),
            |_| scan.api.describe_table(&run.table),
        )
        .await?;
    let Some(description) = described else {
        return Err(StreamRunError::Gap(format!(
            "DescribeTable '{}' returned no table",
            run.table
        )));
    };
    if description.key_schema.is_empty() {
        return Err(StreamRunError::Gap(format!(
            "table '{}' has an empty key schema",
            run.table
        )));
    }
    let rate = scan
        .read_rule
        .rate(&description)
        .map_err(|problem| StreamRunError::Config(problem.to_string()))?;
    let limiter = Arc::new(ReadLimiter::new(rate));
    let refresher = Refresher::start(
        Arc::clone(&scan.api),
        &scan.read_rule,
        Arc::clone(&limiter),
        run.retry,
        stop.clone(),
        Arc::clone(&observer),
    );
    let key_schema: Vec<KeyAttribute> = description.key_schema;
    let table = run.table.clone();
    let format = run.format;
    let template = ReadRequest {
        table_name: run.table.clone(),
        kind: ReadKind::Scan { segment: None },
        index_name: None,
        projection: None,
        filter_expression: None,
        expression_attribute_names: BTreeMap::new(),
        expression_attribute_values: BTreeMap::new(),
        consistent_read: scan.consistent_read,
        limit: scan.page_limit,
        exclusive_start_key: None,
    };
    let reader = SegmentReader {
        api: Arc::clone(&scan.api),
        template,
        total_segments: scan.segments,
        max_concurrency: scan.max_concurrency,
        limiter,
        retry: run.retry,
        render: Render::Snapshots(Arc::new(SnapshotShape {
            key_schema,
            table,
            format,
        })),
        observer,
    };
    tracing::info!(segments = scan.segments, "Snapshot started.");
    let outcome = run_scan(
        reader,
        run.batch_size,
        sink,
        checkpointer,
        stop.clone(),
        progress,
    )
    .await?;
    drop(refresher);
    if !outcome.completed {
        return Err(StreamRunError::SnapshotInterrupted);
    }
    ceiling(checkpointer)
}

/// Stops the run once when the snapshot's cleanup was skipped for its size (docs/mirror.md §5.3).
fn ceiling(checkpointer: &mut Checkpointer) -> Result<(), StreamRunError> {
    match checkpointer.take_ceiling() {
        Some(hit) => Err(StreamRunError::CleanupSkipped {
            keys: hit.keys,
            max_keys: hit.max_keys,
        }),
        None => Ok(()),
    }
}
