//! Which files a run writes: rotation numbers, timestamped names and temporary files.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{Publish, WriteMode};
use crate::files;

/// The files a run writes to the output `path` (docs/sinks.md §7.1): what `JsonlSink::open`
/// opens, and what `check` shows and probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFiles {
    /// The file the lines are written to during the run.
    pub written: PathBuf,
    /// Its rotation number (`write: append` with `rotate_bytes`), else 0.
    pub rotation: u32,
    /// Where `written` goes when the run completes; `None` when it is written in place.
    pub published: Option<Published>,
}

/// Where a run's temporary file goes when the run completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// Renamed over this file (`write: overwrite`; the file `path` leads to).
    Over(PathBuf),
    /// Renamed to `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside this path, at the time of
    /// completion (`write: new_file_per_run`).
    Timestamped(PathBuf),
}

/// The files a run of `pipeline` writes to `path` with `write` and `rotate_bytes`, if it
/// started now. Lists the directory for the rotation number or a free timestamped name.
pub fn run_files(
    path: &Path,
    write: WriteMode,
    rotate_bytes: Option<u64>,
    pipeline: &str,
) -> std::io::Result<RunFiles> {
    let now = time::OffsetDateTime::now_utc();
    Ok(match write {
        WriteMode::Append => {
            let rotation = match rotate_bytes {
                Some(_) => highest_rotation(path)?.max(1),
                None => 0,
            };
            let written = if rotation > 0 {
                rotated_path(path, rotation)
            } else {
                path.to_path_buf()
            };
            RunFiles {
                written,
                rotation,
                published: None,
            }
        }
        WriteMode::Overwrite => {
            let target = files::resolve(path);
            RunFiles {
                written: temporary_path(&target, pipeline),
                rotation: 0,
                published: Some(Published::Over(target)),
            }
        }
        WriteMode::NewFilePerRun(Publish::OnCompletion) => RunFiles {
            written: temporary_path(path, pipeline),
            rotation: 0,
            published: Some(Published::Timestamped(path.to_path_buf())),
        },
        WriteMode::NewFilePerRun(Publish::Immediately) => RunFiles {
            written: unused_timestamped_path(path, now),
            rotation: 0,
            published: None,
        },
    })
}

/// The name a `new_file_per_run` run completing now would publish beside `path`.
pub fn next_timestamped_path(path: &Path) -> PathBuf {
    unused_timestamped_path(path, time::OffsetDateTime::now_utc())
}

/// The pattern of the names `new_file_per_run` publishes beside `path`, for messages:
/// `<stem>.<YYYYMMDDTHHMMSSZ><ext>`.
pub fn timestamped_pattern(path: &Path) -> PathBuf {
    let (stem, ext) = stem_and_ext(path);
    path.with_file_name(format!("{stem}.<YYYYMMDDTHHMMSSZ>{ext}"))
}

/// `<stem>.<NNNNNN><ext>` beside `path`.
pub fn rotated_path(path: &Path, number: u32) -> PathBuf {
    let (stem, ext) = stem_and_ext(path);
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

pub(super) fn parse_rotation(path: &Path, name: &str) -> Option<u32> {
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
pub(super) fn unused_timestamped_path(path: &Path, at: time::OffsetDateTime) -> PathBuf {
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
pub(super) fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}
