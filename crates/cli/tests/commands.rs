//! `check`, `discover`, config errors and a bad endpoint, through the CLI.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use aws_sdk_dynamodb::types::ScalarAttributeType;

use common::{Emulator, Pipeline, item, s, stderr, stdout};

fn check_passes_on_a_good_pipeline_and_fails_on_a_missing_index(emulator: Emulator) {
    let running = emulator.start();
    running.create_table(
        "items",
        ("pk", ScalarAttributeType::S),
        Some(("sk", ScalarAttributeType::N)),
    );
    running.put_items(
        "items",
        vec![item(vec![("pk", s("a")), ("sk", common::n("1"))])],
    );
    let pipeline = Pipeline::new(
        "items-export",
        &running.endpoint,
        "table_name: items\nsegments: 2",
    );
    let output = pipeline.ddbpipe(&["check", "--json"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["ok"], true);
    let names: Vec<&str> = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "config",
            "describe_table",
            "key_schema",
            "index",
            "read_capacity",
            "sink",
            "state"
        ]
    );
    let key_schema = &report["probes"][2];
    assert_eq!(key_schema["detail"], "pk (S), sk (N)");
    assert!(pipeline.lines().is_empty(), "check reads no data");

    pipeline.write(
        "items-export",
        &running.endpoint,
        "table_name: items\nindex_name: nope",
    );
    let output = pipeline.ddbpipe(&["check"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("FAIL index"),
        "{}",
        stdout(&output)
    );
    assert!(stdout(&output).contains("index 'nope' not found on table 'items'; indexes: none"));
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("config error: source.index_name: index 'nope' not found"));
}

fn discover_lists_every_table_with_its_key_schema(emulator: Emulator) {
    let running = emulator.start();
    running.create_table(
        "orders",
        ("customer", ScalarAttributeType::S),
        Some(("order", ScalarAttributeType::N)),
    );
    running.create_table("blobs", ("id", ScalarAttributeType::B), None);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args([
            "discover",
            "--json",
            "--region",
            "us-east-1",
            "--endpoint-url",
            &running.endpoint,
        ])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let tables: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let tables = tables.as_array().unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(tables[0]["name"], "blobs", "sorted by name");
    assert_eq!(tables[0]["schema"]["properties"]["id"]["type"], "string");
    assert_eq!(tables[1]["name"], "orders");
    assert_eq!(
        tables[1]["primary_key"],
        serde_json::json!(["customer", "order"])
    );
    assert_eq!(
        tables[1]["schema"]["properties"]["order"]["type"],
        serde_json::json!(["number", "string"])
    );
    assert_eq!(tables[1]["config_patch"]["table_name"], "orders");
    assert_eq!(tables[1]["kind"], "table");
}

on_both_emulators!(
    check_passes_on_a_good_pipeline_and_fails_on_a_missing_index,
    discover_lists_every_table_with_its_key_schema,
);

#[test]
fn every_config_problem_is_reported_at_once_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "name: orders\nbogus: 1\nsource:\n  table_name: orders\n  segments: 0\n  batch_size: 0\n  \
         resnapshot_deletes: \"false\"\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let output = common::ddbpipe(&["run"], &config);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    for expected in [
        "config error: bogus: unknown field",
        "config error: source.resnapshot_deletes:",
        "config error: source.batch_size: batch_size must be 1..=1000000 (got 0)",
        "config error: source.segments: segments must be 1..=1000000 (got 0)",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    let check = common::ddbpipe(&["check"], &config);
    assert_eq!(check.status.code(), Some(2));

    std::fs::write(
        &config,
        "name: orders\nsource:\n  table_name: orders\n  mode: query\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let err = stderr(&common::ddbpipe(&["run"], &config));
    assert!(
        err.contains("mode: query requires key_condition_expression"),
        "{err}"
    );
    std::fs::write(
        &config,
        "name: orders\nsource:\n  table_name: orders\n  mode: streams\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let err = stderr(&common::ddbpipe(&["run"], &config));
    assert!(err.contains("needs a way to terminate"), "{err}");
    let missing = common::ddbpipe(&["run"], &dir.path().join("missing.yaml"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("cannot read config file"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn an_unreachable_endpoint_fails_with_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let pipeline = Pipeline::new(
        "items-export",
        &endpoint,
        "table_name: items\nretry: {max_retries: 1, initial_backoff_ms: 10}",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("DescribeTable 'items' failed after 2 attempt(s)"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    assert!(err.contains(&endpoint), "{err}");
    assert!(
        pipeline.entry("items-export").is_none(),
        "nothing was stored"
    );
}
