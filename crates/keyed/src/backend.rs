//! What a keyed backend supplies to the transaction scripts written once in `database`: its
//! SQL dialect and its connection primitives.
//!
//! # The split
//! A script (close a snapshot with its ceiling, close a repair window, open the shared
//! snapshot record, pass the lease fences, load, store and reset the state) is one sequence
//! of statements in one transaction, the same on every backend. What differs is small and
//! lives behind these traits:
//!
//! - [`Dialect`]: how a table is named (SQLite: `"t"`; PostgreSQL: `"schema"."t"`), how a
//!   parameter is written (`?1`; `$1::bigint`), how a read locks its row (nothing: SQLite's
//!   transaction holds the file's write lock; `FOR SHARE` / `FOR UPDATE`), how JSON is read
//!   as text, and whether a state write creates the state tables (SQLite only).
//! - [`Session`] and [`Transaction`]: a connection taken for one script, a transaction in it
//!   (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: `BEGIN`), and statements run in either
//!   ([`Statements`]). Dropping an uncommitted transaction rolls it back.
//! - [`Backend`]: the handle; it opens sessions and keeps what only one backend has: SQLite's
//!   run-lock file, its one connection and its blocking calls; PostgreSQL's COPY bulk load,
//!   TLS, connection strings, reconnects and advisory locks; each one's row statements in
//!   `apply`, its table creation and its `check` probe.
//!
//! # Errors
//! A primitive fails with a [`DbError`] already worded and classified by its backend. `on`
//! names the table a statement is about: SQLite's messages name it (`sqlite table
//! '_ddbpipe_fences' in out.db: …`); PostgreSQL's name the table of the whole script, given
//! when the session was taken (`postgres table 'public.orders': …`).
//!
//! The async methods return [`BoxFuture`]s, as the pipeline's `CheckpointStore` does, so that
//! a [`Database`](crate::Database) holds either backend as one trait object.

use futures_util::future::BoxFuture;

use crate::{
    ColumnCheck, ColumnValue, DbError, LockAttempt, LockHolder, RowChange, StateWrite, TableSpec,
    TypedColumns,
};

/// The type of a parameter, for the dialects that write it in the SQL text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlType {
    /// A 64-bit integer.
    Int,
    /// Text.
    Text,
    /// JSON, bound as its text.
    Json,
}

/// How a read locks the row it reads, until the transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowLock {
    /// No lock.
    None,
    /// Others may read and share-lock it too, nobody may change it.
    Share,
    /// Nobody else may lock or change it.
    Update,
}

/// A parameter's value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    /// An integer.
    Int(i64),
    /// Text (or JSON text).
    Text(&'a str),
    /// Text or null.
    MaybeText(Option<&'a str>),
}

/// One value of a result row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    /// Null.
    Null,
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
}

impl Cell {
    /// The integer, if this is one.
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(value) => Some(*value),
            _ => None,
        }
    }

    /// The text, if this is some.
    pub(crate) fn into_text(self) -> Option<String> {
        match self {
            Cell::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// A result row.
pub(crate) type Row = Vec<Cell>;

/// A statement and its parameters, one of several sent at once.
pub(crate) type Call<'a> = (String, Vec<Param<'a>>);

/// The SQL text a backend writes its own way.
pub(crate) trait Dialect: Send + Sync {
    /// The name of ddbpipe's or the destination's table `name`, quoted (and qualified).
    fn table(&self, name: &str) -> String;

    /// Parameter `n` (from 1) of type `ty`.
    fn param(&self, n: usize, ty: SqlType) -> String;

    /// What ends a `SELECT` that takes `lock` on its row (with its leading space), or "".
    fn lock(&self, lock: RowLock) -> &'static str;

    /// `column` (of JSON) read as text.
    fn json_text(&self, column: &str) -> String;

    /// The statements a state write runs first to create the state tables when missing
    /// (`None`: the backend's `prepare_state` creates them, never a state write).
    fn create_state(&self) -> Option<&'static str>;
}

/// Statements run in a session or a transaction.
pub(crate) trait Statements: Send {
    /// The SQL dialect.
    fn dialect(&self) -> &dyn Dialect;

    /// Where this runs, for messages: "sqlite out.db", "postgres table 'public.orders'".
    fn place(&self) -> String;

    /// A definite error about table `on`, worded as the backend words its messages.
    fn fail(&self, on: &str, message: &str) -> DbError;

    /// Whether the table `name` exists (in the session's schema).
    fn exists<'a>(&'a mut self, name: &'a str) -> BoxFuture<'a, Result<bool, DbError>>;

    /// Runs one statement about table `on`; the rows it changed.
    fn execute<'a>(
        &'a mut self,
        on: &'a str,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<u64, DbError>>;

    /// Runs one query about table `on`; its rows.
    fn query<'a>(
        &'a mut self,
        on: &'a str,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Row>, DbError>>;

    /// Runs statements without parameters (DDL), separated by `;`.
    fn batch<'a>(&'a mut self, on: &'a str, sql: &'a str) -> BoxFuture<'a, Result<(), DbError>>;
}

/// A connection taken for one script: its statements commit one by one.
pub(crate) trait Session: Statements {
    /// Begins a transaction (`on`: the table for messages).
    fn begin<'a>(
        &'a mut self,
        on: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Transaction + 'a>, DbError>>;
}

/// A transaction: its statements take effect together at [`commit`](Self::commit), or none
/// at [`rollback`](Self::rollback). Dropped open, it rolls back too (SQLite at once,
/// PostgreSQL when its connection next runs: a script rolls back explicitly).
pub(crate) trait Transaction: Statements {
    /// Commits (`on`: the table for messages).
    fn commit<'a>(&'a mut self, on: &'a str) -> BoxFuture<'a, Result<(), DbError>>;

    /// Rolls back, and waits for it (an error is not reported: the transaction's own error
    /// is, and a connection that failed rolls back on the server).
    fn rollback(&mut self) -> BoxFuture<'_, ()>;
}

/// A keyed destination database: its sessions and what only it does.
pub(crate) trait Backend: std::fmt::Debug + Send + Sync {
    /// "sqlite out/orders.db" or "postgres db.example.com:5432/app" (never a password).
    fn describe(&self) -> String;

    /// "sqlite" or "postgres".
    fn kind(&self) -> &'static str;

    /// Refuses names the backend cannot hold, before a script on `spec`'s table.
    fn check_names(&self, spec: &TableSpec) -> Result<(), DbError>;

    /// Whether two names are one table or column (`columns` rule 6: SQLite ignores ASCII
    /// case, PostgreSQL's quoted names compare exactly).
    fn same_name(&self, a: &str, b: &str) -> bool;

    /// Whether the backend stores a typed column's value (`columns` rule 2: PostgreSQL holds no
    /// U+0000 in `text` and `jsonb`).
    fn stores(&self, value: &ColumnValue) -> bool;

    /// A session for one script: in `spec`'s schema (none: the state's), its messages about
    /// the table `about`.
    fn session<'a>(
        &'a self,
        spec: Option<&'a TableSpec>,
        about: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Session + 'a>, DbError>>;

    /// See [`Database::prepare_state`](crate::Database::prepare_state).
    fn prepare_state(&self) -> BoxFuture<'_, Result<(), DbError>>;

    /// See [`Database::prepare_with`](crate::Database::prepare_with) (`columns`: how added
    /// typed columns are filled; `None` refuses to fill any).
    fn prepare<'a>(
        &'a self,
        spec: &'a TableSpec,
        columns: Option<&'a TypedColumns>,
    ) -> BoxFuture<'a, Result<(), DbError>>;

    /// See [`Database::check_columns`](crate::Database::check_columns).
    fn check_columns<'a>(
        &'a self,
        spec: &'a TableSpec,
    ) -> BoxFuture<'a, Result<ColumnCheck, DbError>>;

    /// See [`Database::apply`](crate::Database::apply): the rows are the backend's own
    /// statements; the fences and the state are `fence::pass` and `database::write_state`.
    fn apply<'a>(
        &'a self,
        spec: &'a TableSpec,
        rows: &'a [RowChange],
        snapshot_id: Option<i64>,
        state: &'a StateWrite,
    ) -> BoxFuture<'a, Result<(), DbError>>;

    /// See [`Database::lock`](crate::Database::lock).
    fn lock<'a>(&'a self, pipeline: &'a str) -> BoxFuture<'a, Result<LockAttempt, DbError>>;

    /// See [`Database::lock_holder`](crate::Database::lock_holder).
    fn lock_holder<'a>(
        &'a self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockHolder>, DbError>>;

    /// See [`Database::probe`](crate::Database::probe).
    fn probe<'a>(&'a self, spec: &'a TableSpec) -> BoxFuture<'a, Result<String, DbError>>;
}

/// The [`Backend`] methods a backend implements with its own inherent methods of the same
/// names (`describe`, `prepare_state`, `prepare`, `check_columns`, `apply`, `lock`,
/// `lock_holder`, `probe`).
macro_rules! own_methods {
    () => {
        fn describe(&self) -> String {
            Self::describe(self)
        }

        fn prepare_state(&self) -> BoxFuture<'_, Result<(), DbError>> {
            Box::pin(Self::prepare_state(self))
        }

        fn prepare<'a>(
            &'a self,
            spec: &'a TableSpec,
            columns: Option<&'a TypedColumns>,
        ) -> BoxFuture<'a, Result<(), DbError>> {
            Box::pin(Self::prepare(self, spec, columns))
        }

        fn check_columns<'a>(
            &'a self,
            spec: &'a TableSpec,
        ) -> BoxFuture<'a, Result<ColumnCheck, DbError>> {
            Box::pin(Self::check_columns(self, spec))
        }

        fn apply<'a>(
            &'a self,
            spec: &'a TableSpec,
            rows: &'a [RowChange],
            snapshot_id: Option<i64>,
            state: &'a StateWrite,
        ) -> BoxFuture<'a, Result<(), DbError>> {
            Box::pin(Self::apply(self, spec, rows, snapshot_id, state))
        }

        fn lock<'a>(&'a self, pipeline: &'a str) -> BoxFuture<'a, Result<LockAttempt, DbError>> {
            Box::pin(Self::lock(self, pipeline))
        }

        fn lock_holder<'a>(
            &'a self,
            pipeline: &'a str,
        ) -> BoxFuture<'a, Result<Option<LockHolder>, DbError>> {
            Box::pin(Self::lock_holder(self, pipeline))
        }

        fn probe<'a>(&'a self, spec: &'a TableSpec) -> BoxFuture<'a, Result<String, DbError>> {
            Box::pin(Self::probe(self, spec))
        }
    };
}
pub(crate) use own_methods;
