//! Test harness: real DynamoDB emulators (dynoxide in process, moto as a server process), a
//! seeding client, pipeline files in temp dirs, and the `ddbpipe` binary.

#![allow(dead_code)] // Each test binary uses a different part of the harness.

pub mod drive;
pub mod keyed;
pub mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, PutRequest,
    ScalarAttributeType, StreamSpecification, StreamViewType, WriteRequest,
};

/// The two emulators every protocol test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulator {
    /// dynoxide, embedded, served over HTTP on a loopback port.
    Dynoxide,
    /// moto's server (`moto_server`), a separate process.
    Moto,
}

/// A running emulator: its endpoint and a client to seed it.
pub struct Running {
    pub endpoint: String,
    pub client: Client,
    _moto: Option<ddbpipe_testkit::moto::Moto>,
}

/// One runtime for the harness's async calls (seeding, the embedded emulator).
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("the test runtime starts")
    })
}

impl Emulator {
    /// Starts a fresh instance (each test gets its own, so tests run in parallel).
    pub fn start(self) -> Running {
        match self {
            Emulator::Dynoxide => {
                let listener = rt()
                    .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                    .expect("bind a loopback port");
                let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
                let db = dynoxide::Database::memory().expect("dynoxide in-memory database");
                rt().spawn(dynoxide::server::serve_on(listener, db));
                Running {
                    client: client(&endpoint),
                    endpoint,
                    _moto: None,
                }
            }
            Emulator::Moto => {
                let moto = ddbpipe_testkit::moto::Moto::start();
                Running {
                    client: client(&moto.endpoint),
                    endpoint: moto.endpoint.clone(),
                    _moto: Some(moto),
                }
            }
        }
    }
}

/// A seeding client for the emulator (static test credentials).
pub fn client(endpoint: &str) -> Client {
    client_in(endpoint, "us-east-1", "testing")
}

/// A seeding client in `region` with access key id `key` (moto keeps regions apart).
pub fn client_in(endpoint: &str, region: &str, key: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            key.to_string(),
            "testing",
            None,
            None,
            "test",
        ))
        .build();
    Client::from_conf(config)
}

impl Running {
    /// Creates a table with a hash key (and optional range key), on demand.
    pub fn create_table(
        &self,
        name: &str,
        hash: (&str, ScalarAttributeType),
        range: Option<(&str, ScalarAttributeType)>,
    ) {
        create_table_on(&self.client, name, hash, range);
    }

    /// Creates `name` with hash key `pk` (S), on demand, with a stream of `view` when given.
    pub fn create_pk_table(&self, name: &str, view: Option<StreamViewType>) {
        let stream = view.map(|view| {
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(view)
                .build()
                .expect("stream specification")
        });
        let request = self
            .client
            .create_table()
            .table_name(name)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("pk")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .expect("attribute definition"),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("pk")
                    .key_type(KeyType::Hash)
                    .build()
                    .expect("key schema element"),
            )
            .set_stream_specification(stream);
        rt().block_on(request.send()).expect("CreateTable");
    }

    /// Puts `{pk: S, v: N}` with PutItem.
    pub fn put_pk(&self, table: &str, pk: &str, v: &str) {
        let request = self
            .client
            .put_item()
            .table_name(table)
            .set_item(Some(item(vec![("pk", s(pk)), ("v", n(v))])));
        rt().block_on(request.send()).expect("PutItem");
    }

    /// Deletes the item `{pk: S}` with DeleteItem.
    pub fn delete_pk(&self, table: &str, pk: &str) {
        let request = self.client.delete_item().table_name(table).key("pk", s(pk));
        rt().block_on(request.send()).expect("DeleteItem");
    }

    /// Writes items with BatchWriteItem, 25 at a time, retrying unprocessed ones.
    pub fn put_items(&self, table: &str, items: Vec<HashMap<String, AttributeValue>>) {
        for chunk in items.chunks(25) {
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|item| {
                    WriteRequest::builder()
                        .put_request(
                            PutRequest::builder()
                                .set_item(Some(item.clone()))
                                .build()
                                .expect("put"),
                        )
                        .build()
                })
                .collect();
            while !requests.is_empty() {
                let out = rt()
                    .block_on(
                        self.client
                            .batch_write_item()
                            .request_items(table, requests)
                            .send(),
                    )
                    .expect("BatchWriteItem");
                requests = out
                    .unprocessed_items
                    .and_then(|mut u| u.remove(table))
                    .unwrap_or_default();
            }
        }
    }
}

/// Creates a table with a hash key (and optional range key), on demand, through `client`.
pub fn create_table_on(
    client: &Client,
    name: &str,
    hash: (&str, ScalarAttributeType),
    range: Option<(&str, ScalarAttributeType)>,
) {
    let mut request = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest);
    for (key, kind) in
        std::iter::once((hash, KeyType::Hash)).chain(range.map(|r| (r, KeyType::Range)))
    {
        request = request
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(key.0)
                    .attribute_type(key.1)
                    .build()
                    .expect("attribute definition"),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(key.0)
                    .key_type(kind)
                    .build()
                    .expect("key schema element"),
            );
    }
    rt().block_on(request.send()).expect("CreateTable");
}

/// `S` attribute.
pub fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

/// `N` attribute.
pub fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// An item from pairs.
pub fn item(pairs: Vec<(&str, AttributeValue)>) -> HashMap<String, AttributeValue> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// A temp dir with a pipeline file in it.
pub struct Pipeline {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub out: PathBuf,
    pub state: PathBuf,
}

impl Pipeline {
    /// Writes `name: <name>` + the `source:` lines given (indented by the caller as YAML under
    /// `source:`), a jsonl sink to `out.jsonl` and state `state.json`, all in a new temp dir.
    pub fn new(name: &str, endpoint: &str, source: &str) -> Pipeline {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("out.jsonl");
        let state = dir.path().join("state.json");
        let config = dir.path().join("pipeline.yaml");
        let pipeline = Pipeline {
            dir,
            config,
            out,
            state,
        };
        pipeline.write(name, endpoint, source);
        pipeline
    }

    /// Rewrites the pipeline file with another source section.
    pub fn write(&self, name: &str, endpoint: &str, source: &str) {
        let sink = format!(
            "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {}\n  flush_interval_ms: 0\n",
            self.out.display(),
            self.state.display()
        );
        self.write_with_sink(name, endpoint, source, &sink);
    }

    /// Rewrites the pipeline file with a source section and the given `sink:` section (a keyed
    /// sink: no state section).
    pub fn write_with_sink(&self, name: &str, endpoint: &str, source: &str, sink: &str) {
        let source: String = source
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("  {}\n", l.trim_start()))
            .collect();
        let yaml = format!(
            "name: {name}\nsource:\n  region: us-east-1\n  endpoint_url: {endpoint}\n  \
             credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}\n\
             {source}{sink}"
        );
        std::fs::write(&self.config, yaml).expect("write the pipeline file");
    }

    /// Runs `ddbpipe <args…> <config>` to completion.
    pub fn ddbpipe(&self, args: &[&str]) -> Output {
        ddbpipe(args, &self.config)
    }

    /// `ddbpipe run --progress never --metrics-file <dir>/ddbpipe.prom <config>`: its output,
    /// and the metrics file's text as the run left it (empty when it wrote none).
    pub fn run_with_metrics_file(&self) -> (Output, String) {
        let file = self.dir.path().join("ddbpipe.prom");
        let shown = file.to_str().expect("a UTF-8 path");
        let output = self.ddbpipe(&["run", "--progress", "never", "--metrics-file", shown]);
        (output, std::fs::read_to_string(&file).unwrap_or_default())
    }

    /// Output lines written so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The output lines parsed as JSON.
    pub fn records(&self) -> Vec<serde_json::Value> {
        self.lines()
            .iter()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect()
    }

    /// The stored entry of pipeline `name`, if any.
    pub fn entry(&self, name: &str) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(&self.state).ok()?;
        let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
        doc["pipelines"].get(name).cloned()
    }
}

/// Runs the binary with `args` followed by the config path.
pub fn ddbpipe(args: &[&str], config: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ddbpipe"));
    command.args(args).arg(config).stdin(Stdio::null());
    command.output().expect("ddbpipe runs")
}

/// Starts `ddbpipe run <config>` in the background with its stderr in `run-<attempt>.log` of
/// the pipeline's directory (a run that is killed has nothing draining a pipe).
pub fn spawn_logged(pipeline: &Pipeline, attempt: usize) -> Child {
    let log = std::fs::File::create(pipeline.dir.path().join(format!("run-{attempt}.log")))
        .expect("create the run's log");
    Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["run", "--progress", "never"])
        .arg(&pipeline.config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ddbpipe starts")
}

/// Starts `ddbpipe run <config>` in the background.
pub fn spawn_run(config: &Path) -> Child {
    spawn_run_with(config, &[])
}

/// Starts `ddbpipe run <extra…> <config>` in the background, stderr piped (read it with
/// `wait_with_output`).
pub fn spawn_run_with(config: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["run", "--progress", "never"])
        .args(extra)
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ddbpipe runs")
}

/// Sends `child` the signal `name` (`TERM`, `STOP`, `CONT`, `KILL`) with `kill`.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name}");
}

/// Of workers sharing leases of 3 s: SIGKILLs the first (no final checkpoint, no hand-back)
/// and SIGSTOPs the next for 7 s, past its lease (a zombie), then lets it go on; the survivors
/// stay in `workers`, the stalled one last.
pub fn kill_one_and_stall_another(workers: &mut Vec<Child>) {
    let mut killed = workers.remove(0);
    killed.kill().expect("SIGKILL");
    killed.wait().expect("the killed worker is reaped");
    let stopped = workers.remove(0);
    signal(&stopped, "STOP");
    std::thread::sleep(Duration::from_secs(7));
    signal(&stopped, "CONT");
    workers.push(stopped);
}

/// Sends `child` SIGTERM: a clean stop.
pub fn sigterm(child: &Child) {
    signal(child, "TERM");
}

/// The body of `GET /metrics` on `port` (empty while nothing listens there).
pub fn scrape_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ =
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body
}

/// `GET /health` on `port`: the status code and the JSON body (`None` while nothing answers).
pub fn health(port: u16) -> Option<(u16, serde_json::Value)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split("\r\n\r\n").nth(1)?;
    Some((status, serde_json::from_str(body).ok()?))
}

/// Waits until `/health` on `port` says `state` (polling), at most `limit`; the last answer.
pub fn wait_for_health(
    port: u16,
    state: &str,
    limit: Duration,
) -> Option<(u16, serde_json::Value)> {
    let mut last = None;
    wait_for(limit, || {
        last = health(port);
        last.as_ref()
            .is_some_and(|(_, body)| body["state"] == state)
    });
    last
}

/// Waits until `check` holds (polling every 20 ms), at most `limit`.
pub fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// stderr as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// stdout as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every command that reads a pipeline file's source and sink, as `ddbpipe` arguments (the config path follows),
/// logging everything as JSON.
pub const COMMANDS: &[&[&str]] = &[
    &["check"],
    &["check", "--json"],
    &["run", "--progress", "never"],
    &["state", "show"],
    &["state", "show", "--json"],
    &["state", "reset", "--yes"],
    &["lag"],
    &["lag", "--json"],
];

/// Runs `args` with `--log-format json --log-level trace`; stdout and stderr together.
pub fn traced(pipeline: &Pipeline, args: &[&str]) -> (Output, String) {
    traced_at(&pipeline.config, args)
}

/// [`traced`] for the pipeline file at `config`.
pub fn traced_at(config: &Path, args: &[&str]) -> (Output, String) {
    let mut all = args.to_vec();
    all.extend(["--log-format", "json", "--log-level", "trace"]);
    let output = ddbpipe(&all, config);
    let text = format!("{}{}", stdout(&output), stderr(&output));
    (output, text)
}

/// Runs the binary with exactly `args` (no config path appended) and the emulators' static
/// test credentials in its environment.
pub fn ddbpipe_with_test_credentials(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .stdin(Stdio::null())
        .output()
        .expect("ddbpipe runs")
}

/// Fails when `text` holds `secret` or any `window`-character piece of it.
pub fn assert_hidden(text: &str, secret: &str, window: usize, what: &str) {
    let chars: Vec<char> = secret.chars().collect();
    for piece in chars.windows(window.min(chars.len())) {
        let piece: String = piece.iter().collect();
        assert!(
            !text.contains(&piece),
            "{what} printed {piece:?} of the secret: {text}"
        );
    }
}

/// Defines `mod dynoxide` and `mod moto` with one `#[test]` per listed function, each calling
/// it with that emulator.
#[macro_export]
macro_rules! on_both_emulators {
    ($($test:ident),* $(,)?) => {
        mod dynoxide {
            $( #[test] fn $test() { super::$test($crate::common::Emulator::Dynoxide) } )*
        }
        mod moto {
            $( #[test] fn $test() { super::$test($crate::common::Emulator::Moto) } )*
        }
    };
}

/// The uid 65534 (`nobody`) that [`ddbpipe_unprivileged`] runs as when the tests run as root.
pub const UNPRIVILEGED_UID: u32 = 65534;

/// Runs the binary with `args` followed by the config path as a user to whom permission bits
/// apply. Root ignores them (tests run as root in CI), so a read-only directory is writable
/// to root; as root the binary therefore runs as uid 65534 through `setpriv`, from a link to
/// it in `dir` (the build directory may be closed to that user). `dir` and the config must be
/// readable to that user: [`open_to_all`] them.
pub fn ddbpipe_unprivileged(args: &[&str], config: &Path, dir: &Path) -> Output {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").expect("procfs").uid() == 0;
    let binary = Path::new(env!("CARGO_BIN_EXE_ddbpipe"));
    let mut command = if root {
        let link = dir.join("ddbpipe-bin");
        if !link.exists() && std::fs::hard_link(binary, &link).is_err() {
            std::fs::copy(binary, &link).expect("copy the binary");
        }
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={UNPRIVILEGED_UID}"))
            .arg(format!("--regid={UNPRIVILEGED_UID}"))
            .args(["--clear-groups", "--"])
            .arg(link);
        command
    } else {
        Command::new(binary)
    };
    // The SDK looks for ~/.aws; root's home is closed to the other user.
    command.env("HOME", dir).args(args).arg(config);
    command
        .stdin(Stdio::null())
        .output()
        .expect("ddbpipe runs (setpriv from util-linux when the tests run as root)")
}

/// Gives `path` the permission bits `mode` (e.g. 0o755 to open a temp dir to every user).
pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Opens a pipeline's temp dir and config file to every user (read and traverse).
pub fn open_to_all(pipeline: &Pipeline) {
    set_mode(pipeline.dir.path(), 0o755);
    set_mode(&pipeline.config, 0o644);
}

/// The names of the entries in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Longest a worker of these tests may take to end once the test waits for it: far beyond
/// any run here, so only a hang reaches it, and then the test fails with the worker's log
/// instead of waiting forever.
pub const HANG: Duration = Duration::from_secs(300);

/// Waits for a worker's end and returns its output; a worker that has not ended after
/// [`HANG`] is killed and the test fails with its log.
pub fn finished(child: Child) -> Output {
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let output = child.wait_with_output().expect("the worker is reaped");
        let _ = done.send(());
        output
    });
    if waited.recv_timeout(HANG).is_err() {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let output = waiter.join().expect("the waiter ends");
        panic!(
            "worker {pid} did not end within {} s; its log:\n{}",
            HANG.as_secs(),
            stderr(&output)
        );
    }
    waiter.join().expect("the waiter ends")
}

/// The stream's one shard lease, as `state show --json` lists it.
pub fn shard_lease(config: &Path) -> Option<serde_json::Value> {
    let show = ddbpipe(&["state", "show", "--json"], config);
    let shown: serde_json::Value = serde_json::from_str(&stdout(&show)).ok()?;
    shown["leases"]
        .as_array()?
        .iter()
        .find(|lease| {
            lease["unit"]
                .as_str()
                .is_some_and(|u| u.starts_with("shard:"))
        })
        .cloned()
}

/// The owner of the stream's one shard lease.
pub fn shard_owner(config: &Path) -> Option<String> {
    shard_lease(config).and_then(|lease| lease["owner"].as_str().map(str::to_string))
}

/// The running worker whose default id (`<hostname>-<pid>`) owns as `owner`
/// (`<id>#<host>/<pid>/<token>`).
pub fn worker_of(workers: &mut Vec<Child>, owner: &str) -> Option<Child> {
    let id = owner.split('#').next()?;
    let at = workers
        .iter()
        .position(|w| id.ends_with(&format!("-{}", w.id())))?;
    Some(workers.remove(at))
}
