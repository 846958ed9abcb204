//! One worker of a pipeline: the leases it holds, the rounds that renew, take and steal them,
//! and the checkpoint writes of its units (docs/coordination.md §11.4, §11.7).
//!
//! The caller drives it: [`Worker::round`] every [`LeaseSettings::renew_interval`] with a
//! reading of its monotonic clock, [`Worker::sync`] after each discovery while it is the
//! leader, [`Worker::checkpoint`] as its units' batches are acknowledged, and
//! [`Worker::release_all`] on a graceful stop. Every method takes `&mut self`, so a worker's
//! writes to one lease never overlap and each is conditional on the counter the last left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::decide::{self, LocalTime, Observations, View};
use super::model::{
    Held, Lease, LeaseCounter, LeaseState, PipelineName, UnitId, UnitSpec, WorkerId,
};
use super::table::{LeaseError, LeaseTable};

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

/// A lease this worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holding {
    /// The counter its last successful write left.
    counter: LeaseCounter,
    /// When that write was sent, on this worker's clock (§11.3 rule 3).
    written_at: LocalTime,
    /// A write whose answer was lost: the row must be read before the next write (§11.2
    /// rule 4).
    unsettled: bool,
}

/// A lease this worker took: the caller starts the unit from its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The unit.
    pub unit: UnitId,
    /// Where the unit stands: resume after it (`None`: from its start).
    pub checkpoint: Option<String>,
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

/// Whether `row` is what this worker's finishing checkpoint on `holding` left: finished,
/// unowned, one past the counter held. Only the holder can write that.
fn ended_by(row: &Lease, holding: &Holding) -> bool {
    row.owner.is_none() && row.state.is_finished() && Some(row.counter) == holding.counter.next()
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
    table: T,
    pipeline: PipelineName,
    id: WorkerId,
    settings: LeaseSettings,
    held: BTreeMap<UnitId, Holding>,
    observations: Observations,
    /// The rows as last listed, updated by this worker's own writes since.
    rows: Vec<Lease>,
}

impl<T: LeaseTable> Worker<T> {
    /// A worker that holds nothing yet.
    pub fn new(table: T, pipeline: PipelineName, id: WorkerId, settings: LeaseSettings) -> Self {
        Worker {
            table,
            pipeline,
            id,
            settings,
            held: BTreeMap::new(),
            observations: Observations::default(),
            rows: Vec::new(),
        }
    }

    /// Its id.
    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// The table it writes to.
    pub fn table(&self) -> &T {
        &self.table
    }

    /// The work units it holds, in order.
    pub fn units(&self) -> Vec<UnitId> {
        self.held.keys().filter(|u| u.is_work()).cloned().collect()
    }

    /// The counter it holds on `unit`: the fencing token a keyed sink stores with the unit's
    /// position (§11.7 rule 4).
    pub fn counter(&self, unit: &UnitId) -> Option<LeaseCounter> {
        self.held.get(unit).map(|holding| holding.counter)
    }

    /// The pipeline its leases are kept under.
    pub fn pipeline(&self) -> &PipelineName {
        &self.pipeline
    }

    /// Its lease timing.
    pub fn settings(&self) -> LeaseSettings {
        self.settings
    }

    /// The pipeline's rows as last listed, updated by this worker's own writes since.
    pub fn rows(&self) -> &[Lease] {
        &self.rows
    }

    /// Whether `lease` is expired for this worker at `now` (§11.3): a round may take it.
    pub fn sees_expired(&self, lease: &Lease, now: LocalTime) -> bool {
        self.observations
            .is_expired(lease, now, self.settings.duration)
    }

    /// Whether it holds the leader lease.
    pub fn is_leader(&self) -> bool {
        self.held.contains_key(&UnitId::Leader)
    }

    fn held(&self, holding: &Holding) -> Held {
        Held {
            owner: self.id.clone(),
            counter: holding.counter,
        }
    }

    /// Forgets every lease not written for a lease duration (§11.3 rule 3).
    fn drop_expired(&mut self, now: LocalTime, lost: &mut Vec<Lost>) {
        let duration = self.settings.duration;
        let expired: Vec<UnitId> = self
            .held
            .iter()
            .filter(|(_, holding)| now.since(holding.written_at) >= duration)
            .map(|(unit, _)| unit.clone())
            .collect();
        for unit in expired {
            self.held.remove(&unit);
            lost.push(Lost {
                unit,
                reason: LostReason::Expired,
            });
        }
    }

    /// Reads the row after a write whose answer was lost (§11.2 rule 4): still this worker's,
    /// its counter is adopted; otherwise the lease is no longer held, for the reason returned.
    /// Returns the row read.
    async fn settle(
        &mut self,
        unit: &UnitId,
    ) -> Result<(Option<Lease>, Option<LostReason>), LeaseError> {
        let row = self.table.get(&self.pipeline, unit).await?;
        let reason = match (&row, self.held.get_mut(unit)) {
            (Some(row), Some(holding)) if row.is_owned_by(&self.id) => {
                holding.counter = row.counter;
                holding.unsettled = false;
                None
            }
            (Some(row), Some(holding)) if ended_by(row, holding) => Some(LostReason::Ended),
            _ => Some(LostReason::Taken),
        };
        if reason.is_some() {
            self.held.remove(unit);
        }
        Ok((row, reason))
    }

    /// Records the outcome of a write to a held lease: success moves the counter on, a
    /// conflict loses the lease, a transient failure leaves it unsettled.
    fn wrote(
        &mut self,
        unit: &UnitId,
        sent: LocalTime,
        result: &Result<Lease, LeaseError>,
    ) -> Option<Lost> {
        match result {
            Ok(row) if row.is_owned_by(&self.id) => {
                self.held.insert(
                    unit.clone(),
                    Holding {
                        counter: row.counter,
                        written_at: sent,
                        unsettled: false,
                    },
                );
                None
            }
            Ok(_) => {
                self.held.remove(unit);
                None
            }
            Err(LeaseError::Conflict { .. }) => {
                self.held.remove(unit);
                Some(Lost {
                    unit: unit.clone(),
                    reason: LostReason::Taken,
                })
            }
            Err(_) => {
                if let Some(holding) = self.held.get_mut(unit) {
                    holding.unsettled = true;
                }
                None
            }
        }
    }

    /// Renews every held lease not written for a third of the duration (§11.4 rule 1).
    async fn renew(&mut self, now: LocalTime, report: &mut RoundReport) -> Result<(), LeaseError> {
        let due: Vec<UnitId> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.unsettled || now.since(h.written_at) >= self.settings.renew_interval()
            })
            .map(|(unit, _)| unit.clone())
            .collect();
        for unit in due {
            if self.held.get(&unit).is_some_and(|h| h.unsettled) {
                match self.settle(&unit).await {
                    Ok((_, None)) => {}
                    Ok((_, Some(reason))) => {
                        report.lost.push(Lost { unit, reason });
                        continue;
                    }
                    Err(error @ LeaseError::Fatal(_)) => return Err(error),
                    Err(error) => {
                        report.transient.push(error);
                        continue;
                    }
                }
            }
            let Some(holding) = self.held.get(&unit).copied() else {
                continue;
            };
            let result = self
                .table
                .renew(&self.pipeline, &unit, &self.held(&holding))
                .await;
            if let Some(lost) = self.wrote(&unit, now, &result) {
                report.lost.push(lost);
            }
            match result {
                Err(error @ LeaseError::Fatal(_)) => return Err(error),
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                _ => {}
            }
        }
        Ok(())
    }

    /// Compares the listing with what this worker holds: a row that another owner or a newer
    /// counter holds is lost; an unsettled one that is still ours is settled.
    fn reconcile(&mut self, report: &mut RoundReport) {
        let rows: BTreeMap<&UnitId, &Lease> = self.rows.iter().map(|l| (&l.unit, l)).collect();
        let mut lost = Vec::new();
        for (unit, holding) in &mut self.held {
            match rows.get(unit) {
                Some(row) if row.is_owned_by(&self.id) && holding.unsettled => {
                    holding.counter = row.counter;
                    holding.unsettled = false;
                }
                Some(row) if row.is_owned_by(&self.id) && row.counter == holding.counter => {}
                Some(row) if holding.unsettled && ended_by(row, holding) => {
                    lost.push((unit.clone(), LostReason::Ended))
                }
                _ => lost.push((unit.clone(), LostReason::Taken)),
            }
        }
        for (unit, reason) in lost {
            self.held.remove(&unit);
            report.lost.push(Lost { unit, reason });
        }
    }

    /// One round (§11.4): drop leases not renewed in time, renew the due ones, list the
    /// pipeline's rows, report the leases lost, create the leader row when missing, and take
    /// and steal as [`decide::plan`] says. Only a fatal error ends it early; transient ones
    /// are reported and the next round retries.
    pub async fn round(&mut self, now: LocalTime) -> Result<RoundReport, LeaseError> {
        let mut report = RoundReport::default();
        self.drop_expired(now, &mut report.lost);
        self.renew(now, &mut report).await?;
        match self.table.list(&self.pipeline).await {
            Ok(rows) => self.rows = rows,
            Err(error @ LeaseError::Transient(_)) => {
                report.transient.push(error);
                return Ok(self.finish(report));
            }
            Err(error) => return Err(error),
        }
        self.observations.observe(&self.rows, now);
        self.reconcile(&mut report);
        if !self.rows.iter().any(|row| row.unit == UnitId::Leader) {
            let leader = Lease::new(UnitId::Leader, Vec::new(), self.table.clock_ms());
            match self.table.create(&self.pipeline, &leader).await {
                Ok(()) => self.rows.push(leader),
                Err(LeaseError::Conflict { .. }) => {}
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                Err(error) => return Err(error),
            }
            self.observations.observe(&self.rows, now);
        }
        let held: BTreeSet<UnitId> = self.held.keys().cloned().collect();
        let plan = decide::plan(&View {
            me: &self.id,
            leases: &self.rows,
            held: &held,
            observations: &self.observations,
            now,
            duration: self.settings.duration,
            max_steals: self.settings.max_steals_per_round,
        });
        report.target = plan.target;
        for claim in plan.claims {
            let taken = self
                .table
                .take(&self.pipeline, &claim.unit, claim.seen, &self.id)
                .await;
            match taken {
                Ok(row) => {
                    self.held.insert(
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
                // Someone else won the race; a lost reply is taken again next round (its row
                // names this worker, §11.4 rule 3).
                Err(LeaseError::Conflict { .. }) => {}
                Err(error @ LeaseError::Transient(_)) => report.transient.push(error),
                Err(error) => return Err(error),
            }
        }
        Ok(self.finish(report))
    }

    fn finish(&self, mut report: RoundReport) -> RoundReport {
        report.leader = self.is_leader();
        report.lost.retain(|lost| lost.unit.is_work());
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
        let plan = decide::sync(&self.rows, discovered, self.table.clock_ms());
        let mut failed: BTreeSet<UnitId> = BTreeSet::new();
        for lease in plan.create {
            // A child waits for the next sync when its parent's row could not be written.
            if lease.parents.iter().any(|parent| failed.contains(parent)) {
                failed.insert(lease.unit.clone());
                continue;
            }
            match self.table.create(&self.pipeline, &lease).await {
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
        for (unit, seen) in plan.delete {
            match self.table.delete(&self.pipeline, &unit, seen).await {
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
        checkpoint: &str,
        state: LeaseState,
        now: LocalTime,
    ) -> Result<LeaseCounter, CheckpointError> {
        let Some(holding) = self.held.get(unit).copied() else {
            return Err(CheckpointError::NotHeld(unit.clone()));
        };
        let lost = |reason| {
            CheckpointError::Lost(Lost {
                unit: unit.clone(),
                reason,
            })
        };
        if now.since(holding.written_at) >= self.settings.duration {
            self.held.remove(unit);
            return Err(lost(LostReason::Expired));
        }
        if holding.unsettled {
            let before = holding.counter;
            let (row, _) = self.settle(unit).await.map_err(CheckpointError::Request)?;
            if let Some(row) = row.filter(|row| {
                Some(row.counter) == before.next()
                    && row.checkpoint.as_deref() == Some(checkpoint)
                    && row.state == state
            }) {
                // The lost answer was this very checkpoint.
                self.held.remove(unit);
                self.wrote(unit, holding.written_at, &Ok(row.clone()));
                return Ok(row.counter);
            }
        }
        let Some(holding) = self.held.get(unit).copied() else {
            return Err(lost(LostReason::Taken));
        };
        let result = self
            .table
            .checkpoint(
                &self.pipeline,
                unit,
                &self.held(&holding),
                checkpoint,
                state,
            )
            .await;
        if let Some(lost) = self.wrote(unit, now, &result) {
            return Err(CheckpointError::Lost(lost));
        }
        match result {
            Ok(row) => {
                self.replace_row(row.clone());
                Ok(row.counter)
            }
            Err(error) => Err(CheckpointError::Request(error)),
        }
    }

    /// Hands every held lease back (§11.7 rule 3), the leader lease included: owner cleared,
    /// counter bumped, so others take them at once. Call it after the units' final
    /// checkpoints. Returns the leases that could not be handed back (they expire instead).
    pub async fn release_all(&mut self) -> Vec<(UnitId, LeaseError)> {
        let mut failed = Vec::new();
        let units: Vec<UnitId> = self.held.keys().cloned().collect();
        for unit in units {
            if self.held.get(&unit).is_some_and(|h| h.unsettled)
                && let Err(error) = self.settle(&unit).await
            {
                failed.push((unit.clone(), error));
            }
            let Some(holding) = self.held.remove(&unit) else {
                continue;
            };
            let result = self
                .table
                .release(&self.pipeline, &unit, &self.held(&holding))
                .await;
            if let Err(error) = result {
                failed.push((unit, error));
            }
        }
        failed
    }
}
