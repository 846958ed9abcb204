//! `ddbpipe-bench`: how fast, and at what CPU and memory cost, ddbpipe exports a table (the
//! scan case) and a table's stream (the streams case), against the AWS SDK used directly,
//! measured in the same run, how ddbpipe's export read path compares with its scan on
//! the same items (the export case), and how its keyed sinks load a table and catch up a
//! stream against each database's own floor on the same rows (the sink case, [`sink`]; see
//! README.md).
//!
//! # Processes
//! The bench starts itself several times over:
//! 1. `serve` (hidden): the local DynamoDB and DynamoDB Streams endpoint, which builds every
//!    page before it prints its port. Its CPU is its own, not the clients'.
//! 2. `phase --case scan|streams|export --client ddbpipe|sdk` (hidden): one scan, stream read
//!    or export read each, in processes of their own, so that CPU time and peak RSS (`VmHWM`,
//!    which only grows) are each client's.
//! 3. `sink-phase` (hidden, its settings a JSON line on stdin): one load, floor or stream
//!    read of the sink case, in a process of its own likewise.
//!
//! The export case's files are written by the bench itself, into a temporary directory,
//! before any phase runs (`write-export`, hidden, writes them alone).
//!
//! Each phase checks it received exactly the table's (or export's) items, or the stream's
//! records, and fails loudly otherwise. Nothing here asserts on time: the figures are
//! reported, not judged.

mod attribute_json;
mod ddbpipe_client;
mod ddbpipe_export;
mod ddbpipe_run;
mod export_files;
mod items;
mod phase;
mod procfs;
mod records;
mod report;
mod sdk_client;
mod sdk_streams;
mod server;
mod sink;
mod stream_server;
mod tables;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::export_files::Written;
use crate::phase::{Case, Client, PhaseReport, PhaseSettings};
use crate::report::{ExportSetup, ScanSetup, Setup, StreamsSetup};
use crate::server::{Ready, ServeSettings};
use crate::stream_server::StreamSettings;
use ddbpipe_source::streams::shard_reader::READ_SPACING;

/// Benchmarks a parallel scan and a stream read by ddbpipe against the plain AWS SDK, against
/// a local endpoint, ddbpipe's read of a full export against its scan of the same items, and
/// its SQLite and PostgreSQL sinks against each database's own floor on the same rows.
#[derive(Debug, Parser)]
#[command(name = "ddbpipe-bench", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Hidden>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Which case(s) to measure (`both` is `all`: the scan, streams and export cases; the
    /// sink case runs alone).
    #[arg(long = "case", value_enum, default_value_t = WhichCase::All)]
    case: WhichCase,
    /// The sink case: which keyed destination(s) to measure.
    #[arg(long, value_enum, default_value_t = WhichSink::Both)]
    sink: WhichSink,
    /// The sink case: the PostgreSQL server (a libpq URL with `sslmode=disable`); default
    /// `DDBPIPE_TEST_POSTGRES_URL`, which `source scripts/postgres.sh` exports. Without
    /// either, `--sink both` measures SQLite alone.
    #[arg(long)]
    postgres_url: Option<String>,
    /// sink: a Kafka-protocol broker to stream into as well (`host:port`); default
    /// `DDBPIPE_TEST_KAFKA_BROKERS` (`source scripts/kafka.sh` starts one). Unset: Kafka is
    /// skipped, saying so.
    #[arg(long)]
    kafka_brokers: Option<String>,
    /// sink: the Kafka broker's process on this machine, whose CPU is measured beside each Kafka
    /// phase as PostgreSQL's server is; default `DDBPIPE_TEST_KAFKA_PID` (`scripts/kafka.sh`
    /// exports it). Unset: the broker's CPU is not reported.
    #[arg(long)]
    kafka_pid: Option<u32>,
    /// Items in the table (and in the export); each client must receive exactly these.
    #[arg(long, default_value_t = 200_000)]
    items: u64,
    /// Gzip data files of the export (AWS writes one per partition).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    export_files: u32,
    /// `TotalSegments` of the parallel scan.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    segments: u32,
    /// Change records in the stream; each client must receive exactly these.
    #[arg(long, default_value_t = 400_000)]
    records: u64,
    /// Closed shards of the stream (default 4; 16 in the sink case).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    shards: Option<u32>,
    /// Segments (scan), shards (streams) or data files (export) read at once. A list
    /// (`1,2,4,8`) measures the concurrency curve: every case and client once per value, then
    /// one table of the curve.
    #[arg(long, default_value = "4", value_delimiter = ',', value_parser = positive)]
    concurrency: Vec<usize>,
    /// Which client(s) to measure in the scan and streams cases (the export case always
    /// measures ddbpipe's export read and ddbpipe's scan).
    #[arg(long, value_enum, default_value_t = Which::Both)]
    client: Which,
    /// Items per page (the server's "1 MB").
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    page_items: u64,
    /// Pad every item of the table to about this many bytes (DynamoDB's size, at most its
    /// 400 KB): the scan and sink cases then measure large items (with `--page-items 2`, as
    /// DynamoDB's 1 MB pages would be). 0: the natural items of about 450 bytes. The stream's
    /// images and the export keep the natural items.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=items::MAX_ITEM_BYTES))]
    item_bytes: u64,
    /// Runs of each client (alternating); the report shows medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Milliseconds every answer of the server waits: a real endpoint's round trip, which
    /// concurrent reads hide (0: answer at once, so CPU is the only limit).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// The tables case: how many tables share `--items` (each `--items / --tables` items),
    /// mirrored by one process beside one table of all of them.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    tables: u32,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WhichCase {
    Scan,
    Streams,
    Export,
    #[value(alias = "both")]
    All,
    Sink,
    Tables,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WhichSink {
    Sqlite,
    Postgres,
    Both,
}

impl BenchArgs {
    /// `--shards`, or its default: 4 for the streams case, 16 for the sink case (its stream
    /// is read from every shard at once, so that a shard's pacing is not the limit).
    fn shards(&self) -> u32 {
        self.shards.unwrap_or(match self.case {
            WhichCase::Sink => 16,
            _ => 4,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Ddbpipe,
    Sdk,
    Both,
}

#[derive(Debug, Subcommand)]
enum Hidden {
    /// Serves the bench table and stream on 127.0.0.1; prints a JSON line with the port when
    /// ready.
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        items: u64,
        #[arg(long)]
        segments: u32,
        #[arg(long)]
        page_items: u64,
        #[arg(long, default_value_t = 0)]
        item_bytes: u64,
        #[arg(long, default_value_t = 0)]
        records: u64,
        #[arg(long, default_value_t = 1)]
        shards: u32,
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
    },
    /// Writes the bench export (AWS's layout) of the first `items` bench items under `dir`;
    /// prints what it wrote as a JSON line.
    #[command(hide = true)]
    WriteExport {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        items: u64,
        #[arg(long, default_value_t = 8)]
        files: u32,
    },
    /// Runs one client's scan, stream read or export read and prints what it measured as a
    /// JSON line.
    #[command(hide = true)]
    Phase {
        #[arg(long = "case", value_enum)]
        case: Case,
        #[arg(long, value_enum)]
        client: Client,
        #[arg(long)]
        endpoint: String,
        /// Items or records the client must receive.
        #[arg(long)]
        expect: u64,
        #[arg(long)]
        segments: u32,
        #[arg(long)]
        concurrency: usize,
        #[arg(long)]
        clk_tck: u64,
        /// The export's directory (the export case).
        #[arg(long)]
        export_dir: Option<PathBuf>,
    },
    /// Runs one load, floor or stream read of the sink case, its settings read as a JSON line
    /// from stdin, and prints what it measured as a JSON line.
    #[command(hide = true)]
    SinkPhase {
        #[arg(long)]
        clk_tck: u64,
    },
    /// Runs one mirror of the tables case, its settings read as a JSON line from stdin, and
    /// prints what it measured as a JSON line.
    #[command(hide = true)]
    TablesPhase {
        #[arg(long)]
        clk_tck: u64,
    },
}

fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "expected a whole number of at least 1, got {text:?}"
        )),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Hidden::Serve {
            items,
            segments,
            page_items,
            item_bytes,
            records,
            shards,
            latency_ms,
        }) => server::serve(ServeSettings {
            items,
            segments,
            page_items,
            item_bytes,
            stream: StreamSettings { records, shards },
            latency: Duration::from_millis(latency_ms),
        }),
        Some(Hidden::WriteExport { dir, items, files }) => export_files::write(&dir, items, files)
            .and_then(|written| {
                println!("{}", serde_json::to_string(&written)?);
                Ok(())
            }),
        Some(Hidden::Phase {
            case,
            client,
            endpoint,
            expect,
            segments,
            concurrency,
            clk_tck,
            export_dir,
        }) => {
            let settings = PhaseSettings {
                case,
                client,
                endpoint,
                expected: expect,
                segments,
                concurrency,
                export_dir,
            };
            phase::run(&settings, clk_tck).and_then(|report| {
                println!("{}", serde_json::to_string(&report)?);
                Ok(())
            })
        }
        Some(Hidden::SinkPhase { clk_tck }) => sink::phase(clk_tck),
        Some(Hidden::TablesPhase { clk_tck }) => tables::phase(clk_tck),
        None => bench(&cli.bench),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ddbpipe-bench: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The server process; stopped (stdin closed, then killed) when dropped.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(
    exe: &Path,
    args: &BenchArgs,
    cases: &[Case],
) -> anyhow::Result<(ServerProcess, Ready)> {
    // A case not measured gets nothing to serve: no time or memory spent building it. The
    // export case's baseline is the scan of the same items.
    let items = if cases.contains(&Case::Scan) || cases.contains(&Case::Export) {
        args.items
    } else {
        0
    };
    let records = if cases.contains(&Case::Streams) {
        args.records
    } else {
        0
    };
    spawn_server(exe, args, items, records, args.shards())
}

/// Starts the server with `items` in the table and `records` in `shards` shards.
fn spawn_server(
    exe: &Path,
    args: &BenchArgs,
    items: u64,
    records: u64,
    shards: u32,
) -> anyhow::Result<(ServerProcess, Ready)> {
    let mut child = Command::new(exe)
        .args(["serve", "--items", &items.to_string()])
        .args(["--segments", &args.segments.to_string()])
        .args(["--page-items", &args.page_items.to_string()])
        .args(["--item-bytes", &args.item_bytes.to_string()])
        .args(["--records", &records.to_string()])
        .args(["--shards", &shards.to_string()])
        .args(["--latency-ms", &args.latency_ms.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start the server")?;
    let stdout = child.stdout.take().context("the server has no stdout")?;
    let server = ServerProcess(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("cannot read the server's port")?;
    let ready: Ready = serde_json::from_str(line.trim())
        .with_context(|| format!("the server did not start (it printed {line:?})"))?;
    Ok((server, ready))
}

fn run_phase(exe: &Path, settings: &PhaseSettings, clk_tck: u64) -> anyhow::Result<PhaseReport> {
    let name = match settings.case {
        Case::Export => "export",
        _ => settings.client.name(),
    };
    let mut command = Command::new(exe);
    command
        .args(["phase", "--case", settings.case.name()])
        .args(["--client", settings.client.name()])
        .args(["--endpoint", &settings.endpoint])
        .args(["--expect", &settings.expected.to_string()])
        .args(["--segments", &settings.segments.to_string()])
        .args(["--concurrency", &settings.concurrency.to_string()])
        .args(["--clk-tck", &clk_tck.to_string()]);
    if let Some(dir) = &settings.export_dir {
        command.arg("--export-dir").arg(dir);
    }
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start the {name} phase"))?;
    let report: PhaseReport = phase::report_of(&output, name)?;
    ensure!(
        report.received == settings.expected,
        "the {name} phase received {} {}s, not {}",
        report.received,
        settings.case.noun(),
        settings.expected
    );
    Ok(report)
}

/// The setup of one case at one concurrency, for its report.
fn setup(
    case: Case,
    ready: &Ready,
    written: Option<&Written>,
    args: &BenchArgs,
    concurrency: usize,
    clk: (u64, bool),
) -> Setup {
    match case {
        Case::Scan => Setup::Scan(ScanSetup::new(
            ready,
            args.segments,
            concurrency,
            args.page_items,
            args.latency_ms,
            args.runs,
            clk,
        )),
        Case::Streams => Setup::Streams(StreamsSetup::new(
            ready,
            concurrency,
            records::PAGE_RECORDS,
            READ_SPACING,
            args.latency_ms,
            args.runs,
            clk,
        )),
        Case::Export => {
            let written = written.copied().unwrap_or(Written {
                items: 0,
                files: args.export_files,
                stored_bytes: 0,
                line_bytes: 0,
                table_bytes: 0,
            });
            let n = written.items.max(1) as f64;
            Setup::Export(ExportSetup {
                items: written.items,
                files: written.files,
                concurrency,
                page_lines: ddbpipe_export::PAGE_LINES,
                stored_bytes: written.stored_bytes,
                mean_line_bytes: written.line_bytes as f64 / n,
                mean_item_bytes: written.table_bytes as f64 / n,
                scan_segments: args.segments,
                scan_page_items: args.page_items,
                latency_ms: args.latency_ms,
                runs: args.runs,
                clk_tck: clk.0,
                clk_tck_measured: clk.1,
            })
        }
    }
}

/// The phases run one after the other, alternating, at each concurrency and run: the scan
/// case's clients (with the export case's read and its baseline, ddbpipe's scan, once), then
/// the streams case's.
fn groups(cases: &[Case], clients: &[Client]) -> Vec<Vec<(Case, Client)>> {
    let mut table = Vec::new();
    if cases.contains(&Case::Scan) {
        table.extend(clients.iter().map(|&c| (Case::Scan, c)));
    }
    if cases.contains(&Case::Export) {
        if !table.contains(&(Case::Scan, Client::Ddbpipe)) {
            table.push((Case::Scan, Client::Ddbpipe));
        }
        table.push((Case::Export, Client::Ddbpipe));
    }
    let mut groups = Vec::new();
    if !table.is_empty() {
        groups.push(table);
    }
    if cases.contains(&Case::Streams) {
        groups.push(clients.iter().map(|&c| (Case::Streams, c)).collect());
    }
    groups
}

fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let clk = procfs::clock_ticks_per_second();
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let clients: &[Client] = match args.client {
        Which::Ddbpipe => &[Client::Ddbpipe],
        Which::Sdk => &[Client::Sdk],
        Which::Both => &[Client::Ddbpipe, Client::Sdk],
    };
    let cases: &[Case] = match args.case {
        WhichCase::Scan => &[Case::Scan],
        WhichCase::Streams => &[Case::Streams],
        WhichCase::Export => &[Case::Export],
        WhichCase::All => &[Case::Scan, Case::Streams, Case::Export],
        WhichCase::Sink => return sink::bench::run(&exe, args, args.shards(), clk),
        WhichCase::Tables => return tables::run(&exe, args, clk.0),
    };
    let exported = cases.contains(&Case::Export);
    if !args.json {
        let mut building = Vec::new();
        if cases.contains(&Case::Scan) || exported {
            building.push(format!("{} items", args.items));
        }
        if exported {
            building.push(format!(
                "an export of them in {} gzip files",
                args.export_files
            ));
        }
        if cases.contains(&Case::Streams) {
            building.push(format!(
                "{} change records in {} shards",
                args.records,
                args.shards()
            ));
        }
        eprintln!("ddbpipe-bench: building {}...", building.join(" and "));
    }
    // The export's files, written before any phase (and removed when the bench ends).
    let export_dir = if exported {
        Some(
            tempfile::Builder::new()
                .prefix("ddbpipe-bench-export.")
                .tempdir()
                .context("cannot create the export's directory")?,
        )
    } else {
        None
    };
    let written = match &export_dir {
        Some(dir) => Some(export_files::write(
            dir.path(),
            args.items,
            args.export_files,
        )?),
        None => None,
    };
    let (server, ready) = start_server(&exe, args, cases)?;
    let endpoint = format!("http://127.0.0.1:{}", ready.port);
    let mut reports = Vec::new();
    for group in groups(cases, clients) {
        for &concurrency in &args.concurrency {
            for run in 0..args.runs {
                // Alternate the order so neither client always runs on a cold or a warm machine.
                let mut order = group.clone();
                if run % 2 == 1 {
                    order.reverse();
                }
                for (case, client) in order {
                    let (expected, segments) = match case {
                        Case::Scan => (args.items, args.segments),
                        Case::Streams => (args.records, args.shards()),
                        Case::Export => (args.items, args.export_files),
                    };
                    if !args.json {
                        eprintln!(
                            "ddbpipe-bench: {} at concurrency {concurrency}, run {} of {}: {}...",
                            case.name(),
                            run + 1,
                            args.runs,
                            client.name()
                        );
                    }
                    let settings = PhaseSettings {
                        case,
                        client,
                        endpoint: endpoint.clone(),
                        expected,
                        segments,
                        concurrency,
                        export_dir: match case {
                            Case::Export => export_dir.as_ref().map(|d| d.path().to_path_buf()),
                            _ => None,
                        },
                    };
                    reports.push((concurrency, run_phase(&exe, &settings, clk.0)?));
                }
            }
        }
    }
    drop(server);
    drop(export_dir);

    let mut printed = 0;
    for &case in cases {
        let mut curve = Vec::new();
        for &concurrency in &args.concurrency {
            let runs: Vec<PhaseReport> = reports
                .iter()
                .filter(|(c, _)| *c == concurrency)
                .map(|(_, report)| report.clone())
                .collect();
            let setup = setup(case, &ready, written.as_ref(), args, concurrency, clk);
            let (summaries, ratios) = report::rows(&runs, case, clients);
            if args.json {
                println!("{}", report::json_line(&setup, &summaries, ratios));
            } else {
                if printed > 0 {
                    println!();
                }
                printed += 1;
                print!("{}", report::table(&setup, &summaries, ratios));
            }
            curve.push((concurrency, summaries));
        }
        if curve.len() > 1 && !args.json {
            println!();
            print!("{}", report::curve(case, &curve));
        }
    }
    Ok(())
}
