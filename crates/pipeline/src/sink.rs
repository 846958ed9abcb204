//! The `Sink` contract: write a batch completely, acknowledge it only once it is durable.
//!
//! # Capabilities (docs/sinks.md §7.6)
//! What a sink must do is [`Sink`]; what only some sinks can do is an opt-in trait on top of
//! it ([`Fencing`], [`Versioned`], [`SharedSnapshots`]), so a sink cannot claim a capability
//! without the methods that carry it out. A batch's [`Staged`] entry stays an argument of
//! [`Sink::write`]: it is the checkpoint store's choice (a store with the rows), not the
//! sink's, and only the sink whose database holds that store is ever given one.
//!
//! A sink that answers [`Sink::fencing`] implements [`Fencing`], which has no defaults: a
//! fencing sink cannot fall back to a write without its fence.
//!
//! ```compile_fail,E0046
//! use ddbpipe_pipeline::batch::Batch;
//! use ddbpipe_pipeline::sink::{Fencing, Sink, SinkError, Staged};
//!
//! struct Files;
//!
//! impl Sink for Files {
//!     async fn write(&mut self, _: &Batch, _: Option<&Staged>) -> Result<(), SinkError> {
//!         Ok(())
//!     }
//!
//!     fn describe(&self) -> String {
//!         "files".into()
//!     }
//!
//!     fn fencing(&mut self) -> Option<&mut impl Fencing> {
//!         Some(self)
//!     }
//! }
//!
//! impl Fencing for Files {}
//! ```

use std::future::Future;
use std::sync::Arc;

use crate::batch::Batch;
use crate::state::Entry;

/// A failed write. The batch was not acknowledged, so its position does not advance.
#[derive(Debug, thiserror::Error)]
#[error("sink {sink}: {message}")]
pub struct SinkError {
    /// The sink and its target, e.g. "jsonl out/orders.jsonl".
    pub sink: String,
    /// What went wrong.
    pub message: String,
    /// Whether a later run may succeed where this one failed.
    pub class: SinkErrorClass,
}

/// What a failed write means for the next run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkErrorClass {
    /// The sink's own retries ran out (connection loss, busy database, I/O): a later run
    /// resumes after the last acknowledged batch.
    Transient,
    /// Retrying cannot help (a record the sink cannot store, a constraint, a wrong table):
    /// every rerun fails on the same batch until its cause is fixed.
    Definite,
    /// A lease fence refused the batch: a newer owner of its unit wrote to the sink
    /// (docs/coordination.md §11.7 rule 4). Nothing of the batch was written; the unit is lost
    /// to this worker.
    Fenced,
}

/// The fencing token of a lease, for a sink that keeps one per unit (docs/coordination.md
/// §11.7 rule 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The pipeline.
    pub pipeline: String,
    /// The unit (`segment:<i>/<n>`, `shard:<id>`).
    pub unit: ddbpipe_source::lease::UnitId,
    /// The lease counter this worker holds.
    pub counter: u64,
    /// Where the unit stands once the batch is written, as its lease checkpoint: stored with
    /// the counter in the batch's transaction, so the unit's next owner resumes exactly after
    /// the rows written (`None`: the stored position stays).
    pub position: Option<ddbpipe_source::position::LeaseCheckpoint>,
    /// The open shared snapshot whose rows the batch holds (a mirror across workers,
    /// docs/coordination.md §11.12): its snapshot rows are marked with this id, and the batch
    /// is refused ([`SinkErrorClass::Fenced`]) once that snapshot is closed.
    pub snapshot: Option<i64>,
    /// The shared snapshot whose stream the batch's changes were read beside (a mirror across
    /// workers, docs/coordination.md §11.12): its upserts are marked with this id and its
    /// deletes leave markers (docs/mirror.md §5.6 rules 1 and 2), so that the snapshot's rows
    /// never overwrite them and its cleanup counts them seen.
    pub beside: Option<i64>,
    /// The shared snapshot of the generation that read the batch (a mirror across workers,
    /// docs/coordination.md §11.12 rule 8): the batch is refused ([`SinkErrorClass::Fenced`])
    /// once the record is another snapshot's, opened in its place after a gap, so a worker of
    /// an earlier generation writes nothing.
    pub of: Option<i64>,
    /// The shared repair whose incremental export's changes the batch holds (a mirror across
    /// workers, docs/coordination.md §11.12 rule 9): they are applied by version and mark
    /// their rows with this id, and the batch is refused once that repair's window is closed
    /// or its record replaced.
    pub repair: Option<i64>,
}

/// The snapshot record of a mirror shared by several workers (docs/coordination.md §11.12),
/// kept in the destination's database: opened once, before any snapshot row is written, and
/// closed once, by whichever worker runs the complete-read cleanup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedSnapshot {
    /// The snapshot's id, the marker of the rows it writes: when it was opened (unix ms, the
    /// opening worker's clock). The stream read after it must still hold this time
    /// (docs/coordination.md §11.12, the limit).
    pub id: i64,
    /// Rows the destination table held when it was opened: the cleanup deletes only when
    /// there were some (a first mirror into an empty table has nothing to clean).
    pub rows_at_start: u64,
    /// Set once the cleanup has committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<SnapshotClosed>,
    /// The export the snapshot reads (`snapshot.engine: export`): the first worker's, stored
    /// before any worker waits for it, so every worker reads the same files whenever it comes
    /// ([`SharedSnapshots::shared_export`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<String>,
    /// 0 for the pipeline's first snapshot, one more for each snapshot opened in place of
    /// another ([`SharedSnapshots::reopen_shared_snapshot`]). The leases and fences of a later
    /// generation are kept under its own name ([`SharedSnapshot::lease_pipeline`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
    /// Why this snapshot replaced the one before it (a gap in the stream, a damaged export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
    /// Set when this generation repairs a gap instead of reading the table (docs/coordination.md
    /// §11.12 rule 9): its "snapshot" is the incremental export of this window, its changes
    /// applied by version and marked with the record's id, and its close deletes what the
    /// window's changes leave out instead of the rows the snapshot did not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<ddbpipe_source::position::SharedRepair>,
    /// The ids of the generations before this one whose leases were kept under their own
    /// names (generation 1 and later), oldest first: nothing takes their rows again, and
    /// `state reset` deletes them with the current generation's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<i64>,
}

/// The lease name of the generation whose snapshot is `id`, from generation 1 on.
fn generation_name(pipeline: &str, id: i64) -> String {
    format!("{pipeline}/snapshot-{id}")
}

fn is_zero(generation: &u32) -> bool {
    *generation == 0
}

impl SharedSnapshot {
    /// The name the leases of this snapshot's generation are kept under, in the lease table
    /// and the fence table, for pipeline `pipeline`: the pipeline's own for generation 0,
    /// `<pipeline>/snapshot-<id>` after (docs/coordination.md §11.12 rule 8). A generation's
    /// rows are new: nothing of an earlier one (a segment `Done`, a shard's position, a fence)
    /// is taken for its own, nor of a generation of a pipeline reset since.
    pub fn lease_pipeline(&self, pipeline: &str) -> String {
        if self.generation == 0 {
            pipeline.to_string()
        } else {
            generation_name(pipeline, self.id)
        }
    }

    /// The names the leases of the generations before this one were kept under, besides the
    /// pipeline's own ([`SharedSnapshot::earlier`]), oldest first.
    pub fn earlier_lease_pipelines(&self, pipeline: &str) -> Vec<String> {
        (self.earlier.iter())
            .map(|id| generation_name(pipeline, *id))
            .collect()
    }

    /// The window a repair goes on with once this record's is applied (closed); `None` for
    /// a snapshot's record, an open one, and a repair's last window.
    pub fn next_window(&self) -> Option<ddbpipe_source::position::SharedRepair> {
        self.closed.as_ref()?;
        self.repair.as_ref()?.next()
    }
}

/// Who closed a shared snapshot, kept in its record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotClosed {
    /// The worker that ran the cleanup.
    pub by: String,
    /// When (unix ms).
    pub at_ms: i64,
}

/// What the complete-read cleanup of a shared snapshot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanedUp {
    /// Rows marked with the snapshot's id.
    pub keys_written: u64,
    /// Rows the cleanup deleted.
    pub deleted: u64,
    /// Deletes were wanted but skipped: more keys than `resnapshot_max_keys`.
    pub ceiling_hit: bool,
}

/// How to close a shared snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseShared {
    /// The worker closing it.
    pub by: String,
    /// Now (unix ms).
    pub at_ms: i64,
    /// Delete the rows the snapshot did not write (`resnapshot_deletes`, and rows were there
    /// when it was opened).
    pub delete_unseen: bool,
    /// Delete nothing when the snapshot wrote more keys than this.
    pub max_keys: u64,
}

/// A sink whose database keeps the snapshot record of a mirror shared by several workers
/// (docs/coordination.md §11.12): the keyed sinks.
pub trait SharedSnapshots: Sink {
    /// The pipeline's snapshot record: the stored one, or, when none is stored, a new open
    /// one of snapshot `id` with the destination's row count, stored in one transaction (of
    /// workers opening it at once, the first one's is kept).
    fn open_shared_snapshot(
        &mut self,
        pipeline: &str,
        id: i64,
    ) -> impl Future<Output = Result<SharedSnapshot, SinkError>> + Send;

    /// Stores `arn` as the export of open snapshot `id` when its record still names
    /// `expected` (none, or a FAILED export being replaced), in one transaction; returns the
    /// export the record names afterwards: `arn`, or the one another worker stored first.
    fn shared_export(
        &mut self,
        pipeline: &str,
        id: i64,
        expected: Option<&str>,
        arn: &str,
    ) -> impl Future<Output = Result<String, SinkError>> + Send;

    /// Runs the complete-read cleanup of `snapshot` and marks it closed, in one transaction;
    /// `None` when it was closed already (by another worker: nothing is done again).
    fn close_shared_snapshot(
        &mut self,
        pipeline: &str,
        snapshot: &SharedSnapshot,
        close: &CloseShared,
    ) -> impl Future<Output = Result<Option<CleanedUp>, SinkError>> + Send;

    /// Opens snapshot `id` of the next generation in place of snapshot `replaces` (open or
    /// closed), for the reason `why`, with the destination's row count, in one transaction
    /// that locks the record; returns the record afterwards: the new one, or the one another
    /// worker put in its place first (whose id is not `replaces` any more). Refused when the
    /// record is gone (a `state reset`).
    ///
    /// With `repair`, the new generation repairs a gap in that window instead of reading the
    /// table (docs/coordination.md §11.12 rule 9).
    fn reopen_shared_snapshot(
        &mut self,
        pipeline: &str,
        replaces: i64,
        id: i64,
        why: &str,
        repair: Option<&ddbpipe_source::position::SharedRepair>,
    ) -> impl Future<Output = Result<SharedSnapshot, SinkError>> + Send;

    /// A reader of the pipeline's record beside this sink's writes, for a worker to learn that
    /// another one opened a snapshot in place of its own.
    fn record_reader(&self) -> Arc<dyn RecordReader>;
}

/// Reads a pipeline's shared snapshot record ([`SharedSnapshots::record_reader`]).
pub trait RecordReader: Send + Sync {
    /// The record as stored; `None` when there is none.
    fn read(
        &self,
        pipeline: String,
    ) -> futures_util::future::BoxFuture<'static, Result<Option<SharedSnapshot>, SinkError>>;
}

/// The entry a batch's positions reach, for a sink whose database holds the position: it
/// commits the entry in the batch's transaction (docs/state.md §6.5).
#[derive(Debug, Clone)]
pub struct Staged {
    /// The pipeline the entry belongs to.
    pub pipeline: String,
    /// The entry to commit.
    pub entry: Entry,
}

impl Staged {
    /// The open snapshot's id: snapshot rows (`op: "r"`) are marked with it.
    pub fn snapshot_id(&self) -> Option<i64> {
        match &self.entry.position {
            Some(ddbpipe_source::position::Position::Streams(streams)) => streams.snapshot_id(),
            _ => None,
        }
    }

    /// The open repair's id: the changes of its incremental exports are applied by version
    /// and mark their rows with it (docs/streams.md §4.12).
    pub fn repair_id(&self) -> Option<i64> {
        match &self.entry.position {
            Some(ddbpipe_source::position::Position::Streams(streams)) => streams.repair_id(),
            _ => None,
        }
    }
}

/// What the records of a run are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Records {
    /// Scan or query items.
    Items,
    /// Change and snapshot envelopes (streams, mirror).
    Envelopes,
}

/// Where batches go. Batches arrive in order; `write` returning `Ok` is the acknowledgement.
///
/// Every sink implements [`write`](Sink::write) and [`describe`](Sink::describe); `start` and
/// `complete` default to doing nothing. A capability is an opt-in trait the sink implements
/// only if it has it, and the run asks for it through one accessor whose default is `None`:
/// [`Fencing`] through [`fencing`](Sink::fencing), [`Versioned`] through
/// [`versioned`](Sink::versioned). [`SharedSnapshots`] is asked for by type: only a sink that
/// implements it can run a mirror across workers.
pub trait Sink: Send {
    /// Writes the whole batch and returns once it is durable. `state` is given when the
    /// position lives in the sink's database: the sink commits it in the batch's transaction.
    fn write(
        &mut self,
        batch: &Batch,
        state: Option<&Staged>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Told once, before the first batch of a scan or query run, whether the run continues a
    /// saved position. A sink that writes a run into a temporary file (jsonl `write:
    /// overwrite`) empties it on a fresh start and continues it on a resumed one.
    fn start(&mut self, start: RunStart) -> impl Future<Output = Result<(), SinkError>> + Send {
        let _ = start;
        async { Ok(()) }
    }

    /// Told once, after a scan or query run read every segment and its position was cleared:
    /// a sink that publishes a run's output at its end (an atomic rename) does it here. Never
    /// called for an interrupted run, nor for streams and mirror runs (they do not complete).
    fn complete(&mut self) -> impl Future<Output = Result<(), SinkError>> + Send {
        async { Ok(()) }
    }

    /// Names the sink and its target for messages ("jsonl out/orders.jsonl").
    fn describe(&self) -> String;

    /// The sink's lease fences, when it keeps them (docs/coordination.md §11.7 rule 4): a
    /// shared run then writes each batch with its unit's [`Fence`] through
    /// [`Fencing::write_fenced`], one unit per batch, and claims each lease it takes with
    /// [`Fencing::claim`] before its first batch. `None` (the default): the sink keeps no
    /// fences (jsonl: each worker writes its own file) and is written with [`Sink::write`].
    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        None::<&mut Lacks>
    }

    /// The sink's versioned apply, when it has it (docs/mirror.md §5.6): a snapshot's scan
    /// then runs while the stream is read. `None` (the default): the stream is read only after
    /// its snapshot.
    fn versioned(&self) -> Option<&impl Versioned> {
        None::<&Lacks>
    }
}

/// An opt-in capability of a [`Sink`]: lease fences for several workers (docs/coordination.md
/// §11.7 rule 4), kept in the sink's database beside the rows. A sink has it by implementing
/// this trait and answering [`Sink::fencing`] with itself; a run of several workers then
/// writes through it only.
pub trait Fencing: Sink {
    /// Writes the batch of one unit in one transaction with its fence: refused
    /// ([`SinkErrorClass::Fenced`]) with nothing written when a newer owner's counter is stored.
    fn write_fenced(
        &mut self,
        batch: &Batch,
        fence: &Fence,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Stores a newly taken lease's counter before its first batch, so an earlier owner's late
    /// batch is refused from now on; refused ([`SinkErrorClass::Fenced`]) when an even newer
    /// owner's counter is stored. Returns the position stored with the unit's fence, if any:
    /// the unit resumes after it, since it was committed with the rows it covers.
    fn claim(
        &mut self,
        fence: &Fence,
    ) -> impl Future<Output = Result<Option<ddbpipe_source::position::LeaseCheckpoint>, SinkError>> + Send;
}

/// A sink's answer that borrows nothing of the sink: a run may hold it across its awaits
/// without the sink being shared between threads.
pub type Detached<T> = futures_util::future::BoxFuture<'static, Result<T, SinkError>>;

/// An opt-in capability of a [`Sink`]: it applies snapshot rows beside stream changes by their
/// versions (docs/mirror.md §5.6), so a row never goes back to an older version whichever
/// arrives first. Writing by version needs no method beyond [`Sink::write`]: a sink has it by
/// implementing this trait and answering [`Sink::versioned`] with itself.
pub trait Versioned: Sink {
    /// The destination's rows whose last write carries no stream sequence number (a
    /// snapshot's row, a repair's change, a row without a version) at or after `since_ms`: a
    /// repair whose window starts before them cannot tell an item of theirs created and
    /// deleted inside the window, which its incremental export leaves out and its sweep does
    /// not delete (docs/streams.md §4.12). The default, for a sink whose repairs sweep
    /// nothing: none. The answer borrows nothing of the sink, which a run holds across it.
    fn rows_without_sequence_since(&self, since_ms: i64) -> Detached<u64> {
        let _ = since_ms;
        Box::pin(async { Ok(0) })
    }
}

/// The answer of a sink without a capability: no value of it exists.
enum Lacks {}

impl Sink for Lacks {
    async fn write(&mut self, _: &Batch, _: Option<&Staged>) -> Result<(), SinkError> {
        match *self {}
    }

    fn describe(&self) -> String {
        match *self {}
    }
}

impl Fencing for Lacks {
    async fn write_fenced(&mut self, _: &Batch, _: &Fence) -> Result<(), SinkError> {
        match *self {}
    }

    async fn claim(
        &mut self,
        _: &Fence,
    ) -> Result<Option<ddbpipe_source::position::LeaseCheckpoint>, SinkError> {
        match *self {}
    }
}

impl Versioned for Lacks {}

/// How a scan or query run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStart {
    /// No saved position: the table is read from the start.
    Fresh,
    /// A saved position is continued (an earlier run was interrupted).
    Resumed,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/coordination.md §11.12 rules 1 and 8: a first snapshot's record reads and writes
    /// as earlier versions stored it, its leases under the pipeline's name; a later
    /// generation's names its generation and reason, its leases under its own name.
    #[test]
    fn a_first_snapshots_record_keeps_its_stored_form_and_a_later_one_names_its_generation() {
        let stored =
            r#"{"id":100,"rows_at_start":3,"closed":{"by":"w1","at_ms":300},"export":"arn:x"}"#;
        let record: SharedSnapshot = serde_json::from_str(stored).unwrap();
        assert_eq!((record.generation, record.replaced.clone()), (0, None));
        assert_eq!(serde_json::to_string(&record).unwrap(), stored);
        assert_eq!(record.lease_pipeline("p"), "p");
        let later = SharedSnapshot {
            id: 500,
            generation: 2,
            replaced: Some("a gap in the stream".into()),
            ..record
        };
        assert_eq!(
            serde_json::to_string(&later).unwrap(),
            r#"{"id":500,"rows_at_start":3,"closed":{"by":"w1","at_ms":300},"export":"arn:x","generation":2,"replaced":"a gap in the stream"}"#
        );
        assert_eq!(later.lease_pipeline("p"), "p/snapshot-500");
        let third = SharedSnapshot {
            id: 700,
            generation: 3,
            earlier: vec![500, 600],
            ..later
        };
        let text = serde_json::to_string(&third).unwrap();
        assert!(text.ends_with(r#","earlier":[500,600]}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<SharedSnapshot>(&text).unwrap(),
            third
        );
        assert_eq!(
            third.earlier_lease_pipelines("p"),
            ["p/snapshot-500", "p/snapshot-600"]
        );
    }
}
