//! Starting a snapshot's export, or taking the one configured (rules 10–11 of `export`).

use sha2::{Digest, Sha256};

use super::ExportError;
use super::api::{ExportApi, ExportKind, ExportState, ExportStatus, StartExport};
use super::reader::{describe, with_remedy};
use crate::error::ReadError;
use crate::events::RequestMetrics;
use crate::retry::{Cancel, RetryPolicy};

/// Where a table's exports are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportTarget {
    /// The table's ARN (`DescribeTable`'s `TableArn`).
    pub table_arn: String,
    /// `S3Bucket`.
    pub bucket: String,
    /// `S3Prefix`.
    pub prefix: String,
    /// `S3BucketOwner`.
    pub bucket_owner: Option<String>,
}

/// A `ClientToken` derived from `parts` (the pipeline and what makes this snapshot unique):
/// the same parts give the same token, so a request repeated after a crash returns the same
/// export instead of starting a second.
pub fn client_token(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `ExportTableToPointInTime` of `kind` into `target`, retried (rule 10); the caller commits
/// the returned ARN before waiting for it.
pub async fn start<E: ExportApi>(
    api: &E,
    target: &ExportTarget,
    kind: ExportKind,
    client_token: &str,
    retry: &RetryPolicy,
    cancel: &Cancel,
) -> Result<ExportStatus, ReadError> {
    let request = StartExport {
        table_arn: target.table_arn.clone(),
        bucket: target.bucket.clone(),
        prefix: target.prefix.clone(),
        bucket_owner: target.bucket_owner.clone(),
        kind,
        client_token: client_token.to_string(),
    };
    let what = || format!("ExportTableToPointInTime of '{}'", target.table_arn);
    let status = retry
        .run("export_table", what, cancel, &RequestMetrics, |_| {
            api.start_export(&request)
        })
        .await
        .map_err(|error| match with_remedy(error) {
            // The remedy names the table as the command needs it.
            ReadError::Request {
                what,
                attempts,
                mut error,
            } => {
                let table = target.table_arn.rsplit('/').next().unwrap_or_default();
                error.message = error.message.replace("<table>", table);
                ReadError::Request {
                    what,
                    attempts,
                    error,
                }
            }
            other => other,
        })?;
    tracing::info!(export = %status.arn, bucket = %target.bucket, prefix = %target.prefix, "Export started.");
    Ok(status)
}

/// The configured `export_arn`, described and checked (rule 11): a full export of this table
/// that did not fail.
pub async fn given<E: ExportApi>(
    api: &E,
    arn: &str,
    table_arn: &str,
    retry: &RetryPolicy,
    cancel: &Cancel,
) -> Result<ExportStatus, ReadError> {
    let status = describe(api, arn, retry, &RequestMetrics, cancel).await?;
    let problem = if status.incremental {
        Some(
            "it is an INCREMENTAL_EXPORT; source.snapshot.export_arn must be a full export"
                .to_string(),
        )
    } else if status.table_arn.as_deref().is_some_and(|t| t != table_arn) {
        Some(format!(
            "it is an export of {}, not of {table_arn}",
            status.table_arn.as_deref().unwrap_or_default()
        ))
    } else if let ExportState::Failed { code, message } = &status.state {
        Some(format!(
            "it FAILED ({}: {})",
            code.as_deref().unwrap_or("no code"),
            message.as_deref().unwrap_or("no message")
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ReadError::Export(ExportError::new(
            arn,
            format!("{problem}; fix or remove source.snapshot.export_arn"),
        ))),
        None => Ok(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_token_is_stable_for_its_parts_and_differs_for_others() {
        let token = client_token(&["orders", "1700000000000"]);
        assert_eq!(token.len(), 32);
        assert_eq!(token, client_token(&["orders", "1700000000000"]));
        assert_ne!(token, client_token(&["orders", "1700000000001"]));
        assert_ne!(client_token(&["ab", "c"]), client_token(&["a", "bc"]));
    }
}
