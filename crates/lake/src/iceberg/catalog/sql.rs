//! The SQL catalog of the Iceberg sink (docs/sinks.md §7.11): the tables Iceberg's JDBC
//! catalog and pyiceberg's `SqlCatalog` keep, in a SQLite file.
//!
//! # Rules
//! 1. The layout is the JDBC catalog's (its second, V1, which pyiceberg reads too):
//!    `iceberg_tables` (catalog name, namespace, table name, metadata location, previous
//!    metadata location, `iceberg_type` `TABLE`) and `iceberg_namespace_properties` (catalog
//!    name, namespace, key, value). Both are created when missing, with the file; a namespace
//!    is recorded by its `exists` property. A catalog of the first layout (no `iceberg_type`,
//!    as older pyiceberg creates it) is written in that layout.
//! 2. A commit swaps the metadata location only if it is still the one the commit was built on
//!    (`UPDATE … WHERE metadata_location = old`): one changed row, or a conflict (`false`).
//! 3. In a SQLite file every call opens the file, runs one statement or transaction, and
//!    closes it, on a blocking thread: a catalog is shared with every reader, and held open by
//!    nobody. In PostgreSQL (a `postgres://` URL, connected as the postgres sink connects) one
//!    connection serves the run, and the tables are created before the first write, under an
//!    advisory lock (two writers creating them at once would collide). A read creates nothing:
//!    no file or no catalog tables is no table (`check`, `state show`, `lag`).
//! 4. The statements are the same text for both (`ON CONFLICT DO NOTHING`, numbered
//!    parameters), but for whether the table has `iceberg_type`.
//! 5. In PostgreSQL a call is retried as the postgres sink's transactions are
//!    (`ddbpipe_keyed::sink::retried`, docs/errors.md §9.4: a lost connection, made again; a
//!    serialization failure, a deadlock, too many connections, a shutdown), within the run's
//!    `source.retry` budget, once connected (a server never reached fails at once, as a run's
//!    first request does: docs/errors.md §9.6). A commit whose answer was lost and whose retry
//!    changes no row is settled by reading the location back (the catalogs' rule 5). In
//!    SQLite a busy file is waited for (10 s) as before; other failures are not retried.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ddbpipe_keyed::sink::retried;
use ddbpipe_keyed::{DbError, PostgresDatabase};
use ddbpipe_source::retry::RetryPolicy;
use futures_util::FutureExt;
use rusqlite::{Connection, OptionalExtension};

/// A SQL catalog: its tables in a SQLite file or a PostgreSQL database.
#[derive(Clone)]
pub struct SqlCatalog {
    place: Place,
    name: String,
    /// The run's retry budget (rule 5).
    retry: RetryPolicy,
}

/// Never its URL: it may hold a password.
impl std::fmt::Debug for SqlCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqlCatalog({})", self.describe())
    }
}

#[derive(Clone)]
enum Place {
    Sqlite(PathBuf),
    Postgres {
        url: String,
        /// `host:port/database`, for messages.
        location: String,
        connected: Arc<tokio::sync::OnceCell<PostgresDatabase>>,
        /// The catalog tables were made sure of (before the first write).
        tables: Arc<tokio::sync::OnceCell<()>>,
    },
}

/// The catalog tables (rule 1).
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL,
    table_namespace VARCHAR(255) NOT NULL,
    table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000),
    previous_metadata_location VARCHAR(1000),
    iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);
CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL,
    namespace VARCHAR(255) NOT NULL,
    property_key VARCHAR(255) NOT NULL,
    property_value VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key)
);";

/// Rule 4: the statements (`?1`… become `$1`… for PostgreSQL).
const LOCATION: &str = "SELECT metadata_location FROM iceberg_tables
    WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3";
const NAMESPACE: &str = "INSERT INTO iceberg_namespace_properties
    (catalog_name, namespace, property_key, property_value)
    VALUES (?1, ?2, 'exists', 'true') ON CONFLICT DO NOTHING";
const CREATE_TYPED: &str = "INSERT INTO iceberg_tables
    (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location,
     iceberg_type)
    VALUES (?1, ?2, ?3, ?4, NULL, 'TABLE') ON CONFLICT DO NOTHING";
const CREATE: &str = "INSERT INTO iceberg_tables
    (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location)
    VALUES (?1, ?2, ?3, ?4, NULL) ON CONFLICT DO NOTHING";
const SWAP: &str = "UPDATE iceberg_tables
    SET metadata_location = ?1, previous_metadata_location = ?2
    WHERE catalog_name = ?3 AND table_namespace = ?4 AND table_name = ?5
      AND metadata_location = ?2";
const TYPED_SQLITE: &str = "SELECT count(*) > 0 FROM pragma_table_info('iceberg_tables')
    WHERE name = 'iceberg_type'";
const TYPED_POSTGRES: &str = "SELECT count(*) > 0 FROM information_schema.columns
    WHERE table_schema = current_schema() AND table_name = 'iceberg_tables'
      AND column_name = 'iceberg_type'";
/// The advisory lock the tables are created under in PostgreSQL (rule 3).
const CREATE_LOCK: i64 = 0x6464_6270_6963_6562;

/// `sql` with PostgreSQL's parameter marks.
fn numbered(sql: &str) -> String {
    (1..=5).fold(sql.to_string(), |sql, n| {
        sql.replace(&format!("?{n}"), &format!("${n}"))
    })
}

/// A catalog call's work, the same for both places: its statement's parameters are text.
#[derive(Clone)]
enum Call {
    Location([String; 3]),
    Create([String; 4]),
    Swap([String; 5]),
}

/// What a call found: a read, the location; a write, whether it changed a row.
#[derive(Default)]
struct Found {
    location: Option<String>,
    changed: bool,
}

impl SqlCatalog {
    /// The catalog `name` in the SQLite file at `path`.
    pub fn new(path: PathBuf, name: String) -> SqlCatalog {
        SqlCatalog {
            place: Place::Sqlite(path),
            name,
            retry: RetryPolicy::default(),
        }
    }

    /// This catalog with its PostgreSQL calls retried within `retry` (rule 5).
    pub fn with_retry(self, retry: RetryPolicy) -> SqlCatalog {
        SqlCatalog { retry, ..self }
    }

    /// The catalog `name` at `uri`: `sqlite:///` then a file's path (a relative one taken from
    /// `base`), or a `postgres://` (`postgresql://`) URL as the postgres sink takes it.
    pub fn from_uri(uri: &str, base: &Path, name: String) -> Result<SqlCatalog, String> {
        if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            PostgresDatabase::check_url(uri)
                .map_err(|problem| format!("catalog uri: {problem}"))?;
            let location = PostgresDatabase::address(uri, &[])
                .map_err(|problem| format!("catalog uri: {problem}"))?;
            return Ok(SqlCatalog {
                place: Place::Postgres {
                    url: uri.to_string(),
                    location,
                    connected: Arc::default(),
                    tables: Arc::default(),
                },
                name,
                retry: RetryPolicy::default(),
            });
        }
        Ok(SqlCatalog::new(SqlCatalog::path_of(uri, base)?, name))
    }

    /// The SQLite file of `uri` (`sqlite:///` then its path; a relative path is taken from
    /// `base`); an error for any other uri, naming what is taken.
    pub fn path_of(uri: &str, base: &Path) -> Result<PathBuf, String> {
        let Some(path) = uri.strip_prefix("sqlite:///") else {
            return Err(format!(
                "catalog uri '{}' is neither a SQLite file (sqlite:////absolute/path/catalog.db) \
                 nor a PostgreSQL URL (postgres://…); for the Glue Data Catalog set type: \
                 glue (no uri); REST catalogs are not supported yet",
                PostgresDatabase::redact(&ddbpipe_source::endpoint::mask_url(uri))
            ));
        };
        if path.is_empty() {
            return Err("catalog uri 'sqlite:///' names no file".into());
        }
        Ok(base.join(path))
    }

    /// The catalog for messages (never a password).
    pub fn describe(&self) -> String {
        match &self.place {
            Place::Sqlite(path) => format!("SQL catalog '{}' in {}", self.name, path.display()),
            Place::Postgres { location, .. } => {
                format!("SQL catalog '{}' in postgres {location}", self.name)
            }
        }
    }

    /// The name readers must give the catalog.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `call` where the catalog is.
    async fn call(&self, what: &'static str, call: Call) -> Result<Found, String> {
        let described = self.describe();
        let failed = |e: String| format!("cannot {what} in the {described}: {e}");
        match &self.place {
            Place::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || sqlite(&path, call))
                    .await
                    .map_err(|e| format!("internal error: {e}"))?
                    .map_err(failed)
            }
            Place::Postgres {
                url,
                connected,
                tables,
                ..
            } => {
                let attempt = || {
                    let call = call.clone();
                    async move {
                        // A server never reached is not waited for (docs/errors.md §9.6): a
                        // wrong `catalog.uri` fails at once. Once connected, a lost connection
                        // is made again by the session.
                        let connect = || async {
                            let connected = PostgresDatabase::connect(url).await;
                            connected.map_err(|e| DbError::fatal(e.message))
                        };
                        let db = connected.get_or_try_init(connect).await?;
                        if !matches!(call, Call::Location(_)) {
                            // A read creates nothing (`check`, `state show`): a missing table
                            // is no table (`postgres`).
                            tables
                                .get_or_try_init(|| {
                                    db.run("create the catalog tables", |client| {
                                        let script = format!(
                                            "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); \
                                             {TABLES} COMMIT;"
                                        );
                                        async move { client.batch_execute(&script).await }.boxed()
                                    })
                                })
                                .await?;
                        }
                        db.run(what, |client| postgres(client, call).boxed()).await
                    }
                };
                let called = retried(&self.retry, "iceberg_sql_catalog", &described, attempt);
                Box::pin(called).await.map_err(|e| failed(e.message))
            }
        }
    }

    /// `check`'s probe: whether a run could write the catalog (create its file and tables, or
    /// insert and update their rows), found without changing it.
    pub async fn writable(&self) -> Result<(), String> {
        let described = self.describe();
        let refused = |e: String| format!("the {described} cannot be written: {e}");
        match &self.place {
            Place::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || sqlite_writable(&path))
                    .await
                    .map_err(|e| format!("internal error: {e}"))?
                    .map_err(refused)
            }
            Place::Postgres { url, connected, .. } => {
                let db = connected
                    .get_or_try_init(|| PostgresDatabase::connect(url))
                    .await
                    .map_err(|e| refused(e.message))?;
                let allowed = db
                    .run("probe the catalog", |client| {
                        async move { Ok(client.query_one(PRIVILEGES, &[]).await?.get::<_, bool>(0)) }
                            .boxed()
                    })
                    .await
                    .map_err(|e| refused(e.message))?;
                match allowed {
                    true => Ok(()),
                    false => Err(refused(
                        "the role may neither create the catalog tables in its schema nor \
                         insert and update their rows: grant it CREATE on the schema, or \
                         INSERT and UPDATE on iceberg_tables and INSERT on \
                         iceberg_namespace_properties"
                            .into(),
                    )),
                }
            }
        }
    }

    /// The current metadata location of `namespace.table`; `None` when the catalog has no
    /// such table.
    pub async fn location(&self, namespace: &str, table: &str) -> Result<Option<String>, String> {
        if let Place::Sqlite(path) = &self.place
            && !tokio::fs::try_exists(path).await.unwrap_or(true)
        {
            // Reading creates nothing: no file, no table.
            return Ok(None);
        }
        let call = Call::Location([self.name.clone(), namespace.into(), table.into()]);
        Ok(self.call("read a table", call).await?.location)
    }

    /// Records a new table (and its namespace); `false` when another writer recorded it first.
    pub async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
    ) -> Result<bool, String> {
        let call = Call::Create([
            self.name.clone(),
            namespace.into(),
            table.into(),
            metadata_location.into(),
        ]);
        Ok(self.call("create a table", call).await?.changed)
    }

    /// Rule 2: moves `namespace.table` from metadata `old` to `new`; `false` on a conflict.
    pub async fn swap(
        &self,
        namespace: &str,
        table: &str,
        old: &str,
        new: &str,
    ) -> Result<bool, String> {
        let call = Call::Swap([
            new.into(),
            old.into(),
            self.name.clone(),
            namespace.into(),
            table.into(),
        ]);
        Ok(self.call("commit", call).await?.changed)
    }
}

/// Whether a run could write the SQLite catalog at `path`: the file, when there, opened for
/// writing; a file made and deleted in its directory (its journal's place), or in the nearest
/// directory there is when the run would create the rest.
fn sqlite_writable(path: &Path) -> Result<(), String> {
    if path.exists() {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut dir = path.parent().unwrap_or(Path::new("."));
    while !dir.as_os_str().is_empty() && !dir.exists() {
        dir = dir.parent().unwrap_or(Path::new("."));
    }
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let probe = dir.join(format!(".ddbpipe-check-{:016x}", rand::random::<u64>()));
    std::fs::File::create(&probe).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Whether the session's role could write the catalog: insert and update the catalog tables'
/// rows, or create them in its schema when they are not there yet.
const PRIVILEGES: &str = "SELECT coalesce(CASE WHEN to_regclass('iceberg_tables') IS NULL \
     THEN has_schema_privilege(current_schema(), 'CREATE') \
     ELSE has_table_privilege(to_regclass('iceberg_tables'), 'INSERT, UPDATE') \
      AND CASE WHEN to_regclass('iceberg_namespace_properties') IS NULL \
          THEN has_schema_privilege(current_schema(), 'CREATE') \
          ELSE has_table_privilege(to_regclass('iceberg_namespace_properties'), 'INSERT') END \
     END, false)";

/// `call` in the SQLite file at `path` (rule 3).
fn sqlite(path: &Path, call: Call) -> Result<Found, String> {
    let text = |e: rusqlite::Error| e.to_string();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let mut db = Connection::open(path).map_err(text)?;
    db.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(text)?;
    db.execute_batch(TABLES).map_err(text)?;
    match call {
        Call::Location(params) => db
            .query_row(LOCATION, rusqlite::params_from_iter(params), |row| {
                row.get::<_, Option<String>>(0)
            })
            .optional()
            .map(|found| Found {
                location: found.flatten(),
                changed: false,
            })
            .map_err(text),
        Call::Create([name, namespace, table, location]) => {
            let tx = db.transaction().map_err(text)?;
            tx.execute(NAMESPACE, [&name, &namespace]).map_err(text)?;
            let typed: bool = tx
                .query_row(TYPED_SQLITE, [], |row| row.get(0))
                .map_err(text)?;
            let insert = if typed { CREATE_TYPED } else { CREATE };
            let created = tx
                .execute(insert, [&name, &namespace, &table, &location])
                .map_err(text)?;
            tx.commit().map_err(text)?;
            Ok(Found {
                location: None,
                changed: created == 1,
            })
        }
        Call::Swap(params) => db
            .execute(SWAP, rusqlite::params_from_iter(params))
            .map(|changed| Found {
                location: None,
                changed: changed == 1,
            })
            .map_err(text),
    }
}

/// `call` on a PostgreSQL connection.
async fn postgres(
    client: &mut tokio_postgres::Client,
    call: Call,
) -> Result<Found, tokio_postgres::Error> {
    match call {
        Call::Location([name, namespace, table]) => {
            let found = client
                .query_opt(&numbered(LOCATION), &[&name, &namespace, &table])
                .await;
            match found {
                Ok(row) => Ok(Found {
                    location: row.and_then(|row| row.get(0)),
                    changed: false,
                }),
                // No catalog tables yet: no table.
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                    Ok(Found::default())
                }
                Err(e) => Err(e),
            }
        }
        Call::Create([name, namespace, table, location]) => {
            let tx = client.transaction().await?;
            tx.execute(&numbered(NAMESPACE), &[&name, &namespace])
                .await?;
            let typed: bool = tx.query_one(TYPED_POSTGRES, &[]).await?.get(0);
            let insert = numbered(if typed { CREATE_TYPED } else { CREATE });
            let created = tx
                .execute(&insert, &[&name, &namespace, &table, &location])
                .await?;
            tx.commit().await?;
            Ok(Found {
                location: None,
                changed: created == 1,
            })
        }
        Call::Swap([new, old, name, namespace, table]) => {
            let changed = client
                .execute(&numbered(SWAP), &[&new, &old, &name, &namespace, &table])
                .await?;
            Ok(Found {
                location: None,
                changed: changed == 1,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_commit_swaps_only_from_the_location_it_was_built_on() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = SqlCatalog::new(dir.path().join("sub/catalog.db"), "ddbpipe".into());
        assert_eq!(catalog.location("ns", "t").await.unwrap(), None);
        assert!(catalog.create("ns", "t", "m0").await.unwrap());
        assert!(!catalog.create("ns", "t", "other").await.unwrap(), "taken");
        assert!(catalog.swap("ns", "t", "m0", "m1").await.unwrap());
        assert!(!catalog.swap("ns", "t", "m0", "m2").await.unwrap(), "stale");
        assert_eq!(
            catalog.location("ns", "t").await.unwrap().as_deref(),
            Some("m1")
        );
        let other = SqlCatalog::new(dir.path().join("sub/catalog.db"), "other".into());
        assert_eq!(
            other.location("ns", "t").await.unwrap(),
            None,
            "by catalog name"
        );
    }

    /// `check`'s probe: a catalog a run could create is writable, and probing it creates
    /// nothing; one under a file that is not a directory is not, naming it.
    #[tokio::test]
    async fn a_sqlite_catalog_is_probed_writable_without_being_created() {
        let dir = tempfile::tempdir().unwrap();
        let missing = SqlCatalog::new(dir.path().join("a/b/catalog.db"), "ddbpipe".into());
        missing.writable().await.unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing made"
        );
        assert!(missing.create("ns", "t", "m0").await.unwrap());
        missing.writable().await.unwrap();
        std::fs::write(dir.path().join("plain"), "not a directory").unwrap();
        let under_a_file = SqlCatalog::new(dir.path().join("plain/catalog.db"), "ddbpipe".into());
        let problem = under_a_file.writable().await.unwrap_err();
        assert!(problem.contains("cannot be written"), "{problem}");
        assert!(problem.contains("plain is not a directory"), "{problem}");
    }

    /// `check`'s probe in PostgreSQL (the test server): a role that may neither create the
    /// catalog tables nor write their rows is refused, saying what to grant; the server's
    /// owner may.
    #[tokio::test]
    async fn a_postgres_role_without_privileges_is_probed_not_writable() {
        let admin = ddbpipe_testkit::postgres::connect().await;
        let role = format!("ddbpipe_probe_{:08x}", rand::random::<u32>());
        admin
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN PASSWORD 'probe-secret-1'"
            ))
            .await
            .unwrap();
        let url = ddbpipe_testkit::postgres::url();
        let (_, rest) = url.split_once('@').unwrap();
        let weak = format!("postgres://{role}:probe-secret-1@{rest}");
        let catalog = SqlCatalog::from_uri(&weak, Path::new(""), "ddbpipe".into()).unwrap();
        let problem = catalog.writable().await.unwrap_err();
        assert!(
            problem.contains("grant it CREATE on the schema"),
            "{problem}"
        );
        assert!(!problem.contains("probe-secret-1"), "{problem}");
        let owner = SqlCatalog::from_uri(&url, Path::new(""), "ddbpipe".into()).unwrap();
        owner.writable().await.unwrap();
        admin
            .batch_execute(&format!("DROP ROLE {role}"))
            .await
            .unwrap();
    }

    /// Rule 5: a PostgreSQL catalog whose connection is lost mid-commit (its backend
    /// terminated while the commit waits on a lock another session holds) reconnects and
    /// tries the commit again: it lands, once. Without the retry the commit fails.
    #[tokio::test]
    async fn a_commit_whose_postgres_connection_is_lost_is_tried_again() {
        let app = format!("ddbpipe_catalog_{:08x}", rand::random::<u32>());
        let url = ddbpipe_testkit::postgres::url();
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={app}");
        let fast = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            ..RetryPolicy::default()
        };
        let catalog = SqlCatalog::from_uri(&url, Path::new(""), app.clone())
            .unwrap()
            .with_retry(fast);
        let old = "s3://w/ns.db/t/metadata/00000-a.metadata.json";
        let new = "s3://w/ns.db/t/metadata/00001-b.metadata.json";
        assert!(catalog.create("ns", "t", old).await.unwrap());

        let locker = ddbpipe_testkit::postgres::connect().await;
        (locker.batch_execute("BEGIN; LOCK TABLE iceberg_tables IN ACCESS EXCLUSIVE MODE"))
            .await
            .unwrap();
        let committing = {
            let catalog = catalog.clone();
            tokio::spawn(async move { catalog.swap("ns", "t", old, new).await })
        };
        let admin = ddbpipe_testkit::postgres::connect().await;
        let waiting = "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
                       AND wait_event_type = 'Lock'";
        let pid: i32 = loop {
            if let Some(row) = admin.query_opt(waiting, &[&app]).await.unwrap() {
                break row.get(0);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let terminated = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await;
        assert!(terminated.unwrap().get::<_, bool>(0));
        tokio::time::sleep(Duration::from_millis(300)).await;
        locker.batch_execute("COMMIT").await.unwrap();

        let committed = committing.await.unwrap();
        assert_eq!(
            committed,
            Ok(true),
            "the commit tried again on a new connection"
        );
        assert_eq!(catalog.location("ns", "t").await, Ok(Some(new.to_string())));
    }

    /// Rule 5: a PostgreSQL catalog never reached (nothing listens) fails at once, after one
    /// attempt, naming where it is and not its password: a wrong `catalog.uri` is not waited
    /// for through the retry budget.
    #[tokio::test]
    async fn a_postgres_catalog_never_reached_fails_at_once() {
        let port = ddbpipe_testkit::free_port();
        let url = format!("postgres://ddbpipe:hunter22@127.0.0.1:{port}/catalog?sslmode=disable");
        let catalog = SqlCatalog::from_uri(&url, Path::new(""), "ddbpipe".into()).unwrap();
        let old = "s3://w/ns.db/t/metadata/00000-a.metadata.json";
        let failed = catalog.create("ns", "t", old).await.unwrap_err();
        assert!(failed.contains(&format!("127.0.0.1:{port}")), "{failed}");
        assert!(!failed.contains("attempt(s)"), "tried once: {failed}");
        assert!(!failed.contains("hunter22"), "{failed}");
    }

    #[tokio::test]
    async fn a_catalog_of_the_first_layout_is_written_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v0.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(&TABLES.replace("    iceberg_type VARCHAR(5),\n", ""))
            .unwrap();
        let catalog = SqlCatalog::new(path.clone(), "ddbpipe".into());
        assert!(catalog.create("ns", "t", "m0").await.unwrap());
        assert_eq!(
            catalog.location("ns", "t").await.unwrap().as_deref(),
            Some("m0")
        );
        let typed = SqlCatalog::new(dir.path().join("v1.db"), "ddbpipe".into());
        assert!(typed.create("ns", "t", "m0").await.unwrap());
        let kind: String = Connection::open(dir.path().join("v1.db"))
            .unwrap()
            .query_row("SELECT iceberg_type FROM iceberg_tables", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kind, "TABLE");
    }

    #[test]
    fn a_uri_names_a_sqlite_file() {
        let base = Path::new("/base");
        assert_eq!(
            SqlCatalog::path_of("sqlite:////var/lib/c.db", base).unwrap(),
            Path::new("/var/lib/c.db")
        );
        assert_eq!(
            SqlCatalog::path_of("sqlite:///rel/c.db", base).unwrap(),
            Path::new("/base/rel/c.db")
        );
        let refused = SqlCatalog::path_of("postgresql://u:secret@h/db", base).unwrap_err();
        assert!(refused.contains("not supported yet"), "{refused}");
        assert!(!refused.contains("secret"), "{refused}");
    }
}
