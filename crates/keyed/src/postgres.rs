//! The postgres backend.

use std::collections::BTreeMap;

use crate::{CloseSnapshot, Closed, DbError, LockHolder, RowChange, StateWrite, TableSpec};

/// A postgres destination database (a cheap handle: clones share the connection).
#[derive(Debug, Clone)]
pub struct PostgresDatabase {}

impl PostgresDatabase {
    /// Connects with a libpq-style URL or key=value string, honouring `sslmode` (`disable`,
    /// `prefer`, `require`). Errors never show the password.
    pub async fn connect(url: &str) -> Result<Self, DbError> {
        let _ = url;
        Err(DbError::fatal("not built yet"))
    }

    /// The URL with its password replaced by `***`.
    pub fn redact(url: &str) -> String {
        url.to_string()
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
