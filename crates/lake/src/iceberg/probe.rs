//! What `check` and the bench read of an Iceberg sink's table without writing it: the
//! table as a run would find it (rules 1 and 2), and the data files `main` names.

use super::columns::Changes;
use super::snapshots::manifests;
use super::{IcebergSettings, IcebergTable};
use crate::failure::Failure;
use crate::objects::Objects;
use crate::rows::Shape;

impl IcebergTable {
    /// `check`'s probe: the table as a run would find it (its place, its owner, its columns):
    /// what a run would change; `None` when there is no table yet (a run creates it).
    async fn probe(&mut self, shape: &Shape) -> Result<Option<Changes>, Failure> {
        let Some(table) = self.current().await? else {
            return Ok(None);
        };
        self.locate(&table)?;
        let changes = self.check_columns(&table, shape)?;
        // The claim's metadata, built and dropped (rule 2).
        self.evolve(&table, self.builder(&table)?, shape, &changes)?
            .build()
            .map_err(|e| Failure::definite(format!("{}: {e}", self.describe())))?;
        Ok(Some(changes))
    }
}

/// `check`'s probe of an Iceberg sink's table (rules 1 and 2): what a run would find, told in
/// one line; an error names what a run would refuse.
pub async fn probe(
    settings: IcebergSettings,
    warehouse: &Objects,
    pipeline: &str,
    shape: &Shape,
) -> Result<String, String> {
    settings.catalog.writable().await?;
    let mut table = IcebergTable::new(settings, warehouse, pipeline, "check");
    match table.probe(shape).await {
        Ok(Some(changes)) => {
            let (table, partitioning) = (table.describe(), shape.partitioning());
            let mut said = match changes.repartitions {
                None if changes.columns.is_empty() => {
                    format!("{table}: its columns are the sink's, partitioned by {partitioning}")
                }
                None => format!("{table}: partitioned by {partitioning}"),
                Some(was) => format!(
                    "{table}: partitioned by {was}; a run partitions it by {partitioning} from \
                     its first commit (partition evolution: the files written before keep theirs)"
                ),
            };
            if !changes.columns.is_empty() {
                let names: Vec<String> = changes
                    .columns
                    .iter()
                    .map(|f| format!("'{}'", f.name))
                    .collect();
                said.push_str(&format!(
                    "; a run adds the column(s) {} (earlier rows read them as null)",
                    names.join(", ")
                ));
            }
            Ok(said)
        }
        Ok(None) => Ok(format!(
            "{}: not there yet (the first run creates it)",
            table.describe()
        )),
        Err(failure) => Err(failure.message),
    }
}

/// The data files `main`'s current snapshot names, with the rows each holds by its manifest
/// entry: `(path, rows)` (what the bench reads back and counts).
pub async fn current_files(
    settings: IcebergSettings,
    warehouse: &Objects,
) -> Result<Vec<(String, u64)>, String> {
    let reader = IcebergTable::new(settings, warehouse, "", "read");
    let Some(table) = reader.current().await.map_err(|f| f.message)? else {
        return Ok(Vec::new());
    };
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(Vec::new());
    };
    let failed = |e: iceberg::Error| format!("cannot read {}: {e}", reader.describe());
    let mut files = Vec::new();
    for manifest in manifests(&table, snapshot).await.map_err(failed)? {
        let manifest = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(failed)?;
        for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
            files.push((entry.file_path().to_string(), entry.record_count()));
        }
    }
    Ok(files)
}
