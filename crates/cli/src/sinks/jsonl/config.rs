//! The jsonl sink's section: `{type: jsonl, path, rotate_bytes, fsync, write, gzip}`
//! (docs/sinks.md §7.1).

use std::path::PathBuf;

use ddbpipe_source::config::ConfigError;
use serde_json::json;

use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of, optional};
use crate::yaml::types::Choice;

/// What `sink.path` of a jsonl sink holds where each worker's id goes (`coordination:`).
pub const WORKER_PLACEHOLDER: &str = "{worker}";
/// `sink.fsync` when unset.
pub const DEFAULT_FSYNC: bool = true;
/// `sink.path` of the jsonl sink when unset: standard output.
pub const STDOUT_PATH: &str = "-";
/// The smallest `sink.rotate_bytes`: 1 MiB.
pub const MIN_ROTATE_BYTES: u64 = 1_048_576;

/// The keys of the jsonl sink.
pub(crate) static FIELDS: &[Field] = &[
    defaulted(
        "path",
        of::<String>(),
        || json!(STDOUT_PATH),
        "\"-\" for stdout, or a file; a relative path is relative to this file's directory.",
    ),
    optional(
        "rotate_bytes",
        of::<u64>(),
        "Start the next numbered file once one reaches this size, in bytes (at least 1048576; \
         write: append only).",
    ),
    defaulted(
        "fsync",
        of::<bool>(),
        || json!(DEFAULT_FSYNC),
        "Acknowledge a batch only after fdatasync.",
    ),
    defaulted(
        "write",
        of::<WriteMode>(),
        || json!(WriteMode::default().as_str()),
        "What a run does with an earlier run's file: append to it, overwrite it at completion, \
         or write a new timestamped file.",
    ),
    defaulted(
        "gzip",
        of::<bool>(),
        || json!(false),
        "Gzip-compress the file, one member per batch (write: overwrite or new_file_per_run).",
    ),
];

/// The `jsonl` sink: `{type: jsonl, path: "-" | <file>, rotate_bytes: <bytes>, fsync: true,
/// write: append | overwrite | new_file_per_run, gzip: false}`.
///
/// Lines are UTF-8 JSON objects with sorted keys, each ending in `\n`. With `write: append` a
/// file is opened for appending, never truncated; a partial last line left by a crash is cut
/// off first. The jsonl sink cannot delete rows, so `on_gap: resnapshot` needs
/// `resnapshot_deletes: false`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Where lines go: `"-"` (the default) for stdout, or a file path. A relative path is
    /// relative to the directory of the pipeline file. Logs and progress always go to stderr.
    pub path: JsonlTarget,
    /// Start a new file once the current one has reached this size, in bytes; at least
    /// 1048576 (1 MiB), and only with a file `path`. Files are then `<stem>.000001<ext>`,
    /// `<stem>.000002<ext>`, … next to `path`; a batch is never split across files. Unset: one
    /// file.
    pub rotate_bytes: Option<u64>,
    /// Acknowledge a batch only after `fdatasync`, so a crash cannot lose a line whose position
    /// was saved. Default true.
    pub fsync: bool,
    /// What a run does with the file of an earlier run (docs/sinks.md §7.1). Named `write`
    /// because `mode` is the source's (`source.mode: scan`). Default `append`.
    pub write: WriteMode,
    /// Write the lines gzip-compressed, one gzip member per batch. Only with `write:
    /// overwrite` or `new_file_per_run`, and without `rotate_bytes`. Default false.
    pub gzip: bool,
}

/// `sink.write` of the jsonl sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// `append`: lines are added after those of earlier runs (a rerun of a scan adds the
    /// table again).
    #[default]
    Append,
    /// `overwrite`: a scan or query writes a temporary file beside `path` and renames it over
    /// `path` when it completes; an interrupted run leaves `path` as it was. Scan and query
    /// only.
    Overwrite,
    /// `new_file_per_run`: each run writes `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside `path`
    /// (UTC); a scan or query renames its temporary file to that name when it completes.
    NewFilePerRun,
}

impl WriteMode {
    /// The name in the config file.
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteMode::Append => "append",
            WriteMode::Overwrite => "overwrite",
            WriteMode::NewFilePerRun => "new_file_per_run",
        }
    }
}

impl Choice for WriteMode {
    fn all() -> &'static [Self] {
        &[
            WriteMode::Append,
            WriteMode::Overwrite,
            WriteMode::NewFilePerRun,
        ]
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "truncate" | "replace")
            .then_some("a run that replaces the file is `write: overwrite`")
    }
}

/// The target of the jsonl sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonlTarget {
    /// `"-"`: standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// Reads the jsonl sink's keys.
pub(crate) fn read(f: &mut Fields<'_>) -> JsonlConfig {
    let path = match f.get::<String>("path") {
        Some(path) if path == STDOUT_PATH => JsonlTarget::Stdout,
        Some(path) => JsonlTarget::File(PathBuf::from(path)),
        None => JsonlTarget::Stdout,
    };
    JsonlConfig {
        path,
        rotate_bytes: f.get("rotate_bytes"),
        fsync: f.or("fsync", DEFAULT_FSYNC),
        write: f.or("write", WriteMode::default()),
        gzip: f.or("gzip", false),
    }
}

/// The jsonl rules of docs/config.md §1.3 rule 12 (docs/sinks.md §7.1).
pub(crate) fn validate(jsonl: &JsonlConfig, errors: &mut Vec<ConfigError>) {
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
        if jsonl.write != WriteMode::Append {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                format!(
                    "rotate_bytes needs write: append (got write: {}): rotated files are \
                     continued, never replaced",
                    jsonl.write.name()
                ),
            ));
        }
        if jsonl.gzip {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                "rotate_bytes cannot be combined with gzip: true",
            ));
        }
    }
    if jsonl.write != WriteMode::Append && jsonl.path == JsonlTarget::Stdout {
        errors.push(ConfigError::new(
            "sink.write",
            format!(
                "write: {} needs a file path: stdout cannot be replaced or renamed",
                jsonl.write.name()
            ),
        ));
    }
    if jsonl.gzip && jsonl.write == WriteMode::Append {
        errors.push(ConfigError::new(
            "sink.gzip",
            "gzip: true needs write: overwrite or write: new_file_per_run: a gzip file is \
             written whole by one run, never appended to by the next",
        ));
    }
}
