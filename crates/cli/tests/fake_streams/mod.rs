//! A scripted DynamoDB Streams endpoint (wiremock) and a `mode: streams` pipeline around the
//! real `ddbpipe` binary.
//!
//! The Streams client speaks the same AWS JSON 1.0 protocol as the table client, on the same
//! endpoint (`endpoint_url` overrides both): `POST /` with
//! `x-amz-target: DynamoDBStreams_20120810.<Operation>`. Answers are scripted per operation and
//! per request body: `when` is a partial JSON body (`{"ShardIterator": "it-2"}`), so one
//! shard's read is a chain of iterators — "it-1 answers two records and it-2, it-2 answers
//! `ExpiredIteratorException`, `AFTER_SEQUENCE_NUMBER 102` answers it-3". A limited answer
//! (`next`) is tried before the standing ones (`always`); among equals the first mounted wins.
//! Every request is recorded, so tests count calls and read bodies.

// Shared with `faults.rs`; only its answer builders and `Outcome` are used here.
#[allow(dead_code)]
#[path = "../fake_dynamodb/mod.rs"]
mod fake_dynamodb;

use std::path::PathBuf;

use serde_json::{Value, json};
use tempfile::TempDir;
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, Respond, ResponseTemplate};

use fake_dynamodb::ddbpipe;
pub use fake_dynamodb::{Outcome, aws_error, ok, throttle};

/// The stream every pipeline here reads unless told otherwise.
pub const ARN: &str =
    "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-01-01T00:00:00.000";
/// The pipeline's name, which keys its entry in the state file.
const NAME: &str = "t-stream";

/// An operation of the endpoint, as named in `x-amz-target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    DescribeTable,
    DescribeStream,
    GetShardIterator,
    GetRecords,
}

impl Op {
    fn target(self) -> &'static str {
        match self {
            Op::DescribeTable => "DynamoDB_20120810.DescribeTable",
            Op::DescribeStream => "DynamoDBStreams_20120810.DescribeStream",
            Op::GetShardIterator => "DynamoDBStreams_20120810.GetShardIterator",
            Op::GetRecords => "DynamoDBStreams_20120810.GetRecords",
        }
    }
}

// --- request bodies to match -------------------------------------------------------------

/// Any request of the operation.
pub fn any() -> Value {
    json!({})
}

/// `GetShardIterator` for `shard` at `TRIM_HORIZON`.
pub fn at_trim_horizon(shard: &str) -> Value {
    json!({"ShardId": shard, "ShardIteratorType": "TRIM_HORIZON"})
}

/// `GetShardIterator` for `shard` at `AFTER_SEQUENCE_NUMBER seq`.
pub fn after(shard: &str, seq: &str) -> Value {
    json!({"ShardId": shard, "ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": seq})
}

/// `GetRecords` with this iterator.
pub fn with_iterator(iterator: &str) -> Value {
    json!({"ShardIterator": iterator})
}

/// `DescribeStream` asking for the children of `parent` (`ShardFilter CHILD_SHARDS`).
pub fn children_of(parent: &str) -> Value {
    json!({"ShardFilter": {"Type": "CHILD_SHARDS", "ShardId": parent}})
}

// --- answers -----------------------------------------------------------------------------

/// A shard of a `DescribeStream` answer; closed shards have an `EndingSequenceNumber`.
pub fn shard(id: &str, parent: Option<&str>, closed: bool) -> Value {
    let mut range = json!({"StartingSequenceNumber": "100"});
    if closed {
        range["EndingSequenceNumber"] = json!("999999");
    }
    let mut shard = json!({"ShardId": id, "SequenceNumberRange": range});
    if let Some(parent) = parent {
        shard["ParentShardId"] = json!(parent);
    }
    shard
}

/// One `DescribeStream` page of the stream `arn` listing `shards`, with
/// `LastEvaluatedShardId` when more pages follow.
pub fn stream_page(arn: &str, shards: &[Value], last_evaluated: Option<&str>) -> ResponseTemplate {
    let mut description = json!({
        "StreamArn": arn,
        "StreamStatus": "ENABLED",
        "StreamViewType": "NEW_AND_OLD_IMAGES",
        "TableName": "t",
        "Shards": shards,
    });
    if let Some(last) = last_evaluated {
        description["LastEvaluatedShardId"] = json!(last);
    }
    ok(json!({"StreamDescription": description}))
}

/// A `GetShardIterator` answer.
pub fn iterator(iterator: &str) -> ResponseTemplate {
    ok(json!({"ShardIterator": iterator}))
}

/// An `INSERT` of key `k<seq>` with sequence number `seq` and event id `e<seq>`.
pub fn record(seq: &str) -> Value {
    let key = json!({"pk": {"S": format!("k{seq}")}});
    json!({
        "eventID": format!("e{seq}"),
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1_767_225_600,
            "Keys": key,
            "NewImage": key,
            "SequenceNumber": seq,
            "SizeBytes": 10,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    })
}

/// A `GetRecords` answer; without a next iterator the shard is closed and read to its end.
pub fn records(records: &[Value], next: Option<&str>) -> ResponseTemplate {
    let mut body = json!({"Records": records});
    if let Some(next) = next {
        body["NextShardIterator"] = json!(next);
    }
    ok(body)
}

/// An error the Streams service answers with HTTP 400.
pub fn streams_error(code: &str) -> ResponseTemplate {
    aws_error(400, code, &format!("scripted {code}"))
}

/// A `DescribeTable` answer for table `t` (key `pk`) whose enabled stream is `arn`.
pub fn streamed_table(arn: &str) -> ResponseTemplate {
    ok(json!({"Table": {
        "TableName": "t",
        "TableStatus": "ACTIVE",
        "ItemCount": 0,
        "TableSizeBytes": 0,
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
        "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        "LatestStreamArn": arn,
        "LatestStreamLabel": arn.rsplit('/').next().unwrap_or_default(),
    }}))
}

// --- the endpoint ------------------------------------------------------------------------

/// The scripted endpoint.
pub struct FakeStreams {
    server: MockServer,
}

impl FakeStreams {
    /// A fresh endpoint with nothing scripted (unscripted calls get HTTP 404).
    pub async fn start() -> Self {
        FakeStreams {
            server: MockServer::start().await,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.uri()
    }

    /// Answers every `op` call whose body contains `when` with `response`, after any limited
    /// answers are used up.
    pub async fn always(&self, op: Op, when: Value, response: impl Respond + 'static) {
        Self::mock(op, when, response)
            .with_priority(10)
            .mount(&self.server)
            .await;
    }

    /// Answers the next `times` `op` calls whose body contains `when` with `response`, before
    /// any standing answer and before limited answers scripted later.
    pub async fn next(&self, op: Op, when: Value, times: u64, response: ResponseTemplate) {
        Self::mock(op, when, response)
            .up_to_n_times(times)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    fn mock(op: Op, when: Value, response: impl Respond + 'static) -> Mock {
        Mock::given(method("POST"))
            .and(path("/"))
            .and(header("x-amz-target", op.target()))
            .and(body_partial_json(when))
            .respond_with(response)
    }

    /// The JSON bodies of the `op` calls received, in arrival order.
    pub async fn bodies(&self, op: Op) -> Vec<Value> {
        self.requests()
            .await
            .into_iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, body)| body)
            .collect()
    }

    /// How many `op` calls were received.
    pub async fn calls(&self, op: Op) -> usize {
        self.bodies(op).await.len()
    }

    /// How many `op` calls whose body contains every field of `when` were received.
    pub async fn calls_with(&self, op: Op, when: &Value) -> usize {
        let fields = when.as_object().expect("`when` is a JSON object");
        self.bodies(op)
            .await
            .iter()
            .filter(|body| fields.iter().all(|(k, v)| body.get(k) == Some(v)))
            .count()
    }

    /// Every request of a known operation with its JSON body, in arrival order.
    pub async fn requests(&self) -> Vec<(Op, Value)> {
        let requests = self
            .server
            .received_requests()
            .await
            .expect("request recording is on by default");
        let ops = [
            Op::DescribeTable,
            Op::DescribeStream,
            Op::GetShardIterator,
            Op::GetRecords,
        ];
        requests
            .iter()
            .filter_map(|r| {
                let target = r.headers.get("x-amz-target")?.as_bytes();
                let op = ops
                    .into_iter()
                    .find(|op| op.target().as_bytes() == target)?;
                Some((
                    op,
                    r.body_json::<Value>().expect("the SDK sends JSON bodies"),
                ))
            })
            .collect()
    }

    /// Forgets every scripted answer and every recorded request.
    pub async fn reset(&self) {
        self.server.reset().await;
    }
}

// --- the pipeline ------------------------------------------------------------------------

/// A `mode: streams` pipeline file in a temporary directory, pointing at a fake endpoint:
/// `stream_arn` = [`ARN`], `poll_interval_ms: 200`, `idle_termination_secs: 1`, retries
/// `{max_retries: 3, initial_backoff_ms: 10, max_backoff_ms: 50}`, a jsonl sink and a state
/// file next to it.
pub struct Pipeline {
    dir: TempDir,
    endpoint: String,
    stream_arn: Option<String>,
    terminator: String,
    source_lines: Vec<String>,
}

impl Pipeline {
    /// The default pipeline (see the type docs).
    pub fn new(fake: &FakeStreams) -> Self {
        Pipeline {
            dir: tempfile::tempdir().expect("a temporary directory"),
            endpoint: fake.url(),
            stream_arn: Some(ARN.to_string()),
            terminator: "idle_termination_secs: 1".to_string(),
            source_lines: Vec::new(),
        }
    }

    /// No `stream_arn`: the run resolves the table's stream with `DescribeTable`.
    pub fn table_stream(mut self) -> Self {
        self.stream_arn = None;
        self
    }

    /// `max_messages: n` instead of `idle_termination_secs`.
    pub fn max_messages(mut self, n: usize) -> Self {
        self.terminator = format!("max_messages: {n}");
        self
    }

    /// `follow: true` instead of `idle_termination_secs`: only a signal (or a disabled,
    /// drained stream) ends the run.
    pub fn follow(mut self) -> Self {
        self.terminator = "follow: true".to_string();
        self
    }

    /// One more `source:` line, e.g. `on_gap: fail`.
    pub fn source(mut self, line: &str) -> Self {
        self.source_lines.push(line.to_string());
        self
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the pipeline file and returns its path.
    pub fn write(&self) -> PathBuf {
        let mut lines = vec![
            "table_name: t".to_string(),
            "region: us-east-1".to_string(),
            format!("endpoint_url: {}", self.endpoint),
            "credentials: {type: access_key, config: {access_key_id: x, secret_access_key: y}}"
                .to_string(),
            "mode: streams".to_string(),
            "poll_interval_ms: 200".to_string(),
            "retry: {max_retries: 3, initial_backoff_ms: 10, max_backoff_ms: 50}".to_string(),
            self.terminator.clone(),
        ];
        if let Some(arn) = &self.stream_arn {
            lines.push(format!("stream_arn: {arn}"));
        }
        lines.extend(self.source_lines.iter().cloned());
        let source: String = lines.iter().map(|line| format!("  {line}\n")).collect();
        let yaml = format!(
            "name: {NAME}\nsource:\n{source}sink: {{type: jsonl, path: {out}}}\nstate: {{path: {state}}}\n",
            out = self.path("out.jsonl").display(),
            state = self.path("state.json").display(),
        );
        let config = self.path("pipeline.yaml");
        std::fs::write(&config, yaml).expect("the pipeline file is writable");
        config
    }

    /// `ddbpipe run CONFIG --progress never`.
    pub async fn run(&self) -> Outcome {
        let config = self.write();
        let config = config.to_str().expect("temporary paths are UTF-8");
        ddbpipe(&["run", config, "--progress", "never"]).await
    }

    /// `ddbpipe check CONFIG --json`.
    pub async fn check(&self) -> Outcome {
        let config = self.write();
        let config = config.to_str().expect("temporary paths are UTF-8");
        ddbpipe(&["check", config, "--json"]).await
    }

    /// `ddbpipe lag CONFIG --json`.
    pub async fn lag(&self) -> Outcome {
        let config = self.write();
        let config = config.to_str().expect("temporary paths are UTF-8");
        ddbpipe(&["lag", config, "--json"]).await
    }

    /// Rewrites the pipeline's stored position with `edit`.
    pub fn edit_position(&self, edit: impl FnOnce(&mut Value)) {
        let bytes = self.state_bytes().expect("the run wrote a state file");
        let mut state: Value = serde_json::from_slice(&bytes).expect("the state file is JSON");
        edit(&mut state["pipelines"][NAME]["position"]);
        std::fs::write(self.path("state.json"), state.to_string()).expect("the state is writable");
    }

    /// The change envelopes written, in output order; empty when nothing was written.
    pub fn envelopes(&self) -> Vec<Value> {
        let Ok(text) = std::fs::read_to_string(self.path("out.jsonl")) else {
            return Vec::new();
        };
        text.lines()
            .map(|line| serde_json::from_str(line).expect("each output line is JSON"))
            .collect()
    }

    /// The `sequence_number` of every envelope written, in output order.
    pub fn written_seqs(&self) -> Vec<String> {
        self.envelopes()
            .iter()
            .map(|envelope| {
                envelope["sequence_number"]
                    .as_str()
                    .expect("every change envelope has a sequence number")
                    .to_string()
            })
            .collect()
    }

    /// The state file's bytes, `None` when there is none.
    pub fn state_bytes(&self) -> Option<Vec<u8>> {
        std::fs::read(self.path("state.json")).ok()
    }

    /// The pipeline's stored position.
    pub fn position(&self) -> Value {
        let bytes = self.state_bytes().expect("the run wrote a state file");
        let state: Value = serde_json::from_slice(&bytes).expect("the state file is JSON");
        state["pipelines"][NAME]["position"].clone()
    }
}
