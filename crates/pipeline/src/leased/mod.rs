//! The leased run: one worker of several reading the units (scan segments, stream shards) it
//! holds through the lease table (docs/coordination.md §11.10, §11.11), writing them to its own
//! sink and checkpointing each unit in its lease row. One loop for every kind of unit; what a
//! kind reads, how its batches mark positions, what its leader writes and when its run ends are
//! the kind's ([`Units`]: `segments.rs`, `shards.rs`).
//!
//! # Ordering
//! 1. A unit's records are written and acknowledged before its position is checkpointed, so a
//!    lease row never runs ahead of the data (the same rule as docs/scan.md §2.5).
//! 2. A unit's position is written to its lease at most every `checkpoint_interval`, at once
//!    when the unit ends (which hands the lease back finished), and before a graceful stop
//!    hands the lease back.
//! 3. The worker's leases are renewed by its keeper, on a timer of its own: a slow batch or a
//!    busy reader delays the rounds, not the renewals (§11.4 rule 1).
//! 4. A lease reported lost (by the keeper, a round, a checkpoint whose condition failed, or a
//!    refused fence: then also handed back, should its row still name this worker) stops its
//!    unit at once: its reader is cancelled and nothing more is
//!    checkpointed for it. What the reader of a lost holding handed over and was not written
//!    yet is dropped: the unit's next owner reads it again after the last checkpoint, and
//!    written under a later holding's fence it could land after newer changes.
//!
//! # Fencing (§11.7 rule 4)
//! A sink that keeps lease fences (the keyed sinks: every worker writes one database) gets one
//! unit per batch, written with its unit's lease counter and the position it reaches in the
//! batch's transaction; a taken lease's counter is stored first (`Fencing::claim`), and the unit
//! resumes after the position stored with it. A batch whose fence holds a newer owner's counter
//! is refused with nothing written, and its unit is lost to this worker.
//!
//! # Ending
//! - The kind's end (a scan: every segment `Done`; a stream: idle or disabled), checked after
//!   each round. A worker that finishes a unit runs a round at once.
//! - `stop` (SIGINT/SIGTERM): reading stops, what was read is written, every held unit's last
//!   acknowledged position is checkpointed and every lease handed back, so the other workers
//!   take them at their next round.
//! - A read or sink failure: what was acknowledged is checkpointed, the leases are handed back,
//!   and the error is returned.

mod generations;
mod lease;
mod mirror;
mod repair;
mod rows;
mod segments;
mod shards;
mod units;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ddbpipe_source::lease::{
    KeeperHandle, Lease, LeaseCounter, LeaseError, LeaseTable, LocalTime, LostReason, UnitId,
    Worker,
};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use ddbpipe_source::streams::leased::ReadFlags;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use crate::batch::Batch;
use crate::runner::{Commit, Lane, Progress, RunError, Wrote};
use crate::sink::Sink;
use crate::state::identity::Identity;
use lease::{Checkpointed, Rounds, Took};
use units::{Units, View};

pub use lease::other_settings;
pub use mirror::{LeasedMirror, LeasedMirrorOutcome, SharedExports};
pub use rows::{leased_position, listed_position, row_shard};
pub use segments::{LeasedOutcome, LeasedScan};
pub use shards::{CHILD_LOOKUP_INTERVAL, LeasedStreamOutcome, LeasedStreams};

/// What one worker's leases did in a run (the run summary and `--json` name them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Leases taken, steals included.
    pub taken: u64,
    /// Of those, taken from a live worker (§11.4 rule 4).
    pub stolen: u64,
    /// Leases lost to another worker or to expiry.
    pub lost: u64,
    /// Units this worker read to their end.
    pub finished: u64,
}

/// A worker's run of one kind of units.
pub(crate) struct Leased<U, T> {
    /// The kind.
    pub units: U,
    /// This worker on the lease table.
    pub worker: Worker<T>,
    /// Least time between two checkpoints of one unit (`state.flush_interval_ms`).
    pub checkpoint_interval: Duration,
    /// The run's settings, kept in the leader row: a worker with other settings is refused.
    pub identity: Identity,
}

/// How a worker's run ended, when it did not fail.
pub(crate) struct Ran<E> {
    /// The kind's end.
    pub end: E,
    /// Records written and acknowledged by this worker.
    pub written: u64,
    /// What this worker's leases did.
    pub leases: LeaseCounts,
    /// The pipeline's rows as of the last round.
    pub rows: Vec<Lease>,
}

/// A unit this worker holds.
struct Holding {
    /// Told apart from earlier holdings of the same unit (what their readers handed over).
    generation: u64,
    /// Where the unit stands once the acknowledged batches are in; `None`: the row's own
    /// checkpoint stands (or the unit's start).
    acknowledged: Option<LeaseCheckpoint>,
    /// Where its reader starts.
    from: Option<LeaseCheckpoint>,
    /// Whether `acknowledged` (or the end) is newer than the lease row's checkpoint.
    unsaved: bool,
    /// When the lease row was last checkpointed.
    saved_at: Instant,
    /// Cancels its reader; `None` while it waits to read.
    reading: Option<CancelHandle>,
    /// What its reader says.
    flags: ReadFlags,
    /// Read to its end and acknowledged; the final checkpoint may still be due.
    ended: bool,
}

/// What a reader's task left.
type Joined = Result<(tokio::task::Id, (UnitId, Result<(), RunError>)), tokio::task::JoinError>;

/// The loop's state.
struct Run<U: Units, T> {
    units: U,
    worker: Worker<T>,
    identity: Identity,
    checkpoint_interval: Duration,
    origin: Instant,
    held: BTreeMap<UnitId, Holding>,
    tasks: JoinSet<(UnitId, Result<(), RunError>)>,
    running: HashMap<tokio::task::Id, UnitId>,
    /// Where every reader's task forwards, tagged with its holding's generation.
    tx: mpsc::Sender<(u64, UnitId, U::Read)>,
    generation: u64,
    counts: LeaseCounts,
    /// The run stops: no unit starts reading any more.
    stopping: bool,
    /// A unit was finished since the last round: the next one runs at once.
    finished_one: bool,
}

impl<U: Units, T: LeaseTable> Leased<U, T> {
    /// Runs this worker until its kind's end, `stop`, or a failure (module docs, Ending);
    /// gives the kind back with the end.
    pub(crate) async fn run<S: Sink>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<(Ran<U::End>, U), RunError> {
        let Leased {
            units,
            worker,
            checkpoint_interval,
            identity,
        } = self;
        let (tx, rx) = mpsc::channel(U::DEPTH);
        let mut run = Run {
            units,
            worker,
            identity,
            checkpoint_interval,
            origin: Instant::now(),
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            tx,
            generation: 0,
            counts: LeaseCounts::default(),
            stopping: false,
            finished_one: false,
        };
        let mut rounds = Rounds::new(run.origin, run.worker.settings().renew_interval());
        let mut keeper = run.worker.keeper().spawn(rounds.clock());
        let report =
            |written, run: &Run<U, T>| progress.advanced(written, run.units.capacity_units());
        // A fencing sink gets one unit per batch (module docs, Fencing).
        let mut lane = if sink.fencing().is_some() {
            Lane::by_hand_over(&report)
        } else {
            Lane::new(run.units.limits(), &report)
        };
        let result = run
            .drive(&mut lane, sink, rx, &stop, &mut rounds, &mut keeper)
            .await;
        // Whatever happened, what was acknowledged is checkpointed and the leases handed back,
        // so the other workers take them at their next round instead of after expiry.
        let saved = run.save_all(true).await;
        let released = run.worker.release_all().await;
        drop(keeper);
        for (unit, error) in &released {
            tracing::warn!(lease = %unit, error = %error, "A lease could not be handed back; it expires instead.");
        }
        let end = result?;
        saved?;
        let ran = Ran {
            end,
            written: lane.written,
            leases: run.counts,
            rows: run.worker.rows().to_vec(),
        };
        Ok((ran, run.units))
    }
}

impl<U: Units, T: LeaseTable> Run<U, T> {
    fn now(&self) -> LocalTime {
        LocalTime::new(self.origin.elapsed())
    }

    /// The loop; returns the kind's end.
    async fn drive<S: Sink>(
        &mut self,
        lane: &mut Lane<'_, Self>,
        sink: &mut S,
        mut rx: mpsc::Receiver<(u64, UnitId, U::Read)>,
        stop: &Cancel,
        rounds: &mut Rounds,
        keeper: &mut KeeperHandle,
    ) -> Result<U::End, RunError> {
        let end = loop {
            if std::mem::take(&mut self.finished_one) {
                rounds.soon();
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break self.units.stopped(),
                event = keeper.next() => {
                    if let Some(lost) = lease::kept(event, &self.worker)? {
                        self.lose(&lost.unit, &lost.reason);
                    }
                }
                () = tokio::time::sleep_until(rounds.next) => {
                    let (again, expiry) = self.round(sink, stop).await?;
                    if let Some(end) = self.ended(lane.batcher.has_pending()) {
                        break end;
                    }
                    // A leader that just created rows takes its share at once.
                    rounds.ran(expiry, again);
                }
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.joined(joined)?;
                }
                read = rx.recv() => {
                    let Some((generation, unit, read)) = read else { break self.units.stopped() };
                    self.received(lane, sink, generation, &unit, read).await?;
                }
                () = lane.lingered() => lane.finish(self, sink).await?,
            }
        };
        // Ending: reading stops, what was read is written.
        self.stopping = true;
        for holding in self.held.values_mut() {
            if let Some(cancel) = holding.reading.take() {
                cancel.cancel();
            }
        }
        // A reader may wait to hand something on: the channel is read while they end.
        while !self.tasks.is_empty() {
            tokio::select! {
                Some(joined) = self.tasks.join_next_with_id() => self.joined(joined)?,
                Some((generation, unit, read)) = rx.recv() => {
                    self.received(lane, sink, generation, &unit, read).await?;
                }
            }
        }
        while let Ok((generation, unit, read)) = rx.try_recv() {
            self.received(lane, sink, generation, &unit, read).await?;
        }
        lane.finish(self, sink).await?;
        Ok(end)
    }

    /// Why the run ends now, if it does.
    fn ended(&self, pending: bool) -> Option<U::End> {
        let worker = &self.worker;
        let now = self.now();
        let expired = |row: &Lease| worker.sees_expired(row, now);
        let view = View {
            rows: worker.rows(),
            held: self
                .held
                .iter()
                .map(|(unit, h)| (unit, &h.flags, h.ended))
                .collect(),
            pending,
            expired: &expired,
        };
        self.units.ended(&view)
    }

    /// One round (§11.4): renew, list, take, steal; as the leader, write the units' rows.
    /// Returns whether to run the next round at once, and when a lease seen standing still
    /// expires.
    async fn round<S: Sink>(
        &mut self,
        sink: &mut S,
        stop: &Cancel,
    ) -> Result<(bool, Option<LocalTime>), RunError> {
        let report = self.worker.round(self.now()).await?;
        if report.transient.is_empty() {
            // The lease table answered: a worker waiting for work is idle, not stalled.
            ddbpipe_source::health::answered();
        }
        let now = self.now();
        let identified = lease::same_run(&mut self.worker, &self.identity, now).await?;
        tracing::trace!(
            worker = %self.worker.id(),
            at_ms = self.origin.elapsed().as_millis() as u64,
            held = self.held.len(),
            leader = report.leader,
            target = report.target,
            "Lease round."
        );
        for error in &report.transient {
            tracing::debug!(error = %error, "A lease request failed; the next round retries it.");
        }
        for lost in report.lost {
            self.lose(&lost.unit, &lost.reason);
        }
        for taken in report.taken {
            if !self.units.owns(&taken.unit) {
                continue;
            }
            let held = self.held.len() + 1;
            let claimed =
                match lease::took(&self.worker, &mut self.counts, sink, &taken, held).await? {
                    Took::Held(claimed) => claimed,
                    Took::Lost => continue,
                };
            // A fencing sink's position was committed with its rows: it is the newer one.
            let at = claimed.or(taken.checkpoint);
            self.units.starts(&taken.unit, at.as_ref())?;
            // Held here still: the keeper lost the earlier tenure while this round ran (its
            // report is on its way, and `lease::kept` drops it): that tenure stops first.
            if self.held.contains_key(&taken.unit) {
                self.lose(&taken.unit, &LostReason::Expired);
            }
            self.take(taken.unit, at);
        }
        let mut again = false;
        if report.leader
            && identified
            && let Some(specs) = self.units.specs(self.worker.rows(), stop).await?
        {
            let synced = self.worker.sync(&specs).await?;
            for error in &synced.transient {
                tracing::debug!(error = %error, "A lease row could not be written; the next round retries it.");
            }
            if !synced.created.is_empty() {
                tracing::info!(created = synced.created.len(), "Leases created.");
                again = true;
            }
        }
        self.units.check(self.worker.rows())?;
        self.save_all(false).await?;
        self.start_reading()?;
        let held: Vec<(&UnitId, &ReadFlags)> = self
            .held
            .iter()
            .filter(|(_, h)| !h.ended)
            .map(|(unit, h)| (unit, &h.flags))
            .collect();
        self.units.measured(self.worker.rows(), &held);
        Ok((again, report.next_expiry))
    }

    /// A unit just taken at `at`: held, to be read from there. One read to its end whose
    /// final checkpoint was lost has it written at once.
    fn take(&mut self, unit: UnitId, at: Option<LeaseCheckpoint>) {
        let ended = at.as_ref().is_some_and(LeaseCheckpoint::is_finished);
        self.generation += 1;
        self.held.insert(
            unit,
            Holding {
                generation: self.generation,
                acknowledged: None,
                from: at.filter(|_| !ended),
                unsaved: ended,
                saved_at: Instant::now(),
                reading: None,
                flags: ReadFlags::default(),
                ended,
            },
        );
    }

    /// Starts the held units that wait, as many as the kind lets read at once.
    fn start_reading(&mut self) -> Result<(), RunError> {
        if self.stopping {
            return Ok(());
        }
        // Units reading, by kind (segments, shards): counted once, not per unit.
        let kind = |unit: &UnitId| usize::from(matches!(unit, UnitId::Shard(_)));
        let mut reading = [0usize; 2];
        for (unit, _) in self.held.iter().filter(|(_, h)| h.reading.is_some()) {
            reading[kind(unit)] += 1;
        }
        for (unit, holding) in &mut self.held {
            if holding.reading.is_some()
                || holding.ended
                || !self.units.may_read(unit, reading[kind(unit)])
            {
                continue;
            }
            let (cancel, cancelled) = Cancel::new();
            let (tx, mut rx) = mpsc::channel(U::DEPTH);
            let read = self.units.read(
                unit,
                holding.from.as_ref(),
                tx,
                cancelled,
                holding.flags.clone(),
            )?;
            let generation = holding.generation;
            let out = self.tx.clone();
            let id = unit.clone();
            let forwarded = id.clone();
            // Each holding hands over through its own channel, forwarded tagged with its
            // generation: what an earlier holding of the unit read is told apart (`received`).
            let handle = self.tasks.spawn(
                async move {
                    let forward = async move {
                        while let Some(read) = rx.recv().await {
                            if out
                                .send((generation, forwarded.clone(), read))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    };
                    let (result, ()) = tokio::join!(read, forward);
                    (id, result)
                }
                .in_current_span(),
            );
            self.running.insert(handle.id(), unit.clone());
            holding.reading = Some(cancel);
            reading[kind(unit)] += 1;
        }
        Ok(())
    }

    /// A reader's task ended: at its unit's end (its end mark follows through the channel),
    /// cancelled because its lease was lost or the run stops, or failed.
    fn joined(&mut self, joined: Joined) -> Result<(), RunError> {
        match joined {
            Ok((id, (unit, result))) => {
                self.running.remove(&id);
                if let Err(error) = &result {
                    tracing::error!(lease = %unit, error = %error, "Read failed.");
                }
                result
            }
            Err(error) => match self.running.remove(&error.id()) {
                Some(unit) if error.is_panic() => Err(self.units.panicked(&unit)),
                _ => Ok(()),
            },
        }
    }

    /// A reader handed something over: into the lane (a fencing sink's batch is one
    /// hand-over). What a holding that is lost handed over is dropped (module docs, 4).
    async fn received<S: Sink>(
        &mut self,
        lane: &mut Lane<'_, Self>,
        sink: &mut S,
        generation: u64,
        unit: &UnitId,
        read: U::Read,
    ) -> Result<(), RunError> {
        let current = self
            .held
            .get(unit)
            .is_some_and(|holding| holding.generation == generation);
        if !current {
            return Ok(());
        }
        let full = self.units.push(&mut lane.batcher, read);
        lane.deliver_all(self, sink, full).await
    }

    /// Checkpoints the held units whose acknowledged position is newer than their row: ended
    /// ones always, the others once `checkpoint_interval` passed (or all, with `every`).
    async fn save_all(&mut self, every: bool) -> Result<(), RunError> {
        let due: Vec<(UnitId, LeaseCheckpoint)> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.unsaved && (every || h.ended || h.saved_at.elapsed() >= self.checkpoint_interval)
            })
            .filter_map(|(unit, h)| match (&h.acknowledged, h.ended) {
                (_, true) => Some((unit.clone(), unit.end())),
                (Some(at), false) => Some((unit.clone(), at.clone())),
                (None, false) => None,
            })
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let now = self.now();
        let results = self.worker.checkpoint_each(&due, now).await;
        for ((unit, _), result) in due.into_iter().zip(results) {
            match lease::checkpointed(&unit, result)? {
                Checkpointed::Saved(counter) => self.saved(&unit, counter),
                Checkpointed::Lost(reason) => self.lose(&unit, &reason),
                // Kept unsaved: the next batch or round writes it again.
                Checkpointed::Later => {}
            }
        }
        Ok(())
    }

    fn saved(&mut self, unit: &UnitId, counter: LeaseCounter) {
        let Some(holding) = self.held.get_mut(unit) else {
            return;
        };
        holding.unsaved = false;
        holding.saved_at = Instant::now();
        if holding.ended {
            self.held.remove(unit);
            self.finished_one = true;
            self.counts.finished += 1;
            lease::event(&self.worker, "finished", self.held.len());
            tracing::debug!(
                lease = %unit,
                counter = counter.0,
                "Unit read to its end; its lease is finished and handed back."
            );
        }
    }

    /// A lease is lost: its unit stops at once, without another checkpoint.
    fn lose(&mut self, unit: &UnitId, reason: &LostReason) {
        if let Some(holding) = self.held.remove(unit) {
            if let Some(cancel) = holding.reading {
                cancel.cancel();
            }
            let held = self.held.len();
            lease::lost(&self.worker, &mut self.counts, unit, reason, held);
        }
    }
}

/// A worker's lane commits to the lease rows: a batch is written (a fencing sink's under its
/// unit's fence, module docs), then the positions it reaches are marked on its units' holdings
/// and checkpointed when due.
impl<U: Units, T: LeaseTable> Commit for Run<U, T> {
    async fn commit<S: Sink>(&mut self, sink: &mut S, batch: &Batch) -> Result<Wrote, RunError> {
        let marks = self.units.marks(batch);
        let wrote = if self.units.writes(batch) {
            // A fencing sink's batch is one unit's; the position it reaches goes with the rows.
            let unit = marks.first().map(|(unit, _)| unit.clone());
            let position = marks.last().map(|(_, at)| at.clone());
            let mark = unit
                .as_ref()
                .map(|unit| self.units.snapshot_of(unit))
                .unwrap_or_default();
            let written =
                lease::write(&self.worker, sink, unit.clone(), position, mark, batch).await?;
            if !written {
                if let Some(unit) = unit {
                    self.lose(&unit, &LostReason::Taken);
                    // Handed back, should its row still name this worker (a sink fenced by
                    // a stale claim, docs/sinks.md §7.7): another worker takes it at once.
                    if let Err(error) = self.worker.release(&unit).await {
                        tracing::debug!(lease = %unit, %error, "A fenced unit's lease was not handed back.");
                    }
                }
                return Ok(Wrote::Fenced);
            }
            self.units.written(batch);
            Wrote::Acknowledged
        } else {
            Wrote::Nothing
        };
        for (unit, at) in marks {
            // A unit whose lease was lost is not checkpointed any more (module docs, 4).
            let Some(holding) = self.held.get_mut(&unit) else {
                continue;
            };
            holding.unsaved = true;
            if at.is_finished() {
                holding.ended = true;
                if let Some(cancel) = holding.reading.take() {
                    cancel.cancel();
                }
            } else {
                holding.acknowledged = Some(at);
            }
        }
        self.save_all(false).await?;
        self.start_reading()?;
        Ok(wrote)
    }
}

/// The failure of a lease row whose checkpoint is not a position of its kind: it names the row.
pub(crate) fn unreadable(unit: &UnitId, at: &LeaseCheckpoint) -> RunError {
    RunError::Lease(LeaseError::Fatal(unit.unreadable(at)))
}
