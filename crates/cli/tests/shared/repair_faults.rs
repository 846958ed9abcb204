//! A shared repair's faults end to end (docs/coordination.md §11.12 rule 9, its last item): a
//! damaged incremental export, and a repair left open in the record for workers started with
//! `on_gap: fail`. On moto behind the export fake, into SQLite, after the gap of
//! [`repairable_gap`].

use std::path::{Path, PathBuf};

use super::common::{self, stderr};
use super::{
    GapSetup, mirror_until_closed_and_equal, repairable_gap, snapshot_record, stop_once,
    two_workers_past,
};

/// A copy of pipeline file `config` named `name` beside it, each `(from, to)` replaced.
fn variant(config: &Path, name: &str, replaced: &[(&str, &str)]) -> PathBuf {
    let mut yaml = std::fs::read_to_string(config).unwrap();
    for (from, to) in replaced {
        assert!(yaml.contains(from), "{from:?} in {yaml}");
        yaml = yaml.replace(from, to);
    }
    let path = config.with_file_name(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

/// "A damaged incremental export is rule 8's damaged export: a full snapshot replaces the
/// repair, once." Two workers with `on_gap: repair` meet the gap and open its repair
/// (generation 1), whose one incremental export file is stored with a value changed after its
/// MD5 was taken. The repair is not retried with another incremental export: a full snapshot
/// (a Scan, generation 2) replaces it, its record naming the damage, and the destination ends
/// equal to the table. (Its "once" is the full export's: a snapshot that replaced a damaged
/// export and meets another stops the worker, `shared::a_damaged_shared_export_is_replaced_once_…`;
/// here the replacing snapshot is a Scan, which reads no export.)
#[test]
fn a_damaged_incremental_export_replaces_the_shared_repair_by_a_full_snapshot() {
    let (gap, first, scans) = repairable_gap();
    let GapSetup {
        running,
        fake,
        destination,
        config,
        ..
    } = &gap;
    fake.set_data_files(1);
    fake.damage_next_export();
    let table = || common::keyed::table_items(&running.endpoint, "items");

    let (converged, (), said) = two_workers_past(config, destination, &first, &table, || ());
    let replaced = snapshot_record(destination);
    assert!(
        converged,
        "the snapshot in the repair's place mirrors the table: {replaced}; {said:#?}"
    );
    assert_eq!(
        replaced["generation"], 2,
        "the repair (1), then the snapshot that replaced it (2): {replaced}"
    );
    assert!(
        replaced["repair"].is_null() && replaced["export"].is_null(),
        "a full snapshot, no repair: {replaced}"
    );
    let why = replaced["replaced"].as_str().unwrap_or_default();
    assert!(
        why.contains("damaged export") && why.contains("its MD5 is"),
        "{why}"
    );
    assert_eq!(
        fake.exports_started(),
        1,
        "the damaged incremental export, and no other in its place: {said:#?}"
    );
    assert!(
        fake.forwarded("Scan") > scans,
        "the full snapshot scans the table: {said:#?}"
    );
}

/// "A repair left open in the record is finished by workers started with `on_gap: fail` too,
/// as long as they have the bucket; without it they stop, naming it." A worker with
/// `on_gap: repair` opens the gap's repair and is stopped while it awaits the incremental
/// export, the repair open in the record. A worker with `on_gap: fail` and no bucket exits 1
/// naming the open repair, the record as it was; one with `on_gap: fail` and the bucket
/// awaits the export the record names, applies and closes the repair (no Scan, no other
/// export), and the destination ends equal to the table.
#[test]
fn a_repair_left_open_is_finished_with_on_gap_fail_and_the_bucket_and_named_without_it() {
    let (gap, first, scans) = repairable_gap();
    let GapSetup {
        running,
        fake,
        destination,
        config,
        ..
    } = &gap;
    // The incremental export answers IN_PROGRESS to its first three describes.
    fake.set_in_progress_describes(3);
    let described = fake.describe_calls();
    stop_once(config, "awaits the repair's export", "repair", || {
        fake.describe_calls() > described
    });
    let open = snapshot_record(destination);
    assert!(
        open["id"] != first
            && open["repair"].is_object()
            && open["export"].is_string()
            && open["closed"].is_null(),
        "the repair is left open, its export stored: {open}"
    );

    let failing = variant(config, "fail.yaml", &[("on_gap: repair", "on_gap: fail")]);
    let bare = variant(
        &failing,
        "bare.yaml",
        &[("  snapshot: {s3_bucket: exports}\n", "")],
    );
    let output = common::ddbpipe(&["run", "--progress", "never"], &bare);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("holds an open repair")
            && text.contains("no export bucket")
            && text.contains("source.snapshot.s3_bucket"),
        "{text}"
    );
    assert_eq!(
        snapshot_record(destination),
        open,
        "the worker without the bucket leaves the repair as it was"
    );

    let table = common::keyed::table_items(&running.endpoint, "items");
    mirror_until_closed_and_equal(&failing, destination, &table);
    let finished = snapshot_record(destination);
    assert!(
        finished["id"] == open["id"]
            && finished["repair"] == open["repair"]
            && finished["export"] == open["export"],
        "the open repair is finished, not replaced: {finished}"
    );
    assert_eq!(
        fake.exports_started(),
        1,
        "the export the record names is read"
    );
    assert_eq!(fake.forwarded("Scan"), scans, "no Scan for the repair");
}
