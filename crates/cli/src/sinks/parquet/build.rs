//! How a run builds the parquet sink: its location with the templates filled in, the S3
//! client from the run's AWS configuration, the columns from the table's key schema and the
//! stream's view (docs/sinks.md §7.10).

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_keyed::TypedColumns;
use ddbpipe_lake::iceberg::{Catalog, GlueCatalog, IcebergSettings, SqlCatalog, glue_name};
use ddbpipe_lake::objects::{Location, Objects};
use ddbpipe_lake::parquet::{ParquetPositions, ParquetSettings, ParquetSink};
use ddbpipe_lake::partition::Term;
use ddbpipe_lake::rows::Shape;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws;
use ddbpipe_source::endpoint::EndpointUrl;

use super::{CatalogType, IcebergConfig, ParquetConfig};
use crate::failure::Failure;
use crate::sinks::Target;

/// The location of `parquet` for `target`'s table and pipeline.
pub fn location(parquet: &ParquetConfig, target: Target<'_>) -> Result<Location, Failure> {
    // `{table}` was filled in when the file was loaded (`config::tables`).
    let path = parquet.path.replace("{pipeline}", target.pipeline);
    Location::parse(&path).map_err(|problem| {
        let key = match parquet.iceberg {
            Some(_) => "sink.warehouse",
            None => "sink.path",
        };
        Failure::usage(anyhow!("config error: {key}: {problem}"))
    })
}

/// The files of `parquet` for `target`: a directory, or an S3 prefix with a client from
/// `sdk` (`s3_region`, and `s3_endpoint_url` or the source's endpoint, path-style).
pub fn objects(
    parquet: &ParquetConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
) -> Result<Objects, Failure> {
    let location = location(parquet, target)?;
    let endpoint = parquet
        .s3_endpoint_url
        .as_ref()
        .or(target.source.endpoint_url.as_ref());
    // Messages show the endpoint masked (docs/config.md §1.4).
    Ok(Objects::new(
        &location,
        endpoint.map(ToString::to_string),
        || aws::s3_client(sdk, parquet.s3_region.as_deref(), endpoint),
    ))
}

fn settings(
    parquet: &ParquetConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
    objects: Objects,
    shape: Shape,
) -> Result<ParquetSettings, Failure> {
    Ok(ParquetSettings {
        objects,
        pipeline: target.pipeline.to_string(),
        shape,
        target_file_bytes: parquet.target_file_mb as usize * 1024 * 1024,
        commit_interval: Duration::from_secs(u64::from(parquet.commit_interval_secs)),
        compression: parquet.compression,
        iceberg: (parquet.iceberg.as_ref())
            .map(|iceberg| iceberg_settings(parquet, iceberg, target, sdk))
            .transpose()?,
    })
}

/// Where an iceberg sink's table is; a catalog uri that does not read is a config error
/// (never its value: it may hold a password). A Glue catalog is reached with `sdk`'s
/// credentials, in `catalog.region` (else `s3_region`, else `sdk`'s), at `catalog.endpoint_url`
/// (else the source's endpoint, when set).
pub fn iceberg_settings(
    parquet: &ParquetConfig,
    iceberg: &IcebergConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
) -> Result<IcebergSettings, Failure> {
    let catalog: Catalog = match iceberg.catalog_type {
        CatalogType::Sql => sql_catalog(iceberg)
            .map_err(|problem| {
                Failure::usage(anyhow!("config error: sink.catalog.uri: {problem}"))
            })?
            .into(),
        CatalogType::Glue => {
            let (region, endpoint) = glue_place(parquet, iceberg, target);
            GlueCatalog::new(sdk, region, endpoint, iceberg.catalog_id.clone()).into()
        }
    };
    Ok(IcebergSettings {
        catalog,
        namespace: stored_name(iceberg, &iceberg.namespace),
        table: stored_name(iceberg, &iceberg.table),
        properties: iceberg.table_properties.clone(),
    })
}

/// The name `iceberg`'s catalog keeps a namespace or table `name` under: as given in a SQL
/// catalog, in lowercase in Glue (`ddbpipe_lake::iceberg::glue_name`).
pub fn stored_name(iceberg: &IcebergConfig, name: &str) -> String {
    match iceberg.catalog_type {
        CatalogType::Sql => name.to_string(),
        CatalogType::Glue => glue_name(name),
    }
}

/// The catalog of `iceberg` for messages, without reaching it (a SQL catalog's address, never
/// its user or password).
pub fn describe_catalog(
    parquet: &ParquetConfig,
    iceberg: &IcebergConfig,
    target: Target<'_>,
) -> String {
    match iceberg.catalog_type {
        CatalogType::Sql => {
            sql_catalog(iceberg).map_or_else(|problem| format!("<{problem}>"), |c| c.describe())
        }
        CatalogType::Glue => {
            let (region, endpoint) = glue_place(parquet, iceberg, target);
            let endpoint = endpoint.map(ToString::to_string);
            GlueCatalog::describe_with(iceberg.catalog_id.as_deref(), region, endpoint.as_deref())
        }
    }
}

/// The SQL catalog of `iceberg`; what is wrong with its uri (never the uri itself).
fn sql_catalog(iceberg: &IcebergConfig) -> Result<SqlCatalog, String> {
    let (uri, name) = (iceberg.catalog_uri.expose(), iceberg.catalog_name.clone());
    SqlCatalog::from_uri(uri, Path::new(""), name)
}

/// Where a Glue catalog is: `catalog.region` (else `s3_region`; neither, the run's) and
/// `catalog.endpoint_url` (else the source's endpoint; neither, AWS's).
fn glue_place<'a>(
    parquet: &'a ParquetConfig,
    iceberg: &'a IcebergConfig,
    target: Target<'a>,
) -> (Option<&'a str>, Option<&'a EndpointUrl>) {
    let region = (iceberg.catalog_region.as_deref()).or(parquet.s3_region.as_deref());
    let endpoint = (iceberg.catalog_endpoint_url.as_ref()).or(target.source.endpoint_url.as_ref());
    (region, endpoint)
}

/// Opens the parquet sink of `target` and its position store (its commit log).
pub fn open_parquet(
    parquet: &ParquetConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
    table: Option<&TableDescription>,
    records: Records,
) -> Result<(ParquetSink, ParquetPositions), Failure> {
    let Some(table) = table else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a parquet sink needs the table's key schema"
        )));
    };
    let shape = shape(parquet, target, table, records)?;
    let objects = objects(parquet, target, sdk)?;
    Ok(ParquetSink::open(settings(
        parquet, target, sdk, objects, shape,
    )?))
}

/// The columns of `parquet` for `table`'s records of `records` kind: what `run` opens with and
/// `check` probes (a name taken twice is refused by both).
pub fn shape(
    parquet: &ParquetConfig,
    target: Target<'_>,
    table: &TableDescription,
    records: Records,
) -> Result<Shape, Failure> {
    let before = table
        .stream
        .as_ref()
        .and_then(|s| s.view_type.as_deref())
        .is_some_and(|view| view.contains("OLD"));
    let key = table
        .key_schema
        .iter()
        .map(|k| (k.name.clone(), k.key_type))
        .collect();
    let typed = TypedColumns::new(
        crate::sinks::keyed::columns::specs(&parquet.columns),
        target.source.value_format,
        parquet.on_type_mismatch,
    );
    let shape = Shape::typed(
        key,
        target.source.value_format,
        records,
        before,
        Some(typed),
    )
    .map_err(|p| {
        Failure::usage(anyhow!(
            "config error: sink.columns: table '{}': {p}",
            table.name
        ))
    })?;
    let Some(partition_by) = &parquet.partition_by else {
        return Ok(shape);
    };
    // The terms were read when the file was (`config::validate`).
    let terms = partition_by
        .iter()
        .map(|term| Term::parse(term))
        .collect::<Result<Vec<_>, _>>();
    terms
        .and_then(|terms| shape.partitioned(&terms))
        .map_err(|p| {
            Failure::usage(anyhow!(
                "config error: sink.partition_by: table '{}': {p}",
                table.name
            ))
        })
}

/// The files of `parquet` outside a run (`check`, `state`, `lag`), reached with the AWS
/// configuration the source's settings load, as a run's is when no program gives one.
pub async fn reading_objects(
    parquet: &ParquetConfig,
    target: Target<'_>,
) -> Result<(Objects, aws::SdkSettings), Failure> {
    let sdk = aws::load_sdk_config(&ddbpipe_source::plan::client_settings(target.source)).await;
    Ok((objects(parquet, target, &sdk)?, sdk))
}

/// The commit log of a parquet sink, for reading and resetting (`state`, `lag`, `check`).
pub async fn positions_reader(
    parquet: &ParquetConfig,
    target: Target<'_>,
) -> Result<ParquetPositions, Failure> {
    // No key is needed to read or reset a position: the columns stay unused.
    let shape = Shape::new(
        Vec::new(),
        target.source.value_format,
        Records::Items,
        false,
    )
    .map_err(|p| Failure::runtime(anyhow!("internal error: {p}")))?;
    let (objects, sdk) = reading_objects(parquet, target).await?;
    Ok(ParquetPositions::reading(settings(
        parquet, target, &sdk, objects, shape,
    )?))
}
