//! Typed columns end to end through the CLI (docs/sinks.md §7.9): a mirror under a writer,
//! killed with SIGKILL at random points, ends with every typed column equal to the table's
//! attribute, as computed here from the table's items (not by ddbpipe's conversion); schema
//! changes between runs (a column added and filled, one removed, one re-typed, the document
//! dropped); `check` refusing what `run` refuses.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use common::keyed::{Destination, Target, table_items};
use common::writer::{Writer, start_writer};
use common::{Emulator, Pipeline, Running, stderr};

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
    assert!(err.contains("bigint") && err.contains("text"), "{err}");
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
