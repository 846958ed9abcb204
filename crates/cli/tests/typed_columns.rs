//! Typed columns through the CLI (issue 28, docs/sinks.md §7.9): `init --columns auto` against
//! an emulator table of mixed types, and what a changed column list does to a stored position.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType, StreamViewType};

use common::{Emulator, Pipeline, Running, item, n, s, stderr, stdout};

/// `orders` (key `pk`) with an attribute of every kind, `mixed` of two types, and a name a
/// path quotes.
fn orders_of_every_kind(running: &Running) {
    running.create_table("orders", ("pk", ScalarAttributeType::S), None);
    let address = |city: &str| AttributeValue::M(HashMap::from([("city".to_string(), s(city))]));
    let items = (0..10)
        .map(|index| {
            let mut attributes = vec![
                ("pk", s(&format!("o{index}"))),
                ("status", s(if index % 2 == 0 { "paid" } else { "open" })),
                ("total", n(&format!("{index}.5"))),
                ("qty", n(&index.to_string())),
                ("paid", AttributeValue::Bool(index % 2 == 0)),
                (
                    "created_at",
                    s(&format!("2024-05-0{}T12:30:00Z", index % 9 + 1)),
                ),
                (
                    "tags",
                    AttributeValue::Ss(vec!["a".into(), format!("t{index}")]),
                ),
                ("address", address("Lyon")),
                ("a.b", s("dotted")),
            ];
            attributes.push(if index < 7 {
                ("mixed", s("text"))
            } else {
                ("mixed", n("7"))
            });
            item(attributes)
        })
        .collect();
    running.put_items("orders", items);
}

fn init(running: &Running, file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "init",
        "--table",
        "orders",
        "--region",
        "us-east-1",
        "--endpoint-url",
        &running.endpoint,
        "--sink",
        "sqlite",
        "--output",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    common::ddbpipe_with_test_credentials(&args)
}

/// Issue 28: `init --columns auto` samples the table and writes the columns it infers, each
/// with the share that matched; the file loads (`check` takes it) and `run` fills the columns.
#[test]
fn init_columns_auto_writes_the_columns_a_sample_suggests() {
    let running = Emulator::Dynoxide.start();
    orders_of_every_kind(&running);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orders.yaml");
    let output = init(&running, &file, &["--columns", "auto"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&file).unwrap();
    for line in [
        "  # key attributes pk: key columns already",
        "  columns:                         # inferred from 10 sampled items",
        "    - {name: \"a.b\", path: \"\\\"a.b\\\"\", type: text}",
        "    - {name: address, path: address, type: jsonb}",
        "    - {name: created_at, path: created_at, type: timestamptz}",
        "    - {name: mixed, path: mixed, type: jsonb}",
        "    - {name: paid, path: paid, type: boolean}",
        "    - {name: qty, path: qty, type: bigint}",
        "    - {name: status, path: status, type: text}",
        "    - {name: tags, path: tags, type: jsonb}",
        "    - {name: total, path: total, type: numeric}",
        "# 10/10 N, all integers",
        "# 10/10 mixed (3 N, 7 S), as JSON",
        "# 10/10 S, all ISO 8601 times",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    let document: serde_json::Value = yaml_serde::from_str(&text).unwrap();
    assert_eq!(document["sink"]["columns"].as_array().unwrap().len(), 9);

    let file = file.to_str().unwrap();
    let output = common::ddbpipe_with_test_credentials(&["check", file]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    let output = common::ddbpipe_with_test_credentials(&["run", "--progress", "never", file]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let db = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    let (qty, paid, city): (i64, i64, String) = db
        .query_row(
            "SELECT qty, paid, address FROM orders WHERE pk = 'o4'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    assert_eq!((qty, paid, city.as_str()), (4, 1, "{\"city\":\"Lyon\"}"));
}

/// `--sample` bounds the scan: the comments count the items read; `--columns auto` needs a
/// table sink.
#[test]
fn init_samples_at_most_the_items_asked_and_only_for_a_table_sink() {
    let running = Emulator::Dynoxide.start();
    orders_of_every_kind(&running);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orders.yaml");
    let output = init(&running, &file, &["--columns", "auto", "--sample", "3"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("inferred from 3 sampled items"), "{text}");
    assert!(text.contains("# 3/3 BOOL"), "{text}");

    let jsonl = dir.path().join("jsonl.yaml");
    let output = common::ddbpipe_with_test_credentials(&[
        "init",
        "--table",
        "orders",
        "--endpoint-url",
        &running.endpoint,
        "--region",
        "us-east-1",
        "--columns",
        "auto",
        "--output",
        jsonl.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("it needs --sink sqlite or --sink postgres"),
        "{}",
        stderr(&output)
    );
    assert!(!jsonl.exists());
}

/// Issue 28: adding a typed column keeps the stored position (it is filled from the
/// documents); dropping the document column is refused on resume with the remedy, which
/// works. The table is prepared before the position is checked, so the table's own document
/// column (NOT NULL) is named first.
#[test]
fn a_dropped_document_column_needs_a_resnapshot_and_an_added_column_does_not() {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let source = "table_name: orders\nmode: mirror\nidle_termination_secs: 1";
    let pipeline = Pipeline::new("orders-mirror", &running.endpoint, source);
    let sink = format!(
        "sink:\n  type: sqlite\n  path: {}\n",
        pipeline.dir.path().join("m.db").display()
    );
    let run = |sink: &str| {
        pipeline.write_with_sink("orders-mirror", &running.endpoint, source, sink);
        pipeline.ddbpipe(&["run", "--progress", "never"])
    };
    let output = run(&sink);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    let with_column = format!("{sink}  columns: [{{name: v, path: v, type: text}}]\n");
    let output = run(&with_column);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    let without_document = format!("{with_column}  document_column: null\n");
    let output = run(&without_document);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("column \"document\" of the table is NOT NULL"),
        "{}",
        stderr(&output)
    );
    let db = rusqlite::Connection::open(pipeline.dir.path().join("m.db")).unwrap();
    db.execute_batch("ALTER TABLE orders DROP COLUMN document")
        .unwrap();
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(
        message.contains("document_column changed from \"document\" to null")
            && message.contains("a resnapshot is needed, `ddbpipe state reset <config>` then run"),
        "{message}"
    );
    let output = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let v: String = db
        .query_row("SELECT v FROM orders WHERE pk = 'a'", [], |row| row.get(0))
        .unwrap();
    assert_eq!(v, "1");
}

/// `on_type_mismatch` reaches the sink: `null` (the default) stores NULL, `fail` fails the
/// run naming the column.
#[test]
fn on_type_mismatch_decides_what_a_value_of_another_type_does() {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", None);
    running.put_pk("orders", "a", "1");
    let source = "table_name: orders";
    let pipeline = Pipeline::new("orders-copy", &running.endpoint, source);
    let db_path = pipeline.dir.path().join("m.db");
    let sink = format!(
        "sink:\n  type: sqlite\n  path: {}\n  columns: [{{name: flag, path: v, type: boolean}}]\n",
        db_path.display()
    );
    pipeline.write_with_sink(
        "orders-copy",
        &running.endpoint,
        source,
        &format!("{sink}  on_type_mismatch: fail\n"),
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("flag"), "{}", stderr(&output));

    pipeline.write_with_sink("orders-copy", &running.endpoint, source, &sink);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let flag: Option<i64> = db
        .query_row("SELECT flag FROM orders WHERE pk = 'a'", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(flag, None);
}
