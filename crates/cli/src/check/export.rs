//! The probes of `source.snapshot.engine: export` and `on_gap: repair` (docs/cli.md §8.2):
//! point-in-time recovery on the table (an export needs it, `run` fails without it; a repair
//! without it resnapshots, a warning), the bucket, and a configured `export_arn`.

use std::time::Duration;

use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws;
use ddbpipe_source::export::api::{ExportApi, remedy};
use ddbpipe_source::plan;
use ddbpipe_source::retry::{Cancel, NoObserver};

use super::{Probes, Status};
use crate::config::PipelineConfig;

/// The fix for point-in-time recovery being off: the one `run` gives, for this table.
fn pitr_fix(table: &str) -> String {
    remedy(Some("PointInTimeRecoveryUnavailableException"))
        .unwrap_or_default()
        .replace("<table>", table)
}

/// `point_in_time_recovery` and `export_arn`; nothing when the engine is `scan` or the table
/// was not described.
pub(super) async fn probe_export(
    config: &PipelineConfig,
    table: Option<&TableDescription>,
    timeout: Duration,
    probes: &mut Probes,
) {
    let source = &config.source;
    let Some(table) = table else { return };
    let sdk = aws::load_sdk_config(&plan::client_settings(source)).await;
    // The snapshot engine needs point-in-time recovery; a repair without it falls back to a
    // full resnapshot (docs/streams.md §4.12), which `run` does rather than fail.
    let snapshots = source.snapshot.engine == ddbpipe_source::config::SnapshotEngine::Export;
    let Some(engine) =
        crate::export::engine(&sdk, source).or_else(|| crate::export::repairs(&sdk, source, false))
    else {
        return;
    };
    let retry = source.retry.policy();
    let cancel = Cancel::never();
    let name = table.name.as_str();
    let recovery = retry.run(
        "describe_continuous_backups",
        || format!("DescribeContinuousBackups '{name}'"),
        &cancel,
        &NoObserver,
        |_| engine.exports.recovery(name),
    );
    match tokio::time::timeout(timeout, recovery).await {
        Ok(Ok(recovery)) if recovery.enabled => {
            let since = recovery
                .earliest_ms
                .map(|ms| {
                    format!(
                        ", restorable from {}",
                        ddbpipe_source::clock::rfc3339_ms(ms)
                    )
                })
                .unwrap_or_default();
            probes.add(
                "point_in_time_recovery",
                Status::Pass,
                format!("enabled{since}: exports can be taken"),
            );
        }
        Ok(Ok(_)) if snapshots => probes.add(
            "point_in_time_recovery",
            Status::Fail,
            format!(
                "off for table '{name}': snapshot.engine: export needs it; {}",
                pitr_fix(name)
            ),
        ),
        Ok(Ok(_)) => probes.add(
            "point_in_time_recovery",
            Status::Warn,
            format!(
                "off for table '{name}': on_gap: repair would resnapshot the whole table instead \
                 of exporting a gap's changes; {}",
                pitr_fix(name)
            ),
        ),
        Ok(Err(error)) => probes.add("point_in_time_recovery", Status::Fail, error.to_string()),
        Err(_) => probes.add(
            "point_in_time_recovery",
            Status::Fail,
            format!("no answer within {} s", timeout.as_secs()),
        ),
    }
    probe_bucket(&engine, timeout, probes).await;
    if let (Some(arn), Some(table_arn)) = (&source.snapshot.export_arn, &table.arn) {
        let given =
            ddbpipe_source::export::given(engine.exports.as_ref(), arn, table_arn, &retry, &cancel);
        match tokio::time::timeout(timeout, given).await {
            Ok(Ok(status)) => probes.add(
                "export_arn",
                Status::Pass,
                format!(
                    "a full export of the table, {}",
                    match status.state {
                        ddbpipe_source::export::api::ExportState::Completed => "COMPLETED",
                        _ => "IN_PROGRESS",
                    }
                ),
            ),
            Ok(Err(error)) => probes.add("export_arn", Status::Fail, error.to_string()),
            Err(_) => probes.add(
                "export_arn",
                Status::Fail,
                format!("no answer within {} s", timeout.as_secs()),
            ),
        }
    }
}

/// The key `check` asks for under the prefix: no export writes it, so its answer says whether
/// the bucket exists and may be read, without reading anything.
const PROBE_KEY: &str = "ddbpipe-check-probe";

/// `s3_bucket`: a `GetObject` of a key no export writes. `NoSuchKey` means the bucket is there
/// and readable; `NoSuchBucket` and `AccessDenied` fail with the fix `run` would give (S3 also
/// answers `AccessDenied` for a missing key to a role without `s3:ListBucket`, which a run
/// needs as well).
async fn probe_bucket(engine: &crate::export::AwsExports, timeout: Duration, probes: &mut Probes) {
    use ddbpipe_source::export::api::ObjectStore as _;
    let store = &engine.store;
    let bucket = store.bucket().to_string();
    let key = match engine.prefix.trim_end_matches('/') {
        "" => PROBE_KEY.to_string(),
        prefix => format!("{prefix}/{PROBE_KEY}"),
    };
    let (status, detail) = match tokio::time::timeout(timeout, store.get(&key)).await {
        Ok(Ok(_)) => (Status::Pass, format!("'{bucket}' can be read")),
        Err(_) => (
            Status::Fail,
            format!("'{bucket}': no answer within {} s", timeout.as_secs()),
        ),
        Ok(Err(error)) => match error.code.as_deref() {
            Some("NoSuchKey") => (Status::Pass, format!("'{bucket}' can be read")),
            Some("NoSuchBucket") => (
                Status::Fail,
                format!(
                    "'{bucket}' does not exist: {}",
                    remedy(Some("NoSuchBucket")).unwrap_or_default()
                ),
            ),
            // A run reads the export's files with the same credentials and fails on this
            // answer; S3 also gives it for a missing key without s3:ListBucket, which the run
            // needs too (README, Export snapshots).
            Some("AccessDenied") => (
                Status::Fail,
                format!(
                    "GetObject s3://{bucket}/{key} was denied (AccessDenied), as a run's reads \
                     of the export's files would be: {}",
                    remedy(Some("AccessDenied")).unwrap_or_default()
                ),
            ),
            _ => (Status::Fail, format!("'{bucket}': {error}")),
        },
    };
    probes.add("s3_bucket", status, detail);
}
