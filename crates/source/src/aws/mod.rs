//! The only code that names `aws_sdk_*`: building clients, converting values, reading error
//! codes.
//!
//! # Clients
//! One DynamoDB client per run, built from `aws-config` with the configured region,
//! credentials and endpoint. The SDK's own retries are off (one attempt per call, whatever
//! `AWS_MAX_ATTEMPTS` says): [`crate::retry`] is the only retry layer. Building does no
//! network I/O; credentials are resolved lazily by the SDK's providers.
//!
//! # Data plane
//! Scan, Query and GetRecords are sent, signed and error-checked by the same clients, but a
//! successful answer's body skips the SDK's deserialiser (`raw_body`) and is decoded straight
//! into records (`crate::wire`): the SDK's object model cost about two thirds of the CPU per item.
//! `read_page` and `get_records` (value trees, for the lag probe) still go through the SDK.

mod convert;
mod export;
mod lease;
mod raw_body;
mod streams;
mod table;

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials as StaticCredentials;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;

pub use aws_config::SdkConfig as SdkSettings;
pub use export::{AwsExportApi, AwsObjectStore, s3_client};
pub use lease::AwsLeaseTable;
pub use streams::AwsStreamsApi;
pub use table::AwsTableApi;

use crate::config::Credentials;
use crate::endpoint::{EndpointUrl, mask_urls_in};
use crate::error::ApiError;

/// How to reach AWS: everything the clients are built from.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Region; `None` = the default region chain.
    pub region: Option<String>,
    /// Endpoint override for DynamoDB and Streams (emulators, VPC endpoints).
    pub endpoint_url: Option<EndpointUrl>,
    /// Where credentials come from.
    pub credentials: Credentials,
}

/// Classifies an SDK error by its AWS error code; transport failures carry no code. Both
/// SDKs (DynamoDB and Streams) share the error types.
///
/// # Error handling
/// 1. An answer with an error code: its code and message, classified by the code.
/// 2. No credentials could be loaded: definite at once (retrying the chain only repeats its
///    probes), with one line naming the chain and the fix.
/// 3. Anything else without a code (connection refused, DNS, TLS, timeouts): transient, with
///    the error's chain of causes as sentences, never the SDK's `Debug` dump.
/// 4. Every URL in the text is masked (`crate::endpoint`): the SDK's errors may quote the
///    endpoint, with its user-info.
pub fn api_error<E, R>(error: SdkError<E, R>) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let code = error.code().map(str::to_string);
    if let (Some(_), Some(message)) = (&code, error.message()) {
        return ApiError::from_code(code, mask_urls_in(message));
    }
    if let Some(missing) = credentials_error(&error) {
        // The chain lists every provider it tried, a line each: one line here.
        let missing: Vec<&str> = missing.lines().map(str::trim).collect();
        let missing = missing.join(" ");
        let missing = missing.trim_end_matches('.');
        return ApiError::fatal(mask_urls_in(&format!(
            "no AWS credentials: {missing}. ddbpipe looked where aws-config's default chain \
             looks (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws/config, SSO, \
             web identity, the container and EC2 instance metadata): set one of them, or \
             source.credentials"
        )));
    }
    let message = mask_urls_in(&causes(&error));
    if code.is_none() && no_connection(&error) {
        return ApiError::not_reached(message);
    }
    ApiError::from_code(code, message)
}

/// Whether the request failed before a connection was made (docs/errors.md §9.6): refused, no
/// route, or the connect timed out. The SDK reports these as dispatch failures.
fn no_connection<E, R>(error: &SdkError<E, R>) -> bool {
    let SdkError::DispatchFailure(failure) = error else {
        return false;
    };
    let Some(connector) = failure.as_connector_error() else {
        return false;
    };
    // Only the connect phase has a timeout (`CONNECT_TIMEOUT`): a timeout is a connect timeout.
    if connector.is_timeout() {
        return true;
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(connector);
    while let Some(error) = current {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
            ) {
                return true;
            }
        }
        current = error.source();
    }
    false
}

/// The reason credentials could not be loaded, if that is what failed.
fn credentials_error(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(credentials) =
            error.downcast_ref::<aws_credential_types::provider::error::CredentialsError>()
        {
            return Some(causes(credentials));
        }
        current = error.source();
    }
    None
}

/// An error and its sources as one line, `outer: inner: …`, each message once.
pub fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(error) = current {
        let text = error.to_string();
        // An outer message often repeats its source's text: keep the new part only.
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = error.source();
    }
    parts.join(": ")
}

/// Connect timeout of every client (docs/config.md §1.4).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3100);

/// The SDK settings every client keeps whoever loaded the rest: SDK retries off (ddbpipe's
/// own retry layer decides, docs/errors.md §9) and the connect timeout.
fn client_timeouts() -> (RetryConfig, TimeoutConfig) {
    (
        RetryConfig::disabled(),
        TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build(),
    )
}

/// A program's own SDK configuration (its region, credentials, endpoint, HTTP client) with
/// SDK retries off and the connect timeout, as every client of a run needs.
pub fn adopt_sdk_config(given: &SdkConfig) -> SdkConfig {
    let (retry, timeouts) = client_timeouts();
    given
        .to_builder()
        .retry_config(retry)
        .timeout_config(timeouts)
        .build()
}

/// The run's configuration `config` (credentials, retries, timeouts) for a service in `region`
/// at `endpoint` when given (another region's bucket, a catalog, an emulator): what a client
/// of S3, Glue or S3 Tables is built from.
pub fn sdk_config_at(
    config: &SdkConfig,
    region: Option<&str>,
    endpoint: Option<&EndpointUrl>,
) -> SdkConfig {
    let mut builder = config.to_builder();
    if let Some(region) = region {
        builder = builder.region(Region::new(region.to_string()));
    }
    if let Some(url) = endpoint {
        builder = builder.endpoint_url(url.expose());
    }
    builder.build()
}

/// Loads the shared SDK configuration: region, credentials, endpoint; SDK retries off.
pub async fn load_sdk_config(settings: &ClientSettings) -> SdkConfig {
    let (retry, timeouts) = client_timeouts();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(retry)
        .timeout_config(timeouts);
    if let Some(region) = &settings.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &settings.endpoint_url {
        loader = loader.endpoint_url(url.expose());
    }
    match &settings.credentials {
        Credentials::Default | Credentials::WebIdentity => {}
        Credentials::Profile { name } => loader = loader.profile_name(name.clone()),
        Credentials::AccessKey {
            access_key_id,
            secret_access_key,
            session_token,
        } => {
            loader = loader.credentials_provider(StaticCredentials::new(
                access_key_id.clone(),
                secret_access_key.expose().to_string(),
                session_token
                    .as_ref()
                    .map(|token| token.expose().to_string()),
                None,
                "ddbpipe-config",
            ));
        }
        Credentials::AssumeRole { .. } => {}
    }
    let base = loader.load().await;
    let Credentials::AssumeRole {
        role_arn,
        session_name,
        external_id,
    } = &settings.credentials
    else {
        return base;
    };
    let mut builder = aws_config::sts::AssumeRoleProvider::builder(role_arn.clone())
        .session_name(session_name.clone())
        .configure(&base);
    if let Some(id) = external_id {
        builder = builder.external_id(id.clone());
    }
    if let Some(region) = &settings.region {
        builder = builder.region(Region::new(region.clone()));
    }
    let provider = builder.build().await;
    base.into_builder()
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(provider),
        )
        .build()
}

/// Builds the DynamoDB table reader from loaded SDK configuration.
pub fn table_api(config: &SdkConfig) -> AwsTableApi {
    AwsTableApi::new(aws_sdk_dynamodb::Client::new(config))
}

/// Builds DynamoDB's export calls from the same SDK configuration as the table reader.
pub fn export_api(config: &SdkConfig) -> AwsExportApi {
    AwsExportApi::new(aws_sdk_dynamodb::Client::new(config))
}

/// Builds the DynamoDB Streams reader from the same SDK configuration as the table reader, so
/// the endpoint override, region and credentials apply to both.
pub fn streams_api(config: &SdkConfig) -> AwsStreamsApi {
    AwsStreamsApi::new(aws_sdk_dynamodbstreams::Client::new(config))
}

/// Builds the lease table client (docs/coordination.md §11.1) from the same SDK configuration
/// as the table reader: the lease table lives beside the source table.
pub fn lease_table(config: &SdkConfig, table: &str) -> AwsLeaseTable {
    AwsLeaseTable::new(aws_sdk_dynamodb::Client::new(config), table)
}
