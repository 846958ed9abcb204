//! The PostgreSQL backend (SPEC §6.5, §6.6, §7.3, §7.4, §9.4).
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
//!   "doc" jsonb NOT NULL,                  -- or json / text: sink.document_type
//!   "_ddbpipe_snapshot" bigint, "_ddbpipe_updated_at" text NOT NULL,
//!   PRIMARY KEY ("customer", "order_id"));
//! CREATE TABLE IF NOT EXISTS "public"."_ddbpipe_state" (pipeline text NOT NULL,
//!   part text NOT NULL, value jsonb NOT NULL, updated_at text NOT NULL,
//!   PRIMARY KEY (pipeline, part));
//! -- a snapshot row (marker = the snapshot id); a change row leaves the marker out of the
//! -- conflict update, so an existing row keeps it and a new row has null:
//! INSERT INTO "public"."orders" (…keys, "doc", "_ddbpipe_snapshot", "_ddbpipe_updated_at")
//!   VALUES ($1::text, $2::text::numeric, $3::text::jsonb, $4::bigint, $5::text)
//!   ON CONFLICT ("customer", "order_id") DO UPDATE SET "doc" = EXCLUDED."doc",
//!   "_ddbpipe_snapshot" = EXCLUDED."_ddbpipe_snapshot",
//!   "_ddbpipe_updated_at" = EXCLUDED."_ddbpipe_updated_at";
//! DELETE FROM "public"."orders" WHERE "customer" = $1::text AND "order_id" = $2::text::numeric;
//! ```
//!
//! Numbers are bound as text and cast by the server, so they stay exact; documents are bound
//! as text and cast to the document type (`jsonb`, `json` or `text`: see `document` for the
//! U+0000 that `jsonb` cannot hold), state values to `jsonb`; `_ddbpipe_updated_at` is RFC
//! 3339 UTC with milliseconds.
//!
//! # Transactions
//! [`apply`](PostgresDatabase::apply) is one transaction: every row change in slice order,
//! then the state parts, then `COMMIT`. The statements are prepared once per connection and
//! executed pipelined (sent in order without waiting for each reply), so several changes to one
//! key in a batch end in the last. Any error rolls back the rows and the state together.
//! [`close_snapshot`](PostgresDatabase::close_snapshot) counts, deletes and writes the state in
//! one transaction too.
//!
//! # The state table's schema
//! `apply` and `close_snapshot` write the state next to the table (`spec.schema`). The calls
//! without a spec (`prepare_state`, `store_state`, `load_state`, `reset_state`) use the handle's
//! state schema: `public`, or the one given to [`PostgresDatabase::with_schema`], or the schema of
//! the last [`prepare`](PostgresDatabase::prepare).
//!
//! # Retry classification (SPEC §9.4)
//! Retryable: connection loss (closed client, I/O errors, SQLSTATE class `08`, `57P01` admin
//! shutdown, `57P02` crash shutdown, `57P03` cannot connect now), `40001` serialization failure,
//! `40P01` deadlock, `53300` too many connections. Everything else is fatal.
//!
//! # Lock (SPEC §6.6)
//! A session advisory lock: key = FNV-1a 64 of `"ddbpipe:" + schema + ":" + pipeline` (as `bigint`), taken with
//! `pg_try_advisory_lock` and held by the handle's session until the last clone is dropped (the
//! server frees it when the session ends). Once it has the lock, the session also takes the
//! shared advisory lock `(PID_MARKER, <ddbpipe's pid>)`; another run finds the backend holding
//! the pipeline lock in `pg_locks` and reports the pid of that backend's marker, i.e. the
//! ddbpipe process, not the PostgreSQL backend.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::future::try_join_all;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Statement, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use self::conninfo::ConnInfo;
use crate::{
    CloseSnapshot, Closed, DbError, KeyType, KeyValue, LockHolder, RowChange, StateWrite, TableSpec,
};

mod conninfo;
mod document;

const STATE_TABLE: &str = "_ddbpipe_state";
const SNAPSHOT_COLUMN: &str = "_ddbpipe_snapshot";
const UPDATED_AT_COLUMN: &str = "_ddbpipe_updated_at";
/// PostgreSQL truncates longer identifiers (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;
/// The first key of the shared two-int4 advisory lock `(PID_MARKER, pid)` a session takes
/// beside a pipeline lock, so that another ddbpipe can name the process holding it ("ddbp").
const PID_MARKER: i32 = 0x6464_6270;
/// The connect timeout when the connection string sets none.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

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

/// What every clone shares.
struct Shared {
    /// The parsed connection string (holds the password; never printed).
    config: Config,
    /// TLS for `prefer`/`require` over TCP; `None` for `disable` or unix sockets.
    tls: Option<MakeRustlsConnect>,
    /// "host:port/db".
    location: String,
    /// The password, to scrub from any message as a second line of defence.
    password: Option<String>,
    /// The schema of `_ddbpipe_state` for the calls without a spec.
    state_schema: StdMutex<String>,
    /// The connection; the lock also serialises the calls.
    session: tokio::sync::Mutex<Session>,
}

/// The current connection and what belongs to it.
struct Session {
    client: Option<Client>,
    /// Prepared statements of this connection, by SQL text.
    statements: HashMap<String, Statement>,
    /// Advisory locks taken through this handle (re-taken after a reconnect).
    locks: Vec<HeldLock>,
}

struct HeldLock {
    pipeline: String,
    key: i64,
}

/// An error inside an operation: a driver error still to classify, or a finished one.
enum Failure {
    Pg(tokio_postgres::Error),
    Db(DbError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl From<DbError> for Failure {
    fn from(e: DbError) -> Self {
        Failure::Db(e)
    }
}

impl PostgresDatabase {
    /// Connects with a libpq-style URL or key=value string, honouring `sslmode` (`disable`,
    /// `prefer`, `require`). Errors never show the password.
    pub async fn connect(url: &str) -> Result<Self, DbError> {
        let unusable = |shown: &str, problem: &str| {
            DbError::fatal(format!("postgres connection string '{shown}': {problem}"))
        };
        let parsed = ConnInfo::parse(url).map_err(|e| unusable(&e.redacted, &e.problem))?;
        let mut config = parsed
            .config()
            .map_err(|problem| unusable(&parsed.redacted(), &problem))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("ddbpipe");
        }
        let location = location(&config);
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let any_tcp = config.get_hosts().iter().any(|h| matches!(h, Host::Tcp(_)))
            || !config.get_hostaddrs().is_empty();
        let tls = if config.get_ssl_mode() != SslMode::Disable && any_tcp {
            Some(MakeRustlsConnect::new(tls_config().map_err(|e| {
                DbError::fatal(format!("postgres {location}: TLS setup: {e}"))
            })?))
        } else {
            None
        };
        let shared = Shared {
            config,
            tls,
            location,
            password,
            state_schema: StdMutex::new("public".to_string()),
            session: tokio::sync::Mutex::new(Session {
                client: None,
                statements: HashMap::new(),
                locks: Vec::new(),
            }),
        };
        let client = shared.open().await?;
        shared.session.lock().await.client = Some(client);
        Ok(PostgresDatabase {
            shared: Arc::new(shared),
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

    pub(crate) async fn prepare_state(&self) -> Result<(), DbError> {
        let schema = self.shared.state_schema();
        let context = table_context(&schema, STATE_TABLE);
        check_identifier(&schema, "schema", &context)?;
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            client.batch_execute(&create_state_sql(&schema)).await?;
            Ok(())
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn prepare(&self, spec: &TableSpec) -> Result<(), DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            match inspect(client, spec).await? {
                Some(existing) => existing.check(spec)?,
                None if !spec.create_table => {
                    return Err(DbError::fatal(format!(
                        "{context} does not exist and create_table is false"
                    ))
                    .into());
                }
                None => {
                    client.batch_execute(&create_table_sql(spec)).await?;
                    // Re-read what is there: another run may have created it meanwhile.
                    match inspect(client, spec).await? {
                        Some(existing) => existing.check(spec)?,
                        None => {
                            return Err(DbError::fatal(format!(
                                "{context} is missing right after CREATE TABLE"
                            ))
                            .into());
                        }
                    }
                }
            }
            client
                .batch_execute(&create_state_sql(&spec.schema))
                .await?;
            Ok(())
        }
        .await;
        let result = session.finish(&self.shared, &context, result);
        if result.is_ok() {
            self.shared.set_state_schema(&spec.schema);
        }
        result
    }

    pub(crate) async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        for row in rows {
            match row {
                RowChange::Upsert {
                    key,
                    snapshot,
                    document,
                } => {
                    check_key(spec, key)?;
                    if let Some(path) = document::unstorable(spec.document_type, document) {
                        return Err(DbError::fatal(format!(
                            "{context}: the item with key {} holds U+0000 in attribute '{path}', \
                             which a jsonb document cannot store; set sink.document_type: json \
                             (keeps the document exactly) or text",
                            document::describe_key(&spec.key, key)
                        )));
                    }
                    if *snapshot && snapshot_id.is_none() {
                        return Err(DbError::fatal(format!(
                            "{context}: a snapshot row without an open snapshot id"
                        )));
                    }
                }
                RowChange::Delete { key } => check_key(spec, key)?,
            }
        }
        // Rows carry the time of the state they commit with, so a reader can match them.
        let updated_at = if state.updated_at.is_empty() {
            now_rfc3339()
        } else {
            state.updated_at.clone()
        };
        let snapshot_id = snapshot_id.unwrap_or_default();
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, cache) = session.connected(&self.shared).await?;
            let needs = |f: fn(&RowChange) -> bool| rows.iter().any(f);
            let upsert_snapshot =
                if needs(|r| matches!(r, RowChange::Upsert { snapshot: true, .. })) {
                    Some(statement(client, cache, upsert_sql(spec, true)).await?)
                } else {
                    None
                };
            let upsert_change = if needs(|r| {
                matches!(
                    r,
                    RowChange::Upsert {
                        snapshot: false,
                        ..
                    }
                )
            }) {
                Some(statement(client, cache, upsert_sql(spec, false)).await?)
            } else {
                None
            };
            let delete = if needs(|r| matches!(r, RowChange::Delete { .. })) {
                Some(statement(client, cache, delete_sql(spec)).await?)
            } else {
                None
            };
            let state_statements = StateStatements::get(client, cache, &spec.schema, state).await?;

            let mut calls: Vec<(&Statement, Vec<&(dyn ToSql + Sync)>)> =
                Vec::with_capacity(rows.len() + state.upserts.len() + state.deletes.len());
            for row in rows {
                match row {
                    RowChange::Upsert {
                        key,
                        document,
                        snapshot,
                    } => {
                        let mut params: Vec<&(dyn ToSql + Sync)> =
                            key.iter().map(key_param).collect();
                        params.push(document);
                        let statement = if *snapshot {
                            params.push(&snapshot_id);
                            upsert_snapshot.as_ref()
                        } else {
                            upsert_change.as_ref()
                        };
                        params.push(&updated_at);
                        calls.push((prepared(statement)?, params));
                    }
                    RowChange::Delete { key } => {
                        let params = key.iter().map(key_param).collect();
                        calls.push((prepared(delete.as_ref())?, params));
                    }
                }
            }
            state_statements.push_calls(state, &mut calls)?;

            let tx = client.transaction().await?;
            let written = execute_pipelined(&tx, &calls).await;
            end_transaction(tx, written).await
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn store_state(&self, state: &StateWrite) -> Result<(), DbError> {
        if state.is_empty() {
            return Ok(());
        }
        let schema = self.shared.state_schema();
        let context = table_context(&schema, STATE_TABLE);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, cache) = session.connected(&self.shared).await?;
            let statements = StateStatements::get(client, cache, &schema, state).await?;
            let mut calls = Vec::new();
            statements.push_calls(state, &mut calls)?;
            let tx = client.transaction().await?;
            let written = execute_pipelined(&tx, &calls).await;
            end_transaction(tx, written).await
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn load_state(
        &self,
        pipeline: &str,
    ) -> Result<BTreeMap<String, String>, DbError> {
        let schema = self.shared.state_schema();
        let context = table_context(&schema, STATE_TABLE);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, cache) = session.connected(&self.shared).await?;
            let sql = format!(
                "SELECT part, value::text FROM {} WHERE pipeline = $1",
                qualified(&schema, STATE_TABLE)
            );
            let rows = match statement(client, cache, sql).await {
                Ok(select) => client.query(&select, &[&pipeline]).await,
                Err(e) => Err(e),
            };
            match rows {
                Ok(rows) => rows
                    .iter()
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                    .collect::<Result<BTreeMap<_, _>, tokio_postgres::Error>>()
                    .map_err(Failure::Pg),
                Err(e) if is_missing_relation(&e) => Ok(BTreeMap::new()),
                Err(e) => Err(e.into()),
            }
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn reset_state(&self, pipeline: &str) -> Result<bool, DbError> {
        let schema = self.shared.state_schema();
        let context = table_context(&schema, STATE_TABLE);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            let sql = format!(
                "DELETE FROM {} WHERE pipeline = $1::text",
                qualified(&schema, STATE_TABLE)
            );
            match client.execute(&sql, &[&pipeline]).await {
                Ok(deleted) => Ok(deleted > 0),
                Err(e) if is_missing_relation(&e) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn count_rows(&self, spec: &TableSpec) -> Result<u64, DbError> {
        let context = spec_context(spec);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            let sql = format!(
                "SELECT count(*) FROM {}",
                qualified(&spec.schema, &spec.table)
            );
            match client.query_one(&sql, &[]).await {
                Ok(row) => Ok(count(row.try_get(0)?)),
                Err(e) if is_missing_relation(&e) => Ok(0),
                Err(e) => Err(e.into()),
            }
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn close_snapshot(
        &self,
        spec: &TableSpec,
        close: CloseSnapshot,
        state: &StateWrite,
    ) -> Result<Closed, DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let table = qualified(&spec.schema, &spec.table);
        let marker = quote(SNAPSHOT_COLUMN);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, cache) = session.connected(&self.shared).await?;
            let state_statements = StateStatements::get(client, cache, &spec.schema, state).await?;
            let mut calls = Vec::new();
            state_statements.push_calls(state, &mut calls)?;
            let tx = client.transaction().await?;
            let closed = async {
                let count_sql = format!("SELECT count(*) FROM {table} WHERE {marker} = $1::bigint");
                let keys_written = count(tx.query_one(&count_sql, &[&close.id]).await?.try_get(0)?);
                let mut closed = Closed {
                    keys_written,
                    deleted: 0,
                    ceiling_hit: false,
                };
                if close.delete_unseen {
                    if keys_written <= close.max_keys {
                        let delete_sql = format!(
                            "DELETE FROM {table} WHERE {marker} IS DISTINCT FROM $1::bigint"
                        );
                        closed.deleted = tx.execute(&delete_sql, &[&close.id]).await?;
                    } else {
                        closed.ceiling_hit = true;
                    }
                }
                execute_pipelined(&tx, &calls).await?;
                Ok(closed)
            }
            .await;
            end_transaction(tx, closed).await
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    pub(crate) async fn lock(&self, pipeline: &str) -> Result<(), Result<LockHolder, DbError>> {
        let key = lock_key(&self.shared.state_schema(), pipeline);
        let location = self.lock_location(key);
        let mut session = self.shared.session.lock().await;
        if session.locks.iter().any(|held| held.key == key) {
            return Ok(());
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
        match session.finish(&self.shared, &location, result) {
            Ok(None) => {
                session.locks.push(HeldLock {
                    pipeline: pipeline.to_string(),
                    key,
                });
                Ok(())
            }
            Ok(Some(pid)) => Err(Ok(LockHolder { location, pid })),
            Err(e) => Err(Err(e)),
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

    pub(crate) async fn probe(&self, spec: &TableSpec) -> Result<String, DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let display = format!("{}.{}", spec.schema, spec.table);
        let mut session = self.shared.session.lock().await;
        let result = async {
            let (client, _) = session.connected(&self.shared).await?;
            let client: &Client = client;
            let schema_oid: Option<u32> = client
                .query_opt(
                    "SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1::text",
                    &[&spec.schema],
                )
                .await?
                .map(|row| row.try_get(0))
                .transpose()?;
            let Some(schema_oid) = schema_oid else {
                return Err(DbError::fatal(format!(
                    "{context}: schema '{}' does not exist",
                    spec.schema
                ))
                .into());
            };
            let schema_rights = |right: &'static str| async move {
                let row = client
                    .query_one(
                        "SELECT pg_catalog.has_schema_privilege($1::oid, $2::text)",
                        &[&schema_oid, &right],
                    )
                    .await?;
                row.try_get::<_, bool>(0)
            };
            if !schema_rights("USAGE").await? {
                return Err(DbError::fatal(format!(
                    "{context}: no USAGE right on schema '{}'",
                    spec.schema
                ))
                .into());
            }
            let can_create = schema_rights("CREATE").await?;
            let detail = match inspect(client, spec).await? {
                Some(existing) => {
                    existing.check(spec)?;
                    missing_rights(client, existing.oid, &context).await?;
                    let rows: i64 = client
                        .query_one(
                            &format!(
                                "SELECT count(*) FROM {}",
                                qualified(&spec.schema, &spec.table)
                            ),
                            &[],
                        )
                        .await?
                        .try_get(0)?;
                    format!("table '{display}' exists, {} row(s)", count(rows))
                }
                None if !spec.create_table => {
                    return Err(DbError::fatal(format!(
                        "{context} does not exist and create_table is false"
                    ))
                    .into());
                }
                None if !can_create => {
                    return Err(DbError::fatal(format!(
                        "{context} does not exist and there is no CREATE right on schema '{}' to create it",
                        spec.schema
                    ))
                    .into());
                }
                None => format!("table '{display}' will be created"),
            };
            let state_context = table_context(&spec.schema, STATE_TABLE);
            match relation(client, &spec.schema, STATE_TABLE).await? {
                Some((oid, _)) => missing_rights(client, oid, &state_context).await?,
                None if !can_create => {
                    return Err(DbError::fatal(format!(
                        "{state_context} does not exist and there is no CREATE right on schema '{}' to create it",
                        spec.schema
                    ))
                    .into());
                }
                None => {}
            }
            Ok(format!("{}: {detail}", self.shared.location))
        }
        .await;
        session.finish(&self.shared, &context, result)
    }

    fn lock_location(&self, key: i64) -> String {
        format!("postgres advisory lock {key} on {}", self.shared.location)
    }
}

impl Shared {
    /// Opens a new connection and spawns its task.
    async fn open(&self) -> Result<Client, DbError> {
        let connected = match &self.tls {
            Some(tls) => match self.config.connect(tls.clone()).await {
                Ok((client, connection)) => {
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "postgres connection ended");
                        }
                    });
                    Ok(client)
                }
                Err(e) => Err(e),
            },
            None => match self.config.connect(NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "postgres connection ended");
                        }
                    });
                    Ok(client)
                }
                Err(e) => Err(e),
            },
        };
        connected.map_err(|e| {
            let (retryable, _) = classify(&e);
            DbError {
                message: self.scrub(format!(
                    "postgres {}: cannot connect: {}",
                    self.location,
                    error_text(&e)
                )),
                retryable,
            }
        })
    }

    /// Hides the password should it appear in a message (passwords shorter than 4 characters
    /// are left alone: replacing them would garble the message).
    fn scrub(&self, message: String) -> String {
        match &self.password {
            Some(password) if password.chars().count() >= 4 && message.contains(password) => {
                message.replace(password, "***")
            }
            _ => message,
        }
    }

    fn state_schema(&self) -> String {
        match self.state_schema.lock() {
            Ok(schema) => schema.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_state_schema(&self, schema: &str) {
        let mut guard = match self.state_schema.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = schema.to_string();
    }
}

impl Session {
    /// The live connection, reconnecting (and re-taking the locks) when there is none.
    async fn connected(
        &mut self,
        shared: &Shared,
    ) -> Result<(&mut Client, &mut HashMap<String, Statement>), Failure> {
        let client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => {
                self.statements.clear();
                let client = shared.open().await?;
                for held in &self.locks {
                    if !try_lock(&client, held.key).await? {
                        let pid = holder(&client, held.key).await?.flatten();
                        return Err(DbError::fatal(format!(
                            "postgres advisory lock {} on {}: the connection was lost and another run{} now holds the lock of pipeline '{}'",
                            held.key,
                            shared.location,
                            pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
                            held.pipeline
                        ))
                        .into());
                    }
                }
                client
            }
        };
        let client = self.client.insert(client);
        Ok((client, &mut self.statements))
    }

    /// Turns an operation's failure into a [`DbError`] with `context`, dropping the connection
    /// when it was lost.
    fn finish<T>(
        &mut self,
        shared: &Shared,
        context: &str,
        result: Result<T, Failure>,
    ) -> Result<T, DbError> {
        match result {
            Ok(value) => Ok(value),
            Err(Failure::Db(e)) => Err(DbError {
                message: shared.scrub(e.message),
                retryable: e.retryable,
            }),
            Err(Failure::Pg(e)) => {
                let (retryable, lost) = classify(&e);
                if lost || self.client.as_ref().is_some_and(Client::is_closed) {
                    self.client = None;
                    self.statements.clear();
                }
                Err(DbError {
                    message: shared.scrub(format!("{context}: {}", error_text(&e))),
                    retryable,
                })
            }
        }
    }
}

/// Whether an error is retryable, and whether the connection is lost.
fn classify(e: &tokio_postgres::Error) -> (bool, bool) {
    if e.is_closed() {
        return (true, true);
    }
    if let Some(code) = e.code() {
        let code = code.code();
        let lost = code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
        return (lost || matches!(code, "40001" | "40P01" | "53300"), lost);
    }
    // No SQLSTATE: an I/O error (reset, refused, timed out) means the connection is gone.
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return (true, true);
        }
        source = cause.source();
    }
    (false, false)
}

/// The server's message (with its detail) for database errors, else the driver's.
fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = db.message().to_string();
            if let Some(detail) = db.detail() {
                let _ = write!(text, " ({detail})");
            }
            text
        }
        None => e.to_string(),
    }
}

/// Undefined table or schema (a table or state that was never created).
fn is_missing_relation(e: &tokio_postgres::Error) -> bool {
    e.code()
        .is_some_and(|code| matches!(code.code(), "42P01" | "3F000"))
}

/// A cached prepared statement of this connection.
async fn statement(
    client: &Client,
    cache: &mut HashMap<String, Statement>,
    sql: String,
) -> Result<Statement, tokio_postgres::Error> {
    if let Some(statement) = cache.get(&sql) {
        return Ok(statement.clone());
    }
    let statement = client.prepare(&sql).await?;
    cache.insert(sql, statement.clone());
    Ok(statement)
}

fn prepared(statement: Option<&Statement>) -> Result<&Statement, Failure> {
    statement.ok_or_else(|| DbError::fatal("postgres: statement not prepared").into())
}

/// Sends every call at once, in order, and waits for all replies (the first error wins).
async fn execute_pipelined(
    tx: &Transaction<'_>,
    calls: &[(&Statement, Vec<&(dyn ToSql + Sync)>)],
) -> Result<(), Failure> {
    // tokio-postgres sends a query when its future is first polled; try_join_all polls them in
    // order, so the server runs them in slice order.
    try_join_all(
        calls
            .iter()
            .map(|(statement, params)| tx.execute(*statement, params)),
    )
    .await?;
    Ok(())
}

/// Commits after success; rolls back after a failure (and reports the failure).
async fn end_transaction<T>(tx: Transaction<'_>, result: Result<T, Failure>) -> Result<T, Failure> {
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// The state statements a [`StateWrite`] needs.
struct StateStatements {
    upsert: Option<Statement>,
    delete: Option<Statement>,
}

impl StateStatements {
    async fn get(
        client: &Client,
        cache: &mut HashMap<String, Statement>,
        schema: &str,
        state: &StateWrite,
    ) -> Result<Self, tokio_postgres::Error> {
        let table = qualified(schema, STATE_TABLE);
        let upsert = if state.upserts.is_empty() {
            None
        } else {
            let sql = format!(
                "INSERT INTO {table} (pipeline, part, value, updated_at) \
                 VALUES ($1::text, $2::text, $3::text::jsonb, $4::text) \
                 ON CONFLICT (pipeline, part) DO UPDATE SET value = EXCLUDED.value, \
                 updated_at = EXCLUDED.updated_at"
            );
            Some(statement(client, cache, sql).await?)
        };
        let delete = if state.deletes.is_empty() {
            None
        } else {
            let sql = format!("DELETE FROM {table} WHERE pipeline = $1::text AND part = $2::text");
            Some(statement(client, cache, sql).await?)
        };
        Ok(StateStatements { upsert, delete })
    }

    fn push_calls<'a>(
        &'a self,
        state: &'a StateWrite,
        calls: &mut Vec<(&'a Statement, Vec<&'a (dyn ToSql + Sync)>)>,
    ) -> Result<(), Failure> {
        for (part, value) in &state.upserts {
            calls.push((
                prepared(self.upsert.as_ref())?,
                vec![&state.pipeline, part, value, &state.updated_at],
            ));
        }
        for part in &state.deletes {
            calls.push((prepared(self.delete.as_ref())?, vec![&state.pipeline, part]));
        }
        Ok(())
    }
}

/// An existing destination table.
struct Existing {
    oid: u32,
    /// Primary key columns in order: (name, type).
    key: Vec<(String, String)>,
    /// All columns: (name, type).
    columns: Vec<(String, String)>,
}

impl Existing {
    /// The same key columns (names, order, types) and the columns ddbpipe writes.
    fn check(&self, spec: &TableSpec) -> Result<(), DbError> {
        let context = spec_context(spec);
        let wanted: Vec<(String, String)> = spec
            .key
            .iter()
            .map(|k| (k.name.clone(), sql_type(k.kind).to_string()))
            .collect();
        if self.key != wanted {
            let list = |cols: &[(String, String)]| {
                if cols.is_empty() {
                    "(none)".to_string()
                } else {
                    let cols: Vec<String> = cols
                        .iter()
                        .map(|(name, kind)| format!("{} {kind}", quote(name)))
                        .collect();
                    format!("({})", cols.join(", "))
                }
            };
            return Err(DbError::fatal(format!(
                "{context} exists with primary key {} but the source table's key needs {}; \
                 drop the table or set sink.table to another name",
                list(&self.key),
                list(&wanted)
            )));
        }
        let missing: Vec<String> = [
            spec.document_column.as_str(),
            SNAPSHOT_COLUMN,
            UPDATED_AT_COLUMN,
        ]
        .into_iter()
        .filter(|column| !self.columns.iter().any(|(name, _)| name == column))
        .map(quote)
        .collect();
        if !missing.is_empty() {
            return Err(DbError::fatal(format!(
                "{context} exists without the column(s) {} that ddbpipe writes; \
                 drop the table or set sink.table to another name",
                missing.join(", ")
            )));
        }
        let wanted = spec.document_type.name();
        if let Some((_, found)) = self
            .columns
            .iter()
            .find(|(name, kind)| *name == spec.document_column && kind != wanted)
        {
            return Err(DbError::fatal(format!(
                "{context} exists with document column {} of type {found} but \
                 sink.document_type is {wanted}; set sink.document_type to match the table, \
                 or drop it or set sink.table to another name",
                quote(&spec.document_column)
            )));
        }
        Ok(())
    }
}

/// A relation's oid and kind, when it exists.
async fn relation(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<(u32, String)>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1::text AND c.relname = $2::text",
            &[&schema, &name],
        )
        .await?;
    row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .transpose()
}

/// The destination table's key and columns, when it exists.
async fn inspect(client: &Client, spec: &TableSpec) -> Result<Option<Existing>, Failure> {
    let Some((oid, kind)) = relation(client, &spec.schema, &spec.table).await? else {
        return Ok(None);
    };
    if kind != "r" && kind != "p" {
        return Err(DbError::fatal(format!(
            "{} exists but is not a table (relkind '{kind}')",
            spec_context(spec)
        ))
        .into());
    }
    let key = client
        .query(
            "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod) \
             FROM pg_catalog.pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1::oid AND i.indisprimary ORDER BY k.ord",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    let columns = client
        .query(
            "SELECT attname::text, pg_catalog.format_type(atttypid, atttypmod) \
             FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    Ok(Some(Existing { oid, key, columns }))
}

/// Fails naming the rights (of SELECT, INSERT, UPDATE, DELETE) missing on a table. Each right
/// is checked alone: `has_table_privilege` with a list is true when *any* is held.
async fn missing_rights(client: &Client, oid: u32, context: &str) -> Result<(), Failure> {
    let missing: Vec<String> = client
        .query(
            "SELECT r FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS r \
             WHERE NOT pg_catalog.has_table_privilege($1::oid, r)",
            &[&oid],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DbError::fatal(format!("{context}: no {} right(s)", missing.join(", "))).into())
    }
}

/// The pipeline's advisory lock key: FNV-1a 64 of `"ddbpipe:" + schema + ":" + pipeline`, as
/// a bigint. The state lives per schema, so one pipeline name may run once per schema.
fn lock_key(schema: &str, pipeline: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let name = format!("{schema}:{pipeline}");
    for byte in b"ddbpipe:".iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Takes the lock `key`; once it is ours, also records this process's pid beside it (see
/// [`PID_MARKER`]).
async fn try_lock(client: &Client, key: i64) -> Result<bool, tokio_postgres::Error> {
    let locked: bool = client
        .query_one(
            "SELECT pg_catalog.pg_try_advisory_lock($1::bigint)",
            &[&key],
        )
        .await?
        .try_get(0)?;
    if locked && let Ok(pid) = i32::try_from(std::process::id()) {
        // Shared: never conflicts, even with a process of the same pid on another host.
        client
            .query_one(
                "SELECT pg_catalog.pg_try_advisory_lock_shared($1::int4, $2::int4)",
                &[&PID_MARKER, &pid],
            )
            .await?;
    }
    Ok(locked)
}

/// The session holding the lock `key` (other than ours): `Some(pid)` with the pid of the
/// ddbpipe process it belongs to (`None` inside when that process recorded none), or `None`
/// when nobody else holds it.
async fn holder(client: &Client, key: i64) -> Result<Option<Option<u32>>, tokio_postgres::Error> {
    // A bigint advisory lock shows in pg_locks as classid = high 32 bits, objid = low 32 bits,
    // objsubid = 1, in the current database; a two-int4 one as classid, objid, objsubid = 2.
    // The holder's pid marker is the shared two-int4 lock (PID_MARKER, pid) of the same backend.
    let bits = u64::from_ne_bytes(key.to_ne_bytes());
    let high = i64::from((bits >> 32) as u32);
    let low = i64::from(bits as u32);
    let row = client
        .query_opt(
            "SELECT l.pid, (SELECT m.objid::text::bigint FROM pg_catalog.pg_locks m \
                WHERE m.locktype = 'advisory' AND m.granted AND m.pid = l.pid \
                AND m.database = l.database AND m.classid = $3::bigint::oid \
                AND m.objsubid = 2 LIMIT 1) \
             FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
             AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                               WHERE datname = pg_catalog.current_database()) \
             AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 1 \
             AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid() LIMIT 1",
            &[&high, &low, &i64::from(PID_MARKER)],
        )
        .await?;
    row.map(|row| {
        row.try_get::<_, Option<i64>>(1)
            .map(|pid| pid.and_then(|pid| u32::try_from(pid).ok()))
    })
    .transpose()
}

/// The rustls client configuration for `prefer`/`require`.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(
        rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate { provider }))
            .with_no_client_auth(),
    )
}

/// libpq's `sslmode=prefer` and `require` encrypt without verifying the server certificate
/// (`verify-ca`/`verify-full` do, and are not supported here): this verifier accepts any
/// certificate and name, while still checking the handshake signatures with the provider's
/// algorithms, so the session is encrypted but not authenticated.
#[derive(Debug)]
struct AnyServerCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// "host:port/db" of the first host.
fn location(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => config
            .get_hostaddrs()
            .first()
            .map(|addr| addr.to_string())
            .unwrap_or_else(|| "localhost".to_string()),
    };
    let host = if host.contains(':') && !host.starts_with('/') {
        format!("[{host}]")
    } else {
        host
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("{host}:{port}/{db}")
}

fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

fn qualified(schema: &str, table: &str) -> String {
    format!("{}.{}", quote(schema), quote(table))
}

fn table_context(schema: &str, table: &str) -> String {
    format!("postgres table '{schema}.{table}'")
}

fn spec_context(spec: &TableSpec) -> String {
    table_context(&spec.schema, &spec.table)
}

fn check_identifier(name: &str, what: &str, context: &str) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::fatal(format!("{context}: empty {what} name")));
    }
    if name.contains('\0') {
        return Err(DbError::fatal(format!(
            "{context}: the {what} name '{}' contains a NUL character",
            name.escape_debug()
        )));
    }
    if name.len() > MAX_IDENTIFIER_BYTES {
        return Err(DbError::fatal(format!(
            "{context}: postgres {what} name '{name}' is longer than {MAX_IDENTIFIER_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Names that fit PostgreSQL, and no column twice.
fn validate(spec: &TableSpec) -> Result<(), DbError> {
    if spec.table.len() > MAX_IDENTIFIER_BYTES {
        return Err(DbError::fatal(format!(
            "postgres table name '{}' is longer than {MAX_IDENTIFIER_BYTES} bytes; set sink.table to a shorter name",
            spec.table
        )));
    }
    let context = spec_context(spec);
    check_identifier(&spec.table, "table", &context)?;
    check_identifier(&spec.schema, "schema", &context)?;
    if spec.key.is_empty() {
        return Err(DbError::fatal(format!("{context}: no key columns")));
    }
    let mut columns: Vec<&str> = Vec::new();
    for column in spec.key.iter().map(|k| k.name.as_str()).chain([
        spec.document_column.as_str(),
        SNAPSHOT_COLUMN,
        UPDATED_AT_COLUMN,
    ]) {
        check_identifier(column, "column", &context)?;
        if columns.contains(&column) {
            return Err(DbError::fatal(format!(
                "{context}: column '{column}' is used twice (key attributes, document column and \
                 {SNAPSHOT_COLUMN}/{UPDATED_AT_COLUMN} must differ)"
            )));
        }
        columns.push(column);
    }
    Ok(())
}

/// The key values match the key columns in number and type.
fn check_key(spec: &TableSpec, key: &[KeyValue]) -> Result<(), DbError> {
    let fits = key.len() == spec.key.len()
        && key.iter().zip(&spec.key).all(|(value, column)| {
            matches!(
                (value, column.kind),
                (KeyValue::S(_), KeyType::S)
                    | (KeyValue::N(_), KeyType::N)
                    | (KeyValue::B(_), KeyType::B)
            )
        });
    if fits {
        return Ok(());
    }
    let got: Vec<&str> = key
        .iter()
        .map(|value| match value {
            KeyValue::S(_) => "S",
            KeyValue::N(_) => "N",
            KeyValue::B(_) => "B",
        })
        .collect();
    let wanted: Vec<String> = spec
        .key
        .iter()
        .map(|k| format!("{} {}", k.name, k.kind.tag()))
        .collect();
    Err(DbError::fatal(format!(
        "{}: a row's key has {} value(s) ({}) but the table's key is ({})",
        spec_context(spec),
        key.len(),
        got.join(", "),
        wanted.join(", ")
    )))
}

fn key_param(value: &KeyValue) -> &(dyn ToSql + Sync) {
    match value {
        KeyValue::S(text) | KeyValue::N(text) => text,
        KeyValue::B(bytes) => bytes,
    }
}

fn sql_type(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S => "text",
        KeyType::N => "numeric",
        KeyType::B => "bytea",
    }
}

/// The parameter cast of a key column: numbers go as text and are cast by the server.
fn key_cast(kind: KeyType) -> &'static str {
    match kind {
        KeyType::S => "::text",
        KeyType::N => "::text::numeric",
        KeyType::B => "::bytea",
    }
}

fn create_table_sql(spec: &TableSpec) -> String {
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS {} (",
        qualified(&spec.schema, &spec.table)
    );
    for column in &spec.key {
        let _ = write!(
            sql,
            "{} {} NOT NULL, ",
            quote(&column.name),
            sql_type(column.kind)
        );
    }
    let _ = write!(
        sql,
        "{} {} NOT NULL, {} bigint, {} text NOT NULL, PRIMARY KEY ({}))",
        quote(&spec.document_column),
        spec.document_type.name(),
        quote(SNAPSHOT_COLUMN),
        quote(UPDATED_AT_COLUMN),
        key_list(spec)
    );
    sql
}

fn create_state_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, part text NOT NULL, \
         value jsonb NOT NULL, updated_at text NOT NULL, PRIMARY KEY (pipeline, part))",
        qualified(schema, STATE_TABLE)
    )
}

fn key_list(spec: &TableSpec) -> String {
    spec.key
        .iter()
        .map(|k| quote(&k.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parameters: the keys, the document, (the snapshot id,) `_ddbpipe_updated_at`.
fn upsert_sql(spec: &TableSpec, snapshot: bool) -> String {
    let document = quote(&spec.document_column);
    let marker = quote(SNAPSHOT_COLUMN);
    let updated_at = quote(UPDATED_AT_COLUMN);
    let mut values: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("${}{}", i + 1, key_cast(k.kind)))
        .collect();
    let mut n = spec.key.len();
    n += 1;
    values.push(format!("${n}{}", document::cast(spec.document_type)));
    if snapshot {
        n += 1;
        values.push(format!("${n}::bigint"));
    } else {
        values.push("NULL".to_string());
    }
    n += 1;
    values.push(format!("${n}::text"));
    let mut set = format!("{document} = EXCLUDED.{document}, ");
    if snapshot {
        let _ = write!(set, "{marker} = EXCLUDED.{marker}, ");
    }
    let _ = write!(set, "{updated_at} = EXCLUDED.{updated_at}");
    format!(
        "INSERT INTO {} ({}, {document}, {marker}, {updated_at}) VALUES ({}) \
         ON CONFLICT ({}) DO UPDATE SET {set}",
        qualified(&spec.schema, &spec.table),
        key_list(spec),
        values.join(", "),
        key_list(spec)
    )
}

fn delete_sql(spec: &TableSpec) -> String {
    let conditions: Vec<String> = spec
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ${}{}", quote(&k.name), i + 1, key_cast(k.kind)))
        .collect();
    format!(
        "DELETE FROM {} WHERE {}",
        qualified(&spec.schema, &spec.table),
        conditions.join(" AND ")
    )
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Now, RFC 3339 UTC with milliseconds.
fn now_rfc3339() -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::now_utc()
        .format(&format)
        .unwrap_or_default()
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

    #[test]
    fn lock_key_is_fnv1a_64() {
        // FNV-1a 64 of "ddbpipe:" alone, computed independently.
        let mut hash: u64 = 0xcbf29ce484222325;
        for b in b"ddbpipe:" {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
        for b in b":" {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
        assert_eq!(lock_key("", ""), hash as i64);
        assert_ne!(lock_key("s", "a"), lock_key("s", "b"));
        assert_ne!(lock_key("s", "a"), lock_key("t", "a"));
    }

    #[test]
    fn upsert_sql_shape() {
        let spec = TableSpec {
            table: "or\"ders".into(),
            schema: "public".into(),
            key: vec![
                crate::KeyColumn {
                    name: "id".into(),
                    kind: KeyType::S,
                },
                crate::KeyColumn {
                    name: "n".into(),
                    kind: KeyType::N,
                },
            ],
            document_column: "doc".into(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        };
        assert_eq!(
            upsert_sql(&spec, false),
            "INSERT INTO \"public\".\"or\"\"ders\" (\"id\", \"n\", \"doc\", \"_ddbpipe_snapshot\", \
             \"_ddbpipe_updated_at\") VALUES ($1::text, $2::text::numeric, $3::text::jsonb, NULL, \
             $4::text) ON CONFLICT (\"id\", \"n\") DO UPDATE SET \"doc\" = EXCLUDED.\"doc\", \
             \"_ddbpipe_updated_at\" = EXCLUDED.\"_ddbpipe_updated_at\""
        );
        assert!(upsert_sql(&spec, true).contains(
            "$4::bigint, $5::text) ON CONFLICT (\"id\", \"n\") DO UPDATE SET \"doc\" = \
             EXCLUDED.\"doc\", \"_ddbpipe_snapshot\" = EXCLUDED.\"_ddbpipe_snapshot\""
        ));
    }
}
