//! A scan, query or stream shared by several workers (`coordination:`, docs/coordination.md
//! §11.10, §11.11): describe the table (resolve the stream), open this worker's jsonl file or
//! the keyed sink and the lease table, then hand the run to the library's leased runner.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use ddbpipe_pipeline::leased::{
    LeasedMirror, LeasedOutcome, LeasedScan, LeasedStreams, SharedExports, other_settings,
};
use ddbpipe_pipeline::runner::NoProgress;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::sinks::jsonl::{self, JsonlSink};
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{StreamRun, StreamRunError};
use ddbpipe_source::api::{Render, SnapshotShape};
use ddbpipe_source::aws::{self, AwsLeaseTable};
use ddbpipe_source::config::Mode;
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::lease::{
    LeaseError, LeaseSettings, LeaseTable, PipelineName, UnitId, Worker, WorkerId,
};
use ddbpipe_source::plan::{ScanPlan, StreamPlan};
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::Cancel;

use crate::args::ProgressMode;
use crate::config::{
    CoordinationConfig, JsonlTarget, PipelineConfig, SinkConfig, WORKER_PLACEHOLDER, process_token,
};
use crate::destination::{self, AnySink};
use crate::failure::Failure;
use crate::given::Given;
use crate::summary::{Ended, Summary};
use crate::telemetry::ScanProgress;
use crate::wiring::{self, describe};

/// How long a missing lease table may take to become `ACTIVE`: polled every second.
const TABLE_ACTIVE_ATTEMPTS: u32 = 120;

/// Runs one worker of a shared `mode: scan` or `mode: query` pipeline.
pub async fn run(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    config_path: &Path,
    given: &Given,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let source = &config.source;
    let kind = match source.mode {
        Mode::Query => ScanKind::Query,
        _ => ScanKind::Scan,
    };
    let worker_id = coordination.worker_id();
    let (sdk, api, mut location) = wiring::clients(source, given.sdk.as_ref()).await;
    let api = Arc::new(api);
    let table = describe(api.as_ref(), source, &stop).await?;
    location.learn(&table);
    let identity = run_identity(config, &location, None);
    let leases = open_lease_table(&sdk, coordination).await?;
    same_settings(&leases, config, &identity).await?;
    let owner = lease_owner(&worker_id)?;
    alone_with_id(&leases, config, coordination, &owner, &stop).await?;
    let mut sink = match &config.sink {
        SinkConfig::Jsonl(_) => {
            AnySink::Jsonl(open_worker_file(config, &worker_id, Records::Items)?)
        }
        // Refused with coordination when the config was loaded.
        SinkConfig::Custom => return Err(destination::no_custom_sink()),
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            AnySink::Keyed(open_keyed(config, &table, Records::Items).await?)
        }
    };
    let worker = worker_on(leases, config, coordination, &owner)?;
    let plan = ScanPlan::build(source, &table)
        .map_err(|problem| Failure::usage(problem.config_error()))?;
    let (reader, refresher) =
        super::scan::segment_reader(api, &plan, Render::Items(plan.format), &stop);
    tracing::info!(
        mode = %source.mode,
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        segments = plan.total_segments,
        "Shared run started."
    );
    let started = Instant::now();
    let bar = ScanProgress::new(progress, None, 0, plan.total_segments);
    let outcome = LeasedScan {
        reader,
        worker,
        batch: plan.batch,
        checkpoint_interval: Duration::from_millis(config.state.flush_interval_ms),
        identity,
    }
    .run(&mut sink, stop, &bar)
    .await;
    bar.finish();
    drop(refresher);
    let outcome =
        outcome.map_err(|error| super::scan::run_failure(error, config, config_path, kind))?;
    let mut summary = summarize(
        config,
        coordination,
        &worker_id,
        &outcome,
        started.elapsed(),
    );
    if !outcome.completed {
        summary.note = Some(super::stopped_note(
            config_path,
            "its leases were handed back with their checkpoints and the other workers go on",
            "joins again",
        ));
    }
    Ok(summary)
}

/// `sink.path` with this worker's id in place of `{worker}`; `None` for a sink that is not a
/// jsonl file. Every part of the path that holds `{worker}` must stay one file or directory
/// name once the id is in it: an id making it `.` or `..` (or splitting it) would put the file
/// somewhere the template does not, and is refused naming the field.
pub fn worker_path(config: &PipelineConfig, worker_id: &str) -> Result<Option<PathBuf>, Failure> {
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        return Ok(None);
    };
    let JsonlTarget::File(template) = &jsonl.path else {
        return Ok(None);
    };
    let mut path = PathBuf::new();
    for part in template.components() {
        let text = part.as_os_str().to_string_lossy();
        if !text.contains(WORKER_PLACEHOLDER) {
            path.push(part);
            continue;
        }
        let replaced = text.replace(WORKER_PLACEHOLDER, worker_id);
        let mut parts = Path::new(&replaced).components();
        match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(name)), None) => path.push(name),
            _ => {
                return Err(Failure::usage(anyhow!(
                    "config error: sink.path: '{}' with worker id '{worker_id}' names '{replaced}', \
                     which leaves the place the template gives its file: use another \
                     coordination.worker_id",
                    template.display()
                )));
            }
        }
    }
    Ok(Some(path))
}

/// The settings a shared run keeps in its leader row (docs/coordination.md §11.10): the state
/// file's identity, with the stream read in place of the one configured — a re-created table's
/// new stream is refused while the old one's rows are in the lease table — and the sink's type
/// and target (`sink`): a worker writing elsewhere would take a share of the data away from
/// the others' destination.
pub fn run_identity(
    config: &PipelineConfig,
    location: &ddbpipe_pipeline::state::identity::Location,
    stream_arn: Option<&str>,
) -> Identity {
    wiring::identity(config, location, None)
        .of_shared_run(destination::sink_identity(config), stream_arn)
}

/// Refuses a worker whose settings differ from those the pipeline's leader row keeps
/// (docs/coordination.md §11.10), before its sink is opened: a worker writing elsewhere
/// creates no file or table there. The runner compares them again at its first round, should
/// the first leader write them meanwhile.
async fn same_settings(
    leases: &AwsLeaseTable,
    config: &PipelineConfig,
    identity: &Identity,
) -> Result<(), Failure> {
    let pipeline = pipeline_name(config)?;
    let leader = leases
        .get(&pipeline, &UnitId::Leader)
        .await
        .map_err(|error| lease_table_failure(error, leases.table_name()))?;
    let stored = leader.as_ref().and_then(|row| row.settings());
    match stored.and_then(|stored| other_settings(&config.name, stored, identity)) {
        Some(message) => Err(Failure::runtime(anyhow!(
            "lease table '{}': {message}",
            leases.table_name()
        ))),
        None => Ok(()),
    }
}

/// This process's lease owner: `worker_id` and this process's token (docs/coordination.md
/// §11.2 rule 6). Made once per process: the phases of a mirror are one owner.
fn lease_owner(worker_id: &str) -> Result<WorkerId, Failure> {
    let named =
        |error: ddbpipe_source::lease::BadName| Failure::usage(anyhow!("config error: {error}"));
    WorkerId::new(worker_id)
        .and_then(|id| id.of_process(&process_token()))
        .map_err(named)
}

/// Refuses to start while another live process runs under this process's worker id
/// (docs/coordination.md §11.10 rule 8): when rows name the id under another process's
/// token, they are watched for one lease duration, and one whose counter that process moved
/// meanwhile stops this one, naming that process's host and pid. Rows that stood still are a
/// previous life's: they expire as any other worker's.
async fn alone_with_id(
    leases: &AwsLeaseTable,
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    owner: &WorkerId,
    stop: &Cancel,
) -> Result<(), Failure> {
    let pipeline = pipeline_name(config)?;
    let list = || async {
        leases
            .list(&pipeline)
            .await
            .map_err(|error| lease_table_failure(error, leases.table_name()))
    };
    let twins: Vec<_> = list()
        .await?
        .into_iter()
        .filter(|row| {
            row.owner
                .as_ref()
                .is_some_and(|other| other.name() == owner.name() && other != owner)
        })
        .collect();
    if twins.is_empty() {
        return Ok(());
    }
    tracing::info!(
        worker = %owner.name(),
        rows = twins.len(),
        "Lease rows name this worker id under another process: watching them for a lease \
         duration before starting."
    );
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(coordination.lease_duration_secs)) => {}
        () = stop.cancelled() => return Ok(()),
    }
    let now = list().await?;
    let live = twins.iter().find_map(|twin| {
        now.iter().find(|row| {
            row.unit == twin.unit && row.owner == twin.owner && row.counter != twin.counter
        })
    });
    let Some(row) = live else {
        return Ok(());
    };
    let other = row
        .owner
        .as_ref()
        .and_then(WorkerId::process)
        .unwrap_or("?");
    let mut parts = other.splitn(3, '/');
    let (host, pid) = (parts.next().unwrap_or("?"), parts.next().unwrap_or("?"));
    Err(Failure::usage(anyhow!(
        "worker id '{}' is in use by a live process of pipeline '{}': pid {pid} on host {host} \
         (it renewed lease '{}' in lease table '{}' while this one watched)",
        owner.name(),
        config.name,
        row.unit,
        leases.table_name()
    ))
    .hint(
        "give each process its own coordination.worker_id (or leave it unset: \
         <hostname>-<pid>), or stop the other process first",
    ))
}

/// This process, as lease owner `owner`, on the opened lease table `leases`.
fn worker_on(
    leases: AwsLeaseTable,
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    owner: &WorkerId,
) -> Result<Worker<AwsLeaseTable>, Failure> {
    let settings = LeaseSettings::new(coordination.lease_duration_secs)
        .map_err(|error| Failure::usage(anyhow!("config error: {error}")))?;
    Ok(Worker::new(
        leases,
        pipeline_name(config)?,
        owner.clone(),
        settings,
    ))
}

/// The pipeline's name, as its lease rows are kept under.
fn pipeline_name(config: &PipelineConfig) -> Result<PipelineName, Failure> {
    PipelineName::new(config.name.clone())
        .map_err(|error| Failure::usage(anyhow!("config error: {error}")))
}

/// Runs one worker of a shared `mode: streams` pipeline (docs/coordination.md §11.11).
pub async fn run_streams(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    config_path: &Path,
    given: &Given,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let source = &config.source;
    let worker_id = coordination.worker_id();
    let opened = super::streams::open_stream(config, given, &stop).await?;
    let identity = run_identity(config, &opened.location, Some(&opened.stream.arn));
    let leases = open_lease_table(&opened.sdk, coordination).await?;
    same_settings(&leases, config, &identity).await?;
    let owner = lease_owner(&worker_id)?;
    alone_with_id(&leases, config, coordination, &owner, &stop).await?;
    let mut sink = match &config.sink {
        SinkConfig::Jsonl(_) => {
            AnySink::Jsonl(open_worker_file(config, &worker_id, Records::Envelopes)?)
        }
        // Refused with coordination when the config was loaded.
        SinkConfig::Custom => return Err(destination::no_custom_sink()),
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let Some(table) = &opened.table else {
                return Err(Failure::runtime(anyhow!(
                    "internal error: a keyed sink needs the table's key schema"
                )));
            };
            AnySink::Keyed(open_keyed(config, table, Records::Envelopes).await?)
        }
    };
    let worker = worker_on(leases, config, coordination, &owner)?;
    let plan = StreamPlan::build(source);
    let run = StreamRun::new(
        &plan,
        &source.table_name,
        &opened.stream.arn,
        config_path.display().to_string(),
    );
    tracing::info!(
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        stream = %opened.stream.arn,
        "Shared stream started."
    );
    let started = Instant::now();
    let outcome = LeasedStreams {
        api: Arc::new(aws::streams_api(&opened.sdk)),
        run,
        worker,
        checkpoint_interval: Duration::from_millis(config.state.flush_interval_ms),
        observer: Arc::new(RequestMetrics),
        identity,
        kept: Vec::new(),
    }
    .run(&mut sink, stop, &NoProgress)
    .await
    .map_err(|error| super::streams::stream_failure(StreamRunError::Run(error), config_path))?;
    let why = super::streams::ended_because(outcome.end);
    let leases = &outcome.leases;
    tracing::info!(
        worker = %worker_id,
        records = outcome.written,
        taken = leases.taken,
        stolen = leases.stolen,
        lost = leases.lost,
        finished = leases.finished,
        reason = why,
        "Shared stream ended."
    );
    Ok(super::summary(
        super::streams::ended(outcome.end),
        outcome.written,
        format!(
            "ddbpipe: worker {worker_id} of the streams of '{}' ended ({why}): {} change \
             record(s) written in {:.1}s; leases: {} taken ({} stolen), {} lost, {} shard(s) \
             finished here; {} of {} shard(s) finished in lease table {}",
            source.table_name,
            outcome.written,
            started.elapsed().as_secs_f64(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.shards_finished,
            outcome.shards,
            coordination.lease_table
        ),
    ))
}

/// Runs one worker of a shared `mode: mirror` pipeline into a keyed sink (docs/coordination.md
/// §11.12): the snapshot's segments, the cleanup once, then the stream.
pub async fn run_mirror(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    config_path: &Path,
    given: &Given,
    progress: ProgressMode,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let source = &config.source;
    let worker_id = coordination.worker_id();
    let opened = super::streams::open_stream(config, given, &stop).await?;
    let Some(table) = &opened.table else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a mirror needs the table's key schema"
        )));
    };
    let identity = run_identity(config, &opened.location, Some(&opened.stream.arn));
    // One lease table for both phases' workers (the same id: the stream phase takes over
    // nothing from the scan phase's holdings, which it hands back before).
    let leases = open_lease_table(&opened.sdk, coordination).await?;
    same_settings(&leases, config, &identity).await?;
    let owner = lease_owner(&worker_id)?;
    alone_with_id(&leases, config, coordination, &owner, &stop).await?;
    let mut sink = open_keyed(config, table, Records::Envelopes).await?;
    let stream_plan = StreamPlan::build(source);
    let plan = ScanPlan::of_snapshot(&stream_plan, &source.table_name, table)
        .map_err(|problem| Failure::usage(problem.config_error()))?;
    let shape = Arc::new(SnapshotShape {
        key_schema: table.key_schema.clone(),
        table: source.table_name.clone(),
        format: source.value_format,
    });
    // `snapshot.engine: export`: the export's data files are leased as segments.
    let exports = match crate::export::engine(&opened.sdk, source) {
        Some(engine) => Some(SharedExports {
            engine: Arc::new(engine),
            table_arn: crate::export::table_arn(source, table)?,
            shape: Arc::clone(&shape),
        }),
        None => None,
    };
    let (reader, refresher) = super::scan::segment_reader(
        Arc::new(opened.table_api),
        &plan,
        Render::Snapshots(shape),
        &stop,
    );
    let run = StreamRun::new(
        &stream_plan,
        &source.table_name,
        &opened.stream.arn,
        config_path.display().to_string(),
    );
    let checkpoint_interval = Duration::from_millis(config.state.flush_interval_ms);
    tracing::info!(
        worker = %worker_id,
        lease_table = %coordination.lease_table,
        stream = %opened.stream.arn,
        segments = plan.total_segments,
        "Shared mirror started."
    );
    let started = Instant::now();
    let bar = ScanProgress::new(progress, table.item_count, 0, plan.total_segments);
    let mirror = LeasedMirror {
        scan: LeasedScan {
            reader,
            worker: worker_on(leases.clone(), config, coordination, &owner)?,
            batch: plan.batch,
            checkpoint_interval,
            identity: identity.clone(),
        },
        streams: LeasedStreams {
            api: Arc::new(aws::streams_api(&opened.sdk)),
            run,
            worker: worker_on(leases, config, coordination, &owner)?,
            checkpoint_interval,
            observer: Arc::new(RequestMetrics),
            identity,
            kept: Vec::new(),
        },
        deletes: source.resnapshot_deletes,
        max_keys: source.resnapshot_max_keys as u64,
        exports,
    };
    let outcome = mirror.run(&mut sink, stop, &bar).await;
    bar.finish();
    drop(refresher);
    let outcome = match outcome {
        Err(error) => return super::streams::stream_end(error, config, config_path),
        Ok(outcome) => outcome,
    };
    let why = super::streams::ended_because(outcome.streams.end);
    let leases = &outcome.streams.leases;
    // The changes written beside the snapshot are change records, not snapshot items.
    let beside = outcome.changes_beside;
    let items = outcome
        .scan
        .as_ref()
        .map_or(0, |scan| scan.written.saturating_sub(beside));
    let snapshot = match (&outcome.scan, &outcome.cleanup) {
        (_, Some(cleanup)) => format!(
            "snapshot {} read ({items} item(s) here) and closed here: {} key(s), {} row(s) deleted",
            outcome.snapshot.id, cleanup.keys_written, cleanup.deleted
        ),
        (Some(_), None) => format!(
            "snapshot {} read ({items} item(s) here), closed by another worker",
            outcome.snapshot.id
        ),
        (None, None) => format!(
            "snapshot {} closed before this worker came",
            outcome.snapshot.id
        ),
    };
    tracing::info!(
        worker = %worker_id,
        records = outcome.streams.written,
        reason = why,
        "Shared mirror ended."
    );
    Ok(super::summary(
        super::streams::ended(outcome.streams.end),
        outcome.streams.written + beside,
        format!(
            "ddbpipe: worker {worker_id} of the mirror of '{}' ended ({why}): {snapshot}; {} \
             change record(s) written in {:.1}s; stream leases: {} taken ({} stolen), {} lost, \
             {} shard(s) finished here; {} of {} shard(s) finished in lease table {}",
            source.table_name,
            outcome.streams.written + beside,
            started.elapsed().as_secs_f64(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.streams.shards_finished,
            outcome.streams.shards,
            coordination.lease_table
        ),
    ))
}

/// This worker's own jsonl file (validation made the sink a jsonl file with `{worker}`).
fn open_worker_file(
    config: &PipelineConfig,
    worker_id: &str,
    records: Records,
) -> Result<JsonlSink, Failure> {
    let (SinkConfig::Jsonl(jsonl), Some(path)) = (&config.sink, worker_path(config, worker_id)?)
    else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a shared run into jsonl needs a file path"
        )));
    };
    let mut settings = destination::jsonl_settings(jsonl, records);
    settings.target = jsonl::JsonlTarget::File(path);
    JsonlSink::open(settings, &config.name).map_err(Failure::runtime)
}

/// The keyed sink every worker writes, without the run lock (the lease fences keep the workers
/// apart). Workers starting together may race to create its tables: a failed preparation is
/// tried again, a few times.
async fn open_keyed(
    config: &PipelineConfig,
    table: &ddbpipe_source::api::TableDescription,
    records: Records,
) -> Result<ddbpipe_keyed::sink::KeyedSink, Failure> {
    let mut attempt = 0;
    loop {
        match destination::keyed_sink(config, Some(table), records, false).await {
            Ok((_, sink)) => return Ok(sink),
            Err(failure) if attempt < PREPARE_ATTEMPTS => {
                attempt += 1;
                tracing::debug!(error = %failure.error, attempt, "Preparing the sink failed; trying again.");
                tokio::time::sleep(Duration::from_millis(300 * u64::from(attempt))).await;
            }
            Err(failure) => return Err(failure),
        }
    }
}

/// How often a worker tries again to prepare a keyed sink's tables.
const PREPARE_ATTEMPTS: u32 = 3;

/// The lease table, created when missing (docs/coordination.md §11.1).
pub async fn open_lease_table(
    sdk: &aws::SdkSettings,
    coordination: &CoordinationConfig,
) -> Result<AwsLeaseTable, Failure> {
    let leases = aws::lease_table(sdk, &coordination.lease_table);
    leases
        .ensure_table(Duration::from_secs(1), TABLE_ACTIVE_ATTEMPTS)
        .await
        .map_err(|error| lease_table_failure(error, &coordination.lease_table))?;
    Ok(leases)
}

/// A lease table that cannot be used, with what to do.
pub fn lease_table_failure(error: LeaseError, table: &str) -> Failure {
    let hint = format!(
        "the workers need dynamodb:DescribeTable, CreateTable (or a table made beforehand), \
         Query, GetItem, PutItem, UpdateItem and DeleteItem on the lease table '{table}' \
         (README, Running several workers)"
    );
    Failure::runtime(anyhow!("lease table '{table}': {error}")).hint(hint)
}

fn summarize(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    worker_id: &str,
    outcome: &LeasedOutcome,
    took: Duration,
) -> Summary {
    let leases = &outcome.leases;
    if outcome.completed && leases.taken == 0 && outcome.written == 0 {
        tracing::warn!(
            "Every segment was already done in lease table {} (an earlier shared run); `ddbpipe \
             state reset` forgets it so that the next run reads the table again.",
            coordination.lease_table
        );
    }
    let status = if outcome.completed {
        "complete"
    } else {
        "stopped by a signal"
    };
    tracing::info!(
        worker = %worker_id,
        items = outcome.written,
        taken = leases.taken,
        stolen = leases.stolen,
        lost = leases.lost,
        finished = leases.finished,
        "Shared {} {status}.",
        config.source.mode
    );
    super::summary(
        if outcome.completed {
            Ended::Complete
        } else {
            Ended::Stopped
        },
        outcome.written,
        format!(
            "ddbpipe: worker {worker_id} of the {} of '{}' {status}: {} read, {} written, {:.1} \
             capacity units, {:.1}s; leases: {} taken ({} stolen), {} lost, {} segment(s) \
             finished here; {} of {} segment(s) done in lease table {}",
            config.source.mode,
            config.source.table_name,
            outcome.read,
            outcome.written,
            outcome.capacity_units,
            took.as_secs_f64(),
            leases.taken,
            leases.stolen,
            leases.lost,
            leases.finished,
            outcome.segments_done,
            outcome.total_segments,
            coordination.lease_table
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::worker_path;
    use crate::config::{PipelineConfig, parse};

    fn shared_into(path: &str) -> PipelineConfig {
        let yaml = format!(
            "name: orders\nsource: {{table_name: orders}}\nsink: {{type: jsonl, path: '{path}'}}\n\
             coordination: {{lease_table: leases}}\n"
        );
        parse(&yaml, Path::new("conf"), &|_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_worker_path_stays_where_its_template_puts_it() {
        let config = shared_into("out/{worker}/orders-{worker}.jsonl");
        let path = worker_path(&config, "host-1").unwrap();
        assert_eq!(
            path,
            Some(PathBuf::from("conf/out/host-1/orders-host-1.jsonl"))
        );
        // Ids that config validation refuses, should one reach here by another way: none of
        // them may move the file out of its directory, or into another one.
        for id in ["..", ".", "a/b", "../x", ""] {
            let config = shared_into("out/{worker}/orders.jsonl");
            let refused = worker_path(&config, id);
            let Err(failure) = refused else {
                panic!("{id}: {refused:?}");
            };
            let said = failure.to_string();
            assert!(
                said.starts_with("config error: sink.path:") && said.contains(&format!("'{id}'")),
                "{id}: {said}"
            );
        }
        // Inside a name, dots are just dots.
        let config = shared_into("out/orders-{worker}.jsonl");
        assert_eq!(
            worker_path(&config, "..").unwrap(),
            Some(PathBuf::from("conf/out/orders-...jsonl"))
        );
    }
}
