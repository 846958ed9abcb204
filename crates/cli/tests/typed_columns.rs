//! Typed columns end to end through the CLI (docs/sinks.md §7.9): `init --columns auto` against
//! an emulator table of mixed types; a mirror under a writer,
//! killed with SIGKILL at random points, ends with every typed column equal to the table's
//! attribute, as computed here from the table's items (not by ddbpipe's conversion); schema
//! changes between runs (a column added and filled, one removed, one re-typed, the document
//! dropped); `check` refusing what `run` refuses.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType, StreamViewType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use common::keyed::{Destination, Target, table_items};
use common::writer::{Writer, start_writer};
use common::{Emulator, Pipeline, Running, item, n, s, stderr, stdout};

const MIRROR: &str = "table_name: orders\nmode: mirror\nidle_termination_secs: 2";

/// The typed columns of the convergence test: every column type, paths into maps and lists,
/// a column that never fits (`big_int`: the writer's `big` has four decimals), a missing
/// attribute and a list element that is `NULL`.
const COLUMNS: &str = "  columns:
    - {name: v, path: v, type: bigint}
    - {name: v_double, path: v, type: double}
    - {name: big, path: big, type: numeric}
    - {name: big_int, path: big, type: bigint}
    - {name: blob, path: blob, type: text}
    - {name: half, path: nested.n, type: numeric}
    - {name: first, path: 'nested.l[0]', type: text}
    - {name: flag, path: 'nested.l[1]', type: boolean}
    - {name: gone, path: 'nested.l[2]', type: text}
    - {name: tags, path: tags, type: jsonb}
    - {name: nothing, path: nothing, type: text}
";

/// The column names of [`COLUMNS`], in order.
const NAMES: [&str; 11] = [
    "v", "v_double", "big", "big_int", "blob", "half", "first", "flag", "gone", "tags", "nothing",
];

/// A pipeline mirroring `orders` into a fresh destination with `extra` sink lines.
fn mirror(running: &Running, target: Target, source: &str, extra: &str) -> (Pipeline, Destination) {
    let pipeline = Pipeline::new("orders-mirror", &running.endpoint, source);
    let destination = Destination::new(target, pipeline.dir.path());
    rewrite(&pipeline, running, &destination, source, extra);
    (pipeline, destination)
}

/// Rewrites the pipeline's file with `extra` sink lines.
fn rewrite(
    pipeline: &Pipeline,
    running: &Running,
    destination: &Destination,
    source: &str,
    extra: &str,
) {
    let sink = format!("{}{extra}", destination.sink_yaml());
    pipeline.write_with_sink("orders-mirror", &running.endpoint, source, &sink);
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

/// A decimal's text reduced to compare by value: no sign on zero, no leading zeros, no
/// trailing zeros after the point.
fn decimal(text: &str) -> String {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let whole = whole.trim_start_matches('0');
    let fraction = fraction.trim_end_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    if whole == "0" && fraction.is_empty() {
        return "0".into();
    }
    if fraction.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{fraction}")
    }
}

/// One expected column value, compared by meaning: numbers by value, JSON by value (sets as
/// sorted arrays), booleans by truth.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Null,
    Integer(i64),
    Double(f64),
    Decimal(String),
    Text(String),
    Boolean(bool),
    Json(Value),
}

impl Expected {
    /// Reads a stored column's text as `self`'s kind.
    fn read(&self, stored: Option<&String>) -> Expected {
        let Some(text) = stored else {
            return Expected::Null;
        };
        match self {
            Expected::Null => Expected::Text(text.clone()),
            Expected::Integer(_) => Expected::Integer(text.parse().unwrap()),
            Expected::Double(_) => Expected::Double(text.parse().unwrap()),
            Expected::Decimal(_) => Expected::Decimal(decimal(text)),
            Expected::Text(_) => Expected::Text(text.clone()),
            Expected::Boolean(_) => Expected::Boolean(matches!(text.as_str(), "true" | "1")),
            Expected::Json(_) => {
                let mut json: Value = serde_json::from_str(text).unwrap();
                if let Value::Array(items) = &mut json {
                    items.sort_by_key(Value::to_string);
                }
                Expected::Json(json)
            }
        }
    }
}

/// The expected values of [`NAMES`] for one item (typed JSON, sets sorted), computed from the
/// item alone.
fn expected(item: &Value) -> Vec<Expected> {
    let n = |v: &Value| v["N"].as_str().map(str::to_string);
    let v = n(&item["v"]);
    let big = n(&item["big"]);
    let nested = &item["nested"]["M"];
    let list = nested["l"]["L"].as_array().cloned().unwrap_or_default();
    let big_int = big.as_deref().and_then(|text| {
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        (fraction.chars().all(|c| c == '0'))
            .then(|| whole.parse::<i64>().ok())
            .flatten()
    });
    vec![
        v.as_ref()
            .map_or(Expected::Null, |v| Expected::Integer(v.parse().unwrap())),
        v.as_ref()
            .map_or(Expected::Null, |v| Expected::Double(v.parse().unwrap())),
        big.as_ref()
            .map_or(Expected::Null, |b| Expected::Decimal(decimal(b))),
        big_int.map_or(Expected::Null, Expected::Integer),
        item["blob"]["B"]
            .as_str()
            .map_or(Expected::Null, |b| Expected::Text(b.to_string())),
        n(&nested["n"]).map_or(Expected::Null, |h| Expected::Decimal(decimal(&h))),
        list.first()
            .and_then(|e| e["S"].as_str())
            .map_or(Expected::Null, |s| Expected::Text(s.to_string())),
        list.get(1)
            .and_then(|e| e["BOOL"].as_bool())
            .map_or(Expected::Null, Expected::Boolean),
        // The list's third element is NULL: a null column, not a mismatch.
        Expected::Null,
        item["tags"]["SS"]
            .as_array()
            .map_or(Expected::Null, |tags| {
                Expected::Json(Value::Array(tags.clone()))
            }),
        Expected::Null,
    ]
}

/// Every row's typed columns equal what the table's item says, and the destination holds
/// exactly the table's keys.
fn assert_columns_match_the_table(running: &Running, destination: &Destination) {
    let table = table_items(&running.endpoint, "orders");
    let stored = destination.column_texts("orders", &NAMES);
    assert_eq!(
        stored.keys().collect::<Vec<_>>(),
        table.keys().collect::<Vec<_>>(),
        "the destination's keys differ from the table's"
    );
    let mut checked = 0;
    for (pk, item) in &table {
        let wanted = expected(item);
        let row = &stored[pk];
        for ((name, want), got) in NAMES.iter().zip(&wanted).zip(row) {
            assert_eq!(
                &want.read(got.as_ref()),
                want,
                "row {pk}, column {name}: stored {got:?}, the item is {item}"
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} values compared");
}

/// Issue 28's end-to-end test: a mirror with typed columns, killed anywhere under a writer,
/// ends with every column equal to the table's value.
fn a_mirror_with_typed_columns_killed_anywhere_ends_equal_to_the_table(
    target: Target,
    format: &str,
) {
    let running = Arc::new(Emulator::Dynoxide.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(28, 300);
    let items: Vec<_> = (0..300)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let source = format!(
        "{MIRROR}\nvalue_format: {format}\nsegments: 4\nmax_concurrency: 2\npage_limit: 25\nbatch_size: 20\non_gap: resnapshot"
    );
    let (pipeline, destination) = mirror(&running, target, &source, COLUMNS);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(Arc::clone(&running), 2828, 300, Arc::clone(&stop));
    let mut rng = StdRng::seed_from_u64(0x28);
    for attempt in 0..6 {
        let mut child = common::spawn_logged(&pipeline, attempt);
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_columns_match_the_table(&running, &destination);
}

/// Columns added, removed and re-typed between runs; the document dropped.
fn schema_changes_between_runs(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(7, 40);
    let items: Vec<_> = (0..40)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let first = "  columns:\n    - {name: v, path: v, type: bigint}\n    - {name: blob, path: blob, type: text}\n";
    let (pipeline, destination) = mirror(&running, target, MIRROR, first);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // All of COLUMNS but `blob`: the new ones are added and filled from the documents of the
    // rows already there; `blob` stays in the table, named in a warning.
    let without_blob: String = COLUMNS
        .lines()
        .filter(|line| !line.contains("name: blob"))
        .map(|line| format!("{line}\n"))
        .collect();
    rewrite(&pipeline, &running, &destination, MIRROR, &without_blob);
    let output = pipeline.ddbpipe(&["check"]);
    let out = common::stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}{}", stderr(&output));
    assert!(
        out.contains("big_int"),
        "check names the columns it adds: {out}"
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains("blob"),
        "the column left in the table is named: {err}"
    );
    assert_columns_match_the_table(&running, &destination);

    // `v` re-typed: check and run refuse, naming it; nothing changes.
    let retyped = without_blob.replace(
        "{name: v, path: v, type: bigint}",
        "{name: v, path: v, type: text}",
    );
    rewrite(&pipeline, &running, &destination, MIRROR, &retyped);
    let before = destination.column_texts("orders", &NAMES);
    let output = pipeline.ddbpipe(&["check"]);
    let out = common::stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("'v'") || out.contains("\"v\""), "{out}");
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{err}");
    let lower = err.to_lowercase();
    assert!(lower.contains("bigint") && lower.contains("text"), "{err}");
    assert_eq!(destination.column_texts("orders", &NAMES), before);

    // The document dropped: the stored position was written with one, a resnapshot is needed.
    let dropped = format!("  document_column: null\n{without_blob}");
    rewrite(&pipeline, &running, &destination, MIRROR, &dropped);
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains("resnapshot") || err.contains("state reset"),
        "{err}"
    );
    assert_eq!(destination.column_texts("orders", &NAMES), before);
}

/// `on_type_mismatch: fail` stops at the first value that does not fit, naming the column and
/// the item's key; nothing of the batch is written. With the default (`null`) the same items
/// are written with NULL there.
fn a_mismatch_fails_the_run_when_asked(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", None);
    let mut seed = Writer::new(9, 10);
    let items: Vec<_> = (0..10)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let column = "  columns:\n    - {name: big_int, path: big, type: bigint}\n";
    let scan = "table_name: orders";
    let (pipeline, destination) = mirror(
        &running,
        target,
        scan,
        &format!("  on_type_mismatch: fail\n{column}"),
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("big_int") && err.contains("k0"), "{err}");
    assert!(destination.column_texts("orders", &["big_int"]).is_empty());

    rewrite(&pipeline, &running, &destination, scan, column);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stored = destination.column_texts("orders", &["big_int"]);
    assert_eq!(stored.len(), 10);
    assert!(stored.values().all(|v| v[0].is_none()), "{stored:?}");
}

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
        stderr(&output).contains("it needs --sink sqlite, postgres, parquet or iceberg"),
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

mod sqlite {
    use super::*;

    #[test]
    fn a_mirror_with_typed_columns_killed_anywhere_ends_equal_to_the_table() {
        super::a_mirror_with_typed_columns_killed_anywhere_ends_equal_to_the_table(
            Target::Sqlite,
            "plain",
        );
    }

    #[test]
    fn schema_changes_between_runs() {
        super::schema_changes_between_runs(Target::Sqlite);
    }

    #[test]
    fn a_mismatch_fails_the_run_when_asked() {
        super::a_mismatch_fails_the_run_when_asked(Target::Sqlite);
    }
}

mod postgres {
    use super::*;

    #[test]
    fn a_mirror_with_typed_columns_killed_anywhere_ends_equal_to_the_table() {
        super::a_mirror_with_typed_columns_killed_anywhere_ends_equal_to_the_table(
            Target::Postgres,
            "typed",
        );
    }

    #[test]
    fn schema_changes_between_runs() {
        super::schema_changes_between_runs(Target::Postgres);
    }

    #[test]
    fn a_mismatch_fails_the_run_when_asked() {
        super::a_mismatch_fails_the_run_when_asked(Target::Postgres);
    }
}
