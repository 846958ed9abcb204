//! Logs (tracing to stderr, text or JSON), metrics and health, and the progress bar.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::args::LogFormat;

/// The log format of this process, for the lines ddbpipe writes to stderr itself.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The pipeline and table of this process's run, for the JSON lines ddbpipe writes itself
/// (the `run` span carries them for `tracing`'s lines).
static RUN: OnceLock<(String, String)> = OnceLock::new();

/// Names the pipeline and table this process runs: every JSON line written after it carries
/// `pipeline` and `table` at its top level (docs/cli.md §8.6).
pub fn set_run(pipeline: &str, table: &str) {
    let _ = RUN.set((pipeline.to_string(), table.to_string()));
}

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
/// (`timestamp`, `level`, `kind`, `message`, and a run's `pipeline` and `table`) with
/// `--log-format json`, so that every line on stderr is JSON in that mode.
pub fn say(line: Line, text: &str) {
    match FORMAT.get() {
        Some(LogFormat::Json) => {
            let message = match line {
                Line::Error => text.strip_prefix("error: ").unwrap_or(text),
                Line::Hint => text.strip_prefix("hint: ").unwrap_or(text),
                _ => text,
            };
            let mut object = serde_json::json!({
                "timestamp": ddbpipe_source::clock::now_rfc3339(),
                "level": line.level(),
                "kind": line.kind(),
                "message": message,
            });
            if let Some((pipeline, table)) = RUN.get() {
                object["pipeline"] = pipeline.as_str().into();
                object["table"] = table.as_str().into();
            }
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
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // The metrics' labels come from ddbpipe's own spans (a run's `table`), whatever the level
    // of the lines: only ddbpipe's spans, so the SDK's are not made for it.
    let labels = metrics_tracing_context::MetricsLayer::new().with_filter(filter_fn(|meta| {
        meta.is_span() && meta.target().starts_with("ddbpipe")
    }));
    let subscriber = tracing_subscriber::registry().with(labels);
    match format {
        LogFormat::Text => subscriber.with(lines.with_filter(filter)).try_init(),
        LogFormat::Json => subscriber
            .with(
                lines
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .event_format(json::FlatJson)
                    .with_filter(filter),
            )
            .try_init(),
    }
    .map_err(|e| e.to_string())
}

mod json;
mod metrics;
mod progress;

pub use metrics::{MetricsOutput, install_metrics};
pub use progress::ScanProgress;
