//! [`Database`]: a keyed destination of either backend, and the transaction scripts written
//! once over its [`Backend`](crate::backend::Backend) (see the crate docs for what each does).
//!
//! # Scripts
//! Each script takes a session of the backend, runs its statements in the backend's
//! [`Dialect`](crate::backend::Dialect) and commits; an error drops the transaction, which
//! rolls it back, so a script writes all or nothing:
//!
//! - [`Database::close_snapshot`]: pass the fences (and close the shared record), count the
//!   rows marked with the snapshot id, delete the others unless the count is above the
//!   ceiling `max_keys`, drop the table's deleted-key markers, write the state.
//! - [`Database::close_repair_window`]: delete the rows a stream change wrote inside the
//!   window that the repair did not mark, write the state.
//! - [`Database::open_shared_snapshot`]: read the record; when none is, count the table and
//!   insert an open record unless another worker's came first, then read it again.
//! - [`Database::store_state`]: pass the fences, write the state.
//! - [`Database::load_state`], [`Database::reset_state`], [`Database::fence_position`],
//!   [`Database::count_rows`]: one or two statements each, nothing when their table does not
//!   exist.
//!
//! `apply` runs the same fence pass and state write inside the backend's own row
//! statements.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{Backend, Call, Dialect, Param, RowLock, SqlType, Statements, Transaction};
use crate::fence::{self, first, open_record, shared_record};
use crate::sql::{
    DELETED_TABLE, SNAPSHOT_COLUMN, STATE_TABLE, VERSION_MS_COLUMN, VERSION_SEQ_COLUMN, quote,
    row_count,
};
use crate::{
    CloseSnapshot, Closed, ColumnCheck, ColumnValue, DbError, FENCE_TABLE, LockAttempt, LockHolder,
    RowChange, SNAPSHOT_UNIT, StateWrite, TableSpec, TypedColumns,
};
use ddbpipe_pipeline::checkpoint::store::RepairSweep;
use ddbpipe_pipeline::sink::SharedSnapshot;
use ddbpipe_source::position::SharedRepair;

/// A keyed destination database: a SQLite file or a PostgreSQL database (a cheap handle:
/// clones share the connection).
#[derive(Debug, Clone)]
pub struct Database {
    backend: Arc<dyn Backend>,
}

impl Database {
    /// The database behind `backend` (each backend's `From` gives it).
    pub(crate) fn of(backend: Arc<dyn Backend>) -> Self {
        Database { backend }
    }

    /// "sqlite out/orders.db" or "postgres db.example.com:5432/app" (never a password).
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// "sqlite" or "postgres".
    pub fn kind(&self) -> &'static str {
        self.backend.kind()
    }

    /// Creates `_ddbpipe_state` when missing (a database opened only to read state creates
    /// nothing: see [`load_state`](Self::load_state)).
    pub async fn prepare_state(&self) -> Result<(), DbError> {
        self.backend.prepare_state().await
    }

    /// Creates the destination table when missing and allowed, or checks an existing one has
    /// the same key columns (an error lists both) and adds the version columns a table of an
    /// earlier ddbpipe lacks; also creates `_ddbpipe_state` and `_ddbpipe_deleted` when missing.
    /// The document and typed columns are compared with the table as
    /// [`prepare_with`](Self::prepare_with) does, except that a typed column added to a table
    /// with rows is refused: filling it needs the reader of the documents.
    pub async fn prepare(&self, spec: &TableSpec) -> Result<(), DbError> {
        self.backend.prepare(spec, None).await
    }

    /// [`prepare`](Self::prepare), and the typed columns as the crate docs' "Typed columns at
    /// the start of a run" say: a typed column missing from the table is added and, when the
    /// table has rows, filled from their documents by `columns` (the sink's reader and
    /// `on_type_mismatch`), in one transaction with the `ALTER TABLE`; what the run cannot do
    /// is refused, naming the columns, before anything changes.
    pub async fn prepare_with(
        &self,
        spec: &TableSpec,
        columns: &TypedColumns,
    ) -> Result<(), DbError> {
        self.backend.prepare(spec, Some(columns)).await
    }

    /// What [`prepare_with`](Self::prepare_with) would refuse or change in the columns of an
    /// existing destination table (`check`, docs/cli.md §8.2); nothing is changed. A table that
    /// does not exist yet has nothing to refuse.
    pub async fn check_columns(&self, spec: &TableSpec) -> Result<ColumnCheck, DbError> {
        self.backend.check_columns(spec).await
    }

    /// Whether the database stores a typed column's value (`columns` rule 2).
    pub(crate) fn stores(&self, value: &ColumnValue) -> bool {
        self.backend.stores(value)
    }

    /// One transaction: the rows in order, as the crate docs' "Rows" say (`snapshot_id`: the
    /// open snapshot), then the state parts; the commit is the acknowledgement.
    pub async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        self.backend.apply(spec, rows, snapshot_id, state).await
    }

    /// Writes state parts alone (after passing its fences), in one transaction.
    pub async fn store_state(&self, state: &StateWrite) -> Result<(), DbError> {
        if state.is_empty() {
            return Ok(());
        }
        let mut session = self.backend.session(None, STATE_TABLE).await?;
        let mut tx = session.begin(STATE_TABLE).await?;
        let tx = &mut *tx;
        let result = async {
            if let Some(create) = tx.dialect().create_state() {
                tx.batch(STATE_TABLE, create).await?;
            }
            fence::pass(tx, state).await?;
            write_state(tx, state).await
        }
        .await;
        end(tx, STATE_TABLE, result).await
    }

    /// The position stored with `unit`'s lease fence (docs/coordination.md §11.7 rule 4):
    /// `None` when none is, or the fence table does not exist.
    pub async fn fence_position(
        &self,
        pipeline: &str,
        unit: &str,
    ) -> Result<Option<String>, DbError> {
        let mut session = self.backend.session(None, FENCE_TABLE).await?;
        if !session.exists(FENCE_TABLE).await? {
            return Ok(None);
        }
        let sql = fence::position_sql(&*session);
        let params = [Param::Text(pipeline), Param::Text(unit)];
        let rows = session.query(FENCE_TABLE, &sql, &params).await?;
        Ok(first(rows).and_then(|cell| cell.into_text()))
    }

    /// The stored parts of `pipeline` as `part → JSON text`; empty when there are none or the
    /// state table does not exist.
    pub async fn load_state(&self, pipeline: &str) -> Result<BTreeMap<String, String>, DbError> {
        Ok(self
            .state_rows("pipeline", pipeline)
            .await?
            .into_iter()
            .collect())
    }

    /// Whether two names are one table in this database (SQLite ignores ASCII case).
    pub fn same_name(&self, a: &str, b: &str) -> bool {
        self.backend.same_name(a, b)
    }

    /// Each pipeline's part `part` as `(pipeline, JSON text)`; empty when the state table does
    /// not exist.
    pub async fn stored_part(&self, part: &str) -> Result<Vec<(String, String)>, DbError> {
        self.state_rows("part", part).await
    }

    /// The state rows whose column `by` (`pipeline` or `part`) is `value`, each as the other
    /// column and the value's JSON text; none when the state table does not exist.
    async fn state_rows(&self, by: &str, value: &str) -> Result<Vec<(String, String)>, DbError> {
        let mut session = self.backend.session(None, STATE_TABLE).await?;
        if !session.exists(STATE_TABLE).await? {
            return Ok(Vec::new());
        }
        let other = if by == "part" { "pipeline" } else { "part" };
        let d = session.dialect();
        let sql = format!(
            "SELECT {other}, {} FROM {} WHERE {by} = {}",
            d.json_text("value"),
            d.table(STATE_TABLE),
            d.param(1, SqlType::Text)
        );
        let rows = session
            .query(STATE_TABLE, &sql, &[Param::Text(value)])
            .await?;
        let pairs = rows.into_iter().filter_map(|row| {
            let mut cells = row.into_iter().map(|cell| cell.into_text());
            Some((cells.next()??, cells.next()??))
        });
        Ok(pairs.collect())
    }

    /// The names of the pipelines with a stored part, sorted; empty when the state table does
    /// not exist. (A file of several tables warns of a table it no longer reads whose
    /// position is kept, docs/config.md §1.5 rule 1.)
    pub async fn stored_pipelines(&self) -> Result<Vec<String>, DbError> {
        let mut session = self.backend.session(None, STATE_TABLE).await?;
        if !session.exists(STATE_TABLE).await? {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT DISTINCT pipeline FROM {} ORDER BY pipeline",
            session.dialect().table(STATE_TABLE)
        );
        let rows = session.query(STATE_TABLE, &sql, &[]).await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| row.into_iter().next()?.into_text())
            .collect())
    }

    /// Deletes every part of `pipeline` and its lease fences; `true` when something was
    /// deleted.
    pub async fn reset_state(&self, pipeline: &str) -> Result<bool, DbError> {
        let mut session = self.backend.session(None, STATE_TABLE).await?;
        if !session.exists(STATE_TABLE).await? {
            return Ok(false);
        }
        let delete = |table: &str| {
            let d = session.dialect();
            format!(
                "DELETE FROM {} WHERE pipeline = {}",
                d.table(table),
                d.param(1, SqlType::Text)
            )
        };
        let (state, fences) = (delete(STATE_TABLE), delete(FENCE_TABLE));
        let params = [Param::Text(pipeline)];
        let deleted = session.execute(STATE_TABLE, &state, &params).await?;
        // A database of a version before fences has no fence table.
        let fenced = if session.exists(FENCE_TABLE).await? {
            session.execute(FENCE_TABLE, &fences, &params).await?
        } else {
            0
        };
        Ok(deleted + fenced > 0)
    }

    /// Rows in the destination table (0 when it does not exist).
    pub async fn count_rows(&self, spec: &TableSpec) -> Result<u64, DbError> {
        let mut session = self.backend.session(Some(spec), &spec.table).await?;
        count_existing(&mut *session, &spec.table).await
    }

    /// Rows of the destination table whose last write carries no stream sequence number (a
    /// snapshot's row, a repair's change, a row without a version) at a version at or after
    /// `since_ms`, or none: a repair whose window starts before them cannot tell an item of
    /// theirs created and deleted inside the window, which its sweep would delete
    /// (docs/coordination.md §11.12 rule 9). 0 when the table does not exist.
    pub async fn rows_without_sequence_since(
        &self,
        spec: &TableSpec,
        since_ms: i64,
    ) -> Result<u64, DbError> {
        self.backend.check_names(spec)?;
        let table = spec.table.as_str();
        let mut session = self.backend.session(Some(spec), table).await?;
        if !session.exists(table).await? {
            return Ok(0);
        }
        let sql = {
            let d = session.dialect();
            let version_ms = quote(VERSION_MS_COLUMN);
            format!(
                "SELECT count(*) FROM {} WHERE {} IS NULL AND ({version_ms} IS NULL OR \
                 {version_ms} >= {})",
                d.table(table),
                quote(VERSION_SEQ_COLUMN),
                d.param(1, SqlType::Int),
            )
        };
        let rows = session.query(table, &sql, &[Param::Int(since_ms)]).await?;
        Ok(row_count(
            first(rows).and_then(|cell| cell.int()).unwrap_or(0),
        ))
    }

    /// The pipeline's shared snapshot record (docs/coordination.md §11.12): the stored one, or
    /// a new open one of snapshot `id` with the destination table's row count as
    /// `rows_at_start`, stored in one transaction when none is (of workers opening it at once,
    /// the first one's is kept).
    pub async fn open_shared_snapshot(
        &self,
        spec: &TableSpec,
        pipeline: &str,
        id: i64,
    ) -> Result<SharedSnapshot, DbError> {
        self.backend.check_names(spec)?;
        let mut session = self.backend.session(Some(spec), FENCE_TABLE).await?;
        let mut tx = session.begin(FENCE_TABLE).await?;
        let tx = &mut *tx;
        let result = async {
            if let Some((_, text)) = fence::record(tx, pipeline, RowLock::None).await? {
                return Ok(text);
            }
            let rows_at_start = count_existing(tx, &spec.table).await?;
            let text = open_record(id, rows_at_start);
            // Of workers opening it at once, one inserts; the others wait for its commit and
            // read its record.
            let sql = fence::open_record_sql(tx);
            fence::write_record(tx, &sql, pipeline, &text).await?;
            let stored = fence::record(tx, pipeline, RowLock::None).await?;
            Ok(stored.and_then(|(_, text)| text))
        }
        .await;
        let stored = end(tx, FENCE_TABLE, result).await?;
        shared_record(stored.as_deref()).map_err(|why| tx.fail(FENCE_TABLE, &why))
    }

    /// Opens snapshot `id` of the next generation in place of snapshot `replaces` (open or
    /// closed) for the reason `why`, with the destination table's row count as
    /// `rows_at_start`, in one transaction that locks the record (docs/coordination.md
    /// §11.12 rule 8); returns the record afterwards: the new one, or the one another worker
    /// put in place of `replaces` first. With `repair`, the new generation repairs a gap in
    /// that window instead of reading the table (§11.12 rule 9). The replaced generation's unit fences and the
    /// replaced snapshot's deleted-key markers are deleted in the same transaction. Refused
    /// when the record is gone (a `state reset`).
    pub async fn reopen_shared_snapshot(
        &self,
        spec: &TableSpec,
        pipeline: &str,
        replaces: i64,
        id: i64,
        why: &str,
        repair: Option<&SharedRepair>,
    ) -> Result<SharedSnapshot, DbError> {
        self.backend.check_names(spec)?;
        let mut session = self.backend.session(Some(spec), FENCE_TABLE).await?;
        let mut tx = session.begin(FENCE_TABLE).await?;
        let tx = &mut *tx;
        let result = async {
            let Some((_, text)) = fence::record(tx, pipeline, RowLock::Update).await? else {
                return Err(tx.fail(
                    FENCE_TABLE,
                    &format!(
                        "snapshot {replaces}'s record is gone (a `state reset` ran meanwhile): \
                         no snapshot is opened in its place"
                    ),
                ));
            };
            let stored =
                shared_record(text.as_deref()).map_err(|why| tx.fail(FENCE_TABLE, &why))?;
            if stored.id != replaces {
                return Ok(stored);
            }
            let rows_at_start = count_existing(tx, &spec.table).await?;
            let record = SharedSnapshot {
                id,
                rows_at_start,
                closed: None,
                export: None,
                generation: stored.generation + 1,
                replaced: Some(why.to_string()),
                repair: repair.copied(),
                // The replaced generation's leases, under their own name from generation 1
                // on, are left to `state reset`, which the record names them to.
                earlier: (stored.earlier.iter().copied())
                    .chain((stored.generation > 0).then_some(stored.id))
                    .collect(),
            };
            let text = serde_json::to_string(&record)
                .map_err(|e| tx.fail(FENCE_TABLE, &format!("the snapshot record: {e}")))?;
            // Counter 0: open.
            let sql = fence::reopen_record_sql(tx);
            fence::write_record(tx, &sql, pipeline, &text).await?;
            // The replaced snapshot's deleted-key markers, as its close would have dropped them:
            // kept, one would keep the new snapshot from writing the row of an item deleted and
            // created again under the replaced one, whose cleanup then deletes it.
            let sql = drop_deleted_marks_sql(tx);
            tx.execute(DELETED_TABLE, &sql, &[Param::Text(&spec.table)])
                .await?;
            // The replaced generation's fences: nothing of it writes any more (its batches are
            // refused by the record), and the new generation's are kept under its own name.
            let replaced = stored.lease_pipeline(pipeline);
            let sql = fence::drop_unit_fences_sql(tx);
            tx.execute(
                FENCE_TABLE,
                &sql,
                &[Param::Text(&replaced), Param::Text(SNAPSHOT_UNIT)],
            )
            .await?;
            Ok(record)
        }
        .await;
        end(tx, FENCE_TABLE, result).await
    }

    /// Stores `arn` as the export of the open shared snapshot `id` when its record still
    /// names `expected` (none, or a FAILED export being replaced), in one transaction that
    /// locks the record (docs/coordination.md §11.12 rule 7); returns the export the record
    /// names afterwards: `arn`, or the one another worker stored first. Refused when the
    /// record is gone, closed or another snapshot's.
    pub async fn shared_export(
        &self,
        pipeline: &str,
        id: i64,
        expected: Option<&str>,
        arn: &str,
    ) -> Result<String, DbError> {
        let mut session = self.backend.session(None, FENCE_TABLE).await?;
        let mut tx = session.begin(FENCE_TABLE).await?;
        let stored = fence::record(&mut *tx, pipeline, RowLock::Update).await?;
        let mut record = match stored {
            Some((_, text)) => {
                shared_record(text.as_deref()).map_err(|why| tx.fail(FENCE_TABLE, &why))?
            }
            None => {
                return Err(tx.fail(
                    FENCE_TABLE,
                    &format!("snapshot {id}'s record is gone (a `state reset` ran meanwhile)"),
                ));
            }
        };
        if record.id != id || record.closed.is_some() {
            return Err(tx.fail(
                FENCE_TABLE,
                &format!(
                    "snapshot {id} is no longer open in the destination (its record is snapshot \
                     {}'s, {}): its export is not stored",
                    record.id,
                    if record.closed.is_some() {
                        "closed"
                    } else {
                        "open"
                    }
                ),
            ));
        }
        if record.export.as_deref() == expected {
            record.export = Some(arn.to_string());
            let text = serde_json::to_string(&record)
                .map_err(|e| tx.fail(FENCE_TABLE, &format!("the snapshot record: {e}")))?;
            let sql = fence::rewrite_record_sql(&*tx);
            fence::write_record(&mut *tx, &sql, pipeline, &text).await?;
        }
        tx.commit(FENCE_TABLE).await?;
        Ok(record.export.unwrap_or_else(|| arn.to_string()))
    }

    /// The pipeline's shared snapshot record as stored, without opening one: `None` when none
    /// is.
    pub async fn shared_snapshot(&self, pipeline: &str) -> Result<Option<SharedSnapshot>, DbError> {
        match self.fence_position(pipeline, SNAPSHOT_UNIT).await? {
            None => Ok(None),
            Some(text) => shared_record(Some(&text))
                .map(Some)
                .map_err(|why| DbError::fatal(format!("{}: {why}", self.describe()))),
        }
    }

    /// Closes a snapshot (see the crate docs) and writes `state`, in one transaction. With
    /// `state.snapshot` a [`SnapshotGuard::Close`](crate::SnapshotGuard::Close), the shared
    /// record must be open and is closed in the same transaction (refused, fenced, when it is
    /// closed already).
    pub async fn close_snapshot(
        &self,
        spec: &TableSpec,
        close: CloseSnapshot,
        state: &StateWrite,
    ) -> Result<Closed, DbError> {
        self.backend.check_names(spec)?;
        let table = spec.table.as_str();
        let mut session = self.backend.session(Some(spec), table).await?;
        let mut tx = session.begin(table).await?;
        let tx = &mut *tx;
        let result = async {
            fence::pass(tx, state).await?;
            let d = tx.dialect();
            let (quoted, marker, id) = (
                d.table(table),
                quote(SNAPSHOT_COLUMN),
                d.param(1, SqlType::Int),
            );
            let count_marked = format!("SELECT count(*) FROM {quoted} WHERE {marker} = {id}");
            let delete_unmarked =
                format!("DELETE FROM {quoted} WHERE {marker} IS DISTINCT FROM {id}");
            let drop_deleted_marks = drop_deleted_marks_sql(tx);
            let params = [Param::Int(close.id)];
            let marked = tx.query(table, &count_marked, &params).await?;
            let keys_written = row_count(first(marked).and_then(|cell| cell.int()).unwrap_or(0));
            let mut closed = Closed {
                keys_written,
                deleted: 0,
                ceiling_hit: false,
            };
            if close.delete_unseen {
                if keys_written <= close.max_keys {
                    closed.deleted = tx.execute(table, &delete_unmarked, &params).await?;
                } else {
                    closed.ceiling_hit = true;
                }
            }
            tx.execute(DELETED_TABLE, &drop_deleted_marks, &[Param::Text(table)])
                .await?;
            write_state(tx, state).await?;
            Ok(closed)
        }
        .await;
        end(tx, table, result).await
    }

    /// Closes a repair window (see the crate docs) and writes `state`, in one transaction;
    /// returns the rows deleted.
    pub async fn close_repair_window(
        &self,
        spec: &TableSpec,
        sweep: RepairSweep,
        state: &StateWrite,
    ) -> Result<u64, DbError> {
        self.backend.check_names(spec)?;
        let table = spec.table.as_str();
        let mut session = self.backend.session(Some(spec), table).await?;
        let mut tx = session.begin(table).await?;
        let tx = &mut *tx;
        let result = async {
            // A shared repair's window closes its record here (`state.snapshot`).
            fence::pass(tx, state).await?;
            let d = tx.dialect();
            let (version_ms, int) = (quote(VERSION_MS_COLUMN), SqlType::Int);
            let sql = format!(
                "DELETE FROM {} WHERE {} IS NOT NULL AND {version_ms} >= {} AND {version_ms} < {} \
             AND {} IS DISTINCT FROM {}",
                d.table(table),
                quote(VERSION_SEQ_COLUMN),
                d.param(2, int),
                d.param(3, int),
                quote(SNAPSHOT_COLUMN),
                d.param(1, int),
            );
            let params = [
                Param::Int(sweep.id),
                Param::Int(sweep.from_ms),
                Param::Int(sweep.to_ms),
            ];
            let deleted = tx.execute(table, &sql, &params).await?;
            write_state(tx, state).await?;
            Ok(deleted)
        }
        .await;
        end(tx, table, result).await
    }

    /// Takes the pipeline's run lock, held until this database handle and all its clones are
    /// dropped, or finds who holds it.
    pub async fn lock(&self, pipeline: &str) -> Result<LockAttempt, DbError> {
        self.backend.lock(pipeline).await
    }

    /// Whether another run holds the pipeline's lock (for `check`; takes nothing).
    pub async fn lock_holder(&self, pipeline: &str) -> Result<Option<LockHolder>, DbError> {
        self.backend.lock_holder(pipeline).await
    }

    /// The `check` probe (docs/cli.md §8.2): the database is reachable and the table creatable or
    /// compatible, with rights to create, write and delete; changes nothing. Returns a detail
    /// line.
    pub async fn probe(&self, spec: &TableSpec) -> Result<String, DbError> {
        self.backend.probe(spec).await
    }
}

/// Ends the transaction `tx` of a script (`on`: the table for messages): commits after
/// success; rolls back after a failure, and returns it.
async fn end<T>(
    tx: &mut dyn Transaction,
    on: &str,
    result: Result<T, DbError>,
) -> Result<T, DbError> {
    match result {
        Ok(value) => {
            tx.commit(on).await?;
            Ok(value)
        }
        Err(error) => {
            tx.rollback().await;
            Err(error)
        }
    }
}

/// Deletes the deleted-key markers of one destination table (docs/mirror.md §5.6): parameter
/// the table's name.
fn drop_deleted_marks_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "DELETE FROM {} WHERE table_name = {}",
        d.table(DELETED_TABLE),
        d.param(1, SqlType::Text)
    )
}

/// The rows of table `name`, 0 when it does not exist.
async fn count_existing(statements: &mut dyn Statements, name: &str) -> Result<u64, DbError> {
    if !statements.exists(name).await? {
        return Ok(0);
    }
    let sql = format!("SELECT count(*) FROM {}", statements.dialect().table(name));
    let rows = statements.query(name, &sql, &[]).await?;
    Ok(row_count(
        first(rows).and_then(|cell| cell.int()).unwrap_or(0),
    ))
}

/// The statements that upsert and delete the state parts of `state`, in dialect `d`.
pub(crate) fn state_calls<'a>(d: &dyn Dialect, state: &'a StateWrite) -> Vec<Call<'a>> {
    let table = d.table(STATE_TABLE);
    let (pipeline, part) = (d.param(1, SqlType::Text), d.param(2, SqlType::Text));
    let upsert = format!(
        "INSERT INTO {table} (pipeline, part, value, updated_at) VALUES ({pipeline}, {part}, {}, {}) \
         ON CONFLICT (pipeline, part) DO UPDATE SET value = excluded.value, \
         updated_at = excluded.updated_at",
        d.param(3, SqlType::Json),
        d.param(4, SqlType::Text)
    );
    let delete = format!("DELETE FROM {table} WHERE pipeline = {pipeline} AND part = {part}");
    let upserts = state.upserts.iter().map(|(part, value)| {
        let params = vec![
            Param::Text(&state.pipeline),
            Param::Text(part),
            Param::Text(value),
            Param::Text(&state.updated_at),
        ];
        (upsert.clone(), params)
    });
    let deletes = state.deletes.iter().map(|part| {
        let params = vec![Param::Text(&state.pipeline), Param::Text(part)];
        (delete.clone(), params)
    });
    upserts.chain(deletes).collect()
}

/// Upserts and deletes the state parts of `state`, in order.
pub(crate) async fn write_state(
    statements: &mut dyn Statements,
    state: &StateWrite,
) -> Result<(), DbError> {
    for (sql, params) in state_calls(statements.dialect(), state) {
        statements.execute(STATE_TABLE, &sql, &params).await?;
    }
    Ok(())
}
