//! One probe of `ddbpipe lag` (docs/streams.md §4.11, steps 3 to 5): where the next run would
//! start each shard, and the age of the first record after that point.

use std::sync::Arc;

use ddbpipe_source::api::{RecordsPage, StartAt, StreamsApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::position::{StreamKind, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::streams::lineage::ShardGraph;
use ddbpipe_source::streams::shard_reader::{MAX_YIELD, READ_SPACING};
use ddbpipe_source::streams::start::{FLOOR_MARGIN_MS, ShardStart, start_for};
use tokio::task::JoinSet;

/// Empty `GetRecords` answers in a row after which a shard counts as caught up (docs/streams.md §4.9).
const EMPTY_READS: u32 = 2;

/// Where the probe of one shard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ShardProbe {
    /// The shard.
    pub shard: ShardId,
    /// Where the next run starts it.
    pub at: StartAt,
    /// The `latest` floor (unix ms) the run applies to this shard, if any.
    pub floor_ms: Option<i64>,
}

/// The shards to probe and where each starts (docs/streams.md §4.4), in id order. Finished shards, and
/// shards a `latest` first run would finish unread, are left out.
///
/// 1. A stored entry decides: `After(seq)`, or `""` → `TRIM_HORIZON` with its floor.
/// 2. No stored position (first run): the shard is described at the start, so
///    `start_position` decides; as in the run, a shard counts as closed only when its
///    successor is listed too (some emulators report an ending number on an open shard).
/// 3. Otherwise (a shard new since the last run) → `TRIM_HORIZON`.
pub(super) fn plan(
    graph: &ShardGraph,
    stored: Option<&StreamsPosition>,
    start_position: StartPosition,
    now_ms: i64,
) -> Vec<ShardProbe> {
    let first_run = stored.is_none();
    let empty = StreamsPosition::new(StreamKind::Streams, None);
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

/// Probes the planned shards, `concurrency` at once: each shard's lag, or why the value is
/// unknown (the first failure by shard id).
pub(super) async fn probe_shards<A: StreamsApi + 'static>(
    api: Arc<A>,
    stream_arn: Arc<str>,
    plan: Vec<ShardProbe>,
    retry: RetryPolicy,
    concurrency: usize,
) -> Result<Vec<(ShardId, f64)>, String> {
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
            Ok((shard, Ok(seconds))) => measured.push((shard, seconds)),
            Ok((shard, Err(error))) => failures.push((shard, error)),
            Err(panic) => return Err(format!("internal error: a probe task failed: {panic}")),
        }
    }
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    let others = failures.len().saturating_sub(1);
    match failures.into_iter().next() {
        None => Ok(measured),
        Some((shard, error)) => {
            let more = match others {
                0 => String::new(),
                n => format!(" (and {n} other shard(s) failed)"),
            };
            Err(format!("shard {shard}: {error}{more}"))
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

    use ddbpipe_source::api::ShardDescription;

    use super::*;

    fn graph(shards: &[ShardDescription]) -> ShardGraph {
        let mut graph = ShardGraph::new();
        graph.merge(shards.iter().cloned());
        graph
    }

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
        let plan = plan(&graph(&shards), None, StartPosition::TrimHorizon, NOW_MS);
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
        let plan = plan(&graph(&shards), None, StartPosition::Latest, NOW_MS);
        assert_eq!(starts(&plan), [("s2", StartAt::Latest, None)]);
    }

    #[test]
    fn an_open_shard_reported_closed_without_a_child_is_read_at_latest() {
        let shards = [shard("s1", None, true)];
        let plan = plan(&graph(&shards), None, StartPosition::Latest, NOW_MS);
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
        let plan = plan(
            &graph(&shards),
            Some(&position),
            StartPosition::Latest,
            NOW_MS,
        );
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
}
