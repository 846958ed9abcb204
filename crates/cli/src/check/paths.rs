//! The file probes of `check`: the jsonl output with its write mode, and whether a file can
//! be written or created where the run writes it (docs/cli.md §8.2 items 4 and 5).

use std::path::Path;

use ddbpipe_pipeline::files::{self, RunLock};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::sinks::jsonl;
use serde_json::json;

use super::{Probes, Status};
use crate::config::{JsonlConfig, JsonlTarget, PipelineConfig, WriteMode};

pub(super) fn probe_jsonl(config: &PipelineConfig, jsonl: &JsonlConfig, probes: &mut Probes) {
    let JsonlTarget::File(path) = &jsonl.path else {
        probes.add("sink", Status::Pass, "jsonl to stdout");
        return;
    };
    let shown = path.display();
    if jsonl.write == WriteMode::Overwrite
        && let Some(problem) = jsonl::overwrite_problem(path)
    {
        probes.add("sink", Status::Fail, format!("jsonl {shown}: {problem}"));
        return;
    }
    // The files exactly as the run names them (docs/sinks.md §7.1).
    let records = if config.source.mode.reads_stream() {
        Records::Envelopes
    } else {
        Records::Items
    };
    let settings = crate::sinks::jsonl::jsonl_settings(jsonl, records);
    let run_files = jsonl::run_files(path, settings.write, jsonl.rotate_bytes, &config.name);
    let run_files = match run_files {
        Ok(run_files) => run_files,
        Err(e) => {
            let dir = files::parent_of(path);
            let problem = format!("cannot list the directory {}: {e}", dir.display());
            probes.add("sink", Status::Fail, format!("jsonl {shown}: {problem}"));
            return;
        }
    };
    probes.add_with(
        "write_mode",
        Status::Pass,
        write_mode_detail(path, jsonl, &run_files),
        write_mode_json(path, jsonl, &run_files),
    );
    let lock = jsonl::output_lock_path(path);
    // The run opens `written` for appending, creating it (and its directory) when missing.
    let probed = match jsonl.write {
        WriteMode::Append => writable(&run_files.written),
        WriteMode::Overwrite | WriteMode::NewFilePerRun => creatable(&run_files.written),
    };
    let probed = probed.and_then(|detail| match &lock {
        Some(lock) => writable(lock).map(|_| detail),
        None => Ok(detail),
    });
    let detail = match probed {
        Ok(detail) => detail,
        Err(problem) => {
            probes.add("sink", Status::Fail, format!("jsonl {shown}: {problem}"));
            return;
        }
    };
    match lock.as_deref().and_then(RunLock::holder) {
        Some(holder) if holder.pipeline.as_deref() != Some(config.name.as_str()) => probes.add(
            "sink",
            Status::Fail,
            format!(
                "jsonl {shown}: is being written by pipeline '{}' (lock {}{}): give each \
                 pipeline its own sink.path, or wait for that run to finish",
                holder.pipeline.as_deref().unwrap_or("unknown"),
                lock.as_deref().unwrap_or(path).display(),
                holder.pid_suffix()
            ),
        ),
        Some(holder) => probes.add(
            "sink",
            Status::Warn,
            format!(
                "jsonl {shown}: {detail}; written now by this pipeline{}",
                holder.pid_suffix()
            ),
        ),
        None => probes.add("sink", Status::Pass, format!("jsonl {shown}: {detail}")),
    }
}

/// The `write_mode` probe's line: the mode and the files a run writes (docs/cli.md §8.2
/// item 4).
fn write_mode_detail(path: &Path, jsonl: &JsonlConfig, run_files: &jsonl::RunFiles) -> String {
    let written = run_files.written.display();
    let gzip = if jsonl.gzip { ", gzip" } else { "" };
    let files = match &run_files.published {
        None if jsonl.write == WriteMode::Append => format!("appends to {written}"),
        // Streams and mirror: the file gets its name when the run starts.
        None => format!(
            "writes {} named when the run starts (next: {})",
            jsonl::timestamped_pattern(path).display(),
            file_name(&run_files.written)
        ),
        Some(jsonl::Published::Over(target)) => format!(
            "writes {written}, renamed over {} when the run completes",
            target.display()
        ),
        Some(jsonl::Published::Timestamped(base)) => format!(
            "writes {written}, renamed to {} when the run completes (next: {})",
            jsonl::timestamped_pattern(base).display(),
            file_name(&jsonl::next_timestamped_path(base))
        ),
    };
    let resumes = if run_files.published.is_some() && run_files.written.exists() {
        "; the temporary file of an unfinished run exists: a resumed run continues it, a fresh \
         run empties it"
    } else {
        ""
    };
    format!("{}{gzip}: {files}{resumes}", jsonl.write.as_str())
}

/// The `write_mode` probe as JSON: `write`, `gzip`, `written`, and `published` (the file an
/// overwrite replaces) or `pattern` and `next` (the names of `new_file_per_run`).
fn write_mode_json(
    path: &Path,
    jsonl: &JsonlConfig,
    run_files: &jsonl::RunFiles,
) -> serde_json::Value {
    let mut files = json!({
        "gzip": jsonl.gzip,
        "write": jsonl.write.as_str(),
        "written": run_files.written,
    });
    match &run_files.published {
        None if jsonl.write == WriteMode::Append => {}
        None => files["pattern"] = json!(jsonl::timestamped_pattern(path)),
        Some(jsonl::Published::Over(target)) => files["published"] = json!(target),
        Some(jsonl::Published::Timestamped(base)) => {
            files["pattern"] = json!(jsonl::timestamped_pattern(base));
            files["next"] = json!(jsonl::next_timestamped_path(base));
        }
    }
    files
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether the run's temporary file `path` can be opened (it exists: an unfinished run's) or
/// created where the run creates it: it is created and removed again, so a name the file
/// system refuses, a directory in the way or a closed directory fails here as in the run.
fn creatable(path: &Path) -> Result<String, String> {
    if path.exists() || !files::parent_of(path).is_dir() {
        // An unfinished run's file, or a directory the run creates first.
        return writable(path);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    std::fs::remove_file(path)
        .map_err(|e| format!("cannot remove the probe {}: {e}", path.display()))?;
    Ok(format!(
        "{} can be created (and was removed again)",
        path.display()
    ))
}

/// Whether `path` can be opened for writing (it exists) or created, by real attempts that
/// change nothing: root passes permission bits, so only an attempt tells.
pub(super) fn writable(path: &Path) -> Result<String, String> {
    if path.is_dir() {
        return Err(format!("{} is a directory", path.display()));
    }
    if path.exists() {
        return std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(|_| "exists and is writable".to_string())
            .map_err(|e| format!("cannot open {} for writing: {e}", path.display()));
    }
    creatable_beside(path).map(|dir| format!("will be created (directory {dir} is writable)"))
}

/// Whether a file can be created in the directory of `path` (or, when that does not exist
/// yet, in the nearest existing one, where the run creates it): a temporary file is created
/// and removed. This is what replacing a file by rename, or SQLite's journal, needs.
pub(super) fn creatable_beside(path: &Path) -> Result<String, String> {
    let mut dir = files::parent_of(path);
    while !dir.exists() && dir.parent().is_some() {
        dir = files::parent_of(&dir);
    }
    tempfile::tempfile_in(&dir)
        .map(|_| dir.display().to_string())
        .map_err(|e| format!("directory {} is not writable: {e}", dir.display()))
}
