#![warn(missing_docs)]
//! The ddbpipe runner: pages become batches, batches go to a sink, acknowledged batches move
//! the stored position.
//!
//! # Tour
//! - [`runner::run_scan`]: wiring of a scan or query run; [`streams::run_streams`] and
//!   [`streams::run_streams_with_snapshots`]: a stream run, with a mirror's snapshot or a
//!   repair when its position needs one (the start-up plan decides).
//! - [`batch::Batcher`]: cuts pages into batches and attaches each page's cursor to the batch
//!   holding its last record.
//! - [`sink::Sink`]: write a batch, acknowledge once durable; [`sinks::jsonl::JsonlSink`].
//! - [`checkpoint::Checkpointer`]: applies acknowledged positions, debounced writes, into a
//!   [`checkpoint::store::CheckpointStore`] (the state file here; the sink databases implement
//!   it in `ddbpipe-keyed`, which depends on this crate, never the other way).
//! - [`state::StateFile`]: the versioned state file, its lock and strict reading.
//! - [`leased`]: the runs of one worker of several, through the lease table (shared scans,
//!   streams and mirrors).
//! - [`driven`]: batches handed out to a program and acknowledged in any order; the position
//!   commits each segment's and shard's acknowledged prefix.

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
