//! What a shard's lease row says (docs/coordination.md §11.11, rows and checkpoints): the rows
//! a listing creates, and the stream position the rows hold together, as one process would
//! store it (`lag` and `check` read a shared stream through it). The checkpoints' stored forms are
//! `ddbpipe_source::position::LeaseCheckpoint`'s:
//! - none: the shard is read from `TRIM_HORIZON`;
//! - `After(seq)`: after it;
//! - `Latest { since_ms }`: from `TRIM_HORIZON`, dropping records created before that time
//!   (less the floor's margin), as a first run with `start_position: latest` creates open
//!   shards;
//! - `ShardEnd`: read to its end.

use ddbpipe_source::api::{ShardDescription, StartAt};
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::lease::{Lease, UnitId, UnitSpec};
use ddbpipe_source::position::{LeaseCheckpoint, StreamKind, StreamsPosition};
use ddbpipe_source::streams::leased::leased_start;
use ddbpipe_source::streams::lineage::ShardGraph;

use crate::runner::RunError;

/// The lease rows of a listing. On a first run (`first` holds its start position) under
/// `latest`, open shards start at the run's start and closed ones are created finished.
/// A shard counts as closed only when a child is listed (some emulators report an ending
/// sequence number on an open shard).
pub(crate) fn shard_specs(
    shards: Vec<ShardDescription>,
    first: Option<StartPosition>,
    now_ms: i64,
) -> Vec<UnitSpec> {
    let mut graph = ShardGraph::new();
    graph.merge(shards);
    graph
        .ids()
        .filter_map(|id| graph.with_trusted_closed(id))
        .map(|shard| {
            let spec = UnitSpec::shard(&shard);
            match first {
                Some(StartPosition::Latest) if shard.closed => {
                    spec.starting(LeaseCheckpoint::ShardEnd)
                }
                Some(StartPosition::Latest) => {
                    spec.starting(LeaseCheckpoint::Latest { since_ms: now_ms })
                }
                _ => spec,
            }
        })
        .collect()
}

/// The stream position the shard rows of a shared stream hold, as one process would store it
/// (docs/streams.md §4.4): a finished row is `ShardEnd`, `after:<seq>` is positioned, a row
/// without a checkpoint is at its trim horizon, a `latest:<ms>` row at its trim horizon with
/// that floor. Rows of other units are left out; a row whose checkpoint this version cannot
/// read is an error naming it. `lag` and `check` look at a shared stream through it, with the
/// single-process gap layers and start rules.
pub fn leased_position(
    rows: &[Lease],
    kind: StreamKind,
    stream_arn: Option<String>,
) -> Result<StreamsPosition, RunError> {
    let mut position = StreamsPosition::new(kind, stream_arn);
    for row in rows {
        let UnitId::Shard(shard) = &row.unit else {
            continue;
        };
        if row.state.is_finished() {
            position.finish(shard, None);
            continue;
        }
        match leased_start(row.checkpoint.as_ref()) {
            Some((StartAt::After(seq), _)) => position.advance(shard, &seq),
            Some((_, floor_ms)) => position.admit(shard, None, floor_ms),
            None => {
                let at = row
                    .checkpoint
                    .clone()
                    .unwrap_or(LeaseCheckpoint::Unknown(String::new()));
                return Err(super::unreadable(&row.unit, &at));
            }
        }
    }
    Ok(position)
}

/// The shard a row is for, when it is a shard's.
pub fn row_shard(row: &Lease) -> Option<&ShardId> {
    match &row.unit {
        UnitId::Shard(shard) => Some(shard),
        UnitId::Leader | UnitId::Segment { .. } | UnitId::Worker(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ddbpipe_source::ids::SequenceNumber;
    use ddbpipe_source::lease::{LeaseCounter, LeaseState, WorkerId};

    use ddbpipe_source::position::ShardProgress;

    use super::*;

    fn shard(id: &str, parent: Option<&str>, closed: bool) -> ShardDescription {
        ShardDescription {
            id: ShardId::new(id),
            parent: parent.map(ShardId::new),
            closed,
        }
    }

    #[test]
    fn a_first_latest_run_skips_closed_shards_and_starts_open_ones_at_its_start() {
        let shards = || {
            vec![
                shard("a", None, true),
                shard("b", Some("a"), false),
                // Closed but childless: an emulator's open shard; read it.
                shard("c", None, true),
            ]
        };
        let specs = shard_specs(shards(), Some(StartPosition::Latest), 42);
        let by: BTreeMap<String, &UnitSpec> =
            specs.iter().map(|s| (s.unit.to_string(), s)).collect();
        assert_eq!(by["shard:a"].state, LeaseState::ShardEnd);
        let text = |unit: &str| by[unit].checkpoint.as_ref().map(LeaseCheckpoint::encode);
        assert_eq!(text("shard:a").as_deref(), Some("end"));
        assert_eq!(text("shard:b").as_deref(), Some("latest:42"));
        assert_eq!(
            by["shard:b"].parents,
            vec![UnitId::Shard(ShardId::new("a"))]
        );
        assert_eq!(text("shard:c").as_deref(), Some("latest:42"));
        assert_eq!(by["shard:c"].state, LeaseState::Pending);
        for later in [None, Some(StartPosition::TrimHorizon)] {
            let specs = shard_specs(shards(), later, 42);
            assert!(
                specs
                    .iter()
                    .all(|s| s.checkpoint.is_none() && s.state == LeaseState::Pending),
                "{later:?}"
            );
        }
    }

    fn row(unit: &str, checkpoint: Option<&str>, state: LeaseState) -> Lease {
        let unit: UnitId = unit.parse().unwrap();
        let mut lease = Lease::new(unit.clone(), Vec::new(), 0);
        lease.checkpoint = checkpoint.map(|text| unit.checkpoint(text));
        lease.state = state;
        lease.counter = LeaseCounter(3);
        lease.owner = Some(WorkerId::new("w1").unwrap());
        lease
    }

    #[test]
    fn the_shard_rows_hold_the_position_one_process_would_store() {
        let rows = [
            row("leader", Some("{}"), LeaseState::Processing),
            row("segment:0/2", Some("done"), LeaseState::Done),
            row("shard:a", Some("end"), LeaseState::ShardEnd),
            row(
                "shard:b",
                Some("after:000000000000000000123"),
                LeaseState::Processing,
            ),
            row("shard:c", None, LeaseState::Pending),
            row("shard:d", Some("latest:1767225600000"), LeaseState::Pending),
        ];
        let position = leased_position(&rows, StreamKind::Streams, Some("arn".into())).unwrap();
        let id = |s: &str| ShardId::new(s);
        assert_eq!(position.shards.len(), 4, "{position:?}");
        assert!(position.is_finished(&id("a")));
        assert_eq!(
            position.progress(&id("b")),
            Some(&ShardProgress::After(
                SequenceNumber::parse("000000000000000000123").unwrap()
            ))
        );
        assert_eq!(
            position.progress(&id("c")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: None,
                floor_ms: None
            })
        );
        assert_eq!(
            position.progress(&id("d")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: None,
                floor_ms: Some(1767225600000)
            })
        );
        assert_eq!(position.stream_arn.as_deref(), Some("arn"));
        let bad = [row("shard:e", Some("after:x"), LeaseState::Processing)];
        let error = leased_position(&bad, StreamKind::Streams, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("lease shard:e") && error.contains("'after:x'"),
            "{error}"
        );
    }
}
