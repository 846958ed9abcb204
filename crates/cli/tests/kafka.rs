//! The kafka sink end to end through the CLI (docs/sinks.md §7.7, §7.8): dynoxide as the source,
//! the real broker of `scripts/kafka.sh` as the destination (the tests fail, naming it, when
//! `DDBPIPE_TEST_KAFKA_BROKERS` is unset).
//!
//! Exactly once is judged on the topic's **committed view** — the log read at the record-batch
//! level with the commit and abort markers applied (`ddbpipe_testkit::kafka`), which is what a
//! correct `read_committed` consumer receives — against an independent read of the same stream
//! by a jsonl pipeline, and by replaying the events onto an empty map, which must give the table.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use serde_json::Value;

use common::keyed::{self, normalize_sets};
use common::writer::{Writer, killed_under_writes, stream_records};
use common::{Emulator, Pipeline, Running, rt, stderr, stdout};

/// The brokers of the test run (a test fails without them, naming the variable).
fn brokers() -> String {
    ddbpipe_testkit::kafka::brokers()
}

/// A topic name no other test uses.
fn fresh_topic(what: &str) -> String {
    ddbpipe_testkit::kafka::topic_name(what)
}

/// A `sink:` section into `topic` with `delivery`, and extra keys (indented under `sink:`).
fn kafka_sink(brokers: &str, topic: &str, positions: &str, delivery: &str, extra: &str) -> String {
    format!(
        "sink:\n  type: kafka\n  brokers: '{brokers}'\n  topic: '{topic}'\n  \
         positions_topic: '{positions}'\n  delivery: {delivery}\n{extra}"
    )
}

/// One message of a topic's committed view.
#[derive(Debug, Clone)]
struct Event {
    key: String,
    /// `None`: a tombstone.
    value: Option<Value>,
}

impl Event {
    fn op(&self) -> Option<&str> {
        self.value.as_ref()?["op"].as_str()
    }

    /// The stream record's shard and sequence number (changes only).
    fn record(&self) -> Option<(String, String)> {
        let source = &self.value.as_ref()?["source"];
        Some((
            source["shard_id"].as_str()?.to_string(),
            source["sequence_number"].as_str()?.to_string(),
        ))
    }
}

/// The committed view of `topic`, every partition, each in offset order.
fn committed(brokers: &str, topic: &str) -> Vec<Vec<Event>> {
    let view = rt().block_on(ddbpipe_testkit::kafka::committed_view(brokers, topic));
    let mut partitions: BTreeMap<i32, Vec<Event>> = BTreeMap::new();
    for (partition, record) in view {
        let key = String::from_utf8(record.key.unwrap().to_vec()).unwrap();
        let value = record
            .value
            .map(|value| serde_json::from_slice(&value).unwrap());
        partitions
            .entry(partition)
            .or_default()
            .push(Event { key, value });
    }
    partitions.into_values().collect()
}

/// The key of a `pk` table's item as the message key holds it (typed values).
fn pk_of(key: &str) -> String {
    let key: Value = serde_json::from_str(key).unwrap();
    key["pk"]["S"].as_str().unwrap().to_string()
}

/// Replays every partition's events onto an empty map: `r`, `c`, `u` put `after`, `d` removes.
fn replay(partitions: &[Vec<Event>]) -> BTreeMap<String, Value> {
    let mut items = BTreeMap::new();
    for events in partitions {
        for event in events {
            let Some(value) = &event.value else { continue };
            let pk = pk_of(&event.key);
            match value["op"].as_str().unwrap() {
                "r" | "c" | "u" => {
                    let mut after = value["after"].clone();
                    normalize_sets(&mut after);
                    items.insert(pk, after);
                }
                "d" => {
                    items.remove(&pk);
                }
                other => panic!("unexpected op {other}: {value}"),
            }
        }
    }
    items
}

/// Every change event's stream record, with how often it was delivered.
fn change_records(partitions: &[Vec<Event>]) -> BTreeMap<(String, String), usize> {
    let mut seen = BTreeMap::new();
    for event in partitions.iter().flatten() {
        if matches!(event.op(), Some("c" | "u" | "d")) {
            *seen.entry(event.record().unwrap()).or_insert(0) += 1;
        }
    }
    seen
}

/// Sequence numbers compare as numbers: by length, then by digits.
fn sequence_order(seq: &str) -> (usize, String) {
    (seq.len(), seq.to_string())
}

/// Within each partition the changes of one key come in stream order.
fn assert_in_order_per_key(partitions: &[Vec<Event>]) {
    for events in partitions {
        let mut last: BTreeMap<&str, (usize, String)> = BTreeMap::new();
        for event in events {
            let Some((_, seq)) = event.record() else {
                continue;
            };
            let order = sequence_order(&seq);
            if let Some(before) = last.get(event.key.as_str()) {
                assert!(
                    *before < order,
                    "key {} went from sequence {} back to {seq}",
                    event.key,
                    before.1
                );
            }
            last.insert(&event.key, order);
        }
    }
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

/// A table `orders` with a stream and `seeded` items, and a pipeline from it into Kafka.
fn orders_into_kafka(
    brokers: &str,
    source: &str,
    delivery: &str,
    seeded: usize,
) -> (Arc<Running>, Pipeline, String) {
    let running = Arc::new(Emulator::Dynoxide.start());
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let mut seed = Writer::new(27, seeded.max(1));
    let items: Vec<_> = (0..seeded)
        .map(|i| seed.random_item(&format!("k{i:03}")))
        .collect();
    if !items.is_empty() {
        running.put_items("orders", items);
    }
    let topic = fresh_topic("orders");
    let positions = fresh_topic("positions");
    // Its own name: tests running at once must not share a transactional.id.
    let name = topic.clone();
    let pipeline = Pipeline::new(&name, &running.endpoint, source);
    let state = if delivery == "at_least_once" {
        format!(
            "state:\n  path: {}\n  flush_interval_ms: 0\n",
            pipeline.state.display()
        )
    } else {
        String::new()
    };
    pipeline.write_with_sink(
        &name,
        &running.endpoint,
        source,
        &format!(
            "{}{state}",
            kafka_sink(brokers, &topic, &positions, delivery, "")
        ),
    );
    (running, pipeline, topic)
}

/// Runs the pipeline under a writer, SIGKILLs it `kills` times at random points, then lets a
/// last run finish; returns the topic's committed view.
fn killed_then_committed(
    brokers: &str,
    running: &Arc<Running>,
    pipeline: &Pipeline,
    topic: &str,
    kills: usize,
    seed: u64,
) -> Vec<Vec<Event>> {
    killed_under_writes(running, pipeline, kills, seed, 300..2500);
    committed(brokers, topic)
}

const STREAMS: &str = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                       value_format: typed\nbatch_size: 20\nidle_termination_secs: 2";

/// §7.7 rule 3: a streams pipeline SIGKILLed at random points under a writer delivers every
/// stream record exactly once to a committed reader, in order per key, and replaying the events
/// gives the table.
#[test]
fn a_streams_pipeline_killed_anywhere_delivers_every_change_exactly_once() {
    let brokers = brokers();
    let (running, pipeline, topic) = orders_into_kafka(&brokers, STREAMS, "exactly_once", 0);
    let view = killed_then_committed(&brokers, &running, &pipeline, &topic, 6, 0x27);
    let delivered = change_records(&view);
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let expected = stream_records(&running);
    let got: BTreeSet<_> = delivered.into_keys().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(&expected).collect();
    assert!(missing.is_empty(), "{} missing: {missing:?}", missing.len());
    assert!(extra.is_empty(), "not in the stream: {extra:?}");
    assert_in_order_per_key(&view);
    assert_eq!(
        replay(&view),
        keyed::table_items(&running.endpoint, "orders")
    );
    // Every delete is followed by its tombstone.
    for events in &view {
        for (i, event) in events.iter().enumerate() {
            if event.op() == Some("d") {
                let next = events.get(i + 1).unwrap();
                assert!(
                    next.key == event.key && next.value.is_none(),
                    "no tombstone after {event:?}"
                );
            }
        }
    }
}

/// §7.7 rule 7: a mirror SIGKILLed at random points emits the snapshot as `op: r` and then the
/// changes, each change once, and replaying them gives the table.
#[test]
fn a_mirror_killed_anywhere_converges_with_each_change_once() {
    let brokers = brokers();
    let source = "table_name: orders\nmode: mirror\nvalue_format: typed\nsegments: 2\n\
                  page_limit: 25\nbatch_size: 20\nidle_termination_secs: 2\n\
                  resnapshot_deletes: false";
    let (running, pipeline, topic) = orders_into_kafka(&brokers, source, "exactly_once", 300);
    let view = killed_then_committed(&brokers, &running, &pipeline, &topic, 5, 0x2727);
    let delivered = change_records(&view);
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    // The writer touches k000..k199 only: every other seeded key is a snapshot row once, or
    // its row was skipped for its insert read beside the snapshot (§7.7 rule 7).
    let mut untouched: BTreeMap<String, usize> = BTreeMap::new();
    for event in view.iter().flatten().filter(|e| e.op() == Some("r")) {
        let pk = pk_of(&event.key);
        if pk.as_str() >= "k200" {
            *untouched.entry(pk).or_insert(0) += 1;
        }
    }
    assert!(untouched.values().all(|n| *n == 1), "{untouched:?}");
    assert_in_order_per_key(&view);
    // Across restarts a row may follow a change of its key only when it was read after it.
    assert_rows_never_behind_changes(&view, true);
    assert_eq!(
        replay(&view),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// Per key, in partition order: a snapshot row (`op: r`) after a change of its key was read
/// at or after the change's time (`source.ts_ms`: a row's read time, a change's creation time,
/// DynamoDB's second). `restarted: false`: a run with no crash, in which no row follows a
/// change of its key at all (§7.7 rule 7).
fn assert_rows_never_behind_changes(partitions: &[Vec<Event>], restarted: bool) {
    for events in partitions {
        let mut changed: BTreeMap<&str, i64> = BTreeMap::new();
        for event in events {
            let Some(value) = &event.value else { continue };
            let ts = value["source"]["ts_ms"].as_i64().unwrap_or_default();
            match event.op() {
                Some("r") => {
                    if let Some(change) = changed.get(event.key.as_str()) {
                        assert!(
                            restarted && ts >= *change,
                            "a row of {} read at {ts} follows its change of {change}",
                            event.key
                        );
                    }
                }
                Some(_) => {
                    changed.insert(&event.key, ts);
                }
                None => {}
            }
        }
    }
}

/// §7.7 rule 7: a mirror reads its snapshot beside the stream. Under a writer, rows of keys
/// whose changes were produced first are held back, no row follows a change of its key, every
/// change is produced once, and replaying the topic gives the table.
#[test]
fn a_mirror_reads_its_snapshot_beside_the_stream_without_a_row_behind_a_change() {
    let brokers = brokers();
    let source = "table_name: orders\nmode: mirror\nvalue_format: typed\nsegments: 1\n\
                  page_limit: 5\nbatch_size: 20\nidle_termination_secs: 2\n\
                  resnapshot_deletes: false";
    let (running, pipeline, topic) = orders_into_kafka(&brokers, source, "exactly_once", 1000);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = common::writer::start_writer(Arc::clone(&running), 0x77, 200, Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(500));
    let mut run = common::spawn_logged(&pipeline, 0);
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writes.join().unwrap();
    let status = run.wait().unwrap();
    let log = std::fs::read_to_string(pipeline.dir.path().join("run-0.log")).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");

    let view = committed(&brokers, &topic);
    // Read beside the stream, the seeded items' inserts (in the stream from its trim horizon)
    // come with the snapshot: the rows of the keys whose insert was produced first are held
    // back. Read after it, every seeded item would be a row.
    let rows = view
        .iter()
        .flatten()
        .filter(|e| e.op() == Some("r"))
        .count();
    assert!(
        rows < 1000,
        "{rows} rows: the stream is read while the table is scanned; {log}"
    );
    assert_rows_never_behind_changes(&view, false);
    let delivered = change_records(&view);
    assert!(delivered.values().all(|n| *n == 1), "each change once");
    let got: BTreeSet<_> = delivered.into_keys().collect();
    assert_eq!(got, stream_records(&running), "every stream record");
    assert_eq!(
        replay(&view),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// §7.7 rule 5: at least once, killed anywhere: no stream record is missing.
#[test]
fn at_least_once_killed_anywhere_loses_nothing() {
    let brokers = brokers();
    let (running, pipeline, topic) = orders_into_kafka(&brokers, STREAMS, "at_least_once", 0);
    let view = killed_then_committed(&brokers, &running, &pipeline, &topic, 4, 0x5);
    let got: BTreeSet<_> = change_records(&view).into_keys().collect();
    let expected = stream_records(&running);
    let missing: Vec<_> = expected.difference(&got).collect();
    assert!(missing.is_empty(), "{} missing: {missing:?}", missing.len());
    assert_eq!(
        replay(&view),
        keyed::table_items(&running.endpoint, "orders")
    );
}

/// §7.7 rules 4 and 9: `state show` reads the position from the positions topic, `check`
/// passes, `state reset` removes it and the next run starts over.
#[test]
fn check_state_show_and_reset_work_on_the_positions_topic() {
    let brokers = brokers();
    let (running, pipeline, topic) = orders_into_kafka(&brokers, STREAMS, "exactly_once", 0);
    running.put_pk("orders", "a", "1");
    running.put_pk("orders", "b", "2");
    let output = pipeline.ddbpipe(&["check"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("PASS sink"), "{}", stdout(&output));
    assert!(
        stdout(&output).contains("/check' may be used"),
        "the transactional ids are probed: {}",
        stdout(&output)
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        !pipeline.state.exists(),
        "exactly_once writes no state file"
    );
    let output = pipeline.ddbpipe(&["state", "show", "--json"]);
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["fingerprint_status"], "match", "{shown}");
    assert!(
        shown["state_file"].as_str().unwrap().contains("kafka"),
        "{shown}"
    );
    // A second run finds nothing new: the position was read back.
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(change_records(&committed(&brokers, &topic)).len(), 2);
    let output = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = pipeline.ddbpipe(&["state", "show", "--json"]);
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["entry"], Value::Null, "{shown}");
    // From the trim horizon again: both changes a second time.
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let again = change_records(&committed(&brokers, &topic));
    assert!(again.values().all(|n| *n == 2), "{again:?}");
}

/// §7.7 rule 6: an item over the client's message size fails the run at once naming its key
/// and the setting; nothing is committed.
#[test]
fn an_item_over_the_message_size_fails_naming_its_key() {
    let brokers = brokers();
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "small", "1");
    running.put_items(
        "orders",
        vec![common::item(vec![
            ("pk", common::s("huge")),
            ("text", common::s(&"x".repeat(5000))),
        ])],
    );
    let topic = fresh_topic("size");
    let pipeline = Pipeline::new("sized", &running.endpoint, STREAMS);
    pipeline.write_with_sink(
        "sized",
        &running.endpoint,
        STREAMS,
        &kafka_sink(
            &brokers,
            &topic,
            &fresh_topic("size-positions"),
            "exactly_once",
            "  properties:\n    message.max.bytes: '2000'\n",
        ),
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("huge") && err.contains("max.message.bytes"),
        "{err}"
    );
    assert!(change_records(&committed(&brokers, &topic)).is_empty());
}

/// Rule 2 of `client` and §7.7 rule 6: brokers nobody answers on fail the run naming them, and
/// a property's value (a password) never reaches any output.
#[test]
fn brokers_that_do_not_answer_fail_the_run_and_secrets_stay_hidden() {
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let port = ddbpipe_testkit::free_port();
    let brokers = format!("127.0.0.1:{port}");
    let secret = "kafka-hunter2-secret";
    let source = format!("{STREAMS}\nretry: {{max_retries: 1, attempt_timeout_ms: 2000}}");
    let pipeline = Pipeline::new("down", &running.endpoint, &source);
    pipeline.write_with_sink(
        "down",
        &running.endpoint,
        &source,
        &kafka_sink(
            &brokers,
            "t",
            "p",
            "at_least_once",
            &format!(
                "  properties:\n    sasl.username: user\n    sasl.password: '{secret}'\n\
                 state:\n  path: {}\n",
                pipeline.state.display()
            ),
        ),
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains(&brokers), "{err}");
    for args in [
        &["check"][..],
        &["check", "--json"],
        &["state", "show"],
        &["run"],
    ] {
        let output = pipeline.ddbpipe(args);
        let all = format!("{}{}", stdout(&output), stderr(&output));
        assert!(
            !all.contains(secret),
            "{args:?} printed the password: {all}"
        );
    }
}

/// The config rules of §7.7: ddbpipe's own properties, topic names, exactly once over another
/// security protocol, no state file with exactly once.
#[test]
fn the_config_refuses_what_the_sink_cannot_do() {
    let cases = [
        (
            "  properties:\n    transactional.id: mine\n",
            "exactly_once",
            "sink.properties.transactional.id",
        ),
        (
            "  properties:\n    security.protocol: SASL_SSL\n    sasl.mechanism: GSSAPI\n",
            "exactly_once",
            "sink.properties.sasl.mechanism",
        ),
        (
            "  properties:\n    security.protocol: SSL\n    ssl.ca.location: /nonexistent/ca.pem\n",
            "exactly_once",
            "sink.properties.ssl.ca.location",
        ),
        (
            "  topic_config: {partitions: 0}\n",
            "exactly_once",
            "sink.topic_config.partitions",
        ),
        ("state:\n  path: s.json\n", "exactly_once", "state.path"),
    ];
    for (extra, delivery, field) in cases {
        let pipeline = Pipeline::new("bad", "http://127.0.0.1:1", "table_name: orders");
        pipeline.write_with_sink(
            "bad",
            "http://127.0.0.1:1",
            "table_name: orders\nmode: streams",
            &kafka_sink("127.0.0.1:9092", "t", "p", delivery, extra),
        );
        let output = pipeline.ddbpipe(&["run"]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(field), "{extra}: {err}");
    }
    let pipeline = Pipeline::new("bad", "http://127.0.0.1:1", "table_name: orders");
    pipeline.write_with_sink(
        "bad",
        "http://127.0.0.1:1",
        "table_name: orders\nmode: streams",
        &kafka_sink("127.0.0.1:9092", "orders/{table}", "p", "exactly_once", ""),
    );
    let err = stderr(&pipeline.ddbpipe(&["run"]));
    assert!(err.contains("sink.topic") && err.contains("'/'"), "{err}");
}

/// §7.7 rules 3 and 6: a second run of the pipeline fences the first (the same
/// `transactional.id`): the first run's next batch is refused, it stops with exit 1 saying
/// another worker took over, and no record is committed twice.
#[test]
fn a_second_run_fences_the_first() {
    let brokers = brokers();
    let source = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                  value_format: typed\nfollow: true";
    let (running, first, topic) = orders_into_kafka(&brokers, source, "exactly_once", 0);
    running.put_pk("orders", "a", "1");
    let mut child = common::spawn_run(&first.config);
    let delivered = common::wait_for(Duration::from_secs(30), || {
        change_records(&committed(&brokers, &topic)).len() == 1
    });
    if !delivered {
        child.kill().unwrap();
        let output = child.wait_with_output().unwrap();
        panic!(
            "the first run delivered nothing: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // The second run of the same pipeline: it reads the first's position and takes over.
    let second = Pipeline::new("second", &running.endpoint, STREAMS);
    std::fs::copy(&first.config, &second.config).unwrap();
    let text = std::fs::read_to_string(&second.config)
        .unwrap()
        .replace("follow: true", "idle_termination_secs: 2");
    std::fs::write(&second.config, text).unwrap();
    let output = second.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The first run's next batch is refused.
    running.put_pk("orders", "b", "2");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!(
                "the fenced run went on: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("another worker took over"), "{err}");
    let delivered = change_records(&committed(&brokers, &topic));
    assert!(delivered.values().all(|n| *n == 1), "{delivered:?}");
}

/// A stream named by `stream_arn` still has its table described: the messages need its key
/// (docs/sinks.md §7.8).
#[test]
fn a_configured_stream_arn_still_keys_the_messages() {
    let brokers = brokers();
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let described = rt()
        .block_on(running.client.describe_table().table_name("orders").send())
        .unwrap();
    let arn = described
        .table()
        .unwrap()
        .latest_stream_arn()
        .unwrap()
        .to_string();
    let source = format!("{STREAMS}\nstream_arn: '{arn}'");
    let topic = fresh_topic("arn");
    let pipeline = Pipeline::new(&topic, &running.endpoint, &source);
    pipeline.write_with_sink(
        &topic,
        &running.endpoint,
        &source,
        &kafka_sink(
            &brokers,
            &topic,
            &fresh_topic("arn-positions"),
            "exactly_once",
            "",
        ),
    );
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let view = committed(&brokers, &topic);
    let keys: Vec<&str> = view.iter().flatten().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [r#"{"pk":{"S":"a"}}"#]);
}

/// §7.7 rule 1 and rule 9: an existing positions topic that is not compacted is refused by the
/// run at once (no retries) naming it, and `check` fails on it the same way; nothing is
/// written.
#[test]
fn a_positions_topic_that_is_not_compacted_is_refused_by_run_and_check() {
    let brokers = brokers();
    let running = Emulator::Dynoxide.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let topic = fresh_topic("uncompacted");
    let positions = fresh_topic("uncompacted-positions");
    let connection = ddbpipe_kafka::client::Connection {
        brokers: brokers.clone(),
        properties: Vec::new(),
        timeout: Duration::from_secs(30),
        msk_iam: None,
    };
    // Made as a data topic: cleanup.policy stays the broker's default (delete).
    rt().block_on(connection.ensure_topic(&positions, Default::default(), false))
        .unwrap();
    let pipeline = Pipeline::new(&topic, &running.endpoint, STREAMS);
    pipeline.write_with_sink(
        &topic,
        &running.endpoint,
        STREAMS,
        &kafka_sink(&brokers, &topic, &positions, "exactly_once", ""),
    );
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&positions) && err.contains("not compacted") && !err.contains("attempts"),
        "{err}"
    );
    let output = pipeline.ddbpipe(&["check"]);
    let out = stdout(&output);
    assert_ne!(output.status.code(), Some(0), "{out}");
    assert!(
        out.contains("FAIL sink") && out.contains("not compacted"),
        "{out}"
    );
    assert!(change_records(&committed(&brokers, &topic)).is_empty());
}

/// The messages' shape is part of the position's identity: a run with another envelope does
/// not continue a position whose messages had the first one (docs/state.md §6.2).
#[test]
fn another_envelope_does_not_continue_the_position() {
    let brokers = brokers();
    let (running, pipeline, _topic) = orders_into_kafka(&brokers, STREAMS, "exactly_once", 0);
    running.put_pk("orders", "a", "1");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&pipeline.config).unwrap();
    std::fs::write(
        &pipeline.config,
        text.replace(
            "  delivery: exactly_once\n",
            "  delivery: exactly_once\n  envelope: ddbpipe\n",
        ),
    )
    .unwrap();
    let output = run(&pipeline);
    let err = stderr(&output);
    assert_ne!(output.status.code(), Some(0), "{err}");
    assert!(err.contains("sink_path"), "{err}");
}

/// docs/coordination.md §11.13: two workers with `coordination:` write one topic, each shard
/// exactly once through a producer of its own. Under a writer, the shard's owner is
/// SIGSTOPped past its 3 s lease; the other takes the shard, and its producer fences the
/// stopped one's (whose open transaction the broker aborts). Continued, the zombie's next
/// transaction is refused and it hands the shard back. The topic's committed view then holds
/// every stream record once, in order per key, and replays to the table.
/// Two workers follow one stream into one topic with `delivery` under a writer; the shard's
/// owner is SIGSTOPped past its 3 s lease, the other takes the shard, the stopped one is
/// What became of two workers' run through a stop (`two_workers_through_a_stop_past_the_lease`).
struct Stopped {
    running: Arc<Running>,
    pipeline: Pipeline,
    /// The stream's records, read independently.
    expected: BTreeSet<(String, String)>,
    /// The topic's committed view once it holds them all.
    view: Vec<Vec<Event>>,
}

/// continued (the stopped one must log the lost lease).
fn two_workers_through_a_stop_past_the_lease(delivery: &str) -> Stopped {
    let brokers = brokers();
    let source = "table_name: orders\nmode: streams\nstart_position: trim_horizon\n\
                  value_format: typed\nbatch_size: 20\nfollow: true\npoll_interval_ms: 100";
    let (running, pipeline, topic) = orders_into_kafka(&brokers, source, delivery, 0);
    let mut yaml = std::fs::read_to_string(&pipeline.config).unwrap();
    if delivery == "exactly_once" {
        // (`at_least_once` has its `state:` from `orders_into_kafka`.)
        yaml.push_str("state:\n  flush_interval_ms: 0\n");
    }
    yaml.push_str("coordination:\n  lease_table: ddbpipe-leases\n  lease_duration_secs: 3\n");
    std::fs::write(&pipeline.config, yaml).unwrap();
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = common::writer::start_writer(Arc::clone(&running), 0x1913, 60, Arc::clone(&stop));
    let mut workers: Vec<_> = (0..2)
        .map(|_| common::spawn_run(&pipeline.config))
        .collect();
    // (The topic is not read while the writer writes: the committed view's read follows
    // what is appended while it reads.)
    let owned = common::wait_for(Duration::from_secs(60), || {
        common::shard_lease(&pipeline.config).is_some_and(|lease| {
            lease["owner"].is_string()
                && lease["checkpoint"]
                    .as_str()
                    .is_some_and(|at| at.starts_with("after:"))
        })
    });
    assert!(owned, "a worker reads the shard and commits");
    let first = common::shard_owner(&pipeline.config).unwrap();
    let stopped = common::worker_of(&mut workers, &first).expect("the owner is a worker");
    common::signal(&stopped, "STOP");
    let taken = common::wait_for(Duration::from_secs(30), || {
        common::shard_owner(&pipeline.config).is_some_and(|owner| owner != first)
    });
    assert!(taken, "the other worker takes the shard past the lease");
    std::thread::sleep(Duration::from_secs(2));
    common::signal(&stopped, "CONT");
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writes.join().unwrap();

    let expected = stream_records(&running);
    let caught_up = common::wait_for(Duration::from_secs(60), || {
        let got: BTreeSet<_> = change_records(&committed(&brokers, &topic))
            .into_keys()
            .collect();
        got.is_superset(&expected)
    });
    workers.push(stopped);
    let mut said = String::new();
    for worker in workers {
        common::signal(&worker, "TERM");
        let output = common::finished(worker);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        said.push_str(&stderr(&output));
    }
    assert!(caught_up, "every stream record reaches the topic: {said}");
    assert!(
        said.contains("Lease lost"),
        "the stopped worker learns it lost the shard: {said}"
    );
    let view = committed(&brokers, &topic);
    Stopped {
        running,
        pipeline,
        expected,
        view,
    }
}

/// docs/coordination.md §11.13, `exactly_once`: the stopped owner's late transaction is
/// fenced; every stream record is in the committed view once, in order per key.
#[test]
fn two_workers_write_one_topic_exactly_once_through_a_stop_past_the_lease() {
    let Stopped {
        running,
        pipeline,
        expected,
        view,
    } = two_workers_through_a_stop_past_the_lease("exactly_once");
    let delivered = change_records(&view);
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let got: BTreeSet<_> = delivered.into_keys().collect();
    assert_eq!(got, expected, "every stream record once, nothing else");
    assert_in_order_per_key(&view);
    assert_eq!(
        replay(&view),
        keyed::table_items(&running.endpoint, "orders")
    );
    // `state reset` forgets the unit's position with the lease rows.
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert!(
        stdout(&reset).contains("removed 1 unit position(s)"),
        "{}",
        stdout(&reset)
    );
}

/// docs/coordination.md §11.13, `at_least_once`: the positions live in the lease rows; around
/// the hand-over records may come twice, none is missing, nothing outside the stream is sent,
/// and `state reset` deletes the lease rows (no positions topic is written).
#[test]
fn two_workers_write_one_topic_at_least_once_through_a_stop_past_the_lease() {
    let Stopped {
        pipeline,
        expected,
        view,
        ..
    } = two_workers_through_a_stop_past_the_lease("at_least_once");
    let got: BTreeSet<_> = change_records(&view).into_keys().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    assert!(missing.is_empty(), "{} missing: {missing:?}", missing.len());
    let extra: Vec<_> = got.difference(&expected).collect();
    assert!(extra.is_empty(), "not in the stream: {extra:?}");
    let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert!(
        !stdout(&reset).contains("unit position"),
        "{}",
        stdout(&reset)
    );
    assert!(
        common::shard_lease(&pipeline.config).is_none(),
        "the lease rows are gone"
    );
}

/// §7.7 rule 4, `msk_iam` from the CLI: a broker of the test's own behind a listener that
/// takes only SASL OAUTHBEARER with an MSK IAM token of `us-east-1` (the source's region, the
/// default) — as MSK Serverless takes nothing else. `check` reads the topics and proves the
/// transactional ids through it, a scan is delivered exactly once, `state show` reads the
/// position back and a second run finds the scan done; every token the listener was given is
/// signed with the run's AWS credentials (judged by botocore), and none is printed.
#[test]
fn msk_iam_authenticates_check_run_and_state_with_the_runs_credentials() {
    use ddbpipe_testkit::free_port;
    use ddbpipe_testkit::kafka_front::{Accepts, broker, msk_token_signed_by};
    let (plain, sasl) = (free_port(), free_port());
    let _broker = broker(plain, sasl);
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepts = Accepts::Bearer {
        region: "us-east-1",
        tokens: Arc::clone(&tokens),
    };
    rt().block_on(ddbpipe_testkit::kafka_front::sasl_listener(
        sasl, plain, accepts,
    ));
    let address = format!("127.0.0.1:{sasl}");
    let (running, pipeline, topic) =
        orders_into_kafka(&address, "table_name: orders", "exactly_once", 0);
    for i in 0..30 {
        running.put_pk("orders", &format!("m{i:02}"), &i.to_string());
    }
    let positions = fresh_topic("positions");
    pipeline.write_with_sink(
        &topic,
        &running.endpoint,
        "table_name: orders\nvalue_format: typed",
        &kafka_sink(
            &address,
            &topic,
            &positions,
            "exactly_once",
            "  msk_iam: {}\n  properties: {security.protocol: SASL_PLAINTEXT}\n",
        ),
    );
    let check = pipeline.ddbpipe(&["check"]);
    let said = format!("{}{}", stdout(&check), stderr(&check));
    assert_eq!(check.status.code(), Some(0), "{said}");
    assert!(
        said.contains("PASS sink")
            && said.contains("(MSK IAM, us-east-1)")
            && said.contains("/check' may be used"),
        "{said}"
    );
    let output = run(&pipeline);
    let ran = format!("{}{}", stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(0), "{ran}");
    let shown = pipeline.ddbpipe(&["state", "show", "--json"]);
    let entry: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(entry["entry"]["last_completed"]["items"], 30, "{entry}");

    // The topic, read through the listener with a token of the same credentials.
    let delivered = rt().block_on(async {
        use aws_credential_types::Credentials;
        use aws_credential_types::provider::SharedCredentialsProvider;
        use ddbpipe_kafka::log::{LogReader, Security};
        let credentials = Credentials::new("testing", "testing", None, None, "test");
        let msk_iam = ddbpipe_kafka::msk_iam::MskIam::new(
            "us-east-1",
            SharedCredentialsProvider::new(credentials),
        );
        let properties = [
            (
                "security.protocol".to_string(),
                "SASL_PLAINTEXT".to_string(),
            ),
            ("sasl.mechanism".to_string(), "OAUTHBEARER".to_string()),
        ];
        let security = Security::of(&properties, Some(&msk_iam)).unwrap();
        let reader = LogReader::new(&address, Duration::from_secs(30)).with_security(security);
        let mut keys = Vec::new();
        for partition in reader.partitions(&topic).await.unwrap().unwrap() {
            let view = reader.committed(&topic, partition).await.unwrap();
            keys.extend(
                view.records
                    .into_iter()
                    .map(|r| pk_of(std::str::from_utf8(&r.key.unwrap()).unwrap())),
            );
        }
        keys
    });
    let unique: BTreeSet<&String> = delivered.iter().collect();
    assert_eq!(delivered.len(), 30, "each item once: {delivered:?}");
    assert_eq!(unique.len(), 30);

    let again = run(&pipeline);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens.len() >= 4, "{} tokens", tokens.len());
    for token in &tokens {
        assert!(msk_token_signed_by(token, "testing", "testing"));
        for text in [&said, &ran] {
            assert!(
                !text.contains(token.as_str()),
                "a token was printed: {text}"
            );
        }
    }
}
