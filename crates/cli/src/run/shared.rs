//! A scan, query, stream or mirror shared by several workers (`coordination:`,
//! docs/coordination.md §11.10–§11.12): the plan over what was built (`build`: the table, the
//! stream, this worker's sink and lease table, `join`), then the library's leased runner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddbpipe_pipeline::leased::{
    LeasedMirror, LeasedOutcome, LeasedScan, LeasedStreams, SharedExports,
};
use ddbpipe_pipeline::runner::NoProgress;
use ddbpipe_pipeline::streams::{StreamRun, StreamRunError};
use ddbpipe_source::api::{Render, SnapshotShape};
use ddbpipe_source::aws;
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::plan::{ScanPlan, StreamPlan};
use ddbpipe_source::retry::Cancel;

use super::build::{Read, Run};
use super::join::{Joined, Parts};
use crate::config::{CoordinationConfig, PipelineConfig};
use crate::destination::AnySink;
use crate::failure::Failure;
use crate::origin::Origin;
use crate::summary::{Ended, Summary};
use crate::telemetry::ScanProgress;

/// How often a worker of a shared mirror reads the snapshot record to learn that another
/// worker replaced its snapshot (docs/coordination.md §11.12 rule 8).
const RECORD_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Runs one worker of a shared `mode: scan` or `mode: query` pipeline.
pub(super) async fn run(
    run: Run<'_>,
    coordination: &CoordinationConfig,
    read: Read,
    joined: Joined,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let Run {
        config,
        origin,
        progress,
    } = run;
    let source = &config.source;
    // Validation refuses export snapshots to a shared scan: a scan or a query.
    let kind = super::build::scan_kind(source);
    let table = read.table()?;
    let Parts {
        worker,
        worker_id,
        identity,
        mut sink,
    } = joined.parts(config, coordination)?;
    let plan =
        ScanPlan::build(source, table).map_err(|problem| Failure::usage(problem.config_error()))?;
    let render = Render::keyed_items(plan.format, &table.key_schema);
    let (reader, refresher) = super::scan::segment_reader(read.table_api, &plan, render, &stop);
    tracing::info!(
        mode = %source.mode,
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        segments = plan.total_segments,
        "Shared run started."
    );
    let started = Instant::now();
    let bar = ScanProgress::new(progress, None, 0, plan.total_segments);
    let outcome = LeasedScan {
        reader,
        worker,
        batch: plan.batch,
        checkpoint_interval: Duration::from_millis(config.state.flush_interval_ms),
        identity,
    }
    .run(&mut sink, stop, &bar)
    .await;
    bar.finish();
    drop(refresher);
    let outcome = outcome.map_err(|error| super::scan::run_failure(error, config, origin, kind))?;
    let mut summary = summarize(
        config,
        coordination,
        &worker_id,
        &outcome,
        started.elapsed(),
    );
    if !outcome.completed {
        summary.note = Some(super::stopped_note(
            origin,
            "its leases were handed back with their checkpoints and the other workers go on",
            "joins again",
        ));
    }
    Ok(summary)
}

/// Runs one worker of a shared `mode: streams` pipeline (docs/coordination.md §11.11).
pub(super) async fn run_streams(
    run: Run<'_>,
    coordination: &CoordinationConfig,
    read: Read,
    joined: Joined,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let config = run.config;
    let origin = run.origin;
    let source = &config.source;
    let stream = read.stream()?;
    let Parts {
        worker,
        worker_id,
        identity,
        mut sink,
    } = joined.parts(config, coordination)?;
    let plan = StreamPlan::build(source);
    let run = StreamRun::new(&plan, &source.table_name, &stream.arn);
    tracing::info!(
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        stream = %stream.arn,
        "Shared stream started."
    );
    let started = Instant::now();
    let outcome = LeasedStreams {
        api: Arc::new(aws::streams_api(&read.sdk)),
        run,
        worker,
        checkpoint_interval: Duration::from_millis(config.state.flush_interval_ms),
        observer: Arc::new(RequestMetrics),
        identity,
        kept: Vec::new(),
    }
    .run(&mut sink, stop, &NoProgress)
    .await
    .map_err(|error| super::streams::stream_failure(StreamRunError::Run(error), origin))?;
    let why = super::streams::ended_because(outcome.end);
    let leases = &outcome.leases;
    tracing::info!(
        worker = %worker_id,
        records = outcome.written,
        taken = leases.taken,
        stolen = leases.stolen,
        lost = leases.lost,
        finished = leases.finished,
        reason = why,
        "Shared stream ended."
    );
    Ok(super::summary(
        super::streams::ended(outcome.end),
        outcome.written,
        format!(
            "ddbpipe: worker {worker_id} of the streams of '{}' ended ({why}): {} change \
             record(s) written in {:.1}s{}; leases: {} taken ({} stolen), {} lost, {} \
             shard(s) finished here; {} of {} shard(s) finished in lease table {}",
            source.table_name,
            outcome.written,
            started.elapsed().as_secs_f64(),
            super::streams::request_rate(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.shards_finished,
            outcome.shards,
            coordination.lease_table
        ),
    ))
}

/// Runs one worker of a shared `mode: mirror` pipeline into a keyed sink (docs/coordination.md
/// §11.12): the snapshot's segments, the cleanup once, then the stream.
pub(super) async fn run_mirror(
    run: Run<'_>,
    coordination: &CoordinationConfig,
    read: Read,
    joined: Joined,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let Run {
        config,
        origin,
        progress,
    } = run;
    let source = &config.source;
    let table = read.table()?;
    let stream = read.stream()?;
    // One owner for both phases (`Joined::worker`).
    let scan_worker = joined.worker(config, coordination)?;
    let Parts {
        worker: stream_worker,
        worker_id,
        identity,
        sink,
    } = joined.parts(config, coordination)?;
    let AnySink::Keyed(mut sink) = sink else {
        return Err(Failure::runtime(anyhow::anyhow!(
            "internal error: a shared mirror writes a keyed sink"
        )));
    };
    let stream_plan = StreamPlan::build(source);
    let plan = ScanPlan::of_snapshot(&stream_plan, &source.table_name, table)
        .map_err(|problem| Failure::usage(problem.config_error()))?;
    let shape = Arc::new(SnapshotShape {
        key_schema: table.key_schema.clone(),
        table: source.table_name.clone(),
        format: source.value_format,
    });
    // `snapshot.engine: export`: the export's data files are leased as segments.
    let exports = match crate::export::engine(&read.sdk, source) {
        Some(engine) => Some(SharedExports {
            engine: Arc::new(engine),
            table_arn: crate::export::table_arn(source, table)?,
            shape: Arc::clone(&shape),
        }),
        None => None,
    };
    // `on_gap: repair`: a gap's changes are read from incremental exports (docs/coordination.md
    // §11.12 rule 9); a repair the record holds is finished whatever `on_gap` says now.
    let repairs = match crate::export::repairs(&read.sdk, source, true) {
        Some(engine) => Some(SharedExports {
            engine: Arc::new(engine),
            table_arn: crate::export::table_arn(source, table)?,
            shape: Arc::clone(&shape),
        }),
        None => None,
    };
    let (reader, refresher) = super::scan::segment_reader(
        Arc::clone(&read.table_api),
        &plan,
        Render::Snapshots(shape),
        &stop,
    );
    let run = StreamRun::new(&stream_plan, &source.table_name, &stream.arn);
    let checkpoint_interval = Duration::from_millis(config.state.flush_interval_ms);
    tracing::info!(
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        stream = %stream.arn,
        segments = plan.total_segments,
        "Shared mirror started."
    );
    let started = Instant::now();
    let bar = ScanProgress::new(progress, table.item_count, 0, plan.total_segments);
    let mirror = LeasedMirror {
        scan: LeasedScan {
            reader,
            worker: scan_worker,
            batch: plan.batch,
            checkpoint_interval,
            identity: identity.clone(),
        },
        streams: LeasedStreams {
            api: Arc::new(aws::streams_api(&read.sdk)),
            run,
            worker: stream_worker,
            checkpoint_interval,
            observer: Arc::new(RequestMetrics),
            identity,
            kept: Vec::new(),
        },
        deletes: source.resnapshot_deletes,
        max_keys: source.resnapshot_max_keys as u64,
        exports,
        resnapshot: source.on_gap.may_resnapshot(),
        repairs,
        watch_interval: RECORD_WATCH_INTERVAL,
    };
    let outcome = mirror.run(&mut sink, stop, &bar).await;
    bar.finish();
    drop(refresher);
    let outcome = match outcome {
        Err(error) if error.damaged_export().is_some() => {
            return Err(damaged_shared_export(error, origin));
        }
        Err(error) => return super::streams::stream_end(error, config, origin),
        Ok(outcome) => outcome,
    };
    let why = super::streams::ended_because(outcome.streams.end);
    let leases = &outcome.streams.leases;
    // The changes written beside the snapshot are change records, not snapshot items.
    let beside = outcome.changes_beside;
    let items = outcome
        .scan
        .as_ref()
        .map_or(0, |scan| scan.written.saturating_sub(beside));
    let mut snapshot = match (&outcome.snapshot.repair, &outcome.scan, &outcome.cleanup) {
        // A repair's generation (docs/coordination.md §11.12 rule 9).
        (Some(repair), scan, cleanup) => {
            let closed = match cleanup {
                Some(cleanup) => format!(
                    "closed here, {} row(s) its changes left out deleted",
                    cleanup.deleted
                ),
                None => "closed by another worker".to_string(),
            };
            format!(
                "repair {} of the gap's changes from {} to {} (unix ms) applied ({} change(s) \
                 of its last window here; that window {closed})",
                outcome.snapshot.id,
                repair.from_ms,
                repair.to_ms,
                scan.as_ref().map_or(0, |scan| scan.written)
            )
        }
        (None, _, Some(cleanup)) => format!(
            "snapshot {} read ({items} item(s) here) and closed here: {} key(s), {} row(s) deleted",
            outcome.snapshot.id, cleanup.keys_written, cleanup.deleted
        ),
        (None, Some(_), None) => format!(
            "snapshot {} read ({items} item(s) here), closed by another worker",
            outcome.snapshot.id
        ),
        (None, None, None) => format!(
            "snapshot {} closed before this worker came",
            outcome.snapshot.id
        ),
    };
    // A snapshot opened in place of another (docs/coordination.md §11.12 rule 8).
    if outcome.snapshot.generation > 0 {
        snapshot.push_str(&format!(
            " (generation {}, replacing one for {})",
            outcome.snapshot.generation,
            outcome
                .snapshot
                .replaced
                .as_deref()
                .unwrap_or("a reason not kept")
        ));
    }
    if outcome.replaced > 0 {
        snapshot.push_str(&format!(
            "; this worker moved past {} replaced snapshot(s) (what it wrote under them is not \
             counted below)",
            outcome.replaced
        ));
    }
    tracing::info!(
        worker = %worker_id,
        records = outcome.streams.written,
        reason = why,
        "Shared mirror ended."
    );
    Ok(super::summary(
        super::streams::ended(outcome.streams.end),
        outcome.streams.written + beside,
        format!(
            "ddbpipe: worker {worker_id} of the mirror of '{}' ended ({why}): {snapshot}; {} \
             change record(s) written in {:.1}s{}; stream leases: {} taken ({} stolen), {} \
             lost, {} shard(s) finished here; {} of {} shard(s) finished in lease table {}",
            source.table_name,
            outcome.streams.written + beside,
            started.elapsed().as_secs_f64(),
            super::streams::request_rate(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.streams.shards_finished,
            outcome.streams.shards,
            coordination.lease_table
        ),
    ))
}

fn summarize(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    worker_id: &str,
    outcome: &LeasedOutcome,
    took: Duration,
) -> Summary {
    let leases = &outcome.leases;
    if outcome.completed && leases.taken == 0 && outcome.written == 0 {
        tracing::warn!(
            "Every segment was already done in lease table {} (an earlier shared run); `ddbpipe \
             state reset` forgets it so that the next run reads the table again.",
            coordination.lease_table
        );
    }
    let status = if outcome.completed {
        "complete"
    } else {
        "stopped by a signal"
    };
    tracing::info!(
        worker = %worker_id,
        items = outcome.written,
        taken = leases.taken,
        stolen = leases.stolen,
        lost = leases.lost,
        finished = leases.finished,
        "Shared {} {status}.",
        config.source.mode
    );
    super::summary(
        if outcome.completed {
            Ended::Complete
        } else {
            Ended::Stopped
        },
        outcome.written,
        format!(
            "ddbpipe: worker {worker_id} of the {} of '{}' {status}: {} read, {} written, {:.1} \
             capacity units, {:.1}s; leases: {} taken ({} stolen), {} lost, {} segment(s) \
             finished here; {} of {} segment(s) done in lease table {}",
            config.source.mode,
            config.source.table_name,
            outcome.read,
            outcome.written,
            outcome.capacity_units,
            took.as_secs_f64(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.segments_done,
            outcome.total_segments,
            coordination.lease_table
        ),
    )
}

/// A shared snapshot's export whose files are damaged or gone twice in a row (docs/coordination.md
/// §11.12 rules 7 and 8): the first damaged export was replaced by a new snapshot reading a
/// new one, and that one is damaged too: what works is to check the bucket, then a new snapshot.
fn damaged_shared_export(error: StreamRunError, origin: &Origin) -> Failure {
    Failure::runtime(error).hint(format!(
        "the export's files are damaged or gone again after the snapshot was replaced once \
         for a damaged export (check the bucket's objects and who writes them: S3 is the trust \
         boundary, docs/scan.md §2.10); then stop every worker, {}, and start them again: a \
         new snapshot reads a new export (nothing of a damaged file was written)",
        origin.reset()
    ))
}
