//! Snapshots of an Iceberg table, built with the `iceberg` crate's manifest, manifest-list,
//! summary and metadata writers: an append (the changelog; a scan run's progress on its
//! branch) and the overwrite a completed scan run makes (which `iceberg` 0.10 has no action
//! for: its `Transaction` only appends, on `main`).
//!
//! # Rules
//! 1. A snapshot lists its parent's manifests (none for a snapshot that replaces the content)
//!    and one new manifest holding the files it adds (none when it adds no file: a commit of
//!    a position only).
//! 2. Its summary holds the commit's own properties (ddbpipe's position), then what the
//!    `iceberg` crate computes for the added files (`added-*`), then the totals: the base's
//!    totals plus what was added; an overwrite also names what it deleted (`deleted-*`: the
//!    totals of the snapshot it replaced).
//! 3. Manifests and the manifest list are written under `<table>/metadata/`, named by the
//!    snapshot's id and the writer's token: a failed commit leaves them unreferenced, never
//!    a file a committed snapshot names.
//! 4. A commit expires what the table's own retention properties say (Iceberg's
//!    `history.expire.max-snapshot-age-ms`, default 5 days, and
//!    `history.expire.min-snapshots-to-keep`, default 1): snapshots older than the age, other
//!    than the newest of `main`'s lineage to keep, the head of any branch or tag, and the
//!    newest snapshot holding the pipeline's position. They leave
//!    the metadata (which would otherwise grow by a snapshot and its position every commit);
//!    their files are left to Iceberg's orphan-file maintenance.
//! 5. Manifests are merged as Iceberg's own writers merge them (the table's
//!    `commit.manifest-merge.enabled`, default true; `commit.manifest.min-count-to-merge`,
//!    default 100; `commit.manifest.target-size-bytes`, default 8 MiB): once a snapshot would
//!    list at least the minimum count, the data manifests it keeps that are smaller than the
//!    target are rewritten, in order, into manifests of about the target size, each live file
//!    once with the snapshot and sequence numbers it was added with (`EXISTING`). Otherwise a
//!    changelog committing every minute would list one more manifest in every commit for ever.

use std::collections::{HashMap, HashSet};

use ddbpipe_source::clock::unix_now_ms;
use iceberg::spec::{
    DataFile, ManifestContentType, ManifestFile, ManifestListWriter, ManifestWriterBuilder,
    Operation, Snapshot, SnapshotRef, SnapshotSummaryCollector, Summary, TableMetadata,
};
use iceberg::table::Table;

/// What a new snapshot is built from.
pub struct Produce<'a> {
    /// The table as last loaded.
    pub table: &'a Table,
    /// The snapshot it follows (its parent).
    pub parent: Option<&'a SnapshotRef>,
    /// The manifests it keeps (rule 1).
    pub kept: Vec<ManifestFile>,
    /// The snapshot whose totals it adds to (rule 2).
    pub totals_of: Option<&'a SnapshotRef>,
    /// It replaces the content of the branch it is committed to (an overwrite).
    pub overwrite: bool,
    /// The snapshot whose content it replaces (rule 2's `deleted-*`).
    pub replaces: Option<&'a SnapshotRef>,
    /// The data files it adds.
    pub files: Vec<DataFile>,
    /// ddbpipe's own summary properties.
    pub properties: HashMap<String, String>,
    /// The writer's token (rule 3).
    pub token: &'a str,
}

/// The manifests `snapshot` lists.
pub async fn manifests(
    table: &Table,
    snapshot: &SnapshotRef,
) -> iceberg::Result<Vec<ManifestFile>> {
    let list = table.manifest_list_reader(snapshot).load().await?;
    Ok(list.consume_entries().into_iter().collect())
}

/// A snapshot id no snapshot of `table` has: random, positive.
fn snapshot_id(table: &Table) -> i64 {
    loop {
        let id = (rand::random::<u64>() >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// Builds the snapshot (rules 1–3): its files are written, the table's metadata is not.
pub async fn produce(produce: Produce<'_>) -> iceberg::Result<Snapshot> {
    let Produce {
        table,
        parent,
        kept,
        totals_of,
        overwrite,
        replaces,
        files,
        mut properties,
        token,
    } = produce;
    let metadata = table.metadata();
    let id = snapshot_id(table);
    let sequence = metadata.next_sequence_number();
    let schema = metadata.current_schema().clone();
    let spec = metadata.default_partition_spec().clone();
    let io = table.file_io();
    let dir = format!("{}/metadata", metadata.location().trim_end_matches('/'));
    let mut collected = SnapshotSummaryCollector::default();
    for file in &files {
        collected.add_file(file, schema.clone(), spec.clone());
    }
    let written = Written {
        table,
        id,
        dir: &dir,
        token,
    };
    let mut kept = merged(kept, !files.is_empty(), &written).await?;
    if !files.is_empty() {
        let output = io.new_output(format!("{dir}/{token}-{id}-m0.avro"))?;
        let mut manifest =
            ManifestWriterBuilder::new(output, Some(id), schema.clone(), spec.as_ref().clone())
                .build_v2_data();
        for file in files {
            manifest.add_file(file, sequence)?;
        }
        kept.push(manifest.write_manifest_file().await?);
    }
    let list = format!("{dir}/snap-{id}-1-{token}.avro");
    let mut writer = ManifestListWriter::v2(
        io.new_output(&list)?.writer().await?,
        id,
        parent.map(|p| p.snapshot_id()),
        sequence,
    );
    writer.add_manifests(kept.into_iter())?;
    writer.close().await?;
    let added = collected.build();
    let total = |key: &str| -> u64 {
        let before = totals_of
            .and_then(|s| {
                s.summary()
                    .additional_properties
                    .get(&format!("total-{key}"))
            })
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let now = added
            .get(&format!("added-{key}"))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        before + now
    };
    let mut totals: HashMap<String, String> = ["records", "files-size", "data-files"]
        .into_iter()
        .map(|key| (format!("total-{key}"), total(key).to_string()))
        .collect();
    for key in ["delete-files", "position-deletes", "equality-deletes"] {
        totals.insert(format!("total-{key}"), "0".into());
    }
    if let Some(replaced) = replaces {
        let summary = &replaced.summary().additional_properties;
        for (from, to) in [
            ("total-records", "deleted-records"),
            ("total-data-files", "deleted-data-files"),
            ("total-files-size", "removed-files-size"),
        ] {
            if let Some(value) = summary.get(from) {
                totals.insert(to.to_string(), value.clone());
            }
        }
    }
    properties.extend(added);
    properties.extend(totals);
    let operation = if overwrite {
        Operation::Overwrite
    } else {
        Operation::Append
    };
    Ok(Snapshot::builder()
        .with_manifest_list(list)
        .with_snapshot_id(id)
        .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
        .with_sequence_number(sequence)
        .with_summary(Summary {
            operation,
            additional_properties: properties,
        })
        .with_schema_id(metadata.current_schema_id())
        .with_timestamp_ms(unix_now_ms())
        .build())
}

/// Where a snapshot's new manifests go (rule 3).
struct Written<'a> {
    table: &'a Table,
    id: i64,
    dir: &'a str,
    token: &'a str,
}

/// Rule 5: the manifest merge properties of `properties`, Iceberg's names and defaults; a
/// value that does not read fails the commit naming it, as rule 4's do in the crate.
fn merge_settings(properties: &HashMap<String, String>) -> Result<(bool, usize, i64), String> {
    fn read<T: std::str::FromStr>(
        properties: &HashMap<String, String>,
        key: &str,
        default: T,
    ) -> Result<T, String> {
        match properties.get(key) {
            None => Ok(default),
            Some(value) => value
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| format!("table property {key} is '{value}', which does not read")),
        }
    }
    Ok((
        read(properties, "commit.manifest-merge.enabled", true)?,
        read(properties, "commit.manifest.min-count-to-merge", 100)?,
        read(
            properties,
            "commit.manifest.target-size-bytes",
            8 * 1024 * 1024,
        )?,
    ))
}

/// Rules 4 and 5: what in `properties` (table properties a run sets) every commit would fail
/// on, named; `None` when they all read.
pub fn properties_problem(properties: &HashMap<String, String>) -> Option<String> {
    if let Err(e) = iceberg::spec::TableProperties::try_from(properties) {
        return Some(e.message().to_string());
    }
    merge_settings(properties).err()
}

/// Rule 5: `kept`, with its runs of small data manifests merged once the snapshot would list
/// the minimum count (`adding`: it adds a manifest of its own).
async fn merged(
    kept: Vec<ManifestFile>,
    adding: bool,
    written: &Written<'_>,
) -> iceberg::Result<Vec<ManifestFile>> {
    let metadata = written.table.metadata();
    let (enabled, min_count, target) = merge_settings(metadata.properties())
        .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e))?;
    if !enabled || kept.len() + usize::from(adding) < min_count.max(2) {
        return Ok(kept);
    }
    let spec = metadata.default_partition_spec().spec_id();
    let mut merged = Vec::new();
    let mut bin: Vec<ManifestFile> = Vec::new();
    let mut bytes = 0;
    for manifest in kept {
        let small = manifest.content == ManifestContentType::Data
            && manifest.partition_spec_id == spec
            && manifest.manifest_length < target;
        if !small {
            merged.push(manifest);
            continue;
        }
        if !bin.is_empty() && bytes + manifest.manifest_length > target {
            let n = merged.len() + 1;
            merged.extend(rewritten(std::mem::take(&mut bin), n, written).await?);
            bytes = 0;
        }
        bytes += manifest.manifest_length;
        bin.push(manifest);
    }
    let n = merged.len() + 1;
    merged.extend(rewritten(bin, n, written).await?);
    Ok(merged)
}

/// Rule 5: the manifests of `bin` as one (manifest `n` of the snapshot), each live file once
/// as `EXISTING` with the numbers it was added with; a bin of one stays as it is.
async fn rewritten(
    bin: Vec<ManifestFile>,
    n: usize,
    written: &Written<'_>,
) -> iceberg::Result<Vec<ManifestFile>> {
    if bin.len() < 2 {
        return Ok(bin);
    }
    let (table, id) = (written.table, written.id);
    let metadata = table.metadata();
    let output = table
        .file_io()
        .new_output(format!("{}/{}-{id}-m{n}.avro", written.dir, written.token))?;
    let mut writer = ManifestWriterBuilder::new(
        output,
        Some(id),
        metadata.current_schema().clone(),
        metadata.default_partition_spec().as_ref().clone(),
    )
    .build_v2_data();
    for manifest in &bin {
        let loaded = manifest.load_manifest(table.file_io()).await?;
        // A deleted entry says the file left the table as of its snapshot: it is not listed.
        for entry in loaded.entries().iter().filter(|entry| entry.is_alive()) {
            let sequence = entry.sequence_number().unwrap_or(manifest.sequence_number);
            writer.add_existing_file(
                entry.data_file().clone(),
                entry.snapshot_id().unwrap_or(manifest.added_snapshot_id),
                sequence,
                entry.file_sequence_number.or(Some(sequence)),
            )?;
        }
    }
    Ok(vec![writer.write_manifest_file().await?])
}

/// Rule 4: the snapshots a commit at `now_ms` expires; `position` is kept too (the newest
/// snapshot holding the pipeline's position, however old: other writers may have committed
/// since).
pub fn expired(
    metadata: &TableMetadata,
    now_ms: i64,
    position: Option<i64>,
) -> iceberg::Result<Vec<i64>> {
    let properties = metadata.table_properties()?;
    let cutoff = now_ms.saturating_sub(properties.max_snapshot_age_ms);
    let mut kept: HashSet<i64> = HashSet::new();
    let mut next = metadata.current_snapshot_id();
    while let Some(id) = next.filter(|_| kept.len() < properties.min_snapshots_to_keep) {
        kept.insert(id);
        next = metadata
            .snapshot_by_id(id)
            .and_then(|snapshot| snapshot.parent_snapshot_id());
    }
    // The heads of every branch and tag, a reader's too (the crate gives the refs only in the
    // metadata's own JSON).
    let refs = serde_json::to_value(metadata)
        .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.to_string()))?;
    let heads = refs["refs"]
        .as_object()
        .into_iter()
        .flat_map(|refs| refs.values())
        .filter_map(|reference| reference["snapshot-id"].as_i64());
    kept.extend(heads.chain(position));
    Ok(metadata
        .snapshots()
        .filter(|s| s.timestamp_ms() < cutoff && !kept.contains(&s.snapshot_id()))
        .map(|s| s.snapshot_id())
        .collect())
}
