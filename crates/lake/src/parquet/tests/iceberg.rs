//! The writer committing to an Iceberg table (`iceberg` rules 2–5): what another writer
//! commits is built on, a new claim fences the old run, and the position is read back from the
//! newest snapshot of the pipeline.

use std::collections::HashMap;
use std::str::FromStr;

use ::iceberg::MetadataLocation;
use ::iceberg::spec::TableMetadata;

use super::*;
use crate::iceberg::storage::WarehouseStorage;
use crate::iceberg::{IcebergSettings, SqlCatalog};

fn iceberg_settings(dir: &Path) -> ParquetSettings {
    ParquetSettings {
        objects: Objects::Local(dir.join("warehouse")),
        iceberg: Some(IcebergSettings {
            catalog: SqlCatalog::new(dir.join("catalog.db"), "ddbpipe".into()).into(),
            namespace: "dynamodb".into(),
            table: "orders".into(),
            properties: Default::default(),
        }),
        ..settings(dir, Duration::ZERO)
    }
}

/// A run of pipeline `orders` into the table in `dir`: its position loaded (the table
/// claimed), a fresh scan started.
async fn started(dir: &Path) -> (ParquetSink, ParquetPositions) {
    let (mut sink, mut store) = ParquetSink::open(iceberg_settings(dir));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    (sink, store)
}

/// What a writer that is not ddbpipe commits: a table property, through the catalog's swap.
async fn foreign_commit(dir: &Path) {
    foreign_commit_with(dir, "owner", "spark").await;
}

async fn foreign_commit_with(dir: &Path, key: &str, value: &str) {
    foreign_commit_of(dir, |_, metadata| {
        metadata.set_properties(HashMap::from([(key.to_string(), value.to_string())]))
    })
    .await;
}

/// Another writer's commit of `change` to the table in `dir` ([`foreign_metadata`], swapped in).
async fn foreign_commit_of(
    dir: &Path,
    change: impl FnOnce(
        &TableMetadata,
        ::iceberg::spec::TableMetadataBuilder,
    ) -> ::iceberg::Result<::iceberg::spec::TableMetadataBuilder>,
) {
    let (catalog, _, old) = catalog_of(dir).await;
    let new = foreign_metadata(dir, change).await;
    assert!(
        catalog
            .swap("dynamodb", "orders", &old, &new)
            .await
            .unwrap()
    );
}

/// Another writer's next metadata of the table in `dir`, `change` made to the current one:
/// written, not swapped in; its location.
async fn foreign_metadata(
    dir: &Path,
    change: impl FnOnce(
        &TableMetadata,
        ::iceberg::spec::TableMetadataBuilder,
    ) -> ::iceberg::Result<::iceberg::spec::TableMetadataBuilder>,
) -> String {
    let (_, io, old) = catalog_of(dir).await;
    let metadata = TableMetadata::read_from(&io, &old).await.unwrap();
    let builder = metadata.clone().into_builder(Some(old.clone()));
    let metadata = change(&metadata, builder)
        .unwrap()
        .build()
        .unwrap()
        .metadata;
    let new = MetadataLocation::from_str(&old)
        .unwrap()
        .with_next_version()
        .with_new_metadata(&metadata);
    metadata.write_to(&io, &new).await.unwrap();
    new.to_string()
}

async fn current(dir: &Path) -> TableMetadata {
    let (_, io, location) = catalog_of(dir).await;
    TableMetadata::read_from(&io, &location).await.unwrap()
}

/// The catalog in `dir`, the warehouse's file access, and the table's metadata location.
async fn catalog_of(dir: &Path) -> (SqlCatalog, ::iceberg::io::FileIO, String) {
    let catalog = SqlCatalog::new(dir.join("catalog.db"), "ddbpipe".into());
    let io = WarehouseStorage::new(Objects::Local(dir.join("warehouse"))).file_io();
    let location = catalog
        .location("dynamodb", "orders")
        .await
        .unwrap()
        .unwrap();
    (catalog, io, location)
}

#[tokio::test]
async fn a_foreign_commit_is_built_on_and_a_new_claim_fences_the_old_run() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = ParquetSink::open(iceberg_settings(dir.path()));
    assert_eq!(store.load("orders").await.unwrap(), None);
    assert!(
        current(dir.path()).await.metadata_log().is_empty(),
        "the table's creation holds the run's claim: no second version for it"
    );
    sink.start(RunStart::Fresh).await.unwrap();
    let (first, staged) = batch(0, 10);
    sink.write(&first, Some(&staged)).await.unwrap();

    // Rule 5: another writer's commit in between is kept, and the next commit is built on it.
    foreign_commit(dir.path()).await;
    let (second, staged) = batch(10, 20);
    sink.write(&second, Some(&staged)).await.unwrap();
    let metadata = current(dir.path()).await;
    assert_eq!(
        metadata.properties().get("owner").map(String::as_str),
        Some("spark")
    );
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    assert_eq!(head.summary().additional_properties["total-records"], "20");
    assert!(
        metadata.current_snapshot().is_none(),
        "main sees nothing of an unfinished scan"
    );

    // Rule 3: a new run reads the position back from the scan branch's head; rule 2: its claim
    // fences the first run, whose batch is not committed.
    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    let entry = next.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k20");
    let (third, staged) = batch(20, 30);
    let refused = sink.write(&third, Some(&staged)).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Fenced, "{refused:?}");
    assert!(refused.message.contains("claimed"), "{}", refused.message);
    let metadata = current(dir.path()).await;
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    assert_eq!(head.summary().additional_properties["total-records"], "20");
}

/// Rule 4: the commit completing a scan run overwrites `main` with the run's files and removes
/// the branch; the run's later commits (its position only) go to `main`, no branch again; a
/// second run replaces the first.
#[tokio::test]
async fn a_completed_scan_overwrites_main_and_leaves_no_branch() {
    let dir = tempfile::tempdir().unwrap();
    for run in 0..2 {
        let (mut sink, mut store) = started(dir.path()).await;
        let (rows, staged) = batch(0, 10 + run);
        sink.write(&rows, Some(&staged)).await.unwrap();
        let done = Entry {
            position: None,
            last_completed: Some(serde_json::json!({"at": format!("run {run}")})),
            ..staged.entry.clone()
        };
        store.store("orders", Some(&done)).await.unwrap();
        store.store("orders", Some(&done)).await.unwrap();
        let metadata = current(dir.path()).await;
        assert!(
            metadata.snapshot_for_ref("ddbpipe-scan").is_none(),
            "no branch"
        );
        let main = metadata.current_snapshot().unwrap();
        let summary = &main.summary().additional_properties;
        assert_eq!(summary["total-records"], (10 + run).to_string());
        let overwrite = metadata
            .snapshot_by_id(main.parent_snapshot_id().unwrap())
            .unwrap();
        assert_eq!(
            overwrite.summary().operation,
            ::iceberg::spec::Operation::Overwrite
        );
        if run == 1 {
            assert_eq!(
                overwrite.summary().additional_properties["deleted-records"],
                "10"
            );
        }
    }
}

/// `snapshots` rule 4: with the table's retention at 0 ms, a commit expires every snapshot but
/// the heads it began with and the newest holding the position; the position reads back.
#[tokio::test]
async fn a_commit_expires_what_the_tables_retention_says() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    for i in 0..3 {
        let (rows, staged) = batch(i * 5, i * 5 + 5);
        sink.write(&rows, Some(&staged)).await.unwrap();
    }
    assert_eq!(current(dir.path()).await.snapshots().count(), 3);
    foreign_commit_with(dir.path(), "history.expire.max-snapshot-age-ms", "0").await;
    let (rows, staged) = batch(15, 20);
    sink.write(&rows, Some(&staged)).await.unwrap();
    let metadata = current(dir.path()).await;
    // The branch's head, and its parent: the head when the commit began.
    assert_eq!(metadata.snapshots().count(), 2);
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    assert_eq!(head.summary().additional_properties["total-records"], "20");
    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    assert_eq!(cursor(&next.load("orders").await.unwrap().unwrap()), "k20");
}

/// `iceberg` rule 3 (docs §7.11 rule 5): another writer's maintenance — a compaction's
/// `replace` snapshot on `main`, then every snapshot behind it expired, as S3 Tables' own
/// maintenance or Spark's `expire_snapshots` do — leaves no snapshot of the pipeline: the
/// position is read from the table's properties its last commit set, not lost; another
/// pipeline's run of a table it does not hold is refused as before.
#[tokio::test]
async fn a_position_whose_snapshots_expired_under_another_writer_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = started(dir.path()).await;
    let (rows, staged) = batch(0, 10);
    sink.write(&rows, Some(&staged)).await.unwrap();
    let done = Entry {
        position: None,
        last_completed: Some(serde_json::json!({"at": "run 0"})),
        ..staged.entry.clone()
    };
    store.store("orders", Some(&done)).await.unwrap();
    drop((sink, store));
    foreign_commit_of(dir.path(), |metadata, builder| {
        let main = metadata.current_snapshot().unwrap();
        let compaction = ::iceberg::spec::Snapshot::builder()
            .with_snapshot_id(main.snapshot_id() + 1)
            .with_parent_snapshot_id(Some(main.snapshot_id()))
            .with_sequence_number(metadata.last_sequence_number() + 1)
            .with_timestamp_ms(main.timestamp_ms() + 1)
            .with_manifest_list(main.manifest_list())
            .with_summary(::iceberg::spec::Summary {
                operation: ::iceberg::spec::Operation::Replace,
                additional_properties: HashMap::new(),
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        let ours: Vec<i64> = metadata.snapshots().map(|s| s.snapshot_id()).collect();
        Ok(builder
            .set_branch_snapshot(compaction, "main")?
            .remove_snapshots(&ours))
    })
    .await;
    let metadata = current(dir.path()).await;
    assert_eq!(
        metadata.snapshots().count(),
        1,
        "only the compaction's is left"
    );

    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    let entry = next.load("orders").await.unwrap();
    assert_eq!(
        entry.and_then(|e| e.last_completed),
        Some(serde_json::json!({"at": "run 0"})),
        "the last commit's position, from the table's properties"
    );
}

/// `parquet` rule 5 with `iceberg` rule 7 (docs §7.11): the catalog gone mid-run fails the
/// commit and breaks the writer; once it is back, the next run's position is the last
/// committed snapshot's and the table holds only what was committed.
#[tokio::test]
async fn a_catalog_failing_mid_run_loses_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    let (first, staged) = batch(0, 5);
    sink.write(&first, Some(&staged)).await.unwrap();
    let catalog = dir.path().join("catalog.db");
    let away = dir.path().join("away.db");
    std::fs::rename(&catalog, &away).unwrap();
    // The catalog's place now holds something that is no SQLite file.
    std::fs::create_dir(&catalog).unwrap();
    let (second, staged) = batch(5, 9);
    let failed = sink.write(&second, Some(&staged)).await.unwrap_err();
    assert!(
        failed.message.contains("cannot commit in the SQL catalog"),
        "{}",
        failed.message
    );
    let (third, staged) = batch(9, 12);
    let refused = sink.write(&third, Some(&staged)).await.unwrap_err();
    assert!(
        refused.message.contains("an earlier write or commit"),
        "{}",
        refused.message
    );
    std::fs::remove_dir(&catalog).unwrap();
    std::fs::rename(&away, &catalog).unwrap();
    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    assert_eq!(cursor(&next.load("orders").await.unwrap().unwrap()), "k5");
    let head = current(dir.path()).await;
    let head = head.snapshot_for_ref("ddbpipe-scan").unwrap();
    assert_eq!(head.summary().additional_properties["total-records"], "5");
}

/// `iceberg` rule 5 (docs §7.11): `state reset` (a store outside a run) claims the table and
/// commits an empty position: a run still writing is stopped at its next commit, and the next
/// run starts from nothing.
#[tokio::test]
async fn a_reset_outside_the_run_fences_it_and_clears_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    let (first, staged) = batch(0, 3);
    sink.write(&first, Some(&staged)).await.unwrap();
    let mut reset = ParquetPositions::reading(iceberg_settings(dir.path()));
    reset.store("orders", None).await.unwrap();
    let (second, staged) = batch(3, 6);
    let refused = sink.write(&second, Some(&staged)).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Fenced, "{refused:?}");
    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    assert_eq!(next.load("orders").await.unwrap(), None);
}

/// `iceberg` rule 1 (docs §7.11 rule 2): a table whose location is outside the configured
/// warehouse is refused, naming both, before anything is claimed or written.
#[tokio::test]
async fn a_table_outside_the_warehouse_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut store) = ParquetSink::open(iceberg_settings(dir.path()));
    store.load("orders").await.unwrap();
    let before = current(dir.path()).await;
    let elsewhere = ParquetSettings {
        objects: Objects::Local(dir.path().join("elsewhere")),
        ..iceberg_settings(dir.path())
    };
    let (_, mut moved) = ParquetSink::open(elsewhere);
    let refused = moved.load("orders").await.unwrap_err().to_string();
    assert!(refused.contains("outside the warehouse"), "{refused}");
    assert!(refused.contains("elsewhere"), "{refused}");
    assert!(
        refused.contains(&dir.path().join("warehouse").display().to_string()),
        "{refused}"
    );
    assert_eq!(current(dir.path()).await, before, "nothing claimed");
}

/// The manifests the scan branch's head lists, and its live files: `(path, snapshot that
/// added it, rows)`.
async fn listed(dir: &Path) -> (usize, i64, Vec<(String, i64, u64)>) {
    let (_, io, _) = catalog_of(dir).await;
    let metadata = current(dir).await;
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    let bytes = io
        .new_input(head.manifest_list())
        .unwrap()
        .read()
        .await
        .unwrap();
    let list = ::iceberg::spec::ManifestList::parse_with_version(&bytes, metadata.format_version())
        .unwrap();
    let mut files = Vec::new();
    for manifest in list.entries() {
        for entry in manifest.load_manifest(&io).await.unwrap().entries() {
            assert!(entry.is_alive(), "{entry:?}");
            files.push((
                entry.data_file().file_path().to_string(),
                entry.snapshot_id().unwrap(),
                entry.data_file().record_count(),
            ));
        }
    }
    (list.entries().len(), head.snapshot_id(), files)
}

/// `snapshots` rule 5: with the table's `commit.manifest.min-count-to-merge` at 4, twenty
/// commits never list more than 4 manifests, and every file committed is listed once, alive,
/// with the snapshot that added it; without merging, one manifest per commit.
#[tokio::test]
async fn manifests_are_merged_at_the_tables_minimum_count() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    let mut added: Vec<(String, i64)> = Vec::new();
    for i in 0..20 {
        if i == 6 {
            foreign_commit_with(dir.path(), "commit.manifest.min-count-to-merge", "4").await;
        }
        let (rows, staged) = batch(i * 5, i * 5 + 5);
        sink.write(&rows, Some(&staged)).await.unwrap();
        let (manifests, head, files) = listed(dir.path()).await;
        // The file this commit added: the one its own snapshot added.
        let new: Vec<_> = files.iter().filter(|f| f.1 == head).collect();
        assert_eq!(new.len(), 1, "commit {i}: {files:?}");
        added.push((new[0].0.clone(), head));
        let mut found: Vec<(String, i64)> = files.iter().map(|f| (f.0.clone(), f.1)).collect();
        found.sort();
        let mut expected = added.clone();
        expected.sort();
        assert_eq!(
            found, expected,
            "commit {i}: each file once, with its snapshot"
        );
        assert_eq!(files.iter().map(|f| f.2).sum::<u64>(), 5 * (i as u64 + 1));
        match i {
            0..6 => assert_eq!(manifests, i + 1, "commit {i}: no merging yet"),
            _ => assert!(manifests <= 4, "commit {i}: {manifests} manifests"),
        }
    }
}

/// `iceberg` rule 1 with `snapshots` rule 5: a table whose merge property does not read (set
/// by another writer) is refused when a run loads it, naming the property, before any file is
/// written; the sink's own table_properties setting it right lets the run go on.
#[tokio::test]
async fn a_table_property_commits_cannot_read_is_refused_before_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    let (rows, staged) = batch(0, 5);
    sink.write(&rows, Some(&staged)).await.unwrap();
    foreign_commit_with(dir.path(), "commit.manifest.min-count-to-merge", "many").await;
    let snapshots = current(dir.path()).await.snapshots().count();
    let (_, mut next) = ParquetSink::open(iceberg_settings(dir.path()));
    let refused = next.load("orders").await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("commit.manifest.min-count-to-merge is 'many'"),
        "{refused}"
    );
    assert_eq!(current(dir.path()).await.snapshots().count(), snapshots);
    let mut settings = iceberg_settings(dir.path());
    if let Some(iceberg) = &mut settings.iceberg {
        iceberg.properties = [("commit.manifest.min-count-to-merge".into(), "4".into())].into();
    }
    let (_, mut fixed) = ParquetSink::open(settings);
    assert!(fixed.load("orders").await.is_ok());
}

/// The sink's items with one typed column, `w`, at the end of `columns:` (field id 3, after
/// `pk` and `document`).
fn with_typed_w(dir: &Path) -> ParquetSettings {
    let column = ddbpipe_keyed::ColumnSpec {
        name: "w".into(),
        path: ddbpipe_value::ColumnPath::parse("w").unwrap(),
        kind: ddbpipe_keyed::ColumnType::Text,
        time_format: ddbpipe_keyed::TimeFormat::default(),
    };
    let typed = ddbpipe_keyed::TypedColumns::new(
        vec![column],
        ddbpipe_value::ValueFormat::Plain,
        ddbpipe_keyed::OnMismatch::Null,
    );
    let shape = crate::rows::Shape::typed(
        vec![("pk".into(), ddbpipe_keyed::KeyType::S)],
        ddbpipe_value::ValueFormat::Plain,
        Records::Items,
        false,
        Some(typed),
    )
    .unwrap();
    ParquetSettings {
        shape,
        ..iceberg_settings(dir)
    }
}

/// Rules 1 and 5: a run's claim that loses to another writer is built again on what that
/// writer committed, its columns checked again: a column that writer added under the field id
/// the run's new typed column would take refuses the run, naming both, as a load would; the
/// table keeps that writer's schema, nothing added over it.
#[tokio::test]
async fn a_claim_lost_to_a_column_change_checks_the_columns_again() {
    let dir = tempfile::tempdir().unwrap();
    drop(started(dir.path()).await);

    // Another writer's schema (a column `x` under the next id, 3), written but not yet swapped
    // in: the catalog swaps it in when the next run's claim is swapped, so that claim loses.
    let location = foreign_metadata(dir.path(), |current, metadata| {
        let x = ::iceberg::spec::NestedField::optional(
            3,
            "x",
            ::iceberg::spec::Type::Primitive(::iceberg::spec::PrimitiveType::String),
        );
        let schema = current
            .current_schema()
            .as_ref()
            .clone()
            .into_builder()
            .with_fields([x.into()])
            .build()?;
        metadata.add_current_schema(schema)
    })
    .await;
    let catalog = rusqlite::Connection::open(dir.path().join("catalog.db")).unwrap();
    catalog
        .execute_batch(&format!(
            "CREATE TABLE armed (location TEXT);
             INSERT INTO armed VALUES ('{location}');
             CREATE TRIGGER first_swap_loses BEFORE UPDATE ON iceberg_tables
             WHEN EXISTS (SELECT 1 FROM armed)
             BEGIN
               UPDATE iceberg_tables SET metadata_location = (SELECT location FROM armed),
                 previous_metadata_location = OLD.metadata_location
               WHERE table_name = OLD.table_name;
               DELETE FROM armed;
               SELECT RAISE(IGNORE);
             END;"
        ))
        .unwrap();

    let (_sink, mut store) = ParquetSink::open(with_typed_w(dir.path()));
    let refused = store.load("orders").await.unwrap_err().to_string();
    assert!(
        refused.contains("'w' cannot be added: its field id 3 is the table's column 'x'"),
        "{refused}"
    );
    let armed: i64 = catalog
        .query_row("SELECT count(*) FROM armed", [], |row| row.get(0))
        .unwrap();
    assert_eq!(armed, 0, "the claim lost once");
    let now = current(dir.path()).await;
    let names: Vec<_> = now
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|field| field.name.clone())
        .collect();
    assert_eq!(names, ["pk", "document", "x"]);
    assert_eq!(now.schemas_iter().count(), 2, "no schema added over x");
}

/// Rule 2: a run's files are recorded only under a spec that is the sink's partitioning.
/// Another writer that gives the table another default spec while a run writes stops the run
/// at its next commit, naming both partitionings, that batch uncommitted; what it committed
/// before stays.
#[tokio::test]
async fn a_partitioning_another_writer_gives_the_table_stops_the_run_uncommitted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _store) = started(dir.path()).await;
    let (first, staged) = batch(0, 10);
    sink.write(&first, Some(&staged)).await.unwrap();

    foreign_commit_of(dir.path(), |current, metadata| {
        let pk = current.current_schema().field_by_name("pk").unwrap().id;
        let spec = ::iceberg::spec::UnboundPartitionSpec::builder()
            .add_partition_field(pk, "pk_bucket", ::iceberg::spec::Transform::Bucket(4))?
            .build();
        metadata.add_default_partition_spec(spec)
    })
    .await;
    let (second, staged) = batch(10, 20);
    let refused = sink.write(&second, Some(&staged)).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Definite, "{refused:?}");
    assert!(
        refused.message.contains(
            "is now partitioned by [bucket(4, pk)] (another writer changed it), this run's \
             files by []"
        ),
        "{}",
        refused.message
    );
    let metadata = current(dir.path()).await;
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    assert_eq!(head.summary().additional_properties["total-records"], "10");
}
