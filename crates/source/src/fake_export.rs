//! An in-memory export service and bucket (feature `fake`): [`FakeExports`] implements
//! [`ExportApi`] and [`ObjectStore`], writing AWS's documented layout (docs/scan.md §2.10)
//! when an export starts, with scripted faults.
//!
//! A full export holds what the table source gives at the moment it starts (its `ExportTime`
//! is the fake's clock then); it stays `IN_PROGRESS` for `in_progress_describes` describes,
//! then is `COMPLETED`. Items are spread over `files` data files (some may be empty, as AWS's
//! are). `ClientToken` is honoured: the same token returns the same export.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ddbpipe_value::{Item, item_to_typed_json};
use flate2::Compression;
use flate2::write::GzEncoder;
use md5::{Digest, Md5};
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::ApiError;
use crate::export::api::{
    ExportApi, ExportKind, ExportState, ExportStatus, ObjectBody, ObjectStore, Recovery,
    StartExport,
};

/// One change of an incremental export.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeChange {
    /// `WriteTimestampMicros`.
    pub micros: i64,
    /// `Keys`.
    pub keys: Item,
    /// `NewImage` (absent for a delete).
    pub new: Option<Item>,
    /// `OldImage` (absent for an insert).
    pub old: Option<Item>,
}

/// Where the fake's exports take their content from.
pub trait ExportSource: Send + Sync + 'static {
    /// The table's items now.
    fn items(&self) -> Vec<Item>;
    /// The table's clock now (unix ms): a full export's `ExportTime`.
    fn now_ms(&self) -> i64;
    /// The last change per key written in `[from_ms, to_ms)`.
    fn changes(&self, _from_ms: i64, _to_ms: i64) -> Vec<FakeChange> {
        Vec::new()
    }
}

/// A fixed list of items at a fixed time.
#[derive(Debug, Clone)]
pub struct FixedItems {
    /// The items every export holds.
    pub items: Vec<Item>,
    /// Every export's `ExportTime`.
    pub at_ms: i64,
    /// What incremental exports hold (filtered by their window).
    pub changes: Vec<FakeChange>,
}

impl ExportSource for FixedItems {
    fn items(&self) -> Vec<Item> {
        self.items.clone()
    }
    fn now_ms(&self) -> i64 {
        self.at_ms
    }
    fn changes(&self, from_ms: i64, to_ms: i64) -> Vec<FakeChange> {
        self.changes
            .iter()
            .filter(|c| c.micros >= from_ms * 1000 && c.micros < to_ms * 1000)
            .cloned()
            .collect()
    }
}

/// What the fake was asked, for assertions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportCalls {
    /// `ExportTableToPointInTime` requests that started an export.
    pub started: u64,
    /// Every `ExportTableToPointInTime` request.
    pub start_requests: Vec<StartExport>,
    /// `DescribeExport` requests.
    pub describes: u64,
    /// `GetObject` requests, by key.
    pub gets: Vec<String>,
}

#[derive(Debug, Clone)]
struct Export {
    /// What `DescribeExport` says while `describes_left` lasts.
    running: ExportStatus,
    /// What it says after.
    done: ExportStatus,
    token: String,
    describes_left: u32,
}

struct State {
    source: Arc<dyn ExportSource>,
    objects: BTreeMap<String, Vec<u8>>,
    exports: BTreeMap<String, Export>,
    calls: ExportCalls,
    recovery: Recovery,
    files: usize,
    in_progress_describes: u32,
    fail_next: Option<(String, String)>,
    miscount_next: bool,
    deny_gets: Option<String>,
    fail_gets: Vec<ApiError>,
    cut_bodies: Vec<(String, usize)>,
}

/// The in-memory export service and bucket (see the module docs).
#[derive(Clone)]
pub struct FakeExports {
    bucket: String,
    state: Arc<Mutex<State>>,
}

impl FakeExports {
    /// The same service and objects, seen as bucket `bucket`: what a reader configured with
    /// another bucket than the export's sees.
    pub fn as_bucket(&self, bucket: &str) -> Self {
        FakeExports {
            bucket: bucket.to_string(),
            state: Arc::clone(&self.state),
        }
    }

    /// Exports of `source` into bucket `bucket`; PITR on, 3 files, one `IN_PROGRESS` describe.
    pub fn new(bucket: &str, source: impl ExportSource) -> Self {
        FakeExports {
            bucket: bucket.to_string(),
            state: Arc::new(Mutex::new(State {
                source: Arc::new(source),
                objects: BTreeMap::new(),
                exports: BTreeMap::new(),
                calls: ExportCalls::default(),
                recovery: Recovery {
                    enabled: true,
                    earliest_ms: Some(0),
                    latest_ms: None,
                },
                files: 3,
                in_progress_describes: 1,
                fail_next: None,
                miscount_next: false,
                deny_gets: None,
                fail_gets: Vec::new(),
                cut_bodies: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spreads each export's items over `files` data files.
    pub fn with_files(self, files: usize) -> Self {
        self.lock().files = files.max(1);
        self
    }

    /// Each export answers `IN_PROGRESS` to its first `describes` describes.
    pub fn in_progress_for(self, describes: u32) -> Self {
        self.lock().in_progress_describes = describes;
        self
    }

    /// Point-in-time recovery as `DescribeContinuousBackups` reports it.
    pub fn set_recovery(&self, recovery: Recovery) {
        self.lock().recovery = recovery;
    }

    /// The next export started ends `FAILED` with `code` and `message`.
    pub fn fail_next_export(&self, code: &str, message: &str) {
        self.lock().fail_next = Some((code.into(), message.into()));
    }

    /// The next export's first data file is listed with one item more than it holds.
    pub fn miscount_next_export(&self) {
        self.lock().miscount_next = true;
    }

    /// Every `GetObject` answers `AccessDenied` with `message` (`None` lifts it).
    pub fn deny_gets(&self, message: Option<&str>) {
        self.lock().deny_gets = message.map(str::to_string);
    }

    /// The next `GetObject` requests fail with these errors, in order.
    pub fn fail_gets(&self, errors: impl IntoIterator<Item = ApiError>) {
        self.lock().fail_gets.extend(errors);
    }

    /// The next `GetObject` of a key ending in `suffix` breaks off after `bytes` bytes of its
    /// body with a connection error (a transfer cut short).
    pub fn cut_next_body(&self, suffix: &str, bytes: usize) {
        self.lock().cut_bodies.push((suffix.to_string(), bytes));
    }

    /// What was asked so far.
    pub fn calls(&self) -> ExportCalls {
        self.lock().calls.clone()
    }

    /// The keys of every object in the bucket.
    pub fn keys(&self) -> Vec<String> {
        self.lock().objects.keys().cloned().collect()
    }

    /// Replaces a stored object (a test damaging a file).
    pub fn put(&self, key: &str, bytes: Vec<u8>) {
        self.lock().objects.insert(key.to_string(), bytes);
    }

    /// A stored object.
    pub fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().objects.get(key).cloned()
    }
}

fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

fn gzip(lines: &[String]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    for line in lines {
        // Writing into a Vec cannot fail.
        let _ = encoder.write_all(line.as_bytes());
        let _ = encoder.write_all(b"\n");
    }
    encoder.finish().unwrap_or_default()
}

fn change_line(change: &FakeChange) -> String {
    let mut line = json!({
        "Metadata": {"WriteTimestampMicros": {"N": change.micros.to_string()}},
        "Keys": item_to_typed_json(&change.keys),
    });
    if let Some(new) = &change.new {
        line["NewImage"] = item_to_typed_json(new);
    }
    if let Some(old) = &change.old {
        line["OldImage"] = item_to_typed_json(old);
    }
    line.to_string()
}

impl State {
    /// Writes the export's files and manifests (AWS's layout) and returns its summary key and
    /// item count.
    fn write(
        &mut self,
        bucket: &str,
        request: &StartExport,
        arn: &str,
        export_time_ms: i64,
    ) -> (String, u64) {
        let id = arn.rsplit('/').next().unwrap_or("export").to_string();
        let base = format!("{}/AWSDynamoDB/{id}", request.prefix.trim_end_matches('/'));
        let lines: Vec<String> = match request.kind {
            ExportKind::Full { .. } => self
                .source
                .items()
                .iter()
                .map(|item| json!({"Item": item_to_typed_json(item)}).to_string())
                .collect(),
            ExportKind::Incremental { from_ms, to_ms } => self
                .source
                .changes(from_ms, to_ms)
                .iter()
                .map(change_line)
                .collect(),
        };
        let mut manifest = String::new();
        let files = self.files.max(1);
        let miscount = std::mem::take(&mut self.miscount_next);
        for n in 0..files {
            let mine: Vec<String> = lines.iter().skip(n).step_by(files).cloned().collect();
            let stored = gzip(&mine);
            let key = format!("{base}/data/{id}-{n:04}.json.gz");
            let count = mine.len() + usize::from(miscount && n == 0);
            manifest.push_str(
                &json!({
                    "itemCount": count,
                    "md5Checksum": STANDARD.encode(Md5::digest(&stored)),
                    "etag": format!("{}-1", stored.len()),
                    "dataFileS3Key": key,
                })
                .to_string(),
            );
            manifest.push('\n');
            self.objects.insert(key, stored);
        }
        let files_key = format!("{base}/manifest-files.json");
        self.objects
            .insert(files_key.clone(), manifest.into_bytes());
        let mut summary = json!({
            "version": "2020-06-30",
            "exportArn": arn,
            "startTime": rfc3339(export_time_ms),
            "endTime": rfc3339(export_time_ms),
            "tableArn": request.table_arn,
            "tableId": "fake-table-id",
            "exportTime": rfc3339(export_time_ms),
            "s3Bucket": bucket,
            "s3Prefix": request.prefix,
            "s3SseAlgorithm": "AES256",
            "s3SseKmsKeyId": null,
            "manifestFilesS3Key": files_key,
            "billedSizeBytes": 0,
            "itemCount": lines.len() + usize::from(miscount),
            "outputFormat": "DYNAMODB_JSON",
        });
        // AWS's incremental summary has a window instead of an exportTime.
        if let ExportKind::Incremental { from_ms, to_ms } = request.kind {
            if let Some(fields) = summary.as_object_mut() {
                fields.remove("exportTime");
            }
            summary["version"] = json!("2023-08-01");
            summary["exportFromTime"] = json!(rfc3339(from_ms));
            summary["exportToTime"] = json!(rfc3339(to_ms));
            summary["outputView"] = json!("NEW_AND_OLD_IMAGES");
            summary["exportType"] = json!("INCREMENTAL_EXPORT");
        }
        let summary_key = format!("{base}/manifest-summary.json");
        self.objects
            .insert(summary_key.clone(), summary.to_string().into_bytes());
        (summary_key, lines.len() as u64)
    }
}

impl ExportApi for FakeExports {
    /// The recovery set (PITR on, restorable from 0), its latest restorable time the source's
    /// clock now unless one was set: DynamoDB's clock, not this machine's.
    async fn recovery(&self, _table_name: &str) -> Result<Recovery, ApiError> {
        let state = self.lock();
        let mut recovery = state.recovery.clone();
        recovery.latest_ms = recovery.latest_ms.or_else(|| Some(state.source.now_ms()));
        Ok(recovery)
    }

    async fn start_export(&self, request: &StartExport) -> Result<ExportStatus, ApiError> {
        let mut state = self.lock();
        state.calls.start_requests.push(request.clone());
        if !state.recovery.enabled {
            return Err(ApiError::from_code(
                Some("PointInTimeRecoveryUnavailableException".into()),
                "Point in time recovery is not enabled for table",
            ));
        }
        if let Some(export) = state
            .exports
            .values()
            .find(|e| e.token == request.client_token)
        {
            return Ok(export.running.clone());
        }
        state.calls.started += 1;
        let now_ms = state.source.now_ms();
        let (export_time_ms, incremental) = match request.kind {
            ExportKind::Full { at_ms } => (at_ms.unwrap_or(now_ms), false),
            ExportKind::Incremental { to_ms, .. } => (to_ms, true),
        };
        let arn = format!(
            "{}/export/{:014}-{:08x}",
            request.table_arn, now_ms, state.calls.started
        );
        let (summary_key, items) = state.write(&self.bucket, request, &arn, export_time_ms);
        let final_state = match state.fail_next.take() {
            Some((code, message)) => ExportState::Failed {
                code: Some(code),
                message: Some(message),
            },
            None => ExportState::Completed,
        };
        let status = ExportStatus {
            arn: arn.clone(),
            state: ExportState::InProgress,
            table_arn: Some(request.table_arn.clone()),
            incremental,
            export_time_ms: Some(export_time_ms),
            bucket: Some(self.bucket.clone()),
            manifest_key: None,
            item_count: None,
            billed_bytes: None,
            started_ms: Some(now_ms),
        };
        let describes_left = state.in_progress_describes;
        let mut done = status.clone();
        done.state = final_state.clone();
        if final_state == ExportState::Completed {
            done.manifest_key = Some(summary_key);
            done.item_count = Some(items);
            done.billed_bytes = Some(items * 100);
        }
        state.exports.insert(
            arn,
            Export {
                running: status.clone(),
                done,
                token: request.client_token.clone(),
                describes_left,
            },
        );
        Ok(status)
    }

    async fn describe_export(&self, arn: &str) -> Result<ExportStatus, ApiError> {
        let mut state = self.lock();
        state.calls.describes += 1;
        let Some(export) = state.exports.get_mut(arn) else {
            return Err(ApiError::from_code(
                Some("ExportNotFoundException".into()),
                format!("Export not found: {arn}"),
            ));
        };
        if export.describes_left > 0 {
            export.describes_left -= 1;
            return Ok(export.running.clone());
        }
        Ok(export.done.clone())
    }
}

impl ObjectStore for FakeExports {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    async fn get(&self, key: &str) -> Result<ObjectBody, ApiError> {
        let mut state = self.lock();
        state.calls.gets.push(key.to_string());
        if let Some(message) = &state.deny_gets {
            return Err(ApiError::from_code(
                Some("AccessDenied".into()),
                message.clone(),
            ));
        }
        if !state.fail_gets.is_empty() {
            return Err(state.fail_gets.remove(0));
        }
        let cut = state
            .cut_bodies
            .iter()
            .position(|(suffix, _)| key.ends_with(suffix.as_str()))
            .map(|at| state.cut_bodies.remove(at).1);
        match state.objects.get(key) {
            Some(bytes) => match cut {
                Some(at) => {
                    let head = std::io::Cursor::new(bytes[..at.min(bytes.len())].to_vec());
                    let reset = std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "connection reset by peer",
                    );
                    Ok(Box::pin(tokio::io::AsyncReadExt::chain(
                        head,
                        Broken(Some(reset)),
                    )))
                }
                None => Ok(Box::pin(std::io::Cursor::new(bytes.clone()))),
            },
            None => Err(ApiError::from_code(
                Some("NoSuchKey".into()),
                "The specified key does not exist.",
            )),
        }
    }
}

/// A body that fails once with its error, then ends.
struct Broken(Option<std::io::Error>);

impl tokio::io::AsyncRead for Broken {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(match self.0.take() {
            Some(error) => Err(error),
            None => Ok(()),
        })
    }
}
