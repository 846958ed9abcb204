//! A pipeline's run: the run of its mode — a scan or query ([`scan`]), a stream ([`streams`],
//! also mirror), or one worker's part of either ([`shared`]).

mod scan;
pub mod shared;
mod streams;

use std::path::Path;

use ddbpipe_source::config::Mode;
use ddbpipe_source::retry::Cancel;
use tracing::Instrument;

use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::failure::Failure;
use crate::sink::GivenSink;
use crate::summary::{Ended, Summary};

/// Runs a validated pipeline: lock, load the position, build, read, write, commit.
pub async fn run(
    config: &PipelineConfig,
    config_path: &Path,
    given: Option<&GivenSink>,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let span =
        tracing::info_span!("run", pipeline = %config.name, table = %config.source.table_name);
    let ran = async {
        match (config.source.mode, &config.coordination) {
            (Mode::Scan | Mode::Query, None) => {
                scan::run(config, config_path, given, progress, stop).await
            }
            (Mode::Scan | Mode::Query, Some(coordination)) => {
                shared::run(config, coordination, config_path, progress, stop).await
            }
            (Mode::Streams | Mode::Mirror, None) => {
                streams::run(config, config_path, given, progress, stop).await
            }
            (Mode::Mirror, Some(coordination)) => {
                shared::run_mirror(config, coordination, config_path, progress, stop).await
            }
            (Mode::Streams, Some(coordination)) => {
                shared::run_streams(config, coordination, config_path, stop).await
            }
        }
    };
    ran.instrument(span).await
}

/// The note of a run a signal stopped before its end (a scan, a query, a snapshot or a
/// repair): its progress is saved, so the stop is a clean one (exit 0, docs/cli.md §8.5, a
/// rolling restart is no failure), and what the stop left and what the rerun does are said.
fn stopped_note(config_path: &Path, left: &str, rerun: &str) -> String {
    format!(
        "ddbpipe: stopped by a signal with its progress saved: {left}; `ddbpipe run {}` {rerun}",
        config_path.display()
    )
}

/// A summary without a note.
fn summary(ended: Ended, written: u64, line: String) -> Summary {
    Summary {
        ended,
        written,
        line,
        note: None,
    }
}
