//! An in-memory [`LeaseTable`] for tests and simulations: deterministic, with seeded faults,
//! a log of every applied write, and a request count per connection.
//!
//! Clones share the rows and the request count; [`MemoryLeaseTable::connect`] shares the
//! rows with a count of its own, one per simulated worker.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::ApiError;
use crate::position::LeaseCheckpoint;

use super::table::{LeaseError, LeaseTable};
use super::{CounterExhausted, Held, Lease, LeaseCounter, PipelineName, UnitId, WorkerId};

/// Faults the table injects, decided by its seed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Share of requests that fail transiently without being applied.
    pub fail_rate: f64,
    /// Share of writes that are applied but answer with a transient error (a lost reply).
    pub lost_reply_rate: f64,
    /// How long each request takes (on tokio's clock; pause it in tests).
    pub delay: Duration,
}

/// What an applied write was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// `create`.
    Create,
    /// `take`.
    Take,
    /// `renew`.
    Renew,
    /// `checkpoint`.
    Checkpoint,
    /// `release`.
    Release,
    /// `delete`.
    Delete,
}

/// One applied write: the row before and after (`None` = no row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Applied writes are numbered from 0 in the order they were applied.
    pub seq: u64,
    /// The pipeline written.
    pub pipeline: PipelineName,
    /// The unit written.
    pub unit: UnitId,
    /// What it was.
    pub kind: WriteKind,
    /// The row before.
    pub before: Option<Lease>,
    /// The row after.
    pub after: Option<Lease>,
}

#[derive(Debug)]
struct Shared {
    rows: BTreeMap<(PipelineName, UnitId), Lease>,
    log: Vec<Write>,
    faults: Faults,
    rng: StdRng,
    now_ms: i64,
}

/// The in-memory lease table.
#[derive(Debug, Clone)]
pub struct MemoryLeaseTable {
    shared: Arc<Mutex<Shared>>,
    requests: Arc<AtomicU64>,
}

/// Whether a request fails, and whether a failing write was applied first.
enum Fate {
    Answered,
    Failed,
    LostReply,
}

impl MemoryLeaseTable {
    /// An empty table whose faults follow `seed`.
    pub fn seeded(seed: u64) -> Self {
        MemoryLeaseTable {
            shared: Arc::new(Mutex::new(Shared {
                rows: BTreeMap::new(),
                log: Vec::new(),
                faults: Faults::default(),
                rng: StdRng::seed_from_u64(seed),
                now_ms: 0,
            })),
            requests: Arc::default(),
        }
    }

    /// A handle on the same rows that counts its own requests.
    pub fn connect(&self) -> Self {
        MemoryLeaseTable {
            shared: Arc::clone(&self.shared),
            requests: Arc::default(),
        }
    }

    /// Requests sent through this handle (and its clones), failed ones included.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Sets the faults from now on.
    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// Sets the wall clock rows are stamped with (`written_ms`).
    pub fn set_clock_ms(&self, now_ms: i64) {
        self.lock().now_ms = now_ms;
    }

    /// Every applied write so far, in order.
    pub fn log(&self) -> Vec<Write> {
        self.lock().log.clone()
    }

    /// Applied writes after the first `from`.
    pub fn log_since(&self, from: usize) -> Vec<Write> {
        self.lock().log.get(from..).unwrap_or_default().to_vec()
    }

    /// The row of `unit`, without a request.
    pub fn row(&self, pipeline: &PipelineName, unit: &UnitId) -> Option<Lease> {
        self.lock()
            .rows
            .get(&(pipeline.clone(), unit.clone()))
            .cloned()
    }

    /// Changes the row of `unit` as an edit by hand would: no request, no condition, no log
    /// entry. Does nothing when it has no row.
    pub fn edit(&self, pipeline: &PipelineName, unit: &UnitId, change: impl FnOnce(&mut Lease)) {
        if let Some(row) = self.lock().rows.get_mut(&(pipeline.clone(), unit.clone())) {
            change(row);
        }
    }

    /// Every row of `pipeline`, without a request.
    pub fn rows(&self, pipeline: &PipelineName) -> Vec<Lease> {
        self.lock()
            .rows
            .iter()
            .filter(|((p, _), _)| p == pipeline)
            .map(|(_, lease)| lease.clone())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while locked fails the test that caused it; the rows stay readable.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn begin(&self, write: bool) -> Fate {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let delay = self.lock().faults.delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut shared = self.lock();
        let faults = shared.faults;
        if faults.fail_rate > 0.0 && shared.rng.random_bool(faults.fail_rate.min(1.0)) {
            return Fate::Failed;
        }
        if write
            && faults.lost_reply_rate > 0.0
            && shared.rng.random_bool(faults.lost_reply_rate.min(1.0))
        {
            return Fate::LostReply;
        }
        Fate::Answered
    }

    /// Applies `change` to the row of `unit` when it is allowed, logs it, and answers by
    /// `fate`.
    /// `change` answers `Ok(None)` when the write's condition fails, an error when the row
    /// cannot be written at all (a counter that cannot move on).
    async fn write(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        kind: WriteKind,
        change: impl FnOnce(Option<&Lease>, i64) -> Result<Option<Option<Lease>>, CounterExhausted>,
    ) -> Result<Option<Lease>, LeaseError> {
        let fate = self.begin(true).await;
        if let Fate::Failed = fate {
            return Err(transient());
        }
        let mut shared = self.lock();
        let key = (pipeline.clone(), unit.clone());
        let before = shared.rows.get(&key).cloned();
        let Some(after) = change(before.as_ref(), shared.now_ms)? else {
            return Err(LeaseError::Conflict { unit: unit.clone() });
        };
        match &after {
            Some(row) => shared.rows.insert(key, row.clone()),
            None => shared.rows.remove(&key),
        };
        let seq = shared.log.len() as u64;
        shared.log.push(Write {
            seq,
            pipeline: pipeline.clone(),
            unit: unit.clone(),
            kind,
            before,
            after: after.clone(),
        });
        match fate {
            Fate::LostReply => Err(transient()),
            Fate::Answered | Fate::Failed => Ok(after),
        }
    }

    async fn update(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        kind: WriteKind,
        change: impl FnOnce(&Lease, i64) -> Result<Option<Lease>, CounterExhausted>,
    ) -> Result<Lease, LeaseError> {
        let after = self
            .write(pipeline, unit, kind, |row, now| match row {
                Some(row) => Ok(change(row, now)?.map(Some)),
                None => Ok(None),
            })
            .await?;
        after.ok_or_else(|| LeaseError::Fatal("an update removed its row".into()))
    }
}

fn transient() -> LeaseError {
    LeaseError::Transient(ApiError::transport("injected fault"))
}

fn holds(row: &Lease, held: &Held) -> bool {
    row.counter == held.counter && row.is_owned_by(&held.owner)
}

impl LeaseTable for MemoryLeaseTable {
    async fn list(&self, pipeline: &PipelineName) -> Result<Vec<Lease>, LeaseError> {
        match self.begin(false).await {
            Fate::Answered => Ok(self.rows(pipeline)),
            Fate::Failed | Fate::LostReply => Err(transient()),
        }
    }

    async fn get(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
    ) -> Result<Option<Lease>, LeaseError> {
        match self.begin(false).await {
            Fate::Answered => Ok(self.row(pipeline, unit)),
            Fate::Failed | Fate::LostReply => Err(transient()),
        }
    }

    async fn create(&self, pipeline: &PipelineName, lease: &Lease) -> Result<(), LeaseError> {
        self.write(pipeline, &lease.unit, WriteKind::Create, |row, _| {
            Ok(row.is_none().then(|| Some(lease.clone())))
        })
        .await
        .map(drop)
    }

    async fn take(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
        owner: &WorkerId,
    ) -> Result<Lease, LeaseError> {
        self.update(pipeline, unit, WriteKind::Take, |row, now| {
            (row.counter == seen)
                .then(|| row.taken(owner, now))
                .transpose()
        })
        .await
    }

    async fn renew(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> Result<Lease, LeaseError> {
        self.update(pipeline, unit, WriteKind::Renew, |row, now| {
            holds(row, held).then(|| row.renewed(now)).transpose()
        })
        .await
    }

    async fn checkpoint(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
        checkpoint: &LeaseCheckpoint,
    ) -> Result<Lease, LeaseError> {
        self.update(pipeline, unit, WriteKind::Checkpoint, |row, now| {
            holds(row, held)
                .then(|| row.checkpointed(checkpoint, now))
                .transpose()
        })
        .await
    }

    async fn release(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> Result<Lease, LeaseError> {
        self.update(pipeline, unit, WriteKind::Release, |row, now| {
            holds(row, held).then(|| row.released(now)).transpose()
        })
        .await
    }

    async fn delete(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
    ) -> Result<(), LeaseError> {
        self.write(pipeline, unit, WriteKind::Delete, |row, _| {
            Ok(row.filter(|row| row.counter == seen).map(|_| None))
        })
        .await
        .map(drop)
    }

    fn clock_ms(&self) -> i64 {
        self.lock().now_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline() -> PipelineName {
        PipelineName::new("p").unwrap()
    }

    fn worker(id: &str) -> WorkerId {
        WorkerId::new(id).unwrap()
    }

    #[tokio::test]
    async fn writes_are_conditional_on_the_counter_and_the_owner() {
        let table = MemoryLeaseTable::seeded(1);
        let (p, unit) = (pipeline(), UnitId::Leader);
        let lease = Lease::new(unit.clone(), Vec::new(), 0);
        table.create(&p, &lease).await.unwrap();
        assert!(table.create(&p, &lease).await.unwrap_err().is_conflict());
        let a = table
            .take(&p, &unit, LeaseCounter(0), &worker("a"))
            .await
            .unwrap();
        let late = table.take(&p, &unit, LeaseCounter(0), &worker("b")).await;
        assert!(late.unwrap_err().is_conflict(), "b saw counter 0, a won");
        let held = Held {
            owner: worker("a"),
            counter: a.counter,
        };
        let renewed = table.renew(&p, &unit, &held).await.unwrap();
        assert_eq!(renewed.counter, LeaseCounter(2));
        let stale = table.checkpoint(&p, &unit, &held, &LeaseCheckpoint::Done);
        assert!(stale.await.unwrap_err().is_conflict(), "counter 1 is stale");
        let wrong_owner = Held {
            owner: worker("b"),
            counter: renewed.counter,
        };
        let impostor = table.release(&p, &unit, &wrong_owner).await;
        assert!(impostor.unwrap_err().is_conflict(), "b does not hold it");
        let stale = table.delete(&p, &unit, LeaseCounter(1)).await;
        assert!(stale.unwrap_err().is_conflict(), "counter 1 is stale");
        table.delete(&p, &unit, LeaseCounter(2)).await.unwrap();
        assert_eq!(table.get(&p, &unit).await.unwrap(), None);
        assert_eq!(table.log().len(), 4, "create, take, renew, delete");
        assert_eq!(table.requests(), 10);
    }

    #[tokio::test]
    async fn a_lost_reply_is_applied_but_answers_transiently() {
        let table = MemoryLeaseTable::seeded(1);
        let p = pipeline();
        table.set_faults(Faults {
            lost_reply_rate: 1.0,
            ..Faults::default()
        });
        let error = table
            .create(&p, &Lease::new(UnitId::Leader, Vec::new(), 0))
            .await
            .unwrap_err();
        assert_eq!(error.class(), crate::error::ErrorClass::Transient);
        assert!(table.row(&p, &UnitId::Leader).is_some());
        table.set_faults(Faults {
            fail_rate: 1.0,
            ..Faults::default()
        });
        assert!(table.list(&p).await.is_err());
        assert_eq!(table.log().len(), 1);
    }
}
