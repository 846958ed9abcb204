//! A streams run from start-up to end: the driver of the source's start-up plan
//! (`ddbpipe_source::streams::startup`, whose rules say what is decided), the snapshot scans it
//! asks for (`snapshot`), then the engine feeding the sink.
//!
//! # The driver (docs/streams.md §4.4–§4.7)
//! 1. Discover every shard (a failure, after retries, fails the run).
//! 2. Resume an open snapshot found in the stored position; a mirror's first run captures and
//!    scans.
//! 3. First run: commit the initial position **before** reading. Later runs: the layered gap
//!    checks, then the layer-4 probe; the plan says stream on, resnapshot, repair or fail. A
//!    failure leaves the state as it was. An open repair found at start-up is resumed first
//!    (`repair`, docs/streams.md §4.12).
//! 4. Commit the position the engine starts from; the probe's iterators serve the first slices.
//!
//! Nothing here names an AWS type: it runs on the AWS client and on the in-memory fake alike.

pub(crate) mod repair;
mod snapshot;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_source::api::{StreamsApi, TableApi};
use ddbpipe_source::capacity::ReadSlots;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{Mode, OnGap, StartPosition};
use ddbpipe_source::error::ReadError;
use ddbpipe_source::export::GivenExport;
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::plan::{BatchLimits, StreamPlan};
use ddbpipe_source::position::{RepairRecord, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{AttemptObserver, Cancel, RetryPolicy};
use ddbpipe_source::streams::engine::{RunBounds, StreamEngine};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::handover::{Handed, Handover};
use ddbpipe_source::streams::lineage::ShardGraph;
use ddbpipe_source::streams::repair::RepairPlan;
use ddbpipe_source::streams::shard_reader::{StreamContext, StreamReads};
use ddbpipe_source::streams::shard_sync;
use ddbpipe_source::streams::startup::{self, Resume, Startup};
use ddbpipe_value::ValueFormat;
use tokio::sync::mpsc;

pub use self::snapshot::SnapshotScan;
use self::snapshot::{BesideStream, NoTable, Snapshots};
use crate::checkpoint::Checkpointer;
use crate::runner::{Progress, RunError, StreamOutcome, run_stream};
use crate::sink::Sink;

/// Hand-overs waiting between the engine and the batcher.
pub(crate) const HANDOVER_DEPTH: usize = 2;

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
    /// The longest wait between reads of an idle shard (`max_idle_poll_ms`).
    pub max_idle_poll: Duration,
    /// Concurrency, discovery and end conditions.
    pub bounds: RunBounds,
    /// `trim_horizon` or `latest` (first run only).
    pub start_position: StartPosition,
    /// What a gap found at start-up does.
    pub on_gap: OnGap,
    /// Stop after this many records.
    pub max_messages: Option<u64>,
    /// How large a batch may grow.
    pub batch: BatchLimits,
    /// `streams`, or `mirror`: a mirror's first run captures every shard at its trim horizon
    /// and scans the table before streaming (docs/mirror.md §5).
    pub kind: StreamKind,
    /// The process's read slots (`source.read_concurrency`): GetRecords and the snapshot's
    /// pages take them.
    pub slots: ReadSlots,
}

impl StreamRun {
    /// The run of `plan` on `stream_arn` of `table`.
    pub fn new(plan: &StreamPlan, table: &str, stream_arn: &str) -> Self {
        StreamRun {
            table: table.to_string(),
            stream_arn: stream_arn.to_string(),
            format: plan.format,
            retry: plan.retry,
            records_per_request: plan.records_per_request,
            poll_interval: plan.poll_interval,
            max_idle_poll: plan.max_idle_poll,
            bounds: plan.bounds.clone(),
            start_position: plan.start_position,
            on_gap: plan.on_gap,
            max_messages: plan.max_messages,
            batch: plan.batch,
            kind: if plan.mode == Mode::Mirror {
                StreamKind::Mirror
            } else {
                StreamKind::Streams
            },
            slots: plan.slots.clone(),
        }
    }

    /// The stream this run reads and how it asks, through `api`.
    pub(crate) fn reads<A>(
        &self,
        api: Arc<A>,
        observer: Arc<dyn AttemptObserver>,
    ) -> StreamReads<A> {
        StreamReads {
            api,
            stream_arn: self.stream_arn.clone(),
            table: self.table.clone(),
            format: self.format,
            retry: self.retry,
            records_per_request: self.records_per_request,
            poll_interval: self.poll_interval,
            max_idle_poll: self.max_idle_poll,
            observer,
            gap_remedy: gaps::GapRemedy::OnGap,
            slots: self.slots.clone(),
        }
    }

    /// The stream engine of this run from `start.position`, and its hand-over channel.
    async fn engine<A: StreamsApi>(
        &self,
        api: Arc<A>,
        start: EngineStart,
        cancel: Cancel,
        observer: Arc<dyn AttemptObserver>,
    ) -> (StreamEngine<A>, mpsc::Receiver<Handed>) {
        let (tx, rx) = mpsc::channel(HANDOVER_DEPTH);
        let handover = Arc::new(Handover::new(tx, start.position, start.max_messages));
        let ctx = Arc::new(StreamContext {
            reads: self.reads(api, observer),
            handover,
            cancel: cancel.clone(),
        });
        let engine = StreamEngine::new(
            ctx,
            start.bounds,
            start.graph,
            self.start_position,
            start.first_run,
            start.run_start_ms,
            start.probed,
            cancel,
        )
        .await
        .with_status(start.status.as_deref());
        (engine, rx)
    }

    /// What the start-up plan knows about this run.
    fn startup(&self) -> Startup<'_> {
        Startup {
            kind: self.kind,
            stream_arn: &self.stream_arn,
            table: &self.table,
            start_position: self.start_position,
            on_gap: self.on_gap,
        }
    }

    /// Why `stored` cannot be resumed on `graph` now: the gap layers 1–3, then, when they find
    /// nothing, the layer-4 probe, whose iterators go into `probed` (docs/streams.md §4.5).
    /// Warnings are logged.
    async fn gap_reasons<A: StreamsApi>(
        &self,
        api: &A,
        stored: &StreamsPosition,
        graph: &ShardGraph,
        stop: &Cancel,
        probed: &mut BTreeMap<ShardId, String>,
        observer: &dyn AttemptObserver,
    ) -> Result<Vec<String>, ReadError> {
        // Now, not the run's start: a snapshot may have taken hours (docs/mirror.md §5.4).
        let findings = startup::gap_findings(
            api,
            stored,
            &self.stream_arn,
            graph,
            &self.table,
            unix_now_ms() / 1000,
            self.bounds.shard_concurrency,
            &self.retry,
            stop,
            probed,
            observer,
        )
        .await?;
        for warning in &findings.warnings {
            tracing::warn!("{warning}");
        }
        Ok(findings.reasons)
    }

    /// Layer 4 through the run's retry policy (see [`startup::probe`]).
    async fn probe<A: StreamsApi>(
        &self,
        api: &A,
        probes: &[(ShardId, SequenceNumber)],
        stop: &Cancel,
        probed: &mut BTreeMap<ShardId, String>,
        observer: &dyn AttemptObserver,
    ) -> Result<Vec<(ShardId, String)>, ReadError> {
        let concurrency = self.bounds.shard_concurrency;
        startup::probe(
            api,
            &self.stream_arn,
            probes,
            concurrency,
            &self.retry,
            stop,
            probed,
            observer,
        )
        .await
    }
}

/// Where a stream engine starts and how it ends.
pub(super) struct EngineStart {
    /// The position it reads from.
    pub position: StreamsPosition,
    /// The shards described at start-up.
    pub graph: ShardGraph,
    /// The stream's status at start-up (`DISABLED` ends the run once every shard is read).
    pub status: Option<String>,
    /// Concurrency, discovery and end conditions.
    pub bounds: RunBounds,
    /// Stop after this many records.
    pub max_messages: Option<u64>,
    /// Whether no position was stored (docs/streams.md §4.4).
    pub first_run: bool,
    /// The run's start (unix ms).
    pub run_start_ms: i64,
    /// Iterators of the layer-4 probe, for the first slices.
    pub probed: BTreeMap<ShardId, String>,
}

impl StreamRunError {
    /// The damaged data file behind this failure (see [`RunError::damaged_export`]).
    pub fn damaged_export(&self) -> Option<&ddbpipe_source::export::ExportError> {
        match self {
            StreamRunError::Run(error) => error.damaged_export(),
            StreamRunError::Read(ReadError::Export(error)) if error.is_damaged() => Some(error),
            _ => None,
        }
    }
}

/// Why a streams run could not start or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamRunError {
    /// Definite: the stored position cannot be resumed without losing changes and `on_gap`
    /// is `fail` (docs/streams.md §4.6; the state is unchanged). Its remedies — `on_gap:
    /// resnapshot`, or forgetting the position — are the caller's to word.
    #[error("{0}")]
    CannotResume(String),
    /// Definite: a gap at start-up that the run cannot mend (the state is unchanged); the
    /// message says what to do.
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
    /// A signal stopped a repair's export reads; its progress is saved and the next run
    /// resumes it.
    #[error("the repair was interrupted: its progress is saved and the next run resumes it")]
    RepairInterrupted,
    /// A signal came as a shared mirror's generation ended on what replaces its snapshot (a
    /// gap, a damaged export) or as another worker's replacement of it was found: nothing was
    /// replaced and the leases are handed back; the next run replaces the snapshot or moves to
    /// its replacement (docs/coordination.md §11.12 rule 6).
    #[error(
        "the shared snapshot's replacement was interrupted: nothing was replaced and the next run replaces it or moves to the snapshot that did"
    )]
    ReplacementInterrupted,
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
    let (mut graph, mut status) = discover(api.as_ref(), run, &stop, observer.as_ref()).await?;
    tracing::info!(shards = graph.len(), stream = %run.stream_arn, "Shards discovered.");

    let plan = run.startup();
    let mut snapshots = Snapshots {
        scan: snapshot.as_ref(),
        run,
        stop: &stop,
        observer: Arc::clone(&observer),
        progress,
        changes_beside: std::sync::atomic::AtomicU64::new(0),
        given_export: GivenExport::Read,
    };
    let mut snapshotted = false;
    let mut read = false;
    if checkpointer.repair_open() {
        let scan = snapshots.scan("the stored position holds an open repair")?;
        tracing::info!("Resuming the open repair.");
        snapshots.repair(scan, sink, checkpointer).await?;
        (_, graph, status) = repair::recapture(&api, &snapshots, checkpointer).await?;
        snapshotted = true;
    }
    if checkpointer.snapshot_open() {
        let scan = snapshots.scan("the stored position holds an open snapshot")?;
        tracing::info!("Resuming the open snapshot.");
        // A snapshot whose scan completed earlier is only closed (its cleanup retried): no
        // stream is read beside it, the checks after the snapshot judge the position.
        let beside = if sink.versioned().is_some() && !checkpointer.snapshot_complete() {
            // The stream resumes with the scan: its stored shard positions must still be
            // readable (docs/mirror.md §5.6).
            check_beside(&api, run, &graph, checkpointer, &stop, observer.as_ref()).await?;
            Some(BesideStream {
                api: &api,
                graph: &graph,
                status: &status,
            })
        } else {
            None
        };
        read |= snapshots
            .run(scan, sink, checkpointer, None, beside)
            .await?;
        snapshotted = true;
    }
    if run.kind == StreamKind::Mirror && checkpointer.streams_position().is_none() {
        // Before the capture is committed: a configured export too old for the stream is a
        // gap (docs/scan.md §2.10 rule 8).
        let given = snapshots
            .given_export(
                snapshots.scan("mode: mirror needs a table scan")?,
                &api,
                &graph,
            )
            .await?;
        snapshots.given_export = given;
        let scan = snapshots.scan("mode: mirror needs a table scan")?;
        let rows = checkpointer
            .destination_rows()
            .await
            .map_err(RunError::from)?
            .unwrap_or(0);
        let capture = plan.mirror_capture(&graph, scan.segments, rows, unix_now_ms());
        tracing::info!(
            shards = capture.shards.len(),
            destination_rows = rows,
            "Mirror: shard positions captured; scanning the table."
        );
        let beside = sink.versioned().map(|_| BesideStream {
            api: &api,
            graph: &graph,
            status: &status,
        });
        read |= snapshots
            .run(scan, sink, checkpointer, Some(capture), beside)
            .await?;
        snapshotted = true;
    }
    // Only a snapshot that read the table took time: one that was only closed leaves the
    // listing of this start-up current.
    if read {
        // The checks below judge the position against the stream as it is now: a snapshot may
        // have taken hours, shards closed, expired or were created meanwhile (and, read beside
        // the snapshot, are already in the position; docs/mirror.md §5.2, §5.4).
        (graph, status) = discover(api.as_ref(), run, &stop, observer.as_ref()).await?;
    }
    let stored = checkpointer.streams_position().cloned();
    let first_run = stored.is_none();
    let mut probed = BTreeMap::new();
    let position = match stored {
        None => plan.first_run(&graph, run_start_ms),
        Some(stored) => {
            let reasons = run
                .gap_reasons(
                    api.as_ref(),
                    &stored,
                    &graph,
                    &stop,
                    &mut probed,
                    observer.as_ref(),
                )
                .await?;
            if !reasons.is_empty() {
                tracing::warn!(reasons = %reasons.join("; "), "Gap detected at start-up.");
            }
            let mut resume = plan.resume(
                stored.clone(),
                &graph,
                reasons,
                snapshot.is_some(),
                snapshotted,
            );
            if let Resume::Repair(reasons) = &resume {
                let scan = snapshots.scan("a repair needs the table's description")?;
                let mut planned = snapshots.plan_repair(scan, &stored).await?;
                if let RepairPlan::Repair { from_ms, .. } = planned
                    && let Some(why) = repair::unjudged(&*sink, from_ms).await?
                {
                    planned = RepairPlan::Resnapshot(why);
                }
                match planned {
                    RepairPlan::Repair { from_ms, to_ms } => {
                        tracing::warn!(
                            table = %run.table,
                            reasons = %reasons.join("; "),
                            from_ms,
                            to_ms,
                            "Repair: the changes of the gap's window are read from incremental exports, then the stream is captured again."
                        );
                        checkpointer
                            .begin_repair(RepairRecord::open(
                                unix_now_ms(),
                                from_ms,
                                to_ms,
                                reasons,
                            ))
                            .await
                            .map_err(RunError::from)?;
                        snapshots.repair(scan, sink, checkpointer).await?;
                        let position;
                        (position, graph, status) =
                            repair::recapture(&api, &snapshots, checkpointer).await?;
                        probed.clear();
                        resume = Resume::Stream(position);
                    }
                    RepairPlan::Resnapshot(why) => {
                        tracing::warn!(
                            table = %run.table,
                            "The gap cannot be repaired by incremental exports: {why}; the table is snapshotted again instead."
                        );
                        resume = Resume::Resnapshot(reasons.clone());
                    }
                }
            }
            match resume {
                Resume::Stream(position) => position,
                Resume::Repair(_) => unreachable!("a repair became a stream or a resnapshot"),
                Resume::Fail(message) => return Err(StreamRunError::CannotResume(message)),
                Resume::Resnapshot(reasons) => {
                    let given = snapshots
                        .given_export(
                            snapshots.scan("a resnapshot needs a table scan")?,
                            &api,
                            &graph,
                        )
                        .await?;
                    snapshots.given_export = given;
                    let scan = snapshots.scan("a resnapshot needs a table scan")?;
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
                    // Positions kept by the capture must not be trimmed (rule 5); the probe's
                    // iterators are not used, the stream is read from the capture later.
                    let trimmed =
                        trimmed(api.as_ref(), run, &stored, &graph, &stop, observer.as_ref())
                            .await?;
                    let capture = plan.resnapshot_capture(
                        &stored,
                        &graph,
                        &trimmed,
                        &reasons,
                        scan.segments,
                        unix_now_ms(),
                    );
                    let beside = sink.versioned().map(|_| BesideStream {
                        api: &api,
                        graph: &graph,
                        status: &status,
                    });
                    snapshots
                        .run(scan, sink, checkpointer, Some(capture), beside)
                        .await?;
                    probed.clear();
                    checkpointer.streams_position().cloned().unwrap_or(stored)
                }
            }
        }
    };
    checkpointer
        .set_streams(position.clone())
        .await
        .map_err(RunError::from)?;
    let changes_beside = snapshots
        .changes_beside
        .load(std::sync::atomic::Ordering::Relaxed);
    drop(snapshots);

    let (engine, rx) = run
        .engine(
            api,
            EngineStart {
                position,
                graph,
                status,
                bounds: run.bounds.clone(),
                max_messages: run.max_messages,
                first_run,
                run_start_ms,
                probed,
            },
            stop,
            observer,
        )
        .await;
    // The stream has no total to show progress against: the observer is told so.
    progress.streaming();
    let mut outcome = run_stream(engine, rx, run.batch, sink, checkpointer, progress).await?;
    // Issue 24 item 20: the changes applied beside a snapshot were written by this run too.
    outcome.written += changes_beside;
    Ok(outcome)
}

/// Before an open snapshot resumes with the stream beside it: the stored shard positions must
/// still be readable (gap layers 1–4, docs/streams.md §4.5). A gap there means changes made
/// during the snapshot are lost: the run fails naming the reasons, and the state stays as it
/// was (`state reset` starts the mirror over).
async fn check_beside<A: StreamsApi>(
    api: &Arc<A>,
    run: &StreamRun,
    graph: &ShardGraph,
    checkpointer: &Checkpointer,
    stop: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<(), StreamRunError> {
    let Some(stored) = checkpointer.streams_position() else {
        return Ok(());
    };
    let reasons = run
        .gap_reasons(
            api.as_ref(),
            stored,
            graph,
            stop,
            &mut BTreeMap::new(),
            observer,
        )
        .await?;
    if reasons.is_empty() {
        return Ok(());
    }
    Err(StreamRunError::CannotResume(format!(
        "{} (found while resuming an open snapshot whose stream was read beside its scan: the run was stopped longer than the stream keeps changes)",
        gaps::cannot_resume(&run.table, &reasons)
    )))
}

/// The positioned shards of `stored` whose layer-4 probe is trimmed (none when `stored` belongs
/// to another stream): a capture of the same stream keeps the other positions (startup rule 5).
/// The probe's iterators are not used; the stream is read from the capture later.
async fn trimmed<A: StreamsApi>(
    api: &A,
    run: &StreamRun,
    stored: &StreamsPosition,
    graph: &ShardGraph,
    stop: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<Vec<ShardId>, StreamRunError> {
    if stored.stream_arn.as_deref() != Some(run.stream_arn.as_str()) {
        return Ok(Vec::new());
    }
    let probes = gaps::probes(stored, graph);
    let trimmed = run
        .probe(api, &probes, stop, &mut BTreeMap::new(), observer)
        .await?;
    Ok(trimmed.into_iter().map(|(shard, _)| shard).collect())
}

/// Every shard of the run's stream (a failure, after retries, fails the run), and the stream's
/// status.
async fn discover<A: StreamsApi>(
    api: &A,
    run: &StreamRun,
    stop: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<(ShardGraph, Option<String>), StreamRunError> {
    let discovery = shard_sync::discover(api, &run.stream_arn, &run.retry, stop, observer).await?;
    let mut graph = ShardGraph::new();
    graph.merge(discovery.shards);
    Ok((graph, discovery.status))
}
