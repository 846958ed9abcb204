//! The iceberg sink end to end (docs/sinks.md §7.11): the parquet sink's sources and files,
//! committed to an Iceberg table in a SQL catalog (SQLite), read back by pyiceberg — a reader
//! nobody here wrote (`tests/lake/read_iceberg.py`) — through the same catalog.

use super::*;

#[path = "rest.rs"]
mod rest;
#[path = "s3tables.rs"]
mod s3tables;

/// What pyiceberg read of a table.
struct Table {
    schema: BTreeMap<String, String>,
    partition: Vec<String>,
    spec: Vec<String>,
    partitions: Vec<Value>,
    properties: BTreeMap<String, String>,
    manifests: u64,
    snapshots: Vec<Value>,
    current: Option<i64>,
    refs: Vec<String>,
    files: Vec<String>,
    rows: Vec<Value>,
    /// Each data file's manifest counts and bounds beside its own values.
    metrics: Vec<Value>,
    /// A scan filtered on the first column's least value: files planned, files holding it.
    pruned: Value,
}

impl Table {
    /// The current snapshot's summary.
    fn summary(&self) -> &Value {
        let current = self.current.unwrap();
        let snapshot = self.snapshots.iter().find(|s| s["id"] == current).unwrap();
        &snapshot["summary"]
    }

    fn operation(&self) -> &str {
        let current = self.current.unwrap();
        let snapshot = self.snapshots.iter().find(|s| s["id"] == current).unwrap();
        snapshot["operation"].as_str().unwrap()
    }

    /// As the parquet tests' reader gives it, for their changelog checks.
    fn as_read(&self) -> Read {
        Read {
            files: BTreeMap::new(),
            manifests: BTreeMap::new(),
            commits: Vec::new(),
            schema: self.schema.clone(),
            codecs: BTreeSet::new(),
            rows: self.rows.clone(),
        }
    }
}

fn iceberg_python(args: &[&str]) -> Vec<u8> {
    reader_script("read_iceberg.py", args)
}

/// The catalog of `pipeline`'s iceberg sink: its uri.
fn catalog_uri(pipeline: &Pipeline) -> String {
    format!(
        "sqlite:///{}",
        pipeline.dir.path().join("catalog.db").display()
    )
}

/// pyiceberg's read of table `ident` in `pipeline`'s catalog.
fn read_table(pipeline: &Pipeline, ident: &str, s3: Option<&str>) -> Table {
    read_catalog(&catalog_uri(pipeline), "ddbpipe", ident, s3)
}

/// pyiceberg's read of table `ident` in the catalog `name` at `uri` (SQLAlchemy's form).
fn read_catalog(uri: &str, name: &str, ident: &str, s3: Option<&str>) -> Table {
    let mut args = vec!["table", uri, name, ident];
    args.extend(s3);
    let read: Value = serde_json::from_slice(&iceberg_python(&args)).unwrap();
    Table {
        schema: serde_json::from_value(read["schema"].clone()).unwrap(),
        partition: serde_json::from_value(read["partition"].clone()).unwrap(),
        spec: serde_json::from_value(read["spec"].clone()).unwrap(),
        partitions: serde_json::from_value(read["partitions"].clone()).unwrap_or_default(),
        properties: serde_json::from_value(read["properties"].clone()).unwrap_or_default(),
        manifests: read["manifests"].as_u64().unwrap_or(0),
        snapshots: serde_json::from_value(read["snapshots"].clone()).unwrap(),
        current: read["current"].as_i64(),
        refs: serde_json::from_value(read["refs"].clone()).unwrap(),
        files: serde_json::from_value(read["files"].clone()).unwrap(),
        rows: serde_json::from_value(read["rows"].clone()).unwrap(),
        metrics: serde_json::from_value(read["metrics"].clone()).unwrap_or_default(),
        pruned: read["pruned"].clone(),
    }
}

/// §7.11 rule 9: every data file's manifest entry counts its rows in every column and bounds
/// each of `bounded` (the key first) by the file's least and greatest value, exactly but for
/// text over 64 bytes (cut there, the upper bound rounded up); the
/// documents have counts
/// and no bounds. With `skips`, a scan filtered on the key's least value plans only the files
/// that hold it, and fewer than all.
fn assert_metrics(table: &Table, bounded: &[&str], skips: bool) {
    assert!(!table.metrics.is_empty(), "no data files");
    for file in &table.metrics {
        let rows = &file["rows"];
        for (column, count) in file["values"].as_object().unwrap() {
            assert_eq!(count, rows, "{column} values in {}", file["file"]);
        }
        assert_eq!(file["nulls"][bounded[0]], 0, "the key has no nulls: {file}");
        for column in bounded {
            let bounds = &file["bounds"][column];
            assert!(bounds.is_object(), "{column} has no bounds: {file}");
            let (lower, upper) = (&bounds["lower"], &bounds["upper"]);
            let (min, max) = (&bounds["min"], &bounds["max"]);
            // A text value over 64 bytes has a bound of 64 bytes: its prefix below, above
            // rounded up (the Parquet writer's statistics).
            let truncated = |bound: &Value| bound.as_str().is_some_and(|b| b.len() == 64);
            let below = |bound: &Value, value: &Value| match (bound.as_str(), value.as_str()) {
                (Some(bound), Some(value)) => value.starts_with(bound),
                _ => false,
            };
            let above = |bound: &Value, value: &Value| match (bound.as_str(), value.as_str()) {
                (Some(bound), Some(value)) => bound.as_bytes() > value.as_bytes(),
                _ => false,
            };
            assert!(
                lower == min || (truncated(lower) && below(lower, min)),
                "{column}'s lower bound: {file}"
            );
            assert!(
                upper == max || (truncated(upper) && above(upper, max)),
                "{column}'s upper bound: {file}"
            );
        }
        assert!(file["bounds"]["document"].is_null(), "{file}");
        assert!(file["values"]["document"].is_number(), "{file}");
    }
    let pruned = &table.pruned;
    assert_eq!(pruned["planned"], pruned["holding"], "{pruned}");
    if skips {
        assert!(
            pruned["planned"].as_u64() < pruned["files"].as_u64(),
            "a filtered scan skips files: {pruned}"
        );
    }
}

/// The current-state query of docs/sinks.md §7.11 over pyiceberg's scan: each key's document.
fn documented_current_state(pipeline: &Pipeline, s3: Option<&str>) -> BTreeMap<String, Value> {
    documented_current_state_in(&catalog_uri(pipeline), "ddbpipe", "dynamodb.orders", s3)
}

/// [`documented_current_state`] of table `ident` in the catalog `name` at `uri`.
fn documented_current_state_in(
    uri: &str,
    name: &str,
    ident: &str,
    s3: Option<&str>,
) -> BTreeMap<String, Value> {
    let docs = ddbpipe_testkit::repository().join("docs/sinks.md");
    let mut args = vec!["current", docs.to_str().unwrap(), uri, name, ident];
    args.extend(s3);
    documents(&iceberg_python(&args))
}

/// A `sink:` section into the table `dynamodb.{table}` of a catalog beside the pipeline file,
/// its files under `warehouse`, and extra keys.
fn iceberg_sink(pipeline: &Pipeline, warehouse: &str, extra: &str) -> String {
    format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: sql\n    uri: '{}'\n  warehouse: \
         '{warehouse}'\n{extra}",
        catalog_uri(pipeline)
    )
}

/// A table `orders` with a stream and `seeded` items, and a pipeline from it into an Iceberg
/// table (a local warehouse unless `warehouse` is given).
fn orders_into_iceberg(
    source: &str,
    seeded: usize,
    warehouse: Option<&str>,
    extra: &str,
) -> (Arc<Running>, Pipeline) {
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 31, seeded, source);
    let local = pipeline.dir.path().join("warehouse").display().to_string();
    let sink = iceberg_sink(&pipeline, warehouse.unwrap_or(&local), extra);
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    (running, pipeline)
}

/// §7.11 rules 3 and 4: a scan commits its progress to the scan branch, then one overwrite of
/// `main` with the run's files and nothing else; pyiceberg reads the table equal to DynamoDB's.
/// The next scan replaces it; the first stays reachable by time travel.
#[test]
fn a_scan_overwrites_the_table_with_the_run_equal_to_dynamodb() {
    let source = "table_name: orders\nvalue_format: typed\nsegments: 2\npage_limit: 25\n\
                  batch_size: 20";
    let (running, pipeline) = orders_into_iceberg(source, 300, None, "  commit_interval_secs: 0\n");
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("not there yet"),
        "{}",
        stdout(&check)
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.operation(), "overwrite");
    assert_eq!(table.refs, ["main"], "the scan branch is gone");
    assert!(
        table.files.len() > 1,
        "a commit per batch: {:?}",
        table.files
    );
    assert_eq!(table.schema["pk"], "string");
    assert_eq!(table.schema["document"], "string");
    assert!(table.partition.is_empty(), "{:?}", table.partition);
    assert_metrics(&table, &["pk"], true);
    let items: BTreeMap<String, Value> = table.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(table.rows.len(), 300, "each item once");
    assert_eq!(items, keyed::table_items(&running.endpoint, "orders"));
    assert_eq!(table.summary()["total-records"], "300");
    assert_eq!(table.summary()["ddbpipe.pipeline"], "lake");
    let first = table.current.unwrap();
    // `check` now compares the table's columns; `state show` reads the completed position.
    let check = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("its columns are the sink's, partitioned by []"),
        "{}",
        stdout(&check)
    );
    shows_a_completed_scan(&pipeline);

    running.delete_pk("orders", "k000");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let again = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(again.rows.len(), 299, "the second run replaced the first");
    assert!(again.rows.iter().all(|r| pk(r) != "k000"));
    assert_eq!(again.summary()["deleted-records"], "300");
    assert!(
        again.snapshots.iter().any(|s| s["id"] == first),
        "the first run's snapshot stays for time travel"
    );
}

/// §7.11 rules 3 and 5 under SIGKILL: a streams run killed at random points appends every
/// change exactly once (the position is read back from the newest snapshot's summary), and the
/// documented current-state query over pyiceberg's scan gives the table. Rule 3's manifest
/// merging at the `table_properties` the sink sets keeps the manifests few through it.
#[test]
fn a_streams_run_killed_anywhere_appends_every_change_exactly_once() {
    let extra = "  commit_interval_secs: 1\n  table_properties: \
                 {commit.manifest.min-count-to-merge: '3'}\n";
    let (running, pipeline) = orders_into_iceberg(STREAMS, 0, None, extra);
    killed_under_writes(&running, &pipeline, 6, 0x31, 500..3000);
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.properties["commit.manifest.min-count-to-merge"], "3");
    let appends = table
        .snapshots
        .iter()
        .filter(|s| s["summary"]["added-data-files"].is_string());
    assert!(appends.count() >= 4, "{:?}", table.snapshots);
    assert!(table.manifests <= 3, "{} manifests", table.manifests);
    assert!(!table.rows.is_empty());
    assert_changelog_exact(&table.as_read(), &running);
    assert_eq!(
        documented_current_state(&pipeline, None),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented query gives the table"
    );
    assert_eq!(table.partition, ["event_time_day"]);
    assert_eq!(table.schema["event_time"], "timestamptz");
    // (Whether a file lacks the least key depends on where the kills fell: no skip asked.)
    assert_metrics(
        &table,
        &["pk", "op", "sequence_number", "event_time", "shard_id"],
        false,
    );
    assert!(table.schema.contains_key("before"), "{:?}", table.schema);
    assert!(
        table.snapshots.iter().all(|s| s["operation"] == "append"),
        "the changelog only appends"
    );
    assert!(
        table.summary()["ddbpipe.position"]
            .as_str()
            .unwrap()
            .contains("shards"),
        "{}",
        table.summary()
    );
}

/// §7.11 on moto's S3: a mirror killed at random points writes the snapshot rows and then each
/// change once; the replay is the table.
#[test]
fn a_mirror_into_s3_killed_anywhere_converges_with_each_change_once() {
    let s3 = moto_with_lake();
    let source = S3_MIRROR;
    let (running, pipeline) = orders_into_iceberg(
        source,
        200,
        Some("s3://lake/warehouse"),
        &format!(
            "  commit_interval_secs: 1\n  s3_endpoint_url: {}\n",
            s3.endpoint
        ),
    );
    killed_under_writes(&running, &pipeline, 4, 0x3131, 500..3000);
    let table = read_table(&pipeline, "dynamodb.orders", Some(&s3.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
    assert!(
        table
            .files
            .iter()
            .all(|f| f.starts_with("s3://lake/warehouse/dynamodb.db/orders/data/")),
        "{:?}",
        table.files
    );
    assert_eq!(
        documented_current_state(&pipeline, Some(&s3.endpoint)),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// §7.11 rules 1 and 2: a table whose columns are not the sink's, and a table another
/// pipeline writes, are refused by `check` and `run` alike, naming the columns or the pipeline;
/// nothing is committed.
#[test]
fn conflicting_columns_and_another_pipelines_table_are_refused() {
    let (running, pipeline) = orders_into_iceberg("table_name: orders", 5, None, "");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let before = read_table(&pipeline, "dynamodb.orders", None);

    // The same table from a streams run: the changelog's columns are not a snapshot's.
    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), "");
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink);
    refused_by_check_and_run(&pipeline, "'op' is missing");

    // Another pipeline into the same table.
    pipeline.write_with_sink("other", &running.endpoint, "table_name: orders", &sink);
    refused_by_check_and_run(&pipeline, "holds the output of pipeline 'lake'");
    let after = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(
        after.snapshots.len(),
        before.snapshots.len(),
        "nothing committed"
    );
}

/// §7.11 rule 2: a typed column added at the end of `columns:` is added to the table by the
/// next run (`check` says so): the changelog's earlier rows read it as null, the new ones hold
/// the value, and its data files are bounded by it. Columns listed in another order would
/// write other field ids: refused by `check` and `run`, naming them.
#[test]
fn a_typed_column_added_at_the_end_is_added_to_the_table() {
    let typed = |columns: &[&str]| {
        let listed: String = columns
            .iter()
            .map(|name| format!("    - {{name: {name}, path: {name}, type: bigint}}\n"))
            .collect();
        format!("  columns:\n{listed}")
    };
    let (running, pipeline) = orders_into_iceberg(STREAMS, 5, None, &typed(&["v"]));
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let first = read_table(&pipeline, "dynamodb.orders", None);
    assert!(!first.schema.contains_key("w"));

    // Items `keys` (k005…), each with a number `w`, from the writer of `seed`.
    let put_with_w = |seed: u64, keys: std::ops::Range<usize>| {
        let mut writer = Writer::new(seed, keys.len());
        let items: Vec<_> = keys
            .map(|i| {
                let mut item = writer.random_item(&format!("k{i:03}"));
                item.insert("w".into(), AttributeValue::N(format!("{}", 1000 + i)));
                item
            })
            .collect();
        running.put_items("orders", items);
    };
    // More changes, then the same pipeline with a second typed column (a number, as `v`).
    put_with_w(0x20, 5..10);
    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), &typed(&["v", "w"]));
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink);
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("a run adds the column(s) 'w'"),
        "{}",
        stdout(&check)
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.schema["w"], "long");
    let (mut old, mut new) = (0, 0);
    for row in &table.rows {
        let document: Value = serde_json::from_str(row["document"].as_str().unwrap()).unwrap();
        match document.get("w") {
            // A change of the second run holds it.
            Some(w) => {
                let w: i64 = w["N"].as_str().unwrap().parse().unwrap();
                assert_eq!(row["w"], w, "{row}");
                new += 1;
            }
            None => {
                assert_eq!(row["w"], Value::Null, "{row}");
                old += 1;
            }
        }
    }
    assert_eq!(
        (old, new),
        (5, 5),
        "five changes before the column, five after"
    );
    let bounded: Vec<_> = table
        .metrics
        .iter()
        .filter(|file| file["bounds"]["w"].is_object())
        .collect();
    assert!(
        !bounded.is_empty(),
        "the new files bound w: {:?}",
        table.metrics
    );
    assert_metrics(&table, &["pk"], false);

    // The last typed column dropped from `columns:`: it stays in the table, null in the rows
    // written after (their documents still hold it).
    put_with_w(0x21, 10..13);
    let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), &typed(&["v"]));
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.schema["w"], "long");
    let unwritten = table
        .rows
        .iter()
        .filter(|row| {
            let document: Value = serde_json::from_str(row["document"].as_str().unwrap()).unwrap();
            document.get("w").is_some() && row["w"].is_null()
        })
        .count();
    assert_eq!(
        unwritten, 3,
        "the three changes after w was dropped read it as null"
    );

    // The columns in another order: other field ids.
    let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), &typed(&["w", "v"]));
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink);
    refused_by_check_and_run(&pipeline, "'w' has field id");
}

/// §7.11 rules 4 and 5 under SIGKILL: a scan killed at random points resumes on its branch
/// until it completes; readers of `main` see the previous run whole until then, never part of
/// the new one; the completed table holds every item once, equal to DynamoDB.
#[test]
fn a_scan_killed_anywhere_replaces_the_table_whole_and_once() {
    let source = "table_name: orders\nvalue_format: typed\nsegments: 2\npage_limit: 10\n\
                  batch_size: 10";
    let (running, pipeline) = orders_into_iceberg(source, 400, None, "  commit_interval_secs: 0\n");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let before = keyed::table_items(&running.endpoint, "orders");
    running.delete_pk("orders", "k000");
    running.delete_pk("orders", "k001");
    let after = keyed::table_items(&running.endpoint, "orders");
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x2931);
    for attempt in 0..5 {
        let mut child = common::spawn_logged(&pipeline, attempt);
        let pause = rand::Rng::random_range(&mut rng, 100..1500);
        std::thread::sleep(Duration::from_millis(pause));
        child.kill().unwrap();
        child.wait().unwrap();
        let table = read_table(&pipeline, "dynamodb.orders", None);
        let items: BTreeMap<String, Value> =
            table.rows.iter().map(|r| (pk(r), document(r))).collect();
        assert_eq!(items.len(), table.rows.len(), "each item once");
        assert!(
            items == before || items == after,
            "main holds a whole run: {} rows",
            items.len()
        );
    }
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.rows.len(), 398, "each item once");
    let items: BTreeMap<String, Value> = table.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(items, after);
    assert_eq!(table.refs, ["main"]);
}

/// §7.11 rule 2 with `rows` rule 1: binary keys are Iceberg `binary`, 38-digit number keys
/// `string` with every digit, an item near 400 KB is whole, as pyiceberg reads them.
#[test]
fn binary_and_38_digit_keys_are_kept_exactly_in_iceberg() {
    let running = Emulator::Dynoxide.start();
    put_blobs(&running);
    let pipeline = Pipeline::new("blobs", &running.endpoint, "table_name: blobs");
    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), "");
    pipeline.write_with_sink("blobs", &running.endpoint, "table_name: blobs", &sink);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = read_table(&pipeline, "dynamodb.blobs", None);
    assert_eq!(table.schema["id"], "binary");
    assert_eq!(table.schema["n"], "string");
    assert_blobs_exact(&table.rows);
    // Binary bounds as bytes, a 38-digit key's as its digits.
    assert_metrics(&table, &["id", "n"], false);
}

/// §7.11 rule 1 with the catalog in PostgreSQL (the test server `scripts/test.sh` starts): a
/// mirror's table is there for pyiceberg through SQLAlchemy, equal to DynamoDB's, and the URL's
/// password reaches neither `check`'s nor `run`'s output.
#[test]
fn a_postgres_catalog_holds_the_table_and_its_password_reaches_no_output() {
    let url = ddbpipe_testkit::postgres::url();
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, password)| password.to_string())
        .unwrap();
    assert!(password.len() >= 8, "the test server has a password");
    // A catalog name of its own: tests share the server's catalog tables.
    let name = format!("ddbpipe_{:016x}", rand::random::<u64>());
    let source = "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2";
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 33, 50, source);
    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: sql\n    uri: '{url}'\n    name: {name}\n  \
         warehouse: '{}'\n",
        warehouse.display()
    );
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("in postgres 127.0.0.1"),
        "{}",
        stdout(&check)
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for (what, text) in [
        ("check", stdout(&check) + &stderr(&check)),
        ("run", stdout(&output) + &stderr(&output)),
    ] {
        assert!(
            !text.contains(&password),
            "{what} showed the password: {text}"
        );
    }
    let sqlalchemy = url.replacen("postgres://", "postgresql+psycopg2://", 1);
    let table = read_catalog(&sqlalchemy, &name, "dynamodb.orders", None);
    assert_eq!(
        replay(&table.rows),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// §7.10 rule 3's partitions in an Iceberg table (§7.11 rule 2): `partition_by` is the table's
/// partition spec; every data file holds only rows of the partition its manifest entry gives,
/// as pyiceberg's own transforms compute it, in that partition's directory; every item once.
/// A changed `partition_by` becomes the table's default spec at the next run's claim
/// (partition evolution, `check` saying so), its files written in it; none at all leaves the
/// table unpartitioned. A term the columns do not take is refused naming the column; one
/// that does not read, when the file is loaded; a typed column named like a partition field
/// the table had, by `check` and the run alike. Nothing is committed by a refused run.
#[test]
fn partition_by_is_the_tables_spec_and_each_file_holds_its_partition_only() {
    let source = "table_name: orders\nvalue_format: typed\nsegments: 2\npage_limit: 25\n\
                  batch_size: 20";
    let terms = "  partition_by: [bucket(4, pk), truncate(3, pk)]\n";
    let (running, pipeline) = orders_into_iceberg(source, 120, None, terms);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let check = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("partitioned by [bucket(4, pk), truncate(3, pk)]"),
        "{}",
        stdout(&check)
    );
    let table = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(table.spec, ["bucket[4](pk)", "truncate[3](pk)"]);
    assert_eq!(table.partition, ["pk_bucket", "pk_trunc"]);
    let items: BTreeMap<String, Value> = table.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(table.rows.len(), 120, "each item once");
    assert_eq!(items, keyed::table_items(&running.endpoint, "orders"));
    assert!(table.partitions.len() >= 8, "{:?}", table.partitions);
    for file in &table.partitions {
        let partition = &file["partition"];
        assert_eq!(file["rows"], serde_json::json!([partition]), "{file}");
        let dir = format!(
            "/data/pk_bucket={}/pk_trunc={}/",
            partition[0],
            partition[1].as_str().unwrap()
        );
        assert!(file["file"].as_str().unwrap().contains(&dir), "{file}");
    }

    let warehouse = pipeline.dir.path().join("warehouse");
    let rewrite = |extra: &str| {
        let sink = iceberg_sink(&pipeline, warehouse.to_str().unwrap(), extra);
        pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    };
    rewrite("  partition_by: [bucket(8, pk)]\n");
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains(
            "partitioned by [bucket(4, pk), truncate(3, pk)]; a run partitions it by \
             [bucket(8, pk)] from its first commit"
        ),
        "{}",
        stdout(&check)
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let evolved = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(evolved.spec, ["bucket[8](pk)"]);
    assert_eq!(evolved.partition, ["pk_bucket"]);
    let items: BTreeMap<String, Value> =
        evolved.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(evolved.rows.len(), 120, "each item once");
    assert_eq!(items, keyed::table_items(&running.endpoint, "orders"));
    for file in &evolved.partitions {
        let partition = &file["partition"];
        assert_eq!(file["rows"], serde_json::json!([partition]), "{file}");
        assert_ne!(file["spec_id"], 0, "written in the new spec: {file}");
        let dir = format!("/data/pk_bucket={}/", partition[0]);
        assert!(file["file"].as_str().unwrap().contains(&dir), "{file}");
    }
    rewrite("");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let unpartitioned = read_table(&pipeline, "dynamodb.orders", None);
    assert!(unpartitioned.spec.is_empty(), "{:?}", unpartitioned.spec);
    assert_eq!(unpartitioned.rows.len(), 120, "each item once");
    let table = unpartitioned;
    // A typed column named like a partition field of an earlier spec: the claim's builder
    // refuses it against the table's history, and `check` builds what the claim builds.
    rewrite("  columns:\n    - {name: pk_bucket, path: v, type: bigint}\n");
    refused_by_check_and_run(
        &pipeline,
        "cannot add columns to Iceberg table dynamodb.orders",
    );
    rewrite("  partition_by: [day(pk)]\n");
    refused_by_check_and_run(
        &pipeline,
        "sink.partition_by: table 'orders': 'day(pk)': 'pk' is text",
    );
    rewrite("  partition_by: [week(pk)]\n");
    let why = "sink.partition_by[0]: 'week(pk)': no transform 'week'";
    for output in [pipeline.ddbpipe(&["check"]), run(&pipeline)] {
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(stderr(&output).contains(why), "{}", stderr(&output));
    }
    let after = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(
        after.snapshots.len(),
        table.snapshots.len(),
        "nothing committed"
    );
}

/// §7.11 rule 2's partition evolution in a changelog: after a streams run partitioned by
/// `day(event_time)`, a changed `partition_by` becomes the table's default spec at the next
/// run's claim; its files are written in it, the files written before keep theirs, and
/// pyiceberg reads every change exactly once across both specs, each file's rows in the
/// partition its own spec gives.
#[test]
fn a_changed_partition_by_evolves_the_changelogs_spec_keeping_every_change() {
    let (running, pipeline) = orders_into_iceberg(STREAMS, 0, None, "  commit_interval_secs: 0\n");
    for i in 0..30 {
        running.put_pk("orders", &format!("k{i:03}"), "1");
    }
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let before = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(before.partition, ["event_time_day"]);

    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = iceberg_sink(
        &pipeline,
        warehouse.to_str().unwrap(),
        "  commit_interval_secs: 0\n  partition_by: [bucket(4, pk)]\n",
    );
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink);
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("; a run partitions it by [bucket(4, pk)] from its first commit"),
        "{}",
        stdout(&check)
    );
    for i in 20..50 {
        running.put_pk("orders", &format!("k{i:03}"), "2");
    }
    running.delete_pk("orders", "k001");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let after = read_table(&pipeline, "dynamodb.orders", None);
    assert_eq!(after.spec, ["bucket[4](pk)"]);
    let specs: BTreeSet<i64> = after
        .partitions
        .iter()
        .map(|file| file["spec_id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        specs.len(),
        2,
        "files of both specs stay: {:?}",
        after.partitions
    );
    for file in &after.partitions {
        assert_eq!(
            file["rows"],
            serde_json::json!([file["partition"]]),
            "{file}"
        );
    }
    assert!(
        after.snapshots.iter().all(|s| s["operation"] == "append"),
        "the changelog only appends"
    );
    assert_changelog_exact(&after.as_read(), &running);
}

/// §7.11 rule 8: a catalog a run could not write (its SQLite file under a file that is not a
/// directory) fails `check` as it fails `run`, naming the place; nothing is made.
#[test]
fn a_catalog_the_run_cannot_write_fails_check_as_it_fails_run() {
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 37, 3, "table_name: orders");
    std::fs::write(pipeline.dir.path().join("plain"), "a file").unwrap();
    let warehouse = pipeline.dir.path().join("warehouse");
    let sink = format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: sql\n    uri: 'sqlite:///{}'\n  \
         warehouse: '{}'\n",
        pipeline.dir.path().join("plain/catalog.db").display(),
        warehouse.display()
    );
    pipeline.write_with_sink("lake", &running.endpoint, "table_name: orders", &sink);
    let check = pipeline.ddbpipe(&["check"]);
    assert_ne!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("cannot be written")
            && stdout(&check).contains("plain is not a directory"),
        "{}",
        stdout(&check)
    );
    let output = run(&pipeline);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("plain"), "{}", stderr(&output));
}

/// An iceberg sink's `sink:` section into the Glue Data Catalog moto serves at `moto`, the
/// files under `s3://lake/warehouse` there, and extra keys.
fn glue_sink(moto: &str, extra: &str) -> String {
    format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: glue\n    endpoint_url: {moto}\n  \
         warehouse: s3://lake/warehouse\n  s3_endpoint_url: {moto}\n{extra}"
    )
}

/// §7.11 rule 7, the catalogs' rules 4 and 5: Glue and S3 refusing every few requests
/// (`ThrottlingException`, `503 SlowDown`) or losing their answers (a 500 after the request
/// was done: a table recorded, a commit swapped, a file written, unbeknown) under a mirror
/// killed at random points and a writer: each request is tried again, a recording found made
/// on its retry is read back and known for its own, and pyiceberg's `GlueCatalog` reads every
/// change once. Without the retries the first fault ends a run (exit 1).
#[test]
fn glue_and_s3_refusing_or_losing_answers_now_and_then_lose_and_repeat_nothing() {
    let moto = moto_with_lake();
    let fake = super::fake_export::FakeExport::start(&moto.endpoint, &moto.endpoint);
    fake.fail_lake_requests(4);
    let source = S3_MIRROR;
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 41, 150, source);
    let sink = glue_sink(&fake.url(), "  commit_interval_secs: 1\n");
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    killed_under_writes(&running, &pipeline, 2, 0x6c76, 1500..3000);
    let (refused, lost) = fake.lake_faults();
    assert!(
        refused >= 3 && lost >= 3,
        "{refused} refused, {lost} answers lost"
    );
    let uri = format!("glue:{}", moto.endpoint);
    let table = read_catalog(&uri, "glue", "dynamodb.orders", Some(&moto.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
}

/// §7.11 with the AWS Glue Data Catalog (`iceberg::catalog` rules; moto serves Glue and S3):
/// `check` reads the catalog and finds no table yet; a mirror killed at random points under a
/// writer commits through Glue each change once; pyiceberg's `GlueCatalog` — a reader nobody
/// here wrote — reads the table: the changelog exact, the documented current state equal to
/// DynamoDB's table. Names are the ones Glue keeps, in lowercase (`namespace: DynamoDB` is the
/// database `dynamodb`, its directory `dynamodb.db`). A Glue table of the sink's name that is
/// not an Iceberg table is refused by `check` and `run` alike, naming it; nothing is written
/// to it.
#[test]
fn a_glue_catalog_holds_a_mirror_killed_anywhere_and_pyiceberg_reads_it() {
    let moto = moto_with_lake();
    let source = S3_MIRROR;
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 37, 150, source);
    let sink = glue_sink(
        &moto.endpoint,
        "  namespace: DynamoDB\n  commit_interval_secs: 1\n",
    );
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    let check = pipeline.ddbpipe(&["check"]);
    let said = stdout(&check);
    assert_eq!(check.status.code(), Some(0), "{said}");
    assert!(
        said.contains("Glue Data Catalog")
            && said.contains("not there yet")
            && said.contains("dynamodb.orders"),
        "{said}"
    );

    killed_under_writes(&running, &pipeline, 3, 0x6c75, 500..3000);
    let uri = format!("glue:{}", moto.endpoint);
    let table = read_catalog(&uri, "glue", "dynamodb.orders", Some(&moto.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
    assert!(
        (table.files.iter()).all(|f| f.starts_with("s3://lake/warehouse/dynamodb.db/orders/data/")),
        "{:?}",
        table.files
    );
    assert_eq!(
        documented_current_state_in(&uri, "glue", "dynamodb.orders", Some(&moto.endpoint)),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented query over pyiceberg's GlueCatalog gives the table"
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("its columns are the sink's"),
        "{}",
        stdout(&check)
    );
    // The columns Glue lists (boto3 reads them) are the table's, with Hive's types.
    let listed = iceberg_python(&["glue-columns", &moto.endpoint, "dynamodb", "orders"]);
    let listed: Vec<(String, String, BTreeMap<String, String>)> =
        serde_json::from_slice(&listed).unwrap();
    let hive = |iceberg: &str| {
        match iceberg {
            "long" => "bigint",
            "timestamptz" => "timestamp",
            other => other,
        }
        .to_string()
    };
    let names: BTreeMap<String, String> = (listed.iter())
        .map(|(name, kind, _)| (name.clone(), kind.clone()))
        .collect();
    let expected: BTreeMap<String, String> = (table.schema.iter())
        .map(|(name, kind)| (name.clone(), hive(kind)))
        .collect();
    assert_eq!(names, expected, "{listed:?}");
    assert!(
        (listed.iter()).all(|(_, _, parameters)| parameters.contains_key("iceberg.field.id")),
        "{listed:?}"
    );

    // A Glue table of the name that is not Iceberg's.
    iceberg_python(&["glue-table", &moto.endpoint, "dynamodb", "plain"]);
    let sink = glue_sink(&moto.endpoint, "  table: Plain\n");
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    let why = "Glue table dynamodb.plain";
    let check = pipeline.ddbpipe(&["check"]);
    let said = stdout(&check);
    assert_ne!(check.status.code(), Some(0), "{said}");
    assert!(
        said.contains(why) && said.contains("is not an Iceberg table"),
        "{said}"
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains(why) && err.contains("is not an Iceberg table"),
        "{err}"
    );
}
