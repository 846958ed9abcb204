//! The PostgreSQL backend (docs/state.md §6.5, §6.6, docs/sinks.md §7.3, §7.4, docs/errors.md §9.4).
//!
//! # Connection
//! [`PostgresDatabase::connect`] takes a libpq URL (`postgres://user:pw@host:5432/db?sslmode=…`)
//! or key=value string. `sslmode` `disable`, `prefer` (the default) and `require` are honoured
//! with rustls (ring); like libpq, `prefer` and `require` encrypt but do not verify the server
//! certificate. The handle is a cheap clone around one shared session (one connection; calls
//! take turns). A lost connection is reported as retryable and the next call reconnects,
//! re-taking the pipeline lock when it had been taken (when another run took it meanwhile, that
//! call fails for good). Messages name the table ("postgres table 'public.orders': …") or the
//! server ("postgres 127.0.0.1:5432/app: …") and never show the password.
//!
//! # SQL shape
//! Everything lives in the spec's schema, identifiers quoted (`"` doubled), at most 63 bytes:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "public"."orders" (
//!   "customer" text NOT NULL, "order_id" numeric NOT NULL,   -- S → text, N → numeric, B → bytea
//!   "doc" jsonb NOT NULL,                  -- or json / text: sink.document_type; none with
//!                                          -- document_column: null
//!   "total" numeric, "qty" bigint,         -- the typed columns, nullable (docs/sinks.md §7.9)
//!   "_ddbpipe_snapshot" bigint, "_ddbpipe_updated_at" timestamptz NOT NULL,
//!   "_ddbpipe_version_ms" bigint, "_ddbpipe_version_seq" text,  -- docs/mirror.md §5.6
//!   PRIMARY KEY ("customer", "order_id"));
//! CREATE TABLE IF NOT EXISTS "public"."_ddbpipe_state" (pipeline text NOT NULL,
//!   part text NOT NULL, value jsonb NOT NULL, updated_at text NOT NULL,
//!   PRIMARY KEY (pipeline, part));
//! CREATE TABLE IF NOT EXISTS "public"."_ddbpipe_deleted" (table_name text NOT NULL,
//!   key_text text NOT NULL, version_ms bigint, PRIMARY KEY (table_name, key_text));
//! -- a stream upsert while a snapshot is open, or a snapshot row without a version (marker =
//! -- the snapshot id); with no snapshot open the marker is left out of the conflict update, so
//! -- an existing row keeps it and a new row has null:
//! INSERT INTO "public"."orders" (…keys, "doc", "total", "qty", "_ddbpipe_snapshot",
//!   "_ddbpipe_updated_at", "_ddbpipe_version_ms", "_ddbpipe_version_seq")
//!   VALUES ($1::text, $2::text::numeric, $3::text::jsonb, $4::text::numeric, $5::text::bigint,
//!     $6::bigint, $7::text::timestamptz, $8::bigint, $9::text)
//!   ON CONFLICT ("customer", "order_id") DO UPDATE SET "doc" = EXCLUDED."doc",
//!   "total" = EXCLUDED."total", …, "_ddbpipe_snapshot" = EXCLUDED."_ddbpipe_snapshot";
//! -- a snapshot row read at $8 (cutoff $9, table name $10, key text $11):
//! INSERT INTO "public"."orders" AS t (…) SELECT $1::text, …, $8::bigint, NULL
//!   WHERE NOT EXISTS (SELECT 1 FROM "public"."_ddbpipe_deleted" d WHERE d.table_name = $10::text
//!     AND d.key_text = $11::text AND (d.version_ms IS NULL OR d.version_ms > $9::bigint))
//!   ON CONFLICT (…) DO UPDATE SET … WHERE NOT (t."_ddbpipe_snapshot" IS NOT DISTINCT FROM
//!     EXCLUDED."_ddbpipe_snapshot" AND t."_ddbpipe_version_seq" IS NOT NULL
//!     AND (t."_ddbpipe_version_ms" IS NULL OR t."_ddbpipe_version_ms" > $9::bigint));
//! -- a repair's upsert keeps or replaces the document and every typed column alike:
//! … DO UPDATE SET "doc" = CASE WHEN <the row is older> THEN EXCLUDED."doc" ELSE t."doc" END,
//!   "total" = CASE WHEN <the row is older> THEN EXCLUDED."total" ELSE t."total" END, …;
//! DELETE FROM "public"."orders" WHERE "customer" = $1::text AND "order_id" = $2::text::numeric;
//! -- after a delete while a snapshot is open, in the same transaction:
//! INSERT INTO "public"."_ddbpipe_deleted" AS d (table_name, key_text, version_ms)
//!   VALUES ($1::text, $2::text, $3::bigint) ON CONFLICT (table_name, key_text) DO UPDATE …;
//! ```
//!
//! Which statement a row change takes is `crate::sql::plan`'s decision, the same as SQLite's.
//! Each is one statement, so a batch stays one pipelined round trip. A batch of upserts of one
//! kind with distinct keys (a scan's items, a snapshot's pages) is instead copied straight
//! into the table while its keys are new there, or else into a temporary staging table and
//! merged by one `INSERT … SELECT` with the same casts, conflict update and guards; a batch of
//! stream changes is staged and merged by one statement too (`bulk`). A table of an earlier
//! ddbpipe gets the version columns it lacks and a `timestamptz` `_ddbpipe_updated_at` from
//! `prepare` (`migrate`; both need the table's owner, and `check` says so when this role is
//! not). The typed columns a table lacks are added by `prepare` and filled from the rows'
//! documents (`fill`; the owner too), after `crate::columns::plan` compared the configured
//! columns with the table (refusing what it refuses, also in `check`).
//!
//! Typed columns' values are bound as their text (`ColumnValue::sql_text`) and cast to the
//! column's type (`$n::text::numeric`, `::text::bigint`, `::text::float8`, `::text::boolean`,
//! `::text::timestamptz`, `::text::jsonb`), and go as that text in `COPY`. A `text` or `jsonb`
//! value holding U+0000 is a mismatch of its column (`document` rule 4).
//!
//! Numbers are bound as text and cast by the server, so they stay exact; documents are bound
//! as text and cast to the document type (`jsonb`, `json` or `text`: see `document` for the
//! U+0000 that `jsonb` cannot hold; a plain `json`/`jsonb` document has every number as a JSON
//! number, docs/values.md §3.7), state values to `jsonb`; `_ddbpipe_updated_at` is bound as
//! RFC 3339 UTC with milliseconds and stored as `timestamptz`.
//!
//! # Transactions
//! [`apply`](PostgresDatabase::apply) is one transaction: every row change in slice order,
//! then the state parts, then `COMMIT`. The statements are prepared once per connection and
//! executed pipelined (sent in order without waiting for each reply), so several changes to one
//! key in a batch end in the last. Any error rolls back the rows and the state together. The
//! scripts of `crate::database` (closing a snapshot or a repair window, the shared snapshot
//! record, storing the state) run in one transaction each too, on this backend's dialect and
//! primitives (`script`): a batch share-locks the shared snapshot record (`FOR SHARE`), its
//! close locks it alone (`FOR UPDATE`).
//!
//! # The state table's schema
//! `apply` and the scripts with a table spec (closing a snapshot or a repair window, the
//! shared snapshot record, counting rows) use the spec's schema (`spec.schema`). The calls
//! without a spec (`prepare_state`, `store_state`, `load_state`, `reset_state`,
//! `fence_position`) use the handle's
//! state schema: `public`, or the one given to [`PostgresDatabase::with_schema`], or the schema of
//! the last [`prepare`](PostgresDatabase::prepare).
//!
//! # Retry classification (docs/errors.md §9.4)
//! Retryable: connection loss (closed client, I/O errors, SQLSTATE class `08`, `57P01` admin
//! shutdown, `57P02` crash shutdown, `57P03` cannot connect now), `40001` serialization failure,
//! `40P01` deadlock, `53300` too many connections. Everything else is fatal.
//!
//! # Lock (docs/state.md §6.6)
//! A session advisory lock: key = FNV-1a 64 of `"ddbpipe:" + schema + ":" + pipeline` (as `bigint`), taken with
//! `pg_try_advisory_lock` and held by the handle's session until the last clone is dropped (the
//! server frees it when the session ends). Once it has the lock, the session also takes the
//! shared advisory lock `(PID_MARKER, <ddbpipe's pid>)`; another run finds the backend holding
//! the pipeline lock in `pg_locks` and reports the pid of that backend's marker, i.e. the
//! ddbpipe process, not the PostgreSQL backend.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use self::conninfo::ConnInfo;
use self::schema::{create_state_sql, ddl_locked};
use self::script::Script;
use self::session::{HeldLock, Shared, holder, lock_key, try_lock};
use self::sql::{check_identifier, spec_context, table_context, validate};
use crate::backend::{Backend, Session as ScriptSession};
use crate::sql::STATE_TABLE;
use crate::{
    ColumnCheck, ColumnValue, DbError, LockAttempt, LockHolder, RowChange, StateWrite, TableSpec,
    TypedColumns,
};

mod apply;
mod bulk;
mod conninfo;
mod copy_binary;
pub mod copy_text;
pub use conninfo::ENVIRONMENT as LIBPQ_ENVIRONMENT;
mod document;
mod fill;
mod migrate;
mod prepare;
mod schema;
mod script;
mod session;
mod sql;
mod tls;

/// A postgres destination database (a cheap handle: clones share the connection).
#[derive(Clone)]
pub struct PostgresDatabase {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDatabase")
            .field("location", &self.shared.location)
            .finish_non_exhaustive()
    }
}

impl PostgresDatabase {
    /// Connects with a libpq-style URL or key=value string, honouring `sslmode` (`disable`,
    /// `prefer`, `require`). Errors never show the password.
    pub async fn connect(url: &str) -> Result<Self, DbError> {
        Self::connect_with(url, &[]).await
    }

    /// [`connect`](Self::connect), with `defaults` (parameter, value) for the parameters the
    /// string does not name: the libpq environment variables of [`conninfo::ENVIRONMENT`]
    /// (`PGPASSWORD`, `PGHOST`, …), read by the caller when it loads its configuration.
    pub async fn connect_with(url: &str, defaults: &[(&str, String)]) -> Result<Self, DbError> {
        Ok(PostgresDatabase {
            shared: Arc::new(Shared::connect(url, defaults).await?),
        })
    }

    /// Sets the schema of `_ddbpipe_state` for the calls without a table spec (`prepare_state`,
    /// `store_state`, `load_state`, `reset_state`): the sink's schema, so that reading the state
    /// before [`prepare`](Self::prepare) looks where the pipeline writes it. Default `public`;
    /// `prepare` sets it to its spec's schema.
    pub fn with_schema(self, schema: &str) -> Self {
        self.shared.set_state_schema(schema);
        self
    }

    /// Checks a connection string without connecting: `Err` says what is wrong, naming a key
    /// or a position but never a value, so it may be shown.
    pub fn check_url(url: &str) -> Result<(), String> {
        let parsed = ConnInfo::parse(url).map_err(|e| e.problem)?;
        parsed.config().map(drop)
    }

    /// Where a connection string leads, read without connecting: `host:port/database` as
    /// [`connect_with`](Self::connect_with) would connect with `defaults` — never a user name
    /// or a password. `Err` says what is wrong, naming a key but never a value.
    pub fn address(url: &str, defaults: &[(&str, String)]) -> Result<String, String> {
        let parsed = ConnInfo::parse(url).map_err(|e| e.problem)?;
        let config = parsed.config_with(defaults)?;
        Ok(session::location(&config))
    }

    /// The connection string with every password replaced by `***`, from the same parse
    /// [`connect`](Self::connect) uses (see `conninfo`): the URL form (`postgres://user:pw@host/db`,
    /// a `password=` query parameter) and the key=value form (`host=h password='p w'`). When the
    /// string does not parse, everything from the unparsable point on is hidden too.
    pub fn redact(url: &str) -> String {
        conninfo::redact(url)
    }

    pub(crate) fn describe(&self) -> String {
        format!("postgres {}", self.shared.location)
    }

    /// Where it is connected: `host:port/database`, never a user or a password.
    pub fn location(&self) -> &str {
        &self.shared.location
    }

    /// Runs `work` on the connection in one turn of the session (reconnecting when it was
    /// lost), for tables that are not a keyed sink's (the Iceberg sink's SQL catalog). A
    /// failure is told with `context`, never with the password.
    pub async fn run<T>(
        &self,
        context: &str,
        work: impl for<'c> FnOnce(
            &'c mut tokio_postgres::Client,
        ) -> BoxFuture<'c, Result<T, tokio_postgres::Error>>,
    ) -> Result<T, DbError> {
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            Ok(work(client).await?)
        }
        .await;
        session.finish(&self.shared, context, result)
    }

    pub(crate) async fn prepare_state(&self) -> Result<(), DbError> {
        let schema = self.shared.state_schema();
        let context = table_context(&schema, STATE_TABLE);
        check_identifier(&schema, "schema", &context)?;
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            client
                .batch_execute(&ddl_locked(&schema, &create_state_sql(&schema)))
                .await?;
            Ok(())
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    /// What a run does first: refuses a session that cannot write (a standby, a read-only
    /// session, a too short `statement_timeout`), then creates or checks the tables (`prepare`
    /// module) and adds the columns the table lacks, filled by `columns` (`fill`).
    pub(crate) async fn prepare(
        &self,
        spec: &TableSpec,
        columns: Option<&TypedColumns>,
    ) -> Result<(), DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let server = self.describe();
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            prepare::writable_session(&*client, &server).await?;
            let plan = prepare::create_tables(&*client, spec, migrate::Conversion::Convert).await?;
            plan.warn_unused(&context);
            if plan.alters() {
                fill::add_columns(client, spec, columns).await?;
            }
            Ok(())
        }
        .await;
        let result = session.finish(&self.shared, &context, result);
        if result.is_ok() {
            self.shared.set_state_schema(&spec.schema);
        }
        result
    }

    /// The plan of the table's document and typed columns, as `prepare` would carry it out
    /// (`crate::columns::plan`); reads only.
    pub(crate) async fn check_columns(&self, spec: &TableSpec) -> Result<ColumnCheck, DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            match schema::inspect(&*client, spec).await? {
                Some(existing) => {
                    let rows = schema::has_rows(&*client, spec).await?;
                    Ok(existing.plan(spec, rows).check(spec))
                }
                None => Ok(ColumnCheck::default()),
            }
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn lock(&self, pipeline: &str) -> Result<LockAttempt, DbError> {
        let key = lock_key(&self.shared.state_schema(), pipeline);
        let location = self.lock_location(key);
        let mut session = self.shared.session.lock().await;
        if session.locks.iter().any(|held| held.key == key) {
            return Ok(LockAttempt::Acquired);
        }
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            if try_lock(client, key).await? {
                Ok(None)
            } else {
                Ok(Some(holder(client, key).await?.flatten()))
            }
        }
        .await;
        match session.finish(&self.shared, &location, result)? {
            None => {
                session.locks.push(HeldLock {
                    pipeline: pipeline.to_string(),
                    key,
                });
                Ok(LockAttempt::Acquired)
            }
            Some(pid) => Ok(LockAttempt::HeldBy(LockHolder { location, pid })),
        }
    }

    pub(crate) async fn lock_holder(&self, pipeline: &str) -> Result<Option<LockHolder>, DbError> {
        let key = lock_key(&self.shared.state_schema(), pipeline);
        let location = self.lock_location(key);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            Ok(holder(client, key).await?)
        }
        .await;
        let holder = session.finish(&self.shared, &location, result)?;
        Ok(holder.map(|pid| LockHolder { location, pid }))
    }

    /// `check`'s probe: what [`prepare`](Self::prepare) checks and runs, its DDL in a
    /// transaction rolled back (`prepare` module). Returns what it found.
    pub(crate) async fn probe(&self, spec: &TableSpec) -> Result<String, DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let server = self.describe();
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            let detail = prepare::probe(client, spec, &server).await?;
            Ok(format!("{}: {detail}", self.shared.location))
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    fn lock_location(&self, key: i64) -> String {
        format!("postgres advisory lock {key} on {}", self.shared.location)
    }
}

impl From<PostgresDatabase> for crate::Database {
    fn from(db: PostgresDatabase) -> Self {
        crate::Database::of(Arc::new(db))
    }
}

impl Backend for PostgresDatabase {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn same_name(&self, a: &str, b: &str) -> bool {
        (schema::NAMING.same)(a, b)
    }

    fn check_names(&self, spec: &TableSpec) -> Result<(), DbError> {
        validate(spec)
    }

    fn stores(&self, value: &ColumnValue) -> bool {
        document::stores(value)
    }

    fn session<'a>(
        &'a self,
        spec: Option<&'a TableSpec>,
        about: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn ScriptSession + 'a>, DbError>> {
        Box::pin(async move {
            let schema = spec.map_or_else(|| self.shared.state_schema(), |s| s.schema.clone());
            let script = Script::take(&self.shared, schema, about).await?;
            Ok(Box::new(script) as Box<dyn ScriptSession + 'a>)
        })
    }

    crate::backend::own_methods!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_urls() {
        let cases = [
            (
                "postgres://app:s3cret@db:5432/app?sslmode=require",
                "postgres://app:***@db:5432/app?sslmode=require",
            ),
            ("postgresql://app@db/app", "postgresql://app@db/app"),
            ("postgres://db/app", "postgres://db/app"),
            (
                "postgres://app:p@ss/w?rd@db/app",
                "postgres://app:***@db/app",
            ),
            (
                "postgres://db/app?password=s3cret&application_name=a@b",
                "postgres://db/app?password=***&application_name=a@b",
            ),
            (
                "postgres://app@db/app?password=s3cret&sslmode=disable",
                "postgres://app@db/app?password=***&sslmode=disable",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(PostgresDatabase::redact(url), want, "{url}");
        }
    }

    #[test]
    fn redacts_key_values() {
        let cases = [
            (
                "host=db password=s3cret dbname=app",
                "host=db password=*** dbname=app",
            ),
            (
                "host=db password = 'se cr\\'et' user=app",
                "host=db password = *** user=app",
            ),
            ("password=s3cret", "password=***"),
            ("host=db user=app", "host=db user=app"),
            ("host='db password=s3cret", "host=***"),
            ("host=db password", "host=db ***"),
        ];
        for (s, want) in cases {
            assert_eq!(PostgresDatabase::redact(s), want, "{s}");
        }
    }
}
