//! `source.snapshot.engine: export` end to end through the CLI (docs/scan.md §2.10): moto as
//! the table's emulator and S3, the export fake (`tests/fake_export`) in front of it answering
//! the export calls in AWS's documented layout, and counting the Scan requests ddbpipe made.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
mod fake_export;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, StreamViewType};
use serde_json::Value;

use common::keyed::{self, Destination, Target};
use common::{Emulator, Pipeline, Running, item, n, s, stderr};
use fake_export::{FakeExport, create_bucket, list_keys, read_object};

const BUCKET: &str = "exports";
const EXPORT: &str = "snapshot: {engine: export, s3_bucket: exports}";

/// moto with table `orders` (NEW_AND_OLD_IMAGES stream) holding `n` items, the bucket, and the
/// export fake in front of it.
fn setup(items: usize) -> (Running, FakeExport) {
    let running = Emulator::Moto.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seeded = vec![item(vec![
        ("pk", s("k0000")),
        ("big", n("12345678901234567890123.000000000000001")),
        ("bin", AttributeValue::B(Blob::new(vec![0, 255]))),
        ("set", AttributeValue::Ss(vec!["b".into(), "a".into()])),
        (
            "map",
            AttributeValue::M(
                [("z".to_string(), AttributeValue::Null(true))]
                    .into_iter()
                    .collect(),
            ),
        ),
    ])];
    for i in 1..items {
        seeded.push(item(vec![
            ("pk", s(&format!("k{i:04}"))),
            ("n", n(&i.to_string())),
        ]));
    }
    running.put_items("orders", seeded);
    create_bucket(&running.endpoint, BUCKET);
    let fake = FakeExport::start(&running.endpoint, &running.endpoint);
    (running, fake)
}

fn sorted_lines(pipeline: &Pipeline) -> Vec<String> {
    let mut lines = pipeline.lines();
    lines.sort();
    lines
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

/// The export engine writes the lines a Scan writes, in both value formats, and makes no Scan
/// request; the completed run clears its position.
#[test]
fn a_scan_through_an_export_writes_the_lines_a_scan_writes() {
    let (running, fake) = setup(120);
    fake.set_data_files(4);
    for format in ["plain", "typed"] {
        let scanned = Pipeline::new(
            "by-scan",
            &running.endpoint,
            &format!("table_name: orders\nvalue_format: {format}"),
        );
        let output = run(&scanned);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let exported = Pipeline::new(
            "by-export",
            &fake.url(),
            &format!("table_name: orders\nvalue_format: {format}\n{EXPORT}"),
        );
        let output = run(&exported);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(sorted_lines(&exported), sorted_lines(&scanned), "{format}");
        assert_eq!(sorted_lines(&exported).len(), 120);
        let entry = exported.entry("by-export").unwrap();
        assert_eq!(entry["position"], Value::Null, "{entry}");
        assert_eq!(entry["last_completed"]["items"], 120);
    }
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request went through");
    assert_eq!(fake.exports_started(), 2, "each run exports afresh");
}

/// `s3_endpoint_url` sends S3 to its own endpoint (here moto's, beside a dynoxide table): the
/// files are read there, and no S3 request reaches the DynamoDB endpoint.
#[test]
fn the_bucket_is_read_at_its_own_endpoint_when_one_is_set() {
    let db = Emulator::Dynoxide.start();
    db.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let items: Vec<_> = (0..40)
        .map(|i| {
            item(vec![
                ("pk", s(&format!("k{i:02}"))),
                ("n", n(&i.to_string())),
            ])
        })
        .collect();
    db.put_items("orders", items);
    let s3 = Emulator::Moto.start();
    create_bucket(&s3.endpoint, BUCKET);
    let fake = FakeExport::start(&db.endpoint, &s3.endpoint);
    let pipeline = Pipeline::new(
        "own-endpoint",
        &fake.url(),
        &format!(
            "table_name: orders\nsnapshot: {{engine: export, s3_bucket: exports, s3_endpoint_url: '{}'}}",
            s3.endpoint
        ),
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(pipeline.lines().len(), 40);
    assert_eq!(fake.forwarded("Scan"), 0);
    assert!(
        fake.forwarded_requests().iter().all(|r| r.target.is_some()),
        "an S3 request went to the DynamoDB endpoint"
    );
}

/// An export still IN_PROGRESS when the run is killed is waited on by the next run: its ARN
/// was committed before the first wait, so no second export is paid for.
#[test]
fn an_export_in_progress_across_a_restart_is_not_started_again() {
    let (running, fake) = setup(30);
    let _ = &running;
    fake.set_in_progress_describes(3);
    let pipeline = Pipeline::new(
        "restart",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let mut child = common::spawn_run(&pipeline.config);
    assert!(
        common::wait_for(Duration::from_secs(30), || fake.describe_calls() >= 1),
        "the run asked about its export"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let entry = pipeline.entry("restart").unwrap();
    let arn = entry["position"]["export_arn"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(entry["position"]["kind"], "export");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(fake.exports_started(), 1, "the same export was read");
    assert_eq!(fake.export_arns(), vec![arn]);
    assert_eq!(pipeline.lines().len(), 30);
}

/// A stop (SIGTERM) while the run waits for its export: the run drains and exits 0, its
/// position keeps the export, and the next run reads that export (docs/cli.md §8.5).
#[test]
fn a_stop_while_the_export_is_awaited_exits_0_and_the_next_run_reads_the_same_export() {
    let (_running, fake) = setup(30);
    fake.set_in_progress_describes(3);
    let pipeline = Pipeline::new(
        "stopped",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let child = common::spawn_run(&pipeline.config);
    assert!(
        common::wait_for(Duration::from_secs(30), || fake.describe_calls() >= 1),
        "the run asked about its export"
    );
    common::signal(&child, "TERM");
    let output = common::finished(child);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(fake.exports_started(), 1, "the same export was read");
    assert_eq!(pipeline.lines().len(), 30);
}

/// The data files of the one export under `prefix`, in manifest order: each file's S3 key and
/// item count.
fn data_files(running: &Running, prefix: &str) -> Vec<(String, u64)> {
    let manifests: Vec<String> = list_keys(&running.endpoint, BUCKET, prefix)
        .into_iter()
        .filter(|key| key.ends_with("/manifest-files.json"))
        .collect();
    assert_eq!(
        manifests.len(),
        1,
        "one export under {prefix}: {manifests:?}"
    );
    let listing = read_object(&running.endpoint, BUCKET, &manifests[0]).unwrap();
    String::from_utf8(listing)
        .unwrap()
        .lines()
        .map(|line| {
            let file: Value = serde_json::from_str(line).unwrap();
            let key = file["dataFileS3Key"].as_str().unwrap().to_string();
            (key, file["itemCount"].as_u64().unwrap())
        })
        .collect()
}

/// The files an export position marks done (its `done` ranges, inclusive).
fn files_done(position: &Value) -> BTreeSet<usize> {
    position["done"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|range| {
            let from = range[0].as_u64().unwrap() as usize;
            let to = range[1].as_u64().unwrap() as usize;
            from..=to
        })
        .collect()
}

/// The items an export position has committed: every item of the files done, and the cursor
/// (`{"lines": {"N": …}}`) of each file in progress.
fn items_committed(position: &Value, files: &[(String, u64)]) -> u64 {
    let done: u64 = files_done(position).iter().map(|&i| files[i].1).sum();
    let open: u64 = position["cursors"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, cursor)| {
            cursor["lines"]["N"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    done + open
}

/// The indices of the data files fetched (S3 `GET`s of their keys) among `requests`.
fn files_fetched(requests: &[fake_export::Forwarded], files: &[(String, u64)]) -> BTreeSet<usize> {
    requests
        .iter()
        .filter(|r| r.method == "GET")
        .filter_map(|r| {
            files
                .iter()
                .position(|(key, _)| r.path.contains(key.as_str()))
        })
        .collect()
}

/// Kills `child` with SIGKILL as soon as `reached` holds. Fails when the run ended first (the
/// test data is then too small for the kill point) or `reached` never held.
fn kill_when(child: &mut std::process::Child, mut reached: impl FnMut() -> bool) {
    let mut ended = None;
    let stopped = common::wait_for(Duration::from_secs(120), || {
        ended = child.try_wait().unwrap();
        ended.is_some() || reached()
    });
    if !stopped {
        let _ = child.kill();
        panic!("the first run never reached the kill point");
    }
    assert!(
        ended.is_none(),
        "the first run ended ({ended:?}) before it could be killed in the middle of the files: \
         give the test more items"
    );
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the first run ended ({status}) before the SIGKILL reached it: give the test more items"
    );
}

/// A scan through an export killed with SIGKILL while it reads the data files: the rerun reads
/// the same export (one `ExportTableToPointInTime`, no Scan), fetches only the files not yet done,
/// and the output holds every item; the only duplicates are the lines written after the last
/// commit (at least once, docs/sinks.md §7.1: they were never acknowledged, so they are read
/// again).
#[test]
fn sigkill_during_the_file_reads_resumes_without_a_second_export() {
    const ITEMS: usize = 4000;
    const FILES: usize = 8;
    let (running, fake) = setup(ITEMS);
    fake.set_data_files(FILES);
    let pipeline = Pipeline::new(
        "killed",
        &fake.url(),
        &format!("table_name: orders\nbatch_size: 10\nmax_concurrency: 1\n{EXPORT}"),
    );
    let mut child = common::spawn_run(&pipeline.config);
    // Two files done; whether the run is not yet through the rest is checked after the kill.
    kill_when(&mut child, || {
        pipeline
            .entry("killed")
            .is_some_and(|e| files_done(&e["position"]).len() >= 2)
    });
    let killed_at = fake.forwarded_requests().len();
    let position = pipeline.entry("killed").unwrap()["position"].clone();
    assert_eq!(position["kind"], "export", "{position}");
    let files = data_files(&running, "ddbpipe/killed/");
    assert_eq!(files.len(), FILES);
    assert!(
        files.iter().all(|(_, items)| *items > 0),
        "no file is empty"
    );
    let done = files_done(&position);
    assert!(
        done.len() < FILES,
        "the run was killed inside the files: {position}"
    );
    let committed = items_committed(&position, &files);
    // Complete lines only: a line cut off by the kill is cut off before the rerun appends.
    let written = std::fs::read(&pipeline.out)
        .unwrap()
        .iter()
        .filter(|&&b| b == b'\n')
        .count() as u64;
    assert!(
        committed <= written,
        "only written lines are committed ({committed} of {written})"
    );

    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(fake.exports_started(), 1, "the rerun read the same export");
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request went through");
    let rerun = files_fetched(&fake.forwarded_requests()[killed_at..], &files);
    let not_done: BTreeSet<usize> = (0..FILES).filter(|i| !done.contains(i)).collect();
    assert_eq!(
        rerun, not_done,
        "the rerun fetched exactly the files not done when the run was killed"
    );

    let scanned = Pipeline::new("by-scan", &running.endpoint, "table_name: orders");
    let output = run(&scanned);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table: BTreeSet<String> = scanned.lines().into_iter().collect();
    assert_eq!(table.len(), ITEMS);
    let lines = pipeline.lines();
    let distinct: BTreeSet<String> = lines.iter().cloned().collect();
    assert!(
        distinct == table,
        "the output holds other items than the table"
    );
    assert_eq!(
        lines.len() as u64,
        ITEMS as u64 + (written - committed),
        "the only duplicates are the {} lines written after the last commit",
        written - committed
    );
    assert_eq!(pipeline.entry("killed").unwrap()["position"], Value::Null);
}

/// The open snapshot's export progress as a keyed sink stores it (`done` in the `meta` part,
/// each file in progress a `segment:<i>` part), in the shape of a scan position.
fn snapshot_progress(destination: &Destination, pipeline: &str) -> Value {
    let parts = destination.state(pipeline);
    let Some((meta, _)) = parts.get("meta") else {
        return Value::Null;
    };
    let cursors: serde_json::Map<String, Value> = parts
        .iter()
        .filter_map(|(part, (value, _))| {
            let segment = part.strip_prefix("segment:")?;
            Some((segment.to_string(), value.clone()))
        })
        .collect();
    let snapshot = &meta["position"]["snapshot"];
    serde_json::json!({
        "done": snapshot["done"],
        "cursors": cursors,
        "export_arn": snapshot["export_arn"],
    })
}

/// A mirror whose snapshot reads an export, into SQLite, killed with SIGKILL while it reads the
/// data files: the rerun waits on no new export (one `ExportTableToPointInTime`, no Scan),
/// fetches only the files not yet done, hands on only the items after the committed cursors,
/// and the destination equals the table. (The first run also streams the table's inserts from
/// the stream's start beside the export; the kill waits for the export's files.)
#[test]
fn sigkill_during_a_mirrors_file_reads_resumes_without_a_second_export_in_sqlite() {
    const ITEMS: usize = 4000;
    const FILES: usize = 8;
    let (running, fake) = setup(ITEMS);
    fake.set_data_files(FILES);
    let source = format!(
        "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2\nbatch_size: 10\nmax_concurrency: 1\n{EXPORT}"
    );
    let pipeline = Pipeline::new("killed", &fake.url(), &source);
    let destination = Destination::new(Target::Sqlite, pipeline.dir.path());
    pipeline.write_with_sink("killed", &fake.url(), &source, &destination.sink_yaml());
    let mut child = common::spawn_run(&pipeline.config);
    kill_when(&mut child, || {
        files_done(&snapshot_progress(&destination, "killed")).len() >= 2
    });
    let killed_at = fake.forwarded_requests().len();
    let progress = snapshot_progress(&destination, "killed");
    assert!(progress["export_arn"].is_string(), "{progress}");
    let files = data_files(&running, "ddbpipe/killed/");
    assert_eq!(files.len(), FILES);
    assert!(
        files.iter().all(|(_, items)| *items > 0),
        "no file is empty"
    );
    let done = files_done(&progress);
    assert!(
        done.len() < FILES,
        "the run was killed inside the files: {progress}"
    );
    let committed = items_committed(&progress, &files);

    let output = run(&pipeline);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert_eq!(fake.exports_started(), 1, "the rerun read the same export");
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request went through");
    let rerun = files_fetched(&fake.forwarded_requests()[killed_at..], &files);
    let not_done: BTreeSet<usize> = (0..FILES).filter(|i| !done.contains(i)).collect();
    assert_eq!(
        rerun, not_done,
        "the rerun fetched exactly the files not done when the run was killed"
    );
    let handed_on = format!("snapshot_rows={} ", ITEMS as u64 - committed);
    assert!(
        text.contains(&handed_on),
        "the rerun handed on only the {} items after the committed cursors: {text}",
        ITEMS as u64 - committed
    );

    let table = table_items(&running);
    assert_eq!(table.len(), ITEMS);
    let mirrored = destination.items("orders");
    assert_eq!(mirrored.len(), ITEMS);
    assert!(mirrored == table, "the destination differs from the table");
}

/// A FAILED export fails the run naming it; the next run starts another and completes.
#[test]
fn a_failed_export_fails_the_run_and_the_next_run_exports_again() {
    let (_running, fake) = setup(10);
    fake.fail_next_export("S3AccessDenied", "Access denied writing to the bucket");
    let pipeline = Pipeline::new(
        "failing",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let output = run(&pipeline);
    assert_ne!(output.status.code(), Some(0));
    let text = stderr(&output);
    assert!(
        text.contains("FAILED (S3AccessDenied: Access denied writing to the bucket)"),
        "{text}"
    );
    assert!(pipeline.lines().is_empty(), "nothing was written");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(fake.exports_started(), 2);
    assert_eq!(pipeline.lines().len(), 10);
}

/// Point-in-time recovery off: `check` fails naming the fix, and `run` refuses the same way.
#[test]
fn without_point_in_time_recovery_check_and_run_name_the_fix() {
    let (_running, fake) = setup(3);
    fake.set_pitr(false);
    let pipeline = Pipeline::new(
        "no-pitr",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let output = pipeline.ddbpipe(&["check"]);
    assert_ne!(output.status.code(), Some(0));
    let text = common::stdout(&output);
    assert!(
        text.contains("FAIL point_in_time_recovery off for table 'orders'"),
        "{text}"
    );
    assert!(
        text.contains("aws dynamodb update-continuous-backups --table-name orders"),
        "{text}"
    );
    let output = run(&pipeline);
    assert_ne!(output.status.code(), Some(0));
    let text = stderr(&output);
    assert!(
        text.contains("PointInTimeRecoveryUnavailableException"),
        "{text}"
    );
    assert!(
        text.contains("update-continuous-backups --table-name orders "),
        "{text}"
    );
    assert!(
        pipeline
            .entry("no-pitr")
            .is_none_or(|e| e["position"].is_null())
    );
    fake.set_pitr(true);
    let output = pipeline.ddbpipe(&["check"]);
    let text = common::stdout(&output);
    assert!(
        text.contains("PASS point_in_time_recovery enabled"),
        "{text}"
    );
}

/// docs/cli.md §8.2: `check` asks the bucket before a run would start an export into it.
#[test]
fn check_names_a_missing_export_bucket_and_passes_an_existing_one() {
    let (_running, fake) = setup(1);
    let missing = Pipeline::new(
        "no-bucket",
        &fake.url(),
        "table_name: orders\nsnapshot: {engine: export, s3_bucket: nowhere}",
    );
    let output = missing.ddbpipe(&["check"]);
    assert_ne!(output.status.code(), Some(0));
    let text = common::stdout(&output);
    assert_eq!(
        probe(&text, "FAIL").as_deref(),
        Some("'nowhere' does not exist: create the bucket, or fix source.snapshot.s3_bucket"),
        "{text}"
    );
    let present = Pipeline::new(
        "bucket",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let output = present.ddbpipe(&["check"]);
    let text = common::stdout(&output);
    assert_eq!(
        probe(&text, "PASS").as_deref(),
        Some("'exports' can be read"),
        "{text}"
    );
}

/// Issue #24 item 8: a bucket the credentials may not read was a warning in `check` and a
/// failure in `run`. Both fail now, naming the bucket and the rights.
#[test]
fn check_and_run_fail_alike_on_a_bucket_the_credentials_may_not_read() {
    let (_running, fake) = setup(3);
    fake.deny_bucket(BUCKET);
    let pipeline = Pipeline::new(
        "denied",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let output = pipeline.ddbpipe(&["check"]);
    let text = common::stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let detail = probe(&text, "FAIL").unwrap_or_else(|| panic!("no failed s3_bucket: {text}"));
    for want in [
        "GetObject s3://exports/ddbpipe/denied/ddbpipe-check-probe was denied (AccessDenied)",
        "s3:GetObject, s3:PutObject and s3:ListBucket",
    ] {
        assert!(detail.contains(want), "no {want:?} in {detail}");
    }
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    for want in ["AccessDenied", "s3:ListBucket"] {
        assert!(text.contains(want), "no {want:?} in {text}");
    }
    assert!(pipeline.lines().is_empty(), "nothing was written");
}

/// The detail of `check`'s `s3_bucket` line with `status`, its padding dropped.
fn probe(text: &str, status: &str) -> Option<String> {
    text.lines()
        .find(|line| line.starts_with(&format!("{status} s3_bucket ")))
        .map(|line| {
            line.split_whitespace()
                .skip(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
}

/// Config rule 13: what an export has not is refused naming the field.
#[test]
fn the_export_engine_refuses_a_filter_naming_the_field() {
    let pipeline = Pipeline::new(
        "refused",
        "http://127.0.0.1:9",
        &format!(
            "table_name: orders\nfilter_expression: a = :a\nexpression_attribute_values: {{':a': 1}}\n{EXPORT}"
        ),
    );
    let output = pipeline.ddbpipe(&["check"]);
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains(
            "source.filter_expression: filter_expression does not apply to snapshot.engine: export"
        ),
        "{text}"
    );
}

fn put(running: &Running, pk: &str, v: i64) {
    running.put_pk("orders", pk, &v.to_string());
}

fn delete(running: &Running, pk: &str) {
    running.delete_pk("orders", pk);
}

fn table_items(running: &Running) -> BTreeMap<String, Value> {
    keyed::table_items(&running.endpoint, "orders")
}

/// A mirror whose snapshot is an export, under a concurrent writer, ends equal to the table and
/// made no Scan request.
fn a_mirror_via_an_export_under_writes_equals_the_table(target: Target) {
    let (running, fake) = setup(300);
    let running = Arc::new(running);
    fake.set_in_progress_describes(2);
    let source = format!(
        "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 3\nbatch_size: 50\n{EXPORT}"
    );
    let pipeline = Pipeline::new("orders-mirror", &fake.url(), &source);
    let destination = Destination::new(target, pipeline.dir.path());
    pipeline.write_with_sink(
        "orders-mirror",
        &fake.url(),
        &source,
        &destination.sink_yaml(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let running = Arc::clone(&running);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut writes = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{:04}", (writes * 37) % 400);
                if writes % 5 == 4 {
                    delete(&running, &key);
                } else {
                    put(&running, &key, writes);
                }
                writes += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            writes
        })
    };
    let child = common::spawn_run(&pipeline.config);
    assert!(
        common::wait_for(Duration::from_secs(60), || fake.exports_started() >= 1),
        "the mirror started an export"
    );
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(
        writes > 20,
        "the writer wrote while the export ran ({writes})"
    );
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = table_items(&running);
    let mirrored = destination.items("orders");
    assert_eq!(mirrored.len(), table.len());
    assert!(mirrored == table, "the destination differs from the table");
    assert_eq!(fake.forwarded("Scan"), 0, "the mirror made no Scan request");
    assert_eq!(fake.exports_started(), 1);
}

#[test]
fn a_mirror_via_an_export_under_writes_equals_the_table_in_sqlite() {
    a_mirror_via_an_export_under_writes_equals_the_table(Target::Sqlite);
}

#[test]
fn a_mirror_via_an_export_under_writes_equals_the_table_in_postgres() {
    a_mirror_via_an_export_under_writes_equals_the_table(Target::Postgres);
}

/// Issue #24 items 6 and 7: a data file damaged in the bucket (one value changed after the
/// export wrote it, so its manifest's MD5 is stale) is never written — not even its lines
/// before the damage — and the damaged export is abandoned once for a new one, which the run
/// reads: every item once.
#[test]
fn a_damaged_export_writes_none_of_its_lines_and_is_replaced_once() {
    let (running, fake) = setup(700);
    fake.set_data_files(1);
    fake.damage_next_export();
    let pipeline = Pipeline::new(
        "damaged",
        &fake.url(),
        &format!("table_name: orders\nbatch_size: 10\n{EXPORT}"),
    );
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("its MD5 is"), "{text}");
    assert!(
        text.contains("abandoning it and requesting a new export"),
        "{text}"
    );
    assert_eq!(
        fake.exports_started(),
        2,
        "one new export replaced the damaged one"
    );
    let scanned = Pipeline::new("by-scan", &running.endpoint, "table_name: orders");
    let output = run(&scanned);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        sorted_lines(&pipeline),
        sorted_lines(&scanned),
        "every item once, none of the damaged file"
    );
}

/// Issue #24 items 6 and 7: when the replacement is damaged too, the run fails with nothing of
/// either written or committed and says what to do; the next run replaces it again.
#[test]
fn a_damaged_replacement_fails_the_run_with_nothing_written_and_the_next_run_replaces_it() {
    let (_running, fake) = setup(700);
    fake.set_data_files(1);
    fake.damage_next_exports(2);
    let pipeline = Pipeline::new(
        "damaged",
        &fake.url(),
        &format!("table_name: orders\nbatch_size: 10\n{EXPORT}"),
    );
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{text}");
    assert_eq!(
        pipeline.lines().len(),
        0,
        "no line of a damaged file was written"
    );
    assert!(text.contains("nothing of it was written"), "{text}");
    assert!(
        text.contains("abandons the damaged export and requests a new one"),
        "{text}"
    );
    let position = &pipeline.entry("damaged").unwrap()["position"];
    assert!(files_done(position).is_empty(), "{position}");
    assert!(
        position["cursors"].as_object().is_none_or(|c| c.is_empty()),
        "no cursor was committed: {position}"
    );
    assert_eq!(fake.exports_started(), 2);

    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        fake.exports_started(),
        3,
        "the rerun replaced the damaged export"
    );
    assert_eq!(pipeline.lines().len(), 700);
}

/// A second after the seed's stream records, an export taken by a scan through the fake: its
/// ARN.
fn export_a_second_later(fake: &FakeExport) -> String {
    std::thread::sleep(Duration::from_millis(1100));
    let exporter = Pipeline::new(
        "exporter",
        &fake.url(),
        &format!("table_name: orders\n{EXPORT}"),
    );
    let output = run(&exporter);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    fake.export_arns()[0].clone()
}

/// Issue #24 item 4: a mirror from a configured `export_arn` taken before changes the stream
/// has since trimmed (50 updates, 50 deletes, 20 new items) would miss them. With `on_gap:
/// fail` the run is refused before anything is committed, naming the export; with `on_gap:
/// resnapshot` a new export is taken in its place and the destination equals the table.
fn a_mirror_from_an_export_older_than_the_streams_trim_horizon_is_a_gap(target: Target) {
    let (running, fake) = setup(100);
    let arn = export_a_second_later(&fake);
    std::thread::sleep(Duration::from_millis(1100));
    for i in 0..50 {
        put(&running, &format!("k{i:04}"), 1000 + i);
    }
    for i in 50..100 {
        delete(&running, &format!("k{i:04}"));
    }
    for i in 100..120 {
        put(&running, &format!("k{i:04}"), i);
    }
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(fake_export::now_ms());

    let source = |on_gap: &str| {
        format!(
            "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2\nbatch_size: 50\non_gap: {on_gap}\nsnapshot: {{engine: export, s3_bucket: exports, export_arn: '{arn}'}}"
        )
    };
    let pipeline = Pipeline::new("old-export", &fake.url(), &source("fail"));
    let destination = Destination::new(target, pipeline.dir.path());
    pipeline.write_with_sink(
        "old-export",
        &fake.url(),
        &source("fail"),
        &destination.sink_yaml(),
    );
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("export_arn '{arn}'")), "{text}");
    assert!(text.contains("no longer proves"), "{text}");
    assert!(
        destination.items("orders").is_empty(),
        "nothing was written"
    );
    assert!(
        destination.state("old-export").is_empty(),
        "nothing was committed"
    );

    pipeline.write_with_sink(
        "old-export",
        &fake.url(),
        &source("resnapshot"),
        &destination.sink_yaml(),
    );
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains("a new export is taken in its place"),
        "{text}"
    );
    assert_eq!(
        fake.exports_started(),
        2,
        "a new export replaced the old one"
    );
    let table = table_items(&running);
    assert_eq!(table.len(), 70);
    assert!(
        destination.items("orders") == table,
        "the destination differs from the table"
    );
}

#[test]
fn a_mirror_from_an_export_older_than_the_streams_trim_horizon_is_a_gap_in_sqlite() {
    a_mirror_from_an_export_older_than_the_streams_trim_horizon_is_a_gap(Target::Sqlite);
}

#[test]
fn a_mirror_from_an_export_older_than_the_streams_trim_horizon_is_a_gap_in_postgres() {
    a_mirror_from_an_export_older_than_the_streams_trim_horizon_is_a_gap(Target::Postgres);
}

/// The configured export is read when the stream still holds every change since it was
/// taken: the mirror reads no second export and ends equal to the table.
#[test]
fn a_mirror_from_an_export_the_stream_still_covers_reads_it() {
    let (running, fake) = setup(60);
    let arn = export_a_second_later(&fake);
    for i in 0..10 {
        put(&running, &format!("k{i:04}"), 500 + i);
    }
    delete(&running, "k0020");
    let source = format!(
        "table_name: orders\nmode: mirror\nvalue_format: typed\nidle_termination_secs: 2\nbatch_size: 50\nsnapshot: {{engine: export, s3_bucket: exports, export_arn: '{arn}'}}"
    );
    let pipeline = Pipeline::new("covered", &fake.url(), &source);
    let destination = Destination::new(Target::Sqlite, pipeline.dir.path());
    pipeline.write_with_sink("covered", &fake.url(), &source, &destination.sink_yaml());
    let output = run(&pipeline);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert_eq!(fake.exports_started(), 1, "the configured export was read");
    assert!(destination.items("orders") == table_items(&running));
}
