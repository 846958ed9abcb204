//! Validated config → clients, source, sink and checkpointer → the runner. Connects things;
//! decides nothing the library crates do not already decide.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::{Checkpointer, StartError};
use ddbpipe_pipeline::runner::{RunError, ScanOutcome, run_scan};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::sinks::jsonl::{self, JsonlSettings};
use ddbpipe_pipeline::state::StateError;
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_pipeline::state::position::ScanKind;
use ddbpipe_source::api::{IndexKind, Render, TableApi, TableDescription};
use ddbpipe_source::aws::{self, AwsTableApi, ClientSettings};
use ddbpipe_source::capacity::{ReadLimiter, clamp_rate};
use ddbpipe_source::config::{Mode, SourceConfig};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::retry::{Cancel, RetryPolicy};
use ddbpipe_source::scan::{self, SegmentReader};
use tracing::Instrument;

use crate::args::ProgressMode;
use crate::config::{self, JsonlConfig, JsonlTarget, PipelineConfig};
use crate::destination;
use crate::failure::{self, Exit, Failure};
use crate::telemetry::ScanProgress;

/// How often a `read_capacity_fraction` base is re-read (auto-scaling changes it).
const BASE_REFRESH: Duration = Duration::from_secs(300);

/// Loads and validates a pipeline file; problems are usage failures (exit 2).
pub fn load_config(path: &Path) -> Result<PipelineConfig, Failure> {
    let env = |name: &str| std::env::var(name).ok();
    match config::load(path, &env) {
        Ok(config) => Ok(config),
        Err(error @ (config::LoadError::Read { .. } | config::LoadError::TooLarge { .. })) => {
            Err(Failure::usage(error))
        }
        Err(error) => Err(Failure::usage(error).hint(format!(
            "fix the lines above in {}; `ddbpipe check {}` shows them again",
            path.display(),
            path.display()
        ))),
    }
}

/// The retry policy of a source.
pub fn retry_policy(source: &SourceConfig) -> RetryPolicy {
    RetryPolicy {
        max_retries: source.retry.max_retries,
        initial_backoff: Duration::from_millis(source.retry.initial_backoff_ms),
        max_backoff: Duration::from_millis(source.retry.max_backoff_ms),
        attempt_timeout: Duration::from_millis(source.retry.attempt_timeout_ms),
    }
}

/// The AWS client settings of a source.
pub fn client_settings(source: &SourceConfig) -> ClientSettings {
    ClientSettings {
        region: source.region.clone(),
        endpoint_url: source.endpoint_url.clone(),
        credentials: source.credentials.clone(),
    }
}

/// Builds the table API (no network I/O) and says where it reads.
pub async fn table_api(source: &SourceConfig) -> (AwsTableApi, Location) {
    let sdk = aws::load_sdk_config(&client_settings(source)).await;
    (aws::table_api(&sdk), location(&sdk, source))
}

/// Where the clients built from `sdk` read: its region and endpoint, and the account when the
/// configured table name or stream ARN names one. [`Location::learn`] adds what a
/// `DescribeTable` answer says.
pub fn location(sdk: &aws::SdkSettings, source: &SourceConfig) -> Location {
    let account = [
        Some(source.table_name.as_str()),
        source.stream_arn.as_deref(),
    ]
    .into_iter()
    .flatten()
    .find_map(Location::account_of);
    Location {
        region: sdk.region().map(|r| r.as_ref().to_string()),
        endpoint_url: sdk.endpoint_url().map(str::to_string),
        account,
    }
}

/// The identity of this pipeline's position (SPEC-level rules in `state::identity`).
pub fn identity(config: &PipelineConfig, location: &Location) -> Identity {
    Identity::of(
        &config.source,
        location,
        destination::keyed_output(config).as_ref(),
    )
}

/// `DescribeTable`, retried by the one policy. `None` when the response held no table.
pub async fn describe<A: TableApi>(
    api: &A,
    source: &SourceConfig,
    cancel: &Cancel,
) -> Result<TableDescription, Failure> {
    let table = source.table_name.as_str();
    let described = retry_policy(source)
        .run(
            "describe_table",
            || format!("DescribeTable '{table}'"),
            cancel,
            &RequestMetrics,
            |_| api.describe_table(table),
        )
        .await;
    match described {
        Ok(Some(description)) => Ok(description),
        Ok(None) => Err(Failure::runtime(anyhow!(
            "DescribeTable '{table}' returned no table"
        ))),
        Err(error) => {
            let hint = match error.code() {
                Some("ResourceNotFoundException") => Some(format!(
                    "check source.table_name, source.region and the account: table '{table}' was not found"
                )),
                Some("AccessDeniedException") => Some(format!(
                    "grant dynamodb:DescribeTable on table '{table}' to the credentials in use"
                )),
                Some("UnrecognizedClientException" | "InvalidSignatureException") => {
                    Some("check the credentials in source.credentials".to_string())
                }
                None => Some(format!(
                    "check source.endpoint_url / source.region: {} could not be reached",
                    source.endpoint_url.as_deref().unwrap_or("DynamoDB")
                )),
                _ => None,
            };
            let failure = Failure::runtime(error);
            Err(match hint {
                Some(hint) => failure.hint(hint),
                None => failure,
            })
        }
    }
}

/// The table rules that need `DescribeTable` (SPEC §1.3 last paragraph).
#[derive(Debug)]
pub struct TableRules {
    /// `index_name` problems (not found; consistent read on a GSI).
    pub index: Option<String>,
    /// The effective read rate, or why `read_capacity_fraction` has no base.
    pub read_rate: Result<Option<f64>, String>,
}

/// Checks `index_name` and computes the read rate of SPEC §2.7.
pub fn table_rules(source: &SourceConfig, table: &TableDescription) -> TableRules {
    let mut index = None;
    if let Some(name) = &source.index_name {
        match table.index(name) {
            None => {
                let names: Vec<&str> = table.indexes.iter().map(|i| i.name.as_str()).collect();
                let listed = if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                };
                index = Some(format!(
                    "index '{name}' not found on table '{}'; indexes: {listed}",
                    source.table_name
                ));
            }
            Some(found) if found.kind == IndexKind::Gsi && source.consistent_read => {
                index = Some("global secondary indexes do not support consistent reads".into());
            }
            Some(_) => {}
        }
    }
    TableRules {
        index,
        read_rate: read_rate(source, table),
    }
}

/// The base of `read_capacity_fraction`: provisioned RCU of the table (or the GSI named by
/// `index_name`), else the on-demand maximum read request units.
pub fn capacity_base(source: &SourceConfig, table: &TableDescription) -> Option<f64> {
    let (provisioned, maximum) = match source.index_name.as_deref().and_then(|n| table.index(n)) {
        Some(index) if index.kind == IndexKind::Gsi => {
            (index.read_capacity_units, index.max_read_request_units)
        }
        _ => (table.read_capacity_units, table.max_read_request_units),
    };
    let positive = |v: Option<i64>| v.filter(|v| *v > 0).map(|v| v as f64);
    if table.is_on_demand() {
        positive(maximum)
    } else {
        positive(provisioned).or(positive(maximum))
    }
}

fn read_rate(source: &SourceConfig, table: &TableDescription) -> Result<Option<f64>, String> {
    let fixed = source.max_read_units_per_second;
    let Some(fraction) = source.read_capacity_fraction else {
        return Ok(fixed);
    };
    match capacity_base(source, table) {
        Some(base) => {
            let from_fraction = clamp_rate(base * fraction);
            Ok(Some(fixed.map_or(from_fraction, |f| f.min(from_fraction))))
        }
        None if fixed.is_some() => Ok(fixed),
        None => Err(format!(
            "table '{}' is on-demand (PAY_PER_REQUEST) with no maximum read throughput; \
             read_capacity_fraction needs a base — set source.max_read_units_per_second",
            source.table_name
        )),
    }
}

/// The settings of a jsonl sink.
pub fn jsonl_settings(jsonl: &JsonlConfig) -> JsonlSettings {
    JsonlSettings {
        target: match &jsonl.path {
            JsonlTarget::Stdout => jsonl::JsonlTarget::Stdout,
            JsonlTarget::File(path) => jsonl::JsonlTarget::File(path.clone()),
        },
        rotate_bytes: jsonl.rotate_bytes,
        fsync: jsonl.fsync,
    }
}

/// Maps a state problem to its failure: corrupt state and locks are runtime failures.
pub fn state_failure(error: StateError, config_path: &Path) -> Failure {
    let hint = match &error {
        StateError::Corrupt { .. } => Some(format!(
            "fix the entry or run `ddbpipe state reset {}`",
            config_path.display()
        )),
        StateError::Locked { .. } => {
            Some("wait for the other run to finish, or stop it (SIGTERM drains it)".to_string())
        }
        StateError::Write { .. } => Some(
            "state.path: make its directory writable, or choose another state.path".to_string(),
        ),
        _ => None,
    };
    let failure = Failure::runtime(error);
    match hint {
        Some(hint) => failure.hint(hint),
        None => failure,
    }
}

/// Maps a failure to start from the stored state: corrupt state and locks are runtime
/// failures, a position of another source is a usage failure with the reset remedy.
pub fn start_failure(error: StartError, config_path: &Path) -> Failure {
    match error {
        StartError::State(error) => state_failure(error, config_path),
        other => Failure::usage(other).hint(format!(
            "`ddbpipe state reset {}` forgets the stored position",
            config_path.display()
        )),
    }
}

/// Runs a pipeline: validate, lock, load the position, build, read, write, commit.
pub async fn run(
    config_path: &Path,
    progress: ProgressMode,
    metrics_addr: Option<std::net::SocketAddr>,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let config = load_config(config_path)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(addr) = metrics_addr {
        crate::telemetry::serve_metrics(addr, &config.name).map_err(Failure::runtime)?;
    }
    let span =
        tracing::info_span!("run", pipeline = %config.name, table = %config.source.table_name);
    run_instrumented(config, config_path, progress, stop)
        .instrument(span)
        .await
}

async fn run_instrumented(
    config: PipelineConfig,
    config_path: &Path,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let source = &config.source;
    let kind = match source.mode {
        Mode::Scan => ScanKind::Scan,
        Mode::Query => ScanKind::Query,
        Mode::Streams | Mode::Mirror => {
            return crate::stream_wiring::run(&config, config_path, progress, stop).await;
        }
    };

    let (api, mut location) = table_api(source).await;
    let api = Arc::new(api);
    let table = describe(api.as_ref(), source, &stop).await?;
    location.learn(&table);
    let destination = destination::open(&config, config_path, Some(&table), Records::Items).await?;
    let mut sink = destination.sink;
    let total_segments = if kind == ScanKind::Query {
        1
    } else {
        source.segments
    };
    let mut checkpointer = Checkpointer::open_scan(
        destination.store,
        &config.name,
        identity(&config, &location),
        kind,
        total_segments,
        Duration::from_millis(config.state.flush_interval_ms),
    )
    .await
    .map_err(|error| start_failure(error, config_path))?;
    let resumed = checkpointer.position().has_progress();

    let rules = table_rules(source, &table);
    if let Some(problem) = rules.index {
        return Err(Failure::usage(anyhow!(
            "config error: source.index_name: {problem}"
        )));
    }
    let rate = rules.read_rate.map_err(|problem| {
        Failure::usage(anyhow!(
            "config error: source.read_capacity_fraction: {problem}"
        ))
    })?;
    let limiter = Arc::new(ReadLimiter::new(rate));
    if let Some(rate) = rate {
        tracing::info!(units_per_second = rate, "Read capacity limited.");
    }
    let refresher = source.read_capacity_fraction.map(|_| {
        let api = Arc::clone(&api);
        let limiter = Arc::clone(&limiter);
        let source = source.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(BASE_REFRESH).await;
                match describe(api.as_ref(), &source, &stop).await {
                    // The same rule as at the start: fraction of the base, the fixed limit.
                    Ok(table) => match read_rate(&source, &table) {
                        Ok(Some(rate)) if capacity_base(&source, &table).is_some() => {
                            limiter.set_configured_rate(rate);
                        }
                        _ => tracing::warn!("The capacity base is gone; keeping the current read rate."),
                    },
                    Err(error) => tracing::warn!(error = %error, "Re-reading the capacity base failed; keeping the current read rate."),
                }
            }
        })
    });

    let format = source.value_format;
    let reader = SegmentReader {
        api,
        template: scan::read_template(source),
        total_segments,
        max_concurrency: source.max_concurrency,
        limiter,
        retry: retry_policy(source),
        render: Render::Items(format),
        observer: Arc::new(RequestMetrics),
    };
    tracing::info!(
        mode = %source.mode,
        segments = total_segments,
        resumed,
        "Run started."
    );
    let started = Instant::now();
    let bar = ScanProgress::new(
        progress,
        table.item_count,
        checkpointer.position().done.count(),
        total_segments,
    );
    let outcome = run_scan(
        reader,
        source.batch_size,
        &mut sink,
        &mut checkpointer,
        stop,
        &bar,
    )
    .await;
    bar.finish();
    if let Some(task) = refresher {
        task.abort();
    }
    let outcome = outcome.map_err(|error| {
        let hint = match &error {
            RunError::Read(read) if read.code() == Some("AccessDeniedException") => format!(
                "access denied for dynamodb:{} on table '{}' — grant it to the credentials in use ({})",
                if kind == ScanKind::Query { "Query" } else { "Scan" },
                source.table_name,
                source.credentials.describe()
            ),
            _ => failure::rerun_hint(Some(&error), config_path, "the last committed page"),
        };
        Failure::runtime(error).hint(hint)
    })?;
    summarize(&config, &outcome, started.elapsed());
    if outcome.completed {
        Ok(Exit::Ok)
    } else {
        Err(Failure::runtime(anyhow!(
            "{} of '{}' was interrupted: the output is incomplete",
            source.mode,
            source.table_name
        ))
        .hint(format!(
            "the position is saved; `ddbpipe run {}` resumes",
            config_path.display()
        )))
    }
}

fn summarize(config: &PipelineConfig, outcome: &ScanOutcome, took: Duration) {
    let position = if outcome.completed {
        "position cleared (the next run reads the table afresh)".to_string()
    } else {
        format!(
            "position saved in {} ({} segment(s) done)",
            destination::position_label(config),
            outcome.segments_done
        )
    };
    let status = if outcome.completed {
        "complete"
    } else {
        "interrupted"
    };
    tracing::info!(
        items = outcome.written,
        capacity_units = outcome.capacity_units,
        "{} {status}.",
        capitalized(config.source.mode.as_str())
    );
    eprintln!(
        "ddbpipe: {} of '{}' {status}: {} read, {} written, {:.1} capacity units, {:.1}s; {position}",
        config.source.mode,
        config.source.table_name,
        outcome.read,
        outcome.written,
        outcome.capacity_units,
        took.as_secs_f64(),
    );
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
