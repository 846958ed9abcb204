//! The sink case: ddbpipe loading the bench table into its keyed destinations (SQLite,
//! PostgreSQL) beside each database's own floor on the identical rows, and reading the bench
//! stream into them beside the jsonl sink, in the same bench run; and the Parquet sink's load
//! and stream beside the jsonl sink's (issue 29).
//!
//! # Phases
//! Each phase runs in a process of its own (`ddbpipe-bench sink-phase`), so that its CPU time
//! and peak RSS are its own. Its settings come as one JSON line on stdin, not as arguments:
//! the PostgreSQL URL holds a password, which the command line would show to every user of
//! the machine.
//! 1. `load` (ddbpipe): the scan case's pipeline into a sqlite or postgres sink, built through
//!    the library as `ddbpipe run` builds it (`crate::ddbpipe_run`): the database opened, the
//!    pipeline's lock taken, the table prepared, the position loaded, then the scan, timed.
//!    See [`ddbpipe`].
//! 2. `floor`: the same rows written the cheapest ordinary way the database offers: SQLite one
//!    prepared `INSERT` per row in one transaction, PostgreSQL one `COPY … FROM STDIN`. See
//!    [`floor`], whose docs say how its rows are made identical to the sink's.
//! 3. `stream` (ddbpipe): every change record of the bench stream, read from all its shards at
//!    once, into the keyed sink (a `mode: streams` pipeline built the same way), into fresh
//!    Kafka topics (`exactly_once` and `at_least_once`, when a broker is given), or into the
//!    jsonl sink on `/dev/null` as the reference (the streams case's ddbpipe phase).
//! 4. `load` into jsonl or parquet: the scan case's ddbpipe phase (its pipeline into the jsonl
//!    sink on `/dev/null`) is the reference of the same scan into a fresh Parquet directory
//!    (the sink's defaults); the stream into a fresh Parquet directory is measured beside the
//!    stream into jsonl (phase 3). The same for a fresh Iceberg table (its catalog a SQLite
//!    file, its warehouse a directory). See [`lake`] for how their rows are counted.
//!
//! # CPU and memory
//! A phase measures its own user and system CPU and peak RSS as the other cases do
//! ([`crate::procfs`]). For Kafka it also measures the broker's CPU over the same window
//! (its process, when `DDBPIPE_TEST_KAFKA_PID` or `--kafka-pid` names it). For PostgreSQL it
//! also measures the server's CPU over the same window: the postmaster and every process whose parent it is (backends, background
//! writers, autovacuum), live or reaped ([`procfs::tree_ticks`]). A backend's pid is not
//! reachable through the sink, so the whole server is measured; the bench's own idle
//! connection costs nothing, but anyone else using the same server is counted too. When the
//! server does not run on this machine its CPU is not reported.
//!
//! # Checks
//! Every phase counts the destination table afterwards and fails unless it holds exactly the
//! expected rows (the items; or the records' keys that an `INSERT` or `MODIFY` left and no
//! `REMOVE` took, see [`crate::records::rows_after`]; a Parquet directory: the rows of its
//! committed files read back, every item or every change record). After a load and its floor,
//! the bench compares their tables (key columns and documents) and fails when they differ.
//! Nothing asserts on time.

pub mod bench;
pub(crate) mod databases;
mod ddbpipe;
mod destination;
mod floor;
mod lake;
pub mod report;

use std::path::PathBuf;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::phase::{Case, Client, PhaseSettings};
use crate::procfs::{self, CpuTicks, Measured};

/// What a sink phase does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Work {
    /// ddbpipe's scan of the bench table into a sink (keyed, jsonl or parquet).
    Load,
    /// The database's floor on the rows of the load.
    Floor,
    /// ddbpipe's read of the bench stream into a sink.
    Stream,
}

/// The kind of destination a phase writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL schema.
    Postgres,
    /// A SQLite file with the bench's typed columns beside the document
    /// ([`TYPED_COLUMNS`]).
    #[serde(rename = "sqlite_typed")]
    SqliteTyped,
    /// A PostgreSQL schema with the bench's typed columns beside the document.
    #[serde(rename = "postgres_typed")]
    PostgresTyped,
    /// The jsonl sink on `/dev/null` (the reference of the stream and of the parquet load).
    Jsonl,
    /// Parquet files in a fresh directory (docs/sinks.md §7.10).
    Parquet,
    /// A fresh Iceberg table: its catalog a SQLite file, its warehouse a directory
    /// (docs/sinks.md §7.11).
    Iceberg,
    /// A Kafka topic, `delivery: exactly_once` (a transaction per batch with the position).
    #[serde(rename = "kafka_exactly_once")]
    KafkaExactlyOnce,
    /// A Kafka topic, `delivery: at_least_once` (the position in the state file).
    #[serde(rename = "kafka_at_least_once")]
    KafkaAtLeastOnce,
}

impl Kind {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::SqliteTyped => "sqlite_typed",
            Kind::PostgresTyped => "postgres_typed",
            Kind::Jsonl => "jsonl",
            Kind::Parquet => "parquet",
            Kind::Iceberg => "iceberg",
            Kind::KafkaExactlyOnce => "kafka_exactly_once",
            Kind::KafkaAtLeastOnce => "kafka_at_least_once",
        }
    }

    /// Whether its stream phase leaves a keyed table (else it writes each record: jsonl,
    /// Kafka, a Parquet changelog row).
    pub fn keyed(self) -> bool {
        matches!(
            self,
            Kind::Sqlite | Kind::Postgres | Kind::SqliteTyped | Kind::PostgresTyped
        )
    }

    /// The same destination with the bench's typed columns, for a keyed kind without them.
    pub fn typed(self) -> Option<Kind> {
        match self {
            Kind::Sqlite => Some(Kind::SqliteTyped),
            Kind::Postgres => Some(Kind::PostgresTyped),
            _ => None,
        }
    }

    /// The same destination without typed columns, for a typed kind.
    pub fn untyped(self) -> Option<Kind> {
        match self {
            Kind::SqliteTyped => Some(Kind::Sqlite),
            Kind::PostgresTyped => Some(Kind::Postgres),
            _ => None,
        }
    }
}

/// The typed columns of the `*_typed` destinations (docs/sinks.md §7.9): ten attributes of the
/// bench item, every column type, a path into a map.
pub const TYPED_COLUMNS: &str = "[\
    {name: name, path: name, type: text}, \
    {name: status, path: status, type: text}, \
    {name: created_at, path: created_at, type: timestamptz}, \
    {name: price, path: price, type: numeric}, \
    {name: quantity, path: quantity, type: bigint}, \
    {name: balance, path: balance, type: numeric}, \
    {name: ratio, path: ratio, type: double}, \
    {name: active, path: active, type: boolean}, \
    {name: city, path: address.city, type: text}, \
    {name: tags, path: tags, type: jsonb}]";

impl Kind {
    /// Whether the destination has [`TYPED_COLUMNS`].
    pub fn has_columns(self) -> bool {
        self.untyped().is_some()
    }
}

/// A PostgreSQL connection string; `Debug` shows it without its password.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PostgresUrl(String);

impl PostgresUrl {
    /// The connection string.
    pub fn new(url: String) -> Self {
        PostgresUrl(url)
    }

    /// The connection string, password included.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The connection string with its password hidden.
    pub fn redacted(&self) -> String {
        ddbpipe_keyed::PostgresDatabase::redact(&self.0)
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Where a phase writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Destination {
    /// A fresh SQLite file.
    Sqlite {
        /// The database file (it does not exist yet).
        path: PathBuf,
        /// With [`TYPED_COLUMNS`].
        #[serde(default)]
        columns: bool,
    },
    /// A fresh, empty schema of a PostgreSQL database.
    Postgres {
        /// The server and database.
        url: PostgresUrl,
        /// The schema (it exists and is empty).
        schema: String,
        /// With [`TYPED_COLUMNS`].
        #[serde(default)]
        columns: bool,
    },
    /// The jsonl sink on `/dev/null`.
    Jsonl,
    /// A fresh directory of Parquet files, the sink's defaults otherwise; or, `iceberg`, the
    /// warehouse of a fresh Iceberg table whose catalog is `<path>.catalog.db`.
    Parquet {
        /// The directory (it does not exist yet).
        path: PathBuf,
        /// Committed as an Iceberg table's snapshots.
        #[serde(default)]
        iceberg: bool,
    },
    /// Fresh topics of a Kafka-protocol broker.
    Kafka {
        /// `host:port`.
        brokers: String,
        /// The messages' topic (it does not exist yet).
        topic: String,
        /// The positions topic (it does not exist yet).
        positions_topic: String,
        /// `exactly_once` or `at_least_once`.
        exactly_once: bool,
    },
}

impl Destination {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Destination::Sqlite { columns: false, .. } => Kind::Sqlite,
            Destination::Sqlite { columns: true, .. } => Kind::SqliteTyped,
            Destination::Postgres { columns: false, .. } => Kind::Postgres,
            Destination::Postgres { columns: true, .. } => Kind::PostgresTyped,
            Destination::Jsonl => Kind::Jsonl,
            Destination::Parquet { iceberg: true, .. } => Kind::Iceberg,
            Destination::Parquet { .. } => Kind::Parquet,
            Destination::Kafka {
                exactly_once: true, ..
            } => Kind::KafkaExactlyOnce,
            Destination::Kafka { .. } => Kind::KafkaAtLeastOnce,
        }
    }
}

/// What one sink phase is asked to do; read as one JSON line from its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkPhaseSettings {
    /// Load, floor or stream.
    pub work: Work,
    /// Where it writes.
    pub destination: Destination,
    /// `http://127.0.0.1:<port>` of the bench server.
    pub endpoint: String,
    /// Items (load, floor) or change records (stream) the source holds: the phase must write
    /// exactly these.
    pub received: u64,
    /// Rows the destination table must hold afterwards.
    pub rows: u64,
    /// `TotalSegments` of the scan (load, floor), or shards of the stream.
    pub segments: u32,
    /// Segments (or shards) read at once.
    pub concurrency: usize,
    /// The server the phase writes to, when it runs on this machine: the PostgreSQL server's
    /// postmaster or the Kafka broker; its process tree's CPU is measured.
    pub postmaster: Option<u32>,
}

impl SinkPhaseSettings {
    /// The settings of the scan or stream read, as the other cases' phases take them.
    fn read_settings(&self) -> PhaseSettings {
        PhaseSettings {
            case: match self.work {
                Work::Load | Work::Floor => Case::Scan,
                Work::Stream => Case::Streams,
            },
            client: Client::Ddbpipe,
            endpoint: self.endpoint.clone(),
            expected: self.received,
            segments: self.segments,
            concurrency: self.concurrency,
            export_dir: None,
        }
    }
}

/// What a sink phase measured; printed as one JSON line on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkPhaseReport {
    /// Load, floor or stream.
    pub work: Work,
    /// The destination's kind.
    pub kind: Kind,
    /// Items or change records written (equal to the expected count, or the phase failed).
    pub received: u64,
    /// Rows the destination table held afterwards (jsonl: the records written; parquet: the
    /// rows of its committed files).
    pub rows: u64,
    /// Wall-clock seconds of the write.
    pub wall_secs: f64,
    /// User CPU seconds of the phase process during the write.
    pub user_secs: f64,
    /// System CPU seconds of the phase process during the write.
    pub system_secs: f64,
    /// User CPU seconds of the PostgreSQL server during the write, when measured.
    pub server_user_secs: Option<f64>,
    /// System CPU seconds of the PostgreSQL server during the write, when measured.
    pub server_system_secs: Option<f64>,
    /// Peak RSS of the phase process (`VmHWM`) at the end of the write, setup included (not
    /// the count after it: reading Parquet files back holds column chunks), KiB.
    pub peak_rss_kib: u64,
    /// Why a stream read ended (`stream disabled` or `idle`); `None` otherwise.
    pub end: Option<String>,
}

/// What a phase's write measured, before it is converted to seconds.
struct Written {
    /// Items or records written.
    received: u64,
    /// Rows counted in the destination afterwards.
    rows: u64,
    /// The phase process's time.
    measured: Measured,
    /// The server's CPU ticks, when measured.
    server: Option<CpuTicks>,
    /// Peak RSS at the end of the write (before the count), KiB.
    peak_rss_kib: u64,
    /// Why a stream read ended.
    end: Option<&'static str>,
}

/// The CPU of a PostgreSQL server (its postmaster and children) over one write.
struct ServerMeter {
    postmaster: u32,
    start: CpuTicks,
}

impl ServerMeter {
    /// Starts measuring `postmaster`'s tree; `None` when there is none to measure.
    fn start(postmaster: Option<u32>) -> anyhow::Result<Option<Self>> {
        let Some(postmaster) = postmaster else {
            return Ok(None);
        };
        let start = procfs::tree_ticks(postmaster)?
            .with_context(|| format!("the server (pid {postmaster}) is gone"))?;
        Ok(Some(ServerMeter { postmaster, start }))
    }

    /// The server's CPU ticks since [`ServerMeter::start`].
    fn stop(meter: Option<Self>) -> anyhow::Result<Option<CpuTicks>> {
        let Some(meter) = meter else {
            return Ok(None);
        };
        let now = procfs::tree_ticks(meter.postmaster)?.with_context(|| {
            format!(
                "the server (pid {}) ended during the phase",
                meter.postmaster
            )
        })?;
        Ok(Some(CpuTicks {
            user: now.user.saturating_sub(meter.start.user),
            system: now.system.saturating_sub(meter.start.system),
        }))
    }
}

/// `ddbpipe-bench sink-phase`: reads the settings from stdin, runs the phase, prints its
/// report on stdout.
pub fn phase(clk_tck: u64) -> anyhow::Result<()> {
    let settings: SinkPhaseSettings = crate::phase::settings_line()?;
    let report = run(&settings, clk_tck)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Runs one sink phase: set up, measure the write, check the counts, report.
fn run(settings: &SinkPhaseSettings, clk_tck: u64) -> anyhow::Result<SinkPhaseReport> {
    // The same runtime as `ddbpipe run` (crates/cli/src/main.rs).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let written = runtime.block_on(async {
        match settings.work {
            Work::Load => ddbpipe::load(settings).await,
            Work::Floor => floor::run(settings).await,
            Work::Stream => ddbpipe::stream(settings).await,
        }
    })?;
    anyhow::ensure!(
        written.received == settings.received && written.rows == settings.rows,
        "the {} phase into {} wrote {} of {} and left {} rows, not {}",
        work_name(settings.work),
        settings.destination.kind().name(),
        written.received,
        settings.received,
        written.rows,
        settings.rows
    );
    let ticks = clk_tck as f64;
    Ok(SinkPhaseReport {
        work: settings.work,
        kind: settings.destination.kind(),
        received: written.received,
        rows: written.rows,
        wall_secs: written.measured.wall.as_secs_f64(),
        user_secs: written.measured.user_ticks as f64 / ticks,
        system_secs: written.measured.system_ticks as f64 / ticks,
        server_user_secs: written.server.map(|t| t.user as f64 / ticks),
        server_system_secs: written.server.map(|t| t.system as f64 / ticks),
        peak_rss_kib: written.peak_rss_kib,
        end: written.end.map(str::to_string),
    })
}

/// The name of a phase's work in messages.
pub fn work_name(work: Work) -> &'static str {
    match work {
        Work::Load => "load",
        Work::Floor => "floor",
        Work::Stream => "stream",
    }
}
