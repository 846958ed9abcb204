//! `ddbpipe lag`: how far a streams or mirror pipeline is behind its stream (docs/streams.md §4.11).
//!
//! # Probe
//! 1. Load the stored position without taking the lock (a running pipeline keeps running).
//!    An open snapshot, or a mirror that has not captured yet, is the `snapshot` phase: its
//!    progress is printed and there is no value.
//! 2. Resolve the stream (docs/streams.md §4.2) and discover its shards (docs/streams.md §4.3).
//! 3. Every described shard that is not finished is probed, `shard_concurrency` at once, from
//!    where the next run would start it (docs/streams.md §4.4, [`plan`]).
//! 4. `GetShardIterator`, then `GetRecords(Limit 1)`, following the iterator past one empty
//!    page: like a slice, a shard counts as caught up only after two empty answers in a row
//!    (docs/streams.md §4.9). Throttles and transients are retried with `min(delay(n), 10 s)` up to
//!    `max_retries`.
//! 5. A shard's lag is the age of its first record, `(now − ts_ms) / 1000`, clamped to ≥ 0;
//!    no record, no timestamp or no iterator → 0. A shard with a `latest` floor counts no
//!    record older than the floor's margin (the run would drop it). The result is the maximum;
//!    no shard to probe → no value.
//!
//! Nothing is consumed (iterators are only read from) and no state is written.
//!
//! # Error handling
//! Any failed probe makes the value unknown; the report names the shard and the cause.
//!
//! # Exit
//! 0 when a value was measured and is not above `--max-lag-seconds`; 1 otherwise (over the
//! limit, unknown, or no value while a limit is set); 2 for scan and query pipelines.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_source::api::{RecordsPage, ShardDescription, StartAt, StreamsApi};
use ddbpipe_source::aws;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{Mode, StartPosition};
use ddbpipe_source::error::ReadError;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::plan;
use ddbpipe_source::position::{SnapshotRecord, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::lineage::ShardGraph;
use ddbpipe_source::streams::shard_reader::{MAX_YIELD, READ_SPACING};
use ddbpipe_source::streams::shard_sync;
use ddbpipe_source::streams::start::{FLOOR_MARGIN_MS, ShardStart, start_for};
use serde_json::{Value as Json, json};
use tokio::task::JoinSet;

use crate::config::PipelineConfig;
use crate::destination;
use crate::failure::{Exit, Failure, start_failure};
use crate::wiring::{self, resolve_stream};

/// Empty `GetRecords` answers in a row after which a shard counts as caught up (docs/streams.md §4.9).
const EMPTY_READS: u32 = 2;

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
        }
    }

    fn unknown(error: String) -> Self {
        LagReport {
            phase: Phase::Streaming,
            seconds: None,
            shards: Vec::new(),
            error: Some(error),
            snapshot: None,
        }
    }

    fn snapshot(progress: String, record: Json) -> Self {
        LagReport {
            phase: Phase::Snapshot,
            seconds: None,
            shards: Vec::new(),
            error: None,
            snapshot: Some((progress, record)),
        }
    }

    /// `{"error","lag_seconds","phase","shards"}` (+ `"snapshot"` in the snapshot phase).
    fn to_json(&self) -> Json {
        let shards: Vec<Json> = self
            .shards
            .iter()
            .map(|s| json!({"lag_seconds": s.seconds, "shard_id": s.shard.as_str()}))
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
        out
    }

    /// `lag: 12.0 s (shard shardId-… 12.0 s, …)`, worst shards first.
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
        format!("lag: {seconds:.1} s ({})", listed.join(", "))
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
    let sdk = aws::load_sdk_config(&plan::client_settings(source)).await;
    let location = wiring::location(&sdk, source);
    let stored = stored_position(&config, config_path, &location).await?;
    let report = match snapshot_phase(source.mode, stored.as_ref()) {
        Some(report) => report,
        None => match probe(&config, &sdk, stored.as_ref()).await {
            Ok(report) => report,
            // Without the stream there is nothing to probe: text mode reports it as the
            // command's error, with its remedy; JSON mode keeps stdout machine-readable.
            Err(failure) if !json => return Err(failure),
            Err(failure) => LagReport::unknown(failure.to_string()),
        },
    };
    if json {
        println!("{}", report.to_json());
    } else if report.error.is_none() {
        println!("{}", report.to_text());
    }
    match report.verdict(max_lag_seconds) {
        Ok(()) => Ok(Exit::Ok),
        Err(_) if json => Ok(Exit::Runtime),
        Err(why) => Err(Failure::runtime(anyhow!(why))),
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
        wiring::identity(config, location),
        Duration::ZERO,
    )
    .await
    .map_err(|error| start_failure(error, config_path))?;
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

/// `snapshot (mirror) open: 3 of 16 segment(s) done` from a stored snapshot record (docs/state.md
/// §6.3).
fn snapshot_progress(record: &SnapshotRecord) -> String {
    let reason = record.reason.as_str();
    let done: u64 = record
        .done
        .iter()
        .map(|[first, last]| u64::from(last.saturating_sub(*first)) + 1)
        .sum();
    let segments = format!("{done} of {} segment(s) done", record.total_segments);
    if record.complete {
        format!("snapshot ({reason}) scanned, {segments}; streaming starts after its cleanup")
    } else {
        format!("snapshot ({reason}) open: {segments}")
    }
}

/// Resolves the stream, discovers it and probes every unfinished shard. `Err` only when the
/// stream itself cannot be reached; shard failures are in the report. A position of another
/// stream (the table was re-created) has no lag to measure: the value is unknown, with the
/// reason the next run gives.
async fn probe(
    config: &PipelineConfig,
    sdk: &aws::SdkSettings,
    stored: Option<&StreamsPosition>,
) -> Result<LagReport, Failure> {
    let source = &config.source;
    let cancel = Cancel::never();
    let stream = resolve_stream(&aws::table_api(sdk), source, &cancel).await?;
    if let Some(reason) = stored.and_then(|s| gaps::recreated(s, &stream.arn, &source.table_name)) {
        return Ok(LagReport::unknown(format!(
            "{reason}: the stored position cannot be resumed; the next run applies on_gap ({})",
            source.on_gap.as_str()
        )));
    }
    let retry = source.retry.policy();
    let api = Arc::new(aws::streams_api(sdk));
    let discovery = shard_sync::discover(api.as_ref(), &stream.arn, &retry, &cancel, &NoObserver)
        .await
        .map_err(Failure::runtime)?;
    let start_position = source.start_position.unwrap_or(StartPosition::TrimHorizon);
    let plan = plan(&discovery.shards, stored, start_position, unix_now_ms());
    Ok(probe_shards(
        api,
        Arc::from(stream.arn.as_str()),
        plan,
        retry,
        source.shard_concurrency,
    )
    .await)
}

/// Where the probe of one shard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ShardProbe {
    shard: ShardId,
    at: StartAt,
    /// The `latest` floor (unix ms) the run applies to this shard, if any.
    floor_ms: Option<i64>,
}

/// The shards to probe and where each starts (docs/streams.md §4.4), in id order. Finished shards, and
/// shards a `latest` first run would finish unread, are left out.
///
/// 1. A stored entry decides: `After(seq)`, or `""` → `TRIM_HORIZON` with its floor.
/// 2. No stored position (first run): the shard is described at the start, so
///    `start_position` decides; as in the run, a shard counts as closed only when its
///    successor is listed too (some emulators report an ending number on an open shard).
/// 3. Otherwise (a shard new since the last run) → `TRIM_HORIZON`.
fn plan(
    described: &[ShardDescription],
    stored: Option<&StreamsPosition>,
    start_position: StartPosition,
    now_ms: i64,
) -> Vec<ShardProbe> {
    let mut graph = ShardGraph::new();
    graph.merge(described.iter().cloned());
    let first_run = stored.is_none();
    let empty = StreamsPosition::new(ddbpipe_source::position::StreamKind::Streams, None);
    let position = stored.unwrap_or(&empty);
    graph
        .ids()
        .filter(|id| !position.is_finished(id))
        .filter_map(|id| {
            let shard = graph.with_trusted_closed(id)?;
            match start_for(&shard, position, first_run, true, start_position, now_ms) {
                ShardStart::Read { at, floor_ms } => Some(ShardProbe {
                    shard: shard.id,
                    // A `LATEST` read has no floor to apply: it sees only newer records.
                    floor_ms: floor_ms.filter(|_| at == StartAt::TrimHorizon),
                    at,
                }),
                ShardStart::FinishedAtStart => None,
            }
        })
        .collect()
}

/// Probes the planned shards, `concurrency` at once. The first failure by shard id makes the
/// value unknown.
async fn probe_shards<A: StreamsApi>(
    api: Arc<A>,
    stream_arn: Arc<str>,
    plan: Vec<ShardProbe>,
    retry: RetryPolicy,
    concurrency: usize,
) -> LagReport {
    let mut pending = plan.into_iter();
    let mut running = JoinSet::new();
    let mut measured = Vec::new();
    let mut failures: Vec<(ShardId, ReadError)> = Vec::new();
    loop {
        while running.len() < concurrency.max(1) {
            let Some(probe) = pending.next() else { break };
            let (api, arn) = (Arc::clone(&api), Arc::clone(&stream_arn));
            running.spawn(async move {
                let outcome = probe_shard(api.as_ref(), &arn, &probe, &retry).await;
                (probe.shard, outcome)
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        match joined {
            Ok((shard, Ok(seconds))) => measured.push(ShardLag { shard, seconds }),
            Ok((shard, Err(error))) => failures.push((shard, error)),
            Err(panic) => {
                return LagReport::unknown(format!("internal error: a probe task failed: {panic}"));
            }
        }
    }
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    let others = failures.len().saturating_sub(1);
    match failures.into_iter().next() {
        None => LagReport::measured(measured),
        Some((shard, error)) => {
            let more = match others {
                0 => String::new(),
                n => format!(" (and {n} other shard(s) failed)"),
            };
            LagReport::unknown(format!("shard {shard}: {error}{more}"))
        }
    }
}

/// One shard's lag in seconds (see the module docs, steps 4 and 5).
async fn probe_shard<A: StreamsApi>(
    api: &A,
    stream_arn: &str,
    probe: &ShardProbe,
    retry: &RetryPolicy,
) -> Result<f64, ReadError> {
    let shard = &probe.shard;
    let iterator = retry
        .run(
            "get_shard_iterator",
            || format!("GetShardIterator for {shard}"),
            &Cancel::never(),
            &NoObserver,
            |_| api.shard_iterator(stream_arn, shard, &probe.at),
        )
        .await?;
    let Some(mut iterator) = iterator else {
        return Ok(0.0);
    };
    let mut empty = 0;
    loop {
        let page = get_one_record(api, &iterator, shard, retry).await?;
        if let Some(record) = page.records.first() {
            let created_ms = record.change.as_ref().and_then(|c| c.created_ms);
            return Ok(age_seconds(created_ms, probe.floor_ms, unix_now_ms()));
        }
        empty += 1;
        match page.next_iterator {
            Some(next) if empty < EMPTY_READS => iterator = next,
            _ => return Ok(0.0),
        }
        tokio::time::sleep(READ_SPACING).await;
    }
}

/// `GetRecords(Limit 1)`: throttles and transients wait `min(delay(n), 10 s)` (the slice rule
/// of docs/streams.md §4.8, not the plain docs/errors.md §9.2 delay), sharing the `max_retries` budget.
async fn get_one_record<A: StreamsApi>(
    api: &A,
    iterator: &str,
    shard: &ShardId,
    retry: &RetryPolicy,
) -> Result<RecordsPage, ReadError> {
    retry
        .run_capped(
            MAX_YIELD,
            "get_records",
            || format!("GetRecords on {shard}"),
            &Cancel::never(),
            &NoObserver,
            |_| api.get_records(iterator, 1),
        )
        .await
}

/// `(now − ts) / 1000` clamped to ≥ 0 (non-finite → 0); no timestamp → 0. With a `latest`
/// floor, a record older than `floor − 120 s` would be dropped by the run, so the age counts
/// from there at most.
fn age_seconds(created_ms: Option<i64>, floor_ms: Option<i64>, now_ms: i64) -> f64 {
    let Some(created_ms) = created_ms else {
        return 0.0;
    };
    let counted_from = match floor_ms {
        Some(floor) => created_ms.max(floor.saturating_sub(FLOOR_MARGIN_MS)),
        None => created_ms,
    };
    let seconds = now_ms.saturating_sub(counted_from) as f64 / 1000.0;
    if seconds.is_finite() {
        seconds.max(0.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::ids::SequenceNumber;
    use ddbpipe_source::position::StreamKind;

    use super::*;

    const NOW_MS: i64 = 1_767_225_600_000;

    fn shard(id: &str, parent: Option<&str>, closed: bool) -> ShardDescription {
        ShardDescription {
            id: ShardId::new(id),
            parent: parent.map(ShardId::new),
            closed,
        }
    }

    fn starts(plan: &[ShardProbe]) -> Vec<(&str, StartAt, Option<i64>)> {
        plan.iter()
            .map(|p| (p.shard.as_str(), p.at.clone(), p.floor_ms))
            .collect()
    }

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    #[test]
    fn a_first_run_probes_every_shard_from_the_configured_start() {
        let shards = [shard("s1", None, true), shard("s2", Some("s1"), false)];
        let plan = plan(&shards, None, StartPosition::TrimHorizon, NOW_MS);
        assert_eq!(
            starts(&plan),
            [
                ("s1", StartAt::TrimHorizon, None),
                ("s2", StartAt::TrimHorizon, None)
            ]
        );
    }

    #[test]
    fn a_latest_first_run_skips_closed_shards_and_reads_open_ones_at_latest() {
        let shards = [shard("s1", None, true), shard("s2", Some("s1"), false)];
        let plan = plan(&shards, None, StartPosition::Latest, NOW_MS);
        assert_eq!(starts(&plan), [("s2", StartAt::Latest, None)]);
    }

    #[test]
    fn an_open_shard_reported_closed_without_a_child_is_read_at_latest() {
        let shards = [shard("s1", None, true)];
        let plan = plan(&shards, None, StartPosition::Latest, NOW_MS);
        assert_eq!(starts(&plan), [("s1", StartAt::Latest, None)]);
    }

    #[test]
    fn a_later_run_resumes_stored_shards_and_reads_new_ones_from_the_trim_horizon() {
        let mut position = StreamsPosition::new(StreamKind::Streams, Some("arn".into()));
        position.admit(&ShardId::new("s1"), Some(1), None);
        position.advance(&ShardId::new("s1"), &seq("4960"));
        position.admit(&ShardId::new("s2"), Some(1), Some(NOW_MS));
        position.admit(&ShardId::new("s0"), Some(1), None);
        position.finish(&ShardId::new("s0"), Some(1));
        let shards = [
            shard("s0", None, true),
            shard("s1", Some("s0"), false),
            shard("s2", None, false),
            shard("s3", None, false),
        ];
        let plan = plan(&shards, Some(&position), StartPosition::Latest, NOW_MS);
        assert_eq!(
            starts(&plan),
            [
                ("s1", StartAt::After(seq("4960")), None),
                ("s2", StartAt::TrimHorizon, Some(NOW_MS)),
                ("s3", StartAt::TrimHorizon, None),
            ]
        );
    }

    #[test]
    fn the_age_is_clamped_at_zero_and_counts_from_the_floor_margin() {
        assert_eq!(age_seconds(Some(NOW_MS - 12_000), None, NOW_MS), 12.0);
        assert_eq!(age_seconds(Some(NOW_MS + 5_000), None, NOW_MS), 0.0);
        assert_eq!(age_seconds(None, None, NOW_MS), 0.0);
        let floor = NOW_MS - 10_000;
        assert_eq!(age_seconds(Some(0), Some(floor), NOW_MS), 130.0);
        assert_eq!(age_seconds(Some(NOW_MS - 1_000), Some(floor), NOW_MS), 1.0);
    }

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
