//! The SQLite backend: one database file holding the destination table(s) and
//! `_ddbpipe_state` (docs/state.md §6.5, docs/sinks.md §7.2, §7.4, docs/errors.md §9.4).
//!
//! # Connection
//! One [`rusqlite::Connection`] per handle, shared by its clones behind a mutex; the file is
//! opened in WAL mode with `synchronous=FULL` and a 5 s busy timeout. The async methods run
//! the SQLite work on the calling task, inside [`tokio::task::block_in_place`] on a
//! multi-thread runtime (so the other tasks move to another worker) and directly otherwise.
//!
//! # The SQL shape
//! Identifiers are always double-quoted, embedded `"` doubled. The destination table is
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "orders" (
//!     "pk" TEXT NOT NULL,                 -- S → TEXT, N → TEXT (the exact number text), B → BLOB
//!     "sk" TEXT NOT NULL,
//!     "doc" TEXT NOT NULL,                -- the item JSON (none with document_column: null)
//!     "total" TEXT, "qty" INTEGER,        -- the typed columns, nullable (see "Typed columns")
//!     "_ddbpipe_snapshot" INTEGER,        -- the id of the snapshot that last wrote the row, or null
//!     "_ddbpipe_updated_at" TEXT NOT NULL, -- RFC 3339 UTC with milliseconds
//!     "_ddbpipe_version_ms" INTEGER,      -- the version of the last write (docs/mirror.md §5.6)
//!     "_ddbpipe_version_seq" TEXT,        -- its sequence number: set only by stream changes
//!     PRIMARY KEY ("pk", "sk"))
//! ```
//!
//! (a rowid table: documents can be large, which WITHOUT ROWID tables handle poorly). A table
//! of an earlier ddbpipe, without the two version columns, gets them from `prepare` (`ALTER
//! TABLE … ADD COLUMN`; its rows keep null versions). Each row change is written as
//! `crate::sql::plan` decides:
//!
//! - an upsert is `INSERT … ON CONFLICT ("pk", "sk") DO UPDATE SET "doc" = excluded."doc",
//!   "total" = excluded."total", …` writing the typed columns beside the document, and the
//!   version (a repair's upsert keeps or replaces each of them, the document's way); with a snapshot open it also sets `_ddbpipe_snapshot` to the id,
//!   otherwise the marker is left out of the update (a new row gets null);
//! - a snapshot row with a version is `INSERT … SELECT ?1, … WHERE NOT EXISTS (a newer
//!   deleted-key marker) ON CONFLICT … DO UPDATE SET … WHERE NOT (the row was written by a
//!   stream change of this snapshot after the cutoff)`: one statement, so one step per row as
//!   before;
//! - a delete is `DELETE … WHERE "pk" = ? AND "sk" = ?`; with a snapshot open it is followed by
//!   an upsert into `"_ddbpipe_deleted" (table_name, key_text, version_ms)`, primary key
//!   `(table_name, key_text)`, which `close_snapshot` empties for the table.
//!
//! The statements of a table are built once per handle and prepared through rusqlite's
//! statement cache.
//!
//! The state lives in `"_ddbpipe_state" (pipeline, part, value, updated_at)`, primary key
//! `(pipeline, part)`, `value` being JSON text.
//!
//! # Typed columns
//! Declared types (docs/sinks.md §7.9): `text`, `numeric` (the exact digits), `timestamptz`
//! (`timestamp_text`: RFC 3339 UTC, six fraction digits) and `jsonb` (the JSON) are `TEXT`;
//! `bigint` and `boolean` (0/1) `INTEGER`; `double` `REAL`. Values are bound as such. Since
//! four types share `TEXT` (and two `INTEGER`), a type changed between those cannot be seen
//! in the table: only a change of declared type is refused. At the start of a run the
//! configured columns are compared with the table (`crate::columns::plan`, in the transaction
//! of `prepare`): an added column is `ALTER TABLE … ADD COLUMN "c" <type>` and, over rows,
//! filled from their documents by one `UPDATE` calling the sink's reader (`fill`). A document
//! column added to an empty table is nullable `TEXT` (SQLite adds no `NOT NULL` column
//! without a default).
//!
//! # The transaction rule
//! [`apply`](SqliteDatabase::apply) and the scripts of `crate::database` (closing a snapshot
//! or a repair window, storing the state) run in **one** `BEGIN IMMEDIATE` transaction each:
//! the fences, the rows (with their deleted-key markers), then the state parts, then `COMMIT`.
//! Any error (a bad key, a SQLite error, a refused fence) rolls back the whole transaction, so
//! the rows and the pipeline position are either both written or neither. The transaction
//! holds the file's write lock, so the scripts' reads need no row locks (`session`: the
//! dialect and the primitives they run on).
//!
//! # Errors
//! SQLite `BUSY` and `LOCKED` are retryable (retry the whole transaction); everything else is
//! fatal. Messages name the table and the file: `sqlite table 'orders' in out.db: …`.
//!
//! # The run lock (docs/state.md §6.6)
//! An OS exclusive lock (`flock`-like, [`File::try_lock`]) on `<database path>-ddbpipe-<pipeline>.lock`,
//! holding the holder's process id; the open file stays in the handle until its last clone is
//! dropped.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use self::schema::{
    CREATE_DELETED_SQL, CREATE_STATE_SQL, Found, NAMING, add_column_sql, add_version_columns_sql,
    check_existing, column_type, create_table_sql, inspect, spec_key_text, table_columns,
    validate_spec,
};
use self::session::Connected;
use self::sql::{RowValues, Statements, TableSql, check_key, count, has_rows};
use crate::backend::{Backend, Session, Transaction as _};
use crate::columns::{ColumnPlan, Recorded};
use crate::database::write_state;
use crate::fence;
use crate::sql::{
    DELETED_TABLE, NoSnapshotOpen, STATE_TABLE, columns_misfit, now_rfc3339, plan, quote, row_key,
};
use crate::{
    ColumnCheck, ColumnValue, DbError, LockAttempt, LockHolder, RowChange, StateWrite, TableSpec,
    TypedColumns,
};

mod fill;
mod lock;
mod schema;
mod session;
mod sql;

/// How long a statement waits for another connection's lock before failing with `BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A sqlite destination database (a cheap handle: clones share the connection).
#[derive(Clone)]
pub struct SqliteDatabase {
    shared: Arc<Shared>,
}

/// What the clones of a handle share.
struct Shared {
    /// The path as given (for messages and the lock files).
    path: PathBuf,
    /// The connection and the SQL built for each table; the lock also serialises the calls.
    conn: tokio::sync::Mutex<Conn>,
    /// The run locks held by this handle: pipeline → the locked file.
    locks: Mutex<BTreeMap<String, File>>,
}

/// The connection with its per-table SQL cache.
struct Conn {
    conn: Connection,
    sql: HashMap<String, Arc<TableSql>>,
}

impl std::fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDatabase")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl SqliteDatabase {
    /// Opens (creating when missing) the database file: WAL journal, `synchronous=FULL`, busy
    /// timeout 5 s.
    pub fn open(path: &std::path::Path) -> Result<Self, DbError> {
        let conn = Connection::open(path).map_err(|e| open_error(path, &e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .and_then(|()| write_ahead_log(&conn))
            .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
            .map_err(|e| open_error(path, &e))?;
        Ok(Self::from_connection(path, conn))
    }

    /// Opens an existing database file to read state or probe (`check`, `state show`);
    /// `Ok(None)` when the file does not exist. Creates nothing.
    ///
    /// The journal mode is left as it is (switching to WAL would write to the file).
    pub fn open_existing(path: &std::path::Path) -> Result<Option<Self>, DbError> {
        match path.try_exists() {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                return Err(DbError::fatal(format!(
                    "sqlite database {}: {e}",
                    path.display()
                )));
            }
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, &e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
            // Reading the schema fails early on a file that is not a database.
            .and_then(|()| {
                conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| {
                    row.get::<_, i64>(0)
                })
            })
            .map_err(|e| open_error(path, &e))?;
        Ok(Some(Self::from_connection(path, conn)))
    }

    fn from_connection(path: &Path, conn: Connection) -> Self {
        // Up to eight statements per table, the state's two, and the odd query.
        conn.set_prepared_statement_cache_capacity(64);
        SqliteDatabase {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                conn: tokio::sync::Mutex::new(Conn {
                    conn,
                    sql: HashMap::new(),
                }),
                locks: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!("sqlite {}", self.shared.path.display())
    }

    pub(crate) async fn prepare_state(&self) -> Result<(), DbError> {
        self.with_conn(|c| {
            c.conn
                .execute_batch(CREATE_STATE_SQL)
                .map_err(|e| self.error(STATE_TABLE, &e))
        })
        .await
    }

    pub(crate) async fn prepare(
        &self,
        spec: &TableSpec,
        columns: Option<&TypedColumns>,
    ) -> Result<(), DbError> {
        validate_spec(spec).map_err(|m| self.message(&spec.table, &m))?;
        self.with_conn(|c| {
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| self.error(&spec.table, &e))?;
            self.set_up(&tx, spec, SetUp::Run(columns))?;
            tx.commit().map_err(|e| self.error(&spec.table, &e))
        })
        .await
    }

    pub(crate) async fn check_columns(&self, spec: &TableSpec) -> Result<ColumnCheck, DbError> {
        validate_spec(spec).map_err(|m| self.message(&spec.table, &m))?;
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(&spec.table, &e);
            match inspect(&c.conn, &spec.table).map_err(err)? {
                Found::Table(columns) => {
                    let rows = has_rows(&c.conn, &spec.table).map_err(err)?;
                    let recorded = schema::recorded(&c.conn, &spec.table).map_err(err)?;
                    Ok(plan_of(spec, &columns, &recorded, rows).check(spec))
                }
                Found::Missing | Found::Other(_) => Ok(ColumnCheck::default()),
            }
        })
        .await
    }

    pub(crate) async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        let mut writes = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            check_key(spec, index, row_key(row)).map_err(|m| self.message(&spec.table, &m))?;
            if let Some(misfit) = columns_misfit(spec, index, row) {
                return Err(self.message(&spec.table, &misfit));
            }
            writes.push(plan(row, snapshot_id).map_err(|NoSnapshotOpen| {
                self.message(
                    &spec.table,
                    &format!("change {index} is a snapshot row but no snapshot is open"),
                )
            })?);
        }
        // Rows carry the time of the state they commit with, so a reader can match them.
        let updated_at = if state.updated_at.is_empty() {
            now_rfc3339()
        } else {
            state.updated_at.clone()
        };
        let mut conn = self.shared.conn.lock().await;
        let sql = conn.table_sql(spec);
        let mut tx = Connected::begin(&mut conn, self, &spec.table)?;
        fence::pass(&mut tx, state).await?;
        blocking(|| {
            let mut statements = Statements::new(&tx.conn.conn, &sql);
            rows.iter().zip(&writes).try_for_each(|(row, write)| {
                let values = match row {
                    RowChange::Upsert {
                        document, columns, ..
                    } => RowValues { document, columns },
                    RowChange::Delete { .. } => RowValues {
                        document: "",
                        columns: &[],
                    },
                };
                statements.write(spec, row_key(row), &values, &updated_at, write)
            })
        })
        .map_err(|e| self.error(&spec.table, &e))?;
        write_state(&mut tx, state).await?;
        tx.commit(&spec.table).await
    }

    pub(crate) async fn probe(&self, spec: &TableSpec) -> Result<String, DbError> {
        validate_spec(spec).map_err(|m| self.message(&spec.table, &m))?;
        let shown = self.shared.path.display().to_string();
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(&spec.table, &e);
            // An immediate transaction takes the write lock: the file is writable. Everything
            // below is rolled back when `tx` is dropped.
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            // What `prepare` does, rolled back: the file is writable and the table usable.
            let detail = if self.set_up(&tx, spec, SetUp::Probe)? {
                format!(
                    "{shown}: table '{}' will be created, key {}",
                    spec.table,
                    spec_key_text(spec)
                )
            } else {
                let rows = count(&tx, &spec.table).map_err(err)?;
                let mut detail = format!(
                    "{shown}: table '{}' exists, {rows} row(s), key {}",
                    spec.table,
                    spec_key_text(spec)
                );
                // What the run changes in its columns (the probe changed nothing).
                if let Found::Table(columns) = inspect(&tx, &spec.table).map_err(err)? {
                    let recorded = schema::recorded(&tx, &spec.table).map_err(err)?;
                    let plan = plan_of(spec, &columns, &recorded, rows > 0);
                    for note in plan.check(spec).notes {
                        detail.push_str("; ");
                        detail.push_str(&note);
                    }
                }
                detail
            };
            tx.rollback().map_err(err)?;
            Ok(detail)
        })
        .await
    }

    /// Runs `f` with the connection, off the async worker when on a multi-thread runtime.
    async fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let mut conn = self.shared.conn.lock().await;
        blocking(|| f(&mut conn))
    }

    /// In `tx`: creates the destination table when missing and allowed (`true`), or checks an
    /// existing one, adds the version columns a table of an earlier ddbpipe lacks and carries
    /// out the plan of its document and typed columns (`mode`); then creates `_ddbpipe_state`
    /// and `_ddbpipe_deleted` when missing.
    fn set_up(
        &self,
        tx: &rusqlite::Transaction<'_>,
        spec: &TableSpec,
        mode: SetUp<'_>,
    ) -> Result<bool, DbError> {
        let err = |e: rusqlite::Error| self.error(&spec.table, &e);
        let found = inspect(tx, &spec.table).map_err(err)?;
        let created = matches!(found, Found::Missing) && spec.create_table;
        if created {
            tx.execute_batch(&create_table_sql(spec)).map_err(err)?;
            if !spec.columns.is_empty() {
                schema::record(tx, spec).map_err(err)?;
            }
        } else {
            self.check_found(spec, &found)?;
        }
        if let Found::Table(columns) = &found {
            for alter in add_version_columns_sql(spec, columns) {
                tx.execute_batch(&alter).map_err(err)?;
            }
            let rows = has_rows(tx, &spec.table).map_err(err)?;
            let recorded = schema::recorded(tx, &spec.table).map_err(err)?;
            let plan = plan_of(spec, columns, &recorded, rows);
            if let Some(refused) = plan.refused() {
                return Err(self.message(&spec.table, &refused));
            }
            if let SetUp::Run(reader) = mode {
                self.alter(tx, spec, &plan, reader)?;
            }
        }
        tx.execute_batch(CREATE_STATE_SQL)
            .map_err(|e| self.error(STATE_TABLE, &e))?;
        tx.execute_batch(CREATE_DELETED_SQL)
            .map_err(|e| self.error(DELETED_TABLE, &e))?;
        Ok(created)
    }

    /// Makes the changes of `plan` in `tx`: adds the document column and the typed columns,
    /// fills the added and refilled ones over rows by `reader`, and records what the typed
    /// columns hold (see the module docs, "Typed columns").
    fn alter(
        &self,
        tx: &rusqlite::Transaction<'_>,
        spec: &TableSpec,
        plan: &ColumnPlan<'_>,
        reader: Option<&TypedColumns>,
    ) -> Result<(), DbError> {
        let err = |e: rusqlite::Error| self.error(&spec.table, &e);
        plan.warn_unused(&spec.table);
        if plan.add_document
            && let Some(document) = &spec.document_column
        {
            tx.execute_batch(&add_column_sql(spec, document, "TEXT"))
                .map_err(err)?;
        }
        for column in &plan.added {
            tx.execute_batch(&add_column_sql(
                spec,
                &column.name,
                column_type(column.kind),
            ))
            .map_err(err)?;
        }
        if let Some(document) = spec.document_column.as_deref().filter(|_| plan.fill) {
            let Some(reader) = reader else {
                return Err(self.message(
                    &spec.table,
                    "typed columns are to be filled for the table's rows, which needs the \
                     reader of their documents (Database::prepare_with)",
                ));
            };
            for column in plan.filled() {
                let filled = fill::fill(tx, spec, document, column, reader);
                filled.map_err(|e| {
                    DbError::retryable_if(
                        is_retryable(&e),
                        format!(
                            "sqlite table '{}' in {}: column {} could not be filled for the \
                             table's rows from their documents (nothing was changed): {e}",
                            spec.table,
                            self.shared.path.display(),
                            quote(&column.name)
                        ),
                    )
                })?;
            }
        }
        if plan.record {
            schema::record(tx, spec).map_err(err)?;
        }
        Ok(())
    }

    /// Checks an existing table (or its absence, `create_table` being false) against `spec`.
    fn check_found(&self, spec: &TableSpec, found: &Found) -> Result<(), DbError> {
        let shown = self.shared.path.display();
        let table = &spec.table;
        let columns = match found {
            Found::Missing => {
                return Err(DbError::fatal(format!(
                    "sqlite table '{table}' does not exist in {shown}; create it or set sink.create_table: true"
                )));
            }
            Found::Other(kind) => {
                return Err(DbError::fatal(format!(
                    "sqlite table '{table}' in {shown}: there is a {kind} of that name, not a table; choose another sink.table"
                )));
            }
            Found::Table(columns) => columns,
        };
        check_existing(spec, columns).map_err(|m| {
            DbError::fatal(format!(
                "sqlite table '{table}' in {shown} {m}: choose another sink.table or drop the table"
            ))
        })
    }

    /// A SQLite error on `table`, classified (busy/locked are retryable).
    fn error(&self, table: &str, e: &rusqlite::Error) -> DbError {
        DbError::retryable_if(
            is_retryable(e),
            format!(
                "sqlite table '{table}' in {}: {e}",
                self.shared.path.display()
            ),
        )
    }

    /// A fatal error on `table`.
    fn message(&self, table: &str, message: &str) -> DbError {
        DbError::fatal(format!(
            "sqlite table '{table}' in {}: {message}",
            self.shared.path.display()
        ))
    }
}

impl From<SqliteDatabase> for crate::Database {
    fn from(db: SqliteDatabase) -> Self {
        crate::Database::of(Arc::new(db))
    }
}

impl Backend for SqliteDatabase {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn same_name(&self, a: &str, b: &str) -> bool {
        (NAMING.same)(a, b)
    }

    fn check_names(&self, _: &TableSpec) -> Result<(), DbError> {
        // Any name `prepare` accepted.
        Ok(())
    }

    fn stores(&self, _: &ColumnValue) -> bool {
        // TEXT holds any string, U+0000 included.
        true
    }

    fn session<'a>(
        &'a self,
        _: Option<&'a TableSpec>,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Session + 'a>, DbError>> {
        Box::pin(async move {
            let session = Connected {
                conn: self.shared.conn.lock().await,
                db: self,
                open: false,
            };
            Ok(Box::new(session) as Box<dyn Session + 'a>)
        })
    }

    crate::backend::own_methods!();
}

impl Conn {
    /// The statements of `spec`'s table, built on first use.
    fn table_sql(&mut self, spec: &TableSpec) -> Arc<TableSql> {
        if let Some(sql) = self.sql.get(&spec.table)
            && sql.spec == *spec
        {
            return Arc::clone(sql);
        }
        let sql = Arc::new(TableSql::new(spec));
        self.sql.insert(spec.table.clone(), Arc::clone(&sql));
        sql
    }
}

/// What `set_up` does with the document and typed columns of an existing table.
#[derive(Clone, Copy)]
enum SetUp<'c> {
    /// `prepare`: refuses what the plan refuses, makes its additions and fills them with the
    /// reader (`None`: a fill is refused).
    Run(Option<&'c TypedColumns>),
    /// `check`'s probe (rolled back): refuses what the plan refuses, changes nothing.
    Probe,
}

/// The plan of `spec`'s document and typed columns over an existing table (`crate::columns`).
fn plan_of<'s>(
    spec: &'s TableSpec,
    columns: &[schema::ColumnInfo],
    recorded: &[Recorded],
    has_rows: bool,
) -> ColumnPlan<'s> {
    crate::columns::plan(spec, &table_columns(columns), recorded, has_rows, NAMING)
}

/// SQLite busy/locked: another connection holds the lock; the transaction can be retried.
fn is_retryable(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Switches `conn` to the WAL journal, waiting up to [`BUSY_TIMEOUT`] while another
/// connection holds the file: SQLite answers a journal-mode change that meets another
/// connection's lock with "database is locked" at once, without its busy handler, as when the
/// runs of several tables of one pipeline open one new file together.
fn write_ahead_log(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let switched = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0));
        match switched {
            Err(e) if is_retryable(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map(|_| ()),
        }
    }
}

fn open_error(path: &Path, e: &rusqlite::Error) -> DbError {
    DbError::retryable_if(
        is_retryable(e),
        format!("sqlite database {}: {e}", path.display()),
    )
}
/// Locks a mutex, ignoring poisoning: a panic mid-transaction drops (rolls back) the
/// transaction, leaving the connection usable.
fn lock_mutex<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs blocking SQLite or file work: in [`tokio::task::block_in_place`] on a multi-thread
/// runtime, directly otherwise (no runtime, or a current-thread one, where `block_in_place`
/// is not allowed).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
