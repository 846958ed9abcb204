//! Parallel segments of a Scan (or the one segment of a Query), each resumed on its own.
//!
//! # Concurrency and memory (docs/scan.md §2.4)
//! 1. Pending segments wait in ascending order; at most `max_concurrency` are read at once,
//!    and a finished segment's slot goes to the next pending one.
//! 2. A segment's task is spawned only when it starts, so a million segments cost
//!    `O(max_concurrency)`; finished ranges are skipped without being listed.
//! 3. Each active segment has at most one request in flight and one page waiting to be
//!    handed on (the bounded channel applies back-pressure).
//! 4. Every task's outcome is checked: a panic fails the run naming the segment.
//!
//! # Resumption
//! Segments recorded done are skipped; segments with a cursor continue from it as
//! `ExclusiveStartKey`; the others start from the beginning.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ddbpipe_value::Item;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::api::{ReadKind, ReadRequest, Render, TableApi};
use crate::capacity::{ReadLimiter, ReadSlots};
use crate::config::{Mode, SourceConfig};
use crate::error::{ErrorClass, ReadError};
use crate::events::{PageRead, RecordKind, SegmentsCounted};
use crate::records::{Lines, SegmentCursor};
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};
use crate::segments::SegmentRanges;

/// The request of every page of a scan or query source (docs/scan.md §2.2); segments and start keys
/// are filled in per page.
pub fn read_template(source: &SourceConfig) -> ReadRequest {
    let kind = match source.mode {
        Mode::Query => ReadKind::Query {
            key_condition: source.key_condition_expression.clone().unwrap_or_default(),
            scan_index_forward: source.scan_index_forward,
        },
        _ => ReadKind::Scan { segment: None },
    };
    ReadRequest {
        table_name: source.table_name.clone(),
        kind,
        index_name: source.index_name.clone(),
        projection: source.projection.clone(),
        filter_expression: source.filter_expression.clone(),
        expression_attribute_names: source.expression_attribute_names.clone(),
        expression_attribute_values: source.merged_expression_values(),
        consistent_read: source.consistent_read,
        limit: source.page_limit,
        exclusive_start_key: None,
    }
}

/// The request of every page of a snapshot's scan (a mirror's or a resnapshot's): whole items
/// of the table, no index, projection or filter.
pub fn snapshot_template(
    table_name: &str,
    consistent_read: bool,
    limit: Option<u32>,
) -> ReadRequest {
    ReadRequest {
        table_name: table_name.to_string(),
        kind: ReadKind::Scan { segment: None },
        index_name: None,
        projection: None,
        filter_expression: None,
        expression_attribute_names: std::collections::BTreeMap::new(),
        expression_attribute_values: std::collections::BTreeMap::new(),
        consistent_read,
        limit,
        exclusive_start_key: None,
    }
}

/// One page read from one segment, rendered.
#[derive(Debug)]
pub struct PageOut {
    /// The segment it came from.
    pub segment: u32,
    /// The page's records.
    pub records: Lines,
    /// Where the segment stands after this page.
    pub cursor: SegmentCursor,
    /// When the request that read it was sent (unix ms, this machine's clock): the version of
    /// its rows in a snapshot (docs/mirror.md §5.6).
    pub requested_ms: i64,
    /// An export file's page: the file's items handed on before it. Any count is a cursor of
    /// the file, so a batch ending inside the page records exactly where (docs/scan.md §2.10);
    /// a Scan page's only cursor is its end (`None`).
    pub lines_from: Option<u64>,
}

/// What reads a snapshot's segments and hands on their pages: a parallel Scan
/// ([`SegmentReader`]) or an export's data files ([`crate::export::ExportSnapshot`]). The
/// runners take either.
pub trait PageSource: Send + 'static {
    /// Pages waiting to be handed on at once (the channel's bound).
    fn in_flight(&self) -> usize;

    /// The read-capacity governor whose units the run reports (an export consumes none).
    fn limiter(&self) -> Arc<ReadLimiter>;

    /// Reads every segment not in `done`, continuing `cursors`, sending pages to `out`, until
    /// every segment is done, `out` is closed, a segment failed, or `cancel` fires.
    fn read(
        self,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> impl std::future::Future<Output = Result<(), ReadError>> + Send;
}

/// What reads one segment of a snapshot at a time, from its cursor: a Scan segment
/// ([`SegmentReader`]) or an export's data file (`export::ExportSegments`, file `i` segment
/// `i`). The unit of a segment lease: a shared run reads the segments it holds
/// (docs/coordination.md §11.10, §11.12).
pub trait SegmentRead: Send + Sync + 'static {
    /// The snapshot's segments.
    fn total(&self) -> u32;

    /// Segments read at once by one worker.
    fn max_concurrency(&self) -> usize;

    /// The read-capacity governor whose units the run reports (an export consumes none).
    fn limiter(&self) -> Arc<ReadLimiter>;

    /// Reads segment `segment` from `start` (its beginning when `None`) to its end, sending
    /// its pages to `out`, until `out` is closed or `cancel` fires.
    fn read_one(
        &self,
        segment: u32,
        start: Option<Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> futures_util::future::BoxFuture<'static, Result<(), ReadError>>;
}

impl<A: TableApi> SegmentRead for SegmentReader<A> {
    fn total(&self) -> u32 {
        self.total_segments.max(1)
    }

    fn max_concurrency(&self) -> usize {
        self.max_concurrency.max(1)
    }

    fn limiter(&self) -> Arc<ReadLimiter> {
        Arc::clone(&self.limiter)
    }

    fn read_one(
        &self,
        segment: u32,
        start: Option<Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> futures_util::future::BoxFuture<'static, Result<(), ReadError>> {
        let reader = self.clone();
        Box::pin(async move { reader.read_segment(segment, start, out, cancel).await })
    }
}

impl<A: TableApi> PageSource for SegmentReader<A> {
    fn in_flight(&self) -> usize {
        self.max_concurrency.max(1)
    }

    fn limiter(&self) -> Arc<ReadLimiter> {
        Arc::clone(&self.limiter)
    }

    async fn read(
        self,
        done: SegmentRanges,
        cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        self.run(&done, cursors, out, cancel).await
    }
}

/// What to read and how.
pub struct SegmentReader<A> {
    /// The table API.
    pub api: Arc<A>,
    /// The request of every page; the segment and start key are filled in per page.
    pub template: ReadRequest,
    /// `TotalSegments` (1 for a query).
    pub total_segments: u32,
    /// Segments read at once.
    pub max_concurrency: usize,
    /// The read-capacity governor shared by every segment.
    pub limiter: Arc<ReadLimiter>,
    /// The one retry policy.
    pub retry: RetryPolicy,
    /// How items become records.
    pub render: Render,
    /// Told about every attempt (metrics).
    pub observer: Arc<dyn AttemptObserver>,
    /// The process's read slots: each page's request holds one (`source.read_concurrency`).
    pub slots: ReadSlots,
}

// Not derived: a derive would require `A: Clone`, but only the `Arc` is cloned.
impl<A> Clone for SegmentReader<A> {
    fn clone(&self) -> Self {
        SegmentReader {
            api: Arc::clone(&self.api),
            template: self.template.clone(),
            total_segments: self.total_segments,
            max_concurrency: self.max_concurrency,
            limiter: Arc::clone(&self.limiter),
            retry: self.retry,
            render: self.render.clone(),
            observer: Arc::clone(&self.observer),
            slots: self.slots.clone(),
        }
    }
}

impl<A: TableApi> SegmentReader<A> {
    /// Reads every segment not in `done`, continuing `cursors`, sending pages to `out`.
    ///
    /// Returns when every segment is done, `out` is closed, or a segment failed (the other
    /// segments are cancelled: dropping the task set aborts them). `cancel` stops it early.
    pub async fn run(
        &self,
        done: &SegmentRanges,
        mut cursors: BTreeMap<u32, Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        let mut pending = done.missing(self.total_segments);
        let mut tasks = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, u32> = HashMap::new();
        let total = u64::from(self.total_segments);
        let mut finished = done.count();
        loop {
            while running.len() < self.max_concurrency.max(1) {
                let Some(segment) = pending.next() else { break };
                let start = cursors.remove(&segment);
                let reader = self.clone();
                let out = out.clone();
                let cancel = cancel.clone();
                let handle = tasks.spawn(
                    async move { reader.read_segment(segment, start, out, cancel).await }
                        .in_current_span(),
                );
                running.insert(handle.id(), segment);
                tracing::debug!(segment, "Segment started.");
            }
            let active = running.len() as u64;
            SegmentsCounted {
                pending: total.saturating_sub(finished + active),
                active,
                done: finished,
            }
            .emit();
            let joined = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(ReadError::Cancelled),
                joined = tasks.join_next_with_id() => joined,
            };
            let Some(joined) = joined else {
                return Ok(());
            };
            match joined {
                Ok((id, result)) => {
                    let segment = running.remove(&id);
                    result?;
                    finished += 1;
                    tracing::debug!(segment, "Segment done.");
                }
                Err(error) => {
                    let segment = running.remove(&error.id()).unwrap_or_default();
                    if error.is_panic() {
                        let payload = error.into_panic();
                        let message = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".to_string());
                        return Err(ReadError::Panicked { segment, message });
                    }
                    return Err(ReadError::Cancelled);
                }
            }
        }
    }

    /// Reads one segment from `start` (its beginning when `None`) to its end, sending its
    /// pages to `out`, until `out` is closed or `cancel` fires: the unit of a segment lease
    /// (docs/coordination.md §11.10).
    pub async fn read_segment(
        &self,
        segment: u32,
        mut start: Option<Item>,
        out: mpsc::Sender<PageOut>,
        cancel: Cancel,
    ) -> Result<(), ReadError> {
        let mut request = self.template.clone();
        if let ReadKind::Scan { segment: seg } = &mut request.kind {
            *seg = (self.total_segments > 1).then_some((segment, self.total_segments));
        }
        let operation = request.operation();
        let table = request.table_name.clone();
        let what = || match self.total_segments {
            1 => format!("{operation} of '{table}'"),
            total => format!("{operation} of '{table}' (segment {segment} of {total})"),
        };
        let mut units = 0.0;
        loop {
            // A cancelled segment stops between pages too, not only while a request waits.
            if cancel.is_cancelled() {
                return Err(ReadError::Cancelled);
            }
            request.exclusive_start_key = start.take();
            let (page, requested_ms) = self
                .retry
                .run(operation, what, &cancel, self.observer.as_ref(), |_| {
                    let request = &request;
                    async move {
                        let grant = self.limiter.acquire().await;
                        // After the governor's grant: a table waiting for its rate holds no
                        // slot another table could use.
                        let slot = self.slots.take().await;
                        let requested_ms = self.api.clock_ms();
                        let read = self.api.read_records(request, &self.render).await;
                        drop(slot);
                        match read {
                            Ok(page) => {
                                if self.limiter.settle(grant, page.consumed_capacity) {
                                    tracing::warn!(
                                        table = %request.table_name,
                                        "The endpoint reports no consumed capacity; each request is counted as 1 unit."
                                    );
                                }
                                Ok((page, requested_ms))
                            }
                            Err(error) => {
                                if error.class == ErrorClass::Throttle {
                                    self.limiter.throttled();
                                }
                                self.limiter.refund(grant);
                                Err(error)
                            }
                        }
                    }
                })
                .await?;
            units += page.consumed_capacity.unwrap_or(1.0);
            PageRead {
                kind: RecordKind::Item,
                records: page.records.len(),
                capacity_units: page.consumed_capacity,
            }
            .emit();
            let cursor = match page.last_evaluated_key {
                Some(key) => SegmentCursor::Next(key),
                None => SegmentCursor::Done,
            };
            let next = match &cursor {
                SegmentCursor::Next(key) => Some(key.clone()),
                SegmentCursor::Done => None,
            };
            let page_out = PageOut {
                segment,
                records: page.records,
                cursor,
                requested_ms,
                lines_from: None,
            };
            if out.send(page_out).await.is_err() {
                // The consumer is gone: the run is stopping.
                return Ok(());
            }
            match next {
                Some(key) => start = Some(key),
                None => {
                    tracing::debug!(segment, capacity_units = units, "Segment read to its end.");
                    return Ok(());
                }
            }
        }
    }
}
