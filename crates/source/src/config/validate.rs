//! The validation rules of the source (docs/config.md §1.3 rules 1–11) and the mode warnings.
//!
//! # Validation
//! Rules run in the order of docs/config.md §1.3 and every failing rule is reported, never only the first:
//! 1. `table_name` is not blank.
//! 2. `batch_size` is 1..=1 000 000 (0, "one batch for the whole run", is refused);
//!    `batch_max_bytes` is 1 KiB..=1 GiB.
//! 3. `segments` is 1..=1 000 000.
//! 4. Query mode reads one segment.
//! 5. Counts and limits that must be at least 1 are.
//! 6. `key_condition_expression` is required in query mode and refused elsewhere.
//! 7. Expression attribute names start with `#`; no expression names an attribute by a
//!    DynamoDB reserved word (`reserved`), which the service would refuse at the first request.
//! 8. Expression attribute values start with `:` and are set in only one of the two maps.
//! 9. Streams and mirror: a way to end the run, no scan-only fields, sane polling.
//! 10. Scan and query: no stream-only fields.
//! 11. Rates, fractions and intervals are in range.
//! 13. `snapshot.engine: export` (docs/scan.md §2.10): `s3_bucket` is set; not in query mode;
//!     none of `filter_expression`, `projection`, `index_name`, `segments` above 1 or
//!     `consistent_read` (an export has none of them); `export_arn` is an export's ARN and only
//!     with the export engine; the export fields need `engine: export`, except that
//!     `on_gap: repair` (streams and mirror) needs `s3_bucket`, and streams and mirror may set
//!     the bucket fields whatever the engine and `on_gap` (a repair left open is finished
//!     through them whatever `on_gap` says now: docs/streams.md §4.12).
//!
//! Rule 12 (the pipeline name, sink and state) belongs to the CLI, which sees the whole file.
//! Decoding a typed expression value (part of rule 8) happens while the CLI reads the YAML,
//! because a [`SourceConfig`] only ever holds decoded values.
//!
//! # Error handling
//! A rule appends a [`ConfigError`] (dotted path, message) and validation goes on, so one run
//! of `ddbpipe check` shows every problem of a file.

use std::collections::BTreeSet;

use super::{ConfigError, Mode, OnGap, SnapshotEngine, SourceConfig, reserved};
use crate::capacity::{MAX_READ_RATE, MIN_READ_RATE};

const MAX_SEGMENTS: u32 = 1_000_000;
const MAX_BATCH_SIZE: usize = 1_000_000;
/// `batch_max_bytes`' range (rule 2).
const BATCH_BYTES: std::ops::RangeInclusive<usize> = 1024..=1024 * 1024 * 1024;
const MAX_RECORDS_PER_REQUEST: u32 = 1000;
const MAX_POLL_INTERVAL_MS: u64 = 600_000;
const ATTEMPT_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1000..=600_000;
const DISCOVERY_INTERVAL_SECS_RANGE: std::ops::RangeInclusive<u64> = 10..=3600;
/// The least `read_capacity_fraction`: a millionth of the table's capacity.
const MIN_READ_CAPACITY_FRACTION: f64 = 1e-6;

impl SourceConfig {
    /// Whether this run issues `Scan` or `Query` requests at all: scan, query, mirror, and
    /// streams that may resnapshot.
    fn reads_table(&self) -> bool {
        self.mode != Mode::Streams || self.on_gap.may_resnapshot()
    }

    /// Whether a gap is repaired by incremental exports (streams and mirror with
    /// `on_gap: repair`): the export bucket fields are needed whatever the snapshot engine.
    fn repairs_by_export(&self) -> bool {
        self.mode.reads_stream() && self.on_gap == OnGap::Repair
    }

    /// Whether this run may run a parallel scan: scan, mirror, and streams that may resnapshot.
    fn scans_segments(&self) -> bool {
        self.mode != Mode::Query && self.reads_table()
    }

    /// Applies docs/config.md §1.3 rules 1–11 and appends every failure to `errors`, in rule order, with
    /// paths like `source.segments`.
    pub fn validate(&self, errors: &mut Vec<ConfigError>) {
        let mut fail = |field: &str, message: String| {
            errors.push(ConfigError::new(format!("source.{field}"), message));
        };

        // 1.
        if self.table_name.trim().is_empty() {
            fail("table_name", "table_name must not be empty".into());
        }
        // 2.
        if self.batch_size == 0 {
            fail(
                "batch_size",
                "batch_size must be 1..=1000000 (got 0); 0 (one batch for the whole run) is not \
                 supported: it holds the whole table in memory"
                    .into(),
            );
        } else if self.batch_size > MAX_BATCH_SIZE {
            let got = self.batch_size;
            fail(
                "batch_size",
                format!("batch_size must be 1..=1000000 (got {got})"),
            );
        }
        if !BATCH_BYTES.contains(&self.batch_max_bytes) {
            let got = self.batch_max_bytes;
            fail(
                "batch_max_bytes",
                format!(
                    "batch_max_bytes must be 1024..=1073741824 (1 KiB to 1 GiB; got {got}): it \
                     bounds the memory a batch holds"
                ),
            );
        }
        // 3.
        if !(1..=MAX_SEGMENTS).contains(&self.segments) {
            let got = self.segments;
            fail(
                "segments",
                format!("segments must be 1..=1000000 (got {got})"),
            );
        }
        // 4.
        if self.mode == Mode::Query && self.segments > 1 {
            fail(
                "segments",
                "segments > 1 is not valid in mode: query".into(),
            );
        }
        // 5.
        let at_least_one = [
            ("max_concurrency", Some(self.max_concurrency as u64)),
            ("resnapshot_max_keys", Some(self.resnapshot_max_keys as u64)),
            ("page_limit", self.page_limit.map(u64::from)),
            ("shard_concurrency", Some(self.shard_concurrency as u64)),
            (
                "read_concurrency",
                Some(self.read_concurrency.size() as u64),
            ),
            ("idle_termination_secs", self.idle_termination_secs),
            ("max_messages", self.max_messages.map(|n| n as u64)),
        ];
        for (field, value) in at_least_one {
            if value == Some(0) {
                fail(field, format!("{field} must be at least 1"));
            }
        }
        // 6.
        match (self.mode, &self.key_condition_expression) {
            (Mode::Query, None) => fail(
                "key_condition_expression",
                "mode: query requires key_condition_expression".into(),
            ),
            (Mode::Query, Some(_)) | (_, None) => {}
            (mode, Some(_)) => fail(
                "key_condition_expression",
                format!("key_condition_expression is only valid in query mode (mode: {mode})"),
            ),
        }
        // 7.
        for key in self.expression_attribute_names.keys() {
            if !key.starts_with('#') {
                fail(
                    "expression_attribute_names",
                    format!("key '{key}' must start with '#'"),
                );
            }
        }
        let expressions = [
            ("projection", &self.projection, false),
            ("filter_expression", &self.filter_expression, true),
            (
                "key_condition_expression",
                &self.key_condition_expression,
                true,
            ),
        ];
        for (field, expression, condition) in expressions {
            let Some(expression) = expression else {
                continue;
            };
            for word in reserved::bare_reserved_words(expression, condition) {
                let placeholder = format!("#{}", word.to_ascii_lowercase());
                fail(
                    field,
                    format!(
                        "'{word}' is a DynamoDB reserved word: write {placeholder} in the \
                         expression and add expression_attribute_names: {{\"{placeholder}\": {word}}}"
                    ),
                );
            }
        }
        // 8.
        let value_maps = [
            (
                "expression_attribute_values",
                &self.expression_attribute_values,
            ),
            (
                "expression_attribute_values_typed",
                &self.expression_attribute_values_typed,
            ),
        ];
        for (field, map) in value_maps {
            for key in map.keys().filter(|key| !key.starts_with(':')) {
                fail(field, format!("key '{key}' must start with ':'"));
            }
        }
        for key in self.expression_attribute_values.keys() {
            if self.expression_attribute_values_typed.contains_key(key) {
                fail(
                    "expression_attribute_values_typed",
                    format!(
                        "'{key}' is set in both expression_attribute_values and \
                         expression_attribute_values_typed"
                    ),
                );
            }
        }
        // 9.
        if self.mode.reads_stream() {
            self.validate_stream_rules(&mut fail);
        }
        // 10.
        if !self.mode.reads_stream() {
            if self.stream_arn.is_some() {
                fail(
                    "stream_arn",
                    "stream_arn is only valid in streams and mirror modes".into(),
                );
            }
            if self.follow {
                fail(
                    "follow",
                    "follow is only valid in streams and mirror modes".into(),
                );
            }
        }
        // 11. Bounds a person can mean: beyond them a run would wait for ages between two
        // requests (and the arithmetic on the rate would overflow).
        if let Some(rate) = self.max_read_units_per_second {
            if !(rate.is_finite() && rate > 0.0) {
                fail(
                    "max_read_units_per_second",
                    format!(
                        "max_read_units_per_second must be finite and greater than 0 (got {rate})"
                    ),
                );
            } else if !(MIN_READ_RATE..=MAX_READ_RATE).contains(&rate) {
                fail(
                    "max_read_units_per_second",
                    format!(
                        "max_read_units_per_second must be at least {MIN_READ_RATE} and at most \
                         {MAX_READ_RATE:e} read units per second (got {rate:e})"
                    ),
                );
            }
        }
        if let Some(fraction) = self.read_capacity_fraction {
            if !(fraction > 0.0 && fraction <= 1.0) {
                fail(
                    "read_capacity_fraction",
                    format!(
                        "read_capacity_fraction must be greater than 0 and at most 1 (got {fraction})"
                    ),
                );
            } else if fraction < MIN_READ_CAPACITY_FRACTION {
                fail(
                    "read_capacity_fraction",
                    format!(
                        "read_capacity_fraction must be at least {MIN_READ_CAPACITY_FRACTION:e} \
                         (got {fraction:e}); for a fixed small rate set max_read_units_per_second"
                    ),
                );
            }
        }
        let retry = &self.retry;
        if retry.initial_backoff_ms > retry.max_backoff_ms {
            fail(
                "retry.initial_backoff_ms",
                format!(
                    "initial_backoff_ms ({}) must not be greater than max_backoff_ms ({})",
                    retry.initial_backoff_ms, retry.max_backoff_ms
                ),
            );
        }
        let timeout = self.retry.attempt_timeout_ms;
        if !ATTEMPT_TIMEOUT_MS_RANGE.contains(&timeout) {
            fail(
                "retry.attempt_timeout_ms",
                format!("attempt_timeout_ms must be 1000..=600000 (got {timeout})"),
            );
        }
        let interval = self.discovery_interval_secs;
        if !DISCOVERY_INTERVAL_SECS_RANGE.contains(&interval) {
            fail(
                "discovery_interval_secs",
                format!("discovery_interval_secs must be 10..=3600 (got {interval})"),
            );
        }
        // 13.
        self.validate_snapshot(&mut fail);
    }

    /// Rule 9: streams and mirror modes.
    fn validate_stream_rules(&self, fail: &mut impl FnMut(&str, String)) {
        let mode = self.mode;
        let got = self.records_per_request;
        if !(1..=MAX_RECORDS_PER_REQUEST).contains(&got) {
            fail(
                "records_per_request",
                format!("records_per_request must be 1..=1000 (got {got})"),
            );
        }
        let bounded = self.idle_termination_secs.is_some() || self.max_messages.is_some();
        if !self.follow && !bounded {
            fail(
                "mode",
                format!(
                    "mode: {mode} needs a way to terminate: set idle_termination_secs, \
                     max_messages, or follow: true"
                ),
            );
        }
        if self.follow && bounded {
            fail(
                "follow",
                "follow: true runs until stopped; remove idle_termination_secs/max_messages".into(),
            );
        }
        let scan_only = [
            ("projection", self.projection.is_some()),
            ("filter_expression", self.filter_expression.is_some()),
            ("index_name", self.index_name.is_some()),
            (
                "expression_attribute_names",
                !self.expression_attribute_names.is_empty(),
            ),
            (
                "expression_attribute_values",
                !self.expression_attribute_values.is_empty(),
            ),
            (
                "expression_attribute_values_typed",
                !self.expression_attribute_values_typed.is_empty(),
            ),
        ];
        let set: Vec<&str> = scan_only
            .iter()
            .filter(|(_, set)| *set)
            .map(|(field, _)| *field)
            .collect();
        if let Some(first) = set.first() {
            let verb = if set.len() == 1 { "does" } else { "do" };
            let fields = set.join(", ");
            fail(first, format!("{fields} {verb} not apply to mode: {mode}"));
        }
        for (field, value) in [
            ("poll_interval_ms", self.poll_interval_ms),
            ("max_idle_poll_ms", self.max_idle_poll_ms),
        ] {
            if value > MAX_POLL_INTERVAL_MS {
                fail(
                    field,
                    format!(
                        "{field} must be at most 600000 (shard iterators expire after 15 \
                         minutes); got {value}"
                    ),
                );
            }
        }
        if mode == Mode::Mirror && self.start_position.is_some() {
            fail(
                "start_position",
                "start_position does not apply to mode: mirror (mirror captures its own start \
                 positions)"
                    .into(),
            );
        }
    }

    /// Rule 13: the export engine's fields (`snapshot.*`).
    fn validate_snapshot(&self, fail: &mut impl FnMut(&str, String)) {
        let snapshot = &self.snapshot;
        let bucket_missing = snapshot
            .s3_bucket
            .as_deref()
            .is_none_or(|b| b.trim().is_empty());
        if self.repairs_by_export() && bucket_missing && snapshot.engine != SnapshotEngine::Export {
            fail(
                "snapshot.s3_bucket",
                "on_gap: repair exports the changes of a gap to S3: set snapshot.s3_bucket (the \
                 export engine's bucket fields serve the repair whatever snapshot.engine says)"
                    .into(),
            );
        }
        if snapshot.engine != SnapshotEngine::Export {
            // The bucket fields serve a repair by incremental exports in the modes that read a
            // stream whatever `on_gap` says: a repair left open (in the state, or in a shared
            // mirror's record) is finished by a run with another `on_gap` as long as it has the
            // bucket (docs/streams.md §4.12 "Crash safety", docs/coordination.md §11.12 rule 9).
            let for_repairs = self.mode.reads_stream();
            let needs = if for_repairs {
                "snapshot.engine: export (a repair by incremental exports uses only the bucket \
                 fields)"
            } else {
                "snapshot.engine: export or on_gap: repair"
            };
            let export_only = [
                ("s3_bucket", snapshot.s3_bucket.is_some()),
                ("s3_prefix", snapshot.s3_prefix.is_some()),
                ("s3_bucket_owner", snapshot.s3_bucket_owner.is_some()),
                ("s3_region", snapshot.s3_region.is_some()),
                ("s3_endpoint_url", snapshot.s3_endpoint_url.is_some()),
                ("export_arn", snapshot.export_arn.is_some()),
            ];
            for (field, set) in export_only {
                let for_repair = for_repairs && field != "export_arn";
                if set && !for_repair {
                    fail(
                        &format!("snapshot.{field}"),
                        format!("snapshot.{field} needs {needs}"),
                    );
                }
            }
            return;
        }
        if self.mode == Mode::Query {
            fail(
                "snapshot.engine",
                "snapshot.engine: export does not apply to mode: query (an export holds the \
                 whole table; use mode: scan)"
                    .into(),
            );
        }
        if bucket_missing {
            fail(
                "snapshot.s3_bucket",
                "snapshot.engine: export requires snapshot.s3_bucket, the bucket the export is \
                 written to"
                    .into(),
            );
        }
        let refused = [
            ("filter_expression", self.filter_expression.is_some()),
            ("projection", self.projection.is_some()),
            ("index_name", self.index_name.is_some()),
            ("segments", self.segments > 1),
            ("consistent_read", self.consistent_read),
        ];
        for (field, set) in refused {
            if set {
                fail(
                    field,
                    format!(
                        "{field} does not apply to snapshot.engine: export (an export holds \
                         every attribute of every item of the table, at one instant); remove \
                         it, or use snapshot.engine: scan"
                    ),
                );
            }
        }
        if let Some(prefix) = &snapshot.s3_prefix
            && (prefix.starts_with('/') || prefix.trim().is_empty())
        {
            fail(
                "snapshot.s3_prefix",
                format!(
                    "snapshot.s3_prefix must be a key prefix without a leading '/' (got '{prefix}')"
                ),
            );
        }
        if let Some(arn) = &snapshot.export_arn
            && !(arn.starts_with("arn:") && arn.contains(":table/") && arn.contains("/export/"))
        {
            fail(
                "snapshot.export_arn",
                format!(
                    "'{arn}' is not an export ARN (arn:aws:dynamodb:<region>:<account>:table/<table>/export/<id>)"
                ),
            );
        }
    }

    /// Warnings for fields set in the file (`present` holds their keys, e.g.
    /// `"poll_interval_ms"`) that have no effect in this mode, one sentence each, naming the
    /// field and the mode. Fields that are errors in this mode are left to [`Self::validate`].
    pub fn ineffective_fields(&self, present: &BTreeSet<String>) -> Vec<String> {
        let mode = self.mode;
        // Fields of Scan and Query requests are live in streams mode only for a resnapshot.
        let scan_condition = if mode == Mode::Streams {
            " with on_gap: fail (only a resnapshot scans)"
        } else {
            ""
        };
        let mut ineffective: Vec<(&str, &str)> = Vec::new();
        if !self.scans_segments() {
            ineffective.push(("segments", scan_condition));
            ineffective.push(("max_concurrency", scan_condition));
        }
        if !self.reads_table() {
            for field in [
                "consistent_read",
                "page_limit",
                "max_read_units_per_second",
                "read_capacity_fraction",
            ] {
                ineffective.push((field, scan_condition));
            }
            // Its bucket finishes a repair left open whatever `on_gap` says (rule 13).
            if self.snapshot.s3_bucket.is_none() {
                ineffective.push(("snapshot", scan_condition));
            }
        }
        if mode != Mode::Query {
            ineffective.push(("scan_index_forward", ""));
        }
        if !mode.reads_stream() {
            for field in [
                "start_position",
                "on_gap",
                "poll_interval_ms",
                "max_idle_poll_ms",
                "records_per_request",
                "shard_concurrency",
                "idle_termination_secs",
                "max_messages",
                "discovery_interval_secs",
            ] {
                ineffective.push((field, ""));
            }
        }
        let cleans_up = mode == Mode::Mirror || (mode.reads_stream() && self.reads_table());
        if !cleans_up {
            let condition = if mode == Mode::Streams {
                " with on_gap: fail (only a resnapshot cleans up)"
            } else {
                ""
            };
            ineffective.push(("resnapshot_deletes", condition));
            ineffective.push(("resnapshot_max_keys", condition));
        }
        ineffective
            .into_iter()
            .filter(|(field, _)| present.contains(*field))
            .map(|(field, condition)| {
                format!("source.{field} has no effect in mode: {mode}{condition}; it is ignored.")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
