//! One leased shard's read (docs/coordination.md §11.11 run rule 2): from where its lease
//! checkpoint says, slice after slice with a read slot per slice, until the shard drains or its
//! lease is lost. A worker of a shared stream asks for these reads instead of driving shard
//! states itself; the slices are the engine's (`shard_reader`), so a shard reads the same under
//! a lease as in one process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use tokio::sync::{Semaphore, mpsc};

use super::gaps;
use super::handover::{Handed, Handover};
use super::shard_reader::{ShardState, SliceEnd, StreamContext, StreamError, StreamReads};
use crate::api::{StartAt, StreamsApi};
use crate::ids::ShardId;
use crate::lease::{Lease, UnitId};
use crate::position::{LeaseCheckpoint, ShardProgress, StreamKind, StreamsPosition};
use crate::retry::Cancel;

/// Where a shard whose lease row is at `checkpoint` is read from: the iterator's start and the
/// floor below which records are dropped (`Latest`: a first run from `latest`, read from
/// `TRIM_HORIZON` so that a take-over before the first checkpoint loses nothing; `Verified`
/// keeps that floor). `None`: the checkpoint is not an unfinished shard's.
pub fn leased_start(checkpoint: Option<&LeaseCheckpoint>) -> Option<(StartAt, Option<i64>)> {
    match checkpoint {
        None => Some((StartAt::TrimHorizon, None)),
        Some(LeaseCheckpoint::After { seq, .. }) => Some((StartAt::After(seq.clone()), None)),
        Some(at @ (LeaseCheckpoint::Latest { .. } | LeaseCheckpoint::Verified { .. })) => {
            Some((StartAt::TrimHorizon, at.floor_ms()))
        }
        Some(_) => None,
    }
}

/// Whether a shard row at `checkpoint` has nothing read yet (it starts at `TRIM_HORIZON`):
/// what its verification is about (docs/coordination.md §11.11).
pub fn unread(checkpoint: Option<&LeaseCheckpoint>) -> bool {
    matches!(leased_start(checkpoint), Some((StartAt::TrimHorizon, _)))
}

/// What a worker about to read a shard row finds of its verification (docs/streams.md §4.5
/// layer 3 for a lease row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowFreshness {
    /// Positioned or finished, or verified within [`gaps::STALE_AFTER_SECS`]: read it.
    Fresh,
    /// Nothing read and verified longer ago: records the stream trimmed since would be lost
    /// unseen. The reason, as one process says it.
    Stale(String),
    /// Nothing read and no verification (written by an earlier version): it cannot be
    /// checked, and is read with a warning, as one process reads such a shard.
    Unverified,
}

/// How fresh a shard row at `checkpoint` is at `now_ms` ([`RowFreshness`]).
pub fn stale_row(
    shard: &ShardId,
    checkpoint: Option<&LeaseCheckpoint>,
    now_ms: i64,
) -> RowFreshness {
    if !unread(checkpoint) {
        return RowFreshness::Fresh;
    }
    let Some(verified_ms) = checkpoint.and_then(LeaseCheckpoint::verified_ms) else {
        return RowFreshness::Unverified;
    };
    let now_s = now_ms.div_euclid(1000);
    match gaps::stale_since(shard, verified_ms.div_euclid(1000), now_s) {
        Some(reason) => RowFreshness::Stale(reason),
        None => RowFreshness::Fresh,
    }
}

/// What a shard's read tells its owner after each slice.
#[derive(Debug, Clone)]
pub struct ReadFlags {
    /// The shard's last two reads answered nothing.
    pub caught_up: Arc<AtomicBool>,
    /// `ts_ms` of the newest record read (`i64::MIN`: none yet).
    pub newest_ms: Arc<AtomicI64>,
}

impl Default for ReadFlags {
    fn default() -> Self {
        ReadFlags {
            caught_up: Arc::default(),
            newest_ms: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }
}

impl ReadFlags {
    /// Whether the shard caught up.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Relaxed)
    }

    /// `ts_ms` of the newest record read, once one was.
    pub fn newest_ms(&self) -> Option<i64> {
        let newest = self.newest_ms.load(Ordering::Relaxed);
        (newest != i64::MIN).then_some(newest)
    }
}

/// How a worker reads the shards it holds: the stream and how it is asked, and the read slots
/// its shards share.
#[derive(Clone)]
pub struct ShardReads<A> {
    /// The stream and how it is asked.
    pub reads: StreamReads<A>,
    /// Reads in flight at once across the worker's shards (`shard_concurrency`).
    pub slots: Arc<Semaphore>,
}

impl<A: StreamsApi + 'static> ShardReads<A> {
    /// Reads `shard` from `checkpoint` into `out` until it drains (its finish mark follows its
    /// last record), `cancel` fires ([`StreamError::Stopped`]) or it fails; `None` when the
    /// checkpoint is not an unfinished shard's.
    pub fn read(
        &self,
        shard: ShardId,
        checkpoint: Option<&LeaseCheckpoint>,
        out: mpsc::Sender<Handed>,
        cancel: Cancel,
        flags: ReadFlags,
    ) -> Option<impl Future<Output = Result<(), StreamError>> + Send + 'static> {
        let (at, floor) = leased_start(checkpoint)?;
        let view = StreamsPosition::new(StreamKind::Streams, Some(self.reads.stream_arn.clone()));
        let ctx = StreamContext {
            reads: self.reads.clone(),
            handover: Arc::new(Handover::new(out, view, None)),
            cancel,
        };
        let state = ShardState::new(shard, at, floor, None);
        Some(slices(ctx, state, Arc::clone(&self.slots), flags))
    }
}

/// Reads one shard slice after slice, a read slot per slice, until it drains or is stopped.
/// The context (and with it the hand-over's sender) is dropped at the end.
async fn slices<A: StreamsApi>(
    ctx: StreamContext<A>,
    mut state: ShardState,
    slots: Arc<Semaphore>,
    flags: ReadFlags,
) -> Result<(), StreamError> {
    loop {
        let slot = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(StreamError::Stopped),
            slot = Arc::clone(&slots).acquire_owned() => slot.map_err(|_| StreamError::Stopped)?,
        };
        let end = ctx.slice(&mut state).await;
        drop(slot);
        flags.caught_up.store(state.caught_up, Ordering::Relaxed);
        if let Some(ms) = state.newest_ts_ms {
            flags.newest_ms.store(ms, Ordering::Relaxed);
        }
        match end? {
            SliceEnd::Drained => return Ok(()),
            SliceEnd::Yield(delay) => {
                tokio::select! {
                    biased;
                    () = ctx.cancel.cancelled() => return Err(StreamError::Stopped),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The stream position the shard rows of a shared run stand at, for the plan of a repair
/// across workers (docs/coordination.md §11.12 rule 9; `super::repair::plan`): a positioned
/// row with its `read_at`, a row with nothing read with its verification (unix s), a finished
/// row finished. A row that says nothing (no checkpoint, a positioned row written before
/// `read_at` was kept, an unknown text) makes the window unknown, as one process's position
/// written by an earlier version does.
pub fn position_of_rows(rows: &[Lease], kind: StreamKind, stream_arn: &str) -> StreamsPosition {
    let mut position = StreamsPosition::new(kind, Some(stream_arn.to_string()));
    for row in rows {
        if let UnitId::Shard(shard) = &row.unit {
            hold(&mut position, shard, row.checkpoint.as_ref());
        }
    }
    position
}

/// Puts `shard` into `position` as its lease row's `checkpoint` says, whatever it held of it
/// before: positioned with its `read_at`, finished, or nothing read with its verification
/// (unix s) and floor. A worker's held shards are kept so, and the marks of its batches
/// applied to them as to one process's position ([`super::handover::apply`]).
pub fn hold(position: &mut StreamsPosition, shard: &ShardId, checkpoint: Option<&LeaseCheckpoint>) {
    position.forget(shard);
    match checkpoint {
        Some(LeaseCheckpoint::After { seq, read_at_s }) => {
            position.admit(shard, None, None);
            position.advance(shard, seq);
            if let Some(at) = read_at_s {
                position.read(shard, *at);
            }
        }
        Some(LeaseCheckpoint::ShardEnd) => position.finish(shard, None),
        other => {
            let verified_s = other
                .and_then(LeaseCheckpoint::verified_ms)
                .map(|ms| ms.div_euclid(1000));
            position.admit(shard, verified_s, other.and_then(LeaseCheckpoint::floor_ms));
        }
    }
}

/// The lease checkpoint of `shard` as `position` holds it ([`hold`]'s inverse): positioned
/// with its `read_at`, finished, or nothing read and verified (keeping its floor); `None` for
/// a shard it does not hold, or holds unverified.
pub fn checkpoint_of(position: &StreamsPosition, shard: &ShardId) -> Option<LeaseCheckpoint> {
    match position.shards.get(shard)? {
        ShardProgress::After(seq) => Some(LeaseCheckpoint::After {
            seq: seq.clone(),
            read_at_s: position.read_at.get(shard).copied(),
        }),
        ShardProgress::ShardEnd { .. } => Some(LeaseCheckpoint::ShardEnd),
        ShardProgress::TrimHorizon {
            verified_at,
            floor_ms,
        } => {
            verified_at.map(|at_s| LeaseCheckpoint::verified(at_s.saturating_mul(1000), *floor_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::api::Recovery;
    use crate::ids::SequenceNumber;
    use crate::streams::repair::{REPAIR_MARGIN_MS, RepairPlan, plan};

    /// A repair across workers starts where the shard rows say every record was delivered:
    /// the earliest `read_at` of the positioned rows and verification of the rows with nothing
    /// read; a row that does not say makes it a resnapshot, naming the shard.
    #[test]
    fn the_shard_rows_say_where_a_repair_across_workers_starts() {
        let now_ms = 1_800_000_000_000_i64;
        let recovery = Recovery {
            enabled: true,
            earliest_ms: Some(now_ms - 30 * 86_400_000),
            latest_ms: Some(now_ms - 300_000),
        };
        let row = |shard: &str, checkpoint: Option<LeaseCheckpoint>| Lease {
            checkpoint,
            ..Lease::new(UnitId::Shard(ShardId::new(shard)), Vec::new(), 0)
        };
        let read_s = (now_ms - 30 * 3_600_000) / 1000;
        let after = |read_at_s| LeaseCheckpoint::After {
            seq: SequenceNumber::parse("000000000000000000123").unwrap(),
            read_at_s,
        };
        let mut rows = vec![
            row("a", Some(after(Some(read_s + 600)))),
            row(
                "b",
                Some(LeaseCheckpoint::verified(read_s * 1000 + 999, None)),
            ),
            row("c", Some(LeaseCheckpoint::ShardEnd)),
            Lease::new(UnitId::Segment { index: 0, total: 1 }, Vec::new(), 0),
        ];
        let position = position_of_rows(&rows, StreamKind::Mirror, "arn:s");
        assert_eq!(
            plan(&position, "arn:s", "t", &recovery, now_ms),
            RepairPlan::Repair {
                from_ms: read_s * 1000 - REPAIR_MARGIN_MS,
                to_ms: now_ms - 300_000,
            }
        );
        rows.push(row("d", Some(after(None))));
        let position = position_of_rows(&rows, StreamKind::Mirror, "arn:s");
        assert!(matches!(
            plan(&position, "arn:s", "t", &recovery, now_ms),
            RepairPlan::Resnapshot(why) if why.contains("shard d")
        ));
    }

    #[test]
    fn a_shard_starts_where_its_checkpoint_says_and_nowhere_else() {
        let seq = SequenceNumber::parse("000000000000000000123").unwrap();
        assert_eq!(leased_start(None), Some((StartAt::TrimHorizon, None)));
        assert_eq!(
            leased_start(Some(&LeaseCheckpoint::after(seq.clone()))),
            Some((StartAt::After(seq), None))
        );
        assert_eq!(
            leased_start(Some(&LeaseCheckpoint::Latest { since_ms: 42 })),
            Some((StartAt::TrimHorizon, Some(42)))
        );
        assert_eq!(
            leased_start(Some(&LeaseCheckpoint::verified(50, Some(42)))),
            Some((StartAt::TrimHorizon, Some(42)))
        );
        assert_eq!(
            leased_start(Some(&LeaseCheckpoint::verified(50, None))),
            Some((StartAt::TrimHorizon, None))
        );
        for other in [
            LeaseCheckpoint::ShardEnd,
            LeaseCheckpoint::Done,
            LeaseCheckpoint::Unknown("7".into()),
        ] {
            assert_eq!(leased_start(Some(&other)), None, "{other:?}");
        }
    }

    /// A row with nothing read whose verification is more than 23 h old stops its taker; a
    /// positioned or finished row is never stale; a row without a verification cannot be
    /// checked.
    #[test]
    fn a_row_with_nothing_read_is_stale_23_hours_after_its_verification() {
        let shard = ShardId::new("s1");
        let now_ms = 1_767_225_600_000;
        let limit_ms = gaps::STALE_AFTER_SECS * 1000;
        let at = |ms: i64| LeaseCheckpoint::verified(ms, None);
        assert_eq!(
            stale_row(&shard, Some(&at(now_ms - limit_ms)), now_ms),
            RowFreshness::Fresh
        );
        let stale = stale_row(&shard, Some(&at(now_ms - limit_ms - 1000)), now_ms);
        assert_eq!(
            stale,
            RowFreshness::Stale(
                "shard s1 was last read 23h ago with nothing to read; records written since \
                 may have been trimmed"
                    .to_string()
            )
        );
        let latest = LeaseCheckpoint::Latest {
            since_ms: now_ms - 25 * 3_600_000,
        };
        assert!(
            matches!(stale_row(&shard, Some(&latest), now_ms), RowFreshness::Stale(reason) if reason.contains("25h ago"))
        );
        assert_eq!(stale_row(&shard, None, now_ms), RowFreshness::Unverified);
        let seq = SequenceNumber::parse("000000000000000000123").unwrap();
        for read in [LeaseCheckpoint::after(seq), LeaseCheckpoint::ShardEnd] {
            assert_eq!(
                stale_row(&shard, Some(&read), now_ms),
                RowFreshness::Fresh,
                "{read:?}"
            );
        }
    }
}
