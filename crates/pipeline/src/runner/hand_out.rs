//! A driven run's commit side (`crate::driven`): it hands the lane's batches out and applies
//! the positions their acknowledgements free, written when due like any acknowledged batch's.
//! A checkpointer without a hand-out does none of this: every method here is then a no-op.

use super::{RunError, Wrote};
use crate::batch::Batch;
use crate::checkpoint::Checkpointer;
use crate::driven::{Driven, HandOut, Settled};
use crate::sink::SinkError;

impl Checkpointer {
    /// Hands the run's batches out to `out` instead of writing them into the sink; positions
    /// commit as acknowledgements come back (docs/state.md §6.9). `None`: an ordinary run.
    pub fn with_hand_out(mut self, out: Option<HandOut>) -> Self {
        self.driven = out.map(Driven::new);
        self
    }

    /// Whether the run's batches are handed out.
    pub(crate) fn is_driven(&self) -> bool {
        self.driven.is_some()
    }

    /// Hands `batch` out (the lane's commit of a driven run).
    pub(crate) async fn hand_out(&mut self, batch: &Batch) -> Result<Wrote, RunError> {
        let Some(driven) = self.driven.as_mut() else {
            return Ok(Wrote::Nothing);
        };
        let mut ready = Batch::default();
        let handed = driven.hand_out(batch, &mut ready).await;
        let handed = self.commit_ready(ready, handed).await?;
        Ok(if handed {
            Wrote::HandedOut
        } else {
            Wrote::Nothing
        })
    }

    /// The next acknowledgement of a handed-out batch; never resolves in an ordinary run or
    /// while no batch is out. Cancel-safe.
    pub(crate) async fn next_settled(&mut self) -> Option<Settled> {
        match self.driven.as_mut() {
            Some(driven) => driven.next_settled().await,
            None => std::future::pending().await,
        }
    }

    /// Commits what an acknowledgement from [`next_settled`](Self::next_settled) frees.
    pub(crate) async fn settled(&mut self, settled: Option<Settled>) -> Result<(), RunError> {
        let Some(driven) = self.driven.as_mut() else {
            return Ok(());
        };
        let mut ready = Batch::default();
        let result = driven.settle(settled, &mut ready);
        self.commit_ready(ready, result).await
    }

    /// Waits until every handed-out batch is acknowledged (or the run stops) and commits what
    /// they free: a run's end commits only after every batch before it. `true` when every
    /// batch committed (always, in an ordinary run).
    pub(crate) async fn drain_handed(&mut self) -> Result<bool, RunError> {
        // A snapshot's or repair's reading is followed by the stream's.
        let last = !(self.snapshot_open() || self.repair_open());
        let Some(driven) = self.driven.as_mut() else {
            return Ok(true);
        };
        let mut ready = Batch::default();
        let result = driven.drain(&mut ready, last).await;
        let drained = driven.all_committed();
        self.commit_ready(ready, result).await?;
        Ok(drained)
    }

    /// The run ends now: what was acknowledged commits, batches still out are lost.
    pub(crate) async fn give_up_handed(&mut self) -> Result<(), RunError> {
        let Some(driven) = self.driven.as_mut() else {
            return Ok(());
        };
        let mut ready = Batch::default();
        driven.give_up(&mut ready);
        self.acknowledged(&ready, None).await?;
        Ok(())
    }

    /// Applies the freed positions `ready`; when `result` failed, gives up the batches still
    /// out and writes what was acknowledged before returning the failure.
    async fn commit_ready<T>(
        &mut self,
        ready: Batch,
        result: Result<T, SinkError>,
    ) -> Result<T, RunError> {
        self.acknowledged(&ready, None).await?;
        if result.is_err() {
            self.give_up_handed().await?;
            self.flush().await?;
        }
        Ok(result?)
    }
}
