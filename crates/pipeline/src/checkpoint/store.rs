//! Where a pipeline's entry is kept: the [`CheckpointStore`] contract, and the state file as
//! its first implementation (the sink databases implement it in `ddbpipe-keyed`).
//!
//! # Rules (docs/state.md §6.1, §6.5, §6.8)
//! 1. A store reads an entry strictly (corruption names the store and the JSON path) and
//!    replaces it whole; what it writes is its own business (one file, or parts in rows).
//! 2. A store [`WithRows`] lives in the sink's database: each batch's entry is handed to the
//!    sink as a [`Staged`](crate::sink::Staged) and committed with the batch's rows; a snapshot
//!    closes with the complete-read cleanup of those rows. Any other store is apart from the
//!    records (the state file): the checkpointer writes it itself, and closing a snapshot or a
//!    repair window only writes the entry.
//! 3. A store that [commits with the batches](CheckpointStore::commits_with_batches) is handed
//!    each batch's entry as a [`Staged`](crate::sink::Staged) even without the rows: the sink
//!    commits it in the batch's transaction (the Kafka positions topic, docs/sinks.md §7.7).
//!    Entries written outside a batch (a start position, a closed snapshot) it writes itself.
//! 4. Such a store may hold several batches before it commits them (the lake sinks commit at
//!    an interval): the checkpointer asks it to [commit what it
//!    holds](CheckpointStore::commit_held) wherever it would write an unchanged position — a
//!    run's end, a stop, a failure — so a stopped run's acknowledged batches are committed.
//!
//! A store that answers [`CheckpointStore::with_rows`] implements [`WithRows`], which has no
//! defaults: a store with the rows cannot close a snapshot without its cleanup.
//!
//! ```compile_fail,E0046
//! use ddbpipe_pipeline::checkpoint::store::{CheckpointStore, WithRows};
//! use ddbpipe_pipeline::state::{Entry, StateError};
//! use futures_util::future::BoxFuture;
//!
//! #[derive(Debug)]
//! struct Rows;
//!
//! impl CheckpointStore for Rows {
//!     fn describe(&self) -> String {
//!         "rows".into()
//!     }
//!
//!     fn load<'a>(&'a mut self, _: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
//!         Box::pin(async { Ok(None) })
//!     }
//!
//!     fn store<'a>(
//!         &'a mut self,
//!         _: &'a str,
//!         _: Option<&'a Entry>,
//!     ) -> BoxFuture<'a, Result<(), StateError>> {
//!         Box::pin(async { Ok(()) })
//!     }
//!
//!     fn with_rows(&self) -> Option<&dyn WithRows> {
//!         Some(self)
//!     }
//! }
//!
//! impl WithRows for Rows {}
//! ```

use futures_util::future::BoxFuture;

use crate::state::{Entry, StateError, StateFile};

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

/// A pipeline's position store. Every store implements `describe`, `load` and `store`; a store
/// that lives with the rows also implements [`WithRows`] and answers
/// [`with_rows`](Self::with_rows) with itself (rule 2).
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Where the state is, for messages ("/x/orders.state.json", "sqlite out.db").
    fn describe(&self) -> String;

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

    /// The store's part in the sink's database, when it lives with the rows (rule 2); `None`
    /// (the default) apart from them.
    fn with_rows(&self) -> Option<&dyn WithRows> {
        None
    }

    /// Whether each batch's entry is committed by the sink with the batch (rule 3): a store
    /// with the rows, or one the sink writes in the batch's transaction (the Kafka positions
    /// topic).
    fn commits_with_batches(&self) -> bool {
        self.with_rows().is_some()
    }

    /// A store that commits with the batches but holds several of them before it commits
    /// (rule 4, the lake sinks): commits what it holds now, with the last batch's entry. The
    /// checkpointer calls it wherever it would write an unchanged position (a run's end, a
    /// stop, a failure). Nothing to do for the others (the default).
    fn commit_held(&mut self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async { Ok(()) })
    }
}

/// An opt-in part of a [`CheckpointStore`] that lives in the sink's database (rule 2, the
/// keyed sinks): the mirror's steps that touch the destination's rows, each in the
/// transaction that writes the entry.
pub trait WithRows: Send + Sync {
    /// Rows in the destination table (a mirror's capture records it: docs/mirror.md §5.1).
    fn destination_rows(&self) -> BoxFuture<'_, Result<u64, StateError>>;

    /// Closes a snapshot: the cleanup of `close`, then `entry` is written, in one transaction.
    fn close_snapshot<'a>(
        &'a self,
        pipeline: &'a str,
        close: SnapshotClose,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<SnapshotClosed, StateError>>;

    /// Closes a repair window: the deletes of `sweep`, then `entry` is written, in one
    /// transaction; returns the rows deleted.
    fn close_repair_window<'a>(
        &'a self,
        pipeline: &'a str,
        sweep: RepairSweep,
        entry: &'a Entry,
    ) -> BoxFuture<'a, Result<u64, StateError>>;
}

impl CheckpointStore for Box<dyn CheckpointStore> {
    fn describe(&self) -> String {
        self.as_ref().describe()
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

    fn with_rows(&self) -> Option<&dyn WithRows> {
        self.as_ref().with_rows()
    }

    fn commits_with_batches(&self) -> bool {
        self.as_ref().commits_with_batches()
    }

    fn commit_held(&mut self) -> BoxFuture<'_, Result<(), StateError>> {
        self.as_mut().commit_held()
    }
}

/// The state file: apart from the records, nothing to clean up.
impl CheckpointStore for StateFile {
    fn describe(&self) -> String {
        self.path().display().to_string()
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
