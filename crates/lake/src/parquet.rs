//! The Parquet sink (docs/sinks.md §7.10): rows into Parquet files on S3 or in a directory,
//! committed through the location's commit log (`commits`), which also keeps the position.
//!
//! # Rules
//! 1. Batches are held in open Parquet files, one per partition, and acknowledged at once;
//!    nothing is part of the output until a commit names it. A file rolls (is closed and
//!    written out under its final name) at `target_file_bytes`.
//! 2. A commit happens when a file rolled, when `commit_interval` passed since the first
//!    batch it holds (checked at each batch and every second between them), and whenever the
//!    run writes its position outside a batch (its start, the end of a snapshot, a stop): the
//!    open files roll, then the commit is written with the last batch's entry.
//! 3. The position store ([`ParquetPositions`]) commits with the batches: it is the same
//!    writer, so the position a commit holds is the one its files reach, never ahead.
//! 4. Layouts: items (scan, query, export) go into a directory per run under the location,
//!    named by the run's start (UTC); the run's completion writes `<run>/_manifest.json`
//!    (its files and rows) before the commit that clears the position. A resumed run writes
//!    on into its directory. Envelopes (streams, mirror) are the changelog at the location's
//!    root. Under either, a file is in its partition's directory (`partition` rule 5: changes
//!    by default `event_time_day=YYYY-MM-DD/`).
//! 5. A write or a commit that fails, or a commit made by another run first (`commits` rule
//!    3), fails the run and breaks the writer: what its open files hold may no longer match the
//!    last batch's entry, so nothing more is committed (not even at the run's end); the files
//!    written for the next commit stay orphans that the next start deletes, and the next run
//!    resumes from the last commit.
//! 6. A run claims the location when it loads its position: its first commit holds the last
//!    commit's position and no file (a run of the pipeline still writing there is fenced at its
//!    next commit, its files never named), and only then are the files no commit names deleted
//!    (`commits` rule 2). A store outside a run (`state show`, `lag`, `check`) claims and
//!    deletes nothing.
//! 7. With an Iceberg table (`iceberg` rules), its snapshots are the commits and hold the
//!    position; there is no commit log, no run directory and no `_manifest.json`, and data
//!    files go under the table's `data/`, in their partition's directory.
//! 8. A changelog keeps one layout: each commit records the partitioning its files have, and
//!    a run partitioning otherwise than the last commit says is refused when it loads (as
//!    `check` refuses it), naming both — its files would sit where the documented queries do
//!    not look. A snapshot run may change it: each run has its directory and manifest. A
//!    store outside a run carries the last commit's partitioning on.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::sink::{Records, RunStart, Sink, SinkError, SinkErrorClass, Staged};
use ddbpipe_pipeline::state::{Entry, StateError};
use ddbpipe_source::clock::now_rfc3339;
use futures_util::future::BoxFuture;
use serde_json::json;
use tokio::sync::Mutex;

use crate::commits::{self, Commit, DataFile, SnapshotRun};
use crate::failure::Failure;
use crate::iceberg::{IcebergSettings, IcebergTable};
use crate::objects::Objects;
use crate::rows::Shape;

use crate::metrics::FileMetrics;
pub use file::FileCompression;
use file::{OpenFile, open_file};

/// What a Parquet sink is opened with.
#[derive(Debug, Clone)]
pub struct ParquetSettings {
    /// Where its files go.
    pub objects: Objects,
    /// The pipeline whose output it holds.
    pub pipeline: String,
    /// The columns.
    pub shape: Shape,
    /// Roll a file at this size (rule 1).
    pub target_file_bytes: usize,
    /// Commit at least this often while batches come (rule 2).
    pub commit_interval: Duration,
    /// How the files' pages are compressed.
    pub compression: FileCompression,
    /// An Iceberg table the files are committed to (docs/sinks.md §7.11), in the warehouse
    /// `objects` is; `None`: the commit log under `objects` (rule 7).
    pub iceberg: Option<IcebergSettings>,
}

/// The Parquet sink.
pub struct ParquetSink {
    writer: Arc<Mutex<Writer>>,
    ticker: tokio::task::JoinHandle<()>,
    target: String,
}

/// The position store of a Parquet sink: its commit log (rule 3).
#[derive(Clone)]
pub struct ParquetPositions {
    writer: Arc<Mutex<Writer>>,
    target: String,
}

impl std::fmt::Debug for ParquetPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParquetPositions({})", self.target)
    }
}

impl ParquetSink {
    /// Opens the sink and its position store; nothing is read or written until the run
    /// loads its position.
    pub fn open(settings: ParquetSettings) -> (ParquetSink, ParquetPositions) {
        let target = target(&settings);
        let writer = Arc::new(Mutex::new(Writer::new(settings, true)));
        let ticker = tokio::spawn(tick(Arc::downgrade(&writer)));
        let positions = ParquetPositions {
            writer: writer.clone(),
            target: target.clone(),
        };
        (
            ParquetSink {
                writer,
                ticker,
                target,
            },
            positions,
        )
    }
}

impl ParquetPositions {
    /// The store of `settings` outside a run (`state show`, `state reset`, `check`).
    pub fn reading(settings: ParquetSettings) -> ParquetPositions {
        ParquetPositions {
            target: target(&settings),
            writer: Arc::new(Mutex::new(Writer::new(settings, false))),
        }
    }
}

impl Drop for ParquetSink {
    fn drop(&mut self) {
        self.ticker.abort();
    }
}

/// Rule 2's clock between batches: commits what waited `commit_interval`.
async fn tick(writer: std::sync::Weak<Mutex<Writer>>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(writer) = writer.upgrade() else {
            return;
        };
        let mut writer = writer.lock().await;
        if writer.due()
            && let Err(failure) = writer.commit_held().await
        {
            writer.failed = Some(failure);
        }
    }
}

impl Sink for ParquetSink {
    async fn write(&mut self, batch: &Batch, staged: Option<&Staged>) -> Result<(), SinkError> {
        let mut writer = self.writer.lock().await;
        writer
            .write(batch, staged)
            .await
            .map_err(|f| f.error(&self.target))
    }

    async fn start(&mut self, start: RunStart) -> Result<(), SinkError> {
        self.writer.lock().await.start(start);
        Ok(())
    }

    fn describe(&self) -> String {
        self.target.clone()
    }
}

impl CheckpointStore for ParquetPositions {
    fn describe(&self) -> String {
        self.target.clone()
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
        Box::pin(async move {
            let mut writer = self.writer.lock().await;
            let json = writer.load(pipeline).await.map_err(|f| self.failed(f))?;
            json.map(|json| Entry::from_json(&json, pipeline, Path::new(&self.target)))
                .transpose()
        })
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            let mut writer = self.writer.lock().await;
            if writer.last.is_none() {
                writer.load(pipeline).await.map_err(|f| self.failed(f))?;
            }
            writer.commit(entry).await.map_err(|f| self.failed(f))
        })
    }

    fn commits_with_batches(&self) -> bool {
        true
    }

    fn commit_held(&mut self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async move {
            let mut writer = self.writer.lock().await;
            if let Some(failed) = writer.failed.take() {
                return Err(self.failed(failed));
            }
            writer.commit_held().await.map_err(|f| self.failed(f))
        })
    }
}

impl ParquetPositions {
    fn failed(&self, failure: Failure) -> StateError {
        StateError::Database {
            store: self.target.clone(),
            message: failure.message,
        }
    }
}

/// The sink for messages.
fn target(settings: &ParquetSettings) -> String {
    match &settings.iceberg {
        Some(iceberg) => format!("iceberg {}.{}", iceberg.namespace, iceberg.table),
        None => format!("parquet {}", settings.objects.describe()),
    }
}

/// What the sink and its store share.
struct Writer {
    settings: ParquetSettings,
    /// The last commit's sequence number, once the log was read.
    last: Option<u64>,
    /// The snapshot run being written (items, rule 4).
    run: Option<SnapshotRun>,
    /// The open files by partition, reached through `&mut self` only (`files`): a Parquet
    /// writer may be sent between threads but not shared, and the writer is awaited through
    /// `&self`.
    open: std::sync::Mutex<BTreeMap<String, OpenFile>>,
    /// Files written out for the next commit.
    written: Vec<DataFile>,
    /// The last batch's entry, not committed yet.
    held: Option<Entry>,
    /// When the first batch the next commit holds was written.
    since: Option<Instant>,
    /// A commit between batches that failed: the next batch fails with it.
    failed: Option<Failure>,
    /// Rule 5: a write or commit failed; nothing more is committed.
    broken: bool,
    /// This writer's part of its files' names (`commits` rule 2).
    token: String,
    /// The last scan completion the loaded position recorded: a run's entry recording
    /// another one completes its run (rule 4).
    completed_before: Option<serde_json::Value>,
    /// A run's writer (rule 6): it claims the log when it loads it, and deletes the orphans.
    /// `false`: a store outside a run (`state`, `lag`, `check`), which deletes nothing.
    runs: bool,
    /// The Iceberg table the commits go to (rule 7).
    iceberg: Option<IcebergTable>,
    /// The partitioning its commits record (rule 8).
    layout: Option<String>,
}

impl Writer {
    fn new(settings: ParquetSettings, runs: bool) -> Writer {
        let token = commits::writer_token();
        let iceberg = settings.iceberg.clone().map(|iceberg| {
            IcebergTable::new(iceberg, &settings.objects, &settings.pipeline, &token)
        });
        Writer {
            settings,
            iceberg,
            runs,
            last: None,
            run: None,
            open: std::sync::Mutex::new(BTreeMap::new()),
            written: Vec::new(),
            held: None,
            since: None,
            failed: None,
            broken: false,
            completed_before: None,
            token,
            layout: None,
        }
    }

    fn objects(&self) -> &Objects {
        &self.settings.objects
    }

    fn files(&mut self) -> &mut BTreeMap<String, OpenFile> {
        self.open
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the last commit (`commits` rule 4) and deletes the orphans after it (rule 2).
    async fn load(&mut self, pipeline: &str) -> Result<Option<serde_json::Value>, Failure> {
        if let Some(table) = &mut self.iceberg {
            let loaded = table.load(&self.settings.shape, self.runs).await?;
            self.last = Some(loaded.seq);
            self.run = loaded.run;
            self.completed_before = commits::completed(loaded.entry.as_ref());
            return Ok(loaded.entry);
        }
        let last = commits::last(self.objects())
            .await
            .map_err(Failure::transient)?;
        if let Some(commit) = &last
            && commit.pipeline != pipeline
        {
            return Err(Failure::definite(format!(
                "{} holds the output of pipeline '{}'; give pipeline '{pipeline}' a location of \
                 its own",
                self.objects().describe(),
                commit.pipeline
            )));
        }
        let mut seq = last.as_ref().map_or(0, |c| c.seq);
        // A log that was changed or lost stops `check` and `state` as it stops a run.
        let orphans = self.orphans(last.as_ref()).await?;
        self.layout = last.as_ref().and_then(|c| c.partitioning.clone());
        if self.runs {
            layout_kept(
                &self.settings.shape,
                last.as_ref(),
                &self.objects().describe(),
            )
            .map_err(Failure::definite)?;
            self.layout = Some(self.settings.shape.partitioning().to_string());
            seq = self.claim(last.as_ref(), pipeline).await?;
            self.delete(&orphans).await?;
        }
        self.last = Some(seq);
        self.run = last.as_ref().and_then(|c| c.run.clone());
        let entry = last.and_then(|c| c.entry);
        self.completed_before = commits::completed(entry.as_ref());
        Ok(entry)
    }

    /// Rule 6: the run's first commit, holding `last`'s position and no file; its number.
    async fn claim(&self, last: Option<&Commit>, pipeline: &str) -> Result<u64, Failure> {
        let claim = Commit {
            seq: last.map_or(0, |c| c.seq) + 1,
            pipeline: pipeline.to_string(),
            at: now_rfc3339(),
            entry: last.and_then(|c| c.entry.clone()),
            files: Vec::new(),
            run: last.and_then(|c| c.run.clone()),
            partitioning: self.layout.clone(),
        };
        if !commits::write(self.objects(), &claim)
            .await
            .map_err(Failure::transient)?
        {
            return Err(Failure {
                message: format!(
                    "another run of pipeline '{pipeline}' started on {} at the same moment \
                     (commit {}); this one stops",
                    self.objects().describe(),
                    claim.seq
                ),
                class: SinkErrorClass::Fenced,
            });
        }
        Ok(claim.seq)
    }

    /// The files no commit names (`commits` rule 2); refused when the log was changed or lost.
    async fn orphans(&self, last: Option<&Commit>) -> Result<Vec<String>, Failure> {
        let names = self.objects().list("").await.map_err(Failure::transient)?;
        commits::orphans(&names, last).map_err(|problem| {
            Failure::definite(format!("{}: {problem}", self.objects().describe()))
        })
    }

    /// Rule 6: once the log is claimed, the orphans are deleted.
    async fn delete(&self, orphans: &[String]) -> Result<(), Failure> {
        for orphan in orphans {
            self.objects()
                .delete(orphan)
                .await
                .map_err(Failure::transient)?;
        }
        if !orphans.is_empty() {
            tracing::info!(
                location = %self.objects().describe(),
                orphans = orphans.len(),
                "Deleted data files no commit names (a run stopped before committing them)."
            );
        }
        Ok(())
    }

    /// Rule 4: a fresh scan run gets a directory of its own; a resumed one keeps its own.
    fn start(&mut self, start: RunStart) {
        if self.settings.shape.records() != Records::Items {
            return;
        }
        let resumable = self.run.as_ref().is_some_and(|r| r.completed_at.is_none());
        if start == RunStart::Resumed && resumable {
            return;
        }
        let now = time::OffsetDateTime::now_utc();
        self.run = Some(SnapshotRun {
            dir: commits::run_dir(now),
            started_at: now_rfc3339(),
            files: Vec::new(),
            completed_at: None,
        });
    }

    async fn write(&mut self, batch: &Batch, staged: Option<&Staged>) -> Result<(), Failure> {
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        self.usable()?;
        let written = self.append(batch, staged).await;
        self.broken |= written.is_err();
        written
    }

    /// Rule 5: nothing is written or committed once a write or commit failed.
    fn usable(&self) -> Result<(), Failure> {
        if self.broken {
            return Err(Failure::transient(format!(
                "an earlier write or commit to {} failed: nothing more is committed by this \
                 run; the next run resumes from the last commit",
                self.objects().describe()
            )));
        }
        Ok(())
    }

    async fn append(&mut self, batch: &Batch, staged: Option<&Staged>) -> Result<(), Failure> {
        let parts = self
            .settings
            .shape
            .parts(batch)
            .map_err(Failure::definite)?;
        let mut rolled = false;
        for part in parts {
            let (shape, compression) = (&self.settings.shape, self.settings.compression);
            let open = self
                .open
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let dir = &part.partition.dir;
            let file = match open.get_mut(dir) {
                Some(file) => file,
                None => open.entry(dir.clone()).or_insert(open_file(
                    shape,
                    compression,
                    part.partition.values,
                )?),
            };
            file.writer
                .write(&part.rows)
                .map_err(|e| Failure::definite(format!("cannot encode Parquet: {e}")))?;
            file.rows += part.rows.num_rows() as u64;
            let size = file.writer.bytes_written() + file.writer.in_progress_size();
            if size >= self.settings.target_file_bytes {
                self.roll(&part.partition.dir).await?;
                rolled = true;
            }
        }
        if let Some(staged) = staged {
            self.held = Some(staged.entry.clone());
        }
        self.since.get_or_insert_with(Instant::now);
        if rolled || self.due() {
            self.commit_held().await?;
        }
        Ok(())
    }

    /// Rule 2: batches wait past the interval.
    fn due(&self) -> bool {
        self.since
            .is_some_and(|since| since.elapsed() >= self.settings.commit_interval)
            && self.held.is_some()
    }

    /// Commits what the batches since the last commit hold, with the last one's entry.
    async fn commit_held(&mut self) -> Result<(), Failure> {
        // Rule 5: a broken writer's batches are given up (the run reports what broke it).
        let Some(entry) = self.held.clone().filter(|_| !self.broken) else {
            return Ok(());
        };
        self.commit(Some(&entry)).await
    }

    /// Closes the file of partition directory `partition` and writes it out under its name
    /// (rule 1).
    async fn roll(&mut self, partition: &str) -> Result<(), Failure> {
        let Some(file) = self.files().remove(partition) else {
            return Ok(());
        };
        let mut writer = file.writer;
        let footer = writer
            .finish()
            .map_err(|e| Failure::definite(format!("cannot finish a Parquet file: {e}")))?;
        // The finished file: the footer is written, nothing more will be.
        let bytes = std::mem::take(writer.inner_mut());
        // An Iceberg data file carries its columns' metrics (§7.11 rule 9).
        let metrics = self.iceberg.is_some().then(|| FileMetrics::of(&footer));
        let next = self.last.unwrap_or(0) + 1;
        let items = self.settings.shape.records() == Records::Items;
        let under = match (&self.iceberg, &self.run) {
            (Some(table), _) => table.data_dir(),
            (None, Some(run)) if items => run.dir.clone(),
            (None, _) => String::new(),
        };
        let dir = [under.as_str(), partition]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        let name = commits::file_name(&dir, next, &self.token, self.written.len() as u32);
        let size = bytes.len() as u64;
        self.objects()
            .put(&name, bytes)
            .await
            .map_err(Failure::transient)?;
        self.written.push(DataFile {
            path: name,
            rows: file.rows,
            bytes: size,
            partition: Some(file.values),
            metrics,
        });
        Ok(())
    }

    /// Rule 2: the open files roll, a completed snapshot run gets its manifest (rule 4), then
    /// the commit is written with `entry`.
    async fn commit(&mut self, entry: Option<&Entry>) -> Result<(), Failure> {
        self.usable()?;
        let committed = self.commit_files(entry).await;
        self.broken |= committed.is_err();
        committed
    }

    async fn commit_files(&mut self, entry: Option<&Entry>) -> Result<(), Failure> {
        let partitions: Vec<_> = self.files().keys().cloned().collect();
        for partition in partitions {
            self.roll(&partition).await?;
        }
        let seq = self.last.unwrap_or(0) + 1;
        let items = self.settings.shape.records() == Records::Items;
        let mut run = self.run.clone().filter(|_| items);
        // Rule 4: the commit that completes the run (a completed run's later commits hold its
        // position only).
        let open = run.as_ref().filter(|run| run.completed_at.is_none());
        let completes = open.is_some()
            && entry.is_some_and(|e| {
                e.position.is_none()
                    && e.last_completed.is_some()
                    && e.last_completed != self.completed_before
            });
        if let Some(table) = &mut self.iceberg {
            // Rule 7: one snapshot; a completed run's later commits go to `main`.
            table
                .commit(&self.written, entry, seq, open, completes)
                .await?;
            if let Some(run) = run.as_mut().filter(|_| completes) {
                run.completed_at = Some(now_rfc3339());
            }
            return self.committed(seq, run);
        }
        if let Some(run) = &mut run {
            run.files.extend(self.written.iter().cloned());
            if completes {
                let now = now_rfc3339();
                self.write_manifest(run, &now).await?;
                run.completed_at = Some(now);
            }
        }
        let commit = Commit {
            seq,
            pipeline: self.settings.pipeline.clone(),
            at: now_rfc3339(),
            entry: entry.map(Entry::to_json),
            files: self.written.clone(),
            run: run.clone(),
            partitioning: self.layout.clone(),
        };
        let written = commits::write(self.objects(), &commit)
            .await
            .map_err(Failure::transient)?;
        if !written {
            // Its files are named by no commit: gone now rather than at the next start.
            for file in std::mem::take(&mut self.written) {
                let _ = self.objects().delete(&file.path).await;
            }
            return Err(Failure {
                message: format!(
                    "another run of pipeline '{}' committed to {} first (commit {seq}); this run \
                     stops, its last batches uncommitted",
                    self.settings.pipeline,
                    self.objects().describe()
                ),
                class: SinkErrorClass::Fenced,
            });
        }
        self.committed(seq, run)
    }

    /// What a commit leaves: its number, its run; nothing held.
    fn committed(&mut self, seq: u64, run: Option<SnapshotRun>) -> Result<(), Failure> {
        tracing::debug!(seq, files = self.written.len(), "Committed to the lake.");
        self.last = Some(seq);
        self.run = run.or(self.run.take());
        self.written.clear();
        self.held = None;
        self.since = None;
        Ok(())
    }

    /// Rule 4: `<run>/_manifest.json`, the run's files and rows.
    async fn write_manifest(&self, run: &SnapshotRun, completed_at: &str) -> Result<(), Failure> {
        let rows: u64 = run.files.iter().map(|f| f.rows).sum();
        let columns: Vec<&str> = self
            .settings
            .shape
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let manifest = json!({
            "pipeline": self.settings.pipeline,
            "run": run.dir,
            "started_at": run.started_at,
            "completed_at": completed_at,
            "rows": rows,
            "columns": columns,
            "files": run.files,
        });
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Failure::definite(format!("internal error: {e}")))?;
        self.objects()
            .put(&format!("{}/_manifest.json", run.dir), bytes)
            .await
            .map_err(Failure::transient)
    }
}

/// Rule 8: a changelog at `place` whose last commit is `last` keeps its partitioning.
fn layout_kept(shape: &Shape, last: Option<&Commit>, place: &str) -> Result<(), String> {
    let Some(before) = last.and_then(|c| c.partitioning.as_deref()) else {
        return Ok(());
    };
    let now = shape.partitioning().to_string();
    if shape.records() == Records::Items || before == now {
        return Ok(());
    }
    Err(format!(
        "{place} holds a changelog partitioned by {before}, the sink partitions by {now} \
         (sink.partition_by): give partition_by back that value, or the sink a new path"
    ))
}

/// `check`'s probe of a parquet location (no Iceberg table) for a run of `shape`: its commit
/// log read, and rule 8 applied as the run applies it.
pub async fn probe(objects: &Objects, shape: &Shape) -> Result<(), String> {
    let last = commits::last(objects).await?;
    layout_kept(shape, last.as_ref(), &objects.describe())
}

mod file;
#[cfg(test)]
mod tests;
