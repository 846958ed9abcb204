//! The shared stream (docs/coordination.md §11.11) on the in-memory stream and lease table,
//! under paused time: several workers, splits, crashes, a worker stalled past its lease.
//!
//! # The seeded simulation
//! Each seed scripts a stream (1–3 roots, writes over up to 40 s, up to 4 splits or rotations
//! whose children are listed late), 2–5 workers on one lease table with seeded request
//! faults and lost replies, and a fate per worker but the first: run to the end, crash (its
//! task dropped: no final checkpoint, no hand-back) and be replaced by a new process, stall in
//! a write for 40 s (past the 10 s lease) and then go on, or stop gracefully and be replaced.
//! Every worker writes to one fencing sink (one database, like the keyed sinks).
//!
//! Checked on every seed:
//! - every record written is accepted by the sink exactly once (the position committed with a
//!   batch resumes the next owner right after it, and a zombie is refused by its fence);
//! - per key, the last record accepted is the key's last record written (the destination
//!   ends equal to the table);
//! - per key, no record of a shard is accepted after a record of one of its descendants
//!   (parents before children, across workers);
//! - every shard closed and read ends `ShardEnd`, unowned;
//! - every worker ends idle.
//!
//! `LEASED_SEED=7` runs one seed; `LEASED_SEEDS=500` runs more; `LEASED_TRACE=1` prints the
//! workers' log.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::leased::{LeasedStreamOutcome, LeasedStreams};
use ddbpipe_pipeline::runner::{NoProgress, RunError};
use ddbpipe_pipeline::sink::{Fence, Fencing, Sink, SinkError, SinkErrorClass, Staged};
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::StreamRun;
use ddbpipe_source::config::StartPosition;
use ddbpipe_source::fake_streams::{Change, FakeStreams, Faults, Written};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::lease::memory::{MemoryLeaseTable, WriteKind};
use ddbpipe_source::lease::{LeaseSettings, LeaseState, PipelineName, UnitId, Worker, WorkerId};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::{Cancel, NoObserver};
use ddbpipe_source::streams::engine::EndReason;
use ddbpipe_source::streams::shard_reader::StreamError;
use ddbpipe_testkit::fake_stream_run;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEEDS: u64 = 60;

/// One record as a sink accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Accepted {
    shard: String,
    seq: String,
    key: String,
    worker: String,
}

type Log = Arc<Mutex<Vec<Accepted>>>;
/// Per unit: the stored counter and the position committed with it.
type Fences = Arc<Mutex<HashMap<String, (u64, Option<LeaseCheckpoint>)>>>;

/// One database for every worker: batches pass their fence (a lower counter than the one
/// stored is refused) and are logged in the order they were accepted.
struct FencingLog {
    worker: String,
    fences: Fences,
    log: Log,
    delay: Duration,
    stall_at: Option<usize>,
    writes: usize,
}

impl FencingLog {
    /// Advances the fence (and its position) unless a newer counter is stored; returns the
    /// position stored.
    fn pass(&self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        let mut fences = self.fences.lock().unwrap();
        let (stored, position) = fences.entry(fence.unit.to_string()).or_insert((0, None));
        if *stored > fence.counter {
            return Err(SinkError {
                sink: "log".into(),
                message: format!("{} fenced at {stored}", fence.unit),
                class: SinkErrorClass::Fenced,
            });
        }
        *stored = fence.counter;
        if fence.position.is_some() {
            position.clone_from(&fence.position);
        }
        Ok(position.clone())
    }
}

fn accepted(line: &[u8], worker: &str) -> Accepted {
    let json: serde_json::Value = serde_json::from_slice(line).unwrap();
    Accepted {
        shard: json["shard_id"].as_str().unwrap().to_string(),
        seq: json["sequence_number"].as_str().unwrap().to_string(),
        key: json["key"]["pk"].as_str().unwrap().to_string(),
        worker: worker.to_string(),
    }
}

impl Sink for FencingLog {
    async fn write(&mut self, _batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        panic!("a fencing sink is written with its fence");
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        Some(self)
    }

    fn describe(&self) -> String {
        "log".into()
    }
}

impl Fencing for FencingLog {
    async fn write_fenced(&mut self, batch: &Batch, fence: &Fence) -> Result<(), SinkError> {
        self.writes += 1;
        if self.stall_at == Some(self.writes) {
            // A paused process: its lease expires and is taken meanwhile.
            tokio::time::sleep(Duration::from_secs(40)).await;
        }
        tokio::time::sleep(self.delay).await;
        // One transaction: the fence, its position and the rows.
        let mut log = self.log.lock().unwrap();
        self.pass(fence)?;
        let records: Vec<Accepted> = batch
            .records
            .iter()
            .map(|line| accepted(line, &self.worker))
            .collect();
        assert!(
            records
                .iter()
                .all(|r| format!("shard:{}", r.shard) == fence.unit.to_string()),
            "one shard per batch, under its own fence"
        );
        let last = records
            .last()
            .map(|r| SequenceNumber::parse(&r.seq).unwrap());
        // A positioned row keeps when its shard was read (docs/coordination.md §11.1).
        let reached = match &fence.position {
            Some(LeaseCheckpoint::After {
                seq,
                read_at_s: Some(_),
            }) => Some(seq.clone()),
            _ => None,
        };
        assert!(
            (reached.is_some() && reached == last)
                || fence.position == Some(LeaseCheckpoint::ShardEnd),
            "the batch's position is its last record with its read_at, or the shard's end it \
             reaches: {:?}",
            fence.position
        );
        log.extend(records);
        Ok(())
    }

    async fn claim(&mut self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        self.pass(fence)
    }
}

/// Each worker its own output (a jsonl file per worker): no fences.
struct Own {
    worker: String,
    log: Log,
}

impl Sink for Own {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut log = self.log.lock().unwrap();
        log.extend(batch.records.iter().map(|l| accepted(l, &self.worker)));
        Ok(())
    }

    fn describe(&self) -> String {
        "own".into()
    }
}

fn worker(
    fake: &Arc<FakeStreams>,
    leases: &MemoryLeaseTable,
    id: &str,
    run: &StreamRun,
    checkpoint_interval: Duration,
) -> LeasedStreams<FakeStreams, MemoryLeaseTable> {
    LeasedStreams {
        api: Arc::clone(fake),
        run: run.clone(),
        worker: Worker::new(
            leases.connect(),
            PipelineName::new("p").unwrap(),
            WorkerId::new(id).unwrap(),
            LeaseSettings::new(10).unwrap(),
        ),
        checkpoint_interval,
        observer: Arc::new(NoObserver),
        identity: Identity::from_json(serde_json::json!({"stream_arn": "s"})),
        kept: Vec::new(),
    }
}

type Ran<S> = tokio::task::JoinHandle<(Result<LeasedStreamOutcome, RunError>, S)>;

fn spawn<S: Sink + 'static>(
    run: LeasedStreams<FakeStreams, MemoryLeaseTable>,
    mut sink: S,
    stop: Cancel,
) -> Ran<S> {
    tokio::spawn(async move {
        let outcome = run.run(&mut sink, stop, &NoProgress).await;
        (outcome, sink)
    })
}

fn shard_id(rng: &mut StdRng, n: &mut u32) -> String {
    *n += 1;
    format!("shardId-{n:05}-{:08x}", rng.random::<u32>())
}

/// A stream of `roots` roots with writes over `window_ms` and `reshards` splits or rotations.
fn stream(seed: u64, rng: &mut StdRng, window_ms: u64, reshards: usize) -> Arc<FakeStreams> {
    let mut fake = FakeStreams::new(seed).with_faults(Faults::none());
    let mut n = 0;
    let roots = rng.random_range(1..=3u32);
    let mut open = Vec::new();
    for r in 0..roots {
        let shard = shard_id(rng, &mut n);
        fake = fake.at(
            Duration::ZERO,
            Change::Root {
                shard: shard.clone(),
                range: Some((r * 65536 / roots, (r + 1) * 65536 / roots)),
            },
        );
        open.push(shard);
    }
    let keys = rng.random_range(3..=20);
    let mut later: Vec<(u64, Change)> = (0..rng.random_range(20..=150))
        .map(|_| {
            let key = format!("k{}", rng.random_range(0..keys));
            let remove = rng.random_bool(0.1);
            (
                rng.random_range(0..=window_ms),
                Change::Write { key, remove },
            )
        })
        .collect();
    let mut times: Vec<u64> = (0..reshards)
        .map(|_| rng.random_range(0..=window_ms))
        .collect();
    times.sort();
    for at in times {
        let parent = open.remove(rng.random_range(0..open.len()));
        let count = if rng.random_bool(0.6) { 2 } else { 1 };
        let children: Vec<String> = (0..count).map(|_| shard_id(rng, &mut n)).collect();
        open.extend(children.iter().cloned());
        later.push((
            at,
            Change::Reshard {
                parent,
                children,
                listed_after: Duration::from_millis(rng.random_range(0..=8_000)),
            },
        ));
    }
    later.sort_by_key(|(at, _)| *at);
    for (at, change) in later {
        fake = fake.at(Duration::from_millis(at), change);
    }
    Arc::new(fake)
}

fn settings(rng: &mut StdRng) -> StreamRun {
    let mut run = fake_stream_run();
    run.bounds.shard_concurrency = rng.random_range(1..=3);
    run.bounds.idle_termination = Some(Duration::from_secs(60));
    run.bounds.discovery_interval = Duration::from_secs(rng.random_range(5..=30));
    // Batches cut by count or by bytes (a record is a few hundred bytes).
    run.batch = BatchLimits {
        records: rng.random_range(1..=20),
        bytes: rng.random_range(100..=8000),
        whole_pages: false,
    };
    run
}

/// The checks of the module docs on what the sink accepted.
fn check(seed: u64, fake: &FakeStreams, log: &[Accepted]) {
    let written: Vec<Written> = fake.written();
    let mut seen: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for a in log {
        seen.entry(a.seq.as_str())
            .or_default()
            .push(a.worker.as_str());
    }
    for record in &written {
        let by = seen.get(record.seq.as_str());
        assert!(
            by.is_some(),
            "seed {seed}: {} of {} ({}) was never accepted",
            record.seq.as_str(),
            record.key,
            record.shard
        );
        // The position committed with the rows resumes the next owner exactly after them.
        assert_eq!(
            by.map_or(0, Vec::len),
            1,
            "seed {seed}: {} of {} ({}) accepted more than once, by {:?}",
            record.seq.as_str(),
            record.key,
            record.shard,
            by
        );
    }
    let mut last_written: BTreeMap<&str, &str> = BTreeMap::new();
    for record in &written {
        let last = last_written.entry(record.key.as_str()).or_default();
        if record.seq.as_str() > *last {
            *last = record.seq.as_str();
        }
    }
    let mut last_accepted: BTreeMap<&str, &str> = BTreeMap::new();
    for a in log {
        last_accepted.insert(&a.key, &a.seq);
    }
    assert_eq!(
        last_accepted, last_written,
        "seed {seed}: the last change of every key wins"
    );
    let parents: HashMap<ShardId, ShardId> = fake
        .shards()
        .into_iter()
        .filter_map(|s| s.parent.map(|p| (s.id, p)))
        .collect();
    let ancestors = |shard: &str| {
        let mut out = BTreeSet::new();
        let mut at = ShardId::new(shard);
        while let Some(parent) = parents.get(&at) {
            out.insert(parent.as_str().to_string());
            at = parent.clone();
        }
        out
    };
    // Per key, the shards of its records accepted so far: none may be a descendant of a later one.
    let mut by_key: HashMap<&str, Vec<&Accepted>> = HashMap::new();
    for a in log {
        by_key.entry(&a.key).or_default().push(a);
    }
    for (key, records) in by_key {
        for (i, later) in records.iter().enumerate() {
            for earlier in &records[..i] {
                assert!(
                    !ancestors(&earlier.shard).contains(&later.shard),
                    "seed {seed}: key {key}: {} of parent {} (by {}) accepted after {} of its \
                     descendant {} (by {})",
                    later.seq,
                    later.shard,
                    later.worker,
                    earlier.seq,
                    earlier.shard,
                    earlier.worker
                );
            }
        }
    }
}

async fn simulate(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let window_ms = rng.random_range(5_000..=40_000);
    let reshards = rng.random_range(0..=4);
    let fake = stream(seed, &mut rng, window_ms, reshards);
    let leases = MemoryLeaseTable::seeded(seed);
    leases.set_faults(ddbpipe_source::lease::memory::Faults {
        fail_rate: rng.random_range(0.0..0.05),
        lost_reply_rate: rng.random_range(0.0..0.05),
        delay: Duration::from_millis(rng.random_range(0..20)),
    });
    let run = settings(&mut rng);
    let fences: Fences = Arc::default();
    let log: Log = Arc::default();
    let workers = rng.random_range(2..=5usize);
    let mut steady = Vec::new();
    let mut crashes = Vec::new();
    for w in 0..workers {
        let id = format!("w{w}");
        let interval = Duration::from_millis(rng.random_range(0..=2_000));
        let fate = if w == 0 { 0 } else { rng.random_range(0..4) };
        let sink = FencingLog {
            worker: id.clone(),
            fences: Arc::clone(&fences),
            log: Arc::clone(&log),
            delay: Duration::from_millis(rng.random_range(20..400)),
            stall_at: (fate == 2).then(|| rng.random_range(1..10)),
            writes: 0,
        };
        let (handle, stop) = Cancel::new();
        let task = spawn(worker(&fake, &leases, &id, &run, interval), sink, stop);
        let at = Duration::from_millis(rng.random_range(500..=window_ms + 5_000));
        let again = FencingLog {
            worker: format!("{id}-again"),
            fences: Arc::clone(&fences),
            log: Arc::clone(&log),
            delay: Duration::from_millis(rng.random_range(20..400)),
            stall_at: None,
            writes: 0,
        };
        let next = worker(&fake, &leases, &format!("{id}-again"), &run, interval);
        match fate {
            1 => crashes.push(tokio::spawn(async move {
                // The process dies; another starts.
                tokio::time::sleep(at).await;
                task.abort();
                let _ = task.await;
                let (_, stop) = Cancel::new();
                spawn(next, again, stop).await.unwrap().0
            })),
            3 => steady.push(tokio::spawn(async move {
                tokio::time::sleep(at).await;
                handle.cancel();
                let (outcome, _) = task.await.unwrap();
                assert_eq!(outcome.unwrap().end, EndReason::Stopped);
                let (_, stop) = Cancel::new();
                spawn(next, again, stop).await.unwrap().0
            })),
            _ => steady.push(tokio::spawn(async move {
                drop(handle);
                task.await.unwrap().0
            })),
        }
    }
    for task in steady.into_iter().chain(crashes) {
        let outcome = tokio::time::timeout(Duration::from_secs(3600), task)
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: a worker ran for an hour"))
            .unwrap()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(outcome.end, EndReason::Idle, "seed {seed}: {outcome:?}");
    }
    check(seed, &fake, &log.lock().unwrap());
    leases.set_faults(ddbpipe_source::lease::memory::Faults::default());
    let rows = leases.rows(&PipelineName::new("p").unwrap());
    for shard in fake.shards() {
        let row = rows
            .iter()
            .find(|r| r.unit == UnitId::Shard(shard.id.clone()))
            .unwrap_or_else(|| panic!("seed {seed}: no row for {}", shard.id));
        if shard.closed {
            assert_eq!(row.state, LeaseState::ShardEnd, "seed {seed}: {row:?}");
            assert_eq!(row.owner, None, "seed {seed}: {row:?}");
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("LEASED_SEED") {
        return vec![seed.trim().parse().expect("LEASED_SEED is a number")];
    }
    let n = std::env::var("LEASED_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SEEDS);
    (0..n).collect()
}

#[test]
fn seeded_workers_with_splits_crashes_and_pauses_keep_every_change_and_parents_first() {
    if std::env::var_os("LEASED_TRACE").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(std::env::var("LEASED_TRACE").unwrap_or_default())
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .try_init();
    }
    for seed in seeds() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(simulate(seed));
    }
}

#[tokio::test(start_paused = true)]
async fn three_workers_each_write_their_own_output_and_together_hold_every_change() {
    let mut rng = StdRng::seed_from_u64(99);
    let fake = stream(99, &mut rng, 20_000, 3);
    let leases = MemoryLeaseTable::seeded(99);
    let run = fake_stream_run();
    let mut tasks = Vec::new();
    let mut logs = Vec::new();
    for id in ["a", "b", "c"] {
        let log: Log = Arc::default();
        logs.push(Arc::clone(&log));
        let (_, stop) = Cancel::new();
        let sink = Own {
            worker: id.into(),
            log,
        };
        tasks.push(spawn(
            worker(&fake, &leases, id, &run, Duration::ZERO),
            sink,
            stop,
        ));
    }
    let mut finished = 0;
    for task in tasks {
        let outcome = task.await.unwrap().0.unwrap();
        assert_eq!(outcome.end, EndReason::Idle);
        assert_eq!(outcome.shards, fake.shards().len() as u64);
        finished += outcome.leases.finished;
    }
    let closed = fake.shards().iter().filter(|s| s.closed).count() as u64;
    assert_eq!(finished, closed, "each closed shard was finished once");
    let seqs: BTreeSet<String> = logs
        .iter()
        .flat_map(|log| log.lock().unwrap().clone())
        .map(|a| a.seq)
        .collect();
    let written: BTreeSet<String> = fake
        .written()
        .iter()
        .map(|w| w.seq.as_str().to_string())
        .collect();
    assert_eq!(seqs, written, "the union of the outputs is the stream");
    let busy = logs
        .iter()
        .filter(|log| !log.lock().unwrap().is_empty())
        .count();
    assert!(busy >= 2, "the shards were shared");
}

#[tokio::test(start_paused = true)]
async fn a_first_latest_run_reads_only_what_was_written_after_it_started() {
    let fake = Arc::new(
        // The fake's wall clock starts 300 s before the real one: the old write is from well
        // before the run (older than the floor's 120 s margin), the new one from after it began.
        FakeStreams::new(5)
            .with_faults(Faults::none())
            .with_wall_origin_ms(ddbpipe_source::clock::unix_now_ms() - 300_000)
            .at(
                Duration::ZERO,
                Change::Root {
                    shard: "shardId-00001-a".into(),
                    range: None,
                },
            )
            .at(
                Duration::ZERO,
                Change::Write {
                    key: "old".into(),
                    remove: false,
                },
            )
            .at(
                Duration::from_secs(310),
                Change::Write {
                    key: "new".into(),
                    remove: false,
                },
            ),
    );
    let leases = MemoryLeaseTable::seeded(5);
    let mut run = fake_stream_run();
    run.start_position = StartPosition::Latest;
    run.bounds.idle_termination = Some(Duration::from_secs(400));
    let log: Log = Arc::default();
    let (_, stop) = Cancel::new();
    let sink = Own {
        worker: "a".into(),
        log: Arc::clone(&log),
    };
    let outcome = spawn(
        worker(&fake, &leases, "a", &run, Duration::ZERO),
        sink,
        stop,
    )
    .await
    .unwrap()
    .0
    .unwrap();
    assert_eq!(outcome.end, EndReason::Idle);
    let keys: Vec<String> = log.lock().unwrap().iter().map(|a| a.key.clone()).collect();
    assert_eq!(keys, ["new"]);
}

/// One worker writing to its own output, with its log.
fn own(id: &str) -> (Own, Log) {
    let log: Log = Arc::default();
    let sink = Own {
        worker: id.into(),
        log: Arc::clone(&log),
    };
    (sink, log)
}

/// A fault-free stream whose one root shard is there from the start.
fn rooted(seed: u64, root: &str) -> FakeStreams {
    FakeStreams::new(seed).with_faults(Faults::none()).at(
        Duration::ZERO,
        Change::Root {
            shard: root.into(),
            range: None,
        },
    )
}

/// Runs worker `id` alone to its end into its own output: its outcome and what it wrote.
async fn run_alone(
    fake: &Arc<FakeStreams>,
    leases: &MemoryLeaseTable,
    id: &str,
    run: &StreamRun,
) -> (Result<LeasedStreamOutcome, RunError>, Log) {
    let (sink, log) = own(id);
    let (_, stop) = Cancel::new();
    let (outcome, _) = spawn(worker(fake, leases, id, run, Duration::ZERO), sink, stop)
        .await
        .unwrap();
    (outcome, log)
}

/// The checkpoint `shard`'s row was created with.
fn created(leases: &MemoryLeaseTable, shard: &str) -> Option<LeaseCheckpoint> {
    leases
        .log()
        .into_iter()
        .find(|w| w.unit == unit(shard) && w.kind == WriteKind::Create)
        .and_then(|w| w.after?.checkpoint)
}

fn unit(shard: &str) -> UnitId {
    UnitId::Shard(ShardId::new(shard))
}

/// The text of a gap a worker stopped on.
fn gap(outcome: Result<LeasedStreamOutcome, RunError>) -> String {
    match outcome {
        Err(RunError::Stream(StreamError::Gap(text))) => text,
        other => panic!("expected a gap, got {other:?}"),
    }
}

/// Layer 2 of the start-up gap checks at the leader's listing (docs/coordination.md §11.11):
/// the root closes at 1 s into `parent`, which takes a write and closes into `child`; the
/// stream drops `parent` before either is listed, so `child` is listed alone at 100 s, its
/// parent neither listed nor with a row. The leader stops naming both before it writes a row
/// (without the rule, `child` was read from its trim horizon and `parent`'s write was lost).
#[tokio::test(start_paused = true)]
async fn a_child_listed_after_its_parent_expired_unread_stops_the_worker_naming_both() {
    let fake = Arc::new(
        rooted(11, "root")
            .at(
                Duration::from_secs(1),
                Change::Reshard {
                    parent: "root".into(),
                    children: vec!["parent".into()],
                    listed_after: Duration::from_secs(99),
                },
            )
            .at(
                Duration::from_secs(2),
                Change::WriteTo {
                    shard: "parent".into(),
                    key: "lost".into(),
                },
            )
            .at(
                Duration::from_secs(3),
                Change::Reshard {
                    parent: "parent".into(),
                    children: vec!["child".into()],
                    listed_after: Duration::ZERO,
                },
            )
            .at(
                Duration::from_secs(50),
                Change::Expire {
                    shard: "parent".into(),
                },
            ),
    );
    let leases = MemoryLeaseTable::seeded(11);
    let mut run = fake_stream_run();
    // Long enough to be running when `child` is listed.
    run.bounds.idle_termination = Some(Duration::from_secs(300));
    let (outcome, log) = run_alone(&fake, &leases, "a", &run).await;
    let text = gap(outcome);
    assert!(
        text.contains("shard child's parent parent expired unread")
            && text.contains("ddbpipe state reset"),
        "{text}"
    );
    let pipeline = PipelineName::new("p").unwrap();
    assert!(
        leases.row(&pipeline, &unit("child")).is_none(),
        "no row written for it"
    );
    assert!(
        log.lock().unwrap().is_empty(),
        "nothing of the lineage written"
    );
}

/// Layer 3 of the start-up gap checks for a lease row (docs/coordination.md §11.11): a shard
/// with nothing read keeps when it was verified; a worker about to read it more than 23 h
/// later stops, naming it, before reading anything, and the row stays as it was, so the next
/// taker stops too. The stamp is stored in the past (no waiting 23 h).
#[tokio::test(start_paused = true)]
async fn a_row_left_unread_past_the_staleness_limit_stops_every_taker() {
    let fake = Arc::new(rooted(12, "quiet").at(
        Duration::from_secs(600),
        Change::Write {
            key: "later".into(),
            remove: false,
        },
    ));
    let leases = MemoryLeaseTable::seeded(12);
    let pipeline = PipelineName::new("p").unwrap();
    let mut run = fake_stream_run();
    run.bounds.idle_termination = None;
    run.bounds.follow = true;
    // A first worker creates the row and reads the shard empty, then stops.
    let before_ms = ddbpipe_source::clock::unix_now_ms();
    let (sink, _) = own("a");
    let (handle, stop) = Cancel::new();
    let first = spawn(
        worker(&fake, &leases, "a", &run, Duration::ZERO),
        sink,
        stop,
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    handle.cancel();
    assert_eq!(first.await.unwrap().0.unwrap().end, EndReason::Stopped);
    let stamp = created(&leases, "quiet");
    let after_ms = ddbpipe_source::clock::unix_now_ms();
    match stamp {
        Some(LeaseCheckpoint::Verified {
            at_ms,
            floor_ms: None,
        }) => assert!(
            (before_ms..=after_ms).contains(&at_ms),
            "the first listing stamps the run's start: {at_ms} not in {before_ms}..={after_ms}"
        ),
        other => panic!("the row is created verified: {other:?}"),
    }
    // Its reader found it empty twice: the verification was refreshed by a checkpoint.
    let refreshed = leases.log().into_iter().any(|w| {
        w.unit == unit("quiet")
            && w.kind == WriteKind::Checkpoint
            && matches!(
                w.after.and_then(|row| row.checkpoint),
                Some(LeaseCheckpoint::Verified { .. })
            )
    });
    assert!(refreshed, "{:#?}", leases.log());
    // As if nobody read it for 24 h.
    let day_ago = LeaseCheckpoint::verified(before_ms - 24 * 3_600_000, None);
    leases.edit(&pipeline, &unit("quiet"), |row| {
        row.checkpoint = Some(day_ago.clone());
        row.state = LeaseState::Pending;
    });
    tokio::time::sleep(Duration::from_secs(700)).await;
    // Idle ends a worker that reads on (what it would do without the rule).
    run.bounds.idle_termination = Some(Duration::from_secs(60));
    run.bounds.follow = false;
    for id in ["b", "c"] {
        let (outcome, log) = run_alone(&fake, &leases, id, &run).await;
        let text = gap(outcome);
        assert!(
            text.contains("shard quiet was last read 24h ago with nothing to read")
                && text.contains("ddbpipe state reset"),
            "{id}: {text}"
        );
        assert!(log.lock().unwrap().is_empty(), "{id} read nothing");
        let row = leases.row(&pipeline, &unit("quiet")).unwrap();
        assert_eq!(
            row.checkpoint,
            Some(day_ago.clone()),
            "{id} left the row as it was"
        );
        assert_eq!(row.owner, None, "{id} handed it back");
    }
}

/// A shard a later listing finds is verified at the start of the listing before, less the
/// margin (it did not exist then), not at the listing that found it: a child read late must
/// not look fresher than it is.
#[tokio::test(start_paused = true)]
async fn a_child_listed_later_is_verified_no_later_than_the_listing_before_it() {
    let fake = Arc::new(rooted(13, "root").at(
        Duration::from_secs(25),
        Change::Reshard {
            parent: "root".into(),
            children: vec!["child".into()],
            listed_after: Duration::ZERO,
        },
    ));
    let leases = MemoryLeaseTable::seeded(13);
    let before_ms = ddbpipe_source::clock::unix_now_ms();
    let (outcome, _) = run_alone(&fake, &leases, "a", &fake_stream_run()).await;
    assert_eq!(outcome.unwrap().end, EndReason::Idle);
    let after_ms = ddbpipe_source::clock::unix_now_ms();
    let stamp = created(&leases, "child");
    let Some(LeaseCheckpoint::Verified { at_ms, .. }) = stamp else {
        panic!("the child's row is created verified: {stamp:?}");
    };
    assert!(
        at_ms >= before_ms - 120_000 && at_ms <= after_ms - 120_000,
        "{at_ms}: not the listing before less 120 s ({before_ms}..={after_ms})"
    );
}
