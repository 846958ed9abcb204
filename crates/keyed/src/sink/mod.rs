//! The `sqlite` and `postgres` sinks: records become row changes of a keyed table, committed
//! with the pipeline's position in one transaction (docs/sinks.md §7.2–§7.4, docs/state.md §6.5).
//!
//! # From records to rows
//! The sink reads the JSON lines the source rendered (the same bytes the jsonl sink writes):
//! - scan/query items → upsert of the item, the key taken from its key attributes (where the
//!   Scan or Query page noted where they sit in the record, from there, without reading the
//!   record again: `Lines::noted`);
//! - envelopes (their fields from the page's notes where it has them: `NotedEnvelope`):
//!   `op` `c`, `u`, `r` → upsert of `after`; `d` → delete by `key`; any other `op`
//!   fails the run naming the record's `event_id` and shard. `r` rows written while a snapshot
//!   is open carry its id (docs/sinks.md §7.4).
//!
//! An upsert's typed columns (docs/sinks.md §7.9) are read from the same document (`after`)
//! by the sink's [`TypedColumns`]: the reader of `value_format` and `sink.on_type_mismatch`
//! ([`KeyedSink::on_type_mismatch`]; `crate::columns` says how a mismatch is stored, counted
//! or fails the batch). A mismatch under `fail` fails the batch before anything of it is
//! written, as a record that cannot become a row does.
//!
//! Key values follow `value_format`: plain `S` strings, `N` numbers (a JSON number's text, or
//! the string §3.2 writes for a number no double holds), `B` base64; typed `{"S": …}`,
//! `{"N": "<text>"}`, `{"B": "<base64>"}`. Scan and stream records of one pipeline render keys
//! the same way, so a key always maps to the same row.
//!
//! # Retries (docs/errors.md §9.4)
//! A retryable database error (connection loss, serialization failure, deadlock, busy) rolls
//! the transaction back; the whole batch is retried with the source's backoff and budget. When
//! the budget runs out the error is [`SinkErrorClass::Transient`] (a later run may succeed);
//! any other failure (a record that cannot become a row, a document the column cannot store, a
//! constraint) is [`SinkErrorClass::Definite`]: a rerun fails on the same batch.

use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::store::RepairSweep;
use ddbpipe_pipeline::sink::{
    CleanedUp, CloseShared, Fence, Fencing, RecordReader, Records, SharedSnapshot, SharedSnapshots,
    Sink, SinkError, SinkErrorClass, SnapshotClosed, Staged, Versioned,
};
use ddbpipe_source::position::{LeaseCheckpoint, SharedRepair};
use ddbpipe_source::retry::{Cancel, GaveUp, RetryPolicy};
use ddbpipe_value::ValueFormat;

mod rows;

pub use rows::{key_of, key_value, short};

use crate::state::DatabaseStore;
use crate::{
    CloseSnapshot, Database, DbError, FenceWrite, KeyColumn, OnMismatch, RowChange, SnapshotGuard,
    StateWrite, TableSpec, TypedColumns,
};

/// The attributes an item is read for, in one pass: the key attributes `key`, then the roots
/// of `columns` (the keyed sinks' rows and the lake's).
pub fn item_attributes(key: &[KeyColumn], columns: &TypedColumns) -> Vec<String> {
    let keys = key.iter().map(|column| column.name.clone());
    keys.chain(columns.reader().roots().iter().cloned())
        .collect()
}

/// How failed transactions are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkRetry {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first backoff.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
}

/// A keyed sink over a SQLite or PostgreSQL database.
#[derive(Debug)]
pub struct KeyedSink {
    db: Database,
    table: TableSpec,
    /// The pipeline's state in `db`, shared with the checkpointer's store.
    state: DatabaseStore,
    format: ValueFormat,
    /// The typed columns' reader (of `format`) and `on_type_mismatch`.
    columns: TypedColumns,
    /// What an item's one pass reads: its key attributes (key-column order), then the
    /// attributes the typed columns' paths start at (`columns.reader().roots()`).
    item_attributes: Vec<String>,
    records: Records,
    retry: SinkRetry,
    /// The pipeline whose shared snapshot record guards the fenced batches, once opened
    /// ([`SharedSnapshots::open_shared_snapshot`]): the fences are kept under a generation's
    /// name, the record under the pipeline's.
    shared_record: Option<String>,
}

impl KeyedSink {
    /// A sink writing `records` into `table` of `db`, its documents rendered in `format`, a
    /// mismatch of a typed column stored as NULL (see [`on_type_mismatch`](Self::on_type_mismatch));
    /// call [`prepare`](Self::prepare) first.
    pub fn new(
        db: Database,
        table: TableSpec,
        format: ValueFormat,
        records: Records,
        retry: SinkRetry,
    ) -> Self {
        let columns = TypedColumns::new(table.columns.clone(), format, OnMismatch::default());
        KeyedSink {
            state: DatabaseStore::new(db.clone(), table.clone()),
            item_attributes: item_attributes(&table.key, &columns),
            columns,
            db,
            table,
            format,
            records,
            retry,
            shared_record: None,
        }
    }

    /// What a value that does not fit its typed column does (`sink.on_type_mismatch`,
    /// docs/sinks.md §7.9): [`OnMismatch::Null`] (the default) or [`OnMismatch::Fail`]. It
    /// applies to the sink's batches and to the fill of a column `prepare` adds.
    pub fn on_type_mismatch(mut self, on_mismatch: OnMismatch) -> Self {
        self.columns = TypedColumns::new(self.table.columns.clone(), self.format, on_mismatch);
        self
    }

    /// The position store of the pipeline in the sink's database, sharing what the sink's
    /// batches commit: the checkpointer's store when the sink writes the batches.
    pub fn state_store(&self) -> DatabaseStore {
        self.state.clone()
    }

    /// Creates or checks the destination table and the state table, adding (and filling)
    /// the typed columns a table lacks ([`Database::prepare_with`]).
    pub async fn prepare(&self) -> Result<(), SinkError> {
        self.db
            .prepare_with(&self.table, &self.columns)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// A definite failure: retrying cannot change it.
    fn error(&self, message: String) -> SinkError {
        SinkError {
            sink: self.db.describe(),
            message,
            class: SinkErrorClass::Definite,
        }
    }

    /// A database error after the sink's retries: transient when it was retryable.
    fn db_error(&self, error: DbError) -> SinkError {
        SinkError {
            class: error.class,
            ..self.error(error.message)
        }
    }

    async fn apply(
        &self,
        rows: &[RowChange],
        write: &StateWrite,
        snapshot_id: Option<i64>,
    ) -> Result<(), DbError> {
        self.retried(|| self.db.apply(&self.table, rows, snapshot_id, write))
            .await
    }

    /// Runs `transaction` again while it fails with a retryable error (a busy database, a lost
    /// connection), with the source's backoff and budget: a batch's apply, a lease's claim.
    async fn retried<T, F: Future<Output = Result<T, DbError>>>(
        &self,
        transaction: impl FnMut() -> F,
    ) -> Result<T, DbError> {
        let policy = RetryPolicy {
            max_retries: self.retry.max_retries,
            initial_backoff: self.retry.initial_backoff,
            max_backoff: self.retry.max_backoff,
            ..RetryPolicy::default()
        };
        let target = self.db.describe();
        retried(&policy, "sink_transaction", &target, transaction).await
    }
}

/// Runs `transaction` on the database `target` (for the log) again while it fails with a
/// retryable error (a busy database, a lost connection: docs/errors.md §9.4), within `policy`,
/// its retries logged as `operation`'s; the last error says how many attempts were made. The
/// keyed sinks' transactions and the Iceberg sink's PostgreSQL catalog.
pub async fn retried<T, F: Future<Output = Result<T, DbError>>>(
    policy: &RetryPolicy,
    operation: &'static str,
    target: &str,
    mut transaction: impl FnMut() -> F,
) -> Result<T, DbError> {
    let retrying = |n: u32, error: &DbError, _delay| {
        tracing::debug!(
            sink = %target,
            attempt = n + 1,
            error = %error.message,
            "Database transaction failed; retrying it."
        );
        ddbpipe_source::retry::note_retry(operation, &error.message);
    };
    let applied = policy
        .retry(
            Duration::MAX,
            &Cancel::never(),
            DbError::is_retryable,
            retrying,
            |_| transaction(),
        )
        .await;
    match applied {
        Ok(value) => Ok(value),
        Err(GaveUp::Failed {
            mut error,
            attempts,
        }) => {
            if attempts > 1 {
                error.message = format!("{} (failed after {attempts} attempt(s))", error.message);
            }
            Err(error)
        }
        // `Cancel::never()` never fires.
        Err(GaveUp::Cancelled) => Err(DbError::fatal(format!(
            "{target}: the transaction was cancelled"
        ))),
    }
}

impl KeyedSink {
    /// Writes `batch` with the state of `state` and the lease fence of `fence`, in one
    /// transaction.
    async fn write_with(
        &mut self,
        batch: &Batch,
        state: Option<&Staged>,
        fence: Option<&Fence>,
    ) -> Result<(), SinkError> {
        // A mirror shared by several workers names its open snapshot in the fence: its rows'
        // batches, refused once it is closed, and the changes read beside it, marked with it;
        // and the snapshot of the generation that read them, refused once it is replaced.
        let shared = fence.and_then(|fence| fence.snapshot);
        let beside = fence.and_then(|fence| fence.beside);
        let of = fence.and_then(|fence| fence.of);
        // A shared repair's window: its changes apply by version, refused once it is closed.
        let repair = fence.and_then(|fence| fence.repair);
        let snapshot_id = state.and_then(Staged::snapshot_id).or(shared).or(beside);
        let repair_id = state.and_then(Staged::repair_id).or(repair);
        let rows = self
            .rows_during(batch, snapshot_id.is_some(), repair_id)
            .map_err(|message| self.error(message))?;
        let (write, parts) = match state {
            Some(staged) => {
                let (write, parts) = self.state.changes(&staged.pipeline, Some(&staged.entry));
                (write, Some(parts))
            }
            None => (StateWrite::default(), None),
        };
        let mut write = write;
        if let Some(fence) = fence {
            write.pipeline.clone_from(&fence.pipeline);
            write.fences.push(FenceWrite {
                unit: fence.unit.to_string(),
                counter: fence.counter,
                position: fence.position.as_ref().map(LeaseCheckpoint::encode),
            });
            write.snapshot = (shared.or(repair))
                .map(SnapshotGuard::Open)
                .or(of.map(SnapshotGuard::Of));
            write.record_of.clone_from(&self.shared_record);
        }
        if rows.is_empty() && write.is_empty() {
            return Ok(());
        }
        self.apply(&rows, &write, snapshot_id)
            .await
            .map_err(|e| self.db_error(e))?;
        if let Some(parts) = parts {
            self.state.written(parts);
        }
        Ok(())
    }
}

impl Sink for KeyedSink {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        self.write_with(batch, state, None).await
    }

    fn describe(&self) -> String {
        format!("{} table '{}'", self.db.describe(), self.table.table)
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        Some(self)
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        Some(self)
    }
}

/// Every worker writes one database: fences are kept in its state table, committed with the
/// rows (docs/coordination.md §11.7 rule 4).
impl Fencing for KeyedSink {
    async fn write_fenced(&mut self, batch: &Batch, fence: &Fence) -> Result<(), SinkError> {
        self.write_with(batch, None, Some(fence)).await
    }

    async fn claim(&mut self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        let unit = fence.unit.to_string();
        let write = StateWrite {
            pipeline: fence.pipeline.clone(),
            fences: vec![FenceWrite::new(unit.clone(), fence.counter)],
            ..StateWrite::default()
        };
        // Retried as a batch is: a claim that meets a busy database (another worker's
        // transaction, one stopped in the middle of it) waits as long as a write would.
        self.retried(|| async {
            self.db.store_state(&write).await?;
            self.db.fence_position(&fence.pipeline, &unit).await
        })
        .await
        .map(|stored| stored.map(|text| fence.unit.checkpoint(&text)))
        .map_err(|e| self.db_error(e))
    }
}

/// Snapshot rows are written by their versions (docs/mirror.md §5.6): the stream is read
/// beside a snapshot's scan.
impl Versioned for KeyedSink {
    fn rows_without_sequence_since(&self, since_ms: i64) -> ddbpipe_pipeline::sink::Detached<u64> {
        let (db, table) = (self.db.clone(), self.table.clone());
        Box::pin(async move {
            (db.rows_without_sequence_since(&table, since_ms).await).map_err(|error| SinkError {
                sink: db.describe(),
                message: error.message,
                class: error.class,
            })
        })
    }
}

impl SharedSnapshots for KeyedSink {
    async fn open_shared_snapshot(
        &mut self,
        pipeline: &str,
        id: i64,
    ) -> Result<SharedSnapshot, SinkError> {
        self.shared_record = Some(pipeline.to_string());
        self.db
            .open_shared_snapshot(&self.table, pipeline, id)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn reopen_shared_snapshot(
        &mut self,
        pipeline: &str,
        replaces: i64,
        id: i64,
        why: &str,
        repair: Option<&SharedRepair>,
    ) -> Result<SharedSnapshot, SinkError> {
        self.shared_record = Some(pipeline.to_string());
        self.db
            .reopen_shared_snapshot(&self.table, pipeline, replaces, id, why, repair)
            .await
            .map_err(|e| self.db_error(e))
    }

    fn record_reader(&self) -> Arc<dyn RecordReader> {
        Arc::new(SharedRecord {
            db: self.db.clone(),
        })
    }

    async fn shared_export(
        &mut self,
        pipeline: &str,
        id: i64,
        expected: Option<&str>,
        arn: &str,
    ) -> Result<String, SinkError> {
        self.db
            .shared_export(pipeline, id, expected, arn)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn close_shared_snapshot(
        &mut self,
        pipeline: &str,
        snapshot: &SharedSnapshot,
        close: &CloseShared,
    ) -> Result<Option<CleanedUp>, SinkError> {
        let closed = SharedSnapshot {
            closed: Some(SnapshotClosed {
                by: close.by.clone(),
                at_ms: close.at_ms,
            }),
            ..snapshot.clone()
        };
        let record = serde_json::to_string(&closed)
            .map_err(|e| self.error(format!("the snapshot record: {e}")))?;
        let write = StateWrite {
            pipeline: pipeline.to_string(),
            snapshot: Some(SnapshotGuard::Close {
                id: snapshot.id,
                record,
            }),
            ..StateWrite::default()
        };
        let closed = match snapshot.repair {
            // A repair's window (docs/coordination.md §11.12 rule 9): the rows its changes
            // left out are swept, as one process closes a repair window.
            Some(repair) => {
                let sweep = RepairSweep {
                    id: snapshot.id,
                    from_ms: repair.window_from_ms,
                    to_ms: repair.window_to_ms,
                };
                let deleted = self
                    .db
                    .close_repair_window(&self.table, sweep, &write)
                    .await;
                deleted.map(|deleted| CleanedUp {
                    keys_written: 0,
                    deleted,
                    ceiling_hit: false,
                })
            }
            None => {
                let request = CloseSnapshot {
                    id: snapshot.id,
                    delete_unseen: close.delete_unseen,
                    max_keys: close.max_keys,
                };
                let done = self.db.close_snapshot(&self.table, request, &write).await;
                done.map(|done| CleanedUp {
                    keys_written: done.keys_written,
                    deleted: done.deleted,
                    ceiling_hit: done.ceiling_hit,
                })
            }
        };
        match closed {
            Ok(done) => Ok(Some(done)),
            Err(error) if error.is_fenced() => {
                // Refused: closed already, or the record is not this snapshot's any more (a
                // reset): read, not opened again.
                let stored = self
                    .db
                    .shared_snapshot(pipeline)
                    .await
                    .map_err(|e| self.db_error(e))?;
                match stored {
                    Some(stored) if stored.id == snapshot.id && stored.closed.is_some() => Ok(None),
                    _ => Err(self.db_error(error)),
                }
            }
            Err(error) => Err(self.db_error(error)),
        }
    }
}

/// Reads the shared snapshot record beside the sink's writes ([`SharedSnapshots::record_reader`]).
struct SharedRecord {
    db: Database,
}

impl RecordReader for SharedRecord {
    fn read(
        &self,
        pipeline: String,
    ) -> futures_util::future::BoxFuture<'static, Result<Option<SharedSnapshot>, SinkError>> {
        let db = self.db.clone();
        Box::pin(async move {
            db.shared_snapshot(&pipeline)
                .await
                .map_err(|error| SinkError {
                    sink: db.describe(),
                    message: error.message,
                    class: error.class,
                })
        })
    }
}

#[cfg(test)]
mod tests;
