//! The stream engine on the in-memory stream, scenario by scenario (docs/testing.md §10 scenarios 7, 8
//! and 15, and `max_messages`), with paused time and a memory sink.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, StreamOutcome};
use ddbpipe_pipeline::sink::Staged;
use ddbpipe_pipeline::sink::{Sink, SinkError};
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{StreamRun, StreamRunError, run_streams};
use ddbpipe_source::api::{RecordsPage, StartAt, StreamPage, StreamsApi};
use ddbpipe_source::config::{OnGap, StartPosition};
use ddbpipe_source::error::ApiError;
use ddbpipe_source::fake_streams::{Change, ChildFilter, FAKE_STREAM_ARN, FakeStreams, Faults};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::Position;
use ddbpipe_source::position::{RepairRecord, ShardProgress, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver};
use ddbpipe_source::streams::engine::{EndReason, RunBounds};
use ddbpipe_testkit::MemorySink;
use serde_json::json;

/// One delivered change: the shard and sequence number it names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    shard: String,
    seq: String,
}

/// Keeps every acknowledged change as the shard and sequence number it names.
type LineSink = MemorySink<Line>;

fn line_sink() -> LineSink {
    MemorySink::decoding(|line| {
        let json: serde_json::Value = serde_json::from_slice(line).unwrap();
        Line {
            shard: json["shard_id"].as_str().unwrap().to_string(),
            seq: json["sequence_number"].as_str().unwrap().to_string(),
        }
    })
}

fn settings() -> StreamRun {
    ddbpipe_testkit::fake_stream_run()
}

async fn run(
    fake: &Arc<FakeStreams>,
    dir: &Path,
    settings: &StreamRun,
) -> (Result<StreamOutcome, StreamRunError>, Vec<Line>) {
    run_into(fake, dir, settings, line_sink()).await
}

async fn run_into(
    fake: &Arc<FakeStreams>,
    dir: &Path,
    settings: &StreamRun,
    mut sink: LineSink,
) -> (Result<StreamOutcome, StreamRunError>, Vec<Line>) {
    let mut checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "streams"})),
        Duration::ZERO,
    )
    .await
    .unwrap();
    let outcome = run_streams(
        Arc::clone(fake),
        settings,
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await;
    (outcome, sink.lines)
}

/// A mirror's first run into `dir`: its checkpointer (no position yet) and a sink that keeps
/// each line as JSON and applies rows by version, as a keyed sink does.
async fn fresh_mirror(dir: &Path) -> (Checkpointer, MemorySink<serde_json::Value>) {
    let checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "mirror"})),
        Duration::ZERO,
    )
    .await
    .unwrap();
    let mut sink =
        MemorySink::decoding(|line| serde_json::from_slice::<serde_json::Value>(line).unwrap());
    sink.versioned = true;
    (checkpointer, sink)
}

/// A snapshot scan of the fake `table` by `segments` segments, `max_concurrency` at once, with
/// the default page size and read rule, and neither exports nor repairs.
fn plain_scan(
    table: &Arc<ddbpipe_source::fake::FakeTable>,
    segments: u32,
    max_concurrency: usize,
) -> ddbpipe_pipeline::streams::SnapshotScan<ddbpipe_source::fake::FakeTable> {
    ddbpipe_pipeline::streams::SnapshotScan {
        api: Arc::clone(table),
        segments,
        max_concurrency,
        page_limit: None,
        consistent_read: false,
        read_rule: ddbpipe_source::plan::ReadRule::default(),
        exports: None,
        repairs: None,
    }
}

fn stored(dir: &Path) -> StreamsPosition {
    let entry = StateFile::new(dir.join("state.json")).load("p").unwrap();
    match entry.and_then(|e| e.position) {
        Some(Position::Streams(position)) => position,
        other => panic!("no streams position stored: {other:?}"),
    }
}

fn root(shard: &str) -> Change {
    Change::Root {
        shard: shard.into(),
        range: None,
    }
}

fn write_to(shard: &str, key: &str) -> Change {
    Change::WriteTo {
        shard: shard.into(),
        key: key.into(),
    }
}

/// The sequence numbers the fake wrote into `shard`, in order.
fn seqs_of(fake: &FakeStreams, shard: &str) -> Vec<String> {
    fake.written()
        .iter()
        .filter(|w| w.shard.as_str() == shard)
        .map(|w| w.seq.to_string())
        .collect()
}

fn expired() -> ApiError {
    ApiError::from_code(Some("ExpiredIteratorException".into()), "Iterator expired")
}

fn after(seq: &str) -> ShardProgress {
    ShardProgress::After(SequenceNumber::parse(seq).unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_split_parent_is_delivered_whole_before_its_late_listed_children() {
    let mut fake = FakeStreams::new(7).at(Duration::ZERO, root("p"));
    for key in ["a", "b", "c"] {
        fake = fake.at(Duration::ZERO, write_to("p", key));
    }
    fake = fake.at(
        Duration::from_secs(1),
        Change::Reshard {
            parent: "p".into(),
            children: vec!["c1".into(), "c2".into()],
            listed_after: Duration::from_secs(5),
        },
    );
    for (shard, key) in [("c1", "a"), ("c2", "b"), ("c1", "c"), ("c2", "d")] {
        fake = fake.at(Duration::from_secs(1), write_to(shard, key));
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();

    let (outcome, lines) = run(&fake, dir.path(), &settings()).await;

    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    assert_eq!(lines.len(), 7, "{lines:?}");
    let shards: Vec<&str> = lines.iter().map(|l| l.shard.as_str()).collect();
    assert_eq!(
        &shards[..3],
        ["p", "p", "p"],
        "all of P's records come first"
    );
    let got: Vec<&str> = lines[..3].iter().map(|l| l.seq.as_str()).collect();
    assert_eq!(got, seqs_of(&fake, "p"));
    let position = stored(dir.path());
    assert!(position.is_finished(&ShardId::new("p")), "{position:?}");
    for child in ["c1", "c2"] {
        let last = seqs_of(&fake, child).pop().unwrap();
        assert_eq!(position.shards[&ShardId::new(child)], after(&last));
    }
}

#[tokio::test(start_paused = true)]
async fn three_busy_shards_sharing_one_slot_each_deliver_within_the_first_three_slices() {
    let mut fake = FakeStreams::new(8);
    for shard in ["a", "b", "c"] {
        fake = fake.at(Duration::ZERO, root(shard));
        for i in 0..100 {
            fake = fake.at(Duration::ZERO, write_to(shard, &format!("{shard}{i}")));
        }
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let settings = StreamRun {
        records_per_request: 2,
        max_messages: Some(60),
        ..settings()
    };

    let (outcome, lines) = run(&fake, dir.path(), &settings).await;

    assert_eq!(outcome.unwrap().end, EndReason::MaxMessages);
    assert_eq!(lines.len(), 60);
    let mut turns: Vec<&str> = lines.iter().map(|l| l.shard.as_str()).collect();
    turns.dedup();
    assert_eq!(
        &turns[..3],
        ["a", "b", "c"],
        "each shard has one of the first three slices"
    );
    let mut per_shard: BTreeMap<&str, usize> = BTreeMap::new();
    for line in &lines {
        *per_shard.entry(line.shard.as_str()).or_default() += 1;
    }
    assert!(per_shard.values().all(|&n| n >= 8), "{per_shard:?}");
}

/// A run of shard `s1` holding ten records, read three a request, whose `GetRecords` fail with
/// `errors` after the first success: the fake, and the run's outcome and lines.
async fn ten_records_failing(
    seed: u64,
    errors: Vec<ApiError>,
) -> (
    Arc<FakeStreams>,
    Result<StreamOutcome, StreamRunError>,
    Vec<Line>,
) {
    let mut fake = FakeStreams::new(seed).at(Duration::ZERO, root("s1"));
    for i in 0..10 {
        fake = fake.at(Duration::ZERO, write_to("s1", &format!("k{i}")));
    }
    let fake = Arc::new(fake);
    fake.fail_get_records("s1", 1, errors);
    let dir = tempfile::tempdir().unwrap();
    let settings = StreamRun {
        records_per_request: 3,
        ..settings()
    };
    let (outcome, lines) = run(&fake, dir.path(), &settings).await;
    (fake, outcome, lines)
}

#[tokio::test(start_paused = true)]
async fn an_expired_iterator_resumes_after_the_last_record_read_without_loss_or_repeat() {
    let (fake, outcome, lines) = ten_records_failing(9, vec![expired()]).await;

    assert_eq!(outcome.unwrap().written, 10);
    let got: Vec<String> = lines.into_iter().map(|l| l.seq).collect();
    assert_eq!(got, seqs_of(&fake, "s1"), "every record once, in order");
    assert_eq!(fake.calls().shard_iterator, 2, "one renewal");
}

#[tokio::test(start_paused = true)]
async fn an_iterator_that_keeps_expiring_fails_the_run() {
    let (_, outcome, _) = ten_records_failing(10, vec![expired(), expired(), expired()]).await;

    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("keeps expiring"), "{error}");
    assert!(error.contains("s1"), "{error}");
}

/// Expiries of iterators kept across a yield (here a throttle's) do not count toward the
/// limit: each is explained by the wait, and the renewed iterator is read. Counted, the third
/// failed the run (a stream of many shards read by few lanes, whose turns come minutes apart).
#[tokio::test(start_paused = true)]
async fn an_iterator_expired_while_its_shard_waited_is_renewed_without_counting() {
    let throttled = || {
        ApiError::from_code(
            Some("ProvisionedThroughputExceededException".into()),
            "Rate exceeded",
        )
    };
    let script = (0..3).flat_map(|_| [throttled(), expired()]).collect();
    let (fake, outcome, lines) = ten_records_failing(10, script).await;

    assert_eq!(outcome.unwrap().written, 10);
    let got: Vec<String> = lines.into_iter().map(|l| l.seq).collect();
    assert_eq!(got, seqs_of(&fake, "s1"), "every record once, in order");
    assert_eq!(fake.calls().shard_iterator, 4, "three renewals");
}

/// docs/testing.md §10 scenario 15: 10 old records in a closed parent and its open child; a first run
/// at `latest` emits nothing; one change later, the second run emits only that change.
async fn latest_emits_only_the_change_made_after_the_first_run(expire_first_reads: bool) {
    let hour = Duration::from_secs(3600);
    let now_ms = fake_now_ms();
    // The old records are an hour older than the runs (the floor keeps two minutes of slack).
    let mut fake = FakeStreams::new(15)
        .with_wall_origin_ms(now_ms - hour.as_millis() as i64)
        .at(Duration::ZERO, root("p"));
    for i in 0..5 {
        fake = fake.at(Duration::ZERO, write_to("p", &format!("old{i}")));
    }
    fake = fake.at(
        Duration::ZERO,
        Change::Reshard {
            parent: "p".into(),
            children: vec!["c".into()],
            listed_after: Duration::ZERO,
        },
    );
    for i in 5..10 {
        fake = fake.at(Duration::ZERO, write_to("c", &format!("old{i}")));
    }
    let fake = Arc::new(fake);
    tokio::time::sleep(hour).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = StreamRun {
        start_position: StartPosition::Latest,
        bounds: RunBounds {
            idle_termination: Some(Duration::from_secs(5)),
            ..settings().bounds
        },
        ..settings()
    };
    if expire_first_reads {
        fake.fail_get_records("c", 0, vec![expired()]);
    }

    let (outcome, lines) = run(&fake, dir.path(), &settings).await;
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    assert!(lines.is_empty(), "the first run emits nothing: {lines:?}");

    fake.apply(write_to("c", "new"));
    if expire_first_reads {
        fake.fail_get_records("c", 0, vec![expired()]);
    }
    let (outcome, lines) = run(&fake, dir.path(), &settings).await;
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    let new = seqs_of(&fake, "c").pop().unwrap();
    assert_eq!(
        lines,
        vec![Line {
            shard: "c".into(),
            seq: new
        }]
    );
}

fn fake_now_ms() -> i64 {
    FakeStreams::new(0).wall_now_ms()
}

#[tokio::test(start_paused = true)]
async fn latest_emits_only_changes_made_after_the_first_run_started() {
    latest_emits_only_the_change_made_after_the_first_run(false).await;
}

#[tokio::test(start_paused = true)]
async fn latest_emits_only_later_changes_even_when_the_childs_iterator_expired() {
    latest_emits_only_the_change_made_after_the_first_run(true).await;
}

#[tokio::test(start_paused = true)]
async fn max_messages_acknowledges_exactly_that_many_and_the_position_covers_exactly_them() {
    let mut fake = FakeStreams::new(11).at(Duration::ZERO, root("s1"));
    for i in 0..12 {
        fake = fake.at(Duration::ZERO, write_to("s1", &format!("k{i}")));
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let all = seqs_of(&fake, "s1");
    let limited = StreamRun {
        records_per_request: 3,
        max_messages: Some(5),
        batch: BatchLimits::records(2),
        ..settings()
    };

    let (outcome, lines) = run(&fake, dir.path(), &limited).await;

    let outcome = outcome.unwrap();
    assert_eq!((outcome.end, outcome.written), (EndReason::MaxMessages, 5));
    let got: Vec<&str> = lines.iter().map(|l| l.seq.as_str()).collect();
    assert_eq!(got, all[..5]);
    assert_eq!(
        stored(dir.path()).shards[&ShardId::new("s1")],
        after(&all[4])
    );

    let (outcome, lines) = run(&fake, dir.path(), &settings()).await;
    assert_eq!(outcome.unwrap().written, 7);
    let got: Vec<&str> = lines.iter().map(|l| l.seq.as_str()).collect();
    assert_eq!(got, all[5..], "the next run reads exactly the rest");
}

#[tokio::test(start_paused = true)]
async fn a_run_that_reaches_max_messages_with_a_parents_last_record_ends_cleanly() {
    // The parent's last page carries the 3rd record and ends the shard; its child is then
    // admissible, but the hand-over is full: the run must end by max_messages, not fail.
    let mut fake = FakeStreams::new(12).at(Duration::ZERO, root("p"));
    for key in ["a", "b", "c"] {
        fake = fake.at(Duration::ZERO, write_to("p", key));
    }
    fake = fake.at(
        Duration::ZERO,
        Change::Reshard {
            parent: "p".into(),
            children: vec!["c".into()],
            listed_after: Duration::ZERO,
        },
    );
    fake = fake.at(Duration::ZERO, write_to("c", "d"));
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let limited = StreamRun {
        max_messages: Some(3),
        ..settings()
    };

    let (outcome, lines) = run(&fake, dir.path(), &limited).await;

    let outcome = outcome.expect("reaching max_messages is a clean end");
    assert_eq!((outcome.end, outcome.written), (EndReason::MaxMessages, 3));
    assert_eq!(lines.len(), 3);
    assert!(stored(dir.path()).is_finished(&ShardId::new("p")));
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_ends_the_run_even_when_the_sink_is_slow() {
    let mut fake = FakeStreams::new(13);
    for shard in ["a", "b", "c", "d"] {
        fake = fake.at(Duration::ZERO, root(shard));
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let settings = StreamRun {
        poll_interval: Duration::from_millis(200),
        bounds: RunBounds {
            shard_concurrency: 4,
            idle_termination: Some(Duration::from_secs(5)),
            ..settings().bounds
        },
        ..settings()
    };
    let slow = line_sink().taking(Duration::from_millis(400));

    let ended = tokio::time::timeout(
        Duration::from_secs(3600),
        run_into(&fake, dir.path(), &settings, slow),
    )
    .await;

    let (outcome, lines) = ended.expect("an hour without a record ends a 5 s idle run");
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    assert!(lines.is_empty());
}

/// An idle shard is read ever less often, down to one `GetRecords` per `max_idle_poll`
/// (docs/streams.md §4.9), and a change after an hour of nothing is still delivered within
/// `max_idle_poll` and a batch.
#[tokio::test(start_paused = true)]
async fn an_idle_shard_costs_one_read_per_max_idle_poll_and_still_delivers_its_next_change() {
    let hour = Duration::from_secs(3600);
    let fake = Arc::new(
        FakeStreams::new(21)
            .at(Duration::ZERO, root("s1"))
            .at(hour, write_to("s1", "late")),
    );
    let dir = tempfile::tempdir().unwrap();
    let following = StreamRun {
        poll_interval: Duration::from_secs(1),
        max_idle_poll: Duration::from_secs(10),
        max_messages: Some(1),
        bounds: RunBounds {
            idle_termination: None,
            follow: true,
            ..settings().bounds
        },
        ..settings()
    };
    let started = tokio::time::Instant::now();
    let idle_hour = async {
        tokio::time::sleep(hour - Duration::from_secs(1)).await;
        fake.calls().get_records
    };

    let ((outcome, lines), idle_reads) =
        tokio::join!(run(&fake, dir.path(), &following), idle_hour);
    let delivered_after = started.elapsed();

    assert_eq!(outcome.unwrap().end, EndReason::MaxMessages);
    assert_eq!(lines.len(), 1);
    // One read per 10 s once idle (≤ 0.1 GetRecords/s), a few more while backing off; one
    // per second (3,599) without the backoff.
    assert!(
        (355..=370).contains(&idle_reads),
        "{idle_reads} GetRecords in an idle hour"
    );
    assert!(
        delivered_after <= hour + Duration::from_secs(12),
        "the change of an hour-idle shard came {:?} after it was made",
        delivered_after - hour
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_run_stops_reading_the_stream() {
    let mut fake = FakeStreams::new(14).at(Duration::ZERO, root("s1"));
    for key in ["a", "b", "c"] {
        fake = fake.at(Duration::ZERO, write_to("s1", key));
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let following = StreamRun {
        bounds: RunBounds {
            idle_termination: None,
            follow: true,
            ..settings().bounds
        },
        ..settings()
    };

    // The caller gives up on the run (a timeout, a select, a crash of the caller's task).
    let ran =
        tokio::time::timeout(Duration::from_secs(5), run(&fake, dir.path(), &following)).await;
    assert!(ran.is_err(), "a following run only ends when stopped");
    let at_drop = fake.calls().get_records;
    tokio::time::sleep(Duration::from_secs(60)).await;

    let after = fake.calls().get_records - at_drop;
    assert!(
        after <= 1,
        "{after} GetRecords calls were made in the minute after the run was dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn max_messages_never_finishes_a_shard_whose_last_records_were_cut() {
    // The page holding the last records still has a next iterator; the empty page after it
    // ends the shard. The limit cuts the first page: the shard must not be finished.
    let mut fake = FakeStreams::new(16)
        .with_faults(Faults {
            last_page_ends: 0.0,
            ..Faults::none()
        })
        .at(Duration::ZERO, root("s1"));
    for key in ["a", "b", "c", "d"] {
        fake = fake.at(Duration::ZERO, write_to("s1", key));
    }
    fake = fake.at(Duration::ZERO, Change::Close { shard: "s1".into() });
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let all = seqs_of(&fake, "s1");
    let limited = StreamRun {
        max_messages: Some(3),
        ..settings()
    };

    let (outcome, lines) = run(&fake, dir.path(), &limited).await;

    assert_eq!(outcome.unwrap().written, 3);
    assert_eq!(lines.len(), 3);
    let position = stored(dir.path());
    assert!(
        !position.is_finished(&ShardId::new("s1")),
        "s1 finished with its 4th record never delivered: {position:?}"
    );
    assert_eq!(position.shards[&ShardId::new("s1")], after(&all[2]));
    let (_, lines) = run(&fake, dir.path(), &settings()).await;
    let got: Vec<&str> = lines.iter().map(|l| l.seq.as_str()).collect();
    assert_eq!(got, all[3..], "the next run delivers the rest");
}

#[tokio::test(start_paused = true)]
async fn a_shard_last_read_empty_more_than_23_hours_ago_is_a_gap_at_the_next_start() {
    // A shard with nothing to read: the run stores it `""`, verified when it was read empty.
    let fake = Arc::new(FakeStreams::new(15).at(Duration::ZERO, root("s1")));
    let dir = tempfile::tempdir().unwrap();
    let (outcome, lines) = run(&fake, dir.path(), &settings()).await;
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    assert!(lines.is_empty());
    let s1 = ShardId::new("s1");
    let ShardProgress::TrimHorizon {
        verified_at: Some(verified),
        ..
    } = stored(dir.path()).shards[&s1]
    else {
        panic!("s1 is not stored \"\" with a verified_at");
    };

    // The run's clock is the wall clock: age the stored verification instead of waiting.
    let age = |hours: i64| {
        let path = dir.path().join("state.json");
        let mut doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        doc["pipelines"]["p"]["position"]["verified_at"]["s1"] = json!(verified - hours * 3600);
        std::fs::write(&path, doc.to_string()).unwrap();
    };
    // 22 hours is not stale (the exact 23-hour boundary is pinned in gaps.rs): the run starts.
    age(22);
    let (outcome, _) = run(&fake, dir.path(), &settings()).await;
    assert_eq!(outcome.unwrap().end, EndReason::Idle);

    // 24 hours: records written meanwhile may have been trimmed; the start-up reports a gap.
    age(24);
    let (outcome, _) = run(&fake, dir.path(), &settings()).await;
    let error = outcome.unwrap_err();
    assert!(
        matches!(error, StreamRunError::CannotResume(_)),
        "the on_gap: fail stop: {error:?}"
    );
    let error = error.to_string();
    assert!(
        error.contains("shard s1 was last read 24h ago with nothing to read"),
        "{error}"
    );
}

/// The fake stream, noting when each `DescribeStream` call starts.
struct TimedDescribes {
    inner: Arc<FakeStreams>,
    at: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

impl StreamsApi for TimedDescribes {
    async fn describe_stream(
        &self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
    ) -> Result<StreamPage, ApiError> {
        self.at.lock().unwrap().push(tokio::time::Instant::now());
        self.inner
            .describe_stream(stream_arn, exclusive_start, child_of)
            .await
    }

    async fn shard_iterator(
        &self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
    ) -> Result<Option<String>, ApiError> {
        self.inner.shard_iterator(stream_arn, shard, start).await
    }

    async fn get_records(&self, iterator: &str, limit: u32) -> Result<RecordsPage, ApiError> {
        self.inner.get_records(iterator, limit).await
    }
}

#[tokio::test(start_paused = true)]
async fn describe_stream_is_called_at_most_five_times_a_second() {
    // Twenty closed shards without children, read one at a time: every drain asks for the
    // shard's children, and those lookups must be paced (docs/streams.md §4.3).
    let mut fake = FakeStreams::new(16);
    for i in 0..20 {
        let shard = format!("s{i:02}");
        fake = fake
            .at(Duration::ZERO, root(&shard))
            .at(Duration::ZERO, write_to(&shard, &format!("k{i}")))
            .at(Duration::ZERO, Change::Close { shard });
    }
    let api = Arc::new(TimedDescribes {
        inner: Arc::new(fake),
        at: std::sync::Mutex::new(Vec::new()),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.path().join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "streams"})),
        Duration::ZERO,
    )
    .await
    .unwrap();
    let mut sink = line_sink();

    let outcome = run_streams(
        Arc::clone(&api),
        &settings(),
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await;

    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    assert_eq!(sink.lines.len(), 20);
    let at = api.at.lock().unwrap().clone();
    assert!(
        at.len() >= 20,
        "each drained shard looked for children ({} calls)",
        at.len()
    );
    for window in at.windows(6) {
        let span = window[5] - window[0];
        assert!(
            span >= Duration::from_secs(1),
            "6 DescribeStream calls within {span:?}"
        );
    }
}

/// Issue 9 item 13 in miniature: 600 closed shards in two generations, the second listed only
/// after the start-up listing and without children of its own, an endpoint that ignores the
/// child-shard filter (so a lookup is a 6-page listing, longer than the idle time), 2 slots.
#[tokio::test(start_paused = true)]
async fn drained_shards_waiting_for_children_hold_no_slot_and_the_run_reads_every_shard() {
    const LANES: usize = 300;
    let mut fake = FakeStreams::new(17).with_faults(Faults {
        child_filter: ChildFilter::Ignored,
        ..Faults::none()
    });
    for lane in 0..LANES {
        let (parent, child) = (format!("g1-{lane:03}"), format!("g2-{lane:03}"));
        fake = fake
            .at(Duration::ZERO, root(&parent))
            .at(Duration::ZERO, write_to(&parent, &format!("a{lane}")))
            .at(
                Duration::ZERO,
                Change::Reshard {
                    parent,
                    children: vec![child.clone()],
                    listed_after: Duration::from_millis(300),
                },
            )
            .at(Duration::ZERO, write_to(&child, &format!("b{lane}")))
            .at(Duration::ZERO, Change::Close { shard: child });
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let settings = StreamRun {
        bounds: RunBounds {
            shard_concurrency: 2,
            idle_termination: Some(Duration::from_secs(1)),
            ..settings().bounds
        },
        ..settings()
    };
    let started = tokio::time::Instant::now();

    let (outcome, lines) = run(&fake, dir.path(), &settings).await;

    let took = started.elapsed();
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    let mut got: Vec<String> = lines.into_iter().map(|l| l.seq).collect();
    got.sort();
    let mut all: Vec<String> = fake.written().iter().map(|w| w.seq.to_string()).collect();
    all.sort();
    assert_eq!(got.len(), 2 * LANES, "one run reads every record once");
    assert_eq!(got, all);
    let position = stored(dir.path());
    assert_eq!(position.finished().count(), 2 * LANES, "{position:?}");
    let calls = fake.calls();
    assert_eq!(
        calls.describe_children, 1,
        "the ignored filter is noticed once; full listings serve every later lookup"
    );
    // Reads go on while lookups run: one listing per drained shard (6 pages each) would
    // take minutes of lookups and hundreds of calls.
    assert!(
        took < Duration::from_secs(30),
        "the run took {took:?}: lookups held up the reads"
    );
    assert!(
        calls.describe < 100,
        "{} DescribeStream calls: a listing per drained shard",
        calls.describe
    );
}

/// docs/mirror.md §5.4: a snapshot that outlasted the stream retention margin is reported after the
/// scan instead of streaming from a capture whose records may be trimmed, and the run does
/// not start another snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_longer_than_the_retention_margin_fails_with_an_explanation() {
    use ddbpipe_pipeline::state::Entry;
    use ddbpipe_pipeline::streams::run_streams_with_snapshots;
    use ddbpipe_source::fake::FakeTable;

    let fake = Arc::new(FakeStreams::new(5));
    fake.apply(root("s1"));
    let dir = tempfile::tempdir().unwrap();
    let file = StateFile::new(dir.path().join("state.json"));
    // The capture of a mirror whose scan started 24 h ago and is still open.
    let captured_s = ddbpipe_source::clock::unix_now_ms() / 1000 - 24 * 3600;
    let mut capture = StreamsPosition::new(StreamKind::Mirror, Some(FAKE_STREAM_ARN.into()));
    capture.admit(&ShardId::new("s1"), Some(captured_s), None);
    capture.snapshot = Some(
        serde_json::from_value(json!({
            "captured_at": captured_s, "complete": false, "cursors": {},
            "destination_rows_at_start": 0, "done": [], "gap_reasons": [],
            "id": captured_s * 1000, "keys_written": 0, "reason": "mirror", "total_segments": 2,
        }))
        .unwrap(),
    );
    let identity = Identity::from_json(json!({"table_name": "t", "mode": "mirror"}));
    let entry = Entry {
        identity: identity.clone(),
        last_completed: None,
        position: Some(Position::Streams(capture)),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    };
    file.store("p", Some(&entry)).unwrap();
    let mut checkpointer = Checkpointer::open_streams(file, "p", identity, Duration::ZERO)
        .await
        .unwrap();
    /// Takes snapshot rows (which name no shard) and counts them.
    #[derive(Default)]
    struct Counting(usize);
    impl Sink for Counting {
        async fn write(&mut self, batch: &Batch, _: Option<&Staged>) -> Result<(), SinkError> {
            self.0 += batch.records.len();
            Ok(())
        }
        fn describe(&self) -> String {
            "counting".into()
        }
    }
    let table = Arc::new(FakeTable::numbered(6));
    let mut sink = Counting::default();
    let outcome = run_streams_with_snapshots(
        Arc::clone(&fake),
        Some(plain_scan(&table, 2, 2)),
        &StreamRun {
            kind: StreamKind::Mirror,
            on_gap: OnGap::Resnapshot,
            ..settings()
        },
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await;
    let Err(StreamRunError::CannotResume(message)) = outcome else {
        panic!("a gap was expected, got {outcome:?}");
    };
    assert!(
        message.contains("longer than the stream retention margin"),
        "{message}"
    );
    assert!(message.contains("s1"), "{message}");
    assert_eq!(sink.0, 6, "the snapshot rows were written");
    assert_eq!(table.requests().len(), 2, "one scan, no second snapshot");
}

/// docs/mirror.md §5.6 (issue 12): into a sink that applies rows by version, a mirror reads the
/// stream beside a snapshot scan that lasts far longer than the stream keeps records. Every
/// change arrives (none was trimmed unread), a quiet stream during the scan does not end the
/// run, the snapshot closes when the scan completes, and the run then streams on and ends idle.
#[tokio::test(start_paused = true)]
async fn a_snapshot_longer_than_the_retention_reads_the_stream_beside_its_scan() {
    use ddbpipe_pipeline::streams::{SnapshotScan, run_streams_with_snapshots};
    use ddbpipe_source::fake::FakeTable;
    use ddbpipe_source::plan::ReadRule;

    // Records live 60 s; the first write comes at 100 s, past the 30 s idle end, while the
    // scan (20 pages at one page per 10 s) runs until about 200 s.
    let mut fake = FakeStreams::new(7)
        .with_retention(Duration::from_secs(60))
        .at(Duration::ZERO, root("s1"));
    for i in 0..30u64 {
        fake = fake.at(
            Duration::from_secs(100 + 10 * i),
            write_to("s1", &format!("k{i}")),
        );
    }
    let fake = Arc::new(fake);
    let table = Arc::new(FakeTable::numbered(40).units_per_page(Some(1.0)));
    let dir = tempfile::tempdir().unwrap();
    let (mut checkpointer, mut sink) = fresh_mirror(dir.path()).await;
    let outcome = run_streams_with_snapshots(
        Arc::clone(&fake),
        Some(SnapshotScan {
            api: Arc::clone(&table),
            segments: 1,
            max_concurrency: 1,
            page_limit: Some(2),
            consistent_read: false,
            read_rule: ReadRule {
                fixed: Some(0.1),
                ..ReadRule::default()
            },
            exports: None,
            repairs: None,
        }),
        &StreamRun {
            kind: StreamKind::Mirror,
            ..settings()
        },
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(outcome.end, EndReason::Idle);

    let ops: Vec<&str> = sink
        .lines
        .iter()
        .map(|l| l["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops.iter().filter(|op| **op == "r").count(),
        40,
        "every item"
    );
    let changes: Vec<&str> = sink
        .lines
        .iter()
        .filter(|l| l["op"] != "r")
        .map(|l| l["sequence_number"].as_str().unwrap())
        .collect();
    let written: Vec<String> = fake
        .written()
        .into_iter()
        .map(|w| w.seq.as_str().to_string())
        .collect();
    assert_eq!(
        changes, written,
        "every change, in order, none trimmed unread"
    );
    let first_change = ops.iter().position(|op| *op != "r").unwrap();
    let last_row = ops.iter().rposition(|op| *op == "r").unwrap();
    assert!(
        first_change < last_row,
        "the stream was read while the table was scanned: {ops:?}"
    );
    // Runner rule 1: scan pages and stream hand-overs never share a batch.
    for batch in &sink.batches {
        let rows = ops[batch.first..batch.first + batch.len]
            .iter()
            .filter(|op| **op == "r")
            .count();
        assert!(rows == 0 || rows == batch.len, "a mixed batch: {batch:?}");
    }
    let position = stored(dir.path());
    assert!(position.snapshot.is_none(), "the snapshot closed");
    assert_eq!(
        position.shards[&ShardId::new("s1")],
        ShardProgress::After(SequenceNumber::parse(written.last().unwrap()).unwrap())
    );
}

/// Runner rule 3 (`runner::together`): when the scan ends, the engine is stopped and waited
/// for; a shard slice waiting for room in the full hand-over must be received meanwhile, or
/// the engine never ends and the run hangs after its last snapshot row (found by the bench's
/// 50 tables into one SQLite file: a slow sink and a busy stream at the scan's end). Here six
/// shards hold changes from the start, each write takes a second and the scan is one page.
#[tokio::test(start_paused = true)]
async fn a_scan_ending_while_the_stream_waits_for_room_ends_and_writes_every_change() {
    use ddbpipe_pipeline::streams::run_streams_with_snapshots;
    use ddbpipe_source::fake::FakeTable;

    let shards = ["s1", "s2", "s3", "s4", "s5", "s6"];
    let mut fake = FakeStreams::new(11);
    for shard in shards {
        fake = fake.at(Duration::ZERO, root(shard));
    }
    for i in 0..40 {
        for shard in shards {
            fake = fake.at(Duration::ZERO, write_to(shard, &format!("{shard}-{i}")));
        }
    }
    let fake = Arc::new(fake);
    let table = Arc::new(FakeTable::numbered(5));
    let dir = tempfile::tempdir().unwrap();
    let (mut checkpointer, mut sink) = fresh_mirror(dir.path()).await;
    sink.delay = Duration::from_secs(1);
    let settings = StreamRun {
        kind: StreamKind::Mirror,
        batch: BatchLimits {
            records: 4,
            ..settings().batch
        },
        ..settings()
    };
    let run = run_streams_with_snapshots(
        Arc::clone(&fake),
        Some(plain_scan(&table, 1, 1)),
        &settings,
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    );
    // Paused time: a hang leaves only this timer, which then fires at once.
    let outcome = tokio::time::timeout(Duration::from_secs(24 * 3600), run)
        .await
        .expect("the run ends: the hand-over is drained while the engine stops")
        .unwrap();
    assert_eq!(outcome.end, EndReason::Idle);
    let changes = sink.lines.iter().filter(|line| line["op"] != "r").count();
    assert_eq!(changes, 6 * 40, "every change");
    let rows = sink.lines.iter().filter(|line| line["op"] == "r").count();
    assert_eq!(rows, 5, "every item");
    assert!(stored(dir.path()).snapshot.is_none(), "the snapshot closed");
}

/// docs/mirror.md §5.2: an open snapshot whose stream was read beside its scan resumes only when
/// its stored shard positions are still readable; a position trimmed while the run was down
/// fails the run naming the shard, before any Scan request, and the state stays as it was.
#[tokio::test(start_paused = true)]
async fn resuming_a_snapshot_read_beside_its_stream_fails_when_its_shard_was_trimmed_meanwhile() {
    use ddbpipe_pipeline::state::Entry;
    use ddbpipe_pipeline::streams::run_streams_with_snapshots;
    use ddbpipe_source::fake::FakeTable;

    let fake = Arc::new(FakeStreams::new(9).at(Duration::ZERO, root("s1")));
    for key in ["a", "b", "c"] {
        fake.apply(write_to("s1", key));
    }
    let first = seqs_of(&fake, "s1")[0].clone();
    fake.apply(Change::Trim {
        shard: "s1".into(),
        through: 1,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = StateFile::new(dir.path().join("state.json"));
    let mut before = StreamsPosition::new(StreamKind::Mirror, Some(FAKE_STREAM_ARN.into()));
    before.advance(&ShardId::new("s1"), &SequenceNumber::parse(&first).unwrap());
    before.snapshot = Some(Box::new(ddbpipe_source::position::SnapshotRecord::open(
        ddbpipe_source::clock::unix_now_ms(),
        2,
        ddbpipe_source::position::SnapshotReason::Mirror,
        &[],
        0,
    )));
    let identity = Identity::from_json(json!({"table_name": "t", "mode": "mirror"}));
    let entry = Entry {
        identity: identity.clone(),
        last_completed: None,
        position: Some(Position::Streams(before.clone())),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    };
    file.store("p", Some(&entry)).unwrap();
    let mut checkpointer = Checkpointer::open_streams(file, "p", identity, Duration::ZERO)
        .await
        .unwrap();
    let mut sink = line_sink();
    sink.versioned = true;
    let table = Arc::new(FakeTable::numbered(4));
    let outcome = run_streams_with_snapshots(
        Arc::clone(&fake),
        Some(plain_scan(&table, 2, 1)),
        &StreamRun {
            kind: StreamKind::Mirror,
            on_gap: OnGap::Resnapshot,
            ..settings()
        },
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await;
    let Err(StreamRunError::CannotResume(message)) = outcome else {
        panic!("a gap was expected, got {outcome:?}");
    };
    assert!(message.contains("shard s1 was trimmed"), "{message}");
    assert!(
        message.contains("found while resuming an open snapshot"),
        "{message}"
    );
    assert!(table.requests().is_empty(), "no Scan request");
    assert!(sink.lines.is_empty());
    assert_eq!(stored(dir.path()), before, "the state stays as it was");
}

/// docs/mirror.md §5.3, §5.4: a snapshot whose scan completed earlier (only its cleanup was left)
/// is closed first even when its stream was read beside it and a position was trimmed meanwhile;
/// the trim is then the gap found right after a snapshot, handled once by `on_gap`.
#[tokio::test(start_paused = true)]
async fn a_completed_snapshot_is_closed_before_its_trimmed_positions_are_judged() {
    use ddbpipe_pipeline::state::Entry;
    use ddbpipe_pipeline::streams::run_streams_with_snapshots;
    use ddbpipe_source::fake::FakeTable;

    let fake = Arc::new(FakeStreams::new(9).at(Duration::ZERO, root("s1")));
    for key in ["a", "b", "c"] {
        fake.apply(write_to("s1", key));
    }
    let first = seqs_of(&fake, "s1")[0].clone();
    fake.apply(Change::Trim {
        shard: "s1".into(),
        through: 1,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = StateFile::new(dir.path().join("state.json"));
    let mut before = StreamsPosition::new(StreamKind::Mirror, Some(FAKE_STREAM_ARN.into()));
    before.advance(&ShardId::new("s1"), &SequenceNumber::parse(&first).unwrap());
    before.snapshot = Some(Box::new(ddbpipe_source::position::SnapshotRecord::open(
        ddbpipe_source::clock::unix_now_ms(),
        2,
        ddbpipe_source::position::SnapshotReason::Mirror,
        &[],
        0,
    )));
    if let Some(snapshot) = before.snapshot.as_mut() {
        snapshot.complete = true;
    }
    let identity = Identity::from_json(json!({"table_name": "t", "mode": "mirror"}));
    let entry = Entry {
        identity: identity.clone(),
        last_completed: None,
        position: Some(Position::Streams(before.clone())),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    };
    file.store("p", Some(&entry)).unwrap();
    let mut checkpointer = Checkpointer::open_streams(file, "p", identity, Duration::ZERO)
        .await
        .unwrap();
    let mut sink = line_sink();
    sink.versioned = true;
    let table = Arc::new(FakeTable::numbered(4));
    let outcome = run_streams_with_snapshots(
        Arc::clone(&fake),
        Some(plain_scan(&table, 2, 1)),
        &StreamRun {
            kind: StreamKind::Mirror,
            on_gap: OnGap::Fail,
            ..settings()
        },
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await;
    let Err(StreamRunError::CannotResume(message)) = outcome else {
        panic!("a gap was expected, got {outcome:?}");
    };
    assert!(message.contains("shard s1 was trimmed"), "{message}");
    assert!(
        message.contains("found right after a snapshot"),
        "{message}"
    );
    assert!(table.requests().is_empty(), "no Scan request");
    assert!(sink.lines.is_empty());
    let after = stored(dir.path());
    assert!(after.snapshot.is_none(), "the snapshot was closed");
    assert_eq!(
        after.shards, before.shards,
        "the shard positions stay as they were"
    );
}

/// docs/state.md §6.8 rule 3: a store apart from the rows (the state file) has no rows to sweep
/// when a repair window closes, but the position the repair moves to is written then, not at a
/// later flush.
#[tokio::test]
async fn a_repair_window_closed_into_a_state_file_stores_where_the_repair_goes_on_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.path().join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "streams"})),
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let position = StreamsPosition::new(StreamKind::Streams, Some(FAKE_STREAM_ARN.into()));
    checkpointer.set_streams(position).await.unwrap();
    let day = 24 * 3_600_000;
    let repair = RepairRecord::open(3 * day, 0, 2 * day, &["gap".into()]);
    checkpointer.begin_repair(repair).await.unwrap();
    checkpointer.complete(0, 0.0).await.unwrap();
    let repair = stored(dir.path()).repair.expect("the repair is open");
    assert_eq!((repair.window_from_ms, repair.window_to_ms), (day, 2 * day));
    checkpointer.complete(0, 0.0).await.unwrap();
    assert!(stored(dir.path()).repair.is_some_and(|r| r.applied));
}
