//! The progress bar, or progress lines when stderr is no terminal, and the stream status.
//!
//! # Cadence (docs/cli.md §8.6)
//! Batches only update the figures ([`Figures`]); the lines are written by a timer: the first
//! at the first progress, then one every [`PROGRESS_LINE_INTERVAL`] whatever the batches do (a
//! slow batch delays no line), and the stream's `info` status every
//! [`STREAM_STATUS_INTERVAL`].
//!
//! # What a line says
//! The phase is the current one: `progress: N items of ~T (x %)` while a scan or snapshot
//! reads the table, `streaming: N change records …` once the stream is read. A resumed scan's
//! percentage counts the segments its stored position has done (each about `T / segments`
//! items) besides what this run wrote.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ddbpipe_pipeline::runner::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

use super::{Line, say};
use crate::args::ProgressMode;

/// How often `--progress always` writes a progress line when stderr is no terminal.
const PROGRESS_LINE_INTERVAL: Duration = Duration::from_secs(10);

/// How often a streams or mirror run logs its status (`info`) while it reads the stream.
const STREAM_STATUS_INTERVAL: Duration = Duration::from_secs(30);

/// The scan progress bar: items, capacity units per second, ETA from `ItemCount`. With
/// `--progress always` and stderr no terminal (a file, a pipe) a bar cannot be drawn: lines
/// are written instead (module docs, "Cadence").
pub struct ScanProgress {
    bar: Option<ProgressBar>,
    figures: Arc<Mutex<Figures>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

/// What the lines report, updated by every acknowledged batch.
#[derive(Debug, Clone)]
struct Figures {
    /// The table's approximate item count, when known and a table is read.
    total: Option<u64>,
    /// Items the segments done before this run hold, about (module docs, "What a line says").
    resumed: u64,
    /// Records written by this run in the current phase.
    written: u64,
    /// Capacity units consumed so far.
    capacity_units: f64,
    /// When the current phase began.
    started: Instant,
    /// Whether the stream is being read (the figures are change records).
    streaming: bool,
    /// Whether anything progressed yet (the first line waits for it).
    advanced: bool,
    /// Whether `--progress always` writes lines.
    lines: bool,
    /// When the last line was written.
    last_line: Option<Instant>,
}

impl Figures {
    fn new(total: Option<u64>, done: u64, segments: u32, lines: bool) -> Self {
        Figures {
            total,
            resumed: resumed_items(total, done, segments),
            written: 0,
            capacity_units: 0.0,
            started: Instant::now(),
            streaming: false,
            advanced: false,
            lines,
            last_line: None,
        }
    }

    /// The line due at `now`, if one is: the first once something progressed, then one every
    /// [`PROGRESS_LINE_INTERVAL`].
    fn due(&mut self, now: Instant) -> Option<String> {
        if !self.lines || !self.advanced {
            return None;
        }
        if self
            .last_line
            .is_some_and(|at| now.duration_since(at) < PROGRESS_LINE_INTERVAL)
        {
            return None;
        }
        self.last_line = Some(now);
        Some(self.line())
    }

    /// The progress line of the current phase.
    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let written = self.written;
        if self.streaming {
            return format!("streaming: {}", stream_line(written, secs));
        }
        // A snapshot read beside its stream (docs/mirror.md §5.2) shows the stream's lag too.
        let beside = ddbpipe_source::events::stream_status()
            .lag_seconds
            .map(|lag| format!(", stream lag {lag:.1} s"))
            .unwrap_or_default();
        let of = match self.total {
            Some(total) => format!(
                " of ~{total} ({:.0} %)",
                percent(total, self.resumed, written)
            ),
            None => String::new(),
        };
        format!(
            "progress: {written} items{of}, {:.0} items/s, {:.1} RCU/s, {secs:.0}s{beside}",
            written as f64 / secs,
            self.capacity_units / secs
        )
    }
}

/// The items the `done` of `segments` segments of a resumed scan hold, about: each segment of a
/// parallel scan holds about an equal share of the table.
fn resumed_items(total: Option<u64>, done: u64, segments: u32) -> u64 {
    match total {
        Some(total) if segments > 0 => {
            (u128::from(total) * u128::from(done.min(u64::from(segments))) / u128::from(segments))
                as u64
        }
        _ => 0,
    }
}

/// The percentage of `total` done: `resumed` before this run, `written` by it.
fn percent(total: u64, resumed: u64, written: u64) -> f64 {
    (100.0 * (resumed + written) as f64 / total.max(1) as f64).min(100.0)
}

/// The live status of the stream phase: `N change records (x/s), shards a active / q queued /
/// f finished, lag L s`.
fn stream_line(written: u64, secs: f64) -> String {
    let status = ddbpipe_source::events::stream_status();
    let lag = status
        .lag_seconds
        .map(|lag| format!(", lag {lag:.1} s"))
        .unwrap_or_default();
    format!(
        "{written} change records ({:.0}/s), shards {} active / {} queued / {} finished{lag}",
        written as f64 / secs,
        status.active,
        status.queued,
        status.finished
    )
}

/// Writes the lines of `figures` (module docs, "Cadence") to `write` until aborted: a line once
/// something progressed, then one every [`PROGRESS_LINE_INTERVAL`]; in the stream phase the
/// `info` status every [`STREAM_STATUS_INTERVAL`].
async fn tick(figures: Arc<Mutex<Figures>>, write: impl Fn(String) + Send + 'static) {
    let mut last_status = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(250));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = Instant::now();
        let (due, figures) = {
            let mut figures = figures.lock().unwrap_or_else(|e| e.into_inner());
            (figures.due(now), figures.clone())
        };
        if figures.streaming && now.duration_since(last_status) >= STREAM_STATUS_INTERVAL {
            last_status = now;
            let status = ddbpipe_source::events::stream_status();
            tracing::info!(
                records = figures.written,
                active = status.active,
                queued = status.queued,
                finished = status.finished,
                lag_seconds = status.lag_seconds,
                "Streaming."
            );
        }
        if let Some(line) = due {
            write(line);
        }
    }
}

impl ScanProgress {
    /// A bar on stderr when `mode` says so (`auto`: when stderr is a terminal); lines with
    /// `always` off a terminal. `done` of `segments` were read before this run.
    pub fn new(mode: ProgressMode, item_count: Option<i64>, done: u64, segments: u32) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let draw = match mode {
            ProgressMode::Never => false,
            ProgressMode::Always | ProgressMode::Auto => terminal,
        };
        let lines = mode == ProgressMode::Always && !terminal;
        let total = item_count.filter(|n| *n > 0).map(|n| n as u64);
        let figures = Figures::new(total, done, segments, lines);
        let resumed = figures.resumed;
        let bar = draw.then(|| {
            let bar = match total {
                Some(total) => ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            };
            let template = if total.is_some() {
                "{spinner} [{elapsed_precise}] {bar:30} {human_pos}/~{human_len} items {msg} ETA {eta}"
            } else {
                "{spinner} [{elapsed_precise}] {human_pos} items {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar.set_position(resumed);
            // An export's files are not known yet (segments 0): nothing to say about them.
            if segments > 0 {
                bar.set_message(format!("(segments done at start: {done}/{segments})"));
            }
            bar
        });
        let figures = Arc::new(Mutex::new(figures));
        let ticker = tokio::spawn(tick(Arc::clone(&figures), |line| say(Line::Note, &line)));
        ScanProgress {
            bar,
            figures,
            ticker: Some(ticker),
        }
    }

    /// Removes the bar and stops the lines.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some(ticker) = &self.ticker {
            ticker.abort();
        }
    }

    fn figures(&self) -> std::sync::MutexGuard<'_, Figures> {
        self.figures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ScanProgress {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
    }
}

impl Progress for ScanProgress {
    fn streaming(&self) {
        {
            let mut figures = self.figures();
            figures.streaming = true;
            figures.written = 0;
            figures.started = Instant::now();
            figures.advanced = false;
            figures.last_line = None;
        }
        if let Some(bar) = &self.bar {
            bar.unset_length();
            bar.set_position(0);
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] streaming: {msg}")
            {
                bar.set_style(style);
            }
            bar.set_message("waiting for the first change records");
        }
    }

    fn advanced(&self, written: u64, capacity_units: f64) {
        let (streaming, resumed, started, due) = {
            let mut figures = self.figures();
            figures.written = written;
            figures.capacity_units = capacity_units;
            figures.advanced = true;
            // The first line comes with the first progress; the timer writes the others.
            let due = figures
                .last_line
                .is_none()
                .then(|| figures.due(Instant::now()))
                .flatten();
            (figures.streaming, figures.resumed, figures.started, due)
        };
        if let Some(line) = due {
            say(Line::Note, &line);
        }
        let Some(bar) = &self.bar else {
            return;
        };
        let secs = started.elapsed().as_secs_f64().max(0.001);
        if streaming {
            bar.set_position(written);
            bar.set_message(stream_line(written, secs));
            return;
        }
        let beside = ddbpipe_source::events::stream_status()
            .lag_seconds
            .map(|lag| format!(", stream lag {lag:.1} s"))
            .unwrap_or_default();
        bar.set_position(resumed + written);
        bar.set_message(format!("{:.1} RCU/s{beside}", capacity_units / secs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collecting(figures: &Arc<Mutex<Figures>>) -> Arc<Mutex<Vec<(u64, String)>>> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let into = Arc::clone(&lines);
        tokio::spawn(tick(Arc::clone(figures), move |line| {
            let at = start.elapsed().as_secs();
            into.lock().unwrap().push((at, line));
        }));
        lines
    }

    fn advance(figures: &Arc<Mutex<Figures>>, written: u64) {
        let mut figures = figures.lock().unwrap();
        figures.written = written;
        figures.advanced = true;
    }

    /// Issue 24 item 20: lines came 10–27 s apart, written only when a batch ended. A timer
    /// writes them: a batch that takes 35 s delays none.
    #[tokio::test(start_paused = true)]
    async fn progress_lines_come_every_ten_seconds_while_a_batch_is_slow() {
        let figures = Arc::new(Mutex::new(Figures::new(Some(100), 0, 4, true)));
        let lines = collecting(&figures);
        tokio::time::sleep(Duration::from_secs(3)).await;
        advance(&figures, 10);
        // One slow batch: nothing advances for 35 s.
        tokio::time::sleep(Duration::from_secs(35)).await;
        let at: Vec<u64> = lines.lock().unwrap().iter().map(|(at, _)| *at).collect();
        assert_eq!(at, [3, 13, 23, 33], "{:?}", lines.lock().unwrap());
    }

    /// Issue 24 item 20: the percentage restarted from 0 on resume; it counts the segments the
    /// stored position has done.
    #[tokio::test(start_paused = true)]
    async fn a_resumed_scan_counts_its_done_segments_in_the_percentage() {
        let mut figures = Figures::new(Some(100), 2, 4, true);
        figures.written = 10;
        let line = figures.line();
        assert!(line.contains("10 items of ~100 (60 %)"), "{line}");
        assert_eq!(resumed_items(Some(100), 9, 4), 100, "never past the total");
        assert_eq!(resumed_items(None, 2, 4), 0);
        assert_eq!(
            resumed_items(Some(100), 2, 0),
            0,
            "an export: no segments yet"
        );
    }

    /// Issue 24 item 20: the stream phase printed the snapshot's `items (4 %)`.
    #[tokio::test(start_paused = true)]
    async fn the_stream_phase_says_streaming_not_the_snapshots_items() {
        let figures = Arc::new(Mutex::new(Figures::new(Some(1000), 0, 4, true)));
        let progress = ScanProgress {
            bar: None,
            figures: Arc::clone(&figures),
            ticker: None,
        };
        progress.advanced(40, 1.0);
        assert!(
            figures
                .lock()
                .unwrap()
                .line()
                .contains("40 items of ~1000 (4 %)")
        );
        progress.streaming();
        progress.advanced(3, 0.0);
        let line = figures.lock().unwrap().line();
        assert!(line.starts_with("streaming: 3 change records"), "{line}");
        assert!(!line.contains('%'), "{line}");
    }
}
