//! The ddbpipe streams client: the engine wired as `ddbpipe run` wires `mode: streams`
//! (crates/cli/src/run/streams.rs `run`), through the same public APIs.
//!
//! `AwsStreamsApi` from `load_sdk_config` + `streams_api` (static keys, us-east-1, the bench
//! endpoint) → `run_streams` with a [`StreamRun`] as a config with `stream_arn` set would give
//! (`trim_horizon`, `on_gap: fail`, the default retry policy, plain values, `Limit` 1000, a
//! 200 ms poll, `shard_concurrency` = the bench's concurrency, `idle_termination_secs: 1`,
//! no `max_messages`, batches of 1000) → a `JsonlSink` on `/dev/null` (no fsync) and a
//! `Checkpointer::open_streams` on a temporary state file, flushed every second.
//!
//! The bench stream is `DISABLED` with closed shards, so the run is meant to end "stream
//! disabled and fully drained" right after the last shard's last page. It may end on the idle
//! second instead, every record written and every shard finished all the same: the engine
//! spaces its `DescribeStream` calls 200 ms apart inside its loop, and each drained shard asks
//! for its children, so shards draining together hold the loop for 200 ms each. Either end is
//! accepted and reported; any other fails the phase. What `ddbpipe run` does besides is left
//! out: the progress bar and the log.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::NoProgress;
use ddbpipe_pipeline::sink::Sink;
use ddbpipe_pipeline::sinks::jsonl::{
    Compression, JsonlSettings, JsonlSink, JsonlTarget, WriteMode,
};
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_pipeline::state::{StateFile, StateLock};
use ddbpipe_pipeline::streams::{StreamRun, run_streams};
use ddbpipe_source::aws::{self, AwsStreamsApi};
use ddbpipe_source::config::{Mode, OnGap, SourceConfig, StartPosition};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::StreamKind;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::streams::engine::{EndReason, RunBounds};
use ddbpipe_value::ValueFormat;

use crate::ddbpipe_client::client_settings;
use crate::items::TABLE;
use crate::phase::PhaseSettings;
use crate::records::{PAGE_RECORDS, STREAM_ARN};

/// The pipeline's name.
pub const PIPELINE: &str = "bench-streams";
const BATCH_SIZE: usize = 1000;
const FLUSH_INTERVAL: Duration = Duration::from_millis(1000);
/// `poll_interval_ms: 200`, the least `ddbpipe run` accepts.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// `idle_termination_secs: 1`: a safety net; the disabled stream should end the run first.
const IDLE_TERMINATION: Duration = Duration::from_secs(1);
/// `discovery_interval_secs` default.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(60);

/// Everything built before the meter starts.
pub struct Prepared {
    api: Arc<AwsStreamsApi>,
    run: StreamRun,
    sink: JsonlSink,
    checkpointer: Checkpointer,
    expected_shards: usize,
    _lock: StateLock,
    _state_dir: tempfile::TempDir,
}

/// The source a config reading the bench stream at the bench endpoint gives.
pub fn source_config(endpoint: &str) -> SourceConfig {
    let client = client_settings(endpoint);
    let mut source = SourceConfig::new(TABLE);
    source.mode = Mode::Streams;
    source.stream_arn = Some(STREAM_ARN.to_string());
    source.region = client.region;
    source.endpoint_url = client.endpoint_url;
    source.credentials = client.credentials;
    source
}

/// The run settings a config with `stream_arn` set gives (see the module docs), reading
/// `concurrency` shards at once.
pub fn stream_run(concurrency: usize, batch: BatchLimits) -> StreamRun {
    StreamRun {
        table: TABLE.to_string(),
        stream_arn: STREAM_ARN.to_string(),
        format: ValueFormat::Plain,
        retry: RetryPolicy::default(),
        records_per_request: PAGE_RECORDS as u32,
        poll_interval: POLL_INTERVAL,
        bounds: RunBounds {
            shard_concurrency: concurrency,
            discovery_interval: DISCOVERY_INTERVAL,
            idle_termination: Some(IDLE_TERMINATION),
            follow: false,
        },
        start_position: StartPosition::TrimHorizon,
        on_gap: OnGap::Fail,
        max_messages: None,
        batch,
        config_label: "ddbpipe-bench".to_string(),
        kind: StreamKind::Streams,
    }
}

/// The streams client of the bench endpoint (no network I/O).
pub async fn streams_api(endpoint: &str) -> Arc<AwsStreamsApi> {
    let sdk = aws::load_sdk_config(&client_settings(endpoint)).await;
    Arc::new(aws::streams_api(&sdk))
}

/// Builds the client, run settings, sink and checkpointer (no network I/O).
pub async fn prepare(settings: &PhaseSettings) -> anyhow::Result<Prepared> {
    let source = source_config(&settings.endpoint);
    let state_dir = tempfile::tempdir().context("cannot create the state directory")?;
    let state = StateFile::new(state_dir.path().join("state.json"));
    let lock = state.lock(PIPELINE)?;
    let checkpointer = Checkpointer::open_streams(
        state,
        PIPELINE,
        Identity::of(&source, &Location::default(), None),
        FLUSH_INTERVAL,
    )
    .await?;
    ensure!(
        checkpointer.streams_position().is_none(),
        "a fresh state file holds a streams position"
    );
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
    Ok(Prepared {
        api: streams_api(&settings.endpoint).await,
        run: stream_run(settings.concurrency, BatchLimits::records(BATCH_SIZE)),
        sink,
        checkpointer,
        expected_shards: settings.segments as usize,
        _lock: lock,
        _state_dir: state_dir,
    })
}

impl Prepared {
    /// Reads the stream to its end; returns the change records written and why the run ended
    /// (`stream disabled` or `idle`).
    pub async fn read(mut self) -> anyhow::Result<(u64, &'static str)> {
        read_into(
            self.api,
            &self.run,
            &mut self.sink,
            &mut self.checkpointer,
            self.expected_shards,
        )
        .await
    }
}

/// Reads the bench stream into `sink` to its end, as `ddbpipe run` does; checks the run ended
/// on the drained stream (or idle) with every shard finished; returns the change records
/// written and why the run ended (`stream disabled` or `idle`).
pub async fn read_into<S: Sink>(
    api: Arc<AwsStreamsApi>,
    run: &StreamRun,
    sink: &mut S,
    checkpointer: &mut Checkpointer,
    expected_shards: usize,
) -> anyhow::Result<(u64, &'static str)> {
    // Nothing stops the read: the handle lives until it ends.
    let (_stop_handle, stop) = Cancel::new();
    let outcome = run_streams(
        api,
        run,
        sink,
        checkpointer,
        stop,
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await?;
    let end = match outcome.end {
        EndReason::StreamDisabled => "stream disabled",
        EndReason::Idle => "idle",
        other => anyhow::bail!("the run ended early ({other:?}): {outcome:?}"),
    };
    let finished = checkpointer
        .streams_position()
        .map_or(0, |position| position.finished().count());
    ensure!(
        finished == expected_shards,
        "{finished} of {expected_shards} shards finished"
    );
    Ok((outcome.written, end))
}
