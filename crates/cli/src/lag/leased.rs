//! `ddbpipe lag` of a pipeline with `coordination` (docs/coordination.md §11.11, §11.12): its
//! position is the shard checkpoints of its lease rows, read without taking a lease.
//!
//! # Rules
//! 1. A shared mirror with no shard row yet is in its `snapshot` phase: the progress of its
//!    segment rows is printed and there is no value. When its record (in the keyed
//!    destination) is a repair window (§11.12 rule 9), the segments are the window's
//!    incremental export data files and the report says so, with the gap and the window.
//! 2. No shard row yet (a shared stream not begun): the shards are probed as a first run
//!    starts them (`start_position`).
//! 3. Otherwise the rows are read as one process's position ([`stream_gaps::leased`]): a finished
//!    row is done, `after:<seq>` resumes after it, a row without a checkpoint (or `latest:`)
//!    starts at `TRIM_HORIZON` (with its floor). A listed shard without a row is read from
//!    `TRIM_HORIZON`, as the leader creates its row. The run's gap layers apply to that
//!    position (a checkpoint the stream trimmed, a row of a shard no longer listed, the
//!    stream of the leader row no longer the table's); a gap makes the value unknown.
//! 4. Every unfinished shard is probed as in one process, held or not; each shard is
//!    reported with the worker holding it (its configured id), and each worker with its worst
//!    shard, the shards nobody holds together.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_pipeline::leased::row_shard;
use ddbpipe_source::aws;
use ddbpipe_source::clock::rfc3339_ms;
use ddbpipe_source::config::{Mode, StartPosition};
use ddbpipe_source::lease::{Lease, UnitId};
use ddbpipe_source::position::SharedRepair;
use ddbpipe_source::retry::Cancel;
use serde_json::{Value as Json, json};

use super::{Holder, LagReport, gap_check, probed};
use crate::config::{CoordinationConfig, PipelineConfig};
use crate::failure::Failure;
use crate::state_cmd::leases;
use crate::stream_gaps;
use crate::wiring::resolve_stream;

/// The report of a shared stream or mirror (module rules).
pub(super) async fn report(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    sdk: &aws::SdkSettings,
) -> Result<LagReport, Failure> {
    let source = &config.source;
    let table_name = coordination.lease_table.as_str();
    let (rows, record) = leases::rows(config, coordination).await?;
    let holders: BTreeMap<_, Holder> = rows
        .iter()
        .filter_map(|row| {
            let holder = row.owner.as_ref().map(|owner| owner.name().to_string());
            row_shard(row).map(|shard| (shard.clone(), holder))
        })
        .collect();
    if source.mode == Mode::Mirror && holders.is_empty() {
        let repair = record
            .filter(|record| record.closed.is_none())
            .and_then(|record| record.repair);
        let report = shared_snapshot(&rows, repair.as_ref());
        return Ok(report.in_lease_table(table_name, holders));
    }
    let stream = resolve_stream(&aws::table_api(sdk), source, &Cancel::never()).await?;
    let api = Arc::new(aws::streams_api(sdk));
    let graph = stream_gaps::listed(api.as_ref(), source, &stream.arn)
        .await
        .map_err(Failure::runtime)?;
    let (stored, start_position) = if holders.is_empty() {
        let first = source.start_position.unwrap_or(StartPosition::TrimHorizon);
        (None, first)
    } else {
        let position = stream_gaps::leased(&rows, source.mode, &graph)
            .map_err(|error| Failure::runtime(anyhow!("lease table '{table_name}': {error}")))?;
        let found = gap_check(api.as_ref(), source, &stream.arn, &position, &graph).await;
        if let Some(report) = found {
            return Ok(report.in_lease_table(table_name, holders));
        }
        (Some(position), StartPosition::TrimHorizon)
    };
    let report = probed(
        api,
        source,
        &stream.arn,
        &graph,
        stored.as_ref(),
        start_position,
    )
    .await;
    Ok(report.in_lease_table(table_name, holders))
}

/// The snapshot phase of a shared mirror whose stream has no shard row yet, or its open
/// repair window (rule 1).
fn shared_snapshot(rows: &[Lease], repair: Option<&SharedRepair>) -> LagReport {
    let segments: Vec<&Lease> = rows
        .iter()
        .filter(|row| matches!(row.unit, UnitId::Segment { .. }))
        .collect();
    if let Some(repair) = repair {
        return shared_repair(&segments, repair);
    }
    if segments.is_empty() {
        return LagReport::snapshot(
            "no snapshot yet: the first workers of a shared mirror scan the table before \
             streaming"
                .to_string(),
            Json::Null,
        );
    }
    let done = segments
        .iter()
        .filter(|row| row.state.is_finished())
        .count();
    let total = segments.len();
    let progress = if done == total {
        format!(
            "shared snapshot scanned, {done} of {total} segment(s) done; streaming starts \
             after its cleanup"
        )
    } else {
        format!("shared snapshot open: {done} of {total} segment(s) done")
    };
    LagReport::snapshot(
        progress,
        json!({"segments_done": done, "total_segments": total}),
    )
}

/// An open repair window of a shared mirror (rule 1): its export's data files applied so far.
fn shared_repair(segments: &[&Lease], repair: &SharedRepair) -> LagReport {
    let done = segments
        .iter()
        .filter(|row| row.state.is_finished())
        .count();
    let total = segments.len();
    let window = format!(
        "the gap from {} to {}, window {} to {}",
        rfc3339_ms(repair.from_ms),
        rfc3339_ms(repair.to_ms),
        rfc3339_ms(repair.window_from_ms),
        rfc3339_ms(repair.window_to_ms)
    );
    let progress = if total == 0 {
        format!("shared repair open ({window}): its incremental export is not read yet")
    } else if done == total {
        let then = match repair.next() {
            Some(_) => "the next window follows its close",
            None => "streaming resumes after its close",
        };
        format!(
            "shared repair window applied ({window}), {done} of {total} export data file(s); \
             {then}"
        )
    } else {
        format!("shared repair open ({window}): {done} of {total} export data file(s) applied")
    };
    LagReport::snapshot(
        progress,
        json!({"segments_done": done, "total_segments": total, "repair": repair}),
    )
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::ids::ShardId;
    use ddbpipe_source::lease::{LeaseState, WorkerId};

    use super::super::ShardLag;
    use super::*;

    fn row(unit: &str, owner: Option<&str>, state: LeaseState) -> Lease {
        let mut lease = Lease::new(unit.parse().unwrap(), Vec::new(), 0);
        lease.owner = owner.map(|o| WorkerId::new(o).unwrap());
        lease.state = state;
        lease
    }

    #[test]
    fn a_shared_mirror_without_shard_rows_is_in_its_snapshot_phase() {
        let report = shared_snapshot(&[], None);
        assert!(report.to_text().contains("no snapshot yet"), "{report:?}");
        let rows = [
            row("segment:0/3", None, LeaseState::Done),
            row("segment:1/3", Some("w1#h/1/a"), LeaseState::Processing),
            row("segment:2/3", None, LeaseState::Pending),
        ];
        let report = shared_snapshot(&rows, None);
        assert_eq!(
            report.to_text(),
            "lag: no value (shared snapshot open: 1 of 3 segment(s) done)"
        );
        assert_eq!(
            report.to_json()["snapshot"],
            json!({"segments_done": 1, "total_segments": 3})
        );
        assert!(report.verdict(Some(60.0)).is_err());
    }

    /// Rule 1: an open repair window is not reported as a snapshot, and says what it mends.
    #[test]
    fn a_shared_repair_window_reports_its_gap_and_the_export_files_applied() {
        let repair = SharedRepair {
            from_ms: 1_700_000_000_000,
            to_ms: 1_700_003_600_000,
            window_from_ms: 1_700_000_000_000,
            window_to_ms: 1_700_001_800_000,
        };
        let window = "the gap from 2023-11-14T22:13:20.000Z to 2023-11-14T23:13:20.000Z, \
                      window 2023-11-14T22:13:20.000Z to 2023-11-14T22:43:20.000Z";
        let report = shared_snapshot(&[], Some(&repair));
        assert_eq!(
            report.to_text(),
            format!(
                "lag: no value (shared repair open ({window}): its incremental export is not \
                 read yet)"
            )
        );
        let rows = [
            row("segment:0/2", None, LeaseState::Done),
            row("segment:1/2", Some("w1#h/1/a"), LeaseState::Processing),
        ];
        let report = shared_snapshot(&rows, Some(&repair));
        assert_eq!(
            report.to_text(),
            format!(
                "lag: no value (shared repair open ({window}): 1 of 2 export data file(s) applied)"
            )
        );
        assert_eq!(
            report.to_json()["snapshot"]["repair"]["window_to_ms"],
            1_700_001_800_000_i64
        );
        assert!(report.verdict(Some(60.0)).is_err());
        let rows = [row("segment:0/1", None, LeaseState::Done)];
        let text = shared_snapshot(&rows, Some(&repair)).to_text();
        assert!(text.contains("shared repair window applied"), "{text}");
        assert!(text.contains("the next window follows"), "{text}");
        let last = SharedRepair {
            window_from_ms: repair.window_to_ms,
            window_to_ms: repair.to_ms,
            ..repair
        };
        let text = shared_snapshot(&rows, Some(&last)).to_text();
        assert!(text.contains("streaming resumes after its close"), "{text}");
    }

    #[test]
    fn each_worker_reports_its_worst_shard_and_unheld_shards_count_together() {
        let lag = |shard: &str, seconds| ShardLag {
            shard: ShardId::new(shard),
            seconds,
        };
        let holders: BTreeMap<ShardId, Holder> = [
            ("a", Some("w2")),
            ("b", Some("w1")),
            ("c", Some("w1")),
            ("d", None),
        ]
        .into_iter()
        .map(|(shard, holder)| (ShardId::new(shard), holder.map(str::to_string)))
        .collect();
        let report = LagReport::measured(vec![
            lag("a", 1.0),
            lag("b", 3.0),
            lag("c", 7.5),
            lag("d", 12.0),
        ])
        .in_lease_table("leases", holders);
        assert_eq!(report.seconds, Some(12.0));
        assert_eq!(
            report.to_text(),
            "lag: 12.0 s (shard d 12.0 s, shard c 7.5 s, shard b 3.0 s, shard a 1.0 s); \
             workers: w1 7.5 s (2 shard(s)), w2 1.0 s (1 shard(s)), unheld 12.0 s (1 shard(s))"
        );
        let out = report.to_json();
        assert_eq!(out["lease_table"], "leases");
        assert_eq!(
            out["workers"],
            json!([
                {"lag_seconds": 7.5, "shards": 2, "worker": "w1"},
                {"lag_seconds": 1.0, "shards": 1, "worker": "w2"},
                {"lag_seconds": 12.0, "shards": 1, "worker": null},
            ])
        );
        assert_eq!(
            out["shards"][3],
            json!({"lag_seconds": 12.0, "shard_id": "d", "worker": null})
        );
        assert_eq!(out["shards"][2]["worker"], "w1");
    }
}
