//! The sqlite backend.

use std::collections::BTreeMap;

use crate::{CloseSnapshot, Closed, DbError, LockHolder, RowChange, StateWrite, TableSpec};

/// A sqlite destination database (a cheap handle: clones share the connection).
#[derive(Debug, Clone)]
pub struct SqliteDatabase {}

impl SqliteDatabase {
    /// Opens (creating when missing) the database file: WAL journal, `synchronous=FULL`, busy
    /// timeout 5 s.
    pub fn open(path: &std::path::Path) -> Result<Self, DbError> {
        let _ = path;
        Err(DbError::fatal("not built yet"))
    }

    /// Opens an existing database file to read state or probe (`check`, `state show`);
    /// `Ok(None)` when the file does not exist. Creates nothing.
    pub fn open_existing(path: &std::path::Path) -> Result<Option<Self>, DbError> {
        let _ = path;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) fn describe(&self) -> String {
        String::new()
    }

    pub(crate) async fn prepare_state(&self) -> Result<(), DbError> {
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn prepare(&self, spec: &TableSpec) -> Result<(), DbError> {
        let _ = spec;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        let _ = (spec, rows, snapshot_id, state);
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn store_state(&self, state: &StateWrite) -> Result<(), DbError> {
        let _ = state;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn load_state(
        &self,
        pipeline: &str,
    ) -> Result<BTreeMap<String, String>, DbError> {
        let _ = pipeline;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn reset_state(&self, pipeline: &str) -> Result<bool, DbError> {
        let _ = pipeline;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn count_rows(&self, spec: &TableSpec) -> Result<u64, DbError> {
        let _ = spec;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn close_snapshot(
        &self,
        spec: &TableSpec,
        close: CloseSnapshot,
        state: &StateWrite,
    ) -> Result<Closed, DbError> {
        let _ = (spec, close, state);
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn lock(&self, pipeline: &str) -> Result<(), Result<LockHolder, DbError>> {
        let _ = pipeline;
        Err(Err(DbError::fatal("not built yet")))
    }

    pub(crate) async fn lock_holder(&self, pipeline: &str) -> Result<Option<LockHolder>, DbError> {
        let _ = pipeline;
        Err(DbError::fatal("not built yet"))
    }

    pub(crate) async fn probe(&self, spec: &TableSpec) -> Result<String, DbError> {
        let _ = spec;
        Err(DbError::fatal("not built yet"))
    }
}
