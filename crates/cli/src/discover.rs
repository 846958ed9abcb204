//! `ddbpipe discover`: the tables an account holds, with what a pipeline needs to know.
//!
//! `ListTables` paged by `LastEvaluatedTableName`, then `DescribeTable` per table, 4 at once,
//! each retried by the one policy. A table deleted between the two calls is skipped with a
//! warning; any other failure names the table (exit 1).

use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_source::api::{KeyAttribute, KeyType, TableApi, TableDescription};
use ddbpipe_source::aws;
use ddbpipe_source::plan;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};
use serde_json::{Map, Value as Json, json};
use tokio::task::JoinSet;

use crate::args::DiscoverArgs;
use crate::config::PipelineConfig;
use crate::config::{destination_name_problem, one_destination};
use crate::failure::{Exit, Failure};
use crate::wiring;

/// Tables described at once.
const DESCRIBE_CONCURRENCY: usize = 4;

/// Lists and describes tables, printing them sorted by name.
pub async fn discover(args: DiscoverArgs) -> Result<Exit, Failure> {
    let (settings, retry) = match &args.config {
        Some(path) => {
            let config = wiring::load_config(path)?;
            (
                plan::client_settings(&config.source),
                config.source.retry.policy(),
            )
        }
        None => (args.aws.settings(), RetryPolicy::default()),
    };
    let sdk = aws::load_sdk_config(&settings).await;
    let api = Arc::new(aws::table_api(&sdk));
    let cancel = Cancel::never();

    let names = match &args.table {
        Some(table) => vec![table.clone()],
        None => list_tables(api.as_ref(), &retry, &cancel).await?,
    };
    let (mut tables, missing) = describe_all(api, retry, names).await?;
    if let Some(table) = &args.table
        && !missing.is_empty()
    {
        return Err(Failure::runtime(anyhow!("table '{table}' not found"))
            .hint("check the name, --region / --endpoint-url and the account of the credentials"));
    }
    for name in &missing {
        tracing::warn!(table = %name, "Table vanished between ListTables and DescribeTable; skipped.");
    }
    tables.sort_by(|a, b| a.name.cmp(&b.name));

    if args.json {
        let list: Vec<Json> = tables.iter().map(table_json).collect();
        println!("{}", Json::Array(list));
    } else if tables.is_empty() {
        println!("no tables");
    } else {
        for table in &tables {
            println!("{}", table_line(table));
        }
    }
    Ok(Exit::Ok)
}

async fn list_tables<A: TableApi>(
    api: &A,
    retry: &RetryPolicy,
    cancel: &Cancel,
) -> Result<Vec<String>, Failure> {
    let mut names = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let page = retry
            .run(
                "list_tables",
                || "ListTables".to_string(),
                cancel,
                &NoObserver,
                |_| api.list_tables(start.as_deref()),
            )
            .await
            .map_err(|e| {
                Failure::runtime(e).hint("check --region / --endpoint-url and the credentials")
            })?;
        names.extend(page.names);
        match page.last_evaluated {
            Some(last) => start = Some(last),
            None => return Ok(names),
        }
    }
}

/// The pipelines of the tables `config` reads ([`PipelineConfig::per_table`]), once its
/// `discover` has found them ([`discovered`]); a discovery that finds no table
/// is an error naming what it looked for.
pub async fn each_table(config: &PipelineConfig) -> Result<Vec<PipelineConfig>, Failure> {
    let Some(discovery) = &config.discover else {
        return Ok(config.per_table());
    };
    let found = discovered(config).await?;
    if found.is_empty() {
        return Err(Failure::runtime(anyhow::anyhow!(
            "no table matches source.discover ({})",
            discovery.describe()
        ))
        .hint(
            "check the patterns and tags, source.region and the account of the credentials \
             (`ddbpipe discover` lists the tables they see)",
        ));
    }
    if let Some((first, second, what)) = one_destination(&config.sink, &found) {
        return Err(Failure::usage(anyhow::anyhow!(
            "source.discover ({}) finds tables '{first}' and '{second}', which would write {what}",
            discovery.describe()
        ))
        .hint(format!(
            "exclude one of them (source.discover.exclude: ['{second}']) and read it in a \
             pipeline file of its own with another sink.table"
        )));
    }
    if let Some((table, problem)) = (found.iter())
        .find_map(|table| destination_name_problem(&config.sink, table).map(|p| (table, p)))
    {
        return Err(Failure::usage(anyhow::anyhow!(
            "source.discover ({}) finds table '{table}': sink.table: {problem}",
            discovery.describe()
        ))
        .hint(format!(
            "exclude it (source.discover.exclude: ['{table}']) and read it in a pipeline file \
             of its own with another sink.table"
        )));
    }
    Ok(config.with_tables(found).per_table())
}

/// The tables `config`'s `source.discover` finds (docs/config.md §1.5), sorted by name:
/// `ListTables` to its last page, the names taken by its patterns, then, when it asks for
/// tags, each candidate described (for its ARN) and its `ListTagsOfResource` pages read. A
/// table deleted between the calls is left out; any other failure names the table. A file
/// without `discover` has its own list.
pub async fn discovered(config: &PipelineConfig) -> Result<Vec<String>, Failure> {
    let Some(discovery) = &config.discover else {
        return Ok(config.tables.clone());
    };
    let sdk = aws::load_sdk_config(&plan::client_settings(&config.source)).await;
    let api = Arc::new(aws::table_api(&sdk));
    let retry = config.source.retry.policy();
    let cancel = Cancel::never();
    let candidates: Vec<String> = list_tables(api.as_ref(), &retry, &cancel)
        .await?
        .into_iter()
        .filter(|name| discovery.takes_name(name))
        .collect();
    if discovery.tags.is_empty() {
        return Ok(sorted(candidates));
    }
    let (tables, _gone) = describe_all(Arc::clone(&api), retry, candidates).await?;
    let mut found = Vec::new();
    for table in tables {
        let Some(arn) = &table.arn else { continue };
        let mut tags = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = retry
                .run(
                    "list_tags_of_resource",
                    || format!("ListTagsOfResource '{}'", table.name),
                    &cancel,
                    &NoObserver,
                    |_| api.list_tags(arn, next.as_deref()),
                )
                .await;
            let (page, token) = match page {
                Ok(page) => page,
                Err(error) if error.code() == Some("ResourceNotFoundException") => break,
                Err(error) => {
                    return Err(Failure::runtime(anyhow!(
                        "reading the tags of table '{}': {error}",
                        table.name
                    ))
                    .hint(
                        "discovery by tag needs dynamodb:ListTagsOfResource on the tables \
                         (and dynamodb:ListTables, dynamodb:DescribeTable)",
                    ));
                }
            };
            tags.extend(page);
            match token {
                Some(token) => next = Some(token),
                None => break,
            }
        }
        if discovery.takes_tags(&tags) {
            found.push(table.name);
        }
    }
    Ok(sorted(found))
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

/// Describes `names`: the tables, and the names no table answered to.
async fn describe_all<A: TableApi>(
    api: Arc<A>,
    retry: RetryPolicy,
    names: Vec<String>,
) -> Result<(Vec<TableDescription>, Vec<String>), Failure> {
    let mut pending = names.into_iter();
    let mut tasks = JoinSet::new();
    let mut tables = Vec::new();
    let mut missing = Vec::new();
    loop {
        while tasks.len() < DESCRIBE_CONCURRENCY {
            let Some(name) = pending.next() else { break };
            let api = Arc::clone(&api);
            tasks.spawn(async move {
                let described = retry
                    .run(
                        "describe_table",
                        || format!("DescribeTable '{name}'"),
                        &Cancel::never(),
                        &NoObserver,
                        |_| api.describe_table(&name),
                    )
                    .await;
                (name, described)
            });
        }
        let Some(joined) = tasks.join_next().await else {
            return Ok((tables, missing));
        };
        let (name, described) =
            joined.map_err(|e| Failure::runtime(anyhow!("internal error: describe task: {e}")))?;
        match described {
            Ok(Some(table)) => tables.push(table),
            Ok(None) => missing.push(name),
            Err(error) if error.code() == Some("ResourceNotFoundException") => missing.push(name),
            Err(error) => {
                return Err(Failure::runtime(anyhow!(
                    "describing table '{name}': {error}"
                )));
            }
        }
    }
}

fn key_fragment(key: &KeyAttribute) -> Json {
    match key.key_type {
        KeyType::N => json!({"type": ["number", "string"]}),
        KeyType::S | KeyType::B => json!({"type": "string"}),
    }
}

fn table_json(table: &TableDescription) -> Json {
    let mut properties = Map::new();
    for key in &table.key_schema {
        properties.insert(key.name.clone(), key_fragment(key));
    }
    let mut out = Map::new();
    out.insert("name".into(), json!(table.name));
    out.insert("kind".into(), json!("table"));
    out.insert("config_patch".into(), json!({"table_name": table.name}));
    out.insert(
        "schema".into(),
        json!({"type": "object", "properties": properties}),
    );
    out.insert(
        "primary_key".into(),
        json!(
            table
                .key_schema
                .iter()
                .map(|k| k.name.clone())
                .collect::<Vec<_>>()
        ),
    );
    if let Some(count) = table.item_count.filter(|c| *c >= 0) {
        out.insert("estimated_rows".into(), json!(count));
    }
    if let Some(size) = table.size_bytes {
        out.insert("size_bytes".into(), json!(size));
    }
    if let Some(mode) = &table.billing_mode {
        out.insert("billing_mode".into(), json!(mode));
    }
    if let Some(rcu) = table.read_capacity_units {
        out.insert("read_capacity_units".into(), json!(rcu));
    }
    let stream = match &table.stream {
        Some(s) => {
            let mut m = Map::new();
            m.insert("enabled".into(), json!(s.enabled));
            if let Some(v) = &s.view_type {
                m.insert("view_type".into(), json!(v));
            }
            if let Some(a) = &s.arn {
                m.insert("arn".into(), json!(a));
            }
            Json::Object(m)
        }
        None => Json::Null,
    };
    out.insert("stream".into(), stream);
    let indexes: Vec<Json> = table
        .indexes
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "kind": i.kind.as_str(),
                "primary_key": i.key_schema.iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    out.insert("indexes".into(), Json::Array(indexes));
    Json::Object(out)
}

fn table_line(table: &TableDescription) -> String {
    let keys: Vec<String> = table
        .key_schema
        .iter()
        .map(|k| format!("{} ({})", k.name, k.key_type.tag()))
        .collect();
    let stream = match &table.stream {
        Some(s) if s.enabled => format!("stream {}", s.view_type.as_deref().unwrap_or("?")),
        _ => "no stream".to_string(),
    };
    let indexes = if table.indexes.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = table.indexes.iter().map(|i| i.name.as_str()).collect();
        format!(", indexes: {}", names.join(", "))
    };
    let size = table
        .size_bytes
        .map(|bytes| format!("  {}", human_bytes(bytes)))
        .unwrap_or_default();
    let capacity = match (table.read_capacity_units, table.max_read_request_units) {
        (Some(rcu), _) if rcu > 0 => format!(", {rcu} RCU"),
        (_, Some(max)) if max > 0 => format!(", max {max} read units/s"),
        _ => String::new(),
    };
    format!(
        "{}  key: {}  ~{} items{size}  {}{capacity}  {}{}",
        table.name,
        keys.join(", "),
        table.item_count.unwrap_or(0),
        table.billing_mode.as_deref().unwrap_or("?"),
        stream,
        indexes
    )
}

/// `1536` → `1.5 KiB`: the size DynamoDB reports (refreshed about every six hours).
fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
