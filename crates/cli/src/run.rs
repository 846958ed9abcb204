//! `ddbpipe run`: load and validate the config, then run the pipeline of its mode — a scan or
//! query ([`scan`]) or a stream ([`streams`], also mirror).

mod scan;
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
    metrics_addr: Option<std::net::SocketAddr>,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let config = wiring::load_config(config_path)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(addr) = metrics_addr {
        telemetry::serve_metrics(addr, &config.name).map_err(Failure::runtime)?;
    }
    let span =
        tracing::info_span!("run", pipeline = %config.name, table = %config.source.table_name);
    let mode = config.source.mode;
    let ran = async {
        match mode {
            Mode::Scan | Mode::Query => scan::run(&config, config_path, progress, stop).await,
            Mode::Streams | Mode::Mirror => {
                streams::run(&config, config_path, progress, stop).await
            }
        }
    };
    ran.instrument(span).await
}
