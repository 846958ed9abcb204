//! The PostgreSQL side of the scripts written once in `crate::database`: the dialect
//! (`$n::type` parameters, tables qualified by the schema, `FOR SHARE` / `FOR UPDATE` row
//! locks, `jsonb` read as text) and the primitives over the handle's session (see the
//! `postgres` module docs, "Connection" and "Retry classification").
//!
//! # Sessions and transactions
//! A [`Script`] holds the session's lock for the whole script, so the handle's calls take
//! turns as before. Its statements are prepared once per connection (the session's cache);
//! [`PgTx`] is a transaction in it, also used by `apply` around its own row statements. A
//! driver error is worded with the script's table ("postgres table 'public.orders': …") and
//! classified; one that lost the connection drops it when the script ends, so the next call
//! reconnects.

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Statement};

use super::session::{Failure, Session, Shared, end_transaction, statement};
use super::sql::{qualified, table_context};
use crate::DbError;
use crate::backend::{
    Call, Cell, Dialect, Param, Row, RowLock, Session as ScriptSession, SqlType, Statements,
    Transaction,
};

/// PostgreSQL's SQL text, in one schema.
pub(super) struct PgDialect {
    pub(super) schema: String,
}

impl Dialect for PgDialect {
    fn table(&self, name: &str) -> String {
        qualified(&self.schema, name)
    }

    fn param(&self, n: usize, ty: SqlType) -> String {
        let cast = match ty {
            SqlType::Int => "::bigint",
            SqlType::Text => "::text",
            SqlType::Json => "::text::jsonb",
        };
        format!("${n}{cast}")
    }

    fn lock(&self, lock: RowLock) -> &'static str {
        match lock {
            RowLock::None => "",
            RowLock::Share => " FOR SHARE",
            RowLock::Update => " FOR UPDATE",
        }
    }

    fn json_text(&self, column: &str) -> String {
        format!("{column}::text")
    }

    fn create_state(&self) -> Option<&'static str> {
        None
    }
}

/// The session taken for one script.
pub(super) struct Script<'a> {
    guard: tokio::sync::MutexGuard<'a, Session>,
    shared: &'a Shared,
    dialect: PgDialect,
    /// "postgres table 'schema.table'": what the messages name.
    context: String,
    /// A statement lost the connection: dropped with the script.
    lost: bool,
}

impl<'a> Script<'a> {
    /// Takes the session (connecting when it is not) for a script in `schema` whose messages
    /// name the table `about`.
    pub(super) async fn take(
        shared: &'a Shared,
        schema: String,
        about: &str,
    ) -> Result<Script<'a>, DbError> {
        let context = table_context(&schema, about);
        let mut guard = shared.session.lock().await;
        let connected = guard.connected(shared).await.map(drop);
        guard.finish(shared, &context, connected)?;
        Ok(Script {
            guard,
            shared,
            dialect: PgDialect { schema },
            context,
            lost: false,
        })
    }

    /// The connection and its statement cache.
    fn client(&mut self) -> Result<(&Client, &mut HashMap<String, Statement>), DbError> {
        let session = &mut *self.guard;
        match session.client.as_ref() {
            Some(client) => Ok((client, &mut session.statements)),
            None => Err(lost_connection(&self.context)),
        }
    }
}

impl Drop for Script<'_> {
    fn drop(&mut self) {
        if self.lost || self.guard.client.as_ref().is_some_and(Client::is_closed) {
            self.guard.drop_connection();
        }
    }
}

/// A transaction of a script, or of `apply`.
pub(super) struct PgTx<'s> {
    /// `None` once committed.
    tx: Option<tokio_postgres::Transaction<'s>>,
    statements: &'s mut HashMap<String, Statement>,
    shared: &'s Shared,
    dialect: &'s PgDialect,
    context: &'s str,
    lost: &'s mut bool,
}

impl<'s> PgTx<'s> {
    /// Begins a transaction on `client`; a driver error lost the connection sets `lost`.
    pub(super) async fn begin(
        client: &'s mut Client,
        statements: &'s mut HashMap<String, Statement>,
        shared: &'s Shared,
        dialect: &'s PgDialect,
        context: &'s str,
        lost: &'s mut bool,
    ) -> Result<PgTx<'s>, DbError> {
        match client.transaction().await {
            Ok(tx) => Ok(PgTx {
                tx: Some(tx),
                statements,
                shared,
                dialect,
                context,
                lost,
            }),
            Err(e) => Err(failed(shared, context, lost, &e)),
        }
    }

    /// The open transaction.
    pub(super) fn transaction(&self) -> Result<&tokio_postgres::Transaction<'s>, DbError> {
        self.tx.as_ref().ok_or_else(|| committed(self.context))
    }

    /// Commits after success, rolls back after a failure (and reports it).
    pub(super) async fn end<T>(mut self, result: Result<T, Failure>) -> Result<T, Failure> {
        match self.tx.take() {
            Some(tx) => end_transaction(tx, result).await,
            None => Err(committed(self.context).into()),
        }
    }

    /// The transaction, to end it otherwise.
    pub(super) fn into_inner(mut self) -> Result<tokio_postgres::Transaction<'s>, DbError> {
        self.tx.take().ok_or_else(|| committed(self.context))
    }

    /// The transaction and the statement cache, or why not.
    fn parts(
        &mut self,
    ) -> Result<
        (
            &tokio_postgres::Transaction<'s>,
            &mut HashMap<String, Statement>,
        ),
        DbError,
    > {
        match self.tx.as_ref() {
            Some(tx) => Ok((tx, &mut *self.statements)),
            None => Err(committed(self.context)),
        }
    }
}

/// Statements of a [`Script`] or a [`PgTx`]: run on `$client` with `$cache`.
macro_rules! statements {
    ($type:ty) => {
        impl Statements for $type {
            fn dialect(&self) -> &dyn Dialect {
                let dialect: &PgDialect = &self.dialect;
                dialect
            }

            fn place(&self) -> String {
                self.context.to_string()
            }

            fn fail(&self, _: &str, message: &str) -> DbError {
                DbError::fatal(format!("{}: {message}", self.context))
            }

            fn exists<'a>(&'a mut self, name: &'a str) -> BoxFuture<'a, Result<bool, DbError>> {
                let name = self.dialect.table(name);
                Box::pin(async move {
                    let (client, cache) = self.parts()?;
                    let found = exists(client, cache, &name).await;
                    found.map_err(|e| failed(self.shared, &self.context, &mut self.lost, &e))
                })
            }

            fn execute<'a>(
                &'a mut self,
                _: &'a str,
                sql: &'a str,
                params: &'a [Param<'a>],
            ) -> BoxFuture<'a, Result<u64, DbError>> {
                Box::pin(async move {
                    let (client, cache) = self.parts()?;
                    let done = execute(client, cache, sql, params).await;
                    done.map_err(|e| failed(self.shared, &self.context, &mut self.lost, &e))
                })
            }

            fn query<'a>(
                &'a mut self,
                _: &'a str,
                sql: &'a str,
                params: &'a [Param<'a>],
            ) -> BoxFuture<'a, Result<Vec<Row>, DbError>> {
                Box::pin(async move {
                    let (client, cache) = self.parts()?;
                    let rows = query(client, cache, sql, params).await;
                    rows.map_err(|e| failed(self.shared, &self.context, &mut self.lost, &e))
                })
            }

            fn batch<'a>(
                &'a mut self,
                _: &'a str,
                sql: &'a str,
            ) -> BoxFuture<'a, Result<(), DbError>> {
                Box::pin(async move {
                    let (client, _) = self.parts()?;
                    let done = client.batch_execute(sql).await;
                    done.map_err(|e| failed(self.shared, &self.context, &mut self.lost, &e))
                })
            }
        }
    };
}

impl Script<'_> {
    fn parts(&mut self) -> Result<(&Client, &mut HashMap<String, Statement>), DbError> {
        self.client()
    }
}

statements!(Script<'_>);
statements!(PgTx<'_>);

impl ScriptSession for Script<'_> {
    fn begin<'b>(
        &'b mut self,
        _: &'b str,
    ) -> BoxFuture<'b, Result<Box<dyn Transaction + 'b>, DbError>> {
        Box::pin(async move {
            let Script {
                guard,
                shared,
                dialect,
                context,
                lost,
            } = self;
            let session = &mut **guard;
            let Some(client) = session.client.as_mut() else {
                return Err(lost_connection(context));
            };
            let tx = PgTx::begin(
                client,
                &mut session.statements,
                shared,
                dialect,
                context,
                lost,
            )
            .await?;
            Ok(Box::new(tx) as Box<dyn Transaction + 'b>)
        })
    }
}

impl Transaction for PgTx<'_> {
    fn commit<'a>(&'a mut self, _: &'a str) -> BoxFuture<'a, Result<(), DbError>> {
        Box::pin(async move {
            let tx = self.tx.take().ok_or_else(|| committed(self.context))?;
            let done = tx.commit().await;
            done.map_err(|e| failed(self.shared, self.context, self.lost, &e))
        })
    }

    fn rollback(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(tx) = self.tx.take() {
                let _ = tx.rollback().await;
            }
        })
    }
}

/// A driver error worded with `context`; sets `lost` when it lost the connection.
fn failed(shared: &Shared, context: &str, lost: &mut bool, e: &tokio_postgres::Error) -> DbError {
    let (error, gone) = shared.driver_error(context, e);
    *lost |= gone;
    error
}

fn lost_connection(context: &str) -> DbError {
    DbError::retryable_if(true, format!("{context}: the connection was lost"))
}

fn committed(context: &str) -> DbError {
    DbError::fatal(format!("{context}: the transaction has ended"))
}

fn pg_params<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|param| -> &(dyn ToSql + Sync) {
            match param {
                Param::Int(value) => value,
                Param::Text(text) => text,
                Param::MaybeText(text) => text,
            }
        })
        .collect()
}

async fn exists<C: GenericClient + Sync>(
    client: &C,
    cache: &mut HashMap<String, Statement>,
    qualified: &str,
) -> Result<bool, tokio_postgres::Error> {
    let sql = "SELECT pg_catalog.to_regclass($1::text) IS NOT NULL";
    let prepared = statement(client, cache, sql).await?;
    client.query_one(&prepared, &[&qualified]).await?.try_get(0)
}

async fn execute<C: GenericClient + Sync>(
    client: &C,
    cache: &mut HashMap<String, Statement>,
    sql: &str,
    params: &[Param<'_>],
) -> Result<u64, tokio_postgres::Error> {
    let prepared = statement(client, cache, sql).await?;
    client.execute(&prepared, &pg_params(params)).await
}

async fn query<C: GenericClient + Sync>(
    client: &C,
    cache: &mut HashMap<String, Statement>,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let prepared = statement(client, cache, sql).await?;
    let rows = client.query(&prepared, &pg_params(params)).await?;
    rows.iter().map(cells).collect()
}

/// One result row's values: integers and text (anything else fails as the driver's wrong
/// type).
fn cells(row: &tokio_postgres::Row) -> Result<Row, tokio_postgres::Error> {
    (0..row.len())
        .map(|index| {
            let cell = match *row.columns()[index].type_() {
                Type::INT8 => row.try_get::<_, Option<i64>>(index)?.map(Cell::Int),
                Type::INT4 => row
                    .try_get::<_, Option<i32>>(index)?
                    .map(|value| Cell::Int(value.into())),
                _ => row.try_get::<_, Option<String>>(index)?.map(Cell::Text),
            };
            Ok(cell.unwrap_or(Cell::Null))
        })
        .collect()
}

/// `calls` prepared on `client`, with their parameters: to send beside other statements.
pub(super) async fn prepare_calls<'a, C: GenericClient + Sync>(
    client: &C,
    cache: &mut HashMap<String, Statement>,
    calls: &'a [Call<'a>],
) -> Result<Vec<(Statement, Vec<&'a (dyn ToSql + Sync)>)>, tokio_postgres::Error> {
    let mut prepared_calls = Vec::with_capacity(calls.len());
    for (sql, params) in calls {
        let prepared = statement(client, cache, sql).await?;
        prepared_calls.push((prepared, pg_params(params)));
    }
    Ok(prepared_calls)
}
