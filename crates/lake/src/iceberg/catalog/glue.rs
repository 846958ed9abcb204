//! The AWS Glue Data Catalog as the Iceberg sink's catalog (docs/sinks.md §7.11, `catalog`
//! rules): the tables Athena, EMR, Redshift Spectrum and pyiceberg's `GlueCatalog` read.
//!
//! # Rules
//! 1. A namespace is a Glue database and a table a Glue table of the same names in lowercase
//!    ([`glue_name`]: Glue folds them so as it stores them, and a name compared or read back
//!    as given would not be found again), in the catalog of the caller's account or of
//!    `catalog_id`. A Glue table is an Iceberg table
//!    when its `table_type` parameter is `ICEBERG` (in any case, as Athena and pyiceberg write
//!    it); its current metadata is its `metadata_location` parameter. Another table of the
//!    name is refused, naming it.
//! 2. **Create**: the database when missing (`AlreadyExistsException`: another writer made
//!    it), then the table: `EXTERNAL_TABLE`, `table_type` `ICEBERG`, `metadata_location`, its
//!    storage location the directory above the metadata's, its columns the schema's (rule 5).
//!    `AlreadyExistsException` is another writer's table: `false`.
//! 3. **Swap**: `GetTable`; a `metadata_location` other than the commit's base is a conflict.
//!    Else `UpdateTable` with what the table had kept (description, owner, storage
//!    descriptor, partition keys, parameters others set), `metadata_location` the new one and
//!    `previous_metadata_location` the old, under the `VersionId` it was read with: Glue
//!    refuses it when the table changed since (`ConcurrentModificationException`: a
//!    conflict), so two writers never both move it from one base. No table version is
//!    archived per commit (`SkipArchive`, as pyiceberg's default: a stream commits every
//!    minute, and Glue keeps a bounded number of versions per table).
//! 4. **`check`** reads the catalog (`GetDatabases`, one): the credentials, the endpoint and
//!    the permission to read it. Whether the role may create and update tables shows at a
//!    run's first commit: Glue has no dry run.
//! 5. **Columns.** The table's storage descriptor lists the current schema's columns, as
//!    pyiceberg's and Iceberg's own Glue catalogs write them: each field's name, its Hive type
//!    ([`hive_type`]: `long` is `bigint`, a timestamp `timestamp`, a decimal
//!    `decimal(p,s)`, nested types spelled out) and parameters `iceberg.field.id`,
//!    `iceberg.field.optional` and `iceberg.field.current`. Engines read an Iceberg table's
//!    schema from its metadata; the Glue console, Lake Formation's column permissions and
//!    crawlers read these. A commit rewrites them from the schema it commits (a typed column
//!    added shows at once), keeping the rest of the storage descriptor.

use aws_sdk_glue::Client;
use aws_sdk_glue::error::SdkError;
use aws_sdk_glue::types::{Column, DatabaseInput, StorageDescriptor, Table, TableInput};
use ddbpipe_source::aws::{SdkSettings, api_error, sdk_config_at};
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_source::retry::RetryPolicy;
use std::collections::HashMap;

use iceberg::spec::{PrimitiveType, Schema, Type};

use super::{AWS_UNREACHED, Requests};
use crate::failure::Failure;

/// The Glue table parameters an Iceberg table is read by (rule 1).
const TABLE_TYPE: &str = "table_type";
const ICEBERG: &str = "ICEBERG";
const METADATA_LOCATION: &str = "metadata_location";
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// The name the Glue Data Catalog keeps a database or table name under: in lowercase, as Glue
/// folds it "for Hive compatibility" when it stores it (rule 1). The sink names its namespace
/// and table so, and its directory in the warehouse, so that every message, path and lookup
/// is the name the catalog holds.
pub fn glue_name(name: &str) -> String {
    name.to_lowercase()
}

/// The Glue Data Catalog of an account, through the run's AWS configuration.
#[derive(Clone)]
pub struct GlueCatalog {
    client: Client,
    /// `catalog_id`: another account's catalog; `None`, the caller's.
    catalog_id: Option<String>,
    /// The endpoint when not AWS's, masked, for messages.
    endpoint: Option<String>,
    /// How its requests are made (the catalogs' rule 4).
    requests: Requests,
}

impl std::fmt::Debug for GlueCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlueCatalog({})", self.describe())
    }
}

impl GlueCatalog {
    /// The catalog of `catalog_id` (the caller's account when `None`) with the credentials of
    /// `config`, in `region` and at `endpoint` when given, its requests retried within
    /// `retry`.
    pub fn new(
        config: &SdkSettings,
        region: Option<&str>,
        endpoint: Option<&EndpointUrl>,
        catalog_id: Option<String>,
        retry: RetryPolicy,
    ) -> GlueCatalog {
        let client = Client::new(&sdk_config_at(config, region, endpoint));
        GlueCatalog::of(client, catalog_id, endpoint.map(ToString::to_string), retry)
    }

    /// The catalog `client` reaches (`endpoint`, masked, for messages).
    fn of(
        client: Client,
        catalog_id: Option<String>,
        endpoint: Option<String>,
        retry: RetryPolicy,
    ) -> GlueCatalog {
        GlueCatalog {
            client,
            catalog_id,
            endpoint,
            requests: Requests::new(retry, AWS_UNREACHED),
        }
    }

    /// The catalog for messages.
    pub fn describe(&self) -> String {
        let region = self.client.config().region().map(|r| r.as_ref());
        GlueCatalog::describe_with(self.catalog_id.as_deref(), region, self.endpoint.as_deref())
    }

    /// The catalog of `catalog_id` in `region` at `endpoint` (masked) for messages, before its
    /// client is made (the run's region unknown: `None`).
    pub fn describe_with(
        catalog_id: Option<&str>,
        region: Option<&str>,
        endpoint: Option<&str>,
    ) -> String {
        let account = match catalog_id {
            Some(id) => format!("account {id}"),
            None => "the caller's account".into(),
        };
        let region = region.unwrap_or("the run's region");
        match endpoint {
            Some(endpoint) => format!("Glue Data Catalog of {account} in {region} at {endpoint}"),
            None => format!("Glue Data Catalog of {account} in {region}"),
        }
    }

    /// Rule 4.
    pub async fn writable(&self) -> Result<(), String> {
        let listed = self.requests.call(
            self.describe(),
            "get_databases",
            "list the databases",
            |_| async {
                let listed = (self.client.get_databases())
                    .set_catalog_id(self.catalog_id.clone())
                    .max_results(1)
                    .send()
                    .await;
                listed.map(|_| ()).map_err(api_error)
            },
        );
        listed.await.map_err(|failure| failure.message)
    }

    /// The Glue table `namespace.table`; `None` when there is none (or no such database).
    async fn table(&self, namespace: &str, table: &str) -> Result<Option<Table>, Failure> {
        let what = format!("read table {namespace}.{table}");
        self.requests
            .call(self.describe(), "get_table", &what, |_| async {
                let got = (self.client.get_table())
                    .set_catalog_id(self.catalog_id.clone())
                    .database_name(namespace)
                    .name(table)
                    .send()
                    .await;
                match got {
                    Ok(answer) => Ok(answer.table),
                    Err(SdkError::ServiceError(error))
                        if error.err().is_entity_not_found_exception() =>
                    {
                        Ok(None)
                    }
                    Err(error) => Err(api_error(error)),
                }
            })
            .await
    }

    /// Rule 1: the metadata location of Glue table `found`, an Iceberg table's; definite
    /// when it is none.
    fn metadata_location(&self, namespace: &str, found: &Table) -> Result<String, Failure> {
        let parameters = found.parameters.as_ref();
        let kind = parameters.and_then(|p| p.get(TABLE_TYPE));
        let name = || {
            let described = self.describe();
            format!("Glue table {namespace}.{} in the {described}", found.name)
        };
        if !kind.is_some_and(|kind| kind.eq_ignore_ascii_case(ICEBERG)) {
            let kind = kind.map_or_else(|| "unset".to_string(), |kind| format!("'{kind}'"));
            return Err(Failure::definite(format!(
                "{} is not an Iceberg table (its table_type is {kind}): give sink.table or \
                 sink.namespace another name",
                name()
            )));
        }
        (parameters.and_then(|p| p.get(METADATA_LOCATION)).cloned()).ok_or_else(|| {
            Failure::definite(format!(
                "{} is an Iceberg table without a metadata_location parameter: repair it \
                 (pyiceberg's register_table), or give sink.table another name",
                name()
            ))
        })
    }

    /// The current metadata location of `namespace.table`; `None` when there is no such
    /// table.
    pub(crate) async fn location(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<String>, Failure> {
        match self.table(namespace, table).await? {
            Some(found) => self.metadata_location(namespace, &found).map(Some),
            None => Ok(None),
        }
    }

    /// Rule 2; `false` when another writer recorded the table first.
    pub(crate) async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
        schema: &Schema,
    ) -> Result<bool, Failure> {
        let database = DatabaseInput::builder()
            .name(namespace)
            .build()
            .map_err(|e| Failure::definite(format!("internal error: {e}")))?;
        let what = format!("create database {namespace}");
        self.requests
            .call(self.describe(), "create_database", &what, |_| async {
                let made = (self.client.create_database())
                    .set_catalog_id(self.catalog_id.clone())
                    .database_input(database.clone())
                    .send()
                    .await;
                match made {
                    Err(SdkError::ServiceError(error))
                        if error.err().is_already_exists_exception() =>
                    {
                        Ok(())
                    }
                    made => made.map(|_| ()).map_err(api_error),
                }
            })
            .await?;
        let location =
            (metadata_location.rsplit_once("/metadata/")).map_or(metadata_location, |(dir, _)| dir);
        let input = TableInput::builder()
            .name(table)
            .table_type("EXTERNAL_TABLE")
            .parameters(TABLE_TYPE, ICEBERG)
            .parameters(METADATA_LOCATION, metadata_location)
            .storage_descriptor(
                StorageDescriptor::builder()
                    .location(location)
                    .set_columns(Some(columns(schema)?))
                    .build(),
            )
            .build()
            .map_err(|e| Failure::definite(format!("internal error: {e}")))?;
        let what = format!("create table {namespace}.{table}");
        self.requests
            .call(self.describe(), "create_table", &what, |_| async {
                let made = (self.client.create_table())
                    .set_catalog_id(self.catalog_id.clone())
                    .database_name(namespace)
                    .table_input(input.clone())
                    .send()
                    .await;
                match made {
                    Ok(_) => Ok(true),
                    Err(SdkError::ServiceError(error))
                        if error.err().is_already_exists_exception() =>
                    {
                        Ok(false)
                    }
                    Err(error) => Err(api_error(error)),
                }
            })
            .await
    }

    /// Rule 3: moves `namespace.table` from metadata `old` to `new`; `false` on a conflict.
    pub(crate) async fn swap(
        &self,
        namespace: &str,
        table: &str,
        old: &str,
        new: &str,
        schema: &Schema,
    ) -> Result<bool, Failure> {
        let Some(found) = self.table(namespace, table).await? else {
            return Ok(false);
        };
        if self.metadata_location(namespace, &found)? != old {
            return Ok(false);
        }
        let version = found.version_id.clone();
        let input = kept(found, old, new, schema)?;
        let what = format!("commit to table {namespace}.{table}");
        self.requests
            .call(self.describe(), "update_table", &what, |_| async {
                let updated = (self.client.update_table())
                    .set_catalog_id(self.catalog_id.clone())
                    .database_name(namespace)
                    .table_input(input.clone())
                    .set_version_id(version.clone())
                    .skip_archive(true)
                    .send()
                    .await;
                match updated {
                    Ok(_) => Ok(true),
                    // A retry after a lost answer meets its own change here too (rule 5 of the
                    // catalogs reads it back).
                    Err(SdkError::ServiceError(error))
                        if error.err().is_concurrent_modification_exception()
                            || error.err().is_entity_not_found_exception() =>
                    {
                        Ok(false)
                    }
                    Err(error) => Err(api_error(error)),
                }
            })
            .await
    }
}

/// Rule 3: the input that keeps what Glue table `found` had, moved from metadata `old` to
/// `new`, its columns `schema`'s (rule 5).
fn kept(found: Table, old: &str, new: &str, schema: &Schema) -> Result<TableInput, Failure> {
    let mut parameters: HashMap<String, String> = found.parameters.unwrap_or_default();
    parameters.insert(METADATA_LOCATION.into(), new.into());
    parameters.insert(PREVIOUS_METADATA_LOCATION.into(), old.into());
    let mut storage = found
        .storage_descriptor
        .unwrap_or_else(|| StorageDescriptor::builder().build());
    storage.columns = Some(columns(schema)?);
    TableInput::builder()
        .name(found.name)
        .set_description(found.description)
        .set_owner(found.owner)
        .set_last_access_time(found.last_access_time)
        .set_last_analyzed_time(found.last_analyzed_time)
        .retention(found.retention)
        .storage_descriptor(storage)
        .set_partition_keys(found.partition_keys)
        .set_table_type(found.table_type)
        .set_parameters(Some(parameters))
        .set_target_table(found.target_table)
        .build()
        .map_err(|e| Failure::definite(format!("internal error: {e}")))
}

/// Rule 5: the Glue columns of `schema`.
fn columns(schema: &Schema) -> Result<Vec<Column>, Failure> {
    (schema.as_struct().fields().iter())
        .map(|field| {
            Column::builder()
                .name(&field.name)
                .r#type(hive_type(&field.field_type))
                .set_comment(field.doc.clone())
                .parameters("iceberg.field.id", field.id.to_string())
                .parameters("iceberg.field.optional", (!field.required).to_string())
                .parameters("iceberg.field.current", "true")
                .build()
                .map_err(|e| Failure::definite(format!("internal error: {e}")))
        })
        .collect()
}

/// The Hive type Glue lists for an Iceberg type (rule 5), as Iceberg's and pyiceberg's Glue
/// catalogs spell it.
pub(crate) fn hive_type(field_type: &Type) -> String {
    match field_type {
        Type::Primitive(primitive) => match primitive {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => "timestamp".into(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(fields) => {
            let fields: Vec<String> = (fields.fields().iter())
                .map(|field| format!("{}:{}", field.name, hive_type(&field.field_type)))
                .collect();
            format!("struct<{}>", fields.join(","))
        }
        Type::List(list) => format!("array<{}>", hive_type(&list.element_field.field_type)),
        Type::Map(map) => format!(
            "map<{},{}>",
            hive_type(&map.key_field.field_type),
            hive_type(&map.value_field.field_type)
        ),
    }
}

#[cfg(test)]
mod tests;
