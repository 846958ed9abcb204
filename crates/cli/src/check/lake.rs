//! `check`'s probe of a lake sink (docs/sinks.md §7.10, §7.11): the columns `run` would write
//! (a name taken twice is refused), and the location takes a file and lets it be deleted again
//! (a file under `_ddbpipe/`, gone afterwards); an iceberg sink's catalog is read and an
//! existing table's columns compared with the sink's. The position probe reads the commit log
//! or the table's snapshots.

use std::time::Duration;

use super::{Probes, Status};
use crate::config::PipelineConfig;
use crate::sinks::ParquetConfig;
use crate::sinks::parquet::{iceberg_settings, reading_objects, shape};
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
    let (objects, sdk) = match reading_objects(parquet, config.target()).await {
        Ok(objects) => objects,
        Err(failure) => {
            probes.add("sink", Status::Fail, format!("{failure:#}"));
            return;
        }
    };
    let place = objects.describe();
    let kind = config.sink.kind();
    let probed = async {
        objects.probe().await?;
        match (&parquet.iceberg, &columns) {
            (Some(iceberg), Some(shape)) => {
                let settings = iceberg_settings(parquet, iceberg, config.target(), &sdk)
                    .map_err(|f| format!("{:#}", f.error))?;
                let table =
                    ddbpipe_lake::iceberg::probe(settings, &objects, &config.name, shape).await?;
                Ok(format!("; {table}"))
            }
            (None, Some(shape)) => {
                ddbpipe_lake::parquet::probe(&objects, shape).await?;
                Ok(String::new())
            }
            _ => Ok::<_, String>(String::new()),
        }
    };
    match tokio::time::timeout(timeout * 2, probed).await {
        Ok(Ok(table)) => probes.add(
            "sink",
            Status::Pass,
            format!("{kind} {place}: a file was written and deleted{table}"),
        ),
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
