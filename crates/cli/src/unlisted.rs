//! Tables a file of several tables no longer reads but whose position it keeps (docs/config.md
//! §1.5 rule 1): a table taken off `source.tables`, or no longer found by `source.discover`,
//! keeps its position so that reading it again resumes it. `run` warns of each at its start
//! and `check` lists them, so that a table dropped from the list by mistake is seen, and a
//! position nobody will read again can be removed on purpose.
//!
//! Where the positions can be listed: a sqlite or postgres sink's `_ddbpipe_state` (the
//! pipelines named `<name>:<table>`), and state files (`<name>.<table>.state.json` beside the
//! pipeline file, or `state.path` with `{table}` in its file name), each holding an entry of
//! its table's pipeline. Kafka's positions topic, the lake's commit logs and a lease table are
//! not listed (their positions are kept all the same).

use std::path::Path;

use ddbpipe_kafka::client::Delivery;
use ddbpipe_pipeline::state::StateFile;

use crate::config::{NAME_SEPARATOR, PipelineConfig, SinkConfig, TABLE_PLACEHOLDER};
use crate::failure::Failure;

/// A table with a kept position that the file does not read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlisted {
    /// The table's name (the part of its pipeline's name after `<name>:`).
    pub table: String,
    /// Its pipeline's name.
    pub pipeline: String,
}

impl Unlisted {
    /// The warning `run` logs and `check` prints.
    pub fn warning(&self, file: &PipelineConfig) -> String {
        let how = match file.discover.is_some() {
            true => "source.discover no longer finds it",
            false => "it is not in source.tables",
        };
        format!(
            "table '{}' has a stored position (pipeline '{}') but {how}: the position is kept, \
             and reading the table again resumes it",
            self.table, self.pipeline
        )
    }
}

/// The tables of `file` (a file of several tables) with a stored position that are not among
/// `reading` (its tables' pipelines now); `None` when its positions cannot be listed (see the
/// module docs).
pub async fn unlisted(
    file: &PipelineConfig,
    reading: &[PipelineConfig],
) -> Result<Option<Vec<Unlisted>>, Failure> {
    if !file.is_multi_table() || file.coordination.is_some() {
        return Ok(None);
    }
    let prefix = format!("{}{NAME_SEPARATOR}", file.name);
    let stored: Vec<String> = match &file.sink {
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => kept_in_database(file, &prefix).await?,
        SinkConfig::Kafka(kafka) if kafka.delivery == Delivery::ExactlyOnce => return Ok(None),
        SinkConfig::Jsonl(_) | SinkConfig::Kafka(_) | SinkConfig::Custom => {
            match state_files(&file.state.path, &prefix) {
                Some(found) => found,
                None => return Ok(None),
            }
        }
        SinkConfig::Parquet(_) => return Ok(None),
    };
    let read: Vec<&str> = reading.iter().map(|one| one.name.as_str()).collect();
    Ok(Some(
        stored
            .into_iter()
            .filter(|pipeline| !read.contains(&pipeline.as_str()))
            .filter_map(|pipeline| {
                let table = pipeline.strip_prefix(&prefix)?.to_string();
                Some(Unlisted { table, pipeline })
            })
            .collect(),
    ))
}

/// The pipelines `<prefix><table>` of `file`'s keyed sink whose entry in `_ddbpipe_state`
/// holds a position (a completed scan's keeps none: reading its table again starts over
/// anyway), each read as its table's run reads it (`destination::read_store`).
async fn kept_in_database(file: &PipelineConfig, prefix: &str) -> Result<Vec<String>, Failure> {
    let Some(db) = crate::sinks::keyed::open_existing(&file.sink).await? else {
        return Ok(Vec::new());
    };
    let stored = db.stored_pipelines().await.map_err(|error| {
        Failure::runtime(anyhow::anyhow!("sink {}: {}", db.describe(), error.message))
    })?;
    let mut kept = Vec::new();
    for pipeline in stored {
        let Some(table) = pipeline.strip_prefix(prefix) else {
            continue;
        };
        let Some(one) = file.with_tables(vec![table.to_string()]).per_table().pop() else {
            continue;
        };
        let Some(mut store) = crate::destination::read_store(&one).await? else {
            continue;
        };
        // An entry that does not read is its table's run's to report.
        if let Ok(Some(entry)) = store.load(&one.name).await
            && entry.position.is_some()
        {
            kept.push(pipeline);
        }
    }
    Ok(kept)
}

/// The pipelines `<prefix><table>` with a position in a state file of the template `path`
/// (`{table}` in its file name); `None` when `{table}` is not in the file name (in a
/// directory of the path, the files are not listed).
fn state_files(path: &Path, prefix: &str) -> Option<Vec<String>> {
    let name = path.file_name()?.to_str()?;
    let (before, after) = name.split_once(TABLE_PLACEHOLDER)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if dir
        .to_str()
        .is_none_or(|text| text.contains(TABLE_PLACEHOLDER))
    {
        return None;
    }
    // A directory not made yet holds no position.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Some(Vec::new());
    };
    let mut found: Vec<String> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file = entry.file_name().into_string().ok()?;
            let table = file.strip_prefix(before)?.strip_suffix(after)?;
            if table.is_empty() || table.contains(TABLE_PLACEHOLDER) {
                return None;
            }
            let pipeline = format!("{prefix}{table}");
            // A file that does not read is `run`'s to report, with its table.
            let kept = StateFile::new(entry.path()).load(&pipeline).ok()??;
            kept.position.is_some().then_some(pipeline)
        })
        .collect();
    found.sort();
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file holding a streams position of `pipeline` (a golden file's, renamed).
    fn write_entry(dir: &Path, file: &str, pipeline: &str) {
        let golden = include_str!("../../pipeline/tests/golden/demo-streams.state.json");
        let text = golden.replacen("\"orders-cdc\":", &format!("\"{pipeline}\":"), 1);
        assert_ne!(text, golden, "the golden file's pipeline is renamed");
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn state_files_of_the_template_hold_the_kept_tables() {
        let dir = tempfile::tempdir().unwrap();
        write_entry(dir.path(), "sync.orders.state.json", "sync:orders");
        write_entry(dir.path(), "sync.gone.state.json", "sync:gone");
        // Another file's table, a file of another pipeline name, and a file without the entry.
        write_entry(dir.path(), "other.gone.state.json", "other:gone");
        write_entry(dir.path(), "sync.mixed.state.json", "other:mixed");
        std::fs::write(dir.path().join("sync.broken.state.json"), "{").unwrap();
        let template = dir.path().join("sync.{table}.state.json");
        let found = state_files(&template, "sync:").unwrap();
        assert_eq!(found, ["sync:gone", "sync:orders"]);
        // `{table}` in a directory: not listed.
        assert_eq!(
            state_files(&dir.path().join("{table}/state.json"), "sync:"),
            None
        );
        // A directory not made yet: nothing kept.
        let missing = dir.path().join("later/sync.{table}.json");
        assert_eq!(state_files(&missing, "sync:"), Some(Vec::new()));
    }
}
