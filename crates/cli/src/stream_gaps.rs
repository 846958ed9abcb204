//! The run's start-up gap layers (docs/streams.md §4.5) for the commands that only look: `lag`
//! (docs/streams.md §4.11) and `check` (docs/cli.md §8.2) list the stream and ask
//! [`startup::gap_findings`], the function the run asks, so they report the gap the next run
//! stops (or resnapshots, or repairs) on: a stored stream that is not the table's, a stored
//! shard no longer listed, a shard last read empty longer ago than the retention, a position
//! the stream trimmed.
//!
//! The layer-4 probe opens `GetShardIterator(AFTER_SEQUENCE_NUMBER)` for each positioned shard
//! and reads nothing; its iterators are dropped.

use std::collections::BTreeMap;

use ddbpipe_pipeline::leased::listed_position;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::config::{Mode, OnGap, SourceConfig};
use ddbpipe_source::error::ReadError;
use ddbpipe_source::lease::{Lease, UnitId};
use ddbpipe_source::position::{StreamKind, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver};
use ddbpipe_source::streams::gaps::Findings;
use ddbpipe_source::streams::lineage::ShardGraph;
use ddbpipe_source::streams::{shard_sync, startup};

/// Every shard `stream_arn` lists now (all pages), through the source's retry policy.
pub async fn listed<A: StreamsApi>(
    api: &A,
    source: &SourceConfig,
    stream_arn: &str,
) -> Result<ShardGraph, ReadError> {
    let retry = source.retry.policy();
    let discovery =
        shard_sync::discover(api, stream_arn, &retry, &Cancel::never(), &NoObserver).await?;
    let mut graph = ShardGraph::new();
    graph.merge(discovery.shards);
    Ok(graph)
}

/// What the start-up of the next run finds in `stored` on `graph` now: its gap reasons
/// (layers 1–4) and warnings.
pub async fn findings<A: StreamsApi>(
    api: &A,
    source: &SourceConfig,
    stream_arn: &str,
    stored: &StreamsPosition,
    graph: &ShardGraph,
) -> Result<Findings, ReadError> {
    startup::gap_findings(
        api,
        stored,
        stream_arn,
        graph,
        &source.table_name,
        unix_now_ms() / 1000,
        source.shard_concurrency,
        &source.retry.policy(),
        &Cancel::never(),
        &mut BTreeMap::new(),
        &NoObserver,
    )
    .await
}

/// `<reasons>: the stored position cannot be resumed without losing changes; the next run
/// applies on_gap: <setting>`.
pub fn unresumable(reasons: &[String], on_gap: OnGap) -> String {
    format!(
        "{}: the stored position cannot be resumed without losing changes; the next run \
         applies on_gap: {}",
        reasons.join("; "),
        on_gap.as_str()
    )
}

/// The position a shared stream's lease rows hold, as its next worker reads it
/// (docs/coordination.md §11.11): [`listed_position`] of the rows, on the stream the leader
/// row names: every listed shard without a row at its trim horizon (the leader creates its
/// row so), except a child whose parent expired unread, which the gap layers name as the
/// leader's listing does. `Err` names a row this version cannot read.
pub fn leased(rows: &[Lease], mode: Mode, graph: &ShardGraph) -> Result<StreamsPosition, String> {
    let kind = match mode {
        Mode::Mirror => StreamKind::Mirror,
        _ => StreamKind::Streams,
    };
    listed_position(rows, kind, leader_stream(rows), graph).map_err(|error| error.to_string())
}

/// The stream the pipeline's leader row names (its run's identity keeps the stream read).
fn leader_stream(rows: &[Lease]) -> Option<String> {
    let leader = rows.iter().find(|row| row.unit == UnitId::Leader)?;
    let identity = Identity::parse(leader.settings()?)?;
    identity.stream_arn().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::api::ShardDescription;
    use ddbpipe_source::ids::ShardId;
    use ddbpipe_source::lease::LeaseState;
    use ddbpipe_source::position::ShardProgress;

    use super::*;

    #[test]
    fn a_shared_position_is_on_the_leader_rows_stream_and_holds_every_listed_shard() {
        let mut leader = Lease::new(UnitId::Leader, Vec::new(), 0);
        leader.checkpoint =
            Some(UnitId::Leader.checkpoint(r#"{"stream_arn":"arn:1","table":"t"}"#));
        let mut positioned = Lease::new("shard:a".parse().unwrap(), Vec::new(), 0);
        positioned.checkpoint = Some(positioned.unit.checkpoint("after:000000000000000000123"));
        positioned.state = LeaseState::Processing;
        let mut graph = ShardGraph::new();
        graph.merge(["a", "b"].map(|id| ShardDescription {
            id: ShardId::new(id),
            parent: None,
            closed: false,
        }));
        let position = leased(&[leader, positioned], Mode::Streams, &graph).unwrap();
        assert_eq!(position.stream_arn.as_deref(), Some("arn:1"));
        assert!(matches!(
            position.progress(&ShardId::new("a")),
            Some(ShardProgress::After(_))
        ));
        assert_eq!(
            position.progress(&ShardId::new("b")),
            Some(&ShardProgress::TrimHorizon {
                verified_at: None,
                floor_ms: None
            })
        );
        let position = leased(&[], Mode::Streams, &graph).unwrap();
        assert_eq!(position.stream_arn, None);
    }
}
