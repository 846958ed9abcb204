//! Build: a validated [`SourceConfig`] (and, for reads of the table, its `DescribeTable`
//! answer) turned into the typed plan a run executes. Parse → validate → build: the CLI
//! parses and validates, this module builds, and nothing downstream reads the config again.
//!
//! # Plans
//! - [`ScanPlan`] (scan, query): the request template, the segments, the read rate and the
//!   rule that refreshes it, the retry policy.
//! - [`StreamPlan`] (streams, mirror): the poll floor, the bounds, the start position, what a
//!   gap does, and the [`SnapshotPlan`] of a mirror's or a resnapshot's table scan.
//!
//! # Rules
//! 1. Query mode reads one segment: validation (docs/config.md §1.3 rule 4) refuses more, so the plan
//!    takes `segments` as it is.
//! 2. The `index_name` rules and the read rate need the table's description
//!    ([`index_problem`], [`ReadRule::rate`]); a problem is a definite config error, index
//!    first.
//! 3. The effective poll interval is at least [`MIN_POLL`] (docs/config.md §1.2 `poll_interval_ms`),
//!    and the longest wait between reads of an idle shard (`max_idle_poll_ms`) is at least the
//!    poll interval (below it: no backoff).
//! 4. The stream is the configured `stream_arn` or the table's enabled one
//!    ([`resolve_stream`]).
//! 5. A streams run scans the table when `on_gap` is `resnapshot` or `repair` (whose fallback is a
//!    resnapshot), in mirror mode, or when
//!    the stored position holds an open snapshot ([`StreamPlan::scans_table`]).

mod index;
mod read_rate;
mod refresh;
mod stream;

use std::time::Duration;

use ddbpipe_value::ValueFormat;

pub use self::index::{IndexProblem, index_problem};
pub use self::read_rate::{NoCapacityBase, ReadRule};
pub use self::refresh::{BASE_REFRESH, Refresher};
pub use self::stream::{
    NEW_IMAGES_REMEDY, NoStream, ResolvedStream, configured_stream, lacks_new_images,
    resolve_stream, view_warning,
};
use crate::api::{ReadRequest, TableDescription};
use crate::aws::ClientSettings;
use crate::capacity::ReadSlots;
use crate::config::{ConfigError, Mode, OnGap, RetryConfig, SourceConfig, StartPosition};
use crate::retry::RetryPolicy;
use crate::scan::read_template;
use crate::streams::engine::RunBounds;

/// The least effective poll interval (rule 3).
pub const MIN_POLL: Duration = Duration::from_millis(200);

/// Definite: the config cannot be applied to the described table (rule 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// Definite: `index_name` cannot be read.
    #[error(transparent)]
    Index(#[from] IndexProblem),
    /// Definite: `read_capacity_fraction` has no base.
    #[error(transparent)]
    ReadRate(#[from] NoCapacityBase),
}

impl PlanError {
    /// The problem as a config error naming its field.
    pub fn config_error(&self) -> ConfigError {
        let field = match self {
            PlanError::Index(_) => "source.index_name",
            PlanError::ReadRate(_) => "source.read_capacity_fraction",
        };
        ConfigError::new(field, self.to_string())
    }
}

impl RetryConfig {
    /// The retry policy of these settings.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_retries: self.max_retries,
            initial_backoff: Duration::from_millis(self.initial_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
            attempt_timeout: Duration::from_millis(self.attempt_timeout_ms),
        }
    }
}

/// The AWS client settings of a source.
pub fn client_settings(source: &SourceConfig) -> ClientSettings {
    ClientSettings {
        region: source.region.clone(),
        endpoint_url: source.endpoint_url.clone(),
        credentials: source.credentials.clone(),
    }
}

/// A scan or query run.
#[derive(Debug, Clone)]
pub struct ScanPlan {
    /// The request of every page.
    pub template: ReadRequest,
    /// `TotalSegments` (1 for a query, rule 1).
    pub total_segments: u32,
    /// Segments read at once.
    pub max_concurrency: usize,
    /// The read rate at the start; `None` is unlimited.
    pub read_rate: Option<f64>,
    /// The rule the rate came from, for the [`Refresher`].
    pub read_rule: ReadRule,
    /// The one retry policy.
    pub retry: RetryPolicy,
    /// Plain or typed values.
    pub format: ValueFormat,
    /// How large a batch may grow.
    pub batch: BatchLimits,
    /// The process's read slots (`source.read_concurrency`).
    pub slots: ReadSlots,
}

impl ScanPlan {
    /// The plan of a scan or query `source` on the described `table` (rules 1–2).
    pub fn build(source: &SourceConfig, table: &TableDescription) -> Result<Self, PlanError> {
        if let Some(problem) = index_problem(source, table) {
            return Err(problem.into());
        }
        let read_rule = ReadRule::of(source);
        Ok(ScanPlan {
            template: read_template(source),
            total_segments: source.segments,
            max_concurrency: source.max_concurrency,
            read_rate: read_rule.rate(table)?,
            read_rule,
            retry: source.retry.policy(),
            format: source.value_format,
            batch: BatchLimits::of(source),
            slots: source.read_concurrency.clone(),
        })
    }
}

impl ScanPlan {
    /// The segments of `plan`'s snapshot as a scan of the described `table` (`table_name`):
    /// what a mirror shared by several workers leases (docs/coordination.md §11.12).
    pub fn of_snapshot(
        plan: &StreamPlan,
        table_name: &str,
        table: &TableDescription,
    ) -> Result<Self, PlanError> {
        let snapshot = &plan.snapshot;
        Ok(ScanPlan {
            template: crate::scan::snapshot_template(
                table_name,
                snapshot.consistent_read,
                snapshot.page_limit,
            ),
            total_segments: snapshot.segments,
            max_concurrency: snapshot.max_concurrency,
            read_rate: snapshot.read_rule.rate(table)?,
            read_rule: snapshot.read_rule.clone(),
            retry: plan.retry,
            format: plan.format,
            batch: plan.batch,
            slots: plan.slots.clone(),
        })
    }
}

/// How large a batch handed to the sink may grow (docs/scan.md §2.5): it is handed over once
/// it holds `records` records or `bytes` bytes of output, whichever comes first. A record
/// larger than `bytes` is a batch of its own. The byte bound keeps memory flat whatever the
/// items' size: 5000 items of 400 KB would otherwise be one 2 GB batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Records at most (`batch_size`).
    pub records: usize,
    /// Output bytes at most (`batch_max_bytes`), the record that crosses it excepted when it
    /// is the batch's first.
    pub bytes: usize,
    /// A scan page is never split between batches: a batch may exceed the limits by the rest
    /// of a page. For a sink that commits each batch's position with it exactly once: a
    /// resumed scan restarts a page from its start cursor, so a batch ending inside a page
    /// would send that page's first records again (`SourceConfig::whole_pages`). Export
    /// pages carry exact line counts and stream hand-overs exact sequence numbers: they are
    /// still cut at the limits.
    pub whole_pages: bool,
}

impl BatchLimits {
    /// `batch_size` and `batch_max_bytes` of `source`.
    pub fn of(source: &SourceConfig) -> Self {
        BatchLimits {
            records: source.batch_size,
            bytes: source.batch_max_bytes,
            whole_pages: source.whole_pages,
        }
    }

    /// At most `records` records, and the default byte bound.
    pub const fn records(records: usize) -> Self {
        BatchLimits {
            records,
            bytes: crate::config::defaults::BATCH_MAX_BYTES,
            whole_pages: false,
        }
    }

    /// No bound: the caller hands each batch over itself (a fencing sink's page is a batch).
    pub const UNBOUNDED: BatchLimits = BatchLimits {
        records: usize::MAX,
        bytes: usize::MAX,
        whole_pages: false,
    };
}

/// The table scan of a mirror or a resnapshot: the table is described when it starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotPlan {
    /// `TotalSegments`.
    pub segments: u32,
    /// Segments read at once.
    pub max_concurrency: usize,
    /// `Limit` of each page.
    pub page_limit: Option<u32>,
    /// `ConsistentRead`.
    pub consistent_read: bool,
    /// The read rate, decided on the described table.
    pub read_rule: ReadRule,
}

/// A streams or mirror run; the stream itself is resolved from the table.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    /// `streams` or `mirror`.
    pub mode: Mode,
    /// The one retry policy.
    pub retry: RetryPolicy,
    /// Plain or typed values.
    pub format: ValueFormat,
    /// `GetRecords` `Limit`.
    pub records_per_request: u32,
    /// The effective poll interval (rule 3).
    pub poll_interval: Duration,
    /// The longest wait between reads of an idle shard (rule 3).
    pub max_idle_poll: Duration,
    /// Concurrency, discovery and end conditions.
    pub bounds: RunBounds,
    /// Where a first run starts.
    pub start_position: StartPosition,
    /// What a gap found at start-up does.
    pub on_gap: OnGap,
    /// Stop after this many records.
    pub max_messages: Option<u64>,
    /// How large a batch may grow.
    pub batch: BatchLimits,
    /// The table scan of a mirror or a resnapshot.
    pub snapshot: SnapshotPlan,
    /// The process's read slots (`source.read_concurrency`): GetRecords and the snapshot's
    /// pages take them.
    pub slots: ReadSlots,
}

impl StreamPlan {
    /// The plan of a streams or mirror `source` (rule 3).
    pub fn build(source: &SourceConfig) -> Self {
        StreamPlan {
            mode: source.mode,
            retry: source.retry.policy(),
            format: source.value_format,
            records_per_request: source.records_per_request,
            poll_interval: Duration::from_millis(source.poll_interval_ms).max(MIN_POLL),
            max_idle_poll: Duration::from_millis(source.max_idle_poll_ms)
                .max(Duration::from_millis(source.poll_interval_ms))
                .max(MIN_POLL),
            bounds: RunBounds {
                shard_concurrency: source.shard_concurrency,
                discovery_interval: Duration::from_secs(source.discovery_interval_secs),
                idle_termination: source.idle_termination_secs.map(Duration::from_secs),
                follow: source.follow,
            },
            start_position: source.start_position.unwrap_or(StartPosition::TrimHorizon),
            on_gap: source.on_gap,
            max_messages: source.max_messages.map(|m| m as u64),
            batch: BatchLimits::of(source),
            snapshot: SnapshotPlan {
                segments: source.segments,
                max_concurrency: source.max_concurrency,
                page_limit: source.page_limit,
                consistent_read: source.consistent_read,
                read_rule: ReadRule::of(source),
            },
            slots: source.read_concurrency.clone(),
        }
    }

    /// Whether the run may scan the table (rule 5), given whether the stored position holds
    /// an open snapshot.
    pub fn scans_table(&self, snapshot_open: bool) -> bool {
        self.on_gap.may_resnapshot() || snapshot_open || self.mode == Mode::Mirror
    }
}

#[cfg(test)]
mod tests {
    use super::read_rate::tests::table;
    use super::*;
    use crate::api::ReadKind;

    #[test]
    fn a_query_plan_reads_one_segment_with_its_key_condition() {
        let mut source = SourceConfig::new("orders");
        source.mode = Mode::Query;
        source.key_condition_expression = Some("pk = :p".into());
        let plan = ScanPlan::build(&source, &table("PROVISIONED", Some(10), None)).unwrap();
        assert_eq!(plan.total_segments, 1);
        assert!(matches!(plan.template.kind, ReadKind::Query { .. }));
        assert_eq!(plan.read_rate, None);
    }

    #[test]
    fn a_scan_plan_carries_the_read_rate_and_its_rule() {
        let mut source = SourceConfig::new("orders");
        source.segments = 4;
        source.read_capacity_fraction = Some(0.5);
        let plan = ScanPlan::build(&source, &table("PROVISIONED", Some(10), None)).unwrap();
        assert_eq!(plan.total_segments, 4);
        assert_eq!(plan.read_rate, Some(5.0));
        assert!(plan.read_rule.refreshes());
    }

    #[test]
    fn an_index_problem_comes_before_a_read_rate_problem_and_names_its_field() {
        let mut source = SourceConfig::new("orders");
        source.index_name = Some("nope".into());
        source.read_capacity_fraction = Some(0.5);
        let on_demand = table("PAY_PER_REQUEST", None, None);
        let error = ScanPlan::build(&source, &on_demand).unwrap_err();
        assert_eq!(
            error.config_error().to_string(),
            "config error: source.index_name: index 'nope' not found on table 'orders'; indexes: none"
        );
        source.index_name = None;
        let error = ScanPlan::build(&source, &on_demand).unwrap_err();
        assert_eq!(error.config_error().path, "source.read_capacity_fraction");
    }

    #[test]
    fn the_poll_interval_has_a_floor_of_200_ms() {
        let mut source = SourceConfig::new("orders");
        source.mode = Mode::Streams;
        source.poll_interval_ms = 50;
        assert_eq!(StreamPlan::build(&source).poll_interval, MIN_POLL);
        assert_eq!(
            StreamPlan::build(&source).max_idle_poll,
            Duration::from_secs(10),
            "idle shards back off to max_idle_poll_ms"
        );
        source.max_idle_poll_ms = 100;
        assert_eq!(StreamPlan::build(&source).max_idle_poll, MIN_POLL);
        source.poll_interval_ms = 30_000;
        assert_eq!(
            StreamPlan::build(&source).max_idle_poll,
            Duration::from_secs(30),
            "a cap below the poll interval is no backoff"
        );
        source.max_idle_poll_ms = 10_000;
        source.poll_interval_ms = 1500;
        assert_eq!(
            StreamPlan::build(&source).poll_interval,
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn a_first_run_starts_at_the_trim_horizon_unless_told_otherwise() {
        let mut source = SourceConfig::new("orders");
        source.mode = Mode::Streams;
        assert_eq!(
            StreamPlan::build(&source).start_position,
            StartPosition::TrimHorizon
        );
        source.start_position = Some(StartPosition::Latest);
        assert_eq!(
            StreamPlan::build(&source).start_position,
            StartPosition::Latest
        );
    }

    #[test]
    fn a_streams_run_scans_the_table_for_mirror_resnapshot_or_an_open_snapshot() {
        let mut source = SourceConfig::new("orders");
        source.mode = Mode::Streams;
        let plain = StreamPlan::build(&source);
        assert!(!plain.scans_table(false));
        assert!(plain.scans_table(true));
        source.on_gap = OnGap::Resnapshot;
        assert!(StreamPlan::build(&source).scans_table(false));
        source.on_gap = OnGap::Fail;
        source.mode = Mode::Mirror;
        assert!(StreamPlan::build(&source).scans_table(false));
    }

    #[test]
    fn the_retry_policy_takes_its_durations_in_milliseconds() {
        let policy = RetryConfig::DEFAULT.policy();
        assert_eq!(policy.initial_backoff, Duration::from_millis(100));
        assert_eq!(policy.attempt_timeout, Duration::from_secs(30));
    }
}
