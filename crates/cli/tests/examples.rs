//! The library's examples (`crates/cli/examples/`), each run here against the embedded
//! emulator (and the test PostgreSQL server), so that none of them can rot: their code is
//! compiled into this test and called as their `main` would call it.

mod common;

#[allow(dead_code)]
#[path = "../examples/changes_with_own_checkpoints.rs"]
mod changes_with_own_checkpoints;
#[allow(dead_code)]
#[path = "../examples/drive_batches.rs"]
mod drive_batches;
#[allow(dead_code)]
#[path = "../examples/mirror_into_postgres.rs"]
mod mirror_into_postgres;
#[allow(dead_code)]
#[path = "../examples/scan_into_custom_sink.rs"]
mod scan_into_custom_sink;
#[allow(dead_code)]
#[path = "../examples/yaml_pipeline.rs"]
mod yaml_pipeline;

use aws_sdk_dynamodb::types::StreamViewType;
use common::keyed::{Destination, Target};
use common::{Emulator, Pipeline, item, n, rt, s};
use ddbpipe::{Cancel, Ended};

#[test]
fn yaml_pipeline_runs_a_pipeline_file() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    for i in 0..12 {
        emulator.put_pk("orders", &format!("k{i}"), "1");
    }
    let files = Pipeline::new("orders", &emulator.endpoint, "table_name: orders");
    let summary = rt()
        .block_on(yaml_pipeline::run_file(&files.config, Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Complete);
    assert_eq!(files.records().len(), 12);
}

#[test]
fn scan_into_custom_sink_totals_every_item() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    let items = (0..50)
        .map(|i| {
            item(vec![
                ("pk", s(&format!("o{i}"))),
                ("customer", s(if i % 2 == 0 { "even" } else { "odd" })),
                ("amount", n(&i.to_string())),
            ])
        })
        .collect();
    emulator.put_items("orders", items);
    let dir = tempfile::tempdir().expect("temp dir");
    let totals = scan_into_custom_sink::Totals::default();
    let summary = rt()
        .block_on(scan_into_custom_sink::scan(
            "orders",
            Some(&emulator.endpoint),
            &dir.path().join("state.json"),
            totals.clone(),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.written(), Some(50));
    let totals = totals.0.lock().expect("the totals").clone();
    let even: f64 = (0..50).filter(|i| i % 2 == 0).map(f64::from).sum();
    let odd: f64 = (0..50).filter(|i| i % 2 == 1).map(f64::from).sum();
    assert_eq!(totals.get("even"), Some(&even));
    assert_eq!(totals.get("odd"), Some(&odd));
}

#[test]
fn drive_batches_processes_every_item_and_completes_the_scan() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    let items = (0..75)
        .map(|i| {
            let mut pairs = vec![("pk", s(&format!("o{i:02}")))];
            if i % 3 != 0 {
                pairs.push(("amount", n(&i.to_string())));
            }
            item(pairs)
        })
        .collect();
    emulator.put_items("orders", items);
    let dir = tempfile::tempdir().expect("temp dir");
    let processed = drive_batches::Processed::default();
    let summary = rt()
        .block_on(drive_batches::drive(
            "orders",
            Some(&emulator.endpoint),
            &dir.path().join("state.json"),
            processed.clone(),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Complete, "{summary}");
    assert_eq!(summary.written(), Some(75));
    assert_eq!(
        processed.0.load(std::sync::atomic::Ordering::SeqCst),
        50,
        "two items in three have an amount"
    );
}

#[test]
fn changes_with_own_checkpoints_resumes_from_its_own_database() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("positions.db");
    let follow = |changes: &changes_with_own_checkpoints::Changes| {
        rt().block_on(changes_with_own_checkpoints::follow(
            "orders",
            Some(&emulator.endpoint),
            &db,
            changes.clone(),
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    emulator.put_pk("orders", "a", "1");
    emulator.put_pk("orders", "a", "2");
    let first = changes_with_own_checkpoints::Changes::default();
    assert_eq!(follow(&first).ended(), Ended::Idle);
    assert_eq!(
        *first.0.lock().expect("the changes"),
        [r#"insert {"pk":"a"}"#, r#"modify {"pk":"a"}"#]
    );
    let stored: String = rusqlite::Connection::open(&db)
        .expect("the positions database")
        .query_row(
            "SELECT checkpoint FROM positions WHERE pipeline = 'changes'",
            [],
            |row| row.get(0),
        )
        .expect("a stored position");
    assert!(stored.contains("\"shards\""), "{stored}");

    emulator.delete_pk("orders", "a");
    let second = changes_with_own_checkpoints::Changes::default();
    follow(&second);
    assert_eq!(
        *second.0.lock().expect("the changes"),
        [r#"remove {"pk":"a"}"#]
    );
}

#[test]
fn mirror_into_postgres_copies_the_table() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..20 {
        emulator.put_pk("orders", &format!("k{i:02}"), &i.to_string());
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let destination = Destination::new(Target::Postgres, dir.path());
    let summary = rt()
        .block_on(mirror_into_postgres::mirror(
            "orders",
            Some(&emulator.endpoint),
            &destination.url,
            &destination.schema,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    let rows = destination.documents("orders");
    assert_eq!(rows.len(), 20, "{rows:?}");
}
