//! An Amazon S3 table bucket as the Iceberg sink's catalog (docs/sinks.md §7.11, `catalog`
//! rules): the tables Athena, EMR, Redshift, Spark and pyiceberg reach through S3 Tables.
//!
//! # Rules
//! 1. A namespace is a namespace of the table bucket `table_bucket_arn`, a table one of its
//!    Iceberg tables of the same name. S3 Tables takes names of 1 to 255 lowercase letters,
//!    digits and underscores that begin and end with a letter or digit
//!    ([`s3tables_name_problem`]; a namespace not beginning with `aws`). The table's location
//!    is the service's: its `warehouseLocation` (storage of its own), known once the table
//!    exists; the table's files are written there ([`S3TablesCatalog::warehouse`]).
//! 2. **Place** ([`S3TablesCatalog::place`]): the namespace and the table are created when
//!    missing (`ConflictException`: another writer made them), then the table's warehouse
//!    location is read. A table made so has no metadata yet: [`S3TablesCatalog::location`]
//!    says `None` until a first commit records one.
//! 3. **Create**: `UpdateTableMetadataLocation` under the version token read with a table
//!    that has no metadata yet; a table with metadata, or a refused token
//!    (`ConflictException`), is another writer's: `false`.
//! 4. **Swap**: `GetTableMetadataLocation`; a location other than the commit's base is a
//!    conflict. Else `UpdateTableMetadataLocation` under the version token read with it:
//!    S3 Tables refuses a token another commit has moved past (`ConflictException`), so two
//!    writers never both move the table from one base.
//! 5. **`check`** reads the table bucket (`GetTableBucket`), and finds a table without
//!    creating it ([`S3TablesCatalog::warehouse`]).

use aws_sdk_s3tables::Client;
use aws_sdk_s3tables::error::SdkError;
use aws_sdk_s3tables::types::OpenTableFormat;
use ddbpipe_source::aws::{SdkSettings, api_error, sdk_config_at};
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::retry::RetryPolicy;

use super::{AWS_UNREACHED, Requests};
use crate::failure::Failure;

/// The tables of one S3 table bucket, through the run's AWS configuration.
#[derive(Clone)]
pub struct S3TablesCatalog {
    client: Client,
    table_bucket_arn: String,
    /// The endpoint when not AWS's, masked, for messages.
    endpoint: Option<String>,
    /// How its requests are made (the catalogs' rule 4).
    requests: Requests,
}

impl std::fmt::Debug for S3TablesCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3TablesCatalog({})", self.describe())
    }
}

/// A table's metadata location as the service holds it, with the token a change of it must
/// name (rules 3 and 4) and where its files are (rule 1).
struct Held {
    metadata_location: Option<String>,
    version_token: String,
    warehouse: String,
}

/// The name S3 Tables keeps a namespace or table `name` under: in lowercase, a hyphen an
/// underscore (DynamoDB's `Orders-2026` is `orders_2026`): S3 Tables takes neither capitals
/// nor hyphens (rule 1), and the sink names its table so in every lookup and message.
pub fn s3tables_name(name: &str) -> String {
    name.to_lowercase().replace('-', "_")
}

/// The region of the table bucket `arn` (`arn:aws:s3tables:<region>:<account>:bucket/<name>`);
/// what is wrong with it when it is not a table bucket's ARN.
pub fn table_bucket_region(arn: &str) -> Result<&str, String> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", partition, "s3tables", region, account, resource]
            if !partition.is_empty()
                && !region.is_empty()
                && !account.is_empty()
                && resource
                    .strip_prefix("bucket/")
                    .is_some_and(|name| !name.is_empty() && !name.contains('/')) =>
        {
            Ok(region)
        }
        _ => Err(format!(
            "'{arn}' is not a table bucket's ARN: give \
             arn:aws:s3tables:<region>:<account>:bucket/<name> (aws s3tables list-table-buckets \
             lists them)"
        )),
    }
}

/// What S3 Tables refuses in `name`, a namespace's (`namespace`) or a table's (rule 1);
/// `None`: a name it takes.
pub fn s3tables_name_problem(name: &str, namespace: bool) -> Option<String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let what = if namespace { "namespace" } else { "table" };
    if name.is_empty() || name.len() > 255 || !name.chars().all(allowed) {
        Some(format!(
            "'{name}' is not an S3 Tables {what} name: it takes 1 to 255 lowercase letters, \
             digits and underscores"
        ))
    } else if !edge(name.chars().next()) || !edge(name.chars().last()) {
        Some(format!(
            "'{name}' is not an S3 Tables {what} name: it begins and ends with a letter or digit"
        ))
    } else if namespace && name.starts_with("aws") {
        Some(format!(
            "'{name}' is not an S3 Tables namespace: names beginning with 'aws' are AWS's"
        ))
    } else {
        None
    }
}

impl S3TablesCatalog {
    /// The catalog of `table_bucket_arn` with the credentials of `config`, in `region` and at
    /// `endpoint` when given, its requests retried within `retry`.
    pub fn new(
        config: &SdkSettings,
        table_bucket_arn: String,
        region: Option<&str>,
        endpoint: Option<&EndpointUrl>,
        retry: RetryPolicy,
    ) -> S3TablesCatalog {
        S3TablesCatalog {
            client: Client::new(&sdk_config_at(config, region, endpoint)),
            table_bucket_arn,
            endpoint: endpoint.map(ToString::to_string),
            requests: Requests::new(retry, AWS_UNREACHED),
        }
    }

    /// The catalog for messages.
    pub fn describe(&self) -> String {
        S3TablesCatalog::describe_with(&self.table_bucket_arn, self.endpoint.as_deref())
    }

    /// The table bucket `arn` at `endpoint` (masked) for messages, before its client is made.
    pub fn describe_with(arn: &str, endpoint: Option<&str>) -> String {
        match endpoint {
            Some(endpoint) => format!("S3 table bucket {arn} at {endpoint}"),
            None => format!("S3 table bucket {arn}"),
        }
    }

    /// Rule 5.
    pub async fn writable(&self) -> Result<(), String> {
        let read = self.requests.call(
            self.describe(),
            "get_table_bucket",
            "read the table bucket",
            |_| async {
                let read = (self.client.get_table_bucket())
                    .table_bucket_arn(&self.table_bucket_arn)
                    .send()
                    .await;
                read.map(|_| ()).map_err(api_error)
            },
        );
        read.await.map_err(|failure| failure.message)
    }

    /// What the service holds of `namespace.table`; `None` when there is no such table.
    async fn held(&self, namespace: &str, table: &str) -> Result<Option<Held>, Failure> {
        let what = format!("read table {namespace}.{table}");
        self.requests
            .call(
                self.describe(),
                "get_table_metadata_location",
                &what,
                |_| async {
                    let read = (self.client.get_table_metadata_location())
                        .table_bucket_arn(&self.table_bucket_arn)
                        .namespace(namespace)
                        .name(table)
                        .send()
                        .await;
                    match read {
                        Ok(found) => Ok(Some(Held {
                            metadata_location: found.metadata_location().map(str::to_string),
                            version_token: found.version_token().to_string(),
                            warehouse: found.warehouse_location().to_string(),
                        })),
                        Err(SdkError::ServiceError(error))
                            if error.err().is_not_found_exception() =>
                        {
                            Ok(None)
                        }
                        Err(error) => Err(api_error(error)),
                    }
                },
            )
            .await
    }

    /// The current metadata location of `namespace.table`; `None` when there is no such
    /// table or it has no metadata yet (rule 2).
    pub(crate) async fn location(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<String>, Failure> {
        Ok(self
            .held(namespace, table)
            .await?
            .and_then(|held| held.metadata_location))
    }

    /// Rule 1: where the files of `namespace.table` are; `None` when there is no such table
    /// (nothing is created).
    pub async fn warehouse(&self, namespace: &str, table: &str) -> Result<Option<String>, String> {
        match self.held(namespace, table).await {
            Ok(held) => Ok(held.map(|held| held.warehouse)),
            Err(failure) => Err(failure.message),
        }
    }

    /// Rule 2: the table's warehouse location, the namespace and table made when missing.
    /// Names the service refuses were refused with the pipeline file
    /// ([`s3tables_name_problem`]: the file's rules, and `discover`'s for the tables it finds).
    /// Its requests are retried as every other (the catalogs' rule 4): a throttled or briefly
    /// unavailable service at a run's start does not stop it.
    pub async fn place(&self, namespace: &str, table: &str) -> Result<String, String> {
        let what = format!("create namespace {namespace}");
        let made = self
            .requests
            .call(self.describe(), "create_namespace", &what, |_| async {
                let made = (self.client.create_namespace())
                    .table_bucket_arn(&self.table_bucket_arn)
                    .namespace(namespace)
                    .send()
                    .await;
                made_by_anyone(made)
            });
        made.await.map_err(|failure| failure.message)?;
        let what = format!("create table {namespace}.{table}");
        let made = self
            .requests
            .call(self.describe(), "create_table", &what, |_| async {
                let made = (self.client.create_table())
                    .table_bucket_arn(&self.table_bucket_arn)
                    .namespace(namespace)
                    .name(table)
                    .format(OpenTableFormat::Iceberg)
                    .send()
                    .await;
                made_by_anyone(made)
            });
        made.await.map_err(|failure| failure.message)?;
        match self.warehouse(namespace, table).await? {
            Some(warehouse) => Ok(warehouse),
            None => Err(format!(
                "table {namespace}.{table} was made in the {} and is gone: dropped since?",
                self.describe()
            )),
        }
    }

    /// Rule 3; `false` when another writer recorded the table's metadata first.
    pub(crate) async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
    ) -> Result<bool, Failure> {
        match self.held(namespace, table).await? {
            Some(held) if held.metadata_location.is_none() => {
                self.update(namespace, table, held.version_token, metadata_location)
                    .await
            }
            // Recorded by another writer (or dropped since it was placed).
            _ => Ok(false),
        }
    }

    /// Rule 4: moves `namespace.table` from metadata `old` to `new`; `false` on a conflict.
    pub(crate) async fn swap(
        &self,
        namespace: &str,
        table: &str,
        old: &str,
        new: &str,
    ) -> Result<bool, Failure> {
        match self.held(namespace, table).await? {
            Some(held) if held.metadata_location.as_deref() == Some(old) => {
                self.update(namespace, table, held.version_token, new).await
            }
            _ => Ok(false),
        }
    }

    /// `UpdateTableMetadataLocation` under `token`; `false` when the service refuses the token
    /// — also when an earlier attempt's change landed and its answer was lost: the catalogs'
    /// rule 5 reads the table back. An answer of success that does not read (moto's names the
    /// namespace as a string where the API has a list) is a success.
    async fn update(
        &self,
        namespace: &str,
        table: &str,
        token: String,
        location: &str,
    ) -> Result<bool, Failure> {
        let what = format!("commit to table {namespace}.{table}");
        self.requests
            .call(
                self.describe(),
                "update_table_metadata_location",
                &what,
                |_| async {
                    let updated = (self.client.update_table_metadata_location())
                        .table_bucket_arn(&self.table_bucket_arn)
                        .namespace(namespace)
                        .name(table)
                        .version_token(token.clone())
                        .metadata_location(location)
                        .send()
                        .await;
                    match updated {
                        Ok(_) => Ok(true),
                        Err(SdkError::ServiceError(error))
                            if error.err().is_conflict_exception()
                                || error.err().is_not_found_exception() =>
                        {
                            Ok(false)
                        }
                        Err(error) if answered_success(&error) => Ok(true),
                        Err(error) => Err(api_error(error)),
                    }
                },
            )
            .await
    }
}

/// Rule 2: a namespace or table made, or made by another writer first (`ConflictException`),
/// or the failure.
fn made_by_anyone<T, E, R>(made: Result<T, SdkError<E, R>>) -> Result<(), ApiError>
where
    E: aws_sdk_s3tables::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match made {
        Err(SdkError::ServiceError(error)) if error.err().code() == Some("ConflictException") => {
            Ok(())
        }
        Err(error) => Err(api_error(error)),
        Ok(_) => Ok(()),
    }
}

/// Whether a request failed only in reading an answer of success: what it asked was done.
fn answered_success<E>(error: &SdkError<E, aws_smithy_runtime_api::http::Response>) -> bool {
    // The SDK tells it as a service error without a code, or a response error.
    error
        .raw_response()
        .is_some_and(|raw| raw.status().is_success())
}

#[cfg(test)]
mod tests {
    use aws_credential_types::Credentials;
    use ddbpipe_testkit::moto::Moto;

    use super::*;

    fn settings() -> SdkSettings {
        SdkSettings::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(Credentials::new(
                    "testing", "testing", None, None, "test",
                )),
            )
            .build()
    }

    /// Rule 1: the names S3 Tables takes, and the ARN's region.
    #[test]
    fn names_and_arns() {
        assert_eq!(s3tables_name("Orders-2026"), "orders_2026");
        assert_eq!(s3tables_name_problem("orders_2026", false), None);
        for (name, namespace, says) in [
            ("", false, "1 to 255"),
            ("orders.v2", false, "1 to 255"),
            ("Orders", true, "1 to 255"),
            ("_orders", false, "begins and ends"),
            ("orders_", true, "begins and ends"),
            ("aws_data", true, "AWS's"),
        ] {
            let problem = s3tables_name_problem(name, namespace).expect(name);
            assert!(problem.contains(says), "{name}: {problem}");
        }
        assert_eq!(s3tables_name_problem("aws_data", false), None);
        assert!(s3tables_name_problem(&"a".repeat(256), false).is_some());
        let arn = "arn:aws:s3tables:eu-west-1:123456789012:bucket/lake";
        assert_eq!(table_bucket_region(arn), Ok("eu-west-1"));
        for arn in [
            "lake",
            "arn:aws:s3:::lake",
            "arn:aws:s3tables:eu-west-1:123456789012:bucket/",
            "arn:aws:s3tables::123456789012:bucket/lake",
            "arn:aws:s3tables:eu-west-1:123456789012:bucket/lake/table/t",
        ] {
            assert!(table_bucket_region(arn).is_err(), "{arn}");
        }
    }

    /// Rules 2–4 on moto's S3 Tables: a placed table has a warehouse of its own and no
    /// metadata; its first record is one writer's, a second is refused; a swap moves it only
    /// from the location it holds; the version token is the lock. moto's answer to
    /// `UpdateTableMetadataLocation` does not read (its `namespace` a string where the API has a
    /// list), so each update that succeeds here is settled as a lost answer is: by reading the
    /// table back.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_table_is_placed_recorded_once_and_moved_only_from_its_base() {
        let moto = Moto::start();
        let endpoint = EndpointUrl::new(moto.endpoint.clone()).unwrap();
        let settings = settings();
        let bucket = Client::from_conf(
            aws_sdk_s3tables::config::Builder::from(&settings)
                .endpoint_url(&moto.endpoint)
                .build(),
        )
        .create_table_bucket()
        .name("lake")
        .send()
        .await
        .unwrap()
        .arn()
        .to_string();
        let catalog = S3TablesCatalog::new(
            &settings,
            bucket,
            None,
            Some(&endpoint),
            RetryPolicy::default(),
        );
        catalog.writable().await.unwrap();
        let warehouse = catalog.place("dynamodb", "orders").await.unwrap();
        assert!(warehouse.starts_with("s3://"), "{warehouse}");
        assert_eq!(
            catalog.place("dynamodb", "orders").await.unwrap(),
            warehouse
        );
        assert_eq!(catalog.location("dynamodb", "orders").await.unwrap(), None);
        let first = format!("{warehouse}/metadata/00000-a.metadata.json");
        let second = format!("{warehouse}/metadata/00001-b.metadata.json");
        assert!(catalog.create("dynamodb", "orders", &first).await.unwrap());
        assert!(!catalog.create("dynamodb", "orders", &second).await.unwrap());
        assert_eq!(
            catalog.location("dynamodb", "orders").await.unwrap(),
            Some(first.clone())
        );
        assert!(
            !catalog
                .swap("dynamodb", "orders", &second, &first)
                .await
                .unwrap()
        );
        assert!(
            catalog
                .swap("dynamodb", "orders", &first, &second)
                .await
                .unwrap()
        );
        assert!(
            !catalog
                .swap("dynamodb", "orders", &first, &second)
                .await
                .unwrap()
        );
        assert_eq!(
            catalog.location("dynamodb", "orders").await.unwrap(),
            Some(second)
        );
        // A stale token is refused by the service itself.
        let held = catalog.held("dynamodb", "orders").await.unwrap().unwrap();
        let third = format!("{warehouse}/metadata/00002-c.metadata.json");
        let fourth = format!("{warehouse}/metadata/00003-d.metadata.json");
        assert!(
            (catalog.update("dynamodb", "orders", held.version_token.clone(), &third))
                .await
                .unwrap()
        );
        assert!(
            !(catalog.update("dynamodb", "orders", held.version_token, &fourth))
                .await
                .unwrap(),
            "the token read before the last update is refused"
        );
        assert_eq!(catalog.location("dynamodb", "nowhere").await.unwrap(), None);
    }
}
