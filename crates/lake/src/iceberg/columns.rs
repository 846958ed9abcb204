//! The Iceberg table's columns (docs/sinks.md §7.11 rules 1, 2 and 9): the sink's checked
//! against the table's, the typed columns a run adds, and a data file's column metrics as its
//! manifest entry carries them.

use iceberg::spec::{
    DataContentType, DataFileBuilder, DataFileFormat, NestedFieldRef, Schema, Struct,
};
use iceberg::table::Table;

use super::{IcebergTable, snapshots};
use crate::commits::DataFile;
use crate::failure::Failure;
use crate::rows::Shape;

impl IcebergTable {
    /// Rule 1: the table's columns and partition spec are the sink's, its properties read;
    /// the columns a run adds.
    pub(super) fn check_columns(
        &self,
        table: &Table,
        shape: &Shape,
    ) -> Result<Vec<NestedFieldRef>, Failure> {
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
        // Its data files are written in the table's default spec: it must be the sink's.
        let (spec, partitioning) = (metadata.default_partition_spec(), shape.partitioning());
        if !partitioning.matches(spec) {
            return Err(Failure::definite(format!(
                "{} is partitioned by {}, the sink by {} (sink.partition_by): give \
                 partition_by the table's partitioning, write to a new table (sink.table) or \
                 drop this one",
                self.describe(),
                crate::partition::describe(spec, have),
                partitioning
            )));
        }
        Ok(adding)
    }

    /// Rules 1 and 5: the table's current schema with the typed columns a run adds that it
    /// does not have yet, its columns checked on `table` (a writer that committed first may
    /// have added them, or changed others); `None` when none is, or outside a run.
    pub(super) fn added_schema(&self, table: &Table) -> Result<Option<Schema>, Failure> {
        let Some(shape) = &self.shape else {
            return Ok(None);
        };
        let adding = self.check_columns(table, shape)?;
        if adding.is_empty() {
            return Ok(None);
        }
        let names: Vec<&str> = adding.iter().map(|field| field.name.as_str()).collect();
        tracing::info!(table = %self.describe(), columns = ?names, "Adding columns to the Iceberg table.");
        let have = table.metadata().current_schema();
        have.as_ref()
            .clone()
            .into_builder()
            .with_fields(adding)
            .build()
            .map(Some)
            .map_err(|e| self.failed("add columns to", e))
    }

    /// The commit's files as Iceberg data files.
    pub(super) fn data_files(
        &self,
        table: &Table,
        files: &[DataFile],
    ) -> Result<Vec<iceberg::spec::DataFile>, Failure> {
        let spec = table.metadata().default_partition_spec();
        let schema = table.metadata().current_schema();
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
