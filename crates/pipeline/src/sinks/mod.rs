//! The sinks batches are written to.

pub mod jsonl;
