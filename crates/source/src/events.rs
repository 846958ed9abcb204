//! Typed telemetry events of the source: each writes its log line and its metric together.
//!
//! Metrics are `ddbpipe_<what>_<unit>_total` counters and gauges; labels take few values
//! (operation, outcome, kind, state), never a shard id or a message. The exporter adds the
//! `pipeline` label to every series.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::error::ErrorClass;
use crate::retry::AttemptObserver;

/// Describes the source's metrics to the installed recorder (the `# HELP` lines of the
/// Prometheus text format). Call once, after installing a recorder.
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(
        "ddbpipe_requests_total",
        "DynamoDB and Streams request attempts, by operation and outcome (ok, throttled, transient, fatal)"
    );
    describe_counter!(
        "ddbpipe_records_read_total",
        "Records read from the source, by kind (item, change, snapshot)"
    );
    describe_counter!(
        "ddbpipe_read_capacity_units_total",
        Unit::Count,
        "Read capacity units consumed, as DynamoDB reported them"
    );
    describe_gauge!(
        "ddbpipe_read_rate_limit_units",
        "The effective read-capacity limit in units per second (0: unlimited)"
    );
    describe_gauge!(
        "ddbpipe_scan_segments",
        "Scan segments by state (pending, active, done)"
    );
    describe_gauge!(
        "ddbpipe_shards",
        "Stream shards by state (queued, active, finished)"
    );
    describe_gauge!(
        "ddbpipe_get_records_per_shard_hour",
        "GetRecords requests of shard reads per hour of an open (queued or active) shard, \
         since the stream read started: about 360 for an idle shard with the default \
         max_idle_poll_ms"
    );
    describe_gauge!(
        "ddbpipe_source_lag_seconds",
        Unit::Seconds,
        "Age of the oldest change not yet read, over the shards being read"
    );
    describe_counter!(
        "ddbpipe_discovery_failures_total",
        "Shard discoveries that failed after the start (the run goes on)"
    );
}

/// Counts every request attempt by operation and outcome (`ddbpipe_requests_total`).
#[derive(Debug, Default, Clone, Copy)]
pub struct RequestMetrics;

impl AttemptObserver for RequestMetrics {
    fn attempt(&self, operation: &'static str, outcome: Option<ErrorClass>) {
        let outcome = outcome.map_or("ok", ErrorClass::as_str);
        metrics::counter!("ddbpipe_requests_total", "operation" => operation, "outcome" => outcome)
            .increment(1);
    }
}

/// What kind of record was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A scan or query item.
    Item,
    /// A stream change record.
    Change,
    /// A snapshot row of a mirror or resnapshot.
    Snapshot,
}

impl RecordKind {
    fn as_str(self) -> &'static str {
        match self {
            RecordKind::Item => "item",
            RecordKind::Change => "change",
            RecordKind::Snapshot => "snapshot",
        }
    }
}

/// A page (or a `GetRecords` answer) was read.
pub struct PageRead {
    /// Item, change or snapshot.
    pub kind: RecordKind,
    /// Records in it.
    pub records: usize,
    /// Read capacity units it consumed (scans and queries).
    pub capacity_units: Option<f64>,
}

impl PageRead {
    /// Counts the records and the capacity.
    pub fn emit(self) {
        metrics::counter!("ddbpipe_records_read_total", "kind" => self.kind.as_str())
            .increment(self.records as u64);
        if let Some(units) = self.capacity_units {
            metrics::counter!("ddbpipe_read_capacity_units_total").increment(units.ceil() as u64);
        }
    }
}

/// The effective read rate changed (or was set at start).
pub struct ReadRateSet {
    /// Units per second; `None` = unlimited.
    pub units_per_second: Option<f64>,
}

impl ReadRateSet {
    /// Sets `ddbpipe_read_rate_limit_units` (0 = unlimited).
    pub fn emit(self) {
        metrics::gauge!("ddbpipe_read_rate_limit_units").set(self.units_per_second.unwrap_or(0.0));
    }
}

/// How many scan segments are in each state.
pub struct SegmentsCounted {
    /// Not started.
    pub pending: u64,
    /// Being read.
    pub active: u64,
    /// Read to their end (this run and before).
    pub done: u64,
}

impl SegmentsCounted {
    /// Sets `ddbpipe_scan_segments{state}`.
    pub fn emit(self) {
        metrics::gauge!("ddbpipe_scan_segments", "state" => "pending").set(self.pending as f64);
        metrics::gauge!("ddbpipe_scan_segments", "state" => "active").set(self.active as f64);
        metrics::gauge!("ddbpipe_scan_segments", "state" => "done").set(self.done as f64);
    }
}

/// How many shards are in each state.
pub struct ShardsCounted {
    /// Waiting for a turn.
    pub queued: u64,
    /// Being read by a slice.
    pub active: u64,
    /// Finished (their last record handed over).
    pub finished: u64,
}

/// The latest shard counts and running lag of this process's stream read, for the live
/// status line of a run (`stream_status`). One stream is read per process.
static QUEUED: AtomicU64 = AtomicU64::new(0);
/// `GetRecords` of shard reads made by this process ([`get_records_made`]).
static GET_RECORDS: AtomicU64 = AtomicU64::new(0);
/// Milliseconds of open shards (queued or active) summed over time, from the counts of
/// consecutive [`ShardsCounted`] events.
static SHARD_MS: AtomicU64 = AtomicU64::new(0);
/// When the last [`ShardsCounted`] was emitted (unix ms; 0: never).
static COUNTED_AT_MS: AtomicI64 = AtomicI64::new(0);
static ACTIVE: AtomicU64 = AtomicU64::new(0);
static FINISHED: AtomicU64 = AtomicU64::new(0);
/// The lag in milliseconds; negative = not measured yet.
static LAG_MS: AtomicI64 = AtomicI64::new(-1);

/// What a stream read reported last: shards by state and the running lag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamStatus {
    /// Shards waiting for a turn.
    pub queued: u64,
    /// Shards being read.
    pub active: u64,
    /// Shards finished.
    pub finished: u64,
    /// The running lag in seconds, once measured.
    pub lag_seconds: Option<f64>,
    /// `GetRecords` of shard reads per hour of an open shard so far ([`request_rate`]), once
    /// a shard was open for a second.
    pub get_records_per_shard_hour: Option<f64>,
}

/// A shard read made a `GetRecords` request (counted for the request rate of
/// [`StreamStatus::get_records_per_shard_hour`]).
pub fn get_records_made() {
    GET_RECORDS.fetch_add(1, Ordering::Relaxed);
}

/// `get_records` requests over `shard_ms` milliseconds of open shards, per shard-hour; `None`
/// under one shard-second (too short to say).
pub fn request_rate(get_records: u64, shard_ms: u64) -> Option<f64> {
    (shard_ms >= 1000).then(|| get_records as f64 * 3_600_000.0 / shard_ms as f64)
}

/// The latest [`StreamStatus`] of this process.
pub fn stream_status() -> StreamStatus {
    let lag = LAG_MS.load(Ordering::Relaxed);
    StreamStatus {
        queued: QUEUED.load(Ordering::Relaxed),
        active: ACTIVE.load(Ordering::Relaxed),
        finished: FINISHED.load(Ordering::Relaxed),
        lag_seconds: (lag >= 0).then(|| lag as f64 / 1000.0),
        get_records_per_shard_hour: request_rate(
            GET_RECORDS.load(Ordering::Relaxed),
            SHARD_MS.load(Ordering::Relaxed),
        ),
    }
}

impl ShardsCounted {
    /// Sets `ddbpipe_shards{state}` and the live status, and adds the time since the last
    /// counts, times the shards open then, to the open shards' time (the request rate).
    pub fn emit(self) {
        let now_ms = crate::clock::unix_now_ms();
        let before_ms = COUNTED_AT_MS.swap(now_ms, Ordering::Relaxed);
        if before_ms > 0 && now_ms > before_ms {
            let open = QUEUED.load(Ordering::Relaxed) + ACTIVE.load(Ordering::Relaxed);
            SHARD_MS.fetch_add(open * (now_ms - before_ms) as u64, Ordering::Relaxed);
        }
        if let Some(rate) = request_rate(
            GET_RECORDS.load(Ordering::Relaxed),
            SHARD_MS.load(Ordering::Relaxed),
        ) {
            metrics::gauge!("ddbpipe_get_records_per_shard_hour").set(rate);
        }
        QUEUED.store(self.queued, Ordering::Relaxed);
        ACTIVE.store(self.active, Ordering::Relaxed);
        FINISHED.store(self.finished, Ordering::Relaxed);
        metrics::gauge!("ddbpipe_shards", "state" => "queued").set(self.queued as f64);
        metrics::gauge!("ddbpipe_shards", "state" => "active").set(self.active as f64);
        metrics::gauge!("ddbpipe_shards", "state" => "finished").set(self.finished as f64);
    }
}

/// The running lag was measured (docs/streams.md §4.11).
pub struct LagMeasured {
    /// Seconds; `None` when no unfinished shard has read anything.
    pub seconds: Option<f64>,
}

impl LagMeasured {
    /// Sets `ddbpipe_source_lag_seconds` when there is a value.
    pub fn emit(self) {
        if let Some(seconds) = self.seconds {
            metrics::gauge!("ddbpipe_source_lag_seconds").set(seconds);
            LAG_MS.store((seconds * 1000.0).round() as i64, Ordering::Relaxed);
        }
    }
}

/// A discovery after the start failed (the run goes on).
pub struct DiscoveryFailed<'a> {
    /// Why.
    pub error: &'a dyn std::fmt::Display,
}

impl DiscoveryFailed<'_> {
    /// Warns and counts `ddbpipe_discovery_failures_total`.
    pub fn emit(self) {
        tracing::warn!(error = %self.error, "Shard discovery failed; retrying at the next interval.");
        metrics::counter!("ddbpipe_discovery_failures_total").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::request_rate;

    #[test]
    fn the_request_rate_is_get_records_per_hour_of_open_shards() {
        // 100 shards open for an hour, read once every 10 s: 360 a shard-hour.
        assert_eq!(request_rate(36_000, 100 * 3_600_000), Some(360.0));
        // One shard for 30 s, read 30 times: 3,600 a shard-hour.
        assert_eq!(request_rate(30, 30_000), Some(3600.0));
        assert_eq!(request_rate(5, 999), None, "under a shard-second");
    }
}
