//! The settings of a stream run on the in-memory fake stream, which tests adjust.

use std::time::Duration;

use ddbpipe_pipeline::streams::StreamRun;
use ddbpipe_source::capacity::ReadSlots;
use ddbpipe_source::config::{OnGap, StartPosition};
use ddbpipe_source::fake_streams::FAKE_STREAM_ARN;
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::StreamKind;
use ddbpipe_source::retry::RetryPolicy;
use ddbpipe_source::streams::engine::RunBounds;
use ddbpipe_value::ValueFormat;

/// A `mode: streams` run of table `t` on [`FAKE_STREAM_ARN`]: plain values, retries from
/// 10 ms, 100 records per request, a 250 ms poll, one shard at a time, a 10 s discovery, the
/// run idle after 30 s, `on_gap: fail`, batches of 10, 64 read slots of its own.
pub fn fake_stream_run() -> StreamRun {
    StreamRun {
        table: "t".into(),
        stream_arn: FAKE_STREAM_ARN.into(),
        format: ValueFormat::Plain,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
        records_per_request: 100,
        poll_interval: Duration::from_millis(250),
        max_idle_poll: Duration::from_millis(250),
        bounds: RunBounds {
            shard_concurrency: 1,
            discovery_interval: Duration::from_secs(10),
            idle_termination: Some(Duration::from_secs(30)),
            follow: false,
        },
        start_position: StartPosition::TrimHorizon,
        on_gap: OnGap::Fail,
        max_messages: None,
        batch: BatchLimits::records(10),
        kind: StreamKind::Streams,
        slots: ReadSlots::new(64),
    }
}
