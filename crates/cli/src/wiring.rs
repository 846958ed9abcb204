//! Wiring helpers shared by the commands: the validated config, the table API, where it
//! reads, the position's identity, `DescribeTable` and the stream. They connect things and
//! decide nothing: the rules live in `ddbpipe_source::plan` and the library crates.

use std::path::Path;

use anyhow::anyhow;
use ddbpipe_pipeline::state::identity::{Identity, Location};
use ddbpipe_source::api::{TableApi, TableDescription};
use ddbpipe_source::aws::{self, AwsTableApi};
use ddbpipe_source::config::SourceConfig;
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_source::error::{Contact, ErrorClass, ReadError};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::plan::{self, ResolvedStream};
use ddbpipe_source::retry::{Cancel, FirstContact};

use crate::config::{self, PipelineConfig};
use crate::destination;
use crate::failure::Failure;
use crate::origin::Origin;
use crate::sink::GivenSink;

/// Loads and validates a pipeline file; problems are usage failures (exit 2).
pub fn load_config(path: &Path) -> Result<PipelineConfig, Failure> {
    let env = |name: &str| std::env::var(name).ok();
    config::load(path, &env)
        .map_err(|error| crate::config::load_failure(error, &Origin::File(path.to_owned())))
}

/// Builds the table API (no network I/O) and says where it reads.
pub async fn table_api(source: &SourceConfig) -> (AwsTableApi, Location) {
    let (_, api, location) = clients(source, None).await;
    (api, location)
}

/// The SDK configuration of a run: the program's own when it gave one
/// (`Pipeline::with_sdk_config`, its region, credentials and endpoint in place of the
/// source's), else the one the source's settings load.
async fn sdk_config(source: &SourceConfig, given: Option<&aws::SdkSettings>) -> aws::SdkSettings {
    match given {
        Some(given) => aws::adopt_sdk_config(given),
        None => aws::load_sdk_config(&plan::client_settings(source)).await,
    }
}

/// The SDK configuration of a source (for the export and S3 clients; `given` as
/// [`sdk_config`] says), its table API, and where it reads.
pub async fn clients(
    source: &SourceConfig,
    given: Option<&aws::SdkSettings>,
) -> (aws::SdkSettings, AwsTableApi, Location) {
    let sdk = sdk_config(source, given).await;
    let api = aws::table_api(&sdk);
    let location = location(&sdk, source);
    (sdk, api, location)
}

/// Where the clients built from `sdk` read: its region and endpoint, and the account when the
/// configured table name or stream ARN names one. [`Location::learn`] adds what a
/// `DescribeTable` answer says.
pub fn location(sdk: &aws::SdkSettings, source: &SourceConfig) -> Location {
    let account = [
        Some(source.table_name.as_str()),
        source.stream_arn.as_deref(),
    ]
    .into_iter()
    .flatten()
    .find_map(Location::account_of);
    Location {
        region: sdk.region().map(|r| r.as_ref().to_string()),
        endpoint_url: sdk.endpoint_url().map(str::to_string),
        account,
    }
}

/// The identity of this pipeline's position (the rules in `state::identity`); `sink`: the
/// sink given in code to a `type: custom` pipeline, when this command has it.
pub fn identity(
    config: &PipelineConfig,
    location: &Location,
    sink: Option<&GivenSink>,
) -> Identity {
    Identity::of(
        &config.source,
        location,
        destination::output(config, sink).as_ref(),
    )
}

/// `DescribeTable`, retried by the one policy; it is every run's first request, so a
/// connection that cannot be made ends it as [`FirstContact`] says (docs/errors.md §9.6).
pub async fn describe<A: TableApi>(
    api: &A,
    source: &SourceConfig,
    cancel: &Cancel,
) -> Result<TableDescription, Failure> {
    let table = source.table_name.as_str();
    let first_contact = &FirstContact::default();
    let described = source
        .retry
        .policy()
        .run(
            "describe_table",
            || format!("DescribeTable '{table}'"),
            cancel,
            &RequestMetrics,
            |n| async move {
                // The run's first request: an endpoint that takes no connection is wrong, not
                // passing (docs/errors.md §9.6).
                first_contact.judged(n, api.describe_table(table).await)
            },
        )
        .await;
    match described {
        Ok(Some(description)) => Ok(description),
        Ok(None) => Err(Failure::runtime(anyhow!(
            "DescribeTable '{table}' returned no table"
        ))),
        Err(error) => {
            let hint = match error.code() {
                Some("ResourceNotFoundException") => Some(format!(
                    "check source.table_name, source.region and the account: table '{table}' was not found"
                )),
                Some("AccessDeniedException") => Some(format!(
                    "grant dynamodb:DescribeTable on table '{table}' to the credentials in use"
                )),
                Some("UnrecognizedClientException" | "InvalidSignatureException") => {
                    Some("check the credentials in source.credentials".to_string())
                }
                // No answer with a code and definite: the credentials could not be loaded
                // (the request never left); the endpoint may well answer.
                None if matches!(
                    &error,
                    ReadError::Request { error, .. }
                        if error.class == ErrorClass::Fatal && error.contact == Contact::Made
                ) =>
                {
                    Some(
                        "give ddbpipe credentials: source.credentials, or the environment \
                         (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
                            .to_string(),
                    )
                }
                None => Some(format!(
                    "check source.endpoint_url / source.region: {} could not be reached",
                    source
                        .endpoint_url
                        .as_ref()
                        .map_or("DynamoDB".to_string(), EndpointUrl::masked)
                )),
                _ => None,
            };
            let failure = Failure::runtime(error);
            Err(match hint {
                Some(hint) => failure.hint(hint),
                None => failure,
            })
        }
    }
}

/// `stream_arn` if set, else the table's enabled stream, described now (docs/streams.md §4.2).
pub async fn resolve_stream<A: TableApi>(
    api: &A,
    source: &SourceConfig,
    cancel: &Cancel,
) -> Result<ResolvedStream, Failure> {
    if let Some(stream) = plan::configured_stream(source) {
        return Ok(stream);
    }
    let table = describe(api, source, cancel).await?;
    plan::resolve_stream(source, &table).map_err(Failure::runtime)
}
