//! The snapshot scan of a mirror or resnapshot (docs/mirror.md §5, docs/streams.md §4.7): every
//! item as a snapshot envelope (`op: "r"`), segment progress committed in the open snapshot
//! record, the read rate refreshed while it runs; completing it closes the snapshot.
//!
//! Into a sink that applies rows by version (a keyed sink), the stream is read from the capture
//! while the table is scanned (docs/mirror.md §5.6, `runner::run_together`); into any other
//! sink the scan runs alone and the stream is read after it (§5.5).

use std::collections::BTreeMap;
use std::sync::Arc;

use ddbpipe_source::api::{
    KeyAttribute, Page, ReadRequest, Render, SnapshotShape, StreamsApi, TableApi, TableDescription,
    TableNames,
};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::OnGap;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::export::{GivenExport, SnapshotExports};
use ddbpipe_source::plan::{ReadRule, Refresher, SnapshotPlan};
use ddbpipe_source::position::StreamsPosition;
use ddbpipe_source::retry::{AttemptObserver, Cancel};
use ddbpipe_source::scan::{PageSource, SegmentReader, snapshot_template};
use ddbpipe_source::streams::engine::RunBounds;
use ddbpipe_source::streams::lineage::ShardGraph;
use ddbpipe_source::streams::since::unproven_since;

use super::{EngineStart, StreamRun, StreamRunError};
use crate::checkpoint::Checkpointer;
use crate::runner::{Progress, RunError, run_scan, run_together};
use crate::sink::Sink;

/// What a snapshot scans the table with. The table is described only when a snapshot is
/// needed: its key schema and read rate come from there.
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
    /// With `snapshot.engine: export`: snapshots read a full export instead of scanning
    /// (docs/scan.md §2.10), so they consume no read capacity.
    pub exports: Option<Arc<dyn SnapshotExports>>,
    /// With `on_gap: repair`: the export engine a gap's incremental exports go through
    /// (docs/streams.md §4.12), whatever the snapshot engine.
    pub repairs: Option<Arc<dyn SnapshotExports>>,
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
            exports: None,
            repairs: None,
        }
    }

    /// The same, reading exports through `exports` instead of scanning.
    pub fn with_exports(mut self, exports: Option<Arc<dyn SnapshotExports>>) -> Self {
        self.exports = exports;
        self
    }

    /// The same, repairing gaps by incremental exports through `repairs`.
    pub fn with_repairs(mut self, repairs: Option<Arc<dyn SnapshotExports>>) -> Self {
        self.repairs = repairs;
        self
    }
}

/// A `TableApi` that cannot exist: the type of "no snapshot scan".
pub(super) enum NoTable {}

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

/// The stream a snapshot reads beside its scan: the API and the shards discovered at start-up.
pub(super) struct BesideStream<'a, A> {
    pub api: &'a Arc<A>,
    pub graph: &'a ShardGraph,
    pub status: &'a Option<String>,
}

// References only: copied whatever `A` is (a derive would ask `A: Copy`).
impl<A> Clone for BesideStream<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for BesideStream<'_, A> {}

/// A run's snapshot scans: what they read with and report to, set up once.
pub(super) struct Snapshots<'a, T> {
    pub scan: Option<&'a SnapshotScan<T>>,
    pub run: &'a StreamRun,
    pub stop: &'a Cancel,
    pub observer: Arc<dyn AttemptObserver>,
    pub progress: &'a dyn Progress,
    /// Change records written beside the snapshots of this run (docs/mirror.md §5.6): the
    /// run's summary counts them with the stream's own.
    pub changes_beside: std::sync::atomic::AtomicU64,
    /// Whether a new snapshot may read `source.snapshot.export_arn` (`given_export`).
    pub given_export: GivenExport,
}

impl<T: TableApi> Snapshots<'_, T> {
    /// The snapshot scan, or the definite error `why` when this run cannot scan the table.
    pub fn scan(&self, why: &str) -> Result<&SnapshotScan<T>, StreamRunError> {
        self.scan
            .ok_or_else(|| StreamRunError::Gap(format!("{why}; this run cannot scan the table")))
    }

    /// Runs a snapshot to its end. A new `capture` is committed with its open snapshot record
    /// **before** the first Scan request; without one, the stored open snapshot is resumed. A
    /// snapshot whose scan completed earlier (its cleanup failed) is only closed.
    /// With `beside`, the stream is read from the committed position while the table is scanned
    /// (docs/mirror.md §5.6). `true` when it read the table (or an export); `false` when it only
    /// closed a snapshot read earlier.
    pub async fn run<S: Sink, A: StreamsApi>(
        &self,
        scan: &SnapshotScan<T>,
        sink: &mut S,
        checkpointer: &mut Checkpointer,
        capture: Option<StreamsPosition>,
        beside: Option<BesideStream<'_, A>>,
    ) -> Result<bool, StreamRunError> {
        let run = self.run;
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
            return ceiling(checkpointer).map(|()| false);
        }
        let description = self.describe(scan).await?;
        let key_schema: Vec<KeyAttribute> = description.key_schema.clone();
        let shape = Arc::new(SnapshotShape {
            key_schema,
            table: run.table.clone(),
            format: run.format,
        });
        let render = Render::Snapshots(Arc::clone(&shape));
        if let Some(exports) = &scan.exports {
            let stored = checkpointer.position().export_arn.clone();
            let table_arn = description.arn.clone().ok_or_else(|| {
                StreamRunError::Gap(format!(
                    "DescribeTable '{}' reported no TableArn, which an export needs",
                    run.table
                ))
            })?;
            let unique = checkpointer.snapshot_id().unwrap_or_default().to_string();
            let mut arn = exports
                .begin(
                    stored.as_deref(),
                    &table_arn,
                    &unique,
                    self.given_export,
                    self.stop,
                )
                .await?;
            if stored.as_deref() != Some(arn.as_str()) {
                checkpointer
                    .set_export(&arn)
                    .await
                    .map_err(RunError::from)?;
            }
            let mut abandoned = false;
            let completed = loop {
                tracing::info!(export = %arn, "The snapshot reads an export.");
                let reader = exports.reader(&arn, Arc::clone(&shape));
                match self.execute(reader, beside, sink, checkpointer).await {
                    // A damaged export fails every read the same way: a new one, once
                    // (`ddbpipe_source::export` rule 13).
                    Err(error) if !abandoned && error.damaged_export().is_some() => {
                        tracing::warn!(error = %error, "The snapshot's export is damaged.");
                        abandoned = true;
                        arn = exports
                            .abandon(&arn, &table_arn, None, &unique, self.stop)
                            .await?;
                        checkpointer
                            .set_export(&arn)
                            .await
                            .map_err(RunError::from)?;
                    }
                    result => break result?,
                }
            };
            if !completed {
                return Err(StreamRunError::SnapshotInterrupted);
            }
            return ceiling(checkpointer).map(|()| true);
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
            self.stop.clone(),
            Arc::clone(&self.observer),
        );
        let template = snapshot_template(&run.table, scan.consistent_read, scan.page_limit);
        let reader = SegmentReader {
            api: Arc::clone(&scan.api),
            template,
            total_segments: scan.segments,
            max_concurrency: scan.max_concurrency,
            limiter,
            retry: run.retry,
            render,
            observer: Arc::clone(&self.observer),
            slots: run.slots.clone(),
        };
        let completed = self.execute(reader, beside, sink, checkpointer).await?;
        drop(refresher);
        if !completed {
            return Err(StreamRunError::SnapshotInterrupted);
        }
        ceiling(checkpointer).map(|()| true)
    }

    /// The table, from one `DescribeTable` (retried): it must exist and have a key schema.
    pub async fn describe(
        &self,
        scan: &SnapshotScan<T>,
    ) -> Result<TableDescription, StreamRunError> {
        let run = self.run;
        let described = run
            .retry
            .run(
                "describe_table",
                || format!("DescribeTable '{}'", run.table),
                self.stop,
                self.observer.as_ref(),
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
        Ok(description)
    }

    /// Reads the snapshot's pages alone or beside the stream; `true` when it completed and the
    /// snapshot was closed.
    async fn execute<R: PageSource, S: Sink, A: StreamsApi>(
        &self,
        reader: R,
        beside: Option<BesideStream<'_, A>>,
        sink: &mut S,
        checkpointer: &mut Checkpointer,
    ) -> Result<bool, StreamRunError> {
        let run = self.run;
        let scan_segments = checkpointer.position().total_segments;
        Ok(match beside {
            None => {
                tracing::info!(segments = scan_segments, "Snapshot started.");
                tracing::warn!(
                    sink = %sink.describe(),
                    "This sink reads the stream only after the snapshot's scan: the scan must finish within the stream's 24 h retention (docs/mirror.md §5.5); a sqlite or postgres sink reads the stream beside the scan."
                );
                run_scan(
                    reader,
                    run.batch,
                    sink,
                    checkpointer,
                    self.stop.clone(),
                    self.progress,
                )
                .await?
                .completed
            }
            Some(beside) => {
                tracing::info!(
                    segments = scan_segments,
                    "Snapshot started; the stream is read beside it."
                );
                self.run_beside(reader, beside, sink, checkpointer).await?
            }
        })
    }

    /// The scan and the stream from the committed position together
    /// (`runner::run_together`); `true` when the scan completed and the snapshot was closed.
    async fn run_beside<R: PageSource, S: Sink, A: StreamsApi>(
        &self,
        reader: R,
        beside: BesideStream<'_, A>,
        sink: &mut S,
        checkpointer: &mut Checkpointer,
    ) -> Result<bool, StreamRunError> {
        let run = self.run;
        let position = checkpointer.streams_position().cloned().ok_or_else(|| {
            StreamRunError::Gap("an open snapshot without shard positions".into())
        })?;
        let (engine_stop, engine_cancel) = Cancel::new();
        let (engine, handed) = run
            .engine(
                Arc::clone(beside.api),
                EngineStart {
                    position,
                    graph: beside.graph.clone(),
                    status: beside.status.clone(),
                    // No max_messages and no idle end while the snapshot is open (runner
                    // rule 2).
                    bounds: RunBounds {
                        idle_termination: None,
                        follow: true,
                        ..run.bounds.clone()
                    },
                    max_messages: None,
                    first_run: false,
                    run_start_ms: unix_now_ms(),
                    probed: BTreeMap::new(),
                },
                engine_cancel,
                Arc::clone(&self.observer),
            )
            .await;
        let outcome = run_together(
            reader,
            engine,
            engine_stop,
            handed,
            run.batch,
            sink,
            checkpointer,
            self.stop.clone(),
            self.progress,
        )
        .await?;
        tracing::info!(
            snapshot_rows = outcome.snapshot_rows,
            changes = outcome.changes,
            completed = outcome.completed,
            "Snapshot and stream read together."
        );
        self.changes_beside
            .fetch_add(outcome.changes, std::sync::atomic::Ordering::Relaxed);
        Ok(outcome.completed)
    }
}

impl<T: TableApi> Snapshots<'_, T> {
    /// Whether a snapshot about to capture the stream `graph` may read the configured
    /// `export_arn` (docs/scan.md §2.10 rule 8): only when the stream proves it still holds
    /// every change since the export's time (`streams::since`). Otherwise a gap, by
    /// `on_gap`: `fail` stops the run before anything is committed; `resnapshot` and `repair`
    /// take a new export instead, logged once.
    pub async fn given_export<A: StreamsApi>(
        &self,
        scan: &SnapshotScan<T>,
        api: &Arc<A>,
        graph: &ShardGraph,
    ) -> Result<GivenExport, StreamRunError> {
        let run = self.run;
        let Some(exports) = &scan.exports else {
            return Ok(GivenExport::Read);
        };
        let Some((arn, at_ms)) = exports.given_export(self.stop).await? else {
            return Ok(GivenExport::Read);
        };
        let reasons = unproven_since(
            api.as_ref(),
            &run.stream_arn,
            graph,
            at_ms,
            &run.retry,
            self.stop,
            self.observer.as_ref(),
        )
        .await?;
        if reasons.is_empty() {
            tracing::info!(export = %arn, "The stream holds every change since the configured export was taken.");
            return Ok(GivenExport::Read);
        }
        let why = format!(
            "source.snapshot.export_arn '{arn}' was taken at {at_ms} (unix ms), but the stream \
             of table '{}' no longer proves it holds every change made since: {}",
            run.table,
            reasons.join("; ")
        );
        match run.on_gap {
            OnGap::Fail => Err(StreamRunError::Gap(format!(
                "{why}. A snapshot from that export would miss those changes; nothing was \
                 committed. Remove source.snapshot.export_arn (a new export is taken), or set \
                 on_gap: resnapshot or repair to take a new export in its place"
            ))),
            OnGap::Resnapshot | OnGap::Repair => {
                tracing::warn!("{why}; a new export is taken in its place.");
                Ok(GivenExport::Superseded)
            }
        }
    }
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
