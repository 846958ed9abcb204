//! `check`'s probe of a lake sink (docs/sinks.md §7.10): the columns `run` would write (a name
//! taken twice is refused), and the location takes a file and lets it be deleted again (a file
//! under `_ddbpipe/`, gone afterwards). Its commit log is read by the position probe.

use std::time::Duration;

use super::{Probes, Status};
use crate::config::PipelineConfig;
use crate::sinks::ParquetConfig;
use crate::sinks::parquet::{reading_objects, shape};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;

/// Adds the `sink` probe of a parquet sink.
pub(super) async fn probe_parquet(
    config: &PipelineConfig,
    parquet: &ParquetConfig,
    table: Option<&TableDescription>,
    timeout: Duration,
    probes: &mut Probes,
) {
    if let Some(table) = table {
        let records = if config.source.mode.reads_stream() {
            Records::Envelopes
        } else {
            Records::Items
        };
        if let Err(failure) = shape(parquet, config.target(), table, records) {
            probes.add("sink", Status::Fail, format!("{failure:#}"));
            return;
        }
    }
    let objects = match reading_objects(parquet, config.target()).await {
        Ok(objects) => objects,
        Err(failure) => {
            probes.add("sink", Status::Fail, format!("{failure:#}"));
            return;
        }
    };
    let place = objects.describe();
    match tokio::time::timeout(timeout * 2, objects.probe()).await {
        Ok(Ok(())) => probes.add(
            "sink",
            Status::Pass,
            format!("parquet {place}: a file was written and deleted"),
        ),
        Ok(Err(problem)) => probes.add("sink", Status::Fail, format!("parquet: {problem}")),
        Err(_) => probes.add(
            "sink",
            Status::Fail,
            format!(
                "parquet {place}: no answer within {} s: check sink.path and the S3 endpoint",
                (timeout * 2).as_secs()
            ),
        ),
    }
}
