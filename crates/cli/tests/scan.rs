//! Scan and query end to end through the CLI, on both emulators (docs/testing.md §10 scenarios 1–4).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType};
use serde_json::{Value, json};

use common::{Emulator, Pipeline, item, n, s, stderr};

/// 501 items; item 0 holds a 23-digit number, binary [1,2] and a string set.
fn seed_501(emulator: &common::Running, table: &str) {
    emulator.create_table(table, ("pk", ScalarAttributeType::S), None);
    let mut items = vec![item(vec![
        ("pk", s("k000")),
        ("big", n("12345678901234567890123")),
        ("bin", AttributeValue::B(Blob::new(vec![1, 2]))),
        ("set", AttributeValue::Ss(vec!["a".into(), "b".into()])),
    ])];
    for i in 1..501 {
        items.push(item(vec![
            ("pk", s(&format!("k{i:03}"))),
            ("n", n(&i.to_string())),
        ]));
    }
    emulator.put_items(table, items);
}

fn parallel_scan_writes_every_item_once(emulator: Emulator) {
    let running = emulator.start();
    seed_501(&running, "items");
    let pipeline = Pipeline::new(
        "items-export",
        &running.endpoint,
        "table_name: items\nsegments: 4\npage_limit: 40\nbatch_size: 50",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    assert_eq!(records.len(), 501);
    let keys: BTreeSet<String> = records
        .iter()
        .map(|r| r["pk"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 501, "every line is a distinct item");
    let first = records.iter().find(|r| r["pk"] == "k000").unwrap();
    assert_eq!(first["big"], json!("12345678901234567890123"));
    assert_eq!(first["bin"], json!("AQI="));
    assert!(first["set"].is_array());
    let mut set: Vec<&str> = first["set"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    set.sort();
    assert_eq!(set, ["a", "b"]);
    // Lines are compact objects with sorted keys.
    let line = pipeline
        .lines()
        .into_iter()
        .find(|l| l.contains("k000"))
        .unwrap();
    assert_eq!(
        line,
        r#"{"big":"12345678901234567890123","bin":"AQI=","pk":"k000","set":["a","b"]}"#
    );
    let entry = pipeline.entry("items-export").expect("an entry is stored");
    assert_eq!(entry["position"], Value::Null);
    assert_eq!(entry["last_completed"]["items"], json!(501));
    assert!(
        stderr(&output).contains("complete: 501 read, 501 written"),
        "{}",
        stderr(&output)
    );
}

fn a_scan_killed_after_its_first_commit_resumes_without_losing_items(emulator: Emulator) {
    let running = emulator.start();
    seed_501(&running, "items");
    let slow = "table_name: items\nsegments: 4\nmax_concurrency: 2\npage_limit: 10\nbatch_size: 10\nmax_read_units_per_second: 1";
    let pipeline = Pipeline::new("items-export", &running.endpoint, slow);
    let mut child = common::spawn_run(&pipeline.config);
    let committed = common::wait_for(std::time::Duration::from_secs(60), || {
        pipeline
            .entry("items-export")
            .is_some_and(|e| !e["position"].is_null())
    });
    assert!(committed, "the first run committed a position");
    child.kill().unwrap(); // SIGKILL: no drain, no final commit.
    child.wait().unwrap();
    let first_run = pipeline.lines().len();
    assert!(
        first_run < 501,
        "the first run was interrupted ({first_run} lines)"
    );

    pipeline.write(
        "items-export",
        &running.endpoint,
        "table_name: items\nsegments: 4\nmax_concurrency: 2\npage_limit: 10\nbatch_size: 10",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = pipeline.lines();
    let rerun = lines.len() - first_run;
    assert!(
        rerun < 501,
        "the rerun read fewer items than a full scan ({rerun})"
    );
    let keys: BTreeSet<String> = pipeline
        .records()
        .iter()
        .map(|r| r["pk"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 501, "the two runs together hold every key");
    assert!(
        stderr(&output).contains("resumed=true"),
        "{}",
        stderr(&output)
    );
}

fn a_query_reads_one_partition_backwards_with_filter_and_projection(emulator: Emulator) {
    let running = emulator.start();
    running.create_table(
        "events",
        ("pk", ScalarAttributeType::S),
        Some(("sk", ScalarAttributeType::N)),
    );
    let mut items = Vec::new();
    for i in 0..20 {
        items.push(item(vec![
            ("pk", s("user#1")),
            ("sk", n(&i.to_string())),
            ("kind", s(if i % 2 == 0 { "even" } else { "odd" })),
            ("payload", s("not projected")),
        ]));
    }
    items.push(item(vec![
        ("pk", s("user#2")),
        ("sk", n("1")),
        ("kind", s("even")),
    ]));
    running.put_items("events", items);
    let pipeline = Pipeline::new(
        "events-query",
        &running.endpoint,
        "table_name: events\nmode: query\nkey_condition_expression: \"pk = :p\"\n\
         filter_expression: \"#k = :even\"\nprojection: \"pk, sk, #k\"\n\
         expression_attribute_names: {\"#k\": kind}\n\
         expression_attribute_values: {\":p\": \"user#1\", \":even\": even}\n\
         scan_index_forward: false\npage_limit: 4\nbatch_size: 3",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    let sks: Vec<i64> = records.iter().map(|r| r["sk"].as_i64().unwrap()).collect();
    assert_eq!(sks, vec![18, 16, 14, 12, 10, 8, 6, 4, 2, 0]);
    for record in &records {
        let keys: Vec<&String> = record.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["kind", "pk", "sk"], "projected attributes only");
        assert_eq!(record["pk"], "user#1");
    }
}

/// Number texts DynamoDB accepts, with their plain output (docs/values.md §3.2).
const NUMBERS: &[(&str, &str)] = &[
    ("1.0", "1"),
    ("0.1", "0.1"),
    ("1E+3", "1000"),
    ("1.50", "1.5"),
    ("0012", "12"),
    ("2.5e-3", "0.0025"),
    ("-1.5e2", "-150"),
    ("18446744073709551615", "18446744073709551615"),
    ("-9223372036854775808", "-9223372036854775808"),
    ("18446744073709551616", "\"18446744073709551616\""),
    ("-9223372036854775809", "\"-9223372036854775809\""),
    ("99999999999999999999", "\"99999999999999999999\""),
    ("12345678901234567890123", "\"12345678901234567890123\""),
    ("9007199254740993", "9007199254740993"),
    ("0.30000000000000004", "0.30000000000000004"),
    ("1e20", "1e+20"),
    ("1E+30", "1e+30"),
    ("1.00000000000000001", "\"1.00000000000000001\""),
    ("123456789.123456789", "\"123456789.123456789\""),
    (
        "3.14159265358979323846264338327950288",
        "\"3.14159265358979323846264338327950288\"",
    ),
    ("-0.000", "0"),
];

fn every_value_kind_comes_out_as_specified_in_plain_and_typed(emulator: Emulator) {
    let running = emulator.start();
    running.create_table("values", ("pk", ScalarAttributeType::S), None);
    let mut items = Vec::new();
    for (i, (text, _)) in NUMBERS.iter().enumerate() {
        items.push(item(vec![("pk", s(&format!("n{i:02}"))), ("v", n(text))]));
    }
    items.push(item(vec![
        ("pk", s("sets")),
        ("ns", AttributeValue::Ns(vec!["1".into(), "1.5".into()])),
        ("bs", AttributeValue::Bs(vec![Blob::new(vec![0xff])])),
        (
            "nested",
            AttributeValue::M(
                [
                    (
                        "l".to_string(),
                        AttributeValue::L(vec![
                            n("1"),
                            s("x"),
                            AttributeValue::Null(true),
                            AttributeValue::Bool(true),
                        ]),
                    ),
                    (
                        "m".to_string(),
                        AttributeValue::M([("deep".to_string(), n("2.50"))].into()),
                    ),
                ]
                .into(),
            ),
        ),
    ]));
    items.push(item(vec![
        ("pk", s("a")),
        ("blob", AttributeValue::B(Blob::new(vec![1]))),
        ("price", n("12345678901234567890.123456789")),
        ("tags", AttributeValue::Ss(vec!["x".into()])),
    ]));
    running.put_items("values", items);

    let pipeline = Pipeline::new("values-plain", &running.endpoint, "table_name: values");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = pipeline.lines();
    for (i, (text, expected)) in NUMBERS.iter().enumerate() {
        let key = format!("n{i:02}");
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("\"{key}\"")))
            .unwrap();
        assert_eq!(
            line,
            &format!("{{\"pk\":\"{key}\",\"v\":{expected}}}"),
            "number {text}"
        );
    }
    // Sets have no order: emulators may return their elements in any order.
    let sets = lines.iter().find(|l| l.contains("\"sets\"")).unwrap();
    let sets = sets.replace("[1.5,1]", "[1,1.5]");
    assert_eq!(
        sets,
        r#"{"bs":["/w=="],"nested":{"l":[1,"x",null,true],"m":{"deep":2.5}},"ns":[1,1.5],"pk":"sets"}"#
    );

    let typed = Pipeline::new(
        "values-typed",
        &running.endpoint,
        "table_name: values\nvalue_format: typed",
    );
    let output = typed.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let line = typed
        .lines()
        .into_iter()
        .find(|l| l.contains(r#""pk":{"S":"a"}"#))
        .unwrap();
    assert_eq!(
        line,
        r#"{"blob":{"B":"AQ=="},"pk":{"S":"a"},"price":{"N":"12345678901234567890.123456789"},"tags":{"SS":["x"]}}"#
    );
}

/// Issue 9 items 1 and 8: a stored scan position belongs to one table in one place, read into
/// one shape. Resuming it in another region (where a table of the same name exists), in
/// another account, or with another value format or projection would write a wrong or mixed
/// output: each is refused naming the field, and the state is left as it was.
fn a_resume_against_another_table_or_in_another_shape_is_refused_naming_the_field(
    emulator: Emulator,
) {
    let running = emulator.start();
    seed_501(&running, "items");
    // moto keeps regions apart: the same table name exists in us-west-2 too. dynoxide has one
    // region; the refusal must not depend on it. (The account comes from the table's ARN;
    // neither emulator serves two accounts, so that rule is tested on `Identity` itself.)
    if emulator == Emulator::Moto {
        let client = common::client_in(&running.endpoint, "us-west-2", "testing");
        common::create_table_on(&client, "items", ("pk", ScalarAttributeType::S), None);
    }
    let slow = "table_name: items\nsegments: 4\nmax_concurrency: 2\npage_limit: 10\nbatch_size: 10\nmax_read_units_per_second: 1";
    let pipeline = Pipeline::new("items-export", &running.endpoint, slow);
    let mut child = common::spawn_run(&pipeline.config);
    let committed = common::wait_for(std::time::Duration::from_secs(60), || {
        pipeline
            .entry("items-export")
            .is_some_and(|e| !e["position"].is_null())
    });
    assert!(committed, "the first run committed a position");
    child.kill().unwrap();
    child.wait().unwrap();
    let stored = std::fs::read_to_string(&pipeline.state).unwrap();
    assert!(stored.contains(r#""region":"us-east-1""#), "{stored}");

    let original = std::fs::read_to_string(&pipeline.config).unwrap();
    let changes = [
        (
            "region: us-east-1",
            "region: us-west-2",
            r#"region changed from "us-east-1" to "us-west-2""#,
        ),
        (
            "segments: 4",
            "segments: 4\n  value_format: typed",
            r#"value_format changed from "plain" to "typed""#,
        ),
        (
            "segments: 4",
            "segments: 4\n  projection: pk",
            r#"projection changed from null to "pk""#,
        ),
        // An overwrite resume would continue an empty temporary file and replace the lines
        // the interrupted append run wrote: refused.
        (
            "  type: jsonl\n",
            "  type: jsonl\n  write: overwrite\n",
            r#"sink_write changed from "append" to "overwrite""#,
        ),
    ];
    for (from, to, expected) in changes {
        std::fs::write(&pipeline.config, original.replace(from, to)).unwrap();
        let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{to}: {err}");
        assert!(
            err.contains(expected),
            "{to}: expected '{expected}' in {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&pipeline.state).unwrap(),
            stored,
            "{to}: the refused run left the state as it was"
        );
    }

    std::fs::write(
        &pipeline.config,
        original.replace("\n  max_read_units_per_second: 1", ""),
    )
    .unwrap();
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let keys: BTreeSet<String> = pipeline
        .records()
        .iter()
        .map(|r| r["pk"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        keys.len(),
        501,
        "the unchanged pipeline resumes and completes"
    );
}

/// Issue 9 item 7: a plain YAML number in `expression_attribute_values` is sent with every
/// digit of its text, so the filter matches the item it names and not its double neighbour.
fn a_filter_value_keeps_every_digit_of_its_yaml_text(emulator: Emulator) {
    let running = emulator.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items(
        "items",
        vec![
            item(vec![("pk", s("exact")), ("n", n("123456789.123456789"))]),
            item(vec![("pk", s("double")), ("n", n("123456789.12345679"))]),
        ],
    );
    let pipeline = Pipeline::new(
        "filtered",
        &running.endpoint,
        "table_name: items\nfilter_expression: \"n = :v\"\nexpression_attribute_values: {':v': 123456789.123456789}",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let keys: Vec<String> = pipeline
        .records()
        .iter()
        .map(|r| r["pk"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["exact"]);
    let state = std::fs::read_to_string(&pipeline.state).unwrap();
    assert!(
        state.contains(r#"{":v":{"N":"123456789.123456789"}}"#),
        "{state}"
    );
}

/// Issue 11: a rerun of a nightly export with `write: overwrite` replaces the file instead of
/// doubling it; with `gzip: true` the file gunzips to the items.
fn two_overwrite_runs_leave_the_items_once_plain_and_gzipped(emulator: Emulator) {
    let running = emulator.start();
    seed_501(&running, "items");
    for gzip in [false, true] {
        let pipeline = Pipeline::new("items-export", &running.endpoint, "");
        let sink = format!(
            "sink:\n  type: jsonl\n  path: {}\n  write: overwrite\n  gzip: {gzip}\nstate:\n  \
             path: {}\n  flush_interval_ms: 0\n",
            pipeline.out.display(),
            pipeline.state.display()
        );
        pipeline.write_with_sink(
            "items-export",
            &running.endpoint,
            "table_name: items\nsegments: 2\nbatch_size: 100",
            &sink,
        );
        for _ in 0..2 {
            let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        }
        let text = if gzip {
            let mut text = String::new();
            std::io::Read::read_to_string(
                &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&pipeline.out).unwrap()),
                &mut text,
            )
            .unwrap();
            text
        } else {
            std::fs::read_to_string(&pipeline.out).unwrap()
        };
        let keys = ddbpipe_testkit::pks(text.lines());
        let distinct: BTreeSet<&String> = keys.iter().collect();
        assert_eq!((keys.len(), distinct.len()), (501, 501), "gzip: {gzip}");
        let mut names: Vec<String> = std::fs::read_dir(pipeline.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "out.jsonl",
                "out.jsonl.lock",
                "pipeline.yaml",
                "state.json",
                "state.json.lock"
            ],
            "no temporary file is left (gzip: {gzip})"
        );
    }
}

on_both_emulators!(
    two_overwrite_runs_leave_the_items_once_plain_and_gzipped,
    parallel_scan_writes_every_item_once,
    a_scan_killed_after_its_first_commit_resumes_without_losing_items,
    a_query_reads_one_partition_backwards_with_filter_and_projection,
    every_value_kind_comes_out_as_specified_in_plain_and_typed,
    a_resume_against_another_table_or_in_another_shape_is_refused_naming_the_field,
    a_filter_value_keeps_every_digit_of_its_yaml_text,
);
