//! Typed telemetry events of the pipeline: writes and commits.

use crate::batch::Batch;

/// Describes the pipeline's metrics to the installed recorder (the `# HELP` lines of the
/// Prometheus text format). Call once, after installing a recorder.
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(
        "ddbpipe_batches_committed_total",
        "Batches the sink acknowledged (durable) and the checkpoint took"
    );
    describe_counter!(
        "ddbpipe_records_written_total",
        "Records written durably, by op (item, c, u, d, r, other)"
    );
    describe_counter!(
        "ddbpipe_leases_total",
        "Lease events of this worker, by event (taken, stolen, lost, finished)"
    );
    describe_counter!(
        "ddbpipe_lease_requests_total",
        "Requests this worker sent to the lease table, by request (query, get, create, take, renew, checkpoint, release, delete)"
    );
    describe_gauge!(
        "ddbpipe_leases_held",
        "Work leases this worker holds (the leader lease not counted)"
    );
    describe_gauge!(
        "ddbpipe_checkpoint_age_seconds",
        Unit::Seconds,
        "Time since the position was last committed"
    );
}

/// A batch was acknowledged by the sink.
pub struct BatchAcknowledged<'a> {
    /// The batch.
    pub batch: &'a Batch,
}

impl BatchAcknowledged<'_> {
    /// Counts `ddbpipe_batches_committed_total` and `ddbpipe_records_written_total{op}`; the
    /// run progressed (`/health`): a commit of records, or of positions alone (an idle run's).
    pub fn emit(self) {
        if self.batch.records.is_empty() {
            ddbpipe_source::health::answered();
        } else {
            ddbpipe_source::health::committed();
        }
        metrics::counter!("ddbpipe_batches_committed_total").increment(1);
        let [c, u, d, other] = self.batch.ops;
        let changes = c + u + d + other;
        let items = (self.batch.records.len() as u64).saturating_sub(changes);
        for (op, count) in [
            ("item", items),
            ("c", c),
            ("u", u),
            ("d", d),
            ("other", other),
        ] {
            if count > 0 {
                metrics::counter!("ddbpipe_records_written_total", "op" => op).increment(count);
            }
        }
    }
}

/// How old the stored position is.
pub struct CheckpointAged {
    /// Seconds since the position was last written.
    pub seconds: f64,
}

impl CheckpointAged {
    /// Sets `ddbpipe_checkpoint_age_seconds`.
    pub fn emit(self) {
        metrics::gauge!("ddbpipe_checkpoint_age_seconds").set(self.seconds);
    }
}

/// A worker's leases changed (docs/coordination.md §11.10).
pub struct LeaseEvent<'a> {
    /// The worker's id.
    pub worker: &'a str,
    /// `taken`, `stolen`, `lost` or `finished`.
    pub event: &'static str,
    /// Work leases held after it.
    pub held: usize,
}

impl LeaseEvent<'_> {
    /// Counts `ddbpipe_leases_total{worker, event}` and sets `ddbpipe_leases_held{worker}`.
    pub fn emit(self) {
        let worker = self.worker.to_string();
        metrics::counter!("ddbpipe_leases_total", "worker" => worker.clone(), "event" => self.event)
            .increment(1);
        metrics::gauge!("ddbpipe_leases_held", "worker" => worker).set(self.held as f64);
    }
}
