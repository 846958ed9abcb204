//! The `metrics:` section: how the metrics listener (`--metrics-addr`) judges the run's health.

use std::time::Duration;

use serde_json::json;

use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of};

/// `metrics.health_stall_secs` when unset: five minutes.
pub const DEFAULT_HEALTH_STALL_SECS: u64 = 300;

/// The keys of `metrics:`.
pub(super) static METRICS: &[Field] = &[defaulted(
    "health_stall_secs",
    of::<u64>(),
    || json!(DEFAULT_HEALTH_STALL_SECS),
    "/health answers 503 (stalled) when nothing progressed for longer than this, in seconds: no \
     read answered and no batch was committed, or one sink write lasted longer (docs/cli.md \
     §8.6). Idle waits that answer (a quiet stream, an export being polled, a worker waiting \
     for a lease) are progress.",
)];

/// How `/health` on the metrics listener judges the run: the `metrics:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `/health` answers 503 when nothing progressed for longer than this, in seconds (or one
    /// sink write lasted longer). Default 300.
    pub health_stall_secs: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            health_stall_secs: DEFAULT_HEALTH_STALL_SECS,
        }
    }
}

impl MetricsConfig {
    /// The stall bound of `/health`.
    pub fn health_stall(&self) -> Duration {
        Duration::from_secs(self.health_stall_secs)
    }
}

/// Reads `metrics:` (absent: the defaults).
pub(super) fn read(f: Option<Fields<'_>>) -> MetricsConfig {
    let mut metrics = MetricsConfig::default();
    if let Some(mut f) = f {
        metrics.health_stall_secs = f.or("health_stall_secs", metrics.health_stall_secs);
        f.finish();
    }
    metrics
}

/// Rule: a bound of 0 would call every run stalled.
pub(super) fn validate(
    metrics: &MetricsConfig,
    errors: &mut Vec<ddbpipe_source::config::ConfigError>,
) {
    if metrics.health_stall_secs == 0 {
        errors.push(ddbpipe_source::config::ConfigError::new(
            "metrics.health_stall_secs",
            "must be at least 1: with 0 every run would be stalled",
        ));
    }
}
