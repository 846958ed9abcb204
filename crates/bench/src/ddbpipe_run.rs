//! ddbpipe as the bench runs it: a pipeline file's YAML given to the library's one build path
//! (`ddbpipe::Pipeline`), the path `ddbpipe run` takes. [`BenchPipeline::open`] builds the run
//! before the meter starts — the clients, `DescribeTable` (a scan, or a stream into a keyed
//! or kafka sink), the sink and its table, the pipeline's lock, the position loaded and checked — and
//! [`finish`] is the timed part: the read, the writes and the commits, to the run's end.
//!
//! The settings are a config's: the bench endpoint with static keys in `us-east-1`, the
//! phase's segments and concurrency (`max_concurrency` for a scan, `shard_concurrency` for the
//! stream), the default retry policy and plain values, the state file in a temporary
//! directory flushed every second
//! (a keyed sink's position is committed with its rows). The stream is read from `TRIM_HORIZON` with the bench
//! stream's ARN, polled every 200 ms, and ends on the drained stream or after a second idle;
//! batches are the config's default size for the sink.

use anyhow::{Context as _, bail};
use ddbpipe::{Ended, Opened, Pipeline};

use crate::ddbpipe_client::PIPELINE;
use crate::items::TABLE;
use crate::phase::PhaseSettings;
use crate::records::{PAGE_RECORDS, STREAM_ARN};
use crate::sink::Destination;

/// What a bench pipeline reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// A parallel scan of the bench table.
    Scan,
    /// Every change record of the bench stream.
    Stream,
}

/// A bench pipeline, validated, with the directory its state file lives in.
pub struct BenchPipeline {
    pipeline: Pipeline,
    _dir: tempfile::TempDir,
}

impl BenchPipeline {
    /// The pipeline reading `read` of the bench endpoint into `into`: the jsonl sink on
    /// `/dev/null` without fsync (the reads' own cost), a keyed, parquet or kafka sink. Batches
    /// are the config's default size for the sink (1000 into jsonl, 5000 into a keyed sink).
    pub fn new(
        settings: &PhaseSettings,
        read: Read,
        into: &Destination,
    ) -> anyhow::Result<BenchPipeline> {
        let dir = tempfile::tempdir().context("cannot create the state directory")?;
        let reading = match read {
            Read::Scan => format!(
                "mode: scan, segments: {}, max_concurrency: {}",
                settings.segments, settings.concurrency
            ),
            Read::Stream => format!(
                "mode: streams, stream_arn: '{STREAM_ARN}', start_position: trim_horizon, \
                 shard_concurrency: {}, records_per_request: {PAGE_RECORDS}, \
                 poll_interval_ms: 200, idle_termination_secs: 1, discovery_interval_secs: 60",
                settings.concurrency
            ),
        };
        // A keyed sink keeps the position in its database, with the rows.
        let (sink, state) = match into {
            Destination::Jsonl => (
                "{type: jsonl, path: /dev/null, fsync: false}".to_string(),
                "state: {path: state.json, flush_interval_ms: 1000}\n",
            ),
            // The position in its commit log; `target_file_mb` and `commit_interval_secs` are
            // the defaults.
            Destination::Parquet {
                path,
                iceberg: false,
            } => (format!("{{type: parquet, path: '{}'}}", path.display()), ""),
            Destination::Parquet {
                path,
                iceberg: true,
            } => (
                format!(
                    "{{type: iceberg, catalog: {{type: sql, uri: 'sqlite:///{}.catalog.db'}}, \
                     warehouse: '{}'}}",
                    path.display(),
                    path.display()
                ),
                "",
            ),
            Destination::Sqlite { path, columns } => (
                format!(
                    "{{type: sqlite, path: '{}'{}}}",
                    path.display(),
                    typed_columns(*columns)
                ),
                "",
            ),
            Destination::Postgres {
                url,
                schema,
                columns,
            } => (
                format!(
                    "{{type: postgres, url: '{}', schema: {schema}{}}}",
                    url.expose(),
                    typed_columns(*columns)
                ),
                "",
            ),
            // exactly_once keeps the position in its positions topic, at_least_once in the
            // state file.
            Destination::Kafka {
                brokers,
                topic,
                positions_topic,
                exactly_once,
            } => (
                format!(
                    "{{type: kafka, brokers: '{brokers}', topic: '{topic}', \
                     positions_topic: '{positions_topic}', delivery: {}}}",
                    if *exactly_once {
                        "exactly_once"
                    } else {
                        "at_least_once"
                    }
                ),
                if *exactly_once {
                    ""
                } else {
                    "state: {path: state.json, flush_interval_ms: 1000}\n"
                },
            ),
        };
        let yaml = format!(
            "name: {PIPELINE}\n\
             source: {{table_name: {TABLE}, region: us-east-1, endpoint_url: '{endpoint}', \
             credentials: {{type: access_key, config: {{access_key_id: AKIDBENCH, \
             secret_access_key: bench-secret}}}}, {reading}}}\n\
             {state}sink: {sink}\n",
            endpoint = settings.endpoint,
        );
        let pipeline = Pipeline::from_yaml(&yaml, dir.path())
            .map_err(|error| anyhow::anyhow!("the bench pipeline: {error}"))?;
        Ok(BenchPipeline {
            pipeline,
            _dir: dir,
        })
    }

    /// Builds the run (not timed: see the module docs).
    pub async fn open(&self) -> anyhow::Result<Opened<'_>> {
        // Nothing stops the run: it ends on its own.
        self.pipeline
            .open(ddbpipe::Cancel::never())
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))
    }
}

/// Runs what was opened to its end (timed); returns the records written and, for the stream,
/// why it ended (`stream disabled` or `idle`). A scan must complete.
pub async fn finish(opened: Opened<'_>) -> anyhow::Result<(u64, Option<&'static str>)> {
    let summary = opened
        .run()
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let end = match summary.ended() {
        Ended::Complete => None,
        Ended::StreamDisabled => Some("stream disabled"),
        Ended::Idle => Some("idle"),
        other => bail!("the run ended early ({other:?}): {summary}"),
    };
    let Some(written) = summary.written() else {
        bail!("the run counted nothing: {summary}");
    };
    Ok((written, end))
}

/// The `columns:` key of a keyed sink with the bench's typed columns, or nothing.
fn typed_columns(columns: bool) -> String {
    if columns {
        format!(", columns: {}", crate::sink::TYPED_COLUMNS)
    } else {
        String::new()
    }
}
