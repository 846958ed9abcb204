//! The `source:` section of a pipeline file: which table to read, how, and when a run ends.
//!
//! The `///` docs of these types are the user reference for every source field (docs/config.md §1.2).
//! The CLI reads YAML into [`SourceConfig`] with strict types and rejects unknown keys; this
//! module owns what is left: the defaults ([`defaults`]), the validation rules
//! ([`SourceConfig::validate`]) and the warnings for fields that do nothing in the chosen mode
//! ([`SourceConfig::ineffective_fields`]), which live in `validate`.

pub mod reserved;
mod validate;

use std::collections::BTreeMap;
use std::fmt;

use ddbpipe_value::{Value, ValueFormat};
use serde::{Deserialize, Serialize};

use crate::endpoint::EndpointUrl;

/// The documented default of every source field that has one.
pub mod defaults {
    /// `mode`: a parallel scan of the whole table.
    pub const MODE: super::Mode = super::Mode::Scan;
    /// `segments`: one segment, a plain (not parallel) scan.
    pub const SEGMENTS: u32 = 1;
    /// `max_concurrency`: segments read at once.
    pub const MAX_CONCURRENCY: usize = 8;
    /// `consistent_read`: eventually consistent reads.
    pub const CONSISTENT_READ: bool = false;
    /// `scan_index_forward`: a query returns items in ascending sort-key order.
    pub const SCAN_INDEX_FORWARD: bool = true;
    /// `on_gap`: a run that cannot resume without losing changes stops.
    pub const ON_GAP: super::OnGap = super::OnGap::Fail;
    /// `resnapshot_deletes`: a complete snapshot deletes destination rows of vanished items.
    pub const RESNAPSHOT_DELETES: bool = true;
    /// `resnapshot_max_keys`: above this many keys a snapshot deletes nothing.
    pub const RESNAPSHOT_MAX_KEYS: usize = 1_000_000;
    /// `poll_interval_ms`: wait between reads of a caught-up shard.
    pub const POLL_INTERVAL_MS: u64 = 1000;
    /// `max_idle_poll_ms`: the longest wait between reads of a shard that keeps reading empty.
    pub const MAX_IDLE_POLL_MS: u64 = 10_000;
    /// `records_per_request`: the `Limit` of each `GetRecords`.
    pub const RECORDS_PER_REQUEST: u32 = 1000;
    /// `shard_concurrency`: shards read at once.
    pub const SHARD_CONCURRENCY: usize = 4;
    /// `read_concurrency`: requests reading DynamoDB at once in the process, over its tables.
    pub const READ_CONCURRENCY: usize = crate::capacity::DEFAULT_READ_SLOTS;
    /// `follow`: a streams run ends by `idle_termination_secs` or `max_messages`.
    pub const FOLLOW: bool = false;
    /// `discovery_interval_secs`: how often the stream's shards are listed again.
    pub const DISCOVERY_INTERVAL_SECS: u64 = 60;
    /// `batch_size`: records handed to the sink at once.
    pub const BATCH_SIZE: usize = 1000;
    /// `batch_max_bytes`: the output bytes of a batch's records before it is handed to the
    /// sink, however few records it holds (docs/scan.md §2.5): 32 MiB.
    pub const BATCH_MAX_BYTES: usize = 32 * 1024 * 1024;
    /// `batch_size` into a `sqlite` or `postgres` sink when the file gives none: each batch is
    /// one transaction of its rows and the position, whose fixed costs larger batches spread.
    pub const KEYED_BATCH_SIZE: usize = 5000;
    /// `value_format`: plain JSON values.
    pub const VALUE_FORMAT: ddbpipe_value::ValueFormat = ddbpipe_value::ValueFormat::Plain;
    /// `retry.max_retries`: retries after the first attempt of a request.
    pub const MAX_RETRIES: u32 = 8;
    /// `retry.initial_backoff_ms`: the first back-off delay.
    pub const INITIAL_BACKOFF_MS: u64 = 100;
    /// `retry.max_backoff_ms`: the longest back-off delay.
    pub const MAX_BACKOFF_MS: u64 = 10_000;
    /// `retry.attempt_timeout_ms`: the time one attempt of a request may take.
    pub const ATTEMPT_TIMEOUT_MS: u64 = 30_000;
    /// `credentials.config.session_name` of `assume_role`.
    pub const SESSION_NAME: &str = "ddbpipe";
}

/// What a run reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `scan`: every item of the table or index, read by parallel `Scan` segments. Ends after
    /// the last page.
    Scan,
    /// `query`: the items matching `key_condition_expression`. Ends after the last page.
    Query,
    /// `streams`: the change records of the table's stream (CDC), as change envelopes.
    Streams,
    /// `mirror`: capture the stream positions, scan the table as snapshot envelopes, then
    /// stream the changes from the captured positions.
    Mirror,
}

impl Mode {
    /// Every mode, in documentation order.
    pub const ALL: [Mode; 4] = [Mode::Scan, Mode::Query, Mode::Streams, Mode::Mirror];

    /// The name used in the config file: `"scan"`, `"query"`, `"streams"` or `"mirror"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Scan => "scan",
            Mode::Query => "query",
            Mode::Streams => "streams",
            Mode::Mirror => "mirror",
        }
    }

    /// Whether this mode reads a stream (streams, mirror) rather than only `Scan`/`Query`.
    pub const fn reads_stream(self) -> bool {
        matches!(self, Mode::Streams | Mode::Mirror)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the first run of a streams pipeline starts reading (docs/streams.md §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartPosition {
    /// `trim_horizon`: the oldest record the stream still holds (about 24 hours back).
    TrimHorizon,
    /// `latest`: only changes made after the first run started.
    Latest,
}

impl StartPosition {
    /// Every start position, in documentation order.
    pub const ALL: [StartPosition; 2] = [StartPosition::TrimHorizon, StartPosition::Latest];

    /// The name used in the config file: `"trim_horizon"` or `"latest"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            StartPosition::TrimHorizon => "trim_horizon",
            StartPosition::Latest => "latest",
        }
    }
}

impl fmt::Display for StartPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a streams or mirror run does when, at start-up, it cannot resume without losing
/// changes (docs/streams.md §4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnGap {
    /// `fail`: stop with exit code 1 and explain the gap.
    Fail,
    /// `resnapshot`: capture the stream again, rescan the table, then stream on (docs/streams.md §4.7).
    Resnapshot,
    /// `repair`: export the changes of the gap's window incrementally and apply them, then
    /// stream on; a full resnapshot where that cannot work (docs/streams.md §4.12).
    Repair,
}

impl OnGap {
    /// Every choice, in documentation order.
    pub const ALL: [OnGap; 3] = [OnGap::Fail, OnGap::Resnapshot, OnGap::Repair];

    /// The name used in the config file: `"fail"`, `"resnapshot"` or `"repair"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OnGap::Fail => "fail",
            OnGap::Resnapshot => "resnapshot",
            OnGap::Repair => "repair",
        }
    }

    /// Whether a gap may rescan the table: `resnapshot`, and `repair` when the repair cannot work.
    pub const fn may_resnapshot(self) -> bool {
        matches!(self, OnGap::Resnapshot | OnGap::Repair)
    }
}

impl fmt::Display for OnGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A secret string, such as a secret access key. It prints as `***` in logs, errors and
/// `Debug` output; only the code that hands it to AWS calls [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Never log or format the result.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where the AWS credentials come from, written `{type: <variant>, config: {...}}` (docs/config.md §1.4).
/// Unknown keys inside `config` are rejected; `default` and `web_identity` take no `config`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// `default`: the AWS default chain (environment, shared files, SSO, container, web
    /// identity, instance metadata), refreshed automatically.
    #[default]
    Default,
    /// `profile`: the named profile of the shared AWS files; it also drives the region.
    Profile {
        /// `name` (required): the profile name.
        name: String,
    },
    /// `access_key`: static keys.
    AccessKey {
        /// `access_key_id` (required).
        access_key_id: String,
        /// `secret_access_key` (required). Never printed.
        secret_access_key: Secret,
        /// `session_token` (optional), for temporary keys. Never printed.
        session_token: Option<Secret>,
    },
    /// `assume_role`: STS AssumeRole on top of the default chain; STS uses `region` when set.
    AssumeRole {
        /// `role_arn` (required): the role to assume.
        role_arn: String,
        /// `session_name` (default `"ddbpipe"`): the role session name, seen in CloudTrail.
        session_name: String,
        /// `external_id` (optional): the external id the role's trust policy asks for.
        external_id: Option<String>,
    },
    /// `web_identity`: the same as `default`; says that a web identity token is expected.
    WebIdentity,
}

impl Credentials {
    /// The `type` of these credentials as written in the config file.
    pub const fn type_name(&self) -> &'static str {
        match self {
            Credentials::Default => "default",
            Credentials::Profile { .. } => "profile",
            Credentials::AccessKey { .. } => "access_key",
            Credentials::AssumeRole { .. } => "assume_role",
            Credentials::WebIdentity => "web_identity",
        }
    }

    /// Names the credentials for messages, without any secret: "profile 'prod'",
    /// "access key AKIA…", "role arn:…", "the default credential chain".
    pub fn describe(&self) -> String {
        match self {
            Credentials::Default | Credentials::WebIdentity => {
                "the default credential chain".into()
            }
            Credentials::Profile { name } => format!("profile '{name}'"),
            Credentials::AccessKey { access_key_id, .. } => format!("access key {access_key_id}"),
            Credentials::AssumeRole { role_arn, .. } => format!("role {role_arn}"),
        }
    }
}

/// How failed requests are retried (docs/errors.md §9). Each field defaults on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryConfig {
    /// Retries after the first attempt of a request before the run fails. Default 8.
    pub max_retries: u32,
    /// The first back-off delay, in milliseconds; later delays grow from it. Default 100.
    pub initial_backoff_ms: u64,
    /// The longest back-off delay, in milliseconds. Default 10 000.
    pub max_backoff_ms: u64,
    /// ★ The time one attempt may take before it counts as a transient failure, in
    /// milliseconds; 1000..=600 000. Default 30 000.
    pub attempt_timeout_ms: u64,
}

impl RetryConfig {
    /// Every field at its default.
    pub const DEFAULT: RetryConfig = RetryConfig {
        max_retries: defaults::MAX_RETRIES,
        initial_backoff_ms: defaults::INITIAL_BACKOFF_MS,
        max_backoff_ms: defaults::MAX_BACKOFF_MS,
        attempt_timeout_ms: defaults::ATTEMPT_TIMEOUT_MS,
    };
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig::DEFAULT
    }
}

/// The DynamoDB source of a pipeline: the `source:` section of the config file.
///
/// Fields marked ★ are ddbpipe's own; the others keep the reference connector's names, types
/// and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    /// The table to read, by name or ARN. Required; must not be blank.
    pub table_name: String,
    /// The AWS region, e.g. `us-east-1`. Unset: the AWS default region chain.
    pub region: Option<String>,
    /// An endpoint URL for both the DynamoDB and the Streams client, e.g. a local emulator.
    /// Unset: the AWS endpoints of the region.
    pub endpoint_url: Option<EndpointUrl>,
    /// Where the AWS credentials come from. Default `{type: default}`.
    pub credentials: Credentials,
    /// What a run reads: `scan`, `query`, `streams` or ★`mirror`. Default `scan`.
    pub mode: Mode,
    /// The number of parallel-scan segments (`TotalSegments`), 1..=1 000 000. Used by scan,
    /// mirror and resnapshot scans; query reads one segment. Default 1.
    pub segments: u32,
    /// Segments read at once, at least 1. Default 8.
    pub max_concurrency: usize,
    /// A global or local secondary index to read instead of the table. Scan and query only.
    pub index_name: Option<String>,
    /// A `ProjectionExpression`: the attributes to return. Scan and query only.
    pub projection: Option<String>,
    /// A `FilterExpression` applied after reading. Scan and query only.
    pub filter_expression: Option<String>,
    /// The `KeyConditionExpression`: required in query mode, refused in the others.
    pub key_condition_expression: Option<String>,
    /// `ExpressionAttributeNames`: placeholders (keys starting with `#`) for attribute names.
    pub expression_attribute_names: BTreeMap<String, String>,
    /// `ExpressionAttributeValues` written as plain YAML (keys starting with `:`): null, booleans,
    /// numbers, strings, lists and maps (docs/values.md §3.4). Numbers are read as i64, u64 or f64; use
    /// `expression_attribute_values_typed` for sets, binary and exact big numbers.
    pub expression_attribute_values: BTreeMap<String, Value>,
    /// ★ `ExpressionAttributeValues` written as DynamoDB attribute JSON (keys starting with
    /// `:`), e.g. `{N: "123456789012345678901234567"}` or `{B: "AQI="}` (docs/values.md §3.5). A key may
    /// be set here or in `expression_attribute_values`, not both.
    pub expression_attribute_values_typed: BTreeMap<String, Value>,
    /// Strongly consistent reads. Not supported on global secondary indexes. Default false.
    pub consistent_read: bool,
    /// Query only: ascending (true) or descending (false) sort-key order. Default true.
    pub scan_index_forward: bool,
    /// The `Limit` of each Scan or Query request, at least 1. Unset: DynamoDB's 1 MB pages.
    pub page_limit: Option<u32>,
    /// Streams and mirror: the stream to read. Unset: the table's current stream.
    pub stream_arn: Option<String>,
    /// Streams only, first run only: where reading starts. Unset: `trim_horizon`.
    pub start_position: Option<StartPosition>,
    /// Streams and mirror: what to do when a run cannot resume without losing changes.
    /// Default `fail`.
    pub on_gap: OnGap,
    /// Whether a complete snapshot (mirror, resnapshot) deletes destination rows whose items
    /// are gone. The jsonl sink cannot delete: set false with it. Default true.
    pub resnapshot_deletes: bool,
    /// A snapshot that wrote more keys than this deletes nothing, at least 1. Default 1 000 000.
    pub resnapshot_max_keys: usize,
    /// Streams and mirror: the wait between reads of a caught-up shard, in milliseconds; at
    /// least 200 is used, at most 600 000 accepted. Default 1000.
    pub poll_interval_ms: u64,
    /// Streams and mirror: the longest wait between reads of a shard that keeps reading empty,
    /// in milliseconds: after two empty answers in a row the wait doubles with each further
    /// one up to this (docs/streams.md §4.9). At most 600 000; at or below `poll_interval_ms`
    /// there is no backoff. Default 10 000.
    pub max_idle_poll_ms: u64,
    /// Streams and mirror: the `Limit` of each `GetRecords`, 1..=1000. Default 1000.
    pub records_per_request: u32,
    /// Streams and mirror: shards read at once, at least 1. Default 4.
    pub shard_concurrency: usize,
    /// ★ Scan, Query and GetRecords requests at once in the process, over every table of the
    /// file (one set of slots, shared by the clones of this configuration), at least 1.
    /// Default 64.
    pub read_concurrency: crate::capacity::ReadSlots,
    /// Streams and mirror: end the run after this many seconds without a new record, at
    /// least 1. Unset: no idle limit.
    pub idle_termination_secs: Option<u64>,
    /// Streams and mirror: end the run after exactly this many change records, at least 1.
    /// Unset: no limit.
    pub max_messages: Option<usize>,
    /// ★ Streams and mirror: run until stopped (SIGINT/SIGTERM). Excludes
    /// `idle_termination_secs` and `max_messages`. Default false.
    pub follow: bool,
    /// ★ Streams and mirror: how often the stream's shards are listed again, in seconds,
    /// 10..=3600. Default 60.
    pub discovery_interval_secs: u64,
    /// ★ A ceiling on read capacity units consumed per second by Scan and Query; finite and
    /// greater than 0. Unset: no ceiling (docs/scan.md §2.7).
    pub max_read_units_per_second: Option<f64>,
    /// ★ A share of the table's (or index's) read capacity to use, 0 < f ≤ 1. With
    /// `max_read_units_per_second` too, the smaller rate wins. Unset: no share (docs/scan.md §2.7).
    pub read_capacity_fraction: Option<f64>,
    /// How failed requests are retried.
    pub retry: RetryConfig,
    /// Records handed to the sink at once, 1..=1 000 000. Default 1000.
    pub batch_size: usize,
    /// The output bytes of a batch's records at most, 1 KiB..=1 GiB (a record larger than
    /// this is a batch of its own). Default 32 MiB.
    pub batch_max_bytes: usize,
    /// Not a key of the file: set when the sink commits each batch's position with its records
    /// exactly once (kafka `exactly_once`, parquet, iceberg). A scan page is then never split between batches
    /// (docs/scan.md §2.5), so a resumed scan never re-sends a record of a committed batch.
    pub whole_pages: bool,
    /// How attribute values are written: `plain` JSON or `typed` attribute JSON. Default
    /// `plain`; a PostgreSQL `json`/`jsonb` destination turns plain into
    /// [`ValueFormat::PlainExact`] (docs/values.md §3.7).
    pub value_format: ValueFormat,
    /// ★ How snapshots read the table (`snapshot:`): Scan (default) or an export to S3.
    pub snapshot: SnapshotConfig,
}

/// How a snapshot (a scan-mode run, a mirror's first run, a resnapshot) reads the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotEngine {
    /// Parallel `Scan` requests (consumes read capacity).
    #[default]
    Scan,
    /// `ExportTableToPointInTime` to S3, then the export's files (no read capacity; needs
    /// point-in-time recovery).
    Export,
}

impl SnapshotEngine {
    /// Every engine, in the order the docs list them.
    pub const ALL: [SnapshotEngine; 2] = [SnapshotEngine::Scan, SnapshotEngine::Export];

    /// `"scan"` or `"export"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SnapshotEngine::Scan => "scan",
            SnapshotEngine::Export => "export",
        }
    }
}

impl fmt::Display for SnapshotEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `source.snapshot`: the snapshot engine and, for exports, where they are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotConfig {
    /// `scan` (default) or `export`.
    pub engine: SnapshotEngine,
    /// The bucket exports are written to; required with `engine: export`.
    pub s3_bucket: Option<String>,
    /// The key prefix of exports; unset: `ddbpipe/<pipeline name>` (the CLI fills it in).
    pub s3_prefix: Option<String>,
    /// The bucket owner's account id, when the bucket is another account's.
    pub s3_bucket_owner: Option<String>,
    /// The bucket's region; unset: the source's.
    pub s3_region: Option<String>,
    /// An S3 endpoint (path-style); unset: `source.endpoint_url` when set.
    pub s3_endpoint_url: Option<EndpointUrl>,
    /// A completed full export to read instead of starting one.
    pub export_arn: Option<String>,
}

/// One problem in a config file: the dotted path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.line())]
pub struct ConfigError {
    /// The dotted YAML path, e.g. `source.segments`; empty for the file as a whole.
    pub path: String,
    /// What is wrong, e.g. `segments must be 1..=1000000 (got 0)`.
    pub message: String,
}

impl ConfigError {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }

    fn line(&self) -> String {
        if self.path.is_empty() {
            format!("config error: {}", self.message)
        } else {
            format!("config error: {}: {}", self.path, self.message)
        }
    }
}

impl SourceConfig {
    /// Reads `table_name` with every other field at its default.
    pub fn new(table_name: impl Into<String>) -> Self {
        SourceConfig {
            table_name: table_name.into(),
            region: None,
            endpoint_url: None,
            credentials: Credentials::Default,
            mode: defaults::MODE,
            segments: defaults::SEGMENTS,
            max_concurrency: defaults::MAX_CONCURRENCY,
            index_name: None,
            projection: None,
            filter_expression: None,
            key_condition_expression: None,
            expression_attribute_names: BTreeMap::new(),
            expression_attribute_values: BTreeMap::new(),
            expression_attribute_values_typed: BTreeMap::new(),
            consistent_read: defaults::CONSISTENT_READ,
            scan_index_forward: defaults::SCAN_INDEX_FORWARD,
            page_limit: None,
            stream_arn: None,
            start_position: None,
            on_gap: defaults::ON_GAP,
            resnapshot_deletes: defaults::RESNAPSHOT_DELETES,
            resnapshot_max_keys: defaults::RESNAPSHOT_MAX_KEYS,
            poll_interval_ms: defaults::POLL_INTERVAL_MS,
            max_idle_poll_ms: defaults::MAX_IDLE_POLL_MS,
            records_per_request: defaults::RECORDS_PER_REQUEST,
            shard_concurrency: defaults::SHARD_CONCURRENCY,
            read_concurrency: crate::capacity::ReadSlots::new(defaults::READ_CONCURRENCY),
            idle_termination_secs: None,
            max_messages: None,
            follow: defaults::FOLLOW,
            discovery_interval_secs: defaults::DISCOVERY_INTERVAL_SECS,
            max_read_units_per_second: None,
            read_capacity_fraction: None,
            retry: RetryConfig::DEFAULT,
            batch_size: defaults::BATCH_SIZE,
            batch_max_bytes: defaults::BATCH_MAX_BYTES,
            whole_pages: false,
            value_format: defaults::VALUE_FORMAT,
            snapshot: SnapshotConfig::default(),
        }
    }

    /// All expression values as sent to DynamoDB: the plain and typed maps merged. Validation
    /// refuses a key set in both; were it not run, the typed value would win.
    pub fn merged_expression_values(&self) -> BTreeMap<String, Value> {
        let mut merged = self.expression_attribute_values.clone();
        merged.extend(
            self.expression_attribute_values_typed
                .iter()
                .map(|(key, value)| (key.clone(), value.clone())),
        );
        merged
    }
}
