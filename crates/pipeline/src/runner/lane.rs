//! A lane of batches into the sink, the one delivery loop under every run: a single process's
//! scan or stream, both sides of a scan and stream read together, a worker's leased units
//! (`crate::leased`). The lane cuts what is read into batches, hands a partial one over after
//! its linger, writes each batch, tells its acknowledgement and counts it; what differs between
//! runs is the lane's [`Commit`] side: where a batch's positions are committed (the run's
//! [`Checkpointer`]; a worker's lease rows) and whether a write may be refused by a fence.
//!
//! # Rules
//! 1. Batches are written one at a time, in the order they were cut, and the commit side
//!    commits a batch's positions only once the sink acknowledged it: what is committed is
//!    always an acknowledged prefix (docs/scan.md §2.5).
//! 2. A partial batch is handed over [`BATCH_LINGER`] after its first record or position.
//! 3. A lane cut by hand-over ([`Lane::by_hand_over`], for a sink that keeps lease fences) makes
//!    every hand-over a batch of its own: one unit's, written with that unit's fence.
//! 4. An acknowledged batch is told (`BatchAcknowledged`), counted and reported, and so is one
//!    handed out to the program driving the run ([`Wrote::HandedOut`]); one refused by its
//!    fence ([`Wrote::Fenced`]) or with nothing to write is not.
//! 5. On a failure the batch being assembled is dropped; what was acknowledged stays
//!    committed.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::RunError;
use crate::batch::{Batch, BatchLimits, Batcher};
use crate::checkpoint::Checkpointer;
use crate::events::BatchAcknowledged;
use crate::sink::Sink;

/// A batch is handed over at the latest this long after its first record or position.
pub(crate) const BATCH_LINGER: Duration = Duration::from_secs(1);

/// What became of a batch given to the sink.
pub(crate) enum Wrote {
    /// The sink acknowledged it, and the positions it reaches are committed.
    Acknowledged,
    /// It held nothing to write (positions only); the positions it reaches are committed.
    Nothing,
    /// Its fence holds a newer owner's counter: nothing was written or committed, and its unit
    /// is lost.
    Fenced,
    /// It was handed out to the program driving the run (`driven`): counted as written; its
    /// positions commit as its acknowledgement comes back.
    HandedOut,
}

/// The commit side of a lane: how a batch is written, and where the positions it reaches are
/// committed.
pub(crate) trait Commit: Send {
    /// Writes `batch` into `sink`, then commits the positions it reaches (rule 1); the write is
    /// the sink write in flight that `/health` watches (`health::Writing`).
    fn commit<S: Sink>(
        &mut self,
        sink: &mut S,
        batch: &Batch,
    ) -> impl Future<Output = Result<Wrote, RunError>> + Send;
}

/// A single process's lane commits to its checkpointer: the position goes into the sink's
/// transaction with the rows when the sink keeps it, else into the state file when due. A
/// driven run's checkpointer hands the batch out instead and commits as acknowledgements come
/// back (`driven`).
impl Commit for Checkpointer {
    async fn commit<S: Sink>(&mut self, sink: &mut S, batch: &Batch) -> Result<Wrote, RunError> {
        if self.is_driven() {
            return self.hand_out(batch).await;
        }
        let staged = self.stage(batch);
        let writing = ddbpipe_source::health::Writing::begin();
        sink.write(batch, staged.as_ref()).await?;
        self.acknowledged(batch, staged).await?;
        drop(writing);
        Ok(Wrote::Acknowledged)
    }
}

/// Told the lane's records written after each acknowledged batch, with its commit side.
pub(crate) type Report<'a, C> = dyn Fn(u64, &C) + Sync + 'a;

/// One flow of batches into the sink (module docs), committed through a `C`.
pub(crate) struct Lane<'a, C> {
    /// Where reads are cut into batches; the full ones go to [`deliver_all`](Self::deliver_all).
    pub(crate) batcher: Batcher,
    /// Every hand-over is a batch (rule 3).
    by_hand_over: bool,
    /// When the partial batch is handed over.
    deadline: Option<Instant>,
    /// Records written and acknowledged.
    pub(crate) written: u64,
    report: &'a Report<'a, C>,
}

impl<'a, C: Commit> Lane<'a, C> {
    /// A lane whose batches grow to `limits`.
    pub(crate) fn new(limits: BatchLimits, report: &'a Report<'a, C>) -> Self {
        Lane {
            batcher: Batcher::new(limits),
            by_hand_over: false,
            deadline: None,
            written: 0,
            report,
        }
    }

    /// A lane whose every hand-over is a batch of its own (rule 3).
    pub(crate) fn by_hand_over(report: &'a Report<'a, C>) -> Self {
        Lane {
            by_hand_over: true,
            ..Lane::new(BatchLimits::UNBOUNDED, report)
        }
    }

    /// Ready once the partial batch's linger is up; never while nothing waits.
    pub(crate) async fn lingered(&self) {
        match self.deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// Writes the batches a read filled, in order, then (cut by hand-over) what is left, and
    /// arms the linger timer for what waits.
    pub(crate) async fn deliver_all<S: Sink>(
        &mut self,
        to: &mut C,
        sink: &mut S,
        full: Vec<Batch>,
    ) -> Result<(), RunError> {
        for batch in full {
            self.deliver(to, sink, &batch).await?;
        }
        if self.by_hand_over
            && let Some(batch) = self.batcher.take()
        {
            self.deliver(to, sink, &batch).await?;
        }
        self.deadline = match (self.batcher.has_pending(), self.deadline) {
            (false, _) => None,
            (true, None) => Some(Instant::now() + BATCH_LINGER),
            (true, Some(at)) => Some(at),
        };
        Ok(())
    }

    /// Hands over the batch being assembled (its linger is up, or the run ends).
    pub(crate) async fn finish<S: Sink>(
        &mut self,
        to: &mut C,
        sink: &mut S,
    ) -> Result<(), RunError> {
        let batch = self.batcher.take();
        self.deliver_all(to, sink, batch.into_iter().collect())
            .await
    }

    /// Writes one batch and commits its positions; tells and counts it once acknowledged
    /// (rule 4).
    async fn deliver<S: Sink>(
        &mut self,
        to: &mut C,
        sink: &mut S,
        batch: &Batch,
    ) -> Result<(), RunError> {
        if let Wrote::Acknowledged | Wrote::HandedOut = to.commit(sink, batch).await? {
            BatchAcknowledged { batch }.emit();
            self.written += batch.records.len() as u64;
            (self.report)(self.written, to);
        }
        Ok(())
    }
}
