//! Where the sink case's databases come from, for the bench process: SQLite files in a
//! temporary directory (and which filesystem holds it), and a PostgreSQL server reached by
//! `--postgres-url`, on which each phase gets a fresh schema that is dropped afterwards. Also
//! the comparison of a load's table with its floor's.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;

use anyhow::{Context as _, ensure};
use serde::Serialize;

use super::PostgresUrl;
use super::destination::{DOCUMENT_COLUMN, quote};
use crate::items::TABLE;
use crate::procfs;

/// The filesystem holding a directory, from `/proc/mounts`.
#[derive(Debug, Clone, Serialize)]
pub struct Filesystem {
    /// The directory.
    pub path: PathBuf,
    /// Where the filesystem is mounted.
    pub mount_point: String,
    /// Its type (`ext4`, `xfs`, `overlay`, `tmpfs`, …).
    pub fs_type: String,
    /// Its source (`/dev/vda`, `tmpfs`, …).
    pub device: String,
    /// `true` for `tmpfs` and `ramfs`: memory, where an fsync costs nothing.
    pub in_memory: bool,
}

impl Filesystem {
    /// The filesystem of `dir`: the mount whose mount point is the longest prefix of it.
    pub fn of(dir: &Path) -> anyhow::Result<Self> {
        let path = dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        let mounts = std::fs::read_to_string("/proc/mounts").context("cannot read /proc/mounts")?;
        let mut best: Option<(String, String, String)> = None;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [device, mount_point, fs_type, ..] = fields[..] else {
                continue;
            };
            // `/proc/mounts` writes a space in a path as `\040`.
            let mount_point = mount_point.replace("\\040", " ");
            if path.starts_with(&mount_point)
                && best
                    .as_ref()
                    .is_none_or(|(_, longest, _)| mount_point.len() >= longest.len())
            {
                best = Some((device.to_string(), mount_point, fs_type.to_string()));
            }
        }
        let (device, mount_point, fs_type) =
            best.with_context(|| format!("no mount in /proc/mounts holds {}", path.display()))?;
        Ok(Filesystem {
            in_memory: fs_type == "tmpfs" || fs_type == "ramfs",
            path,
            mount_point,
            fs_type,
            device,
        })
    }

    /// `ext4 (/dev/vda on /, disk)`.
    pub fn describe(&self) -> String {
        let medium = if self.in_memory { "memory" } else { "disk" };
        format!(
            "{} ({} on {}, {medium})",
            self.fs_type, self.device, self.mount_point
        )
    }
}

/// The SQLite library's version (the one the sinks and the floor link).
pub fn sqlite_version() -> &'static str {
    rusqlite::version()
}

/// Counts the rows in which two SQLite files' bench tables differ (key columns and document,
/// both ways); zero when they hold the same rows.
pub fn sqlite_difference(a: &Path, b: &Path) -> anyhow::Result<u64> {
    let conn = rusqlite::Connection::open(a)
        .with_context(|| format!("cannot open sqlite {}", a.display()))?;
    conn.execute("ATTACH DATABASE ?1 AS other", [b.to_string_lossy()])
        .with_context(|| format!("cannot attach sqlite {}", b.display()))?;
    let columns = compared_columns();
    let table = quote(TABLE);
    let sql = format!(
        "SELECT (SELECT count(*) FROM (SELECT {columns} FROM main.{table} EXCEPT \
         SELECT {columns} FROM other.{table})) + (SELECT count(*) FROM (SELECT {columns} \
         FROM other.{table} EXCEPT SELECT {columns} FROM main.{table}))"
    );
    let differing: i64 = conn.query_row(&sql, [], |row| row.get(0))?;
    Ok(differing.unsigned_abs())
}

/// The columns two tables are compared on: the key columns and the document.
fn compared_columns() -> String {
    format!("\"pk\", \"sk\", {}", quote(DOCUMENT_COLUMN))
}

/// What the bench knows of the PostgreSQL server.
#[derive(Debug, Clone, Serialize)]
pub struct Server {
    /// `host:port/database`.
    pub location: String,
    /// `server_version`.
    pub version: String,
    /// `fsync`.
    pub fsync: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `full_page_writes`.
    pub full_page_writes: String,
    /// The postmaster's pid, when the server runs on this machine (its CPU is then measured).
    pub postmaster: Option<u32>,
}

/// The bench's own session on the PostgreSQL server: creates, compares and drops the
/// phases' schemas.
pub struct Admin {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    url: PostgresUrl,
    /// The schemas created and not yet dropped.
    schemas: Vec<String>,
    /// Makes schema names unique within the run.
    counter: u32,
}

impl Admin {
    /// Connects (without TLS: the URL must say `sslmode=disable`, so that ddbpipe's session
    /// and the floor's are plain alike).
    pub fn connect(url: PostgresUrl) -> anyhow::Result<Self> {
        let config = tokio_postgres::Config::from_str(url.expose())
            .with_context(|| format!("--postgres-url {} does not parse", url.redacted()))?;
        ensure!(
            config.get_ssl_mode() == tokio_postgres::config::SslMode::Disable,
            "--postgres-url {} must say sslmode=disable: the floor's COPY and ddbpipe's \
             session must both be plain (scripts/postgres.sh's URL says it)",
            url.redacted()
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        let client = runtime.block_on(async {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .with_context(|| format!("cannot connect to postgres {}", url.redacted()))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    eprintln!("ddbpipe-bench: the PostgreSQL session ended: {e}");
                }
            });
            anyhow::Ok(client)
        })?;
        Ok(Admin {
            runtime,
            client,
            url,
            schemas: Vec::new(),
            counter: 0,
        })
    }

    /// The URL the phases connect with.
    pub fn url(&self) -> &PostgresUrl {
        &self.url
    }

    /// The server's version and durability settings, and its postmaster when it runs here:
    /// the parent of this session's backend, when that is a `postgres` process of this
    /// machine.
    pub fn server(&self) -> anyhow::Result<Server> {
        let row = self.runtime.block_on(self.client.query_one(
            "SELECT current_setting('server_version'), current_setting('fsync'), \
             current_setting('synchronous_commit'), current_setting('full_page_writes'), \
             pg_backend_pid(), current_database(), \
             coalesce(host(inet_server_addr()), 'unix socket'), \
             coalesce(inet_server_port(), 0)",
            &[],
        ))?;
        let backend: i32 = row.try_get(4)?;
        let postmaster = match u32::try_from(backend).ok().map(procfs::parent_of) {
            Some(Ok(Some((parent, command)))) if command.starts_with("postgres") => Some(parent),
            _ => None,
        };
        let database: String = row.try_get(5)?;
        let host: String = row.try_get(6)?;
        let port: i32 = row.try_get(7)?;
        Ok(Server {
            location: format!("{host}:{port}/{database}"),
            version: row.try_get(0)?,
            fsync: row.try_get(1)?,
            synchronous_commit: row.try_get(2)?,
            full_page_writes: row.try_get(3)?,
            postmaster,
        })
    }

    /// Creates a fresh, empty schema for one phase and returns its name.
    pub fn create_schema(&mut self, role: &str) -> anyhow::Result<String> {
        self.counter += 1;
        let name = format!(
            "ddbpipe_bench_{}_{}_{role}",
            std::process::id(),
            self.counter
        );
        self.runtime.block_on(
            self.client
                .batch_execute(&format!("CREATE SCHEMA {}", quote(&name))),
        )?;
        self.schemas.push(name.clone());
        Ok(name)
    }

    /// Drops a schema this session created, with everything in it.
    pub fn drop_schema(&mut self, name: &str) -> anyhow::Result<()> {
        self.runtime.block_on(
            self.client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", quote(name))),
        )?;
        self.schemas.retain(|s| s != name);
        Ok(())
    }

    /// Counts the rows in which the bench tables of two schemas differ (key columns and
    /// document, both ways); zero when they hold the same rows. Documents are compared as
    /// `jsonb` (through their `md5`, to keep the sort small).
    pub fn difference(&self, a: &str, b: &str) -> anyhow::Result<u64> {
        let table = quote(TABLE);
        let select = |schema: &str| {
            format!(
                "SELECT \"pk\", \"sk\", md5({}::text) FROM {}.{table}",
                quote(DOCUMENT_COLUMN),
                quote(schema)
            )
        };
        let sql = format!(
            "SELECT (SELECT count(*) FROM ({} EXCEPT ALL {}) x) + \
             (SELECT count(*) FROM ({} EXCEPT ALL {}) y)",
            select(a),
            select(b),
            select(b),
            select(a)
        );
        let row = self.runtime.block_on(self.client.query_one(&sql, &[]))?;
        let differing: i64 = row.try_get(0)?;
        Ok(differing.unsigned_abs())
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        // Schemas a failed run left behind.
        for name in std::mem::take(&mut self.schemas) {
            let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", quote(&name));
            if let Err(e) = self.runtime.block_on(self.client.batch_execute(&sql)) {
                eprintln!("ddbpipe-bench: cannot drop the schema {name}: {e}");
            }
        }
    }
}

/// The connection string of `--postgres-url`, or of `DDBPIPE_TEST_POSTGRES_URL` (which
/// `source scripts/postgres.sh` exports), read once when the arguments are resolved.
pub fn postgres_url(flag: Option<&str>) -> Option<PostgresUrl> {
    flag.map(str::to_string)
        .or_else(|| std::env::var("DDBPIPE_TEST_POSTGRES_URL").ok())
        .filter(|url| !url.trim().is_empty())
        .map(PostgresUrl::new)
}
