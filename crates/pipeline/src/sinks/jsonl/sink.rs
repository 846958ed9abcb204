//! The jsonl sink itself: opening the target, writing batches, publishing at completion.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::batch::Batch;
use crate::files::RunLock;
use crate::sink::{RunStart, Sink, SinkError, SinkErrorClass, Staged};

use super::append::open_append;
use super::lock::{lock_output, overwrite_problem};
use super::names::{Published, next_timestamped_path, rotated_path, run_files, sync_parent};
use super::{Compression, JsonlSettings, JsonlTarget, WriteMode};

/// A run's temporary file and where it goes at completion.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    temp: PathBuf,
    destination: Published,
}

enum Output {
    Stdout(std::io::Stdout),
    File {
        file: File,
        path: PathBuf,
        size: u64,
        number: u32,
    },
}

/// Writes batches as JSON lines.
pub struct JsonlSink {
    settings: JsonlSettings,
    output: Output,
    // `Some` while a temporary file waits for the run's completion.
    pending: Option<Pending>,
    // Held for the whole run: no other writer appends to these files meanwhile.
    _lock: Option<RunLock>,
}

pub(super) fn io_error(sink: &str, path: &Path, action: &str, error: std::io::Error) -> SinkError {
    SinkError {
        sink: format!("jsonl {sink}"),
        message: format!("cannot {action} {}: {error}", path.display()),
        class: SinkErrorClass::Transient,
    }
}

impl JsonlSink {
    /// Opens the target for `pipeline`: stdout, or the file (the highest rotation) for
    /// appending, or the run's temporary file, under the file's run lock (see the module docs).
    pub fn open(settings: JsonlSettings, pipeline: &str) -> Result<Self, SinkError> {
        let mut lock = None;
        let mut pending = None;
        let compression = settings.compression;
        let output = match &settings.target {
            JsonlTarget::Stdout => Output::Stdout(std::io::stdout()),
            JsonlTarget::File(path) => {
                let describe = path.display().to_string();
                if settings.write == WriteMode::Overwrite
                    && let Some(message) = overwrite_problem(path)
                {
                    return Err(SinkError {
                        sink: format!("jsonl {describe}"),
                        message,
                        class: SinkErrorClass::Definite,
                    });
                }
                lock = lock_output(path, pipeline)?;
                let files = run_files(path, settings.write, settings.rotate_bytes, pipeline)
                    .map_err(|e| io_error(&describe, path, "list the directory of", e))?;
                let (file, size) = open_append(&files.written, compression)
                    .map_err(|e| io_error(&describe, &files.written, "open", e))?;
                pending = files.published.map(|destination| Pending {
                    temp: files.written.clone(),
                    destination,
                });
                Output::File {
                    file,
                    path: files.written,
                    size,
                    number: files.rotation,
                }
            }
        };
        Ok(JsonlSink {
            settings,
            output,
            pending,
            _lock: lock,
        })
    }

    /// A fresh run empties the temporary file an earlier, unfinished run left.
    fn start_sync(&mut self, start: RunStart) -> Result<(), SinkError> {
        let describe = self.describe_target();
        if let (
            RunStart::Fresh,
            Some(_),
            Output::File {
                file, path, size, ..
            },
        ) = (start, &self.pending, &mut self.output)
            && *size > 0
        {
            file.set_len(0)
                .and_then(|()| file.sync_data())
                .map_err(|e| io_error(&describe, path, "empty", e))?;
            tracing::info!(
                file = %path.display(),
                "Emptied the temporary file of an earlier run that did not complete."
            );
            *size = 0;
        }
        Ok(())
    }

    /// The run completed: the temporary file is fsynced and renamed to its destination.
    fn complete_sync(&mut self) -> Result<(), SinkError> {
        let describe = self.describe_target();
        let (Some(pending), Output::File { file, .. }) = (self.pending.take(), &mut self.output)
        else {
            return Ok(());
        };
        file.sync_all()
            .map_err(|e| io_error(&describe, &pending.temp, "fsync", e))?;
        let target = match &pending.destination {
            Published::Over(target) => target.clone(),
            Published::Timestamped(base) => next_timestamped_path(base),
        };
        std::fs::rename(&pending.temp, &target)
            .map_err(|e| io_error(&describe, &pending.temp, "rename", e))?;
        sync_parent(&target)
            .map_err(|e| io_error(&describe, &target, "fsync the directory of", e))?;
        tracing::info!(file = %target.display(), "Output published.");
        Ok(())
    }

    fn describe_target(&self) -> String {
        match &self.settings.target {
            JsonlTarget::Stdout => "stdout".to_string(),
            JsonlTarget::File(path) => path.display().to_string(),
        }
    }

    fn write_sync(&mut self, batch: &Batch) -> Result<(), SinkError> {
        let bytes = batch.records.as_bytes();
        let describe = self.describe_target();
        let fsync = self.settings.fsync;
        let rotate = self.settings.rotate_bytes;
        match &mut self.output {
            Output::Stdout(stdout) => {
                let mut lock = stdout.lock();
                lock.write_all(bytes)
                    .and_then(|()| lock.flush())
                    .map_err(|e| SinkError {
                        sink: "jsonl stdout".into(),
                        message: format!("cannot write: {e}"),
                        class: SinkErrorClass::Transient,
                    })
            }
            Output::File {
                file,
                path,
                size,
                number,
            } => {
                if let Some(limit) = rotate
                    && *size >= limit
                    && !bytes.is_empty()
                {
                    let base = match &self.settings.target {
                        JsonlTarget::File(base) => base.clone(),
                        JsonlTarget::Stdout => unreachable!("a file output has a file target"),
                    };
                    *number += 1;
                    let next = rotated_path(&base, *number);
                    let (new_file, new_size) = open_append(&next, Compression::None)
                        .map_err(|e| io_error(&describe, &next, "open", e))?;
                    *file = new_file;
                    *path = next;
                    *size = new_size;
                }
                let compressed;
                let bytes = match self.settings.compression {
                    Compression::None => bytes,
                    Compression::Gzip => {
                        let mut member = flate2::write::GzEncoder::new(
                            Vec::with_capacity(bytes.len() / 4),
                            flate2::Compression::default(),
                        );
                        compressed = member
                            .write_all(bytes)
                            .and_then(|()| member.finish())
                            .map_err(|e| io_error(&describe, path, "compress for", e))?;
                        &compressed[..]
                    }
                };
                file.write_all(bytes)
                    .map_err(|e| io_error(&describe, path, "write", e))?;
                // A device or a pipe (`/dev/null`, a FIFO) holds nothing to make durable, and
                // `fdatasync` refuses it: written and flushed is all there is (what `check`
                // accepts, `run` accepts).
                if fsync && file.metadata().map_or(true, |m| m.is_file()) {
                    file.sync_data()
                        .map_err(|e| io_error(&describe, path, "fdatasync", e))?;
                }
                *size += bytes.len() as u64;
                Ok(())
            }
        }
    }
}

impl Sink for JsonlSink {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        if batch.records.is_empty() {
            return Ok(());
        }
        // Writes are small and sequential; blocking the worker briefly is cheaper than a
        // hand-off to the blocking pool per batch.
        tokio::task::block_in_place(|| self.write_sync(batch))
    }

    async fn start(&mut self, start: RunStart) -> Result<(), SinkError> {
        tokio::task::block_in_place(|| self.start_sync(start))
    }

    async fn complete(&mut self) -> Result<(), SinkError> {
        tokio::task::block_in_place(|| self.complete_sync())
    }

    fn describe(&self) -> String {
        format!("jsonl {}", self.describe_target())
    }
}
