//! `ddbpipe-bench --case tables`: many tables in one process (issue 30, docs/config.md §1.5)
//! beside one table of the same items. `--tables` tables (`bench-00`, `bench-01`, …) of
//! `--items / --tables` items each are mirrored by one `source.tables` pipeline, and one table
//! of `--items` items by a pipeline of one table, each into a fresh SQLite file (a destination
//! table per table), each in a process of its own (`tables-phase`, hidden), alternating from
//! run to run. Reported: wall time, CPU and peak RSS of each, and the ratios of the many
//! tables to the one.
//!
//! The mirror is the one `ddbpipe run` does (`mode: mirror`): the snapshot by parallel scan,
//! every table's snapshot marks, its cleanup, then its stream until it has been idle for a
//! second (the bench server's stream, its shards empty: each table lists it and polls every
//! shard until then). The whole of it is timed, from the tables' set-up (clients,
//! `DescribeTable`, the database, each table's position) to the last table's end: what a
//! user waits for. Each phase checks every destination table holds exactly its table's items,
//! and fails loudly otherwise.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::BenchArgs;
use crate::items::TABLE;
use crate::procfs::{self, Meter};

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
    /// The SQLite file written (fresh).
    pub path: PathBuf,
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
         sink: {{type: sqlite, path: '{path}'}}\n",
        endpoint = settings.endpoint,
        segments = settings.segments,
        concurrency = settings.concurrency,
        path = settings.path.display(),
    )
}

/// `tables-phase`: reads its settings (a JSON line on stdin), mirrors, checks the rows and
/// prints its report as a JSON line.
pub fn phase(clk_tck: u64) -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the phase's settings")?;
    let settings: TablesPhaseSettings =
        serde_json::from_str(line.trim()).context("the phase's settings do not parse")?;
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
    let db = rusqlite::Connection::open(&settings.path).context("cannot open the SQLite file")?;
    for table in names(&settings) {
        let count: u64 = db
            .query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |row| {
                row.get(0)
            })
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
    let mut reports: Vec<(bool, TablesPhaseReport)> = Vec::new();
    for run in 0..args.runs {
        let mut order = [false, true];
        if run % 2 == 1 {
            order.reverse();
        }
        for several in order {
            let (port, items) = match several {
                false => (one.port, args.items),
                true => (many.port, per_table),
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
                path: dir.path().join(format!("run{run}-{several}.db")),
            };
            if !args.json {
                eprintln!(
                    "ddbpipe-bench: tables, run {} of {}: {}...",
                    run + 1,
                    args.runs,
                    match several {
                        false => format!("one table of {items} items"),
                        true => format!("{count} tables of {items} items"),
                    }
                );
            }
            let report = one_phase(exe, &settings, clk_tck)?;
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", settings.path.display()));
            }
            reports.push((several, report));
        }
    }
    let median = |several: bool, of: fn(&TablesPhaseReport) -> f64| {
        let mut values: Vec<f64> = reports
            .iter()
            .filter(|(s, _)| *s == several)
            .map(|(_, report)| of(report))
            .collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let wall = |s| median(s, |r| r.wall_secs);
    let cpu = |s| median(s, |r| r.cpu_secs);
    let rss = |s| median(s, |r| r.peak_rss_kib as f64 / 1024.0);
    let rows = |s| median(s, |r| r.rows as f64);
    if args.json {
        let side = |s: bool| {
            serde_json::json!({
                "tables": if s { count } else { 1 },
                "rows": rows(s), "wall_secs": wall(s), "cpu_secs": cpu(s), "peak_rss_mib": rss(s),
                "rows_per_sec": rows(s) / wall(s),
            })
        };
        let line = serde_json::json!({
            "case": "tables", "runs": args.runs, "items": args.items,
            "one": side(false), "many": side(true),
            "wall_ratio": wall(true) / wall(false),
            "cpu_ratio": cpu(true) / cpu(false),
            "rss_ratio": rss(true) / rss(false),
        });
        println!("{line}");
        return Ok(());
    }
    println!(
        "tables: a mirror into SQLite by one process (medians of {} run(s); an empty stream)",
        args.runs
    );
    println!(
        "{:<26} {:>10} {:>9} {:>12} {:>9} {:>13}",
        "", "rows", "wall s", "rows/s", "CPU s", "peak RSS MiB"
    );
    for (several, label) in [
        (false, format!("1 table of {}", args.items)),
        (true, format!("{count} tables of {per_table}")),
    ] {
        println!(
            "{label:<26} {:>10} {:>9.2} {:>12.0} {:>9.2} {:>13.1}",
            rows(several),
            wall(several),
            rows(several) / wall(several),
            cpu(several),
            rss(several)
        );
    }
    println!(
        "many ÷ one: wall {:.2}×, CPU {:.2}×, peak RSS {:.2}×",
        wall(true) / wall(false),
        cpu(true) / cpu(false),
        rss(true) / rss(false)
    );
    Ok(())
}

/// Runs one phase in a process of its own.
fn one_phase(
    exe: &Path,
    settings: &TablesPhaseSettings,
    clk_tck: u64,
) -> anyhow::Result<TablesPhaseReport> {
    let mut child = Command::new(exe)
        .args(["tables-phase", "--clk-tck", &clk_tck.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start the tables phase")?;
    {
        let mut stdin = child.stdin.take().context("the phase has no stdin")?;
        writeln!(stdin, "{}", serde_json::to_string(settings)?)
            .context("cannot start the tables phase")?;
    }
    let stdout = child.stdout.take().context("the phase has no stdout")?;
    let mut last = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("cannot read the phase's report")?;
        if !line.trim().is_empty() {
            last = line;
        }
    }
    let status = child.wait().context("the tables phase did not end")?;
    if !status.success() {
        bail!("the tables phase failed ({status}); its error is above");
    }
    serde_json::from_str(&last).with_context(|| format!("the tables phase printed {last:?}"))
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
            path: PathBuf::from("/tmp/x.db"),
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
    }
}
