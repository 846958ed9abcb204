//! The stream read loop: discovery, admission, the scheduler and the slices.
//!
//! # Ordering (SPEC §4.8)
//! 1. A shard is admitted only when its parent is absent, finished in the handed-over view,
//!    or an orphan; a child is therefore read only after its parent's last record was handed
//!    over, and the sequential sink acknowledges it after them.
//! 2. Admission runs at start, after each shard drains (asking `DescribeStream` for its
//!    children at once when none is known), and after each discovery.
//!
//! # Run end (SPEC §4.10)
//! `max_messages` records handed over, no record for `idle_termination_secs`, a stop signal,
//! or a disabled stream whose every shard is finished. With `follow`, only a signal ends it.
//!
//! # Discovery (SPEC §4.3)
//! A full `DescribeStream` listing (pages of 100, at most 5 calls a second) every
//! `discovery_interval`; failures after the start warn and never end the run. An endpoint
//! that rejects the child-shard filter gets full discoveries for the rest of the run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::handover::{Handed, StreamMark};
use super::lineage::{self, ShardGraph};
use super::shard_reader::{ShardState, SliceEnd, StreamContext, StreamError};
use super::start::{ShardStart, start_for};
use crate::api::{ShardDescription, StartAt, StreamsApi};
use crate::clock::unix_now_ms;
use crate::config::StartPosition;
use crate::error::{ErrorClass, ReadError};
use crate::events::{DiscoveryFailed, LagMeasured, ShardsCounted};
use crate::ids::ShardId;
use crate::position::{ShardCheckpoint, StreamsPosition};
use crate::retry::{Cancel, NoObserver, RetryPolicy};

/// Least time between two `DescribeStream` calls (at most 5 a second).
const DESCRIBE_SPACING: Duration = Duration::from_millis(200);

/// How a stream run is bounded.
#[derive(Debug, Clone)]
pub struct RunBounds {
    /// Shards read at once.
    pub shard_concurrency: usize,
    /// Full re-discovery period.
    pub discovery_interval: Duration,
    /// End after this long without a record.
    pub idle_termination: Option<Duration>,
    /// Run until stopped.
    pub follow: bool,
}

/// Why a stream run ended cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// `max_messages` records were handed over.
    MaxMessages,
    /// No record for `idle_termination_secs`.
    Idle,
    /// A signal asked the run to stop.
    Stopped,
    /// The stream is disabled and every shard is finished.
    StreamDisabled,
}

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
) -> Result<Discovery, ReadError> {
    let mut discovery = Discovery::default();
    let mut start: Option<ShardId> = None;
    loop {
        let page = retry
            .run(
                "describe_stream",
                || format!("DescribeStream {stream_arn}"),
                cancel,
                &NoObserver,
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

/// The marks a first run commits before reading (SPEC §4.4): every shard described at the
/// start is admitted `""` (verified at the run start) with, for `LATEST` shards, a floor;
/// closed shards under `latest` are finished unread.
pub fn first_run_marks(
    graph: &ShardGraph,
    position: &StreamsPosition,
    start_position: StartPosition,
    run_start_ms: i64,
) -> Vec<StreamMark> {
    let mut view = position.clone();
    let mut marks = Vec::new();
    let run_start_s = run_start_ms.div_euclid(1000);
    // Closed shards under `latest` are finished at once, which makes their children
    // admissible in the next round; open shards keep their children waiting.
    loop {
        let mut finished_any = false;
        for admission in lineage::admissible(graph, &view) {
            let Some(shard) = graph.with_trusted_closed(&admission.shard) else {
                continue;
            };
            let shard = &shard;
            let start = start_for(shard, &view, true, true, start_position, run_start_ms);
            let admit = StreamMark::Admit {
                shard: shard.id.clone(),
                verified_at: Some(run_start_s),
                floor_ms: match &start {
                    ShardStart::Read { floor_ms, .. } => *floor_ms,
                    ShardStart::FinishedAtStart => None,
                },
            };
            super::handover::apply(&mut view, &admit);
            marks.push(admit);
            if start == ShardStart::FinishedAtStart {
                let finish = StreamMark::Finish(shard.id.clone(), Some(run_start_s));
                super::handover::apply(&mut view, &finish);
                marks.push(finish);
                finished_any = true;
            }
        }
        if !finished_any {
            return marks;
        }
    }
}

/// Reads the stream until an end condition (see the module docs).
pub struct StreamEngine<A> {
    ctx: Arc<StreamContext<A>>,
    bounds: RunBounds,
    graph: ShardGraph,
    start_position: StartPosition,
    run_start_ms: i64,
    states: HashMap<ShardId, ShardState>,
    scheduler: super::scheduler::Scheduler,
    child_filter_works: bool,
    lag: HashMap<ShardId, LagInfo>,
    /// When the last `DescribeStream` call of this engine started (at most 5 a second).
    described_at: Option<Instant>,
    /// Shards in the position whose parent is still being read (`WaitingOnParentShards`):
    /// a capture stores every shard at once, but children are still read after parents.
    waiting: Vec<ShardId>,
    /// The stream was `DISABLED` at the last discovery: no shard will ever get a child.
    disabled: bool,
    stop: Cancel,
}

impl<A: StreamsApi> StreamEngine<A> {
    /// An engine over `graph` (the start-up discovery), starting from the handover's view.
    /// `probed` holds iterators acquired by the start-up probe, used by first slices.
    #[allow(clippy::too_many_arguments)] // The run's wiring, passed once.
    pub async fn new(
        ctx: Arc<StreamContext<A>>,
        bounds: RunBounds,
        graph: ShardGraph,
        start_position: StartPosition,
        first_run: bool,
        run_start_ms: i64,
        mut probed: BTreeMap<ShardId, String>,
        stop: Cancel,
    ) -> Self {
        let mut engine = StreamEngine {
            scheduler: super::scheduler::Scheduler::new(bounds.shard_concurrency),
            ctx,
            bounds,
            graph,
            start_position,
            run_start_ms,
            states: HashMap::new(),
            child_filter_works: true,
            lag: HashMap::new(),
            // The start-up discovery has just listed the stream.
            described_at: Some(Instant::now()),
            waiting: Vec::new(),
            disabled: false,
            stop,
        };
        let graph = &engine.graph;
        let readable: Vec<(ShardId, ShardCheckpoint, Option<i64>, bool)> = engine
            .ctx
            .handover
            .with_view(|view| {
                view.shards
                    .iter()
                    .map(|(id, cp)| {
                        // A described parent that is not finished is read first.
                        let parent_unfinished = graph
                            .get(id)
                            .and_then(|shard| shard.parent.as_ref())
                            .is_some_and(|p| graph.contains(p) && !view.finished.contains(p));
                        (
                            id.clone(),
                            cp.clone(),
                            view.latest_floor_ms.get(id).copied(),
                            parent_unfinished,
                        )
                    })
                    .collect()
            })
            .await;
        let now = Instant::now();
        for (id, checkpoint, floor, parent_unfinished) in readable {
            if !engine.graph.contains(&id) {
                continue;
            }
            let start = match checkpoint {
                ShardCheckpoint::After(seq) => StartAt::After(seq),
                ShardCheckpoint::TrimHorizon => {
                    let first_latest = first_run && floor.is_some();
                    if first_latest {
                        StartAt::Latest
                    } else {
                        StartAt::TrimHorizon
                    }
                }
            };
            let iterator = probed.remove(&id);
            engine.states.insert(
                id.clone(),
                ShardState::new(id.clone(), start, floor, iterator),
            );
            if parent_unfinished {
                engine.waiting.push(id);
            } else {
                engine.scheduler.push(id, now);
            }
        }
        engine
    }

    /// Runs until an end condition; in-flight slices are cancelled when it returns.
    pub async fn run(mut self) -> Result<EndReason, StreamError> {
        let mut slices: JoinSet<(ShardState, Result<SliceEnd, StreamError>)> = JoinSet::new();
        self.admit().await?;
        self.ctx.handover.reset_idle().await;
        let mut next_discovery = Instant::now() + self.bounds.discovery_interval;
        let mut next_drain_check = Instant::now();
        loop {
            let now = Instant::now();
            while let Some(id) = self.scheduler.take(now) {
                let Some(mut state) = self.states.remove(&id) else {
                    self.scheduler.release();
                    continue;
                };
                let ctx = Arc::clone(&self.ctx);
                slices.spawn(
                    async move {
                        let end = ctx.slice(&mut state).await;
                        (state, end)
                    }
                    .in_current_span(),
                );
            }
            if self.ctx.handover.limit_reached().await {
                return Ok(EndReason::MaxMessages);
            }
            if let Some(idle) = self.bounds.idle_termination
                && self.ctx.handover.idle_for().await >= idle
            {
                tracing::info!(
                    idle_secs = idle.as_secs(),
                    "Idle termination: no record for the configured time."
                );
                return Ok(EndReason::Idle);
            }
            let finished = self
                .ctx
                .handover
                .with_view(|view| view.finished.len())
                .await;
            ShardsCounted {
                queued: self.scheduler.queued() as u64,
                active: self.scheduler.active() as u64,
                finished: finished as u64,
            }
            .emit();
            LagMeasured {
                seconds: running_lag(self.lag.values(), unix_now_ms()),
            }
            .emit();
            let all_finished = slices.is_empty() && self.scheduler.queued() == 0;
            if all_finished && now >= next_drain_check {
                next_drain_check = now + self.ctx.poll_interval;
                if let Some(reason) = self.drained_stream().await {
                    return Ok(reason);
                }
            }
            if now >= next_discovery {
                next_discovery = now + self.bounds.discovery_interval;
                self.rediscover().await;
                self.admit().await?;
            }
            let mut wake = next_discovery.min(now + Duration::from_secs(1));
            if let Some(due) = self.scheduler.next_due() {
                wake = wake.min(due.max(now));
            }
            if all_finished {
                wake = wake.min(next_drain_check);
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Ok(EndReason::Stopped),
                joined = slices.join_next(), if !slices.is_empty() => {
                    let Some(joined) = joined else { continue };
                    // Slices that ended together are settled together, so shards that drain
                    // at once share one discovery instead of one child lookup each.
                    let mut ended = vec![joined];
                    while let Some(more) = slices.try_join_next() {
                        ended.push(more);
                    }
                    let mut drained = Vec::new();
                    for joined in ended {
                        self.scheduler.release();
                        let (state, end) = joined.map_err(|error| {
                            StreamError::Read(ReadError::Internal(format!("shard slice task failed: {error}")))
                        })?;
                        match end {
                            Ok(SliceEnd::Yield(delay)) => {
                                self.lag.insert(state.id.clone(), LagInfo {
                                    newest_ts_ms: state.newest_ts_ms,
                                    caught_up: state.caught_up,
                                });
                                let due = Instant::now() + delay;
                                self.scheduler.push(state.id.clone(), due);
                                self.states.insert(state.id.clone(), state);
                            }
                            Ok(SliceEnd::Drained) => {
                                let id = state.id.clone();
                                self.lag.remove(&id);
                                self.release_children(&id);
                                drained.push(id);
                            }
                            Err(StreamError::Stopped) => {
                                if self.ctx.handover.limit_reached().await {
                                    return Ok(EndReason::MaxMessages);
                                }
                                return Ok(EndReason::Stopped);
                            }
                            Err(error) => return Err(error),
                        }
                    }
                    if !drained.is_empty() {
                        let childless: Vec<ShardId> = drained
                            .into_iter()
                            .filter(|id| self.graph.children_of(id).is_empty())
                            .collect();
                        match childless.as_slice() {
                            [] => {}
                            [one] => self.find_children(one).await,
                            _ if !self.disabled => {
                                self.rediscover().await;
                            }
                            _ => {}
                        }
                        self.admit().await?;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Records the stream status of the start-up discovery.
    pub fn with_status(mut self, status: Option<&str>) -> Self {
        self.disabled = status == Some("DISABLED");
        self
    }

    /// Queues the shards that waited for `parent` to finish.
    fn release_children(&mut self, parent: &ShardId) {
        let graph = &self.graph;
        let (ready, still): (Vec<ShardId>, Vec<ShardId>) = self
            .waiting
            .drain(..)
            .partition(|child| graph.get(child).and_then(|s| s.parent.as_ref()) == Some(parent));
        self.waiting = still;
        let now = Instant::now();
        for child in ready {
            tracing::debug!(shard = %child, parent = %parent, "Parent finished; reading its child.");
            self.scheduler.push(child, now);
        }
    }

    /// Admits every shard that may be read now and queues it.
    async fn admit(&mut self) -> Result<(), StreamError> {
        let graph = &self.graph;
        let admissions = self
            .ctx
            .handover
            .with_view(|view| {
                lineage::admissible(graph, view)
                    .into_iter()
                    .map(|a| {
                        let verified_at = a
                            .finished_parent
                            .as_ref()
                            .and_then(|p| view.verified_at.get(p).copied());
                        (a, verified_at)
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        if admissions.is_empty() {
            return Ok(());
        }
        let mut marks = Vec::new();
        let now = Instant::now();
        for (admission, verified_at) in admissions {
            if let Some(parent) = &admission.orphan_parent {
                tracing::warn!(shard = %admission.shard, parent = %parent, "Shard's parent is unknown; reading it as a root.");
            }
            let Some(shard) = self.graph.get(&admission.shard).cloned() else {
                continue;
            };
            let start = self
                .ctx
                .handover
                .with_view(|view| {
                    start_for(
                        &shard,
                        view,
                        false,
                        false,
                        self.start_position,
                        self.run_start_ms,
                    )
                })
                .await;
            let (at, floor) = match start {
                ShardStart::Read { at, floor_ms } => (at, floor_ms),
                ShardStart::FinishedAtStart => (StartAt::TrimHorizon, None),
            };
            marks.push(StreamMark::Admit {
                shard: shard.id.clone(),
                verified_at,
                floor_ms: floor,
            });
            tracing::debug!(shard = %shard.id, "Shard admitted.");
            self.states.insert(
                shard.id.clone(),
                ShardState::new(shard.id.clone(), at, floor, None),
            );
            self.scheduler.push(shard.id.clone(), now);
        }
        self.ctx
            .handover
            .hand(Handed {
                marks,
                ..Handed::default()
            })
            .await
            .map_err(|_| StreamError::Stopped)?;
        Ok(())
    }

    /// Waits so that `DescribeStream` calls start at least 200 ms apart (SPEC §4.3).
    async fn pace_describe(&mut self) {
        if let Some(at) = self.described_at {
            tokio::time::sleep_until(at + DESCRIBE_SPACING).await;
        }
        self.described_at = Some(Instant::now());
    }

    /// A full discovery merged into the graph; a failure warns and is counted.
    async fn rediscover(&mut self) -> Option<Discovery> {
        self.pace_describe().await;
        let discovered = discover(
            self.ctx.api.as_ref(),
            &self.ctx.stream_arn,
            &self.ctx.retry,
            &self.stop,
        )
        .await;
        // A listing of several pages ends later than it started: pace from its last page.
        self.described_at = Some(Instant::now());
        match discovered {
            Ok(discovery) => {
                self.disabled = discovery.status.as_deref() == Some("DISABLED");
                let new = self.graph.merge(discovery.shards.clone());
                if !new.is_empty() {
                    tracing::info!(
                        new = new.len(),
                        total = self.graph.len(),
                        "Shards discovered."
                    );
                }
                Some(discovery)
            }
            Err(ReadError::Cancelled) => None,
            Err(error) => {
                DiscoveryFailed { error: &error }.emit();
                None
            }
        }
    }

    /// Asks for the children of a drained shard at once (SPEC §4.3).
    async fn find_children(&mut self, shard: &ShardId) {
        if self.disabled {
            // A disabled stream gets no new shards: nothing to look for.
            return;
        }
        if self.child_filter_works {
            self.pace_describe().await;
            let arn = self.ctx.stream_arn.clone();
            let answer = self
                .ctx
                .retry
                .run(
                    "describe_stream",
                    || format!("DescribeStream {arn} (children of {shard})"),
                    &self.stop,
                    &NoObserver,
                    |_| self.ctx.api.describe_stream(&arn, None, Some(shard)),
                )
                .await;
            match answer {
                Ok(page) => {
                    self.graph.merge(page.shards);
                    return;
                }
                Err(ReadError::Request { error, .. }) if error.class == ErrorClass::Fatal => {
                    tracing::info!(error = %error, "The endpoint rejects the child-shard filter; using full discoveries.");
                    self.child_filter_works = false;
                }
                Err(_) => return,
            }
        }
        self.rediscover().await;
    }

    /// Every known shard is finished: re-discover; a disabled stream ends the run.
    async fn drained_stream(&mut self) -> Option<EndReason> {
        let graph = &self.graph;
        let unfinished = self
            .ctx
            .handover
            .with_view(|view| graph.ids().any(|id| !view.finished.contains(id)))
            .await;
        if unfinished {
            return None;
        }
        let discovery = self.rediscover().await?;
        let _ = self.admit().await;
        if discovery.status.as_deref() == Some("DISABLED") && self.scheduler.queued() == 0 {
            tracing::info!("Stream disabled and fully drained.");
            return Some(EndReason::StreamDisabled);
        }
        None
    }
}

/// What the running lag needs to know of one shard.
#[derive(Debug, Clone, Copy, Default)]
struct LagInfo {
    newest_ts_ms: Option<i64>,
    caught_up: bool,
}

/// Running lag in seconds (SPEC §4.11): over unfinished shards that read something, the age
/// of the newest record read; caught-up shards count 0. `None` when no shard qualifies.
fn running_lag<'a>(shards: impl Iterator<Item = &'a LagInfo>, now_ms: i64) -> Option<f64> {
    shards
        .filter_map(|info| {
            let ts = info.newest_ts_ms?;
            Some(if info.caught_up {
                0.0
            } else {
                ((now_ms - ts) as f64 / 1000.0).max(0.0)
            })
        })
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_lag_is_the_oldest_newest_record_and_caught_up_shards_count_zero() {
        let behind = LagInfo {
            newest_ts_ms: Some(10_000),
            caught_up: false,
        };
        let caught_up = LagInfo {
            newest_ts_ms: Some(1_000),
            caught_up: true,
        };
        let unread = LagInfo::default();
        assert_eq!(
            running_lag([behind, caught_up, unread].iter(), 25_000),
            Some(15.0)
        );
        assert_eq!(running_lag([caught_up].iter(), 25_000), Some(0.0));
        assert_eq!(running_lag([unread].iter(), 25_000), None);
        assert_eq!(
            running_lag([behind].iter(), 5_000),
            Some(0.0),
            "clamped at 0"
        );
    }
}
