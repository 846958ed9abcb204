//! The iceberg sink into an Iceberg REST catalog (docs/sinks.md §7.11, `catalog/rest.rs`
//! rules): the tests' REST catalog (pyiceberg's `SqlCatalog` behind the API's routes,
//! `ddbpipe_testkit::iceberg_rest`) over moto's S3, read back by pyiceberg's own `RestCatalog`
//! client — a reader nobody here wrote.

use ddbpipe_testkit::iceberg_rest::RestCatalogServer;

use super::*;

/// The client credential the catalog takes: in no output, log or state.
const CREDENTIAL: &str = "ddbpipe:Rest-Catalog-S3cret";

/// `check` and `state show` find no table and make none; a mirror killed at random points
/// under a writer, through a catalog that serves the warehouse `lake` under a prefix, takes
/// tokens for a client credential and loses the answer of every fourth commit after doing it,
/// makes the namespace and registers the table, then commits by updates: every change once
/// (a lost answer read back, never committed twice), the documented current state equal to
/// DynamoDB's, as pyiceberg's RestCatalog reads it. `check` then compares the table's columns,
/// `state show` reads the position from it and `state reset` clears it; a credential the
/// catalog refuses fails `check` as it fails `run`, naming the setting; no credential reaches
/// any output or log.
#[test]
fn a_rest_catalog_holds_a_mirror_killed_anywhere_and_pyiceberg_reads_it() {
    let moto = moto_with_lake();
    let catalog_dir = tempfile::tempdir().unwrap();
    let server = RestCatalogServer::start(
        catalog_dir.path(),
        "s3://lake/warehouse",
        &[
            "--s3-endpoint",
            &moto.endpoint,
            "--client",
            CREDENTIAL,
            "--prefix",
            "catalogs/lake",
            "--warehouse-name",
            "lake",
            "--lose-every",
            "4",
        ],
    );
    let source = S3_MIRROR;
    let (running, pipeline) = seeded_orders(Emulator::Dynoxide, 47, 150, source);
    let sink = format!(
        "sink:\n  type: iceberg\n  catalog:\n    type: rest\n    uri: {}\n    warehouse: lake\n    \
         credential: '{CREDENTIAL}'\n  warehouse: s3://lake/warehouse\n  s3_endpoint_url: {}\n  \
         commit_interval_secs: 1\n",
        server.uri, moto.endpoint
    );
    pipeline.write_with_sink("lake", &running.endpoint, source, &sink);
    let mut said = String::new();
    let check = pipeline.ddbpipe(&["check"]);
    said.push_str(&format!("{}{}", stdout(&check), stderr(&check)));
    assert_eq!(check.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("REST catalog {} (warehouse 'lake')", server.uri))
            && said.contains("dynamodb.orders")
            && said.contains("not there yet"),
        "{said}"
    );
    let state = pipeline.ddbpipe(&["state", "show"]);
    said.push_str(&format!("{}{}", stdout(&state), stderr(&state)));
    assert_eq!(state.status.code(), Some(0), "{said}");
    assert!(stdout(&state).contains("no stored state"), "{said}");

    killed_under_writes(&running, &pipeline, 3, 0x7e57, 500..3000);
    let reader = serde_json::json!({
        "uri": server.uri,
        "credential": CREDENTIAL,
        "warehouse": "lake",
    });
    let uri = format!("rest:{reader}");
    let table = read_catalog(&uri, "rest", "dynamodb.orders", Some(&moto.endpoint));
    assert_changelog_exact(&table.as_read(), &running);
    assert!(
        (table.files.iter()).all(|f| f.starts_with("s3://lake/warehouse/dynamodb.db/orders/data/")),
        "{:?}",
        table.files
    );
    assert!(
        table.refs.contains(&"ddbpipe-claim".to_string()),
        "{:?}",
        table.refs
    );
    assert_eq!(
        documented_current_state_in(&uri, "rest", "dynamodb.orders", Some(&moto.endpoint)),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented query over the table the REST catalog holds gives DynamoDB's table"
    );
    let log = std::fs::read_to_string(catalog_dir.path().join("rest.log")).unwrap();
    assert!(
        log.contains("/tables/orders 502"),
        "no commit's answer was lost: {log}"
    );
    let check = pipeline.ddbpipe(&["check"]);
    said.push_str(&format!("{}{}", stdout(&check), stderr(&check)));
    assert!(
        stdout(&check).contains("its columns are the sink's"),
        "{said}"
    );
    let state = pipeline.ddbpipe(&["state", "show", "--json"]);
    said.push_str(&format!("{}{}", stdout(&state), stderr(&state)));
    assert_eq!(state.status.code(), Some(0), "{said}");
    assert!(stdout(&state).contains("mirror"), "{said}");
    // `state reset` claims the table (the claim branch moved) and commits no position.
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    said.push_str(&format!("{}{}", stdout(&reset), stderr(&reset)));
    assert_eq!(reset.status.code(), Some(0), "{said}");
    let state = pipeline.ddbpipe(&["state", "show"]);
    said.push_str(&format!("{}{}", stdout(&state), stderr(&state)));
    assert!(stdout(&state).contains("no stored state"), "{said}");
    // A credential the catalog refuses: `check` fails as `run` does, naming the setting.
    let wrong = sink.replace(CREDENTIAL, "ddbpipe:Not-The-S3cret");
    pipeline.write_with_sink("lake", &running.endpoint, source, &wrong);
    refused_by_check_and_run(&pipeline, "check sink.catalog.credential");
    let check = pipeline.ddbpipe(&["check"]);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    for output in [&check, &output] {
        let text = format!("{}{}", stdout(output), stderr(output));
        assert!(!text.contains("Not-The-S3cret"), "{text}");
    }
    for attempt in 0..3 {
        let log = pipeline.dir.path().join(format!("run-{attempt}.log"));
        said.push_str(&std::fs::read_to_string(log).unwrap());
    }
    assert!(!said.contains("Rest-Catalog-S3cret"), "{said}");
}
