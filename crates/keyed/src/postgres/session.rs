//! The session: connecting (TLS per `sslmode`), the one shared connection and its prepared
//! statements, reconnecting after a loss (re-taking the held locks), classifying driver errors,
//! and the advisory run lock (see the `postgres` module docs, "Connection", "Retry
//! classification" and "Lock").

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use futures_util::future::try_join_all;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, GenericClient, NoTls, Statement, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::conninfo::ConnInfo;
use super::tls::tls_config;
use crate::DbError;

/// The first key of the shared two-int4 advisory lock `(PID_MARKER, pid)` a session takes
/// beside a pipeline lock, so that another ddbpipe can name the process holding it ("ddbp").
const PID_MARKER: i32 = 0x6464_6270;
/// The connect timeout when the connection string sets none.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What every clone shares.
pub(super) struct Shared {
    /// The parsed connection string (holds the password; never printed).
    pub(super) config: Config,
    /// TLS for `prefer`/`require` over TCP; `None` for `disable` or unix sockets.
    pub(super) tls: Option<MakeRustlsConnect>,
    /// "host:port/db".
    pub(super) location: String,
    /// The password, to scrub from any message as a second line of defence.
    pub(super) password: Option<String>,
    /// The schema of `_ddbpipe_state` for the calls without a spec.
    pub(super) state_schema: StdMutex<String>,
    /// The connection; the lock also serialises the calls.
    pub(super) session: tokio::sync::Mutex<Session>,
}

/// The current connection and what belongs to it.
pub(super) struct Session {
    pub(super) client: Option<Client>,
    /// Prepared statements of this connection, by SQL text.
    pub(super) statements: HashMap<String, Statement>,
    /// Advisory locks taken through this handle (re-taken after a reconnect).
    pub(super) locks: Vec<HeldLock>,
    /// The role may not create temporary tables: batches take the per-row statements
    /// (`bulk`'s staging table needs the database's TEMPORARY privilege).
    pub(super) no_temp_tables: bool,
    /// Tables (qualified names) whose batches met rows of theirs already: they go through
    /// the staging table, not straight into the table (`bulk` rule 6).
    pub(super) staged_tables: std::collections::HashSet<String>,
}

pub(super) struct HeldLock {
    pub(super) pipeline: String,
    pub(super) key: i64,
}

/// An error inside an operation: a driver error still to classify, or a finished one.
pub(super) enum Failure {
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

impl Shared {
    /// Parses `url` and opens the first connection (see [`PostgresDatabase::connect`]).
    pub(super) async fn connect(url: &str, defaults: &[(&str, String)]) -> Result<Shared, DbError> {
        let unusable = |shown: &str, problem: &str| {
            DbError::fatal(format!("postgres connection string '{shown}': {problem}"))
        };
        let parsed = ConnInfo::parse(url).map_err(|e| unusable(&e.redacted, &e.problem))?;
        let mut config = parsed
            .config_with(defaults)
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
                no_temp_tables: false,
                staged_tables: std::collections::HashSet::new(),
            }),
        };
        let client = shared.open().await?;
        shared.session.lock().await.client = Some(client);
        Ok(shared)
    }

    /// Opens a new connection and spawns its task.
    async fn open(&self) -> Result<Client, DbError> {
        let connected = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()).await.map(spawn_connection),
            None => self.config.connect(NoTls).await.map(spawn_connection),
        };
        connected.map_err(|e| {
            let (retryable, _) = classify(&e);
            DbError::retryable_if(
                retryable,
                self.scrub(format!(
                    "postgres {}: cannot connect{}: {}",
                    self.location,
                    self.config
                        .get_user()
                        .map(|user| format!(" as user {user}"))
                        .unwrap_or_default(),
                    error_text(&e)
                )),
            )
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

    /// A driver error as a [`DbError`] about `context`, and whether it lost the connection.
    pub(super) fn driver_error(&self, context: &str, e: &tokio_postgres::Error) -> (DbError, bool) {
        let (retryable, lost) = classify(e);
        let message = self.scrub(format!("{context}: {}", error_text(e)));
        (DbError::retryable_if(retryable, message), lost)
    }

    pub(super) fn state_schema(&self) -> String {
        match self.state_schema.lock() {
            Ok(schema) => schema.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(super) fn set_state_schema(&self, schema: &str) {
        let mut guard = match self.state_schema.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = schema.to_string();
    }
}

impl Session {
    /// The live connection, reconnecting (and re-taking the locks) when there is none.
    pub(super) async fn connected(
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

    /// Drops the connection (the next call reconnects) and its prepared statements.
    pub(super) fn drop_connection(&mut self) {
        self.client = None;
        self.statements.clear();
    }

    /// Turns an operation's failure into a [`DbError`] with `context`, dropping the connection
    /// when it was lost.
    pub(super) fn finish<T>(
        &mut self,
        shared: &Shared,
        context: &str,
        result: Result<T, Failure>,
    ) -> Result<T, DbError> {
        match result {
            Ok(value) => Ok(value),
            Err(Failure::Db(e)) => Err(DbError {
                message: shared.scrub(e.message),
                class: e.class,
            }),
            Err(Failure::Pg(e)) => {
                let (error, lost) = shared.driver_error(context, &e);
                if lost || self.client.as_ref().is_some_and(Client::is_closed) {
                    self.drop_connection();
                }
                Err(error)
            }
        }
    }
}

/// Spawns the task of a new connection; its client.
fn spawn_connection<C>((client, connection): (Client, C)) -> Client
where
    C: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection ended");
        }
    });
    client
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
        // The driver's own text ("error connecting to server") hides the reason in its
        // sources: "Connection refused (os error 111)", "password authentication failed".
        None => {
            let mut parts = vec![e.to_string()];
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !parts.iter().any(|p| p.contains(&text)) {
                    parts.push(text);
                }
                source = cause.source();
            }
            parts.join(": ")
        }
    }
}

/// The prepared statement of `sql`, from the connection's cache (`client`: the connection or
/// a transaction in it).
pub(super) async fn statement<C: GenericClient + Sync>(
    client: &C,
    cache: &mut HashMap<String, Statement>,
    sql: &str,
) -> Result<Statement, tokio_postgres::Error> {
    if let Some(statement) = cache.get(sql) {
        return Ok(statement.clone());
    }
    let statement = client.prepare(sql).await?;
    cache.insert(sql.to_string(), statement.clone());
    Ok(statement)
}

/// The prepared statement of `sql()` when `needed`, from the session's cache.
pub(super) async fn prepare_if(
    client: &Client,
    cache: &mut HashMap<String, Statement>,
    needed: bool,
    sql: impl FnOnce() -> String,
) -> Result<Option<Statement>, tokio_postgres::Error> {
    if needed {
        statement(client, cache, &sql()).await.map(Some)
    } else {
        Ok(None)
    }
}

pub(super) fn prepared(statement: Option<&Statement>) -> Result<&Statement, Failure> {
    statement.ok_or_else(|| DbError::fatal("postgres: statement not prepared").into())
}

/// Sends every call at once, in order, and waits for all replies (the first error wins).
pub(super) async fn execute_pipelined<C: GenericClient + Sync>(
    tx: &C,
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
pub(super) async fn end_transaction<T>(
    tx: Transaction<'_>,
    result: Result<T, Failure>,
) -> Result<T, Failure> {
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

/// The pipeline's advisory lock key: FNV-1a 64 of `"ddbpipe:" + schema + ":" + pipeline`, as
/// a bigint. The state lives per schema, so one pipeline name may run once per schema.
pub(super) fn lock_key(schema: &str, pipeline: &str) -> i64 {
    let name = format!("{schema}:{pipeline}");
    let hash = fnv1a(b"ddbpipe:".iter().chain(name.as_bytes()).copied());
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// FNV-1a 64 of `bytes`: the lock key's hash, and the staging table's name (`bulk`).
pub(super) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Takes the lock `key`; once it is ours, also records this process's pid beside it (see
/// [`PID_MARKER`]).
pub(super) async fn try_lock(client: &Client, key: i64) -> Result<bool, tokio_postgres::Error> {
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
pub(super) async fn holder(
    client: &Client,
    key: i64,
) -> Result<Option<Option<u32>>, tokio_postgres::Error> {
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

/// "host:port/db" of the first host.
pub(super) fn location(config: &Config) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
