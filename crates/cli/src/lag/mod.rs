//! `ddbpipe lag`: how far a streams or mirror pipeline is behind its stream (docs/streams.md §4.11).
//!
//! # Probe
//! 1. Load the stored position without taking the lock (a running pipeline keeps running):
//!    the state file's, or with `coordination` the shard checkpoints of the lease rows
//!    ([`leased`]). An open snapshot, or a mirror that has not captured yet, is the `snapshot`
//!    phase: its progress is printed and there is no value.
//! 2. Resolve the stream (docs/streams.md §4.2) and discover its shards (docs/streams.md §4.3).
//! 3. A stored position goes through the run's start-up gap layers (docs/streams.md §4.5,
//!    [`crate::stream_gaps`]): a gap the next run would find makes the value unknown, naming
//!    the reasons and the `on_gap` the run applies.
//! 4. Every described shard that is not finished is probed, `shard_concurrency` at once, from
//!    where the next run would start it (docs/streams.md §4.4, [`probe::plan`]):
//!    `GetShardIterator`, then `GetRecords(Limit 1)`, following the iterator past one empty
//!    page: like a slice, a shard counts as caught up only after two empty answers in a row
//!    (docs/streams.md §4.9). Throttles and transients are retried with `min(delay(n), 10 s)`
//!    up to `max_retries`.
//! 5. A shard's lag is the age of its first record, `(now − ts_ms) / 1000`, clamped to ≥ 0;
//!    no record, no timestamp or no iterator → 0. A shard with a `latest` floor counts no
//!    record older than the floor's margin (the run would drop it). The result is the maximum;
//!    no shard to probe → no value. A shared stream's report also gives the worst shard of
//!    each worker holding one, and of the shards nobody holds.
//!
//! Nothing is consumed (iterators are only read from) and no state is written.
//!
//! # Error handling
//! Any failed probe makes the value unknown; the report names the shard and the cause.
//!
//! # Exit
//! 0 when a value was measured and is not above `--max-lag-seconds`; 1 otherwise (over the
//! limit, unknown, or no value while a limit is set); 2 for scan and query pipelines.

mod leased;
mod probe;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::aws;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{Mode, SourceConfig, StartPosition};
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::plan;
use ddbpipe_source::position::StreamsPosition;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::lineage::ShardGraph;
use serde_json::{Value as Json, json};

use crate::config::PipelineConfig;
use crate::destination;
use crate::failure::{Exit, Failure, start_failure};
use crate::origin::Origin;
use crate::state_cmd::streams::snapshot_progress;
use crate::stream_gaps;
use crate::wiring::{self, resolve_stream};

/// Shards listed in the text line; the JSON lists them all.
const TEXT_SHARDS: usize = 10;

/// Which phase the pipeline is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the stream: the lag is measured.
    Streaming,
    /// A mirror or resnapshot scan is open (or a mirror has not captured yet): no value.
    Snapshot,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Streaming => "streaming",
            Phase::Snapshot => "snapshot",
        }
    }
}

/// The lag of one probed shard.
#[derive(Debug, Clone, PartialEq)]
struct ShardLag {
    shard: ShardId,
    seconds: f64,
}

/// Who reads a shard of a shared stream: a worker (its configured id), or nobody.
type Holder = Option<String>;

/// The worst shard of one holder of a shared stream.
#[derive(Debug, Clone, PartialEq)]
struct WorkerLag {
    worker: Holder,
    seconds: f64,
    shards: usize,
}

/// A shared stream's part of the report (docs/coordination.md §11.11).
#[derive(Debug, Clone, PartialEq)]
struct Shared {
    lease_table: String,
    /// Who holds each probed shard.
    holders: BTreeMap<ShardId, Holder>,
}

/// What `ddbpipe lag` prints.
#[derive(Debug, Clone, PartialEq)]
struct LagReport {
    phase: Phase,
    /// The maximum over the probed shards; `None` with no shard, an error or a snapshot.
    seconds: Option<f64>,
    /// The probed shards, sorted by id.
    shards: Vec<ShardLag>,
    /// Why the value is unknown.
    error: Option<String>,
    /// The snapshot phase's progress line, and the stored snapshot record if one is open.
    snapshot: Option<(String, Json)>,
    /// With `coordination`: the lease table and who holds each shard.
    shared: Option<Shared>,
}

impl LagReport {
    fn measured(mut shards: Vec<ShardLag>) -> Self {
        shards.sort_by(|a, b| a.shard.cmp(&b.shard));
        LagReport {
            phase: Phase::Streaming,
            seconds: shards.iter().map(|s| s.seconds).reduce(f64::max),
            shards,
            error: None,
            snapshot: None,
            shared: None,
        }
    }

    fn unknown(error: String) -> Self {
        LagReport {
            error: Some(error),
            ..LagReport::measured(Vec::new())
        }
    }

    fn snapshot(progress: String, record: Json) -> Self {
        LagReport {
            phase: Phase::Snapshot,
            snapshot: Some((progress, record)),
            ..LagReport::measured(Vec::new())
        }
    }

    /// The report of a shared stream, read from `lease_table`.
    fn in_lease_table(mut self, lease_table: &str, holders: BTreeMap<ShardId, Holder>) -> Self {
        self.shared = Some(Shared {
            lease_table: lease_table.to_string(),
            holders,
        });
        self
    }

    /// Per holder of a shared stream, its worst shard: workers by id, then the shards nobody
    /// holds.
    fn workers(&self) -> Vec<WorkerLag> {
        let Some(shared) = &self.shared else {
            return Vec::new();
        };
        let mut by: BTreeMap<(bool, Holder), WorkerLag> = BTreeMap::new();
        for lag in &self.shards {
            let holder = shared.holders.get(&lag.shard).cloned().flatten();
            let entry = by
                .entry((holder.is_none(), holder.clone()))
                .or_insert(WorkerLag {
                    worker: holder,
                    seconds: 0.0,
                    shards: 0,
                });
            entry.seconds = entry.seconds.max(lag.seconds);
            entry.shards += 1;
        }
        by.into_values().collect()
    }

    /// `{"error","lag_seconds","phase","shards"}` (+ `"snapshot"` in the snapshot phase; +
    /// `"lease_table"`, `"workers"` and each shard's `"worker"` for a shared stream).
    fn to_json(&self) -> Json {
        let holder = |shard: &ShardId| {
            self.shared
                .as_ref()
                .and_then(|shared| shared.holders.get(shard).cloned().flatten())
        };
        let shards: Vec<Json> = self
            .shards
            .iter()
            .map(|s| {
                let mut shard = json!({"lag_seconds": s.seconds, "shard_id": s.shard.as_str()});
                if self.shared.is_some() {
                    shard["worker"] = json!(holder(&s.shard));
                }
                shard
            })
            .collect();
        let mut out = json!({
            "error": self.error,
            "lag_seconds": self.seconds,
            "phase": self.phase.as_str(),
            "shards": shards,
        });
        if let (Some((_, record)), Json::Object(map)) = (&self.snapshot, &mut out) {
            map.insert("snapshot".into(), record.clone());
        }
        if let Some(shared) = &self.shared {
            let workers: Vec<Json> = self
                .workers()
                .iter()
                .map(|w| json!({"lag_seconds": w.seconds, "shards": w.shards, "worker": w.worker}))
                .collect();
            out["lease_table"] = json!(shared.lease_table);
            out["workers"] = json!(workers);
        }
        out
    }

    /// `lag: 12.0 s (shard shardId-… 12.0 s, …)`, worst shards first; a shared stream's adds
    /// `; workers: w1 12.0 s (2 shard(s)), unheld 0.0 s (1 shard(s))`.
    fn to_text(&self) -> String {
        if let Some((progress, _)) = &self.snapshot {
            return format!("lag: no value ({progress})");
        }
        if let Some(error) = &self.error {
            return format!("lag: unknown ({error})");
        }
        let Some(seconds) = self.seconds else {
            return "lag: no value (no unfinished shard to probe)".to_string();
        };
        let mut worst: Vec<&ShardLag> = self.shards.iter().collect();
        worst.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.shard.cmp(&b.shard)));
        let mut listed: Vec<String> = worst
            .iter()
            .take(TEXT_SHARDS)
            .map(|s| format!("shard {} {:.1} s", s.shard, s.seconds))
            .collect();
        if worst.len() > TEXT_SHARDS {
            listed.push(format!("{} more", worst.len() - TEXT_SHARDS));
        }
        let mut text = format!("lag: {seconds:.1} s ({})", listed.join(", "));
        let workers = self.workers();
        if !workers.is_empty() {
            let each: Vec<String> = workers
                .iter()
                .map(|w| {
                    format!(
                        "{} {:.1} s ({} shard(s))",
                        w.worker.as_deref().unwrap_or("unheld"),
                        w.seconds,
                        w.shards
                    )
                })
                .collect();
            text.push_str(&format!("; workers: {}", each.join(", ")));
        }
        text
    }

    /// Why the exit code is 1, if it is.
    fn verdict(&self, max_lag_seconds: Option<f64>) -> Result<(), String> {
        if let Some(error) = &self.error {
            return Err(format!("the lag is unknown: {error}"));
        }
        match (self.seconds, max_lag_seconds) {
            (Some(seconds), Some(max)) if seconds > max => Err(format!(
                "the lag ({seconds:.1} s) is above --max-lag-seconds {max}"
            )),
            (None, Some(max)) => Err(format!(
                "no lag value to compare with --max-lag-seconds {max} ({})",
                match &self.snapshot {
                    Some((progress, _)) => progress.as_str(),
                    None => "no unfinished shard to probe",
                }
            )),
            _ => Ok(()),
        }
    }
}

/// Runs `ddbpipe lag`: prints the report and maps it to the exit code.
pub async fn lag(
    config_path: &Path,
    json: bool,
    max_lag_seconds: Option<f64>,
) -> Result<Exit, Failure> {
    if let Some(max) = max_lag_seconds
        && !(max.is_finite() && max >= 0.0)
    {
        return Err(Failure::usage(anyhow!(
            "--max-lag-seconds must be a number of seconds ≥ 0, not {max}"
        )));
    }
    let config = wiring::load_config(config_path)?;
    let source = &config.source;
    if !source.mode.reads_stream() {
        return Err(Failure::usage(anyhow!(
            "lag applies to streams and mirror modes (this pipeline is mode: {})",
            source.mode
        )));
    }
    if !config.is_multi_table() {
        let report = probe(&config, config_path, json).await?;
        if json {
            println!("{}", report.to_json());
        } else if report.error.is_none() {
            println!("{}", report.to_text());
        }
        return match report.verdict(max_lag_seconds) {
            Ok(()) => Ok(Exit::Ok),
            Err(_) if json => Ok(Exit::Runtime),
            Err(why) => Err(Failure::runtime(anyhow!(why))),
        };
    }
    // A file of several tables: each table's report, then the worst lag of them all; the
    // verdict fails when any table's does.
    let mut listed = Vec::new();
    let mut late = Vec::new();
    let mut worst: Option<(f64, String)> = None;
    for (index, one) in crate::discover::each_table(&config)
        .await?
        .iter()
        .enumerate()
    {
        let table = one.source.table_name.clone();
        let report = probe(one, config_path, true).await?;
        if let Some(seconds) = report.seconds
            && worst.as_ref().is_none_or(|(most, _)| seconds > *most)
        {
            worst = Some((seconds, table.clone()));
        }
        if let Err(why) = report.verdict(max_lag_seconds) {
            late.push(format!("table '{table}': {why}"));
        }
        if json {
            let mut document = report.to_json();
            document["table"] = json!(table);
            document["pipeline"] = json!(one.name);
            listed.push(document);
        } else {
            if index > 0 {
                println!();
            }
            println!("table '{table}' (pipeline '{}'):", one.name);
            match &report.error {
                None => println!("{}", report.to_text()),
                Some(error) => println!("error: {error}"),
            }
        }
    }
    if json {
        let (seconds, table) = worst.map_or((None, None), |(s, t)| (Some(s), Some(t)));
        println!(
            "{}",
            json!({"tables": listed, "worst": {"lag_seconds": seconds, "table": table}})
        );
    } else if let Some((seconds, table)) = &worst {
        println!();
        println!("worst lag: {seconds:.1} s (table '{table}')");
    }
    match late.is_empty() {
        true => Ok(Exit::Ok),
        false if json => Ok(Exit::Runtime),
        false => Err(Failure::runtime(anyhow!(late.join("; ")))),
    }
}

/// The lag report of one table's pipeline. Without the stream there is nothing to probe: the
/// report says so when `keep_errors` (JSON mode, a table of several), else it is the
/// command's error, with its remedy.
async fn probe(
    config: &PipelineConfig,
    config_path: &Path,
    keep_errors: bool,
) -> Result<LagReport, Failure> {
    let sdk = aws::load_sdk_config(&plan::client_settings(&config.source)).await;
    let probed = match &config.coordination {
        Some(coordination) => leased::report(config, coordination, &sdk).await,
        None => single(config, config_path, &sdk).await,
    };
    match probed {
        Ok(report) => Ok(report),
        Err(failure) if !keep_errors => Err(failure),
        Err(failure) => Ok(LagReport::unknown(failure.to_string())),
    }
}

/// The report of a pipeline run by one process: from its stored position.
async fn single(
    config: &PipelineConfig,
    config_path: &Path,
    sdk: &aws::SdkSettings,
) -> Result<LagReport, Failure> {
    let location = wiring::location(sdk, &config.source);
    let stored = stored_position(config, config_path, &location).await?;
    match snapshot_phase(config.source.mode, stored.as_ref()) {
        Some(report) => Ok(report),
        None => measure(config, sdk, stored.as_ref()).await,
    }
}

/// The stored streams position, read without the lock; `None` before the first run.
async fn stored_position(
    config: &PipelineConfig,
    config_path: &Path,
    location: &Location,
) -> Result<Option<StreamsPosition>, Failure> {
    let Some(store) = destination::read_store(config).await? else {
        return Ok(None);
    };
    let checkpointer = Checkpointer::open_streams(
        store,
        &config.name,
        wiring::identity(config, location, None),
        Duration::ZERO,
    )
    .await
    .map_err(|error| start_failure(error, &Origin::File(config_path.to_owned())))?;
    Ok(checkpointer.streams_position().cloned())
}

/// The snapshot phase, if the pipeline is in it: an open snapshot record, or a mirror whose
/// first run has not captured the stream yet.
fn snapshot_phase(mode: Mode, stored: Option<&StreamsPosition>) -> Option<LagReport> {
    match stored {
        Some(position) => {
            let record = position.snapshot.as_ref()?;
            Some(LagReport::snapshot(
                snapshot_progress(record),
                serde_json::to_value(record).unwrap_or(Json::Null),
            ))
        }
        None if mode == Mode::Mirror => Some(LagReport::snapshot(
            "no snapshot yet: the first run of a mirror scans the table before streaming"
                .to_string(),
            Json::Null,
        )),
        None => None,
    }
}

/// Resolves the stream, lists it, applies the run's gap layers to `stored` and probes every
/// unfinished shard. `Err` only when the stream itself cannot be reached; shard failures are
/// in the report. A gap the next run would find has no lag to measure: the value is unknown,
/// with the reasons and the `on_gap` the run applies.
async fn measure(
    config: &PipelineConfig,
    sdk: &aws::SdkSettings,
    stored: Option<&StreamsPosition>,
) -> Result<LagReport, Failure> {
    let source = &config.source;
    let stream = resolve_stream(&aws::table_api(sdk), source, &Cancel::never()).await?;
    let api = Arc::new(aws::streams_api(sdk));
    let graph = stream_gaps::listed(api.as_ref(), source, &stream.arn)
        .await
        .map_err(Failure::runtime)?;
    if let Some(report) = match stored {
        Some(stored) => gap_check(api.as_ref(), source, &stream.arn, stored, &graph).await,
        None => None,
    } {
        return Ok(report);
    }
    let start_position = source.start_position.unwrap_or(StartPosition::TrimHorizon);
    Ok(probed(api, source, &stream.arn, &graph, stored, start_position).await)
}

/// The run's gap layers on `stored` (docs/streams.md §4.5): the report when they stop the
/// measure (a gap, or a trim probe that failed), `None` otherwise.
async fn gap_check<A: StreamsApi>(
    api: &A,
    source: &SourceConfig,
    stream_arn: &str,
    stored: &StreamsPosition,
    graph: &ShardGraph,
) -> Option<LagReport> {
    match stream_gaps::findings(api, source, stream_arn, stored, graph).await {
        Ok(findings) if findings.is_gap() => Some(LagReport::unknown(stream_gaps::unresumable(
            &findings.reasons,
            source.on_gap,
        ))),
        Ok(_) => None,
        Err(error) => Some(LagReport::unknown(format!(
            "the trim probe of the stored position failed: {error}"
        ))),
    }
}

/// Probes every unfinished shard of `graph` from where the next run starts it.
async fn probed<A: StreamsApi + 'static>(
    api: Arc<A>,
    source: &SourceConfig,
    stream_arn: &str,
    graph: &ShardGraph,
    stored: Option<&StreamsPosition>,
    start_position: StartPosition,
) -> LagReport {
    let plan = probe::plan(graph, stored, start_position, unix_now_ms());
    let measured = probe::probe_shards(
        api,
        Arc::from(stream_arn),
        plan,
        source.retry.policy(),
        source.shard_concurrency,
    )
    .await;
    match measured {
        Ok(lags) => LagReport::measured(
            lags.into_iter()
                .map(|(shard, seconds)| ShardLag { shard, seconds })
                .collect(),
        ),
        Err(error) => LagReport::unknown(error),
    }
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::position::StreamKind;

    use super::*;

    fn lags(pairs: &[(&str, f64)]) -> Vec<ShardLag> {
        pairs
            .iter()
            .map(|(id, seconds)| ShardLag {
                shard: ShardId::new(*id),
                seconds: *seconds,
            })
            .collect()
    }

    #[test]
    fn the_value_is_the_worst_shard_and_the_text_lists_the_worst_first() {
        let report = LagReport::measured(lags(&[("s2", 3.0), ("s1", 12.0), ("s3", 0.0)]));
        assert_eq!(report.seconds, Some(12.0));
        assert_eq!(
            report.to_text(),
            "lag: 12.0 s (shard s1 12.0 s, shard s2 3.0 s, shard s3 0.0 s)"
        );
        assert_eq!(
            report.to_json().to_string(),
            r#"{"error":null,"lag_seconds":12.0,"phase":"streaming","shards":[{"lag_seconds":12.0,"shard_id":"s1"},{"lag_seconds":3.0,"shard_id":"s2"},{"lag_seconds":0.0,"shard_id":"s3"}]}"#
        );
        assert!(report.verdict(None).is_ok());
        assert!(report.verdict(Some(12.0)).is_ok());
        assert!(report.verdict(Some(11.9)).is_err());
    }

    #[test]
    fn a_stream_without_shards_has_no_value_which_fails_only_a_limit() {
        let report = LagReport::measured(Vec::new());
        assert_eq!(report.seconds, None);
        assert!(report.verdict(None).is_ok());
        assert!(report.verdict(Some(60.0)).is_err());
        assert_eq!(
            report.to_json().to_string(),
            r#"{"error":null,"lag_seconds":null,"phase":"streaming","shards":[]}"#
        );
    }

    #[test]
    fn an_unknown_value_always_exits_one_and_names_its_cause() {
        let report = LagReport::unknown("shard s1: GetRecords on s1 failed".into());
        let why = report.verdict(None).unwrap_err();
        assert!(why.contains("shard s1"), "{why}");
        assert_eq!(
            report.to_json()["error"],
            "shard s1: GetRecords on s1 failed"
        );
        assert_eq!(report.to_json()["lag_seconds"], Json::Null);
    }

    #[test]
    fn an_open_snapshot_prints_its_progress_and_no_value() {
        let record = json!({"captured_at": 1, "complete": false, "cursors": {}, "done": [[0, 3], [6, 6]],
            "gap_reasons": [], "id": 1, "keys_written": 0, "reason": "mirror", "total_segments": 16});
        let mut position = StreamsPosition::new(StreamKind::Mirror, Some("arn".into()));
        position.snapshot = Some(serde_json::from_value(record.clone()).unwrap());
        let report = snapshot_phase(Mode::Mirror, Some(&position)).unwrap();
        assert_eq!(
            report.to_text(),
            "lag: no value (snapshot (mirror) open: 5 of 16 segment(s) done)"
        );
        let out = report.to_json();
        assert_eq!(out["phase"], "snapshot");
        assert_eq!(out["lag_seconds"], Json::Null);
        assert_eq!(out["snapshot"], record);
        assert!(report.verdict(None).is_ok());
        assert!(report.verdict(Some(1.0)).is_err());
    }

    #[test]
    fn a_streams_pipeline_without_a_snapshot_is_streaming() {
        assert_eq!(snapshot_phase(Mode::Streams, None), None);
        let position = StreamsPosition::new(StreamKind::Streams, None);
        assert_eq!(snapshot_phase(Mode::Streams, Some(&position)), None);
        assert!(snapshot_phase(Mode::Mirror, None).is_some());
    }
}
