//! The Iceberg sink's table (docs/sinks.md §7.11): the Parquet sink's files, committed as
//! snapshots of an Iceberg table in a SQL catalog instead of through a commit log.
//!
//! # Rules
//! 1. The table is `namespace.table` in the catalog, created when missing at
//!    `<warehouse>/<namespace>.db/<table>` with the sink's columns (their field ids as the
//!    files have them, `rows` rule 7) and partition spec (`partition`: changes by
//!    `day(event_time)` unless `partition_by` says otherwise). An existing table whose columns
//!    differ from the sink's is refused, naming each column; one partitioned otherwise, naming
//!    both partitionings. The one difference taken: optional columns the table lacks whose
//!    field ids it never used (typed columns added at the end of `columns:`) are added by the
//!    run's claim (rule 2) as a new current schema; earlier files read them as null.
//! 2. A run claims the table when it loads its position: the table property `ddbpipe.writer`
//!    becomes its pipeline and token, in the same commit as the configured table properties
//!    (which a new table is created with). A table claimed by another pipeline is refused; a run of
//!    the same pipeline whose claim was taken is stopped at its next commit (fenced).
//! 3. Every commit is a snapshot whose summary holds the position it reaches
//!    (`ddbpipe.position`, the entry a state file would hold), the pipeline and the commit's
//!    number. The position is read back on start from the newest snapshot of the pipeline:
//!    the scan branch's head when a scan run is under way, else `main`'s lineage. The same
//!    commit sets the table properties `ddbpipe.position` and `ddbpipe.commit` to its own: a
//!    table whose lineage holds no snapshot of its pipeline any more (expired by another
//!    writer's maintenance — S3 Tables' own, a Spark `expire_snapshots` — behind newer
//!    snapshots of theirs) is read from them, never taken for a table without a position.
//! 4. Changes (streams, mirror) are appended to `main`, the changelog. A scan run's commits
//!    are appended to the branch `ddbpipe-scan` (readers of `main` see nothing of them); the
//!    commit that completes the run is an overwrite of `main` listing the run's files and
//!    nothing else, and removes the branch: readers see the whole previous snapshot until
//!    then, and earlier snapshots stay reachable by time travel.
//! 5. A commit swaps the catalog's metadata location only from the one it was built on
//!    (`catalog` rule 2); a REST catalog applies the commit's updates only while the table's
//!    refs (`main`, the scan branch, the claim branch), schema and spec are the ones it was
//!    built on (`RestCatalog::commit`). When another writer committed first, the table is read
//!    again and the commit is built again on it (up to 10 times), unless the claim moved
//!    (rule 2). A run's claim built again checks the columns again (rule 1) on what that
//!    writer committed.
//! 7. In a REST catalog a claim also moves the branch `ddbpipe-claim` to a snapshot of its
//!    own (no files, no parent; the previous claim's snapshot expired in the same commit):
//!    a claim that only set a property would not fail another run's commit asserted on the
//!    refs, and that run would commit after it instead of being fenced. A table the sink
//!    creates there holds its creator's claim snapshot from the start, so that every commit
//!    is built on a table with a snapshot (`RestCatalog::commit` asserts a ref's absence only
//!    there).
//! 6. Data files a commit never named (a run stopped between writing and committing) are not
//!    part of any snapshot: readers never see them; Iceberg's orphan-file maintenance removes
//!    them.

pub mod catalog;
mod columns;
mod probe;
mod rest;
mod snapshots;

pub use probe::{current_files, probe};
pub use snapshots::properties_problem;
pub mod storage;

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use ddbpipe_pipeline::sink::SinkErrorClass;
use ddbpipe_pipeline::state::Entry;
use iceberg::spec::{MAIN_BRANCH, SnapshotRef, TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableCreation, TableIdent};

pub use catalog::{
    Catalog, GlueCatalog, RestAuth, RestCatalog, S3TablesCatalog, SqlCatalog, glue_name,
    s3tables_name, s3tables_name_problem, table_bucket_region,
};
use snapshots::{Produce, manifests, produce};
use storage::WarehouseStorage;

use crate::commits::{DataFile, SnapshotRun};
use crate::failure::Failure;
use crate::objects::Objects;
use crate::rows::Shape;

/// Where an Iceberg sink's table is.
#[derive(Debug, Clone)]
pub struct IcebergSettings {
    /// The catalog.
    pub catalog: Catalog,
    /// The table's namespace.
    pub namespace: String,
    /// The table's name.
    pub table: String,
    /// Table properties set when the table is created and at every run's claim
    /// (`sink.table_properties`).
    pub properties: BTreeMap<String, String>,
}

/// The table property a run claims (rule 2).
const WRITER: &str = "ddbpipe.writer";
/// The branch a scan run commits to (rule 4).
const SCAN_BRANCH: &str = "ddbpipe-scan";
/// Summary properties (rule 3).
const PIPELINE: &str = "ddbpipe.pipeline";
const POSITION: &str = "ddbpipe.position";
const COMMIT: &str = "ddbpipe.commit";
const RUN: &str = "ddbpipe.run";
/// Commits built again after a conflict (rule 5).
const ATTEMPTS: usize = 10;

/// What the table says when a run loads its position.
pub(crate) struct Loaded {
    pub seq: u64,
    pub entry: Option<serde_json::Value>,
    pub run: Option<SnapshotRun>,
}

/// An Iceberg sink's table, as its writer sees it.
pub(crate) struct IcebergTable {
    settings: IcebergSettings,
    storage: WarehouseStorage,
    pipeline: String,
    token: String,
    table: Option<Table>,
    /// The table's location, as a directory's name in the warehouse: `dynamodb.db/orders/`,
    /// or `` for the warehouse itself (`catalog` rule 3).
    dir: String,
    /// This writer claimed the table (rule 2): a claim that moved since fences it.
    claimed: bool,
    /// The columns a run writes: its claim checks them on the table it is built on and adds
    /// the typed ones the table lacks (rules 1 and 5).
    shape: Option<Shape>,
}

impl IcebergTable {
    pub fn new(
        settings: IcebergSettings,
        warehouse: &Objects,
        pipeline: &str,
        token: &str,
    ) -> Self {
        let dir = (settings.catalog).table_dir(&settings.namespace, &settings.table);
        IcebergTable {
            settings,
            storage: WarehouseStorage::new(warehouse.clone()),
            pipeline: pipeline.to_string(),
            token: token.to_string(),
            table: None,
            dir,
            claimed: false,
            shape: None,
        }
    }

    /// The table for messages.
    pub fn describe(&self) -> String {
        format!(
            "Iceberg table {}.{} ({})",
            self.settings.namespace,
            self.settings.table,
            self.settings.catalog.describe()
        )
    }

    fn failed(&self, doing: &str, error: impl std::fmt::Display) -> Failure {
        Failure::transient(format!("cannot {doing} {}: {error}", self.describe()))
    }

    fn ident(&self) -> Result<TableIdent, Failure> {
        TableIdent::from_strs([&self.settings.namespace, &self.settings.table])
            .map_err(|e| Failure::definite(format!("{}: {e}", self.describe())))
    }

    fn claim(&self) -> String {
        format!("{} {}", self.pipeline, self.token)
    }

    /// The table as the catalog has it now; `None` when there is none.
    async fn current(&self) -> Result<Option<Table>, Failure> {
        let catalog = &self.settings.catalog;
        if let Catalog::Rest(rest) = catalog {
            let loaded = rest.load(&self.settings.namespace, &self.settings.table);
            return match loaded.await? {
                Some((location, metadata)) => self.table(location, metadata).map(Some),
                None => Ok(None),
            };
        }
        let Some(location) = catalog
            .location(&self.settings.namespace, &self.settings.table)
            .await?
        else {
            return Ok(None);
        };
        let metadata = TableMetadata::read_from(&self.storage.file_io(), &location)
            .await
            .map_err(|e| self.failed("read the metadata of", e))?;
        self.table(location, metadata).map(Some)
    }

    /// The table at metadata `location`, which holds `metadata`.
    fn table(&self, location: String, metadata: TableMetadata) -> Result<Table, Failure> {
        Table::builder()
            .file_io(self.storage.file_io())
            .metadata_location(location)
            .metadata(metadata)
            .identifier(self.ident()?)
            .runtime(iceberg::Runtime::current())
            .build()
            .map_err(|e| self.failed("open", e))
    }

    /// Rule 1: the table, created when missing.
    async fn open(&self, shape: &Shape) -> Result<Table, Failure> {
        if let Some(table) = self.current().await? {
            return Ok(table);
        }
        let schema = iceberg::arrow::arrow_schema_to_schema(shape.schema())
            .map_err(|e| Failure::definite(format!("internal error: {e}")))?;
        let spec = shape.partitioning().spec().clone().into_unbound();
        let creation = TableCreation::builder()
            .name(self.settings.table.clone())
            .location(self.location())
            .schema(schema)
            .partition_spec(spec)
            .properties(self.properties())
            .build();
        let mut metadata = TableMetadataBuilder::from_table_creation(creation)
            .and_then(TableMetadataBuilder::build)
            .map_err(|e| self.failed("create", e))?
            .metadata;
        if matches!(self.settings.catalog, Catalog::Rest(_)) {
            metadata = self.claimed_at_creation(metadata).await?;
        }
        let location = MetadataLocation::new_with_metadata(self.location(), &metadata);
        metadata
            .write_to(&self.storage.file_io(), &location)
            .await
            .map_err(|e| self.failed("create", e))?;
        let location = location.to_string();
        let catalog = &self.settings.catalog;
        catalog
            .create(
                &self.settings.namespace,
                &self.settings.table,
                &location,
                metadata.current_schema(),
            )
            .await?;
        tracing::info!(table = %self.describe(), "Created the Iceberg table.");
        self.current()
            .await?
            .ok_or_else(|| self.failed("create", "the catalog has no row for it"))
    }

    /// Rules 1–3: the table opened (created by a run), checked and claimed; the position.
    pub async fn load(&mut self, shape: &Shape, runs: bool) -> Result<Loaded, Failure> {
        let table = if runs {
            self.open(shape).await?
        } else {
            match self.current().await? {
                Some(table) => table,
                None => {
                    return Ok(Loaded {
                        seq: 0,
                        entry: None,
                        run: None,
                    });
                }
            }
        };
        self.locate(&table)?;
        if runs {
            // Refused before the position is read; the claim checks again on what it is built on.
            self.check_columns(&table, shape)?;
            self.shape = Some(shape.clone());
        }
        let loaded = self.position(&table)?;
        self.table = Some(table);
        if runs {
            self.claim_table().await?;
        }
        Ok(loaded)
    }

    /// The table's location: its directory, without the `/` that ends a directory's name.
    fn location(&self) -> String {
        let path = self.storage.path(&self.dir);
        path.trim_end_matches('/').to_string()
    }

    /// Rules 1 and 2: the table is under the warehouse and not another pipeline's.
    fn locate(&mut self, table: &Table) -> Result<(), Failure> {
        let metadata = table.metadata();
        // A location is a directory: the warehouse itself is one (`catalog` rule 3).
        let location = format!("{}/", metadata.location().trim_end_matches('/'));
        self.dir = self
            .storage
            .name(&location)
            .map_err(|_| {
                Failure::definite(format!(
                    "{} is at {}, outside the warehouse {}: give sink.warehouse its warehouse",
                    self.describe(),
                    metadata.location(),
                    self.storage.path("")
                ))
            })?
            .to_string();
        if let Some(writer) = metadata.properties().get(WRITER)
            && let Some((pipeline, _)) = writer.split_once(' ')
            && pipeline != self.pipeline
        {
            return Err(Failure::definite(format!(
                "{} holds the output of pipeline '{pipeline}'; give pipeline '{}' a table of its \
                 own (sink.table)",
                self.describe(),
                self.pipeline
            )));
        }
        Ok(())
    }

    /// Rule 3: the newest snapshot of the pipeline's position, its commit number and run.
    fn position(&self, table: &Table) -> Result<Loaded, Failure> {
        let metadata = table.metadata();
        let branch = metadata.snapshot_for_ref(SCAN_BRANCH);
        // Only a scan run commits to the branch (a changelog's columns are not a snapshot's).
        let found = match branch {
            Some(head) => Some(head.clone()),
            None => self.lineage(table).find(|s| self.ours(s)),
        };
        let Some(snapshot) = found else {
            // Rule 3: the last commit's own position, kept in the table's properties (a table
            // claimed by another pipeline was refused: `locate`).
            let properties = metadata.properties();
            if properties.contains_key(POSITION) {
                tracing::warn!(
                    table = %self.describe(),
                    "No snapshot of the pipeline is left in the table's history (expired by \
                     another writer's maintenance); its last position is read from the table's \
                     properties."
                );
            }
            return Ok(Loaded {
                seq: (properties.get(COMMIT)).map_or(0, |c| c.parse().unwrap_or(0)),
                entry: self.entry(properties.get(POSITION), "the table's properties")?,
                run: None,
            });
        };
        let summary = &snapshot.summary().additional_properties;
        let entry = self.entry(
            summary.get(POSITION),
            &format!("snapshot {}", snapshot.snapshot_id()),
        )?;
        let run = branch.and_then(|head| head.summary().additional_properties.get(RUN));
        Ok(Loaded {
            seq: summary
                .get(COMMIT)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            entry,
            run: run.map(|dir| SnapshotRun {
                dir: dir.clone(),
                started_at: dir.clone(),
                files: Vec::new(),
                completed_at: None,
            }),
        })
    }

    /// The position `text` (`null`, or none: no position) that `holder` holds.
    fn entry(
        &self,
        text: Option<&String>,
        holder: &str,
    ) -> Result<Option<serde_json::Value>, Failure> {
        match text.map(String::as_str) {
            None | Some("null") => Ok(None),
            Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
                Failure::definite(format!(
                    "{}: {holder} holds a position that is not JSON ({e})",
                    self.describe()
                ))
            }),
        }
    }

    fn ours(&self, snapshot: &SnapshotRef) -> bool {
        snapshot.summary().additional_properties.get(PIPELINE) == Some(&self.pipeline)
    }

    /// `main`'s snapshots, newest first.
    fn lineage<'a>(&self, table: &'a Table) -> impl Iterator<Item = SnapshotRef> + 'a {
        let metadata = table.metadata();
        std::iter::successors(metadata.current_snapshot().cloned(), move |s| {
            s.parent_snapshot_id()
                .and_then(|id| metadata.snapshot_by_id(id))
                .cloned()
        })
    }

    /// Rule 2: the run's claim, committed.
    async fn claim_table(&mut self) -> Result<(), Failure> {
        for _ in 0..ATTEMPTS {
            let table = self
                .table
                .clone()
                .ok_or_else(|| self.failed("claim", "not loaded"))?;
            if table.metadata().properties().get(WRITER) == Some(&self.claim()) {
                // The table this writer created holds its claim already.
                self.claimed = true;
                return Ok(());
            }
            let claim: HashMap<String, String> = self.properties().into_iter().collect();
            let mut builder = self
                .builder(&table)?
                .set_properties(claim)
                .map_err(|e| self.failed("claim", e))?;
            builder = self.evolved(&table, builder)?;
            if matches!(self.settings.catalog, Catalog::Rest(_)) {
                builder = self.claim_branch(&table, builder).await?;
            }
            if self.swap(&table, builder).await? {
                self.claimed = true;
                return Ok(());
            }
        }
        Err(self.failed("claim", "other writers kept committing first"))
    }

    /// Rule 2: the properties a run sets: the configured ones and its claim.
    fn properties(&self) -> Vec<(String, String)> {
        let configured = self.settings.properties.clone().into_iter();
        configured
            .chain([(WRITER.to_string(), self.claim())])
            .collect()
    }

    fn builder(&self, table: &Table) -> Result<TableMetadataBuilder, Failure> {
        let location = table
            .metadata_location_result()
            .map_err(|e| self.failed("commit to", e))?;
        Ok(table
            .metadata()
            .clone()
            .into_builder(Some(location.to_string())))
    }

    /// Writes the new metadata and swaps the catalog to it (rule 5): `false` on a conflict,
    /// when the table is read again.
    async fn swap(
        &mut self,
        table: &Table,
        builder: TableMetadataBuilder,
    ) -> Result<bool, Failure> {
        let committed = match &self.settings.catalog {
            Catalog::Rest(rest) => self.commit_updates(rest, table, builder).await?,
            catalog => self.swap_location(catalog, table, builder).await?,
        };
        if let Some((location, metadata)) = committed {
            self.table = Some(self.table(location, metadata)?);
            return Ok(true);
        }
        tracing::info!(table = %self.describe(), "Another writer committed first; committing again on its snapshot.");
        self.table = self.current().await?;
        Ok(false)
    }

    /// Rule 5 in a catalog of locations: the new metadata written and swapped in; its
    /// location and metadata, `None` on a conflict.
    async fn swap_location(
        &self,
        catalog: &Catalog,
        table: &Table,
        builder: TableMetadataBuilder,
    ) -> Result<Option<(String, TableMetadata)>, Failure> {
        let old = table
            .metadata_location_result()
            .map_err(|e| self.failed("commit to", e))?;
        let metadata = builder
            .build()
            .map_err(|e| self.failed("commit to", e))?
            .metadata;
        let new = MetadataLocation::from_str(old)
            .map_err(|e| self.failed("commit to", e))?
            .with_next_version()
            .with_new_metadata(&metadata);
        metadata
            .write_to(&self.storage.file_io(), &new)
            .await
            .map_err(|e| self.failed("commit to", e))?;
        let new = new.to_string();
        let (namespace, name) = (&self.settings.namespace, &self.settings.table);
        let schema = metadata.current_schema();
        let swapped = catalog.swap(namespace, name, old, &new, schema).await?;
        Ok(swapped.then_some((new, metadata)))
    }

    /// Where the table's data files go (under it, a partition's directory).
    pub fn data_dir(&self) -> String {
        format!("{}data", self.dir)
    }

    /// Rules 3–5: one snapshot holding `files` and `entry`'s position.
    pub async fn commit(
        &mut self,
        files: &[DataFile],
        entry: Option<&Entry>,
        seq: u64,
        run: Option<&SnapshotRun>,
        completes: bool,
    ) -> Result<(), Failure> {
        let position = match entry {
            Some(entry) => entry.to_json().to_string(),
            None => "null".to_string(),
        };
        let mut properties = HashMap::from([
            (PIPELINE.to_string(), self.pipeline.clone()),
            (POSITION.to_string(), position),
            (COMMIT.to_string(), seq.to_string()),
        ]);
        if let Some(run) = run {
            properties.insert(RUN.to_string(), run.dir.clone());
        }
        if self.table.is_none() && entry.is_none() {
            // `state reset` of a table never written: there is no position to clear.
            return Ok(());
        }
        if !self.claimed {
            // A store outside a run (`state reset`) claims as a run does: a run still going
            // is fenced at its next commit.
            self.claim_table().await?;
        }
        for _ in 0..ATTEMPTS {
            let table = self
                .table
                .clone()
                .ok_or_else(|| self.failed("commit to", "the table is gone from the catalog"))?;
            if table.metadata().properties().get(WRITER) != Some(&self.claim()) {
                return Err(Failure {
                    message: format!(
                        "another run of pipeline '{}' claimed {}; this run stops, its last \
                         batches uncommitted",
                        self.pipeline,
                        self.describe()
                    ),
                    class: SinkErrorClass::Fenced,
                });
            }
            let data = self.data_files(&table, files)?;
            // Rule 3: the position kept beside the snapshot, for when it expires.
            let kept = HashMap::from([
                (POSITION.to_string(), properties[POSITION].clone()),
                (COMMIT.to_string(), seq.to_string()),
            ]);
            let builder = self
                .snapshot(&table, data, properties.clone(), run, completes)
                .await?
                .remove_snapshots(&self.expired(&table)?)
                .set_properties(kept)
                .map_err(|e| self.failed("commit to", e))?;
            if self.swap(&table, builder).await? {
                return Ok(());
            }
        }
        Err(self.failed("commit to", "other writers kept committing first"))
    }

    /// `snapshots` rule 4: what a commit expires.
    fn expired(&self, table: &Table) -> Result<Vec<i64>, Failure> {
        let position = self.lineage(table).find(|s| self.ours(s));
        let now = ddbpipe_source::clock::unix_now_ms();
        snapshots::expired(table.metadata(), now, position.map(|s| s.snapshot_id()))
            .map_err(|e| self.failed("commit to", e))
    }

    /// Rule 4: the snapshot, on `main` or the scan branch, in the table's new metadata.
    async fn snapshot(
        &self,
        table: &Table,
        files: Vec<iceberg::spec::DataFile>,
        properties: HashMap<String, String>,
        run: Option<&SnapshotRun>,
        completes: bool,
    ) -> Result<TableMetadataBuilder, Failure> {
        let metadata = table.metadata();
        let main = metadata.current_snapshot().cloned();
        let failed = |e: iceberg::Error| self.failed("commit to", e);
        let Some(run) = run else {
            let kept = match &main {
                Some(main) => manifests(table, main).await.map_err(failed)?,
                None => Vec::new(),
            };
            let snapshot = produce(Produce {
                table,
                parent: main.as_ref(),
                kept,
                totals_of: main.as_ref(),
                overwrite: false,
                replaces: None,
                files,
                properties,
                token: &self.token,
            })
            .await
            .map_err(failed)?;
            return self
                .builder(table)?
                .set_branch_snapshot(snapshot, MAIN_BRANCH)
                .map_err(failed);
        };
        let head = metadata
            .snapshot_for_ref(SCAN_BRANCH)
            .filter(|head| head.summary().additional_properties.get(RUN) == Some(&run.dir))
            .cloned();
        let kept = match &head {
            Some(head) => manifests(table, head).await.map_err(failed)?,
            None => Vec::new(),
        };
        let (parent, branch) = if completes {
            (main.as_ref(), MAIN_BRANCH)
        } else {
            (head.as_ref(), SCAN_BRANCH)
        };
        let snapshot = produce(Produce {
            table,
            parent,
            kept,
            totals_of: head.as_ref(),
            overwrite: completes,
            replaces: main.as_ref().filter(|_| completes),
            files,
            properties,
            token: &self.token,
        })
        .await
        .map_err(failed)?;
        let builder = self
            .builder(table)?
            .set_branch_snapshot(snapshot, branch)
            .map_err(failed)?;
        Ok(if completes {
            builder.remove_ref(SCAN_BRANCH)
        } else {
            builder
        })
    }
}
