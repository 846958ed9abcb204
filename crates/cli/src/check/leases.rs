//! The probes of a pipeline with `coordination` (docs/cli.md §8.2 item 5): `leases` (the
//! lease table and the settings its leader row keeps) and `state`, whose position is the
//! pipeline's lease rows (docs/coordination.md §11.10, §11.11): their positions are shown,
//! and a shared stream's shard checkpoints go through the run's gap layers
//! ([`crate::stream_gaps`]) as one process's position does.

use std::time::Duration;

use ddbpipe_pipeline::leased::other_settings;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::aws;
use ddbpipe_source::lease::{Lease, LeaseError, LeaseTable, PipelineName, UnitId};
use ddbpipe_source::plan;
use serde_json::json;

use super::state::gap_verdict;
use super::{Probes, Status};
use crate::config::{CoordinationConfig, PipelineConfig};
use crate::state_cmd::leases::positions;
use crate::stream_gaps;

/// `leases`: the lease table exists with a lease table's key, or can be created by the first
/// run; and how many of the pipeline's units it holds (docs/coordination.md §11.10). Returns
/// the pipeline's rows (none when the table does not exist yet), `None` when they could not
/// be read or belong to a run of other settings.
pub(super) async fn probe_leases(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    identity: &Identity,
    timeout: Duration,
    probes: &mut Probes,
) -> Option<Vec<Lease>> {
    let name = &coordination.lease_table;
    let sdk = aws::load_sdk_config(&plan::client_settings(&config.source)).await;
    let table = aws::lease_table(&sdk, name);
    let worker = coordination.worker_id();
    // A shared mirror's current generation keeps its leases under its own name; when the
    // destination cannot say which, the pipeline's own (its probe tells why).
    let current = crate::lease_names::current_lease_name(config).await.ok();
    let probe = async {
        if !table.exists().await? {
            return Ok(None);
        }
        let pipeline = match current {
            Some(name) => name,
            None => PipelineName::new(config.name.clone())
                .map_err(|e| LeaseError::Fatal(e.to_string()))?,
        };
        table.list(&pipeline).await.map(Some)
    };
    match tokio::time::timeout(timeout, probe).await {
        Err(_) => {
            probes.add(
                "leases",
                Status::Fail,
                format!(
                    "lease table '{name}' did not answer within {}s",
                    timeout.as_secs()
                ),
            );
            None
        }
        Ok(Err(error)) => {
            probes.add(
                "leases",
                Status::Fail,
                format!(
                    "lease table '{name}': {error} — the workers need dynamodb:DescribeTable, \
                     CreateTable, Query, GetItem, PutItem, UpdateItem and DeleteItem on it"
                ),
            );
            None
        }
        Ok(Ok(None)) => {
            probes.add_with(
                "leases",
                Status::Warn,
                format!(
                    "lease table '{name}' does not exist: the first worker creates it (on-demand \
                     billing; needs dynamodb:CreateTable); this worker is '{worker}'"
                ),
                json!({"exists": false, "lease_table": name, "worker_id": worker}),
            );
            Some(Vec::new())
        }
        Ok(Ok(Some(rows))) => {
            let settings = rows
                .iter()
                .find(|l| l.unit == UnitId::Leader)
                .and_then(|l| l.settings());
            if let Some(message) =
                settings.and_then(|stored| other_settings(&config.name, stored, identity))
            {
                probes.add(
                    "leases",
                    Status::Fail,
                    format!("lease table '{name}': {message}"),
                );
                return None;
            }
            // A row the run would stop on (docs/coordination.md §11.1): check fails as it does.
            if let Some(message) = rows.iter().find_map(Lease::unreadable) {
                probes.add(
                    "leases",
                    Status::Fail,
                    format!("lease table '{name}': {message}"),
                );
                return None;
            }
            let work: Vec<_> = rows.iter().filter(|l| l.unit.is_work()).collect();
            let finished = work.iter().filter(|l| l.state.is_finished()).count();
            let owned = work.iter().filter(|l| l.owner.is_some()).count();
            probes.add_with(
                "leases",
                Status::Pass,
                format!(
                    "lease table '{name}': {} unit(s) of this pipeline, {finished} finished, \
                     {owned} held; this worker is '{worker}'",
                    work.len()
                ),
                json!({"exists": true, "finished": finished, "held": owned,
                       "lease_table": name, "units": work.len(), "worker_id": worker}),
            );
            Some(rows)
        }
    }
}

/// `state` of a shared pipeline: the positions its lease rows hold. A shared stream's are
/// checked as the next worker reads them: a gap (a checkpoint the stream trimmed, the row of a
/// shard no longer listed) FAILs as the worker that takes it stops (`on_gap: fail`).
pub(super) async fn probe_positions(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    rows: &[Lease],
    stream: Option<&str>,
    timeout: Duration,
    probes: &mut Probes,
) {
    let where_ = format!("lease table '{}'", coordination.lease_table);
    let summary = positions(rows);
    let data = json!({"lease_table": coordination.lease_table, "positions": summary});
    let shards = rows.iter().any(|row| matches!(row.unit, UnitId::Shard(_)));
    let (status, detail) = match stream {
        Some(arn) if shards => match shared_gaps(config, rows, arn, timeout).await {
            Ok(None) => (
                Status::Pass,
                format!(
                    "{where_}: {}; the stream still holds every checkpoint",
                    summary.join("; ")
                ),
            ),
            Ok(Some((position, reasons))) => {
                gap_verdict(config.source.on_gap, &position, &where_, &reasons)
            }
            Err(problem) => (
                Status::Fail,
                format!(
                    "{where_}: the shard checkpoints could not be checked against the stream: \
                     {problem}"
                ),
            ),
        },
        _ if rows.iter().any(|row| row.unit.is_work()) => {
            (Status::Pass, format!("{where_}: {}", summary.join("; ")))
        }
        _ => (
            Status::Pass,
            format!("{where_}: no position yet (the first worker starts every unit)"),
        ),
    };
    probes.add_with("state", status, detail, data);
}

/// The gap a worker taking the shard rows finds: `None` without one, else the position the
/// rows hold and the reasons.
async fn shared_gaps(
    config: &PipelineConfig,
    rows: &[Lease],
    stream_arn: &str,
    timeout: Duration,
) -> Result<Option<(ddbpipe_source::position::StreamsPosition, Vec<String>)>, String> {
    let source = &config.source;
    let sdk = aws::load_sdk_config(&plan::client_settings(source)).await;
    let api = aws::streams_api(&sdk);
    let found = async {
        let graph = stream_gaps::listed(&api, source, stream_arn)
            .await
            .map_err(|error| error.to_string())?;
        let position = stream_gaps::leased(rows, source.mode, &graph)?;
        let findings = stream_gaps::findings(&api, source, stream_arn, &position, &graph)
            .await
            .map_err(|error| error.to_string())?;
        Ok::<_, String>((!findings.reasons.is_empty()).then_some((position, findings.reasons)))
    };
    match tokio::time::timeout(timeout, found).await {
        Ok(found) => found,
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}
