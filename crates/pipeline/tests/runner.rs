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
        render: Render::Items(ValueFormat::Plain),
        observer: Arc::new(NoObserver),
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
    lines
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["pk"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn stored_position(dir: &std::path::Path) -> Option<Position> {
    StateFile::new(dir.join("state.json"))
        .load("p")
        .unwrap()
        .and_then(|e| e.position)
}

#[tokio::test(start_paused = true)]
async fn every_item_is_written_once_and_completion_clears_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(FakeTable::numbered(1000));
    let mut sink = MemorySink::default();
    let mut cp = checkpointer(dir.path(), 4).await;
    let outcome = run_scan(
        reader(table, 4, 30, None),
        50,
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
        10,
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
        10,
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
        10,
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
        10,
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
        10,
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
        10,
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
        100,
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
        100,
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
        5,
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
        5,
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
