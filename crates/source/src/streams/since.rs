//! Whether a table's stream still holds every change made since an instant: before a snapshot
//! reads an export taken earlier (`source.snapshot.export_arn`), the stream must cover the
//! time between the export and the capture, or the changes made then are lost
//! (docs/scan.md §2.10, docs/mirror.md §5.1).
//!
//! # Rules
//! 1. The stream is trimmed by age, oldest records first, along each lineage: a shard still
//!    holds a record created before `since` only if nothing after `since` was trimmed from it
//!    or from the shards after it.
//! 2. So the proof asks the roots of the described lineages (shards whose parent is not
//!    described): each must hold, at its trim horizon, a record created a whole second before
//!    `since` (`ApproximateCreationDateTime` has whole seconds). A child of a described shard
//!    is covered by its parent.
//! 3. A root whose oldest record is not older — it was trimmed past `since`, its parent
//!    expired, or nothing was written to it before `since` — cannot prove it: a reason naming
//!    the shard. What the stream holds decides, never the local clock or a retention guess; an
//!    idle table's stream that keeps no record older than the export cannot prove it either.
//! 4. At most [`PAGES`] `GetRecords` of one record are read per root (a trim horizon may
//!    answer empty pages first); a root still without a record then is a reason too.

use crate::api::{StartAt, StreamsApi};
use crate::error::ReadError;
use crate::ids::ShardId;
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};
use crate::streams::lineage::ShardGraph;

/// `GetRecords` read per root shard at most (rule 4).
pub const PAGES: usize = 5;

/// The reasons the stream `stream_arn`, described as `graph`, cannot prove it holds every
/// change since `since_ms` (unix ms); empty when it does.
pub async fn unproven_since<A: StreamsApi>(
    api: &A,
    stream_arn: &str,
    graph: &ShardGraph,
    since_ms: i64,
    retry: &RetryPolicy,
    cancel: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<Vec<String>, ReadError> {
    let roots: Vec<&ShardId> = graph
        .ids()
        .filter(|id| {
            graph
                .get(id)
                .and_then(|shard| shard.parent.as_ref())
                .is_none_or(|parent| !graph.contains(parent))
        })
        .collect();
    let mut reasons = Vec::new();
    for shard in roots {
        let oldest = oldest_record_ms(api, stream_arn, shard, retry, cancel, observer).await?;
        match oldest {
            Some(created_ms) if created_ms + 1000 <= since_ms => {}
            Some(created_ms) => reasons.push(format!(
                "shard {shard}'s oldest record is from {created_ms} (unix ms), not before the \
                 export's time {since_ms}: the changes in between may have been trimmed"
            )),
            None => reasons.push(format!(
                "shard {shard} holds no record from before the export's time {since_ms}: the \
                 changes since then may have been trimmed"
            )),
        }
    }
    Ok(reasons)
}

/// The creation time of the oldest record `shard` still holds (rule 4).
async fn oldest_record_ms<A: StreamsApi>(
    api: &A,
    stream_arn: &str,
    shard: &ShardId,
    retry: &RetryPolicy,
    cancel: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<Option<i64>, ReadError> {
    let what = || format!("GetShardIterator(TRIM_HORIZON) of shard {shard}");
    let mut iterator = retry
        .run("get_shard_iterator", what, cancel, observer, |_| {
            api.shard_iterator(stream_arn, shard, &StartAt::TrimHorizon)
        })
        .await?;
    for _ in 0..PAGES {
        let Some(current) = iterator else {
            return Ok(None);
        };
        let what = || format!("GetRecords of shard {shard}");
        let page = retry
            .run("get_records", what, cancel, observer, |_| {
                api.get_records(&current, 1)
            })
            .await?;
        if let Some(record) = page.records.first() {
            return Ok(record.change.as_ref().and_then(|change| change.created_ms));
        }
        iterator = page.next_iterator;
    }
    Ok(None)
}
