//! Stored positions through the CLI: identity changes, corrupt state, locks, drains, and the
//! `state show|reset` commands (docs/state.md §6, docs/cli.md §8.4, §8.5, docs/testing.md §10 scenarios 16 and 17).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::ScalarAttributeType;
use serde_json::json;

use common::{Emulator, Pipeline, item, n, s, stderr, stdout};

fn seed(running: &common::Running, count: usize) {
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    let items = (0..count)
        .map(|i| {
            item(vec![
                ("pk", s(&format!("k{i:03}"))),
                ("a", n(if i % 2 == 0 { "1" } else { "2" })),
            ])
        })
        .collect();
    running.put_items("items", items);
}

const SLOW: &str =
    "max_read_units_per_second: 1\npage_limit: 5\nbatch_size: 5\nsegments: 2\nmax_concurrency: 1";

/// Starts a slow run and waits until it has committed a position.
fn run_until_committed(pipeline: &Pipeline, name: &str) -> std::process::Child {
    let child = common::spawn_run(&pipeline.config);
    let committed = common::wait_for(Duration::from_secs(60), || {
        pipeline
            .entry(name)
            .is_some_and(|e| !e["position"].is_null())
    });
    assert!(committed, "the run committed a position");
    child
}

fn a_changed_filter_is_refused_until_the_state_is_reset(emulator: Emulator) {
    let running = emulator.start();
    seed(&running, 200);
    let with_filter = |filter: &str, slow: bool| {
        format!(
            "table_name: items\nfilter_expression: \"a = :x\"\nexpression_attribute_values: {{\":x\": 1}}\n{}\n",
            if slow { SLOW } else { "segments: 2" }
        )
        .replace("a = :x", filter)
    };
    let pipeline = Pipeline::new(
        "items-export",
        &running.endpoint,
        &with_filter("a = :x", true),
    );
    let child = run_until_committed(&pipeline, "items-export");
    // SIGTERM drains: what was read is written, the position is committed, exit 0 (issue 24
    // item 19: a stop that saved its progress is a clean one; the note says the output is
    // incomplete and the rerun resumes).
    common::sigterm(&child);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("stopped by a signal") && said.contains("the output is incomplete"),
        "{said}"
    );
    let entry = pipeline.entry("items-export").unwrap();
    assert!(
        !entry["position"].is_null(),
        "the drain committed the position"
    );

    pipeline.write(
        "items-export",
        &running.endpoint,
        &with_filter("a <> :x", false),
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("was made with a different source"), "{err}");
    assert!(
        err.contains("filter_expression changed from \"a = :x\" to \"a <> :x\""),
        "{err}"
    );
    assert!(err.contains("ddbpipe state reset"), "{err}");

    let show = pipeline.ddbpipe(&["state", "show", "--json"]);
    assert_eq!(show.status.code(), Some(0));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(shown["fingerprint_status"], "differs");

    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("complete: 100 read"),
        "{}",
        stderr(&output)
    );
}

fn a_second_run_of_the_same_pipeline_is_refused(emulator: Emulator) {
    let running = emulator.start();
    seed(&running, 100);
    let pipeline = Pipeline::new(
        "items-export",
        &running.endpoint,
        &format!("table_name: items\n{SLOW}"),
    );
    let mut first = run_until_committed(&pipeline, "items-export");
    let second = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(second.status.code(), Some(1));
    let err = stderr(&second);
    assert!(
        err.contains("pipeline 'items-export' is already running"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(
        reset.status.code(),
        Some(1),
        "reset fails while a run holds the lock"
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert!(stdout(&check).contains("WARN state"), "{}", stdout(&check));
    first.kill().unwrap();
    first.wait().unwrap();
}

fn corrupt_state_stops_the_run_and_is_left_untouched(emulator: Emulator) {
    let running = emulator.start();
    seed(&running, 10);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Replace the position with one whose shard sequence is a number, not a string.
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&pipeline.state).unwrap()).unwrap();
    doc["pipelines"]["items-export"]["position"] = json!({"finished":[],"kind":"streams","latest_floor_ms":{},
        "shards":{"s1":4960},"snapshot":null,"stream_arn":"arn:aws:dynamodb:us-east-1:1:table/items/stream/x","verified_at":{}});
    let corrupt = doc.to_string();
    std::fs::write(&pipeline.state, &corrupt).unwrap();

    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains(&pipeline.state.display().to_string()),
        "names the file: {err}"
    );
    assert!(
        err.contains("pipelines.items-export.position.shards.s1"),
        "names the path: {err}"
    );
    assert!(err.contains("state reset"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&pipeline.state).unwrap(),
        corrupt,
        "byte-for-byte unchanged"
    );

    let show = pipeline.ddbpipe(&["state", "show"]);
    assert_eq!(show.status.code(), Some(1));
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

fn state_show_and_reset_report_what_is_stored(emulator: Emulator) {
    let running = emulator.start();
    seed(&running, 10);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let show = pipeline.ddbpipe(&["state", "show"]);
    assert_eq!(show.status.code(), Some(0));
    assert!(stdout(&show).contains("no stored state for pipeline 'items-export'"));

    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let show = pipeline.ddbpipe(&["state", "show", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(shown["fingerprint_status"], "none");
    assert_eq!(shown["entry"]["last_completed"]["items"], 10);
    assert_eq!(shown["entry"]["position"], serde_json::Value::Null);

    let refused = pipeline.ddbpipe(&["state", "reset"]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "without a terminal --yes is required"
    );
    assert!(stderr(&refused).contains("--yes"));
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0));
    assert!(pipeline.entry("items-export").is_none());
    assert_eq!(pipeline.lines().len(), 10, "the destination is untouched");
}

on_both_emulators!(
    a_changed_filter_is_refused_until_the_state_is_reset,
    a_second_run_of_the_same_pipeline_is_refused,
    corrupt_state_stops_the_run_and_is_left_untouched,
    state_show_and_reset_report_what_is_stored,
);

/// A pipeline `name` in its own temp dir: its own state file, the jsonl sink to `out`.
fn pipeline_writing_to(name: &str, endpoint: &str, out: &std::path::Path) -> Pipeline {
    let pipeline = Pipeline::new(name, endpoint, "table_name: items");
    let sink = format!(
        "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {}\n",
        out.display(),
        pipeline.state.display()
    );
    pipeline.write_with_sink(name, endpoint, "table_name: items", &sink);
    pipeline
}

/// Issue 9 item 2: two pipelines writing one file interleaved and overwrote each other's
/// lines. The second writer is refused at once, naming the holder; the output stays whole.
#[test]
fn a_second_pipeline_writing_the_same_file_is_refused_and_the_output_stays_intact() {
    let running = Emulator::Dynoxide.start();
    seed(&running, 100);
    let first = Pipeline::new(
        "items-export",
        &running.endpoint,
        &format!("table_name: items\n{SLOW}"),
    );
    let mut child = run_until_committed(&first, "items-export");
    let second = pipeline_writing_to("items-copy", &running.endpoint, &first.out);
    let output = second.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("is being written by pipeline 'items-export'"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {}", child.id())), "{err}");
    assert!(
        err.contains("give each pipeline its own sink.path"),
        "{err}"
    );
    assert!(
        second.entry("items-copy").is_none(),
        "nothing was committed"
    );
    let check = second.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("FAIL sink") && stdout(&check).contains("'items-export'"),
        "{}",
        stdout(&check)
    );

    common::sigterm(&child);
    child.wait().unwrap();
    let lines = first.lines();
    let keys: std::collections::BTreeSet<String> = first
        .records()
        .iter()
        .map(|r| r["pk"].as_str().unwrap().to_string())
        .collect();
    assert!(!lines.is_empty());
    assert_eq!(keys.len(), lines.len(), "one line per key, none broken");
}

/// Issue 9 item 12: with one state file shared by two pipelines, the refused one was told
/// that it itself was running.
#[test]
fn a_shared_state_file_names_the_pipeline_that_holds_the_lock() {
    let running = Emulator::Dynoxide.start();
    seed(&running, 100);
    let first = Pipeline::new(
        "items-export",
        &running.endpoint,
        &format!("table_name: items\n{SLOW}"),
    );
    let mut child = run_until_committed(&first, "items-export");
    let other = Pipeline::new("items-other", &running.endpoint, "table_name: items");
    let sink = format!(
        "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {}\n",
        other.out.display(),
        first.state.display()
    );
    other.write_with_sink("items-other", &running.endpoint, "table_name: items", &sink);
    let output = other.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("pipeline 'items-export' is already running"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {}", child.id())), "{err}");
    assert!(
        err.contains("pipeline 'items-other' shares its state file"),
        "{err}"
    );
    let check = other.ddbpipe(&["check"]);
    assert!(
        stdout(&check).contains("pipeline 'items-export' is running now"),
        "{}",
        stdout(&check)
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Issue 9 item 12: the operating system's text appeared twice in one message (the error's
/// own text, then again as its cause).
#[test]
fn an_os_error_is_printed_once() {
    let running = Emulator::Dynoxide.start();
    seed(&running, 1);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let blocker = pipeline.dir.path().join("blocker");
    std::fs::write(&blocker, "").unwrap();
    let sink = format!(
        "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {}\n",
        pipeline.out.display(),
        blocker.join("state.json").display()
    );
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &sink,
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.matches("(os error").count(), 1, "{err}");
    assert!(err.contains("state.path"), "{err}");
}
