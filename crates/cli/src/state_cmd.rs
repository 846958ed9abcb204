//! `ddbpipe state show|reset`: look at or forget a pipeline's stored position.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use anyhow::anyhow;
use ddbpipe_kafka::positions::KafkaPositions;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_source::aws;
use ddbpipe_source::plan;
use ddbpipe_source::position::Position;
use serde_json::json;

use crate::config::{PipelineConfig, SinkConfig};
use crate::destination;
use crate::failure::{self, Exit, Failure};
use crate::origin::Origin;
use crate::telemetry::note;
use crate::wiring;

pub(crate) mod leases;
pub(crate) mod streams;

/// Prints the pipeline's entry with `fingerprint_status`: `match`, `differs` or `none`; for a
/// file of several tables each table's pipeline's, in the list's order (`--json`: one line
/// each).
pub async fn show(config_path: &Path, json: bool) -> Result<Exit, Failure> {
    let config = wiring::load_config(config_path)?;
    for (index, one) in crate::discover::each_table(&config)
        .await?
        .iter()
        .enumerate()
    {
        if index > 0 && !json {
            println!();
        }
        show_one(one, config_path, json).await?;
    }
    Ok(Exit::Ok)
}

/// [`show`] of one table's pipeline.
async fn show_one(config: &PipelineConfig, config_path: &Path, json: bool) -> Result<(), Failure> {
    if let Some(coordination) = &config.coordination {
        return leases::show(config, coordination, json).await.map(|_| ());
    }
    let where_ = destination::position_label(config);
    let entry = match destination::read_store(config).await? {
        Some(mut store) => store
            .load(&config.name)
            .await
            .map_err(|e| failure::state_failure(e, &Origin::File(config_path.to_owned())))?,
        None => None,
    };
    let Some(entry) = entry else {
        if json {
            println!(
                "{}",
                json!({"entry": null, "fingerprint_status": "none", "pipeline": config.name,
                       "state_file": where_})
            );
        } else {
            println!("no stored state for pipeline '{}'", config.name);
        }
        return Ok(());
    };
    let sdk = aws::load_sdk_config(&plan::client_settings(&config.source)).await;
    let location = wiring::location(&sdk, &config.source);
    let identity = wiring::identity(config, &location, None);
    let changes = match &entry.position {
        Some(position) => identity.changes_for(&entry.identity, position),
        None => identity.changes_from(&entry.identity, true),
    };
    let status = if entry.position.is_none() {
        "none"
    } else if changes.is_empty() {
        "match"
    } else {
        "differs"
    };
    let position = entry.position.as_ref().map(Position::to_json);
    let document = json!({
        "entry": {
            "fingerprint": entry.identity.fingerprint(),
            "identity": entry.identity.to_json(),
            "last_completed": entry.last_completed,
            "position": position,
            "updated_at": entry.updated_at,
        },
        "fingerprint_changes": changes,
        "fingerprint_status": status,
        "phase": match &entry.position {
            Some(Position::Streams(streams)) => Some(streams::Phase::of(streams).as_str()),
            _ => None,
        },
        "pipeline": config.name,
        "state_file": where_,
    });
    if json {
        println!("{document}");
    } else {
        println!("pipeline:           {}", config.name);
        println!("state:              {where_}");
        println!("updated at:         {}", entry.updated_at);
        println!("fingerprint status: {status}");
        for change in &changes {
            println!("  {change}");
        }
        match &entry.position {
            None => println!("position:           none (nothing in progress)"),
            Some(Position::Scan(scan)) => {
                println!(
                    "position:           {} of {} segment(s) done, {} in progress",
                    scan.done.count(),
                    scan.total_segments,
                    scan.cursors.len()
                );
            }
            Some(Position::Streams(streams)) => {
                for (label, value) in streams::lines(streams) {
                    println!("{label:<20}{value}");
                }
            }
        }
        println!(
            "position (JSON):    {}",
            position.unwrap_or(serde_json::Value::Null)
        );
        if let Some(last) = &entry.last_completed {
            println!("last completed:     {last}");
        }
    }
    Ok(())
}

/// Removes the pipeline's entry. Asks on a terminal; without one `--yes` is required.
pub async fn reset(config_path: &Path, yes: bool) -> Result<Exit, Failure> {
    let config = wiring::load_config(config_path)?;
    let tables = crate::discover::each_table(&config).await?;
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::usage(anyhow!(
                "state reset needs confirmation: no terminal to ask on"
            ))
            .hint(format!(
                "run `ddbpipe state reset {} --yes`",
                config_path.display()
            )));
        }
        let whose = tables
            .iter()
            .map(|one| {
                format!(
                    "pipeline '{}' in {}",
                    one.name,
                    destination::position_label(one)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let positions = if tables.len() > 1 {
            "positions"
        } else {
            "position"
        };
        eprint!("Forget the {positions} of {whose}? The destination's data is untouched. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            note!("nothing changed");
            return Ok(Exit::Ok);
        }
    }
    for one in &tables {
        reset_one(one, config_path).await?;
    }
    Ok(Exit::Ok)
}

/// [`reset`] of one table's pipeline, confirmed.
async fn reset_one(config: &PipelineConfig, config_path: &Path) -> Result<Exit, Failure> {
    if let Some(coordination) = &config.coordination {
        return leases::reset(config, coordination).await;
    }
    if config.sink.keyed().is_some() {
        return reset_in_database(config).await;
    }
    if matches!(&config.sink, SinkConfig::Kafka(_) | SinkConfig::Parquet(_))
        && config.sink.keeps_position().is_some()
    {
        return reset_in_sink(config).await;
    }
    let file = StateFile::new(&config.state.path);
    let _lock = file
        .lock(&config.name)
        .map_err(|e| failure::state_failure(e, &Origin::File(config_path.to_owned())))?;
    let said = file
        .reset(&config.name)
        .map_err(|e| failure::state_failure(e, &Origin::File(config_path.to_owned())))?;
    println!("{said}");
    Ok(Exit::Ok)
}

/// `state reset` of a sink that keeps the position with its records: the removal of the
/// pipeline's position committed where the sink commits. An `exactly_once` kafka sink commits
/// a null value to the positions topic through the pipeline's transactional producer, which
/// fences a run of the pipeline still going (docs/sinks.md §7.7 rule 9); a parquet sink
/// commits an empty position to its commit log, which takes the sequence number a run still
/// going would commit next, so that run stops (docs/sinks.md §7.10).
async fn reset_in_sink(config: &PipelineConfig) -> Result<Exit, Failure> {
    let Some(mut reader) = destination::read_store(config).await? else {
        println!("no stored state for pipeline '{}'", config.name);
        return Ok(Exit::Ok);
    };
    let stored = reader
        .load(&config.name)
        .await
        .map_err(|e| Failure::runtime(anyhow!(e)))?;
    if stored.is_none() {
        println!("no stored state for pipeline '{}'", config.name);
        return Ok(Exit::Ok);
    }
    let mut writer: Box<dyn CheckpointStore> = match &config.sink {
        SinkConfig::Kafka(kafka) => {
            let settings =
                crate::sinks::kafka::kafka_settings(kafka, config.target(), None).await?;
            Box::new(
                KafkaPositions::writer(&settings)
                    .await
                    .map_err(|e| Failure::runtime(anyhow!(e)))?,
            )
        }
        // The commit log it just read is the one it writes.
        _ => reader,
    };
    writer
        .store(&config.name, None)
        .await
        .map_err(|e| Failure::runtime(anyhow!(e)))?;
    println!(
        "removed the stored position of pipeline '{}' from {}",
        config.name,
        writer.describe()
    );
    Ok(Exit::Ok)
}

/// `state reset` of a keyed sink: the pipeline's parts of `_ddbpipe_state` are deleted, under
/// the pipeline's lock; the destination table is untouched.
async fn reset_in_database(config: &PipelineConfig) -> Result<Exit, Failure> {
    let Some(db) = crate::sinks::keyed::open_existing(&config.sink).await? else {
        println!("no stored state for pipeline '{}'", config.name);
        return Ok(Exit::Ok);
    };
    crate::sinks::keyed::lock(&db, &config.name).await?;
    if crate::sinks::keyed::reset_database_state(&db, &config.name).await? {
        println!(
            "removed the stored position of pipeline '{}' from {}",
            config.name,
            db.describe()
        );
    } else {
        println!("no stored state for pipeline '{}'", config.name);
    }
    Ok(Exit::Ok)
}
