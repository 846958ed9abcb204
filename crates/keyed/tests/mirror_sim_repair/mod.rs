//! The repair half of the mirror simulation (`mirror_sim.rs`): a gap repaired by incremental
//! export (docs/streams.md §4.12) once the mirror has converged.
//!
//! # Script
//! 1. The stream's clock is started early enough that, when the phase begins at
//!    [`REPAIR_AT`], it meets this machine's (the real clock, which paused time holds still)
//!    give or take the seed's skew: the times ddbpipe reads from its own clock (`read_at` of a
//!    caught-up shard, `verified_at`) are then as close to the stream's as in life. Later they
//!    lag behind it by however long the pipeline was down, which only starts a window
//!    earlier.
//! 2. **Shortly before**: a few keys are created and a few changed over 90 s, and the mirror
//!    streams them (position and `read_at` committed).
//! 3. **Down**, for 3 min to a little over a day: in its first 30 s at least one key created
//!    shortly before is deleted (written to a positioned shard and trimmed by the end: the
//!    gap), keys changed shortly before change again; keys are created and deleted inside the
//!    downtime, others put, updated and deleted throughout; a shard may split or rotate after
//!    the first 40 s; in half the seeds a few writes land in its last 20 s, which the stream
//!    still holds when the pipeline is back. Downtimes under 15 min give a window stretched to
//!    the shortest export; a fifth of them last over 24 h, so the repair reads two windows.
//! 4. **Up again** with `on_gap: repair`: the runs crash at random times (during the export's
//!    wait, the stream after the repair) or once the sink has written a few batches of the
//!    export's changes (among its files, or at the close of a window), each resuming from
//!    what was committed, until a run that started after the last write ends idle.
//!
//! # Checks
//! Beside the per-batch and final checks of every seed: before the first stream record after
//! the repair, the destination is the table at the repair's end, key by key (so the sweep of
//! each window's vanished rows is seen, not only its effect once the stream caught up); no
//! `Scan` page and no full export in the phase; one incremental export per window however the
//! runs crashed (one more after a FAILED one), the windows consecutive and as many as the
//! downtime needs; at the end the stored position holds no repair record and no snapshot,
//! and streams.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ddbpipe_source::export::api::ExportKind;
use ddbpipe_source::fake_export::ExportCalls;
use ddbpipe_source::fake_streams::{Change, FakeStreamTable, FakeStreams, TableWrite};
use ddbpipe_source::position::MAX_WINDOW_MS;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::mirror_sim_export::state;
use super::{Carried, Crash, KEYS, Setup, converge, rows, write};

/// When a repair seed's phase begins (the stream's time since its creation): late enough for
/// the mirror to have converged, with 15 min to spare so that no repair window reaches back
/// to its snapshot rows.
pub const REPAIR_AT: Duration = Duration::from_secs(40 * 60);
/// Keys first created shortly before the downtime.
const BEFORE_KEYS: std::ops::Range<usize> = KEYS..KEYS + 6;
/// Keys created and deleted during the downtime.
const DOWN_KEYS: std::ops::Range<usize> = KEYS + 6..KEYS + 10;

/// Whether seed `seed` has a repair phase: every third, of either snapshot engine.
pub fn repairs(seed: u64) -> bool {
    seed % 3 == 1
}

/// What one seed's repair phase showed beyond its checks.
pub struct Repaired {
    /// Windows the repair read.
    pub windows: usize,
    /// A crash landed among the files of a window's export.
    pub crashed_among_files: bool,
    /// Rows the stream wrote for items created and deleted inside the first window (the
    /// sweep deletes them).
    pub vanished: usize,
    /// Changes of the exports that delete an item.
    pub deletes: usize,
    /// The first incremental export FAILED (a seed that scans, whose first export it is).
    pub failed_export: bool,
    /// The destination was checked against the table at the repair's end before the stream
    /// was read (otherwise nothing was left to read: the final check saw the same).
    pub end_checked: bool,
}

/// The incremental exports' windows in `calls`, oldest first, each with the number of
/// exports started for it (distinct client tokens).
pub fn windows(calls: &ExportCalls) -> Vec<((i64, i64), usize)> {
    let mut tokens: BTreeMap<(i64, i64), Vec<&str>> = BTreeMap::new();
    for request in &calls.start_requests {
        if let ExportKind::Incremental { from_ms, to_ms } = request.kind {
            let window = tokens.entry((from_ms, to_ms)).or_default();
            if !window.contains(&request.client_token.as_str()) {
                window.push(&request.client_token);
            }
        }
    }
    tokens
        .into_iter()
        .map(|(window, tokens)| (window, tokens.len()))
        .collect()
}

/// The open repair's record in the committed state, if there is one.
pub fn repair_record(path: &Path) -> Option<Value> {
    let meta = state(path).remove("meta")?;
    Some(meta["position"]["repair"].clone()).filter(Value::is_object)
}

/// The keys written in `[from_ms, to_ms)` that existed at neither end (no export line for
/// them; the sweep deletes their rows), each with the version of its last write there.
pub fn vanished(history: &[TableWrite], from_ms: i64, to_ms: i64) -> Vec<(String, u64)> {
    let (from, to) = (from_ms * 1000, to_ms * 1000);
    let mut before: BTreeMap<&str, bool> = BTreeMap::new();
    let mut last: BTreeMap<&str, &TableWrite> = BTreeMap::new();
    for write in history.iter().take_while(|w| w.micros < to) {
        if write.micros < from {
            before.insert(&write.key, !write.removed);
        } else {
            last.insert(&write.key, write);
        }
    }
    last.into_iter()
        .filter(|(key, write)| write.removed && !before.get(key).copied().unwrap_or(false))
        .map(|(key, write)| (key.to_string(), write.version))
        .collect()
}

/// A time `from..to` after `now`, to the microsecond.
fn at(rng: &mut StdRng, now: Duration, from: Duration, to: Duration) -> Duration {
    now + Duration::from_micros(rng.random_range(from.as_micros() as u64..to.as_micros() as u64))
}

/// Step 2: schedules the writes of the 90 s from now; returns the keys created and the keys
/// changed.
fn schedule_before(rng: &mut StdRng, stream: &FakeStreams) -> (Vec<usize>, Vec<usize>) {
    let now = stream.elapsed();
    let span = (Duration::ZERO, Duration::from_secs(90));
    let created: Vec<usize> = BEFORE_KEYS.take(rng.random_range(3..=6)).collect();
    let changed: Vec<usize> = (0..rng.random_range(2..=6))
        .map(|_| rng.random_range(0..KEYS))
        .collect();
    for &key in created.iter().chain(&changed) {
        stream.schedule(at(rng, now, span.0, span.1), write(key, false));
    }
    if rng.random_bool(0.5) {
        let key = rng.random_range(0..KEYS);
        stream.schedule(at(rng, now, span.0, span.1), write(key, true));
    }
    (created, changed)
}

/// Step 3: schedules the downtime's writes from now; returns how long it lasts.
fn schedule_downtime(
    rng: &mut StdRng,
    stream: &FakeStreams,
    (created, changed): (Vec<usize>, Vec<usize>),
) -> Duration {
    let now = stream.elapsed();
    let minutes = |m: u64| Duration::from_secs(60 * m);
    let length = match rng.random_range(0..10) {
        // Over a day: two windows.
        0 | 1 => Duration::from_secs(24 * 3600) + minutes(rng.random_range(2..=30)),
        // Shorter than the shortest incremental export: the window is stretched.
        2..=4 => minutes(rng.random_range(3..=14)),
        _ => minutes(rng.random_range(16..=60)),
    };
    let early = (Duration::ZERO, Duration::from_secs(30));
    let whole = (early.1, length - Duration::from_secs(1));
    let two_windows = length > Duration::from_secs(24 * 3600);
    // Writes spread over the downtime; over a day, in its first or its last 20 minutes.
    let spread = |rng: &mut StdRng| {
        if two_windows && rng.random_bool(0.5) {
            at(rng, now, whole.0, minutes(20))
        } else if two_windows {
            at(rng, now, length - minutes(20), whole.1)
        } else {
            at(rng, now, whole.0, whole.1)
        }
    };
    // Created shortly before, deleted: early (the gap), later, or not at all.
    for (n, &key) in created.iter().enumerate() {
        if n == 0 || rng.random_bool(0.5) {
            stream.schedule(at(rng, now, early.0, early.1), write(key, true));
        } else if rng.random_bool(0.6) {
            stream.schedule(spread(rng), write(key, true));
        }
    }
    for &key in &changed {
        if rng.random_bool(0.5) {
            stream.schedule(at(rng, now, early.0, early.1), write(key, false));
        }
    }
    // Created and deleted inside the downtime: no export line, no row.
    for key in DOWN_KEYS.take(rng.random_range(1..=4)) {
        let (a, b) = (spread(rng), spread(rng));
        stream.schedule(a.min(b), write(key, false));
        stream.schedule(a.max(b) + Duration::from_micros(1), write(key, true));
    }
    for _ in 0..rng.random_range(5..=25) {
        let key = rng.random_range(0..BEFORE_KEYS.end);
        stream.schedule(spread(rng), write(key, rng.random_bool(0.3)));
    }
    // Writes the stream still holds when the pipeline is back: applied again after the repair.
    if rng.random_bool(0.5) {
        for _ in 0..rng.random_range(1..=3) {
            let key = rng.random_range(0..BEFORE_KEYS.end);
            let last = at(rng, now, length - Duration::from_secs(20), whole.1);
            stream.schedule(last, write(key, rng.random_bool(0.3)));
        }
    }
    // After the early writes, so that they land in the shards the position holds.
    if rng.random_bool(0.3) {
        let open: Vec<String> = stream
            .shards()
            .into_iter()
            .filter(|shard| !shard.closed)
            .map(|shard| shard.id.as_str().to_string())
            .collect();
        let parent = open[rng.random_range(0..open.len())].clone();
        let children = if rng.random_bool(0.5) {
            vec!["d1".to_string()]
        } else {
            vec!["d1".to_string(), "d2".to_string()]
        };
        let reshard = Change::Reshard {
            parent,
            children,
            listed_after: Duration::from_secs(rng.random_range(0..15)),
        };
        stream.schedule(at(rng, now, Duration::from_secs(40), whole.1), reshard);
    }
    length
}

/// Steps 1–4 and the checks of seed `setup.seed`, whose mirror has converged; `setup.repairs`
/// holds its exports.
pub async fn repair_phase(setup: &Setup<'_>, carried: &mut Carried) -> Repaired {
    let (seed, stream, path) = (setup.seed, setup.stream, setup.path);
    let exports = setup.repairs.unwrap();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7265_7061);
    let converged = stream.elapsed();
    assert!(
        converged + Duration::from_secs(15 * 60) <= REPAIR_AT,
        "seed {seed}: the mirror converged only at {converged:?}, too late for its repair phase"
    );
    tokio::time::sleep(REPAIR_AT - converged).await;
    let pages = setup.pages.load(Ordering::Relaxed);
    let calls = exports.fake.calls();
    let failed_before = carried.failed_exports;

    // 2. Shortly before.
    let before = schedule_before(&mut rng, stream);
    converge(setup, carried, |_| None).await;
    let rows_down = rows(path);
    // 3. Down.
    let length = schedule_downtime(&mut rng, stream, before);
    tokio::time::sleep(length).await;
    // 4. Up again, crashing.
    carried.repair_end = true;
    let crashed_among_files = converge(setup, carried, |attempt| {
        (attempt < 3 && rng.random_bool(0.6)).then(|| {
            if rng.random_bool(0.5) {
                Crash::AfterReadBatches(rng.random_range(1..=4))
            } else {
                Crash::At(Duration::from_millis(rng.random_range(100..120_000)))
            }
        })
    })
    .await;

    assert!(stream.quiescent(), "seed {seed}: the script did not finish");
    let table = FakeStreamTable::of(std::sync::Arc::clone(stream));
    assert_eq!(
        rows(path),
        table.items(),
        "seed {seed}: after the repair, the destination differs from the table"
    );
    assert_eq!(
        setup.pages.load(Ordering::Relaxed),
        pages,
        "seed {seed}: the repair phase read the table (a resnapshot)"
    );
    let now_calls = exports.fake.calls();
    let new_requests = &now_calls.start_requests[calls.start_requests.len()..];
    assert!(
        new_requests
            .iter()
            .all(|r| matches!(r.kind, ExportKind::Incremental { .. })),
        "seed {seed}: the repair phase started a full export"
    );
    let windows = windows(&now_calls);
    // A seed that scans starts its first export here: the scripted FAILED one, if any. The
    // run waiting on it fails, or, crashed before it heard, the next run finds it FAILED and
    // starts another.
    let failed = u64::from(exports.fails && calls.started == 0);
    assert!(
        carried.failed_exports - failed_before <= failed,
        "seed {seed}: a run failed on an export that did not fail"
    );
    let exports_started: usize = windows.iter().map(|(_, n)| n).sum();
    assert!(!windows.is_empty(), "seed {seed}: no incremental export");
    assert_eq!(
        exports_started as u64,
        windows.len() as u64 + failed,
        "seed {seed}: one incremental export per window ({windows:?}), one more after a FAILED one"
    );
    assert_eq!(
        now_calls.started - calls.started,
        windows.len() as u64 + failed,
        "seed {seed}: exports started in the repair phase"
    );
    for pair in windows.windows(2) {
        let (((_, end), _), ((start, _), _)) = (pair[0], pair[1]);
        assert_eq!(end, start, "seed {seed}: the windows follow each other");
    }
    for &((from, to), _) in &windows {
        assert!(
            to - from <= MAX_WINDOW_MS,
            "seed {seed}: a window over 24 h"
        );
    }
    let expected_windows = if length > Duration::from_secs(24 * 3600) {
        2
    } else {
        1
    };
    assert_eq!(
        windows.len(),
        expected_windows,
        "seed {seed}: windows of a downtime of {length:?}"
    );
    let entry = ddbpipe_keyed::state::assemble(&state(path)).unwrap();
    let position = &entry["position"];
    assert!(
        position["repair"].is_null() && position["snapshot"].is_null(),
        "seed {seed}: the stored position after the repair holds a record: {position}"
    );
    assert!(
        position["shards"]
            .as_object()
            .is_some_and(|s| !s.is_empty()),
        "seed {seed}: the stored position after the repair streams no shard: {position}"
    );

    let ((first_from, first_to), _) = windows[0];
    let vanished = vanished(&stream.history(), first_from, first_to)
        .iter()
        .filter(|(key, _)| rows_down.contains_key(key))
        .count();
    let deletes = windows
        .iter()
        .map(|&((from, to), _)| {
            table
                .changes(from, to)
                .iter()
                .filter(|c| c.new.is_none())
                .count()
        })
        .sum();
    Repaired {
        windows: windows.len(),
        crashed_among_files,
        vanished,
        deletes,
        failed_export: failed > 0,
        end_checked: !carried.repair_end,
    }
}
