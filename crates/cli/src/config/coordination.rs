//! The `coordination:` section: several workers of one pipeline share its work through a lease
//! table in DynamoDB (docs/coordination.md §11.10).

use ddbpipe_source::config::{ConfigError, Mode, OnGap, SnapshotEngine, SourceConfig};
use serde_json::json;

use crate::sinks::jsonl::WORKER_PLACEHOLDER;
use crate::sinks::{JsonlConfig, JsonlTarget, SinkConfig, WriteMode};
use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of, optional, required};
use crate::yaml::types::Choice;

/// `coordination.lease_duration_secs` when unset.
pub const DEFAULT_LEASE_DURATION_SECS: u64 = 10;
/// The longest `coordination.worker_id`.
const MAX_WORKER_ID_CHARS: usize = 128;

/// `coordination:`.
pub(super) static COORDINATION: &[Field] = &[
    required(
        "lease_table",
        of::<String>(),
        "The DynamoDB table of the leases, in the source's account, region and endpoint; \
         created (on-demand billing) when missing. Several pipelines may share one.",
    ),
    optional(
        "worker_id",
        of::<String>(),
        "This worker's id, unique among the live workers of the pipeline: 1-128 characters \
         from A-Z a-z 0-9 _ . -, other than . and ..; unset: <hostname>-<pid>.",
    ),
    defaulted(
        "lease_duration_secs",
        of::<u64>(),
        || json!(DEFAULT_LEASE_DURATION_SECS),
        "A lease not renewed for this long is taken by another worker: 3 to 300 seconds.",
    ),
];

/// Several workers share the pipeline's work (docs/coordination.md §11.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinationConfig {
    /// The lease table's name.
    pub lease_table: String,
    /// This worker's id as configured; `None`: `<hostname>-<pid>` (see [`Self::worker_id`]).
    pub worker_id: Option<String>,
    /// Seconds after which an unrenewed lease is taken by another worker.
    pub lease_duration_secs: u64,
}

impl CoordinationConfig {
    /// This worker's id: the configured one, or `<hostname>-<pid>` with every character
    /// outside `A-Z a-z 0-9 _ . -` made `-`.
    pub fn worker_id(&self) -> String {
        if let Some(id) = &self.worker_id {
            return id.clone();
        }
        format!("{}-{}", host_name(), std::process::id())
    }
}

/// This machine's name, every character outside `A-Z a-z 0-9 _ . -` made `-`.
fn host_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_string());
    host.chars()
        .map(|c| if id_char(c) { c } else { '-' })
        .take(MAX_WORKER_ID_CHARS - 12)
        .collect()
}

/// What tells this process apart from any other started with the same worker id
/// (docs/coordination.md §11.2 rule 6): `<host>/<pid>/<8 random hex digits>`. The lease rows
/// this process writes name it after the id, so a process with another's id takes none of its
/// leases for its own, and a write is fenced per process. Nothing in it is secret.
pub fn process_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    // A hasher's keys are random per process (seeded by the OS): random bits without a
    // random-number crate.
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos()),
    );
    let random = hasher.finish() as u32;
    format!("{}/{}/{random:08x}", host_name(), std::process::id())
}

fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Whether `id` may be a worker id: 1-128 of `A-Z a-z 0-9 _ . -`, and not `.` or `..`, which
/// name directories: in `{worker}/out.jsonl` they would put the worker's file in the pipeline's
/// own directory or above it.
pub fn is_worker_id(id: &str) -> bool {
    !id.is_empty()
        && id.chars().count() <= MAX_WORKER_ID_CHARS
        && id.chars().all(id_char)
        && id != "."
        && id != ".."
}

/// Reads the section.
pub(super) fn read(mut f: Fields<'_>) -> CoordinationConfig {
    let coordination = CoordinationConfig {
        lease_table: f.required::<String>("lease_table").unwrap_or_default(),
        worker_id: f.get("worker_id"),
        lease_duration_secs: f.or("lease_duration_secs", DEFAULT_LEASE_DURATION_SECS),
    };
    f.finish();
    coordination
}

/// The rules of docs/coordination.md §11.10: the section's own values, the modes and sinks
/// this version shares, and the per-worker path of a jsonl sink.
pub(super) fn validate(
    coordination: Option<&CoordinationConfig>,
    source: &SourceConfig,
    sink: &SinkConfig,
    errors: &mut Vec<ConfigError>,
) {
    let placeholder = match sink {
        SinkConfig::Jsonl(JsonlConfig {
            path: JsonlTarget::File(path),
            ..
        }) => path.to_string_lossy().contains(WORKER_PLACEHOLDER),
        _ => false,
    };
    let Some(coordination) = coordination else {
        if placeholder {
            errors.push(ConfigError::new(
                "sink.path",
                format!(
                    "{WORKER_PLACEHOLDER} is a worker's id, and only a pipeline with a \
                     coordination section has workers: add one, or remove {WORKER_PLACEHOLDER}"
                ),
            ));
        }
        return;
    };
    let table = &coordination.lease_table;
    if let Some(problem) = super::tables::table_name_problem(table) {
        errors.push(ConfigError::new(
            "coordination.lease_table",
            format!("'{table}' {problem}"),
        ));
    }
    if let Some(id) = &coordination.worker_id
        && !is_worker_id(id)
    {
        errors.push(ConfigError::new(
            "coordination.worker_id",
            format!(
                "'{id}' is not a worker id: 1-{MAX_WORKER_ID_CHARS} characters from A-Z a-z 0-9 \
                 _ . -, other than . and .. (it names the worker's jsonl file, and . and .. name \
                 directories)"
            ),
        ));
    }
    let duration = coordination.lease_duration_secs;
    if !(3..=300).contains(&duration) {
        errors.push(ConfigError::new(
            "coordination.lease_duration_secs",
            format!("lease_duration_secs must be 3 to 300, not {duration}"),
        ));
    }
    if source.mode == Mode::Mirror && sink.keyed().is_none() {
        errors.push(ConfigError::new(
            "coordination",
            "a mirror shared by several workers keeps its snapshot record and runs its \
             cleanup in the destination database: use a sqlite or postgres sink, or remove the \
             coordination section to mirror into jsonl as one process",
        ));
    }
    if matches!(source.mode, Mode::Streams | Mode::Mirror) {
        // A gap found by one worker of a shared mirror opens a new snapshot for all of them
        // (§11.12 rule 8), or a repair of it (rule 9); a shared stream has no snapshot.
        let allowed = source.mode == Mode::Mirror || source.on_gap == OnGap::Fail;
        if !allowed {
            errors.push(ConfigError::new(
                "source.on_gap",
                format!(
                    "with coordination a stream's gap stops the workers: use on_gap: fail, not \
                     {} (a shared stream has no snapshot to take again or repair onto; a shared \
                     mirror takes one with on_gap: resnapshot, or repairs with on_gap: repair)",
                    source.on_gap
                ),
            ));
        }
        if let Some(max) = source.max_messages {
            errors.push(ConfigError::new(
                "source.max_messages",
                format!(
                    "with coordination each worker reads the shards it holds, so a record \
                     count ({max}) cannot end the pipeline: remove max_messages, or end the \
                     workers by idle_termination_secs or a signal"
                ),
            ));
        }
    }
    match sink {
        SinkConfig::Jsonl(jsonl) => {
            if !placeholder {
                errors.push(ConfigError::new(
                    "sink.path",
                    format!(
                        "with coordination every worker writes its own file: put \
                         {WORKER_PLACEHOLDER} in the path (e.g. out/orders-{WORKER_PLACEHOLDER}.jsonl)"
                    ),
                ));
            }
            if jsonl.write != WriteMode::Append {
                errors.push(ConfigError::new(
                    "sink.write",
                    format!(
                        "with coordination a worker appends the segments or shards it reads to \
                         its file (a unit handed over continues in another worker's file): use \
                         write: append, not {}",
                        jsonl.write.name()
                    ),
                ));
            }
        }
        // Every worker writes the one database, each batch fenced by its lease (§11.7).
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {}
        // Every worker writes the one topic, each unit exactly once through a producer of its
        // own, or at least once (§11.13).
        SinkConfig::Kafka(_) => {}
        SinkConfig::Parquet(_) => errors.push(ConfigError::new(
            "sink.type",
            format!(
                "the {} sink runs in one process for now: remove coordination (one run of the \
                 pipeline reads every shard), or write into jsonl, sqlite, postgres or kafka",
                sink.kind()
            ),
        )),
        SinkConfig::Custom => errors.push(ConfigError::new(
            "sink.type",
            "a sink given in code (type: custom) runs in one process: remove coordination, \
             or write into jsonl, sqlite or postgres",
        )),
    }
    // A shared mirror leases its export's data files as segments (§11.12); a shared scan
    // reads Scan segments only.
    if source.snapshot.engine == SnapshotEngine::Export && source.mode != Mode::Mirror {
        errors.push(ConfigError::new(
            "coordination",
            format!(
                "a {} pipeline shared by several workers reads Scan segments: remove \
                 source.snapshot.engine: export, or the coordination section to read the export \
                 as one process",
                source.mode
            ),
        ));
    }
}
