//! The lease keeper: renews a worker's leases on a timer of its own, the way KCL's lease
//! renewer does, so that a worker busy with its data (a slow sink write, a reader starved of
//! CPU) does not lose its leases while its process is alive (docs/coordination.md §11.4
//! rule 1).
//!
//! # Rules
//! 1. Each held lease is renewed once it was not written for a third of the duration; the
//!    keeper wakes when the first one is due, and a quarter of that later after a failure.
//! 2. A lease it cannot renew within a duration of its last write is lost: the keeper forgets
//!    it, so no checkpoint is written for it any more, and tells the caller, which stops the
//!    unit's reader. So does a renewal refused because another worker wrote the row.
//! 3. The keeper only renews: the caller's rounds still list, take and steal, and its
//!    checkpoints go through the same per-lease order (`holdings.rs`), so a checkpoint and a
//!    renewal never race on one counter.
//!
//! [`LeaseKeeper::pass`] is one wake, for callers that drive time themselves (the
//! simulation); [`LeaseKeeper::spawn`] runs the passes on a tokio task.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::decide::LocalTime;
use super::holdings::Lessee;
use super::table::{LeaseError, LeaseTable};
use super::worker::Lost;

/// Least wait between two passes, so a clock that stands still cannot spin the keeper.
const LEAST_WAIT: Duration = Duration::from_millis(10);

/// Renews one worker's leases: made by [`super::Worker::keeper`].
#[derive(Debug)]
pub struct LeaseKeeper<T> {
    lessee: Arc<Lessee<T>>,
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct KeeperPass {
    /// Work leases lost: stop these units.
    pub lost: Vec<Lost>,
    /// Transient failures; their leases are retried at `next`.
    pub transient: Vec<LeaseError>,
    /// When the next pass is due, on the worker's clock.
    pub next: LocalTime,
}

/// What a spawned keeper tells its caller.
#[derive(Debug)]
pub enum KeeperEvent {
    /// A lease is lost: stop its unit at once, without committing.
    Lost(Lost),
    /// A definite lease error (the table is gone, a counter cannot move on): the keeper has
    /// stopped; the run fails with it.
    Failed(LeaseError),
}

impl<T: LeaseTable> LeaseKeeper<T> {
    pub(super) fn new(lessee: Arc<Lessee<T>>) -> Self {
        LeaseKeeper { lessee }
    }

    /// One wake at `now`: forgets the leases not written for a duration, renews the due ones
    /// (rule 1) and says when to wake next. Only a fatal error ends it early.
    pub async fn pass(&self, now: LocalTime) -> Result<KeeperPass, LeaseError> {
        let renewed = self.lessee.renew_due(now).await?;
        let interval = self.lessee.settings.renew_interval();
        let retry = interval / 4;
        let next = self
            .lessee
            .held()
            .into_iter()
            .map(|(_, holding)| {
                if holding.unsettled {
                    now.plus(retry)
                } else {
                    holding.written_at.plus(interval)
                }
            })
            .fold(now.plus(interval), LocalTime::min)
            .max(now.plus(LEAST_WAIT));
        Ok(KeeperPass {
            lost: renewed
                .lost
                .into_iter()
                .filter(|lost| lost.unit.is_work())
                .collect(),
            transient: renewed.transient,
            next,
        })
    }

    /// Runs the passes on a tokio task, reading `clock` (the worker's, as its rounds read
    /// it), until the handle is dropped or a fatal error.
    pub fn spawn(self, clock: impl Fn() -> LocalTime + Send + Sync + 'static) -> KeeperHandle {
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(
            async move {
                loop {
                    let pass = match self.pass(clock()).await {
                        Ok(pass) => pass,
                        Err(error) => {
                            let _ = tx.send(KeeperEvent::Failed(error));
                            return;
                        }
                    };
                    for error in &pass.transient {
                        tracing::debug!(error = %error, "A lease renewal failed; retried soon.");
                    }
                    for lost in pass.lost {
                        if tx.send(KeeperEvent::Lost(lost)).is_err() {
                            return;
                        }
                    }
                    tokio::time::sleep(pass.next.since(clock())).await;
                }
            }
            .in_current_span(),
        );
        KeeperHandle { events, task }
    }
}

/// A running keeper: its events, and the task, stopped when the handle is dropped.
#[derive(Debug)]
pub struct KeeperHandle {
    events: mpsc::UnboundedReceiver<KeeperEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl KeeperHandle {
    /// The next event; pending for ever once the keeper stopped and every event was read.
    pub async fn next(&mut self) -> KeeperEvent {
        match self.events.recv().await {
            Some(event) => event,
            None => std::future::pending().await,
        }
    }
}

impl Drop for KeeperHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
