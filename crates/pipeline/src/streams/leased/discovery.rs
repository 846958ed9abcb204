//! The leader's discovery and the worker's gauges (docs/coordination.md §11.11 run rule 1,
//! the shard gauges and lag): when the stream is listed, the rows a listing writes, and what a
//! round measures.

use std::sync::atomic::Ordering;

use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::events::{LagMeasured, ShardsCounted};
use ddbpipe_source::lease::{LeaseTable, UnitId};
use ddbpipe_source::streams::engine::{LagInfo, running_lag};
use ddbpipe_source::streams::shard_sync;
use tokio::time::Instant;

use super::{CHILD_LOOKUP_INTERVAL, Shared};
use crate::runner::RunError;
use crate::streams::lease_rows::shard_specs;

impl<A: StreamsApi + 'static, T: LeaseTable> Shared<A, T> {
    /// Whether the leader lists the stream this round (module docs, Discovery).
    pub(super) fn listing_due(&self) -> bool {
        let Some(at) = self.listed_at else {
            return true;
        };
        let since = at.elapsed();
        if since >= self.run.bounds.discovery_interval {
            return true;
        }
        let rows = self.worker.rows();
        let childless_end = rows.iter().any(|row| {
            matches!(row.unit, UnitId::Shard(_))
                && row.state.is_finished()
                && !rows.iter().any(|child| child.parents.contains(&row.unit))
        });
        childless_end && !self.disabled && since >= CHILD_LOOKUP_INTERVAL
    }

    /// Lists the stream and writes the rows of its shards; returns whether rows were created.
    pub(super) async fn sync_shards(&mut self) -> Result<bool, RunError> {
        let discovery = match shard_sync::discover(
            self.api.as_ref(),
            &self.run.stream_arn,
            &self.run.retry,
            &self.stop,
            self.observer.as_ref(),
        )
        .await
        {
            Ok(discovery) => discovery,
            Err(ReadError::Cancelled) => return Ok(false),
            Err(error) => return Err(RunError::Read(error)),
        };
        self.listed_at = Some(Instant::now());
        self.disabled = discovery.status.as_deref() == Some("DISABLED");
        let first = !self
            .worker
            .rows()
            .iter()
            .any(|row| matches!(row.unit, UnitId::Shard(_)));
        let mut specs = shard_specs(
            discovery.shards,
            first.then_some(self.run.start_position),
            unix_now_ms(),
        );
        let shards = specs.len();
        specs.extend(self.kept.iter().cloned());
        let synced = self.worker.sync(&specs).await?;
        for error in &synced.transient {
            tracing::debug!(error = %error, "A lease row could not be written; the next listing retries it.");
        }
        if !synced.created.is_empty() {
            tracing::info!(
                created = synced.created.len(),
                shards,
                "Shard leases created."
            );
        }
        Ok(!synced.created.is_empty())
    }

    /// The shard counts and the running lag of the shards this worker holds, as one process
    /// reports them (docs/streams.md §4.11): the age of the newest record read by a shard not
    /// caught up, 0 for caught-up ones.
    pub(super) fn measure(&self) {
        let shards: Vec<LagInfo> = self
            .held
            .values()
            .filter(|holding| !holding.ended)
            .map(|holding| {
                let newest = holding.newest_ms.load(Ordering::Relaxed);
                LagInfo {
                    newest_ts_ms: (newest != i64::MIN).then_some(newest),
                    caught_up: holding.caught_up.load(Ordering::Relaxed),
                }
            })
            .collect();
        let lag = running_lag(shards.iter(), unix_now_ms());
        LagMeasured { seconds: lag }.emit();
        ShardsCounted {
            queued: 0,
            active: self.held.len() as u64,
            finished: self.shard_rows().0,
        }
        .emit();
    }

    /// (finished, all) shard rows in the lease table.
    pub(super) fn shard_rows(&self) -> (u64, u64) {
        let rows = self.worker.rows();
        let shards = rows
            .iter()
            .filter(|row| matches!(row.unit, UnitId::Shard(_)));
        let all = shards.clone().count() as u64;
        let finished = shards.filter(|row| row.state.is_finished()).count() as u64;
        (finished, all)
    }
}
