//! The read-capacity governor: a token bucket debited by the capacity DynamoDB reports.
//!
//! # Rules (SPEC §2.7)
//! 1. The effective rate `r` (units/s) is the configured one; a throttle halves it (floor
//!    1 unit/s) and every 10 s without a throttle restores 10 % of the configured rate.
//! 2. The bucket holds at most `b = max(r, 1)` units and starts full.
//! 3. Before a request the reader waits until the bucket holds `min(estimate, b)` and deducts
//!    `estimate`: the mean consumed capacity of the last 8 responses (1 before any).
//! 4. On the response the bucket is credited `estimate − actual`; it may go negative.
//! 5. Until the first response arrives only one request is in flight.
//!
//! Without a configured rate the limiter only counts units.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::events::ReadRateSet;

/// Responses the estimate averages over.
const ESTIMATE_WINDOW: usize = 8;
/// Quiet time after which 10 % of the configured rate comes back.
const RECOVERY_STEP: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Bucket {
    configured: f64,
    rate: f64,
    tokens: f64,
    refilled_at: Instant,
    recovered_at: Instant,
}

impl Bucket {
    fn capacity(&self) -> f64 {
        self.rate.max(1.0)
    }

    /// Adds what the elapsed time earned and any rate recovery that is due.
    fn advance(&mut self, now: Instant) {
        while now.duration_since(self.recovered_at) >= RECOVERY_STEP && self.rate < self.configured
        {
            self.rate = (self.rate + 0.1 * self.configured).min(self.configured);
            self.recovered_at += RECOVERY_STEP;
        }
        if self.rate >= self.configured {
            self.recovered_at = now;
        }
        let earned = now.duration_since(self.refilled_at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.capacity());
        self.refilled_at = now;
    }
}

#[derive(Debug, Default)]
struct Recent {
    actuals: VecDeque<f64>,
}

impl Recent {
    fn estimate(&self) -> f64 {
        if self.actuals.is_empty() {
            1.0
        } else {
            self.actuals.iter().sum::<f64>() / self.actuals.len() as f64
        }
    }
}

/// Shared by every reader of a run.
#[derive(Debug)]
pub struct ReadLimiter {
    bucket: Option<Mutex<Bucket>>,
    recent: Mutex<Recent>,
    first: Semaphore,
    answered: AtomicBool,
    warned_missing: AtomicBool,
    total: Mutex<f64>,
}

/// A granted request: settle it with what the response consumed.
#[derive(Debug)]
pub struct Grant<'a> {
    estimate: f64,
    _first: Option<SemaphorePermit<'a>>,
}

impl ReadLimiter {
    /// A limiter with `rate` units per second; `None` = unlimited (only counts).
    pub fn new(rate: Option<f64>) -> Self {
        let now = Instant::now();
        ReadRateSet {
            units_per_second: rate,
        }
        .emit();
        ReadLimiter {
            bucket: rate.map(|rate| {
                Mutex::new(Bucket {
                    configured: rate,
                    rate,
                    tokens: rate.max(1.0),
                    refilled_at: now,
                    recovered_at: now,
                })
            }),
            recent: Mutex::new(Recent::default()),
            first: Semaphore::new(1),
            answered: AtomicBool::new(false),
            warned_missing: AtomicBool::new(false),
            total: Mutex::new(0.0),
        }
    }

    /// The effective rate now, if limited.
    pub fn rate(&self) -> Option<f64> {
        self.bucket
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(|e| e.into_inner()).rate)
    }

    /// Replaces the configured rate (the base was re-read); the effective rate follows.
    pub fn set_configured_rate(&self, rate: f64) {
        if let Some(bucket) = &self.bucket {
            let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
            b.advance(Instant::now());
            let ratio = if b.configured > 0.0 {
                b.rate / b.configured
            } else {
                1.0
            };
            b.configured = rate;
            b.rate = (rate * ratio).max(1.0).min(rate.max(1.0));
        }
    }

    /// Capacity units consumed so far by this run.
    pub fn total_units(&self) -> f64 {
        *self.total.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a request may go, and deducts its estimate.
    pub async fn acquire(&self) -> Grant<'_> {
        let first = if self.answered.load(Ordering::Acquire) {
            None
        } else {
            // Only one request until the first response: its cost is unknown.
            match self.first.acquire().await {
                Ok(permit) if !self.answered.load(Ordering::Acquire) => Some(permit),
                _ => None,
            }
        };
        let estimate = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .estimate();
        if let Some(bucket) = &self.bucket {
            loop {
                let wait = {
                    let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
                    b.advance(Instant::now());
                    let need = estimate.min(b.capacity());
                    if b.tokens >= need {
                        b.tokens -= estimate;
                        break;
                    }
                    Duration::from_secs_f64((need - b.tokens) / b.rate)
                };
                tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            }
        }
        Grant {
            estimate,
            _first: first,
        }
    }

    /// Settles a granted request with what the response consumed (`None`: not reported,
    /// charged 1 unit). Returns `true` the first time a response lacked consumed capacity.
    pub fn settle(&self, grant: Grant<'_>, consumed: Option<f64>) -> bool {
        let actual = consumed.unwrap_or(1.0).max(0.0);
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.actuals.push_back(actual);
            if recent.actuals.len() > ESTIMATE_WINDOW {
                recent.actuals.pop_front();
            }
        }
        *self.total.lock().unwrap_or_else(|e| e.into_inner()) += actual;
        self.credit(grant.estimate - actual);
        if !self.answered.swap(true, Ordering::AcqRel) {
            self.first.add_permits(Semaphore::MAX_PERMITS / 2);
        }
        consumed.is_none() && !self.warned_missing.swap(true, Ordering::AcqRel)
    }

    /// Returns a grant whose request failed: nothing was consumed.
    pub fn refund(&self, grant: Grant<'_>) {
        self.credit(grant.estimate);
    }

    fn credit(&self, units: f64) {
        if let Some(bucket) = &self.bucket {
            let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
            b.advance(Instant::now());
            b.tokens = (b.tokens + units).min(b.capacity());
        }
    }

    /// A request was throttled: halve the effective rate (floor 1 unit/s).
    pub fn throttled(&self) {
        if let Some(bucket) = &self.bucket {
            let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            b.advance(now);
            b.rate = (b.rate / 2.0).max(1.0);
            b.tokens = b.tokens.min(b.capacity());
            b.recovered_at = now;
            ReadRateSet {
                units_per_second: Some(b.rate),
            }
            .emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn thirty_pages_of_ten_units_at_twenty_per_second_take_at_least_14_seconds() {
        let limiter = ReadLimiter::new(Some(20.0));
        let start = Instant::now();
        for _ in 0..30 {
            let grant = limiter.acquire().await;
            limiter.settle(grant, Some(10.0));
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_secs(14), "{took:?}");
        assert!(took <= Duration::from_secs(16), "{took:?}");
        assert_eq!(limiter.total_units(), 300.0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_limiter_never_waits_and_counts_units() {
        let limiter = ReadLimiter::new(None);
        let start = Instant::now();
        for _ in 0..100 {
            let grant = limiter.acquire().await;
            limiter.settle(grant, Some(50.0));
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(limiter.total_units(), 5000.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_halves_the_rate_and_quiet_time_restores_it() {
        let limiter = ReadLimiter::new(Some(100.0));
        limiter.throttled();
        assert_eq!(limiter.rate(), Some(50.0));
        limiter.throttled();
        assert_eq!(limiter.rate(), Some(25.0));
        tokio::time::sleep(Duration::from_secs(10)).await;
        let grant = limiter.acquire().await;
        limiter.settle(grant, Some(1.0));
        assert_eq!(limiter.rate(), Some(35.0));
        tokio::time::sleep(Duration::from_secs(100)).await;
        let grant = limiter.acquire().await;
        limiter.settle(grant, Some(1.0));
        assert_eq!(limiter.rate(), Some(100.0));
        for _ in 0..10 {
            limiter.throttled();
        }
        assert_eq!(limiter.rate(), Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_consumed_capacity_is_charged_one_unit_and_warned_once() {
        let limiter = ReadLimiter::new(None);
        let grant = limiter.acquire().await;
        assert!(limiter.settle(grant, None));
        let grant = limiter.acquire().await;
        assert!(!limiter.settle(grant, None));
        assert_eq!(limiter.total_units(), 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn only_one_request_is_in_flight_before_the_first_response() {
        let limiter = std::sync::Arc::new(ReadLimiter::new(None));
        let first = limiter.acquire().await;
        let second = {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let grant = limiter.acquire().await;
                limiter.settle(grant, Some(1.0));
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!second.is_finished());
        limiter.settle(first, Some(1.0));
        second.await.unwrap();
    }
}
