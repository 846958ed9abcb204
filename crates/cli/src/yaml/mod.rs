//! How a pipeline file's sections are declared, read and described: each section declares its
//! keys once ([`schema`]: name, shape, presence, description), and the same declaration reads
//! them from the YAML ([`fields`], every problem named by its path), converts values
//! ([`types`]) and writes the JSON Schema. The sections themselves live with what they
//! configure: `crate::config` (source, state, coordination, metrics) and `crate::sinks`.

use std::path::Path;

pub(crate) mod fields;
pub(crate) mod schema;
pub(crate) mod types;

/// Makes a relative file path of the pipeline file relative to `config_dir`, the file's
/// directory, so a run from cron or another directory reads and writes the same files as one
/// from beside the config. An empty path stays empty (validation names it).
pub(crate) fn anchor(config_dir: &Path, path: &mut std::path::PathBuf) {
    if !path.as_os_str().is_empty() && path.is_relative() {
        *path = config_dir.join(&*path);
    }
}
