//! The leases one worker holds, and every write to them: renewals, checkpoints, hand-backs
//! (docs/coordination.md §11.2 to §11.4, §11.7).
//!
//! Shared by the [`super::Worker`] (its rounds take leases and write checkpoints) and its
//! [`super::LeaseKeeper`] (which renews them on its own timer), so the writes to one lease are
//! serialized: each goes through the lease's write permit, and each is conditional on the
//! counter the last one left. A write never waits on anything but the lease table.
//!
//! # Rules
//! 1. A lease not written for a lease duration (by the time the write was sent) is lost: it is
//!    forgotten and reported [`LostReason::Expired`], and nothing more is written to it
//!    (§11.3 rule 3). Others take it only after seeing its last counter unchanged for a
//!    duration of their clocks, which starts after the write was applied.
//! 2. A lease is renewed once it was not written for a third of the duration (a checkpoint
//!    counts as a write).
//! 3. A write whose condition failed loses the lease ([`LostReason::Taken`]); one whose
//!    answer was lost leaves it unsettled, and the row is read before the next write to it
//!    (§11.2 rule 4).
//! 4. Whoever removes a lease from the holdings reports its loss, once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::join_all;

use super::decide::LocalTime;
use super::table::{LeaseError, LeaseTable};
use super::worker::{CheckpointError, LeaseSettings, Lost, LostReason, WRITES_AT_ONCE};
use super::{Held, Lease, LeaseCounter, LeaseState, PipelineName, UnitId, WorkerId};
use crate::position::LeaseCheckpoint;

/// A lease this worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holding {
    /// The counter its last successful write left.
    pub(super) counter: LeaseCounter,
    /// When that write was sent, on this worker's clock (§11.3 rule 3).
    pub(super) written_at: LocalTime,
    /// A write whose answer was lost: the row must be read before the next write (§11.2
    /// rule 4).
    pub(super) unsettled: bool,
}

/// One held lease: its state, and the permit each write to it holds while in flight.
#[derive(Debug)]
struct Slot {
    /// `None` once the lease is no longer held.
    holding: Mutex<Option<Holding>>,
    writing: tokio::sync::Mutex<()>,
}

impl Slot {
    fn get(&self) -> Option<Holding> {
        *lock(&self.holding)
    }

    fn set(&self, holding: Option<Holding>) {
        *lock(&self.holding) = holding;
    }
}

fn lock<V>(mutex: &Mutex<V>) -> MutexGuard<'_, V> {
    // Nothing panics while these are locked; a poisoned one still holds valid data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether `row` is what this worker's finishing checkpoint on `holding` left: finished,
/// unowned, one past the counter held. Only the holder can write that.
pub(super) fn ended_by(row: &Lease, holding: &Holding) -> bool {
    row.owner.is_none() && row.state.is_finished() && Some(row.counter) == holding.counter.next()
}

/// What a pass of renewals did.
#[derive(Debug, Default)]
pub(super) struct Renewed {
    /// Leases lost: not written in time, or written by someone else.
    pub(super) lost: Vec<Lost>,
    /// Transient failures; the leases concerned are retried.
    pub(super) transient: Vec<LeaseError>,
}

/// One worker's holdings and the lease table they are written to.
#[derive(Debug)]
pub(super) struct Lessee<T> {
    pub(super) table: T,
    pub(super) pipeline: PipelineName,
    pub(super) id: WorkerId,
    pub(super) settings: LeaseSettings,
    slots: Mutex<BTreeMap<UnitId, Arc<Slot>>>,
}

impl<T: LeaseTable> Lessee<T> {
    pub(super) fn new(
        table: T,
        pipeline: PipelineName,
        id: WorkerId,
        settings: LeaseSettings,
    ) -> Self {
        Lessee {
            table,
            pipeline,
            id,
            settings,
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    fn slot(&self, unit: &UnitId) -> Option<Arc<Slot>> {
        lock(&self.slots).get(unit).cloned()
    }

    /// The held leases, in unit order.
    pub(super) fn held(&self) -> Vec<(UnitId, Holding)> {
        lock(&self.slots)
            .iter()
            .filter_map(|(unit, slot)| slot.get().map(|h| (unit.clone(), h)))
            .collect()
    }

    /// The holding of `unit`, when held.
    pub(super) fn get(&self, unit: &UnitId) -> Option<Holding> {
        self.slot(unit).and_then(|slot| slot.get())
    }

    /// Whether `unit` is held.
    pub(super) fn holds(&self, unit: &UnitId) -> bool {
        self.get(unit).is_some()
    }

    /// Holds `unit` after a take.
    pub(super) fn insert(&self, unit: UnitId, holding: Holding) {
        let mut slots = lock(&self.slots);
        match slots.get(&unit) {
            Some(slot) => slot.set(Some(holding)),
            None => {
                slots.insert(
                    unit,
                    Arc::new(Slot {
                        holding: Mutex::new(Some(holding)),
                        writing: tokio::sync::Mutex::new(()),
                    }),
                );
            }
        }
    }

    /// Forgets `unit`; `true` when it was held (the caller reports the loss, rule 4).
    pub(super) fn remove(&self, unit: &UnitId) -> bool {
        let slot = lock(&self.slots).remove(unit);
        slot.is_some_and(|slot| {
            let was = slot.get().is_some();
            slot.set(None);
            was
        })
    }

    fn held_by(&self, holding: &Holding) -> Held {
        Held {
            owner: self.id.clone(),
            counter: holding.counter,
        }
    }

    /// Forgets every lease not written for a lease duration (rule 1).
    pub(super) fn drop_expired(&self, now: LocalTime, lost: &mut Vec<Lost>) {
        let duration = self.settings.duration;
        for (unit, holding) in self.held() {
            if now.since(holding.written_at) >= duration && self.remove(&unit) {
                lost.push(Lost {
                    unit,
                    reason: LostReason::Expired,
                });
            }
        }
    }

    /// Reads the row after a write whose answer was lost (§11.2 rule 4): still this worker's,
    /// its counter is adopted; otherwise the lease is no longer held, for the reason returned.
    /// Call it holding the lease's write permit. Returns the row read.
    async fn settle(
        &self,
        unit: &UnitId,
        slot: &Slot,
    ) -> Result<(Option<Lease>, Option<LostReason>), LeaseError> {
        let row = self.table.get(&self.pipeline, unit).await?;
        let reason = match (&row, slot.get()) {
            (Some(row), Some(mut holding)) if row.is_owned_by(&self.id) => {
                holding.counter = row.counter;
                holding.unsettled = false;
                slot.set(Some(holding));
                None
            }
            (Some(row), Some(holding)) if ended_by(row, &holding) => Some(LostReason::Ended),
            _ => Some(LostReason::Taken),
        };
        if reason.is_some() {
            self.remove(unit);
        }
        Ok((row, reason))
    }

    /// Records the outcome of a write to a held lease, sent at `sent`: success moves the
    /// counter on, a conflict loses the lease, a transient failure leaves it unsettled.
    fn wrote(
        &self,
        unit: &UnitId,
        slot: &Slot,
        sent: LocalTime,
        result: &Result<Lease, LeaseError>,
    ) -> Option<Lost> {
        match result {
            Ok(row) if row.is_owned_by(&self.id) => {
                slot.set(Some(Holding {
                    counter: row.counter,
                    written_at: sent,
                    unsettled: false,
                }));
                None
            }
            Ok(_) => {
                self.remove(unit);
                None
            }
            Err(LeaseError::Conflict { .. }) => self.remove(unit).then(|| Lost {
                unit: unit.clone(),
                reason: LostReason::Taken,
            }),
            Err(_) => {
                if let Some(mut holding) = slot.get() {
                    holding.unsettled = true;
                    slot.set(Some(holding));
                }
                None
            }
        }
    }

    /// Renews every held lease that is due (rule 2) or unsettled, one after the other. Only a
    /// fatal error ends it early.
    pub(super) async fn renew_due(&self, now: LocalTime) -> Result<Renewed, LeaseError> {
        let mut renewed = Renewed::default();
        self.drop_expired(now, &mut renewed.lost);
        let interval = self.settings.renew_interval();
        let due: Vec<UnitId> = self
            .held()
            .into_iter()
            .filter(|(_, holding)| holding.unsettled || now.since(holding.written_at) >= interval)
            .map(|(unit, _)| unit)
            .collect();
        // Up to WRITES_AT_ONCE renewals in flight, as KCL's renewer runs them on a pool: a
        // worker holding thousands of leases renews them all within the interval.
        for chunk in due.chunks(WRITES_AT_ONCE) {
            let renewals: Vec<_> = chunk
                .iter()
                .map(|unit| async move {
                    let mut one = Renewed::default();
                    let result = self.renew(unit, now, &mut one).await;
                    (result, one)
                })
                .collect();
            for (result, one) in join_all(renewals).await {
                result?;
                renewed.lost.extend(one.lost);
                renewed.transient.extend(one.transient);
            }
        }
        Ok(renewed)
    }

    /// Renews `unit` if it is still due once its write permit is held (a checkpoint may have
    /// written it meanwhile).
    async fn renew(
        &self,
        unit: &UnitId,
        now: LocalTime,
        renewed: &mut Renewed,
    ) -> Result<(), LeaseError> {
        let Some(slot) = self.slot(unit) else {
            return Ok(());
        };
        let _permit = slot.writing.lock().await;
        let Some(holding) = slot.get() else {
            return Ok(());
        };
        if !holding.unsettled && now.since(holding.written_at) < self.settings.renew_interval() {
            return Ok(());
        }
        if holding.unsettled {
            match self.settle(unit, &slot).await {
                Ok((_, None)) => {}
                Ok((_, Some(reason))) => {
                    renewed.lost.push(Lost {
                        unit: unit.clone(),
                        reason,
                    });
                    return Ok(());
                }
                Err(error @ LeaseError::Fatal(_)) => return Err(error),
                Err(error) => {
                    renewed.transient.push(error);
                    return Ok(());
                }
            }
        }
        let Some(holding) = slot.get() else {
            return Ok(());
        };
        let result = self
            .table
            .renew(&self.pipeline, unit, &self.held_by(&holding))
            .await;
        if let Some(lost) = self.wrote(unit, &slot, now, &result) {
            renewed.lost.push(lost);
        }
        match result {
            Err(error @ LeaseError::Fatal(_)) => Err(error),
            Err(error @ LeaseError::Transient(_)) => {
                renewed.transient.push(error);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Compares a listing made after every take of this worker with what it holds: a row that
    /// another owner or a newer counter holds is lost; an unsettled one still this worker's
    /// is settled. A lease whose write is in flight is left to that write's answer, and a
    /// row behind the counter held is an older image of this worker's own write.
    pub(super) fn reconcile(&self, rows: &[Lease], lost: &mut Vec<Lost>) {
        let rows: BTreeMap<&UnitId, &Lease> = rows.iter().map(|l| (&l.unit, l)).collect();
        for (unit, _) in self.held() {
            let Some(slot) = self.slot(&unit) else {
                continue;
            };
            let Ok(_permit) = slot.writing.try_lock() else {
                continue;
            };
            let Some(mut holding) = slot.get() else {
                continue;
            };
            let reason = match rows.get(&unit) {
                Some(row) if row.is_owned_by(&self.id) && holding.unsettled => {
                    holding.counter = holding.counter.max(row.counter);
                    holding.unsettled = false;
                    slot.set(Some(holding));
                    None
                }
                Some(row) if row.is_owned_by(&self.id) && row.counter <= holding.counter => None,
                Some(row) if holding.unsettled && ended_by(row, &holding) => {
                    Some(LostReason::Ended)
                }
                _ => Some(LostReason::Taken),
            };
            if let Some(reason) = reason
                && self.remove(&unit)
            {
                lost.push(Lost { unit, reason });
            }
        }
    }

    /// Writes `unit`'s checkpoint (see [`super::Worker::checkpoint`]).
    pub(super) async fn checkpoint(
        &self,
        unit: &UnitId,
        checkpoint: &LeaseCheckpoint,
        now: LocalTime,
    ) -> Result<Lease, CheckpointError> {
        let Some(slot) = self.slot(unit) else {
            return Err(CheckpointError::NotHeld(unit.clone()));
        };
        let _permit = slot.writing.lock().await;
        let lost = |reason| {
            CheckpointError::Lost(Lost {
                unit: unit.clone(),
                reason,
            })
        };
        let Some(holding) = slot.get() else {
            return Err(lost(LostReason::Taken));
        };
        if now.since(holding.written_at) >= self.settings.duration {
            self.remove(unit);
            return Err(lost(LostReason::Expired));
        }
        if holding.unsettled {
            let before = holding.counter;
            let (row, _) = self
                .settle(unit, &slot)
                .await
                .map_err(CheckpointError::Request)?;
            if let Some(row) = row.filter(|row| {
                Some(row.counter) == before.next()
                    && row.checkpoint.as_ref() == Some(checkpoint)
                    && row.state == LeaseState::of(checkpoint)
            }) {
                // The lost answer was this very checkpoint.
                if row.is_owned_by(&self.id) {
                    self.insert(
                        unit.clone(),
                        Holding {
                            counter: row.counter,
                            written_at: holding.written_at,
                            unsettled: false,
                        },
                    );
                } else {
                    self.remove(unit);
                }
                return Ok(row);
            }
        }
        let Some(holding) = slot.get() else {
            return Err(lost(LostReason::Taken));
        };
        let result = self
            .table
            .checkpoint(&self.pipeline, unit, &self.held_by(&holding), checkpoint)
            .await;
        if let Some(lost) = self.wrote(unit, &slot, now, &result) {
            return Err(CheckpointError::Lost(lost));
        }
        result.map_err(CheckpointError::Request)
    }

    /// Hands every held lease back (see [`super::Worker::release_all`]).
    pub(super) async fn release_all(&self) -> Vec<(UnitId, LeaseError)> {
        let mut failed = Vec::new();
        for (unit, _) in self.held() {
            if let Err(error) = self.release(&unit).await {
                failed.push((unit, error));
            }
        }
        failed
    }

    /// Hands one held lease back (see [`super::Worker::release`]); nothing when it is not
    /// held.
    pub(super) async fn release(&self, unit: &UnitId) -> Result<(), LeaseError> {
        let Some(slot) = self.slot(unit) else {
            return Ok(());
        };
        let _permit = slot.writing.lock().await;
        let settled = if slot.get().is_some_and(|h| h.unsettled) {
            self.settle(unit, &slot).await.map(drop)
        } else {
            Ok(())
        };
        let Some(holding) = slot.get() else {
            return settled;
        };
        self.remove(unit);
        // A presence row is deleted: it stands for this process, which ends (§11.2 rule 7).
        let released = match unit {
            UnitId::Worker(_) => {
                self.table
                    .delete(&self.pipeline, unit, holding.counter)
                    .await
            }
            _ => self
                .table
                .release(&self.pipeline, unit, &self.held_by(&holding))
                .await
                .map(drop),
        };
        settled.and(released)
    }
}
