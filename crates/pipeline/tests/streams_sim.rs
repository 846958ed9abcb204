//! Deterministic simulation of the streams engine: the real `run_streams` on the in-memory
//! stream, under paused time, with a writer, reshards, faults, crashes and trims decided by a
//! seed, checked against the stream's write log.
//!
//! # One seed
//! 1. A script: root shards, writes over time, splits and rotations whose children are
//!    listed late, fault rates; run settings (concurrency, discovery interval, idle end,
//!    `max_messages`, batch size, flush interval, sink latency). Some seeds add many lanes of
//!    closed shards in two generations whose children are listed late, read with one or two
//!    slots and a short idle end (issue 9 item 13).
//! 2. Runs from one state file until a run ends idle with the writer stopped and every
//!    record delivered. A run may crash: its future is dropped at a seeded instant (and its
//!    engine told to stop, as a dead process would), keeping only what was committed.
//! 3. Trim seeds trim a shard past its committed position, between runs or during one.
//!
//! # Invariants (checked on every seed, across all its runs)
//! - Every record written is delivered at least once, or, when it was trimmed before it was
//!   read, a gap is reported (and names a trimmed shard). No gap is reported otherwise.
//! - Per run and shard, the records delivered are the shard's records right after the
//!   position committed at the run's start, in order, without holes or repeats: so after a
//!   crash nothing between the committed position and the first undelivered record is lost.
//! - Per key, versions arrive in non-decreasing order within a run.
//! - No record of a child shard is delivered before the last record of its parent.
//! - Committed positions never move backwards, a finished shard stays finished, and a
//!   committed position (and every mark a batch carries) covers only delivered records.
//! - A clean end commits exactly what was delivered; `max_messages` delivers exactly N.
//! - A run ends (idle termination) within 30 minutes of fake time, and fails only with a gap.
//! - Idle means nothing is left to read: a run that starts on a quiescent stream (every change
//!   applied, every shard listed, every record visible; no empty-answer faults, no trims) and
//!   ends idle has delivered every record.
//!
//! # Replay
//! `SIM_SEED=123 cargo test -p ddbpipe-pipeline --test streams_sim` runs one seed;
//! `SIM_SEEDS=2000` runs more; `SIM_TRACE=1` prints each run and the engine's log. The script and the fake's fault decisions follow the seed;
//! the engine's backoff jitter is not seeded, so a replay of a seed with throttles may
//! interleave slightly differently.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::runner::{NoProgress, RunError, StreamOutcome};
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{StreamRun, StreamRunError, run_streams};
use ddbpipe_source::config::{OnGap, StartPosition};
use ddbpipe_source::fake_streams::{
    Change, ChildFilter, FAKE_STREAM_ARN, FakeStreams, Faults, ShardInfo, Written,
};
use ddbpipe_source::ids::ShardId;
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::Position;
use ddbpipe_source::position::{ShardProgress, StreamKind, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use ddbpipe_source::streams::engine::{EndReason, RunBounds};
use ddbpipe_source::streams::handover::StreamMark;
use ddbpipe_source::streams::shard_reader::StreamError;
use ddbpipe_testkit::MemorySink;
use ddbpipe_value::ValueFormat;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

const SEEDS: u64 = 500;
const MAX_RUNS: usize = 300;
const MAX_CRASHES: usize = 6;
const RUN_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// One delivered record, as the sink saw it.
#[derive(Debug, Clone)]
struct Delivered {
    shard: String,
    seq: String,
    key: String,
}

/// The simulation's sink: the shared in-memory sink, keeping who delivered what.
type SimSink = MemorySink<Delivered>;

/// The committed position read before each write: (records delivered when read, position).
type States = Arc<Mutex<Vec<(usize, Option<StreamsPosition>)>>>;

fn delivered(line: &[u8]) -> Delivered {
    let json: serde_json::Value = serde_json::from_slice(line).unwrap();
    Delivered {
        shard: json["shard_id"].as_str().unwrap().to_string(),
        seq: json["sequence_number"].as_str().unwrap().to_string(),
        key: json["key"]["pk"].as_str().unwrap().to_string(),
    }
}

fn load(file: &StateFile) -> Option<StreamsPosition> {
    match file.load("p").unwrap().and_then(|e| e.position) {
        Some(Position::Streams(position)) => Some(position),
        Some(other) => panic!("not a streams position: {other:?}"),
        None => None,
    }
}

/// The stream script and the run settings of one seed.
struct Plan {
    fake: Arc<FakeStreams>,
    settings: StreamRun,
    /// `GetRecords` may answer empty with records pending: an idle end may leave some unread.
    empty_answers: bool,
    flush_interval: Duration,
    sink_latency: Duration,
    crash_rate: f64,
    trims: bool,
}

fn plan(seed: u64) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed);
    let first_seq = if rng.random_bool(0.5) {
        100_000_000_000_000_000_000
    } else {
        // Crosses from 21 to 22 digits within the first records.
        1_000_000_000_000_000_000_000 - rng.random_range(1..40)
    };
    let faults = faults(&mut rng);
    let empty_answers = faults.empty > 0.0;
    let fake = FakeStreams::new(seed)
        .with_first_sequence(first_seq)
        .with_faults(faults);
    let many_lanes = rng.random_bool(0.05);
    let fake = script(fake, many_lanes, &mut rng);
    let poll_interval = Duration::from_millis(rng.random_range(200..=1000));
    let settings = StreamRun {
        table: "t".into(),
        stream_arn: FAKE_STREAM_ARN.into(),
        format: ValueFormat::Plain,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            ..RetryPolicy::default()
        },
        records_per_request: rng.random_range(1..=25),
        poll_interval,
        // Idle shards back off up to 1–16 poll intervals (docs/streams.md §4.9).
        max_idle_poll: poll_interval * rng.random_range(1..=16),
        bounds: RunBounds {
            shard_concurrency: rng.random_range(1..=if many_lanes { 2 } else { 4 }),
            discovery_interval: Duration::from_secs(rng.random_range(10..=60)),
            // Many lanes: a full listing (several pages at 5 calls a second) outlasts the idle
            // time, as 20 pages outlast 3 s on an endpoint with thousands of shards.
            idle_termination: Some(Duration::from_secs(if many_lanes {
                rng.random_range(1..=2)
            } else {
                rng.random_range(3..=20)
            })),
            follow: false,
        },
        start_position: StartPosition::TrimHorizon,
        on_gap: OnGap::Fail,
        max_messages: rng.random_bool(0.3).then(|| rng.random_range(5..=40)),
        // Batches cut by count or by bytes (a record is a few hundred bytes).
        batch: BatchLimits {
            records: rng.random_range(1..=20),
            bytes: rng.random_range(100..=8000),
            whole_pages: false,
        },
        kind: StreamKind::Streams,
        slots: Default::default(),
    };
    let flush_interval = if rng.random_bool(0.7) {
        Duration::ZERO
    } else {
        // Written only at the start and the end: a crash replays the whole run.
        Duration::from_secs(3600)
    };
    let sink_latency = if rng.random_bool(0.5) {
        Duration::ZERO
    } else {
        Duration::from_millis(rng.random_range(1..=300))
    };
    Plan {
        fake: Arc::new(fake),
        settings,
        empty_answers,
        flush_interval,
        sink_latency,
        crash_rate: [0.0, 0.2, 0.5][rng.random_range(0..3)],
        trims: rng.random_bool(0.15),
    }
}

/// A well-behaved stream for 30 % of the seeds; seeded fault rates for the others.
fn faults(rng: &mut StdRng) -> Faults {
    if rng.random_bool(0.3) {
        return Faults::none();
    }
    Faults {
        throttle: rng.random_range(0.0..0.08),
        transient: rng.random_range(0.0..0.04),
        empty: rng.random_range(0.0..0.2),
        expire: rng.random_range(0.0..0.05),
        iterator_ttl: Duration::from_secs(rng.random_range(3..=300)),
        latency: Duration::from_millis(rng.random_range(0..=30)),
        late: rng.random_range(0.0..0.3),
        visibility_delay: Duration::from_millis(rng.random_range(0..=3000)),
        last_page_ends: rng.random_range(0.0..=1.0),
        child_filter: [
            ChildFilter::Honoured,
            ChildFilter::Rejected,
            ChildFilter::Ignored,
        ][rng.random_range(0..3)],
    }
}

/// Root shards (sometimes behind more than a page of old closed ones, or with `many_lanes`
/// behind lanes of closed shards in two generations), then writes of a few keys over a window
/// of up to a minute, with up to four splits or rotations among them.
fn script(mut fake: FakeStreams, many_lanes: bool, rng: &mut StdRng) -> FakeStreams {
    let mut ids = 0u32;
    let mut new_id = |rng: &mut StdRng| {
        ids += 1;
        format!("shardId-{ids:05}-{:08x}", rng.random::<u32>())
    };
    let now = |change| (0u64, change);
    let mut changes: Vec<(u64, Change)> = Vec::new();
    if many_lanes {
        // Pages of closed shards: each parent's child is listed late and has no child itself,
        // so many drained shards wait for children lookups at once.
        for _ in 0..rng.random_range(200..=300) {
            let (parent, child) = (new_id(rng), new_id(rng));
            changes.push(now(Change::Root {
                shard: parent.clone(),
                range: Some((0, 0)),
            }));
            for _ in 0..rng.random_range(1..=2) {
                let key = format!("lane-{parent}");
                changes.push(now(Change::WriteTo {
                    shard: parent.clone(),
                    key,
                }));
            }
            changes.push(now(Change::Reshard {
                parent: parent.clone(),
                children: vec![child.clone()],
                listed_after: Duration::from_millis(rng.random_range(0..=3_000)),
            }));
            let key = format!("lane-{parent}");
            changes.push(now(Change::WriteTo {
                shard: child.clone(),
                key,
            }));
            changes.push(now(Change::Close { shard: child }));
        }
    } else if rng.random_bool(0.06) {
        // Enough old closed shards to page DescribeStream, each with its own key.
        for _ in 0..rng.random_range(100..=130) {
            let shard = new_id(rng);
            let range = Some((0, 0));
            changes.push(now(Change::Root {
                shard: shard.clone(),
                range,
            }));
            if rng.random_bool(0.5) {
                let key = format!("old-{shard}");
                changes.push(now(Change::WriteTo {
                    shard: shard.clone(),
                    key,
                }));
            }
            changes.push(now(Change::Close { shard }));
        }
    }
    let roots = rng.random_range(1..=3u32);
    let mut open: Vec<String> = Vec::new();
    for r in 0..roots {
        let shard = new_id(rng);
        let range = Some((r * 65536 / roots, (r + 1) * 65536 / roots));
        changes.push(now(Change::Root {
            shard: shard.clone(),
            range,
        }));
        open.push(shard);
    }
    let window_ms = rng.random_range(5_000..=60_000u64);
    let keys = rng.random_range(3..=12);
    let mut later: Vec<(u64, Change)> = Vec::new();
    for _ in 0..rng.random_range(10..=80) {
        let key = format!("k{}", rng.random_range(0..keys));
        let remove = rng.random_bool(0.1);
        later.push((
            rng.random_range(0..=window_ms),
            Change::Write { key, remove },
        ));
    }
    let mut reshard_times: Vec<u64> = (0..rng.random_range(0..=4))
        .map(|_| rng.random_range(0..=window_ms))
        .collect();
    reshard_times.sort();
    for at in reshard_times {
        let parent = open.remove(rng.random_range(0..open.len()));
        let count = if rng.random_bool(0.6) { 2 } else { 1 };
        let children: Vec<String> = (0..count).map(|_| new_id(rng)).collect();
        open.extend(children.iter().cloned());
        let listed_after = Duration::from_millis(rng.random_range(0..=8_000));
        later.push((
            at,
            Change::Reshard {
                parent,
                children,
                listed_after,
            },
        ));
    }
    later.sort_by_key(|(at, _)| *at);
    for (at, change) in changes.into_iter().chain(later) {
        fake = fake.at(Duration::from_millis(at), change);
    }
    fake
}

/// A shard trimmed by the harness, and the committed sequence it was trimmed past.
#[derive(Debug, Clone)]
struct Trimmed {
    shard: String,
    committed: String,
}

/// Trims a shard that has a committed sequence past it (so the engine can tell), if any.
fn trim_past_commit(fake: &FakeStreams, file: &StateFile, rng: &mut StdRng) -> Option<Trimmed> {
    let state = load(file)?;
    let shards = fake.shards();
    let candidates: Vec<(String, String, usize, usize)> = state
        .open_shards()
        .filter_map(|(id, progress)| {
            let ShardProgress::After(seq) = progress else {
                return None;
            };
            let shard = shards.iter().find(|s| &s.id == id)?;
            let at = shard.records.iter().position(|r| &r.seq == seq)?;
            (at + 1 < shard.records.len())
                .then(|| (id.to_string(), seq.to_string(), at, shard.records.len()))
        })
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let (shard, committed, at, len) = candidates[rng.random_range(0..candidates.len())].clone();
    let through = rng.random_range(at + 1..len);
    fake.apply(Change::Trim {
        shard: shard.clone(),
        through,
    });
    Some(Trimmed { shard, committed })
}

/// How one run went.
struct RunLog {
    start: Option<StreamsPosition>,
    first: usize,
    end: usize,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    Crashed,
    Ended { end: EndReason, written: u64 },
    Gap(String),
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    runs: usize,
    crashes: usize,
    records: usize,
    delivered: usize,
    gaps: usize,
}

fn run_seed(seed: u64, dir: &Path) -> Result<Stats, String> {
    if std::env::var_os("SIM_TRACE").is_some() {
        // The engine's own log lines, for replaying one seed.
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(simulate(seed, dir))
}

async fn simulate(seed: u64, dir: &Path) -> Result<Stats, String> {
    let plan = plan(seed);
    let fake = &plan.fake;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_5eed);
    let file = StateFile::new(dir.join("state.json"));
    let states = States::default();
    let mut sink = SimSink::decoding(delivered)
        .with_jitter(seed ^ 0x51f, plan.sink_latency)
        .before_write({
            let (file, states) = (file.clone(), Arc::clone(&states));
            move |lines| states.lock().unwrap().push((lines, load(&file)))
        });
    let mut trims: Vec<Trimmed> = Vec::new();
    let mut stats = Stats::default();
    let mut quiet_runs = 0;
    let mut checker = Checker {
        states,
        ..Checker::default()
    };
    for run in 0..MAX_RUNS {
        // A trim past a committed position between runs must stop the next start-up.
        let mut expected_gap = None;
        if plan.trims && trims.is_empty() && run > 0 && rng.random_bool(0.4) {
            expected_gap = trim_past_commit(fake, &file, &mut rng);
            trims.extend(expected_gap.clone());
        }
        let crash = expected_gap.is_none()
            && stats.crashes < MAX_CRASHES
            && rng.random_bool(plan.crash_rate);
        let crash_at = crash.then(|| after_ms(&mut rng, 25_000));
        let trim_at = (plan.trims && trims.is_empty()).then(|| after_ms(&mut rng, 20_000));
        let start = load(&file);
        let first = sink.lines.len();
        let quiet_start = fake.quiescent() && !plan.trims && !plan.empty_answers;
        let result = one_run(
            &plan, &mut sink, &file, crash_at, trim_at, &mut trims, &mut rng,
        )
        .await
        .map_err(|e| format!("run {run} {e}"))?;
        stats.runs += 1;
        let outcome = match result {
            None => {
                stats.crashes += 1;
                Outcome::Crashed
            }
            Some(Ok(outcome)) => Outcome::Ended {
                end: outcome.end,
                written: outcome.written,
            },
            Some(Err(StreamRunError::Gap(message) | StreamRunError::CannotResume(message))) => {
                Outcome::Gap(message)
            }
            Some(Err(StreamRunError::Run(RunError::Stream(StreamError::Gap(message))))) => {
                Outcome::Gap(message)
            }
            Some(Err(error)) => return Err(format!("run {run} failed: {error}")),
        };
        if let Some(expected) = &expected_gap {
            let wanted = format!(
                "shard {} was trimmed past sequence {}",
                expected.shard, expected.committed
            );
            if !matches!(&outcome, Outcome::Gap(message) if message.contains(&wanted)) {
                return Err(format!(
                    "{} was trimmed past its committed position between runs, but run {run} \
                     ended {outcome:?} instead of reporting \"{wanted}\"",
                    expected.shard
                ));
            }
        }
        let log = RunLog {
            start,
            first,
            end: sink.lines.len(),
            outcome,
        };
        let written = fake.written();
        let shards = fake.shards();
        if std::env::var_os("SIM_TRACE").is_some() {
            trace(&log, &sink, &shards);
        }
        let end_state = load(&file);
        let max_messages = plan.settings.max_messages;
        checker.check_run(
            &log,
            &sink,
            &written,
            &shards,
            end_state.as_ref(),
            max_messages,
        )?;
        if quiet_start
            && matches!(
                log.outcome,
                Outcome::Ended {
                    end: EndReason::Idle,
                    ..
                }
            )
        {
            let missing = checker.undelivered(&written);
            if let Some(w) = missing.first() {
                return Err(format!(
                    "run {run} started on a quiescent stream and ended idle, but {} record(s) were \
                     never delivered; first: {} #{} seq {}",
                    missing.len(),
                    w.shard,
                    w.index,
                    w.seq
                ));
            }
        }
        stats.records = written.len();
        stats.delivered = sink.lines.len();
        match &log.outcome {
            Outcome::Gap(message) => {
                let named = |t: &Trimmed| message.contains(&format!("shard {} ", t.shard));
                if !trims.iter().any(named) {
                    return Err(format!(
                        "a gap was reported although no shard named in it was trimmed: {message}"
                    ));
                }
                // Nothing more can be read without losing changes: the seed ends here.
                stats.gaps += 1;
                return Ok(stats);
            }
            Outcome::Ended {
                end: EndReason::Idle,
                ..
            } if fake.settled() => {
                quiet_runs = if log.end == log.first {
                    quiet_runs + 1
                } else {
                    0
                };
                if checker.undelivered(&written).is_empty() || quiet_runs >= 2 {
                    return complete(&checker, &written, &shards).map(|()| stats);
                }
            }
            _ => {}
        }
    }
    Err(format!(
        "no convergence after {MAX_RUNS} runs ({} delivered)",
        sink.lines.len()
    ))
}

fn after_ms(rng: &mut StdRng, max_ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(rng.random_range(0..=max_ms))
}

/// One run from the state file: `None` when it crashed at `crash_at`. A trim past a committed
/// position is made at `trim_at` while it runs.
async fn one_run(
    plan: &Plan,
    sink: &mut SimSink,
    file: &StateFile,
    crash_at: Option<Instant>,
    mut trim_at: Option<Instant>,
    trims: &mut Vec<Trimmed>,
    rng: &mut StdRng,
) -> Result<Option<Result<StreamOutcome, StreamRunError>>, String> {
    let fake = &plan.fake;
    let mut checkpointer = Checkpointer::open_streams(
        file.clone(),
        "p",
        Identity::from_json(json!({"table_name": "t"})),
        plan.flush_interval,
    )
    .await
    .map_err(|e| format!("cannot open the state: {e}"))?;
    let (stop, cancel) = Cancel::new();
    let run = run_streams(
        Arc::clone(fake),
        &plan.settings,
        sink,
        &mut checkpointer,
        cancel,
        Arc::new(NoObserver),
        &NoProgress,
    );
    tokio::pin!(run);
    // Idle termination must end every run; a run still going after this is stuck.
    let deadline = Instant::now() + RUN_DEADLINE;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut run => break Ok(Some(result)),
            () = sleep_until(crash_at) => break Ok(None),
            () = tokio::time::sleep_until(deadline) => {
                let journal = fake.journal().join("\n    ");
                break Err(format!(
                    "did not end within {RUN_DEADLINE:?} of fake time; last calls:\n    {journal}"
                ));
            }
            () = sleep_until(trim_at) => {
                trim_at = None;
                trims.extend(trim_past_commit(fake, file, rng));
            }
        }
    };
    // A dead process reads nothing more: stop the engine task the dropped run leaves behind.
    stop.cancel();
    result
}

/// The end of a seed without a gap: every record written was delivered.
fn complete(checker: &Checker, written: &[Written], shards: &[ShardInfo]) -> Result<(), String> {
    let missing = checker.undelivered(written);
    let Some(w) = missing.first() else {
        return Ok(());
    };
    let trimmed = shards
        .iter()
        .any(|s| s.id == w.shard && w.index < s.trimmed);
    let why = if trimmed {
        "trimmed, and no gap was reported: silently skipped"
    } else {
        "not trimmed: lost"
    };
    Err(format!(
        "{} record(s) never delivered; first: {} #{} seq {} ({why})",
        missing.len(),
        w.shard,
        w.index,
        w.seq
    ))
}

/// Prints a run: its start position, outcome and deliveries (`SIM_TRACE=1`).
fn trace(run: &RunLog, sink: &SimSink, shards: &[ShardInfo]) {
    eprintln!("--- run at {:?}: {:?}", Instant::now(), run.outcome);
    eprintln!("    start: {:?}", run.start.as_ref().map(|s| &s.shards));
    for shard in shards
        .iter()
        .filter(|s| !s.records.is_empty() || s.parent.is_some())
    {
        eprintln!(
            "    shard {} parent {:?} closed {} listed {} trimmed {} records {}",
            shard.id,
            shard.parent.as_ref().map(|p| p.as_str()),
            shard.closed,
            shard.listed,
            shard.trimmed,
            shard.records.len()
        );
    }
    for line in &sink.lines[run.first..run.end] {
        eprintln!("    delivered {} {} {}", line.shard, line.seq, line.key);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The checks, with what they remember across runs of one seed.
#[derive(Default)]
struct Checker {
    /// Sequence numbers delivered at least once.
    delivered: BTreeSet<String>,
    /// Batches and state snapshots already checked.
    batches_seen: usize,
    states_seen: usize,
    /// The positions the sink saw committed.
    states: States,
    /// The last committed position seen.
    last_state: Option<StreamsPosition>,
}

impl Checker {
    fn undelivered<'a>(&self, written: &'a [Written]) -> Vec<&'a Written> {
        written
            .iter()
            .filter(|w| !self.delivered.contains(w.seq.as_str()))
            .collect()
    }

    fn check_run(
        &mut self,
        run: &RunLog,
        sink: &SimSink,
        written: &[Written],
        shards: &[ShardInfo],
        end_state: Option<&StreamsPosition>,
        max_messages: Option<u64>,
    ) -> Result<(), String> {
        let by_seq: HashMap<&str, &Written> = written.iter().map(|w| (w.seq.as_str(), w)).collect();
        let by_shard: HashMap<&str, &ShardInfo> =
            shards.iter().map(|s| (s.id.as_str(), s)).collect();
        let lines = &sink.lines[run.first..run.end];

        // Each line is a record of the stream, read from its own shard.
        for line in lines {
            let Some(w) = by_seq.get(line.seq.as_str()) else {
                return Err(format!(
                    "delivered {} from {}, which was never written",
                    line.seq, line.shard
                ));
            };
            if w.shard.as_str() != line.shard || w.key != line.key {
                return Err(format!(
                    "delivered {} as {}/{}, written as {}/{}",
                    line.seq, line.shard, line.key, w.shard, w.key
                ));
            }
        }

        // Per shard: exactly the records after the position committed at the run's start.
        let mut per_shard: BTreeMap<&str, Vec<&Written>> = BTreeMap::new();
        for line in lines {
            per_shard
                .entry(line.shard.as_str())
                .or_default()
                .push(by_seq[line.seq.as_str()]);
        }
        for (shard, got) in &per_shard {
            let id = ShardId::new(*shard);
            let info = by_shard[shard];
            let from = match &run.start {
                Some(start) if start.is_finished(&id) => {
                    return Err(format!(
                        "{shard} was finished when the run started, yet {} of its records were delivered",
                        got.len()
                    ));
                }
                Some(start) => match start.progress(&id) {
                    Some(ShardProgress::After(seq)) => info
                        .records
                        .iter()
                        .position(|r| &r.seq == seq)
                        .map_or(0, |i| i + 1),
                    _ => 0,
                },
                None => 0,
            };
            let want = info.records.get(from..from + got.len());
            let same = want.is_some_and(|want| want.iter().zip(got).all(|(a, b)| a.seq == b.seq));
            if !same {
                let got: Vec<usize> = got.iter().map(|w| w.index).collect();
                return Err(format!(
                    "{shard}: the run delivered records #{got:?}, but the committed position at its start was before #{from} \
                     (expected #{from}.. in order, nothing skipped or repeated)"
                ));
            }
        }

        // Per key, versions never go back within a run.
        let mut versions: HashMap<&str, u64> = HashMap::new();
        for line in lines {
            let w = by_seq[line.seq.as_str()];
            let last = versions.entry(w.key.as_str()).or_insert(0);
            if w.version < *last {
                return Err(format!(
                    "key {} went back from version {} to {} within a run",
                    w.key, last, w.version
                ));
            }
            *last = w.version;
        }

        // Parents before children: within the run, and overall.
        let mut so_far: BTreeSet<&str> = self.delivered.iter().map(String::as_str).collect();
        let mut seen_child_of: BTreeSet<&str> = BTreeSet::new();
        for line in lines {
            let w = by_seq[line.seq.as_str()];
            if seen_child_of.contains(line.shard.as_str()) {
                return Err(format!(
                    "{} record #{} delivered after a record of its child",
                    line.shard, w.index
                ));
            }
            if let Some(parent) = &by_shard[line.shard.as_str()].parent {
                seen_child_of.insert(parent.as_str());
                if let Some(p) = by_shard.get(parent.as_str())
                    && let Some(r) = p.records.iter().find(|r| !so_far.contains(r.seq.as_str()))
                {
                    return Err(format!(
                        "child {} delivered record #{} before its parent {} delivered record #{}",
                        line.shard, w.index, parent, r.index
                    ));
                }
            }
            so_far.insert(line.seq.as_str());
        }

        // Marks carried by batches cover only what was delivered by the end of their batch.
        let mut upto: BTreeSet<&str> = self.delivered.iter().map(String::as_str).collect();
        for batch in &sink.batches[self.batches_seen..] {
            for line in &sink.lines[batch.first..batch.first + batch.len] {
                upto.insert(line.seq.as_str());
            }
            for mark in &batch.marks {
                covered(mark, &upto, &by_shard)
                    .map_err(|e| format!("a batch carried {mark:?}: {e}"))?;
            }
        }
        self.batches_seen = sink.batches.len();

        // Committed positions: monotonic, and covering only delivered records.
        let mut states: Vec<(usize, Option<StreamsPosition>)> =
            self.states.lock().unwrap()[self.states_seen..].to_vec();
        self.states_seen += states.len();
        states.push((run.end, end_state.cloned()));
        for (delivered, state) in states {
            let Some(state) = state else { continue };
            let upto: BTreeSet<&str> = self
                .delivered
                .iter()
                .map(String::as_str)
                .chain(
                    sink.lines[run.first..delivered.max(run.first)]
                        .iter()
                        .map(|l| l.seq.as_str()),
                )
                .collect();
            for (id, progress) in state.open_shards() {
                if let ShardProgress::After(seq) = progress {
                    covered(
                        &StreamMark::Advance(id.clone(), seq.clone()),
                        &upto,
                        &by_shard,
                    )
                    .map_err(|e| format!("committed {id} at {seq}: {e}"))?;
                }
            }
            for id in state.finished() {
                covered(&StreamMark::Finish(id.clone(), None), &upto, &by_shard)
                    .map_err(|e| format!("committed {id} finished: {e}"))?;
            }
            if let Some(before) = &self.last_state {
                monotonic(before, &state)?;
            }
            self.last_state = Some(state);
        }

        for line in lines {
            self.delivered.insert(line.seq.clone());
        }

        // A clean end commits exactly what was delivered; max_messages delivers exactly N.
        if let Outcome::Ended { end, written } = &run.outcome {
            if *written as usize != lines.len() {
                return Err(format!(
                    "the run reported {written} written, the sink acknowledged {}",
                    lines.len()
                ));
            }
            if *end == EndReason::MaxMessages && Some(*written) != max_messages {
                return Err(format!(
                    "ended by max_messages {max_messages:?} after {written} records"
                ));
            }
            let state = end_state.ok_or("a clean end left no position")?;
            for (shard, got) in &per_shard {
                let id = ShardId::new(*shard);
                let last = got.last().unwrap();
                let info = by_shard[shard];
                let is_last = info.closed && last.index + 1 == info.records.len();
                let ok = match state.progress(&id) {
                    Some(ShardProgress::After(seq)) => *seq == last.seq,
                    Some(ShardProgress::TrimHorizon { .. }) | None => false,
                    Some(ShardProgress::ShardEnd { .. }) => is_last,
                };
                if !ok {
                    return Err(format!(
                        "after a clean end ({end:?}) {shard} is committed as {:?}, but its last delivered record is #{} ({})",
                        state.shards.get(&id),
                        last.index,
                        last.seq
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether the records a mark covers were all delivered (`upto`).
fn covered(
    mark: &StreamMark,
    upto: &BTreeSet<&str>,
    shards: &HashMap<&str, &ShardInfo>,
) -> Result<(), String> {
    let (id, through) = match mark {
        StreamMark::Advance(id, seq) => {
            let Some(info) = shards.get(id.as_str()) else {
                return Err(format!("{id} is not a shard of the stream"));
            };
            let Some(at) = info.records.iter().position(|r| &r.seq == seq) else {
                return Err(format!("{seq} is not a record of {id}"));
            };
            (id, Some(at))
        }
        StreamMark::Finish(id, _) => (id, None),
        StreamMark::Admit { .. } | StreamMark::Verify(..) | StreamMark::ReadAt(..) => return Ok(()),
    };
    let Some(info) = shards.get(id.as_str()) else {
        return Err(format!("{id} is not a shard of the stream"));
    };
    if through.is_none() && !info.closed {
        return Err(format!("{id} is still open"));
    }
    let through = through.unwrap_or(info.records.len().saturating_sub(1));
    match info
        .records
        .iter()
        .take(through + 1)
        .find(|r| !upto.contains(r.seq.as_str()))
    {
        Some(r) => Err(format!(
            "record #{} ({}) of {id} was not delivered",
            r.index, r.seq
        )),
        None => Ok(()),
    }
}

/// Committed positions never move backwards; finished shards stay finished.
fn monotonic(before: &StreamsPosition, after: &StreamsPosition) -> Result<(), String> {
    for id in before.finished() {
        if !after.is_finished(id) {
            return Err(format!(
                "{id} was committed finished, then {:?}",
                after.progress(id)
            ));
        }
    }
    for (id, old) in before.open_shards() {
        match (old, after.progress(id)) {
            (_, Some(ShardProgress::ShardEnd { .. })) => {}
            (_, None) => return Err(format!("{id} vanished from the committed position")),
            (ShardProgress::After(a), Some(ShardProgress::After(b))) if b < a => {
                return Err(format!("{id} moved back from {a} to {b}"));
            }
            (ShardProgress::After(a), Some(ShardProgress::TrimHorizon { .. })) => {
                return Err(format!("{id} moved back from {a} to \"\""));
            }
            _ => {}
        }
    }
    Ok(())
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        return vec![seed.trim().parse().expect("SIM_SEED is a number")];
    }
    let n = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SEEDS);
    (0..n).collect()
}

fn scratch() -> PathBuf {
    // tmpfs when there is one: the state file is fsynced after every batch.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

#[test]
fn every_seed_delivers_every_record_in_order_across_crashes_or_reports_the_gap() {
    let seeds = seeds();
    let started = std::time::Instant::now();
    let workers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(u64, Result<Stats, String>)>> =
        std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let dir = tempfile::tempdir_in(scratch()).unwrap();
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_seed(seed, dir.path())
                    }))
                    .unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("panicked: {message}"))
                    });
                    results.lock().unwrap().push((seed, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(seed, _)| *seed);
    let mut total = Stats::default();
    let mut failures = Vec::new();
    for (seed, result) in &results {
        match result {
            Ok(stats) => {
                total.runs += stats.runs;
                total.crashes += stats.crashes;
                total.records += stats.records;
                total.delivered += stats.delivered;
                total.gaps += stats.gaps;
            }
            Err(message) => failures.push(format!(
                "seed {seed}: {message}\n  replay: SIM_SEED={seed} cargo test -p ddbpipe-pipeline --test streams_sim"
            )),
        }
    }
    eprintln!(
        "{} seeds in {:.1} s: {} runs, {} crashes, {} records written, {} delivered, {} gaps reported",
        results.len(),
        started.elapsed().as_secs_f64(),
        total.runs,
        total.crashes,
        total.records,
        total.delivered,
        total.gaps
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
}
