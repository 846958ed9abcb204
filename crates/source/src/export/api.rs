//! The two small traits an export is read through, so the engine runs on AWS or in memory:
//! [`ExportApi`] (DynamoDB's export and backup calls) and [`ObjectStore`] (S3 objects under
//! the export's bucket). [`crate::aws`] implements both with the SDKs; `fake_export` (feature
//! `fake`) implements both in memory, writing AWS's documented layout.

use std::future::Future;
use std::pin::Pin;

use tokio::io::AsyncRead;

use crate::error::ApiError;

/// `DescribeContinuousBackups`: whether point-in-time recovery is on, and the window it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// `PointInTimeRecoveryStatus == ENABLED`.
    pub enabled: bool,
    /// `EarliestRestorableDateTime` in unix ms, when reported.
    pub earliest_ms: Option<i64>,
    /// `LatestRestorableDateTime` in unix ms, when reported.
    pub latest_ms: Option<i64>,
}

/// What an export holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportKind {
    /// `FULL_EXPORT`: the table at `ExportTime` (now when `None`).
    Full {
        /// `ExportTime` in unix ms; `None` = the time of the request.
        at_ms: Option<i64>,
    },
    /// `INCREMENTAL_EXPORT` of the window `[from_ms, to_ms)`, `NEW_AND_OLD_IMAGES`.
    Incremental {
        /// `ExportFromTime` in unix ms.
        from_ms: i64,
        /// `ExportToTime` in unix ms.
        to_ms: i64,
    },
}

/// `ExportTableToPointInTime`'s request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartExport {
    /// `TableArn`.
    pub table_arn: String,
    /// `S3Bucket`.
    pub bucket: String,
    /// `S3Prefix`.
    pub prefix: String,
    /// `S3BucketOwner`, when the bucket is another account's.
    pub bucket_owner: Option<String>,
    /// Full or incremental.
    pub kind: ExportKind,
    /// `ClientToken`: the same token within 8 hours returns the same export instead of
    /// starting another (a crash between the request and its commit pays only once).
    pub client_token: String,
}

/// `ExportStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportState {
    /// `IN_PROGRESS`.
    InProgress,
    /// `COMPLETED`: the files and manifests are in S3.
    Completed,
    /// `FAILED`, with `FailureCode` and `FailureMessage`.
    Failed {
        /// `FailureCode`, when given.
        code: Option<String>,
        /// `FailureMessage`, when given.
        message: Option<String>,
    },
}

/// `ExportDescription`: what ddbpipe needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportStatus {
    /// `ExportArn`.
    pub arn: String,
    /// `ExportStatus`.
    pub state: ExportState,
    /// `TableArn`.
    pub table_arn: Option<String>,
    /// `ExportType`: `true` for `INCREMENTAL_EXPORT`.
    pub incremental: bool,
    /// `ExportTime` in unix ms (a full export's instant).
    pub export_time_ms: Option<i64>,
    /// `S3Bucket`.
    pub bucket: Option<String>,
    /// `ExportManifest`: the S3 key of `manifest-summary.json`, once completed.
    pub manifest_key: Option<String>,
    /// `ItemCount`, once completed.
    pub item_count: Option<u64>,
    /// `BilledSizeBytes`, once completed.
    pub billed_bytes: Option<u64>,
    /// `StartTime` in unix ms.
    pub started_ms: Option<i64>,
}

/// The body of an S3 object, read as it arrives.
pub type ObjectBody = Pin<Box<dyn AsyncRead + Send>>;

/// DynamoDB's export and backup calls. One attempt per call: [`crate::retry`] retries.
pub trait ExportApi: Send + Sync + 'static {
    /// `DescribeContinuousBackups` of `table_name`.
    fn recovery(&self, table_name: &str)
    -> impl Future<Output = Result<Recovery, ApiError>> + Send;

    /// `ExportTableToPointInTime`.
    fn start_export(
        &self,
        request: &StartExport,
    ) -> impl Future<Output = Result<ExportStatus, ApiError>> + Send;

    /// `DescribeExport` of `arn`.
    fn describe_export(
        &self,
        arn: &str,
    ) -> impl Future<Output = Result<ExportStatus, ApiError>> + Send;
}

/// S3 objects of one bucket (`GetObject`). One attempt per call.
pub trait ObjectStore: Send + Sync + 'static {
    /// The bucket, for messages.
    fn bucket(&self) -> &str;

    /// `GetObject` of `key`: its body, streamed. A failure while the body is read surfaces as
    /// an I/O error of the body.
    fn get(&self, key: &str) -> impl Future<Output = Result<ObjectBody, ApiError>> + Send;
}

/// What to do about an S3 or export error code, for the error line (docs/scan.md §2.10).
pub fn remedy(code: Option<&str>) -> Option<&'static str> {
    Some(match code? {
        "NoSuchBucket" => "create the bucket, or fix source.snapshot.s3_bucket",
        "AccessDenied" | "AccessDeniedException" => {
            "grant the credentials s3:GetObject, s3:PutObject and s3:ListBucket on the export \
             prefix, and dynamodb:ExportTableToPointInTime and dynamodb:DescribeExport on the \
             table (README, Export snapshots)"
        }
        "KMS.AccessDeniedException"
        | "KMS.DisabledException"
        | "KMS.NotFoundException"
        | "KMSAccessDeniedException" => {
            "the bucket's KMS key must allow kms:Decrypt (and kms:GenerateDataKey for the \
             export) to these credentials"
        }
        "NoSuchKey" => {
            "the export's files are gone (deleted or expired by a lifecycle rule): a run \
             abandons such an export once and requests a new one; a configured \
             source.snapshot.export_arn must be removed"
        }
        "PointInTimeRecoveryUnavailableException" => {
            "turn on point-in-time recovery: aws dynamodb update-continuous-backups \
             --table-name <table> --point-in-time-recovery-specification \
             PointInTimeRecoveryEnabled=true (or use snapshot.engine: scan)"
        }
        "ExportConflictException" => {
            "another export with this client token but other parameters exists; wait 8 hours \
             or change source.snapshot.s3_prefix"
        }
        "ExportNotFoundException" => "the export ARN is unknown: check source.snapshot.export_arn",
        "InvalidExportTimeException" => {
            "the export time is outside the table's point-in-time recovery window"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    #[test]
    fn s3_and_export_codes_say_what_to_do_and_are_classified() {
        for (code, says) in [
            ("NoSuchBucket", "source.snapshot.s3_bucket"),
            ("AccessDenied", "s3:GetObject"),
            ("KMS.AccessDeniedException", "kms:Decrypt"),
            ("NoSuchKey", "lifecycle rule"),
            (
                "PointInTimeRecoveryUnavailableException",
                "update-continuous-backups",
            ),
            ("ExportNotFoundException", "source.snapshot.export_arn"),
        ] {
            let fix = remedy(Some(code)).unwrap_or_default();
            assert!(fix.contains(says), "{code}: {fix}");
            assert_eq!(ErrorClass::of_code(Some(code)), ErrorClass::Fatal, "{code}");
        }
        assert_eq!(remedy(Some("ValidationException")), None);
        assert_eq!(ErrorClass::of_code(Some("SlowDown")), ErrorClass::Throttle);
        for code in ["InternalError", "RequestTimeout"] {
            assert_eq!(
                ErrorClass::of_code(Some(code)),
                ErrorClass::Transient,
                "{code}"
            );
        }
    }
}
