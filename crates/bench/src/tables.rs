//! `ddbpipe-bench --case tables`: many tables in one process (issue 30, docs/config.md §1.5)
//! beside one table of the same items. `--tables` tables (`bench-00`, `bench-01`, …) of
//! `--items / --tables` items each are mirrored by one `source.tables` pipeline, and one table
//! of `--items` items by a pipeline of one table, each into a fresh SQLite file or PostgreSQL
//! schema (`--sink`; a destination table per table), each in a process of its own
//! (`tables-phase`, hidden), alternating from run to run. Reported: wall time, CPU and peak
//! RSS of each, and the ratios of the many tables to the one.
//!
//! The mirror is the one `ddbpipe run` does (`mode: mirror`): the snapshot by parallel scan,
//! every table's snapshot marks, its cleanup, then its stream until it has been idle for a
//! second (the bench server's stream, its shards empty: each table lists it and polls every
//! shard until then). The whole of it is timed, from the tables' set-up (clients,
//! `DescribeTable`, the database, each table's position) to the last table's end: what a
//! user waits for. Each phase checks every destination table holds exactly its table's items,
//! and fails loudly otherwise.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::items::TABLE;
use crate::procfs::{self, Meter};
use crate::sink::PostgresUrl;
use crate::sink::databases::{self, Admin};
use crate::{BenchArgs, WhichSink};

/// What one phase reads and where it writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TablesPhaseSettings {
    /// The bench server.
    pub endpoint: String,
    /// The tables read (`bench-00`, …); empty: the one table `bench`.
    pub tables: Vec<String>,
    /// Rows each destination table must end with.
    pub rows: u64,
    /// `segments` and `max_concurrency` of each table's scan.
    pub segments: u32,
    pub concurrency: usize,
    /// Where the tables go (fresh).
    pub into: Target,
}

/// A phase's destination.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Target {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A schema of a PostgreSQL server.
    Postgres { url: PostgresUrl, schema: String },
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Sqlite(_) => "sqlite",
            Target::Postgres { .. } => "postgres",
        }
    }

    /// The pipeline file's `sink:` section.
    fn sink(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("{{type: sqlite, path: '{}'}}", path.display()),
            Target::Postgres { url, schema } => {
                format!(
                    "{{type: postgres, url: '{}', schema: {schema}}}",
                    url.expose()
                )
            }
        }
    }

    /// The rows of destination table `table`.
    async fn count(&self, table: &str) -> anyhow::Result<u64> {
        let sql = |qualified: String| format!("SELECT count(*) FROM {qualified}");
        match self {
            Target::Sqlite(path) => {
                let db = rusqlite::Connection::open(path).context("cannot open the SQLite file")?;
                let count: u64 =
                    db.query_row(&sql(format!("\"{table}\"")), [], |row| row.get(0))?;
                Ok(count)
            }
            Target::Postgres { url, schema } => {
                let (client, connection) =
                    tokio_postgres::connect(url.expose(), tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                let row = client
                    .query_one(&sql(format!("\"{schema}\".\"{table}\"")), &[])
                    .await?;
                Ok(u64::try_from(row.get::<_, i64>(0))?)
            }
        }
    }
}

/// What one phase measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TablesPhaseReport {
    pub tables: usize,
    /// Rows in all destination tables together.
    pub rows: u64,
    pub wall_secs: f64,
    pub cpu_secs: f64,
    pub peak_rss_kib: u64,
}

/// The destination table names of `tables` (the one table: the bench table's own name).
fn names(settings: &TablesPhaseSettings) -> Vec<String> {
    match settings.tables.is_empty() {
        true => vec![TABLE.to_string()],
        false => settings.tables.clone(),
    }
}

/// The pipeline file of a phase: the mirror of its table or tables into its SQLite file.
fn yaml(settings: &TablesPhaseSettings) -> String {
    let tables = match settings.tables.is_empty() {
        true => format!("table_name: {TABLE}"),
        false => format!("tables: [{}]", settings.tables.join(", ")),
    };
    format!(
        "name: bench\n\
         source: {{{tables}, region: us-east-1, endpoint_url: '{endpoint}', \
         credentials: {{type: access_key, config: {{access_key_id: AKIDBENCH, \
         secret_access_key: bench-secret}}}}, mode: mirror, segments: {segments}, \
         max_concurrency: {concurrency}, poll_interval_ms: 200, idle_termination_secs: 1}}\n\
         sink: {sink}\n",
        endpoint = settings.endpoint,
        segments = settings.segments,
        concurrency = settings.concurrency,
        sink = settings.into.sink(),
    )
}

/// `tables-phase`: reads its settings (a JSON line on stdin), mirrors, checks the rows and
/// prints its report as a JSON line.
pub fn phase(clk_tck: u64) -> anyhow::Result<()> {
    let settings: TablesPhaseSettings = crate::phase::settings_line()?;
    // The same runtime as `ddbpipe run` (crates/cli/src/main.rs).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let dir = tempfile::tempdir().context("cannot create the pipeline's directory")?;
    let file = ddbpipe::Pipeline::from_yaml(&yaml(&settings), dir.path())
        .map_err(|error| anyhow::anyhow!("the bench pipeline: {error}"))?;
    let meter = Meter::start()?;
    runtime.block_on(mirror(&file))?;
    let measured = meter.stop()?;
    let peak_rss_kib = procfs::peak_rss_kib()?;
    let mut rows = 0;
    for table in names(&settings) {
        let count = runtime
            .block_on(settings.into.count(&table))
            .with_context(|| format!("cannot count the rows of {table}"))?;
        ensure!(
            count == settings.rows,
            "table {table} holds {count} rows, not {}",
            settings.rows
        );
        rows += count;
    }
    let ticks = measured.user_ticks + measured.system_ticks;
    let report = TablesPhaseReport {
        tables: names(&settings).len(),
        rows,
        wall_secs: measured.wall.as_secs_f64(),
        cpu_secs: ticks as f64 / clk_tck as f64,
        peak_rss_kib,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Every table's pipeline of `file` run at once to its end, as `ddbpipe run` runs a file of
/// several tables; the first failure is the phase's.
async fn mirror(file: &ddbpipe::Pipeline) -> anyhow::Result<()> {
    let tables = match file.table().is_empty() {
        true => file
            .tables()
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))?,
        false => vec![file.clone()],
    };
    let runs = tables.iter().map(|pipeline| async move {
        let opened = pipeline
            .open(ddbpipe::Cancel::never())
            .await
            .map_err(|error| anyhow::anyhow!("table {}: {error}", pipeline.table()))?;
        let summary = opened
            .run()
            .await
            .map_err(|error| anyhow::anyhow!("table {}: {error}", pipeline.table()))?;
        match summary.ended() {
            ddbpipe::Ended::Idle | ddbpipe::Ended::StreamDisabled => Ok(()),
            other => bail!("table {}: the mirror ended {other:?}", pipeline.table()),
        }
    });
    for ended in futures_util::future::join_all(runs).await {
        ended?;
    }
    Ok(())
}

/// Runs the tables case and prints its report.
pub fn run(exe: &Path, args: &BenchArgs, clk_tck: u64) -> anyhow::Result<()> {
    let url = databases::postgres_url(args.postgres_url.as_deref());
    let mut admin = match (args.sink, url) {
        (WhichSink::Sqlite, _) => None,
        (_, Some(url)) => Some(Admin::connect(url)?),
        (WhichSink::Postgres, None) => bail!(
            "--sink postgres needs a server: no --postgres-url and DDBPIPE_TEST_POSTGRES_URL \
             is not set; run `bash -c 'source scripts/postgres.sh; ddbpipe-bench --case tables'`"
        ),
        (WhichSink::Both, None) => {
            eprintln!(
                "ddbpipe-bench: PostgreSQL skipped: no --postgres-url and \
                 DDBPIPE_TEST_POSTGRES_URL is not set"
            );
            None
        }
    };
    let count = args.tables;
    ensure!(
        args.items.is_multiple_of(u64::from(count)),
        "--items ({}) must be a multiple of --tables ({count})",
        args.items
    );
    let per_table = args.items / u64::from(count);
    if !args.json {
        eprintln!(
            "ddbpipe-bench: building one table of {} items and {count} tables of {per_table}...",
            args.items
        );
    }
    // An empty stream: the mirrors' stream halves list and poll it, and change nothing.
    let records = 0;
    let (_one_server, one) = crate::spawn_server(exe, args, args.items, records, args.shards())?;
    let (_many_server, many) = crate::spawn_server(exe, args, per_table, records, args.shards())?;
    let dir = tempfile::Builder::new()
        .prefix("ddbpipe-bench-tables.")
        .tempdir()
        .context("cannot create the directory of the SQLite files")?;
    let targets: Vec<&'static str> = match (args.sink, &admin) {
        (WhichSink::Sqlite, _) | (WhichSink::Both, None) => vec!["sqlite"],
        (WhichSink::Postgres, _) => vec!["postgres"],
        (WhichSink::Both, Some(_)) => vec!["sqlite", "postgres"],
    };
    let mut reports: Vec<(&'static str, bool, TablesPhaseReport)> = Vec::new();
    for run in 0..args.runs {
        let mut order: Vec<(&'static str, bool)> = targets
            .iter()
            .flat_map(|target| [(*target, false), (*target, true)])
            .collect();
        if run % 2 == 1 {
            order.reverse();
        }
        for (target, several) in order {
            let (port, items) = match several {
                false => (one.port, args.items),
                true => (many.port, per_table),
            };
            let into = match (target, admin.as_mut()) {
                ("postgres", Some(admin)) => Target::Postgres {
                    url: admin.url().clone(),
                    schema: admin.create_schema("tables")?,
                },
                _ => Target::Sqlite(dir.path().join(format!("run{run}-{several}.db"))),
            };
            let settings = TablesPhaseSettings {
                endpoint: format!("http://127.0.0.1:{port}"),
                tables: match several {
                    false => Vec::new(),
                    true => (0..count).map(|i| format!("{TABLE}-{i:02}")).collect(),
                },
                rows: items,
                segments: args.segments,
                concurrency: args.concurrency[0],
                into,
            };
            if !args.json {
                eprintln!(
                    "ddbpipe-bench: tables, run {} of {}: {} into {}...",
                    run + 1,
                    args.runs,
                    match several {
                        false => format!("one table of {items} items"),
                        true => format!("{count} tables of {items} items"),
                    },
                    settings.into.name()
                );
            }
            let report: TablesPhaseReport =
                crate::phase::in_process(exe, "tables-phase", clk_tck, &settings, "tables")?;
            match &settings.into {
                Target::Sqlite(path) => {
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                    }
                }
                Target::Postgres { schema, .. } => {
                    if let Some(admin) = admin.as_mut() {
                        admin.drop_schema(schema)?;
                    }
                }
            }
            reports.push((target, several, report));
        }
    }
    let median = |target: &str, several: bool, of: fn(&TablesPhaseReport) -> f64| {
        let mut values: Vec<f64> = reports
            .iter()
            .filter(|(t, s, _)| *t == target && *s == several)
            .map(|(_, _, report)| of(report))
            .collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let wall = |t: &str, s: bool| median(t, s, |r| r.wall_secs);
    let cpu = |t: &str, s: bool| median(t, s, |r| r.cpu_secs);
    let rss = |t: &str, s: bool| median(t, s, |r| r.peak_rss_kib as f64 / 1024.0);
    let rows = |t: &str, s: bool| median(t, s, |r| r.rows as f64);
    if args.json {
        let side = |t: &str, s: bool| {
            serde_json::json!({
                "tables": if s { count } else { 1 },
                "rows": rows(t, s), "wall_secs": wall(t, s), "cpu_secs": cpu(t, s),
                "peak_rss_mib": rss(t, s), "rows_per_sec": rows(t, s) / wall(t, s),
            })
        };
        for target in &targets {
            let line = serde_json::json!({
                "case": "tables", "into": target, "runs": args.runs, "items": args.items,
                "one": side(target, false), "many": side(target, true),
                "wall_ratio": wall(target, true) / wall(target, false),
                "cpu_ratio": cpu(target, true) / cpu(target, false),
                "rss_ratio": rss(target, true) / rss(target, false),
            });
            println!("{line}");
        }
        return Ok(());
    }
    println!(
        "tables: a mirror by one process (medians of {} run(s); an empty stream)",
        args.runs
    );
    println!(
        "{:<36} {:>10} {:>9} {:>12} {:>9} {:>13}",
        "", "rows", "wall s", "rows/s", "CPU s", "peak RSS MiB"
    );
    for target in &targets {
        for (several, label) in [
            (false, format!("1 table of {} into {target}", args.items)),
            (true, format!("{count} tables of {per_table} into {target}")),
        ] {
            println!(
                "{label:<36} {:>10} {:>9.2} {:>12.0} {:>9.2} {:>13.1}",
                rows(target, several),
                wall(target, several),
                rows(target, several) / wall(target, several),
                cpu(target, several),
                rss(target, several)
            );
        }
        println!(
            "{target}, many ÷ one: wall {:.2}×, CPU {:.2}×, peak RSS {:.2}×",
            wall(target, true) / wall(target, false),
            cpu(target, true) / cpu(target, false),
            rss(target, true) / rss(target, false)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_many_tables_phase_reads_a_list_into_a_table_each() {
        let settings = TablesPhaseSettings {
            endpoint: "http://127.0.0.1:1".into(),
            tables: vec!["bench-00".into(), "bench-01".into()],
            rows: 10,
            segments: 4,
            concurrency: 4,
            into: Target::Sqlite(PathBuf::from("/tmp/x.db")),
        };
        let file = ddbpipe::Pipeline::from_yaml(&yaml(&settings), Path::new("/tmp"))
            .expect("the bench's pipeline file loads");
        assert_eq!(file.table(), "", "a file of several tables");
        assert_eq!(names(&settings), ["bench-00", "bench-01"]);
        let one = TablesPhaseSettings {
            tables: Vec::new(),
            ..settings
        };
        let file = ddbpipe::Pipeline::from_yaml(&yaml(&one), Path::new("/tmp"))
            .expect("the bench's pipeline file loads");
        assert_eq!(file.table(), TABLE);
        assert_eq!(names(&one), [TABLE]);
        let into = Target::Postgres {
            url: PostgresUrl::new("postgres://u:secret@h/db?sslmode=disable".into()),
            schema: "s1".into(),
        };
        assert_eq!(into.name(), "postgres");
        let postgres = TablesPhaseSettings { into, ..one };
        ddbpipe::Pipeline::from_yaml(&yaml(&postgres), Path::new("/tmp"))
            .expect("the postgres pipeline file loads");
    }
}
