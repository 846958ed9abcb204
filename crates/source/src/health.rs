//! Whether this process's run makes progress, for the metrics listener's `/health`
//! (docs/cli.md §8.6).
//!
//! # Progress
//! 1. A batch acknowledged by the sink ([`committed`]) is progress, and makes the run
//!    *progressing*.
//! 2. A read that answered is progress too, with or without records ([`answered`]): a
//!    `Scan`, `Query`, `GetRecords` or `GetShardIterator` answer, an export's status polled, an
//!    export object read, a lease round that reached the lease table. A stream with no new
//!    records, a snapshot waiting on its export and a worker waiting for a lease are *idle*,
//!    which is healthy.
//! 3. Describing the table or the stream is no progress: those go on in the background while
//!    the sink is stuck.
//!
//! # States
//! - `failed`: the run met a definite error ([`failed`]); the process is on its way out.
//! - `stalled`: nothing progressed for longer than the bound, or one sink write has lasted
//!   longer than it (a locked destination table, a hung database), or the lease table stopped
//!   answering.
//! - `progressing`: a batch was acknowledged within the bound.
//! - `idle`: otherwise (reads answer, nothing to write).
//!
//! `failed` and `stalled` answer 503, the others 200. The marks are process-wide: one run per
//! process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where this process's clock of marks starts.
static ORIGIN: OnceLock<Instant> = OnceLock::new();
/// Milliseconds from [`ORIGIN`] (plus one; 0 = never) of the last acknowledged batch.
static COMMITTED: AtomicU64 = AtomicU64::new(0);
/// Milliseconds from [`ORIGIN`] (plus one; 0 = never) of the last read that answered.
static ANSWERED: AtomicU64 = AtomicU64::new(0);
/// Milliseconds from [`ORIGIN`] (plus one; 0 = none) when the sink write in flight began.
static WRITING: AtomicU64 = AtomicU64::new(0);
/// The definite error the run met, once it met one.
static FAILED: Mutex<Option<String>> = Mutex::new(None);

/// The operations of the retry layer whose answer is progress (module docs, rule 2).
const READS: &[&str] = &[
    "scan",
    "query",
    "get_records",
    "get_shard_iterator",
    "describe_export",
    "export_table",
    "get_object",
];

fn now_mark() -> u64 {
    let origin = *ORIGIN.get_or_init(Instant::now);
    origin.elapsed().as_millis() as u64 + 1
}

/// Starts the clock of marks: the run begins now, and has not progressed yet.
pub fn start() {
    let _ = ORIGIN.get_or_init(Instant::now);
    ANSWERED.fetch_max(now_mark(), Ordering::Relaxed);
}

/// A request of the retry layer answered: progress when `operation` reads data (rule 2).
pub fn request_answered(operation: &str) {
    if READS.contains(&operation) {
        answered();
    }
}

/// A read (or a lease round) answered: the run is alive, maybe idle (rule 2).
pub fn answered() {
    ANSWERED.fetch_max(now_mark(), Ordering::Relaxed);
}

/// A batch was acknowledged by the sink (rule 1).
pub fn committed() {
    let now = now_mark();
    COMMITTED.fetch_max(now, Ordering::Relaxed);
    ANSWERED.fetch_max(now, Ordering::Relaxed);
}

/// The run met a definite error: `/health` answers `failed` from now on.
pub fn failed(error: &dyn std::fmt::Display) {
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_none() {
        *failed = Some(error.to_string());
    }
}

/// A sink write in flight: begun when made, over when dropped.
#[must_use = "the write is over when the guard is dropped"]
pub struct Writing(());

impl Writing {
    /// A sink write begins.
    pub fn begin() -> Writing {
        let _ = WRITING.compare_exchange(0, now_mark(), Ordering::Relaxed, Ordering::Relaxed);
        Writing(())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        WRITING.store(0, Ordering::Relaxed);
    }
}

/// What `/health` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A batch was acknowledged within the bound.
    Progressing,
    /// Reads answer, nothing was written within the bound.
    Idle,
    /// No progress for longer than the bound, or a sink write longer than it.
    Stalled,
    /// The run met a definite error.
    Failed,
}

impl State {
    /// The state's name in the answer.
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Progressing => "progressing",
            State::Idle => "idle",
            State::Stalled => "stalled",
            State::Failed => "failed",
        }
    }

    /// Whether a probe should count the process healthy (HTTP 200; 503 otherwise).
    pub fn healthy(&self) -> bool {
        matches!(self, State::Progressing | State::Idle)
    }
}

/// The health of the run, as `/health` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// The state.
    pub state: State,
    /// Seconds since the last progress (a read that answered or a commit).
    pub last_progress_secs: f64,
    /// Seconds since the last acknowledged batch; `None` before the first.
    pub last_commit_secs: Option<f64>,
    /// Seconds the sink write in flight has lasted; `None` when none is.
    pub writing_secs: Option<f64>,
    /// The definite error, once the run met one.
    pub error: Option<String>,
}

/// The marks, as ages at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ages {
    /// Since the last progress of any kind.
    pub progress: Duration,
    /// Since the last acknowledged batch, once there was one.
    pub commit: Option<Duration>,
    /// How long the sink write in flight has lasted, when one is.
    pub writing: Option<Duration>,
}

/// The state for `ages` with the bound `stall` (module docs, "States"); a plain decision.
pub fn judge(ages: Ages, stall: Duration, failed: bool) -> State {
    if failed {
        State::Failed
    } else if ages.progress > stall || ages.writing.is_some_and(|w| w > stall) {
        State::Stalled
    } else if ages.commit.is_some_and(|c| c <= stall) {
        State::Progressing
    } else {
        State::Idle
    }
}

/// This process's health now, with the bound `stall`.
pub fn now(stall: Duration) -> Health {
    let now = now_mark();
    let age = |mark: u64| (mark > 0).then(|| Duration::from_millis(now.saturating_sub(mark)));
    let ages = Ages {
        progress: age(ANSWERED.load(Ordering::Relaxed)).unwrap_or_default(),
        commit: age(COMMITTED.load(Ordering::Relaxed)),
        writing: age(WRITING.load(Ordering::Relaxed)),
    };
    let error = FAILED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Health {
        state: judge(ages, stall, error.is_some()),
        last_progress_secs: ages.progress.as_secs_f64(),
        last_commit_secs: ages.commit.map(|c| c.as_secs_f64()),
        writing_secs: ages.writing.map(|w| w.as_secs_f64()),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(300);

    fn ages(progress: u64, commit: Option<u64>, writing: Option<u64>) -> Ages {
        Ages {
            progress: Duration::from_secs(progress),
            commit: commit.map(Duration::from_secs),
            writing: writing.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_recent_commit_is_progressing_and_answered_reads_alone_are_idle() {
        assert_eq!(
            judge(ages(1, Some(1), None), STALL, false),
            State::Progressing
        );
        assert_eq!(judge(ages(1, None, None), STALL, false), State::Idle);
        assert_eq!(judge(ages(1, Some(900), None), STALL, false), State::Idle);
    }

    #[test]
    fn no_progress_or_a_write_longer_than_the_bound_is_stalled() {
        assert_eq!(judge(ages(301, None, None), STALL, false), State::Stalled);
        // Reads still answer, but the sink has not finished a write for longer than the bound.
        assert_eq!(
            judge(ages(1, Some(1), Some(301)), STALL, false),
            State::Stalled
        );
        assert_eq!(
            judge(ages(1, Some(1), Some(299)), STALL, false),
            State::Progressing
        );
    }

    #[test]
    fn a_definite_error_is_failed_whatever_the_marks() {
        assert_eq!(judge(ages(0, Some(0), None), STALL, true), State::Failed);
        assert!(!State::Failed.healthy() && !State::Stalled.healthy());
        assert!(State::Idle.healthy() && State::Progressing.healthy());
    }
}
