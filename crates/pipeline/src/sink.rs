//! The `Sink` contract: write a batch completely, acknowledge it only once it is durable.

use std::future::Future;

use crate::batch::Batch;

/// A failed write. The batch was not acknowledged, so its position does not advance.
#[derive(Debug, thiserror::Error)]
#[error("sink {sink}: {message}")]
pub struct SinkError {
    /// The sink and its target, e.g. "jsonl out/orders.jsonl".
    pub sink: String,
    /// What went wrong.
    pub message: String,
}

/// Where batches go. Batches arrive in order; `write` returning `Ok` is the acknowledgement.
pub trait Sink: Send {
    /// Writes the whole batch and returns once it is durable.
    fn write(&mut self, batch: &Batch) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Names the sink and its target for messages ("jsonl out/orders.jsonl").
    fn describe(&self) -> String;
}
