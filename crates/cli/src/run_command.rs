//! `ddbpipe run`: the library's [`Pipeline`], with the command's output around it: the config's
//! warnings, metrics, the health of `/health`, and the summary. A file of several tables
//! (`source.tables`) runs one pipeline per table at once ([`Pipeline::tables`]); a table that
//! fails stops alone, and the run says which (docs/cli.md §8.1).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::anyhow;
use ddbpipe_source::retry::Cancel;

use crate::args::ProgressMode;
use crate::failure::{self, Exit, Failure};
use crate::library::{Error, Pipeline, Summary};
use crate::telemetry::{self, Line, say};

/// `ddbpipe run`: the library's pipeline, with the command's output around it: warnings,
/// metrics, the health of `/health`, and the summary.
pub async fn run(
    config_path: &Path,
    progress: ProgressMode,
    metrics: &telemetry::MetricsOutput,
    stop: Cancel,
) -> Result<Exit, Failure> {
    let pipeline = Pipeline::from_path(config_path)
        .map_err(Error::into_failure)?
        .with_progress(progress);
    let tables = pipeline.tables().await.map_err(Error::into_failure)?;
    let multi = pipeline.table().is_empty();
    let table_label = match multi {
        false => pipeline.table().to_string(),
        true => tables
            .iter()
            .map(|one| one.table())
            .collect::<Vec<_>>()
            .join(","),
    };
    telemetry::set_run(pipeline.name(), &table_label);
    ddbpipe_source::health::start();
    for warning in pipeline.warnings() {
        tracing::warn!("{warning}");
    }
    let metrics = telemetry::install_metrics(
        metrics,
        pipeline.name(),
        pipeline.config().metrics.health_stall(),
    )
    .map_err(Failure::runtime)?;
    let outcome = if multi {
        warn_unlisted(&pipeline, &tables).await;
        run_tables(&pipeline, tables, stop).await
    } else {
        let outcome = pipeline.run(stop).await.map_err(Error::into_failure);
        if let Ok(summary) = &outcome {
            say_summary(summary, None);
        }
        outcome.map(|_| ())
    };
    if let Err(failure) = &outcome {
        ddbpipe_source::health::failed(&format!("{:#}", failure.error));
    }
    // The final values, whatever the outcome: a failed nightly run is worth scraping too.
    if let Some(metrics) = &metrics
        && let Err(error) = metrics.write_final()
    {
        tracing::warn!("{error:#}");
    }
    outcome.map(|()| Exit::Ok)
}

/// Warns of each table whose position the file keeps but does not read now (docs/config.md
/// §1.5 rule 1); a store that cannot be read for it is a warning too (the tables' own runs
/// report their stores).
async fn warn_unlisted(file: &Pipeline, tables: &[Pipeline]) {
    let reading: Vec<_> = tables.iter().map(|one| one.config().clone()).collect();
    match crate::unlisted::unlisted(file.config(), &reading).await {
        Ok(Some(unlisted)) => {
            for one in unlisted {
                tracing::warn!("{}", one.warning(file.config()));
            }
        }
        Ok(None) => {}
        Err(failure) => tracing::warn!(
            "Could not look for kept positions of tables the file no longer reads: {:#}",
            failure.error
        ),
    }
}

/// Runs every table's pipeline at once, each on a task of its own, until all have ended. Each
/// summary is said as it comes, prefixed with its table; a table's failure is reported with
/// its table and the others go on. With `source.discover`, the tables are looked for again at
/// its interval while any runs: a new one is started, and a table that failed and is no
/// longer found (dropped, or its tags changed) stopped with a warning, not a failure. The run
/// fails when any table did, naming them: exit 2 when every failure was one of config or
/// usage, else 1.
async fn run_tables(file: &Pipeline, tables: Vec<Pipeline>, stop: Cancel) -> Result<(), Failure> {
    let mut running = Running::default();
    for pipeline in tables {
        running.start(pipeline, &stop);
    }
    let interval = file
        .config()
        .discover
        .as_ref()
        .map(|discovery| std::time::Duration::from_secs(discovery.interval_secs));
    let mut look_again = interval.map(|every| {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let mut failed = Vec::new();
    let mut exit = Exit::Usage;
    while !running.tasks.is_empty() {
        let tick = async {
            match &mut look_again {
                Some(ticks) if !stop.is_cancelled() => ticks.tick().await,
                _ => std::future::pending().await,
            }
        };
        let joined = tokio::select! {
            joined = running.tasks.join_next_with_id() => joined,
            _ = tick => {
                match file.tables().await {
                    Ok(found) => {
                        for pipeline in found {
                            if !running.started.contains(pipeline.table()) {
                                tracing::info!(
                                    table = pipeline.table(),
                                    "A table source.discover matches now: its run starts."
                                );
                                running.start(pipeline, &stop);
                            }
                        }
                    }
                    Err(error) => tracing::warn!(
                        "Looking for tables again failed ({}); the tables found before go on.",
                        error
                    ),
                }
                continue;
            }
        };
        let Some(joined) = joined else { break };
        // A table's run that panicked is that table's failure; the others go on.
        let (table, outcome) = match joined {
            Ok((id, ended)) => {
                running.tables.remove(&id);
                ended
            }
            Err(error) => (
                running.tables.remove(&error.id()).unwrap_or_default(),
                Err(Failure::runtime(anyhow!(
                    "its run panicked or was cancelled: {error}"
                ))),
            ),
        };
        match outcome {
            Ok(summary) => say_summary(&summary, Some(&table)),
            Err(failure) if interval.is_some() && gone(file, &table).await => {
                tracing::warn!(
                    table = %table,
                    "The table is no longer found by source.discover (dropped, or its tags \
                     changed): its run stopped ({:#}).",
                    failure.error
                );
            }
            Err(mut failure) => {
                failure.error = failure.error.context(format!("table '{table}'"));
                failure::report(&failure);
                if failure.exit != Exit::Usage {
                    exit = Exit::Runtime;
                }
                failed.push(table);
            }
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort();
    let error = anyhow!(
        "{} of {} tables failed: {} (each one's error is above; the others ended as their \
         summaries say)",
        failed.len(),
        running.started.len(),
        failed.join(", ")
    );
    Err(match exit {
        Exit::Usage => Failure::usage(error),
        _ => Failure::runtime(error),
    })
}

/// The outcome of one table's run: its table and how it ended.
type TableRun = (String, Result<Summary, Failure>);

/// The tables' runs: their tasks, which table each task runs, and every table started.
#[derive(Default)]
struct Running {
    tasks: tokio::task::JoinSet<TableRun>,
    tables: HashMap<tokio::task::Id, String>,
    started: BTreeSet<String>,
}

impl Running {
    /// Starts `pipeline`'s run on a task of its own.
    fn start(&mut self, pipeline: Pipeline, stop: &Cancel) {
        // Several progress bars would overwrite each other on one terminal.
        let pipeline = pipeline.with_progress(ProgressMode::Never);
        let table = pipeline.table().to_string();
        self.started.insert(table.clone());
        let stop = stop.clone();
        let task = self.tasks.spawn(async move {
            let outcome = pipeline.run(stop).await.map_err(Error::into_failure);
            (pipeline.table().to_string(), outcome)
        });
        self.tables.insert(task.id(), table);
    }
}

/// Whether `table` is no longer among the tables `file`'s discovery finds (when looking
/// fails, it is not known gone).
async fn gone(file: &Pipeline, table: &str) -> bool {
    crate::discover::discovered(file.config())
        .await
        .is_ok_and(|found| !found.iter().any(|name| name == table))
}

/// Says a run's summary and its note, prefixed with its table when the file has several.
fn say_summary(summary: &Summary, table: Option<&str>) {
    let prefix = table.map(|t| format!("table '{t}': ")).unwrap_or_default();
    say(Line::Summary, &format!("{prefix}{summary}"));
    if let Some(note) = summary.note() {
        say(Line::Note, &format!("{prefix}{note}"));
    }
}
