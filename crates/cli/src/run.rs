//! `ddbpipe run`: load and validate the config, then run the pipeline of its mode — a scan or
//! query ([`scan`]) or a stream ([`streams`], also mirror).

mod scan;
pub mod shared;
mod streams;

use std::path::Path;

use ddbpipe_source::config::Mode;
use ddbpipe_source::retry::Cancel;
use tracing::Instrument;

use crate::args::ProgressMode;
use crate::failure::{Exit, Failure};
use crate::telemetry;
use crate::wiring;

/// Runs a pipeline: validate, lock, load the position, build, read, write, commit.
pub async fn run(
    config_path: &Path,
    progress: ProgressMode,
    metrics: &telemetry::MetricsOutput,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let config = wiring::load_config(config_path)?;
    telemetry::set_run(&config.name, &config.source.table_name);
    ddbpipe_source::health::start();
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let metrics = telemetry::install_metrics(metrics, &config.name, config.metrics.health_stall())
        .map_err(Failure::runtime)?;
    let span =
        tracing::info_span!("run", pipeline = %config.name, table = %config.source.table_name);
    let mode = config.source.mode;
    let ran = async {
        match mode {
            Mode::Scan | Mode::Query => match &config.coordination {
                Some(coordination) => {
                    shared::run(&config, coordination, config_path, progress, stop).await
                }
                None => scan::run(&config, config_path, progress, stop).await,
            },
            Mode::Mirror => match &config.coordination {
                Some(coordination) => {
                    shared::run_mirror(&config, coordination, config_path, progress, stop).await
                }
                None => streams::run(&config, config_path, progress, stop).await,
            },
            Mode::Streams => match &config.coordination {
                Some(coordination) => {
                    shared::run_streams(&config, coordination, config_path, stop).await
                }
                None => streams::run(&config, config_path, progress, stop).await,
            },
        }
    };
    let outcome = ran.instrument(span).await;
    if let Err(failure) = &outcome {
        ddbpipe_source::health::failed(&format!("{:#}", failure.error));
    }
    // The final values, whatever the outcome: a failed nightly run is worth scraping too.
    if let Some(metrics) = &metrics
        && let Err(error) = metrics.write_final()
    {
        tracing::warn!("{error:#}");
    }
    outcome
}

/// The note after the summary of a run a signal stopped before its end (a scan, a query, a
/// snapshot or a repair): its progress is saved, so the stop is a clean one (exit 0, docs/cli.md
/// §8.5, a rolling restart is no failure), and what the stop left and what the rerun does are
/// said.
fn stopped_note(config_path: &Path, left: &str, rerun: &str) {
    telemetry::say(
        telemetry::Line::Note,
        &format!(
            "ddbpipe: stopped by a signal with its progress saved: {left}; `ddbpipe run {}` {rerun}",
            config_path.display()
        ),
    );
}
