//! Driven batches (`ddbpipe::Pipeline::batches`, docs/state.md §6.9) through the modes that
//! read an export: a scan whose snapshot is an export (`snapshot.engine: export`) and a
//! mirror's repair (`on_gap: repair`), against moto behind the export fake
//! (`tests/fake_export`).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
mod fake_export;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use common::drive::{CUSTOM, drive_shuffled, keys, next_batch, started};
use common::{Emulator, Pipeline, Running, rt};
use ddbpipe::{Cancel, Ended};
use fake_export::{FakeExport, create_bucket, now_ms};

const ITEMS: usize = 40;

/// moto with table `orders` (NEW_AND_OLD_IMAGES) holding `k00`…`k39`, the bucket `exports`,
/// and the export fake in front of it writing each export as four data files.
fn exporting() -> (Running, FakeExport) {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..ITEMS {
        running.put_pk("orders", &format!("k{i:02}"), "0");
    }
    create_bucket(&running.endpoint, "exports");
    let fake = FakeExport::start(&running.endpoint, &running.endpoint);
    fake.set_data_files(4);
    (running, fake)
}

/// A scan of `orders` through an export, five records a batch, into the caller's loop.
fn export_scan(fake: &FakeExport) -> Pipeline {
    let files = Pipeline::new("orders", &fake.url(), "");
    files.write_with_sink(
        "orders",
        &fake.url(),
        "table_name: orders\nbatch_size: 5\nsnapshot: {engine: export, s3_bucket: exports}",
        CUSTOM,
    );
    files
}

fn all_keys() -> BTreeSet<String> {
    (0..ITEMS).map(|i| format!("k{i:02}")).collect()
}

#[test]
fn an_export_snapshot_driven_in_random_order_hands_out_every_item_once_and_clears_its_position() {
    let (_running, fake) = exporting();
    let files = export_scan(&fake);
    let (summary, got) = drive_shuffled(&files, 4, 25);
    assert_eq!(summary.ended(), Ended::Complete, "{summary}");
    assert_eq!(got.len(), ITEMS, "each item once: {got:?}");
    let got: BTreeSet<String> = got.into_iter().collect();
    assert_eq!(got, all_keys());
    let entry = files.entry("orders").expect("an entry");
    assert!(
        entry["position"].is_null(),
        "the position is cleared: {entry}"
    );
    assert_eq!(entry["last_completed"]["items"], ITEMS, "{entry}");
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request");
}

#[test]
fn an_export_snapshot_stopped_with_a_batch_held_resumes_from_the_same_export_without_losing_it() {
    let (_running, fake) = exporting();
    let files = export_scan(&fake);
    let (handle, stop) = Cancel::new();
    let (summary, held_keys, acked) = rt().block_on(async {
        let mut batches = started(&files, 16, stop).await;
        // The first batch is held; every later one is acknowledged, four at a time, each four
        // the last first.
        let held = next_batch(&mut batches).await;
        let mut acked = Vec::new();
        let mut four = Vec::new();
        while let Some(batch) = batches.next().await {
            four.push(batch.expect("no failure"));
            if four.len() == 4 {
                while let Some(batch) = four.pop() {
                    acked.extend(keys(&batch));
                    batch.ack();
                }
            }
        }
        while let Some(batch) = four.pop() {
            acked.extend(keys(&batch));
            batch.ack();
        }
        // Every file was read: the snapshot's end waits for the held batch when the run stops.
        handle.cancel();
        let summary = batches.finish().await.unwrap_or_else(|e| panic!("{e}"));
        (summary, keys(&held), acked)
    });
    assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
    let entry = files.entry("orders").expect("an entry");
    assert!(
        !entry["position"].is_null() && entry["last_completed"].is_null(),
        "the snapshot is open, not complete: {entry}"
    );

    let (summary, second) = drive_shuffled(&files, 3, 7);
    assert_eq!(summary.ended(), Ended::Complete, "{summary}");
    let second_keys: BTreeSet<String> = second.iter().cloned().collect();
    for key in &held_keys {
        assert!(
            second_keys.contains(key),
            "the held batch's items are handed out again: {key} missing from {second:?}"
        );
    }
    assert!(
        second.len() < ITEMS,
        "the files the held batch does not hold committed what was acknowledged: {second:?}"
    );
    let mut every: BTreeSet<String> = acked.into_iter().collect();
    every.extend(second_keys);
    assert_eq!(every, all_keys(), "nothing is lost");
    assert_eq!(
        fake.exports_started(),
        1,
        "the rerun reads the export the position names"
    );
    assert!(files.entry("orders").expect("an entry")["position"].is_null());
}

/// A mirror through an export with `on_gap: repair`, three records a batch, into the caller's
/// loop; backups reach back an hour (the shortest incremental export fits).
fn repairing_mirror(fake: &FakeExport) -> Pipeline {
    fake.set_earliest_restorable_ms(Some(now_ms() - 3_600_000));
    let source = "table_name: orders\nmode: mirror\nidle_termination_secs: 2\nbatch_size: 3\n\
                  on_gap: repair\nresnapshot_deletes: false\nsnapshot: {engine: export, s3_bucket: exports}";
    let files = Pipeline::new("mirror", &fake.url(), "");
    files.write_with_sink("mirror", &fake.url(), source, CUSTOM);
    files
}

/// The keys a driven run hands out with every batch acknowledged in order, and its summary.
fn drive_all(files: &Pipeline) -> (ddbpipe::Summary, Vec<String>) {
    drive_shuffled(files, 1, 0)
}

/// Whether the stored position holds a repair whose windows are not all applied
/// (docs/state.md §6.3: `applied` once every window was).
fn repair_window_open(files: &Pipeline) -> bool {
    let entry = files.entry("mirror").expect("an entry");
    let repair = &entry["position"]["repair"];
    repair.is_object() && repair["applied"] != true
}

#[test]
fn a_repair_driven_out_of_order_closes_only_after_its_last_batch_is_acknowledged() {
    let (running, fake) = exporting();
    let files = repairing_mirror(&fake);
    let (summary, first) = drive_all(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    // The snapshot, then the stream from the capture on (moto's holds the writes before it).
    assert_eq!(first.into_iter().collect::<BTreeSet<_>>(), all_keys());

    // Changes the stream then loses: its position falls behind the trim horizon.
    std::thread::sleep(Duration::from_millis(1100));
    for i in 0..10 {
        running.put_pk("orders", &format!("k{i:02}"), "1");
    }
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(now_ms());
    std::thread::sleep(Duration::from_millis(1100));

    // The repair's window reaches back before the table was filled: every item is a change
    // of it (no sequence number: not read from the stream).
    let (handle, stop) = Cancel::new();
    let (summary, held_keys, acked) = rt().block_on(async {
        let mut batches = started(&files, 16, stop).await;
        let held = next_batch(&mut batches).await;
        let mut handed = held.len();
        let mut acked = Vec::new();
        let mut later = Vec::new();
        while handed < ITEMS {
            let batch = next_batch(&mut batches).await;
            assert!(
                batch
                    .records()
                    .iter()
                    .all(|r| r.sequence_number().is_none()),
                "only the repair's records before its close"
            );
            handed += batch.len();
            acked.extend(keys(&batch));
            later.push(batch);
        }
        // Acknowledged the last first: every repair batch but the first.
        while let Some(batch) = later.pop() {
            batch.ack();
        }
        handle.cancel();
        // What comes after the stop is dropped (a failure is `finish`'s too).
        while batches.next().await.is_some() {}
        (batches.finish().await, keys(&held), acked)
    });
    assert!(
        repair_window_open(&files),
        "a repair batch is held: its window stays open {}",
        files.entry("mirror").unwrap_or_default()
    );
    let summary = summary.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::RepairStopped, "{summary}");

    let (summary, third) = drive_all(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    let entry = files.entry("mirror").expect("an entry");
    assert!(
        entry["position"]["repair"].is_null(),
        "the repair is closed and the stream captured again: {entry}"
    );
    for key in &held_keys {
        assert!(third.contains(key), "{key} is handed out again: {third:?}");
    }
    assert!(
        third.len() < ITEMS,
        "the files the held batch does not hold committed what was acknowledged: {third:?}"
    );
    let mut every: BTreeSet<String> = acked.into_iter().collect();
    every.extend(third);
    assert_eq!(every, all_keys(), "nothing of the repair is lost");
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request");
    assert_eq!(
        fake.exports_started(),
        2,
        "the full export and one incremental, resumed by the rerun"
    );
}
