//! Command-line syntax only: no I/O happens here.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use ddbpipe_source::endpoint::EndpointUrl;

/// Get data out of Amazon DynamoDB: parallel scans, queries, change streams and mirrors into
/// JSON Lines, SQLite, PostgreSQL, Kafka, Parquet or Iceberg, resumable.
#[derive(Debug, Parser)]
#[command(name = "ddbpipe", version, about, long_about = None)]
pub struct Args {
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// When to draw the scan progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// When stderr is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline.
    Run {
        /// The pipeline file (YAML).
        config: PathBuf,
        /// Progress bar on stderr.
        #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
        progress: ProgressMode,
        /// Serve Prometheus metrics on this address (`HOST:PORT`, e.g. 127.0.0.1:9464).
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Write the final metrics to this file when the run ends, in the Prometheus text
        /// format (for node-exporter's textfile collector; e.g. `/var/lib/node_exporter/ddbpipe.prom`).
        #[arg(long, value_name = "PATH")]
        metrics_file: Option<PathBuf>,
    },
    /// Validate a pipeline and probe the table, the sink and the state without reading data.
    Check {
        /// The pipeline file (YAML).
        config: PathBuf,
        /// Print `{"ok":bool,"probes":[…]}`.
        #[arg(long)]
        json: bool,
        /// Time allowed for the DescribeTable probe, retries included.
        #[arg(long, default_value_t = 10)]
        timeout_secs: u64,
    },
    /// List tables with their key schema, size, billing mode, stream and indexes.
    Discover(DiscoverArgs),
    /// Show or reset a pipeline's stored position.
    State {
        /// `show` or `reset`.
        #[command(subcommand)]
        action: StateAction,
    },
    /// Probe the stream lag of a streams or mirror pipeline.
    Lag {
        /// The pipeline file (YAML).
        config: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Exit 1 when the lag is above this many seconds.
        #[arg(long)]
        max_lag_seconds: Option<f64>,
    },
    /// Start an embedded DynamoDB emulator with a sample table and export it: no AWS needed.
    #[cfg(feature = "demo")]
    Demo {
        /// Where the demo writes its pipeline file, output and state.
        #[arg(long, default_value = "ddbpipe-demo")]
        dir: PathBuf,
        /// How many sample orders to create.
        #[arg(long, default_value_t = 2000)]
        items: u32,
        /// Keep the emulator up after the demo, until Ctrl-C, to run the pipelines again.
        #[arg(long)]
        keep: bool,
    },
    /// Write a commented pipeline file for a table it describes (`DescribeTable`).
    Init(InitArgs),
    /// Print the shell completion script (e.g. `ddbpipe completions bash > /etc/bash_completion.d/ddbpipe`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the JSON Schema of the pipeline file (e.g. `ddbpipe schema > ddbpipe.schema.json`
    /// for an editor).
    Schema,
    /// Print the manual page in roff (e.g. `ddbpipe man > /usr/local/share/man/man1/ddbpipe.1`).
    Man,
}

/// A shell `completions` can be written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// bash.
    Bash,
    /// zsh.
    Zsh,
    /// fish.
    Fish,
}

/// Where AWS is reached, for the commands that take no pipeline file.
#[derive(Debug, Clone, ClapArgs)]
pub struct AwsArgs {
    /// AWS region.
    #[arg(long)]
    pub region: Option<String>,
    /// Endpoint URL (an emulator, a VPC endpoint).
    #[arg(long)]
    pub endpoint_url: Option<EndpointUrl>,
    /// Named AWS profile.
    #[arg(long)]
    pub profile: Option<String>,
}

impl AwsArgs {
    /// The client settings: the region, endpoint and profile given, else the default chain.
    pub fn settings(&self) -> ddbpipe_source::aws::ClientSettings {
        ddbpipe_source::aws::ClientSettings {
            region: self.region.clone(),
            endpoint_url: self.endpoint_url.clone(),
            credentials: match &self.profile {
                Some(name) => ddbpipe_source::config::Credentials::Profile { name: name.clone() },
                None => ddbpipe_source::config::Credentials::Default,
            },
        }
    }
}

/// Where `discover` looks.
#[derive(Debug, ClapArgs)]
pub struct DiscoverArgs {
    /// Take region, endpoint and credentials from this pipeline file.
    #[arg(long, conflicts_with_all = ["region", "endpoint_url", "profile"])]
    pub config: Option<PathBuf>,
    /// Where AWS is reached without `--config`.
    #[command(flatten)]
    pub aws: AwsArgs,
    /// Only this table.
    #[arg(long)]
    pub table: Option<String>,
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
}

/// What `init` writes.
#[derive(Debug, ClapArgs)]
pub struct InitArgs {
    /// The table to describe and read.
    #[arg(long)]
    pub table: String,
    /// The pipeline's mode.
    #[arg(long, value_enum, default_value_t = InitMode::Scan)]
    pub mode: InitMode,
    /// The destination.
    #[arg(long, value_enum, default_value_t = InitSink::Jsonl)]
    pub sink: InitSink,
    /// Where AWS is reached (also written into the file).
    #[command(flatten)]
    pub aws: AwsArgs,
    /// Write the pipeline here instead of stdout (refused if the file exists).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Typed columns of a sqlite, postgres, parquet or iceberg sink: `auto` samples the table and
    /// writes the `columns:` list it infers.
    #[arg(long, value_enum)]
    pub columns: Option<InitColumns>,
    /// Items `--columns auto` samples: one bounded Scan, at most a quarter of the table's
    /// read capacity.
    #[arg(long, default_value_t = DEFAULT_SAMPLE, requires = "columns",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
}

/// Items `init --columns auto` samples unless `--sample` says otherwise.
pub const DEFAULT_SAMPLE: u32 = 1000;

/// How `init` chooses typed columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitColumns {
    /// Infer them from a sample of the table's items.
    Auto,
}

/// The modes `init` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitMode {
    /// A parallel scan.
    Scan,
    /// The stream's changes.
    Streams,
    /// A snapshot, then the stream, into a keyed sink.
    Mirror,
}

/// The sinks `init` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitSink {
    /// JSON Lines in a file.
    Jsonl,
    /// A SQLite database.
    Sqlite,
    /// A PostgreSQL database.
    Postgres,
    /// Parquet files in a directory or on S3.
    Parquet,
    /// An Apache Iceberg table in a SQL catalog.
    Iceberg,
}

/// `state` subcommands.
#[derive(Debug, Subcommand)]
pub enum StateAction {
    /// Print the stored state of the pipeline.
    Show {
        /// The pipeline file (YAML).
        config: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget the pipeline's position (the destination's data is untouched).
    Reset {
        /// The pipeline file (YAML).
        config: PathBuf,
        /// Do not ask for confirmation (required without a terminal).
        #[arg(long)]
        yes: bool,
    },
}
