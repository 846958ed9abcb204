//! Drive the reading yourself (docs/state.md §6.9): a pipeline's batches come to your own loop
//! through [`Batches`], and each [`Batch`] is done when you call [`Batch::ack`] — in any order,
//! from any task. It is the run [`Pipeline::run`] does with a custom sink, only the
//! acknowledgement is yours.
//!
//! # What is saved
//! The position saved is, for each scan segment and each stream shard, its acknowledged
//! prefix: a batch acknowledged before an earlier one commits what it reached of the segments
//! and shards the earlier batch does not hold; a segment or shard never moves past a batch not
//! yet acknowledged; a child shard commits nothing before its parent's batches are all
//! committed. A scan's end (the position cleared) and a snapshot's or repair's close wait until
//! every batch is acknowledged.
//!
//! # The window
//! At most [`Pipeline::with_ack_window`] batches ([`DEFAULT_WINDOW`] unless set) are held —
//! handed to you and not yet committed. While the window is full, reading waits: memory stays
//! bounded however slow your loop is. A batch you hold unacknowledged keeps at most a window
//! of later batches waiting.
//!
//! # A batch not acknowledged
//! A [`Batch`] dropped without [`Batch::ack`], or given up with [`Batch::fail`], is not
//! acknowledged: its segments and shards commit nothing from it on, and the run fails at its
//! next step — [`Batches::next`] returns the error (naming the batch, or yours), and so does
//! [`Batches::finish`]. A rerun delivers the batch again.
//!
//! # Stopping
//! When the run's [`Cancel`] fires, nothing more is handed out: [`Batches::next`] returns
//! `None`, and [`Batches::finish`] saves what was acknowledged by then and says
//! [`Ended::Stopped`](crate::Ended::Stopped). Batches you still hold are delivered again by the
//! next run. [`Batches::finish`] before the batches ended stops the run the same way.
//!
//! # The summary
//! [`Summary::written`](crate::Summary::written) counts the records handed out; after a stop,
//! some of them may not have been acknowledged (they are delivered again by the next run).
//!
//! # Holding batches
//! Batches may be acknowledged from other tasks while the loop goes on. A loop that holds
//! batches itself while it awaits the next one must acknowledge them before the window is
//! full, and before a mirror's snapshot (or a repair) ends: the stream that follows begins only
//! once every snapshot batch is acknowledged, as a scan's end (the position cleared) is
//! committed only then.
//!
//! [`Pipeline::run`]: crate::Pipeline::run
//! [`Pipeline::with_ack_window`]: crate::Pipeline::with_ack_window

use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_pipeline::driven::{Ack, Receiver};
use ddbpipe_pipeline::sink::{Records, SinkError as PipelineSinkError};
use ddbpipe_source::config::Mode;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::error::Error;
use crate::failure::Failure;
use crate::given::Given;
use crate::origin::Origin;
use crate::sink::{self, Record, SinkError};
use crate::sinks::SinkConfig;
use crate::summary::Summary;

/// How many batches a driven run holds unless told otherwise ([`Pipeline::with_ack_window`]).
///
/// [`Pipeline::with_ack_window`]: crate::Pipeline::with_ack_window
pub const DEFAULT_WINDOW: NonZeroUsize = ddbpipe_pipeline::driven::DEFAULT_WINDOW;

/// The name a driven run gives its records' receiver: in messages, and in the identity of its
/// position (`sink_path: custom batches`, docs/state.md §6.2).
pub(crate) const SINK_NAME: &str = "batches";

/// The batches of a running pipeline ([`Pipeline::batches`](crate::Pipeline::batches)), in
/// the order they were read.
#[derive(Debug)]
pub struct Batches {
    delivered: Receiver,
    records: Records,
    /// [`Batches::next`] returned `None`: nothing more comes.
    reading_ended: bool,
    run: Option<JoinHandle<Result<Summary, Failure>>>,
    /// The run's end, once [`Batches::next`] saw it.
    ended: Option<Result<Summary, Failure>>,
    /// Stops the run (the caller's `Cancel`, forwarded, or [`Batches::finish`]).
    stop: Arc<CancelHandle>,
    forward: JoinHandle<()>,
}

impl Batches {
    /// Opens `config`'s run with `given` and starts it, handing its batches out; `stop` stops
    /// it. A problem found while opening comes back here, before a record is read.
    pub(crate) async fn start(
        config: &PipelineConfig,
        origin: &Origin,
        given: &Given,
        progress: ProgressMode,
        window: NonZeroUsize,
        stop: Cancel,
    ) -> Result<Batches, Error> {
        refuse(config, given).map_err(Error)?;
        let (handle, run_stop) = Cancel::new();
        let handle = Arc::new(handle);
        let forwarded = Arc::clone(&handle);
        let program_stop = stop.clone();
        let forward = tokio::spawn(async move {
            stop.cancelled().await;
            forwarded.cancel();
        });
        let sink = format!("custom {SINK_NAME}");
        let (out, delivered) =
            ddbpipe_pipeline::driven::HandOut::new(window, run_stop.clone(), sink);
        let out = out.also_stopped_by(program_stop);
        let mut given = given.clone();
        given.sink = Some(sink::GivenSink::new(HandedOut));
        given.driven = Some(out);
        let (config, origin) = (config.clone(), origin.clone());
        let records = match config.source.mode {
            Mode::Scan | Mode::Query => Records::Items,
            Mode::Streams | Mode::Mirror => Records::Envelopes,
        };
        let (opened_tx, opened) = oneshot::channel();
        let run = spawn_run(config, origin, given, progress, run_stop, opened_tx);
        let batches = Batches {
            delivered,
            records,
            reading_ended: false,
            run: Some(run),
            ended: None,
            stop: handle,
            forward,
        };
        match opened.await {
            Ok(None) => Ok(batches),
            Ok(Some(failure)) => Err(Error(failure)),
            Err(_) => Err(Error(Failure::runtime(anyhow!(
                "internal error: the run's task ended while it opened"
            )))),
        }
    }

    /// The next batch; `None` once nothing more comes: the run read all it reads (every
    /// segment, an end condition of the stream) or stopped. A run that failed ends the batches
    /// with its error (once). [`Batches::finish`] then says how the run ended.
    pub async fn next(&mut self) -> Option<Result<Batch, Error>> {
        if self.ended.is_some() || self.reading_ended {
            return None;
        }
        while let Some(delivered) = self.delivered.next().await {
            // A batch handed out before the run failed: nothing would take its acknowledgement.
            if delivered.ack.is_awaited() {
                return Some(Ok(Batch {
                    batch: sink::Batch::of(delivered.records, self.records),
                    ack: delivered.ack,
                }));
            }
        }
        self.reading_ended = true;
        // The run's end waits for the batches still held: it is awaited by `finish`, unless it
        // is over already (a failure).
        if self.delivered.reading_ended() {
            return None;
        }
        let ended = self.join().await;
        let failed = ended.as_ref().err().map(duplicate);
        self.ended = Some(ended);
        failed.map(|failure| Err(Error(failure)))
    }

    /// Waits for the run to end and returns how it ended ([`crate::Ended::Stopped`] after a
    /// stop; the error of a failed run, a batch dropped unacknowledged among them).
    ///
    /// After [`Batches::next`] returned `None`, the run's end waits until every batch still
    /// held is acknowledged or dropped (a scan's end clears the position only then): hold
    /// none in the task that awaits this. Called before, it stops the run first, and batches
    /// still held are not waited for: what was acknowledged is saved, the rest is delivered
    /// again by the next run.
    pub async fn finish(mut self) -> Result<Summary, Error> {
        if self.ended.is_none() {
            if !self.reading_ended {
                self.stop.cancel();
            }
            self.delivered.close();
            // Batches handed out and never taken are not acknowledged.
            while self.delivered.next().await.is_some() {}
            let ended = self.join().await;
            self.ended = Some(ended);
        }
        match self.ended.take() {
            Some(ended) => ended.map_err(Error),
            None => Err(Error(Failure::runtime(anyhow!(
                "internal error: a driven run ended without a result"
            )))),
        }
    }

    async fn join(&mut self) -> Result<Summary, Failure> {
        let Some(run) = self.run.take() else {
            return Err(Failure::runtime(anyhow!(
                "internal error: a driven run was awaited twice"
            )));
        };
        match run.await {
            Ok(ended) => ended,
            Err(error) => Err(Failure::runtime(anyhow!(
                "internal error: the run's task failed: {error}"
            ))),
        }
    }
}

impl Drop for Batches {
    /// Dropped unfinished, the run is stopped (what was acknowledged is saved) and not awaited.
    fn drop(&mut self) {
        self.forward.abort();
        self.stop.cancel();
    }
}

/// One batch of a driven run: its records, and the acknowledgement that is yours to give.
///
/// Acknowledge it with [`Batch::ack`] once its records are done with (written, processed); it
/// may move to another task first. Dropped unacknowledged it is not acknowledged, and the run
/// fails (module docs).
#[derive(Debug)]
pub struct Batch {
    batch: sink::Batch,
    ack: Ack,
}

impl Batch {
    /// The records, in the order they were read.
    pub fn records(&self) -> &[Record] {
        self.batch.records()
    }

    /// How many records.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether it holds no record (never: a batch of positions only is not handed out).
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Its number in the order the run cut its batches, from 1: batch 3 was read before
    /// batch 4.
    pub fn number(&self) -> u64 {
        self.ack.number()
    }

    /// The records as a [`sink::Batch`], for code written for a [`sink::Sink`].
    pub fn as_sink_batch(&self) -> &sink::Batch {
        &self.batch
    }

    /// The batch is done: the position may advance past it (per segment or shard, once the
    /// batches before it there are acknowledged too).
    pub fn ack(self) {
        self.ack.ack();
    }

    /// The batch failed: it is not acknowledged, and the run fails with `error` (a
    /// [`SinkError::transient`] one says that a rerun resumes: it delivers the batch again).
    pub fn fail(self, error: SinkError) {
        self.ack.fail(PipelineSinkError {
            sink: format!("custom {SINK_NAME}"),
            class: error.class(),
            message: error.to_string(),
        });
    }
}

/// The sink of a driven run: its batches are handed out by the run's commit side, never
/// written here; it names the receiver in the position's identity.
struct HandedOut;

impl sink::Sink for HandedOut {
    fn describe(&self) -> String {
        SINK_NAME.to_string()
    }

    async fn write(&mut self, _batch: &sink::Batch) -> Result<(), SinkError> {
        Err(SinkError::definite(
            "internal error: a driven run's batches are handed out, not written",
        ))
    }
}

/// A driven run reads into `sink: {type: custom}` with no sink given in code (config validation
/// already refuses `coordination:` with a custom sink: one process).
fn refuse(config: &PipelineConfig, given: &Given) -> Result<(), Failure> {
    let problem = if !matches!(config.sink, SinkConfig::Custom) {
        format!(
            "sink.type: Pipeline::batches hands the records to your own loop, which takes the \
             place of the sink: set sink.type to custom, not {}",
            config.sink.kind()
        )
    } else if given.sink.is_some() {
        "sink.type: custom is the sink given with Pipeline::with_sink, and Pipeline::batches \
         hands the records to your own loop instead: use one of the two"
            .to_string()
    } else {
        return Ok(());
    };
    Err(Failure::usage(anyhow!("config error: {problem}")))
}

/// A copy of `failure` (its causes as text), for [`Batches::finish`] after [`Batches::next`]
/// returned it.
fn duplicate(failure: &Failure) -> Failure {
    Failure {
        exit: failure.exit,
        error: anyhow!("{:#}", failure.error),
        hint: failure.hint.clone(),
    }
}

/// The run of a driven pipeline on a task of its own: it opens (telling `opened` whether that
/// failed), then runs. Its future is boxed here, in a plain function, so that no program's
/// crate lays the run's deep future out (nor needs a recursion limit for it).
fn spawn_run(
    config: PipelineConfig,
    origin: Origin,
    given: Given,
    progress: ProgressMode,
    run_stop: Cancel,
    opened_tx: oneshot::Sender<Option<Failure>>,
) -> JoinHandle<Result<Summary, Failure>> {
    let running: Pin<Box<dyn Future<Output = Result<Summary, Failure>> + Send>> =
        Box::pin(async move {
            let built = match crate::run::open(&config, &origin, &given, progress, run_stop).await {
                Ok(built) => built,
                Err(failure) => {
                    let said = duplicate(&failure);
                    let _ = opened_tx.send(Some(failure));
                    return Err(said);
                }
            };
            let _ = opened_tx.send(None);
            built.run().await
        });
    tokio::spawn(running)
}
