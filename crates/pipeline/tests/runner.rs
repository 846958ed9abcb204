//! The scan runner on the in-memory table, with paused time: ordering of acknowledgements and
//! commits, failures, panics, stops and the read limit.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, RunError, run_scan};
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::api::{ReadRequest, Render};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::config::SourceConfig;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::fake::FakeTable;
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::{Position, ScanKind};
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::scan::{self, SegmentReader};
use ddbpipe_testkit::MemorySink;
use ddbpipe_value::ValueFormat;
use serde_json::json;

fn reader(
    table: Arc<FakeTable>,
    segments: u32,
    page_limit: u32,
    rate: Option<f64>,
) -> SegmentReader<FakeTable> {
    SegmentReader {
        api: table,
        template: ReadRequest {
            limit: Some(page_limit),
            ..scan::read_template(&SourceConfig::new("t"))
        },
        total_segments: segments,
        max_concurrency: 3,
        limiter: Arc::new(ReadLimiter::new(rate)),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
        render: Render::items(ValueFormat::Plain),
        observer: Arc::new(NoObserver),
        slots: Default::default(),
    }
}

async fn checkpointer(dir: &std::path::Path, segments: u32) -> Checkpointer {
    Checkpointer::open_scan(
        StateFile::new(dir.join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "segments": segments})),
        ScanKind::Scan,
        segments,
        Duration::ZERO,
    )
    .await
    .unwrap()
}

fn keys(lines: &[String]) -> BTreeSet<String> {
    ddbpipe_testkit::pks(lines.iter().map(String::as_str))
        .into_iter()
        .collect()
}

fn stored_position(dir: &std::path::Path) -> Option<Position> {
    StateFile::new(dir.join("state.json"))
        .load("p")
        .unwrap()
        .and_then(|e| e.position)
}

/// docs/scan.md §2.5: a batch is handed over at its byte bound, however few records it holds
/// (items of 400 KB would otherwise make batches of gigabytes).
#[tokio::test(start_paused = true)]
async fn batches_stay_within_their_byte_bound_and_every_item_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(1000));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    let limits = BatchLimits {
        records: 5000,
        bytes: 1024,
        whole_pages: false,
    };
    let outcome = run_scan(
        reader(table, 4, 100, None),
        limits,
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert!(outcome.completed);
    assert_eq!(keys(&sink.lines).len(), 1000);
    assert_eq!(sink.lines.len(), 1000);
    let sizes: Vec<usize> = sink
        .batches
        .iter()
        .map(|b| {
            sink.lines[b.first..b.first + b.len]
                .iter()
                .map(|line| line.len() + 1)
                .sum()
        })
        .collect();
    assert!(
        sizes.iter().all(|&bytes| bytes <= limits.bytes),
        "batch sizes in bytes: {sizes:?}"
    );
    // 1000 lines of 24 bytes: at least 24 batches of at most 1 KiB.
    assert!(sizes.len() >= 24, "{} batches", sizes.len());
}

#[tokio::test(start_paused = true)]
async fn every_item_is_written_once_and_completion_clears_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(1000));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    let outcome = run_scan(
        reader(table, 4, 30, None),
        BatchLimits::records(50),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert!(outcome.completed);
    assert_eq!((outcome.read, outcome.written), (1000, 1000));
    assert_eq!(sink.lines.len(), 1000);
    assert_eq!(keys(&sink.lines).len(), 1000);
    let entry = StateFile::new(dir.path().join("state.json"))
        .load("p")
        .unwrap()
        .unwrap();
    assert_eq!(entry.position, None);
    assert_eq!(entry.last_completed.unwrap()["items"], 1000);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_segment_fails_the_run_and_is_never_recorded_done() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(300).panic_on_segment(2));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    let error = run_scan(
        reader(table, 4, 10, None),
        BatchLimits::records(10),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("internal error: segment 2 task panicked: scripted panic in segment 2"),
        "{error}"
    );
    if let Some(Position::Scan(scan)) = stored_position(dir.path()) {
        assert!(!scan.done.contains(2), "a panicked segment is not done");
        assert!(!scan.cursors.contains_key(&2));
    }
}

#[tokio::test(start_paused = true)]
async fn a_sink_failure_commits_only_acknowledged_batches() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(200));
    let mut sink = MemorySink::default().failing_at(3);
    let mut cp = checkpointer(dir.path(), 1).await;
    let error = run_scan(
        reader(table.clone(), 1, 10, None),
        BatchLimits::records(10),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RunError::Sink(_)), "{error}");
    assert_eq!(sink.lines.len(), 30);
    let Some(Position::Scan(scan)) = stored_position(dir.path()) else {
        panic!("a position was committed");
    };
    // The cursor is the last key of the third (last acknowledged) batch.
    let cursor = &scan.cursors[&0];
    assert_eq!(cursor["pk"], ddbpipe_value::Value::S("k000029".into()));

    // Resuming from it reads exactly the rest.
    let mut sink2 = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 1).await;
    let outcome = run_scan(
        reader(table, 1, 10, None),
        BatchLimits::records(10),
        &mut sink2,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(outcome.read, 170);
    let mut all = sink.lines.clone();
    all.extend(sink2.lines);
    assert_eq!(keys(&all).len(), 200);
    assert_eq!(all.len(), 200, "nothing was read twice");
}

#[tokio::test(start_paused = true)]
async fn a_fatal_read_error_drops_the_batch_being_assembled() {
    let dir = tempfile::tempdir().unwrap();
    let fatal = ApiError::from_code(Some("ValidationException".into()), "bad");
    let table = Arc::new(FakeTable::numbered(100).fail_next([fatal]));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 1).await;
    let error = run_scan(
        reader(table, 1, 10, None),
        BatchLimits::records(10),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "scan of 't' failed after 1 attempt(s): ValidationException: bad"
    );
    assert!(sink.lines.is_empty());
    assert_eq!(stored_position(dir.path()), None);
}

#[tokio::test(start_paused = true)]
async fn a_stop_hands_over_what_was_read_and_saves_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(400));
    let (handle, cancel) = Cancel::new();
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    // 2 units/s and 1 unit per page: the scan takes about 40 s of fake time.
    let run = run_scan(
        reader(table.clone(), 4, 10, Some(1.0)),
        BatchLimits::records(10),
        &mut sink,
        &mut cp,
        cancel,
        &NoProgress,
    );
    let stopper = async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        handle.cancel();
    };
    let (outcome, ()) = tokio::join!(run, stopper);
    let outcome = outcome.unwrap();
    assert!(!outcome.completed);
    assert_eq!(
        outcome.written, outcome.read,
        "everything read was handed over"
    );
    assert!(outcome.written > 0 && outcome.written < 400);
    let Some(Position::Scan(scan)) = stored_position(dir.path()) else {
        panic!("the position was saved");
    };
    assert!(scan.has_progress());

    let mut rest = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    let outcome = run_scan(
        reader(table, 4, 10, None),
        BatchLimits::records(10),
        &mut rest,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert!(outcome.completed);
    let mut all = sink.lines.clone();
    all.extend(rest.lines);
    assert_eq!(keys(&all).len(), 400);
}

#[tokio::test(start_paused = true)]
async fn thirty_pages_of_ten_units_under_a_limit_of_twenty_take_at_least_fourteen_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(300).units_per_page(Some(10.0)));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 1).await;
    let started = tokio::time::Instant::now();
    let outcome = run_scan(
        reader(table.clone(), 1, 10, Some(20.0)),
        BatchLimits::records(100),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(outcome.written, 300);
    assert_eq!(table.requests().len(), 30);
    assert!(
        started.elapsed() >= Duration::from_secs(14),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcome.capacity_units, 300.0);
}

#[tokio::test(start_paused = true)]
async fn throttles_are_retried_and_halve_the_limited_rate() {
    let dir = tempfile::tempdir().unwrap();
    let throttle = || {
        ApiError::from_code(
            Some("ProvisionedThroughputExceededException".into()),
            "slow down",
        )
    };
    let table = Arc::new(FakeTable::numbered(50).fail_next([throttle(), throttle()]));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 1).await;
    let reader = reader(table.clone(), 1, 100, Some(100.0));
    let limiter = Arc::clone(&reader.limiter);
    let outcome = run_scan(
        reader,
        BatchLimits::records(100),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(outcome.written, 50);
    assert_eq!(table.requests().len(), 3, "two throttles, then success");
    assert!(limiter.rate().unwrap() < 100.0, "the rate was halved");
}

#[tokio::test(start_paused = true)]
async fn a_resumed_scan_skips_done_segments_and_continues_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(100));
    let mut sink = MemorySink::default().failing_at(4);
    let mut cp = checkpointer(dir.path(), 4).await;
    let _ = run_scan(
        reader(table.clone(), 4, 5, None),
        BatchLimits::records(5),
        &mut sink,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await;
    let before = table.requests().len();
    let mut rest = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    run_scan(
        reader(table.clone(), 4, 5, None),
        BatchLimits::records(5),
        &mut rest,
        &mut cp,
        Cancel::never(),
        &NoProgress,
    )
    .await
    .unwrap();
    let requests = table.requests();
    assert!(
        requests[before..]
            .iter()
            .any(|r| r.exclusive_start_key.is_some()),
        "a cursor was continued"
    );
    let mut all = sink.lines.clone();
    all.extend(rest.lines);
    assert_eq!(keys(&all).len(), 100);
    assert_eq!(all.len(), 100, "acknowledged pages were not read again");
}

mod export {
    //! The runner over an export (docs/scan.md §2.10): a crash in the middle of the files
    //! resumes from the acknowledged items without a second export, and file progress belongs
    //! to its export.

    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    use ddbpipe_pipeline::checkpoint::Checkpointer;
    use ddbpipe_pipeline::runner::{NoProgress, run_scan};
    use ddbpipe_pipeline::state::StateFile;
    use ddbpipe_pipeline::state::identity::Identity;
    use ddbpipe_source::api::Render;
    use ddbpipe_source::export::api::ExportKind;
    use ddbpipe_source::export::{
        ExportEngine, ExportPoll, ExportTarget, GivenExport, SnapshotExports, start,
    };
    use ddbpipe_source::fake_export::{FakeExports, FixedItems};
    use ddbpipe_source::plan::BatchLimits;
    use ddbpipe_source::position::{Position, ScanKind};
    use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
    use ddbpipe_testkit::MemorySink;
    use ddbpipe_value::{Item, Value, ValueFormat};
    use serde_json::json;

    use super::{keys, stored_position};

    const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:1:table/t";

    fn engine(fake: &FakeExports) -> ExportEngine<FakeExports, FakeExports> {
        ExportEngine {
            exports: Arc::new(fake.clone()),
            store: Arc::new(fake.clone()),
            prefix: "ddbpipe/p".into(),
            bucket_owner: None,
            given_arn: None,
            max_concurrency: 2,
            page_lines: 7,
            retry: RetryPolicy::default(),
            observer: Arc::new(NoObserver),
            poll: ExportPoll {
                first: Duration::from_millis(1),
                max: Duration::from_millis(1),
            },
        }
    }

    async fn checkpointer(dir: &std::path::Path) -> Checkpointer {
        Checkpointer::open_scan(
            StateFile::new(dir.join("state.json")),
            "p",
            Identity::from_json(json!({"table_name": "t"})),
            ScanKind::Export,
            0,
            Duration::ZERO,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_crash_among_the_files_resumes_the_same_export_without_duplicates() {
        let items: Vec<Item> = (0..100)
            .map(|i| Item::from([("pk".to_string(), Value::S(format!("k{i:06}")))]))
            .collect();
        let fake = FakeExports::new(
            "b",
            FixedItems {
                items,
                at_ms: 1_700_000_000_000,
                changes: Vec::new(),
            },
        )
        .with_files(4);
        let engine = engine(&fake);
        let dir = tempfile::tempdir().unwrap();
        let mut cp = checkpointer(dir.path()).await;
        let arn = engine
            .begin(
                None,
                TABLE_ARN,
                "run-1",
                GivenExport::Read,
                &Cancel::never(),
            )
            .await
            .unwrap();
        cp.set_export(&arn).await.unwrap();
        let mut first = MemorySink::default().failing_at(5);
        let reader = engine.typed_reader(&arn, Render::items(ValueFormat::Plain), Vec::new());
        run_scan(
            reader,
            BatchLimits::records(5),
            &mut first,
            &mut cp,
            Cancel::never(),
            &NoProgress,
        )
        .await
        .unwrap_err();
        let Some(Position::Scan(stored)) = stored_position(dir.path()) else {
            panic!("the export's position was committed");
        };
        assert_eq!(stored.export_arn.as_deref(), Some(arn.as_str()));
        assert!(stored.has_progress(), "{stored:?}");

        let mut cp = checkpointer(dir.path()).await;
        let resumed = cp.position().export_arn.clone();
        let again = engine
            .begin(
                resumed.as_deref(),
                TABLE_ARN,
                "run-2",
                GivenExport::Read,
                &Cancel::never(),
            )
            .await
            .unwrap();
        assert_eq!(again, arn, "the stored export is read again");
        let mut rest = MemorySink::default();
        let reader = engine.typed_reader(&arn, Render::items(ValueFormat::Plain), Vec::new());
        let outcome = run_scan(
            reader,
            BatchLimits::records(5),
            &mut rest,
            &mut cp,
            Cancel::never(),
            &NoProgress,
        )
        .await
        .unwrap();
        assert!(outcome.completed);
        let before: BTreeSet<String> = keys(&first.lines);
        let after: BTreeSet<String> = keys(&rest.lines);
        assert_eq!(
            first.lines.len(),
            25,
            "five batches acknowledged before the failing one"
        );
        assert!(
            before.is_disjoint(&after),
            "no acknowledged item is written twice"
        );
        assert_eq!(before.len() + after.len(), 100);
        assert_eq!(rest.lines.len(), after.len());
        assert_eq!(fake.calls().started, 1, "no second export");
        assert!(
            stored_position(dir.path()).is_none(),
            "a completed read clears its position"
        );
    }

    #[tokio::test]
    async fn recording_another_export_starts_its_files_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeExports::new(
            "b",
            FixedItems {
                items: Vec::new(),
                at_ms: 1,
                changes: Vec::new(),
            },
        );
        let target = ExportTarget {
            table_arn: TABLE_ARN.into(),
            bucket: "b".into(),
            prefix: "p".into(),
            bucket_owner: None,
        };
        let full = ExportKind::Full { at_ms: None };
        let retry = RetryPolicy::default();
        let one = start(&fake, &target, full, "t1", &retry, &Cancel::never())
            .await
            .unwrap();
        let two = start(&fake, &target, full, "t2", &retry, &Cancel::never())
            .await
            .unwrap();
        let mut cp = checkpointer(dir.path()).await;
        cp.set_export(&one.arn).await.unwrap();
        let mut batch = ddbpipe_pipeline::batch::Batch::default();
        batch
            .segments
            .push((1, ddbpipe_source::records::SegmentCursor::Done));
        let staged = cp.stage(&batch);
        cp.acknowledged(&batch, staged).await.unwrap();
        cp.flush().await.unwrap();
        assert_eq!(cp.position().done.count(), 1);
        cp.set_export(&one.arn).await.unwrap();
        assert_eq!(
            cp.position().done.count(),
            1,
            "the same export keeps its files"
        );
        cp.set_export(&two.arn).await.unwrap();
        assert_eq!(
            cp.position().done.count(),
            0,
            "another export's files start afresh"
        );
        assert_eq!(cp.position().export_arn.as_deref(), Some(two.arn.as_str()));
    }
}
