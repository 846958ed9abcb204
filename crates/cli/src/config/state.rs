//! The `state:` section: where the position of a pipeline whose sink does not keep it (jsonl,
//! custom) is kept.

use std::path::{Path, PathBuf};

use ddbpipe_source::config::ConfigError;

use serde_json::json;

use crate::sinks::SinkConfig;
use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of, optional};

/// `state.flush_interval_ms` when unset.
pub const DEFAULT_FLUSH_INTERVAL_MS: u64 = 1000;

/// The keys of `state:`.
pub(super) static STATE: &[Field] = &[
    optional(
        "path",
        of::<String>(),
        "The state file (jsonl sink only); unset: <name>.state.json beside this file; a \
         relative path is relative to this file's directory.",
    ),
    defaulted(
        "flush_interval_ms",
        of::<u64>(),
        || json!(DEFAULT_FLUSH_INTERVAL_MS),
        "Least time between two writes of the state file while running, in milliseconds; 0: \
         after every batch.",
    ),
];
/// Where the position of a pipeline with a `jsonl` sink is kept: the `state:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The state file. Default `<directory of the config file>/<name>.state.json`; a relative
    /// path given here is relative to that directory too. One file may hold several pipelines.
    pub path: PathBuf,
    /// The least time between two writes of the state file while running, in milliseconds; 0
    /// writes after every acknowledged batch. The file is always written at the end of a run,
    /// on a signal and after a failure. Default 1000.
    pub flush_interval_ms: u64,
    /// Whether `path` was set in the file (an error with a keyed sink).
    pub path_set: bool,
}

/// Reads the state section, if any. `default_path` is where the file goes without `path`.
pub(super) fn read_state(f: Option<Fields<'_>>, default_path: PathBuf) -> StateConfig {
    let mut state = StateConfig {
        path: default_path,
        flush_interval_ms: DEFAULT_FLUSH_INTERVAL_MS,
        path_set: false,
    };
    if let Some(mut f) = f {
        if let Some(path) = f.get::<String>("path") {
            state.path = PathBuf::from(path);
            state.path_set = true;
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

/// The state rules of docs/config.md §1.3 rule 12 (docs/state.md §6.1): a sink that keeps no
/// position (jsonl, custom, kafka `at_least_once`) needs a state file; a keyed sink keeps it in
/// its database, an `exactly_once` kafka sink in its positions topic.
pub(super) fn validate(state: &StateConfig, sink: &SinkConfig, errors: &mut Vec<ConfigError>) {
    match sink.keeps_position() {
        None if state.path.as_os_str().is_empty() => {
            errors.push(ConfigError::new("state.path", "path must not be empty"));
        }
        Some(place) if state.path_set => errors.push(ConfigError::new(
            "state.path",
            format!(
                "the {} sink keeps the position in {place}; remove state.path",
                sink.kind()
            ),
        )),
        _ => {}
    }
}
