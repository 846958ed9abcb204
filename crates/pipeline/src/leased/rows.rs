//! What a shard's lease row says (docs/coordination.md §11.11, rows and checkpoints): the rows
//! a listing creates, the gaps a listing finds, and the stream position the rows hold together,
//! as one process would store it (`lag` and `check` read a shared stream through it). The
//! checkpoints' stored forms are `ddbpipe_source::position::LeaseCheckpoint`'s:
//! - none: the shard is read from `TRIM_HORIZON`, unverified (a row of an earlier version);
//! - `Verified { at_ms, floor_ms }`: from `TRIM_HORIZON`, nothing read yet, every record
//!   created before `at_ms` delivered or not needed (the leader's stamp, refreshed while the
//!   shard reads empty);
//! - `After(seq)`: after it;
//! - `Latest { since_ms }`: from `TRIM_HORIZON`, dropping records created before that time
//!   (less the floor's margin), as a first run with `start_position: latest` creates open
//!   shards; verified at that time;
//! - `ShardEnd`: read to its end.
//!
//! # The verification a new row gets (docs/streams.md §4.5's `verified_at` for lease rows)
//! 1. The pipeline's first listing (no shard row yet): the run's start (a shared mirror: its
//!    snapshot's start). Older history is best effort, as on one process's first run.
//! 2. A shard a later listing finds: the start of the leader's last listing that did not
//!    describe it, less [`LISTING_MARGIN_MS`]. It did not exist then, so every record of it
//!    is newer. (Stamping it with the listing's own time would hide the trim of a child found
//!    late, which the reference connector did.)
//! 3. A shard found by a leader's first listing over existing rows: no stamp; the worker
//!    taking its row warns that it cannot be checked, as one process does for a shard without
//!    `verified_at`.
//!
//! # Gaps a listing finds (docs/streams.md §4.5 layer 2, second half)
//! A listed shard without a row whose parent is neither listed nor has a row: the parent
//! expired unread, its changes are gone. The leader stops before it writes a row, except on
//! the pipeline's first listing, where older history is best effort.

use std::collections::BTreeSet;

use ddbpipe_source::api::{ShardDescription, StartAt};
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::lease::{Lease, UnitId, UnitSpec};
use ddbpipe_source::position::{LeaseCheckpoint, StreamKind, StreamsPosition};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::leased::leased_start;
use ddbpipe_source::streams::lineage::ShardGraph;

use crate::runner::RunError;

/// How much earlier than a listing's start a shard it did not describe may have been created
/// (`DescribeStream` shows a new shard late): the frontier's margin, docs/streams.md §4.5.
pub(crate) const LISTING_MARGIN_MS: i64 = 120_000;

/// The lease rows of a listing. On a first run (`first` holds its start position) under
/// `latest`, open shards start at the run's start and closed ones are created finished.
/// A shard counts as closed only when a child is listed (some emulators report an ending
/// sequence number on an open shard). Otherwise a shard's row is created verified at
/// `verified(shard)` (module docs), when that gives a time.
pub(crate) fn shard_specs(
    shards: Vec<ShardDescription>,
    first: Option<StartPosition>,
    now_ms: i64,
    verified: impl Fn(&ShardId) -> Option<i64>,
) -> Vec<UnitSpec> {
    let mut graph = ShardGraph::new();
    graph.merge(shards);
    graph
        .ids()
        .filter_map(|id| graph.with_trusted_closed(id))
        .map(|shard| {
            let spec = UnitSpec::shard(&shard);
            match (first, verified(&shard.id)) {
                (Some(StartPosition::Latest), _) if shard.closed => {
                    spec.starting(LeaseCheckpoint::ShardEnd)
                }
                (Some(StartPosition::Latest), _) => {
                    spec.starting(LeaseCheckpoint::Latest { since_ms: now_ms })
                }
                (_, Some(at_ms)) => spec.starting(LeaseCheckpoint::verified(at_ms, None)),
                (_, None) => spec,
            }
        })
        .collect()
}

/// The gaps a later listing of `shards` finds against the pipeline's `rows` (module docs):
/// "shard <id>'s parent <p> expired unread" for every listed shard without a row whose parent
/// is neither listed nor has a row.
pub(crate) fn listing_gaps(shards: &[ShardDescription], rows: &[Lease]) -> Vec<String> {
    let mut graph = ShardGraph::new();
    graph.merge(shards.iter().cloned());
    let known: BTreeSet<&ShardId> = rows.iter().filter_map(row_shard).collect();
    gaps::expired_parents(&graph, |id| known.contains(id))
}

/// The stream position the shard rows of a shared stream hold, as one process would store it
/// (docs/streams.md §4.4): a finished row is `ShardEnd`, `after:<seq>` is positioned, a row
/// without a checkpoint is at its trim horizon unverified, a `verified:` row at its trim
/// horizon verified then (with its floor), a `latest:<ms>` row at its trim horizon with that
/// floor, verified then. Rows of other units are left out; a row whose checkpoint this version cannot
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
            Some((_, floor_ms)) => {
                let verified_at = (row.checkpoint.as_ref())
                    .and_then(LeaseCheckpoint::verified_ms)
                    .map(|ms| ms.div_euclid(1000));
                position.admit(shard, verified_at, floor_ms);
            }
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

/// [`leased_position`] with every listed shard that has no row yet at its trim horizon,
/// unverified, as its row is read before the leader stamps it (`lag` and `check` look at a
/// shared stream through it) — except a shard whose parent is neither listed nor has a row:
/// it is left out, so the start-up gap layers name it ("shard <id>'s parent <p> expired
/// unread", docs/streams.md §4.5 layer 2), as the leader's listing stops on it.
pub fn listed_position(
    rows: &[Lease],
    kind: StreamKind,
    stream_arn: Option<String>,
    graph: &ShardGraph,
) -> Result<StreamsPosition, RunError> {
    let mut position = leased_position(rows, kind, stream_arn)?;
    let known: BTreeSet<&ShardId> = rows.iter().filter_map(row_shard).collect();
    let orphans: BTreeSet<&ShardId> = gaps::orphans(graph, |id| known.contains(id))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for id in graph.ids().filter(|id| !orphans.contains(id)) {
        position.admit(id, None, None);
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
        let specs = shard_specs(shards(), Some(StartPosition::Latest), 42, |_| Some(40));
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
            let specs = shard_specs(shards(), later, 42, |_| None);
            assert!(
                specs
                    .iter()
                    .all(|s| s.checkpoint.is_none() && s.state == LeaseState::Pending),
                "{later:?}"
            );
        }
    }

    /// Rows of shards with nothing read are created with the verification the listing gives
    /// them (module docs): the run's start on a first listing, a later listing's bound for a
    /// shard it found; none when it knows none.
    #[test]
    fn a_row_with_nothing_read_is_created_verified_at_what_the_listing_knows() {
        let shards = vec![shard("a", None, true), shard("b", Some("a"), false)];
        let verified = |id: &ShardId| (id.as_str() == "b").then_some(1_000);
        let specs = shard_specs(shards, Some(StartPosition::TrimHorizon), 42, verified);
        let text = |unit: &str| {
            specs
                .iter()
                .find(|s| s.unit.to_string() == unit)
                .and_then(|s| s.checkpoint.as_ref().map(LeaseCheckpoint::encode))
        };
        assert_eq!(text("shard:b").as_deref(), Some("verified:1000"));
        assert_eq!(text("shard:a"), None);
        assert!(specs.iter().all(|s| s.state == LeaseState::Pending));
    }

    /// A listed shard without a row whose parent is neither listed nor has a row is a gap;
    /// a parent listed, or with a row (finished or not), is not.
    #[test]
    fn a_listed_shard_whose_parent_expired_unread_is_a_gap() {
        let rows = [
            row("shard:p1", Some("end"), LeaseState::ShardEnd),
            row("shard:p2", None, LeaseState::Pending),
            row(
                "shard:held",
                Some("after:000000000000000000123"),
                LeaseState::Processing,
            ),
        ];
        let listing = [
            shard("c1", Some("p1"), false),
            shard("c2", Some("p2"), false),
            shard("c3", Some("listed"), false),
            shard("listed", None, true),
            shard("c4", Some("gone"), false),
            shard("held", Some("gone too"), false),
            shard("root", None, false),
        ];
        assert_eq!(
            listing_gaps(&listing, &rows),
            vec!["shard c4's parent gone expired unread"]
        );
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

    /// `check` and `lag` see what the leader's listing sees: a listed shard without a row is
    /// admitted unverified, one whose parent expired unread is left out and is the gap.
    #[test]
    fn a_listed_shard_whose_parent_expired_unread_is_the_gap_check_reports() {
        let rows = [
            row("shard:p", Some("end"), LeaseState::ShardEnd),
            row(
                "shard:q",
                Some("after:000000000000000000123"),
                LeaseState::Processing,
            ),
        ];
        let mut graph = ShardGraph::new();
        graph.merge([
            shard("q", None, false),
            shard("c", Some("p"), false),
            shard("orphan", Some("gone"), false),
        ]);
        let position =
            listed_position(&rows, StreamKind::Streams, Some("arn".into()), &graph).unwrap();
        assert_eq!(
            position.progress(&ShardId::new("c")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: None,
                floor_ms: None
            })
        );
        assert_eq!(position.progress(&ShardId::new("orphan")), None);
        let findings = gaps::check(&position, "arn", &graph, "t", 0);
        assert_eq!(
            findings.reasons,
            vec!["shard orphan's parent gone expired unread"]
        );
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
            row(
                "shard:e",
                Some("verified:1767229200999"),
                LeaseState::Pending,
            ),
            row(
                "shard:f",
                Some("verified:1767229200000,latest:1767225600000"),
                LeaseState::Pending,
            ),
        ];
        let position = leased_position(&rows, StreamKind::Streams, Some("arn".into())).unwrap();
        let id = |s: &str| ShardId::new(s);
        assert_eq!(position.shards.len(), 6, "{position:?}");
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
                verified_at: Some(1767225600),
                floor_ms: Some(1767225600000)
            })
        );
        assert_eq!(
            position.progress(&id("e")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: Some(1767229200),
                floor_ms: None
            })
        );
        assert_eq!(
            position.progress(&id("f")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: Some(1767229200),
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
