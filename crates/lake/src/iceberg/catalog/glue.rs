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

use std::collections::HashMap;

use aws_sdk_glue::Client;
use aws_sdk_glue::error::SdkError;
use aws_sdk_glue::types::{Column, DatabaseInput, StorageDescriptor, Table, TableInput};
use ddbpipe_source::aws::{SdkSettings, api_error, sdk_config_at};
use ddbpipe_source::endpoint::EndpointUrl;

use iceberg::spec::{PrimitiveType, Schema, Type};

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
}

impl std::fmt::Debug for GlueCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlueCatalog({})", self.describe())
    }
}

impl GlueCatalog {
    /// The catalog of `catalog_id` (the caller's account when `None`) with the credentials of
    /// `config`, in `region` and at `endpoint` when given.
    pub fn new(
        config: &SdkSettings,
        region: Option<&str>,
        endpoint: Option<&EndpointUrl>,
        catalog_id: Option<String>,
    ) -> GlueCatalog {
        let client = Client::new(&sdk_config_at(config, region, endpoint));
        GlueCatalog::of(client, catalog_id, endpoint.map(ToString::to_string))
    }

    /// The catalog `client` reaches (`endpoint`, masked, for messages).
    fn of(client: Client, catalog_id: Option<String>, endpoint: Option<String>) -> GlueCatalog {
        GlueCatalog {
            client,
            catalog_id,
            endpoint,
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

    /// A call that failed: its code and message; when no connection was made, what to check.
    fn failed<E, R>(&self, what: &str, error: SdkError<E, R>) -> Failure
    where
        E: aws_sdk_glue::error::ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug + 'static,
    {
        super::aws_failure(&self.describe(), what, api_error(error))
    }

    /// Rule 4.
    pub async fn writable(&self) -> Result<(), String> {
        (self.client.get_databases())
            .set_catalog_id(self.catalog_id.clone())
            .max_results(1)
            .send()
            .await
            .map(|_| ())
            .map_err(|error| self.failed("list the databases", error).message)
    }

    /// The Glue table `namespace.table`; `None` when there is none (or no such database).
    async fn table(&self, namespace: &str, table: &str) -> Result<Option<Table>, Failure> {
        let got = (self.client.get_table())
            .set_catalog_id(self.catalog_id.clone())
            .database_name(namespace)
            .name(table)
            .send()
            .await;
        match got {
            Ok(answer) => Ok(answer.table),
            Err(SdkError::ServiceError(error)) if error.err().is_entity_not_found_exception() => {
                Ok(None)
            }
            Err(error) => Err(self.failed(&format!("read table {namespace}.{table}"), error)),
        }
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
        let made = (self.client.create_database())
            .set_catalog_id(self.catalog_id.clone())
            .database_input(database)
            .send()
            .await;
        match made {
            Ok(_) => {}
            Err(SdkError::ServiceError(error)) if error.err().is_already_exists_exception() => {}
            Err(error) => return Err(self.failed(&format!("create database {namespace}"), error)),
        }
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
        let made = (self.client.create_table())
            .set_catalog_id(self.catalog_id.clone())
            .database_name(namespace)
            .table_input(input)
            .send()
            .await;
        match made {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(error)) if error.err().is_already_exists_exception() => {
                Ok(false)
            }
            Err(error) => Err(self.failed(&format!("create table {namespace}.{table}"), error)),
        }
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
        let updated = (self.client.update_table())
            .set_catalog_id(self.catalog_id.clone())
            .database_name(namespace)
            .table_input(input)
            .set_version_id(version)
            .skip_archive(true)
            .send()
            .await;
        match updated {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(error))
                if error.err().is_concurrent_modification_exception()
                    || error.err().is_entity_not_found_exception() =>
            {
                Ok(false)
            }
            Err(error) => Err(self.failed(&format!("commit to table {namespace}.{table}"), error)),
        }
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use aws_sdk_glue::config::{Credentials, Region};
    use aws_smithy_runtime_api::client::http::{
        HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
    };
    use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;

    use super::*;

    const OLD: &str = "s3://w/dynamodb.db/orders/metadata/00001-a.metadata.json";
    const NEW: &str = "s3://w/dynamodb.db/orders/metadata/00002-b.metadata.json";

    /// Glue's answers, in turn (a status and a JSON body, an error's `__type` its code), and
    /// the bodies of the requests they answered.
    #[derive(Debug, Clone, Default)]
    struct Scripted {
        answers: Arc<Mutex<VecDeque<(u16, String)>>>,
        sent: Arc<Mutex<Vec<serde_json::Value>>>,
    }

    impl HttpConnector for Scripted {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            let body = request.body().bytes().unwrap_or_default();
            let sent = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
            self.sent.lock().unwrap().push(sent);
            let (status, body) = (self.answers.lock().unwrap().pop_front()).expect("an answer");
            let mut response =
                Response::new(StatusCode::try_from(status).unwrap(), SdkBody::from(body));
            (response.headers_mut()).insert("content-type", "application/x-amz-json-1.1");
            HttpConnectorFuture::ready(Ok(response))
        }
    }

    impl Scripted {
        fn answering(answers: &[(u16, &str)]) -> Scripted {
            let scripted = Scripted::default();
            let queued = answers.iter().map(|(s, b)| (*s, b.to_string()));
            scripted.answers.lock().unwrap().extend(queued);
            scripted
        }

        /// A catalog whose requests this answers.
        fn catalog(&self) -> GlueCatalog {
            let connector = SharedHttpConnector::new(self.clone());
            let config = aws_sdk_glue::Config::builder()
                .behavior_version_latest()
                .region(Region::new("us-east-1"))
                .credentials_provider(Credentials::new("a", "b", None, None, "test"))
                .http_client(http_client_fn(move |_, _| connector.clone()))
                .build();
            GlueCatalog::of(Client::from_conf(config), None, None)
        }

        /// The `n`th request's JSON body.
        fn sent(&self, n: usize) -> serde_json::Value {
            self.sent.lock().unwrap()[n].clone()
        }
    }

    /// A table's schema: a key, a typed decimal and list, a document, an event time.
    fn schema() -> Schema {
        use iceberg::spec::{ListType, NestedField};
        let list = ListType::new(
            NestedField::list_element(6, Type::from(PrimitiveType::Long), false).into(),
        );
        Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "pk", Type::from(PrimitiveType::String)).into(),
                NestedField::optional(
                    2,
                    "price",
                    Type::from(PrimitiveType::Decimal {
                        precision: 38,
                        scale: 4,
                    }),
                )
                .into(),
                NestedField::optional(3, "tags", Type::List(list)).into(),
                NestedField::optional(4, "document", Type::from(PrimitiveType::String)).into(),
                NestedField::optional(5, "event_time", Type::from(PrimitiveType::Timestamptz))
                    .into(),
            ])
            .build()
            .unwrap()
    }

    /// Rule 5: the columns Glue lists are the schema's, in order, with their Hive types and
    /// Iceberg's field parameters.
    #[test]
    fn the_glue_columns_are_the_schemas_with_hive_types() {
        let columns = columns(&schema()).unwrap();
        let listed: Vec<(&str, &str)> = columns
            .iter()
            .map(|c| (c.name(), c.r#type().unwrap()))
            .collect();
        assert_eq!(
            listed,
            [
                ("pk", "string"),
                ("price", "decimal(38,4)"),
                ("tags", "array<bigint>"),
                ("document", "string"),
                ("event_time", "timestamp"),
            ]
        );
        let pk = columns[0].parameters().unwrap();
        assert_eq!(pk["iceberg.field.id"], "1");
        assert_eq!(pk["iceberg.field.optional"], "false");
        assert_eq!(pk["iceberg.field.current"], "true");
        assert_eq!(
            columns[1].parameters().unwrap()["iceberg.field.optional"],
            "true"
        );
    }

    /// `GetTable`'s answer: an Iceberg table at `OLD`, version 7.
    fn iceberg_table() -> (u16, String) {
        let body = format!(
            r#"{{"Table": {{"Name": "orders", "DatabaseName": "dynamodb",
            "TableType": "EXTERNAL_TABLE", "VersionId": "7", "Owner": "data-team",
            "Parameters": {{"table_type": "iceberg", "metadata_location": "{OLD}"}}}}}}"#
        );
        (200, body)
    }

    /// Rule 3: a commit is `UpdateTable` under the `VersionId` the table was read with,
    /// archiving nothing, moving the locations and keeping the owner; Glue's refusal of it
    /// (`ConcurrentModificationException`: the table changed since) is a conflict, `false`,
    /// not a failure. (moto does not check `VersionId`: Glue's answer is scripted.)
    #[tokio::test]
    async fn a_commit_goes_under_the_version_read_and_a_refused_one_is_a_conflict() {
        let (status, table) = iceberg_table();
        let refused = r#"{"__type": "ConcurrentModificationException", "Message": "changed"}"#;
        let glue = Scripted::answering(&[(status, &table), (400, refused)]);
        let swapped = glue
            .catalog()
            .swap("dynamodb", "orders", OLD, NEW, &schema())
            .await;
        assert!(!swapped.unwrap(), "a conflict");
        let update = glue.sent(1);
        assert_eq!(update["VersionId"], "7", "{update}");
        assert_eq!(update["SkipArchive"], true, "{update}");
        let input = &update["TableInput"];
        assert_eq!(input["Parameters"]["metadata_location"], NEW, "{update}");
        assert_eq!(input["Parameters"]["previous_metadata_location"], OLD);
        assert_eq!(input["Parameters"]["table_type"], "iceberg");
        assert_eq!(input["Owner"], "data-team");

        // Accepted, it is a commit.
        let glue = Scripted::answering(&[(status, &table), (200, "{}")]);
        let swapped = glue
            .catalog()
            .swap("dynamodb", "orders", OLD, NEW, &schema())
            .await;
        assert!(swapped.unwrap(), "committed");
    }

    /// Rule 3: a table whose location moved since the commit's base is a conflict at once:
    /// nothing is updated.
    #[tokio::test]
    async fn a_commit_on_a_moved_table_updates_nothing() {
        let (status, table) = iceberg_table();
        let glue = Scripted::answering(&[(status, &table)]);
        let other = "s3://w/dynamodb.db/orders/metadata/00000-z.metadata.json";
        let swapped = glue
            .catalog()
            .swap("dynamodb", "orders", other, NEW, &schema())
            .await;
        assert!(!swapped.unwrap());
        assert_eq!(glue.sent.lock().unwrap().len(), 1, "GetTable only");
    }

    /// A catalog that cannot be reached fails `check`'s probe naming the endpoint, its
    /// password masked, and what to check; the description masks it too.
    #[tokio::test]
    async fn an_unreachable_catalog_is_named_without_its_password() {
        let settings = ddbpipe_source::aws::ClientSettings {
            region: Some("us-east-1".into()),
            endpoint_url: None,
            credentials: ddbpipe_source::config::Credentials::AccessKey {
                access_key_id: "a".into(),
                secret_access_key: ddbpipe_source::config::Secret::new("b"),
                session_token: None,
            },
        };
        let sdk = ddbpipe_source::aws::load_sdk_config(&settings).await;
        let endpoint = EndpointUrl::new("http://app:Wq7xK9zT@127.0.0.1:1").unwrap();
        let catalog = GlueCatalog::new(&sdk, None, Some(&endpoint), None);
        assert!(
            !catalog.describe().contains("Wq7xK9zT"),
            "{}",
            catalog.describe()
        );
        let refused = catalog.writable().await.unwrap_err();
        assert!(
            refused.contains("127.0.0.1:1")
                && refused.contains("check sink.catalog.region and sink.catalog.endpoint_url")
                && !refused.contains("Wq7xK9zT"),
            "{refused}"
        );
    }

    /// Rule 1: a Glue table that is not an Iceberg table is refused (definite), naming it.
    #[tokio::test]
    async fn a_table_not_icebergs_is_refused_naming_it() {
        let plain = r#"{"Table": {"Name": "orders", "Parameters": {"classification": "parquet"}}}"#;
        let glue = Scripted::answering(&[(200, plain)]);
        let failure = glue
            .catalog()
            .location("dynamodb", "orders")
            .await
            .unwrap_err();
        assert_eq!(
            failure.class,
            ddbpipe_pipeline::sink::SinkErrorClass::Definite
        );
        assert!(
            failure.message.contains("Glue table dynamodb.orders")
                && failure
                    .message
                    .contains("not an Iceberg table (its table_type is unset)"),
            "{}",
            failure.message
        );
    }

    /// Rule 3: a commit keeps what others set on the table (its owner, description, storage
    /// descriptor, their parameters) and moves only the two locations, and the columns to the
    /// schema it commits (rule 5).
    #[test]
    fn a_commit_keeps_what_the_table_had_and_moves_the_locations() {
        let found = Table::builder()
            .name("orders")
            .owner("data-team")
            .description("orders from DynamoDB")
            .table_type("EXTERNAL_TABLE")
            .parameters(TABLE_TYPE, ICEBERG)
            .parameters(METADATA_LOCATION, "s3://w/t/metadata/00001-a.metadata.json")
            .parameters("lakeformation.owner", "someone")
            .storage_descriptor(StorageDescriptor::builder().location("s3://w/t").build())
            .version_id("7")
            .build()
            .unwrap();
        let input = kept(
            found,
            "s3://w/t/metadata/00001-a.metadata.json",
            "s3://w/t/metadata/00002-b.metadata.json",
            &schema(),
        )
        .unwrap();
        assert_eq!(input.name, "orders");
        assert_eq!(input.owner.as_deref(), Some("data-team"));
        assert_eq!(input.description.as_deref(), Some("orders from DynamoDB"));
        assert_eq!(input.table_type.as_deref(), Some("EXTERNAL_TABLE"));
        let storage = input.storage_descriptor.unwrap();
        assert_eq!(storage.location.as_deref(), Some("s3://w/t"));
        let columns: Vec<&str> = storage.columns().iter().map(|c| c.name()).collect();
        assert_eq!(columns, ["pk", "price", "tags", "document", "event_time"]);
        let parameters = input.parameters.unwrap();
        assert_eq!(parameters[TABLE_TYPE], ICEBERG);
        assert_eq!(parameters["lakeformation.owner"], "someone");
        assert_eq!(
            parameters[METADATA_LOCATION],
            "s3://w/t/metadata/00002-b.metadata.json"
        );
        assert_eq!(
            parameters[PREVIOUS_METADATA_LOCATION],
            "s3://w/t/metadata/00001-a.metadata.json"
        );
    }
}
