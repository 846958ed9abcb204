//! Lease fences and the shared snapshot record in `_ddbpipe_fences` (docs/coordination.md
//! §11.7 rule 4, §11.12), written once for every backend.
//!
//! # The table
//! `_ddbpipe_fences (pipeline, unit, counter, position)`, primary key `(pipeline, unit)`:
//! per leased unit the newest lease counter that wrote and the unit's position; under the
//! unit [`SNAPSHOT_UNIT`] a mirror shared by several workers keeps its snapshot record
//! (counter 0 while open, 1 once closed; the position holds the record's JSON).
//!
//! # Passing a transaction's fences ([`pass`])
//! 1. With a [`SnapshotGuard`], the record is read (share-locked for a batch, so batches of
//!    several workers do not wait on each other, only on the close; locked alone for the
//!    close), under the pipeline's own name when the fences are a generation's: a batch of
//!    snapshot rows passes only while the record is open and of its snapshot, a batch of
//!    changes only while the record is its generation's snapshot (open or closed); a close
//!    only while it is open, and it writes the closed record in the same transaction.
//! 2. Each fence advances its unit's counter (and position, when given) unless a newer
//!    owner's counter is stored: no row changed means refused, and the stored counter is read
//!    for the message.
//! 3. The first refusal fails the transaction with a fenced [`DbError`]; the caller's
//!    transaction is rolled back, so nothing of it is written.

use crate::backend::{Param, RowLock, SqlType, Statements, Transaction};
use crate::{DbError, FENCE_TABLE, SNAPSHOT_UNIT, SnapshotGuard, StateWrite};
use ddbpipe_pipeline::sink::SharedSnapshot;

/// The statements of the fence table in `statements`' dialect.
struct FenceSql {
    advance: String,
    stored: String,
    close_record: String,
}

impl FenceSql {
    fn new(statements: &dyn Statements) -> Self {
        let d = statements.dialect();
        let fences = d.table(FENCE_TABLE);
        let (pipeline, unit) = (d.param(1, SqlType::Text), d.param(2, SqlType::Text));
        FenceSql {
            advance: format!(
                "INSERT INTO {fences} (pipeline, unit, counter, position) \
                 VALUES ({pipeline}, {unit}, {}, {}) \
                 ON CONFLICT (pipeline, unit) DO UPDATE SET counter = excluded.counter, \
                 position = COALESCE(excluded.position, {fences}.position) \
                 WHERE {fences}.counter <= excluded.counter",
                d.param(3, SqlType::Int),
                d.param(4, SqlType::Text)
            ),
            stored: format!(
                "SELECT counter FROM {fences} WHERE pipeline = {pipeline} AND unit = {unit}"
            ),
            close_record: format!(
                "UPDATE {fences} SET counter = 1, position = {} \
                 WHERE pipeline = {pipeline} AND unit = {unit}",
                d.param(3, SqlType::Text)
            ),
        }
    }
}

/// `SELECT position` of one unit's fence: parameters the pipeline and the unit.
pub(crate) fn position_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "SELECT position FROM {} WHERE pipeline = {} AND unit = {}",
        d.table(FENCE_TABLE),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text)
    )
}

/// Passes the snapshot guard and the fences of `state` in the open transaction `tx` (see the
/// module docs); a refusal is a fenced [`DbError`], and the caller drops (rolls back) `tx`.
pub(crate) async fn pass(tx: &mut dyn Transaction, state: &StateWrite) -> Result<(), DbError> {
    let pipeline = state.pipeline.as_str();
    let sql = FenceSql::new(tx);
    if let Some(guard) = &state.snapshot {
        let lock = match guard {
            SnapshotGuard::Open(_) | SnapshotGuard::Of(_) => RowLock::Share,
            SnapshotGuard::Close { .. } => RowLock::Update,
        };
        let record_of = state.record_of.as_deref().unwrap_or(pipeline);
        let stored = record(tx, record_of, lock).await?;
        if let Some(why) = guard.refusal(
            stored
                .as_ref()
                .map(|(counter, text)| (*counter, text.as_deref())),
        ) {
            return Err(DbError::snapshot_refused(&tx.place(), pipeline, &why));
        }
        if let SnapshotGuard::Close { record, .. } = guard {
            let params = [
                Param::Text(record_of),
                Param::Text(SNAPSHOT_UNIT),
                Param::Text(record),
            ];
            tx.execute(FENCE_TABLE, &sql.close_record, &params).await?;
        }
    }
    for write in &state.fences {
        let unit = write.unit.as_str();
        let counter = i64::try_from(write.counter).unwrap_or(i64::MAX);
        let params = [
            Param::Text(pipeline),
            Param::Text(unit),
            Param::Int(counter),
            Param::MaybeText(write.position.as_deref()),
        ];
        if tx.execute(FENCE_TABLE, &sql.advance, &params).await? == 0 {
            let params = [Param::Text(pipeline), Param::Text(unit)];
            let rows = tx.query(FENCE_TABLE, &sql.stored, &params).await?;
            let stored = first(rows).and_then(|cell| cell.int()).unwrap_or_default();
            return Err(DbError::fenced(
                &tx.place(),
                pipeline,
                unit,
                write.counter,
                stored,
            ));
        }
    }
    Ok(())
}

/// The pipeline's shared snapshot record, read with `lock`: its counter and JSON, `None` when
/// none is stored.
pub(crate) async fn record(
    statements: &mut dyn Statements,
    pipeline: &str,
    lock: RowLock,
) -> Result<Option<(i64, Option<String>)>, DbError> {
    let d = statements.dialect();
    let sql = format!(
        "SELECT counter, position FROM {} WHERE pipeline = {} AND unit = {}{}",
        d.table(FENCE_TABLE),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text),
        d.lock(lock)
    );
    let params = [Param::Text(pipeline), Param::Text(SNAPSHOT_UNIT)];
    let rows = statements.query(FENCE_TABLE, &sql, &params).await?;
    Ok(rows.into_iter().next().map(|row| {
        let mut cells = row.into_iter();
        let counter = cells.next().and_then(|cell| cell.int()).unwrap_or_default();
        (counter, cells.next().and_then(|cell| cell.into_text()))
    }))
}

/// Stores an open shared snapshot record `text` unless one is stored.
pub(crate) fn open_record_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "INSERT INTO {} (pipeline, unit, counter, position) VALUES ({}, {}, 0, {}) \
         ON CONFLICT (pipeline, unit) DO NOTHING",
        d.table(FENCE_TABLE),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text),
        d.param(3, SqlType::Text)
    )
}

/// Rewrites the shared snapshot record, its counter unchanged: parameters the pipeline, the
/// unit and the record's JSON.
pub(crate) fn rewrite_record_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "UPDATE {} SET position = {} WHERE pipeline = {} AND unit = {}",
        d.table(FENCE_TABLE),
        d.param(3, SqlType::Text),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text)
    )
}

/// Replaces the shared snapshot record by an open one: parameters the pipeline, the unit and
/// the record's JSON.
pub(crate) fn reopen_record_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "UPDATE {} SET counter = 0, position = {} WHERE pipeline = {} AND unit = {}",
        d.table(FENCE_TABLE),
        d.param(3, SqlType::Text),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text)
    )
}

/// Runs `sql`, one of the record's statements (parameters the pipeline, the record's unit
/// and its JSON), for `pipeline`'s record `text`.
pub(crate) async fn write_record(
    tx: &mut dyn Transaction,
    sql: &str,
    pipeline: &str,
    text: &str,
) -> Result<u64, DbError> {
    let params = [
        Param::Text(pipeline),
        Param::Text(SNAPSHOT_UNIT),
        Param::Text(text),
    ];
    tx.execute(FENCE_TABLE, sql, &params).await
}

/// Deletes the unit fences kept under a name: parameters the name and the record's unit,
/// which is kept.
pub(crate) fn drop_unit_fences_sql(statements: &dyn Statements) -> String {
    let d = statements.dialect();
    format!(
        "DELETE FROM {} WHERE pipeline = {} AND unit <> {}",
        d.table(FENCE_TABLE),
        d.param(1, SqlType::Text),
        d.param(2, SqlType::Text)
    )
}

/// The first value of the first row.
pub(crate) fn first(rows: Vec<crate::backend::Row>) -> Option<crate::backend::Cell> {
    rows.into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
}

impl SnapshotGuard {
    /// Why the stored record (its counter and JSON, `None` when there is none) refuses this
    /// transaction; `None` when it lets it pass.
    pub(crate) fn refusal(&self, stored: Option<(i64, Option<&str>)>) -> Option<String> {
        let id = self.id();
        let found = match stored {
            None => return Some(format!("its snapshot record (snapshot {id}) is gone")),
            Some((counter, text)) => (counter, text.and_then(stored_snapshot_id)),
        };
        match (self, found) {
            (SnapshotGuard::Of(_), (_, Some(stored))) if stored == id => None,
            (_, (0, Some(stored))) if stored == id => None,
            (_, (_, Some(stored))) if stored != id => Some(format!(
                "the destination's snapshot record is of another snapshot ({stored}, not {id})"
            )),
            (_, (_, None)) => Some(format!("snapshot {id}'s record cannot be read")),
            _ => Some(format!(
                "snapshot {id} is closed: its complete-read cleanup has run"
            )),
        }
    }
}

/// The text of a new open shared snapshot record.
pub(crate) fn open_record(id: i64, rows_at_start: u64) -> String {
    let record = SharedSnapshot {
        id,
        rows_at_start,
        closed: None,
        export: None,
        generation: 0,
        replaced: None,
        repair: None,
        earlier: Vec::new(),
    };
    // Two integers: serializing cannot fail.
    serde_json::to_string(&record).unwrap_or_default()
}

/// A stored shared snapshot record, or why it cannot be read.
pub(crate) fn shared_record(text: Option<&str>) -> Result<SharedSnapshot, String> {
    let text = text.ok_or("the shared snapshot record has no content")?;
    serde_json::from_str(text).map_err(|error| {
        format!(
            "the shared snapshot record cannot be read ({error}); run `ddbpipe state reset` \
             once no worker runs"
        )
    })
}

/// The id in a stored shared snapshot record.
fn stored_snapshot_id(text: &str) -> Option<i64> {
    serde_json::from_str::<SharedSnapshot>(text)
        .ok()
        .map(|record| record.id)
}
