//! The refresher of a read rate based on the table's capacity (docs/scan.md §2.7 rule 5): every scan
//! of the table (scan, query, and the snapshot scans of mirror and resnapshot) runs the same one.
//!
//! # Rules
//! 1. Every [`BASE_REFRESH`] the table is described again, retried by the run's policy.
//! 2. The rate [`ReadRule::refreshed`] gives replaces the configured rate of the limiter;
//!    without one, or when the description fails, the current rate stays (a warning says so).
//! 3. The refresher ends when its handle is dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::read_rate::ReadRule;
use crate::api::TableApi;
use crate::capacity::ReadLimiter;
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};

/// How often a `read_capacity_fraction` base is re-read (auto-scaling changes it).
pub const BASE_REFRESH: Duration = Duration::from_secs(300);

/// A running refresher; dropping it stops it (rule 3).
#[derive(Debug)]
pub struct Refresher(JoinHandle<()>);

impl Drop for Refresher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Refresher {
    /// Starts re-reading the base of `rule` into `limiter`; `None` when the rate does not
    /// depend on the table's capacity.
    pub fn start<A: TableApi>(
        api: Arc<A>,
        rule: &ReadRule,
        limiter: Arc<ReadLimiter>,
        retry: RetryPolicy,
        cancel: Cancel,
        observer: Arc<dyn AttemptObserver>,
    ) -> Option<Refresher> {
        if !rule.refreshes() {
            return None;
        }
        let rule = rule.clone();
        Some(Refresher(tokio::spawn(async move {
            loop {
                tokio::time::sleep(BASE_REFRESH).await;
                let table = rule.table_name.as_str();
                let described = retry
                    .run(
                        "describe_table",
                        || format!("DescribeTable '{table}'"),
                        &cancel,
                        observer.as_ref(),
                        |_| api.describe_table(table),
                    )
                    .await;
                let failed = match described {
                    Ok(Some(description)) => {
                        match rule.refreshed(&description) {
                            Some(rate) => limiter.set_configured_rate(rate),
                            None => tracing::warn!(
                                "The capacity base is gone; keeping the current read rate."
                            ),
                        }
                        continue;
                    }
                    Ok(None) => format!("DescribeTable '{table}' returned no table"),
                    // A read error's message already names its cause (it has no `source`).
                    Err(error) => error.to_string(),
                };
                tracing::warn!(error = %failed, "Re-reading the capacity base failed; keeping the current read rate.");
            }
        }
        .in_current_span())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeTable;
    use crate::retry::NoObserver;

    #[tokio::test(start_paused = true)]
    async fn a_fraction_is_re_read_every_refresh_period_until_the_refresher_is_dropped() {
        let rule = ReadRule {
            table_name: "t".into(),
            fraction: Some(0.5),
            ..ReadRule::default()
        };
        let limiter = Arc::new(ReadLimiter::new(Some(1.0)));
        let refresher = Refresher::start(
            Arc::new(FakeTable::numbered(1)),
            &rule,
            Arc::clone(&limiter),
            RetryPolicy::default(),
            Cancel::never(),
            Arc::new(NoObserver),
        );
        assert!(refresher.is_some());
        tokio::time::sleep(BASE_REFRESH / 2).await;
        assert_eq!(limiter.rate(), Some(1.0));
        tokio::time::sleep(BASE_REFRESH).await;
        // The fake table has 100 RCU.
        assert_eq!(limiter.rate(), Some(50.0));
        drop(refresher);
    }

    #[test]
    fn a_fixed_rate_is_not_refreshed() {
        let fixed = ReadRule {
            fixed: Some(5.0),
            ..ReadRule::default()
        };
        let started = Refresher::start(
            Arc::new(FakeTable::numbered(1)),
            &fixed,
            Arc::new(ReadLimiter::new(Some(5.0))),
            RetryPolicy::default(),
            Cancel::never(),
            Arc::new(NoObserver),
        );
        assert!(started.is_none());
    }
}
