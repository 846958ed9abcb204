//! The read-capacity governor: a token bucket debited by the capacity DynamoDB reports.
//!
//! # Rules (docs/scan.md §2.7)
//! 1. The effective rate `r` (units/s) is the configured one; a throttle halves it (floor
//!    1 unit/s, or the configured rate when that is lower) and every 10 s without a throttle
//!    restores 10 % of the configured rate.
//! 2. The bucket holds at most `b = max(r, 1)` units and starts full.
//! 3. Before a request the reader waits until the bucket holds `min(estimate, b)` and deducts
//!    `estimate`: the mean consumed capacity of the last 8 responses (1 before any).
//! 4. On the response the bucket is credited `estimate − actual`; it may go negative.
//! 5. Until the first response arrives only one request is in flight.
//! 6. No rate is below [`MIN_READ_RATE`] or above [`MAX_READ_RATE`] (a computed rate is
//!    clamped; config validation refuses a configured one), and one wait is at most
//!    [`MAX_WAIT`]: the bucket is re-checked after it, so no arithmetic on a rate can overflow
//!    or panic.
//!
//! Without a configured rate the limiter only counts units.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::events::ReadRateSet;

/// Responses the estimate averages over.
const ESTIMATE_WINDOW: usize = 8;
/// Quiet time after which 10 % of the configured rate comes back.
const RECOVERY_STEP: Duration = Duration::from_secs(10);
/// The least read rate, units/s (rule 6): one request of one unit every 100 s.
pub const MIN_READ_RATE: f64 = 0.01;
/// The greatest read rate, units/s (rule 6); far above any table's limit.
pub const MAX_READ_RATE: f64 = 1e9;
/// The longest single wait for tokens (rule 6).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// `rate` within the bounds of rule 6 (`NaN` is the least rate).
pub fn clamp_rate(rate: f64) -> f64 {
    if rate.is_nan() {
        MIN_READ_RATE
    } else {
        rate.clamp(MIN_READ_RATE, MAX_READ_RATE)
    }
}

/// How long to wait for `missing` units at `rate` units/s: at most [`MAX_WAIT`], at least 1 ms
/// (nothing missing, or a `missing` that is no number, waits the least).
fn wait_for(missing: f64, rate: f64) -> Duration {
    let seconds = missing / clamp_rate(rate);
    if seconds.is_nan() || seconds <= 0.0 {
        return Duration::from_millis(1);
    }
    Duration::try_from_secs_f64(seconds)
        .unwrap_or(MAX_WAIT)
        .clamp(Duration::from_millis(1), MAX_WAIT)
}

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

/// The requests reading DynamoDB at once in one process (`source.read_concurrency`), shared by
/// every table of a file (its tables' configurations are clones of one): a slot is taken for
/// each Scan, Query or GetRecords request and given back when it is answered, first come first
/// served (tokio's semaphore queues its waiters fairly), so a busy table's many readers cannot
/// starve a quiet table's one (docs/config.md §1.5 rule 4). Each table's own
/// `max_concurrency` and `shard_concurrency` bound it below that.
#[derive(Clone)]
pub struct ReadSlots {
    slots: Arc<Semaphore>,
    size: usize,
}

impl ReadSlots {
    /// `size` slots (at least one is made: 0 is refused by the config's rules).
    pub fn new(size: usize) -> Self {
        ReadSlots {
            slots: Arc::new(Semaphore::new(size.max(1))),
            size,
        }
    }

    /// The slots, as configured.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for a slot: held until the permit is dropped.
    pub async fn take(&self) -> Option<SemaphorePermit<'_>> {
        // The semaphore is never closed.
        self.slots.acquire().await.ok()
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

/// `read_concurrency` when the file gives none.
pub const DEFAULT_READ_SLOTS: usize = 64;

/// A run's own slots, [`DEFAULT_READ_SLOTS`] of them.
impl Default for ReadSlots {
    fn default() -> Self {
        ReadSlots::new(DEFAULT_READ_SLOTS)
    }
}

impl std::fmt::Debug for ReadSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadSlots({})", self.size)
    }
}

// Two configurations are equal when their numbers are: which semaphore a clone shares is not
// part of what the file says.
impl PartialEq for ReadSlots {
    fn eq(&self, other: &Self) -> bool {
        self.size == other.size
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
        let rate = rate.map(clamp_rate);
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
        let rate = clamp_rate(rate);
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
                    wait_for(need - b.tokens, b.rate)
                };
                tokio::time::sleep(wait).await;
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
        // DynamoDB reports a small finite number; anything else is charged like a missing one.
        let actual = consumed
            .filter(|units| units.is_finite())
            .unwrap_or(1.0)
            .clamp(0.0, MAX_READ_RATE);
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
            // Floor 1 unit/s, but never above the configured rate: a throttle must not raise
            // a limit set below 1 unit/s.
            b.rate = (b.rate / 2.0).max(1.0).min(b.configured);
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
    use proptest::prelude::*;

    /// `ReadSlots`: a parallel scan of 8 segments at `max_concurrency` 8 has at most as many
    /// pages requested at once as the process has slots, and reads every item; with the
    /// default slots the segments overlap as before (the fake can tell).
    #[tokio::test(start_paused = true)]
    async fn a_scan_holds_no_more_requests_than_the_process_has_slots() {
        use crate::api::Render;
        use crate::fake::FakeTable;
        use crate::retry::{Cancel, NoObserver, RetryPolicy};
        use crate::scan::{SegmentReader, read_template};
        use crate::segments::SegmentRanges;
        let peak = |slots: ReadSlots| async move {
            let table = Arc::new(FakeTable::numbered(80).slow(Duration::from_millis(50)));
            let reader = SegmentReader {
                api: Arc::clone(&table),
                template: crate::api::ReadRequest {
                    limit: Some(5),
                    ..read_template(&crate::config::SourceConfig::new("t"))
                },
                total_segments: 8,
                max_concurrency: 8,
                limiter: Arc::new(ReadLimiter::new(None)),
                retry: RetryPolicy::default(),
                render: Render::items(ddbpipe_value::ValueFormat::Plain),
                observer: Arc::new(NoObserver),
                slots: slots.clone(),
            };
            let (tx, mut rx) = tokio::sync::mpsc::channel(64);
            let (_handle, cancel) = Cancel::new();
            let reading = tokio::spawn(async move {
                reader
                    .run(&SegmentRanges::default(), Default::default(), tx, cancel)
                    .await
            });
            let mut items = 0;
            while let Some(page) = rx.recv().await {
                items += page.records.len();
            }
            reading.await.unwrap().unwrap();
            assert_eq!(items, 80);
            assert_eq!(slots.free(), slots.size(), "every slot given back");
            table.peak()
        };
        assert_eq!(peak(ReadSlots::new(2)).await, 2);
        assert_eq!(peak(ReadSlots::new(1)).await, 1);
        assert_eq!(peak(ReadSlots::default()).await, 8);
    }

    /// Any f64 a config value or a response could bring, extremes first.
    fn any_rate() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-1.0),
            Just(1e-320),
            Just(f64::MIN_POSITIVE),
            Just(1e-300),
            Just(f64::MAX),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::NAN),
            any::<f64>(),
            0.0..1e6f64,
        ]
    }

    proptest! {
        #[test]
        fn a_wait_is_always_between_a_millisecond_and_max_wait(missing in any_rate(), rate in any_rate()) {
            let wait = wait_for(missing, rate);
            prop_assert!(wait >= Duration::from_millis(1) && wait <= MAX_WAIT, "{wait:?}");
            // The wait is the time the missing units take at the rate, within the bounds.
            let seconds = missing / clamp_rate(rate);
            let expected = if seconds.is_nan() || seconds <= 0.001 {
                0.001
            } else {
                seconds.min(MAX_WAIT.as_secs_f64())
            };
            prop_assert!((wait.as_secs_f64() - expected).abs() <= 1e-6 * expected.max(1.0), "{missing} at {rate}: {wait:?}, expected {expected}");
        }

        #[test]
        fn the_governor_never_panics_and_always_grants_whatever_the_rates_and_answers(
            rate in any_rate(),
            refreshed in any_rate(),
            // What a page can consume (a 1 MB strongly consistent page is 256 units), and
            // answers without, or with a nonsense, consumed capacity.
            consumed in proptest::collection::vec(
                proptest::option::of(prop_oneof![0.0..300.0f64, Just(f64::NAN), Just(-5.0)]),
                1..6,
            ),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let limiter = ReadLimiter::new(Some(rate));
                for (i, units) in consumed.iter().enumerate() {
                    if i == 2 {
                        limiter.set_configured_rate(refreshed);
                        limiter.throttled();
                    }
                    // At the least rate, 300 units take 30 000 s.
                    let granted = tokio::time::timeout(
                        Duration::from_secs(40_000),
                        limiter.acquire(),
                    )
                    .await;
                    let Ok(grant) = granted else {
                        panic!("no grant within 40 000 s at rate {rate}");
                    };
                    limiter.settle(grant, *units);
                }
                let rate = limiter.rate().expect("limited");
                assert!((MIN_READ_RATE..=MAX_READ_RATE).contains(&rate), "{rate}");
            });
        }
    }

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
    async fn a_throttle_never_raises_a_rate_configured_below_one_unit() {
        let limiter = ReadLimiter::new(Some(0.5));
        limiter.throttled();
        assert_eq!(limiter.rate(), Some(0.5));
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
