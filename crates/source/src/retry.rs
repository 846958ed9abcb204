//! The one retry layer: every request goes through [`RetryPolicy::run`] (or
//! [`run_capped`](RetryPolicy::run_capped)), and every other retried call (a keyed sink's
//! transaction) through the loop under both, [`RetryPolicy::retry`].
//!
//! # Backoff (docs/errors.md §9.2)
//! `delay(n) = jitter(max(1 ms, min(initial × 2^min(n, 20), max(max_backoff, 1))))`, where
//! `jitter` multiplies by a uniform factor in [0.5, 1.5). So the delay is never zero and may
//! exceed `max_backoff_ms` by up to half.
//!
//! # Budget (docs/errors.md §9.3)
//! Attempt `n` starts at 0. A throttle or a transient with `n < max_retries` waits `delay(n)`
//! and tries again; throttles and transients share the budget, so at most `max_retries + 1`
//! attempts are made. Every attempt is bounded by `attempt_timeout`; running out of it is a
//! transient failure. Waits end at once when the run is cancelled.
//!
//! # The loop (`retry`)
//! 1. Before each attempt and while it runs, a cancelled run ends the call ([`GaveUp::Cancelled`]).
//! 2. A failure the caller calls retryable, with `n < max_retries`, waits `min(delay(n), cap)`
//!    (the caller is told first, to log it) and tries again; any other failure ends the call
//!    with that error and the number of attempts made ([`GaveUp::Failed`]).
//! 3. `retry` bounds no attempt: `run` adds the `attempt_timeout` and the observer.
//!
//! # Logging retries (docs/errors.md §9.7)
//! Every retry is logged at `debug`. At `info`, an operation's retries are logged at most once
//! a minute ([`RETRY_NOTE_INTERVAL`]): the first retry of an operation at once, then the first
//! one a minute or more after that line, with the retries since the last line and the last
//! cause ([`RetryNotes`], one per process: [`note_retry`]). A throttled table or a flaky
//! network shows in the log without a line per request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{ApiError, ErrorClass, ReadError};

/// Retry settings, validated (docs/config.md §1.2 `retry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Base of the exponential backoff.
    pub initial_backoff: Duration,
    /// Cap of the backoff before jitter.
    pub max_backoff: Duration,
    /// Bound of one attempt.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(10_000),
            attempt_timeout: Duration::from_millis(30_000),
        }
    }
}

/// Something that is told about each attempt's outcome (metrics, the read limiter).
pub trait AttemptObserver: Send + Sync {
    /// Called after each attempt with its outcome class (`None` = success).
    fn attempt(&self, operation: &'static str, outcome: Option<ErrorClass>);
}

/// An observer that ignores everything.
pub struct NoObserver;

impl AttemptObserver for NoObserver {
    fn attempt(&self, _operation: &'static str, _outcome: Option<ErrorClass>) {}
}

/// A signal that the run is stopping: waits and attempts end as soon as it is set.
/// `None` never fires.
#[derive(Debug, Clone)]
pub struct Cancel(Option<watch::Receiver<bool>>);

/// The sending side of [`Cancel`].
#[derive(Debug)]
pub struct CancelHandle(watch::Sender<bool>);

impl Cancel {
    /// A new cancellation pair, not cancelled.
    pub fn new() -> (CancelHandle, Cancel) {
        let (tx, rx) = watch::channel(false);
        (CancelHandle(tx), Cancel(Some(rx)))
    }

    /// A signal that never fires.
    pub fn never() -> Cancel {
        Cancel(None)
    }

    /// Whether the run is stopping.
    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Resolves once the run is stopping.
    pub async fn cancelled(&self) {
        let Some(rx) = &self.0 else {
            return std::future::pending().await;
        };
        let mut rx = rx.clone();
        // An error means the handle is gone without cancelling: then we never resolve.
        if rx.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl CancelHandle {
    /// Stops the run: every wait and in-flight attempt ends.
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }
}

/// How a retried call ended without a value.
#[derive(Debug)]
pub enum GaveUp<E> {
    /// The run was cancelled (rule 1).
    Cancelled,
    /// The last attempt's error: definite, or the budget was spent (rule 2).
    Failed {
        /// The last attempt's error.
        error: E,
        /// The attempts made, the last included.
        attempts: u32,
    },
}

impl RetryPolicy {
    /// The backoff before retry `n` (0-based), with jitter (docs/errors.md §9.2).
    pub fn delay(&self, n: u32) -> Duration {
        let factor: f64 = rand::rng().random_range(0.5..1.5);
        self.delay_with_factor(n, factor)
    }

    /// [`delay`](Self::delay) with a given jitter factor in [0.5, 1.5).
    pub fn delay_with_factor(&self, n: u32, factor: f64) -> Duration {
        let initial = self.initial_backoff.as_millis().min(u128::from(u64::MAX)) as u64;
        let cap = (self.max_backoff.as_millis().min(u128::from(u64::MAX)) as u64).max(1);
        let exp = initial.saturating_mul(1u64 << n.min(20));
        let base = exp.min(cap).max(1);
        Duration::from_secs_f64(base as f64 * factor / 1000.0).max(Duration::from_millis(1))
    }

    /// Runs `attempt` until it succeeds, fails definitely, or the budget is spent.
    ///
    /// `what` names the call and its object for the final error ("scan of 'orders'").
    pub async fn run<T, F, Fut>(
        &self,
        operation: &'static str,
        what: impl Fn() -> String,
        cancel: &Cancel,
        observer: &dyn AttemptObserver,
        attempt: F,
    ) -> Result<T, ReadError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        self.run_capped(Duration::MAX, operation, what, cancel, observer, attempt)
            .await
    }

    /// [`run`](Self::run) with every wait at most `cap` (the `min(delay(n), 10 s)` of a
    /// stream read, docs/streams.md §4.8).
    pub async fn run_capped<T, F, Fut>(
        &self,
        cap: Duration,
        operation: &'static str,
        what: impl Fn() -> String,
        cancel: &Cancel,
        observer: &dyn AttemptObserver,
        mut attempt: F,
    ) -> Result<T, ReadError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let bounded = |n| {
            let attempt = tokio::time::timeout(self.attempt_timeout, attempt(n));
            async move {
                let error = match attempt.await {
                    Ok(Ok(value)) => {
                        observer.attempt(operation, None);
                        crate::health::request_answered(operation);
                        return Ok(value);
                    }
                    Ok(Err(error)) => error,
                    Err(_elapsed) => ApiError::transport(format!(
                        "attempt timed out after {} ms",
                        self.attempt_timeout.as_millis()
                    )),
                };
                observer.attempt(operation, Some(error.class));
                Err(error)
            }
        };
        let retryable =
            |error: &ApiError| matches!(error.class, ErrorClass::Throttle | ErrorClass::Transient);
        let retrying = |n: u32, error: &ApiError, delay: Duration| {
            tracing::debug!(operation, attempt = n, delay_ms = delay.as_millis() as u64, error = %error, "Request failed; retrying.");
            note_retry(operation, error);
        };
        self.retry(cap, cancel, retryable, retrying, bounded)
            .await
            .map_err(|gave_up| match gave_up {
                GaveUp::Cancelled => ReadError::Cancelled,
                GaveUp::Failed { error, attempts } => ReadError::Request {
                    what: what(),
                    attempts,
                    error,
                },
            })
    }

    /// The loop under [`run`](Self::run), for any error type (see the module docs, "The
    /// loop"): `retryable` classifies a failure, `retrying(n, error, delay)` is told before
    /// each wait.
    pub async fn retry<T, E, F, Fut>(
        &self,
        cap: Duration,
        cancel: &Cancel,
        retryable: impl Fn(&E) -> bool,
        retrying: impl Fn(u32, &E, Duration),
        mut attempt: F,
    ) -> Result<T, GaveUp<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut n = 0u32;
        loop {
            if cancel.is_cancelled() {
                return Err(GaveUp::Cancelled);
            }
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(GaveUp::Cancelled),
                outcome = attempt(n) => outcome,
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if !retryable(&error) || n >= self.max_retries {
                return Err(GaveUp::Failed {
                    error,
                    attempts: n + 1,
                });
            }
            let delay = self.delay(n).min(cap);
            retrying(n, &error, delay);
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(GaveUp::Cancelled),
                () = tokio::time::sleep(delay) => {}
            }
            n += 1;
        }
    }
}

/// Attempts of a request that makes no connection before a client's first answer
/// (docs/errors.md §9.6): an endpoint that takes none is wrong far more often than passing.
const FIRST_CONTACT_ATTEMPTS: u32 = 3;

/// docs/errors.md §9.6 for a client (the run's first `DescribeTable`, a sink's S3, its
/// catalog): until one of its requests reached the service, a request that makes no
/// connection ends after `FIRST_CONTACT_ATTEMPTS` (3); once one did, such a failure is retried
/// by the whole budget. Clones share what they saw.
#[derive(Debug, Clone, Default)]
pub struct FirstContact(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl FirstContact {
    /// [`RetryPolicy::run`] for a request of this client (`operation`, on `what`), each
    /// attempt [`judged`](Self::judged) and told to `observer` (a sink's: `RequestMetrics`,
    /// so that `ddbpipe_requests_total` counts it as every request); never cancelled (a sink
    /// finishes what it holds on a stop). On the heap: an SDK request's future is kilobytes,
    /// and a sink's write holds several.
    pub async fn run<T, F, Fut>(
        &self,
        (retry, observer): (&RetryPolicy, &dyn AttemptObserver),
        operation: &'static str,
        what: impl Fn() -> String,
        mut attempt: F,
    ) -> Result<T, ReadError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let judged = |n| {
            let attempt = attempt(n);
            async move { self.judged(n, attempt.await) }
        };
        let never = Cancel::never();
        Box::pin(retry.run(operation, what, &never, observer, judged)).await
    }

    /// Attempt `n`'s `outcome`, noted, its failure made final when rule §9.6 says.
    pub fn judged<T>(&self, n: u32, outcome: Result<T, ApiError>) -> Result<T, ApiError> {
        use std::sync::atomic::Ordering;
        let reached = match &outcome {
            Ok(_) => true,
            Err(error) => error.contact == crate::error::Contact::Made,
        };
        if reached {
            self.0.store(true, Ordering::Relaxed);
            return outcome;
        }
        outcome.map_err(|error| {
            let first = !self.0.load(Ordering::Relaxed);
            match first && n + 1 >= FIRST_CONTACT_ATTEMPTS {
                true => error.final_if_not_reached(),
                false => error,
            }
        })
    }
}

/// The least time between two `info` lines about one operation's retries.
pub const RETRY_NOTE_INTERVAL: Duration = Duration::from_secs(60);

/// Which retries are logged at `info` (module docs, "Logging retries"): per operation, the
/// retries since its last line and when that line was written.
#[derive(Debug, Default)]
pub struct RetryNotes {
    operations: HashMap<&'static str, Noted>,
}

#[derive(Debug)]
struct Noted {
    /// When the last `info` line about the operation was written.
    at: Instant,
    /// Retries since that line, not yet in a line.
    since: u64,
}

impl RetryNotes {
    /// A retry of `operation` at `now`: `Some(n)` when an `info` line is due now, `n` being
    /// the retries it reports (this one and those since the last line); `None` otherwise.
    pub fn retried(&mut self, operation: &'static str, now: Instant) -> Option<u64> {
        match self.operations.get_mut(operation) {
            None => {
                self.operations
                    .insert(operation, Noted { at: now, since: 0 });
                Some(1)
            }
            Some(noted) if now.saturating_duration_since(noted.at) >= RETRY_NOTE_INTERVAL => {
                let retries = noted.since + 1;
                *noted = Noted { at: now, since: 0 };
                Some(retries)
            }
            Some(noted) => {
                noted.since += 1;
                None
            }
        }
    }
}

/// This process's [`RetryNotes`].
static NOTES: Mutex<Option<RetryNotes>> = Mutex::new(None);

/// Tells the log that `operation` is retried after `error` (module docs, "Logging retries"):
/// an `info` line at most once a minute per operation, with the retries since the last one
/// and this last cause.
pub fn note_retry(operation: &'static str, error: &dyn std::fmt::Display) {
    let due = {
        let mut notes = NOTES.lock().unwrap_or_else(|e| e.into_inner());
        notes
            .get_or_insert_with(RetryNotes::default)
            .retried(operation, Instant::now())
    };
    if let Some(retries) = due {
        tracing::info!(
            operation,
            retries,
            error = %error,
            "Retrying after transient failures ({retries} since the last such line); the last cause is given."
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn policy(max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn delays_follow_the_pinned_bounds() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_with_factor(0, 0.5), Duration::from_millis(50));
        assert!(p.delay_with_factor(0, 1.4999) < Duration::from_millis(150));
        let capped = RetryPolicy {
            max_backoff: Duration::from_millis(400),
            ..p
        };
        assert_eq!(capped.delay_with_factor(9, 0.5), Duration::from_millis(200));
        assert!(capped.delay_with_factor(9, 1.4999) < Duration::from_millis(600));
        // Huge exponents saturate instead of overflowing, and zero bases still wait 1 ms.
        assert_eq!(
            capped.delay_with_factor(u32::MAX, 1.0),
            Duration::from_millis(400)
        );
        let zero = RetryPolicy {
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            ..p
        };
        assert!(zero.delay_with_factor(3, 0.5) >= Duration::from_micros(500));
        for n in 0..30 {
            let d = capped.delay(n);
            assert!(
                d > Duration::ZERO && d < Duration::from_millis(600),
                "{d:?}"
            );
        }
    }

    async fn scripted(
        policy: RetryPolicy,
        script: Vec<Result<u32, ApiError>>,
    ) -> (Result<u32, ReadError>, u32) {
        let calls = AtomicU32::new(0);
        let result = policy
            .run(
                "scan",
                || "scan of 't'".to_string(),
                &Cancel::never(),
                &NoObserver,
                |_| {
                    let i = calls.fetch_add(1, Ordering::SeqCst) as usize;
                    let step = script.get(i).cloned().unwrap_or(Ok(99));
                    async move { step }
                },
            )
            .await;
        (result, calls.load(Ordering::SeqCst))
    }

    fn throttle() -> ApiError {
        ApiError::from_code(
            Some("ProvisionedThroughputExceededException".into()),
            "slow down",
        )
    }

    #[tokio::test(start_paused = true)]
    async fn two_throttles_then_success_take_three_calls() {
        let (result, calls) =
            scripted(policy(8), vec![Err(throttle()), Err(throttle()), Ok(7)]).await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_error_is_not_retried() {
        let fatal = ApiError::from_code(Some("ValidationException".into()), "bad");
        let (result, calls) = scripted(policy(8), vec![Err(fatal)]).await;
        assert_eq!(calls, 1);
        assert_eq!(
            result.unwrap_err().to_string(),
            "scan of 't' failed after 1 attempt(s): ValidationException: bad"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn transients_share_the_budget_with_throttles() {
        let transient = ApiError::from_code(Some("InternalServerError".into()), "oops");
        let script = vec![Err(throttle()), Err(transient.clone()), Err(transient)];
        let (result, calls) = scripted(policy(2), script).await;
        assert_eq!(calls, 3);
        assert!(
            result
                .unwrap_err()
                .to_string()
                .contains("failed after 3 attempt(s)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_hangs_times_out_and_is_retried() {
        let p = RetryPolicy {
            attempt_timeout: Duration::from_millis(1000),
            ..policy(1)
        };
        let calls = AtomicU32::new(0);
        let result = p
            .run(
                "scan",
                || "scan of 't'".into(),
                &Cancel::never(),
                &NoObserver,
                |_| {
                    let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
                    async move {
                        if first {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, ApiError>(5)
                    }
                },
            )
            .await;
        assert_eq!(result.unwrap(), 5);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_interrupts_a_backoff_wait() {
        let (handle, cancel) = Cancel::new();
        let p = RetryPolicy {
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
            ..policy(5)
        };
        let task = tokio::spawn(async move {
            p.run(
                "scan",
                || "scan".into(),
                &cancel,
                &NoObserver,
                |_| async { Err::<u32, _>(ApiError::transport("down")) },
            )
            .await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        handle.cancel();
        let result = task.await.unwrap();
        assert!(matches!(result, Err(ReadError::Cancelled)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_retries_any_error_type_and_caps_every_wait() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
            ..policy(5)
        };
        let calls = AtomicU32::new(0);
        let waits = std::sync::Mutex::new(Vec::new());
        let started = tokio::time::Instant::now();
        let result = p
            .retry(
                Duration::from_secs(10),
                &Cancel::never(),
                |error: &&str| *error == "busy",
                |n, _, delay| waits.lock().unwrap().push((n, delay)),
                |_| {
                    let i = calls.fetch_add(1, Ordering::SeqCst);
                    async move { if i < 2 { Err("busy") } else { Ok(i) } }
                },
            )
            .await;
        assert_eq!(result.unwrap(), 2);
        let waits = waits.into_inner().unwrap();
        assert_eq!(waits.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 1]);
        assert!(waits.iter().all(|(_, d)| *d == Duration::from_secs(10)));
        assert_eq!(started.elapsed(), Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_ends_on_a_definite_failure_with_the_attempts_made() {
        let result = policy(5)
            .retry(
                Duration::MAX,
                &Cancel::never(),
                |error: &&str| *error == "busy",
                |_, _, _| {},
                |n| async move { Err::<(), _>(if n == 0 { "busy" } else { "broken" }) },
            )
            .await;
        assert!(matches!(
            result,
            Err(GaveUp::Failed {
                error: "broken",
                attempts: 2
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_noted_at_info_once_a_minute_per_operation() {
        let mut notes = RetryNotes::default();
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(notes.retried("scan", at(0)), Some(1));
        assert_eq!(notes.retried("scan", at(1)), None);
        // Another operation has its own minute.
        assert_eq!(notes.retried("get_records", at(1)), Some(1));
        assert_eq!(notes.retried("scan", at(59)), None);
        // The line a minute on counts the retries since the last one, this one included.
        assert_eq!(notes.retried("scan", at(60)), Some(3));
        assert_eq!(notes.retried("scan", at(61)), None);
        assert_eq!(notes.retried("get_records", at(30)), None);
        assert_eq!(notes.retried("get_records", at(61)), Some(2));
    }

    #[test]
    fn codes_are_classified_like_the_reference() {
        assert_eq!(ErrorClass::of_code(None), ErrorClass::Transient);
        assert_eq!(
            ErrorClass::of_code(Some("ThrottlingException")),
            ErrorClass::Throttle
        );
        assert_eq!(
            ErrorClass::of_code(Some("LimitExceededException")),
            ErrorClass::Throttle
        );
        assert_eq!(
            ErrorClass::of_code(Some("ServiceUnavailable")),
            ErrorClass::Transient
        );
        assert_eq!(
            ErrorClass::of_code(Some("ResourceNotFoundException")),
            ErrorClass::Fatal
        );
        assert_eq!(
            ErrorClass::of_code(Some("AccessDeniedException")),
            ErrorClass::Fatal
        );
    }
}
