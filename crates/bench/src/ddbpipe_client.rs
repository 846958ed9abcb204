//! The rows of the floor phase (`crate::sink::floor`), read before its meter starts: the
//! engine's scan runner over a `SegmentReader` of the bench table (static keys, us-east-1, the
//! bench endpoint, no read limit, the default retry policy, plain values) into a sink of the
//! floor's that keeps the rows the keyed sink would write, with a `Checkpointer` on a temporary
//! state file. The floor needs the engine's own batches (`KeyedSink::rows` turns them into
//! rows), which the library's sink does not hand out; every measured ddbpipe run goes through
//! the library's build path instead (`crate::ddbpipe_run`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, run_scan};
use ddbpipe_pipeline::sink::Sink;
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_pipeline::state::{StateFile, StateLock};
use ddbpipe_source::api::Render;
use ddbpipe_source::aws::{self, AwsTableApi, ClientSettings};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::config::{Credentials, Secret, SourceConfig};
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::scan::{self, SegmentReader};
use ddbpipe_value::ValueFormat;

use crate::items::TABLE;
use crate::phase::PhaseSettings;

/// The pipeline's name.
pub const PIPELINE: &str = "bench";
/// `batch_size` (the default).
pub const BATCH_SIZE: usize = 1000;
/// `state.flush_interval_ms` (the default).
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(1000);

/// A checkpointer on a state file in a temporary directory, with the file's lock.
pub struct FileState {
    /// The checkpointer.
    pub checkpointer: Checkpointer,
    _lock: StateLock,
    _dir: tempfile::TempDir,
}

/// The region, endpoint and static keys of the bench.
pub fn client_settings(endpoint: &str) -> ClientSettings {
    ClientSettings {
        region: Some("us-east-1".to_string()),
        endpoint_url: Some(
            EndpointUrl::new(endpoint).expect("the bench's emulator endpoint is an http URL"),
        ),
        credentials: Credentials::AccessKey {
            access_key_id: "AKIDBENCH".to_string(),
            secret_access_key: Secret::new("bench-secret"),
            session_token: None,
        },
    }
}

/// The source a config scanning the bench table at the bench endpoint gives.
pub fn source_config(settings: &PhaseSettings) -> SourceConfig {
    let client = client_settings(&settings.endpoint);
    let mut source = SourceConfig::new(TABLE);
    source.region = client.region;
    source.endpoint_url = client.endpoint_url;
    source.credentials = client.credentials;
    source.segments = settings.segments;
    source.max_concurrency = settings.concurrency;
    source.batch_size = BATCH_SIZE;
    source
}

/// A scan checkpointer on a fresh state file (no network I/O).
pub async fn file_state(settings: &PhaseSettings) -> anyhow::Result<FileState> {
    let source = source_config(settings);
    let dir = tempfile::tempdir().context("cannot create the state directory")?;
    let state = StateFile::new(dir.path().join("state.json"));
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
    Ok(FileState {
        checkpointer,
        _lock: lock,
        _dir: dir,
    })
}

/// The client and segment reader of the bench table (no network I/O).
pub async fn reader(settings: &PhaseSettings, format: ValueFormat) -> SegmentReader<AwsTableApi> {
    let client = client_settings(&settings.endpoint);
    let sdk = aws::load_sdk_config(&client).await;
    let api = Arc::new(aws::table_api(&sdk));
    SegmentReader {
        api,
        template: scan::read_template(&SourceConfig::new(TABLE)),
        total_segments: settings.segments,
        max_concurrency: settings.concurrency,
        limiter: Arc::new(ReadLimiter::new(None)),
        retry: RetryPolicy::default(),
        render: Render::items(format),
        observer: Arc::new(NoObserver),
        slots: SourceConfig::new(TABLE).read_concurrency,
    }
}

/// Runs a scan by `reader` into `sink` to its end, as `ddbpipe run` does (batches of
/// `batch_size`: 1000 into jsonl, 5000 into a keyed sink); checks every segment finished and
/// every item read was written; returns the items written.
pub async fn scan_into<S: Sink>(
    reader: SegmentReader<AwsTableApi>,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    expected_segments: u64,
    batch: BatchLimits,
) -> anyhow::Result<u64> {
    // Nothing stops the scan: the handle lives until it ends.
    let (_stop_handle, stop) = Cancel::new();
    let outcome = run_scan(reader, batch, sink, checkpointer, stop, &NoProgress).await?;
    ensure!(outcome.completed, "the scan did not complete: {outcome:?}");
    ensure!(
        outcome.read == outcome.written,
        "read {} items but wrote {}",
        outcome.read,
        outcome.written
    );
    ensure!(
        outcome.segments_done == expected_segments,
        "{} of {} segments done",
        outcome.segments_done,
        expected_segments
    );
    Ok(outcome.written)
}
