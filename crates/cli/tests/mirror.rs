//! `mode: mirror` and the keyed sinks end to end through the CLI: a DynamoDB emulator as the
//! source, SQLite and PostgreSQL as destinations (docs/mirror.md §5, docs/sinks.md §7.2–§7.4; docs/testing.md §10 scenarios 10–14).
//!
//! The convergence tests compare the destination with the table item for item in typed form:
//! the table is dumped by a `mode: scan` pipeline with `value_format: typed`, the mirror runs
//! with the same format, so both sides are DynamoDB attribute JSON.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use common::keyed::{self, Destination, Target};
use common::writer::{Writer, start_writer};
use common::{Emulator, Pipeline, Running, item, rt, s, stderr};

const MIRROR: &str = "table_name: orders\nmode: mirror\nidle_termination_secs: 2";

/// A pipeline mirroring `orders` into a fresh destination.
fn mirror(running: &Running, target: Target, source: &str) -> (Pipeline, Destination) {
    let pipeline = Pipeline::new("orders-mirror", &running.endpoint, source);
    let destination = Destination::new(target, pipeline.dir.path());
    pipeline.write_with_sink(
        "orders-mirror",
        &running.endpoint,
        source,
        &destination.sink_yaml(),
    );
    (pipeline, destination)
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

fn keys(destination: &Destination) -> Vec<String> {
    destination.rows("orders").into_keys().collect()
}

fn delete(running: &Running, pk: &str) {
    running.delete_pk("orders", pk);
}

/// Re-creates `orders`: its stream is new, so a stored position has a gap (docs/streams.md §4.5).
fn recreate(running: &Running) {
    rt().block_on(running.client.delete_table().table_name("orders").send())
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
}

/// The snapshot record of the stored state (`null` when none is open).
fn snapshot_record(destination: &Destination) -> Value {
    let state = destination.state("orders-mirror");
    state["meta"].0["position"]["snapshot"].clone()
}

/// On moto: a re-created table's stream starts empty, as in DynamoDB (dynoxide replays the old
/// table's records into the new stream, which would bring b back).
fn mirror_gives_the_table_then_resnapshot_deletes_rows_of_items_gone_in_a_gap(target: Target) {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for pk in ["a", "b", "c"] {
        running.put_pk("orders", pk, "1");
    }
    let source = format!("{MIRROR}\non_gap: resnapshot\nsegments: 3");
    let (pipeline, destination) = mirror(&running, target, &source);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(keys(&destination), ["a", "b", "c"]);
    let rows = destination.rows("orders");
    assert_eq!(rows["a"].document, serde_json::json!({"pk": "a", "v": 1}));
    assert!(rows.values().all(|r| r.snapshot.is_some()), "{rows:?}");
    assert_eq!(snapshot_record(&destination), Value::Null);

    // Scenario 10: b deleted and d inserted during a gap.
    recreate(&running);
    for pk in ["a", "c", "d"] {
        running.put_pk("orders", pk, "2");
    }
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("are deleted once the scan completes"), "{err}");
    assert_eq!(keys(&destination), ["a", "c", "d"], "b is gone: {err}");
    assert_eq!(
        destination.rows("orders")["d"].document,
        serde_json::json!({"pk": "d", "v": 2})
    );
    assert_eq!(
        snapshot_record(&destination),
        Value::Null,
        "no snapshot open"
    );

    // The stream is read from the capture: a later change arrives.
    running.put_pk("orders", "e", "3");
    delete(&running, "a");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(keys(&destination), ["c", "d", "e"]);
}

fn over_resnapshot_max_keys_nothing_is_deleted_and_the_next_run_streams_on(target: Target) {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for pk in ["a", "b", "c"] {
        running.put_pk("orders", pk, "1");
    }
    let source = format!("{MIRROR}\non_gap: resnapshot\nsegments: 3\nresnapshot_max_keys: 2");
    let (pipeline, destination) = mirror(&running, target, &source);
    let output = run(&pipeline);
    assert_eq!(
        output.status.code(),
        Some(0),
        "a first mirror deletes nothing, so its size is no matter: {}",
        stderr(&output)
    );
    recreate(&running);
    for pk in ["a", "c", "d"] {
        running.put_pk("orders", pk, "2");
    }
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("the snapshot saw 3 keys, more than resnapshot_max_keys (2)"),
        "{err}"
    );
    assert!(
        err.contains("nothing was deleted and the position was saved"),
        "{err}"
    );
    assert_eq!(keys(&destination), ["a", "b", "c", "d"], "nothing deleted");
    assert_eq!(
        snapshot_record(&destination),
        Value::Null,
        "snapshot closed"
    );

    running.put_pk("orders", "e", "3");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(keys(&destination), ["a", "b", "c", "d", "e"]);
}

fn table_items(running: &Running) -> BTreeMap<String, Value> {
    keyed::table_items(&running.endpoint, "orders")
}

fn mirrored_items(destination: &Destination) -> BTreeMap<String, Value> {
    destination.items("orders")
}

fn assert_converged(running: &Running, destination: &Destination) {
    let table = table_items(running);
    let mirrored = mirrored_items(destination);
    let missing: Vec<&String> = table
        .keys()
        .filter(|k| !mirrored.contains_key(*k))
        .collect();
    let extra: Vec<&String> = mirrored
        .keys()
        .filter(|k| !table.contains_key(*k))
        .collect();
    let differ: Vec<&String> = table
        .iter()
        .filter(|(k, v)| mirrored.get(*k).is_some_and(|m| m != *v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "the destination differs from the table: missing {missing:?}, extra {extra:?}, differing {differ:?}"
    );
}

/// Scenario 13: 2 000 items, a writer updating and deleting random keys during the scan; the
/// mirror run until idle equals the table.
fn a_mirror_under_writes_converges_to_the_table(target: Target) {
    let running = Arc::new(Emulator::Dynoxide.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(13, 2000);
    let items: Vec<_> = (0..2000)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let source = format!(
        "{MIRROR}\nvalue_format: typed\nsegments: 4\nmax_concurrency: 1\npage_limit: 50\nbatch_size: 100\nmax_read_units_per_second: 10"
    );
    let (pipeline, destination) = mirror(&running, target, &source);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(Arc::clone(&running), 1313, 2000, Arc::clone(&stop));
    let child = spawn(&pipeline);
    // Writes go on while the scan runs (its first batches are committed meanwhile).
    assert!(
        common::wait_for(Duration::from_secs(60), || destination.rows("orders").len()
            >= 200),
        "the scan made no progress"
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 20, "the writer wrote during the scan ({writes})");
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_converged(&running, &destination);
}

/// docs/mirror.md §5.2, §5.6 (issue 12): into a keyed sink the stream is read while the table is
/// still being scanned. An item written after the scan started is in the destination while
/// the snapshot is still open; an item deleted meanwhile is gone and stays gone.
fn a_mirror_applies_changes_while_its_table_is_still_being_scanned(target: Target) {
    let running = Arc::new(Emulator::Dynoxide.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(21, 3000);
    let items: Vec<_> = (0..3000)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    // A few items a second: the scan takes minutes; the test stops it long before.
    let source = format!(
        "{MIRROR}\nsegments: 1\nmax_concurrency: 1\npage_limit: 10\nbatch_size: 10\nmax_read_units_per_second: 0.2"
    );
    let (pipeline, destination) = mirror(&running, target, &source);
    let mut child = common::spawn_logged(&pipeline, 0);
    assert!(
        common::wait_for(Duration::from_secs(60), || !destination
            .rows("orders")
            .is_empty()),
        "the scan made no progress"
    );
    running.put_pk("orders", "written-during-the-scan", "7");
    // The scan is still reading while the change is applied: the snapshot is open and its
    // one segment is not done.
    let scanning = || {
        destination
            .state("orders-mirror")
            .get("meta")
            .is_some_and(|(meta, _)| {
                let snapshot = &meta["position"]["snapshot"];
                !snapshot.is_null() && snapshot["done"].as_array().is_some_and(Vec::is_empty)
            })
    };
    let seen = common::wait_for(Duration::from_secs(30), || {
        destination
            .rows("orders")
            .contains_key("written-during-the-scan")
    });
    // An item the scan already wrote is deleted: its row goes, and the scan, still reading,
    // does not bring it back.
    let deleted = destination
        .rows("orders")
        .into_keys()
        .find(|k| k != "written-during-the-scan")
        .unwrap();
    delete(&running, &deleted);
    let gone = common::wait_for(Duration::from_secs(30), || {
        !destination.rows("orders").contains_key(&deleted)
    });
    std::thread::sleep(Duration::from_secs(2));
    let stays_gone = !destination.rows("orders").contains_key(&deleted);
    let still_scanning = scanning();
    let rows = destination.rows("orders").len();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(seen, "the change did not arrive during the scan");
    assert!(gone, "the delete did not arrive during the scan");
    assert!(stays_gone, "the deleted row came back");
    assert!(
        still_scanning,
        "the scan had finished first ({rows} rows): the test scanned too fast"
    );
}

/// docs/mirror.md §5.2: a jsonl mirror reads its stream only after its scan, and says that the
/// scan must then finish within the stream's retention.
#[test]
fn a_jsonl_mirror_warns_that_its_scan_must_finish_within_the_retention() {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("orders-mirror", &running.endpoint, MIRROR);
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the scan must finish within the stream's 24 h retention"),
        "{}",
        stderr(&output)
    );
    // The scan first, then the stream from the capture (which replays the item's insert).
    let ops: Vec<String> = pipeline
        .records()
        .iter()
        .map(|r| r["op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops, ["r", "c"]);
}

fn spawn(pipeline: &Pipeline) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["run", "--progress", "never"])
        .arg(&pipeline.config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The committed state and rows agree: every row was written by a transaction whose state is
/// committed, i.e. no row is newer than the stored position (docs/state.md §6.5: rows and position
/// commit together; the rows carry their transaction's time).
fn assert_rows_match_the_position(destination: &Destination, attempt: usize) {
    let state = destination.state("orders-mirror");
    let Some((_, meta_at)) = state.get("meta") else {
        assert!(
            destination.rows("orders").is_empty(),
            "rows without any committed position after kill {attempt}"
        );
        return;
    };
    let newest_row = destination
        .rows("orders")
        .into_values()
        .map(|row| row.updated_at)
        .max();
    if let Some(newest) = newest_row {
        assert!(
            newest <= *meta_at,
            "after kill {attempt}: a row written at {newest} is newer than the committed position ({meta_at})"
        );
    }
}

/// Scenario 14 and the convergence test: a writer applies a seeded random mix while the mirror
/// is killed with SIGKILL at random points and restarted; at the end the destination equals the
/// table, and after every kill the rows and the committed position agree.
fn a_mirror_killed_anywhere_converges_and_never_applies_a_batch_twice(
    target: Target,
    kills: usize,
) {
    let running = Arc::new(Emulator::Dynoxide.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(14, 600);
    let items: Vec<_> = (0..600)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let source = format!(
        "{MIRROR}\nvalue_format: typed\nsegments: 4\nmax_concurrency: 2\npage_limit: 25\nbatch_size: 20\non_gap: resnapshot"
    );
    let (pipeline, destination) = mirror(&running, target, &source);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(Arc::clone(&running), 1414, 600, Arc::clone(&stop));
    let mut rng = StdRng::seed_from_u64(0x14);
    for attempt in 0..kills {
        let mut child = common::spawn_logged(&pipeline, attempt);
        std::thread::sleep(Duration::from_millis(rng.random_range(150..1500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert_rows_match_the_position(&destination, attempt);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_rows_match_the_position(&destination, kills);
    assert_converged(&running, &destination);
    assert_eq!(snapshot_record(&destination), Value::Null);
}

fn check_state_and_reset_work_on_the_sink_database(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for pk in ["a", "b"] {
        running.put_pk("orders", pk, "1");
    }
    let (pipeline, destination) = mirror(&running, target, MIRROR);
    let output = pipeline.ddbpipe(&["check"]);
    let out = common::stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}{}", stderr(&output));
    assert!(out.contains("PASS sink"), "{out}");
    assert!(out.contains("will be created"), "{out}");
    assert!(out.contains("PASS state"), "{out}");

    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = pipeline.ddbpipe(&["check", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let probe = |name: &str| {
        report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    assert!(
        probe("sink")["detail"]
            .as_str()
            .unwrap()
            .contains("exists, 2 row(s)"),
        "{report}"
    );
    assert!(
        probe("state")["detail"]
            .as_str()
            .unwrap()
            .contains("position matches the source"),
        "{report}"
    );

    let output = pipeline.ddbpipe(&["state", "show", "--json"]);
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["fingerprint_status"], "match", "{shown}");
    assert_eq!(shown["entry"]["position"]["kind"], "mirror");
    assert_eq!(shown["entry"]["position"]["snapshot"], Value::Null);
    assert!(
        shown["entry"]["position"]["shards"]
            .as_object()
            .is_some_and(|s| !s.is_empty()),
        "{shown}"
    );

    let output = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(destination.state("orders-mirror").is_empty());
    assert_eq!(keys(&destination), ["a", "b"], "the rows stay");
    let output = pipeline.ddbpipe(&["state", "show", "--json"]);
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["entry"], Value::Null);
}

fn a_keys_only_stream_cannot_feed_a_keyed_sink(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::KeysOnly));
    let (pipeline, _destination) = mirror(
        &running,
        target,
        "table_name: orders\nmode: streams\nidle_termination_secs: 1",
    );
    let output = pipeline.ddbpipe(&["check"]);
    let out = common::stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL stream_view_type"), "{out}");
    assert!(out.contains("KEYS_ONLY"), "{out}");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("KEYS_ONLY"), "{err}");
    assert!(err.contains("NEW_IMAGE or NEW_AND_OLD_IMAGES"), "{err}");
}

/// Scan and query items are upserts too; a rerun of a completed scan changes nothing.
fn a_scan_into_a_keyed_sink_upserts_every_item(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", None);
    let mut writer = Writer::new(7, 100);
    let items: Vec<_> = (0..100)
        .map(|i| writer.random_item(&format!("k{i:03}")))
        .collect();
    running.put_items("orders", items);
    let (pipeline, destination) = mirror(
        &running,
        target,
        "table_name: orders\nvalue_format: typed\nsegments: 3\npage_limit: 7\nbatch_size: 9",
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_converged(&running, &destination);
    let before = destination.documents("orders");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(destination.documents("orders"), before);
}

fn an_existing_table_with_other_key_columns_is_refused(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let (pipeline, destination) = mirror(&running, target, MIRROR);
    destination.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, document TEXT)");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("id"), "{err}");
    assert!(err.contains("pk"), "{err}");
}

/// Issue 24 item 19: SIGTERM during a mirror's first snapshot (a rolling restart) is a clean
/// stop: the snapshot's progress is saved, the run exits 0 and says it was stopped, and the
/// snapshot stays open for the next run to resume. (The rows come from the stream beside the
/// snapshot too, so their count says nothing of the snapshot: its record does.)
fn sigterm_during_the_first_snapshot_exits_0_with_its_progress_saved(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_items(
        "orders",
        (0..1000)
            .map(|i| item(vec![("pk", s(&format!("k{i:04}")))]))
            .collect(),
    );
    let source = format!(
        "{MIRROR}\nmax_read_units_per_second: 1\npage_limit: 2\nbatch_size: 2\nsegments: 2\nmax_concurrency: 1"
    );
    let (pipeline, destination) = mirror(&running, target, &source);
    let child = spawn(&pipeline);
    let started = common::wait_for(Duration::from_secs(60), || {
        !destination.rows("orders").is_empty() && !snapshot_record(&destination).is_null()
    });
    assert!(started, "the snapshot wrote rows");
    common::sigterm(&child);
    let output = child.wait_with_output().unwrap();
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains("stopped by a signal") && said.contains("the snapshot is incomplete"),
        "{said}"
    );
    assert!(!said.contains("error:"), "{said}");
    assert!(
        !snapshot_record(&destination).is_null(),
        "the snapshot stays open for the next run"
    );
}

/// Issue 24 item 20: the summary counts the changes applied beside the snapshot (it said 0
/// after a mirror whose every change arrived while its table was scanned, and 16,483 where the
/// metrics' c + u + d said 20,483): the summary and the metrics count the same changes.
fn the_summary_counts_the_changes_written_beside_the_snapshot(target: Target) {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_items(
        "orders",
        (0..200)
            .map(|i| item(vec![("pk", s(&format!("k{i:03}")))]))
            .collect(),
    );
    // A slow scan: the stream's 200 records are read beside it.
    let source = format!("{MIRROR}\npage_limit: 5\nbatch_size: 5\nsegments: 2\nmax_concurrency: 1");
    let (pipeline, destination) = mirror(&running, target, &source);
    let (output, text) = pipeline.run_with_metrics_file();
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert_eq!(destination.rows("orders").len(), 200);
    assert!(
        said.contains(": 200 change record(s) written"),
        "every change written once, beside the snapshot or after it: {said}"
    );
    let changes: f64 = text
        .lines()
        .filter(|line| line.starts_with("ddbpipe_records_written_total{"))
        .filter(|line| {
            ["op=\"c\"", "op=\"u\"", "op=\"d\""]
                .iter()
                .any(|op| line.contains(op))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(changes, 200.0, "the metrics' c + u + d:\n{text}");
}

mod sqlite {
    use super::*;

    #[test]
    fn the_summary_counts_the_changes_written_beside_the_snapshot() {
        super::the_summary_counts_the_changes_written_beside_the_snapshot(Target::Sqlite);
    }

    #[test]
    fn sigterm_during_the_first_snapshot_exits_0_with_its_progress_saved() {
        super::sigterm_during_the_first_snapshot_exits_0_with_its_progress_saved(Target::Sqlite);
    }

    /// docs/config.md §1.3 (rules that need DescribeTable) and docs/sinks.md §7.2: a projection without a key
    /// attribute, and a key attribute named like the document column, are config errors.
    #[test]
    fn keys_a_keyed_sink_cannot_store_are_config_errors() {
        let running = Emulator::Dynoxide.start();
        running.create_pk_table("orders", None);
        running.put_pk("orders", "a", "1");
        let pipeline = Pipeline::new("orders-mirror", &running.endpoint, "table_name: orders");
        let sink = format!(
            "sink:\n  type: sqlite\n  path: {}\n",
            pipeline.dir.path().join("m.db").display()
        );
        for (source, sink, expected) in [
            (
                "table_name: orders\nprojection: v",
                sink.clone(),
                "projection must include key attribute 'pk' for the sqlite sink",
            ),
            (
                "table_name: orders",
                format!("{sink}  document_column: pk\n"),
                "key attribute 'pk' of table 'orders' has the same name as the document column",
            ),
        ] {
            pipeline.write_with_sink("orders-mirror", &running.endpoint, source, &sink);
            let output = run(&pipeline);
            assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
            assert!(stderr(&output).contains(expected), "{}", stderr(&output));
        }
    }

    #[test]
    fn check_state_and_reset_work_on_the_sink_database() {
        super::check_state_and_reset_work_on_the_sink_database(Target::Sqlite);
    }

    #[test]
    fn a_keys_only_stream_cannot_feed_a_keyed_sink() {
        super::a_keys_only_stream_cannot_feed_a_keyed_sink(Target::Sqlite);
    }

    #[test]
    fn a_scan_into_a_keyed_sink_upserts_every_item() {
        super::a_scan_into_a_keyed_sink_upserts_every_item(Target::Sqlite);
    }

    #[test]
    fn an_existing_table_with_other_key_columns_is_refused() {
        super::an_existing_table_with_other_key_columns_is_refused(Target::Sqlite);
    }

    #[test]
    fn mirror_gives_the_table_then_resnapshot_deletes_rows_of_items_gone_in_a_gap() {
        super::mirror_gives_the_table_then_resnapshot_deletes_rows_of_items_gone_in_a_gap(
            Target::Sqlite,
        );
    }

    #[test]
    fn over_resnapshot_max_keys_nothing_is_deleted_and_the_next_run_streams_on() {
        super::over_resnapshot_max_keys_nothing_is_deleted_and_the_next_run_streams_on(
            Target::Sqlite,
        );
    }

    #[test]
    fn a_mirror_under_writes_converges_to_the_table() {
        super::a_mirror_under_writes_converges_to_the_table(Target::Sqlite);
    }

    #[test]
    fn a_mirror_applies_changes_while_its_table_is_still_being_scanned() {
        super::a_mirror_applies_changes_while_its_table_is_still_being_scanned(Target::Sqlite);
    }

    #[test]
    fn a_mirror_killed_anywhere_converges_and_never_applies_a_batch_twice() {
        super::a_mirror_killed_anywhere_converges_and_never_applies_a_batch_twice(
            Target::Sqlite,
            10,
        );
    }
}

mod postgres {
    use super::*;

    #[test]
    fn the_summary_counts_the_changes_written_beside_the_snapshot() {
        super::the_summary_counts_the_changes_written_beside_the_snapshot(Target::Postgres);
    }

    /// A wrong password fails the run; no output of run, check or state shows it.
    #[test]
    fn the_password_is_never_printed() {
        let running = Emulator::Dynoxide.start();
        running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
        let url = common::keyed::postgres_url();
        let (user, rest) = url.split_once("://").unwrap().1.split_once(':').unwrap();
        let (_, host) = rest.split_once('@').unwrap();
        let secret = "s3cret-hunter2";
        let wrong = format!("postgres://{user}:{secret}@{host}");
        let pipeline = Pipeline::new("orders-mirror", &running.endpoint, MIRROR);
        pipeline.write_with_sink(
            "orders-mirror",
            &running.endpoint,
            MIRROR,
            &format!("sink:\n  type: postgres\n  url: '{wrong}'\n"),
        );
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(1));
        let err = stderr(&output);
        assert!(
            err.contains("password") || err.contains("authentication"),
            "{err}"
        );
        for args in [
            &["run"][..],
            &["check"],
            &["check", "--json"],
            &["state", "show"],
        ] {
            let output = pipeline.ddbpipe(args);
            let all = format!("{}{}", common::stdout(&output), stderr(&output));
            assert!(
                !all.contains(secret),
                "{args:?} printed the password: {all}"
            );
        }
    }

    #[test]
    fn check_state_and_reset_work_on_the_sink_database() {
        super::check_state_and_reset_work_on_the_sink_database(Target::Postgres);
    }

    #[test]
    fn a_keys_only_stream_cannot_feed_a_keyed_sink() {
        super::a_keys_only_stream_cannot_feed_a_keyed_sink(Target::Postgres);
    }

    #[test]
    fn sigterm_during_the_first_snapshot_exits_0_with_its_progress_saved() {
        super::sigterm_during_the_first_snapshot_exits_0_with_its_progress_saved(Target::Postgres);
    }

    #[test]
    fn a_scan_into_a_keyed_sink_upserts_every_item() {
        super::a_scan_into_a_keyed_sink_upserts_every_item(Target::Postgres);
    }

    #[test]
    fn an_existing_table_with_other_key_columns_is_refused() {
        super::an_existing_table_with_other_key_columns_is_refused(Target::Postgres);
    }

    #[test]
    fn mirror_gives_the_table_then_resnapshot_deletes_rows_of_items_gone_in_a_gap() {
        super::mirror_gives_the_table_then_resnapshot_deletes_rows_of_items_gone_in_a_gap(
            Target::Postgres,
        );
    }

    #[test]
    fn over_resnapshot_max_keys_nothing_is_deleted_and_the_next_run_streams_on() {
        super::over_resnapshot_max_keys_nothing_is_deleted_and_the_next_run_streams_on(
            Target::Postgres,
        );
    }

    #[test]
    fn a_mirror_under_writes_converges_to_the_table() {
        super::a_mirror_under_writes_converges_to_the_table(Target::Postgres);
    }

    #[test]
    fn a_mirror_applies_changes_while_its_table_is_still_being_scanned() {
        super::a_mirror_applies_changes_while_its_table_is_still_being_scanned(Target::Postgres);
    }

    #[test]
    fn a_mirror_killed_anywhere_converges_and_never_applies_a_batch_twice() {
        super::a_mirror_killed_anywhere_converges_and_never_applies_a_batch_twice(
            Target::Postgres,
            20,
        );
    }
}
