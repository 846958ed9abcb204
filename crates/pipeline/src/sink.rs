//! The `Sink` contract: write a batch completely, acknowledge it only once it is durable.

use std::future::Future;

use crate::batch::Batch;
use crate::checkpoint::Staged;

/// A failed write. The batch was not acknowledged, so its position does not advance.
#[derive(Debug, thiserror::Error)]
#[error("sink {sink}: {message}")]
pub struct SinkError {
    /// The sink and its target, e.g. "jsonl out/orders.jsonl".
    pub sink: String,
    /// What went wrong.
    pub message: String,
    /// Whether a later run may succeed where this one failed.
    pub class: SinkErrorClass,
}

/// What a failed write means for the next run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkErrorClass {
    /// The sink's own retries ran out (connection loss, busy database, I/O): a later run
    /// resumes after the last acknowledged batch.
    Transient,
    /// Retrying cannot help (a record the sink cannot store, a constraint, a wrong table):
    /// every rerun fails on the same batch until its cause is fixed.
    Definite,
}

/// Where batches go. Batches arrive in order; `write` returning `Ok` is the acknowledgement.
pub trait Sink: Send {
    /// Writes the whole batch and returns once it is durable. `state` is given when the
    /// position lives in the sink's database: the sink commits it in the batch's transaction.
    fn write(
        &mut self,
        batch: &Batch,
        state: Option<&Staged>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Names the sink and its target for messages ("jsonl out/orders.jsonl").
    fn describe(&self) -> String;
}
