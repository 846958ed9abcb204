//! The `sink:` and `state:` sections: where records go and where the position is kept.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ddbpipe_source::config::ConfigError;

use super::fields::{Choice, Fields};

/// `state.flush_interval_ms` when unset.
pub const DEFAULT_FLUSH_INTERVAL_MS: u64 = 1000;
/// `sink.fsync` when unset.
pub const DEFAULT_FSYNC: bool = true;
/// The smallest `sink.rotate_bytes`: 1 MiB.
pub const MIN_ROTATE_BYTES: u64 = 1_048_576;

/// Where the records of a run are written: the `sink:` section, `{type: <sink>, ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// `type: jsonl`: one JSON object per line, to stdout or files (SPEC §7.1).
    Jsonl(JsonlConfig),
}

/// The `jsonl` sink: `{type: jsonl, path: "-" | <file>, rotate_bytes: <bytes>, fsync: true}`.
///
/// Lines are UTF-8 JSON objects with sorted keys, each ending in `\n`. A file is opened for
/// appending, never truncated; a partial last line left by a crash is cut off first. The jsonl
/// sink cannot delete rows, so `on_gap: resnapshot` needs `resnapshot_deletes: false`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Where lines go: `"-"` (the default) for stdout, or a file path. A relative path is
    /// relative to the working directory. Logs and progress always go to stderr.
    pub path: JsonlTarget,
    /// Start a new file once the current one has reached this size, in bytes; at least
    /// 1048576 (1 MiB), and only with a file `path`. Files are then `<stem>.000001<ext>`,
    /// `<stem>.000002<ext>`, … next to `path`; a batch is never split across files. Unset: one
    /// file.
    pub rotate_bytes: Option<u64>,
    /// Acknowledge a batch only after `fdatasync`, so a crash cannot lose a line whose position
    /// was saved. Default true.
    pub fsync: bool,
}

/// The target of the jsonl sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonlTarget {
    /// `"-"`: standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// Where the position of a pipeline with a `jsonl` sink is kept: the `state:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The state file. Default `<directory of the config file>/<name>.state.json`; a relative
    /// path given here is relative to the working directory. One file may hold several
    /// pipelines.
    pub path: PathBuf,
    /// The least time between two writes of the state file while running, in milliseconds; 0
    /// writes after every acknowledged batch. The file is always written at the end of a run,
    /// on a signal and after a failure. Default 1000.
    pub flush_interval_ms: u64,
}

/// The `type` of `sink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkType {
    Jsonl,
}

impl Choice for SinkType {
    fn all() -> &'static [Self] {
        &[SinkType::Jsonl]
    }
    fn name(self) -> &'static str {
        match self {
            SinkType::Jsonl => "jsonl",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "sqlite" | "postgres")
            .then_some("the sqlite and postgres sinks are not available in this version")
    }
}

/// Reads the sink section; also returns the keys it set. An unknown `type` stops here: the
/// other keys cannot be judged without it.
pub(super) fn read_sink(mut f: Fields<'_>) -> Option<(SinkConfig, BTreeSet<String>)> {
    let SinkType::Jsonl = f.required::<SinkType>("type")?;
    let path = match f.get::<String>("path") {
        Some(path) if path == "-" => JsonlTarget::Stdout,
        Some(path) => JsonlTarget::File(PathBuf::from(path)),
        None => JsonlTarget::Stdout,
    };
    let jsonl = JsonlConfig {
        path,
        rotate_bytes: f.get("rotate_bytes"),
        fsync: f.or("fsync", DEFAULT_FSYNC),
    };
    Some((SinkConfig::Jsonl(jsonl), f.finish()))
}

/// Reads the state section, if any. `default_path` is where the file goes without `path`.
pub(super) fn read_state(f: Option<Fields<'_>>, default_path: PathBuf) -> StateConfig {
    let mut state = StateConfig {
        path: default_path,
        flush_interval_ms: DEFAULT_FLUSH_INTERVAL_MS,
    };
    if let Some(mut f) = f {
        if let Some(path) = f.get::<String>("path") {
            state.path = PathBuf::from(path);
        }
        state.flush_interval_ms = f.or("flush_interval_ms", state.flush_interval_ms);
        f.finish();
    }
    state
}

/// The default state file of pipeline `name` whose config file is in `config_dir`.
pub(super) fn default_state_path(config_dir: &Path, name: &str) -> PathBuf {
    config_dir.join(format!("{name}.state.json"))
}

/// The sink and state rules of SPEC §1.3 rule 12 (§6.1, §7.1).
pub(super) fn validate(sink: &SinkConfig, state: &StateConfig, errors: &mut Vec<ConfigError>) {
    let SinkConfig::Jsonl(jsonl) = sink;
    if let JsonlTarget::File(path) = &jsonl.path
        && path.as_os_str().is_empty()
    {
        errors.push(ConfigError::new(
            "sink.path",
            "path must not be empty: use \"-\" for stdout or a file path",
        ));
    }
    if let Some(bytes) = jsonl.rotate_bytes {
        if bytes < MIN_ROTATE_BYTES {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                format!("rotate_bytes must be at least {MIN_ROTATE_BYTES} (got {bytes})"),
            ));
        }
        if jsonl.path == JsonlTarget::Stdout {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                "rotate_bytes needs a file path: stdout cannot be rotated",
            ));
        }
    }
    if state.path.as_os_str().is_empty() {
        errors.push(ConfigError::new("state.path", "path must not be empty"));
    }
}
