//! The sink case's summaries: per phase kind and destination the median over runs; ddbpipe
//! against each database's floor, and each load and stream against the jsonl one (the parquet
//! sink's too), as ratios within the one bench run.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::json;

use super::databases::{Filesystem, Server};
use super::{Kind, SinkPhaseReport, Work};
use crate::report::median;

/// How the SQLite destinations were set up.
#[derive(Debug, Clone, Serialize)]
pub struct SqliteSetup {
    /// The SQLite library's version.
    pub version: String,
    /// The filesystem of the files.
    pub filesystem: Filesystem,
}

/// How the sink case was run, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct SinkSetup {
    /// Items in the table: the rows of a load.
    pub items: u64,
    /// Mean DynamoDB size of an item, bytes.
    pub mean_item_bytes: f64,
    /// `TotalSegments` of the load's scan.
    pub segments: u32,
    /// Segments read at once.
    pub concurrency: usize,
    /// Items per page.
    pub page_items: u64,
    /// Change records in the stream.
    pub records: u64,
    /// Closed shards holding them (all read at once).
    pub shards: u32,
    /// Rows a keyed table holds after the stream.
    pub stream_rows: u64,
    /// Mean `SizeBytes` of a change record, bytes.
    pub mean_record_bytes: f64,
    /// The least wall time ddbpipe's pacing allows for the stream (see the streams case).
    pub stream_pacing_floor_secs: f64,
    /// Runs of each phase.
    pub runs: u32,
    /// Clock ticks per second used to convert CPU time.
    pub clk_tck: u64,
    /// Whether `clk_tck` came from `getconf CLK_TCK` (else 100 was assumed).
    pub clk_tck_measured: bool,
    /// The SQLite destinations, when measured.
    pub sqlite: Option<SqliteSetup>,
    /// The PostgreSQL server, when measured.
    pub postgres: Option<Server>,
    /// Why PostgreSQL was not measured, when it was asked for but not measured.
    pub postgres_skipped: Option<String>,
    /// The filesystem of the Parquet directories, when measured.
    pub parquet: Option<Filesystem>,
}

/// One phase's figures: medians over its runs, and the highest peak RSS.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Rows (items, or change records) per second of wall-clock time.
    pub rows_per_sec: f64,
    /// User + system CPU microseconds of the phase process per row.
    pub cpu_us_per_row: f64,
    /// User + system CPU microseconds of the PostgreSQL server per row, when measured.
    pub server_cpu_us_per_row: Option<f64>,
    /// The two together (the process alone when the server was not measured).
    pub total_cpu_us_per_row: f64,
    /// User CPU seconds of the process.
    pub user_secs: f64,
    /// System CPU seconds of the process.
    pub system_secs: f64,
    /// CPU seconds of the server, when measured.
    pub server_secs: Option<f64>,
    /// Wall-clock seconds.
    pub wall_secs: f64,
    /// Peak RSS of the phase process, MiB.
    pub peak_rss_mib: f64,
    /// Why each stream read ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ends: Vec<String>,
}

/// The summary of the runs of `work` into `kind` (`None` when it did not run).
pub fn summarize(reports: &[SinkPhaseReport], work: Work, kind: Kind) -> Option<Summary> {
    let runs: Vec<&SinkPhaseReport> = reports
        .iter()
        .filter(|r| r.work == work && r.kind == kind)
        .collect();
    if runs.is_empty() {
        return None;
    }
    let of = |f: &dyn Fn(&SinkPhaseReport) -> f64| median(runs.iter().map(|r| f(r)).collect());
    let per_row = |r: &SinkPhaseReport, secs: f64| secs * 1e6 / (r.received.max(1) as f64);
    let server = |r: &SinkPhaseReport| Some(r.server_user_secs? + r.server_system_secs?);
    let measured = runs.iter().all(|r| server(r).is_some());
    Some(Summary {
        rows_per_sec: of(&|r| r.received as f64 / r.wall_secs.max(f64::MIN_POSITIVE)),
        cpu_us_per_row: of(&|r| per_row(r, r.user_secs + r.system_secs)),
        server_cpu_us_per_row: measured.then(|| of(&|r| per_row(r, server(r).unwrap_or(0.0)))),
        total_cpu_us_per_row: of(&|r| {
            per_row(r, r.user_secs + r.system_secs + server(r).unwrap_or(0.0))
        }),
        user_secs: of(&|r| r.user_secs),
        system_secs: of(&|r| r.system_secs),
        server_secs: measured.then(|| of(&|r| server(r).unwrap_or(0.0))),
        wall_secs: of(&|r| r.wall_secs),
        peak_rss_mib: runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
        ends: runs.iter().filter_map(|r| r.end.clone()).collect(),
    })
}

/// One summary ÷ another: ddbpipe ÷ the floor, or a load or stream ÷ the jsonl one.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    /// Rows per second: below 1 means the numerator is slower.
    pub rows_per_sec: f64,
    /// CPU µs per row of the phase processes.
    pub cpu_us_per_row: f64,
    /// CPU µs per row of the server, when both were measured.
    pub server_cpu_us_per_row: Option<f64>,
    /// Process and server together.
    pub total_cpu_us_per_row: f64,
    /// Peak RSS of the phase processes.
    pub peak_rss: f64,
}

/// The ratios of `top` to `bottom`, when both ran.
pub fn ratios(top: Option<&Summary>, bottom: Option<&Summary>) -> Option<Ratios> {
    let (t, b) = (top?, bottom?);
    Some(Ratios {
        rows_per_sec: t.rows_per_sec / b.rows_per_sec,
        cpu_us_per_row: t.cpu_us_per_row / b.cpu_us_per_row,
        server_cpu_us_per_row: t
            .server_cpu_us_per_row
            .zip(b.server_cpu_us_per_row)
            .map(|(t, b)| t / b),
        total_cpu_us_per_row: t.total_cpu_us_per_row / b.total_cpu_us_per_row,
        peak_rss: t.peak_rss_mib / b.peak_rss_mib,
    })
}

/// Every summary of one concurrency's phases.
#[derive(Debug, Clone)]
pub struct Summaries {
    /// Per keyed destination: ddbpipe's load and the floor; then jsonl's and parquet's load
    /// (no floor), when they ran.
    pub load: Vec<(Kind, Option<Summary>, Option<Summary>)>,
    /// Per destination (the keyed ones, then jsonl, parquet, Kafka): the stream read.
    pub stream: Vec<(Kind, Summary)>,
}

/// The summaries of `reports` for the keyed destinations `kinds`.
pub fn summaries(reports: &[SinkPhaseReport], kinds: &[Kind]) -> Summaries {
    // Each keyed destination, then the same with typed columns (measured when it ran).
    let kinds: Vec<Kind> = kinds
        .iter()
        .copied()
        .chain(kinds.iter().filter_map(|kind| kind.typed()))
        .filter(|&kind| {
            kind.untyped().is_none()
                || summarize(reports, Work::Load, kind).is_some()
                || summarize(reports, Work::Stream, kind).is_some()
        })
        .collect();
    let lake = [Kind::Jsonl, Kind::Parquet, Kind::Iceberg]
        .into_iter()
        .filter(|&kind| summarize(reports, Work::Load, kind).is_some());
    let load = kinds
        .iter()
        .copied()
        .chain(lake)
        .map(|kind| {
            (
                kind,
                summarize(reports, Work::Load, kind),
                summarize(reports, Work::Floor, kind),
            )
        })
        .collect();
    let stream = kinds
        .iter()
        .chain(&[
            Kind::Jsonl,
            Kind::Parquet,
            Kind::Iceberg,
            Kind::KafkaExactlyOnce,
            Kind::KafkaAtLeastOnce,
        ])
        .filter_map(|&kind| summarize(reports, Work::Stream, kind).map(|s| (kind, s)))
        .collect();
    Summaries { load, stream }
}

impl Summaries {
    fn stream_of(&self, kind: Kind) -> Option<&Summary> {
        self.stream.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
    }

    fn load_of(&self, kind: Kind) -> Option<&Summary> {
        self.load
            .iter()
            .find(|(k, _, _)| *k == kind)
            .and_then(|(_, ddbpipe, _)| ddbpipe.as_ref())
    }

    /// A load over the jsonl load (the scan case's ddbpipe phase): not for jsonl itself, nor
    /// for a typed destination (its measure is [`Summaries::load_over_documents`]).
    fn load_over_jsonl(&self, kind: Kind) -> Option<Ratios> {
        if kind == Kind::Jsonl || kind.has_columns() {
            return None;
        }
        ratios(self.load_of(kind), self.load_of(Kind::Jsonl))
    }

    /// A typed destination's load over the same destination's document-only load.
    fn load_over_documents(&self, kind: Kind) -> Option<Ratios> {
        ratios(self.load_of(kind), self.load_of(kind.untyped()?))
    }

    /// A typed destination's stream over the same destination's document-only stream.
    fn stream_over_documents(&self, kind: Kind) -> Option<Ratios> {
        ratios(self.stream_of(kind), self.stream_of(kind.untyped()?))
    }
}

/// `value` with `row` in its key names replaced by `change` (a stream's rows are changes).
fn per_change(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(key, value)| (key.replace("row", "change"), value))
            .collect(),
        other => other,
    }
}

/// The machine-readable report: one JSON line, `"case": "sink"`. `load` has per destination
/// `ddbpipe`, `floor` and `ddbpipe_over_floor` (jsonl and parquet: no floor), and
/// `over_jsonl` per other untyped destination; `stream` has per destination (jsonl, parquet
/// and Kafka too) its summary, and `over_jsonl` per other destination. A stream's figures say
/// `change` where a load's say `row` (`changes_per_sec`, `cpu_us_per_change`, …).
pub fn json_line(setup: &SinkSetup, summaries: &Summaries) -> String {
    let mut load = serde_json::Map::new();
    for (kind, ddbpipe, floor) in &summaries.load {
        load.insert(
            kind.name().into(),
            json!({
                "ddbpipe": ddbpipe,
                "floor": floor,
                "ddbpipe_over_floor": ratios(ddbpipe.as_ref(), floor.as_ref()),
                "over_documents": summaries.load_over_documents(*kind),
                "over_jsonl": summaries.load_over_jsonl(*kind),
            }),
        );
    }
    let mut stream = serde_json::Map::new();
    let mut over = serde_json::Map::new();
    let mut over_documents = serde_json::Map::new();
    let jsonl = summaries.stream_of(Kind::Jsonl);
    for (kind, summary) in &summaries.stream {
        stream.insert(kind.name().into(), per_change(json!(summary)));
        if *kind != Kind::Jsonl {
            let r = ratios(Some(summary), jsonl);
            over.insert(kind.name().into(), per_change(json!(r)));
        }
        if let Some(r) = summaries.stream_over_documents(*kind) {
            over_documents.insert(kind.name().into(), per_change(json!(r)));
        }
    }
    stream.insert("over_jsonl".into(), serde_json::Value::Object(over));
    stream.insert(
        "over_documents".into(),
        serde_json::Value::Object(over_documents),
    );
    json!({
        "case": "sink",
        "setup": setup,
        "load": load,
        "stream": stream,
    })
    .to_string()
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// One line of figures.
fn line(out: &mut String, kind: Kind, path: &str, s: &Summary) {
    let _ = writeln!(
        out,
        "{:<14} {:<8} {:>10.0} {:>14.2} {:>17} {:>16.2} {:>8.3} {:>13.1}",
        kind.name(),
        path,
        s.rows_per_sec,
        s.cpu_us_per_row,
        cell(s.server_cpu_us_per_row),
        s.total_cpu_us_per_row,
        s.wall_secs,
        s.peak_rss_mib
    );
}

fn heading(out: &mut String, noun: &str) {
    let _ = writeln!(
        out,
        "{:<14} {:<8} {:>10} {:>14} {:>17} {:>16} {:>8} {:>13}",
        "target",
        "path",
        format!("{noun}s/s"),
        format!("CPU µs/{noun}"),
        format!("server µs/{noun}"),
        format!("total µs/{noun}"),
        "wall s",
        "peak RSS MiB"
    );
}

fn ratio_line(out: &mut String, name: &str, r: &Ratios, noun: &str) {
    let server = r
        .server_cpu_us_per_row
        .map(|v| format!(", server {v:.2}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{name}: {noun}s/s {:.2} (<1: slower), CPU µs/{noun} {:.2} process{server}, {:.2} \
         total (>1: costlier), peak RSS {:.2}",
        r.rows_per_sec, r.cpu_us_per_row, r.total_cpu_us_per_row, r.peak_rss
    );
}

/// The human report: the setup, the load table with its ratios, the stream table with its
/// ratios, notes.
pub fn table(setup: &SinkSetup, summaries: &Summaries) -> String {
    let mut out = String::new();
    let clk = if setup.clk_tck_measured {
        format!("{} ticks/s (getconf CLK_TCK)", setup.clk_tck)
    } else {
        format!(
            "{} ticks/s (assumed; getconf CLK_TCK failed)",
            setup.clk_tck
        )
    };
    let _ = writeln!(
        out,
        "ddbpipe-bench: keyed sinks against each database's floor, parquet against jsonl; {} \
         run(s), median shown; CPU at {clk}",
        setup.runs
    );
    if let Some(sqlite) = &setup.sqlite {
        let _ = writeln!(
            out,
            "sqlite {}: fresh files on {}, WAL, synchronous=FULL; floor: one prepared INSERT \
             per row in one transaction",
            sqlite.version,
            sqlite.filesystem.describe()
        );
    }
    if let Some(pg) = &setup.postgres {
        let cpu = match pg.postmaster {
            Some(pid) => format!("server CPU: postmaster {pid} and its children"),
            None => {
                "server CPU not measured (the server is not a process of this machine)".to_string()
            }
        };
        let _ = writeln!(
            out,
            "postgres {} at {}: fsync {}, synchronous_commit {}, full_page_writes {}; a fresh \
             schema per phase; {cpu}; floor: one COPY FROM STDIN",
            pg.version, pg.location, pg.fsync, pg.synchronous_commit, pg.full_page_writes
        );
    }
    if let Some(why) = &setup.postgres_skipped {
        let _ = writeln!(out, "postgres: not measured ({why})");
    }
    if let Some(filesystem) = &setup.parquet {
        let _ = writeln!(
            out,
            "parquet: a fresh directory per phase on {}, the sink's defaults \
             (target_file_mb, commit_interval_secs); its committed files read back afterwards",
            filesystem.describe()
        );
    }

    let _ = writeln!(
        out,
        "\nsnapshot load: {} items (mean {:.0} B as DynamoDB counts), {}-segment scan at \
         concurrency {}, {} items per page, into table bench (pk text, sk numeric, document, \
         _ddbpipe_*), into jsonl on /dev/null, into a parquet run directory",
        setup.items, setup.mean_item_bytes, setup.segments, setup.concurrency, setup.page_items
    );
    heading(&mut out, "row");
    for (kind, ddbpipe, floor) in &summaries.load {
        for (path, summary) in [("ddbpipe", ddbpipe), ("floor", floor)] {
            if let Some(s) = summary {
                line(&mut out, *kind, path, s);
            }
        }
    }
    for (kind, ddbpipe, floor) in &summaries.load {
        if let Some(r) = ratios(ddbpipe.as_ref(), floor.as_ref()) {
            ratio_line(
                &mut out,
                &format!("{} ddbpipe/floor", kind.name()),
                &r,
                "row",
            );
        }
        if let Some(r) = summaries.load_over_jsonl(*kind) {
            ratio_line(&mut out, &format!("{}/jsonl", kind.name()), &r, "row");
        }
        if let (Some(r), Some(untyped)) = (summaries.load_over_documents(*kind), kind.untyped()) {
            ratio_line(
                &mut out,
                &format!("{}/{} (10 typed columns)", kind.name(), untyped.name()),
                &r,
                "row",
            );
        }
    }

    if !summaries.stream.is_empty() {
        let _ = writeln!(
            out,
            "\nstream catch-up: {} change records (NEW_AND_OLD_IMAGES, mean {:.0} B) in {} \
             closed shards, all read at once; a keyed table ends with {} rows, a parquet \
             changelog with one per record",
            setup.records, setup.mean_record_bytes, setup.shards, setup.stream_rows
        );
        heading(&mut out, "change");
        for (kind, s) in &summaries.stream {
            line(&mut out, *kind, "ddbpipe", s);
        }
        let jsonl = summaries.stream_of(Kind::Jsonl);
        for (kind, s) in &summaries.stream {
            if *kind != Kind::Jsonl
                && let Some(r) = ratios(Some(s), jsonl)
            {
                ratio_line(&mut out, &format!("{}/jsonl", kind.name()), &r, "change");
            }
        }
        for (kind, _) in &summaries.stream {
            if let (Some(r), Some(untyped)) =
                (summaries.stream_over_documents(*kind), kind.untyped())
            {
                ratio_line(
                    &mut out,
                    &format!("{}/{} (10 typed columns)", kind.name(), untyped.name()),
                    &r,
                    "change",
                );
            }
        }
        let _ = writeln!(
            out,
            "note: ddbpipe starts the GetRecords of one shard at least 100 ms apart, so no \
             stream read takes less than about {:.1} s here; jsonl is the jsonl sink on \
             /dev/null",
            setup.stream_pacing_floor_secs
        );
        for (kind, s) in &summaries.stream {
            if !s.ends.is_empty() {
                let _ = writeln!(out, "{} runs ended: {}", kind.name(), s.ends.join(", "));
            }
        }
    }
    let _ = writeln!(
        out,
        "note: CPU µs are the phase process's; server µs the PostgreSQL server's (or the Kafka \
         broker's) over the same window; total the two. The floor's peak RSS holds every row before it writes them."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(work: Work, kind: Kind, wall: f64, cpu: f64, server: Option<f64>) -> SinkPhaseReport {
        SinkPhaseReport {
            work,
            kind,
            received: 1000,
            rows: 1000,
            wall_secs: wall,
            user_secs: cpu,
            system_secs: 0.0,
            server_user_secs: server,
            server_system_secs: server.map(|_| 0.0),
            peak_rss_kib: 2048,
            end: None,
        }
    }

    fn setup() -> SinkSetup {
        SinkSetup {
            items: 0,
            mean_item_bytes: 0.0,
            segments: 4,
            concurrency: 4,
            page_items: 1000,
            records: 1000,
            shards: 16,
            stream_rows: 850,
            mean_record_bytes: 900.0,
            stream_pacing_floor_secs: 0.0,
            runs: 1,
            clk_tck: 100,
            clk_tck_measured: true,
            sqlite: None,
            postgres: None,
            postgres_skipped: Some("no URL".into()),
            parquet: None,
        }
    }

    #[test]
    fn the_load_compares_ddbpipe_with_the_floor_process_and_server_alike() {
        let reports = [
            report(Work::Load, Kind::Postgres, 1.0, 0.004, Some(0.006)),
            report(Work::Load, Kind::Postgres, 3.0, 0.002, Some(0.010)),
            report(Work::Load, Kind::Postgres, 2.0, 0.003, Some(0.008)),
            report(Work::Floor, Kind::Postgres, 0.5, 0.001, Some(0.004)),
            report(Work::Load, Kind::Sqlite, 1.0, 0.010, None),
        ];
        let s = summaries(&reports, &[Kind::Sqlite, Kind::Postgres]);
        let (_, ddbpipe, floor) = &s.load[1];
        let ddbpipe = ddbpipe.as_ref().expect("ddbpipe ran");
        assert_eq!(ddbpipe.rows_per_sec, 500.0);
        assert!((ddbpipe.cpu_us_per_row - 3.0).abs() < 1e-9);
        assert!((ddbpipe.server_cpu_us_per_row.expect("measured") - 8.0).abs() < 1e-9);
        assert!((ddbpipe.total_cpu_us_per_row - 11.0).abs() < 1e-9);
        let r = ratios(Some(ddbpipe), floor.as_ref()).expect("both ran");
        assert!((r.total_cpu_us_per_row - 11.0 / 5.0).abs() < 1e-9);
        assert!((r.rows_per_sec - 0.25).abs() < 1e-9);
        // SQLite's load ran without its floor: no ratio, no server.
        let (_, sqlite, sqlite_floor) = &s.load[0];
        assert!(
            sqlite
                .as_ref()
                .expect("ran")
                .server_cpu_us_per_row
                .is_none()
        );
        assert!(sqlite_floor.is_none());
    }

    #[test]
    fn the_stream_is_reported_per_change_against_jsonl() {
        let reports = [
            report(Work::Stream, Kind::Postgres, 4.0, 0.008, Some(0.02)),
            report(Work::Stream, Kind::Jsonl, 1.0, 0.004, None),
        ];
        let s = summaries(&reports, &[Kind::Postgres]);
        let setup = setup();
        let text = table(&setup, &s);
        assert!(
            text.contains("changes/s") && text.contains("postgres/jsonl"),
            "{text}"
        );
        assert!(text.contains("postgres: not measured (no URL)"), "{text}");
        let line: serde_json::Value = serde_json::from_str(&json_line(&setup, &s)).expect("JSON");
        assert_eq!(line["case"], "sink");
        assert_eq!(line["stream"]["jsonl"]["changes_per_sec"], 1000.0);
        assert_eq!(
            line["stream"]["over_jsonl"]["postgres"]["changes_per_sec"],
            0.25
        );
        assert_eq!(line["load"]["postgres"]["ddbpipe"], serde_json::Value::Null);
    }

    #[test]
    fn parquet_is_reported_over_jsonl_for_the_load_and_the_stream() {
        let reports = [
            report(Work::Load, Kind::Jsonl, 1.0, 0.003, None),
            report(Work::Load, Kind::Parquet, 2.0, 0.006, None),
            report(Work::Load, Kind::Sqlite, 4.0, 0.012, None),
            report(Work::Stream, Kind::Jsonl, 1.0, 0.004, None),
            report(Work::Stream, Kind::Parquet, 1.25, 0.005, None),
        ];
        let s = summaries(&reports, &[Kind::Sqlite]);
        let kinds: Vec<Kind> = s.load.iter().map(|(kind, ..)| *kind).collect();
        assert_eq!(kinds, [Kind::Sqlite, Kind::Jsonl, Kind::Parquet]);
        let r = s.load_over_jsonl(Kind::Parquet).expect("both loads ran");
        assert!((r.rows_per_sec - 0.5).abs() < 1e-9);
        assert!((r.cpu_us_per_row - 2.0).abs() < 1e-9);
        assert!(s.load_over_jsonl(Kind::Jsonl).is_none());
        let line: serde_json::Value = serde_json::from_str(&json_line(&setup(), &s)).expect("JSON");
        assert_eq!(line["load"]["parquet"]["over_jsonl"]["rows_per_sec"], 0.5);
        assert_eq!(line["load"]["sqlite"]["over_jsonl"]["rows_per_sec"], 0.25);
        assert_eq!(line["load"]["jsonl"]["over_jsonl"], serde_json::Value::Null);
        assert_eq!(line["load"]["parquet"]["floor"], serde_json::Value::Null);
        assert_eq!(
            line["stream"]["over_jsonl"]["parquet"]["changes_per_sec"],
            0.8
        );
        let text = table(&setup(), &s);
        assert_eq!(text.matches("parquet/jsonl").count(), 2, "{text}");
        assert!(text.contains("sqlite/jsonl"), "{text}");
    }
}
