//! `ddbpipe check`: validate, then probe the table, the sink and the state without reading
//! data (docs/cli.md §8.2). Each probe is PASS, WARN or FAIL with a detail line.

use std::path::Path;
use std::time::Duration;

use ddbpipe_keyed::state::DatabaseStore;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_source::api::{StreamsApi, TableApi, TableDescription};
use ddbpipe_source::aws;
use ddbpipe_source::config::Mode;
use ddbpipe_source::plan::{self, ReadRule, index_problem, view_warning};
use ddbpipe_source::retry::{Cancel, NoObserver};
use serde_json::json;

use crate::config::{PipelineConfig, SinkConfig};
use crate::destination;
use crate::failure::{Exit, Failure};
use crate::wiring;

mod export;
mod kafka;
mod lake;
mod leases;
mod paths;
mod state;

use self::kafka::{probe_kafka, probe_positions};
use self::paths::{creatable_beside, probe_jsonl, writable};
use self::state::{probe_state, state_verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

struct Probe {
    name: &'static str,
    status: Status,
    detail: String,
    /// More about the probe for `--json`, under `data`.
    data: Option<serde_json::Value>,
}

#[derive(Default)]
struct Probes(Vec<Probe>);

impl Probes {
    fn add(&mut self, name: &'static str, status: Status, detail: impl Into<String>) {
        self.0.push(Probe {
            name,
            status,
            detail: detail.into(),
            data: None,
        });
    }

    /// [`Probes::add`] with `data` for `--json`.
    fn add_with(
        &mut self,
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        data: serde_json::Value,
    ) {
        self.add(name, status, detail);
        if let Some(probe) = self.0.last_mut() {
            probe.data = Some(data);
        }
    }

    fn ok(&self) -> bool {
        self.0.iter().all(|p| p.status != Status::Fail)
    }
}

/// Runs every probe and prints them; exit 0 when none failed.
pub async fn check(config_path: &Path, json: bool, timeout: Duration) -> Result<Exit, Failure> {
    let config = match wiring::load_config(config_path) {
        Ok(config) => config,
        // `--json` keeps stdout machine-readable when the file itself is invalid too.
        Err(failure) if json => {
            let errors: Vec<String> = format!("{:#}", failure.error)
                .lines()
                .map(str::to_string)
                .collect();
            println!(
                "{}",
                json!({"errors": errors, "hint": failure.hint, "ok": false, "probes": []})
            );
            return Ok(failure.exit);
        }
        Err(failure) => return Err(failure),
    };
    if !config.is_multi_table() {
        let probes = probe(&config, config_path, timeout).await;
        if json {
            println!("{}", json!({"ok": probes.ok(), "probes": probes.to_json()}));
        } else {
            probes.print();
        }
        return Ok(if probes.ok() { Exit::Ok } else { Exit::Runtime });
    }
    // A file of several tables: each table's pipeline probed as a file of its own.
    let mut ok = true;
    let mut listed = Vec::new();
    let tables = match crate::discover::each_table(&config).await {
        Ok(tables) => tables,
        Err(failure) if json => {
            let error = format!("{:#}", failure.error);
            println!(
                "{}",
                json!({"errors": [error], "hint": failure.hint, "ok": false, "tables": []})
            );
            return Ok(failure.exit);
        }
        Err(failure) => return Err(failure),
    };
    if config.discover.is_some() && !json {
        let names: Vec<&str> = tables
            .iter()
            .map(|one| one.source.table_name.as_str())
            .collect();
        println!(
            "discovered {} table(s): {}\n",
            names.len(),
            names.join(", ")
        );
    }
    for (index, one) in tables.iter().enumerate() {
        let probes = probe(one, config_path, timeout).await;
        ok &= probes.ok();
        if json {
            listed.push(json!({"ok": probes.ok(), "pipeline": one.name,
                               "probes": probes.to_json(), "table": one.source.table_name}));
        } else {
            if index > 0 {
                println!();
            }
            println!(
                "table '{}' (pipeline '{}'):",
                one.source.table_name, one.name
            );
            probes.print();
        }
    }
    // Kept positions of tables the file no longer reads: warnings, as `run` gives them (a
    // store that cannot be read is each table's own probe's to fail).
    let unlisted = match crate::unlisted::unlisted(&config, &tables).await {
        Ok(found) => found.unwrap_or_default(),
        Err(failure) => {
            if !json {
                println!(
                    "\nWARN could not look for kept positions of tables the file no longer \
                     reads: {:#}",
                    failure.error
                );
            }
            Vec::new()
        }
    };
    if json {
        let unlisted: Vec<_> = unlisted
            .iter()
            .map(|one| {
                json!({"table": one.table, "pipeline": one.pipeline,
                              "warning": one.warning(&config)})
            })
            .collect();
        println!(
            "{}",
            json!({"ok": ok, "tables": listed, "unlisted": unlisted})
        );
    } else {
        for one in &unlisted {
            println!("\nWARN {}", one.warning(&config));
        }
    }
    Ok(if ok { Exit::Ok } else { Exit::Runtime })
}

/// Every probe of one table's pipeline (docs/cli.md §8.2).
async fn probe(config: &PipelineConfig, config_path: &Path, timeout: Duration) -> Probes {
    let mut probes = Probes::default();
    let mode = config.source.mode;
    let detail = format!(
        "pipeline '{}', mode {mode}, table '{}'",
        config.name, config.source.table_name
    );
    if config.warnings.is_empty() {
        probes.add("config", Status::Pass, detail);
    } else {
        probes.add(
            "config",
            Status::Warn,
            format!("{detail}; {}", config.warnings.join("; ")),
        );
    }
    let (table, location) = probe_table(config, timeout, &mut probes).await;
    export::probe_export(config, table.as_ref(), timeout, &mut probes).await;
    let stream = if mode.reads_stream() {
        probe_stream(config, table.as_ref(), timeout, &mut probes).await
    } else {
        None
    };
    let stream = stream.as_deref();
    let lease_rows = match &config.coordination {
        Some(coordination) => {
            // The settings `run` compares with the leader row's.
            let identity = crate::run::run_identity(config, &location, stream);
            leases::probe_leases(config, coordination, &identity, timeout, &mut probes).await
        }
        None => None,
    };
    // The same rule `run` applies before writing anything.
    let distinct = destination::distinct_paths(config, Some(config_path));
    match (&config.sink, distinct) {
        (_, Err(failure)) => {
            probes.add("sink", Status::Fail, with_hint(&failure));
            if let (SinkConfig::Jsonl(_) | SinkConfig::Custom, None) =
                (&config.sink, &config.coordination)
            {
                probe_state(config, &location, stream, timeout, &mut probes).await;
            }
        }
        (SinkConfig::Custom, Ok(())) => {
            probes.add(
                "sink",
                Status::Fail,
                crate::sinks::custom::NO_CUSTOM_SINK.to_string(),
            );
            probe_state(config, &location, stream, timeout, &mut probes).await;
        }
        (SinkConfig::Jsonl(jsonl), Ok(())) => match &config.coordination {
            // A shared run writes this worker's file, and keeps its position in the leases.
            Some(coordination) => {
                let mut worker = config.clone();
                let mut file = jsonl.clone();
                match crate::sinks::jsonl::worker_path(&config.sink, &coordination.worker_id()) {
                    Ok(path) => {
                        if let Some(path) = path {
                            file.path = crate::config::JsonlTarget::File(path);
                        }
                        worker.sink = SinkConfig::Jsonl(file.clone());
                        probe_jsonl(&worker, &file, &mut probes);
                    }
                    Err(failure) => probes.add("sink", Status::Fail, with_hint(&failure)),
                }
            }
            None => {
                probe_jsonl(config, jsonl, &mut probes);
                probe_state(config, &location, stream, timeout, &mut probes).await;
            }
        },
        (SinkConfig::Kafka(kafka), Ok(())) => {
            probe_kafka(config, kafka, timeout, &mut probes).await;
            if config.sink.keeps_position().is_some() {
                probe_positions(config, &location, stream, timeout, &mut probes).await;
            } else {
                probe_state(config, &location, stream, timeout, &mut probes).await;
            }
        }
        (SinkConfig::Parquet(parquet), Ok(())) => {
            lake::probe_parquet(config, parquet, table.as_ref(), timeout, &mut probes).await;
            probe_positions(config, &location, stream, timeout, &mut probes).await;
        }
        (SinkConfig::Sqlite(_) | SinkConfig::Postgres(_), Ok(())) => {
            probe_keyed(
                config,
                table.as_ref(),
                &location,
                stream,
                timeout,
                &mut probes,
            )
            .await;
        }
    }
    // A shared pipeline's position is its lease rows.
    if let (Some(coordination), Some(rows)) = (&config.coordination, &lease_rows) {
        leases::probe_positions(config, coordination, rows, stream, timeout, &mut probes).await;
    }

    probes
}

impl Probes {
    /// The probes as `--json` lists them.
    fn to_json(&self) -> Vec<serde_json::Value> {
        self.0
            .iter()
            .map(|p| {
                let mut probe =
                    json!({"detail": p.detail, "name": p.name, "status": p.status.as_str()});
                if let Some(data) = &p.data {
                    probe["data"] = data.clone();
                }
                probe
            })
            .collect()
    }

    /// One line a probe.
    fn print(&self) {
        for p in &self.0 {
            println!("{} {:<16} {}", p.status.as_str(), p.name, p.detail);
        }
    }
}

/// How long the one attempt after a timed-out `describe_table` probe may take.
const LAST_ATTEMPT: Duration = Duration::from_secs(5);

/// `describe_table`, `key_schema`, `index`, `read_capacity`; the table (when described) and
/// where it lives.
async fn probe_table(
    config: &PipelineConfig,
    timeout: Duration,
    probes: &mut Probes,
) -> (Option<TableDescription>, Location) {
    let source = &config.source;
    let (api, mut location) = wiring::table_api(source).await;
    let described =
        tokio::time::timeout(timeout, wiring::describe(&api, source, &Cancel::never())).await;
    let table = match described {
        Ok(Ok(table)) => table,
        Ok(Err(failure)) => {
            let hint = failure
                .hint
                .as_ref()
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            probes.add("describe_table", Status::Fail, format!("{failure}{hint}"));
            return (None, location);
        }
        Err(_) => {
            // The retries outlasted the probe: one more attempt, alone, says why (connection
            // refused, DNS, TLS) instead of only that nothing came back.
            let why =
                match tokio::time::timeout(LAST_ATTEMPT, api.describe_table(&source.table_name))
                    .await
                {
                    Ok(Err(error)) => format!(": the last attempt failed: {error}"),
                    Ok(Ok(_)) => {
                        ": the last attempt succeeded; the endpoint answers slowly".to_string()
                    }
                    Err(_) => String::new(),
                };
            probes.add(
                "describe_table",
                Status::Fail,
                format!("no answer within {} s{why}", timeout.as_secs()),
            );
            return (None, location);
        }
    };
    location.learn(&table);
    let rcu = table
        .read_capacity_units
        .filter(|r| *r > 0)
        .map(|r| format!(", RCU {r}"))
        .unwrap_or_default();
    probes.add(
        "describe_table",
        Status::Pass,
        format!(
            "status {}, ~{} items, billing {}{rcu}",
            table.status.as_deref().unwrap_or("unknown"),
            table.item_count.unwrap_or(0),
            table.billing_mode.as_deref().unwrap_or("unknown"),
        ),
    );
    if table.key_schema.is_empty() {
        probes.add(
            "key_schema",
            Status::Fail,
            format!("table '{}' has an empty key schema", table.name),
        );
    } else {
        let keys: Vec<String> = table
            .key_schema
            .iter()
            .map(|k| format!("{} ({})", k.name, k.key_type.tag()))
            .collect();
        probes.add("key_schema", Status::Pass, keys.join(", "));
    }
    match (&source.index_name, index_problem(source, &table)) {
        (_, Some(problem)) => probes.add("index", Status::Fail, problem.to_string()),
        (Some(name), None) => probes.add("index", Status::Pass, format!("index '{name}' found")),
        (None, None) => probes.add("index", Status::Pass, "no index_name: reads the table"),
    }
    match ReadRule::of(source).rate(&table) {
        Ok(Some(rate)) => probes.add(
            "read_capacity",
            Status::Pass,
            format!("limited to {rate:.1} read units/s"),
        ),
        Ok(None) => probes.add("read_capacity", Status::Pass, "unlimited"),
        Err(problem) => probes.add("read_capacity", Status::Fail, problem.to_string()),
    }
    (Some(table), location)
}

/// Streams and mirror (docs/cli.md §8.2 item 3): `stream`, `stream_view_type`, `describe_stream`.
/// Skipped when `describe_table` failed (that ends the source probes). Only the first
/// `DescribeStream` page is read, and no shard iterator is opened. Returns the stream's ARN
/// when it resolved.
async fn probe_stream(
    config: &PipelineConfig,
    table: Option<&TableDescription>,
    timeout: Duration,
    probes: &mut Probes,
) -> Option<String> {
    // `describe_table` failed: that ends the source probes.
    let table = table?;
    let source = &config.source;
    let sdk = aws::load_sdk_config(&plan::client_settings(source)).await;
    let cancel = Cancel::never();
    // The table was described once already; its stream comes from that answer.
    let resolved = plan::resolve_stream(source, table);
    let stream = match resolved {
        Ok(stream) => stream,
        Err(problem) => {
            probes.add("stream", Status::Fail, problem.to_string());
            return None;
        }
    };
    let origin = if source.stream_arn.is_some() {
        "set by stream_arn"
    } else {
        "enabled on the table"
    };
    probes.add("stream", Status::Pass, format!("{} ({origin})", stream.arn));

    let streams_api = aws::streams_api(&sdk);
    let arn = stream.arn.as_str();
    let retry = source.retry.policy();
    let first_page = retry.run(
        "describe_stream",
        || format!("DescribeStream {arn}"),
        &cancel,
        &NoObserver,
        |_| streams_api.describe_stream(arn, None, None),
    );
    let described = match tokio::time::timeout(timeout, first_page).await {
        Ok(Ok(page)) => Ok(page),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    };
    let view = stream.view_type.clone().or_else(|| {
        described
            .as_ref()
            .ok()
            .and_then(|page| page.view_type.clone())
    });
    let (status, detail) = view_type_verdict(config, view.as_deref());
    probes.add("stream_view_type", status, detail);
    match described {
        Ok(page) => {
            let more = if page.last_evaluated_shard_id.is_some() {
                " on the first page"
            } else {
                ""
            };
            probes.add(
                "describe_stream",
                Status::Pass,
                format!(
                    "status {}, {} shard(s){more}",
                    page.status.as_deref().unwrap_or("unknown"),
                    page.shards.len()
                ),
            );
        }
        Err(problem) => probes.add("describe_stream", Status::Fail, problem),
    }
    Some(stream.arn)
}

/// The `stream_view_type` probe (docs/streams.md §4.2): the sinks that store new images and
/// mirror mode need them;
/// streams into jsonl take any view, with a warning naming what the envelopes will miss.
fn view_type_verdict(config: &PipelineConfig, view: Option<&str>) -> (Status, String) {
    let Some(view) = view else {
        return (
            Status::Warn,
            "the stream view type is unknown (neither DescribeTable nor DescribeStream reported it)"
                .to_string(),
        );
    };
    let needs_new_images = config.sink.needs_new_images() || config.source.mode == Mode::Mirror;
    if needs_new_images && plan::lacks_new_images(view) {
        let who = if config.source.mode == Mode::Mirror {
            "mode: mirror".to_string()
        } else {
            format!("the {} sink", config.sink.kind())
        };
        return (
            Status::Fail,
            format!(
                "the stream view is {view}: {who} needs NEW_IMAGE or NEW_AND_OLD_IMAGES — {}",
                plan::NEW_IMAGES_REMEDY
            ),
        );
    }
    match view_warning(Some(view)) {
        Some(warning) => (Status::Warn, warning),
        None => (
            Status::Pass,
            format!("{view}: envelopes carry the images this pipeline needs"),
        ),
    }
}

/// A failure's text with its remedy in parentheses.
fn with_hint(failure: &Failure) -> String {
    match &failure.hint {
        Some(hint) => format!("{failure} ({hint})"),
        None => failure.to_string(),
    }
}

/// The `sink` and `state` probes of a keyed sink (docs/cli.md §8.2 items 4–5): the database is
/// reachable, the table creatable or compatible with the rights to write; the stored state
/// readable and of this source; the lock free. Nothing is created or changed.
async fn probe_keyed(
    config: &PipelineConfig,
    table: Option<&TableDescription>,
    location: &Location,
    stream: Option<&str>,
    timeout: Duration,
    probes: &mut Probes,
) {
    let kind = config.sink.kind();
    let opened =
        tokio::time::timeout(timeout, crate::sinks::keyed::open_existing(&config.sink)).await;
    let db = match opened {
        Err(_) => {
            probes.add(
                "sink",
                Status::Fail,
                format!("{kind}: no answer within {} s", timeout.as_secs()),
            );
            return;
        }
        Ok(Err(failure)) => {
            probes.add("sink", Status::Fail, with_hint(&failure));
            return;
        }
        Ok(Ok(None)) => {
            let SinkConfig::Sqlite(sqlite) = &config.sink else {
                return;
            };
            // The key rules need only the table's description, not the database.
            match table.map(|table| crate::sinks::keyed::table_spec(config.target(), Some(table))) {
                Some(Err(failure)) => probes.add("sink", Status::Fail, with_hint(&failure)),
                // Without create_table the run needs the table, so it needs the database.
                _ if !sqlite.keyed.create_table => probes.add(
                    "sink",
                    Status::Fail,
                    format!(
                        "sqlite {}: the database does not exist and create_table is false, so \
                         the run cannot find its table; create it, or set create_table: true",
                        sqlite.path.display()
                    ),
                ),
                _ => match writable(&sqlite.path) {
                    Ok(detail) => probes.add(
                        "sink",
                        Status::Pass,
                        format!("sqlite {}: {detail}", sqlite.path.display()),
                    ),
                    Err(problem) => probes.add(
                        "sink",
                        Status::Fail,
                        format!("sqlite {}: {problem}", sqlite.path.display()),
                    ),
                },
            }
            if config.coordination.is_none() {
                probes.add("state", Status::Pass, "no database yet: no stored position");
            }
            return;
        }
        Ok(Ok(Some(db))) => db,
    };
    // SQLite may open a file it cannot write read-only without a word; the run then fails
    // at its first write. It also creates its -wal and -shm files beside the database.
    let file_problem = match &config.sink {
        SinkConfig::Sqlite(sqlite) => writable(&sqlite.path)
            .and_then(|_| creatable_beside(&sqlite.path))
            .err()
            .map(|problem| {
                format!(
                    "sqlite {}: {problem} (the run writes the database and its -wal and -shm \
                     files beside it)",
                    sqlite.path.display()
                )
            }),
        SinkConfig::Jsonl(_)
        | SinkConfig::Postgres(_)
        | SinkConfig::Kafka(_)
        | SinkConfig::Parquet(_)
        | SinkConfig::Custom => None,
    };
    match crate::sinks::keyed::table_spec(config.target(), table) {
        Err(failure) => probes.add("sink", Status::Fail, with_hint(&failure)),
        Ok(_) if file_problem.is_some() => {
            probes.add("sink", Status::Fail, file_problem.unwrap_or_default());
        }
        Ok(spec) if table.is_none() => probes.add(
            "sink",
            Status::Warn,
            format!(
                "{}: reachable; table '{}' not checked (DescribeTable failed)",
                db.describe(),
                spec.table
            ),
        ),
        Ok(spec) => match tokio::time::timeout(timeout, db.probe(&spec)).await {
            Ok(Ok(detail)) => probes.add("sink", Status::Pass, format!("{kind} {detail}")),
            Ok(Err(error)) => {
                probes.add("sink", Status::Fail, format!("{kind}: {}", error.message))
            }
            Err(_) => probes.add(
                "sink",
                Status::Fail,
                format!("{kind}: no answer within {} s", timeout.as_secs()),
            ),
        },
    }
    let spec = crate::sinks::keyed::table_spec(config.target(), None).ok();
    // A shared pipeline keeps no position in `_ddbpipe_state`: its `state` is its lease rows.
    let (Some(spec), None) = (spec, &config.coordination) else {
        return;
    };
    // What the run refuses: another pipeline's position of rows in this table.
    let another = crate::sinks::keyed::another_writer(&db, &spec, &config.name).await;
    let mut store = DatabaseStore::new(db.clone(), spec);
    let where_ = store.describe();
    let (mut status, mut detail) = match (another, store.load(&config.name).await) {
        (Err(failure) | Ok(Some(failure)), _) => (Status::Fail, with_hint(&failure)),
        (_, Err(error)) => (Status::Fail, error.to_string()),
        (_, Ok(entry)) => state_verdict(config, location, stream, &where_, entry, timeout).await,
    };
    if let Ok(Some(holder)) = db.lock_holder(&config.name).await
        && status == Status::Pass
    {
        status = Status::Warn;
        let pid = holder.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
        detail.push_str(&format!(
            "; pipeline '{}' is running now (lock {}{pid})",
            config.name, holder.location
        ));
    }
    probes.add("state", status, detail);
}
