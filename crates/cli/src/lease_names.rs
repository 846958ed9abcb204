//! The names a pipeline's leases are kept under in the lease table and the fence table: its
//! own, and for a shared mirror whose snapshot was replaced, its current generation's
//! (docs/coordination.md §11.12 rule 8), which the destination's snapshot record names. `run`
//! (a worker joining), `check`, `lag` and `state` read them here.

use anyhow::anyhow;
use ddbpipe_pipeline::sink::SharedSnapshot;
use ddbpipe_source::config::Mode;
use ddbpipe_source::lease::PipelineName;

use crate::config::PipelineConfig;
use crate::failure::Failure;

/// The pipeline's own name in the lease table.
fn base_name(config: &PipelineConfig) -> Result<PipelineName, Failure> {
    PipelineName::new(config.name.clone()).map_err(|e| Failure::usage(anyhow!("{e}")))
}

/// The names the pipeline's leases are kept under, its current ones last: the pipeline's own,
/// then, for a shared mirror whose snapshot was replaced, the current generation's
/// (docs/coordination.md §11.12 rule 8), read from the destination's snapshot record.
pub(crate) async fn lease_names(config: &PipelineConfig) -> Result<Vec<PipelineName>, Failure> {
    names_of(config, shared_snapshot(config).await?.as_ref())
}

/// [`lease_names`] of a pipeline whose shared snapshot record is `record`.
pub(crate) fn names_of(
    config: &PipelineConfig,
    record: Option<&SharedSnapshot>,
) -> Result<Vec<PipelineName>, Failure> {
    let mut names = vec![base_name(config)?];
    if let Some(record) = record
        && record.generation > 0
    {
        let name = PipelineName::new(record.lease_pipeline(&config.name))
            .map_err(|e| Failure::usage(anyhow!("{e}")))?;
        names.push(name);
    }
    Ok(names)
}

/// The name the pipeline's current leases are kept under: the last of [`lease_names`].
pub(crate) async fn current_lease_name(config: &PipelineConfig) -> Result<PipelineName, Failure> {
    let mut names = lease_names(config).await?;
    match names.pop() {
        Some(name) => Ok(name),
        None => base_name(config),
    }
}

/// A shared mirror's snapshot record, kept in its keyed destination (docs/coordination.md
/// §11.12): `None` for another mode, or when the destination holds none.
pub(crate) async fn shared_snapshot(
    config: &PipelineConfig,
) -> Result<Option<SharedSnapshot>, Failure> {
    if config.source.mode != Mode::Mirror || config.sink.keyed().is_none() {
        return Ok(None);
    }
    let Some(db) = crate::sinks::keyed::open_existing(&config.sink).await? else {
        return Ok(None);
    };
    db.shared_snapshot(&config.name)
        .await
        .map_err(|e| Failure::runtime(anyhow!("{}: {}", db.describe(), e.message)))
}
