//! The shard syncer: every `DescribeStream` of a run, beside the read loop (docs/streams.md §4.3).
//!
//! The read loop asks; the syncer lists the stream or looks up children in a task of its own
//! and hands back what it learnt. No lookup ever holds a read slot or stops the loop.
//!
//! # Rules
//! 1. `DescribeStream` calls start at least 200 ms apart (at most 5 a second) across every
//!    listing and lookup of the run; a listing of several pages paces from its last page.
//! 2. One lookup runs at a time. A drained shard whose children are not known is *pending*
//!    until a lookup answers for it; the read slot it held is already free.
//! 3. The shards that drained since the last lookup are resolved together, in one batch. While
//!    the child-shard filter works, each gets one `DescribeStream` with
//!    `ShardFilter {Type: CHILD_SHARDS}`. When it does not, one full listing serves the whole
//!    batch, never one listing per shard.
//! 4. The filter does not work when the endpoint rejects it (a definite error) or ignores it
//!    (its answer lists a shard that is not a child of the one asked about, or has more
//!    pages). From then on the run uses full listings; what the ignored answer listed is kept.
//! 5. A full listing is wanted every `discovery_interval` and when every known shard is
//!    finished; a batch made while one is wanted is served by that listing alone.
//! 6. A failed lookup or listing warns and resolves its shards: the next periodic listing
//!    finds what it missed. Failures never end the run.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::shard_reader::{StreamContext, StreamError};
use crate::api::{ShardDescription, StreamPage, StreamsApi};
use crate::error::{ErrorClass, ReadError};
use crate::events::DiscoveryFailed;
use crate::ids::ShardId;
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};

/// Least time between two `DescribeStream` calls (at most 5 a second).
const DESCRIBE_SPACING: Duration = Duration::from_millis(200);

/// The stream as discovered: shards and status.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// Every shard listed.
    pub shards: Vec<ShardDescription>,
    /// `StreamStatus`.
    pub status: Option<String>,
    /// `StreamViewType`.
    pub view_type: Option<String>,
}

/// Lists every shard of the stream (paged, retried).
pub async fn discover<A: StreamsApi>(
    api: &A,
    stream_arn: &str,
    retry: &RetryPolicy,
    cancel: &Cancel,
    observer: &dyn AttemptObserver,
) -> Result<Discovery, ReadError> {
    let mut discovery = Discovery::default();
    let mut start: Option<ShardId> = None;
    loop {
        let page = retry
            .run(
                "describe_stream",
                || format!("DescribeStream {stream_arn}"),
                cancel,
                observer,
                |_| api.describe_stream(stream_arn, start.as_ref(), None),
            )
            .await?;
        discovery.status = page.status.or(discovery.status);
        discovery.view_type = page.view_type.or(discovery.view_type);
        discovery.shards.extend(page.shards);
        match page.last_evaluated_shard_id {
            Some(last) => {
                start = Some(last);
                tokio::time::sleep(DESCRIBE_SPACING).await;
            }
            None => return Ok(discovery),
        }
    }
}

/// How children are looked up (rules 3 and 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildLookup {
    /// One filtered `DescribeStream` per drained shard.
    Filtered,
    /// The endpoint rejects or ignores the filter: full listings only.
    FullListing,
}

/// What one lookup learnt.
#[derive(Debug, Default)]
pub struct Synced {
    /// Shards described by child lookups (and by an answer that ignored the filter).
    pub children: Vec<ShardDescription>,
    /// The full listing, when one was made and succeeded.
    pub listing: Option<Discovery>,
    /// Set when the lookup found that the filter does not work (rule 4).
    filter_failed: bool,
}

/// Paces `DescribeStream` calls (rule 1). Only one lookup runs at a time, so the lock is
/// never contended; it lets the lookup task and the syncer share the last call's time.
#[derive(Debug)]
struct Pacer {
    last: Mutex<Option<Instant>>,
}

impl Pacer {
    fn last(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a call may start, and notes that it starts.
    async fn pace(&self) {
        let last = *self.last();
        if let Some(at) = last {
            tokio::time::sleep_until(at + DESCRIBE_SPACING).await;
        }
        *self.last() = Some(Instant::now());
    }

    /// A call (or a listing's last page) ended now: pace from here.
    fn ended(&self) {
        *self.last() = Some(Instant::now());
    }
}

/// One batch of work for a lookup task.
#[derive(Debug)]
struct Batch {
    children_of: Vec<ShardId>,
    listing: bool,
    lookup: ChildLookup,
}

/// Runs the run's `DescribeStream` calls beside the read loop (see the module docs).
pub struct ShardSyncer<A> {
    ctx: Arc<StreamContext<A>>,
    stop: Cancel,
    pacer: Arc<Pacer>,
    lookup: ChildLookup,
    /// Drained shards whose children are wanted, not yet in a batch.
    pending: BTreeSet<ShardId>,
    /// A full listing is wanted and not yet in a batch.
    listing_wanted: bool,
    /// The shards the running batch looks up.
    in_flight: BTreeSet<ShardId>,
    /// The running batch lists the stream.
    listing_in_flight: bool,
    task: JoinSet<Synced>,
}

impl<A: StreamsApi> ShardSyncer<A> {
    /// A syncer for the run of `ctx`; the start-up listing has just called `DescribeStream`.
    pub fn new(ctx: Arc<StreamContext<A>>, stop: Cancel) -> Self {
        ShardSyncer {
            ctx,
            stop,
            pacer: Arc::new(Pacer {
                last: Mutex::new(Some(Instant::now())),
            }),
            lookup: ChildLookup::Filtered,
            pending: BTreeSet::new(),
            listing_wanted: false,
            in_flight: BTreeSet::new(),
            listing_in_flight: false,
            task: JoinSet::new(),
        }
    }

    /// `shard` drained without known children: look them up (rules 2 and 3).
    pub fn want_children(&mut self, shard: ShardId) {
        if !self.in_flight.contains(&shard) {
            self.pending.insert(shard);
        }
        self.start();
    }

    /// Asks for a full listing, unless one is already wanted or running (rule 5).
    pub fn want_listing(&mut self) {
        if !self.listing_in_flight {
            self.listing_wanted = true;
        }
        self.start();
    }

    /// Whether a drained shard still waits for its children lookup.
    pub fn children_pending(&self) -> bool {
        !self.pending.is_empty() || !self.in_flight.is_empty()
    }

    /// Whether a lookup is running (then [`Self::next`] has something to give).
    pub fn busy(&self) -> bool {
        !self.task.is_empty()
    }

    /// The next lookup's answer; starts the next batch. Cancel-safe: nothing is lost when
    /// the wait is dropped. Pending forever when no lookup runs.
    pub async fn next(&mut self) -> Result<Synced, StreamError> {
        let Some(joined) = self.task.join_next().await else {
            return std::future::pending().await;
        };
        let synced = joined.map_err(|error| {
            StreamError::Read(ReadError::Internal(format!(
                "shard discovery task failed: {error}"
            )))
        })?;
        if synced.filter_failed {
            self.lookup = ChildLookup::FullListing;
        }
        self.in_flight.clear();
        self.listing_in_flight = false;
        self.start();
        Ok(synced)
    }

    /// Starts a batch of everything wanted, if no lookup runs.
    fn start(&mut self) {
        if self.busy() || (self.pending.is_empty() && !self.listing_wanted) {
            return;
        }
        let children_of: Vec<ShardId> = std::mem::take(&mut self.pending).into_iter().collect();
        let listing = std::mem::take(&mut self.listing_wanted)
            || (self.lookup == ChildLookup::FullListing && !children_of.is_empty());
        self.in_flight = children_of.iter().cloned().collect();
        self.listing_in_flight = listing;
        let batch = Batch {
            children_of,
            listing,
            lookup: self.lookup,
        };
        let ctx = Arc::clone(&self.ctx);
        let stop = self.stop.clone();
        let pacer = Arc::clone(&self.pacer);
        self.task
            .spawn(run_batch(ctx, stop, pacer, batch).in_current_span());
    }
}

/// The answer to one filtered lookup.
enum Children {
    /// The children of the shard asked about.
    Listed(Vec<ShardDescription>),
    /// The endpoint rejected or ignored the filter; what it listed anyway.
    FilterFailed(Vec<ShardDescription>),
    /// The lookup failed (warned) or the run stops.
    Failed,
}

/// Whether a filtered answer kept to the filter: only children of `parent`, one page.
fn kept_to_filter(page: &StreamPage, parent: &ShardId) -> bool {
    page.last_evaluated_shard_id.is_none()
        && page
            .shards
            .iter()
            .all(|shard| shard.parent.as_ref() == Some(parent))
}

async fn children<A: StreamsApi>(
    ctx: &StreamContext<A>,
    stop: &Cancel,
    shard: &ShardId,
) -> Children {
    let arn = ctx.reads.stream_arn.as_str();
    let answer = ctx
        .reads
        .retry
        .run(
            "describe_stream",
            || format!("DescribeStream {arn} (children of {shard})"),
            stop,
            ctx.reads.observer.as_ref(),
            |_| ctx.reads.api.describe_stream(arn, None, Some(shard)),
        )
        .await;
    match answer {
        Ok(page) if kept_to_filter(&page, shard) => Children::Listed(page.shards),
        Ok(page) => {
            tracing::info!(shard = %shard, "The endpoint ignores the child-shard filter; using full listings.");
            Children::FilterFailed(page.shards)
        }
        Err(ReadError::Request { error, .. }) if error.class == ErrorClass::Fatal => {
            tracing::info!(error = %error, "The endpoint rejects the child-shard filter; using full listings.");
            Children::FilterFailed(Vec::new())
        }
        Err(ReadError::Cancelled) => Children::Failed,
        Err(error) => {
            DiscoveryFailed { error: &error }.emit();
            Children::Failed
        }
    }
}

/// One batch: filtered lookups while the filter works, else (or when wanted) one listing.
async fn run_batch<A: StreamsApi>(
    ctx: Arc<StreamContext<A>>,
    stop: Cancel,
    pacer: Arc<Pacer>,
    batch: Batch,
) -> Synced {
    let mut synced = Synced::default();
    let mut listing = batch.listing;
    if !listing && batch.lookup == ChildLookup::Filtered {
        for shard in &batch.children_of {
            pacer.pace().await;
            match children(&ctx, &stop, shard).await {
                Children::Listed(shards) => synced.children.extend(shards),
                Children::FilterFailed(shards) => {
                    synced.children.extend(shards);
                    synced.filter_failed = true;
                    listing = true;
                    break;
                }
                Children::Failed => {}
            }
        }
    }
    if listing {
        pacer.pace().await;
        let discovered = discover(
            ctx.reads.api.as_ref(),
            &ctx.reads.stream_arn,
            &ctx.reads.retry,
            &stop,
            ctx.reads.observer.as_ref(),
        )
        .await;
        pacer.ended();
        match discovered {
            Ok(discovery) => synced.listing = Some(discovery),
            Err(ReadError::Cancelled) => {}
            Err(error) => DiscoveryFailed { error: &error }.emit(),
        }
    }
    synced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parent: Option<&str>) -> ShardDescription {
        ShardDescription {
            id: ShardId::new(id),
            parent: parent.map(ShardId::new),
            closed: false,
        }
    }

    #[test]
    fn an_answer_with_other_shards_or_more_pages_ignored_the_filter() {
        let p = ShardId::new("p");
        let children = StreamPage {
            shards: vec![shard("c1", Some("p")), shard("c2", Some("p"))],
            ..StreamPage::default()
        };
        assert!(kept_to_filter(&children, &p));
        assert!(kept_to_filter(&StreamPage::default(), &p), "no child yet");
        let listing = StreamPage {
            shards: vec![shard("p", None), shard("c1", Some("p"))],
            ..StreamPage::default()
        };
        assert!(!kept_to_filter(&listing, &p), "the parent itself is listed");
        let paged = StreamPage {
            shards: vec![shard("c1", Some("p"))],
            last_evaluated_shard_id: Some(ShardId::new("c1")),
            ..StreamPage::default()
        };
        assert!(
            !kept_to_filter(&paged, &p),
            "a filtered answer has one page"
        );
    }
}
