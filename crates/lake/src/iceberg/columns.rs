//! The Iceberg table's columns and partitioning (docs/sinks.md §7.11 rules 1, 2 and 9): the
//! sink's checked against the table's, the typed columns a run adds and the partitioning it
//! gives the table, and a data file's column metrics as its manifest entry carries them.

use iceberg::spec::{
    DataContentType, DataFileBuilder, DataFileFormat, NestedFieldRef, Struct, TableMetadataBuilder,
};
use iceberg::table::Table;

use super::{IcebergTable, snapshots};
use crate::commits::DataFile;
use crate::failure::Failure;
use crate::rows::Shape;

/// What a run changes in an existing table (rule 2).
pub(super) struct Changes {
    /// The typed columns it adds at the end (schema evolution).
    pub(super) columns: Vec<NestedFieldRef>,
    /// The table's partitioning, described, when the sink's is another: the run makes the
    /// sink's the table's default spec (partition evolution).
    pub(super) repartitions: Option<String>,
}

impl IcebergTable {
    /// Rule 2: the table's columns are the sink's, its properties read; what a run changes.
    pub(super) fn check_columns(&self, table: &Table, shape: &Shape) -> Result<Changes, Failure> {
        let metadata = table.metadata();
        let wanted = iceberg::arrow::arrow_schema_to_schema(shape.schema())
            .map_err(|e| Failure::definite(format!("internal error: {e}")))?;
        let have = metadata.current_schema();
        let mut conflicts = Vec::new();
        let mut adding = Vec::new();
        for field in wanted.as_struct().fields() {
            match have.field_by_name(&field.name) {
                // An id no schema of the table ever had: no file holds it for another column.
                None if !field.required && field.id > metadata.last_column_id() => {
                    adding.push(field.clone());
                }
                // A typed column added at the end whose field id another writer's column took.
                None if !field.required
                    && let Some(taken) = have.field_by_id(field.id) =>
                {
                    conflicts.push(format!(
                        "'{}' cannot be added: its field id {} is the table's column '{}'",
                        field.name, field.id, taken.name
                    ));
                }
                None => conflicts.push(format!("'{}' is missing", field.name)),
                Some(found) if found.field_type != field.field_type => conflicts.push(format!(
                    "'{}' is {} (ddbpipe writes {})",
                    field.name, found.field_type, field.field_type
                )),
                Some(found) if found.id != field.id => conflicts.push(format!(
                    "'{}' has field id {} (ddbpipe writes {})",
                    field.name, found.id, field.id
                )),
                Some(_) => {}
            }
        }
        for field in have.as_struct().fields() {
            if field.required && wanted.field_by_name(&field.name).is_none() {
                conflicts.push(format!("'{}' is required but not written", field.name));
            }
        }
        if !conflicts.is_empty() {
            return Err(Failure::definite(format!(
                "{} has columns that conflict with the sink's: {}; write to a new table \
                 (sink.table) or drop this one",
                self.describe(),
                conflicts.join(", ")
            )));
        }
        // Every commit reads the table's retention and merge properties (its own, then the
        // ones the run sets): one that does not read would fail the commits after their files.
        let mut properties = metadata.properties().clone();
        properties.extend(self.settings.properties.clone());
        if let Some(problem) = snapshots::properties_problem(&properties) {
            return Err(Failure::definite(format!(
                "{}: {problem}: set the property right on the table, or in sink.table_properties",
                self.describe()
            )));
        }
        // A run's data files are written in the table's default spec: where the sink's
        // partitioning is another, the run's claim makes it the default (partition evolution:
        // the files written before keep theirs).
        let spec = metadata.default_partition_spec();
        let repartitions =
            (!shape.partitioning().matches(spec)).then(|| crate::partition::describe(spec, have));
        Ok(Changes {
            columns: adding,
            repartitions,
        })
    }

    /// Rules 2 and 5: `builder` (of `table`'s next metadata) with what the run changes,
    /// checked on `table` (a writer that committed first may have changed it): the typed
    /// columns it adds, as a new current schema, then the sink's partitioning as the default
    /// spec where the table's is another. `builder` as it is outside a run.
    pub(super) fn evolved(
        &self,
        table: &Table,
        builder: TableMetadataBuilder,
    ) -> Result<TableMetadataBuilder, Failure> {
        let Some(shape) = &self.shape else {
            return Ok(builder);
        };
        let changes = self.check_columns(table, shape)?;
        if !changes.columns.is_empty() {
            let names: Vec<&str> = changes.columns.iter().map(|f| f.name.as_str()).collect();
            tracing::info!(table = %self.describe(), columns = ?names, "Adding columns to the Iceberg table.");
        }
        if let Some(was) = &changes.repartitions {
            let partitioning = shape.partitioning();
            tracing::info!(table = %self.describe(), was = %was, now = %partitioning, "Changing the Iceberg table's partitioning.");
        }
        self.evolve(table, builder, shape, &changes)
    }

    /// `builder` with `changes` (of the sink's `shape`) made. The builder checks them against
    /// every schema and spec the table ever had, which `check_columns` does not: `check` builds
    /// them too (and drops them), so it refuses what a run's claim would. A refusal is
    /// definite: the table's history does not change by retrying.
    pub(super) fn evolve(
        &self,
        table: &Table,
        mut builder: TableMetadataBuilder,
        shape: &Shape,
        changes: &Changes,
    ) -> Result<TableMetadataBuilder, Failure> {
        if !changes.columns.is_empty() {
            let refused = |e: iceberg::Error| {
                Failure::definite(format!(
                    "cannot add columns to {}: {e}; give the column another name in \
                     sink.columns, or write to a new table (sink.table)",
                    self.describe()
                ))
            };
            let have = table.metadata().current_schema();
            let schema = have
                .as_ref()
                .clone()
                .into_builder()
                .with_fields(changes.columns.iter().cloned())
                .build()
                .map_err(refused)?;
            builder = builder.add_current_schema(schema).map_err(refused)?;
        }
        if changes.repartitions.is_some() {
            builder = builder
                .add_default_partition_spec(shape.partitioning().spec().clone().into_unbound())
                .map_err(|e| {
                    Failure::definite(format!(
                        "cannot change the partitioning of {}: {e}; keep the table's in \
                         sink.partition_by, or write to a new table (sink.table)",
                        self.describe()
                    ))
                })?;
        }
        Ok(builder)
    }

    /// The commit's files as Iceberg data files.
    pub(super) fn data_files(
        &self,
        table: &Table,
        files: &[DataFile],
    ) -> Result<Vec<iceberg::spec::DataFile>, Failure> {
        let spec = table.metadata().default_partition_spec();
        let schema = table.metadata().current_schema();
        // The files' partitions are the sink's: recorded only under a spec that is the sink's
        // (another writer may have changed the table's since this run's claim).
        if let Some(shape) = self.shape.as_ref().filter(|_| !files.is_empty())
            && !shape.partitioning().matches(spec)
        {
            return Err(Failure::definite(format!(
                "{} is now partitioned by {} (another writer changed it), this run's files by \
                 {}: this run stops, its last batches uncommitted; run it again to write in \
                 its partitioning",
                self.describe(),
                crate::partition::describe(spec, schema),
                shape.partitioning()
            )));
        }
        files
            .iter()
            .map(|file| {
                let partition = file.partition.clone().unwrap_or_else(Struct::empty);
                // Rule 9: the columns' counts and bounds, that readers skip files by.
                let metrics = file
                    .metrics
                    .as_ref()
                    .map(|metrics| metrics.iceberg(schema))
                    .unwrap_or_default();
                DataFileBuilder::default()
                    .content(DataContentType::Data)
                    .column_sizes(metrics.column_sizes)
                    .value_counts(metrics.value_counts)
                    .null_value_counts(metrics.null_value_counts)
                    .lower_bounds(metrics.lower_bounds)
                    .upper_bounds(metrics.upper_bounds)
                    .file_path(self.storage.path(&file.path))
                    .file_format(DataFileFormat::Parquet)
                    .partition(partition)
                    .partition_spec_id(spec.spec_id())
                    .record_count(file.rows)
                    .file_size_in_bytes(file.bytes)
                    .build()
                    .map_err(|e| Failure::definite(format!("internal error: {e}")))
            })
            .collect()
    }
}
