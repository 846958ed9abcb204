//! A stream shared by several workers through shard leases (docs/coordination.md §11.11): the
//! leader lists the stream and writes a lease row per shard, each worker reads the shards it
//! holds, writes their records to its own sink and checkpoints each shard in its lease row.
//!
//! # Ordering
//! 1. A child shard's lease is taken only once every parent's row is `ShardEnd` (the lease
//!    rules, §11.6), and a parent's row reaches `ShardEnd` only after its last record was
//!    acknowledged (rule 2). So across workers a key's changes are written in stream order;
//!    a hand-over restarts the shard after its last checkpoint (at least once).
//! 2. A shard's records are acknowledged before its sequence number is checkpointed; the
//!    checkpoint is written at most every `checkpoint_interval`, at once when the shard ends,
//!    and before a graceful stop hands the lease back.
//! 3. The worker's leases are renewed by its keeper, on a timer of its own: a slow batch
//!    delays the rounds, not the renewals (docs/coordination.md §11.4 rule 1).
//! 4. A lost lease (the keeper, a round, a refused checkpoint, a refused fence) stops its
//!    shard at once; nothing more is checkpointed for it.
//!
//! # Where a shard starts
//! - A row without a checkpoint: at `TRIM_HORIZON`.
//! - `after:<sequence number>`: after it.
//! - `latest:<unix ms>`: a first run with `start_position: latest` creates the rows of the
//!   open shards so; they are read from `TRIM_HORIZON` dropping records created before that
//!   time, so a take-over before the first checkpoint loses nothing. Shards already closed
//!   then are created `ShardEnd`, unread.
//!
//! # Discovery
//! Only the leader calls `DescribeStream`: at its first round, every `discovery_interval`,
//! and at most every [`CHILD_LOOKUP_INTERVAL`] while a finished shard has no child row yet
//! (a split's children are read seconds after their parent ends, not a discovery later).
//!
//! # Ending
//! - `stop` (SIGINT/SIGTERM): reading stops, what was read is written, every held shard's
//!   last acknowledged sequence number is checkpointed and every lease is handed back.
//! - Idle (`idle_termination_secs`, without `follow`): no record arrived for that long, every
//!   held shard caught up, and no unfinished shard left that this worker could take (every
//!   row is held by a live worker).
//! - The stream is disabled and every shard row is finished.
//! - A read or sink failure: what was acknowledged is checkpointed, the leases are handed
//!   back, and the error is returned.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use ddbpipe_source::api::{StartAt, StreamsApi};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::lease::{
    KeeperHandle, LeaseTable, LocalTime, LostReason, UnitId, UnitSpec, Worker,
};
use ddbpipe_source::position::{LeaseCheckpoint, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{AttemptObserver, Cancel, CancelHandle};
use ddbpipe_source::streams::engine::EndReason;
use ddbpipe_source::streams::handover::{Handed, Handover, StreamMark};
use ddbpipe_source::streams::shard_reader::{ShardState, StreamContext, StreamError};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::{HANDOVER_DEPTH, StreamRun};
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::events::BatchAcknowledged;
use crate::runner::units::{self, Checkpointed, Rounds, Took};
use crate::runner::{LeaseCounts, Progress, RunError, pending_deadline, sleep_until};
use crate::sink::Sink;
use crate::state::identity::Identity;

mod discovery;
mod read;

use super::lease_rows::{Start, shard_start};
use read::{ReadFlags, read_shard};

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

/// A shard this worker holds.
struct Holding {
    /// Told apart from earlier holdings of the same shard by this worker.
    generation: u64,
    /// The last sequence number acknowledged; `None`: the row's own checkpoint stands.
    acknowledged: Option<SequenceNumber>,
    /// Whether `acknowledged` (or the end) is newer than the lease row's checkpoint.
    unsaved: bool,
    /// When the lease row was last checkpointed.
    saved_at: Instant,
    /// Cancels its reading task.
    reading: Option<CancelHandle>,
    /// Set by the reading task: the shard's last two reads answered nothing.
    caught_up: Arc<AtomicBool>,
    /// Set by the reading task: `ts_ms` of the newest record read (`i64::MIN`: none yet).
    newest_ms: Arc<AtomicI64>,
    /// Its last record was acknowledged; the `ShardEnd` checkpoint is still to be written.
    ended: bool,
}

/// What a shard's task left.
type ShardJoined =
    Result<(tokio::task::Id, (ShardId, Result<(), StreamError>)), tokio::task::JoinError>;

impl<A: StreamsApi + 'static, T: LeaseTable> LeasedStreams<A, T> {
    /// Runs this worker until an end condition (module docs) or a failure.
    pub async fn run<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
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
        let (tx, rx) = mpsc::channel(HANDOVER_DEPTH);
        let mut shared = Shared {
            slots: Arc::new(Semaphore::new(run.bounds.shard_concurrency.max(1))),
            api,
            run,
            worker,
            tx,
            identity,
            kept,
            generation: 0,
            observer,
            checkpoint_interval,
            origin: Instant::now(),
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            counts: LeaseCounts::default(),
            written: 0,
            disabled: false,
            listed_at: None,
            stop: stop.clone(),
            last_records: Instant::now(),
        };
        let mut rounds = Rounds::new(shared.origin, shared.worker.settings().renew_interval());
        let mut keeper = shared.worker.keeper().spawn(rounds.clock());
        let result = shared
            .drive(sink, rx, &stop, progress, &mut rounds, &mut keeper)
            .await;
        let saved = shared.save_all(true).await;
        let released = shared.worker.release_all().await;
        drop(keeper);
        for (unit, error) in &released {
            tracing::warn!(lease = %unit, error = %error, "A lease could not be handed back; it expires instead.");
        }
        let end = result?;
        saved?;
        let (shards_finished, shards) = shared.shard_rows();
        Ok(LeasedStreamOutcome {
            written: shared.written,
            end,
            shards_finished,
            shards,
            leases: shared.counts,
        })
    }
}

struct Shared<A, T> {
    api: Arc<A>,
    run: StreamRun,
    worker: Worker<T>,
    /// Where every shard task forwards its hand-overs, tagged with its holding's generation.
    tx: mpsc::Sender<(u64, Handed)>,
    identity: Identity,
    kept: Vec<UnitSpec>,
    /// The generation of the last holding started.
    generation: u64,
    observer: Arc<dyn AttemptObserver>,
    slots: Arc<Semaphore>,
    checkpoint_interval: Duration,
    origin: Instant,
    held: BTreeMap<ShardId, Holding>,
    tasks: JoinSet<(ShardId, Result<(), StreamError>)>,
    running: HashMap<tokio::task::Id, ShardId>,
    counts: LeaseCounts,
    written: u64,
    /// The last listing said `DISABLED`.
    disabled: bool,
    /// When the leader last listed the stream.
    listed_at: Option<Instant>,
    /// The run's stop signal (a listing in progress ends with it).
    stop: Cancel,
    /// When records last arrived from a shard: the idle clock.
    last_records: Instant,
}

impl<A: StreamsApi + 'static, T: LeaseTable> Shared<A, T> {
    fn now(&self) -> LocalTime {
        LocalTime::new(self.origin.elapsed())
    }

    /// The loop; returns why this worker ended.
    async fn drive<S: Sink>(
        &mut self,
        sink: &mut S,
        mut rx: mpsc::Receiver<(u64, Handed)>,
        stop: &Cancel,
        progress: &dyn Progress,
        rounds: &mut Rounds,
        keeper: &mut KeeperHandle,
    ) -> Result<EndReason, RunError> {
        // A fencing sink gets one shard per batch (its fence), so a hand-over is a batch.
        let fenced = sink.fences();
        let mut batcher = Batcher::new(if fenced {
            BatchLimits::UNBOUNDED
        } else {
            self.run.batch
        });
        let mut deadline: Option<Instant> = None;
        let end = loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break EndReason::Stopped,
                event = keeper.next() => {
                    if let Some(lost) = units::kept(event, &self.worker)?
                        && let UnitId::Shard(shard) = lost.unit
                    {
                        self.lose(&shard, &lost.reason);
                    }
                }
                () = tokio::time::sleep_until(rounds.next) => {
                    let (again, expiry) = self.round(sink).await?;
                    if let Some(end) = self.ended(&batcher) {
                        break end;
                    }
                    rounds.ran(expiry, again);
                }
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.joined(joined)?;
                }
                handed = rx.recv() => {
                    let Some((generation, handed)) = handed else { break EndReason::Stopped };
                    self.handed(sink, &mut batcher, generation, handed, progress).await?;
                    deadline = pending_deadline(&batcher, deadline);
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    deadline = None;
                    if let Some(batch) = batcher.take() {
                        self.deliver(sink, batch, progress).await?;
                    }
                }
            }
        };
        // Ending: reading stops, what was read is written.
        for holding in self.held.values_mut() {
            if let Some(cancel) = holding.reading.take() {
                cancel.cancel();
            }
        }
        while !self.tasks.is_empty() {
            tokio::select! {
                Some(joined) = self.tasks.join_next_with_id() => self.joined(joined)?,
                Some((generation, handed)) = rx.recv() => {
                    self.handed(sink, &mut batcher, generation, handed, progress).await?;
                }
            }
        }
        while let Ok((generation, handed)) = rx.try_recv() {
            self.handed(sink, &mut batcher, generation, handed, progress)
                .await?;
        }
        if let Some(batch) = batcher.take() {
            self.deliver(sink, batch, progress).await?;
        }
        Ok(end)
    }

    /// Why this worker ends now, if it does (module docs, Ending).
    fn ended(&self, batcher: &Batcher) -> Option<EndReason> {
        let rows = self.worker.rows();
        let shard_rows = || {
            rows.iter()
                .filter(|row| matches!(row.unit, UnitId::Shard(_)))
        };
        if self.disabled
            && self.listed_at.is_some()
            && self.held.is_empty()
            && !batcher.has_pending()
            && shard_rows().all(|row| row.state.is_finished())
        {
            tracing::info!("Stream disabled and every shard finished.");
            return Some(EndReason::StreamDisabled);
        }
        let idle = self.run.bounds.idle_termination?;
        if self.run.bounds.follow || self.last_records.elapsed() < idle {
            return None;
        }
        let now = self.now();
        let reading_all = self
            .held
            .values()
            .all(|holding| !holding.ended && holding.caught_up.load(Ordering::Relaxed));
        let nothing_to_take = shard_rows().all(|row| {
            row.state.is_finished() || (row.owner.is_some() && !self.worker.sees_expired(row, now))
        });
        if reading_all && nothing_to_take && !batcher.has_pending() {
            tracing::info!(
                idle_secs = idle.as_secs(),
                "Idle termination: no record for the configured time."
            );
            return Some(EndReason::Idle);
        }
        None
    }

    /// One round (§11.4): renew, list, take, steal; as the leader, list the stream and write
    /// its shards' rows. Returns whether to run the next round at once, and when a lease seen
    /// standing still expires.
    async fn round<S: Sink>(
        &mut self,
        sink: &mut S,
    ) -> Result<(bool, Option<LocalTime>), RunError> {
        let report = self.worker.round(self.now()).await?;
        if report.transient.is_empty() {
            // The lease table answered: a worker waiting for work is idle, not stalled.
            ddbpipe_source::health::answered();
        }
        let now = self.now();
        let identified = units::same_run(&mut self.worker, &self.identity, now).await?;
        let idle = self.last_records.elapsed();
        tracing::trace!(
            worker = %self.worker.id(),
            at_ms = self.origin.elapsed().as_millis() as u64,
            held = self.held.len(),
            leader = report.leader,
            target = report.target,
            idle_ms = idle.as_millis() as u64,
            "Lease round."
        );
        for error in &report.transient {
            tracing::debug!(error = %error, "A lease request failed; the next round retries it.");
        }
        for lost in report.lost {
            if let UnitId::Shard(shard) = lost.unit {
                self.lose(&shard, &lost.reason);
            }
        }
        for taken in report.taken {
            let UnitId::Shard(shard) = &taken.unit else {
                continue;
            };
            let Took::Held(claimed) = units::took(
                &self.worker,
                &mut self.counts,
                sink,
                &taken,
                self.held.len() + 1,
            )
            .await?
            else {
                continue;
            };
            // A fencing sink's position was committed with its rows: it is the newer one.
            let at = claimed.as_ref().or(taken.checkpoint.as_ref());
            let start = shard_start(&taken.unit, at)?;
            let holding = self.start(shard.clone(), start);
            // Held here still: the keeper lost the earlier tenure while this round ran (its
            // report is on its way, and `units::kept` drops it): that tenure stops first.
            if self.held.contains_key(shard) {
                self.lose(shard, &LostReason::Expired);
            }
            self.held.insert(shard.clone(), holding);
        }
        let mut again = false;
        if report.leader && identified && self.listing_due() {
            again = self.sync_shards().await?;
        }
        self.save_all(false).await?;
        self.measure();
        Ok((again, report.next_expiry))
    }

    /// Starts reading a taken shard from `start`.
    fn start(&mut self, shard: ShardId, start: Start) -> Holding {
        let (cancel, cancelled) = Cancel::new();
        let caught_up = Arc::new(AtomicBool::new(false));
        let newest_ms = Arc::new(AtomicI64::new(i64::MIN));
        let (at, floor) = match &start {
            Start::TrimHorizon => (StartAt::TrimHorizon, None),
            Start::After(seq) => (StartAt::After(seq.clone()), None),
            Start::Since(ms) => (StartAt::TrimHorizon, Some(*ms)),
        };
        self.generation += 1;
        let generation = self.generation;
        // Each holding hands over through its own channel, forwarded tagged with its
        // generation: what an earlier holding of the shard read is told apart (`handed`).
        let (tx, mut rx) = mpsc::channel(HANDOVER_DEPTH);
        let view = StreamsPosition::new(StreamKind::Streams, Some(self.run.stream_arn.clone()));
        let ctx = StreamContext {
            api: Arc::clone(&self.api),
            stream_arn: self.run.stream_arn.clone(),
            table: self.run.table.clone(),
            format: self.run.format,
            retry: self.run.retry,
            records_per_request: self.run.records_per_request,
            poll_interval: self.run.poll_interval,
            handover: Arc::new(Handover::new(tx, view, None)),
            cancel: cancelled,
            observer: Arc::clone(&self.observer),
        };
        let state = ShardState::new(shard.clone(), at, floor, None);
        let slots = Arc::clone(&self.slots);
        let flags = ReadFlags {
            caught_up: Arc::clone(&caught_up),
            newest_ms: Arc::clone(&newest_ms),
        };
        let id = shard.clone();
        let out = self.tx.clone();
        let handle = self.tasks.spawn(
            async move {
                // The task ends once everything its reads handed over was forwarded.
                let read = read_shard(ctx, state, slots, flags);
                let forward = async move {
                    while let Some(handed) = rx.recv().await {
                        if out.send((generation, handed)).await.is_err() {
                            break;
                        }
                    }
                };
                let (result, ()) = tokio::join!(read, forward);
                (id, result)
            }
            .in_current_span(),
        );
        self.running.insert(handle.id(), shard);
        Holding {
            generation,
            acknowledged: None,
            unsaved: false,
            saved_at: Instant::now(),
            reading: Some(cancel),
            caught_up,
            newest_ms,
            ended: false,
        }
    }

    /// A shard's task ended: drained (its finish mark follows through the channel), stopped
    /// because its lease was lost or the run ends, or failed.
    fn joined(&mut self, joined: ShardJoined) -> Result<(), RunError> {
        match joined {
            Ok((id, (shard, result))) => {
                self.running.remove(&id);
                match result {
                    Ok(()) | Err(StreamError::Stopped) => Ok(()),
                    Err(error) => {
                        tracing::error!(shard = %shard, error = %error, "Shard read failed.");
                        Err(RunError::Stream(error))
                    }
                }
            }
            Err(error) => {
                let shard = self.running.remove(&error.id());
                if error.is_panic() {
                    return Err(RunError::Stream(StreamError::ShardFailed(format!(
                        "the task reading shard {} panicked",
                        shard.map_or_else(|| "?".to_string(), |s| s.to_string())
                    ))));
                }
                Ok(())
            }
        }
    }

    /// A hand-over: into the batcher; a fencing sink's hand-over is a batch of its own. A
    /// hand-over of a holding that is lost is dropped: the shard's owner reads it again after
    /// the last checkpoint, and written now, under a later holding's fence, it could land
    /// after newer changes another worker wrote meanwhile.
    async fn handed<S: Sink>(
        &mut self,
        sink: &mut S,
        batcher: &mut Batcher,
        generation: u64,
        handed: Handed,
        progress: &dyn Progress,
    ) -> Result<(), RunError> {
        let current = handed
            .shard
            .as_ref()
            .and_then(|shard| self.held.get(shard))
            .is_some_and(|holding| holding.generation == generation);
        if !current {
            return Ok(());
        }
        if !handed.records.is_empty() {
            self.last_records = Instant::now();
        }
        for batch in batcher.push_handed(handed) {
            self.deliver(sink, batch, progress).await?;
        }
        if sink.fences()
            && let Some(batch) = batcher.take()
        {
            self.deliver(sink, batch, progress).await?;
        }
        Ok(())
    }

    /// Writes a batch, then records the marks it reaches; checkpoints what is due.
    async fn deliver<S: Sink>(
        &mut self,
        sink: &mut S,
        batch: Batch,
        progress: &dyn Progress,
    ) -> Result<(), RunError> {
        if !batch.records.is_empty() {
            // A fencing sink's batch is one hand-over, so one shard's; its last sequence
            // number goes with the rows.
            let shard = batch.shards.iter().find_map(mark_shard).cloned();
            let unit = shard.clone().map(UnitId::Shard);
            let position = batch.shards.iter().rev().find_map(|mark| match mark {
                StreamMark::Advance(_, seq) => Some(LeaseCheckpoint::After(seq.clone())),
                _ => None,
            });
            if !units::write(&self.worker, sink, unit, position, None, &batch).await? {
                if let Some(shard) = shard {
                    self.lose(&shard, &LostReason::Taken);
                }
                return Ok(());
            }
            BatchAcknowledged { batch: &batch }.emit();
            self.written += batch.records.len() as u64;
            progress.advanced(self.written, 0.0);
        }
        for mark in &batch.shards {
            match mark {
                StreamMark::Advance(shard, seq) => {
                    if let Some(holding) = self.held.get_mut(shard) {
                        holding.acknowledged = Some(seq.clone());
                        holding.unsaved = true;
                    }
                }
                StreamMark::Finish(shard, _) => {
                    if let Some(holding) = self.held.get_mut(shard) {
                        holding.ended = true;
                        holding.unsaved = true;
                    }
                }
                // The lease row keeps the sequence number alone.
                StreamMark::Admit { .. } | StreamMark::Verify(..) | StreamMark::ReadAt(..) => {}
            }
        }
        self.save_all(false).await
    }

    /// Checkpoints the held shards whose acknowledged position is newer than their row: ended
    /// ones always, the others once `checkpoint_interval` passed (or all, with `every`).
    async fn save_all(&mut self, every: bool) -> Result<(), RunError> {
        let due: Vec<ShardId> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.unsaved && (every || h.ended || h.saved_at.elapsed() >= self.checkpoint_interval)
            })
            .map(|(shard, _)| shard.clone())
            .collect();
        for shard in due {
            let Some(holding) = self.held.get(&shard) else {
                continue;
            };
            let unit = UnitId::Shard(shard.clone());
            let checkpoint = if holding.ended {
                LeaseCheckpoint::ShardEnd
            } else {
                match &holding.acknowledged {
                    Some(seq) => LeaseCheckpoint::After(seq.clone()),
                    None => continue,
                }
            };
            let now = self.now();
            let result = self.worker.checkpoint(&unit, &checkpoint, now).await;
            match units::checkpointed(&unit, result)? {
                Checkpointed::Saved(_) => self.saved(&shard),
                Checkpointed::Lost(reason) => self.lose(&shard, &reason),
                Checkpointed::Later => {}
            }
        }
        Ok(())
    }

    fn saved(&mut self, shard: &ShardId) {
        let Some(holding) = self.held.get_mut(shard) else {
            return;
        };
        holding.unsaved = false;
        holding.saved_at = Instant::now();
        if holding.ended {
            self.held.remove(shard);
            self.counts.finished += 1;
            self.event("finished", 0);
            tracing::info!(shard = %shard, "Shard ended: its lease is finished and handed back.");
        }
    }

    fn event(&self, event: &'static str, more: usize) {
        units::event(&self.worker, event, self.held.len() + more);
    }

    /// A lease is lost: its shard stops at once, without another checkpoint.
    fn lose(&mut self, shard: &ShardId, reason: &LostReason) {
        if let Some(holding) = self.held.remove(shard) {
            if let Some(cancel) = holding.reading {
                cancel.cancel();
            }
            let unit = UnitId::Shard(shard.clone());
            units::lost(
                &self.worker,
                &mut self.counts,
                &unit,
                reason,
                self.held.len(),
            );
        }
    }
}

/// The shard a batch's marks name first (a fencing sink's batch holds one shard).
fn mark_shard(mark: &StreamMark) -> Option<&ShardId> {
    match mark {
        StreamMark::Advance(shard, _) | StreamMark::Finish(shard, _) => Some(shard),
        _ => None,
    }
}
