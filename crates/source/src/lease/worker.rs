//! One worker of a pipeline: the leases it holds, the rounds that renew, take and steal them,
//! and the checkpoint writes of its units (docs/coordination.md §11.4, §11.7).
//!
//! The caller drives it: [`Worker::round`] every [`LeaseSettings::renew_interval`] (and at
//! [`RoundReport::next_expiry`]) with a reading of its monotonic clock, [`Worker::sync`] after
//! each discovery while it is the leader, [`Worker::checkpoint`] as its units' batches are
//! acknowledged, and [`Worker::release_all`] on a graceful stop. Its [`LeaseKeeper`]
//! ([`Worker::keeper`]) renews the held leases on a timer of its own, so a caller busy with a
//! slow write does not lose them; the writes to one lease never overlap, whoever sends them,
//! and each is conditional on the counter the last left (`holdings.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::decide::{self, LocalTime, Observations, View};
use super::holdings::{Holding, Lessee};
use super::keeper::LeaseKeeper;
use super::table::{LeaseError, LeaseTable};
use super::{Lease, LeaseCounter, PipelineName, UnitId, UnitSpec, WorkerId};
use crate::position::LeaseCheckpoint;

/// Lease timing, validated (`coordination.lease_duration_secs`, §11.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// A lease whose counter has not moved for this long is expired.
    pub duration: Duration,
    /// Most leases stolen per round (§11.4 rule 4).
    pub max_steals_per_round: usize,
}

/// A lease duration outside 3..=300 seconds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("coordination.lease_duration_secs must be 3 to 300, not {0}")]
pub struct BadLeaseDuration(pub u64);

impl LeaseSettings {
    /// `lease_duration_secs` of 3 to 300; one steal per round.
    pub fn new(duration_secs: u64) -> Result<Self, BadLeaseDuration> {
        if !(3..=300).contains(&duration_secs) {
            return Err(BadLeaseDuration(duration_secs));
        }
        Ok(LeaseSettings {
            duration: Duration::from_secs(duration_secs),
            max_steals_per_round: 1,
        })
    }

    /// How often the caller runs a round: a third of the duration (§11.4 rule 1).
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }
}

/// Lease-table writes of one kind a worker has in flight at once (a round's takes, a listing's
/// new rows, a batch's checkpoints): a few milliseconds each, so thousands of shards are
/// written in seconds, not minutes.
pub const WRITES_AT_ONCE: usize = 16;

/// A lease this worker took: the caller starts the unit from its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The unit.
    pub unit: UnitId,
    /// Where the unit stands: resume after it (`None`: from its start).
    pub checkpoint: Option<LeaseCheckpoint>,
    /// The counter now held: the fencing token (§11.7).
    pub counter: LeaseCounter,
    /// Whom it was stolen from, if it was.
    pub stolen_from: Option<WorkerId>,
}

/// Why a lease is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// Someone else wrote the row: took or stole it, or it was deleted.
    Taken,
    /// Not renewed for a lease duration: others may have taken it (§11.3 rule 3).
    Expired,
    /// The unit's final checkpoint was applied, though its answer was lost: the unit is
    /// finished and its lease handed back (§11.2 rule 4).
    Ended,
}

/// A lease this worker lost: the caller stops the unit at once, without committing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The unit.
    pub unit: UnitId,
    /// Why.
    pub reason: LostReason,
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Work leases taken or stolen this round.
    pub taken: Vec<Taken>,
    /// Work leases lost: stop these units.
    pub lost: Vec<Lost>,
    /// Whether this worker holds the leader lease after the round.
    pub leader: bool,
    /// This worker's fair share.
    pub target: usize,
    /// Transient failures met: the round did what it could without them.
    pub transient: Vec<LeaseError>,
    /// When, on this worker's clock, the first lease it saw standing still expires for it:
    /// a round then takes it over without waiting for the next regular round (§11.4 rule 5).
    pub next_expiry: Option<LocalTime>,
}

/// What a leader's [`Worker::sync`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Rows created.
    pub created: Vec<UnitId>,
    /// Finished rows deleted.
    pub deleted: Vec<UnitId>,
    /// Transient failures met; the next sync writes what is still missing.
    pub transient: Vec<LeaseError>,
}

/// Why a checkpoint was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Definite for the unit: this worker does not hold its lease.
    #[error("lease {0} is not held by this worker")]
    NotHeld(UnitId),
    /// Definite for the unit: the lease is lost; stop the unit without committing.
    #[error("lease {} is lost ({:?})", .0.unit, .0.reason)]
    Lost(Lost),
    /// The request failed; the same checkpoint may be retried.
    #[error(transparent)]
    Request(LeaseError),
}

/// One worker of one pipeline on a lease table.
#[derive(Debug)]
pub struct Worker<T> {
    lessee: Arc<Lessee<T>>,
    observations: Observations,
    /// The rows as last listed, updated by this worker's own writes since.
    rows: Vec<Lease>,
    /// When the last round listed them.
    last_round: LocalTime,
}

impl<T: LeaseTable + Clone> Worker<T> {
    /// A worker of the same owner, table and settings that holds nothing yet, for the leases
    /// kept under `pipeline` (a shared mirror's generation, docs/coordination.md §11.12 rule 8).
    pub fn under(&self, pipeline: PipelineName) -> Worker<T> {
        Worker::new(
            self.lessee.table.clone(),
            pipeline,
            self.lessee.id.clone(),
            self.lessee.settings,
        )
    }
}

impl<T: LeaseTable> Worker<T> {
    /// A worker that holds nothing yet.
    pub fn new(table: T, pipeline: PipelineName, id: WorkerId, settings: LeaseSettings) -> Self {
        Worker {
            lessee: Arc::new(Lessee::new(table, pipeline, id, settings)),
            observations: Observations::default(),
            rows: Vec::new(),
            last_round: LocalTime::default(),
        }
    }

    /// The keeper that renews this worker's leases on its own timer ([`LeaseKeeper::spawn`]),
    /// or pass by pass ([`LeaseKeeper::pass`]).
    pub fn keeper(&self) -> LeaseKeeper<T> {
        LeaseKeeper::new(Arc::clone(&self.lessee))
    }

    /// Its id.
    pub fn id(&self) -> &WorkerId {
        &self.lessee.id
    }

    /// The table it writes to.
    pub fn table(&self) -> &T {
        &self.lessee.table
    }

    /// The work units it holds, in order.
    pub fn units(&self) -> Vec<UnitId> {
        self.lessee
            .held()
            .into_iter()
            .map(|(unit, _)| unit)
            .filter(UnitId::is_work)
            .collect()
    }

    /// The counter it holds on `unit`: the fencing token a keyed sink stores with the unit's
    /// position (§11.7 rule 4).
    pub fn counter(&self, unit: &UnitId) -> Option<LeaseCounter> {
        self.lessee.get(unit).map(|holding| holding.counter)
    }

    /// The pipeline its leases are kept under.
    pub fn pipeline(&self) -> &PipelineName {
        &self.lessee.pipeline
    }

    /// Its lease timing.
    pub fn settings(&self) -> LeaseSettings {
        self.lessee.settings
    }

    /// The pipeline's rows as last listed, updated by this worker's own writes since.
    pub fn rows(&self) -> &[Lease] {
        &self.rows
    }

    /// Whether `lease` is expired for this worker at `now` (§11.3): a round may take it.
    pub fn sees_expired(&self, lease: &Lease, now: LocalTime) -> bool {
        self.observations
            .is_expired(lease, now, self.lessee.settings.duration)
    }

    /// Whether it holds the leader lease.
    pub fn is_leader(&self) -> bool {
        self.lessee.holds(&UnitId::Leader)
    }

    /// One round (§11.4): drop leases not renewed in time, renew the due ones (the keeper
    /// does it too, on its own timer), list the pipeline's rows, report the leases lost,
    /// create the leader row when missing, and take and steal as [`decide::plan`] says; a
    /// free lease another worker takes first is replaced by the next free one. Only a fatal
    /// error ends it early; transient ones are reported and the next round retries.
    pub async fn round(&mut self, now: LocalTime) -> Result<RoundReport, LeaseError> {
        let mut report = RoundReport::default();
        let renewed = self.lessee.renew_due(now).await?;
        report.lost.extend(renewed.lost);
        report.transient.extend(renewed.transient);
        let lessee = Arc::clone(&self.lessee);
        match lessee.table.list(&lessee.pipeline).await {
            Ok(rows) => self.rows = rows,
            Err(error @ LeaseError::Transient(_)) => {
                report.transient.push(error);
                return Ok(self.finish(report, now));
            }
            Err(error) => return Err(error),
        }
        self.observations.observe(&self.rows, now);
        lessee.reconcile(&self.rows, &mut report.lost);
        // The leader row, and this worker's presence row (§11.2 rule 7), when missing.
        for unit in [UnitId::Leader, UnitId::presence(&lessee.id)] {
            if self.rows.iter().any(|row| row.unit == unit) {
                continue;
            }
            let row = Lease::new(unit, Vec::new(), lessee.table.clock_ms());
            match lessee.table.create(&lessee.pipeline, &row).await {
                Ok(()) => self.rows.push(row),
                Err(LeaseError::Conflict { .. }) => {}
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                Err(error) => return Err(error),
            }
            self.observations.observe(&self.rows, now);
        }
        self.last_round = now;
        let held: BTreeSet<UnitId> = lessee.held().into_iter().map(|(unit, _)| unit).collect();
        let plan = decide::plan(&View {
            me: &lessee.id,
            leases: &self.rows,
            held: &held,
            observations: &self.observations,
            now,
            duration: lessee.settings.duration,
            max_steals: lessee.settings.max_steals_per_round,
        });
        report.target = plan.target;
        let mut spare = plan.spare.into_iter();
        let mut claims: std::collections::VecDeque<decide::Claim> = plan.claims.into();
        while !claims.is_empty() {
            // Up to WRITES_AT_ONCE takes in flight; their answers are read in the claims' order.
            let wave: Vec<decide::Claim> =
                claims.drain(..claims.len().min(WRITES_AT_ONCE)).collect();
            let takes: Vec<_> = wave
                .iter()
                .map(|claim| {
                    lessee
                        .table
                        .take(&lessee.pipeline, &claim.unit, claim.seen, &lessee.id)
                })
                .collect();
            let answers = join_all(takes).await;
            for (claim, taken) in wave.into_iter().zip(answers) {
                self.took(claim, taken, now, &mut spare, &mut claims, &mut report)?;
            }
        }
        Ok(self.finish(report, now))
    }

    /// The answer to one claim's take: held, lost to another worker (the next spare is claimed
    /// instead), or failed.
    fn took(
        &mut self,
        claim: decide::Claim,
        taken: Result<Lease, LeaseError>,
        now: LocalTime,
        spare: &mut impl Iterator<Item = decide::Claim>,
        claims: &mut std::collections::VecDeque<decide::Claim>,
        report: &mut RoundReport,
    ) -> Result<(), LeaseError> {
        let lessee = Arc::clone(&self.lessee);
        {
            match taken {
                Ok(row) => {
                    lessee.insert(
                        claim.unit.clone(),
                        Holding {
                            counter: row.counter,
                            written_at: now,
                            unsettled: false,
                        },
                    );
                    if claim.unit.is_work() {
                        report.taken.push(Taken {
                            unit: claim.unit,
                            checkpoint: row.checkpoint.clone(),
                            counter: row.counter,
                            stolen_from: claim.victim,
                        });
                    }
                    self.replace_row(row);
                }
                // Someone else won the race: the next free lease instead (a steal is not
                // replaced). A lost reply is taken again next round (its row names this
                // worker, §11.4 rule 3).
                Err(LeaseError::Conflict { .. }) => {
                    if claim.unit.is_work()
                        && claim.victim.is_none()
                        && let Some(next) = spare.next()
                    {
                        claims.push_front(next);
                    }
                }
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn finish(&self, mut report: RoundReport, now: LocalTime) -> RoundReport {
        report.leader = self.is_leader();
        report.lost.retain(|lost| lost.unit.is_work());
        let duration = self.lessee.settings.duration;
        report.next_expiry = self
            .rows
            .iter()
            .filter(|row| row.unit.is_work() || row.unit == UnitId::Leader)
            .filter(|row| !row.state.is_finished() && !row.is_owned_by(&self.lessee.id))
            .filter_map(|row| self.observations.expires_at(row, duration))
            .filter(|at| *at > now)
            .min();
        report
    }

    fn replace_row(&mut self, row: Lease) {
        match self.rows.iter_mut().find(|r| r.unit == row.unit) {
            Some(known) => *known = row,
            None => self.rows.push(row),
        }
    }

    /// As the leader, writes the rows of a discovery (§11.5): creates the missing ones,
    /// parents first, and deletes finished ones no longer discovered, from the rows of the
    /// last round. Does nothing when this worker is not the leader.
    pub async fn sync(&mut self, discovered: &[UnitSpec]) -> Result<SyncReport, LeaseError> {
        let mut report = SyncReport::default();
        if !self.is_leader() {
            return Ok(report);
        }
        let plan = decide::sync(&self.rows, discovered, self.lessee.table.clock_ms());
        let mut failed: BTreeSet<UnitId> = BTreeSet::new();
        let mut pending = plan.create;
        // In waves: a row is written once its parents' rows are (never a child before its
        // parent, §11.6), up to WRITES_AT_ONCE at a time.
        while !pending.is_empty() {
            let waiting: BTreeSet<UnitId> = pending.iter().map(|l| l.unit.clone()).collect();
            let (wave, later): (Vec<Lease>, Vec<Lease>) = pending
                .into_iter()
                .partition(|l| !l.parents.iter().any(|parent| waiting.contains(parent)));
            pending = later;
            // A child waits for the next sync when its parent's row could not be written.
            let (skipped, wave): (Vec<Lease>, Vec<Lease>) = wave
                .into_iter()
                .partition(|l| l.parents.iter().any(|parent| failed.contains(parent)));
            failed.extend(skipped.into_iter().map(|l| l.unit));
            let lessee = Arc::clone(&self.lessee);
            let mut answers = Vec::with_capacity(wave.len());
            for chunk in wave.chunks(WRITES_AT_ONCE) {
                let creates: Vec<_> = chunk
                    .iter()
                    .map(|lease| lessee.table.create(&lessee.pipeline, lease))
                    .collect();
                answers.extend(join_all(creates).await);
            }
            for (lease, created) in wave.into_iter().zip(answers) {
                match created {
                    Ok(()) => {
                        report.created.push(lease.unit.clone());
                        self.replace_row(lease);
                    }
                    Err(LeaseError::Conflict { .. }) => {}
                    Err(error @ LeaseError::Transient(_)) => {
                        failed.insert(lease.unit.clone());
                        report.transient.push(error);
                    }
                    Err(error) => return Err(error),
                }
            }
        }
        // Presence rows no process renews any more (it died, or handed back): deleted, so
        // the table does not keep one per process that ever ran (§11.2 rule 7).
        let duration = self.lessee.settings.duration;
        let gone = self.rows.iter().filter(|row| {
            matches!(row.unit, UnitId::Worker(_))
                && !row.is_owned_by(&self.lessee.id)
                && (row.owner.is_none()
                    || self.observations.is_expired(row, self.last_round, duration))
        });
        let gone: Vec<(UnitId, LeaseCounter)> =
            gone.map(|row| (row.unit.clone(), row.counter)).collect();
        for (unit, seen) in plan.delete.into_iter().chain(gone) {
            match self
                .lessee
                .table
                .delete(&self.lessee.pipeline, &unit, seen)
                .await
            {
                Ok(()) => {
                    self.rows.retain(|row| row.unit != unit);
                    report.deleted.push(unit);
                }
                Err(LeaseError::Conflict { .. }) => {}
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    /// Writes `unit`'s checkpoint and state, conditional on the counter held (§11.7 rule 1),
    /// and returns the counter it leaves. A finished state also hands the lease back
    /// (rule 2). A lease not renewed for a duration is not written at all: it is lost
    /// (§11.3 rule 3). After a transient failure the same call may be retried: the row is
    /// read first, and a checkpoint that was applied is not written twice.
    pub async fn checkpoint(
        &mut self,
        unit: &UnitId,
        checkpoint: &LeaseCheckpoint,
        now: LocalTime,
    ) -> Result<LeaseCounter, CheckpointError> {
        let row = self.lessee.checkpoint(unit, checkpoint, now).await?;
        let counter = row.counter;
        self.replace_row(row);
        Ok(counter)
    }

    /// Writes several units' checkpoints as [`Worker::checkpoint`] does, up to
    /// [`WRITES_AT_ONCE`] at a time; the answers come in the order given.
    pub async fn checkpoint_each(
        &mut self,
        checkpoints: &[(UnitId, LeaseCheckpoint)],
        now: LocalTime,
    ) -> Vec<Result<LeaseCounter, CheckpointError>> {
        let lessee = Arc::clone(&self.lessee);
        let mut answers = Vec::with_capacity(checkpoints.len());
        for chunk in checkpoints.chunks(WRITES_AT_ONCE) {
            let writes: Vec<_> = chunk
                .iter()
                .map(|(unit, checkpoint)| lessee.checkpoint(unit, checkpoint, now))
                .collect();
            answers.extend(join_all(writes).await);
        }
        answers
            .into_iter()
            .map(|answer| {
                let row = answer?;
                let counter = row.counter;
                self.replace_row(row);
                Ok(counter)
            })
            .collect()
    }

    /// Hands every held lease back (§11.7 rule 3), the leader lease included: owner cleared,
    /// counter bumped, so others take them at once. Call it after the units' final
    /// checkpoints. Returns the leases that could not be handed back (they expire instead).
    pub async fn release_all(&mut self) -> Vec<(UnitId, LeaseError)> {
        self.lessee.release_all().await
    }

    /// Hands one held lease back, as [`Worker::release_all`] does each: for a unit this worker
    /// stopped reading while its row still names it (a sink fenced its writes, docs/sinks.md
    /// §7.7), so another worker takes it at its next round. Nothing when it is not held; a
    /// row another worker took meanwhile stays theirs (the write is conditional).
    pub async fn release(&mut self, unit: &UnitId) -> Result<(), LeaseError> {
        self.lessee.release(unit).await
    }
}
