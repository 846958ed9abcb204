//! `ddbpipe demo`: the main job on this machine with no AWS account.
//!
//! Starts dynoxide (an embedded DynamoDB emulator) on a loopback port, creates a sample
//! `orders` table through the real DynamoDB API, fills it with realistic items (nested maps,
//! lists, sets, binary, 25-digit numbers), writes a pipeline file, and runs that pipeline
//! exactly as `ddbpipe run` does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, PutRequest,
    ScalarAttributeType, StreamSpecification, StreamViewType, WriteRequest,
};
use ddbpipe_source::retry::Cancel;

use crate::args::ProgressMode;
use crate::failure::{Exit, Failure};
use crate::run_command;
use crate::telemetry::note;

const TABLE: &str = "orders";

/// Runs the demo in `dir` with `items` sample orders.
pub async fn demo(dir: &Path, items: u32, keep: bool) -> Result<Exit, Failure> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
        .map_err(Failure::runtime)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind a loopback port for the emulator")
        .map_err(Failure::runtime)?;
    let endpoint = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| Failure::runtime(anyhow!(e)))?
    );
    let db =
        dynoxide::Database::memory().map_err(|e| Failure::runtime(anyhow!("dynoxide: {e}")))?;
    tokio::spawn(dynoxide::server::serve_on(listener, db));
    note!("demo: DynamoDB emulator (dynoxide) listening on {endpoint}");

    let client = client(&endpoint).await;
    create_table(&client).await.map_err(Failure::runtime)?;
    fill(&client, items).await.map_err(Failure::runtime)?;
    note!("demo: created table '{TABLE}' with {items} orders");

    let [export, cdc, mirror] = steps(dir);
    let exit = export.run(dir, &endpoint).await?;
    if exit != Exit::Ok {
        return Ok(exit);
    }
    let text = std::fs::read_to_string(export.out.path()).unwrap_or_default();
    note!(
        "demo: wrote {} items to {}",
        text.lines().count(),
        export.out.path().display()
    );
    if let Some(first) = text.lines().next() {
        note!("demo: first line:\n{first}");
    }

    // Change data capture: enable the stream, change a few orders, read the changes.
    enable_stream(&client).await.map_err(Failure::runtime)?;
    change_some_orders(&client)
        .await
        .map_err(Failure::runtime)?;
    note!("demo: enabled the table's stream, then updated 2 orders, deleted 1 and added 1");
    let exit = cdc.run(dir, &endpoint).await?;
    if exit != Exit::Ok {
        return Ok(exit);
    }
    let text = std::fs::read_to_string(cdc.out.path()).unwrap_or_default();
    note!(
        "demo: wrote {} change envelopes to {}:",
        text.lines().count(),
        cdc.out.path().display()
    );
    for line in text.lines() {
        note!("{line}");
    }

    // A mirror: snapshot, then the stream, into a SQLite table that stays equal to the table.
    let exit = mirror.run(dir, &endpoint).await?;
    if exit != Exit::Ok {
        return Ok(exit);
    }
    let db = mirror.out.path().display();
    note!(
        "demo: mirrored the table into {db} (table \"{TABLE}\": key columns customer and order_id, \
         the item in the document column). Query it:\n  sqlite3 {db} \"SELECT customer, order_id, \
         json_extract(document, '$.status') AS status, json_extract(document, '$.total') AS total \
         FROM {TABLE} ORDER BY customer, order_id LIMIT 5\"\n\
         Run `ddbpipe run {}` again after changing the table to apply just the changes.",
        dir.join("orders-mirror.yaml").display()
    );
    if !keep {
        note!(
            "demo: the pipeline files are in {} (the emulator stops with the demo — `ddbpipe \
             demo --keep` keeps it up; point endpoint_url at your own table, or remove it to \
             read from AWS)",
            dir.display()
        );
        return Ok(exit);
    }
    note!(
        "demo: the pipeline files are in {}; the emulator stays up at {endpoint} until Ctrl-C: \
         change the table (aws dynamodb --endpoint-url {endpoint} …) and run the mirror again",
        dir.display()
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")
        .map_err(Failure::runtime)?;
    note!("demo: emulator stopped");
    Ok(exit)
}

/// The emulator's static credentials, as the demo's pipeline files name them.
const CREDENTIALS: &str =
    "{type: access_key, config: {access_key_id: demo, secret_access_key: demo}}";

/// The demo's pipelines, in the order it runs them: an export, the table's changes, a mirror.
fn steps(dir: &Path) -> [Step; 3] {
    [
        Step {
            name: "orders-export",
            comment: "a 4-segment parallel scan of the sample table",
            source: "mode: scan
  segments: 4
  page_limit: 250
  max_read_units_per_second: 5000",
            out: Out::Jsonl(dir.join("orders.jsonl")),
        },
        // Change data capture: the stream enabled, a few orders changed, the changes read.
        Step {
            name: "orders-cdc",
            comment: "change data capture from the table's stream, ending after 2 s without \
                      changes",
            source: "mode: streams\n  idle_termination_secs: 2",
            out: Out::Jsonl(dir.join("orders-changes.jsonl")),
        },
        Step {
            name: "orders-mirror",
            comment: "a SQLite copy of the table: capture the stream, scan, then apply the \
                      changes",
            source: "mode: mirror\n  segments: 4\n  idle_termination_secs: 2",
            out: Out::Sqlite(dir.join("orders.db")),
        },
    ]
}

/// The last component of `path`, as the pipeline files of the demo name their outputs.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One pipeline of the demo: written to `<dir>/<name>.yaml` and run like `ddbpipe run`.
struct Step {
    name: &'static str,
    comment: &'static str,
    source: &'static str,
    out: Out,
}

/// Where a demo pipeline writes.
enum Out {
    /// A jsonl file (with a state file beside it).
    Jsonl(PathBuf),
    /// A SQLite database (holding the position too).
    Sqlite(PathBuf),
}

impl Out {
    fn path(&self) -> &Path {
        match self {
            Out::Jsonl(path) | Out::Sqlite(path) => path,
        }
    }

    /// The state file of the pipeline `name` writing here, when it has one.
    fn state(&self, dir: &Path, name: &str) -> Option<PathBuf> {
        match self {
            Out::Jsonl(_) => Some(dir.join(format!("{name}.state.json"))),
            Out::Sqlite(_) => None,
        }
    }

    /// Removes what an earlier demo left: the output and the position.
    fn remove_earlier(&self, dir: &Path, name: &str) {
        let mut files = vec![self.path().to_path_buf()];
        if let Out::Sqlite(path) = self {
            for suffix in ["-wal", "-shm"] {
                let mut file = path.as_os_str().to_owned();
                file.push(suffix);
                files.push(PathBuf::from(file));
            }
        }
        files.extend(self.state(dir, name));
        for file in files {
            let _ = std::fs::remove_file(file);
        }
    }

    /// The `sink:` (and `state:`) sections, with paths relative to the pipeline file, which
    /// sits beside them.
    fn sections(&self, name: &str) -> String {
        match self {
            Out::Jsonl(path) => format!(
                "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {name}.state.json\n",
                file_name(path),
            ),
            Out::Sqlite(path) => format!("sink:\n  type: sqlite\n  path: {}\n", file_name(path)),
        }
    }
}

impl Step {
    /// The pipeline file of this step for the emulator at `endpoint`.
    fn yaml(&self, endpoint: &str) -> String {
        let sections = self.out.sections(self.name);
        format!(
            "# Written by `ddbpipe demo`: {}.\n\
             name: {}\n\
             source:\n  table_name: {TABLE}\n  region: us-east-1\n  endpoint_url: {endpoint}\n  \
             credentials: {CREDENTIALS}\n  {}\n\
             {sections}",
            self.comment, self.name, self.source,
        )
    }

    async fn run(&self, dir: &Path, endpoint: &str) -> Result<Exit, Failure> {
        self.out.remove_earlier(dir, self.name);
        let config_path = dir.join(format!("{}.yaml", self.name));
        let yaml = self.yaml(endpoint);
        std::fs::write(&config_path, yaml)
            .with_context(|| format!("cannot write {}", config_path.display()))
            .map_err(Failure::runtime)?;
        note!("demo: running pipeline {}", config_path.display());
        run_command::run(
            &config_path,
            ProgressMode::Auto,
            &Default::default(),
            Cancel::never(),
        )
        .await
    }
}

async fn enable_stream(client: &Client) -> anyhow::Result<()> {
    let spec = StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewAndOldImages)
        .build()?;
    client
        .update_table()
        .table_name(TABLE)
        .stream_specification(spec)
        .send()
        .await
        .context("UpdateTable (enable the stream) on the emulator")?;
    Ok(())
}

async fn change_some_orders(client: &Client) -> anyhow::Result<()> {
    let key = |i: u32| {
        HashMap::from([
            (
                "customer".to_string(),
                AttributeValue::S(format!("customer#{:04}", i % 250)),
            ),
            (
                "order_id".to_string(),
                AttributeValue::S(format!("order#{i:06}")),
            ),
        ])
    };
    for i in [3, 4] {
        client
            .update_item()
            .table_name(TABLE)
            .set_key(Some(key(i)))
            .update_expression("SET #s = :s")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":s", AttributeValue::S("shipped".into()))
            .send()
            .await
            .context("UpdateItem on the emulator")?;
    }
    client
        .delete_item()
        .table_name(TABLE)
        .set_key(Some(key(5)))
        .send()
        .await
        .context("DeleteItem on the emulator")?;
    client
        .put_item()
        .table_name(TABLE)
        .set_item(Some(order(999_999)))
        .send()
        .await
        .context("PutItem on the emulator")?;
    Ok(())
}

async fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "demo", "demo", None, None, "demo",
        ))
        .build();
    Client::from_conf(config)
}

async fn create_table(client: &Client) -> anyhow::Result<()> {
    let attribute = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    client
        .create_table()
        .table_name(TABLE)
        .attribute_definitions(attribute("customer")?)
        .attribute_definitions(attribute("order_id")?)
        .key_schema(key("customer", KeyType::Hash)?)
        .key_schema(key("order_id", KeyType::Range)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .context("CreateTable on the emulator")?;
    Ok(())
}

/// A deterministic, realistic order.
fn order(i: u32) -> HashMap<String, AttributeValue> {
    let s = |v: String| AttributeValue::S(v);
    let n = |v: String| AttributeValue::N(v);
    let lines = (0..(i % 4 + 1))
        .map(|l| {
            AttributeValue::M(HashMap::from([
                (
                    "sku".to_string(),
                    s(format!("SKU-{:05}", (i * 7 + l * 13) % 50_000)),
                ),
                ("qty".to_string(), n(format!("{}", l + 1))),
                (
                    "unit_price".to_string(),
                    n(format!("{}.{:02}", 3 + (i + l) % 97, (i * l) % 100)),
                ),
            ]))
        })
        .collect();
    let mut item = HashMap::from([
        (
            "customer".to_string(),
            s(format!("customer#{:04}", i % 250)),
        ),
        ("order_id".to_string(), s(format!("order#{i:06}"))),
        (
            "status".to_string(),
            s(["placed", "paid", "shipped", "delivered"][(i % 4) as usize].to_string()),
        ),
        (
            "total".to_string(),
            n(format!("{}.{:02}", 10 + i % 990, i % 100)),
        ),
        (
            "ledger_id".to_string(),
            n(format!("1234567890123456789{:06}", i)),
        ),
        ("lines".to_string(), AttributeValue::L(lines)),
        (
            "tags".to_string(),
            AttributeValue::Ss(vec!["web".into(), format!("region-{}", i % 5)]),
        ),
        (
            "gift".to_string(),
            AttributeValue::Bool(i.is_multiple_of(7)),
        ),
        (
            "signature".to_string(),
            AttributeValue::B(Blob::new(vec![(i % 256) as u8, 1, 2])),
        ),
        (
            "shipping".to_string(),
            AttributeValue::M(HashMap::from([
                (
                    "city".to_string(),
                    s(
                        ["Lisbon", "Osaka", "Denver", "Accra", "Tallinn"][(i % 5) as usize]
                            .to_string(),
                    ),
                ),
                (
                    "express".to_string(),
                    AttributeValue::Bool(i.is_multiple_of(3)),
                ),
                ("notes".to_string(), AttributeValue::Null(true)),
            ])),
        ),
    ]);
    if i.is_multiple_of(10) {
        item.insert(
            "coupon_values".to_string(),
            AttributeValue::Ns(vec!["5".into(), "12.5".into()]),
        );
    }
    item
}

async fn fill(client: &Client, items: u32) -> anyhow::Result<()> {
    let mut i = 0;
    while i < items {
        let end = (i + 25).min(items);
        let mut requests: Vec<WriteRequest> = (i..end)
            .map(|k| {
                let put = PutRequest::builder().set_item(Some(order(k))).build()?;
                Ok(WriteRequest::builder().put_request(put).build())
            })
            .collect::<anyhow::Result<_>>()?;
        while !requests.is_empty() {
            let output = client
                .batch_write_item()
                .request_items(TABLE, requests)
                .send()
                .await
                .context("BatchWriteItem on the emulator")?;
            requests = output
                .unprocessed_items
                .and_then(|mut u| u.remove(TABLE))
                .unwrap_or_default();
        }
        i = end;
    }
    Ok(())
}

/// The demo's pipeline files as `(name, text)`, for the schema tests.
#[cfg(test)]
pub(crate) fn pipeline_files() -> Vec<(&'static str, String)> {
    let dir = Path::new("ddbpipe-demo");
    steps(dir)
        .iter()
        .map(|step| (step.name, step.yaml("http://127.0.0.1:8000")))
        .collect()
}
