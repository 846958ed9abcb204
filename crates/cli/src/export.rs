//! Wiring of `source.snapshot.engine: export` (docs/scan.md §2.10): the export engine over the
//! export and S3 clients built from the run's SDK configuration (same credentials), and the
//! export a scan-mode run reads. The rules live in `ddbpipe_source::export`.

use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws::{self, AwsExportApi, AwsObjectStore};
use ddbpipe_source::config::{OnGap, SnapshotEngine, SourceConfig};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::export::{ExportEngine, ExportPoll, GivenExport, SnapshotExports};
use ddbpipe_source::retry::Cancel;

use crate::failure::Failure;

/// The export engine of a source over AWS.
pub type AwsExports = ExportEngine<AwsExportApi, AwsObjectStore>;

/// The export engine of `source`, when its snapshots are exports: both clients from the run's
/// SDK configuration; S3 in the snapshot's region and endpoint when set, else at the source's
/// endpoint (path-style).
pub fn engine(sdk: &aws::SdkSettings, source: &SourceConfig) -> Option<AwsExports> {
    (source.snapshot.engine == SnapshotEngine::Export).then(|| build(sdk, source))
}

/// The export engine a streams or mirror run repairs gaps with (`on_gap: repair`,
/// docs/streams.md §4.12), whatever the snapshot engine: the same bucket fields. A repair left
/// open by an earlier run is finished through it whatever `on_gap` says now, when the bucket
/// is still configured.
pub fn repairs(
    sdk: &aws::SdkSettings,
    source: &SourceConfig,
    repair_open: bool,
) -> Option<AwsExports> {
    let wanted = source.on_gap == OnGap::Repair || repair_open;
    (wanted && source.mode.reads_stream() && source.snapshot.s3_bucket.is_some())
        .then(|| build(sdk, source))
}

fn build(sdk: &aws::SdkSettings, source: &SourceConfig) -> AwsExports {
    let snapshot = &source.snapshot;
    let endpoint = snapshot
        .s3_endpoint_url
        .as_ref()
        .or(source.endpoint_url.as_ref());
    let s3 = aws::s3_client(sdk, snapshot.s3_region.as_deref(), endpoint);
    ExportEngine {
        exports: Arc::new(aws::export_api(sdk)),
        store: Arc::new(AwsObjectStore::new(
            s3,
            snapshot.s3_bucket.as_deref().unwrap_or_default(),
            snapshot.s3_bucket_owner.as_deref(),
        )),
        prefix: snapshot.s3_prefix.clone().unwrap_or_default(),
        bucket_owner: snapshot.s3_bucket_owner.clone(),
        given_arn: snapshot.export_arn.clone(),
        max_concurrency: source.max_concurrency,
        page_lines: source.batch_size.min(1000),
        retry: source.retry.policy(),
        observer: Arc::new(RequestMetrics),
        poll: ExportPoll::default(),
    }
}

/// The table's ARN, which an export needs.
pub fn table_arn(source: &SourceConfig, table: &TableDescription) -> Result<String, Failure> {
    table.arn.clone().ok_or_else(|| {
        Failure::runtime(anyhow!(
            "DescribeTable '{}' reported no TableArn, which an export needs",
            source.table_name
        ))
    })
}

/// A new export in place of the damaged `damaged` (docs/scan.md §2.10 rule 9), committed in
/// the position before anything waits for it.
pub async fn abandon_scan(
    engine: &AwsExports,
    pipeline: &str,
    table_arn: &str,
    damaged: &str,
    checkpointer: &mut Checkpointer,
    cancel: &Cancel,
) -> Result<String, Failure> {
    let unique = format!("{pipeline}\n{}", ddbpipe_source::clock::unix_now_ms());
    let arn = engine
        .abandon(damaged, table_arn, None, &unique, cancel)
        .await
        .map_err(Failure::runtime)?;
    checkpointer
        .set_export(&arn)
        .await
        .map_err(Failure::runtime)?;
    Ok(arn)
}

/// The export a scan-mode run reads, committed in the position before anything waits for it:
/// the one the position names (a restart) unless it failed, else the configured or a new one
/// (its client token made of the pipeline and this run's start, so each run's export is its
/// own).
pub async fn begin_scan(
    engine: &AwsExports,
    pipeline: &str,
    table_arn: &str,
    checkpointer: &mut Checkpointer,
    cancel: &Cancel,
) -> Result<String, Failure> {
    let stored = checkpointer.position().export_arn.clone();
    // This run's start: a retry of the request within the run returns the same export; a run
    // after a reset or a completed run takes a new one (never an export hours old).
    let unique = format!("{pipeline}\n{}", ddbpipe_source::clock::unix_now_ms());
    let arn = engine
        .begin(
            stored.as_deref(),
            table_arn,
            &unique,
            GivenExport::Read,
            cancel,
        )
        .await
        .map_err(Failure::runtime)?;
    if stored.as_deref() != Some(arn.as_str()) {
        checkpointer
            .set_export(&arn)
            .await
            .map_err(Failure::runtime)?;
    }
    Ok(arn)
}
