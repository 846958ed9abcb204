//! A pipeline's run: one build path ([`build`]: the clients and the table, then this
//! process's destination or this worker's place in the lease table), then the runner of its
//! mode — a scan or query ([`scan`]), a stream or mirror ([`streams`]), one worker's part of
//! either ([`shared`]).

mod build;
mod join;
pub(crate) mod scan;
mod shared;
mod streams;

use ddbpipe_source::retry::Cancel;
use tracing::Instrument;

use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::failure::Failure;
use crate::given::Given;
use crate::origin::Origin;
use crate::summary::{Ended, Summary};

pub(crate) use build::{Built, Run};
pub use join::{lease_table_failure, run_identity};

/// Builds the run of a validated pipeline, reading and writing nothing yet; [`Built::run`]
/// runs it.
pub(crate) async fn open<'a>(
    config: &'a PipelineConfig,
    origin: &'a Origin,
    given: &Given,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Built<'a>, Failure> {
    if given.store.is_some() {
        refuse_given_store(config)?;
    }
    let run = Run {
        config,
        origin,
        progress,
    };
    Built::open(run, given, stop).instrument(run.span()).await
}

/// A checkpoint store given in code takes the state file's place: a keyed sink keeps its
/// position in its database, with the rows, and a shared run in its lease rows.
fn refuse_given_store(config: &PipelineConfig) -> Result<(), Failure> {
    let keeps = match (&config.coordination, config.sink.keyed()) {
        (Some(coordination), _) => format!(
            "with coordination the positions are kept in lease table {}",
            coordination.lease_table
        ),
        (None, Some(_)) => format!(
            "the {} sink keeps the position in its database, committed with the rows",
            config.sink.kind()
        ),
        (None, None) => return Ok(()),
    };
    Err(Failure::usage(anyhow::anyhow!(
        "config error: a checkpoint store given in code (Pipeline::with_checkpoint_store) \
         replaces the state file of a jsonl or custom sink; {keeps}: remove the store"
    )))
}

/// The note of a run a signal stopped before its end (a scan, a query, a snapshot or a
/// repair): its progress is saved, so the stop is a clean one (exit 0, docs/cli.md §8.5, a
/// rolling restart is no failure), and what the stop left and what the rerun does are said.
fn stopped_note(origin: &Origin, left: &str, rerun: &str) -> String {
    format!(
        "ddbpipe: stopped by a signal with its progress saved: {left}; {} {rerun}",
        origin.rerun()
    )
}

/// A summary without a note.
fn summary(ended: Ended, written: u64, line: String) -> Summary {
    Summary {
        ended,
        written: Some(written),
        line,
        note: None,
    }
}
