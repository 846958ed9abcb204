//! The iceberg sink into an Amazon S3 table bucket (docs/sinks.md §7.11, `catalog` rules 1–3;
//! moto serves S3 Tables and S3), read back by boto3 and pyiceberg — readers nobody here
//! wrote: the metadata location S3 Tables holds, opened as pyiceberg's `StaticTable`.

use super::*;

/// An iceberg sink's `sink:` section into the table bucket `arn` moto serves at `moto`, and
/// extra keys.
fn s3tables_sink(moto: &str, arn: &str, extra: &str) -> String {
    format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: s3tables\n    table_bucket_arn: '{arn}'\n    \
         endpoint_url: {moto}\n  s3_endpoint_url: {moto}\n{extra}"
    )
}

/// The tables of the bucket `arn`: `namespace.table` → (warehouse location, metadata
/// location), as boto3 reads them.
fn tables_of(moto: &str, arn: &str) -> BTreeMap<String, (String, Option<String>)> {
    let read: BTreeMap<String, Value> =
        serde_json::from_slice(&iceberg_python(&["s3tables-tables", moto, arn])).unwrap();
    (read.into_iter())
        .map(|(name, table)| {
            let warehouse = table["warehouse"].as_str().unwrap().to_string();
            let metadata = table["metadata"].as_str().map(str::to_string);
            (name, (warehouse, metadata))
        })
        .collect()
}

/// The catalogs' rules 4 and 5 with S3 Tables: the service and S3 refusing every third request
/// (`503`) or losing its answer (a 500 after the request was done: a namespace or table made,
/// a metadata location recorded under its version token, a file written, unbeknown) under a
/// mirror killed at random points and a writer. Each request is tried again; a commit whose
/// retry the service refuses for its stale token (`ConflictException`: the token moved with
/// the commit's own change) reads the location back and is known for a commit, not rebuilt;
/// pyiceberg reads every change once. Without the retries the first fault ends a run.
#[test]
fn an_s3_table_bucket_failing_now_and_then_loses_and_repeats_nothing() {
    let moto = moto_with_lake();
    let fake = super::super::fake_export::FakeExport::start(&moto.endpoint, &moto.endpoint);
    let arn = String::from_utf8(iceberg_python(&["s3tables-bucket", &moto.endpoint, "lake"]))
        .unwrap()
        .trim()
        .to_string();
    fake.fail_lake_requests(3);
    let source = S3_MIRROR;
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 43, 150, source);
    let sink = s3tables_sink(&fake.url(), &arn, "  commit_interval_secs: 1\n");
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    killed_under_writes(&running, &pipeline, 2, 0x5375, 1500..3000);
    let (refused, lost) = fake.lake_faults();
    assert!(
        refused >= 3 && lost >= 3,
        "{refused} refused, {lost} answers lost"
    );
    let uri = format!("s3tables:{arn}");
    let table = read_catalog(&uri, "s3tables", "dynamodb.orders", Some(&moto.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
}

/// `check` and `state show` find no table and make none; a mirror killed at random points under a writer
/// makes the namespace and table (names as S3 Tables keeps them: `namespace: Live-Data` is
/// `live_data`), writes its files under the location the service gives the table and records
/// each commit's metadata under the version token: every change once, the documented current
/// state equal to DynamoDB's table. `check` then compares the table's columns, `state show`
/// reads the position from it. A name S3 Tables refuses is refused by `check` and `run`
/// alike, naming the key, before anything is made.
#[test]
fn an_s3_table_bucket_holds_a_mirror_killed_anywhere_and_pyiceberg_reads_it() {
    let moto = moto_with_lake();
    let arn = String::from_utf8(iceberg_python(&["s3tables-bucket", &moto.endpoint, "lake"]))
        .unwrap()
        .trim()
        .to_string();
    let source = S3_MIRROR;
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 41, 150, source);
    let sink = s3tables_sink(
        &moto.endpoint,
        &arn,
        "  namespace: Live-Data\n  commit_interval_secs: 1\n",
    );
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    let check = pipeline.ddbpipe(&["check"]);
    let said = stdout(&check);
    assert_eq!(check.status.code(), Some(0), "{said}{}", stderr(&check));
    assert!(
        said.contains(&format!("S3 table bucket {arn}"))
            && said.contains("live_data.orders")
            && said.contains("not there yet"),
        "{said}"
    );
    let state = pipeline.ddbpipe(&["state", "show"]);
    assert_eq!(state.status.code(), Some(0), "{}", stderr(&state));
    assert!(
        stdout(&state).contains("no stored state"),
        "{}",
        stdout(&state)
    );
    assert_eq!(
        tables_of(&moto.endpoint, &arn),
        BTreeMap::new(),
        "check and state show make nothing"
    );

    killed_under_writes(&running, &pipeline, 3, 0x5374, 500..3000);
    let tables = tables_of(&moto.endpoint, &arn);
    let (warehouse, metadata) = &tables["live_data.orders"];
    assert_eq!(tables.len(), 1, "{tables:?}");
    let metadata = metadata.as_deref().expect("a metadata location");
    assert!(
        metadata.starts_with(&format!("{warehouse}/metadata/")),
        "{metadata} under {warehouse}"
    );
    let uri = format!("s3tables:{arn}");
    let table = read_catalog(&uri, "s3tables", "live_data.orders", Some(&moto.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
    assert!(
        (table.files.iter()).all(|f| f.starts_with(&format!("{warehouse}/data/"))),
        "{:?} under {warehouse}",
        table.files
    );
    assert_eq!(
        documented_current_state_in(&uri, "s3tables", "live_data.orders", Some(&moto.endpoint)),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented query over the table S3 Tables holds gives DynamoDB's table"
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("its columns are the sink's"),
        "{}",
        stdout(&check)
    );
    let state = pipeline.ddbpipe(&["state", "show"]);
    assert_eq!(state.status.code(), Some(0), "{}", stderr(&state));
    assert!(
        stdout(&state).contains("live_data.orders") && stdout(&state).contains("mirror"),
        "{}",
        stdout(&state)
    );

    // A name S3 Tables does not take.
    let sink = s3tables_sink(&moto.endpoint, &arn, "  table: _orders\n");
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    for command in [&["check"][..], &["run"][..]] {
        let output = pipeline.ddbpipe(command);
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(
            said.contains("sink.table") && said.contains("not an S3 Tables table name"),
            "{said}"
        );
    }
    assert_eq!(
        tables_of(&moto.endpoint, &arn).len(),
        1,
        "nothing more is made"
    );
}
