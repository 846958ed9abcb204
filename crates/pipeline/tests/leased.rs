//! The shared scan (docs/coordination.md §11.10) on the in-memory table and lease table, with
//! paused time: several workers, a crash, a worker stalled past its lease, a graceful stop.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::leased::{LeasedOutcome, LeasedScan};
use ddbpipe_pipeline::runner::{NoProgress, RunError};
use ddbpipe_pipeline::sink::{Fencing, Sink, SinkError, Staged};
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::api::{ReadRequest, Render};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::config::SourceConfig;
use ddbpipe_source::fake::FakeTable;
use ddbpipe_source::lease::memory::{MemoryLeaseTable, WriteKind};
use ddbpipe_source::lease::{
    LeaseSettings, LeaseState, LeaseTable, PipelineName, UnitId, Worker, WorkerId,
};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::scan::{self, SegmentReader};
use ddbpipe_testkit::MemorySink;
use ddbpipe_value::ValueFormat;

const ITEMS: usize = 1200;
const SEGMENTS: u32 = 12;

fn reader(table: &Arc<FakeTable>, segments: u32) -> SegmentReader<FakeTable> {
    SegmentReader {
        api: Arc::clone(table),
        template: ReadRequest {
            limit: Some(10),
            ..scan::read_template(&SourceConfig::new("t"))
        },
        total_segments: segments,
        max_concurrency: 2,
        limiter: Arc::new(ReadLimiter::new(None)),
        retry: RetryPolicy::default(),
        render: Render::items(ValueFormat::Plain),
        observer: Arc::new(NoObserver),
        slots: Default::default(),
    }
}

fn scan(
    table: &Arc<FakeTable>,
    leases: &MemoryLeaseTable,
    id: &str,
    segments: u32,
) -> LeasedScan<FakeTable, MemoryLeaseTable> {
    LeasedScan {
        reader: reader(table, segments),
        worker: Worker::new(
            leases.connect(),
            PipelineName::new("p").unwrap(),
            WorkerId::new(id).unwrap(),
            LeaseSettings::new(10).unwrap(),
        ),
        batch: BatchLimits::records(10),
        checkpoint_interval: Duration::ZERO,
        identity: identity("scan"),
    }
}

/// The settings a worker runs with, as the leader row keeps them.
fn identity(filter: &str) -> Identity {
    Identity::from_json(serde_json::json!({"table_name": "t", "filter_expression": filter}))
}

/// Half a second per batch of one page (tokio time): a scan long enough to crash in.
fn slow() -> MemorySink {
    MemorySink::default().taking(Duration::from_millis(500))
}

fn keys(lines: &[String]) -> Vec<String> {
    ddbpipe_testkit::pks(lines.iter().map(String::as_str))
}

/// Runs a worker in its own task; the sink comes back with the outcome.
fn spawn<S: Sink + 'static>(
    run: LeasedScan<FakeTable, MemoryLeaseTable>,
    mut sink: S,
    stop: Cancel,
) -> tokio::task::JoinHandle<(Result<LeasedOutcome, RunError>, S)> {
    tokio::spawn(async move {
        let outcome = run.run(&mut sink, stop, &NoProgress).await;
        (outcome, sink)
    })
}

async fn rows(leases: &MemoryLeaseTable) -> Vec<ddbpipe_source::lease::Lease> {
    leases.list(&PipelineName::new("p").unwrap()).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn three_workers_share_the_segments_and_read_every_item() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(1);
    let mut handles = Vec::new();
    for id in ["w1", "w2", "w3"] {
        let (_, stop) = Cancel::new();
        handles.push(spawn(scan(&table, &leases, id, SEGMENTS), slow(), stop));
    }
    let mut all = Vec::new();
    let mut finished = 0;
    for handle in handles {
        let (outcome, sink) = handle.await.unwrap();
        let outcome = outcome.unwrap();
        assert!(outcome.completed, "every worker sees the scan complete");
        assert_eq!(outcome.segments_done, u64::from(SEGMENTS));
        assert!(
            outcome.leases.finished >= 2,
            "each worker read its share: {outcome:?}"
        );
        assert_eq!(outcome.written as usize, sink.lines.len());
        finished += outcome.leases.finished;
        all.extend(keys(&sink.lines));
    }
    assert_eq!(
        finished,
        u64::from(SEGMENTS),
        "each segment was finished once"
    );
    assert!(all.len() >= ITEMS);
    let distinct: BTreeSet<_> = all.into_iter().collect();
    assert_eq!(distinct.len(), ITEMS);
    for row in rows(&leases).await {
        if row.unit.is_work() {
            assert_eq!(row.state, LeaseState::Done, "{row:?}");
            assert_eq!(row.owner, None, "a finished segment is handed back");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_crashed_workers_segments_are_taken_over_from_their_checkpoints() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(2);
    let (_, stop) = Cancel::new();
    let crashed = spawn(scan(&table, &leases, "crash", SEGMENTS), slow(), stop);
    tokio::time::sleep(Duration::from_secs(30)).await;
    // The process dies: no final checkpoint, no hand-back.
    crashed.abort();
    let _ = crashed.await;
    let checkpointed: Vec<_> = rows(&leases)
        .await
        .into_iter()
        .filter(|r| {
            r.owner.as_ref().is_some_and(|o| o.as_str() == "crash") && r.checkpoint.is_some()
        })
        .collect();
    assert!(
        !checkpointed.is_empty(),
        "the crashed worker had checkpointed segments"
    );
    let done_before = rows(&leases)
        .await
        .iter()
        .filter(|r| r.unit.is_work() && r.state == LeaseState::Done)
        .count() as u64;
    assert!(done_before < u64::from(SEGMENTS), "the crash came mid-scan");

    let mut handles = Vec::new();
    for id in ["w1", "w2"] {
        let (_, stop) = Cancel::new();
        handles.push(spawn(scan(&table, &leases, id, SEGMENTS), slow(), stop));
    }
    let mut read = BTreeSet::new();
    let mut taken = 0;
    for handle in handles {
        let (outcome, sink) = handle.await.unwrap();
        let outcome = outcome.unwrap();
        assert!(outcome.completed);
        taken += outcome.leases.taken;
        read.extend(keys(&sink.lines));
    }
    // Each unfinished segment taken from the crashed worker (stolen while it still looked
    // live, or after expiry), and maybe moved again between the takers to balance them.
    assert!(
        taken >= u64::from(SEGMENTS) - done_before,
        "every unfinished segment was taken: {taken}"
    );
    // What the crashed worker checkpointed is not read again: the takers resumed after it.
    for row in checkpointed {
        let UnitId::Segment { index, .. } = row.unit else {
            continue;
        };
        let first = format!("k{:06}", index);
        assert!(
            !read.contains(&first),
            "segment {index} resumed after its checkpoint"
        );
    }
    // Everything after the checkpoints was read: each item is in one of the takers' outputs,
    // or was committed by the crashed worker before its checkpoint.
    let missing: Vec<usize> = (0..ITEMS)
        .filter(|i| !read.contains(&format!("k{i:06}")))
        .collect();
    for i in missing {
        let segment = (i % SEGMENTS as usize) as u32;
        let row = rows(&leases)
            .await
            .into_iter()
            .find(|r| {
                r.unit
                    == UnitId::Segment {
                        index: segment,
                        total: SEGMENTS,
                    }
            })
            .unwrap();
        assert_eq!(row.state, LeaseState::Done);
        assert!(
            leases.log().iter().any(|w| w.unit == row.unit
                && w.kind == WriteKind::Checkpoint
                && w.after
                    .as_ref()
                    .and_then(|a| a.owner.clone())
                    .is_some_and(|o| o.as_str() == "crash")),
            "item {i} neither re-read nor checkpointed by the crashed worker"
        );
    }
}

/// A sink whose `stall_at`-th write hangs for `stall`: a worker paused past its lease.
struct Stalling {
    inner: MemorySink,
    stall_at: usize,
    stall: Duration,
    writes: usize,
}

impl Sink for Stalling {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        self.writes += 1;
        if self.writes == self.stall_at {
            tokio::time::sleep(self.stall).await;
        }
        self.inner.write(batch, state).await
    }

    fn describe(&self) -> String {
        "stalling".into()
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_stalled_past_its_lease_loses_its_segments_to_the_other() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(3);
    let (_, stop) = Cancel::new();
    let zombie = spawn(
        scan(&table, &leases, "zombie", SEGMENTS),
        Stalling {
            inner: slow(),
            stall_at: 4,
            stall: Duration::from_secs(60),
            writes: 0,
        },
        stop,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, stop) = Cancel::new();
    let other = spawn(scan(&table, &leases, "other", SEGMENTS), slow(), stop);
    let (zombie_outcome, zombie_sink) = zombie.await.unwrap();
    let (other_outcome, other_sink) = other.await.unwrap();
    let zombie_outcome = zombie_outcome.unwrap();
    let other_outcome = other_outcome.unwrap();
    assert!(zombie_outcome.leases.lost >= 1, "{zombie_outcome:?}");
    assert!(other_outcome.completed && zombie_outcome.completed);
    assert_eq!(
        zombie_outcome.leases.finished + other_outcome.leases.finished,
        u64::from(SEGMENTS),
        "each segment finished by one worker: the zombie finished none it had lost"
    );
    let mut read: BTreeSet<String> = keys(&zombie_sink.inner.lines).into_iter().collect();
    read.extend(keys(&other_sink.lines));
    assert_eq!(read.len(), ITEMS, "the union holds every item");
}

/// A worker whose sink write takes three lease durations keeps its lease: its keeper renews
/// it on a timer of its own (docs/coordination.md §11.4 rule 1), and the other worker, at its
/// share, waits. Before the keeper the renewals waited for the write: the other worker took
/// the segment a duration later and the slow one lost it.
#[tokio::test(start_paused = true)]
async fn a_worker_stalled_in_a_slow_write_keeps_its_lease() {
    let table = Arc::new(FakeTable::numbered(100));
    let leases = MemoryLeaseTable::seeded(5);
    let (_, stop) = Cancel::new();
    let stalling = Stalling {
        inner: slow(),
        stall_at: 2,
        stall: Duration::from_secs(30),
        writes: 0,
    };
    let slow_writer = spawn(scan(&table, &leases, "slow", 1), stalling, stop);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, stop) = Cancel::new();
    let other = spawn(scan(&table, &leases, "other", 1), slow(), stop);
    let (slow_outcome, slow_sink) = slow_writer.await.unwrap();
    let (other_outcome, other_sink) = other.await.unwrap();
    let (slow_outcome, other_outcome) = (slow_outcome.unwrap(), other_outcome.unwrap());
    assert_eq!(slow_outcome.leases.lost, 0, "{slow_outcome:?}");
    assert_eq!(
        (slow_outcome.leases.finished, other_outcome.leases.finished),
        (1, 0),
        "{other_outcome:?}"
    );
    assert!(slow_outcome.completed && other_outcome.completed);
    assert!(other_sink.lines.is_empty());
    assert_eq!(keys(&slow_sink.inner.lines).len(), 100);
}

/// Issue 24 item 12: with `lease_duration_secs: 300` a scan of about a minute ended at 100 s,
/// at the round after the last `Done`. The worker that writes a `Done` runs a round at once,
/// so the one that writes the last sees the end then (paused tokio time: no wall clock).
#[tokio::test(start_paused = true)]
async fn the_worker_that_finishes_the_last_segment_sees_the_end_at_once() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(6);
    let mut run = scan(&table, &leases, "only", SEGMENTS);
    run.worker = Worker::new(
        leases.connect(),
        PipelineName::new("p").unwrap(),
        WorkerId::new("only").unwrap(),
        LeaseSettings::new(300).unwrap(),
    );
    let started = tokio::time::Instant::now();
    let (_, stop) = Cancel::new();
    let (outcome, sink) = spawn(run, slow(), stop).await.unwrap();
    let outcome = outcome.unwrap();
    let took = started.elapsed();
    assert!(outcome.completed);
    assert_eq!(keys(&sink.lines).len(), ITEMS);
    // 120 batches of half a second: a minute of writing, then the end, not a round later.
    assert!(
        took < Duration::from_secs(70),
        "ended {took:?} after its start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_hands_the_leases_back_with_their_checkpoints() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(4);
    let (handle, stop) = Cancel::new();
    let first = spawn(scan(&table, &leases, "first", SEGMENTS), slow(), stop);
    tokio::time::sleep(Duration::from_secs(20)).await;
    handle.cancel();
    let (outcome, sink) = first.await.unwrap();
    let outcome = outcome.unwrap();
    assert!(!outcome.completed);
    assert!(!sink.lines.is_empty());
    for row in rows(&leases).await {
        assert_eq!(row.owner, None, "handed back: {row:?}");
    }
    // The next worker takes them at once, without waiting for expiry, and resumes each.
    let (_, stop) = Cancel::new();
    let second = spawn(scan(&table, &leases, "second", SEGMENTS), slow(), stop);
    let (outcome, second_sink) = second.await.unwrap();
    assert!(outcome.unwrap().completed);
    let mut all = keys(&sink.lines);
    all.extend(keys(&second_sink.lines));
    assert_eq!(
        all.len(),
        ITEMS,
        "nothing read twice after a graceful hand-back"
    );
    for write in leases.log() {
        let by_second = write.kind == WriteKind::Take
            && write
                .after
                .as_ref()
                .and_then(|a| a.owner.clone())
                .is_some_and(|o| o.as_str() == "second");
        if by_second && write.unit.is_work() {
            assert_eq!(
                write.before.and_then(|b| b.owner),
                None,
                "taken free, not expired"
            );
        }
    }
}

/// A shared scan a first worker ran for ten seconds, then stopped: its rows are unfinished.
async fn stopped_after_ten_seconds() -> (Arc<FakeTable>, MemoryLeaseTable) {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(5);
    let (handle, stop) = Cancel::new();
    let first = spawn(scan(&table, &leases, "first", SEGMENTS), slow(), stop);
    tokio::time::sleep(Duration::from_secs(10)).await;
    handle.cancel();
    first.await.unwrap().0.unwrap();
    (table, leases)
}

/// A segment row whose checkpoint was edited into another unit's form (a hand edit) stops the
/// worker that takes it, naming the row, its text and what to do; nothing more is read.
#[tokio::test(start_paused = true)]
async fn a_segment_row_with_an_unreadable_checkpoint_stops_its_taker_naming_it() {
    let (table, leases) = stopped_after_ten_seconds().await;
    let edited = UnitId::Segment {
        index: 0,
        total: SEGMENTS,
    };
    leases.edit(&PipelineName::new("p").unwrap(), &edited, |row| {
        row.checkpoint = Some(edited.checkpoint("after:000000000000000000123"));
        row.state = LeaseState::Processing;
    });
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(scan(&table, &leases, "second", SEGMENTS), slow(), stop)
        .await
        .unwrap();
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("lease segment:0/12")
            && error.contains("'after:000000000000000000123'")
            && error.contains("ddbpipe state reset"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_changed_segment_count_is_refused_while_a_shared_scan_is_unfinished() {
    let (table, leases) = stopped_after_ten_seconds().await;
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(scan(&table, &leases, "second", 4), slow(), stop)
        .await
        .unwrap();
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("12 segment(s)") && error.contains("source.segments is 4"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_with_other_settings_is_refused_before_it_reads() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(7);
    let (handle, stop) = Cancel::new();
    let first = spawn(scan(&table, &leases, "first", SEGMENTS), slow(), stop);
    tokio::time::sleep(Duration::from_secs(10)).await;
    handle.cancel();
    first.await.unwrap().0.unwrap();
    let mut other = scan(&table, &leases, "other", SEGMENTS);
    other.identity = identity("changed");
    let (_, stop) = Cancel::new();
    let (outcome, sink) = spawn(other, slow(), stop).await.unwrap();
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("filter_expression changed") && error.contains("state reset"),
        "{error}"
    );
    assert!(sink.lines.is_empty(), "nothing read under other settings");
    // The leader row keeps the first run's settings; a worker with them goes on.
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(scan(&table, &leases, "again", SEGMENTS), slow(), stop)
        .await
        .unwrap();
    assert!(outcome.unwrap().completed);
}

/// A sink whose lines outlive its worker's task (a crashed worker's file stays on disk), with a
/// delay per write and, optionally, one write that stalls past the lease (a paused process).
struct Shared {
    lines: Arc<std::sync::Mutex<Vec<String>>>,
    delay: Duration,
    stall_at: Option<usize>,
    writes: usize,
}

impl Sink for Shared {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        self.writes += 1;
        if self.stall_at == Some(self.writes) {
            tokio::time::sleep(Duration::from_secs(25)).await;
        }
        tokio::time::sleep(self.delay).await;
        let mut lines = self.lines.lock().unwrap();
        lines.extend(
            batch
                .records
                .iter()
                .map(|l| String::from_utf8(l.to_vec()).unwrap()),
        );
        Ok(())
    }

    fn describe(&self) -> String {
        "shared".into()
    }
}

/// The seeded simulation of shared scans: 2 to 5 workers, a few crashing (the task dropped, no
/// hand-back), pausing past their lease, or stopping gracefully and rejoining under a new id,
/// on a lease table that fails and loses answers. Every seed: every item in some worker's
/// output, every segment `Done`, and every surviving worker sees the scan complete.
#[tokio::test(start_paused = true)]
async fn seeded_workers_with_crashes_pauses_and_lease_faults_lose_no_item() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    for seed in 0..60u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let items = rng.random_range(300..1500);
        let segments = rng.random_range(2..=10u32);
        let table = Arc::new(FakeTable::numbered(items));
        let leases = MemoryLeaseTable::seeded(seed);
        leases.set_faults(ddbpipe_source::lease::memory::Faults {
            fail_rate: rng.random_range(0.0..0.08),
            lost_reply_rate: rng.random_range(0.0..0.08),
            delay: Duration::from_millis(rng.random_range(0..30)),
        });
        let workers = rng.random_range(2..=5usize);
        let mut outputs = Vec::new();
        let mut steady = Vec::new();
        let mut others = Vec::new();
        for w in 0..workers {
            let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
            outputs.push(Arc::clone(&lines));
            // Worker 0 always runs to the end, so the scan finishes.
            let fate = if w == 0 { 0 } else { rng.random_range(0..4) };
            let sink = Shared {
                lines,
                delay: Duration::from_millis(rng.random_range(100..800)),
                stall_at: (fate == 2).then(|| rng.random_range(1..20)),
                writes: 0,
            };
            let (handle, stop) = Cancel::new();
            let run = scan(&table, &leases, &format!("s{seed}-w{w}"), segments);
            let task = spawn(run, sink, stop);
            match fate {
                1 => {
                    // Crashes after a while: the task is dropped, nothing handed back.
                    let at = Duration::from_millis(rng.random_range(500..40_000));
                    others.push(tokio::spawn(async move {
                        tokio::time::sleep(at).await;
                        task.abort();
                        let _ = task.await;
                    }));
                }
                3 => {
                    // Stops gracefully, then a new process joins under another id.
                    let at = Duration::from_millis(rng.random_range(500..40_000));
                    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
                    outputs.push(Arc::clone(&lines));
                    let again = scan(&table, &leases, &format!("s{seed}-w{w}-again"), segments);
                    let delay = Duration::from_millis(rng.random_range(100..800));
                    steady.push(tokio::spawn(async move {
                        tokio::time::sleep(at).await;
                        handle.cancel();
                        let (outcome, _) = task.await.unwrap();
                        let outcome = outcome.unwrap();
                        assert!(outcome.segments_done <= u64::from(outcome.total_segments));
                        let (_, stop) = Cancel::new();
                        let sink = Shared {
                            lines,
                            delay,
                            stall_at: None,
                            writes: 0,
                        };
                        let (outcome, _) = spawn(again, sink, stop).await.unwrap();
                        outcome
                    }));
                }
                _ => {
                    steady.push(tokio::spawn(async move {
                        drop(handle);
                        let (outcome, _) = task.await.unwrap();
                        outcome
                    }));
                }
            }
        }
        for task in steady {
            let outcome = tokio::time::timeout(Duration::from_secs(3600), task)
                .await
                .unwrap_or_else(|_| panic!("seed {seed}: a worker ran for an hour"))
                .unwrap()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert!(outcome.completed, "seed {seed}: {outcome:?}");
        }
        for task in others {
            task.await.unwrap();
        }
        let mut read = BTreeSet::new();
        for output in &outputs {
            read.extend(keys(&output.lock().unwrap()));
        }
        assert_eq!(read.len(), items, "seed {seed}: every item in some output");
        leases.set_faults(ddbpipe_source::lease::memory::Faults::default());
        let rows = rows(&leases).await;
        let done = rows
            .iter()
            .filter(|r| r.unit.is_work() && r.state == LeaseState::Done)
            .count();
        assert_eq!(done, segments as usize, "seed {seed}: {rows:?}");
    }
}

/// What a [`FencingSink`] accepted: the unit, the counter it was written under, how many lease
/// writes had been applied when it was, and its lines.
type Accepted = Arc<std::sync::Mutex<Vec<(String, u64, usize, Vec<String>)>>>;

/// A sink that keeps lease fences the way the keyed sinks do (one stored counter per unit; a
/// lower one is refused), sharing one store between workers like one database; one write may
/// stall past the lease before its transaction (a paused process).
struct FencingSink {
    fences: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    accepted: Accepted,
    leases: MemoryLeaseTable,
    stall_at: Option<usize>,
    writes: usize,
    /// Claims during which another worker takes the lease first (a race between a take and
    /// its claim): the thief's take lands, then this claim is refused by the thief's fence.
    races: usize,
}

impl FencingSink {
    fn pass(&self, fence: &ddbpipe_pipeline::sink::Fence) -> Result<(), SinkError> {
        let mut fences = self.fences.lock().unwrap();
        let stored = fences.entry(fence.unit.to_string()).or_insert(0);
        if *stored > fence.counter {
            return Err(SinkError {
                sink: "fencing".into(),
                message: format!("{} fenced at {stored}", fence.unit),
                class: ddbpipe_pipeline::sink::SinkErrorClass::Fenced,
            });
        }
        *stored = fence.counter;
        Ok(())
    }
}

impl Sink for FencingSink {
    async fn write(&mut self, _batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        panic!("a fencing sink is written with its fence");
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        Some(self)
    }

    fn describe(&self) -> String {
        "fencing".into()
    }
}

impl Fencing for FencingSink {
    async fn write_fenced(
        &mut self,
        batch: &Batch,
        fence: &ddbpipe_pipeline::sink::Fence,
    ) -> Result<(), SinkError> {
        self.writes += 1;
        if self.stall_at == Some(self.writes) {
            tokio::time::sleep(Duration::from_secs(40)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(batch.segments.len() <= 1, "one unit per batch");
        self.pass(fence)?;
        let lines = batch
            .records
            .iter()
            .map(|l| String::from_utf8(l.to_vec()).unwrap())
            .collect();
        self.accepted.lock().unwrap().push((
            fence.unit.to_string(),
            fence.counter,
            self.leases.log().len(),
            lines,
        ));
        Ok(())
    }

    async fn claim(
        &mut self,
        fence: &ddbpipe_pipeline::sink::Fence,
    ) -> Result<Option<ddbpipe_source::position::LeaseCheckpoint>, SinkError> {
        if self.races > 0 {
            self.races -= 1;
            let pipeline = PipelineName::new(fence.pipeline.clone()).unwrap();
            let unit = fence.unit.clone();
            let row = self.leases.row(&pipeline, &unit).unwrap();
            let thief = WorkerId::new("thief").unwrap();
            let stolen = self
                .leases
                .take(&pipeline, &unit, row.counter, &thief)
                .await;
            let stolen = stolen.unwrap();
            self.pass(&ddbpipe_pipeline::sink::Fence {
                counter: stolen.counter.0,
                ..fence.clone()
            })?;
        }
        // No position kept: the taker resumes from the lease row (at least once).
        self.pass(fence).map(|()| None)
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_worker_cannot_write_a_unit_after_its_new_owner_claimed_it() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(6);
    let fences = Arc::default();
    let accepted: Accepted = Arc::default();
    let sink = |stall_at| FencingSink {
        fences: Arc::clone(&fences),
        accepted: Arc::clone(&accepted),
        leases: leases.connect(),
        stall_at,
        writes: 0,
        races: 0,
    };
    let (_, stop) = Cancel::new();
    let zombie = spawn(
        scan(&table, &leases, "zombie", SEGMENTS),
        sink(Some(5)),
        stop,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, stop) = Cancel::new();
    let other = spawn(scan(&table, &leases, "other", SEGMENTS), sink(None), stop);
    let zombie = zombie.await.unwrap().0.unwrap();
    let other = other.await.unwrap().0.unwrap();
    assert!(zombie.completed && other.completed);
    assert!(zombie.leases.lost >= 1, "{zombie:?}");
    let accepted = accepted.lock().unwrap().clone();
    // The batch its fence refused is not counted as written (`runner::lane` rule 4).
    let records: usize = accepted.iter().map(|(_, _, _, lines)| lines.len()).sum();
    assert_eq!(
        zombie.written + other.written,
        records as u64,
        "{zombie:?} {other:?}"
    );
    let log = leases.log();
    for (at, write) in log.iter().enumerate() {
        let Some(after) = &write.after else { continue };
        if write.kind != WriteKind::Take || !write.unit.is_work() {
            continue;
        }
        let unit = write.unit.to_string();
        for (written, counter, log_len, _) in &accepted {
            assert!(
                !(*written == unit && *counter < after.counter.0 && *log_len > at),
                "{unit} written under counter {counter} after it was taken under {}",
                after.counter.0
            );
        }
    }
    let read: BTreeSet<String> = accepted
        .iter()
        .flat_map(|(_, _, _, lines)| keys(lines))
        .collect();
    assert_eq!(read.len(), ITEMS, "every item written under a live lease");
}

#[tokio::test(start_paused = true)]
async fn a_claim_refused_because_another_worker_took_the_lease_only_loses_it() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(8);
    let accepted: Accepted = Arc::default();
    let sink = FencingSink {
        fences: Arc::default(),
        accepted: Arc::clone(&accepted),
        leases: leases.connect(),
        stall_at: None,
        writes: 0,
        races: 2,
    };
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(scan(&table, &leases, "w", SEGMENTS), sink, stop)
        .await
        .unwrap();
    let outcome = outcome.unwrap();
    assert!(outcome.completed, "{outcome:?}");
    assert!(
        outcome.leases.lost >= 2,
        "the raced leases were lost: {outcome:?}"
    );
    let read: BTreeSet<String> = accepted
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, _, _, lines)| keys(lines))
        .collect();
    assert_eq!(
        read.len(),
        ITEMS,
        "taken back after the thief's leases expired"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_refused_by_a_fence_that_outlived_its_lease_rows_stops_the_run() {
    let table = Arc::new(FakeTable::numbered(ITEMS));
    let leases = MemoryLeaseTable::seeded(9);
    // Fences of an earlier lease table, deleted by hand: higher than any counter to come.
    let fences: HashMap<String, u64> = (0..SEGMENTS)
        .map(|i| (format!("segment:{i}/{SEGMENTS}"), 1_000))
        .collect();
    let sink = FencingSink {
        fences: Arc::new(std::sync::Mutex::new(fences)),
        accepted: Arc::default(),
        leases: leases.connect(),
        stall_at: None,
        writes: 0,
        races: 0,
    };
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(scan(&table, &leases, "w", SEGMENTS), sink, stop)
        .await
        .unwrap();
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("fenced at 1000"), "{error}");
}
