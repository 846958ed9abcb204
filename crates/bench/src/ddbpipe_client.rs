//! The ddbpipe client: the engine wired as `ddbpipe run` wires a scan
//! (crates/cli/src/wiring.rs `run`), through the same public APIs.
//!
//! `AwsTableApi` from `load_sdk_config` + `table_api` (static keys, us-east-1, the bench
//! endpoint) → `SegmentReader` (no read limit, the default retry policy, plain values) →
//! `run_scan` with batches of 1000 → a `JsonlSink` on `/dev/null` (no fsync) and a
//! `Checkpointer` flushing a temporary state file every second. What `ddbpipe run` does besides
//! is left out: `DescribeTable` (one request before the scan), the progress bar and the log.

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
use ddbpipe_source::api::Render;
use ddbpipe_source::aws::{self, AwsTableApi, ClientSettings};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::config::{Credentials, Secret, SourceConfig};
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::{Cancel, CancelHandle, NoObserver, RetryPolicy};
use ddbpipe_source::scan::{self, SegmentReader};
use ddbpipe_value::ValueFormat;

use crate::items::TABLE;
use crate::phase::PhaseSettings;

const PIPELINE: &str = "bench";
const BATCH_SIZE: usize = 1000;
const FLUSH_INTERVAL: Duration = Duration::from_millis(1000);

/// Everything built before the meter starts.
pub struct Prepared {
    reader: SegmentReader<AwsTableApi>,
    sink: JsonlSink,
    checkpointer: Checkpointer,
    expected_segments: u64,
    _stop: CancelHandle,
    stop: Cancel,
    _lock: StateLock,
    _state_dir: tempfile::TempDir,
}

/// The region, endpoint and static keys of the bench.
pub fn client_settings(endpoint: &str) -> ClientSettings {
    ClientSettings {
        region: Some("us-east-1".to_string()),
        endpoint_url: Some(endpoint.to_string()),
        credentials: Credentials::AccessKey {
            access_key_id: "AKIDBENCH".to_string(),
            secret_access_key: Secret::new("bench-secret"),
            session_token: None,
        },
    }
}

/// Builds the client, reader, sink and checkpointer (no network I/O).
pub async fn prepare(settings: &PhaseSettings) -> anyhow::Result<Prepared> {
    let client = client_settings(&settings.endpoint);
    let mut source = SourceConfig::new(TABLE);
    source.region = client.region.clone();
    source.endpoint_url = client.endpoint_url.clone();
    source.credentials = client.credentials.clone();
    source.segments = settings.segments;
    source.max_concurrency = settings.concurrency;
    source.batch_size = BATCH_SIZE;

    let state_dir = tempfile::tempdir().context("cannot create the state directory")?;
    let state = StateFile::new(state_dir.path().join("state.json"));
    let lock = state.lock(PIPELINE)?;
    let checkpointer = Checkpointer::open_scan(
        state,
        PIPELINE,
        Identity::of(&source, &Location::default(), None),
        ScanKind::Scan,
        settings.segments,
        FLUSH_INTERVAL,
    )
    .await?;
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

    let sdk = aws::load_sdk_config(&client).await;
    let api = Arc::new(aws::table_api(&sdk));
    let format = ValueFormat::Plain;
    let reader = SegmentReader {
        api,
        template: scan::read_template(&SourceConfig::new(TABLE)),
        total_segments: settings.segments,
        max_concurrency: settings.concurrency,
        limiter: Arc::new(ReadLimiter::new(None)),
        retry: RetryPolicy::default(),
        render: Render::Items(format),
        observer: Arc::new(NoObserver),
    };
    let (stop_handle, stop) = Cancel::new();
    Ok(Prepared {
        reader,
        sink,
        checkpointer,
        expected_segments: u64::from(settings.segments),
        _stop: stop_handle,
        stop,
        _lock: lock,
        _state_dir: state_dir,
    })
}

impl Prepared {
    /// Runs the scan to its end; returns the items written.
    pub async fn scan(mut self) -> anyhow::Result<u64> {
        let outcome = run_scan(
            self.reader,
            BATCH_SIZE,
            &mut self.sink,
            &mut self.checkpointer,
            self.stop,
            &NoProgress,
        )
        .await?;
        ensure!(outcome.completed, "the scan did not complete: {outcome:?}");
        ensure!(
            outcome.read == outcome.written,
            "read {} items but wrote {}",
            outcome.read,
            outcome.written
        );
        ensure!(
            outcome.segments_done == self.expected_segments,
            "{} of {} segments done",
            outcome.segments_done,
            self.expected_segments
        );
        Ok(outcome.written)
    }
}
