//! `check`'s probe of a lake sink (docs/sinks.md §7.10, §7.11): the columns `run` would write
//! (a name taken twice is refused), and the location takes a file and lets it be deleted again
//! (a file under `_ddbpipe/`, gone afterwards); an iceberg sink's catalog is read and an
//! existing table's columns compared with the sink's. An S3 table's files are where the
//! service placed them: a table not made yet is found without making it, and its bucket read.
//! The position probe reads the commit log or the table's snapshots.

use std::time::Duration;

use super::{Probes, Status};
use crate::config::PipelineConfig;
use crate::sinks::ParquetConfig;
use crate::sinks::parquet::{Placed, reading_objects, shape};
use ddbpipe_lake::iceberg::{Catalog, probe};
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
    let mut columns = None;
    if let Some(table) = table {
        let records = if config.source.mode.reads_stream() {
            Records::Envelopes
        } else {
            Records::Items
        };
        match shape(parquet, config.target(), table, records) {
            Ok(shape) => columns = Some(shape),
            Err(failure) => {
                probes.add("sink", Status::Fail, format!("{failure:#}"));
                return;
            }
        }
    }
    let kind = config.sink.kind();
    let (objects, iceberg) = match reading_objects(parquet, config.target()).await {
        Ok(Placed::At(objects, iceberg)) => (objects, iceberg),
        Ok(Placed::NotMade(iceberg)) => {
            // An S3 table a run makes: its bucket is what can be read now.
            match iceberg.catalog.writable().await {
                Ok(()) => probes.add(
                    "sink",
                    Status::Pass,
                    format!(
                        "{kind} {}.{} in the {}: not there yet (the first run creates it)",
                        iceberg.namespace,
                        iceberg.table,
                        iceberg.catalog.describe()
                    ),
                ),
                Err(problem) => probes.add("sink", Status::Fail, format!("{kind}: {problem}")),
            }
            return;
        }
        Err(failure) => {
            probes.add("sink", Status::Fail, format!("{failure:#}"));
            return;
        }
    };
    let place = objects.describe();
    // An S3 table's storage takes no deletes (S3 Tables' maintenance removes files): the
    // probe reads its metadata, and write access shows at the first commit.
    let placed = (iceberg.as_ref()).is_some_and(|i| matches!(i.catalog, Catalog::S3Tables(_)));
    let probed = async {
        let tried = if placed {
            "S3 Tables takes no test file: write access shows at the first commit"
        } else {
            objects.probe().await?;
            "a file was written and deleted"
        };
        match (iceberg, &columns) {
            (Some(settings), Some(shape)) => {
                let table = probe(settings, &objects, &config.name, shape).await?;
                Ok(format!("{tried}; {table}"))
            }
            (None, Some(shape)) => {
                ddbpipe_lake::parquet::probe(&objects, shape).await?;
                Ok(tried.to_string())
            }
            _ => Ok::<_, String>(tried.to_string()),
        }
    };
    match tokio::time::timeout(timeout * 2, probed).await {
        Ok(Ok(said)) => probes.add("sink", Status::Pass, format!("{kind} {place}: {said}")),
        Ok(Err(problem)) => probes.add("sink", Status::Fail, format!("{kind}: {problem}")),
        Err(_) => probes.add(
            "sink",
            Status::Fail,
            format!(
                "{kind} {place}: no answer within {} s: check the location and the S3 endpoint",
                (timeout * 2).as_secs()
            ),
        ),
    }
}
