//! The stream read loop: admission, the scheduler, the slices and the run's end.
//!
//! # Ordering (docs/streams.md §4.8)
//! 1. A shard is admitted only when its parent is absent, finished in the handed-over view,
//!    or an orphan; a child is therefore read only after its parent's last record was handed
//!    over, and the sequential sink acknowledges it after them.
//! 2. Admission runs at start, after each shard drains, and after each answer of the shard
//!    syncer (`shard_sync`).
//! 3. A drained shard gives its read slot back at once. When none of its children is known
//!    (and the stream is not disabled), the syncer looks them up, batched with the other
//!    shards that drained meanwhile; the loop goes on reading while it does.
//!
//! # Run end (docs/streams.md §4.10)
//! 1. `max_messages` records handed over, a stop signal, or a disabled stream whose every
//!    shard is finished. With `follow`, only a signal or a disabled, drained stream ends it.
//! 2. *Idle* means both of:
//!    - no record was read (and no hand-over waited for the sink) for
//!      `idle_termination_secs`, by the handover's idle clock;
//!    - no admissible shard may have unread records: every admitted shard that is queued or
//!      being read is caught up (its last two reads answered nothing), and no drained shard's
//!      children lookup is pending or running. Shards waiting for an unfinished parent count
//!      through that parent.
//!
//!    So a shard waiting for a slot, one not read yet, or one throttled before it caught up
//!    keeps the run going; idle termination then ends it once the last of them caught up.
//!
//! # Discovery (docs/streams.md §4.3)
//! Every `DescribeStream` after the start-up listing is the shard syncer's (`shard_sync`):
//! children lookups of drained shards, a full listing every `discovery_interval`, and one when
//! nothing is left to read and every known shard is finished.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::handover::{Handed, StreamMark};
use super::lineage::{self, ShardGraph};
use super::shard_reader::{ShardState, SliceEnd, StreamContext, StreamError};
use super::shard_sync::{ShardSyncer, Synced};
use super::start::{ShardStart, start_for};
use crate::api::{StartAt, StreamsApi};
use crate::clock::unix_now_ms;
use crate::config::StartPosition;
use crate::error::ReadError;
use crate::events::{LagMeasured, ShardsCounted};
use crate::ids::ShardId;
use crate::position::{ShardProgress, StreamsPosition};
use crate::retry::Cancel;

/// How a stream run is bounded.
#[derive(Debug, Clone)]
pub struct RunBounds {
    /// Shards read at once.
    pub shard_concurrency: usize,
    /// Full re-discovery period.
    pub discovery_interval: Duration,
    /// End after this long without a record (see the module docs for *idle*).
    pub idle_termination: Option<Duration>,
    /// Run until stopped.
    pub follow: bool,
}

/// Why a stream run ended cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// `max_messages` records were handed over.
    MaxMessages,
    /// The run was idle (see the module docs).
    Idle,
    /// A signal asked the run to stop.
    Stopped,
    /// The stream is disabled and every shard is finished.
    StreamDisabled,
}

/// The marks a first run commits before reading (docs/streams.md §4.4): every shard described at the
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
    /// Read states of the shards queued (or waiting for their parent), not being read.
    states: HashMap<ShardId, ShardState>,
    scheduler: super::scheduler::Scheduler,
    /// Every `DescribeStream` after the start-up listing.
    syncer: ShardSyncer<A>,
    /// Shards being read now that were not caught up when their slice started.
    reading_unread: HashSet<ShardId>,
    lag: HashMap<ShardId, LagInfo>,
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
        // The start-up discovery has just listed the stream: the syncer paces from now.
        let syncer = ShardSyncer::new(Arc::clone(&ctx), stop.clone());
        let mut engine = StreamEngine {
            scheduler: super::scheduler::Scheduler::new(bounds.shard_concurrency),
            ctx,
            bounds,
            graph,
            start_position,
            run_start_ms,
            states: HashMap::new(),
            syncer,
            reading_unread: HashSet::new(),
            lag: HashMap::new(),
            waiting: Vec::new(),
            disabled: false,
            stop,
        };
        let graph = &engine.graph;
        let readable: Vec<(ShardId, ShardProgress, bool)> = engine
            .ctx
            .handover
            .with_view(|view| {
                view.open_shards()
                    .map(|(id, progress)| {
                        // A described parent that is not finished is read first.
                        let parent_unfinished = graph
                            .get(id)
                            .and_then(|shard| shard.parent.as_ref())
                            .is_some_and(|p| graph.contains(p) && !view.is_finished(p));
                        (id.clone(), progress.clone(), parent_unfinished)
                    })
                    .collect()
            })
            .await;
        let now = Instant::now();
        for (id, progress, parent_unfinished) in readable {
            if !engine.graph.contains(&id) {
                continue;
            }
            let (start, floor) = match progress {
                ShardProgress::After(seq) => (StartAt::After(seq), None),
                ShardProgress::ShardEnd { .. } => continue,
                ShardProgress::TrimHorizon { floor_ms, .. } => {
                    let first_latest = first_run && floor_ms.is_some();
                    if first_latest {
                        (StartAt::Latest, floor_ms)
                    } else {
                        (StartAt::TrimHorizon, floor_ms)
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

    /// Runs until an end condition; in-flight slices and lookups are cancelled when it returns.
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
                if !state.caught_up {
                    self.reading_unread.insert(id);
                }
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
                && !self.may_have_unread()
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
                .with_view(|view| view.finished().count())
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
            // Nothing to read and no children lookup left: when every known shard is
            // finished, list the stream for new shards (or a disabled status, which ends it).
            let drain_check = slices.is_empty()
                && self.scheduler.queued() == 0
                && !self.syncer.children_pending();
            if drain_check && now >= next_drain_check {
                next_drain_check = now + self.ctx.reads.poll_interval;
                if self.every_shard_finished().await {
                    self.syncer.want_listing();
                }
            }
            if now >= next_discovery {
                next_discovery = now + self.bounds.discovery_interval;
                self.syncer.want_listing();
            }
            let mut wake = next_discovery.min(now + Duration::from_secs(1));
            if let Some(due) = self.scheduler.next_due() {
                wake = wake.min(due.max(now));
            }
            if drain_check {
                wake = wake.min(next_drain_check);
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Ok(EndReason::Stopped),
                synced = self.syncer.next(), if self.syncer.busy() => {
                    let listed = self.merge_synced(synced?);
                    self.admit().await?;
                    if listed
                        && self.disabled
                        && slices.is_empty()
                        && self.scheduler.queued() == 0
                        && self.every_shard_finished().await
                    {
                        tracing::info!("Stream disabled and fully drained.");
                        return Ok(EndReason::StreamDisabled);
                    }
                }
                joined = slices.join_next(), if !slices.is_empty() => {
                    let Some(joined) = joined else { continue };
                    let mut ended = vec![joined];
                    while let Some(more) = slices.try_join_next() {
                        ended.push(more);
                    }
                    let mut drained_any = false;
                    for joined in ended {
                        self.scheduler.release();
                        let (state, end) = joined.map_err(|error| {
                            StreamError::Read(ReadError::Internal(format!("shard slice task failed: {error}")))
                        })?;
                        self.reading_unread.remove(&state.id);
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
                                // The slot is free already; the children are the syncer's.
                                let id = state.id;
                                self.lag.remove(&id);
                                self.release_children(&id);
                                if !self.disabled && self.graph.children_of(&id).is_empty() {
                                    self.syncer.want_children(id);
                                }
                                drained_any = true;
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
                    if drained_any {
                        self.admit().await?;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Whether an admissible shard may still have unread records (run end rule 2): a children
    /// lookup is pending or running, or a queued or active shard is not caught up.
    fn may_have_unread(&self) -> bool {
        self.syncer.children_pending()
            || !self.reading_unread.is_empty()
            || self
                .states
                .iter()
                .any(|(id, state)| !state.caught_up && !self.waiting.contains(id))
    }

    /// Whether every described shard is finished in the handed-over view.
    async fn every_shard_finished(&self) -> bool {
        let graph = &self.graph;
        self.ctx
            .handover
            .with_view(|view| graph.ids().all(|id| view.is_finished(id)))
            .await
    }

    /// Merges what the syncer learnt into the graph; `true` when it held a full listing.
    fn merge_synced(&mut self, synced: Synced) -> bool {
        let mut shards = synced.children;
        let listed = match synced.listing {
            Some(listing) => {
                self.disabled = listing.status.as_deref() == Some("DISABLED");
                shards.extend(listing.shards);
                true
            }
            None => false,
        };
        let new = self.graph.merge(shards);
        if !new.is_empty() {
            tracing::info!(
                new = new.len(),
                total = self.graph.len(),
                "Shards discovered."
            );
        }
        listed
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
                        let verified_at = a.inherited_verified_at(view);
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
}

/// What the running lag needs to know of one shard.
#[derive(Debug, Clone, Copy, Default)]
pub struct LagInfo {
    /// `ts_ms` of the newest record it read.
    pub newest_ts_ms: Option<i64>,
    /// Its last two reads answered nothing.
    pub caught_up: bool,
}

/// Running lag in seconds (docs/streams.md §4.11): over unfinished shards that read something, the age
/// of the newest record read; caught-up shards count 0, read or not (issue 24 item 20: an
/// export mirror's stream phase, caught up with nothing new, kept the lag measured while it
/// caught up beside the snapshot). `None` when no shard qualifies.
pub fn running_lag<'a>(shards: impl Iterator<Item = &'a LagInfo>, now_ms: i64) -> Option<f64> {
    shards
        .filter_map(|info| {
            if info.caught_up {
                return Some(0.0);
            }
            let ts = info.newest_ts_ms?;
            Some(((now_ms - ts) as f64 / 1000.0).max(0.0))
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
        // Caught up without a record read (a stream resumed where it stood, nothing new): 0,
        // which replaces the last value measured.
        let caught_up_unread = LagInfo {
            newest_ts_ms: None,
            caught_up: true,
        };
        assert_eq!(running_lag([caught_up_unread].iter(), 25_000), Some(0.0));
        assert_eq!(
            running_lag([behind].iter(), 5_000),
            Some(0.0),
            "clamped at 0"
        );
    }
}
