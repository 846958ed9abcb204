//! The `jsonl` sink: one JSON object per line, to stdout or to (rotated) files.
//!
//! # Durability (SPEC §7.1)
//! A batch is acknowledged after it is written and flushed and, with `fsync: true`, after
//! `fdatasync`, so the state file never runs ahead of the data.
//!
//! # Restart
//! Files are opened for appending and never truncated as a whole. A trailing partial line is
//! what a crash in the middle of a write leaves; it belonged to an unacknowledged batch, so it
//! is cut off before anything is appended.
//!
//! # Rotation
//! With `rotate_bytes`, files are `<stem>.<NNNNNN><ext>` beside `path`, from `000001`. When a
//! file reaches the size after a batch, the next batch opens the next number; a batch is never
//! split. A run continues the highest-numbered file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::batch::Batch;
use crate::checkpoint::Staged;
use crate::sink::{Sink, SinkError, SinkErrorClass};

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

/// Opens `path` for appending, cutting a trailing partial line. Returns the file and its size.
fn open_append(path: &Path) -> std::io::Result<(File, u64)> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let len = file.metadata()?.len();
    let keep = complete_length(&mut file, len)?;
    if keep < len {
        file.set_len(keep)?;
        file.sync_data()?;
        tracing::warn!(
            file = %path.display(),
            cut_bytes = len - keep,
            "Cut a trailing partial line left by an interrupted write."
        );
    }
    file.seek(SeekFrom::Start(keep))?;
    Ok((file, keep))
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

impl JsonlSink {
    /// Opens the target: stdout, or the file (the highest rotation) for appending.
    pub fn open(settings: JsonlSettings) -> Result<Self, SinkError> {
        let output = match &settings.target {
            JsonlTarget::Stdout => Output::Stdout(std::io::stdout()),
            JsonlTarget::File(path) => {
                let describe = path.display().to_string();
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
                let (file, size) =
                    open_append(&actual).map_err(|e| io_error(&describe, &actual, "open", e))?;
                Output::File {
                    file,
                    path: actual,
                    size,
                    number,
                }
            }
        };
        Ok(JsonlSink { settings, output })
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
                    let (new_file, new_size) =
                        open_append(&next).map_err(|e| io_error(&describe, &next, "open", e))?;
                    *file = new_file;
                    *path = next;
                    *size = new_size;
                }
                file.write_all(bytes)
                    .map_err(|e| io_error(&describe, path, "write", e))?;
                if fsync {
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
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_trailing_partial_line_is_cut_before_appending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/items.jsonl");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"a\":1}\n{\"b\":").unwrap();
        let mut sink = JsonlSink::open(settings(path.clone(), None)).unwrap();
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
        let mut sink = JsonlSink::open(settings(path.clone(), None)).unwrap();
        sink.write(&batch(&["x"]), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn rotation_opens_the_next_file_after_a_full_one_and_never_splits_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        let big = "x".repeat(700_000);
        let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576))).unwrap();
        sink.write(&batch(&[&big]), None).await.unwrap();
        sink.write(&batch(&[&big]), None).await.unwrap(); // same file: it was below the size
        sink.write(&batch(&["small"]), None).await.unwrap(); // the first file is full now
        let first = dir.path().join("items.000001.jsonl");
        let second = dir.path().join("items.000002.jsonl");
        assert_eq!(std::fs::metadata(&first).unwrap().len(), 1_400_002);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\n");
        drop(sink);
        // A new run continues the highest-numbered file.
        let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576))).unwrap();
        sink.write(&batch(&["again"]), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\nagain\n");
        assert!(!path.exists());
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
