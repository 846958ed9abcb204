//! One worker joining a shared run (`coordination:`, docs/coordination.md §11.10): the lease
//! table, the settings its leader row keeps, this process's lease owner (alone under its worker
//! id), and the worker's sink — its own jsonl file, or the keyed sink every worker writes.

use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_pipeline::leased::other_settings;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::aws::{self, AwsLeaseTable};
use ddbpipe_source::lease::{
    LeaseError, LeaseSettings, LeaseTable, PipelineName, UnitId, Worker, WorkerId,
};
use ddbpipe_source::retry::Cancel;

use super::build::Read;
use crate::config::{CoordinationConfig, PipelineConfig, SinkConfig, process_token};
use crate::destination::{self, AnySink};
use crate::failure::Failure;
use crate::sinks::{custom, jsonl, kafka, keyed};
use crate::wiring;

/// How long a missing lease table may take to become `ACTIVE`: polled every second.
const TABLE_ACTIVE_ATTEMPTS: u32 = 120;

/// This process, joined to a shared run as one of its workers.
pub(crate) struct Joined {
    /// The worker id (`coordination.worker_id`, or `<hostname>-<pid>`).
    pub worker_id: String,
    /// The settings the run keeps in its leader row.
    pub identity: Identity,
    /// The sink this worker writes.
    pub sink: AnySink,
    leases: AwsLeaseTable,
    owner: WorkerId,
}

/// A joined worker's parts, taken apart for its runner.
pub(crate) struct Parts {
    /// This process on the lease table.
    pub worker: Worker<AwsLeaseTable>,
    /// The worker id.
    pub worker_id: String,
    /// The settings the run keeps in its leader row.
    pub identity: Identity,
    /// The sink this worker writes.
    pub sink: AnySink,
}

impl Joined {
    /// This worker's parts: the worker on the lease table, its id, the run's identity and the
    /// sink.
    pub fn parts(
        self,
        config: &PipelineConfig,
        coordination: &CoordinationConfig,
    ) -> Result<Parts, Failure> {
        Ok(Parts {
            worker: self.worker(config, coordination)?,
            worker_id: self.worker_id,
            identity: self.identity,
            sink: self.sink,
        })
    }

    /// This process on the lease table, as the lease owner it joined as. A mirror makes one
    /// per phase: one owner for both (the stream phase takes over nothing from the scan
    /// phase's holdings, which it hands back before).
    pub fn worker(
        &self,
        config: &PipelineConfig,
        coordination: &CoordinationConfig,
    ) -> Result<Worker<AwsLeaseTable>, Failure> {
        let settings = LeaseSettings::new(coordination.lease_duration_secs)
            .map_err(|error| Failure::usage(anyhow!("config error: {error}")))?;
        Ok(Worker::new(
            self.leases.clone(),
            pipeline_name(config)?,
            self.owner.clone(),
            settings,
        ))
    }
}

/// Joins the shared run of `config` as one worker: opens the lease table (created when
/// missing), refuses settings that differ from its leader row's and a worker id a live process
/// runs under, then opens this worker's sink (`records` of the run's mode).
pub(crate) async fn join(
    config: &PipelineConfig,
    coordination: &CoordinationConfig,
    read: &Read,
    records: Records,
    stop: &Cancel,
) -> Result<Joined, Failure> {
    let worker_id = coordination.worker_id();
    let stream = read.stream.as_ref().map(|stream| stream.arn.as_str());
    let identity = run_identity(config, &read.location, stream);
    let leases = open_lease_table(&read.sdk, coordination).await?;
    same_settings(&leases, config, &identity).await?;
    let owner = lease_owner(&worker_id)?;
    alone_with_id(&leases, config, coordination, &owner, stop).await?;
    let sink = match &config.sink {
        SinkConfig::Jsonl(_) => AnySink::Jsonl(jsonl::open_worker_file(
            config.target(),
            &worker_id,
            records,
        )?),
        // Refused with coordination when the config was loaded.
        SinkConfig::Custom => return Err(custom::no_custom_sink()),
        // Every worker writes the one topic: at least once with its positions in the lease
        // rows, or each unit exactly once through a producer of its own (§11.13).
        SinkConfig::Kafka(settings) => {
            let (sink, _) = kafka::open_kafka(
                settings,
                config.target(),
                read.table.as_ref(),
                records,
                true,
                Some(&read.sdk),
            )
            .await?;
            AnySink::Kafka(sink)
        }
        SinkConfig::Parquet(_) => {
            return Err(Failure::usage(anyhow!(
                "config error: sink.type: the {} sink runs in one process for now: remove \
                 coordination",
                config.sink.kind()
            )));
        }
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let Some(table) = &read.table else {
                return Err(Failure::runtime(anyhow!(
                    "internal error: a keyed sink needs the table's key schema"
                )));
            };
            AnySink::Keyed(open_keyed(config, table, records).await?)
        }
    };
    Ok(Joined {
        worker_id,
        identity,
        sink,
        leases,
        owner,
    })
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
    // The live processes of a shared mirror whose snapshot was replaced keep their presence
    // under the current generation's name (docs/coordination.md §11.12 rule 8).
    let pipeline = crate::lease_names::current_lease_name(config).await?;
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

/// The pipeline's name, as its lease rows are kept under.
fn pipeline_name(config: &PipelineConfig) -> Result<PipelineName, Failure> {
    PipelineName::new(config.name.clone())
        .map_err(|error| Failure::usage(anyhow!("config error: {error}")))
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
        match keyed::keyed_sink(config.target(), Some(table), records, false).await {
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
async fn open_lease_table(
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
