//! The export engine as the runners see it: [`SnapshotExports`] starts (or takes) a full export
//! for a snapshot and builds its reader, type-erased so a run holds it whatever the clients.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ddbpipe_value::Item;
use tokio::sync::mpsc;

use super::api::{ExportApi, ExportKind, ExportState, ObjectStore, Recovery};
use super::reader::{describe, with_remedy};
use super::{
    ExportPoll, ExportReader, ExportSegments, ExportSnapshot, ExportTarget, ExportType,
    client_token, given, start,
};
use crate::api::{KeyAttribute, Render, SnapshotShape};
use crate::capacity::ReadLimiter;
use crate::error::ReadError;
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};
use crate::scan::{PageOut, PageSource, SegmentRead};
use crate::segments::SegmentRanges;

/// A boxed future of the engine's calls.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, ReadError>> + Send + 'a>>;

/// A [`PageSource`] behind a box: what [`SnapshotExports::reader`] returns.
pub trait DynPages: Send {
    /// [`PageSource::in_flight`].
    fn in_flight(&self) -> usize;
    /// [`PageSource::limiter`].
    fn limiter(&self) -> Arc<ReadLimiter>;
    /// [`PageSource::read`].
    fn read_boxed(
        self: Box<Self>,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Pending<'static, ()>;
}

impl<P: PageSource> DynPages for P {
    fn in_flight(&self) -> usize {
        PageSource::in_flight(self)
    }
    fn limiter(&self) -> Arc<ReadLimiter> {
        PageSource::limiter(self)
    }
    fn read_boxed(
        self: Box<Self>,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Pending<'static, ()> {
        Box::pin((*self).read(done, cursors, out, cancel))
    }
}

/// Boxed pages are pages.
pub struct BoxedPages(pub Box<dyn DynPages>);

impl PageSource for BoxedPages {
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
    fn limiter(&self) -> Arc<ReadLimiter> {
        self.0.limiter()
    }
    async fn read(
        self,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        self.0.read_boxed(done, cursors, out, cancel).await
    }
}

/// Whether a new snapshot may read the configured `source.snapshot.export_arn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenExport {
    /// Read it, when one is configured.
    Read,
    /// Pass it by and export afresh: the stream no longer proves it holds every change made
    /// since it was taken (`streams::since`, docs/scan.md §2.10).
    Superseded,
}

/// What a run's snapshots need of exports (`source.snapshot.engine: export`).
pub trait SnapshotExports: Send + Sync {
    /// The configured `export_arn` and its `ExportTime` (unix ms; its start when DynamoDB
    /// reports no export time), from `DescribeExport`; `None` when none is configured.
    fn given_export<'a>(&'a self, cancel: &'a Cancel) -> Pending<'a, Option<(String, i64)>>;

    /// The full export a snapshot of `table_arn` reads: `stored` (the export the position
    /// names, from an earlier run) unless it FAILED, else the configured `export_arn`
    /// (checked) unless `given` says it is superseded, else a new one whose client token is made of `unique` (what makes this
    /// snapshot unique), the target and the failed export. The caller commits the ARN before
    /// reading, when it differs from `stored`.
    fn begin<'a>(
        &'a self,
        stored: Option<&'a str>,
        table_arn: &'a str,
        unique: &'a str,
        given: GivenExport,
        cancel: &'a Cancel,
    ) -> Pending<'a, String>;

    /// The reader of export `arn`, writing its items as snapshot envelopes of `shape`'s
    /// table (whose key schema every item must match) and format.
    fn reader(&self, arn: &str, shape: Arc<SnapshotShape>) -> BoxedPages;

    /// Export `arn`, waited for until it completes and its manifests read, as segments read
    /// one at a time (file `i` segment `i`) writing its items as snapshot envelopes of
    /// `shape`'s table: the units a shared mirror leases (docs/coordination.md §11.12).
    fn segments<'a>(
        &'a self,
        arn: &'a str,
        shape: Arc<SnapshotShape>,
        cancel: &'a Cancel,
    ) -> Pending<'a, Arc<dyn SegmentRead>>;

    /// Incremental export `arn` as [`segments`](SnapshotExports::segments) are read, writing
    /// its changes as change envelopes of `shape`'s table: the units of a repair across
    /// workers (docs/coordination.md §11.12 rule 9).
    fn incremental_segments<'a>(
        &'a self,
        arn: &'a str,
        shape: Arc<SnapshotShape>,
        cancel: &'a Cancel,
    ) -> Pending<'a, Arc<dyn SegmentRead>>;

    /// `DescribeContinuousBackups` of `table_name`: whether point-in-time recovery is on and
    /// the window it covers (a repair needs its start inside it).
    fn recovery<'a>(&'a self, table_name: &'a str, cancel: &'a Cancel) -> Pending<'a, Recovery>;

    /// The incremental export of `[from_ms, to_ms)` a repair window reads: `stored` (the
    /// export its record names) unless it FAILED, else a new one whose client token is made of
    /// `unique`, the target, the window and the failed export. The caller commits the ARN
    /// before reading, when it differs from `stored`.
    fn begin_incremental<'a>(
        &'a self,
        stored: Option<&'a str>,
        table_arn: &'a str,
        window: (i64, i64),
        unique: &'a str,
        cancel: &'a Cancel,
    ) -> Pending<'a, String>;

    /// The reader of incremental export `arn`, writing its changes as change envelopes of
    /// `shape`'s table and format.
    fn incremental_reader(&self, arn: &str, shape: Arc<SnapshotShape>) -> BoxedPages;

    /// A new export in place of `damaged`, whose files do not verify or are gone (rule 13 of
    /// `export`): full, or of `window` for a repair; its client token is the one `begin` or
    /// `begin_incremental` would make after `damaged` failed. Refused when `damaged` is the
    /// configured `export_arn`, naming what to do. The caller commits the ARN.
    fn abandon<'a>(
        &'a self,
        damaged: &'a str,
        table_arn: &'a str,
        window: Option<(i64, i64)>,
        unique: &'a str,
        cancel: &'a Cancel,
    ) -> Pending<'a, String>;
}

/// The export engine over an [`ExportApi`] and an [`ObjectStore`].
pub struct ExportEngine<E, O> {
    /// DynamoDB's export calls.
    pub exports: Arc<E>,
    /// The export bucket.
    pub store: Arc<O>,
    /// `S3Prefix`.
    pub prefix: String,
    /// `S3BucketOwner`.
    pub bucket_owner: Option<String>,
    /// `snapshot.export_arn`: read this export instead of starting one.
    pub given_arn: Option<String>,
    /// Data files read at once.
    pub max_concurrency: usize,
    /// Records per page.
    pub page_lines: usize,
    /// The one retry policy.
    pub retry: RetryPolicy,
    /// Told about every attempt.
    pub observer: Arc<dyn AttemptObserver>,
    /// How exports are waited for.
    pub poll: ExportPoll,
}

impl<E: ExportApi, O: ObjectStore> ExportEngine<E, O> {
    /// Where exports of `table_arn` go.
    pub fn target(&self, table_arn: &str) -> ExportTarget {
        ExportTarget {
            table_arn: table_arn.to_string(),
            bucket: self.store.bucket().to_string(),
            prefix: self.prefix.clone(),
            bucket_owner: self.bucket_owner.clone(),
        }
    }

    /// The typed reader of full export `arn` of a table with the key `key_schema`.
    pub fn typed_reader(
        &self,
        arn: &str,
        render: Render,
        key_schema: Vec<KeyAttribute>,
    ) -> ExportSnapshot<E, O> {
        self.typed_reader_of(arn, ExportType::Full, render, key_schema)
    }

    /// The typed reader of export `arn` of `kind` of a table with the key `key_schema`.
    pub fn typed_reader_of(
        &self,
        arn: &str,
        kind: ExportType,
        render: Render,
        key_schema: Vec<KeyAttribute>,
    ) -> ExportSnapshot<E, O> {
        ExportSnapshot {
            reader: ExportReader {
                exports: Arc::clone(&self.exports),
                store: Arc::clone(&self.store),
                arn: arn.to_string(),
                max_concurrency: self.max_concurrency,
                kind,
                render,
                key_schema,
                page_lines: self.page_lines,
                retry: self.retry,
                observer: Arc::clone(&self.observer),
                poll: self.poll,
            },
            limiter: Arc::new(ReadLimiter::new(None)),
        }
    }
}

impl<E: ExportApi, O: ObjectStore> SnapshotExports for ExportEngine<E, O> {
    fn given_export<'a>(&'a self, cancel: &'a Cancel) -> Pending<'a, Option<(String, i64)>> {
        Box::pin(async move {
            let Some(arn) = &self.given_arn else {
                return Ok(None);
            };
            let status = describe(
                self.exports.as_ref(),
                arn,
                &self.retry,
                self.observer.as_ref(),
                cancel,
            )
            .await?;
            Ok(status
                .export_time_ms
                .or(status.started_ms)
                .map(|at| (arn.clone(), at)))
        })
    }

    fn begin<'a>(
        &'a self,
        stored: Option<&'a str>,
        table_arn: &'a str,
        unique: &'a str,
        use_given: GivenExport,
        cancel: &'a Cancel,
    ) -> Pending<'a, String> {
        Box::pin(async move {
            let failed = match self.resumable(stored, cancel).await? {
                Resumable::Resume(arn) => return Ok(arn),
                Resumable::Failed(arn) => arn,
                Resumable::None => "",
            };
            if let Some(arn) = &self.given_arn
                && use_given == GivenExport::Read
            {
                return Ok(
                    given(self.exports.as_ref(), arn, table_arn, &self.retry, cancel)
                        .await?
                        .arn,
                );
            }
            self.start_full(table_arn, unique, failed, cancel).await
        })
    }

    fn reader(&self, arn: &str, shape: Arc<SnapshotShape>) -> BoxedPages {
        let key_schema = shape.key_schema.clone();
        BoxedPages(Box::new(self.typed_reader(
            arn,
            Render::Snapshots(shape),
            key_schema,
        )))
    }

    fn segments<'a>(
        &'a self,
        arn: &'a str,
        shape: Arc<SnapshotShape>,
        cancel: &'a Cancel,
    ) -> Pending<'a, Arc<dyn SegmentRead>> {
        self.segments_of(arn, ExportType::Full, shape, cancel)
    }

    fn incremental_segments<'a>(
        &'a self,
        arn: &'a str,
        shape: Arc<SnapshotShape>,
        cancel: &'a Cancel,
    ) -> Pending<'a, Arc<dyn SegmentRead>> {
        self.segments_of(arn, ExportType::Incremental, shape, cancel)
    }

    fn recovery<'a>(&'a self, table_name: &'a str, cancel: &'a Cancel) -> Pending<'a, Recovery> {
        Box::pin(async move {
            self.retry
                .run(
                    "describe_continuous_backups",
                    || format!("DescribeContinuousBackups of '{table_name}'"),
                    cancel,
                    self.observer.as_ref(),
                    |_| self.exports.recovery(table_name),
                )
                .await
                .map_err(with_remedy)
        })
    }

    fn begin_incremental<'a>(
        &'a self,
        stored: Option<&'a str>,
        table_arn: &'a str,
        (from_ms, to_ms): (i64, i64),
        unique: &'a str,
        cancel: &'a Cancel,
    ) -> Pending<'a, String> {
        Box::pin(async move {
            let failed = match self.resumable(stored, cancel).await? {
                Resumable::Resume(arn) => return Ok(arn),
                Resumable::Failed(arn) => arn,
                Resumable::None => "",
            };
            self.start_incremental(table_arn, (from_ms, to_ms), unique, failed, cancel)
                .await
        })
    }

    fn abandon<'a>(
        &'a self,
        damaged: &'a str,
        table_arn: &'a str,
        window: Option<(i64, i64)>,
        unique: &'a str,
        cancel: &'a Cancel,
    ) -> Pending<'a, String> {
        Box::pin(async move {
            if self.given_arn.as_deref() == Some(damaged) {
                return Err(ReadError::Export(super::ExportError::new(
                    damaged,
                    "the configured export's files are damaged or gone, and ddbpipe does not \
                     replace an export it was given: remove source.snapshot.export_arn (a new \
                     export is taken) or restore its files",
                )));
            }
            tracing::warn!(
                export = %damaged,
                "The export's files are damaged or gone; abandoning it and requesting a new export (once in this run)."
            );
            match window {
                None => self.start_full(table_arn, unique, damaged, cancel).await,
                Some(window) => {
                    self.start_incremental(table_arn, window, unique, damaged, cancel)
                        .await
                }
            }
        })
    }

    fn incremental_reader(&self, arn: &str, shape: Arc<SnapshotShape>) -> BoxedPages {
        let key_schema = shape.key_schema.clone();
        BoxedPages(Box::new(self.typed_reader_of(
            arn,
            ExportType::Incremental,
            Render::Snapshots(shape),
            key_schema,
        )))
    }
}

impl<E: ExportApi, O: ObjectStore> ExportEngine<E, O> {
    /// Export `arn` of `kind`, waited for and its manifests read, as segments (file `i`
    /// segment `i`).
    fn segments_of<'a>(
        &'a self,
        arn: &'a str,
        kind: ExportType,
        shape: Arc<SnapshotShape>,
        cancel: &'a Cancel,
    ) -> Pending<'a, Arc<dyn SegmentRead>> {
        Box::pin(async move {
            let key_schema = shape.key_schema.clone();
            let reader = self
                .typed_reader_of(arn, kind, Render::Snapshots(shape), key_schema)
                .reader;
            let segments = ExportSegments::of(reader, cancel).await?;
            Ok(Arc::new(segments) as Arc<dyn SegmentRead>)
        })
    }

    /// A new full export of `table_arn`, its token made of the target, `unique` and `after`
    /// (the failed or damaged export it replaces, or nothing).
    async fn start_full(
        &self,
        table_arn: &str,
        unique: &str,
        after: &str,
        cancel: &Cancel,
    ) -> Result<String, ReadError> {
        let kind = ExportKind::Full { at_ms: None };
        self.start_new(table_arn, kind, &[unique, after], cancel)
            .await
    }

    /// A new incremental export of `[from_ms, to_ms)`, its token made as `start_full`'s with
    /// the window before `after`.
    async fn start_incremental(
        &self,
        table_arn: &str,
        (from_ms, to_ms): (i64, i64),
        unique: &str,
        after: &str,
        cancel: &Cancel,
    ) -> Result<String, ReadError> {
        let (from, to) = (from_ms.to_string(), to_ms.to_string());
        let kind = ExportKind::Incremental { from_ms, to_ms };
        self.start_new(table_arn, kind, &[unique, &from, &to, after], cancel)
            .await
    }

    /// A new export of `kind`, its client token made of the target and `parts`.
    async fn start_new(
        &self,
        table_arn: &str,
        kind: ExportKind,
        parts: &[&str],
        cancel: &Cancel,
    ) -> Result<String, ReadError> {
        let target = self.target(table_arn);
        let mut token_parts = vec![
            target.table_arn.as_str(),
            target.bucket.as_str(),
            target.prefix.as_str(),
        ];
        token_parts.extend_from_slice(parts);
        let token = client_token(&token_parts);
        let status = start(
            self.exports.as_ref(),
            &target,
            kind,
            &token,
            &self.retry,
            cancel,
        )
        .await?;
        Ok(status.arn)
    }
}

/// What an export named by the position is worth.
enum Resumable<'a> {
    /// Nothing is stored.
    None,
    /// It is running or done: read it.
    Resume(String),
    /// It FAILED: start another, whose token differs.
    Failed(&'a str),
}

impl<E: ExportApi, O: ObjectStore> ExportEngine<E, O> {
    /// Whether the export `stored` (from an earlier run) can be read.
    async fn resumable<'a>(
        &self,
        stored: Option<&'a str>,
        cancel: &Cancel,
    ) -> Result<Resumable<'a>, ReadError> {
        let Some(arn) = stored else {
            return Ok(Resumable::None);
        };
        let status = describe(
            self.exports.as_ref(),
            arn,
            &self.retry,
            self.observer.as_ref(),
            cancel,
        )
        .await?;
        if matches!(status.state, ExportState::Failed { .. }) {
            tracing::warn!(export = %arn, "The last run's export FAILED; starting another.");
            return Ok(Resumable::Failed(arn));
        }
        tracing::info!(export = %arn, "Resuming the export of the last run.");
        Ok(Resumable::Resume(arn.to_string()))
    }
}
