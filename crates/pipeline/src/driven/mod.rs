//! The commit side of a driven run: the lane's batches are handed out to the program that
//! drives the reading, and their positions commit as its acknowledgements come back, in any
//! order (docs/state.md §6.9). The same lane and runners as every other run: only the
//! lane's commit side differs (`runner/hand_out.rs`), through the
//! [`Checkpointer`](crate::checkpoint::Checkpointer) the run commits to.
//!
//! # Rules
//! 1. A batch with records is handed out ([`Delivered`]) with its [`Ack`]; a batch of
//!    positions only is acknowledged at once. The positions commit per unit as `window`
//!    decides (an acknowledged prefix of each segment and shard, children after their
//!    parents' ends), and are written when due, like an acknowledged batch's.
//! 2. At most `window` batches are held (handed out and not yet committed): the lane waits for
//!    room while the window is full, so reading waits too (backpressure).
//! 3. An [`Ack`] dropped without [`Ack::ack`] (or failed with [`Ack::fail`]) is never
//!    acknowledged: its units commit nothing from it on, and the run fails with an error
//!    naming the batch (or the program's) at its next step (the next hand-out,
//!    acknowledgement or end). After a stop, a dropped batch is only not acknowledged.
//! 4. What is not a per-unit mark commits only once every batch before it is acknowledged: a
//!    run's end (a scan's completion, a snapshot's or repair's close, the final write) first
//!    waits until no batch is out ([`Driven::drain`]).
//! 5. A stop (`stop`) hands out nothing more: a batch cut after it is lost (its units commit
//!    nothing from it on), and the run's end waits for no batch still out: what was
//!    acknowledged by then is saved, the rest is delivered again by the next run.
//! 6. When the run's last reading ended (a scan's or query's, the stream's; not a snapshot's
//!    or repair's, which the stream follows) or it stops, the receiver is told at once that
//!    nothing more comes ([`Receiver::next`] returns `None`), while the run's end waits for
//!    the batches still out: a loop holding some can then acknowledge them.

mod window;

use std::num::NonZeroUsize;
use std::sync::Arc;

use ddbpipe_source::records::Lines;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use tokio::sync::mpsc;

pub use self::window::BatchNumber;
use self::window::{Fate, Window};
use crate::batch::Batch;
use crate::sink::{SinkError, SinkErrorClass};

/// The window of batches a driven run holds unless told otherwise (rule 2).
pub const DEFAULT_WINDOW: NonZeroUsize = NonZeroUsize::new(16).expect("16 is not zero");

/// Where a driven run hands its batches: given to the run's checkpointer
/// ([`Checkpointer::with_hand_out`](crate::checkpoint::Checkpointer::with_hand_out)).
#[derive(Debug, Clone)]
pub struct HandOut {
    tx: mpsc::Sender<Delivered>,
    window: NonZeroUsize,
    stop: Cancel,
    /// Signals that also mean a stop for a batch dropped after them (rule 3): the program's
    /// own, which reaches `stop` a moment later.
    also_stopped_by: Vec<Cancel>,
    /// Tells the receiver that nothing more will be handed out (rule 6).
    ended: Arc<CancelHandle>,
    /// Names the receiver in errors ("custom batches").
    sink: String,
}

impl HandOut {
    /// A hand-out holding at most `window` batches, which hands out nothing once `stop` fires,
    /// and the receiving end of its batches. `sink` names the receiver in errors.
    pub fn new(window: NonZeroUsize, stop: Cancel, sink: impl Into<String>) -> (HandOut, Receiver) {
        let (tx, batches) = mpsc::channel(window.get());
        let (ended, reading_ended) = Cancel::new();
        let out = HandOut {
            tx,
            window,
            stop,
            also_stopped_by: Vec::new(),
            ended: Arc::new(ended),
            sink: sink.into(),
        };
        let receiver = Receiver {
            batches,
            reading_ended,
        };
        (out, receiver)
    }

    /// A batch dropped once `stop` fired is only not acknowledged, as after the run's own stop
    /// (rule 3): for a signal that reaches the run's stop through another task.
    pub fn also_stopped_by(mut self, stop: Cancel) -> HandOut {
        self.also_stopped_by.push(stop);
        self
    }

    /// Whether the run stops.
    fn stopping(&self) -> bool {
        self.stop.is_cancelled() || self.also_stopped_by.iter().any(Cancel::is_cancelled)
    }
}

/// The receiving end of a [`HandOut`].
#[derive(Debug)]
pub struct Receiver {
    batches: mpsc::Receiver<Delivered>,
    reading_ended: Cancel,
}

impl Receiver {
    /// The next batch; `None` once nothing more will be handed out: the run's last reading
    /// ended (its end then waits for the batches still out), or the run itself ended.
    pub async fn next(&mut self) -> Option<Delivered> {
        tokio::select! {
            biased;
            delivered = self.batches.recv() => delivered,
            // Every batch was sent before the end was told: what is queued comes first.
            () = self.reading_ended.cancelled() => self.batches.try_recv().ok(),
        }
    }

    /// Whether the run told that nothing more comes (rule 6); `false` when the run ended
    /// without telling (a failure).
    pub fn reading_ended(&self) -> bool {
        self.reading_ended.is_cancelled()
    }

    /// Takes nothing more: batches handed out later are not delivered.
    pub fn close(&mut self) {
        self.batches.close();
    }
}

/// A batch handed out: its records and what acknowledges it.
#[derive(Debug)]
pub struct Delivered {
    /// The records, in the order they were read.
    pub records: Lines,
    /// Acknowledges the batch; dropped unused, it fails the run (rule 3).
    pub ack: Ack,
}

/// The acknowledgement of one handed-out batch, to be used once.
#[derive(Debug)]
pub struct Ack {
    number: BatchNumber,
    tx: Option<mpsc::UnboundedSender<Settled>>,
}

impl Ack {
    /// The batch's number in the order the run cut them, from 1.
    pub fn number(&self) -> BatchNumber {
        self.number
    }

    /// Whether the run still waits for this acknowledgement (it has not ended).
    pub fn is_awaited(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// The batch is done: its positions may commit (rule 1).
    pub fn ack(mut self) {
        self.send(Settled::Acknowledged);
    }

    /// The batch failed: it is never acknowledged and the run ends with `error` (rule 3).
    pub fn fail(mut self, error: SinkError) {
        self.send(|number| Settled::Failed(number, error));
    }

    fn send(&mut self, settled: impl FnOnce(BatchNumber) -> Settled) {
        if let Some(tx) = self.tx.take() {
            // A run that ended waits for nothing: the acknowledgement has no use.
            let _ = tx.send(settled(self.number));
        }
    }
}

/// Dropped unused: whether that fails the run (before a stop) or only leaves the batch
/// unacknowledged (after one) is the run's to judge when it takes the notice (rule 3): a stop
/// that fired by the drop has fired by then too.
impl Drop for Ack {
    fn drop(&mut self) {
        self.send(Settled::Dropped);
    }
}

/// What became of a handed-out batch.
#[derive(Debug)]
pub(crate) enum Settled {
    Acknowledged(BatchNumber),
    Dropped(BatchNumber),
    Failed(BatchNumber, SinkError),
}

/// The driven commit side's state, held by the run's checkpointer.
#[derive(Debug)]
pub(crate) struct Driven {
    out: HandOut,
    acks: mpsc::UnboundedSender<Settled>,
    settled: mpsc::UnboundedReceiver<Settled>,
    window: Window,
    /// The first batch never acknowledged, and why (rule 3).
    failure: Option<SinkError>,
}

impl Driven {
    pub(crate) fn new(out: HandOut) -> Driven {
        let (acks, settled) = mpsc::unbounded_channel();
        Driven {
            out,
            acks,
            settled,
            window: Window::default(),
            failure: None,
        }
    }

    /// Hands `batch` out once the window has room (rules 1, 2 and 5); returns whether it was
    /// handed out. Positions that may commit meanwhile are added to `ready`.
    pub(crate) async fn hand_out(
        &mut self,
        batch: &Batch,
        ready: &mut Batch,
    ) -> Result<bool, SinkError> {
        self.take_settled(ready);
        if batch.records.is_empty() {
            self.window.push(batch, Fate::Acknowledged);
            append(ready, self.window.ready());
            return self.failed().map(|()| false);
        }
        while self.window.len() >= self.out.window.get() && !self.out.stop.is_cancelled() {
            self.failed()?;
            tokio::select! {
                settled = self.settled.recv() => self.apply(settled, ready),
                () = self.out.stop.cancelled() => {}
            }
        }
        self.failed()?;
        if self.out.stop.is_cancelled() {
            self.window.push(batch, Fate::Lost);
            return Ok(false);
        }
        let number = self.window.push(batch, Fate::Out);
        let delivered = Delivered {
            records: batch.records.clone(),
            ack: Ack {
                number,
                tx: Some(self.acks.clone()),
            },
        };
        let sent = tokio::select! {
            sent = self.out.tx.send(delivered) => sent.is_ok(),
            () = self.out.stop.cancelled() => false,
        };
        if !sent {
            // The receiver is gone or the run stops: the batch was not delivered.
            self.window.settle(number, Fate::Lost);
        }
        Ok(sent)
    }

    /// The next acknowledgement (or loss) of a batch; never resolves while none is out.
    /// Cancel-safe: a run's loop waits for it beside its reads.
    pub(crate) async fn next_settled(&mut self) -> Option<Settled> {
        if !self.window.any_out() {
            return std::future::pending().await;
        }
        self.settled.recv().await
    }

    /// Applies an acknowledgement from [`next_settled`](Self::next_settled): the positions it
    /// frees are added to `ready`.
    pub(crate) fn settle(
        &mut self,
        settled: Option<Settled>,
        ready: &mut Batch,
    ) -> Result<(), SinkError> {
        self.apply(settled, ready);
        self.take_settled(ready);
        self.failed()
    }

    /// Waits until no batch is out (rule 4), unless the run stops (rule 5); the positions
    /// freed are added to `ready`. `last`: the run reads nothing after (rule 6).
    pub(crate) async fn drain(&mut self, ready: &mut Batch, last: bool) -> Result<(), SinkError> {
        if last || self.out.stop.is_cancelled() {
            self.out.ended.cancel();
        }
        self.take_settled(ready);
        while self.window.any_out() && !self.out.stop.is_cancelled() {
            self.failed()?;
            tokio::select! {
                settled = self.settled.recv() => self.apply(settled, ready),
                () = self.out.stop.cancelled() => {}
            }
        }
        self.give_up(ready);
        self.failed()
    }

    /// Whether every batch handed out is committed (none is held).
    pub(crate) fn all_committed(&self) -> bool {
        self.window.len() == 0
    }

    /// The run ends now (a failure, a stop): what was acknowledged commits, batches still out
    /// are lost.
    pub(crate) fn give_up(&mut self, ready: &mut Batch) {
        self.take_settled(ready);
        self.window.lose_out();
        append(ready, self.window.ready());
    }

    fn take_settled(&mut self, ready: &mut Batch) {
        while let Ok(settled) = self.settled.try_recv() {
            self.apply(Some(settled), ready);
        }
    }

    fn apply(&mut self, settled: Option<Settled>, ready: &mut Batch) {
        let Some(settled) = settled else { return };
        let (number, fate) = match settled {
            Settled::Acknowledged(number) => (number, Fate::Acknowledged),
            // After a stop a batch dropped is only not acknowledged (rule 3).
            Settled::Dropped(number) if self.out.stopping() => (number, Fate::Lost),
            Settled::Dropped(number) => {
                self.fail_with(SinkError {
                    sink: self.out.sink.clone(),
                    message: format!(
                        "batch {number} was dropped without ack(): it is not acknowledged, so \
                         the position of its segments or shards stays before it"
                    ),
                    class: SinkErrorClass::Transient,
                });
                (number, Fate::Lost)
            }
            Settled::Failed(number, error) => {
                self.fail_with(error);
                (number, Fate::Lost)
            }
        };
        self.window.settle(number, fate);
        append(ready, self.window.ready());
    }

    fn fail_with(&mut self, error: SinkError) {
        self.failure.get_or_insert(error);
    }

    fn failed(&mut self) -> Result<(), SinkError> {
        match self.failure.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// Appends the positions of `more` to `to`, in order.
fn append(to: &mut Batch, more: Batch) {
    to.segments.extend(more.segments);
    to.shards.extend(more.shards);
}
