//! `ddbpipe-bench phase`: one client scanning the bench table, reading the bench stream, or
//! (ddbpipe only) reading the bench export, once, in a process of its own, printing what it
//! measured as one JSON line.
//!
//! Only the scan, stream read or export read is timed: building the client, the sink and the
//! state file comes before the meter starts. The peak RSS is the whole process's, setup
//! included.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use serde::{Deserialize, Serialize};

use crate::ddbpipe_run::{self, BenchPipeline, Read};
use crate::procfs::{self, Meter};
use crate::sink::Destination;
use crate::{ddbpipe_export, sdk_client, sdk_streams};

/// What a phase reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Case {
    /// A parallel scan of the bench table.
    Scan,
    /// Every change record of the bench stream.
    Streams,
    /// A full export of the bench table's items, read from its files (ddbpipe only; its
    /// baseline is ddbpipe's scan).
    Export,
}

impl Case {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Case::Scan => "scan",
            Case::Streams => "streams",
            Case::Export => "export",
        }
    }

    /// What the case counts.
    pub fn noun(self) -> &'static str {
        match self {
            Case::Scan | Case::Export => "item",
            Case::Streams => "record",
        }
    }
}

/// Which client a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Client {
    /// ddbpipe, a pipeline built through the library as `ddbpipe run` builds it.
    Ddbpipe,
    /// `aws_sdk_dynamodb::Client` (or `aws_sdk_dynamodbstreams::Client`) + a recursive
    /// conversion to `serde_json::Value`.
    Sdk,
}

impl Client {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Client::Ddbpipe => "ddbpipe",
            Client::Sdk => "sdk",
        }
    }
}

/// What one phase is asked to do.
#[derive(Debug, Clone)]
pub struct PhaseSettings {
    /// Scan or streams.
    pub case: Case,
    /// The client.
    pub client: Client,
    /// `http://127.0.0.1:<port>` of the bench server (unused by the export case).
    pub endpoint: String,
    /// Items the table (or export) holds, or records the stream holds: the phase must receive
    /// exactly these.
    pub expected: u64,
    /// `TotalSegments` of the scan, shards of the stream (the streams clients check they read
    /// exactly these), or data files of the export (the export phase checks it finished each).
    pub segments: u32,
    /// Segments, shards, or data files read at once.
    pub concurrency: usize,
    /// The directory holding the export (its bucket), for the export case.
    pub export_dir: Option<PathBuf>,
}

/// What a phase measured; printed as one JSON line on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseReport {
    /// Scan or streams.
    pub case: Case,
    /// The client.
    pub client: Client,
    /// Items or records received (equal to the expected count, or the phase failed).
    pub received: u64,
    /// Wall-clock seconds of the scan or stream read.
    pub wall_secs: f64,
    /// User CPU seconds of the process during the scan or stream read.
    pub user_secs: f64,
    /// System CPU seconds of the process during the scan or stream read.
    pub system_secs: f64,
    /// Peak RSS of the process (`VmHWM`), KiB.
    pub peak_rss_kib: u64,
    /// Why a ddbpipe stream read ended (`stream disabled` or `idle`); `None` otherwise.
    #[serde(default)]
    pub end: Option<String>,
}

/// Runs one phase: set up, measure the scan or stream read, check the count, report.
pub fn run(settings: &PhaseSettings, clk_tck: u64) -> anyhow::Result<PhaseReport> {
    // The same runtime as `ddbpipe run` (crates/cli/src/main.rs), for both clients.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let settings = Arc::new(settings.clone());
    let (received, end, measured) = runtime.block_on(async {
        match (settings.case, settings.client) {
            (Case::Scan, Client::Ddbpipe) => {
                let pipeline = BenchPipeline::new(&settings, Read::Scan, &Destination::Jsonl)?;
                let opened = pipeline.open().await?;
                let meter = Meter::start()?;
                let (received, _) = ddbpipe_run::finish(opened).await?;
                anyhow::Ok((received, None, meter.stop()?))
            }
            (Case::Scan, Client::Sdk) => {
                let prepared = sdk_client::prepare(&settings).await;
                let meter = Meter::start()?;
                let received = prepared.scan().await?;
                anyhow::Ok((received, None, meter.stop()?))
            }
            (Case::Streams, Client::Ddbpipe) => {
                let pipeline = BenchPipeline::new(&settings, Read::Stream, &Destination::Jsonl)?;
                let opened = pipeline.open().await?;
                let meter = Meter::start()?;
                let (received, end) = ddbpipe_run::finish(opened).await?;
                anyhow::Ok((received, end.map(str::to_string), meter.stop()?))
            }
            (Case::Streams, Client::Sdk) => {
                let prepared = sdk_streams::prepare(&settings).await;
                let meter = Meter::start()?;
                let received = prepared.read().await?;
                anyhow::Ok((received, None, meter.stop()?))
            }
            (Case::Export, Client::Ddbpipe) => {
                let prepared = ddbpipe_export::prepare(&settings).await?;
                let meter = Meter::start()?;
                let received = prepared.read().await?;
                anyhow::Ok((received, None, meter.stop()?))
            }
            (Case::Export, Client::Sdk) => {
                anyhow::bail!("the export case has no sdk client: its baseline is ddbpipe's scan")
            }
        }
    })?;
    let (noun, holder) = match settings.case {
        Case::Scan => ("items", "the table"),
        Case::Streams => ("records", "the stream"),
        Case::Export => ("items", "the export"),
    };
    ensure!(
        received == settings.expected,
        "{} received {received} {noun}, but {holder} holds {}",
        settings.client.name(),
        settings.expected
    );
    let ticks = clk_tck as f64;
    Ok(PhaseReport {
        case: settings.case,
        client: settings.client,
        received,
        wall_secs: measured.wall.as_secs_f64(),
        user_secs: measured.user_ticks as f64 / ticks,
        system_secs: measured.system_ticks as f64 / ticks,
        peak_rss_kib: procfs::peak_rss_kib()?,
        end,
    })
}

/// The phases to profile: a comma-separated list of phase names as the bench prints them
/// (`stream kafka_at_least_once`, `load parquet`), each run under `perf record` (README:
/// profiling a phase).
const PROFILE_VARIABLE: &str = "DDBPIPE_BENCH_PERF";

/// Where the profile of phase `name` goes when `names` (the variable's value) lists it:
/// `perf-<name>.data` in the temporary directory, spaces and slashes as `_`.
fn profile_file(names: &str, name: &str) -> Option<String> {
    names
        .split(',')
        .any(|listed| listed.trim() == name)
        .then(|| {
            let file = format!("perf-{}.data", name.replace([' ', '/'], "_"));
            std::env::temp_dir().join(file).display().to_string()
        })
}

/// Runs `ddbpipe-bench <subcommand> --clk-tck <clk_tck>` (a hidden phase) in a process of its
/// own, its `settings` a JSON line on its stdin, and reads its report: the last line it
/// prints. The phase's errors go to stderr; `name` names it in this process's errors. Under
/// `perf record` when [`PROFILE_VARIABLE`] lists it (its CPU figures then include perf's).
pub fn in_process<S: serde::Serialize, R: serde::de::DeserializeOwned>(
    exe: &std::path::Path,
    subcommand: &str,
    clk_tck: u64,
    settings: &S,
    name: &str,
) -> anyhow::Result<R> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use anyhow::Context as _;

    let profiled = std::env::var(PROFILE_VARIABLE).ok();
    let mut command = match profiled
        .as_deref()
        .and_then(|names| profile_file(names, name))
    {
        Some(file) => {
            eprintln!("ddbpipe-bench: the {name} phase runs under perf record: {file}");
            let mut perf = Command::new("perf");
            perf.args([
                "record",
                "-F",
                "999",
                "--call-graph",
                "dwarf,32768",
                "-o",
                &file,
            ])
            .arg(exe);
            perf
        }
        None => Command::new(exe),
    };
    let mut child = command
        .args([subcommand, "--clk-tck", &clk_tck.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start the {name} phase"))?;
    {
        let mut stdin = child.stdin.take().context("the phase has no stdin")?;
        let line = serde_json::to_string(settings)?;
        writeln!(stdin, "{line}").with_context(|| format!("cannot start the {name} phase"))?;
    }
    let output = child
        .wait_with_output()
        .with_context(|| format!("the {name} phase did not end"))?;
    report_of(&output, name)
}

/// The report of a phase process that ended with `output`: the last line it printed, once it
/// succeeded.
pub fn report_of<R: serde::de::DeserializeOwned>(
    output: &std::process::Output,
    name: &str,
) -> anyhow::Result<R> {
    use anyhow::Context as _;

    anyhow::ensure!(
        output.status.success(),
        "the {name} phase failed ({}); its error is above",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .with_context(|| format!("the {name} phase printed nothing"))?;
    serde_json::from_str(line).with_context(|| format!("the {name} phase printed {line:?}"))
}

/// A hidden phase's settings: the JSON line on its stdin.
pub fn settings_line<S: serde::de::DeserializeOwned>() -> anyhow::Result<S> {
    use anyhow::Context as _;

    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the phase's settings")?;
    serde_json::from_str(line.trim()).context("the phase's settings do not parse")
}

#[cfg(test)]
mod tests {
    use super::profile_file;

    #[test]
    fn only_the_listed_phases_are_profiled_each_into_a_file_of_its_own() {
        let names = "stream kafka_at_least_once, load parquet";
        let file = profile_file(names, "load parquet").unwrap();
        assert!(file.ends_with("perf-load_parquet.data"), "{file}");
        let file = profile_file(names, "stream kafka_at_least_once").unwrap();
        assert!(
            file.ends_with("perf-stream_kafka_at_least_once.data"),
            "{file}"
        );
        assert_eq!(profile_file(names, "load jsonl"), None);
        assert_eq!(
            profile_file(names, "stream kafka"),
            None,
            "whole names only"
        );
        assert_eq!(profile_file("", "load parquet"), None);
    }
}
