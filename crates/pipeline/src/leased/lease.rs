//! The leased loop's dealings with the lease table and a fencing sink (`super`): the run's
//! settings in the leader row, when rounds run, store a taken lease's token in a fencing sink,
//! write a batch under its unit's fence, read a checkpoint's answer, count and tell the lease
//! events (docs/coordination.md §11.7, §11.10).

use std::time::Duration;

use ddbpipe_source::lease::{
    CheckpointError, KeeperEvent, LeaseCounter, LeaseError, LeaseTable, LocalTime, Lost,
    LostReason, Taken, UnitId, Worker,
};
use ddbpipe_source::position::LeaseCheckpoint;
use tokio::time::Instant;

use super::LeaseCounts;
use crate::batch::Batch;
use crate::events::LeaseEvent;
use crate::runner::RunError;
use crate::sink::{Fence, Fencing, Sink, SinkErrorClass};
use crate::state::identity::Identity;

/// Why a shared run whose leader row holds `stored` cannot go on with `identity`: the settings
/// that changed, and what to do; `None` when they are the same. `check` says it too.
pub fn other_settings(pipeline: &str, stored: &str, identity: &Identity) -> Option<String> {
    let changes = match Identity::parse(stored) {
        Some(stored) => match identity.changes_from(&stored, true) {
            changes if changes.is_empty() => return None,
            changes => changes.join("; "),
        },
        None => "its settings cannot be read".to_string(),
    };
    Some(format!(
        "the lease table holds a shared run of pipeline '{pipeline}' with other settings \
         ({changes}): set them back, or run `ddbpipe state reset` once no worker runs to start \
         afresh"
    ))
}

/// Whether the pipeline's rows belong to a run of these settings (docs/coordination.md
/// §11.10): the leader row's checkpoint holds the identity of the run that created the
/// units, written by the first leader before any unit row. Returns whether the identity is
/// stored (a leader creates unit rows only then); a stored identity this one differs from
/// stops the run, naming the settings that changed.
pub(crate) async fn same_run<T: LeaseTable>(
    worker: &mut Worker<T>,
    identity: &Identity,
    now: LocalTime,
) -> Result<bool, RunError> {
    let stored = worker
        .rows()
        .iter()
        .find(|row| row.unit == UnitId::Leader)
        .and_then(|row| row.settings());
    match stored {
        Some(text) => match other_settings(worker.pipeline().as_str(), text, identity) {
            None => Ok(true),
            Some(message) => Err(RunError::Lease(LeaseError::Fatal(message))),
        },
        None if worker.is_leader() => {
            let settings = LeaseCheckpoint::Settings(identity.to_json().to_string());
            let written = worker.checkpoint(&UnitId::Leader, &settings, now).await;
            // A failed write is tried again next round; the unit rows wait for it.
            Ok(written.is_ok())
        }
        None => Ok(false),
    }
}

/// When a leased runner runs its rounds (docs/coordination.md §11.4): on a grid of the
/// renewal interval whatever ran between (a slow batch delays a round, not the ones after
/// it), at once when asked (a unit just finished: the run may be complete, or another unit
/// free), and when a lease seen standing still expires (rule 5), so a dead worker's units are
/// taken a duration after this worker first saw their last counter, not a round later.
pub(crate) struct Rounds {
    origin: Instant,
    interval: Duration,
    grid: Instant,
    /// When the next round runs.
    pub(crate) next: Instant,
}

impl Rounds {
    /// Rounds every `interval`, the first at once; `origin` is the worker's clock's.
    pub(crate) fn new(origin: Instant, interval: Duration) -> Self {
        let now = Instant::now();
        Rounds {
            origin,
            interval,
            grid: now,
            next: now,
        }
    }

    /// The worker's clock, for its keeper.
    pub(crate) fn clock(&self) -> impl Fn() -> LocalTime + Send + Sync + 'static {
        let origin = self.origin;
        move || LocalTime::new(origin.elapsed())
    }

    /// After a round whose report gave `next_expiry`: the next one, or at once with `again`.
    pub(crate) fn ran(&mut self, next_expiry: Option<LocalTime>, again: bool) {
        let now = Instant::now();
        while self.grid <= now {
            self.grid += self.interval;
        }
        let expiry = next_expiry.map(|at| self.origin + at.since_origin());
        self.next = match expiry {
            _ if again => now,
            Some(at) => at.min(self.grid),
            None => self.grid,
        };
    }

    /// The next round at once.
    pub(crate) fn soon(&mut self) {
        self.next = Instant::now();
    }
}

/// What a keeper's event means for the run: a lost work unit to stop, nothing, or a failure.
///
/// The keeper forgets a lease before it reports it lost, and its reports wait in a channel
/// while the run's loop is busy: by the time one is read, a round may have taken the unit
/// again (a worker frozen past its leases, then woken, loses them to its keeper and takes
/// them back in its next round). A report about a unit the worker holds now is about an
/// earlier tenure and is dropped; applied, it would stop the unit's new reader while the
/// keeper goes on renewing the lease, and nobody would read the unit again.
pub(crate) fn kept<T: LeaseTable>(
    event: KeeperEvent,
    worker: &Worker<T>,
) -> Result<Option<Lost>, RunError> {
    match event {
        KeeperEvent::Lost(lost) if worker.counter(&lost.unit).is_some() => Ok(None),
        KeeperEvent::Lost(lost) => Ok(Some(lost)),
        KeeperEvent::Failed(error) => Err(RunError::Lease(error)),
    }
}

/// The fence of `unit` under `counter`, reaching `position`.
pub(crate) fn fence<T: LeaseTable>(
    worker: &Worker<T>,
    unit: &UnitId,
    counter: LeaseCounter,
    position: Option<LeaseCheckpoint>,
) -> Fence {
    Fence {
        pipeline: worker.pipeline().to_string(),
        unit: unit.clone(),
        counter: counter.0,
        position,
        snapshot: None,
        beside: None,
        of: None,
        repair: None,
    }
}

/// Tells the metrics of one lease event of this worker, which holds `held` leases after it.
pub(crate) fn event<T: LeaseTable>(worker: &Worker<T>, event: &'static str, held: usize) {
    LeaseEvent {
        worker: worker.id().name(),
        event,
        held,
    }
    .emit();
}

/// What became of a lease just taken.
pub(crate) enum Took {
    /// Held: read the unit, after this position when the sink stored one with the unit's
    /// fence (it was committed with the rows it covers and the lease checkpoint follows it,
    /// so it is never behind the checkpoint: exactly once into the sink across a crash).
    Held(Option<LeaseCheckpoint>),
    /// Taken again by another worker before this one's claim: not read here.
    Lost,
}

/// A lease just taken, before its unit is read: a fencing sink stores its token first, so an
/// earlier owner's late batch is refused from now on (§11.7 rule 4). A refused claim means a
/// newer counter is stored: either another worker took the lease in between (its row moved:
/// the lease is lost, the next round says so) or fences outlived their lease rows (a lease
/// table reset by hand; the row did not move): then the run stops, the error says so.
/// `held`: leases held with it.
pub(crate) async fn took<T: LeaseTable, S: Sink>(
    worker: &Worker<T>,
    counts: &mut LeaseCounts,
    sink: &mut S,
    taken: &Taken,
    held: usize,
) -> Result<Took, RunError> {
    let mut position = None;
    if let Some(fencing) = sink.fencing() {
        match fencing
            .claim(&fence(worker, &taken.unit, taken.counter, None))
            .await
        {
            Ok(stored) => position = stored,
            Err(error) if error.class == SinkErrorClass::Fenced => {
                let row = worker.table().get(worker.pipeline(), &taken.unit).await?;
                let moved = row
                    .is_none_or(|row| row.counter > taken.counter || !row.is_owned_by(worker.id()));
                if !moved {
                    return Err(error.into());
                }
                counts.taken += 1;
                tracing::info!(lease = %taken.unit, "Lease taken by another worker before its claim.");
                lost(worker, counts, &taken.unit, &LostReason::Taken, held - 1);
                return Ok(Took::Lost);
            }
            Err(error) => return Err(error.into()),
        }
    }
    counts.taken += 1;
    if let Some(from) = &taken.stolen_from {
        counts.stolen += 1;
        tracing::info!(lease = %taken.unit, from = %from, "Lease stolen to balance the work.");
        event(worker, "stolen", held);
    } else {
        let after = resumed_at(taken, position.as_ref());
        tracing::info!(
            lease = %taken.unit,
            resumed = after.is_some(),
            after = after.map_or_else(|| "-".to_string(), LeaseCheckpoint::encode),
            "Lease taken."
        );
        event(worker, "taken", held);
    }
    Ok(Took::Held(position))
}

/// Where a taken unit resumes: after the position a fencing sink stored with the unit's rows
/// (never behind the lease row's checkpoint), else after the row's checkpoint; `None` from
/// its start.
pub(crate) fn resumed_at<'a>(
    taken: &'a Taken,
    stored: Option<&'a LeaseCheckpoint>,
) -> Option<&'a LeaseCheckpoint> {
    stored.or(taken.checkpoint.as_ref())
}

/// A lease lost: counted and told; the caller has stopped its unit. `held`: leases left.
pub(crate) fn lost<T: LeaseTable>(
    worker: &Worker<T>,
    counts: &mut LeaseCounts,
    unit: &UnitId,
    reason: &LostReason,
    held: usize,
) {
    counts.lost += 1;
    event(worker, "lost", held);
    tracing::warn!(
        lease = %unit,
        reason = ?reason,
        "Lease lost; its unit is left to the new owner."
    );
}

/// Writes a batch and returns `true` once the sink acknowledged it. A fencing sink's batch is
/// one unit's and carries the counter held on it and the position it reaches: `false` when the
/// unit is no longer held or its fence refused the batch (nothing written): the unit is lost
/// to this worker.
/// `snapshot`: the open shared snapshot whose rows the batch holds (a mirror's segments).
pub(crate) async fn write<T: LeaseTable, S: Sink>(
    worker: &Worker<T>,
    sink: &mut S,
    unit: Option<UnitId>,
    position: Option<LeaseCheckpoint>,
    mark: super::units::SnapshotMark,
    batch: &Batch,
) -> Result<bool, RunError> {
    let _writing = ddbpipe_source::health::Writing::begin();
    let Some(fencing) = sink.fencing() else {
        sink.write(batch, None).await?;
        return Ok(true);
    };
    let Some((unit, counter)) = unit.and_then(|unit| worker.counter(&unit).map(|c| (unit, c)))
    else {
        return Ok(false);
    };
    let fence = Fence {
        snapshot: mark.rows,
        beside: mark.beside,
        of: mark.of,
        repair: mark.repair,
        ..fence(worker, &unit, counter, position)
    };
    match fencing.write_fenced(batch, &fence).await {
        Ok(()) => Ok(true),
        Err(error) if error.class == SinkErrorClass::Fenced => {
            tracing::warn!(error = %error, "Batch refused by its lease fence.");
            Ok(false)
        }
        Err(error) => Err(error.into()),
    }
}

/// What a checkpoint's answer means for its unit.
pub(crate) enum Checkpointed {
    /// Written; the lease now stands at this counter.
    Saved(LeaseCounter),
    /// The lease is lost: stop the unit, checkpoint nothing more.
    Lost(LostReason),
    /// A transient failure: the checkpoint stays due and is written again later.
    Later,
}

/// Reads the answer of [`Worker::checkpoint`] for `unit`; a fatal one fails the run.
pub(crate) fn checkpointed(
    unit: &UnitId,
    result: Result<LeaseCounter, CheckpointError>,
) -> Result<Checkpointed, RunError> {
    match result {
        Ok(counter) => Ok(Checkpointed::Saved(counter)),
        Err(CheckpointError::Lost(lost)) => Ok(Checkpointed::Lost(lost.reason)),
        Err(CheckpointError::NotHeld(_)) => Ok(Checkpointed::Lost(LostReason::Taken)),
        Err(CheckpointError::Request(error)) if error.is_conflict() => {
            Ok(Checkpointed::Lost(LostReason::Taken))
        }
        Err(CheckpointError::Request(LeaseError::Transient(error))) => {
            tracing::debug!(lease = %unit, error = %error, "Checkpoint failed; retried later.");
            Ok(Checkpointed::Later)
        }
        Err(CheckpointError::Request(error)) => Err(RunError::Lease(error)),
        Err(error) => Err(RunError::Lease(LeaseError::Fatal(error.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::lease::memory::MemoryLeaseTable;
    use ddbpipe_source::lease::{LeaseSettings, PipelineName, UnitSpec, WorkerId};

    use super::*;

    /// A keeper's report about a unit the worker has taken again since is dropped; one about a
    /// unit it no longer holds stops that unit (the frozen-worker hang of issue 24's CI run).
    #[tokio::test]
    async fn a_loss_reported_for_a_unit_taken_again_since_is_dropped() {
        let leases = MemoryLeaseTable::seeded(1);
        let mut worker = Worker::new(
            leases.connect(),
            PipelineName::new("p").unwrap(),
            WorkerId::new("w").unwrap(),
            LeaseSettings::new(10).unwrap(),
        );
        // The first round makes it the leader, which creates the rows; the next takes them.
        worker.round(LocalTime::from_millis(0)).await.unwrap();
        worker.sync(&UnitSpec::segments(2)).await.unwrap();
        worker.round(LocalTime::from_millis(1)).await.unwrap();
        let held = UnitId::Segment { index: 0, total: 2 };
        assert!(worker.counter(&held).is_some(), "{:?}", worker.units());
        let stale = KeeperEvent::Lost(Lost {
            unit: held.clone(),
            reason: LostReason::Expired,
        });
        assert!(kept(stale, &worker).unwrap().is_none());
        let gone = UnitId::Segment { index: 7, total: 8 };
        let current = KeeperEvent::Lost(Lost {
            unit: gone.clone(),
            reason: LostReason::Expired,
        });
        assert_eq!(
            kept(current, &worker).unwrap().map(|lost| lost.unit),
            Some(gone)
        );
    }
}
