//! A mirror into a real keyed database (SQLite and PostgreSQL) on the in-memory table and
//! stream: the snapshot cleanup never runs after a failed or panicked segment, the next run reads
//! only unfinished segments and then cleans up (docs/mirror.md §5.3, docs/testing.md §10 scenario 11); replaying batches
//! changes nothing.
//!
//! Every scenario runs once per [`Target`] (modules `sqlite` and `postgres`). The PostgreSQL
//! server comes from `DDBPIPE_TEST_POSTGRES_URL`, which `scripts/test.sh` sets (it starts a
//! throwaway server); without it the PostgreSQL tests fail. Each PostgreSQL test works in its
//! own schema (random name, dropped at the end, even after a failure).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{Database, KeyColumn, KeyType, PostgresDatabase, SqliteDatabase, TableSpec};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::{Checkpointer, CleanupPolicy};
use ddbpipe_pipeline::leased::{LeasedMirror, LeasedMirrorOutcome, LeasedScan, LeasedStreams};
use ddbpipe_pipeline::runner::{NoProgress, StreamOutcome};
use ddbpipe_pipeline::sink::{Fence, Fencing, Records, Sink, SinkErrorClass};
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{
    SnapshotScan, StreamRun, StreamRunError, run_streams_with_snapshots,
};
use ddbpipe_source::api::{KeyAttribute, ReadKind, Render, SnapshotShape, TableApi};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::config::OnGap;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::fake::FakeTable;
use ddbpipe_source::fake_streams::{Change, FakeStreamTable, FakeStreams};
use ddbpipe_source::lease::memory::MemoryLeaseTable;
use ddbpipe_source::lease::{
    LeaseSettings, LeaseState, LeaseTable as _, PipelineName, UnitId, Worker, WorkerId,
};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::StreamKind;
use ddbpipe_source::records::Lines;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::scan::{SegmentReader, snapshot_template};
use ddbpipe_source::streams::engine::RunBounds;
use ddbpipe_testkit::postgres::{self as test_postgres, TestSchema};
use ddbpipe_value::ValueFormat;
use serde_json::{Value, json};

/// Which database a scenario mirrors into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A SQLite file in a temporary directory.
    Sqlite,
    /// A fresh schema in the PostgreSQL server of `DDBPIPE_TEST_POSTGRES_URL`.
    Postgres,
}

/// The destination database of one test: a SQLite file, or a fresh PostgreSQL schema that is
/// dropped when the destination is (also when the test failed).
struct Destination {
    target: Target,
    /// Holds the SQLite file (unused for PostgreSQL).
    dir: tempfile::TempDir,
    /// The PostgreSQL schema (SQLite: `main`).
    schema: String,
    /// The PostgreSQL admin connection.
    admin: Option<tokio_postgres::Client>,
    /// Drops the PostgreSQL schema with the destination.
    _owned: Option<TestSchema>,
}

impl Destination {
    async fn new(target: Target) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (schema, admin, owned) = match target {
            Target::Sqlite => ("main".to_string(), None, None),
            Target::Postgres => {
                let admin = test_postgres::connect().await;
                let owned = TestSchema::create(&admin, "keyed_mirror").await;
                (owned.name().to_string(), Some(admin), Some(owned))
            }
        };
        Destination {
            target,
            dir,
            schema,
            admin,
            _owned: owned,
        }
    }

    fn sqlite_path(&self) -> PathBuf {
        self.dir.path().join("mirror.db")
    }

    /// The mirrored table `t`, keyed by `pk` (S), in this destination's schema.
    fn spec(&self) -> TableSpec {
        TableSpec {
            table: "t".into(),
            schema: self.schema.clone(),
            key: vec![KeyColumn {
                name: "pk".into(),
                kind: KeyType::S,
            }],
            document_column: Some("document".into()),
            columns: Vec::new(),
            document_type: ddbpipe_keyed::DocumentType::Jsonb,
            create_table: true,
        }
    }

    /// A new handle on the database, as a run opens it.
    async fn database(&self) -> Database {
        match self.target {
            Target::Sqlite => Database::from(SqliteDatabase::open(&self.sqlite_path()).unwrap()),
            Target::Postgres => Database::from(
                PostgresDatabase::connect(&test_postgres::url())
                    .await
                    .unwrap()
                    .with_schema(&self.schema),
            ),
        }
    }

    /// The rows of `t` ordered by `pk`: the key, the document and the snapshot marker.
    async fn rows(&self) -> Vec<(String, Value, Option<i64>)> {
        const COLUMNS: &str = "pk, document, _ddbpipe_snapshot";
        let rows: Vec<(String, String, Option<i64>)> = match &self.admin {
            None => {
                let db = rusqlite::Connection::open(self.sqlite_path()).unwrap();
                let mut statement = db
                    .prepare(&format!("SELECT {COLUMNS} FROM \"t\" ORDER BY pk"))
                    .unwrap();
                statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Some(admin) => admin
                .query(
                    &format!(
                        "SELECT pk, document::text, _ddbpipe_snapshot FROM \"{}\".\"t\" \
                         ORDER BY pk",
                        self.schema
                    ),
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect(),
        };
        rows.into_iter()
            .map(|(pk, document, snapshot)| {
                (pk, serde_json::from_str(&document).unwrap(), snapshot)
            })
            .collect()
    }

    /// Runs SQL in this destination (`sqlite` or `postgres`, whichever it is).
    async fn execute(&self, sqlite: &str, postgres: &str) {
        match &self.admin {
            None => rusqlite::Connection::open(self.sqlite_path())
                .unwrap()
                .execute_batch(sqlite)
                .unwrap(),
            Some(admin) => admin
                .batch_execute(&format!(
                    "SET search_path TO \"{}\"; {postgres}",
                    self.schema
                ))
                .await
                .unwrap(),
        }
    }

    /// The keys of the rows of `t`.
    async fn keys(&self) -> BTreeSet<String> {
        match &self.admin {
            None => {
                let db = rusqlite::Connection::open(self.sqlite_path()).unwrap();
                let mut statement = db.prepare("SELECT pk FROM \"t\"").unwrap();
                statement
                    .query_map([], |row| row.get::<_, String>(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Some(admin) => admin
                .query(&format!("SELECT pk FROM \"{}\".\"t\"", self.schema), &[])
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect(),
        }
    }

    /// The `meta` state part of pipeline `p`, read through the generic state API.
    async fn meta(&self) -> Value {
        let parts = self.database().await.load_state("p").await.unwrap();
        serde_json::from_str(&parts["meta"]).unwrap()
    }

    /// Whether the state records an open snapshot.
    async fn snapshot_open(&self) -> bool {
        !self.meta().await["position"]["snapshot"].is_null()
    }

    /// The segments the open snapshot's record holds as done.
    async fn segments_done(&self) -> BTreeSet<u32> {
        let meta = self.meta().await;
        let mut done = BTreeSet::new();
        for range in meta["position"]["snapshot"]["done"].as_array().unwrap() {
            let (from, to) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
            done.extend((from..=to).map(|s| s as u32));
        }
        done
    }
}

fn settings() -> StreamRun {
    let base = ddbpipe_testkit::fake_stream_run();
    StreamRun {
        retry: RetryPolicy {
            max_retries: 1,
            ..base.retry
        },
        bounds: RunBounds {
            idle_termination: Some(Duration::from_secs(2)),
            ..base.bounds
        },
        on_gap: OnGap::Resnapshot,
        batch: BatchLimits::records(4),
        kind: StreamKind::Mirror,
        ..base
    }
}

/// A prepared sink into `destination` taking `records`.
async fn sink(destination: &Destination, records: Records) -> KeyedSink {
    let sink = KeyedSink::new(
        destination.database().await,
        destination.spec(),
        ValueFormat::Plain,
        records,
        SinkRetry {
            max_retries: 0,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        },
    );
    sink.prepare().await.unwrap();
    sink
}

/// One mirror run into `destination`.
async fn mirror<T: TableApi>(
    stream: &Arc<FakeStreams>,
    table: Arc<T>,
    destination: &Destination,
    max_keys: u64,
) -> Result<StreamOutcome, StreamRunError> {
    let mut sink = sink(destination, Records::Envelopes).await;
    let mut checkpointer = Checkpointer::open_streams(
        sink.state_store(),
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
        read_rule: ddbpipe_source::plan::ReadRule::default(),
        exports: None,
        repairs: None,
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

/// A destination that already holds a row the table does not have: the first mirror's
/// snapshot deletes it once complete (docs/mirror.md §5.3: the destination held rows at the capture).
async fn destination_with_a_stale_row(target: Target) -> Destination {
    let destination = Destination::new(target).await;
    let mut sink = sink(&destination, Records::Items).await;
    let mut records = Lines::default();
    records.push_with(|buf| buf.extend_from_slice(br#"{"pk":"stale","n":0}"#));
    let batch = Batch {
        records,
        ..Batch::default()
    };
    sink.write(&batch, None).await.unwrap();
    destination
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

async fn no_cleanup_after_a_failed_segment(target: Target, failing: FakeTable) {
    let destination = destination_with_a_stale_row(target).await;
    let stream = stream();

    let outcome = mirror(&stream, Arc::new(failing), &destination, 1000).await;
    assert!(outcome.is_err(), "the failed segment fails the run");
    assert!(
        destination.keys().await.contains("stale"),
        "no cleanup after a failed segment"
    );
    assert!(destination.snapshot_open().await, "the snapshot stays open");
    let written_before = destination.keys().await.len();
    let done = destination.segments_done().await;

    // The fault is gone: only unfinished segments are read, then the cleanup runs.
    let table = Arc::new(FakeTable::numbered(12));
    let outcome = mirror(&stream, Arc::clone(&table), &destination, 1000).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    let read = segments_read(&table);
    assert!(read.contains(&2), "{read:?}");
    assert!(
        read.is_disjoint(&done),
        "segments done ({done:?}) are not read again: {read:?}"
    );
    let expected: BTreeSet<String> = (0..12).map(|i| format!("k{i:06}")).collect();
    assert_eq!(destination.keys().await, expected, "the stale row is gone");
    assert!(!destination.snapshot_open().await);
    assert!(written_before > 1, "the first run had committed batches");
}

/// docs/mirror.md §5.3: a cleanup that fails rolls back; the snapshot stays open as `complete`, and the
/// next run retries only the cleanup — it does not scan again.
async fn a_failed_cleanup_is_retried_by_the_next_run_without_scanning(target: Target) {
    let destination = destination_with_a_stale_row(target).await;
    destination
        .execute(
            "CREATE TRIGGER refuse BEFORE DELETE ON t BEGIN SELECT RAISE(ABORT, 'no deletes'); END;",
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'no deletes'; END $$; \
             CREATE TRIGGER refuse BEFORE DELETE ON t FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .await;
    let stream = stream();
    let outcome = mirror(
        &stream,
        Arc::new(FakeTable::numbered(12)),
        &destination,
        1000,
    )
    .await;
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("no deletes"), "{error}");
    let meta = destination.meta().await;
    assert_eq!(meta["position"]["snapshot"]["complete"], true, "{meta}");
    assert!(destination.keys().await.contains("stale"), "rolled back");

    destination
        .execute("DROP TRIGGER refuse;", "DROP TRIGGER refuse ON t;")
        .await;
    let table = Arc::new(FakeTable::numbered(12));
    let listed = stream.calls().describe;
    mirror(&stream, Arc::clone(&table), &destination, 1000)
        .await
        .unwrap();
    assert!(table.requests().is_empty(), "no second scan");
    // Only closing the snapshot took no time: the start-up listing stays current.
    let listings = stream.calls().describe - listed;
    assert_eq!(listings, 1, "the stream was listed {listings} times");
    let expected: BTreeSet<String> = (0..12).map(|i| format!("k{i:06}")).collect();
    assert_eq!(destination.keys().await, expected, "the stale row is gone");
    assert!(!destination.snapshot_open().await);
}

async fn a_panicked_segment_leaves_the_snapshot_open_and_deletes_nothing(target: Target) {
    no_cleanup_after_a_failed_segment(target, FakeTable::numbered(12).panic_on_segment(2)).await;
}

async fn a_fatal_error_in_a_segment_leaves_the_snapshot_open_and_deletes_nothing(target: Target) {
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
    let destination = destination_with_a_stale_row(target).await;
    let stream = stream();
    let outcome = mirror(
        &stream,
        Arc::new(FailLater(FakeTable::numbered(12))),
        &destination,
        1000,
    )
    .await;
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("failed after 1 attempt"), "{error}");
    assert!(destination.keys().await.contains("stale"));
    assert!(destination.snapshot_open().await);
    let done = destination.segments_done().await;

    let table = Arc::new(FakeTable::numbered(12));
    mirror(&stream, Arc::clone(&table), &destination, 1000)
        .await
        .unwrap();
    let read = segments_read(&table);
    assert!(
        read.contains(&2) && read.is_disjoint(&done),
        "{read:?} {done:?}"
    );
    assert!(!destination.keys().await.contains("stale"));
    assert!(!destination.snapshot_open().await);
}

async fn replaying_the_same_batches_leaves_the_destination_unchanged(target: Target) {
    let destination = Destination::new(target).await;
    let mut sink = sink(&destination, Records::Envelopes).await;
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
    sink.write(&batch, None).await.unwrap();
    let once = destination.rows().await;
    assert_eq!(once, [("a".to_string(), json!({"pk": "a", "v": 2}), None)]);
    sink.write(&batch, None).await.unwrap();
    assert_eq!(destination.rows().await, once);
}

/// One worker `id` of a mirror shared through `leases` (docs/coordination.md §11.12): 3
/// segments of 2 items a page of `table`, then `stream`, ending idle after 2 s.
fn shared_mirror<TA: TableApi>(
    table: &Arc<TA>,
    stream: &Arc<FakeStreams>,
    leases: &MemoryLeaseTable,
    id: &str,
    max_keys: u64,
) -> LeasedMirror<TA, FakeStreams, MemoryLeaseTable> {
    let worker = || {
        Worker::new(
            leases.connect(),
            PipelineName::new("p").unwrap(),
            WorkerId::new(id).unwrap(),
            LeaseSettings::new(3).unwrap(),
        )
    };
    let identity = Identity::from_json(json!({"table_name": "t", "mode": "mirror"}));
    let render = Render::Snapshots(Arc::new(SnapshotShape {
        key_schema: vec![KeyAttribute {
            name: "pk".into(),
            key_type: KeyType::S,
        }],
        table: "t".into(),
        format: ValueFormat::Plain,
    }));
    LeasedMirror {
        scan: LeasedScan {
            reader: SegmentReader {
                api: Arc::clone(table),
                template: snapshot_template("t", false, Some(2)),
                total_segments: 3,
                max_concurrency: 2,
                limiter: Arc::new(ReadLimiter::new(None)),
                retry: RetryPolicy::default(),
                render,
                observer: Arc::new(NoObserver),
                slots: Default::default(),
            },
            worker: worker(),
            batch: BatchLimits::records(4),
            checkpoint_interval: Duration::ZERO,
            identity: identity.clone(),
        },
        streams: LeasedStreams {
            api: Arc::clone(stream),
            run: StreamRun {
                on_gap: OnGap::Fail,
                ..settings()
            },
            worker: worker(),
            checkpoint_interval: Duration::ZERO,
            observer: Arc::new(NoObserver),
            identity,
            kept: Vec::new(),
        },
        deletes: true,
        max_keys,
        exports: None,
        resnapshot: false,
        repairs: None,
        watch_interval: Duration::from_millis(200),
    }
}

/// Runs `mirror` into a new sink of `destination` on a task of its own.
async fn spawn_mirror<TA: TableApi>(
    mirror: LeasedMirror<TA, FakeStreams, MemoryLeaseTable>,
    destination: &Destination,
) -> tokio::task::JoinHandle<Result<LeasedMirrorOutcome, StreamRunError>> {
    let mut sink = sink(destination, Records::Envelopes).await;
    tokio::spawn(async move { mirror.run(&mut sink, Cancel::never(), &NoProgress).await })
}

/// Two workers mirror one table into a destination holding a stale row while the stream has a
/// change: the cleanup runs once (one worker's), the change streamed after it stays, the
/// snapshot's segment rows stay `Done` once the stream was listed, a snapshot batch fenced
/// after the close is refused by the sink, and a third worker finds the snapshot closed and
/// reads no segment.
async fn shared_workers_clean_up_once_then_stream(target: Target) {
    let destination = destination_with_a_stale_row(target).await;
    let stream = stream();
    stream.apply(Change::Write {
        key: "w1".into(),
        remove: false,
    });
    let table = Arc::new(FakeTable::numbered(12));
    let leases = MemoryLeaseTable::seeded(1);
    let one = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w1", 1000),
        &destination,
    )
    .await;
    let two = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w2", 1000),
        &destination,
    )
    .await;
    let outcomes = [one.await.unwrap().unwrap(), two.await.unwrap().unwrap()];
    let mut expected: BTreeSet<String> = (0..12).map(|i| format!("k{i:06}")).collect();
    expected.insert("w1".into());
    assert_eq!(destination.keys().await, expected, "the stale row is gone");
    let cleanups: Vec<_> = outcomes.iter().filter_map(|o| o.cleanup).collect();
    assert_eq!(cleanups.len(), 1, "the cleanup ran once: {outcomes:?}");
    // The change read beside the snapshot is marked with it: the cleanup counts it seen.
    let (seen, deleted) = (cleanups[0].keys_written, cleanups[0].deleted);
    assert!(
        matches!((seen, deleted), (12 | 13, 1)),
        "{seen} seen, {deleted} deleted"
    );
    assert_eq!(
        outcomes[0].snapshot.id, outcomes[1].snapshot.id,
        "one snapshot"
    );
    let rows = leases.rows(&PipelineName::new("p").unwrap());
    for index in 0..3 {
        let row = rows
            .iter()
            .find(|r| r.unit == UnitId::Segment { index, total: 3 })
            .unwrap_or_else(|| panic!("segment {index}'s row is kept: {rows:?}"));
        assert_eq!(row.state, LeaseState::Done, "{row:?}");
    }
    assert!(rows.iter().any(|r| matches!(r.unit, UnitId::Shard(_))));

    // A zombie's snapshot batch after the close: refused by the sink, nothing written.
    let mut sink = sink(&destination, Records::Envelopes).await;
    let mut records = Lines::default();
    records.push_with(|buf| {
        buf.extend_from_slice(br#"{"after":{"pk":"late","n":1},"key":{"pk":"late"},"op":"r"}"#)
    });
    let late = Batch {
        records,
        ..Batch::default()
    };
    let fence = Fence {
        pipeline: "p".into(),
        unit: "segment:0/3".parse().unwrap(),
        counter: u64::MAX >> 2,
        position: None,
        snapshot: Some(outcomes[0].snapshot.id),
        beside: None,
        of: None,
        repair: None,
    };
    let refused = sink.write_fenced(&late, &fence).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Fenced, "{refused}");
    assert!(!destination.keys().await.contains("late"));

    let read_before = table.requests().len();
    let third = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w3", 1000),
        &destination,
    )
    .await;
    let third = third.await.unwrap().unwrap();
    assert!(third.scan.is_none() && third.cleanup.is_none(), "{third:?}");
    assert_eq!(table.requests().len(), read_before, "no segment read again");
}

/// docs/mirror.md §5.3's ceiling across workers: the closer stops once, nothing deleted; the
/// next run streams on.
async fn a_shared_mirror_over_the_ceiling_stops_its_closer_once(target: Target) {
    let destination = destination_with_a_stale_row(target).await;
    let stream = stream();
    let table = Arc::new(FakeTable::numbered(12));
    let leases = MemoryLeaseTable::seeded(2);
    let first = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w1", 5),
        &destination,
    )
    .await;
    let error = first.await.unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            StreamRunError::CleanupSkipped {
                keys: 12,
                max_keys: 5
            }
        ),
        "{error}"
    );
    assert!(
        destination.keys().await.contains("stale"),
        "nothing deleted"
    );
    let again = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w1", 5),
        &destination,
    )
    .await;
    let again = again.await.unwrap().unwrap();
    assert_eq!(again.cleanup, None, "closed already: {again:?}");
    assert!(destination.keys().await.contains("stale"));
}

/// Three workers mirror a table whose snapshot lasts several times the stream's retention
/// (3 s here; the scan takes about 12 s at 1 capacity unit a second): the stream is read beside
/// the snapshot from its start, so every change made meanwhile arrives before it is trimmed,
/// and the destination ends equal to the table. (Read after the snapshot from its trim
/// horizon, as before, the writes older than the retention were lost, silently.)
async fn a_shared_snapshot_longer_than_the_retention_loses_no_change(target: Target) {
    let destination = Destination::new(target).await;
    let mut stream = FakeStreams::new(17)
        .with_retention(Duration::from_secs(3))
        .with_wall_origin_ms(ddbpipe_source::clock::unix_now_ms())
        .at(
            Duration::ZERO,
            Change::Root {
                shard: "s1".into(),
                range: None,
            },
        );
    for i in 0..8u64 {
        stream = stream.at(
            Duration::from_secs(i + 1),
            Change::Write {
                key: format!("w{i}"),
                remove: false,
            },
        );
    }
    stream = stream.at(
        Duration::from_secs(9),
        Change::Write {
            key: "w0".into(),
            remove: true,
        },
    );
    let stream = Arc::new(stream);
    let table = Arc::new(FakeTable::numbered(12).units_per_page(Some(2.0)));
    let leases = MemoryLeaseTable::seeded(7);
    let mut workers = Vec::new();
    for id in ["w1", "w2", "w3"] {
        let mut mirror = shared_mirror(&table, &stream, &leases, id, 1000);
        mirror.scan.reader.limiter = Arc::new(ReadLimiter::new(Some(1.0)));
        workers.push(spawn_mirror(mirror, &destination).await);
    }
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    let mut expected: BTreeSet<String> = (0..12).map(|i| format!("k{i:06}")).collect();
    expected.extend((1..8).map(|i| format!("w{i}")));
    assert_eq!(destination.keys().await, expected);
}

/// One shard `s1` whose records are kept 2 s.
fn short_lived_stream(seed: u64) -> Arc<FakeStreams> {
    Arc::new(
        FakeStreams::new(seed)
            .with_retention(Duration::from_secs(2))
            .at(
                Duration::ZERO,
                Change::Root {
                    shard: "s1".into(),
                    range: None,
                },
            ),
    )
}

/// A shared mirror's gap is a position the stream no longer holds (docs/coordination.md
/// §11.12 rule 5): a worker streams a change and ends; while no worker runs, the stream takes
/// two more and trims them (a 2 s retention); the next worker stops with the gap, naming the
/// shard, and writes neither trimmed change nor any later one.
async fn a_shared_mirror_finds_a_gap_by_its_checkpoints_not_by_a_clock(target: Target) {
    let destination = Destination::new(target).await;
    let stream = short_lived_stream(23);
    stream.apply(Change::Write {
        key: "w1".into(),
        remove: false,
    });
    let table = Arc::new(FakeTable::numbered(4));
    let leases = MemoryLeaseTable::seeded(3);
    let first = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w1", 1000),
        &destination,
    )
    .await;
    first.await.unwrap().unwrap();
    assert!(destination.keys().await.contains("w1"));
    for key in ["w2", "w3"] {
        stream.apply(Change::Write {
            key: key.into(),
            remove: false,
        });
    }
    // Longer than the retention: both are trimmed before any worker reads them.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let again = spawn_mirror(
        shared_mirror(&table, &stream, &leases, "w2", 1000),
        &destination,
    )
    .await;
    let error = again.await.unwrap().unwrap_err().to_string();
    assert!(
        error.contains("shard s1 was trimmed") && error.contains("ddbpipe state reset"),
        "the gap names the shard and a shared pipeline's remedy: {error}"
    );
    assert!(!error.contains("on_gap: resnapshot"), "{error}");
    let keys = destination.keys().await;
    assert!(
        !keys.contains("w2") && !keys.contains("w3"),
        "nothing after the gap is written: {keys:?}"
    );
}

/// A gap after a shared mirror with `on_gap: resnapshot` (the gap tests): worker `w1`
/// mirrored `w1` and `gone` and ended; while no worker ran, `w2` was written and `gone`
/// deleted, and the stream trimmed both changes (a 2 s retention).
struct GapAfterMirror {
    destination: Destination,
    stream: Arc<FakeStreams>,
    table: Arc<FakeStreamTable>,
    leases: MemoryLeaseTable,
    /// The first worker's outcome.
    first: Option<LeasedMirrorOutcome>,
}

impl GapAfterMirror {
    async fn new(target: Target, seed: u64, leases: u64) -> GapAfterMirror {
        let destination = Destination::new(target).await;
        let stream = short_lived_stream(seed);
        let table = Arc::new(FakeStreamTable::of(Arc::clone(&stream)));
        let mut gap = GapAfterMirror {
            destination,
            stream,
            table,
            leases: MemoryLeaseTable::seeded(leases),
            first: None,
        };
        gap.write("w1", false);
        gap.write("gone", false);
        let first = spawn_mirror(gap.mirror("w1"), &gap.destination).await;
        gap.first = Some(first.await.unwrap().unwrap());
        assert_eq!(gap.destination.keys().await, keys(&["gone", "w1"]));
        gap.write("w2", false);
        gap.write("gone", true);
        // Longer than the retention: both changes are trimmed before any worker reads them.
        tokio::time::sleep(Duration::from_secs(4)).await;
        gap
    }

    fn write(&self, key: &str, remove: bool) {
        self.stream.apply(Change::Write {
            key: key.into(),
            remove,
        });
    }

    /// Worker `id` of the mirror.
    fn mirror(&self, id: &str) -> LeasedMirror<FakeStreamTable, FakeStreams, MemoryLeaseTable> {
        LeasedMirror {
            resnapshot: true,
            ..shared_mirror(&self.table, &self.stream, &self.leases, id, 1000)
        }
    }
}

/// `keys` as the destination lists them.
fn keys(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// docs/coordination.md §11.12 rule 8: with `on_gap: resnapshot` the gap a worker finds opens a
/// snapshot of the next generation in place of the first, and every worker moves to it. A
/// worker mirrors the table and ends; while none runs, an item is written and another deleted,
/// and the stream trims both changes (a 2 s retention); two workers started then take one new
/// snapshot between them (generation 1, not 2: whichever finds the gap second, or learns of
/// the replacement from the record, moves to the first one's), whose cleanup deletes the row
/// of the item deleted in the gap, and the destination ends equal to the table. With
/// `on_gap: fail` the same gap stops the worker (`a_shared_mirror_finds_a_gap_...`).
async fn a_gap_opens_a_snapshot_of_the_next_generation_that_every_worker_moves_to(target: Target) {
    let gap = GapAfterMirror::new(target, 29, 5).await;
    let (first, destination) = (gap.first.as_ref().unwrap(), &gap.destination);
    assert_eq!((first.snapshot.generation, first.replaced), (0, 0));
    let two = spawn_mirror(gap.mirror("w2"), destination).await;
    let three = spawn_mirror(gap.mirror("w3"), destination).await;
    let outcomes = [two.await.unwrap().unwrap(), three.await.unwrap().unwrap()];

    assert_eq!(
        destination.keys().await,
        keys(&["w1", "w2"]),
        "equal to the table"
    );
    let record = destination
        .database()
        .await
        .shared_snapshot("p")
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(record.generation, 1, "one replacement: {record:?}");
    assert!(record.closed.is_some(), "{record:?}");
    let why = record.replaced.clone().unwrap_or_default();
    assert!(why.contains("shard s1 was trimmed"), "{why}");
    // A worker that opened the record after the replacement started in generation 1.
    for outcome in &outcomes {
        assert_eq!(
            outcome.snapshot.id, record.id,
            "every worker ends on the replacement"
        );
        assert!(outcome.replaced <= 1, "moved once at most: {outcome:?}");
    }
    assert!(
        outcomes.iter().any(|outcome| outcome.replaced == 1),
        "the worker that found the gap moved past the first snapshot"
    );
    let deleted: u64 = (outcomes.iter())
        .filter_map(|outcome| outcome.cleanup.map(|cleanup| cleanup.deleted))
        .sum();
    assert_eq!(
        deleted, 1,
        "the new snapshot's cleanup deleted the item deleted in the gap"
    );
}

/// docs/coordination.md §11.12 rule 6, rule 6 of `leased::generations`: a signal that comes as
/// a worker finds a gap with `on_gap: resnapshot` (after its generation ended on the gap,
/// before the snapshot is replaced) ends the worker as a signal does: a clean stop (the CLI
/// exits 0), nothing replaced, its shard lease handed back; the next worker finds the same gap,
/// replaces the snapshot and mirrors the table. Before, the signal returned the gap itself,
/// with `on_gap: fail`'s remedy (`state reset`), and the worker exited 1 (a two-worker test
/// stopped in that moment failed once in CI).
async fn a_signal_as_a_gap_is_found_stops_the_worker_and_the_next_replaces_the_snapshot(
    target: Target,
) {
    let gap = GapAfterMirror::new(target, 31, 11).await;
    let (destination, leases) = (&gap.destination, &gap.leases);
    // The signal, the moment the stream answers that the position is trimmed.
    let (signal, stop) = Cancel::new();
    (gap.stream).on_error("TrimmedDataAccessException", move || signal.cancel());
    let mut sink = sink(destination, Records::Envelopes).await;
    let error = (gap.mirror("w2"))
        .run(&mut sink, stop, &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(error, StreamRunError::ReplacementInterrupted),
        "a clean stop, not the gap: {error:?}"
    );
    let db = destination.database().await;
    let record = db.shared_snapshot("p").await.unwrap().expect("the record");
    assert_eq!(record.generation, 0, "nothing was replaced: {record:?}");
    let rows = leases
        .connect()
        .list(&PipelineName::new("p").unwrap())
        .await;
    let held: Vec<_> = (rows.unwrap().into_iter())
        .filter(|row| matches!(row.unit, UnitId::Shard(_)) && row.owner.is_some())
        .collect();
    assert!(held.is_empty(), "the shard lease is handed back: {held:?}");

    let next = spawn_mirror(gap.mirror("w3"), destination).await;
    let outcome = next.await.unwrap().unwrap();
    assert_eq!(
        (outcome.snapshot.generation, outcome.replaced),
        (1, 1),
        "the next worker found the gap and replaced the snapshot"
    );
    assert_eq!(
        destination.keys().await,
        keys(&["w1", "w2"]),
        "equal to the table"
    );
}

/// docs/coordination.md §11.12 rule 8, rule 4 of `leased::generations`: a worker streaming in
/// generation 0 learns from the record that another snapshot replaced its own, stops its
/// generation and runs the new one: it reads the new snapshot (every row ends marked with it)
/// and closes it, under the new generation's leases, and the destination ends equal to the
/// table. Without the move it streams on under the replaced snapshot, which nobody reads.
async fn a_worker_moves_to_the_snapshot_another_opened_in_place_of_its_own(target: Target) {
    let destination = Destination::new(target).await;
    let stream = stream();
    let write = |key: &str, remove: bool| {
        stream.apply(Change::Write {
            key: key.into(),
            remove,
        });
    };
    write("w1", false);
    let table = Arc::new(FakeStreamTable::of(Arc::clone(&stream)));
    let leases = MemoryLeaseTable::seeded(7);
    let mut mirror = LeasedMirror {
        resnapshot: true,
        ..shared_mirror(&table, &stream, &leases, "w1", 1000)
    };
    mirror.streams.run.bounds.idle_termination = Some(Duration::from_secs(4));
    let running = spawn_mirror(mirror, &destination).await;
    let db = destination.database().await;
    let closed = async {
        loop {
            match db.shared_snapshot("p").await.unwrap() {
                Some(record) if record.closed.is_some() => return record,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let first = tokio::time::timeout(Duration::from_secs(20), closed)
        .await
        .expect("the first snapshot closes");
    // Another worker replaces the snapshot.
    write("w2", false);
    let second = db
        .reopen_shared_snapshot(
            &destination.spec(),
            "p",
            first.id,
            first.id + 1,
            "a test's gap",
            None,
        )
        .await
        .unwrap();
    assert_eq!(second.generation, 1);

    // Unmoved, the worker's batches are refused by the record without end.
    let outcome = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker moved to the new snapshot and ended idle")
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            outcome.snapshot.id,
            outcome.snapshot.generation,
            outcome.replaced
        ),
        (second.id, 1, 1)
    );
    assert!(
        outcome.cleanup.is_some(),
        "the moved worker closed the new snapshot"
    );
    let rows = destination.rows().await;
    let keys: Vec<&str> = rows.iter().map(|(key, _, _)| key.as_str()).collect();
    assert_eq!(keys, ["w1", "w2"], "equal to the table");
    assert!(
        rows.iter().all(|(_, _, marker)| *marker == Some(second.id)),
        "every row was read by the new snapshot: {rows:?}"
    );
    let generation = PipelineName::new(format!("p/snapshot-{}", second.id)).unwrap();
    let rows = leases.connect().list(&generation).await.unwrap();
    assert!(
        rows.iter()
            .any(|row| matches!(row.unit, UnitId::Segment { .. })),
        "the new generation's leases are kept under its own name: {rows:?}"
    );
}

/// What a run told its progress observer, in order.
#[derive(Default)]
struct Told(std::sync::Mutex<Vec<String>>);

impl ddbpipe_pipeline::runner::Progress for Told {
    fn advanced(&self, written: u64, _capacity_units: f64) {
        self.0.lock().unwrap().push(format!("advanced {written}"));
    }

    fn streaming(&self) {
        self.0.lock().unwrap().push("streaming".into());
    }
}

/// Issue 24 item 20: a shared mirror's stream phase went on printing the snapshot's
/// "items (4 %)": the observer was never told the stream began. It is, once the snapshot's rows
/// and the changes read beside them are in, before the stream phase's change records, which it
/// counts from 0.
async fn a_shared_mirrors_stream_phase_is_reported_as_streaming(target: Target) {
    let destination = Destination::new(target).await;
    let stream = stream();
    stream.apply(Change::Write {
        key: "w1".into(),
        remove: false,
    });
    let table = Arc::new(FakeTable::numbered(12));
    let leases = MemoryLeaseTable::seeded(3);
    let mirror = shared_mirror(&table, &stream, &leases, "w1", 1000);
    let mut sink = sink(&destination, Records::Envelopes).await;
    let told = Told::default();
    mirror.run(&mut sink, Cancel::never(), &told).await.unwrap();
    let told = told.0.into_inner().unwrap();
    let at = told
        .iter()
        .position(|t| t == "streaming")
        .unwrap_or_else(|| panic!("never told the stream began: {told:?}"));
    let count = |told: &str| -> u64 { told.trim_start_matches("advanced ").parse().unwrap() };
    let beside = count(&told[at - 1]);
    let after = told[at + 1..].last().map_or(0, |t| count(t));
    assert!(beside >= 12, "the snapshot's rows first: {told:?}");
    assert_eq!(beside + after, 13, "12 rows and the change, once: {told:?}");
    assert_eq!(
        told.iter().filter(|t| *t == "streaming").count(),
        1,
        "{told:?}"
    );
}

/// Declares, for each scenario `async fn name(Target)` above, the tests `sqlite::name` and
/// `postgres::name`.
macro_rules! on_each_target {
    ($($scenario:ident),* $(,)?) => {
        on_each_target!(@module sqlite, Sqlite, $($scenario),*);
        on_each_target!(@module postgres, Postgres, $($scenario),*);
    };
    (@module $module:ident, $target:ident, $($scenario:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Target::$target).await;
                }
            )*
        }
    };
}

on_each_target!(
    a_failed_cleanup_is_retried_by_the_next_run_without_scanning,
    a_panicked_segment_leaves_the_snapshot_open_and_deletes_nothing,
    a_fatal_error_in_a_segment_leaves_the_snapshot_open_and_deletes_nothing,
    replaying_the_same_batches_leaves_the_destination_unchanged,
    shared_workers_clean_up_once_then_stream,
    a_shared_mirror_over_the_ceiling_stops_its_closer_once,
    a_shared_snapshot_longer_than_the_retention_loses_no_change,
    a_shared_mirrors_stream_phase_is_reported_as_streaming,
    a_shared_mirror_finds_a_gap_by_its_checkpoints_not_by_a_clock,
    a_gap_opens_a_snapshot_of_the_next_generation_that_every_worker_moves_to,
    a_worker_moves_to_the_snapshot_another_opened_in_place_of_its_own,
    a_signal_as_a_gap_is_found_stops_the_worker_and_the_next_replaces_the_snapshot,
);
