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
//!
//! # Files of this module
//! `sink.rs` runs the sink; `names.rs` says which files a run writes (rotation numbers,
//! timestamps, temporary files); `append.rs` opens a file for appending and cuts a partial
//! tail; `lock.rs` holds the one-writer lock.

mod append;
mod lock;
mod names;
mod sink;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use self::lock::{output_lock_path, overwrite_problem};
pub use self::names::{
    Published, RunFiles, next_timestamped_path, rotated_path, run_files, temporary_path,
    timestamped_path, timestamped_pattern,
};
pub use self::sink::JsonlSink;

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
