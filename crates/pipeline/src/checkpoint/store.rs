//! Where a pipeline's entry is kept: the [`CheckpointStore`] contract, and the state file as
//! its first implementation (the sink databases implement it in `ddbpipe-keyed`).
//!
//! # Rules (docs/state.md §6.1, §6.5)
//! 1. A store reads an entry strictly (corruption names the store and the JSON path) and
//!    replaces it whole; what it writes is its own business (one file, or parts in rows).
//! 2. A store [`WithRows`](Placement::WithRows) lives in the sink's database: each batch's
//!    entry is handed to the sink as a [`Staged`](crate::sink::Staged) and committed with the
//!    batch's rows; a snapshot closes with the complete-read cleanup of those rows. A store
//!    [`Apart`](Placement::Apart) from the records (the state file) is written by the
//!    checkpointer itself and has no rows to clean up.

use futures_util::future::BoxFuture;

use crate::state::{Entry, StateError, StateFile};

/// Where the state lives relative to the records (rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Apart from the records: a state file.
    Apart,
    /// In the sink's database, committed with the rows.
    WithRows,
}

/// What the rows of a snapshot the snapshot did not write become when it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unseen {
    /// They stay.
    Keep,
    /// They are deleted (`resnapshot_deletes`), unless the snapshot wrote more keys than the
    /// ceiling.
    Delete,
}

/// Closing a snapshot with the complete-read cleanup (docs/mirror.md §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotClose {
    /// The snapshot id (the marker of its rows).
    pub id: i64,
    /// What becomes of rows the snapshot did not write.
    pub unseen: Unseen,
    /// Delete nothing when the snapshot wrote more than this many keys.
    pub max_keys: u64,
}

/// Whether the cleanup ran or stopped at the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ceiling {
    /// Within `max_keys` (or nothing was to be deleted).
    Kept,
    /// Deletes were wanted but skipped: the snapshot wrote more than `max_keys` keys.
    Hit,
}

/// What closing a snapshot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotClosed {
    /// Rows marked with the snapshot id.
    pub keys_written: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// Whether the ceiling stopped the deletes.
    pub ceiling: Ceiling,
}

/// A repair window whose files were all applied (docs/streams.md §4.12): rows a stream change
/// wrote at a version inside the window that the window's export did not mark with the repair's
/// id were deleted from the table inside the window (an incremental export leaves out items
/// created and deleted within its window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairSweep {
    /// The repair id (the marker of the rows it wrote).
    pub id: i64,
    /// The window's start (unix ms, inclusive).
    pub from_ms: i64,
    /// The window's end (unix ms, exclusive).
    pub to_ms: i64,
}

/// A pipeline's position store.
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Where the state is, for messages ("/x/orders.state.json", "sqlite out.db").
    fn describe(&self) -> String;

    /// Where the state lives relative to the records (rule 2).
    fn placement(&self) -> Placement;

    /// Reads `pipeline`'s entry strictly; `None` when there is none.
    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>>;

    /// Replaces `pipeline`'s entry (`None` removes it).
    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>>;

    /// Rows in the destination table, when the state lives with the rows (a mirror's capture
    /// records it: docs/mirror.md §5.1); `None` apart from them (the default).
    fn destination_rows(&self) -> BoxFuture<'_, Result<Option<u64>, StateError>> {
        Box::pin(async { Ok(None) })
    }

    /// Closes a snapshot: the cleanup of `close`, then `entry` is written, in one transaction.
    /// A store apart from the rows (the default) has nothing to clean: it writes `entry`.
    fn close_snapshot<'a>(
        &'a mut self,
        pipeline: &'a str,
        close: SnapshotClose,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<SnapshotClosed, StateError>> {
        let _ = close;
        Box::pin(async move {
            self.store(pipeline, Some(entry)).await?;
            Ok(SnapshotClosed {
                keys_written: 0,
                deleted: 0,
                ceiling: Ceiling::Kept,
            })
        })
    }

    /// Closes a repair window: the deletes of `sweep`, then `entry` is written, in one
    /// transaction; returns the rows deleted. A store apart from the rows (the default) only
    /// writes `entry`.
    fn close_repair_window<'a>(
        &'a mut self,
        pipeline: &'a str,
        sweep: RepairSweep,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<u64, StateError>> {
        let _ = sweep;
        Box::pin(async move {
            self.store(pipeline, Some(entry)).await?;
            Ok(0)
        })
    }
}

impl CheckpointStore for Box<dyn CheckpointStore> {
    fn describe(&self) -> String {
        self.as_ref().describe()
    }

    fn placement(&self) -> Placement {
        self.as_ref().placement()
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
        self.as_mut().load(pipeline)
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        self.as_mut().store(pipeline, entry)
    }

    fn destination_rows(&self) -> BoxFuture<'_, Result<Option<u64>, StateError>> {
        self.as_ref().destination_rows()
    }

    fn close_snapshot<'a>(
        &'a mut self,
        pipeline: &'a str,
        close: SnapshotClose,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<SnapshotClosed, StateError>> {
        self.as_mut().close_snapshot(pipeline, close, entry)
    }

    fn close_repair_window<'a>(
        &'a mut self,
        pipeline: &'a str,
        sweep: RepairSweep,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<u64, StateError>> {
        self.as_mut().close_repair_window(pipeline, sweep, entry)
    }
}

/// The state file: apart from the records, nothing to clean up.
impl CheckpointStore for StateFile {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }

    fn placement(&self) -> Placement {
        Placement::Apart
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
        let loaded = StateFile::load(self, pipeline);
        Box::pin(async move { loaded })
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        let stored = StateFile::store(self, pipeline, entry);
        Box::pin(async move { stored })
    }
}
