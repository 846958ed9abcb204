//! The export phase: ddbpipe's export read path, wired as `ddbpipe run` wires a scan with
//! `source.snapshot.engine: export` (crates/cli/src/run/scan.rs and crates/cli/src/export.rs),
//! over the bench export written beforehand ([`crate::export_files`]).
//!
//! [`LocalExports`] (the `ExportApi`: `DescribeExport` answers `COMPLETED` with the summary's
//! key) and [`LocalStore`] (the `ObjectStore`: `GetObject` streams a file of the export's
//! directory through `tokio::fs::File`) → `ExportEngine::typed_reader` (`max_concurrency` =
//! `--concurrency`, 1000 lines per page, plain values, the default retry policy) →
//! `run_scan` with batches of 1000 → a `JsonlSink` on `/dev/null` (no fsync) and a
//! `Checkpointer` (kind `export`, the ARN committed before the read, as the CLI does) flushing
//! a temporary state file every second: the sink side of the ddbpipe scan phase, unchanged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, run_scan};
use ddbpipe_pipeline::sinks::jsonl::{
    Compression, JsonlSettings, JsonlSink, JsonlTarget, WriteMode,
};
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_pipeline::state::{StateFile, StateLock};
use ddbpipe_source::api::{KeyAttribute, KeyType, Render};
use ddbpipe_source::config::{SnapshotEngine, SourceConfig};
use ddbpipe_source::error::ApiError;
use ddbpipe_source::export::api::{
    ExportApi, ExportState, ExportStatus, ObjectBody, ObjectStore, Recovery, StartExport,
};
use ddbpipe_source::export::{ExportEngine, ExportPoll, ExportSnapshot};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::{Cancel, CancelHandle, NoObserver, RetryPolicy};
use ddbpipe_value::ValueFormat;

use crate::export_files::{self, BUCKET, EXPORT_TIME_MS, PREFIX};
use crate::items::TABLE;
use crate::phase::PhaseSettings;

const PIPELINE: &str = "bench";
const BATCH_SIZE: usize = 1000;
/// Records per page the export reader hands on (what the CLI uses with batches of 1000).
pub const PAGE_LINES: usize = 1000;
const FLUSH_INTERVAL: Duration = Duration::from_millis(1000);
/// Bytes a data file's body is read from disk at once. The reader asks its body for 8 KiB at a
/// time; a `tokio::fs::File` answers each read on a blocking thread of its own, which an S3
/// body (chunks already received) does not. Reading the file 256 KiB at a time keeps that hop
/// out of the figures, and the body streamed: at most this much of a file is in memory.
pub const READ_CHUNK: usize = 256 * 1024;

/// `GetObject` over the export's directory: key `k` is the file `<root>/k`.
pub struct LocalStore {
    root: PathBuf,
}

impl ObjectStore for LocalStore {
    fn bucket(&self) -> &str {
        BUCKET
    }

    async fn get(&self, key: &str) -> Result<ObjectBody, ApiError> {
        let path = self.root.join(key);
        match tokio::fs::File::open(&path).await {
            Ok(file) => Ok(Box::pin(tokio::io::BufReader::with_capacity(
                READ_CHUNK, file,
            ))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(ApiError::from_code(
                Some("NoSuchKey".into()),
                format!("{}: {error}", path.display()),
            )),
            Err(error) => Err(ApiError::transport(format!("{}: {error}", path.display()))),
        }
    }
}

/// `DescribeExport` of the bench export: completed, its manifest the summary's key.
pub struct LocalExports {
    status: ExportStatus,
}

impl ExportApi for LocalExports {
    async fn recovery(&self, _table_name: &str) -> Result<Recovery, ApiError> {
        Ok(Recovery {
            enabled: true,
            earliest_ms: None,
            latest_ms: None,
        })
    }

    async fn start_export(&self, _request: &StartExport) -> Result<ExportStatus, ApiError> {
        Err(ApiError::fatal(
            "the bench reads the export written before the phase; it starts none",
        ))
    }

    async fn describe_export(&self, arn: &str) -> Result<ExportStatus, ApiError> {
        if arn == self.status.arn {
            Ok(self.status.clone())
        } else {
            Err(ApiError::from_code(
                Some("ExportNotFoundException".into()),
                format!("no export {arn}"),
            ))
        }
    }
}

impl LocalExports {
    /// The completed export whose files are under `root`; its counts from its summary.
    fn read(root: &Path) -> anyhow::Result<Self> {
        let key = export_files::summary_key();
        let path = root.join(&key);
        let text =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let summary: serde_json::Value = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        Ok(LocalExports {
            status: ExportStatus {
                arn: export_files::export_arn(),
                state: ExportState::Completed,
                table_arn: Some(export_files::table_arn()),
                incremental: false,
                export_time_ms: Some(EXPORT_TIME_MS),
                bucket: Some(BUCKET.to_string()),
                manifest_key: Some(key),
                item_count: summary["itemCount"].as_u64(),
                billed_bytes: summary["billedSizeBytes"].as_u64(),
                started_ms: Some(EXPORT_TIME_MS),
            },
        })
    }
}

/// Everything built before the meter starts.
pub struct Prepared {
    reader: ExportSnapshot<LocalExports, LocalStore>,
    sink: JsonlSink,
    checkpointer: Checkpointer,
    expected_files: u64,
    _stop: CancelHandle,
    stop: Cancel,
    _lock: StateLock,
    _state_dir: tempfile::TempDir,
}

/// Builds the engine, reader, sink and checkpointer, and commits the export's ARN (no read of
/// the export's objects).
pub async fn prepare(settings: &PhaseSettings) -> anyhow::Result<Prepared> {
    let root = settings
        .export_dir
        .clone()
        .context("the export phase needs --export-dir")?;
    let arn = export_files::export_arn();
    let mut source = SourceConfig::new(TABLE);
    source.max_concurrency = settings.concurrency;
    source.batch_size = BATCH_SIZE;
    source.snapshot.engine = SnapshotEngine::Export;
    source.snapshot.s3_bucket = Some(BUCKET.to_string());
    source.snapshot.s3_prefix = Some(PREFIX.to_string());
    source.snapshot.export_arn = Some(arn.clone());

    let state_dir = tempfile::tempdir().context("cannot create the state directory")?;
    let state = StateFile::new(state_dir.path().join("state.json"));
    let lock = state.lock(PIPELINE)?;
    let mut checkpointer = Checkpointer::open_scan(
        state,
        PIPELINE,
        Identity::of(&source, &Location::default(), None),
        ScanKind::Export,
        source.segments,
        FLUSH_INTERVAL,
    )
    .await?;
    // What `export::begin_scan` does before the read: the ARN is in the position.
    checkpointer.set_export(&arn).await?;
    let sink = JsonlSink::open(
        JsonlSettings {
            target: JsonlTarget::File("/dev/null".into()),
            rotate_bytes: None,
            fsync: false,
            write: WriteMode::Append,
            compression: Compression::None,
        },
        "bench",
    )?;

    let engine = ExportEngine {
        exports: Arc::new(LocalExports::read(&root)?),
        store: Arc::new(LocalStore { root }),
        prefix: PREFIX.to_string(),
        bucket_owner: None,
        given_arn: Some(arn.clone()),
        max_concurrency: settings.concurrency,
        page_lines: PAGE_LINES,
        retry: RetryPolicy::default(),
        observer: Arc::new(NoObserver),
        poll: ExportPoll::default(),
    };
    let key_schema = vec![
        KeyAttribute {
            name: "pk".into(),
            key_type: KeyType::S,
        },
        KeyAttribute {
            name: "sk".into(),
            key_type: KeyType::N,
        },
    ];
    let reader = engine.typed_reader(&arn, Render::items(ValueFormat::Plain), key_schema);
    let (stop_handle, stop) = Cancel::new();
    Ok(Prepared {
        reader,
        sink,
        checkpointer,
        expected_files: u64::from(settings.segments),
        _stop: stop_handle,
        stop,
        _lock: lock,
        _state_dir: state_dir,
    })
}

impl Prepared {
    /// Reads the export to its end (`DescribeExport`, the manifests, every data file); returns
    /// the items written.
    pub async fn read(mut self) -> anyhow::Result<u64> {
        let outcome = run_scan(
            self.reader,
            BatchLimits::records(BATCH_SIZE),
            &mut self.sink,
            &mut self.checkpointer,
            self.stop,
            &NoProgress,
        )
        .await?;
        ensure!(
            outcome.completed,
            "the export read did not complete: {outcome:?}"
        );
        ensure!(
            outcome.read == outcome.written,
            "read {} items but wrote {}",
            outcome.read,
            outcome.written
        );
        ensure!(
            outcome.segments_done == self.expected_files,
            "{} of {} data files done",
            outcome.segments_done,
            self.expected_files
        );
        Ok(outcome.written)
    }
}
