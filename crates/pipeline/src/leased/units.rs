//! What a kind of leased unit supplies to the one leased loop (`super`): how its units are
//! read and batched, what positions its batches reach, what its leader writes, and when a run
//! of it ends. Kinds: `super::segments` (scan segments) and `super::shards` (stream shards).

use std::future::Future;

use ddbpipe_source::lease::{Lease, UnitId, UnitSpec};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::streams::leased::ReadFlags;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::batch::{Batch, BatchLimits, Batcher};
use crate::runner::RunError;

/// A kind of leased unit: how its units are read and batched, what positions its batches
/// reach, what its leader writes, and when a run of it ends.
pub(crate) trait Units: Send {
    /// What a unit's reader hands the loop.
    type Read: Send + 'static;
    /// How a run of this kind ends.
    type End: Send;

    /// Hand-overs a unit's reader may have waiting for the loop.
    const DEPTH: usize;

    /// Whether `unit` is one of this run's.
    fn owns(&self, unit: &UnitId) -> bool;

    /// Refuses a taken unit whose row (or fence) is at `at` when that is no position of this
    /// kind, naming the row.
    fn starts(&self, unit: &UnitId, at: Option<&LeaseCheckpoint>) -> Result<(), RunError>;

    /// Starts reading `unit` after `from` (`None`: at its start) into `out`: the reading, which
    /// ends at the unit's end, when `cancel` fires (`Ok`) or with the read's failure; `Err`
    /// naming the row when `from` is no position of this kind.
    fn read(
        &self,
        unit: &UnitId,
        from: Option<&LeaseCheckpoint>,
        out: mpsc::Sender<Self::Read>,
        cancel: Cancel,
        flags: ReadFlags,
    ) -> Result<BoxFuture<'static, Result<(), RunError>>, RunError>;

    /// The failure of a reader that panicked.
    fn panicked(&self, unit: &UnitId) -> RunError;

    /// Whether `unit` may start reading while `reading` units of its kind do (a scan reads at
    /// most `max_concurrency` segments at once; shards share read slots instead).
    fn may_read(&self, unit: &UnitId, reading: usize) -> bool;

    /// The snapshot a batch of `unit` is written for, in its fence (docs/coordination.md
    /// §11.12): `rows` of a shared snapshot's segments (refused once it is closed), or changes
    /// read `beside` it (marked with it while it is open).
    fn snapshot_of(&self, unit: &UnitId) -> SnapshotMark {
        let _ = unit;
        SnapshotMark::default()
    }

    /// Cuts a read into batches.
    fn push(&mut self, batcher: &mut Batcher, read: Self::Read) -> Vec<Batch>;

    /// What an acknowledged batch reaches, per unit, in its order: a position or an end.
    fn marks(&self, batch: &Batch) -> Vec<(UnitId, LeaseCheckpoint)>;

    /// Whether a batch is written (a batch of marks without records and without a position is
    /// not).
    fn writes(&self, batch: &Batch) -> bool;

    /// Told about each batch the sink acknowledged.
    fn written(&mut self, batch: &Batch) {
        let _ = batch;
    }

    /// How large a batch may grow for a sink that does not fence.
    fn limits(&self) -> BatchLimits;

    /// Capacity units this worker's reads consumed.
    fn capacity_units(&self) -> f64 {
        0.0
    }

    /// The leader's part of a round, once the run's settings are stored: the units found,
    /// whose rows it writes (and whose finished rows no longer found it deletes, so every kind
    /// of the run is in them), or `None` to write nothing this round.
    fn specs(
        &mut self,
        rows: &[Lease],
        stop: &Cancel,
    ) -> impl Future<Output = Result<Option<Vec<UnitSpec>>, RunError>> + Send;

    /// Refuses rows that another run of the pipeline left (a changed segment count).
    fn check(&self, rows: &[Lease]) -> Result<(), RunError> {
        let _ = rows;
        Ok(())
    }

    /// Told after each round about the pipeline's rows and the unfinished units held
    /// (gauges).
    fn measured(&self, rows: &[Lease], held: &[(&UnitId, &ReadFlags)]) {
        let _ = (rows, held);
    }

    /// Why the run ends now, if it does (checked after each round).
    fn ended(&self, view: &View<'_>) -> Option<Self::End>;

    /// How a run that was stopped ends.
    fn stopped(&self) -> Self::End;
}

/// The shared snapshot a batch is written for (`Fence::snapshot`, `Fence::beside`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SnapshotMark {
    /// The batch holds the snapshot's rows.
    pub rows: Option<i64>,
    /// The batch holds changes read beside the snapshot.
    pub beside: Option<i64>,
    /// The snapshot of the generation reading the batch (a shared mirror): refused once
    /// another snapshot replaced it.
    pub of: Option<i64>,
    /// The batch holds the changes of a shared repair's window (docs/coordination.md §11.12
    /// rule 9).
    pub repair: Option<i64>,
}

impl SnapshotMark {
    /// The batches of snapshot `id`'s rows.
    pub(crate) fn rows(id: i64) -> Self {
        SnapshotMark {
            rows: Some(id),
            ..SnapshotMark::default()
        }
    }

    /// The batches of the changes of shared repair `id`'s window.
    pub(crate) fn repair(id: i64) -> Self {
        SnapshotMark {
            repair: Some(id),
            ..SnapshotMark::default()
        }
    }
}

/// What a kind's end rule looks at.
pub(crate) struct View<'a> {
    /// The pipeline's rows as of the last round.
    pub rows: &'a [Lease],
    /// The units held, with what their readers said.
    pub held: Vec<(&'a UnitId, &'a ReadFlags, bool)>,
    /// A batch is still being assembled.
    pub pending: bool,
    /// Whether a row seen owned has gone a lease duration without a write (takeable).
    pub expired: &'a dyn Fn(&Lease) -> bool,
}
