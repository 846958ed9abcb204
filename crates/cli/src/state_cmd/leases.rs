//! `state show` and `state reset` of a pipeline with `coordination:`: its position is its lease
//! rows (docs/coordination.md §11.10).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_kafka::client::Delivery;
use ddbpipe_kafka::positions::KafkaPositions;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore as _;
use ddbpipe_pipeline::sink::SharedSnapshot;
use ddbpipe_source::aws::{self, AwsLeaseTable};
use ddbpipe_source::config::Mode;
use ddbpipe_source::lease::{Lease, LeaseTable, PipelineName, UnitId};
use ddbpipe_source::plan;
use ddbpipe_source::position::LeaseCheckpoint;
use serde_json::json;

use crate::config::{CoordinationConfig, PipelineConfig, SinkConfig};
use crate::failure::{Exit, Failure};
use crate::run::lease_table_failure;

/// The lease table of `config`; `None` when it does not exist (nothing was run yet). Creates
/// nothing.
async fn open(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
) -> Result<Option<AwsLeaseTable>, Failure> {
    let sdk = aws::load_sdk_config(&plan::client_settings(&config.source)).await;
    let table = aws::lease_table(&sdk, &coordination.lease_table);
    let exists = table
        .exists()
        .await
        .map_err(|e| lease_table_failure(e, &coordination.lease_table))?;
    Ok(exists.then_some(table))
}

/// The pipeline's lease rows, read without taking any (none when the lease table does not
/// exist), with the shared snapshot record that names their generation, read once (`None`
/// for another mode, or a destination without one). `lag` reads a shared pipeline's position
/// here.
pub(crate) async fn rows(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
) -> Result<(Vec<Lease>, Option<SharedSnapshot>), Failure> {
    let record = crate::lease_names::shared_snapshot(config).await?;
    let name = crate::lease_names::current_of(config, record.as_ref())?;
    Ok((current_rows(config, coordination, &name).await?, record))
}

/// The rows kept under `name`, the pipeline's current lease name; none when the lease table
/// does not exist.
async fn current_rows(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    name: &PipelineName,
) -> Result<Vec<Lease>, Failure> {
    match open(config, coordination).await? {
        Some(table) => list(&table, name, coordination).await,
        None => Ok(Vec::new()),
    }
}

async fn list(
    table: &AwsLeaseTable,
    name: &PipelineName,
    coordination: &CoordinationConfig,
) -> Result<Vec<Lease>, Failure> {
    table
        .list(name)
        .await
        .map_err(|e| lease_table_failure(e, &coordination.lease_table))
}

fn lease_json(lease: &Lease) -> serde_json::Value {
    json!({
        "checkpoint": lease.checkpoint.as_ref().map(LeaseCheckpoint::encode),
        "counter": lease.counter.0,
        "owner": lease.owner.as_ref().map(|o| o.as_str()),
        "parents": lease.parents.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "state": lease.state.as_str(),
        "unit": lease.unit.to_string(),
        "written_ms": lease.written_ms,
    })
}

/// What the pipeline's unit rows hold, one line per kind of unit:
/// `3 shard(s): 1 finished, 1 positioned, 1 at its start; 1 held by 1 worker(s), 1 free` (a
/// shard is positioned once a checkpoint names a sequence number; a segment once a page was
/// checkpointed). `check` shows the same lines.
pub(crate) fn positions(rows: &[Lease]) -> Vec<String> {
    let mut lines = Vec::new();
    for (kind, shards) in [("shard(s)", true), ("segment(s)", false)] {
        let units: Vec<&Lease> = rows
            .iter()
            .filter(|row| match row.unit {
                UnitId::Shard(_) => shards,
                UnitId::Segment { .. } => !shards,
                UnitId::Leader | UnitId::Worker(_) => false,
            })
            .collect();
        if units.is_empty() {
            continue;
        }
        let finished = units.iter().filter(|row| row.state.is_finished()).count();
        let open: Vec<&&Lease> = units
            .iter()
            .filter(|row| !row.state.is_finished())
            .collect();
        let positioned = open
            .iter()
            .filter(|row| match row.unit {
                UnitId::Shard(_) => matches!(row.checkpoint, Some(LeaseCheckpoint::After { .. })),
                _ => row.checkpoint.is_some(),
            })
            .count();
        let held: Vec<&str> = open
            .iter()
            .filter_map(|row| row.owner.as_ref().map(|owner| owner.name()))
            .collect();
        let workers: BTreeSet<&str> = held.iter().copied().collect();
        lines.push(format!(
            "{} {kind}: {finished} finished, {positioned} positioned, {} at its start; {} held \
             by {} worker(s), {} free",
            units.len(),
            open.len() - positioned,
            held.len(),
            workers.len(),
            open.len() - held.len()
        ));
    }
    lines
}

/// A shared mirror's phase from its rows (docs/coordination.md §11.12): `streaming` once every
/// segment is done (the snapshot's cleanup runs once, then the stream goes on), else
/// `snapshot`, its stream read beside it once shard rows exist.
fn shared_mirror_phase(rows: &[Lease]) -> &'static str {
    let segments: Vec<&Lease> = rows
        .iter()
        .filter(|row| matches!(row.unit, UnitId::Segment { .. }))
        .collect();
    let shards = rows.iter().any(|row| matches!(row.unit, UnitId::Shard(_)));
    if !segments.is_empty() && segments.iter().all(|row| row.state.is_finished()) {
        "streaming"
    } else if shards {
        "snapshot (its stream is read beside it)"
    } else {
        "snapshot"
    }
}

/// The snapshot record in a line: its id, open or who closed it when, the rows the
/// destination held at its start, and its export.
fn snapshot_line(snapshot: &SharedSnapshot) -> String {
    let state = match &snapshot.closed {
        None => "open".to_string(),
        Some(closed) => format!("closed by {} at {} (unix ms)", closed.by, closed.at_ms),
    };
    let export = snapshot
        .export
        .as_deref()
        .map_or_else(String::new, |arn| format!(", export {arn}"));
    // A repair's generation (docs/coordination.md §11.12 rule 9) names its window.
    let repair = snapshot.repair.map_or_else(String::new, |repair| {
        let (window, windows) = repair.window_of();
        format!(
            ", repairing the gap's changes from {} to {} (unix ms), window {window} of {windows}",
            repair.from_ms, repair.to_ms
        )
    });
    format!(
        "{} {state}, {} row(s) in the destination at its start{export}{repair}",
        snapshot.id, snapshot.rows_at_start
    )
}

/// Lists the pipeline's leases: unit, owner, state, counter, checkpoint.
pub async fn show(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    json: bool,
) -> Result<Exit, Failure> {
    // The record, read once, names the current generation whose rows are shown.
    let snapshot = crate::lease_names::shared_snapshot(config).await?;
    let name = crate::lease_names::current_of(config, snapshot.as_ref())?;
    let leases = current_rows(config, coordination, &name).await?;
    let work: Vec<&Lease> = leases.iter().filter(|l| l.unit.is_work()).collect();
    let finished = work.iter().filter(|l| l.state.is_finished()).count();
    let summary = positions(&leases);
    let phase = (config.source.mode == Mode::Mirror).then(|| {
        // A repair's generation reads its window's export files, no stream beside them
        // (docs/coordination.md §11.12 rule 9).
        match &snapshot {
            Some(record) if record.repair.is_some() && record.closed.is_none() => "repair",
            _ => shared_mirror_phase(&leases),
        }
    });
    if json {
        let rows: Vec<_> = leases.iter().map(lease_json).collect();
        println!(
            "{}",
            json!({"finished": finished, "lease_table": coordination.lease_table,
                   "leases": rows, "phase": phase, "pipeline": config.name,
                   "positions": summary, "snapshot": snapshot, "units": work.len()})
        );
        return Ok(Exit::Ok);
    }
    println!("pipeline:     {}", config.name);
    println!("lease table:  {}", coordination.lease_table);
    if leases.is_empty() {
        println!("leases:       none (no shared run has started)");
        return Ok(Exit::Ok);
    }
    println!("leases:       {} unit(s), {finished} finished", work.len());
    if let Some(phase) = phase {
        println!("phase:        {phase}");
    }
    if let Some(snapshot) = &snapshot {
        println!("snapshot:     {}", snapshot_line(snapshot));
    }
    for line in &summary {
        println!("positions:    {line}");
    }
    println!(
        "{:<24} {:<24} {:<11} {:>8}  checkpoint",
        "unit", "owner", "state", "counter"
    );
    for lease in &leases {
        let checkpoint = lease
            .checkpoint
            .as_ref()
            .map_or_else(|| "-".to_string(), LeaseCheckpoint::encode);
        // Wide enough for a shard's 40-digit sequence number with its `read_at`.
        let checkpoint: String = if checkpoint.chars().count() > 72 {
            checkpoint.chars().take(69).chain("...".chars()).collect()
        } else {
            checkpoint.to_string()
        };
        println!(
            "{:<24} {:<24} {:<11} {:>8}  {checkpoint}",
            lease.unit.to_string(),
            lease.owner.as_ref().map_or("-", |o| o.as_str()),
            lease.state.as_str(),
            lease.counter.0,
        );
    }
    Ok(Exit::Ok)
}

/// Deletes the pipeline's leases once none is live: the rows are listed, listed again a lease
/// duration later when any has an owner, and the reset is refused if an owned row's counter
/// moved (a worker renewed it). Each delete is conditional on the counter listed, so a worker
/// that writes meanwhile keeps its row, and the reset says so.
pub async fn reset(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
) -> Result<Exit, Failure> {
    // A shared mirror's current generation keeps its leases and fences under its own name.
    let names = crate::lease_names::lease_names(config).await?;
    let Some(table) = open(config, coordination).await? else {
        println!("no leases for pipeline '{}'", config.name);
        return clear_fences(config, &names).await;
    };
    let list_all = || async {
        let mut rows = Vec::new();
        for name in &names {
            for lease in list(&table, name, coordination).await? {
                rows.push((name.clone(), lease));
            }
        }
        Ok::<_, Failure>(rows)
    };
    let before = list_all().await?;
    if before.is_empty() {
        println!("no leases for pipeline '{}'", config.name);
        return clear_fences(config, &names).await;
    }
    let after = if before.iter().any(|(_, l)| l.owner.is_some()) {
        let wait = Duration::from_secs(coordination.lease_duration_secs);
        eprintln!(
            "ddbpipe: waiting {}s (the lease duration) to see whether a worker still renews its leases",
            wait.as_secs()
        );
        tokio::time::sleep(wait).await;
        list_all().await?
    } else {
        before.clone()
    };
    let live: Vec<String> = after
        .iter()
        .filter(|(name, now)| {
            now.owner.is_some()
                && before
                    .iter()
                    .find(|(then_name, then)| then_name == name && then.unit == now.unit)
                    .is_none_or(|(_, then)| then.counter != now.counter)
        })
        .map(|(_, l)| {
            format!(
                "{} ({})",
                l.unit,
                l.owner.as_ref().map_or("-", |o| o.as_str())
            )
        })
        .collect();
    if !live.is_empty() {
        return Err(Failure::runtime(anyhow!(
            "state reset refused: pipeline '{}' has live leases in '{}': {}",
            config.name,
            coordination.lease_table,
            live.join(", ")
        ))
        .hint("stop every worker of the pipeline (SIGTERM hands its leases back), then reset"));
    }
    let mut kept = Vec::new();
    for (name, lease) in &after {
        if let Err(error) = table.delete(name, &lease.unit, lease.counter).await {
            kept.push(format!("{}: {error}", lease.unit));
        }
    }
    if !kept.is_empty() {
        return Err(Failure::runtime(anyhow!(
            "state reset of pipeline '{}' left {} lease(s): {}",
            config.name,
            kept.len(),
            kept.join("; ")
        ))
        .hint("a worker wrote them meanwhile; stop it and reset again"));
    }
    println!(
        "removed {} lease(s) of pipeline '{}' from lease table {}",
        after.len(),
        config.name,
        coordination.lease_table
    );
    clear_fences(config, &names).await
}

/// Deletes the pipeline's lease fences in a keyed destination, or its units' positions in an
/// `exactly_once` kafka sink's positions topic. Lease counters start again with new rows, so
/// fences left behind would refuse every new lease; a reset whose rows are already gone
/// clears them too.
async fn clear_fences(config: &PipelineConfig, names: &[PipelineName]) -> Result<Exit, Failure> {
    if let SinkConfig::Kafka(kafka) = &config.sink
        && kafka.delivery == Delivery::ExactlyOnce
    {
        // The units' positions, kept with their counters (docs/coordination.md §11.13).
        let settings = crate::sinks::kafka::kafka_settings(kafka, config.target(), None).await?;
        let mut positions = KafkaPositions::writer(&settings)
            .await
            .map_err(|e| Failure::runtime(anyhow!(e)))?;
        let removed = positions
            .remove_units(&config.name)
            .await
            .map_err(|e| Failure::runtime(anyhow!(e)))?;
        if removed > 0 {
            println!(
                "removed {removed} unit position(s) of pipeline '{}' from {}",
                config.name,
                positions.describe()
            );
        }
        return Ok(Exit::Ok);
    }
    let Some(db) = (match config.sink.keyed() {
        Some(_) => crate::sinks::keyed::open_existing(&config.sink).await?,
        None => None,
    }) else {
        return Ok(Exit::Ok);
    };
    // A generation's fences first: the record, kept under the pipeline's own name, names it.
    let mut removed = false;
    for name in names.iter().rev() {
        removed |= crate::sinks::keyed::reset_database_state(&db, name.as_str()).await?;
    }
    if removed {
        println!(
            "removed the lease fences of pipeline '{}' from {}",
            config.name,
            db.describe()
        );
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::lease::{LeaseState, WorkerId};

    use super::*;

    fn row(unit: &str, checkpoint: Option<&str>, owner: Option<&str>, state: LeaseState) -> Lease {
        let mut lease = Lease::new(unit.parse().unwrap(), Vec::new(), 0);
        lease.checkpoint = checkpoint.map(|text| lease.unit.checkpoint(text));
        lease.owner = owner.map(|o| WorkerId::new(o).unwrap());
        lease.state = state;
        lease
    }

    #[test]
    fn the_positions_count_each_kind_of_unit_and_who_holds_them() {
        let rows = [
            row("leader", Some("{}"), Some("w1#a"), LeaseState::Processing),
            row("segment:0/2", Some("done"), None, LeaseState::Done),
            row("segment:1/2", Some("done"), None, LeaseState::Done),
            row("shard:a", Some("end"), None, LeaseState::ShardEnd),
            row(
                "shard:b",
                Some("after:000000000000000000123"),
                Some("w1#a"),
                LeaseState::Processing,
            ),
            row("shard:c", None, Some("w2#b"), LeaseState::Pending),
            row("shard:d", Some("latest:5"), None, LeaseState::Pending),
        ];
        assert_eq!(
            positions(&rows),
            [
                "4 shard(s): 1 finished, 1 positioned, 2 at its start; 2 held by 2 worker(s), 1 free",
                "2 segment(s): 2 finished, 0 positioned, 0 at its start; 0 held by 0 worker(s), 0 free",
            ]
        );
        assert_eq!(shared_mirror_phase(&rows), "streaming");
        assert_eq!(shared_mirror_phase(&rows[..3]), "streaming");
        let reading = [
            row("segment:0/2", Some("done"), None, LeaseState::Done),
            row("segment:1/2", None, Some("w1#a"), LeaseState::Pending),
            row("shard:a", None, Some("w2#b"), LeaseState::Pending),
        ];
        assert!(shared_mirror_phase(&reading).contains("beside"));
        assert_eq!(shared_mirror_phase(&reading[..2]), "snapshot");
        assert_eq!(shared_mirror_phase(&[]), "snapshot");
    }
}
