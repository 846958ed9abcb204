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
/// then, for a shared mirror whose snapshot was replaced, the earlier generations' and the
/// current generation's (docs/coordination.md §11.12 rule 8), read from the destination's
/// snapshot record.
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
        let mut generations = record.earlier_lease_pipelines(&config.name);
        generations.push(record.lease_pipeline(&config.name));
        for name in generations {
            names.push(PipelineName::new(name).map_err(|e| Failure::usage(anyhow!("{e}")))?);
        }
    }
    Ok(names)
}

/// The name the pipeline's current leases are kept under: the last of [`lease_names`].
pub(crate) async fn current_lease_name(config: &PipelineConfig) -> Result<PipelineName, Failure> {
    current_of(config, shared_snapshot(config).await?.as_ref())
}

/// [`current_lease_name`] of a pipeline whose shared snapshot record is `record`.
pub(crate) fn current_of(
    config: &PipelineConfig,
    record: Option<&SharedSnapshot>,
) -> Result<PipelineName, Failure> {
    match names_of(config, record)?.pop() {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// docs/coordination.md §11.12 rule 8: the names of a shared mirror replaced twice are the
    /// pipeline's own, the earlier generation's and the current one's, in that order (`state
    /// reset` deletes the rows of each; the others read the last).
    #[test]
    fn a_record_replaced_twice_names_every_generation_since_the_first() {
        let yaml = "name: p\nsource: {table_name: t, mode: mirror, follow: true}\n\
                    sink: {type: sqlite, path: m.db}\ncoordination: {lease_table: leases}\n";
        let config = crate::config::parse(yaml, Path::new("conf"), &|_| None).unwrap();
        let record: SharedSnapshot = serde_json::from_str(
            r#"{"id":700,"rows_at_start":3,"generation":2,"replaced":"a gap","earlier":[500]}"#,
        )
        .unwrap();
        let names: Vec<String> = names_of(&config, Some(&record))
            .unwrap()
            .iter()
            .map(|name| name.as_str().to_string())
            .collect();
        assert_eq!(names, ["p", "p/snapshot-500", "p/snapshot-700"]);
        let first = SharedSnapshot {
            generation: 0,
            earlier: Vec::new(),
            ..record
        };
        let names = names_of(&config, Some(&first)).unwrap();
        assert_eq!(
            names.len(),
            1,
            "a first snapshot's leases are the pipeline's own"
        );
    }
}
