//! A mirror into a real SQLite database on the in-memory table and stream: the snapshot
//! cleanup never runs after a failed or panicked segment, the next run reads only unfinished
//! segments and then cleans up (SPEC §5.3, §10 scenario 11); replaying batches changes nothing.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_keyed::{Database, KeyColumn, KeyType, SqliteDatabase, TableSpec};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::{Checkpointer, CleanupPolicy};
use ddbpipe_pipeline::runner::{NoProgress, StreamOutcome};
use ddbpipe_pipeline::sink::Sink;
use ddbpipe_pipeline::sinks::keyed::{KeyedSink, Records, SinkRetry};
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::state::{DatabaseStore, Store};
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::api::{ReadKind, TableApi};
use ddbpipe_source::config::{OnGap, StartPosition};
use ddbpipe_source::error::ApiError;
use ddbpipe_source::fake::FakeTable;
use ddbpipe_source::fake_streams::{Change, FAKE_STREAM_ARN, FakeStreams};
use ddbpipe_source::records::Lines;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::streams::engine::RunBounds;
use ddbpipe_value::ValueFormat;
use serde_json::json;

fn spec() -> TableSpec {
    TableSpec {
        table: "t".into(),
        schema: "main".into(),
        key: vec![KeyColumn {
            name: "pk".into(),
            kind: KeyType::S,
        }],
        document_column: "document".into(),
        create_table: true,
    }
}

fn settings() -> StreamRun {
    StreamRun {
        table: "t".into(),
        stream_arn: FAKE_STREAM_ARN.into(),
        format: ValueFormat::Plain,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_retries: 1,
            ..RetryPolicy::default()
        },
        records_per_request: 100,
        poll_interval: Duration::from_millis(250),
        bounds: RunBounds {
            shard_concurrency: 1,
            discovery_interval: Duration::from_secs(10),
            idle_termination: Some(Duration::from_secs(2)),
            follow: false,
        },
        start_position: StartPosition::TrimHorizon,
        on_gap: OnGap::Resnapshot,
        max_messages: None,
        batch_size: 4,
        config_label: "t.yaml".into(),
        mirror: true,
    }
}

fn sink(db: &SqliteDatabase) -> KeyedSink {
    KeyedSink::new(
        Database::Sqlite(db.clone()),
        spec(),
        ValueFormat::Plain,
        Records::Envelopes,
        SinkRetry {
            max_retries: 0,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        },
    )
}

/// One mirror run into the database at `path`.
async fn mirror<T: TableApi>(
    stream: &Arc<FakeStreams>,
    table: Arc<T>,
    path: &Path,
    max_keys: u64,
) -> Result<StreamOutcome, StreamRunError> {
    let db = SqliteDatabase::open(path).unwrap();
    let mut sink = sink(&db);
    sink.prepare().await.unwrap();
    let store = Store::Database(DatabaseStore::new(Database::Sqlite(db), spec()));
    let mut checkpointer = Checkpointer::open_streams(
        store,
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "mirror"})),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .with_cleanup(CleanupPolicy {
        deletes: true,
        max_keys,
    });
    let scan = SnapshotScan {
        api: table,
        segments: 3,
        max_concurrency: 1,
        page_limit: Some(2),
        consistent_read: false,
        read_rate: Arc::new(|_| Ok(None)),
    };
    run_streams_with_snapshots(
        Arc::clone(stream),
        Some(scan),
        &settings(),
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await
}

fn keys(path: &Path) -> BTreeSet<String> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut statement = db.prepare("SELECT pk FROM \"t\"").unwrap();
    statement
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn snapshot_open(path: &Path) -> bool {
    let db = rusqlite::Connection::open(path).unwrap();
    let meta: String = db
        .query_row(
            "SELECT value FROM _ddbpipe_state WHERE pipeline = 'p' AND part = 'meta'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    !meta["position"]["snapshot"].is_null()
}

/// The segments the open snapshot's record holds as done.
fn segments_done(path: &Path) -> BTreeSet<u32> {
    let db = rusqlite::Connection::open(path).unwrap();
    let meta: String = db
        .query_row(
            "SELECT value FROM _ddbpipe_state WHERE pipeline = 'p' AND part = 'meta'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    let mut done = BTreeSet::new();
    for range in meta["position"]["snapshot"]["done"].as_array().unwrap() {
        let (from, to) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
        done.extend((from..=to).map(|s| s as u32));
    }
    done
}

/// A destination that already holds a row the table does not have: the first mirror's
/// snapshot deletes it once complete (SPEC §5.3: the destination held rows at the capture).
async fn destination_with_a_stale_row(path: &Path) {
    let db = SqliteDatabase::open(path).unwrap();
    let mut sink = KeyedSink::new(
        Database::Sqlite(db),
        spec(),
        ValueFormat::Plain,
        Records::Items,
        SinkRetry {
            max_retries: 0,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        },
    );
    sink.prepare().await.unwrap();
    let mut records = Lines::default();
    records.push_with(|buf| buf.extend_from_slice(br#"{"pk":"stale","n":0}"#));
    let batch = Batch {
        records,
        ..Batch::default()
    };
    sink.write(&batch, None).await.unwrap();
}

fn stream() -> Arc<FakeStreams> {
    let fake = FakeStreams::new(11);
    fake.apply(Change::Root {
        shard: "s1".into(),
        range: None,
    });
    Arc::new(fake)
}

fn segments_read(table: &FakeTable) -> BTreeSet<u32> {
    table
        .requests()
        .iter()
        .filter_map(|r| match r.kind {
            ReadKind::Scan {
                segment: Some((segment, _)),
            } => Some(segment),
            _ => None,
        })
        .collect()
}

async fn no_cleanup_after_a_failed_segment(failing: FakeTable) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mirror.db");
    destination_with_a_stale_row(&path).await;
    let stream = stream();

    let outcome = mirror(&stream, Arc::new(failing), &path, 1000).await;
    assert!(outcome.is_err(), "the failed segment fails the run");
    assert!(
        keys(&path).contains("stale"),
        "no cleanup after a failed segment"
    );
    assert!(snapshot_open(&path), "the snapshot stays open");
    let written_before = keys(&path).len();
    let done = segments_done(&path);

    // The fault is gone: only unfinished segments are read, then the cleanup runs.
    let table = Arc::new(FakeTable::numbered(12));
    let outcome = mirror(&stream, Arc::clone(&table), &path, 1000).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    let read = segments_read(&table);
    assert!(read.contains(&2), "{read:?}");
    assert!(
        read.is_disjoint(&done),
        "segments done ({done:?}) are not read again: {read:?}"
    );
    let expected: BTreeSet<String> = (0..12).map(|i| format!("k{i:06}")).collect();
    assert_eq!(keys(&path), expected, "the stale row is gone");
    assert!(!snapshot_open(&path));
    assert!(written_before > 1, "the first run had committed batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_segment_leaves_the_snapshot_open_and_deletes_nothing() {
    no_cleanup_after_a_failed_segment(FakeTable::numbered(12).panic_on_segment(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_in_a_segment_leaves_the_snapshot_open_and_deletes_nothing() {
    /// Fails once the first segment was read: a fatal error mid-scan.
    struct FailLater(FakeTable);
    impl TableApi for FailLater {
        async fn read_page(
            &self,
            request: &ddbpipe_source::api::ReadRequest,
        ) -> Result<ddbpipe_source::api::Page, ApiError> {
            if matches!(
                request.kind,
                ReadKind::Scan {
                    segment: Some((2, _))
                }
            ) {
                return Err(ApiError::from_code(
                    Some("AccessDeniedException".into()),
                    "not allowed",
                ));
            }
            self.0.read_page(request).await
        }
        async fn describe_table(
            &self,
            table: &str,
        ) -> Result<Option<ddbpipe_source::api::TableDescription>, ApiError> {
            self.0.describe_table(table).await
        }
        async fn list_tables(
            &self,
            start: Option<&str>,
        ) -> Result<ddbpipe_source::api::TableNames, ApiError> {
            self.0.list_tables(start).await
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mirror.db");
    destination_with_a_stale_row(&path).await;
    let stream = stream();
    let outcome = mirror(
        &stream,
        Arc::new(FailLater(FakeTable::numbered(12))),
        &path,
        1000,
    )
    .await;
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("failed after 1 attempt"), "{error}");
    assert!(keys(&path).contains("stale"));
    assert!(snapshot_open(&path));
    let done = segments_done(&path);

    let table = Arc::new(FakeTable::numbered(12));
    mirror(&stream, Arc::clone(&table), &path, 1000)
        .await
        .unwrap();
    let read = segments_read(&table);
    assert!(
        read.contains(&2) && read.is_disjoint(&done),
        "{read:?} {done:?}"
    );
    assert!(!keys(&path).contains("stale"));
    assert!(!snapshot_open(&path));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_same_batches_leaves_the_destination_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mirror.db");
    let db = SqliteDatabase::open(&path).unwrap();
    let mut sink = sink(&db);
    sink.prepare().await.unwrap();
    let mut records = Lines::default();
    for line in [
        r#"{"after":{"pk":"a","v":1},"event_id":"1","key":{"pk":"a"},"op":"c","shard_id":"s1"}"#,
        r#"{"after":{"pk":"b","v":1},"event_id":"2","key":{"pk":"b"},"op":"c","shard_id":"s1"}"#,
        r#"{"after":{"pk":"a","v":2},"event_id":"3","key":{"pk":"a"},"op":"u","shard_id":"s1"}"#,
        r#"{"after":null,"event_id":"4","key":{"pk":"b"},"op":"d","shard_id":"s1"}"#,
    ] {
        records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    }
    let batch = Batch {
        records,
        ..Batch::default()
    };
    let contents = || {
        let db = rusqlite::Connection::open(&path).unwrap();
        let mut statement = db
            .prepare("SELECT pk, document, _ddbpipe_snapshot FROM \"t\" ORDER BY pk")
            .unwrap();
        statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<i64>>(2)?,
                ))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    };
    sink.write(&batch, None).await.unwrap();
    let once = contents();
    assert_eq!(
        once,
        [("a".to_string(), r#"{"pk":"a","v":2}"#.to_string(), None)]
    );
    sink.write(&batch, None).await.unwrap();
    assert_eq!(contents(), once);
}
