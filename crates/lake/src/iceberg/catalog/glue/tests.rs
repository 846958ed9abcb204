//! The tests of the Glue catalog: its columns, and Glue answered in process (scripted answers).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use aws_sdk_glue::config::{Credentials, Region};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_types::body::SdkBody;

use super::super::Catalog;
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
        let retry = RetryPolicy {
            initial_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(5),
            ..RetryPolicy::default()
        };
        GlueCatalog::of(Client::from_conf(config), None, None, retry)
    }

    /// The `n`th request's JSON body.
    fn sent(&self, n: usize) -> serde_json::Value {
        self.sent.lock().unwrap()[n].clone()
    }
}

/// A table's schema: a key, a typed decimal and list, a document, an event time.
fn schema() -> Schema {
    use iceberg::spec::{ListType, NestedField};
    let list =
        ListType::new(NestedField::list_element(6, Type::from(PrimitiveType::Long), false).into());
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
            NestedField::optional(5, "event_time", Type::from(PrimitiveType::Timestamptz)).into(),
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

/// The catalogs' rule 4: a throttle and Glue's 5xx are asked again, each request within
/// the budget; a refusal no retry mends is asked once.
#[tokio::test]
async fn a_throttled_or_failing_glue_is_asked_again() {
    let (status, table) = iceberg_table();
    let throttled = r#"{"__type": "ThrottlingException", "Message": "Rate exceeded"}"#;
    let failed = r#"{"__type": "InternalServiceException", "Message": "try again"}"#;
    let glue = Scripted::answering(&[
        (400, throttled),
        (500, failed),
        (status, &table),
        (500, failed),
        (200, "{}"),
    ]);
    let swapped = glue
        .catalog()
        .swap("dynamodb", "orders", OLD, NEW, &schema())
        .await;
    assert!(swapped.unwrap(), "committed");
    assert_eq!(glue.sent.lock().unwrap().len(), 5);

    let denied = r#"{"__type": "AccessDeniedException", "Message": "no"}"#;
    let glue = Scripted::answering(&[(400, denied)]);
    let read = glue.catalog().location("dynamodb", "orders").await;
    let failure = read.unwrap_err().message;
    assert!(failure.contains("AccessDeniedException: no"), "{failure}");
    assert!(!failure.contains("attempts"), "asked once: {failure}");
    assert_eq!(glue.sent.lock().unwrap().len(), 1);
}

/// The catalogs' rule 5: a commit whose answer was lost (a 5xx after Glue made the
/// change) meets its own change when asked again (`ConcurrentModificationException`):
/// the table read back holds its metadata location, so it is a commit, not a conflict
/// (which would build the commit again and add its files twice).
#[tokio::test]
async fn a_commit_whose_retry_meets_its_own_change_is_a_commit() {
    let (status, table) = iceberg_table();
    let failed = r#"{"__type": "InternalServiceException", "Message": "try again"}"#;
    let refused = r#"{"__type": "ConcurrentModificationException", "Message": "changed"}"#;
    let moved = table.replace(OLD, NEW);
    let glue = Scripted::answering(&[
        (status, &table),
        (500, failed),
        (400, refused),
        (status, &moved),
    ]);
    let catalog = Catalog::Glue(glue.catalog());
    let swapped = catalog
        .swap("dynamodb", "orders", OLD, NEW, &schema())
        .await;
    assert!(swapped.unwrap(), "its own commit");

    // Another writer's change is a conflict still.
    let other = table.replace(
        OLD,
        "s3://w/dynamodb.db/orders/metadata/00002-c.metadata.json",
    );
    let glue = Scripted::answering(&[(status, &table), (400, refused), (status, &other)]);
    let catalog = Catalog::Glue(glue.catalog());
    let swapped = catalog
        .swap("dynamodb", "orders", OLD, NEW, &schema())
        .await;
    assert!(!swapped.unwrap(), "a conflict");
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
    let catalog = GlueCatalog::new(&sdk, None, Some(&endpoint), None, RetryPolicy::default());
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
