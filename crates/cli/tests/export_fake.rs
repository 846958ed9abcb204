//! The export fake (`tests/fake_export`) itself, with moto as its S3 and moto (or, for the
//! round trips, dynoxide too) as its upstream: the files it writes read back with ddbpipe's own
//! export readers, and its scripted faults and counters.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
mod fake_export;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodb::primitives::{Blob, DateTime};
use aws_sdk_dynamodb::types::{
    AttributeValue, ExportDescription, ExportStatus, ExportType, ExportViewType,
    IncrementalExportSpecification, PointInTimeRecoveryStatus, StreamViewType,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ddbpipe_source::api::Render;
use ddbpipe_source::export::{
    ExportError, ExportType as SummaryType, FileReading, ManifestFile, ManifestSummary,
    manifest_files, read_data_file,
};
use ddbpipe_value::{ValueFormat, item_from_typed_json};
use md5::{Digest as _, Md5};
use serde_json::{Value, json};

use common::{Emulator, Running, client, rt};
use fake_export::{FakeExport, create_bucket, list_keys, read_object};

const BUCKET: &str = "exports";
const TABLE: &str = "items";

/// An emulator with a table `items` (NEW_AND_OLD_IMAGES stream), moto's S3 with the bucket, the
/// fake in front of the emulator, and a client of the fake.
struct Setup {
    db: Running,
    /// The S3 endpoint (moto's).
    s3: String,
    /// moto for S3 when the emulator is dynoxide.
    _s3_server: Option<Running>,
    fake: FakeExport,
    client: Client,
    table_arn: String,
}

fn setup() -> Setup {
    setup_on(Emulator::Moto)
}

fn setup_on(emulator: Emulator) -> Setup {
    let db = emulator.start();
    db.create_pk_table(TABLE, Some(StreamViewType::NewAndOldImages));
    let s3_server = (emulator != Emulator::Moto).then(|| Emulator::Moto.start());
    let s3 = s3_server.as_ref().unwrap_or(&db).endpoint.clone();
    create_bucket(&s3, BUCKET);
    let fake = FakeExport::start(&db.endpoint, &s3);
    let client = client(&fake.url());
    let table_arn = rt()
        .block_on(client.describe_table().table_name(TABLE).send())
        .expect("DescribeTable through the fake")
        .table()
        .and_then(|t| t.table_arn())
        .expect("a TableArn")
        .to_string();
    Setup {
        db,
        s3,
        _s3_server: s3_server,
        fake,
        client,
        table_arn,
    }
}

/// A timestamp in ms, rounded: the JSON protocol's epoch seconds are an `f64`, and the SDK's
/// `to_millis` truncates 1796130835.080 to …079.
trait RoundMs {
    fn round_ms(&self) -> i64;
}

impl RoundMs for DateTime {
    fn round_ms(&self) -> i64 {
        self.secs() * 1000 + i64::from(self.subsec_nanos() + 500_000) / 1_000_000
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as i64
}

/// DynamoDB JSON → the SDK's attribute value (the other direction from the fake's).
fn attribute(value: &Value) -> AttributeValue {
    let (kind, inner) = value
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("an attribute value is {\"<type>\": …}");
    let text = |v: &Value| v.as_str().expect("a string").to_string();
    let list = || inner.as_array().expect("a list").iter();
    let blob = |v: &Value| Blob::new(BASE64.decode(text(v)).expect("base64"));
    match kind.as_str() {
        "S" => AttributeValue::S(text(inner)),
        "N" => AttributeValue::N(text(inner)),
        "B" => AttributeValue::B(blob(inner)),
        "BOOL" => AttributeValue::Bool(inner.as_bool().expect("a boolean")),
        "NULL" => AttributeValue::Null(true),
        "SS" => AttributeValue::Ss(list().map(text).collect()),
        "NS" => AttributeValue::Ns(list().map(text).collect()),
        "BS" => AttributeValue::Bs(list().map(blob).collect()),
        "L" => AttributeValue::L(list().map(attribute).collect()),
        "M" => AttributeValue::M(attributes(inner)),
        other => panic!("not an attribute type: {other}"),
    }
}

fn attributes(item: &Value) -> HashMap<String, AttributeValue> {
    item.as_object()
        .expect("an item is an object")
        .iter()
        .map(|(k, v)| (k.clone(), attribute(v)))
        .collect()
}

/// The items the full-export tests write, in DynamoDB JSON.
fn seed_items() -> Vec<Value> {
    let mut items = vec![
        json!({"pk": {"S": "big"}, "n": {"N": "12345678901234567890123"}, "b": {"B": "AQI="},
               "ss": {"SS": ["x", "y"]}, "f": {"BOOL": false}}),
        json!({"pk": {"S": "nested"}, "nul": {"NULL": true}, "bs": {"BS": ["AQ==", "Ag=="]},
               "m": {"M": {"l": {"L": [{"N": "1"}, {"BOOL": true}, {"S": "é"}]},
                          "ns": {"NS": ["2.5"]}}}}),
    ];
    items.extend((0..8).map(|i| json!({"pk": {"S": format!("k{i}")}, "v": {"N": i.to_string()}})));
    items
}

fn seed(setup: &Setup, items: &[Value]) {
    setup
        .db
        .put_items(TABLE, items.iter().map(attributes).collect());
}

/// What ddbpipe writes for `item` (plain format).
fn plain(item: &Value) -> String {
    let item = item_from_typed_json(item, "Item").expect("an item in DynamoDB JSON");
    let mut out = Vec::new();
    Render::items(ValueFormat::Plain).write_item(&item, &mut out);
    String::from_utf8(out).expect("records are UTF-8")
}

/// ExportTableToPointInTime: the description, or the error code.
fn start(
    client: &Client,
    table_arn: &str,
    prefix: &str,
    token: &str,
    export_time_ms: Option<i64>,
) -> Result<ExportDescription, String> {
    let request = client
        .export_table_to_point_in_time()
        .table_arn(table_arn)
        .s3_bucket(BUCKET)
        .s3_prefix(prefix)
        .client_token(token)
        .set_export_time(export_time_ms.map(DateTime::from_millis));
    rt().block_on(request.send())
        .map(|out| out.export_description.expect("an ExportDescription"))
        .map_err(|e| e.into_service_error().code().unwrap_or("?").to_string())
}

fn describe(client: &Client, arn: &str) -> Result<ExportDescription, String> {
    rt().block_on(client.describe_export().export_arn(arn).send())
        .map(|out| out.export_description.expect("an ExportDescription"))
        .map_err(|e| e.into_service_error().code().unwrap_or("?").to_string())
}

/// DescribeExport until the export is no longer IN_PROGRESS; the description and how many
/// answers were IN_PROGRESS.
fn wait(client: &Client, arn: &str) -> (ExportDescription, usize) {
    for in_progress in 0..20 {
        let d = describe(client, arn).expect("DescribeExport");
        if d.export_status != Some(ExportStatus::InProgress) {
            return (d, in_progress);
        }
    }
    panic!("{arn} stayed IN_PROGRESS");
}

/// The directory of an export's manifests: `<prefix>/AWSDynamoDB/<export id>`.
fn export_dir(prefix: &str, arn: &str) -> String {
    let id = arn.rsplit('/').next().unwrap_or_default();
    format!("{prefix}/AWSDynamoDB/{id}")
}

/// Reads every data file with ddbpipe's reader: each file's records or its error.
fn read_files(endpoint: &str, files: &[ManifestFile]) -> Vec<Result<Vec<String>, ExportError>> {
    files
        .iter()
        .map(|file| {
            let stored = read_object(endpoint, BUCKET, &file.data_file_key)
                .expect("the data file is stored");
            let mut records = Vec::new();
            let reading = FileReading {
                file,
                kind: SummaryType::Full,
                render: Render::items(ValueFormat::Plain),
                key_schema: &[],
                batch: 4,
                skip: 0,
            };
            read_data_file::<ExportError>(
                &stored[..],
                &reading,
                || Ok(()),
                |lines| {
                    records.extend(
                        lines
                            .iter()
                            .map(|l| String::from_utf8_lossy(l).into_owned()),
                    );
                    Ok(())
                },
            )
            .map(|_| records)
        })
        .collect()
}

fn summary_of(endpoint: &str, d: &ExportDescription) -> (String, Vec<u8>) {
    let key = d
        .export_manifest()
        .expect("a completed export names its manifest");
    let bytes = read_object(endpoint, BUCKET, key).expect("manifest-summary.json is stored");
    (key.to_string(), bytes)
}

on_both_emulators!(
    a_full_export_writes_aws_layout_and_ddbpipe_reads_the_table_back,
    an_incremental_export_holds_each_changed_key_once_with_its_images,
);

fn a_full_export_writes_aws_layout_and_ddbpipe_reads_the_table_back(emulator: Emulator) {
    let setup = setup_on(emulator);
    let items = seed_items();
    seed(&setup, &items);
    let (fake, endpoint) = (&setup.fake, &setup.s3);

    let backups = rt()
        .block_on(
            setup
                .client
                .describe_continuous_backups()
                .table_name(TABLE)
                .send(),
        )
        .unwrap();
    let pitr = backups
        .continuous_backups_description()
        .and_then(|d| d.point_in_time_recovery_description())
        .unwrap();
    assert_eq!(
        pitr.point_in_time_recovery_status(),
        Some(&PointInTimeRecoveryStatus::Enabled)
    );
    let earliest = pitr.earliest_restorable_date_time().unwrap().round_ms();
    let latest = pitr.latest_restorable_date_time().unwrap().round_ms();
    assert!(
        earliest <= latest && latest <= now_ms(),
        "{earliest} {latest}"
    );

    let before = now_ms();
    let started = start(&setup.client, &setup.table_arn, "runs/t", "token-1", None).unwrap();
    let arn = started.export_arn().unwrap().to_string();
    assert_eq!(started.export_status(), Some(&ExportStatus::InProgress));
    assert_eq!(started.export_type(), Some(&ExportType::FullExport));
    assert_eq!(started.table_arn(), Some(setup.table_arn.as_str()));
    assert_eq!(started.s3_prefix(), Some("runs/t"));
    assert_eq!(started.client_token(), Some("token-1"));
    assert!(started.table_id().is_some_and(|id| !id.is_empty()));
    assert!(started.export_manifest().is_none());
    let export_time = started.export_time().unwrap().round_ms();
    assert!(before <= export_time && export_time <= now_ms());
    // <TableArn>/export/<ms, 14 digits>-<8 hex>, as AWS's.
    let (table_part, id) = arn.rsplit_once("/export/").unwrap();
    assert_eq!(table_part, setup.table_arn);
    let (millis, hex) = id.split_once('-').unwrap();
    assert_eq!(millis.len(), 14, "{id}");
    assert!(millis.bytes().all(|b| b.is_ascii_digit()), "{id}");
    let millis: i64 = millis.parse().unwrap();
    assert!((before..=now_ms()).contains(&millis));
    assert_eq!(hex.len(), 8, "{id}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(fake.exports_started(), 1);
    assert_eq!(fake.export_arns(), vec![arn.clone()]);

    // In progress: the data files and `_started` are there, the manifests are not yet.
    let dir = export_dir("runs/t", &arn);
    let keys = list_keys(endpoint, BUCKET, "runs/t/");
    assert!(keys.contains(&format!("{dir}/_started")), "{keys:?}");
    let data: Vec<&String> = keys.iter().filter(|k| k.contains("/data/")).collect();
    assert_eq!(data.len(), fake_export::DEFAULT_DATA_FILES, "{keys:?}");
    assert!(
        data.iter()
            .all(|k| k.starts_with(&format!("{dir}/data/")) && k.ends_with(".json.gz")),
        "{keys:?}"
    );
    assert!(read_object(endpoint, BUCKET, &format!("{dir}/manifest-summary.json")).is_none());

    let (done, in_progress) = wait(&setup.client, &arn);
    assert_eq!(
        in_progress, 1,
        "IN_PROGRESS for one DescribeExport by default"
    );
    assert_eq!(fake.describe_calls(), 2);
    assert_eq!(done.export_status(), Some(&ExportStatus::Completed));
    assert_eq!(done.item_count(), Some(items.len() as i64));
    assert!(done.billed_size_bytes().is_some_and(|b| b > 0));
    assert!(done.end_time().is_some());
    assert!(done.failure_code().is_none());
    assert_eq!(
        done.export_manifest(),
        Some(format!("{dir}/manifest-summary.json").as_str())
    );

    let (summary_key, bytes) = summary_of(endpoint, &done);
    if emulator == Emulator::Moto {
        // Read through the fake: S3 requests are forwarded to moto like everything else.
        assert_eq!(
            summary_of(&fake.url(), &done),
            (summary_key.clone(), bytes.clone())
        );
        assert!(
            fake.forwarded_requests().iter().any(|f| f.target.is_none()
                && f.method == "GET"
                && f.path.contains("manifest-summary")),
            "{:?}",
            fake.forwarded_requests()
        );
    }
    let summary = ManifestSummary::parse(&summary_key, &bytes).unwrap();
    assert_eq!(summary.export_arn, arn);
    assert_eq!(summary.item_count, items.len() as u64);
    assert_eq!(summary.export_type, SummaryType::Full);
    assert_eq!(summary.export_time_ms, export_time);
    assert_eq!(
        summary.manifest_files_key,
        format!("{dir}/manifest-files.json")
    );
    let raw: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(raw["version"], "2020-06-30");
    assert_eq!(raw["tableArn"], setup.table_arn.as_str());
    assert_eq!(raw["tableId"], done.table_id().unwrap());
    assert_eq!(raw["s3Bucket"], BUCKET);
    assert_eq!(raw["s3Prefix"], "runs/t");
    assert_eq!(raw["s3SseAlgorithm"], "AES256");
    assert_eq!(raw["s3SseKmsKeyId"], Value::Null);
    assert_eq!(raw["outputFormat"], "DYNAMODB_JSON");
    assert_eq!(raw["billedSizeBytes"], done.billed_size_bytes().unwrap());
    assert!(
        raw.get("exportType").is_none(),
        "AWS's full summary has none"
    );
    for member in ["startTime", "endTime", "exportTime"] {
        assert!(
            raw[member].as_str().is_some_and(|t| t.ends_with('Z')),
            "{raw}"
        );
    }
    for checksum in ["manifest-summary.checksum", "manifest-files.checksum"] {
        assert!(keys_now(endpoint).contains(&format!("{dir}/{checksum}")));
    }

    let listing = read_object(endpoint, BUCKET, &summary.manifest_files_key).unwrap();
    let files = manifest_files(&summary.manifest_files_key, &listing).unwrap();
    assert_eq!(files.len(), fake_export::DEFAULT_DATA_FILES);
    assert_eq!(
        files.iter().map(|f| f.item_count).sum::<u64>(),
        items.len() as u64
    );
    for line in std::str::from_utf8(&listing).unwrap().lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        assert!(
            entry["etag"].as_str().is_some_and(|e| !e.is_empty()),
            "{entry}"
        );
    }
    let mut got = BTreeSet::new();
    for records in read_files(endpoint, &files) {
        got.extend(records.expect("every file verifies (count and MD5)"));
    }
    let want: BTreeSet<String> = items.iter().map(plain).collect();
    assert_eq!(got, want);
}

fn keys_now(endpoint: &str) -> Vec<String> {
    list_keys(endpoint, BUCKET, "")
}

#[test]
fn a_client_token_returns_its_export_again_and_conflicts_with_other_parameters() {
    let setup = setup();
    seed(&setup, &seed_items()[..3]);
    let fake = &setup.fake;
    let first = start(&setup.client, &setup.table_arn, "p", "same", None).unwrap();
    let again = start(&setup.client, &setup.table_arn, "p", "same", None).unwrap();
    assert_eq!(again.export_arn(), first.export_arn());
    assert_eq!(fake.exports_started(), 1);
    let (done, _) = wait(&setup.client, first.export_arn().unwrap());
    assert_eq!(done.export_status(), Some(&ExportStatus::Completed));
    // After completion the same request still names the same (completed) export.
    let later = start(&setup.client, &setup.table_arn, "p", "same", None).unwrap();
    assert_eq!(later.export_arn(), first.export_arn());
    assert_eq!(later.export_status(), Some(&ExportStatus::Completed));
    assert_eq!(
        start(&setup.client, &setup.table_arn, "other", "same", None).unwrap_err(),
        "ExportConflictException"
    );
    assert_eq!(fake.exports_started(), 1);
    let other = start(&setup.client, &setup.table_arn, "p", "another", None).unwrap();
    assert_ne!(other.export_arn(), first.export_arn());
    assert_eq!(fake.exports_started(), 2);
}

/// Requests with one client token sent at once (the workers of a shared mirror starting its
/// export) start one export, as AWS's idempotency promises: each names it.
#[test]
fn requests_with_one_client_token_at_once_start_one_export() {
    let setup = setup();
    seed(&setup, &seed_items()[..3]);
    let arns: Vec<String> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    start(&setup.client, &setup.table_arn, "p", "together", None)
                        .unwrap()
                        .export_arn()
                        .unwrap()
                        .to_string()
                })
            })
            .collect();
        started.into_iter().map(|s| s.join().unwrap()).collect()
    });
    assert!(arns.iter().all(|arn| *arn == arns[0]), "{arns:?}");
    assert_eq!(setup.fake.exports_started(), 1);
}

#[test]
fn a_scripted_failure_fails_the_next_export_only() {
    let setup = setup();
    seed(&setup, &seed_items()[..3]);
    setup
        .fake
        .fail_next_export("S3AccessDenied", "Access denied to the bucket");
    let failing = start(&setup.client, &setup.table_arn, "f", "t1", None).unwrap();
    assert_eq!(failing.export_status(), Some(&ExportStatus::InProgress));
    let arn = failing.export_arn().unwrap();
    let (failed, in_progress) = wait(&setup.client, arn);
    assert_eq!(in_progress, 1);
    assert_eq!(failed.export_status(), Some(&ExportStatus::Failed));
    assert_eq!(failed.failure_code(), Some("S3AccessDenied"));
    assert_eq!(
        failed.failure_message(),
        Some("Access denied to the bucket")
    );
    assert!(failed.export_manifest().is_none() && failed.item_count().is_none());
    assert!(failed.end_time().is_some());
    // It stays failed, and wrote nothing but `_started`.
    assert_eq!(
        describe(&setup.client, arn).unwrap().export_status(),
        Some(&ExportStatus::Failed)
    );
    assert_eq!(
        keys_now(&setup.s3),
        [format!("{}/_started", export_dir("f", arn))]
    );

    let next = start(&setup.client, &setup.table_arn, "f", "t2", None).unwrap();
    let (done, _) = wait(&setup.client, next.export_arn().unwrap());
    assert_eq!(done.export_status(), Some(&ExportStatus::Completed));
    assert_eq!(done.item_count(), Some(3));

    // An export to a bucket that is not there fails as it would in S3's words.
    let request = setup
        .client
        .export_table_to_point_in_time()
        .table_arn(&setup.table_arn)
        .s3_bucket("no-such-bucket")
        .client_token("t3");
    let d = rt()
        .block_on(request.send())
        .unwrap()
        .export_description
        .unwrap();
    let (failed, _) = wait(&setup.client, d.export_arn().unwrap());
    assert_eq!(failed.export_status(), Some(&ExportStatus::Failed));
    assert_eq!(failed.failure_code(), Some("NoSuchBucket"));
    assert!(
        failed
            .failure_message()
            .is_some_and(|m| m.contains("s3://no-such-bucket/AWSDynamoDB/")),
        "{failed:?}"
    );
}

#[test]
fn refusals_name_aws_error_codes() {
    let setup = setup();
    let fake = &setup.fake;
    fake.set_pitr(false);
    let backups = rt()
        .block_on(
            setup
                .client
                .describe_continuous_backups()
                .table_name(TABLE)
                .send(),
        )
        .unwrap();
    let pitr = backups
        .continuous_backups_description()
        .and_then(|d| d.point_in_time_recovery_description())
        .unwrap();
    assert_eq!(
        pitr.point_in_time_recovery_status(),
        Some(&PointInTimeRecoveryStatus::Disabled)
    );
    assert!(pitr.earliest_restorable_date_time().is_none());
    assert_eq!(fake.backups_calls(), 1);
    assert_eq!(
        start(&setup.client, &setup.table_arn, "p", "a", None).unwrap_err(),
        "PointInTimeRecoveryUnavailableException"
    );
    assert_eq!(fake.exports_started(), 0);
    fake.set_pitr(true);

    let unknown = format!("{}/export/01700000000000-0badc0de", setup.table_arn);
    assert_eq!(
        describe(&setup.client, &unknown).unwrap_err(),
        "ExportNotFoundException"
    );
    let missing_table = setup.table_arn.replace("table/items", "table/nope");
    assert_eq!(
        start(&setup.client, &missing_table, "p", "b", None).unwrap_err(),
        "TableNotFoundException"
    );

    // The recovery window: EarliestRestorableDateTime as scripted, times before it refused.
    let earliest = now_ms() - 60_000;
    fake.set_earliest_restorable_ms(Some(earliest));
    let backups = rt()
        .block_on(
            setup
                .client
                .describe_continuous_backups()
                .table_name(TABLE)
                .send(),
        )
        .unwrap();
    let reported = backups
        .continuous_backups_description()
        .and_then(|d| d.point_in_time_recovery_description())
        .and_then(|p| p.earliest_restorable_date_time())
        .unwrap()
        .round_ms();
    assert_eq!(reported, earliest);
    assert_eq!(
        start(
            &setup.client,
            &setup.table_arn,
            "p",
            "c",
            Some(earliest - 1)
        )
        .unwrap_err(),
        "InvalidExportTimeException"
    );
    assert_eq!(
        start(
            &setup.client,
            &setup.table_arn,
            "p",
            "d",
            Some(now_ms() + 60_000)
        )
        .unwrap_err(),
        "InvalidExportTimeException"
    );
    assert_eq!(fake.exports_started(), 0);
    let at = earliest + 1_000;
    let d = start(&setup.client, &setup.table_arn, "p", "e", Some(at)).unwrap();
    assert_eq!(d.export_time().unwrap().round_ms(), at);
    let (done, _) = wait(&setup.client, d.export_arn().unwrap());
    let (key, bytes) = summary_of(&setup.s3, &done);
    assert_eq!(
        ManifestSummary::parse(&key, &bytes).unwrap().export_time_ms,
        at
    );
}

#[test]
fn scripted_describes_in_progress_and_forwarded_requests_are_counted() {
    let setup = setup();
    let fake = &setup.fake;
    // Writes and reads through the fake reach moto and are counted by target.
    for i in 0..3 {
        let request = setup
            .client
            .put_item()
            .table_name(TABLE)
            .item("pk", AttributeValue::S(format!("p{i}")));
        rt().block_on(request.send()).unwrap();
    }
    let scanned = rt()
        .block_on(setup.client.scan().table_name(TABLE).send())
        .unwrap();
    assert_eq!(scanned.count(), 3);
    assert_eq!(fake.forwarded("Scan"), 1);
    assert_eq!(fake.forwarded("DynamoDB_20120810.Scan"), 1);
    assert_eq!(fake.forwarded("PutItem"), 3);
    assert_eq!(fake.forwarded("DescribeTable"), 1, "the setup's");
    assert_eq!(fake.forwarded("ExportTableToPointInTime"), 0);

    fake.set_in_progress_describes(3);
    let d = start(&setup.client, &setup.table_arn, "n", "n", None).unwrap();
    let (done, in_progress) = wait(&setup.client, d.export_arn().unwrap());
    assert_eq!(in_progress, 3);
    assert_eq!(done.export_status(), Some(&ExportStatus::Completed));
    assert_eq!(fake.describe_calls(), 4);
    assert_eq!(fake.forwarded("DescribeExport"), 0);
    assert_eq!(
        fake.forwarded("Scan"),
        1,
        "the fake scans the upstream itself"
    );
}

#[test]
fn a_miscounted_file_fails_ddbpipe_verification_naming_it() {
    let setup = setup();
    let items = seed_items();
    seed(&setup, &items);
    setup.fake.set_data_files(2);
    setup.fake.miscount_next_export();
    let d = start(&setup.client, &setup.table_arn, "m", "m", None).unwrap();
    let (done, _) = wait(&setup.client, d.export_arn().unwrap());
    assert_eq!(done.item_count(), Some(items.len() as i64 + 1));
    let endpoint = &setup.s3;
    let (key, bytes) = summary_of(endpoint, &done);
    let summary = ManifestSummary::parse(&key, &bytes).unwrap();
    let listing = read_object(endpoint, BUCKET, &summary.manifest_files_key).unwrap();
    let files = manifest_files(&summary.manifest_files_key, &listing).unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(
        files.iter().map(|f| f.item_count).sum::<u64>(),
        summary.item_count,
        "the manifests agree with each other; only the file does not"
    );
    let results = read_files(endpoint, &files);
    let error = results[0].as_ref().unwrap_err();
    assert_eq!(error.object, files[0].data_file_key);
    let holds = files[0].item_count - 1;
    assert!(
        error.problem.contains(&format!(
            "holds {holds} items but its manifest says {}",
            holds + 1
        )),
        "{error}"
    );
    assert!(results[1].is_ok(), "{:?}", results[1]);

    // One-shot: the next export is right again.
    let d = start(&setup.client, &setup.table_arn, "m", "m2", None).unwrap();
    let (done, _) = wait(&setup.client, d.export_arn().unwrap());
    let (key, bytes) = summary_of(endpoint, &done);
    let summary = ManifestSummary::parse(&key, &bytes).unwrap();
    let listing = read_object(endpoint, BUCKET, &summary.manifest_files_key).unwrap();
    let files = manifest_files(&summary.manifest_files_key, &listing).unwrap();
    assert!(read_files(endpoint, &files).iter().all(Result::is_ok));
}

#[test]
fn empty_data_files_are_empty_gzip_or_zero_bytes_as_scripted() {
    let setup = setup();
    seed(&setup, &seed_items()[..1]);
    let endpoint = &setup.s3;
    let stored_sizes = |token: &str| -> Vec<(u64, usize)> {
        let d = start(&setup.client, &setup.table_arn, token, token, None).unwrap();
        let (done, _) = wait(&setup.client, d.export_arn().unwrap());
        let (key, bytes) = summary_of(endpoint, &done);
        let summary = ManifestSummary::parse(&key, &bytes).unwrap();
        let listing = read_object(endpoint, BUCKET, &summary.manifest_files_key).unwrap();
        manifest_files(&summary.manifest_files_key, &listing)
            .unwrap()
            .iter()
            .map(|f| {
                let stored = read_object(endpoint, BUCKET, &f.data_file_key).unwrap();
                assert_eq!(
                    f.md5_checksum.as_deref(),
                    Some(BASE64.encode(Md5::digest(&stored)).as_str())
                );
                (f.item_count, stored.len())
            })
            .collect()
    };
    let gzip = stored_sizes("g");
    assert_eq!(gzip.len(), 3);
    assert_eq!(gzip.iter().filter(|(n, _)| *n == 1).count(), 1);
    assert!(gzip.iter().all(|(_, size)| *size > 0), "{gzip:?}");
    setup.fake.set_empty_files_zero_bytes(true);
    let zero = stored_sizes("z");
    assert!(
        zero.iter().all(|(n, size)| (*n == 0) == (*size == 0)),
        "{zero:?}"
    );
}

/// Sleeps into the next whole second and returns it in ms: stream records before the call
/// are older than it even when their time is rounded down to the second.
fn next_second() -> i64 {
    let now = now_ms();
    let next = (now / 1000 + 1) * 1000;
    std::thread::sleep(Duration::from_millis((next - now) as u64 + 20));
    next
}

fn start_incremental(
    client: &Client,
    table_arn: &str,
    token: &str,
    from_ms: i64,
    to_ms: i64,
) -> Result<ExportDescription, String> {
    let request = client
        .export_table_to_point_in_time()
        .table_arn(table_arn)
        .s3_bucket(BUCKET)
        .s3_prefix("inc")
        .client_token(token)
        .export_type(ExportType::IncrementalExport)
        .incremental_export_specification(
            IncrementalExportSpecification::builder()
                .export_from_time(DateTime::from_millis(from_ms))
                .export_to_time(DateTime::from_millis(to_ms))
                .export_view_type(ExportViewType::NewAndOldImages)
                .build(),
        );
    rt().block_on(request.send())
        .map(|out| out.export_description.expect("an ExportDescription"))
        .map_err(|e| e.into_service_error().code().unwrap_or("?").to_string())
}

fn an_incremental_export_holds_each_changed_key_once_with_its_images(emulator: Emulator) {
    let setup = setup_on(emulator);
    let (db, fake) = (&setup.db, &setup.fake);
    db.put_pk(TABLE, "x", "1");
    db.put_pk(TABLE, "y", "1");
    let from = next_second();
    db.put_pk(TABLE, "x", "2");
    db.put_pk(TABLE, "x", "3");
    let delete = |pk: &str| {
        let request = db
            .client
            .delete_item()
            .table_name(TABLE)
            .key("pk", AttributeValue::S(pk.to_string()));
        rt().block_on(request.send()).unwrap();
    };
    delete("y");
    db.put_pk(TABLE, "z", "1");
    db.put_pk(TABLE, "z", "2");
    db.put_pk(TABLE, "w", "1");
    delete("w");
    std::thread::sleep(Duration::from_millis(5));
    let to = now_ms();

    // AWS's window rules: at least 15 minutes (until the knob lowers it), at most 24 hours.
    assert_eq!(
        start_incremental(&setup.client, &setup.table_arn, "short", from, to).unwrap_err(),
        "ValidationException"
    );
    fake.set_min_incremental_window(Duration::ZERO);
    let day_and_more = 24 * 3600 * 1000 + 1;
    assert_eq!(
        start_incremental(
            &setup.client,
            &setup.table_arn,
            "long",
            to - day_and_more,
            to
        )
        .unwrap_err(),
        "ValidationException"
    );
    assert_eq!(
        start_incremental(&setup.client, &setup.table_arn, "empty", to, to).unwrap_err(),
        "ValidationException"
    );
    assert_eq!(fake.exports_started(), 0);

    let d = start_incremental(&setup.client, &setup.table_arn, "inc", from, to).unwrap();
    assert_eq!(d.export_type(), Some(&ExportType::IncrementalExport));
    let spec = d.incremental_export_specification().unwrap();
    assert_eq!(spec.export_from_time().unwrap().round_ms(), from);
    assert_eq!(spec.export_to_time().unwrap().round_ms(), to);
    let arn = d.export_arn().unwrap();
    let (done, _) = wait(&setup.client, arn);
    // A failure says why (once seen in a gate under load: the fake's write into moto's S3).
    assert_eq!(
        done.export_status(),
        Some(&ExportStatus::Completed),
        "{:?}: {:?}",
        done.failure_code(),
        done.failure_message()
    );
    assert_eq!(done.item_count(), Some(3), "x, y and z; w came and went");

    let endpoint = &setup.s3;
    let (key, bytes) = summary_of(endpoint, &done);
    assert_eq!(
        key,
        format!("{}/manifest-summary.json", export_dir("inc", arn))
    );
    let raw: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(raw["version"], "2023-08-01");
    assert_eq!(raw["exportType"], "INCREMENTAL_EXPORT");
    assert_eq!(raw["outputView"], "NEW_AND_OLD_IMAGES");
    assert_eq!(raw["outputFormat"], "DYNAMODB_JSON");
    assert_eq!(raw["itemCount"], 3);
    assert!(raw.get("exportTime").is_none(), "{raw}");
    let iso_ms = |member: &str| {
        let text = raw[member].as_str().unwrap();
        let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .unwrap();
        (at.unix_timestamp_nanos() / 1_000_000) as i64
    };
    assert_eq!(
        (iso_ms("exportFromTime"), iso_ms("exportToTime")),
        (from, to)
    );

    let files_key = raw["manifestFilesS3Key"].as_str().unwrap();
    let listing = read_object(endpoint, BUCKET, files_key).unwrap();
    let files = manifest_files(files_key, &listing).unwrap();
    assert_eq!(files.len(), fake_export::DEFAULT_DATA_FILES);
    let mut lines: BTreeMap<String, Value> = BTreeMap::new();
    for file in &files {
        assert!(
            file.data_file_key.starts_with("inc/AWSDynamoDB/data/"),
            "{file:?}"
        );
        let stored = read_object(endpoint, BUCKET, &file.data_file_key).unwrap();
        assert_eq!(
            file.md5_checksum.as_deref(),
            Some(BASE64.encode(Md5::digest(&stored)).as_str())
        );
        let mut text = String::new();
        flate2::read::GzDecoder::new(&stored[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.lines().count() as u64, file.item_count);
        for line in text.lines() {
            let line: Value = serde_json::from_str(line).unwrap();
            let micros: i64 = line["Metadata"]["WriteTimestampMicros"]["N"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((from * 1000..to * 1000).contains(&micros), "{line}");
            let pk = line["Keys"]["pk"]["S"].as_str().unwrap().to_string();
            assert_eq!(line["Keys"], json!({"pk": {"S": pk}}));
            lines.insert(pk, line);
        }
    }
    let image = |pk: &str, v: &str| json!({"pk": {"S": pk}, "v": {"N": v}});
    assert_eq!(lines.keys().collect::<Vec<_>>(), ["x", "y", "z"]);
    assert_eq!(lines["x"]["OldImage"], image("x", "1"), "before the window");
    assert_eq!(
        lines["x"]["NewImage"],
        image("x", "3"),
        "after its last change"
    );
    assert_eq!(lines["y"]["OldImage"], image("y", "1"));
    assert!(
        lines["y"].get("NewImage").is_none(),
        "deleted: {}",
        lines["y"]
    );
    assert_eq!(lines["z"]["NewImage"], image("z", "2"));
    assert!(
        lines["z"].get("OldImage").is_none(),
        "inserted: {}",
        lines["z"]
    );
}
