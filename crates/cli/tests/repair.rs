//! `on_gap: repair` end to end through the CLI (docs/streams.md §4.12): moto as the table's
//! emulator and S3, the export fake (`tests/fake_export`) in front of it answering the export
//! calls in AWS's layout and trimming the stream (`trim_stream_before`), so a mirror's stored
//! position falls behind the stream's trim horizon as it does after a day-long outage.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
mod fake_export;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use serde_json::Value;

use common::keyed::{self, Destination, Target};
use common::{Emulator, Pipeline, Running, stderr};
use fake_export::{FakeExport, create_bucket, now_ms};

const BUCKET: &str = "exports";

fn put(running: &Running, pk: &str, v: i64) {
    running.put_pk("orders", pk, &v.to_string());
}

fn delete(running: &Running, pk: &str) {
    running.delete_pk("orders", pk);
}

fn table_items(running: &Running) -> BTreeMap<String, Value> {
    keyed::table_items(&running.endpoint, "orders")
}

fn mirrored(destination: &Destination) -> BTreeMap<String, Value> {
    destination.items("orders")
}

/// moto with table `orders` (NEW_AND_OLD_IMAGES) holding 40 items, the bucket, the export fake
/// in front, and a mirror pipeline through the fake into `target` with `source_extra`.
fn setup(target: Target, source_extra: &str) -> (Running, FakeExport, Pipeline, Destination) {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..40 {
        put(&running, &format!("k{i:02}"), 0);
    }
    create_bucket(&running.endpoint, BUCKET);
    let fake = FakeExport::start(&running.endpoint, &running.endpoint);
    // Backups reach back an hour: the shortest incremental export (15 min) fits.
    fake.set_earliest_restorable_ms(Some(now_ms() - 3_600_000));
    let source = format!(
        "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2\nbatch_size: 7\non_gap: repair\n{source_extra}"
    );
    let pipeline = Pipeline::new("orders-mirror", &fake.url(), &source);
    let destination = Destination::new(target, pipeline.dir.path());
    pipeline.write_with_sink(
        "orders-mirror",
        &fake.url(),
        &source,
        &destination.sink_yaml(),
    );
    (running, fake, pipeline, destination)
}

/// Changes the stream then loses: updates, inserts, deletes and an item created and deleted
/// inside the gap; then the trim point, then one change the stream keeps.
fn changes_lost_in_a_gap(running: &Running, fake: &FakeExport) {
    std::thread::sleep(Duration::from_millis(1100));
    for i in 0..10 {
        put(running, &format!("k{i:02}"), 1);
    }
    for i in 10..15 {
        delete(running, &format!("k{i:02}"));
    }
    for i in 40..45 {
        put(running, &format!("k{i:02}"), 1);
    }
    put(running, "ghost", 1);
    delete(running, "ghost");
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(now_ms());
    std::thread::sleep(Duration::from_millis(1100));
    put(running, "k20", 2);
}

/// The scenario: a mirror whose stored position was trimmed repairs the gap from an
/// incremental export, makes no Scan request, and ends equal to the table; a change after the
/// repair still streams in.
fn a_gap_repaired_by_an_incremental_export_makes_no_scan_and_ends_equal_to_the_table(
    target: Target,
) {
    let (running, fake, pipeline, destination) =
        setup(target, "snapshot: {engine: export, s3_bucket: exports}");
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(mirrored(&destination), table_items(&running));

    changes_lost_in_a_gap(&running, &fake);
    let output = pipeline.ddbpipe(&["run"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(err.contains("Gap detected at start-up"), "{err}");
    assert!(err.contains("Repair"), "{err}");
    let table = table_items(&running);
    let rows = mirrored(&destination);
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        table.keys().collect::<Vec<_>>()
    );
    assert!(rows == table, "the destination differs from the table");
    assert!(!rows.contains_key("ghost") && !rows.contains_key("k10"));
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request");
    assert_eq!(
        fake.exports_started(),
        2,
        "the full export and one incremental"
    );
    let state = destination.state("orders-mirror");
    assert!(
        state["meta"].0["position"].get("repair").is_none(),
        "the repair is closed: {state:?}"
    );

    // The stream goes on from the capture after the repair.
    put(&running, "later", 3);
    delete(&running, "k00");
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(mirrored(&destination) == table_items(&running));
    assert_eq!(fake.exports_started(), 2, "no further export");
}

#[test]
fn a_gap_repaired_by_an_incremental_export_makes_no_scan_and_ends_equal_to_the_table_in_sqlite() {
    a_gap_repaired_by_an_incremental_export_makes_no_scan_and_ends_equal_to_the_table(
        Target::Sqlite,
    );
}

#[test]
fn a_gap_repaired_by_an_incremental_export_makes_no_scan_and_ends_equal_to_the_table_in_postgres() {
    a_gap_repaired_by_an_incremental_export_makes_no_scan_and_ends_equal_to_the_table(
        Target::Postgres,
    );
}

/// Without point-in-time recovery a repair cannot export: the run says why in one line and
/// resnapshots with the configured engine (a Scan here), ending equal to the table; `check`
/// warns beforehand.
#[test]
fn without_point_in_time_recovery_a_repair_falls_back_to_a_resnapshot_and_says_why() {
    let (running, fake, pipeline, destination) = setup(
        Target::Sqlite,
        "snapshot: {s3_bucket: exports}\nresnapshot_deletes: true",
    );
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    changes_lost_in_a_gap(&running, &fake);
    fake.set_pitr(false);
    let check = pipeline.ddbpipe(&["check"]);
    let report = format!("{}{}", common::stdout(&check), stderr(&check));
    assert!(
        report.contains("on_gap: repair would resnapshot"),
        "{report}"
    );
    let scans_before = fake.forwarded("Scan");
    let output = pipeline.ddbpipe(&["run"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains("cannot be repaired by incremental exports: point-in-time recovery is off"),
        "{err}"
    );
    assert!(fake.forwarded("Scan") > scans_before, "a resnapshot scans");
    assert_eq!(fake.exports_started(), 0);
    assert!(mirrored(&destination) == table_items(&running));
}

/// A gap found minutes after the snapshot is not repaired (docs/streams.md §4.12): the window,
/// 15 min at least, reaches back over the snapshot's rows (here every row is one: the stream
/// had trimmed the table's first writes before the first run), and an item the snapshot read
/// that the gap deleted has no line in the export (created and deleted inside the window),
/// which the window's close cannot sweep (it deletes only rows a stream change wrote). The run
/// says why, snapshots the table again, and ends equal to the table; repaired, the rows of the
/// items deleted in the gap stayed.
#[test]
fn a_gap_soon_after_a_snapshot_is_mended_by_a_new_snapshot_not_a_repair() {
    let (running, fake, pipeline, destination) =
        setup(Target::Sqlite, "snapshot: {s3_bucket: exports}");
    // The table's first writes never reach the stream reader: its rows are the snapshot's,
    // but one, which the stream positions its shard with (a shard with nothing read cannot be
    // trimmed unnoticed but after 24 h).
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(now_ms());
    put(&running, "k39", 1);
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(mirrored(&destination) == table_items(&running));

    changes_lost_in_a_gap(&running, &fake);
    let output = pipeline.ddbpipe(&["run"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains("cannot be repaired by incremental exports")
            && err.contains("written by a snapshot or a repair"),
        "{err}"
    );
    assert_eq!(fake.exports_started(), 0, "no incremental export");
    let rows = mirrored(&destination);
    assert!(!rows.contains_key("k10"), "the item deleted in the gap");
    assert!(
        rows == table_items(&running),
        "the destination differs from the table"
    );
}

/// Into `jsonl` (streams mode) a repair writes the gap's changes as change envelopes: no
/// sequence number or shard, the exact write time, `c`/`u`/`d` by the images over the whole
/// window; no Scan was made.
#[test]
fn into_jsonl_a_repair_writes_the_gap_as_change_envelopes() {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    put(&running, "k00", 0);
    put(&running, "k01", 0);
    create_bucket(&running.endpoint, BUCKET);
    let fake = FakeExport::start(&running.endpoint, &running.endpoint);
    fake.set_earliest_restorable_ms(Some(now_ms() - 3_600_000));
    let pipeline = Pipeline::new(
        "orders-cdc",
        &fake.url(),
        "table_name: orders\nmode: streams\nidle_termination_secs: 2\non_gap: repair\nresnapshot_deletes: false\nsnapshot: {s3_bucket: exports}",
    );
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let first = pipeline.records().len();
    assert_eq!(first, 2, "the two inserts");

    std::thread::sleep(Duration::from_millis(1100));
    put(&running, "k00", 1);
    delete(&running, "k01");
    put(&running, "k02", 1);
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(now_ms());
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let repaired: Vec<Value> = pipeline.records().into_iter().skip(first).collect();
    let op_of = |pk: &str| {
        repaired
            .iter()
            .find(|e| e["key"]["pk"] == pk)
            .unwrap_or_else(|| panic!("a change of {pk}: {repaired:?}"))
            .clone()
    };
    // The shortest window (15 min) reaches back before k00 was created: inside the window it
    // is an insert, with its last image.
    assert_eq!(op_of("k00")["op"], "c");
    assert_eq!(op_of("k00")["after"]["v"], 1);
    assert_eq!(op_of("k02")["op"], "c");
    // k01 was created and deleted inside the window: an incremental export has no line for
    // it, so a jsonl consumer hears of no delete (documented; a keyed sink sweeps its row).
    assert!(
        repaired.iter().all(|e| e["key"]["pk"] != "k01"),
        "{repaired:?}"
    );
    for envelope in &repaired {
        assert!(envelope["sequence_number"].is_null(), "{envelope}");
        assert!(envelope["shard_id"].is_null(), "{envelope}");
        assert!(envelope["ts_ms"].as_i64().is_some(), "{envelope}");
    }
    assert_eq!(fake.forwarded("Scan"), 0);
    assert_eq!(fake.exports_started(), 1);
}

/// A repair killed while its incremental export runs stays open: `check` fails it when the
/// bucket is gone from the config, and a run with the bucket back finishes it through the same
/// export whatever `on_gap` says now, with no Scan request.
#[test]
fn an_open_repair_is_finished_by_the_next_run_and_check_names_what_it_needs() {
    let (running, fake, pipeline, destination) = setup(
        Target::Sqlite,
        "snapshot: {engine: export, s3_bucket: exports}",
    );
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    changes_lost_in_a_gap(&running, &fake);
    // IN_PROGRESS for its first 4 describes (2 s apart, doubling): about 14 s, killed sooner.
    fake.set_in_progress_describes(4);
    let mut child = common::spawn_run(&pipeline.config);
    assert!(
        common::wait_for(Duration::from_secs(60), || fake.exports_started() >= 2),
        "the repair started its incremental export"
    );
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let state = destination.state("orders-mirror");
    assert!(
        state["meta"].0["position"].get("repair").is_some(),
        "the repair is open: {state:?}"
    );

    let source = "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2\nbatch_size: 7";
    pipeline.write_with_sink(
        "orders-mirror",
        &fake.url(),
        source,
        &destination.sink_yaml(),
    );
    let check = pipeline.ddbpipe(&["check"]);
    let report = format!("{}{}", common::stdout(&check), stderr(&check));
    assert_ne!(check.status.code(), Some(0), "{report}");
    assert!(
        report.contains("holds an open repair") && report.contains("source.snapshot.s3_bucket"),
        "{report}"
    );

    let source = format!("{source}\nsnapshot: {{engine: export, s3_bucket: exports}}");
    pipeline.write_with_sink(
        "orders-mirror",
        &fake.url(),
        &source,
        &destination.sink_yaml(),
    );
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(mirrored(&destination) == table_items(&running));
    assert_eq!(fake.exports_started(), 2, "the same incremental export");
    assert_eq!(fake.forwarded("Scan"), 0);
}

/// Issue #24 items 6 and 7: a repair whose incremental export is damaged (its file's MD5
/// stale) writes nothing of it, abandons it once for a new export of the same window, and
/// ends equal to the table.
#[test]
fn a_repair_whose_export_is_damaged_replaces_it_and_ends_equal_to_the_table() {
    let (running, fake, pipeline, destination) = setup(
        Target::Sqlite,
        "snapshot: {engine: export, s3_bucket: exports}",
    );
    let output = pipeline.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    changes_lost_in_a_gap(&running, &fake);
    fake.set_data_files(1);
    fake.damage_next_export();
    let output = pipeline.ddbpipe(&["run"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(err.contains("its MD5 is"), "{err}");
    assert!(
        err.contains("abandoning it and requesting a new export"),
        "{err}"
    );
    assert_eq!(
        fake.exports_started(),
        3,
        "the full export, the damaged incremental one and its replacement"
    );
    assert!(
        mirrored(&destination) == table_items(&running),
        "the destination differs from the table"
    );
}
