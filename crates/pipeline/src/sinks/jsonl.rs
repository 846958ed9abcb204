//! The `jsonl` sink: one JSON object per line, to stdout or to (rotated) files.
//!
//! # Durability (docs/sinks.md §7.1)
//! A batch is acknowledged after it is written and flushed and, with `fsync: true`, after
//! `fdatasync`, so the state file never runs ahead of the data.
//!
//! # Restart
//! Files are opened for appending (`O_APPEND`: every write lands at the end of the file, wherever
//! it is now) and never truncated as a whole. A trailing partial line is what a crash in the
//! middle of a write leaves; it belonged to an unacknowledged batch, so it is cut off before
//! anything is appended.
//!
//! # One writer per file
//! 1. Before the file is opened, the run takes the exclusive lock `<path>.lock` beside the
//!    file `path` leads to (symlinks followed), and holds it until the sink is dropped. With
//!    rotation, `path` is the base name, so the one lock covers every numbered file.
//! 2. A second writer is refused at once, naming the pipeline and process holding the lock.
//! 3. The partial-line cut happens under the lock, so it never cuts another writer's line.
//! 4. A path that is not a regular file (`/dev/null`, a FIFO) is written without a lock.
//!
//! # Rotation
//! With `rotate_bytes`, files are `<stem>.<NNNNNN><ext>` beside `path`, from `000001`. When a
//! file reaches the size after a batch, the next batch opens the next number; a batch is never
//! split. A run continues the highest-numbered file. Only with `WriteMode::Append`.
//!
//! # Write modes (docs/sinks.md §7.1)
//! 1. `Append`: everything above; a rerun of a scan adds its lines after the earlier ones.
//! 2. `Overwrite`: a scan or query run writes `.<name>.tmp-<pipeline>` beside the file `path`
//!    leads to. When the run completes (`Sink::complete`) the file is fsynced and renamed over
//!    that file, then the directory is fsynced: readers see the old export or the new one,
//!    never a mix. An interrupted run keeps its temporary file and its position; the run that
//!    resumes it (`RunStart::Resumed`) continues the file (partial tail cut as above), and a
//!    fresh run (`RunStart::Fresh`) empties it first.
//! 3. `NewFilePerRun`: as `Overwrite`, but the completed file is renamed to
//!    `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside `path` (UTC, the time of completion; `-2`, `-3`,
//!    … after the timestamp if that name exists). With `Publish::Immediately` (streams and
//!    mirror runs, which never complete) the run writes that name (the time it started)
//!    directly.
//!
//! The run lock is `<path>.lock` in every mode.
//!
//! # Gzip
//! With `Compression::Gzip` each batch is written as one complete gzip member (RFC 1952
//! allows a file of several; `gzip -d` and `zcat` read them as one stream), so every
//! acknowledged batch is readable on its own and a crash can only leave a partial member at
//! the end. A resumed file is cut after its last complete member.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::batch::Batch;
use crate::files::{self, LockError, RunLock};
use crate::sink::{RunStart, Sink, SinkError, SinkErrorClass, Staged};

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonlTarget {
    /// Standard output.
    Stdout,
    /// A file (or, with rotation, the pattern of files).
    File(PathBuf),
}

/// Settings of the jsonl sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlSettings {
    /// Where to write.
    pub target: JsonlTarget,
    /// Rotate files once they reach this size.
    pub rotate_bytes: Option<u64>,
    /// `fdatasync` before acknowledging.
    pub fsync: bool,
    /// What a run does with the file of an earlier run (see the module docs).
    pub write: WriteMode,
    /// Whether the lines are gzip-compressed.
    pub compression: Compression,
}

/// What a run does with the output of earlier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Lines are added to the end of the file.
    Append,
    /// A completed run replaces the file at once (a temporary file, then a rename).
    Overwrite,
    /// Each run writes a new file named after a UTC timestamp.
    NewFilePerRun(Publish),
}

/// When a `NewFilePerRun` file gets its final name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Written under a temporary name, renamed when the run completes (scan, query).
    OnCompletion,
    /// Written under its final name from the start (streams, mirror: they never complete).
    Immediately,
}

/// How the lines are encoded in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain UTF-8 lines.
    None,
    /// One gzip member per batch.
    Gzip,
}

/// Where a temporary file goes when the run completes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    /// Renamed over this file.
    Over(PathBuf),
    /// Renamed to `<stem>.<timestamp><ext>` beside this path.
    Timestamped(PathBuf),
}

/// A run's temporary file and where it goes at completion.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    temp: PathBuf,
    destination: Destination,
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

fn io_error(sink: &str, path: &Path, action: &str, error: std::io::Error) -> SinkError {
    SinkError {
        sink: format!("jsonl {sink}"),
        message: format!("cannot {action} {}: {error}", path.display()),
        class: SinkErrorClass::Transient,
    }
}

/// `<stem>.<NNNNNN><ext>` beside `path`.
pub fn rotated_path(path: &Path, number: u32) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.{number:06}{ext}"))
}

/// The highest existing rotation number beside `path` (0 if none).
fn highest_rotation(path: &Path) -> std::io::Result<u32> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut highest = 0;
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        if let Some(number) = parse_rotation(path, &name.to_string_lossy()) {
            highest = highest.max(number);
        }
    }
    Ok(highest)
}

fn parse_rotation(path: &Path, name: &str) -> Option<u32> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let middle = name.strip_prefix(&format!("{stem}."))?.strip_suffix(&ext)?;
    (middle.len() == 6 && middle.bytes().all(|b| b.is_ascii_digit()))
        .then(|| middle.parse().ok())
        .flatten()
}

/// Opens `path` for appending, cutting a trailing partial line (a partial gzip member with
/// `Compression::Gzip`). Returns the file and its size.
fn open_append(path: &Path, compression: Compression) -> std::io::Result<(File, u64)> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    let len = file.metadata()?.len();
    let keep = match compression {
        Compression::None => complete_length(&mut file, len)?,
        Compression::Gzip => complete_gzip_length(&mut file)?,
    };
    if keep < len {
        file.set_len(keep)?;
        file.sync_data()?;
        tracing::warn!(
            file = %path.display(),
            cut_bytes = len - keep,
            "Cut a trailing partial line left by an interrupted write."
        );
    }
    // Writes go to the end (`O_APPEND`) whatever the read position is.
    Ok((file, keep))
}

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
fn lock_output(path: &Path, pipeline: &str) -> Result<Option<RunLock>, SinkError> {
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

/// The length of `file` up to and including its last newline.
fn complete_length(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let size = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk[..size])?;
        if let Some(pos) = chunk[..size].iter().rposition(|b| *b == b'\n') {
            return Ok(start + pos as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The length of the complete gzip members at the start of `file`.
fn complete_gzip_length(file: &mut File) -> std::io::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(&mut *file);
    let mut complete = 0;
    loop {
        if reader.fill_buf()?.is_empty() {
            return Ok(complete);
        }
        let mut member = flate2::bufread::GzDecoder::new(&mut reader);
        match std::io::copy(&mut member, &mut std::io::sink()) {
            Ok(_) => complete = reader.stream_position()?,
            Err(_) => return Ok(complete),
        }
    }
}

/// `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside `path` at `at`; with `attempt` > 1, `-<attempt>`
/// after the timestamp.
pub fn timestamped_path(path: &Path, at: time::OffsetDateTime, attempt: u32) -> PathBuf {
    let at = at.to_offset(time::UtcOffset::UTC);
    let stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    );
    let suffix = if attempt > 1 {
        format!("-{attempt}")
    } else {
        String::new()
    };
    let (stem, ext) = stem_and_ext(path);
    path.with_file_name(format!("{stem}.{stamp}{suffix}{ext}"))
}

/// The first `timestamped_path` at `at` that does not exist yet.
fn unused_timestamped_path(path: &Path, at: time::OffsetDateTime) -> PathBuf {
    let mut attempt = 1;
    loop {
        let candidate = timestamped_path(path, at, attempt);
        if std::fs::symlink_metadata(&candidate).is_err() {
            return candidate;
        }
        attempt += 1;
    }
}

fn stem_and_ext(path: &Path) -> (String, String) {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (stem, ext)
}

/// The temporary file of `pipeline` for the output `target`: `.<name>.tmp-<pipeline>` beside it.
pub fn temporary_path(target: &Path, pipeline: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.tmp-{pipeline}"))
}

/// Fsyncs the directory holding `path`, so a rename in it is durable.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

impl JsonlSink {
    /// Opens the target for `pipeline`: stdout, or the file (the highest rotation) for
    /// appending, or the run's temporary file, under the file's run lock (see the module docs).
    pub fn open(settings: JsonlSettings, pipeline: &str) -> Result<Self, SinkError> {
        let mut lock = None;
        let mut pending = None;
        let compression = settings.compression;
        let output = match (&settings.target, settings.write) {
            (JsonlTarget::Stdout, _) => Output::Stdout(std::io::stdout()),
            (JsonlTarget::File(path), WriteMode::Overwrite | WriteMode::NewFilePerRun(_)) => {
                let describe = path.display().to_string();
                let (actual, destination) = match settings.write {
                    WriteMode::Overwrite => {
                        let target = files::resolve(path);
                        if let Some(message) = overwrite_problem(path) {
                            return Err(SinkError {
                                sink: format!("jsonl {describe}"),
                                message,
                                class: SinkErrorClass::Definite,
                            });
                        }
                        (
                            temporary_path(&target, pipeline),
                            Some(Destination::Over(target)),
                        )
                    }
                    WriteMode::NewFilePerRun(Publish::OnCompletion) => (
                        temporary_path(path, pipeline),
                        Some(Destination::Timestamped(path.clone())),
                    ),
                    _ => (
                        unused_timestamped_path(path, time::OffsetDateTime::now_utc()),
                        None,
                    ),
                };
                lock = lock_output(path, pipeline)?;
                let (file, size) = open_append(&actual, compression)
                    .map_err(|e| io_error(&describe, &actual, "open", e))?;
                pending = destination.map(|destination| Pending {
                    temp: actual.clone(),
                    destination,
                });
                Output::File {
                    file,
                    path: actual,
                    size,
                    number: 0,
                }
            }
            (JsonlTarget::File(path), WriteMode::Append) => {
                let describe = path.display().to_string();
                lock = lock_output(path, pipeline)?;
                let number = match settings.rotate_bytes {
                    Some(_) => highest_rotation(path)
                        .map_err(|e| io_error(&describe, path, "list the directory of", e))?
                        .max(1),
                    None => 0,
                };
                let actual = if number > 0 {
                    rotated_path(path, number)
                } else {
                    path.clone()
                };
                let (file, size) = open_append(&actual, compression)
                    .map_err(|e| io_error(&describe, &actual, "open", e))?;
                Output::File {
                    file,
                    path: actual,
                    size,
                    number,
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
            Destination::Over(target) => target.clone(),
            Destination::Timestamped(base) => {
                unused_timestamped_path(base, time::OffsetDateTime::now_utc())
            }
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

#[cfg(test)]
mod tests {
    use ddbpipe_source::records::Lines;

    use super::*;

    fn batch(lines: &[&str]) -> Batch {
        let mut records = Lines::default();
        for line in lines {
            records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
        }
        Batch {
            records,
            ..Batch::default()
        }
    }

    fn settings(path: PathBuf, rotate_bytes: Option<u64>) -> JsonlSettings {
        JsonlSettings {
            target: JsonlTarget::File(path),
            rotate_bytes,
            fsync: true,
            write: WriteMode::Append,
            compression: Compression::None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_trailing_partial_line_is_cut_before_appending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/items.jsonl");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"a\":1}\n{\"b\":").unwrap();
        let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
        sink.write(&batch(&["{\"c\":3}"]), None).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"c\":3}\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_file_without_any_newline_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        std::fs::write(&path, "{\"half").unwrap();
        let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
        sink.write(&batch(&["x"]), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn rotation_opens_the_next_file_after_a_full_one_and_never_splits_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        let big = "x".repeat(700_000);
        let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576)), "p").unwrap();
        sink.write(&batch(&[&big]), None).await.unwrap();
        sink.write(&batch(&[&big]), None).await.unwrap(); // same file: it was below the size
        sink.write(&batch(&["small"]), None).await.unwrap(); // the first file is full now
        let first = dir.path().join("items.000001.jsonl");
        let second = dir.path().join("items.000002.jsonl");
        assert_eq!(std::fs::metadata(&first).unwrap().len(), 1_400_002);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\n");
        drop(sink);
        // A new run continues the highest-numbered file.
        let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576)), "p").unwrap();
        sink.write(&batch(&["again"]), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\nagain\n");
        assert!(!path.exists());
    }

    /// `O_APPEND`: a batch lands at the end of the file even when something else appended
    /// after the sink opened it (without it, the sink's own offset would overwrite that).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn writes_land_at_the_end_even_after_another_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
        sink.write(&batch(&["first"]), None).await.unwrap();
        let mut other = OpenOptions::new().append(true).open(&path).unwrap();
        other.write_all(b"other\n").unwrap();
        sink.write(&batch(&["mine"]), None).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "first\nother\nmine\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_second_writer_is_refused_naming_the_holder_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        let mut sink = JsonlSink::open(settings(path.clone(), None), "orders").unwrap();
        sink.write(&batch(&["{\"a\":1}"]), None).await.unwrap();
        // The holder is mid-line: the refused writer must not cut it.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"b\":")
            .unwrap();
        // Through a symlink too: the lock is beside the file the path leads to.
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        for second in [path.clone(), link] {
            let error = JsonlSink::open(settings(second, Some(1_048_576)), "refunds")
                .err()
                .expect("a second writer is refused")
                .to_string();
            assert!(
                error.contains("is being written by pipeline 'orders'"),
                "{error}"
            );
            assert!(
                error.contains(&format!("pid {}", std::process::id())),
                "{error}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"b\":"
        );
        drop(sink);
        assert!(JsonlSink::open(settings(path, None), "refunds").is_ok());
    }

    fn with(path: PathBuf, write: WriteMode, compression: Compression) -> JsonlSettings {
        JsonlSettings {
            write,
            compression,
            ..settings(path, None)
        }
    }

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn overwrite_keeps_the_old_file_until_completion_then_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        let mut sink = JsonlSink::open(
            with(path.clone(), WriteMode::Overwrite, Compression::None),
            "p",
        )
        .unwrap();
        sink.start(RunStart::Fresh).await.unwrap();
        sink.write(&batch(&["new1", "new2"]), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        sink.complete().await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new1\nnew2\n");
        drop(sink);
        assert_eq!(names(dir.path()), ["items.jsonl", "items.jsonl.lock"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_interrupted_overwrite_leaves_the_old_file_and_its_resume_continues() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        let settings = with(path.clone(), WriteMode::Overwrite, Compression::None);
        let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
        sink.start(RunStart::Fresh).await.unwrap();
        sink.write(&batch(&["a"]), None).await.unwrap();
        drop(sink); // interrupted: never completed
        let temp = dir.path().join(".items.jsonl.tmp-p");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&temp)
            .unwrap()
            .write_all(b"{\"half")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        // The resumed run continues the temporary file (its partial line cut).
        let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
        sink.start(RunStart::Resumed).await.unwrap();
        sink.write(&batch(&["b"]), None).await.unwrap();
        sink.complete().await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");
        assert!(!temp.exists());
        // A fresh run empties a left-over temporary file first.
        std::fs::write(&temp, "stale\n").unwrap();
        drop(sink);
        let mut sink = JsonlSink::open(settings, "p").unwrap();
        sink.start(RunStart::Fresh).await.unwrap();
        sink.write(&batch(&["c"]), None).await.unwrap();
        sink.complete().await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "c\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn new_file_per_run_publishes_a_timestamped_file_at_completion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        let settings = with(
            path.clone(),
            WriteMode::NewFilePerRun(Publish::OnCompletion),
            Compression::None,
        );
        let mut published = Vec::new();
        for line in ["one", "two"] {
            let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
            sink.start(RunStart::Fresh).await.unwrap();
            sink.write(&batch(&[line]), None).await.unwrap();
            assert_eq!(
                names(dir.path()).len(),
                2 + published.len(),
                "only the temp file, the lock and earlier runs' files"
            );
            sink.complete().await.unwrap();
            drop(sink);
            let new: Vec<String> = names(dir.path())
                .into_iter()
                .filter(|n| n != "items.jsonl.lock" && !published.contains(n))
                .collect();
            assert_eq!(new.len(), 1, "{new:?}");
            let name = new[0].clone();
            let stamp = name
                .strip_prefix("items.")
                .and_then(|n| n.strip_suffix(".jsonl"))
                .unwrap();
            assert!(
                stamp.starts_with("20") && stamp.as_bytes()[8] == b'T',
                "{name}"
            );
            assert!(
                stamp[..15].ends_with(|c: char| c.is_ascii_digit()),
                "{name}"
            );
            assert_eq!(&stamp[15..16], "Z", "{name}");
            assert_eq!(
                std::fs::read_to_string(dir.path().join(&name)).unwrap(),
                format!("{line}\n")
            );
            published.push(name);
        }
        assert!(!path.exists());
    }

    #[test]
    fn timestamped_names_are_utc_and_keep_the_extension() {
        let at = time::macros::datetime!(2025-03-04 05:06:07 +02:00);
        assert_eq!(
            timestamped_path(Path::new("out/orders.jsonl.gz"), at, 1),
            PathBuf::from("out/orders.jsonl.20250304T030607Z.gz")
        );
        assert_eq!(
            timestamped_path(Path::new("out/orders.jsonl"), at, 2),
            PathBuf::from("out/orders.20250304T030607Z-2.jsonl")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn gzip_output_decompresses_to_the_lines_and_a_partial_member_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl.gz");
        let settings = with(path.clone(), WriteMode::Overwrite, Compression::Gzip);
        let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
        sink.start(RunStart::Fresh).await.unwrap();
        sink.write(&batch(&["{\"a\":1}", "{\"b\":2}"]), None)
            .await
            .unwrap();
        drop(sink);
        // A crash in the middle of the next member.
        let temp = dir.path().join(".items.jsonl.gz.tmp-p");
        let mut half = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        half.write_all(b"lost\n").unwrap();
        let half = half.finish().unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&temp)
            .unwrap()
            .write_all(&half[..half.len() - 5])
            .unwrap();
        let mut sink = JsonlSink::open(settings, "p").unwrap();
        sink.start(RunStart::Resumed).await.unwrap();
        sink.write(&batch(&["{\"c\":3}"]), None).await.unwrap();
        sink.complete().await.unwrap();
        assert_eq!(gunzip(&path), "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_device_is_written_without_fdatasync_which_it_refuses() {
        let mut sink = JsonlSink::open(settings(PathBuf::from("/dev/null"), None), "p").unwrap();
        sink.write(&batch(&["{\"a\":1}"]), None).await.unwrap();
    }

    #[test]
    fn a_device_is_written_without_a_lock() {
        assert_eq!(output_lock_path(Path::new("/dev/null")), None);
    }

    #[test]
    fn rotated_names_keep_the_extension() {
        assert_eq!(
            rotated_path(Path::new("out/orders.jsonl"), 3),
            PathBuf::from("out/orders.000003.jsonl")
        );
        assert_eq!(
            parse_rotation(Path::new("out/orders.jsonl"), "orders.000012.jsonl"),
            Some(12)
        );
        assert_eq!(
            parse_rotation(Path::new("out/orders.jsonl"), "orders.12.jsonl"),
            None
        );
    }
}
