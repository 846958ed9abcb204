//! The Iceberg sink's table in a REST catalog (`iceberg` rules 5 and 7): a commit made of the
//! metadata builder's updates, and the claim branch that fences an earlier run.

use std::collections::HashMap;

use iceberg::spec::{MAIN_BRANCH, TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableUpdate};

use super::snapshots::{Produce, produce};
use super::{IcebergTable, RestCatalog, SCAN_BRANCH};
use crate::failure::Failure;

/// The branch a claim moves in a REST catalog (rule 7).
pub(super) const CLAIM_BRANCH: &str = "ddbpipe-claim";
/// The refs a REST catalog's commit asserts (rule 5).
const REFS: [&str; 3] = [MAIN_BRANCH, SCAN_BRANCH, CLAIM_BRANCH];
/// The claim a claim branch's snapshot names (rule 7).
const CLAIM: &str = "ddbpipe.claim";

impl IcebergTable {
    /// Rule 7: a new table's `metadata` holding its creator's claim snapshot from the start.
    pub(super) async fn claimed_at_creation(
        &self,
        metadata: TableMetadata,
    ) -> Result<TableMetadata, Failure> {
        let first = MetadataLocation::new_with_metadata(self.location(), &metadata);
        let table = self.table(first.to_string(), metadata.clone())?;
        let builder = metadata.into_builder(None);
        Ok(self
            .claim_branch(&table, builder)
            .await?
            .build()
            .map_err(|e| self.failed("create", e))?
            .metadata)
    }

    /// Rule 7: the claim branch moved to a snapshot of this claim's.
    pub(super) async fn claim_branch(
        &self,
        table: &Table,
        builder: TableMetadataBuilder,
    ) -> Result<TableMetadataBuilder, Failure> {
        let failed = |e: iceberg::Error| self.failed("claim", e);
        let snapshot = produce(Produce {
            table,
            parent: None,
            kept: Vec::new(),
            totals_of: None,
            overwrite: false,
            replaces: None,
            files: Vec::new(),
            properties: HashMap::from([(CLAIM.to_string(), self.claim())]),
            token: &self.token,
        })
        .await
        .map_err(failed)?;
        let builder = builder
            .set_branch_snapshot(snapshot, CLAIM_BRANCH)
            .map_err(failed)?;
        Ok(match table.metadata().snapshot_for_ref(CLAIM_BRANCH) {
            Some(earlier) => builder.remove_snapshots(&[earlier.snapshot_id()]),
            None => builder,
        })
    }

    /// Rule 5 in a REST catalog: the builder's updates committed under the requirements that
    /// the table is still `table`; the table's new location and metadata, `None` on a
    /// conflict.
    pub(super) async fn commit_updates(
        &self,
        rest: &RestCatalog,
        table: &Table,
        builder: TableMetadataBuilder,
    ) -> Result<Option<(String, TableMetadata)>, Failure> {
        let built = builder.build().map_err(|e| self.failed("commit to", e))?;
        let snapshot = built.changes.iter().find_map(|update| match update {
            TableUpdate::AddSnapshot { snapshot } => Some(snapshot.snapshot_id()),
            _ => None,
        });
        let (namespace, name) = (&self.settings.namespace, &self.settings.table);
        rest.commit(
            namespace,
            name,
            table.metadata(),
            &REFS,
            built.changes,
            snapshot,
        )
        .await
    }
}
