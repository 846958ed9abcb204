//! A Parquet destination's rows, read back after its phase (not timed): what its commit log
//! says it committed, checked against the files themselves, read with the `parquet` crate's
//! Arrow reader.
//!
//! # Counting
//! 1. A load (a snapshot): the last commit names the run, completed; the run directory's
//!    `_manifest.json` gives its rows and files. Every file it names is read back and must hold
//!    the rows it says; together they must hold the manifest's rows, and the run directory
//!    must hold no other data file. The count is the manifest's rows.
//! 2. A stream (the changelog, one row per change record): every data file under the location
//!    must be committed — none is an orphan (`commits::orphans`: one of the next commit, or of
//!    the last commit's number that it does not name). The log keeps only its last commits
//!    (`commits::KEPT`): a file of an older commit was named by a commit pruned since. Each
//!    file a kept commit names must hold the rows it says. The count is the rows of every
//!    file, read back.
//! 3. An Iceberg table (a load or a stream): the data files its current snapshot names, read
//!    back, and no other; see [`iceberg_rows`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, ensure};
use ddbpipe_lake::commits::{self, Commit, DataFile};
use ddbpipe_lake::iceberg::{self, IcebergSettings, SqlCatalog};
use ddbpipe_lake::objects::Objects;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Rule 1: the rows of the completed snapshot run in `dir`.
pub async fn snapshot_rows(dir: &Path) -> anyhow::Result<u64> {
    let objects = Objects::Local(dir.to_path_buf());
    let last = last_commit(&objects).await?;
    let run = last
        .run
        .with_context(|| format!("the last commit of {} names no run", dir.display()))?;
    ensure!(
        run.completed_at.is_some(),
        "the run {} in {} did not complete",
        run.dir,
        dir.display()
    );
    let name = format!("{}/_manifest.json", run.dir);
    let bytes = objects
        .get(&name)
        .await
        .map_err(anyhow::Error::msg)?
        .with_context(|| format!("{} has no {name}", dir.display()))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).with_context(|| format!("{name} does not parse"))?;
    let mut read = 0;
    for file in &manifest.files {
        read += file_rows(dir, file)?;
    }
    ensure!(
        read == manifest.rows,
        "{name} says {} rows, its files hold {read}",
        manifest.rows
    );
    let named: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    let unnamed: Vec<String> = data_files(&objects)
        .await?
        .into_iter()
        .filter(|path| path.starts_with(&format!("{}/", run.dir)) && !named.contains(path.as_str()))
        .collect();
    ensure!(
        unnamed.is_empty(),
        "{} holds data files its manifest does not name: {unnamed:?}",
        run.dir
    );
    Ok(manifest.rows)
}

/// Rule 2: the rows of the changelog in `dir`.
pub async fn changelog_rows(dir: &Path) -> anyhow::Result<u64> {
    let objects = Objects::Local(dir.to_path_buf());
    let last = last_commit(&objects).await?;
    let names = objects.list("").await.map_err(anyhow::Error::msg)?;
    let orphans = commits::orphans(&names, Some(&last)).map_err(anyhow::Error::msg)?;
    ensure!(
        orphans.is_empty(),
        "{} holds data files no commit names: {orphans:?}",
        dir.display()
    );
    let mut kept: Vec<DataFile> = Vec::new();
    for name in objects
        .list(commits::LOG)
        .await
        .map_err(anyhow::Error::msg)?
    {
        let bytes = objects
            .get(&name)
            .await
            .map_err(anyhow::Error::msg)?
            .with_context(|| format!("{name} vanished"))?;
        let commit: Commit =
            serde_json::from_slice(&bytes).with_context(|| format!("{name} is not a commit"))?;
        kept.extend(commit.files);
    }
    let mut rows = 0;
    for path in data_files(&objects).await? {
        rows += match kept.iter().find(|f| f.path == path) {
            Some(file) => file_rows(dir, file)?,
            None => read_rows(&dir.join(&path))?,
        };
    }
    Ok(rows)
}

/// The fields of `_manifest.json` the count reads.
#[derive(serde::Deserialize)]
struct Manifest {
    rows: u64,
    files: Vec<DataFile>,
}

async fn last_commit(objects: &Objects) -> anyhow::Result<Commit> {
    commits::last(objects)
        .await
        .map_err(anyhow::Error::msg)?
        .with_context(|| format!("{} has no commit", objects.describe()))
}

/// The data files under the location (`part-<seq>-<writer>-<n>.parquet`).
async fn data_files(objects: &Objects) -> anyhow::Result<Vec<String>> {
    let mut names = objects.list("").await.map_err(anyhow::Error::msg)?;
    names.retain(|name| commits::file_seq(name).is_some());
    names.sort();
    Ok(names)
}

/// The rows of a committed file, read back; they must be the rows its commit says.
fn file_rows(dir: &Path, file: &DataFile) -> anyhow::Result<u64> {
    let rows = read_rows(&dir.join(&file.path))?;
    ensure!(
        rows == file.rows,
        "{} holds {rows} rows, its commit says {}",
        file.path,
        file.rows
    );
    Ok(rows)
}

/// Every row of a Parquet file, decoded by the Arrow reader (the footer's count must agree).
fn read_rows(path: &Path) -> anyhow::Result<u64> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{} is not a Parquet file", path.display()))?;
    let footer = builder.metadata().file_metadata().num_rows();
    let mut rows = 0u64;
    for batch in builder
        .build()
        .with_context(|| format!("cannot read {}", path.display()))?
    {
        rows += batch
            .with_context(|| format!("cannot decode {}", path.display()))?
            .num_rows() as u64;
    }
    ensure!(
        i64::try_from(rows).is_ok_and(|rows| rows == footer),
        "{} decodes to {rows} rows, its footer says {footer}",
        path.display()
    );
    Ok(rows)
}

/// Rule 3: the rows of the fresh Iceberg table whose warehouse is `dir` (its catalog
/// `<dir>.catalog.db`, the table `dynamodb.<the bench table>`): every data file the current
/// snapshot names is read back and must hold the rows its manifest entry says, and the
/// warehouse must hold no other data file. The count is their rows.
pub async fn iceberg_rows(dir: &Path) -> anyhow::Result<u64> {
    let catalog = PathBuf::from(format!("{}.catalog.db", dir.display()));
    let settings = IcebergSettings {
        catalog: SqlCatalog::new(catalog, "ddbpipe".into()).into(),
        namespace: "dynamodb".into(),
        table: crate::items::TABLE.into(),
        properties: Default::default(),
    };
    let files = iceberg::current_files(settings, &Objects::Local(dir.to_path_buf()))
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        !files.is_empty(),
        "{} has no committed data file",
        dir.display()
    );
    let mut rows = 0;
    for (path, expected) in &files {
        let read = read_rows(Path::new(path))?;
        ensure!(
            read == *expected,
            "{path} holds {read} rows, its manifest says {expected}"
        );
        rows += read;
    }
    let named: BTreeSet<&str> = files.iter().map(|(path, _)| path.as_str()).collect();
    let objects = Objects::Local(dir.to_path_buf());
    let mut names = objects.list("").await.map_err(anyhow::Error::msg)?;
    names.retain(|name| name.ends_with(".parquet"));
    let unnamed: Vec<String> = names
        .into_iter()
        .map(|name| dir.join(name).display().to_string())
        .filter(|path| !named.contains(path.as_str()))
        .collect();
    ensure!(
        unnamed.is_empty(),
        "data files no snapshot names: {unnamed:?}"
    );
    Ok(rows)
}
