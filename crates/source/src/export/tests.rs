//! The export reader over the in-memory export service (`fake_export`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_value::{Item, Value, ValueFormat};
use tokio::sync::mpsc;

use super::api::ExportKind;
use super::*;
use crate::api::Render;
use crate::capacity::ReadLimiter;
use crate::error::{ApiError, ReadError};
use crate::fake_export::{FakeChange, FakeExports, FixedItems};
use crate::records::SegmentCursor;
use crate::retry::{Cancel, NoObserver, RetryPolicy};
use crate::scan::{PageOut, PageSource};
use crate::segments::SegmentRanges;

const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/orders";
const AT_MS: i64 = 1_700_000_000_123;

fn items(n: usize) -> Vec<Item> {
    (0..n)
        .map(|i| Item::from([("pk".to_string(), Value::S(format!("k{i:03}")))]))
        .collect()
}

fn fake(n: usize) -> FakeExports {
    FakeExports::new(
        "exports",
        FixedItems {
            items: items(n),
            at_ms: AT_MS,
            changes: Vec::new(),
        },
    )
}

fn target() -> ExportTarget {
    ExportTarget {
        table_arn: TABLE_ARN.into(),
        bucket: "exports".into(),
        prefix: "ddbpipe/orders".into(),
        bucket_owner: None,
    }
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
        attempt_timeout: Duration::from_secs(5),
    }
}

fn snapshot(
    fake: &FakeExports,
    arn: &str,
    page_lines: usize,
) -> ExportSnapshot<FakeExports, FakeExports> {
    ExportSnapshot {
        reader: ExportReader {
            exports: Arc::new(fake.clone()),
            store: Arc::new(fake.clone()),
            arn: arn.to_string(),
            max_concurrency: 2,
            kind: ExportType::Full,
            render: Render::items(ValueFormat::Plain),
            key_schema: vec![crate::api::KeyAttribute {
                name: "pk".into(),
                key_type: crate::api::KeyType::S,
            }],
            page_lines,
            retry: quick_retry(),
            observer: Arc::new(NoObserver),
            poll: ExportPoll {
                first: Duration::from_millis(1),
                max: Duration::from_millis(4),
            },
        },
        limiter: Arc::new(ReadLimiter::new(None)),
    }
}

async fn started(fake: &FakeExports) -> String {
    start(
        fake,
        &target(),
        ExportKind::Full { at_ms: None },
        "token-1",
        &quick_retry(),
        &Cancel::never(),
    )
    .await
    .unwrap()
    .arn
}

/// Reads the snapshot to its end: the pages, and the read's result.
async fn read_all(
    source: ExportSnapshot<FakeExports, FakeExports>,
    done: SegmentRanges,
    cursors: BTreeMap<u32, Item>,
) -> (Vec<PageOut>, Result<(), ReadError>) {
    let (tx, mut rx) = mpsc::channel(4);
    let task = tokio::spawn(source.read(done, cursors, tx, Cancel::never()));
    let mut pages = Vec::new();
    while let Some(page) = rx.recv().await {
        pages.push(page);
    }
    (pages, task.await.unwrap())
}

fn lines(pages: &[PageOut]) -> Vec<String> {
    let mut out: Vec<String> = pages
        .iter()
        .flat_map(|p| {
            p.records
                .iter()
                .map(|l| String::from_utf8(l.to_vec()).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_full_export_is_read_file_by_file_with_its_export_time_as_read_time() {
    let fake = fake(10).with_files(3).in_progress_for(2);
    let arn = started(&fake).await;
    let (pages, result) = read_all(
        snapshot(&fake, &arn, 2),
        SegmentRanges::new(),
        BTreeMap::new(),
    )
    .await;
    result.unwrap();
    let want: Vec<String> = (0..10).map(|i| format!(r#"{{"pk":"k{i:03}"}}"#)).collect();
    assert_eq!(lines(&pages), want);
    assert!(pages.iter().all(|p| p.requested_ms == AT_MS));
    let done: Vec<u32> = pages
        .iter()
        .filter(|p| p.cursor == SegmentCursor::Done)
        .map(|p| p.segment)
        .collect();
    assert_eq!(done.len(), 3, "each file ends once: {done:?}");
    assert_eq!(fake.calls().describes, 3, "two IN_PROGRESS, then COMPLETED");
    // A page's cursor counts the file's items handed on so far.
    let first = pages.iter().find(|p| p.segment == 0).unwrap();
    assert_eq!(first.cursor, SegmentCursor::Next(file_cursor(2)));
}

#[tokio::test]
async fn a_resumed_read_skips_done_files_and_the_items_a_cursor_counts() {
    let fake = fake(9).with_files(3);
    let arn = started(&fake).await;
    let mut done = SegmentRanges::new();
    done.insert(1);
    let cursors = BTreeMap::from([(0, file_cursor(2))]);
    let (pages, result) = read_all(snapshot(&fake, &arn, 100), done, cursors).await;
    result.unwrap();
    // File 0 holds k000, k003, k006: two were handed on; file 1 is done.
    let want: Vec<String> = ["k006", "k002", "k005", "k008"]
        .iter()
        .map(|k| format!(r#"{{"pk":"{k}"}}"#))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(lines(&pages), want);
    assert!(pages.iter().all(|p| p.segment != 1));
}

/// Rule 12: an export is read only from the bucket it was written to.
#[tokio::test]
async fn an_export_of_another_bucket_than_the_configured_one_fails_naming_both() {
    let fake = fake(6).with_files(2);
    let arn = started(&fake).await;
    let mut source = snapshot(&fake, &arn, 100);
    source.reader.store = Arc::new(fake.as_bucket("moved"));
    let (pages, result) = read_all(source, SegmentRanges::new(), BTreeMap::new()).await;
    assert!(pages.is_empty());
    let error = result.unwrap_err().to_string();
    for part in ["'exports'", "'moved'", "s3_bucket", &arn] {
        assert!(error.contains(part), "{part} in {error}");
    }
    assert!(
        fake.calls().gets.is_empty(),
        "no object fetched: {:?}",
        fake.calls().gets
    );
}

#[tokio::test]
async fn a_failed_export_fails_naming_it_and_its_failure() {
    let fake = fake(3);
    fake.fail_next_export("S3NoSuchBucket", "The bucket does not exist");
    let arn = started(&fake).await;
    let (pages, result) = read_all(
        snapshot(&fake, &arn, 10),
        SegmentRanges::new(),
        BTreeMap::new(),
    )
    .await;
    assert!(pages.is_empty());
    let error = result.unwrap_err().to_string();
    assert!(error.contains(&arn), "{error}");
    assert!(
        error.contains("FAILED (S3NoSuchBucket: The bucket does not exist)"),
        "{error}"
    );
}

#[tokio::test]
async fn a_file_whose_count_differs_never_ends_and_fails_naming_it() {
    let fake = fake(6).with_files(2);
    fake.miscount_next_export();
    let arn = started(&fake).await;
    let (pages, result) = read_all(
        snapshot(&fake, &arn, 10),
        SegmentRanges::new(),
        BTreeMap::new(),
    )
    .await;
    let error = result.unwrap_err().to_string();
    assert!(error.contains("-0000.json.gz"), "{error}");
    assert!(
        error.contains("holds 3 items but its manifest says 4"),
        "{error}"
    );
    assert!(
        !pages
            .iter()
            .any(|p| p.segment == 0 && p.cursor == SegmentCursor::Done),
        "the damaged file is not done"
    );
}

#[tokio::test]
async fn access_denied_says_which_permissions_to_grant() {
    let fake = fake(3);
    let arn = started(&fake).await;
    fake.deny_gets(Some("Access Denied"));
    let (_, result) = read_all(
        snapshot(&fake, &arn, 10),
        SegmentRanges::new(),
        BTreeMap::new(),
    )
    .await;
    let error = result.unwrap_err().to_string();
    assert!(error.contains("GetObject of s3://exports/"), "{error}");
    assert!(error.contains("AccessDenied"), "{error}");
    assert!(
        error.contains("grant the credentials s3:GetObject"),
        "{error}"
    );
}

#[tokio::test]
async fn a_transient_failure_of_a_file_reads_it_again_without_duplicates() {
    let fake = fake(8).with_files(1);
    let arn = started(&fake).await;
    let source = snapshot(&fake, &arn, 3);
    // The two manifests read, then the data file fails twice.
    let status = source.reader.wait(&Cancel::never()).await.unwrap();
    let files = source
        .reader
        .files(&status, ExportType::Full, &Cancel::never())
        .await
        .unwrap();
    fake.fail_gets([
        ApiError::from_code(Some("InternalError".into()), "try again"),
        ApiError::transport("connection reset"),
    ]);
    let (tx, mut rx) = mpsc::channel(16);
    let reader = source.reader.clone();
    let task = tokio::spawn(async move {
        reader
            .read_files(
                &files,
                &SegmentRanges::new(),
                BTreeMap::new(),
                tx,
                Cancel::never(),
            )
            .await
    });
    let mut pages = Vec::new();
    while let Some(page) = rx.recv().await {
        pages.push(page);
    }
    task.await.unwrap().unwrap();
    assert_eq!(lines(&pages).len(), 8);
}

#[tokio::test]
async fn a_body_cut_off_mid_file_is_read_again_skipping_what_was_handed_on() {
    let fake = fake(2000).with_files(1);
    let arn = started(&fake).await;
    let key = fake
        .keys()
        .into_iter()
        .find(|k| k.ends_with(".json.gz"))
        .unwrap();
    let stored = fake.object(&key).unwrap().len();
    // Cut well inside the file: some pages were handed on before the connection broke.
    fake.cut_next_body(".json.gz", stored / 2);
    let (pages, result) = read_all(
        snapshot(&fake, &arn, 100),
        SegmentRanges::new(),
        BTreeMap::new(),
    )
    .await;
    result.unwrap();
    let all = lines(&pages);
    let distinct: std::collections::BTreeSet<&String> = all.iter().collect();
    assert_eq!(
        all.len(),
        2000,
        "every item once: nothing skipped, nothing twice"
    );
    assert_eq!(distinct.len(), 2000);
    let data_gets = fake
        .calls()
        .gets
        .iter()
        .filter(|k| k.ends_with(".json.gz"))
        .count();
    assert_eq!(data_gets, 2, "the file was requested again after the cut");
}

#[tokio::test]
async fn the_same_client_token_returns_the_same_export() {
    let fake = fake(3);
    let first = started(&fake).await;
    let second = started(&fake).await;
    assert_eq!(first, second);
    assert_eq!(fake.calls().started, 1);
}

#[tokio::test]
async fn a_given_export_must_be_a_full_export_of_this_table() {
    let fake = fake(3);
    let arn = started(&fake).await;
    given(&fake, &arn, TABLE_ARN, &quick_retry(), &Cancel::never())
        .await
        .unwrap();
    let error = given(
        &fake,
        &arn,
        "arn:aws:dynamodb:us-east-1:1:table/other",
        &quick_retry(),
        &Cancel::never(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("not of arn:aws:dynamodb:us-east-1:1:table/other"),
        "{error}"
    );
    let error = given(
        &fake,
        "arn:aws:dynamodb:us-east-1:1:table/orders/export/x",
        TABLE_ARN,
        &quick_retry(),
        &Cancel::never(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("ExportNotFoundException"), "{error}");
    assert!(
        error.contains("check source.snapshot.export_arn"),
        "{error}"
    );
}

/// An incremental export read through the engine: each changed key once, as a change envelope
/// at its exact write time; the export named by the record is resumed, not started again.
#[tokio::test]
async fn an_incremental_export_is_read_as_change_envelopes_and_resumed_by_its_arn() {
    use crate::api::SnapshotShape;
    let key = |k: &str| Item::from([("pk".to_string(), Value::S(k.into()))]);
    let with_v = |k: &str, v: &str| {
        Item::from([
            ("pk".to_string(), Value::S(k.into())),
            ("v".to_string(), Value::N(ddbpipe_value::Number::new(v))),
        ])
    };
    let changes = vec![
        FakeChange {
            micros: AT_MS * 1000 + 456,
            keys: key("a"),
            new: Some(with_v("a", "2")),
            old: Some(with_v("a", "1")),
        },
        FakeChange {
            micros: AT_MS * 1000 + 1_000_000,
            keys: key("b"),
            new: None,
            old: Some(key("b")),
        },
        // Outside the window.
        FakeChange {
            micros: (AT_MS + 10_000_000) * 1000,
            keys: key("c"),
            new: Some(key("c")),
            old: None,
        },
    ];
    let fake = FakeExports::new(
        "exports",
        FixedItems {
            items: Vec::new(),
            at_ms: AT_MS + 20_000_000,
            changes,
        },
    )
    .with_files(2);
    let engine = ExportEngine {
        exports: Arc::new(fake.clone()),
        store: Arc::new(fake.clone()),
        prefix: "ddbpipe/orders".into(),
        bucket_owner: None,
        given_arn: None,
        max_concurrency: 2,
        page_lines: 10,
        retry: quick_retry(),
        observer: Arc::new(NoObserver),
        poll: ExportPoll {
            first: Duration::from_millis(1),
            max: Duration::from_millis(2),
        },
    };
    let window = (AT_MS - 1_000, AT_MS + 1_000_000_i64 * 5);
    let cancel = Cancel::never();
    let arn = engine
        .begin_incremental(None, TABLE_ARN, window, "7", &cancel)
        .await
        .unwrap();
    let again = engine
        .begin_incremental(Some(&arn), TABLE_ARN, window, "7", &cancel)
        .await
        .unwrap();
    assert_eq!(again, arn);
    assert_eq!(fake.calls().started, 1, "the stored export is resumed");
    let request = &fake.calls().start_requests[0];
    assert_eq!(
        request.kind,
        ExportKind::Incremental {
            from_ms: window.0,
            to_ms: window.1
        }
    );
    let shape = Arc::new(SnapshotShape {
        key_schema: Vec::new(),
        table: "orders".into(),
        format: ValueFormat::Plain,
    });
    let reader = engine.typed_reader_of(
        &arn,
        ExportType::Incremental,
        Render::Snapshots(shape),
        Vec::new(),
    );
    let (pages, result) = read_all(reader, SegmentRanges::new(), BTreeMap::new()).await;
    result.unwrap();
    let envelopes: Vec<serde_json::Value> = lines(&pages)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(envelopes.len(), 2, "{envelopes:?}");
    let by_key = |k: &str| {
        envelopes
            .iter()
            .find(|e| e["key"]["pk"] == k)
            .unwrap()
            .clone()
    };
    assert_eq!(by_key("a")["op"], "u");
    assert_eq!(by_key("a")["after"]["v"], 2);
    assert_eq!(by_key("a")["ts_ms"], AT_MS);
    assert_eq!(by_key("b")["op"], "d");
    assert_eq!(by_key("b")["ts_ms"], AT_MS + 1000);
    assert!(envelopes.iter().all(|e| e["sequence_number"].is_null()));

    // A full export is not an incremental one.
    let full = started(&fake).await;
    let shape = Arc::new(SnapshotShape {
        key_schema: Vec::new(),
        table: "orders".into(),
        format: ValueFormat::Plain,
    });
    let reader = engine.typed_reader_of(
        &full,
        ExportType::Incremental,
        Render::Snapshots(shape),
        Vec::new(),
    );
    let (_, result) = read_all(reader, SegmentRanges::new(), BTreeMap::new()).await;
    assert!(
        result.unwrap_err().to_string().contains("INCREMENTAL"),
        "the type is checked"
    );
}
