//! The sinks batches are written to.

pub mod jsonl;
pub mod keyed;

use crate::batch::Batch;
use crate::checkpoint::Staged;
use crate::sink::{Sink, SinkError};

/// The sink a pipeline's config chose.
pub enum AnySink {
    /// JSON lines to stdout or files.
    Jsonl(jsonl::JsonlSink),
    /// A SQLite or PostgreSQL table.
    Keyed(keyed::KeyedSink),
}

impl Sink for AnySink {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.write(batch, state).await,
            AnySink::Keyed(sink) => sink.write(batch, state).await,
        }
    }

    fn describe(&self) -> String {
        match self {
            AnySink::Jsonl(sink) => sink.describe(),
            AnySink::Keyed(sink) => sink.describe(),
        }
    }
}
