//! A scripted DynamoDB endpoint (wiremock) and a pipeline around the real `ddbpipe` binary.
//!
//! The fake answers the AWS JSON 1.0 protocol the SDK speaks: `POST /` with
//! `x-amz-target: DynamoDB_20120810.<Operation>` and a JSON body. Answers are scripted per
//! operation: a limited answer (`times`) is tried before the standing one, so "throttle twice,
//! then a page" is two mounts. Every request is recorded, so tests count calls and read bodies.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The content type of every DynamoDB answer.
const AMZ_JSON: &str = "application/x-amz-json-1.0";
/// How long one `ddbpipe` invocation may take before the test gives up on it. A safety net
/// against a hung binary, not an assertion: nothing here measures elapsed time.
const PROCESS_LIMIT: Duration = Duration::from_secs(120);

/// A DynamoDB operation, as named in `x-amz-target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    DescribeTable,
    Scan,
}

impl Op {
    fn target(self) -> &'static str {
        match self {
            Op::DescribeTable => "DynamoDB_20120810.DescribeTable",
            Op::Scan => "DynamoDB_20120810.Scan",
        }
    }
}

/// A DynamoDB error answer: HTTP status, error code and message.
pub fn aws_error(status: u16, code: &str, message: &str) -> ResponseTemplate {
    let body = json!({
        "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
        "message": message,
    });
    ResponseTemplate::new(status).set_body_raw(body.to_string(), AMZ_JSON)
}

/// `ProvisionedThroughputExceededException` (HTTP 400), the usual throttle.
pub fn throttle() -> ResponseTemplate {
    aws_error(
        400,
        "ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded.",
    )
}

/// A successful answer with a JSON body.
pub fn ok(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.to_string(), AMZ_JSON)
}

/// A Scan page holding items with the given `pk` strings, 1 capacity unit, and optionally a
/// `LastEvaluatedKey` with the given `pk`.
pub fn scan_page(table: &str, keys: &[&str], last_evaluated: Option<&str>) -> ResponseTemplate {
    let items: Vec<Value> = keys.iter().map(|k| json!({"pk": {"S": k}})).collect();
    let mut body = json!({
        "Items": items,
        "Count": keys.len(),
        "ScannedCount": keys.len(),
        "ConsumedCapacity": {"TableName": table, "CapacityUnits": 1.0},
    });
    if let Some(last) = last_evaluated {
        body["LastEvaluatedKey"] = json!({"pk": {"S": last}});
    }
    ok(body)
}

/// A `DescribeTable` answer for a provisioned table keyed by `pk` (S).
pub fn provisioned_table(table: &str, read_capacity_units: i64) -> ResponseTemplate {
    ok(json!({"Table": {
        "TableName": table,
        "TableStatus": "ACTIVE",
        "ItemCount": 3,
        "TableSizeBytes": 120,
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "ProvisionedThroughput": {
            "NumberOfDecreasesToday": 0,
            "ReadCapacityUnits": read_capacity_units,
            "WriteCapacityUnits": 5,
        },
        "BillingModeSummary": {"BillingMode": "PROVISIONED"},
    }}))
}

/// A `DescribeTable` answer for an on-demand table without `OnDemandThroughput` (so without
/// a maximum read rate).
pub fn on_demand_table(table: &str) -> ResponseTemplate {
    ok(json!({"Table": {
        "TableName": table,
        "TableStatus": "ACTIVE",
        "ItemCount": 3,
        "TableSizeBytes": 120,
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "ProvisionedThroughput": {
            "NumberOfDecreasesToday": 0,
            "ReadCapacityUnits": 0,
            "WriteCapacityUnits": 0,
        },
        "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
    }}))
}

/// The scripted endpoint.
pub struct FakeDynamoDb {
    server: MockServer,
}

impl FakeDynamoDb {
    /// A fresh endpoint with nothing scripted (unscripted calls get HTTP 404).
    pub async fn start() -> Self {
        FakeDynamoDb {
            server: MockServer::start().await,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.uri()
    }

    /// Answers every `op` call with `response`, after any limited answers are used up.
    pub async fn always(&self, op: Op, response: ResponseTemplate) {
        Self::mock(op, response)
            .with_priority(10)
            .mount(&self.server)
            .await;
    }

    /// Answers the next `times` calls of `op` with `response`, before any standing answer
    /// and before limited answers scripted later.
    pub async fn next(&self, op: Op, times: u64, response: ResponseTemplate) {
        Self::mock(op, response)
            .up_to_n_times(times)
            .with_priority(1)
            .mount(&self.server)
            .await;
    }

    fn mock(op: Op, response: ResponseTemplate) -> Mock {
        Mock::given(method("POST"))
            .and(path("/"))
            .and(header("x-amz-target", op.target()))
            .respond_with(response)
    }

    /// The JSON bodies of the `op` calls received, in arrival order.
    pub async fn bodies(&self, op: Op) -> Vec<Value> {
        let requests = self
            .server
            .received_requests()
            .await
            .expect("request recording is on by default");
        requests
            .iter()
            .filter(|r| {
                r.headers
                    .get("x-amz-target")
                    .is_some_and(|v| v.as_bytes() == op.target().as_bytes())
            })
            .map(|r| r.body_json::<Value>().expect("the SDK sends JSON bodies"))
            .collect()
    }

    /// How many `op` calls were received.
    pub async fn calls(&self, op: Op) -> usize {
        self.bodies(op).await.len()
    }
}

/// What one `ddbpipe` invocation did.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A pipeline file in a temporary directory, pointing at a fake endpoint.
pub struct Pipeline {
    dir: TempDir,
    table: String,
    endpoint: String,
    secret: String,
    retry: String,
    source_lines: Vec<String>,
}

impl Pipeline {
    /// Scan of table `t` with `max_retries: 8` and short backoffs.
    pub fn new(fake: &FakeDynamoDb) -> Self {
        Pipeline {
            dir: tempfile::tempdir().expect("a temporary directory"),
            table: "t".to_string(),
            endpoint: fake.url(),
            secret: "y".to_string(),
            retry: retry_line(8, None),
            source_lines: Vec::new(),
        }
    }

    /// Reads `table` instead of `t`.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_string();
        self
    }

    /// `retry.max_retries`.
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.retry = retry_line(max_retries, None);
        self
    }

    /// `retry.max_retries` and `retry.attempt_timeout_ms`.
    pub fn attempt_timeout_ms(mut self, max_retries: u32, attempt_timeout_ms: u64) -> Self {
        self.retry = retry_line(max_retries, Some(attempt_timeout_ms));
        self
    }

    /// `credentials.config.secret_access_key`.
    pub fn secret_access_key(mut self, secret: &str) -> Self {
        self.secret = secret.to_string();
        self
    }

    /// One more `source:` line, e.g. `segments: 3`.
    pub fn source(mut self, line: &str) -> Self {
        self.source_lines.push(line.to_string());
        self
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the pipeline file and returns its path.
    pub fn write(&self) -> PathBuf {
        let extra: String = self
            .source_lines
            .iter()
            .map(|line| format!("  {line}\n"))
            .collect();
        let yaml = format!(
            "name: t-export\n\
             source:\n\
             \x20 table_name: {table}\n\
             \x20 region: us-east-1\n\
             \x20 endpoint_url: {endpoint}\n\
             \x20 credentials: {{type: access_key, config: {{access_key_id: x, secret_access_key: {secret}}}}}\n\
             \x20 mode: scan\n\
             \x20 {retry}\n\
             {extra}\
             sink: {{type: jsonl, path: {out}}}\n\
             state: {{path: {state}}}\n",
            table = self.table,
            endpoint = self.endpoint,
            secret = self.secret,
            retry = self.retry,
            out = self.path("out.jsonl").display(),
            state = self.path("state.json").display(),
        );
        let config = self.path("pipeline.yaml");
        std::fs::write(&config, yaml).expect("the pipeline file is writable");
        config
    }

    /// `ddbpipe run CONFIG --progress never`.
    pub async fn run(&self) -> Outcome {
        self.run_with(&[]).await
    }

    /// `ddbpipe [global flags] run CONFIG --progress never`.
    pub async fn run_with(&self, global: &[&str]) -> Outcome {
        let config = self.write();
        let mut args: Vec<&str> = global.to_vec();
        args.extend(["run", path_str(&config), "--progress", "never"]);
        ddbpipe(&args).await
    }

    /// `ddbpipe check CONFIG --json`, with stdout parsed.
    pub async fn check_json(&self) -> (Outcome, Value) {
        let config = self.write();
        let outcome = ddbpipe(&["check", path_str(&config), "--json"]).await;
        let report = serde_json::from_str(outcome.stdout.trim()).unwrap_or_else(|e| {
            panic!("check --json printed no JSON ({e}): {outcome:?}");
        });
        (outcome, report)
    }

    /// The `pk` values in the jsonl output, sorted; empty when nothing was written.
    pub fn written_keys(&self) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(self.path("out.jsonl")) else {
            return Vec::new();
        };
        let mut keys: Vec<String> = text
            .lines()
            .map(|line| {
                let item: Value = serde_json::from_str(line).expect("each output line is JSON");
                item["pk"]
                    .as_str()
                    .expect("each item has a string pk")
                    .to_string()
            })
            .collect();
        keys.sort();
        keys
    }
}

fn retry_line(max_retries: u32, attempt_timeout_ms: Option<u64>) -> String {
    let timeout = attempt_timeout_ms
        .map(|ms| format!(", attempt_timeout_ms: {ms}"))
        .unwrap_or_default();
    format!(
        "retry: {{max_retries: {max_retries}, initial_backoff_ms: 10, max_backoff_ms: 50{timeout}}}"
    )
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// Runs the binary with a clean environment: no AWS settings of the machine leak in.
pub async fn ddbpipe(args: &[&str]) -> Outcome {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(args)
        .env_clear()
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent/ddbpipe-test/config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/ddbpipe-test/credentials",
        )
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PROCESS_LIMIT, child)
        .await
        .unwrap_or_else(|_| panic!("ddbpipe {args:?} did not finish"))
        .expect("the ddbpipe binary starts");
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
