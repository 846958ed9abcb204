//! How a run builds the parquet sink: its location with the templates filled in, the S3
//! client from the run's AWS configuration, the columns from the table's key schema and the
//! stream's view (docs/sinks.md §7.10).

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_keyed::TypedColumns;
use ddbpipe_lake::iceberg::{
    Catalog, GlueCatalog, IcebergSettings, RestAuth, RestCatalog, S3TablesCatalog, SqlCatalog,
    glue_name, s3tables_name, table_bucket_region,
};
use ddbpipe_lake::objects::{Location, Objects};
use ddbpipe_lake::parquet::{ParquetPositions, ParquetSettings, ParquetSink};
use ddbpipe_lake::partition::Term;
use ddbpipe_lake::rows::Shape;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws;
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_source::retry::RetryPolicy;

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

/// The files of `parquet` at `location`: a directory, or an S3 prefix with a client from
/// `sdk`, retried within `source.retry` (`s3_region` — an S3 table's: its catalog's region —
/// and `s3_endpoint_url` or the source's endpoint, path-style).
fn objects_at(
    parquet: &ParquetConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
    location: &Location,
) -> Objects {
    let endpoint = parquet
        .s3_endpoint_url
        .as_ref()
        .or(target.source.endpoint_url.as_ref());
    let region = match &parquet.iceberg {
        Some(iceberg) if iceberg.catalog_type == CatalogType::S3Tables => {
            (parquet.s3_region.as_deref()).or(s3tables_place(iceberg, target).1)
        }
        _ => parquet.s3_region.as_deref(),
    };
    // Messages show the endpoint masked (docs/config.md §1.4); requests are retried within
    // the run's budget (docs/errors.md §9).
    let retry = target.source.retry.policy();
    Objects::new(location, endpoint.map(ToString::to_string), retry, || {
        aws::s3_client(sdk, region, endpoint)
    })
}

/// Where a lake sink's files are.
pub enum Placed {
    /// Its files, with its Iceberg table's settings when it is an iceberg sink.
    At(Objects, Option<IcebergSettings>),
    /// An S3 table not made yet (outside a run, which makes it): its settings.
    NotMade(IcebergSettings),
}

/// Where the files of `parquet` for `target` go: its `path` (the warehouse), or an S3 table's
/// own location (the catalog's rule 3), found by asking the service — the namespace and table
/// made when missing when `place`, else [`Placed::NotMade`] while there is no such table
/// (`check`, `state` and `lag` create nothing).
async fn placed(
    parquet: &ParquetConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
    place: bool,
) -> Result<Placed, Failure> {
    let iceberg = (parquet.iceberg.as_ref())
        .map(|iceberg| iceberg_settings(parquet, iceberg, target, sdk))
        .transpose()?;
    let location = match &iceberg {
        Some(IcebergSettings {
            catalog: Catalog::S3Tables(catalog),
            namespace,
            table,
            ..
        }) => {
            let found = match place {
                true => catalog.place(namespace, table).await.map(Some),
                false => catalog.warehouse(namespace, table).await,
            };
            let found = found.map_err(|problem| Failure::runtime(anyhow!(problem)))?;
            let Some(found) = found else {
                return Ok(Placed::NotMade(iceberg.expect("an S3 table's settings")));
            };
            Location::parse(&found).map_err(|problem| {
                Failure::runtime(anyhow!(
                    "table {namespace}.{table} of the {}: its warehouse location {problem}",
                    catalog.describe()
                ))
            })?
        }
        _ => location(parquet, target)?,
    };
    Ok(Placed::At(
        objects_at(parquet, target, sdk, &location),
        iceberg,
    ))
}

fn settings(
    parquet: &ParquetConfig,
    target: Target<'_>,
    objects: Objects,
    iceberg: Option<IcebergSettings>,
    shape: Shape,
) -> ParquetSettings {
    ParquetSettings {
        objects,
        pipeline: target.pipeline.to_string(),
        shape,
        target_file_bytes: parquet.target_file_mb as usize * 1024 * 1024,
        commit_interval: Duration::from_secs(u64::from(parquet.commit_interval_secs)),
        compression: parquet.compression,
        iceberg,
    }
}

/// Where an iceberg sink's table is; a catalog uri that does not read is a config error
/// (never its value: it may hold a password). A Glue catalog is reached with `sdk`'s
/// credentials, in `catalog.region` (else `s3_region`, else `sdk`'s), at `catalog.endpoint_url`
/// (else the source's endpoint, when set).
fn iceberg_settings(
    parquet: &ParquetConfig,
    iceberg: &IcebergConfig,
    target: Target<'_>,
    sdk: &aws::SdkSettings,
) -> Result<IcebergSettings, Failure> {
    // Requests are retried within the run's budget (docs/errors.md §9.4).
    let retry = target.source.retry.policy();
    let catalog: Catalog = match iceberg.catalog_type {
        CatalogType::Sql => sql_catalog(iceberg)
            .map_err(|problem| {
                Failure::usage(anyhow!("config error: sink.catalog.uri: {problem}"))
            })?
            .with_retry(retry)
            .into(),
        CatalogType::Glue => {
            let (region, endpoint) = glue_place(parquet, iceberg, target);
            GlueCatalog::new(sdk, region, endpoint, iceberg.catalog_id.clone(), retry).into()
        }
        CatalogType::S3Tables => {
            let (arn, region, endpoint) = s3tables_place(iceberg, target);
            S3TablesCatalog::new(sdk, arn.to_string(), region, endpoint, retry).into()
        }
        CatalogType::Rest => rest_catalog(iceberg, retry)
            .map_err(|problem| {
                Failure::usage(anyhow!("config error: sink.catalog.uri: {problem}"))
            })?
            .into(),
    };
    Ok(IcebergSettings {
        catalog,
        namespace: stored_name(iceberg, &iceberg.namespace),
        table: stored_name(iceberg, &iceberg.table),
        properties: iceberg.table_properties.clone(),
    })
}

/// The name `iceberg`'s catalog keeps a namespace or table `name` under: as given in a SQL
/// catalog, in lowercase in Glue (`ddbpipe_lake::iceberg::glue_name`), in lowercase with
/// underscores for hyphens in S3 Tables (`ddbpipe_lake::iceberg::s3tables_name`).
pub fn stored_name(iceberg: &IcebergConfig, name: &str) -> String {
    match iceberg.catalog_type {
        CatalogType::Sql | CatalogType::Rest => name.to_string(),
        CatalogType::Glue => glue_name(name),
        CatalogType::S3Tables => s3tables_name(name),
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
        CatalogType::S3Tables => {
            let (arn, _, endpoint) = s3tables_place(iceberg, target);
            let endpoint = endpoint.map(ToString::to_string);
            S3TablesCatalog::describe_with(arn, endpoint.as_deref())
        }
        CatalogType::Rest => {
            let warehouse = iceberg.rest.warehouse.as_deref();
            RestCatalog::describe_with(iceberg.catalog_uri.expose(), warehouse)
        }
    }
}

/// The REST catalog of `iceberg`, its requests retried within `retry`; what is wrong with
/// its uri (never the uri itself).
fn rest_catalog(iceberg: &IcebergConfig, retry: RetryPolicy) -> Result<RestCatalog, String> {
    let rest = &iceberg.rest;
    let auth = RestAuth {
        token: rest.token.clone(),
        credential: rest.credential.clone(),
        oauth2_server_uri: (rest.oauth2_server_uri.as_ref()).map(|uri| uri.expose().to_string()),
        scope: rest.scope.clone(),
    };
    let uri = iceberg.catalog_uri.expose();
    RestCatalog::new(uri, rest.warehouse.clone(), auth, retry)
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

/// Where an S3 table bucket is: its ARN, `catalog.region` (else the ARN's) and
/// `catalog.endpoint_url` (else the source's endpoint; neither, AWS's).
fn s3tables_place<'a>(
    iceberg: &'a IcebergConfig,
    target: Target<'a>,
) -> (&'a str, Option<&'a str>, Option<&'a EndpointUrl>) {
    // A missing or malformed ARN was refused when the file was read (`config::validate`).
    let arn = iceberg.table_bucket_arn.as_deref().unwrap_or_default();
    let region = (iceberg.catalog_region.as_deref()).or(table_bucket_region(arn).ok());
    let endpoint = (iceberg.catalog_endpoint_url.as_ref()).or(target.source.endpoint_url.as_ref());
    (arn, region, endpoint)
}

/// Opens the parquet sink of `target` and its position store (its commit log, or its
/// Iceberg table's snapshots; an S3 table is placed first: the catalog's rule 3).
pub async fn open_parquet(
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
    let Placed::At(objects, iceberg) = placed(parquet, target, sdk, true).await? else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a placed table has no location"
        )));
    };
    Ok(ParquetSink::open(settings(
        parquet, target, objects, iceberg, shape,
    )))
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
/// configuration the source's settings load, as a run's is when no program gives one, with
/// its Iceberg table's settings (an S3 table not made yet is not made).
pub async fn reading_objects(
    parquet: &ParquetConfig,
    target: Target<'_>,
) -> Result<Placed, Failure> {
    let sdk = aws::load_sdk_config(&ddbpipe_source::plan::client_settings(target.source)).await;
    placed(parquet, target, &sdk, false).await
}

/// The commit log of a parquet sink, for reading and resetting (`state`, `lag`, `check`);
/// `None`: an S3 table not made yet, which holds no position.
pub async fn positions_reader(
    parquet: &ParquetConfig,
    target: Target<'_>,
) -> Result<Option<ParquetPositions>, Failure> {
    // No key is needed to read or reset a position: the columns stay unused.
    let shape = Shape::new(
        Vec::new(),
        target.source.value_format,
        Records::Items,
        false,
    )
    .map_err(|p| Failure::runtime(anyhow!("internal error: {p}")))?;
    match reading_objects(parquet, target).await? {
        Placed::At(objects, iceberg) => Ok(Some(ParquetPositions::reading(settings(
            parquet, target, objects, iceberg, shape,
        )))),
        Placed::NotMade(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SinkConfig;

    /// docs/sinks.md §7.11 rule 1: an S3 table bucket is reached in its ARN's region unless
    /// `catalog.region` says otherwise, at `catalog.endpoint_url`, else the source's endpoint.
    #[test]
    fn an_s3_table_bucket_is_reached_in_its_arns_region() {
        let file = |catalog: &str| {
            let yaml = format!(
                "name: t\nsource: {{table_name: o, endpoint_url: 'http://127.0.0.1:1'}}\nsink: \
                 {{type: iceberg, catalog: {{type: s3tables, table_bucket_arn: \
                 'arn:aws:s3tables:eu-west-1:123456789012:bucket/lake'{catalog}}}}}\n"
            );
            crate::config::parse(&yaml, std::path::Path::new("conf"), &|_: &str| None)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let place = |config: &crate::config::PipelineConfig| {
            let SinkConfig::Parquet(parquet) = &config.sink else {
                panic!("{:?}", config.sink);
            };
            let (arn, region, endpoint) =
                s3tables_place(parquet.iceberg.as_ref().unwrap(), config.target());
            let endpoint = endpoint.map(|url| url.expose().to_string());
            (arn.to_string(), region.map(str::to_string), endpoint)
        };
        let arn = "arn:aws:s3tables:eu-west-1:123456789012:bucket/lake".to_string();
        assert_eq!(
            place(&file("")),
            (
                arn.clone(),
                Some("eu-west-1".into()),
                Some("http://127.0.0.1:1".into())
            )
        );
        assert_eq!(
            place(&file(
                ", region: us-east-2, endpoint_url: 'http://127.0.0.1:2'"
            )),
            (
                arn,
                Some("us-east-2".into()),
                Some("http://127.0.0.1:2".into())
            )
        );
    }
}
