//! `ddbpipe run`: the library's [`Pipeline`], with the command's output around it: the config's
//! warnings, metrics, the health of `/health`, and the summary.

use std::path::Path;

use ddbpipe_source::retry::Cancel;

use crate::args::ProgressMode;
use crate::failure::{Exit, Failure};
use crate::library::{Error, Pipeline};
use crate::telemetry::{self, Line, say};

/// `ddbpipe run`: the library's pipeline, with the command's output around it: warnings,
/// metrics, the health of `/health`, and the summary.
pub async fn run(
    config_path: &Path,
    progress: ProgressMode,
    metrics: &telemetry::MetricsOutput,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let pipeline = Pipeline::from_path(config_path)
        .map_err(Error::into_failure)?
        .with_progress(progress);
    telemetry::set_run(pipeline.name(), pipeline.table());
    ddbpipe_source::health::start();
    for warning in pipeline.warnings() {
        tracing::warn!("{warning}");
    }
    let metrics = telemetry::install_metrics(
        metrics,
        pipeline.name(),
        pipeline.config().metrics.health_stall(),
    )
    .map_err(Failure::runtime)?;
    let outcome = pipeline.run(stop).await.map_err(Error::into_failure);
    match &outcome {
        Ok(summary) => {
            say(Line::Summary, &summary.to_string());
            if let Some(note) = summary.note() {
                say(Line::Note, note);
            }
        }
        Err(failure) => ddbpipe_source::health::failed(&format!("{:#}", failure.error)),
    }
    // The final values, whatever the outcome: a failed nightly run is worth scraping too.
    if let Some(metrics) = &metrics
        && let Err(error) = metrics.write_final()
    {
        tracing::warn!("{error:#}");
    }
    outcome.map(|_| Exit::Ok)
}
