//! An export read as a snapshot (rules 5–9 of `export`): wait for the export, read its
//! manifests, then its data files in parallel, handing on pages as a Scan's segments do.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_value::Item;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::io::SyncIoBridge;
use tracing::Instrument;

use super::api::{ExportApi, ExportState, ExportStatus, ObjectStore, remedy};
use super::{
    ExportError, ExportType, FileReading, ManifestFile, ManifestSummary, manifest_files,
    read_data_file,
};
use crate::api::{KeyAttribute, Render};
use crate::capacity::ReadLimiter;
use crate::error::{ApiError, ErrorClass, ReadError};
use crate::events::{PageRead, RecordKind, SegmentsCounted};
use crate::position::{cursor_lines, file_cursor};
use crate::records::{Lines, SegmentCursor};
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};
use crate::scan::{PageOut, PageSource, SegmentRead};
use crate::segments::SegmentRanges;

/// How often `DescribeExport` is asked while an export runs: from `first`, doubling, at most
/// `max` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportPoll {
    /// The first wait.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for ExportPoll {
    fn default() -> Self {
        ExportPoll {
            first: Duration::from_secs(2),
            max: Duration::from_secs(30),
        }
    }
}

/// A completed export, its manifests read.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportFiles {
    /// `manifest-summary.json`.
    pub summary: ManifestSummary,
    /// `manifest-files.json`: file `i` is segment `i` of the snapshot.
    pub files: Vec<ManifestFile>,
    /// `BilledSizeBytes`, when reported.
    pub billed_bytes: Option<u64>,
}

/// What to read and how.
pub struct ExportReader<E, O> {
    /// DynamoDB's export calls.
    pub exports: Arc<E>,
    /// The bucket the export writes to.
    pub store: Arc<O>,
    /// The export (committed in the position before the first wait).
    pub arn: String,
    /// Data files read at once.
    pub max_concurrency: usize,
    /// Full or incremental (its lines are items or changes).
    pub kind: ExportType,
    /// How items become records.
    pub render: Render,
    /// The table's key schema: every item of the export must have these key attributes.
    pub key_schema: Vec<KeyAttribute>,
    /// Records per page handed on.
    pub page_lines: usize,
    /// The one retry policy (each call, and each file read from its start).
    pub retry: RetryPolicy,
    /// Told about every attempt (metrics).
    pub observer: Arc<dyn AttemptObserver>,
    /// How the export is waited for.
    pub poll: ExportPoll,
}

impl<E, O> Clone for ExportReader<E, O> {
    fn clone(&self) -> Self {
        ExportReader {
            exports: Arc::clone(&self.exports),
            store: Arc::clone(&self.store),
            arn: self.arn.clone(),
            max_concurrency: self.max_concurrency,
            kind: self.kind,
            render: self.render.clone(),
            key_schema: self.key_schema.clone(),
            page_lines: self.page_lines,
            retry: self.retry,
            observer: Arc::clone(&self.observer),
            poll: self.poll,
        }
    }
}

/// An export call's or an S3 error's line, with what to do when the code is known.
fn request_error(what: String, attempts: u32, error: ApiError) -> ReadError {
    let error = match remedy(error.code.as_deref()) {
        Some(fix) => ApiError {
            message: format!("{}; {fix}", error.message),
            ..error
        },
        None => error,
    };
    ReadError::Request {
        what,
        attempts,
        error,
    }
}

impl<E: ExportApi, O: ObjectStore> ExportReader<E, O> {
    /// `DescribeExport` of the export, retried.
    pub async fn describe(&self, cancel: &Cancel) -> Result<ExportStatus, ReadError> {
        describe(
            self.exports.as_ref(),
            &self.arn,
            &self.retry,
            self.observer.as_ref(),
            cancel,
        )
        .await
    }

    /// Waits until the export completes (rule 5); a failed export is a definite error naming
    /// it and its failure.
    pub async fn wait(&self, cancel: &Cancel) -> Result<ExportStatus, ReadError> {
        let started = Instant::now();
        let mut delay = self.poll.first;
        loop {
            let status = self.describe(cancel).await?;
            match &status.state {
                ExportState::Completed => {
                    tracing::info!(export = %self.arn, items = status.item_count, "The export is complete.");
                    return Ok(status);
                }
                ExportState::Failed { code, message } => {
                    return Err(ReadError::Export(ExportError::new(
                        &self.arn,
                        format!(
                            "the export FAILED ({}: {}); nothing of it was read. Run again to start a new export",
                            code.as_deref().unwrap_or("no code"),
                            message.as_deref().unwrap_or("no message")
                        ),
                    )));
                }
                ExportState::InProgress => {
                    tracing::info!(
                        export = %self.arn,
                        waited_s = started.elapsed().as_secs(),
                        "The export is IN_PROGRESS; waiting."
                    );
                }
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(ReadError::Cancelled),
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.poll.max);
        }
    }

    /// Reads the manifests of the completed export `status` (rule 1); `kind` is the type the
    /// caller expects.
    pub async fn files(
        &self,
        status: &ExportStatus,
        kind: ExportType,
        cancel: &Cancel,
    ) -> Result<ExportFiles, ReadError> {
        // Rule 12: the manifests' keys are only meaningful in the export's own bucket.
        if let Some(bucket) = &status.bucket
            && bucket != self.store.bucket()
        {
            return Err(ReadError::Export(ExportError::new(
                &self.arn,
                format!(
                    "the export was written to bucket '{bucket}', but source.snapshot.s3_bucket \
                     is '{}': set s3_bucket back to '{bucket}' until this export (or the repair \
                     reading it) is finished, or run `ddbpipe state reset` to start over",
                    self.store.bucket()
                ),
            )));
        }
        let Some(summary_key) = &status.manifest_key else {
            return Err(ReadError::Export(ExportError::new(
                &self.arn,
                "DescribeExport reports no ExportManifest for a completed export",
            )));
        };
        let bytes = self.object(summary_key, cancel).await?;
        let summary = ManifestSummary::parse(summary_key, &bytes)?;
        if summary.export_type != kind {
            return Err(ReadError::Export(ExportError::new(
                &self.arn,
                format!(
                    "it is {} but a {} is needed here",
                    type_name(summary.export_type),
                    type_name(kind)
                ),
            )));
        }
        let bytes = self.object(&summary.manifest_files_key, cancel).await?;
        let files = manifest_files(&summary.manifest_files_key, &bytes)?;
        let listed: u64 = files.iter().map(|f| f.item_count).sum();
        if listed != summary.item_count {
            return Err(ReadError::Export(ExportError::new(
                &summary.manifest_files_key,
                format!(
                    "lists {listed} items but the summary says {}; the export is incomplete, run it again",
                    summary.item_count
                ),
            )));
        }
        Ok(ExportFiles {
            summary,
            files,
            billed_bytes: status.billed_bytes,
        })
    }

    /// A small object (a manifest) whole, retried.
    async fn object(&self, key: &str, cancel: &Cancel) -> Result<Vec<u8>, ReadError> {
        let what = || format!("GetObject of s3://{}/{key}", self.store.bucket());
        self.retry
            .run(
                "get_object",
                what,
                cancel,
                self.observer.as_ref(),
                |_| async {
                    let mut body = self.store.get(key).await?;
                    let mut bytes = Vec::new();
                    body.read_to_end(&mut bytes).await.map_err(|e| {
                        ApiError::transport(format!("reading the object failed: {e}"))
                    })?;
                    Ok(bytes)
                },
            )
            .await
            .map_err(|error| match error {
                // A manifest the export names is gone: the export is beyond use (rule 13).
                ReadError::Request { error, .. } if error.code.as_deref() == Some("NoSuchKey") => {
                    ReadError::Export(ExportError::damaged(
                        key,
                        format!(
                            "is gone from s3://{} (NoSuchKey: deleted, or expired by a \
                             lifecycle rule); the export cannot be read",
                            self.store.bucket()
                        ),
                    ))
                }
                other => with_remedy(other),
            })
    }

    /// Reads every data file of `files` not in `done`, continuing `cursors` (items already
    /// handed on), sending pages to `out` (rules 6–8). Returns when every file is read, `out`
    /// is closed, or a file failed (the others are cancelled).
    pub async fn read_files(
        &self,
        files: &ExportFiles,
        done: &SegmentRanges,
        mut cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        let total = files.files.len() as u32;
        let mut pending = done.missing(total);
        let mut tasks = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, u32> = HashMap::new();
        let mut finished = done.count();
        let at_ms = files.summary.export_time_ms;
        loop {
            while running.len() < self.max_concurrency.max(1) {
                let Some(index) = pending.next() else { break };
                let skip = items_handed_on(index, cursors.remove(&index).as_ref())?;
                let file = files.files[index as usize].clone();
                let reader = self.clone();
                let out = out.clone();
                let cancel = cancel.clone();
                let handle = tasks.spawn(
                    async move {
                        reader
                            .read_file(index, file, skip, at_ms, out, cancel)
                            .await
                    }
                    .in_current_span(),
                );
                running.insert(handle.id(), index);
            }
            let active = running.len() as u64;
            SegmentsCounted {
                pending: u64::from(total).saturating_sub(finished + active),
                active,
                done: finished,
            }
            .emit();
            let joined = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(ReadError::Cancelled),
                joined = tasks.join_next_with_id() => joined,
            };
            let Some(joined) = joined else { return Ok(()) };
            match joined {
                Ok((id, result)) => {
                    running.remove(&id);
                    result?;
                    finished += 1;
                }
                Err(error) => {
                    let index = running.remove(&error.id()).unwrap_or_default();
                    if error.is_panic() {
                        return Err(ReadError::Panicked {
                            segment: index,
                            message: "export file reader panicked".into(),
                        });
                    }
                    return Err(ReadError::Cancelled);
                }
            }
        }
    }

    /// Reads one data file from its start, skipping the `skip` items handed on before;
    /// a transient failure (of the request or of the body) starts it again, skipping what
    /// this read handed on too.
    async fn read_file(
        &self,
        index: u32,
        file: ManifestFile,
        skip: u64,
        at_ms: i64,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        let key = file.data_file_key.clone();
        let handed = Arc::new(std::sync::atomic::AtomicU64::new(skip));
        let retryable = |error: &FileError| match error {
            FileError::Api(error) => {
                matches!(error.class, ErrorClass::Throttle | ErrorClass::Transient)
            }
            FileError::Body(_) => true,
            FileError::Export(_) | FileError::Closed | FileError::Cancelled => false,
        };
        let retrying = |n: u32, error: &FileError, delay: Duration| {
            tracing::debug!(file = %key, attempt = n, delay_ms = delay.as_millis() as u64, error = %error, "Reading an export file failed; reading it again.");
            crate::retry::note_retry("export_file", &format!("{key}: {error}"));
        };
        let result = self
            .retry
            .retry(Duration::MAX, &cancel, retryable, retrying, |_| {
                let handed = Arc::clone(&handed);
                let file = file.clone();
                let out = out.clone();
                let cancel = cancel.clone();
                async move {
                    let body = self
                        .store
                        .get(&file.data_file_key)
                        .await
                        .map_err(FileError::Api)?;
                    let render = self.render.clone();
                    let key_schema = self.key_schema.clone();
                    let kind = self.kind;
                    let page_lines = self.page_lines;
                    let bridge = SyncIoBridge::new(body);
                    tokio::task::spawn_blocking(move || {
                        let reading = FileReading {
                            file: &file,
                            kind,
                            render,
                            key_schema: &key_schema,
                            batch: page_lines,
                            skip: 0,
                        };
                        read_blocking(bridge, reading, index, at_ms, &handed, &out, &cancel)
                    })
                    .await
                    .map_err(|e| FileError::Body(format!("the file reader stopped: {e}")))?
                }
            })
            .await;
        match result {
            Ok(()) => Ok(()),
            Err(crate::retry::GaveUp::Cancelled) => Err(ReadError::Cancelled),
            Err(crate::retry::GaveUp::Failed { error, attempts }) => Err(match error {
                // A data file the manifest names is gone: the export is beyond use (rule 13).
                FileError::Api(error) if error.code.as_deref() == Some("NoSuchKey") => {
                    ReadError::Export(ExportError::damaged(
                        &key,
                        format!(
                            "is gone from s3://{} (NoSuchKey: deleted, or expired by a \
                             lifecycle rule); the export cannot be read whole",
                            self.store.bucket()
                        ),
                    ))
                }
                FileError::Api(error) => request_error(
                    format!("GetObject of s3://{}/{key}", self.store.bucket()),
                    attempts,
                    error,
                ),
                FileError::Body(problem) => ReadError::Export(ExportError::new(
                    &key,
                    format!("reading it failed {attempts} time(s): {problem}"),
                )),
                FileError::Export(error) => ReadError::Export(error),
                FileError::Closed | FileError::Cancelled => ReadError::Cancelled,
            }),
        }
    }
}

/// Reads a file on a blocking thread: once the whole file verified, its items after `handed`
/// are sent as pages, then the file's end (rule 3).
fn read_blocking(
    body: impl Read,
    reading: FileReading<'_>,
    index: u32,
    at_ms: i64,
    handed: &std::sync::atomic::AtomicU64,
    out: &mpsc::Sender<PageOut>,
    cancel: &Cancel,
) -> Result<(), FileError> {
    use std::sync::atomic::Ordering;
    let kind = reading.kind;
    let reading = FileReading {
        skip: handed.load(Ordering::SeqCst),
        ..reading
    };
    let send = |records: Lines, from: u64, cursor: SegmentCursor| -> Result<(), FileError> {
        if cancel.is_cancelled() {
            return Err(FileError::Cancelled);
        }
        PageRead {
            kind: match kind {
                ExportType::Full => RecordKind::Item,
                ExportType::Incremental => RecordKind::Change,
            },
            records: records.len(),
            capacity_units: None,
        }
        .emit();
        out.blocking_send(PageOut {
            segment: index,
            records,
            cursor,
            requested_ms: at_ms,
            lines_from: Some(from),
        })
        .map_err(|_| FileError::Closed)
    };
    let check = || {
        if cancel.is_cancelled() {
            Err(FileError::Cancelled)
        } else {
            Ok(())
        }
    };
    read_data_file::<FileError>(body, &reading, check, |records| {
        let from = handed.load(Ordering::SeqCst);
        let reached = from + records.len() as u64;
        send(records, from, SegmentCursor::Next(file_cursor(reached)))?;
        handed.store(reached, Ordering::SeqCst);
        Ok(())
    })?;
    send(
        Lines::default(),
        handed.load(Ordering::SeqCst),
        SegmentCursor::Done,
    )
}

/// Why reading one file stopped.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error(transparent)]
    Api(ApiError),
    #[error("{0}")]
    Body(String),
    #[error(transparent)]
    Export(ExportError),
    #[error("the consumer stopped")]
    Closed,
    #[error("cancelled")]
    Cancelled,
}

impl From<ExportError> for FileError {
    fn from(error: ExportError) -> Self {
        // A gzip stream cut short by the connection is a body failure, retried.
        if error.problem.starts_with("cannot be read") {
            FileError::Body(error.problem)
        } else {
            FileError::Export(error)
        }
    }
}

/// `DescribeExport` of `arn`, retried, its error saying what to do.
pub async fn describe<E: ExportApi>(
    exports: &E,
    arn: &str,
    retry: &RetryPolicy,
    observer: &dyn AttemptObserver,
    cancel: &Cancel,
) -> Result<ExportStatus, ReadError> {
    let what = || format!("DescribeExport of '{arn}'");
    retry
        .run("describe_export", what, cancel, observer, |_| {
            exports.describe_export(arn)
        })
        .await
        .map_err(with_remedy)
}

/// A request's error with what to do about its code (rule 9).
pub(super) fn with_remedy(error: ReadError) -> ReadError {
    match error {
        ReadError::Request {
            what,
            attempts,
            error,
        } => request_error(what, attempts, error),
        other => other,
    }
}

fn type_name(kind: ExportType) -> &'static str {
    match kind {
        ExportType::Full => "FULL_EXPORT",
        ExportType::Incremental => "INCREMENTAL_EXPORT",
    }
}

/// The items of file `index` handed on before, from its cursor (none: its start).
fn items_handed_on(index: u32, cursor: Option<&Item>) -> Result<u64, ReadError> {
    cursor.map_or(Ok(0), |cursor| {
        cursor_lines(cursor)
            .map_err(|problem| ReadError::Internal(format!("file {index}'s cursor: {problem}")))
    })
}

/// A completed export's data files as segments read one at a time (file `i` segment `i`, its
/// cursor the items handed on): the units a shared mirror leases (docs/coordination.md
/// §11.12).
pub struct ExportSegments<E, O> {
    /// The reader of the export.
    pub reader: ExportReader<E, O>,
    /// Its manifests.
    pub files: Arc<ExportFiles>,
    /// Counts no units (an export consumes no read capacity).
    pub limiter: Arc<ReadLimiter>,
}

impl<E: ExportApi, O: ObjectStore> ExportSegments<E, O> {
    /// Waits for the export `reader` reads to complete and reads its manifests.
    pub async fn of(reader: ExportReader<E, O>, cancel: &Cancel) -> Result<Self, ReadError> {
        let status = reader.wait(cancel).await?;
        let files = reader.files(&status, reader.kind, cancel).await?;
        Ok(ExportSegments {
            reader,
            files: Arc::new(files),
            limiter: Arc::new(ReadLimiter::new(None)),
        })
    }
}

impl<E: ExportApi, O: ObjectStore> SegmentRead for ExportSegments<E, O> {
    /// Its data files, as the manifest lists them.
    fn total(&self) -> u32 {
        self.files.files.len() as u32
    }

    fn max_concurrency(&self) -> usize {
        self.reader.max_concurrency.max(1)
    }

    fn limiter(&self) -> Arc<ReadLimiter> {
        Arc::clone(&self.limiter)
    }

    fn read_one(
        &self,
        segment: u32,
        start: Option<Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> futures_util::future::BoxFuture<'static, Result<(), ReadError>> {
        let reader = self.reader.clone();
        let files = Arc::clone(&self.files);
        Box::pin(async move {
            let skip = items_handed_on(segment, start.as_ref())?;
            let at_ms = files.summary.export_time_ms;
            match files.files.get(segment as usize) {
                Some(file) => {
                    reader
                        .read_file(segment, file.clone(), skip, at_ms, out, cancel)
                        .await
                }
                None => Err(ReadError::Export(ExportError::new(
                    &files.summary.manifest_files_key,
                    format!(
                        "a worker holds file {segment} but the export has {} file(s): the \
                         lease table belongs to another export; run `ddbpipe state reset` once \
                         no worker runs",
                        files.files.len()
                    ),
                ))),
            }
        })
    }
}

/// A full export read as a snapshot's pages (the runners' [`PageSource`]): wait for it, read
/// its manifests, then its files.
pub struct ExportSnapshot<E, O> {
    /// The reader of the export.
    pub reader: ExportReader<E, O>,
    /// Counts no units (an export consumes no read capacity); the runners report it.
    pub limiter: Arc<ReadLimiter>,
}

impl<E: ExportApi, O: ObjectStore> PageSource for ExportSnapshot<E, O> {
    fn in_flight(&self) -> usize {
        self.reader.max_concurrency.max(1)
    }

    fn limiter(&self) -> Arc<ReadLimiter> {
        Arc::clone(&self.limiter)
    }

    async fn read(
        self,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        let status = self.reader.wait(&cancel).await?;
        let files = self
            .reader
            .files(&status, self.reader.kind, &cancel)
            .await?;
        if let Some(beyond) = done
            .ranges()
            .last()
            .map(|range| range[1])
            .into_iter()
            .chain(cursors.keys().copied())
            .find(|index| *index as usize >= files.files.len())
        {
            return Err(ReadError::Export(ExportError::new(
                &files.summary.manifest_files_key,
                format!(
                    "the position has progress for file {beyond} but the export has {} file(s): \
                     the position belongs to another export; run `ddbpipe state reset`",
                    files.files.len()
                ),
            )));
        }
        tracing::info!(
            export = %self.reader.arn,
            files = files.files.len(),
            items = files.summary.item_count,
            export_time_ms = files.summary.export_time_ms,
            "Reading the export's files."
        );
        self.reader
            .read_files(&files, &done, cursors, out, cancel)
            .await
    }
}
