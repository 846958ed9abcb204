//! Where a taken shard starts, and the rows a listing creates (docs/coordination.md §11.11,
//! rows and checkpoints).

use ddbpipe_source::api::ShardDescription;
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::ids::SequenceNumber;
use ddbpipe_source::lease::{LeaseError, LeaseState, UnitId, UnitSpec};
use ddbpipe_source::streams::lineage::ShardGraph;

use super::END_CHECKPOINT;
use crate::runner::RunError;

/// Where a taken shard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Start {
    TrimHorizon,
    After(SequenceNumber),
    /// From `TRIM_HORIZON`, dropping records created before this unix ms.
    Since(i64),
}

/// The start of a lease row's checkpoint; a row this version cannot read stops the run.
pub(super) fn decode_checkpoint(unit: &UnitId, text: Option<&str>) -> Result<Start, RunError> {
    let bad = || {
        RunError::Lease(LeaseError::Fatal(format!(
            "lease {unit}: its checkpoint '{}' is not a shard position (after:<sequence \
             number>, latest:<unix ms>); run `ddbpipe state reset` once no worker runs",
            text.unwrap_or_default()
        )))
    };
    let Some(text) = text else {
        return Ok(Start::TrimHorizon);
    };
    if let Some(seq) = text.strip_prefix("after:") {
        return SequenceNumber::parse(seq)
            .map(Start::After)
            .map_err(|_| bad());
    }
    if let Some(ms) = text.strip_prefix("latest:") {
        return ms.parse().map(Start::Since).map_err(|_| bad());
    }
    Err(bad())
}

/// The lease rows of a listing. On a first run (`first` holds its start position) under
/// `latest`, open shards start at the run's start and closed ones are created finished.
/// A shard counts as closed only when a child is listed (some emulators report an ending
/// sequence number on an open shard).
pub(super) fn shard_specs(
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
                    spec.starting(END_CHECKPOINT, LeaseState::ShardEnd)
                }
                Some(StartPosition::Latest) => {
                    spec.starting(format!("latest:{now_ms}"), LeaseState::Pending)
                }
                _ => spec,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ddbpipe_source::ids::ShardId;

    use super::*;

    fn shard(id: &str, parent: Option<&str>, closed: bool) -> ShardDescription {
        ShardDescription {
            id: ShardId::new(id),
            parent: parent.map(ShardId::new),
            closed,
        }
    }

    #[test]
    fn checkpoints_name_where_a_shard_starts() {
        let unit = UnitId::Shard(ShardId::new("s"));
        assert_eq!(decode_checkpoint(&unit, None).unwrap(), Start::TrimHorizon);
        assert_eq!(
            decode_checkpoint(&unit, Some("after:000000000000000000123")).unwrap(),
            Start::After(SequenceNumber::parse("000000000000000000123").unwrap())
        );
        assert_eq!(
            decode_checkpoint(&unit, Some("latest:1767225600000")).unwrap(),
            Start::Since(1767225600000)
        );
        for bad in ["after:x", "latest:", "end", "7"] {
            let error = decode_checkpoint(&unit, Some(bad)).unwrap_err().to_string();
            assert!(
                error.contains("lease shard:s") && error.contains(bad),
                "{error}"
            );
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
        assert_eq!(by["shard:a"].checkpoint.as_deref(), Some("end"));
        assert_eq!(by["shard:b"].checkpoint.as_deref(), Some("latest:42"));
        assert_eq!(
            by["shard:b"].parents,
            vec![UnitId::Shard(ShardId::new("a"))]
        );
        assert_eq!(by["shard:c"].checkpoint.as_deref(), Some("latest:42"));
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
}
