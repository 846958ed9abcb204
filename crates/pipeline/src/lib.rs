#![warn(missing_docs)]
//! The ddbpipe runner: pages become batches, batches go to a sink, acknowledged batches move
//! the stored position.
//!
//! # Tour
//! - [`runner::run_scan`]: wiring of a scan or query run.
//! - [`batch::Batcher`]: cuts pages into batches and attaches each page's cursor to the batch
//!   holding its last record.
//! - [`sink::Sink`]: write a batch, acknowledge once durable; [`sinks::jsonl::JsonlSink`].
//! - [`checkpoint::Checkpointer`]: applies acknowledged positions, debounced writes, into a
//!   [`checkpoint::store::CheckpointStore`] (the state file here; the sink databases implement
//!   it in `ddbpipe-keyed`, which depends on this crate, never the other way).
//! - [`state::StateFile`]: the versioned state file, its lock and strict reading.
//! - [`leased`]: the runs of one worker of several, through the lease table (shared scans,
//!   streams and mirrors).

pub mod batch;
pub mod checkpoint;
pub mod driven;
pub mod events;
pub mod files;
pub mod leased;
pub mod runner;
pub mod sink;
pub mod sinks;
pub mod state;
pub mod streams;
