//! One writer per file: the run lock beside the output, and what `write: overwrite` cannot
//! replace.

use std::path::{Path, PathBuf};

use crate::files::{self, LockError, RunLock};
use crate::sink::{SinkError, SinkErrorClass};

use super::sink::io_error;

/// Why `write: overwrite` cannot replace the file `path` leads to (a device, a FIFO, a
/// directory), if it cannot: `run` refuses it and `check` says the same.
pub fn overwrite_problem(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(files::resolve(path)).ok()?;
    (!meta.is_file()).then(|| {
        format!(
            "{} is not a regular file: write: overwrite cannot replace it; use write: append",
            path.display()
        )
    })
}

/// The lock file of the output `path`: `<path>.lock` beside the file `path` leads to; `None`
/// for a path that is not a regular file (`/dev/null`, a FIFO).
pub fn output_lock_path(path: &Path) -> Option<PathBuf> {
    let target = files::resolve(path);
    match std::fs::metadata(&target) {
        Ok(meta) if !meta.is_file() => None,
        _ => Some(files::lock_path(&target)),
    }
}

/// Takes the run lock of the output `path` for `pipeline`; a second writer is refused naming
/// the holder.
pub(super) fn lock_output(path: &Path, pipeline: &str) -> Result<Option<RunLock>, SinkError> {
    let Some(lock_path) = output_lock_path(path) else {
        return Ok(None);
    };
    let describe = path.display().to_string();
    match RunLock::acquire(&lock_path, pipeline) {
        Ok(lock) => Ok(Some(lock)),
        Err(LockError::Held(holder)) => Err(SinkError {
            sink: format!("jsonl {describe}"),
            message: format!(
                "{describe} is being written by pipeline '{}' (lock {}{}): give each pipeline \
                 its own sink.path, or wait for that run to finish",
                holder.pipeline.as_deref().unwrap_or("unknown"),
                lock_path.display(),
                holder.pid_suffix()
            ),
            // The other run ends some time: a later run may succeed.
            class: SinkErrorClass::Transient,
        }),
        Err(LockError::Io(error)) => Err(io_error(&describe, &lock_path, "lock", error)),
    }
}
