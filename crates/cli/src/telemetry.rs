//! Logs (tracing to stderr, text or JSON) and the scan progress bar.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ddbpipe_pipeline::runner::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::EnvFilter;

use crate::args::{LogFormat, ProgressMode};

/// The log format of this process, for the lines ddbpipe writes to stderr itself.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// What a line that ddbpipe writes to stderr itself (not through `tracing`) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// A run's closing summary.
    Summary,
    /// One line of a failure (`error: …`).
    Error,
    /// One `config error: <path>: <message>` line.
    ConfigError,
    /// What to do about a failure (`hint: …`).
    Hint,
    /// A note to the person at the terminal (the demo's narration, `nothing changed`).
    Note,
}

impl Line {
    fn level(self) -> &'static str {
        match self {
            Line::Error | Line::ConfigError => "ERROR",
            Line::Summary | Line::Hint | Line::Note => "INFO",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Line::Summary => "summary",
            Line::Error => "error",
            Line::ConfigError => "config_error",
            Line::Hint => "hint",
            Line::Note => "note",
        }
    }
}

/// Writes one line to stderr: `text` as it is with `--log-format text`, or one JSON object
/// (`timestamp`, `level`, `kind`, `message`) with `--log-format json`, so that every line on
/// stderr is JSON in that mode.
pub fn say(line: Line, text: &str) {
    match FORMAT.get() {
        Some(LogFormat::Json) => {
            let message = match line {
                Line::Error => text.strip_prefix("error: ").unwrap_or(text),
                Line::Hint => text.strip_prefix("hint: ").unwrap_or(text),
                _ => text,
            };
            let object = serde_json::json!({
                "timestamp": ddbpipe_source::clock::now_rfc3339(),
                "level": line.level(),
                "kind": line.kind(),
                "message": message,
            });
            eprintln!("{object}");
        }
        _ => eprintln!("{text}"),
    }
}

/// `note!("…", args)`: [`say`] a [`Line::Note`], formatted like `eprintln!`.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::telemetry::say($crate::telemetry::Line::Note, &format!($($arg)*))
    };
}
pub(crate) use note;

/// Installs the tracing subscriber: stderr, the given level, text or JSON lines.
pub fn init(level: &str, format: LogFormat) -> Result<(), String> {
    let _ = FORMAT.set(format);
    // The AWS SDK's own warnings (a credential provider that failed, with its `Debug` dump)
    // are noise beside ddbpipe's one-line error: shown from `debug` on.
    let dependencies = match level {
        "debug" | "trace" => "warn",
        _ => "error",
    };
    let filter = EnvFilter::try_new(format!(
        "{dependencies},ddbpipe={level},ddbpipe_source={level},ddbpipe_pipeline={level},\
         ddbpipe_keyed={level}"
    ))
    .map_err(|e| format!("--log-level {level}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    }
    .map_err(|e| e.to_string())
}

/// Where a run's Prometheus metrics go: served on an address, written to a file at the end
/// (for the node-exporter textfile collector: runs that end, from cron), or both.
#[derive(Debug, Clone, Default)]
pub struct MetricsOutput {
    /// `--metrics-addr`: served at `/metrics` while the run lasts.
    pub addr: Option<std::net::SocketAddr>,
    /// `--metrics-file`: the final values in the Prometheus text format, written when the run
    /// ends (temporary file, then renamed over it).
    pub file: Option<PathBuf>,
}

/// The installed recorder's handle, to write the final metrics.
pub struct Metrics {
    handle: metrics_exporter_prometheus::PrometheusHandle,
    file: Option<PathBuf>,
}

/// Installs the Prometheus recorder when `output` asks for metrics: every series labelled
/// `pipeline`, every metric described (`# HELP`).
pub fn install_metrics(output: &MetricsOutput, pipeline: &str) -> anyhow::Result<Option<Metrics>> {
    if output.addr.is_none() && output.file.is_none() {
        return Ok(None);
    }
    let mut builder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .add_global_label("pipeline", pipeline);
    if let Some(addr) = output.addr {
        builder = builder.with_http_listener(addr);
    }
    let (recorder, exporter) = builder
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
    if let Some(addr) = output.addr {
        tokio::spawn(async move {
            if exporter.await.is_err() {
                tracing::warn!(%addr, "The metrics listener stopped.");
            }
        });
        tracing::info!(%addr, "Serving Prometheus metrics.");
    }
    ddbpipe_source::events::describe_metrics();
    ddbpipe_pipeline::events::describe_metrics();
    Ok(Some(Metrics {
        handle,
        file: output.file.clone(),
    }))
}

impl Metrics {
    /// Writes the final metrics to `--metrics-file`, if set: a temporary file beside it, then
    /// renamed over it, so a collector never reads half a file.
    pub fn write_final(&self) -> anyhow::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = path.with_file_name(format!(".{name}.tmp"));
        std::fs::write(&temporary, self.handle.render())
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| anyhow::anyhow!("cannot write --metrics-file {}: {e}", path.display()))
    }
}

/// How often `--progress always` writes a progress line when stderr is no terminal.
const PROGRESS_LINE_INTERVAL: Duration = Duration::from_secs(10);

/// The scan progress bar: items, capacity units per second, ETA from `ItemCount`. With
/// `--progress always` and stderr no terminal (a file, a pipe) a bar cannot be drawn: a line
/// is written at the first progress and then every [`PROGRESS_LINE_INTERVAL`] instead.
pub struct ScanProgress {
    bar: Option<ProgressBar>,
    lines: Option<ProgressLines>,
    started: Instant,
    /// Set when a streams or mirror run reached its stream: the figures are change records
    /// from then on, with the shards and the lag (see [`Progress::streaming`]).
    stream: OnceLock<StreamPhase>,
}

/// When the stream phase began, and when its status was last logged.
struct StreamPhase {
    started: Instant,
    logged: Mutex<Instant>,
}

/// How often a streams or mirror run logs its status (`info`) while it reads the stream.
const STREAM_STATUS_INTERVAL: Duration = Duration::from_secs(30);

/// The state of the progress lines.
struct ProgressLines {
    total: Option<u64>,
    last: Mutex<Option<Instant>>,
}

impl ScanProgress {
    /// A bar on stderr when `mode` says so (`auto`: when stderr is a terminal).
    pub fn new(mode: ProgressMode, item_count: Option<i64>, done: u64, segments: u32) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let draw = match mode {
            ProgressMode::Never => false,
            ProgressMode::Always | ProgressMode::Auto => terminal,
        };
        let lines = (mode == ProgressMode::Always && !terminal).then(|| ProgressLines {
            total: item_count.filter(|n| *n > 0).map(|n| n as u64),
            last: Mutex::new(None),
        });
        let bar = draw.then(|| {
            let total = item_count.filter(|n| *n > 0).map(|n| n as u64);
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
            // An export's files are not known yet (segments 0): nothing to say about them.
            if segments > 0 {
                bar.set_message(format!("(segments done at start: {done}/{segments})"));
            }
            bar
        });
        ScanProgress {
            bar,
            lines,
            started: Instant::now(),
            stream: OnceLock::new(),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl ScanProgress {
    /// The live status of the stream phase: `N change records (x/s), shards a active /
    /// q queued / f finished, lag L s`; logged at `info` every [`STREAM_STATUS_INTERVAL`].
    fn stream_advanced(&self, phase: &StreamPhase, written: u64) {
        let secs = phase.started.elapsed().as_secs_f64().max(0.001);
        let status = ddbpipe_source::events::stream_status();
        let lag = status
            .lag_seconds
            .map(|lag| format!(", lag {lag:.1} s"))
            .unwrap_or_default();
        let line = format!(
            "{written} change records ({:.0}/s), shards {} active / {} queued / {} finished{lag}",
            written as f64 / secs,
            status.active,
            status.queued,
            status.finished
        );
        if let Some(bar) = &self.bar {
            bar.set_position(written);
            bar.set_message(line.clone());
        }
        let mut logged = phase.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.elapsed() >= STREAM_STATUS_INTERVAL {
            *logged = Instant::now();
            tracing::info!(
                records = written,
                active = status.active,
                queued = status.queued,
                finished = status.finished,
                lag_seconds = status.lag_seconds,
                "Streaming."
            );
        }
        drop(logged);
        if let Some(lines) = &self.lines {
            let mut last = lines.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|at| at.elapsed() >= PROGRESS_LINE_INTERVAL) {
                *last = Some(Instant::now());
                say(Line::Note, &format!("streaming: {line}"));
            }
        }
    }
}

impl Progress for ScanProgress {
    fn streaming(&self) {
        let now = Instant::now();
        let _ = self.stream.set(StreamPhase {
            started: now,
            logged: Mutex::new(now),
        });
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
        if let Some(lines) = &self.lines {
            *lines.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    fn advanced(&self, written: u64, capacity_units: f64) {
        if let Some(phase) = self.stream.get() {
            self.stream_advanced(phase, written);
            return;
        }
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        // A snapshot read beside its stream (docs/mirror.md §5.2) shows the stream's lag too.
        let beside = ddbpipe_source::events::stream_status()
            .lag_seconds
            .map(|lag| format!(", stream lag {lag:.1} s"))
            .unwrap_or_default();
        if let Some(bar) = &self.bar {
            bar.set_position(written);
            bar.set_message(format!("{:.1} RCU/s{beside}", capacity_units / secs));
        }
        if let Some(lines) = &self.lines {
            let mut last = lines.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| at.elapsed() < PROGRESS_LINE_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
            let of = match lines.total {
                Some(total) => format!(
                    " of ~{total} ({:.0} %)",
                    100.0 * written as f64 / total.max(1) as f64
                ),
                None => String::new(),
            };
            say(
                Line::Note,
                &format!(
                    "progress: {written} items{of}, {:.0} items/s, {:.1} RCU/s, {secs:.0}s{beside}",
                    written as f64 / secs,
                    capacity_units / secs
                ),
            );
        }
    }
}
