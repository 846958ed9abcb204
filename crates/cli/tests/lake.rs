//! The parquet sink end to end through the CLI (docs/sinks.md §7.10): dynoxide (or moto) as
//! the source, a local directory or moto's S3 as the destination, and pyarrow — a reader
//! nobody here wrote (`tests/lake/read_parquet.py`) — reading back what was committed.
//!
//! Exactly once is judged on every row of every Parquet file under the location after a last
//! run (which deletes the files of commits that never happened): every stream record once,
//! compared with an independent jsonl read of the same stream, and the rows replayed per key
//! give the table.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
// An HTTP proxy in front of moto, here for its faults of S3 and Glue requests.
mod fake_export;
// The iceberg sink: the same sources and files, committed to an Iceberg table.
#[path = "lake/iceberg.rs"]
mod iceberg;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType, StreamViewType};
use serde_json::Value;

use common::keyed::{self, normalize_sets};
use common::writer::{Writer, killed_under_writes, start_writer, stream_records};
use common::{Emulator, Pipeline, Running, stderr, stdout};

/// What pyarrow read.
struct Read {
    files: BTreeMap<String, u64>,
    manifests: BTreeMap<String, Value>,
    commits: Vec<String>,
    schema: BTreeMap<String, String>,
    codecs: BTreeSet<String>,
    rows: Vec<Value>,
}

/// Runs `read_parquet.py` with `args`; its standard output.
fn python(args: &[&str]) -> Vec<u8> {
    reader_script("read_parquet.py", args)
}

/// Runs `tests/lake/<script>` (pyarrow, pyiceberg: scripts/test.sh installs them) with `args`;
/// its standard output.
fn reader_script(script: &str, args: &[&str]) -> Vec<u8> {
    let path = ddbpipe_testkit::package_dir()
        .join("tests/lake")
        .join(script);
    let output = Command::new("python3")
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script} (pyarrow, pyiceberg; scripts/test.sh installs them): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn reader(args: &[&str]) -> Read {
    let read: Value = serde_json::from_slice(&python(args)).unwrap();
    let map = |v: &Value| -> BTreeMap<String, Value> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    Read {
        files: map(&read["files"])
            .into_iter()
            .map(|(k, v)| (k, v.as_u64().unwrap()))
            .collect(),
        manifests: map(&read["manifests"]),
        commits: serde_json::from_value(read["commits"].clone()).unwrap(),
        schema: map(&read["schema"])
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap().to_string()))
            .collect(),
        codecs: map(&read["codecs"])
            .into_values()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        rows: serde_json::from_value(read["rows"].clone()).unwrap(),
    }
}

/// Everything under a local location.
fn read_dir(dir: &Path) -> Read {
    reader(&["dir", dir.to_str().unwrap()])
}

/// Everything under `s3://bucket/prefix` on moto.
fn read_s3(endpoint: &str, bucket: &str, prefix: &str) -> Read {
    reader(&["s3", endpoint, bucket, prefix])
}

/// The current-state query of docs/sinks.md §7.10 run by DuckDB on a location (`dir <path>`
/// or `s3 <endpoint> <bucket> <prefix>`): each key's document, sets sorted.
fn documented_current_state(location: &[&str]) -> BTreeMap<String, Value> {
    let docs = ddbpipe_testkit::repository().join("docs/sinks.md");
    let mut args = vec!["current", docs.to_str().unwrap()];
    args.extend_from_slice(location);
    documents(&python(&args))
}

/// A reader script's `{pk: document}`, sets sorted.
fn documents(printed: &[u8]) -> BTreeMap<String, Value> {
    let found: BTreeMap<String, Value> = serde_json::from_slice(printed).unwrap();
    found
        .into_iter()
        .map(|(pk, mut document)| {
            normalize_sets(&mut document);
            (pk, document)
        })
        .collect()
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

/// A `sink:` section into `path`, and extra keys (indented under `sink:`).
fn parquet_sink(path: &str, extra: &str) -> String {
    format!("sink:\n  type: parquet\n  path: '{path}'\n{extra}")
}

/// A table `orders` with a stream (new and old images) and `seeded` random items (from
/// `seed`) on `emulator`, and a pipeline `lake` reading it with `source` (its sink for the
/// caller to write).
fn seeded_orders(
    emulator: Emulator,
    seed: u64,
    seeded: usize,
    source: &str,
) -> (Arc<Running>, Pipeline) {
    let running = Arc::new(emulator.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut writer = Writer::new(seed, seeded.max(1));
    let items: Vec<_> = (0..seeded)
        .map(|i| writer.random_item(&format!("k{i:03}")))
        .collect();
    if !items.is_empty() {
        running.put_items("orders", items);
    }
    let pipeline = Pipeline::new("lake", &running.endpoint, source);
    (running, pipeline)
}

/// A table `orders` with a stream and `seeded` items on `emulator`, and a pipeline from it
/// into `path`.
fn orders_into_parquet(
    emulator: Emulator,
    source: &str,
    seeded: usize,
    path: Option<&str>,
    extra: &str,
) -> (Arc<Running>, Pipeline) {
    let (running, pipeline) = seeded_orders(emulator, 29, seeded, source);
    let local = pipeline.dir.path().join("lake").display().to_string();
    pipeline.write_with_sink(
        "lake",
        &running.endpoint,
        source,
        &parquet_sink(path.unwrap_or(&local), extra),
    );
    (running, pipeline)
}

/// The pk of a row.
fn pk(row: &Value) -> String {
    row["pk"].as_str().unwrap().to_string()
}

/// A row's document as the table dump gives it (sets sorted).
fn document(row: &Value) -> Value {
    let mut document: Value = serde_json::from_str(row["document"].as_str().unwrap()).unwrap();
    normalize_sets(&mut document);
    document
}

/// Sequence numbers compare as numbers: by length, then by digits.
fn sequence_order(seq: &str) -> (usize, String) {
    (seq.len(), seq.to_string())
}

/// Replays the changelog per key: snapshot rows first, then changes in sequence order; `r`,
/// `c`, `u` put the document, `d` removes it.
fn replay(rows: &[Value]) -> BTreeMap<String, Value> {
    let mut ordered: Vec<&Value> = rows.iter().collect();
    ordered.sort_by_key(|row| {
        let seq = row["sequence_number"].as_str().unwrap_or("");
        (row["op"] != "r", sequence_order(seq))
    });
    let mut items = BTreeMap::new();
    for row in ordered {
        match row["op"].as_str().unwrap() {
            "r" | "c" | "u" => {
                items.insert(pk(row), document(row));
            }
            "d" => {
                items.remove(&pk(row));
            }
            other => panic!("unexpected op {other}: {row}"),
        }
    }
    items
}

/// Every change row's stream record, with how often it is in the files.
fn change_records(rows: &[Value]) -> BTreeMap<(String, String), usize> {
    let mut seen = BTreeMap::new();
    for row in rows.iter().filter(|r| r["op"] != "r") {
        let record = (
            row["shard_id"].as_str().unwrap().to_string(),
            row["sequence_number"].as_str().unwrap().to_string(),
        );
        *seen.entry(record).or_insert(0) += 1;
    }
    seen
}

/// The changelog's exactly-once rules on what pyarrow read: no stream record twice, none
/// missing, none that is not in the stream, and the replay equal to the table.
fn assert_changelog_exact(read: &Read, running: &Running) {
    let delivered = change_records(&read.rows);
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "committed more than once: {twice:?}");
    let expected = stream_records(running);
    let got: BTreeSet<_> = delivered.into_keys().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(&expected).collect();
    assert!(missing.is_empty(), "{} missing: {missing:?}", missing.len());
    assert!(extra.is_empty(), "not in the stream: {extra:?}");
    assert_eq!(
        replay(&read.rows),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// moto, serving S3 (and Glue), with the bucket `lake`.
fn moto_with_lake() -> Running {
    let moto = Emulator::Moto.start();
    python(&["mkbucket", &moto.endpoint, "lake"]);
    moto
}

/// The mirror the S3 tests run: two segments in pages of 25, batches of 20, idle after 2 s.
const S3_MIRROR: &str = "table_name: orders\nmode: mirror\nvalue_format: typed\nsegments: 2\n\
                         page_limit: 25\nbatch_size: 20\nidle_termination_secs: 2";

const STREAMS: &str = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                       value_format: typed\nbatch_size: 20\nidle_termination_secs: 2";

/// §7.10 rules 1, 4: a scan writes a run directory whose manifest lists its files; every item
/// is in them once, equal to the table; a second scan writes a directory of its own.
#[test]
fn a_scan_writes_a_run_directory_equal_to_the_table() {
    let source = "table_name: orders\nvalue_format: typed\nsegments: 2\npage_limit: 25\n\
                  batch_size: 20";
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        source,
        300,
        None,
        "  commit_interval_secs: 0\n",
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lake = pipeline.dir.path().join("lake");
    let read = read_dir(&lake);
    assert_eq!(read.manifests.len(), 1, "{:?}", read.manifests.keys());
    let (run_dir, manifest) = read.manifests.iter().next().unwrap();
    assert_eq!(manifest["rows"], 300);
    let listed: BTreeMap<String, u64> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, read.files, "the manifest lists exactly the files");
    assert!(read.files.len() > 1, "a commit per batch: {:?}", read.files);
    assert!(listed.keys().all(|f| f.starts_with(&format!("{run_dir}/"))));
    assert_eq!(read.schema["pk"], "string");
    assert_eq!(read.schema["document"], "string");
    assert_eq!(
        read.codecs,
        BTreeSet::from(["SNAPPY".to_string()]),
        "the default"
    );
    let items: BTreeMap<String, Value> = read.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(items.len(), 300, "each item once");
    assert_eq!(items, keyed::table_items(&running.endpoint, "orders"));

    // A second run: a directory of its own, the first one as it was.
    running.delete_pk("orders", "k000");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let again = read_dir(&lake);
    assert_eq!(again.manifests.len(), 2);
    let newest = again.manifests.keys().max().unwrap();
    assert_ne!(newest, run_dir);
    assert_eq!(again.manifests[newest]["rows"], 299);
    assert_eq!(again.manifests[run_dir], *manifest);
}

/// §7.10 rule 5, `commits` rule 2: a streams run SIGKILLed at random points commits every
/// change exactly once; the files of commits that never happened are deleted by the next run.
#[test]
fn a_streams_run_killed_anywhere_commits_every_change_exactly_once() {
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        STREAMS,
        0,
        None,
        "  commit_interval_secs: 1\n",
    );
    killed_under_writes(&running, &pipeline, 6, 0x29, 500..3000);
    let lake = pipeline.dir.path().join("lake");
    let read = read_dir(&lake);
    assert!(!read.rows.is_empty());
    assert_changelog_exact(&read, &running);
    assert_eq!(
        documented_current_state(&["dir", lake.to_str().unwrap()]),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented DuckDB query gives the table"
    );
    assert_eq!(read.schema["event_time"], "timestamp[us, tz=UTC]");
    assert_eq!(read.schema["op"], "string");
    assert!(read.schema.contains_key("before"), "{:?}", read.schema);
    // Files sit in the day directory of their rows' event time.
    for row in &read.rows {
        let day =
            time::OffsetDateTime::from_unix_timestamp(row["event_time"].as_i64().unwrap() / 1000)
                .unwrap()
                .date();
        let dir = format!("event_time_day={day}/");
        assert!(row["_file"].as_str().unwrap().starts_with(&dir), "{row}");
    }
}

/// §7.10 on S3 (moto, path-style): a mirror SIGKILLed at random points writes the snapshot as
/// `op: r` once per untouched key, then each change once, and the replay is the table.
#[test]
fn a_mirror_into_s3_killed_anywhere_converges_with_each_change_once() {
    let s3 = moto_with_lake();
    let source = S3_MIRROR;
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        source,
        300,
        Some("s3://lake/dynamodb/{table}/"),
        &format!(
            "  commit_interval_secs: 1\n  s3_endpoint_url: {}\n",
            s3.endpoint
        ),
    );
    killed_under_writes(&running, &pipeline, 4, 0x2929, 500..3000);
    let read = read_s3(&s3.endpoint, "lake", "dynamodb/orders/");
    assert_changelog_exact(&read, &running);
    assert_eq!(
        documented_current_state(&["s3", &s3.endpoint, "lake", "dynamodb/orders/"]),
        keyed::table_items(&running.endpoint, "orders"),
        "the documented DuckDB query gives the table"
    );
    let mut untouched: BTreeMap<String, usize> = BTreeMap::new();
    for row in read.rows.iter().filter(|r| r["op"] == "r") {
        if pk(row).as_str() >= "k200" {
            *untouched.entry(pk(row)).or_insert(0) += 1;
        }
    }
    assert_eq!(untouched.len(), 100, "{untouched:?}");
    assert!(untouched.values().all(|n| *n == 1), "{untouched:?}");
    assert!(!read.commits.is_empty());
}

/// §7.10 rule 6, docs/errors.md §9.4: S3 refusing every third request (`503 SlowDown`) or
/// losing their answers (a 500 after the request was done: a data file, a commit, a delete
/// landed unbeknown) under a mirror killed at random points and a writer: each request is
/// tried again, a commit found taken on its retry is read back and known for its own, and
/// the files hold every change once, replaying to the table. Without the retries the first
/// fault ends a run (exit 1).
#[test]
fn s3_refusing_or_losing_answers_now_and_then_loses_and_repeats_nothing() {
    let s3 = moto_with_lake();
    let fake = fake_export::FakeExport::start(&s3.endpoint, &s3.endpoint);
    fake.fail_lake_requests(3);
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        S3_MIRROR,
        300,
        Some("s3://lake/dynamodb/{table}/"),
        &format!(
            "  commit_interval_secs: 1\n  s3_endpoint_url: {}\n",
            fake.url()
        ),
    );
    killed_under_writes(&running, &pipeline, 2, 0x5107, 1500..3000);
    let (refused, lost) = fake.lake_faults();
    assert!(
        refused >= 3 && lost >= 3,
        "{refused} refused, {lost} answers lost"
    );
    let read = read_s3(&s3.endpoint, "lake", "dynamodb/orders/");
    assert_changelog_exact(&read, &running);
    assert!(!read.commits.is_empty());

    // Each attempt is counted under its operation: a run with nothing left to do still meets
    // a fault in its first three requests.
    let metrics = pipeline.dir.path().join("lake.prom");
    let metrics_file = metrics.display().to_string();
    let output = pipeline.ddbpipe(&[
        "run",
        "--progress",
        "never",
        "--metrics-file",
        &metrics_file,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let counted = std::fs::read_to_string(&metrics).unwrap();
    let s3_operations = [
        "put_object",
        "get_object",
        "list_objects_v2",
        "delete_object",
    ];
    let failed_attempts = (counted.lines())
        .filter(|line| line.starts_with("ddbpipe_requests_total{"))
        .filter(|line| {
            s3_operations
                .iter()
                .any(|op| line.contains(&format!("operation=\"{op}\"")))
        })
        .filter(|line| !line.contains("outcome=\"ok\""));
    assert!(failed_attempts.count() > 0, "{counted}");
}

/// Rule 1 of `rows`: binary keys stay bytes and 38-digit number keys keep every digit; an item
/// near 400 KB is stored whole.
#[test]
fn binary_and_38_digit_keys_are_kept_exactly() {
    let running = Emulator::Dynoxide.start();
    put_blobs(&running);
    let pipeline = Pipeline::new("blobs", &running.endpoint, "table_name: blobs");
    let lake = pipeline.dir.path().join("lake");
    pipeline.write_with_sink(
        "blobs",
        &running.endpoint,
        "table_name: blobs",
        &parquet_sink(lake.to_str().unwrap(), ""),
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let read = read_dir(&lake);
    assert_eq!(read.schema["id"], "binary");
    assert_eq!(read.schema["n"], "string");
    assert_blobs_exact(&read.rows);
}

/// 38 digits.
const BIG: &str = "12345678901234567890123456789012345678";

/// A table `blobs` keyed by a binary `id` and a number `n` of 38 digits, one item near
/// DynamoDB's 400 KB limit.
fn put_blobs(running: &Running) {
    common::create_table_on(
        &running.client,
        "blobs",
        ("id", ScalarAttributeType::B),
        Some(("n", ScalarAttributeType::N)),
    );
    let mut items = Vec::new();
    for i in 0u8..5 {
        items.push(common::item(vec![
            (
                "id",
                AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(vec![0, 255, i])),
            ),
            (
                "n",
                AttributeValue::N(format!("{BIG}{i}").chars().take(38).collect()),
            ),
            ("x", AttributeValue::N(format!("0.{BIG}"))),
        ]));
    }
    items.push(common::item(vec![
        (
            "id",
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(vec![7])),
        ),
        ("n", AttributeValue::N(format!("-{BIG}E+87"))),
        // An item near DynamoDB's 400 KB limit.
        ("text", AttributeValue::S("x".repeat(399_000))),
    ]));
    running.put_items("blobs", items);
}

/// What a reader read of `blobs`: the keys as DynamoDB has them, every digit, the big item
/// whole.
fn assert_blobs_exact(rows: &[Value]) {
    assert_eq!(rows.len(), 6, "each item once");
    let keys: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["n"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        keys.contains(&("AP8A".to_string(), BIG.to_string())),
        "{keys:?}"
    );
    // DynamoDB's own text of the number: every digit, the exponent spelled out.
    let spelled = format!("-{BIG}{}", "0".repeat(87));
    assert!(keys.contains(&("Bw==".to_string(), spelled)), "{keys:?}");
    assert!(
        rows.iter()
            .any(|r| r["document"].as_str().unwrap().len() > 399_000),
        "the 400 KB item is whole"
    );
    // The document keeps the exact number too.
    assert!(rows.iter().any(|r| {
        r["document"]
            .as_str()
            .unwrap()
            .contains(&format!("0.{BIG}"))
    }));
}

/// §7.10: `check` writes and deletes a probe file and reads the commit log; `state show` reads
/// the position from the last commit; `state reset` commits an empty one, after which the
/// next scan starts a new run directory from the start.
#[test]
fn check_state_show_and_reset_use_the_commit_log() {
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        "table_name: orders\nvalue_format: typed",
        20,
        None,
        "",
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("a file was written and deleted"),
        "{}",
        stdout(&check)
    );
    let lake = pipeline.dir.path().join("lake");
    assert!(
        read_dir(&lake).files.is_empty() && !lake.join("_ddbpipe/check").exists(),
        "the probe left nothing"
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    shows_a_completed_scan(&pipeline);
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let read = read_dir(&lake);
    let last: Value =
        serde_json::from_slice(&std::fs::read(lake.join(read.commits.last().unwrap())).unwrap())
            .unwrap();
    assert_eq!(last["entry"], Value::Null, "{last}");
    drop(running);
}

/// What the sink cannot do is refused when the file is loaded, naming the key.
#[test]
fn the_config_refuses_what_the_sink_cannot_do() {
    let running = Emulator::Dynoxide.start();
    let pipeline = Pipeline::new("p", &running.endpoint, "table_name: orders");
    let cases = [
        (
            "table_name: orders",
            "sink:\n  type: parquet\n  path: 'gs://bucket/x'\n",
            "sink.path",
        ),
        (
            "table_name: orders",
            "sink:\n  type: parquet\n  path: out\n  target_file_mb: 0\n",
            "sink.target_file_mb",
        ),
        (
            "tables: [a, b]",
            "sink:\n  type: parquet\n  path: out\n",
            "sink.path",
        ),
        (
            "table_name: orders\nmode: streams",
            "sink:\n  type: parquet\n  path: out\ncoordination:\n  lease_table: leases\n",
            "sink.type",
        ),
    ];
    for (source, sink, field) in cases {
        pipeline.write_with_sink("p", &running.endpoint, source, sink);
        let output = pipeline.ddbpipe(&["check"]);
        assert_eq!(output.status.code(), Some(2), "{source} {sink}");
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert!(said.contains(field), "{field}: {said}");
    }
}

/// §7.10 with §7.9: typed columns after the others, each of its Parquet type as pyarrow reads
/// it, every value equal to the document's own (a 23-digit number keeps every digit).
#[test]
fn typed_columns_are_read_back_with_their_types_and_exact_values() {
    let columns = "  columns:\n\
                   \x20   - {name: v, path: v, type: bigint}\n\
                   \x20   - {name: big, path: big, type: numeric}\n\
                   \x20   - {name: flag, path: 'nested.l[1]', type: boolean}\n\
                   \x20   - {name: tags, path: tags, type: jsonb}\n";
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        "table_name: orders\nvalue_format: typed",
        40,
        None,
        columns,
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let read = read_dir(&pipeline.dir.path().join("lake"));
    assert_eq!(read.schema["v"], "int64");
    assert_eq!(read.schema["big"], "string");
    assert_eq!(read.schema["flag"], "bool");
    assert_eq!(read.schema["tags"], "string");
    assert_eq!(read.rows.len(), 40);
    for row in &read.rows {
        let document: Value = serde_json::from_str(row["document"].as_str().unwrap()).unwrap();
        let v: i64 = document["v"]["N"].as_str().unwrap().parse().unwrap();
        assert_eq!(row["v"], v, "{row}");
        assert_eq!(row["big"], document["big"]["N"], "{row}");
        assert_eq!(row["flag"], true, "{row}");
        match document.get("tags") {
            Some(_) => {
                let tags: Value = serde_json::from_str(row["tags"].as_str().unwrap()).unwrap();
                let mut listed: Vec<Value> = tags.as_array().unwrap().clone();
                listed.sort_by_key(|t| t.to_string());
                let mut expected = document["tags"]["SS"].as_array().unwrap().clone();
                expected.sort_by_key(|t| t.to_string());
                assert_eq!(listed, expected, "{row}");
            }
            None => assert_eq!(row["tags"], Value::Null, "{row}"),
        }
    }
    drop(running);
}

/// Rule 2 and `CheckpointStore::commit_held`: a run stopped by SIGTERM commits what it holds
/// (a commit interval of an hour never came), and the next run goes on from there, writing
/// nothing twice.
#[test]
fn a_stop_by_signal_commits_what_the_run_holds() {
    let source = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                  value_format: typed\nbatch_size: 20\nfollow: true";
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        source,
        0,
        None,
        "  commit_interval_secs: 3600\n",
    );
    for i in 0..30 {
        running.put_pk("orders", &format!("k{i:03}"), "1");
    }
    let child = common::spawn_run(&pipeline.config);
    let lake = pipeline.dir.path().join("lake");
    // Its first commits are its claim and its start position; then it reads the changes and
    // holds them.
    assert!(common::wait_for(Duration::from_secs(30), || {
        read_dir(&lake).commits.len() == 2
    }));
    std::thread::sleep(Duration::from_secs(3));
    assert!(read_dir(&lake).rows.is_empty(), "held, not committed yet");
    common::sigterm(&child);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let read = read_dir(&lake);
    assert_eq!(read.rows.len(), 30, "committed at the stop");
    for i in 30..40 {
        running.put_pk("orders", &format!("k{i:03}"), "1");
    }
    pipeline.write_with_sink(
        "lake",
        &running.endpoint,
        &source.replace("follow: true", "idle_termination_secs: 2"),
        &parquet_sink(lake.to_str().unwrap(), "  commit_interval_secs: 3600\n"),
    );
    let again = run(&pipeline);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let read = read_dir(&lake);
    assert_eq!(change_records(&read.rows).len(), 40);
    assert!(change_records(&read.rows).values().all(|n| *n == 1));
}

/// `commits` rule 3 on S3: two runs of one pipeline at once — one stops at its claim or at
/// its next commit (S3's conditional write refused it), and what was committed is still every
/// change once.
#[test]
fn of_two_runs_into_one_s3_location_one_stops() {
    let s3 = moto_with_lake();
    let source = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                  value_format: typed\nbatch_size: 20\nfollow: true";
    let extra = format!(
        "  commit_interval_secs: 1\n  s3_endpoint_url: {}\n",
        s3.endpoint
    );
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        source,
        0,
        Some("s3://lake/orders/"),
        &extra,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(Arc::clone(&running), 0x2931, 200, Arc::clone(&stop));
    let mut first = common::spawn_run(&pipeline.config);
    let mut second = common::spawn_run(&pipeline.config);
    let mut fenced = None;
    assert!(
        common::wait_for(Duration::from_secs(60), || {
            for (which, child) in [(1, &mut first), (2, &mut second)] {
                if let Ok(Some(status)) = child.try_wait() {
                    fenced = Some((which, status));
                    return true;
                }
            }
            false
        }),
        "one of the two runs stops"
    );
    let (which, status) = fenced.unwrap();
    let (stopped, survivor) = if which == 1 {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(status.code(), Some(1));
    let said = stderr(&stopped.wait_with_output().unwrap());
    assert!(
        said.contains("committed to s3://lake/orders/ first")
            || said.contains("started on s3://lake/orders/ at the same moment"),
        "{said}"
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    common::sigterm(&survivor);
    let output = survivor.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    pipeline.write_with_sink(
        "lake",
        &running.endpoint,
        &source.replace("follow: true", "idle_termination_secs: 2"),
        &parquet_sink("s3://lake/orders/", &extra),
    );
    let last = run(&pipeline);
    assert_eq!(last.status.code(), Some(0), "{}", stderr(&last));
    assert_changelog_exact(&read_s3(&s3.endpoint, "lake", "orders/"), &running);
}

/// docs/config.md §1.5 with §7.10: a file of two tables writes each into its own location
/// (`{table}` in the path), each with its own commit log and run directory.
#[test]
fn two_tables_go_into_locations_of_their_own() {
    let running = Emulator::Dynoxide.start();
    for (table, count) in [("orders", 12), ("customers", 7)] {
        running.create_pk_table(table, None);
        for i in 0..count {
            running.put_pk(table, &format!("{table}-{i}"), "1");
        }
    }
    let pipeline = Pipeline::new("two", &running.endpoint, "table_name: unused");
    let lake = pipeline.dir.path().join("lake");
    pipeline.write_with_sink(
        "two",
        &running.endpoint,
        "tables: [orders, customers]",
        &parquet_sink(&format!("{}/{{table}}", lake.display()), ""),
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for (table, count) in [("orders", 12), ("customers", 7)] {
        let read = read_dir(&lake.join(table));
        assert_eq!(read.manifests.len(), 1, "{table}");
        let manifest = read.manifests.values().next().unwrap();
        assert_eq!(manifest["rows"], count, "{table}");
        assert_eq!(manifest["pipeline"], format!("two:{table}"));
        assert!(
            read.rows.iter().all(|r| pk(r).starts_with(table)),
            "{table}"
        );
    }
}

/// `check` refuses what `run` refuses: a typed column named like a key attribute.
#[test]
fn check_and_run_refuse_a_typed_column_named_like_the_key() {
    let (_running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        "table_name: orders",
        3,
        None,
        "  columns:\n    - {name: pk, path: v, type: text}\n",
    );
    refused_by_check_and_run(&pipeline, "typed column 'pk'");
}

/// `state show` reads a completed scan's position back from the sink.
fn shows_a_completed_scan(pipeline: &Pipeline) {
    let show = pipeline.ddbpipe(&["state", "show", "--json"]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    assert!(
        stdout(&show).contains("last_completed"),
        "{}",
        stdout(&show)
    );
}

/// `check` fails and `run` refuses, both saying `why` (`check` in its report, `run` in its
/// error): what `run` refuses, `check` catches.
fn refused_by_check_and_run(pipeline: &Pipeline, why: &str) {
    let check = pipeline.ddbpipe(&["check"]);
    assert_ne!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(stdout(&check).contains(why), "check: {}", stdout(&check));
    let output = run(pipeline);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains(why), "run: {}", stderr(&output));
}

/// §7.10 rule 3's partitions: a scan with `partition_by: [bucket(4, pk)]` puts each row in its
/// run's `pk_bucket=<b>/` directory, `b` Iceberg's bucket of its key as pyiceberg computes it;
/// every item once, equal to the table.
#[test]
fn a_partitioned_scan_puts_each_row_in_its_buckets_directory() {
    let (running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        "table_name: orders\nvalue_format: typed\nbatch_size: 20",
        60,
        None,
        "  partition_by: ['bucket(4, pk)']\n",
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let read = read_dir(&pipeline.dir.path().join("lake"));
    assert_eq!(read.rows.len(), 60, "each item once");
    let items: BTreeMap<String, Value> = read.rows.iter().map(|r| (pk(r), document(r))).collect();
    assert_eq!(items, keyed::table_items(&running.endpoint, "orders"));
    let pks: Vec<String> = read.rows.iter().map(pk).collect();
    let mut args = vec!["bucket", "4"];
    args.extend(pks.iter().map(String::as_str));
    let buckets: Vec<u32> =
        serde_json::from_slice(&reader_script("read_iceberg.py", &args)).unwrap();
    let mut dirs = BTreeSet::new();
    for (row, bucket) in read.rows.iter().zip(buckets) {
        let file = row["_file"].as_str().unwrap();
        let (run_dir, rest) = file.split_once('/').unwrap();
        assert!(run_dir.ends_with('Z'), "{file}");
        assert!(
            rest.starts_with(&format!("pk_bucket={bucket}/part-")),
            "{file}"
        );
        dirs.insert(bucket);
    }
    assert!(dirs.len() > 1, "{dirs:?}");
}

/// §7.10 rule 3: a changelog keeps the partitioning its commits record — `state reset` (a
/// store outside a run) carries it on — and a `partition_by` that changes it is refused by
/// `check` and `run` alike, naming both; put back, the run goes on.
#[test]
fn a_changelog_partitioned_otherwise_is_refused_by_check_and_run() {
    let (running, pipeline) = orders_into_parquet(Emulator::Dynoxide, STREAMS, 10, None, "");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let lake = pipeline.dir.path().join("lake").display().to_string();
    let sink = |extra: &str| parquet_sink(&lake, extra);
    pipeline.write_with_sink(
        "lake",
        &running.endpoint,
        STREAMS,
        &sink("  partition_by: []\n"),
    );
    refused_by_check_and_run(
        &pipeline,
        "holds a changelog partitioned by [day(event_time)], the sink partitions by []",
    );
    pipeline.write_with_sink("lake", &running.endpoint, STREAMS, &sink(""));
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// `sink.compression`: zstd and none write files pyarrow reads, with that codec, equal to the
/// table.
#[test]
fn zstd_and_uncompressed_files_read_back_equal_to_the_table() {
    for (compression, codec) in [("zstd", "ZSTD"), ("none", "UNCOMPRESSED")] {
        let (running, pipeline) = orders_into_parquet(
            Emulator::Dynoxide,
            "table_name: orders\nvalue_format: typed",
            30,
            None,
            &format!("  compression: {compression}\n"),
        );
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let read = read_dir(&pipeline.dir.path().join("lake"));
        assert_eq!(
            read.codecs,
            BTreeSet::from([codec.to_string()]),
            "{compression}"
        );
        let items: BTreeMap<String, Value> =
            read.rows.iter().map(|r| (pk(r), document(r))).collect();
        assert_eq!(
            items,
            keyed::table_items(&running.endpoint, "orders"),
            "{compression}"
        );
    }
}

/// A password in `sink.s3_endpoint_url` reaches no output: an S3 endpoint that does not answer
/// fails `check` and `run`, told as every AWS error is (masked, docs/config.md §1.4), and
/// neither says the password.
#[test]
fn the_s3_endpoints_password_reaches_no_output() {
    let port = ddbpipe_testkit::free_port();
    let (_running, pipeline) = orders_into_parquet(
        Emulator::Dynoxide,
        "table_name: orders",
        3,
        Some("s3://lake/orders/"),
        &format!("  s3_endpoint_url: 'http://ddbpipe:hunter22@127.0.0.1:{port}'\n"),
    );
    for command in [&["check"][..], &["run", "--progress", "never"][..]] {
        let output = pipeline.ddbpipe(command);
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert_ne!(output.status.code(), Some(0), "{command:?}: {said}");
        assert!(
            said.contains("127.0.0.1"),
            "{command:?} names the endpoint: {said}"
        );
        common::assert_hidden(&said, "hunter22", 5, "the S3 endpoint's password");
        assert!(
            !said.contains("DispatchFailure("),
            "{command:?}: told as every AWS error is, not the SDK's debug form: {said}"
        );
    }
}

/// docs/streams.md §4.2: a stream without new images cannot feed the changelog — `run` refuses
/// it before reading (a config error naming the view), and `check` fails on it.
#[test]
fn a_stream_without_new_images_is_refused_by_check_and_run() {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::KeysOnly));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("keys", &running.endpoint, "table_name: orders");
    let lake = pipeline.dir.path().join("lake");
    pipeline.write_with_sink(
        "keys",
        &running.endpoint,
        "table_name: orders\nmode: streams\nstart_position: trim_horizon\nidle_termination_secs: 2",
        &parquet_sink(lake.to_str().unwrap(), ""),
    );
    let run = run(&pipeline);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(stderr(&run).contains("KEYS_ONLY"), "{}", stderr(&run));
    assert!(
        read_dir(&lake).commits.is_empty(),
        "refused before the log was claimed"
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert_ne!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("KEYS_ONLY: the parquet sink needs NEW_IMAGE"),
        "{}",
        stdout(&check)
    );
}
