//! One shard's reads: iterator acquisition and renewal, `GetRecords` slices, `ShardEnd`.
//!
//! # One slice (docs/streams.md §4.9)
//! 1. Without an iterator, acquire one: after the last record **read** if any, else where the
//!    shard starts (§4.4); a `LATEST` shard that read nothing re-acquires at `TRIM_HORIZON`
//!    with its floor. No iterator in the answer → the shard is drained. Trimmed → a gap.
//! 2. Then, until the slice ends:
//!    - after 8 successful reads → yield (delay 0);
//!    - reads of one shard start at least 100 ms apart;
//!    - success: error counters reset; records converted in order (floor filter), handed
//!      over with the marks they reach; no next iterator → **drained** (the finish mark follows
//!      the last records); an empty answer → yield with the idle delay ([`idle_delay`]: the
//!      poll interval for the first two empty answers in a row, then twice as long after each
//!      further one, up to `max_idle_poll`; a shard just opened starts at the poll interval and
//!      any record brings it back there), and the second empty answer in a row means **caught
//!      up**;
//!    - `ExpiredIteratorException` → re-acquire (not a read, not an error); three in a row
//!      without a successful read fail the shard, counting only iterators used in the slice
//!      that obtained them: one kept across a yield (a throttle's, an idle shard's, or a turn
//!      behind many shards) may have waited out its 15 minutes, and is renewed uncounted;
//!    - trimmed / shard not found → a runtime gap (always fails the run);
//!    - throttle → yield with `min(delay(n), 10 s)`; never fails; a streak over 60 s warns;
//!    - transient → yield with `min(delay(n), 10 s)`; more than `max_retries` in a row fail;
//!    - anything else fails the shard.
//!
//! ```text
//!   no iterator ──acquire──► reading ──8 reads / empty / throttle / transient──► yielded
//!        ▲                     │  │                                               │
//!        └──expired────────────┘  └──no next iterator──► drained (ShardEnd)       │
//!        └───────────────────────────────────────────────────────────────────────┘
//! ```

use std::sync::Arc;
use std::time::Duration;

use ddbpipe_value::ValueFormat;
use tokio::time::Instant;

use super::gaps;
use super::handover::{Closed, Handed, Handover, StreamMark};
use super::start::FloorFilter;
use crate::api::{ChangeShape, Changes, StartAt, StreamsApi};
use crate::capacity::ReadSlots;
use crate::clock::unix_now_s;
use crate::error::{ApiError, ErrorClass, ReadError};
use crate::events::{PageRead, RecordKind};
use crate::ids::{SequenceNumber, ShardId};
use crate::records::Lines;
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};

/// Successful `GetRecords` per slice.
pub const READS_PER_SLICE: u32 = 8;
/// Least time between two `GetRecords` of one shard.
pub const READ_SPACING: Duration = Duration::from_millis(100);
/// Longest yield after a throttle or a transient error.
pub const MAX_YIELD: Duration = Duration::from_secs(10);
/// Expiries in a row without a successful read that fail the shard.
pub const EXPIRY_LIMIT: u32 = 3;
/// Throttling longer than this logs a warning (at most once a minute).
const THROTTLE_WARN_AFTER: Duration = Duration::from_secs(60);

/// The stream a run reads and how it asks: shared by one process's engine and by a worker's
/// leased shard reads (`super::leased`).
pub struct StreamReads<A> {
    /// The Streams API.
    pub api: Arc<A>,
    /// The stream being read.
    pub stream_arn: String,
    /// The configured table name (the envelope's `table`).
    pub table: String,
    /// Plain or typed values.
    pub format: ValueFormat,
    /// The one retry policy (GetShardIterator; GetRecords budgets).
    pub retry: RetryPolicy,
    /// `GetRecords` `Limit`.
    pub records_per_request: u32,
    /// The effective poll interval of caught-up shards (at least 200 ms).
    pub poll_interval: Duration,
    /// The longest wait between reads of a shard that keeps reading empty (at least
    /// `poll_interval`; [`idle_delay`]).
    pub max_idle_poll: Duration,
    /// Told about every attempt (metrics).
    pub observer: Arc<dyn AttemptObserver>,
    /// What a gap met while reading tells the user to do.
    pub gap_remedy: gaps::GapRemedy,
    /// The process's read slots: each `GetRecords` holds one (`source.read_concurrency`).
    pub slots: ReadSlots,
}

impl<A> Clone for StreamReads<A> {
    fn clone(&self) -> Self {
        StreamReads {
            api: Arc::clone(&self.api),
            stream_arn: self.stream_arn.clone(),
            table: self.table.clone(),
            format: self.format,
            retry: self.retry,
            records_per_request: self.records_per_request,
            poll_interval: self.poll_interval,
            max_idle_poll: self.max_idle_poll,
            observer: Arc::clone(&self.observer),
            gap_remedy: self.gap_remedy,
            slots: self.slots.clone(),
        }
    }
}

/// What every slice of a run shares.
pub struct StreamContext<A> {
    /// The stream and how it is asked.
    pub reads: StreamReads<A>,
    /// Where records go.
    pub handover: Arc<Handover>,
    /// Set when the run stops.
    pub cancel: Cancel,
}

/// Why reading a stream failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Definite: a shard was trimmed (or vanished) past the position being read.
    #[error("{0}")]
    Gap(String),
    /// Definite: a shard failed (retries spent, iterator keeps expiring, fatal error).
    #[error("{0}")]
    ShardFailed(String),
    /// Definite: a request of the run failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Definite: a record cannot become an envelope.
    #[error(transparent)]
    Envelope(#[from] crate::envelope::EnvelopeError),
    /// The run is stopping (signal, `max_messages`, the pipeline is gone).
    #[error("the stream read was stopped")]
    Stopped,
}

/// How a slice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceEnd {
    /// Requeue the shard, due after this delay.
    Yield(Duration),
    /// The shard's last record was handed over.
    Drained,
}

/// One shard's read state, carried from slice to slice.
#[derive(Debug)]
pub struct ShardState {
    /// The shard.
    pub id: ShardId,
    start: StartAt,
    iterator: Option<String>,
    last_read: Option<SequenceNumber>,
    floor: Option<FloorFilter>,
    handed_any: bool,
    empty_streak: u32,
    first_empty_at_s: Option<i64>,
    expiries: u32,
    /// Its iterator was kept across the end of a slice: it may have waited out its lifetime.
    held: bool,
    throttles: u32,
    transients: u32,
    throttled_since: Option<Instant>,
    throttle_warned_at: Option<Instant>,
    last_get: Option<Instant>,
    /// `ts_ms` of the newest record read (running lag).
    pub newest_ts_ms: Option<i64>,
    /// Two empty answers in a row: nothing more to read for now.
    pub caught_up: bool,
}

impl ShardState {
    /// A shard about to be read from `start`, with a `latest` floor while it reads nothing,
    /// and an iterator already acquired (by the start-up probe) if any.
    pub fn new(
        id: ShardId,
        start: StartAt,
        floor_ms: Option<i64>,
        iterator: Option<String>,
    ) -> Self {
        ShardState {
            id,
            start,
            iterator,
            last_read: None,
            floor: floor_ms.map(FloorFilter::new),
            handed_any: false,
            empty_streak: 0,
            first_empty_at_s: None,
            expiries: 0,
            held: false,
            throttles: 0,
            transients: 0,
            throttled_since: None,
            throttle_warned_at: None,
            last_get: None,
            newest_ts_ms: None,
            caught_up: false,
        }
    }
}

/// The wait after the `streak`-th empty answer in a row of a shard (module docs, step 2): the
/// poll interval for the first two, then doubled with each further one, at most
/// `max_idle_poll` (and never below the poll interval). An idle shard so costs one `GetRecords`
/// per `max_idle_poll` instead of one per poll interval.
pub fn idle_delay(poll_interval: Duration, max_idle_poll: Duration, streak: u32) -> Duration {
    let doublings = streak.saturating_sub(2).min(20);
    poll_interval
        .saturating_mul(1 << doublings)
        .min(max_idle_poll)
        .max(poll_interval)
}

fn capped(delay: Duration) -> Duration {
    delay.min(MAX_YIELD)
}

/// Sleeps until `at`, or returns `Stopped` when the run stops first.
async fn sleep_until(at: Instant, cancel: &Cancel) -> Result<(), StreamError> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(StreamError::Stopped),
        () = tokio::time::sleep_until(at) => Ok(()),
    }
}

fn closed(_: Closed) -> StreamError {
    StreamError::Stopped
}

fn is_gap_code(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("TrimmedDataAccessException" | "ResourceNotFoundException")
    )
}

/// The records of a page to hand over (the floor filter drops some), and the last
/// sequence number read, filtered or not.
fn keep(shard: &mut ShardState, changes: Changes) -> (Handed, Option<SequenceNumber>) {
    let Changes { envelopes, records } = changes;
    let mut kept = Vec::with_capacity(records.len());
    for record in &records {
        if let Some(ts) = record.created_ms {
            shard.newest_ts_ms = Some(shard.newest_ts_ms.map_or(ts, |n| n.max(ts)));
        }
        let keep = match &mut shard.floor {
            Some(floor) => floor.keep(record.created_ms),
            None => true,
        };
        kept.push(keep);
    }
    let last_seq = records.last().map(|record| record.sequence_number.clone());
    let mut handed = Handed {
        shard: Some(shard.id.clone()),
        ..Handed::default()
    };
    if kept.iter().all(|keep| *keep) {
        handed.records = envelopes;
    } else {
        handed.records = Lines::with_capacity(records.len(), envelopes.as_bytes().len());
        for (index, _) in kept.iter().enumerate().filter(|(_, keep)| **keep) {
            handed.records.extend_from(&envelopes, index, index + 1);
        }
    }
    for (record, keep) in records.into_iter().zip(kept) {
        if keep {
            if let Some(ms) = record.created_ms {
                let s = ms.div_euclid(1000);
                handed.created_s = Some(handed.created_s.map_or(s, |e| e.min(s)));
            }
            handed.seqs.push(record.sequence_number);
            handed.ops.push(record.op);
        }
    }
    (handed, last_seq)
}

impl<A: StreamsApi> StreamContext<A> {
    /// Runs one slice of `shard` (see the module docs).
    pub async fn slice(&self, shard: &mut ShardState) -> Result<SliceEnd, StreamError> {
        let mut reads = 0;
        shard.held = shard.iterator.is_some();
        loop {
            if self.cancel.is_cancelled() {
                return Err(StreamError::Stopped);
            }
            let Some(iterator) = shard.iterator.clone() else {
                match self.acquire(shard).await? {
                    Some(iterator) => {
                        shard.iterator = Some(iterator);
                        shard.held = false;
                        continue;
                    }
                    None => {
                        self.hand_drained(shard, Handed::default()).await?;
                        return Ok(SliceEnd::Drained);
                    }
                }
            };
            if reads == READS_PER_SLICE {
                return Ok(SliceEnd::Yield(Duration::ZERO));
            }
            if let Some(last) = shard.last_get {
                sleep_until(last + READ_SPACING, &self.cancel).await?;
            }
            shard.last_get = Some(Instant::now());
            crate::events::get_records_made();
            let shape = ChangeShape {
                shard: &shard.id,
                table: &self.reads.table,
                format: self.reads.format,
            };
            let slot = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(StreamError::Stopped),
                slot = self.reads.slots.take() => slot,
            };
            let answer = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(StreamError::Stopped),
                answer = tokio::time::timeout(
                    self.reads.retry.attempt_timeout,
                    self.reads.api.get_changes(&iterator, self.reads.records_per_request, &shape),
                ) => answer,
            };
            drop(slot);
            let answer = answer.unwrap_or_else(|_| {
                Err(ApiError::transport(format!(
                    "attempt timed out after {} ms",
                    self.reads.retry.attempt_timeout.as_millis()
                )))
            });
            let page = match answer {
                Ok(page) => {
                    self.reads.observer.attempt("get_records", None);
                    crate::health::request_answered("get_records");
                    page
                }
                Err(error) => {
                    self.reads
                        .observer
                        .attempt("get_records", Some(error.class));
                    match self.failed_read(shard, error)? {
                        Some(end) => return Ok(end),
                        None => continue,
                    }
                }
            };
            reads += 1;
            shard.expiries = 0;
            shard.throttles = 0;
            shard.transients = 0;
            shard.throttled_since = None;
            let changes = page.changes?;
            let empty = changes.records.is_empty();
            PageRead {
                kind: RecordKind::Change,
                records: changes.records.len(),
                capacity_units: None,
            }
            .emit();
            let (handed, last_seq) = keep(shard, changes);
            // The last record read, filtered or not: an expired iterator resumes after it.
            if last_seq.is_some() {
                shard.last_read = last_seq;
            }
            if !empty {
                shard.empty_streak = 0;
                shard.caught_up = false;
                shard.first_empty_at_s = None;
            }
            match page.next_iterator {
                None => {
                    self.hand_drained(shard, handed).await?;
                    return Ok(SliceEnd::Drained);
                }
                Some(next) => {
                    shard.iterator = Some(next);
                    shard.held = false;
                }
            }
            if !handed.seqs.is_empty() {
                shard.handed_any = true;
                let offered = handed.seqs.len();
                let accepted = self.handover.hand(handed).await.map_err(closed)?;
                if accepted < offered {
                    // The limit cut this page: what follows is read again by the next run.
                    return Err(StreamError::Stopped);
                }
            } else if !empty {
                // Every record was below the floor: a non-empty read all the same.
                self.handover.touch().await;
            }
            if empty {
                shard.empty_streak += 1;
                if shard.empty_streak == 1 {
                    shard.first_empty_at_s = Some(unix_now_s());
                } else {
                    shard.caught_up = true;
                    // Once per streak of empty reads, the first of the two says the shard held
                    // nothing more then: it refreshes a trim horizon's verification, and a
                    // positioned shard's `read_at` (a quiet shard keeps a repair window short).
                    if shard.empty_streak == 2
                        && let Some(at) = shard.first_empty_at_s
                    {
                        let mut marks = vec![StreamMark::ReadAt(shard.id.clone(), at)];
                        if !shard.handed_any {
                            marks.insert(0, StreamMark::Verify(shard.id.clone(), at));
                        }
                        let mark = Handed {
                            marks,
                            ..Handed::default()
                        };
                        self.handover.hand(mark).await.map_err(closed)?;
                    }
                }
                return Ok(SliceEnd::Yield(idle_delay(
                    self.reads.poll_interval,
                    self.reads.max_idle_poll,
                    shard.empty_streak,
                )));
            }
        }
    }

    /// Acquires an iterator (step 1). `None`: the shard has nothing more (drained).
    async fn acquire(&self, shard: &mut ShardState) -> Result<Option<String>, StreamError> {
        let start = match &shard.last_read {
            Some(seq) => StartAt::After(seq.clone()),
            None => shard.start.clone(),
        };
        let arn = self.reads.stream_arn.as_str();
        let id = shard.id.clone();
        let acquired = self
            .reads
            .retry
            .run(
                "get_shard_iterator",
                || format!("GetShardIterator for {id}"),
                &self.cancel,
                self.reads.observer.as_ref(),
                |_| self.reads.api.shard_iterator(arn, &id, &start),
            )
            .await;
        // A `LATEST` shard that read nothing comes back at TRIM_HORIZON, with its floor.
        if shard.start == StartAt::Latest {
            shard.start = StartAt::TrimHorizon;
        }
        match acquired {
            Ok(iterator) => Ok(iterator),
            Err(ReadError::Cancelled) => Err(StreamError::Stopped),
            Err(error) if is_gap_code(error.code()) => Err(StreamError::Gap(
                gaps::trimmed_while_reading(&shard.id, self.reads.gap_remedy),
            )),
            Err(error) => Err(error.into()),
        }
    }

    /// Handles a failed `GetRecords`: `Some(end)` ends the slice, `None` goes on.
    fn failed_read(
        &self,
        shard: &mut ShardState,
        error: ApiError,
    ) -> Result<Option<SliceEnd>, StreamError> {
        if error.code.as_deref() == Some("ExpiredIteratorException") {
            shard.iterator = None;
            if shard.held {
                // Kept across a yield: its age explains the expiry, which says nothing of
                // the renewal.
                tracing::debug!(shard = %shard.id, "Shard iterator expired while the shard waited; renewing it after the last record read.");
                return Ok(None);
            }
            shard.expiries += 1;
            if shard.expiries >= EXPIRY_LIMIT {
                return Err(StreamError::ShardFailed(format!(
                    "iterator for shard {} keeps expiring ({} expiries in a row without a successful read)",
                    shard.id, shard.expiries
                )));
            }
            tracing::debug!(shard = %shard.id, "Shard iterator expired; renewing it after the last record read.");
            return Ok(None);
        }
        if is_gap_code(error.code.as_deref()) {
            return Err(StreamError::Gap(gaps::trimmed_while_reading(
                &shard.id,
                self.reads.gap_remedy,
            )));
        }
        if matches!(error.class, ErrorClass::Throttle | ErrorClass::Transient) {
            crate::retry::note_retry("get_records", &error);
        }
        match error.class {
            ErrorClass::Throttle => {
                shard.throttles += 1;
                let since = *shard.throttled_since.get_or_insert_with(Instant::now);
                let warned_recently = shard
                    .throttle_warned_at
                    .is_some_and(|at| at.elapsed() < THROTTLE_WARN_AFTER);
                if since.elapsed() > THROTTLE_WARN_AFTER && !warned_recently {
                    shard.throttle_warned_at = Some(Instant::now());
                    tracing::warn!(
                        shard = %shard.id,
                        throttled_secs = since.elapsed().as_secs(),
                        "Shard has been throttled for over a minute."
                    );
                }
                Ok(Some(SliceEnd::Yield(capped(
                    self.reads.retry.delay(shard.throttles - 1),
                ))))
            }
            ErrorClass::Transient => {
                shard.transients += 1;
                if shard.transients > self.reads.retry.max_retries {
                    return Err(StreamError::ShardFailed(format!(
                        "GetRecords on {} failed after {} attempt(s): {error}",
                        shard.id, shard.transients
                    )));
                }
                Ok(Some(SliceEnd::Yield(capped(
                    self.reads.retry.delay(shard.transients - 1),
                ))))
            }
            ErrorClass::Fatal => Err(StreamError::ShardFailed(format!(
                "GetRecords on {} failed after {} attempt(s): {error}",
                shard.id,
                shard.transients + 1
            ))),
        }
    }

    /// Hands over the shard's last records followed by its finish mark.
    async fn hand_drained(
        &self,
        shard: &ShardState,
        mut handed: Handed,
    ) -> Result<(), StreamError> {
        let frontier = match shard.newest_ts_ms {
            Some(ts) => Some(ts.div_euclid(1000) - 120),
            None => {
                let id = shard.id.clone();
                self.handover.with_view(|view| view.verified_at(&id)).await
            }
        };
        handed.shard = Some(shard.id.clone());
        handed
            .marks
            .push(StreamMark::Finish(shard.id.clone(), frontier));
        let offered = handed.seqs.len();
        let accepted = self.handover.hand(handed).await.map_err(closed)?;
        if accepted < offered {
            return Err(StreamError::Stopped);
        }
        tracing::info!(shard = %shard.id, "Shard drained: its last record was handed over.");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ChangeMeta, ChangeOp};

    fn changes(created_ms: &[i64]) -> Changes {
        let mut changes = Changes::default();
        for (index, &ts) in created_ms.iter().enumerate() {
            changes
                .envelopes
                .push_with(|out| out.extend_from_slice(format!("record {index}").as_bytes()));
            changes.records.push(ChangeMeta {
                sequence_number: SequenceNumber::parse(&format!("{}", 100 + index))
                    .expect("digits"),
                created_ms: Some(ts),
                op: ChangeOp::Insert,
            });
        }
        changes
    }

    #[test]
    fn records_below_the_floor_are_not_handed_over_but_were_read() {
        let floor_ms = 10_000_000;
        let mut shard = ShardState::new(
            ShardId::new("s"),
            StartAt::TrimHorizon,
            Some(floor_ms),
            None,
        );
        let old = floor_ms - 3_600_000;
        let (handed, last) = keep(&mut shard, changes(&[old, old, floor_ms, old]));
        // The filter passes at the first recent record and keeps everything after it.
        assert_eq!(handed.records.as_bytes(), b"record 2\nrecord 3\n");
        let seqs: Vec<&str> = handed.seqs.iter().map(SequenceNumber::as_str).collect();
        assert_eq!(seqs, ["102", "103"]);
        assert_eq!(handed.ops, [ChangeOp::Insert; 2]);
        assert_eq!(last.as_ref().map(SequenceNumber::as_str), Some("103"));
        assert_eq!(shard.newest_ts_ms, Some(floor_ms));
    }

    #[test]
    fn without_a_floor_the_whole_page_is_handed_over() {
        let mut shard = ShardState::new(ShardId::new("s"), StartAt::TrimHorizon, None, None);
        let (handed, last) = keep(&mut shard, changes(&[5, 7]));
        assert_eq!(handed.records.as_bytes(), b"record 0\nrecord 1\n");
        assert_eq!(handed.seqs.len(), 2);
        assert_eq!(handed.shard, Some(ShardId::new("s")));
        assert_eq!(last.as_ref().map(SequenceNumber::as_str), Some("101"));
        assert_eq!(shard.newest_ts_ms, Some(7));
    }

    #[test]
    fn an_idle_shard_waits_twice_as_long_after_each_further_empty_answer_up_to_the_cap() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (1..=7).map(|n| idle_delay(s(1), s(10), n)).collect();
        assert_eq!(waits, [s(1), s(1), s(2), s(4), s(8), s(10), s(10)]);
        assert_eq!(idle_delay(s(1), s(10), u32::MAX), s(10));
        assert_eq!(
            idle_delay(s(1), s(1), 9),
            s(1),
            "no backoff when the cap is the poll"
        );
        assert_eq!(
            idle_delay(s(3), s(1), 9),
            s(3),
            "never below the poll interval"
        );
    }
}
