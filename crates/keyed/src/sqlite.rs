//! The SQLite backend: one database file holding the destination table(s) and
//! `_ddbpipe_state` (SPEC §6.5, §7.2, §7.4, §9.4).
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
//!     "doc" TEXT NOT NULL,                -- the item JSON
//!     "_ddbpipe_snapshot" INTEGER,        -- the id of the snapshot that last wrote the row, or null
//!     "_ddbpipe_updated_at" TEXT NOT NULL, -- RFC 3339 UTC with milliseconds
//!     PRIMARY KEY ("pk", "sk"))
//! ```
//!
//! (a rowid table: documents can be large, which WITHOUT ROWID tables handle poorly). A
//! snapshot upsert is `INSERT … ON CONFLICT ("pk", "sk") DO UPDATE SET "doc" = excluded."doc",
//! "_ddbpipe_snapshot" = excluded."_ddbpipe_snapshot", "_ddbpipe_updated_at" = …` with the
//! snapshot id as the marker; a change upsert is the same without the marker in the update
//! (a new row gets null); a delete is `DELETE … WHERE "pk" = ? AND "sk" = ?`. The statements
//! of a table are built once per handle and prepared through rusqlite's statement cache.
//!
//! The state lives in `"_ddbpipe_state" (pipeline, part, value, updated_at)`, primary key
//! `(pipeline, part)`, `value` being JSON text.
//!
//! # The transaction rule
//! [`apply`](SqliteDatabase::apply) and [`close_snapshot`](SqliteDatabase::close_snapshot) run
//! in **one** `BEGIN IMMEDIATE` transaction each: the rows, then the state parts, then
//! `COMMIT`. Any error (a bad key, a SQLite error) rolls back the whole transaction, so the
//! rows and the pipeline position are either both written or neither.
//!
//! # Errors
//! SQLite `BUSY` and `LOCKED` are retryable (retry the whole transaction); everything else is
//! fatal. Messages name the table and the file: `sqlite table 'orders' in out.db: …`.
//!
//! # The run lock (SPEC §6.6)
//! An OS exclusive lock (`flock`-like, [`File::try_lock`]) on `<database path>-ddbpipe-<pipeline>.lock`,
//! holding the holder's process id; the open file stays in the handle until its last clone is
//! dropped.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Statement, TransactionBehavior,
};

use crate::{
    CloseSnapshot, Closed, DbError, KeyColumn, KeyType, KeyValue, LockHolder, RowChange,
    StateWrite, TableSpec,
};

/// The state table's name.
const STATE_TABLE: &str = "_ddbpipe_state";
/// The snapshot marker column.
const SNAPSHOT_COLUMN: &str = "_ddbpipe_snapshot";
/// The last-write time column.
const UPDATED_AT_COLUMN: &str = "_ddbpipe_updated_at";
/// The prefix reserved for ddbpipe's own columns and tables.
const RESERVED_PREFIX: &str = "_ddbpipe_";
/// How long a statement waits for another connection's lock before failing with `BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const CREATE_STATE_SQL: &str = "CREATE TABLE IF NOT EXISTS \"_ddbpipe_state\" (\
     pipeline TEXT NOT NULL, part TEXT NOT NULL, value TEXT NOT NULL, updated_at TEXT NOT NULL, \
     PRIMARY KEY (pipeline, part))";
const UPSERT_STATE_SQL: &str = "INSERT INTO \"_ddbpipe_state\" (pipeline, part, value, updated_at) \
     VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (pipeline, part) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";
const DELETE_STATE_SQL: &str = "DELETE FROM \"_ddbpipe_state\" WHERE pipeline = ?1 AND part = ?2";

/// A sqlite destination database (a cheap handle: clones share the connection).
#[derive(Clone)]
pub struct SqliteDatabase {
    shared: Arc<Shared>,
}

/// What the clones of a handle share.
struct Shared {
    /// The path as given (for messages and the lock files).
    path: PathBuf,
    /// The connection and the SQL built for each table.
    conn: Mutex<Conn>,
    /// The run locks held by this handle: pipeline → the locked file.
    locks: Mutex<BTreeMap<String, File>>,
}

/// The connection with its per-table SQL cache.
struct Conn {
    conn: Connection,
    sql: HashMap<String, Arc<TableSql>>,
}

/// The statements of one destination table.
struct TableSql {
    /// The spec they were built for (a different spec under the same name rebuilds them).
    spec: TableSpec,
    /// Parameters: the key values, the document, the marker, `updated_at`.
    upsert_snapshot: String,
    /// As `upsert_snapshot`, but the marker is not updated on conflict.
    upsert_change: String,
    /// Parameters: the key values.
    delete: String,
    /// Parameter: the snapshot id.
    count_marked: String,
    /// Parameter: the snapshot id.
    delete_unmarked: String,
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
            .and_then(|()| {
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| {
                    row.get::<_, String>(0)
                })
            })
            .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
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
        // Three statements per table, the state's two, and the odd query.
        conn.set_prepared_statement_cache_capacity(64);
        SqliteDatabase {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                conn: Mutex::new(Conn {
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
    }

    pub(crate) async fn prepare(&self, spec: &TableSpec) -> Result<(), DbError> {
        validate_spec(spec).map_err(|m| self.message(&spec.table, &m))?;
        self.with_conn(|c| {
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| self.error(&spec.table, &e))?;
            match inspect(&tx, &spec.table).map_err(|e| self.error(&spec.table, &e))? {
                Found::Missing if spec.create_table => {
                    tx.execute_batch(&create_table_sql(spec))
                        .map_err(|e| self.error(&spec.table, &e))?;
                }
                found => self.check_found(spec, found)?,
            }
            tx.execute_batch(CREATE_STATE_SQL)
                .map_err(|e| self.error(STATE_TABLE, &e))?;
            tx.commit().map_err(|e| self.error(&spec.table, &e))
        })
    }

    pub(crate) async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        // Rows carry the time of the state they commit with, so a reader can match them.
        let updated_at = if state.updated_at.is_empty() {
            now_rfc3339().map_err(|m| self.message(&spec.table, &m))?
        } else {
            state.updated_at.clone()
        };
        self.with_conn(|c| {
            let sql = c.table_sql(spec);
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| self.error(&spec.table, &e))?;
            {
                let table_err = |e: rusqlite::Error| self.error(&spec.table, &e);
                let mut upsert_snapshot = tx.prepare_cached(&sql.upsert_snapshot).map_err(table_err)?;
                let mut upsert_change = tx.prepare_cached(&sql.upsert_change).map_err(table_err)?;
                let mut delete = tx.prepare_cached(&sql.delete).map_err(table_err)?;
                for (index, row) in rows.iter().enumerate() {
                    match row {
                        RowChange::Upsert {
                            key,
                            document,
                            snapshot,
                        } => {
                            check_key(spec, index, key).map_err(|m| self.message(&spec.table, &m))?;
                            let (stmt, marker) = if *snapshot {
                                let Some(id) = snapshot_id else {
                                    return Err(self.message(
                                        &spec.table,
                                        &format!("change {index} is a snapshot row but no snapshot is open"),
                                    ));
                                };
                                (&mut upsert_snapshot, Some(id))
                            } else {
                                (&mut upsert_change, None)
                            };
                            let n = key.len();
                            bind_key(stmt, key)
                                .and_then(|()| stmt.raw_bind_parameter(n + 1, document.as_str()))
                                .and_then(|()| stmt.raw_bind_parameter(n + 2, marker))
                                .and_then(|()| stmt.raw_bind_parameter(n + 3, updated_at.as_str()))
                                .and_then(|()| stmt.raw_execute())
                                .map_err(table_err)?;
                        }
                        RowChange::Delete { key } => {
                            check_key(spec, index, key).map_err(|m| self.message(&spec.table, &m))?;
                            bind_key(&mut delete, key)
                                .and_then(|()| delete.raw_execute())
                                .map_err(table_err)?;
                        }
                    }
                }
            }
            write_state(&tx, state).map_err(|e| self.error(STATE_TABLE, &e))?;
            tx.commit().map_err(|e| self.error(&spec.table, &e))
        })
    }

    pub(crate) async fn store_state(&self, state: &StateWrite) -> Result<(), DbError> {
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(STATE_TABLE, &e);
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            tx.execute_batch(CREATE_STATE_SQL).map_err(err)?;
            write_state(&tx, state).map_err(err)?;
            tx.commit().map_err(err)
        })
    }

    pub(crate) async fn load_state(
        &self,
        pipeline: &str,
    ) -> Result<BTreeMap<String, String>, DbError> {
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(STATE_TABLE, &e);
            if !matches!(inspect(&c.conn, STATE_TABLE).map_err(err)?, Found::Table(_)) {
                return Ok(BTreeMap::new());
            }
            let mut stmt = c
                .conn
                .prepare_cached("SELECT part, value FROM \"_ddbpipe_state\" WHERE pipeline = ?1")
                .map_err(err)?;
            let rows = stmt
                .query_map([pipeline], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(err)?;
            rows.collect::<Result<BTreeMap<String, String>, _>>()
                .map_err(err)
        })
    }

    pub(crate) async fn reset_state(&self, pipeline: &str) -> Result<bool, DbError> {
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(STATE_TABLE, &e);
            if !matches!(inspect(&c.conn, STATE_TABLE).map_err(err)?, Found::Table(_)) {
                return Ok(false);
            }
            let deleted = c
                .conn
                .execute(
                    "DELETE FROM \"_ddbpipe_state\" WHERE pipeline = ?1",
                    [pipeline],
                )
                .map_err(err)?;
            Ok(deleted > 0)
        })
    }

    pub(crate) async fn count_rows(&self, spec: &TableSpec) -> Result<u64, DbError> {
        self.with_conn(|c| {
            let err = |e: rusqlite::Error| self.error(&spec.table, &e);
            if !matches!(inspect(&c.conn, &spec.table).map_err(err)?, Found::Table(_)) {
                return Ok(0);
            }
            count(&c.conn, &spec.table).map_err(err)
        })
    }

    pub(crate) async fn close_snapshot(
        &self,
        spec: &TableSpec,
        close: CloseSnapshot,
        state: &StateWrite,
    ) -> Result<Closed, DbError> {
        self.with_conn(|c| {
            let sql = c.table_sql(spec);
            let err = |e: rusqlite::Error| self.error(&spec.table, &e);
            let tx = c
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            let marked: i64 = tx
                .prepare_cached(&sql.count_marked)
                .and_then(|mut stmt| stmt.query_row([close.id], |row| row.get(0)))
                .map_err(err)?;
            let keys_written = u64::try_from(marked).unwrap_or(0);
            let mut closed = Closed {
                keys_written,
                deleted: 0,
                ceiling_hit: false,
            };
            if close.delete_unseen {
                if keys_written <= close.max_keys {
                    let deleted = tx
                        .prepare_cached(&sql.delete_unmarked)
                        .and_then(|mut stmt| stmt.execute([close.id]))
                        .map_err(err)?;
                    closed.deleted = deleted as u64;
                } else {
                    closed.ceiling_hit = true;
                }
            }
            write_state(&tx, state).map_err(|e| self.error(STATE_TABLE, &e))?;
            tx.commit().map_err(err)?;
            Ok(closed)
        })
    }

    pub(crate) async fn lock(&self, pipeline: &str) -> Result<(), Result<LockHolder, DbError>> {
        let path = self.lock_path(pipeline).map_err(Err)?;
        blocking(|| {
            let mut locks = lock_mutex(&self.shared.locks);
            if locks.contains_key(pipeline) {
                return Ok(());
            }
            let io_err = |e: std::io::Error| {
                Err(DbError::fatal(format!(
                    "sqlite lock file {}: {e}",
                    path.display()
                )))
            };
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io_err)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(Ok(LockHolder {
                        location: path.display().to_string(),
                        pid: read_pid(&mut file),
                    }));
                }
                Err(TryLockError::Error(e)) => return Err(io_err(e)),
            }
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)))
                .and_then(|_| writeln!(file, "{}", std::process::id()))
                .map_err(io_err)?;
            locks.insert(pipeline.to_string(), file);
            Ok(())
        })
    }

    pub(crate) async fn lock_holder(&self, pipeline: &str) -> Result<Option<LockHolder>, DbError> {
        let path = self.lock_path(pipeline)?;
        blocking(|| {
            if lock_mutex(&self.shared.locks).contains_key(pipeline) {
                // This handle holds it: no other run does.
                return Ok(None);
            }
            let io_err = |e: std::io::Error| {
                DbError::fatal(format!("sqlite lock file {}: {e}", path.display()))
            };
            let mut file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err(e)),
            };
            match file.try_lock() {
                Ok(()) => {
                    file.unlock().map_err(io_err)?;
                    Ok(None)
                }
                Err(TryLockError::WouldBlock) => Ok(Some(LockHolder {
                    location: path.display().to_string(),
                    pid: read_pid(&mut file),
                })),
                Err(TryLockError::Error(e)) => Err(io_err(e)),
            }
        })
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
            tx.execute_batch(CREATE_STATE_SQL)
                .map_err(|e| self.error(STATE_TABLE, &e))?;
            let detail = match inspect(&tx, &spec.table).map_err(err)? {
                Found::Missing if spec.create_table => {
                    tx.execute_batch(&create_table_sql(spec)).map_err(err)?;
                    format!(
                        "{shown}: table '{}' will be created, key {}",
                        spec.table,
                        spec_key_text(spec)
                    )
                }
                found => {
                    self.check_found(spec, found)?;
                    let rows = count(&tx, &spec.table).map_err(err)?;
                    format!(
                        "{shown}: table '{}' exists, {rows} row(s), key {}",
                        spec.table,
                        spec_key_text(spec)
                    )
                }
            };
            tx.rollback().map_err(err)?;
            Ok(detail)
        })
    }

    /// Runs `f` with the connection, off the async worker when on a multi-thread runtime.
    fn with_conn<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T, DbError>) -> Result<T, DbError> {
        blocking(|| f(&mut lock_mutex(&self.shared.conn)))
    }

    /// Checks an existing table (or its absence, `create_table` being false) against `spec`.
    fn check_found(&self, spec: &TableSpec, found: Found) -> Result<(), DbError> {
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
        check_columns(spec, &columns).map_err(|m| {
            DbError::fatal(format!(
                "sqlite table '{table}' in {shown} {m}: choose another sink.table or drop the table"
            ))
        })
    }

    /// `<database path>-ddbpipe-<pipeline>.lock`.
    fn lock_path(&self, pipeline: &str) -> Result<PathBuf, DbError> {
        if pipeline.is_empty() || pipeline.contains(['/', '\\', '\0']) {
            return Err(DbError::fatal(format!(
                "sqlite lock: the pipeline name {pipeline:?} cannot name a lock file"
            )));
        }
        let mut name = OsString::from(self.shared.path.as_os_str());
        name.push(format!("-ddbpipe-{pipeline}.lock"));
        Ok(PathBuf::from(name))
    }

    /// A SQLite error on `table`, classified (busy/locked are retryable).
    fn error(&self, table: &str, e: &rusqlite::Error) -> DbError {
        DbError {
            message: format!(
                "sqlite table '{table}' in {}: {e}",
                self.shared.path.display()
            ),
            retryable: is_retryable(e),
        }
    }

    /// A fatal error on `table`.
    fn message(&self, table: &str, message: &str) -> DbError {
        DbError::fatal(format!(
            "sqlite table '{table}' in {}: {message}",
            self.shared.path.display()
        ))
    }
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

impl TableSql {
    fn new(spec: &TableSpec) -> Self {
        let table = quote(&spec.table);
        let doc = quote(&spec.document_column);
        let marker = quote(SNAPSHOT_COLUMN);
        let updated = quote(UPDATED_AT_COLUMN);
        let keys: Vec<String> = spec.key.iter().map(|k| quote(&k.name)).collect();
        let n = keys.len();
        let key_list = keys.join(", ");
        let values = (1..=n + 3)
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let insert = format!(
            "INSERT INTO {table} ({key_list}, {doc}, {marker}, {updated}) VALUES ({values}) \
             ON CONFLICT ({key_list}) DO UPDATE SET {doc} = excluded.{doc}, "
        );
        let where_key = keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ?{}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        TableSql {
            spec: spec.clone(),
            upsert_snapshot: format!(
                "{insert}{marker} = excluded.{marker}, {updated} = excluded.{updated}"
            ),
            upsert_change: format!("{insert}{updated} = excluded.{updated}"),
            delete: format!("DELETE FROM {table} WHERE {where_key}"),
            count_marked: format!("SELECT count(*) FROM {table} WHERE {marker} = ?1"),
            delete_unmarked: format!(
                "DELETE FROM {table} WHERE {marker} IS NULL OR {marker} <> ?1"
            ),
        }
    }
}

/// What a name is in the database.
enum Found {
    /// Nothing of that name.
    Missing,
    /// A view, index or trigger.
    Other(String),
    /// A table, with its columns.
    Table(Vec<ColumnInfo>),
}

/// One column of an existing table.
struct ColumnInfo {
    name: String,
    declared: String,
    /// The 1-based position in the primary key, 0 when not in it.
    pk: i64,
}

/// Looks `table` up in the main schema (names compare case-insensitively, as in SQLite).
fn inspect(conn: &Connection, table: &str) -> rusqlite::Result<Found> {
    let kind: Option<String> = conn
        .prepare_cached(
            "SELECT type FROM main.sqlite_master WHERE name = ?1 COLLATE NOCASE \
             ORDER BY type = 'table' DESC LIMIT 1",
        )?
        .query_row([table], |row| row.get(0))
        .optional()?;
    match kind.as_deref() {
        None => Ok(Found::Missing),
        Some("table") => {
            let mut stmt = conn.prepare_cached(
                "SELECT name, type, pk FROM pragma_table_info(?1, 'main') ORDER BY cid",
            )?;
            let columns = stmt
                .query_map([table], |row| {
                    Ok(ColumnInfo {
                        name: row.get(0)?,
                        declared: row.get(1)?,
                        pk: row.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Found::Table(columns))
        }
        Some(other) => Ok(Found::Other(other.to_string())),
    }
}

/// Compares an existing table's columns with `spec`: `Err` completes "sqlite table 'x' in f …".
fn check_columns(spec: &TableSpec, columns: &[ColumnInfo]) -> Result<(), String> {
    let mut key: Vec<&ColumnInfo> = columns.iter().filter(|c| c.pk > 0).collect();
    key.sort_by_key(|c| c.pk);
    let same_key = key.len() == spec.key.len()
        && key.iter().zip(&spec.key).all(|(have, want)| {
            have.name.eq_ignore_ascii_case(&want.name)
                && have.declared.eq_ignore_ascii_case(sql_type(want.kind))
        });
    if !same_key {
        let have = key
            .iter()
            .map(|c| format!("{} {}", c.name, c.declared))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!(
            "has key columns ({have}) but the source key is {}",
            spec_key_text(spec)
        ));
    }
    for (wanted, what) in [
        (spec.document_column.as_str(), "the document column"),
        (SNAPSHOT_COLUMN, "the snapshot marker"),
        (UPDATED_AT_COLUMN, "the update time"),
    ] {
        if !columns.iter().any(|c| c.name.eq_ignore_ascii_case(wanted)) {
            return Err(format!("has no column '{wanted}' ({what})"));
        }
    }
    Ok(())
}

/// Rejects specs whose columns would collide (the caller checks too).
fn validate_spec(spec: &TableSpec) -> Result<(), String> {
    let reserved = |name: &str| {
        name.get(..RESERVED_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
    };
    if spec.table.is_empty() || reserved(&spec.table) {
        return Err("the table name is empty or reserved by ddbpipe".to_string());
    }
    if spec.key.is_empty() {
        return Err("the key has no columns".to_string());
    }
    if spec.document_column.is_empty() || reserved(&spec.document_column) {
        return Err(format!(
            "the document column '{}' is empty or starts with {RESERVED_PREFIX}",
            spec.document_column
        ));
    }
    for (i, k) in spec.key.iter().enumerate() {
        if k.name.is_empty() {
            return Err("a key attribute has an empty name".to_string());
        }
        if reserved(&k.name) {
            return Err(format!(
                "the key attribute '{}' starts with {RESERVED_PREFIX}, reserved for ddbpipe's columns",
                k.name
            ));
        }
        if k.name.eq_ignore_ascii_case(&spec.document_column) {
            return Err(format!(
                "the key attribute '{}' has the document column's name; set another sink.document_column",
                k.name
            ));
        }
        if spec.key[..i]
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(&k.name))
        {
            return Err(format!(
                "the key attributes have the same column name '{}' (SQLite ignores case)",
                k.name
            ));
        }
    }
    Ok(())
}

/// `CREATE TABLE IF NOT EXISTS` for `spec` (see the module docs).
fn create_table_sql(spec: &TableSpec) -> String {
    let mut columns: Vec<String> = spec
        .key
        .iter()
        .map(|k| format!("{} {} NOT NULL", quote(&k.name), sql_type(k.kind)))
        .collect();
    columns.push(format!("{} TEXT NOT NULL", quote(&spec.document_column)));
    columns.push(format!("{} INTEGER", quote(SNAPSHOT_COLUMN)));
    columns.push(format!("{} TEXT NOT NULL", quote(UPDATED_AT_COLUMN)));
    let key = spec
        .key
        .iter()
        .map(|k| quote(&k.name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({key}))",
        quote(&spec.table),
        columns.join(", ")
    )
}

/// `"(pk TEXT, sk TEXT)"`.
fn spec_key_text(spec: &TableSpec) -> String {
    let parts = spec
        .key
        .iter()
        .map(|KeyColumn { name, kind }| format!("{name} {}", sql_type(*kind)))
        .collect::<Vec<_>>();
    format!("({})", parts.join(", "))
}

/// The declared column type of a key type.
fn sql_type(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S | KeyType::N => "TEXT",
        KeyType::B => "BLOB",
    }
}

/// A double-quoted identifier, embedded `"` doubled.
fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// Checks a row's key against the key columns.
fn check_key(spec: &TableSpec, index: usize, key: &[KeyValue]) -> Result<(), String> {
    if key.len() != spec.key.len() {
        return Err(format!(
            "change {index} has {} key value(s) but the table has {} key column(s)",
            key.len(),
            spec.key.len()
        ));
    }
    for (value, column) in key.iter().zip(&spec.key) {
        let kind = match value {
            KeyValue::S(_) => KeyType::S,
            KeyValue::N(_) => KeyType::N,
            KeyValue::B(_) => KeyType::B,
        };
        if kind != column.kind {
            return Err(format!(
                "change {index} has a {} value for the key column '{}' of type {}",
                kind.tag(),
                column.name,
                column.kind.tag()
            ));
        }
    }
    Ok(())
}

/// Binds the key values to parameters `1..=key.len()`: S and N as TEXT, B as BLOB.
fn bind_key(stmt: &mut Statement<'_>, key: &[KeyValue]) -> rusqlite::Result<()> {
    for (i, value) in key.iter().enumerate() {
        match value {
            KeyValue::S(text) | KeyValue::N(text) => {
                stmt.raw_bind_parameter(i + 1, text.as_str())?
            }
            KeyValue::B(bytes) => stmt.raw_bind_parameter(i + 1, bytes.as_slice())?,
        }
    }
    Ok(())
}

/// Upserts and deletes the state parts (nothing when `state` is empty).
fn write_state(conn: &Connection, state: &StateWrite) -> rusqlite::Result<()> {
    if state.is_empty() {
        return Ok(());
    }
    if !state.upserts.is_empty() {
        let mut upsert = conn.prepare_cached(UPSERT_STATE_SQL)?;
        for (part, value) in &state.upserts {
            upsert.execute((&state.pipeline, part, value, &state.updated_at))?;
        }
    }
    if !state.deletes.is_empty() {
        let mut delete = conn.prepare_cached(DELETE_STATE_SQL)?;
        for part in &state.deletes {
            delete.execute((&state.pipeline, part))?;
        }
    }
    Ok(())
}

/// `SELECT count(*)` of an existing table.
fn count(conn: &Connection, table: &str) -> rusqlite::Result<u64> {
    let n: i64 = conn.query_row(
        &format!("SELECT count(*) FROM {}", quote(table)),
        [],
        |row| row.get(0),
    )?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// SQLite busy/locked: another connection holds the lock; the transaction can be retried.
fn is_retryable(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn open_error(path: &Path, e: &rusqlite::Error) -> DbError {
    DbError {
        message: format!("sqlite database {}: {e}", path.display()),
        retryable: is_retryable(e),
    }
}

/// Now as RFC 3339 UTC with milliseconds: `2026-11-29T21:00:00.123Z`.
fn now_rfc3339() -> Result<String, String> {
    time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        ))
        .map_err(|e| format!("formatting the time: {e}"))
}

/// The pid written in a lock file, when it parses.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
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
