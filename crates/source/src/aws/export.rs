//! [`ExportApi`] over `aws-sdk-dynamodb` and [`ObjectStore`] over `aws-sdk-s3`, both built
//! from the one `aws-config` configuration (same credentials).

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::primitives::DateTime;
use aws_sdk_dynamodb::types::{
    ExportDescription, ExportFormat, ExportStatus as SdkExportStatus, ExportType, ExportViewType,
    IncrementalExportSpecification, PointInTimeRecoveryStatus,
};

use super::api_error;
use crate::endpoint::EndpointUrl;
use crate::error::ApiError;
use crate::export::api::{
    ExportApi, ExportKind, ExportState, ExportStatus, ObjectBody, ObjectStore, Recovery,
    StartExport,
};

/// DynamoDB's export and backup calls through the SDK client.
#[derive(Debug, Clone)]
pub struct AwsExportApi {
    client: Client,
}

impl AwsExportApi {
    /// Wraps a client built from the run's SDK configuration.
    pub fn new(client: Client) -> Self {
        AwsExportApi { client }
    }
}

fn ms(time: Option<&DateTime>) -> Option<i64> {
    time.and_then(|time| time.to_millis().ok())
}

fn status(description: Option<&ExportDescription>) -> Result<ExportStatus, ApiError> {
    let Some(d) = description else {
        return Err(ApiError::fatal("the answer has no ExportDescription"));
    };
    let state = match d.export_status() {
        Some(SdkExportStatus::Completed) => ExportState::Completed,
        Some(SdkExportStatus::Failed) => ExportState::Failed {
            code: d.failure_code().map(str::to_string),
            message: d.failure_message().map(str::to_string),
        },
        _ => ExportState::InProgress,
    };
    Ok(ExportStatus {
        arn: d.export_arn().unwrap_or_default().to_string(),
        state,
        table_arn: d.table_arn().map(str::to_string),
        incremental: matches!(d.export_type(), Some(ExportType::IncrementalExport)),
        export_time_ms: ms(d.export_time()),
        bucket: d.s3_bucket().map(str::to_string),
        manifest_key: d.export_manifest().map(str::to_string),
        item_count: d.item_count().and_then(|n| u64::try_from(n).ok()),
        billed_bytes: d.billed_size_bytes().and_then(|n| u64::try_from(n).ok()),
        started_ms: ms(d.start_time()),
    })
}

impl ExportApi for AwsExportApi {
    async fn recovery(&self, table_name: &str) -> Result<Recovery, ApiError> {
        let out = self
            .client
            .describe_continuous_backups()
            .table_name(table_name)
            .send()
            .await
            .map_err(api_error)?;
        let pitr = out
            .continuous_backups_description()
            .and_then(|d| d.point_in_time_recovery_description());
        Ok(Recovery {
            enabled: pitr.and_then(|p| p.point_in_time_recovery_status())
                == Some(&PointInTimeRecoveryStatus::Enabled),
            earliest_ms: ms(pitr.and_then(|p| p.earliest_restorable_date_time())),
            latest_ms: ms(pitr.and_then(|p| p.latest_restorable_date_time())),
        })
    }

    async fn start_export(&self, request: &StartExport) -> Result<ExportStatus, ApiError> {
        let mut call = self
            .client
            .export_table_to_point_in_time()
            .table_arn(&request.table_arn)
            .s3_bucket(&request.bucket)
            .s3_prefix(&request.prefix)
            .set_s3_bucket_owner(request.bucket_owner.clone())
            .export_format(ExportFormat::DynamodbJson)
            .client_token(&request.client_token);
        call = match request.kind {
            ExportKind::Full { at_ms } => call
                .export_type(ExportType::FullExport)
                .set_export_time(at_ms.map(DateTime::from_millis)),
            ExportKind::Incremental { from_ms, to_ms } => call
                .export_type(ExportType::IncrementalExport)
                .incremental_export_specification(
                    IncrementalExportSpecification::builder()
                        .export_from_time(DateTime::from_millis(from_ms))
                        .export_to_time(DateTime::from_millis(to_ms))
                        .export_view_type(ExportViewType::NewAndOldImages)
                        .build(),
                ),
        };
        let out = call.send().await.map_err(api_error)?;
        status(out.export_description())
    }

    async fn describe_export(&self, arn: &str) -> Result<ExportStatus, ApiError> {
        let out = self
            .client
            .describe_export()
            .export_arn(arn)
            .send()
            .await
            .map_err(api_error)?;
        status(out.export_description())
    }
}

/// The objects of one bucket through the S3 SDK client.
#[derive(Debug, Clone)]
pub struct AwsObjectStore {
    client: aws_sdk_s3::Client,
    bucket: String,
    owner: Option<String>,
}

impl AwsObjectStore {
    /// A store of `bucket` (owned by `owner`, when given: `ExpectedBucketOwner`).
    pub fn new(client: aws_sdk_s3::Client, bucket: &str, owner: Option<&str>) -> Self {
        AwsObjectStore {
            client,
            bucket: bucket.to_string(),
            owner: owner.map(str::to_string),
        }
    }
}

impl ObjectStore for AwsObjectStore {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    async fn get(&self, key: &str) -> Result<ObjectBody, ApiError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .set_expected_bucket_owner(self.owner.clone())
            .send()
            .await
            .map_err(api_error)?;
        Ok(Box::pin(out.body.into_async_read()))
    }
}

/// Builds the S3 client: the run's configuration (credentials), with the snapshot's region
/// and endpoint when set; an endpoint is addressed path-style (emulators, VPC endpoints).
pub fn s3_client(
    config: &aws_config::SdkConfig,
    region: Option<&str>,
    endpoint_url: Option<&EndpointUrl>,
) -> aws_sdk_s3::Client {
    let config = super::sdk_config_at(config, region, endpoint_url);
    let builder =
        aws_sdk_s3::config::Builder::from(&config).force_path_style(endpoint_url.is_some());
    aws_sdk_s3::Client::from_conf(builder.build())
}
