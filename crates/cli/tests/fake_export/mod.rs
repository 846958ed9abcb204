//! A scripted fake of DynamoDB's export API in front of a real emulator (moto or dynoxide).
//!
//! [`FakeExport::start`] serves HTTP on a loopback port. It answers three DynamoDB JSON 1.0
//! operations itself — `DescribeContinuousBackups`, `ExportTableToPointInTime` and
//! `DescribeExport` — and forwards every other request (DynamoDB, DynamoDB Streams, S3, anything)
//! unchanged to the upstream emulator, recording the `x-amz-target` of each. moto routes by the
//! SigV4 `Authorization` header, so with moto upstream the fake's URL also serves S3 path-style.
//!
//! It runs on the harness's runtime (`common::rt()`), so a test binary declares `mod common;`
//! beside `mod fake_export;`. Knobs and counters are plain methods, usable from sync and async
//! tests alike (the S3 helpers block on `common::rt()`: sync tests only):
//!
//! ```ignore
//! let moto = Emulator::Moto.start();
//! fake_export::create_bucket(&moto.endpoint, "exports");
//! let fake = FakeExport::start(&moto.endpoint, &moto.endpoint);
//! fake.set_in_progress_describes(2);
//! fake.fail_next_export("S3AccessDenied", "Access denied");
//! // … point ddbpipe (or an SDK client) at fake.url() …
//! assert_eq!(fake.exports_started(), 1);
//! assert_eq!(fake.forwarded("Scan"), 0);
//! ```
//!
//! With dynoxide upstream, give the S3 endpoint of a separate moto: S3 requests sent to the
//! fake's URL are forwarded to dynoxide, which does not speak S3.
//!
//! # What an export writes (AWS's documented layout)
//! Under `<S3Prefix>/AWSDynamoDB/<export id>/` in the request's bucket, through the fake's own
//! S3 client (path-style, at the S3 endpoint given at start):
//! - `_started` (empty), when the export starts;
//! - `data/<26 random chars>.json.gz`: gzip of JSON lines, when the export starts (a full export
//!   scans the upstream table then, consistently, whatever its `ExportTime` says; an
//!   incremental one reads the table's stream from `TRIM_HORIZON` then). Lines are spread over
//!   [`DEFAULT_DATA_FILES`] files (a knob) by a hash of the item's key, so some files may hold
//!   nothing, as an empty partition's do. An incremental export's data files go to the shared
//!   `<S3Prefix>/AWSDynamoDB/data/`, as AWS's;
//! - `manifest-files.json` (a line per data file: `itemCount`, `md5Checksum` = base64 of the MD5
//!   of the stored file, `etag`, `dataFileS3Key`), `manifest-summary.json`, and their
//!   `.checksum` files (the manifest's MD5 in hex), only when the export turns `COMPLETED`.
//!
//! A full export's summary has AWS's documented members (`version` `2020-06-30`, `exportTime`,
//! no `exportType` unless [`FakeExport::set_full_summary_export_type`]); an incremental one's has
//! `version` `2023-08-01`, `exportFromTime`, `exportToTime`, `outputView` and `exportType`
//! `INCREMENTAL_EXPORT`, and no `exportTime`, as AWS's.
//!
//! # Incremental exports
//! The lines are `{"Metadata":{"WriteTimestampMicros":{"N":…}},"Keys":…,"OldImage":…,
//! "NewImage":…}`, one per key changed in `[ExportFromTime, ExportToTime)` (by the stream
//! record's `ApproximateCreationDateTime`), compacted as AWS's are: `OldImage` is the item before
//! its first change in the window (absent if it did not exist), `NewImage` the item after its
//! last (absent if deleted), the timestamp the last change's. A key inserted and deleted within
//! the window leaves no line. `NEW_IMAGE` exports leave out `OldImage`.
//!
//! # Trimming the stream
//! [`FakeExport::trim_stream_before`] makes the stream behind the fake lose its older records, as
//! DynamoDB's retention does: forwarded `GetRecords` answers leave them out and positions at them
//! are refused with `TrimmedDataAccessException`. A gap a test can make on an emulator whose
//! stream never trims. [`FakeExport::set_stream_retention`] trims on a rolling clock instead, as
//! DynamoDB's retention does, only sooner.
//!
//! # Status
//! An export answers `IN_PROGRESS` to its first N `DescribeExport` calls (knob, default 1), then
//! `COMPLETED` (or `FAILED`, scripted or when writing to S3 failed: `FailureCode` is then the S3
//! error code). Timestamps are epoch seconds with ms, as AWS's.
//!
//! # A bucket the credentials may not read
//! [`FakeExport::deny_bucket`] answers every forwarded S3 request (no `x-amz-target`) to a
//! path in that bucket with S3's `403 AccessDenied`, as S3 does for a role without the rights.
//!
//! # A lake's S3 and Glue failing now and then
//! [`FakeExport::fail_lake_requests`] fails every nth S3 or Glue request forwarded through the
//! fake: refused (`503 SlowDown`, `ThrottlingException`) or forwarded with its answer replaced
//! by a 500 (the request done, the client not told): what a lake sink's retries meet. S3
//! Tables' requests, which carry no `x-amz-target` either, are answered as S3's (an error body
//! its client cannot read: a failure without a code, transient as a lost answer is).
//!
//! # Refusals (HTTP 400, AWS's codes)
//! - `ExportConflictException`: a `ClientToken` used before with other parameters (the same
//!   token and parameters return the first export, starting none);
//! - `PointInTimeRecoveryUnavailableException`: PITR off ([`FakeExport::set_pitr`]);
//! - `InvalidExportTimeException`: an `ExportTime` or window outside
//!   `[EarliestRestorableDateTime, now]`;
//! - `ValidationException`: a missing member, `ION`, a window not longer than 0, shorter than
//!   the minimum (15 minutes, a knob) or longer than 24 hours, an incremental export of a table
//!   without a stream;
//! - `TableNotFoundException`; `ExportNotFoundException` (`DescribeExport` of an unknown ARN).

#![allow(dead_code)] // Each test binary uses a different part of the fake.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use md5::{Digest, Md5};
use serde_json::{Map, Value, json};

use crate::common::rt;

/// How many data files an export writes unless [`FakeExport::set_data_files`] says otherwise.
pub const DEFAULT_DATA_FILES: usize = 3;
/// AWS's shortest incremental export window.
pub const MIN_INCREMENTAL_WINDOW: Duration = Duration::from_secs(15 * 60);
/// AWS's longest incremental export window.
pub const MAX_INCREMENTAL_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

const AMZ_JSON: &str = "application/x-amz-json-1.0";
const TARGET_PREFIX: &str = "DynamoDB_20120810.";
const STREAMS_TARGET_PREFIX: &str = "DynamoDBStreams_20120810.";
/// The secret of the fake's own clients (emulators check no signatures).
const SECRET: &str = "testing";

/// One request the fake forwarded upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// `x-amz-target` (`DynamoDB_20120810.Scan`, `DynamoDBStreams_20120810.GetRecords`), `None`
    /// for S3 and other REST requests.
    pub target: Option<String>,
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query.
    pub path: String,
}

/// The running fake. Dropping it stops the server.
pub struct FakeExport {
    url: String,
    inner: Arc<Inner>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeExport {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Inner {
    /// `host:port` of the upstream emulator.
    upstream_addr: String,
    upstream_url: String,
    s3_endpoint: String,
    started_ms: i64,
    state: Mutex<State>,
    clients: Mutex<HashMap<(String, String), Clients>>,
    /// Serialises completions, so one export's manifests are written once.
    completing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Clients {
    dynamodb: aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
    s3: aws_sdk_s3::Client,
}

struct Knobs {
    pitr: bool,
    earliest_ms: Option<i64>,
    in_progress_describes: u32,
    data_files: usize,
    min_window: Duration,
    fail_next: Option<(String, String)>,
    miscount_next: bool,
    damage_next: u32,
    full_summary_export_type: bool,
    empty_files_zero_bytes: bool,
    trim_before_ms: Option<i64>,
    /// A rolling trim point: records older than this are gone.
    retention: Option<Duration>,
    denied_bucket: Option<String>,
    /// How long a `StartExport` is held before the export's work begins (default none).
    start_delay: Duration,
    /// Every this many S3 and Glue requests one fails ([`FakeExport::fail_lake_requests`]).
    lake_faults_every: Option<usize>,
}

impl Knobs {
    /// Where the stream is trimmed now (unix ms): the later of the fixed trim point and the
    /// retention's.
    fn trim_ms(&self) -> Option<i64> {
        let rolling = self.retention.map(|kept| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.saturating_sub(kept).as_millis() as i64
        });
        self.trim_before_ms.max(rolling)
    }
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            pitr: true,
            earliest_ms: None,
            in_progress_describes: 1,
            data_files: DEFAULT_DATA_FILES,
            min_window: MIN_INCREMENTAL_WINDOW,
            fail_next: None,
            miscount_next: false,
            damage_next: 0,
            full_summary_export_type: false,
            empty_files_zero_bytes: false,
            trim_before_ms: None,
            retention: None,
            denied_bucket: None,
            start_delay: Duration::ZERO,
            lake_faults_every: None,
        }
    }
}

#[derive(Default)]
struct State {
    knobs: Knobs,
    exports: Vec<Export>,
    /// ClientToken → index into `exports`.
    tokens: HashMap<String, usize>,
    /// ClientTokens of exports being started: a request repeating one waits for it, so
    /// requests with one token start one export however they interleave, as AWS's.
    starting: std::collections::HashSet<String>,
    exports_started: usize,
    describe_calls: usize,
    backups_calls: usize,
    forwarded: Vec<Forwarded>,
    /// S3 and Glue requests forwarded, and the faults of them (refused, answer lost).
    lake_requests: usize,
    lake_faults: (usize, usize),
    /// `ApproximateCreationDateTime` (unix ms) of every stream record a forwarded `GetRecords`
    /// answered, by sequence number.
    record_times: HashMap<String, i64>,
}

#[derive(Clone, Copy, PartialEq)]
enum View {
    NewAndOld,
    New,
}

impl View {
    fn name(self) -> &'static str {
        match self {
            View::NewAndOld => "NEW_AND_OLD_IMAGES",
            View::New => "NEW_IMAGE",
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Full {
        at_ms: i64,
    },
    Incremental {
        from_ms: i64,
        to_ms: i64,
        view: View,
    },
}

#[derive(Clone)]
enum Status {
    InProgress,
    Completed,
    Failed(Failure),
}

/// What an export will turn into once its describes in progress are used up.
#[derive(Clone)]
enum Outcome {
    Files {
        files: Vec<DataFile>,
        item_count: u64,
        billed_bytes: u64,
    },
    Fail(Failure),
}

/// `FailureCode` and `FailureMessage`.
#[derive(Clone)]
struct Failure {
    code: String,
    message: String,
}

#[derive(Clone)]
struct DataFile {
    key: String,
    /// What the manifest says (off by one for a miscounted file).
    item_count: u64,
    md5: String,
    etag: String,
}

#[derive(Clone)]
struct Export {
    arn: String,
    id: String,
    /// The request without `ClientToken`, defaults filled: what idempotency compares.
    params: Value,
    client_token: String,
    table_arn: String,
    table_id: String,
    bucket: String,
    prefix: Option<String>,
    bucket_owner: Option<String>,
    sse_algorithm: String,
    sse_kms_key_id: Option<String>,
    kind: Kind,
    start_ms: i64,
    end_ms: Option<i64>,
    status: Status,
    describes: u32,
    in_progress_for: u32,
    outcome: Outcome,
    manifest_key: Option<String>,
    /// The S3 client's access key and region (the request's).
    access: (String, String),
    export_type_in_summary: bool,
}

/// A DynamoDB error answer.
struct AwsError {
    status: StatusCode,
    code: String,
    message: String,
}

impl AwsError {
    fn bad(code: &str, message: impl Into<String>) -> Self {
        AwsError {
            status: StatusCode::BAD_REQUEST,
            code: code.to_string(),
            message: message.into(),
        }
    }

    fn validation(message: impl Into<String>) -> Self {
        AwsError::bad("ValidationException", message)
    }

    fn internal(message: impl Into<String>) -> Self {
        AwsError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "InternalServerError".to_string(),
            message: message.into(),
        }
    }
}

type Answer = Result<Value, AwsError>;

impl FakeExport {
    /// Starts the fake on a free loopback port in front of the emulator at `upstream`
    /// (`http://127.0.0.1:PORT`), writing exports through the S3 endpoint `s3_endpoint` (moto's;
    /// the same URL when moto is the upstream too).
    pub fn start(upstream: &str, s3_endpoint: &str) -> FakeExport {
        // Bound here, served on the harness's runtime: `start` works in sync and async tests.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let upstream_addr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let inner = Arc::new(Inner {
            upstream_addr,
            upstream_url: upstream.trim_end_matches('/').to_string(),
            s3_endpoint: s3_endpoint.trim_end_matches('/').to_string(),
            started_ms: now_ms(),
            state: Mutex::new(State::default()),
            clients: Mutex::new(HashMap::new()),
            completing: tokio::sync::Mutex::new(()),
        });
        let serving = inner.clone();
        let server = rt().spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let inner = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let inner = inner.clone();
                        async move { Ok::<_, Infallible>(handle(&inner, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeExport { url, inner, server }
    }

    /// `http://127.0.0.1:PORT`: the endpoint to give the client instead of the emulator's.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// Point-in-time recovery on (the default) or off, for every table. Off:
    /// `DescribeContinuousBackups` says `DISABLED` and exports are refused with
    /// `PointInTimeRecoveryUnavailableException`.
    pub fn set_pitr(&self, enabled: bool) {
        self.state().knobs.pitr = enabled;
    }

    /// `EarliestRestorableDateTime` in unix ms; `None` (the default): the table's
    /// `CreationDateTime` (or the fake's start when the emulator reports none). Export times
    /// and windows before it are refused with `InvalidExportTimeException`.
    pub fn set_earliest_restorable_ms(&self, ms: Option<i64>) {
        self.state().knobs.earliest_ms = ms;
    }

    /// The stream behind the fake keeps no record created before `ms` (unix ms), as DynamoDB
    /// trims records after 24 h: forwarded `GetRecords` answers leave them out, and
    /// `GetShardIterator` `AFTER_SEQUENCE_NUMBER` / `AT_SEQUENCE_NUMBER` of such a record (one a
    /// forwarded `GetRecords` answered) is refused with `TrimmedDataAccessException`.
    /// Incremental exports still see every record (they read the upstream directly).
    pub fn trim_stream_before(&self, ms: i64) {
        self.state().knobs.trim_before_ms = Some(ms);
    }

    /// The stream behind the fake keeps records for `kept` only, as DynamoDB's does for 24 h:
    /// a rolling [`FakeExport::trim_stream_before`].
    pub fn set_stream_retention(&self, kept: Duration) {
        self.state().knobs.retention = Some(kept);
    }

    /// `StartExport` requests from now on are held `delay` before they are answered (and
    /// counted in [`FakeExport::exports_started`] when they arrive).
    pub fn delay_export_starts(&self, delay: Duration) {
        self.state().knobs.start_delay = delay;
    }

    /// Exports started from now on answer `IN_PROGRESS` to their first `n` `DescribeExport`
    /// calls (default 1), then `COMPLETED` or `FAILED`.
    pub fn set_in_progress_describes(&self, n: u32) {
        self.state().knobs.in_progress_describes = n;
    }

    /// How many data files exports started from now on write (default 3; at least 1).
    pub fn set_data_files(&self, n: usize) {
        self.state().knobs.data_files = n.max(1);
    }

    /// The shortest incremental window accepted (default AWS's 15 minutes); tests set
    /// `Duration::ZERO` (a window must still end after it starts).
    pub fn set_min_incremental_window(&self, min: Duration) {
        self.state().knobs.min_window = min;
    }

    /// Every S3 request through the fake to `bucket` is answered `403 AccessDenied` (the
    /// export itself still writes there: its writer talks to the S3 endpoint directly).
    pub fn deny_bucket(&self, bucket: &str) {
        self.state().knobs.denied_bucket = Some(bucket.to_string());
    }

    /// Every `every`th S3 or Glue request through the fake fails, in turn: refused without
    /// being forwarded (S3's `503 SlowDown`, Glue's `ThrottlingException`), or forwarded and
    /// its answer replaced by a 500 (`InternalError`, `InternalServiceException`): done, but
    /// the client cannot know it.
    pub fn fail_lake_requests(&self, every: usize) {
        self.state().knobs.lake_faults_every = Some(every.max(1));
    }

    /// The faults [`fail_lake_requests`](Self::fail_lake_requests) made: (refused, answers
    /// lost).
    pub fn lake_faults(&self) -> (usize, usize) {
        self.state().lake_faults
    }

    /// The next export started fails: `FAILED` with this `FailureCode` and `FailureMessage`
    /// (after its describes in progress). It writes only `_started`.
    pub fn fail_next_export(&self, code: &str, message: &str) {
        self.state().knobs.fail_next = Some((code.to_string(), message.to_string()));
    }

    /// The next export started says in `manifest-files.json` that its first data file holds one
    /// line more than it does (and counts that line in the summary's and the description's
    /// `itemCount`, so only the file itself disagrees).
    pub fn miscount_next_export(&self) {
        self.state().knobs.miscount_next = true;
    }

    /// The next export started stores its first data file with one value changed after its
    /// MD5 was taken (the last number `{"N":"…"}` of the file gets a leading `9`): the
    /// manifest's `md5Checksum` is then stale, as for a file damaged in the bucket.
    pub fn damage_next_export(&self) {
        self.damage_next_exports(1);
    }

    /// The next `n` exports started are damaged as [`FakeExport::damage_next_export`] says.
    pub fn damage_next_exports(&self, n: u32) {
        self.state().knobs.damage_next = n;
    }

    /// Full exports' summaries carry `"exportType":"FULL_EXPORT"` (default off: AWS's
    /// documented full summary has no `exportType`).
    pub fn set_full_summary_export_type(&self, on: bool) {
        self.state().knobs.full_summary_export_type = on;
    }

    /// Data files without lines are stored as 0-byte objects instead of a gzip of nothing
    /// (default off).
    pub fn set_empty_files_zero_bytes(&self, on: bool) {
        self.state().knobs.empty_files_zero_bytes = on;
    }

    /// Exports started (an idempotent repeat of a ClientToken starts none).
    pub fn exports_started(&self) -> usize {
        self.state().exports_started
    }

    /// `DescribeExport` calls answered (including errors).
    pub fn describe_calls(&self) -> usize {
        self.state().describe_calls
    }

    /// `DescribeContinuousBackups` calls answered.
    pub fn backups_calls(&self) -> usize {
        self.state().backups_calls
    }

    /// How many forwarded requests had `x-amz-target` `op`: the whole value
    /// (`DynamoDB_20120810.Scan`) or the operation (`Scan`, `GetRecords`).
    pub fn forwarded(&self, op: &str) -> usize {
        self.state()
            .forwarded
            .iter()
            .filter(|f| {
                f.target.as_deref().is_some_and(|t| {
                    t == op || t.rsplit_once('.').is_some_and(|(_, name)| name == op)
                })
            })
            .count()
    }

    /// Every forwarded request, in arrival order.
    pub fn forwarded_requests(&self) -> Vec<Forwarded> {
        self.state().forwarded.clone()
    }

    /// The ARNs of the exports started, in order.
    pub fn export_arns(&self) -> Vec<String> {
        self.state().exports.iter().map(|e| e.arn.clone()).collect()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The fake's clients for the access key and region of a request.
    fn clients(&self, access: &(String, String)) -> Clients {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        clients
            .entry(access.clone())
            .or_insert_with(|| {
                let (key, region) = access;
                Clients {
                    dynamodb: dynamodb_client(&self.upstream_url, region, key),
                    streams: streams_client(&self.upstream_url, region, key),
                    s3: s3_client_in(&self.s3_endpoint, region, key),
                }
            })
            .clone()
    }
}

fn credentials(key: &str) -> aws_sdk_dynamodb::config::Credentials {
    aws_sdk_dynamodb::config::Credentials::new(key.to_string(), SECRET, None, None, "fake-export")
}

fn dynamodb_client(endpoint: &str, region: &str, key: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .credentials_provider(credentials(key))
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

fn streams_client(endpoint: &str, region: &str, key: &str) -> aws_sdk_dynamodbstreams::Client {
    let config = aws_sdk_dynamodbstreams::Config::builder()
        .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodbstreams::config::Region::new(
            region.to_string(),
        ))
        .endpoint_url(endpoint)
        .credentials_provider(credentials(key))
        .build();
    aws_sdk_dynamodbstreams::Client::from_conf(config)
}

fn s3_client_in(endpoint: &str, region: &str, key: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(credentials(key))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

// ---------------------------------------------------------------------------------------------
// S3 helpers for tests (static test credentials, us-east-1, path-style).

/// An S3 client of `endpoint` (moto's, or the fake's when moto is its upstream).
pub fn s3_client(endpoint: &str) -> aws_sdk_s3::Client {
    s3_client_in(endpoint, "us-east-1", "testing")
}

/// Creates `bucket` at `endpoint`.
pub fn create_bucket(endpoint: &str, bucket: &str) {
    rt().block_on(s3_client(endpoint).create_bucket().bucket(bucket).send())
        .expect("CreateBucket");
}

/// The bytes of `bucket/key`, `None` when there is no such object.
pub fn read_object(endpoint: &str, bucket: &str, key: &str) -> Option<Vec<u8>> {
    rt().block_on(async {
        let out = s3_client(endpoint)
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await;
        match out {
            Ok(out) => Some(
                out.body
                    .collect()
                    .await
                    .expect("the object's body reads")
                    .into_bytes()
                    .to_vec(),
            ),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => None,
            Err(e) => panic!("GetObject {bucket}/{key}: {e:?}"),
        }
    })
}

/// The keys under `prefix` in `bucket`, sorted.
pub fn list_keys(endpoint: &str, bucket: &str, prefix: &str) -> Vec<String> {
    rt().block_on(async {
        let client = s3_client(endpoint);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let out = client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(prefix)
                .set_continuation_token(token)
                .send()
                .await
                .expect("ListObjectsV2");
            keys.extend(
                out.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_string)),
            );
            token = out.next_continuation_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        keys.sort();
        keys
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP.

async fn handle(inner: &Inner, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("unreadable body: {e}")),
    };
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let own = match target
        .as_deref()
        .and_then(|t| t.strip_prefix(TARGET_PREFIX))
    {
        Some(
            op @ ("DescribeContinuousBackups" | "ExportTableToPointInTime" | "DescribeExport"),
        ) if parts.method == hyper::Method::POST => Some(op),
        _ => None,
    };
    let Some(op) = own else {
        inner.lock().forwarded.push(Forwarded {
            target: target.clone(),
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_string(), |p| p.to_string()),
        });
        if target.is_none()
            && let Some(bucket) = inner.lock().knobs.denied_bucket.clone()
            && parts.uri.path().trim_start_matches('/').split('/').next() == Some(bucket.as_str())
        {
            return access_denied(&bucket);
        }
        let glue = target.as_deref().is_some_and(|t| t.starts_with("AWSGlue."));
        if target.is_none() || glue {
            return lake_request(inner, parts, body, glue).await;
        }
        let streams_op = target
            .as_deref()
            .and_then(|t| t.strip_prefix(STREAMS_TARGET_PREFIX));
        if streams_op == Some("GetShardIterator")
            && let Some(refused) = trimmed_iterator(inner, &body)
        {
            return refused;
        }
        let response = forward(inner, parts, body).await;
        if streams_op == Some("GetRecords") {
            return trim_records(inner, response).await;
        }
        return response;
    };
    let access = access_of(&parts.headers);
    let answer = match serde_json::from_slice::<Value>(&body) {
        Err(e) => Err(AwsError::bad(
            "SerializationException",
            format!("the body is not JSON: {e}"),
        )),
        Ok(input) => match op {
            "DescribeContinuousBackups" => describe_backups(inner, &access, &input).await,
            "ExportTableToPointInTime" => start_export(inner, &access, &input).await,
            _ => describe_export(inner, &input).await,
        },
    };
    match answer {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(error) => {
            let kind = if error.code == "ValidationException" {
                "com.amazon.coral.validate"
            } else {
                "com.amazonaws.dynamodb.v20120810"
            };
            json_response(
                error.status,
                &json!({"__type": format!("{kind}#{}", error.code), "message": error.message}),
            )
        }
    }
}

/// The access key and region of a SigV4 `Authorization` header (`testing`, `us-east-1` when
/// there is none).
fn access_of(headers: &hyper::HeaderMap) -> (String, String) {
    let credential = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|auth| auth.split("Credential=").nth(1))
        .and_then(|rest| rest.split([',', ' ']).next())
        .map(|scope| scope.split('/').map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    match credential.as_slice() {
        [key, _date, region, ..] => (key.clone(), region.clone()),
        _ => ("testing".to_string(), "us-east-1".to_string()),
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(AMZ_JSON),
    );
    if let Ok(id) = HeaderValue::from_str(&format!("{:032X}", rand::random::<u128>())) {
        headers.insert("x-amzn-requestid", id);
    }
    response
}

/// S3's answer to a request the credentials may not make.
/// An S3 or Glue request: forwarded, unless [`FakeExport::fail_lake_requests`] makes it fail.
async fn lake_request(
    inner: &Inner,
    parts: hyper::http::request::Parts,
    body: Bytes,
    glue: bool,
) -> Response<Full<Bytes>> {
    let fault = {
        let mut state = inner.lock();
        state.lake_requests += 1;
        let n = state.lake_requests;
        let every = state.knobs.lake_faults_every;
        match every.filter(|every| n.is_multiple_of(*every)) {
            None => None,
            Some(_) => {
                let (refused, lost) = &mut state.lake_faults;
                let refuse = *refused <= *lost;
                *(if refuse { refused } else { lost }) += 1;
                Some(refuse)
            }
        }
    };
    let failed = |status: StatusCode, s3: (&str, &str), glue_code: &str| {
        let (body, kind) = match glue {
            true => (
                format!(r#"{{"__type": "{glue_code}", "message": "fake_export's fault"}}"#),
                "application/x-amz-json-1.1",
            ),
            false => (
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code>\
                     <Message>{}</Message></Error>",
                    s3.0, s3.1
                ),
                "application/xml",
            ),
        };
        let mut response = plain(status, &body);
        let kind = hyper::header::HeaderValue::from_static(kind);
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, kind);
        response
    };
    match fault {
        Some(true) if glue => failed(StatusCode::BAD_REQUEST, ("", ""), "ThrottlingException"),
        Some(true) => failed(
            StatusCode::SERVICE_UNAVAILABLE,
            ("SlowDown", "Please reduce your request rate."),
            "",
        ),
        Some(false) => {
            let _done = forward(inner, parts, body).await;
            failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                (
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                ),
                "InternalServiceException",
            )
        }
        None => forward(inner, parts, body).await,
    }
}

fn access_denied(bucket: &str) -> Response<Full<Bytes>> {
    let mut response = plain(
        StatusCode::FORBIDDEN,
        &format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>\
             <Message>Access Denied</Message><BucketName>{bucket}</BucketName></Error>"
        ),
    );
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    response
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_string())));
    *response.status_mut() = status;
    response
}

/// `TrimmedDataAccessException` for a `GetShardIterator` after or at a record created before
/// the trim point ([`FakeExport::trim_stream_before`]).
fn trimmed_iterator(inner: &Inner, body: &Bytes) -> Option<Response<Full<Bytes>>> {
    let input: Value = serde_json::from_slice(body).ok()?;
    let kind = input["ShardIteratorType"].as_str()?;
    if !matches!(kind, "AFTER_SEQUENCE_NUMBER" | "AT_SEQUENCE_NUMBER") {
        return None;
    }
    let seq = input["SequenceNumber"].as_str()?;
    let state = inner.lock();
    let trim = state.knobs.trim_ms()?;
    let created = *state.record_times.get(seq)?;
    (created < trim).then(|| {
        json_response(
            StatusCode::BAD_REQUEST,
            &json!({
                "__type": "com.amazonaws.dynamodb.v20120810#TrimmedDataAccessException",
                "message": format!("sequence number {seq} is beyond the trim horizon"),
            }),
        )
    })
}

/// Records the creation times of a `GetRecords` answer's records and leaves out those before
/// the trim point.
async fn trim_records(inner: &Inner, response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes());
    let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Full::new(bytes));
    };
    let created = |record: &Value| {
        record["dynamodb"]["ApproximateCreationDateTime"]
            .as_f64()
            .map(|s| (s * 1000.0) as i64)
    };
    let mut state = inner.lock();
    let trim = state.knobs.trim_ms();
    let Some(records) = answer["Records"].as_array_mut() else {
        return Response::from_parts(parts, Full::new(bytes));
    };
    for record in records.iter() {
        if let (Some(seq), Some(at)) = (
            record["dynamodb"]["SequenceNumber"].as_str(),
            created(record),
        ) {
            state.record_times.insert(seq.to_string(), at);
        }
    }
    if let Some(trim) = trim {
        records.retain(|record| created(record).is_none_or(|at| at >= trim));
    }
    drop(state);
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(parts, Full::new(Bytes::from(answer.to_string())))
}

/// Sends the request as it came to the upstream and hands back its answer.
async fn forward(
    inner: &Inner,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> Response<Full<Bytes>> {
    match try_forward(inner, parts, body).await {
        Ok(response) => response,
        Err(e) => plain(
            StatusCode::BAD_GATEWAY,
            &format!("fake_export: the upstream did not answer: {e}"),
        ),
    }
}

/// Hop-by-hop headers: the fake re-frames bodies, so these are not passed on.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "transfer-encoding" | "upgrade" | "proxy-connection" | "te"
    )
}

async fn try_forward(
    inner: &Inner,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(&inner.upstream_addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.to_string());
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(Full::new(body))?;
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            request.headers_mut().append(name.clone(), value.clone());
        }
    }
    let response = sender.send_request(request).await?;
    let (response_parts, response_body) = response.into_parts();
    let bytes = response_body.collect().await?.to_bytes();
    let mut answer = Response::new(Full::new(bytes));
    *answer.status_mut() = response_parts.status;
    for (name, value) in &response_parts.headers {
        if !hop_by_hop(name) {
            answer.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(answer)
}

// ---------------------------------------------------------------------------------------------
// The three operations.

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Epoch seconds, as the JSON protocol writes timestamps.
fn epoch_seconds(ms: i64) -> Value {
    json!(ms as f64 / 1000.0)
}

/// A timestamp member (epoch seconds, maybe fractional) in ms.
fn timestamp_ms(input: &Value, name: &str) -> Result<Option<i64>, AwsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .map(|seconds| Some((seconds * 1000.0).round() as i64))
            .ok_or_else(|| AwsError::validation(format!("{name} is not a timestamp"))),
    }
}

fn string_member(input: &Value, name: &str) -> Option<String> {
    input.get(name).and_then(Value::as_str).map(str::to_string)
}

/// What the fake needs of `DescribeTable`.
struct TableInfo {
    arn: String,
    id: String,
    created_ms: Option<i64>,
    keys: Vec<String>,
    stream_arn: Option<String>,
}

async fn table_info(clients: &Clients, name: &str) -> Result<TableInfo, AwsError> {
    let out = clients
        .dynamodb
        .describe_table()
        .table_name(name)
        .send()
        .await
        .map_err(|e| {
            if e.as_service_error()
                .is_some_and(|e| e.is_resource_not_found_exception())
            {
                AwsError::bad("TableNotFoundException", format!("Table not found: {name}"))
            } else {
                AwsError::internal(format!("DescribeTable {name} upstream: {e:?}"))
            }
        })?;
    let table = out
        .table()
        .ok_or_else(|| AwsError::internal("DescribeTable upstream: no Table"))?;
    let arn = table
        .table_arn()
        .map(str::to_string)
        .unwrap_or_else(|| format!("arn:aws:dynamodb:us-east-1:123456789012:table/{name}"));
    let id = table.table_id().map(str::to_string).unwrap_or_else(|| {
        // moto reports no TableId: a UUID-shaped one derived from the ARN.
        let hex: String = Md5::digest(arn.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        )
    });
    Ok(TableInfo {
        id,
        created_ms: table.creation_date_time().and_then(|t| t.to_millis().ok()),
        keys: table
            .key_schema()
            .iter()
            .map(|k| k.attribute_name().to_string())
            .collect(),
        stream_arn: table.latest_stream_arn().map(str::to_string),
        arn,
    })
}

/// The table name of a table ARN (or of a plain name).
fn table_name_of(arn_or_name: &str) -> String {
    match arn_or_name.split_once(":table/") {
        Some((_, rest)) => rest.split('/').next().unwrap_or(rest).to_string(),
        None => arn_or_name.to_string(),
    }
}

fn earliest_ms(knobs: &Knobs, table: &TableInfo, started_ms: i64) -> i64 {
    knobs.earliest_ms.or(table.created_ms).unwrap_or(started_ms)
}

async fn describe_backups(inner: &Inner, access: &(String, String), input: &Value) -> Answer {
    inner.lock().backups_calls += 1;
    let name = string_member(input, "TableName")
        .ok_or_else(|| AwsError::validation("TableName is required"))?;
    let table = table_info(&inner.clients(access), &table_name_of(&name)).await?;
    let state = inner.lock();
    let pitr = if state.knobs.pitr {
        json!({
            "PointInTimeRecoveryStatus": "ENABLED",
            "RecoveryPeriodInDays": 35,
            "EarliestRestorableDateTime":
                epoch_seconds(earliest_ms(&state.knobs, &table, inner.started_ms)),
            "LatestRestorableDateTime": epoch_seconds(now_ms()),
        })
    } else {
        json!({"PointInTimeRecoveryStatus": "DISABLED"})
    };
    Ok(json!({"ContinuousBackupsDescription": {
        "ContinuousBackupsStatus": "ENABLED",
        "PointInTimeRecoveryDescription": pitr,
    }}))
}

/// The request's parameters with defaults filled and without `ClientToken`.
fn normalized(input: &Value) -> Value {
    let mut params = input.as_object().cloned().unwrap_or_default();
    params.remove("ClientToken");
    params
        .entry("ExportType")
        .or_insert_with(|| json!("FULL_EXPORT"));
    params
        .entry("ExportFormat")
        .or_insert_with(|| json!("DYNAMODB_JSON"));
    if let Some(Value::Object(spec)) = params.get_mut("IncrementalExportSpecification") {
        spec.entry("ExportViewType")
            .or_insert_with(|| json!("NEW_AND_OLD_IMAGES"));
    }
    Value::Object(params)
}

/// An export being started under a ClientToken; the token is free again when it is dropped
/// (the export registered, or refused).
struct Starting<'a> {
    inner: &'a Inner,
    token: String,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.inner.lock().starting.remove(&self.token);
    }
}

async fn start_export(inner: &Inner, access: &(String, String), input: &Value) -> Answer {
    let table_arn_in = string_member(input, "TableArn")
        .ok_or_else(|| AwsError::validation("TableArn is required"))?;
    let bucket = string_member(input, "S3Bucket")
        .ok_or_else(|| AwsError::validation("S3Bucket is required"))?;
    let params = normalized(input);
    let client_token = string_member(input, "ClientToken")
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    loop {
        {
            let mut state = inner.lock();
            if let Some(&index) = state.tokens.get(&client_token) {
                let existing = &state.exports[index];
                if existing.params == params {
                    return Ok(json!({"ExportDescription": description(existing)}));
                }
                return Err(AwsError::bad(
                    "ExportConflictException",
                    format!(
                        "An export with client token {client_token} exists with other parameters: {}",
                        existing.arn
                    ),
                ));
            }
            if state.starting.insert(client_token.clone()) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _starting = Starting {
        inner,
        token: client_token.clone(),
    };
    if params["ExportFormat"] != "DYNAMODB_JSON" {
        return Err(AwsError::validation(format!(
            "the fake writes DYNAMODB_JSON exports only, not {}",
            params["ExportFormat"]
        )));
    }
    let clients = inner.clients(access);
    let table = table_info(&clients, &table_name_of(&table_arn_in)).await?;
    let now = now_ms();
    let (pitr, earliest, data_files, min_window) = {
        let state = inner.lock();
        (
            state.knobs.pitr,
            earliest_ms(&state.knobs, &table, inner.started_ms),
            state.knobs.data_files,
            state.knobs.min_window,
        )
    };
    if !pitr {
        return Err(AwsError::bad(
            "PointInTimeRecoveryUnavailableException",
            format!("Point in time recovery is not enabled for table '{table_arn_in}'"),
        ));
    }
    let kind = export_kind(input, &params, now, earliest, min_window)?;
    if matches!(kind, Kind::Incremental { .. }) && table.stream_arn.is_none() {
        return Err(AwsError::validation(
            "fake_export reads an incremental export's changes from the table's stream, and the \
             table has none",
        ));
    }

    let id = format!("{:014}-{:08x}", now, rand::random::<u32>());
    let arn = format!("{}/export/{id}", table.arn);
    let prefix = string_member(input, "S3Prefix")
        .map(|p| p.trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty());
    let root = match &prefix {
        Some(prefix) => format!("{prefix}/AWSDynamoDB"),
        None => "AWSDynamoDB".to_string(),
    };
    let (fail, miscount, damage, in_progress_for, export_type_in_summary, zero_bytes, delay) = {
        let mut state = inner.lock();
        state.exports_started += 1;
        (
            state.knobs.fail_next.take(),
            std::mem::take(&mut state.knobs.miscount_next),
            {
                let damage = state.knobs.damage_next > 0;
                state.knobs.damage_next = state.knobs.damage_next.saturating_sub(1);
                damage
            },
            state.knobs.in_progress_describes,
            state.knobs.full_summary_export_type,
            state.knobs.empty_files_zero_bytes,
            state.knobs.start_delay,
        )
    };
    tokio::time::sleep(delay).await;
    let started = put(
        &clients.s3,
        &bucket,
        &format!("{root}/{id}/_started"),
        Vec::new(),
    )
    .await;
    let outcome = match (fail, started) {
        (Some((code, message)), _) => Outcome::Fail(Failure { code, message }),
        (None, Err(failure)) => Outcome::Fail(failure),
        (None, Ok(_)) => {
            let lines = match kind {
                Kind::Full { .. } => full_lines(&clients, &table).await,
                Kind::Incremental {
                    from_ms,
                    to_ms,
                    view,
                } => incremental_lines(&clients, &table, from_ms, to_ms, view).await,
            };
            match lines {
                Err(message) => Outcome::Fail(Failure {
                    code: "InternalServerError".to_string(),
                    message,
                }),
                Ok(lines) => {
                    let data_dir = match kind {
                        Kind::Full { .. } => format!("{root}/{id}/data"),
                        Kind::Incremental { .. } => format!("{root}/data"),
                    };
                    write_data_files(
                        &clients.s3,
                        &bucket,
                        &data_dir,
                        lines,
                        data_files,
                        Flaws {
                            miscount,
                            damage,
                            zero_bytes,
                        },
                    )
                    .await
                }
            }
        }
    };
    let export = Export {
        arn,
        id,
        params,
        client_token: client_token.clone(),
        table_arn: table.arn.clone(),
        table_id: table.id.clone(),
        bucket,
        prefix,
        bucket_owner: string_member(input, "S3BucketOwner"),
        sse_algorithm: string_member(input, "S3SseAlgorithm")
            .unwrap_or_else(|| "AES256".to_string()),
        sse_kms_key_id: string_member(input, "S3SseKmsKeyId"),
        kind,
        start_ms: now,
        end_ms: None,
        status: Status::InProgress,
        describes: 0,
        in_progress_for,
        outcome,
        manifest_key: None,
        access: access.clone(),
        export_type_in_summary,
    };
    let answer = json!({"ExportDescription": description(&export)});
    let mut state = inner.lock();
    let index = state.exports.len();
    state.tokens.insert(client_token, index);
    state.exports.push(export);
    Ok(answer)
}

/// What the request asks for, checked against the recovery window `[earliest, now]` and the
/// window rules.
fn export_kind(
    input: &Value,
    params: &Value,
    now: i64,
    earliest: i64,
    min_window: Duration,
) -> Result<Kind, AwsError> {
    match params["ExportType"].as_str() {
        Some("FULL_EXPORT") => {
            let at_ms = timestamp_ms(input, "ExportTime")?.unwrap_or(now);
            if at_ms < earliest || at_ms > now {
                return Err(AwsError::bad(
                    "InvalidExportTimeException",
                    format!(
                        "ExportTime {} is outside the point in time recovery window [{}, {}]",
                        iso(at_ms),
                        iso(earliest),
                        iso(now)
                    ),
                ));
            }
            Ok(Kind::Full { at_ms })
        }
        Some("INCREMENTAL_EXPORT") => {
            let spec = &params["IncrementalExportSpecification"];
            if !spec.is_object() {
                return Err(AwsError::validation(
                    "IncrementalExportSpecification is required for an INCREMENTAL_EXPORT",
                ));
            }
            let from_ms = timestamp_ms(spec, "ExportFromTime")?
                .ok_or_else(|| AwsError::validation("ExportFromTime is required"))?;
            let to_ms = timestamp_ms(spec, "ExportToTime")?.unwrap_or(now);
            let view = match spec["ExportViewType"].as_str() {
                Some("NEW_AND_OLD_IMAGES") => View::NewAndOld,
                Some("NEW_IMAGE") => View::New,
                other => {
                    return Err(AwsError::validation(format!(
                        "ExportViewType {other:?} is not NEW_IMAGE or NEW_AND_OLD_IMAGES"
                    )));
                }
            };
            let window = to_ms - from_ms;
            if window <= 0 {
                return Err(AwsError::validation(
                    "ExportToTime must be after ExportFromTime",
                ));
            }
            if window < min_window.as_millis() as i64 {
                return Err(AwsError::validation(format!(
                    "The incremental export period must be at least {} minutes",
                    min_window.as_secs() / 60
                )));
            }
            if window > MAX_INCREMENTAL_WINDOW.as_millis() as i64 {
                return Err(AwsError::validation(
                    "The incremental export period must be at most 24 hours",
                ));
            }
            if from_ms < earliest || to_ms > now {
                return Err(AwsError::bad(
                    "InvalidExportTimeException",
                    format!(
                        "The export period [{}, {}) is outside the point in time recovery window [{}, {}]",
                        iso(from_ms),
                        iso(to_ms),
                        iso(earliest),
                        iso(now)
                    ),
                ));
            }
            Ok(Kind::Incremental {
                from_ms,
                to_ms,
                view,
            })
        }
        other => Err(AwsError::validation(format!(
            "ExportType {other:?} is not FULL_EXPORT or INCREMENTAL_EXPORT"
        ))),
    }
}

async fn describe_export(inner: &Inner, input: &Value) -> Answer {
    inner.lock().describe_calls += 1;
    let arn = string_member(input, "ExportArn")
        .ok_or_else(|| AwsError::validation("ExportArn is required"))?;
    let _one_at_a_time = inner.completing.lock().await;
    let mut export = {
        let mut state = inner.lock();
        let Some(export) = state.exports.iter_mut().find(|e| e.arn == arn) else {
            return Err(AwsError::bad(
                "ExportNotFoundException",
                format!("Export not found: {arn}"),
            ));
        };
        if !matches!(export.status, Status::InProgress) {
            return Ok(json!({"ExportDescription": description(export)}));
        }
        export.describes += 1;
        if export.describes <= export.in_progress_for {
            return Ok(json!({"ExportDescription": description(export)}));
        }
        export.clone()
    };
    export.end_ms = Some(now_ms().max(export.start_ms));
    export.status = match &export.outcome {
        Outcome::Fail(failure) => Status::Failed(failure.clone()),
        Outcome::Files {
            files,
            item_count,
            billed_bytes,
        } => match write_manifests(inner, &export, files, *item_count, *billed_bytes).await {
            Ok(key) => {
                export.manifest_key = Some(key);
                Status::Completed
            }
            Err(failure) => Status::Failed(failure),
        },
    };
    let answer = json!({"ExportDescription": description(&export)});
    let mut state = inner.lock();
    if let Some(slot) = state.exports.iter_mut().find(|e| e.arn == arn) {
        *slot = export;
    }
    Ok(answer)
}

/// `ExportDescription` as AWS writes it.
fn description(export: &Export) -> Value {
    let mut d = Map::new();
    d.insert("ExportArn".into(), json!(export.arn));
    d.insert(
        "ExportStatus".into(),
        json!(match export.status {
            Status::InProgress => "IN_PROGRESS",
            Status::Completed => "COMPLETED",
            Status::Failed(_) => "FAILED",
        }),
    );
    d.insert("StartTime".into(), epoch_seconds(export.start_ms));
    if let Some(end) = export.end_ms {
        d.insert("EndTime".into(), epoch_seconds(end));
    }
    d.insert("TableArn".into(), json!(export.table_arn));
    d.insert("TableId".into(), json!(export.table_id));
    d.insert("ClientToken".into(), json!(export.client_token));
    d.insert("S3Bucket".into(), json!(export.bucket));
    if let Some(owner) = &export.bucket_owner {
        d.insert("S3BucketOwner".into(), json!(owner));
    }
    if let Some(prefix) = &export.prefix {
        d.insert("S3Prefix".into(), json!(prefix));
    }
    d.insert("S3SseAlgorithm".into(), json!(export.sse_algorithm));
    if let Some(key) = &export.sse_kms_key_id {
        d.insert("S3SseKmsKeyId".into(), json!(key));
    }
    d.insert("ExportFormat".into(), json!("DYNAMODB_JSON"));
    match export.kind {
        Kind::Full { at_ms } => {
            d.insert("ExportType".into(), json!("FULL_EXPORT"));
            d.insert("ExportTime".into(), epoch_seconds(at_ms));
        }
        Kind::Incremental {
            from_ms,
            to_ms,
            view,
        } => {
            d.insert("ExportType".into(), json!("INCREMENTAL_EXPORT"));
            d.insert(
                "IncrementalExportSpecification".into(),
                json!({
                    "ExportFromTime": epoch_seconds(from_ms),
                    "ExportToTime": epoch_seconds(to_ms),
                    "ExportViewType": view.name(),
                }),
            );
        }
    }
    match &export.status {
        Status::InProgress => {}
        Status::Completed => {
            if let Some(key) = &export.manifest_key {
                d.insert("ExportManifest".into(), json!(key));
            }
            if let Outcome::Files {
                item_count,
                billed_bytes,
                ..
            } = &export.outcome
            {
                d.insert("ItemCount".into(), json!(item_count));
                d.insert("BilledSizeBytes".into(), json!(billed_bytes));
            }
        }
        Status::Failed(failure) => {
            d.insert("FailureCode".into(), json!(failure.code));
            d.insert("FailureMessage".into(), json!(failure.message));
        }
    }
    Value::Object(d)
}

// ---------------------------------------------------------------------------------------------
// Reading the upstream.

/// A line of a data file and the key it belongs to (for spreading lines over files).
struct Line {
    key: String,
    text: String,
}

async fn full_lines(clients: &Clients, table: &TableInfo) -> Result<Vec<Line>, String> {
    let name = table_name_of(&table.arn);
    let mut lines = Vec::new();
    let mut start = None;
    loop {
        let out = clients
            .dynamodb
            .scan()
            .table_name(&name)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| format!("Scan {name} upstream: {e:?}"))?;
        for item in out.items() {
            let item = dynamodb_item_json(item);
            let key: Map<String, Value> = table
                .keys
                .iter()
                .filter_map(|k| item.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            lines.push(Line {
                key: Value::Object(key).to_string(),
                text: json!({"Item": item}).to_string(),
            });
        }
        start = out.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    Ok(lines)
}

/// The changes of one key in the window, compacted.
struct Change {
    keys: Value,
    /// Before the first change in the window.
    old: Option<Value>,
    /// After the last.
    new: Option<Value>,
    micros: i64,
}

async fn incremental_lines(
    clients: &Clients,
    table: &TableInfo,
    from_ms: i64,
    to_ms: i64,
    view: View,
) -> Result<Vec<Line>, String> {
    let Some(stream) = &table.stream_arn else {
        return Err("the table has no stream".to_string());
    };
    let mut shards = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let out = clients
            .streams
            .describe_stream()
            .stream_arn(stream)
            .set_exclusive_start_shard_id(start)
            .send()
            .await
            .map_err(|e| format!("DescribeStream upstream: {e:?}"))?;
        let description = out
            .stream_description()
            .ok_or("DescribeStream upstream: no StreamDescription")?;
        shards.extend(description.shards().iter().cloned());
        start = description.last_evaluated_shard_id().map(str::to_string);
        if start.is_none() {
            break;
        }
    }
    // Parents before children, so each key's changes come in order.
    let mut ordered = Vec::new();
    let mut left = shards;
    while !left.is_empty() {
        let pending: HashSet<String> = left
            .iter()
            .filter_map(|s| s.shard_id().map(str::to_string))
            .collect();
        let (ready, rest): (Vec<_>, Vec<_>) = left
            .into_iter()
            .partition(|s| s.parent_shard_id().is_none_or(|p| !pending.contains(p)));
        if ready.is_empty() {
            ordered.extend(rest);
            break;
        }
        ordered.extend(ready);
        left = rest;
    }
    let (from_us, to_us) = (from_ms * 1000, to_ms * 1000);
    let mut changes: Vec<Change> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for shard in ordered {
        let Some(shard_id) = shard.shard_id() else {
            continue;
        };
        let mut iterator = clients
            .streams
            .get_shard_iterator()
            .stream_arn(stream)
            .shard_id(shard_id)
            .shard_iterator_type(aws_sdk_dynamodbstreams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .map_err(|e| format!("GetShardIterator upstream: {e:?}"))?
            .shard_iterator()
            .map(str::to_string);
        for _ in 0..10_000 {
            let Some(current) = iterator.take() else {
                break;
            };
            let out = clients
                .streams
                .get_records()
                .shard_iterator(current)
                .send()
                .await
                .map_err(|e| format!("GetRecords upstream: {e:?}"))?;
            for record in out.records() {
                let Some(data) = record.dynamodb() else {
                    continue;
                };
                let Some(at) = data.approximate_creation_date_time() else {
                    continue;
                };
                let micros = at.secs() * 1_000_000 + i64::from(at.subsec_nanos() / 1000);
                if micros < from_us || micros >= to_us {
                    continue;
                }
                let keys = Value::Object(data.keys().map(streams_item_json).unwrap_or_default());
                let key = keys.to_string();
                let old = data
                    .old_image()
                    .map(|i| Value::Object(streams_item_json(i)));
                let new = data
                    .new_image()
                    .map(|i| Value::Object(streams_item_json(i)));
                let new = match record.event_name() {
                    Some(aws_sdk_dynamodbstreams::types::OperationType::Remove) => None,
                    _ => new,
                };
                match by_key.get(&key) {
                    Some(&index) => {
                        let change = &mut changes[index];
                        change.new = new;
                        change.micros = micros;
                    }
                    None => {
                        by_key.insert(key, changes.len());
                        changes.push(Change {
                            keys,
                            old,
                            new,
                            micros,
                        });
                    }
                }
            }
            let caught_up = out.records().is_empty();
            iterator = out.next_shard_iterator().map(str::to_string);
            if caught_up {
                break;
            }
        }
    }
    Ok(changes
        .into_iter()
        .filter(|c| c.old.is_some() || c.new.is_some())
        .map(|change| {
            let mut line = Map::new();
            line.insert(
                "Metadata".into(),
                json!({"WriteTimestampMicros": {"N": change.micros.to_string()}}),
            );
            line.insert("Keys".into(), change.keys.clone());
            if let Some(new) = change.new {
                line.insert("NewImage".into(), new);
            }
            if view == View::NewAndOld
                && let Some(old) = change.old
            {
                line.insert("OldImage".into(), old);
            }
            Line {
                key: change.keys.to_string(),
                text: Value::Object(line).to_string(),
            }
        })
        .collect())
}

macro_rules! typed_json {
    ($item:ident, $value:ident, $krate:ident) => {
        fn $item(
            item: &HashMap<String, $krate::types::AttributeValue>,
        ) -> Map<String, Value> {
            item.iter().map(|(k, v)| (k.clone(), $value(v))).collect()
        }

        /// An attribute value in DynamoDB JSON (`{"S": …}`).
        fn $value(value: &$krate::types::AttributeValue) -> Value {
            use $krate::types::AttributeValue as A;
            match value {
                A::S(s) => json!({"S": s}),
                A::N(n) => json!({"N": n}),
                A::B(b) => json!({"B": BASE64.encode(b.as_ref())}),
                A::Bool(b) => json!({"BOOL": b}),
                A::Null(_) => json!({"NULL": true}),
                A::Ss(v) => json!({"SS": v}),
                A::Ns(v) => json!({"NS": v}),
                A::Bs(v) => json!({"BS": v.iter().map(|b| BASE64.encode(b.as_ref())).collect::<Vec<_>>()}),
                A::L(v) => json!({"L": v.iter().map($value).collect::<Vec<_>>()}),
                A::M(m) => json!({"M": $item(m)}),
                _ => json!({"NULL": true}),
            }
        }
    };
}

typed_json!(dynamodb_item_json, dynamodb_value_json, aws_sdk_dynamodb);
typed_json!(
    streams_item_json,
    streams_value_json,
    aws_sdk_dynamodbstreams
);

// ---------------------------------------------------------------------------------------------
// Writing to S3.

fn md5_base64(bytes: &[u8]) -> String {
    BASE64.encode(Md5::digest(bytes))
}

fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// PutObject; its ETag (unquoted) or the export's failure.
async fn put(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    bytes: Vec<u8>,
) -> Result<String, Failure> {
    let out = s3
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(bytes.into())
        .send()
        .await
        .map_err(|e| {
            use aws_sdk_s3::error::ProvideErrorMetadata as _;
            Failure {
                code: e.code().unwrap_or("S3Error").to_string(),
                message: format!(
                    "writing s3://{bucket}/{key} failed: {}",
                    e.message().map_or_else(|| format!("{e:?}"), str::to_string)
                ),
            }
        })?;
    Ok(out
        .e_tag()
        .unwrap_or_default()
        .trim_matches('"')
        .to_string())
}

fn random_name() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    (0..26)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(text.as_bytes())
        .expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// What is wrong with (or unusual about) an export's data files.
struct Flaws {
    /// The first file's manifest count is one too many.
    miscount: bool,
    /// The first file is stored with one value changed after its MD5 was taken.
    damage: bool,
    /// Files without lines are stored as 0-byte objects.
    zero_bytes: bool,
}

async fn write_data_files(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    dir: &str,
    lines: Vec<Line>,
    count: usize,
    flaws: Flaws,
) -> Outcome {
    let Flaws {
        miscount,
        damage,
        zero_bytes,
    } = flaws;
    let mut texts = vec![String::new(); count];
    let mut counts = vec![0u64; count];
    let mut billed = 0u64;
    for line in &lines {
        let digest = Md5::digest(line.key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let index = (u64::from_be_bytes(first) % count as u64) as usize;
        texts[index].push_str(&line.text);
        texts[index].push('\n');
        counts[index] += 1;
        billed += line.text.len() as u64;
    }
    let mut files = Vec::with_capacity(count);
    for (index, text) in texts.iter().enumerate() {
        let stored = if text.is_empty() && zero_bytes {
            Vec::new()
        } else {
            gzip(text)
        };
        let key = format!("{dir}/{}.json.gz", random_name());
        let md5 = md5_base64(&stored);
        let stored = match text.rfind(r#"{"N":""#) {
            Some(at) if damage && index == 0 => {
                let mut altered = text.clone();
                altered.insert(at + 6, '9');
                gzip(&altered)
            }
            _ => stored,
        };
        let etag = match put(s3, bucket, &key, stored).await {
            Ok(etag) => etag,
            Err(failure) => return Outcome::Fail(failure),
        };
        files.push(DataFile {
            key,
            item_count: counts[index] + u64::from(miscount && index == 0),
            md5,
            etag,
        });
    }
    Outcome::Files {
        item_count: lines.len() as u64 + u64::from(miscount),
        billed_bytes: billed,
        files,
    }
}

/// RFC 3339 in ms, as the manifests write times.
fn iso(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .unwrap_or_default()
}

/// Writes `manifest-files.json`, `manifest-summary.json` and their checksums; the summary's key.
async fn write_manifests(
    inner: &Inner,
    export: &Export,
    files: &[DataFile],
    item_count: u64,
    billed_bytes: u64,
) -> Result<String, Failure> {
    let s3 = inner.clients(&export.access).s3;
    let dir = match &export.prefix {
        Some(prefix) => format!("{prefix}/AWSDynamoDB/{}", export.id),
        None => format!("AWSDynamoDB/{}", export.id),
    };
    let files_key = format!("{dir}/manifest-files.json");
    let listing: String = files
        .iter()
        .map(|f| {
            format!(
                "{}\n",
                json!({
                    "itemCount": f.item_count,
                    "md5Checksum": f.md5,
                    "etag": f.etag,
                    "dataFileS3Key": f.key,
                })
            )
        })
        .collect();
    let mut summary = Map::new();
    let version = match export.kind {
        Kind::Full { .. } => "2020-06-30",
        Kind::Incremental { .. } => "2023-08-01",
    };
    summary.insert("version".into(), json!(version));
    summary.insert("exportArn".into(), json!(export.arn));
    summary.insert("startTime".into(), json!(iso(export.start_ms)));
    summary.insert(
        "endTime".into(),
        json!(iso(export.end_ms.unwrap_or(export.start_ms))),
    );
    summary.insert("tableArn".into(), json!(export.table_arn));
    summary.insert("tableId".into(), json!(export.table_id));
    match export.kind {
        Kind::Full { at_ms } => {
            summary.insert("exportTime".into(), json!(iso(at_ms)));
        }
        Kind::Incremental { from_ms, to_ms, .. } => {
            summary.insert("exportFromTime".into(), json!(iso(from_ms)));
            summary.insert("exportToTime".into(), json!(iso(to_ms)));
        }
    }
    summary.insert("s3Bucket".into(), json!(export.bucket));
    summary.insert("s3Prefix".into(), json!(export.prefix));
    summary.insert("s3SseAlgorithm".into(), json!(export.sse_algorithm));
    summary.insert("s3SseKmsKeyId".into(), json!(export.sse_kms_key_id));
    summary.insert("manifestFilesS3Key".into(), json!(files_key));
    summary.insert("billedSizeBytes".into(), json!(billed_bytes));
    summary.insert("itemCount".into(), json!(item_count));
    summary.insert("outputFormat".into(), json!("DYNAMODB_JSON"));
    match export.kind {
        Kind::Full { .. } => {
            if export.export_type_in_summary {
                summary.insert("exportType".into(), json!("FULL_EXPORT"));
            }
        }
        Kind::Incremental { view, .. } => {
            summary.insert("outputView".into(), json!(view.name()));
            summary.insert("exportType".into(), json!("INCREMENTAL_EXPORT"));
        }
    }
    let summary = Value::Object(summary).to_string();
    let summary_key = format!("{dir}/manifest-summary.json");
    for (key, bytes) in [
        (files_key.clone(), listing.into_bytes()),
        (summary_key.clone(), summary.into_bytes()),
    ] {
        let checksum = md5_hex(&bytes);
        put(&s3, &export.bucket, &key, bytes).await?;
        let checksum_key = format!("{}.checksum", key.trim_end_matches(".json"));
        put(&s3, &export.bucket, &checksum_key, checksum.into_bytes()).await?;
    }
    Ok(summary_key)
}
