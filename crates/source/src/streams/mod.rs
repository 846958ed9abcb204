//! DynamoDB Streams: change capture in stream order, parents before children.
//!
//! # Modules
//! - `lineage`: the pure shard graph: parents, children, which shards may be admitted.
//! - `start`: where each shard's read starts (docs/streams.md §4.4) and the `latest` time floor.
//! - `gaps`: start-up gap detection in layers (docs/streams.md §4.5).
//! - `startup`: the start-up plan: first run, mirror capture, resume, resnapshot or fail
//!   (docs/streams.md §4.4–§4.7), and the layer-4 probe.
//! - `scheduler`: the FIFO queue of (shard, due time) and the slots (docs/streams.md §4.8).
//! - `handover`: the one point where records and position marks enter the pipeline.
//! - `shard_reader`: one shard's slices (docs/streams.md §4.9).
//! - `shard_sync`: the shard syncer: listings and child lookups beside the read loop (docs/streams.md §4.3).
//! - `engine`: admission, slices, run end (docs/streams.md §4.8, §4.10).
//! - `repair`: the window an `on_gap: repair` exports, or why it resnapshots (docs/streams.md §4.12).

pub mod engine;
pub mod gaps;
pub mod handover;
pub mod leased;
pub mod lineage;
pub mod repair;
pub mod scheduler;
pub mod shard_reader;
pub mod shard_sync;
pub mod since;
pub mod start;
pub mod startup;
