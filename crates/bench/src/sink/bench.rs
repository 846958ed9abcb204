//! `ddbpipe-bench --case sink`: the phases in order, each in a process of its own, and the
//! report.
//!
//! # Order
//! At each concurrency and run: per keyed destination (SQLite, then PostgreSQL) the load and
//! its floor, each into a fresh file or schema, in alternating order from run to run; the two
//! tables are compared, then removed. Then the load into jsonl (`/dev/null`) and into parquet
//! (a fresh directory, removed after its count), alternating. Then the stream into each keyed
//! destination, into jsonl, into parquet and into Kafka (exactly once, at least once; when a
//! broker is given), alternating too, each keyed or parquet one into a fresh file, schema or
//! directory, removed after its count. The bench server serves the table and the stream
//! throughout.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use ddbpipe_source::streams::shard_reader::READ_SPACING;

use super::databases::{self, Admin, Filesystem};
use super::report::{self, SinkSetup, SqliteSetup};
use super::{Destination, Kind, SinkPhaseReport, SinkPhaseSettings, Work, work_name};
use crate::records::{self, PAGE_RECORDS};
use crate::server::Ready;
use crate::{BenchArgs, WhichSink};

/// Everything the phases of one bench run share.
struct Bench<'a> {
    exe: &'a Path,
    args: &'a BenchArgs,
    clk_tck: u64,
    endpoint: String,
    shards: u32,
    /// Rows a keyed table holds after the stream.
    stream_rows: u64,
    /// Holds the SQLite files and Parquet directories (removed at the end).
    dir: tempfile::TempDir,
    admin: Option<Admin>,
    postmaster: Option<u32>,
    /// The Kafka broker, when one was given.
    kafka: Option<String>,
    /// The broker's process, when it runs here: its CPU is measured.
    kafka_pid: Option<u32>,
}

/// Runs the sink case and prints its report.
pub fn run(exe: &Path, args: &BenchArgs, shards: u32, clk: (u64, bool)) -> anyhow::Result<()> {
    let mut kinds = match args.sink {
        WhichSink::Sqlite => vec![Kind::Sqlite],
        WhichSink::Postgres => vec![Kind::Postgres],
        WhichSink::Both => vec![Kind::Sqlite, Kind::Postgres],
    };
    let url = databases::postgres_url(args.postgres_url.as_deref());
    let mut postgres_skipped = None;
    if kinds.contains(&Kind::Postgres) && url.is_none() {
        let why = "no --postgres-url and DDBPIPE_TEST_POSTGRES_URL is not set";
        ensure!(
            args.sink != WhichSink::Postgres,
            "--sink postgres needs a server: {why}; run \
             `bash -c 'source scripts/postgres.sh; ddbpipe-bench --case sink'`"
        );
        eprintln!(
            "ddbpipe-bench: PostgreSQL skipped: {why} (run `bash -c 'source \
             scripts/postgres.sh; ddbpipe-bench --case sink'` to measure it too)"
        );
        kinds.retain(|k| *k != Kind::Postgres);
        postgres_skipped = Some(why.to_string());
    }
    let kafka = args
        .kafka_brokers
        .clone()
        .or_else(|| std::env::var("DDBPIPE_TEST_KAFKA_BROKERS").ok())
        .filter(|brokers| !brokers.trim().is_empty());
    let kafka_kinds: Vec<Kind> = if kafka.is_some() {
        vec![Kind::KafkaExactlyOnce, Kind::KafkaAtLeastOnce]
    } else {
        eprintln!(
            "ddbpipe-bench: Kafka skipped: no --kafka-brokers and DDBPIPE_TEST_KAFKA_BROKERS is \
             not set (run `bash -c 'source scripts/kafka.sh; ddbpipe-bench --case sink'` to \
             measure it too)"
        );
        Vec::new()
    };
    let admin = match url {
        Some(url) if kinds.contains(&Kind::Postgres) => Some(Admin::connect(url)?),
        _ => None,
    };
    let server_info = admin.as_ref().map(Admin::server).transpose()?;
    let dir = tempfile::Builder::new()
        .prefix("ddbpipe-bench-sink.")
        .tempdir()
        .context("cannot create the directory of the SQLite files and Parquet directories")?;
    let filesystem = Filesystem::of(dir.path())?;
    if !args.json {
        eprintln!(
            "ddbpipe-bench: building {} items and {} change records in {shards} shards...",
            args.items, args.records
        );
    }
    let stream_rows = records::rows_after(args.records);
    let (server, ready) = crate::spawn_server(exe, args, args.items, args.records, shards)?;
    let mut bench = Bench {
        exe,
        args,
        clk_tck: clk.0,
        endpoint: format!("http://127.0.0.1:{}", ready.port),
        shards,
        stream_rows,
        dir,
        postmaster: server_info.as_ref().and_then(|s| s.postmaster),
        admin,
        kafka,
        kafka_pid: args.kafka_pid.or_else(|| {
            std::env::var("DDBPIPE_TEST_KAFKA_PID")
                .ok()
                .and_then(|pid| pid.trim().parse().ok())
        }),
    };

    let mut reports: Vec<(usize, SinkPhaseReport)> = Vec::new();
    for &concurrency in &args.concurrency {
        for run in 0..args.runs {
            for &kind in &kinds {
                let pair = bench.load_and_floor(kind, concurrency, run)?;
                reports.extend(pair.into_iter().map(|r| (concurrency, r)));
                // The same load with ten typed columns beside the document (issue 28's
                // measure: typed ÷ document-only, in this run).
                if let Some(typed) = kind.typed() {
                    let report = bench.load(typed, concurrency, run)?;
                    reports.push((concurrency, report));
                }
            }
            // The parquet load beside the jsonl load of the same table (issue 29: parquet ÷
            // jsonl), the scan case's ddbpipe phase.
            let mut lake = [Kind::Jsonl, Kind::Parquet, Kind::Iceberg];
            if run % 2 == 1 {
                lake.reverse();
            }
            for kind in lake {
                let report = bench.load(kind, concurrency, run)?;
                reports.push((concurrency, report));
            }
            let mut order: Vec<Kind> = kinds
                .iter()
                .copied()
                .chain(kinds.iter().filter_map(|kind| kind.typed()))
                .chain([Kind::Jsonl, Kind::Parquet, Kind::Iceberg])
                .chain(kafka_kinds.iter().copied())
                .collect();
            if run % 2 == 1 {
                order.reverse();
            }
            for kind in order {
                let report = bench.stream(kind, concurrency, run)?;
                reports.push((concurrency, report));
            }
        }
    }
    drop(server);

    for (printed, &concurrency) in args.concurrency.iter().enumerate() {
        let runs: Vec<SinkPhaseReport> = reports
            .iter()
            .filter(|(c, _)| *c == concurrency)
            .map(|(_, r)| r.clone())
            .collect();
        let setup = SinkSetup {
            items: ready.items,
            mean_item_bytes: ready.mean_item_bytes,
            segments: args.segments,
            concurrency,
            page_items: args.page_items,
            records: ready.records,
            shards: ready.shards,
            stream_rows,
            mean_record_bytes: ready.mean_record_bytes,
            stream_pacing_floor_secs: pacing_floor(&ready),
            runs: args.runs,
            clk_tck: clk.0,
            clk_tck_measured: clk.1,
            sqlite: kinds.contains(&Kind::Sqlite).then(|| SqliteSetup {
                version: databases::sqlite_version().to_string(),
                filesystem: filesystem.clone(),
            }),
            postgres: server_info.clone(),
            postgres_skipped: postgres_skipped.clone(),
            parquet: Some(filesystem.clone()),
        };
        let summaries = report::summaries(&runs, &kinds);
        if args.json {
            println!("{}", report::json_line(&setup, &summaries));
        } else {
            if printed > 0 {
                println!();
            }
            print!("{}", report::table(&setup, &summaries));
        }
    }
    Ok(())
}

/// The least wall time of the stream read: every shard at once.
fn pacing_floor(ready: &Ready) -> f64 {
    crate::report::pacing_floor(
        ready.records,
        ready.shards,
        ready.shards as usize,
        PAGE_RECORDS,
        READ_SPACING,
    )
}

impl Bench<'_> {
    /// A fresh destination of `kind` for one phase (`name` tells the phases apart).
    fn destination(&mut self, kind: Kind, name: &str) -> anyhow::Result<Destination> {
        match kind {
            Kind::Sqlite | Kind::SqliteTyped => {
                let path = self.dir.path().join(format!("{name}.db"));
                ensure!(!path.exists(), "{} exists already", path.display());
                Ok(Destination::Sqlite {
                    path,
                    columns: kind.has_columns(),
                })
            }
            Kind::Postgres | Kind::PostgresTyped => {
                let admin = self
                    .admin
                    .as_mut()
                    .context("no PostgreSQL server to write to")?;
                Ok(Destination::Postgres {
                    url: admin.url().clone(),
                    schema: admin.create_schema(name)?,
                    columns: kind.has_columns(),
                })
            }
            Kind::Jsonl => Ok(Destination::Jsonl),
            Kind::Parquet | Kind::Iceberg => {
                let path = self.dir.path().join(name);
                ensure!(!path.exists(), "{} exists already", path.display());
                Ok(Destination::Parquet {
                    path,
                    iceberg: kind == Kind::Iceberg,
                })
            }
            Kind::KafkaExactlyOnce | Kind::KafkaAtLeastOnce => {
                let brokers = self.kafka.clone().context("no Kafka broker to write to")?;
                // Fresh topics for every phase: nothing to resume, nothing of another run.
                let unique = format!(
                    "{name}-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                );
                Ok(Destination::Kafka {
                    brokers,
                    topic: format!("bench-{}-{unique}", kind.name().replace('_', "-")),
                    positions_topic: format!("bench-positions-{unique}"),
                    exactly_once: kind == Kind::KafkaExactlyOnce,
                })
            }
        }
    }

    /// Removes a destination once its phases are done.
    fn remove(&mut self, destination: &Destination) -> anyhow::Result<()> {
        match destination {
            Destination::Sqlite { path, .. } => {
                for suffix in ["", "-wal", "-shm"] {
                    let file = PathBuf::from(format!("{}{suffix}", path.display()));
                    if file.exists() {
                        std::fs::remove_file(&file)
                            .with_context(|| format!("cannot remove {}", file.display()))?;
                    }
                }
                // The run locks beside the database (`<path>-ddbpipe-<pipeline>.lock`).
                let prefix = format!("{}-ddbpipe-", file_name(path));
                for entry in std::fs::read_dir(self.dir.path())? {
                    let entry = entry?;
                    if entry.file_name().to_string_lossy().starts_with(&prefix) {
                        std::fs::remove_file(entry.path())?;
                    }
                }
                Ok(())
            }
            Destination::Postgres { schema, .. } => match self.admin.as_mut() {
                Some(admin) => admin.drop_schema(schema),
                None => Ok(()),
            },
            Destination::Parquet { path, .. } => {
                if path.exists() {
                    std::fs::remove_dir_all(path)
                        .with_context(|| format!("cannot remove {}", path.display()))?;
                }
                let catalog = PathBuf::from(format!("{}.catalog.db", path.display()));
                if catalog.exists() {
                    std::fs::remove_file(&catalog)
                        .with_context(|| format!("cannot remove {}", catalog.display()))?;
                }
                Ok(())
            }
            // The broker's topics stay (an in-memory broker forgets them when it stops).
            Destination::Jsonl | Destination::Kafka { .. } => Ok(()),
        }
    }

    /// ddbpipe's load into `kind` and its floor, in the run's order; checks they wrote the
    /// same rows.
    fn load_and_floor(
        &mut self,
        kind: Kind,
        concurrency: usize,
        run: u32,
    ) -> anyhow::Result<Vec<SinkPhaseReport>> {
        let mut order = [Work::Load, Work::Floor];
        if run % 2 == 1 {
            order.reverse();
        }
        let tag = format!("c{concurrency}_r{run}");
        let ddbpipe = self.destination(kind, &format!("load_{tag}"))?;
        let floor = self.destination(kind, &format!("floor_{tag}"))?;
        let mut reports = Vec::new();
        for work in order {
            let destination = match work {
                Work::Floor => &floor,
                _ => &ddbpipe,
            };
            let settings = SinkPhaseSettings {
                work,
                destination: destination.clone(),
                endpoint: self.endpoint.clone(),
                received: self.args.items,
                rows: self.args.items,
                segments: self.args.segments,
                concurrency,
                postmaster: self.postmaster.filter(|_| kind == Kind::Postgres),
            };
            reports.push(self.phase(&settings, concurrency, run)?);
        }
        let differing = match (&ddbpipe, &floor) {
            (Destination::Sqlite { path: a, .. }, Destination::Sqlite { path: b, .. }) => {
                databases::sqlite_difference(a, b)?
            }
            (Destination::Postgres { schema: a, .. }, Destination::Postgres { schema: b, .. }) => {
                self.admin
                    .as_ref()
                    .context("no PostgreSQL server")?
                    .difference(a, b)?
            }
            _ => bail!("the load and its floor wrote different kinds of destination"),
        };
        ensure!(
            differing == 0,
            "the {} floor's table differs from ddbpipe's in {differing} rows (keys or documents)",
            kind.name()
        );
        self.remove(&ddbpipe)?;
        self.remove(&floor)?;
        Ok(reports)
    }

    /// ddbpipe's load alone into `kind`: a typed destination (the floor has no typed columns
    /// to compare with), jsonl or parquet.
    fn load(
        &mut self,
        kind: Kind,
        concurrency: usize,
        run: u32,
    ) -> anyhow::Result<SinkPhaseReport> {
        let name = format!("load_{}_c{concurrency}_r{run}", kind.name());
        let destination = self.destination(kind, &name)?;
        let settings = SinkPhaseSettings {
            work: Work::Load,
            destination: destination.clone(),
            endpoint: self.endpoint.clone(),
            received: self.args.items,
            rows: self.args.items,
            segments: self.args.segments,
            concurrency,
            postmaster: self
                .postmaster
                .filter(|_| matches!(kind, Kind::Postgres | Kind::PostgresTyped)),
        };
        let report = self.phase(&settings, concurrency, run)?;
        self.remove(&destination)?;
        Ok(report)
    }

    /// ddbpipe's stream read into `kind`.
    fn stream(
        &mut self,
        kind: Kind,
        concurrency: usize,
        run: u32,
    ) -> anyhow::Result<SinkPhaseReport> {
        let destination = self.destination(kind, &format!("stream_c{concurrency}_r{run}"))?;
        let settings = SinkPhaseSettings {
            work: Work::Stream,
            destination: destination.clone(),
            endpoint: self.endpoint.clone(),
            received: self.args.records,
            rows: if kind.keyed() {
                self.stream_rows
            } else {
                self.args.records
            },
            segments: self.shards,
            // Every shard at once: a shard's pacing is not the limit.
            concurrency: self.shards as usize,
            // The server whose CPU is measured beside the phase: PostgreSQL's or the broker's.
            postmaster: match kind {
                Kind::Postgres | Kind::PostgresTyped => self.postmaster,
                Kind::KafkaExactlyOnce | Kind::KafkaAtLeastOnce => self.kafka_pid,
                Kind::Sqlite | Kind::SqliteTyped | Kind::Jsonl | Kind::Parquet | Kind::Iceberg => {
                    None
                }
            },
        };
        let report = self.phase(&settings, concurrency, run)?;
        self.remove(&destination)?;
        Ok(report)
    }

    /// Runs one phase in a process of its own and checks its counts.
    fn phase(
        &self,
        settings: &SinkPhaseSettings,
        concurrency: usize,
        run: u32,
    ) -> anyhow::Result<SinkPhaseReport> {
        let kind = settings.destination.kind();
        let name = format!("{} {}", work_name(settings.work), kind.name());
        if !self.args.json {
            eprintln!(
                "ddbpipe-bench: sink at concurrency {concurrency}, run {} of {}: {name}...",
                run + 1,
                self.args.runs
            );
        }
        let report: SinkPhaseReport =
            crate::phase::in_process(self.exe, "sink-phase", self.clk_tck, settings, &name)?;
        ensure!(
            report.received == settings.received && report.rows == settings.rows,
            "the {name} phase wrote {} of {} and left {} rows, not {}",
            report.received,
            settings.received,
            report.rows,
            settings.rows
        );
        Ok(report)
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
