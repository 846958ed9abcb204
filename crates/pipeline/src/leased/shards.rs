//! Stream shards as leased units (docs/coordination.md §11.11): the leader lists the stream and
//! writes a lease row per shard, each worker reads the shards it holds (the source's leased
//! shard reads), writes their records to its own sink and checkpoints each shard in its row.
//!
//! # Ordering
//! A child shard's lease is taken only once every parent's row is `ShardEnd` (the lease rules,
//! §11.6), and a parent's row reaches `ShardEnd` only after its last record was acknowledged.
//! So across workers a key's changes are written in stream order; a hand-over restarts the
//! shard after its last checkpoint (at least once).
//!
//! # Where a shard starts
//! At its row's checkpoint (`ddbpipe_source::streams::leased::leased_start`): none at
//! `TRIM_HORIZON`, `After { seq, .. }` after it, `Latest { since_ms }` (a first run from `latest`
//! creates the open shards' rows so) from `TRIM_HORIZON` dropping records created before that
//! time, so a take-over before the first checkpoint loses nothing. Shards already closed then
//! are created `ShardEnd`, unread. A positioned row also keeps the shard's `read_at`, raised by
//! the batches' `ReadAt` marks as one process's position is: a repair across workers starts
//! its window there (docs/coordination.md §11.12 rule 9).
//!
//! # Gaps found before reading (docs/streams.md §4.5 layers 2 and 3, for lease rows)
//! 1. The leader's listing: a shard without a row whose parent is neither listed nor has a
//!    row (the parent expired unread) stops the leader before it writes any row, naming both
//!    (`super::rows`, except on the pipeline's first listing).
//! 2. A row with nothing read yet keeps when it was verified (`Verified`, `Latest`; the
//!    leader stamps it at creation, `super::rows`). Its reader refreshes it to the first of two
//!    empty reads in a row (the engine's `StreamMark::Verify`, a checkpoint like any other). A
//!    worker about to read such a row more than 23 h after that stops, naming the shard,
//!    before reading anything; the row stays as it is, so every later taker stops too. A row
//!    without a stamp (an earlier version's) is read with a warning.
//!
//! # Discovery
//! Only the leader calls `DescribeStream`: at its first round, every `discovery_interval`, and
//! at most every [`CHILD_LOOKUP_INTERVAL`] while a finished shard has no child row yet (a
//! split's children are read seconds after their parent ends, not a discovery later).
//!
//! # Ending
//! - Idle (`idle_termination_secs`, without `follow`): no record arrived for that long, every
//!   held shard caught up, and no unfinished shard left that this worker could take (every row
//!   is held by a live worker).
//! - The stream is disabled and every shard row is finished.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::events::{LagMeasured, ShardsCounted};
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::lease::{Lease, LeaseTable, UnitId, UnitSpec, Worker};
use ddbpipe_source::position::{LeaseCheckpoint, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{AttemptObserver, Cancel};
use ddbpipe_source::streams::engine::{EndReason, LagInfo, running_lag};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::handover::{Handed, StreamMark, apply};
use ddbpipe_source::streams::leased::{
    ReadFlags, RowFreshness, ShardReads, checkpoint_of, hold, leased_start, stale_row,
};
use ddbpipe_source::streams::shard_reader::StreamError;
use ddbpipe_source::streams::shard_sync;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use super::rows::{LISTING_MARGIN_MS, listing_gaps, shard_specs};
use super::units::{SnapshotMark, Units, View};
use super::{LeaseCounts, Leased, unreadable};
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::runner::{Progress, RunError};
use crate::sink::Sink;
use crate::state::identity::Identity;
use crate::streams::StreamRun;

/// Least time between two listings while a finished shard has no child row.
pub const CHILD_LOOKUP_INTERVAL: Duration = Duration::from_secs(5);

/// A stream run by one worker of several.
pub struct LeasedStreams<A, T> {
    /// The Streams API.
    pub api: Arc<A>,
    /// The run's settings (stream, format, retries, bounds, start position, batch size).
    pub run: StreamRun,
    /// This worker on the lease table.
    pub worker: Worker<T>,
    /// Least time between two checkpoints of one shard (`state.flush_interval_ms`).
    pub checkpoint_interval: Duration,
    /// Told about every attempt (metrics).
    pub observer: Arc<dyn AttemptObserver>,
    /// The run's settings and stream, kept in the leader row: a worker with other settings
    /// (or a re-created table's new stream) is refused.
    pub identity: Identity,
    /// Units of an earlier phase whose finished rows stay as they are (a shared mirror's
    /// snapshot segments, docs/coordination.md §11.12): the leader neither deletes them as
    /// undiscovered nor lets a worker still finishing that phase find them gone; a missing
    /// one is created in its finished state. Empty for a streams pipeline.
    pub kept: Vec<UnitSpec>,
}

/// How one worker's part of a shared stream ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedStreamOutcome {
    /// Change records written and acknowledged by this worker.
    pub written: u64,
    /// Why this worker ended.
    pub end: EndReason,
    /// Shard rows finished in the lease table, of `shards`.
    pub shards_finished: u64,
    /// Shard rows in the lease table.
    pub shards: u64,
    /// What this worker's leases did (`finished` counts shards read to their end here).
    pub leases: LeaseCounts,
}

impl<A: StreamsApi + 'static, T: LeaseTable> LeasedStreams<A, T> {
    /// Runs this worker until an end condition (module docs) or a failure.
    pub async fn run<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedStreamOutcome, RunError> {
        self.run_of(sink, stop, progress, None).await
    }

    /// [`run`](Self::run) as the stream of a shared mirror's generation whose snapshot is
    /// `of`: every batch is refused once another snapshot replaced it.
    pub(crate) async fn run_of<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
        of: Option<i64>,
    ) -> Result<LeasedStreamOutcome, RunError> {
        let LeasedStreams {
            api,
            run,
            worker,
            checkpoint_interval,
            observer,
            identity,
            kept,
        } = self;
        let mark = SnapshotMark {
            of,
            ..SnapshotMark::default()
        };
        let shards = Shards::new(shard_reads(&run, api, observer), run, kept, mark);
        let leased = Leased {
            units: shards,
            worker,
            checkpoint_interval,
            identity,
        };
        let (ran, _) = leased.run(sink, stop, progress).await?;
        let (shards_finished, shards) = shard_rows(&ran.rows);
        Ok(LeasedStreamOutcome {
            written: ran.written,
            end: ran.end,
            shards_finished,
            shards,
            leases: ran.leases,
        })
    }
}

/// How a worker reads the shards it holds under `run`: the run's reads, a gap naming a
/// shared pipeline's remedy, and `shard_concurrency` read slots.
pub(crate) fn shard_reads<A: StreamsApi>(
    run: &StreamRun,
    api: Arc<A>,
    observer: Arc<dyn AttemptObserver>,
) -> ShardReads<A> {
    let mut reads = run.reads(api, observer);
    reads.gap_remedy = gaps::GapRemedy::StateReset;
    ShardReads {
        reads,
        slots: Arc::new(Semaphore::new(run.bounds.shard_concurrency.max(1))),
    }
}

/// The shards of one stream.
pub(crate) struct Shards<A> {
    source: ShardReads<A>,
    run: StreamRun,
    kept: Vec<UnitSpec>,
    /// The last listing said `DISABLED`.
    disabled: bool,
    /// When the leader last listed the stream.
    listed_at: Option<Instant>,
    /// When the leader's last listing started, unix ms.
    listed_ms: Option<i64>,
    /// The verification each shard of the leader's last listing gets if its row is created
    /// (`super::rows`, rule 2): the start of the listing before the one that first found it,
    /// less the margin.
    seen: BTreeMap<ShardId, Option<i64>>,
    /// Where the held shards stand in the batches marked so far, as one process's position
    /// keeps them (`leased::hold` from their rows, then each batch's marks applied): what their
    /// rows' checkpoints become (module docs, Where a shard starts).
    held: Mutex<StreamsPosition>,
    /// When records last arrived from a shard: the idle clock.
    last_records: Instant,
    /// What the batches carry of a shared mirror's snapshot: the open one the stream is read
    /// beside (its first phase), and the one whose generation reads it.
    mark: SnapshotMark,
}

impl<A> Shards<A> {
    /// The shards read through `source` under `run`; `kept` and `mark` as
    /// [`LeasedStreams::kept`] and [`Shards::mark`] say.
    pub(crate) fn new(
        source: ShardReads<A>,
        run: StreamRun,
        kept: Vec<UnitSpec>,
        mark: SnapshotMark,
    ) -> Self {
        Shards {
            source,
            run,
            kept,
            disabled: false,
            listed_at: None,
            listed_ms: None,
            seen: BTreeMap::new(),
            held: Mutex::new(StreamsPosition::new(StreamKind::Streams, None)),
            last_records: Instant::now(),
            mark,
        }
    }
}

impl<A: StreamsApi + 'static> Units for Shards<A> {
    type Read = Handed;
    type End = EndReason;

    const DEPTH: usize = crate::streams::HANDOVER_DEPTH;

    fn owns(&self, unit: &UnitId) -> bool {
        matches!(unit, UnitId::Shard(_))
    }

    /// Refuses an unreadable row, and a row with nothing read whose verification is too old
    /// (module docs, Gaps found before reading, 2).
    fn starts(&self, unit: &UnitId, at: Option<&LeaseCheckpoint>) -> Result<(), RunError> {
        match at {
            Some(end) if end.is_finished() => return Ok(()),
            _ if leased_start(at).is_some() => {}
            Some(other) => return Err(unreadable(unit, other)),
            None => {}
        }
        let UnitId::Shard(shard) = unit else {
            return Ok(());
        };
        match stale_row(shard, at, unix_now_ms()) {
            RowFreshness::Fresh => Ok(()),
            RowFreshness::Stale(reason) => Err(RunError::Stream(StreamError::Gap(
                gaps::found_before_reading(&[reason], self.source.reads.gap_remedy),
            ))),
            RowFreshness::Unverified => {
                tracing::warn!(
                    shard = %shard,
                    "Shard row with nothing read and no verification time: records trimmed \
                     before it is read cannot be noticed."
                );
                Ok(())
            }
        }
    }

    fn read(
        &self,
        unit: &UnitId,
        from: Option<&LeaseCheckpoint>,
        out: mpsc::Sender<Handed>,
        cancel: Cancel,
        flags: ReadFlags,
    ) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError> {
        let UnitId::Shard(shard) = unit else {
            return Err(self.panicked(unit));
        };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        hold(&mut held, shard, from);
        drop(held);
        let Some(read) = self.source.read(shard.clone(), from, out, cancel, flags) else {
            let at = from
                .cloned()
                .unwrap_or(LeaseCheckpoint::Unknown(String::new()));
            return Err(unreadable(unit, &at));
        };
        Ok(async move {
            match read.await {
                Ok(()) | Err(StreamError::Stopped) => Ok(()),
                Err(error) => Err(RunError::Stream(error)),
            }
        }
        .boxed())
    }

    fn panicked(&self, unit: &UnitId) -> RunError {
        RunError::Stream(StreamError::ShardFailed(format!(
            "the task reading {unit} panicked"
        )))
    }

    /// Every held shard reads; their reads share the read slots.
    fn may_read(&self, _unit: &UnitId, _reading: usize) -> bool {
        true
    }

    fn snapshot_of(&self, _unit: &UnitId) -> SnapshotMark {
        self.mark
    }

    fn push(&mut self, batcher: &mut Batcher, handed: Handed) -> Vec<Batch> {
        if !handed.records.is_empty() {
            self.last_records = Instant::now();
        }
        batcher.push_handed(handed)
    }

    /// The shard positions a batch reaches, its marks applied to the held shards as to one
    /// process's position: a positioned shard's row keeps its sequence number and its
    /// `read_at` (docs/streams.md §4.12); a shard with nothing read that read empty twice is
    /// verified again, keeping its floor.
    fn marks(&self, batch: &Batch) -> Vec<(UnitId, LeaseCheckpoint)> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        batch
            .shards
            .iter()
            .filter_map(|mark| {
                let shard = match mark {
                    // A child's admission is its own row's, written by the leader.
                    StreamMark::Admit { .. } => return None,
                    StreamMark::Advance(shard, _)
                    | StreamMark::Finish(shard, _)
                    | StreamMark::Verify(shard, _)
                    | StreamMark::ReadAt(shard, _) => shard,
                };
                apply(&mut held, mark);
                let at = checkpoint_of(&held, shard)?;
                // A positioned shard's `Verify` and a `ReadAt` of one with nothing read change
                // nothing of its row.
                let changed = match (mark, &at) {
                    (StreamMark::Verify(..), LeaseCheckpoint::Verified { .. }) => true,
                    (StreamMark::ReadAt(..), LeaseCheckpoint::After { .. }) => true,
                    (StreamMark::Verify(..) | StreamMark::ReadAt(..), _) => false,
                    _ => true,
                };
                changed.then(|| (UnitId::Shard(shard.clone()), at))
            })
            .collect()
    }

    /// Batches with records; a shard's end alone is checkpointed in its row.
    fn writes(&self, batch: &Batch) -> bool {
        !batch.records.is_empty()
    }

    fn limits(&self) -> BatchLimits {
        self.run.batch
    }

    async fn specs(
        &mut self,
        rows: &[Lease],
        stop: &Cancel,
    ) -> Result<Option<Vec<UnitSpec>>, RunError> {
        if !self.listing_due(rows) {
            return Ok(None);
        }
        let Some(mut specs) = self.list(rows, stop).await? else {
            return Ok(None);
        };
        specs.extend(self.kept.iter().cloned());
        // A shared snapshot's finished segment rows this worker does not know (an export's
        // files, read before it came) stay as they are.
        let unknown: Vec<UnitSpec> = rows
            .iter()
            .filter(|row| matches!(row.unit, UnitId::Segment { .. }) && row.state.is_finished())
            .filter(|row| !self.kept.iter().any(|kept| kept.unit == row.unit))
            .map(|row| UnitSpec::new(row.unit.clone(), Vec::new()).starting(LeaseCheckpoint::Done))
            .collect();
        specs.extend(unknown);
        Ok(Some(specs))
    }

    /// The shard counts and the running lag of the shards this worker holds, as one process
    /// reports them (docs/streams.md §4.11): the age of the newest record read by a shard not
    /// caught up, 0 for caught-up ones.
    fn measured(&self, rows: &[Lease], held: &[(&UnitId, &ReadFlags)]) {
        let shards: Vec<LagInfo> = held
            .iter()
            .map(|(_, flags)| LagInfo {
                newest_ts_ms: flags.newest_ms(),
                caught_up: flags.caught_up(),
            })
            .collect();
        LagMeasured {
            seconds: running_lag(shards.iter(), unix_now_ms()),
        }
        .emit();
        ShardsCounted {
            queued: 0,
            active: held.len() as u64,
            finished: shard_rows(rows).0,
        }
        .emit();
    }

    fn ended(&self, view: &View<'_>) -> Option<EndReason> {
        let shard_rows = || {
            view.rows
                .iter()
                .filter(|row| matches!(row.unit, UnitId::Shard(_)))
        };
        if self.disabled
            && self.listed_at.is_some()
            && view.held.is_empty()
            && !view.pending
            && shard_rows().all(|row| row.state.is_finished())
        {
            tracing::info!("Stream disabled and every shard finished.");
            return Some(EndReason::StreamDisabled);
        }
        let idle = self.run.bounds.idle_termination?;
        if self.run.bounds.follow || self.last_records.elapsed() < idle {
            return None;
        }
        let reading_all = view
            .held
            .iter()
            .all(|(_, flags, ended)| !ended && flags.caught_up());
        let nothing_to_take = shard_rows()
            .all(|row| row.state.is_finished() || (row.owner.is_some() && !(view.expired)(row)));
        if reading_all && nothing_to_take && !view.pending {
            tracing::info!(
                idle_secs = idle.as_secs(),
                "Idle termination: no record for the configured time."
            );
            return Some(EndReason::Idle);
        }
        None
    }

    fn stopped(&self) -> EndReason {
        EndReason::Stopped
    }
}

impl<A: StreamsApi + 'static> Shards<A> {
    /// Whether the leader lists the stream this round (module docs, Discovery).
    fn listing_due(&self, rows: &[Lease]) -> bool {
        let Some(at) = self.listed_at else {
            return true;
        };
        let since = at.elapsed();
        if since >= self.run.bounds.discovery_interval {
            return true;
        }
        let childless_end = rows.iter().any(|row| {
            matches!(row.unit, UnitId::Shard(_))
                && row.state.is_finished()
                && !rows.iter().any(|child| child.parents.contains(&row.unit))
        });
        childless_end && !self.disabled && since >= CHILD_LOOKUP_INTERVAL
    }

    /// Lists the stream: the specs of its shards' rows (`None` when the run stops meanwhile),
    /// each verified as `super::rows` says; a shard whose parent expired unread stops it.
    async fn list(
        &mut self,
        rows: &[Lease],
        stop: &Cancel,
    ) -> Result<Option<Vec<UnitSpec>>, RunError> {
        let started_ms = unix_now_ms();
        let discovery = match shard_sync::discover(
            self.source.reads.api.as_ref(),
            &self.run.stream_arn,
            &self.run.retry,
            stop,
            self.source.reads.observer.as_ref(),
        )
        .await
        {
            Ok(discovery) => discovery,
            Err(ReadError::Cancelled) => return Ok(None),
            Err(error) => return Err(RunError::Read(error)),
        };
        self.listed_at = Some(Instant::now());
        self.disabled = discovery.status.as_deref() == Some("DISABLED");
        let first = !rows.iter().any(|row| matches!(row.unit, UnitId::Shard(_)));
        if !first {
            let reasons = listing_gaps(&discovery.shards, rows);
            if !reasons.is_empty() {
                return Err(RunError::Stream(StreamError::Gap(
                    gaps::found_before_reading(&reasons, self.source.reads.gap_remedy),
                )));
            }
        }
        let before = self.listed_ms.map(|ms| ms - LISTING_MARGIN_MS);
        let seen = std::mem::take(&mut self.seen);
        self.seen = (discovery.shards.iter())
            .map(|shard| {
                (
                    shard.id.clone(),
                    seen.get(&shard.id).copied().unwrap_or(before),
                )
            })
            .collect();
        self.listed_ms = Some(started_ms);
        let start_ms = self.mark.beside.unwrap_or(started_ms);
        let verified = |id: &ShardId| {
            if first {
                Some(start_ms)
            } else {
                self.seen.get(id).copied().flatten()
            }
        };
        Ok(Some(shard_specs(
            discovery.shards,
            first.then_some(self.run.start_position),
            unix_now_ms(),
            verified,
        )))
    }
}

/// (finished, all) shard rows in `rows`.
fn shard_rows(rows: &[Lease]) -> (u64, u64) {
    let shards = rows
        .iter()
        .filter(|row| matches!(row.unit, UnitId::Shard(_)));
    let all = shards.clone().count() as u64;
    let finished = shards.filter(|row| row.state.is_finished()).count() as u64;
    (finished, all)
}
