//! `ddbpipe lag` and the streams probes of `ddbpipe check` on both emulators (docs/streams.md §4.11,
//! §8.2 item 3, §10 scenario 20 as far as the emulators and the jsonl sink allow).
//!
//! Scenario 20 fails `stream_view_type` for a `KEYS_ONLY` stream with a sqlite sink. Keyed
//! sinks do not exist yet, so a jsonl pipeline gets the WARN (docs/streams.md §4.2: jsonl takes any view)
//! and the FAIL is shown with `mode: mirror`, the other case that needs new images.
//!
//! The emulators cannot throttle or refuse a stream call, so `scripted` drives the same binary
//! against a scripted endpoint for those paths (several shards, retries, an unknown value).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
// Shared with `faults.rs`; only its answer builders and its binary runner are used here.
#[allow(dead_code)]
mod fake_dynamodb;

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use serde_json::Value;

use common::{Emulator, Pipeline, stderr, stdout};

const STREAMS: &str = "table_name: orders\nmode: streams\nidle_termination_secs: 2";

/// `check --json`: the exit code and the probes by name.
fn check(pipeline: &Pipeline) -> (Option<i32>, Value) {
    let output = pipeline.ddbpipe(&["check", "--json"]);
    let report: Value = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("check --json prints JSON ({e}): {}", stderr(&output)));
    (output.status.code(), report)
}

fn probe<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no probe {name} in {report}"))
}

/// `lag --json` plus extra flags: the exit code and the parsed report.
fn lag(pipeline: &Pipeline, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = vec!["lag", "--json"];
    args.extend_from_slice(extra);
    let output = pipeline.ddbpipe(&args);
    let report: Value = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("lag --json prints JSON ({e}): {}", stderr(&output)));
    (output.status.code(), report)
}

fn a_keys_only_stream_warns_in_check_for_jsonl_and_fails_for_a_mirror(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::KeysOnly));
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);

    let (code, report) = check(&pipeline);
    assert_eq!(code, Some(0), "warnings do not fail check: {report}");
    assert_eq!(report["ok"], true);
    assert_eq!(probe(&report, "stream")["status"], "PASS", "{report}");
    let view = probe(&report, "stream_view_type");
    assert_eq!(view["status"], "WARN", "{report}");
    let detail = view["detail"].as_str().unwrap();
    assert!(detail.contains("KEYS_ONLY"), "{detail}");
    assert!(detail.contains("no before/after images"), "{detail}");
    let described = probe(&report, "describe_stream");
    assert_eq!(described["status"], "PASS", "{report}");
    assert!(
        described["detail"].as_str().unwrap().contains("status "),
        "{described}"
    );
    let names: Vec<&str> = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("read_capacity") < at("stream"), "{names:?}");
    assert!(at("stream") < at("stream_view_type"), "{names:?}");
    assert!(at("stream_view_type") < at("describe_stream"), "{names:?}");
    assert!(at("describe_stream") < at("sink"), "{names:?}");

    // The keyed-sink FAIL of scenario 20 needs a sqlite sink; mirror mode needs new images too.
    pipeline.write(
        "orders-mirror",
        &running.endpoint,
        "table_name: orders\nmode: mirror\nidle_termination_secs: 2",
    );
    let (code, report) = check(&pipeline);
    assert_eq!(code, Some(1), "{report}");
    let view = probe(&report, "stream_view_type");
    assert_eq!(view["status"], "FAIL", "{report}");
    let detail = view["detail"].as_str().unwrap();
    assert!(
        detail.contains("KEYS_ONLY") && detail.contains("NEW_IMAGE or NEW_AND_OLD_IMAGES"),
        "{detail}"
    );
    // Issue 11: the same remedy as the run's.
    assert!(
        detail.contains("disable and re-enable the stream"),
        "{detail}"
    );
}

fn a_new_and_old_images_stream_passes_check(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);
    let (code, report) = check(&pipeline);
    assert_eq!(code, Some(0), "{report}");
    for name in ["stream", "stream_view_type", "describe_stream"] {
        assert_eq!(probe(&report, name)["status"], "PASS", "{report}");
    }
}

fn a_table_without_a_stream_fails_check_and_run_with_has_no_stream(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", None);
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);

    let (code, report) = check(&pipeline);
    assert_eq!(code, Some(1), "{report}");
    let stream = probe(&report, "stream");
    assert_eq!(stream["status"], "FAIL", "{report}");
    assert!(
        stream["detail"]
            .as_str()
            .unwrap()
            .contains("table 'orders' has no stream"),
        "{stream}"
    );
    assert!(
        report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["name"] != "stream_view_type" && p["name"] != "describe_stream"),
        "no stream, no further stream probes: {report}"
    );

    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("table 'orders' has no stream"),
        "{}",
        stderr(&output)
    );

    let output = pipeline.ddbpipe(&["lag"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("has no stream"),
        "{}",
        stderr(&output)
    );
}

fn lag_is_positive_before_a_run_zero_once_caught_up_and_over_a_zero_limit_while_behind(
    emulator: Emulator,
) {
    let running = emulator.start();
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..3 {
        running.put_pk("orders", &format!("k{i}"), "1");
    }
    // Some emulators round ApproximateCreationDateTime down to the second: wait until the
    // records are surely in the past.
    std::thread::sleep(Duration::from_millis(1600));
    let pipeline = Pipeline::new("orders-cdc", &running.endpoint, STREAMS);

    let (code, report) = lag(&pipeline, &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["phase"], "streaming");
    let behind = report["lag_seconds"].as_f64().unwrap();
    assert!(behind > 0.0, "{report}");
    let shards = report["shards"].as_array().unwrap();
    assert!(!shards.is_empty(), "{report}");
    let worst = shards
        .iter()
        .map(|s| s["lag_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(worst, behind, "the value is the worst shard: {report}");
    let keys: Vec<&String> = report.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["error", "lag_seconds", "phase", "shards"]);

    let (code, report) = lag(&pipeline, &["--max-lag-seconds", "0"]);
    assert_eq!(code, Some(1), "behind with a zero limit: {report}");
    assert!(report["lag_seconds"].as_f64().unwrap() > 0.0, "{report}");

    let output = pipeline.ddbpipe(&["lag", "--max-lag-seconds", "3600"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.starts_with("lag: ") && text.contains(" s (shard "),
        "{text}"
    );

    // The probe consumed nothing and wrote no state: the run still gets every change.
    assert!(pipeline.entry("orders-cdc").is_none(), "lag wrote no state");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(pipeline.records().len(), 3);

    let (code, report) = lag(&pipeline, &["--max-lag-seconds", "0"]);
    assert_eq!(code, Some(0), "caught up: {report}");
    assert_eq!(report["lag_seconds"].as_f64(), Some(0.0), "{report}");
    assert_eq!(report["error"], Value::Null);

    // A new change puts the pipeline behind again.
    running.put_pk("orders", "k9", "1");
    std::thread::sleep(Duration::from_millis(1600));
    let (code, report) = lag(&pipeline, &["--max-lag-seconds", "0"]);
    assert_eq!(code, Some(1), "behind again: {report}");
    assert!(report["lag_seconds"].as_f64().unwrap() > 0.0, "{report}");
}

fn lag_on_a_scan_pipeline_is_a_usage_error(emulator: Emulator) {
    let running = emulator.start();
    running.create_pk_table("orders", None);
    let pipeline = Pipeline::new("orders-scan", &running.endpoint, "table_name: orders");
    let output = pipeline.ddbpipe(&["lag"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lag applies to streams and mirror modes"),
        "{}",
        stderr(&output)
    );
}

on_both_emulators!(
    a_keys_only_stream_warns_in_check_for_jsonl_and_fails_for_a_mirror,
    a_new_and_old_images_stream_passes_check,
    a_table_without_a_stream_fails_check_and_run_with_has_no_stream,
    lag_is_positive_before_a_run_zero_once_caught_up_and_over_a_zero_limit_while_behind,
    lag_on_a_scan_pipeline_is_a_usage_error,
);

/// `lag` and `check` against a scripted DynamoDB + Streams endpoint (wiremock).
mod scripted {
    use std::time::{SystemTime, UNIX_EPOCH};

    use serde_json::{Value, json};
    use wiremock::matchers::{body_partial_json, header, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use crate::fake_dynamodb::{ok, throttle};

    const ARN: &str =
        "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-01-01T00:00:00.000";

    /// An AWS error answer (400).
    fn aws_error(code: &str, message: &str) -> ResponseTemplate {
        crate::fake_dynamodb::aws_error(400, code, message)
    }

    fn target(operation: &str) -> String {
        let service = match operation {
            "DescribeTable" => "DynamoDB_20120810",
            _ => "DynamoDBStreams_20120810",
        };
        format!("{service}.{operation}")
    }

    fn now_secs() -> f64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    /// A `GetRecords` answer with one record created `age_secs` ago.
    fn one_record(age_secs: f64) -> ResponseTemplate {
        ok(json!({
            "Records": [{
                "eventID": "e1",
                "eventName": "INSERT",
                "dynamodb": {
                    "ApproximateCreationDateTime": (now_secs() - age_secs).floor(),
                    "Keys": {"pk": {"S": "a"}},
                    "SequenceNumber": "100000000000000000001",
                    "SizeBytes": 10,
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
            }],
            "NextShardIterator": "it-after",
        }))
    }

    fn no_record(next: &str) -> ResponseTemplate {
        ok(json!({"Records": [], "NextShardIterator": next}))
    }

    struct Endpoint {
        server: MockServer,
        dir: tempfile::TempDir,
    }

    impl Endpoint {
        /// Table `t` with an enabled `NEW_AND_OLD_IMAGES` stream of the given shards, each
        /// answering `GetShardIterator` with `it-<shard>`.
        async fn with_shards(shards: &[&str]) -> Endpoint {
            let endpoint = Endpoint {
                server: MockServer::start().await,
                dir: tempfile::tempdir().unwrap(),
            };
            let table = json!({"Table": {
                "TableName": "t",
                "TableStatus": "ACTIVE",
                "ItemCount": 3,
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
                "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
                "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
                "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"},
                "LatestStreamArn": ARN,
            }});
            endpoint.always("DescribeTable", None, ok(table)).await;
            let listed: Vec<Value> = shards
                .iter()
                .map(|id| json!({"ShardId": id, "SequenceNumberRange": {"StartingSequenceNumber": "100000000000000000001"}}))
                .collect();
            let description = json!({"StreamDescription": {
                "StreamArn": ARN,
                "StreamStatus": "ENABLED",
                "StreamViewType": "NEW_AND_OLD_IMAGES",
                "Shards": listed,
            }});
            endpoint
                .always("DescribeStream", None, ok(description))
                .await;
            for id in shards {
                endpoint
                    .always(
                        "GetShardIterator",
                        Some(json!({"ShardId": id})),
                        ok(json!({"ShardIterator": format!("it-{id}")})),
                    )
                    .await;
            }
            endpoint
        }

        fn mock(operation: &str, body: Option<Value>, response: ResponseTemplate) -> Mock {
            let mock = Mock::given(method("POST")).and(header("x-amz-target", target(operation)));
            match body {
                Some(body) => mock.and(body_partial_json(body)),
                None => mock,
            }
            .respond_with(response)
        }

        /// Answers every matching call, after any limited answers.
        async fn always(&self, operation: &str, body: Option<Value>, response: ResponseTemplate) {
            Self::mock(operation, body, response)
                .with_priority(10)
                .mount(&self.server)
                .await;
        }

        /// Answers the next `times` matching calls.
        async fn next(&self, operation: &str, body: Value, times: u64, response: ResponseTemplate) {
            Self::mock(operation, Some(body), response)
                .up_to_n_times(times)
                .with_priority(1)
                .mount(&self.server)
                .await;
        }

        async fn bodies(&self, operation: &str) -> Vec<Value> {
            let target = target(operation);
            self.server
                .received_requests()
                .await
                .unwrap()
                .iter()
                .filter(|r| {
                    r.headers
                        .get("x-amz-target")
                        .is_some_and(|v| v.as_bytes() == target.as_bytes())
                })
                .map(|r| r.body_json::<Value>().unwrap())
                .collect()
        }

        /// Runs `ddbpipe <args> CONFIG` (a streams pipeline on this endpoint) with a clean
        /// environment: exit code, stdout, stderr.
        async fn ddbpipe(&self, args: &[&str]) -> (Option<i32>, String, String) {
            let config = self.dir.path().join("pipeline.yaml");
            let yaml = format!(
                "name: t-cdc\nsource:\n  table_name: t\n  mode: streams\n  idle_termination_secs: 2\n  \
                 region: us-east-1\n  endpoint_url: {}\n  \
                 credentials: {{type: access_key, config: {{access_key_id: x, secret_access_key: y}}}}\n  \
                 retry: {{max_retries: 2, initial_backoff_ms: 10, max_backoff_ms: 50}}\n\
                 sink: {{type: jsonl, path: {}}}\nstate: {{path: {}}}\n",
                self.server.uri(),
                self.dir.path().join("out.jsonl").display(),
                self.dir.path().join("state.json").display(),
            );
            std::fs::write(&config, yaml).unwrap();
            let mut args = args.to_vec();
            let config = config.display().to_string();
            args.push(&config);
            let outcome = crate::fake_dynamodb::ddbpipe(&args).await;
            (outcome.code, outcome.stdout, outcome.stderr)
        }

        async fn lag_json(&self, extra: &[&str]) -> (Option<i32>, Value) {
            let mut args = vec!["lag", "--json"];
            args.extend_from_slice(extra);
            let (code, out, err) = self.ddbpipe(&args).await;
            let report = serde_json::from_str(out.trim())
                .unwrap_or_else(|e| panic!("lag --json prints JSON ({e}): {out} {err}"));
            (code, report)
        }
    }

    #[tokio::test]
    async fn the_lag_is_the_oldest_first_record_over_all_shards_read_one_record_at_a_time() {
        let endpoint = Endpoint::with_shards(&["shardId-a", "shardId-b"]).await;
        endpoint
            .always(
                "GetRecords",
                Some(json!({"ShardIterator": "it-shardId-a"})),
                one_record(30.0),
            )
            .await;
        endpoint
            .always(
                "GetRecords",
                Some(json!({"ShardIterator": "it-shardId-b"})),
                no_record("it-b2"),
            )
            .await;
        endpoint
            .always(
                "GetRecords",
                Some(json!({"ShardIterator": "it-b2"})),
                no_record("it-b3"),
            )
            .await;

        let (code, report) = endpoint.lag_json(&[]).await;

        assert_eq!(code, Some(0), "{report}");
        let lag = report["lag_seconds"].as_f64().unwrap();
        assert!((30.0..300.0).contains(&lag), "{report}");
        assert_eq!(report["shards"][0]["shard_id"], "shardId-a");
        assert_eq!(report["shards"][0]["lag_seconds"].as_f64(), Some(lag));
        assert_eq!(
            report["shards"][1],
            json!({"lag_seconds": 0.0, "shard_id": "shardId-b"})
        );
        let reads = endpoint.bodies("GetRecords").await;
        assert_eq!(
            reads.len(),
            3,
            "one read of a, two empty reads of b: {reads:?}"
        );
        assert!(reads.iter().all(|r| r["Limit"] == 1), "{reads:?}");
        let starts = endpoint.bodies("GetShardIterator").await;
        assert!(
            starts
                .iter()
                .all(|s| s["ShardIteratorType"] == "TRIM_HORIZON"),
            "a first run starts at the trim horizon: {starts:?}"
        );
        assert!(
            !endpoint.dir.path().join("state.json").exists(),
            "lag writes no state"
        );
    }

    #[tokio::test]
    async fn check_shows_the_stream_status_and_opens_no_shard_iterator() {
        let endpoint = Endpoint::with_shards(&["shardId-a", "shardId-b"]).await;

        let (code, out, err) = endpoint.ddbpipe(&["check", "--json"]).await;

        assert_eq!(code, Some(0), "{out} {err}");
        let report: Value = serde_json::from_str(out.trim()).unwrap();
        let probes = report["probes"].as_array().unwrap();
        let find = |name: &str| probes.iter().find(|p| p["name"] == name).unwrap();
        assert_eq!(find("stream")["status"], "PASS");
        assert!(find("stream")["detail"].as_str().unwrap().contains(ARN));
        assert_eq!(find("stream_view_type")["status"], "PASS");
        assert_eq!(
            find("describe_stream")["detail"],
            "status ENABLED, 2 shard(s)"
        );
        assert!(endpoint.bodies("GetShardIterator").await.is_empty());
        assert!(endpoint.bodies("GetRecords").await.is_empty());
    }

    #[tokio::test]
    async fn a_throttled_read_is_retried_and_measured() {
        let endpoint = Endpoint::with_shards(&["shardId-a"]).await;
        let first = json!({"ShardIterator": "it-shardId-a"});
        endpoint
            .next("GetRecords", first.clone(), 2, throttle())
            .await;
        endpoint
            .always("GetRecords", Some(first), one_record(30.0))
            .await;

        let (code, report) = endpoint.lag_json(&[]).await;

        assert_eq!(code, Some(0), "{report}");
        assert!(report["lag_seconds"].as_f64().unwrap() >= 30.0, "{report}");
        assert_eq!(endpoint.bodies("GetRecords").await.len(), 3);
    }

    #[tokio::test]
    async fn a_failed_read_makes_the_lag_unknown_and_names_the_shard() {
        let endpoint = Endpoint::with_shards(&["shardId-a", "shardId-b"]).await;
        endpoint
            .always(
                "GetRecords",
                Some(json!({"ShardIterator": "it-shardId-a"})),
                one_record(5.0),
            )
            .await;
        endpoint
            .always(
                "GetRecords",
                Some(json!({"ShardIterator": "it-shardId-b"})),
                aws_error("AccessDeniedException", "not allowed to read"),
            )
            .await;

        let (code, report) = endpoint.lag_json(&[]).await;

        assert_eq!(code, Some(1), "{report}");
        assert_eq!(report["lag_seconds"], Value::Null);
        let error = report["error"].as_str().unwrap();
        assert!(
            error.starts_with("shard shardId-b: GetRecords on shardId-b failed after 1 attempt(s)")
                && error.contains("not allowed to read"),
            "{error}"
        );
        let (code, out, err) = endpoint.ddbpipe(&["lag"]).await;
        assert_eq!(code, Some(1));
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("error: the lag is unknown: shard shardId-b"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_stream_without_shards_has_no_value_which_fails_only_a_limit() {
        let endpoint = Endpoint::with_shards(&[]).await;

        let (code, report) = endpoint.lag_json(&[]).await;
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(
            report,
            json!({"error": null, "lag_seconds": null, "phase": "streaming", "shards": []})
        );
        let (code, _) = endpoint.lag_json(&["--max-lag-seconds", "60"]).await;
        assert_eq!(code, Some(1));
    }
}
