//! `mode: streams` end to end through the CLI on both emulators (docs/testing.md §10 scenarios 6, 19).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, StreamViewType};
use serde_json::{Value, json};

use common::{Emulator, Pipeline, rt, stderr};

fn delete(running: &common::Running, table: &str, pk: &str) {
    let request = running
        .client
        .delete_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.into()));
    rt().block_on(request.send()).unwrap();
}

const STREAMS: &str = "table_name: orders\nmode: streams\nidle_termination_secs: 2";

fn inserts_updates_and_deletes_become_exact_envelopes_and_a_rerun_emits_only_new_changes(
    emulator: Emulator,
) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    running.put_pk("orders", "b", "1");
    running.put_pk("orders", "a", "2");
    delete(&running, "orders", "b");
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    let ops: Vec<&str> = records.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["c", "c", "u", "d"]);
    assert_eq!(records[0]["after"], json!({"pk": "a", "v": 1}));
    assert_eq!(records[0]["before"], Value::Null);
    assert_eq!(records[2]["before"], json!({"pk": "a", "v": 1}));
    assert_eq!(records[2]["after"], json!({"pk": "a", "v": 2}));
    assert_eq!(records[3]["after"], Value::Null);
    assert_eq!(records[3]["before"], json!({"pk": "b", "v": 1}));
    for record in &records {
        assert_eq!(record["document_key"], record["key"]);
        assert_eq!(record["table"], "orders");
        assert!(!record["event_name"].as_str().unwrap().is_empty());
        assert_eq!(record["stream_view_type"], "NEW_AND_OLD_IMAGES");
        let keys: Vec<&String> = record.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "after",
                "before",
                "document_key",
                "event_id",
                "event_name",
                "key",
                "op",
                "sequence_number",
                "shard_id",
                "size_bytes",
                "stream_view_type",
                "table",
                "ts_ms",
                "user_identity"
            ]
        );
    }
    let lines = pipeline.lines();
    assert!(
        lines[0]
            .starts_with(r#"{"after":{"pk":"a","v":1},"before":null,"document_key":{"pk":"a"},"#),
        "{}",
        lines[0]
    );

    // One more change: a rerun emits exactly it.
    running.put_pk("orders", "c", "7");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    assert_eq!(records.len(), 5, "exactly one more record");
    assert_eq!(records[4]["op"], "c");
    assert_eq!(records[4]["key"], json!({"pk": "c"}));
}

fn follow_stops_on_sigterm_with_the_position_covering_what_was_written(emulator: Emulator) {
    follow_stops_on(emulator, "TERM");
}

/// Issue 9 item 12: SIGHUP (a closed terminal or ssh session) drains like SIGTERM instead of
/// killing the process.
fn follow_stops_on_sighup_like_on_sigterm(emulator: Emulator) {
    follow_stops_on(emulator, "HUP");
}

fn follow_stops_on(emulator: Emulator, signal: &str) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..20 {
        running.put_pk("orders", &format!("k{i:02}"), "1");
    }
    let pipeline = Pipeline::new(
        "orders-cdc",
        &running.endpoint,
        "table_name: orders\nmode: streams\nfollow: true\nbatch_size: 7",
    );
    let mut child = common::spawn_run(&pipeline.config);
    assert!(
        common::wait_for(Duration::from_secs(60), || pipeline.lines().len() >= 20),
        "the run caught up"
    );
    // Keep writing while it follows, then stop it.
    for i in 20..30 {
        running.put_pk("orders", &format!("k{i:02}"), "1");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "a signal in a streaming phase exits 0"
    );
    let written = pipeline.records();
    let entry = pipeline.entry("orders-cdc").unwrap();
    let stored: Vec<String> = entry["position"]["shards"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let last_written = written.last().unwrap()["sequence_number"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        stored.contains(&last_written),
        "the position covers exactly the written records: {stored:?} vs {last_written}"
    );

    // The next run neither loses nor repeats, and reports no gap.
    running.put_pk("orders", "after", "1");
    pipeline.write("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let all = pipeline.records();
    let keys: Vec<&str> = all
        .iter()
        .map(|r| r["key"]["pk"].as_str().unwrap())
        .collect();
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 31, "every change once: {keys:?}");
    assert_eq!(keys.len(), 31, "nothing repeated");
    assert_eq!(*keys.last().unwrap(), "after");
}

fn a_following_run_serves_prometheus_metrics(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..5 {
        running.put_pk("orders", &format!("k{i}"), "1");
    }
    let pipeline = Pipeline::new(
        "orders-cdc",
        &running.endpoint,
        "table_name: orders\nmode: streams\nfollow: true",
    );
    let port = ddbpipe_testkit::free_port();
    let address = format!("127.0.0.1:{port}");
    let child = common::spawn_run_with(&pipeline.config, &["--metrics-addr", &address]);
    assert!(
        common::wait_for(Duration::from_secs(60), || pipeline.lines().len() >= 5),
        "caught up"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let scrape = || common::scrape_metrics(port);
    let body = scrape();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(0));
    // A series: its name, its labels (in any order), and optionally its value.
    let has = |name: &str, labels: &[&str], value: Option<&str>| {
        body.lines().any(|line| {
            line.starts_with(&format!("{name}{{"))
                && line.contains("pipeline=\"orders-cdc\"")
                && labels.iter().all(|label| line.contains(label))
                && value.is_none_or(|v| line.ends_with(&format!(" {v}")))
        })
    };
    let expected: [(&str, &[&str], Option<&str>); 7] = [
        (
            "ddbpipe_records_read_total",
            &["kind=\"change\""],
            Some("5"),
        ),
        ("ddbpipe_records_written_total", &["op=\"c\""], Some("5")),
        (
            "ddbpipe_requests_total",
            &["operation=\"get_records\"", "outcome=\"ok\""],
            None,
        ),
        ("ddbpipe_batches_committed_total", &[], None),
        ("ddbpipe_shards", &["state=\"active\""], None),
        ("ddbpipe_source_lag_seconds", &[], None),
        ("ddbpipe_checkpoint_age_seconds", &[], None),
    ];
    for (name, labels, value) in expected {
        assert!(
            has(name, labels, value),
            "missing {name} {labels:?} {value:?} in:\n{body}"
        );
    }
}

/// Issue 24 item 18: `/health` of a run following a stream with nothing new answers 200
/// `idle` past the stall bound (its reads answer), not 503: a quiet stream is healthy.
fn a_quiet_stream_is_idle_and_healthy_past_the_stall_bound(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let pipeline = Pipeline::new(
        "orders-cdc",
        &running.endpoint,
        "table_name: orders\nmode: streams\nfollow: true",
    );
    let mut yaml = std::fs::read_to_string(&pipeline.config).unwrap();
    yaml.push_str("metrics:\n  health_stall_secs: 4\n");
    std::fs::write(&pipeline.config, yaml).unwrap();
    let port = ddbpipe_testkit::free_port();
    let address = format!("127.0.0.1:{port}");
    let child = common::spawn_run_with(&pipeline.config, &["--metrics-addr", &address]);
    let answered = common::wait_for(Duration::from_secs(60), || common::health(port).is_some());
    // Past the bound, the stream's empty reads still count as progress.
    std::thread::sleep(Duration::from_secs(6));
    let health = common::health(port);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let output = child.wait_with_output().unwrap();
    assert!(answered, "{}", String::from_utf8_lossy(&output.stderr));
    let (status, body) = health.expect("/health answers");
    assert_eq!((status, &body["state"]), (200, &"idle".into()), "{body}");
    assert!(body["last_progress_secs"].as_f64().unwrap() < 4.0, "{body}");
    assert_eq!(body["stall_secs"], 4, "{body}");
    assert_eq!(output.status.code(), Some(0));
}

/// Issue 11: a run that ends writes its final metrics to `--metrics-file` (Prometheus text,
/// for the textfile collector), every metric described, every request kind counted.
fn a_run_writes_its_final_metrics_to_a_file_every_request_kind_counted(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let (first, _) = pipeline.run_with_metrics_file();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    // A later run probes the stored position before reading: GetShardIterator is counted too.
    running.put_pk("orders", "b", "1");
    let (output, text) = pipeline.run_with_metrics_file();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for expected in [
        "# HELP ddbpipe_requests_total",
        "# HELP ddbpipe_records_written_total",
        "operation=\"describe_table\"",
        "operation=\"describe_stream\"",
        "operation=\"get_shard_iterator\"",
        "operation=\"get_records\"",
        "pipeline=\"orders-cdc\"",
    ] {
        assert!(text.contains(expected), "missing {expected} in:\n{text}");
    }
}

/// Issue 11: a streams run shows its change records, shards and lag as it goes (here as
/// lines: `--progress always` with stderr not a terminal).
fn a_streams_run_shows_its_records_shards_and_lag(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "always"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.lines()
            .any(|l| l.starts_with("streaming: 1 change records")
                && l.contains("shards ")
                && l.contains(" finished")),
        "{err}"
    );
}

/// Issue 31 item 1: a quiet shard is read ever less often (docs/streams.md §4.8, "What an idle
/// shard costs"), and the summary and the metrics say what the reads cost per shard-hour. With
/// a 200 ms poll, 8 s of idleness cost about 18,000 `GetRecords` a shard-hour without the
/// backoff; backing off to 1 s, about a third of that.
fn an_idle_run_says_what_its_shard_reads_cost(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new(
        "orders-cdc",
        &running.endpoint,
        "table_name: orders\nmode: streams\nidle_termination_secs: 8\npoll_interval_ms: 200\n\
         max_idle_poll_ms: 1000",
    );
    let (output, text) = pipeline.run_with_metrics_file();
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    let rate: f64 = said
        .split(" GetRecords per shard-hour")
        .next()
        .and_then(|before| before.rsplit(", ").next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no request rate in the summary: {said}"));
    assert!(
        (1000.0..9000.0).contains(&rate),
        "{rate} GetRecords per shard-hour: {said}"
    );
    assert!(
        text.contains("# HELP ddbpipe_get_records_per_shard_hour")
            && text.contains("ddbpipe_get_records_per_shard_hour{"),
        "{text}"
    );
}

fn a_recreated_stream_with_on_gap_resnapshot_scans_the_table_then_streams_from_the_capture(
    emulator: Emulator,
) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(pipeline.records().len(), 1);
    let old_arn = pipeline.entry("orders-cdc").unwrap()["position"]["stream_arn"].clone();

    // The table (and so its stream) is re-created: the stored position belongs to a dead stream.
    rt().block_on(running.client.delete_table().table_name("orders").send())
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for pk in ["x", "y", "z"] {
        running.put_pk("orders", pk, "2");
    }
    let state_before = std::fs::read(&pipeline.state).unwrap();
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("cannot resume table 'orders' without losing changes"),
        "{err}"
    );
    assert!(err.contains("the position belongs to stream"), "{err}");
    assert!(err.contains("on_gap: resnapshot"), "{err}");
    assert_eq!(
        std::fs::read(&pipeline.state).unwrap(),
        state_before,
        "state unchanged"
    );
    // Issue 9 item 6: `lag` and `check` see the re-created stream as the run does.
    let output = pipeline.ddbpipe(&["lag", "--json", "--max-lag-seconds", "5"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert_eq!(report["lag_seconds"], Value::Null, "{report}");
    let why = report["error"].as_str().unwrap_or_default();
    assert!(why.contains("the position belongs to stream"), "{report}");
    let output = pipeline.ddbpipe(&["check", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1), "{report}");
    let state = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "state")
        .unwrap();
    assert_eq!(state["status"], "FAIL", "{report}");
    let detail = state["detail"].as_str().unwrap();
    assert!(
        detail.contains("the position belongs to stream"),
        "{detail}"
    );
    assert!(detail.contains("on_gap: fail"), "{detail}");
    assert_eq!(std::fs::read(&pipeline.state).unwrap(), state_before);

    pipeline.write(
        "orders-cdc",
        &running.endpoint,
        &format!("{STREAMS}\non_gap: resnapshot\nresnapshot_deletes: false"),
    );
    let state_probe = |pipeline: &Pipeline| {
        let output = pipeline.ddbpipe(&["check", "--json"]);
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        let probe = report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "state")
            .unwrap()
            .clone();
        (
            probe["status"].as_str().unwrap().to_string(),
            probe["detail"].as_str().unwrap().to_string(),
        )
    };
    let (status, detail) = state_probe(&pipeline);
    assert_eq!(status, "WARN", "{detail}");
    assert!(
        detail.contains("the next run applies on_gap: resnapshot"),
        "{detail}"
    );
    // With a snapshot open the run fails on the gap whatever on_gap says: so does check.
    let mut state: Value = serde_json::from_slice(&state_before).unwrap();
    state["pipelines"]["orders-cdc"]["position"]["snapshot"] = serde_json::json!({
        "captured_at": 1, "complete": false, "cursors": {}, "destination_rows_at_start": 0,
        "done": [], "gap_reasons": [], "id": 1000, "keys_written": 0, "reason": "mirror",
        "total_segments": 1});
    std::fs::write(&pipeline.state, serde_json::to_vec(&state).unwrap()).unwrap();
    let (status, detail) = state_probe(&pipeline);
    assert_eq!(status, "FAIL", "{detail}");
    assert!(
        detail.contains("a snapshot is open, so the run fails on this gap"),
        "{detail}"
    );
    std::fs::write(&pipeline.state, &state_before).unwrap();
    pipeline.write(
        "orders-cdc",
        &running.endpoint,
        &format!("{STREAMS}\non_gap: resnapshot\nresnapshot_deletes: false\nsegments: 2"),
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    let snapshot: Vec<&Value> = records.iter().filter(|r| r["op"] == "r").collect();
    let mut keys: Vec<&str> = snapshot
        .iter()
        .map(|r| r["key"]["pk"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["x", "y", "z"],
        "the snapshot holds the table's items"
    );
    for row in &snapshot {
        assert_eq!(row["event_name"], "SNAPSHOT");
        assert_eq!(row["document_key"], row["key"]);
        assert_eq!(row["after"]["v"], 2);
        assert_eq!(row["sequence_number"], Value::Null);
    }
    let first_change = records
        .iter()
        .position(|r| r["op"] == "c" && r["key"]["pk"] != "a")
        .unwrap();
    let last_snapshot = records.iter().rposition(|r| r["op"] == "r").unwrap();
    assert!(
        last_snapshot < first_change,
        "the stream is read after the snapshot"
    );
    let changes: Vec<&str> = records[first_change..]
        .iter()
        .map(|r| r["key"]["pk"].as_str().unwrap())
        .collect();
    assert_eq!(
        changes,
        ["x", "y", "z"],
        "streamed from the capture: the new stream's changes"
    );
    let entry = pipeline.entry("orders-cdc").unwrap();
    assert_eq!(
        entry["position"]["snapshot"],
        Value::Null,
        "the snapshot is closed"
    );
    assert_ne!(entry["position"]["stream_arn"], old_arn);
}

/// Issue 9 item 5: `stream_arn` set to the stream the stored position already reads (the
/// remedy the disabled-stream error names) is not a change of source; another ARN is.
fn setting_stream_arn_to_the_stream_the_position_reads_is_not_a_change(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let arn = pipeline.entry("orders-cdc").unwrap()["position"]["stream_arn"]
        .as_str()
        .unwrap()
        .to_string();

    running.put_pk("orders", "b", "1");
    pipeline.write(
        "orders-cdc",
        &running.endpoint,
        &format!("{STREAMS}\nstream_arn: \"{arn}\""),
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = pipeline.records();
    assert_eq!(records.len(), 2, "the rerun emits exactly the new change");
    assert_eq!(records[1]["key"], json!({"pk": "b"}));

    // Back to the table's stream (the same one): not a change either.
    running.put_pk("orders", "c", "1");
    pipeline.write("orders-cdc", &running.endpoint, STREAMS);
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(pipeline.records().len(), 3);

    // Another stream is a change of source, refused before anything is read.
    let other = format!("{arn}-other");
    pipeline.write(
        "orders-cdc",
        &running.endpoint,
        &format!("{STREAMS}\nstream_arn: \"{other}\""),
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("stream_arn changed from"),
        "{}",
        stderr(&output)
    );
}

on_both_emulators!(
    a_recreated_stream_with_on_gap_resnapshot_scans_the_table_then_streams_from_the_capture,
    setting_stream_arn_to_the_stream_the_position_reads_is_not_a_change,
    a_run_writes_its_final_metrics_to_a_file_every_request_kind_counted,
    a_streams_run_shows_its_records_shards_and_lag,
    an_idle_run_says_what_its_shard_reads_cost,
    a_following_run_serves_prometheus_metrics,
    a_quiet_stream_is_idle_and_healthy_past_the_stall_bound,
    inserts_updates_and_deletes_become_exact_envelopes_and_a_rerun_emits_only_new_changes,
    follow_stops_on_sigterm_with_the_position_covering_what_was_written,
    follow_stops_on_sighup_like_on_sigterm,
);
