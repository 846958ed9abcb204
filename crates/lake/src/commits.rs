//! The commit log of a Parquet location (docs/sinks.md §7.10): what makes files part of the
//! output, and where the position lives.
//!
//! # Rules
//! 1. A commit is one JSON file `_ddbpipe/commits/<seq>.json` (20 digits), written last, after
//!    every data file it names: its pipeline, the entry (the state file's form of the
//!    position, `null` after a reset), the data files it added, and for a snapshot run its
//!    run directory and every file of the run so far.
//! 2. Data files are named `part-<seq>-<writer>-<n>.parquet` after the commit that will name
//!    them (the next one) and the run writing them (a random token: two runs never write one
//!    name). A file of the commit after the last one, or of the last one's number but not
//!    named by it, was written by a run that stopped before committing it: an orphan, deleted
//!    when the location is opened, so a reader globbing the files never counts a row twice
//!    once the next run started. A file of a later commit means the log was changed or lost:
//!    the run stops naming it and deletes nothing.
//! 3. A commit is created only if its name is free ([`Objects::create`]): of two runs writing
//!    one location, the second to commit a sequence number is refused and stops (fenced),
//!    deleting the files it wrote for it; nothing of them is named anywhere.
//! 4. The position is the last commit's entry: read back on start (as the Kafka sink reads
//!    its positions topic), never ahead of the files committed with it.
//! 5. The log keeps its last [`KEPT`] commits; older ones are deleted after a commit (the
//!    data files stay: a changelog's files are its history).

use serde::{Deserialize, Serialize};

use crate::objects::{Created, Objects};

/// Where the commits are.
pub const LOG: &str = "_ddbpipe/commits/";

/// Commits kept in the log (rule 5).
pub const KEPT: usize = 10;

/// One commit (rule 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Commit {
    /// Its sequence number, from 1.
    pub seq: u64,
    /// The pipeline whose output the location holds.
    pub pipeline: String,
    /// When it was written (RFC 3339).
    pub at: String,
    /// The position: the entry's JSON as the state file holds it; `null` after a reset.
    pub entry: Option<serde_json::Value>,
    /// The data files this commit added.
    pub files: Vec<DataFile>,
    /// A snapshot run's directory, while it runs and once it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<SnapshotRun>,
    /// How the files are partitioned, as `partition_by` says it (`[day(event_time)]`):
    /// a changelog keeps one layout (`parquet` rule 8); absent in commits written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<String>,
}

/// A scan, query or export run's directory and the files it committed so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRun {
    /// The directory under the location, named by the run's start (UTC).
    pub dir: String,
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// Every data file of the run committed so far.
    pub files: Vec<DataFile>,
    /// Set once its `_manifest.json` was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
}

/// A data file: its name under the location, rows and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// The name under the location.
    pub path: String,
    /// Rows it holds.
    pub rows: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its partition's values: the Iceberg sink's data file partition.
    #[serde(skip)]
    pub partition: Option<iceberg::spec::Struct>,
    /// Its columns' metrics: the Iceberg sink's data file bounds and counts.
    #[serde(skip)]
    pub metrics: Option<crate::metrics::FileMetrics>,
}

/// The name of commit `seq`.
pub fn commit_name(seq: u64) -> String {
    format!("{LOG}{seq:020}.json")
}

/// The sequence number in a data file's name (rule 2); `None` for other files.
pub fn file_seq(name: &str) -> Option<u64> {
    let file = name.rsplit('/').next()?;
    let rest = file.strip_prefix("part-")?.strip_suffix(".parquet")?;
    let mut parts = rest.split('-');
    let (seq, _writer, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    n.parse::<u32>().ok()?;
    seq.parse().ok()
}

/// The name of data file `n` of commit `seq` written by `writer` in directory `dir` (empty:
/// the root).
pub fn file_name(dir: &str, seq: u64, writer: &str, n: u32) -> String {
    let file = format!("part-{seq:020}-{writer}-{n:05}.parquet");
    if dir.is_empty() {
        file
    } else {
        format!("{dir}/{file}")
    }
}

/// A new writer's token for rule 2: 16 hex digits no other run draws.
pub fn writer_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// The last commit of the log; `None` when nothing was committed.
pub async fn last(objects: &Objects) -> Result<Option<Commit>, String> {
    let mut names = objects.list(LOG).await?;
    names.retain(|name| commit_seq(name).is_some());
    names.sort();
    let Some(name) = names.last() else {
        return Ok(None);
    };
    let bytes = objects
        .get(name)
        .await?
        .ok_or_else(|| format!("{} vanished while it was read", objects.name(name)))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("{} is not a commit: {e}", objects.name(name)))
}

/// Writes `commit` (rule 3): `Ok(false)` when its sequence number was committed by another
/// run, then prunes the log (rule 5).
pub async fn write(objects: &Objects, commit: &Commit) -> Result<bool, String> {
    let bytes = serde_json::to_vec_pretty(commit)
        .map_err(|e| format!("internal error: a commit is not JSON: {e}"))?;
    if objects.create(&commit_name(commit.seq), bytes).await? == Created::Taken {
        return Ok(false);
    }
    if let Some(oldest_kept) = commit.seq.checked_sub(KEPT as u64) {
        for name in objects.list(LOG).await? {
            if commit_seq(&name).is_some_and(|seq| seq <= oldest_kept) {
                objects.delete(&name).await?;
            }
        }
    }
    Ok(true)
}

/// The data files of `names` no commit names (rule 2): those of the commit after `last`, and
/// those of `last`'s number it does not name. A file of a later commit cannot come from a run
/// that stopped: the log was changed or lost, and nothing is deleted (the problem names it).
pub fn orphans(names: &[String], last: Option<&Commit>) -> Result<Vec<String>, String> {
    let seq = last.map_or(0, |c| c.seq);
    let named = |name: &str| last.is_some_and(|c| c.files.iter().any(|f| f.path == name));
    let mut orphans = Vec::new();
    for name in names {
        match file_seq(name) {
            Some(of) if of > seq + 1 => {
                return Err(format!(
                    "{name} belongs to commit {of} but the commit log ends at {seq}: the log \
                     ({LOG}) was changed or lost; move the data files away or give the pipeline \
                     another location"
                ));
            }
            Some(of) if of == seq + 1 || (of == seq && !named(name)) => {
                orphans.push(name.clone());
            }
            _ => {}
        }
    }
    Ok(orphans)
}

fn commit_seq(name: &str) -> Option<u64> {
    name.strip_prefix(LOG)?.strip_suffix(".json")?.parse().ok()
}

/// A run directory's name: its start in UTC to the millisecond (`20261205T031038.123Z`).
pub fn run_dir(at: time::OffsetDateTime) -> String {
    let format = time::macros::format_description!(
        "[year][month][day]T[hour][minute][second].[subsecond digits:3]Z"
    );
    at.format(&format)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}

/// The scan completion a loaded position records (`parquet` rule 4).
pub fn completed(entry: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    entry
        .and_then(|e| e.get("last_completed"))
        .filter(|completed| !completed.is_null())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(seq: u64) -> Commit {
        Commit {
            seq,
            pipeline: "p".into(),
            at: "2026-12-05T00:00:00Z".into(),
            entry: None,
            files: vec![],
            run: None,
            partitioning: None,
        }
    }

    #[test]
    fn data_file_names_carry_their_commit() {
        let writer = writer_token();
        assert_eq!(writer.len(), 16);
        assert_ne!(writer, writer_token());
        assert_eq!(
            file_seq(&file_name("event_time_day=2026-12-05", 7, &writer, 2)),
            Some(7)
        );
        assert_eq!(file_seq(&file_name("", 12, &writer, 0)), Some(12));
        assert_eq!(file_seq("_ddbpipe/commits/00000000000000000001.json"), None);
        assert_eq!(file_seq("run/_manifest.json"), None);
        assert_eq!(file_seq("part-x-a-1.parquet"), None);
    }

    #[tokio::test]
    async fn the_last_commit_is_the_position_and_a_taken_number_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let objects = Objects::Local(dir.path().to_path_buf());
        assert_eq!(last(&objects).await, Ok(None));
        for seq in 1..=12 {
            assert_eq!(write(&objects, &commit(seq)).await, Ok(true));
        }
        assert_eq!(write(&objects, &commit(12)).await, Ok(false), "rule 3");
        assert_eq!(last(&objects).await.map(|c| c.map(|c| c.seq)), Ok(Some(12)));
        let kept = objects.list(LOG).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kept.len(), KEPT, "rule 5: {kept:?}");
    }

    #[test]
    fn files_no_commit_names_are_orphans() {
        let kept_1 = file_name("a", 1, "w1", 0);
        let kept_2 = file_name("b", 2, "w1", 0);
        let fenced = file_name("b", 2, "w2", 0);
        let next = file_name("b", 3, "w1", 0);
        let names = vec![kept_1.clone(), kept_2.clone(), fenced.clone(), next.clone()];
        let mut last = commit(2);
        last.files.push(DataFile {
            path: kept_2,
            rows: 1,
            bytes: 1,
            partition: None,
            metrics: None,
        });
        assert_eq!(orphans(&names, Some(&last)), Ok(vec![fenced, next]));
        // A file of a commit after the next one: the log was changed; nothing is deleted.
        let problem = orphans(&[file_name("c", 4, "w1", 0)], Some(&last)).unwrap_err();
        assert!(
            problem.contains("belongs to commit 4 but the commit log ends at 2"),
            "{problem}"
        );
        let lost = orphans(&[kept_1], None).map(|o| o.len());
        assert_eq!(lost, Ok(1), "a first run's files before its first commit");
    }
}
