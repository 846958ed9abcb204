//! The SQLite side of the scripts written once in `crate::database`: the dialect (`?n`
//! parameters, plain quoted table names, no row locks: `BEGIN IMMEDIATE` holds the file's
//! write lock for the whole transaction) and the primitives over the handle's one
//! connection, each run off the async worker (see the `sqlite` module docs, "Connection").

use std::ops::DerefMut;

use futures_util::future::BoxFuture;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};

use super::schema::{CREATE_STATE_SQL, Found, inspect};
use super::{Conn, SqliteDatabase, blocking};
use crate::DbError;
use crate::backend::{
    Cell, Dialect, Param, Row, RowLock, Session, SqlType, Statements, Transaction,
};
use crate::sql::quote;

/// SQLite's SQL text.
pub(super) struct SqliteDialect;

impl Dialect for SqliteDialect {
    fn table(&self, name: &str) -> String {
        quote(name)
    }

    fn param(&self, n: usize, _: SqlType) -> String {
        format!("?{n}")
    }

    fn lock(&self, _: RowLock) -> &'static str {
        // The transaction holds the database's write lock.
        ""
    }

    fn json_text(&self, column: &str) -> String {
        column.to_string()
    }

    fn create_state(&self) -> Option<&'static str> {
        Some(CREATE_STATE_SQL)
    }
}

/// The handle's connection, taken for a script (`C`: the lock's guard), or a transaction in
/// it (`C`: the connection borrowed from the session, `open` until committed; dropped open,
/// it rolls back).
pub(super) struct Connected<'a, C: DerefMut<Target = Conn> + Send> {
    pub(super) conn: C,
    pub(super) db: &'a SqliteDatabase,
    pub(super) open: bool,
}

impl<C: DerefMut<Target = Conn> + Send> Drop for Connected<'_, C> {
    fn drop(&mut self) {
        if self.open {
            // As rusqlite's own transaction does; an error leaves SQLite to roll back.
            let _ = self.conn.conn.execute_batch("ROLLBACK");
        }
    }
}

impl<'a> Connected<'a, &'a mut Conn> {
    /// Begins `BEGIN IMMEDIATE` on `conn` (`on`: the table for messages).
    pub(super) fn begin(
        conn: &'a mut Conn,
        db: &'a SqliteDatabase,
        on: &str,
    ) -> Result<Self, DbError> {
        blocking(|| conn.conn.execute_batch("BEGIN IMMEDIATE")).map_err(|e| db.error(on, &e))?;
        Ok(Connected {
            conn,
            db,
            open: true,
        })
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self {
            Param::Int(value) => value.into(),
            Param::Text(text) | Param::MaybeText(Some(text)) => text.into(),
            Param::MaybeText(None) => ToSqlOutput::Owned(Value::Null),
        })
    }
}

/// One result row's values.
fn cells(row: &rusqlite::Row<'_>, columns: usize) -> rusqlite::Result<Row> {
    (0..columns)
        .map(|index| match row.get_ref(index)? {
            ValueRef::Null => Ok(Cell::Null),
            ValueRef::Integer(value) => Ok(Cell::Int(value)),
            ValueRef::Text(_) => row.get(index).map(Cell::Text),
            other => Err(rusqlite::Error::InvalidColumnType(
                index,
                row.as_ref()
                    .column_name(index)
                    .map_or_else(|_| index.to_string(), str::to_string),
                other.data_type(),
            )),
        })
        .collect()
}

fn execute(conn: &rusqlite::Connection, sql: &str, params: &[Param<'_>]) -> rusqlite::Result<u64> {
    let changed = conn
        .prepare_cached(sql)?
        .execute(rusqlite::params_from_iter(params))?;
    Ok(changed as u64)
}

impl<C: DerefMut<Target = Conn> + Send> Statements for Connected<'_, C> {
    fn dialect(&self) -> &dyn Dialect {
        &SqliteDialect
    }

    fn place(&self) -> String {
        self.db.describe()
    }

    fn fail(&self, on: &str, message: &str) -> DbError {
        self.db.message(on, message)
    }

    fn exists<'a>(&'a mut self, name: &'a str) -> BoxFuture<'a, Result<bool, DbError>> {
        Box::pin(async move {
            blocking(|| inspect(&self.conn.conn, name))
                .map(|found| matches!(found, Found::Table(_)))
                .map_err(|e| self.db.error(name, &e))
        })
    }

    fn execute<'a>(
        &'a mut self,
        on: &'a str,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<u64, DbError>> {
        Box::pin(async move {
            blocking(|| execute(&self.conn.conn, sql, params)).map_err(|e| self.db.error(on, &e))
        })
    }

    fn query<'a>(
        &'a mut self,
        on: &'a str,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> BoxFuture<'a, Result<Vec<Row>, DbError>> {
        Box::pin(async move {
            blocking(|| {
                let mut stmt = self.conn.conn.prepare_cached(sql)?;
                let columns = stmt.column_count();
                stmt.query_map(rusqlite::params_from_iter(params), |row| {
                    cells(row, columns)
                })?
                .collect::<rusqlite::Result<Vec<Row>>>()
            })
            .map_err(|e| self.db.error(on, &e))
        })
    }

    fn batch<'a>(&'a mut self, on: &'a str, sql: &'a str) -> BoxFuture<'a, Result<(), DbError>> {
        Box::pin(async move {
            blocking(|| self.conn.conn.execute_batch(sql)).map_err(|e| self.db.error(on, &e))
        })
    }
}

impl Session for Connected<'_, tokio::sync::MutexGuard<'_, Conn>> {
    fn begin<'a>(
        &'a mut self,
        on: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Transaction + 'a>, DbError>> {
        Box::pin(async move {
            let tx = Connected::begin(&mut self.conn, self.db, on)?;
            Ok(Box::new(tx) as Box<dyn Transaction + 'a>)
        })
    }
}

impl Transaction for Connected<'_, &mut Conn> {
    fn commit<'a>(&'a mut self, on: &'a str) -> BoxFuture<'a, Result<(), DbError>> {
        Box::pin(async move {
            blocking(|| self.conn.conn.execute_batch("COMMIT"))
                .map_err(|e| self.db.error(on, &e))?;
            self.open = false;
            Ok(())
        })
    }

    fn rollback(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // As the drop does; an error leaves SQLite to roll back.
            let _ = blocking(|| self.conn.conn.execute_batch("ROLLBACK"));
            self.open = false;
        })
    }
}
